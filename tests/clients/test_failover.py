"""``tt.connect`` over several URIs: calls fail over, subscriptions spread and fail over.

Real servers on 127.0.0.1, each over its own running graph and holding the same table,
written identically (an origin and its mirror); a URI nobody answers is a port bound but
not listening (refused at once), and ``tests/proxy.py`` breaks a connection mid-call. A
test waits with ``wait_for`` (or a bounded poll for what only time brings), never sleeps.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

import ticktable as tt
from clients.failover import Rotation
from clients.live import Update
from clients.wire import Endpoint
from engine.errors import ProtocolError
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer
from tests.clients.conftest import assert_view
from tests.proxy import TcpProxy

FAST: dict[str, Any] = {"reconnect_delay": 0.01, "max_reconnect_delay": 0.05}


class Mirror:
    """One server over its own graph, cycling every 10 ms; :meth:`stop` is idempotent."""

    def __init__(self) -> None:
        self.graph = UpdateGraph(validate=True)
        self.graph.start(0.01)
        self.server = TicktableServer(self.graph, ServerConfig()).start()
        self.location = self.server.location
        self.up = True

    def stop(self) -> None:
        if self.up:
            self.up = False
            self.server.shutdown()
            self.graph.stop()

    def table(self, name: str = "t") -> pa.Table:
        return self.server.registry.get(name).table.to_arrow()

    def sequence(self, name: str = "t") -> int:
        publisher = self.server.registry.get(name).publisher
        assert publisher is not None
        return publisher.sequence


@pytest.fixture
def mirrors() -> Iterator[list[Mirror]]:
    """Two servers holding table ``t`` (keyed on ``id``), written identically."""
    pair = [Mirror(), Mirror()]
    try:
        write(pair, frame(np.arange(100)))
        yield pair
    finally:
        for m in pair:
            m.stop()


@pytest.fixture
def dead() -> Iterator[list[str]]:
    """Two URIs whose ports refuse connections (bound, not listening, for the test)."""
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    yield [f"grpc://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()


def frame(ids: np.ndarray, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": ids.astype(np.int64),
                         "px": np.round(rng.uniform(1, 100, ids.size), 2)})


def write(servers: list[Mirror], df: pd.DataFrame) -> None:
    """Upsert ``df`` into ``t`` on each server, through a client of its own (visible on
    return: the graphs run)."""
    for m in servers:
        with tt.connect(m.location) as c:
            c.push("t", df, keys=["id"])


def settles(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.02)
    return True


# ------------------------------------------------------------------ URIs
def test_connect_takes_a_list_a_tuple_or_a_comma_separated_string(mirrors):
    a, b = mirrors
    port_a, port_b = a.server.port, b.server.port
    for uri in ([a.location, b.location], (a.location, b.location),
                f"{a.location},{b.location}", f" 127.0.0.1:{port_a} , grpc://127.0.0.1:{port_b}"):
        with tt.connect(uri) as client:
            assert client.uris == (a.location, b.location) and client.uri == a.location
            assert client.tables() == ["t"]
            assert repr(client) == (f"<ticktable.Client {a.location}, {b.location} "
                                    f"(on {a.location})>")
    with tt.connect(a.location) as one:  # one URI: as it always was
        assert one.uris == (a.location,) and repr(one) == f"<ticktable.Client {a.location}>"
        assert one.endpoint.location == a.location
    with pytest.raises(ValueError, match="empty URI in 'a:1,,b:2'"):
        tt.connect("a:1,,b:2")
    with pytest.raises(ValueError, match="at least one URI"):
        tt.connect([])
    with pytest.raises(TypeError, match="a URI is a str"):
        tt.connect([a.location, 8815])  # type: ignore[list-item]
    with pytest.raises(ProtocolError, match="unsupported scheme 'http'"):
        tt.connect([a.location, "http://h:1"])


def test_rotation_takes_endpoints_in_turn():
    rot = Rotation([Endpoint("h:1"), Endpoint("h:2"), Endpoint("h:3")], start=4)
    assert rot.uri == "grpc://h:2" and rot.uris == ("grpc://h:1", "grpc://h:2", "grpc://h:3")
    assert [rot.advance() for _ in range(3)] == ["grpc://h:3", "grpc://h:1", "grpc://h:2"]
    assert repr(rot) == "<Rotation on grpc://h:2 of grpc://h:1, grpc://h:2, grpc://h:3>"
    with pytest.raises(ValueError, match="at least one endpoint"):
        Rotation([])


# ------------------------------------------------------------------ subscriptions
def test_subscriptions_spread_round_robin(mirrors):
    a, b = mirrors
    with tt.connect([a.location, b.location]) as client:
        lives = [client.subscribe("t", **FAST) for _ in range(4)]
        assert all(live.wait_for() for live in lives)
        assert [live.uri for live in lives] == [a.location, b.location] * 2
        assert settles(lambda: len(a.server.subscriptions) == len(b.server.subscriptions) == 2)
        for live in lives:
            assert_view(live, a.table(), None, f"on {live.uri}")


def test_a_subscription_fails_over_when_its_server_shuts_down(mirrors):
    a, b = mirrors
    with tt.connect([a.location, b.location]) as client:
        got: list[Update] = []
        on_a = client.subscribe("t", on_update=got.append, **FAST)
        on_b = client.subscribe("t", **FAST)
        assert on_a.wait_for() and on_b.wait_for()
        assert (on_a.uri, on_b.uri) == (a.location, b.location)
        before = len(got)
        a.stop()  # its subscribers' streams end; it answers no more
        write([b], frame(np.arange(50, 150), seed=1))  # only the mirror moves on
        write([b], frame(np.arange(0, 200, 3), seed=2))
        assert on_a.wait_for(sequence=b.sequence())  # a sequence only b reached
        assert on_a.uri == b.location and on_a.error is None and on_a.reconnects >= 2
        resumed = [u.resumed for u in got[before:]]
        assert "snapshot" in resumed  # another server's table: another epoch
        assert_view(on_a, b.table(), None, "after failing over to the mirror")
        assert on_b.reconnects == 0 and on_b.wait_for(sequence=b.sequence())
        assert_view(on_b, b.table(), None, "on the mirror throughout")
        pd.testing.assert_frame_equal(on_a.df, client.snapshot("t"))  # a call fails over too
        assert client.uri == b.location


def test_a_subscription_whose_server_never_answers_starts_on_the_next(mirrors, dead):
    b = mirrors[1]
    with tt.connect([dead[0], b.location]) as client:
        live = client.subscribe("t", **FAST)  # the first subscription: the dead URI's
        assert live.wait_for() and live.uri == b.location and live.reconnects >= 1
        assert_view(live, b.table(), None, "on the second URI")


def test_pinned_subscriptions_stay_on_their_server(mirrors):
    """``uri=``, a SQL view and a composition live on one server: no spreading there."""
    a, b = mirrors
    with tt.connect([a.location, b.location]) as client:
        pinned = client.subscribe("t", uri=f"127.0.0.1:{b.server.port}")  # as given, or not
        assert pinned.wait_for() and pinned.uri == b.location
        with pytest.raises(ValueError, match="is not a URI of this client"):
            client.subscribe("t", uri="grpc://127.0.0.1:1")
        views = [client.subscribe_sql("SELECT id, px FROM t WHERE px > 50") for _ in range(2)]
        derived = [client.table("t").where(pc.field("px") < 50).subscribe() for _ in range(2)]
        for live in views + derived:
            assert live.wait_for() and live.uri == a.location  # where calls go
            assert live.table in a.server.registry.names()
            assert live.table not in b.server.registry.names()
        assert views[0].size == int((a.table()["px"].to_numpy() > 50).sum())
        name = views[0].table
        views[0].close()  # drops the view, on its server
        assert settles(lambda: name not in a.server.registry.names())


# ------------------------------------------------------------------ calls
CALLS: dict[str, Callable[[tt.Client], Any]] = {
    "tables": lambda c: c.tables(),
    "schema": lambda c: c.schema("t"),
    "stats": lambda c: c.stats(),
    "snapshot": lambda c: c.snapshot("t", filter=pc.field("px") > 50),
    "sql query": lambda c: c.sql("SELECT count(*) AS n FROM t"),
    "sql insert": lambda c: c.sql("INSERT INTO t VALUES (1000, 1.5)"),
    "sql with params": lambda c: c.sql("INSERT INTO t VALUES (?, ?)", [1001, 2.5]),
    "create_table": lambda c: c.create_table("u", pa.schema([("x", pa.int64())])),
    "drop_table": lambda c: c.drop_table("t"),
    "push": lambda c: c.push("t", frame(np.arange(1000, 1010))),
    "push a generator": lambda c: c.push("t", iter([frame(np.arange(1000, 1010))])),
    "push not atomic": lambda c: c.push("t", frame(np.arange(1000, 1010)), atomic=False),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_every_call_fails_over_when_the_first_uri_is_down(mirrors, dead, call, caplog):
    """Refused at connect, nothing was sent: reads and writes alike go to the next URI."""
    b = mirrors[1]
    with tt.connect([dead[0], b.location]) as client, \
            caplog.at_level(logging.WARNING, logger="clients.failover"):
        CALLS[call](client)
        assert client.uri == b.location and client.endpoint.location == b.location
        warned = [r.getMessage() for r in caplog.records if r.name == "clients.failover"]
        assert len(warned) == 1 and f"{dead[0]} is unavailable (failed to connect" in warned[0]
        caplog.clear()
        client.tables()
        assert [r for r in caplog.records if r.name == "clients.failover"] == []  # it stays


def test_no_server_answering_is_one_line_naming_every_uri(dead):
    with tt.connect(",".join(dead)) as client:
        for call, what in [(client.tables, "tables()"),
                           (lambda: client.snapshot("t"), "snapshot('t')"),
                           (lambda: client.push("t", frame(np.arange(3))), "push into 't'"),
                           (lambda: client.sql("DELETE FROM t WHERE id = 1"), "sql()")]:
            with pytest.raises(fl.FlightUnavailableError) as err:
                call()
            text = str(err.value)
            assert text == (f"no server answered {what}; tried "
                            f"{dead[0]} (failed to connect: Connection refused), "
                            f"{dead[1]} (failed to connect: Connection refused)")
            assert isinstance(err.value.__cause__, fl.FlightUnavailableError)


def test_one_dead_uri_raises_as_it_always_did(dead):
    with tt.connect(dead[0]) as client, pytest.raises(
            fl.FlightUnavailableError, match="^Flight returned unavailable error, with message: "
                                             "failed to connect to all addresses"):
        client.tables()


# ------------------------------------------------------------------ a write once sent
def cut_after_first_batch(proxy: TcpProxy) -> Callable[[int], None]:
    """A push's ``progress`` that breaks the connection once its first batch went out."""
    cut: list[int] = []

    def progress(rows: int) -> None:
        if not cut:
            cut.append(rows)
            proxy.cut()

    return progress


