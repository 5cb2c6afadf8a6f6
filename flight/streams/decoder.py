"""The reference decoder of a subscription stream: rebuilds a table from its messages.

This module is the protocol's executable definition, written for obviousness over speed
(a client applying an update costs work proportional to what it holds here). It imports
no engine code but the dependency-free :mod:`engine.errors` and the kernels
(:mod:`engine._kernels`, numpy/pyarrow/pyroaring only): otherwise only pyarrow, numpy,
pyroaring and the generated protobuf, so clients and tests in any process can use it.
A stream that breaks the protocol raises :class:`~engine.errors.ProtocolError` naming the
message field it broke.

A subscription stream (``DoExchange``) is a sequence of messages. Each message is
``num_added_batches + num_modified_batches`` record batches, the first of which carries an
:class:`UpdateMetadata` in its ``app_metadata`` (one gRPC message for a small delta, like
Barrage's); a message of no batches is one metadata-only Flight message. A metadata-only
Flight message followed by all the batches is read the same (older servers sent that). In the
``UPDATES`` format the client applies, in order:

1. ``is_snapshot``: forget everything (the message then lists every row as added);
2. remove ``removed_rows`` (keys before the update) and their values;
3. apply ``shifts`` (inclusive key ranges moving by a delta) to keys and held values;
4. add ``added_rows``;
5. write the values of ``added_data_rows`` then ``modified_data_rows`` (ascending key
   order, one row per key, in the carried ``columns``);
6. keep values only for rows whose position is in ``viewport`` (when ``has_viewport``).

In the ``TRIPLES`` format the batches are rows with ``__time`` and ``__diff`` columns; a
client sums them into a multiset (a snapshot replaces it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from google.protobuf.message import DecodeError
from pyroaring import BitMap64

from engine._kernels.arrays import aligned_table, shift_keys
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.wire import DIFF, TIME

__all__ = ["Message", "ReferenceView", "StreamEnded", "TriplesView", "apply_shifts", "decode_rows",
           "group_schemas", "iter_messages", "read_group_message", "read_message"]

I64 = npt.NDArray[np.int64]


def decode_rows(data: bytes) -> I64:
    """Row keys from a portable Roaring serialization (empty bytes: no rows)."""
    if not data:
        return np.empty(0, dtype=np.int64)
    bm = BitMap64.deserialize(data)
    if not bm:
        return np.empty(0, dtype=np.int64)
    return np.frombuffer(bm.to_array(), dtype=np.int64)


def apply_shifts(keys: I64, shifts: pb.ShiftData | tuple[I64, I64, I64], *,
                 inverse: bool = False) -> I64:
    """``keys`` after the shift ranges; keys outside every range stay.

    ``shifts`` is the message's ``ShiftData`` or its ``(begins, ends, deltas)`` arrays
    (ends inclusive). With ``inverse``, keys after the shift are mapped back to before it.
    One ``searchsorted`` over the range begins (:func:`engine._kernels.arrays.shift_keys`):
    the cost follows the keys, whatever the number of ranges.
    """
    if isinstance(shifts, tuple):
        begins, ends, deltas = shifts
    else:
        begins = np.asarray(shifts.begins, dtype=np.int64)
        ends = np.asarray(shifts.ends, dtype=np.int64)
        deltas = np.asarray(shifts.deltas, dtype=np.int64)
    if inverse:
        begins, ends, deltas = begins + deltas, ends + deltas, -deltas
    return shift_keys(keys, begins, ends, deltas)


class StreamEnded(Exception):
    """The server ended the subscription (``end_of_stream``); the text says why.

    The client should call ``writer.done_writing()`` and then read the call's final status.
    """


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded message: its metadata and the added/modified rows (or triples)."""

    meta: pb.UpdateMetadata
    added: pa.Table
    modified: pa.Table


def read_message(reader: Any, schema: pa.Schema | None = None) -> Message:
    """Read one message from a Flight stream reader (``read_chunk()``).

    Raises
    ------
    StopIteration
        At the end of the stream.
    StreamEnded
        When the server ends the subscription.
    ProtocolError
        If the stream does not follow the protocol.
    """
    meta, batches = _read(reader)
    sch = schema if schema is not None else reader.schema
    n_added = meta.num_added_batches
    return Message(meta, pa.Table.from_batches(batches[:n_added], schema=sch),
                   pa.Table.from_batches(batches[n_added:], schema=sch))


def group_schemas(schema: pa.Schema) -> list[pa.Schema]:
    """The tables' schemas of a multi-table stream's schema (docs/protocol.md §7.11): one
    column, a dense union whose member ``i`` is a struct of table ``i``'s columns.

    Raises
    ------
    ProtocolError
        If ``schema`` is not of that shape.
    """
    t = schema.field(0).type if len(schema) == 1 else None
    if t is None or not pa.types.is_union(t) or t.mode != "dense" or list(t.type_codes) != list(
            range(t.num_fields)) or not all(pa.types.is_struct(f.type) for f in t):
        raise ProtocolError(f"protocol: a multi-table stream's schema is one dense union "
                            f"column of structs with type codes 0..n-1, got {schema}")
    return [pa.schema(list(f.type)) for f in t]


