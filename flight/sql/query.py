"""Queries: DuckDB over one-step Arrow snapshots of the tables a query names (DESIGN.md §10).

A query's text is parsed first (:mod:`flight.sql.parse`): one ``SELECT`` (``WITH``,
``UNION`` and the rest of DuckDB's query grammar), reading only plain table names, each a
table of the server. Anything else is refused before DuckDB sees it: another statement
(``ATTACH``, ``COPY``, ``INSTALL``, ``SET``, ``PRAGMA``, DDL), a table function
(``read_csv(...)``, ``duckdb_settings()``) or a schema-qualified name
(``information_schema.tables``). The tables are then read at one step
(:class:`~flight.sql.snapshots.SnapshotCache`) and handed, under their names, to a cursor
of one in-memory DuckDB database whose configuration is locked with external access off:
no file, network or extension is reachable even by a text that slipped past the parser's
check.

**Cursors are kept.** Creating a cursor and registering a table with it costs DuckDB a
catalog entry per name, for every query. A cursor whose query read its result to the end
goes back to an idle pool with its names still registered, each pointing through a
:class:`_Rows` at nothing: the next query on it points each name it reads at that query's
snapshot, whatever its columns. A cursor serves one query at a
time; one whose query was interrupted (cancel, timeout) or left unread is closed, never
kept, so an interrupt can never reach a later query, and an idle cursor holds no rows.

**What a query's snapshot holds.** A query of one table gets only the columns it reads
(DuckDB converts every column of an Arrow stream it scans); a lookup by a keyed table's
keys gets those rows through the key index (:func:`key_points`); an append table is cut
to the blocks its zone maps allow (:func:`value_ranges`); and a selective ``WHERE`` finds
its rows over its own columns first (:mod:`flight.sql.narrow`), the query then running
over just those rows (for ``SELECT * ... WHERE``, those rows are the answer).

A :class:`RunningQuery` holds the DuckDB result and streams it in record batches; it is
stopped by :meth:`QueryRunner.cancel` (Flight's ``CancelFlightInfo``) or by the server's
timeout (``sql_timeout``), which interrupts DuckDB wherever it is. DuckDB runs on the
calling thread (and its own worker threads, ``sql_threads``) without the graph's lock:
cycles keep running while a query runs. A result nobody reads is dropped at the timeout.

**One thread in a cursor at a time.** Closing a DuckDB connection while another thread
runs a query on it frees what that thread is using (a heap corruption, in a stress of
timeouts at random moments). So other threads only *interrupt* a query (the reaper, a
cancel, the shutdown); its cursor is closed by the thread running it once DuckDB returns
to it, and the reaper closes only a result whose start returned and that no DoGet took.
The shutdown closes the database (and with it every cursor) once no thread is inside a
call into it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from engine.errors import (
    InputError,
    LimitExceeded,
    PermissionDenied,
    QueryCancelled,
    QueryTimeout,
    SqlError,
    TableNotFound,
)
from flight.limits import quoted
from flight.sql import narrow
from flight.sql.parse import parse_one, shape_key, statement_kind
from flight.sql.snapshots import Snapshot, SnapshotCache
from flight.streams.registry import TableEntry, TableRegistry
from flight.wire import TableKind

__all__ = ["ROW_COLUMN", "QueryRunner", "RunningQuery", "duckdb_error", "is_query", "key_points",
           "named_tables", "narrow_plan", "read_columns", "value_ranges"]

log = logging.getLogger(__name__)

#: The schema metadata key of a result's step (also in FlightInfo.app_metadata).
STEP_KEY = b"ticktable.step"

#: The column a query started with ``rows_of`` (:meth:`QueryRunner.start`) reads beside
#: that table's own: each row's position in the query's snapshot of the table, so that the
#: caller takes the rows from the snapshot as held (DuckDB holds some values less exactly
#: than Arrow: intervals and times to the microsecond).
ROW_COLUMN = "__sql_row"


def duckdb_error(exc: Exception, where: str) -> Exception:
    """Our error for a DuckDB exception: its first line, under ``where``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, duckdb.OutOfMemoryException):
        return LimitExceeded(f"{where}: out of the memory queries may use (ticktable serve --sql-memory-mb): {text}")
    if isinstance(exc, duckdb.PermissionException):
        return PermissionDenied(f"{where}: a query may read only the tables it names: {text}")
    if isinstance(exc, duckdb.CatalogException):
        return SqlError(f"{where}: {text}")
    return SqlError(f"{where}: {text}")


def named_tables(tree: exp.Expression, registry: TableRegistry, where: str,
                 given: Collection[str] = ()) -> list[TableEntry]:
    """The registry's tables a statement reads (not the CTEs, nor the tables named in
    ``given``), refusing table functions and qualified names.

    Raises
    ------
    SqlError
        For a table function or a name qualified by a schema or catalog.
    TableNotFound
        For a name that is no table of the server.
    """
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    out: list[TableEntry] = []
    for t in tree.find_all(exp.Table):
        if not isinstance(t.this, exp.Identifier):
            raise SqlError(f"{where}: table function {t.this.sql(dialect='duckdb')[:80]} is not "
                           f"allowed: a query reads only the server's tables")
        if t.args.get("db") is not None or t.args.get("catalog") is not None:
            raise SqlError(f"{where}: {t.sql(dialect='duckdb')[:80]}: qualified names are not "
                           f"allowed: name a table of the server as it is listed")
        if t.name in ctes or t.name in given:
            continue
        entry = _lookup(registry, t.name)
        if entry not in out:
            out.append(entry)
    return out


def _lookup(registry: TableRegistry, name: str) -> TableEntry:
    names = registry.names()
    if name in names:
        return registry.get(name)
    folded = [n for n in names if n.lower() == name.lower()]  # SQL folds unquoted names
    if len(folded) == 1:
        return registry.get(folded[0])
    raise TableNotFound(f"no table {quoted(name)}; tables: {', '.join(sorted(names)[:20]) or '(none)'}")


@dataclass(eq=False)
class RunningQuery:
    """One query's DuckDB result, read batch by batch (:meth:`QueryRunner.batches`)."""

    handle: bytes
    sql: str
    step: int
    schema: pa.Schema
    reader: Any  # a pyarrow RecordBatchReader over DuckDB's result; None once read whole
    cursor: duckdb.DuckDBPyConnection | None  # None once the result was read whole
    snapshot: Snapshot | None
    lease: _Cursor | None = None  # the cursor's names, given back to the pool at the end
    ready: list[pa.RecordBatch] = field(default_factory=list)  # read by start, not yet sent
    started: float = field(default_factory=time.monotonic)
    stopped: str | None = None  # "cancelled" or "timeout": why DuckDB was interrupted
    taken: bool = False  # its DoGet began: a result is read once
    #: start() returned: no thread is inside DuckDB with its cursor until a DoGet takes it
    #: (the reaper drops only such a result: a DuckDB connection is one thread's at a time)
    waiting: bool = False
    finished: bool = False  # its reader reached the end of the result
    #: output positions that are a table's duration column, DuckDB's INTERVALs given back
    #: as that duration type (:func:`duration_outputs`)
    durations: dict[int, pa.DataType] = field(default_factory=dict)


