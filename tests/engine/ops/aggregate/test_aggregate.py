"""agg_by / first_by / last_by / count_by: explicit cycles, parents that shift, and the
sorted multisets underneath min/max/first/last (the oracle: test_aggregate_oracle.py).

A group's row key is its first parent row's, so the groups are in order of their first
rows in the parent's current rows, as a recomputation orders them (see
engine.ops.aggregate); the example tests here pin down when a group keeps its key and when
it moves (a remove and an add).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import tests.oracle as oracle
from engine.columns import ColumnSource
from engine.errors import SchemaError
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.ops.aggregate import listener as aggregate_mod
from engine.ops.aggregate._bits import LiveBits
from engine.ops.aggregate._sortedset import RowKeySet, ValueMultiset, _Sorted
from engine.ops.aggregate.listener import Agg, agg_by, count_by, first_by, last_by
from engine.rowset import RowSet, RowSetShiftData
from engine.sources import KeyedTable
from engine.table import DerivedTable, Table
from engine.update import TableUpdate

SCHEMA = oracle.SCHEMA


# helpers ----------------------------------------------------------------------------------
def _keyed(g: UpdateGraph, rows: list[tuple[Any, ...]]) -> KeyedTable:
    t = KeyedTable(g, SCHEMA, "Key", name="src")
    if rows:
        t.upsert(_batch(rows))
        g.run_cycle()
    return t


def _batch(rows: list[tuple[Any, ...]]) -> pa.Table:
    sym, key, price, qty = zip(*rows, strict=True)
    return pa.table({"Sym": pa.array(sym, pa.string()), "Key": pa.array(key, pa.int64()),
                     "Price": pa.array(price, pa.float64()), "Qty": pa.array(qty, pa.int64())})


class _Recorder:
    def __init__(self, table: Table) -> None:
        self.updates: list[TableUpdate] = []
        table.listen(lambda up, _t: self.updates.append(up))

    def last(self) -> TableUpdate:
        return self.updates[-1]


def _rows(t: Table) -> list[dict[str, Any]]:
    return t.to_arrow().to_pylist()


def _keys(rs: RowSet) -> list[int]:
    return rs.keys().tolist()


def _check(up: TableUpdate, added=(), removed=(), modified=(), cols=(), shifted=()) -> None:
    assert (_keys(up.added), _keys(up.removed), _keys(up.modified)) == (list(added), list(removed), list(modified))
    assert up.modified_columns == frozenset(cols)
    sh = up.shifted
    assert list(zip(sh.begins.tolist(), sh.ends.tolist(), sh.deltas.tolist(), strict=True)) == list(shifted)


# example tests ----------------------------------------------------------------------------
def test_groups_are_keyed_by_their_first_row_in_the_parent():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 10.0, 1), ("B", 2, 20.0, 2), ("A", 3, 30.0, 3)])  # row keys 0, 1, 2
    r = agg_by(src, [agg.sum("Price", "S"), agg.count("N"), agg.max("Price", "Hi")], by="Sym")
    rec = _Recorder(r)
    assert _keys(r.rowset) == [0, 1]
    assert _rows(r) == [{"Sym": "A", "S": 40.0, "N": 2, "Hi": 30.0},
                        {"Sym": "B", "S": 20.0, "N": 1, "Hi": 20.0}]
    src.upsert(_batch([("C", 4, 5.0, 1)]))  # row key 3
    g.run_cycle()
    _check(rec.last(), added=[3])
    src.upsert(_batch([("B", 2, 25.0, 2)]))  # a price change: sum and max, not the count
    g.run_cycle()
    _check(rec.last(), modified=[1], cols={"S", "Hi"})
    src.upsert(_batch([("A", 1, 12.0, 1)]))  # below the max: only the sum changes
    g.run_cycle()
    _check(rec.last(), modified=[0], cols={"S"})
    assert _rows(r)[0] == {"Sym": "A", "S": 42.0, "N": 2, "Hi": 30.0}
    src.delete(pa.table({"Key": [1]}))  # A's first row: A moves to its next one, after B
    g.run_cycle()
    _check(rec.last(), added=[2], removed=[0])
    assert [row["Sym"] for row in _rows(r)] == ["B", "A", "C"]
    src.upsert(_batch([("C", 5, 1.0, 1)]))  # on the freed row key 0: C's first row now
    g.run_cycle()
    _check(rec.last(), added=[0], removed=[3])
    assert _rows(r) == [{"Sym": "C", "S": 6.0, "N": 2, "Hi": 5.0}, {"Sym": "B", "S": 25.0, "N": 1, "Hi": 25.0},
                        {"Sym": "A", "S": 30.0, "N": 1, "Hi": 30.0}]


def test_live_result_equals_one_built_afresh_after_first_rows_leave():
    # what a durable server's restart does: the derived table is built again over the
    # restored source (tests/flight/test_agg_restart_order.py runs it through a real server)
    g = UpdateGraph(validate=True)
    src = _keyed(g, [(s, i, 0.5 * i, 0) for i, s in enumerate("ABCABCDDA")])
    specs = [agg.sum("Price", "S"), agg.count("N")]
    r = agg_by(src, specs, by="Sym")
    writes: list[tuple[list[int], list[tuple[Any, ...]]]] = [
        ([0], []),  # A's first row
        ([1, 4], []),  # B emptied ...
        ([], [("B", 20, 1.5, 0)]),  # ... and back, on a freed row key
        ([], [("E", 21, 2.0, 0), ("C", 22, 2.5, 0)]),
        ([2], []),  # C's first row
    ]
    for deletes, upserts in writes:
        if deletes:
            src.delete(pa.table({"Key": pa.array(deletes, pa.int64())}))
        if upserts:
            src.upsert(_batch(upserts))
        g.run_cycle()
        fresh = agg_by(src, specs, by="Sym")
        assert _rows(r) == _rows(fresh)
        fresh.close()
    assert [row["Sym"] for row in _rows(r)] == ["B", "E", "A", "C", "D"]


def test_initial_build_of_a_big_table_keeps_first_appearance_order():
    g = UpdateGraph(validate=True)
    rng = np.random.default_rng(5)
    n = 6000  # past the batch sizes where hashing and uniques switch to Arrow's hash tables
    sym = np.array([f"S{i}" for i in rng.integers(0, 300, n)], dtype=object)
    sym[rng.random(n) < 0.02] = None
    src = KeyedTable(g, SCHEMA, "Key", name="src")
    src.upsert(pa.table({"Sym": pa.array(sym, pa.string()), "Key": np.arange(n),
                         "Price": rng.random(n), "Qty": rng.integers(0, 9, n)}))
    g.run_cycle()
    r = agg_by(src, [agg.count("N"), agg.sum("Qty", "Q"), agg.last("Key", "L")], by=["Sym", "Qty"])
    df = src.to_pandas()
    want = df.groupby(["Sym", "Qty"], dropna=False, sort=False).agg(
        N=("Key", "size"), Q=("Qty", "sum"), L=("Key", "last")).reset_index()
    got = r.to_pandas()
    assert got[["Sym", "Qty"]].astype(object).where(got[["Sym", "Qty"]].notna(), None).values.tolist() == \
        want[["Sym", "Qty"]].astype(object).where(want[["Sym", "Qty"]].notna(), None).values.tolist()
    assert got["N"].tolist() == want["N"].tolist() and got["L"].tolist() == want["L"].tolist()
    assert got["Q"].tolist() == want["Q"].tolist()


def test_removing_the_extreme_finds_the_next_one():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 10.0, 0), ("A", 2, 40.0, 0), ("A", 3, 20.0, 0), ("A", 4, 30.0, 0)])
    r = agg_by(src, [agg.min("Price", "Lo"), agg.max("Price", "Hi"), agg.first("Key", "F"),
                     agg.last("Key", "L")], by="Sym")
    rec = _Recorder(r)
    assert _rows(r) == [{"Sym": "A", "Lo": 10.0, "Hi": 40.0, "F": 1, "L": 4}]
    src.delete(pa.table({"Key": [2]}))  # the max, neither first nor last
    g.run_cycle()
    _check(rec.last(), modified=[0], cols={"Hi"})
    assert _rows(r)[0]["Hi"] == 30.0
    src.delete(pa.table({"Key": [1]}))  # the min and the first row: the group's row key moves
    g.run_cycle()
    _check(rec.last(), added=[2], removed=[0])
    assert _rows(r)[0] == {"Sym": "A", "Lo": 20.0, "Hi": 30.0, "F": 3, "L": 4}
    src.delete(pa.table({"Key": [4]}))  # the max and the last row
    g.run_cycle()
    _check(rec.last(), modified=[2], cols={"Hi", "L"})
    assert _rows(r)[0] == {"Sym": "A", "Lo": 20.0, "Hi": 20.0, "F": 3, "L": 3}


def test_max_of_a_big_group_losing_its_max_every_cycle():
    g = UpdateGraph(validate=True)
    keyed = _keyed(g, [])
    n = 20_000
    vals = np.arange(n, dtype=np.float64)
    keyed.upsert(pa.table({"Sym": pa.array(["A"] * n), "Key": np.arange(n), "Price": vals, "Qty": np.zeros(n, np.int64)}))
    g.run_cycle()
    r = agg_by(keyed, [agg.max("Price", "Hi"), agg.min("Price", "Lo")], by="Sym")
    for i in range(30):  # tombstones pile up at the end of the group
        keyed.delete(pa.table({"Key": [n - 1 - i]}))
        g.run_cycle()
        assert _rows(r)[0] == {"Sym": "A", "Hi": float(n - 2 - i), "Lo": 0.0}


def test_group_emptied_and_recreated():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 2.0, 1), ("B", 3, 3.0, 1)])
    r = agg_by(src, [agg.sum("Price", "S"), agg.count("N")], by="Sym")
    rec = _Recorder(r)
    src.delete(pa.table({"Key": [1, 2]}))
    g.run_cycle()
    _check(rec.last(), removed=[0])
    assert _rows(r) == [{"Sym": "B", "S": 3.0, "N": 1}]
    src.upsert(_batch([("A", 5, 7.0, 1)]))  # on the parent's freed row key 0, from the next cycle on
    g.run_cycle()
    _check(rec.last(), added=[0])
    assert _rows(r) == [{"Sym": "A", "S": 7.0, "N": 1}, {"Sym": "B", "S": 3.0, "N": 1}]
    src.delete(pa.table({"Key": [3]}))  # B's only row goes while another arrives, on row key 1:
    src.upsert(_batch([("B", 6, 4.0, 1)]))  # B moves there
    g.run_cycle()
    _check(rec.last(), added=[1], removed=[2])
    assert _rows(r) == [{"Sym": "A", "S": 7.0, "N": 1}, {"Sym": "B", "S": 4.0, "N": 1}]
    src.upsert(_batch([("B", 6, 5.0, 1)]))  # the same first row: a modify
    g.run_cycle()
    _check(rec.last(), modified=[1], cols={"S"})


def test_a_group_gone_and_one_born_on_a_new_row_are_a_remove_and_an_add():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1)])
    r = count_by(src, "N", by="Sym")
    rec = _Recorder(r)
    src.delete(pa.table({"Key": [1]}))
    src.upsert(_batch([("B", 2, 1.0, 1)]))
    g.run_cycle()
    _check(rec.last(), added=[1], removed=[0])
    assert _rows(r) == [{"Sym": "B", "N": 1}]


def test_modifies_move_rows_between_groups():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 2.0, 1), ("B", 3, 3.0, 1)])
    r = agg_by(src, [agg.sum("Price", "S"), agg.count("N"), agg.first("Key", "F")], by="Sym")
    rec = _Recorder(r)
    src.upsert(_batch([("B", 1, 1.0, 1)]))  # row 0: A -> B, B's first row now; A's is row 1
    g.run_cycle()
    _check(rec.last(), added=[0, 1], removed=[0, 2])
    assert _rows(r) == [{"Sym": "B", "S": 4.0, "N": 2, "F": 1}, {"Sym": "A", "S": 2.0, "N": 1, "F": 2}]
    src.upsert(_batch([("B", 2, 2.0, 1)]))  # A's last row leaves: A removed, B modified
    g.run_cycle()
    _check(rec.last(), removed=[1], modified=[0], cols={"S", "N"})
    src.upsert(_batch([("C", 3, 3.0, 1)]))  # row 2, B -> C: a new group there
    g.run_cycle()
    _check(rec.last(), added=[2], modified=[0], cols={"S", "N"})
    assert _rows(r) == [{"Sym": "B", "S": 3.0, "N": 2, "F": 1}, {"Sym": "C", "S": 3.0, "N": 1, "F": 3}]


def test_modifies_of_unread_columns_are_silent():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 2.0, 2), ("B", 3, 3.0, 3)])
    r = agg_by(src, [agg.sum("Price", "S"), agg.min("Price", "Lo")], by="Sym")
    rec = _Recorder(r)
    src.upsert(_batch([("A", 1, 1.0, 9), ("B", 3, 3.0, 9)]))  # Qty only
    g.run_cycle()
    assert rec.updates == [] and r.last_step < g.step
    src.upsert(_batch([("A", 1, 2.0, 9), ("A", 2, 1.0, 2)]))  # prices swap: nothing changes
    g.run_cycle()
    assert rec.updates == []
    assert _rows(r) == [{"Sym": "A", "S": 3.0, "Lo": 1.0}, {"Sym": "B", "S": 3.0, "Lo": 3.0}]


def test_zero_key_has_no_row_while_the_table_is_empty():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [])
    r = agg_by(src, [agg.count("N"), agg.sum("Qty", "Q"), agg.std("Price", "SD")])
    rec = _Recorder(r)
    assert r.size == 0 and r.column_names == ["N", "Q", "SD"]
    src.upsert(_batch([("A", 1, 1.0, 5), ("B", 2, 3.0, 6)]))
    g.run_cycle()
    _check(rec.last(), added=[0])
    assert _rows(r) == [{"N": 2, "Q": 11, "SD": pytest.approx(2 ** 0.5)}]
    src.delete(pa.table({"Key": [1]}))
    g.run_cycle()
    _check(rec.last(), modified=[0], cols={"N", "Q", "SD"})
    assert _rows(r) == [{"N": 1, "Q": 6, "SD": None}]
    src.delete(pa.table({"Key": [2]}))
    g.run_cycle()
    _check(rec.last(), removed=[0])
    assert r.size == 0


def test_null_semantics_follow_pandas():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [(None, 1, None, 1), (None, 2, None, 2), ("A", 3, 4.0, 3), ("A", 4, None, 4)])
    r = agg_by(src, [agg.count("N"), agg.sum("Price", "S"), agg.mean("Price", "M"), agg.std("Price", "SD"),
                     agg.min("Price", "Lo"), agg.count_distinct("Price", "CD"), agg.first("Price", "F"),
                     agg.last("Price", "L")], by="Sym")
    assert _rows(r) == [
        {"Sym": None, "N": 2, "S": 0.0, "M": None, "SD": None, "Lo": None, "CD": 0, "F": None, "L": None},
        {"Sym": "A", "N": 2, "S": 4.0, "M": 4.0, "SD": None, "Lo": 4.0, "CD": 1, "F": 4.0, "L": None},
    ]


def test_std_is_exactly_zero_for_equal_values_after_churn():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", i, 1e9 + i % 3, 0) for i in range(30)])
    r = agg_by(src, [agg.std("Price", "SD"), agg.mean("Price", "M")], by="Sym")
    assert _rows(r)[0]["SD"] == pytest.approx(np.std(1e9 + np.arange(30) % 3, ddof=1), rel=1e-12)
    for i in range(30):  # every value rewritten to one constant, a few per cycle
        src.upsert(_batch([("A", i, 7.25, 0)]))
        g.run_cycle()
    assert _rows(r)[0] == {"Sym": "A", "SD": 0.0, "M": 7.25}


def test_std_recovers_after_a_change_of_scale():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", i, 1e9 + 7 * i, 0) for i in range(30)])
    r = agg_by(src, [agg.std("Price", "SD")], by="Sym")
    now = 1e9 + 7 * np.arange(30.0)
    for i in range(30):  # the group moves from ~1e9 to ~1 one row per cycle
        now[i] = 0.5 + i % 5
        src.upsert(_batch([("A", i, now[i], 0)]))
        g.run_cycle()
        assert _rows(r)[0]["SD"] == pytest.approx(np.std(now, ddof=1), rel=1e-9)


def test_an_outlier_that_came_and_went_leaves_no_trace():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 0), ("A", 2, 2.0, 0), ("A", 3, 3.0, 0)])
    r = agg_by(src, [agg.std("Price", "SD"), agg.sum("Price", "S"), agg.mean("Price", "M")], by="Sym")
    for big in (1e12, -3e15, 7e17):
        src.upsert(_batch([("A", 4, big, 0)]))
        g.run_cycle()
        assert _rows(r)[0]["SD"] == pytest.approx(np.std([1.0, 2.0, 3.0, big], ddof=1), rel=1e-12)
        src.delete(pa.table({"Key": [4]}))
        g.run_cycle()
        assert _rows(r)[0] == {"Sym": "A", "SD": 1.0, "S": 6.0, "M": 2.0}


def test_infinities_are_counted_apart():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.5, 0)])
    r = agg_by(src, [agg.sum("Price", "S"), agg.mean("Price", "M"), agg.max("Price", "Hi")], by="Sym")
    src.upsert(_batch([("A", 2, float("inf"), 0)]))
    g.run_cycle()
    assert _rows(r)[0] == {"Sym": "A", "S": float("inf"), "M": float("inf"), "Hi": float("inf")}
    src.upsert(_batch([("A", 3, float("-inf"), 0)]))
    g.run_cycle()
    assert np.isnan(_rows(r)[0]["S"])
    src.delete(pa.table({"Key": [2, 3]}))
    g.run_cycle()
    assert _rows(r)[0] == {"Sym": "A", "S": 1.5, "M": 1.5, "Hi": 1.5}


def test_finite_terms_past_float64s_range_read_as_infinity_and_leave_no_trace():
    """Found by the server's fuzzer (a view summing huge doubles): two finite terms whose sum
    passes float64's range left ``inf - inf`` (NaN) in the running sum's residue, for good.
    Now the sum reads +inf (or -inf) while they are there, and exact sums after they go;
    std and var of values whose squares overflow give no error, and recover the same way."""
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.5, 0), ("B", 2, 2.0, 0), ("B", 3, 4.0, 0)])
    r = agg_by(src, [agg.sum("Price", "S"), agg.mean("Price", "M"), agg.std("Price", "SD"),
                     agg.var("Price", "V")], by="Sym")
    big = 1.7e308
    src.upsert(_batch([("A", 4, big, 0), ("A", 5, big, 0), ("B", 6, -big, 0), ("B", 7, -big, 0)]))
    g.run_cycle()
    a, b = _rows(r)
    assert (a["S"], a["M"], b["S"], b["M"]) == (math.inf, math.inf, -math.inf, -math.inf)
    src.delete(pa.table({"Key": [5]}))  # one huge term left in A: back in range, exactly
    g.run_cycle()
    assert _rows(r)[0]["S"] == big + 1.5 and _rows(r)[0]["M"] == (big + 1.5) / 2
    src.upsert(_batch([("A", 5, -big, 0)]))  # +big and -big cancel exactly
    g.run_cycle()
    assert _rows(r)[0]["S"] == 1.5
    src.delete(pa.table({"Key": [4, 5, 6, 7]}))
    g.run_cycle()
    assert _rows(r) == [{"Sym": "A", "S": 1.5, "M": 1.5, "SD": None, "V": None},
                        {"Sym": "B", "S": 6.0, "M": 3.0, "SD": math.sqrt(2.0), "V": 2.0}]
    src.upsert(_batch([("B", 8, 1e300, 0)]))  # a square past the range, then gone again
    g.run_cycle()
    src.delete(pa.table({"Key": [8]}))
    g.run_cycle()
    assert _rows(r)[1] == {"Sym": "B", "S": 6.0, "M": 3.0, "SD": math.sqrt(2.0), "V": 2.0}


@pytest.mark.parametrize("seed", range(3))
def test_sums_over_huge_and_small_terms_against_exact_arithmetic(seed):
    """Random upserts and deletes of small values and values near float64's limit (1,500
    cycles, ``validate`` on every update): each group's sum equals its current values summed
    exactly (``fractions.Fraction``) and rounded once: that infinity when the exact sum is
    past float64's range, else within 1e-9 (small values are multiples of 1/4 below 1,000, so
    cancelled huge terms leave them exact); mean is sum / count; nothing fails."""
    from fractions import Fraction

    rng = np.random.default_rng([seed, 77])
    huge = [1.5e308, -1.5e308, 1e308, -1e308, 2.0**1000, -(2.0**1000)]
    g = UpdateGraph(validate=True)
    src = _keyed(g, [])
    r = agg_by(src, [agg.sum("Price", "S"), agg.mean("Price", "M"), agg.count("N")], by="Sym")
    held: dict[int, tuple[str, float]] = {}
    top = Fraction(np.finfo(np.float64).max)
    for cycle in range(1_500):
        keys = rng.choice(40, int(rng.integers(1, 6)), replace=False)
        rows = []
        for k in keys.tolist():
            px = float(rng.choice(huge)) if rng.random() < 0.15 else rng.integers(-4000, 4000) / 4
            rows.append(("ABC"[int(rng.integers(0, 3))], k, px, 0))
        src.upsert(_batch(rows))
        held.update({k: (s, px) for s, k, px, _ in rows})
        if rng.random() < 0.4 and held:
            gone = rng.choice(sorted(held), min(len(held), int(rng.integers(1, 4))), replace=False)
            src.delete(pa.table({"Key": pa.array(gone, pa.int64())}))
            for k in gone.tolist():
                del held[k]
        g.run_cycle()
        got = {row["Sym"]: row for row in _rows(r)}
        want: dict[str, list[float]] = defaultdict(list)
        for s, px in held.values():
            want[s].append(px)
        assert sorted(got) == sorted(want), (seed, cycle)
        for s, values in want.items():
            exact = sum((Fraction(v) for v in values), Fraction(0))
            total = (math.inf if exact > 0 else -math.inf) if abs(exact) > top else float(exact)
            row = got[s]
            ctx = (seed, cycle, s, values)
            assert row["N"] == len(values), ctx
            if math.isinf(total):
                assert row["S"] == total and row["M"] == total, ctx
            else:
                assert row["S"] == pytest.approx(total, rel=1e-12, abs=1e-9), ctx
                assert row["M"] == pytest.approx(total / len(values), rel=1e-12, abs=1e-9), ctx


def test_integer_sums_are_exact():
    g = UpdateGraph(validate=True)
    big = 2 ** 60
    src = _keyed(g, [("A", 1, 0.0, big), ("A", 2, 0.0, 1), ("A", 3, 0.0, -big)])
    r = agg_by(src, [agg.sum("Qty", "Q"), agg.mean("Qty", "M")], by="Sym")
    assert _rows(r)[0]["Q"] == 1
    src.delete(pa.table({"Key": [3]}))
    g.run_cycle()
    assert _rows(r)[0]["Q"] == big + 1


def test_multi_key_and_float_keys_with_nulls():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, None, 1), ("A", 3, 1.0, 2), (None, 4, None, 1),
                     ("A", 5, -0.0, 1), ("A", 6, 0.0, 1)])
    r = count_by(src, "N", by=["Sym", "Price"])
    assert _rows(r) == [
        {"Sym": "A", "Price": 1.0, "N": 2}, {"Sym": "A", "Price": None, "N": 1},
        {"Sym": None, "Price": None, "N": 1}, {"Sym": "A", "Price": -0.0, "N": 2},
    ]
    r2 = agg_by(src, [agg.count("N")], by=["Qty"])  # an exact integer key
    assert _rows(r2) == [{"Qty": 1, "N": 5}, {"Qty": 2, "N": 1}]


def test_numeric_multi_keys_nan_zero_and_nulls():
    # two fixed-width key columns are compared in numpy: -0.0 is 0.0, NaN is one key, a
    # null is its own key, and distinct keys stay apart when their hashes collide
    g = UpdateGraph(validate=True)
    rows = [("A", 1, 1.0, 1), ("A", 2, None, 1), ("A", 3, 1.0, 2), ("A", 4, None, 1),
            ("A", 5, -0.0, 1), ("A", 6, 0.0, 1), ("A", 7, math.nan, 1), ("A", 8, math.nan, 1)]
    src = _keyed(g, rows)
    r = count_by(src, "N", by=["Price", "Qty"])
    want = [(1.0, 1, 1), (None, 1, 2), (1.0, 2, 1), (0.0, 1, 2), ("nan", 1, 2)]

    def got(t: Table) -> list[tuple[Any, ...]]:
        return [("nan" if isinstance(p, float) and math.isnan(p) else p, q, n)
                for p, q, n in ((row["Price"], row["Qty"], row["N"]) for row in _rows(t))]
    assert got(r) == want
    src.upsert(_batch([("A", 9, math.nan, 1), ("A", 10, 0.0, 1), ("A", 11, None, 2)]))
    src.delete(pa.table({"Key": pa.array([1], pa.int64())}))
    g.run_cycle()
    assert got(r) == [(None, 1, 2), (1.0, 2, 1), (0.0, 1, 3), ("nan", 1, 3), (None, 2, 1)]


def test_first_by_last_by_count_by():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 10), ("B", 2, 2.0, 20), ("A", 3, 3.0, 30)])
    f, last, c = first_by(src, "Sym"), last_by(src, ["Sym"]), count_by(src, "Rows", "Sym")
    assert f.column_names == ["Sym", "Key", "Price", "Qty"]
    assert _rows(f) == [{"Sym": "A", "Key": 1, "Price": 1.0, "Qty": 10}, {"Sym": "B", "Key": 2, "Price": 2.0, "Qty": 20}]
    assert _rows(last)[0] == {"Sym": "A", "Key": 3, "Price": 3.0, "Qty": 30}
    assert _rows(c) == [{"Sym": "A", "Rows": 2}, {"Sym": "B", "Rows": 1}]
    rec = _Recorder(f)
    src.upsert(_batch([("A", 1, 1.0, 11)]))  # the first row's Qty
    g.run_cycle()
    _check(rec.last(), modified=[0], cols={"Qty"})
    src.upsert(_batch([("A", 3, 9.0, 30)]))  # not a first row
    g.run_cycle()
    assert len(rec.updates) == 1


def test_errors_name_the_column_and_the_way_out():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1)])
    with pytest.raises(SchemaError, match="no column 'Pricee'"):
        agg_by(src, [agg.sum("Pricee")], by="Sym")
    with pytest.raises(SchemaError, match="no column 'Symm'"):
        count_by(src, "N", by="Symm")
    with pytest.raises(SchemaError, match="needs a numeric column"):
        agg_by(src, [agg.sum("Sym")])
    with pytest.raises(SchemaError, match="fixed-width"):
        agg_by(src, [agg.max("Sym")])
    with pytest.raises(SchemaError, match="duplicate output"):
        agg_by(src, [agg.sum("Price"), agg.mean("Price")], by="Sym")
    with pytest.raises(SchemaError, match="duplicate output"):
        agg_by(src, [agg.count("Sym")], by="Sym")
    with pytest.raises(SchemaError, match="unknown aggregation"):
        Agg("mode", "Price", "M")
    with pytest.raises(SchemaError, match="Agg values"):
        agg_by(src, ["Price"], by="Sym")  # type: ignore[list-item]
    with pytest.raises(SchemaError, match="at least one"):
        agg_by(src, [])
    assert _rows(agg_by(src, [], by="Sym")) == [{"Sym": "A"}]  # the distinct keys


def test_colliding_key_hashes_are_two_groups(monkeypatch):
    # every key hashes alike: the stored key values tell the groups apart (this used to
    # raise "equal 64-bit hashes"; distinct keys now coexist as distinct groups)
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1)])
    monkeypatch.setattr(aggregate_mod, "hash_columns",
                        lambda arrays, names=None, num_rows=None: np.zeros(num_rows, np.uint64))
    r = count_by(src, "N", by="Sym")
    src.upsert(_batch([("B", 2, 1.0, 1), ("B", 3, 1.0, 1), ("C", 4, 1.0, 1)]))
    g.run_cycle()
    assert r.failure is None
    assert sorted((row["Sym"], row["N"]) for row in _rows(r)) == [("A", 1), ("B", 2), ("C", 1)]
    src.delete(pa.table({"Key": pa.array([1], pa.int64())}))
    g.run_cycle()
    assert sorted((row["Sym"], row["N"]) for row in _rows(r)) == [("B", 2), ("C", 1)]


def test_table_method_and_namespace():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 3.0, 1)])
    r = src.agg_by([agg.mean("Price"), agg.count()], by="Sym")
    assert _rows(r) == [{"Sym": "A", "Price": 2.0, "count": 2}]
    assert src.count_by("N").to_arrow().to_pylist() == [{"N": 2}]
    assert agg.sum("Qty") == Agg("sum", "Qty", "Qty")


# parents that shift -----------------------------------------------------------------------
class _JitterSource(ColumnSource):
    def __init__(self, inner: ColumnSource) -> None:
        self.inner, self.type = inner, inner.type

    def get(self, keys):
        return self.inner.get(keys >> 2)

    def get_prev(self, keys):
        return self.inner.get_prev(keys >> 2)


class _JitterListener:
    """Row ``k`` of the parent is row ``4k + offset(k, version)`` here (0 <= offset < 4)."""

    def __init__(self, parent: Table, offset) -> None:
        self.parent, self.offset, self.version = parent, offset, 0

    def keys(self, k: np.ndarray, version: int) -> np.ndarray:
        return 4 * k + self.offset(k, version)

    def on_update(self, up: TableUpdate) -> TableUpdate:
        v0, v1 = self.version, self.version + 1
        self.version = v1
        kept = (self.parent.prev_rowset - up.removed).keys()
        prev, cur = self.keys(kept, v0), self.keys(kept, v1)
        return TableUpdate.of(
            added=RowSet.from_keys(self.keys(up.added.keys(), v1)),
            removed=RowSet.from_keys(self.keys(up.removed.keys(), v0)),
            modified=RowSet.from_keys(self.keys(up.modified.keys(), v1)),
            shifted=RowSetShiftData.from_moves(prev, cur),
            modified_columns=up.modified_columns,
        )


def _jitter(parent: Table, offset=lambda k, v: (k + v // (1 + k % 5)) % 4) -> Table:
    """Same rows in the same order as ``parent``, on keys that shift every cycle."""
    listener = _JitterListener(parent, offset)
    cols = {n: _JitterSource(parent.column(n)) for n in parent.column_names}
    child = DerivedTable(parent.graph, parent.schema, cols,
                         RowSet.from_keys(listener.keys(parent.rowset.keys(), 0)), parents=[parent])
    child.listener = listener
    return child


def test_first_and_last_follow_parent_shifts():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 10), ("A", 2, 2.0, 20), ("A", 3, 3.0, 30), ("B", 4, 4.0, 40)])
    j = _jitter(src, lambda k, v: np.where(k == 0, v % 4, 0))  # the first row moves every cycle
    r = agg_by(j, [agg.first("Qty", "F"), agg.last("Qty", "L")], by="Sym")
    rec, jrec = _Recorder(r), _Recorder(j)
    assert _keys(r.rowset) == [0, 12]  # the groups' first rows, 4 * 0 and 4 * 3
    src.upsert(_batch([("B", 4, 4.0, 41)]))
    g.run_cycle()
    assert jrec.last().shifted
    _check(rec.last(), modified=[12], cols={"F", "L"}, shifted=[(0, 0, 1)])  # A's first row moved
    src.delete(pa.table({"Key": [1]}))  # after shifts, the first row leaves: the next is found
    g.run_cycle()
    _check(rec.last(), added=[4], removed=[1])
    assert _rows(r) == [{"Sym": "A", "F": 20, "L": 30}, {"Sym": "B", "F": 41, "L": 41}]
    src.upsert(_batch([("A", 1, 1.0, 5)]))  # the reused parent key 0 joins A first again
    g.run_cycle()
    _check(rec.last(), added=[3], removed=[4])
    assert _rows(r) == [{"Sym": "A", "F": 5, "L": 30}, {"Sym": "B", "F": 41, "L": 41}]
    src.upsert(_batch([("B", 4, 4.0, 42)]))
    g.run_cycle()
    _check(rec.last(), modified=[12], cols={"F", "L"}, shifted=[(3, 3, -3)])


# the sorted multiset underneath min/max/first/last ----------------------------------------
def test_live_bits_next_and_prev_set_match_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 63, 64, 65, 4097, 300_000):
        bits, ref = LiveBits(n), np.ones(n, dtype=bool)
        for _ in range(4):
            off = rng.choice(n, size=min(n, int(rng.integers(1, 3000))), replace=False)
            bits.clear(np.sort(off))
            ref[off] = False
            on = rng.choice(n, size=min(n, int(rng.integers(1, 300))), replace=False)
            bits.set(np.sort(on))
            ref[on] = True
            q = rng.integers(0, n, 500)
            live = np.flatnonzero(ref)
            i = np.searchsorted(live, q)
            assert (bits.next_set(q) == np.where(i < live.size, live[np.minimum(i, live.size - 1)], -1)).all()
            j = np.searchsorted(live, q, "right") - 1
            assert (bits.prev_set(q) == np.where(j >= 0, live[np.maximum(j, 0)], -1)).all()


@pytest.mark.parametrize("merge_min", [2, 4096])
def test_value_multiset_matches_a_counter_model(monkeypatch, merge_min):
    monkeypatch.setattr(_Sorted, "MERGE_MIN", merge_min)
    rng = np.random.default_rng(merge_min)
    ms, model = ValueMultiset(), defaultdict(Counter)
    for _ in range(200):
        n = int(rng.integers(1, 200))
        g, v = rng.integers(0, 20, n), rng.integers(0, 30, n).astype(np.uint64)
        items = [(a, b) for a, c in model.items() for b, k in c.items() for _ in range(k)]
        pick = rng.choice(len(items), min(len(items), int(rng.integers(0, 150))), replace=False) if items else []
        rg = np.array([items[i][0] for i in pick], dtype=np.int64)
        rv = np.array([items[i][1] for i in pick], dtype=np.uint64)
        ms.update(np.concatenate((g, rg)), np.concatenate((v, rv)),
                  np.concatenate((np.ones(n, np.int64), -np.ones(rg.size, np.int64))))
        for a, b in zip(g.tolist(), v.tolist(), strict=True):
            model[a][b] += 1
        for a, b in zip(rg.tolist(), rv.tolist(), strict=True):
            model[a][b] -= 1
            if not model[a][b]:
                del model[a][b]
        qs = np.arange(25)
        (lo, f1), (hi, f2) = ms.min_of(qs), ms.max_of(qs)
        for q in qs.tolist():
            c = model.get(q)
            assert (bool(f1[q]), bool(f2[q])) == (bool(c), bool(c))
            if c:
                assert (int(lo[q]), int(hi[q])) == (min(c), max(c))
        assert len(ms) == sum(len(c) for c in model.values())


@pytest.mark.parametrize("inserts_first", [0, 60])
@pytest.mark.parametrize("scan", [0, 40, 1 << 30])
@pytest.mark.parametrize("merge_min", [2, 4096])
def test_row_key_set_follows_shifts(monkeypatch, merge_min, scan, inserts_first):
    # scan: the tail is sorted into the delta before every query (0); queries of 4 groups
    # scan it up to 40 entries, those of 12 sort it in (40); or only merges sort it in
    # (huge: every query scans it). inserts_first: that many steps only insert, anywhere
    # (the flat layout), before the first remove or shift builds the entries
    monkeypatch.setattr(_Sorted, "MERGE_MIN", merge_min)
    monkeypatch.setattr(RowKeySet, "SCAN_MAX", scan)
    monkeypatch.setattr(RowKeySet, "SCAN_GROUPS", 4 if scan == 40 else scan)
    rng = np.random.default_rng([merge_min, scan, inserts_first])
    ms, group = RowKeySet(), {}
    for step in range(200):
        if step < inserts_first:  # keys anywhere below 5,000 not held yet
            free = np.setdiff1d(np.arange(5_000), np.fromiter(group, dtype=np.int64, count=len(group)))
            add = rng.choice(free, int(rng.integers(0, 40)), replace=False).astype(np.int64)
            ag = rng.integers(0, 10, add.size)
            ms.insert_keys(ag, add)
            group.update(zip(add.tolist(), ag.tolist(), strict=True))
            _check_row_key_set(ms, group, rng)
            continue
        keys = np.array(sorted(group), dtype=np.int64)
        gone = np.sort(rng.choice(keys, min(keys.size, int(rng.integers(0, 20))), replace=False)) if keys.size else keys
        assert ms.groups_of(gone).tolist() == [group.pop(k) for k in gone.tolist()]
        ms.remove_keys(gone)
        keys = np.array(sorted(group), dtype=np.int64)
        if keys.size and rng.random() < 0.5:
            new = keys + np.cumsum(rng.integers(0, 3, keys.size))  # order-preserving moves
            mv = new != keys
            ms.shift(keys[mv], new[mv])
            group = {n: group[k] for k, n in zip(keys.tolist(), new.tolist(), strict=True)}
        top = max(group) + 1 if group else 0
        add = np.arange(top, top + int(rng.integers(0, 25)), dtype=np.int64)
        ag = rng.integers(0, 10, add.size)
        ms.insert_keys(ag, add)
        group.update(zip(add.tolist(), ag.tolist(), strict=True))
        _check_row_key_set(ms, group, rng)


def _spy_scans(monkeypatch) -> list[bool]:
    """Record each ``RowKeySet._scan`` from now on: whether it found the group's end."""
    scans: list[bool] = []
    real_scan = RowKeySet._scan

    def spy(self, g, largest):
        ok = real_scan(self, g, largest)
        scans.append(ok)
        return ok

    monkeypatch.setattr(RowKeySet, "_scan", spy)
    return scans


