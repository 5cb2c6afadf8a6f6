"""Subscriptions over a real Flight server: snapshots, deltas, viewports, columns, triples,
resume, slow consumers, and the consistency property against the server's own snapshot."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.ops.aggregate import agg
from flight.pb import flight_pb2 as pb
from flight.streams.codec import DeltaCodec, Encoded
from tests.flight.conftest import Sub, viewport_rows, vp
from tests.oracle import SCHEMA, RandomSource

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def kv(keys, vals, strs=None) -> pa.Table:
    strs = strs if strs is not None else [f"s{k}" for k in keys]
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array(strs, pa.string()),
                     "v": pa.array(vals, pa.float64())})


def test_empty_table_then_adds_arrive(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    sub = Sub(client, "t")
    meta = sub.read()
    assert meta.is_snapshot and meta.table_size == 0 and meta.sequence == 0
    assert sub.view.to_arrow().num_rows == 0
    t.upsert(kv([5, 1], [5.0, 1.0]))
    graph.run_cycle()
    meta = sub.read()
    assert not meta.is_snapshot and meta.sequence == 1 and meta.step == graph.step
    assert sub.view.to_arrow().equals(t.to_arrow())
    assert sub.view.to_arrow().column("k").to_pylist() == [5, 1]  # row-key (arrival) order
    sub.close()


def test_delta_carries_only_changed_rows(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv(list(range(1000)), [float(i) for i in range(1000)]))
    graph.run_cycle()
    sub = Sub(client, "t", max_batch_rows=300)
    meta = sub.read()
    assert meta.num_added_batches == 4  # 1,000 rows in batches of at most 300
    t.upsert(kv([3, 2000], [-3.0, 1.0]))
    t.delete(pa.table({"k": [7]}))
    graph.run_cycle()
    meta = sub.read()
    assert sub.last.added.num_rows == 1 and sub.last.modified.num_rows == 1
    assert {m.column for m in meta.modified} == {"v"}
    assert sub.view.to_arrow().equals(t.to_arrow())
    sub.close()


def test_subscribers_opening_at_one_step_share_one_snapshot_build(server, client, graph,
                                                                     monkeypatch):
    """Each of 1,000 subscribers joining at once had the whole table gathered and framed
    for it under the shared lock, and held its own copy (issue #39): one build instead."""
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv(list(range(1000)), [float(i) for i in range(1000)]))
    graph.run_cycle()
    builds: list[int] = []
    real = DeltaCodec.snapshot

    def counted(self: DeltaCodec, **kw: Any) -> Encoded:
        builds.append(kw["sequence"])
        return real(self, **kw)

    monkeypatch.setattr(DeltaCodec, "snapshot", counted)
    subs = [Sub(client, "t", max_batch_rows=300) for _ in range(5)]
    for s in subs:
        assert s.read().is_snapshot
    assert builds == [1]  # five streams, one build
    narrow = Sub(client, "t", columns=["v"])  # other columns: a snapshot of its own
    narrow.read()
    assert builds == [1, 1]
    t.upsert(kv([3, 2000], [-3.0, 1.0]))
    graph.run_cycle()
    late = Sub(client, "t", max_batch_rows=300)  # a later state: built again
    late.read()
    assert builds == [1, 1, 2]
    want = t.to_arrow()
    for s in [*subs, late]:
        s.until(2)
        assert s.view.to_arrow().equals(want)
        s.close()
    narrow.close()


