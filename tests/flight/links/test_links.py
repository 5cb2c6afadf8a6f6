"""Mirrored tables between real servers (gRPC over localhost): a mirror changes exactly as its
origin did, derived tables over mirrors are incremental, chains hold, and a broken link,
an origin restart, a slow mirror and a link that gives up behave as docs/protocol.md §14
says."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.errors import InputError, TableExists
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.table import Table
from engine.update import TableUpdate, compose
from flight.links import Link, LinkGaveUp, parse_mirror
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.decoder import ReferenceView, StreamEnded, read_message
from flight.wire import TableKind

KV = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


class Server:
    """A server on its own graph, cycling every 20 ms."""

    def __init__(self, port: int = 0, **cfg: object) -> None:
        self.graph = UpdateGraph(validate=True)
        self.srv = TicktableServer(self.graph, ServerConfig(port=port, **cfg)).start()  # type: ignore[arg-type]
        self.graph.start(0.02)

    @property
    def location(self) -> str:
        return self.srv.location

    def close(self) -> None:
        self.srv.shutdown()
        self.graph.stop()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in reversed(made):
        s.close()


def _origin(servers: list[Server], port: int = 0) -> tuple[Server, Table]:
    a = Server(port)
    servers.append(a)
    t = a.srv.registry.create_source("t", KV, TableKind.KEYED, keys=["k"]).table
    return a, t


def _write(t: Table, rng: np.random.Generator, n: int = 20) -> None:
    """A random round of upserts (new keys and changes) and deletes."""
    keys = rng.integers(0, 300, n)
    t.upsert(pa.table({"k": keys, "v": rng.integers(0, 50, n).astype(float),
                       "s": [f"s{x}" for x in rng.integers(0, 5, n)]}, schema=KV))
    t.delete(pa.table({"k": rng.integers(0, 300, n // 4)}))


def _settle(origin: Server, *links: Link, timeout: float = 10.0) -> None:
    """Wait for a cycle of the origin after the last write, then for every link to catch up."""
    step = origin.graph.step
    end = time.monotonic() + timeout
    while origin.graph.step < step + 2 and time.monotonic() < end:
        time.sleep(0.005)
    for link in links:
        assert link.wait_in_sync(timeout), f"{link.spec.name}: {link.status()}"
        table = link.table
        assert table is not None
        seq = None
        while time.monotonic() < end:  # the replica applied the origin's last update
            seq = table.position[1] if table.position else None
            if seq == _sequence_of(link):
                break
            time.sleep(0.005)


def _sequence_of(link: Link) -> int | None:
    status = link.status()
    return int(status.origin_sequence) if status.origin_epoch else None


def _same(a: Table, b: Table, what: str) -> None:
    with a.graph.shared_lock():
        ka, va = a.rowset.keys().copy(), a.to_arrow(lock=False)
    with b.graph.shared_lock():
        kb, vb = b.rowset.keys().copy(), b.to_arrow(lock=False)
    assert np.array_equal(ka, kb), f"{what}: row keys differ"
    assert va.equals(vb), f"{what}: values differ"


def _wait_equal(a: Table, b: Table, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            _same(a, b, what)
            return
        except AssertionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


# ------------------------------------------------------------------------ one for one
def test_a_mirror_changes_exactly_as_its_origin_did(servers):
    """Each update of the mirror is one origin update, or the exact composition of the
    consecutive origin updates one message carried; row keys and order are the origin's."""
    a, t = _origin(servers)
    sorted_ = t.sort(["v", "k"])  # shifts and spread-out keys
    a.srv.registry.add("by_v", sorted_, TableKind.DERIVED, parents=["t"])
    b = Server()
    servers.append(b)
    seen: dict[str, dict[int, tuple[TableUpdate, object]]] = {"t": {}, "by_v": {}}
    for name, table in (("t", t), ("by_v", sorted_)):
        pub = a.srv.registry.get(name).publisher
        table.listen(lambda up, tb, name=name, pub=pub: seen[name].__setitem__(
            pub.sequence, (up, tb.prev_rowset)))
    links = [b.srv.mirror(f"{a.location}/t"), b.srv.mirror(f"{a.location}/by_v=m_by_v")]
    got: dict[str, list[tuple[int, TableUpdate]]] = {"t": [], "by_v": []}
    for name, link in zip(("t", "by_v"), links, strict=True):
        link.wait_table(10).listen(lambda up, tb, name=name: got[name].append((tb.position[1], up)))
    rng = np.random.default_rng(3)
    for _ in range(60):
        _write(t, rng)
        time.sleep(rng.choice([0.0, 0.005, 0.03]))
    _settle(a, *links)
    for name, link in zip(("t", "by_v"), links, strict=True):
        assert link.table is not None
        _same(link.table, a.srv.registry.get(name).table, name)
        assert b.srv.registry.get(link.spec.name).kind == TableKind.MIRROR
        prev_seq = None
        for seq, up in got[name]:
            if prev_seq is not None:  # the first update is the snapshot's difference
                run = [seen[name][s] for s in range(prev_seq + 1, seq + 1)]
                want, prev = run[0]
                for nxt, _ in run[1:]:
                    want = compose(want, nxt, prev)  # type: ignore[arg-type]
                assert (up.added, up.removed, up.modified, up.shifted, up.modified_columns) == (
                    want.added, want.removed, want.modified, want.shifted,
                    want.modified_columns), f"{name} at {seq}"
            prev_seq = seq
        assert len(got[name]) >= 10  # enough updates to have exercised the path


