"""Filtered mirrors between real servers (gRPC over localhost): ``MirrorSpec.filter`` and
``UpdateGraph.remote_table(filter=...)``. The mirror is the origin's table filtered there,
under the origin's row keys and order, one update per origin message; links with one filter
share one table at the origin; a cut link resumes with deltas while that table lingers and
with a snapshot's difference once it is gone; a bad filter gives up at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ticktable as tt
from engine.errors import ExpressionError, InputError
from engine.table import Table
from engine.update import TableUpdate, compose
from flight import substrait
from flight.links import Link, MirrorSpec
from flight.links.spec import encode_filter
from tests.flight.links.test_links import KV, Server, _origin, _settle, _until, _wait_equal, _write
from tests.flight.links.test_links import servers as servers  # the fixture

BIG = pc.field("v") > 25.0
WIDE = (pc.field("v") > 20.0) & (pc.field("s") != "s1")


def _big(rows: pa.Table) -> pa.Array:
    return pc.greater(rows["v"], 25.0)


class _Filtered:
    """The origin's table filtered from scratch, for _same (row keys and rows)."""

    def __init__(self, table: Table, mask=_big) -> None:
        self.table, self.mask, self.graph = table, mask, table.graph

    @property
    def rowset(self):
        return self

    def keys(self) -> np.ndarray:
        rows = self.table.to_arrow(lock=False)
        return self.table.rowset.keys()[np.asarray(pc.fill_null(self.mask(rows), False))]

    def to_arrow(self, *, lock: bool = True) -> pa.Table:
        rows = self.table.to_arrow(lock=lock)
        return rows.filter(pc.fill_null(self.mask(rows), False))


def _spec(a: Server, local: str, predicate: pc.Expression = BIG, **kw) -> MirrorSpec:
    return MirrorSpec(f"{a.location}", "t", local,
                      filter=encode_filter(predicate, KV, "t"), **kw)


def _filtered_entry(a: Server):
    (entry,) = a.srv.filters.entries()
    return entry


def test_a_filtered_mirror_equals_its_origin_filtered_update_for_update(servers):
    """Random rounds of upserts (rows moving into and out of the filter), new keys and
    deletes: after each round the mirror equals the origin filtered from scratch, row keys
    included; each mirror update is the origin's filtered update (or the exact composition
    of those one message carried), and validates (the graphs run with validate=True)."""
    a, t = _origin(servers)
    b = Server()
    servers.append(b)
    link = b.srv.mirror(_spec(a, "wide", WIDE))
    mirror = link.wait_table(10)
    entry = _filtered_entry(a)
    seen: dict[int, tuple[TableUpdate, object]] = {}
    pub = entry.publisher
    entry.table.listen(lambda up, tb: seen.__setitem__(pub.sequence, (up, tb.prev_rowset)))
    got: list[tuple[int, TableUpdate]] = []
    mirror.listen(lambda up, tb: got.append((tb.position[1], up)))

    def wide(rows: pa.Table) -> pa.Array:
        return pc.and_(pc.greater(rows["v"], 20.0), pc.not_equal(rows["s"], "s1"))

    rng = np.random.default_rng(21)
    for round_ in range(30):
        _write(t, rng)
        if round_ % 3 == 0:  # and moves of existing rows only, across the threshold
            keys = np.asarray(t.to_arrow()["k"])[:10]
            t.upsert(pa.table({"k": keys, "v": rng.integers(0, 50, keys.size).astype(float),
                               "s": ["s2"] * keys.size}, schema=KV))
        _settle(a, link)
        _wait_equal(mirror, _Filtered(t, wide), f"round {round_}")
    assert mirror.failure is None and b.srv.registry.get("wide").table is mirror
    prev_seq = None
    for seq, up in got:
        if prev_seq is not None:  # the first update is the snapshot's difference
            run = [seen[s] for s in range(prev_seq + 1, seq + 1)]
            want, prev = run[0]
            for nxt, _ in run[1:]:
                want = compose(want, nxt, prev)  # type: ignore[arg-type]
            assert (up.added, up.removed, up.modified, up.shifted) == (
                want.added, want.removed, want.modified, want.shifted), f"at {seq}"
        prev_seq = seq
    assert len(got) >= 10


