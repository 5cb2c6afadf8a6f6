"""Expression helpers shared by the ops: bind a ``pyarrow.compute.Expression`` to a schema,
list the columns it reads, and evaluate it on the rows an update touches.

Why these choices (``bench/bench_library.py`` measures the calls):

* **Evaluation** calls the expression's functions on the arrays directly when its tree
  can be recovered from ``str(expr)`` and rebuilt into an equal expression (the *direct
  path*: columns, literals including typed nulls such as ``null[double]``, calls, and calls
  with printed options such as ``cast(x, {to_type=string, ...})`` or ``round(x, {ndigits=2,
  round_mode=HALF_TO_EVEN})``); a few microseconds a call instead of a plan's ~0.2-0.5 ms.
  The text does not show a literal's type (``2.0`` prints ``2``, a decimal or a duration
  a bare number) nor an option holding an array (``is_in``): where the tree read from it
  does not rebuild the expression, its literals and options are taken, in order, from the
  expression's serialized form (:class:`_Serialized`), which holds each with its type.
  Anything else goes through one Acero plan, ``table_source -> project``, with
  ``use_threads=False`` so the output keeps row order. A plan has a fixed cost plus the
  kernels; ``pyarrow.dataset`` costs more per call and ``Table.filter(expr)`` returns rows,
  not a mask aligned with keys. Most of a small evaluation is the plan's fixed cost, so
  callers batch rows (added and modified together) and expressions
  (:func:`evaluate_many`) into as few plans as they can.
* **Referenced columns**: pyarrow does not expose an expression's tree to Python, and
  ``str(expr)`` is not a parser. So :func:`bind` *probes*: the expression is bound on an
  empty table of the schema (this also checks names and kernel types), then once more per
  column with that column renamed; a column is an input exactly when the expression no
  longer binds without it. That is ``1 + ncols`` tiny evaluations, paid once per operation
  when the table is built, never per cycle.
* Columns must be referenced **by name**: a positional reference (``pc.field(0)``) would
  silently point at another column in the narrow tables we evaluate on, so it is refused
  (it shows as ``FieldPath(`` in the expression's text).
* The one exception is a :class:`PositionalExpression`: an expression together with the
  *base schema* its positions refer to, which is what a decoded Substrait expression is
  (``pyarrow.substrait.deserialize_expressions`` gives ``FieldPath(i)`` into the schema
  the expression was serialized against). Its inputs are **all** base-schema columns, in
  base order, and it is evaluated on a table of exactly those columns in exactly that
  order, so position ``i`` is the base column ``i`` by construction: no tree walking, no
  guessing which positions are read. Each base column must exist in the bound schema
  with the same type. Over-approximating the inputs costs at most a spurious
  re-evaluation when an unread base column changes; it can never give a wrong value.
  (Encoders that want precise inputs serialize against the referenced columns only, as
  ``flight.substrait.encode`` does.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from engine.columns import ColumnSource, read_columns
from engine.errors import ExpressionError
from engine.rowset import KeyArray

__all__ = [
    "BoundExpression",
    "PositionalExpression",
    "bind",
    "evaluate",
    "evaluate_many",
    "gather",
    "predicate_mask",
]

# evaluation tables need at least one column to carry the row count of a constant expression
_ROWS = "__ticktable_rows__"
_PROBE = "__ticktable_probe__"
_NO_MATCH = re.compile(r"No match for FieldRef\.Name\((.*?)\) in ")
_FIELD_PATH = re.compile(r"FieldPath\((\d+)\)")

DIRECT = True
"""Evaluate expressions that have a direct tree by calling their functions (tests turn it off)."""


@dataclass(frozen=True, slots=True)
class PositionalExpression:
    """An expression whose column references are positions into ``base``.

    What a decoded Substrait expression is: ``FieldPath(i)`` means column ``i`` of the
    schema it was serialized against. :func:`bind` accepts it wherever it accepts a
    ``pyarrow.compute.Expression``.

    Attributes
    ----------
    expr
        The expression, referencing columns by position.
    base
        The schema the positions refer to; its names must be distinct.
    """

    expr: pc.Expression
    base: pa.Schema

    def __str__(self) -> str:
        names = self.base.names

        def name(m: re.Match[str]) -> str:
            i = int(m.group(1))
            return names[i] if i < len(names) else m.group(0)

        return _FIELD_PATH.sub(name, str(self.expr))


@dataclass(frozen=True, slots=True)
class BoundExpression:
    """An expression checked against a schema.

    Attributes
    ----------
    expr
        The expression.
    inputs
        The columns it reads, in schema order (empty for a constant).
    type
        The type of its result.
    text
        ``str(expr)``, for error messages.
    positional
        True when ``expr`` reads columns by position: it must be evaluated on a table of
        exactly ``inputs``, in that order (see :class:`PositionalExpression`).
    """

    expr: pc.Expression
    inputs: tuple[str, ...]
    type: pa.DataType
    text: str
    positional: bool = False
    direct: _Node | None = None


# ---------------------------------------------------------------------------------------
# the direct path: a tree recovered from str(expr), trusted only when it rebuilds expr


@dataclass(frozen=True, slots=True)
class _Call:
    """A call of a ``pyarrow.compute`` wrapper (the same callable builds and evaluates)."""

    function: Callable[..., Any]
    args: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _WithOptions:
    """A ``pyarrow.compute`` wrapper called with the options its expression printed
    (``round(x, {ndigits=2, round_mode=HALF_TO_EVEN})``), as keyword arguments: the same
    call builds the expression and evaluates it on arrays."""

    function: Callable[..., Any]
    options: tuple[tuple[str, Any], ...]

    def __call__(self, *args: Any) -> Any:
        return self.function(*args, **dict(self.options))


@dataclass(frozen=True, slots=True)
class _Cast:
    """``cast(x, {to_type=..., allow_...=...})``: ``Expression.cast`` builds it,
    ``pc.cast`` evaluates it, both with the printed ``CastOptions``."""

    options: pc.CastOptions

    def __call__(self, arg: Any) -> Any:
        if isinstance(arg, pc.Expression):
            return arg.cast(options=self.options)
        return pc.cast(arg, options=self.options)


@dataclass(frozen=True, slots=True)
class _Given:
    """A ``pyarrow.compute`` wrapper called with an options object (read from the
    expression's serialized form): ``function(*args, options=options)``."""

    function: Callable[..., Any]
    options: pc.FunctionOptions

    def __call__(self, *args: Any) -> Any:
        return self.function(*args, options=self.options)


# a column name (str), a literal (pa.Scalar) or a call
_Node: TypeAlias = "str | pa.Scalar | _Call"

_TOKEN = re.compile(r"""\s*(?:(?P<time>\d{4}-\d\d-\d\d(?: \d\d:\d\d:\d\d(?:\.\d+)?Z?)?)"""
                    r"""|(?P<num>-?(?:\d+(?:\.\d*)?(?:e[+-]?\d+)?|inf\b|nan\b))|(?P<str>"(?:[^"\\]|\\.)*")"""
                    r"""|(?P<opts>\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})"""
                    r"""|(?P<null>null\[(?:[^\[\]]|\[[^\[\]]*\])*\])"""
                    r"""|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|<=|>=|<|>|[(),]))""")
# how Expression::ToString prints comparisons and Kleene logic: "(a == b)", "(a and b)"
_INFIX = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater",
          ">=": "greater_equal", "and": "and_kleene", "or": "or_kleene", "and_not": "and_not_kleene"}


