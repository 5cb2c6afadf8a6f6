"""flight.rpc.aio: thread handlers on the grpc.aio server, over real gRPC on localhost."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from engine.errors import TableNotFound
from flight.rpc.aio import HAND_OFF, AioServer, CallContext, HandOff, LoopFeed, spawn, wake

S = "test.Bridge"


class Feed(LoopFeed):
    """Messages another thread writes; the loop drains them (a FrameQueue in miniature)."""

    def __init__(self, context: CallContext, n: int, hold: threading.Event | None = None) -> None:
        self.loop = context.loop
        self.items: list[bytes | None] = []
        self.lock = threading.Lock()
        self.waiter: Any = None
        threading.Thread(target=self._write, args=(n, hold), daemon=True).start()

    def _write(self, n: int, hold: threading.Event | None) -> None:
        for i in range(n + 1):
            if i == n and hold is not None:
                hold.wait()  # the last item, which ends the feed, waits for the test
            with self.lock:
                self.items.append(None if i == n else b"f%d" % i)
                waiter, self.waiter = self.waiter, None
            if waiter is not None:
                self.loop.call_soon_threadsafe(wake, waiter)

    async def drain(self) -> AsyncIterator[bytes]:
        while True:
            with self.lock:
                item = self.items.pop(0) if self.items else b""
                if item == b"":
                    waiter = self.waiter = self.loop.create_future()
            if item == b"":
                await waiter
                continue
            if item is None:
                return
            yield item


class Handlers:
    def __init__(self) -> None:
        self.ended = threading.Event()
        self.after_end: dict[str, Any] = {}
        self.threads: set[str] = set()
        self.hold = threading.Event()
        self.resumed_on = ""

    def echo(self, request: bytes, context: CallContext) -> bytes:
        self.threads.add(threading.current_thread().name)
        return request.upper()

    def refuse(self, request: bytes, context: CallContext) -> bytes:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "table 't' is read-only")
        raise AssertionError("abort returned")

    def bug(self, request: bytes, context: CallContext) -> bytes:
        raise TableNotFound("no table named 'x'")

    def count(self, request: bytes, context: CallContext) -> Iterator[bytes]:
        for i in range(int(request)):
            yield b"%d" % i

    def total(self, requests: Iterator[bytes], context: CallContext) -> bytes:
        return b"%d" % sum(int(r) for r in requests)

    def forever(self, request: bytes, context: CallContext) -> Iterator[bytes]:
        context.add_callback(self.ended.set)
        i = 0
        try:
            while context.is_active():
                yield b"%d" % i
                i += 1
                time.sleep(0.001)
        finally:
            # the handler ends either way: it sees the call inactive, or (its next message
            # refused once the call ended) it is closed at its yield; once the call's end
            # callbacks ran, gRPC has freed the call, and asking must not crash the process
            self.ended.wait(10)
            self.after_end = {"peer": context.peer(), "active": context.is_active(),
                              "metadata": dict(context.invocation_metadata())}

    def feed(self, request: bytes, context: CallContext) -> Iterator[bytes | LoopFeed]:
        yield b"head"
        yield Feed(context, int(request))
        yield b"tail"

    def held_feed(self, request: bytes, context: CallContext) -> Iterator[bytes | LoopFeed]:
        try:
            yield b"head"
            yield Feed(context, 3, self.hold)
            self.resumed_on = threading.current_thread().name
            yield b"tail"
        finally:
            self.ended.set()

    def generic(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(S, {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Refuse": grpc.unary_unary_rpc_method_handler(self.refuse),
            "Bug": grpc.unary_unary_rpc_method_handler(self.bug),
            "Count": grpc.unary_stream_rpc_method_handler(self.count),
            "Total": grpc.stream_unary_rpc_method_handler(self.total),
            "Forever": grpc.unary_stream_rpc_method_handler(self.forever),
            "Feed": grpc.unary_stream_rpc_method_handler(self.feed),
            "HeldFeed": grpc.unary_stream_rpc_method_handler(self.held_feed),
        })


def _serve(handlers: Any, **kw: Any) -> tuple[AioServer, grpc.Channel]:
    """An :class:`AioServer` of ``handlers.generic()`` on a free port, and a channel to it."""

    def setup(server: grpc.aio.Server) -> int:
        server.add_generic_rpc_handlers((handlers.generic(),))
        return int(server.add_insecure_port("127.0.0.1:0"))

    server = AioServer(setup, [], max_calls=8, options=[("grpc.so_reuseport", 0)], **kw)
    return server, grpc.insecure_channel(f"127.0.0.1:{server.start()}")


@pytest.fixture
def served() -> Iterator[tuple[Handlers, grpc.Channel]]:
    handlers = Handlers()
    server, channel = _serve(handlers)
    try:
        yield handlers, channel
    finally:
        channel.close()
        assert server.stop(1.0)
        assert server.wait(0)


def test_unary_handlers_run_on_the_server_threads(served):
    handlers, ch = served
    assert ch.unary_unary(f"/{S}/Echo")(b"abc", timeout=5) == b"ABC"
    assert handlers.threads and all(t.startswith("ticktable") for t in handlers.threads)


def test_abort_and_errors_answer_their_code_and_one_line(served):
    _, ch = served
    with pytest.raises(grpc.RpcError) as refused:
        ch.unary_unary(f"/{S}/Refuse")(b"", timeout=5)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "table 't' is read-only"
    with pytest.raises(grpc.RpcError) as missing:
        ch.unary_unary(f"/{S}/Bug")(b"", timeout=5)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no table named 'x'" in missing.value.details()
    assert "Traceback" not in missing.value.details() and "\n" not in missing.value.details()


def test_streams_both_ways_keep_order_and_end(served):
    _, ch = served
    got = list(ch.unary_stream(f"/{S}/Count")(b"2000", timeout=10))
    assert got == [b"%d" % i for i in range(2000)]
    assert ch.stream_unary(f"/{S}/Total")(iter([b"%d" % i for i in range(500)]),
                                          timeout=10) == b"%d" % sum(range(500))
    assert ch.stream_unary(f"/{S}/Total")(iter([]), timeout=10) == b"0"


def test_a_loop_feed_is_written_between_the_handlers_messages(served):
    _, ch = served
    got = list(ch.unary_stream(f"/{S}/Feed")(b"300", timeout=10))
    assert got == [b"head", *[b"f%d" % i for i in range(300)], b"tail"]


def _threads_in(function: str) -> list[str]:
    """The threads now running ``function`` (anywhere on their stacks)."""
    import sys

    names = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        f = frame
        while f is not None and f.f_code.co_name != function:
            f = f.f_back
        if f is not None:
            found.append(names.get(ident, str(ident)))
    return found


def test_a_handler_waits_on_no_thread_while_the_loop_writes_its_feed(served):
    """A handler that yielded a feed is suspended, holding no thread, until the loop has
    drained the feed; then it goes on, on a thread of the server."""
    handlers, ch = served
    call = ch.unary_stream(f"/{S}/HeldFeed")(b"", timeout=10)
    got = [next(call) for _ in range(4)]  # head and the feed's three, its end held back
    assert got == [b"head", b"f0", b"f1", b"f2"]
    time.sleep(0.2)
    # the handler did not go on past its feed, and no thread waits in it meanwhile
    assert handlers.resumed_on == "" and not handlers.ended.is_set()
    assert _threads_in("held_feed") == []
    handlers.hold.set()
    assert list(call) == [b"tail"]
    assert handlers.ended.wait(5)
    assert handlers.resumed_on.startswith("ticktable")  # a thread of the server's pool


def test_a_handler_suspended_at_its_feed_ends_when_its_client_leaves(served):
    """The call ends while the loop writes a suspended handler's feed: the handler is
    resumed on a thread and runs to its end (what it yields next goes nowhere; its finally
    clauses release what it holds), without waiting for the feed's own end."""
    handlers, ch = served
    call = ch.unary_stream(f"/{S}/HeldFeed")(b"", timeout=10)
    assert [next(call) for _ in range(4)] == [b"head", b"f0", b"f1", b"f2"]
    call.cancel()
    assert handlers.ended.wait(5)
    assert handlers.resumed_on.startswith("ticktable")
    assert not handlers.hold.is_set()  # the feed never ended
    handlers.hold.set()
    assert ch.unary_unary(f"/{S}/Echo")(b"x", timeout=5) == b"X"  # the server goes on


