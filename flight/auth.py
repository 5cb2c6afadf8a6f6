"""Bearer-token authentication for the Flight server and the gRPC TableService.

Every call must carry ``authorization: Bearer <token>`` when the server has a token. The
Flight side checks it in a server middleware (``start_call`` runs before any handler,
including ``Handshake``); the gRPC side in a server interceptor. A call without the right
token gets UNAUTHENTICATED and nothing else: no handler runs (both sides raise
:class:`~engine.errors.Unauthenticated` through the server's one error table,
:mod:`flight.errors`). The gRPC health service is exempt so readiness probes need no secret.

Tokens are compared with :func:`hmac.compare_digest` (constant time).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc
import pyarrow.flight as flight

from engine.errors import Unauthenticated
from flight.errors import abort, to_flight_error

__all__ = ["BearerTokenInterceptor", "BearerTokenMiddlewareFactory", "bearer_header"]

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_FLIGHT_HINT = ("missing or wrong bearer token: send the header 'authorization: Bearer <token>' "
                "(ticktable.connect(uri, token=...))")
_GRPC_HINT = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"


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


class _Middleware(flight.ServerMiddleware):  # type: ignore[misc]
    pass


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Flight middleware factory refusing calls without ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token.encode()

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> flight.ServerMiddleware:
        if not _token_ok(self._token, headers.get("authorization")):
            raise to_flight_error(Unauthenticated(_FLIGHT_HINT))
        return _Middleware()


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """gRPC server interceptor refusing calls without ``Bearer <token>`` (health is exempt)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            abort(context, Unauthenticated(_GRPC_HINT))

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        if handler_call_details.method.startswith(_HEALTH_PREFIX):
            return continuation(handler_call_details)
        values = [v for k, v in handler_call_details.invocation_metadata or ()
                  if k.lower() == "authorization"]
        if not _token_ok(self._token, values):
            return self._deny
        return continuation(handler_call_details)