class _NoTree(Exception):
    """``str(expr)`` is outside the small grammar of the direct path."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _NoTree(text[pos:])
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _function(name: str) -> Callable[..., Any]:
    fn = getattr(pc, name, None) or getattr(pc, name + "_", None)
    if fn is None or getattr(fn, "__arrow_compute_function__", None) is None:
        raise _NoTree(name)
    return cast("Callable[..., Any]", fn)


_DECIMAL = re.compile(r"decimal(128|256)\((\d+), (-?\d+)\)")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=([^\]]+))?\]")
_ENUM = re.compile(r"[A-Z][A-Z0-9_]*")


def _type(text: str) -> pa.DataType:
    """A type as ``str(DataType)`` prints it, for the types that print unambiguously."""
    m = _DECIMAL.fullmatch(text)
    if m:
        make = pa.decimal128 if m.group(1) == "128" else pa.decimal256
        return make(int(m.group(2)), int(m.group(3)))
    m = _TIMESTAMP.fullmatch(text)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        raise _NoTree(text) from None


_UNITS: dict[int, Literal["s", "ms", "us", "ns"]] = {0: "s", 3: "ms", 6: "us", 9: "ns"}


def _time_literal(text: str) -> pa.Scalar:
    """A date or timestamp literal as ``str(expr)`` prints it: a timestamp's unit is the
    number of its fraction's digits, ``Z`` its time zone UTC."""
    if " " not in text:
        return pa.scalar(np.datetime64(text, "D").astype(object), pa.date32())
    utc = text.endswith("Z")
    text = text.rstrip("Z")
    unit = _UNITS.get(len(text.partition(".")[2]))
    if unit is None:
        raise _NoTree(text)
    value = np.datetime64(text.replace(" ", "T"), unit).astype(np.int64)
    return pa.scalar(int(value), pa.timestamp(unit, tz="UTC" if utc else None))


