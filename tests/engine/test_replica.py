"""ReplicaTable: an origin's updates applied one for one (same row keys, order, values), and
resets that commit only the difference; checked over thousands of random cycles of every
source kind and of sorted (shifting, sparse-keyed) origins, with ``validate`` on every
update and a replay of the replica's own updates."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.errors import InputError, ProtocolError
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.rowset import RowSet, RowSetShiftData
from engine.sources import ReplicaChange, ReplicaTable
from engine.table import Table
from engine.update import TableUpdate
from tests.oracle import KINDS, RandomSource, cycles
from tests.replay import ReplayChecker


def _change(up: TableUpdate, table: Table, position: int) -> ReplicaChange:
    """What a subscription delivers for one update of ``table``."""
    return ReplicaChange(up.removed, up.shifted, up.added, up.modified,
                         frozenset(up.modified_columns), table.rows(up.added.keys()),
                         table.rows(up.modified.keys()), position)


def _same(replica: Table, origin: Table, ctx: str) -> None:
    assert np.array_equal(replica.rowset.keys(), origin.rowset.keys()), f"{ctx}: row keys differ"
    assert replica.to_arrow().equals(origin.to_arrow()), f"{ctx}: values differ"


ORIGINS = {
    "source": lambda t: t,
    "sorted": lambda t: t.sort("Price"),  # shifts, keys spread out
    "sorted head": lambda t: t.sort(["Sym", "Key"]).head(40),
}


def _rows_by_key(t: Table) -> dict[int, dict[str, object]]:
    return dict(zip(t.rowset.keys().tolist(), t.to_arrow().to_pylist(), strict=True))


@pytest.mark.parametrize("origin_of", list(ORIGINS), ids=list(ORIGINS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_replica_follows_its_origin_one_update_for_one(kind, origin_of):
    rng = np.random.default_rng([7, KINDS.index(kind), list(ORIGINS).index(origin_of)])
    g1, g2 = UpdateGraph(validate=True), UpdateGraph(validate=True)
    src = RandomSource(g1, kind, rng)
    origin = ORIGINS[origin_of](src.table)
    replica = ReplicaTable(g2, origin.schema, name="mirror")
    derived = replica.sort(["Qty", "Key"])
    # reads the values removed and modified rows had: the replica's previous values
    totals = replica.agg_by([agg.sum("Qty", name="q"), agg.max("Price", name="p"), agg.count()],
                            by="Sym")
    replay, replay_derived = ReplayChecker(replica), ReplayChecker(derived)
    staged: list[ReplicaChange] = []
    origin.listen(lambda up, t: staged.append(_change(up, t, g1.step)))
    updates = [0]
    replica.listen(lambda up, t: updates.__setitem__(0, updates[0] + 1))
    lost, resets, given = False, 0, None
    for c in range(max(150, cycles() // 9)):
        for _ in range(int(rng.integers(1, 3))):  # sometimes two origin updates per turn
            src.step()
            g1.run_cycle()
        ctx = f"kind={kind} origin={origin_of} cycle={c}"
        before = updates[0]
        lost = lost or rng.random() < 0.05  # the history in between is lost
        if lost:
            staged.clear()
            if rng.random() < 0.5:
                continue  # still cut off: nothing is applied
            held, want = _rows_by_key(replica), _rows_by_key(origin)
            differing = any(held.get(k) != want.get(k) for k in held.keys() | want.keys())
            replica.reset(origin.rowset.keys(), origin.to_arrow(), position=g1.step)
            given = g1.step
            g2.run_cycle()
            assert updates[0] - before == int(differing), f"{ctx}: a reset is one update or none"
            lost, resets = False, resets + 1
        else:
            changes = [s for s in staged if s.added or s.removed or s.modified or s.shifted]
            for s in staged:
                replica.apply(s)
                given = s.position
            staged.clear()
            while replica.pending_changes:
                g2.run_cycle()
            assert updates[0] - before == len(changes), f"{ctx}: one update per change"
        assert replica.position == given, f"{ctx}: the position of the last change"
        _same(replica, origin, ctx)
        replay.check()
        replay_derived.check()
        data = replica.to_arrow()
        order = np.lexsort((data.column("Key").to_numpy(), data.column("Qty").to_numpy()))
        assert derived.to_arrow().equals(data.take(pa.array(order))), ctx
        want = {r["Sym"]: (r["Qty_sum"], r["Price_max"], r["count_all"]) for r in data.group_by(
            "Sym").aggregate([("Qty", "sum"), ("Price", "max"), ([], "count_all")]).to_pylist()}
        got = {r["Sym"]: (r["q"], r["p"], r["count"]) for r in totals.to_arrow().to_pylist()}
        assert got == want, ctx
    assert resets >= 3


def test_a_reset_commits_only_the_difference():
    g = UpdateGraph(validate=True)
    r = ReplicaTable(g, pa.schema([("a", pa.int64()), ("s", pa.string())]), name="r")
    r.reset(np.array([1, 5, 9, 1 << 40]), pa.table({"a": [1, 5, 9, 7], "s": ["x", None, "z", "w"]}))
    seen: list[TableUpdate] = []
    r.listen(lambda up, t: seen.append(up))
    g.run_cycle()
    assert r.rowset.keys().tolist() == [1, 5, 9, 1 << 40]
    r.reset(np.array([1, 5, 9, 1 << 40]), pa.table({"a": [1, 5, 9, 7], "s": ["x", None, "z", "w"]}))
    g.run_cycle()
    assert seen[1:] == []  # nothing differs: no update at all
    r.reset(np.array([1, 6, 9, 1 << 40]), pa.table({"a": [1, 6, 90, 7], "s": ["x", "y", "z", "w"]}))
    g.run_cycle()
    (up,) = seen[1:]
    assert up.removed.keys().tolist() == [5] and up.added.keys().tolist() == [6]
    assert up.modified.keys().tolist() == [9] and up.modified_columns == {"a"}
    assert r.to_arrow().column("a").to_pylist() == [1, 6, 90, 7]


def test_previous_values_are_readable_while_listeners_run():
    g = UpdateGraph(validate=True)
    r = ReplicaTable(g, pa.schema([("v", pa.int64())]), name="r")
    r.reset(np.array([10, 20, 30]), pa.table({"v": [1, 2, 3]}))
    g.run_cycle()
    got = {}

    def look(up, t):
        got["prev"] = t.column("v").get_prev(np.array([10, 20, 30])).to_pylist()
        got["cur"] = t.column("v").get(t.rowset.keys()).to_pylist()

    r.listen(look)
    # remove 10, shift 20 and 30 down by 5, modify (the shifted) 25, add 40
    r.apply(ReplicaChange(RowSet.from_keys([10]), RowSetShiftData.from_arrays([20], [30], [-5]),
                          RowSet.from_keys([40]), RowSet.from_keys([15]), frozenset({"v"}),
                          pa.table({"v": [4]}), pa.table({"v": [22]}), position="p"))
    g.run_cycle()
    assert got == {"prev": [1, 2, 3], "cur": [22, 3, 4]}
    assert r.rowset.keys().tolist() == [15, 25, 40] and r.position == "p"


def test_writes_and_bad_changes_are_refused():
    g = UpdateGraph(validate=True)
    r = ReplicaTable(g, pa.schema([("v", pa.int64())]), name="m")
    with pytest.raises(InputError, match="mirrors a table of another server"):
        r.check_batch({"v": [1]}, "append")
    with pytest.raises(ProtocolError, match="ascending"):
        r.reset(np.array([3, 1]), pa.table({"v": [1, 2]}))
    r.apply(ReplicaChange(RowSet.from_keys([4]), RowSetShiftData.empty(), RowSet(), RowSet(),
                          frozenset(), pa.table({"v": pa.array([], pa.int64())}),
                          pa.table({"v": pa.array([], pa.int64())})))
    g.run_cycle()
    assert r.failure is not None and "does not hold" in str(r.failure)
