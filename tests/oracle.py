"""The shared oracle (our EvalNugget): random sources, incremental vs recomputed.

``run_oracle(build, expected)`` drives a random source (append-only, keyed with modifies
and deletes, ring) through many cycles — adds, removes, modifies of some or all columns,
all-rows-modified cycles, emptied tables, empty cycles, nulls — with ``validate`` on every
update of every table, and after each cycle checks that

* the derived table equals ``expected(source.to_pandas())`` recomputed from scratch, and
* a :class:`ReplayChecker` rebuilt from the derived table's updates equals it.

It prints the seed, kind and cycle before it asserts. ``TICKTABLE_CYCLES`` scales the runs;
``TICKTABLE_SEED_MIX=N`` runs them over other random cycles (tests/seeds.py).
An append-only source stops growing at four times ``max_rows``; its kind ends after the
first empty cycle over the full table (:attr:`RandomSource.exhausted`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pytest

from engine.graph import UpdateGraph
from engine.table import Table
from tests.frames import identical
from tests.replay import ReplayChecker

SCHEMA = pa.schema([("Sym", pa.string()), ("Key", pa.int64()), ("Price", pa.float64()), ("Qty", pa.int64())])
SYMS = np.array(["AAPL", "MSFT", "GOOG", "IBM", "ORCL", "AMZN", "META", "NFLX"], dtype=object)
KINDS = ("append", "keyed", "ring")


def arrow_project(tbl: pa.Table, columns: dict[str, pc.Expression]) -> pa.Table:
    """``columns`` computed over ``tbl`` by Arrow's own Acero, independent of the engine's
    expression code: one thread, rows in order (``pyarrow.dataset`` and ``Table.filter``
    run the same plan on a thread pool, at about three times the cost for a small table)."""
    return acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(tbl)),
        acero.Declaration("project", acero.ProjectNodeOptions(list(columns.values()), list(columns))),
    ]).to_table(use_threads=False)


def arrow_filter(tbl: pa.Table, predicate: pc.Expression) -> pa.Table:
    """The rows of ``tbl`` where ``predicate`` is true, by Acero (as :func:`arrow_project`)."""
    return acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(tbl)),
        acero.Declaration("filter", acero.FilterNodeOptions(predicate)),
    ]).to_table(use_threads=False)


def cycles(default: int = 2100) -> int:
    """Cycles per oracle run (``TICKTABLE_CYCLES`` overrides)."""
    return int(os.environ.get("TICKTABLE_CYCLES", default))


def share_cycles(monkeypatch: pytest.MonkeyPatch, ways: int) -> None:
    """Give this test ``1/ways`` of the cycles: for an oracle run once per way an operation
    can be forced (a threshold set each way, a merge constant), so that the operation still
    gets :func:`cycles` in all and each way at least a thousand by default."""
    monkeypatch.setenv("TICKTABLE_CYCLES", str(max(1, cycles() // ways)))


class RandomSource:
    """A source table of ``kind`` with a random writer, one batch of writes per cycle."""

    def __init__(self, graph: UpdateGraph, kind: str, rng: np.random.Generator, max_rows: int = 120) -> None:
        self.kind, self.rng, self.max_rows = kind, rng, max_rows
        if kind == "append":
            self.table = graph.append_only_table(SCHEMA, name="src")
        elif kind == "keyed":
            self.table = graph.keyed_table(SCHEMA, "Key", name="src")
        elif kind == "ring":
            self.table = graph.ring_table(SCHEMA, int(rng.integers(5, max_rows)), name="src")
        else:
            raise ValueError(kind)
        self.next_key = 0
        self.idle_when_full = 0  # cycles an append-only source skipped: it stopped growing

    @property
    def exhausted(self) -> bool:
        """An append-only source that stopped growing (at four times ``max_rows``) and has
        had one empty cycle since: every later cycle is that same empty cycle over the same
        rows, so an oracle checking the source's derived tables alone can stop its kind."""
        return self.idle_when_full > 0

    def _rows(self, n: int, keys: np.ndarray | None = None) -> pa.Table:
        r = self.rng
        if keys is None:
            keys = np.arange(self.next_key, self.next_key + n)
            self.next_key += n
        sym = SYMS[r.integers(0, SYMS.size, n)].copy()
        sym[r.random(n) < 0.05] = None
        price = r.integers(0, 40, n).astype(float) * 2.5
        price_mask = r.random(n) < 0.05
        return pa.table({
            "Sym": pa.array(sym, pa.string()),
            "Key": pa.array(keys, pa.int64()),
            "Price": pa.array(price, pa.float64(), mask=price_mask),
            "Qty": pa.array(r.integers(-5, 100, n), pa.int64()),
        })

    def step(self, cur: pa.Table | None = None) -> None:
        """One cycle's writes. ``cur`` is the source's rows now (``table.to_arrow()``) when
        the caller has them already: a keyed source reads them to pick its modifies."""
        r = self.rng
        roll = r.random()
        if roll < 0.1:
            return  # empty cycle
        if self.kind in ("append", "ring"):
            if self.kind == "append" and self.table.size > 4 * self.max_rows:
                self.idle_when_full += 1
                return
            self.table.append(self._rows(int(r.integers(0, 12))))
            return
        t = self.table
        if cur is None:
            cur = t.to_arrow()
        existing = cur.column("Key").to_numpy()
        if roll < 0.13 and existing.size:
            t.delete(pa.table({"Key": existing}))  # empty the table
            return
        if roll < 0.18 and existing.size:
            # every row modified, in one column or all
            new = self._rows(existing.size, existing)
            t.upsert(self._mix(cur, new, r.choice(["Sym", "Price", "Qty", "all"])))
            return
        n_new = int(r.integers(0, 8)) if t.size < self.max_rows else 0
        if n_new:
            t.upsert(self._rows(n_new))
        if existing.size:
            m = int(r.integers(0, min(existing.size, 10) + 1))
            pick = r.choice(existing, m, replace=False)
            old = cur.filter(pa.array(np.isin(existing, pick)))
            new = self._rows(old.num_rows, old.column("Key").to_numpy())
            t.upsert(self._mix(old, new, r.choice(["Sym", "Price", "Qty", "all", "none"])))
            d = int(r.integers(0, min(existing.size, 6) + 1))
            gone = r.choice(existing, d, replace=False)
            t.delete(pa.table({"Key": np.concatenate((gone, [10**9]))}))  # plus an absent key

    @staticmethod
    def _mix(old: pa.Table, new: pa.Table, which: str) -> pa.Table:
        if which == "all":
            return new
        if which == "none":
            return old
        i = old.schema.get_field_index(which)
        return old.set_column(i, which, new.column(which))


