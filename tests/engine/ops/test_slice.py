"""head / tail / slice: examples with exact updates, then the oracles."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from engine.errors import InputError
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


def test_head_window_follows_removes_and_passes_modifies():
    g = UpdateGraph(validate=True)
    t = keyed(g)  # Key 1..5 -> row keys 0..4
    h = t.head(2)
    assert h.rowset == rs(0, 1)
    seen = record(h)

    t.delete(pa.table({"Key": [1]}))  # row 2 moves into the window
    t.upsert(rows(key=[2, 5], price=[61.0, 1.0], qty=[2, 5]))  # in the window, and not
    g.run_cycle()
    assert_update(seen[-1], added=[2], removed=[0], modified=[1], modified_columns={"Price"})

    t.upsert(rows(key=[7, 8], price=[1.0, 2.0]))  # new rows reuse key 0: it enters
    g.run_cycle()
    assert h.to_pandas().Key.tolist() == [7, 2]
    assert_update(seen[-1], added=[0], removed=[2])

    t.upsert(rows(key=[4], price=[3.0], qty=[4]))  # outside the window: no update
    g.run_cycle()
    assert len(seen) == 2


def test_tail_of_an_append_only_table():
    g = UpdateGraph(validate=True)
    t = g.append_only_table(SCHEMA)
    t.append(rows(n=5))
    g.run_cycle()
    tl = t.tail(2)
    assert tl.rowset == rs(3, 4)
    seen = record(tl)
    t.append(rows(n=1))
    g.run_cycle()
    assert_update(seen[-1], added=[5], removed=[3])
    t.append(rows(n=3))
    g.run_cycle()
    assert_update(seen[-1], added=[7, 8], removed=[4, 5])
    assert t.tail(0).size == 0 and t.tail(100).size == 9


def test_slice_with_shifts():
    g = UpdateGraph(validate=True)
    s = ScriptedTable(g, SCHEMA, [0, 2, 4, 6, 8, 10], rows(n=6))
    w = s.slice(1, -2)  # positions 1..3
    assert w.rowset == rs(2, 4, 6)
    seen = record(w)

    # shift-only cycle: same positions, keys moved, one modify inside
    s.stage(TableUpdate.of(shifted=RowSetShiftData.from_arrays([4], [10], [1]), modified=rs(5),
                           modified_columns=["Qty"]), [([5], rows(qty=[9]).select(["Qty"]))])
    g.run_cycle()
    assert_update(seen[-1], modified=[5], shifted=([4], [10], [1]), modified_columns={"Qty"})
    assert w.rowset == rs(2, 5, 7)

    # insert before the window: every row moves one position right
    s.stage(TableUpdate.of(added=rs(1), shifted=RowSetShiftData.from_arrays([5], [11], [2]),
                           modified=rs(7), modified_columns=["Qty"]),
            [([1], rows(n=1)), ([7], rows(qty=[3]).select(["Qty"]))])
    g.run_cycle()
    # 7 rows [0, 1, 2, 7, 9, 11, 13]: the window is positions 1..4; the rows that were
    # at 5 and 7 stay in it at 7 and 9, the new row 1 enters, nothing leaves
    assert w.rowset == rs(1, 2, 7, 9)
    assert_update(seen[-1], added=[1], modified=[7], shifted=([5], [11], [2]),
                  modified_columns={"Qty"})

    # remove the first row: 6 rows, the window is positions 1..3 = [2, 7, 9]; row 1 is
    # now at position 0 and leaves, and the end moved left with the size
    s.stage(TableUpdate.of(removed=rs(0)))
    g.run_cycle()
    assert_update(seen[-1], removed=[1])
    assert w.rowset == rs(2, 7, 9)


def test_negative_and_empty_windows():
    g = UpdateGraph(validate=True)
    t = keyed(g)
    assert t.head(-2).to_pandas().Key.tolist() == [1, 2, 3]
    assert t.tail(-2).to_pandas().Key.tolist() == [3, 4, 5]
    assert t.slice(-2, None).to_pandas().Key.tolist() == [4, 5]
    assert t.slice(4, 2).size == 0 and t.head(0).size == 0
    with pytest.raises(InputError, match="must be an int"):
        t.head(2.5)
    with pytest.raises(InputError, match="must be an int"):
        t.slice("1", None)


def test_head_and_tail_oracle():
    run_oracle(lambda t: t.head(5).merge(t.tail(4)), lambda df: pd.concat([df.head(5), df.tail(4)]),
               seed=31)


def test_slice_oracle():
    run_oracle(lambda t: t.slice(-7, -2), lambda df: df.iloc[-7:-2], seed=33)


def test_windows_over_a_shifting_source():
    run_shifting_oracle([
        (lambda t: t.head(4), lambda df: df.head(4)),
        (lambda t: t.tail(3), lambda df: df.tail(3)),
        (lambda t: t.slice(2, 9), lambda df: df.iloc[2:9]),
        (lambda t: t.head(-3), lambda df: df.head(-3)),
        (lambda t: t.tail(-3).slice(-6, -1), lambda df: df.tail(-3).iloc[-6:-1]),
    ], seed=34)
