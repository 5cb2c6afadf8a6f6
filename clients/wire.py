"""Low-level client calls shared by :class:`~clients.client.Client` and the Spark data source.

Everything here is a plain function over a ``pyarrow.flight.FlightClient`` and the call
options carrying the bearer token, so a Spark executor can rebuild it from picklable
settings (:class:`Endpoint`) without a ``Client`` object.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import Message as _Proto

from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.wire import RETRY_LATER, Action

__all__ = ["Endpoint", "PutSummary", "action", "chunks", "put_batches"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8815
#: Rows per record batch sent by DoPut (bounded by bytes too, see :func:`chunks`).
#: gRPC channel options of a subscription's connection: no BDP probing (which grows the
#: receive window to many MB, all of it buffered ahead of a slow reader) and a fixed 1 MiB
#: per-stream window (enough for ~1 GB/s at a 1 ms round trip).
SUBSCRIPTION_WINDOW: tuple[tuple[str, Any], ...] = (
    ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1 << 20))

CHUNK_ROWS = 1 << 17
CHUNK_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server is and how to reach it; picklable (Spark ships it to executors).

    Parameters
    ----------
    uri
        ``grpc://host:port``, ``grpc+tls://host:port`` or ``host[:port]`` (port 8815 by
        default, ``grpc+tls`` when ``tls`` is set).
    token
        Bearer token (default: the ``TICKTABLE_TOKEN`` environment variable, if set).
    tls
        ``False``: plain; ``True``: TLS with the system's roots; ``bytes``: the root
        certificate(s) in PEM; ``str``: a PEM file to read them from.
    verify
        ``False`` skips server certificate verification (self-signed tests only).
    timeout
        Seconds for unary calls (actions, listings); ``None``: no limit.
    """

    uri: str
    token: str | None = None
    tls: bool | bytes | str = False
    verify: bool = True
    timeout: float | None = 60.0

    @property
    def location(self) -> str:
        """The normalized Flight location, e.g. ``grpc://127.0.0.1:8815``.

        Raises
        ------
        ProtocolError
            If the URI's scheme is not one Ticktable speaks.
        """
        uri = self.uri.strip()
        if "://" not in uri:
            host, _, port = uri.partition(":")
            scheme = "grpc+tls" if self.tls else "grpc"
            return f"{scheme}://{host or '127.0.0.1'}:{port or DEFAULT_PORT}"
        scheme, _, rest = uri.partition("://")
        if scheme not in ("grpc", "grpc+tcp", "grpc+tls"):
            raise ProtocolError(f"unsupported scheme {scheme!r} in {self.uri!r}: use grpc:// or "
                                f"grpc+tls://")
        if self.tls and scheme != "grpc+tls":
            scheme = "grpc+tls"
        host, _, port = rest.rstrip("/").partition(":")
        return f"{scheme}://{host}:{port or DEFAULT_PORT}"

    @property
    def host(self) -> str:
        return self.location.split("://", 1)[1].rsplit(":", 1)[0]

    def _roots(self) -> bytes | None:
        if isinstance(self.tls, bytes):
            return self.tls
        if isinstance(self.tls, str):
            with open(self.tls, "rb") as f:
                return f.read()
        return None

    def _token(self) -> str | None:
        return self.token if self.token is not None else (os.environ.get("TICKTABLE_TOKEN")
                                                          or None)

    def headers(self) -> list[tuple[bytes, bytes]]:
        token = self._token()
        return [(b"authorization", f"Bearer {token}".encode())] if token else []

    def connect(self) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
        """A new Flight client and the options every call must pass (token, timeout)."""
        return self._connect(())

    def connect_subscription(self) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
        """:meth:`connect` for one subscription stream: a fixed receive window
        (:data:`SUBSCRIPTION_WINDOW`) in place of gRPC's growing one, so a client whose
        callbacks are slow holds few messages in flight and the server composes the rest
        into the next one (with gRPC's window a slow callback falls ever further behind;
        with this one its lag stays bounded, and a large snapshot over loopback is no
        slower: ``bench/slow_reader.py``)."""
        return self._connect(SUBSCRIPTION_WINDOW)

    def _connect(self, options: Sequence[tuple[str, Any]]) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
        kw: dict[str, Any] = {}
        roots = self._roots()
        if roots is not None:
            kw["tls_root_certs"] = roots
        if not self.verify:
            kw["disable_server_verification"] = True
        if options:
            kw["generic_options"] = list(options)
        client = fl.FlightClient(self.location, **kw)
        return client, self.options(timeout=None)

    def options(self, timeout: float | None = -1.0) -> fl.FlightCallOptions:
        """Call options with the bearer token; ``timeout=-1`` means :attr:`timeout`."""
        t = self.timeout if timeout == -1.0 else timeout
        return fl.FlightCallOptions(headers=self.headers(), timeout=t)