def test_derived_tables_over_mirrors_join_and_aggregate_incrementally(servers):
    """A join of a local table with a mirrored one, and an aggregation of the mirror,
    equal their recomputation from scratch after every round."""
    a, t = _origin(servers)
    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t=remote")
    remote = link.wait_table(10)
    names = b.srv.registry.create_source(
        "names", pa.schema([("s", pa.string()), ("label", pa.string())]), TableKind.KEYED,
        keys=["s"]).table
    names.upsert(pa.table({"s": [f"s{i}" for i in range(4)], "label": list("ABCD")}))
    with b.graph.exclusive_lock():
        joined = remote.join(names, on="s")
        totals = remote.agg_by([agg.sum("v", name="total"), agg.count()], by="s")
    rng = np.random.default_rng(5)
    for r in range(25):
        _write(t, rng)
        if r % 5 == 0:
            names.upsert(pa.table({"s": [f"s{rng.integers(0, 5)}"], "label": [f"L{r}"]}))
        _settle(a, link)
        time.sleep(0.05)  # a cycle of b after its last staged change
        with b.graph.shared_lock():  # one step of all four
            m, n, got_join, got_tot = (x.to_arrow(lock=False).to_pandas()
                                       for x in (remote, names, joined, totals))
        want_join = m.merge(n, on="s")
        cols = list(got_join.columns)
        pd.testing.assert_frame_equal(
            got_join.sort_values(["k"]).reset_index(drop=True),
            want_join[cols].sort_values(["k"]).reset_index(drop=True), check_dtype=False)
        want_tot = m.groupby("s", dropna=False).agg(total=("v", "sum"), count=("v", "size")).reset_index()
        pd.testing.assert_frame_equal(
            got_tot.sort_values("s").reset_index(drop=True),
            want_tot.sort_values("s").reset_index(drop=True), check_dtype=False)


def test_a_chain_of_three_servers_keeps_the_origins_row_keys_and_order(servers):
    a, t = _origin(servers)
    a.srv.registry.add("by_v", t.sort(["v", "k"]), TableKind.DERIVED, parents=["t"])
    b, c = Server(), Server()
    servers += [b, c]
    ab = b.srv.mirror(f"{a.location}/by_v")
    ab.wait_table(10)
    bc = c.srv.mirror(f"{b.location}/by_v=last")
    rng = np.random.default_rng(9)
    for _ in range(40):
        _write(t, rng)
        time.sleep(0.01)
    _settle(a, ab)
    _settle(b, bc)
    origin = a.srv.registry.get("by_v").table
    _wait_equal(c.srv.registry.get("last").table, origin, "C against A")
    assert bc.status().in_sync and bc.state == "in sync"


# ------------------------------------------------------------------------ breaks
def test_a_broken_stream_resumes_with_the_missed_deltas(servers):
    a, t = _origin(servers)
    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t")
    link.wait_table(10)
    rng = np.random.default_rng(1)
    for round_ in range(5):
        _write(t, rng)
        _settle(a, link)
        reader = link._reader
        assert reader is not None
        reader.cancel()  # the stream breaks under the link
        for _ in range(3):  # the origin moves on while the link is away
            _write(t, rng)
            time.sleep(0.03)
        _settle(a, link)
        assert link.resumed_with_deltas == round_ + 1
    assert link.resumed_with_snapshot == 0 and link.reconnects == 5
    _same(link.table, t, "after resumes")


