"""Joins against a two-sided oracle: both parents change every cycle, checked against the
join recomputed from scratch (itself checked against pandas' ``merge``) and by
``TableUpdate.validate`` after each cycle, singly and in chains with where and sort."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine._kernels import rowkeymap as _rowkeymap
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.ops.aggregate import listener as _agglistener
from engine.ops.aggregate._addonly import RowEnds, RunningExtremes
from engine.ops.aggregate._states import OrderStats
from engine.ops.aggregate.listener import agg_by
from engine.ops.join import _groupindex
from engine.ops.join import _state as _joinstate
from engine.ops.join.listener import exact_join, join, left_outer_join, natural_join
from tests.oracle import SYMS, RandomSource, assert_same, cycles
from tests.replay import ReplayChecker

# the two-sided oracle -------------------------------------------------------------------------


class RightDriver:
    """A keyed right table (by ``RId``) whose join-key columns change, with a random writer.

    ``mode``: ``"unique"`` keeps non-null keys distinct (natural joins), ``"full"`` also keeps
    every key of ``domain`` present (exact joins), ``"many"`` allows duplicates.
    Each cycle it changes values, re-keys rows (swaps included), deletes rows, re-adds
    deleted ``RId``s and deleted keys, adds rows, sometimes empties the table.
    """

    def __init__(self, graph, rng, key_cols, domain, mode, max_rows=40, extra=()):
        self.rng, self.key_cols, self.mode, self.max_rows = rng, key_cols, mode, max_rows
        self.domain = list(domain)  # key tuples
        self.extra = list(extra)
        self.all_keys = self.domain + self.extra
        fields = [("RId", pa.int64())] + [(c, _KEY_TYPES[c]) for c in key_cols]
        fields += [("RV", pa.float64()), ("RS", pa.string())]
        self.schema = pa.schema(fields)
        self.table = graph.keyed_table(self.schema, "RId", name="right")
        self.rows: dict[int, tuple] = {}  # RId -> (key index or -1 for null, RV, RS)
        self.next_id = 0
        self.dead: list[int] = []
        if mode == "full":
            self._write({self._new_id(): (k, *self._vals()) for k in range(len(self.domain))}, [])

    def _new_id(self):
        if self.dead and self.rng.random() < 0.3:
            return self.dead.pop(int(self.rng.integers(0, len(self.dead))))  # re-added RId
        self.next_id += 1
        return self.next_id

    def _vals(self):
        r = self.rng
        rv = None if r.random() < 0.1 else float(r.integers(0, 50))
        rs = None if r.random() < 0.1 else str(r.choice(["x", "y", "z", "w"]))
        return rv, rs

    def _free_keys(self, rows):
        used = {v[0] for v in rows.values()}
        return [k for k in range(len(self.all_keys)) if k not in used]

    def _write(self, upserts, deletes):
        for rid, v in upserts.items():
            self.rows[rid] = v
        for rid in deletes:
            self.rows.pop(rid, None)
            self.dead.append(rid)
        if upserts:
            ids = list(upserts)
            cols = {"RId": ids}
            for i, c in enumerate(self.key_cols):
                cols[c] = [None if upserts[x][0] < 0 else self.all_keys[upserts[x][0]][i] for x in ids]
            cols["RV"] = [upserts[x][1] for x in ids]
            cols["RS"] = [upserts[x][2] for x in ids]
            self.table.upsert(pa.table(cols, schema=self.schema))
        if deletes:
            self.table.delete(pa.table({"RId": pa.array(deletes, pa.int64())}))

    def step(self):
        r = self.rng
        if r.random() < 0.1:
            return
        rows = dict(self.rows)
        ids = list(rows)
        upserts, deletes = {}, []
        if self.mode != "full" and ids and r.random() < 0.03:
            self._write({}, ids)  # empty the table
            return
        # value modifies
        for rid in r.choice(ids, min(len(ids), int(r.integers(0, 4))), replace=False) if ids else []:
            rid = int(rid)
            k = rows[rid][0]
            upserts[rid] = (k, *self._vals()) if r.random() < 0.7 else (k, rows[rid][1], self._vals()[1])
            rows[rid] = upserts[rid]
        # key swaps between two rows (one cycle)
        if len(ids) >= 2 and r.random() < 0.3:
            a, b = (int(x) for x in r.choice(ids, 2, replace=False))
            ka, kb = rows[a][0], rows[b][0]
            upserts[a] = (kb, *rows[a][1:])
            upserts[b] = (ka, *rows[b][1:])
            rows[a], rows[b] = upserts[a], upserts[b]
        # re-key a row to an unused (or, in many mode, any) key, or to null
        if ids and r.random() < 0.4:
            rid = int(r.choice(ids))
            if rid in rows and not (self.mode == "full" and rows[rid][0] < len(self.domain)):
                pool = self._free_keys(rows) if self.mode != "many" else range(len(self.all_keys))
                pool = list(pool) + ([-1] if r.random() < 0.2 and self.mode != "full" else [])
                if pool:
                    upserts[rid] = (int(r.choice(pool)), *rows[rid][1:])
                    rows[rid] = upserts[rid]
        # delete a row and re-add its key on a new row in the same cycle
        if ids and r.random() < 0.3:
            rid = int(r.choice(ids))
            if rid in rows and rid not in upserts:
                k = rows.pop(rid)[0]
                deletes.append(rid)
                nid = self._new_id()
                while nid in rows or nid in deletes:
                    nid = self._new_id()
                upserts[nid] = (k, *self._vals())
                rows[nid] = upserts[nid]
        # plain deletes (never of domain keys in full mode)
        if ids and r.random() < 0.5:
            for rid in r.choice(ids, min(len(ids), int(r.integers(1, 3))), replace=False):
                rid = int(rid)
                if rid in rows and rid not in upserts and not (
                    self.mode == "full" and 0 <= rows[rid][0] < len(self.domain)
                ):
                    rows.pop(rid)
                    deletes.append(rid)
        # adds
        for _ in range(int(r.integers(0, 4)) if len(rows) < self.max_rows else 0):
            if self.mode == "many":
                k = int(r.integers(-1, len(self.all_keys))) if r.random() < 0.9 else -1
            else:
                free = self._free_keys(rows)
                if self.mode == "full":
                    free = [k for k in free if k >= len(self.domain)]
                if not free:
                    break
                k = int(r.choice(free)) if r.random() < 0.9 else -1
                if self.mode == "full" and k < 0:
                    continue
            nid = self._new_id()
            while nid in rows or nid in deletes:
                nid = self._new_id()
            upserts[nid] = (k, *self._vals())
            rows[nid] = upserts[nid]
        self._write(upserts, deletes)


_KEY_TYPES = {"Sym": pa.string(), "Qty": pa.int64(), "RQ": pa.int64(), "Key": pa.int64()}
QTY = [(q,) for q in range(-5, 100)]
SYM = [(s,) for s in SYMS]


def match_positions(lt, rt, left_on, right_on, how):
    """(left position, right position) pairs of the join, sorted by both, recomputed in
    plain Python (a dict from key tuple to right positions). Null keys never match; an
    unmatched left row of a ``how="left"`` join pairs with right position -1."""
    lkeys = list(zip(*(lt.column(c).to_pylist() for c in left_on), strict=True))
    rkeys = list(zip(*(rt.column(c).to_pylist() for c in right_on), strict=True))
    index: dict[tuple, list[int]] = {}
    for j, k in enumerate(rkeys):
        if None not in k:
            index.setdefault(k, []).append(j)
    lp, rp = [], []
    for i, k in enumerate(lkeys):
        found = index.get(k, []) if None not in k else []
        if found:
            lp += [i] * len(found)
            rp += found
        elif how == "left":
            lp.append(i)
            rp.append(-1)
    return np.array(lp, dtype=np.int64), np.array(rp, dtype=np.int64)


def pandas_positions(lt, rt, left_on, right_on, how):
    """The same pairs from ``pandas.merge``, with null right keys dropped first (pandas
    matches NaN/None keys with each other) and sorted by (left, right) explicitly."""
    keys = [f"_k{i}" for i in range(len(left_on))]
    lk = pd.DataFrame({k: lt.column(c).to_pandas() for k, c in zip(keys, left_on, strict=True)})
    lk["_lp"] = np.arange(lt.num_rows)
    rk = pd.DataFrame({k: rt.column(c).to_pandas() for k, c in zip(keys, right_on, strict=True)})
    rk["_rp"] = np.arange(rt.num_rows)
    rk = rk[rk[keys].notna().all(axis=1)]
    m = lk.merge(rk, how=how, on=keys)
    unsorted = m["_lp"].to_numpy(), m["_rp"].fillna(-1).to_numpy().astype(np.int64)
    m = m.sort_values(["_lp", "_rp"], kind="stable")
    return (m["_lp"].to_numpy(), m["_rp"].fillna(-1).to_numpy().astype(np.int64)), unsorted


def expected_join(lt, rt, left_on, right_on, out, how):
    """The join recomputed from scratch: left columns at the left positions, ``out`` right
    columns at the right positions (null for an unmatched left row)."""
    lp, rp = match_positions(lt, rt, left_on, right_on, how)
    miss = rp < 0
    cols = {c: lt.column(c).take(pa.array(lp, pa.int64())) for c in lt.column_names}
    for o, src in out:
        cols[o] = rt.column(src).take(pa.array(np.maximum(rp, 0), mask=miss)) if rt.num_rows \
            else pa.nulls(len(rp), rt.schema.field(src).type)
    return pa.table(cols)


def assert_same_arrow(got, want, ctx):
    """Equal names, types and values (nulls included); pandas' diff print on a mismatch."""
    ok = got.column_names == want.column_names and got.num_rows == want.num_rows
    ok = ok and all(got.column(c).combine_chunks().equals(want.column(c).combine_chunks())
                    for c in got.column_names)
    if not ok:
        assert_same(got.to_pandas(), want.to_pandas(), ctx)
        raise AssertionError(f"MISMATCH {ctx}: types or nulls differ\n{got}\n{want}")