def _split_options(body: str) -> list[str]:
    """``k=v, k=v`` split at the commas outside brackets and strings."""
    items, depth, start, quoted, escaped = [], 0, 0, False, False
    for pos, ch in enumerate(body):
        if quoted:
            quoted, escaped = (ch != '"' or escaped), (ch == "\\" and not escaped)
        elif ch == '"':
            quoted = True
        elif ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:pos].strip())
            start = pos + 1
    items.append(body[start:].strip())
    return items


def _option(key: str, text: str) -> Any:
    """One printed option value: a type (``to_type``), a boolean, a number, a string, or
    an enum's name (its value in lower case, as the options classes take it)."""
    if key == "to_type":
        return _type(text)
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(?:e[+-]?\d+)?", text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    if _ENUM.fullmatch(text):
        return text.lower()
    raise _NoTree(text)


def _with_options(name: str, block: str) -> Callable[..., Any]:
    """The call of function ``name`` with its printed options ``{...}``."""
    options = []
    for item in _split_options(block[1:-1]):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise _NoTree(item)
        options.append((key, _option(key, value)))
    if name == "cast":
        opts = dict(options)
        try:
            return _Cast(pc.CastOptions(opts.pop("to_type"), **opts))
        except (KeyError, TypeError) as exc:
            raise _NoTree(block) from exc
    return _WithOptions(_function(name), tuple(options))


def _parse(toks: list[tuple[str, str]], i: int, found: _Serialized | None = None) -> tuple[_Node, int]:
    """One node from ``toks[i:]`` and the index after it; its literals and options taken
    from ``found`` when given, else read from the text."""
    if i >= len(toks):
        raise _NoTree("end")
    kind, tok = toks[i]
    nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
    if kind == "op" and tok == "(":
        left, i = _parse(toks, i + 1, found)
        if i >= len(toks) or toks[i][1] not in _INFIX:
            raise _NoTree("operator")
        op = _INFIX[toks[i][1]]
        right, i = _parse(toks, i + 1, found)
        if i >= len(toks) or toks[i][1] != ")":
            raise _NoTree(")")
        return _Call(_function(op), (left, right)), i + 1
    if kind == "name" and nxt == "(":
        name = tok
        args: list[_Node] = []
        i += 2
        while True:
            if i + 1 < len(toks) and toks[i][0] == "opts" and args and toks[i + 1][1] == ")":
                call = _with_options(name, toks[i][1]) if found is None else found.call_options(name)
                return _Call(call, tuple(args)), i + 2
            arg, i = _parse(toks, i, found)
            args.append(arg)
            if i < len(toks) and toks[i][1] == ",":
                i += 1
                continue
            if i < len(toks) and toks[i][1] == ")":
                return _Call(_function(name), tuple(args)), i + 1
            raise _NoTree("arguments")
    if found is not None and (kind in ("null", "time", "num", "str")
                              or kind == "name" and tok in ("true", "false")):
        return found.literal(), i + 1
    if kind == "name":
        if tok in ("true", "false"):
            return pa.scalar(tok == "true"), i + 1
        return tok, i + 1
    if kind == "null":  # a typed null: null[int64], null[timestamp[us]]
        return pa.scalar(None, _type(tok[5:-1])), i + 1
    if kind == "time":  # a date32 "2024-03-04", a timestamp "2024-03-04 01:59:00.000000[Z]"
        return _time_literal(tok), i + 1
    if kind == "num":
        return pa.scalar(float(tok) if any(c in tok for c in ".ein") else int(tok)), i + 1
    if kind == "str":
        return pa.scalar(re.sub(r"\\(.)", r"\1", tok[1:-1])), i + 1
    raise _NoTree(tok)


