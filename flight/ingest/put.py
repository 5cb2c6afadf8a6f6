"""DoPut transport: one Flight stream of record batches into a source table (DESIGN.md §5).

A write flows once through :class:`PutHandler`: **decode** (the ``PutRequest`` in the
first message's ``app_metadata``; each record batch, within the size limits), **check**
(the mode fits the table, values within the size limit, the reserved columns parse; the
rows are checked once, by the table: :meth:`~engine.sources.SourceTable.check_batch`),
**stage or hold** (:class:`~flight.ingest.staging.StagingArea`: into the table's
next cycle, or into a stage slot until commit), **acknowledge** (one ``PutAck`` per batch,
after it was staged or held). A bad batch raises and nothing of it is staged; the batches
before it stay. The handler never runs a cycle.

Modes (the last column names are reserved):

* ``APPEND`` — append and ring tables: rows are appended.
* ``UPSERT`` — keyed tables: insert-or-update by key; a bool column ``__delete`` (null means
  false) marks rows whose key is deleted instead. Inside one batch the last row per key
  decides, whether upsert or delete.
* ``DELETE`` — keyed tables: batches carry exactly the key columns.
* ``DIFF`` — keyed tables: differential triples, the table's columns plus an int64 weight
  ``__diff`` (an optional ``__time`` column is accepted and ignored). A batch is one
  transaction: its weights are summed per row, and per key the net effect must be a valid
  change of the key's current row, writes staged before it included — a ``-1`` of the
  current row and a ``+1`` of a new row (an update), a lone ``-1`` of the current row (a
  delete), a lone ``+1`` for an absent key (an insert). Anything else (retracting a row the
  key does not hold, two rows for one key, a net weight other than ``+1``/``-1``) raises
  :class:`~engine.errors.InputError` naming table and key and applies nothing of the batch
  (:func:`engine.differential.resolve.resolve_triples` states the rules).

No request metadata means ``UPSERT`` for a keyed table and ``APPEND`` otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.flight as flight

from engine._kernels.arrays import aligned_table
from engine.errors import InputError, LimitExceeded, ProtocolError, SchemaError
from engine.sources import AppendOnlyTable, CheckedBatch, KeyedTable, RingTable, SourceTable
from flight.ingest.backlog import Backlog
from flight.ingest.parts import Part
from flight.ingest.value_sizes import check_values
from flight.limits import limit_text
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import Chunk, IpcMessage
from flight.rpc.requests import check_metadata_size, parse, table_name
from flight.streams.registry import TableEntry, TableRegistry
from flight.wire import DELETE, DIFF, TIME, PutMode, TableKind

__all__ = ["PutHandler", "Stager", "check_batch", "check_mode"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]

class Stager(Protocol):
    """Where :class:`PutHandler` sends checked batches."""

    @property
    def synchronous(self) -> bool:
        """Whether :meth:`submit` is done when it returns (nothing to pipeline)."""
        ...

    def apply(self, entry: TableEntry, parts: list[Part]) -> None: ...

    def open_chain(self) -> object:
        """A token for one stream's batches, given to each of its :meth:`submit` calls: they
        become durable as a prefix (a batch after one that failed is never staged)."""
        ...

    def submit(self, entry: TableEntry, parts: list[Part], chain: object) -> Future[None]: ...

    def hold(self, write_id: str, slot: tuple[int, int], parts: list[Part], rows: int) -> None: ...


class PutHandler:
    """Serves DoPut: decodes each stream, checks its batches, stages them, acknowledges.

    Thread-safe: each DoPut stream runs on its own thread.

    Parameters
    ----------
    registry
        The server's tables.
    staging
        Where checked batches go (straight into tables, or into stage slots): the
        :class:`~flight.ingest.staging.StagingArea`, or :class:`~flight.durability.durable.Durability`,
        which journals them first.
    max_metadata_bytes
        Largest ``app_metadata`` accepted with the first message.
    max_batch_bytes
        Largest record batch accepted.
    max_value_bytes
        Longest string or binary value a batch may hold (``None``: no limit).
    max_in_flight_bytes
        How many bytes of one stream's batches may be on their way to stable storage
        before the stream waits for the oldest to be acknowledged (appends, upserts and
        deletes without a ``write_id`` are pipelined this way: the next batch is read and
        checked while the journal writes the last; acks stay in batch order).
    max_in_flight_seconds
        And for how long: while the oldest batch on its way has been so for longer, the
        stream reads no more (a journal behind, or a cycle holding its gate, would otherwise
        let ``max_in_flight_bytes`` of small batches queue, each acknowledged seconds late).
    backlog
        Admits each batch without a ``write_id`` before it is staged or journaled, while
        its table's writes waiting for a cycle stay bounded (:mod:`flight.ingest.backlog`);
        ``None``: no bound.
    """

    def __init__(self, registry: TableRegistry, staging: Stager, *,
                 max_metadata_bytes: int = 1 << 20, max_batch_bytes: int = 256 << 20,
                 max_in_flight_bytes: int = 64 << 20, max_in_flight_seconds: float = 0.1,
                 max_value_bytes: int | None = None, backlog: Backlog | None = None) -> None:
        self.registry = registry
        self.staging = staging
        self.backlog = backlog
        self.max_metadata_bytes = max_metadata_bytes
        self.max_batch_bytes = max_batch_bytes
        self.max_value_bytes = max_value_bytes
        self.max_in_flight_bytes = max_in_flight_bytes
        self.max_in_flight_seconds = max_in_flight_seconds

    def serve_acks(self, descriptor: flight.FlightDescriptor | None, reader: Any,
                   schema_metadata: pa.Buffer | None = None) -> Iterator[pb.PutAck]:
        """One DoPut call: the acks for the client's messages, as each batch is accepted.

        ``reader.read_chunk()`` gives the stream's messages (``.data``, ``.app_metadata``);
        the ``PutRequest`` is the first batch's ``app_metadata``, or ``schema_metadata``
        (sent with the schema message) when the first batch has none.

        Raises
        ------
        ProtocolError
            If the descriptor is not a table path, or the metadata or a batch is malformed
            or too large, or a request is sent twice.
        TicktableError
            Whatever :meth:`put` raises.
        """
        if descriptor is None:
            raise ProtocolError("DoPut: the first message carries no flight_descriptor; use "
                                "FlightDescriptor.for_path(table_name)")
        name = table_name(descriptor)
        entry = self.registry.get(name)
        try:
            first = reader.read_chunk()
        except StopIteration:  # the client closed without sending anything: nothing to do
            return
        meta = first.app_metadata
        if schema_metadata is not None and schema_metadata.size:
            if meta is not None and meta.size:
                raise ProtocolError(f"DoPut into {name!r}: a PutRequest came with both the "
                                    f"schema and the first batch; send it once")
            meta = schema_metadata
        check_metadata_size(meta, self.max_metadata_bytes, f"DoPut into {name!r}")
        if meta is None or meta.size == 0:
            mode = pb.PUT_MODE_UPSERT if entry.kind == TableKind.KEYED else pb.PUT_MODE_APPEND
            request = pb.PutRequest(mode=mode)
        else:
            request = parse(pb.PutRequest(), meta.to_pybytes(), "DoPut")
        yield from self.acks(name, request, self._batches(name, reader, first))

    def _batches(self, name: str, reader: Any, first: Any) -> Iterator[pa.RecordBatch | Chunk]:
        limit = self.max_batch_bytes
        chunk = first
        while True:
            if chunk.data is not None:
                # the decoded body's buffers (sized by the IPC header): what it holds, in
                # 0.3 us where Arrow's nbytes took 55 us for a 65,536-row batch
                size = chunk.data.get_total_buffer_size()
                if size > limit:
                    raise LimitExceeded(f"DoPut into {name!r}: record batch of {size} "
                                        f"bytes exceeds {limit_text('max_put_batch_bytes', limit)}"
                                        f"; send smaller batches")
                yield chunk if isinstance(chunk, Chunk) and chunk.message is not None \
                    else chunk.data
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return

    def put(self, table_name: str, request: pb.PutRequest,
            batches: Iterable[pa.RecordBatch | Chunk],
            ack: Callable[[pb.PutAck], None]) -> int:
        """:meth:`acks`, each passed to ``ack``; returns the number of rows received."""
        total = 0
        for a in self.acks(table_name, request, batches):
            ack(a)
            total = a.total_rows
        return total

    def acks(self, table_name: str, request: pb.PutRequest,
             batches: Iterable[pa.RecordBatch | Chunk]) -> Iterator[pb.PutAck]:
        """Check, stage and acknowledge a decoded stream: one ack per batch, in order.

        Each batch is checked, then staged into the table (no ``write_id``: visible after
        the next cycle) or held in the stage slot ``(write_id, partition, attempt)``, then
        acknowledged with ``ack`` (``batch_index`` from 0, its ``rows``, ``total_rows`` so far,
        ``staged``), in batch order. A DIFF batch sees the writes staged before it, this
        stream's included. Appends, upserts and deletes without a ``write_id`` are pipelined
        (up to ``max_in_flight_bytes`` on their way to the journal) when there is a journal;
        without one, a batch is staged before the next is read, on this thread. A stream
        that fails stops there: no batch after the failed one is staged.

        Parameters
        ----------
        table_name
            A source table of the registry.
        request
            The stream's first ``app_metadata``: mode and optional stage slot.
        batches
            The stream's record batches, or decoded :class:`~flight.rpc.framing.Chunk` s
            (a batch with the IPC message it came from, which a journal may write as it is).

        Yields
        ------
        PutAck
            One per batch, after it was staged or held.

        Raises
        ------
        TableNotFound
            If there is no such table.
        InputError
            If the mode does not fit the table (e.g. APPEND into a keyed table), or a DIFF
            batch is not a valid change of the table; :class:`SchemaError` for columns that
            are missing, unknown or mistyped; :class:`InvalidKeyError` for null keys.
        Overloaded
            If holding a staged batch would pass the staging area's byte limit;
            :class:`~engine.errors.BacklogFull` if the table's writes waiting for a cycle
            stay past the backlog's limit (the batches before are acknowledged).
        TableFailed
            If the table failed in an earlier cycle.
        """
        entry = self.registry.get(table_name)
        kind = check_mode(entry, request.mode)
        staged = bool(request.write_id)
        if not staged and kind != PutMode.DIFF and not self.staging.synchronous:
            yield from self._pipelined(entry, kind, batches)
            return
        slot = (int(request.partition), int(request.attempt))
        total = 0
        for index, item in enumerate(batches):
            batch, message = _received(item)
            parts = check_batch(entry, kind, batch, max_value_bytes=self.max_value_bytes,
                                message=None if self.staging.synchronous else message)
            if staged:
                self.staging.hold(request.write_id, slot, parts, batch.num_rows)
            else:
                self._admit(entry, parts)
                self.staging.apply(entry, parts)
            total += batch.num_rows
            yield pb.PutAck(batch_index=index, rows=batch.num_rows, total_rows=total,
                            staged=staged)

    def _pipelined(self, entry: TableEntry, kind: PutMode,
                   batches: Iterable[pa.RecordBatch | Chunk]) -> Iterator[pb.PutAck]:
        """Check and submit each batch without waiting; acknowledge in order as each lands.

        A reader thread takes the client's batches while this generator waits for whichever
        comes first, the next batch or the oldest batch becoming durable, so an ack goes out
        as soon as its batch landed (a client waiting for each ack before it sends the next
        batch is answered), and a client streaming ahead keeps up to
        ``max_in_flight_bytes`` on their way to the journal.

        The refusals possible after a batch was submitted (a failed table, a journal that
        cannot write) are permanent for the table or break the chain, so a batch after a
        failed one is never staged: the stream's staged batches are always a prefix.
        """
        chain = self.staging.open_chain()
        # (future, rows, bytes, when submitted)
        flight_: deque[tuple[Future[None], int, int, float]] = deque()
        in_flight = acked = total = 0
        cond = threading.Condition()
        incoming: deque[pa.RecordBatch | Chunk] = deque()
        ended: list[BaseException | None] = []  # [error or None] once the client's stream ended
        stop = threading.Event()

        def read() -> None:
            error: BaseException | None = None
            try:
                for b in batches:
                    with cond:
                        while len(incoming) >= 2 and not stop.is_set():  # read ahead a little
                            cond.wait(0.1)
                        if stop.is_set():
                            return
                        incoming.append(b)
                        cond.notify_all()
            except BaseException as exc:  # noqa: BLE001 - handed to the generator, raised there
                error = exc
            finally:
                with cond:
                    ended.append(error)
                    cond.notify_all()

        def landed(_: Future[None]) -> None:
            with cond:
                cond.notify_all()

        def ack_head() -> pb.PutAck:
            nonlocal in_flight, acked, total
            future, rows, nbytes, _ = flight_.popleft()
            future.result()  # raises the batch's refusal: the stream stops here
            in_flight -= nbytes
            total += rows
            acked += 1
            return pb.PutAck(batch_index=acked - 1, rows=rows, total_rows=total, staged=False)

        def room() -> bool:  # for one more batch on its way (only a landing makes more)
            return in_flight <= self.max_in_flight_bytes and (
                not flight_ or time.monotonic() - flight_[0][3] <= self.max_in_flight_seconds)

        reader = threading.Thread(target=read, daemon=True, name=f"ticktable-put-{entry.name}")
        reader.start()
        try:
            while True:
                with cond:
                    while not (flight_ and flight_[0][0].done()) and not ended and (
                            not incoming or not room()):
                        cond.wait()
                    item = incoming.popleft() if incoming and room() else None
                    finished = not incoming and bool(ended)
                    cond.notify_all()
                while flight_ and flight_[0][0].done():
                    yield ack_head()
                if item is not None:
                    batch, message = _received(item)
                    try:
                        parts = check_batch(entry, kind, batch,
                                            max_value_bytes=self.max_value_bytes, message=message)
                        nbytes = self._admit(entry, parts, lambda: sum(
                            n for f, _, n, _ in list(flight_) if not f.done()))
                    except Exception:
                        while flight_:  # the batches before the bad one stay: acknowledge them
                            yield ack_head()
                        raise
                    future = self.staging.submit(entry, parts, chain)
                    flight_.append((future, batch.num_rows, nbytes, time.monotonic()))
                    in_flight += nbytes
                    future.add_done_callback(landed)
                elif finished:
                    while flight_:
                        yield ack_head()
                    if ended[0] is not None:
                        raise ended[0]
                    return
        finally:
            stop.set()
            with cond:
                cond.notify_all()
            for future, _, _, _ in flight_:  # after a failure: let the rest settle before answering
                future.exception()

    def _admit(self, entry: TableEntry, parts: list[Part],
               ahead: Callable[[], int] | None = None) -> int:
        """Wait for room for ``parts`` in ``entry``'s backlog (``ahead``: the stream's bytes
        on their way to it); returns their bytes."""
        nbytes = sum(p.nbytes for p in parts)
        table = entry.table
        if self.backlog is not None and isinstance(table, SourceTable):
            self.backlog.admit(entry.name, table, nbytes, ahead)
        return nbytes


def _received(item: pa.RecordBatch | Chunk) -> tuple[pa.RecordBatch, IpcMessage | None]:
    """A batch and the IPC message it came from, if known."""
    if isinstance(item, Chunk):
        assert item.data is not None, "only a chunk holding a batch is passed on"
        return item.data, item.message
    return item, None


# checking batches ---------------------------------------------------------------------------
def check_mode(entry: TableEntry, mode: int) -> PutMode:
    """The write kind for ``mode`` on ``entry``, or an InputError saying which mode fits."""
    name = PutMode.from_proto(mode)
    if name is None:
        raise InputError(f"unknown put mode {mode} for table {entry.name!r}")
    table = entry.table
    if isinstance(table, KeyedTable):
        if name == PutMode.APPEND:
            raise InputError(
                f"table {entry.name!r} is keyed by {table.keys}: write it with PUT_MODE_UPSERT "
                f"(or DELETE / DIFF), not APPEND")
        return name
    if isinstance(table, AppendOnlyTable | RingTable):
        if name != PutMode.APPEND:
            raise InputError(
                f"table {entry.name!r} is an {entry.kind} table without keys: write it with "
                f"PUT_MODE_APPEND ({name} needs a keyed table)")
        return name
    raise InputError(f"table {entry.name!r} is a {entry.kind} table, not a source table; only "
                     f"source tables (append, keyed, ring) take writes")


def check_batch(entry: TableEntry, kind: PutMode, batch: pa.RecordBatch | pa.Table, *,
                max_value_bytes: int | None = None,
                message: IpcMessage | None = None) -> list[Part]:
    """Check one batch and turn it into parts to stage together (nothing is staged here).

    This takes what the mode adds to the rows (the ``__delete`` marker, the ``__diff``
    weight, a ``__time`` column) and checks value sizes; the rows are checked once, by the
    table (:meth:`~engine.sources.SourceTable.check_batch`), and staged as checked.
    ``message`` is the IPC message ``batch`` was decoded from: a part whose rows are the
    batch's own columns, unchanged, keeps it (:attr:`Part.message`).

    Raises
    ------
    LimitExceeded
        If a string or binary value is longer than ``max_value_bytes``.
    SchemaError
        Naming the missing, unknown, repeated or mistyped column (reserved columns included).
    InvalidKeyError
        If a key column holds nulls.
    """
    name, table = entry.name, entry.table
    assert isinstance(table, SourceTable), "check_mode lets only source tables through"
    shown = table.name  # messages name the table as its user does (a pending table's too)
    data = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    check_values(shown, data, max_value_bytes)
    if kind in (PutMode.APPEND, PutMode.DELETE):
        rows = table.check_batch(data, kind)
        return [Part(name, rows, message=_as_received(message, rows, data, batch))]
    if kind == PutMode.UPSERT:
        data, marker = _reserved(data, DELETE)
        flags = None if marker is None else _bool_column(shown, marker, DELETE)
        rows = table.check_batch(data, PutMode.UPSERT)
        if flags is None or not flags.any():  # the keyed table itself is last-wins
            return [Part(name, rows, message=_as_received(message, rows, data, batch))]
        return _split_upsert_delete(name, rows, flags)
    # diff
    data, weights = _reserved(data, DIFF)
    if weights is None and DIFF not in data.column_names:
        raise SchemaError(f"table {shown!r}: a PUT_MODE_DIFF batch needs an int64 weight column "
                          f"{DIFF!r} (has: {data.column_names})")
    diffs = None if weights is None else _int_column(shown, weights, DIFF)
    data, _ = _reserved(data, TIME)
    rows = table.check_batch(data, PutMode.UPSERT)  # refuses a repeated __diff too
    assert diffs is not None
    return [Part(name, rows, diffs)]


def _as_received(message: IpcMessage | None, rows: CheckedBatch, checked: pa.Table,
                 batch: pa.RecordBatch | pa.Table) -> IpcMessage | None:
    """``message`` if ``rows`` are ``batch``'s columns as they came (the same types and
    buffers, in order, none added or removed): then the message holds exactly the rows.
    ``checked``: the table that went to the table's check, made of ``batch``'s columns."""
    if message is None or not isinstance(batch, pa.RecordBatch):
        return None
    if rows.data is checked and checked.num_columns == batch.num_columns:
        return message  # the check kept the very table it was given: batch's columns
    data = rows.data
    if data.num_columns != batch.num_columns or data.num_rows != batch.num_rows:
        return None
    for column, sent in zip(data.columns, batch.columns, strict=True):
        if column.num_chunks != 1:
            return None
        kept = column.chunk(0)
        if (kept.type != sent.type or kept.offset != sent.offset
                or kept.null_count != sent.null_count
                or _addresses(kept.buffers()) != _addresses(sent.buffers())):
            return None
    return message


def _addresses(buffers: list[pa.Buffer | None]) -> list[tuple[int, int] | None]:
    return [None if b is None else (b.address, b.size) for b in buffers]


def _reserved(data: pa.Table, column: str) -> tuple[pa.Table, pa.ChunkedArray | None]:
    """``data`` without the reserved ``column``, and that column (``None``: absent).

    A column named more than once stays in ``data``, for the table's check to refuse.
    """
    i = data.schema.get_field_index(column)  # -1: absent, or named more than once
    if i < 0:
        return data, None
    return data.remove_column(i), data.column(i)


def _bool_column(table: str, col: pa.ChunkedArray, column: str) -> npt.NDArray[np.bool_]:
    if not pa.types.is_boolean(col.type):
        raise SchemaError(f"table {table!r}: column {column!r} has type {col.type}, expected bool "
                          f"(true marks a row whose key is deleted)")
    col = col.fill_null(False)
    return np.asarray(col.to_numpy(), dtype=bool)


def _int_column(table: str, col: pa.ChunkedArray, column: str) -> I64:
    if not pa.types.is_integer(col.type):
        raise SchemaError(f"table {table!r}: column {column!r} has type {col.type}, expected int64")
    if col.null_count:
        raise SchemaError(f"table {table!r}: column {column!r} has {col.null_count} null weight(s)")
    if col.type != pa.int64():
        try:
            col = col.cast(pa.int64(), safe=True)
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"table {table!r}: column {column!r} does not fit int64 "
                              f"({str(exc).splitlines()[0]})") from exc
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _split_upsert_delete(name: str, rows: CheckedBatch,
                         deleted: npt.NDArray[np.bool_]) -> list[Part]:
    """An upsert batch with ``__delete`` rows: the last row per key decides.

    Keys are grouped by Arrow's hash aggregation, which compares the key values exactly.
    Returns an upsert and a delete part on disjoint keys, so their order does not matter.
    """
    keys = list(rows.keys)
    data = rows.data
    row = "__ticktable_row"
    try:  # Acero's aggregation may assume aligned keys, and a decoded body may not be
        last = (aligned_table(data.select(keys)).append_column(row, pa.array(np.arange(data.num_rows, dtype=np.int64)))
                .group_by(keys, use_threads=False).aggregate([(row, "max")])
                .column(f"{row}_max").to_numpy())
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaError(f"table {name!r}: key column(s) {keys} cannot be grouped for a "
                          f"{DELETE!r} marker ({str(exc).splitlines()[0]}); send deletes with "
                          f"PUT_MODE_DELETE") from exc
    last = np.sort(last)
    is_del = deleted[last]
    ups, dels = last[~is_del], last[is_del]
    out = []
    if ups.size:
        out.append(Part(name, rows.take(ups)))
    if dels.size:
        out.append(Part(name, rows.deletes(dels)))
    return out
