"""``static_table``: given rows on a graph, never updating (``snapshot`` is tested with merge)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from engine.graph import UpdateGraph
from engine.ops.snapshot import static_table


def test_static_table_holds_its_rows_and_never_updates():
    g = UpdateGraph(validate=True)
    t = static_table(g, pa.table({"k": pa.array([0, 7], pa.int64()), "s": ["a", None]}), name="c")
    assert t.name == "c" and list(t.rowset) == [0, 1]
    g.run_cycle()
    assert t.to_arrow().to_pydict() == {"k": [0, 7], "s": ["a", None]}
    assert t.cycle_update is None


def test_static_table_is_an_operand_of_live_tables():
    g = UpdateGraph(validate=True)
    src = g.append_only_table(pa.schema([("k", pa.int64()), ("x", pa.float64())]))
    one = static_table(g, pa.table({"k": pa.array([1], pa.int64())}))
    j = one.natural_join(src.agg_by([], by="k").view("k", x=pc.field("k")), on="k", joins=["x"])
    assert j.to_arrow().to_pydict() == {"k": [1], "x": [None]}
    src.append(pa.table({"k": pa.array([1, 2], pa.int64()), "x": [1.0, 2.0]}))
    g.run_cycle()
    assert j.to_arrow().to_pydict() == {"k": [1], "x": [1]}
