"""Arrow Flight SQL on the server's one port, beside plain Flight (DESIGN.md §10).

A Flight SQL command is a ``google.protobuf.Any`` holding a message of
``proto/arrow/flight/protocol/sql/flight_sql.proto``; :class:`FlightSqlService` takes the
calls whose descriptor, ticket or action carries one, and :mod:`flight.rpc.flight_service`
keeps everything else:

==============================  ===========================================================
call                            what it does
==============================  ===========================================================
GetFlightInfo(metadata cmd)     the command's schema; the ticket is the command itself
GetFlightInfo(StatementQuery)   parses, snapshots at one step and starts the query
                                (:mod:`flight.sql.query`); the ticket names the result;
                                ``app_metadata`` is an ``UpdateMetadata`` with the step.
                                An update statement sent as a query (DB-API ``execute``)
                                runs at once and returns one row, ``count``
GetFlightInfo(PreparedQuery)    the same with the statement's bound parameters
GetSchema(cmd)                  the command's result schema
DoGet(ticket)                   the result, in record batches; the first carries the step
DoPut(StatementUpdate)          ``INSERT``, ``UPDATE``, ``DELETE``, ``CREATE TABLE``,
                                ``DROP TABLE``, ``CREATE VIEW``, ``DROP VIEW``; answers
                                ``DoPutUpdateResult``
DoPut(StatementIngest)          bulk ingestion (create, append, replace), atomic
DoPut(PreparedQuery)            binds parameters; answers ``DoPutPreparedStatementResult``
DoPut(PreparedUpdate)           runs the update once per parameter row, atomically (as one
                                query over the rows where it can: an executemany)
DoAction                        ``CreatePreparedStatement``, ``ClosePreparedStatement``,
                                ``CancelFlightInfo``
==============================  ===========================================================

Writes take DoPut's path (:meth:`flight.ingest.put.PutHandler.acks`): the rows are checked
by the table, held as one staged write and committed, so a statement's rows become visible
in one cycle, are journaled before the answer on a durable server, and a bad row applies
nothing. ``INSERT`` into a keyed table upserts by key. ``DELETE`` and ``UPDATE`` need a keyed
table: DuckDB evaluates the ``WHERE`` (and an update's ``SET``) over a snapshot, and the rows
it selects are written as a DIFF (DoPut's differential mode): ``-1`` of each row as read,
``+1`` of its new values. The commit checks each retracted row against the table (the
writes staged before it included), so a write to those keys between the snapshot and the
commit makes the statement read and compute again (:attr:`FlightSqlService.ATTEMPTS`
times, then UNAVAILABLE): no acknowledged write is overwritten by values computed before
it (on a table with nested columns, which a DIFF cannot carry, they write by key without
that check). Statements that write run one at a time, each over a snapshot that holds what
the one before it wrote (two ``UPDATE t SET n = n + 1`` make ``n + 2``). ``CREATE TABLE`` makes a
source table (keyed by its ``PRIMARY KEY``, else append-only) through the journal, as the
``create_table`` action does; :mod:`flight.sql.ddl` says what each of these statements may
hold.

A read-only call (the read token) may query, prepare and bind parameters, nothing else.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError, Message
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokenizer_core import TokenType

from engine.differential.resolve import takes_triples
from engine.errors import (
    InputError,
    Overloaded,
    PermissionDenied,
    ProtocolError,
    SqlError,
    TableExists,
    TableNotFound,
)
from flight.limits import quoted
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import flight_sql_pb2 as sql
from flight.pb import table_service_pb2 as tpb
from flight.rpc.aio import HAND_OFF, HandOff
from flight.rpc.framing import batch_frames, schema_frame
from flight.sql import metadata
from flight.sql.commands import SQL_ACTION_TYPES, pack, unpack
from flight.sql.ddl import (
    drop_targets,
    insert_clauses,
    table_definition,
    table_name,
    update_query,
)
from flight.sql.parse import parse_one, statement_kind
from flight.sql.query import ROW_COLUMN, QueryRunner, RunningQuery, check_params, is_query
from flight.sql.views import CompiledView, compile_view
from flight.streams.registry import PENDING_PREFIX, pending_name
from flight.wire import DIFF, PutMode, TableKind

__all__ = ["SQL_ACTION_TYPES", "FlightSqlService", "SqlHost", "pack", "unpack"]

log = logging.getLogger(__name__)

_COUNT_SCHEMA = pa.schema([pa.field("count", pa.int64())])


class _Config(Protocol):
    max_batch_rows: int


class SqlHost(Protocol):
    """What the Flight SQL service runs on (a :class:`~flight.server.TicktableServer`)."""

    registry: Any
    puts: Any
    durability: Any
    staging: Any
    filters: Any  # flight.streams.filtered.FilteredTables

    @property
    def config(self) -> _Config: ...

    def commit(self, req: pb.CommitRequest) -> pb.CommitResult: ...

    def abort(self, req: pb.AbortRequest) -> None: ...


@dataclass(eq=False)
class _Prepared:
    handle: bytes
    text: str
    tree: exp.Expression
    params: list[list[Any]] = field(default_factory=list)


#: the name a statement's parameter rows take in its query (no user table has it)
PARAM_ROWS = f"{PENDING_PREFIX}parameters"
_ROWS_ALIAS = "__ticktable_rows"  # their alias there
_DUCK = Dialect.get_or_raise("duckdb")


def _values_of_rows(values: exp.Expression, params: list[list[Any]]
                    ) -> tuple[str, dict[str, pa.Table]] | None:
    """``VALUES`` run once per parameter row (an ``executemany``) as one query over the
    rows: each ``?`` becomes the row's column of its place, and the ``VALUES`` a
    ``LATERAL`` of each row (so DuckDB types its columns as it types ``VALUES``; one tuple,
    a projection of the rows: the same types), in the rows' order and the tuples' within
    each. None where that is not what the rows would give one by one: a subquery, a
    column, ``$n`` parameters, a count of ``?`` other than the rows' width, or rows pyarrow
    cannot make columns of.

    The rows' types are pyarrow's of their values (an int64 column of integers, where one
    by one DuckDB binds a small integer as an INTEGER and a large one as a BIGINT)."""
    if not isinstance(values, exp.Values) or values.find(exp.Subquery, exp.Parameter,
                                                         exp.Column) is not None:
        return None
    rows = _param_rows(params)
    if rows is None or not values.expressions:
        return None
    width = rows.num_columns - 1
    places = iter(range(width))

    def column(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder) and node.args.get("this") is None:  # a ?
            k = next(places, None)
            return node if k is None else exp.column(f"p{k}", table=_ROWS_ALIAS)
        return node

    tuples: list[str] = []
    texts: list[list[str]] = []
    for t, row in enumerate(values.expressions):
        if not isinstance(row, exp.Tuple):
            return None
        exprs = [e.copy().transform(column) for e in row.expressions]
        if any(e.find(exp.Placeholder) is not None for e in exprs):
            return None  # more ? than the rows are wide
        texts.append([e.sql(dialect="duckdb") for e in exprs])
        tuples.append(f"({t}, {', '.join(texts[-1])})")
    if next(places, None) is not None:
        return None  # fewer ? than the rows are wide
    names = [f"col{i}" for i in range(len(values.expressions[0].expressions))]
    if len(tuples) == 1:  # one tuple: its columns are its expressions' types, as a projection's
        items = ", ".join(f"{e} AS {n}" for e, n in zip(texts[0], names, strict=True))
        return (f"SELECT {items} FROM \"{PARAM_ROWS}\" AS {_ROWS_ALIAS} ORDER BY {_ROWS_ALIAS}.__n",
                {PARAM_ROWS: rows})
    sql = (f"SELECT {', '.join(f'__v.{n}' for n in names)} FROM \"{PARAM_ROWS}\" AS {_ROWS_ALIAS}, "
           f"LATERAL (VALUES {', '.join(tuples)}) AS __v(__t, {', '.join(names)}) "
           f"ORDER BY {_ROWS_ALIAS}.__n, __v.__t")
    return sql, {PARAM_ROWS: rows}


def _param_rows(params: list[list[Any]]) -> pa.Table | None:
    """Parameter rows as a table: ``__n`` their order, ``p<k>`` the values of place ``k``
    (None where pyarrow cannot make a column of them, or the rows differ in width)."""
    width = len(params[0])
    if any(len(r) != width for r in params):
        return None
    try:
        return pa.table({"__n": pa.array(range(len(params)), pa.int64()),
                         **{f"p{k}": pa.array([r[k] for r in params]) for k in range(width)}})
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def _select_of_rows(select: str, params: list[list[Any]]) -> tuple[str, dict[str, pa.Table]] | None:
    """A query run once per parameter row (an ``executemany`` of UPDATE or DELETE) as one
    query over the rows: the ``?`` in ``select``'s text, in their order, become the row's
    columns, and the query a ``LATERAL`` of each row; its answer holds each row's answer,
    in the rows' order. None for ``$n`` parameters, or a count of ``?`` other than the
    rows' width."""
    rows = _param_rows(params)
    if rows is None:
        return None
    places = [t for t in _DUCK.tokenize(select) if t.token_type in (TokenType.PLACEHOLDER,
                                                                     TokenType.PARAMETER)]
    if len(places) != rows.num_columns - 1 or any(t.text != "?" for t in places):
        return None
    parts, at = [], 0
    for k, t in enumerate(places):
        parts += [select[at:t.start], f"{_ROWS_ALIAS}.p{k}"]
        at = t.end + 1
    inner = "".join([*parts, select[at:]])
    sql = (f"SELECT __s.* FROM \"{PARAM_ROWS}\" AS {_ROWS_ALIAS}, LATERAL ({inner}) AS __s "
           f"ORDER BY {_ROWS_ALIAS}.__n")
    return sql, {PARAM_ROWS: rows}


