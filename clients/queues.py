"""Bounded queues behind the iterators of live subscriptions (one table, or a group).

Each iterator (``for update in live``, ``async for update in live``) has one
:class:`UpdateQueue`. The subscription's reader thread :meth:`~UpdateQueue.offer` s every
item to every queue, under the subscription's state lock. Past ``maxsize`` queued items a
queue is dropped and stops receiving until it is read again; its next item is then a
*catch-up* the subscription builds (:class:`Hooks.catch_up`: a snapshot of the view, saying
how many items it replaces), so a slow iterator costs memory bounded by ``maxsize``, never by
the stream.

The queue is told what it needs of its subscription as three callables (:class:`Hooks`),
so :class:`~clients.live.LiveTable` (items: :class:`~clients.livestate.Update`) and
:class:`~clients.livegroup.LiveGroup` (items: :class:`~clients.livegroup.GroupUpdate`)
share it.

Lock order: the subscription's state lock, then the queue's condition; a queue never takes
the state lock while it holds its condition (a catch-up resets the queue under the state
lock, through :meth:`UpdateQueue.take_catch_up`).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["AsyncUpdates", "BlockingUpdates", "Finished", "Hooks", "UpdateQueue"]

T = TypeVar("T")


class Finished(Exception):
    """The subscription is closed and every queued item was delivered."""


@dataclass(frozen=True, slots=True)
class Hooks(Generic[T]):
    """What a queue asks of its subscription.

    Attributes
    ----------
    catch_up
        Called with the queue when its next item is a catch-up: takes the state lock, calls
        :meth:`UpdateQueue.take_catch_up` under it and returns the snapshot item (``None``
        before the first snapshot: it will follow).
    raise_if_over
        Raises :class:`Finished`, or the subscription's error, once it stopped.
    over
        Whether the subscription stopped.
    discard
        Called with the queue by its :meth:`~UpdateQueue.close`: takes the state lock,
        forgets the queue (no more offers) and calls the given function under it.
    name
        For messages (the table's name).
    """

    catch_up: Callable[[UpdateQueue[T]], T | None]
    raise_if_over: Callable[[], None]
    over: Callable[[], bool]
    discard: Callable[[UpdateQueue[T], Callable[[], None]], None]
    name: str


class UpdateQueue(Generic[T]):
    """One iterator's bounded queue (see the module docstring).

    Attributes
    ----------
    offered
        How many items the subscription has offered this queue (every applied message, or
        group, since the iterator started).
    delivered
        How many of those the items returned so far stand for: one each, and a catch-up
        every item offered before it. Once what was returned is consumed, the reader is
        current up to ``offered`` as of when ``delivered`` reached it.
    """

    def __init__(self, hooks: Hooks[T], maxsize: int, snapshot: bool) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self._hooks = hooks
        self._maxsize = maxsize
        self._queue: collections.deque[T] = collections.deque()
        self._skipped = 0  # items dropped since the queue overflowed
        self._catch_up = snapshot  # the next item is a catch-up
        self.offered = 0
        self.delivered = 0
        self._cond = threading.Condition()
        self._closed = False  # by close(): the iteration ends
        self._wake: Callable[[], None] | None = None

    def close(self) -> None:
        """Stop this iterator: it ends (a waiting ``next`` too) and receives no more."""
        self._hooks.discard(self, self._mark_closed)
        if self._wake is not None:
            self._wake()

    def _mark_closed(self) -> None:  # under the subscription's state lock
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def offer(self, item: T) -> None:
        """Called by the reader thread, under the subscription's state lock."""
        with self._cond:
            self.offered += 1
            if self._catch_up:
                self._skipped += 1
            elif len(self._queue) >= self._maxsize:
                self._skipped = len(self._queue) + 1
                self._catch_up = True
                self._queue.clear()
            else:
                self._queue.append(item)
            self._cond.notify_all()
        if self._wake is not None:
            self._wake()

    def take_catch_up(self) -> int:
        """Under the subscription's state lock, when building a catch-up: the number of items
        it replaces; the queue receives again from here on."""
        with self._cond:
            skipped, self._skipped, self._catch_up = self._skipped, 0, False
            self.delivered = self.offered  # the catch-up shows the view after all of them
            return skipped

    def wake(self) -> None:
        """Wake a waiting reader (the subscription ended)."""
        with self._cond:
            self._cond.notify_all()
        if self._wake is not None:
            self._wake()

    def _poll(self) -> T | None:
        """The next item, None if there is none yet; raises when the stream is over."""
        with self._cond:
            if self._closed:
                raise Finished
            if self._queue:
                self.delivered += 1
                return self._queue.popleft()
            catch_up = self._catch_up
        if catch_up:
            return self._hooks.catch_up(self)
        self._hooks.raise_if_over()
        return None


class BlockingUpdates(UpdateQueue[T]):
    """A blocking iterator over a queue; ``timeout``: raise ``TimeoutError`` when no item
    arrives within that many seconds."""

    def __init__(self, hooks: Hooks[T], maxsize: int, snapshot: bool,
                 timeout: float | None) -> None:
        super().__init__(hooks, maxsize, snapshot)
        self._timeout = timeout

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            try:
                item = self._poll()
            except Finished:
                raise StopIteration from None
            if item is not None:
                return item
            with self._cond:
                if self._queue or self._catch_up or self._closed or self._hooks.over():
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no update of {self._hooks.name!r} within "
                                       f"{self._timeout} s")
                self._cond.wait(left)


class AsyncUpdates(UpdateQueue[T]):
    """An ``async for`` iterator over a queue, woken from the reader thread (create it on
    the running loop)."""

    def __init__(self, hooks: Hooks[T], maxsize: int, snapshot: bool) -> None:
        super().__init__(hooks, maxsize, snapshot)
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._event = event

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        self._wake = wake

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        while True:
            self._event.clear()
            try:
                item = self._poll()
            except Finished:
                raise StopAsyncIteration from None
            if item is not None:
                return item
            await self._event.wait()
