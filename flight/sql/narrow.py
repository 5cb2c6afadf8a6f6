"""A selective scan's rows found first over the columns its ``WHERE`` reads (late
materialization).

DuckDB scans a registered Arrow table column by column, all of each column the query reads:
``SELECT * FROM t WHERE sym = 'AAPL'`` over a 10M-row table of 20 columns converts 20
columns of 10M values to keep a few rows. A mature scan reads the filter's columns first and
the rest only for the rows kept. DuckDB's own tables do that; its Arrow scan has no row
number to come back with. So the server does it in two passes:

1. **The narrow pass.** The positions of the rows the ``WHERE`` keeps, at most ``cap + 1``:
   found by numpy when the ``WHERE`` is of a shape it evaluates exactly as DuckDB (below),
   else by DuckDB, scanning the query's table cut to the columns its ``WHERE`` reads plus a
   column of row positions (:class:`Positions`: one shared ``uint32`` range, sliced
   zero-copy) with ``SELECT position FROM table WHERE <the query's WHERE> LIMIT cap + 1``.
2. **The query.** If no more than ``cap`` rows were kept, the table is replaced, for this
   query, by exactly those rows (:func:`take_rows`, in the table's order), and the query
   runs as written over them. Otherwise it runs over the whole table as before: a
   ``WHERE`` that keeps many rows stops the narrow pass early at ``cap + 1``, so the pass
   costs little exactly when it does not pay.

**The pass without DuckDB** (:func:`terms`, :func:`scan`). A ``WHERE`` whose every top-level
``AND`` term compares a column (an integer column plus, minus or times an integer literal)
with literals, ``= <> < <= > >=``, ``BETWEEN``, ``IN`` (or an ``OR`` of equalities of one
column), or is ``IS [NOT] NULL``, is evaluated by numpy chunk by
chunk (a 1M-row chunk stays in cache: ~2.5x DuckDB's one-thread scan of 10M rows), exactly as
DuckDB evaluates it: nulls fail every term; a double's NaN is greater than every number (so
it passes ``>``, ``>=`` and ``<>``); integers compare with integer literals only, exactly,
whatever their width; doubles with numbers that are doubles as DuckDB reads them (a decimal
literal of at most 15 digits, an integer of at most 2**53, an exponent's); strings by
``=``, ``<>`` and ``IN`` (bytewise, as DuckDB's default collation); arithmetic only on
``BIGINT`` columns, and only where no value of the chunk can overflow (DuckDB raises there:
the pass is left to DuckDB). Any other term leaves the whole pass to DuckDB.

The query's answer cannot change: it has the shape of
:func:`flight.sql.query.key_points`'s (one table, named once in its ``FROM``; SQL filters
rows before it groups, windows, orders or limits them), its ``WHERE`` is run again over the
kept rows, and rows keep their order. What :func:`plan` refuses: a ``WHERE`` that calls a
function it does not know (a volatile one would keep other rows the second time), reads a
subquery, a window or an aggregate, names a column the table does not have (DuckDB lets a
``WHERE`` name an output's alias), or reads every column the query reads (nothing to gain);
a parameter outside the ``WHERE``; and a table of fewer than :data:`MIN_ROWS` rows.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

__all__ = ["MIN_ROWS", "POSITION", "NarrowPlan", "Positions", "Term", "plan", "read_columns",
           "scan", "star_only", "take_rows", "terms", "worth"]

#: The narrow pass runs for tables of at least this many rows: below it, DuckDB's second
#: query (its parse, bind and plan, ~0.3 ms) costs more than the columns it skips.
MIN_ROWS = 1 << 19

#: The narrow pass keeps at most ``rows // CAP_DIVISOR`` rows (or :data:`MIN_CAP`): taking
#: more rows from every column costs about what scanning the other columns saved.
CAP_DIVISOR = 128
MIN_CAP = 1024

#: The position column's name in the narrow pass (a table with a column of this name
#: keeps its queries on the whole table).
POSITION = "__ticktable_position"
#: The narrow pass's table name.
NARROW_TABLE = "__ticktable_narrow"

#: Expression nodes a ``WHERE`` may hold for the narrow pass: operators, literals, columns,
#: casts and deterministic functions. A function outside these (``random()``, an unknown
#: name, which sqlglot parses as ``Anonymous``) keeps the query on the whole table.
_REFUSED = (exp.Select, exp.Subquery, exp.Window, exp.AggFunc, exp.Anonymous, exp.Rand,
            exp.Exists, exp.Lambda)


@dataclass(frozen=True, slots=True)
class NarrowPlan:
    """What the narrow pass reads and runs for one query.

    ``columns`` are the table's columns the ``WHERE`` reads (schema names), ``sql`` the pass
    (``SELECT position ... LIMIT {limit}``, the limit filled in by :meth:`text`). ``star``:
    the query is ``SELECT * FROM table WHERE ...`` and nothing more, so the rows the pass
    keeps, in the table's order, are its answer (DuckDB need not run it again). ``terms``:
    the ``WHERE`` as :func:`scan` evaluates it without DuckDB, when it can (:func:`terms`).
    """

    columns: tuple[str, ...]
    sql: str
    star: bool = False
    terms: tuple[Term, ...] | None = None

    def text(self, rows: int) -> str:
        """The pass's SQL for a table of ``rows`` rows (its ``LIMIT`` is the cap + 1)."""
        return self.sql.replace("__TICKTABLE_LIMIT__", str(cap(rows) + 1))