class _Rows:
    """What one registered name of a kept cursor scans: the running query's snapshot of
    that table, or nothing between queries (DuckDB then refuses to read it).

    DuckDB asks for the Arrow stream when it binds and when it scans a query (the Arrow
    PyCapsule interface), so pointing :attr:`rows` elsewhere between two queries is what
    registering the name again would do, without the catalog's work.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: pa.Table | None) -> None:
        self.rows = rows

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        if self.rows is None:
            raise RuntimeError("no query reads this table through this cursor now")
        return self.rows.__arrow_c_stream__(requested_schema)


@dataclass(eq=False, slots=True)
class _Cursor:
    """A DuckDB cursor and the names registered with it (folded to lower case), each
    pointing through its :class:`_Rows` (a query may point a name at rows of other
    columns: DuckDB reads the schema when it binds each query, so one table's snapshots
    of other columns, or a table made again, need no new registration, ~0.3 ms)."""

    con: duckdb.DuckDBPyConnection
    names: dict[str, _Rows] = field(default_factory=dict)



def _stream(cursor: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None,
            batch_rows: int) -> Any:
    """DuckDB's result of ``sql`` as a pyarrow ``RecordBatchReader`` streaming its batches.

    DuckDB 2's relation (``cursor.sql(sql).to_arrow_reader()``) parses and binds the text
    to describe it, then parses, binds and plans it again to run it: 0.2-0.3 ms of a point
    lookup's fixed cost, twice the binder's work for nothing here (the result's schema
    comes with the reader). The connection's ``_submit`` is what that reader runs, once;
    it also refuses a text of several statements (``sql`` would run all but the last).
    A DuckDB without it gets the relation (a DB-API result would copy the batches first).
    """
    values = list(params) if params is not None else None
    submit = getattr(cursor, "_submit", None)
    if submit is None:
        return cursor.sql(sql, params=values).to_arrow_reader(batch_rows)
    return submit(sql, values, "stream", batch_rows).arrow_reader()


def locked_database(*, threads: int, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database that reads nothing but what is registered with it.

    Access to files, the network and extensions is off and the configuration is locked,
    for every cursor of it: a statement that names ``read_csv('/etc/passwd')``, an
    ``http://`` URL or ``INSTALL`` fails in DuckDB's binder, before anything is read.
    """
    db = duckdb.connect(":memory:", config={
        "enable_external_access": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "allow_community_extensions": False,
        "threads": threads,
        "memory_limit": memory_limit,
    })
    db.execute("SET lock_configuration = true")
    return db

