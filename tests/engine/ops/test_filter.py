"""where: example cycles with exact updates, then the oracle (random sources) and a shifting
source (``tests.shifting``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import expr as _expr
from engine.errors import ExpressionError
from engine.graph import UpdateGraph
from engine.rowset import RowSetShiftData
from engine.update import TableUpdate
from tests.oracle import SCHEMA, run_oracle
from tests.shifting import (
    ScriptedTable,
    assert_update,
    keyed,
    record,
    rows,
    rs,
    run_shifting_oracle,
)

# ---------------------------------------------------------------------------------------
# examples

PRICE_OVER_50 = pc.field("Price") > 50


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
