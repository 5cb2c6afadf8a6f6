"""The fuzz judge's hang: a subscription that goes silent is one, a long answer still
streaming is not (a valid request for a growing table's snapshot in 1-row batches took 14 s
for 30,000 messages, past the 10 s deadline, in a 100,000-case run)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from bench import _fuzz_judge as fj
from bench._fuzz_cases import Case

METHOD = "/arrow.flight.protocol.FlightService/DoExchange"


@pytest.fixture
def channel() -> Iterator[tuple[grpc.Channel, threading.Event]]:
    release = threading.Event()

    def exchange(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        first = next(requests)
        if first == b"silent":  # one message, then nothing until the call ends
            yield b"x"
            while context.is_active() and not release.wait(0.05):
                pass
            return
        for _ in range(40):  # a steady stream for ~2 s, then the end
            yield b"x"
            time.sleep(0.05)

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "arrow.flight.protocol.FlightService",
        {"DoExchange": grpc.stream_stream_rpc_method_handler(exchange)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ch, release
    finally:
        release.set()
        ch.close()
        server.stop(0)


def test_a_silent_subscription_is_a_hang_and_a_long_stream_is_not(channel):
    ch, _ = channel
    t = time.monotonic()
    silent = fj.send(ch, Case(METHOD, "ss", [b"silent"], "DoExchange:valid"), timeout=0.5)
    assert silent.code == "DEADLINE_EXCEEDED" and silent.details == "no message for 0.5 s"
    assert silent.messages == 1 and time.monotonic() - t < 5
    assert "no answer before the deadline (a hang)" in fj.violations(silent)
    # ~2 s of messages 50 ms apart: four times the timeout in all, never silent that long
    steady = fj.send(ch, Case(METHOD, "ss", [b"steady"], "DoExchange:valid"), timeout=0.5)
    assert steady.code == "OK" and steady.messages == 40, steady


def test_a_path_is_a_problem_unless_the_client_sent_it():
    echoed = 'no table "ATTACH \'/tmp/fz.db\'" (tables: a, b); create it first'
    assert fj.message_problems(echoed) == ["path"]
    assert fj.message_problems(echoed, b"\x12\x13ATTACH '/tmp/fz.db'") == []
    # the server's own path beside the client's echo is still one
    leak = echoed + " at /work/main/engine/graph.py"
    assert fj.message_problems(leak, b"ATTACH '/tmp/fz.db'") == ["path"]
    assert fj.message_problems("table 'x' failed in engine/table.py", b"x") == ["path"]