def _subscribe(location: str, table: str) -> tuple[fl.FlightStreamReader, fl.FlightStreamWriter]:
    client = fl.FlightClient(location)
    writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(table))
    writer.begin(pa.schema([]))
    writer.write_metadata(pa.py_buffer(pb.ClientMessage(
        subscribe=pb.SubscriptionRequest(table=table)).SerializeToString()))
    return reader, writer


def _unsubscribe(reader: fl.FlightStreamReader, writer: fl.FlightStreamWriter) -> None:
    reader.cancel()
    try:
        writer.close()
    except (fl.FlightError, pa.ArrowException):
        pass  # the cancelled call's status


def test_an_origin_restart_is_followed_with_its_difference_and_the_gap_is_said(servers,
                                                                              held_port):
    """The origin goes away: the mirror says it is not in sync (stats, and a message to its
    own subscribers), keeps its rows, and when a new origin answers on the same address
    applies only the difference from what it held, then says it is in sync again."""
    a, t = _origin(servers, held_port.port)  # held: free of others while no origin is up
    port = a.srv.port
    t.upsert(pa.table({"k": np.arange(100), "v": np.arange(100.0), "s": ["x"] * 100}, schema=KV))
    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t")
    mirror = link.wait_table(10)
    _settle(a, link)
    reader, writer = _subscribe(b.location, "t")
    view = ReferenceView(reader.schema)
    first = read_message(reader)
    view.apply(first)
    assert first.meta.link.in_sync and first.meta.link.origin == f"{a.location}/t"
    updates: list[TableUpdate] = []
    mirror.listen(lambda up, tb: updates.append(up))

    servers.remove(a)
    a.close()
    msg = read_message(reader)  # a message of no rows saying so
    assert not msg.meta.link.in_sync and msg.meta.link.state in ("disconnected", "connecting")
    assert msg.meta.coalesced == 0 and msg.meta.sequence == first.meta.sequence
    stats = {s.name: s for s in b.srv.stats().tables}
    assert not stats["t"].link.in_sync and stats["t"].size == 100  # the rows stay

    # the new origin holds, before it serves: the same 100 keys on the same row keys, 3
    # values changed, then 2 rows gone and 1 new (a row key of its own)
    g2 = UpdateGraph(validate=True)
    srv2 = TicktableServer(g2, ServerConfig(port=port))
    t2 = srv2.registry.create_source("t", KV, TableKind.KEYED, keys=["k"]).table
    v = np.arange(100.0)
    v[[5, 6, 7]] = -1.0
    t2.upsert(pa.table({"k": np.arange(100), "v": v, "s": ["x"] * 100}, schema=KV))
    g2.run_cycle()
    t2.delete(pa.table({"k": [50, 51]}))
    t2.upsert(pa.table({"k": [1000], "v": [1.0], "s": ["y"]}, schema=KV))
    g2.run_cycle()
    a2 = Server.__new__(Server)
    a2.graph, a2.srv = g2, srv2.start()
    g2.start(0.02)
    servers.append(a2)
    _settle(a2, link)
    _wait_equal(mirror, t2, "after the origin's restart")
    assert link.resumed_with_snapshot == 1
    (up,) = [u for u in updates if not u.empty()]
    assert (len(up.removed), len(up.added), len(up.modified)) == (2, 1, 3)  # not all 100
    while True:  # the subscriber hears it is in sync again, and gets the same difference
        msg = read_message(reader)
        view.apply(msg)
        if msg.meta.link.in_sync:
            break
    _unsubscribe(reader, writer)
    assert view.to_arrow().equals(t2.to_arrow())


def test_a_link_that_gives_up_fails_the_mirror_and_its_subscribers_are_told(servers):
    a, t = _origin(servers)
    b = Server(mirror_give_up=0.5)
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t")
    link.wait_table(10)
    _settle(a, link)
    reader, writer = _subscribe(b.location, "t")
    read_message(reader)
    servers.remove(a)
    a.close()
    ended: list[BaseException] = []

    def read_to_the_end() -> None:  # on a thread: a failure never told must fail, not hang
        try:
            for _ in range(100):
                read_message(reader)
        except (StreamEnded, fl.FlightError, pa.ArrowInvalid) as exc:
            ended.append(exc)

    th = threading.Thread(target=read_to_the_end, daemon=True)
    th.start()
    th.join(30)
    assert not th.is_alive(), f"the mirror's subscriber was never told (link: {link.state})"
    assert len(ended) == 1 and "gave up" in str(ended[0]), ended
    assert link.state == "gave up" and b.srv.registry.get("t").table.failure is not None
    _unsubscribe(reader, writer)