def test_recomputation_agrees_with_pandas_merge():
    """The oracle's recomputation equals pandas' merge; pandas 3.1 also keeps left order and,
    within a left row, right order (we sort explicitly anyway)."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        syms = np.array(list(SYMS[:4]) + [None], dtype=object)
        lt = pa.table({"S": pa.array(syms[rng.integers(0, 5, rng.integers(0, 30))], pa.string())})
        lt = lt.append_column("Q", pa.array(rng.integers(0, 3, lt.num_rows), pa.int64()))
        rt = pa.table({"S": pa.array(syms[rng.integers(0, 5, rng.integers(0, 12))], pa.string())})
        rt = rt.append_column("Q", pa.array(rng.integers(0, 3, rt.num_rows), pa.int64()))
        for on in (["S"], ["S", "Q"], ["Q"]):
            for how in ("inner", "left"):
                (plp, prp), (ulp, urp) = pandas_positions(lt, rt, on, on, how)
                lp, rp = match_positions(lt, rt, on, on, how)
                assert np.array_equal(lp, plp) and np.array_equal(rp, prp), (trial, on, how)
                assert np.array_equal(ulp, plp) and np.array_equal(urp, prp), (trial, on, how)


class PrevChecker:
    """Inside each cycle, previous values at previous keys must equal last cycle's snapshot."""

    def __init__(self, table):
        self.table, self.errors = table, []
        self.snap()
        table.listen(self._on_update)

    def snap(self, data=None):
        self.keys = self.table.rowset.keys().copy()
        self.data = self.table.to_arrow() if data is None else data

    def _on_update(self, up, table):
        if not np.array_equal(table.prev_rowset.keys(), self.keys):
            self.errors.append("prev_rowset differs from last cycle's rowset")
            return
        got = table.rows(self.keys, prev=True)
        if not got.equals(self.data):
            for c in self.data.column_names:
                if not got.column(c).equals(self.data.column(c)):
                    self.errors.append(f"get_prev of column {c!r} differs from last cycle")

    def check(self, ctx, data=None):
        """``data`` is ``table.to_arrow()`` when the caller read it already this cycle."""
        assert not self.errors, f"{ctx}: {self.errors[:3]}"
        self.snap(data)


