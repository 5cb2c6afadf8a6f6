"""Source tables: exact updates per cycle, bad input refused with the table unchanged."""

import random
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine import _keyed, columns
from engine._kernels import hashing
from engine.errors import InputError, InvalidKeyError, SchemaError, TableFailed
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.sources import KeyedTable, TimerTable
from tests.oracle import run_oracle
from tests.replay import ReplayChecker

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def capture(t):
    seen = []
    t.listen(lambda u, _: seen.append(u))
    return seen


def test_append_only_adds_ranges_in_arrival_order():
    g = UpdateGraph(validate=True)
    t = g.append_only_table(KV)
    seen = capture(t)
    t.append(pd.DataFrame({"k": [1, 2], "s": ["a", None], "v": [0.5, None]}))
    t.append(pa.table({"v": [3.0], "s": ["c"], "k": pa.array([3], pa.int32())}))  # reordered, castable
    g.run_cycle()
    assert seen[-1].added == RowSet.from_range(0, 3) and not seen[-1].removed
    assert t.to_pandas()["k"].tolist() == [1, 2, 3]
    assert t.to_arrow().column("s").to_pylist() == ["a", None, "c"]


def test_keyed_upsert_modify_delete_exactly():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    seen = capture(t)
    t.upsert({"k": [1, 2, 3], "s": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]})
    g.run_cycle()
    assert seen[-1].added.keys().tolist() == [0, 1, 2]
    # same values for key 1 (no modify), new s for key 2, new v for key 3, new key 4, delete 1 later
    t.upsert({"k": [1, 2, 3, 4], "s": ["a", "B", "c", "d"], "v": [1.0, 2.0, 30.0, 4.0]})
    g.run_cycle()
    u = seen[-1]
    assert u.modified.keys().tolist() == [1, 2]
    assert u.modified_columns == {"s", "v"}
    assert u.added.keys().tolist() == [3] and not u.removed
    t.upsert({"k": [2], "s": ["BB"], "v": [2.0]})
    g.run_cycle()
    assert seen[-1].modified_columns == {"s"} and seen[-1].modified.keys().tolist() == [1]
    t.delete({"k": [1, 99]})
    g.run_cycle()
    assert seen[-1].removed.keys().tolist() == [0] and not seen[-1].added
    # the freed row key is reused in a later cycle, keys of live rows never change
    t.upsert({"k": [5], "s": ["e"], "v": [5.0]})
    g.run_cycle()
    assert seen[-1].added.keys().tolist() == [0]
    assert t.to_pandas().set_index("k")["s"].to_dict() == {5: "e", 2: "BB", 3: "c", 4: "d"}


def test_keyed_last_write_wins_within_a_cycle():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    t.upsert({"k": [1, 1, 2], "s": ["x", "y", "z"], "v": [1.0, 2.0, 3.0]})
    t.delete({"k": [2]})
    t.upsert({"k": [2], "s": ["w"], "v": [4.0]})
    g.run_cycle()
    assert t.to_pandas().values.tolist() == [[1, "y", 2.0], [2, "w", 4.0]]
    t.upsert({"k": [3], "s": ["q"], "v": [0.0]})
    t.delete({"k": [3]})
    seen = capture(t)
    g.run_cycle()
    assert seen == [] and t.size == 2  # insert then delete in one cycle: nothing happened


def test_keyed_with_string_and_composite_keys():
    g = UpdateGraph(validate=True)
    schema = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.int64())])
    t = KeyedTable(g, schema, ["a", "b"])
    replay = ReplayChecker(t)
    t.upsert({"a": ["x", "x", "y"], "b": [1, 2, 1], "v": [1, 2, 3]})
    g.run_cycle()
    t.upsert({"a": ["x", "z"], "b": [2, 9], "v": [20, 9]})
    t.delete({"a": ["y"], "b": [1]})
    g.run_cycle()
    replay.check()
    assert sorted(t.to_pandas().itertuples(index=False)) == [("x", 1, 1), ("x", 2, 20), ("z", 9, 9)]


