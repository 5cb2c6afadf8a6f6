"""One subscriber's stream (``DoExchange``): snapshot, then one message per update.

Threads and locks. The update cycle calls :meth:`Subscription.on_table_update` (through the
table's :class:`~flight.streams.registry.Publisher`), which only queues the update in the
stream's :class:`~flight.streams.pending.PendingUpdates`: the cycle never waits on a client.
The stream's sender thread runs :meth:`Subscription.run`: it waits for pending updates
(or a subscription change), takes the graph's *shared* lock, takes what is pending as one
composed update, has the stream's :class:`~flight.streams.codec.DeltaCodec` read the values
of the rows it must send from the table's current state, releases the lock and writes.
Under the shared lock no cycle runs, so the composed update and the values it reads are one
consistent step.

Fan-out. A stream holding every row (no viewport) of an ``UPDATES`` subscription is, once
caught up, handed to the :class:`~flight.streams.fanout.FanOut` of its columns: one thread that
per update builds one message under the shared lock and writes it to every such stream.
Its sender then *parks*: its thread ends, and none waits for the stream. A new one takes
the stream back (catching up from the publisher's history) when its client changes the
subscription, stalls or leaves, or the table fails (:meth:`Subscription.run`'s
``resume``); a stalled stream joins again once caught up, after a back-off. A thousand
subscribers of one table are thus no thousand threads (each with its conditions and
events: objects the cyclic collector walks, issue #39), only the fan-out's.

Slow consumers. While the sender is blocked writing to a slow client, updates pile up in
the pending queue; past ``max_pending`` they are composed in the cycle (exact
:func:`~engine.update.compose`), so a subscriber costs at most ``max_pending`` updates of
memory (each bounded by the table's size) and still converges: it just receives fewer,
larger messages. Values are never queued; they are read when sent. ``TRIPLES`` streams
queue each update's triples instead, built in the cycle (they hold previous values).
Streams outside a fan-out that catch up from the same state to the same step with equal
codecs (under load, many wake for each cycle) send one message, built by the first of them
(:meth:`~flight.streams.registry.Publisher.delta`): the rows are read once, and the next
cycle waits for one such reader instead of one per stream.

Viewports are Barrage's (:mod:`flight.streams.codec`): the stream remembers which rows'
values its client holds (``held``) and each message says which it holds next.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.errors import Overloaded, ProtocolError, SchemaError, TableFailed, TableNotFound
from engine.rowset import RowSet
from engine.update import TableUpdate
from flight.errors import again
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import schema_frame
from flight.streams.codec import DeltaCodec, Encoded, end_of_stream
from flight.streams.fanout import FanOut
from flight.streams.pending import PendingUpdates, compose_run
from flight.streams.registry import HistoryEntry, Publisher, TableEntry

__all__ = ["CallState", "StreamWriter", "Subscriber", "Subscription", "SubscriptionOptions",
           "check_columns", "opening", "snapshot"]

log = logging.getLogger(__name__)

#: A fan-out's key at its publisher: the columns, batch rows and viewport its members share.
FanOutKey = tuple[tuple[str, ...], int, tuple[tuple[int, int], ...] | None]


@dataclass(slots=True)
class SubscriptionOptions:
    """Server-wide limits for subscriptions."""

    max_batch_rows: int = 65_536
    max_pending: int = 32
    poll_seconds: float = 0.25
    stall_seconds: float = 0.1  # a fan-out write blocked this long detaches its subscriber


class StreamWriter(Protocol):
    """Where a stream's frames go (:class:`~flight.rpc.flight_service.FrameQueue`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that writes the frames to the call."""

    def write_frames(self, frames: tuple[bytes, ...]) -> None:
        """Queue one message's frames; blocks while the queue is full, raises once the call
        is over."""

    def has_room(self) -> bool:
        """Whether :meth:`write_frames` now would return at once."""