def test_spawn_on_an_event_loop_leaves_the_start_to_another_thread(monkeypatch):
    """``Thread.start`` waits until the new thread runs (two switch intervals beside a busy
    Python thread): on an event loop, ``spawn`` has another thread start it."""
    import asyncio

    starters: list[str] = []
    start = threading.Thread.start

    def recorded(self: threading.Thread) -> None:
        starters.append(threading.current_thread().name)
        start(self)

    ran = threading.Event()

    async def on_loop() -> str:
        spawn(ran.set, "spawned-on-loop")
        return threading.current_thread().name

    spawn(lambda: None, "warm")  # off a loop: started here, at once
    monkeypatch.setattr(threading.Thread, "start", recorded)
    loop_thread = asyncio.run(on_loop())
    assert ran.wait(5)
    assert starters and loop_thread not in starters
    assert starters == ["ticktable-thread-starter"]
    starters.clear()
    spawn(lambda: None, "off-loop")
    assert starters == [threading.current_thread().name]


def test_a_cancelled_stream_ends_its_handler_and_runs_its_callbacks(served):
    handlers, ch = served
    call = ch.unary_stream(f"/{S}/Forever")(b"", timeout=10, metadata=[("who", "me")])
    for _, _m in zip(range(20), call, strict=False):
        pass
    call.cancel()
    assert handlers.ended.wait(5)
    deadline = time.monotonic() + 5
    while not handlers.after_end and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handlers.after_end["active"] is False
    assert handlers.after_end["peer"].startswith("ipv4:127.0.0.1:")
    assert handlers.after_end["metadata"]["who"] == "me"
    # and the server goes on serving
    assert ch.unary_unary(f"/{S}/Echo")(b"x", timeout=5) == b"X"