@dataclass(slots=True)
class _Serialized:
    """``expr``'s literals and options as its serialized form holds them, each with its
    type, handed out in the order ``str(expr)`` prints them.

    The text prints ``2.0`` as ``2``, a decimal or a duration as a bare number, and an
    option holding an array (``is_in``'s ``value_set``) in a form not read back; the
    serialized form (what pickling an expression writes: an Arrow IPC file with a one-row
    column per literal and per call's options, in the tree's order) holds each literal as a
    typed scalar and each options as a struct ``FunctionOptions.deserialize`` reads."""

    literals: list[pa.Scalar]
    options: list[pc.FunctionOptions]
    used_literals: int = 0
    used_options: int = 0

    @classmethod
    def of(cls, expr: pc.Expression) -> _Serialized | None:
        try:
            batch = pa.ipc.open_file(expr.__reduce__()[1][0]).read_all()
            literals, options = [], []
            for name, column in zip(batch.column_names, batch.columns, strict=True):
                t = column.type
                if pa.types.is_struct(t) and t.get_field_index("_type_name") >= 0:
                    sink = pa.BufferOutputStream()
                    one = pa.table({name: column})
                    with pa.ipc.new_file(sink, one.schema) as writer:
                        writer.write_table(one)
                    options.append(pc.FunctionOptions.deserialize(sink.getvalue()))
                else:
                    literals.append(column[0])
        except (pa.ArrowException, IndexError, TypeError, ValueError):
            return None
        return cls(literals, options)

    def literal(self) -> pa.Scalar:
        if self.used_literals >= len(self.literals):
            raise _NoTree("literals")
        self.used_literals += 1
        return self.literals[self.used_literals - 1]

    def call_options(self, name: str) -> Callable[..., Any]:
        if self.used_options >= len(self.options):
            raise _NoTree("options")
        self.used_options += 1
        options = self.options[self.used_options - 1]
        if isinstance(options, pc.CastOptions):
            return _Cast(options)
        return _Given(_function(name), options)

    def all_used(self) -> bool:
        return self.used_literals == len(self.literals) and self.used_options == len(self.options)


def _rebuild(node: _Node) -> pc.Expression:
    if isinstance(node, str):
        return pc.field(node)
    if isinstance(node, pa.Scalar):
        return pc.scalar(node)
    return cast("pc.Expression", node.function(*(_rebuild(a) for a in node.args)))


def _reads_columns(node: _Node) -> bool:
    """Whether ``node`` reads a column, so that its value is an array of the rows (a call of
    literals only, ``cast(2, {to_type=double})`` inside it, is computed as a scalar; a whole
    constant expression is the plan's, which folds it)."""
    if isinstance(node, str):
        return True
    if isinstance(node, pa.Scalar):
        return False
    return any(_reads_columns(a) for a in node.args)


def _run(node: _Node, columns: Mapping[str, pa.Array | pa.ChunkedArray]) -> Any:
    if isinstance(node, str):
        return columns[node]
    if isinstance(node, pa.Scalar):
        return node
    return node.function(*(_run(a, columns) for a in node.args))


def _direct_tree(expr: pc.Expression, text: str, schema: pa.Schema, type: pa.DataType) -> _Node | None:
    """The tree of ``expr`` when the direct path gives exactly what the plan gives, else None."""
    try:
        toks = _tokens(text)
        try:
            node, end = _parse(toks, 0)
            read = end == len(toks) and _rebuild(node).equals(expr)
        except _NoTree:
            read = False
        if not read:  # a literal's type or an option is not in the text
            found = _Serialized.of(expr)
            if found is None:
                return None
            node, end = _parse(toks, 0, found)
            if end != len(toks) or not found.all_used() or not _rebuild(node).equals(expr):
                return None
        if not _reads_columns(node):
            return None
        empty = {f.name: pa.array([], type=f.type) for f in schema}
        if not _single(pa.chunked_array([_run(node, empty)]), type).type.equals(type):
            return None
    except (_NoTree, ArithmeticError, IndexError, KeyError, TypeError, ValueError, pa.ArrowException):
        return None
    return node


def _project(table: pa.Table, exprs: list[pc.Expression]) -> pa.Table:
    decl = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(table)),
        acero.Declaration("project", acero.ProjectNodeOptions(exprs, [f"out{i}" for i in range(len(exprs))])),
    ])
    # one thread keeps the output in input order
    return decl.to_table(use_threads=False)


