"""Several live tables on one stream, consistent per server step (issue #38 item 4).

:class:`LiveGroup` subscribes to several tables with one multi-table ``DoExchange``
(docs/protocol.md §7.11): the server sends, per graph step, the messages of every table that
changed, then an end-of-step marker. The group's reader thread keeps each message of a
group until its marker and applies them all together, under the group's lock, to the
tables' :class:`~clients.live.LiveTable` s (never started on their own: the group is their
reader). Callbacks and iterators receive one :class:`GroupUpdate` per group: every table at
the same step, never a mix.

A broken stream is reopened with backoff (the reader thread, reconnecting and the consumers
are :class:`~clients.subscription.Subscription`'s, as a LiveTable's are), each table
resuming from its own epoch and sequence (:meth:`LiveTable.subscription_request
<clients.live.LiveTable.subscription_request>`); messages of a group whose marker never came
are dropped, so the tables stay at the last whole group and the resumed stream brings them
all to one step again.

Threads. The reader applies a group under the group's lock (re-entrant: each table's own
lock is taken inside it, and a table's callbacks run inside it); the group's callbacks run
after it is released. Lock order: the group's lock, a table's lock, an iterator's queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from clients.live import LiveTable
from clients.livestate import Update
from clients.queues import UpdateQueue
from clients.subscription import Connect, Subscription
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import Message, group_schemas, read_group_message

__all__ = ["GroupUpdate", "LiveGroup"]

log = logging.getLogger(__name__)


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


class LiveGroup(Subscription[GroupUpdate]):
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
        super().__init__(connect, "+".join(names), names[0],
                         thread_name=f"ticktable-group-{'+'.join(names)}",
                         lock=threading.RLock(),  # a whole group is applied under it
                         on_update=on_update, reconnect=reconnect,
                         reconnect_delay=reconnect_delay, max_reconnect_delay=max_reconnect_delay)
        self._tables = {n: LiveTable(connect, n, columns=(columns or {}).get(n),
                                     filter=(filters or {}).get(n),
                                     min_update_interval_ms=min_update_interval_ms,
                                     max_batch_rows=max_batch_rows, start=False)
                        for n in names}
        self._step = 0
        self._groups = 0
        self._pending: list[Message] = []  # the open stream's group, until its marker
        if start:
            self.start()

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
        brought current between two groups; waits for the first group as ``df`` does.

        Each is the one frame its table's ``df`` returns, changed in place by later reads
        (``frames()`` again, or ``df``): copy what you keep."""
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

    def __repr__(self) -> str:
        return f"<LiveGroup {self.names} {self._status()} step={self.step} groups={self.groups}>"

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
        return self._wait(lambda: self._groups > 0 and (step is None or self._step >= step),
                          timeout)

    # ------------------------------------------------------------------ groups
    def _catch_up(self, consumer: UpdateQueue[GroupUpdate]) -> GroupUpdate | None:
        with self._lock:
            skipped = consumer.take_catch_up()
            if not self._groups:
                return None  # nothing to show yet: the first group will follow
            return GroupUpdate(self._step, {}, max(1, skipped))

    # ------------------------------------------------------------------ the stream
    def _set_connected(self, connected: bool) -> None:
        super()._set_connected(connected)
        for table in self._tables.values():  # each table's view says what its stream does
            table.set_connected(connected)

    def _finish(self) -> None:
        self._done.set()
        for table in self._tables.values():  # the tables end before the group's waiters wake
            table.end(self._error)
        super()._finish()

    def _subscribe(self, writer: Any, reader: Any) -> Callable[[], Message]:
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
        self._pending = []
        return lambda: read_group_message(reader, schemas)

    def _receive(self, msg: Message) -> None:
        if not msg.meta.end_of_step:
            self._pending.append(msg)
            return
        pending, self._pending = self._pending, []
        self._apply_group(msg.meta.step, pending)
        if not self._connected:
            self._set_connected(True)
            log.info("subscribed to %s", self.names)

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
            self._offer(group)
        self._call_back(group)
