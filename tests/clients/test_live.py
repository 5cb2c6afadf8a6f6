"""LiveTable over a real server: exact updates, the randomized oracle (keyed and sorted
tables, columns, moving viewports, forced reconnects resuming by deltas and by snapshot),
iterators, shutdown and permanent errors.

Cycles run by hand (``graph.run_cycle()``); the test then waits for the view to apply the
table's sequence (``wait_for``), never sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyroaring import BitMap64

from clients.live import LiveTable
from clients.livestate import LiveState, Update, _index_of, _Store
from clients.wire import Endpoint
from engine._kernels import rowkeymap
from engine.errors import ProtocolError
from engine.graph import UpdateGraph
from engine.sources import KeyedTable
from flight import substrait
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from tests.clients.conftest import KV, Gate, assert_view, kv, rows_at
from tests.frames import assert_frame_same
from tests.oracle import SCHEMA, RandomSource


def keyed(server: TicktableServer, name: str) -> KeyedTable:
    """A new keyed source table ``name`` (k int64 key, s string, v float64)."""
    table = server.registry.create_source(name, KV, "keyed", keys=["k"]).table
    assert isinstance(table, KeyedTable)
    return table


def seq(server: TicktableServer, name: str) -> int:
    publisher = server.registry.get(name).publisher
    assert publisher is not None
    return publisher.sequence


def frame(rows: list[tuple[int, str, float]], columns: tuple[str, ...] = ("k", "s", "v")) -> pd.DataFrame:
    t = kv([r[0] for r in rows], [r[2] for r in rows], [r[1] for r in rows])
    out: pd.DataFrame = t.select(list(columns)).to_pandas()
    return out


def same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert_frame_same(got.reset_index(drop=True), want.reset_index(drop=True))


# ------------------------------------------------------------------ examples
def test_snapshot_then_exact_updates(server, graph, subscribe):
    t = keyed(server, "t")
    t.upsert(kv([1, 2, 3], [1.0, 2.0, 3.0]))
    graph.run_cycle()
    got: list[Update] = []
    live = subscribe("t", on_update=got.append)
    assert live.wait_for() and live.size == 3 and live.sequence == 1
    same(live.df, frame([(1, "s1", 1.0), (2, "s2", 2.0), (3, "s3", 3.0)]))
    assert isinstance(live.df.index, pd.RangeIndex)
    t.upsert(kv([2, 9], [20.0, 9.0]))  # modify 2 (v only), add 9
    t.delete(pa.table({"k": [1]}))
    graph.run_cycle()
    assert live.wait_for(sequence=2)
    u = next(x for x in got if x.sequence == 2)
    assert not u.is_snapshot and u.resumed == "none" and u.step == graph.step
    same(u.added, frame([(9, "s9", 9.0)]))
    same(u.removed, frame([(1, "s1", 1.0)]))
    same(u.modified, frame([(2, "s2", 20.0)]))
    same(u.modified_previous, frame([(2, "s2", 2.0)]))
    assert u.modified_columns == ("v",)
    same(live.df, frame([(2, "s2", 20.0), (3, "s3", 3.0), (9, "s9", 9.0)]))
    assert live.df is live.df  # cached per applied message
    assert repr(live) == "<LiveTable 't' connected size=3 step=2 sequence=2 columns=[k, s, v]>"
    assert repr(u) == "<Update seq=2 step=2 +1 -1 ~1 resumed=none>"
    t.delete(pa.table({"k": [2, 3, 9]}))  # delete everything, then add again
    graph.run_cycle()
    assert live.wait_for(sequence=3)
    t.upsert(kv([4], [4.0]))
    graph.run_cycle()
    assert live.wait_for(sequence=4)
    same(got[-2].removed, frame([(2, "s2", 20.0), (3, "s3", 3.0), (9, "s9", 9.0)]))
    assert live.size == 1 and got[-1].added.k.tolist() == [4]


def test_column_subset_and_set_columns(server, graph, subscribe):
    t = keyed(server, "t")
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    got: list[Update] = []
    live = subscribe("t", columns=["v", "k"], on_update=got.append)
    assert live.wait_for() and live.columns == ["k", "v"]  # the table's order
    same(live.df, frame([(1, "s1", 1.0), (2, "s2", 2.0)], ("k", "v")))
    t.upsert(kv([1], [1.0], ["changed"]))  # only an unsubscribed column changes
    graph.run_cycle()
    assert live.wait_for(sequence=2)  # (else the server may compose both cycles into one)
    t.upsert(kv([2], [5.0]))
    graph.run_cycle()
    assert live.wait_for(sequence=3)
    assert [len(u.modified) for u in got[1:]] == [0, 1] and got[-1].modified_columns == ("v",)
    assert live.set_columns(["s"])
    assert live.columns == ["s"] and got[-1].is_snapshot
    same(live.df, frame([(1, "changed", 1.0), (2, "s2", 5.0)], ("s",)))
    same(got[-1].removed, frame([(1, "changed", 1.0), (2, "s2", 5.0)], ("k", "v")))
    assert live.set_columns(None) and live.columns == ["k", "s", "v"]


def test_viewport_updates_cover_held_rows_only(server, graph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv(list(range(10)), [float(i) for i in range(10)]))
    graph.run_cycle()
    board = src.sort("v", descending=True)
    server.registry.add("board", board, "derived", parents=["t"])
    got: list[Update] = []
    live = subscribe("board", viewport=[(0, 3)], on_update=got.append)
    assert live.wait_for() and live.size == 10
    same(live.df, frame([(9, "s9", 9.0), (8, "s8", 8.0), (7, "s7", 7.0)]))
    assert live.df.index.tolist() == [0, 1, 2] and live.viewport == [(0, 3)]
    # 3 enters at the top, 7 leaves; 8 is modified (not in the sort key: it stays put)
    src.upsert(kv([3, 8], [100.0, 8.0], ["s3", "x8"]))
    graph.run_cycle()
    assert live.wait_for(sequence=1)
    u = got[-1]
    same(u.added, frame([(3, "s3", 100.0)]))
    same(u.removed, frame([(7, "s7", 7.0)]))
    same(u.modified, frame([(8, "x8", 8.0)]))
    same(u.modified_previous, frame([(8, "s8", 8.0)]))
    assert "s" in u.modified_columns  # (the server may list more: "may have changed")
    src.upsert(kv([0], [0.5]))  # outside the viewport: no held row changes
    graph.run_cycle()
    assert live.wait_for(sequence=2)
    assert len(got[-1].added) == len(got[-1].removed) == len(got[-1].modified) == 0
    assert live.set_viewport([(8, 20), (0, 1)])
    assert live.df.index.tolist() == [0, 8, 9]
    same(live.df, frame([(3, "s3", 100.0), (1, "s1", 1.0), (0, "s0", 0.5)]))
    src.upsert(kv([9], [-1.0]))  # moves from position 1 to the end, into the viewport
    graph.run_cycle()
    assert live.wait_for(sequence=3)
    same(got[-1].added, frame([(9, "s9", -1.0)]))
    same(got[-1].removed, frame([(1, "s1", 1.0)]))
    assert live.df.k.tolist() == [3, 0, 9]
    assert live.set_viewport(None) and live.df.shape == (10, 3)
    with pytest.raises(ProtocolError, match="bad viewport"):
        live.set_viewport([(5, 2)])


# ------------------------------------------------------------------ the oracle
def _replay(state: dict[int, dict[Any, Any]], u: Update) -> None:
    """Apply an update to a dict keyed by the ``Key`` column (a consumer's own copy)."""
    if u.is_snapshot:  # replace everything held
        state.clear()
    else:
        for key in u.removed["Key"].tolist():
            del state[key]
    for part in (u.added, u.modified):
        for row in part.to_dict("records"):
            state[row["Key"]] = row


def _as_frame(state: dict[int, dict[Any, Any]]) -> pd.DataFrame:
    if not state:  # no rows to infer types from: the schema's (a frame of records: object)
        return SCHEMA.empty_table().to_pandas()
    return pd.DataFrame([state[k] for k in sorted(state)], columns=SCHEMA.names)


@pytest.mark.parametrize("seed", [7, 8])
def test_oracle_random_cycles(server, graph, subscribe, monkeypatch, seed):
    """Random writes to a keyed table and a sorted derived table; after every cycle each
    view equals the server's table: all columns, a column subset, a moving viewport over
    the sorted table, the whole sorted table (shifts). Mid-run the streams are broken and
    resume from the history; the values log compacts a few slots at a time on most
    messages and the key index turns hashed (lowered thresholds). A consumer replaying
    every update onto a dict ends equal; the updates of the sorted views, read only at
    the end (after many compactions), replay onto the table as it was at every cycle."""
    monkeypatch.setattr(LiveState, "COMPACT_SLACK", 16)
    monkeypatch.setattr(LiveState, "COMPACT_MIN", 1)
    monkeypatch.setattr(LiveState, "COMPACT_FACTOR", 2)
    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)  # the key index turns hashed sooner
    monkeypatch.setattr(_Store, "_SMALL", 16)
    rng = np.random.default_rng(seed)
    src = RandomSource(graph, "keyed", rng, max_rows=150)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    board = src.table.sort(["Price", "Key"], descending=[True, False])
    server.registry.add("board", board, "derived", parents=["src"])
    full = subscribe("src", max_batch_rows=7)
    some = subscribe("src", columns=["Price", "Key"])
    ranges = [(0, 10)]
    late: dict[str, list[Update]] = {"window": [], "ordered": []}  # read at the end
    window = subscribe("board", viewport=ranges, on_update=late["window"].append)
    ordered = subscribe("board", on_update=late["ordered"].append)
    was: dict[str, dict[int, pd.DataFrame]] = {"window": {}, "ordered": {}}  # by sequence
    replayed: dict[int, dict[Any, Any]] = {}
    replayed_to = -1
    resumed: list[str] = []
    updates = full.updates(timeout=10, snapshot=True)  # from the current view on
    views = [(full, src.table, None, "src"), (some, src.table, ["Key", "Price"], "src"),
             (window, board, None, "board"), (ordered, board, None, "board")]
    cycles = 260
    sizes = []  # the sorted table's, every cycle: the views were checked over rows
    for cycle in range(cycles):
        src.step()
        graph.run_cycle()
        sizes.append(board.size)
        if cycle in (60, 200):  # a broken stream: resumed from the server's history
            for live in (full, window, ordered):
                live._drop_connection()
        if rng.random() < 0.08:
            b = int(rng.integers(0, 40))
            ranges = [(b, b + int(rng.integers(0, 15)))]
            if rng.random() < 0.3:
                ranges.append((b + 20, b + 25))
            assert window.set_viewport(ranges), f"cycle {cycle}: viewport not applied"
        if cycle == 130:
            assert some.set_columns(["Sym", "Key"])
            views[1] = (some, src.table, ["Sym", "Key"], "src")
        for live, table, columns, name in views:
            assert live.wait_for(sequence=seq(server, name)), f"cycle {cycle}: {live!r}"
            vp = ranges if live is window else None
            assert_view(live, table.to_arrow(columns), vp, f"seed {seed} cycle {cycle}")
            if live is window or live is ordered:
                rows = rows_at(table.to_arrow(), vp)[0].to_pandas().to_dict("records")
                was["window" if live is window else "ordered"][live.sequence] = _as_frame(
                    {r["Key"]: r for r in rows})
        while replayed_to < full.sequence:
            u = next(updates)
            _replay(replayed, u)
            replayed_to = u.sequence
            resumed.append(u.resumed)
    same(_as_frame(replayed), full.df.sort_values("Key"))  # (row keys are not in Key order)
    for name, ups in late.items():
        held: dict[int, dict[Any, Any]] = {}
        for i, u in enumerate(ups):
            _replay(held, u)
            if (i + 1 == len(ups) or ups[i + 1].sequence != u.sequence) and u.sequence in was[name]:
                same(_as_frame(held), was[name].pop(u.sequence))
        assert not was[name], f"{name}: no update reached sequences {sorted(was[name])[:10]}"
    assert full.reconnects == 2 and window.reconnects == 2 and some.reconnects == 0
    assert resumed.count("deltas") == 2 and "snapshot" not in resumed
    # not an empty table's views: rows in most cycles (the last may have none, by the seed)
    assert sum(1 for n in sizes if n > 0) > cycles // 2 and max(sizes) > 20, sizes