def cap(rows: int) -> int:
    """The most rows the narrow pass keeps for a table of ``rows`` rows."""
    return max(MIN_CAP, rows // CAP_DIVISOR)


def _fold(schema: pa.Schema) -> dict[str, str | None]:
    """Column names by their lower case (DuckDB's unquoted names are case-insensitive);
    ``None`` for a folding two columns share."""
    out: dict[str, str | None] = {}
    for name in schema.names:
        key = name.lower()
        out[key] = None if key in out else name
    return out


def read_columns(tree: exp.Expression, names: set[str], schema: pa.Schema) -> set[str] | None:
    """The columns of the query's one table that ``tree`` reads (schema names); ``None``
    when that is all of them or unknown (a ``*`` other than ``count(*)``'s, a column
    qualified by another name, a folding two columns share)."""
    fold = _fold(schema)
    out: set[str] = set()
    for star in tree.find_all(exp.Star):
        if not isinstance(star.parent, exp.Count):
            return None
    for col in tree.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            return None
        if col.table and col.table not in names:
            return None
        name = fold.get(col.name.lower(), "")
        if name is None:
            return None
        if name:
            out.add(name)
    return out


def plan(tree: exp.Expression, table: exp.Table, where: exp.Expression, names: set[str],
         schema: pa.Schema, params: Sequence[Any] = ()) -> NarrowPlan | None:
    """The narrow pass for a query of the one-table shape (see the module docstring), or
    ``None`` when it cannot run or cannot gain.

    ``table`` is the query's ``FROM`` table, ``where`` its ``WHERE`` condition, ``names``
    the names the table goes by in the query, ``params`` the value of its one ``?`` (empty
    when it has none, or more).
    """
    if any(where.find(kind) is not None for kind in _REFUSED) or isinstance(where, _REFUSED):
        return None
    if sum(1 for _ in tree.find_all(exp.Placeholder)) != sum(1 for _ in where.find_all(exp.Placeholder)):
        return None  # a parameter outside the WHERE: the pass's parameters would not line up
    fold = _fold(schema)
    if POSITION.lower() in fold:
        return None
    filtered: set[str] = set()
    for col in where.find_all(exp.Column):
        if col.table and col.table not in names:
            return None
        name = fold.get(col.name.lower())
        if name is None:
            return None  # an output's alias, or a name two columns share: leave it to DuckDB
        filtered.add(name)
    if not filtered:
        return None
    read = read_columns(tree, names, schema)
    if read is not None and read <= filtered:
        return None  # the query reads no column the WHERE does not
    alias = exp.to_identifier(table.alias_or_name, quoted=True).sql(dialect="duckdb")
    sql = (f'SELECT {alias}."{POSITION}" FROM "{NARROW_TABLE}" AS {alias} '
           f"WHERE {where.sql(dialect='duckdb')} LIMIT __TICKTABLE_LIMIT__")
    ordered = tuple(n for n in schema.names if n in filtered)
    return NarrowPlan(ordered, sql, star_only(tree, {table.alias_or_name}),
                      terms(where, names, schema, params))


#: The parts a ``SELECT * FROM table WHERE ...`` has (any other, set, is a clause).
_STAR_PARTS = frozenset({"expressions", "from", "from_", "where"})


def star_only(tree: exp.Expression, names: set[str]) -> bool:
    """Whether ``tree`` is ``SELECT * FROM table WHERE ...`` (or ``name.*``, ``name`` the
    table's name in scope: its alias if it has one) and nothing more: no clause, no
    ``EXCLUDE``/``REPLACE``/``RENAME`` on the star."""
    if not isinstance(tree, exp.Select) or len(tree.expressions) != 1:
        return False
    if any(v for k, v in tree.args.items() if k not in _STAR_PARTS):
        return False
    star = tree.expressions[0]
    if isinstance(star, exp.Column) and isinstance(star.this, exp.Star):
        if star.table not in names or star.args.get("db") or star.args.get("catalog"):
            return False
        star = star.this
    return isinstance(star, exp.Star) and not any(star.args.values())


#: The cost model of :func:`worth`, in nanoseconds per row (DuckDB's scan of an Arrow
#: column through the server's stream, measured at 10M rows: ~0.19 for a fixed-width
#: column, the position column ~0.11) and milliseconds (the query run again over the kept
#: rows: DuckDB's parse, bind and plan).
NS_FIXED, NS_VARIABLE, NS_POSITION, MS_AGAIN = 0.19, 1.0, 0.11, 1.2


def worth(rows: pa.Table, first: NarrowPlan) -> bool:
    """Whether the narrow pass over ``rows`` (the query's snapshot, which holds the columns
    it reads) should save more than it costs: the columns its ``WHERE`` does not read are
    not scanned, the position column is, and a query other than ``SELECT *`` runs again
    over the kept rows. A gain only for large tables, more for wide rows and strings."""
    skipped = [f.type for f in rows.schema if f.name not in first.columns]
    ns = sum(NS_VARIABLE if not _fixed_width(t) else NS_FIXED for t in skipped)
    gain_ms = rows.num_rows * ns / 1e6
    cost_ms = rows.num_rows * NS_POSITION / 1e6 + (0.0 if first.star else MS_AGAIN)
    return gain_ms > cost_ms


def _fixed_width(t: pa.DataType) -> bool:
    try:
        return t.bit_width > 0
    except ValueError:
        return False


class Positions:
    """Row positions ``0 .. n-1`` as Arrow ``uint32`` arrays, sliced from one shared range.

    The range grows (by doubling) to the largest table a narrow pass read, and is kept:
    4 bytes a row of that table, once for the server, instead of a new array per query.
    """

    def __init__(self) -> None:
        self._range = np.arange(0, dtype=np.uint32)
        self._lock = threading.Lock()

    def first(self, n: int) -> pa.Array:
        """Positions ``0 .. n-1`` (zero-copy from the shared range); ``n`` < 2**32."""
        with self._lock:
            if self._range.size < n:
                size = max(n, 2 * self._range.size, 1 << 16)
                self._range = np.arange(min(size, 2**32 - 1), dtype=np.uint32)
            shared = self._range
        return pa.Array.from_buffers(pa.uint32(), n, [None, pa.py_buffer(shared)])

    @property
    def nbytes(self) -> int:
        """Bytes the shared range holds."""
        return int(self._range.nbytes)


def narrow_table(rows: pa.Table, columns: Sequence[str], positions: Positions) -> pa.Table:
    """``rows``' ``columns`` and their positions (:data:`POSITION`), zero-copy."""
    cols = [rows.column(c) for c in columns]
    return pa.Table.from_arrays([*cols, positions.first(rows.num_rows)],
                                names=[*columns, POSITION])


def take_rows(rows: pa.Table, found: pa.Array | pa.ChunkedArray | npt.NDArray[np.int64]
              ) -> pa.Table:
    """The rows of ``rows`` at the positions ``found`` (any order, no nulls), in the
    table's order: column by column, a column of several chunks chunk by chunk (a
    ``take`` over a chunked column would join its chunks first: ~24 ms for a 10M-row
    table of 153 chunks, whatever the rows taken)."""
    where = np.sort(np.asarray(found if isinstance(found, np.ndarray)
                               else found.to_numpy(zero_copy_only=False), dtype=np.int64))
    if not where.size or not rows.num_columns:
        return rows.schema.empty_table()
    index = pa.array(where)
    cols: list[pa.Array] = []
    for column in rows.columns:
        if column.num_chunks == 1:
            cols.append(column.chunk(0).take(index))
            continue
        lengths = np.fromiter((len(c) for c in column.chunks), dtype=np.int64,
                              count=column.num_chunks)
        starts = np.concatenate(([0], np.cumsum(lengths)))
        chunk = np.searchsorted(starts, where, side="right") - 1
        edges = np.flatnonzero(np.diff(chunk)) + 1
        pieces = [column.chunk(int(chunk[b])).take(pa.array(where[b:e] - starts[chunk[b]]))
                  for b, e in zip(np.concatenate(([0], edges)), np.concatenate((edges, [where.size])),
                                  strict=True)]
        cols.append(pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0])
    return pa.Table.from_arrays(cols, schema=rows.schema)


