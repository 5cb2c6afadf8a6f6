"""The server's one ``grpc.aio`` server, running our thread-based handlers (DESIGN.md §5).

Why ``grpc.aio``. With grpcio's sync server every message a stream sends costs its
handler thread a round trip through gRPC's completion-queue thread (start the write, wait
to be told it is done), so fifty subscribers mean fifty threads taking turns at the GIL
for every delta. On ``grpc.aio`` one event loop writes every stream: a fan-out hands a
delta to the loop once per stream and the loop writes them all (``bench/bench_aio.py``:
less server CPU per message, and a lower p99 with many subscribers; figures in
bench/README.md).

What stays. The handlers (:mod:`flight.rpc.flight_service`, :mod:`flight.rpc.table_service`, health,
reflection) are plain functions and generators that block: the engine's locks, the
journal's fsyncs and the fan-out threads are threads. :class:`Bridge`, the server's one
interceptor, runs each of them on a thread of the server's pool with a
:class:`CallContext`: the sync ``grpc.ServicerContext`` interface (``abort``,
``is_active``, ``add_callback``, ``peer``, ...) over the call's aio context. It applies
the sync interceptors (:class:`~flight.rpc.call_log.CallLog`, the bearer-token check) first, so
they see every service alike.

How messages cross:

* requests: a task on the loop reads up to ``read_ahead`` messages ahead of the handler
  (gRPC's flow control holds the client beyond that), so a DoPut's next batch arrives
  while the handler applies the last;
* responses: the handler's thread puts each message on a short :class:`_Pipe` the loop
  drains into the call (the thread blocks while it is full: the client's flow-control
  window reaches back to the handler);
* a :class:`LoopFeed` a handler yields is drained by the loop itself: writers on any
  thread put messages on it and the loop writes them, with no handler thread in between
  (a subscription's :class:`~flight.rpc.flight_service.FrameQueue`). The handler is
  suspended meanwhile, on no thread, and goes on (on a thread) once the feed is drained or
  the call ended: a thousand subscriptions hold no thousand waiting handler threads.

Short calls on the loop. A response-streaming method named in ``Bridge(loop_first=...)``
(DoGet) starts on the loop: its handler runs there, message by message, until it yields
:data:`HAND_OFF` (its next step may block: a scan, a lock, DuckDB), and the rest of it then
runs on a thread as above. A Flight SQL result read whole when its query started is sent
without a thread at all: the hop to a thread and back, and the pipe, cost about as much as
sending a small result.

:class:`AioServer` runs the loop on its own thread and gives the rest of the server a
blocking ``start``/``stop``/``wait`` (grpc.aio objects live on their loop's thread).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Collection, Generator, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVarTuple

import grpc

from flight.errors import again, grpc_status

__all__ = ["END", "HAND_OFF", "AioServer", "Bridge", "CallContext", "CallEnded", "HandOff",
           "LoopFeed", "LoopQueue", "QueueClosed", "Requests", "spawn", "wake"]

log = logging.getLogger(__name__)


class CallEnded(grpc.RpcError):  # type: ignore[misc]
    """Reading a request after the call ended (the client cancelled or went away)."""


class _Abort(Exception):
    """``CallContext.abort`` from a handler's thread: the bridge sends the status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def wake(waiter: asyncio.Future[None]) -> None:
    """Resolve ``waiter`` unless it is (call on its loop: ``loop.call_soon_threadsafe``)."""
    if not waiter.done():
        waiter.set_result(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Spawner:
    """Starts threads for an event loop, which must not wait for them (see :func:`spawn`)."""

    _lock = threading.Lock()
    _queue: queue.SimpleQueue[tuple[Callable[[], object], str]] = queue.SimpleQueue()
    _thread: threading.Thread | None = None

    @classmethod
    def ready(cls) -> None:
        """Start the starter thread unless it runs (best not on a loop: this waits for it)."""
        with cls._lock:
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._run, daemon=True,
                                               name="ticktable-thread-starter")
                cls._thread.start()

    @classmethod
    def submit(cls, target: Callable[[], object], name: str) -> None:
        """Have the starter thread start ``target`` on a thread of its own."""
        cls.ready()
        cls._queue.put((target, name))

    @classmethod
    def _run(cls) -> None:
        while True:
            target, name = cls._queue.get()
            try:
                threading.Thread(target=target, daemon=True, name=name).start()
            except RuntimeError:  # the interpreter is shutting down: nobody waits any more
                log.debug("could not start thread %s", name, exc_info=True)
            # not held here until the next one comes: a sender's target holds its stream,
            # and with it a table a drop must free at once
            del target


