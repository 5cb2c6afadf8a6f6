"""sorted_first / sorted_last (engine.ops.aggregate._ordered, and BestRows over add-only
parents): the value in each group's first/last row in the order of another column.

Examples first: exact updates, ties by row key, null/NaN/-0.0 order values, strings sharing
long prefixes, parent shifts, the states each parent gets, the errors. Then the oracle:
thousands of cycles over keyed, append-only and ring sources (zero, one and two keys, a
parent that shifts every cycle with the sorted structures merging every few changes, a
where, add-only parents), with numeric and string value and order columns — ``R`` with
infinities, NaN, -0.0 and nulls, ``LS`` strings over several words, prefixes of each other
— validated and recomputed every cycle (the plain-Python reference of test_kinds).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tests.oracle as oracle
from engine.errors import SchemaError, UpdateInvariantError
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.ops.aggregate._addonly import BestRows, BestStrings
from engine.ops.aggregate._ordered import OrderedRows, OrderedStrings
from engine.ops.aggregate._sortedset import ValueMultiset, _Sorted
from engine.ops.aggregate.listener import Agg, agg_by
from engine.ops.aggregate.spec import make_agg
from tests.engine.ops.aggregate.test_aggregate import (
    _batch,
    _check,
    _jitter,
    _keyed,
    _Recorder,
    _rows,
)
from tests.engine.ops.aggregate.test_aggregate_oracle import _Case, _run_cases
from tests.engine.ops.aggregate.test_kinds import R

#: strings over several 7-byte words (a shared 22-byte prefix), prefixes of each other
#: ("/AAPL/1" and "/AAPL/12"), short ones below 10, null where Sym is
LS = pc.if_else(pc.field("Qty") < 10, pc.field("Sym"),
                pc.binary_join_element_wise(pc.scalar("instrument:long-prefix"), pc.field("Sym"),
                                            pc.field("Qty").cast(pa.string()), pc.scalar("/")))
EXTRA = {"R": R, "LS": LS}


def _classes(table) -> set[type]:
    return {type(s) for s in table.listener.states.values()}


def _derived(t):
    return t.update(R=R, LS=LS)


# example tests ----------------------------------------------------------------------------
def test_the_row_with_the_highest_price_per_group_and_its_updates():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 10.0, 100), ("A", 2, 12.0, 200), ("B", 3, 5.0, 300), ("A", 4, 11.0, 400),
                     ("B", 5, 4.0, 7), ("B", 6, 4.5, 8)])  # row keys 0..5
    r = agg_by(src, [agg.sorted_last("Qty", order="Price", name="AtHi"),
                     agg.sorted_first("Key", order="Price", name="LoKey")], by="Sym")
    rec = _Recorder(r)
    assert _rows(r) == [{"Sym": "A", "AtHi": 200, "LoKey": 1}, {"Sym": "B", "AtHi": 300, "LoKey": 5}]
    src.upsert(_batch([("A", 4, 13.0, 400)]))  # a new highest price
    g.run_cycle()
    _check(rec.last(), modified=[0], cols=["AtHi"])  # the groups' row keys: their first rows' (0, 2)
    src.delete(pa.table({"Key": [4, 1]}))  # the highest and the lowest leave: the next ones
    g.run_cycle()
    assert _rows(r)[0] == {"Sym": "A", "AtHi": 200, "LoKey": 2}
    _check(rec.last(), removed=[0], added=[1])  # A's first row left: a new row key
    src.upsert(_batch([("B", 6, 1.0, 8)]))  # B's lowest price changes, its highest does not
    g.run_cycle()
    _check(rec.last(), modified=[2], cols=["LoKey"])
    src.upsert(_batch([("A", 2, 12.0, 250)]))  # the value column of the chosen row
    g.run_cycle()
    _check(rec.last(), modified=[1], cols=["AtHi"])
    n = len(rec.updates)
    src.upsert(_batch([("B", 5, 4.0, 9)]))  # a row no aggregation shows: silent
    g.run_cycle()
    assert len(rec.updates) == n or not rec.last().modified
    assert _rows(r) == [{"Sym": "A", "AtHi": 250, "LoKey": 2}, {"Sym": "B", "AtHi": 300, "LoKey": 6}]


def test_ties_go_to_the_first_row_for_first_and_the_last_for_last():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 2.0, 1), ("A", 2, 1.0, 2), ("A", 3, 2.0, 3), ("A", 4, 1.0, 4), ("A", 5, None, 5)])
    specs = [agg.sorted_first("Qty", "Price", "F"), agg.sorted_last("Qty", "Price", "L")]
    r = agg_by(src, specs, by="Sym")
    assert _rows(r) == [{"Sym": "A", "F": 2, "L": 3}]
    # as a stable sort then first_by / last_by, over the rows with a price
    s = src.where(pc.is_valid(pc.field("Price"))).sort("Price")
    assert (s.first_by("Sym").to_arrow()["Qty"][0].as_py(), s.last_by("Sym").to_arrow()["Qty"][0].as_py()) == (2, 3)
    src.delete(pa.table({"Key": [2, 3]}))
    g.run_cycle()
    assert _rows(r) == [{"Sym": "A", "F": 4, "L": 1}]


def test_null_nan_and_signed_zero_order_values():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, None, 1), ("A", 2, float("nan"), 2), ("B", 3, -0.0, 3), ("B", 4, 0.0, 4),
                     ("B", 5, float("nan"), 5), ("C", 6, float("-inf"), 6), ("C", 7, float("inf"), 7)])
    r = agg_by(src, [agg.sorted_first("Qty", "Price", "F"), agg.sorted_last("Qty", "Price", "L"),
                     agg.sorted_last("Price", "Qty", "PL")], by="Sym")
    # A has no order value: null; -0.0 ties with 0.0; NaN is skipped like null
    a, b, c = _rows(r)
    assert (a["F"], a["L"]) == (None, None) and np.isnan(a["PL"])  # PL: row 2's price, NaN as it is
    assert (b["F"], b["L"]) == (3, 4) and np.isnan(b["PL"])  # B's last by Qty is row 5, a NaN price
    assert c == {"Sym": "C", "F": 6, "L": 7, "PL": float("inf")}
    src.upsert(_batch([("A", 2, 3.0, 2)]))  # A gets an order value
    g.run_cycle()
    assert _rows(r)[0] == {"Sym": "A", "F": 2, "L": 2, "PL": 3.0}


def test_strings_order_bytewise_over_several_words():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(pa.schema([("G", pa.int64()), ("K", pa.int64()), ("S", pa.string()), ("V", pa.string())]), "K")
    long = "instrument:long-prefix/"
    names = [long + "b", long + "a", long, long + "ab", "z", "", None, long + "a" * 20, long + "a"]
    t.upsert(pa.table({"G": [0] * len(names), "K": list(range(len(names))), "S": names,
                       "V": [f"v{i}" for i in range(len(names))]}))
    g.run_cycle()
    r = agg_by(t, [agg.sorted_first("V", "S", "F"), agg.sorted_last("V", "S", "L"),
                   agg.sorted_last("S", "S", "SL")], by="G")
    assert _classes(r) == {OrderedStrings}
    assert _rows(r) == [{"G": 0, "F": "v5", "L": "v4", "SL": "z"}]  # "" first, "z" last
    t.delete(pa.table({"K": [5, 4]}))
    g.run_cycle()
    assert _rows(r) == [{"G": 0, "F": "v2", "L": "v0", "SL": long + "b"}]
    t.delete(pa.table({"K": [2, 0]}))
    g.run_cycle()
    # long + "a" twice (rows 1 and 8): first is row 1, last is long + "ab" (row 3)
    assert _rows(r) == [{"G": 0, "F": "v1", "L": "v3", "SL": long + "ab"}]
    t.delete(pa.table({"K": [1, 3]}))
    g.run_cycle()
    assert _rows(r) == [{"G": 0, "F": "v8", "L": "v7", "SL": long + "a" * 20}]


def test_order_rows_follow_parent_shifts():
    g = UpdateGraph(validate=True)
    src = _keyed(g, [("A", 1, 1.0, 10), ("A", 2, 3.0, 20), ("A", 3, 3.0, 30), ("B", 4, 4.0, 40)])
    r = agg_by(_jitter(src), [agg.sorted_last("Qty", "Price", "L"), agg.sorted_first("Key", "Price", "F")], "Sym")
    for step in range(6):  # every cycle moves the rows; some cycles change nothing else
        if step % 2:
            src.upsert(_batch([("A", 10 + step, float(step), step)]))
        g.run_cycle()
    want = agg_by(_jitter(src), [agg.sorted_last("Qty", "Price", "L"), agg.sorted_first("Key", "Price", "F")], "Sym")
    assert _rows(r) == _rows(want) == [{"Sym": "A", "L": 5, "F": 1}, {"Sym": "B", "L": 40, "F": 4}]


def test_states_add_only_parents_get_best_rows_others_ordered_rows():
    g = UpdateGraph()
    specs = [agg.sorted_first("Qty", "Price", "F"), agg.sorted_last("Sym", "Price", "L"),
             agg.sorted_last("Qty", "Sym", "LS")]
    t = g.append_only_table(oracle.SCHEMA)
    r = agg_by(t, specs, "Sym")
    assert _classes(r) == {BestRows, BestStrings}  # one state per order column
    for parent in (g.keyed_table(oracle.SCHEMA, "Key"), g.ring_table(oracle.SCHEMA, 4)):
        res = agg_by(parent, specs, "Sym")
        assert _classes(res) == {OrderedRows, OrderedStrings}
        assert len(res.listener.states) == 2


def test_add_only_best_rows_match_the_ordered_rows():
    g = UpdateGraph(validate=True)
    a, k = g.append_only_table(oracle.SCHEMA), g.keyed_table(oracle.SCHEMA, "Key")
    specs = [agg.sorted_first("Qty", "Price", "F"), agg.sorted_last("Qty", "Price", "L"),
             agg.sorted_first("Key", "Sym", "FS"), agg.sorted_last("Price", "Sym", "LS")]
    ra, rk = agg_by(a, specs, "Qty"), agg_by(k, specs, "Qty")
    rows = [("B", 0, 2.0, 1), ("A", 1, 2.0, 1), (None, 2, None, 1), ("A", 3, 1.0, 2), ("C", 4, 2.0, 1)]
    for i in range(0, len(rows), 2):
        a.append(_batch(rows[i:i + 2]))
        k.upsert(_batch(rows[i:i + 2]))
        g.run_cycle()
        assert _rows(ra) == _rows(rk)
    assert _rows(ra) == [{"Qty": 1, "F": 1, "L": 1, "FS": 1, "LS": 2.0}, {"Qty": 2, "F": 2, "L": 2, "FS": 3, "LS": 1.0}]


def test_parameters_and_types_are_checked():
    with pytest.raises(SchemaError, match="needs a order"):
        Agg("sorted_first", "Qty", "Q")
    with pytest.raises(SchemaError, match="takes no order"):
        Agg("sum", "Qty", "Q", order="Price")
    assert make_agg("sorted_last", "Qty", order="Price") == agg.sorted_last("Qty", "Price")
    g = UpdateGraph()
    t = g.keyed_table(pa.schema([("K", pa.int64()), ("L", pa.list_(pa.int64()))]), "K")
    with pytest.raises(SchemaError, match="order column of numbers"):
        agg_by(t, agg.sorted_first("K", "L"))
    with pytest.raises(SchemaError, match="has no column 'Nope'"):
        agg_by(t, agg.sorted_first("K", "Nope"))


def test_ordered_rows_refuse_rows_they_do_not_hold():
    g = UpdateGraph()
    src = _keyed(g, [("A", 1, 1.0, 1)])
    r = agg_by(src, agg.sorted_first("Qty", "Price", "F"), "Sym")
    (state,) = r.listener.states.values()
    with pytest.raises(UpdateInvariantError):
        state._count(np.array([0, 0], dtype=np.int64), np.array([-1, -1], dtype=np.int64), [], [])


@pytest.mark.parametrize("merge_min", [3, 64])
def test_value_multiset_ids_follow_live_pairs_through_merges(monkeypatch, merge_min):
    # the ids OrderedRows finds its nodes by: a pair that dies and comes back (a base
    # tombstone revived, or a new delta entry) carries the id of its latest update, and a
    # dead one has none
    monkeypatch.setattr(_Sorted, "MERGE_MIN", merge_min)
    rng = np.random.default_rng(merge_min)
    ms, count, ident, fresh = ValueMultiset(ids=True), Counter(), {}, iter(range(10**9))
    for _ in range(300):
        n = int(rng.integers(1, 40))
        g, v = rng.integers(0, 12, n), rng.integers(0, 30, n).astype(np.uint64)
        live = sorted(count)
        pick = rng.choice(len(live), min(len(live), int(rng.integers(0, 40))), replace=False) if live else []
        gone = [live[i] for i in pick]
        ids = []
        for pair in zip(g.tolist(), v.tolist(), strict=True):
            if not count[pair]:
                ident[pair] = next(fresh)
            count[pair] += 1
            ids.append(ident[pair])
        for pair in gone:
            count[pair] -= 1
            ids.append(ident[pair])
        count = Counter({p: c for p, c in count.items() if c})
        ms.update(np.concatenate((g, [p[0] for p in gone])).astype(np.int64),
                  np.concatenate((v, np.array([p[1] for p in gone], dtype=np.uint64))),
                  np.concatenate((np.ones(n, np.int64), -np.ones(len(gone), np.int64))), np.array(ids, np.int64))
        seen = sorted(ident)
        got_ids = ms.ids_of(np.array([p[0] for p in seen], np.int64), np.array([p[1] for p in seen], np.uint64))
        assert got_ids.tolist() == [ident[p] if count[p] else -1 for p in seen]  # dead pairs: -1
        qs = np.arange(14)
        for largest in (False, True):
            got, found = ms.extreme_ids(qs, largest)
            want = {}
            for (a, b) in count:
                if a not in want or (b > want[a][1] if largest else b < want[a][1]):
                    want[a] = (ident[(a, b)], b)
            assert found.tolist() == [q in want for q in qs.tolist()]
            assert got[found].tolist() == [want[q][0] for q in qs.tolist() if q in want]


# the oracle -------------------------------------------------------------------------------
class _SortedRef(_Case):
    """A case recomputed over the source with ``R`` and ``LS`` added, vectorized: per order
    column, the rows whose value is neither null nor NaN in a stable Arrow sort (by value,
    then position), shared by the cases of a cycle; per aggregation, each group's first
    row in that sequence (sorted_first) or its last (sorted_last: the highest value, ties to
    the last row). Groups in order of their first row. Arrow's sort orders strings bytewise
    and ties -0.0 with 0.0, as the definitions say, and shares nothing with the engine's
    tries; the example tests above anchor it, and ``test_kinds``' plain-Python reference
    checks the same kinds row by row."""

    def expected(self, tbl: pa.Table) -> list[tuple[Any, ...]]:
        cycle = _Sources.of(tbl)
        keep = cycle.where(self.where)
        gid, firsts = _group_ids(cycle.table, self.by, keep)
        keys = [cycle.table.column(k).take(firsts).to_pylist() for k in self.by]
        values = []
        for s in self.specs:
            assert s.order is not None and s.column is not None
            ranked = cycle.ranked(s.order)
            ranked = ranked[keep[ranked]]
            if s.kind == "sorted_last":
                ranked = ranked[::-1]
            groups, at = np.unique(gid[ranked], return_index=True)
            picked: list[Any] = [None] * firsts.size
            for group, v in zip(groups, cycle.table.column(s.column).take(ranked[at]).to_pylist(), strict=True):
                picked[group] = v
            values.append(picked)
        return [tuple(k[i] for k in keys) + tuple(v[i] for v in values) for i in range(firsts.size)]

    def rows(self, out: pa.Table) -> list[tuple[Any, ...]]:
        return list(zip(*(out.column(n).to_pylist() for n in out.column_names), strict=True))


class _Sources:
    """What the cases of one cycle share: the source with ``R`` and ``LS``, each order
    column's ranking and each ``where``'s rows (the last source table given is kept)."""

    _last: _Sources | None = None

    def __init__(self, source: pa.Table) -> None:
        self.source = source
        self.table = oracle.arrow_project(source, {**{c: pc.field(c) for c in source.column_names}, **EXTRA})
        self._ranked: dict[str, np.ndarray] = {}
        self._where: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, source: pa.Table) -> _Sources:
        if cls._last is None or cls._last.source is not source:
            cls._last = cls(source)
        return cls._last

    def ranked(self, col: str) -> np.ndarray:
        """Positions of the rows whose ``col`` is neither null nor NaN, by value then position."""
        if col not in self._ranked:
            order = self.table.column(col)
            valid = pc.is_valid(order)
            if pa.types.is_floating(order.type):
                valid = pc.and_(valid, pc.invert(pc.is_nan(order)))
            rows = np.flatnonzero(valid.to_numpy(zero_copy_only=False))
            by = pc.sort_indices(pa.table({"o": order.take(rows), "p": rows}),
                                 sort_keys=[("o", "ascending"), ("p", "ascending")]).to_numpy()
            self._ranked[col] = rows[by]
        return self._ranked[col]

    def where(self, cond: pc.Expression | None) -> np.ndarray:
        """Whether each row passes ``cond`` (every row without one)."""
        if cond is None:
            return np.ones(self.table.num_rows, dtype=bool)
        key = str(cond)
        if key not in self._where:
            kept = oracle.arrow_project(self.table, {"keep": cond}).column("keep")
            self._where[key] = kept.fill_null(False).to_numpy(zero_copy_only=False)
        return self._where[key]


def _group_ids(tbl: pa.Table, by: list[str], keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each kept row's group (-1 for the others), numbered in order of the groups' first
    rows (a null key is a value of its own), and each group's first row."""
    rows = np.flatnonzero(keep)
    gid = np.full(tbl.num_rows, -1, dtype=np.int64)
    if not by:
        gid[rows] = 0
        return gid, rows[:1]
    codes = np.stack([pc.dictionary_encode(tbl.column(k)).combine_chunks().indices.fill_null(-1).to_numpy()
                      for k in by], axis=1)[rows]
    _, first, inverse = np.unique(codes, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    gid[rows] = rank[inverse.reshape(-1)]
    return gid, rows[np.sort(first)]


#: every order column (float with nulls, specials, ints with and without ties, short and
#: long strings) and value columns of each type
SORTED = [agg.sorted_first("Qty", "Price", "QLoP"), agg.sorted_last("Qty", "Price", "QHiP"),
          agg.sorted_first("Sym", "R", "SLoR"), agg.sorted_last("R", "R", "RHiR"),
          agg.sorted_last("LS", "Qty", "LSHiQ"), agg.sorted_first("Price", "Qty", "PLoQ"),
          agg.sorted_first("Key", "LS", "KLoLS"), agg.sorted_last("Qty", "LS", "QHiLS"),
          agg.sorted_last("Price", "Sym", "PHiS"), agg.sorted_first("LS", "Key", "LSLoK")]


@pytest.mark.parametrize("kind", oracle.KINDS)
def test_oracle_sorted_first_last_keyed_append_ring(monkeypatch, kind):
    # one source kind per test (each the third of the cycles it had when one test ran all three)
    oracle.share_cycles(monkeypatch, len(oracle.KINDS))
    above = pc.field("Price") > 30
    cases = {
        "by sym": _SortedRef(lambda t: agg_by(_derived(t), SORTED, "Sym"), ["Sym"], SORTED),
        "zero keys": _SortedRef(lambda t: agg_by(_derived(t), SORTED), [], SORTED),
        "two keys": _SortedRef(lambda t: agg_by(_derived(t), SORTED[:6], ["Sym", "Qty"]), ["Sym", "Qty"], SORTED[:6]),
        "where": _SortedRef(lambda t: agg_by(_derived(t).where(above), SORTED, "Sym"), ["Sym"], SORTED, where=above),
    }
    _run_cases(cases, seed=51, kinds=(kind,))


@pytest.mark.parametrize("merge_min", [3, 64])
def test_oracle_sorted_first_last_over_a_shifting_parent_while_merging(monkeypatch, merge_min):
    monkeypatch.setattr(_Sorted, "MERGE_MIN", merge_min)
    oracle.share_cycles(monkeypatch, 2)
    cases = {
        "shifts": _SortedRef(lambda t: agg_by(_jitter(_derived(t)), SORTED, "Sym"), ["Sym"], SORTED),
        "shifts, zero keys": _SortedRef(lambda t: agg_by(_jitter(_derived(t)), SORTED[:4]), [], SORTED[:4]),
    }
    _run_cases(cases, seed=52 + merge_min, kinds=("keyed", "ring"))


def test_oracle_sorted_first_last_over_add_only_parents():
    def best(build):
        def run(t):
            r = build(t)
            assert _classes(r) == {BestRows, BestStrings}, _classes(r)
            return r
        return run

    above = pc.field("Price") > 30
    cases = {
        "by sym": _SortedRef(best(lambda t: agg_by(_derived(t), SORTED, "Sym")), ["Sym"], SORTED),
        "zero keys": _SortedRef(best(lambda t: agg_by(_derived(t), SORTED)), [], SORTED),
        "by qty": _SortedRef(best(lambda t: agg_by(_derived(t), SORTED, "Qty")), ["Qty"], SORTED),
        "where": _SortedRef(best(lambda t: agg_by(_derived(t).where(above), SORTED, "Sym")), ["Sym"], SORTED,
                          where=above),
    }
    _run_cases(cases, seed=53, kinds=("append",), max_rows=300)