class QueryRunner:
    """Runs queries over the server's tables (see the module docstring).

    Parameters
    ----------
    registry
        The server's tables.
    timeout
        Seconds a query may run (from its start to its last batch read).
    memory_limit
        DuckDB's memory limit for all running queries, e.g. ``"2GB"``.
    threads
        DuckDB's worker threads.
    batch_rows
        Rows per result batch.
    """

    #: result schemas :meth:`schema_of` remembers (least recently used first out)
    SCHEMAS_KEPT = 256
    #: idle cursors kept for the next queries (see the module docstring), and the names
    #: one may have registered to be kept
    CURSORS_KEPT = 4
    NAMES_KEPT = 64
    #: seconds :meth:`shutdown` waits for the threads inside DuckDB (interrupted) to leave
    #: it before it closes the database; past that the database is left open
    SHUTDOWN_WAIT = 5.0

    def __init__(self, registry: TableRegistry, *, timeout: float = 60.0,
                 memory_limit: str = "2GB", threads: int = 1, batch_rows: int = 65_536) -> None:
        self.registry = registry
        self.timeout = timeout
        self.batch_rows = batch_rows
        self.snapshots = SnapshotCache(registry.graph)
        # one database: DuckDB's configuration is locked after this, and access to files,
        # the network and extensions is off for every cursor
        self._db = locked_database(threads=threads, memory_limit=memory_limit)
        #: called with a query's seconds and outcome (ok, error, timeout, cancelled) when
        #: it ends: the server's metrics
        self.on_done: Callable[[float, str], None] | None = None
        self._running: dict[bytes, RunningQuery] = {}
        self._idle: list[_Cursor] = []
        self._idle_lock = threading.Lock()
        self._schemas: OrderedDict[tuple[Any, ...], pa.Schema] = OrderedDict()
        self._schemas_lock = threading.Lock()
        self._positions = narrow.Positions()  # row positions for narrow passes, shared
        #: narrow passes (their text) whose WHERE kept more rows than the cap, and the
        #: table's rows then: a pass that gave up is not run again until the table doubles
        #: (a WHERE keeping the newest rows would scan most of the table each time)
        self._broad: OrderedDict[str, int] = OrderedDict()
        #: narrow passes by outcome: "kept" (the query ran over their rows), "gave_up" (past
        #: the cap: over the whole table), "failed" (DuckDB refused the pass)
        self.narrow_passes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._salt = os.urandom(8)
        # threads inside a DuckDB call of this database, and whether shutdown refuses more:
        # closing the database closes every cursor, under any thread still running on one
        self._inside = 0
        self._shut = False
        self._gate = threading.Condition(threading.Lock())
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="ticktable-sql-reaper")
        self._closed = threading.Event()
        self._reaper.start()

    # ------------------------------------------------------------------ running
    def start(self, sql: str, params: Sequence[Any] | None = None, *,
              tree: exp.Expression | None = None, where: str = "query",
              rows_of: str | None = None, given: Mapping[str, pa.Table] | None = None
              ) -> RunningQuery:
        """Parse, snapshot and start ``sql``; its batches are read with :meth:`batches`.

        With ``rows_of`` (a table the query names), that table's snapshot holds every
        column, and the query may read its :data:`ROW_COLUMN`: a row's position in
        ``query.snapshot.tables[rows_of]``. ``given`` names rows of the server's own (a
        statement's parameter rows, under a name no user table can have) the query reads
        beside the tables.

        Raises
        ------
        SqlError
            For a text that does not parse, is not one query, or reads other than tables.
        TableNotFound
            For a table the server does not have.
        QueryTimeout, LimitExceeded
            If DuckDB ran past the timeout or the memory limit while starting.
        """
        tree = parse_one(sql) if tree is None else tree
        if not is_query(tree):
            raise SqlError(f"{where}: not a query (SELECT, WITH, VALUES): {_statement(tree)}")
        entries = named_tables(tree, self.registry, where, given or ())
        if rows_of is not None and ROW_COLUMN in self.registry.get(rows_of).table.schema.names:
            raise SqlError(f"{where}: table {quoted(rows_of)} has a column {ROW_COLUMN!r}, a "
                           f"name the server's statements use; rename it")
        pinned: list[bool] = []
        points = key_points(tree, entries, params, pinned)
        first: narrow.NarrowPlan | None = None
        answered_by_keys = False
        if points is not None:  # a lookup by key: the rows of those keys, not a scan
            snapshot = self.snapshots.take_keys(entries[0].name, entries[0].table, points)
            answered_by_keys = rows_of is None and not given and pinned == [True] and (
                narrow.star_only(tree, _names_in_scope(tree))
                or _columns_only(tree, _names_in_scope(tree)) is not None)
        else:
            snapshot = self.snapshots.take([
                (e.name, e.table, None if e.name == rows_of else read_columns(tree, entries, e))
                for e in entries])
            ranges = value_ranges(tree, entries, params)
            if ranges is not None:  # the blocks of an append table that can hold its rows
                name = entries[0].name
                snapshot.tables[name] = self.snapshots.prune(
                    name, entries[0].table, snapshot.tables[name], ranges)
            if (len(entries) == 1 and rows_of is None
                    and snapshot.tables[entries[0].name].num_rows >= narrow.MIN_ROWS):
                first = narrow_plan(tree, entries, params)
        with self._duckdb(where):
            lease = self._lease()
        cursor = lease.con
        handle = f"q{next(self._ids)}-".encode() + self._salt.hex().encode()
        query = RunningQuery(handle, sql, snapshot.step, pa.schema([]), None, cursor, snapshot,
                             lease)
        with self._lock:
            self._running[handle] = query
        try:
            try:
                with self._duckdb(where):
                    answer = None
                    if first is not None:
                        answer = self._narrow(query, first, snapshot, entries[0].name, params,
                                              where)
                    elif answered_by_keys:  # SELECT *|columns FROM t WHERE <keys>: rows found
                        answer = self._as_selected(sql, tree, params, entries[0].name,
                                                   snapshot.tables[entries[0].name], where)
                    if answer is None:
                        tables = snapshot.tables if not given else {**snapshot.tables, **given}
                        if rows_of is not None:
                            held = tables[rows_of]
                            tables = {**tables, rows_of: held.append_column(
                                ROW_COLUMN, pa.array(np.arange(held.num_rows, dtype=np.int64)))}
                        self._point(lease, tables)
                        query.reader = _stream(cursor, sql, params, self.batch_rows)
            except duckdb.InterruptException:
                raise self._stopped(query, where) from None
            except duckdb.Error as exc:
                raise duckdb_error(exc, where) from None
            if answer is not None:  # the narrow pass's rows are the answer: no reader
                query.schema = answer.schema.with_metadata({STEP_KEY: str(snapshot.step).encode()})
                query.ready = answer.to_batches(max_chunksize=self.batch_rows)
                self._read_whole(query)
            else:
                query.durations = _restorable(duration_outputs(tree, entries),
                                              query.reader.schema)
                query.schema = restore_durations(query.reader.schema, query.durations).with_metadata(
                    {STEP_KEY: str(snapshot.step).encode()})
            # up to two batches now: DuckDB has run most of a small result's work already
            # (a scan filling its first batch), and a result that ends within them needs no
            # cursor past this point (nor a thread to send it: flight.sql.service)
            for _ in range(2 if answer is None else 0):
                batch = self._read(query, where)
                if batch is None:
                    self._read_whole(query)
                    break
                query.ready.append(batch)
        except BaseException as exc:
            self.close(handle)
            self._done(query, exc)
            raise
        with self._lock:
            query.waiting = True
        return query

    def _narrow(self, query: RunningQuery, first: narrow.NarrowPlan, snapshot: Snapshot,
                name: str, params: Sequence[Any] | None, where: str) -> pa.Table | None:
        """Run ``first``, the narrow pass (:mod:`flight.sql.narrow`), over table ``name``
        of ``snapshot``: if its ``WHERE`` keeps few enough rows, the snapshot's table becomes
        those rows, and for a ``SELECT *`` they are returned as the answer (in the schema
        DuckDB gives ``SELECT *`` over the table; ``None`` when the types differ from it).
        Called inside a DuckDB call of the query's (interrupted as the query)."""
        lease = query.lease
        rows = snapshot.tables[name]
        n = rows.num_rows
        if lease is None or n < narrow.MIN_ROWS or n >= 2**32 or not narrow.worth(rows, first):
            return None
        with self._schemas_lock:
            broad = self._broad.get(first.sql)
        if broad is not None and n < 2 * broad:
            return None  # this WHERE kept more than the cap last time: not again so soon
        found = None
        if first.terms is not None:
            try:
                found = narrow.scan(rows, first.terms, narrow.cap(n),
                                    lambda: query.stopped is not None)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                log.debug("the numpy pass failed: %s", first.sql, exc_info=True)  # DuckDB's
        if query.stopped is not None:
            raise self._stopped(query, where)
        if found is not None:
            self.narrow_passes["numpy"] += 1
        else:
            found = self._duckdb_pass(lease, first, rows, params)
            if found is None:
                if query.stopped is not None:
                    raise self._stopped(query, where)
                self.narrow_passes["failed"] += 1
                return None
        if len(found) > narrow.cap(n):
            self.narrow_passes["gave_up"] += 1
            with self._schemas_lock:  # remembered until the table doubles
                self._broad[first.sql] = n
                self._broad.move_to_end(first.sql)
                while len(self._broad) > self.SCHEMAS_KEPT:
                    self._broad.popitem(last=False)
            return None
        with self._schemas_lock:
            self._broad.pop(first.sql, None)
        self.narrow_passes["kept"] += 1
        kept = snapshot.tables[name] = narrow.take_rows(rows, found)
        if not first.star:
            return None
        return self._as_star(name, kept, where)

    def _duckdb_pass(self, lease: _Cursor, first: narrow.NarrowPlan, rows: pa.Table,
                     params: Sequence[Any] | None) -> pa.ChunkedArray | None:
        """The narrow pass's positions, by DuckDB; ``None`` when it failed (the query itself
        then says what is wrong, over the whole table) or was interrupted."""
        self._point(lease, {narrow.NARROW_TABLE: narrow.narrow_table(rows, first.columns,
                                                                      self._positions)})
        try:
            reader = _stream(lease.con, first.text(rows.num_rows), params, self.batch_rows)
            try:
                return reader.read_all().column(0)
            finally:
                reader.close()
        except (duckdb.Error, pa.ArrowException, OSError):
            log.debug("a narrow pass failed: %s", first.sql, exc_info=True)
            return None

    def _as_selected(self, sql: str, tree: exp.Expression, params: Sequence[Any] | None,
                     name: str, rows: pa.Table, where: str) -> pa.Table | None:
        """``rows`` of table ``name`` as DuckDB's answer to ``SELECT *`` or ``SELECT`` of
        its columns (named as DuckDB names them, in its schema), or None when DuckDB would
        give other types or the columns are not plainly the table's (it answers then)."""
        if narrow.star_only(tree, _names_in_scope(tree)):
            return self._as_star(name, rows, where)
        columns = _columns_only(tree, _names_in_scope(tree))
        if columns is None:
            return None
        found = []
        for c in columns:  # DuckDB's names are case-insensitive
            hits = [f for f in rows.column_names if f.lower() == c.lower()]
            if len(hits) != 1:
                return None
            found.append(rows.column(hits[0]))
        # the parameters are in the WHERE: their values cannot change the answer's types
        nulls = None if params is None else [None] * len(params)
        want = self.schema_of(sql, nulls, tree, where)
        if [f.type for f in want] != [a.type for a in found]:
            return None
        return pa.Table.from_arrays(found, schema=want)

    def _as_star(self, name: str, rows: pa.Table, where: str) -> pa.Table | None:
        """``rows`` of table ``name`` as DuckDB's answer to ``SELECT *`` over them (its
        schema), or None when DuckDB would give other types (it answers then)."""
        star = self._star_schema(name, rows.schema, where)
        if [(f.name, f.type) for f in star] != [(f.name, f.type) for f in rows.schema]:
            return None
        return pa.Table.from_arrays(rows.columns, schema=star)

    def _star_schema(self, name: str, schema: pa.Schema, where: str) -> pa.Schema:
        """The schema of DuckDB's answer to ``SELECT * FROM name`` over a table of
        ``schema`` (remembered as :meth:`schema_of`'s are)."""
        key = ("*", name, schema)
        with self._schemas_lock:
            star = self._schemas.get(key)
            if star is not None:
                self._schemas.move_to_end(key)
                return star
        cursor = self._db.cursor()
        try:
            cursor.register("t", schema.empty_table())
            star = cursor.sql("SELECT * FROM t").limit(0).to_arrow_table().schema
        except duckdb.Error as exc:
            raise duckdb_error(exc, where) from None
        finally:
            cursor.close()
        with self._schemas_lock:
            self._schemas[key] = star
            while len(self._schemas) > self.SCHEMAS_KEPT:
                self._schemas.popitem(last=False)
        return star

    def held(self) -> dict[str, int]:
        """Bytes the runner holds between queries: the kept snapshots (shared by queries
        while their tables do not change; a keyed table's is a copy) and the narrow passes'
        shared position range."""
        return {"snapshots": self.snapshots.kept_bytes(), "positions": self._positions.nbytes}

    def schema_of(self, sql: str, params: Sequence[Any] | None, tree: exp.Expression,
                  where: str = "query") -> pa.Schema:
        """The result schema of a query, bound over empty tables of the named tables'
        schemas (nothing is read or run: a prepared statement's dataset schema).

        Remembered per text, parameter count and named tables' schemas (the last
        :attr:`SCHEMAS_KEPT`) when no parameter has a value (a prepare's NULLs): binding
        costs about a millisecond of DuckDB, and a DB-API cursor (pandas ``read_sql``, BI
        tools polling the same query) prepares each text it runs. Texts that differ only in
        literals whose values cannot change a result's types (each under a ``WHERE``,
        ``HAVING``, ``QUALIFY``, ``ORDER BY``, ``LIMIT`` or ``OFFSET`` of its ``SELECT``:
        ``WHERE id = 5`` and ``WHERE id = 6``) share one entry (:func:`~flight.sql.parse.
        shape_key`); a literal elsewhere (``SELECT round(x, 2)``, ``SELECT 2**40``) keeps
        its text its own. A table made again with
        other columns is another key.

        Raises what :meth:`start` raises for a text that does not bind.
        """
        if not is_query(tree):
            raise SqlError(f"{where}: not a query (SELECT, WITH, VALUES): {_statement(tree)}")
        entries = named_tables(tree, self.registry, where)
        if params is not None and any(p is not None for p in params):
            # a value's type can change the result's (DuckDB binds 1 as INTEGER, 2**40 as BIGINT)
            return self._bound_schema(sql, params, tree, entries, where)
        text: Any = sql
        if _literals_cannot_type(tree):  # a point lookup's new id: the same schema
            shape = shape_key(sql)
            text = sql if shape is None else shape
        key = (text, None if params is None else len(params),
               tuple((e.name, e.table.schema) for e in entries))
        with self._schemas_lock:
            schema = self._schemas.get(key)
            if schema is not None:
                self._schemas.move_to_end(key)
                return schema
        schema = self._bound_schema(sql, params, tree, entries, where)
        with self._schemas_lock:
            self._schemas[key] = schema
            while len(self._schemas) > self.SCHEMAS_KEPT:
                self._schemas.popitem(last=False)
        return schema

    def _bound_schema(self, sql: str, params: Sequence[Any] | None, tree: exp.Expression,
                      entries: Sequence[TableEntry],
                      where: str) -> pa.Schema:
        """:meth:`schema_of` without the memory: DuckDB binds ``sql`` over empty tables."""
        with self._duckdb(where):
            cursor = self._db.cursor()
            try:
                for e in entries:
                    cursor.register(e.name, e.table.schema.empty_table())
                # the query itself over no rows: a relation's limit(0) would make it a
                # subquery, whose binder renames two outputs of one name (v, v_1) where the
                # query's answer keeps both names (v, v)
                reader = _stream(cursor, sql, params, 1024)
                try:
                    return restore_durations(reader.schema, _restorable(
                        duration_outputs(tree, entries), reader.schema))
                finally:
                    reader.close()
            except duckdb.Error as exc:
                raise duckdb_error(exc, where) from None
            finally:
                cursor.close()

    def batches(self, query: RunningQuery, where: str = "query") -> Iterator[pa.RecordBatch]:
        """The result's record batches (at least one: an empty result gives one of no rows)."""
        sent = False
        failure: BaseException | None = None
        try:
            while True:
                if query.ready:
                    batch: pa.RecordBatch | None = query.ready.pop(0)
                else:
                    batch = self._read(query, where)
                    if batch is None:
                        break
                if query.stopped is not None:
                    raise self._stopped(query, where)
                sent = True
                yield batch
            if not sent:
                yield pa.RecordBatch.from_pylist([], query.schema)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.close(query.handle)
            self._done(query, failure)

    def _read(self, query: RunningQuery, where: str) -> pa.RecordBatch | None:
        """The result's next batch from DuckDB; None at its end (or once read whole)."""
        if query.reader is None:
            return None
        try:
            with self._duckdb(where):
                batch = query.reader.read_next_batch()
            return restore_durations(batch, query.durations) if query.durations else batch
        except StopIteration:
            query.finished = True
            return None
        except (duckdb.InterruptException, pa.ArrowException, OSError) as exc:
            if query.stopped is not None:
                raise self._stopped(query, where) from None
            raise duckdb_error(exc, where) from None
        except duckdb.Error as exc:
            raise duckdb_error(exc, where) from None

    def _read_whole(self, query: RunningQuery) -> None:
        """A result read to its end by :meth:`start`: its cursor goes back to the pool now
        (or is closed if the query was interrupted meanwhile)."""
        with self._lock:  # from here on, _interrupt leaves the cursor alone
            cursor, query.cursor = query.cursor, None
            lease, query.lease = query.lease, None
        reader, query.reader = query.reader, None
        with self._duckdb(None):
            keep = self._close_reader(reader) and query.stopped is None and lease is not None
            if keep and lease is not None:
                self._give_back(lease)
            elif cursor is not None:
                self._close_cursor(cursor)

    @staticmethod
    def _close_reader(reader: Any) -> bool:
        """Close a result's reader; whether that went cleanly."""
        if reader is None:
            return True
        try:
            reader.close()
        except (pa.ArrowException, duckdb.Error, OSError):  # an interrupted stream's error
            log.debug("closing a query's reader", exc_info=True)
            return False
        return True

    @staticmethod
    def _close_cursor(cursor: duckdb.DuckDBPyConnection) -> None:
        try:
            cursor.close()
        except duckdb.Error:
            log.debug("closing a query's cursor", exc_info=True)

    def get(self, handle: bytes) -> RunningQuery:
        """The running query of ``handle``, to be read once.

        Raises
        ------
        TableNotFound
            If none runs under it (finished, cancelled, timed out or never started).
        """
        with self._lock:
            query = self._running.get(handle)
            if query is None or query.taken:
                raise TableNotFound("no query runs under this ticket: it was read already, "
                                    "cancelled, or timed out; run the query again")
            query.taken = True
            query.waiting = False
        return query

    def cancel(self, handle: bytes) -> bool:
        """Stop the query of ``handle``; whether one was running."""
        with self._lock:
            query = self._running.get(handle)
        if query is None:
            return False
        self._interrupt(query, "cancelled")
        return True

    def close(self, handle: bytes) -> None:
        """Forget a query and free its result and snapshot; its cursor is kept for the next
        query if it read its result to the end and was never interrupted, else closed."""
        with self._lock:
            query = self._running.pop(handle, None)
        if query is None:
            return
        # out of _running: nothing interrupts it from here on (_interrupt looks there)
        query.snapshot = None
        query.ready = []
        reader, query.reader = query.reader, None
        with self._duckdb(None):
            keep = self._close_reader(reader) and query.finished and query.stopped is None
            if keep and query.lease is not None:
                self._give_back(query.lease)
            elif query.cursor is not None:
                self._close_cursor(query.cursor)

    def running(self) -> int:
        """Queries started and not yet read to their end."""
        with self._lock:
            return len(self._running)

    def shutdown(self) -> None:
        """Stop every query and the database. A query some thread is still starting or
        reading is interrupted, and closed by that thread when DuckDB returns to it."""
        self._closed.set()
        with self._lock:
            queries = list(self._running.values())
        for q in queries:
            self._interrupt(q, "cancelled")
            self._drop_waiting(q)
        with self._gate:  # interrupted, the threads inside DuckDB leave it in milliseconds
            self._shut = True
            if not self._gate.wait_for(lambda: self._inside == 0, self.SHUTDOWN_WAIT):
                log.warning("SQL shutdown: a thread was still inside DuckDB %.0f s after its "
                            "query was interrupted; the database is left open",
                            self.SHUTDOWN_WAIT)
                return
            # under the gate: a query's thread closing its cursor waits for this
            with self._idle_lock:  # _closed is set: a query ending later closes its cursor
                idle, self._idle = self._idle, []
            for c in idle:
                c.con.close()
            self._db.close()  # and every cursor a query not read to its end still holds

    # ---------------------------------------------------------------- internals
    @contextmanager
    def _duckdb(self, where: str | None) -> Iterator[None]:
        """Around a call into this database: counted, so :meth:`shutdown` closes it only
        once no thread is inside (closing it closes every cursor, also one that a thread
        runs a query on, and frees what that thread uses). After shutdown, a new query's
        call (``where`` given) is refused; one that closes what a query held goes on
        (DuckDB refuses it for a closed cursor, harmlessly)."""
        with self._gate:
            if self._shut and where is not None:
                raise QueryCancelled(f"{where}: the server is shutting down")
            self._inside += 1
        try:
            yield
        finally:
            with self._gate:
                self._inside -= 1
                if self._inside == 0:
                    self._gate.notify_all()

    def _lease(self) -> _Cursor:
        """An idle cursor, or a new one: one query's, until :meth:`close`."""
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
        return _Cursor(self._db.cursor())

    @staticmethod
    def _point(lease: _Cursor, tables: dict[str, pa.Table]) -> None:
        """Point the cursor's names at ``tables``, registering the names it lacks."""
        for name, rows in tables.items():
            key = name.lower()  # DuckDB's names are case-insensitive: one entry per folding
            held = lease.names.get(key)
            if held is not None:  # also for other columns: DuckDB reads the schema at each bind
                held.rows = rows
                continue
            source = _Rows(rows)
            lease.con.register(name, source)
            lease.names[key] = source

    def _give_back(self, lease: _Cursor) -> None:
        """Keep a cursor whose query ended cleanly, pointing at no rows (or close it)."""
        for source in lease.names.values():
            source.rows = None  # an idle cursor holds no snapshot
        with self._idle_lock:
            if (not self._closed.is_set() and len(self._idle) < self.CURSORS_KEPT
                    and len(lease.names) <= self.NAMES_KEPT):
                self._idle.append(lease)
                return
        self._close_cursor(lease.con)

    def _interrupt(self, query: RunningQuery, why: str) -> None:
        # under the lock, and only while the query runs: once close() took it out of
        # _running its cursor may serve another query, which this must not stop
        with self._lock:
            if self._running.get(query.handle) is not query:
                return
            if query.stopped is None:
                query.stopped = why
            if query.cursor is None:  # read whole by start: nothing runs, nothing to stop
                return
            try:
                query.cursor.interrupt()
            except duckdb.Error:
                log.debug("interrupting a query", exc_info=True)

    def _done(self, query: RunningQuery, failure: BaseException | None) -> None:
        if self.on_done is None:
            return
        if failure is None:
            outcome = "ok"
        elif isinstance(failure, QueryTimeout):
            outcome = "timeout"
        elif isinstance(failure, (QueryCancelled, GeneratorExit)):
            outcome = "cancelled"  # by CancelFlightInfo, or the client left mid-stream
        else:
            outcome = "error"
        try:
            self.on_done(time.monotonic() - query.started, outcome)
        except Exception:
            log.exception("counting a query")

    def _stopped(self, query: RunningQuery, where: str) -> Exception:
        if query.stopped == "timeout":
            return QueryTimeout(f"{where}: stopped after the query timeout of {self.timeout:g} s "
                                f"(ticktable serve --sql-timeout)")
        return QueryCancelled(f"{where}: cancelled by its client")

    def _reap(self) -> None:
        """Interrupt queries past the timeout; drop results nobody read in time."""
        while not self._closed.wait(min(0.1, self.timeout / 4)):
            now = time.monotonic()
            with self._lock:
                late = [q for q in self._running.values() if now - q.started > self.timeout]
            for q in late:
                try:
                    self._interrupt(q, "timeout")
                    self._drop_waiting(q)  # never read: nobody else will close it
                except Exception:  # the reaper must outlive any one query's failure
                    log.exception("SQL reaper: stopping query %s", q.handle.decode())

    def _drop_waiting(self, query: RunningQuery) -> None:
        """Close ``query`` if its result waits for a DoGet (:attr:`RunningQuery.waiting`):
        taken out of the running ones under the lock, so no DoGet can take it meanwhile.
        A query that another thread is in (its start, or a DoGet's reads) is left to that
        thread: closing a DuckDB connection while another thread runs a query on it frees
        memory under that thread's feet (a heap corruption in a stress run)."""
        with self._lock:
            if not query.waiting or self._running.get(query.handle) is not query:
                return
            query.waiting = False
        self.close(query.handle)