# --------------------------------------------------------------------- the pass without DuckDB
@dataclass(frozen=True, slots=True)
class Term:
    """One top-level ``AND`` term of a ``WHERE``, as :func:`scan` evaluates it:
    ``column [arith] op values``. ``op`` is one of ``= <> < <= > >=`` (one value), ``in``,
    or ``null`` / ``notnull`` (no value: ``IS [NOT] NULL``, for a column of any type);
    ``arith``, for a ``BIGINT`` column only, is ``("+" | "-" | "*", k)``."""

    column: str
    op: str
    values: tuple[Any, ...]
    arith: tuple[str, int] | None = None


_OPS: dict[type[exp.Expression], str] = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">",
                                         exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
#: Rows :func:`scan` takes at a time (a longer chunk in slices): its masks stay in cache.
SCAN_ROWS = 1 << 20

_ARITH: dict[type[exp.Expression], str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}
_FLIPPED = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}
_UFUNCS: dict[str, Callable[..., Any]] = {
    "=": np.equal, "<>": np.not_equal, ">": np.greater, ">=": np.greater_equal,
    "<": np.less, "<=": np.less_equal}
_INT64 = (-(2**63), 2**63 - 1)
#: A number literal's text, as the pass reads it (ASCII digits; nothing else is taken).
_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+\.[0-9]*|\.[0-9]+")
_EXPONENT = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?[0-9]+")
#: Integers a double holds exactly: DuckDB's cast of an integer literal to DOUBLE is then
#: the number itself.
_EXACT_IN_DOUBLE = 2**53
#: Digits of a decimal literal whose DOUBLE is Python's ``float`` of its text: DuckDB reads
#: ``2.5`` as a ``DECIMAL`` and casts it as its integer over a power of ten, both exact in a
#: double up to 15 digits (so one rounding, the correct one).
_DECIMAL_DIGITS = 15


