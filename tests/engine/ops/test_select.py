"""update / select / view / drop_columns / rename_columns: examples, then the oracles."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import expr as _expr
from engine.errors import ExpressionError, SchemaError
from engine.graph import UpdateGraph
from engine.ops.select import _RowSlots
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

P, Q, S = pc.field("Price"), pc.field("Qty"), pc.field("Sym")


def counting_evaluate(monkeypatch) -> list[tuple[list[str], int]]:
    seen: list[tuple[list[str], int]] = []
    real = _expr.evaluate_many

    def counting(bounds, columns, n):
        seen.append(([b.text for b in bounds], n))
        return real(bounds, columns, n)

    monkeypatch.setattr(_expr, "evaluate_many", counting)
    return seen


# ---------------------------------------------------------------------------------------
# examples


def test_update_in_order_replacing_and_modified_columns(monkeypatch):
    g = UpdateGraph(validate=True)
    t = keyed(g)  # Key 1..5 -> row keys 0..4; Price 10, 60, null, 70, 55; Qty 1..5
    u = t.update(Price=P * 2, N=P * Q, C=pc.scalar(7))
    assert u.column_names == ["Sym", "Key", "Price", "Qty", "N", "C"]
    df = u.to_pandas()
    assert df.N.tolist()[:2] == [20.0, 240.0]  # N reads the doubled Price
    assert u.column("Sym") is t.column("Sym") and u.column("Qty") is t.column("Qty")
    seen = record(u)
    evaluated = counting_evaluate(monkeypatch)

    t.upsert(rows(key=[1, 2], price=[10.0, 60.0], qty=[10, 2]))  # Qty of Key1 only
    g.run_cycle()
    assert_update(seen[-1], modified=[0], modified_columns={"Qty", "N"})
    # N only, on that row; Price (reads Price) and C (constant) are kept
    assert evaluated == [(["multiply_checked(Price, Qty)"], 1)]
    assert u.to_pandas().N.tolist()[0] == 200.0

    evaluated.clear()
    t.upsert(rows(key=[2], sym=["Y"], price=[60.0], qty=[2]))  # Sym only: nothing computed
    g.run_cycle()
    assert_update(seen[-1], modified=[1], modified_columns={"Sym"})
    assert evaluated == []

    t.upsert(rows(key=[2], sym=["Y"], price=[1.0], qty=[2]))
    t.delete(pa.table({"Key": [5]}))
    t.upsert(rows(key=[9], price=[3.0], qty=[3]))
    g.run_cycle()
    assert_update(seen[-1], added=[5], removed=[4], modified=[1],
                  modified_columns={"Price", "N"})
    df = u.to_pandas()
    assert df.Key.tolist() == [1, 2, 3, 4, 9]
    assert df.Price.tolist()[:2] == [20.0, 2.0] and df.N.tolist()[-1] == 18.0
    assert df.C.tolist() == [7] * 5


def test_select_reports_only_columns_it_has():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    s = t.select("Qty", "Sym", N=P * Q)
    assert s.column_names == ["Qty", "Sym", "N"]
    seen = record(s)
    t.upsert(rows(key=[1], price=[11.0], qty=[1]))  # Price is not selected but feeds N
    g.run_cycle()
    assert_update(seen[-1], modified=[0], modified_columns={"N"})
    plain = t.select("Sym", "Qty")
    plain_seen = record(plain)
    t.upsert(rows(key=[1], price=[12.0], qty=[1]))  # changes nothing plain has
    g.run_cycle()
    assert plain_seen == []
    assert t.select().column_names == t.column_names
    # an expression named like a listed column takes its place
    assert t.select("Price", "Sym", Price=P * 10).to_pandas().Price.tolist()[:2] == [120.0, 600.0]


def test_plain_references_share_sources():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    u = t.update(P2=P, Q2=pc.field("P2"))
    assert u.column("P2") is t.column("Price") and u.column("Q2") is t.column("Price")
    # a name redefined as a reference between two expressions reading it
    v = t.update(A=P + 1, Price=Q, B=P * 2)
    assert v.listener._groups == [[0], [1]]
    df = v.to_pandas()
    assert df.A.tolist()[:2] == [11.0, 61.0] and df.B.tolist() == [2, 4, 6, 8, 10]


def test_stored_and_view_columns_follow_shifts_with_previous_values():
    g = UpdateGraph(validate=True)
    s = ScriptedTable(g, SCHEMA, [0, 2, 4, 6], rows(price=[1.0, 2.0, 3.0, 4.0], qty=[1, 2, 3, 4]))
    u = s.update(X=P * 10)
    v = s.view("Key", X=P * 10, Y=pc.field("X") + Q)
    seen_u, seen_v = record(u), record(v)
    prev_seen: dict[str, list] = {}

    def check_prev(up, table):  # runs inside the cycle: previous values are readable
        prev_seen[table.name] = table.rows([0, 2, 4, 6], ["X"], prev=True).column("X").to_pylist()

    u.listen(check_prev)
    v.listen(check_prev)
    # remove 2, shift 4..6 by +3, add 1 and 5, modify the row now at 9 (was 6)
    s.stage(TableUpdate.of(
        removed=rs(2), shifted=RowSetShiftData.from_arrays([4], [6], [3]), added=rs(1, 5),
        modified=rs(9), modified_columns=["Price"],
    ), [([1, 5], rows(price=[5.0, 6.0], qty=[5, 6])), ([9], rows(price=[40.0]).select(["Price"]))])
    g.run_cycle()
    for seen in (seen_u, seen_v):
        assert_update(seen[-1], added=[1, 5], removed=[2], modified=[9], shifted=([4], [6], [3]),
                      modified_columns={"Price", "X"} if seen is seen_u else {"X", "Y"})
    assert prev_seen[u.name] == prev_seen[v.name] == [10.0, 20.0, 30.0, 40.0]
    assert u.to_pandas().X.tolist() == [10.0, 50.0, 60.0, 30.0, 400.0]
    assert v.to_pandas().Y.tolist() == [11.0, 55.0, 66.0, 33.0, 404.0]
    assert u.rowset == rs(0, 1, 5, 7, 9)


def test_drop_and_rename_pass_updates_through():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    r = t.rename_columns({"Price": "Px"}).drop_columns("Sym")
    assert r.column_names == ["Key", "Px", "Qty"]
    assert r.column("Px") is t.column("Price")
    seen = record(r)
    t.upsert(rows(key=[1, 2], sym=["Z", "Y"], price=[11.0, 60.0], qty=[1, 2]))  # Price+Sym, Sym
    g.run_cycle()
    assert_update(seen[-1], modified=[0, 1], modified_columns={"Px"})
    t.upsert(rows(key=[3], sym=["Z"], price=[None], qty=[3]))  # only the dropped column
    g.run_cycle()
    assert len(seen) == 1


def test_column_op_errors():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    with pytest.raises(ExpressionError, match="'Pricee'"):
        t.update(X=pc.field("Pricee") * 2)
    with pytest.raises(ExpressionError, match="column 'X'.*Expression"):
        t.update(X=5)
    with pytest.raises(ExpressionError, match="'Y'"):
        t.update(X=pc.field("Y"), Y=P)  # in order: Y is not defined yet when X is
    with pytest.raises(SchemaError, match=r"no column\(s\) \['Nope'\]"):
        t.select("Sym", "Nope")
    with pytest.raises(SchemaError, match="more than once"):
        t.select("Sym", "Sym")
    with pytest.raises(SchemaError, match=r"no column\(s\) \['Nope'\]"):
        t.drop_columns("Nope")
    with pytest.raises(SchemaError, match="several columns the name"):
        t.rename_columns({"Price": "Qty"})
    assert t.rename_columns({"Price": "Qty", "Qty": "Price"}).column_names == [
        "Sym", "Key", "Qty", "Price"]


def test_row_slots_dense_then_hashed_with_previous_key_space():
    g = UpdateGraph()
    slots = _RowSlots(g)
    g.phase, g.step = "updating", 1
    slots.begin()
    a = slots.add(np.array([0, 1, 2, 5], dtype=np.int64))
    assert not slots.hashed and a.tolist() == [0, 1, 2, 3]
    g.step = 2
    slots.begin()
    slots.remove(np.array([1], dtype=np.int64))
    slots.move(np.array([2, 5], dtype=np.int64), np.array([1, 9], dtype=np.int64))
    b = slots.add(np.array([2, 1 << 40], dtype=np.int64))  # far key: switch to hashed
    assert slots.hashed and b.tolist() == [4, 5]  # slot 1 is freed only next cycle
    cur = np.array([0, 1, 2, 9, 1 << 40], dtype=np.int64)
    assert slots.lookup(cur).tolist() == [0, 2, 4, 3, 5]
    assert slots.prev_lookup(np.array([0, 1, 2, 5], dtype=np.int64)).tolist() == [0, 1, 2, 3]
    g.step = 3
    slots.begin()
    assert slots.add(np.array([3], dtype=np.int64)).tolist() == [1]
    assert slots.prev_lookup(np.array([1, 9], dtype=np.int64)).tolist() == [2, 3]
    g.phase = "idle"


def test_update_over_a_sparse_key_space():
    g = UpdateGraph(validate=True)
    a, b = keyed(g), keyed(g)
    u = a.merge(b).update(X=P + 1)  # b's rows live at keys (1 << 40) + k
    assert u.listener._slots.hashed
    seen = record(u)
    b.upsert(rows(key=[1, 8], price=[9.0, 7.0]))
    a.delete(pa.table({"Key": [2]}))
    g.run_cycle()
    assert_update(seen[-1], added=[(1 << 40) + 5], removed=[1], modified=[1 << 40],
                  modified_columns={"Price", "X"})
    assert u.to_pandas().X.fillna(-1).tolist() == [11, -1, 71, 56, 10, 61, -1, 71, 56, 8]


# ---------------------------------------------------------------------------------------
# oracle


def test_update_oracle_in_order_replace_strings_constants():
    # groups evaluated together: [Price, X] [N, U, C] [D]; a Qty modify redoes X and N,
    # Price rides along, D (reads C and the new Price) is computed for added rows only
    def expected(df):
        price = df.Price * 2
        return df.assign(Price=price, X=df.Qty + 1, N=price * df.Qty, U=df.Sym.str.upper(), C=7,
                         D=7 + price)

    run_oracle(lambda t: t.update(Price=P * 2, X=Q + 1, N=P * Q, U=pc.utf8_upper(S),
                                  C=pc.scalar(7), D=pc.field("C") + P),
               expected, seed=21)


def test_select_then_where_oracle():
    def expected(df):
        out = df.assign(N=df.Price * df.Qty)[["Qty", "Sym", "N"]]
        return out[out.N > 500]

    run_oracle(lambda t: t.select("Qty", "Sym", N=P * Q).where(pc.field("N") > 500),
               expected, seed=22)


def test_rename_drop_view_oracle():
    def expected(df):
        out = df.rename(columns={"Price": "Px"}).drop(columns=["Key"])
        return out.assign(Y=out.Px + out.Qty, L=out.Sym.str.len())[["Sym", "Y", "L"]]

    run_oracle(
        lambda t: t.rename_columns({"Price": "Px"}).drop_columns("Key")
        .view("Sym", Y=pc.field("Px") + Q, L=pc.utf8_length(S)),
        expected, seed=23,
    )


def test_column_ops_over_a_shifting_source():
    run_shifting_oracle([
        (lambda t: t.update(Price=P * 2, N=P * Q, U=pc.utf8_upper(S)),
         lambda df: df.assign(Price=df.Price * 2, N=df.Price * 2 * df.Qty, U=df.Sym.str.upper())),
        (lambda t: t.select("Sym", N=Q * 3).where(pc.field("N") > 60),
         lambda df: df.assign(N=df.Qty * 3)[["Sym", "N"]].query("N > 60")),
        (lambda t: t.view("Key", X=P + 1, Y=pc.field("X") * Q),
         lambda df: df.assign(X=df.Price + 1, Y=(df.Price + 1) * df.Qty)[["Key", "X", "Y"]]),
    ], seed=24)
