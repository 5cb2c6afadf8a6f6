"""Ingestion at the Ingestor level: every put mode, staged writes, commit/abort, limits.

A real UpdateGraph (validate=True) and TableRegistry; the tests drive ``run_cycle``.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from engine.errors import InputError, InvalidKeyError, Overloaded, SchemaError, TableNotFound
from engine.graph import UpdateGraph
from flight.ingest import Ingestor
from flight.pb import flight_pb2 as pb
from flight.registry import TableRegistry

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])
COMPOSITE = pa.schema([("sym", pa.string()), ("n", pa.int32()), ("v", pa.float64())])

APPEND, UPSERT, DELETE, DIFF = (pb.PUT_MODE_APPEND, pb.PUT_MODE_UPSERT, pb.PUT_MODE_DELETE,
                                pb.PUT_MODE_DIFF)


class Env:
    def __init__(self, **kw):
        self.graph = UpdateGraph(validate=True)
        self.registry = TableRegistry(self.graph)
        self.ing = Ingestor(self.registry, **kw)
        self.updates: dict[str, list[tuple[int, object]]] = {}

    def create(self, name, kind="keyed", schema=KV, keys=("k",), capacity=0):
        e = self.registry.create_source(name, schema, kind, keys=list(keys) if kind == "keyed" else None,
                                        capacity=capacity)
        seen = self.updates.setdefault(name, [])
        e.table.listen(lambda u, t: seen.append((t.graph.step, u)))
        return e.table

    def put(self, name, mode, *batches, write_id="", partition=0, attempt=0):
        acks = []
        req = pb.PutRequest(mode=mode, write_id=write_id, partition=partition, attempt=attempt)
        total = self.ing.put(name, req, [_batch(b) for b in batches], acks.append)
        assert total == sum(a.rows for a in acks)
        return acks

    def commit(self, write_id, slots=(), all_slots=False, **kw):
        req = pb.CommitRequest(write_id=write_id, all_slots=all_slots,
                               slots=[pb.StageSlot(partition=p, attempt=a) for p, a in slots], **kw)
        return self.ing.commit(req)

    def rows(self, name):
        t = self.registry.get(name).table
        return t.to_arrow().to_pylist()

    def keyed(self, name, key="k"):
        return {r[key]: r for r in self.rows(name)}


def _batch(b):
    if isinstance(b, pa.RecordBatch):
        return b
    if isinstance(b, pa.Table):
        return b.combine_chunks().to_batches()[0] if b.num_rows else pa.RecordBatch.from_pylist([], b.schema)
    return pa.RecordBatch.from_pydict(b)


def kv(k, s, v, **extra):
    cols = {"k": pa.array(k, pa.int64()), "s": pa.array(s, pa.string()), "v": pa.array(v, pa.float64())}
    for name, values in extra.items():
        cols[name] = pa.array(values, pa.bool_() if name == "__delete" else pa.int64())
    return pa.record_batch(cols)


def row(k, s, v):
    return {"k": k, "s": s, "v": v}


@pytest.fixture
def env():
    e = Env()
    yield e
    e.ing.stop()


# --- append and ring ------------------------------------------------------------------------
def test_append_acks_each_batch_and_rows_appear_next_cycle(env):
    env.create("t", "append")
    acks = env.put("t", APPEND, kv([1, 2], ["a", None], [0.5, None]), kv([3], ["c"], [3.0]),
                   kv([], [], []))
    assert [(a.batch_index, a.rows, a.total_rows, a.staged) for a in acks] == [
        (0, 2, 2, False), (1, 1, 3, False), (2, 0, 3, False)]
    assert env.rows("t") == []
    step = env.graph.run_cycle()
    assert env.rows("t") == [row(1, "a", 0.5), row(2, None, None), row(3, "c", 3.0)]
    assert [s for s, _ in env.updates["t"]] == [step]


def test_append_accepts_reordered_and_safely_castable_columns(env):
    env.create("t", "append")
    env.put("t", APPEND, {"v": pa.array([1.5]), "k": pa.array([7], pa.int32()), "s": ["x"]})
    env.graph.run_cycle()
    assert env.rows("t") == [row(7, "x", 1.5)]


def test_ring_keeps_newest(env):
    env.create("r", "ring", capacity=3)
    env.put("r", APPEND, kv([1, 2], ["a", "b"], [1, 2]), kv([3, 4], ["c", "d"], [3, 4]))
    env.graph.run_cycle()
    assert [r["k"] for r in env.rows("r")] == [2, 3, 4]


def test_mode_must_fit_the_table(env):
    env.create("kt")
    env.create("at", "append")
    with pytest.raises(InputError, match=r"keyed by \['k'\].*PUT_MODE_UPSERT"):
        env.put("kt", APPEND, kv([1], ["a"], [1]))
    for mode in (UPSERT, DELETE, DIFF):
        with pytest.raises(InputError, match="write it with PUT_MODE_APPEND"):
            env.put("at", mode, kv([1], ["a"], [1]))
    with pytest.raises(TableNotFound, match="no table 'nope'"):
        env.put("nope", APPEND, kv([1], ["a"], [1]))
    derived = env.registry.get("at").table.where(pa.compute.field("k") > 0)
    env.registry.add("d", derived, "derived", parents=["at"])
    with pytest.raises(InputError, match="not a source table"):
        env.put("d", APPEND, kv([1], ["a"], [1]))


# --- schema errors --------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"k": [1], "s": ["a"]}, r"table 't': missing column\(s\) \['v'\]"),
    ({"k": [1], "s": ["a"], "v": [1.0], "w": [2]}, r"table 't': unknown column\(s\) \['w'\]"),
    ({"k": ["x"], "s": ["a"], "v": [1.0]}, r"table 't': column 'k' has type string, expected int64"),
    ({"k": [1], "s": ["a"], "v": [1.0], "__diff": [1]}, r"unknown column\(s\) \['__diff'\]"),
])
def test_schema_errors_name_table_and_columns_and_apply_nothing_of_the_batch(env, bad, match):
    env.create("t", "append")
    acks = []
    batches = [kv([1], ["ok"], [1.0]), pa.RecordBatch.from_pydict(bad), kv([2], ["never"], [2.0])]
    with pytest.raises(SchemaError, match=match):
        env.ing.put("t", pb.PutRequest(mode=APPEND), iter(batches), acks.append)
    assert len(acks) == 1  # the good batch before the bad one was applied and acknowledged
    env.graph.run_cycle()
    assert env.rows("t") == [row(1, "ok", 1.0)]


def test_keyed_schema_errors(env):
    env.create("t")
    with pytest.raises(SchemaError, match=r"missing column\(s\) \['v'\]"):
        env.put("t", UPSERT, {"k": [1], "s": ["a"]})
    with pytest.raises(SchemaError, match=r"column '__delete' has type int64, expected bool"):
        env.put("t", UPSERT, {"k": [1], "s": ["a"], "v": [1.0], "__delete": [1]})
    with pytest.raises(SchemaError, match=r"unknown column\(s\) \['s'\]"):
        env.put("t", DELETE, {"k": [1], "s": ["a"]})
    with pytest.raises(SchemaError, match=r"needs an int64 weight column '__diff'"):
        env.put("t", DIFF, kv([1], ["a"], [1.0]))
    with pytest.raises(SchemaError, match=r"column '__diff' has type double"):
        env.put("t", DIFF, {"k": [1], "s": ["a"], "v": [1.0], "__diff": [1.0]})
    with pytest.raises(InvalidKeyError, match=r"key column 'k' has 1 null"):
        env.put("t", UPSERT, {"k": pa.array([None, 2], pa.int64()), "s": ["a", "b"], "v": [1.0, 2.0]})
    env.graph.run_cycle()
    assert env.rows("t") == []


# --- upsert and delete ----------------------------------------------------------------------
def test_upsert_and_delete_marker_last_row_per_key_decides(env):
    t = env.create("t")
    env.put("t", UPSERT, kv([1, 2, 3, 4], ["a", "b", "c", "d"], [1, 2, 3, 4]))
    env.graph.run_cycle()
    env.put("t", UPSERT, kv(
        [1, 1, 2, 2, 5, 5, 4, 6, 6],
        ["x", "-", "-", "y", "e1", "e2", "-", "f", "-"],
        [10, 0, 0, 20, 5, 50, 0, 6, 0],
        __delete=[False, True, True, None, False, False, True, False, True]))
    step = env.graph.run_cycle()
    # 1: upsert then delete -> deleted; 2: delete then upsert -> y; 5: last upsert;
    # 4: deleted; 6: inserted then deleted -> absent; 3 untouched
    assert env.keyed("t") == {2: row(2, "y", 20.0), 3: row(3, "c", 3.0), 5: row(5, "e2", 50.0)}
    (s, u), = env.updates["t"][1:]
    assert s == step and t.last_step == step
    assert len(u.removed) == 2 and len(u.modified) == 1 and len(u.added) == 1


def test_upsert_without_marker_is_last_wins_across_batches(env):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2, 1], ["a", "b", "c"], [1, 2, 3]), kv([2], ["z"], [9]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "c", 3.0), 2: row(2, "z", 9.0)}


def test_upsert_delete_marker_with_composite_string_keys(env):
    env.create("c", schema=COMPOSITE, keys=("sym", "n"))
    b = {"sym": ["a", "a", "b", "a"], "n": pa.array([1, 2, 1, 1], pa.int32()),
         "v": [1.0, 2.0, 3.0, 4.0], "__delete": [False, False, False, True]}
    env.put("c", UPSERT, b)
    env.graph.run_cycle()
    assert sorted((r["sym"], r["n"], r["v"]) for r in env.rows("c")) == [("a", 2, 2.0), ("b", 1, 3.0)]


def test_delete_mode_takes_key_columns_and_ignores_absent_keys(env):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2, 3], ["a", "b", "c"], [1, 2, 3]))
    env.graph.run_cycle()
    env.put("t", DELETE, {"k": [2, 9]}, {"k": pa.array([3], pa.int32())})
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "a", 1.0)}


# --- diff -----------------------------------------------------------------------------------
def diff(k, s, v, d, time_=None, ktype=None):
    b = {"k": pa.array(k, ktype or pa.int64()), "s": pa.array(s, pa.string()), "v": pa.array(v, pa.float64()),
         "__diff": pa.array(d, pa.int64())}
    if time_ is not None:
        b["__time"] = pa.array(time_, pa.int64())
    return pa.record_batch(b)


def test_diff_applies_inserts_updates_deletes_and_noops(env):
    t = env.create("t")
    env.put("t", DIFF, diff([1, 2, 3], ["a", "b", "c"], [1, 2, 3], [1, 1, 1]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "a", 1.0), 2: row(2, "b", 2.0), 3: row(3, "c", 3.0)}
    # update 1, delete 2, no-op on 3 (+1/-1 of one row), insert 4 via +1 +1 -1, __time ignored
    env.put("t", DIFF, diff(
        [1, 1, 2, 3, 3, 4, 4, 4],
        ["a", "A", "b", "c", "c", "d", "d", "d"],
        [1, 10, 2, 3, 3, 4, 4, 4],
        [-1, 1, -1, 1, -1, 1, 1, -1],
        time_=[5, 5, 5, 5, 5, 6, 6, 7]))
    step = env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "A", 10.0), 3: row(3, "c", 3.0), 4: row(4, "d", 4.0)}
    (s, u), = env.updates["t"][1:]
    assert s == step and (len(u.added), len(u.removed), len(u.modified)) == (1, 1, 1)
    assert u.modified_columns == frozenset({"s", "v"})
    assert t.pending_rows == 0


@pytest.mark.parametrize("batch, match", [
    (diff([9], ["x"], [9], [-1]), r"diff row .*'k': 9.* retracts a row key \{'k': 9\} does not hold \(it holds None\)"),
    (diff([1, 1], ["zz", "n"], [1, 5], [-1, 1]), r"retracts a row key \{'k': 1\} does not hold \(it holds \{'k': 1, 's': 'a'"),
    (diff([1], ["n"], [5], [1]), r"adds a second row for key \{'k': 1\}.*retract that row"),
    (diff([7, 7], ["p", "q"], [1, 2], [1, 1]), r"key \{'k': 7\} gets 2 \+1 rows"),
    (diff([1, 1], ["a", "a"], [1, 1], [-1, -1]), r"weights must sum to \+1 or -1 per row, got -2"),
    (diff([5], ["e"], [5], [2]), r"got 2 for"),
])
def test_invalid_diff_batches_apply_nothing(env, batch, match):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2], ["a", "b"], [1, 2]))
    env.graph.run_cycle()
    before = env.keyed("t")
    # valid changes of other keys in the same batch are not applied either
    bad = pa.concat_tables([pa.Table.from_batches([batch]), pa.Table.from_batches(
        [diff([2, 2, 3], ["b", "B", "c"], [2, 2, 3], [-1, 1, 1])])]).combine_chunks().to_batches()[0]
    with pytest.raises(InputError, match=match) as exc:
        env.put("t", DIFF, bad)
    assert "nothing of the batch was applied" in str(exc.value)
    assert env.registry.get("t").table.pending_rows == 0
    env.graph.run_cycle()
    assert env.keyed("t") == before


def test_diff_batches_before_a_cycle_compose_with_pending_writes(env):
    env.create("t")
    env.put("t", UPSERT, kv([1], ["a"], [1]))             # pending, not yet applied
    env.put("t", DIFF, diff([1, 1], ["a", "b"], [1, 2], [-1, 1]))   # sees the pending upsert
    env.put("t", DIFF, diff([1, 1, 2], ["b", "c", "x"], [2, 3, 0], [-1, 1, 1]))
    env.put("t", DIFF, diff([2], ["x"], [0], [-1]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "c", 3.0)}


# --- staged writes --------------------------------------------------------------------------
def test_staged_writes_are_invisible_until_commit_which_publishes_chosen_slots_in_one_cycle(env):
    a = env.create("a", "append")
    k = env.create("k")
    env.put("k", UPSERT, kv([1], ["old"], [1]))
    env.graph.run_cycle()
    acks = env.put("a", APPEND, kv([1, 2], ["p0", "p0"], [0, 0]), write_id="w", partition=0, attempt=0)
    assert [(x.rows, x.total_rows, x.staged) for x in acks] == [(2, 2, True)]
    env.put("a", APPEND, kv([3], ["failed"], [0]), write_id="w", partition=1, attempt=0)
    env.put("a", APPEND, kv([4], ["p1"], [1]), write_id="w", partition=1, attempt=1)
    env.put("k", UPSERT, kv([1, 2], ["new", "x"], [2, 2], __delete=[False, False]), write_id="w",
            partition=2)
    env.put("k", DELETE, {"k": [2]}, write_id="w", partition=2)
    assert env.ing.open_stages == 4 and env.ing.staged_bytes > 0
    env.graph.run_cycle()
    assert env.rows("a") == [] and env.keyed("k") == {1: row(1, "old", 1.0)}

    res = env.commit("w", slots=[(0, 0), (1, 1), (2, 0)])
    assert (res.rows, res.applied, res.step) == (6, True, env.graph.step + 1)
    assert env.ing.open_stages == 0 and env.ing.staged_bytes == 0
    step = env.graph.run_cycle()
    assert step == res.step
    assert env.rows("a") == [row(1, "p0", 0.0), row(2, "p0", 0.0), row(4, "p1", 1.0)]
    assert env.keyed("k") == {1: row(1, "new", 2.0)}
    assert env.updates["a"][-1][0] == step and env.updates["k"][-1][0] == step
    assert a.last_step == k.last_step == step
    assert len(env.updates["a"]) == 1  # one update for the whole commit


def test_commit_of_an_unwritten_slot_names_it_and_keeps_the_write(env):
    env.create("a", "append")
    env.put("a", APPEND, kv([1], ["x"], [1]), write_id="w", partition=0)
    with pytest.raises(InputError, match=r"write 'w' has no slot\(s\) \(partition 5, attempt 0\) "
                                         r"\(has: \(partition 0, attempt 0\)\)"):
        env.commit("w", slots=[(0, 0), (5, 0)])
    assert env.ing.open_stages == 1
    assert env.commit("w", all_slots=True).rows == 1
    env.graph.run_cycle()
    assert len(env.rows("a")) == 1


def test_unknown_write_commits_zero_rows_and_retried_commit_is_not_reapplied(env):
    env.create("a", "append")
    assert (env.commit("empty").rows, env.commit("empty2", all_slots=True).applied) == (0, True)
    with pytest.raises(InputError, match=r"no slot\(s\) \(partition 3, attempt 1\)"):
        env.commit("ghost", slots=[(3, 1)])
    env.put("a", APPEND, kv([1], ["x"], [1]), write_id="w")
    first = env.commit("w", all_slots=True)
    again = env.commit("w", all_slots=True)
    assert (first.applied, again.applied, again.rows) == (True, False, 1)
    with pytest.raises(InputError, match="already committed"):
        env.put("a", APPEND, kv([2], ["y"], [2]), write_id="w")
    env.graph.run_cycle()
    assert len(env.rows("a")) == 1


def test_abort_drops_every_slot(env):
    env.create("a", "append")
    for p in range(3):
        env.put("a", APPEND, kv([p], ["x"], [p]), write_id="w", partition=p)
    assert env.ing.abort(pb.AbortRequest(write_id="w")) == 3
    assert env.ing.abort(pb.AbortRequest(write_id="w")) == 0
    assert env.ing.open_stages == 0 and env.ing.staged_bytes == 0
    with pytest.raises(InputError, match="write 'w' was aborted"):
        env.commit("w", all_slots=True)
    # a task still running when its job was aborted cannot stage a slot that would linger
    with pytest.raises(InputError, match="write 'w' was aborted"):
        env.put("a", APPEND, kv([9], ["late"], [9]), write_id="w", partition=7)
    assert env.ing.open_stages == 0
    env.graph.run_cycle()
    assert env.rows("a") == []


def test_stream_batch_is_applied_once(env):
    env.create("a", "append")
    env.put("a", APPEND, kv([1], ["b0"], [0]), write_id="w0")
    r0 = env.commit("w0", all_slots=True, stream_id="q", batch_id=0, has_batch=True)
    env.put("a", APPEND, kv([1], ["b0-replay"], [0]), write_id="w0b")
    r0b = env.commit("w0b", all_slots=True, stream_id="q", batch_id=0, has_batch=True)
    env.put("a", APPEND, kv([2], ["b1"], [1]), write_id="w1")
    r1 = env.commit("w1", all_slots=True, stream_id="q", batch_id=1, has_batch=True)
    env.put("a", APPEND, kv([3], ["other"], [1]), write_id="w2")
    r2 = env.commit("w2", all_slots=True, stream_id="other", batch_id=0, has_batch=True)
    assert [(r.applied, r.rows) for r in (r0, r0b, r1, r2)] == [(True, 1), (False, 0), (True, 1),
                                                                 (True, 1)]
    assert env.ing.open_stages == 0
    env.graph.run_cycle()
    assert [r["s"] for r in env.rows("a")] == ["b0", "b1", "other"]


def test_expire_drops_abandoned_writes_only(env):
    env.create("a", "append")
    env.put("a", APPEND, kv([1], ["x"], [1]), write_id="old", partition=0)
    env.put("a", APPEND, kv([1], ["x"], [1]), write_id="old", partition=1)
    now = time.monotonic()
    assert env.ing.expire(now) == 0
    assert env.ing.expire(now + env.ing.stage_ttl + 1) == 2
    assert env.ing.open_stages == 0 and env.ing.staged_bytes == 0


def test_janitor_expires_in_the_background():
    e = Env(stage_ttl=0.0)
    e.create("a", "append")
    e.put("a", APPEND, kv([1], ["x"], [1]), write_id="w")
    ran = threading.Event()
    expire = e.ing.expire

    def spy(now=None):
        n = expire(now)
        ran.set()
        return n

    e.ing.expire = spy
    e.ing.start_janitor(0.01)
    try:
        assert ran.wait(5)
        assert e.ing.open_stages == 0
    finally:
        e.ing.stop()


def test_max_staged_bytes_refuses_the_batch_that_would_pass_it():
    one = kv(list(range(100)), ["x"] * 100, [1.0] * 100)
    size = pa.Table.from_batches([one]).nbytes
    e = Env(max_staged_bytes=int(size * 2.5))
    e.create("a", "append")
    e.put("a", APPEND, one, one, write_id="w")
    held = e.ing.staged_bytes
    acks = []
    with pytest.raises(Overloaded, match=r"staged writes hold \d+ bytes.*commit or abort"):
        e.ing.put("a", pb.PutRequest(mode=APPEND, write_id="w"), [one], acks.append)
    assert acks == [] and e.ing.staged_bytes == held
    assert e.commit("w", all_slots=True).rows == 200
    e.graph.run_cycle()
    assert e.registry.get("a").table.size == 200


def test_staged_diff_is_checked_at_commit_and_a_bad_commit_publishes_nothing(env):
    env.create("k")
    env.create("a", "append")
    env.put("k", UPSERT, kv([1, 2], ["a", "b"], [1, 2]))
    env.graph.run_cycle()
    # two partitions of one diff write are summed: no order between partitions
    env.put("k", DIFF, diff([1], ["A"], [10], [1]), write_id="w", partition=0)
    env.put("k", DIFF, diff([1, 3], ["a", "c"], [1, 3], [-1, 1]), write_id="w", partition=1)
    env.put("a", APPEND, kv([1], ["x"], [1]), write_id="w", partition=2)
    env.put("k", DIFF, diff([2], ["wrong"], [0], [-1]), write_id="bad", partition=0)
    env.put("a", APPEND, kv([2], ["y"], [2]), write_id="bad", partition=1)
    with pytest.raises(InputError, match=r"retracts a row key \{'k': 2\} does not hold"):
        env.commit("bad", all_slots=True)
    assert env.ing.open_stages == 5  # the bad write stays open until aborted or expired
    assert env.commit("w", all_slots=True).rows == 4
    env.graph.run_cycle()
    assert env.keyed("k") == {1: row(1, "A", 10.0), 2: row(2, "b", 2.0), 3: row(3, "c", 3.0)}
    assert env.rows("a") == [row(1, "x", 1.0)]


def test_commit_may_not_mix_diff_with_other_modes_for_one_table(env):
    env.create("k")
    env.put("k", DIFF, diff([1], ["a"], [1], [1]), write_id="w", partition=0)
    env.put("k", UPSERT, kv([2], ["b"], [2]), write_id="w", partition=1)
    with pytest.raises(InputError, match="cannot mix diff writes with other modes"):
        env.commit("w", all_slots=True)


# --- threads --------------------------------------------------------------------------------
def test_concurrent_puts_into_one_staged_write_commit_every_row_once(env):
    env.create("a", "append")
    n_threads, n_batches, rows = 8, 25, 500
    errors = []

    def writer(i):
        try:
            for b in range(n_batches):
                base = (i * n_batches + b) * rows
                env.put("a", APPEND, kv(list(range(base, base + rows)), ["t"] * rows, [i] * rows),
                        write_id="w", partition=i % 4, attempt=0)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for _ in range(5):
        env.graph.run_cycle()  # cycles while writing: nothing staged may leak
    for t in threads:
        t.join()
    assert not errors
    assert env.rows("a") == []
    assert env.commit("w", all_slots=True).rows == n_threads * n_batches * rows
    env.graph.run_cycle()
    keys = np.sort(env.registry.get("a").table.to_arrow().column("k").to_numpy())
    assert np.array_equal(keys, np.arange(n_threads * n_batches * rows))


def test_periodic_graph_commit_waits_for_its_cycle_and_concurrent_diffs_compose():
    e = Env()
    e.create("k")
    e.graph.start(0.01)
    try:
        # 4 threads each own 25 keys and walk them through insert/update/delete via diffs
        errors = []

        def walker(i):
            try:
                for key in range(i * 25, i * 25 + 25):
                    e.put("k", DIFF, diff([key], ["v0"], [0], [1]))
                    e.put("k", DIFF, diff([key, key], ["v0", "v1"], [0, 1], [-1, 1]))
                    if key % 2:
                        e.put("k", DIFF, diff([key], ["v1"], [1], [-1]))
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=walker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        e.put("k", UPSERT, kv([1000], ["staged"], [1]), write_id="w")
        res = e.commit("w", all_slots=True)
        assert res.applied and e.graph.step >= res.step
        assert 1000 in e.keyed("k")  # visible when commit returns
    finally:
        e.graph.stop()
        e.ing.stop()
    got = e.keyed("k")
    assert {k for k in got if k < 1000} == {k for k in range(100) if k % 2 == 0}
    assert all(got[k]["s"] == "v1" for k in got if k < 1000)


# --- randomized model check -----------------------------------------------------------------
def _rand_value(rng):
    return (rng.choice(["a", "b", "c", None]), rng.choice([1.0, 2.0, 3.0, None]))


def _rand_diff(rng, model, keys):
    """A valid diff batch (rows as (k, s, v, d)) for the model state, shuffled, with noise."""
    out = []
    for k in rng.sample(keys, rng.randint(1, 6)):
        cur = model.get(k)
        new = _rand_value(rng)
        r = rng.random()
        if cur is not None and r < 0.4:          # update (maybe to the same value: a no-op)
            out += [(k, *cur, -1), (k, *new, 1)]
        elif cur is not None and r < 0.7:        # delete
            out.append((k, *cur, -1))
        elif cur is None:                        # insert
            out.append((k, *new, 1))
        if rng.random() < 0.2:                   # noise that sums to zero
            noise = _rand_value(rng)
            out += [(k, *noise, 1), (k, *noise, -1)]
    rng.shuffle(out)
    return out


def _apply_diff(model, rows):
    net = collections.Counter()
    for k, s, v, d in rows:
        net[(k, s, v)] += d
    for (k, s, v), w in net.items():
        if w < 0:
            assert model.pop(k) == (s, v)
    for (k, s, v), w in net.items():
        if w > 0:
            model[k] = (s, v)


def _invalid_diff(rng, model, keys):
    k = rng.choice(keys)
    cur = model.get(k)
    if cur is None:
        return [(k, "ghost", 0.0, -1)]
    return [(k, "second", 0.0, 1)]


@pytest.mark.parametrize("ktype", [pa.int64(), pa.string()])
def test_randomized_mixed_writes_match_a_dict_model(ktype):
    rng = random.Random(20240611)
    e = Env()
    schema = pa.schema([("k", ktype), ("s", pa.string()), ("v", pa.float64())])
    e.create("k", schema=schema)
    model: dict[object, tuple] = {}
    keys = list(range(40)) if ktype == pa.int64() else [f"key{i}" for i in range(40)]
    n_invalid = n_staged = 0
    for rnd in range(400):
        staged = rng.random() < 0.25
        wid = f"w{rnd}" if staged else ""
        n_batches = rng.randint(1, 3)
        pending = dict(model)  # model of state + what this round stages
        for b in range(n_batches):
            mode = rng.choice([UPSERT, UPSERT, DELETE, DIFF])
            if staged and mode == DIFF and b > 0:
                mode = UPSERT  # one diff batch per staged commit (partitions are summed)
            if mode == UPSERT:
                n = rng.randint(0, 8)
                ks = [rng.choice(keys) for _ in range(n)]
                vals = [_rand_value(rng) for _ in range(n)]
                dels = [rng.random() < 0.3 for _ in range(n)]
                cols = {"k": pa.array(ks, ktype), "s": pa.array([x[0] for x in vals], pa.string()),
                        "v": pa.array([x[1] for x in vals], pa.float64())}
                if rng.random() < 0.6:
                    cols["__delete"] = pa.array(dels, pa.bool_())
                else:
                    dels = [False] * n
                for k, val, d in zip(ks, vals, dels, strict=True):
                    if d:
                        pending.pop(k, None)
                    else:
                        pending[k] = val
                e.put("k", UPSERT, pa.record_batch(cols), write_id=wid, partition=b)
            elif mode == DELETE:
                ks = [rng.choice(keys) for _ in range(rng.randint(0, 5))]
                for k in ks:
                    pending.pop(k, None)
                e.put("k", DELETE, {"k": pa.array(ks, ktype)}, write_id=wid, partition=b)
            else:
                invalid = not staged and rng.random() < 0.15
                rows = (_invalid_diff if invalid else _rand_diff)(rng, pending, keys)
                batch = diff([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                             [r[3] for r in rows], ktype=ktype)
                if invalid:
                    with pytest.raises(InputError):
                        e.put("k", DIFF, batch)
                    n_invalid += 1
                    continue
                if staged and b == 0 and n_batches > 1:
                    n_batches = 1  # keep the diff alone in its commit
                e.put("k", DIFF, batch, write_id=wid, partition=b)
                _apply_diff(pending, rows)
                if staged:
                    break
        if staged:
            n_staged += 1
            if rng.random() < 0.1:
                e.ing.abort(pb.AbortRequest(write_id=wid))
                pending = model
            else:
                e.commit(wid, all_slots=True)
        model = pending
        if rng.random() < 0.7:
            e.graph.run_cycle()
            got = {r["k"]: (r["s"], r["v"]) for r in e.rows("k")}
            assert got == model, f"round {rnd}: {sorted(set(got.items()) ^ set(model.items()))}"
    e.graph.run_cycle()
    assert {r["k"]: (r["s"], r["v"]) for r in e.rows("k")} == model
    assert n_invalid > 10 and n_staged > 50
