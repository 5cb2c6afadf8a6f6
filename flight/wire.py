"""The wire vocabulary: every name the server and its clients agree on, defined once.

Clients may import this module (DESIGN.md §1): it holds names and tables, no behaviour,
and imports nothing of the server (only the generated messages, :mod:`engine.reserved`,
:mod:`engine.errors` and :mod:`flight.limits`). ``docs/protocol.md`` describes the same
names for a client in another language; this module is where they are defined.

==================  ===========================================================================
name                what it names
==================  ===========================================================================
:class:`PutMode`    how a DoPut stream changes its table (``PutRequest.mode``); also the
                    kind of a checked, staged part of a write
:class:`TableKind`  what a table is (``FlightInfo.app_metadata``, ``TableStats.kind``,
                    ``CreateTableRequest.kind``)
``DIFF`` ...        the reserved columns (:data:`DIFF`, :data:`TIME`, :data:`DELETE`,
                    :data:`ROW_KEY`)
:data:`ACTIONS`     one :class:`Action` per DoAction type: the only list of them, read by
                    ListActions, the read-only token's check, the dispatch and its
                    "unknown action" error
:class:`RecordKind` the journal's record kinds (on disk, not on the wire: here so that each
                    action's row names the record it writes)
==================  ===========================================================================

The enums are :class:`~enum.StrEnum`: a member *is* its wire string (``PutMode.UPSERT ==
"upsert"``, formatted and JSON-encoded as ``upsert``), but its ``repr`` is the enum's, so a
text built with ``repr`` (a list in a message, a checksum over ``repr``) takes ``.value``.

Adding a DoAction: a row here (and in :data:`ACTIONS`), the ``TicktableServer`` method of
the same name that runs it, a test, and its line in ``docs/protocol.md`` §6.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from google.protobuf.message import Message

from engine.errors import InputError
from engine.reserved import DELETE, DIFF, TIME
from flight.limits import quoted
from flight.pb import flight_pb2 as pb

__all__ = [
    "ABORT",
    "ACTIONS",
    "COMMIT",
    "CREATE_TABLE",
    "DELETE",
    "DIFF",
    "DROP_TABLE",
    "PUT_MODES",
    "RETRY_LATER",
    "ROW_KEY",
    "SOURCE_KINDS",
    "STATS",
    "TIME",
    "Action",
    "PutMode",
    "RecordKind",
    "TableKind",
    "action_named",
]

#: A row's key, ``int64``: the index of a table's rows in the web UI's feeds
#: (:mod:`flight.web.feed`; ``web/src/app.js`` repeats it) and the row keys of a
#: checkpoint's tables (renaming it changes the checkpoint format: bump its ``FORMAT``).
ROW_KEY = "__row_key"

#: How a DoPut refusal that may be sent again ends (:class:`~engine.errors.BacklogFull`,
#: RESOURCE_EXHAUSTED): the refused batch and any after it were not staged, the batches
#: acknowledged before it were. Clients match it to send the rest again
#: (:func:`clients.wire.put_batches`); changing it breaks their retries.
RETRY_LATER = "nothing of this batch was staged, send it again later"


# ---------------------------------------------------------------------------- put modes
class PutMode(StrEnum):
    """How a DoPut stream changes its table (``PutRequest.mode``, docs/protocol.md §5.2).

    Also the kind of a checked part of a write (:class:`flight.ingest.parts.Part`): an
    upsert batch with deletes becomes an ``UPSERT`` and a ``DELETE`` part.
    """

    APPEND = "append"
    """Append and ring tables: rows are appended."""
    UPSERT = "upsert"
    """Keyed tables: insert or replace by key; a true :data:`DELETE` deletes the key."""
    DELETE = "delete"
    """Keyed tables: batches carry exactly the key columns; their rows are deleted."""
    DIFF = "diff"
    """Keyed tables: differential triples, the weight in :data:`DIFF`."""

    @property
    def proto(self) -> pb.PutMode.ValueType:
        """The ``PutMode`` value of ``flight.proto`` (``PutRequest.mode``)."""
        return _PUT_MODE_PROTO[self]

    @classmethod
    def from_proto(cls, value: int) -> PutMode | None:
        """The mode of a ``PutRequest.mode`` value; ``None`` for a value the proto lacks."""
        return _PUT_MODE_OF.get(value)

    @property
    def columns(self) -> tuple[str, ...]:
        """The reserved columns a batch of this mode may carry besides the table's."""
        return _MODE_COLUMNS.get(self, ())


#: Every put mode, in ``flight.proto``'s order (``mode in PUT_MODES`` takes a string too).
PUT_MODES: tuple[PutMode, ...] = tuple(PutMode)

_PUT_MODE_PROTO: dict[PutMode, pb.PutMode.ValueType] = {
    PutMode.APPEND: pb.PUT_MODE_APPEND, PutMode.UPSERT: pb.PUT_MODE_UPSERT,
    PutMode.DELETE: pb.PUT_MODE_DELETE, PutMode.DIFF: pb.PUT_MODE_DIFF}
_PUT_MODE_OF: dict[int, PutMode] = {int(v): m for m, v in _PUT_MODE_PROTO.items()}
_MODE_COLUMNS: dict[PutMode, tuple[str, ...]] = {
    PutMode.UPSERT: (DELETE,), PutMode.DIFF: (DIFF, TIME)}


