"""Substrait expressions on the wire: encode, decode, and snapshot filters."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.substrait as pas
import pytest

from engine import expr as _expr
from engine.errors import ExpressionError
from flight import substrait

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64()),
                    ("d", pa.int64())])


def table() -> pa.Table:
    return pa.table({
        "a": pa.array([1, 2, 3, 4, 5, None], pa.int64()),
        "b": ["x", "y", "z", None, "x", "y"],
        "c": pa.array([0.5, 2.5, 3.5, 9.0, None, 7.0], pa.float64()),
        "d": pa.array([10, 20, 30, 40, 50, 60], pa.int64()),
    }, schema=SCHEMA)


def test_encode_narrows_the_base_schema_to_what_is_read() -> None:
    buf = substrait.encode({"p": (pc.field("c") > 1.0) & (pc.field("a") < 4),
                            "q": pc.field("d") * 2}, SCHEMA)
    exprs, base = substrait.decode(buf)
    assert base.names == ["a", "c", "d"]  # schema order, "b" unread
    assert list(exprs) == ["p", "q"]  # message order
    assert all(e.base.equals(base) for e in exprs.values())
    assert str(exprs["p"]) == "((c > 1) and (a < 4))"  # positions shown as names


def test_encode_keeps_the_schema_for_positional_references() -> None:
    _, base = substrait.decode(substrait.encode({"p": pc.field(2) > 1.0}, SCHEMA))
    assert base.equals(SCHEMA)


def test_encode_constant() -> None:
    exprs, base = substrait.decode(substrait.encode({"k": pc.scalar(3)}, SCHEMA))
    assert len(base) == 0
    bound = _expr.bind(exprs["k"], SCHEMA, table_name="t", what="k")
    assert _expr.evaluate(bound, {}, 3).to_pylist() == [3, 3, 3]


def test_encode_errors() -> None:
    with pytest.raises(ExpressionError, match="'p'.*cc > 1.*columns: a: int64"):
        substrait.encode({"p": pc.field("cc") > 1.0}, SCHEMA)
    with pytest.raises(ExpressionError, match="expected a pyarrow.compute.Expression"):
        substrait.encode({"p": "a > 1"}, SCHEMA)
    with pytest.raises(ExpressionError, match="explicit cast"):
        substrait.encode({"p": pc.field("a") > 1.5}, SCHEMA)


@pytest.mark.parametrize("junk", [b"", b"garbage", b"\x08\x01", b"\x0a\x05hello" * 3])
def test_decode_malformed(junk: bytes) -> None:
    with pytest.raises(ExpressionError, match="Substrait"):
        substrait.decode(junk)


def test_filter_positional_trap() -> None:
    """A predicate on the 3rd and 1st columns: positions 1 and 0 of its base schema."""
    buf = substrait.encode({"p": (pc.field("c") > 1.0) & (pc.field("a") < 4)}, SCHEMA)
    assert substrait.filter_table(table(), buf).column("a").to_pylist() == [2, 3]
    # the same bytes on a table whose columns are in another order
    shuffled = table().select(["d", "c", "b", "a"])
    out = substrait.filter_table(shuffled, buf)
    assert out.schema.names == ["d", "c", "b", "a"]
    assert out.column("a").to_pylist() == [2, 3]
    assert out.column("d").to_pylist() == [20, 30]


def test_filter_full_base_schema_from_another_producer() -> None:
    pred = (pc.field("d") >= 30) & (pc.field("b") == "x")
    buf = bytes(pas.serialize_expressions([pred], ["p"], SCHEMA))
    out = substrait.filter_table(table().select(["b", "d", "a", "c"]), buf)
    assert out.column("d").to_pylist() == [50]


def test_filter_null_is_false_and_chunks() -> None:
    buf = substrait.encode({"p": pc.field("c") > 3.0}, SCHEMA)
    chunked = pa.concat_tables([table().slice(0, 3), table().slice(3)])
    out = substrait.filter_table(chunked, buf)
    assert out.column("a").to_pylist() == [3, 4, None]  # c=None (row 5) is dropped
    assert out.num_rows == 3


def test_filter_errors() -> None:
    buf = substrait.encode({"p": pc.field("c") > 1.0}, SCHEMA)
    with pytest.raises(ExpressionError, match="column 'c', which does not exist.*has: a, b, d"):
        substrait.filter_table(table().drop_columns(["c"]), buf, table_name="snap")
    retyped = table().set_column(2, "c", pa.array(range(6), pa.int64()))
    with pytest.raises(ExpressionError, match="'c' of type double.*is int64"):
        substrait.filter_table(retyped, buf)
    with pytest.raises(ExpressionError, match="must be boolean"):
        substrait.filter_table(table(), substrait.encode({"p": pc.field("a") + 1}, SCHEMA))
    two = substrait.encode({"p": pc.field("a") > 1, "q": pc.field("a") < 3}, SCHEMA)
    with pytest.raises(ExpressionError, match="expected one boolean.*got 2"):
        substrait.filter_table(table(), two)
    with pytest.raises(ExpressionError, match="malformed"):
        substrait.filter_table(table(), b"garbage")


def test_bind_positional_takes_every_base_column_as_input() -> None:
    base = pa.schema([("d", pa.int64()), ("a", pa.int64())])
    pexpr = _expr.PositionalExpression(pc.field(1) + pc.field(0), base)
    bound = _expr.bind(pexpr, SCHEMA, table_name="t", what="x")
    assert bound.positional and bound.inputs == ("d", "a") and bound.type == pa.int64()
    # named and positional expressions evaluated together keep their own layouts
    named = _expr.bind(pc.field("a") - pc.field("d"), SCHEMA, table_name="t", what="y")
    cols = {n: table().column(n) for n in SCHEMA.names}
    out = _expr.evaluate_many([named, bound, named], cols, 6)
    assert out[1].to_pylist() == [11, 22, 33, 44, 55, None]
    assert out[0].to_pylist() == out[2].to_pylist() == [-9, -18, -27, -36, -45, None]


def test_bind_positional_rejects_duplicate_base_names() -> None:
    base = pa.schema([("a", pa.int64()), ("a", pa.int64())])
    with pytest.raises(ExpressionError, match=r"\['a'\] more than once"):
        _expr.bind(_expr.PositionalExpression(pc.field(0) > 1, base), SCHEMA,
                   table_name="t", what="x")
