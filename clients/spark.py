"""The PySpark data source ``ticktable``: batch and Structured Streaming writes, snapshot reads.

Writes follow Spark's commit protocol on top of the server's staged writes (DESIGN.md §5-6):

1. On the driver (Spark runs ``DataSource.writer`` in a Python worker beside the driver) the
   table is created when it is missing, from the DataFrame's schema (keyed when ``keys`` are
   given), and a write id is drawn. The writer carrying it is pickled to the executors.
2. Each task streams its partition's Arrow batches in one DoPut to the stage slot
   ``(write_id, partition id, task attempt id)``; nothing of it is visible yet. The task
   returns a :class:`StagedSlot` commit message.
3. The driver's ``commit`` publishes exactly the slots of the successful attempts in one
   server cycle (the whole job appears at once); slots of failed attempts are dropped. On a
   failed job ``abort`` drops the write: nothing shows.

The slot's attempt is Spark's task attempt *id*, unique within the application, not the
attempt *number*: a retried stage (a lost shuffle) starts its attempt numbers at 0 again, and
an old partial slot under the same number would be published with the new one.

Streaming: each micro-batch is one staged write committed with ``(stream_id, batch_id)``; the
server applies a batch id at most once per stream, so a restarted query that replays its last
micro-batch (written to the sink but not to Spark's commit log) does not duplicate it. The
stream id is the option ``stream_id`` or else Spark's query id, which Spark keeps in the
checkpoint: a restart from the same ``checkpointLocation`` continues the same stream, a new
checkpoint starts a new one. The server keeps the last batch id per stream in memory, so a
restarted *server* forgets it. Spark builds a new writer for every micro-batch (and another to
commit it), so the write id is that writer's id plus the batch id, carried to the commit in
the tasks' messages. A query stopped in the middle of a micro-batch may leave that batch's
staged rows on the server, invisible, until its ``stage_ttl`` drops them (Spark's abort does
not always get the tasks' messages, hence the write id).

Options (case-insensitive)
--------------------------
``uri``
    ``grpc://host:port`` (required).
``table``
    The table (or the path given to ``save``/``load``/``start``).
``mode``
    ``append`` or ``upsert`` (keyed tables; a bool ``__delete`` column marks keys to delete).
    Default: ``upsert`` for a keyed table or when ``keys`` are given, else ``append``.
``keys``
    Comma-separated key columns: a missing table is created keyed on them.
``create``
    ``true`` (default): create a missing table; ``false``: a missing table is an error.
``token``
    Bearer token (default: the driver's ``TICKTABLE_TOKEN`` environment variable).
``tls``
    ``true`` for TLS with the system roots, or the path of a PEM root certificate file (read
    on the driver, so executors need not have it); ``tls_verify=false`` skips verification.
``batch_rows``
    Rows per DoPut record batch (default 131072): Spark's smaller Arrow batches are merged.
``stream_id``
    Streaming only: the stream whose batch ids are applied once (default: the query id).

Spark's save modes: ``append`` writes as above; ``overwrite`` (and streaming ``complete``
output) is refused, a live table is never truncated; Spark itself refuses its default
``errorifexists`` for Python data sources, so batch writes need ``.mode("append")``.

Executors must be able to import this module (``pip install ticktable`` on the cluster; in
local mode the driver's environment is used).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as fl
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from clients.wire import CHUNK_BYTES, Endpoint, PutSummary, action, chunks, put_batches
from flight.pb import flight_pb2 as pb
from flight.wire import ABORT, COMMIT, CREATE_TABLE, PutMode, TableKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMAT", "StagedSlot", "TicktableDataSource", "local_session", "push", "register"]

log = logging.getLogger(__name__)

FORMAT = "ticktable"
BATCH_ROWS = 1 << 17
_MODES = (PutMode.APPEND, PutMode.UPSERT)  # the modes a DataFrame is written with
_SPECIAL = PutMode.UPSERT.columns  # upsert's marker column: not a table column
_BATCH_ID = "streaming.sql.batchId"  # local properties Spark sets on a micro-batch's tasks
_QUERY_ID = "sql.streaming.queryId"
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()  # sessions that know the format


# ------------------------------------------------------------------------------- options
@dataclass(frozen=True, slots=True)
class _Target:
    """Where and how a write goes; picklable, resolved on the driver."""

    endpoint: Endpoint
    table: str
    mode: PutMode
    batch_rows: int
    stream_id: str | None = None


def _option(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    return None if value is None or value == "" else str(value)


def _text(options: Mapping[str, str], name: str, default: str) -> str:
    value = _option(options, name)
    return default if value is None else value


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _option(options, name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"ticktable option {name!r} must be true or false, not {value!r}")


def _endpoint(options: Mapping[str, str]) -> Endpoint:
    uri = _option(options, "uri")
    if uri is None:
        raise ValueError("ticktable: option 'uri' is required, e.g. "
                         ".option('uri', 'grpc://127.0.0.1:8815')")
    tls_opt = _text(options, "tls", "false")
    tls: bool | bytes
    if tls_opt.lower() in ("true", "false", "1", "0", "yes", "no"):
        tls = _flag(options, "tls", False)
    else:
        tls = Path(tls_opt).read_bytes()  # read here: executors may not have the file
    token = _option(options, "token") or os.environ.get("TICKTABLE_TOKEN") or None
    return Endpoint(uri, token=token, tls=tls, verify=_flag(options, "tls_verify", True))


def _table_name(options: Mapping[str, str]) -> str:
    name = _option(options, "table") or _option(options, "path")
    if name is None:
        raise ValueError("ticktable: name the table with .option('table', name) or "
                         ".save(name) / .load(name)")
    return name


def _keys(options: Mapping[str, str]) -> list[str]:
    return [k.strip() for k in _text(options, "keys", "").split(",") if k.strip()]


def _batch_rows(options: Mapping[str, str]) -> int:
    rows = int(_text(options, "batch_rows", str(BATCH_ROWS)))
    if rows <= 0:
        raise ValueError(f"ticktable option 'batch_rows' must be positive, not {rows}")
    return rows


def _table_kind(endpoint: Endpoint, table: str) -> str | None:
    """The kind of ``table`` (``append``, ``keyed``, ``ring``, ...) or ``None`` if missing."""
    client, _ = endpoint.connect()
    try:
        info = client.get_flight_info(fl.FlightDescriptor.for_path(table), endpoint.options())
    except KeyError:  # NOT_FOUND
        return None
    finally:
        client.close()
    meta = info.app_metadata
    return meta.decode() if meta else TableKind.APPEND


def _prepare(options: Mapping[str, str], schema: StructType) -> _Target:
    """Resolve the options on the driver; create the table when missing and allowed."""
    endpoint = _endpoint(options)
    table = _table_name(options)
    keys = _keys(options)
    mode = _option(options, "mode")
    if mode is not None and mode not in _MODES:
        raise ValueError(f"ticktable option 'mode' must be one of "
                         f"{sorted(m.value for m in _MODES)}, not {mode!r}")
    kind = _table_kind(endpoint, table)
    if kind is None:
        if not _flag(options, "create", True):
            raise KeyError(f"ticktable: table {table!r} does not exist at {endpoint.location} "
                           f"(option create=false)")
        if mode == PutMode.UPSERT and not keys:
            raise ValueError(f"ticktable: table {table!r} does not exist; creating it for upserts "
                             f"needs option('keys', 'col1,col2')")
        kind = TableKind.KEYED if keys else TableKind.APPEND
        _create_table(endpoint, table, schema, keys)
    fits = PutMode.UPSERT if kind == TableKind.KEYED else PutMode.APPEND
    if mode is None:
        mode = fits
    if mode != fits:
        raise ValueError(f"ticktable: table {table!r} is a {kind} table: write it with mode "
                         f"{fits}, not {mode}")
    return _Target(endpoint, table, PutMode(mode), _batch_rows(options),
                   _option(options, "stream_id"))


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The table schema for a DataFrame's: Spark's Arrow types, every column nullable."""
    arrow = to_arrow_schema(schema, timezone="UTC")
    return pa.schema([f.with_nullable(True) for f in arrow if f.name not in _SPECIAL])


