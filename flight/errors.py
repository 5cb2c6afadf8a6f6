"""The one mapping from Ticktable's exceptions to what a client sees (DESIGN.md §5).

Every service on the server answers an exception with the row of :data:`STATUSES` for
the most specific class in the exception's MRO; a Flight handler raises the row's Flight
exception (:func:`to_flight_error`), a gRPC handler aborts with the row's status code
(:func:`grpc_status`):

=================  ===================  =================================  =====================
exception          gRPC status          Flight handler raises              code on the wire
                                                                           from the Flight port
=================  ===================  =================================  =====================
TableNotFound      NOT_FOUND            ``pyarrow.ArrowKeyError``          NOT_FOUND
TableExists        ALREADY_EXISTS       ``pyarrow.ArrowInvalid``           INVALID_ARGUMENT (1)
InputError         INVALID_ARGUMENT     ``pyarrow.ArrowInvalid``           INVALID_ARGUMENT
(schema, key,
expression,
protocol)
Unauthenticated    UNAUTHENTICATED      ``FlightUnauthenticatedError``     UNAUTHENTICATED
PermissionDenied   PERMISSION_DENIED    ``FlightUnauthorizedError``        PERMISSION_DENIED
AccessError        PERMISSION_DENIED    ``FlightUnauthorizedError``        PERMISSION_DENIED
Overloaded         UNAVAILABLE          ``FlightUnavailableError``         UNAVAILABLE
TableFailed        FAILED_PRECONDITION  ``FlightServerError``              UNKNOWN (2)
ServiceError       UNAVAILABLE          ``FlightUnavailableError``         UNAVAILABLE
anything else      INTERNAL             ``FlightInternalError``            INTERNAL
(our bug)
=================  ===================  =================================  =====================

(1), (2): pyarrow's Flight server can send only the codes of its exception classes, and
has none for ALREADY_EXISTS or FAILED_PRECONDITION; the closest is used. ``TableExists``
is an ``InputError``, so a Flight client that catches ``ArrowInvalid`` still catches it;
``FlightServerError`` is Flight's own "Failed" status. :func:`flight_error_for` maps a
gRPC status back to the exception a Flight call raises for the same error, so a client
sees one class per error on both ports.

``Overloaded`` is UNAVAILABLE (not RESOURCE_EXHAUSTED) everywhere: the standard "retry
later" code, and the one Flight can send.

Messages are the exception's own text on one line (an engine message names the table,
column or key and the way out). For anything else the client gets only
``internal error, ref=<id>`` and the traceback is logged with that id.

Known gap: pyarrow's Python Flight server appends a Python traceback to the message of
every exception that is not a ``Flight*Error`` (here ``ArrowInvalid`` and
``ArrowKeyError``); the codes are right, the text is not one line. It goes when the
server frames Flight itself over grpcio (DESIGN.md §5). The gRPC services have no such
gap.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from engine.errors import (
    AccessError,
    InputError,
    Overloaded,
    PermissionDenied,
    ServiceError,
    TableExists,
    TableFailed,
    TableNotFound,
    Unauthenticated,
)

__all__ = [
    "INTERNAL",
    "MAX_MESSAGE",
    "STATUSES",
    "Status",
    "abort",
    "flight_error_for",
    "flight_errors",
    "grpc_status",
    "guarded",
    "status_of",
    "to_flight_error",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest message sent to a client; a longer one is cut (never echo megabytes of input).
MAX_MESSAGE = 4000


@dataclass(frozen=True, slots=True)
class Status:
    """How errors of one class reach a client (one row of the module's table).

    Attributes
    ----------
    error
        The exception class (its subclasses use this row unless they have their own).
    grpc
        The status code of a gRPC service.
    flight
        The exception a Flight handler raises, built from the message.
    flight_code
        The status code pyarrow's Flight server sends for ``flight``; equal to ``grpc``
        except where pyarrow has no exception for that code (see the module table).
    """

    error: type[Exception]
    grpc: grpc.StatusCode
    flight: Callable[[str], Exception]
    flight_code: grpc.StatusCode


_C = grpc.StatusCode

#: The table (see the module docstring); :func:`status_of` picks the most specific row.
STATUSES: tuple[Status, ...] = (
    Status(TableNotFound, _C.NOT_FOUND, pa.ArrowKeyError, _C.NOT_FOUND),
    Status(TableExists, _C.ALREADY_EXISTS, pa.ArrowInvalid, _C.INVALID_ARGUMENT),
    Status(InputError, _C.INVALID_ARGUMENT, pa.ArrowInvalid, _C.INVALID_ARGUMENT),
    Status(Unauthenticated, _C.UNAUTHENTICATED, flight.FlightUnauthenticatedError,
           _C.UNAUTHENTICATED),
    Status(PermissionDenied, _C.PERMISSION_DENIED, flight.FlightUnauthorizedError,
           _C.PERMISSION_DENIED),
    Status(AccessError, _C.PERMISSION_DENIED, flight.FlightUnauthorizedError,
           _C.PERMISSION_DENIED),
    Status(Overloaded, _C.UNAVAILABLE, flight.FlightUnavailableError, _C.UNAVAILABLE),
    Status(TableFailed, _C.FAILED_PRECONDITION, flight.FlightServerError, _C.UNKNOWN),
    Status(ServiceError, _C.UNAVAILABLE, flight.FlightUnavailableError, _C.UNAVAILABLE),
)

#: Anything without a row: our bug. Its message is replaced by a reference id.
INTERNAL = Status(Exception, _C.INTERNAL, flight.FlightInternalError, _C.INTERNAL)

_BY_CLASS: dict[type[BaseException], Status] = {s.error: s for s in STATUSES}
_BY_CODE: dict[grpc.StatusCode, Status] = {}
for _s in STATUSES:
    _BY_CODE.setdefault(_s.grpc, _s)  # the first row with a code: its most specific error
_BY_CODE[_C.INTERNAL] = INTERNAL


def status_of(exc: BaseException) -> Status:
    """The row for ``exc``: the most specific class of its MRO that has one, else INTERNAL."""
    for cls in type(exc).__mro__:
        row = _BY_CLASS.get(cls)
        if row is not None:
            return row
    return INTERNAL


def _one_line(text: str) -> str:
    line = re.sub(r"\s*\n\s*", " ", text).strip()
    if len(line) > MAX_MESSAGE:
        line = f"{line[:MAX_MESSAGE]}... ({len(line) - MAX_MESSAGE} more characters)"
    return line


def _message(exc: BaseException, row: Status, where: str) -> str:
    if row is INTERNAL:
        ref = uuid.uuid4().hex[:12]
        log.error("unexpected error in %s (ref=%s)", where, ref, exc_info=exc)
        return f"internal error, ref={ref}; see the server log"
    return _one_line(str(exc))


def grpc_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and one-line message a gRPC handler answers ``exc`` with.

    Examples
    --------
    >>> grpc_status(TableNotFound("no table 'x'"))
    (<StatusCode.NOT_FOUND: (5, 'not found')>, "no table 'x'")
    """
    row = status_of(exc)
    return row.grpc, _message(exc, row, "a gRPC call")


def abort(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    """End a gRPC call with :func:`grpc_status` of ``exc`` (raises, as ``context.abort`` does)."""
    code, message = grpc_status(exc)
    context.abort(code, message)
    raise AssertionError("grpc.ServicerContext.abort returned")


def to_flight_error(exc: BaseException) -> Exception:
    """The exception a Flight handler raises for ``exc`` (a Flight error is returned as is)."""
    if isinstance(exc, flight.FlightError):
        return exc
    row = status_of(exc)
    return row.flight(_message(exc, row, "a Flight call"))


def flight_error_for(code: grpc.StatusCode, message: str) -> Exception:
    """The exception a Flight call raises for the error a gRPC service answered ``code`` for.

    Clients use it so one error has one class whichever port reported it.
    """
    row = _BY_CODE.get(code)
    if row is None:
        return flight.FlightServerError(_one_line(f"{code.name}: {message}"))
    return row.flight(_one_line(message))


@contextmanager
def flight_errors() -> Iterator[None]:
    """Re-raise anything escaping the block as its Flight error (see the module table).

    The engine exception is not chained (``from None``): pyarrow would print its traceback
    into the client's message.
    """
    try:
        yield
    except flight.FlightError:
        raise  # already a Flight status, raised on purpose
    except Exception as exc:
        raise to_flight_error(exc) from None


def guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator form of :func:`flight_errors`."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        with flight_errors():
            return fn(*args, **kwargs)

    return wrapper
