"""The one mapping from Ticktable's exceptions to what a client sees (DESIGN.md §5).

Every service on the server (Arrow Flight, the TableService, on one port) answers an
exception with the row of :data:`STATUSES` for the most specific class in the
exception's MRO: that row's gRPC status code and a one-line message (:func:`grpc_status`,
:func:`abort`). Every class of the tree (:mod:`engine.errors`) that the server raises has
a row of its own or its parent's.

===================  ===================  =========================================
exception            gRPC status          a ``pyarrow.flight`` client raises
===================  ===================  =========================================
WriteNotFound        NOT_FOUND            ``pyarrow.ArrowKeyError``
TableNotFound        NOT_FOUND            ``pyarrow.ArrowKeyError``
TableExists          ALREADY_EXISTS       ``pyarrow.ArrowException``
QueryTimeout         DEADLINE_EXCEEDED    ``FlightTimedOutError``
LimitExceeded        RESOURCE_EXHAUSTED   ``pyarrow.ArrowInvalid``
InputError           INVALID_ARGUMENT     ``pyarrow.ArrowInvalid``
(schema, key,
expression,
protocol, SQL)
Unauthenticated      UNAUTHENTICATED      ``FlightUnauthenticatedError``
PermissionDenied     PERMISSION_DENIED    ``FlightUnauthorizedError``
AccessError          PERMISSION_DENIED    ``FlightUnauthorizedError``
BacklogFull          RESOURCE_EXHAUSTED   ``pyarrow.ArrowInvalid``
Overloaded           UNAVAILABLE          ``FlightUnavailableError``
TableFailed          FAILED_PRECONDITION  ``pyarrow.ArrowInvalid``
PortInUse            UNAVAILABLE          ``FlightUnavailableError``
JournalFull          UNAVAILABLE          ``FlightUnavailableError``
JournalClosed        UNAVAILABLE          ``FlightUnavailableError``
JournalUnavailable   UNAVAILABLE          ``FlightUnavailableError``
ServiceError         UNAVAILABLE          ``FlightUnavailableError``
JournalCorrupt       INTERNAL             ``FlightInternalError``
JournalIncompatible  INTERNAL             ``FlightInternalError``
JournalError         INTERNAL             ``FlightInternalError``
CheckpointError      INTERNAL             ``FlightInternalError``
LinkLost             INTERNAL             ``FlightInternalError``
QueryCancelled       CANCELLED            ``FlightCancelledError``
anything else        INTERNAL             ``FlightInternalError``
(our bug)
===================  ===================  =========================================

The last column is what pyarrow's Flight client makes of each code (it has no class of
its own for ALREADY_EXISTS or FAILED_PRECONDITION); :func:`flight_error_for` builds the
same exception from a gRPC status, so a Ticktable client raises one class per error
whichever service answered.

``Overloaded`` is UNAVAILABLE (not RESOURCE_EXHAUSTED): the standard "retry later" code,
as for a journal that cannot write now (``JournalFull`` included: space may be freed).
RESOURCE_EXHAUSTED is for ``LimitExceeded``: the client sent or holds more than a
configured limit allows (:mod:`flight.limits`), and gRPC answers it too for a message
larger than its receive limit; and for ``BacklogFull``, the push-back of writers that send
faster than cycles apply (:mod:`flight.ingest.backlog`): gRPC's code for a rate or quota
refused, which a client tells apart from a server that is down. The INTERNAL rows are the server's own state or process
(a damaged journal or checkpoint stops start-up; the web UI's process lost the server):
no call gets them in a server that runs, and were one to, its message, which names
server paths, stays in the log as for a bug.

Messages are the exception's own text on one line, at most :data:`MAX_MESSAGE` bytes as
gRPC sends them (``grpc-message`` percent-encodes every byte that is not printable ASCII,
so a character may cost up to 12): a longer one is cut, so it never reaches the client's
limit on header sizes. An engine message names the table, column or key and the way out.
For INTERNAL the client gets only ``internal error, ref=<id>`` and the traceback is
logged with that id. No traceback, file path or internal exception text reaches a
client.
"""

from __future__ import annotations

import copy
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from engine.errors import (
    AccessError,
    BacklogFull,
    CheckpointError,
    InputError,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalIncompatible,
    JournalUnavailable,
    LimitExceeded,
    LinkLost,
    Overloaded,
    PermissionDenied,
    PortInUse,
    QueryCancelled,
    QueryTimeout,
    ServiceError,
    TableExists,
    TableFailed,
    TableNotFound,
    Unauthenticated,
    WriteNotFound,
)

