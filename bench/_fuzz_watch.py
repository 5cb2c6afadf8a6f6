"""The well-behaved clients of a fuzz run (#18 item 4): they must not notice the fuzz.

* :func:`create_tables` makes the watched and the fuzz tables (:mod:`bench._fuzz_cases`);
  :func:`cleanup` drops what the fuzz created (derived tables, new tables, staged writes)
  and recreates fuzz tables that were dropped, replaced or grew past a bound, so a long
  run keeps the server's cycle small.
* :class:`Writer` upserts, deletes and appends into the watched tables over DoPut and keeps
  a model of every acknowledged write.
* :class:`Subscriber` follows a watched table over DoExchange through the reference decoder
  (:mod:`flight.streams.decoder`).
* :func:`check_exact` waits until the writes are visible and every subscriber caught up,
  then compares: snapshot (DoGet) against the writer's model, each subscriber's view
  against the snapshot.

Everything goes through a real client (``pyarrow.flight`` or raw gRPC), so the same code
checks an in-process server (the tests) and a subprocess (``bench/fuzz.py``).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as fl

from bench._fuzz_cases import CREATED, FUZZ_TABLES, TABLES, WATCHED, WRITE_IDS
from bench._fuzz_judge import Answer, violations
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.streams.decoder import ReferenceView, StreamEnded, read_message
from flight.wire import ABORT, CREATE_TABLE, STATS, TableKind

#: A fuzz table with more rows than this is recreated by :func:`cleanup`.
MAX_FUZZ_ROWS = 300
_KEYS = 200  # the writer's key space in watched_keyed


def _action(client: fl.FlightClient, kind: str, body: bytes) -> list[bytes]:
    return [r.body.to_pybytes() for r in client.do_action(fl.Action(kind, body))]


def create_table(client: fl.FlightClient, name: str) -> None:
    kind, schema, keys, capacity = {**WATCHED, **FUZZ_TABLES}[name]
    req = pb.CreateTableRequest(name=name, schema=schema.serialize().to_pybytes(),
                                kind=TableKind(kind).proto, keys=keys, capacity=capacity)
    _action(client, CREATE_TABLE.name, req.SerializeToString())


def create_tables(client: fl.FlightClient) -> None:
    for name in (*WATCHED, *FUZZ_TABLES):
        create_table(client, name)


def cleanup(client: fl.FlightClient, channel: grpc.Channel) -> list[str]:
    """Undo what fuzz cases created; returns the problems of its own calls' answers
    (a failure of a well-formed call is reported, never raised)."""
    problems: list[str] = []

    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except fl.FlightError as exc:  # e.g. a table another thread dropped meanwhile
            if isinstance(exc, fl.FlightInternalError):
                problems.append(f"cleanup: {exc}")
        except grpc.RpcError as exc:
            problems.extend(f"cleanup: {v}" for v in violations(Answer(exc.code().name,
                                                                        exc.details() or "")))
        except pa.ArrowException:
            pass
        return None

    for write_id in WRITE_IDS:
        if write_id:
            call(_action, client, ABORT.name, pb.AbortRequest(write_id=write_id).SerializeToString())
    list_tables = channel.unary_unary(TABLES + "ListTables",
                                      request_serializer=tpb.ListTablesRequest.SerializeToString,
                                      response_deserializer=tpb.ListTablesResponse.FromString)
    drop = channel.unary_unary(TABLES + "DropTable",
                               request_serializer=pb.DropTableRequest.SerializeToString,
                               response_deserializer=tpb.DropTableResponse.FromString)
    for _ in range(10):  # derived tables of derived tables: children go first
        tables = call(list_tables, tpb.ListTablesRequest(), 10)
        if tables is None:
            break
        doomed = [t for t in tables.tables if t.name not in WATCHED and (
            t.kind == TableKind.DERIVED or t.name in CREATED or t.name not in FUZZ_TABLES
            or t.kind != FUZZ_TABLES[t.name][0] or t.size > MAX_FUZZ_ROWS)]
        if not doomed:
            break
        for t in doomed:
            call(drop, pb.DropTableRequest(name=t.name), 10)
    for name in FUZZ_TABLES:
        try:
            create_table(client, name)
        except fl.FlightError as exc:
            if isinstance(exc, fl.FlightInternalError):
                problems.append(f"cleanup: {exc}")
        except pa.ArrowException:
            pass  # exists already (ALREADY_EXISTS)
    return problems


# ------------------------------------------------------------------------------- writer
class Writer:
    """Writes the watched tables over DoPut until :meth:`stop`, modelling what was acked.

    ``watched_keyed``: upserts of keys in ``[0, 200)``, some rows marked ``__delete``;
    ``watched_append``: rows with increasing ``k``. Each write is one DoPut of one batch;
    the model changes once its ack arrived. A failed write is kept in :attr:`errors`.
    """

    def __init__(self, location: str, seed: int) -> None:
        self._client = fl.connect(location)
        self._rnd = random.Random(seed)
        self.keyed: dict[int, tuple[str, float]] = {}
        self.appended: list[tuple[int, str, float]] = []
        self.writes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fuzz-writer", daemon=True)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._rnd.random() < 0.7:
                    self._write_keyed()
                else:
                    self._append()
                self.writes += 1
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.005)

    def _put(self, table: str, batch: pa.RecordBatch, mode: int) -> None:
        w, r = self._client.do_put(fl.FlightDescriptor.for_path(table), batch.schema)
        request = pb.PutRequest(mode=pb.PutMode.ValueType(mode))
        w.write_with_metadata(batch, pa.py_buffer(request.SerializeToString()))
        # finish writing before reading the ack: a durable server acknowledges a batch
        # only once it reads the next message or the end of the stream
        w.done_writing()
        buf = r.read()
        w.close()
        if buf is None:
            raise AssertionError(f"DoPut into {table!r} ended without an ack")
        ack = pb.PutAck.FromString(buf.to_pybytes())
        if ack.rows != batch.num_rows:
            raise AssertionError(f"ack for {batch.num_rows} rows says {ack.rows}")

    def _write_keyed(self) -> None:
        rnd = self._rnd
        keys = rnd.sample(range(_KEYS), rnd.randint(1, 8))
        dels = [rnd.random() < 0.2 for _ in keys]
        rows = [(k, f"s{rnd.randrange(1000)}", float(rnd.randrange(10_000)) / 8) for k in keys]
        batch = pa.record_batch({"k": pa.array([r[0] for r in rows], pa.int64()),
                                 "s": [r[1] for r in rows], "v": [r[2] for r in rows],
                                 "__delete": dels})
        self._put("watched_keyed", batch, pb.PUT_MODE_UPSERT)
        for (k, s, v), d in zip(rows, dels, strict=True):
            if d:
                self.keyed.pop(k, None)
            else:
                self.keyed[k] = (s, v)

    def _append(self) -> None:
        start = len(self.appended)
        rows = [(start + i, f"a{start + i}", float(i)) for i in range(self._rnd.randint(1, 5))]
        batch = pa.record_batch({"k": pa.array([r[0] for r in rows], pa.int64()),
                                 "s": [r[1] for r in rows], "v": [r[2] for r in rows]})
        self._put("watched_append", batch, pb.PUT_MODE_APPEND)
        self.appended += rows

    def expected(self, table: str) -> pa.Table:
        if table == "watched_keyed":
            rows = [(k, s, v) for k, (s, v) in self.keyed.items()]
        else:
            rows = self.appended
        return _sorted(pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                                 "s": pa.array([r[1] for r in rows], pa.string()),
                                 "v": pa.array([r[2] for r in rows], pa.float64())}))


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("k") if t.num_rows else t


# --------------------------------------------------------------------------- subscriber
class Subscriber:
    """Follows one watched table over DoExchange (optionally some columns only) on a
    thread of its own, applying every message to a :class:`ReferenceView`."""

    def __init__(self, location: str, table: str, columns: list[str] | None = None) -> None:
        self.table = table
        self.columns = columns
        self._client = fl.connect(location)
        self._writer, self._reader = self._client.do_exchange(fl.FlightDescriptor.for_path(table))
        req = pb.SubscriptionRequest(table=table, columns=columns or [])
        self._writer.begin(pa.schema([]))
        self._writer.write_metadata(pa.py_buffer(
            pb.ClientMessage(subscribe=req).SerializeToString()))
        self.schema = self._reader.schema
        self.view = ReferenceView(self.schema)
        self.messages = 0
        self.error: str | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"fuzz-sub-{table}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                msg = read_message(self._reader, self.schema)
            except StreamEnded as exc:  # the server ends it (shutting down): the protocol's end
                if not self._closing:
                    self.error = f"the server ended the subscription: {exc}"
                self._finish()
                break
            except Exception as exc:
                if not self._closing:
                    self.error = f"{type(exc).__name__}: {exc}"
                break
            with self._changed:
                self.view.apply(msg)
                self.messages += 1
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, sequence: int, timeout: float) -> bool:
        """Wait until the view reached ``sequence`` (False after ``timeout`` or an error)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.view.sequence < sequence and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(left)
            return self.error is None

    def rows(self) -> pa.Table:
        with self._changed:
            return _sorted(self.view.to_arrow())

    def _finish(self) -> None:
        """Finish writing, then read the call's status (the protocol's end of a stream)."""
        try:
            self._writer.done_writing()
            self._reader.read_chunk()
        except Exception:
            pass  # the status: OK, or the error the end-of-stream message said

    def close(self) -> None:
        """Stop following: at once, or after the server ended the stream (see
        :func:`shut_down`, which ends subscriptions the way the protocol says)."""
        self._closing = True
        if self._thread.is_alive():
            try:
                self._writer.done_writing()
            except Exception:
                pass
            self._reader.cancel()
        self._thread.join(timeout=10)
        self._client.close()