def test_resume_by_snapshot_when_history_is_gone(graph, lives):
    srv = TicktableServer(graph, ServerConfig(history_updates=3)).start()
    try:
        t = keyed(srv, "t")
        t.upsert(kv([1, 2], [1.0, 2.0]))
        graph.run_cycle()
        gate = Gate(srv.location)
        got: list[Update] = []
        live = LiveTable(gate, "t", on_update=got.append, reconnect_delay=0.01)
        lives.append(live)
        assert live.wait_for()
        gate.open.clear()  # the client cannot come back until the history is gone
        live._drop_connection()
        for i in range(6):
            t.upsert(kv([10 + i], [float(i)]))
            t.delete(pa.table({"k": [1]}))
            graph.run_cycle()
        gate.open.set()
        assert live.wait_for(sequence=seq(srv, "t"))
        assert got[-1].is_snapshot and got[-1].resumed == "snapshot" and live.reconnects >= 1
        same(got[-1].removed, frame([(1, "s1", 1.0), (2, "s2", 2.0)]))
        assert_view(live, t.to_arrow(), None, "after the snapshot resume")
        t.upsert(kv([2], [-2.0]))
        graph.run_cycle()
        assert live.wait_for(sequence=seq(srv, "t"))
        assert got[-1].resumed == "none" and got[-1].modified.v.tolist() == [-2.0]
        live.close()
    finally:
        srv.shutdown()


