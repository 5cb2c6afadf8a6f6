"""Live SQL views: a ``SELECT`` compiled to the engine's incremental operations.

:func:`compile_view` maps each clause to an operation of :class:`engine.table.Table`, so
the view is a derived table like any other, kept current one cycle at a time; what does
not map is a :class:`~engine.errors.SqlError` naming the clause, never a result computed
once (DESIGN.md §10). Its oracle: at every step the view equals DuckDB's answer to the
same SQL over the same rows (``tests/flight/sql/test_view_oracle.py``).

==========================  ===================================================================
SQL                         operation
==========================  ===================================================================
``FROM t AS a``             the live table ``t``; ``WITH`` names and ``FROM (SELECT ...) s``
                            are compiled in place
``[INNER] JOIN ... ON``     ``join`` (many-to-many, null keys never match), on equalities of
``a.k = b.k [AND ...]``     columns; ``USING (k)`` likewise, one ``k`` for ``*``
``LEFT [OUTER] JOIN``       ``left_outer_join``
``WHERE``                   ``where`` (three-valued logic; null is false)
``SELECT`` expressions      ``view`` (computed on read)
``GROUP BY`` + aggregates   ``agg_by``: ``count(*)`` count, ``count(x)`` sum of ``x IS NOT
                            NULL``, ``sum`` (null over no values: integers read the mean,
                            which shares its state; floats a count of non-null values, as the
                            mean skips NaN), ``min``/``max`` (fixed-width types), ``avg``/
                            ``mean``, ``stddev``/``stddev_samp``, ``variance``/``var_samp``,
                            ``median``, ``quantile_cont(x, p)``, ``count(DISTINCT x)``. Of a
                            decimal of up to 18 digits: ``sum``/``min``/``max`` exactly, over
                            its unscaled int64, in DuckDB's decimal types; ``avg``, ``stddev``
                            and ``variance`` as doubles (DuckDB's); not ``median``/quantiles
global aggregate            ``agg_by`` with no key, natural-joined onto a one-row static table
                            so that an empty input gives SQL's one row (``count`` 0, others null)
``HAVING``                  ``where`` on the aggregated table
``DISTINCT``                ``agg_by`` with no aggregation, keyed by every output column
``UNION ALL`` / ``UNION``   ``merge`` (then ``DISTINCT``)
``ORDER BY``                ``sort`` on each key's null flag, then the key: nulls last unless
                            ``NULLS FIRST``, for ``ASC`` and ``DESC`` alike (DuckDB's default);
                            a key of a type the sort does not take (a decimal of more than
                            18 digits, a list) is refused by its text
``LIMIT n [OFFSET m]``      ``head(n)`` / ``slice(m, m + n)``, after an ``ORDER BY`` only
==========================  ===================================================================

Expressions: :mod:`flight.sql.expressions` compiles them (its docstring lists what maps).

Refused, with the clause named: ``RIGHT``/``FULL``/``CROSS``/``NATURAL``/``ASOF`` joins,
join conditions other than equalities of columns, window functions, subqueries in
expressions, ``LIMIT``/``OFFSET`` without ``ORDER BY`` (the rows it keeps are arbitrary),
``INTERSECT``/``EXCEPT``, ``DISTINCT ON``, ``GROUP BY ALL``, aggregates the engine does not
compute as SQL does (population variance, ``first``, ``sum(DISTINCT x)``, ``FILTER``),
``min``/``max`` of strings, ``SELECT`` without ``FROM``, ``//`` and ``%``.

The operations a view is built of are recorded (:attr:`CompiledView.operations`): a compile
that fails closes those it built, and :meth:`CompiledView.close` closes them all.

Names and types: output column names are DuckDB's own (``count_star()``, ``sum(x)``,
``(x + 1)``): the statement is described by DuckDB over empty tables of the sources'
schemas, which also checks it the way the query engine would; the statement's last
projection gives them (one ``view`` renames, casts and computes the SELECT list; none where
the columns are so already). Integer, float, string and boolean outputs take DuckDB's
types; where DuckDB answers in a type the engine does not compute, the view keeps the
engine's: ``sum`` of integers is int64 (DuckDB: HUGEINT,
``decimal128(38, 0)`` in Arrow; the engine's wraps on overflow), a decimal literal
(``1.5``) is float64 (DuckDB: DECIMAL) unless beside a decimal column, where a number
literal is a decimal of its own digits (``px * 1.5`` and ``px > 1`` over a
``DECIMAL(10, 2)``: Arrow's results, whose precision may differ from DuckDB's, of equal
values).

Known differences (no clause to refuse; they depend on the data): the engine's
aggregates skip NaN, where DuckDB's ``sum``/``avg``/``max`` give NaN and its ``median``
sorts NaN last; ``count(DISTINCT x)`` does not count NaN.
"""

from __future__ import annotations

import decimal
import itertools
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from engine.errors import SqlError
from engine.expr import bind
from engine.graph import UpdateGraph
from engine.ops.aggregate.spec import Agg
from engine.ops.snapshot import static_table
from engine.ops.sort import SORTABLE, sortable
from flight.sql.expressions import Col, Expressions, Rel, Scope, is_agg, type_of
from flight.sql.parse import DIALECT, parse_condition, parse_one, tables_of

if TYPE_CHECKING:
    import duckdb

    from engine.table import Table

