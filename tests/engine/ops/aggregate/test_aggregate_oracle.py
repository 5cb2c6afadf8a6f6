"""agg_by / first_by / last_by / count_by against the oracle.

Every comparison is ordered: a result's groups are in order of their first row in the
parent's current rows (see engine.ops.aggregate), which is what a recomputation from the
source gives. ``test_oracle_agg_by_every_aggregation_by_sym`` is ``tests.oracle.run_oracle``
against pandas ``groupby(sort=False)``; the other runs hang several results off one random
source (:func:`_run_cases`: the same RandomSource, validation, replay and cycle counts) and
recompute with Arrow's hash aggregation, ten times cheaper, put in first-row order, which
``test_arrow_recomputation_agrees_with_pandas`` ties to the pandas one. :func:`_run_cases`
also builds each result afresh over the source every few cycles (what a server's restart
does) and requires the same rows in the same order as the live one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import engine.columns as columns_mod
import tests.oracle as oracle
from engine.graph import UpdateGraph
from engine.ops.aggregate import _states as states_mod
from engine.ops.aggregate import agg
from engine.ops.aggregate import listener as aggregate_mod
from engine.ops.aggregate._codes import CodedGroups
from engine.ops.aggregate._sortedset import RowKeySet, _Sorted
from engine.ops.aggregate._states import OrderStats
from engine.ops.aggregate.listener import Agg, AggListener, agg_by, count_by, first_by, last_by
from engine.table import Table
from tests.engine.ops.aggregate.test_aggregate import _jitter, _spy_scans
from tests.replay import ReplayChecker

SCHEMA = oracle.SCHEMA


# the oracle -------------------------------------------------------------------------------
def _expected(df: pd.DataFrame, by: list[str], specs: list[Agg]) -> pd.DataFrame:
    cols = by + [s.name for s in specs]
    if df.empty:
        return pd.DataFrame({c: [] for c in cols})
    grouped = (df if by else df.assign(_all=0)).groupby(by or ["_all"], dropna=False, sort=False)
    out = {}
    for s in specs:
        col = grouped[s.column] if s.column is not None else None
        if s.kind == "count":
            out[s.name] = grouped.size()
        elif s.kind in ("first", "last"):
            out[s.name] = getattr(col, s.kind)(skipna=False)
        elif s.kind == "count_distinct":
            out[s.name] = col.nunique()
        else:
            out[s.name] = getattr(col, s.kind)()
    res = pd.DataFrame(out).reset_index(drop=not by)
    return res[cols]


def _norm(v):
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


def _records(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows as tuples of plain values (nulls as None), in order."""
    return [tuple(_norm(v) for v in r) for r in df.to_numpy(dtype=object).tolist()]


def _same(u, v) -> bool:
    if u is None or v is None:
        return u is v
    if isinstance(u, float) or isinstance(v, float):
        return math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9) or (u != u and v != v)
    return u == v