def _restored(t: pa.DataType) -> bool:
    """A column type DuckDB answers as another, that a column read as it is gets back: a
    duration (DuckDB's INTERVAL) and a zoned timestamp (DuckDB's is in microseconds, zoned
    in ``Etc/UTC``)."""
    return pa.types.is_duration(t) or (pa.types.is_timestamp(t) and t.tz is not None)


def duration_outputs(tree: exp.Expression, entries: Sequence[TableEntry]) -> dict[int, pa.DataType]:
    """The output positions of a ``SELECT`` that are a named table's duration or zoned
    timestamp column as it is (``*``, ``t.*``, ``d``, ``t.d AS x``), with that column's type.

    DuckDB reads an Arrow duration as an INTERVAL, and answers it as one (a month-day-nano
    interval: pandas sees objects), and a timestamp zoned in ``Europe/Paris`` as one zoned in
    ``Etc/UTC`` (the same instants; a unit of seconds or milliseconds as microseconds); a
    column read as it is goes back to the type the table holds (a duration to DuckDB's
    microsecond). Every other output (an expression, an aggregate) is DuckDB's. A ``*`` of
    several tables, a ``*`` with ``EXCLUDE``/``REPLACE`` or a set operation give nothing."""
    if not isinstance(tree, exp.Select):
        return {}
    by_name = {e.name: e for e in entries}
    sources: dict[str, TableEntry] = {}  # alias or name -> the table it is
    parts = [tree.args.get("from") or tree.args.get("from_"),
             *(j for j in tree.args.get("joins") or [])]
    direct = True
    for part in parts:
        node = part.this if part is not None else None
        if isinstance(node, exp.Table) and node.name in by_name:
            sources[node.alias_or_name] = by_name[node.name]
        else:
            direct = False  # a subquery, a CTE or a table function among the sources
    if not sources:
        return {}
    only = next(iter(sources.values())) if direct and len(sources) == 1 else None
    out: dict[int, pa.DataType] = {}
    at = 0
    for e in tree.expressions:
        target = e.this if isinstance(e, exp.Alias) else e
        star = target.this if isinstance(target, exp.Column) else target
        if isinstance(star, exp.Star):
            if any(star.args.values()):
                return {}
            table = sources.get(target.table) if isinstance(target, exp.Column) and target.table \
                else only
            if table is None:
                return {}
            for f in table.table.schema:
                if _restored(f.type):
                    out[at] = f.type
                at += 1
            continue
        if isinstance(target, exp.Column) and not target.args.get("db"):
            if target.table:
                tables = [sources[target.table]] if target.table in sources else []
            else:
                tables = list(sources.values()) if direct else []
            hits = [f for t in tables for f in t.table.schema if f.name.lower() == target.name.lower()]
            if len(hits) == 1 and _restored(hits[0].type):
                out[at] = hits[0].type
        at += 1
    return out