def test_links_with_one_filter_share_one_table_at_the_origin_which_lists_none(servers):
    a, t = _origin(servers)
    _write(t, np.random.default_rng(2))
    b = Server()
    servers.append(b)
    one = b.srv.mirror(_spec(a, "one"))
    two = b.srv.mirror(_spec(a, "two"))
    for link in (one, two):
        link.wait_table(10)
        _settle(a, link)
    entry = _filtered_entry(a)
    assert a.srv.filters.watchers(entry) == 2
    three = b.srv.mirror(_spec(a, "three", WIDE))
    three.wait_table(10)
    assert len(a.srv.filters) == 2
    with tt.connect(a.location) as client:
        assert client.tables() == ["t"]  # ListFlights
    (stats,) = a.srv.stats().tables
    assert stats.name == "t" and stats.subscribers == 3  # the filtered ones are t's
    c = Server(mirror_of=[a.location])
    servers.append(c)
    (follower,) = c.srv.followers  # --mirror-of mirrors what the origin lists
    follower.poll = 0.05
    _until(lambda: follower.listings >= 3 and "t" in c.srv.registry.names(), what="listings")
    assert c.srv.registry.names() == ["t"]


def _proxied(a: Server):
    from tests.proxy import TcpProxy

    host, port = a.location.rsplit("//", 1)[1].rsplit(":", 1)
    return TcpProxy(host, int(port))


def test_a_cut_link_resumes_with_deltas_while_the_origins_filtered_table_lingers(servers):
    a, t = _origin(servers)
    rng = np.random.default_rng(5)
    for _ in range(5):
        _write(t, rng)
    with _proxied(a) as proxy:
        b = Server()
        servers.append(b)
        link = b.srv.mirror(MirrorSpec(f"grpc://127.0.0.1:{proxy.port}", "t", "big",
                                       filter=encode_filter(BIG, KV, "t")))
        mirror = link.wait_table(10)
        _settle(a, link)
        entry = _filtered_entry(a)
        for round_ in range(2):
            proxy.pause()  # cut, and refuse until resumed
            _until(lambda: not link.in_sync, what="the cut seen")
            for _ in range(3):
                _write(t, rng)
                time.sleep(0.02)
            proxy.resume()
            _settle(a, link)
            _wait_equal(mirror, _Filtered(t), f"after cut {round_}")
            assert (link.resumed_with_deltas, link.resumed_with_snapshot) == (round_ + 1, 0)
            assert a.srv.filters.entries() == [entry]  # the same table, its history


def test_past_the_linger_a_reconnect_applies_the_snapshots_difference(servers):
    a = Server(filter_linger=0.05)
    servers.append(a)
    t = a.srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(pa.table({"k": np.arange(200), "v": np.arange(200) % 50 * 1.0,
                       "s": ["x"] * 200}, schema=KV))
    with _proxied(a) as proxy:
        b = Server()
        servers.append(b)
        link = b.srv.mirror(MirrorSpec(f"grpc://127.0.0.1:{proxy.port}", "t", "big",
                                       filter=encode_filter(BIG, KV, "t")))
        mirror = link.wait_table(10)
        _settle(a, link)
        _wait_equal(mirror, _Filtered(t), "first")
        first = _filtered_entry(a)
        updates: list[TableUpdate] = []
        mirror.listen(lambda up, tb: updates.append(up))
        proxy.pause()
        _until(lambda: not a.srv.filters.entries(), what="the filtered table gone")
        before = set(mirror.rowset.keys().tolist())
        t.upsert(pa.table({"k": [0, 30, 1000], "v": [40.0, 0.0, 45.0], "s": ["y"] * 3},
                          schema=KV))  # one row in, one out, one new
        t.upsert(pa.table({"k": [31], "v": [31.5], "s": ["z"]}, schema=KV))  # changed, still in
        _until(lambda: t.size == 201, what="the writes applied")
        proxy.resume()
        _settle(a, link)
        _wait_equal(mirror, _Filtered(t), "after the snapshot")
        assert (link.resumed_with_deltas, link.resumed_with_snapshot) == (0, 1)
        assert _filtered_entry(a) is not first
        (up,) = [u for u in updates if not u.empty()]
        after = set(mirror.rowset.keys().tolist())
        assert set(up.removed.keys().tolist()) == before - after and len(up.removed) == 1
        assert set(up.added.keys().tolist()) == after - before and len(up.added) == 2
        assert up.modified.keys().tolist() == [31]  # never remove-all/add-all