def _same_rows(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    # equal lists are the same rows (equal values pass _same; no NaN: _plain_rows and _norm
    # made them None); only lists that differ are compared value by value, floats to 1e-9
    return a == b or len(a) == len(b) and all(
        len(ra) == len(rb) and all(_same(u, v) for u, v in zip(ra, rb, strict=True))
        for ra, rb in zip(a, b, strict=True)
    )


def _close_enough(got: pd.DataFrame, want: pd.DataFrame, context: str) -> None:
    """The same rows in the same order, floats to 1e-9 (an incremental sum and a fresh one
    may differ in the last bits); on a difference the oracle's own assert prints both."""
    a, b = _records(got), _records(want)
    if list(got.columns) == list(want.columns) and _same_rows(a, b):
        return
    oracle.assert_same(got, want, context)
    raise AssertionError(f"{context}: frames differ")


#: one aggregation of every kind, over float (with nulls), int and string columns
ALL = [agg.sum("Qty", "S"), agg.count("N"), agg.mean("Price", "M"), agg.std("Price", "SD"),
       agg.min("Price", "Lo"), agg.max("Qty", "HiQ"), agg.first("Sym", "FS"), agg.last("Price", "L"),
       agg.count_distinct("Price", "CD")]


#: the aggregations that keep no row keys of their groups
RUNNING = [a for a in ALL if a.kind not in ("first", "last")]


def test_oracle_agg_by_every_aggregation_by_sym():
    oracle.run_oracle(lambda t: agg_by(t, ALL, "Sym"), lambda df: _expected(df, ["Sym"], ALL), seed=11,
                      compare=_close_enough)


_ARROW_AGG = {
    "sum": ("sum", pc.ScalarAggregateOptions(min_count=0)),
    "count": ("count", pc.CountOptions(mode="all")),
    "mean": ("mean", None),
    "std": ("stddev", pc.VarianceOptions(ddof=1)),
    "min": ("min", None),
    "max": ("max", None),
    "first": ("first", pc.ScalarAggregateOptions(skip_nulls=False)),
    "last": ("last", pc.ScalarAggregateOptions(skip_nulls=False)),
    "count_distinct": ("count_distinct", pc.CountOptions(mode="only_valid")),
}


def _expected_arrow(tbl: pa.Table, by: list[str], specs: list[Agg]) -> list[tuple[Any, ...]]:
    """The same recomputation with Arrow's hash aggregation (C++, ~10x cheaper than pandas).

    Same semantics on the oracle's data (no NaN): nulls skipped, sum of nothing 0, sample
    std, first/last in row order with nulls, null keys grouped, no row for no rows. Groups
    in order of their first row (Arrow's own output order is not that).
    """
    if tbl.num_rows == 0:
        return []
    keys = by or ["_all"]
    if not by:
        tbl = tbl.append_column("_all", pa.array(np.zeros(tbl.num_rows, dtype=np.int64)))
    tbl = tbl.append_column("_row", pa.array(np.arange(tbl.num_rows, dtype=np.int64)))
    wanted = []
    for s in specs:
        fn, opts = _ARROW_AGG[s.kind]
        wanted.append((s.column or "Key", fn, opts))
    uniq = list(dict.fromkeys([("_row", "min"), *((c, f) for c, f, _ in wanted)]))
    opts_of = {(c, f): o for c, f, o in wanted}
    res = tbl.group_by(keys, use_threads=False).aggregate([(c, f, opts_of.get((c, f))) for c, f in uniq])
    res = res.take(pc.sort_indices(res.column("_row_min")))
    names = by + [f"{c}_{f}" for c, f, _ in wanted]
    return _plain_rows(res, names)


def _plain_rows(tbl: pa.Table, names: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``tbl``'s columns ``names`` as tuples, NaN as None (as :func:`_norm`
    does): NaN becomes a null in Arrow, one vectorized pass per float column, so the
    Python values are the plain ones ``to_pylist`` gives."""
    cols = []
    for n in names:
        col = tbl.column(n)
        if pa.types.is_floating(col.type) and pc.any(pc.is_nan(col)).as_py():
            col = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
        cols.append(col.to_pylist())
    return list(zip(*cols, strict=True))


class _Case:
    """One result table checked by :func:`_run_cases`: build, group keys, recomputation."""

    def __init__(self, build, by: list[str], specs: list[Agg], where=None) -> None:
        self.build, self.by, self.specs, self.where = build, by, specs, where

    def expected(self, tbl: pa.Table) -> list[tuple[Any, ...]]:
        return _expected_arrow(tbl if self.where is None else oracle.arrow_filter(tbl, self.where), self.by,
                              self.specs)

    def rows(self, out: pa.Table) -> list[tuple[Any, ...]]:
        """The result's rows, comparable with :meth:`expected`."""
        return _plain_rows(out, out.column_names)


def _run_cases(cases: dict[str, _Case], seed: int, kinds: tuple[str, ...] = oracle.KINDS,
               max_rows: int = 120) -> None:
    """``tests.oracle.run_oracle`` for several results of one random source at once.

    The same pieces (RandomSource, ``validate=True`` on every update, recomputation and
    a ReplayChecker after every cycle, ``TICKTABLE_CYCLES`` cycles over every kind), but
    the source's cost is paid once for all the results hanging off it, and the
    recomputation is Arrow's (the pandas one anchors test_oracle_agg_by_every_aggregation).
    Every 5th cycle each result is also built afresh over the source, as a server's restart
    rebuilds derived tables, and must hold the live result's rows in the live result's order.
    ``kinds`` narrows the sources (the cycles are shared among them), ``max_rows`` bounds
    their size (an append-only source stops growing at four times that, and its kind ends
    after one empty cycle over the full table, as in ``run_oracle``).
    """
    per_kind = max(1, oracle.cycles() // len(kinds))
    for kind in kinds:
        g = UpdateGraph(validate=True)
        src = oracle.RandomSource(g, kind, np.random.default_rng([seed, oracle.KINDS.index(kind)]), max_rows)
        tables = {name: case.build(src.table) for name, case in cases.items()}
        replays = {name: ReplayChecker(t) for name, t in tables.items()}
        for c in range(per_kind):
            src.step()
            g.run_cycle()
            tbl = src.table.to_arrow()
            for name, case in cases.items():
                ctx = f"{name} seed={seed} kind={kind} cycle={c}"
                t = tables[name]
                if t.failure is not None:
                    raise AssertionError(f"{ctx}: result failed") from t.failure
                out = t.to_arrow()  # one snapshot for the comparison and the replay check
                got = case.rows(out)
                want = case.expected(tbl)
                if not _same_rows(got, want):
                    print(f"MISMATCH {ctx}\n--- incremental ---\n{got}\n--- recomputed ---\n{want}")
                    raise AssertionError(f"{ctx}: incremental and recomputed results differ")
                try:
                    replays[name].check(out)
                except AssertionError:
                    print(f"REPLAY MISMATCH {ctx}")
                    raise
                if c % 5 == 0 or src.exhausted:  # and over an append-only source's last rows
                    fresh = _rebuilt(case, src.table)
                    if not _same_rows(got, fresh):
                        print(f"REBUILD MISMATCH {ctx}\n--- incremental ---\n{got}\n--- rebuilt ---\n{fresh}")
                        raise AssertionError(f"{ctx}: the live result and one built afresh differ")
            if src.exhausted:  # an append-only source that stopped growing: the rest repeat this
                break


def _rebuilt(case: _Case, source: Table) -> list[tuple[Any, ...]]:
    """The rows of ``case`` built afresh over ``source`` (then detached from the graph again)."""
    t = case.build(source)
    try:
        return case.rows(t.to_arrow())
    finally:
        while t is not source:  # the result and what the case built between it and the source
            t.close()
            t = t.parents[0]


def test_arrow_recomputation_agrees_with_pandas():
    g = UpdateGraph()
    for kind in oracle.KINDS:
        src = oracle.RandomSource(g, kind, np.random.default_rng(21))
        for step in range(150):
            src.step()
            g.run_cycle()
            if step % 10:
                continue
            tbl = src.table.to_arrow()
            for by in (["Sym"], ["Sym", "Qty"], []):
                want = _records(_expected(tbl.to_pandas(), by, ALL))
                assert _same_rows(_expected_arrow(tbl, by, ALL), want), (kind, step, by)


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("distinct_min", [AggListener.DISTINCT_MIN, 2])
def test_oracle_keys_zero_keys_first_last_count_and_chains(monkeypatch, distinct_min, small):
    # distinct_min=2: nearly every batch is interned one row per distinct key
    monkeypatch.setattr(AggListener, "DISTINCT_MIN", distinct_min)
    # a cycle's events: touched groups as Python integers and signs as a view of a shared
    # array, at any size (small), or by np.unique / bincount and signs allocated (not small)
    monkeypatch.setattr(states_mod, "FEW_EVENTS", 1 << 30 if small else 0)
    if not small:
        monkeypatch.setattr(states_mod, "_SIGNS_HALF", 0)
    oracle.share_cycles(monkeypatch, 4)
    two = [agg.count("N"), agg.sum("Price", "S"), agg.std("Qty", "SD"), agg.max("Price", "Hi"),
           agg.first("Key", "F"), agg.count_distinct("Sym", "CD")]
    chain = [agg.sum("Qty", "S"), agg.mean("Price", "M"), agg.max("Price", "Hi"), agg.last("Key", "L"),
             agg.count("N")]
    cases = {
        "two keys": _Case(lambda t: agg_by(t, two, ["Sym", "Qty"]), ["Sym", "Qty"], two),
        "zero keys": _Case(lambda t: agg_by(t, ALL), [], ALL),
        # no first/last: the one group's rows are not kept, removed rows find it by its slot
        "zero keys, no rows": _Case(lambda t: agg_by(t, RUNNING), [], RUNNING),
        "first_by": _Case(lambda t: first_by(t, "Sym"), ["Sym"], [agg.first(c) for c in ("Key", "Price", "Qty")]),
        "last_by": _Case(lambda t: last_by(t, "Qty"), ["Qty"], [agg.last(c) for c in ("Sym", "Key", "Price")]),
        "count_by": _Case(lambda t: count_by(t, "Rows", "Sym"), ["Sym"], [agg.count("Rows")]),
        "where": _Case(lambda t: agg_by(t.where(pc.field("Price") > 40), chain, "Sym"), ["Sym"], chain,
                       where=pc.field("Price") > 40),
    }
    _run_cases(cases, seed=12)


@pytest.mark.parametrize("flag_slots", [0, 1 << 30])
def test_oracle_modified_groups_by_flags_and_by_sort(monkeypatch, flag_slots):
    # a cycle's modified groups (less those re-keyed) are united by one flag per slot
    # (``flag_slots`` huge: every cycle) or by sorting the aggregations' changes (0: every
    # cycle); the where makes first rows leave (re-keyed groups), modifies in place change
    # values of groups no row joins or leaves
    monkeypatch.setattr(AggListener, "FLAG_SLOTS", flag_slots)
    oracle.share_cycles(monkeypatch, 2)
    chain = [agg.sum("Qty", "S"), agg.mean("Price", "M"), agg.count("N"), agg.first("Key", "F")]
    cases = {
        "where": _Case(lambda t: agg_by(t.where(pc.field("Price") > 40), chain, "Sym"), ["Sym"], chain,
                       where=pc.field("Price") > 40),
        "two keys": _Case(lambda t: agg_by(t, chain, ["Sym", "Qty"]), ["Sym", "Qty"], chain),
        "count_by": _Case(lambda t: count_by(t, "Rows", "Sym"), ["Sym"], [agg.count("Rows")]),
    }
    _run_cases(cases, seed=18 + bool(flag_slots))


NUMERIC_KEYS = [agg.count("N"), agg.sum("Key", "S"), agg.max("Key", "Hi"), agg.first("Sym", "F"),
                agg.mean("Qty", "M")]


def _collide_hashes(monkeypatch) -> None:
    """Every key hashes to one of three values: most groups share a hash, so the stored
    keys decide."""
    real = aggregate_mod.hash_columns
    monkeypatch.setattr(aggregate_mod, "hash_columns",
                        lambda arrays, names=None, num_rows=None: real(arrays, names, num_rows) % np.uint64(3))


@pytest.mark.parametrize("distinct_min", [AggListener.DISTINCT_MIN, 2])
@pytest.mark.parametrize("collide", [False, True])
def test_oracle_numeric_keys_verified_in_numpy(monkeypatch, collide, distinct_min):
    # two fixed-width key columns (one with nulls) are verified and stored in numpy; with
    # ``collide`` every key hashes to one of three values, so most groups share a hash
    # and every lookup walks chains through that verification (and a batch whose keys
    # share hashes is not deduplicated by hash)
    monkeypatch.setattr(AggListener, "DISTINCT_MIN", distinct_min)
    oracle.share_cycles(monkeypatch, 2)
    if collide:
        _collide_hashes(monkeypatch)
    cases = {"numeric keys": _Case(lambda t: agg_by(t, NUMERIC_KEYS, ["Price", "Qty"]), ["Price", "Qty"],
                                   NUMERIC_KEYS)}
    _run_cases(cases, seed=14 + collide)


STRING_KEYS = [agg.count("N"), agg.sum("Price", "S"), agg.first("Key", "F"), agg.last("Sym", "L")]


@pytest.mark.parametrize("few", [0, 1 << 30])
def test_oracle_string_keys_verified_when_hashes_collide(monkeypatch, few):
    # every key hashes to one of three values, so most groups share a hash: the stored
    # string and integer keys decide, compared as Python values (every batch, ``few``
    # huge) or by Arrow (never)
    monkeypatch.setattr(AggListener, "FEW_KEYS", few)
    oracle.share_cycles(monkeypatch, 2)
    _collide_hashes(monkeypatch)
    cases = {"string and integer keys": _Case(lambda t: agg_by(t, STRING_KEYS, ["Sym", "Qty"]), ["Sym", "Qty"],
                                              STRING_KEYS)}
    _run_cases(cases, seed=16 + bool(few))


@pytest.mark.parametrize("distinct_min", [AggListener.DISTINCT_MIN, 2])
@pytest.mark.parametrize("collide", [False, True])
def test_oracle_one_string_key_grouped_by_its_dictionary(monkeypatch, collide, distinct_min):
    # a batch of one string key without nulls (a where drops the null symbols) finds its
    # distinct keys by a dictionary encoding, and only they are hashed; with ``collide``
    # every key hashes to one of three values, so the stored keys decide; the path is
    # taken (counted), and batches with nulls (no where) take the hash path beside it
    monkeypatch.setattr(AggListener, "DISTINCT_MIN", distinct_min)
    monkeypatch.setattr(AggListener, "CODED_MIN", distinct_min)
    oracle.share_cycles(monkeypatch, 2)
    if collide:
        _collide_hashes(monkeypatch)
    coded = aggregate_mod._coded_keys
    taken = []

    def counting(arrays, by):
        out = coded(arrays, by)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(aggregate_mod, "_coded_keys", counting)
    valid = pc.is_valid(pc.field("Sym"))
    cases = {
        "no null symbols": _Case(lambda t: agg_by(t.where(valid), STRING_KEYS, "Sym"), ["Sym"], STRING_KEYS,
                                 where=valid),
        "with nulls": _Case(lambda t: agg_by(t, STRING_KEYS, "Sym"), ["Sym"], STRING_KEYS),
    }
    _run_cases(cases, seed=18 + collide, max_rows=400)
    assert any(taken) and not all(taken)


def test_coded_keys_are_the_distinct_keys_in_row_order():
    rng = np.random.default_rng(4)
    syms = np.array(["", "a", "b", "ab", "a\x00", "é", "S0001", "S0002"], dtype=object)
    for n in (1, 2, 50, 3000):
        for t in (pa.string(), pa.large_string(), pa.binary()):
            vals = syms[rng.integers(0, syms.size, n)]
            arr = pa.array([v.encode() for v in vals] if t == pa.binary() else vals.tolist(), t)
            h, rep, inv = aggregate_mod._coded_keys([arr], ["Sym"])
            assert rep.tolist() == sorted({v: i for i, v in reversed(list(enumerate(vals.tolist())))}.values())
            assert arr.take(pa.array(rep[inv])).equals(arr)
            assert h.tolist() == aggregate_mod.hash_columns([arr], ["Sym"], n).tolist()
    assert aggregate_mod._coded_keys([pa.array(["a", None] * 20)], ["Sym"]) is None  # nulls: hashed
    assert aggregate_mod._coded_keys([pa.array(np.arange(40))], ["Key"]) is None  # not a string


@pytest.mark.parametrize("pending_min", [1, OrderStats.PENDING_MIN])
def test_oracle_min_max_first_last_with_constant_merges_and_parent_shifts(monkeypatch, pending_min):
    # the LSM merges after every few changes (base, tombstones and delta all in play), and
    # the second parent shifts its row keys every cycle; min and max fold their log into
    # the multiset every cycle (1) or when an end leaves (the default)
    monkeypatch.setattr(_Sorted, "MERGE_MIN", 3)
    monkeypatch.setattr(OrderStats, "PENDING_MIN", pending_min)
    specs = [agg.min("Price", "Lo"), agg.max("Price", "Hi"), agg.first("Qty", "F"), agg.last("Key", "L"),
             agg.sum("Qty", "S")]
    cases = {
        "shifts": _Case(lambda t: agg_by(_jitter(t), specs, "Sym"), ["Sym"], specs),
        "first_by shifts": _Case(lambda t: first_by(_jitter(t), "Sym"), ["Sym"],
                                 [agg.first(c) for c in ("Key", "Price", "Qty")]),
    }
    _run_cases(cases, seed=13)


@pytest.mark.parametrize("scan", [(5, 2), (RowKeySet.SCAN_MAX, RowKeySet.SCAN_GROUPS), (1 << 30, 1 << 30)])
def test_oracle_cached_first_rows_with_occasional_shifts(monkeypatch, scan):
    # a group's first row is read from the listener's cache until a cycle touches the group
    # or shifts the parent: here rows shift only every fourth cycle (in between, groups that
    # only see modifies of values answer from the cache), and the where makes rows leave and
    # rejoin groups (first rows lost and searched again). The row-key set's unsorted tail
    # is scanned by queries of at most (2, the default, any number of) groups while it
    # holds at most (5, the default, any number of) entries, else sorted into its delta
    monkeypatch.setattr(RowKeySet, "SCAN_MAX", scan[0])
    monkeypatch.setattr(RowKeySet, "SCAN_GROUPS", scan[1])
    oracle.share_cycles(monkeypatch, 3)
    specs = [agg.count("N"), agg.sum("Qty", "S"), agg.mean("Price", "M"), agg.last("Key", "L"),
             agg.first("Qty", "F")]

    def rare(k, v):
        return (k % 3 == 0) * ((v // 4) % 2)

    cases = {
        "rare shifts": _Case(lambda t: agg_by(_jitter(t, rare), specs, "Sym"), ["Sym"], specs),
        "where, rare shifts": _Case(lambda t: agg_by(_jitter(t.where(pc.field("Qty") > 30), rare), specs, "Sym"),
                                    ["Sym"], specs, where=pc.field("Qty") > 30),
        "two keys": _Case(lambda t: agg_by(t, specs, ["Sym", "Qty"]), ["Sym", "Qty"], specs),
    }
    _run_cases(cases, seed=18)


@pytest.mark.parametrize("flat", ["scans", "scans run out", "entries"])
def test_oracle_row_key_set_flat_through_removes(monkeypatch, flat):
    # the listener's row-key set stays flat through removes (FLAT_REMOVES): rows leaving
    # groups are only unmapped, and a group's lost first (or last) row is found by scans
    # of the map from its bound, in slices of 2, 4, 8, ... keys. "scans": every
    # scan is paid for, the sets stay flat (no shifts here); "scans run out": a small
    # balance, so sets scan for a while, then build their entries mid-run and go on as
    # sorted sets; "entries": the first remove builds them (the sorted sets throughout)
    monkeypatch.setattr(aggregate_mod, "FLAT_REMOVES", flat != "entries")
    monkeypatch.setattr(RowKeySet, "SCAN_WIDTH", 2)
    monkeypatch.setattr(RowKeySet, "SCAN_GAPS", 0)
    monkeypatch.setattr(RowKeySet, "SCAN_CREDIT", 1 << 20 if flat == "scans" else 4)
    monkeypatch.setattr(RowKeySet, "SCAN_SLACK", 1 << 20 if flat == "scans" else 256)
    oracle.share_cycles(monkeypatch, 3)
    scans = _spy_scans(monkeypatch)
    specs = [agg.count("N"), agg.sum("Qty", "S"), agg.mean("Price", "M"), agg.first("Key", "F"),
             agg.last("Price", "L")]
    cases = {
        "where": _Case(lambda t: agg_by(t.where(pc.field("Price") > 40), specs, "Sym"), ["Sym"], specs,
                       where=pc.field("Price") > 40),
        "two keys": _Case(lambda t: agg_by(t, specs[:3], ["Sym", "Qty"]), ["Sym", "Qty"], specs[:3]),
        "last_by": _Case(lambda t: last_by(t, "Qty"), ["Qty"], [agg.last(c) for c in ("Sym", "Key", "Price")]),
    }
    _run_cases(cases, seed=31)
    assert (True in scans) == (flat != "entries") and (False in scans) == (flat == "scans run out")


@pytest.mark.parametrize("hashed", [False, True])
def test_oracle_readers_find_the_cycles_groups_as_the_map_does(monkeypatch, hashed):
    # within a cycle a reader's row keys are looked up among the update's added and
    # modified groups (one sorted search) before the row-key map: every answer, for the
    # update's keys, keys of other groups and absent keys, current and previous, is the
    # map's alone (``hashed``: the maps leave their dense windows at once, so the
    # add-only source's first rows are read through the search too)
    from engine._kernels import rowkeymap
    if hashed:
        monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)
        monkeypatch.setattr(aggregate_mod, "FIRSTS_DENSE_RATIO", 0)
    per_kind = max(1, oracle.cycles(600) // len(oracle.KINDS))
    for kind in oracle.KINDS:
        _check_readers(kind, np.random.default_rng([41, hashed, oracle.KINDS.index(kind)]), per_kind)


def _check_readers(kind: str, rng: np.random.Generator, cycles: int) -> None:
    g = UpdateGraph(validate=True)
    src = oracle.RandomSource(g, kind, rng)
    t = agg_by(src.table, [agg.sum("Qty", "S"), agg.count("N")], "Sym")
    lst = t.listener
    assert isinstance(lst, AggListener)
    used = 0

    def uncached(read: Any, keys: np.ndarray) -> np.ndarray:
        saved = lst._recent, lst._recent_sorted
        lst._recent = lst._recent_sorted = None
        try:
            return np.asarray(read(keys))
        finally:
            lst._recent, lst._recent_sorted = saved

    def check(up: Any, table: Table) -> None:
        nonlocal used
        used += lst._recent_groups() is not None
        cur, prev = table.rowset.keys(), table.prev_rowset.keys()
        absent = np.array([int(cur[-1]) + 1 if cur.size else 0, 1 << 45], dtype=np.int64)
        keys = np.unique(np.concatenate((up.added.keys(), up.modified.keys(),
                                         rng.choice(cur, min(cur.size, 5)), absent)))
        assert np.array_equal(lst.slots_of(keys), uncached(lst.slots_of, keys)), (kind, keys)
        pkeys = np.unique(np.concatenate((up.removed.keys(), up.shifted.unapply_keys(up.modified.keys()),
                                          rng.choice(prev, min(prev.size, 5)))))
        if pkeys.size:
            assert np.array_equal(lst.prev_slots_of(pkeys), uncached(lst.prev_slots_of, pkeys)), (kind, pkeys)

    t.listen(check)
    for _ in range(cycles):
        src.step()
        g.run_cycle()
        assert t.failure is None
    dense = lst.firsts is not None and not lst.firsts.hashed  # a take: no search wanted
    assert used or dense, kind  # the readers' search ran


@pytest.mark.parametrize("way", ["codes", "uncoded midway", "compacted", "values"])
def test_oracle_groups_by_a_coded_key(monkeypatch, way):
    # a keyed source stores Sym coded (engine.columns.ArrowColumnSource): agg_by maps each
    # code to its group (CodedGroups) and hashes and verifies only the rows of codes it has
    # not mapped; groups die (deletes, Sym modified, the table emptied) and their slots
    # are reused. "uncoded midway": rare symbols push the column past CODED_MAX after
    # some cycles (the map is dropped, values decide from then on); "compacted": the
    # store compacts whenever most of it is unreachable, renumbering the codes (a new
    # epoch: the map starts again); "values": the map switched off
    oracle.share_cycles(monkeypatch, 4)
    if way == "uncoded midway":
        rare = [f"R{i}" for i in range(24)]
        monkeypatch.setattr(oracle, "SYMS", np.array(list(oracle.SYMS) * 40 + rare, dtype=object))
        monkeypatch.setattr(columns_mod, "CODED_MAX", 14)
    elif way == "compacted":
        monkeypatch.setattr(columns_mod.ArrowColumnSource, "needs_compaction",
                            lambda self, live: len(self._store) > 2 * max(live, 2))
    elif way == "values":
        monkeypatch.setattr(aggregate_mod, "CODED_GROUPS", False)
    seen = {"coded": 0, "uncoded": 0, "hits": 0, "learnt": 0, "epochs": set()}
    lookup, learn = CodedGroups.lookup, CodedGroups.learn

    def counting_lookup(self, column, keys):
        out = lookup(self, column, keys)
        seen["coded" if out is not None else "uncoded"] += 1
        if out is not None:
            seen["hits"] += int((out[0] >= 0).sum())
            seen["epochs"].add((id(self._source), self._epoch))
        return out

    def counting_learn(self, codes, slots):
        seen["learnt"] += slots.size
        return learn(self, codes, slots)

    monkeypatch.setattr(CodedGroups, "lookup", counting_lookup)
    monkeypatch.setattr(CodedGroups, "learn", counting_learn)
    high = pc.field("Price") > 40
    cases = {
        "by Sym": _Case(lambda t: agg_by(t, STRING_KEYS, "Sym"), ["Sym"], STRING_KEYS),
        "by Sym over a where": _Case(lambda t: agg_by(t.where(high), STRING_KEYS, "Sym"), ["Sym"], STRING_KEYS,
                                     where=high),
        "first_by Sym": _Case(lambda t: first_by(t, "Sym"), ["Sym"], [agg.first(c, c) for c in ("Key", "Price", "Qty")]),
    }
    _run_cases(cases, seed=41, kinds=("keyed",), max_rows=200)
    if way == "values":
        assert seen["coded"] == seen["uncoded"] == 0
        return
    assert seen["coded"] and seen["hits"] and seen["learnt"], seen
    if way == "uncoded midway":
        assert seen["uncoded"], seen
    if way == "compacted":
        assert len(seen["epochs"]) > 5, seen