#: The Python type of a term's values, by the kind of its column (see :func:`_value`).
_PYTHON: dict[str, type] = {"int": int, "float": float, "str": str}


def _kind(type_: pa.DataType) -> str | None:
    """How :func:`scan` compares a column of ``type_``: ``int``, ``float`` (DOUBLE) or
    ``str``; ``None`` for any other type (its terms are DuckDB's)."""
    if pa.types.is_integer(type_) and type_ != pa.uint64():
        return "int"
    if pa.types.is_float64(type_):
        return "float"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "str"
    return None


def terms(where: exp.Expression, names: set[str], schema: pa.Schema,
          params: Sequence[Any] = ()) -> tuple[Term, ...] | None:
    """``where`` as :func:`scan` evaluates it (see the module docstring), or ``None`` when
    a term is of another shape (DuckDB then runs the pass). ``params``: the value of the
    query's one ``?``, when it has one."""
    fold = _fold(schema)
    out: list[Term] = []
    for node in _flat(where):
        got = _term(node, names, fold, schema, params)
        if got is None:
            return None
        out.extend(got)
    return tuple(out) or None


def _flat(node: Any, joiner: type[exp.Connector] = exp.And) -> Iterator[exp.Expression]:
    """The terms ``joiner`` (``AND``, ``OR``) joins in ``node``, parentheses undone."""
    node = node.unnest()
    if isinstance(node, joiner):
        yield from _flat(node.this, joiner)
        yield from _flat(node.expression, joiner)
    else:
        yield node