def test_a_mirror_falling_behind_gets_coalesced_deltas(servers):
    a, t = _origin(servers)
    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t")
    link.wait_table(10)
    _settle(a, link)
    apply, coalesced = link._apply, []

    def slow(table, meta, added, modified, first):  # a mirror that cannot keep up
        coalesced.append(meta.coalesced)
        time.sleep(0.05)
        apply(table, meta, added, modified, first)

    link._apply = slow  # type: ignore[method-assign]
    rng = np.random.default_rng(2)
    # updates of ~100 kB: the link's 1 MiB window fills, sooner or later on a loaded
    # machine (its writer slower too): written for 2 s, and on until a message came
    # coalesced (60 s at most, then the assertion below fails)
    start = time.monotonic()
    while time.monotonic() < start + 2.0 or (max(coalesced, default=0) <= 1
                                             and time.monotonic() < start + 60):
        n = 2000
        t.upsert(pa.table({"k": rng.integers(0, 20_000, n), "v": rng.random(n),
                           "s": [f"{x:040d}" for x in rng.integers(0, 10**9, n)]}, schema=KV))
        time.sleep(0.01)
    _settle(a, link, timeout=20)
    _wait_equal(link.table, t, "after catching up")
    assert max(coalesced) > 1, coalesced


# ------------------------------------------------------------------------ refusals
def test_bad_mirror_specs_and_writes_into_a_mirror_are_refused(servers):
    a, t = _origin(servers)
    t.upsert(pa.table({"k": [1], "v": [1.0], "s": ["a"]}, schema=KV))
    for text in ("grpc://host:1", "grpc://host:1/", "http://h:1/t", "grpc://h:1/t="):
        with pytest.raises(InputError, match="mirror"):
            parse_mirror(text)
    spec = parse_mirror("h:8815/orders=eu")
    assert (spec.uri, spec.table, spec.name) == ("grpc://h:8815", "orders", "eu")
    b = Server()
    servers.append(b)
    b.srv.registry.create_source("taken", KV, TableKind.APPEND)
    with pytest.raises(TableExists, match="taken"):
        b.srv.mirror(f"{a.location}/t=taken")
    link = b.srv.mirror(f"{a.location}/t")
    link.wait_table(10)
    # the table exists once its snapshot arrived; its row once the mirror's cycle applied it
    _until(lambda: len(link.table.rowset) == 1, what="the mirror's first row")
    with pytest.raises(TableExists, match="already mirrors"):
        b.srv.mirror(f"{a.location}/t")
    import ticktable as tt

    with tt.connect(b.location) as client, pytest.raises(Exception, match="'t' is a mirror table"):
        client.push("t", pd.DataFrame({"k": [2], "v": [2.0], "s": ["b"]}), mode="upsert")
    assert len(link.table.rowset) == 1
    threading.Event().wait(0.05)


def _until(check, timeout: float = 10.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.02)


def test_mirror_of_follows_every_table_of_the_origin_and_its_creates_and_drops(servers):
    """``ticktable serve --mirror-of``: every table of the origin is mirrored under its name;
    a table created there appears here, a table dropped there goes here; a name this
    server uses for a table of its own is left alone."""
    a, t = _origin(servers)
    u = a.srv.registry.create_source("u", KV, TableKind.APPEND).table
    rng = np.random.default_rng(4)
    _write(t, rng)
    u.append(pa.table({"k": [1, 2], "v": [1.0, 2.0], "s": ["a", "b"]}, schema=KV))
    b = Server(mirror_of=[a.location])
    servers.append(b)
    own = b.srv.registry.create_source("mine", KV, TableKind.KEYED, keys=["k"]).table
    # the origin's table of that name comes after this server's own: a listing after it
    # leaves this server's alone (before, its follower could mirror the name first: a
    # mirror holds its name from its start, see the next test)
    a.srv.registry.create_source("mine", KV, TableKind.APPEND)
    (follower,) = b.srv.followers
    follower.poll = 0.05
    seen = follower.listings
    _until(lambda: {"t", "u"} <= set(b.srv.registry.names()) and follower.listings > seen + 1,
           what="the first mirrors")
    assert b.srv.registry.get("mine").table is own and b.srv.links.get("mine") is None
    for name in ("t", "u"):
        _settle(a, b.srv.links.get(name))
        _wait_equal(b.srv.registry.get(name).table, a.srv.registry.get(name).table, name)
    w = a.srv.registry.create_source("w", KV, TableKind.KEYED, keys=["k"]).table
    w.upsert(pa.table({"k": [7], "v": [7.0], "s": ["w"]}, schema=KV))
    _until(lambda: "w" in b.srv.registry.names(), what="a table created at the origin")
    _settle(a, b.srv.links.get("w"))
    _wait_equal(b.srv.registry.get("w").table, w, "w")
    a.srv.durability.drop_table("u")
    _until(lambda: "u" not in b.srv.registry.names() and b.srv.links.get("u") is None,
           what="a table dropped at the origin")
    assert b.srv.registry.get("t").kind == TableKind.MIRROR and follower.listings > 3


