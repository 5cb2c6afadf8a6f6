"""One log line per call's start and end, and errors counted by code, for every service.

:class:`CallLog` is a gRPC server interceptor: it wraps each handler so that, whatever the
service (Arrow Flight, the TableService, reflection), a call's start is logged with its
method and the client's peer address, and its end with its status code and duration. An
error answer is logged at INFO with its one-line message (which, for a server bug, carries
the reference id whose traceback is logged by :mod:`flight.errors`), and counted in the
server's :class:`~flight.metrics.Metrics`. Health checks are not logged (probes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from flight.metrics import Metrics

__all__ = ["CallLog"]

log = logging.getLogger("ticktable.calls")

_QUIET = "/grpc.health.v1.Health/"


class CallLog(grpc.ServerInterceptor):  # type: ignore[misc]
    """Logs each call's start and end (peer, method, code) and counts error answers."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method.startswith(_QUIET):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), handler.request_deserializer,
                handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary), handler.request_deserializer,
                handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._stream(method, handler.stream_stream), handler.request_deserializer,
            handler.response_serializer)

    def _unary(self, method: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            t0 = self._start(method, context)
            try:
                return behavior(request, context)
            finally:
                self._end(method, context, t0)

        return run

    def _stream(self, method: str,
                behavior: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            t0 = self._start(method, context)
            try:
                yield from behavior(request, context)
            finally:
                self._end(method, context, t0)

        return run

    def _start(self, method: str, context: grpc.ServicerContext) -> float:
        log.debug("call %s from %s", method, context.peer())
        return time.monotonic()

    def _end(self, method: str, context: grpc.ServicerContext, t0: float) -> None:
        code = context.code()
        seconds = time.monotonic() - t0
        if code is None or code == grpc.StatusCode.OK:
            if not context.is_active() and method in ("DoExchange", "DoPut", "DoGet"):
                log.debug("call %s from %s ended by the client after %.3f s", method,
                          context.peer(), seconds)
            else:
                log.debug("call %s from %s done in %.3f s", method, context.peer(), seconds)
            return
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        if self.metrics is not None:
            self.metrics.on_error(name)
        log.info("call %s from %s answered %s after %.3f s: %s", method, context.peer(), name,
                 seconds, context.details() or "")