def test_subscribers_catching_up_from_one_state_share_one_delta_build(server, client, graph,
                                                                        monkeypatch):
    """Streams outside a fan-out (here: each with a minimum interval) each read and framed
    the rows of the same composed update under the shared lock (issue #39, the soak): one
    build per state they start from instead."""
    entry = server.registry.create_source("t", KV, "keyed", keys=["k"])
    t = entry.table
    t.upsert(kv(list(range(100)), [float(i) for i in range(100)]))
    graph.run_cycle()
    builds: list[int] = []
    real = DeltaCodec.delta

    def counted(self: DeltaCodec, update: Any, **kw: Any) -> Encoded:
        builds.append(kw["sequence"])
        return real(self, update, **kw)

    monkeypatch.setattr(DeltaCodec, "delta", counted)
    subs = [Sub(client, "t", min_update_interval_ms=1) for _ in range(5)]
    narrow = Sub(client, "t", columns=["v"], min_update_interval_ms=1)
    for s in [*subs, narrow]:
        assert s.read().is_snapshot
    for seq in (2, 3):
        t.upsert(kv([3, 1000 + seq], [-3.0 * seq, 1.0]))
        graph.run_cycle()  # nothing else runs until every stream has read it
        for s in [*subs, narrow]:
            s.until(seq)
        assert builds.count(seq) == 2  # five streams share one build; other columns, their own
    assert entry.publisher is not None and entry.publisher.deltas_shared == 8
    want = t.to_arrow()
    for s in subs:
        assert s.view.to_arrow().equals(want)
        s.close()
    assert narrow.view.to_arrow().equals(t.to_arrow(["v"]))
    narrow.close()


def test_column_subset_and_change_of_columns(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    sub = Sub(client, "t", columns=["v"])
    sub.read()
    assert sub.view.to_arrow().equals(t.to_arrow(["v"]))
    assert sub.last.added.column("s").null_count == 2  # unsubscribed: null-filled
    t.upsert(kv([1], [1.0], ["changed"]))  # only an unsubscribed column changes
    graph.run_cycle()
    meta = sub.read()
    assert len(meta.modified) == 0 and sub.last.modified.num_rows == 0
    sub.change(set_columns=True, columns=["s", "k"])
    meta = sub.read()
    assert meta.is_snapshot and list(meta.columns) == ["k", "s"]
    assert sub.view.to_arrow().equals(t.to_arrow(["k", "s"]))
    sub.close()


def test_viewport_on_sorted_table_follows_moves(server, client, graph):
    src = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    src.upsert(kv(list(range(50)), [float(i) for i in range(50)]))
    graph.run_cycle()
    board = src.sort("v", descending=True)
    server.registry.add("board", board, "derived", parents=["t"])
    sub = Sub(client, "board", has_viewport=True, viewport=vp((0, 5)))
    meta = sub.read()
    assert sub.last.added.num_rows == 5 and meta.table_size == 50
    assert sub.view.to_arrow().equals(board.to_arrow().slice(0, 5))
    src.upsert(kv([3], [100.0]))  # moves into the top 5: one row enters, one leaves
    graph.run_cycle()
    sub.read()
    assert sub.view.to_arrow().equals(board.to_arrow().slice(0, 5))
    assert sub.last.added.num_rows == 1
    sub.change(set_viewport=True, has_viewport=True, viewport=vp((10, 13), (40, 60)))
    sub.read()
    assert sub.view.to_arrow().equals(viewport_rows(board.to_arrow(), [(10, 13), (40, 60)]))
    sub.change(set_viewport=True, has_viewport=False)
    sub.read()
    assert sub.view.to_arrow().equals(board.to_arrow())
    sub.close()


def test_triples_format(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    sub = Sub(client, "t", format=pb.DELTA_FORMAT_TRIPLES)
    assert sub.schema.names == ["k", "s", "v", "__time", "__diff"]
    sub.read()
    t.upsert(kv([1], [10.0]))
    t.delete(pa.table({"k": [2]}))
    graph.run_cycle()
    sub.read()
    got = sub.last.added.sort_by([("__diff", "ascending"), ("k", "ascending")]).to_pydict()
    assert got == {"k": [1, 2, 1], "s": ["s1", "s2", "s1"], "v": [1.0, 2.0, 10.0],
                   "__time": [graph.step] * 3, "__diff": [-1, -1, 1]}
    want = t.to_arrow().sort_by([(c, "ascending") for c in KV.names])
    assert sub.view.to_arrow().equals(want)
    sub.close()


def test_viewport_with_triples_is_refused(server, client):
    server.registry.create_source("t", KV, "keyed", keys=["k"])
    with pytest.raises(pa.ArrowInvalid, match="viewport needs the UPDATES format"):
        Sub(client, "t", format=pb.DELTA_FORMAT_TRIPLES, has_viewport=True,
            viewport=vp((0, 2))).read()


def _resume(client, table, view, **kw) -> Sub:
    sub = Sub(client, table, resume=True, resume_epoch=view.epoch,
              resume_sequence=view.sequence, **kw)
    sub.view = view
    return sub


def test_resume_gets_missed_deltas_when_held(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2, 3], [1.0, 2.0, 3.0]))
    graph.run_cycle()
    sub = Sub(client, "t")
    sub.read()
    sub.close()
    for i in range(5):  # missed while disconnected
        t.upsert(kv([i, 10 + i], [float(i), -1.0]))
        if i == 2:
            t.delete(pa.table({"k": [3]}))
        graph.run_cycle()
    sub2 = _resume(client, "t", sub.view)
    meta = sub2.read()
    assert meta.resume == pb.RESUME_DELTAS and not meta.is_snapshot and meta.coalesced == 5
    assert sub2.view.to_arrow().equals(t.to_arrow())
    assert sub2.last.added.num_rows + sub2.last.modified.num_rows <= 12
    t.upsert(kv([99], [9.0]))
    graph.run_cycle()
    sub2.read()
    assert sub2.view.to_arrow().equals(t.to_arrow())
    sub2.close()


