"""One thread writing each update's shared message to many subscribers (issue #5).

Subscribers of a table that hold every row (no viewport) of an ``UPDATES`` stream in the
same columns and batch size are sent the same bytes for every update. Rather than one
sender thread per subscriber, each waking for every update and taking the graph's shared
lock to build its own copy (50 subscribers: 50 readers holding off the next cycle and 50
threads contending for the GIL), such subscribers *join* a :class:`FanOut`: one sink of
the table's publisher and one thread, which per update takes the shared lock once, builds
one message and writes it to every member's stream in turn. The members' own senders
park, on no thread (:meth:`~flight.streams.subscription.Subscription.run`).

Exactness. A message covers the updates ``(start, end]`` (composed, like a slow
subscriber's, when the fan-out fell behind: Barrage's batching) with the values at
``end``, read under the shared lock. It is written to the members whose last sent
sequence is ``start``; every member is at ``start`` or, having just joined, at ``end``.
A subscriber joins only under the shared lock (no cycle running) with nothing pending and
its last message at the publisher's current sequence, and only while the fan-out has
nothing pending either: from then on every update reaches it through the fan-out.

Leaving. A member leaves (client gone, subscription change, shutdown, table failure) or
is *detached* (its write failed, or it stalled). Its sender, taken up again on a thread,
then subscribes to the publisher again and catches up on its own from its last sent
sequence with the publisher's history (:meth:`~flight.streams.registry.Publisher.missed_since`: one composed delta,
or a snapshot when the history no longer reaches back). The fan-out never writes to a
member after it left: :meth:`FanOut.leave` waits for a write in flight to that member.

Slow members. A write blocks while the client's flow-control window is full, and with it
every member after it. The fan-out's watch thread looks at the write in flight every
``stall_seconds``; one blocked for longer *retires* the writing thread: a new thread serves
the other members (starting with the message in flight), the stalled member is told
(:meth:`Member.on_stalled`), and the old thread hands it back to its handler when that
write returns (:meth:`Member.on_detached`). A stalled client thus delays the others once, by at most twice
``stall_seconds``, and then receives coalesced deltas. One watch per fan-out, not one per
member: a thousand members' handlers each waking ten times a second to look cost a
thousand threads' worth of GIL hand-overs, which the cycles paid for (bench_flight's
latency section, 1,000 subscribers).

On the event loop. A fan-out given the server's event loop skips its thread when it can.
The cycle that brings an update, once it has let go of the graph's lock
(:meth:`~engine.graph.UpdateGraph.call_after_cycle`), builds the message itself, its
caches still warm with the update, taking the shared lock only if that needs no wait
(:meth:`~engine.graph.UpdateGraph.shared_lock_if_free`); the event loop then puts it on
every member's stream, each of which must have room for it (:meth:`Member.ready`). When
one of those fails (a reader or cycle in the way, a member's client behind), the thread
builds or writes that message, exactly as above: neither the cycle nor the loop ever
waits. Per delta this spares the thread's wake-up and its hand-over to the loop, and the
build runs where the update's data is (bench_flight's latency section, against the loop
building it: bench/README.md). Only one of the two builds at a time (``_builder``: idle, loop or thread), so
messages stay in order.

Building. The fan-out owns the stream's :class:`~flight.streams.codec.DeltaCodec` (its
members' columns, viewport and batch size) and, for a viewport, the rows its members hold;
its updates wait in a :class:`~flight.streams.pending.PendingUpdates`. One step,
:meth:`FanOut._build_pending`, takes them, builds the message and advances the fan-out's
sequence: the cycle's thread and the fan-out's thread both call it, under the shared lock.

Lock order: a subscription's condition, then a fan-out's, then the publisher's lock (a
:class:`~flight.streams.pending.PendingUpdates`' lock is innermost).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Hashable
from typing import Protocol

from engine.graph import UpdateGraph
from engine.rowset import RowSet
from flight.streams.codec import DeltaCodec, Encoded
from flight.streams.pending import PendingUpdates
from flight.streams.registry import HistoryEntry, Publisher

__all__ = ["FanOut", "Member"]

log = logging.getLogger(__name__)

#: Members written to on the event loop between two chances for a cycle to go first.
LOOP_RUN = 64


class Member(Protocol):
    """What a fan-out writes to: a subscription's stream (see Subscription)."""

    @property
    def sequence(self) -> int:
        """The sequence number of the last message written to the stream."""

    def write_shared(self, msg: Encoded) -> None:
        """Write ``msg`` to the stream (raises if the stream broke)."""

    def on_detached(self, exc: BaseException | None) -> None:
        """The fan-out no longer writes to this member (``exc``: its write failed)."""

    def on_stalled(self) -> None:
        """A write to this member blocked for ``stall_seconds`` and it was detached (its
        ``on_detached`` follows, once that write returns)."""

    def on_table_failure(self, exc: BaseException) -> None:
        """The table failed: no more updates."""

    def ready(self) -> bool:
        """Whether ``write_shared`` now would not block (the event loop writes only then)."""


