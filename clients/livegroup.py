"""Several live tables on one stream, consistent per server step (issue #38 item 4).

:class:`LiveGroup` subscribes to several tables with one multi-table ``DoExchange``
(docs/protocol.md §7.11): the server sends, per graph step, the messages of every table that
changed, then an end-of-step marker. The group's reader thread keeps each message of a
group until its marker and applies them all together, under the group's lock, to the
tables' :class:`~clients.live.LiveTable` s (never started on their own: the group is their
reader). Callbacks and iterators receive one :class:`GroupUpdate` per group: every table at
the same step, never a mix.

A broken stream is reopened with backoff, each table resuming from its own epoch and
sequence (:meth:`LiveTable.subscription_request <clients.live.LiveTable.subscription_request>`);
messages of a group whose marker never came are dropped, so the tables stay at the last
whole group and the resumed stream brings them all to one step again.

Threads. The reader applies a group under the group's lock (re-entrant: each table's own
lock is taken inside it, and a table's callbacks run inside it); the group's callbacks run
after it is released. Lock order: the group's lock, a table's lock, an iterator's queue.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pandas as pd
import pyarrow as pa
import pyarrow.flight as fl

from clients.failover import Rotation
from clients.live import LiveTable, clean_error, is_permanent
from clients.livestate import Update
from clients.queues import AsyncUpdates, BlockingUpdates, Finished, Hooks, UpdateQueue
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import Message, StreamEnded, group_schemas, read_group_message

__all__ = ["GroupUpdate", "LiveGroup"]

log = logging.getLogger(__name__)

Connect = Callable[[], tuple[fl.FlightClient, fl.FlightCallOptions]]
_Q = TypeVar("_Q", bound="UpdateQueue[GroupUpdate]")


class GroupUpdate(Mapping[str, Update]):
    """One group of a :class:`LiveGroup`: the tables that changed at one server step.

    A mapping from table name to that table's :class:`~clients.live.Update`, holding the
    tables that changed (every table in the first group and after a reconnect); the others
    did not change and are at :attr:`step` too.

    Attributes
    ----------
    step
        The server's graph step every table of the group is at.
    skipped
        For an iterator that fell behind: how many groups this catch-up replaces. A
        catch-up holds no table (read the views, :meth:`LiveGroup.frames`, instead).
    """

    __slots__ = ("_updates", "skipped", "step")

    def __init__(self, step: int, updates: dict[str, Update], skipped: int = 0) -> None:
        self.step = step
        self._updates = updates
        self.skipped = skipped

    def __getitem__(self, name: str) -> Update:
        return self._updates[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._updates)

    def __len__(self) -> int:
        return len(self._updates)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {u!r}" for n, u in self._updates.items())
        catch_up = f" catch-up skipped={self.skipped}" if self.skipped else ""
        return f"<GroupUpdate step={self.step}{catch_up} {{{parts}}}>"


class LiveGroup:
    """Several server tables kept current together: at every server step, all or none.

    Each table is a :class:`~clients.live.LiveTable` (``group["orders"].df``, its own
    iterators and callbacks), fed by the group's one stream: after each group the views of
    all tables are at the same step. The group's callbacks (:meth:`on_update`) and
    iterators (``for g in group``, ``async for g in group``) receive one
    :class:`GroupUpdate` per server step in which a table changed; read inside a callback,
    the views of all tables are at its step. From another thread, :meth:`frames` returns
    every table's DataFrame at one step.

    Every row of each table is held (no viewport). Change columns by subscribing again;
    close the group, not its tables.

    Parameters
    ----------
    connect
        As for :class:`~clients.live.LiveTable` (a :class:`~clients.failover.Rotation`
        fails over to the next server when the stream fails before its first group).
    tables
        The tables' names, each once.
    columns
        Per table, the columns to receive (tables not named: all).
    filters
        Per table, a Substrait filter (as :class:`~clients.live.LiveTable`'s ``filter``).
    on_update
        A callback for every group (see :meth:`on_update`).
    min_update_interval_ms
        The server sends at most one group per interval, composing the steps in between.
    max_batch_rows, reconnect, reconnect_delay, max_reconnect_delay, start
        As for :class:`~clients.live.LiveTable`.

    Raises
    ------
    ValueError
        If ``tables`` is empty or names a table twice, or ``columns``/``filters`` name a
        table not in it.

    Examples
    --------
    >>> group = client.subscribe_many(["orders", "totals"])          # doctest: +SKIP
    >>> @group.on_update
    ... def show(g):                       # orders and totals at the same step g.step
    ...     print(g.step, group["totals"].df)
    """

    QUEUE_SIZE = LiveTable.QUEUE_SIZE

    def __init__(self, connect: Connect, tables: Sequence[str], *,
                 columns: Mapping[str, Sequence[str]] | None = None,
                 filters: Mapping[str, bytes] | None = None,
                 on_update: Callable[[GroupUpdate], None] | None = None,
                 min_update_interval_ms: int = 0, max_batch_rows: int = 0,
                 reconnect: bool = True, reconnect_delay: float = 0.2,
                 max_reconnect_delay: float = 5.0, start: bool = True) -> None:
        names = list(tables)
        if not names:
            raise ValueError("subscribe_many needs at least one table")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"table(s) {twice} named more than once; name each table once")
        for what, given in (("columns", columns), ("filters", filters)):
            stray = sorted(set(given or {}) - set(names))
            if stray:
                raise ValueError(f"{what} names table(s) {stray} not in the group {names}")
        self._connect = connect
        self._rotation = connect if isinstance(connect, Rotation) else None
        self._tables = {n: LiveTable(connect, n, columns=(columns or {}).get(n),
                                     filter=(filters or {}).get(n),
                                     min_update_interval_ms=min_update_interval_ms,
                                     max_batch_rows=max_batch_rows, start=False)
                        for n in names}
        self._reconnect = reconnect
        self._delay = (float(reconnect_delay), float(max_reconnect_delay))
        self._callbacks: list[Callable[[GroupUpdate], None]] = [on_update] if on_update else []
        self._lock = threading.RLock()  # a whole group is applied under it
        self._applied = threading.Condition(self._lock)
        self._consumers: weakref.WeakSet[UpdateQueue[GroupUpdate]] = weakref.WeakSet()
        self._step = 0
        self._groups = 0
        self._stream_lock = threading.Lock()  # the reader to cancel
        self._reader: Any = None
        self._closing = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._connected = False
        self._reconnects = 0
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LiveGroup:
        """Start the reader thread (once)."""
        with self._lock:
            if self._thread is None and not self._closing.is_set():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"ticktable-group-{'+'.join(self._tables)}")
                self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """End the subscription (every table of it) and wait up to ``timeout`` for the
        reader thread."""
        with self._stream_lock:
            self._closing.set()
            if self._reader is not None:
                self._reader.cancel()
        thread = self._thread
        if thread is None:
            self._finish()
        elif thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> LiveGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the views
    def __getitem__(self, name: str) -> LiveTable:
        """The table ``name``'s view (a :class:`~clients.live.LiveTable` fed by the group)."""
        return self._tables[name]

    @property
    def tables(self) -> dict[str, LiveTable]:
        """Every table's view, in the group's order."""
        return dict(self._tables)

    @property
    def names(self) -> list[str]:
        return list(self._tables)

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every table's :attr:`~clients.live.LiveTable.df` at one step (:attr:`step`),
        taken between two groups; waits for the first group as ``df`` does."""
        if not self.wait_for(timeout=LiveTable.FIRST_SNAPSHOT_TIMEOUT) and not self._done.is_set():
            raise TimeoutError(f"no first group of {self.names} within "
                               f"{LiveTable.FIRST_SNAPSHOT_TIMEOUT} s ({self!r})")
        with self._lock:
            return {n: t.df for n, t in self._tables.items()}

    @property
    def step(self) -> int:
        """The server step every table is at, as of the last group (0 before the first)."""
        with self._lock:
            return self._step

    @property
    def groups(self) -> int:
        """Groups applied since the group started."""
        with self._lock:
            return self._groups

    @property
    def connected(self) -> bool:
        """Whether a stream is open and has delivered its first group."""
        return self._connected

    @property
    def uri(self) -> str | None:
        """The server the group is on (see :attr:`LiveTable.uri <clients.live.LiveTable.uri>`)."""
        return self._rotation.uri if self._rotation is not None else None

    @property
    def reconnects(self) -> int:
        """How many times the reader tried to open the stream again after a failure."""
        return self._reconnects

    @property
    def error(self) -> BaseException | None:
        """Why the group stopped for good (as :attr:`LiveTable.error
        <clients.live.LiveTable.error>`; ``None`` while it runs or after close)."""
        return self._error

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def __repr__(self) -> str:
        state = ("failed" if self._error else "closed" if self._done.is_set()
                 else "connected" if self._connected else "connecting")
        return f"<LiveGroup {self.names} {state} step={self.step} groups={self.groups}>"

    def wait_for(self, step: int | None = None, timeout: float | None = 10.0) -> bool:
        """Wait until every table is at ``step`` or later (``None``: the first group).

        Returns
        -------
        bool
            False on timeout or when the group was closed.

        Raises
        ------
        Exception
            :attr:`error`, if the group failed for good.
        """
        if threading.current_thread() is self._thread:  # a callback: it would wait on itself
            timeout = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._applied:
            while True:
                if self._groups and (step is None or self._step >= step):
                    return True
                if self._error is not None:
                    raise self._error
                if self._done.is_set() or self._closing.is_set():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._applied.wait(left)

    # ------------------------------------------------------------------ groups
    def on_update(self, callback: Callable[[GroupUpdate], None]
                  ) -> Callable[[GroupUpdate], None]:
        """Call ``callback(group_update)`` for every group (usable as a decorator).

        It runs on the reader thread once every table of the group is applied, so the
        views (``group[name].df``) read inside it are all at ``group_update.step``; a slow
        callback delays the next group (the server then composes the steps in between).
        An exception is logged and does not end the subscription.
        """
        self._callbacks.append(callback)
        return callback

    def updates(self, timeout: float | None = None, *, maxsize: int = QUEUE_SIZE,
                snapshot: bool = False) -> Iterator[GroupUpdate]:
        """Iterate over every group applied from now on (blocking), as
        :meth:`LiveTable.updates <clients.live.LiveTable.updates>`: past ``maxsize``
        queued groups the next item is a catch-up (``skipped`` > 0, no tables)."""
        return self._register(BlockingUpdates(self._hooks(), maxsize, snapshot, timeout))

    def __iter__(self) -> Iterator[GroupUpdate]:
        return self.updates()

    def __aiter__(self) -> AsyncIterator[GroupUpdate]:
        """``async for g in group``: as :meth:`updates`, woken on the running loop."""
        return self._register(AsyncUpdates(self._hooks(), self.QUEUE_SIZE, False))

    def _register(self, consumer: _Q) -> _Q:
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def _hooks(self) -> Hooks[GroupUpdate]:
        return Hooks(self._catch_up, self._raise_if_over, self._done.is_set, self._discard,
                     "+".join(self._tables))

    def _discard(self, consumer: UpdateQueue[GroupUpdate], then: Callable[[], None]) -> None:
        with self._lock:
            self._consumers.discard(consumer)
            then()

    def _catch_up(self, consumer: UpdateQueue[GroupUpdate]) -> GroupUpdate | None:
        with self._lock:
            skipped = consumer.take_catch_up()
            if not self._groups:
                return None  # nothing to show yet: the first group will follow
            return GroupUpdate(self._step, {}, max(1, skipped))

    def _raise_if_over(self) -> None:
        if self._done.is_set():
            if self._error is not None:
                raise self._error
            raise Finished

    # ------------------------------------------------------------------ the reader thread
    def _run(self) -> None:
        delay = self._delay[0]
        try:
            while not self._closing.is_set():
                try:
                    self._session()
                except Exception as raw:
                    if self._closing.is_set():
                        break
                    exc = clean_error(raw)
                    if is_permanent(exc) or not self._reconnect:
                        log.error("subscription to %s failed: %s", self.names, exc)
                        self._error = exc
                        break
                    if self._connected:  # it worked for a while: start the backoff over
                        delay = self._delay[0]
                    elif self._rotation is not None and len(self._rotation.endpoints) > 1:
                        self._rotation.advance()  # its server did not answer: the next one
                    log.warning("subscription to %s broke (%s: %s); reconnecting in %.1f s",
                                self.names, type(exc).__name__, exc, delay)
                finally:
                    self._set_connected(False)
                if self._closing.wait(delay):
                    break
                delay = min(delay * 2, self._delay[1])
                self._reconnects += 1
        finally:
            self._finish()

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        for table in self._tables.values():  # each table's view says what its stream does
            table.set_connected(connected)

    def _finish(self) -> None:
        self._done.set()
        for table in self._tables.values():
            table.end(self._error)
        with self._lock:
            self._applied.notify_all()
            consumers = list(self._consumers)
        for c in consumers:
            c.wake()

    def _session(self) -> None:
        """One stream, until it breaks (raises) or the group is closed (returns)."""
        client, options = self._connect()
        writer = reader = None
        try:
            first = next(iter(self._tables))
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(first), options)
            with self._stream_lock:
                if self._closing.is_set():
                    return
                self._reader = reader
            with self._lock:  # each table resumes from the last whole group applied
                request = pb.GroupSubscriptionRequest(
                    tables=[t.subscription_request() for t in self._tables.values()])
            writer.begin(pa.schema([]))
            writer.write_metadata(pa.py_buffer(
                pb.ClientMessage(subscribe_group=request).SerializeToString()))
            schemas = group_schemas(reader.schema)
            if len(schemas) != len(self._tables):
                raise ProtocolError(f"protocol: the stream carries {len(schemas)} tables, "
                                    f"{len(self._tables)} were asked for")
            pending: list[Message] = []
            while not self._closing.is_set():
                try:
                    msg = read_group_message(reader, schemas)
                except StreamEnded as end:
                    writer.done_writing()  # the protocol: finish writing, then read the status
                    reader.read_chunk()  # raises the call's error
                    raise ConnectionError(f"the server ended the stream: {end}") from None
                except StopIteration:
                    raise ConnectionError("the stream ended") from None
                if not msg.meta.end_of_step:
                    pending.append(msg)
                    continue
                self._apply_group(msg.meta.step, pending)
                pending = []
                if not self._connected:
                    self._set_connected(True)
                    log.info("subscribed to %s", self.names)
        finally:
            with self._stream_lock:
                self._reader = None
            for fn in (getattr(reader, "cancel", None), getattr(writer, "close", None),
                       client.close):
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        pass

    def _apply_group(self, step: int, messages: list[Message]) -> None:
        """Apply one whole group (its marker came) to the tables, then tell the group's
        iterators and callbacks."""
        tables = list(self._tables.values())
        seen: set[int] = set()
        for m in messages:  # checked before any is applied
            i = m.meta.group_table
            if m.meta.step != step or i in seen:
                raise ProtocolError(f"protocol: a group of step {step} holds a message of "
                                    f"step {m.meta.step} for table {i}, or two for one table")
            seen.add(i)
        with self._lock:
            updates = {tables[m.meta.group_table].table:
                       tables[m.meta.group_table].apply(m.meta, m.added, m.modified)
                       for m in messages}
            group = GroupUpdate(step, updates)
            self._step = step
            self._groups += 1
            self._applied.notify_all()
            for consumer in list(self._consumers):
                consumer.offer(group)
        for callback in list(self._callbacks):
            try:
                callback(group)
            except Exception:
                log.exception("an on_update callback of %s failed", self.names)