@pytest.mark.parametrize("bad, match", [
    ({"k": [1], "s": ["a"]}, r"missing column\(s\) \['v'\]"),
    ({"k": [1], "s": ["a"], "v": [1.0], "w": [2]}, r"unknown column\(s\) \['w'\]"),
    ({"k": ["one"], "s": ["a"], "v": [1.0]}, r"column 'k' has type string, expected int64"),
    ({"k": [2**40], "s": ["a"], "v": [1.0]}, None),  # fits: no error
])
def test_bad_batches_are_refused_and_stage_nothing(bad, match):
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    t.upsert({"k": [7], "s": ["ok"], "v": [1.0]})
    g.run_cycle()
    if match is None:
        t.upsert(bad)
        g.run_cycle()
        assert t.size == 2
        return
    with pytest.raises(SchemaError, match=match):
        t.upsert(bad)
    g.run_cycle()
    assert t.to_pandas().values.tolist() == [[7, "ok", 1.0]]


def test_null_keys_and_bad_deletes_are_refused():
    g = UpdateGraph()
    t = g.keyed_table(KV, "k")
    with pytest.raises(InvalidKeyError, match="key column 'k' has 1 null"):
        t.upsert({"k": [1, None], "s": ["a", "b"], "v": [1.0, 2.0]})
    with pytest.raises(SchemaError, match=r"unknown column\(s\) \['s'\]"):
        t.delete({"k": [1], "s": ["a"]})
    with pytest.raises(SchemaError, match="key column"):
        g.keyed_table(KV, "nope")
    with pytest.raises(SchemaError, match="pyarrow Table"):
        t.upsert([1, 2, 3])
    g.run_cycle()
    assert t.size == 0


def test_a_column_that_is_not_nullable_takes_no_null_from_any_write():
    """A field declared not nullable (SQL's NOT NULL) is checked by every write, whatever
    the nullability the batch's own schema declares; a refused write stages nothing."""
    g = UpdateGraph(validate=True)
    schema = pa.schema([("k", pa.int64()), pa.field("s", pa.string(), nullable=False),
                        ("v", pa.float64())])
    keyed, log = g.keyed_table(schema, "k"), g.append_only_table(schema)
    for write in (keyed.upsert, log.append):
        write(pa.table({"k": [1], "s": ["a"], "v": [None]}, schema=schema))  # v may be null
        with pytest.raises(SchemaError, match=r"column 's' is NOT NULL and the rows hold 2 null"):
            write({"k": [2, 3, 4], "s": ["b", None, None], "v": [1.0, 2.0, 3.0]})
        with pytest.raises(SchemaError, match="column 's' is NOT NULL"):  # declared, not held
            write(pa.table({"k": [5], "s": pa.array([None], pa.string()), "v": [0.0]},
                           schema=schema))
    g.run_cycle()
    assert keyed.to_arrow().to_pylist() == log.to_arrow().to_pylist() == [
        {"k": 1, "s": "a", "v": None}]


def test_a_write_is_checked_once_and_staged_as_checked(monkeypatch):
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    checked = t.check_batch({"v": [1.0, 2.0], "k": pa.array([1, 2], pa.int32()), "s": ["a", "b"]},
                            "upsert")
    assert checked.kind == "upsert" and checked.data.schema.equals(KV)  # conformed: order, types
    gone = t.check_batch({"k": [2]}, "delete")
    assert gone.data.column_names == ["k"]

    def checked_again(*args, **kwargs):
        raise AssertionError("a checked batch was checked again")

    monkeypatch.setattr(_keyed, "conform", checked_again)
    t.stage(checked)
    t.stage(gone)
    g.run_cycle()
    assert t.to_pandas().values.tolist() == [[1, "a", 1.0]]


def test_stage_all_stages_in_order_and_nothing_when_one_batch_fails_its_check():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    other = g.keyed_table(KV, "s")  # same columns, other key: a null k passes its check
    good = t.check_batch({"k": [1, 2], "s": ["a", "b"], "v": [1.0, 2.0]}, "upsert")
    bad = other.check_batch({"k": pa.array([None], pa.int64()), "s": ["c"], "v": [3.0]}, "upsert")
    with pytest.raises(InvalidKeyError, match="key column 'k' has 1 null value"):
        t.stage_all([good, bad])
    assert t.pending_rows == 0
    t.stage_all([good, t.check_batch({"k": [1]}, "delete"),
                 other.check_batch({"k": [1], "s": ["z"], "v": [9.0]}, "upsert")])
    assert t.pending_rows == 4
    g.run_cycle()
    assert t.to_pandas().sort_values("k").values.tolist() == [[1, "z", 9.0], [2, "b", 2.0]]