def _empty(schema: pa.Schema) -> pa.Table:
    if len(schema) == 0:
        return pa.table({_ROWS: pa.nulls(0)})
    return schema.empty_table()


def bind(expr: object, schema: pa.Schema, *, table_name: str, what: str) -> BoundExpression:
    """Check ``expr`` against ``schema`` and find the columns it reads.

    Parameters
    ----------
    expr
        A ``pyarrow.compute.Expression`` (``pc.field("Price") * 2``), or a
        :class:`PositionalExpression` (a decoded Substrait expression).
    schema
        The columns the expression may read.
    table_name
        The table the columns belong to, for messages.
    what
        What the expression is for (``"predicate"``, ``"column 'X'"``), for messages.

    Raises
    ------
    ExpressionError
        If ``expr`` is not an expression, refers to a column by position, names a column
        that is not in ``schema``, or applies a function to types it does not accept; for
        a :class:`PositionalExpression`, also if a base-schema column is missing from
        ``schema`` or has another type there.
    """
    if isinstance(expr, PositionalExpression):
        return _bind_positional(expr, schema, table_name=table_name, what=what)
    if not isinstance(expr, pc.Expression):
        raise ExpressionError(
            f"{what} on table {table_name!r}: expected a pyarrow.compute.Expression, got "
            f"{type(expr).__name__} {expr!r} (wrap columns in pc.field(...), constants in "
            f"pc.scalar(...))"
        )
    text = str(expr)
    if "FieldPath(" in text and not any("FieldPath(" in n for n in schema.names):
        raise ExpressionError(
            f"{what} on table {table_name!r} refers to a column by position ({text}); "
            f"use pc.field(name) (columns: {', '.join(schema.names)})"
        )
    try:
        out = _project(_empty(schema), [expr]).column(0)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as exc:
        msg = str(exc)
        m = _NO_MATCH.search(msg)
        if m:
            raise ExpressionError(
                f"{what} on table {table_name!r} names column {m.group(1)!r}, which does not "
                f"exist (has: {', '.join(schema.names)})"
            ) from exc
        raise ExpressionError(f"{what} on table {table_name!r} is invalid: {text}: {msg}") from exc
    inputs = []
    for i, name in enumerate(schema.names):  # one probe per column, once per operation
        probe = _empty(schema.set(i, pa.field(_PROBE, schema.field(i).type)))
        try:
            _project(probe, [expr])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
            inputs.append(name)
    return BoundExpression(expr, tuple(inputs), out.type, text,
                           direct=_direct_tree(expr, text, schema, out.type))


def _bind_positional(
    pexpr: PositionalExpression, schema: pa.Schema, *, table_name: str, what: str
) -> BoundExpression:
    """Bind a positional expression: every base column is an input, checked by name and type."""
    base = pexpr.base
    text = str(pexpr)
    if not isinstance(pexpr.expr, pc.Expression) or not isinstance(base, pa.Schema):
        raise ExpressionError(
            f"{what} on table {table_name!r}: a PositionalExpression needs a "
            f"pyarrow.compute.Expression and a pyarrow.Schema"
        )
    dup = sorted({n for n in base.names if base.names.count(n) > 1})
    if dup:
        raise ExpressionError(
            f"{what} on table {table_name!r}: its base schema names column(s) {dup} more than "
            f"once; serialize it against a schema with distinct names"
        )
    for field in base:
        i = schema.get_field_index(field.name)
        if i < 0:
            raise ExpressionError(
                f"{what} on table {table_name!r} names column {field.name!r}, which does not "
                f"exist (has: {', '.join(schema.names)})"
            )
        have = schema.field(i).type
        if not have.equals(field.type):
            raise ExpressionError(
                f"{what} on table {table_name!r} was built for column {field.name!r} of type "
                f"{field.type}, but the table's {field.name!r} is {have}; build the "
                f"expression against the table's schema"
            )
    try:
        # exactly the evaluation layout: the base columns, in base order
        out = _project(_empty(base), [pexpr.expr]).column(0)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as exc:
        raise ExpressionError(f"{what} on table {table_name!r} is invalid: {text}: {exc}") from exc
    return BoundExpression(pexpr.expr, tuple(base.names), out.type, text, positional=True)


