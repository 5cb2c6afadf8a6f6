"""One subscriber's stream (``DoExchange``): snapshot, then one message per update.

Threads and locks. The update cycle calls :meth:`Subscription.on_table_update` (through the
table's :class:`~flight.streams.registry.Publisher`), which only appends the update to a pending
list: the cycle never waits on a client. The DoExchange handler thread runs
:meth:`Subscription.run`: it waits for pending updates (or a subscription change), takes
the graph's *shared* lock, composes what is pending into one update, reads the values of
the rows it must send from the table's current state, releases the lock and writes. Under
the shared lock no cycle runs, so the composed update and the values it reads are one
consistent step.

Fan-out. A stream holding every row (no viewport) of an ``UPDATES`` subscription is, once
caught up, handed to the :class:`~flight.streams.fanout.FanOut` of its columns: one thread that
per update builds one message under the shared lock and writes it to every such stream.
Its handler thread then only waits, and takes the stream back (catching up from the
publisher's history) when its client changes the subscription, stalls or leaves; a
stalled stream joins again once caught up, after a back-off.

Slow consumers. While the handler is blocked writing to a slow client, updates pile up in
the pending list; past ``max_pending`` they are composed into one in the cycle (exact
:func:`~engine.update.compose`), so a subscriber costs at most one composed update of
memory (bounded by the table's size) and still converges: it just receives fewer, larger
messages. Values are never queued; they are read when sent.

Viewports are Barrage's: the client tracks every row key (added/removed/shifted row
sets are always sent whole) but holds values only for the rows at the viewport's
positions. Each message carries the values of rows newly in the viewport and of modified
rows it already held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import Overloaded, ProtocolError, SchemaError
from engine.rowset import RowSet
from engine.update import TableUpdate, compose
from flight.errors import again
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import batch_frames, frame, schema_frame
from flight.streams.fanout import FanOut
from flight.streams.registry import HistoryEntry, TableEntry
from flight.wire import DIFF, TIME

__all__ = ["Subscription", "SubscriptionOptions", "triples_schema"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SubscriptionOptions:
    """Server-wide limits for subscriptions."""

    max_batch_rows: int = 65_536
    max_pending: int = 32
    poll_seconds: float = 0.25
    stall_seconds: float = 0.1  # a fan-out write blocked this long detaches its subscriber


def triples_schema(schema: pa.Schema) -> pa.Schema:
    """The stream schema of a ``TRIPLES`` subscription: the table's columns + time + diff."""
    return pa.schema([*schema, pa.field(TIME, pa.int64(), nullable=False),
                      pa.field(DIFF, pa.int64(), nullable=False)])


def _ranges(vp: Sequence[pb.PositionRange]) -> list[tuple[int, int]]:
    out = []
    for r in vp:
        if r.begin < 0 or r.end < r.begin:
            raise ProtocolError(f"bad viewport range [{r.begin}, {r.end}): need 0 <= begin <= end")
        out.append((int(r.begin), int(r.end)))
    return out