def test_a_bad_filter_gives_up_at_once_naming_the_column(servers):
    a, t = _origin(servers)
    other = pa.schema([("zz", pa.int64())])
    bad = substrait.encode({"filter": pc.field("zz") > 1}, other)
    graph = tt.UpdateGraph(validate=True)
    start = time.monotonic()
    with pytest.raises(InputError) as err:
        graph.remote_table(a.location, "t", filter=bad, timeout=30)
    assert time.monotonic() - start < 5  # not after its timeout
    text = str(err.value)
    assert "'zz'" in text and "'t'" in text and "\n" not in text and "gRPC" not in text, text
    # checked before subscribing, as an expression
    with pytest.raises(ExpressionError, match="'zz'"):
        graph.remote_table(a.location, "t", filter=pc.field("zz") > 1, timeout=30)
    with pytest.raises(ExpressionError, match="boolean"):
        graph.remote_table(a.location, "t", filter=pc.field("v") + 1.0, timeout=30)
    # a server's mirror: the link stops, says why, and makes no table
    b = Server()
    servers.append(b)
    link = b.srv.mirror(MirrorSpec(a.location, "t", "m", filter=bad))
    _until(lambda: link.state == "gave up", what="the link giving up")
    assert "'zz'" in link.status().detail and "m" not in b.srv.registry.names()
    assert a.srv.filters.entries() == []


def test_a_table_not_there_yet_is_waited_for(servers):
    """NOT_FOUND is not a refusal: remote_table keeps asking until its timeout."""
    a = Server()
    servers.append(a)
    graph = tt.UpdateGraph(validate=True)
    made: list[Table] = []
    thread = threading.Thread(target=lambda: made.append(graph.remote_table(
        a.location, "later", filter=BIG, timeout=20)))
    thread.start()
    time.sleep(0.3)
    later = a.srv.registry.create_source("later", KV, "keyed", keys=["k"]).table
    later.upsert(pa.table({"k": [1, 2], "v": [1.0, 30.0], "s": ["a", "b"]}, schema=KV))
    thread.join(20)
    (remote,) = made
    graph.start(0.02)
    try:
        _wait_equal(remote, _Filtered(later), "later")
    finally:
        remote.close()
        graph.stop()


def test_the_read_only_token_mirrors_with_a_filter(servers):
    a = Server(token="w-token", read_token="r-token")
    servers.append(a)
    t = a.srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
    rng = np.random.default_rng(3)
    _write(t, rng)
    graph = tt.UpdateGraph(validate=True)
    remote = graph.remote_table(a.location, "t", token="r-token", filter=BIG, timeout=10)
    graph.start(0.02)
    try:
        for _ in range(5):
            _write(t, rng)
            time.sleep(0.02)
        link = remote.source
        assert isinstance(link, Link)
        _settle(a, link)
        _wait_equal(remote, _Filtered(t), "read-only filtered mirror")
    finally:
        remote.close()
        graph.stop()


def test_dropping_the_origin_table_while_its_filtered_table_lingers(servers):
    a, t = _origin(servers)
    _write(t, np.random.default_rng(4))
    b = Server()
    servers.append(b)
    link = b.srv.mirror(_spec(a, "big"))
    link.wait_table(10)
    _settle(a, link)
    entry = _filtered_entry(a)
    b.srv.links.forget("big")  # the link leaves: the filtered table lingers (60 s)
    _until(lambda: a.srv.filters.watchers(entry) == 0, what="the subscriber gone")
    assert a.srv.filters.entries() == [entry]
    a.srv.durability.drop_table("t")  # not refused: a filtered table is no derived table
    assert a.srv.registry.names() == [] and a.srv.filters.entries() == []
    assert entry.table.closed


def test_spec_filter_round_trips_through_json():
    f = encode_filter(BIG, KV, "t")
    spec = MirrorSpec("grpc://h:1", "t", "big", filter=f, columns=("k", "v"))
    doc = spec.to_json()
    assert MirrorSpec.from_json(doc) == spec and MirrorSpec.from_json(doc).filter == f
    assert "filter" not in MirrorSpec("grpc://h:1", "t").to_json()  # as before filters
    assert "filter" not in repr(spec)