def run_join_oracle(build, expected, *, right, seed=0, n_cycles=None, kinds=("append", "keyed", "ring"),
                    max_rows=120):
    """``run_oracle`` with a second, randomly driven right table on the same graph.

    ``right(graph, rng)`` returns a list of drivers (objects with ``.table`` and ``.step()``);
    ``build(left, *right_tables)`` makes the table under test and ``expected(left_df,
    *right_dfs)`` recomputes it. Checks each cycle: values and order, the replay of the
    updates (validated by the graph), and previous values.
    """
    total = n_cycles if n_cycles is not None else cycles()
    per_kind = max(1, total // len(kinds))
    for k_i, kind in enumerate(kinds):
        rng = np.random.default_rng([seed, k_i])
        g = UpdateGraph(validate=True)
        src = RandomSource(g, kind, rng, max_rows)
        drivers = right(g, rng)
        src.step()
        for d in drivers:
            d.step()
        g.run_cycle()
        result = build(src.table, *(d.table for d in drivers))
        replay, prev = ReplayChecker(result), PrevChecker(result)
        src_now = None  # the source's rows after the last cycle: its next step reads them
        for c in range(per_kind):
            src.step(src_now)
            for d in drivers:
                d.step()
            g.run_cycle()
            ctx = f"seed={seed} kind={kind} cycle={c}"
            if result.failure is not None:
                raise AssertionError(f"{ctx}: result failed") from result.failure
            # one snapshot of each table per cycle, shared by the checks (nothing runs between)
            src_now, got = src.table.to_arrow(), result.to_arrow()
            want = expected(src_now, *(d.table.to_arrow() for d in drivers))
            assert_same_arrow(got, want, ctx)
            try:
                replay.check(got)
            except AssertionError:
                print(f"REPLAY MISMATCH {ctx}")
                raise
            prev.check(ctx, got)


def _drivers(key_cols, domain, mode, extra=(), n=1, max_rows=40):
    return lambda g, rng: [RightDriver(g, rng, key_cols, domain, mode, max_rows, extra) for _ in range(n)]


OUT = [("RId", "RId"), ("RV", "RV"), ("RS", "RS")]


def test_oracle_natural_join_on_string_key():
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "left"),
        right=_drivers(["Sym"], SYM, "unique", extra=[("ZZZ",)]), seed=1, n_cycles=cycles(1200),
    )