def _placeholders(tree: exp.Expression) -> int:
    return sum(1 for _ in tree.find_all(exp.Placeholder)) + sum(
        1 for p in tree.find_all(exp.Parameter) if p.name.isdigit())


class FlightSqlService:
    """Flight SQL's calls over one server (see the module docstring).

    Parameters
    ----------
    server
        The server whose tables, DoPut path and durability it uses.
    version
        The server's version (``FLIGHT_SQL_SERVER_VERSION``).
    timeout, memory_mb
        A query's timeout in seconds, and DuckDB's memory for all queries
        (:class:`~flight.sql.query.QueryRunner`).
    """

    def __init__(self, server: SqlHost, *, version: str = "0", timeout: float = 60.0,
                 memory_mb: int = 2048) -> None:
        self.server = server
        self.version = version
        self.runner = QueryRunner(server.registry, timeout=timeout,
                                  memory_limit=f"{memory_mb}MB",
                                  batch_rows=server.config.max_batch_rows)
        self._prepared: dict[bytes, _Prepared] = {}
        #: each view's compiled operations, closed with it (a dropped view's intermediate
        #: tables would otherwise go on updating every cycle)
        self._views: dict[str, CompiledView] = {}
        #: temporary views (CREATE TEMPORARY VIEW: not journaled) by name: when each was
        #: made, and whether it ever had a subscriber; :meth:`_sweep` drops them
        self._temporary: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        #: held by each statement that writes, from its snapshot to its commit
        self._writing = threading.Lock()
        server.registry.on_drop.append(self._dropped)
        self._closed = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_forever, daemon=True,
                                         name="ticktable-sql-temp-views")
        self._sweeper.start()
        self._ids = itertools.count(1)
        self._salt = os.urandom(8).hex()

    def close(self) -> None:
        """Stop every running query."""
        self._closed.set()
        self.runner.shutdown()

    # ----------------------------------------------------------------- GetFlightInfo
    def flight_info(self, descriptor: fpb.FlightDescriptor, *, read_only: bool) -> fpb.FlightInfo:
        """GetFlightInfo for a Flight SQL command."""
        cmd = self._command(descriptor.cmd)
        if isinstance(cmd, sql.CommandStatementQuery):
            return self._query_info(descriptor, cmd.query, None, read_only=read_only)
        if isinstance(cmd, sql.CommandPreparedStatementQuery):
            prepared = self._prepared_of(cmd.prepared_statement_handle)
            if len(prepared.params) > 1:
                raise SqlError(f"prepared query: {len(prepared.params)} parameter rows are "
                               f"bound; a query takes one")
            params = prepared.params[0] if prepared.params else None
            return self._query_info(descriptor, prepared.text, params, tree=prepared.tree,
                                    read_only=read_only)
        table = self._metadata(cmd, read_only=read_only)
        if table is None:
            raise ProtocolError(f"Flight SQL: {type(cmd).__name__} is not a GetFlightInfo "
                                f"command")
        return self._info(descriptor, table.schema, pack(cmd), total=table.num_rows)

    def schema(self, descriptor: fpb.FlightDescriptor, *, read_only: bool) -> pa.Schema:
        """GetSchema for a Flight SQL command. A query's schema comes from binding it over
        empty tables (nothing runs); an update statement's is the one-row ``count`` (it is
        not run either: GetSchema never writes)."""
        cmd = self._command(descriptor.cmd)
        if isinstance(cmd, (sql.CommandStatementQuery, sql.CommandPreparedStatementQuery)):
            if isinstance(cmd, sql.CommandStatementQuery):
                text, tree, params = cmd.query, parse_one(cmd.query), None
            else:
                prepared = self._prepared_of(cmd.prepared_statement_handle)
                text, tree = prepared.text, prepared.tree
                params = prepared.params[0] if prepared.params else None
            if not is_query(tree):
                return _COUNT_SCHEMA
            n = _placeholders(tree)
            if params is None and n:
                params = [None] * n
            return self.runner.schema_of(text, params, tree)
        table = self._metadata(cmd, read_only=read_only)
        if table is None:
            raise ProtocolError(f"Flight SQL: {type(cmd).__name__} has no result schema")
        return table.schema

    def _command(self, raw: bytes) -> Message:
        cmd = unpack(raw)
        if cmd is None:
            raise ProtocolError("Flight SQL: the descriptor's cmd is not a Flight SQL command "
                                "(a google.protobuf.Any of arrow.flight.protocol.sql)")
        return cmd

    def _info(self, descriptor: fpb.FlightDescriptor, schema: pa.Schema, ticket: bytes, *,
              total: int = -1, step: int | None = None) -> fpb.FlightInfo:
        meta = b"" if step is None else pb.UpdateMetadata(
            step=step, is_snapshot=True).SerializeToString()
        return fpb.FlightInfo(schema=schema.serialize().to_pybytes(),
                              flight_descriptor=descriptor,
                              endpoint=[fpb.FlightEndpoint(ticket=fpb.Ticket(ticket=ticket))],
                              total_records=total, total_bytes=-1, app_metadata=meta)

    def _query_info(self, descriptor: fpb.FlightDescriptor, text: str,
                    params: Sequence[Any] | None, *, tree: exp.Expression | None = None,
                    read_only: bool) -> fpb.FlightInfo:
        tree = parse_one(text) if tree is None else tree
        if not is_query(tree):  # DB-API execute() sends every statement here
            if read_only:
                raise _read_only(f"run {tree.key.upper()}")
            count = self.update(text, [list(params)] if params else [], tree=tree)
            ticket = pack(sql.TicketStatementQuery(statement_handle=b"count:%d" % count))
            # total_records: the rows it changed, as DB-API's rowcount means for a statement
            # that writes (ADBC reads it as ExecuteQuery's rows affected); the result holds it
            return self._info(descriptor, _COUNT_SCHEMA, ticket, total=count)
        query = self._start(text, params, tree=tree)
        ticket = pack(sql.TicketStatementQuery(statement_handle=query.handle))
        return self._info(descriptor, query.schema, ticket, step=query.step)

    def _metadata(self, cmd: Message, *, read_only: bool) -> pa.Table | None:
        registry = self.server.registry
        if isinstance(cmd, sql.CommandGetSqlInfo):
            return metadata.sql_info(cmd.info, version=self.version, read_only=read_only,
                                     timeout_ms=int(self.runner.timeout * 1000))
        if isinstance(cmd, sql.CommandGetCatalogs):
            return metadata.catalogs()
        if isinstance(cmd, sql.CommandGetDbSchemas):
            return metadata.db_schemas(cmd.catalog if cmd.HasField("catalog") else None,
                                       cmd.db_schema_filter_pattern
                                       if cmd.HasField("db_schema_filter_pattern") else None)
        if isinstance(cmd, sql.CommandGetTables):
            return metadata.tables(registry.entries(), cmd)
        if isinstance(cmd, sql.CommandGetTableTypes):
            return metadata.table_types()
        if isinstance(cmd, sql.CommandGetPrimaryKeys):
            entry = registry.get(cmd.table)  # NOT_FOUND for an unknown table
            return metadata.primary_keys(entry)
        if isinstance(cmd, (sql.CommandGetExportedKeys, sql.CommandGetImportedKeys,
                            sql.CommandGetCrossReference)):
            return metadata.foreign_keys()
        if isinstance(cmd, sql.CommandGetXdbcTypeInfo):
            return metadata.xdbc_type_info(cmd.data_type if cmd.HasField("data_type") else None)
        return None

    # ------------------------------------------------------------------------- DoGet
    def do_get(self, ticket: bytes, *, read_only: bool) -> Iterator[bytes | HandOff] | None:
        """DoGet of a Flight SQL ticket, as frames; ``None`` when it is not one.

        Runs on the server's event loop until the frames yield :data:`HAND_OFF` (see
        :mod:`flight.rpc.aio`): what comes before it decodes the ticket and frames a
        result that is already read (a count, a query's result read whole by
        :meth:`QueryRunner.start`); reading DuckDB's result or the catalog comes after.
        """
        cmd = unpack(ticket)
        if cmd is None:
            return None
        if isinstance(cmd, sql.TicketStatementQuery):
            handle = cmd.statement_handle
            if handle.startswith(b"count:"):
                digits = handle[6:]
                if not digits.isdigit() or len(digits) > 18:
                    raise ProtocolError("Flight SQL: this ticket names no result")
                table = pa.table({"count": pa.array([int(digits)], pa.int64())})
                return self._frames(table.schema, table.to_batches() or [], None)
            query = self.runner.get(handle)
            return self._query_frames(query)
        return self._metadata_frames(cmd, read_only=read_only)

    def _metadata_frames(self, cmd: Message, *, read_only: bool) -> Iterator[bytes | HandOff]:
        yield HAND_OFF  # the catalog: the registry's tables
        table = self._metadata(cmd, read_only=read_only)
        if table is None:
            raise ProtocolError(f"Flight SQL: {type(cmd).__name__} is not a DoGet ticket")
        yield from self._frames(table.schema, table.to_batches() or [_empty_batch(table.schema)],
                                None)

    def _frames(self, schema: pa.Schema, batches: Any, meta: bytes | None) -> Iterator[bytes]:
        yield schema_frame(schema)
        yield from batch_frames(schema, batches, first_metadata=meta)

    def _query_frames(self, query: RunningQuery) -> Iterator[bytes | HandOff]:
        meta = pb.UpdateMetadata(step=query.step, is_snapshot=True).SerializeToString()
        try:
            if query.reader is not None:  # DuckDB reads on: not on the event loop
                yield HAND_OFF
            yield from self._frames(query.schema, self.runner.batches(query), meta)
        finally:
            self.runner.close(query.handle)

    # ------------------------------------------------------------------------- DoPut
    def do_put(self, cmd_bytes: bytes, batches: Iterator[pa.RecordBatch], *,
               read_only: bool) -> Iterator[bytes]:
        """DoPut of a Flight SQL command: the ``PutResult`` app_metadata to send."""
        cmd = self._command(cmd_bytes)
        if isinstance(cmd, sql.CommandPreparedStatementQuery):
            prepared = self._prepared_of(cmd.prepared_statement_handle)
            rows: list[list[Any]] = []
            for batch in batches:
                rows.extend(check_params(batch, "prepared query parameters"))
            prepared.params = rows
            yield sql.DoPutPreparedStatementResult(
                prepared_statement_handle=prepared.handle).SerializeToString()
            return
        if read_only:
            raise _read_only(f"run {type(cmd).__name__}")
        if isinstance(cmd, sql.CommandStatementUpdate):
            # run and answered at once: a client may wait for the answer before it closes
            # its side (flightsql-dbapi's execute_update does); what it sends is read after
            yield sql.DoPutUpdateResult(record_count=self.update(cmd.query, [])).SerializeToString()
            for _ in batches:  # a statement takes no batches
                pass
            return
        if isinstance(cmd, sql.CommandPreparedStatementUpdate):
            prepared = self._prepared_of(cmd.prepared_statement_handle)
            rows = []
            for batch in batches:
                rows.extend(check_params(batch, "prepared update parameters"))
            count = self.update(prepared.text, rows or prepared.params, tree=prepared.tree)
        elif isinstance(cmd, sql.CommandStatementIngest):
            count = self.ingest(cmd, batches)
        else:
            raise ProtocolError(f"Flight SQL: {type(cmd).__name__} is not a DoPut command")
        yield sql.DoPutUpdateResult(record_count=count).SerializeToString()

    # ----------------------------------------------------------------------- DoAction
    def action(self, kind: str, body: bytes) -> Iterator[bytes]:
        """A Flight SQL DoAction: the ``Result`` bodies to send."""
        if kind in ("SetSessionOptions", "GetSessionOptions", "CloseSession"):
            yield _session(kind, body)
            return
        if kind == "CancelFlightInfo":
            req = fpb.CancelFlightInfoRequest()
            try:
                req.ParseFromString(body)
            except DecodeError as exc:
                raise ProtocolError(f"CancelFlightInfo: the body does not parse: {exc}") from None
            status = fpb.CANCEL_STATUS_NOT_CANCELLABLE
            for endpoint in req.info.endpoint:
                ticket = unpack(endpoint.ticket.ticket)
                if isinstance(ticket, sql.TicketStatementQuery) and self.runner.cancel(
                        ticket.statement_handle):
                    status = fpb.CANCEL_STATUS_CANCELLED
            yield fpb.CancelFlightInfoResult(status=status).SerializeToString()
            return
        msg = unpack(body)
        if kind == "CreatePreparedStatement" and isinstance(
                msg, sql.ActionCreatePreparedStatementRequest):
            yield pack(self.prepare(msg.query))
        elif kind == "ClosePreparedStatement" and isinstance(
                msg, sql.ActionClosePreparedStatementRequest):
            with self._lock:
                self._prepared.pop(msg.prepared_statement_handle, None)
        else:
            raise ProtocolError(f"{kind}: the body must be a google.protobuf.Any of "
                                f"Action{kind}Request")

    def prepare(self, text: str) -> sql.ActionCreatePreparedStatementResult:
        """CreatePreparedStatement: parse and keep ``text``; a query's result schema is found
        by binding it (NULL parameters) over empty tables of the named tables' schemas."""
        tree = parse_one(text)
        handle = f"p{next(self._ids)}-{self._salt}".encode()
        n = _placeholders(tree)
        out = sql.ActionCreatePreparedStatementResult(prepared_statement_handle=handle)
        if n:
            out.parameter_schema = pa.schema(
                [pa.field(f"${i + 1}", pa.null()) for i in range(n)]).serialize().to_pybytes()
        if is_query(tree):  # bound over empty tables: raises for a bad query, runs nothing
            schema = self.runner.schema_of(text, [None] * n if n else None, tree)
            out.dataset_schema = schema.serialize().to_pybytes()
        with self._lock:
            self._prepared[handle] = _Prepared(handle, text, tree)
        return out

    def _prepared_of(self, handle: bytes) -> _Prepared:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None:
            raise TableNotFound("no prepared statement of this handle: it was closed, or "
                                "the server restarted; prepare it again")
        return prepared

    # ----------------------------------------------------------------------- updates
    def update(self, text: str, params: list[list[Any]], *,
               tree: exp.Expression | None = None) -> int:
        """Run an update statement (once per parameter row); returns the rows it changed."""
        tree = parse_one(text) if tree is None else tree
        kind = statement_kind(tree)
        if kind in ("insert", "update", "delete", "create_table"):
            run = {"insert": self._insert, "update": self._update, "delete": self._delete,
                   "create_table": self._create_table}[kind]
            with self._writing:  # one at a time: each reads what the one before it wrote
                return run(tree, params)
        if isinstance(tree, exp.TruncateTable):  # TRUNCATE t: DELETE FROM t, table by table
            if params:
                raise SqlError("TRUNCATE takes no parameters")
            with self._writing:
                return sum(self._delete(exp.Delete(this=t), []) for t in tree.expressions)
        if kind == "drop_table":
            if params:
                raise SqlError("DROP TABLE takes no parameters")
            return self._drop_table(tree)
        if kind == "create_view":
            if params:
                raise SqlError("CREATE VIEW takes no parameters")
            self.create_view(tree)
            return 0
        if kind == "drop_view":
            if params:
                raise SqlError("DROP VIEW takes no parameters")
            return self._drop_view(tree)
        if kind == "select":
            raise SqlError("a query returns rows: run it with CommandStatementQuery "
                           "(DB-API execute), not as an update")
        word = str(tree.this).split()[0] if isinstance(tree, exp.Command) else tree.key
        raise SqlError(f"{word.upper()}: not supported; Ticktable runs SELECT, INSERT, "
                       f"UPDATE, DELETE and TRUNCATE (keyed tables), CREATE and DROP TABLE, "
                       f"CREATE and DROP VIEW")

    def _start(self, text: str, params: Sequence[Any] | None, *,
               tree: exp.Expression | None = None, where: str = "query",
               given: Mapping[str, pa.Table] | None = None) -> RunningQuery:
        """Start a query once every write answered before it is visible (an INSERT or an
        ingest is answered when journaled, before the cycle that applies it)."""
        self.server.staging.wait_committed()
        return self.runner.start(text, params, tree=tree, where=where, given=given)

    def _held_rows(self, select: str, params: list[list[Any]], where: str, name: str
                   ) -> tuple[pa.Table, pa.Table]:
        """The rows of a query whose first column is :data:`ROW_COLUMN` of table ``name``,
        once per parameter row (once without), and the rows of ``name`` those positions
        are, taken from the query's snapshot: exactly as held, whatever DuckDB makes of
        their values."""
        batched = _select_of_rows(select, params) if len(params) > 1 else None
        if batched is not None:  # executemany: one query over the parameter rows
            sql, given = batched
            self.server.staging.wait_committed()
            query = self.runner.start(sql, None, where=where, rows_of=name, given=given)
            assert query.snapshot is not None
            snapshot = query.snapshot.tables[name]
            answer = pa.Table.from_batches(list(self.runner.batches(query, where)), query.schema)
            return answer, snapshot.take(answer.column(0))
        answers, held = [], []
        rows: list[list[Any] | None] = list(params) or [None]
        for row in rows:
            self.server.staging.wait_committed()
            query = self.runner.start(select, row, where=where, rows_of=name)
            assert query.snapshot is not None
            snapshot = query.snapshot.tables[name]
            answer = pa.Table.from_batches(list(self.runner.batches(query, where)), query.schema)
            answers.append(answer)
            held.append(snapshot.take(answer.column(0)))
        if len(answers) == 1:
            return answers[0], held[0]
        return pa.concat_tables(answers), pa.concat_tables(held)

    def _rows(self, select: str, params: list[list[Any]], where: str) -> pa.Table:
        """The rows of a query, once per parameter row (once without), concatenated."""
        parts = []
        rows: list[list[Any] | None] = list(params) or [None]
        for row in rows:
            query = self._start(select, row, where=where)
            parts.append(pa.Table.from_batches(list(self.runner.batches(query, where)),
                                               query.schema))
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def _insert(self, tree: exp.Expression, params: list[list[Any]]) -> int:
        target = tree.this
        columns: list[str] | None = None
        if isinstance(target, exp.Schema):
            columns = [c.name for c in target.expressions]
            target = target.this
        if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
            raise SqlError("INSERT: name a table of the server")
        entry = self.server.registry.get(target.name)
        where = f"INSERT INTO {quoted(entry.name)}"
        schema = entry.table.schema
        assert isinstance(tree, exp.Insert)
        plan = insert_clauses(tree, entry.name, entry.kind == TableKind.KEYED, schema.names,
                              entry.keys)
        source = tree.expression
        if source is None:
            raise SqlError(f"{where}: VALUES or SELECT expected")
        text = source.sql(dialect="duckdb")
        if isinstance(source, exp.Values):  # a query of its own only inside FROM
            text = f"SELECT * FROM ({text})"
        batched = _values_of_rows(source, params) if len(params) > 1 else None
        if batched is not None:  # executemany: one query over the parameter rows
            sql, given = batched
            query = self._start(sql, None, where=where, given=given)
            rows = pa.Table.from_batches(list(self.runner.batches(query, where)), query.schema)
        else:
            rows = self._rows(text, params, where)
        if plan.by_name:
            columns = rows.column_names
        names = columns if columns is not None else schema.names[:rows.num_columns]
        if len(names) != rows.num_columns:
            raise SqlError(f"{where}: {rows.num_columns} values for {len(names)} columns")
        unknown = [n for n in names if n not in schema.names]
        if unknown:
            raise SqlError(f"{where}: no column(s) {unknown}; columns: {', '.join(schema.names)}")
        arrays = [_fit(rows.column(names.index(f.name)), f, where) if f.name in names
                  else pa.nulls(rows.num_rows, f.type) for f in schema]
        table = pa.Table.from_arrays(arrays, schema=schema)
        if plan.on_conflict is not None:
            return self._merge(entry, table, plan.on_conflict, where)
        mode = PutMode.UPSERT if entry.kind == TableKind.KEYED else PutMode.APPEND
        return self._write(entry.name, mode, table.to_batches())

    def _merge(self, entry: Any, rows: pa.Table, take: tuple[str, ...], where: str) -> int:
        """``INSERT ... ON CONFLICT``: the new keys' rows inserted; a held key's row kept
        (``take`` empty) or given the columns ``take`` from its new row. Written as a DIFF
        against the rows a lookup finds (the staged writes included), again if one changes
        before the commit; answers the rows inserted or changed."""
        keys = entry.keys
        first = _first_of_each(rows.select(keys))
        if len(first) < rows.num_rows:
            if take:
                raise SqlError(f"{where}: ON CONFLICT DO UPDATE meets one key twice in its rows; "
                               f"a row may be updated once per statement")
            rows = rows.take(first)
        table = entry.table

        def build() -> tuple[pa.Table, int]:
            found = table.lookup(rows.select(keys), staged=True)
            hit = found.found
            fresh = rows.filter(pa.array(~hit))
            new = [fresh.column(i) for i in range(fresh.num_columns)]
            if not take or not hit.any():
                return _diff(rows.schema, new, None), fresh.num_rows
            old = found.rows.take(pa.array(found.position[hit]))
            theirs = rows.filter(pa.array(hit))
            changed = [theirs.column(f.name) if f.name in take else old.column(f.name)
                       for f in rows.schema]
            both = [pa.chunked_array(a.chunks + b.chunks, a.type) for a, b in
                    zip(new, changed, strict=True)]
            olds = [old.column(f.name) for f in rows.schema]
            return _diff(rows.schema, both, olds), rows.num_rows

        return self._retract(entry.name, where, build)

    def _delete(self, tree: exp.Expression, params: list[list[Any]]) -> int:
        target = tree.this
        if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
            raise SqlError("DELETE: name a table of the server")
        name = target.name
        for clause, label in (("returning", "RETURNING"), ("limit", "LIMIT"), ("order", "ORDER BY")):
            if tree.args.get(clause):
                raise SqlError(f"DELETE FROM {quoted(name)}: {label} is not supported")
        using = tree.args.get("using") or []  # DELETE FROM t USING u WHERE t.k = u.k
        sources = ", ".join(t.sql(dialect="duckdb") for t in [target, *using])
        # the rows as read, whole: the write retracts them (a row changed since is not deleted)
        row = exp.column(ROW_COLUMN, table=target.alias_or_name, quoted=True)
        select = f"SELECT DISTINCT {row.sql(dialect='duckdb')} FROM {sources}"
        cond = tree.args.get("where")
        if cond is not None:
            select += " " + cond.sql(dialect="duckdb")
        elif not using:  # every row, whatever its values: by key, no row to check
            entry, where = self._keyed(name, "DELETE FROM", "deleted")
            keys = ", ".join(exp.to_identifier(k).sql(dialect="duckdb") for k in entry.keys)
            rows = self._rows(f"SELECT {keys} FROM {target.sql(dialect='duckdb')}", [], where)
            if rows.num_rows:
                self._write(entry.name, PutMode.DELETE, rows.to_batches())
            return rows.num_rows

        def build() -> tuple[pa.Table, int]:  # each attempt: the table may be another now
            entry, where = self._keyed(name, "DELETE FROM", "deleted")
            _, rows = self._held_rows(select, params, where, entry.name)
            if len(params) > 1 and rows.num_rows:  # a row two parameter rows selected, once
                rows = rows.take(_first_of_each(rows.select(entry.keys)))
            schema = entry.table.schema
            return _diff(schema, None, [rows.column(f.name) for f in schema]), rows.num_rows

        return self._retract(name, f"DELETE FROM {quoted(name)}", build)

    def _keyed(self, name: str, verb: str, done: str) -> tuple[Any, str]:
        """The keyed table ``name`` and the statement's name for messages (``UPDATE 't'``),
        or SqlError: ``verb`` (``DELETE FROM``) takes a keyed table, its rows are ``done``
        by key."""
        entry = self.server.registry.get(name)
        where = f"{verb} {quoted(entry.name)}"
        if entry.kind != TableKind.KEYED:
            raise SqlError(f"{where}: rows are {done} by key: {verb.split()[0]} takes a keyed "
                           f"table, and {quoted(entry.name)} is {entry.kind}")
        return entry, where

    def _update(self, tree: exp.Expression, params: list[list[Any]]) -> int:
        assert isinstance(tree, exp.Update)
        name = table_name(tree.this, "UPDATE")

        def build() -> tuple[pa.Table, int]:  # each attempt: the table may be another now
            entry, where = self._keyed(name, "UPDATE", "updated")
            schema = entry.table.schema
            select, sets = update_query(tree, entry.name, schema.names, entry.keys)
            rows, old = self._held_rows(select.sql(dialect="duckdb"), params, where, entry.name)
            if len(params) > 1 and rows.num_rows:  # each row reads the table as before them all
                keys = old.select(entry.keys)
                if len(_first_of_each(keys)) < keys.num_rows:
                    counts = keys.group_by(entry.keys).aggregate([([], "count_all")])
                    twice = counts.filter(pc.greater(counts.column("count_all"), 1))
                    key = tuple(twice.column(k)[0].as_py() for k in entry.keys)
                    raise SqlError(f"{where}: {twice.num_rows} row(s) matched by more than one "
                                   f"parameter row (key {key}); each parameter row reads the "
                                   f"table as it was before the statement: run them one by one")
            held = [old.column(f.name) for f in schema]
            new = [_fit(rows.column(1 + sets.index(f.name)), f, where) if f.name in sets
                   else held[i] for i, f in enumerate(schema)]
            return _diff(schema, new, held), rows.num_rows

        return self._retract(name, f"UPDATE {quoted(name)}", build)

    def _create_table(self, tree: exp.Expression, params: list[list[Any]]) -> int:
        assert isinstance(tree, exp.Create)
        d = table_definition(tree)
        where = f"CREATE TABLE {quoted(d.name)}"
        exists = d.name in self.server.registry.names()
        if d.query is None:
            if params:
                raise SqlError(f"{where}: takes no parameters")
            columns = d.columns_query()
            schema = d.schema(self.runner.schema_of(columns.sql(dialect="duckdb"), None,
                                                    columns, where=where))
            kind = TableKind.KEYED if d.keys else TableKind.APPEND
            if exists and d.replace:
                self._check_replaceable(d.name, where)
                return self._fill(d.name, schema, kind, d.keys, None, replace=True)
            self.server.durability.create_table(d.name, schema, kind, keys=d.keys, capacity=0,
                                                if_not_exists=d.if_not_exists)
            return 0
        if exists and d.if_not_exists:
            return 0  # as DuckDB: the table is left as it is, nothing is written
        if exists and not d.replace:
            raise TableExists(f"{where}: table {quoted(d.name)} already exists; use CREATE OR "
                              f"REPLACE TABLE, INSERT INTO or DROP TABLE first")
        if exists:
            self._check_replaceable(d.name, where)
        rows = self._rows(d.query.sql(dialect="duckdb"), params, where)
        return self._fill(d.name, rows.schema, TableKind.APPEND, [],
                          rows.to_batches() if rows.num_rows else None, replace=d.replace)

    def _check_replaceable(self, name: str, where: str) -> None:
        """``CREATE OR REPLACE TABLE`` replaces source tables only."""
        entry = self.server.registry.get(name)
        if not entry.is_source:
            raise SqlError(f"{where}: {quoted(name)} is a {entry.kind} table, not a source "
                           f"table; drop it first")

    def _fill(self, name: str, schema: pa.Schema, kind: str, keys: list[str],
              batches: Iterable[pa.RecordBatch] | None, *, replace: bool) -> int:
        """A new table ``name`` with the rows of ``batches``, taking the place of the one
        of that name with ``replace``: filled as a pending table (journaled and committed
        as any write), then renamed in one step, so that no reader, and no restart after
        a crash, sees it empty, half filled, or the old table gone and the new one not
        there. A refused row leaves everything as it was."""
        durability = self.server.durability
        pending = pending_name()
        durability.create_table(pending, schema, kind, keys=keys, capacity=0,
                                if_not_exists=False, pending_for=name)
        try:
            mode = PutMode.UPSERT if kind == TableKind.KEYED else PutMode.APPEND
            rows = 0 if batches is None else self._write(pending, mode, batches)
            durability.rename(pending, name, replace=replace)
            return rows
        except BaseException:
            try:
                durability.drop_table(pending)
            except Exception:
                log.debug("dropping %r (for %r) after it was refused", pending, name,
                          exc_info=True)
            raise

    def _drop_table(self, tree: exp.Expression) -> int:
        assert isinstance(tree, exp.Drop)
        registry = self.server.registry
        names = [n for n in dict.fromkeys(drop_targets(tree))
                 if n in registry.names() or not tree.args.get("exists")]
        entries = {n: registry.get(n) for n in names}  # NOT_FOUND before anything is dropped
        for name, entry in entries.items():
            if entry.kind == TableKind.VIEW:
                raise SqlError(f"DROP TABLE: {quoted(name)} is a view; DROP VIEW drops it")
            readers = sorted(c for c in entry.children
                             if c in registry.names() and c not in entries)
            if readers:
                raise SqlError(f"DROP TABLE: {quoted(name)} is read by {readers}; drop them "
                               f"first")
        left = list(entries)
        while left:  # a table that reads another goes before it
            name = next(n for n in left if not any(c in left for c in entries[n].children))
            self.server.durability.drop_table(name)
            left.remove(name)
        return 0

    def _write(self, table: str, mode: PutMode, batches: Iterable[pa.RecordBatch], *,
               conflict: bool = False) -> int:
        """DoPut's path: check and hold every batch under one write id, then commit it.

        With ``conflict``, a commit refused as input (a DIFF that is no longer a valid change
        of the table: another write changed a row it retracts) raises :class:`_Conflict`,
        once the write is aborted."""
        write_id = f"sql-{uuid.uuid4().hex}"
        request = pb.PutRequest(mode=mode.proto, write_id=write_id)
        try:
            for _ in self.server.puts.acks(table, request, batches):
                pass
        except BaseException:
            try:
                self.server.abort(pb.AbortRequest(write_id=write_id))
            except Exception:
                log.debug("aborting write %s", write_id, exc_info=True)
            raise
        # answered once journaled and staged for the next cycle, as DoPut answers; a query
        # waits for that cycle (see _start), so whoever is answered reads what it wrote
        try:
            result = self.server.durability.commit(
                pb.CommitRequest(write_id=write_id, all_slots=True), wait=False)
        except InputError as exc:  # the write stays open: abort it
            try:
                self.server.abort(pb.AbortRequest(write_id=write_id))
            except Exception:
                log.debug("aborting write %s", write_id, exc_info=True)
            if conflict:
                raise _Conflict(str(exc)) from exc
            raise
        return int(result.rows)

    #: Times an UPDATE or DELETE reads and writes again when other writes changed its rows.
    ATTEMPTS = 10

    def _retract(self, table: str, where: str, build: Callable[[], tuple[pa.Table, int]]) -> int:
        """Write the DIFF ``build()`` makes (and the count it answers), again from a new
        snapshot each time a write between its snapshot and its commit changed a row it
        retracts: an UPDATE or DELETE is a change of the rows it read, never of rows it
        did not see (a DoPut to its keys in between is neither lost nor undone)."""
        last: _Conflict | None = None
        for _ in range(self.ATTEMPTS):
            diff, count = build()
            if diff.num_rows == 0:
                return count
            if not takes_triples(diff.schema):  # nested columns: by key, without the check
                plus = pc.equal(diff.column(DIFF), 1)
                if pc.any(plus).as_py():
                    rows = diff.filter(plus).drop_columns([DIFF])
                    self._write(table, PutMode.UPSERT, rows.to_batches())
                else:
                    keys = self.server.registry.get(table).keys
                    self._write(table, PutMode.DELETE, diff.select(keys).to_batches())
                return count
            try:
                self._write(table, PutMode.DIFF, diff.to_batches(), conflict=True)
                return count
            except _Conflict as exc:
                last = exc
                log.info("%s: rows changed since its snapshot (%s); again", where, exc)
                # what changed them may be staged but not yet applied: read after a cycle
                self.server.staging.wait_applied(self.server.registry.graph.step + 1)
        raise Overloaded(f"{where}: other writes changed the rows it reads {self.ATTEMPTS} times "
                         f"in a row; nothing was written, run it again (the last: {last})")

    # ------------------------------------------------------------------------ ingest
    def ingest(self, cmd: sql.CommandStatementIngest, batches: Iterator[pa.RecordBatch]) -> int:
        """CommandStatementIngest: the stream's rows into ``cmd.table``, in one commit."""
        name = cmd.table
        where = f"ingest into {quoted(name)}"
        if not name:
            raise SqlError("ingest: name the target table")
        if cmd.temporary:
            raise SqlError(f"{where}: temporary tables are not supported")
        if (cmd.HasField("catalog") and cmd.catalog) or (
                cmd.HasField("schema") and cmd.schema not in ("", metadata.SCHEMA_NAME)):
            raise SqlError(f"{where}: Ticktable has one schema, {metadata.SCHEMA_NAME!r}, and "
                           f"no catalogs")
        opts = cmd.table_definition_options
        Opts = sql.CommandStatementIngest.TableDefinitionOptions
        first = next(batches, None)
        if first is None:
            return 0
        registry = self.server.registry
        exists = name in registry.names()
        if exists and opts.if_exists == Opts.TABLE_EXISTS_OPTION_FAIL:
            raise TableExists(f"{where}: table {quoted(name)} already exists (mode 'create': "
                              f"use 'append' or 'replace')")
        replace = exists and opts.if_exists == Opts.TABLE_EXISTS_OPTION_REPLACE
        if replace:
            self._check_replaceable(name, where)
        if not exists or replace:  # filled before it is seen: see _fill
            if opts.if_not_exist == Opts.TABLE_NOT_EXIST_OPTION_FAIL and not exists:
                raise TableNotFound(f"{where}: no table {quoted(name)} (mode 'append')")
            keys = [k for k in cmd.options.get("ticktable.keys", "").split(",") if k]
            kind = TableKind.KEYED if keys else TableKind.APPEND
            return self._fill(name, first.schema, kind, keys, itertools.chain((first,), batches),
                              replace=replace)
        entry = registry.get(name)
        if entry.kind not in (TableKind.APPEND, TableKind.KEYED, TableKind.RING):
            raise SqlError(f"{where}: {quoted(name)} is a {entry.kind} table; ingest writes "
                           f"into source tables")
        mode = PutMode.UPSERT if entry.kind == TableKind.KEYED else PutMode.APPEND
        return self._write(name, mode, itertools.chain((first,), batches))

    # ------------------------------------------------------------------------- views
    def create_view(self, tree: exp.Expression) -> str:
        """CREATE VIEW name AS SELECT ...: a live derived table, journaled as its SQL."""
        name_expr = tree.this
        if not isinstance(name_expr, exp.Table) or not isinstance(name_expr.this, exp.Identifier):
            raise SqlError("CREATE VIEW: name the view")
        select = tree.expression
        if not isinstance(select, exp.Query):
            raise SqlError(f"CREATE VIEW {quoted(name_expr.name)}: AS SELECT ... expected")
        replace = bool(tree.args.get("replace"))
        request = tpb.CreateDerivedTableRequest(name=name_expr.name, replace=replace,
                                                sql=select.sql(dialect="duckdb"))
        if not replace and name_expr.name in self.server.registry.names():
            raise TableExists(f"CREATE VIEW: table {quoted(name_expr.name)} already exists; "
                              f"use CREATE OR REPLACE VIEW or DROP VIEW first")
        properties = tree.args.get("properties")
        if properties is not None and any(isinstance(p, exp.TemporaryProperty)
                                          for p in properties.expressions):
            name = self.build_view(request, durable=False)  # it goes with its subscribers
            with self._lock:
                self._temporary[name] = [time.monotonic(), False]
            return name
        return str(self.server.durability.derive(request.SerializeToString(),
                                                 lambda: self.build_view(request)))

    def build_view(self, request: tpb.CreateDerivedTableRequest, *, durable: bool = True) -> str:
        """Compile and register a view's SQL (also how recovery rebuilds it); a durable one
        may not read a temporary view (it could not be rebuilt after a restart)."""
        registry = self.server.registry
        name = request.name or f"view_{next(self._ids)}"
        where = f"CREATE VIEW {quoted(name)}"
        try:
            view = compile_view(request.sql, lambda n: registry.get(n).table, name=name)
        except InputError as exc:
            if isinstance(exc, (SqlError, TableNotFound)) and str(exc).startswith("CREATE VIEW"):
                raise
            raise type(exc)(f"{where}: {exc}") from None
        with self._lock:
            temporary = [p for p in view.parents if p in self._temporary]
        if durable and temporary:
            view.close()
            raise SqlError(f"{where}: reads temporary view(s) {temporary}; a view kept across "
                           f"restarts cannot (make it TEMPORARY too)")
        if request.replace and name in view.parents:
            view.close()
            raise SqlError(f"{where}: a view cannot replace a table it reads")
        try:
            registry.add(name, view.table, TableKind.VIEW, parents=list(view.parents),
                         replace=request.replace)  # a replaced view goes through _dropped
        except BaseException:
            view.close()
            raise
        with self._lock:
            self._views[name] = view
        log.info("view %r created from %s", name, view.parents)
        return name

    def _sweep_forever(self) -> None:
        while not self._closed.wait(self.TEMPORARY_SWEEP):
            try:
                self._sweep()
            except Exception:
                log.exception("sweeping temporary views")

    #: Seconds between two looks at the temporary views.
    TEMPORARY_SWEEP = 0.5
    #: A temporary view nobody subscribed to within this many seconds is dropped.
    TEMPORARY_GRACE = 30.0

    def _sweep(self) -> None:
        """Drop each temporary view whose subscribers all left (or that none came to within
        :attr:`TEMPORARY_GRACE` seconds): a client that died without dropping its view
        (``subscribe_sql``) leaves nothing behind."""
        registry = self.server.registry
        with self._lock:
            temporary = list(self._temporary.items())
        now = time.monotonic()
        for name, state in temporary:
            try:
                entry = registry.get(name)
            except TableNotFound:
                continue
            publisher = entry.publisher
            watched = (publisher is not None and bool(publisher.subscribers)
                       or self.server.filters.watched(name))  # filtered subscriptions too
            if watched:
                state[1] = True
            elif state[1] or now - state[0] > self.TEMPORARY_GRACE:
                if not entry.children:
                    log.info("temporary view %r dropped: no subscriber left", name)
                    try:
                        self._drop(name)
                    except (TableNotFound, InputError):
                        pass  # dropped meanwhile, or another table reads it now

    def subscribed(self, name: str) -> None:
        """A subscription to ``name`` began: a temporary view is dropped once none is left."""
        with self._lock:
            state = self._temporary.get(name)
            if state is not None:
                state[1] = True

    def _drop(self, name: str) -> None:
        """Drop a view: a temporary one from the registry alone (it was never journaled)."""
        with self._lock:
            temporary = name in self._temporary
        if temporary:
            self.server.registry.drop(name)  # closes its operations (_dropped)
        else:
            self.server.durability.drop_table(name)

    def _dropped(self, name: str) -> None:
        """The registry dropped ``name``: close a view's operations, forget its snapshot."""
        with self._lock:
            view = self._views.pop(name, None)
            self._temporary.pop(name, None)
        if view is not None:
            view.close()
        self.runner.snapshots.forget(name)

    def _drop_view(self, tree: exp.Expression) -> int:
        targets = tree.args.get("tables") or ([tree.this] if tree.this is not None else [])
        if len(targets) != 1 or not isinstance(targets[0], exp.Table):
            raise SqlError("DROP VIEW: name one view")
        name = targets[0].name
        registry = self.server.registry
        if name not in registry.names():
            if tree.args.get("exists"):
                return 0
            raise TableNotFound(f"DROP VIEW: no view {quoted(name)}")
        entry = registry.get(name)
        if entry.kind != TableKind.VIEW:
            raise SqlError(f"DROP VIEW: {quoted(name)} is a {entry.kind} table, not a view; "
                           f"DROP TABLE drops it")
        self._drop(name)  # closes its operations (_dropped)
        return 0


