"""The expressions of a live SQL view (:mod:`flight.sql.views`): SQL scalar expressions
compiled to pyarrow compute expressions over the relation the view compiler is building.

:class:`Expressions` is that compiler's base: it knows the columns a ``FROM`` clause made
nameable (:class:`Rel` of :class:`Col`) and, after a ``GROUP BY``, the groups and aggregates
(:class:`Scope`); every expression it returns is checked to bind over the scope's schema
(:func:`type_of`), and what does not map is a :class:`~engine.errors.SqlError` naming it.

What maps: columns (qualified or not), literals, ``+ - *`` (overflow fails the view, as
it fails DuckDB's query), ``/`` (float division of integers and decimals, as DuckDB's),
comparisons, ``AND``/``OR``/
``NOT``, ``IN (list)``, ``BETWEEN``, ``IS [NOT] NULL``, ``[NOT] [I]LIKE``, ``CASE``,
``COALESCE``, ``CAST`` to integers, floats, ``VARCHAR`` (not from floats: the formats
differ) and ``BOOLEAN`` (floats to integers round half to even, as DuckDB's), ``upper``,
``lower``, ``length``, ``abs``, ``||``, ``NULLIF``, ``GREATEST``/``LEAST`` (nulls skipped),
``starts_with``/``ends_with``/``contains`` and ``replace`` of constant strings,
``trim``/``ltrim``/``rtrim`` (spaces, or constant characters), ``concat`` (of strings and
integers, a null as an empty string), ``left``/``right`` of a constant length,
``floor``/``ceil`` (a double's, as DuckDB's, of an integer too), ``substr``/``substring``
of a constant start and length (DuckDB's counting: from 1, negative from the end),
``round(x[, n])`` of a constant ``n`` (ties away from zero; a float's in double as DuckDB
computes it, a decimal's to ``DECIMAL(width, n)``), ``trunc``, ``sign``, ``%`` and ``//``
of integers and floats. Times and dates: ``TIMESTAMP '...'``, ``DATE
'...'`` and ``TIMESTAMPTZ '...'`` literals (ISO 8601), ``+``/``-`` of an ``INTERVAL`` of
fixed length (weeks down to microseconds; months and years are refused), ``CAST`` between
dates and timestamps, ``date_trunc`` (microsecond to year; a date's is a timestamp, as
DuckDB's), ``time_bucket(INTERVAL, x)`` of a width that divides a day or of a week, ``extract`` of year, quarter, month, day, hour, minute, second, dow, isodow,
doy, week and epoch, and the functions of those names (``year(x)``, ``epoch(x)``...), as
DuckDB computes them in its session's zone, UTC: a column zoned elsewhere is refused.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
from sqlglot import exp

from engine.errors import SqlError
from flight.sql.parse import DIALECT

if TYPE_CHECKING:
    from engine.table import Table

__all__ = ["Col", "Expressions", "Rel", "Scope", "is_agg", "type_of"]


# the relation being built ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Col:
    """A column SQL can name: ``qualifier.name``, held in the engine column ``internal``.

    ``merged`` marks the right side's copy of a ``USING`` column: reachable qualified only,
    not by its bare name and not in ``*``.
    """

    qualifier: str | None
    name: str
    internal: str
    merged: bool = False


@dataclass(slots=True)
class Rel:
    """A FROM clause so far: a table and the columns SQL can name in it."""

    table: Table
    cols: list[Col]

    def find(self, node: exp.Column) -> list[Col]:
        """The columns ``node`` may mean (DuckDB: names match case-insensitively)."""
        q, n = node.table, node.name
        hits = [c for c in self.cols if c.name == n and (c.qualifier == q if q else not c.merged)]
        if not hits:
            hits = [c for c in self.cols if c.name.lower() == n.lower()
                    and ((c.qualifier or "").lower() == q.lower() if q else not c.merged)]
        return hits


def type_of(e: pc.Expression, schema: pa.Schema) -> pa.DataType:
    """The type ``e`` has over ``schema`` (one evaluation on no rows; none for a column)."""
    for f in schema:
        if e.equals(pc.field(f.name)):
            return f.type
    decl = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(schema.empty_table())),
        acero.Declaration("project", acero.ProjectNodeOptions([e], ["out"])),
    ])
    return decl.to_table(use_threads=False).schema.field(0).type


# expressions ------------------------------------------------------------------------------------
_COMPARE: dict[type[exp.Expression], Callable[..., pc.Expression]] = {
    exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater, exp.GTE: pc.greater_equal,
    exp.LT: pc.less, exp.LTE: pc.less_equal}
_ARITH: dict[type[exp.Expression], Callable[..., pc.Expression]] = {
    exp.Add: pc.add_checked, exp.Sub: pc.subtract_checked, exp.Mul: pc.multiply_checked}
_CAST = {
    exp.DataType.Type.BOOLEAN: pa.bool_(), exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.SMALLINT: pa.int16(), exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.BIGINT: pa.int64(), exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.DOUBLE: pa.float64(), exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.TEXT: pa.string(),
}

def _string_literal(node: exp.Expression | None) -> str | None:
    return node.this if isinstance(node, exp.Literal) and node.is_string else None


def _int_literal(node: exp.Expression | None) -> int | None:
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative and node is not None else node
    if isinstance(inner, exp.Literal) and not inner.is_string and inner.this.isdigit():
        return -int(inner.this) if negative else int(inner.this)
    return None


def _when(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t))


_UTC = ("UTC", "Etc/UTC", "+00:00", "Z", "utc")
#: the coarsest unit a time_bucket width is a whole number of (floor_temporal's multiple
#: is an int32): (unit, microseconds)
_BUCKET_UNITS = (("day", 86_400 * 10**6), ("hour", 3_600 * 10**6), ("minute", 60 * 10**6),
                 ("second", 10**6), ("millisecond", 1_000), ("microsecond", 1))
#: date_trunc's units (DuckDB's, without a plural s) as floor_temporal's
_FLOOR = {"microsecond": "microsecond", "millisecond": "millisecond", "second": "second",
          "minute": "minute", "hour": "hour", "day": "day", "week": "week", "month": "month",
          "quarter": "quarter", "year": "year"}
_INTERVAL_SECONDS = {"microsecond": 1e-6, "us": 1e-6, "millisecond": 1e-3, "ms": 1e-3,
                     "second": 1.0, "sec": 1.0, "minute": 60.0, "min": 60.0, "hour": 3600.0,
                     "day": 86400.0, "week": 604800.0}
#: sqlglot's part functions (``year(x)``...) and extract's parts, as DuckDB numbers them
_PARTS: dict[type[exp.Expression], str] = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day",
    exp.Hour: "hour", exp.Minute: "minute", exp.Second: "second", exp.DayOfWeek: "dow",
    exp.DayOfWeekIso: "isodow", exp.DayOfYear: "doy", exp.Week: "week"}
_EXTRACT: dict[str, Callable[[pc.Expression], pc.Expression]] = {
    "year": pc.year, "quarter": pc.quarter, "month": pc.month, "day": pc.day,
    "hour": pc.hour, "minute": pc.minute, "second": pc.second,
    "dow": lambda x: pc.day_of_week(x, count_from_zero=True, week_start=7),  # Sunday 0
    "dayofweek": lambda x: pc.day_of_week(x, count_from_zero=True, week_start=7),
    "isodow": lambda x: pc.day_of_week(x, count_from_zero=False, week_start=1),  # Monday 1
    "doy": pc.day_of_year, "dayofyear": pc.day_of_year, "week": pc.iso_week}
_TIME_OF_DAY = ("hour", "minute", "second")
#: the largest constant start or length a substring takes, and its open end
_SUBSTR_MAX, _SUBSTR_END = 2**31 - 1, 2**62
#: the most digits a round takes (DuckDB's INTEGER)
_ROUND_MAX = 2**31 - 1

def _exact(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_decimal(t)


def _number_literal(node: exp.Expression) -> pa.Scalar | None:
    """A number literal (``12``, ``-0.05``, ``1e3``) as the decimal scalar of its digits, or
    None for anything else."""
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if not isinstance(inner, exp.Literal) or inner.is_string:
        return None
    try:
        value = decimal.Decimal(inner.this)
    except decimal.InvalidOperation:
        return None
    if not value.is_finite():
        return None
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    precision = max(1, len(digits) + max(0, exponent), scale)
    if precision > 38:
        return None
    return pa.scalar(-value if negative else value, pa.decimal128(precision, scale))


def is_agg(node: exp.Expr) -> bool:
    return isinstance(node, exp.AggFunc) or (
        isinstance(node, exp.Anonymous) and str(node.this).lower() == "mean")


@dataclass(slots=True)
class Scope:
    """What an expression may read: a relation's columns, or (after GROUP BY) the groups and
    aggregates, which ``special`` maps by their SQL text."""

    rel: Rel
    clause: str
    special: dict[str, pc.Expression] = field(default_factory=dict)
    groups: dict[str, str] | None = None  # after GROUP BY: internal column -> group column

    @property
    def schema(self) -> pa.Schema:
        return self.rel.table.schema


class Expressions:
    """Compiles SQL scalar expressions to pyarrow expressions over a :class:`Scope`;
    the base of the view compiler, which builds the relations they read. ``prefix``
    begins every message (``CREATE VIEW v``)."""

    prefix: str

    def refuse(self, clause: str) -> SqlError:
        return SqlError(f"{self.prefix}: {clause} does not map to an incremental operation")

    def error(self, message: str) -> SqlError:
        return SqlError(f"{self.prefix}: {message}")

    def one(self, hits: list[Col], what: str, rel: Rel, clause: str) -> Col:
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise self.unknown(exp.column(what), rel)
        raise self.error(f"{clause}: column reference {what!r} is ambiguous (could be "
                         f"{', '.join(f'{c.qualifier}.{c.name}' for c in hits)})")

    def unknown(self, node: exp.Column, rel: Rel) -> SqlError:
        have = ", ".join(f"{c.qualifier}.{c.name}" if c.qualifier else c.name for c in rel.cols)
        return self.error(f"column {node.sql(dialect=DIALECT)!r} does not exist (columns: {have})")

    def predicate(self, node: exp.Expression, scope: Scope) -> pc.Expression:
        e = self.expr(node, scope)
        t = self.typed(e, scope, node)
        if not pa.types.is_boolean(t) and not pa.types.is_null(t):
            raise self.error(f"{scope.clause} {node.sql(dialect=DIALECT)} is {t}, not a boolean")
        return e

    def typed(self, e: pc.Expression, scope: Scope, node: exp.Expression) -> pa.DataType:
        try:
            return type_of(e, scope.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as exc:
            raise self.error(f"{scope.clause} {node.sql(dialect=DIALECT)}: {str(exc).splitlines()[0]}"
                             ) from exc

    def expr(self, node: exp.Expression, scope: Scope) -> pc.Expression:
        """``node`` as a pyarrow expression over ``scope``'s table (checked: it binds)."""
        e = self._expr(node, scope)
        self.typed(e, scope, node)
        return e

    def _operands(self, left: exp.Expression, right: exp.Expression, scope: Scope
                  ) -> list[pc.Expression]:
        """Two operands of one operator. A number literal beside a decimal is a decimal of its
        own digits, as DuckDB types it (``1.5`` is ``DECIMAL(2, 1)``): Arrow would cast an
        int64 literal to ``DECIMAL(10, 2)`` only with room for any int64, and fail."""
        sub = [self._expr(left, scope), self._expr(right, scope)]
        for i, node in enumerate((left, right)):
            literal = _number_literal(node)
            if literal is not None and pa.types.is_decimal(self.typed(sub[1 - i], scope, node)):
                sub[i] = pc.scalar(literal)
        return sub

    def _expr(self, node: exp.Expression, scope: Scope) -> pc.Expression:  # noqa: C901, PLR0911, PLR0912
        key = node.sql(dialect=DIALECT)
        if key in scope.special:
            return scope.special[key]
        if isinstance(node, exp.Paren):
            return self._expr(node.this, scope)
        if isinstance(node, exp.Column):
            return self.column(node, scope)
        if isinstance(node, exp.Window):
            raise self.refuse(f"window function {node.this.sql(dialect=DIALECT)}")
        if isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.In) and node.args.get("query")):
            raise self.refuse(f"subquery in an expression ({key})")
        if isinstance(node, exp.Filter):
            raise self.refuse(f"FILTER clause ({key})")
        if is_agg(node):
            raise self.error(f"aggregate {key} is not allowed in {scope.clause}")
        if isinstance(node, exp.Literal):
            if node.is_string:
                return pc.scalar(node.this)
            text = node.this
            return pc.scalar(int(text) if text.lstrip("-").isdigit() else float(text))
        if isinstance(node, exp.Boolean):
            return pc.scalar(bool(node.this))
        if isinstance(node, exp.Null):
            return pc.scalar(None)
        if isinstance(node, exp.Neg):
            return pc.negate_checked(self._expr(node.this, scope))
        sub = self._operands(node.this, node.expression, scope) if isinstance(
            node, exp.Binary) else []
        if type(node) in _ARITH:
            types = [self.typed(x, scope, node) for x in sub]
            if any(_when(t) for t in types) and not (
                    isinstance(node, (exp.Add, exp.Sub)) and _when(types[0])
                    and pa.types.is_duration(types[1])
                    or isinstance(node, exp.Add) and _when(types[1])
                    and pa.types.is_duration(types[0])):
                raise self.refuse(f"{key} (a time takes + or - of an INTERVAL of fixed length; "
                                  f"the difference of two is an INTERVAL in DuckDB)")
            return _ARITH[type(node)](*sub)
        if type(node) in _COMPARE:
            return _COMPARE[type(node)](*sub)
        if isinstance(node, exp.Div):
            a, b = sub
            exact = [_exact(self.typed(x, scope, node)) for x in sub]
            if any(exact):  # DuckDB's / divides integers and decimals as floats
                a = a.cast(pa.float64()) if exact[0] else a
                b = b.cast(pa.float64()) if exact[1] else b
            return pc.divide(a, b)
        if isinstance(node, exp.And):
            return pc.and_kleene(*sub)
        if isinstance(node, exp.Or):
            return pc.or_kleene(*sub)
        if isinstance(node, exp.DPipe):
            return pc.binary_join_element_wise(*sub, "")
        if isinstance(node, exp.Not):
            return pc.invert(self._expr(node.this, scope))
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.refuse(f"IS {node.expression.sql(dialect=DIALECT)}")
            return pc.is_null(self._expr(node.this, scope))
        if isinstance(node, exp.In):
            terms = [pc.equal(*self._operands(node.this, v, scope)) for v in node.expressions]
            return _fold(pc.or_kleene, terms)
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                raise self.refuse("BETWEEN SYMMETRIC")
            return pc.and_kleene(pc.greater_equal(*self._operands(node.this, node.args["low"], scope)),
                                 pc.less_equal(*self._operands(node.this, node.args["high"], scope)))
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = node.expression
            if node.args.get("escape") or not (isinstance(pattern, exp.Literal) and pattern.is_string) \
                    or "\\" in pattern.this:
                raise self.refuse(f"{key} (LIKE takes a constant pattern without escapes)")
            e = pc.match_like(self._expr(node.this, scope), pattern.this,
                              ignore_case=isinstance(node, exp.ILike))
            return pc.invert(e) if node.args.get("negate") else e
        if isinstance(node, exp.Case):
            return self.case(node, scope)
        if isinstance(node, exp.Coalesce):
            return pc.coalesce(*[self._expr(a, scope) for a in [node.this, *node.expressions]])
        if isinstance(node, exp.Upper):
            return pc.utf8_upper(self._expr(node.this, scope))
        if isinstance(node, exp.Lower):
            return pc.utf8_lower(self._expr(node.this, scope))
        if isinstance(node, exp.Length):
            return pc.utf8_length(self._expr(node.this, scope)).cast(pa.int64())
        if isinstance(node, exp.Abs):
            return pc.abs_checked(self._expr(node.this, scope))
        when = self.temporal(node, scope, key)
        if when is not None:
            return when
        text = self.function(node, scope, key)
        if text is not None:
            return text
        number = self.numeric(node, scope, key)
        if number is not None:
            return number
        if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
            return self.cast(node, scope)
        if isinstance(node, exp.Func):
            raise self.refuse(f"function {key}")
        raise self.refuse(f"expression {key}")

    def temporal(self, node: exp.Expression, scope: Scope, key: str) -> pc.Expression | None:
        """Times and dates: ``TIMESTAMP '...'``, ``DATE '...'`` and ``TIMESTAMPTZ '...'``
        literals, ``INTERVAL`` of fixed length, ``CAST`` between dates and timestamps,
        ``date_trunc``, ``extract`` and its functions (``year(x)``...), ``epoch(x)``; None
        for anything else. As DuckDB computes them in UTC (its session's time zone here): a
        zoned column of another zone is refused."""
        if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
            to = node.args["to"].this
            text = node.this.this
            try:
                if to == exp.DataType.Type.DATE:
                    return pc.scalar(pa.scalar(datetime.date.fromisoformat(text), pa.date32()))
                if to in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ):
                    value = datetime.datetime.fromisoformat(text)
                    if value.tzinfo is None:
                        return pc.scalar(pa.scalar(value, pa.timestamp("us")))
                if to == exp.DataType.Type.TIMESTAMPTZ:
                    value = datetime.datetime.fromisoformat(text)
                    if value.tzinfo is None:
                        value = value.replace(tzinfo=datetime.UTC)
                    return pc.scalar(pa.scalar(value.astimezone(datetime.UTC),
                                               pa.timestamp("us", "UTC")))
            except ValueError:
                raise self.refuse(f"{key} (a time written other than in ISO 8601)") from None
            return None
        if isinstance(node, exp.Interval):
            return pc.scalar(pa.scalar(self.interval(node, key), pa.duration("us")))
        if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
            to = node.args["to"]
            target = {exp.DataType.Type.DATE: pa.date32(),
                      exp.DataType.Type.TIMESTAMP: pa.timestamp("us"),
                      exp.DataType.Type.TIMESTAMPNTZ: pa.timestamp("us")}.get(to.this)
            if target is None:
                return None
            x = self.zoned(node.this, scope, key)
            have = self.typed(x, scope, node.this)
            if not _when(have) or to.expressions:
                raise self.refuse(f"{key} (CAST to a date or time from a date or time)")
            return x.cast(target)
        if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
            given = node.args.get("unit")
            unit = (given.name if isinstance(given, exp.Expression) else str(given or "")).lower()
            floor = _FLOOR.get(unit.rstrip("s"))
            if floor is None:
                raise self.refuse(f"{key} (date_trunc to {unit!r})")
            x = self.zoned(node.this, scope, key)
            if pa.types.is_date(self.typed(x, scope, node.this)):  # DuckDB: a timestamp
                x = x.cast(pa.timestamp("us"))
            return pc.floor_temporal(x, unit=floor)
        if isinstance(node, exp.DateBin):  # time_bucket(INTERVAL, x)
            width = node.this
            if not isinstance(width, exp.Interval) or len(node.expressions) or node.args.get("zone"):
                raise self.refuse(f"{key} (time_bucket of an INTERVAL and a time, no origin)")
            micros = round(self.interval(width, key).total_seconds() * 1e6)
            day, week = 86_400 * 10**6, 7 * 86_400 * 10**6
            # DuckDB counts buckets from 2000-01-03 (a Monday), Arrow's floor from 1970-01-01:
            # the same buckets where the width divides a day, or is a week (Mondays both)
            if micros <= 0 or (day % micros and micros != week):
                raise self.refuse(f"{key} (time_bucket of a width that divides a day, or of a "
                                  f"week)")
            x = self.zoned(node.expression, scope, key)
            if micros == week:
                return pc.floor_temporal(x, unit="week", week_starts_monday=True)
            if pa.types.is_date(self.typed(x, scope, node.expression)):
                return x  # a date's bucket of at most a day is its date (DuckDB's: a DATE)
            unit, size = next((u, n) for u, n in _BUCKET_UNITS if micros % n == 0)
            return pc.floor_temporal(x, multiple=micros // size, unit=unit)  # an int32
        part: str | None = None
        if isinstance(node, exp.Extract):
            part = node.this.name.lower()
            arg = node.expression
        elif type(node) in _PARTS:
            part, arg = _PARTS[type(node)], node.this
        elif isinstance(node, exp.TimeToUnix):
            part, arg = "epoch", node.this
        if part is None:
            return None
        x = self.zoned(arg, scope, key)
        have = self.typed(x, scope, arg)
        if not _when(have):
            raise self.refuse(f"{key} (of a {have}: a date or time is expected)")
        if part == "epoch":  # seconds, as a double
            if pa.types.is_date(have):
                x, have = x.cast(pa.timestamp("us")), pa.timestamp("us")
            per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[have.unit]
            return pc.divide(x.cast(pa.int64()).cast(pa.float64()), pc.scalar(float(per_second)))
        get = _EXTRACT.get(part)
        if get is None or (pa.types.is_date(have) and part in _TIME_OF_DAY):
            raise self.refuse(f"{key} (extract of {part!r})")
        return get(x)

    def function(self, node: exp.Expression, scope: Scope, key: str) -> pc.Expression | None:
        """``NULLIF``, ``GREATEST``/``LEAST``, ``starts_with``/``ends_with``/``contains`` and
        ``replace`` of constant strings, ``trim``/``ltrim``/``rtrim``, ``concat``,
        ``left``/``right`` of a constant length, ``floor``/``ceil``, as DuckDB computes them;
        None for another node."""
        if isinstance(node, exp.Nullif):
            a = self._expr(node.this, scope)
            null = pc.scalar(pa.scalar(None, self.typed(a, scope, node.this)))
            same = pc.coalesce(pc.equal(*self._operands(node.this, node.expression, scope)),
                               pc.scalar(False))
            return pc.if_else(same, null, a)
        if isinstance(node, (exp.Greatest, exp.Least)):  # nulls skipped, as DuckDB's
            nodes = [node.this, *node.expressions]
            args = [x for x, a in ((self._expr(a, scope), a) for a in nodes)
                    if not pa.types.is_null(self.typed(x, scope, a))]  # a NULL: skipped
            if not args:
                return pc.scalar(None)
            pick = pc.max_element_wise if isinstance(node, exp.Greatest) else pc.min_element_wise
            return pick(*args, skip_nulls=True)
        if isinstance(node, (exp.StartsWith, exp.EndsWith, exp.Contains)):
            pattern = _string_literal(node.expression)
            if pattern is None:
                raise self.refuse(f"{key} (of a constant string)")
            x = self._expr(node.this, scope)
            if isinstance(node, exp.StartsWith):
                return pc.starts_with(x, pattern)
            if isinstance(node, exp.EndsWith):
                return pc.ends_with(x, pattern)
            return pc.match_substring(x, pattern)
        if isinstance(node, exp.Replace):
            old, new = _string_literal(node.expression), _string_literal(node.args.get("replacement"))
            if not old or new is None:  # DuckDB's replace of '' leaves the string
                raise self.refuse(f"{key} (of constant, non-empty strings)")
            return pc.replace_substring(self._expr(node.this, scope), old, new)
        if isinstance(node, exp.Trim):
            chars = " " if node.expression is None else _string_literal(node.expression)
            if chars is None or node.args.get("collation"):
                raise self.refuse(f"{key} (of constant characters)")
            where = str(node.args.get("position") or "BOTH").upper()
            trim = {"LEADING": pc.utf8_ltrim, "TRAILING": pc.utf8_rtrim}.get(where, pc.utf8_trim)
            if not chars:
                return self._expr(node.this, scope)
            return trim(self._expr(node.this, scope), chars)
        if isinstance(node, exp.Concat):  # nulls as empty strings, integers as their digits
            parts = []
            for a in node.expressions:
                x = self._expr(a, scope)
                t = self.typed(x, scope, a)
                if pa.types.is_integer(t):
                    x = x.cast(pa.string())
                elif not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
                    raise self.refuse(f"{key} (of strings and integers)")
                parts.append(x.cast(pa.string()))
            return pc.binary_join_element_wise(*parts, "", null_handling="replace",
                                               null_replacement="")
        if isinstance(node, (exp.Left, exp.Right)):
            n = _int_literal(node.expression)
            if n is None:
                raise self.refuse(f"{key} (of a constant length)")
            x = self._expr(node.this, scope)
            if n == 0:
                return pc.if_else(pc.is_null(x), x, pc.scalar(""))
            if isinstance(node, exp.Left):
                return pc.utf8_slice_codeunits(x, 0, n)
            return pc.utf8_slice_codeunits(x, -n)
        if isinstance(node, exp.Substring):
            return self.substring(node, scope, key)
        if isinstance(node, (exp.Floor, exp.Ceil)):
            if node.args.get("decimals") is not None or node.args.get("to") is not None:
                raise self.refuse(f"{key} (of one argument)")
            x = self._expr(node.this, scope)
            t = self.typed(x, scope, node.this)
            if pa.types.is_integer(t):
                x = x.cast(pa.float64())  # DuckDB's floor of an integer is a DOUBLE
            elif not pa.types.is_floating(t):
                raise self.refuse(f"{key} (of a {t}: an integer or a float)")
            return pc.floor(x) if isinstance(node, exp.Floor) else pc.ceil(x)
        return None

    def substring(self, node: exp.Substring, scope: Scope, key: str) -> pc.Expression:
        """``substr(s, start[, length])`` of constant integers, as DuckDB counts: from 1 (0 is
        the place before the first character), a negative start from the end, a negative
        length the characters before the start; code points, not bytes."""
        start, length = _int_literal(node.args.get("start")), node.args.get("length")
        n = None if length is None else _int_literal(length)
        if start is None or (length is not None and n is None) or abs(start) > _SUBSTR_MAX \
                or (n is not None and abs(n) > _SUBSTR_MAX):
            raise self.refuse(f"{key} (of a constant start and length, each within "
                              f"{_SUBSTR_MAX:,})")
        x = self._expr(node.this, scope)
        t = self.typed(x, scope, node.this)
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise self.refuse(f"{key} (of a {t}: a string)")
        # pyarrow's slice: a negative place counts from the end, both are clamped to the string
        empty = pc.if_else(pc.is_null(x), x, pc.scalar(""))
        if n == 0 or (start == 0 and n is not None and n <= 1):
            return empty
        if start >= 0:  # the first character is 1; 0, the place before it, takes one less
            lo = max(start - 1, 0)
            n = None if n is None else n - 1 if start == 0 else n
            if n is None:
                return pc.utf8_slice_codeunits(x, lo, _SUBSTR_END)
            if n > 0:
                return pc.utf8_slice_codeunits(x, lo, lo + n)
            return pc.utf8_slice_codeunits(x, max(lo + n, 0), lo) if lo > 0 else empty
        if n is None:  # from the end
            return pc.utf8_slice_codeunits(x, start, _SUBSTR_END)
        if n > 0:
            return pc.utf8_slice_codeunits(x, start, start + n if start + n < 0 else _SUBSTR_END)
        return pc.utf8_slice_codeunits(x, start + n, start)

    def numeric(self, node: exp.Expression, scope: Scope, key: str) -> pc.Expression | None:
        """``round(x[, n])`` of a constant ``n``, ``trunc``, ``sign``, ``%`` and ``//``, as
        DuckDB computes them; None for another node."""
        if isinstance(node, exp.Round):
            return self.round(node, scope, key)
        if isinstance(node, (exp.Mod, exp.IntDiv)):
            sub = self._operands(node.this, node.expression, scope)
            types = [self.typed(x, scope, node) for x in sub]
            if not all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in types):
                raise self.refuse(f"{key} (of integers and floats)")
            # DuckDB's // divides floats as /, and integers truncating, as pyarrow's divide
            return pc.remainder(*sub) if isinstance(node, exp.Mod) else pc.divide(*sub)
        if isinstance(node, (exp.Trunc, exp.Sign)):
            if node.args.get("decimals") is not None:
                raise self.refuse(f"{key} (of one argument)")
            x = self._expr(node.this, scope)
            t = self.typed(x, scope, node.this)
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                raise self.refuse(f"{key} (of a {t}: an integer or a float)")
            if isinstance(node, exp.Trunc):
                return x if pa.types.is_integer(t) else pc.trunc(x)
            sign = pc.sign(x)
            if pa.types.is_floating(t):  # DuckDB's sign of NaN is 0
                sign = pc.if_else(pc.is_nan(x), pc.scalar(pa.scalar(0, t)), sign)
            return sign.cast(pa.int8())
        return None

    def round(self, node: exp.Round, scope: Scope, key: str) -> pc.Expression:
        """DuckDB's ``round``: half away from zero; a float's as ``round(x * 10^n) / 10^n`` in
        double (``x`` itself where that is not finite, or 0 for a negative ``n`` and a finite
        ``x``); a decimal's to
        ``DECIMAL(width, max(n, 0))``; an integer's to a multiple of ``10^-n``."""
        decimals = node.args.get("decimals")
        n = 0 if decimals is None else _int_literal(decimals)
        if n is None or abs(n) > _ROUND_MAX:
            raise self.refuse(f"{key} (to a constant number of digits, within {_ROUND_MAX})")
        x = self._expr(node.this, scope)
        t = self.typed(x, scope, node.this)
        half = "half_towards_infinity"  # away from zero, as C's round
        if pa.types.is_integer(t):
            if n >= 0:
                return x
            top = 2 ** (t.bit_width - pa.types.is_signed_integer(t)) - 1
            if 10 ** -n <= top:
                return pc.round(x, ndigits=n, round_mode=half)
            if 10 ** -n // 2 <= top:  # an int64 to 19 digits: DuckDB's may overflow
                raise self.refuse(f"{key} (an {t} to {-n} digits left of its point)")
            return pc.if_else(pc.is_null(x), x, pc.scalar(pa.scalar(0, t)))  # every value rounds to 0
        if pa.types.is_decimal(t):
            if n >= t.scale:
                return x
            if n < 0 and -n > t.precision - t.scale:  # DuckDB's: no digit left
                return pc.if_else(pc.is_null(x), pc.scalar(pa.scalar(None, pa.decimal128(t.precision, 0))),
                                  pc.scalar(pa.scalar(0, pa.decimal128(t.precision, 0))))
            wide = x.cast(pa.decimal128(t.precision + 1, t.scale)) if t.precision < 38 else x
            return pc.round(wide, ndigits=n, round_mode=half).cast(
                pa.decimal128(t.precision, max(n, 0)))
        if not pa.types.is_floating(t):
            raise self.refuse(f"{key} (of a {t}: a number)")
        if decimals is None:
            return pc.round(x, ndigits=0, round_mode=half)
        f = x if t == pa.float64() else x.cast(pa.float64())
        scale = pc.scalar(math.inf if abs(n) > 308 else 10.0 ** abs(n))  # C's pow(10, n)
        if n >= 0:
            r = pc.divide(pc.round(pc.multiply(f, scale), ndigits=0, round_mode=half), scale)
            r = pc.if_else(pc.is_finite(r), r, f)
        else:
            r = pc.multiply(pc.round(pc.divide(f, scale), ndigits=0, round_mode=half), scale)
            r = pc.if_else(pc.is_finite(r), r, pc.if_else(pc.is_finite(f), pc.scalar(0.0), f))
        return r if t == pa.float64() else r.cast(t)

    def zoned(self, node: exp.Expression, scope: Scope, key: str) -> pc.Expression:
        """``node``'s value, refused if it is zoned in another zone than UTC (DuckDB's
        session zone, in which it reads the parts of a zoned time)."""
        x = self._expr(node, scope)
        t = self.typed(x, scope, node)
        if pa.types.is_timestamp(t) and t.tz is not None and t.tz not in _UTC:
            raise self.refuse(f"{key} (a time zoned in {t.tz}; DuckDB reads it in UTC)")
        return x

    def interval(self, node: exp.Interval, key: str) -> datetime.timedelta:
        """An ``INTERVAL`` of fixed length (weeks down to microseconds) as a timedelta."""
        text = node.this.name if isinstance(node.this, exp.Expression) else str(node.this)
        unit = node.args.get("unit")
        words = f"{text} {unit.name if isinstance(unit, exp.Expression) else unit or ''}".split()
        if not words or len(words) % 2:
            raise self.refuse(f"{key} (an interval of numbers and units)")
        total = datetime.timedelta()
        for number, name in zip(words[::2], words[1::2], strict=True):
            seconds = _INTERVAL_SECONDS.get(name.lower().rstrip("s"))
            try:
                amount = float(number)
            except ValueError:
                amount = float("nan")
            if seconds is None or amount != amount:
                raise self.refuse(f"{key} (an interval of fixed length: weeks, days, hours, "
                                  f"minutes, seconds, milliseconds, microseconds)")
            total += datetime.timedelta(seconds=amount * seconds)
        return total

    def case(self, node: exp.Case, scope: Scope) -> pc.Expression:
        operand = node.this
        x = self._expr(operand, scope) if operand is not None else None
        default = node.args.get("default")
        acc = self._expr(default, scope) if default is not None else pc.scalar(None)
        for branch in reversed(node.args.get("ifs") or []):
            cond = self._expr(branch.this, scope)
            if x is not None:
                cond = pc.equal(x, cond)
            acc = pc.if_else(pc.coalesce(cond, pc.scalar(False)), self._expr(branch.args["true"], scope), acc)
        return acc

    def cast(self, node: exp.Cast, scope: Scope) -> pc.Expression:
        to = node.args["to"]
        target = _CAST.get(to.this) if isinstance(to, exp.DataType) else None
        if target is None or to.expressions:
            raise self.refuse(f"{node.sql(dialect=DIALECT)} (CAST to {to.sql(dialect=DIALECT)})")
        x = self._expr(node.this, scope)
        have = self.typed(x, scope, node.this)
        if pa.types.is_floating(have) and pa.types.is_string(target):
            raise self.refuse(f"{node.sql(dialect=DIALECT)} (floats print differently)")
        if pa.types.is_floating(have) and pa.types.is_integer(target):
            x = pc.round(x, round_mode="half_to_even")  # DuckDB rounds, pyarrow would truncate
        return x.cast(target)

    def column(self, node: exp.Column, scope: Scope) -> pc.Expression:
        if node.args.get("db") or node.args.get("catalog"):
            raise self.refuse(f"column {node.sql(dialect=DIALECT)}")
        hits = scope.rel.find(node)
        c = self.one(hits, node.sql(dialect=DIALECT), scope.rel, scope.clause)
        if scope.groups is not None:
            if c.internal not in scope.groups:
                raise self.error(f"column {node.sql(dialect=DIALECT)!r} must appear in the GROUP BY "
                                 f"clause or be used in an aggregate function")
            return pc.field(scope.groups[c.internal])
        return pc.field(c.internal)


def _fold(op: Callable[[pc.Expression, pc.Expression], pc.Expression],
          terms: Sequence[pc.Expression]) -> pc.Expression:
    acc = terms[0]
    for t in terms[1:]:
        acc = op(acc, t)
    return acc