def assert_same(got: pd.DataFrame, want: pd.DataFrame, context: str) -> None:
    got = got.reset_index(drop=True)
    want = want.reset_index(drop=True)
    if identical(got, want):  # assert_frame_equal would pass: skip its cost (~1 ms a frame)
        return
    try:
        pd.testing.assert_frame_equal(got, want, check_dtype=False, check_index_type=False)
    except AssertionError:
        print(f"MISMATCH {context}\n--- incremental ---\n{got}\n--- recomputed ---\n{want}")
        raise


def run_oracle(
    build: Callable[[Table], Table],
    expected: Callable[[pd.DataFrame], pd.DataFrame],
    *,
    seed: int = 0,
    n_cycles: int | None = None,
    kinds: tuple[str, ...] = KINDS,
    max_rows: int = 120,
    compare: Callable[[pd.DataFrame, pd.DataFrame, str], None] | None = None,
    step: Callable[[RandomSource, pa.Table | None, int], None] | None = None,
) -> None:
    """Check ``build(source)`` against ``expected(source_df)`` over random cycles of each kind.

    ``compare(got, want, context)`` replaces the ordered comparison for results whose row
    order depends on history (aggregations keep a group's row key for its life).
    ``step(source, rows, cycle)`` writes a cycle instead of ``source.step(rows)`` (``rows``:
    the source's rows now, or None), for a test whose cycles must include a shape whatever
    the seed (it calls ``source.step(rows)`` for the cycles it leaves random).
    """
    check = compare if compare is not None else assert_same
    total = n_cycles if n_cycles is not None else cycles()
    per_kind = max(1, total // len(kinds))
    for k_i, kind in enumerate(kinds):
        rng = np.random.default_rng([seed, k_i])
        g = UpdateGraph(validate=True)
        src = RandomSource(g, kind, rng, max_rows)
        result = build(src.table)
        replay = ReplayChecker(result)
        src_now = None  # the source's rows after the last cycle: the next step reads them
        for c in range(per_kind):
            if step is None:
                src.step(src_now)
            else:
                step(src, src_now, c)
            g.run_cycle()
            ctx = f"seed={seed} kind={kind} cycle={c}"
            if result.failure is not None:
                raise AssertionError(f"{ctx}: result failed") from result.failure
            # one snapshot of each table per cycle, shared by the checks (nothing runs between)
            got, src_now = result.to_arrow(), src.table.to_arrow()
            check(got.to_pandas(), expected(src_now.to_pandas()), ctx)
            try:
                replay.check(got)
            except AssertionError:
                print(f"REPLAY MISMATCH {ctx}")
                raise
            if src.exhausted:  # the rest of this kind's cycles would repeat this one
                break
