"""Arrow Flight's hot messages, framed by hand (DESIGN.md §5).

``FlightData`` (DoGet, DoPut, DoExchange) and ``PutResult`` carry Arrow IPC messages; the
generated protobuf classes would copy every record batch body into a Python ``bytes``
field on the way in and again on the way out. Here the same wire format, the field
numbers of ``proto/arrow/flight/protocol/arrow_flight.proto``, is written and read
directly:

* **Out**: a record batch is serialized once (``RecordBatch.serialize``), its IPC header
  (the flatbuffer ``Message``) and body are sliced out without a copy, and one
  ``bytes.join`` makes the frame gRPC sends. A frame is immutable: the fan-out builds it
  once per update and every subscriber's stream sends the same object.
* **In**: :func:`parse_flight_data` finds the fields of a received message as
  ``memoryview`` slices of gRPC's ``bytes``; :class:`IpcDecoder` hands header and body to
  Arrow through a file object that returns those slices, so the record batch's buffers
  point into the received message (no copy of the body).

Dictionary-encoded columns take a slower, general path on both sides (a whole IPC stream
per message, through pyarrow's stream writer and reader).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from engine.errors import ProtocolError

__all__ = [
    "Chunk",
    "IpcDecoder",
    "IpcMessage",
    "ParsedFlightData",
    "batch_frames",
    "descriptor_of",
    "frame",
    "parse_flight_data",
    "put_result",
    "schema_frame",
    "validate_full",
]

# field tags (field number << 3 | wire type 2, varint-encoded)
_DESCRIPTOR = 0x0A        # 1
_HEADER = 0x12            # 2
_APP_METADATA = 0x1A      # 3
_BODY = b"\xc2\x3e"       # 1000
_CONTINUATION = b"\xff\xff\xff\xff"
_ZEROS = b"\x00" * 8

_Bytes: TypeAlias = "bytes | memoryview | pa.Buffer"

#: What Arrow raises reading malformed IPC bytes: its own errors (not implemented, type,
#: key, capacity, ... besides ``ArrowInvalid``), ``EOFError`` for a header that ends early,
#: ``UnicodeDecodeError`` for a field name that is not UTF-8, ``OverflowError``.
_ARROW_READ_ERRORS = (pa.ArrowException, ValueError, OSError, EOFError, IndexError, TypeError,
                      OverflowError)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _size(b: _Bytes) -> int:
    return b.size if isinstance(b, pa.Buffer) else len(b)


# ---------------------------------------------------------------------------------- writing
def frame(*, header: _Bytes | None = None, body: _Bytes | None = None,
          app_metadata: _Bytes | None = None, descriptor: bytes | None = None) -> bytes:
    """One serialized ``FlightData`` message (the fields given, in field-number order)."""
    parts: list[Any] = []
    if descriptor:
        parts += (bytes((_DESCRIPTOR,)), _varint(len(descriptor)), descriptor)
    if header is not None and _size(header):
        parts += (bytes((_HEADER,)), _varint(_size(header)), header)
    if app_metadata is not None and _size(app_metadata):
        parts += (bytes((_APP_METADATA,)), _varint(_size(app_metadata)), app_metadata)
    if body is not None and _size(body):
        parts += (_BODY, _varint(_size(body)), body)
    return b"".join(parts)


def put_result(app_metadata: bytes) -> bytes:
    """One serialized ``PutResult`` (field 1: ``app_metadata``)."""
    return b"".join((b"\x0a", _varint(len(app_metadata)), app_metadata))


def schema_frame(schema: pa.Schema, app_metadata: _Bytes | None = None) -> bytes:
    """The ``FlightData`` that opens a stream: the schema message."""
    return frame(header=ipc.read_message(schema.serialize()).metadata, app_metadata=app_metadata)


@functools.lru_cache(maxsize=256)
def _has_dictionaries(schema: pa.Schema) -> bool:
    """Whether any column of ``schema`` is or nests a dictionary (a stream's schema is asked
    once per message: remembered for the last few hundred schemas)."""
    return any(_dictionary_in(f.type) for f in schema)


def _dictionary_in(t: pa.DataType) -> bool:
    """Whether ``t`` is, or nests (a multi-table stream's union of structs), a dictionary."""
    return pa.types.is_dictionary(t) or any(_dictionary_in(t.field(i).type)
                                            for i in range(t.num_fields))


def batch_frames(schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                 first_metadata: _Bytes | None = None) -> Iterator[bytes]:
    """One ``FlightData`` per record batch (``first_metadata`` on the first), lazily.

    With dictionary-encoded columns, each batch is preceded by its dictionaries (sent
    whole: a later dictionary message for the same id replaces the earlier one).
    """
    meta = first_metadata
    if not _has_dictionaries(schema):
        for b in batches:
            header, body = _header_and_body(b.serialize())
            yield frame(header=header, body=body, app_metadata=meta)
            meta = None
        return
    for b in batches:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, schema) as w:
            w.write_batch(b)
        reader = ipc.MessageReader.open_stream(sink.getvalue())
        messages = [m for m in reader]
        for m in messages[1:]:  # skip the schema message; dictionaries, then the batch
            last = m is messages[-1]
            yield frame(header=m.metadata, body=m.body if m.body.size else None,
                        app_metadata=meta if last else None)
        meta = None


