"""What every live subscription does, whatever it holds: one stream read on a thread of its
own, and what it applies handed to callbacks, iterators and waiters (DESIGN.md §5-6).

:class:`Subscription` is the base of :class:`~clients.live.LiveTable` (one table; each
applied message an :class:`~clients.livestate.Update`) and of
:class:`~clients.livegroup.LiveGroup` (several tables on one stream; each applied group a
:class:`~clients.livegroup.GroupUpdate`). It owns:

- the reader thread: it opens a ``DoExchange`` stream and reads it until it breaks, then
  reconnects with backoff; a failure that reconnecting cannot fix ends the subscription
  (:func:`is_permanent`), reported with the server's message only (:func:`clean_error`).
  Given a :class:`~clients.failover.Rotation` of several servers' endpoints, it reconnects
  to the next one in turn when its own does not answer;
- the consumers: ``on_update`` callbacks, and iterators with one bounded queue each
  (:mod:`clients.queues`);
- waiting until the applied state is far enough along.

A subclass says what to subscribe to on a new stream (:meth:`Subscription._subscribe`), how
to apply what the stream brings (:meth:`Subscription._receive`, which offers each applied
item through :meth:`Subscription._offer` and :meth:`Subscription._call_back`) and what an
iterator that fell behind gets instead (:meth:`Subscription._catch_up`).

Threads. The subclass applies an item under the state lock (``_lock``) and offers it to the
consumers under that lock (:meth:`UpdateQueue.offer <clients.queues.UpdateQueue.offer>`
takes the consumer's condition); callbacks run on the reader thread after it is released.
A consumer never takes the state lock while it holds its condition, so the order is always
state lock, then consumer.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, Self, TypeVar

import pyarrow as pa
import pyarrow.flight as fl

from clients.failover import Rotation
from clients.queues import AsyncUpdates, BlockingUpdates, Finished, Hooks, UpdateQueue
from flight.streams.decoder import Message, StreamEnded

__all__ = ["Connect", "Subscription", "clean_error", "is_permanent"]

log = logging.getLogger(__name__)

T = TypeVar("T")  # what one applied message (or group) is: an Update, a GroupUpdate
_Q = TypeVar("_Q", bound="UpdateQueue[Any]")
Connect = Callable[[], tuple[fl.FlightClient, fl.FlightCallOptions]]

_PERMANENT = (KeyError, pa.ArrowInvalid, fl.FlightUnauthenticatedError,
              fl.FlightUnauthorizedError, fl.FlightServerError)


def clean_error(exc: BaseException) -> BaseException:
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


def is_permanent(exc: BaseException) -> bool:
    """A failure that reconnecting cannot fix: the table is gone (``KeyError``), the request
    was refused (``ArrowInvalid``), access was denied, or the table failed on the server.
    Anything else (unavailable, cancelled, a broken stream) is worth another try."""
    return isinstance(exc, _PERMANENT)


class Subscription(ABC, Generic[T]):
    """One ``DoExchange`` subscription kept open by a reader thread, and the consumers of
    what it applies (items of type ``T``); see the module docstring.

    Parameters
    ----------
    connect
        Returns a new ``FlightClient`` and the call options for one stream; called again on
        every reconnect (a :class:`~clients.failover.Rotation` is advanced when a stream
        fails before its first message).
    name
        What messages and the iterators' errors call it (a table's name).
    path
        The path of the stream's ``FlightDescriptor``.
    thread_name
        The reader thread's name.
    lock
        The state lock: what the subclass applies, and the consumers, are under it.
    on_update, reconnect, reconnect_delay, max_reconnect_delay
        As for :class:`~clients.live.LiveTable`.
    """

    QUEUE_SIZE = 1024
    """Default bound of an iterator's queue (see :meth:`updates`)."""

    def __init__(self, connect: Connect, name: str, path: str, *, thread_name: str,
                 lock: threading.Lock | threading.RLock,
                 on_update: Callable[[T], None] | None, reconnect: bool,
                 reconnect_delay: float, max_reconnect_delay: float) -> None:
        self._connect = connect
        self._rotation = connect if isinstance(connect, Rotation) else None
        self._name, self._path, self._thread_name = name, path, thread_name
        self._reconnect = reconnect
        self._delay = (float(reconnect_delay), float(max_reconnect_delay))
        self._callbacks: list[Callable[[T], None]] = [on_update] if on_update else []
        self._lock = lock
        self._applied = threading.Condition(self._lock)
        self._consumers: weakref.WeakSet[UpdateQueue[T]] = weakref.WeakSet()
        self._stream_lock = threading.Lock()  # the reader to cancel
        self._reader: Any = None
        self._closing = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._connected = False
        self._reconnects = 0

    # ------------------------------------------------------------------ what a subclass adds
    @abstractmethod
    def _subscribe(self, writer: Any, reader: Any) -> Callable[[], Message]:
        """Send the subscribe message on a new stream; return what reads its next message."""

    @abstractmethod
    def _receive(self, msg: Message) -> None:
        """Apply one message of the stream (raises if it does not fit: the stream restarts)."""

    @abstractmethod
    def _catch_up(self, consumer: UpdateQueue[T]) -> T | None:
        """The item replacing what ``consumer`` missed (see :class:`~clients.queues.Hooks`)."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Start the reader thread (once)."""
        with self._lock:
            if self._thread is None and not self._closing.is_set():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=self._thread_name)
                self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """End the subscription and wait (up to ``timeout``) for the reader thread."""
        with self._stream_lock:
            self._closing.set()
            if self._reader is not None:
                self._reader.cancel()
        thread = self._thread
        if thread is None:
            self._finish()
        elif thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop_connection(self) -> None:
        """Break the current stream as a network failure would (tests: forces a resume)."""
        with self._stream_lock:
            if self._reader is not None:
                self._reader.cancel()

    # ------------------------------------------------------------------ state
    @property
    def connected(self) -> bool:
        """Whether a stream is open and has delivered its first message (a group's: its
        first group)."""
        return self._connected

    @property
    def uri(self) -> str | None:
        """The server this subscription is on, or connects to next (``grpc://host:port``).

        ``None`` when built with a plain ``connect`` function rather than a
        :class:`~clients.failover.Rotation` (which :meth:`~clients.client.Client.subscribe`
        passes).
        """
        return self._rotation.uri if self._rotation is not None else None

    @property
    def reconnects(self) -> int:
        """How many times the reader tried to open the stream again after a failure."""
        return self._reconnects

    @property
    def error(self) -> BaseException | None:
        """Why the subscription stopped for good (``None`` while it runs or after close).

        The exception as pyarrow raised it: ``KeyError`` (``pyarrow.ArrowKeyError``) when
        the table is gone, ``pyarrow.ArrowInvalid`` for a refused request, a
        ``pyarrow.flight.FlightError`` for access or a failed table; with
        ``reconnect=False``, whatever broke the stream.
        """
        return self._error

    @property
    def closed(self) -> bool:
        """Whether the reader thread has stopped (closed, or failed: see :attr:`error`)."""
        return self._done.is_set()

    def _status(self) -> str:
        """One word for a ``repr``: failed, closed, connected or connecting."""
        return ("failed" if self._error else "closed" if self._done.is_set()
                else "connected" if self._connected else "connecting")

    def _wait(self, ready: Callable[[], bool], timeout: float | None, *,
              raise_error: bool = True) -> bool:
        """Wait until ``ready()`` (called under the state lock, again after each applied
        item); False on timeout or once the subscription stopped. With ``raise_error``,
        raise :attr:`error` if it failed, and give up as soon as :meth:`close` is called."""
        if threading.current_thread() is self._thread:  # a callback: it would wait on itself
            timeout = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._applied:
            while True:
                if ready():
                    return True
                if raise_error and self._error is not None:
                    raise self._error
                if self._done.is_set() or (raise_error and self._closing.is_set()):
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._applied.wait(left)

    # ------------------------------------------------------------------ consumers
    def on_update(self, callback: Callable[[T], None]) -> Callable[[T], None]:
        """Call ``callback(update)`` for every applied message (a group's: every group;
        usable as a decorator).

        Callbacks run on the reader thread once it is applied (so the views read inside
        show it); a slow callback delays the next message. An exception is logged and does
        not end the subscription.
        """
        self._callbacks.append(callback)
        return callback

    def updates(self, timeout: float | None = None, *, maxsize: int = QUEUE_SIZE,
                snapshot: bool = False) -> BlockingUpdates[T]:
        """Iterate over every update applied from now on (blocking).

        Parameters
        ----------
        timeout
            Raise ``TimeoutError`` when no update arrives within this many seconds.
        maxsize
            Updates queued for this iterator at most. When it falls further behind, the
            queue is dropped and the next item is a catch-up: a snapshot of the view
            (``is_snapshot``, ``skipped`` = updates dropped), for a group one that holds no
            table (``skipped`` > 0); then updates continue.
        snapshot
            Start with a snapshot of the current view, atomically with subscribing.

        Raises
        ------
        Exception
            :attr:`error` once the queued updates are consumed, if the subscription failed.
            The iteration ends after :meth:`close`, or the iterator's own ``close()``
            (which ends a ``next`` waiting on another thread).
        """
        return self._register(BlockingUpdates(self._hooks(), maxsize, snapshot, timeout))

    def __iter__(self) -> Iterator[T]:
        return self.updates()

    def __aiter__(self) -> AsyncIterator[T]:
        """``async for update in live``: as :meth:`updates`, woken on the running loop."""
        return self._register(AsyncUpdates(self._hooks(), self.QUEUE_SIZE, False))

    def _register(self, consumer: _Q) -> _Q:
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def _hooks(self) -> Hooks[T]:
        return Hooks(self._catch_up, self._raise_if_over, self._done.is_set, self._discard,
                     self._name)

    def _discard(self, consumer: UpdateQueue[T], then: Callable[[], None]) -> None:
        with self._lock:
            self._consumers.discard(consumer)
            then()

    def _raise_if_over(self) -> None:
        if self._done.is_set():
            if self._error is not None:
                raise self._error
            raise Finished

    def _offer(self, item: T) -> None:
        """Under the state lock, once ``item`` is applied: wake the waiters, and queue it
        for every iterator."""
        self._applied.notify_all()
        for consumer in list(self._consumers):
            consumer.offer(item)

    def _call_back(self, item: T) -> None:
        """After the state lock is released: call every callback with ``item``."""
        for callback in list(self._callbacks):
            try:
                callback(item)
            except Exception:
                log.exception("an on_update callback of %r failed", self._name)

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
                        log.error("subscription to %r failed: %s", self._name, exc)
                        self._error = exc
                        break
                    where = ""
                    if self._connected:  # it worked for a while: start the backoff over
                        delay = self._delay[0]
                    if self._rotation is not None and len(self._rotation.endpoints) > 1:
                        if not self._connected:  # its server did not answer: the next one
                            self._rotation.advance()
                        where = f" to {self._rotation.uri}"
                    log.warning("subscription to %r broke (%s: %s); reconnecting%s in %.1f s",
                                self._name, type(exc).__name__, exc, where, delay)
                    log.debug("the failure", exc_info=raw)
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

    def _finish(self) -> None:
        """The reader stopped (or never started before close): wake every waiter and
        iterator."""
        self._done.set()
        with self._lock:
            self._applied.notify_all()
            consumers = list(self._consumers)
        for c in consumers:
            c.wake()

    def _session(self) -> None:
        """One stream, until it breaks (raises) or the subscription is closed (returns)."""
        client, options = self._connect()
        writer = reader = None
        try:
            writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(self._path), options)
            with self._stream_lock:
                if self._closing.is_set():
                    return
                self._reader = reader
            read = self._subscribe(writer, reader)
            while not self._closing.is_set():
                try:
                    msg = read()
                except StreamEnded as end:
                    writer.done_writing()  # the protocol: finish writing, then read the status
                    reader.read_chunk()  # raises the call's error
                    raise ConnectionError(f"the server ended the stream: {end}") from None
                except StopIteration:
                    raise ConnectionError("the stream ended") from None
                self._receive(msg)
        finally:
            self._stream_closed()
            with self._stream_lock:
                self._reader = None
            # cancel first (a finished call returns at once), then close the writer here so
            # its destructor does not log the call's status again
            for fn in (getattr(reader, "cancel", None), getattr(writer, "close", None),
                       client.close):
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        pass

    def _stream_closed(self) -> None:
        """A stream is ending: forget what refers to it (called before it is cancelled)."""
