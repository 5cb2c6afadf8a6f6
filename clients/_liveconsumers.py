"""What a live subscription hands its users: iterators of updates, the view, and its end.

:class:`clients.live.LiveTable` owns the stream and the state; this module holds what
reaches the user from it:

* :class:`_Consumer` (``for update in live``, :class:`_Updates`; ``async for``,
  :class:`_AsyncUpdates`): one bounded queue of :class:`~clients._livestate.Update` per
  iterator. Past ``maxsize`` queued updates the queue is dropped and the next item is a
  catch-up snapshot, so a slow iterator costs memory bounded by ``maxsize``, never by the
  stream;
* :class:`_View`: the materialized view of one applied message (``df``, ``to_arrow``);
* the end: :class:`_Finished` once the subscription is closed and drained, and which
  failures are final (:func:`_is_permanent`), reported with the server's message only
  (:func:`_clean`).

Relies on the live table's locking: :meth:`_Consumer.offer` is called by the reader thread
under the state lock, and the table's ``_catch_up`` resets a consumer's catch-up under the
state lock, then the consumer's condition; a consumer never takes the state lock while it
holds its condition, so the order is always state lock, then consumer. A consumer reaches
its table only through :class:`_Live`, so this module does not import :mod:`clients.live`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.flight as fl

from clients._livestate import Update

I64 = npt.NDArray[np.int64]

_PERMANENT = (KeyError, pa.ArrowInvalid, fl.FlightUnauthenticatedError,
              fl.FlightUnauthorizedError, fl.FlightServerError)


def _clean(exc: BaseException) -> BaseException:
    """``exc`` with the server's message only (pyarrow appends the server's traceback after
    ``". Detail:"``), as the same type, chained to the original."""
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    short = text.split(". Detail:")[0].split(". gRPC client debug context:")[0].strip('"')
    if short == text:
        return exc
    try:
        out = type(exc)(short)
    except Exception:
        return exc
    out.__cause__ = exc
    return out


def _is_permanent(exc: BaseException) -> bool:
    """A failure that reconnecting cannot fix: the table is gone (``KeyError``), the request
    was refused (``ArrowInvalid``), access was denied, or the table failed on the server.
    Anything else (unavailable, cancelled, a broken stream) is worth another try."""
    return isinstance(exc, _PERMANENT)


class _Finished(Exception):
    """The subscription is closed and every queued update was delivered."""


# ------------------------------------------------------------------ iterators
class _Live(Protocol):
    """What a consumer uses of its :class:`~clients.live.LiveTable`."""

    table: str

    def _catch_up(self, consumer: _Consumer) -> Update | None: ...

    def _over(self) -> bool: ...

    def _raise_if_over(self) -> None: ...


class _Consumer:
    """One iterator's bounded queue of updates.

    Past ``maxsize`` queued updates the queue is dropped and the consumer stops receiving
    until it reads again; its next item is then a catch-up snapshot of the view (an
    :class:`Update` with ``is_snapshot`` and ``skipped`` = the number of updates dropped).
    """

    def __init__(self, live: _Live, maxsize: int, snapshot: bool) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self._live = live
        self._maxsize = maxsize
        self._queue: collections.deque[Update] = collections.deque()
        self._skipped = 0  # updates dropped since the queue overflowed
        self._catch_up = snapshot  # the next item is a snapshot of the view
        self._cond = threading.Condition()
        self._wake: Callable[[], None] | None = None

    def offer(self, update: Update) -> None:
        """Called by the reader thread, under the live table's state lock."""
        with self._cond:
            if self._catch_up:
                self._skipped += 1
            elif len(self._queue) >= self._maxsize:
                self._skipped = len(self._queue) + 1
                self._catch_up = True
                self._queue.clear()
            else:
                self._queue.append(update)
            self._cond.notify_all()
        if self._wake is not None:
            self._wake()

    def wake(self) -> None:
        """Wake a waiting reader (the subscription ended)."""
        with self._cond:
            self._cond.notify_all()
        if self._wake is not None:
            self._wake()

    def _poll(self) -> Update | None:
        """The next update, None if there is none yet; raises when the stream is over."""
        with self._cond:
            if self._queue:
                return self._queue.popleft()
            catch_up = self._catch_up
        if catch_up:
            return self._live._catch_up(self)
        self._live._raise_if_over()
        return None


class _Updates(_Consumer):
    """A blocking iterator of updates (see :meth:`~clients.live.LiveTable.updates`)."""

    def __init__(self, live: _Live, maxsize: int, snapshot: bool,
                 timeout: float | None) -> None:
        super().__init__(live, maxsize, snapshot)
        self._timeout = timeout

    def __iter__(self) -> Iterator[Update]:
        return self

    def __next__(self) -> Update:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            try:
                update = self._poll()
            except _Finished:
                raise StopIteration from None
            if update is not None:
                return update
            with self._cond:
                if self._queue or self._catch_up or self._live._over():
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no update of {self._live.table!r} within "
                                       f"{self._timeout} s")
                self._cond.wait(left)


class _AsyncUpdates(_Consumer):
    """An ``async for`` iterator of updates, woken from the reader thread."""

    def __init__(self, live: _Live, maxsize: int, snapshot: bool) -> None:
        super().__init__(live, maxsize, snapshot)
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._event = event

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        self._wake = wake

    def __aiter__(self) -> AsyncIterator[Update]:
        return self

    async def __anext__(self) -> Update:
        while True:
            self._event.clear()
            try:
                update = self._poll()
            except _Finished:
                raise StopAsyncIteration from None
            if update is not None:
                return update
            await self._event.wait()


# ------------------------------------------------------------------ the view
class _View:
    """The materialized view of one applied message (the DataFrame is built on demand)."""

    __slots__ = ("version", "table", "positions", "frame")

    def __init__(self, version: int, table: pa.Table, positions: I64 | None) -> None:
        self.version, self.table, self.positions = version, table, positions
        self.frame: pd.DataFrame | None = None