def gather(
    sources: Mapping[str, ColumnSource], names: Sequence[str], keys: KeyArray, *, prev: bool = False
) -> dict[str, pa.Array]:
    """Current (or, with ``prev``, previous) values of ``names`` at ``keys``."""
    return dict(zip(names, read_columns([sources[n] for n in names], keys, prev=prev), strict=True))


def evaluate(
    bound: BoundExpression, columns: Mapping[str, pa.Array | pa.ChunkedArray], n: int
) -> pa.Array:
    """Evaluate ``bound`` on ``n`` rows whose input columns are given.

    ``columns`` must hold every name in ``bound.inputs`` (extra names are ignored).

    Raises
    ------
    ExpressionError
        If a kernel fails on these values (overflow, division by zero, a failing cast).
    """
    return evaluate_many([bound], columns, n)[0]


def evaluate_many(
    bounds: Sequence[BoundExpression], columns: Mapping[str, pa.Array | pa.ChunkedArray], n: int
) -> list[pa.Array]:
    """Evaluate several expressions over the same ``n`` rows in one plan.

    A plan has a fixed cost and each expression adds less than that, so independent
    expressions are cheaper together. A name means one column for all of
    ``bounds``. Positional expressions need their own column layout, so they share a plan
    only with positional expressions of the same inputs.

    Raises
    ------
    ExpressionError
        If a kernel fails on these values (overflow, division by zero, a failing cast).
    """
    if DIRECT and all(b.direct is not None for b in bounds):
        return [_evaluate_direct(b, columns) for b in bounds]
    if not any(b.positional for b in bounds) and not (
            DIRECT and any(b.direct is not None for b in bounds)):
        names = list(dict.fromkeys(c for b in bounds for c in b.inputs))
        return _evaluate_plan(bounds, names, columns, n)
    # one plan per layout: the named expressions together, positional ones by their inputs
    plans: dict[tuple[str, ...] | None, list[int]] = {}
    results: dict[int, pa.Array] = {}
    for i, b in enumerate(bounds):
        if DIRECT and b.direct is not None:
            results[i] = _evaluate_direct(b, columns)
        else:
            plans.setdefault(b.inputs if b.positional else None, []).append(i)
    for layout, members in plans.items():
        group = [bounds[i] for i in members]
        names = list(layout) if layout is not None else list(
            dict.fromkeys(c for b in group for c in b.inputs))
        results.update(zip(members, _evaluate_plan(group, names, columns, n), strict=True))
    return [results[i] for i in range(len(bounds))]


def _evaluate_plan(
    bounds: Sequence[BoundExpression],
    names: list[str],
    columns: Mapping[str, pa.Array | pa.ChunkedArray],
    n: int,
) -> list[pa.Array]:
    """Evaluate ``bounds`` in one plan over a table of ``names``, in that order."""
    if names:
        table = pa.Table.from_arrays([columns[c] for c in names], names=names)
    else:
        table = pa.table({_ROWS: pa.nulls(n)})
    try:
        out = _project(table, [b.expr for b in bounds])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        texts = " / ".join(b.text for b in bounds)
        raise ExpressionError(f"evaluating {texts} failed: {exc}") from exc
    return [_single(out.column(i), b.type) for i, b in enumerate(bounds)]


def _evaluate_direct(bound: BoundExpression, columns: Mapping[str, pa.Array | pa.ChunkedArray]
                     ) -> pa.Array:
    """``bound`` by calling its functions on the arrays (see the module's docstring)."""
    assert bound.direct is not None
    try:
        out = _run(bound.direct, columns)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ExpressionError(f"evaluating {bound.text} failed: {exc}") from exc
    if isinstance(out, pa.ChunkedArray):
        return _single(out, bound.type)
    return cast("pa.Array", out)


def _single(col: pa.ChunkedArray, type: pa.DataType) -> pa.Array:
    if col.num_chunks == 1:
        return col.chunk(0)
    if col.num_chunks == 0:
        return pa.array([], type=type)
    return col.combine_chunks()


def predicate_mask(
    bound: BoundExpression, columns: Mapping[str, pa.Array | pa.ChunkedArray], n: int
) -> npt.NDArray[np.bool_]:
    """Evaluate a boolean expression as a numpy mask; null counts as false (SQL WHERE)."""
    out = evaluate(bound, columns, n)
    if out.null_count:
        out = pc.fill_null(out, False)
    return np.asarray(out.to_numpy(zero_copy_only=False), dtype=bool)
