"""The web process's view of the server: the table list and the followed tables' changes,
over the link (:mod:`flight.web.link`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from engine.errors import LinkLost, TableFailed, TableNotFound, TicktableError
from flight.web.feed import Change
from flight.web.link import read_change

__all__ = ["RemoteFeed", "RemoteTables"]

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT = 30.0


class RemoteFeed:
    """One followed table's changes, delivered in order on a thread of its own."""

    def __init__(self, tables: RemoteTables, fid: int, name: str,
                 deliver: Callable[[Change], None],
                 on_failure: Callable[[BaseException], None] | None) -> None:
        self.tables, self.fid, self.name = tables, fid, name
        self._deliver = deliver
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._queue: list[Change | BaseException] = []
        self._closed = False
        self.answer: Future[None] = Future()  # followed, or refused
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ticktable-web-feed:{name[:40]}")

    def start(self) -> RemoteFeed:
        self._thread.start()
        return self

    def put(self, item: Change | BaseException) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop following the table (a ``deliver`` in progress finishes first)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self.tables.unfollow(self)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._queue or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                item = self._queue.pop(0)
            if isinstance(item, BaseException):
                if self._on_failure is not None:
                    self._on_failure(item)
                return
            try:
                self._deliver(item)
            except Exception as exc:  # a broken consumer: stop following
                log.warning("web: delivering a change of table %r failed: %s", self.name, exc)
                if self._on_failure is not None:
                    self._on_failure(exc)
                return
            self.tables.send(("ack", self.fid))


class RemoteTables:
    """The server's tables, over the link (``conn``)."""

    def __init__(self, conn: Connection, on_lost: Callable[[], None]) -> None:
        self._conn = conn
        self._on_lost = on_lost
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._feeds: dict[int, RemoteFeed] = {}
        self._requests: dict[int, Future[tuple[int, list[dict[str, Any]]]]] = {}
        self._lost = False
        self._reader = threading.Thread(target=self._read, name="ticktable-web-link",
                                        daemon=True)

    def start(self) -> RemoteTables:
        self._reader.start()
        return self

    def send(self, msg: tuple[Any, ...]) -> bool:
        """Send ``msg`` to the server; False once the link is gone."""
        with self._send_lock:
            try:
                self._conn.send(msg)
                return True
            except OSError:
                return False  # the reader sees the end too

    def tables(self) -> tuple[int, list[dict[str, Any]]]:
        """The server's step and its tables (name, kind, keys, parents, schema as
        ``[[column, type], ...]``, rows, last step, subscribers over Flight, state, error; a
        mirror's link status, and whether it is pending: its origin has not answered, so it
        is no table yet).

        Raises
        ------
        LinkLost
            If the server is gone.
        """
        rid = next(self._ids)
        fut: Future[tuple[int, list[dict[str, Any]]]] = Future()
        with self._lock:
            if self._lost:
                raise LinkLost("the server is gone")
            self._requests[rid] = fut
        self.send(("tables", rid))
        return fut.result(_REQUEST_TIMEOUT)

    def follow(self, name: str, deliver: Callable[[Change], None], *,
               on_failure: Callable[[BaseException], None] | None = None) -> RemoteFeed:
        """Follow table ``name``: ``deliver`` gets its snapshot, then each change, on the
        feed's thread; ``on_failure`` once if the table fails or is dropped.

        Raises
        ------
        TableNotFound
            If there is no such table; :class:`TableFailed` if it failed.
        """
        fid = next(self._ids)
        feed = RemoteFeed(self, fid, name, deliver, on_failure)
        with self._lock:
            if self._lost:
                raise LinkLost("the server is gone")
            self._feeds[fid] = feed
        feed.start()
        self.send(("follow", fid, name))
        try:
            feed.answer.result(_REQUEST_TIMEOUT)
        except BaseException:
            with self._lock:
                self._feeds.pop(fid, None)
            feed.close()
            raise
        return feed

    def unfollow(self, feed: RemoteFeed) -> None:
        with self._lock:
            known = self._feeds.pop(feed.fid, None) is not None
        if known:
            self.send(("unfollow", feed.fid))

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                kind = msg[0]
                if kind == "change":
                    fid, change = read_change(msg, self._conn)
                    feed = self._feeds.get(fid)
                    if feed is not None:
                        feed.put(change)
                elif kind == "tables":
                    with self._lock:
                        fut = self._requests.pop(msg[1], None)
                    if fut is not None:
                        fut.set_result((msg[2], msg[3]))
                elif kind in ("followed", "refused", "failed"):
                    feed = self._feeds.get(msg[1])
                    if feed is None:
                        continue
                    if kind == "followed":
                        feed.answer.set_result(None)
                        continue
                    exc: TicktableError = (TableNotFound(msg[3]) if msg[2] in ("notfound", "dropped")
                                           else TableFailed(msg[3]))
                    if kind == "refused":
                        feed.answer.set_exception(exc)
                    else:
                        feed.put(exc)
                elif kind == "stop":
                    break
        except (EOFError, OSError):
            pass
        with self._lock:
            self._lost = True
            requests, self._requests = list(self._requests.values()), {}
            feeds = list(self._feeds.values())
        for fut in requests:
            fut.set_exception(LinkLost("the server is gone"))
        for feed in feeds:
            if not feed.answer.done():
                feed.answer.set_exception(LinkLost("the server is gone"))
        self._on_lost()
