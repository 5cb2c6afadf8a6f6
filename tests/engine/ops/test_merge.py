"""merge and snapshot: examples with exact updates, then the oracles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.errors import InvalidKeyError, SchemaError
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.ops.merge import MergedColumnSource, SharedMergedColumnSource, merge
from engine.ops.snapshot import snapshot
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

R1, R2 = 1 << 40, 2 << 40
P = pc.field("Price")
MATCH = P > 50
NOT_MATCH = ~MATCH | P.is_null()  # null counts as false in where: keep those rows here


def test_merge_maps_each_parent_into_its_region_and_emits_one_update():
    g = UpdateGraph(validate=True)
    a, b = keyed(g), keyed(g)  # Key 1..5 -> row keys 0..4 in each
    m = merge(a, b)
    assert m.rowset == rs(0, 1, 2, 3, 4, R1, R1 + 1, R1 + 2, R1 + 3, R1 + 4)
    assert m.to_pandas().Key.tolist() == [1, 2, 3, 4, 5] * 2
    seen = record(m)

    a.upsert(rows(key=[1], price=[11.0]))                         # a: Price of row 0
    b.upsert(rows(key=[2, 6], sym=["Q", "X"], price=[60.0, 1.0], qty=[2, 1]))  # b: Sym, add
    b.delete(pa.table({"Key": [5]}))
    g.run_cycle()
    assert len(seen) == 1
    assert_update(seen[-1], added=[R1 + 5], removed=[R1 + 4], modified=[0, R1 + 1],
                  modified_columns={"Price", "Sym"})
    assert m.to_pandas().Key.tolist() == [1, 2, 3, 4, 5, 1, 2, 3, 4, 6]

    a.upsert(rows(key=[9], price=[1.0]))  # only a changes
    g.run_cycle()
    assert_update(seen[-1], added=[5])


def test_merge_offsets_shifts_and_routes_reads_by_region():
    g = UpdateGraph(validate=True)
    a = keyed(g)
    s = ScriptedTable(g, SCHEMA, [0, 2, 4], rows(price=[1.0, 2.0, 3.0]))
    m = merge(s, a, s)
    seen = record(m)
    prev: list[list[float]] = []
    m.listen(lambda up, t: prev.append(
        t.rows([R2 + 4, 2, R1 + 1, 4], ["Price"], prev=True).column(0).to_pylist()))
    s.stage(TableUpdate.of(shifted=RowSetShiftData.from_arrays([2], [4], [3]), modified=rs(7),
                           modified_columns=["Price"]),
            [([7], rows(price=[30.0]).select(["Price"]))])
    g.run_cycle()
    assert_update(seen[-1], modified=[7, R2 + 7], modified_columns={"Price"},
                  shifted=([2, R2 + 2], [4, R2 + 4], [3, 3]))
    assert prev == [[3.0, 2.0, 60.0, 3.0]]  # previous key space, in request order
    got = m.rows([R2 + 7, 5, R1 + 1, 0], ["Price"]).column(0).to_pylist()
    assert got == [30.0, 2.0, 60.0, 1.0]


def test_merge_of_merges_is_flattened():
    g = UpdateGraph(validate=True)
    a, b, c = keyed(g), keyed(g), keyed(g)
    m = a.merge(b).merge(c)
    assert m.parents == (a, b, c)
    assert m.rowset == rs(*(r + k for r in (0, R1, R2) for k in range(5)))
    seen = record(m)
    c.upsert(rows(key=[1], price=[3.0]))
    b.delete(pa.table({"Key": [1]}))
    g.run_cycle()
    assert_update(seen[-1], removed=[R1], modified=[R2], modified_columns={"Price"})


def test_merge_schema_and_key_errors():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    with pytest.raises(SchemaError, match=r"lacks column\(s\) \['Sym'\]"):
        merge(t, t.drop_columns("Sym"))
    with pytest.raises(SchemaError, match="'Price' is int64 there but double"):
        merge(t, t.update(Price=pc.field("Qty")))
    with pytest.raises(SchemaError, match="in the order"):
        merge(t, t.select("Key", "Sym", "Price", "Qty"))
    with pytest.raises(SchemaError, match="another update graph"):
        merge(t, keyed(UpdateGraph()))
    with pytest.raises(SchemaError, match="at least one"):
        merge()
    # a parent row key of 2**40 or more does not fit a region
    empty = g.keyed_table(SCHEMA, "Key")
    derived = merge(t, t).where(P > 0)  # keeps the merge's keys
    with pytest.raises(InvalidKeyError, match="beyond the 2\\*\\*40"):
        merge(derived, t)
    outer = merge(merge(t, empty).where(P > 0), t)
    empty.upsert(rows(key=[1]))
    g.run_cycle()
    assert isinstance(outer.failure, InvalidKeyError)


def test_snapshot_is_a_static_copy():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    w = t.where(MATCH)
    snap = snapshot(w)
    assert snap.rowset == rs(0, 1, 2) and snap.column("Price") is not t.column("Price")
    before = snap.to_pandas()
    seen = record(snap)
    t.upsert(rows(key=[1, 2], price=[99.0, 98.0]))
    g.run_cycle()
    pd.testing.assert_frame_equal(snap.to_pandas(), before)
    assert seen == [] and snap.parents == ()
    assert t.snapshot().to_pandas().Price.tolist()[:2] == [99.0, 98.0]


# ---------------------------------------------------------------------------------------
# oracle


def test_merge_of_a_partition_oracle():
    run_oracle(lambda t: merge(t.where(MATCH), t.where(NOT_MATCH)),
               lambda df: pd.concat([df[df.Price > 50], df[~(df.Price > 50)]]), seed=41)


def test_merge_of_derived_tables_of_one_source_oracle():
    run_oracle(
        lambda t: merge(t.tail(3), t.where(pc.field("Qty") > 50), t).head(-2),
        lambda df: pd.concat([df.tail(3), df[df.Qty > 50], df]).head(-2),
        seed=42,
    )


def test_merge_over_a_shifting_source():
    run_shifting_oracle([
        (lambda t: merge(t.where(MATCH), t.where(NOT_MATCH)),
         lambda df: pd.concat([df[df.Price > 50], df[~(df.Price > 50)]])),
        (lambda t: merge(t, t.tail(3)).update(Y=P * 2),
         lambda df: pd.concat([df, df.tail(3)]).assign(Y=lambda d: d.Price * 2)),
    ], seed=43)


def _hops(t):
    # a sliding window's hops: views of one table passing Sym and Price through (one source
    # in every region: shared columns, read once) beside a computed column per region
    hops = [t.view("Sym", "Price", W=pc.subtract(pc.field("Qty"), k)) for k in range(3)]
    m = hops[0].merge(*hops[1:])
    assert isinstance(m.column("Sym"), SharedMergedColumnSource)
    assert isinstance(m.column("Price"), SharedMergedColumnSource)
    assert isinstance(m.column("W"), MergedColumnSource)
    return m


def _hops_df(df):
    return pd.concat([df[["Sym", "Price"]].assign(W=df.Qty - k) for k in range(3)])


def _sum_by(df):
    return df.groupby(["Sym", "W"], sort=False, dropna=False, as_index=False)["Price"].sum(min_count=0)


def test_merge_of_views_of_one_table_shares_columns_oracle():
    run_oracle(_hops, _hops_df, seed=45)
    # the readers of the merge's update (an aggregation's keys and values, current and
    # previous) read the shared columns through the one source
    run_oracle(lambda t: _hops(t).agg_by([agg.sum("Price", "Price")], by=["Sym", "W"]),
               lambda df: _sum_by(_hops_df(df)), seed=46)


def test_merge_of_views_over_a_shifting_source_shares_columns():
    run_shifting_oracle([(_hops, _hops_df)], seed=47)


def test_shared_merged_column_refuses_keys_beyond_its_regions():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    m = merge(t, t)
    assert isinstance(m.column("Price"), SharedMergedColumnSource)
    got = m.rows(np.array([R1, 0], dtype=np.int64), ["Price"]).column(0).to_pylist()
    assert got == t.rows(np.array([0, 0], dtype=np.int64), ["Price"]).column(0).to_pylist()
    with pytest.raises(InvalidKeyError, match="not in a merge region"):
        m.column("Price").get(np.array([R2], dtype=np.int64))


def test_merged_column_routes_many_regions():
    g = UpdateGraph(validate=True)
    parts = [keyed(g) for _ in range(4)]
    m = merge(*parts)
    keys = m.rowset.keys()
    order = np.random.default_rng(0).permutation(keys.size)
    got = m.rows(keys[order], ["Price"]).column(0).combine_chunks()
    want = m.to_arrow(["Price"]).column(0).combine_chunks().take(pa.array(order))
    assert got.equals(want)


def test_sort_and_select_over_a_merge_keep_row_key_maps_by_region(monkeypatch):
    # a merge's keys are dense within each parent's region: the sort's and the stored
    # column's row-key maps split by region (RowKeyMap's "regions" layout), through
    # removes, modifies and the parents' shifts; SPARSE_SLACK 0 makes even these small
    # tables leave the one dense window
    from engine._kernels import rowkeymap
    from tests.engine.ops.sort.test_sort import sorted_frame

    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)
    layouts: list[bool] = []
    real = rowkeymap.RowKeyMap._dense_by_region

    def seen(self, keys):
        layouts.append(real(self, keys))
        return layouts[-1]

    monkeypatch.setattr(rowkeymap.RowKeyMap, "_dense_by_region", seen)
    by_price = sorted_frame(["Price"], [False])
    run_oracle(lambda t: merge(t.where(MATCH), t, t.tail(5)).sort("Price").update(Y=P * 2),
               lambda df: by_price(pd.concat([df[df.Price > 50], df, df.tail(5)])).assign(Y=lambda d: d.Price * 2),
               seed=44, n_cycles=600)
    assert any(layouts), layouts  # some maps went by region
