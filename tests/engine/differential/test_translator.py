"""The translator: exact triples for example cycles (shifts included), triples applied to a
keyed table (a -1/+1 pair is a modify; inconsistent triples are refused), then the round
trip over >= 500 random cycles of every source kind."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine.differential.translator import apply_triples, snapshot_to_triples, update_to_triples
from engine.differential.zset import ZSet
from engine.errors import InputError
from engine.graph import UpdateGraph
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Table
from engine.update import TableUpdate
from tests.oracle import KINDS, SCHEMA, RandomSource
from tests.shifting import ScriptedTable


def _row(sym, key, price, qty):
    return pa.table({"Sym": pa.array([sym], pa.string()), "Key": pa.array([key], pa.int64()),
                     "Price": pa.array([price], pa.float64()), "Qty": pa.array([qty], pa.int64())})


def _capture(table: Table, **kw) -> list[ZSet]:
    seen: list[ZSet] = []
    table.listen(lambda u, t: seen.append(update_to_triples(t, u, **kw)))
    return seen


# ---------------------------------------------------------------------------------------
# table -> triples


def test_keyed_source_cycles_to_triples():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(SCHEMA, "Key")
    seen = _capture(t)
    narrow = _capture(t, columns=["Sym", "Key"])
    t.upsert(pa.concat_tables([_row("A", 1, 10.0, 5), _row("B", 2, 20.0, 6)]))
    g.run_cycle()
    assert seen[-1].to_triples() == [(("A", 1, 10.0, 5), (1,), 1), (("B", 2, 20.0, 6), (1,), 1)]
    t.upsert(_row("A", 1, 11.0, 5))              # a modify: old row out, new row in
    t.delete(pa.table({"Key": [2]}))
    g.run_cycle()
    assert seen[-1].to_triples() == [(("B", 2, 20.0, 6), (2,), -1), (("A", 1, 10.0, 5), (2,), -1),
                                     (("A", 1, 11.0, 5), (2,), 1)]
    assert narrow[-1].to_triples() == [(("B", 2), (2,), -1)]   # Price is not a record column here
    snap = snapshot_to_triples(t, time=7)
    assert snap.to_triples() == [(("A", 1, 11.0, 5), (7,), 1)]


def test_modifies_under_a_shift_read_the_unshifted_previous_row():
    g = UpdateGraph(validate=True)
    rows = pa.concat_tables([_row("A", 1, 1.0, 1), _row("B", 2, 2.0, 2), _row("C", 3, 3.0, 3)])
    t = ScriptedTable(g, SCHEMA, [10, 20, 30], rows)
    seen = _capture(t)
    # remove 10, shift 20..30 down by 5 (to 15, 25), modify 25 (was 30), add 40
    up = TableUpdate.of(removed=RowSet.from_keys([10]), added=RowSet.from_keys([40]),
                        modified=RowSet.from_keys([25]), modified_columns=["Price"],
                        shifted=RowSetShiftData.from_arrays([20], [30], [-5]))
    t.stage(up, [([25], _row("C", 3, 3.5, 3)), ([40], _row("D", 4, 4.0, 4))])
    g.run_cycle()
    assert seen[-1].to_triples() == [(("A", 1, 1.0, 1), (1,), -1), (("C", 3, 3.0, 3), (1,), -1),
                                     (("C", 3, 3.5, 3), (1,), 1), (("D", 4, 4.0, 4), (1,), 1)]


def test_an_unchanged_modify_and_a_remove_readd_say_nothing():
    g = UpdateGraph(validate=True)
    t = ScriptedTable(g, SCHEMA, [1, 2], pa.concat_tables([_row("A", 1, 1.0, 1), _row("B", 2, 2.0, 2)]))
    seen = _capture(t)
    # key 1 "modified" to the same values; key 2 removed and an identical row added at 5
    t.stage(TableUpdate.of(removed=RowSet.from_keys([2]), added=RowSet.from_keys([5]),
                           modified=RowSet.from_keys([1]), modified_columns=["Qty"]),
            [([1], _row("A", 1, 1.0, 1)), ([5], _row("B", 2, 2.0, 2))])
    g.run_cycle()
    assert seen[-1].num_rows == 0


# ---------------------------------------------------------------------------------------
# triples -> keyed table


def _target():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(SCHEMA, "Key")
    updates: list[TableUpdate] = []
    t.listen(lambda u, _t: updates.append(u))
    return g, t, updates


def _z(triples) -> ZSet:
    return ZSet.from_triples(triples, SCHEMA)


def test_a_retract_insert_pair_is_a_modify():
    g, t, updates = _target()
    apply_triples(t, _z([(("A", 1, 1.0, 1), 0, 1), (("B", 2, 2.0, 2), 0, 1)]))
    g.run_cycle()
    assert len(updates[-1].added) == 2
    apply_triples(t, _z([(("A", 1, 1.0, 1), 1, -1), (("A", 1, 1.5, 1), 1, 1), (("B", 2, 2.0, 2), 1, -1)]))
    g.run_cycle()
    u = updates[-1]
    assert len(u.modified) == 1 and u.modified_columns == {"Price"}
    assert len(u.removed) == 1 and not u.added
    assert t.to_pandas().to_dict("records") == [{"Sym": "A", "Key": 1, "Price": 1.5, "Qty": 1}]


def test_times_are_walked_in_order():
    g, t, _ = _target()
    apply_triples(t, _z([(("A", 1, 1.0, 1), 0, 1)]))
    g.run_cycle()
    # at 1: A changes; at 2: A is deleted; at 3: A comes back with a new value; B in and out
    apply_triples(t, _z([(("A", 1, 2.0, 1), 1, 1), (("A", 1, 1.0, 1), 1, -1), (("A", 1, 2.0, 1), 2, -1),
                         (("A", 1, 3.0, 1), 3, 1), (("B", 2, 1.0, 1), 1, 1), (("B", 2, 1.0, 1), 2, -1)]))
    g.run_cycle()
    assert t.to_pandas().to_dict("records") == [{"Sym": "A", "Key": 1, "Price": 3.0, "Qty": 1}]
    apply_triples(t, ZSet.from_triples([(("A", 1, 3.0, 1), None, -1)], SCHEMA))   # untimed works too
    g.run_cycle()
    assert t.size == 0


def test_inconsistent_triples_are_refused():
    g, t, _ = _target()
    apply_triples(t, _z([(("A", 1, 1.0, 1), 0, 1)]))
    g.run_cycle()
    with pytest.raises(InputError, match="weights must sum to \\+1 or -1 per row and time, got 2"):
        apply_triples(t, _z([(("B", 2, 1.0, 1), 1, 2)]))
    with pytest.raises(InputError, match="does not hold"):
        apply_triples(t, _z([(("A", 1, 9.0, 1), 1, -1)]))                # wrong old value
    with pytest.raises(InputError, match="does not hold"):
        apply_triples(t, _z([(("C", 3, 9.0, 1), 1, -1)]))                # absent key
    with pytest.raises(InputError, match="second row"):
        apply_triples(t, _z([(("A", 1, 2.0, 1), 1, 1)]))                 # A without retracting
    with pytest.raises(InputError, match="gets 2 \\+1 rows at time 1"):
        apply_triples(t, _z([(("D", 4, 1.0, 1), 1, 1), (("D", 4, 2.0, 1), 1, 1)]))
    with pytest.raises(InputError, match="one-coordinate"):
        apply_triples(t, _z([(("D", 4, 1.0, 1), (1, 0), 1)]))
    assert t.pending_rows == 0                    # nothing was staged by the refused batches
    # pairs that cancel are no weight problem: consolidation comes first
    apply_triples(t, _z([(("E", 5, 1.0, 1), 1, 1), (("E", 5, 1.0, 1), 1, 1), (("E", 5, 1.0, 1), 1, -1)]))
    g.run_cycle()
    assert sorted(t.to_pandas()["Key"]) == [1, 5]


# ---------------------------------------------------------------------------------------
# round trip: a random table -> triples -> a keyed table, every cycle


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("Key").reset_index(drop=True)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_over_random_cycles(kind):
    g, g2 = UpdateGraph(validate=True), UpdateGraph(validate=True)
    src = RandomSource(g, kind, np.random.default_rng([31, KINDS.index(kind)]))
    tgt = g2.keyed_table(SCHEMA, "Key", name="target")
    forward = _capture(src.table)
    back = _capture(tgt)
    for cycle in range(520):
        src.step()
        g.run_cycle()
        if forward:
            batch = forward.pop()
            assert batch.times is not None and set(batch.times[:, 0].tolist()) <= {g.step}
            apply_triples(tgt, batch)
            g2.run_cycle()
            if batch.num_rows:  # and back again: the target's update gives the same triples
                assert back.pop().without_times().equals(batch.without_times()), f"cycle {cycle}"
            assert not back
        try:
            pd.testing.assert_frame_equal(_sorted(tgt.to_pandas()), _sorted(src.table.to_pandas()))
        except AssertionError:
            print(f"MISMATCH kind={kind} cycle={cycle}")
            raise