class Subscription:
    """The server side of one subscription (see the module docstring).

    Parameters
    ----------
    entry
        The subscribed table.
    request
        The client's first message.
    options
        Server limits.
    """

    def __init__(self, entry: TableEntry, request: pb.SubscriptionRequest,
                 options: SubscriptionOptions) -> None:
        self.entry = entry
        self.table = entry.table
        self.graph = entry.table.graph
        self.options = options
        self.format = request.format
        if self.format not in (pb.DELTA_FORMAT_UPDATES, pb.DELTA_FORMAT_TRIPLES):
            raise ProtocolError(f"unknown delta format {self.format}")
        self.columns = self._check_columns(list(request.columns))
        self.viewport: list[tuple[int, int]] | None = (
            _ranges(request.viewport) if request.has_viewport else None)
        if self.viewport is not None and self.format == pb.DELTA_FORMAT_TRIPLES:
            raise ProtocolError("a viewport needs the UPDATES format (triples have no positions)")
        self.batch_rows = max(1, min(request.max_batch_rows or options.max_batch_rows,
                                     options.max_batch_rows))
        self.min_interval = request.min_update_interval_ms / 1000.0
        self.request = request
        self.schema = (triples_schema(self.table.schema)
                       if self.format == pb.DELTA_FORMAT_TRIPLES else self.table.schema)
        # no rows in the stream schema (a triples message's rows gain time and diff later)
        self._no_rows = (self.table.schema if self.format == pb.DELTA_FORMAT_TRIPLES
                         else self.schema).empty_table()
        self._cond = threading.Condition()
        self._pending: list[HistoryEntry] = []
        self._pending_count = 0  # table updates in _pending (some may be composed)
        self._triples: list[pa.Table] = []
        self._change: pb.SubscriptionChange | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._held: RowSet | None = None  # keys whose values the client holds; None: all
        self._resnapshot = False  # send a snapshot next (the catch-up history is gone)
        self._writer: Any = None
        self._fanout: FanOut[_Encoded] | None = None  # writing this stream when set
        self._detached = False
        self._detach_error: BaseException | None = None
        self._fanout_stalls = 0
        self._rejoin_after = 0.0  # (monotonic) no joining a fan-out before this
        self.sequence = 0
        self.step = 0
        self.messages = 0
        self.coalesced = 0

    # ------------------------------------------------------------------ validation
    def _check_columns(self, columns: list[str]) -> list[str]:
        if not columns:
            return list(self.table.schema.names)
        unknown = [c for c in columns if c not in self.table.schema.names]
        if unknown:
            raise SchemaError(f"table {self.entry.name!r} has no column(s) {unknown} "
                              f"(columns: {', '.join(self.table.schema.names)})")
        return [c for c in self.table.schema.names if c in set(columns)]

    # ------------------------------------------------------- the cycle's side (sink)
    def on_table_update(self, entry: HistoryEntry) -> None:
        triples = None
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            triples = self._update_triples(entry.update, entry.step)
        with self._cond:
            if triples is not None:
                self._triples.append(triples)
            self._pending.append(entry)
            self._pending_count += 1
            if len(self._pending) > self.options.max_pending:
                self._collapse()
            self._cond.notify()

    def _collapse(self) -> None:
        """Compose every pending update into one (the client is behind)."""
        first = self._pending[0]
        total = first.update
        for e in self._pending[1:]:
            total = compose(total, e.update, first.prev)
        last = self._pending[-1]
        self._pending = [HistoryEntry(last.sequence, last.step, total, first.prev)]
        if len(self._triples) > 1:
            self._triples = [_consolidate_triples(pa.concat_tables(self._triples))]

    def on_table_failure(self, exc: BaseException) -> None:
        with self._cond:
            self._failure = exc
            self._cond.notify()

    # ---------------------------------------------------------------- client input
    def change(self, change: pb.SubscriptionChange) -> None:
        """Queue a viewport/column change from the client (applied by the sender)."""
        with self._cond:
            if self._change is None:
                self._change = change
            else:  # merge with a change not yet applied
                if change.set_columns:
                    self._change.set_columns = True
                    del self._change.columns[:]
                    self._change.columns.extend(change.columns)
                if change.set_viewport:
                    self._change.set_viewport = True
                    self._change.has_viewport = change.has_viewport
                    del self._change.viewport[:]
                    self._change.viewport.extend(change.viewport)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    # ------------------------------------------------------------------- the sender
    def run(self, writer: Any, context: Any) -> None:
        """Send the first message (snapshot or resume), then every update until closed."""
        publisher = self.entry.publisher
        assert publisher is not None
        writer.write_frames((schema_frame(self.schema),))
        with self.graph.shared_lock():
            self.table._check_alive()  # TableFailed: FAILED_PRECONDITION, as DoGet answers
            first = self._first_message(publisher)
            publisher.subscribe(self)
        self._writer = writer
        try:
            self._send(writer, first)
            last_sent = time.monotonic()
            while True:
                if self._fanout is None and self._may_share():
                    self._join_fanout(publisher)
                if self._fanout is not None:
                    if not self._wait_in_fanout(publisher, context):
                        return
                    continue
                with self._cond:
                    while not (self._pending or self._change or self._failure or self._closed
                               or self._resnapshot):
                        self._cond.wait(self.options.poll_seconds)
                        if context.is_cancelled():
                            return
                    if self._failure is not None:
                        # a copy: the raised one's traceback holds this frame, which holds
                        # self, which holds _failure (a cycle only the cyclic collector frees,
                        # and with it the table a drop released)
                        raise again(self._failure)
                    if self._closed:
                        raise Overloaded("the server is shutting down; reconnect to another or later")
                wait = last_sent + self.min_interval - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with self.graph.shared_lock():
                    with self._cond:
                        pending, self._pending = self._pending, []
                        count, self._pending_count = self._pending_count, 0
                        triples, self._triples = self._triples, []
                        change, self._change = self._change, None
                    out = self._next_message(publisher, pending, count, triples, change)
                if out is not None:
                    self._send(writer, out)
                    last_sent = time.monotonic()
        finally:
            if self._fanout is not None:
                self._fanout.leave(self)
            publisher.unsubscribe(self)

    # -------------------------------------------------------------- the fan-out
    def _may_share(self) -> bool:
        """Whether this stream is one a fan-out may write (``UPDATES``, no wait; every row,
        or a viewport whose rows the client holds)."""
        return (self.format == pb.DELTA_FORMAT_UPDATES and self.min_interval == 0
                and (self.viewport is None) == (self._held is None)
                and time.monotonic() >= self._rejoin_after)

    def _join_fanout(self, publisher: Any) -> None:
        """Hand this stream to the fan-out of its columns and viewport, if it is caught up.

        Subscribers of the same columns and the same viewport (many people watching the top
        of one table) share one fan-out: each update's viewport delta is built once."""
        viewport = None if self.viewport is None else tuple(self.viewport)
        key = (tuple(self.columns), self.batch_rows, viewport)
        with self.graph.shared_lock():  # no cycle: the publisher's sequence stands still
            with self._cond:
                if (self._pending or self._change or self._failure or self._closed
                        or self._resnapshot or self.sequence != publisher.sequence):
                    return
                if self._held is not None and self._held != self._viewport_keys(self.table.rowset):
                    return  # not holding the viewport's current rows (cannot happen caught up)
                fan = publisher.fanout(key, lambda: self._new_fanout(publisher, key))
                if fan.join(self):
                    publisher.unsubscribe(self)  # every later update comes through the fan-out
                    self._fanout = fan
                    self._detached, self._detach_error = False, None

    def _new_fanout(self, publisher: Any, key: tuple[Any, ...]) -> FanOut[_Encoded]:
        # builds with a subscription of these columns that holds every row (never sent to)
        # (called under the shared lock: a viewport's rows are taken at the publisher's state)
        proto = Subscription(self.entry, pb.SubscriptionRequest(
            table=self.entry.name, columns=self.columns, max_batch_rows=self.batch_rows),
            self.options)
        if self.viewport is not None:
            proto.viewport = list(self.viewport)
            proto._held = proto._viewport_keys(self.table.rowset)

        def build(pending: list[HistoryEntry], count: int) -> _Encoded:
            enc = proto._encode(proto._delta(publisher, _composed(pending), count,
                                             pending[-1].sequence, resume=pb.RESUME_NONE))
            return enc if proto._held is None else replace(enc, held=proto._held)

        return FanOut(self.graph, publisher, key, build, max_pending=self.options.max_pending,
                      stall_seconds=self.options.stall_seconds, name=self.entry.name,
                      loop=getattr(self._writer, "loop", None))

    def _wait_in_fanout(self, publisher: Any, context: Any) -> bool:
        """While the fan-out writes this stream: wait until it must be on its own again,
        then catch up from the last message the fan-out wrote. False: the client left."""
        fan = self._fanout
        assert fan is not None
        poll = min(self.options.poll_seconds, self.options.stall_seconds)
        cancelled = False
        with self._cond:
            while not (self._detached or self._change or self._failure or self._closed):
                self._cond.wait(poll)
                if context.is_cancelled():
                    cancelled = True
                    break
                if fan.retire_if_stalled(self):
                    # back in once caught up, after a wait doubling with each stall (2 s .. 1 min):
                    # a client that keeps stalling holds the others up rarely
                    self._fanout_stalls += 1
                    self._rejoin_after = time.monotonic() + min(60.0, 2.0 ** self._fanout_stalls)
            error, self._detach_error = self._detach_error, None
        fan.leave(self)  # no write to this stream is in flight after this
        self._fanout = None
        if error is not None:
            raise error
        if cancelled:
            return False
        if self._failure is not None or self._closed:
            return True  # the loop ends the stream
        with self.graph.shared_lock():
            missed = publisher.missed_since(self.sequence)
            publisher.subscribe(self)
            with self._cond:
                if missed is None:  # the history no longer reaches back: start over
                    self._resnapshot = True
                elif missed[2]:
                    update, prev, count = missed
                    self._pending = [HistoryEntry(publisher.sequence, self.graph.step, update, prev)]
                    self._pending_count = count
        return True

    def write_shared(self, msg: _Encoded) -> None:
        """The fan-out's thread writes ``msg`` to this stream (see flight/streams/fanout.py)."""
        self._send(self._writer, msg)
        if msg.held is not None:  # the viewport's rows the client holds after it
            self._held = msg.held

    def ready(self) -> bool:
        """Whether a write now would not block (see flight/streams/fanout.py)."""
        has_room = getattr(self._writer, "has_room", None)
        return has_room is not None and bool(has_room())

    def on_detached(self, exc: BaseException | None) -> None:
        with self._cond:
            self._detached = True
            self._detach_error = exc
            self._cond.notify()

    # ------------------------------------------------------- building messages
    def _base_meta(self, publisher: Any, **kw: Any) -> pb.UpdateMetadata:
        meta = pb.UpdateMetadata(epoch=publisher.epoch, step=self.graph.step,
                                 table_size=len(self.table.rowset), format=self.format,
                                 columns=self.columns, **kw)
        if self.viewport is not None:
            meta.has_viewport = True
            meta.viewport.extend(pb.PositionRange(begin=b, end=e) for b, e in self.viewport)
        return meta

    def _first_message(self, publisher: Any) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        """Under the shared lock: the snapshot, or the missed deltas of a resume."""
        req = self.request
        if req.resume:
            missed = (publisher.missed_since(int(req.resume_sequence))
                      if req.resume_epoch == publisher.epoch else None)
            if missed is not None and self.format == pb.DELTA_FORMAT_UPDATES:
                update, prev, count = missed
                # the client held the viewport's rows (or all); it resends no key list, so
                # for a viewport every row in it is sent again
                self._held = None if self.viewport is None else RowSet()
                return self._delta(publisher, update, count, int(req.resume_sequence) + count,
                                   resume=pb.RESUME_DELTAS)
            return self._snapshot(publisher, pb.RESUME_SNAPSHOT)
        return self._snapshot(publisher, pb.RESUME_NONE)

    def _snapshot(self, publisher: Any, resume: int) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        rowset = self.table.rowset
        meta = self._base_meta(publisher, sequence=publisher.sequence, is_snapshot=True,
                               resume=resume)
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            rows = self._rows(rowset.keys())
            data = _with_time_diff(rows, self.graph.step, np.ones(rows.num_rows, np.int64))
            return meta, data, self.schema.empty_table()
        meta.added_rows = rowset.serialize()
        held = self._viewport_keys(rowset)
        self._held = None if self.viewport is None else held
        meta.added_data_rows = held.serialize()
        return meta, self._rows(held.keys()), self.schema.empty_table()

    def _next_message(self, publisher: Any, pending: list[HistoryEntry], count: int,
                      triples: list[pa.Table],
                      change: pb.SubscriptionChange | None,
                      ) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table] | None:
        """Under the shared lock: the message bringing the client to the current state."""
        if change is not None and change.set_columns:
            self.columns = self._check_columns(list(change.columns))
            if change.set_viewport:
                self._set_viewport(change)
            return self._snapshot(publisher, pb.RESUME_NONE)
        if change is not None and change.set_viewport:
            self._set_viewport(change)
        if self._resnapshot:
            self._resnapshot = False
            return self._snapshot(publisher, pb.RESUME_NONE)
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            if not pending:
                return None
            data = (_consolidate_triples(pa.concat_tables(triples)) if len(triples) > 1
                    else triples[0] if triples else self.schema.empty_table())
            meta = self._base_meta(publisher, sequence=pending[-1].sequence, coalesced=count)
            self.coalesced += count - 1
            return meta, data, self.schema.empty_table()
        if pending:
            update = _composed(pending)
            self.coalesced += count - 1
            sequence = pending[-1].sequence
        else:
            update, sequence, count = TableUpdate(), self.sequence, 0
        return self._delta(publisher, update, count, sequence, resume=pb.RESUME_NONE)

    def _set_viewport(self, change: pb.SubscriptionChange) -> None:
        if change.has_viewport and self.format == pb.DELTA_FORMAT_TRIPLES:
            raise ProtocolError("a viewport needs the UPDATES format")
        self.viewport = _ranges(change.viewport) if change.has_viewport else None

    def _delta(self, publisher: Any, update: TableUpdate, count: int, sequence: int, *,
               resume: int) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        """The ``UPDATES`` message for ``update`` (which ends at the current state)."""
        meta = self._base_meta(publisher, sequence=sequence, coalesced=count, resume=resume)
        meta.added_rows = update.added.serialize()
        meta.removed_rows = update.removed.serialize()
        sh = update.shifted
        if len(sh.begins):
            meta.shifts.begins.extend(sh.begins.tolist())
            meta.shifts.ends.extend(sh.ends.tolist())
            meta.shifts.deltas.extend(sh.deltas.tolist())
        cols = [c for c in self.columns if c in update.modified_columns]
        if cols and update.modified:
            rows = update.modified.serialize()
            meta.modified.extend(pb.ColumnModified(column=c, rows=rows) for c in cols)
        if self.viewport is None and self._held is None:  # the client holds every row
            added_data = update.added
            modified_data = update.modified if cols else RowSet()
        else:
            held_after = (self.table.rowset - update.added if self._held is None
                          else update.shifted.apply(self._held - update.removed))
            now = self._viewport_keys(self.table.rowset)
            added_data = now - held_after
            modified_data = (update.modified & now & held_after) if cols else RowSet()
            self._held = None if self.viewport is None else now
        meta.added_data_rows = added_data.serialize()
        meta.modified_data_rows = modified_data.serialize()
        return meta, self._rows(added_data.keys()), self._rows(modified_data.keys())

    def _viewport_keys(self, rowset: RowSet) -> RowSet:
        if self.viewport is None:
            return rowset
        out = RowSet()
        for b, e in self.viewport:  # one slice per viewport range
            out = out | rowset.slice(b, e)
        return out

    def _rows(self, keys: np.ndarray) -> pa.Table:
        """Current values at ``keys`` in the stream schema (unsubscribed columns null)."""
        n = keys.size
        if n == 0:
            return self._no_rows
        carried = set(self.columns)
        return pa.Table.from_arrays(
            [self.table.column(f.name).get(keys) if f.name in carried else pa.nulls(n, f.type)
             for f in self.table.schema], schema=self._no_rows.schema)

    def _update_triples(self, update: TableUpdate, step: int) -> pa.Table:
        """Inside the cycle: this update as consolidated triples (old values at -1)."""
        parts = []
        old = update.removed | update.shifted.unapply(update.modified)
        if old:
            rows = self._prev_rows(old.keys())
            parts.append(_with_time_diff(rows, step, np.full(rows.num_rows, -1, np.int64)))
        new = update.added | update.modified
        if new:
            rows = self._rows(new.keys())
            parts.append(_with_time_diff(rows, step, np.ones(rows.num_rows, np.int64)))
        if not parts:
            return self.schema.empty_table()
        out = pa.concat_tables(parts)
        return _consolidate_triples(out) if update.modified else out

    def _prev_rows(self, keys: np.ndarray) -> pa.Table:
        arrays = [self.table.column(f.name).get_prev(keys) if f.name in self.columns
                  else pa.nulls(keys.size, f.type) for f in self.table.schema]
        return pa.Table.from_arrays(arrays, schema=self.table.schema)

    def send_end(self, writer: Any, error: str) -> None:
        """Tell the client no more messages follow (it should then finish writing)."""
        meta = pb.UpdateMetadata(end_of_stream=True, error=error, sequence=self.sequence,
                                 step=self.step, format=self.format)
        writer.write_frames((frame(app_metadata=meta.SerializeToString()),))

    # ------------------------------------------------------------------- writing
    def _encode(self, msg: tuple[pb.UpdateMetadata, pa.Table, pa.Table]) -> _Encoded:
        """A message framed once, ready to write (immutable: several subscribers send the
        same frames): the added and modified record batches, the first carrying the
        ``UpdateMetadata`` (one gRPC message for a delta of one batch), or the metadata
        alone when there are none."""
        meta, added, modified = msg
        a = _batches(added, self.batch_rows)
        m = _batches(modified, self.batch_rows)
        meta.num_added_batches = len(a)
        meta.num_modified_batches = len(m)
        schema = added.schema if a else modified.schema
        data = meta.SerializeToString()
        frames = (tuple(batch_frames(schema, (*a, *m), first_metadata=data)) if a or m
                  else (frame(app_metadata=data),))
        return _Encoded(frames, int(meta.sequence), int(meta.step))

    def _send(self, writer: Any,
              msg: tuple[pb.UpdateMetadata, pa.Table, pa.Table] | _Encoded) -> None:
        enc = msg if isinstance(msg, _Encoded) else self._encode(msg)
        writer.write_frames(enc.frames)
        self.sequence = enc.sequence
        self.step = enc.step
        self.messages += 1


