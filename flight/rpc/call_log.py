"""One log line per call's start and end, errors counted by code, and request messages
that do not parse answered INVALID_ARGUMENT, for every service.

:class:`CallLog` is a gRPC server interceptor: it wraps each handler so that, whatever the
service (Arrow Flight, the TableService, reflection), a call's start is logged with its
method and the client's peer address, and its end with its status code and duration. An
error answer is logged at INFO with its one-line message (which, for a server bug, carries
the reference id whose traceback is logged by :mod:`flight.errors`), and counted in the
server's :class:`~flight.metrics.Metrics`. Health checks are not logged (probes).

Request messages are decoded leniently: gRPC would answer a message its deserializer
cannot parse with INTERNAL ("Exception deserializing request!") and, for a stream of
requests, leave the call hanging; here the handler is not run and the call answers
INVALID_ARGUMENT naming the method and the message type.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from engine.errors import ProtocolError
from flight.errors import abort
from flight.metrics import Metrics
from flight.rpc.quiet import forget, is_quiet

__all__ = ["CallLog"]


class _Undecodable:
    """A request message its deserializer could not parse."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


def _lenient(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    kind = getattr(getattr(decode, "__self__", None), "__name__", None) or "request"

    def run(raw: bytes) -> Any:
        try:
            return decode(raw)
        except Exception:
            return _Undecodable(kind)

    return run


class _Malformed(ProtocolError):
    """A request message that does not parse (INVALID_ARGUMENT)."""

    def __init__(self, method: str, bad: _Undecodable) -> None:
        super().__init__(f"{method}: the {bad.kind} message does not parse")


def _checked(method: str, request: Any, context: grpc.ServicerContext, streaming: bool) -> Any:
    """The request, or the stream of requests, refusing a message that did not parse."""
    if not streaming:
        if isinstance(request, _Undecodable):
            abort(context, _Malformed(method, request))
        return request

    def each() -> Iterator[Any]:  # raised where the handler reads it; answered by CallLog
        for r in request:
            if isinstance(r, _Undecodable):
                raise _Malformed(method, r)
            yield r

    return each()

log = logging.getLogger("ticktable.calls")

_QUIET = "/grpc.health.v1.Health/"
# a client's long-lived streams: their start and end are INFO (a subscriber or writer joined
# or left); every other call is DEBUG unless it fails
_STREAMS = frozenset({"DoExchange", "DoPut"})
# a DoPut's start is logged once its handler has read the first message (at its first
# answer, or its end): by then it has said whether the call is a client's query parameters
# (:func:`flight.rpc.quiet.quiet`), two lines a parametrized query otherwise
_DEFERRED = frozenset({"DoPut"})


class CallLog(grpc.ServerInterceptor):  # type: ignore[misc]
    """Logs each call's start and end (peer, method, code) and counts error answers."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method.startswith(_QUIET):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        decode = handler.request_deserializer
        lenient = _lenient(decode) if decode is not None else None
        streaming = handler.request_streaming
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary, streaming), lenient,
                handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream, streaming), lenient,
                handler.response_serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary, streaming), lenient,
                handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._stream(method, handler.stream_stream, streaming), lenient,
            handler.response_serializer)

    def _unary(self, method: str, behavior: Callable[[Any, Any], Any],
               streaming: bool) -> Callable[[Any, Any], Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            t0 = self._start(method, context)
            try:
                return behavior(_checked(method, request, context, streaming), context)
            except _Malformed as exc:  # from a stream of requests, in a handler not ours
                abort(context, exc)
            finally:
                self._end(method, context, t0)

        return run

    def _stream(self, method: str, behavior: Callable[[Any, Any], Iterator[Any]],
                streaming: bool) -> Callable[[Any, Any], Iterator[Any]]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            deferred = method in _DEFERRED
            t0 = time.monotonic() if deferred else self._start(method, context)
            answers: Iterator[Any] | None = None
            try:
                answers = behavior(_checked(method, request, context, streaming), context)
                for answer in answers:
                    if deferred:
                        deferred = False
                        self._start(method, context)
                    yield answer
            except _Malformed as exc:  # from a stream of requests, in a handler not ours
                abort(context, exc)
            finally:
                close = getattr(answers, "close", None)  # as yield from would
                answers = None
                try:
                    if close is not None:
                        close()
                finally:
                    if deferred:
                        self._start(method, context)
                    self._end(method, context, t0)
                    forget(context)

        return run

    def _start(self, method: str, context: grpc.ServicerContext) -> float:
        log.log(self._level(method, context), "call %s from %s", method, context.peer())
        return time.monotonic()

    @staticmethod
    def _level(method: str, context: grpc.ServicerContext) -> int:
        return logging.INFO if method in _STREAMS and not is_quiet(context) else logging.DEBUG

    def _end(self, method: str, context: grpc.ServicerContext, t0: float) -> None:
        code = context.code()
        seconds = time.monotonic() - t0
        if code is None or code == grpc.StatusCode.OK:
            level = self._level(method, context)
            if not context.is_active() and method in _STREAMS:
                # gRPC answers a message past its receive limit itself, and the handler
                # sees the end of the client's messages as if the client had left; the
                # call shows as ended here only when gRPC's note of it came first (else
                # the line reads "done": aio tells the two apart no sooner)
                log.log(level, "call %s from %s ended by the client after %.3f s (it "
                        "cancelled, or sent a message larger than gRPC's receive limit: "
                        "RESOURCE_EXHAUSTED)", method, context.peer(), seconds)
            elif not context.is_active() and method == "DoGet":
                log.log(level, "call %s from %s ended by the client after %.3f s", method,
                        context.peer(), seconds)
            else:
                log.log(level, "call %s from %s done in %.3f s", method, context.peer(), seconds)
            return
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        if self.metrics is not None:
            self.metrics.on_error(name)
        log.info("call %s from %s answered %s after %.3f s: %s", method, context.peer(), name,
                 seconds, context.details() or "")