def _term(node: exp.Expression, names: set[str], fold: dict[str, str | None],
          schema: pa.Schema, params: Sequence[Any]) -> list[Term] | None:
    negated = isinstance(node, exp.Not)
    inner = node.this.unnest() if negated else node
    if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
        column = inner.this.unnest()  # col IS [NOT] NULL: a column of any type
        if not isinstance(column, exp.Column) or isinstance(column.this, exp.Star) or (
                column.table and column.table not in names) or column.args.get("db"):
            return None
        name = fold.get(column.name.lower())
        return None if name is None else [Term(name, "notnull" if negated else "null", ())]
    op = _OPS.get(type(node))
    if op is not None:
        left, right = node.this, node.expression
        operand = _operand(left, names, fold, schema)
        if operand is None:
            operand, right, op = _operand(right, names, fold, schema), left, _FLIPPED[op]
        if operand is None or (operand[1] == "str" and op not in ("=", "<>")):
            return None  # strings: equality only (DuckDB orders them bytewise, a collation)
        value = _value(right, operand[1], params)
        return None if value is None else [Term(operand[0], op, (value,), operand[2])]
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        operand = _operand(node.this, names, fold, schema)
        if operand is None or operand[1] == "str":
            return None
        low = _value(node.args["low"], operand[1], params)
        high = _value(node.args["high"], operand[1], params)
        if low is None or high is None:
            return None
        return [Term(operand[0], ">=", (low,), operand[2]),
                Term(operand[0], "<=", (high,), operand[2])]
    if isinstance(node, exp.Or):  # col = a OR col = b ...: col IN (a, b, ...)
        pins = [_term(d, names, fold, schema, params) for d in _flat(node, exp.Or)]
        if any(p is None or len(p) != 1 or p[0].op not in ("=", "in") for p in pins):
            return None
        firsts = [p[0] for p in pins if p is not None]
        if len({(t.column, t.arith) for t in firsts}) != 1:
            return None
        return [Term(firsts[0].column, "in", tuple(v for t in firsts for v in t.values),
                     firsts[0].arith)]
    if (isinstance(node, exp.In) and not node.args.get("query") and not node.args.get("unnest")
            and not node.args.get("field") and node.expressions):
        operand = _operand(node.this, names, fold, schema)
        if operand is None:
            return None
        values = [_value(v, operand[1], params) for v in node.expressions]
        if any(v is None for v in values):
            return None
        return [Term(operand[0], "in", tuple(values), operand[2])]
    return None


