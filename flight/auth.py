"""Bearer-token authentication for every service on the server's one port.

Every call must carry ``authorization: Bearer <token>`` when the server has a token; one
gRPC server interceptor checks it before any handler runs, for Arrow Flight (including
``Handshake``), the TableService and reflection alike. A call without the right token
gets UNAUTHENTICATED and nothing else (:class:`~engine.errors.Unauthenticated` through
the server's one error table, :mod:`flight.errors`). The gRPC health service is exempt
so readiness probes need no secret.

Tokens are compared with :func:`hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

from engine.errors import Unauthenticated
from flight.errors import abort

__all__ = ["BearerTokenInterceptor", "bearer_header"]

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_HINT = ("missing or wrong bearer token: send the header 'authorization: Bearer <token>' "
         "(ticktable.connect(uri, token=...))")


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


def _deny(request: Any, context: grpc.ServicerContext) -> Any:
    abort(context, Unauthenticated(_HINT))


# one refusal per kind of method, so a streaming call is refused as a stream: the handler
# must match (request_streaming, response_streaming) or gRPC would wait for a request the
# client never sends
_DENY = {
    (False, False): grpc.unary_unary_rpc_method_handler(_deny),
    (False, True): grpc.unary_stream_rpc_method_handler(_deny),
    (True, False): grpc.stream_unary_rpc_method_handler(_deny),
    (True, True): grpc.stream_stream_rpc_method_handler(_deny),
}


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """gRPC server interceptor refusing calls without ``Bearer <token>`` (health is exempt)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_HEALTH_PREFIX):
            return handler
        values = [v for k, v in handler_call_details.invocation_metadata or ()
                  if k.lower() == "authorization"]
        if _token_ok(self._token, values):
            return handler
        return _DENY[(bool(handler.request_streaming), bool(handler.response_streaming))]
