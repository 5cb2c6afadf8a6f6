"""Feed ``perspective``: Perspective's Python server holds the opened tables.

One :class:`PerspectiveHub` owns a ``perspective.Server``. Opening a table in the page
*acquires* it here: the first viewer creates a Perspective table of the same name, indexed
by row key and filled from a feed of the server's changes
(:meth:`~flight.web.remote.RemoteTables.follow`: the snapshot, then one ``update``/``remove``
per change); later viewers share it. The browser's viewer opens it
by name over Perspective's websocket protocol (:class:`PerspectiveSocket`), so only the
rows it shows cross the wire. When its last viewer leaves, the table is *released*: the
feed stops and the Perspective table is deleted, before a new viewer's copy of the table
can take its name.

Every call into Perspective (building tables, applying changes, the sessions' requests)
runs on one thread, the hub's :class:`EngineThread`: the engine sees one caller at a time,
and the HTTP server's event loop never waits on it. Viewers' requests go before queued
changes (a viewer waits for at most the call in progress, e.g. one part of a large
snapshot). A feed waits for its change to be applied, so while Perspective is busy the
feed composes the updates that arrive meanwhile.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import perspective

from flight.web.feed import Change, split_snapshot, to_ipc
from flight.wire import ROW_KEY

if TYPE_CHECKING:
    from flight.web.remote import RemoteFeed, RemoteTables

__all__ = ["EngineThread", "HostedTable", "PerspectiveHub"]

log = logging.getLogger(__name__)

# rows in the first Perspective call of a snapshot (then SNAPSHOT_CHUNK_ROWS per call). The
# whole snapshot is in before a viewer opens the table: with a view open, each update costs
# Perspective time that grows with the table (measured: 500k-row updates into a table
# growing to 4M rows took 0.7 s each without a view, 1.3 s rising to 3.5 s with one), so a
# 10M-row table loading under its viewer showed its first rows after 60 s
_FIRST_PART_ROWS = 100_000


class EngineClosed(RuntimeError):
    """A call submitted after :meth:`EngineThread.shutdown` (the web server is stopping)."""


class EngineThread(Executor):
    """One thread running calls in priority order: :meth:`submit` (viewers' requests) before
    :meth:`submit_change` (applying a table's change), each kind first in, first out."""

    def __init__(self, name: str) -> None:
        self._queue: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._put(0, fn, args)

    def submit_change(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` behind every viewer's request."""
        return self._put(1, fn, args)

    def _put(self, priority: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise EngineClosed("Perspective's thread is shut down")
            heapq.heappush(self._queue, (priority, next(self._order), fut, fn, args))
            self._cond.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                _, _, fut, fn, args = heapq.heappop(self._queue)
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                for item in self._queue:
                    item[2].cancel()
                self._queue.clear()
            self._cond.notify_all()
        if wait:
            self._thread.join()


@dataclass(slots=True)
class HostedTable:
    """A server table held in Perspective for the viewers that opened it."""

    name: str
    viewers: int = 0
    feed: RemoteFeed | None = None
    table: Any = None  # perspective.Table, once the snapshot is loaded
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # why the feed stopped (failed or dropped table)
    released: bool = False  # its last viewer left: changes still coming are not applied


class PerspectiveHub:
    """Perspective tables for the opened server tables, refcounted by viewer.

    Parameters
    ----------
    tables
        The server's tables, over the link.
    """

    def __init__(self, tables: RemoteTables) -> None:
        self.tables = tables
        self.server = perspective.Server()
        self.client = self.server.new_local_client()
        #: the one thread calling into Perspective
        self.executor = EngineThread("ticktable-web-psp")
        self._hosted: dict[str, HostedTable] = {}
        self._lock = threading.Lock()

    def hosted(self) -> dict[str, HostedTable]:
        """The tables held now, by name."""
        with self._lock:
            return dict(self._hosted)

    def acquire(self, name: str, timeout: float = 600.0) -> HostedTable:
        """Hold ``name`` for one more viewer; blocks until its snapshot is in Perspective.

        Raises
        ------
        TableNotFound
            If the server has no such table.
        TableFailed
            If the table failed (or failed before its snapshot was read).
        """
        with self._lock:
            hosted = self._hosted.get(name)
            if hosted is None or hosted.error is not None and hosted.viewers == 0:
                hosted = self._hosted[name] = HostedTable(name)
                try:
                    hosted.feed = self.tables.follow(
                        name, functools.partial(self._apply, hosted),
                        on_failure=functools.partial(self._failed, hosted))
                except BaseException:
                    del self._hosted[name]
                    raise
            hosted.viewers += 1
        if not hosted.ready.wait(timeout) or hosted.table is None:
            self.release(hosted)
            raise hosted.error or TimeoutError(f"table {name!r} did not load in {timeout:g} s")
        return hosted

    def release(self, hosted: HostedTable) -> None:
        """One viewer of ``hosted`` left; the last one stops the feed and frees the table."""
        with self._lock:
            hosted.viewers -= 1
            if hosted.viewers > 0:
                return
            if self._hosted.get(hosted.name) is hosted:
                del self._hosted[hosted.name]
            hosted.released = True
            # queued under the lock: a new viewer's copy of the table is made from the
            # snapshot of a feed started after this, so it is queued behind the delete (one
            # thread, first in, first out) and finds the name free. Queued after closing
            # the feed, the delete could come second: 'Table "t" already exists'
            try:
                self.executor.submit_change(self._drop, hosted)
            except EngineClosed:  # the hub is closing: Perspective's server goes with it
                pass
        if hosted.feed is not None:
            hosted.feed.close()

    def close(self) -> None:
        """Stop every feed and Perspective's thread."""
        with self._lock:
            hosted, self._hosted = list(self._hosted.values()), {}
        for h in hosted:
            if h.feed is not None:
                h.feed.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ feed callbacks
    def _apply(self, hosted: HostedTable, change: Change) -> None:
        """On the feed's thread: apply ``change`` on Perspective's thread and wait (a large
        snapshot in parts, so other tables' viewers are served while it loads; its own
        viewers open it once all of it is in)."""
        for part in split_snapshot(change, first_rows=_FIRST_PART_ROWS):
            self.executor.submit_change(self._apply_now, hosted, part).result()
        if change.snapshot:
            hosted.ready.set()

    def _apply_now(self, hosted: HostedTable, change: Change) -> None:
        if hosted.released:  # dropped already, or about to be: nobody views it
            return
        if change.snapshot:
            hosted.table = self.client.table(to_ipc(change.upserts), index=ROW_KEY,
                                             name=hosted.name)
        else:
            if change.removes.size:
                hosted.table.remove(change.removes.tolist())
            if change.upserts.num_rows:
                hosted.table.update(to_ipc(change.upserts))

    def _failed(self, hosted: HostedTable, exc: BaseException) -> None:
        hosted.error = exc
        hosted.ready.set()  # an acquire waiting for the snapshot gives up
        log.info("web: table %r stopped updating in Perspective: %s", hosted.name, exc)

    @staticmethod
    def _drop(hosted: HostedTable) -> None:
        """On Perspective's thread: delete a released table's Perspective copy, if made."""
        table, hosted.table = hosted.table, None
        if table is None:
            return
        try:
            table.delete()
        except perspective.PerspectiveError as exc:  # a view some session still holds
            log.warning("web: could not free Perspective table %r: %s", table.get_name(), exc)
