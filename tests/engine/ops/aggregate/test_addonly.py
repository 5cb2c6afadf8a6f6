"""agg_by over an add-only parent (engine.ops.aggregate._addonly): min/max keep a running
value per group, first/last each group's first and last row key, with no sorted state.

Examples first: which tables are add-only, which states a parent gets, exact values with
nulls, NaN, -0.0 and strings (and the same rows as the sorted states give over a keyed
table fed the same adds), a parent that breaks its promise failing the table. Then the
oracle: thousands of cycles over append-only sources (and a where, and a computed column
with infinities and NaN), validated and recomputed every cycle.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tests.oracle as oracle
from engine._kernels import rowkeymap
from engine.errors import TableFailed, UpdateInvariantError
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.ops.aggregate import listener as _agglistener
from engine.ops.aggregate._addonly import RowEnds, RunningExtremes
from engine.ops.aggregate._states import Events, OrderStats
from engine.ops.aggregate.listener import agg_by
from engine.ops.join.listener import exact_join, join, left_outer_join, natural_join
from tests.engine.ops.aggregate.test_aggregate import (
    SCHEMA,
    _batch,
    _check,
    _keyed,
    _Recorder,
    _rows,
)
from tests.engine.ops.aggregate.test_aggregate_oracle import _Case, _run_cases
from tests.engine.ops.aggregate.test_kinds import ON_R, R, _Reference

EXTREMES = [agg.min("Price", "Lo"), agg.max("Price", "Hi"), agg.first("Price", "F"), agg.last("Sym", "L")]


def _classes(table) -> set[type]:
    return {type(s) for s in table.listener.states.values()}


# which tables are add-only ----------------------------------------------------------------
def test_append_only_tables_where_and_column_ops_are_add_only_nothing_else():
    g = UpdateGraph()
    t = g.append_only_table(SCHEMA)
    derived = [t.where(pc.field("Price") > 1), t.update(P2=pc.field("Price") * 2), t.view("Sym", "Price"),
               t.select("Sym", P=pc.field("Price")), t.drop_columns("Qty"), t.rename_columns({"Qty": "Q"}),
               t.where(pc.field("Qty") > 0).update(Z=pc.field("Qty") + 1)]
    assert t.add_only and all(d.add_only for d in derived)
    keyed, ring = g.keyed_table(SCHEMA, "Key"), g.ring_table(SCHEMA, 4)
    not_add_only = [keyed, ring, keyed.where(pc.field("Price") > 1), ring.update(P2=pc.field("Price") * 2),
                    t.sort("Price"), t.head(3), t.tail(3), agg_by(t, agg.count("N"), "Sym"), t.merge(g.append_only_table(SCHEMA))]
    assert not any(d.add_only for d in not_add_only)


def test_inner_joins_of_insert_only_parents_and_where_over_them_are_insert_only_nothing_else():
    g = UpdateGraph()
    a, b = g.append_only_table(SCHEMA), g.append_only_table(SCHEMA)
    keyed, ring = g.keyed_table(SCHEMA, "Key"), g.ring_table(SCHEMA, 4)
    ab = join(a, b, "Sym", joins=["K2=Key"])
    insert_only = [a, ab, ab.where(pc.field("Price") > 1), join(ab, a, "Qty", joins=["K3=Key"])]
    assert all(t.insert_only for t in insert_only) and not any(t.add_only for t in insert_only[1:])
    # a right row arriving modifies (natural) or removes (outer: the null row) a left row's
    # row; a keyed or ring parent removes and modifies
    not_insert_only = [
        natural_join(a, b, "Key", joins=["P2=Price"]), exact_join(a, b, "Key", joins=["P2=Price"]),
        left_outer_join(a, b, "Sym", joins=["K2=Key"]), join(a, keyed, "Sym", joins=["K2=Key"]),
        join(keyed, a, "Sym", joins=["K2=Key"]), join(a, ring, "Sym", joins=["K2=Key"]),
        join(left_outer_join(a, b, "Sym", joins=["K2=Key"]), a, "Qty", joins=["K3=Key"]),
        keyed.where(pc.field("Price") > 1), agg_by(ab, agg.count("N"), "Sym"), ab.sort("Price"),
        ab.merge(a.update(K2=pc.field("Key"))),
    ]
    assert not any(t.insert_only for t in not_insert_only)
    # min/max run over the insert-only join; first/last keep the row-key set (rows arrive
    # anywhere in it), the others the sorted states
    assert _classes(agg_by(ab, EXTREMES, "Sym")) == {RunningExtremes}
    assert _classes(agg_by(ab.where(pc.field("Price") > 1), EXTREMES)) == {RunningExtremes}
    for parent in not_insert_only[:3]:
        assert _classes(agg_by(parent, EXTREMES, "Sym")) == {OrderStats}


def test_add_only_parents_get_running_states_others_the_sorted_ones():
    g = UpdateGraph()
    t = g.append_only_table(SCHEMA)
    with_median = EXTREMES + [agg.median("Price", "Mid")]
    r = agg_by(t, with_median, "Sym")
    assert _classes(r) == {RunningExtremes, RowEnds, OrderStats}  # median keeps its sorted state
    assert r.listener.firsts is not None and r.listener.rows is None  # groups' first rows only
    assert _classes(agg_by(t.where(pc.field("Price") > 1), EXTREMES, "Sym")) == {RunningExtremes, RowEnds}
    whole = agg_by(t, EXTREMES)
    assert _classes(whole) == {RunningExtremes, RowEnds} and whole.listener.rows is None  # no row-key set
    for parent in (g.keyed_table(SCHEMA, "Key"), g.ring_table(SCHEMA, 4)):
        for by in ("Sym", ()):
            res = agg_by(parent, EXTREMES, by)
            assert _classes(res) == {OrderStats} and res.listener.rows is not None
            assert res.listener.firsts is None


# exact values -----------------------------------------------------------------------------
def test_min_max_first_last_skip_nulls_and_nan_like_the_sorted_states():
    g = UpdateGraph(validate=True)
    t = g.append_only_table(SCHEMA)
    r = agg_by(t, EXTREMES + [agg.first("Qty", "FQ"), agg.last("Price", "LP")], "Sym")
    rec = _Recorder(r)
    t.append(_batch([("A", 0, None, 1), ("B", 1, math.nan, 2), ("A", 2, 3.0, 3)]))
    g.run_cycle()
    got = _rows(r)
    assert math.isnan(got[1].pop("F")) and math.isnan(got[1].pop("LP"))  # first/last keep NaN
    assert got == [{"Sym": "A", "Lo": 3.0, "Hi": 3.0, "F": None, "L": "A", "FQ": 1, "LP": 3.0},
                   {"Sym": "B", "Lo": None, "Hi": None, "L": "B", "FQ": 2}]  # min/max skip it
    t.append(_batch([("B", 3, -0.0, 4), ("A", 4, None, 5), ("B", 5, 0.0, 6), (None, 6, 1.0, 7)]))
    g.run_cycle()
    got = _rows(r)
    assert got[0] == {"Sym": "A", "Lo": 3.0, "Hi": 3.0, "F": None, "L": "A", "FQ": 1, "LP": None}
    # -0.0 is 0.0, as the sorted state stores it
    assert [math.copysign(1, got[1][c]) for c in ("Lo", "Hi")] == [1.0, 1.0] and got[1]["Lo"] == 0.0
    assert (got[1]["FQ"], got[1]["LP"]) == (2, 0.0) and got[2] == {
        "Sym": None, "Lo": 1.0, "Hi": 1.0, "F": 1.0, "L": None, "FQ": 7, "LP": 1.0}
    # A: only LP changed (a null last price); B: Lo, Hi and LP; the null group is new at key 6
    _check(rec.last(), added=[6], modified=[0, 1], cols=["Hi", "LP", "Lo"])


def test_same_rows_as_the_sorted_states_over_a_keyed_table_fed_the_same_adds():
    specs = [agg.min(c, f"Lo{c}") for c in ("Price", "Qty", "Key")] + \
        [agg.max(c, f"Hi{c}") for c in ("Price", "Qty", "Key")] + \
        [agg.first(c, f"F{c}") for c in ("Sym", "Price")] + [agg.last(c, f"L{c}") for c in ("Sym", "Price")]
    g = UpdateGraph(validate=True)
    t, k = g.append_only_table(SCHEMA), _keyed(g, [])
    pairs = [(agg_by(t, specs, by), agg_by(k, specs, by)) for by in ("Sym", (), ["Sym", "Qty"])]
    rng = np.random.default_rng(5)
    src = oracle.RandomSource(g, "append", rng, max_rows=50)
    for _ in range(120):
        rows = src._rows(int(rng.integers(0, 20)))
        price = rows.column("Price").to_numpy(zero_copy_only=False).copy()
        price[rng.random(price.size) < 0.1] = -0.0
        rows = rows.set_column(2, "Price", pa.array(price, pa.float64(), mask=rng.random(price.size) < 0.1))
        t.append(rows)
        k.upsert(rows)
        g.run_cycle()
        for fast, slow in pairs:
            assert _classes(fast) == {RunningExtremes, RowEnds}
            assert _bits(fast) == _bits(slow)  # NaN, -0.0 and nulls alike


def _bits(table) -> list[list[object]]:
    """The table's values, floats as their bits (so NaN equals NaN and -0.0 is not 0.0)."""
    out = table.to_arrow()
    return [[None if v is None else math.copysign(1, v) * abs(v) if v == v else "nan" for v in c.to_pylist()]
            if pa.types.is_floating(c.type) else c.to_pylist() for c in out.columns]