@pytest.mark.parametrize("budget", ["ample", "small slices", "runs out", "none", "hashed"])
def test_row_key_set_stays_flat_through_removes_by_scans(monkeypatch, budget):
    # flat_removes: removes only unmap keys, queries check each group's bound in the map
    # and scan the dense window from it (slices of 8 keys at least, doubling) where the
    # group lost that key. "ample": every scan is paid for, the set stays flat for good
    # ("small slices": too, its scans in slices of 1, 2, 4, ... keys from the bound);
    # "runs out": a few scans, then one would overdraw and the entries are built from the
    # map mid-run; "none": the first scan builds them; "hashed": the map is never dense,
    # so the first scan does. Keys are reused across groups, groups empty and refill;
    # every answer against a dict model, and the last fifth of the steps shift rows too
    from engine._kernels import rowkeymap
    small = budget == "small slices"
    monkeypatch.setattr(RowKeySet, "SCAN_WIDTH", 1 if small else 8)
    monkeypatch.setattr(RowKeySet, "SCAN_GAPS", 0 if small else 2)
    if small:
        budget = "ample"
    monkeypatch.setattr(RowKeySet, "SCAN_CREDIT", {"ample": 1 << 20, "runs out": 8}.get(budget, 0))
    monkeypatch.setattr(RowKeySet, "SCAN_SLACK", {"ample": 1 << 20, "runs out": 100_000}.get(budget, 0))
    if budget == "hashed":
        monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)
    rng = np.random.default_rng(["ample", "runs out", "none", "hashed"].index(budget) + 4 * small)
    ms, group = RowKeySet(flat_removes=True), {}
    scans = _spy_scans(monkeypatch)
    for step in range(250):
        keys = np.array(sorted(group), dtype=np.int64)
        gone = rng.choice(keys, min(keys.size, int(rng.integers(0, 30))), replace=False) if keys.size else keys
        want = [group.pop(k) for k in gone.tolist()]
        if step % 2:
            assert ms.discard_keys(np.append(gone, 10**6)).tolist() == [*want, -1]
        else:
            ms.remove_keys(gone)
        if step >= 200 and group and rng.random() < 0.5:  # order-preserving moves
            keys = np.array(sorted(group), dtype=np.int64)
            new = keys + np.cumsum(rng.integers(0, 3, keys.size))
            mv = new != keys
            ms.shift(keys[mv], new[mv])
            group = {n: group[k] for k, n in zip(keys.tolist(), new.tolist(), strict=True)}
        free = np.setdiff1d(np.arange(3_000), np.fromiter(group, dtype=np.int64, count=len(group)))
        add = rng.choice(free, int(rng.integers(0, 30)), replace=False).astype(np.int64)
        ag = rng.integers(0, 10, add.size)  # groups of ~30 rows over 3,000 keys: gaps of ~100
        ms.insert_keys(ag, add)
        group.update(zip(add.tolist(), ag.tolist(), strict=True))
        _check_row_key_set(ms, group, rng)
        if step == 199:  # before any shift: flat for good only when every scan was paid for
            assert ms._flat == (budget == "ample"), budget
    assert True in scans if budget in ("ample", "runs out") else True not in scans
    assert (False in scans) == (budget != "ample")


def _check_row_key_set(ms: RowKeySet, group: dict[int, int], rng: np.random.Generator) -> None:
    """``ms`` holds exactly ``group`` (row key -> group): size, groups, first and last rows."""
    members = defaultdict(list)
    for k, gg in group.items():
        members[gg].append(k)
    assert len(ms) == len(group)
    keys = np.fromiter(group, dtype=np.int64, count=len(group))
    assert ms.groups_of(np.append(keys, 10**7)).tolist() == [*group.values(), -1]
    for qs in (np.arange(12), rng.integers(0, 12, 4)):  # every group; a few, repeated
        (lo, f1), (hi, _) = ms.min_of(qs), ms.max_of(qs)
        for i, q in enumerate(qs.tolist()):
            assert bool(f1[i]) == bool(members.get(q))
            if members.get(q):
                assert (int(lo[i]), int(hi[i])) == (min(members[q]), max(members[q]))