class Gate:
    """A ``give_way`` that counts its calls and their threads, and waits while shut."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.calls = 0
        self.threads: set[str] = set()

    def __call__(self) -> None:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        self.open.wait()


class Stamped(Handlers):
    """Handlers whose streams' messages carry, as gRPC serializes each to send it (on the
    loop), how many times the gate had been called by then."""

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    def _stamp(self, message: bytes) -> bytes:
        return b"%s@%d" % (message, self.gate.calls)

    def generic(self) -> grpc.GenericRpcHandler:
        stream = grpc.unary_stream_rpc_method_handler
        return grpc.method_handlers_generic_handler(S, {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Count": stream(self.count, response_serializer=self._stamp),
            "Feed": stream(self.feed, response_serializer=self._stamp),
        })


@pytest.fixture
def gated() -> Iterator[tuple[Gate, grpc.Channel]]:
    gate = Gate()
    server, channel = _serve(Stamped(gate), give_way=gate)
    try:
        yield gate, channel
    finally:
        gate.open.set()
        channel.close()
        assert server.stop(1.0)


def _unstamped(messages: list[bytes]) -> tuple[list[bytes], list[int]]:
    pairs = [m.rsplit(b"@", 1) for m in messages]
    return [m for m, _ in pairs], [int(n) for _, n in pairs]


def test_the_loop_gives_way_before_each_callback_and_so_each_message(gated):
    """``give_way`` runs on the loop's thread before every callback the loop runs: between
    any two messages a stream sends (the handler's own and a loop feed's) it ran at least
    once, and no message goes out while it waits."""
    gate, ch = gated
    got, stamps = _unstamped(list(ch.unary_stream(f"/{S}/Count")(b"40", timeout=10)))
    assert got == [b"%d" % i for i in range(40)]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))
    got, stamps = _unstamped(list(ch.unary_stream(f"/{S}/Feed")(b"25", timeout=10)))
    assert got == [b"head", *[b"f%d" % i for i in range(25)], b"tail"]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))
    assert gate.threads == {"ticktable-grpc-loop"}
    before = gate.calls
    assert ch.unary_unary(f"/{S}/Echo")(b"u", timeout=5) == b"U"
    assert gate.calls > before  # every call goes through the loop's callbacks

    gate.open.clear()
    shut_at = gate.calls
    call = ch.unary_stream(f"/{S}/Count")(b"3", timeout=10)
    got_: list[bytes] = []
    reader = threading.Thread(target=lambda: got_.extend(call), daemon=True)
    reader.start()
    deadline = time.monotonic() + 5
    while gate.calls == shut_at and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gate.calls == shut_at + 1  # the loop waits before its next callback ...
    reader.join(0.3)
    assert reader.is_alive() and got_ == []  # ... and nothing was sent meanwhile
    gate.open.set()
    reader.join(5)
    assert _unstamped(got_)[0] == [b"0", b"1", b"2"]


# ------------------------------------------------------------------ loop_first methods
class LoopFirst:
    """Handlers of methods that start on the loop: where each message was made."""

    def __init__(self) -> None:
        self.where: list[tuple[bytes, str]] = []
        self.closed = threading.Event()

    def _note(self, message: bytes) -> bytes:
        self.where.append((message, threading.current_thread().name))
        return message

    def split(self, request: bytes, context: CallContext) -> Iterator[bytes | HandOff]:
        """``request`` messages on the loop, then HAND_OFF, then as many on a thread."""
        n = int(request)
        for i in range(n):
            yield self._note(b"loop%d" % i)
        yield HAND_OFF
        for i in range(n):
            yield self._note(b"thread%d" % i)

    def short(self, request: bytes, context: CallContext) -> Iterator[bytes | HandOff]:
        yield self._note(b"only")

    def fail_on_loop(self, request: bytes, context: CallContext) -> Iterator[bytes | HandOff]:
        yield self._note(b"first")
        raise TableNotFound("no table named 'x'")

    def fail_after(self, request: bytes, context: CallContext) -> Iterator[bytes | HandOff]:
        yield HAND_OFF
        self._note(b"failing")
        raise TableNotFound("no table named 'y'")

    def endless(self, request: bytes, context: CallContext) -> Iterator[bytes | HandOff]:
        try:
            while True:
                yield self._note(b"x" * 1000)
        finally:
            self.closed.set()

    def generic(self) -> grpc.GenericRpcHandler:
        stream = grpc.unary_stream_rpc_method_handler
        return grpc.method_handlers_generic_handler(S, {
            "Split": stream(self.split), "Short": stream(self.short),
            "FailOnLoop": stream(self.fail_on_loop), "FailAfter": stream(self.fail_after),
            "Endless": stream(self.endless),
            "Plain": stream(self.split),  # not loop-first: all of it on a thread
        })


@pytest.fixture
def loop_first() -> Iterator[tuple[LoopFirst, grpc.Channel]]:
    handlers = LoopFirst()
    server, channel = _serve(handlers, loop_first=[
        f"/{S}/{m}" for m in ("Split", "Short", "FailOnLoop", "FailAfter", "Endless")])
    try:
        yield handlers, channel
    finally:
        channel.close()
        assert server.stop(1.0)


def test_a_loop_first_handler_runs_on_the_loop_until_it_hands_off(loop_first):
    handlers, ch = loop_first
    got = list(ch.unary_stream(f"/{S}/Split")(b"3", timeout=10))
    assert got == [b"loop0", b"loop1", b"loop2", b"thread0", b"thread1", b"thread2"]  # no HAND_OFF
    where = dict(handlers.where)
    assert {where[b"loop%d" % i] for i in range(3)} == {"ticktable-grpc-loop"}
    assert all(where[b"thread%d" % i].startswith("ticktable_") for i in range(3))

    handlers.where.clear()
    assert list(ch.unary_stream(f"/{S}/Short")(b"", timeout=10)) == [b"only"]
    assert handlers.where == [(b"only", "ticktable-grpc-loop")]  # never needed a thread

    handlers.where.clear()  # the same handler, not named loop-first: a thread from the start
    assert list(ch.unary_stream(f"/{S}/Plain")(b"2", timeout=10))[0] == b"loop0"
    assert all(t.startswith("ticktable_") for _, t in handlers.where)


def test_a_loop_first_handler_s_errors_answer_on_either_side_of_the_hand_off(loop_first):
    _, ch = loop_first
    for method, name in (("FailOnLoop", "x"), ("FailAfter", "y")):
        call = ch.unary_stream(f"/{S}/{method}")(b"", timeout=10)
        with pytest.raises(grpc.RpcError) as failed:
            list(call)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        assert failed.value.details() == f"no table named '{name}'"


def test_a_loop_first_handler_is_closed_when_its_client_leaves(loop_first):
    handlers, ch = loop_first
    call = ch.unary_stream(f"/{S}/Endless")(b"", timeout=10)
    next(call)
    call.cancel()
    assert handlers.closed.wait(5)  # its finally ran: nothing is left running on the loop