def test_resume_by_deltas_with_a_viewport(server, graph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv(list(range(20)), [float(i) for i in range(20)]))
    graph.run_cycle()
    server.registry.add("board", src.sort("v"), "derived", parents=["t"])
    gate = Gate(server.location)
    got: list[Update] = []
    live = subscribe("board", connect=gate, viewport=[(0, 4)], on_update=got.append,
                     reconnect_delay=0.01)
    assert live.wait_for()
    gate.open.clear()
    live._drop_connection()
    src.upsert(kv([15, 30, 2], [-1.0, -2.0, 2.5]))  # two rows enter the top 4, 2 is modified
    graph.run_cycle()
    gate.open.set()
    assert live.wait_for(sequence=1)
    u = got[-1]
    assert u.resumed == "deltas" and not u.is_snapshot
    assert sorted(u.added.k.tolist()) == [15, 30] and sorted(u.removed.k.tolist()) == [2, 3]
    assert_view(live, server.registry.get("board").table.to_arrow(), [(0, 4)], "resumed")


def test_a_filtered_subscription_resumes_with_its_filter_by_deltas(server, graph, subscribe):
    """The filter travels in every subscribe, the resume's too: the server answers it from
    the shared filtered table's history, with rows that entered and left the filter."""
    src = keyed(server, "t")
    src.upsert(kv(list(range(20)), [float(i) for i in range(20)]))
    graph.run_cycle()
    predicate = substrait.encode({"filter": pc.field("v") >= 10}, KV)
    gate = Gate(server.location)
    got: list[Update] = []
    live = subscribe("t", connect=gate, filter=predicate, on_update=got.append,
                     reconnect_delay=0.01)
    assert live.wait_for() and live.size == 10
    (entry,) = server.filters.entries()
    assert entry.publisher is not None
    gate.open.clear()
    live._drop_connection()
    src.upsert(kv([3, 12, 30], [11.0, 1.0, 30.0]))  # 3 enters, 12 leaves, 30 is new
    graph.run_cycle()
    gate.open.set()
    assert live.wait_for(sequence=entry.publisher.sequence)
    u = got[-1]
    assert u.resumed == "deltas" and not u.is_snapshot
    assert sorted(u.added.k.tolist()) == [3, 30] and u.removed.k.tolist() == [12]
    whole = src.to_arrow()
    assert_view(live, whole.filter(pc.greater_equal(whole["v"], 10.0)), None, "resumed")
    assert server.filters.entries() == [entry]  # the same table, shared across the break