def read_group_message(reader: Any, schemas: list[pa.Schema]) -> Message:
    """Read one message of a multi-table stream: a table's message, its rows in that table's
    schema (``schemas[meta.group_table]``, from :func:`group_schemas`), or an end-of-step
    marker (``meta.end_of_step``; no rows).

    Raises
    ------
    StopIteration, StreamEnded, ProtocolError
        As :func:`read_message`.
    """
    meta, batches = _read(reader)
    if meta.end_of_step:
        if batches:
            raise ProtocolError("protocol: an end-of-step marker carries no record batch")
        empty = pa.table({})
        return Message(meta, empty, empty)
    code = meta.group_table
    if code >= len(schemas):
        raise ProtocolError(f"protocol: UpdateMetadata.group_table {code} names no table of "
                            f"the group (it has {len(schemas)})")
    rows = [_member_rows(b, code) for b in batches]
    n_added, sch = meta.num_added_batches, schemas[code]
    return Message(meta, pa.Table.from_batches(rows[:n_added], schema=sch),
                   pa.Table.from_batches(rows[n_added:], schema=sch))


def _member_rows(batch: pa.RecordBatch, code: int) -> pa.RecordBatch:
    """A group stream's batch as table ``code``'s rows: every row of the union in member
    ``code``, at offsets ``0..n-1`` of its child (zero-copy)."""
    union = batch.column(0)
    n = batch.num_rows
    codes = np.asarray(union.type_codes)
    offsets = np.asarray(union.offsets)
    child = union.field(code)
    if (np.any(codes != code) or not np.array_equal(offsets, np.arange(n))
            or len(child) != n):
        raise ProtocolError(f"protocol: a record batch of group_table {code} holds rows of "
                            f"other members, or not at offsets 0..n-1")
    return pa.RecordBatch.from_struct_array(child)


def _read(reader: Any) -> tuple[pb.UpdateMetadata, list[pa.RecordBatch]]:
    """One message's metadata and its record batches (see :func:`read_message`)."""
    chunk = reader.read_chunk()
    if chunk.app_metadata is None:
        raise ProtocolError("protocol: expected a message with an UpdateMetadata in app_metadata, "
                            "got a bare record batch")
    meta = pb.UpdateMetadata()
    try:
        meta.ParseFromString(chunk.app_metadata.to_pybytes())
    except DecodeError as exc:
        raise ProtocolError(f"protocol: app_metadata is not an UpdateMetadata ({exc})") from exc
    if meta.end_of_stream:
        raise StreamEnded(meta.error)
    n_added, n_modified = meta.num_added_batches, meta.num_modified_batches
    batches = []
    if chunk.data is not None:  # the first record batch rides with the metadata
        if n_added + n_modified == 0:
            raise ProtocolError("protocol: the UpdateMetadata message carries a record batch but "
                                "num_added_batches + num_modified_batches is 0")
        batches.append(chunk.data)
    while len(batches) < n_added + n_modified:
        chunk = reader.read_chunk()
        if chunk.data is None:
            raise ProtocolError(f"protocol: expected {n_added + n_modified} record batch(es) "
                                f"with and after the UpdateMetadata (num_added_batches/"
                                f"num_modified_batches), got a metadata message")
        if chunk.app_metadata is not None and len(chunk.app_metadata):
            raise ProtocolError("protocol: app_metadata on a record batch that is not the "
                                "message's first (num_added_batches/num_modified_batches "
                                "promised more batches)")
        batches.append(chunk.data)
    return meta, batches


