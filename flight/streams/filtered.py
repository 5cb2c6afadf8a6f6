"""Filtered subscriptions: one shared, live ``where`` per table and filter (docs/protocol.md §7.2).

A subscription whose request carries a filter (``SubscriptionRequest.filter``: one boolean
Substrait expression, as a snapshot's) streams ``table.where(filter)``, the engine's
incremental ``where`` (:mod:`engine.ops.filter`): its row keys are a subset of the table's,
never renumbered, and its parent's shifts pass through, so what a subscriber (a mirror)
holds is under the table's own row keys and order. Per cycle it costs what the table's
update costs, not the table's size.

**Shared.** Subscriptions of one table with the same filter bytes share one filtered table,
with one :class:`~flight.streams.registry.Publisher`: one epoch, one sequence and one history
of updates. A subscriber that resumes (a mirror's link that was cut) is answered from that
history with the updates it missed, as on any table.

**Lingering.** A filtered table whose last subscriber left is kept ``linger`` seconds
(``ServerConfig.filter_linger``), so that a subscriber coming back within that time resumes
with deltas; then it is closed. A later subscriber gets a new one: a new epoch, so a resume
is answered with a snapshot (which a mirror applies as its difference).

**Hidden.** A filtered table is not in the registry: it has no name of its own and is not
listed (``ListFlights``, ``stats``, Flight SQL, the web page, ``--mirror-of``'s listing),
neither journaled nor checkpointed (a subscriber of a restarted server gets a new epoch, as
for any table), and it is no derived table of its parent: dropping the parent drops its
filtered tables with it, lingering or watched, and their subscribers are ended as the
parent's own are (``NOT_FOUND`` "table 't' was dropped"). Its subscriptions name the parent
(stats count them as the parent's subscribers). With ``max_tables`` the registry's tables
and the filtered tables together stay within the limit: lingering filtered tables make room
first, oldest first; past it a new filter is refused ``RESOURCE_EXHAUSTED``.

Locks: the registry's, then this module's, then the graph's (a drop calls :meth:`_dropped`
under the registry's lock; :meth:`FilteredTables.acquire` builds under this module's).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from engine.errors import LimitExceeded, Overloaded, TableNotFound
from flight.limits import limit_text, quoted
from flight.streams.registry import Publisher, TableEntry, TableRegistry
from flight.wire import TableKind

__all__ = ["FilteredTables"]

log = logging.getLogger(__name__)

FilterKey = tuple[str, bytes]


@dataclass(slots=True, eq=False)
class _Filtered:
    """One filtered table: the entry subscriptions stream, its parent's, who watches it."""

    key: FilterKey
    base: TableEntry
    entry: TableEntry
    watchers: int = 0
    idle_since: float | None = None  # monotonic; set while no one watches
    served: bool = False  # a subscription streamed it (else a refused one closes it at once)