def spawn(target: Callable[[], object], name: str) -> None:
    """Run ``target`` on a new daemon thread named ``name``.

    On an event loop's thread the thread is started by another one: ``Thread.start`` waits
    until the new thread runs, and beside a busy Python thread (a cycle) that is two
    switch intervals, ~10 ms of a loop that writes every stream. Elsewhere it is started
    at once."""
    if _running_loop() is None:
        threading.Thread(target=target, daemon=True, name=name).start()
        return
    _Spawner.submit(target, name)


class _Waker:
    """Wakes futures of one event loop from other threads, in one loop callback per batch.

    A fan-out writing one delta to fifty subscriptions wakes fifty waiting streams: one
    ``call_soon_threadsafe`` (a write to the loop's self-pipe and a callback) for all of
    them rather than one each.
    """

    _by_loop: dict[asyncio.AbstractEventLoop, _Waker] = {}
    _lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: list[asyncio.Future[None]] = []
        self._mutex = threading.Lock()

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Waker:
        with cls._lock:
            waker = cls._by_loop.get(loop)
            if waker is None:
                waker = cls._by_loop[loop] = cls(loop)
            return waker

    @classmethod
    def forget(cls, loop: asyncio.AbstractEventLoop) -> None:
        with cls._lock:
            cls._by_loop.pop(loop, None)

    def wake(self, waiter: asyncio.Future[None]) -> None:
        if _running_loop() is self._loop:  # on the loop itself (a fan-out writing there)
            wake(waiter)
            return
        with self._mutex:
            self._pending.append(waiter)
            first = len(self._pending) == 1
        if first:
            try:
                self._loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _run(self) -> None:
        with self._mutex:
            pending, self._pending = self._pending, []
        for waiter in pending:
            wake(waiter)