def test_a_write_broken_once_sent_is_not_retried(mirrors):
    """``atomic=False`` applies rows as they arrive: a push broken mid-way may have
    written some, so it is raised as it is, and the mirror gets nothing."""
    a, b = mirrors
    with TcpProxy("127.0.0.1", a.server.port) as proxy, \
            tt.connect([f"grpc://127.0.0.1:{proxy.port}", b.location]) as client:
        client.tables()  # the channel is up: the push is sent, then broken
        with pytest.raises(fl.FlightUnavailableError) as err:
            client.push("t", frame(np.arange(1000, 21000)), chunk_rows=1000, atomic=False,
                        progress=cut_after_first_batch(proxy))
        assert "no server answered" not in str(err.value)
        assert client.uri == f"grpc://127.0.0.1:{proxy.port}"
    assert b.table().num_rows == 100


def test_an_atomic_push_broken_before_its_commit_is_sent_to_the_next(mirrors):
    """Staged rows are invisible until the commit: the push goes again, whole, to the
    mirror, with a new write id; the first server applies none of it."""
    a, b = mirrors
    with TcpProxy("127.0.0.1", a.server.port) as proxy, \
            tt.connect([f"grpc://127.0.0.1:{proxy.port}", b.location]) as client:
        client.tables()
        rows = frame(np.arange(1000, 21000))
        summary = client.push("t", rows, chunk_rows=1000, progress=cut_after_first_batch(proxy))
        assert summary.rows == 20_000 and client.uri == b.location
    assert b.table().num_rows == 20_100
    got = b.table().to_pandas().set_index("id").loc[rows["id"]].reset_index()
    pd.testing.assert_frame_equal(got, rows)
    assert a.table().num_rows == 100