__all__ = ["CompiledView", "compile_condition", "compile_view"]


@dataclass(frozen=True, slots=True)
class CompiledView:
    """A compiled ``SELECT``: the live result and the tables it reads.

    Attributes
    ----------
    table
        The view: a derived table that follows its sources every cycle.
    parents
        The names of the tables the statement reads, in order of appearance.
    operations
        Every table the compile built, ``table`` last; :meth:`close` closes them.
    """

    table: Table
    parents: list[str]
    operations: tuple[Table, ...] = ()

    def close(self) -> None:
        """Close the view and every operation it was built of (``DROP VIEW``).

        Closing :attr:`table` alone would leave the operations it reads from updating.
        """
        for t in reversed(self.operations):
            t.close()


def compile_view(select: exp.Expression | str, table: Callable[[str], Table], *,
                 name: str | None = None) -> CompiledView:
    """Compile a ``SELECT`` to the engine's incremental operations (module docstring).

    Parameters
    ----------
    select
        The query: SQL text (DuckDB's dialect) or a parsed statement.
    table
        Looks up a live table by name; raises :class:`~engine.errors.TableNotFound` for an
        unknown one, which passes through.
    name
        The view's name, for messages (``CREATE VIEW v: ...``) and the result table.

    Returns
    -------
    CompiledView
        The live result, whose column names are DuckDB's for the same query, and the
        names of the tables it reads.

    Raises
    ------
    SqlError
        If the text does not parse, is not a query, or holds a clause that does not map
        to an incremental operation (the message names it), an unknown or ambiguous
        column (the message names the columns there are), or a statement DuckDB refuses.
    TableNotFound
        If a table it reads does not exist.

    Examples
    --------
    >>> v = compile_view("SELECT Sym, sum(Qty) FROM trades GROUP BY Sym", tables.__getitem__)
    >>> v.table.column_names, v.parents
    (['Sym', 'sum(Qty)'], ['trades'])
    """
    statement = parse_one(select) if isinstance(select, str) else select
    prefix = f"CREATE VIEW {name}" if name else "CREATE VIEW"
    if not isinstance(statement, exp.Query):
        raise SqlError(f"{prefix}: a view is a query (SELECT ...), not {statement.key.upper()}")
    parents = tables_of(statement)
    ctes = {c.alias_or_name for c in statement.find_all(exp.CTE)}
    sources = {n: table(n) for n in parents if n not in ctes}  # TableNotFound passes through
    if not sources:
        raise SqlError(f"{prefix}: SELECT without FROM does not map to an incremental operation")
    text = select if isinstance(select, str) else statement.sql(dialect=DIALECT)
    compiler = _Compiler(sources, prefix)
    try:
        # DuckDB's names and types, which the statement's last projection gives its columns;
        # DuckDB's refusal is raised after the compiler's own (which name the clause)
        duck: _Output | None = None
        refused: SqlError | None = None
        try:
            duck = _duckdb_schema(text, sources, prefix)
        except SqlError as exc:
            refused = exc
        out, names = compiler.query(statement, duck)
        if refused is not None:
            raise refused
        assert duck is not None
        result = compiler.finish(out, names, duck, name)
    except BaseException:
        # an operation built before the failure must not keep updating unseen
        for t in reversed(compiler.created):
            t.close()
        raise
    return CompiledView(result, parents, tuple(compiler.created))


def compile_condition(text: str, schema: pa.Schema, *, table: str, prefix: str) -> pc.Expression:
    """Compile a SQL condition (what may follow ``WHERE``) over one table's columns to a
    boolean ``pyarrow.compute`` expression, as a view's ``WHERE`` is compiled (the
    expressions of the module docstring; a null result is false where it filters).

    Parameters
    ----------
    text
        The condition, e.g. ``px > 100 AND sym IN ('A', 'B')``.
    schema
        The table's columns (named as DuckDB names them: case-insensitively when no
        column has the exact name).
    table
        The table's name.
    prefix
        What every message starts with (who asked: ``mirror 'big' of URI/trades: filter``).

    Raises
    ------
    SqlError
        If the text does not parse, names a column ``schema`` does not have (the message
        lists those it has), holds an expression that does not map, or is not boolean.

    Examples
    --------
    >>> compile_condition("px > 100", pa.schema([("px", pa.float64())]), table="t",
    ...                   prefix="filter")
    <pyarrow.compute.Expression (px > 100)>
    """
    try:
        node = parse_condition(text)
    except SqlError as exc:
        raise SqlError(f"{prefix}: {exc}") from exc
    # the compiler reads columns from a table: an empty one that never updates, on a graph
    # of its own (nothing runs it)
    empty = static_table(UpdateGraph(), schema.empty_table(), name=table)
    rel = Rel(empty, [Col(None, f.name, f.name) for f in schema])
    return _Compiler({table: empty}, prefix).predicate(node, Scope(rel, "condition"))


# what DuckDB says the output is -----------------------------------------------------------------
_DUCK_TYPES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(), "BIGINT": pa.int64(), "UTINYINT": pa.uint8(),
    "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
    "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
}


def _duck_type(text: str) -> pa.DataType | None:
    """The Arrow type of a DuckDB type the engine computes (``DECIMAL(p, s)`` too), or None."""
    m = _DECIMAL.fullmatch(text.upper().replace(" ", ""))
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return _DUCK_TYPES.get(text.upper())