def test_server_restart_resumes_by_snapshot(graph, lives):
    """The server goes away (its shutdown ends the stream as unavailable); the client keeps
    trying and subscribes to the new server's table, a new epoch: a snapshot."""
    first = TicktableServer(graph, ServerConfig()).start()
    t = keyed(first, "t")
    t.upsert(kv([1], [1.0]))
    graph.run_cycle()
    gate = Gate(first.location)
    live = LiveTable(gate, "t", reconnect_delay=0.01, max_reconnect_delay=0.05)
    lives.append(live)
    assert live.wait_for()
    gate.open.clear()
    assert first.shutdown()
    g2 = UpdateGraph(validate=True)
    second = TicktableServer(g2, ServerConfig()).start()
    try:
        t2 = keyed(second, "t")
        for i in range(3):  # (the old view is at sequence 1: go past it)
            t2.upsert(kv([5, 6 + i], [5.0, 6.0]))
            g2.run_cycle()
        gate.location = second.location
        gate.open.set()
        assert live.wait_for(sequence=3) and live.size == 4
        assert_view(live, t2.to_arrow(), None, "after the restart")
        assert live.error is None and live.reconnects >= 1
        live.close()
    finally:
        second.shutdown()


def test_a_failed_apply_starts_over_from_a_snapshot(server, graph, subscribe, monkeypatch):
    """A reader exception mid-apply (injected once) discards the possibly half-applied
    state and resubscribes without resuming: the next message is a snapshot."""
    t = keyed(server, "t")
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    got: list[Update] = []
    live = subscribe("t", reconnect_delay=0.01)
    live.on_update(got.append)
    assert live.wait_for() and live.connected
    real = LiveState.apply
    failures: list[int] = []

    def once(self, meta, added, modified):
        if meta.sequence == 2 and not failures:
            failures.append(meta.sequence)
            self.keys.clear()  # half-applied, then the failure
            raise ProtocolError("protocol: injected")
        return real(self, meta, added, modified)

    monkeypatch.setattr(LiveState, "apply", once)
    t.upsert(kv([3], [3.0]))
    graph.run_cycle()
    assert live.wait_for(sequence=2)
    assert failures == [2] and live.reconnects == 1
    assert got[-1].is_snapshot and got[-1].resumed == "none"
    assert live.to_arrow().equals(t.to_arrow())
    with pytest.raises(ProtocolError, match="announced"):  # the state checks what it is sent
        st = LiveState(KV)
        meta = pb.UpdateMetadata(is_snapshot=True, added_data_rows=BitMap64([1]).serialize())
        st.apply(meta, KV.empty_table(), KV.empty_table())