def test_oracle_natural_join_on_renamed_int_key():
    out = [("V", "RV"), ("RS", "RS")]
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, "Qty=RQ", joins=["V=RV", "RS"]),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["RQ"], out, "left"),
        right=_drivers(["RQ"], QTY[::3], "unique", extra=[(200,), (201,)]), seed=2, n_cycles=cycles(600),
    )


def test_oracle_natural_join_on_two_keys():
    dom = [(s, q) for s in SYMS[:4] for q in range(-5, 15)]
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, ["Sym", "Qty"]),
        lambda lt, r: expected_join(lt, r, ["Sym", "Qty"], ["Sym", "Qty"], OUT, "left"),
        right=_drivers(["Sym", "Qty"], dom, "unique", max_rows=60), seed=3, n_cycles=cycles(600),
    )


def test_oracle_exact_join():
    run_join_oracle(
        lambda lt, r: exact_join(lt, r, "Qty"),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["Qty"], OUT, "left"),
        right=_drivers(["Qty"], QTY, "full", extra=[(q,) for q in range(100, 110)], max_rows=130),
        seed=4,
    )


def test_oracle_join_many_to_many():
    run_join_oracle(
        lambda lt, r: join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "inner"),
        right=_drivers(["Sym"], SYM, "many", extra=[("ZZZ",)], max_rows=30), seed=5,
        n_cycles=cycles(1200), max_rows=60,
    )