_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")


#: the statement's output as DuckDB describes it: names, and types where the engine has them
_Output = list[tuple[str, pa.DataType | None]]


_binder: list[duckdb.DuckDBPyConnection] = []  # the one database views are bound in
_binder_lock = threading.Lock()


def _duckdb_schema(text: str, sources: dict[str, Table], prefix: str) -> _Output:
    """DuckDB's output names and (where the engine computes it) types for the query.

    DuckDB binds the statement over empty tables of the sources' schemas; nothing runs.
    It binds in a database locked as the queries' is (:func:`~flight.sql.query.locked_database`):
    a table function's binding reads its file or URL (``read_csv`` samples it), which a
    statement the compiler refuses afterwards must not have done. One database for the
    process, a cursor of its own per statement (a new database costs milliseconds).
    """
    import duckdb  # the query engine of flight.sql; only views and queries need it

    from flight.sql.query import locked_database

    with _binder_lock:
        if not _binder:
            _binder.append(locked_database(threads=1, memory_limit="256MB"))
        con = _binder[0].cursor()
    try:
        for n, t in sources.items():
            con.register(n, t.schema.empty_table())
        rel = con.sql(text)
        return [(c, _duck_type(str(ty))) for c, ty in zip(rel.columns, rel.types, strict=True)]
    except duckdb.Error as exc:
        raise SqlError(f"{prefix}: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()


def _fresh(base: str, taken: Iterable[str]) -> str:
    """``base``, or ``base_2``, ``base_3``... whichever is not in ``taken``."""
    used = set(taken)
    if base not in used:
        return base
    return next(f"{base}_{i}" for i in itertools.count(2) if f"{base}_{i}" not in used)


#: ``sum``/``min``/``max`` of a decimal of up to this many digits run over its unscaled int64
_UNIT_DIGITS = 18


class _Compiler(Expressions):
    """Compiles one statement; the methods build engine tables as they go."""

    def __init__(self, sources: dict[str, Table], prefix: str) -> None:
        self.sources = sources
        self.prefix = prefix
        self.ctes: dict[str, tuple[Table, list[str]]] = {}
        #: every table the compile built, in order (closed if it fails, or with the view)
        self.created: list[Table] = []

    def made(self, table: Table) -> Table:
        """Record ``table`` as built by this compile; return it."""
        self.created.append(table)
        return table

    # queries ------------------------------------------------------------------------------------
    def query(self, node: exp.Expression, final: _Output | None = None) -> tuple[Table, list[str]]:
        """The table of ``node``'s rows and its output column names (no hidden columns).

        ``final``: the statement's output (DuckDB's names and types) when ``node`` is the
        statement, for its last projection to give (:meth:`projection`)."""
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise self.refuse("WITH RECURSIVE")
            for cte in with_.expressions:
                self.ctes[cte.alias_or_name] = self.query(cte.this)
        if isinstance(node, exp.Subquery):
            return self.query(node.this, final)
        if isinstance(node, exp.Union):
            return self.union(node, final)
        if isinstance(node, (exp.Intersect, exp.Except)):
            raise self.refuse(node.key.upper())
        if isinstance(node, exp.Select):
            return self.select(node, final)
        raise self.refuse(f"{node.key.upper()} {node.sql(dialect=DIALECT)}")

    def union(self, node: exp.Union, final: _Output | None) -> tuple[Table, list[str]]:
        if node.args.get("by_name") or node.args.get("side") or node.args.get("kind"):
            raise self.refuse("UNION BY NAME")
        left, names = self.query(node.this)
        right, rnames = self.query(node.expression)
        if len(names) != len(rnames):
            raise self.error(f"UNION sides have {len(names)} and {len(rnames)} columns")
        lexprs: dict[str, pc.Expression] = {}
        rexprs: dict[str, pc.Expression] = {}
        for n, rn in zip(names, rnames, strict=True):
            lt, rt = left.schema.field(n).type, right.schema.field(rn).type
            common = self.common_type(lt, rt, f"UNION column {n!r}")
            lexprs[n] = pc.field(n) if lt == common else pc.field(n).cast(common)
            rexprs[n] = pc.field(rn) if rt == common else pc.field(rn).cast(common)
        merged = self.made(self.made(left.view(**lexprs)).merge(self.made(right.view(**rexprs))))
        if node.args.get("distinct"):
            merged = self.made(merged.agg_by([], by=names))
        return self.order_limit(merged, names, node, final)

    def common_type(self, a: pa.DataType, b: pa.DataType, what: str) -> pa.DataType:
        if a == b:
            return a
        if pa.types.is_null(a):
            return b
        if pa.types.is_null(b):
            return a
        if pa.types.is_integer(a) and pa.types.is_integer(b):
            return a if a.bit_width >= b.bit_width else b
        if (pa.types.is_integer(a) or pa.types.is_floating(a)) and (
                pa.types.is_integer(b) or pa.types.is_floating(b)):
            return pa.float64()
        raise self.error(f"{what} is {a} on one side and {b} on the other; CAST one of them")

    def select(self, node: exp.Select, final: _Output | None) -> tuple[Table, list[str]]:
        allowed = {"expressions", "from_", "joins", "where", "group", "having", "order", "limit",
                   "offset", "distinct", "with_", "kind"}
        for key, value in node.args.items():
            if value and key not in allowed:
                raise self.refuse(f"{key.upper().rstrip('_')} clause")
        if node.args.get("kind"):
            raise self.refuse(f"SELECT {node.args['kind']}")
        distinct = node.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise self.refuse("DISTINCT ON")
        for key in ("expressions", "where", "group", "having", "order"):
            for part in node.args.get(key) or [] if key == "expressions" else [node.args.get(key)]:
                if part is None:
                    continue
                sub = part.find(exp.Subquery, exp.Exists)
                if sub is not None or any(i.args.get("query") for i in part.find_all(exp.In)):
                    what = (sub or part).sql(dialect=DIALECT)
                    raise self.refuse(f"subquery in an expression ({what})")
        from_ = node.args.get("from_")
        if from_ is None:
            raise self.refuse("SELECT without FROM")
        rel = self.from_item(from_.this)
        for j in node.args.get("joins") or []:
            rel = self.join(rel, j)
        where = node.args.get("where")
        if where is not None:
            scope = Scope(rel, "WHERE")
            rel = Rel(self.made(rel.table.where(self.predicate(where.this, scope))), rel.cols)
        items = self.items(node.expressions, rel)
        group = node.args.get("group")
        having = node.args.get("having")
        order = node.args.get("order")
        orders = list(order.expressions) if order is not None else []
        grouped = group is not None or having is not None or any(
            is_agg(n) for e in [x for _, x in items] + orders for n in e.walk()
            if isinstance(n, exp.Expression) and not n.find_ancestor(exp.Window))
        if grouped:
            scope = self.aggregate(rel, group, items, having, orders)
        else:
            scope = Scope(rel, "SELECT")
        return self.project(scope, items, orders, node, distinct is not None, final)

    def items(self, expressions: list[exp.Expression], rel: Rel
              ) -> list[tuple[str, exp.Expression]]:
        """The SELECT list with ``*`` expanded: (output name, expression)."""
        out: list[tuple[str, exp.Expression]] = []
        for e in expressions:
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                star = e if isinstance(e, exp.Star) else e.this
                if any(star.args.get(k) for k in star.args):
                    raise self.refuse(f"{e.sql(dialect=DIALECT)}")
                q = e.table if isinstance(e, exp.Column) else ""
                cols = [c for c in rel.cols if (c.qualifier == q if q else not c.merged)]
                if q and not cols:
                    raise self.error(f"{e.sql(dialect=DIALECT)}: no table {q!r} in FROM")
                out += [(c.name, exp.column(c.name, table=c.qualifier)) for c in cols]
            elif isinstance(e, exp.Alias):
                out.append((e.alias, e.this))
            elif isinstance(e, exp.Column):
                out.append((e.name, e))
            else:
                out.append((e.sql(dialect=DIALECT), e))
        return out

    # FROM and JOIN ------------------------------------------------------------------------------
    def from_item(self, node: exp.Expression) -> Rel:
        if isinstance(node, exp.Table):
            extra = [k for k, v in node.args.items() if v and k not in ("this", "db", "catalog", "alias")]
            if extra or not node.name:
                raise self.refuse(f"FROM {node.sql(dialect=DIALECT)}")
            full = ".".join(p.name for p in node.parts)
            alias = node.alias or node.name
            if full in self.ctes:
                t, names = self.ctes[full]
                return Rel(t, [Col(alias, n, n) for n in names])
            source = self.sources.get(full)
            if source is None:  # a WITH name read inside its own definition
                raise self.refuse(f"FROM {full} inside the WITH clause that defines {full}")
            return Rel(source, [Col(alias, n, n) for n in source.column_names])
        if isinstance(node, exp.Subquery):
            t, names = self.query(node.this)
            sub_alias = node.alias or None
            return Rel(t, [Col(sub_alias, n, n) for n in names])
        raise self.refuse(f"FROM {node.sql(dialect=DIALECT)}")

    def join(self, left: Rel, j: exp.Join) -> Rel:
        side = str(j.args.get("side") or "").upper()
        kind = str(j.args.get("kind") or "").upper()
        method = str(j.args.get("method") or "").upper()
        label = " ".join(x for x in (method, side, kind, "JOIN") if x)
        if method or side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER"):
            raise self.refuse(label)
        on, using = j.args.get("on"), j.args.get("using")
        if on is None and not using:
            raise self.refuse(f"{label} {j.this.sql(dialect=DIALECT)} without ON or USING "
                              f"(a cross join)")
        right = self.from_item(j.this)
        taken = set(left.table.column_names)
        renamed: dict[str, str] = {}
        for c in right.table.column_names:
            renamed[c] = _fresh(c, taken)
            taken.add(renamed[c])
        pairs: list[tuple[Col, Col]] = []
        merged: set[str] = set()
        if using:
            for ident in using:
                n = ident.name
                lc = self.one(left.find(exp.column(n)), n, left, "USING")
                rc = self.one(right.find(exp.column(n)), n, right, "USING")
                pairs.append((lc, rc))
                merged.add(rc.internal)
        elif on is not None:
            for term in self.conjuncts(on):
                pairs.append(self.equality(term, left, right))
        for lc, rc in pairs:
            lt = left.table.schema.field(lc.internal).type
            rt = right.table.schema.field(rc.internal).type
            same = lt == rt or (pa.types.is_integer(lt) and pa.types.is_integer(rt))
            if not same:
                raise self.error(f"join keys {lc.name} ({lt}) and {rc.name} ({rt}) have different "
                                 f"types; CAST one side in a subquery")
        on_spec = [f"{lc.internal}={rc.internal}" for lc, rc in pairs]
        joins = [f"{renamed[c]}={c}" for c in right.table.column_names]
        op = left.table.left_outer_join if side == "LEFT" else left.table.join
        table = self.made(op(right.table, on_spec, joins))
        cols = left.cols + [Col(c.qualifier, c.name, renamed[c.internal],
                                 c.merged or c.internal in merged) for c in right.cols]
        return Rel(table, cols)

    def conjuncts(self, node: exp.Expression) -> list[exp.Expression]:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.And):
            return self.conjuncts(node.this) + self.conjuncts(node.expression)
        return [node]

    def equality(self, term: exp.Expression, left: Rel, right: Rel) -> tuple[Col, Col]:
        text = term.sql(dialect=DIALECT)
        if not (isinstance(term, exp.EQ) and isinstance(term.this, exp.Column)
                and isinstance(term.expression, exp.Column)):
            raise self.refuse(f"join condition {text} (only equalities of columns join)")
        a, b = term.this, term.expression
        la, ra, lb, rb = left.find(a), right.find(a), left.find(b), right.find(b)
        if la and rb and not ra and not lb:
            return self.one(la, a.sql(), left, "ON"), self.one(rb, b.sql(), right, "ON")
        if lb and ra and not rb and not la:
            return self.one(lb, b.sql(), left, "ON"), self.one(ra, a.sql(), right, "ON")
        for c, hits in ((a, la + ra), (b, lb + rb)):
            if not hits:
                raise self.unknown(c, Rel(left.table, left.cols + right.cols))
        raise self.refuse(f"join condition {text} (each side must name a column of one side)")

    # GROUP BY -----------------------------------------------------------------------------------
    def aggregate(self, rel: Rel, group: exp.Group | None, items: list[tuple[str, exp.Expression]],
                  having: exp.Having | None, orders: list[exp.Expression]) -> Scope:
        """Build ``agg_by`` (and HAVING); the scope the SELECT list is compiled in after it."""
        base = Scope(rel, "GROUP BY")
        taken = set(rel.table.column_names)
        pre: dict[str, pc.Expression] = {}  # hidden inputs computed on the rows
        by: list[str] = []
        special: dict[str, pc.Expression] = {}
        groups: dict[str, str] = {}
        if group is not None:
            if group.args.get("all") or any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup")):
                raise self.refuse(f"{group.sql(dialect=DIALECT).strip()}")
            for g in group.expressions:
                g = self.select_item(g, items, rel) or g
                if isinstance(g, exp.Column):
                    c = self.one(rel.find(g), g.sql(dialect=DIALECT), rel, "GROUP BY")
                    if c.internal not in by:
                        by.append(c.internal)
                    groups[c.internal] = c.internal
                else:
                    hidden = _fresh("__sql_group", taken)
                    taken.add(hidden)
                    pre[hidden] = self.expr(g, base)
                    by.append(hidden)
                    special[g.sql(dialect=DIALECT)] = pc.field(hidden)
        aggs: list[Agg] = []
        post: dict[str, pc.Expression] = {}
        counts: set[str] = set()  # outputs that are 0, not null, for an empty input
        nodes = [n for _, e in items for n in e.find_all(exp.AggFunc, exp.Anonymous)]
        nodes += [n for e in ([having.this] if having is not None else []) + orders
                  for n in e.find_all(exp.AggFunc, exp.Anonymous)]
        for n in nodes:
            if not is_agg(n) or n.sql(dialect=DIALECT) in post:
                continue
            if n.find_ancestor(exp.Window):
                continue
            for inner in n.find_all(exp.AggFunc):
                if inner is not n:
                    raise self.error(f"aggregate {n.sql(dialect=DIALECT)} holds another aggregate")
            key = n.sql(dialect=DIALECT)

            def column(arg: exp.Expression, key: str = key) -> str:
                if isinstance(arg, exp.Column):
                    return self.one(rel.find(arg), arg.sql(dialect=DIALECT), rel, key).internal
                hidden = _fresh("__sql_arg", taken)
                taken.add(hidden)
                pre[hidden] = self.expr(arg, base)
                return hidden

            out = _fresh("__sql_agg", taken)
            taken.add(out)
            post[key] = self.agg(n, key, out, column, aggs, pre, taken, counts, rel)
        special.update(post)
        needed = list(dict.fromkeys(
            [c for c in by if c not in pre]
            + [c for a in aggs for c in (a.column, a.weight) if c is not None and c not in pre]))
        # agg_by reads plain columns from the relation itself; a computed view only for
        # the expressions the SQL has (it evaluates them for current and previous values)
        source = self.made(rel.table.view(*needed, **pre)) if pre else rel.table
        table = self.made(source.agg_by(aggs or [Agg("count", None, "__sql_n")], by=by))
        if not by:  # SQL's global aggregate has one row, also over no rows
            one = _fresh("__sql_one", taken)
            constant = self.made(static_table(table.graph, pa.table({one: pa.array([0], pa.int64())})))
            keyed = self.made(table.view(*table.column_names, **{one: pc.scalar(0)}))
            table = self.made(constant.natural_join(keyed, on=one, joins=table.column_names))
            for key, e in post.items():
                if key in counts:
                    special[key] = pc.coalesce(e, pc.scalar(0))
        scope = Scope(Rel(table, rel.cols), "SELECT", special, groups)
        if having is not None:
            scope.clause = "HAVING"
            table = self.made(table.where(self.predicate(having.this, scope)))
            scope = Scope(Rel(table, rel.cols), "SELECT", special, groups)
        return scope

    def agg(self, n: exp.Expr, key: str, out: str, column: Callable[[exp.Expression], str],
            aggs: list[Agg], pre: dict[str, pc.Expression], taken: set[str], counts: set[str],
            rel: Rel) -> pc.Expression:
        """Append the Agg(s) computing aggregate ``n`` to ``aggs``; its value over their outputs."""
        if isinstance(n, exp.Count):
            arg = n.this
            if isinstance(arg, exp.Star):
                aggs.append(Agg("count", None, out))
                counts.add(key)
                return pc.field(out)
            if isinstance(arg, exp.Distinct):
                if len(arg.expressions) != 1:
                    raise self.refuse(f"aggregate {key}")
                aggs.append(Agg("count_distinct", column(arg.expressions[0]), out))
                counts.add(key)
                return pc.field(out)
            nn = _fresh("__sql_valid", taken)
            taken.add(nn)
            pre[nn] = pc.is_valid(pc.field(column(arg))).cast(pa.int64())
            aggs.append(Agg("sum", nn, out))
            counts.add(key)
            return pc.field(out)
        if isinstance(n, exp.Anonymous):  # mean(x)
            if len(n.expressions) != 1:
                raise self.refuse(f"aggregate {key}")
            aggs.append(Agg("mean", column(n.expressions[0]), out))
            return pc.field(out)
        arg = n.this
        if isinstance(arg, exp.Distinct):
            raise self.refuse(f"aggregate {key} (DISTINCT inside an aggregate other than count)")
        kinds: dict[type[exp.Expr], str] = {
            exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "mean", exp.Stddev: "std",
            exp.StddevSamp: "std", exp.Variance: "var", exp.Median: "median",
            exp.PercentileCont: "percentile"}
        kind = kinds.get(type(n))
        if kind is None:
            why = " (population statistics)" if isinstance(n, (exp.StddevPop, exp.VariancePop)) else ""
            raise self.refuse(f"aggregate {key}{why}")
        col = column(arg)
        ctype = rel.table.schema.field(col).type if col in rel.table.schema.names else \
            type_of(pre[col], rel.table.schema)
        if pa.types.is_decimal(ctype):
            if kind in ("sum", "min", "max"):
                return self.decimal_agg(key, kind, col, ctype, out, aggs, pre, taken)
            if kind in ("median", "percentile"):
                raise self.refuse(f"aggregate {key} over {ctype} (DuckDB answers in the "
                                  f"column's decimal type, rounded)")
            double = _fresh("__sql_double", taken)  # DuckDB answers these as DOUBLE
            taken.add(double)
            pre[double] = pc.field(col).cast(pa.float64())
            col, ctype = double, pa.float64()
        if kind in ("min", "max") and not (pa.types.is_integer(ctype) or pa.types.is_floating(ctype)
                                           or pa.types.is_boolean(ctype) or pa.types.is_temporal(ctype)):
            raise self.refuse(f"aggregate {key} over {ctype} (the engine's min/max take "
                              f"fixed-width columns)")
        if kind == "percentile":
            p = n.expression
            if not (isinstance(p, exp.Literal) and not p.is_string):
                raise self.refuse(f"aggregate {key} (the quantile must be one number)")
            aggs.append(Agg("percentile", col, out, p=float(p.this)))
            return pc.field(out)
        aggs.append(Agg(kind, col, out))
        if kind != "sum":
            return pc.field(out)
        # the engine's sum of no values is 0; SQL's is null
        if not pa.types.is_floating(ctype):
            # the mean shares the sum's state, and is null exactly where there is no value
            mean = _fresh("__sql_mean", taken)
            taken.add(mean)
            aggs.append(Agg("mean", col, mean))
            return pc.if_else(pc.is_valid(pc.field(mean)), pc.field(out), pc.scalar(pa.scalar(None, pa.int64())))
        # floats: the mean skips NaN too (a group of NaN only would read null, not the
        # engine's 0), so count the non-null values, through a computed column
        nn = _fresh("__sql_valid", taken)
        taken.add(nn)
        pre[nn] = pc.is_valid(pc.field(col)).cast(pa.int64())
        cnt = _fresh("__sql_count", taken)
        taken.add(cnt)
        aggs.append(Agg("sum", nn, cnt))
        null = pa.scalar(None, pa.float64())
        return pc.if_else(pc.greater(pc.field(cnt), 0), pc.field(out), pc.scalar(null))

    def decimal_agg(self, key: str, kind: str, col: str, ctype: pa.DataType, out: str,
                    aggs: list[Agg], pre: dict[str, pc.Expression], taken: set[str]
                    ) -> pc.Expression:
        """``sum``, ``min`` or ``max`` of a decimal column of up to 18 digits, exactly: the
        engine's integer aggregate over its unscaled values (``1.25`` of scale 2 is 125),
        turned back into a decimal of that scale (DuckDB's sum is ``DECIMAL(38, s)``: the
        final projection widens it; an int64 sum wraps past 18 digits, as integer sums do)."""
        if not pa.types.is_decimal128(ctype) or ctype.precision > _UNIT_DIGITS:
            raise self.refuse(f"aggregate {key} over {ctype} (exact over decimals of up to "
                              f"{_UNIT_DIGITS} digits)")
        scale = ctype.scale
        units = _fresh("__sql_units", taken)
        taken.add(units)
        shift = pa.scalar(decimal.Decimal(10) ** scale, pa.decimal128(scale + 1, 0))
        pre[units] = pc.multiply_checked(pc.field(col), pc.scalar(shift)).cast(pa.int64())
        aggs.append(Agg(kind, units, out))
        value = pc.field(out).cast(pa.decimal128(19, 0))  # an int64's 19 digits
        if scale:
            unit = pa.scalar(decimal.Decimal(1).scaleb(-scale), pa.decimal128(scale, scale))
            value = pc.multiply_checked(value, pc.scalar(unit))
        if kind != "sum":
            return value
        # the engine's sum of no values is 0; SQL's is null: the mean is null exactly there
        mean = _fresh("__sql_mean", taken)
        taken.add(mean)
        aggs.append(Agg("mean", units, mean))
        null = pa.scalar(None, pa.decimal128(19 + (scale + 1 if scale else 0), scale))
        return pc.if_else(pc.is_valid(pc.field(mean)), value, pc.scalar(null))

    @staticmethod
    def select_item(node: exp.Expression, items: list[tuple[str, exp.Expression]], rel: Rel
                    ) -> exp.Expression | None:
        """The SELECT item ``node`` refers to (``GROUP BY 1``; an alias that is no column)."""
        if isinstance(node, exp.Literal) and not node.is_string:
            i = int(node.this)
            return items[i - 1][1] if 1 <= i <= len(items) else None
        if isinstance(node, exp.Column) and not node.table and not rel.find(node):
            hits = [e for n, e in items if n == node.name]
            return hits[0] if len(hits) == 1 else None
        return None

    # SELECT list, DISTINCT, ORDER BY, LIMIT ------------------------------------------------------
    def project(self, scope: Scope, items: list[tuple[str, exp.Expression]],
                orders: list[exp.Expression], node: exp.Select, distinct: bool,
                final: _Output | None) -> tuple[Table, list[str]]:
        names: list[str] = []
        for n, _ in items:  # DuckDB may repeat a name; finish refuses that at the top
            names.append(_fresh(n, names))
        taken = set(scope.schema.names) | set(names)
        hidden = []
        for _ in items:
            h = _fresh("__sql_out", taken)
            taken.add(h)
            hidden.append(h)
        exprs = {h: self.expr(e, scope) for h, (_, e) in zip(hidden, items, strict=True)}
        if distinct or not orders:
            table = scope.rel.table
            picks = list(zip(names, exprs.values(), strict=True))
            if distinct:
                table = self.made(self.made(table.view(**exprs)).agg_by([], by=hidden))
                picks = [(n, pc.field(h)) for n, h in zip(names, hidden, strict=True)]
            table, names = self.projection(table, picks, None if orders else final)
            return self.order_limit(table, names, node, final)
        # ORDER BY may read what the SELECT list does not keep: sort before projecting
        keys: list[tuple[str, bool, bool, str]] = []
        for o in orders:
            target = o.this
            ref = self.output_ref(target, names)
            if ref is not None:
                col = hidden[ref]
            else:
                col = _fresh("__sql_key", taken)
                taken.add(col)
                exprs[col] = self.expr(target, Scope(scope.rel, "ORDER BY", scope.special, scope.groups))
            keys.append((col, bool(o.args.get("desc")), bool(o.args.get("nulls_first")),
                         target.sql(dialect=DIALECT)))
        table = self.sort(self.made(scope.rel.table.view(**exprs)), keys, taken)
        table = self.limit(table, node)
        return self.projection(table, [(n, pc.field(h)) for n, h in zip(names, hidden, strict=True)], final)

    def projection(self, parent: Table, picks: list[tuple[str, pc.Expression]],
                   final: _Output | None = None) -> tuple[Table, list[str]]:
        """A view of ``parent`` computing the columns ``picks`` (name, expression), in order;
        ``parent`` itself when this compile built it last and it has those columns already.

        ``final`` (the statement's output, where these are its columns) renames them to
        DuckDB's names and casts them to its types in the same view; ignored if it does not
        fit (:meth:`finish` refuses that). A view's expression reads a name defined before
        it in the same view by its new definition (``engine.ops.select``), so where one
        reads a column of ``parent`` that an earlier one replaced by something else, the
        columns are computed under hidden names first, then renamed (two views).
        """
        names = [n for n, _ in picks]
        exprs = [e for _, e in picks]
        if final is not None and _fits(final, len(names)):
            names = [c for c, _ in final]
            exprs = [e if want is None or type_of(e, parent.schema) == want else e.cast(want)
                     for e, (_, want) in zip(exprs, final, strict=True)]
        have = parent.column_names
        same = [e.equals(pc.field(n)) for n, e in zip(names, exprs, strict=True)]
        if names == have and all(same) and self.created and parent is self.created[-1]:
            return parent, names
        replaced: set[str] = set()
        clash = False
        for n, e, s in zip(names, exprs, same, strict=True):
            clash = clash or not replaced.isdisjoint(
                bind(e, parent.schema, table_name=parent.name or "", what=f"column {n!r}").inputs)
            if n in have and not s:
                replaced.add(n)
        if clash:
            taken = set(have) | set(names)
            hidden = []
            for _ in names:
                hidden.append(_fresh("__sql_final", taken))
                taken.add(hidden[-1])
            parent = self.made(parent.view(**dict(zip(hidden, exprs, strict=True))))
            exprs = [pc.field(h) for h in hidden]
        return self.made(parent.view(**dict(zip(names, exprs, strict=True)))), names

    def finish(self, out: Table, names: list[str], duck: _Output, name: str | None) -> Table:
        """The view: ``out`` (columns ``names``) with DuckDB's names and types, by one
        projection, or none where the statement's last one gave them."""
        if len(duck) != len(names):
            raise self.error(f"the view has {len(names)} columns where DuckDB finds "
                             f"{len(duck)} ({', '.join(c for c, _ in duck)})")
        final = [c for c, _ in duck]
        dup = sorted({c for c in final if final.count(c) > 1})
        if dup:
            raise self.error(f"output column name(s) {dup} appear more than once; give the "
                             f"columns distinct aliases (SELECT a.k AS a_k, b.k AS b_k ...)")
        result, _ = self.projection(out, [(n, pc.field(n)) for n in names], duck)
        if name:
            result.name = name
        return result

    def output_ref(self, target: exp.Expression, names: list[str]) -> int | None:
        """The output column an ORDER BY item names (``ORDER BY 2``, an output name), or None."""
        if isinstance(target, exp.Literal) and not target.is_string:
            i = int(target.this)
            if not 1 <= i <= len(names):
                raise self.error(f"ORDER BY {i}: the SELECT list has {len(names)} columns")
            return i - 1
        if isinstance(target, exp.Column) and not target.table and target.name in names:
            return names.index(target.name)
        return None

    def order_limit(self, table: Table, names: list[str], node: exp.Expression,
                    final: _Output | None) -> tuple[Table, list[str]]:
        """ORDER BY over output columns only (after DISTINCT and UNION), then LIMIT."""
        order = node.args.get("order")
        if order is not None:
            keys = []
            for o in order.expressions:
                ref = self.output_ref(o.this, names)
                if ref is None:
                    raise self.refuse(f"ORDER BY {o.this.sql(dialect=DIALECT)} (after DISTINCT or "
                                      f"UNION, order by output columns)")
                keys.append((names[ref], bool(o.args.get("desc")), bool(o.args.get("nulls_first")),
                             o.this.sql(dialect=DIALECT)))
            table = self.sort(table, keys, set(names))
            table = self.limit(table, node)
            return self.projection(table, [(n, pc.field(n)) for n in names], final)
        if node.args.get("limit") is not None or node.args.get("offset") is not None:
            self.limit(table, node)  # refuses
        return table, names

    def sort(self, table: Table, keys: list[tuple[str, bool, bool, str]], taken: set[str]) -> Table:
        """``table`` sorted on ``(column, descending, nulls_first, SQL text)`` keys, SQL's nulls
        order; a key of a type the engine cannot sort is refused by its text.

        The engine's sort puts nulls (and NaN) last ascending and first descending; sorting
        on each key's null flag first puts them where SQL says, and NaN (not null) as the
        largest value, as DuckDB does.
        """
        flags: dict[str, pc.Expression] = {}
        by: list[str] = []
        desc: list[bool] = []
        for col, d, nulls_first, text in keys:
            t = table.schema.field(col).type
            if not sortable(t):
                raise self.refuse(f"ORDER BY {text} (of type {t}; {SORTABLE})")
            flag = _fresh("__sql_null", taken | set(flags))
            flags[flag] = pc.is_null(pc.field(col))
            by += [flag, col]
            desc += [nulls_first, d]
        return self.made(self.made(table.view(*table.column_names, **flags)).sort(by, desc))

    def limit(self, table: Table, node: exp.Expression) -> Table:
        limit, offset = node.args.get("limit"), node.args.get("offset")
        if limit is None and offset is None:
            return table
        if node.args.get("order") is None:
            what = "LIMIT" if limit is not None else "OFFSET"
            raise self.refuse(f"{what} without ORDER BY (which rows it keeps is arbitrary)")
        n = self.count(limit.expression if limit is not None else None, "LIMIT")
        m = self.count(offset.expression if offset is not None else None, "OFFSET") or 0
        if m == 0 and n is not None:
            return self.made(table.head(n))
        return self.made(table.slice(m, None if n is None else m + n))

    def count(self, e: exp.Expression | None, what: str) -> int | None:
        if e is None:
            return None
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
            return int(e.this)
        raise self.refuse(f"{what} {e.sql(dialect=DIALECT)} (a constant row count maps)")

    # expressions --------------------------------------------------------------------------------
def _fits(final: _Output, n: int) -> bool:
    """Whether ``final`` can name ``n`` columns: as many names, each once."""
    return len(final) == n and len({c for c, _ in final}) == n
