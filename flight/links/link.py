"""One mirrored table: a subscription to a table of another server, applied to a local
:class:`~engine.sources.ReplicaTable` message for message (DESIGN.md §11).

A :class:`Link` runs one thread. It subscribes to the origin table (``DoExchange``, the
same protocol as any client: docs/protocol.md §7), and turns each message into one staged
change of the replica:

* a delta (``UPDATES``, no viewport) becomes a :class:`~engine.sources.ReplicaChange` with
  the message's removed, shifted, added and modified row keys and values: the replica's
  next update is the origin's update (or the origin's updates the message composed);
* a snapshot (the first subscription, a resume the origin could not serve from its history,
  or an origin that restarted: a new epoch) becomes a :meth:`~engine.sources.ReplicaTable.reset`,
  applied as only its difference from what the replica holds;
* a message that changes nothing (a status) updates what the link knows of its origin's
  own link, when the origin is itself a mirror.

When the stream breaks the link reconnects with backoff and resumes from the epoch and
sequence of the last message it staged (``resume``): the origin answers with the missed
updates composed into one delta, or with a snapshot. While it is not applying the origin's
updates as they come the link is *not in sync*, and says so in its :meth:`Link.status`
(the server puts it in stats, metrics, the web page and every message its own subscribers
receive). With ``give_up_after`` the link stops after that many seconds out of sync and the
replica fails (its subscribers are told ``FAILED_PRECONDITION``); without it the link
retries for ever. A subscription the origin refuses as invalid (``INVALID_ARGUMENT``: a
filter that does not fit the table, an unknown column) is not asked again: the link gives
up at once with the origin's reason.

The link's thread runs at the graph's cycle priority once the graph started (real-time when
``ticktable serve --cycle-priority realtime`` got it, :mod:`engine.priority`): each message
waits for the link's thread and then for the cycle it asks for, so both wake at once on a
busy host.

A filtered mirror (``MirrorSpec.filter``) sends the same filter bytes in every subscribe,
resumes included: the origin streams its shared filtered table of those bytes
(:mod:`flight.streams.filtered`), whose history answers a resume while it lingers there.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from engine.errors import InputError, ProtocolError, TableFailed, TicktableError, quoted
from engine.graph import UpdateGraph
from engine.priority import set_thread_priority
from engine.rowset import RowSet, RowSetShiftData
from engine.sources import ReplicaChange, ReplicaTable
from flight.links.spec import MirrorSpec, one_line
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import StreamEnded, decode_rows, read_message

__all__ = ["Link", "LinkGaveUp"]

log = logging.getLogger(__name__)

#: States of a link (``LinkStatus.state``).
CONNECTING, IN_SYNC, DISCONNECTED, GAVE_UP, UPSTREAM = (
    "connecting", "in sync", "disconnected", "gave up", "upstream not in sync")



class LinkGaveUp(TableFailed):
    """A mirror's link stopped trying: the replica fails with this."""


def _rows(data: bytes) -> RowSet:
    """A message's row set from its portable Roaring serialization (empty bytes: no rows).

    Raises
    ------
    ProtocolError
        If a key is not a row key (past the int64 range, which :func:`decode_rows`' int64
        keys would have made negative).
    """
    if not data:
        return RowSet()
    rows = RowSet.deserialize(data)
    if rows and rows.last() > _MAX_KEY:
        raise ProtocolError(f"protocol: a row key past {_MAX_KEY} ({rows.last()})")
    return rows


#: The largest row key (int64).
_MAX_KEY = (1 << 63) - 1


def _invalid_argument(exc: BaseException) -> bool:
    """Whether a call failed with INVALID_ARGUMENT. pyarrow raises ``ArrowInvalid`` for it and
    for RESOURCE_EXHAUSTED alike (a limit, worth another try later); only its text tells."""
    return isinstance(exc, pa.ArrowInvalid) and "invalid argument" in str(exc)