class _Conflict(Exception):
    """A DIFF write's commit found a row it retracts changed since its snapshot."""


def _diff(schema: pa.Schema, new: list[pa.ChunkedArray] | None,
          old: list[pa.ChunkedArray] | None) -> pa.Table:
    """The triples that change rows ``old`` into ``new`` (columns of ``schema``): ``-1`` of
    each old row and ``+1`` of each new one (``new`` None: a delete of the old rows; ``old``
    None: an insert of the new). They pair by key, not by position."""
    wide = schema.append(pa.field(DIFF, pa.int64()))
    parts = []
    if old is not None:
        n = len(old[0]) if old else 0
        parts.append(pa.Table.from_arrays([*old, pa.array(np.full(n, -1, np.int64))], schema=wide))
    if new is not None:
        n = len(new[0]) if new else 0
        parts.append(pa.Table.from_arrays([*new, pa.array(np.ones(n, np.int64))], schema=wide))
    return pa.concat_tables(parts)


def _first_of_each(keys: pa.Table) -> pa.Array:
    """The positions of the first row of each distinct key of ``keys``, in order."""
    index = keys.append_column("__sql_i", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    first = index.group_by(keys.column_names, use_threads=False).aggregate([("__sql_i", "min")])
    return pa.array(np.sort(first.column("__sql_i_min").to_numpy()))


def _fit(col: pa.ChunkedArray, f: pa.Field, where: str) -> pa.ChunkedArray:
    """``col`` cast to ``f``'s type, value by value: an integer column into a decimal one
    goes through the widest decimal of its scale (Arrow asks a direct cast for room for any
    integer, ``DECIMAL(8, 2)`` has none for an INTEGER's: ``9`` fits, ``10**7`` does not)."""
    try:
        if pa.types.is_interval(col.type) and pa.types.is_duration(f.type):
            col = _durations(col, f.type)  # DuckDB reads a duration as an INTERVAL
        if pa.types.is_integer(col.type) and pa.types.is_decimal(f.type):
            wide = (pa.decimal128(38, f.type.scale) if f.type.precision <= 38
                    else pa.decimal256(76, f.type.scale))
            col = col.cast(wide)
        return col.cast(f.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SqlError(f"{where}: column {quoted(f.name)}: {col.type} values do not fit "
                       f"{f.type}: {exc}") from None


def _durations(col: pa.ChunkedArray, to: pa.DataType) -> pa.ChunkedArray:
    """DuckDB's INTERVALs (month_day_nano) of a duration column back as durations, value by
    value (Arrow casts none); an interval of months is no duration and is refused."""
    out = []
    for v in col.to_pylist():
        if v is not None and v.months:
            raise pa.ArrowInvalid(f"an interval of {v.months} month(s) is no duration")
        out.append(None if v is None else v.days * 86_400 * 10**9 + v.nanoseconds)
    return pa.chunked_array([pa.array(out, pa.int64()).cast(pa.duration("ns")).cast(to)])


def _session(kind: str, body: bytes) -> bytes:
    """The session actions (a ``Result`` body). Ticktable keeps no session: ``schema`` is
    ``main`` and there is no catalog, whoever asks (ADBC's ``adbc_current_db_schema`` reads
    the option ``schema``); setting either to what it is succeeds and changes nothing,
    another value is ``INVALID_VALUE``, another option ``INVALID_NAME``."""
    if kind == "CloseSession":  # nothing held: closed as soon as asked
        return fpb.CloseSessionResult(status=fpb.CloseSessionResult.CLOSED).SerializeToString()
    if kind == "GetSessionOptions":
        out = fpb.GetSessionOptionsResult()
        out.session_options["schema"].string_value = metadata.SCHEMA_NAME
        return out.SerializeToString()
    req = fpb.SetSessionOptionsRequest()
    try:
        req.ParseFromString(body)
    except DecodeError as exc:
        raise ProtocolError(f"SetSessionOptions: the body does not parse: {exc}") from None
    result = fpb.SetSessionOptionsResult()
    Errors = fpb.SetSessionOptionsResult
    for name, value in req.session_options.items():
        given = value.string_value if value.WhichOneof("option_value") == "string_value" else None
        if name not in ("schema", "catalog"):
            result.errors[name].value = Errors.INVALID_NAME
        elif given not in ((metadata.SCHEMA_NAME,) if name == "schema" else (None, "")):
            result.errors[name].value = Errors.INVALID_VALUE
    return result.SerializeToString()


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows (pyarrow builds no empty dense union from a list: SqlInfo's)."""
    return pa.RecordBatch.from_arrays([_empty_array(f.type) for f in schema], schema=schema)


def _empty_array(typ: pa.DataType) -> pa.Array:
    if pa.types.is_union(typ):
        children = [_empty_array(typ.field(i).type) for i in range(typ.num_fields)]
        return pa.UnionArray.from_dense(pa.array([], pa.int8()), pa.array([], pa.int32()),
                                        children, [typ.field(i).name for i in range(typ.num_fields)],
                                        list(typ.type_codes))
    return pa.array([], typ)


def _read_only(what: str) -> PermissionDenied:
    return PermissionDenied(f"the read-only token may not {what}: writes, creates, drops and "
                            f"views need the full token")