def _restorable(durations: dict[int, pa.DataType], schema: pa.Schema) -> dict[int, pa.DataType]:
    """Those of ``durations`` DuckDB answered as another type of the same kind: a
    month-day-nano interval for a duration, a zoned timestamp for a zoned timestamp."""
    out = {}
    for i, t in durations.items():
        got = schema.field(i).type if i < len(schema) else None
        if got is not None and got != t and (
                pa.types.is_duration(t) and pa.types.is_interval(got)
                or pa.types.is_timestamp(t) and pa.types.is_timestamp(got) and got.tz is not None):
            out[i] = t
    return out


def restore_durations(data: Any, durations: dict[int, pa.DataType]) -> Any:
    """``data`` (a schema or a batch) with the columns at ``durations``' positions as those
    types: an interval's days and nanoseconds (its months are none for a duration DuckDB
    read) in the duration's unit; a timestamp in the table's zone and unit."""
    if not durations:
        return data
    if isinstance(data, pa.Schema):
        for i, t in durations.items():
            data = data.set(i, data.field(i).with_type(t))
        return data
    columns = list(data.columns)
    for i, t in durations.items():
        # a timestamp: the same instants in the table's zone and unit (exact: they came from it)
        columns[i] = _interval_as(columns[i], t) if pa.types.is_duration(t) else \
            columns[i].cast(t, safe=False)
    return pa.RecordBatch.from_arrays(columns, schema=restore_durations(data.schema, durations))


