"""Send one fuzz case to the server and judge its answer (see bench/_fuzz_cases.py).

Whatever the bytes, the server must answer with a specific status: never INTERNAL or
UNKNOWN (our bug), with details of one bounded line that hold no traceback and no file
path (:func:`violations`).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench._fuzz_cases import Case
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import parse_flight_data


# ------------------------------------------------------------------------- send and judge
@dataclass(slots=True)
class Answer:
    """What the server answered one case: the status code's name, its details, the
    messages read, and protocol-level error texts (a subscription's end-of-stream error)."""

    code: str
    details: str
    messages: int = 0
    texts: list[str] = field(default_factory=list)


_OK = "OK"


#: a subscription still streaming its first update is read for up to this many times the
#: timeout: a valid request can ask for a long answer (a growing table's snapshot in 1-row
#: batches: 30,000 messages took 14 s here), which is not a hang while messages come
SLOW_STREAM = 12


def send(channel: grpc.Channel, case: Case, *, timeout: float = 10.0,
         idle: float = 0.2) -> Answer:
    """Make the call and read the answer.

    A subscription (DoExchange) never ends by itself: it is read up to its first complete
    update and cancelled then, or, when the client sent more after its subscribe (changes,
    mutated frames), once the server stayed quiet for ``idle`` seconds or 8 messages came.
    A call still unanswered after ``timeout`` seconds is DEADLINE_EXCEEDED: a hang; for a
    subscription, ``timeout`` seconds without a message (or ``SLOW_STREAM`` times that in
    all).
    """
    if case.shape == "uu":
        try:
            channel.unary_unary(case.method)(case.request, timeout=timeout)
        except grpc.RpcError as exc:
            return Answer(exc.code().name, exc.details() or "")
        return Answer(_OK, "", 1)
    if case.shape == "us":
        stream = channel.unary_stream(case.method)(case.request, timeout=timeout)
        return _drain(stream)
    if case.method.endswith("DoExchange"):
        stream = channel.stream_stream(case.method)(iter(list(case.request)),
                                                    timeout=timeout * SLOW_STREAM)
        return _drain_subscription(stream, idle if len(case.request) > 1 else 0.0, timeout)
    stream = channel.stream_stream(case.method)(iter(list(case.request)), timeout=timeout)
    return _drain(stream)


def _drain(stream: Any) -> Answer:
    n = 0
    try:
        for _ in stream:
            n += 1
    except grpc.RpcError as exc:
        return Answer(exc.code().name, exc.details() or "", n)
    return Answer(_OK, "", n)


def _drain_subscription(stream: Any, idle: float, silence: float) -> Answer:
    n = 0
    texts: list[str] = []
    batches_due = -1  # record batches still due for the current update (-1: none read yet)
    cancelled = threading.Event()
    silent = threading.Event()  # no message for ``silence`` seconds: a hang

    def cancel() -> None:
        cancelled.set()
        stream.cancel()

    def hang() -> None:
        silent.set()
        stream.cancel()

    timer: threading.Timer | None = None
    watch = threading.Timer(silence, hang)
    watch.start()
    try:
        for raw in stream:
            n += 1
            watch.cancel()
            watch = threading.Timer(silence, hang)
            watch.start()
            if timer is not None:
                timer.cancel()
            meta, has_batch = _update_metadata(raw, texts)
            if meta is not None:  # the first record batch may ride with it
                batches_due = meta.num_added_batches + meta.num_modified_batches - has_batch
            elif batches_due > 0 and has_batch:
                batches_due -= 1
            if batches_due == 0 and (idle <= 0 or n >= 8):
                cancel()
                break
            if batches_due == 0:
                timer = threading.Timer(idle, cancel)
                timer.start()
    except grpc.RpcError as exc:
        if silent.is_set() and not cancelled.is_set():
            return Answer("DEADLINE_EXCEEDED", f"no message for {silence:g} s", n, texts)
        if not (cancelled.is_set() and exc.code() == grpc.StatusCode.CANCELLED):
            return Answer(exc.code().name, exc.details() or "", n, texts)
    finally:
        watch.cancel()
        if timer is not None:
            timer.cancel()
    return Answer(_OK, "", n, texts)


def _update_metadata(raw: bytes, texts: list[str]) -> tuple[pb.UpdateMetadata | None, bool]:
    """The ``UpdateMetadata`` of a subscription's ``FlightData`` (``None`` for a later record
    batch), and whether it holds a record batch; an end-of-stream error text goes to
    ``texts``."""
    try:
        f = parse_flight_data(raw)
        is_batch = f.header is not None  # (a dictionary message counts too, as before)
        if f.app_metadata is None or not len(f.app_metadata):
            return None, is_batch
        meta = pb.UpdateMetadata.FromString(bytes(f.app_metadata))
    except Exception:
        texts.append("(the server sent a message that is not a FlightData with UpdateMetadata)")
        return None, False
    if meta.end_of_stream:
        texts.append(meta.error)
    return meta, is_batch


BAD_CODES = frozenset({"INTERNAL", "UNKNOWN"})
#: A file path of the server, or a Python source file: never in a client's message.
_PATH = re.compile(r"\.pyx?\b|site-packages|/(?:usr|home|work|tmp|opt|root|var|srv|app|proc)/")
MAX_DETAILS = 4100
_TOKEN = re.compile(r"""[^\s'"()]+""")


def message_problems(text: str, sent: bytes = b"") -> list[str]:
    """What is wrong with one error text a client sees; ``sent``: the request's bytes (a
    path the client sent itself, echoed as the name it gave, is not the server's)."""
    out = []
    if "Traceback" in text:
        out.append("traceback")
    if "\n" in text:
        out.append("newline")
    if any(_PATH.search(tok) and tok.encode() not in sent for tok in _TOKEN.findall(text)):
        out.append("path")
    if len(text) > MAX_DETAILS:
        out.append(f"{len(text)} characters")
    return out


def violations(answer: Answer, sent: bytes = b"") -> list[str]:
    """Why ``answer`` breaks the error contract (empty: it does not); ``sent``: the
    request's bytes (:func:`message_problems`)."""
    out = [f"status {answer.code}"] if answer.code in BAD_CODES else []
    if answer.code == "DEADLINE_EXCEEDED":
        out.append("no answer before the deadline (a hang)")
    for text in (answer.details, *answer.texts):
        out += message_problems(text, sent)
    return out
