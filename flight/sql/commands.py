"""Flight SQL's commands on the wire: a ``google.protobuf.Any`` holding a message of
``flight_sql.proto`` (:func:`pack`, :func:`unpack`), and the DoAction types Flight SQL adds.

Kept apart from :mod:`flight.sql.service` so that the transport and the token check
(:mod:`flight.rpc.flight_service`, :mod:`flight.rpc.auth`) tell a Flight SQL call from a
plain Flight one without importing the SQL engine (sqlglot, DuckDB): a server builds its
SQL service on the first call that needs it (:attr:`flight.server.TicktableServer.sql`).
"""

from __future__ import annotations

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from engine.errors import ProtocolError
from flight.limits import quoted
from flight.pb import flight_sql_pb2 as sql

__all__ = ["SQL_ACTION_TYPES", "pack", "unpack"]

_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

#: The DoAction types Flight SQL adds (all allowed to the read token: a prepared update
#: still needs a DoPut to run, which the read token may not make).
SQL_ACTION_TYPES = ("CreatePreparedStatement", "ClosePreparedStatement", "CancelFlightInfo",
                    "SetSessionOptions", "GetSessionOptions", "CloseSession")


def pack(message: Message) -> bytes:
    """``message`` in a serialized ``google.protobuf.Any``."""
    out = any_pb2.Any()
    out.Pack(message)
    return out.SerializeToString()


_COMMANDS: dict[str, type[Message]] = {m.DESCRIPTOR.name: m for m in (
    sql.CommandGetSqlInfo, sql.CommandGetXdbcTypeInfo, sql.CommandGetCatalogs,
    sql.CommandGetDbSchemas, sql.CommandGetTables, sql.CommandGetTableTypes,
    sql.CommandGetPrimaryKeys, sql.CommandGetExportedKeys, sql.CommandGetImportedKeys,
    sql.CommandGetCrossReference, sql.CommandStatementQuery, sql.CommandPreparedStatementQuery,
    sql.CommandStatementUpdate, sql.CommandPreparedStatementUpdate, sql.CommandStatementIngest,
    sql.TicketStatementQuery, sql.ActionCreatePreparedStatementRequest,
    sql.ActionClosePreparedStatementRequest)}


def unpack(raw: bytes) -> Message | None:
    """The Flight SQL message in a serialized ``Any``; ``None`` when ``raw`` is not one.

    Raises
    ------
    ProtocolError
        For an ``Any`` of a Flight SQL type this server does not take, or a body that does
        not parse.
    """
    holder = any_pb2.Any()
    try:
        holder.ParseFromString(raw)
    except (DecodeError, ValueError):
        return None
    if not holder.type_url.startswith(_PREFIX):
        return None
    name = holder.type_url[len(_PREFIX):]
    cls = _COMMANDS.get(name)
    if cls is None:
        raise ProtocolError(f"Flight SQL: {quoted(name)} is not supported by Ticktable")
    out = cls()
    try:
        out.ParseFromString(holder.value)
    except DecodeError as exc:
        raise ProtocolError(f"Flight SQL: {name} does not parse: {exc}") from None
    return out