# -------------------------------------------------------------------------- table kinds
class TableKind(StrEnum):
    """What a table is: ``FlightInfo.app_metadata``, ``TableStats.kind``, ``TableInfo.kind``.

    The source kinds (:data:`SOURCE_KINDS`) take writes and are created with the
    ``create_table`` action (``CreateTableRequest.kind``); a derived table is built from
    others (the TableService, or the server's own code).
    """

    APPEND = "append"
    """A source table whose rows are only added."""
    KEYED = "keyed"
    """A source table of one row per key: upserts and deletes."""
    RING = "ring"
    """A source table of its last ``capacity`` rows."""
    DERIVED = "derived"
    """A table computed from others."""
    VIEW = "view"
    """A derived table defined by SQL (``CREATE VIEW``, :mod:`flight.sql`)."""
    MIRROR = "mirror"
    """A table of another server mirrored here (:mod:`flight.links`): it changes as that
    table does, under its row keys, and takes no writes."""

    @property
    def proto(self) -> pb.TableKind.ValueType:
        """The ``TableKind`` value of ``flight.proto``.

        Raises
        ------
        KeyError
            For :attr:`DERIVED`, which is not created with ``create_table``.
        """
        return _TABLE_KIND_PROTO[self]

    @classmethod
    def from_proto(cls, value: int) -> TableKind | None:
        """The kind of a ``CreateTableRequest.kind`` value; ``None`` for one the proto lacks."""
        return _TABLE_KIND_OF.get(value)


#: The kinds of source tables: the ones that take writes and ``create_table`` creates.
SOURCE_KINDS: tuple[TableKind, ...] = (TableKind.APPEND, TableKind.KEYED, TableKind.RING)

_TABLE_KIND_PROTO: dict[TableKind, pb.TableKind.ValueType] = {
    TableKind.APPEND: pb.TABLE_KIND_APPEND, TableKind.KEYED: pb.TABLE_KIND_KEYED,
    TableKind.RING: pb.TABLE_KIND_RING}
_TABLE_KIND_OF: dict[int, TableKind] = {int(v): k for k, v in _TABLE_KIND_PROTO.items()}


# --------------------------------------------------------------------- journal records
class RecordKind(StrEnum):
    """The kind of a journal record (:mod:`flight.durability.durable` writes and replays
    them). The journal checksums ``repr`` of a record's fields: hand it ``.value``."""

    APPLY = "apply"
    """A write's batch without a ``write_id``, into one table."""
    HOLD = "hold"
    """A batch of a staged write (a ``write_id``'s slot)."""
    COMMIT = "commit"
    """The ``commit`` action."""
    ABORT = "abort"
    """The ``abort`` action."""
    CREATE = "create"
    """The ``create_table`` action."""
    DROP = "drop"
    """The ``drop_table`` action (or the TableService's ``DropTable``)."""
    RENAME = "rename"
    """A pending table filled takes its name (``CREATE TABLE ... AS``, a replacing ingest)."""
    DERIVE = "derive"
    """A derived table built through the TableService."""
    MIRROR = "mirror"
    """A mirror started (:mod:`flight.links`): what it follows, never its token."""
    FORGET = "forget"
    """Writes expired or dropped, finished write ids forgotten."""
    CYCLE = "cycle"
    """The last record a cycle took (replay runs a cycle there)."""


# ------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class Action:
    """One DoAction type: a row of :data:`ACTIONS`.

    ``TicktableServer.<name>`` runs it: called with the parsed request (nothing when
    :attr:`request` is ``None``), it returns the result message (``None`` when
    :attr:`result` is).

    Attributes
    ----------
    name
        ``Action.type`` on the wire.
    request
        The message the body is parsed as; ``None``: the body is ignored.
    result
        The message of the one ``Result``; ``None``: no ``Result``.
    read_only
        Whether the read-only token may run it (:mod:`flight.rpc.auth`).
    journal
        The journal record it writes, on a durable server; ``None``: it changes no
        durable state.
    """

    name: str
    request: type[Message] | None
    result: type[Message] | None
    read_only: bool
    journal: RecordKind | None

    @property
    def description(self) -> str:
        """What ListActions says of it: ``"<request> -> <result>"`` (``empty`` for none).

        Examples
        --------
        >>> COMMIT.description
        'CommitRequest -> CommitResult'
        """
        return f"{_message_name(self.request)} -> {_message_name(self.result)}"


def _message_name(message: type[Message] | None) -> str:
    return "empty" if message is None else message.DESCRIPTOR.name


CREATE_TABLE = Action("create_table", pb.CreateTableRequest, None, read_only=False,
                      journal=RecordKind.CREATE)
DROP_TABLE = Action("drop_table", pb.DropTableRequest, None, read_only=False,
                    journal=RecordKind.DROP)
COMMIT = Action("commit", pb.CommitRequest, pb.CommitResult, read_only=False,
                journal=RecordKind.COMMIT)
ABORT = Action("abort", pb.AbortRequest, None, read_only=False, journal=RecordKind.ABORT)
STATS = Action("stats", None, pb.Stats, read_only=True, journal=None)

#: Every DoAction, in the order ListActions lists them.
ACTIONS: tuple[Action, ...] = (CREATE_TABLE, DROP_TABLE, COMMIT, ABORT, STATS)

_BY_NAME: dict[str, Action] = {a.name: a for a in ACTIONS}


def action_named(name: str) -> Action:
    """The row of the action ``name``.

    Raises
    ------
    InputError
        If there is none: ``unknown action '<name>'; actions: create_table, ...``.

    Examples
    --------
    >>> action_named("stats").read_only
    True
    """
    action = _BY_NAME.get(name)
    if action is None:
        raise InputError(f"unknown action {quoted(name)}; actions: "
                         f"{', '.join(a.name for a in ACTIONS)}")
    return action