def test_a_mirror_holds_its_name_before_its_origin_answers(servers, held_port):
    """A mirror's table is registered at its origin's first answer, but its name is taken
    from its start: a table of that name made meanwhile (here or by a client) is refused
    with the mirror named, and the name is free again once the mirror is dropped. (Before,
    the local table won and the link streamed into a replica nobody could see.)"""
    import ticktable as tt

    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"grpc://127.0.0.1:{held_port.port}/t=pending")  # nothing answers there
    assert "pending" not in b.srv.registry.names() and link.table is None
    with pytest.raises(TableExists, match=r"'pending' is taken by a mirror of grpc://127\.0\.0\.1"):
        b.srv.registry.create_source("pending", KV, TableKind.APPEND)
    with tt.connect(b.location) as client:
        with pytest.raises(pa.ArrowException, match="already exists error, with message: table 'pending' is taken by a mirror") as err:
            client.create_table("pending", KV, kind="append")
        assert "Traceback" not in str(err.value)
        client.create_table("other", KV, kind="append")  # the server serves the rest
        assert b.srv.links.forget("pending")
        client.create_table("pending", KV, kind="append")
    assert b.srv.registry.get("pending").kind == TableKind.APPEND and b.srv.links.get("pending") is None


def test_a_mirror_whose_table_finds_no_room_gives_up_with_the_limit_named(servers):
    """The origin answers but this server holds ``max_tables`` already: the link gives up
    saying so (``wait_table`` raises it at once), and leaves no replica behind."""
    a, _ = _origin(servers)
    b = Server(max_tables=1)
    servers.append(b)
    b.srv.registry.create_source("full", KV, TableKind.APPEND)
    link = b.srv.mirror(f"{a.location}/t")
    with pytest.raises(LinkGaveUp, match="cannot be registered here: cannot create table 't'.*max_tables"):
        link.wait_table(10)
    assert link.state == "gave up" and link.table is None and b.srv.registry.names() == ["full"]


def test_an_embedded_graph_mirrors_a_remote_table(servers):
    """``tt.UpdateGraph().remote_table(...)``: a table of a server in a graph of this
    process, derived from like any other, following the origin until closed."""
    import ticktable as tt

    a, t = _origin(servers)
    rng = np.random.default_rng(8)
    _write(t, rng)
    graph = tt.UpdateGraph(validate=True)
    remote = graph.remote_table(a.location, "t", local="quotes", columns=["k", "v"], timeout=10)
    assert remote.name == "quotes" and remote.schema.names == ["k", "v"]
    big = remote.where(pc.field("v") > 20)
    graph.start(0.02)
    try:
        for _ in range(10):
            _write(t, rng)
            time.sleep(0.02)
        _settle(a, remote.source)
        _wait_equal(remote, _Projected(t, ["k", "v"]), "embedded mirror")
        with graph.shared_lock():
            got = big.to_arrow(lock=False)
            want = remote.to_arrow(lock=False).filter(pc.greater(remote.to_arrow(lock=False)["v"], 20))
        assert got.equals(want)
        link = remote.source
        remote.close()
        assert link._closed.is_set()
    finally:
        graph.stop()
    with pytest.raises(TimeoutError, match="no answer"):
        tt.UpdateGraph().remote_table("grpc://127.0.0.1:1", "t", timeout=0.3)


class _Projected:
    """A table's rows in some columns, for _same (row keys and order as the table's)."""

    def __init__(self, table: Table, columns: list[str]) -> None:
        self.table, self.columns, self.graph = table, columns, table.graph

    @property
    def rowset(self):
        return self.table.rowset

    def to_arrow(self, *, lock: bool = True) -> pa.Table:
        return self.table.to_arrow(self.columns, lock=lock)