class Subscriber(Protocol):
    """What the server counts as one open subscription of a table (stats, metrics, shutdown):
    a :class:`Subscription`, or one table of a multi-table one (:mod:`flight.streams.group`)."""

    @property
    def entry(self) -> TableEntry:
        """The subscribed table."""

    @property
    def step(self) -> int:
        """The graph step of the last message sent (its lag is measured from it)."""

    def change(self, change: pb.SubscriptionChange) -> None:
        """A change of the subscription (an empty one: a mirror's link status changed,
        flight/links)."""

    def close(self) -> None:
        """End the stream (the server is shutting down)."""


class CallState(Protocol):
    """What a stream asks of its call."""

    def is_cancelled(self) -> bool:
        """Whether the client cancelled or went away."""

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends (``False``, and it never runs, if it has)."""


def check_columns(entry: TableEntry, columns: list[str]) -> list[str]:
    """The subscribed columns in table order (every column for ``[]``).

    Raises
    ------
    SchemaError
        If a column is not the table's, naming the table and its columns.
    """
    names = entry.table.schema.names
    if not columns:
        return list(names)
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise SchemaError(f"table {entry.name!r} has no column(s) {unknown} "
                          f"(columns: {', '.join(names)})")
    return [c for c in names if c in set(columns)]


def opening(codec: DeltaCodec, publisher: Publisher, request: pb.SubscriptionRequest, *,
            step: int, viewport: bool) -> Encoded:
    """Under the shared lock: a stream's first message, the snapshot or a resume's answer.

    A resume (``request.resume``) of an ``UPDATES`` stream whose missed updates the
    publisher still holds gets them composed into one delta (``RESUME_DELTAS``); any
    other resume a snapshot (``RESUME_SNAPSHOT``); a first subscribe a snapshot.
    ``viewport``: the stream has one (its every row is then sent again).
    """
    if request.resume:
        missed = (publisher.missed_since(int(request.resume_sequence))
                  if request.resume_epoch == publisher.epoch else None)
        if missed is not None and codec.format == pb.DELTA_FORMAT_UPDATES:
            update = compose_run(missed).update if missed else TableUpdate()
            # the client held the viewport's rows (or all); it resends no key list, so
            # for a viewport every row in it is sent again
            return codec.delta(update, held=RowSet() if viewport else None,
                               sequence=int(request.resume_sequence) + len(missed), step=step,
                               count=len(missed), resume=pb.RESUME_DELTAS)
        return snapshot(codec, publisher, step=step, resume=pb.RESUME_SNAPSHOT)
    return snapshot(codec, publisher, step=step, resume=pb.RESUME_NONE)


def snapshot(codec: DeltaCodec, publisher: Publisher, *, step: int,
             resume: pb.ResumeResult.ValueType) -> Encoded:
    """Under the shared lock: the snapshot of the current state, shared with every stream
    that opens at this step with an equal codec (:meth:`Publisher.snapshot`)."""
    def build() -> Encoded:
        return codec.snapshot(sequence=publisher.sequence, step=step, resume=resume)

    key = codec.snapshot_key()
    return build() if key is None else publisher.snapshot((key, step, resume), build)


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
        assert entry.publisher is not None  # every registered table has one
        self.publisher: Publisher = entry.publisher
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
        self._codec = self._new_codec()
        self.schema = self._codec.schema
        self._cond = threading.Condition()
        self._pending = PendingUpdates(options.max_pending)
        self._change: pb.SubscriptionChange | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._held: RowSet | None = None  # keys whose values the client holds; None: all
        self._resnapshot = False  # send a snapshot next (the catch-up history is gone)
        self._writer: StreamWriter | None = None
        self._fanout: FanOut | None = None  # writing this stream when set
        self._detached = False
        self._detach_error: BaseException | None = None
        self._fanout_stalls = 0
        self._rejoin_after = 0.0  # (monotonic) no joining a fan-out before this
        self._resume: Callable[[], None] | None = None  # set while parked (run)
        self._last_sent = 0.0
        self.sequence = 0
        self.step = 0
        self.messages = 0
        self.coalesced = 0

    # ------------------------------------------------------------------ validation
    def _check_columns(self, columns: list[str]) -> list[str]:
        return check_columns(self.entry, columns)

    def _new_codec(self) -> DeltaCodec:
        """The codec of this stream's current columns and viewport."""
        return DeltaCodec(self.table, epoch=self.publisher.epoch, format=self.format,
                          columns=self.columns, viewport=self.viewport,
                          batch_rows=self.batch_rows, status=self.entry.status)

    # ------------------------------------------------------- the cycle's side (sink)
    def on_table_update(self, entry: HistoryEntry) -> None:
        triples = None
        if self.format == pb.DELTA_FORMAT_TRIPLES:  # previous values exist only now
            triples = self._codec.update_triples(entry.update, entry.step)
        with self._cond:
            self._pending.append(entry, triples)  # composed past max_pending
            self._cond.notify()

    def on_table_failure(self, exc: BaseException) -> None:
        with self._cond:
            self._failure = exc
            self._cond.notify()
            resume = self._unpark()
        if resume is not None:
            resume()

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
            resume = self._unpark()
        if resume is not None:
            resume()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            resume = self._unpark()
        if resume is not None:
            resume()

    def _unpark(self) -> Callable[[], None] | None:
        """Under ``_cond``, once the stream has work of its own: the parked stream's
        ``resume``, to call once the lock is let go (None: not parked)."""
        resume, self._resume = self._resume, None
        return resume

    # ------------------------------------------------------------------- the sender
    def run(self, writer: StreamWriter, context: CallState,
            resume: Callable[[], None] | None = None) -> bool:
        """Send the first message (snapshot or resume), then every update until closed.

        With ``resume``, a stream that a fan-out writes *parks*: ``run`` returns True and
        no thread waits for it. ``resume`` is called (once, on whichever thread notices:
        the client's change, the call's end, the fan-out letting go, a failure, a close;
        never under a lock of this stream) when the stream has work of its own again, and
        must then call ``run`` again on a thread, with the same arguments: it goes on
        where it parked. Without ``resume`` the thread waits in the fan-out. Returns False
        once the stream is over (raises what ended it).
        """
        if self._writer is None:  # the first call: the schema and the first message
            self._start(writer, context)
        parked = False
        try:
            parked = self._serve(writer, context, resume)
            return parked
        finally:
            if not parked:
                if self._fanout is not None:
                    self._fanout.leave(self)
                self.publisher.unsubscribe(self)

    def _start(self, writer: StreamWriter, context: CallState) -> None:
        publisher = self.publisher
        context.add_callback(self._wake)  # a stream in a fan-out waits for it, not a timer
        writer.write_frames((schema_frame(self.schema),))
        with self.graph.shared_lock():
            self.table.check_alive()  # TableFailed: FAILED_PRECONDITION, as DoGet answers
            first = self._first_message()
            publisher.subscribe(self)
        self._writer = writer
        try:
            self._send(writer, first)
        except BaseException:
            publisher.unsubscribe(self)
            raise
        # the snapshot is not kept: held it would stay for the stream's whole life
        self._last_sent = time.monotonic()

    def _serve(self, writer: StreamWriter, context: CallState,
               resume: Callable[[], None] | None) -> bool:
        """The loop of :meth:`run` after the first message; True: parked in a fan-out."""
        while True:
            if self._fanout is None and self._may_share():
                self._join_fanout()
            if self._fanout is not None:
                if resume is not None and self._park(context, resume):
                    return True
                if not self._wait_in_fanout(context):
                    return False
                continue
            with self._cond:
                while not (self._pending or self._change or self._failure or self._closed
                           or self._resnapshot):
                    self._cond.wait(self.options.poll_seconds)
                    if context.is_cancelled():
                        return False
                if self._failure is not None:
                    # a copy: the raised one's traceback holds this frame, which holds
                    # self, which holds _failure (a cycle only the cyclic collector frees,
                    # and with it the table a drop released)
                    raise again(self._failure)
                if self._closed:
                    raise Overloaded("the server is shutting down; reconnect to another or later")
            wait = self._last_sent + self.min_interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self.graph.shared_lock():
                with self._cond:
                    change, self._change = self._change, None
                out = self._next_message(change)
            if out is not None:
                self._send(writer, out)
                self._last_sent = time.monotonic()

    # -------------------------------------------------------------- the fan-out
    def _may_share(self) -> bool:
        """Whether this stream is one a fan-out may write (``UPDATES``, no wait; every row,
        or a viewport whose rows the client holds)."""
        return (self.format == pb.DELTA_FORMAT_UPDATES and self.min_interval == 0
                and (self.viewport is None) == (self._held is None)
                and time.monotonic() >= self._rejoin_after)

    def _join_fanout(self) -> None:
        """Hand this stream to the fan-out of its columns and viewport, if it is caught up.

        Subscribers of the same columns and the same viewport (many people watching the top
        of one table) share one fan-out: each update's viewport delta is built once."""
        publisher = self.publisher
        viewport = None if self.viewport is None else tuple(self.viewport)
        key: FanOutKey = (tuple(self.columns), self.batch_rows, viewport)
        with self.graph.shared_lock():  # no cycle: the publisher's sequence stands still
            with self._cond:
                if (self._pending or self._change or self._failure or self._closed
                        or self._resnapshot or self.sequence != publisher.sequence):
                    return
                if self._held is not None and self._held != self._codec.viewport_keys(
                        self.table.rowset):
                    return  # not holding the viewport's current rows (cannot happen caught up)
                fan = publisher.fanout(key, lambda: self._new_fanout(key))
                if fan.join(self):
                    publisher.unsubscribe(self)  # every later update comes through the fan-out
                    self._fanout = fan
                    self._detached, self._detach_error = False, None

    def _new_fanout(self, key: FanOutKey) -> FanOut:
        # called under the shared lock, caught up: the rows this stream holds are the ones
        # every member holds (a viewport's rows at the publisher's state; None: every row)
        return FanOut(self.graph, self.publisher, key, self._codec, held=self._held,
                      max_pending=self.options.max_pending,
                      stall_seconds=self.options.stall_seconds, name=self.entry.name,
                      loop=None if self._writer is None else self._writer.loop)

    def _park(self, context: CallState, resume: Callable[[], None]) -> bool:
        """Leave the stream to its fan-out with no thread waiting (True), unless it has
        work of its own already; the events :meth:`_wait_in_fanout` waits for call
        ``resume`` instead (:meth:`_unpark`)."""
        with self._cond:
            if (self._detached or self._change or self._failure or self._closed
                    or context.is_cancelled()):
                return False
            self._resume = resume
            return True

    def _wait_in_fanout(self, context: CallState) -> bool:
        """While the fan-out writes this stream: wait until it must be on its own again,
        then catch up from the last message the fan-out wrote. False: the client left."""
        fan = self._fanout
        assert fan is not None
        cancelled = False
        # no timeout: the fan-out (detached, stalled), the client (a change, its call's end:
        # _wake) and the server (failure, close) each notify. A thousand members waking ten
        # times a second to look cost the cycles dearly (flight/streams/fanout.py)
        with self._cond:
            while not (self._detached or self._change or self._failure or self._closed):
                if context.is_cancelled():
                    cancelled = True
                    break
                self._cond.wait()
            error, self._detach_error = self._detach_error, None
        fan.leave(self)  # no write to this stream is in flight after this
        self._fanout = None
        if error is not None:
            raise error
        if cancelled:
            return False
        if self._failure is not None or self._closed:
            return True  # the loop ends the stream
        publisher = self.publisher
        with self.graph.shared_lock():
            missed = publisher.missed_since(self.sequence)
            publisher.subscribe(self)
            ended = self._ended_meanwhile()
            with self._cond:  # nothing pending: the fan-out had every update since joining
                if ended is not None and self._failure is None:
                    self._failure = ended
                if missed is None:  # the history no longer reaches back: start over
                    self._resnapshot = True
                for e in missed or ():
                    self._pending.append(e)
        return True

    def _ended_meanwhile(self) -> BaseException | None:
        """Under the shared lock, just subscribed again: the failure or drop of the table
        since this stream left its fan-out. Out of the fan-out and not yet back with the
        publisher, it was a sink of neither when a cycle told theirs; it would otherwise
        join a new fan-out and wait for updates a failed table never sends."""
        if self._closed:  # the server is shutting down: that is what the stream ends with
            return None
        if self.table.closed:
            return TableNotFound(f"table {self.entry.name!r} was dropped")
        try:
            self.table.check_alive()
        except TableFailed as exc:
            return exc
        return None

    def write_shared(self, msg: Encoded) -> None:
        """The fan-out's thread writes ``msg`` to this stream (see flight/streams/fanout.py)."""
        assert self._writer is not None  # a stream joins its fan-out once it is written
        self._send(self._writer, msg)

    def ready(self) -> bool:
        """Whether a write now would not block (see flight/streams/fanout.py)."""
        return self._writer is not None and self._writer.has_room()

    def _wake(self) -> None:
        """The call ended (on the event loop): a waiting handler looks again."""
        with self._cond:
            self._cond.notify_all()
            resume = self._unpark()
        if resume is not None:
            resume()

    def on_stalled(self) -> None:
        with self._cond:
            # back in once caught up, after a wait doubling with each stall (2 s .. 1 min):
            # a client that keeps stalling holds the others up rarely
            self._fanout_stalls += 1
            self._rejoin_after = time.monotonic() + min(60.0, 2.0 ** self._fanout_stalls)

    def on_detached(self, exc: BaseException | None) -> None:
        with self._cond:
            self._detached = True
            self._detach_error = exc
            self._cond.notify()
            resume = self._unpark()
        if resume is not None:
            resume()

    # ------------------------------------------------------- building messages
    def _first_message(self) -> Encoded:
        """Under the shared lock: the snapshot, or the missed deltas of a resume."""
        return opening(self._codec, self.publisher, self.request, step=self.graph.step,
                       viewport=self.viewport is not None)

    def _snapshot(self, resume: pb.ResumeResult.ValueType) -> Encoded:
        return snapshot(self._codec, self.publisher, step=self.graph.step, resume=resume)

    def _next_message(self, change: pb.SubscriptionChange | None) -> Encoded | None:
        """Under the shared lock: the message bringing the client to the current state."""
        run = self._pending.take()  # every update so far: no cycle runs under the shared lock
        if change is not None and change.set_columns:
            self.columns = self._check_columns(list(change.columns))
            if change.set_viewport:
                self._set_viewport(change)
            self._codec = self._new_codec()
            return self._snapshot(pb.RESUME_NONE)
        if change is not None and change.set_viewport:
            self._set_viewport(change)
            self._codec = self._new_codec()
        if self._resnapshot:
            self._resnapshot = False
            return self._snapshot(pb.RESUME_NONE)
        step = self.graph.step
        if run is None:  # a change of viewport only (TRIPLES have none)
            if self.format == pb.DELTA_FORMAT_TRIPLES:
                return None
            return self._codec.delta(TableUpdate(), held=self._held, sequence=self.sequence,
                                     step=step, count=0)
        self.coalesced += run.count - 1
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            return self._codec.triples(run.triples, sequence=run.entry.sequence, step=step,
                                       count=run.count)
        entry, count, codec = run.entry, run.count, self._codec

        def build() -> Encoded:
            return codec.delta(entry.update, held=self._held, sequence=entry.sequence,
                               step=step, count=count)

        key = codec.snapshot_key()
        if key is None or self._held is not None or self.viewport is not None:
            return build()
        # a client holding every row: the same message as every stream at this start's
        return self.publisher.delta((key, step), entry.sequence - count, build,
                                        Encoded.nbytes)

    def _set_viewport(self, change: pb.SubscriptionChange) -> None:
        if change.has_viewport and self.format == pb.DELTA_FORMAT_TRIPLES:
            raise ProtocolError("a viewport needs the UPDATES format")
        self.viewport = _ranges(change.viewport) if change.has_viewport else None

    # ------------------------------------------------------------------- writing
    def send_end(self, writer: StreamWriter, error: str) -> None:
        """Tell the client no more messages follow (it should then finish writing)."""
        writer.write_frames(end_of_stream(error, sequence=self.sequence, step=self.step,
                                          format=self.format))

    def _send(self, writer: StreamWriter, msg: Encoded) -> None:
        writer.write_frames(msg.frames)
        self.sequence = msg.sequence
        self.step = msg.step
        self._held = msg.held  # the rows whose values the client holds after it
        self.messages += 1
