"""Helpers shared by the op tests: exact-update assertions, and a source that shifts.

No source table emits shifts, but sort, head and others do, and every op must pass
shifts through correctly: ``ScriptedTable`` is a source whose next update is given
exactly (shifts included) and ``run_shifting_oracle`` drives one randomly, with the same
recompute and replay checks as ``tests.oracle.run_oracle``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.columns import WritableColumnSource, make_column_source
from engine.graph import UpdateGraph
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Table
from engine.update import TableUpdate
from tests.oracle import SCHEMA, SYMS, assert_same
from tests.replay import ReplayChecker


class ScriptedTable(Table):
    """A source whose next update is given exactly, shifts included.

    ``stage(update, writes)``: at the next cycle, values move with ``update.shifted``
    (previous values kept), then each ``(keys, rows)`` write stores ``rows``' columns at
    ``keys`` (current key space), and ``update`` is the table's update.
    """

    def __init__(self, graph: UpdateGraph, schema: pa.Schema, keys, rows: pa.Table) -> None:
        self._storage: dict[str, WritableColumnSource] = {
            f.name: make_column_source(f.type) for f in schema
        }
        k = np.asarray(keys, dtype=np.int64)
        super().__init__(graph, schema, dict(self._storage), RowSet.from_keys(k), name="scripted")
        for name, src in self._storage.items():
            if k.size:
                src.ensure_capacity(int(k.max()) + 1)
                src.set(k, rows.column(name))
        self._staged: tuple[TableUpdate, list[tuple[np.ndarray, pa.Table]]] | None = None

    def stage(self, update: TableUpdate, writes: list[tuple[object, pa.Table]] = ()) -> None:
        self._staged = (update, [(np.asarray(k, dtype=np.int64), r) for k, r in writes])

    def _compute_update(self) -> TableUpdate | None:
        if self._staged is None:
            return None
        update, writes = self._staged
        self._staged = None
        for src in self._storage.values():
            self.graph.track(src)
        prev_keys, cur_keys = update.shifted.moved_keys(self.rowset - update.removed)
        for src in self._storage.values():
            src.move(prev_keys, cur_keys)
        for keys, rows in writes:
            for name in rows.column_names:
                self._storage[name].set(keys, rows.column(name))
        return update


def rows(sym=None, key=None, price=None, qty=None, n=None) -> pa.Table:
    """A table in the oracle schema; omitted columns are filled with defaults."""
    n = n if n is not None else len(next(c for c in (sym, key, price, qty) if c is not None))
    return pa.table({
        "Sym": pa.array(sym if sym is not None else ["X"] * n, pa.string()),
        "Key": pa.array(key if key is not None else list(range(n)), pa.int64()),
        "Price": pa.array(price if price is not None else [1.0] * n, pa.float64()),
        "Qty": pa.array(qty if qty is not None else [1] * n, pa.int64()),
    })


def record(table: Table) -> list[TableUpdate]:
    seen: list[TableUpdate] = []
    table.listen(lambda up, _t: seen.append(up))
    return seen


def rs(*keys: int) -> RowSet:
    return RowSet.from_keys(list(keys))


def assert_update(
    up: TableUpdate,
    added=(),
    removed=(),
    modified=(),
    shifted=((), (), ()),
    modified_columns=(),
) -> None:
    assert up.added.keys().tolist() == list(added), f"added {up.added}"
    assert up.removed.keys().tolist() == list(removed), f"removed {up.removed}"
    assert up.modified.keys().tolist() == list(modified), f"modified {up.modified}"
    assert up.shifted == RowSetShiftData.from_arrays(*shifted), f"shifted {up.shifted}"
    assert up.modified_columns == frozenset(modified_columns), f"cols {up.modified_columns}"


class ShiftingSource:
    """Random cycles on a :class:`ScriptedTable`: removes, one or two shifted ranges,
    adds into key gaps, modifies of random column subsets, empty cycles."""

    def __init__(self, graph: UpdateGraph, rng: np.random.Generator, max_rows: int = 60) -> None:
        self.rng, self.max_rows, self.next_id = rng, max_rows, 0
        keys = np.sort(rng.choice(40, 12, replace=False))
        self.table = ScriptedTable(graph, SCHEMA, keys, self._rows(keys.size))

    def _rows(self, n: int) -> pa.Table:
        r = self.rng
        sym = SYMS[r.integers(0, SYMS.size, n)].copy()
        sym[r.random(n) < 0.05] = None
        ids = np.arange(self.next_id, self.next_id + n)
        self.next_id += n
        return pa.table({
            "Sym": pa.array(sym, pa.string()),
            "Key": pa.array(ids, pa.int64()),
            "Price": pa.array(r.integers(0, 40, n) * 2.5, pa.float64(), mask=r.random(n) < 0.1),
            "Qty": pa.array(r.integers(-5, 100, n), pa.int64()),
        })

    def _shift(self, survivors: np.ndarray) -> tuple[RowSetShiftData, np.ndarray]:
        r = self.rng
        n = survivors.size
        if n == 0 or r.random() < 0.3:
            return RowSetShiftData.empty(), survivors
        cut = np.sort(r.integers(0, n, 2))
        deltas = r.integers(-6, 12, 2)
        new = survivors.copy()
        new[cut[0]:cut[1]] += deltas[0]
        new[cut[1]:] += deltas[1]
        if (new < 0).any() or (np.diff(new) <= 0).any():
            return RowSetShiftData.empty(), survivors
        return RowSetShiftData.from_moves(survivors, new), new

    def step(self) -> None:
        r, t = self.rng, self.table
        if r.random() < 0.1:
            return
        keys = t.rowset.keys()
        gone = r.choice(keys, int(r.integers(0, min(keys.size, 5) + 1)), replace=False)
        if r.random() < 0.03:
            gone = keys  # empty the table
        survivors = np.setdiff1d(keys, gone)
        shifted, moved = self._shift(survivors)
        n_add = int(r.integers(0, 7)) if moved.size < self.max_rows else 0
        top = int(moved.max()) + 15 if moved.size else 30
        free = np.setdiff1d(np.arange(top), moved)
        added = np.sort(r.choice(free, min(n_add, free.size), replace=False))
        m = int(r.integers(0, min(moved.size, 8) + 1))
        if r.random() < 0.05:
            m = moved.size  # every row modified
        modified = np.sort(r.choice(moved, m, replace=False))
        cols = [c for c in SCHEMA.names if r.random() < 0.5] or ["Price"]
        writes = [(added, self._rows(added.size))]
        if modified.size:
            writes.append((modified, self._rows(modified.size).select(cols)))
        t.stage(TableUpdate.of(
            added=RowSet.from_keys(added, assume_sorted=True),
            removed=RowSet.from_keys(np.sort(gone)),
            modified=RowSet.from_keys(modified, assume_sorted=True),
            shifted=shifted,
            modified_columns=cols,
        ), writes)


def run_shifting_oracle(
    cases: list[tuple[Callable[[Table], Table], Callable[[pd.DataFrame], pd.DataFrame]]],
    *,
    seed: int,
    n_cycles: int = 400,
) -> None:
    """Like ``tests.oracle.run_oracle`` (validate, recompute, replay) over a shifting source;
    several ``(build, expected)`` cases share one source, checked after every cycle."""
    g = UpdateGraph(validate=True)
    src = ShiftingSource(g, np.random.default_rng(seed))
    results = [(build(src.table), expected) for build, expected in cases]
    replays = [ReplayChecker(t) for t, _ in results]
    for c in range(n_cycles):
        src.step()
        g.run_cycle()
        assert src.table.failure is None, src.table.failure
        df = src.table.to_pandas()
        for i, ((table, expected), replay) in enumerate(zip(results, replays, strict=True)):
            ctx = f"shifting seed={seed} case={i} cycle={c}"
            if table.failure is not None:
                raise AssertionError(f"{ctx}: result failed") from table.failure
            got = table.to_arrow()  # one snapshot for both checks
            assert_same(got.to_pandas(), expected(df), ctx)
            replay.check(got)



def keyed(graph: UpdateGraph) -> Table:
    t = graph.keyed_table(SCHEMA, "Key")
    t.upsert(rows(key=[1, 2, 3, 4, 5], price=[10.0, 60.0, None, 70.0, 55.0], qty=[1, 2, 3, 4, 5]))
    graph.run_cycle()
    return t
