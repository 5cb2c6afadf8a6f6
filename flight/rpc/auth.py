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
only the token      ``DoPut``, every other action (``create_table``, ``commit``, ...; an
                    unknown one too), TableService ``CreateDerivedTable`` (a
                    composition) and ``DropTable``
==================  =====================================================================

Tokens are compared with :func:`hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

from engine.errors import PermissionDenied, Unauthenticated
from flight.errors import abort
from flight.wire import ACTIONS

__all__ = ["READ_ACTIONS", "READ_METHODS", "BearerTokenInterceptor", "bearer_header"]

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_FLIGHT = "/arrow.flight.protocol.FlightService/"
_DO_ACTION = _FLIGHT + "DoAction"
_HINT = ("missing or wrong bearer token: send the header 'authorization: Bearer <token>' "
         "(ticktable.connect(uri, token=...))")

#: The methods a call with the read token may make (DoAction: only :data:`READ_ACTIONS`).
READ_METHODS = frozenset({
    *(_FLIGHT + m for m in ("Handshake", "ListFlights", "GetFlightInfo", "PollFlightInfo",
                            "GetSchema", "DoGet", "DoExchange", "ListActions", "DoAction")),
    "/ticktable_proto.v1.TableService/ListTables",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
})

#: The Flight actions a call with the read token may run.
READ_ACTIONS = frozenset(a.name for a in ACTIONS if a.read_only)


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
        return handler
