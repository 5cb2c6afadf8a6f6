"""where: example cycles with exact updates, then the oracle (random sources) and a shifting
source (``ScriptedTable``, shared with the other op tests of this folder: no source table
emits shifts, but sort and other ops do, and shifts must pass through correctly)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.columns import WritableColumnSource, make_column_source
from engine.errors import ExpressionError
from engine.graph import UpdateGraph
from engine.ops import _expr
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Table
from engine.update import TableUpdate
from tests.oracle import SCHEMA, SYMS, assert_same, run_oracle
from tests.replay import ReplayChecker

# ---------------------------------------------------------------------------------------
# helpers shared by the op tests


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
            assert_same(table.to_pandas(), expected(df), ctx)
            replay.check()


# ---------------------------------------------------------------------------------------
# examples

PRICE_OVER_50 = pc.field("Price") > 50


def keyed(graph: UpdateGraph) -> Table:
    t = graph.keyed_table(SCHEMA, "Key")
    t.upsert(rows(key=[1, 2, 3, 4, 5], price=[10.0, 60.0, None, 70.0, 55.0], qty=[1, 2, 3, 4, 5]))
    graph.run_cycle()
    return t


def test_where_adds_removes_and_modifies():
    g = UpdateGraph(validate=True)
    t = keyed(g)  # row keys 0..4 for Key 1..5
    w = t.where(PRICE_OVER_50)
    assert w.rowset == rs(1, 3, 4)
    seen = record(w)

    # Key1 starts matching, Key2 stops, Key4 changes but still matches
    t.upsert(rows(key=[1, 2, 4], price=[80.0, 20.0, 75.0], qty=[1, 2, 4]))
    g.run_cycle()
    assert_update(seen[-1], added=[0], removed=[1], modified=[3], modified_columns={"Price"})

    # Key4 deleted, Key2 (not in the result) deleted, Key6 inserted matching, Key7 not
    t.delete(pa.table({"Key": [4, 2]}))
    t.upsert(rows(key=[6, 7], price=[99.0, 1.0]))
    g.run_cycle()
    assert_update(seen[-1], added=[5], removed=[3])
    assert w.to_pandas().Key.tolist() == [1, 5, 6]

    # an empty cycle and a cycle touching only non-matching rows: no update at all
    g.run_cycle()
    t.upsert(rows(key=[7], price=[2.0]))
    g.run_cycle()
    assert len(seen) == 2


def test_where_passes_a_qty_modify_through_without_evaluating(monkeypatch):
    g = UpdateGraph(validate=True)
    t = keyed(g)
    w = t.where(PRICE_OVER_50)
    seen = record(w)
    evaluated: list[int] = []
    real = _expr.predicate_mask

    def counting(bound, columns, n):
        evaluated.append(n)
        return real(bound, columns, n)

    monkeypatch.setattr(_expr, "predicate_mask", counting)
    t.upsert(rows(key=[2, 3, 5], price=[60.0, None, 55.0], qty=[20, 30, 50]))  # Qty only
    g.run_cycle()
    assert_update(seen[-1], modified=[1, 4], modified_columns={"Qty"})
    assert evaluated == []  # membership cannot change: the predicate does not read Qty

    t.upsert(rows(key=[2], price=[61.0], qty=[20]))  # Price: evaluated, on that row only
    g.run_cycle()
    assert evaluated == [1]
    assert_update(seen[-1], modified=[1], modified_columns={"Price"})


def test_where_passes_shifts_through_and_reports_removes_pre_shift():
    g = UpdateGraph(validate=True)
    s = ScriptedTable(g, SCHEMA, [0, 2, 4, 6, 8], rows(price=[60.0, 10.0, 70.0, 80.0, 20.0]))
    w = s.where(PRICE_OVER_50)
    assert w.rowset == rs(0, 4, 6)
    seen = record(w)

    # remove 2; keys 4..8 move up by 10; the row now at 16 (was 6) stops matching and
    # the one at 18 (was 8) starts; new rows at 3 (matches) and 20 (does not)
    s.stage(TableUpdate.of(
        removed=rs(2), shifted=RowSetShiftData.from_arrays([4], [8], [10]),
        added=rs(3, 20), modified=rs(16, 18), modified_columns=["Price"],
    ), [([3, 20], rows(price=[90.0, 10.0])), ([16, 18], rows(price=[5.0, 99.0]).select(["Price"]))])
    g.run_cycle()
    assert_update(seen[-1], added=[3, 18], removed=[6], shifted=([4], [8], [10]))
    assert w.rowset == rs(0, 3, 14, 18)
    assert w.to_pandas().Price.tolist() == [60.0, 90.0, 70.0, 99.0]

    # a Qty modify of a shifted row is a modify in the current key space
    s.stage(TableUpdate.of(modified=rs(14), modified_columns=["Qty"]),
            [([14], rows(qty=[7]).select(["Qty"]))])
    g.run_cycle()
    assert_update(seen[-1], modified=[14], modified_columns={"Qty"})

    # a shift that moves none of the result's rows is not reported
    s.stage(TableUpdate.of(removed=rs(20), shifted=RowSetShiftData.from_arrays([16], [16], [1])))
    g.run_cycle()
    assert len(seen) == 2
    assert w.rowset == rs(0, 3, 14, 18)


def test_where_constant_and_null_predicates():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    assert t.where(pc.scalar(True)).size == 5
    assert t.where(pc.field("Price").is_null()).to_pandas().Key.tolist() == [3]
    # null compares as null, and null counts as false
    assert t.where(~PRICE_OVER_50).to_pandas().Key.tolist() == [1]


def test_where_errors_name_the_problem():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    with pytest.raises(ExpressionError, match="'Pricee'.*has: Sym, Key, Price, Qty"):
        t.where(pc.field("Pricee") > 1)
    with pytest.raises(ExpressionError, match="must be boolean.*double"):
        t.where(pc.field("Price") * 2)
    with pytest.raises(ExpressionError, match="by position"):
        t.where(pc.field(2) > 1)
    with pytest.raises(ExpressionError, match="expected a pyarrow.compute.Expression"):
        t.where("Price > 50")
    with pytest.raises(ExpressionError, match="invalid"):
        t.where(pc.field("Sym") > 3)


def test_where_evaluation_errors_are_expression_errors():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    as_int = pc.field("Sym").cast(pa.int64()) > 0
    with pytest.raises(ExpressionError, match="evaluating"):
        t.where(as_int)  # the current rows are evaluated when the table is built
    e = g.keyed_table(SCHEMA, "Key")
    w = e.where(as_int)
    e.upsert(rows(key=[1], sym=["12"]))
    g.run_cycle()
    assert w.size == 1
    e.upsert(rows(key=[2], sym=["x"]))
    g.run_cycle()
    assert isinstance(w.failure, ExpressionError) and e.failure is None


def test_bind_finds_inputs_and_keeps_row_order_at_scale():
    b = _expr.bind((pc.field("Qty") > 1) & pc.field("Sym").isin(["A"]), SCHEMA,
                   table_name="t", what="predicate")
    assert b.inputs == ("Sym", "Qty")
    assert _expr.bind(pc.scalar(1), SCHEMA, table_name="t", what="c").inputs == ()
    x = np.random.default_rng(0).random(300_000)
    got = _expr.predicate_mask(_expr.bind(pc.field("x") > 0.5, pa.schema([("x", pa.float64())]),
                                          table_name="t", what="p"), {"x": pa.array(x)}, x.size)
    assert np.array_equal(got, x > 0.5)


# ---------------------------------------------------------------------------------------
# oracle


def test_where_oracle_price_with_nulls():
    run_oracle(lambda t: t.where(PRICE_OVER_50), lambda df: df[df.Price > 50], seed=11)


def test_where_update_head_chain_oracle():
    pred = pc.field("Sym").isin(["AAPL", "MSFT", "IBM"]) & (pc.field("Qty") > 20)

    def expected(df):
        out = df[df.Sym.isin(["AAPL", "MSFT", "IBM"]) & (df.Qty > 20)]
        return out.assign(N=out.Price * out.Qty).head(7)

    run_oracle(lambda t: t.where(pred).update(N=pc.field("Price") * pc.field("Qty")).head(7),
               expected, seed=12)


def test_where_over_a_shifting_source():
    run_shifting_oracle([
        (lambda t: t.where(PRICE_OVER_50), lambda df: df[df.Price > 50]),
        (lambda t: t.where(pc.field("Qty") < 30), lambda df: df[df.Qty < 30]),
        (lambda t: t.where(pc.field("Sym") == "AAPL").where(pc.field("Price") < 60),
         lambda df: df[(df.Sym == "AAPL") & (df.Price < 60)]),
    ], seed=13)