def test_strings_bools_and_timestamps():
    g = UpdateGraph(validate=True)
    schema = pa.schema([("G", pa.int64()), ("S", pa.string()), ("B", pa.bool_()), ("T", pa.timestamp("ns"))])
    t = g.append_only_table(schema)
    r = agg_by(t, [agg.min("B", "LoB"), agg.max("T", "HiT"), agg.first("S", "FS"), agg.last("S", "LS")], "G")
    t.append(pa.table({"G": [1, 1, 2], "S": ["x", None, "y"], "B": [True, None, False],
                       "T": pa.array([5, None, 7], pa.timestamp("ns"))}))
    g.run_cycle()
    t.append(pa.table({"G": [2, 1], "S": ["z", "w"], "B": [True, False], "T": pa.array([3, 9], pa.timestamp("ns"))}))
    g.run_cycle()
    got = r.to_arrow()
    assert got.column("LoB").to_pylist() == [False, False]
    assert got.column("HiT").cast(pa.int64()).to_pylist() == [9, 7]
    assert got.column("FS").to_pylist() == ["x", "y"] and got.column("LS").to_pylist() == ["w", "z"]


# a parent that breaks its promise ---------------------------------------------------------
@pytest.mark.parametrize("write", ["delete", "modify", "add below"])
def test_a_parent_that_is_not_add_only_after_all_fails_the_table(write):
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 2.0, 1), ("B", 3, 5.0, 1)])
    if write == "add below":
        src.delete(pa.table({"Key": [1]}))  # its row key is free for the next new key
        g.run_cycle()
    src.add_only = True  # a false promise
    r = agg_by(src, EXTREMES, "Sym")
    assert RunningExtremes in _classes(r)
    if write == "delete":
        src.delete(pa.table({"Key": [2]}))
    elif write == "modify":
        src.upsert(_batch([("A", 2, 9.0, 1)]))
    else:
        src.upsert(_batch([("B", 4, 0.0, 1)]))
    g.run_cycle()
    _failed_for(r, src, "add-only", write)


