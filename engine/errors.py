"""The one exception hierarchy of Ticktable (re-exported as ``ticktable.errors``).

Split by whose fault it is::

    TicktableError
    ├── InputError                  the caller sent something we cannot use
    │   ├── SchemaError             wrong column names or types
    │   ├── InvalidKeyError         bad keys: nulls in key columns, negative row keys
    │   ├── ExpressionError         an expression names a missing column or has the wrong type
    │   ├── ProtocolError           malformed wire metadata, or a stream that breaks the protocol
    │   ├── TableNotFound           no table of that name
    │   │   └── WriteNotFound       no staged write of that id (server)
    │   ├── TableExists             the name of a table to create is taken
    │   └── LimitExceeded           more than a configured limit of the server allows
    ├── AccessError                 who you are or what you may do
    │   ├── Unauthenticated
    │   └── PermissionDenied
    ├── ServiceError                the service cannot do it now
    │   ├── Overloaded
    │   │   └── BacklogFull         a table's writes waiting for a cycle are past a limit (server)
    │   ├── TableFailed             the table (or a parent) raised in an earlier cycle
    │   ├── PortInUse               a port of the server cannot be bound (server)
    │   └── JournalUnavailable      (also a JournalError, below)
    ├── JournalError                the journal of a durable server (server)
    │   ├── JournalCorrupt          damage before the tail, not a database, quick_check failed
    │   ├── JournalIncompatible     written by another format version, or not a journal
    │   └── JournalUnavailable      a write could not be made durable: read-only, I/O, in use
    │       ├── JournalFull         no space left (SQLITE_FULL)
    │       └── JournalClosed       appended after close()
    ├── CheckpointError             a checkpoint on disk is missing, damaged or of another format
    ├── LinkLost                    the web UI's process lost the server (server)
    └── UpdateInvariantError        an update broke DESIGN.md §2: our bug, never the caller's

The classes marked (server) are raised by the server (:mod:`flight`) only; they live here
so that the tree is one, and every part (the web UI's process too, which loads no gRPC)
imports it without importing the server. What each class reaches a client as, a gRPC
status code and a one-line message, is the table of :mod:`flight.errors`.

Not in the tree: signals that end a loop and never reach a caller as an error, each
caught where it is raised (``QueueClosed`` and ``CallEnded`` in :mod:`flight.rpc.aio`,
``EngineClosed`` in :mod:`flight.web.hub`, ``StreamEnded`` in
:mod:`flight.streams.decoder`).

Every message names the thing (table, column, key) and, where there is one, the way out;
a name a caller chose is quoted with :func:`quoted`, which cuts a long one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "AccessError",
    "BacklogFull",
    "CheckpointError",
    "ExpressionError",
    "InputError",
    "InvalidKeyError",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalFull",
    "JournalIncompatible",
    "JournalUnavailable",
    "LimitExceeded",
    "LinkLost",
    "Overloaded",
    "PermissionDenied",
    "PortInUse",
    "ProtocolError",
    "QueryCancelled",
    "QueryTimeout",
    "SchemaError",
    "ServiceError",
    "SqlError",
    "TableExists",
    "TableFailed",
    "TableNotFound",
    "TicktableError",
    "Unauthenticated",
    "UpdateInvariantError",
    "WriteNotFound",
    "quoted",
]

#: How much of a caller's name a message quotes (a name may be megabytes).
_QUOTED = 100


def quoted(text: str) -> str:
    """``repr(text)`` for a message, cut to its first 100 characters when longer.

    Examples
    --------
    >>> quoted("trades")
    "'trades'"
    >>> quoted("x" * 5_000_000)[-30:]
    "xxxxx'... (5000000 characters)"
    """
    if len(text) <= _QUOTED:
        return repr(text)
    return f"{text[:_QUOTED]!r}... ({len(text)} characters)"


class TicktableError(Exception):
    """Base of every error Ticktable raises on purpose."""


class InputError(TicktableError):
    """The caller sent something we cannot use; nothing was changed."""


class SchemaError(InputError):
    """Column names or types do not match the table's schema."""


class InvalidKeyError(InputError):
    """Keys we cannot accept: nulls in key columns, negative or unknown row keys."""


class ExpressionError(InputError):
    """An expression names a missing column or has the wrong type."""


class ProtocolError(InputError):
    """Wire metadata that cannot be parsed or does not fit the protocol.

    Raised by the server for a malformed request, and by the clients' decoders for a
    stream that breaks the protocol (the client then drops its state and resubscribes).
    """


class TableNotFound(InputError):
    """No table of that name exists."""


class WriteNotFound(TableNotFound):
    """No staged write of that id is known to the server.

    Raised by a commit naming slots (or ``all_slots``) and by an abort, for a ``write_id``
    nothing was held under that was not committed, aborted or dropped within
    ``stage_ttl``: a mistyped write id must not look like a write that committed nothing.
    Not raised for a commit naming no slot (an empty write, whatever its id), nor for a
    write the server dropped (expired, or at a restart) less than ``stage_ttl`` ago: that
    commit is an :class:`InputError` naming the missing slots. A :class:`TableNotFound`,
    so that it is NOT_FOUND, as any unknown name.
    """


class TableExists(InputError):
    """A table of that name exists already: drop it first, pick another name, or replace it.

    Not raised when the caller asked for the existing table (``if_not_exists``) and it
    matches, nor when it asked to replace it.
    """


