"""Filtered subscriptions (``SubscriptionRequest.filter``) over a real server: the stream is
the table's live ``where`` under the table's own row keys, shared per table and filter,
resumed from its history while it lingers, hidden from listings, dropped with its table,
and a bad filter is refused in one line naming the table and the column.

Cycles run by hand (``graph.run_cycle()``); a test reads a filtered stream only up to its
filtered table's sequence, never sleeping for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.graph import UpdateGraph
from engine.table import Table
from flight import substrait
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.decoder import ReferenceView
from flight.streams.registry import TableEntry
from tests.flight.conftest import OPEN, Sub

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def kv(keys, vals, strs=None) -> pa.Table:
    strs = strs if strs is not None else [f"s{k}" for k in keys]
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array(strs, pa.string()),
                     "v": pa.array(vals, pa.float64())})


def enc(expr: pc.Expression, schema: pa.Schema = KV) -> bytes:
    return substrait.encode({"filter": expr}, schema)


BIG = pc.field("v") > 1.0


def only(server: TicktableServer) -> TableEntry:
    (entry,) = server.filters.entries()
    return entry


def sequence(entry: TableEntry) -> int:
    assert entry.publisher is not None
    return entry.publisher.sequence


def recomputed(table: Table, predicate: Callable[[pa.Table], pa.Array]) -> tuple[list[int], pa.Table]:
    """The table's row keys and rows where ``predicate`` holds, from scratch."""
    keys, rows = table.rowset.keys(), table.to_arrow()
    mask = pc.fill_null(predicate(rows), False)
    return keys[np.asarray(mask)].tolist(), rows.filter(mask)


def assert_view(sub: Sub, table: Table, predicate: Callable[[pa.Table], pa.Array],
                what: str) -> None:
    keys, rows = recomputed(table, predicate)
    view = sub.view
    assert isinstance(view, ReferenceView)
    assert view.keys.tolist() == keys, f"{what}: row keys differ from the table's"
    assert view.to_arrow().equals(rows), f"{what}: rows differ\n{view.to_arrow()}\n{rows}"


def big(rows: pa.Table) -> pa.Array:
    return pc.greater(rows["v"], 1.0)


# ------------------------------------------------------------------ examples
def test_a_filtered_stream_is_the_tables_where_under_its_row_keys(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2, 3], [0.5, 2.0, 3.0]))
    graph.run_cycle()
    sub = Sub(client, "t", filter=enc(BIG))
    meta = sub.read()
    assert meta.is_snapshot and meta.table_size == 2  # the filtered table's size
    assert sub.view.keys.tolist() == [1, 2]  # the table's row keys of k=2 and k=3
    entry = only(server)
    parent = server.registry.get("t").table
    assert entry.filter_of is server.registry.get("t") and entry.name == "t"
    assert set(entry.table.rowset.keys().tolist()) <= set(parent.rowset.keys().tolist())

    t.upsert(kv([1, 2, 3], [5.0, 0.0, 4.0]))  # k=1 enters, k=2 leaves, k=3 changes
    graph.run_cycle()
    meta = sub.read()
    assert not meta.is_snapshot and meta.sequence == 1 and meta.coalesced == 1
    assert sub.view.keys.tolist() == [0, 2]
    assert sub.last.added.column("k").to_pylist() == [1]
    assert sub.last.modified.column("k").to_pylist() == [3]
    assert_view(sub, parent, big, "after a cycle")

    t.upsert(kv([2], [-1.0]))  # a change that misses the filter: nothing is sent
    t.delete(pa.table({"k": [3]}))  # ... but a delete of a matching row is
    graph.run_cycle()
    sub.until(sequence(entry))
    assert sequence(entry) == 2 and sub.view.keys.tolist() == [0]
    assert_view(sub, parent, big, "after a delete")


