"""Bearer-token authentication and read-only access for every service on the server's one port.

Every call must carry ``authorization: Bearer <token>`` when the server has a token; one
gRPC server interceptor checks it before any handler runs, for Arrow Flight (including
``Handshake``), the TableService and reflection alike. A call without a right token gets
UNAUTHENTICATED and nothing else (:class:`~engine.errors.Unauthenticated` through the
server's one error table, :mod:`flight.errors`). The gRPC health service is exempt so
readiness probes need no secret.

Two tokens: the *token* may call everything; the *read token* (optional) may read and
nothing else. The interceptor decides per method, from :data:`READ_METHODS`, and for
``DoAction`` per action type, from :data:`READ_ACTIONS`: the rows of
:data:`flight.wire.ACTIONS` marked ``read_only`` (checked before the action's handler
runs); anything else answers PERMISSION_DENIED (:class:`~engine.errors.PermissionDenied`):

==================  =====================================================================
read token may      Flight ``Handshake``, ``ListFlights``, ``GetFlightInfo``,
                    ``PollFlightInfo``, ``GetSchema``, ``DoGet`` (snapshots),
                    ``DoExchange`` (subscriptions), ``ListActions``, ``DoAction`` of a
                    read-only action (``stats``); TableService ``ListTables``; server
                    reflection
                    Flight SQL: queries (``GetFlightInfo`` of a query), metadata, the
                    actions ``CreatePreparedStatement``, ``ClosePreparedStatement``,
                    ``CancelFlightInfo``, and ``DoPut`` of a prepared query's parameters
                    (:func:`is_read_only` lets :mod:`flight.sql` refuse the rest)
only the token      ``DoPut`` (but a prepared query's parameters), every other action
                    (``create_table``, ``commit``, ...; an unknown one too), TableService
                    ``CreateDerivedTable`` (a composition) and ``DropTable``; Flight SQL
                    updates, ingestion and views
==================  =====================================================================

Tokens are compared with :func:`hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hmac
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pyarrow.flight as flight

from engine.errors import PermissionDenied, Unauthenticated
from flight.errors import abort
from flight.pb import flight_sql_pb2 as sql
from flight.rpc.framing import descriptor_of, parse_flight_data
from flight.sql.commands import SQL_ACTION_TYPES, unpack
from flight.wire import ACTIONS

__all__ = ["READ_ACTIONS", "READ_METHODS", "BearerTokenInterceptor", "bearer_header",
           "is_read_only"]

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_FLIGHT = "/arrow.flight.protocol.FlightService/"
_DO_ACTION = _FLIGHT + "DoAction"
_DO_PUT = _FLIGHT + "DoPut"
_HINT = ("missing or wrong bearer token: send the header 'authorization: Bearer <token>' "
         "(ticktable.connect(uri, token=...))")

#: The methods a call with the read token may make (DoAction: only :data:`READ_ACTIONS`).
READ_METHODS = frozenset({
    *(_FLIGHT + m for m in ("Handshake", "ListFlights", "GetFlightInfo", "PollFlightInfo",
                            "GetSchema", "DoGet", "DoExchange", "ListActions", "DoAction",
                            "DoPut")),
    "/ticktable_proto.v1.TableService/ListTables",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
})

#: The Flight actions a call with the read token may run.
READ_ACTIONS = frozenset([*(a.name for a in ACTIONS if a.read_only), *SQL_ACTION_TYPES])


def bearer_header(token: str) -> tuple[bytes, bytes]:
    """The header a client sends: ``(b"authorization", b"Bearer <token>")``."""
    return b"authorization", f"Bearer {token}".encode()


def _token_ok(expected: bytes, values: list[str] | list[bytes] | None) -> bool:
    if not values:
        return False
    for v in values:
        raw = v.encode() if isinstance(v, str) else v
        if raw[:7].lower() == b"bearer " and hmac.compare_digest(raw[7:].strip(), expected):
            return True
    return False


def _refusal(kind: tuple[bool, bool], exc: Exception) -> Any:
    """A handler of the method's streaming kind answering ``exc``'s status at once.

    The kind must match (request_streaming, response_streaming), or gRPC would wait for a
    request the client never sends.
    """
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        abort(context, exc)

    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    return make(refuse)


def _denied(what: str) -> PermissionDenied:
    return PermissionDenied(f"the read-only token may not {what}: writes, creates, drops and "
                            f"compositions need the full token")


def _read_actions_only(handler: Any) -> Any:
    """``DoAction``'s handler, refusing the actions a read-only call may not run."""
    run = handler.unary_stream

    def behavior(action: Any, context: grpc.ServicerContext) -> Any:
        if action.type not in READ_ACTIONS:
            abort(context, _denied(f"run action {action.type[:100]!r}"))
        return run(action, context)

    return grpc.unary_stream_rpc_method_handler(
        behavior, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


def _prepared_parameters_only(handler: Any) -> Any:
    """``DoPut``'s handler for a read-only call: only a prepared query's parameters (the
    first message's descriptor holds a Flight SQL ``CommandPreparedStatementQuery``)."""
    run = handler.stream_stream

    def behavior(messages: Iterator[Any], context: grpc.ServicerContext) -> Any:
        first = next(messages, None)
        if first is not None:
            try:
                descriptor = descriptor_of(parse_flight_data(first).descriptor)
                cmd = (unpack(descriptor.command) if descriptor is not None
                       and descriptor.descriptor_type == flight.DescriptorType.CMD else None)
            except Exception:
                cmd = None
            if not isinstance(cmd, sql.CommandPreparedStatementQuery):
                abort(context, _denied(f"call {_DO_PUT}"))
            messages = itertools.chain((first,), messages)
        return run(messages, context)

    return grpc.stream_stream_rpc_method_handler(
        behavior, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


def is_read_only(metadata: Any, token: str | None, read_token: str | None) -> bool:
    """Whether a call's ``metadata`` carries the read token (and not the full one)."""
    if not token or not read_token:
        return False
    values = [v for k, v in metadata or () if k.lower() == "authorization"]
    return not _token_ok(token.encode(), values) and _token_ok(read_token.encode(), values)


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """gRPC server interceptor: ``Bearer <token>`` may call everything, ``Bearer
    <read_token>`` only :data:`READ_METHODS`; other calls are refused (health is exempt).

    Parameters
    ----------
    token
        The full-access token.
    read_token
        The read-only token (``None``: there is none).
    """

    def __init__(self, token: str, read_token: str | None = None) -> None:
        self._token = token.encode()
        self._read_token = read_token.encode() if read_token else None

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_HEALTH_PREFIX):
            return handler
        values = [v for k, v in handler_call_details.invocation_metadata or ()
                  if k.lower() == "authorization"]
        if _token_ok(self._token, values):
            return handler
        kind = (bool(handler.request_streaming), bool(handler.response_streaming))
        if self._read_token is None or not _token_ok(self._read_token, values):
            return _refusal(kind, Unauthenticated(_HINT))
        if method not in READ_METHODS:
            return _refusal(kind, _denied(f"call {method}"))
        if method == _DO_ACTION:
            return _read_actions_only(handler)
        if method == _DO_PUT:
            return _prepared_parameters_only(handler)
        return handler
