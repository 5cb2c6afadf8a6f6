"""The gRPC TableService: derived live tables built server-side, plus gRPC health.

``CreateDerivedTable`` applies a chain of :class:`Operation` messages to a named parent
table, with the engine's fluent API, and registers the result in the server's
:class:`~flight.streams.registry.TableRegistry` as a ``derived`` table that updates every cycle
like any other. Joins and merges name other registry tables; all tables a derived table
reads are its registry parents, so none of them can be dropped while it lives.
Expressions arrive as Substrait (:mod:`flight.substrait`).

Operation messages, field by field (``table_service.proto``):

* ``where``: ``predicate`` holds exactly one boolean expression;
* ``update`` / ``select`` / ``view``: ``columns`` pass through (select/view), then the
  named ``expressions`` in their order; ``drop_columns``: ``columns`` only;
* ``slice``: ``kind`` ``"head"`` / ``"tail"`` take ``n`` in ``start`` (no ``stop``);
  ``"slice"`` takes ``start`` and, when ``has_stop``, ``stop`` (negative counts from the end);
* ``join``: ``kind`` ``natural`` / ``exact`` / ``inner`` / ``left_outer``; empty ``joins``
  brings every right column but the keys;
* ``agg_by``: ``op`` any kind of :data:`engine.ops.aggregate._kinds.KINDS`, with the
  ``column``, ``weight`` and ``p`` the kind takes; ``name`` defaults as the kind says;
* ``by_keys``: ``first_by`` / ``last_by`` / ``count_by`` (``name`` defaults to ``"count"``).

Errors become gRPC status codes through the server's one table (:mod:`flight.errors`); the
message names the table or column and the way out. Nothing is registered, and every table
the chain created is detached again, when any step fails.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engine.errors import InputError, ProtocolError, TableExists
from flight import substrait
from flight.errors import abort
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.wire import TableKind

# imported dynamically so mypy does not check the generated stub, whose ``type: ignore``
# comments assume types-grpcio (not installed: ``grpc`` is untyped here)
tgrpc: Any = importlib.import_module("flight.pb.table_service_pb2_grpc")

if TYPE_CHECKING:
    from engine.table import Table
    from flight.durability.durable import Durability
    from flight.streams.registry import TableRegistry

__all__ = ["TableServiceServicer", "add_table_service", "derived_builder"]

log = logging.getLogger(__name__)

SERVICE_NAME = "ticktable_proto.v1.TableService"
_JOIN_KINDS = ("natural", "exact", "inner", "left_outer")
_SLICE_KINDS = ("head", "tail", "slice")
_BY_KINDS = ("first_by", "last_by", "count_by")


def _with_step(exc: InputError, step: str) -> InputError:
    """``exc`` again (same class), its message prefixed with the step that raised it."""
    return type(exc)(f"{step}: {exc}")


class TableServiceServicer:
    """Builds, lists and drops the registry's derived tables over gRPC.

    Parameters
    ----------
    registry
        The server's tables; derived tables are added to it.
    durability
        Journals each derived table's definition before building it, so it is rebuilt
        after a restart (``None``: built at once, not kept).
    """

    def __init__(self, registry: TableRegistry, durability: Durability | None = None) -> None:
        self.registry = registry
        self.durability = durability
        self._counter = itertools.count(1)
        self._naming = threading.Lock()

    # handlers -------------------------------------------------------------------------
    def CreateDerivedTable(self, request: tpb.CreateDerivedTableRequest,
                           context: grpc.ServicerContext) -> tpb.CreateDerivedTableResponse:
        try:
            if self.durability is not None and self.durability.durable:
                named = tpb.CreateDerivedTableRequest()
                named.CopyFrom(request)
                if not named.name:  # journaled with its name, so a replay picks the same one
                    named.name = self._free_name()
                name = self.durability.derive(named.SerializeToString(),
                                              lambda: self.create(named)[0])
                table = self.registry.get(name).table
            else:
                name, table = self.create(request)
            return tpb.CreateDerivedTableResponse(name=name,
                                                  schema=table.schema.serialize().to_pybytes())
        except Exception as exc:
            abort(context, exc)

    def _free_name(self) -> str:
        with self._naming:
            while True:
                name = f"derived_{next(self._counter)}"
                if name not in self.registry.names():
                    return name

    def ListTables(self, request: tpb.ListTablesRequest,
                   context: grpc.ServicerContext) -> tpb.ListTablesResponse:
        try:
            infos = [
                tpb.TableInfo(name=e.name, schema=e.table.schema.serialize().to_pybytes(),
                              size=e.table.size, kind=e.kind, keys=e.keys,
                              parent=e.parents[0] if e.parents else "")
                for e in self.registry.entries()
            ]
            return tpb.ListTablesResponse(tables=infos)
        except Exception as exc:
            abort(context, exc)

    def DropTable(self, request: pb.DropTableRequest,
                  context: grpc.ServicerContext) -> tpb.DropTableResponse:
        try:
            if self.durability is not None:
                dropped = self.durability.drop_table(request.name)
            else:
                dropped = self.registry.drop(request.name)
            if dropped:
                log.info("table %r dropped", request.name)
            return tpb.DropTableResponse(dropped=dropped)
        except Exception as exc:
            abort(context, exc)

    # building -------------------------------------------------------------------------
    def create(self, request: tpb.CreateDerivedTableRequest) -> tuple[str, Table]:
        """Build the chain of ``request`` and register it; returns its name and table.

        Raises
        ------
        TableExists
            If ``request.name`` is taken and ``request.replace`` is false.
        TableNotFound
            If the parent, or a table a join or merge names, does not exist.
        InputError
            If an operation does not fit its input (message prefixed with the step).
        """
        if not request.parent:
            raise ProtocolError("CreateDerivedTable needs a parent table name")
        if request.name and not request.replace and request.name in self.registry.names():
            raise self._exists(request.name)
        parents = [request.parent]
        root = self.registry.get(request.parent).table
        created: list[Table] = []
        try:
            table = root
            for i, op in enumerate(request.ops):
                kind = op.WhichOneof("op") or "unset"
                try:
                    table = self._apply(table, op, parents)
                except InputError as exc:
                    raise _with_step(exc, f"operation {i} ({kind}) on {request.parent!r}") \
                        from exc
                created.append(table)
            if not created:
                table = root.view()  # a table of its own: registering renames it
                created.append(table)
            name = self._register(request, table, parents)
        except BaseException:
            for t in reversed(created):  # detach the chain: nothing reads it
                t.close()
            raise
        log.info("derived table %r created from %s with %d operation(s)", name, parents,
                 len(request.ops))
        return name, table

    def _exists(self, name: str) -> TableExists:
        return TableExists(f"table {name!r} already exists; drop it first, pick another name, "
                           f"or set replace")

    def _register(self, request: tpb.CreateDerivedTableRequest, table: Table,
                  parents: list[str]) -> str:
        if request.name:
            if request.replace and request.name in parents:
                raise InputError(f"cannot replace table {request.name!r} with a table that reads "
                                 f"it; pick another name")
            try:
                self.registry.add(request.name, table, TableKind.DERIVED, parents=parents,
                                  replace=request.replace)
            except TableExists as exc:  # taken since the check in create()
                raise self._exists(request.name) from exc
            return request.name
        while True:  # pick a free name; another call may take one between check and add
            name = f"derived_{next(self._counter)}"
            if name in self.registry.names():
                continue
            try:
                self.registry.add(name, table, TableKind.DERIVED, parents=parents)
            except TableExists:
                continue
            return name

    def _other(self, name: str, parents: list[str], what: str) -> Table:
        if not name:
            raise ProtocolError(f"{what} needs the name of another table")
        table = self.registry.get(name).table
        if name not in parents:
            parents.append(name)
        return table

    def _apply(self, table: Table, op: tpb.Operation, parents: list[str]) -> Table:
        """``table`` with one operation applied (a new derived table)."""
        kind = op.WhichOneof("op")
        if kind == "where":
            pred = substrait.decode_predicate(op.where.predicate, "where predicate")
            return table.where(pred)
        if kind in ("update", "select", "view"):
            spec: tpb.NamedExpressions = getattr(op, kind)
            exprs: dict[str, Any] = {}
            if spec.expressions:
                exprs = dict(substrait.decode(spec.expressions)[0])
            if kind == "update":
                if spec.columns:
                    raise ProtocolError("update takes expressions only; use select or view to "
                                        "pick columns")
                return table.update(**exprs)
            if kind == "select":
                return table.select(*spec.columns, **exprs)
            return table.view(*spec.columns, **exprs)
        if kind == "drop_columns":
            if op.drop_columns.expressions:
                raise ProtocolError("drop_columns takes column names only (columns)")
            return table.drop_columns(*op.drop_columns.columns)
        if kind == "rename":
            return table.rename_columns(dict(op.rename.mapping))
        if kind == "sort":
            desc: bool | list[bool] = list(op.sort.descending) if op.sort.descending else False
            return table.sort(list(op.sort.by), desc)
        if kind == "slice":
            return self._slice(table, op.slice)
        if kind == "join":
            return self._join(table, op.join, parents)
        if kind == "agg_by":
            return self._agg_by(table, op.agg_by)
        if kind == "by_keys":
            return self._by_keys(table, op.by_keys)
        if kind == "merge_with":
            return table.merge(self._other(op.merge_with, parents, "merge_with"))
        raise ProtocolError("an Operation has no operation set (where, update, select, ...)")

    @staticmethod
    def _slice(table: Table, s: tpb.Slice) -> Table:
        if s.kind in ("head", "tail"):
            if s.has_stop:
                raise ProtocolError(f"{s.kind} takes n in 'start' and no stop")
            return table.head(s.start) if s.kind == "head" else table.tail(s.start)
        if s.kind == "slice":
            return table.slice(s.start, s.stop if s.has_stop else None)
        raise ProtocolError(f"unknown slice kind {s.kind!r}; use one of {_SLICE_KINDS}")

    def _join(self, table: Table, j: tpb.Join, parents: list[str]) -> Table:
        if j.kind not in _JOIN_KINDS:
            raise ProtocolError(f"unknown join kind {j.kind!r}; use one of {_JOIN_KINDS}")
        right = self._other(j.right, parents, f"{j.kind} join")
        on: Sequence[str] = list(j.on)
        joins = list(j.joins) or None
        if j.kind == "natural":
            return table.natural_join(right, on, joins)
        if j.kind == "exact":
            return table.exact_join(right, on, joins)
        if j.kind == "inner":
            return table.join(right, on, joins)
        return table.left_outer_join(right, on, joins)

    @staticmethod
    def _agg_by(table: Table, a: tpb.AggBy) -> Table:
        from engine.ops.aggregate.spec import make_agg

        # any kind of the engine's registry; it checks the parameters (SchemaError)
        aggs = [make_agg(spec.op, spec.column or None, spec.name or None,
                         weight=spec.weight or None, p=spec.p if spec.HasField("p") else None,
                         order=spec.order or None)
                for spec in a.aggs]
        return table.agg_by(aggs, list(a.by))

    @staticmethod
    def _by_keys(table: Table, b: tpb.ByKeys) -> Table:
        if b.kind == "first_by":
            return table.first_by(list(b.by))
        if b.kind == "last_by":
            return table.last_by(list(b.by))
        if b.kind == "count_by":
            return table.count_by(b.name or "count", list(b.by))
        raise ProtocolError(f"unknown by_keys kind {b.kind!r}; use one of {_BY_KINDS}")


def add_table_service(server: grpc.Server, registry: TableRegistry, *,
                      durability: Durability | None = None) -> health.HealthServicer:
    """Add the TableService and the standard health service to ``server``.

    Health reports SERVING for ``""`` and ``"ticktable_proto.v1.TableService"`` (and whatever
    the caller sets later) and needs no token (readiness probes).

    Parameters
    ----------
    server
        The server (not started yet).
    registry
        The server's tables.
    durability
        Keeps derived tables' definitions across restarts (see :class:`TableServiceServicer`).

    Returns
    -------
    HealthServicer
        The health service, to set other services' status on.
    """
    tgrpc.add_TableServiceServicer_to_server(TableServiceServicer(registry, durability), server)
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    for service in ("", SERVICE_NAME):
        checker.set(service, health_pb2.HealthCheckResponse.SERVING)
    return checker


def derived_builder(registry: TableRegistry,
                    views: Callable[[tpb.CreateDerivedTableRequest], str] | None = None
                    ) -> Callable[[bytes], str]:
    """How recovery rebuilds a derived table from its journaled definition.

    Returns a function taking a serialized ``CreateDerivedTableRequest`` (with its name
    set) that builds and registers the table and returns its name; a SQL view's (``sql``
    set) is built by ``views`` (:meth:`flight.sql.service.FlightSqlService.build_view`).
    """
    servicer = TableServiceServicer(registry)

    def build(request: bytes) -> str:
        req = tpb.CreateDerivedTableRequest()
        req.ParseFromString(request)
        if req.sql:
            if views is None:
                raise InputError(f"view {req.name!r} cannot be rebuilt: no SQL service")
            return views(req)
        return servicer.create(req)[0]

    return build