def test_a_batch_checked_by_another_table_is_checked_by_this_one():
    g = UpdateGraph()
    t = g.keyed_table(KV, "k")
    other = g.keyed_table(KV, "s")  # same columns, other key: a null k passes its check
    with pytest.raises(InvalidKeyError, match="key column 'k' has 1 null value"):
        t.stage(other.check_batch({"k": pa.array([None], pa.int64()), "s": ["a"], "v": [1.0]},
                                  "upsert"))
    with pytest.raises(InputError, match="takes upsert and delete writes, not 'append'"):
        t.check_batch({"k": [1], "s": ["a"], "v": [1.0]}, "append")
    g.run_cycle()
    assert t.size == 0


def test_repeated_columns_are_refused_by_name():
    g = UpdateGraph()
    t = g.keyed_table(KV, "k")
    repeated = pa.Table.from_arrays([pa.array([1]), pa.array(["a"]), pa.array([1.0]), pa.array([2.0])],
                                    names=["k", "s", "v", "v"])
    with pytest.raises(SchemaError, match="column 'v' appears 2 times; column names must be unique"):
        t.upsert(repeated)  # was pyarrow's KeyError
    with pytest.raises(SchemaError, match="column 'k' appears 2 times"):
        g.append_only_table(pa.schema([("k", pa.int64())])).append(
            pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["k", "k"]))


def test_narrowing_cast_that_overflows_is_refused():
    g = UpdateGraph()
    t = g.append_only_table(pa.schema([("x", pa.int8())]))
    with pytest.raises(SchemaError, match="column 'x'"):
        t.append({"x": [1000]})


def test_ring_removes_oldest_and_reuses_slots():
    g = UpdateGraph(validate=True)
    t = g.ring_table(pa.schema([("x", pa.int64())]), 3)
    seen = capture(t)
    prev_seen = []
    t.listen(lambda u, tb: prev_seen.append(tb.rows(u.removed.keys(), ["x"], prev=True).column("x").to_pylist()))
    t.append({"x": [1, 2]})
    g.run_cycle()
    t.append({"x": [3, 4]})
    g.run_cycle()
    assert seen[-1].removed.keys().tolist() == [0] and seen[-1].added.keys().tolist() == [2, 3]
    assert prev_seen[-1] == [1]  # the removed row's value survives its slot being reused
    t.append({"x": [5, 6, 7, 8, 9]})  # more than capacity in one cycle
    g.run_cycle()
    assert t.to_pandas()["x"].tolist() == [7, 8, 9]
    assert seen[-1].removed.keys().tolist() == [1, 2, 3]


def test_timer_table_ticks():
    g = UpdateGraph(validate=True)
    t = TimerTable(g, period=0.0)
    g.run_cycle()
    g.run_cycle()
    assert t.to_pandas()["Tick"].tolist() == [0, 1]


def test_many_random_cycles_each_source_kind():
    """Thousands of random cycles per kind: validate + replay + equality with itself."""
    run_oracle(lambda t: t, lambda df: df, seed=7, n_cycles=3000)


