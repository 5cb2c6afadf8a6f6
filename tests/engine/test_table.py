"""engine.table.derive: the one way every operation builds its child."""

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.columns import NumpyColumnSource
from engine.errors import SchemaError, TableFailed
from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.rowset import RowSet
from engine.sources import AppendOnlyTable, KeyedTable
from engine.table import Derivation, derive
from engine.update import TableUpdate

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64())])


class _Breaks:
    """A listener that raises on its first update, failing its table."""

    def on_update(self, up: TableUpdate | None) -> TableUpdate | None:
        raise ValueError("broken on purpose")


def _failed_table(g: UpdateGraph) -> tuple[AppendOnlyTable, object]:
    src = AppendOnlyTable(g, SCHEMA, name="src")
    bad = derive([src], lambda: Derivation(SCHEMA, src.columns, RowSet(), _Breaks(), name="bad"))
    src.append({"k": [1], "x": [1.0]})
    g.run_cycle()
    assert bad.failure is not None
    return src, bad


# every verb, as a function of (parent, other live table)
VERBS = {
    "where": lambda t, o: t.where(pc.field("x") > 0),
    "update": lambda t, o: t.update(y=pc.field("x") * 2),
    "view": lambda t, o: t.view("k"),
    "sort": lambda t, o: t.sort("x"),
    "head": lambda t, o: t.head(1),
    "merge": lambda t, o: t.merge(o),
    "agg_by": lambda t, o: t.agg_by([agg.sum("x")], by="k"),
    "first_by": lambda t, o: t.first_by("k"),
    "natural_join (left)": lambda t, o: t.natural_join(o, on="k", joins=["x2=x"]),
    "natural_join (right)": lambda t, o: o.natural_join(t, on="k", joins=["x2=x"]),
    "exact_join (right)": lambda t, o: o.exact_join(t, on="k", joins=["x2=x"]),
    "join (right)": lambda t, o: o.join(t, on="k", joins=["x2=x"]),
    "left_outer_join (right)": lambda t, o: o.left_outer_join(t, on="k", joins=["x2=x"]),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_no_verb_derives_from_a_failed_table(verb):
    g = UpdateGraph()
    _, bad = _failed_table(g)
    other = AppendOnlyTable(g, SCHEMA, name="other")
    with pytest.raises(TableFailed, match="'bad'"):
        VERBS[verb](bad, other)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_no_verb_derives_from_a_closed_table(verb):
    g = UpdateGraph()
    t = AppendOnlyTable(g, SCHEMA, name="gone")
    other = AppendOnlyTable(g, SCHEMA, name="other")
    t.close()
    with pytest.raises(TableFailed, match="'gone' is closed"):
        VERBS[verb](t, other)


def test_parents_on_two_graphs_are_refused():
    a = AppendOnlyTable(UpdateGraph(), SCHEMA, name="a")
    b = KeyedTable(UpdateGraph(), SCHEMA, keys="k", name="b")
    with pytest.raises(SchemaError, match="'b' .* another update graph"):
        derive([a, b], lambda: pytest.fail("plan must not run"))


def test_derive_wires_the_listener_and_the_first_rows():
    g = UpdateGraph()
    src = AppendOnlyTable(g, SCHEMA, name="src")
    src.append({"k": [1, 2], "x": [1.0, 2.0]})
    g.run_cycle()

    class Copy:
        def on_update(self, up):
            return up

    col = NumpyColumnSource(pa.int64())
    child = derive([src], lambda: Derivation(pa.schema([("k", pa.int64())]), {"k": col},
                                             src.rowset, Copy(), name="copy"))
    assert child.listener.result is child
    assert child.parents == (src,)
    assert child.name == "copy" and list(child.rowset) == [0, 1]
    assert child in g.tables