_MDN = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanos", "<i8")])
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _interval_as(column: pa.Array, t: pa.DataType) -> pa.Array:
    values = np.frombuffer(column.buffers()[1], _MDN, count=len(column) + column.offset)[column.offset:]
    nanos = values["days"].astype(np.int64) * 86_400_000_000_000 + values["nanos"]
    data = nanos // _NS_PER[t.unit]
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    return pa.array(data, t, mask=None if valid is None else ~valid)


def _columns_only(tree: exp.Expression, names: set[str]) -> list[str] | None:
    """The table's columns a ``SELECT c, d AS e FROM table WHERE ...`` (and nothing more)
    lists, in order, or None for another shape."""
    if not isinstance(tree, exp.Select) or any(
            v for k, v in tree.args.items() if k not in ("expressions", "from", "from_", "where")):
        return None
    out = []
    for e in tree.expressions:
        column = _own_column(e.this if isinstance(e, exp.Alias) else e, names)
        if column is None or isinstance(e.find(exp.Star), exp.Star):
            return None
        out.append(column)
    return out or None


def _names_in_scope(tree: exp.Expression) -> set[str]:
    """The name a one-table ``SELECT``'s table goes by (its alias, if it has one)."""
    source = tree.args.get("from") or tree.args.get("from_")
    return {source.this.alias_or_name} if source is not None else set()