class FanOut:
    """Writes one message per update (or per run of updates) to every member, in order.

    Parameters
    ----------
    graph
        The table's graph (its shared lock guards each build).
    publisher
        The table's publisher; the fan-out is one of its sinks while it has members.
    key
        This fan-out's key at the publisher (:meth:`Publisher.fanout`).
    codec
        Builds the members' messages (an ``UPDATES`` stream: their columns, viewport and
        batch size).
    held
        With a viewport: the keys whose values the members hold now (the viewport's rows at
        the publisher's current state; create the fan-out under the shared lock). ``None``:
        every row.
    max_pending
        Updates queued before the cycle composes them into one.
    stall_seconds
        How long a write may block before its member is detached (the watch thread
        looks this often).
    loop
        The event loop the members' streams are written on: build on the cycle's thread
        and write on the loop when nothing is in the way (module doc). ``None``: always
        on the fan-out's thread.
    """

    def __init__(self, graph: UpdateGraph, publisher: Publisher, key: Hashable,
                 codec: DeltaCodec, *, held: RowSet | None, max_pending: int,
                 stall_seconds: float, name: str,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.graph = graph
        self.publisher = publisher
        self.key = key
        self.stall_seconds = stall_seconds
        self.name = name
        self._codec = codec
        self._held = held  # the viewport's rows the members hold (None: every row)
        self._cond = threading.Condition()
        self._members: dict[Member, None] = {}  # ordered: written in join order
        self._pending = PendingUpdates(max_pending)
        self._sequence = 0  # the publisher's sequence before the pending updates
        self._current: tuple[int, Encoded] | None = None  # (start, message) being written
        self._writing: dict[Member, float] = {}  # writes in flight: member -> since
        self._stalled: set[Member] = set()  # detached by the watch, not yet told so
        self._failure: BaseException | None = None
        self._generation = 0  # bumped to retire the writing thread
        self._subscribed = False
        self._closed = False
        self._stopped = threading.Event()  # set once closed: the watch thread ends
        self._loop = loop
        # who builds and writes the next message: "loop" (the cycle builds it, the loop
        # writes it), "thread" (from taking the pending updates, or being handed a built
        # message, until it is written to every member), "idle"
        self._builder = "idle"
        self.messages = 0
        self.coalesced = 0
        self.loop_messages = 0  # of messages, those written on the event loop

    # ------------------------------------------------------- the cycle's side (sink)
    def on_table_update(self, entry: HistoryEntry) -> None:
        with self._cond:
            self._pending.append(entry)  # composed past max_pending: the writer is behind
            if self._builder == "idle" and self._loop is not None and self._current is None:
                self._builder = "loop"  # built once the cycle let go of the lock, written on the loop
                self.graph.call_after_cycle(self._after_cycle)
            elif self._builder != "loop":
                self._cond.notify_all()

    def on_table_failure(self, exc: BaseException) -> None:
        with self._cond:
            self._failure = exc
            members = list(self._members)
            self._cond.notify_all()
        for m in members:
            m.on_table_failure(exc)

    # ------------------------------------------------------------------ membership
    def join(self, member: Member) -> bool:
        """Add ``member`` if it is exactly at the publisher's sequence and nothing is pending.

        Call under the graph's shared lock, with ``member`` unsubscribed from the publisher
        only when this returns ``True`` (still under that lock, so no update is lost).
        """
        with self._cond:
            if (self._closed or self._failure is not None or self._pending
                    or member.sequence != self.publisher.sequence):
                return False
            if not self._subscribed:
                self._sequence = self.publisher.subscribe(self)
                self._subscribed = True
                self._start_thread()
                threading.Thread(target=self._watch, daemon=True,
                                 name=f"ticktable-fanout-watch-{self.name}").start()
            self._members[member] = None
            return True

    def leave(self, member: Member) -> None:
        """Stop writing to ``member``; returns once no write to it is in flight."""
        with self._cond:
            self._members.pop(member, None)
            while member in self._writing:
                self._cond.wait()
            if not self._members:
                self._close()

    def _watch(self) -> None:
        """Every ``stall_seconds`` until closed: detach the members a write has blocked on
        for that long (module doc, slow members)."""
        while not self._stopped.wait(self.stall_seconds):  # not _cond: notified per write
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                stalled = [m for m, since in self._writing.items()
                           if m in self._members and now - since >= self.stall_seconds]
                for m in stalled:
                    log.warning("subscriber of %r stalled for %.2f s; detached from its fan-out "
                                "(it catches up with coalesced deltas)", self.name,
                                now - self._writing[m])
                    self._members.pop(m, None)
                    self._stalled.add(m)  # its on_detached waits for its on_stalled
                if stalled:
                    self._generation += 1  # the writing thread is retired
                    if self._members:
                        self._start_thread()
                    else:
                        self._close()
            try:
                for m in stalled:  # outside our lock: a member's lock comes first
                    m.on_stalled()
            finally:  # the retired thread waits for this before it hands them back
                if stalled:
                    with self._cond:
                        self._stalled.difference_update(stalled)
                        self._cond.notify_all()

    def _close(self) -> None:  # under self._cond
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        self._cond.notify_all()
        if self._subscribed:
            self.publisher.unsubscribe(self)
        self.publisher.drop_fanout(self.key, self)

    @property
    def members(self) -> int:
        with self._cond:
            return len(self._members)

    # ------------------------------------------- after the cycle, then on the event loop
    def _after_cycle(self) -> None:  # on the cycle's thread, after the cycle
        built = self._build_now()
        if built is None:
            return
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._write_on_loop, *built)
        except RuntimeError:  # the loop is closed (shutting down): the thread writes it
            self._to_thread(built)

    def _to_thread(self, built: tuple[int, Encoded] | None = None) -> None:
        """Leave the next message to the thread (``built``: this one, to write)."""
        with self._cond:
            if built is None:
                self._builder = "idle"
            else:
                self._current = built
                self._builder = "thread"
            self._cond.notify_all()

    def _build_now(self) -> tuple[int, Encoded] | None:
        """On the cycle's thread, caches still warm with the update: the pending updates'
        message, or ``None`` when the thread is to build it (a reader or cycle in the way)."""
        with self._cond:
            if self._closed or self._failure is not None or not self._pending:
                self._builder = "idle"
                return None
        built: tuple[int, Encoded] | None = None
        failure: BaseException | None = None
        with self.graph.shared_lock_if_free() as free:
            if not free:
                self._to_thread()
                return None
            try:
                built = self._build_pending()
            except Exception as exc:  # every member ends with it (told outside the lock)
                log.error("fan-out of %r failed", self.name, exc_info=True)
                failure = exc
        if built is None:
            self._to_thread()
            if failure is not None:
                self.on_table_failure(failure)
        return built

    def _build_pending(self) -> tuple[int, Encoded] | None:
        """Under the shared lock (no cycle runs): take the pending updates, build their
        message and advance; ``(start, message)``, or ``None`` when nothing was pending."""
        run = self._pending.take()  # every update so far: no cycle runs under the shared lock
        if run is None:
            return None
        with self._cond:
            start = self._sequence
        msg = self._build(run.entry, run.count)
        with self._cond:
            self._sequence = run.entry.sequence
            self.messages += 1
            self.coalesced += run.count - 1
        return start, msg

    def _build(self, entry: HistoryEntry, count: int) -> Encoded:
        """The message bringing a member from before ``entry`` (``count`` table updates
        composed) to the current state; the viewport's rows the members then hold."""
        # not through Publisher.delta (streams catching up share their builds there): with
        # the fan-out's builds shared too, the cycles' p99 with 1,000 subscribers was higher
        # in every A/B pair (bench/README.md, 1,000 subscribers)
        msg = self._codec.delta(entry.update, held=self._held, sequence=entry.sequence,
                                step=self.graph.step, count=count)
        self._held = msg.held
        return msg

    def _write_on_loop(self, start: int, msg: Encoded) -> None:
        """Write a built message to every member, here if each has room, else by the thread.

        In runs of :data:`LOOP_RUN` members, giving way to a cycle between them
        (:meth:`~engine.graph.UpdateGraph.give_way`): a thousand members' writes hold the
        GIL for milliseconds, and a cycle waiting for it would wait that long each time it
        let go of it. ``_builder`` stays "loop" until the last run, so no other message
        starts meanwhile; a member that left (or joined) between runs is skipped."""
        detached: list[tuple[Member, BaseException]] = []
        with self._cond:  # holds off leave(): no write to a member after it left
            if self._closed or self._failure is not None:
                self._builder = "idle"
                return
            if not all(m.ready() for m in self._members):
                self._to_thread((start, msg))  # a member's stream is full: the thread waits
                return
            self.loop_messages += 1
            members = list(self._members)
        try:
            for first in range(0, len(members), LOOP_RUN):
                if first:
                    self.graph.give_way()
                with self._cond:
                    if self._ended():  # closed or failed between two runs
                        break
                    for m in members[first:first + LOOP_RUN]:
                        if m not in self._members or m.sequence != start:
                            continue  # gone, or joined at the end of this message
                        try:
                            m.write_shared(msg)  # ready (only this fan-out writes it): at once
                        except Exception as exc:  # the stream broke: that member ends
                            self._members.pop(m, None)
                            detached.append((m, exc))
        finally:
            with self._cond:
                self._builder = "idle"
                if self._pending:  # a cycle ran meanwhile and asked nobody: the thread
                    self._cond.notify_all()
        for m, error in detached:  # each then leaves (the last one closes the fan-out)
            m.on_detached(error)

    def _ended(self) -> bool:  # under self._cond
        return self._closed or self._failure is not None

    # ------------------------------------------------------------------ the writer
    def _start_thread(self) -> None:  # under self._cond
        t = threading.Thread(target=self._run, args=(self._generation,), daemon=True,
                             name=f"ticktable-fanout-{self.name}")
        t.start()

    def _run(self, generation: int) -> None:
        try:
            while self._next(generation):
                pass
        except Exception as exc:  # a build failed: every member ends with it
            log.error("fan-out of %r failed", self.name, exc_info=True)
            self.on_table_failure(exc)

    def _next(self, generation: int) -> bool:
        """Build (if none is in flight) and write one message; False when retired."""
        with self._cond:
            while (generation == self._generation and not self._closed
                   and self._failure is None
                   and not (self._current or (self._pending and self._builder != "loop"))):
                self._cond.wait()
            if generation != self._generation or self._closed or self._failure is not None:
                return False
            current = self._current
            if current is None:
                self._builder = "thread"  # this message is the thread's, not the cycle's
        if current is None:
            with self.graph.shared_lock():
                built = self._build_pending()
            with self._cond:
                if built is None:  # nothing was pending after all
                    self._builder = "idle"
                    return True
                current = self._current = built
        return self._write(generation, *current)

    def _write(self, generation: int, start: int, msg: Encoded) -> bool:
        """Write ``msg`` to every member at ``start``, giving way to a cycle before each
        (:meth:`~engine.graph.UpdateGraph.give_way`, as the loop does between runs);
        False if retired meanwhile."""
        with self._cond:
            members = list(self._members)
        for m in members:
            self.graph.give_way()
            with self._cond:
                if generation != self._generation:
                    return False
                if m not in self._members or m.sequence != start:
                    continue  # gone, or joined at the end of this message
                self._writing[m] = time.monotonic()
            error: BaseException | None = None
            try:
                m.write_shared(msg)
            except Exception as exc:  # the stream broke: that member ends, the others go on
                error = exc
            with self._cond:
                del self._writing[m]
                retired = generation != self._generation
                if error is not None:
                    self._members.pop(m, None)
                self._cond.notify_all()
                while m in self._stalled:  # the watch tells it first (its back-off)
                    self._cond.wait()
            if error is not None or retired:
                m.on_detached(error)
            if retired:
                return False
        with self._cond:
            if generation == self._generation:
                self._current = None
                self._builder = "idle"
            return generation == self._generation