class LimitExceeded(InputError):
    """The caller sent or asked for more than a configured limit of the server allows.

    A message, a column count, a string or binary value, open subscriptions, bytes staged
    under one write, tables on the server: the message names the table or column, the
    limit's setting and value, and the ``ticktable serve`` flag that changes it. Nothing
    of the refused request was applied. A retry fails again until the caller sends or
    holds less (closes subscriptions, drops tables, commits its write) or the limit is
    raised: unlike :class:`Overloaded`, it does not pass by itself.
    """


class SqlError(InputError):
    """A SQL text that does not parse, or a statement or clause Ticktable does not run.

    The message names the clause (``CREATE VIEW v: FULL OUTER JOIN does not map to an
    incremental operation``) or, for a text that does not parse, the parser's line and
    column. INVALID_ARGUMENT, as any input error.
    """


class QueryTimeout(LimitExceeded):
    """A SQL query ran past the server's query timeout (``--sql-timeout``) and was stopped.

    DEADLINE_EXCEEDED. Nothing was changed; the cycle kept running while it ran.
    """


class QueryCancelled(TicktableError):
    """A SQL query was cancelled by its client (``CancelFlightInfo``) while it ran: CANCELLED."""


class AccessError(TicktableError):
    """The caller is not known, or may not do this."""


class Unauthenticated(AccessError):
    """No valid credentials were presented."""


class PermissionDenied(AccessError):
    """Valid credentials, but not for this."""


class ServiceError(TicktableError):
    """The service cannot do it now, through no fault of the caller."""


class Overloaded(ServiceError):
    """Too busy, or shutting down; retry later."""


class BacklogFull(Overloaded):
    """A write met a table whose writes waiting for a cycle stayed past the server's limit
    (:mod:`flight.ingest.backlog`): cycles are behind; nothing of it was staged, send it again
    later."""


class TableFailed(ServiceError):
    """The table, or one of its parents, raised while updating; it no longer updates."""


class PortInUse(ServiceError):
    """A port of the server (Flight, metrics, web UI) cannot be bound: in use by another
    process, or not allowed.

    Raised by :meth:`flight.server.TicktableServer.start` (and the web UI's start) before
    anything is served, naming the address and the flag that changes or turns off the
    port; never by a call to a running server. Not raised for port 0: the system picks a
    free one.
    """


# the journal (flight.durability.journal): what the operator must do differs per class
class JournalError(TicktableError):
    """The journal of a durable server cannot do what was asked (never raised as itself).

    :class:`JournalCorrupt` and :class:`JournalIncompatible` stop start-up: the operator
    must act. :class:`JournalUnavailable` refuses one write and may pass by itself. No
    journal error is raised by a server started with ``--in-memory``.
    """


class JournalCorrupt(JournalError):
    """The journal is damaged where a crash cannot have done it: refuse to start.

    Raised by :meth:`~flight.durability.journal.Journal.open` for a record failing its checksum with
    a whole record after it, failing records in more than the last transaction, a failed
    ``PRAGMA quick_check``, or a file that is not an SQLite database. Not raised for a torn
    tail, which is cut with a WARNING.
    """

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"journal {path}: {detail}; refusing to start rather than drop "
                         f"acknowledged data: move the data dir aside and restore it from a backup")
        self.path = path


class JournalIncompatible(JournalError):
    """The data dir was written by another format version, or is not a Ticktable journal.

    Raised by :meth:`~flight.durability.journal.Journal.open`, before anything is read
    or written: start the Ticktable version that wrote it, or point the server at another
    data dir. Not raised for damage (:class:`JournalCorrupt`).
    """

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"journal {path}: {detail}")
        self.path = path


class JournalUnavailable(JournalError, ServiceError):
    """A write could not be made durable; nothing of it was acknowledged or applied.

    Earlier records are intact and reads keep working; a later append tries again (the
    condition may pass: space freed, disk remounted). At open: the files cannot be opened
    for writing, or another process has them. Not raised for damage (:class:`JournalCorrupt`).
    The message names the file, not its directory, as it reaches clients; :attr:`path` has
    the whole path.
    """

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path.name}: {detail}")
        self.path = path


class JournalFull(JournalUnavailable):
    """No space left for the journal (SQLite's SQLITE_FULL, "database or disk is full").

    Not raised for a read-only disk or an I/O error (:class:`JournalUnavailable`).
    """


class JournalClosed(JournalUnavailable):
    """Appended after :meth:`~flight.durability.journal.Journal.close` began (shutting down).

    The server is stopping: retry against it once restarted. Not raised for a journal
    whose writer failed (:class:`JournalUnavailable`).
    """


class CheckpointError(TicktableError):
    """A checkpoint on disk is missing, damaged or of another format (the message names it).

    Raised by :func:`~flight.durability.checkpoint.read_checkpoint` at start-up, when
    ``CURRENT`` names a checkpoint whose manifest or a file is missing, whose file's size,
    CRC or row count differs from the manifest, or whose format another version wrote:
    start-up stops rather than lose acknowledged data. Not raised when there has never
    been a checkpoint, nor when writing one fails (logged; the journal keeps every change).
    """


class LinkLost(TicktableError):
    """The server's end of the web UI's link closed (the server stopped).

    Raised in the web UI's process (:class:`~flight.web.remote.RemoteTables`) for a
    request to the server that was waiting, or made, after the link closed; the web
    process ends next. Not raised in the server, nor for a table that was dropped or
    failed (:class:`TableNotFound`, :class:`TableFailed`).
    """


class UpdateInvariantError(TicktableError):
    """An update broke an invariant of the update model (DESIGN.md §2).

    ``invariant`` names the rule (``I1``..``I5``, ``S1``..``S4``) so tests and logs can
    say which one; the message quotes at most ten offending keys.
    """

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