def _one_table_where(tree: exp.Expression, entries: Sequence[TableEntry],
                     params: Sequence[Any] | None) -> tuple[exp.Expression, set[str], Any] | None:
    """For a ``SELECT`` whose answer depends only on the rows of its one table that its
    ``WHERE`` keeps: that ``WHERE``'s top-level ``AND`` terms' holder, the names the table goes
    by and the query's one ``?`` value; ``None`` for another shape.

    The table is named once, in the ``FROM`` (no join, no subquery reading it, no
    ``TABLESAMPLE``). SQL filters rows before it groups, windows, orders or limits them, so the
    query over a subset of the table that holds every row its ``WHERE`` keeps answers what it
    answers over the whole table (DuckDB still applies the whole ``WHERE``).
    """
    if len(entries) != 1 or not isinstance(tree, exp.Select):
        return None
    source = tree.args.get("from") or tree.args.get("from_")
    table = source.this if source is not None else None
    if (not isinstance(table, exp.Table) or tree.args.get("joins") or table.args.get("sample")
            or sum(1 for _ in tree.find_all(exp.Table)) != 1):
        return None
    where = tree.args.get("where")
    if where is None:
        return None
    holders = list(tree.find_all(exp.Placeholder))
    param = (params[0] if params is not None and len(params) == 1 and len(holders) == 1
             and holders[0].this is None else _NO_PARAM)
    return where.this, {table.name, table.alias_or_name}, param


def read_columns(tree: exp.Expression, entries: Sequence[TableEntry],
                 entry: TableEntry) -> list[str] | None:
    """The columns of ``entry`` a query reads, when it reads that one table and not all of
    its columns (its snapshot then holds only those: DuckDB converts every column of an
    Arrow stream it scans); ``None`` for all of them."""
    if len(entries) != 1 or not isinstance(tree, exp.Select):
        return None
    source = tree.args.get("from") or tree.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or sum(1 for _ in tree.find_all(exp.Table)) != 1:
        return None
    schema = entry.table.schema
    read = narrow.read_columns(tree, {table.name, table.alias_or_name}, schema)
    if read is None or not read or len(read) == len(schema):
        return None
    return [n for n in schema.names if n in read]


def narrow_plan(tree: exp.Expression, entries: Sequence[TableEntry],
                params: Sequence[Any] | None = None) -> narrow.NarrowPlan | None:
    """The narrow pass (:mod:`flight.sql.narrow`) of a query of :func:`key_points`'s
    shape over any kind of table; ``None`` for another shape or a ``WHERE`` it cannot run."""
    shape = _one_table_where(tree, entries, params)
    if shape is None:
        return None
    where, names, param = shape
    source = tree.args.get("from") or tree.args.get("from_")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table):
        return None
    return narrow.plan(tree, table, where, names, entries[0].table.schema,
                       () if param is _NO_PARAM else (param,))


#: Clauses whose literals cannot change the types of the ``SELECT`` they belong to.
_UNTYPED = (exp.Where, exp.Having, exp.Qualify, exp.Order, exp.Limit, exp.Offset)


def _literals_cannot_type(tree: exp.Expression) -> bool:
    """Whether every literal of ``tree`` sits in a clause of :data:`_UNTYPED` of the
    nearest ``SELECT`` above it (so its value cannot change the result's schema)."""
    for literal in tree.find_all(exp.Literal):
        node: Any = literal.parent
        while node is not None and not isinstance(node, _UNTYPED):
            if isinstance(node, (exp.Select, exp.Query)):
                return False  # reached a SELECT from its columns (or another part)
            node = node.parent
        if node is None:
            return False
    return True


def _terms(where: exp.Expression) -> list[exp.Expression]:
    return [t for t in where.flatten() if isinstance(t, exp.Expression)] \
        if isinstance(where, exp.And) else [where]


def _own_column(node: exp.Expression, names: set[str]) -> str | None:
    """The column name of ``node`` when it is a column of the query's one table."""
    if not isinstance(node, exp.Column) or (node.table and node.table not in names):
        return None
    return node.name