class ReferenceView:
    """A subscriber's view of a table, rebuilt from ``UPDATES`` messages.

    Attributes
    ----------
    keys
        The table's row keys, ascending (all of them, also outside a viewport).
    data
        Values held: the rows of ``data_keys``, in the carried columns.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.keys: I64 = np.empty(0, dtype=np.int64)
        self.data_keys: I64 = np.empty(0, dtype=np.int64)
        self.data: pa.Table = schema.empty_table()
        self.columns: list[str] = list(schema.names)
        self.viewport: list[tuple[int, int]] | None = None
        self.sequence = 0
        self.step = 0
        self.epoch = ""
        self.messages = 0

    def apply(self, msg: Message) -> None:
        """Apply one message (raises ``ProtocolError`` where the stream breaks the protocol)."""
        m = msg.meta
        if m.format != pb.DELTA_FORMAT_UPDATES:
            raise ProtocolError("UpdateMetadata.format: ReferenceView decodes DELTA_FORMAT_UPDATES; "
                                "use TriplesView")
        if m.is_snapshot:
            self.keys = np.empty(0, dtype=np.int64)
            self.data_keys = np.empty(0, dtype=np.int64)
            self.data = self.schema.empty_table()
        removed = decode_rows(m.removed_rows)
        if removed.size:
            if not np.all(np.isin(removed, self.keys)):
                raise ProtocolError("protocol: UpdateMetadata.removed_rows has rows that are not held")
            self.keys = np.setdiff1d(self.keys, removed, assume_unique=True)
            self._drop_data(np.isin(self.data_keys, removed))
        self.keys = apply_shifts(self.keys, m.shifts)
        self.data_keys = apply_shifts(self.data_keys, m.shifts)
        added = decode_rows(m.added_rows)
        if added.size:
            if np.any(np.isin(added, self.keys)):
                raise ProtocolError("protocol: UpdateMetadata.added_rows has rows that already exist")
            self.keys = np.union1d(self.keys, added)
        if np.any(np.diff(self.keys) <= 0) or np.any(np.diff(self.data_keys) <= 0):
            raise ProtocolError("protocol: UpdateMetadata.shifts reordered rows")
        self.columns = list(m.columns)
        for rows, table in ((m.added_data_rows, msg.added), (m.modified_data_rows, msg.modified)):
            keys = decode_rows(rows)
            if keys.size != table.num_rows:
                raise ProtocolError(f"protocol: {keys.size} data rows announced (UpdateMetadata."
                                    f"added_data_rows/modified_data_rows), {table.num_rows} sent")
            if keys.size:
                self._write(keys, table)
        self.viewport = [(r.begin, r.end) for r in m.viewport] if m.has_viewport else None
        held = self.held_keys()
        self._drop_data(~np.isin(self.data_keys, held))
        missing = np.setdiff1d(held, self.data_keys)
        if missing.size:
            raise ProtocolError(f"protocol: no values for {missing.size} held rows, e.g. "
                                f"{missing[:5].tolist()} (UpdateMetadata.added_data_rows/"
                                f"modified_data_rows)")
        self.sequence, self.step, self.epoch = m.sequence, m.step, m.epoch
        self.messages += 1

    def held_keys(self) -> I64:
        """The keys whose values this view holds: all, or those in the viewport."""
        if self.viewport is None:
            return self.keys
        pos = [np.arange(max(b, 0), min(e, self.keys.size)) for b, e in self.viewport]
        p = np.unique(np.concatenate(pos)) if pos else np.empty(0, dtype=np.int64)
        return self.keys[p]

    def _drop_data(self, mask: npt.NDArray[np.bool_]) -> None:
        if mask.any():
            keep = ~mask
            self.data_keys = self.data_keys[keep]
            self.data = self.data.filter(pa.array(keep))

    def _write(self, keys: I64, table: pa.Table) -> None:
        self._drop_data(np.isin(self.data_keys, keys))
        both = np.concatenate([self.data_keys, keys])
        data = pa.concat_tables([self.data, table.select(self.schema.names).cast(self.schema)])
        order = np.argsort(both, kind="stable")
        self.data_keys = both[order]
        self.data = data.take(pa.array(order))

    def to_arrow(self) -> pa.Table:
        """The held rows in table order, in the carried columns."""
        return self.data.select(self.columns)


class TriplesView:
    """A subscriber's view rebuilt from ``TRIPLES`` messages: a consolidated multiset."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.parts: list[pa.Table] = []
        self.sequence = 0
        self.step = 0
        self.columns: list[str] = [n for n in schema.names if n not in (DIFF, TIME)]

    def apply(self, msg: Message) -> None:
        m = msg.meta
        if m.format != pb.DELTA_FORMAT_TRIPLES:
            raise ProtocolError("UpdateMetadata.format: TriplesView decodes DELTA_FORMAT_TRIPLES; "
                                "use ReferenceView")
        if m.is_snapshot:
            self.parts = []
        self.columns = list(m.columns)
        if msg.added.num_rows:
            self.parts.append(msg.added.select([*self.columns, DIFF]))
        self.sequence, self.step = m.sequence, m.step

    def to_arrow(self) -> pa.Table:
        """Every row with its multiplicity expanded, sorted by all columns."""
        if not self.parts:
            return self.schema.empty_table().select(self.columns)
        # a Flight client's record batches point into gRPC's buffers, aligned or not, and
        # Acero's aggregation may assume alignment
        t = aligned_table(pa.concat_tables(self.parts))
        g = t.group_by(self.columns, use_threads=False).aggregate([(DIFF, "sum")])
        w = g.column(f"{DIFF}_sum").to_numpy()
        if np.any(w < 0):
            raise ProtocolError(f"protocol: the {DIFF} weights of the triples left a negative "
                                f"multiplicity")
        rows = g.select(self.columns).take(pa.array(np.repeat(np.arange(len(w)), w)))
        return rows.sort_by([(c, "ascending") for c in self.columns]) if rows.num_rows else rows


def iter_messages(reader: Any) -> Iterator[Message]:
    """Every message until the end of the stream."""
    while True:
        try:
            yield read_message(reader)
        except (StopIteration, StreamEnded):
            return

