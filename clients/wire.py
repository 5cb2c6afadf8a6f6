"""Low-level client calls shared by :class:`~clients.client.Client` and the Spark data source.

Everything here is a plain function over a ``pyarrow.flight.FlightClient`` and the call
options carrying the bearer token, so a Spark executor can rebuild it from picklable
settings (:class:`Endpoint`) without a ``Client`` object.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import Message as _Proto

from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.wire import Action

__all__ = ["Endpoint", "PutSummary", "action", "chunks", "put_batches"]

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
    """

    rows: int
    batches: int
    staged: bool
    step: int = -1
    mode: str = ""


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
                progress: Callable[[int], None] | None = None) -> PutSummary:
    """One DoPut of ``batches`` into ``table``; returns what the server acknowledged.

    The first message carries ``request`` (mode, optional stage slot). Acknowledgements
    are read after the last batch (the server sends one small ack per batch), then
    checked: a server that acknowledged fewer rows than were sent is an error.

    Parameters
    ----------
    progress
        Called with the number of rows of each batch once it is written.

    Raises
    ------
    KeyError
        No such table (``NOT_FOUND``).
    pyarrow.ArrowInvalid
        The server refused the data (schema, mode, keys); it names the column.
    ProtocolError
        The server acknowledged other batches or rows than were sent.
    """
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(table), schema, options)
    meta = pa.py_buffer(request.SerializeToString())
    sent = count = 0
    ok = False
    try:
        for b in batches:
            if b.schema != schema:
                b = pa.Table.from_batches([b]).cast(schema).to_batches()[0] if b.num_rows else b
            if count == 0:
                writer.write_with_metadata(b, meta)
            else:
                writer.write_batch(b)
            sent += b.num_rows
            count += 1
            if progress is not None:
                progress(b.num_rows)
        if count == 0:
            writer.write_metadata(meta)
        writer.done_writing()
        acked = staged = 0
        last = pb.PutAck()
        while True:
            buf = reader.read()
            if buf is None:
                break
            last.ParseFromString(buf.to_pybytes())
            acked += 1
            staged |= last.staged
        ok = True
    finally:
        try:
            writer.close()
        except Exception:
            if ok:
                raise  # else the error that stopped the stream is the one to see
    if acked != count or (count and last.total_rows != sent):
        raise ProtocolError(f"DoPut into {table!r}: sent {count} batches ({sent} rows), the server "
                            f"acknowledged {acked} (PutAck.total_rows {last.total_rows})")
    return PutSummary(rows=sent, batches=count, staged=bool(staged))


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
