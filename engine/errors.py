"""The one exception hierarchy of Ticktable (re-exported as ``ticktable.errors``).

Split by whose fault it is::

    TicktableError
    ├── InputError                  the caller sent something we cannot use
    │   ├── SchemaError             wrong column names or types
    │   ├── InvalidKeyError         bad keys: nulls in key columns, negative row keys
    │   ├── ExpressionError         an expression names a missing column or has the wrong type
    │   ├── ProtocolError           malformed wire metadata, or a stream that breaks the protocol
    │   ├── TableNotFound           no table of that name
    │   ├── TableExists             the name of a table to create is taken
    │   └── LimitExceeded           more than a configured limit of the server allows
    ├── AccessError                 who you are or what you may do
    │   ├── Unauthenticated
    │   └── PermissionDenied
    ├── ServiceError                the service cannot do it now
    │   ├── Overloaded
    │   └── TableFailed             the table (or a parent) raised in an earlier cycle
    └── UpdateInvariantError        an update broke DESIGN.md §2: our bug, never the caller's

Every message names the thing (table, column, key) and, where there is one, the way out;
a name a caller chose is quoted with :func:`quoted`, which cuts a long one.
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "ExpressionError",
    "InputError",
    "InvalidKeyError",
    "LimitExceeded",
    "Overloaded",
    "PermissionDenied",
    "ProtocolError",
    "SchemaError",
    "ServiceError",
    "TableExists",
    "TableFailed",
    "TableNotFound",
    "TicktableError",
    "Unauthenticated",
    "UpdateInvariantError",
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


class TableFailed(ServiceError):
    """The table, or one of its parents, raised while updating; it no longer updates."""


class UpdateInvariantError(TicktableError):
    """An update broke an invariant of the update model (DESIGN.md §2).

    ``invariant`` names the rule (``I1``..``I5``, ``S1``..``S4``) so tests and logs can
    say which one; the message quotes at most ten offending keys.
    """

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