def test_a_python_subscriber_of_a_mirror_sees_when_it_is_not_in_sync(servers, held_port):
    import ticktable as tt

    a, t = _origin(servers, held_port.port)  # held: free of others while no origin is up
    port = a.srv.port
    t.upsert(pa.table({"k": [1, 2], "v": [1.0, 2.0], "s": ["a", "b"]}, schema=KV))
    b = Server()
    servers.append(b)
    link = b.srv.mirror(f"{a.location}/t")
    link.wait_table(10)
    _settle(a, link)
    with tt.connect(b.location) as client, tt.connect(a.location) as direct:
        live = client.subscribe("t")
        plain = direct.subscribe("t")
        _until(lambda: live.in_sync and len(live.df) == 2, what="the mirror's first message")
        assert live.link["origin"] == f"{a.location}/t" and plain.link is None and plain.in_sync
        plain.close()
        servers.remove(a)
        a.close()
        _until(lambda: not live.in_sync, what="the link going out of sync, told")
        assert live.link["state"] in ("disconnected", "connecting") and len(live.df) == 2
        a2 = Server(port)
        servers.append(a2)
        t2 = a2.srv.registry.create_source("t", KV, TableKind.KEYED, keys=["k"]).table
        t2.upsert(pa.table({"k": [1], "v": [10.0], "s": ["a"]}, schema=KV))
        _until(lambda: live.in_sync and live.df["v"].tolist() == [10.0], what="back in sync")
        assert live.link["resumed_with_snapshot"] == 1
        live.close()


def test_a_link_cut_by_a_tcp_proxy_resumes_with_deltas_and_says_it_was_cut(servers):
    """The network between the mirror and its origin fails (a real TCP proxy resets the
    connection, then refuses new ones for a while): the mirror says it is not in sync, keeps
    its rows, and once the network is back resumes with the missed updates only (fewer bytes
    than its first snapshot) and equals its origin again."""
    from tests.proxy import TcpProxy

    a, t = _origin(servers)
    rng = np.random.default_rng(12)
    t.upsert(pa.table({"k": np.arange(5000), "v": rng.random(5000),
                       "s": [f"row {i}" for i in range(5000)]}, schema=KV))
    host, port = a.location.rsplit("//", 1)[1].rsplit(":", 1)
    with TcpProxy(host, int(port)) as proxy:  # started by the with
        b = Server()
        servers.append(b)
        link = b.srv.mirror(f"grpc://127.0.0.1:{proxy.port}/t")
        mirror = link.wait_table(10)
        _settle(a, link)
        snapshot_bytes = proxy.bytes_down
        for round_ in range(3):
            proxy.reset_counts()
            proxy.pause()  # cut, and refuse until resumed
            _until(lambda: not link.in_sync, what="the cut seen")
            assert len(mirror.rowset) > 0
            for _ in range(3):
                _write(t, rng)
                time.sleep(0.03)
            proxy.resume()
            _settle(a, link)
            _wait_equal(mirror, t, f"after cut {round_}")
            assert link.resumed_with_deltas == round_ + 1 and link.resumed_with_snapshot == 0
            assert 0 < proxy.bytes_down < snapshot_bytes / 5, (proxy.bytes_down, snapshot_bytes)


def test_a_link_runs_at_its_graphs_cycle_priority(servers):
    """Every message of a link waits for its thread and then for the cycle thread: a link
    takes the cycle thread's priority (real-time when the graph's got it), once the graph
    started, and stays normal beside a normal graph."""
    from engine.priority import thread_priority

    a, t = _origin(servers)
    t.upsert(pa.table({"k": [1], "v": [1.0], "s": ["x"]}, schema=KV))
    for priority in ("realtime", "normal"):
        graph = UpdateGraph(validate=True)
        srv = TicktableServer(graph, ServerConfig()).start()
        try:
            link = srv.mirror(f"{a.location}/t")  # before the graph starts, as serve --mirror
            mirror = link.wait_table(10)
            graph.start(0.02, priority=priority)
            t.upsert(pa.table({"k": [2], "v": [2.0], "s": ["y"]}, schema=KV))
            end = time.monotonic() + 10  # a message after the start: the mirror holds k=2
            while len(mirror.rowset) < 2 and time.monotonic() < end:
                time.sleep(0.01)
            _wait_equal(t, mirror, "mirror")
            assert len(mirror.rowset) == 2
            assert link._thread.native_id is not None
            assert thread_priority(link._thread.native_id) == graph.priority
            if priority == "normal":
                assert graph.priority == "normal"
        finally:
            srv.shutdown()
            graph.stop()