def test_oracle_left_outer_join():
    run_join_oracle(
        lambda lt, r: left_outer_join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "left"),
        right=_drivers(["Sym"], SYM, "many", extra=[("ZZZ",)], max_rows=30), seed=6,
        n_cycles=cycles(900), max_rows=60,
    )


def test_oracle_left_outer_join_int_key_small_blocks():
    run_join_oracle(
        lambda lt, r: left_outer_join(lt, r, "Qty=RQ", match_bits=3),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["RQ"], OUT, "left"),
        right=_drivers(["RQ"], QTY[:12], "many", max_rows=20), seed=7, n_cycles=cycles(600), max_rows=60,
    )


# chains: a join's shifts feed another join, on either side -----------------------------------
_OUT2 = [("RId2", "RId"), ("RV2", "RV"), ("RS2", "RS")]
_J2 = ["RId2=RId", "RV2=RV", "RS2=RS"]


def _chain_oracle(seed: int, n_cycles: int) -> None:
    """``natural_join(join(left, r1, "Sym"), r2, "Qty=RQ")`` against recomputation."""
    run_join_oracle(
        lambda lt, r1, r2: natural_join(join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "inner"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=seed, n_cycles=n_cycles, max_rows=60,
    )


def test_oracle_chain_join_then_natural_join():
    # left shifts reach the natural join (join output moves rows when matches come and go)
    _chain_oracle(8, cycles(600))


def test_oracle_chain_outer_join_then_join_then_outer():
    run_join_oracle(
        lambda lt, r1, r2: left_outer_join(
            left_outer_join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2, match_bits=4),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "left"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[:10], "many", 25)],
        seed=9, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_chain_right_side_shifts():
    # the right side is itself a join, so it shifts, re-keys and removes under the left
    out = [("RId", "RId"), ("RV", "RV"), ("RS", "RS"), ("RId2", "RId2")]
    run_join_oracle(
        lambda lt, r1, r2: join(lt, left_outer_join(r1, r2, "RS", joins=["RId2=RId", "RQ"]), "Sym",
                               joins=["RId", "RV", "RS", "RId2"]),
        lambda lt, r1, r2: expected_join(
            lt, expected_join(r1, r2, ["RS"], ["RS"], [("RId2", "RId"), ("RQ", "RQ")], "left"),
            ["Sym"], ["Sym"], out, "inner"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 15),
                              RightDriver(g, rng, ["RQ"], QTY[:6], "many", 8)],
        seed=10, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_chain_natural_join_on_shifting_right():
    # the right side is a join unique on (Sym, Qty) whose rows shift as matches come and go
    inner = [("Qty", "Qty"), ("RV2", "RV")]
    out = [("RV", "RV"), ("RV2", "RV2")]
    run_join_oracle(
        lambda lt, ra, rb: natural_join(
            lt, join(ra, rb, "RS", joins=["Qty", "RV2=RV"]), ["Sym", "Qty"], joins=["RV", "RV2"]),
        lambda lt, ra, rb: expected_join(
            lt, expected_join(ra, rb, ["RS"], ["RS"], inner, "inner"),
            ["Sym", "Qty"], ["Sym", "Qty"], out, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "unique", 8),
                              RightDriver(g, rng, ["Qty"], QTY[:40], "unique", 40)],
        seed=11, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_tiny_amortization_thresholds(monkeypatch):
    # compaction, index merges and rebuilds, and hash-mode key maps on every few cycles
    monkeypatch.setattr(_rowkeymap, "SPARSE_SLACK", 0)
    monkeypatch.setattr(_groupindex, "INDEX_MIN_DELTA", 0)
    for name in ("INDEX_MIN_STALE", "POOL_MIN_GARBAGE"):
        monkeypatch.setattr(_joinstate, name, 0)
    run_join_oracle(
        lambda lt, r1, r2: natural_join(left_outer_join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "left"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=12, n_cycles=cycles(300), max_rows=60,
    )


def test_oracle_pending_codes_all_collide(monkeypatch):
    # every pending left row waits under one code, so each key a right row brings makes
    # all of them candidates: only the full hash (an exact integer key) or the re-lookup
    # by key values (string keys, two-column keys) may attach them
    monkeypatch.setattr(_joinstate, "_pending_code", lambda h: np.zeros(h.size, dtype=np.int64))
    _chain_oracle(15, cycles(300))
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, ["Sym", "Qty=RQ"]),
        lambda lt, r: expected_join(lt, r, ["Sym", "Qty"], ["Sym", "RQ"], OUT, "left"),
        right=_drivers(["Sym", "RQ"], [(s, q) for s in SYMS[:4] for q in range(-5, 15)], "unique",
                       max_rows=60),
        seed=16, n_cycles=cycles(300),
    )


