"""The delta codec: a table's update in, one subscription message's ``FlightData`` out.

A subscription message (docs/protocol.md §7) is an :class:`UpdateMetadata` and record
batches, framed by :mod:`flight.rpc.framing`: the first batch carries the metadata, or the
metadata travels alone when there are no rows. :class:`DeltaCodec` builds every message of
one stream (one table, one format, its columns, viewport and batch size):

- :meth:`DeltaCodec.snapshot`: every row (``UPDATES``: the row set, and the values of the
  rows the client holds; ``TRIPLES``: every row at ``+1``);
- :meth:`DeltaCodec.delta`: an ``UPDATES`` delta: the update's row sets and shifts, and the
  values of the rows the client must (re)learn, read at the current state;
- :meth:`DeltaCodec.update_triples` (inside the cycle: it reads previous values) and
  :meth:`DeltaCodec.triples`: a ``TRIPLES`` delta, through the differential layer's
  translator (:func:`~engine.differential.translator.update_to_triples`): one consolidated
  batch over the carried columns, framed in the stream schema (the other columns null).

:mod:`flight.streams.decoder` is its inverse (tests/flight/streams/test_codec.py checks
the round trip over random updates).

Pure. No threads, queues or locks: the caller holds whatever lock reading the table needs
(the graph's shared lock, or the cycle itself for :meth:`DeltaCodec.update_triples`), and
says which state the client is at (``held``, ``sequence``). A message is an immutable
:class:`Encoded`: a fan-out writes the same frames to every member.

Multi-table streams (docs/protocol.md §7.11) carry every table of a group in one stream
schema, :func:`group_schema`: one dense-union column whose member ``i`` is a struct of table
``i``'s columns. A codec given a :class:`UnionSlot` wraps each record batch as that member
(zero-copy: the struct's children are the batch's columns) and frames it in the group's
schema.

Viewports are Barrage's: the client tracks every row key (added, removed and shifted row
sets are always sent whole) but holds values only for the rows at the viewport's positions.
A delta carries the values of rows newly held and of modified rows already held.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.columns import read_columns
from engine.differential.translator import update_to_triples
from engine.differential.zset import ZSet
from engine.rowset import RowSet
from engine.table import Table
from engine.update import TableUpdate
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import batch_frames, frame
from flight.wire import DIFF, TIME

__all__ = ["GROUP_COLUMN", "MAX_GROUP_TABLES", "DeltaCodec", "Encoded", "UnionSlot",
           "end_of_stream", "group_schema", "record_batches", "triples_schema"]

Format: TypeAlias = "pb.DeltaFormat.ValueType"
Resume: TypeAlias = "pb.ResumeResult.ValueType"


def triples_schema(schema: pa.Schema) -> pa.Schema:
    """The stream schema of a ``TRIPLES`` subscription: the table's columns + time + diff."""
    return pa.schema([*schema, pa.field(TIME, pa.int64(), nullable=False),
                      pa.field(DIFF, pa.int64(), nullable=False)])


#: The one column of a multi-table stream's schema (:func:`group_schema`).
GROUP_COLUMN = "tables"
#: Tables one multi-table stream carries at most (a dense union has 128 type codes).
MAX_GROUP_TABLES = 128


