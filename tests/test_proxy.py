"""``tests/proxy.py``'s TcpProxy between the Python client and a real server.

Through the proxy a table is pushed and read back (the counters grow by at least its
bytes); a cut breaks a live subscription, which reconnects and resumes by itself; a pause
makes calls fail as a server that is gone does, and a resume lets them through again.
Cycles run by hand (``graph.run_cycle()``); waits are ``wait_for`` or a bounded poll.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import ticktable as tt
from clients.live import Update
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer
from tests.proxy import TcpProxy


@pytest.fixture
def graph() -> UpdateGraph:
    return UpdateGraph(validate=True)


@pytest.fixture
def server(graph: UpdateGraph) -> Iterator[TicktableServer]:
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def proxy(server: TicktableServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", server.port) as px:
        yield px


@pytest.fixture
def client(proxy: TcpProxy) -> Iterator[tt.Client]:
    with tt.connect(f"grpc://127.0.0.1:{proxy.port}") as c:
        yield c


def frame(ids: np.ndarray, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": ids.astype(np.int64), "px": rng.uniform(1, 100, ids.size),
                         "sym": rng.choice(["A", "B", "C"], ids.size)})


def settles(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (for what only time brings: gRPC's reconnect
    backoff, threads ending after a close)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.02)
    return True


def answers(client: tt.Client) -> bool:
    try:
        client.tables()
    except fl.FlightUnavailableError:
        return False
    return True


def seq(server: TicktableServer, name: str) -> int:
    publisher = server.registry.get(name).publisher
    assert publisher is not None
    return publisher.sequence


def proxy_threads() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name.startswith("tcpproxy-")]


def test_push_and_snapshot_through_the_proxy_count_their_bytes(client, proxy, graph):
    df = frame(np.arange(200_000))
    nbytes = pa.Table.from_pandas(df, preserve_index=False).nbytes
    proxy.reset_counts()
    client.push("t", df, keys=["id"])
    graph.run_cycle()
    assert proxy.bytes_up >= nbytes > proxy.bytes_down  # the rows went up, acks came down
    up, down = proxy.bytes_up, proxy.bytes_down
    pd.testing.assert_frame_equal(client.snapshot("t"), df)
    assert proxy.bytes_down - down >= nbytes and proxy.bytes_up - up < nbytes
    assert proxy.connections == 1  # one channel carries every call
    proxy.reset_counts()
    assert (proxy.bytes_up, proxy.bytes_down) == (0, 0)
    assert client.tables() == ["t"]
    assert proxy.bytes_up > 0 and proxy.bytes_down > 0


def test_cut_breaks_a_subscription_which_resumes_by_itself(client, proxy, server, graph):
    client.push("t", frame(np.arange(100)), keys=["id"])
    graph.run_cycle()
    got: list[Update] = []
    live = client.subscribe("t", on_update=got.append, reconnect_delay=0.01)
    assert live.wait_for() and live.size == 100 and live.reconnects == 0
    before = len(got)
    proxy.cut()  # returns once both sides are shut: nothing more flows on these connections
    client_answers = settles(lambda: answers(client))  # its channel reconnects (gRPC)
    assert client_answers
    client.push("t", frame(np.arange(50, 150), seed=1), keys=["id"])
    graph.run_cycle()
    assert live.wait_for(sequence=seq(server, "t"))
    assert live.reconnects >= 1 and live.error is None  # so the update came on a new stream
    after = got[before:]  # the resume (maybe before the push, then empty), the push
    assert "deltas" in [u.resumed for u in after] and not any(u.is_snapshot for u in after)
    pd.testing.assert_frame_equal(live.df, client.snapshot("t"))


def test_pause_fails_calls_as_a_server_that_is_gone_then_resume(client, proxy, server, graph):
    client.push("t", frame(np.arange(10)), keys=["id"])
    graph.run_cycle()
    live = client.subscribe("t", reconnect_delay=0.01, max_reconnect_delay=0.05)
    assert live.wait_for() and proxy.connections == 2  # the client's and the subscription's
    proxy.pause()
    assert settles(lambda: proxy.connections == 0)
    with pytest.raises(fl.FlightUnavailableError):  # gRPC may learn of the cut from it
        client.tables()
    with pytest.raises(fl.FlightUnavailableError, match="failed to connect to all addresses"):
        client.tables()  # then it cannot connect again
    with tt.connect(f"grpc://127.0.0.1:{proxy.port}") as fresh, \
            pytest.raises(fl.FlightUnavailableError, match="failed to connect to all addresses"):
        fresh.snapshot("t")
    reconnects = live.reconnects
    assert settles(lambda: live.reconnects >= reconnects + 2)  # it keeps trying, in vain
    assert not live.connected and live.error is None
    server.registry.get("t").table.upsert(pa.Table.from_pandas(frame(np.arange(5, 20), seed=2),
                                                               preserve_index=False))
    graph.run_cycle()  # written while the proxy is paused
    proxy.resume()
    with tt.connect(f"grpc://127.0.0.1:{proxy.port}") as fresh:  # a new channel: at once
        assert fresh.tables() == ["t"]
    assert settles(lambda: answers(client))  # the old one after gRPC's reconnect backoff
    assert live.wait_for(sequence=seq(server, "t")) and live.size == 20
    pd.testing.assert_frame_equal(live.df, client.snapshot("t"))


def test_close_ends_every_thread_and_the_port(server):
    proxy = TcpProxy("127.0.0.1", server.port)
    port = proxy.start()
    assert proxy.port == port and "open" in repr(proxy)
    with tt.connect(f"grpc://127.0.0.1:{port}") as c:
        assert c.tables() == [] and proxy.connections == 1
        proxy.close()
        assert proxy_threads() == [] and proxy.connections == 0
        with pytest.raises(fl.FlightUnavailableError):
            c.tables()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    proxy.close()  # twice is fine
    with pytest.raises(RuntimeError, match="starts once"):
        proxy.start()


def test_a_target_that_is_down_resets_the_connection(held_port):
    port = held_port.port  # nothing listens there, nor can another process
    with TcpProxy("127.0.0.1", port) as proxy, tt.connect(f"grpc://127.0.0.1:{proxy.port}") as c:
        with pytest.raises(fl.FlightUnavailableError, match="failed to connect"):
            c.tables()
        assert proxy.connections == 0 and proxy.bytes_up == 0