@pytest.mark.parametrize("write", ["delete", "modify"])
def test_a_parent_that_is_not_insert_only_after_all_fails_the_table(write):
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 1), ("A", 2, 2.0, 1), ("B", 3, 5.0, 1)])
    src._insert_only = True  # a false promise
    r = agg_by(src, EXTREMES, "Sym")
    assert _classes(r) == {RunningExtremes}
    src.upsert(_batch([("A", 5, 0.0, 1)]))  # an add is kept
    g.run_cycle()
    assert r.failure is None and _rows(r)[0]["Lo"] == 0.0
    if write == "delete":
        src.delete(pa.table({"Key": [2]}))
    else:
        src.upsert(_batch([("A", 2, 9.0, 1)]))
    g.run_cycle()
    _failed_for(r, src, "insert-only", write)


def _failed_for(r, src, promise: str, write: str) -> None:
    """``r`` failed, naming itself, its parent, the broken promise and the write."""
    assert isinstance(r.failure, TableFailed)
    msg = str(r.failure)
    assert repr(r.name) in msg and repr(src.name) in msg and promise in msg
    assert {"delete": "removes", "modify": "modifies", "add below": "adds below"}[write] in msg


def test_add_only_states_refuse_rows_leaving_groups():
    ev = Events(np.array([3]), np.array([0]), np.array([4]), np.array([0]))
    with pytest.raises(UpdateInvariantError, match="add-only"):
        RunningExtremes(np.dtype(np.float64), True, True).apply(ev, [(np.array([1.0]), None)],
                                                                [(np.array([2.0]), None)])
    with pytest.raises(UpdateInvariantError, match="add-only"):
        RowEnds().apply(ev, [], [])