def group_schema(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """The stream schema of a multi-table subscription: one column ``tables``, a dense union
    whose member ``i`` (named ``"i"``, type code ``i``) is a struct of ``schemas[i]``."""
    members = [pa.field(str(i), pa.struct(list(s))) for i, s in enumerate(schemas)]
    return pa.schema([pa.field(GROUP_COLUMN, pa.dense_union(members, list(range(len(members)))))])


class UnionSlot:
    """Member ``code`` of a multi-table stream's union (see :func:`group_schema`).

    Parameters
    ----------
    schema
        The group's stream schema.
    code
        The table's index in the group (its union type code).
    """

    __slots__ = ("_children", "_names", "code", "schema")

    def __init__(self, schema: pa.Schema, code: int) -> None:
        self.schema = schema
        self.code = code
        union = schema.field(GROUP_COLUMN).type
        self._names = [union.field(i).name for i in range(union.num_fields)]
        self._children = [pa.array([], type=union.field(i).type) for i in range(union.num_fields)]

    def wrap(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (the table's schema) as a batch of the group's schema: every row in
        this member, at offsets ``0..n-1`` of its child."""
        n = batch.num_rows
        children = list(self._children)
        children[self.code] = pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))
        union = pa.UnionArray.from_dense(
            pa.array(np.full(n, self.code, np.int8)), pa.array(np.arange(n, dtype=np.int32)),
            children, self._names, list(range(len(children))))
        return pa.RecordBatch.from_arrays([union], schema=self.schema)


def record_batches(table: pa.Table, rows: int) -> list[pa.RecordBatch]:
    """``table`` as batches of at most ``rows`` rows, as few as that allows (a delta's
    table, one chunk per column, is sliced without combining its chunks first)."""
    n = table.num_rows
    if n == 0:
        return []
    batches = table.to_batches(max_chunksize=rows)
    if len(batches) > -(-n // rows):  # chunks that do not line up: combined first
        batches = table.combine_chunks().to_batches(max_chunksize=rows)
    return batches


def end_of_stream(error: str, *, sequence: int, step: int, format: Format) -> tuple[bytes, ...]:
    """The last message of a stream the server ends: ``end_of_stream`` and the reason."""
    meta = pb.UpdateMetadata(end_of_stream=True, error=error, sequence=sequence, step=step,
                             format=format)
    return (frame(app_metadata=meta.SerializeToString()),)


@dataclass(frozen=True, slots=True)
class Encoded:
    """One subscription message, framed once (immutable: several streams send it).

    Attributes
    ----------
    frames
        Its ``FlightData`` messages: record batches, the first carrying the metadata; or
        the metadata alone.
    sequence, step
        The publisher's sequence number and the graph step the message brings the client to.
    held
        The keys whose values the client holds after it (a viewport's rows); ``None``: every
        row.
    """

    frames: tuple[bytes, ...]
    sequence: int
    step: int
    held: RowSet | None = None

    def nbytes(self) -> int:
        """The bytes of its frames."""
        return sum(len(f) for f in self.frames)


class DeltaCodec:
    """Builds the messages of one stream (see the module docstring).

    Parameters
    ----------
    table
        The subscribed table (read: its row set and column sources).
    epoch
        The publisher's epoch, sent in every message.
    format
        ``DELTA_FORMAT_UPDATES`` or ``DELTA_FORMAT_TRIPLES``.
    columns
        The carried columns, in table order (the others travel as nulls).
    viewport
        ``UPDATES`` only: position ranges ``[begin, end)`` whose values the client holds;
        ``None``: every row.
    batch_rows
        Rows per record batch at most.
    slot
        In a multi-table stream: the table's member of the group's union; every message
        then carries :attr:`group_table` and its batches are in the group's schema.
    """

    __slots__ = ("_carried", "_no_rows", "batch_rows", "columns", "epoch", "format", "schema", "slot",
                 "status", "table", "viewport")

    def __init__(self, table: Table, *, epoch: str, format: Format, columns: Sequence[str],
                 viewport: Sequence[tuple[int, int]] | None, batch_rows: int,
                 status: Callable[[], pb.LinkStatus | None] | None = None,
                 slot: UnionSlot | None = None) -> None:
        self.table = table
        self.slot = slot
        #: a mirrored table's link status, carried in every message (flight.links)
        self.status = status
        self.epoch = epoch
        self.format = format
        self.columns = tuple(columns)
        self.viewport = None if viewport is None else tuple(viewport)
        self.batch_rows = batch_rows
        triples = format == pb.DELTA_FORMAT_TRIPLES
        #: the stream schema (sent once, by the stream's first message)
        self.schema = triples_schema(table.schema) if triples else table.schema
        self._carried = frozenset(self.columns)
        # no rows in the table's schema (a triples message's rows gain time and diff later)
        self._no_rows = table.schema.empty_table()

    # -------------------------------------------------------------------- messages
    def snapshot(self, *, sequence: int, step: int, resume: Resume = pb.RESUME_NONE) -> Encoded:
        """Every row: the state at ``sequence`` (the current one)."""
        rowset = self.table.rowset
        meta = self._meta(sequence=sequence, step=step, is_snapshot=True, resume=resume)
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            rows = self._rows(rowset.keys())
            data = _with_time_diff(rows, step, np.ones(rows.num_rows, np.int64))
            return self._encode(meta, data, self.schema.empty_table())
        meta.added_rows = rowset.serialize()
        held = self.viewport_keys(rowset)
        meta.added_data_rows = held.serialize()
        return self._encode(meta, self._rows(held.keys()), self._no_rows,
                            held=None if self.viewport is None else held)

    def snapshot_key(self) -> Hashable | None:
        """What this codec's snapshot depends on besides the table's state: codecs with equal
        keys build the same snapshot of one state, so streams opening together can share one
        (:meth:`~flight.streams.registry.Publisher.snapshot`).

        ``None`` when the snapshot also carries what a key cannot pin down: a mirror's link
        status (read when the message is built) or a group's union (its schema is the group's).
        """
        if self.status is not None or self.slot is not None:
            return None
        return (self.epoch, self.format, self.columns, self.viewport, self.batch_rows)

    def delta(self, update: TableUpdate, *, held: RowSet | None, sequence: int, step: int,
              count: int, resume: Resume = pb.RESUME_NONE) -> Encoded:
        """The ``UPDATES`` message for ``update``, which ends at the current state.

        Parameters
        ----------
        update
            The updates since the client's last message, composed.
        held
            Keys (before ``update``) whose values the client holds; ``None``: every row.
        sequence, step
            The state reached (the publisher's sequence, the graph's step).
        count
            Table updates composed into ``update`` (0: none, a change of viewport only).
        resume
            ``RESUME_DELTAS`` when this delta answers a resume.
        """
        meta = self._meta(sequence=sequence, step=step, coalesced=count, resume=resume)
        meta.added_rows = update.added.serialize()
        meta.removed_rows = update.removed.serialize()
        sh = update.shifted
        if len(sh.begins):
            meta.shifts.begins.extend(sh.begins.tolist())
            meta.shifts.ends.extend(sh.ends.tolist())
            meta.shifts.deltas.extend(sh.deltas.tolist())
        cols = [c for c in self.columns if c in update.modified_columns]
        if cols and update.modified:
            rows = update.modified.serialize()
            meta.modified.extend(pb.ColumnModified(column=c, rows=rows) for c in cols)
        held_after: RowSet | None = None
        if self.viewport is None and held is None:  # the client holds every row
            added_data = update.added
            modified_data = update.modified if cols else RowSet()
        else:
            # current key space: what the client held, moved by the update
            kept = (self.table.rowset - update.added if held is None
                    else update.shifted.apply(held - update.removed))
            now = self.viewport_keys(self.table.rowset)
            added_data = now - kept
            modified_data = (update.modified & now & kept) if cols else RowSet()
            held_after = None if self.viewport is None else now
        meta.added_data_rows = added_data.serialize()
        meta.modified_data_rows = modified_data.serialize()
        return self._encode(meta, self._rows(added_data.keys()), self._rows(modified_data.keys()),
                            held=held_after)

    def update_triples(self, update: TableUpdate, step: int) -> ZSet:
        """``update`` as consolidated triples at time ``step`` (old values at -1, new at +1).

        Call it inside the cycle that made ``update``: previous values exist only then.
        """
        return update_to_triples(self.table, update, time=step, columns=self.columns)

    def triples(self, batch: ZSet | None, *, sequence: int, step: int, count: int) -> Encoded:
        """The ``TRIPLES`` message of ``batch`` (triples of :meth:`update_triples`, possibly
        several cycles' consolidated together; ``None``: no rows)."""
        meta = self._meta(sequence=sequence, step=step, coalesced=count)
        data = self.schema.empty_table() if batch is None else self._triples_table(batch)
        return self._encode(meta, data, self.schema.empty_table())

    def viewport_keys(self, rowset: RowSet) -> RowSet:
        """The keys of ``rowset`` at the viewport's positions (all without a viewport)."""
        if self.viewport is None:
            return rowset
        out = RowSet()
        for b, e in self.viewport:  # one slice per viewport range
            out = out | rowset.slice(b, e)
        return out

    # ------------------------------------------------------------------- building
    def _meta(self, *, sequence: int, step: int, is_snapshot: bool = False, coalesced: int = 0,
              resume: Resume = pb.RESUME_NONE) -> pb.UpdateMetadata:
        meta = pb.UpdateMetadata(epoch=self.epoch, step=step, table_size=len(self.table.rowset),
                                 format=self.format, columns=self.columns, sequence=sequence,
                                 is_snapshot=is_snapshot, coalesced=coalesced, resume=resume)
        if self.viewport is not None:
            meta.has_viewport = True
            meta.viewport.extend(pb.PositionRange(begin=b, end=e) for b, e in self.viewport)
        if self.slot is not None:
            meta.group_table = self.slot.code
        if self.status is not None:
            link = self.status()
            if link is not None:
                meta.link.CopyFrom(link)
        return meta

    def _rows(self, keys: npt.NDArray[np.int64]) -> pa.Table:
        """Current values at ``keys`` in the table's schema (columns not carried null)."""
        n = keys.size
        if n == 0:
            return self._no_rows
        carried = self._carried
        fields = self.table.schema
        read = iter(read_columns([self.table.column(f.name) for f in fields if f.name in carried], keys))
        return pa.Table.from_arrays(
            [next(read) if f.name in carried else pa.nulls(n, f.type) for f in fields],
            schema=self._no_rows.schema)

    def _triples_table(self, batch: ZSet) -> pa.Table:
        """``batch`` in the stream schema: the table's columns (those not carried null), then
        ``__time`` and ``__diff``."""
        times = batch.times
        if times is None or times.shape[1] != 1:
            raise ValueError("a triples message needs one time per row (the cycle's step)")
        data, carried = batch.data, self._carried
        # the columns made here have the data's chunks (record_batches then slices every
        # column alike, without combining chunks)
        sizes = [len(c) for c in data.column(0).chunks]
        ends = np.cumsum(sizes, dtype=np.int64)

        def cut(a: npt.NDArray[np.int64]) -> pa.ChunkedArray:
            return pa.chunked_array(np.split(a, ends[:-1]), type=pa.int64())

        arrays = [data.column(f.name) if f.name in carried
                  else pa.chunked_array([pa.nulls(n, f.type) for n in sizes], type=f.type)
                  for f in self.table.schema]
        arrays += [cut(times[:, 0]), cut(batch.diffs)]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _encode(self, meta: pb.UpdateMetadata, added: pa.Table, modified: pa.Table,
                held: RowSet | None = None) -> Encoded:
        """The added and modified rows as record batches, the first carrying ``meta``."""
        a = record_batches(added, self.batch_rows)
        m = record_batches(modified, self.batch_rows)
        meta.num_added_batches = len(a)
        meta.num_modified_batches = len(m)
        schema = added.schema if a else modified.schema
        if self.slot is not None and (a or m):
            a = [self.slot.wrap(b) for b in a]
            m = [self.slot.wrap(b) for b in m]
            schema = self.slot.schema
        data = meta.SerializeToString()
        frames = (tuple(batch_frames(schema, (*a, *m), first_metadata=data)) if a or m
                  else (frame(app_metadata=data),))
        return Encoded(frames, sequence=int(meta.sequence), step=int(meta.step), held=held)


def _with_time_diff(rows: pa.Table, step: int, diffs: npt.NDArray[np.int64]) -> pa.Table:
    n = rows.num_rows
    return (rows.append_column(pa.field(TIME, pa.int64(), nullable=False),
                               pa.array(np.full(n, step, np.int64)))
            .append_column(pa.field(DIFF, pa.int64(), nullable=False), pa.array(diffs)))