def key_points(tree: exp.Expression, entries: Sequence[TableEntry],
               params: Sequence[Any] | None = None, pinned: list[bool] | None = None
               ) -> pa.Table | None:
    """The keys a query looks up, when its answer depends on no other rows of its table.

    That is a ``SELECT`` whose only table (named once: no join, no subquery reading it) is a
    keyed table in its ``FROM``, with a ``WHERE`` whose top-level ``AND`` pins every key
    column to literals (``k = 5``, ``k IN ('a', 'b')``). SQL filters rows before it groups,
    windows, orders or limits them, so the query over just the rows of those keys answers
    what it answers over the whole table; DuckDB still applies the whole ``WHERE`` to them.
    A query's one ``?`` parameter counts as a literal of its bound value. ``None``
    otherwise (and for a value of another kind than its key's type, which the scan compares
    as DuckDB casts it). ``pinned``, when given, gets whether the ``WHERE`` is those pins
    and nothing else (each term pins a key: then the rows of the keys are what it keeps).
    """
    shape = _one_table_where(tree, entries, params)
    if shape is None or entries[0].kind != TableKind.KEYED:
        return None
    where, names, param = shape
    entry = entries[0]
    keys = set(entry.keys)
    if any(isinstance(e, exp.Alias) and e.alias in keys for e in tree.expressions):
        return None  # an output named like a key: leave such a text to the scan
    values: dict[str, list[Any]] = {}
    for term in _terms(where):
        if isinstance(term, exp.EQ):
            col, lits = (term.this, [term.expression]) if isinstance(term.this, exp.Column) \
                else (term.expression, [term.this])
        elif isinstance(term, exp.In) and not term.args.get("query") and not term.args.get("unnest"):
            col, lits = term.this, term.expressions
        else:
            continue
        name = _own_column(col, names)
        if name is None or name not in keys or name in values:
            continue
        got = [_literal(lit, entry.table.schema.field(name).type, param) for lit in lits]
        if got and all(v is not None for v in got):
            values[name] = got
    if set(values) != keys:
        return None
    if pinned is not None:  # every term of the WHERE pins a key: the rows are the answer
        pinned.append(len(_terms(where)) == len(values) == sum(
            1 for t in _terms(where) if isinstance(t, (exp.EQ, exp.In))))
    if len(entry.keys) > 1 and any(len(v) != 1 for v in values.values()):
        return None  # one value per key column of a composite key
    columns = {k: list(dict.fromkeys(values[k])) for k in entry.keys}
    try:
        return pa.table({k: pa.array(v, entry.table.schema.field(k).type) for k, v in columns.items()})
    except (pa.ArrowException, OverflowError):
        return None  # out of the key's range: the scan says what it says


#: Comparisons a range is read from: ``col OP literal`` bounds ``col`` below, above or both
#: (``>`` as ``>=``: a wider range only scans more); a literal on the left swaps the operator.
_BOUNDS: dict[type[exp.Expression], tuple[bool, bool]] = {
    exp.EQ: (True, True), exp.GT: (True, False), exp.GTE: (True, False),
    exp.LT: (False, True), exp.LTE: (False, True)}
_SWAPPED: dict[type[exp.Expression], type[exp.Expression]] = {
    exp.EQ: exp.EQ, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}


def value_ranges(tree: exp.Expression, entries: Sequence[TableEntry],
                 params: Sequence[Any] | None = None) -> dict[str, list[tuple[int, int]]] | None:
    """The values a query's ``WHERE`` holds integer columns of its append table to.

    For a query of the shape :func:`key_points` reads (one table, every row it answers with
    kept by its ``WHERE``) over an append table, the top-level ``AND`` terms ``col = v``,
    ``col IN (v, ...)``, ``col BETWEEN a AND b`` and ``col < v`` (``<=``, ``>``, ``>=``, either
    side) on integer columns with integer literals (or the one ``?``) hold ``col`` to a union
    of closed intervals ``[lo, hi]``: a row outside every one fails the ``WHERE`` (an empty
    list: nothing can match). ``None`` when no term bounds a column. Only narrowing the rows
    scanned depends on this (:meth:`~flight.sql.snapshots.SnapshotCache.prune`), never the
    answer.
    """
    shape = _one_table_where(tree, entries, params)
    if shape is None or entries[0].kind != TableKind.APPEND:
        return None
    where, names, param = shape
    schema = entries[0].table.schema
    ranges: dict[str, list[tuple[int, int]]] = {}

    def bound(node: exp.Expression, lits: list[exp.Expression], lo: bool, hi: bool) -> None:
        name = _own_column(node, names)
        if name is None or schema.get_field_index(name) < 0:
            return
        type_ = schema.field(name).type
        if not pa.types.is_integer(type_):
            return
        got = [_literal(lit, type_, param) for lit in lits]
        if not got or any(v is None for v in got):
            return
        if lo and hi and len(got) <= _MAX_POINTS:  # points: one interval each
            new = [(v, v) for v in sorted(set(got))]
        else:
            new = [(min(got) if lo else _BELOW, max(got) if hi else _ABOVE)]
        old = ranges.get(name)
        ranges[name] = new if old is None else [
            (max(a, c), min(b, d)) for a, b in old for c, d in new if max(a, c) <= min(b, d)]

    for term in _terms(where):
        kind: type[exp.Expression] = type(term)
        if kind in _BOUNDS:
            left, right = term.this, term.expression
            if not isinstance(left, exp.Column):
                left, right, kind = right, left, _SWAPPED[kind]
            bound(left, [right], *_BOUNDS[kind])
        elif isinstance(term, exp.In) and not term.args.get("query") and not term.args.get("unnest"):
            bound(term.this, list(term.expressions), True, True)
        elif isinstance(term, exp.Between) and not term.args.get("symmetric"):
            bound(term.this, [term.args["low"]], True, False)
            bound(term.this, [term.args["high"]], False, True)
    return ranges or None


#: Beyond the bounds of every integer type; ``IN`` lists longer than this bound by their
#: least and greatest value.
_BELOW, _ABOVE, _MAX_POINTS = -(2**64), 2**64, 1024


_NO_PARAM = object()


def _literal(node: exp.Expression, type_: pa.DataType, param: Any = _NO_PARAM) -> Any:
    """A literal's (or the one parameter's) value for a key column of ``type_``; None for
    another kind of value."""
    if isinstance(node, exp.Placeholder):
        if param is _NO_PARAM or isinstance(param, bool):
            return None
        if pa.types.is_integer(type_) and isinstance(param, int):
            return param
        if (pa.types.is_string(type_) or pa.types.is_large_string(type_)) and isinstance(param, str):
            return param
        return None
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this
    if not isinstance(node, exp.Literal):
        return None
    if pa.types.is_integer(type_) and not node.is_string:
        try:
            value = int(node.this)
        except ValueError:
            return None
        return -value if negative else value
    if (pa.types.is_string(type_) or pa.types.is_large_string(type_)) and node.is_string and not negative:
        return str(node.this)
    return None


def is_query(tree: exp.Expression) -> bool:
    """Whether a statement returns rows: a SELECT (WITH, UNION, ...) or a bare VALUES."""
    return statement_kind(tree) == "select" or isinstance(tree, exp.Values)


def _statement(tree: exp.Expression) -> str:
    return tree.sql(dialect="duckdb")[:60]


def check_params(params: pa.RecordBatch | pa.Table | None, where: str) -> list[list[Any]]:
    """Parameter rows of a bound batch (a prepared statement's DoPut), as Python values
    (read column by column: a third of the time of rows as dicts, and two columns of one
    name stay two)."""
    if params is None:
        return []
    if params.num_columns == 0:
        return [[] for _ in range(params.num_rows)]
    try:
        columns = [c.to_pylist() for c in params.columns]
    except pa.ArrowException as exc:
        raise InputError(f"{where}: parameters cannot be read: {exc}") from None
    return [list(r) for r in zip(*columns, strict=True)]