# the oracle -------------------------------------------------------------------------------
def _fast(build):
    """``build``, checked to run on the add-only states."""
    def run(t):
        r = build(t)
        assert {RunningExtremes, RowEnds} <= _classes(r), _classes(r)
        return r
    return run


ALL_ENDS = [agg.min("Price", "LoP"), agg.max("Price", "HiP"), agg.min("Qty", "LoQ"), agg.max("Qty", "HiQ"),
            agg.max("Key", "HiK"), agg.first("Sym", "FS"), agg.last("Sym", "LS"), agg.first("Price", "FP"),
            agg.last("Price", "LP"), agg.first("Qty", "FQ"), agg.last("Key", "LK"), agg.count("N"),
            agg.sum("Qty", "S")]


def test_oracle_add_only_min_max_first_last_over_append_sources():
    two = ALL_ENDS[:4] + [agg.first("Key", "FK"), agg.last("Price", "LP")]
    above = pc.field("Price") > 40
    cases = {
        "by sym": _Case(_fast(lambda t: agg_by(t, ALL_ENDS, "Sym")), ["Sym"], ALL_ENDS),
        "zero keys": _Case(_fast(lambda t: agg_by(t, ALL_ENDS)), [], ALL_ENDS),
        "two keys": _Case(_fast(lambda t: agg_by(t, two, ["Sym", "Qty"])), ["Sym", "Qty"], two),
        "where": _Case(_fast(lambda t: agg_by(t.where(above), ALL_ENDS, "Sym")), ["Sym"], ALL_ENDS, where=above),
    }
    _run_cases(cases, seed=41, kinds=("append",), max_rows=1000)


def test_oracle_add_only_min_max_over_infinities_and_nan():
    ends = [agg.min("R", "LoR"), agg.max("R", "HiR")]
    cases = {
        "specials": _Reference(lambda t: agg_by(t.update(R=R), ON_R + ends, "Sym"), ["Sym"], ON_R + ends, with_r=True),
        "zero keys": _Reference(lambda t: agg_by(t.update(R=R), ends), [], ends, with_r=True),
    }
    for case in cases.values():
        case.build = _running(case.build)
    _run_cases(cases, seed=42, kinds=("append",), max_rows=150)


def _running(build):
    def run(t):
        r = build(t)
        assert RunningExtremes in _classes(r)
        return r
    return run


@pytest.mark.parametrize("firsts", [True, False], ids=["first-rows", "row-key-set"])
def test_oracle_add_only_groups_by_first_rows_switched_on_and_off(monkeypatch, firsts):
    """A ``by`` over an add-only parent keeps each group's first row, not every row's
    group; switched off, the row-key set: the same oracle, shorter, both ways."""
    monkeypatch.setattr(_agglistener, "FIRSTS_OVER_APPENDS", firsts)
    monkeypatch.setenv("TICKTABLE_CYCLES", "150")
    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)  # the maps turn hashed
    monkeypatch.setattr(_agglistener, "FIRSTS_DENSE_RATIO", 0)
    sums = [agg.count("N"), agg.sum("Qty", "S"), agg.max("Price", "Hi")]

    def checked(build):
        def run(t):
            r = build(t)
            assert (r.listener.firsts is not None) is firsts and (r.listener.rows is None) is firsts
            hashed.append(r.listener.firsts)
            return r
        return run

    two = ALL_ENDS[:4] + [agg.first("Key", "FK"), agg.last("Price", "LP")]
    cases = {
        "by sym": _Case(checked(lambda t: agg_by(t, sums, "Sym")), ["Sym"], sums),
        "two keys": _Case(checked(lambda t: agg_by(t, two, ["Sym", "Qty"])), ["Sym", "Qty"], two),
    }
    hashed: list = []
    _run_cases(cases, seed=43, kinds=("append",), max_rows=200)
    assert not firsts or any(m.hashed for m in hashed)