def test_keyed_adds_written_as_runs_or_by_key_keep_values_and_previous_values(monkeypatch):
    """Random cycles of a keyed table against a dict model: new keys arrive as a clean
    append (consecutive staged rows onto consecutive row keys: a slice written as a new
    range), or interleaved with modifies, repeated within the batch, after deletes (row
    keys reused, staged rows apart: a take written key by key); each cycle's current rows
    and the previous values of its modified and removed rows match the model. Both ways
    of writing the adds are taken (counted)."""
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    rng = np.random.default_rng(29)
    runs = []
    real = _keyed.KeyedTable._compute_update

    def counting(self):
        out = real(self)
        if out is not None and out.added:
            k = out.added.keys()
            runs.append(int(k[-1]) - int(k[0]) == k.size - 1)
        return out

    monkeypatch.setattr(_keyed.KeyedTable, "_compute_update", counting)
    seen = []
    t.listen(lambda u, tb: seen.append((u, {c: tb.rows(u.removed.keys(), [c], prev=True).column(c).to_pylist()
                                            for c in ("k", "s", "v")},
                                        {c: tb.rows(u.modified.keys(), [c], prev=True).column(c).to_pylist()
                                         for c in ("k", "s", "v")})))
    model: dict[int, tuple[str | None, float]] = {}
    next_key = 0
    for cycle in range(300):
        before = dict(model)
        shape = rng.integers(0, 4)
        held = np.array(sorted(model), dtype=np.int64)
        n = int(rng.integers(1, 30))
        fresh = np.arange(next_key, next_key + n)
        next_key += n
        if shape == 0 or held.size == 0:  # a clean append
            ks = fresh
        elif shape == 1:  # new keys interleaved with modifies
            ks = rng.permutation(np.concatenate((fresh, rng.choice(held, min(held.size, 10), replace=False))))
        else:  # new keys written twice (last wins), and modifies
            ks = np.concatenate((fresh, rng.choice(fresh, n // 2 + 1), rng.choice(held, min(held.size, 5))))
        ss = [None if x < 0.1 else f"s{int(x * 40)}" for x in rng.random(ks.size)]
        vs = rng.integers(0, 50, ks.size).astype(float)
        t.upsert(pa.table({"k": ks, "s": pa.array(ss, pa.string()), "v": vs}))
        for k, s_, v in zip(ks.tolist(), ss, vs.tolist(), strict=True):
            model[k] = (s_, v)
        if shape >= 2 and held.size:
            dels = rng.choice(held, min(held.size, int(rng.integers(0, 12))), replace=False)
            t.delete({"k": dels})
            for d in dels.tolist():
                model.pop(d, None)
        seen.clear()
        g.run_cycle()
        got = t.to_arrow().to_pylist()
        assert {r["k"]: (r["s"], r["v"]) for r in got} == model, cycle
        for _, removed, modified in seen:
            for cols in (removed, modified):
                for k, s_, v in zip(cols["k"], cols["s"], cols["v"], strict=True):
                    assert before[k] == (s_, v), (cycle, k)
    assert any(runs) and not all(runs)


def test_keyed_large_batch_vectorized_equivalence():
    """A 50k-row upsert with duplicates and deletes matches a pandas last-wins model."""
    g = UpdateGraph(validate=True)
    t = g.keyed_table(pa.schema([("k", pa.int64()), ("v", pa.int64())]), "k")
    rng = np.random.default_rng(3)
    model = {}
    for _ in range(5):
        ks = rng.integers(0, 20_000, 50_000)
        vs = rng.integers(0, 5, 50_000)
        t.upsert({"k": ks, "v": vs})
        model.update(dict(zip(ks.tolist(), vs.tolist(), strict=False)))
        dels = rng.integers(0, 20_000, 3_000)
        t.delete({"k": dels})
        for d in dels.tolist():
            model.pop(d, None)
        g.run_cycle()
        got = dict(zip(*[c.to_pylist() for c in t.to_arrow().columns], strict=False))
        assert got == model


# --- KeyedTable.lookup -------------------------------------------------------------------
def looked_up(t, keys, **kw):
    """``{key: row or None}`` and row keys, from one lookup."""
    got = t.lookup({"k": keys}, **kw)
    rows = got.rows.to_pylist()
    return ([rows[p] if p >= 0 else None for p in got.position.tolist()], got.row_keys.tolist())


def test_lookup_reads_the_rows_of_keys_in_the_order_asked():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    t.upsert({"k": [1, 2, 3], "s": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]})
    g.run_cycle()
    got = t.lookup(pa.table({"k": pa.array([3, 9, 1, 3], pa.int32())}))  # cast, absent, repeated
    assert got.position.tolist() == [0, -1, 1, 2] and got.found.tolist() == [True, False, True, True]
    assert got.rows.to_pylist() == [{"k": 3, "s": "c", "v": 3.0}, {"k": 1, "s": "a", "v": 1.0},
                                    {"k": 3, "s": "c", "v": 3.0}]
    assert got.row_keys.tolist() == [2, 0, 2]
    assert got.rows.schema.equals(KV)
    empty = t.lookup({"k": pa.array([], pa.int64())})
    assert empty.rows.num_rows == 0 and empty.position.size == 0


def test_lookup_without_staged_ignores_writes_staged_for_the_next_cycle():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    t.upsert({"k": [1, 2], "s": ["a", "b"], "v": [1.0, 2.0]})
    g.run_cycle()
    t.upsert({"k": [1, 3], "s": ["A", "c"], "v": [10.0, 3.0]})
    t.delete({"k": [2]})
    assert looked_up(t, [1, 2, 3]) == ([{"k": 1, "s": "a", "v": 1.0}, {"k": 2, "s": "b", "v": 2.0},
                                        None], [0, 1])


def test_lookup_with_staged_folds_in_staged_writes_last_write_wins():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    t.upsert({"k": [1, 2, 4], "s": ["a", "b", "d"], "v": [1.0, 2.0, 4.0]})
    g.run_cycle()
    t.upsert({"k": [1, 3, 3], "s": ["A", "c", "C"], "v": [10.0, 3.0, 30.0]})  # 3: last row wins
    t.delete({"k": [2, 3, 9]})
    t.upsert({"k": [3], "s": ["CC"], "v": [33.0]})  # deleted, then back
    rows, row_keys = looked_up(t, [1, 2, 3, 4, 5], staged=True)
    assert rows == [{"k": 1, "s": "A", "v": 10.0}, None, {"k": 3, "s": "CC", "v": 33.0},
                    {"k": 4, "s": "d", "v": 4.0}, None]
    assert row_keys == [0, -1, 2]  # 1 keeps its row key; 3 gets one when a cycle applies it
    assert t.pending_rows == 7  # a lookup stages and takes nothing
    g.run_cycle()
    assert looked_up(t, [1, 2, 3, 4, 5])[0] == rows


def test_lookup_compares_keys_exactly_when_hashes_collide(monkeypatch):
    g = UpdateGraph(validate=True)
    schema = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.int64())])
    t = KeyedTable(g, schema, ["a", "b"])
    t.upsert({"a": ["x", "y"], "b": [1, 1], "v": [1, 2]})
    g.run_cycle()
    t.upsert({"a": ["z"], "b": [7], "v": [3]})
    t.delete({"a": ["y"], "b": [1]})
    real = _keyed._key_hashes
    x_hash = real(pa.table({"a": ["x"], "b": pa.array([1], pa.int32())}), ["a", "b"])[0]
    monkeypatch.setattr(_keyed, "_key_hashes",
                        lambda tbl, keys: np.full(tbl.num_rows, x_hash, np.uint64))
    keys = {"a": ["x", "q", "z", "y", "x"], "b": [1, 1, 7, 1, 2]}
    got = t.lookup(keys)
    assert got.position.tolist() == [0, -1, -1, -1, -1]  # every key has x's hash; only x is x
    got = t.lookup(keys, staged=True)
    assert got.position.tolist() == [0, -1, 1, -1, -1]
    assert got.rows.to_pylist() == [{"a": "x", "b": 1, "v": 1}, {"a": "z", "b": 7, "v": 3}]