def test_df_waits_for_the_first_snapshot(server, graph, subscribe, monkeypatch):
    t = keyed(server, "t")
    t.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    gate = Gate(server.location)
    gate.open.clear()
    live = subscribe("t", connect=gate)
    monkeypatch.setattr(LiveTable, "FIRST_SNAPSHOT_TIMEOUT", 0.1)
    with pytest.raises(TimeoutError, match="no snapshot of 't'"):
        live.to_arrow()
    assert live.size == 0 and live.columns == [] and not live.connected
    monkeypatch.setattr(LiveTable, "FIRST_SNAPSHOT_TIMEOUT", 30.0)
    threading.Timer(0.05, gate.open.set).start()
    same(live.df, frame([(1, "s1", 1.0), (2, "s2", 2.0)]))  # waited for it


# ------------------------------------------------------------------ iterators
def test_blocking_and_async_iterators_see_every_update_in_order(server, graph, subscribe):
    t = keyed(server, "t")
    applied: list[Update] = []
    live = subscribe("t", on_update=applied.append)
    assert live.wait_for()
    blocking = live.updates(timeout=10)

    async def consume() -> list[Update]:
        out: list[Update] = []
        aiter = live.__aiter__()  # registered now: every later update is delivered
        for i in range(30):
            t.upsert(kv([i % 7], [float(i)]))
            graph.run_cycle()
        async for u in aiter:
            out.append(u)
            if u.sequence == 30:
                return out
        raise AssertionError("the async iteration ended")

    got = asyncio.run(consume())
    assert _settles(lambda: applied[-1].sequence == 30)  # callbacks run after the queues
    assert got == applied[1:]  # the same objects, in order (the server may coalesce cycles)
    assert [u.sequence for u in got] == sorted({u.sequence for u in got})
    assert [next(blocking) for _ in got] == got
    with pytest.raises(TimeoutError):
        next(live.updates(timeout=0.05))

    async def until_closed() -> list[int]:
        aiter = live.__aiter__()
        t.upsert(kv([100], [1.0]))
        graph.run_cycle()
        assert live.wait_for(sequence=31)
        threading.Timer(0.05, live.close).start()  # from another thread, while waiting
        return [u.sequence async for u in aiter]  # ends (no error) once closed

    assert asyncio.run(until_closed()) == [31]
    assert [u.sequence for u in live] == []  # closed: a new iteration ends at once


