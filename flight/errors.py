"""One mapping from Ticktable's exceptions to Arrow Flight status codes.

=====================================  ===============================  ==================
exception                              raised to the client as           gRPC status
=====================================  ===============================  ==================
TableNotFound                          ``KeyError``                      NOT_FOUND
other InputError (schema, expression,  ``pyarrow.ArrowInvalid``          INVALID_ARGUMENT
key, protocol)
Unauthenticated                        ``FlightUnauthenticatedError``    UNAUTHENTICATED
PermissionDenied                       ``FlightUnauthorizedError``       PERMISSION_DENIED
Overloaded                             ``FlightUnavailableError``        UNAVAILABLE
TableFailed                            ``FlightServerError``             UNKNOWN
anything else (our bug)                ``FlightInternalError``           INTERNAL
=====================================  ===============================  ==================

The message is ours (it names the table or column and the way out); an unexpected
exception is logged with its traceback and the client sees only its type and text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from engine.errors import (
    InputError,
    Overloaded,
    PermissionDenied,
    TableFailed,
    TableNotFound,
    TicktableError,
    Unauthenticated,
)

__all__ = ["flight_errors", "to_flight_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def to_flight_error(exc: BaseException) -> BaseException:
    """The exception to raise from a Flight handler for ``exc``."""
    if isinstance(exc, (flight.FlightError, pa.ArrowException)):
        return exc
    out: BaseException = _map(exc, str(exc))
    return out


def _map(exc: BaseException, msg: str) -> BaseException:
    if isinstance(exc, TableNotFound):
        return KeyError(msg)
    if isinstance(exc, InputError):
        return pa.ArrowInvalid(msg)
    if isinstance(exc, Unauthenticated):
        return flight.FlightUnauthenticatedError(msg)
    if isinstance(exc, PermissionDenied):
        return flight.FlightUnauthorizedError(msg)
    if isinstance(exc, Overloaded):
        return flight.FlightUnavailableError(msg)
    if isinstance(exc, TableFailed):
        return flight.FlightServerError(msg)
    if isinstance(exc, TicktableError):
        return flight.FlightServerError(f"{type(exc).__name__}: {msg}")
    log.error("unexpected error in a Flight call", exc_info=exc)
    return flight.FlightInternalError(f"internal error ({type(exc).__name__}: {msg}); "
                                      f"see the server log")


@contextmanager
def flight_errors() -> Iterator[None]:
    """Re-raise anything escaping the block as its Flight error (see the module table)."""
    try:
        yield
    except (flight.FlightError, pa.ArrowException):
        raise
    except Exception as exc:
        raise to_flight_error(exc) from exc


def guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator form of :func:`flight_errors`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        with flight_errors():
            return fn(*args, **kwargs)

    return wrapper