@dataclass(frozen=True, slots=True)
class PutSummary:
    """What the server acknowledged for one push.

    Attributes
    ----------
    rows, batches
        Rows and record batches the server acknowledged.
    staged
        The rows went to a stage slot (a transaction) rather than straight to the table.
    step
        The server cycle that made them visible (atomic pushes; ``-1`` otherwise: visible
        from the next cycle).
    mode
        The write mode used (``"append"``, ``"upsert"``, ...), by name.
    retries
        Times the server refused a batch because its table's writes waiting for a cycle
        were past its limit, and the rest was sent again (see :func:`put_batches`).
    """

    rows: int
    batches: int
    staged: bool
    step: int = -1
    mode: str = ""
    retries: int = 0


def chunks(batches: Iterable[pa.RecordBatch], max_rows: int = CHUNK_ROWS,
           max_bytes: int = CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """Re-slice ``batches`` into batches of at most ``max_rows`` rows and ~``max_bytes``."""
    for b in batches:
        if b.num_rows == 0:
            continue
        per_row = max(1, b.nbytes // max(1, b.num_rows))
        step = max(1, min(max_rows, max_bytes // per_row))
        for start in range(0, b.num_rows, step):  # per chunk, not per row
            yield b.slice(start, step)


def put_batches(client: fl.FlightClient, options: fl.FlightCallOptions, table: str,
                schema: pa.Schema, batches: Iterable[pa.RecordBatch], request: pb.PutRequest,
                progress: Callable[[int], None] | None = None, *,
                retry_for: float = 0.0) -> PutSummary:
    """One DoPut of ``batches`` into ``table``; returns what the server acknowledged.

    The first message carries ``request`` (mode, optional stage slot). The server sends one
    small ack per batch, read while the batches go out; at the end they are checked: a
    server that acknowledged fewer rows than were sent is an error.

    **Refused because cycles are behind.** A server whose table has too many writes waiting
    for a cycle refuses a batch with RESOURCE_EXHAUSTED (:class:`~engine.errors.BacklogFull`,
    whose message ends with :data:`flight.wire.RETRY_LATER`): the batches it acknowledged
    are applied, the refused one and those after it are not. With ``retry_for`` > 0 and no
    ``write_id`` in ``request``, those batches are sent again on a new DoPut after a short
    backoff (0.05 s doubling to 1 s, with jitter), for as long as the server acknowledges
    something at least every ``retry_for`` seconds; past that the refusal is raised. Sent
    but unacknowledged batches are kept until their ack (a few, bounded by the server's
    flow-control window), so a one-shot iterable is sent again too.

    Parameters
    ----------
    progress
        Called with the number of rows of each batch once it is first written.
    retry_for
        Seconds without any acknowledged batch after which a refusal for a full backlog
        is raised instead of sent again; 0 raises the first.

    Raises
    ------
    KeyError
        No such table (``NOT_FOUND``).
    pyarrow.ArrowInvalid
        The server refused the data (schema, mode, keys); it names the column. Also a
        refusal for a full backlog, past ``retry_for``.
    ProtocolError
        The server acknowledged other batches or rows than were sent.
    """
    meta = pa.py_buffer(request.SerializeToString())
    source = iter(batches)
    again: deque[pa.RecordBatch] = deque()  # refused before: sent first on the next stream
    acked_rows = acked = retries = 0
    staged = False
    delay, last_ack = _RETRY_FIRST, time.monotonic()
    while True:
        stream = _PutStream(client, options, table, schema, meta)
        try:
            stream.send(again, source, progress)
            stream.finish()
        except Exception as exc:
            refused = stream.close_after(exc)
            acked_rows, acked = acked_rows + stream.rows, acked + stream.acked
            staged |= stream.staged
            if stream.acked:
                delay, last_ack = _RETRY_FIRST, time.monotonic()
            if (not refused or request.write_id or retry_for <= 0
                    or time.monotonic() - last_ack >= retry_for):
                raise
            # not applied: the refused batch, those after it, and those not sent again yet
            stream.unacked.extend(again)
            again = stream.unacked
            retries += 1
            log.info("DoPut into %r: the server's backlog is full; sending %d batches again in "
                     "%.2f s", table, len(again), delay)
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, _RETRY_MAX)
            continue
        stream.check()
        return PutSummary(rows=acked_rows + stream.rows, batches=acked + stream.acked,
                          staged=staged or stream.staged, retries=retries)


_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0


class _PutStream:
    """One DoPut call: the batches written, and a thread reading their acks as they come.

    Each batch joins :attr:`unacked` before it is written and leaves it with its ack (acks
    come in batch order), so after a refusal :attr:`unacked` is exactly what the server did
    not apply.
    """

    def __init__(self, client: fl.FlightClient, options: fl.FlightCallOptions, table: str,
                 schema: pa.Schema, meta: pa.Buffer) -> None:
        self.table, self.schema, self.meta = table, schema, meta
        self.writer, self.reader = client.do_put(fl.FlightDescriptor.for_path(table), schema,
                                                 options)
        self.unacked: deque[pa.RecordBatch] = deque()
        self.sent = self.sent_rows = self.acked = self.rows = 0
        self.staged = False
        self.last = pb.PutAck()
        self._lock = threading.Lock()
        self._extra = 0  # acks past the batches sent: a broken server
        self._error: BaseException | None = None
        self._acks = threading.Thread(target=self._read_acks, daemon=True,
                                      name=f"ticktable-put-acks-{table}")
        self._acks.start()

    def _read_acks(self) -> None:
        try:
            while (buf := self.reader.read()) is not None:
                ack = pb.PutAck.FromString(buf.to_pybytes())
                with self._lock:
                    if self.unacked:
                        self.rows += self.unacked.popleft().num_rows
                    else:
                        self._extra += 1
                    self.acked += 1
                    self.last = ack
                    self.staged |= ack.staged
        except BaseException as exc:  # noqa: BLE001 - the call's status comes from close()
            self._error = exc

    def send(self, again: deque[pa.RecordBatch], source: Iterator[pa.RecordBatch],
             progress: Callable[[int], None] | None) -> None:
        """Write the batches of ``again`` (taking each out as it goes to :attr:`unacked`),
        then every batch of ``source`` (reporting those to ``progress``)."""
        while again:
            self._write(again.popleft())
        for b in source:
            if b.schema != self.schema:
                b = pa.Table.from_batches([b]).cast(self.schema).to_batches()[0] if b.num_rows else b
            self._write(b)
            if progress is not None:
                progress(b.num_rows)

    def _write(self, b: pa.RecordBatch) -> None:
        with self._lock:
            self.unacked.append(b)
        if self.sent == 0:
            self.writer.write_with_metadata(b, self.meta)
        else:
            self.writer.write_batch(b)
        self.sent += 1
        self.sent_rows += b.num_rows

    def finish(self) -> None:
        """End the stream and wait for the server's answer (raises the call's error)."""
        if self.sent == 0:
            self.writer.write_metadata(self.meta)
        self.writer.done_writing()
        self._acks.join()
        self.writer.close()

    def close_after(self, exc: BaseException) -> bool:
        """End the stream after ``exc``; whether it was a refusal for a full backlog (then
        every ack the server sent has been read)."""
        try:
            self.writer.done_writing()
        except Exception:  # noqa: BLE001 - the call already ended: its status is below
            pass
        self._acks.join()
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - ``exc`` stopped the stream: the one to see
            pass
        return isinstance(exc, pa.ArrowInvalid) and RETRY_LATER in str(exc)

    def check(self) -> None:
        """A stream that ended well: every batch acknowledged, with the rows sent."""
        if self._error is not None:
            raise self._error
        if self.acked != self.sent or self._extra or (self.sent and self.last.total_rows != self.sent_rows):
            raise ProtocolError(
                f"DoPut into {self.table!r}: sent {self.sent} batches ({self.sent_rows} rows), the "
                f"server acknowledged {self.acked} (PutAck.total_rows {self.last.total_rows})")


def action(client: fl.FlightClient, options: fl.FlightCallOptions, what: Action,
           body: _Proto | None = None) -> Any:
    """Run the action ``what`` (a row of :data:`flight.wire.ACTIONS`) with ``body``; returns
    its result parsed as the row's result message (``None`` for an action without one)."""
    raw = body.SerializeToString() if body is not None else b""
    out = list(client.do_action(fl.Action(what.name, raw), options))
    if what.result is None:
        return None
    msg = what.result()
    if out:
        msg.ParseFromString(out[0].body.to_pybytes())
    return msg