def test_lookup_refuses_bad_keys_and_failed_tables():
    g = UpdateGraph()
    t = g.keyed_table(KV, "k")
    with pytest.raises(SchemaError, match=r"table '.*': unknown column\(s\) \['s'\]"):
        t.lookup({"k": [1], "s": ["a"]})
    with pytest.raises(InvalidKeyError, match="key column 'k' has 1 null"):
        t.lookup({"k": pa.array([None], pa.int64())})
    t.failure = RuntimeError("boom")
    with pytest.raises(TableFailed, match="failed: boom"):
        t.lookup({"k": [1]})


def test_lookup_inside_a_cycle_sees_that_cycle():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    seen = []
    t.listen(lambda u, tb: seen.append((looked_up(tb, [1])[0], looked_up(tb, [1], staged=True)[0])))
    t.upsert({"k": [1], "s": ["a"], "v": [1.0]})
    g.run_cycle()
    assert seen == [([{"k": 1, "s": "a", "v": 1.0}], [{"k": 1, "s": "a", "v": 1.0}])]


def test_write_lock_makes_check_then_stage_atomic():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k")
    staged, done = threading.Event(), threading.Event()

    def other_writer():
        staged.set()
        t.upsert({"k": [1], "s": ["other"], "v": [0.0]})
        done.set()

    with t.write_lock():
        assert not t.lookup({"k": [1]}, staged=True).found[0]
        thread = threading.Thread(target=other_writer)
        thread.start()
        assert staged.wait(5)
        assert not done.wait(0.2)  # the other writer waits for the lock
        with t.write_lock():  # re-entrant
            t.upsert({"k": [1], "s": ["mine"], "v": [1.0]})
    assert done.wait(5)
    thread.join()
    g.run_cycle()
    assert t.to_pandas()["s"].tolist() == ["other"]  # staged after mine: the last write wins