def _operand(node: Any, names: set[str], fold: dict[str, str | None],
             schema: pa.Schema) -> tuple[str, str, tuple[str, int] | None] | None:
    """``(column, kind, arith)`` of a term's side: a column of the table, or a ``BIGINT``
    column plus, minus or times an integer literal."""
    node = node.unnest()
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star) or (node.table and node.table not in names):
            return None
        if node.args.get("db") or node.args.get("catalog"):
            return None
        name = fold.get(node.name.lower())
        if name is None:
            return None
        kind = _kind(schema.field(name).type)
        return None if kind is None else (name, kind, None)
    sign = _ARITH.get(type(node))
    if sign is None:
        return None
    left, right = node.this.unnest(), node.expression.unnest()
    if sign != "-" and not isinstance(left, exp.Column):
        left, right = right, left  # k + col, k * col
    inner = _operand(left, names, fold, schema) if isinstance(left, exp.Column) else None
    k = _value(right, "int", ())
    if inner is None or k is None or schema.field(inner[0]).type != pa.int64():
        return None
    return inner[0], "int", (sign, k)


def _value(node: Any, kind: str, params: Sequence[Any]) -> Any:
    """A literal's value as DuckDB compares it with a ``kind`` column, or ``None`` when it
    is of another kind (or a ``NULL``, or a parameter other than the one ``?``)."""
    node = node.unnest()
    if isinstance(node, exp.Placeholder):
        if len(params) != 1 or node.this is not None:
            return None
        value = params[0]
        if isinstance(value, bool):
            return None
        if kind == "int":
            return value if isinstance(value, int) and _INT64[0] <= value <= _INT64[1] else None
        if kind == "float":
            if isinstance(value, int):
                return float(value) if abs(value) <= _EXACT_IN_DOUBLE else None
            return value if isinstance(value, float) and np.isfinite(value) else None
        return value if isinstance(value, str) else None
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this.unnest()
    if not isinstance(node, exp.Literal):
        return None
    if node.is_string:
        return str(node.this) if kind == "str" and not negative else None
    text = str(node.this)
    if _INTEGER.fullmatch(text):
        number = -int(text) if negative else int(text)
        if kind == "int":
            return number if _INT64[0] <= number <= _INT64[1] else None
        return float(number) if kind == "float" and abs(number) <= _EXACT_IN_DOUBLE else None
    decimal = _DECIMAL.fullmatch(text)
    if kind != "float" or not (decimal or _EXPONENT.fullmatch(text)):
        return None
    if decimal and len(text) - 1 > _DECIMAL_DIGITS:  # a DECIMAL: its digits few enough
        return None
    double = float(text)
    return (-double if negative else double) if np.isfinite(double) else None


def scan(rows: pa.Table, where: Sequence[Term], limit: int,
         stopped: Callable[[], bool] = lambda: False) -> npt.NDArray[np.int64] | None:
    """The positions of ``rows`` that every term of ``where`` keeps, in order, at most
    ``limit + 1`` of them (as the pass's ``LIMIT``); ``None`` when a term cannot be
    evaluated as DuckDB would (arithmetic that could overflow: DuckDB raises) or
    ``stopped()`` became true between two chunks."""
    columns = list(dict.fromkeys(t.column for t in where))
    found: list[npt.NDArray[np.int64]] = []
    total = offset = 0
    for batch in rows.select(columns).to_batches(max_chunksize=SCAN_ROWS):
        if stopped():
            return None
        n = batch.num_rows
        keep: npt.NDArray[np.bool_] | None = None
        for t in where:
            mask = _mask(t, batch.column(columns.index(t.column)))
            if mask is None:
                return None
            keep = mask if keep is None else np.logical_and(keep, mask, out=keep)
        if keep is not None and n:
            hits = np.flatnonzero(keep)
            if hits.size:
                found.append(hits + offset)
                total += hits.size
                if total > limit:
                    break
        offset += n
    if not found:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(found)[:limit + 1]


