"""TableFeed: the changes a Perspective table keyed by row key applies reach the table's
exact state, every cycle, through adds, modifies, removes and shifts (a sorted table)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from engine.graph import UpdateGraph
from flight.streams.registry import TableRegistry
from flight.web.feed import ROW_KEY, Change, TableFeed, perspective_schema
from flight.web.gateway import encode_change

SCHEMA = pa.schema([("sym", pa.string()), ("px", pa.float64()), ("n", pa.int64())])


class Replica:
    """What Perspective would hold: rows by index (``update`` upserts, ``remove`` drops)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple] = {}
        self.sequence = -1
        self.changes: list[Change] = []
        self.cond = threading.Condition()

    def apply(self, change: Change) -> None:
        with self.cond:
            if change.snapshot:
                self.rows = {}
            assert not set(change.removes.tolist()) & set(
                change.upserts.column(ROW_KEY).to_pylist()), "a key both removed and upserted"
            for k in change.removes.tolist():
                del self.rows[k]  # only keys it holds are removed
            cols = change.upserts.to_pydict()
            for i, k in enumerate(cols[ROW_KEY]):
                self.rows[k] = tuple(cols[c][i] for c in SCHEMA.names)
            self.sequence = change.sequence
            self.changes.append(change)
            self.cond.notify_all()

    def wait(self, sequence: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.sequence >= sequence, 10), (
                f"feed stuck at {self.sequence}, table at {sequence}")


def expected(table) -> dict[int, tuple]:
    data = table.to_arrow().to_pydict()
    keys = table.rowset.keys().tolist()
    return {k: tuple(data[c][i] for c in SCHEMA.names) for i, k in enumerate(keys)}


