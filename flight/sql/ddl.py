"""CREATE TABLE, DROP TABLE, UPDATE and INSERT's clauses: what each asks of the source tables.

The functions here read a parsed statement (:func:`flight.sql.parse.parse_one`) and say
what it means for Ticktable, refusing with :class:`~engine.errors.SqlError` what it cannot
keep; :class:`~flight.sql.service.FlightSqlService` does it (the journal, DoPut's write path).

* ``CREATE TABLE t (col type [PRIMARY KEY] [NOT NULL], ..., [PRIMARY KEY (a, b)])`` makes a
  keyed table of those keys, or an append-only table without one. Column types are DuckDB's
  (``BIGINT``, ``VARCHAR``, ``DECIMAL(10,2)``, ``TIMESTAMPTZ``, ...), mapped to Arrow the way
  a query's results are: a ``CAST(NULL AS type)`` per column, bound by DuckDB
  (:meth:`TableDefinition.columns_query`). ``NOT NULL`` (and a key) makes the column's Arrow
  field not nullable, which every write into the table is checked against. A constraint
  Ticktable does not check (``DEFAULT``, ``UNIQUE``, ``CHECK``, ``REFERENCES``) is refused,
  named: a table never claims a rule it does not keep.
* ``CREATE TABLE t AS SELECT ...`` makes an append-only table of the query's result schema and
  writes its rows: a copy at one step, not a live view (``CREATE VIEW`` is that).
* ``UPDATE t SET c = expr, ... [WHERE ...]`` needs a keyed table: DuckDB computes every
  matched row's new values over a snapshot (:func:`update_query`, which also reads the
  values they replace), and the service writes them as a DIFF of the rows as read (a row
  changed since makes it read again).
* ``INSERT`` into a keyed table replaces the row of each key it writes (an upsert; also
  ``INSERT OR REPLACE``). ``ON CONFLICT DO NOTHING`` and ``INSERT OR IGNORE`` keep the rows
  of keys the table holds; ``ON CONFLICT [(keys)] DO UPDATE SET c = excluded.c, ...`` takes
  those columns from the new row and keeps the others. Refused: a ``DO UPDATE`` of other
  values or with a ``WHERE``, ``RETURNING``, ``DEFAULT VALUES`` (:func:`insert_clauses`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp

from engine.errors import SqlError
from flight.limits import quoted
from flight.sql.metadata import SCHEMA_NAME
from flight.sql.query import ROW_COLUMN

__all__ = ["InsertPlan", "TableDefinition", "drop_targets", "insert_clauses", "table_definition",
           "table_name", "update_query"]


@dataclass(frozen=True)
class TableDefinition:
    """What a ``CREATE TABLE`` statement asks for."""

    name: str
    #: ``(name, DuckDB type)`` per column, in order; empty for ``AS SELECT``
    columns: list[tuple[str, exp.DataType]]
    #: the primary key's columns (a keyed table), or none (append-only)
    keys: list[str]
    #: the columns declared ``NOT NULL`` (keys are, whether declared or not)
    not_null: list[str]
    #: ``AS SELECT ...``: the rows to copy, and the columns they come with
    query: exp.Query | None
    if_not_exists: bool
    replace: bool

    def columns_query(self) -> exp.Select:
        """``SELECT CAST(NULL AS type) AS name, ...``: DuckDB binds it to the table's Arrow
        schema (nothing is read)."""
        return exp.select(*(exp.alias_(exp.cast(exp.null(), kind), name, quoted=True)
                            for name, kind in self.columns))

    def schema(self, bound: pa.Schema) -> pa.Schema:
        """``bound`` (the columns query's schema) with the ``NOT NULL`` columns and the keys
        not nullable."""
        strict = set(self.not_null) | set(self.keys)
        return pa.schema([f.with_nullable(False) if f.name in strict else f for f in bound])


def table_name(table: exp.Expression, where: str) -> str:
    """The name of ``table`` (an ``exp.Table``), refusing a catalog or another schema than
    the server's one."""
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise SqlError(f"{where}: name a table")
    if table.catalog or (table.db and table.db != SCHEMA_NAME):
        raise SqlError(f"{where}: Ticktable has one schema, {SCHEMA_NAME!r}, and no catalogs: "
                       f"{table.sql(dialect='duckdb')}")
    return table.name


def table_definition(tree: exp.Create) -> TableDefinition:
    """Read a ``CREATE TABLE`` statement (see the module docstring).

    Raises
    ------
    SqlError
        A temporary table, table properties, a constraint Ticktable does not keep, a column
        named twice, a primary key given twice or naming no column of the table, or column
        definitions together with ``AS SELECT``, ``NOT NULL`` on no column.
    """
    target = tree.this
    schema = target if isinstance(target, exp.Schema) else None
    table = schema.this if schema is not None else target
    name = table_name(table, "CREATE TABLE")
    where = f"CREATE TABLE {quoted(name)}"
    properties = tree.args.get("properties")
    if properties is not None and properties.expressions:
        if any(isinstance(p, exp.TemporaryProperty) for p in properties.expressions):
            raise SqlError(f"{where}: temporary tables are not supported")
        raise SqlError(f"{where}: table properties are not supported: "
                       f"{properties.sql(dialect='duckdb')}")
    query = tree.expression
    if query is not None and not isinstance(query, exp.Query):
        raise SqlError(f"{where}: AS SELECT ... expected")
    columns: list[tuple[str, exp.DataType]] = []
    keys: list[str] = []
    not_null: list[str] = []
    for item in schema.expressions if schema is not None else []:
        if isinstance(item, exp.ColumnDef):
            col = item.name
            if any(c == col for c, _ in columns):
                raise SqlError(f"{where}: column {quoted(col)} is defined twice")
            kind = item.args.get("kind")
            if not isinstance(kind, exp.DataType):
                raise SqlError(f"{where}: column {quoted(col)} needs a type")
            columns.append((col, kind))
            for constraint in item.args.get("constraints") or []:
                rule = constraint.args.get("kind")
                if isinstance(rule, exp.PrimaryKeyColumnConstraint):
                    if keys:
                        raise SqlError(f"{where}: more than one PRIMARY KEY")
                    keys = [col]
                elif isinstance(rule, exp.NotNullColumnConstraint):
                    if not rule.args.get("allow_null"):  # NULL (nulls allowed): nothing to keep
                        not_null.append(col)
                else:
                    raise SqlError(f"{where}: column {quoted(col)}: "
                                   f"{constraint.sql(dialect='duckdb')} is not supported "
                                   f"(Ticktable keeps a primary key and NOT NULL, nothing "
                                   f"else)")
        elif isinstance(item, exp.PrimaryKey):
            if keys:
                raise SqlError(f"{where}: more than one PRIMARY KEY")
            keys = [e.name for e in item.expressions]
        else:
            raise SqlError(f"{where}: {item.sql(dialect='duckdb')} is not supported "
                           f"(Ticktable keeps a primary key and NOT NULL, nothing else)")
    if query is not None and columns:
        raise SqlError(f"{where}: give the columns or AS SELECT, not both (the query's "
                       f"columns are the table's)")
    if query is None and not columns:
        raise SqlError(f"{where}: no columns")
    names = [c for c, _ in columns]
    unknown = [k for k in keys if k not in names]
    if unknown:
        raise SqlError(f"{where}: PRIMARY KEY names no column {unknown}; columns: "
                       f"{', '.join(names)}")
    return TableDefinition(name, columns, keys, not_null, query, bool(tree.args.get("exists")),
                           bool(tree.args.get("replace")))


def drop_targets(tree: exp.Drop) -> list[str]:
    """The tables a ``DROP TABLE`` names, in order."""
    if tree.args.get("cascade"):
        raise SqlError("DROP TABLE ... CASCADE: not supported; drop the tables and views "
                       "that read it first")
    targets = tree.args.get("tables") or ([tree.this] if tree.this is not None else [])
    if not targets:
        raise SqlError("DROP TABLE: name a table")
    return [table_name(t, "DROP TABLE") for t in targets]


def update_query(tree: exp.Update, name: str, columns: list[str], keys: list[str]
                 ) -> tuple[exp.Select, list[str]]:
    """The query that computes an ``UPDATE``'s rows, and the columns it sets.

    Its columns are the matched row's position in the table's snapshot (``row``, read
    through ``QueryRunner.start(rows_of=...)``: the row itself is taken from the snapshot,
    exactly as held), then each ``SET`` expression in the statement's order, so that its
    parameters (``?``) come in the statement's order too (``SET`` before ``WHERE``). Each
    matched row comes once: the table is keyed.

    Raises
    ------
    SqlError
        ``FROM``, ``RETURNING``, ``ORDER BY`` or ``LIMIT``; a ``SET`` of a key, of an unknown
        column, or of a column twice.
    """
    where = f"UPDATE {quoted(name)}"
    for clause in ("from", "from_", "returning", "order", "limit"):
        value = tree.args.get(clause)
        if value:
            label = "FROM" if clause.startswith("from") else clause.upper().replace("ORDER", "ORDER BY")
            raise SqlError(f"{where}: {label} is not supported (a subquery in SET or WHERE "
                           f"may read other tables)")
    target = tree.this
    alias = target.alias if isinstance(target, exp.Table) else ""
    sets: dict[str, exp.Expression] = {}
    for item in tree.expressions:
        column = item.this if isinstance(item, exp.EQ) else None
        if not isinstance(column, exp.Column) or (column.table and column.table not in (name, alias)):
            raise SqlError(f"{where}: SET column = value expected, got {item.sql(dialect='duckdb')}")
        col = column.name
        if col not in columns:
            raise SqlError(f"{where}: no column {quoted(col)}; columns: {', '.join(columns)}")
        if col in keys:
            raise SqlError(f"{where}: SET of key column {quoted(col)}: a row's key does not "
                           f"change (DELETE it and INSERT the row with its new key)")
        if col in sets:
            raise SqlError(f"{where}: column {quoted(col)} is SET twice")
        sets[col] = item.expression
    if not sets:
        raise SqlError(f"{where}: SET column = value expected")
    items = [exp.column(ROW_COLUMN, table=alias or name, quoted=True),
             *(exp.alias_(e.copy(), c, quoted=True) for c, e in sets.items())]
    select = exp.select(*items).from_(target.copy())
    cond = tree.args.get("where")
    if cond is not None:
        select = select.where(cond.this.copy())
    return select, list(sets)


@dataclass(frozen=True)
class InsertPlan:
    """What an ``INSERT``'s clauses ask for (:func:`insert_clauses`)."""

    #: the query's columns match the table's by name (``BY NAME``), not by position
    by_name: bool
    #: for a row whose key the table holds: None, replace it (an upsert: also ``INSERT OR
    #: REPLACE`` and a ``DO UPDATE`` of every column); ``()``, keep it (``DO NOTHING``,
    #: ``INSERT OR IGNORE``); else the columns it takes from the new row (``DO UPDATE SET
    #: c = excluded.c`` of some columns), the others keeping their values
    on_conflict: tuple[str, ...] | None


def insert_clauses(tree: exp.Insert, name: str, keyed: bool, columns: list[str],
                   keys: list[str]) -> InsertPlan:
    """Read and check an ``INSERT``'s clauses (see the module docstring)."""
    where = f"INSERT INTO {quoted(name)}"
    for clause, label in (("returning", "RETURNING"), ("default", "DEFAULT VALUES")):
        if tree.args.get(clause):
            raise SqlError(f"{where}: {label} is not supported")
    by_name = bool(tree.args.get("by_name"))
    alternative = str(tree.args.get("alternative") or "").upper()
    conflict = tree.args.get("conflict")
    if (alternative or conflict is not None) and not keyed:
        clause = (f"INSERT OR {alternative}" if conflict is None
                  else conflict.sql(dialect="duckdb"))
        raise SqlError(f"{where}: {clause}: the table has no key")
    if alternative == "IGNORE":
        return InsertPlan(by_name, ())
    if alternative and alternative != "REPLACE":
        raise SqlError(f"{where}: INSERT OR {alternative} is not supported")
    if conflict is None:
        return InsertPlan(by_name, None)
    text = conflict.sql(dialect="duckdb")
    target = [c.this.name if isinstance(c, exp.Ordered) else c.name
              for c in conflict.args.get("conflict_keys") or []]
    if target and sorted(target) != sorted(keys):
        raise SqlError(f"{where}: {text}: the conflict target must be the key "
                       f"({', '.join(keys)})")
    action = str(conflict.args.get("action") or "").upper()
    if action == "DO NOTHING":
        return InsertPlan(by_name, ())
    if action != "DO UPDATE" or conflict.args.get("where") is not None:
        raise SqlError(f"{where}: {text} is not supported")
    sets: list[str] = []
    for item in conflict.expressions:
        left, right = (item.this, item.expression) if isinstance(item, exp.EQ) else (None, None)
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)
                and right.table.lower() == "excluded" and right.name == left.name):
            raise SqlError(f"{where}: {text}: only SET c = excluded.c is supported")
        if left.name not in columns:
            raise SqlError(f"{where}: {text}: no column {quoted(left.name)}")
        if left.name in keys:
            raise SqlError(f"{where}: {text}: SET of key column {quoted(left.name)}")
        sets.append(left.name)
    if set(sets) >= set(columns) - set(keys):
        return InsertPlan(by_name, None)  # every column from the new row: an upsert
    return InsertPlan(by_name, tuple(sets))