class CallContext:
    """A call's ``grpc.ServicerContext`` for a handler running on a thread (see module doc).

    ``is_active`` turns false and the ``add_callback`` callbacks run when the call ends:
    finished, aborted, cancelled by the client or cut by a server stop.
    """

    def __init__(self, context: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop) -> None:
        self.aio = context
        self.loop = loop
        #: a request-streaming call's messages, as the handler was given them (None: unary)
        self.requests: Requests | None = None
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        # taken now, on the loop while the call is live: gRPC frees the call when it ends,
        # and a handler's thread may still ask (asking it then crashes the process)
        self._peer = str(context.peer())
        self._metadata = tuple(context.invocation_metadata() or ())
        self._auth = context.auth_context()
        self._identities = context.peer_identities()
        self._identity_key = context.peer_identity_key()
        context.add_done_callback(self._done)

    def _done(self, _context: Any) -> None:
        with self._lock:
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a call's end callback failed")

    def is_active(self) -> bool:
        """False once the call has ended."""
        return not self._ended.is_set()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends (False, and it never runs, if it has)."""
        with self._lock:
            if self._ended.is_set():
                return False
            self._callbacks.append(callback)
            return True

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """End the call with ``code`` and ``details`` (raises, as grpcio's does)."""
        self.aio.set_code(code)
        self.aio.set_details(details)
        raise _Abort(code, details)

    def abort_with_status(self, status: Any) -> None:
        self.abort(status.code, status.details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.aio.set_code(code)

    def set_details(self, details: str) -> None:
        self.aio.set_details(details)

    def code(self) -> grpc.StatusCode | None:
        return self.aio.code()

    def details(self) -> str:
        return self.aio.details() or ""

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return self.aio.time_remaining()

    def auth_context(self) -> dict[str, Any]:
        return dict(self._auth)

    def peer_identities(self) -> Any:
        return self._identities

    def peer_identity_key(self) -> Any:
        return self._identity_key

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.aio.set_trailing_metadata(metadata)

    def send_initial_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        if not self.is_active():
            return
        asyncio.run_coroutine_threadsafe(self.aio.send_initial_metadata(metadata),
                                         self.loop).result()


class LoopFeed:
    """Messages the event loop writes to the call itself (see module doc).

    A response-streaming handler yields one; the bridge writes what :meth:`drain` yields,
    on the loop, until it returns, then goes on with the handler's next message.
    """

    def drain(self) -> AsyncIterator[bytes]:
        """The messages, on the event loop's thread."""
        raise NotImplementedError


#: What :meth:`LoopQueue.get` returns after the last item.
END = object()


class HandOff:
    """The type of :data:`HAND_OFF`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HAND_OFF"


#: Yielded by a handler the bridge starts on the event loop (``Bridge(loop_first=...)``):
#: what it does next may block, so the rest of it runs on a thread. Never sent; a handler
#: already on a thread (or called directly) just goes on.
HAND_OFF = HandOff()


class _Ended:
    """The end of a call's requests: EOF (``error`` None) or the call ended."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Requests:
    """A call's request messages for a handler's thread, read ahead on the loop."""

    def __init__(self, context: grpc.aio.ServicerContext, loop: asyncio.AbstractEventLoop,
                 depth: int) -> None:
        self._context = context
        self._loop = loop
        self._depth = depth
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._space: asyncio.Future[None] | None = None
        self._arrived: Callable[[], None] | None = None
        self._task = loop.create_task(self._read())
        context.add_done_callback(lambda _c: self._task.cancel())

    async def _read(self) -> None:
        end = _Ended(None)
        try:
            while True:
                with self._cond:
                    full = len(self._items) >= self._depth
                    if full:
                        self._space = self._loop.create_future()
                if full:
                    assert self._space is not None
                    await self._space
                    continue
                message = await self._context.read()
                if message is grpc.aio.EOF:
                    return
                with self._cond:
                    self._items.append(message)
                    self._cond.notify()
                    arrived = self._arrived
                if arrived is not None:
                    arrived()
        except asyncio.CancelledError:
            end = _Ended(CallEnded("the call ended"))
        except Exception as exc:  # the call ended while reading
            end = _Ended(CallEnded(f"the call ended: {exc}"))
        finally:
            with self._cond:
                self._items.append(end)
                self._cond.notify()
                arrived, self._arrived = self._arrived, None  # the last: let go of its reader
            if arrived is not None:
                arrived()

    def watch(self, arrived: Callable[[], None]) -> None:
        """Call ``arrived`` after each message, and after the end, is read (on the loop,
        holding no lock; it must not block), and now (on this thread) if one waits: a
        reader then takes messages only when :meth:`ready` says some wait, and no thread
        of its own waits for them."""
        with self._cond:
            waiting = bool(self._items)
            if not (waiting and isinstance(self._items[-1], _Ended)):  # else none follows
                self._arrived = arrived
        if waiting:
            arrived()

    def ready(self) -> bool:
        """Whether ``next`` would return (or end) at once."""
        with self._cond:
            return bool(self._items)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        with self._cond:
            while not self._items:
                self._cond.wait()
            item = self._items[0]
            if isinstance(item, _Ended):  # left in place: every later next() ends too
                if item.error is not None:  # a copy: the one kept must not hold a traceback
                    raise again(item.error)  # (its frames would be kept with it)
                raise StopIteration
            self._items.popleft()
            space, self._space = self._space, None
        if space is not None:
            _Waker.of(self._loop).wake(space)
        return item


class QueueClosed(Exception):
    """Putting on a :class:`LoopQueue` its consumer closed (the call ended)."""


class LoopQueue:
    """Items put by threads and taken by the event loop, at most ``depth`` waiting.

    :meth:`put` blocks while ``depth`` items wait, and raises :class:`QueueClosed` once
    :meth:`close` was called; :meth:`finish` ends the items (its error is kept in
    :attr:`error`); :meth:`get` (on the loop) returns the next item, or :data:`END` after
    ``finish`` or once closed and empty.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, depth: int) -> None:
        self.loop = loop
        self._waker = _Waker.of(loop)
        self._depth = depth
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.error: BaseException | None = None

    def _add(self, item: Any) -> None:  # under self._cond
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._waker.wake(waiter)

    def put(self, item: Any) -> None:
        with self._cond:
            while len(self._items) >= self._depth and not self._closed:
                if _running_loop() is self.loop:  # only the loop takes items: never wait there
                    raise RuntimeError("a full LoopQueue was put to on its own event loop")
                self._cond.wait()
            if self._closed:
                raise QueueClosed
            self._add(item)

    def has_room(self) -> bool:
        """Whether a :meth:`put` now would return at once (room, and not closed)."""
        with self._cond:
            return len(self._items) < self._depth and not self._closed

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.error = error
            self._add(END)

    async def get(self) -> Any:
        while True:
            with self._cond:
                if self._items:
                    item = self._items.popleft()
                    self._cond.notify()
                    return item
                if self._closed:
                    return END
                waiter = self._waiter = self.loop.create_future()
            await waiter

    def close(self) -> None:
        """No more items are taken: writers blocked in :meth:`put` raise, and so do later
        ones (any thread)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._waker.wake(waiter)


class _Pipe(LoopQueue):
    """A handler thread's response messages, drained by the loop (see module doc)."""

    suspended: Generator[Any, None, None] | None = None

    def pump(self, behavior: Callable[[Any, Any], Generator[Any, None, None]], request: Any,
             context: CallContext) -> None:
        """Run a response-streaming handler on this thread, putting what it yields."""
        try:
            gen = behavior(request, context)
        except BaseException as exc:
            self.finish(exc)
            return
        self.resume(gen)

    def resume(self, gen: Generator[Any, None, None]) -> None:
        """Run the rest of a response-streaming handler on this thread, putting what it
        yields (a :data:`HAND_OFF` is not sent). At a :class:`LoopFeed` the handler is
        suspended, holding no thread, until the loop has drained the feed
        (:meth:`take_suspended`)."""
        error: BaseException | None = None
        handed = False  # to the loop, suspended: not closed here
        try:
            try:
                for item in gen:
                    if item is HAND_OFF:
                        continue
                    if isinstance(item, LoopFeed):
                        handed = self.suspend(gen, item)
                        if handed:
                            return
                        raise QueueClosed
                    self.put(item)
            finally:
                if not handed:
                    gen.close()
        except QueueClosed:
            pass
        except BaseException as exc:
            error = exc
        self.finish(error)

    def suspend(self, gen: Generator[Any, None, None], feed: LoopFeed) -> bool:
        """Put ``feed`` and keep ``gen`` for the loop to resume once it has drained it (the
        two together, so the loop never takes the feed without the handler). False, and
        nothing kept, once the pipe is closed."""
        with self._cond:
            while len(self._items) >= self._depth and not self._closed:
                if _running_loop() is self.loop:
                    raise RuntimeError("a full pipe was put to on its own event loop")
                self._cond.wait()
            if self._closed:
                return False
            self.suspended = gen
            self._add(feed)
            return True

    def take_suspended(self) -> Generator[Any, None, None] | None:
        """The handler suspended at the feed the loop took (see :meth:`suspend`), once."""
        with self._cond:
            gen, self.suspended = self.suspended, None
            return gen


_Ts = TypeVarTuple("_Ts")


def _after_give_way(give_way: Callable[[], None], callback: Callable[..., object],
                    *args: object) -> None:
    give_way()
    callback(*args)


class _GivingWayLoop(asyncio.SelectorEventLoop):
    """An event loop that calls ``give_way`` before each callback it runs: a task's step,
    a future's done callback, a ``call_soon_threadsafe`` callback, a reader's callback
    (gRPC's completion queue).

    For a loop that shares the GIL with work that must go first (the server's update
    cycles, :meth:`engine.graph.UpdateGraph.give_way`). Every time a cycle lets go of the
    GIL (a numpy or Arrow call, a lock) the loop takes it, and the cycle waits for the loop
    to let go again. Giving way only before each response message (as the bridge did) left
    the steps in between: with a thousand streams, gRPC's completions of their writes (one
    callback for hundreds of them), each stream's next wait, and the writes themselves
    (gRPC sends on the calling thread, the GIL held) took the GIL in the middle of cycles,
    and the loop's thread, sharing its core with the clients, could be preempted holding
    it. Between two callbacks the loop holds none of the handlers' locks, so waiting there
    never holds up a cycle that needs one (and a cycle never waits for the loop: it hands
    it work with ``call_soon_threadsafe``). Between cycles the wait is one
    ``Event.is_set``.
    """

    def __init__(self, give_way: Callable[[], None]) -> None:
        super().__init__()
        self._give_way = give_way

    def call_soon(self, callback: Callable[[*_Ts], object], *args: *_Ts,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        return super().call_soon(_after_give_way, self._give_way, callback, *args,
                                 context=context)

    def call_soon_threadsafe(self, callback: Callable[[*_Ts], object],
                             *args: *_Ts,
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        return super().call_soon_threadsafe(_after_give_way, self._give_way, callback, *args,
                                            context=context)

    def add_reader(self, fd: Any, callback: Callable[[*_Ts], Any],
                   *args: *_Ts) -> None:
        super().add_reader(fd, _after_give_way, self._give_way, callback, *args)


class Bridge(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The aio server's interceptor: the sync interceptors, then every handler on a thread.

    Parameters
    ----------
    interceptors
        Sync ``grpc.ServerInterceptor`` objects, outermost first (as ``grpc.server`` takes
        them).
    pool
        The threads handlers run on.
    read_ahead
        Request messages read ahead of a request-streaming handler.
    write_ahead
        Response messages a streaming handler may have waiting to be written.
    loop_first
        Full names of unary-request, streaming-response methods (``/package.Service/Method``)
        whose handlers start on the loop and yield :data:`HAND_OFF` before anything that may
        block (see the module docstring).
    """

    def __init__(self, interceptors: Sequence[grpc.ServerInterceptor],
                 pool: futures.ThreadPoolExecutor, *, read_ahead: int = 2,
                 write_ahead: int = 4, loop_first: Collection[str] = ()) -> None:
        self._interceptors = list(interceptors)
        self._pool = pool
        self._read_ahead = read_ahead
        self._write_ahead = write_ahead
        self._loop_first = frozenset(loop_first)

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        for interceptor in reversed(self._interceptors):
            handler = interceptor.intercept_service(lambda _d, h=handler: h, details)
            if handler is None:
                return None
        return self._on_loop(handler, details.method in self._loop_first)

    def _on_loop(self, handler: Any, loop_first: bool = False) -> Any:
        decode, encode = handler.request_deserializer, handler.response_serializer
        streaming = bool(handler.request_streaming)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, streaming), decode, encode)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, streaming), decode, encode)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, streaming, loop_first), decode, encode)
        return grpc.stream_stream_rpc_method_handler(
            self._stream(handler.stream_stream, streaming), decode, encode)

    def _context(self, request: Any, context: grpc.aio.ServicerContext,
                 streaming: bool) -> tuple[Any, CallContext]:
        loop = asyncio.get_running_loop()
        ctx = CallContext(context, loop)
        if streaming:
            request = ctx.requests = Requests(context, loop, self._read_ahead)
        return request, ctx

    def _unary(self, behavior: Callable[[Any, Any], Any], streaming: bool) -> Any:
        pool = self._pool

        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            request, ctx = self._context(request, context, streaming)
            try:
                return await asyncio.get_running_loop().run_in_executor(pool, behavior,
                                                                        request, ctx)
            except Exception as exc:
                await _answer(context, exc)

        return run

    def _stream(self, behavior: Callable[[Any, Any], Generator[Any, None, None]],
                streaming: bool, loop_first: bool = False) -> Any:
        pool, depth = self._pool, self._write_ahead
        loop_first = loop_first and not streaming

        async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request, ctx = self._context(request, context, streaming)
            loop = asyncio.get_running_loop()
            pipe = _Pipe(loop, depth)
            if not loop_first:
                loop.run_in_executor(pool, pipe.pump, behavior, request, ctx)
            else:  # on the loop until the handler hands off (or ends)
                gen: Generator[Any, None, None] | None = None
                try:
                    gen = behavior(request, ctx)
                    for item in gen:
                        if item is HAND_OFF:
                            break
                        if isinstance(item, LoopFeed):  # drained below, as a thread's
                            pipe.suspend(gen, item)  # the pipe is empty: this never waits
                            gen = None
                            break
                        yield item
                    else:
                        return
                except Exception as exc:
                    if gen is not None:
                        gen.close()
                    await _answer(context, exc)
                    return
                except BaseException:  # the call ended (cancelled) while on the loop
                    if gen is not None:
                        gen.close()
                    raise
                if gen is not None:
                    loop.run_in_executor(pool, pipe.resume, gen)
            try:
                while True:
                    item = await pipe.get()
                    if item is END:
                        break
                    if isinstance(item, LoopFeed):
                        feed = item.drain()
                        try:
                            async for message in feed:
                                yield message
                        finally:
                            await feed.aclose()  # type: ignore[attr-defined]
                        # the handler, suspended while the loop wrote its feed, goes on
                        suspended = pipe.take_suspended()
                        if suspended is not None:
                            loop.run_in_executor(pool, pipe.resume, suspended)
                    else:
                        yield item
            finally:
                pipe.close()
                # a handler still suspended (the call ended while its feed was written) ends
                # on a thread: its finally clauses release what it holds
                suspended = pipe.take_suspended()
                if suspended is not None:
                    loop.run_in_executor(pool, pipe.resume, suspended)
            # taken out of the pipe: its traceback holds the handler's frames, one of which
            # holds the pipe, a cycle that would keep everything the handler held (batches,
            # tables) until the cyclic garbage collector ran
            error, pipe.error = pipe.error, None
            if error is not None:
                try:
                    await _answer(context, error)
                finally:
                    del error

        return run


async def _answer(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """End the call with ``exc``'s status: the handler's own abort, or the error table's
    row (a bug: INTERNAL with a reference id, the traceback logged)."""
    if isinstance(exc, _Abort):
        await context.abort(exc.code, exc.details)
    if isinstance(exc, grpc.RpcError):  # from reading requests: the call is over
        return
    code, message = grpc_status(exc)
    await context.abort(code, message)


class AioServer:
    """A ``grpc.aio`` server on its own event-loop thread, with a blocking interface.

    Parameters
    ----------
    setup
        Called on the loop's thread with the new ``grpc.aio.Server``: adds the services and
        the port, and returns the port bound.
    interceptors
        Sync interceptors, outermost first (see :class:`Bridge`).
    max_calls
        Calls served at once (past it: RESOURCE_EXHAUSTED), and the threads handlers run on.
    options
        gRPC channel arguments.
    give_way
        Called on the loop's thread before each callback the loop runs (and so before each
        response message is written): it may block, without the GIL, to let other work go
        first, as the server's update cycles do (:meth:`engine.graph.UpdateGraph.give_way`;
        the module's ``_GivingWayLoop``). ``None``: never waits.
    loop_first
        Methods whose handlers start on the loop (see :class:`Bridge`).
    """

    def __init__(self, setup: Callable[[grpc.aio.Server], int],
                 interceptors: Sequence[grpc.ServerInterceptor], *, max_calls: int,
                 options: Sequence[tuple[str, Any]],
                 give_way: Callable[[], None] | None = None,
                 loop_first: Collection[str] = ()) -> None:
        self._pool = futures.ThreadPoolExecutor(max_workers=max_calls,
                                                thread_name_prefix="ticktable")
        _Spawner.ready()  # here, so that the loop never waits for it (spawn)
        self._loop = asyncio.new_event_loop() if give_way is None else _GivingWayLoop(give_way)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="ticktable-grpc-loop")
        self._stopped = threading.Event()
        self._server: grpc.aio.Server | None = None
        self._setup = setup
        self._interceptors = [Bridge(interceptors, self._pool, loop_first=loop_first)]
        self._max_calls = max_calls
        self._options = list(options)
        self.port = 0

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:  # what a stop left (calls cut short): cancelled and awaited, then closed
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            _Waker.forget(loop)

    def start(self) -> int:
        """Bind and serve; returns the port. Raises what ``setup`` raises."""
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        except BaseException:
            self._close_loop()
            raise
        return self.port

    async def _start(self) -> int:
        server = grpc.aio.server(interceptors=self._interceptors, options=self._options,
                                 maximum_concurrent_rpcs=self._max_calls)
        port = self._setup(server)
        await server.start()
        self._server = server
        return port

    def stop(self, grace: float | None) -> bool:
        """Refuse new calls, give those in flight ``grace`` seconds, then cancel them.

        Returns False if the server was still stopping ``grace`` + 5 s later.
        """
        clean = True
        if self._server is not None and not self._stopped.is_set():
            done = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop)
            try:
                done.result((grace or 0.0) + 5.0)
            except futures.TimeoutError:
                clean = False
        self._close_loop()
        return clean

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` (True) or ``timeout`` (False)."""
        return self._stopped.wait(timeout)