@dataclass(frozen=True, slots=True)
class _Encoded:
    """One subscription message: its ``FlightData`` frames (record batches, the first with the
    metadata; or the metadata alone)."""

    frames: tuple[bytes, ...]
    sequence: int
    step: int
    held: RowSet | None = None  # a viewport fan-out's: the rows the client holds after it


def _composed(pending: list[HistoryEntry]) -> TableUpdate:
    first = pending[0]
    update = first.update
    for e in pending[1:]:
        update = compose(update, e.update, first.prev)
    return update


def _batches(table: pa.Table, rows: int) -> list[pa.RecordBatch]:
    """``table`` as batches of at most ``rows`` rows, as few as that allows (a delta's
    table, one chunk per column, is sliced without combining its chunks first)."""
    n = table.num_rows
    if n == 0:
        return []
    batches = table.to_batches(max_chunksize=rows)
    if len(batches) > -(-n // rows):  # chunks that do not line up: combined first
        batches = table.combine_chunks().to_batches(max_chunksize=rows)
    return batches


def _with_time_diff(rows: pa.Table, step: int, diffs: np.ndarray) -> pa.Table:
    n = rows.num_rows
    return (rows.append_column(pa.field(TIME, pa.int64(), nullable=False),
                               pa.array(np.full(n, step, np.int64)))
            .append_column(pa.field(DIFF, pa.int64(), nullable=False), pa.array(diffs)))


def _consolidate_triples(t: pa.Table) -> pa.Table:
    """Sum weights of equal (row, time) and drop zeros (the translator's consolidation)."""
    from engine.differential.zset import ZSet

    names = [n for n in t.column_names if n != DIFF]
    z = ZSet.from_arrow(t).consolidate()
    out = z.to_arrow()
    return out.select([*names, DIFF]).cast(t.schema)