class Link:
    """Follows one table of another server into a local :class:`ReplicaTable` (see the
    module docstring).

    Parameters
    ----------
    graph
        The local graph.
    spec
        The origin table and the options.
    table
        A replica restored from a checkpoint (its ``position`` says where to resume), or
        ``None``: made at the first connection, from the origin's schema.
    on_table
        Called with the replica once it exists (to register it), on the link's thread.
    on_status
        Called with the link whenever its :meth:`status` changes, on the link's thread.
    on_staged
        Called with the size in bytes of each message staged (its values and metadata), on
        the link's thread: a durable server counts them toward its next checkpoint.
    reconnect_delay, max_reconnect_delay
        Backoff between attempts, doubling from the first to the second (with jitter).
    """

    def __init__(self, graph: UpdateGraph, spec: MirrorSpec, *, table: ReplicaTable | None = None,
                 on_table: Callable[[ReplicaTable], None] | None = None,
                 on_status: Callable[[Link], None] | None = None,
                 on_staged: Callable[[int], None] | None = None,
                 reconnect_delay: float = 0.1, max_reconnect_delay: float = 5.0) -> None:
        if spec.where is not None and spec.filter is None:  # never follow it unfiltered
            raise InputError(f"mirror {quoted(spec.name)}: filter {spec.where!r} is not "
                             f"compiled: MirrorSpec.bind(origin schema) first")
        self.graph = graph
        self.spec = spec
        self.table = table
        self.on_table = on_table
        self.on_status = on_status
        self.on_staged = on_staged
        self._delays = (reconnect_delay, max_reconnect_delay)
        self._lock = threading.Lock()
        self._state = CONNECTING
        self._detail = ""
        self._upstream: pb.LinkStatus | None = None  # the origin's own link, if a mirror
        self._out_since: float | None = time.monotonic()
        self._position: tuple[str, int] | None = None
        if table is not None:
            table.source = self
            if table.position is not None:
                epoch, sequence = table.position
                self._position = (str(epoch), int(sequence))
        self.reconnects = 0
        self.resumed_with_deltas = 0
        self.resumed_with_snapshot = 0
        self.messages = 0
        self.bytes_received = 0
        self._sessions = 0
        #: set once the replica exists, or the link gave up before making it
        self._settled = threading.Event()
        self._refused = False  # it gave up because the origin refused the subscription
        if table is not None:
            self._settled.set()
        self._closed = threading.Event()
        self._reader: Any = None
        #: the thread's scheduling priority: the graph's cycle thread's, once that started
        #: (a real-time cycle thread makes a real-time link: every message waits for both)
        self._priority = "normal"
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ticktable-link-{spec.name}"[:60])

    # ------------------------------------------------------------------ control
    def start(self) -> Link:
        """Start following the origin (in the background)."""
        self._thread.start()
        return self

    def wait_table(self, timeout: float | None = None) -> ReplicaTable:
        """The replica, waiting for the first connection to make it.

        Returns as soon as the link knows: a link that gives up before the origin's first
        answer (it refused the subscription) raises at once, not after ``timeout``.

        Raises
        ------
        TimeoutError
            If the origin did not answer in time (the link keeps trying).
        InputError
            If the origin refused the subscription as invalid (``INVALID_ARGUMENT``: a
            filter that does not fit its table, an unknown column): the link gave up, and
            the message is the origin's.
        LinkGaveUp
            If the link gave up otherwise before the replica was made.
        """
        if not self._settled.wait(timeout):
            raise TimeoutError(f"mirror {self.spec.name!r}: no answer from {self.spec.origin} "
                               f"within {timeout:g} s (last: {self._detail or self._state})")
        if self.table is None:
            why = f"mirror {self.spec.name!r} of {self.spec.origin} gave up: {self._detail}"
            raise InputError(why) if self._refused else LinkGaveUp(why)
        return self.table

    def wait_in_sync(self, timeout: float | None = None) -> bool:
        """Wait until the link is in sync and the replica applied what it staged; whether it
        got there in time."""
        end = None if timeout is None else time.monotonic() + timeout
        while end is None or time.monotonic() < end:
            if self.in_sync and self.table is not None and not self.table.pending_changes:
                return True
            time.sleep(0.005)
        return False

    def close(self) -> None:
        """Stop following (the replica keeps its rows); waits for the thread."""
        self._closed.set()
        reader = self._reader
        if reader is not None:
            try:
                reader.cancel()
            except Exception:
                pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10.0)

    # ------------------------------------------------------------------ status
    @property
    def in_sync(self) -> bool:
        """Whether the link, and every link before it, applies its origin's updates as
        they come."""
        with self._lock:
            return self._state == IN_SYNC and (self._upstream is None or self._upstream.in_sync)

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == IN_SYNC and self._upstream is not None and not self._upstream.in_sync:
                return UPSTREAM
            return self._state

    def status(self) -> pb.LinkStatus:
        """The link as ``LinkStatus`` (stats, and every message of the mirror's streams)."""
        with self._lock:
            up = self._upstream
            in_sync = self._state == IN_SYNC and (up is None or up.in_sync)
            state = UPSTREAM if self._state == IN_SYNC and not in_sync else self._state
            detail = self._detail
            if state == UPSTREAM and up is not None:
                detail = f"{self.spec.origin} is {up.state}" + (f": {up.detail}" if up.detail else "")
            since = self._out_since
            pos = self._position
        return pb.LinkStatus(
            in_sync=in_sync, state=state, origin=self.spec.origin, detail=detail,
            reconnects=self.reconnects, resumed_with_deltas=self.resumed_with_deltas,
            resumed_with_snapshot=self.resumed_with_snapshot,
            origin_epoch=pos[0] if pos else "", origin_sequence=pos[1] if pos else 0,
            out_of_sync_seconds=0.0 if in_sync or since is None else time.monotonic() - since)

    def _set_state(self, state: str, detail: str = "") -> None:
        with self._lock:
            before = (self._state, self._detail)
            self._state, self._detail = state, detail
            if state == IN_SYNC:
                self._out_since = None
            elif self._out_since is None:
                self._out_since = time.monotonic()
        if before != (state, detail):
            level = logging.INFO if state in (IN_SYNC, CONNECTING) else logging.WARNING
            log.log(level, "mirror %r of %s: %s%s", self.spec.name, self.spec.origin, state,
                    f" ({detail})" if detail else "")
            self._changed()

    def _changed(self) -> None:
        if self.on_status is not None:
            try:
                self.on_status(self)
            except Exception:
                log.exception("mirror %r: telling its subscribers", self.spec.name)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        delay = self._delays[0]
        while not self._closed.is_set():
            synced_before = self.messages
            try:
                self._session()
            except Exception as exc:
                if self._closed.is_set():
                    break
                if isinstance(exc, LinkGaveUp):
                    return
                if _invalid_argument(exc):  # asking again cannot help
                    self._refused = True
                    self._give_up(f"the origin refused the subscription: {one_line(exc)}")
                    return
                self._set_state(DISCONNECTED, one_line(exc))
            if self._closed.is_set():
                break
            limit = self.spec.give_up_after
            with self._lock:
                since = self._out_since
            if limit is not None and since is not None and time.monotonic() - since > limit:
                self._give_up(f"not in sync for {time.monotonic() - since:.1f} s "
                              f"(give_up_after {limit:g} s); last: {self._detail}")
                return
            if self.messages > synced_before:
                delay = self._delays[0]  # it was connected: start the backoff again
            self._closed.wait(delay * (0.5 + random.random()))
            delay = min(delay * 2, self._delays[1])
            self.reconnects += 1

    def _give_up(self, why: str) -> None:
        self._set_state(GAVE_UP, why)
        if self.table is not None:
            self.table.fail(LinkGaveUp(f"mirror {self.spec.name!r} of {self.spec.origin} gave "
                                       f"up: {why}"))
            self.graph.request_cycle()
        self._settled.set()  # wait_table answers now

    def _session(self) -> None:
        """One stream: subscribe (resuming when a position is known), apply until it breaks."""
        spec = self.spec
        client = spec.flight_client()
        writer = reader = None
        try:
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(spec.table),
                                                fl.FlightCallOptions(headers=spec.headers()))
            self._reader = reader
            if self._closed.is_set():
                return
            # the same filter bytes every time: a resume finds the origin's filtered table
            request = pb.SubscriptionRequest(table=spec.table, columns=list(spec.columns or ()),
                                             filter=spec.filter or b"")
            with self._lock:
                pos = self._position
            if pos is not None:
                request.resume, request.resume_epoch, request.resume_sequence = True, pos[0], pos[1]
            writer.begin(pa.schema([]))
            writer.write_metadata(pa.py_buffer(pb.ClientMessage(subscribe=request).SerializeToString()))
            schema = reader.schema
            table = self._ensure_table(schema)
            first = True
            while not self._closed.is_set():
                try:
                    msg = read_message(reader, schema)
                except StreamEnded as end:
                    writer.done_writing()
                    reader.read_chunk()  # raises the call's status
                    raise ConnectionError(f"the origin ended the stream: {end}") from None
                except StopIteration:
                    raise ConnectionError("the origin ended the stream") from None
                if self.graph.priority != self._priority:  # the graph's, once it started
                    self._priority = set_thread_priority(self.graph.priority)
                self._apply(table, msg.meta, msg.added, msg.modified, first)
                first = False
        finally:
            self._reader = None
            for fn in (getattr(reader, "cancel", None), getattr(writer, "close", None), client.close):
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        pass

    def _ensure_table(self, stream_schema: pa.Schema) -> ReplicaTable:
        """The replica: made from the origin's schema at the first connection; later, the
        origin's schema must still be the one it was made with."""
        cols = list(self.spec.columns) if self.spec.columns else stream_schema.names
        missing = [c for c in cols if c not in stream_schema.names]
        if missing:
            raise InputError(f"mirror {self.spec.name!r}: {self.spec.origin} has no column(s) {missing}")
        schema = pa.schema([stream_schema.field(c) for c in cols])
        if self.table is None:
            table = ReplicaTable(self.graph, schema, name=self.spec.name)
            table.source = self
            self.table = table
            if self.on_table is not None:
                try:
                    self.on_table(table)
                except TicktableError as exc:  # no room for one more table here: no mirror
                    self.table = None
                    self._give_up(f"its table cannot be registered here: {one_line(exc)}")
                    raise LinkGaveUp(self._detail) from None
            self._settled.set()
        elif not self.table.schema.equals(schema):
            self._give_up(f"the origin's schema changed to ({schema}); it was "
                          f"({self.table.schema}): drop the mirror and mirror the table again")
            raise LinkGaveUp(self._detail)
        return self.table

    def _apply(self, table: ReplicaTable, meta: pb.UpdateMetadata, added: pa.Table,
               modified: pa.Table, first: bool) -> None:
        """Stage one message as one change of the replica."""
        if meta.format != pb.DELTA_FORMAT_UPDATES or meta.has_viewport:
            raise ProtocolError(f"mirror {self.spec.name!r}: the origin sent a message of another "
                                f"format or with a viewport")
        names = table.schema.names
        position = (meta.epoch, int(meta.sequence))
        upstream = pb.LinkStatus()
        upstream.CopyFrom(meta.link)
        had = meta.HasField("link")
        self.messages += 1
        # the received buffers' sizes (unsliced IPC buffers: what ``nbytes`` counts, without
        # its walk over the buffers' offsets, ~8 us a table)
        nbytes = added.get_total_buffer_size() + modified.get_total_buffer_size() + meta.ByteSize()
        self.bytes_received += nbytes
        if meta.is_snapshot:
            keys = decode_rows(meta.added_rows)
            table.reset(keys, added.select(names), position=position)
            if not first or meta.resume == pb.RESUME_SNAPSHOT:
                self.resumed_with_snapshot += 1
        else:
            # the row sets straight from their Roaring bytes (not keys, then a bitmap again)
            removed, add = _rows(meta.removed_rows), _rows(meta.added_rows)
            mod = _rows(meta.modified_data_rows)
            shifts = meta.shifts
            if removed or add or mod or len(shifts.begins) or meta.coalesced:
                table.apply(ReplicaChange(
                    removed=removed,
                    shifted=RowSetShiftData.from_arrays(
                        np.asarray(shifts.begins, np.int64), np.asarray(shifts.ends, np.int64),
                        np.asarray(shifts.deltas, np.int64))
                    if len(shifts.begins) or len(shifts.ends) or len(shifts.deltas)
                    else RowSetShiftData.empty(),
                    added=add,
                    modified=mod,
                    modified_columns=frozenset(m.column for m in meta.modified if m.column in names),
                    added_rows=added.select(names), modified_rows=modified.select(names),
                    position=position))
            if first and meta.resume == pb.RESUME_DELTAS:
                self.resumed_with_deltas += 1
        if self.on_staged is not None:
            self.on_staged(nbytes)
        self.graph.request_cycle()  # applied now, not at the next periodic cycle (as a write)
        with self._lock:
            self._position = position
            up_changed = (self._upstream is not None) != had or (
                had and self._upstream is not None and (
                    self._upstream.in_sync, self._upstream.state, self._upstream.detail)
                != (upstream.in_sync, upstream.state, upstream.detail))
            self._upstream = upstream if had else None
        if self._state != IN_SYNC:
            self._set_state(IN_SYNC)
        elif up_changed:
            self._changed()