@pytest.mark.parametrize("seed", [0, 1])
def test_random_cycles_over_a_sorted_table_match_recomputation(server, client, graph, seed):
    """Adds, deletes, modifies moving rows into and out of the filter, over a sorted table
    (its shifts pass through the filter): after every cycle the stream equals the table
    filtered from scratch, row keys included, and every update validates (the graph's)."""
    rng = np.random.default_rng(seed)
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    server.registry.add("by_v", t.sort(["v", "k"]), "derived", parents=["t"])
    by_v = server.registry.get("by_v").table
    predicate = (pc.field("v") > 20.0) & (pc.field("s") != "s1")

    def want(rows: pa.Table) -> pa.Array:
        return pc.and_(pc.greater(rows["v"], 20.0), pc.not_equal(rows["s"], "s1"))

    sub = Sub(client, "by_v", filter=enc(predicate), max_batch_rows=7)
    sub.read()
    entry = only(server)
    for cycle in range(60):
        n = int(rng.integers(0, 25))
        keys = rng.integers(0, 120, n)
        t.upsert(pa.table({"k": keys, "s": [f"s{x}" for x in rng.integers(0, 4, n)],
                           "v": rng.integers(0, 40, n).astype(float)}, schema=KV))
        t.delete(pa.table({"k": rng.integers(0, 120, n // 3)}))
        graph.run_cycle()
        sub.until(sequence(entry))
        assert_view(sub, by_v, want, f"seed {seed} cycle {cycle}")


# ------------------------------------------------------------------ shared, lingering
def _resume(client: fl.FlightClient, table: str, view: ReferenceView, **kw) -> Sub:
    sub = Sub(client, table, resume=True, resume_epoch=view.epoch,
              resume_sequence=view.sequence, **kw)
    sub.view = view
    return sub


def test_one_filter_one_shared_table_and_a_resume_from_its_history(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv(list(range(10)), [float(i) for i in range(10)]))
    graph.run_cycle()
    one, two = Sub(client, "t", filter=enc(BIG)), Sub(client, "t", filter=enc(BIG))
    one.read(), two.read()
    entry = only(server)
    assert server.filters.watchers(entry) == 2
    other = Sub(client, "t", filter=enc(pc.field("v") < 3.0))
    other.read()
    assert len(server.filters) == 2  # another filter, another table

    one.close()
    for i in range(4):  # missed while away
        t.upsert(kv([i, 20 + i], [10.0 + i, 0.0]))
        graph.run_cycle()
    two.until(sequence(entry))
    back = _resume(client, "t", one.view, filter=enc(BIG))  # the same filter bytes
    meta = back.read()
    assert meta.resume == pb.RESUME_DELTAS and meta.coalesced == 4 and not meta.is_snapshot
    assert entry in server.filters.entries() and server.filters.watchers(entry) == 2
    assert back.view.keys.tolist() == two.view.keys.tolist()
    assert_view(back, t, big, "resumed")


def test_a_filtered_table_lingers_then_goes_and_a_resume_gets_a_snapshot(graph):
    srv = TicktableServer(graph, ServerConfig(filter_linger=0.2)).start()
    client = fl.connect(srv.location)
    try:
        t = srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
        t.upsert(kv([1, 2, 3], [1.0, 2.0, 3.0]))
        graph.run_cycle()
        sub = Sub(client, "t", filter=enc(BIG))
        sub.read()
        entry = only(srv)
        sub.close()
        end = time.monotonic() + 10
        while srv.filters.watchers(entry) and time.monotonic() < end:
            time.sleep(0.005)
        assert srv.filters.entries() == [entry]  # lingering
        while srv.filters.entries() and time.monotonic() < end:
            time.sleep(0.01)
        assert len(srv.filters) == 0 and entry.table.closed
        t.upsert(kv([1], [9.0]))
        graph.run_cycle()
        old_epoch = sub.view.epoch
        back = _resume(client, "t", sub.view, filter=enc(BIG))
        meta = back.read()
        assert meta.resume == pb.RESUME_SNAPSHOT and meta.is_snapshot
        assert only(srv) is not entry and meta.epoch != old_epoch  # a new table: a new epoch
        assert_view(back, t, big, "after the snapshot")
        back.close()
    finally:
        while OPEN:
            OPEN.pop().close()
        client.close()
        srv.shutdown()


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("bad, words", [
    (enc(pc.field("zz") > 1, pa.schema([("zz", pa.int64())])), ["'t'", "'zz'", "does not exist"]),
    (enc(pc.field("v") > 1, pa.schema([("v", pa.int64())])), ["'t'", "'v'", "double"]),
    (enc(pc.field("v") + 1.0), ["'t'", "boolean", "v"]),
    (substrait.encode({"a": BIG, "b": BIG}, KV), ["'t'", "one boolean"]),
    (b"\x01\x02junk", ["'t'", "malformed Substrait"]),
])
def test_a_bad_filter_is_refused_in_one_line_naming_the_table_and_column(server, client, graph,
                                                                          bad, words):
    server.registry.create_source("t", KV, "keyed", keys=["k"])
    with pytest.raises(pa.ArrowInvalid) as err:
        Sub(client, "t", filter=bad).read()
    message = str(err.value).split("with message: ", 1)[1].split(". gRPC client debug")[0]
    assert "\n" not in message and all(w in message for w in words), message
    assert len(server.filters) == 0  # nothing made, nothing lingering
    with pytest.raises(KeyError, match="no table 'nope'"):
        Sub(client, "nope", filter=enc(BIG)).read()


def test_filtered_tables_are_hidden_and_their_subscribers_count_as_the_tables(server, client,
                                                                              graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    plain, filtered = Sub(client, "t"), Sub(client, "t", filter=enc(BIG))
    plain.read(), filtered.read()
    assert [f.descriptor.path[0] for f in client.list_flights()] == [b"t"]
    stats = server.stats().tables
    assert [s.name for s in stats] == ["t"] and stats[0].subscribers == 2
    assert server.registry.names() == ["t"] and len(server.filters) == 1


def test_max_tables_counts_filtered_tables_and_lingering_ones_make_room(graph):
    srv = TicktableServer(graph, ServerConfig(max_tables=2)).start()
    client = fl.connect(srv.location)
    try:
        srv.registry.create_source("t", KV, "keyed", keys=["k"])
        a = Sub(client, "t", filter=enc(BIG))
        a.read()
        with pytest.raises(pa.ArrowInvalid,  # pyarrow's for RESOURCE_EXHAUSTED
                           match="resource exhausted.*filtered subscription to 't' refused.*max_tables"):
            Sub(client, "t", filter=enc(pc.field("v") < 0.0)).read()
        first = only(srv)
        a.close()
        end = time.monotonic() + 10
        while srv.filters.watchers(first) and time.monotonic() < end:
            time.sleep(0.005)
        b = Sub(client, "t", filter=enc(pc.field("v") < 0.0))  # the lingering one makes room
        b.read()
        assert only(srv) is not first and first.table.closed
        b.close()
    finally:
        while OPEN:
            OPEN.pop().close()
        client.close()
        srv.shutdown()


# ------------------------------------------------------------------ drops
def test_dropping_the_table_ends_filtered_subscribers_and_drops_lingering_tables(server, client,
                                                                               graph):
    """A filtered table is no derived table of its parent: the drop goes ahead; a watched
    filtered table ends its subscribers as the table's own (NOT_FOUND, "was dropped"), a
    lingering one goes with it. The name's next table gets a filtered table of its own."""
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    watched, left = Sub(client, "t", filter=enc(BIG)), Sub(client, "t", filter=enc(~BIG))
    watched.read(), left.read()
    left.close()
    end = time.monotonic() + 10
    while sum(server.filters.watchers(e) for e in server.filters.entries()) > 1:
        assert time.monotonic() < end
        time.sleep(0.005)
    entries = server.filters.entries()
    server.action("drop_table", pb.DropTableRequest(name="t").SerializeToString())
    assert server.registry.names() == [] and len(server.filters) == 0
    assert all(e.table.closed for e in entries)
    with pytest.raises(KeyError, match="table 't' was dropped"):
        while True:
            watched.read()
    t2 = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t2.upsert(kv([7], [7.0]))
    graph.run_cycle()
    again = Sub(client, "t", filter=enc(BIG))
    again.read()
    assert again.view.to_arrow().column("k").to_pylist() == [7]
    assert only(server).table is not entries[0].table


def test_where_keeps_the_parents_row_keys(graph: UpdateGraph):
    """What the mirror's row keys rest on: the engine's where is a subset of its parent's
    row keys, in its order, cycle after cycle."""
    t = graph.keyed_table(KV, "k")
    w = t.where(BIG)
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = 20
        t.upsert(pa.table({"k": rng.integers(0, 50, n), "s": ["x"] * n,
                           "v": rng.integers(0, 3, n).astype(float)}, schema=KV))
        t.delete(pa.table({"k": rng.integers(0, 50, 5)}))
        graph.run_cycle()
        keys, rows = recomputed(t, big)
        assert w.rowset.keys().tolist() == keys and w.to_arrow().equals(rows)