def test_resume_gets_snapshot_when_history_is_gone(graph):
    from flight.server import ServerConfig, TicktableServer

    srv = TicktableServer(graph, ServerConfig(history_updates=3)).start()
    try:
        client = fl.connect(srv.location)
        t = srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
        sub = Sub(client, "t")
        sub.read()
        sub.close()
        for i in range(6):
            t.upsert(kv([i], [float(i)]))
            graph.run_cycle()
        sub2 = _resume(client, "t", sub.view)
        meta = sub2.read()
        assert meta.resume == pb.RESUME_SNAPSHOT and meta.is_snapshot
        assert sub2.view.to_arrow().equals(t.to_arrow())
        other = _resume(client, "t", sub.view)  # a stale epoch also gets a snapshot
        other.view.epoch = "another-server"
        other2 = Sub(client, "t", resume=True, resume_epoch="x", resume_sequence=1)
        assert other2.read().resume == pb.RESUME_SNAPSHOT
        for s in (sub2, other, other2):
            s.close()
        client.close()
    finally:
        srv.shutdown()


def test_resume_with_viewport_resends_viewport_rows(server, client, graph):
    src = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    src.upsert(kv(list(range(20)), [float(i) for i in range(20)]))
    graph.run_cycle()
    board = src.sort("v")
    server.registry.add("board", board, "derived", parents=["t"])
    sub = Sub(client, "board", has_viewport=True, viewport=vp((0, 4)))
    sub.read()
    sub.close()
    src.upsert(kv([15, 30], [-1.0, -2.0]))
    graph.run_cycle()
    sub2 = _resume(client, "board", sub.view, has_viewport=True, viewport=vp((0, 4)))
    meta = sub2.read()
    assert meta.resume == pb.RESUME_DELTAS
    assert sub2.view.to_arrow().equals(board.to_arrow().slice(0, 4))
    sub2.close()


def test_slow_subscriber_converges_with_coalesced_updates(graph):
    from flight.server import ServerConfig, TicktableServer

    srv = TicktableServer(graph, ServerConfig(max_pending=4)).start()
    try:
        client = fl.connect(srv.location)
        t = srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
        sub = Sub(client, "t")
        sub.read()
        server_sub = srv.subscriptions[0]
        rng = np.random.default_rng(5)
        pending_max = 0
        for _ in range(200):  # the client reads nothing meanwhile: the stream's window fills
            keys = rng.integers(0, 5000, 1000)
            t.upsert(kv(keys.tolist(), rng.random(1000).tolist(), ["x" * 60] * 1000))
            graph.run_cycle()
            pending_max = max(pending_max, len(server_sub._pending))
        assert pending_max <= 5  # bounded: composed in the cycle past max_pending
        final = srv.registry.get("t").publisher.sequence
        n, most = 0, 0
        while sub.view.sequence < final:
            meta = sub.read()
            n, most = n + 1, max(most, meta.coalesced)
            time.sleep(0.01)  # a slow reader
        assert n < 200 and most > 4  # fewer, composed messages
        assert sub.view.to_arrow().equals(t.to_arrow())
        sub.close()
        client.close()
    finally:
        srv.shutdown()