#: integer keys: dense, spread wide (the index leaves its dense layout), negative from the
#: middle of the run on (the index turns hashed), uint64 past 2**63, timestamps
_INT_KEYS = {
    "dense": list(range(30)),
    "wide": [i * 2**40 + i for i in range(30)],
    "negative": list(range(15)) + [-1 - i for i in range(15)],
    "uint64": [2**64 - 1 - i for i in range(15)] + list(range(15)),
}


@pytest.mark.parametrize("ktype, few, squeeze, scalars", [
    (pa.int64(), None, False, None),
    (pa.int64(), "wide", False, None),
    (pa.int64(), "negative", False, None),
    (pa.uint64(), "uint64", False, None),
    (pa.timestamp("us"), "dense", False, None),
    (pa.string(), 0, False, 0),  # every batch through the vectorized hash and comparison
    (pa.string(), 1 << 30, False, 1 << 30),  # every batch through the plain-integer/Python ones
    (pa.string(), 0, True, 0),  # hashes squeezed into four values: equality decides
    (pa.string(), 1 << 30, True, 1 << 30),
    (pa.string(), 1 << 30, True, 0),  # held keys compared as Python values, read gathered
])
def test_lookup_matches_a_dict_model_over_random_writes(ktype, few, squeeze, scalars, monkeypatch):
    int_keys = _INT_KEYS[few if isinstance(few, str) else "dense"]
    if isinstance(few, str):
        few = None
    if few is not None:
        monkeypatch.setattr(_keyed, "FEW_KEYS", few)
        monkeypatch.setattr(hashing, "FEW_STRINGS", few)
    if scalars is not None:
        monkeypatch.setattr(columns, "_FEW_SCALARS", scalars)
    if squeeze:
        real = _keyed._key_hashes
        monkeypatch.setattr(_keyed, "_key_hashes", lambda tbl, keys: real(tbl, keys) & np.uint64(3))
    rng = random.Random(41)
    g = UpdateGraph(validate=True)
    t = g.keyed_table(pa.schema([("k", ktype), ("v", pa.int64())]), "k")
    keys = [f"key{i}" for i in range(30)] if ktype == pa.string() else int_keys
    applied: dict[object, int] = {}  # as the last cycle left the table
    pending: dict[object, int] = {}  # with the staged writes
    for rnd in range(300):
        # integer keys: the first 15 only for half the run (the negatives arrive later)
        pool = keys[:15] if rnd < 150 and ktype != pa.string() else keys
        for _ in range(rng.randint(0, 3)):
            ks = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
            if rng.random() < 0.3:
                t.delete({"k": pa.array(ks, ktype)})
                for k in ks:
                    pending.pop(k, None)
            else:
                vs = [rng.randint(0, 9) for _ in ks]
                t.upsert({"k": pa.array(ks, ktype), "v": pa.array(vs, pa.int64())})
                pending.update(zip(ks, vs, strict=True))
        ask = [rng.choice(keys) for _ in range(10)]
        for staged, model in ((False, applied), (True, pending)):
            got = t.lookup({"k": pa.array(ask, ktype)}, staged=staged)
            rows = got.rows.to_pylist()
            have = [rows[p]["v"] if p >= 0 else None for p in got.position.tolist()]
            assert have == [model.get(k) for k in ask], f"round {rnd}, staged={staged}"
        if rng.random() < 0.7:
            g.run_cycle()
            applied = dict(pending)
            keys_now = t.to_arrow()
            got = t.lookup(keys_now.select(["k"]))
            assert got.rows.equals(keys_now) and got.found.all()
            assert sorted(got.row_keys.tolist()) == t.rowset.keys().tolist()