def _mask(term: Term, values: pa.Array) -> npt.NDArray[np.bool_] | None:
    """Which values of one chunk ``term`` keeps (``None``: it cannot say, see :func:`scan`)."""
    n = len(values)
    if term.op in ("null", "notnull"):  # NaN is not NULL
        if not values.null_count:
            return np.full(n, term.op == "notnull")
        valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        return valid if term.op == "notnull" else ~valid
    if values.null_count == n:
        return np.zeros(n, dtype=bool)
    kind = _kind(values.type)  # the chunk's own type (a snapshot's, as the schema's)
    if kind is None or (term.arith is not None and values.type != pa.int64()) or any(
            type(v) is not _PYTHON[kind] for v in term.values):
        return None  # not the kind the term was read for
    if kind == "str":
        if term.op == "in":
            got = pc.is_in(values, value_set=pa.array(term.values, values.type))
        elif term.op in ("=", "<>"):
            scalar = pa.scalar(term.values[0], values.type)
            got = pc.equal(values, scalar) if term.op == "=" else pc.not_equal(values, scalar)
        else:
            return None
        if got.null_count:
            got = pc.fill_null(got, False)
        return np.asarray(got.to_numpy(zero_copy_only=False), dtype=bool)
    raw: npt.NDArray[Any] = np.frombuffer(values.buffers()[1], dtype=values.type.to_pandas_dtype(),
                                          count=values.offset + n)[values.offset:]
    value = term.values[0]
    if term.arith is None:
        data: npt.NDArray[Any] | None = raw
    elif not _fits(raw, *term.arith):
        return None  # DuckDB raises, or answers otherwise: its to say
    elif term.arith[0] != "*" and term.op != "in":  # no value overflows: compare col with v -+ k
        data, value = raw, value - term.arith[1] if term.arith[0] == "+" else value + term.arith[1]
    else:
        data = _arith(raw, *term.arith)
    if data is None:
        return None
    if term.op == "in":
        info = np.iinfo(data.dtype) if data.dtype.kind in "iu" else None
        wanted = [v for v in term.values if info is None or info.min <= v <= info.max]
        mask = np.isin(data, np.array(wanted, dtype=data.dtype)) if wanted else \
            np.zeros(n, dtype=bool)
    else:
        mask = _UFUNCS[term.op](data, value)
        if data.dtype.kind == "f" and term.op in (">", ">="):  # DuckDB: NaN above all
            mask |= np.isnan(data)
    if values.null_count:
        mask &= np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(mask, dtype=bool)


def _fits(data: npt.NDArray[Any], sign: str, k: int) -> bool:
    """Whether ``data`` (int64) plus, minus or times ``k`` stays in int64 for every value
    (null slots among them): decided by the chunk's least or greatest value, or both, the
    ends of a monotonic function; one reduction for a sum or a difference."""
    if not data.size or k == 0 or (sign == "*" and k == 1):
        return True
    if sign != "*":
        up = (k > 0) == (sign == "+")
        end = int(data.max()) if up else int(data.min())
        moved = end + k if sign == "+" else end - k
        return _INT64[0] <= moved <= _INT64[1]
    return all(_INT64[0] <= int(v) * k <= _INT64[1] for v in (data.min(), data.max()))


def _arith(data: npt.NDArray[Any], sign: str, k: int) -> npt.NDArray[np.int64]:
    """``data`` (int64) plus, minus or times ``k``, which :func:`_fits`."""
    if k == 0:
        return np.zeros_like(data) if sign == "*" else data
    return data + k if sign == "+" else data - k if sign == "-" else data * k