class FilteredTables:
    """The server's filtered tables, by table name and filter bytes (see the module docstring).

    Parameters
    ----------
    registry
        The server's tables: each filtered table filters one of them and is dropped with it.
    linger
        Seconds a filtered table is kept after its last subscriber left (0: closed at once).
    """

    def __init__(self, registry: TableRegistry, *, linger: float = 60.0) -> None:
        self.registry = registry
        self.linger = linger
        self._tables: dict[FilterKey, _Filtered] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._janitor: threading.Thread | None = None
        registry.on_drop.append(self._dropped)

    def __len__(self) -> int:
        with self._cond:
            return len(self._tables)

    def acquire(self, base: TableEntry, predicate: bytes) -> TableEntry:
        """The filtered table of ``base`` for ``predicate``, made if there is none; it counts
        as watched until :meth:`release`.

        Parameters
        ----------
        base
            The registry's entry of the subscribed table.
        predicate
            ``SubscriptionRequest.filter``: one boolean Substrait ExtendedExpression.

        Returns
        -------
        TableEntry
            The entry to stream: named as ``base``, its ``filter_of`` is ``base``.

        Raises
        ------
        ExpressionError
            If ``predicate`` is malformed, names a column ``base`` does not have (or has with
            another type) or is not boolean.
        TableFailed
            If ``base`` has failed (a new filtered table cannot be made from it).
        TableNotFound
            If ``base`` was dropped meanwhile.
        LimitExceeded
            If a new filtered table would pass ``max_tables`` (with the registry's tables).
        """
        key = (base.name, bytes(predicate))
        gone: list[tuple[_Filtered, BaseException | None]] = []
        try:
            with self._cond:
                if self._closed:
                    raise Overloaded("the server is shutting down; reconnect to another or later")
                f = self._tables.get(key)
                if f is not None and f.base is not base:  # the name holds another table now
                    del self._tables[key]
                    gone.append((f, TableNotFound(f"table {base.name!r} was dropped")))
                    f = None
                if f is None:
                    f = _Filtered(key, base, self._build(base, key[1]))  # a bad filter: nothing made
                    try:
                        self._make_room(base.name, gone)
                    except LimitExceeded:
                        gone.append((f, None))
                        raise
                    self._tables[key] = f
                    log.info("filtered table of %r made (%s); %d filtered tables", base.name,
                             f.entry.table.name, len(self._tables))
                f.watchers += 1
                f.idle_since = None
        finally:
            for g, why in gone:
                self._close(g, why)
        if not self.registry.holds(base):  # dropped while it was made
            self.release(f.entry, linger=False)
            raise TableNotFound(f"table {base.name!r} was dropped")
        return f.entry

    def release(self, entry: TableEntry, *, linger: bool = True) -> None:
        """A subscriber of ``entry`` (from :meth:`acquire`) left. The last one leaves the
        table lingering (closed ``linger`` seconds later unless a subscriber comes back).
        ``linger=False``: the subscription was refused before its stream started; a table
        no subscription streamed yet is then closed at once."""
        with self._cond:
            f = next((x for x in self._tables.values() if x.entry is entry), None)
            if f is None:  # dropped with its parent, or closed already
                return
            f.served = f.served or linger
            f.watchers -= 1
            if f.watchers > 0:
                return
            if f.served and self.linger > 0 and not self._closed:
                f.idle_since = time.monotonic()
                if self._janitor is None:
                    self._janitor = threading.Thread(target=self._expire_forever, daemon=True,
                                                     name="ticktable-filters")
                    self._janitor.start()
                self._cond.notify()
                return
            del self._tables[f.key]
        self._close(f, None)

    def entries(self) -> list[TableEntry]:
        """Every filtered table's entry, watched or lingering."""
        with self._cond:
            return [f.entry for f in self._tables.values()]

    def watchers(self, entry: TableEntry) -> int:
        """How many subscriptions hold ``entry`` now (0: lingering, or closed)."""
        with self._cond:
            return next((f.watchers for f in self._tables.values() if f.entry is entry), 0)

    def watched(self, name: str) -> bool:
        """Whether a filtered table of table ``name`` has a subscriber (a temporary view
        watched only through filters stays)."""
        with self._cond:
            return any(f.watchers and f.key[0] == name for f in self._tables.values())

    def close(self) -> None:
        """Close every filtered table (the server shuts down; its subscriptions ended first)."""
        with self._cond:
            self._closed = True
            gone, self._tables = list(self._tables.values()), {}
            self._cond.notify_all()
        for f in gone:
            self._close(f, Overloaded("the server is shutting down; reconnect to another or later"))

    # ------------------------------------------------------------------ internals
    def _build(self, base: TableEntry, predicate: bytes) -> TableEntry:
        """``base.table.where(predicate)`` and its publisher, as an entry named as ``base``."""
        from flight.substrait import bind_filter

        name, table = base.name, base.table
        expr, bound = bind_filter(predicate, table.schema, name)
        child = table.where(expr)  # the parent's row keys (engine.ops.filter)
        child.name = f"{name} where {bound.text}"[:300]  # for logs: it is not registered
        entry = TableEntry(name, child, TableKind.DERIVED, list(base.keys), [name],
                           filter_of=base)
        if base.kind == TableKind.MIRROR:  # its subscribers are told the mirror's link status
            entry.status = lambda: base.status() if base.status is not None else None
        entry.publisher = Publisher(child, history_updates=self.registry.history_updates,
                                    history_rows=self.registry.history_rows)
        return entry

    def _make_room(self, name: str, gone: list[tuple[_Filtered, BaseException | None]]) -> None:
        """Under the lock: lingering tables taken out (oldest first, into ``gone``, for the
        caller to close) until a new one fits within ``max_tables``; LimitExceeded when the
        watched ones fill it."""
        limit = self.registry.max_tables
        if limit is None:
            return
        tables = len(self.registry.names())
        idle = sorted((f for f in self._tables.values() if f.idle_since is not None),
                      key=lambda f: f.idle_since or 0.0)
        while idle and tables + len(self._tables) >= limit:
            f = idle.pop(0)
            del self._tables[f.key]
            gone.append((f, None))
        if tables + len(self._tables) >= limit:
            raise LimitExceeded(
                f"filtered subscription to {quoted(name)} refused: the server holds {tables} "
                f"tables and {len(self._tables)} filtered tables, "
                f"{limit_text('max_tables', limit)}; close subscriptions or drop tables no "
                f"longer needed")

    def _expire_forever(self) -> None:
        """The janitor: closes each filtered table ``linger`` seconds after its last
        subscriber left, unless one came back."""
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                idle = [f for f in self._tables.values() if f.idle_since is not None]
                due = [f for f in idle if now >= (f.idle_since or now) + self.linger]
                for f in due:
                    del self._tables[f.key]
                if not due:
                    wait = min(((f.idle_since or now) + self.linger - now for f in idle),
                               default=None)
                    self._cond.wait(wait)
                    continue
            for f in due:
                log.info("filtered table %s closed: no subscriber for %g s",
                         f.entry.table.name, self.linger)
                self._close(f, None)

    def _dropped(self, name: str) -> None:
        """The registry dropped ``name``: its filtered tables go with it."""
        with self._cond:
            gone = [f for f in self._tables.values()
                    if f.key[0] == name and not self.registry.holds(f.base)]
            for f in gone:
                del self._tables[f.key]
        for f in gone:
            self._close(f, TableNotFound(f"table {name!r} was dropped"))

    @staticmethod
    def _close(f: _Filtered, why: BaseException | None) -> None:
        """End ``f``'s subscribers with ``why`` (if any are left) and close its table."""
        table, publisher = f.entry.table, f.entry.publisher
        with table.graph.exclusive_lock():
            if publisher is not None:
                if why is not None:
                    for sink in publisher.subscribers:
                        sink.on_table_failure(why)
                publisher.close()
            table.close()