# ------------------------------------------------------------------------------ checks
def snapshot(client: fl.FlightClient, table: str) -> pa.Table:
    return _sorted(client.do_get(fl.Ticket(table.encode())).read_all())


def sequences(client: fl.FlightClient) -> dict[str, int]:
    stats = pb.Stats.FromString(_action(client, STATS.name, b"")[0])
    return {t.name: t.sequence for t in stats.tables}


def check_exact(client: fl.FlightClient, writer: Writer, subscribers: list[Subscriber],
                timeout: float = 30.0) -> list[str]:
    """After ``writer`` stopped: the mismatches (empty when everything is exact).

    Waits (up to ``timeout``) for the snapshot of each watched table to equal the writer's
    model (a write is visible after the cycle that follows its ack), then for every
    subscriber to reach the table's sequence, and compares its view with the snapshot.
    """
    problems = []
    deadline = time.monotonic() + timeout
    snaps: dict[str, pa.Table] = {}
    for table in WATCHED:
        want = writer.expected(table)
        while True:
            got = snapshot(client, table)
            if got.equals(want) or time.monotonic() > deadline:
                break
            time.sleep(0.02)  # the next cycle publishes the last acked write
        if not got.equals(want):
            problems.append(f"{table}: snapshot has {got.num_rows} rows, the writer's model "
                            f"{want.num_rows}")
        snaps[table] = got
    seqs = sequences(client)
    for sub in subscribers:
        name = f"subscriber of {sub.table}{' ' + str(sub.columns) if sub.columns else ''}"
        if not sub.wait_for(seqs[sub.table], max(1.0, deadline - time.monotonic())):
            problems.append(f"{name}: at sequence {sub.view.sequence} of {seqs[sub.table]} "
                            f"({sub.error or 'no error'})")
            continue
        want = snaps[sub.table].select(sub.columns) if sub.columns else snaps[sub.table]
        got = sub.rows()
        if not got.equals(want.cast(got.schema) if got.schema != want.schema else want):
            problems.append(f"{name}: view has {got.num_rows} rows, snapshot {want.num_rows}")
    return problems