def test_iterator_that_falls_behind_gets_a_catch_up_snapshot(server, graph, subscribe):
    t = keyed(server, "t")
    live = subscribe("t")
    assert live.wait_for()
    slow = live.updates(timeout=10, maxsize=3)
    for i in range(10):  # ten messages (waiting, else the server may compose cycles)
        t.upsert(kv([i], [float(i)]))
        graph.run_cycle()
        assert live.wait_for(sequence=i + 1)
    assert (slow.offered, slow.delivered) == (10, 0)
    u = next(slow)
    assert u.is_snapshot and u.skipped == 10 and u.sequence == 10
    assert slow.delivered == 10  # the catch-up stands for all ten
    same(u.added, live.df)
    for sequence, k in ((11, 99), (12, 98)):
        t.upsert(kv([k], [9.9]))
        graph.run_cycle()
        assert live.wait_for(sequence=sequence)
    u = next(slow)
    assert not u.is_snapshot and u.sequence == 11 and u.added.k.tolist() == [99]
    assert (slow.offered, slow.delivered) == (12, 11)  # one each, in order
    first = live.updates(snapshot=True, timeout=10)
    assert next(first).added.shape == (12, 3) and (first.offered, first.delivered) == (0, 0)


def test_failing_callback_is_logged_and_the_subscription_goes_on(server, graph, subscribe, caplog):
    t = keyed(server, "t")
    seen: list[int] = []

    def bad(u: Update) -> None:
        seen.append(u.sequence)
        raise RuntimeError("boom")

    live = subscribe("t", on_update=bad)
    with caplog.at_level(logging.ERROR, logger="clients.subscription"):
        for i in range(3):
            t.upsert(kv([i], [1.0]))
            graph.run_cycle()
        assert live.wait_for(sequence=3)
        live.close()
    assert seen[-1] == 3 and "callback" in caplog.text and live.error is None


# ------------------------------------------------------------------ lifecycle and errors
def _readers() -> list[threading.Thread]:
    return [th for th in threading.enumerate() if th.name.startswith("ticktable-live-")]


def _busy_threads() -> int:
    """Threads doing something. An idle worker of a thread pool is left out: the grpcio
    server keeps its workers for later calls, each waiting for work in
    ``concurrent.futures.thread._worker``; a worker still inside a call is counted."""
    frames = sys._current_frames()
    pool = os.path.join("concurrent", "futures", "thread.py")

    def idle(th: threading.Thread) -> bool:
        f = frames.get(th.ident) if th.ident is not None else None
        return f is not None and f.f_code.co_name == "_worker" and f.f_code.co_filename.endswith(pool)

    return sum(not idle(th) for th in threading.enumerate())