__all__ = [
    "INTERNAL",
    "MAX_MESSAGE",
    "STATUSES",
    "Status",
    "abort",
    "again",
    "flight_error_for",
    "grpc_status",
    "status_of",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Longest message sent to a client, in bytes on the wire; a longer one is cut (never echo
#: megabytes of input, nor pass gRPC's 8 KiB soft limit on a response's headers).
MAX_MESSAGE = 4000


@dataclass(frozen=True, slots=True)
class Status:
    """How errors of one class reach a client (one row of the module's table).

    Attributes
    ----------
    error
        The exception class (its subclasses use this row unless they have their own).
    grpc
        The status code every service answers it with.
    flight
        The exception a ``pyarrow.flight`` client raises for that code, built from the
        message.
    """

    error: type[Exception]
    grpc: grpc.StatusCode
    flight: Callable[[str], Exception]


_C = grpc.StatusCode

#: The table (see the module docstring); :func:`status_of` picks the most specific row.
STATUSES: tuple[Status, ...] = (
    Status(WriteNotFound, _C.NOT_FOUND, pa.ArrowKeyError),
    Status(TableNotFound, _C.NOT_FOUND, pa.ArrowKeyError),
    Status(TableExists, _C.ALREADY_EXISTS, pa.ArrowException),
    Status(QueryTimeout, _C.DEADLINE_EXCEEDED, flight.FlightTimedOutError),
    Status(LimitExceeded, _C.RESOURCE_EXHAUSTED, pa.ArrowInvalid),
    Status(InputError, _C.INVALID_ARGUMENT, pa.ArrowInvalid),
    Status(Unauthenticated, _C.UNAUTHENTICATED, flight.FlightUnauthenticatedError),
    Status(PermissionDenied, _C.PERMISSION_DENIED, flight.FlightUnauthorizedError),
    Status(AccessError, _C.PERMISSION_DENIED, flight.FlightUnauthorizedError),
    Status(BacklogFull, _C.RESOURCE_EXHAUSTED, pa.ArrowInvalid),
    Status(Overloaded, _C.UNAVAILABLE, flight.FlightUnavailableError),
    Status(TableFailed, _C.FAILED_PRECONDITION, pa.ArrowInvalid),
    Status(PortInUse, _C.UNAVAILABLE, flight.FlightUnavailableError),
    Status(JournalFull, _C.UNAVAILABLE, flight.FlightUnavailableError),
    Status(JournalClosed, _C.UNAVAILABLE, flight.FlightUnavailableError),
    # its own row: its MRO has JournalError (INTERNAL) before ServiceError
    Status(JournalUnavailable, _C.UNAVAILABLE, flight.FlightUnavailableError),
    Status(ServiceError, _C.UNAVAILABLE, flight.FlightUnavailableError),
    Status(JournalCorrupt, _C.INTERNAL, flight.FlightInternalError),
    Status(JournalIncompatible, _C.INTERNAL, flight.FlightInternalError),
    Status(JournalError, _C.INTERNAL, flight.FlightInternalError),
    Status(CheckpointError, _C.INTERNAL, flight.FlightInternalError),
    Status(LinkLost, _C.INTERNAL, flight.FlightInternalError),
    Status(QueryCancelled, _C.CANCELLED, flight.FlightCancelledError),
)

#: Anything without a row: our bug. Its message (as any INTERNAL row's) is replaced by a
#: reference id.
INTERNAL = Status(Exception, _C.INTERNAL, flight.FlightInternalError)

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


def _wire_size(char: str) -> int:
    """Bytes ``char`` takes in ``grpc-message``: printable ASCII but ``%`` as is, else each
    UTF-8 byte as ``%XX``."""
    return 1 if " " <= char <= "~" and char != "%" else 3 * len(char.encode(errors="replace"))


def _one_line(text: str) -> str:
    # no message keeps more characters than MAX_MESSAGE: each costs at least a byte
    line = re.sub(r"\s*\n\s*", " ", text[:MAX_MESSAGE]).strip()
    size = 0
    for i, char in enumerate(line):
        size += _wire_size(char)
        if size > MAX_MESSAGE - 40:  # room for the note
            return f"{line[:i]}... ({len(text) - i} more characters)"
    if len(text) > MAX_MESSAGE:
        return f"{line}... ({len(text) - MAX_MESSAGE} more characters)"
    return line


def _message(exc: BaseException, row: Status, where: str) -> str:
    if row.grpc == _C.INTERNAL:  # our side: the text stays in the log, under a reference
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


def flight_error_for(code: grpc.StatusCode, message: str) -> Exception:
    """The exception a Flight call raises for the error a gRPC service answered ``code`` for.

    Clients use it so one error has one class whichever port reported it.
    """
    row = _BY_CODE.get(code)
    if row is None:
        return flight.FlightServerError(_one_line(f"{code.name}: {message}"))
    return row.flight(_one_line(message))


def again(exc: BaseException) -> BaseException:
    """A copy of ``exc`` to raise once more: same type, message and cause.

    An exception kept to be raised later (a subscription's failure, the end of a call's
    requests) would otherwise take the traceback of each frame it passes through, and
    keep those frames, and whatever they hold, until the cyclic garbage collector ran.
    ``exc`` itself when it does not copy to the same type and arguments (an ``__init__``
    that formats its arguments, say).
    """
    try:
        out = copy.copy(exc)
    except Exception:  # noqa: BLE001 - any exception class: keep the original then
        return exc
    if type(out) is not type(exc) or out.args != exc.args:
        return exc
    out.__cause__ = exc.__cause__
    return out