@pytest.mark.parametrize("seed", [1, 2])
def test_consistency_property_three_subscribers(server, client, graph, seed):
    """Random source + derived tables, three concurrent subscribers (all columns, a column
    subset, a moving viewport); after every cycle each view equals the server's snapshot."""
    rng = np.random.default_rng(seed)
    src = RandomSource(graph, "keyed", rng, max_rows=150)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    filtered = src.table.where(pc.field("Price") > 20)
    board = filtered.sort(["Price", "Key"], descending=[True, False])
    totals = src.table.agg_by([agg.sum("Qty"), agg.count("n")], by="Sym")
    for name, tab in (("filtered", filtered), ("board", board), ("totals", totals)):
        server.registry.add(name, tab, "derived", parents=["src"])
    subs = {
        "src": Sub(client, "src"),
        "totals": Sub(client, "totals", columns=["Sym", "Qty"]),
        "board": Sub(client, "board", has_viewport=True, viewport=vp((0, 10))),
        "filtered": Sub(client, "filtered", columns=["Key", "Price"]),
    }
    for s in subs.values():
        s.read()
    ranges = [(0, 10)]
    mismatches = 0
    cycles = 600
    for cycle in range(cycles):
        src.step()
        graph.run_cycle()
        if rng.random() < 0.1:  # move the viewport
            b = int(rng.integers(0, 40))
            ranges = [(b, b + int(rng.integers(0, 15)))]
            if rng.random() < 0.3:
                ranges.append((b + 20, b + 25))
            subs["board"].change(set_viewport=True, has_viewport=True, viewport=vp(*ranges))
            while subs["board"].view.viewport != ranges:  # deltas sent before the change
                subs["board"].read()
        for name, s in subs.items():
            s.until(server.registry.get(name).publisher.sequence)
        checks = {
            "src": (subs["src"].view.to_arrow(), src.table.to_arrow()),
            "totals": (subs["totals"].view.to_arrow(), totals.to_arrow(["Sym", "Qty"])),
            "board": (subs["board"].view.to_arrow(), viewport_rows(board.to_arrow(), ranges)),
            "filtered": (subs["filtered"].view.to_arrow(), filtered.to_arrow(["Key", "Price"])),
        }
        for name, (got, want) in checks.items():
            if not got.equals(want):
                mismatches += 1
                raise AssertionError(f"cycle {cycle}: {name} differs\n{got}\n{want}")
    assert mismatches == 0
    for s in subs.values():
        s.close()
    assert src.table.size > 0 and board.size > 0


def test_subscribers_on_other_threads_see_every_step(server, graph):
    """Subscribers reading concurrently on their own threads while cycles run."""
    t = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
    errors: list[BaseException] = []
    last: list[int] = []  # the sequence of the last update, set just before its cycle
    final: dict[int, pa.Table] = {}

    def reader(i: int) -> None:
        try:
            c = fl.connect(server.location)
            s = Sub(c, "t")
            s.read()
            while not last or s.view.sequence < last[0]:
                s.read()
            final[i] = s.view.to_arrow()
            s.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    rng = np.random.default_rng(3)
    src = RandomSource.__new__(RandomSource)
    src.kind, src.rng, src.max_rows, src.table, src.next_key = "keyed", rng, 100, t, 0
    for _ in range(150):
        src.step()
        graph.run_cycle()
    # a reader stops once it has the last update, which comes after this: one that saw
    # no ``last`` yet and waits for a message gets it (set after the cycle, a reader that
    # already had every update could wait for one more forever)
    last.append(server.registry.get("t").publisher.sequence + 1)
    t.upsert(src._rows(1))
    graph.run_cycle()
    assert server.registry.get("t").publisher.sequence == last[0]
    for th in threads:
        th.join(30)
    assert not errors, errors
    want = t.to_arrow()
    assert len(final) == 3 and all(v.equals(want) for v in final.values())