def _settles(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Wait for a condition another thread brings about (server-side stream threads end
    asynchronously after a client cancels)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


def test_close_stops_the_reader_threads_and_ends_iterators(server, graph):
    t = keyed(server, "t")
    t.upsert(kv([1], [1.0]))
    graph.run_cycle()
    baseline = _busy_threads()
    connect = Endpoint(server.location).connect
    many = [LiveTable(connect, "t") for _ in range(3)]
    assert all(x.wait_for() for x in many) and len(_readers()) == 3
    it = many[0].updates()
    ended: list[str] = []
    waiter = threading.Thread(target=lambda: ended.extend(["item" for _ in it]))
    waiter.start()
    for x in many:
        x.close()
    waiter.join(10)
    assert ended == [] and not waiter.is_alive() and _readers() == []
    assert all(x.closed and x.error is None for x in many)
    with LiveTable(connect, "t") as live:
        assert live.wait_for() and live.size == 1 and len(_readers()) == 1
    assert live.closed and _readers() == []
    assert not live.wait_for(sequence=99, timeout=1)
    assert _settles(lambda: server.subscriptions == [])
    assert _settles(lambda: _busy_threads() == baseline)  # the server's calls ended too


def test_dropped_table_is_a_permanent_error(server, graph, subscribe):
    t = keyed(server, "t")
    t.upsert(kv([1], [1.0]))
    graph.run_cycle()
    live = subscribe("t", reconnect_delay=0.01)
    assert live.wait_for()
    it = live.updates(timeout=10)
    server.registry.drop("t")
    with pytest.raises(KeyError, match="table 't' was dropped"):
        next(it)
    assert isinstance(live.error, KeyError) and live.closed and live.reconnects == 0
    with pytest.raises(KeyError):
        live.wait_for(sequence=5)
    assert "failed" in repr(live)
    missing = subscribe("nope")
    with pytest.raises(KeyError, match="no table 'nope'"):
        missing.wait_for()


# ------------------------------------------------------------------ the key index
@pytest.mark.parametrize("slack", [0, 65536])
def test_key_index_against_a_dict(monkeypatch, slack):
    """Seeded random puts/removes (growth, tombstones, the switch to the hash map) against a
    plain dict; key indexes built empty, over a dense snapshot base and a sparse one."""
    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", slack)
    rng = np.random.default_rng(3)
    for step in (0, 2, 7):
        base = np.arange(0, 200 * step, step, dtype=np.int64) if step else np.empty(0, np.int64)
        index = _index_of(base)
        want = {int(k): i for i, k in enumerate(base)}
        for _ in range(300):
            keys = np.unique(rng.integers(0, 3000, int(rng.integers(0, 60)))).astype(np.int64)
            if rng.random() < 0.5:
                vals = rng.integers(0, 10**6, keys.size).astype(np.int64)
                index.put(keys, vals)
                want.update(zip(keys.tolist(), vals.tolist(), strict=True))
            else:
                got = index.remove(keys)
                assert got.tolist() == [want.pop(k, -1) for k in keys.tolist()]
            k, s = index.items()
            assert k.tolist() == sorted(want) and s.tolist() == [want[x] for x in sorted(want)]
            assert len(index) == len(want)
            probe = rng.integers(-5, 3100, 50).astype(np.int64)
            assert index.lookup(probe).tolist() == [want.get(x, -1) for x in probe.tolist()]


def test_value_log_take_matches_a_plain_gather(monkeypatch):
    """Runs of slots (sliced), many scattered ones (Arrow's take) and a few (per chunk), over
    chunks of mixed sizes, against one concatenated array's take."""
    monkeypatch.setattr(_Store, "_SMALL", 1)  # keep every chunk apart
    rng = np.random.default_rng(5)
    store = _Store(KV)
    for size in (50, 3, 1, 17, 200, 2, 64):
        first = store.end
        keys = list(range(first, first + size))
        store.append(kv(keys, [float(k) for k in keys], [None if k % 5 == 0 else f"x{k}"
                                                         for k in keys]), np.array(keys))
    assert len(store.frozen().chunks[0]) == 7
    whole = store.frozen().take(np.arange(store.end)).combine_chunks()
    assert whole.column("k").to_pylist() == list(range(store.end))
    n = store.end
    cases = [np.arange(n), np.arange(40, 90), rng.permutation(n), rng.choice(n, 5),
             np.concatenate([np.arange(10, 60), np.arange(0, 5), np.arange(200, 330)]),
             np.array([n - 1]), np.empty(0, np.int64)]
    for slots in cases:
        slots = slots.astype(np.int64)
        got = store.frozen().take(slots)
        assert got.equals(whole.take(pa.array(slots, pa.int64()))), slots[:10]