def test_perspective_schema_puts_the_row_key_first_and_casts_what_perspective_cannot_read():
    s = perspective_schema(pa.schema([("a", pa.uint32()), ("b", pa.dictionary(pa.int8(),
                                                                                pa.string())),
                                      ("c", pa.decimal128(10, 2)), ("d", pa.list_(pa.int8()))]))
    assert s.names == [ROW_KEY, "a", "b", "c", "d"]
    assert s.types == [pa.int64(), pa.int64(), pa.string(), pa.float64(), pa.string()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_slow_consumer_gets_exact_changes_over_a_long_random_run(seed):
    """1,500 cycles in all, validated each cycle: a consumer that is often slow lets more
    than ``max_pending`` updates queue (the cycle composes them), and cycles keep coming
    while the feed composes outside the lock; the replica equals the table throughout."""
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    src = registry.create_source("src", SCHEMA, "keyed", keys=["sym"]).table
    rng = np.random.default_rng(seed)
    slow = np.random.default_rng(seed + 100)
    syms = np.array([f"S{i:03d}" for i in range(400)], dtype=object)
    src.upsert({"sym": syms[:150], "px": rng.random(150), "n": np.arange(150)})
    graph.run_cycle()
    entry = registry.add("board", src.sort("px", descending=True), "derived", parents=["src"])
    replica = Replica()

    def deliver(change: Change) -> None:
        if slow.random() < 0.1:
            time.sleep(0.03)  # meanwhile several cycles queue behind it
        replica.apply(change)

    feed = TableFeed(entry, deliver, max_pending=2).start()
    try:
        for cycle in range(500):
            k = int(rng.integers(1, 40))
            src.upsert({"sym": rng.choice(syms, k, replace=False), "px": rng.random(k),
                        "n": rng.integers(0, 1000, k)})
            if rng.random() < 0.3:
                src.delete({"sym": rng.choice(syms, 8, replace=False)})
            graph.run_cycle()
            if cycle % 50 == 49:
                replica.wait(entry.publisher.sequence)
                with graph.shared_lock():
                    assert replica.rows == expected(entry.table)
        replica.wait(entry.publisher.sequence)
        assert replica.rows == expected(entry.table)
        assert feed.coalesced > 0  # updates did travel composed
    finally:
        feed.close()


@pytest.mark.parametrize("min_interval", [0.0, 0.01], ids=["every", "paced"])
@pytest.mark.parametrize("sorted_", [False, True], ids=["keyed", "sorted"])
def test_replayed_changes_equal_the_table_every_cycle(sorted_, min_interval):
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    src = registry.create_source("src", SCHEMA, "keyed", keys=["sym"]).table
    rng = np.random.default_rng(7)
    syms = np.array([f"S{i:03d}" for i in range(300)], dtype=object)
    src.upsert({"sym": syms[:100], "px": rng.random(100), "n": np.arange(100)})
    graph.run_cycle()
    entry = registry.get("src")
    if sorted_:  # a sort emits shifts: moved rows change row key
        entry = registry.add("board", src.sort("px", descending=True), "derived",
                             parents=["src"])
    replica = Replica()
    feed = TableFeed(entry, replica.apply, max_pending=2, min_interval=min_interval).start()
    try:
        replica.wait(entry.publisher.sequence)
        assert replica.rows == expected(entry.table)
        for _cycle in range(60):
            k = int(rng.integers(1, 30))
            pick = rng.choice(syms, k, replace=False)
            src.upsert({"sym": pick, "px": rng.random(k), "n": rng.integers(0, 1000, k)})
            if rng.random() < 0.3:
                src.delete({"sym": rng.choice(syms, 5, replace=False)})
            graph.run_cycle()
            if rng.random() < 0.8:  # else let updates pile up: composed into one change
                replica.wait(entry.publisher.sequence)
                with graph.shared_lock():
                    assert replica.rows == expected(entry.table)
        replica.wait(entry.publisher.sequence)
        assert replica.rows == expected(entry.table)
        assert replica.changes[0].snapshot and not any(c.snapshot for c in replica.changes[1:])
    finally:
        feed.close()
    assert not entry.publisher.subscribers  # closing unsubscribes


def test_min_interval_paces_changes_and_composes_what_came_between():
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    entry = registry.create_source("t", SCHEMA, "keyed", keys=["sym"])
    src = entry.table
    replica = Replica()
    delivered: list[float] = []
    import time

    def deliver(change: Change) -> None:
        delivered.append(time.monotonic())
        replica.apply(change)

    feed = TableFeed(entry, deliver, min_interval=0.2).start()
    try:
        replica.wait(0)
        for i in range(40):  # 40 cycles well within one interval
            src.upsert({"sym": [f"S{i % 7}"], "px": [float(i)], "n": [i]})
            graph.run_cycle()
        replica.wait(entry.publisher.sequence)
        with graph.shared_lock():
            assert replica.rows == expected(entry.table)
        assert len(replica.changes) - 1 < 40 and feed.coalesced > 0
        gaps = np.diff(delivered)
        assert gaps.min() >= 0.2 - 0.005, gaps  # never two changes within min_interval
    finally:
        feed.close()


def test_a_dropped_table_stops_the_feed_with_its_reason():
    graph = UpdateGraph()
    registry = TableRegistry(graph)
    entry = registry.create_source("t", SCHEMA, "keyed", keys=["sym"])
    got: list[BaseException] = []
    done = threading.Event()
    replica = Replica()
    feed = TableFeed(entry, replica.apply,
                     on_failure=lambda exc: (got.append(exc), done.set())).start()
    replica.wait(0)
    registry.drop("t")
    assert done.wait(10)
    assert "was dropped" in str(got[0])
    feed.close()


def test_an_encoded_change_carries_header_removes_and_arrow_ipc():
    import json
    import struct

    change = Change(False, pa.table({ROW_KEY: pa.array([5], pa.int64()), "x": [1.5]}),
                    np.array([1, 2], np.int64), 7, 3, 2, 10)
    data = encode_change(change)
    (n,) = struct.unpack_from("<I", data)
    header = json.loads(data[4:4 + n])
    assert header == {"snapshot": False, "step": 7, "sequence": 3, "updates": 2, "size": 10,
                      "removes": 2, "rows": 1}
    off = 4 + n + (-(4 + n) % 8)
    assert np.frombuffer(data[off:off + 16], "<f8").tolist() == [1.0, 2.0]
    assert pa.ipc.open_stream(data[off + 16:]).read_all().equals(change.upserts)


def test_a_large_snapshot_travels_as_a_snapshot_and_upserts():
    from flight.web.feed import split_snapshot

    rows = pa.table({ROW_KEY: pa.array(np.arange(10), pa.int64())})
    parts = split_snapshot(Change(True, rows, np.empty(0, np.int64), 3, 1, 0, 10), rows=4)
    assert [(p.snapshot, p.upserts.num_rows) for p in parts] == [(True, 4), (False, 4),
                                                                  (False, 2)]
    assert pa.concat_tables([p.upserts for p in parts]).equals(rows)
    parts = split_snapshot(Change(True, rows, np.empty(0, np.int64), 3, 1, 0, 10), rows=4,
                           first_rows=1)
    assert [p.upserts.num_rows for p in parts] == [1, 4, 4, 1]
    assert pa.concat_tables([p.upserts for p in parts]).equals(rows)
