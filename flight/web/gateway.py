"""Feed ``arrow``: our own WebSocket streams a table into Perspective's WASM engine.

One :class:`~flight.web.feed.TableFeed` per socket. Each change is one binary message::

    u32 (little-endian)  n: length of the header
    n bytes              header, JSON: snapshot, step, sequence, updates, size, removes, rows
    0-7 bytes            padding to a multiple of 8
    8 * removes bytes    row keys to remove, float64 little-endian (Perspective's index
                         values are JavaScript numbers: exact below 2**53)
    the rest             the rows to upsert as one Arrow IPC stream (``__row_key`` first)

The browser builds a Perspective table indexed by ``__row_key`` from the snapshot, then
per message calls ``remove`` and ``update``, and answers each binary message with the text
message ``ack`` once applied. At most :data:`IN_FLIGHT` messages are unacknowledged: while
the browser's engine is busy, updates are composed into the next message on the server
(never queued in the browser, where latency and memory would grow without bound).
A snapshot of more than :data:`~flight.web.feed.SNAPSHOT_CHUNK_ROWS` rows travels as a
snapshot of its first rows and upserts of the others. A failed or dropped table sends one
text message ``{"state": "failed"|"dropped", "error": ...}`` and closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import threading
from typing import TYPE_CHECKING, Any

from engine.errors import TableNotFound, TicktableError
from flight.web.feed import Change, split_snapshot, to_ipc

if TYPE_CHECKING:
    from flight.web.remote import RemoteFeed, RemoteTables

__all__ = ["IN_FLIGHT", "Credits", "encode_change", "follow"]

#: Messages sent and not yet acknowledged by the browser, at most.
IN_FLIGHT = 2


class Credits:
    """How many more messages may go to the browser before it acknowledges one."""

    def __init__(self, n: int = IN_FLIGHT) -> None:
        self._n = n
        self._closed = False
        self._cond = threading.Condition()

    def take(self) -> bool:
        """Wait for a credit and take it; False once the socket closed."""
        with self._cond:
            while self._n == 0 and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._n -= 1
            return True

    def give(self) -> None:
        """The browser acknowledged a message."""
        with self._cond:
            self._n += 1
            self._cond.notify()

    def close(self) -> None:
        """The socket closed: nobody waits for a credit any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Whether the socket closed."""
        return self._closed

log = logging.getLogger(__name__)


def encode_change(change: Change) -> bytes:
    """``change`` as one binary message (the layout in the module docstring)."""
    header = json.dumps({"snapshot": change.snapshot, "step": change.step,
                         "sequence": change.sequence, "updates": change.updates,
                         "size": change.size, "removes": int(change.removes.size),
                         "rows": change.upserts.num_rows}).encode()
    pad = -(4 + len(header)) % 8
    return b"".join((struct.pack("<I", len(header)), header, b"\0" * pad,
                     change.removes.astype("<f8").tobytes(), to_ipc(change.upserts)))


def follow(tables: RemoteTables, name: str, socket: Any, loop: asyncio.AbstractEventLoop,
           credits: Credits) -> RemoteFeed:
    """Start streaming table ``name`` to ``socket`` (a tornado ``WebSocketHandler``).

    Each message waits for one of ``credits`` (the socket gives one back per ``ack``), is
    written from the event loop, and the feed's thread waits until it is flushed (the
    server composes what arrives meanwhile). Returns the running feed (close ``credits``
    and then it when the socket closes).

    Raises
    ------
    TableNotFound
        If there is no such table; :class:`~engine.errors.TableFailed` if it failed.
    """

    def deliver(change: Change) -> None:
        for part in split_snapshot(change):
            if not credits.take():
                return  # the socket closed
            data = encode_change(part)
            asyncio.run_coroutine_threadsafe(_write(socket, data), loop).result()

    def failed(exc: BaseException) -> None:
        state = "dropped" if isinstance(exc, TableNotFound) else "failed"
        error = str(exc) if isinstance(exc, TicktableError) else "the table stopped updating"
        if not isinstance(exc, TicktableError):
            log.warning("web: stream of table %r stopped: %s", name, exc)
        asyncio.run_coroutine_threadsafe(
            _write(socket, json.dumps({"state": state, "error": error}), close=True), loop)

    return tables.follow(name, deliver, on_failure=failed)


async def _write(socket: Any, data: bytes | str, *, close: bool = False) -> None:
    from tornado.websocket import WebSocketClosedError

    try:
        await socket.write_message(data, binary=isinstance(data, bytes))
    except WebSocketClosedError:
        return
    if close:
        socket.close(1000, "table stopped")