# chains with where and sort -------------------------------------------------------------------
def _sorted(t, col):
    """Stable ascending sort with nulls last (the sort op's order)."""
    v = t.column(col).to_numpy(zero_copy_only=False).astype(float)
    return t.take(pa.array(np.argsort(np.where(np.isnan(v), np.inf, v), kind="stable")))


def _where_price(t, bound):
    price = t.column("Price").to_numpy(zero_copy_only=False).astype(float)
    return t.filter(pa.array(np.nan_to_num(price, nan=-np.inf) > bound))


def test_oracle_chain_where_natural_join_sort():
    # sort reads the join's previous values of modified rows and re-sorts on a joined column
    run_join_oracle(
        lambda lt, r: natural_join(lt.where(pc.field("Price") > 20), r, "Sym").sort("RV"),
        lambda lt, r: _sorted(expected_join(_where_price(lt, 20), r, ["Sym"], ["Sym"], OUT, "left"), "RV"),
        right=_drivers(["Sym"], SYM, "unique", extra=[("ZZZ",)]), seed=13, n_cycles=cycles(600),
    )


def test_oracle_chain_sort_join_sort():
    # the sort's shifts and gapped keys reach both joins as their left side
    _OUT3 = [("RV3", "RV"), ("RS3", "RS")]
    run_join_oracle(
        lambda lt, r1, r2: natural_join(join(lt.sort("Price"), r1, "Sym").sort("RV"), r2,
                                        "Qty=RQ", joins=["RV3=RV", "RS3=RS"]),
        lambda lt, r1, r2: expected_join(
            _sorted(expected_join(_sorted(lt, "Price"), r1, ["Sym"], ["Sym"], OUT, "inner"), "RV"),
            r2, ["Qty"], ["RQ"], _OUT3, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=14, n_cycles=cycles(600), max_rows=60,
    )


# insert-only parents: the join never removes or modifies, agg_by keeps running min/max -------
class AppendRight:
    """An append-only right table (``RId``, ``Sym``, ``RV``, ``RS``): a few rows a cycle on
    three keys of :data:`SYMS` (some null), so a right row often arrives after the left rows
    it matches, and left rows outgrow their blocks as their keys gain rows."""

    def __init__(self, graph, rng, max_rows):
        self.rng, self.max_rows, self.next_id = rng, max_rows, 0
        self.schema = pa.schema([("RId", pa.int64()), ("Sym", pa.string()), ("RV", pa.float64()),
                                 ("RS", pa.string())])
        self.table = graph.append_only_table(self.schema, name="right")

    def step(self):
        r = self.rng
        n = int(r.integers(0, 4)) if self.table.size < self.max_rows else 0
        if n == 0 or r.random() < 0.2:
            return
        sym = SYMS[r.integers(0, 3, n)].copy()  # three keys: blocks outgrown often
        sym[r.random(n) < 0.1] = None
        rv = [None if r.random() < 0.1 else float(r.integers(0, 50)) for _ in range(n)]
        rs = [None if r.random() < 0.1 else str(r.choice(["x", "y", "z"])) for _ in range(n)]
        self.table.append(pa.table({"RId": np.arange(self.next_id, self.next_id + n), "Sym": sym,
                                    "RV": rv, "RS": rs}, schema=self.schema))
        self.next_id += n


_RUNNING = [agg.min("Price", "Lo"), agg.max("RV", "HiRV"), agg.max("Qty", "HiQ"), agg.count("N"),
            agg.sum("Qty", "S"), agg.first("RS", "FRS"), agg.last("RV", "LRV")]
_RUNNING_TYPES = [pa.float64(), pa.float64(), pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.float64()]


def _running_expected(t, by):
    """``_RUNNING`` by ``by`` from scratch: groups in order of their first row, min/max over
    non-null values (null for a group without one), first/last of every row."""
    groups: dict[tuple, list[dict]] = {}
    for row in t.to_pylist():
        groups.setdefault(tuple(row[c] for c in by), []).append(row)

    def ext(f, rows, c):
        vals = [r[c] for r in rows if r[c] is not None]
        return f(vals) if vals else None

    out = []
    for key, rows in groups.items():
        out.append((*key, ext(min, rows, "Price"), ext(max, rows, "RV"), ext(max, rows, "Qty"), len(rows),
                    sum(r["Qty"] for r in rows), rows[0]["RS"], rows[-1]["RV"]))
    names = [*by, *(a.name for a in _RUNNING)]
    types = [t.schema.field(c).type for c in by] + _RUNNING_TYPES
    return pa.table({n: pa.array([o[i] for o in out], ty) for i, (n, ty) in enumerate(zip(names, types, strict=True))})


@pytest.mark.parametrize("running", [True, False], ids=["running", "sorted-states"])
@pytest.mark.parametrize("by", [["Sym"], ["RS", "Sym"]])
def test_oracle_agg_over_insert_only_join(monkeypatch, running, by):
    """Append-only left and right: the join (and a where over it) is insert-only, never
    removes or modifies a row (every update checked), and agg_by over it keeps running
    min/max — or, switched off, the sorted states — equal to the recomputation."""
    monkeypatch.setattr(_agglistener, "RUNNING_OVER_INSERTS", running)
    above = pc.field("Qty") > 10
    broken: list[str] = []
    seen = {"shifts": 0, "inside": 0}  # the cases that make the join insert-only, not add-only

    def watch(up, t):
        if up.removed or up.modified:
            broken.append(str(up))
        seen["shifts"] += bool(up.shifted)
        seen["inside"] += bool(up.added and t.prev_rowset and up.added.first() <= t.prev_rowset.last())

    def build(lt, r):
        j = join(lt, r, "Sym")
        w = j.where(above)
        assert j.insert_only and w.insert_only and not j.add_only
        j.listen(watch)
        res = agg_by(w, _RUNNING, by)
        states = {type(s) for s in res.listener.states.values()}
        assert (RunningExtremes in states) is running and (OrderStats in states) is not running
        assert RowEnds not in states  # first/last need the row-key set: rows arrive anywhere
        return res

    def expected(lt, r):
        j = expected_join(lt, r, ["Sym"], ["Sym"], OUT, "inner")
        return _running_expected(j.filter(pc.greater(j.column("Qty"), 10)), by)

    run_join_oracle(build, expected, right=lambda g, rng: [AppendRight(g, rng, 60)],
                    seed=17 + len(by), n_cycles=cycles(150), kinds=("append",), max_rows=60)
    assert not broken, broken[:3]
    assert seen["shifts"] and seen["inside"], seen


# small right updates: one or two right rows a cycle ---------------------------------------------
class SmallRightDriver(RightDriver):
    """:class:`RightDriver` changing at most two right rows a cycle (q5's window tops: one
    re-keyed to a new key now and then), so the join's right side interns one new key at a
    time and builds outputs of a few rows (the few-key intern, the few-range bitmaps)."""

    def step(self):
        r = self.rng
        rows = dict(self.rows)
        ids = list(rows)
        upserts, deletes = {}, []
        for _ in range(int(r.integers(0, 3))):
            act = r.random()
            rid = int(r.choice(ids)) if ids else -1
            if rid in upserts or rid in deletes:
                continue
            if rid >= 0 and act < 0.5:  # re-key to a (usually) new key
                pool = self._free_keys(rows) if self.mode != "many" else range(len(self.all_keys))
                pool = list(pool)
                if pool:
                    upserts[rid] = (int(r.choice(pool)), *rows[rid][1:])
                    rows[rid] = upserts[rid]
            elif rid >= 0 and act < 0.6:
                upserts[rid] = (rows[rid][0], *self._vals())
                rows[rid] = upserts[rid]
            elif rid >= 0 and act < 0.75:
                rows.pop(rid)
                deletes.append(rid)
            elif len(rows) < self.max_rows:
                pool = self._free_keys(rows) if self.mode != "many" else range(len(self.all_keys))
                pool = list(pool)
                if pool:
                    nid = self._new_id()
                    while nid in rows or nid in deletes:
                        nid = self._new_id()
                    upserts[nid] = (int(r.choice(pool)), *self._vals())
                    rows[nid] = upserts[nid]
        self._write(upserts, deletes)


@pytest.mark.parametrize("how", ["natural", "join", "outer"])
def test_oracle_small_right_updates_two_keys(how):
    """A two-column key (stored and verified, not exact) whose right side changes by one or
    two rows a cycle, as q5's per-window top: each new key is interned alone."""
    dom = [(s, q) for s in SYMS[:4] for q in range(-5, 15)]
    mode = "unique" if how == "natural" else "many"
    verb = {"natural": natural_join, "join": join, "outer": left_outer_join}[how]
    run_join_oracle(
        lambda lt, r: verb(lt, r, ["Sym", "Qty"]),
        lambda lt, r: expected_join(lt, r, ["Sym", "Qty"], ["Sym", "Qty"], OUT,
                                    "inner" if how == "join" else "left"),
        right=lambda g, rng: [SmallRightDriver(g, rng, ["Sym", "Qty"], dom, mode, 30)],
        seed=31, n_cycles=cycles(600), max_rows=60,
    )


# q5's shape: counts joined with their group's top count ------------------------------------------
def _counts_and_tops(t):
    """Counts per (Sym, W = Qty & 7) in order of each group's first row, and the join of
    each count with its W's highest count on (W, num == maxn), from scratch."""
    groups: dict[tuple, int] = {}
    for sym, qty in zip(t.column("Sym").to_pylist(), t.column("Qty").to_pylist(), strict=True):
        key = (sym, qty & 7)
        groups[key] = groups.get(key, 0) + 1
    top: dict[int, int] = {}
    for (_, w), n in groups.items():
        top[w] = max(top.get(w, 0), n)
    rows = [(*k, n) for k, n in groups.items() if n == top[k[1]]]
    return pa.table({"Sym": pa.array([r[0] for r in rows], pa.string()),
                     "W": pa.array([r[1] for r in rows], pa.int64()),
                     "num": pa.array([r[2] for r in rows], pa.int64())})


def test_oracle_counts_joined_with_their_top(monkeypatch):
    """q5's join: every count that changes re-keys its left row to a new (W, num), most
    to keys no right row has (cycles in which the join is silent), while the right side,
    each W's top, moves by a row or two now and then (a left row meeting the new top).
    Append-only (counts only rise, as q5's), then keyed and ring sources (counts fall,
    groups go, rows shift)."""
    from engine.ops.join.listener import JoinListener

    seen = {"silent": 0, "other": 0}
    unmatched = JoinListener._unmatched

    def counting(self, d, lu):
        out = unmatched(self, d, lu)
        seen["silent" if out else "other"] += 1
        return out

    monkeypatch.setattr(JoinListener, "_unmatched", counting)

    def build(lt):
        counts = lt.update(W=pc.bit_wise_and(pc.field("Qty"), 7)).count_by("num", by=["Sym", "W"])
        top = counts.agg_by([agg.max("num", "maxn")], by="W")
        return join(counts, top, ["W", "num=maxn"], [])

    run_join_oracle(build, _counts_and_tops, right=lambda g, rng: [], seed=41,
                    n_cycles=cycles(600), kinds=("append",), max_rows=1000)
    assert seen["silent"] > 50 and seen["other"] > 50, seen
    run_join_oracle(build, _counts_and_tops, right=lambda g, rng: [], seed=43,
                    n_cycles=cycles(400), kinds=("keyed", "ring"), max_rows=150)
