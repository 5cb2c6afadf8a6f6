"""Expressions on the wire: Substrait ExtendedExpressions, encoded and decoded.

A client sends ``pyarrow.compute`` expressions as one Substrait ``ExtendedExpression``
(``pyarrow.substrait.serialize_expressions``): named expressions plus the *base schema*
they were bound to. Substrait refers to columns by position, so a decoded expression
reads ``FieldPath(i)``, column ``i`` of that base schema, not a name. :func:`decode`
therefore returns each expression together with its base schema as an
``engine.expr.PositionalExpression``; the engine binds it by checking every base
column exists in the table with the same type and evaluates it on a table of exactly the
base columns, in base order, so the positions are right by construction.

Because every base column counts as an input of a decoded expression, :func:`encode`
serializes against the columns the expressions actually read, not the whole schema
(found by binding with each column renamed away, the engine's probe). A wider base
schema would still be correct, only less precise (an unread column's change would
re-evaluate the expression).

This module is imported by clients: at import time it needs pyarrow and the
dependency-free ``engine.errors`` only; the engine is imported when decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.substrait as pas

from engine.errors import ExpressionError, quoted

if TYPE_CHECKING:
    from engine.expr import BoundExpression, PositionalExpression

__all__ = ["bind_filter", "decode", "decode_predicate", "encode", "filter_table"]

_PROBE = "__ticktable_probe__"
_BIND_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError)


def _binds(expr: pc.Expression, schema: pa.Schema) -> bool:
    """True when ``expr`` binds to (and evaluates on) an empty table of ``schema``."""
    table = schema.empty_table() if len(schema) else pa.table({_PROBE: pa.nulls(0)})
    decl = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(table)),
        acero.Declaration("project", acero.ProjectNodeOptions([expr], ["out"])),
    ])
    try:
        decl.to_table(use_threads=False)
    except _BIND_ERRORS:
        return False
    return True


def _read_columns(exprs: list[pc.Expression], schema: pa.Schema) -> list[int]:
    """Positions in ``schema`` of the columns any of ``exprs`` reads by name."""
    read = []
    for i in range(len(schema)):  # a column is read when the expressions stop binding without it
        probe = schema.set(i, pa.field(_PROBE, schema.field(i).type))
        if not all(_binds(e, probe) for e in exprs):
            read.append(i)
    return read


def encode(exprs: Mapping[str, pc.Expression], schema: pa.Schema) -> bytes:
    """Serialize named expressions over ``schema`` as a Substrait ExtendedExpression.

    The base schema of the message is the columns of ``schema`` the expressions read, in
    ``schema`` order (all of ``schema`` if an expression refers to a column by position).

    Parameters
    ----------
    exprs
        ``name -> expression`` (``pc.field("Price") > 50``), in output order.
    schema
        The schema of the table the expressions will run on.

    Returns
    -------
    bytes
        The serialized message, for ``Where.predicate`` or ``NamedExpressions.expressions``.

    Raises
    ------
    ExpressionError
        If an expression is not an expression, names a column not in ``schema``, does
        not fit the column types, or has no Substrait form.

    Examples
    --------
    >>> buf = encode({"p": pc.field("Price") > 50}, table.schema)
    """
    names = list(exprs)
    values = list(exprs.values())
    for name, e in exprs.items():
        if not isinstance(e, pc.Expression):
            raise ExpressionError(
                f"expression {name!r}: expected a pyarrow.compute.Expression, got "
                f"{type(e).__name__} (wrap columns in pc.field(...), constants in pc.scalar(...))")
        if not _binds(e, schema):
            raise ExpressionError(
                f"expression {name!r} ({e}) does not fit the schema (columns: "
                f"{', '.join(f'{f.name}: {f.type}' for f in schema)}); check the column names "
                f"and types")
    if any("FieldPath(" in str(e) for e in values):
        base = schema  # positions refer to ``schema``: keep it whole
    else:
        base = pa.schema([schema.field(i) for i in _read_columns(values, schema)])
    try:
        buf = pas.serialize_expressions(values, names, base, allow_arrow_extensions=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        if "unsafe casts" in str(exc):  # pyarrow adds an implicit (safe) cast for mixed types
            hint = ("operands of different types need an explicit cast, e.g. "
                    "pc.field('Qty').cast(pa.float64(), safe=False) * pc.field('Price'), or a "
                    "constant of the column's type")
        else:
            hint = ("use functions Substrait knows (comparisons, arithmetic, boolean logic, "
                    "is_null, is_in, if_else)")
        raise ExpressionError(f"cannot send {', '.join(map(str, values))} as Substrait: {exc}; "
                              f"{hint}") from exc
    return bytes(buf)


def decode(buf: bytes) -> tuple[dict[str, PositionalExpression], pa.Schema]:
    """Parse a Substrait ExtendedExpression into expressions the engine's ops accept.

    Parameters
    ----------
    buf
        The serialized message (:func:`encode`, or any Substrait producer).

    Returns
    -------
    tuple
        ``({name: PositionalExpression}, base_schema)``, in the message's order. Pass the
        expressions to ``where`` / ``update`` / ``select`` / ``view`` like
        ``pyarrow.compute`` expressions.

    Raises
    ------
    ExpressionError
        If ``buf`` is empty or not a Substrait ExtendedExpression pyarrow can read.
    """
    from engine.expr import PositionalExpression

    if not buf:
        raise ExpressionError("empty Substrait message: expected a serialized ExtendedExpression "
                              "(flight.substrait.encode or pyarrow.substrait."
                              "serialize_expressions)")
    try:
        bound = pas.deserialize_expressions(pa.py_buffer(bytes(buf)))
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise ExpressionError(
            f"malformed Substrait expression ({len(buf)} bytes): {exc}; send an "
            f"ExtendedExpression from flight.substrait.encode or "
            f"pyarrow.substrait.serialize_expressions") from exc
    base: pa.Schema = bound.schema
    return {n: PositionalExpression(e, base) for n, e in bound.expressions.items()}, base


def decode_predicate(buf: bytes, what: str = "filter") -> PositionalExpression:
    """:func:`decode` a message that must hold exactly one expression (a predicate).

    Raises
    ------
    ExpressionError
        If ``buf`` is malformed or holds no or several expressions.
    """
    exprs, _ = decode(buf)
    if len(exprs) != 1:
        raise ExpressionError(f"{what}: expected one boolean Substrait expression, got "
                              f"{len(exprs)} ({', '.join(exprs) or 'none'})")
    return next(iter(exprs.values()))


def bind_filter(buf: bytes, schema: pa.Schema,
                table_name: str) -> tuple[PositionalExpression, BoundExpression]:
    """A filter message (one boolean Substrait expression) decoded and bound to ``schema``:
    ``(expression, bound)`` (:func:`engine.expr.bind`), every message naming the table.

    Raises
    ------
    ExpressionError
        If ``buf`` is malformed, names a column ``schema`` does not have (or has with
        another type), or is not boolean.
    """
    from engine import expr as _expr

    what = f"filter on table {quoted(table_name)}"
    try:
        predicate = decode_predicate(buf, what)
    except ExpressionError as exc:  # a malformed message: say which table it was for
        if str(exc).startswith(what):
            raise
        raise ExpressionError(f"{what}: {exc}") from exc
    bound = _expr.bind(predicate, schema, table_name=table_name, what="filter")
    if bound.type != pa.bool_():
        raise ExpressionError(f"{what} must be boolean, but {bound.text} is {bound.type} "
                              f"(compare it, e.g. pc.field('x') > 0)")
    return predicate, bound


def filter_table(table: pa.Table, buf: bytes, *, table_name: str = "snapshot") -> pa.Table:
    """The rows of ``table`` for which the Substrait predicate ``buf`` is true.

    Null counts as false, as in ``where``.

    Parameters
    ----------
    table
        The rows to filter (a snapshot).
    buf
        A serialized ExtendedExpression holding one boolean expression.
    table_name
        The table's name, for messages.

    Raises
    ------
    ExpressionError
        If ``buf`` is malformed, names a column ``table`` does not have (or has with
        another type), or is not boolean.
    """
    from engine import expr as _expr

    _, bound = bind_filter(buf, table.schema, table_name)
    columns = {n: table.column(n) for n in bound.inputs}
    mask = _expr.predicate_mask(bound, columns, table.num_rows)
    return table.filter(pa.array(mask, pa.bool_()))
