"""One stream of several tables, consistent per step (docs/protocol.md §7.11; issue #38).

A :class:`GroupSubscription` serves a ``GroupSubscriptionRequest``: one ``DoExchange``
stream carrying several tables (a source and the tables derived from it, say), so that a
client sees every table at the same graph step, never table A at step ``s`` and table B at
``s - 1``. Each table is a :class:`GroupMember`: a sink of its table's publisher that
queues updates in its own :class:`~flight.streams.pending.PendingUpdates` (as a
:class:`~flight.streams.subscription.Subscription` does) and a
:class:`~flight.streams.codec.DeltaCodec` whose messages are tagged with the member's index
(``UpdateMetadata.group_table``) and framed in the group's stream schema (a dense union of
the tables' schemas, :func:`~flight.streams.codec.group_schema`).

Consistency. The sender builds every member's message under *one* hold of the graph's
shared lock. No cycle runs meanwhile, so each member's pending updates are every update of
its table up to the graph's current step ``s``, and the values read are those at ``s``:
the messages of all tables cover the same range of steps, from the previous group's step to
``s``, whether they hold one cycle's update or several composed (a slow client: each
member's pending updates are composed, exactly, over that same range). An end-of-step
marker carrying ``s`` follows the group's messages. Members whose table did not change send
nothing; a group in which no table changed is not sent. The first group holds one message
per table (snapshot, or a resume's answer), all taken under one hold of the lock.

Resume is per table, as for one table (each member answers its own request's epoch and
sequence); since all answers are taken under one hold of the lock, the stream is again
consistent from its first group.

Not here: viewports and the ``TRIPLES`` format (refused), subscription changes (a change
ends the stream with ``INVALID_ARGUMENT``), and the fan-out (each group stream builds its
own messages: a fan-out shares one table's messages between streams, and members of
different groups would need the same union slot).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from engine.errors import Overloaded, ProtocolError
from flight.errors import again
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import frame, schema_frame
from flight.streams.codec import (
    MAX_GROUP_TABLES,
    DeltaCodec,
    Encoded,
    UnionSlot,
    end_of_stream,
    group_schema,
)
from flight.streams.pending import PendingUpdates
from flight.streams.registry import HistoryEntry, Publisher, TableEntry
from flight.streams.subscription import (
    CallState,
    StreamWriter,
    SubscriptionOptions,
    check_columns,
    opening,
)

__all__ = ["GroupMember", "GroupSubscription", "check_group_request", "end_of_step"]

log = logging.getLogger(__name__)


def check_group_request(request: pb.GroupSubscriptionRequest) -> None:
    """Refuse a group request that cannot be served, naming the table and the field.

    Raises
    ------
    ProtocolError
        No table or more than :data:`~flight.streams.codec.MAX_GROUP_TABLES`; a request
        without a table name, with a viewport or the ``TRIPLES`` format.
    """
    n = len(request.tables)
    if not 1 <= n <= MAX_GROUP_TABLES:
        raise ProtocolError(f"GroupSubscriptionRequest.tables holds {n} tables; a group holds "
                            f"1 to {MAX_GROUP_TABLES}")
    for i, req in enumerate(request.tables):
        if not req.table:
            raise ProtocolError(f"GroupSubscriptionRequest.tables[{i}].table is empty; name "
                                f"each table")
        if req.has_viewport:
            raise ProtocolError(f"GroupSubscriptionRequest.tables[{i}] ({req.table!r}) has a "
                                f"viewport; a multi-table subscription holds every row "
                                f"(subscribe to the table alone for a viewport)")
        if req.format != pb.DELTA_FORMAT_UPDATES:
            raise ProtocolError(f"GroupSubscriptionRequest.tables[{i}] ({req.table!r}) asks "
                                f"for format {req.format}; a multi-table subscription sends "
                                f"DELTA_FORMAT_UPDATES only")


def end_of_step(step: int) -> bytes:
    """The end-of-step marker: every table's messages bringing it to ``step`` were sent."""
    return frame(app_metadata=pb.UpdateMetadata(end_of_step=True, step=step).SerializeToString())


class GroupMember:
    """One table of a group: its publisher's sink and its codec (see the module docstring).

    Counted by the server as one subscription of its table (stats, metrics).
    """

    def __init__(self, group: GroupSubscription, entry: TableEntry,
                 request: pb.SubscriptionRequest, slot: UnionSlot,
                 options: SubscriptionOptions) -> None:
        assert entry.publisher is not None  # every registered table has one
        self.group = group
        self.entry = entry
        self.table = entry.table
        self.publisher: Publisher = entry.publisher
        self.request = request
        batch_rows = max(1, min(request.max_batch_rows or options.max_batch_rows,
                                options.max_batch_rows))
        self.codec = DeltaCodec(self.table, epoch=self.publisher.epoch,
                                format=pb.DELTA_FORMAT_UPDATES,
                                columns=check_columns(entry, list(request.columns)),
                                viewport=None, batch_rows=batch_rows, status=entry.status,
                                slot=slot)
        self.pending = PendingUpdates(options.max_pending)
        self.sequence = 0  # of the last message sent
        self.step = 0  # of the last group sent (the table is at it)
        self.coalesced = 0  # table updates composed into others (a slow client)

    # the cycle's side (an UpdateSink)
    def on_table_update(self, entry: HistoryEntry) -> None:
        self.pending.append(entry)  # composed past max_pending
        self.group.wake()

    def on_table_failure(self, exc: BaseException) -> None:
        self.group.fail(exc)

    def change(self, change: pb.SubscriptionChange) -> None:
        """Only ever empty: a mirror's link status changed (flight/links). Not sent alone on
        a group stream; the status rides in the table's next message."""

    def close(self) -> None:
        self.group.close()

    # the sender's side, under the shared lock
    def first(self, step: int) -> Encoded:
        return opening(self.codec, self.publisher, self.request, step=step, viewport=False)

    def next(self, step: int) -> Encoded | None:
        """The message bringing the client to ``step`` (``None``: the table did not change)."""
        run = self.pending.take()  # every update so far: no cycle runs under the shared lock
        if run is None:
            return None
        self.coalesced += run.count - 1
        return self.codec.delta(run.entry.update, held=None, sequence=run.entry.sequence,
                                step=step, count=run.count)