def _create_table(endpoint: Endpoint, table: str, schema: StructType, keys: list[str]) -> None:
    arrow = _arrow_schema(schema)
    req = pb.CreateTableRequest(name=table, schema=arrow.serialize().to_pybytes(),
                                kind=(TableKind.KEYED if keys else TableKind.APPEND).proto,
                                keys=keys, if_not_exists=True)
    client, _ = endpoint.connect()
    try:
        action(client, endpoint.options(), CREATE_TABLE, req)
    finally:
        client.close()
    log.info("created %s table %r at %s", TableKind.KEYED if keys else TableKind.APPEND, table,
             endpoint.location)


# ------------------------------------------------------------------------------ writing
@dataclass(frozen=True, slots=True)
class StagedSlot(WriterCommitMessage):
    """What one task staged: the commit message it returns to the driver.

    ``rows == 0`` means the partition was empty and nothing was sent (there is no slot).
    ``stream_id`` is set by streaming writes.
    """

    write_id: str
    partition: int
    attempt: int
    rows: int
    stream_id: str | None = None


def _merged(batches: Iterator[pa.RecordBatch], rows: int,
            max_bytes: int = CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """``batches`` regrouped into batches of ``rows`` rows (fewer when they pass ~``max_bytes``).

    Spark hands a writer batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows
    (10,000 by default); fewer, larger batches cost the server less per row. The rows left
    over after whole batches wait for the next ones; none of the batches yielded is empty.
    """
    held: list[pa.RecordBatch] = []
    n = size = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        held.append(b)
        n += b.num_rows
        size += b.nbytes
        if n >= rows or size >= max_bytes:
            merged = _concat(held)
            step = max(1, min(rows, max_bytes // max(1, merged.nbytes // merged.num_rows)))
            whole = merged.num_rows - merged.num_rows % step
            for start in range(0, whole, step):  # per batch, not per row
                yield merged.slice(start, step)
            tail = merged.slice(whole)
            held = [tail] if tail.num_rows else []
            n, size = tail.num_rows, tail.nbytes
    if held:
        yield from chunks([_concat(held)], rows, max_bytes)


def _concat(held: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(held) == 1:
        return held[0]
    return pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _write_partition(target: _Target, write_id: str, batches: Iterator[pa.RecordBatch],
                     stream_id: str | None = None) -> StagedSlot:
    """One task: stream the partition into stage slot (write_id, partition, attempt id)."""
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("ticktable: a data source write must run inside a Spark task")
    partition, attempt = ctx.partitionId(), ctx.taskAttemptId()
    stream = _merged(batches, target.batch_rows)
    first = next(stream, None)
    if first is None:
        return StagedSlot(write_id, partition, attempt, 0, stream_id)

    def all_batches() -> Iterator[pa.RecordBatch]:
        yield first
        yield from stream

    request = pb.PutRequest(mode=target.mode.proto, write_id=write_id, partition=partition,
                            attempt=attempt)
    client, options = target.endpoint.connect()
    try:
        summary = put_batches(client, options, target.table, first.schema, all_batches(), request)
    finally:
        client.close()
    return StagedSlot(write_id, partition, attempt, summary.rows, stream_id)


def _slots(write_id: str, messages: Sequence[WriterCommitMessage | None]) -> tuple[list[pb.StageSlot], int]:
    """The stage slots to publish (non-empty partitions) and their row count."""
    slots, rows = [], 0
    for m in messages:
        if m is None:
            raise RuntimeError("ticktable: commit was called with a failed task's message")
        if not isinstance(m, StagedSlot) or m.write_id != write_id:
            raise RuntimeError(f"ticktable: commit message {m!r} is not of write {write_id!r}")
        if m.rows:
            slots.append(pb.StageSlot(partition=m.partition, attempt=m.attempt))
            rows += m.rows
    return slots, rows


def _commit(target: _Target, request: pb.CommitRequest, rows: int) -> pb.CommitResult:
    client, _ = target.endpoint.connect()
    try:
        result: pb.CommitResult = action(client, target.endpoint.options(timeout=None), COMMIT,
                                         request)
    finally:
        client.close()
    if result.applied and result.rows != rows:
        raise RuntimeError(f"ticktable: write {request.write_id!r} into {target.table!r} staged "
                           f"{rows} rows but the server published {result.rows}")
    return result


def _abort(target: _Target, write_id: str) -> None:
    client, _ = target.endpoint.connect()
    try:
        action(client, target.endpoint.options(), ABORT, pb.AbortRequest(write_id=write_id))
    except KeyError:  # NOT_FOUND: nothing was staged under it
        pass
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        log.warning("ticktable: could not abort write %r (%s); the server drops it when it "
                    "expires", write_id, exc)
    finally:
        client.close()


class _BatchWriter(DataSourceArrowWriter):
    """A batch job: one staged write, one DoPut per task, one commit on the driver."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.write_id = f"spark-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedSlot:
        return _write_partition(self.target, self.write_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        slots, rows = _slots(self.write_id, messages)
        result = _commit(self.target, pb.CommitRequest(write_id=self.write_id, slots=slots), rows)
        log.info("ticktable: write %r published %d rows into %r (%d slots, step %d)",
                 self.write_id, result.rows, self.target.table, len(slots), result.step)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.target, self.write_id)


class _StreamWriter(DataSourceStreamArrowWriter):
    """A streaming query: each micro-batch is a staged write committed with its batch id.

    Spark builds a writer per micro-batch and another one to commit it, so everything the
    commit needs travels in the tasks' messages: the write id (this writer's, plus the
    batch id Spark sets on the tasks) and the stream id.
    """

    def __init__(self, target: _Target) -> None:
        self.target = target
        self.writer_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedSlot:
        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(_BATCH_ID) if ctx is not None else None
        query = ctx.getLocalProperty(_QUERY_ID) if ctx is not None else None
        stream_id = self.target.stream_id or (f"spark-{query}" if query else None)
        if stream_id is None:
            raise RuntimeError("ticktable: this streaming task has no query id; set "
                               ".option('stream_id', ...) to name the stream")
        write_id = f"spark-{self.writer_id}-{batch}"
        return _write_partition(self.target, write_id, iterator, stream_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, StagedSlot)]
        if not done:
            return  # no task ran: nothing was staged
        write_id, stream_id = done[0].write_id, done[0].stream_id
        slots, rows = _slots(write_id, messages)
        request = pb.CommitRequest(write_id=write_id, slots=slots, stream_id=stream_id or "",
                                   batch_id=batchId, has_batch=True)
        result = _commit(self.target, request, rows)
        if result.applied:
            log.info("ticktable: stream %r batch %d published %d rows into %r", stream_id,
                     batchId, result.rows, self.target.table)
        else:
            log.info("ticktable: stream %r batch %d was already applied; the replay was dropped",
                     stream_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for write_id in {m.write_id for m in messages if isinstance(m, StagedSlot)}:
            _abort(self.target, write_id)


# ------------------------------------------------------------------------------ reading
class _SnapshotReader(DataSourceReader):
    """One partition: a consistent snapshot of the table (one DoGet)."""

    def __init__(self, endpoint: Endpoint, table: str, schema: pa.Schema) -> None:
        self.endpoint = endpoint
        self.table = table
        self.schema = schema

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ticket = pb.SnapshotRequest(table=self.table, columns=self.schema.names)
        client, options = self.endpoint.connect()
        try:
            reader = client.do_get(fl.Ticket(ticket.SerializeToString()), options)
            while True:
                try:
                    batch = reader.read_chunk().data
                except StopIteration:
                    return
                if batch.schema.equals(self.schema):
                    yield batch
                else:  # a schema given by the user: its types (the server's are in schema())
                    yield pa.Table.from_batches([batch]).cast(self.schema).to_batches()[0]
        finally:
            client.close()


# --------------------------------------------------------------------------- the source
class TicktableDataSource(DataSource):
    """``format("ticktable")``: see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        endpoint, table = _endpoint(self.options), _table_name(self.options)
        client, _ = endpoint.connect()
        try:
            arrow = client.get_schema(fl.FlightDescriptor.for_path(table), endpoint.options()).schema
        finally:
            client.close()
        return from_arrow_schema(arrow, prefer_timestamp_ntz=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _SnapshotReader(_endpoint(self.options), _table_name(self.options),
                               to_arrow_schema(schema, timezone="UTC"))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise ValueError("ticktable: save mode 'overwrite' is not supported (a live table "
                             "is never truncated); use .mode('append'), with option "
                             "mode=upsert for keyed tables")
        return _BatchWriter(_prepare(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        if overwrite:
            raise ValueError("ticktable: output mode 'complete' is not supported (a live table "
                             "is never truncated); use outputMode('update') with option "
                             "mode=upsert and keys, or outputMode('append')")
        return _StreamWriter(_prepare(self.options, schema))


def register(spark: SparkSession) -> None:
    """Register ``format("ticktable")`` with ``spark`` (idempotent).

    Examples
    --------
    >>> register(spark)                                               # doctest: +SKIP
    >>> (df.write.format("ticktable").mode("append")                  # doctest: +SKIP
    ...    .option("uri", "grpc://127.0.0.1:8815").save("trades"))
    """
    if spark not in _REGISTERED:  # registering again works but makes Spark log a warning
        spark.dataSource.register(TicktableDataSource)
        _REGISTERED.add(spark)


def push(df: DataFrame, uri: str, table: str, *, mode: PutMode | str = PutMode.APPEND,
         keys: Sequence[str] | None = None, token: str | None = None,
         create: bool = True) -> PutSummary:
    """Collect ``df`` on the driver (``df.toArrow()``) and write it in one atomic push.

    For driver-sized frames: everything passes through the driver's memory. Larger data
    goes through ``df.write.format("ticktable")``, which writes from every executor.

    Parameters
    ----------
    mode
        ``"append"`` or ``"upsert"`` (see :meth:`clients.client.Client.push`).
    keys
        Key columns for a table that is created (keyed) here.
    token
        Bearer token (default: ``TICKTABLE_TOKEN``).
    create
        Create a missing table from the frame's schema.

    Returns
    -------
    PutSummary
        Rows the server published.
    """
    from clients.client import connect

    data = df.toArrow()
    with connect(uri, token=token) as client:
        return client.push(table, data, mode=mode, keys=keys, create=create)


def local_session(app: str = "ticktable", master: str = "local[2]",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local SparkSession with ``format("ticktable")`` registered (examples, tests, benches).

    Sets what a plain machine lacks when unset: ``JAVA_HOME`` (from the ``java`` on ``PATH``),
    ``PYSPARK_PYTHON`` (this interpreter, so workers import the same packages) and
    ``SPARK_LOCAL_IP`` (loopback). The UI and console progress bars are off; shuffles use 2
    partitions.

    Parameters
    ----------
    master
        Spark master, e.g. ``local[2,4]`` for 2 threads and up to 4 attempts per task.
    conf
        More Spark settings.
    """
    from pyspark.sql import SparkSession

    if not os.environ.get("JAVA_HOME"):
        java = shutil.which("java")
        if java is not None:
            os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings: dict[str, Any] = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                                "spark.sql.shuffle.partitions": "2", **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register(spark)
    return spark