def _same(a, b) -> bool:
    """The keyed table's rule for an unchanged value: null == null, NaN == NaN, 0.0 == -0.0."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return bool(a == b)


@pytest.mark.parametrize("seed", range(3))
def test_keyed_modifies_name_exactly_the_changed_rows_and_columns(seed):
    # numeric columns take numpy's path, the others Arrow's; both must say modified exactly
    # where a value changed under one rule (NaN == NaN, 0.0 == -0.0, null only == null),
    # with nulls coming and going, against a dict model, for hundreds of cycles
    schema = pa.schema([("k", pa.int64()), ("i", pa.int64()), ("f", pa.float64()),
                        ("g", pa.float32()), ("ts", pa.timestamp("ms")), ("b", pa.bool_()),
                        ("s", pa.string())])
    pools = {"i": [0, 1, 2, None], "f": [0.0, -0.0, 1.5, float("nan"), None],
             "g": [0.0, -0.0, 2.5, float("nan"), None], "ts": [0, 1, 2, None],
             "b": [True, False, None], "s": ["a", "b", None]}
    rng = random.Random(seed)
    g = UpdateGraph(validate=True)
    t = g.keyed_table(schema, "k")
    seen = capture(t)
    model: dict[int, dict] = {}
    for _ in range(300):
        keys = rng.sample(range(40), rng.randint(1, 25))
        null_free = rng.random() < 0.5  # whole batches without nulls: the numpy path
        rows = {k: {c: rng.choice([v for v in p if v is not None] if null_free else p)
                    for c, p in pools.items()} for k in keys}
        t.upsert(pa.table({"k": keys, **{c: pa.array([rows[k][c] for k in keys], schema.field(c).type)
                                         for c in pools}}, schema=schema))
        want_keys, want_cols = set(), set()
        for k, row in rows.items():
            if k in model:
                diff = {c for c in pools if not _same(model[k][c], row[c])}
                if diff:
                    want_keys.add(k)
                    want_cols |= diff
            model[k] = row
        before = len(seen)
        g.run_cycle()
        u = seen[-1] if len(seen) > before else None
        got_keys = set(t.column("k").get(u.modified.keys()).to_pylist()) if u else set()
        assert got_keys == want_keys
        assert (set(u.modified_columns) if u and u.modified else set()) == want_cols
    got = t.to_arrow().to_pylist()
    assert len(got) == len(model)
    for row in got:
        expect = model[row["k"]]
        for c in pools:
            v = row[c]
            if c == "ts" and v is not None:
                v = int(pa.scalar(v, pa.timestamp("ms")).cast(pa.int64()).as_py())
            assert _same(v, expect[c]), (row["k"], c, v, expect[c])


def test_conform_passes_a_conformed_table_through_and_fixes_any_other():
    from engine.sources import conform

    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    t = pa.table({"k": [1, 2], "s": ["a", None]}, schema=schema)
    assert conform("t", schema, t) is t  # already in the table's schema: nothing to do
    reordered = conform("t", schema, t.select(["s", "k"]))
    assert reordered.schema.equals(schema) and reordered.equals(t)
    cast = conform("t", schema, pa.table({"k": pa.array([1, 2], pa.int32()), "s": ["a", None]}))
    assert cast.schema.equals(schema) and cast.equals(t)
    with_meta = t.replace_schema_metadata({b"pandas": b"{}"})
    out = conform("t", schema, with_meta)
    assert out is not with_meta and out.schema.equals(schema, check_metadata=True)
    with pytest.raises(SchemaError, match="column 'k' has type string"):
        conform("t", schema, pa.table({"k": ["x"], "s": ["a"]}))


def test_an_append_tables_snapshot_shares_its_values_and_outlives_growth():
    """Append-only columns are never written twice: a snapshot is a view of the stored
    values (no copy), and stays exact while later appends grow the arrays past it."""
    graph = UpdateGraph()
    t = graph.append_only_table(pa.schema([("x", pa.int64()), ("f", pa.float64())]))
    t.append(pa.table({"x": [1, None, 3], "f": [0.5, 1.5, None]}))
    graph.run_cycle()
    snap = t.to_arrow()
    stored = t.column("x")._values
    buf = snap.column("x").chunk(0).buffers()[1]
    assert stored.ctypes.data <= buf.address < stored.ctypes.data + stored.nbytes  # shared
    for i in range(12):  # 3 -> ~2M rows: the arrays are regrown many times
        n = 1 << (i + 8)
        t.append(pa.table({"x": pa.array(range(n), pa.int64()),
                           "f": pa.array(range(n), pa.float64())}))
        graph.run_cycle()
    assert snap.to_pydict() == {"x": [1, None, 3], "f": [0.5, 1.5, None]}
    assert t.to_arrow().slice(0, 3).to_pydict() == snap.to_pydict()
