"""The server's named tables and, per table, the publisher that numbers its updates.

A :class:`TableEntry` is a live table the server exposes under a name: a source table
writers push into (``append``, ``keyed``, ``ring``) or a table derived server-side. Each
entry has a :class:`Publisher`, which listens to the table inside every cycle, gives each
update the table's next *sequence number*, keeps a bounded history of recent updates (for
subscribers resuming after a dropped connection) and hands the update to every subscriber.

The history holds row sets only (updates and the row set before each), never values: a
subscriber resuming or catching up composes the updates it missed
(:func:`~flight.streams.pending.compose_run`) and reads the values of the rows they touch
from the table's current state, under the graph's shared lock.

The seam to the consumers is typed: a publisher feeds :class:`UpdateSink` s (a
subscription's stream, a fan-out, a web feed) and keeps, per key, the fan-outs its
subscribers share (:meth:`Publisher.fanout`).

A *pending* table (:func:`pending_name`) is one being filled before it takes its name: the
server creates it under a name of its own, writes its rows, then renames it in one step
(:meth:`TableRegistry.rename`), so a ``CREATE TABLE ... AS SELECT`` or a replacing ingest is
never seen, nor left behind by a crash, half done. Pending tables are in no listing
(:meth:`TableRegistry.names`, :meth:`TableRegistry.entries`); recovery drops those left.
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import pyarrow as pa

from engine._kernels.hashing import hash_column
from engine.errors import (
    InputError,
    LimitExceeded,
    SchemaError,
    TableExists,
    TableFailed,
    TableNotFound,
)
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.sources import AppendOnlyTable, KeyedTable, RingTable
from engine.table import Table
from engine.update import TableUpdate
from flight.limits import limit_text, quoted
from flight.pb import flight_pb2 as pb
from flight.wire import SOURCE_KINDS, TableKind

__all__ = ["MAX_RING_CAPACITY", "PENDING_PREFIX", "HistoryEntry", "Publisher", "TableEntry",
           "TableRegistry", "UpdateSink", "is_pending", "pending_name", "quoted"]

log = logging.getLogger(__name__)


#: Largest ring capacity: a ring allocates every column for its capacity when it is created.
MAX_RING_CAPACITY = 1 << 30

#: The start of a pending table's name (:func:`pending_name`); no other name may start so.
PENDING_PREFIX = "__pending__:"


def pending_name() -> str:
    """A new name for a pending table (see the module's docstring)."""
    return f"{PENDING_PREFIX}{uuid.uuid4().hex}"


def is_pending(name: str) -> bool:
    """Whether ``name`` is a pending table's."""
    return name.startswith(PENDING_PREFIX)


#: Delta messages a publisher holds at one sequence for streams to share (Publisher.delta),
#: and their bytes at most.
MAX_SHARED_DELTAS = 16
MAX_SHARED_DELTA_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One update of a table: its sequence number, step, and the row set before it."""

    sequence: int
    step: int
    update: TableUpdate
    prev: RowSet


class UpdateSink(Protocol):
    """What a publisher feeds: called inside the cycle, after the table committed.

    Neither call may wait on a client: a sink queues the entry
    (:class:`~flight.streams.pending.PendingUpdates`) and sends it later, on its own thread.
    """

    def on_table_update(self, entry: HistoryEntry) -> None:
        """The table's next update (previous values are readable until the cycle ends)."""

    def on_table_failure(self, exc: BaseException) -> None:
        """The table failed or was dropped: no more updates."""


S = TypeVar("S", bound=UpdateSink)
M = TypeVar("M")


class Publisher:
    """Numbers a table's updates, keeps a bounded history and fans out to subscribers.

    Parameters
    ----------
    table
        The table to publish.
    history_updates
        How many recent updates to keep for resuming subscribers.
    history_rows
        Bound on the total rows (added + removed + modified) the kept updates touch.
    """

    def __init__(self, table: Table, *, history_updates: int = 256,
                 history_rows: int = 2_000_000) -> None:
        self.table = table
        self.epoch = uuid.uuid4().hex[:16]
        self.sequence = 0
        self.history_updates = history_updates
        self.history_rows = history_rows
        self._history: collections.deque[HistoryEntry] = collections.deque()
        self._history_rows = 0
        self._sinks: list[UpdateSink] = []
        self._lock = threading.Lock()
        # per (columns, batch rows): the fan-out writing one shared message per update to
        # every subscriber of those columns that holds every row (flight/streams/fanout.py)
        self._fanouts: dict[Hashable, UpdateSink] = {}
        # the last snapshot message built, as ((sequence, key), message): streams opening
        # at one state share it (see snapshot)
        self._snapshot_lock = threading.Lock()
        self._snapshot: tuple[tuple[int, Hashable], object] | None = None
        # the deltas built at the current sequence, per (key, start): streams catching up
        # from one state share each (see delta); a build in progress is an Event to wait on
        self._deltas: dict[tuple[Hashable, int], object] = {}
        self._delta_bytes = 0  # of the messages in _deltas
        self.deltas_shared = 0  # deltas served from another stream's build
        self._handle = table.listen(self._on_update, self._on_failure)

    # inside the cycle ----------------------------------------------------------------
    def _on_update(self, update: TableUpdate, table: Table) -> None:
        with self._lock:
            self.sequence += 1
            self._snapshot = None  # of the state before this update
            self._deltas, self._delta_bytes = {}, 0
            entry = HistoryEntry(self.sequence, table.graph.step, update, table.prev_rowset)
            self._history.append(entry)
            self._history_rows += _touched(update)
            while self._history and (len(self._history) > self.history_updates
                                     or self._history_rows > self.history_rows):
                old = self._history.popleft()
                self._history_rows -= _touched(old.update)
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink.on_table_update(entry)
            except Exception:  # one broken subscriber must not stop the others or the cycle
                log.exception("subscriber %r on table %r failed; removed", sink, table.name)
                self.unsubscribe(sink)

    def _on_failure(self, exc: BaseException, table: Table) -> None:
        if not isinstance(exc, TableFailed):  # subscribers answer FAILED_PRECONDITION, as DoGet
            failed = TableFailed(f"table {table.name!r} failed: {exc}")
            failed.__cause__ = exc
            exc = failed
        with self._lock:
            sinks = list(self._sinks)
        for sink in sinks:
            try:
                sink.on_table_failure(exc)
            except Exception:
                log.exception("subscriber %r could not be told of the failure", sink)

    # subscribers (call under the graph's shared lock so no update is missed) ----------
    def subscribe(self, sink: UpdateSink) -> int:
        """Start feeding ``sink``; returns the sequence number of the state it starts from."""
        with self._lock:
            self._sinks.append(sink)
            return self.sequence

    def unsubscribe(self, sink: UpdateSink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)
            if not self._sinks:  # nobody left to open a stream at this state
                self._snapshot = None
                self._deltas, self._delta_bytes = {}, 0

    @property
    def subscribers(self) -> list[UpdateSink]:
        with self._lock:
            return list(self._sinks)

    def missed_since(self, sequence: int) -> list[HistoryEntry] | None:
        """The history entries after ``sequence``, in order (empty when none).

        ``None`` when some of them are no longer held. Call under the graph's shared lock
        (the entries then lead to the current state).
        """
        with self._lock:
            if sequence > self.sequence:
                return None
            if sequence == self.sequence:
                return []
            if not self._history or self._history[0].sequence > sequence + 1:
                return None
            return [e for e in self._history if e.sequence > sequence]

    def snapshot(self, key: Hashable, build: Callable[[], M]) -> M:
        """The snapshot message of the current state for ``key``, built once for every
        stream that opens with it.

        A thousand clients subscribing at once would otherwise each have the whole table
        gathered and framed for them, under the shared lock, and each hold its own copy of
        the frames until sent: one copy instead, whatever their number. Callers building at
        the same time wait for one build (the others are then served from it).

        Held until the table's next update, a snapshot for another key, or the last
        subscriber leaving: at most one message per table.

        Parameters
        ----------
        key
            Everything the message depends on besides the table's state: the codec's
            :meth:`~flight.streams.codec.DeltaCodec.snapshot_key`, the graph step and the
            resume answer it carries.
        build
            Builds the message (called under the graph's shared lock, as this is).
        """
        with self._snapshot_lock:
            with self._lock:
                held = self._snapshot
                at = (self.sequence, key)
            if held is not None and held[0] == at:
                return cast(M, held[1])  # built by a caller of this key
            msg = build()
            with self._lock:
                if self.sequence == at[0]:  # always, under the shared lock
                    self._snapshot = (at, msg)
            return msg

    def delta(self, key: Hashable, start: int, build: Callable[[], M],
              size: Callable[[M], int]) -> M:
        """The delta message from the state after update ``start`` to the current state for
        ``key``, built once for every stream that catches up from ``start`` with it.

        Streams that are not in a fan-out (behind, stalled, or between joins) each build
        their own message under the shared lock, and under load many wake for the same
        update, at the same sequence: the rows of one composed update are then read and
        framed once, and the cycle waits for one reader's build instead of one per stream.
        Callers of one ``(key, start)`` building at the same time wait for the first one's
        build; builds of other keys go on meanwhile.

        Held until the table's next update or the last subscriber leaving, at most
        :data:`MAX_SHARED_DELTAS` messages and :data:`MAX_SHARED_DELTA_BYTES` per table (past
        that, a delta is built for its caller only).

        Parameters
        ----------
        key
            Everything the message depends on besides the two states: the codec's
            :meth:`~flight.streams.codec.DeltaCodec.snapshot_key` and the graph step it
            carries (for a stream whose client holds every row).
        start
            The sequence of the state the client holds.
        build
            Builds the message (called under the graph's shared lock, as this is).
        size
            A message's size in bytes.
        """
        at = (key, start)
        with self._lock:
            sequence = self.sequence
            held = self._deltas.get(at)
            mine = held is None and len(self._deltas) < MAX_SHARED_DELTAS
            if mine:
                done = threading.Event()
                self._deltas[at] = done
        if held is not None and not isinstance(held, threading.Event):
            with self._lock:
                self.deltas_shared += 1
            return cast(M, held)
        if isinstance(held, threading.Event):
            held.wait()
            with self._lock:
                msg = self._deltas.get(at)
                if msg is not None and not isinstance(msg, threading.Event):
                    self.deltas_shared += 1
                    return cast(M, msg)
            return build()  # the first build failed: this caller tries its own
        if not mine:
            return build()
        try:
            msg = build()
        except BaseException:
            with self._lock:
                if self._deltas.get(at) is done:
                    del self._deltas[at]
            done.set()
            raise
        nbytes = size(msg)
        with self._lock:
            if self._deltas.get(at) is done:  # else the table moved on or nobody is left
                if (self.sequence == sequence  # always, under the shared lock
                        and self._delta_bytes + nbytes <= MAX_SHARED_DELTA_BYTES):
                    self._deltas[at] = msg
                    self._delta_bytes += nbytes
                else:
                    del self._deltas[at]
        done.set()
        return msg

    def fanout(self, key: Hashable, create: Callable[[], S]) -> S:
        """The fan-out (see :mod:`flight.streams.fanout`) for ``key``, created if there is none.

        Every caller of one key creates the same type (the key names the fan-out's stream).
        """
        with self._lock:
            fan = self._fanouts.get(key)
            if fan is None:
                fan = self._fanouts[key] = create()
            return cast(S, fan)  # created by a caller of this key

    def drop_fanout(self, key: Hashable, fan: UpdateSink) -> None:
        """Forget ``fan`` (it has no subscribers left); a later subscriber creates a new one."""
        with self._lock:
            if self._fanouts.get(key) is fan:
                del self._fanouts[key]

    def close(self) -> None:
        self._handle.remove()


def _touched(update: TableUpdate) -> int:
    return len(update.added) + len(update.removed) + len(update.modified)


@dataclass(slots=True)
class TableEntry:
    """A table the server exposes by name."""

    name: str
    table: Table
    kind: str  # a TableKind
    keys: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    publisher: Publisher | None = None
    children: set[str] = field(default_factory=set)
    durable: bool = False  # journaled and checkpointed (flight.durability.durable); demo tables are not
    #: a mirrored table's link status (flight.links), carried in its subscribers' messages
    status: Callable[[], pb.LinkStatus | None] | None = None
    #: a filtered subscription's table (flight.streams.filtered): the registry's entry it
    #: filters (its name is that entry's; it is not in the registry)
    filter_of: TableEntry | None = None

    @property
    def listed(self) -> TableEntry:
        """The registry's entry this one stands for: itself, or the table it filters."""
        return self.filter_of or self

    @property
    def is_source(self) -> bool:
        return self.kind in SOURCE_KINDS


class TableRegistry:
    """The server's tables by name (thread-safe).

    Reads (:meth:`get`, :meth:`names`, :meth:`entries`) take no lock: each reads one copy
    of the name -> entry dict (``dict(d)`` is one step under the GIL), so code holding the
    graph's lock (cycle listeners, a commit publishing staged parts) may call them. Changes
    hold the registry's lock and may take the graph's lock inside it (a create builds its
    table under the exclusive lock): that is the one lock order, registry then graph, and a
    read under the graph's lock waiting for the registry would deadlock against it.

    Parameters
    ----------
    graph
        The update graph every table lives in.
    history_updates
        Per table, how many recent updates are kept for resuming subscribers.
    max_tables, max_columns
        Tables the registry holds at most, and columns per table (``None``: no limit);
        :mod:`flight.limits`. Read at each creation (a durable server's replay sets them).
    """

    def __init__(self, graph: UpdateGraph, *, history_updates: int = 256,
                 history_rows: int = 2_000_000, max_tables: int | None = None,
                 max_columns: int | None = None) -> None:
        self.graph = graph
        self.history_updates = history_updates
        self.history_rows = history_rows
        self.max_tables = max_tables
        self.max_columns = max_columns
        self._entries: dict[str, TableEntry] = {}
        self._lock = threading.RLock()
        self.on_drop: list[Callable[[str], None]] = []
        #: ``claim(name, kind)``: why no table of ``kind`` may take ``name`` though no table
        #: holds it (a mirror holds its name from its start, before its origin's first
        #: answer registers its table), or None; asked under :attr:`lock` before a new name
        #: is taken
        self.claims: list[Callable[[str, str], str | None]] = []

    @property
    def lock(self) -> threading.RLock:
        """Held while a name is checked and taken: whoever claims names holds it too."""
        return self._lock

    def get(self, name: str) -> TableEntry:
        """The entry called ``name``.

        Raises
        ------
        TableNotFound
            Naming the tables that do exist.
        """
        entry = self._entries.get(name)
        if entry is None:
            have = ", ".join(self.names()) or "none"
            raise TableNotFound(f"no table {quoted(name)} (tables: {have}); create it "
                                f"first (create_table) or check the name")
        return entry

    def names(self) -> list[str]:
        """The tables' names, sorted (pending tables' not among them)."""
        return sorted(n for n in dict(self._entries) if not is_pending(n))

    def holds(self, entry: TableEntry) -> bool:
        """Whether ``entry`` is still the registry's table of its name (not dropped or
        replaced)."""
        return self._entries.get(entry.name) is entry

    def entries(self) -> list[TableEntry]:
        """The entries by name (pending tables' not among them)."""
        entries = dict(self._entries)
        return [entries[n] for n in sorted(entries) if not is_pending(n)]

    def entries_in_order(self) -> list[TableEntry]:
        """Every entry in creation order (a table comes after the tables it derives from),
        pending tables' too."""
        return list(dict(self._entries).values())

    def add(self, name: str, table: Table, kind: str, *, keys: list[str] | None = None,
            parents: list[str] | None = None, replace: bool = False,
            pending: bool = False) -> TableEntry:
        """Expose ``table`` as ``name`` (a :func:`pending_name` only with ``pending``).

        Raises
        ------
        TableExists
            If the name is taken and ``replace`` is false.
        InputError
            If the name is empty, too long, holds control characters or is a pending
            table's without ``pending``.
        LimitExceeded
            If the table has more than ``max_columns`` columns, or is new and the registry
            holds ``max_tables`` already.
        """
        _check_name(name, pending=pending)
        with self._lock:
            if name in self._entries:
                if not replace:
                    raise TableExists(f"table {name!r} already exists; drop it first or pick "
                                      f"another name")
                self._check_limits(name, table.schema, new=False)
                self.drop(name)
            else:
                self._check_claims(name, kind)
                if not pending:  # a pending table is checked when it takes its name (rename)
                    self._check_limits(name, table.schema, new=True)
            table.name = name
            entry = TableEntry(name, table, kind, list(keys or []), list(parents or []))
            entry.publisher = Publisher(table, history_updates=self.history_updates,
                                        history_rows=self.history_rows)
            self._entries[name] = entry
            for parent in entry.parents:
                if parent in self._entries:
                    self._entries[parent].children.add(name)
            return entry

    def create_source(self, name: str, schema: pa.Schema, kind: str, *,
                      keys: list[str] | None = None, capacity: int = 0,
                      if_not_exists: bool = False, pending: bool = False) -> TableEntry:
        """Create a source table writers can push into (a pending one with ``pending``:
        ``name`` is then a :func:`pending_name`).

        Raises
        ------
        TableExists
            If the name is taken: at all, or (with ``if_not_exists``) by a table of another
            schema, kind or keys.
        InputError
            Unknown kind, missing keys for a keyed table, or a ring capacity outside
            ``1..MAX_RING_CAPACITY`` (or one the server cannot allocate); a pending
            table's name without ``pending``.
        SchemaError
            If column names repeat, or ``keys`` repeat, name columns that are not in
            ``schema`` or columns of a type keys cannot have (lists, structs, maps, unions,
            null): refused here rather than by the first write.
        LimitExceeded
            If ``schema`` has more than ``max_columns`` columns, or the registry holds
            ``max_tables`` already.
        """
        _check_name(name, pending=pending)
        if kind not in SOURCE_KINDS:
            raise InputError(f"unknown table kind {kind!r} for {name!r}; use one of "
                             f"{tuple(k.value for k in SOURCE_KINDS)}")
        keys = list(keys or [])
        if kind == TableKind.KEYED and not keys:
            raise InputError(f"keyed table {name!r} needs key columns (keys=...)")
        if kind != TableKind.KEYED and keys:
            raise InputError(f"{kind} table {name!r} takes no keys; use kind 'keyed' for "
                             f"upserts")
        _check_columns(name, schema, keys)
        if kind == TableKind.RING and not 0 < capacity <= MAX_RING_CAPACITY:
            raise InputError(f"ring table {name!r} needs a capacity of 1 to {MAX_RING_CAPACITY} "
                             f"rows, got {capacity} (a ring allocates its capacity at once)")
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None and if_not_exists:
                if (existing.kind != kind or not existing.table.schema.equals(schema)
                        or existing.keys != keys):
                    raise TableExists(
                        f"table {name!r} exists as a {existing.kind} table with columns "
                        f"({_columns(existing.table.schema)}) and keys {existing.keys}, not as "
                        f"requested ({kind}, ({_columns(schema)}), keys {keys}); drop it first "
                        f"or pick another name")
                return existing
            if existing is not None:
                raise TableExists(f"table {name!r} already exists; drop it first or pass "
                                  f"if_not_exists")
            self._check_claims(name, kind)  # before a table is made for nothing
            if not pending:  # before a ring allocates its capacity; a pending table is
                # checked when it takes its name (rename): a replacement at the limit is not
                # refused for the moment both tables exist
                self._check_limits(name, schema, new=True)
            table: Table
            with self.graph.exclusive_lock():
                if kind == TableKind.APPEND:
                    table = AppendOnlyTable(self.graph, schema, name=name)
                elif kind == TableKind.KEYED:
                    table = KeyedTable(self.graph, schema, keys, name=name)
                else:
                    try:
                        table = RingTable(self.graph, schema, capacity, name=name)
                    except MemoryError as exc:
                        raise InputError(f"ring table {name!r}: {capacity} rows of "
                                         f"({_columns(schema)}) do not fit in the server's "
                                         f"memory; use a smaller capacity") from exc
                return self.add(name, table, kind, keys=keys, pending=pending)

    def rename(self, name: str, to: str, *, replace: bool = False) -> TableEntry:
        """Give the pending source table ``name`` the name ``to``, in one step: a reader
        finds the table ``to`` was, or this one with all its rows, never neither.

        With ``replace``, a source table called ``to`` is dropped in the same step.

        Raises
        ------
        TableNotFound
            If there is no table ``name``.
        TableExists
            If ``to`` is taken and ``replace`` is false (or a claim holds it).
        LimitExceeded
            If the table has more than ``max_columns`` columns, or ``to`` is new and the
            registry holds ``max_tables`` tables already (pending ones not counted).
        InputError
            If ``to`` is a derived table, or has derived tables; or is no name a table may
            take.
        """
        _check_name(to)
        with self._lock:
            entry = self.get(name)
            assert is_pending(name) and entry.is_source, name
            existing = self._entries.get(to)
            self._check_limits(to, entry.table.schema, new=existing is None)
            if existing is not None:
                if not replace:
                    raise TableExists(f"table {to!r} already exists; drop it first or pick "
                                      f"another name")
                if not existing.is_source:
                    raise InputError(f"table {to!r} is a {existing.kind} table, not a source "
                                     f"table; drop it first")
                self.drop(to)  # refuses a table others derive from
            else:
                self._check_claims(to, entry.kind)
            del self._entries[name]
            entry.name = entry.table.name = to
            self._entries[to] = entry
            return entry

    def _check_claims(self, name: str, kind: str) -> None:
        """Raise TableExists if a claim holds ``name`` against a table of ``kind`` (:attr:`claims`)."""
        for claim in self.claims:
            why = claim(name, kind)
            if why is not None:
                raise TableExists(why)

    def _check_limits(self, name: str, schema: pa.Schema, *, new: bool) -> None:
        """Refuse a table of more than ``max_columns`` columns, or a new one past ``max_tables``."""
        if self.max_columns is not None and len(schema) > self.max_columns:
            raise LimitExceeded(f"table {quoted(name)} would have {len(schema)} columns, above "
                                f"{limit_text('max_columns', self.max_columns)}; use fewer "
                                f"columns or split the table")
        if not new or self.max_tables is None:
            return
        held = sum(1 for n in self._entries if not is_pending(n))  # pending ones: at rename
        if held >= self.max_tables:
            raise LimitExceeded(f"cannot create table {quoted(name)}: the server holds "
                                f"{held} tables, "
                                f"{limit_text('max_tables', self.max_tables)}; drop tables "
                                f"no longer needed")

    def drop(self, name: str) -> bool:
        """Drop ``name``; returns False when no such table existed.

        Raises
        ------
        InputError
            If other tables are derived from it (drop those first).
        """
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                return False
            live = sorted(c for c in entry.children if c in self._entries)
            if live:
                raise InputError(f"table {name!r} has derived tables {live}; drop them first")
            del self._entries[name]
            for parent in entry.parents:
                if parent in self._entries:
                    self._entries[parent].children.discard(name)
        with self.graph.exclusive_lock():
            if entry.publisher is not None:
                for sink in entry.publisher.subscribers:
                    sink.on_table_failure(TableNotFound(f"table {name!r} was dropped"))
                entry.publisher.close()
            entry.table.close()
        for callback in list(self.on_drop):
            callback(name)
        return True


def _columns(schema: pa.Schema) -> str:
    """``schema`` on one line: ``name: type, ...``."""
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _check_name(name: str, *, pending: bool = False) -> None:
    if not name or len(name) > 200 or not name.isprintable():
        raise InputError(f"bad table name {quoted(name)}: use 1-200 characters, none of them "
                         f"control characters")
    if is_pending(name) != pending:
        raise InputError(f"bad table name {quoted(name)}: names starting with "
                         f"{PENDING_PREFIX!r} are the server's own (tables being filled)")


def _check_columns(name: str, schema: pa.Schema, keys: list[str]) -> None:
    """Refuse repeated column names, and keys a keyed table could not hash (see create_source)."""
    for c, n in collections.Counter(schema.names).items():
        if n > 1:
            raise SchemaError(f"table {name!r}: column {quoted(c)} appears {n} times; column "
                              f"names must be unique")
    for k, n in collections.Counter(keys).items():
        if n > 1:
            raise SchemaError(f"keyed table {name!r}: key column {quoted(k)} is named {n} times "
                              f"in keys")
    for k in keys:
        if k not in schema.names:
            raise SchemaError(f"keyed table {name!r}: key column {quoted(k)} is not in the "
                              f"schema ({_columns(schema)})")
        t = schema.field(k).type
        if not _hashable(t):
            raise SchemaError(
                f"keyed table {name!r}: key column {quoted(k)} has type {t}, which a key cannot "
                f"have (keys are hashed and compared); use integers, floats, booleans, temporal "
                f"types, strings, binaries or decimals")


def _hashable(t: pa.DataType) -> bool:
    """Whether keys of type ``t`` can be hashed and compared (the engine's one row hash says)."""
    if pa.types.is_dictionary(t):
        t = t.value_type  # hashed by its dictionary
    if pa.types.is_null(t):
        return False  # nothing but nulls, and keys may not be null
    try:
        hash_column(pa.array([], type=t))
    except (SchemaError, pa.ArrowException):
        return False
    return True