class GroupSubscription:
    """The server side of one multi-table stream (see the module docstring).

    Parameters
    ----------
    entries
        The subscribed tables, in the request's order (a table may appear twice, e.g. with
        two filters).
    request
        The client's first message (checked by :func:`check_group_request`).
    options
        Server limits.

    Raises
    ------
    SchemaError
        If a request names a column its table does not have.
    """

    def __init__(self, entries: Sequence[TableEntry], request: pb.GroupSubscriptionRequest,
                 options: SubscriptionOptions) -> None:
        self.graph = entries[0].table.graph
        self.options = options
        self.schema = group_schema([e.table.schema for e in entries])
        self.members = [GroupMember(self, e, r, UnionSlot(self.schema, i), options)
                        for i, (e, r) in enumerate(zip(entries, request.tables, strict=True))]
        self.min_interval = max(r.min_update_interval_ms for r in request.tables) / 1000.0
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        self._closed = False
        self.step = 0  # of the last group sent

    @property
    def names(self) -> list[str]:
        return [m.entry.name for m in self.members]

    # ---------------------------------------------------------------- events
    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def fail(self, exc: BaseException) -> None:
        """A table failed or was dropped (or the client sent a bad message): end the stream."""
        with self._cond:
            if self._failure is None:
                self._failure = exc
            self._cond.notify()

    def change(self, change: pb.SubscriptionChange) -> None:
        """A multi-table stream takes no changes.

        Raises
        ------
        ProtocolError
            Always (the stream then ends with INVALID_ARGUMENT).
        """
        raise ProtocolError("a multi-table subscription takes no SubscriptionChange; "
                            "subscribe again with other columns")

    def on_table_failure(self, exc: BaseException) -> None:
        """The client's side broke the protocol (:meth:`change`, bad metadata)."""
        self.fail(exc)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    # ---------------------------------------------------------------- the sender
    def run(self, writer: StreamWriter, context: CallState,
            resume: Callable[[], None] | None = None) -> bool:
        """Send the first group (every table), then one group per step with changes.

        Returns False once the stream is over: a group never parks (no fan-out writes it;
        ``resume`` is never called, see :meth:`Subscription.run
        <flight.streams.subscription.Subscription.run>`)."""
        writer.write_frames((schema_frame(self.schema),))
        with self.graph.shared_lock():
            for m in self.members:
                m.table.check_alive()  # TableFailed: FAILED_PRECONDITION, as for one table
            step = self.graph.step
            first = [(m, m.first(step)) for m in self.members]
            for m in self.members:
                m.publisher.subscribe(m)
        try:
            self._send(writer, first, step)
            del first  # every table's snapshot: held here it would stay for the stream's life
            last_sent = time.monotonic()
            while True:
                with self._cond:
                    while not (self._failure is not None or self._closed
                               or any(m.pending for m in self.members)):
                        self._cond.wait(self.options.poll_seconds)
                        if context.is_cancelled():
                            return False
                    if self._failure is not None:
                        raise again(self._failure)  # a copy: see Subscription.run
                    if self._closed:
                        raise Overloaded("the server is shutting down; reconnect to another "
                                         "or later")
                wait = last_sent + self.min_interval - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with self.graph.shared_lock():  # one step for every table
                    step = self.graph.step
                    messages = [(m, msg) for m in self.members if (msg := m.next(step)) is not None]
                if messages:
                    self._send(writer, messages, step)
                    last_sent = time.monotonic()
        finally:
            for m in self.members:
                m.publisher.unsubscribe(m)

    def _send(self, writer: StreamWriter, messages: list[tuple[GroupMember, Encoded]],
              step: int) -> None:
        """One group: the messages, then the marker, in one write."""
        writer.write_frames(tuple(f for _, msg in messages for f in msg.frames)
                            + (end_of_step(step),))
        for m, msg in messages:
            m.sequence = msg.sequence
        for m in self.members:  # every table is at ``step`` now, changed or not
            m.step = step
        self.step = step

    def send_end(self, writer: StreamWriter, error: str) -> None:
        """Tell the client no more messages follow (it should then finish writing)."""
        writer.write_frames(end_of_stream(error, sequence=0, step=self.step,
                                          format=pb.DELTA_FORMAT_UPDATES))