def _header_and_body(message: pa.Buffer) -> tuple[memoryview, memoryview]:
    """The IPC header (flatbuffer ``Message``, with its padding) and body of an
    encapsulated IPC message (continuation marker, int32 header size, header, body), as
    slices of it. The same slices ``ipc.read_message`` gives, found without it: a delta is
    framed a hundred times a second, each time with cold caches, where every call counts."""
    view = memoryview(message)
    if view[:4].tobytes() != _CONTINUATION:
        raise ValueError("not an encapsulated IPC message")
    end = 8 + int.from_bytes(view[4:8], "little")
    return view[8:end], view[end:]


# ---------------------------------------------------------------------------------- reading
@dataclass(frozen=True, slots=True)
class ParsedFlightData:
    """The fields of one received ``FlightData``, as slices of the received bytes."""

    descriptor: memoryview | None
    header: memoryview | None
    app_metadata: memoryview | None
    body: memoryview | None


def _read_varint(buf: memoryview, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(buf):
            raise ProtocolError("FlightData: truncated message (a length runs past its end)")
        b = buf[at]
        at += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, at
        shift += 7
        if shift > 63:
            raise ProtocolError("FlightData: malformed varint")


def parse_flight_data(raw: bytes | memoryview) -> ParsedFlightData:
    """Split a serialized ``FlightData`` into its fields without copying.

    Raises
    ------
    ProtocolError
        If the bytes are not a well-formed ``FlightData``.
    """
    buf = memoryview(raw)
    fields: dict[int, memoryview] = {}
    at, end = 0, len(buf)
    while at < end:
        tag, at = _read_varint(buf, at)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            n, at = _read_varint(buf, at)
            if at + n > end:
                raise ProtocolError(f"FlightData: field {number} of {n} bytes runs past the "
                                    f"end of the {end}-byte message")
            fields[number] = buf[at: at + n]
            at += n
        elif wire == 0:
            _, at = _read_varint(buf, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise ProtocolError(f"FlightData: field {number} has wire type {wire}, which "
                                f"protobuf does not define")
    if at != end:
        raise ProtocolError("FlightData: truncated message")
    return ParsedFlightData(fields.get(1), fields.get(2), fields.get(3), fields.get(1000))


def descriptor_of(raw: memoryview | None) -> flight.FlightDescriptor | None:
    """The pyarrow ``FlightDescriptor`` for a serialized ``FlightDescriptor`` field."""
    if raw is None:
        return None
    try:
        return flight.FlightDescriptor.deserialize(bytes(raw))
    except Exception as exc:  # pyarrow raises ArrowInvalid or OSError for bad bytes
        raise ProtocolError("FlightData: malformed flight_descriptor") from exc


class _Parts:
    """A read-only file over byte slices: Arrow reads the IPC message from it without copies."""

    closed = False

    def __init__(self, parts: list[Any]) -> None:
        self._parts = parts

    def read(self, n: int = -1) -> Any:
        if not self._parts:
            return b""
        p = self._parts[0]
        if n < 0 or n >= len(p):
            self._parts.pop(0)
            return p
        self._parts[0] = p[n:]
        return p[:n]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self._parts = []


def _message(header: memoryview, body: memoryview | None) -> ipc.Message:
    """An Arrow IPC message from its header and body slices, the body not copied: its
    buffers are slices of the received bytes, aligned or not as protobuf's framing placed
    them (what needs alignment realigns: :func:`engine._kernels.arrays.aligned`)."""
    pad = (-len(header)) % 8
    prefix = b"".join((_CONTINUATION, struct.pack("<i", len(header) + pad), header, _ZEROS[:pad]))
    parts: list[Any] = [prefix]
    if body is not None and len(body):
        parts.append(body)
    return ipc.read_message(pa.PythonFile(_Parts(parts), mode="r"))


_OFFSETS: dict[pa.DataType, type[np.signedinteger[Any]]] = {
    pa.string(): np.int32, pa.large_string(): np.int64}


def validate_full(batch: pa.RecordBatch) -> None:
    """``batch.validate(full=True)``, with the common string column checked in numpy.

    Arrow's full check of a string column validates UTF-8 value by value: most of a
    batch's decode, for a column of short symbols. A string column whose offsets are in
    order and inside its data, whose null count matches its validity bitmap and whose
    bytes are all ASCII is valid, and numpy shows that in a few vectorized passes; any
    other column, or a string column that is not all ASCII, is checked by Arrow.

    Raises
    ------
    pyarrow.ArrowInvalid
        As ``batch.validate(full=True)`` does, for the same batches.
    """
    batch.validate()  # lengths and buffer sizes: what the numpy checks below read within
    for column in batch.columns:
        if not _valid_ascii_strings(column):
            column.validate(full=True)


def _valid_ascii_strings(a: pa.Array) -> bool:
    """Whether ``a`` is a string column shown valid here (False: let Arrow decide)."""
    dtype = _OFFSETS.get(a.type)
    if dtype is None:
        return False
    validity, offsets_buf, data = a.buffers()
    n, at, width = len(a), a.offset, np.dtype(dtype).itemsize
    if offsets_buf is None or offsets_buf.size < (at + n + 1) * width:
        return False
    offsets = np.frombuffer(offsets_buf, dtype=dtype, count=at + n + 1)[at:]
    first, last = int(offsets[0]), int(offsets[-1])
    if first < 0 or last > (data.size if data is not None else 0) or bool(
            (offsets[1:] < offsets[:-1]).any()):
        return False
    if validity is not None:
        if validity.size * 8 < at + n:
            return False
        bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
        if n - int(np.count_nonzero(bits[at: at + n])) != a.null_count:
            return False
    elif a.null_count:
        return False
    return last == first or int(np.frombuffer(data, dtype=np.uint8, count=last - first,
                                              offset=first).max()) < 0x80


@dataclass(frozen=True, slots=True)
class IpcMessage:
    """A record batch's IPC message as received: its header (the flatbuffer ``Message``)
    and its body (``bodyLength`` bytes), slices of the received bytes, not copied.

    The batch decoded from it points into ``body``; with a schema it is again an IPC stream
    (:meth:`stream_pieces`), which the journal writes without serializing the rows again.
    """

    header: memoryview
    body: memoryview

    def stream_pieces(self, schema: pa.Schema) -> tuple[bytes, memoryview, bytes]:
        """An IPC stream of ``schema`` holding just this message, in three pieces: the
        schema message with this message's framing and header, ``body``, and the
        end-of-stream marker."""
        pad = (-len(self.header)) % 8
        head = b"".join((schema.serialize().to_pybytes(), _CONTINUATION,
                         struct.pack("<i", len(self.header) + pad), self.header, _ZEROS[:pad]))
        return head, self.body, _END_OF_STREAM


_END_OF_STREAM = _CONTINUATION + _ZEROS[:4]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One decoded message of a stream: a record batch or ``None``, and its ``app_metadata``
    (the shape of pyarrow's ``FlightStreamChunk``); ``message``, the batch's IPC message
    when the batch's buffers are slices of its body (no dictionaries)."""

    data: pa.RecordBatch | None
    app_metadata: pa.Buffer | None
    message: IpcMessage | None = None


class IpcDecoder:
    """Decodes the ``FlightData`` messages of one stream: the schema, then record batches.

    ``stream`` yields the received messages' bytes. The first message with a header must
    be the schema (it may also carry the descriptor and ``app_metadata``, kept in
    :attr:`descriptor` and :attr:`schema_metadata`).
    """

    def __init__(self, stream: Iterator[bytes], where: str) -> None:
        self._stream = stream
        self._where = where
        self.schema: pa.Schema | None = None
        self.descriptor: flight.FlightDescriptor | None = None
        self.schema_metadata: pa.Buffer | None = None
        # per dictionary id, the messages that make its current dictionary: the last full
        # one and the deltas after it (a full one replaces the id's earlier messages)
        self._dictionaries: dict[int, list[tuple[memoryview, memoryview | None]]] = {}
        self._pending: list[Chunk] = []

    def _next_raw(self) -> ParsedFlightData | None:
        try:
            raw = next(self._stream)
        except StopIteration:
            return None
        msg = parse_flight_data(raw)
        if msg.descriptor is not None and self.descriptor is None:
            self.descriptor = descriptor_of(msg.descriptor)
        return msg

    def read_schema(self) -> pa.Schema | None:
        """Read up to the schema message; ``None`` if the stream ended first.

        Messages before it with only ``app_metadata`` are kept for :meth:`read_chunk`.
        """
        while self.schema is None:
            msg = self._next_raw()
            if msg is None:
                return None
            if msg.header is None:
                if msg.app_metadata is not None:
                    self._pending.append(Chunk(None, pa.py_buffer(bytes(msg.app_metadata))))
                continue
            m = self._decode(msg.header, None)
            if m.type != "schema":
                raise ProtocolError(f"{self._where}: the first Arrow message must be the "
                                    f"schema, got a {m.type} message")
            self.schema = self._schema(m)
            if msg.app_metadata is not None and len(msg.app_metadata):
                self.schema_metadata = pa.py_buffer(bytes(msg.app_metadata))
        return self.schema

    def read_chunk(self) -> Chunk:
        """The next record batch or metadata-only message.

        Raises
        ------
        StopIteration
            When the stream ends.
        ProtocolError
            For a malformed message, or a record batch that does not match the schema.
        """
        if self._pending:
            return self._pending.pop(0)
        while True:
            msg = self._next_raw()
            if msg is None:
                raise StopIteration
            meta = (pa.py_buffer(msg.app_metadata) if msg.app_metadata is not None
                    and len(msg.app_metadata) else None)
            if msg.header is None:
                if meta is None:  # nothing but the descriptor (or nothing at all)
                    continue
                return Chunk(None, meta)
            if self.schema is None:
                m = self._decode(msg.header, None)
                if m.type == "schema":  # read here when read_schema was not called first
                    self.schema = self._schema(m)
                    if meta is not None:  # its app_metadata is a message of its own
                        self.schema_metadata = meta
                        return Chunk(None, meta)
                    continue
                raise ProtocolError(f"{self._where}: a record batch before the schema")
            try:
                batch, message = self._batch(msg.header, msg.body)
                return Chunk(batch, meta, message)
            except _NeedMore:  # a dictionary: the batch using it follows
                continue

    def _decode(self, header: memoryview, body: memoryview | None) -> ipc.Message:
        try:
            return _message(header, body)
        except _ARROW_READ_ERRORS as exc:
            raise ProtocolError(f"{self._where}: malformed Arrow IPC message "
                                f"({_first_line(exc)})") from exc

    def _schema(self, m: ipc.Message) -> pa.Schema:
        try:
            schema = ipc.read_schema(m)
            _check_names(schema)  # Arrow reads names as bytes; Python needs UTF-8
        except _ARROW_READ_ERRORS as exc:
            raise ProtocolError(f"{self._where}: malformed schema message "
                                f"({_first_line(exc)})") from exc
        return schema

    def _batch(self, header: memoryview,
               body: memoryview | None) -> tuple[pa.RecordBatch, IpcMessage | None]:
        assert self.schema is not None
        if _has_dictionaries(self.schema):
            return self._dictionary_batch(header, body), None
        m = self._decode(header, body)
        if m.type != "record batch":
            raise ProtocolError(f"{self._where}: expected a record batch, got a {m.type} "
                                f"message")
        try:
            batch = ipc.read_record_batch(m, self.schema)
            # full: offsets, null counts and UTF-8 too; a batch that passes only the cheap
            # check can make later reads run past its buffers
            validate_full(batch)
        except _ARROW_READ_ERRORS as exc:
            raise ProtocolError(f"{self._where}: malformed record batch "
                                f"({_first_line(exc)})") from exc
        # the body as Arrow read it: bodyLength bytes (a longer body's rest is not the batch's)
        return batch, IpcMessage(header, (body if body is not None else memoryview(b""))[
            : m.body.size])

    def _dictionary_batch(self, header: memoryview, body: memoryview | None) -> pa.RecordBatch:
        """The general path: dictionaries are kept and replayed as one IPC stream."""
        assert self.schema is not None
        m = self._decode(header, body)
        if m.type == "dictionary":
            id_, delta = _dictionary_id(header, self._where)
            if delta:
                self._dictionaries.setdefault(id_, []).append((header, body))
            else:  # replay only what is current: not every dictionary the stream ever sent
                self._dictionaries[id_] = [(header, body)]
            raise _NeedMore
        if m.type != "record batch":
            raise ProtocolError(f"{self._where}: expected a record batch, got a {m.type} "
                                f"message")
        try:
            sink = pa.BufferOutputStream()
            sink.write(self.schema.serialize())
            held = [d for messages in self._dictionaries.values() for d in messages]
            for h, b in (*held, (header, body)):
                sink.write(_message(h, b).serialize())
            sink.write(_CONTINUATION + b"\x00\x00\x00\x00")
            table = ipc.open_stream(sink.getvalue()).read_all()
            batches = table.combine_chunks().to_batches()
            batch = batches[0] if batches else pa.RecordBatch.from_pylist([], self.schema)
            batch.validate(full=True)  # dictionaries and their indices included
        except _ARROW_READ_ERRORS as exc:
            raise ProtocolError(f"{self._where}: malformed record batch "
                                f"({_first_line(exc)})") from exc
        return batch


class _NeedMore(Exception):
    """A dictionary message was read: the caller reads on."""


def _dictionary_id(header: memoryview, where: str) -> tuple[int, bool]:
    """``(id, isDelta)`` of a ``DictionaryBatch`` IPC header (a flatbuffer ``Message``
    that Arrow already parsed): read by hand, as pyarrow does not expose them."""
    h = bytes(header)

    def field(table: int, i: int) -> int:  # the field's offset in its table, 0: absent
        vtable = table - struct.unpack_from("<i", h, table)[0]
        size = struct.unpack_from("<H", h, vtable)[0]
        return struct.unpack_from("<H", h, vtable + 4 + 2 * i)[0] if 4 + 2 * i < size else 0

    try:
        message = struct.unpack_from("<I", h, 0)[0]
        at = field(message, 2)  # Message.header
        batch = message + at + struct.unpack_from("<I", h, message + at)[0]
        id_at, delta_at = field(batch, 0), field(batch, 2)  # DictionaryBatch.id, .isDelta
        id_ = struct.unpack_from("<q", h, batch + id_at)[0] if id_at else 0
        delta = bool(h[batch + delta_at]) if delta_at else False
    except (struct.error, IndexError) as exc:
        raise ProtocolError(f"{where}: malformed dictionary message ({exc})") from exc
    return id_, delta


def _check_names(schema: pa.Schema) -> None:
    """Raise ``UnicodeDecodeError`` if a field name, nested ones included, is not UTF-8."""
    todo = list(schema)
    while todo:
        f = todo.pop()
        f.name  # noqa: B018 -- decodes the name
        t = f.type
        if pa.types.is_dictionary(t):
            t = t.value_type
        todo.extend(t.field(i) for i in range(t.num_fields))


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
