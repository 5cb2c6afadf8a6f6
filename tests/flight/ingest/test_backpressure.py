"""Push-back on writers the server cannot keep up with (#39 item 5), on a real server.

* **Flow control:** while the server reads nothing of a DoPut stream (its table is held by
  ``write_lock``, so the handler waits to stage), pyarrow's own Flight client can get only a
  few batches past ``write_batch`` before it blocks: the server announces a fixed window per
  stream (``put_window_bytes``), where gRPC's BDP probing would have let megabytes queue,
  each acknowledged seconds late. Released, every batch is acknowledged and applied.
* **The backlog:** a table's writes waiting for its next cycle stay under
  ``max_pending_bytes``. A batch past it waits for a cycle (and goes on when one takes the
  backlog), and after ``put_wait`` seconds is refused RESOURCE_EXHAUSTED in one line naming
  the table, the limit and its flag; the batches before it stay acknowledged and are
  applied, nothing of it or after it is. In memory and durable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import ticktable as tt
from engine.graph import UpdateGraph
from engine.sources import KeyedTable
from flight.errors import MAX_MESSAGE
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import batch_frames, frame
from flight.server import ServerConfig, TicktableServer

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64())])
ROWS = 2500  # 40 kB a batch
FLIGHT = "/arrow.flight.protocol.FlightService/"


def batch(i: int) -> pa.RecordBatch:
    keys = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
    return pa.record_batch([pa.array(keys), pa.array(keys * 0.5)], schema=SCHEMA)


def start(tmp_path: Path | None = None, **config: object) -> TicktableServer:
    server = TicktableServer(UpdateGraph(validate=True), ServerConfig(
        data_dir=tmp_path, **config)).start()  # type: ignore[arg-type]
    keyed = pb.CreateTableRequest(name="t", schema=SCHEMA.serialize().to_pybytes(),
                                  kind=pb.TABLE_KIND_KEYED, keys=["k"])
    server.create_table(keyed)
    return server


@pytest.fixture
def server() -> Iterator[TicktableServer]:
    srv = start()
    yield srv
    srv.shutdown()


def table(server: TicktableServer) -> KeyedTable:
    t = server.registry.get("t").table
    assert isinstance(t, KeyedTable)
    return t


# ------------------------------------------------------------------------------ flow control
class Writer(threading.Thread):
    """pyarrow's Flight client writing ``n`` batches into ``t`` as fast as it may, then
    reading the acks; :attr:`written` counts the bytes of the batches ``write_batch`` let go."""

    def __init__(self, server: TicktableServer, n: int) -> None:
        super().__init__(daemon=True)
        self.location, self.n = server.location, n
        self.written = 0
        self.acks: list[int] = []
        self.errors: list[BaseException] = []
        self.start()

    def run(self) -> None:
        try:
            client = fl.connect(self.location)
            writer, reader = client.do_put(fl.FlightDescriptor.for_path("t"), SCHEMA)
            for i in range(self.n):
                b = batch(i)
                writer.write_batch(b)
                self.written += b.nbytes
            writer.done_writing()
            while (buf := reader.read()) is not None:
                self.acks.append(pb.PutAck.FromString(buf.to_pybytes()).batch_index)
            writer.close()
            client.close()
        except BaseException as exc:  # noqa: BLE001 - asserted on below
            self.errors.append(exc)

    def held(self) -> int:
        """The bytes written once writing stopped: unchanged for a second (on a loaded
        machine the writer may take a while to reach its limit; 30 s at most)."""
        deadline = time.monotonic() + 30
        held, since = self.written, time.monotonic()
        while held == 0 or time.monotonic() - since < 1.0:  # begun, then stopped
            assert time.monotonic() < deadline, "the writer went on while nothing was taken"
            time.sleep(0.05)
            if self.written != held:
                held, since = self.written, time.monotonic()
        return held

    def finish(self, server: TicktableServer) -> None:
        """Every batch acknowledged, and applied by the next cycle."""
        self.join(60)
        assert not self.errors and not self.is_alive()
        assert self.acks == list(range(self.n))
        server.graph.run_cycle()
        assert table(server).size == self.n * ROWS


def test_a_writer_the_server_does_not_read_is_held_by_flow_control(server):
    with table(server).write_lock():  # the handler waits to stage its first batch
        writer = Writer(server, 400)  # 16 MB: what a BDP-grown window lets queue many times
        held = writer.held()
        # the window (64 KiB), the batches read ahead (2) and the one being staged, plus the
        # one the client is sending: a handful of batches, not megabytes
        assert 0 < held <= 8 * batch(0).nbytes, held
    writer.finish(server)


def test_a_durable_writer_is_held_while_its_batches_wait_to_land(tmp_path):
    """A durable stream keeps batches on their way to the journal while it reads the next
    (pipelined, up to 64 MiB), but only while the oldest has waited less than
    ``max_in_flight_seconds``: with a cycle holding the gate its batches are staged through,
    the writer is held after what the stream reads in that time, not after 64 MiB.
    Released, every batch is acknowledged and applied.

    What gets through is the stream's read rate times the window, so the window is 0.02 s
    here (0.1 s by default): at 0.1 s the writer was held after 8.7 MB in a fresh-clone CI
    and after 9.2-10.8 MB alone on a fast day (2.6-2.7 MB at 0.02 s), so a bound in bytes
    at 0.1 s measured the machine's speed."""
    server = start(tmp_path)
    server.puts.max_in_flight_seconds = 0.02
    try:
        gate = server.graph.cycle_gate
        assert gate is not None
        with gate:  # as a cycle waiting for the graph's lock: nothing journaled is staged
            writer = Writer(server, 800)  # 32 MB
            held = writer.held()
            assert 0 < held <= 8 << 20, held  # 64 MiB would have let all 32 MB go
        writer.finish(server)
    finally:
        server.shutdown()


def test_a_batch_larger_than_the_window_goes_through(server):
    big = pa.record_batch([pa.array(np.arange(2_000_000, dtype=np.int64)),
                           pa.array(np.ones(2_000_000))], schema=SCHEMA)  # 32 MB
    client = fl.connect(server.location)
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("t"), SCHEMA)
    writer.write_batch(big)
    writer.done_writing()
    ack = pb.PutAck.FromString(reader.read().to_pybytes())
    writer.close()
    client.close()
    assert ack.rows == 2_000_000
    server.graph.run_cycle()
    assert table(server).size == 2_000_000


# ------------------------------------------------------------------------------ the backlog
def put(channel: grpc.Channel, batches: list[pa.RecordBatch]
        ) -> tuple[list[pb.PutAck], grpc.RpcError | None]:
    """One raw DoPut of ``batches`` into ``t``: the acks received, and the error it ended with."""
    desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"])
    first = frame(descriptor=desc.SerializeToString(),
                  header=pa.ipc.read_message(SCHEMA.serialize()).metadata)
    call = channel.stream_stream(FLIGHT + "DoPut")
    acks: list[pb.PutAck] = []
    try:
        for a in call(iter([first, *batch_frames(SCHEMA, batches, None)]), timeout=30):
            acks.append(pb.PutAck.FromString(fpb.PutResult.FromString(a).app_metadata))
    except grpc.RpcError as exc:
        return acks, exc
    return acks, None


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_a_write_past_the_backlog_waits_then_is_refused(tmp_path, durable):
    nbytes = batch(0).get_total_buffer_size()
    server = start(tmp_path if durable else None, max_pending_bytes=2 * nbytes, put_wait=0.5)
    try:  # no cycle runs: two batches fit, the third waits 0.5 s and is refused
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            t0 = time.monotonic()
            acks, error = put(ch, [batch(i) for i in range(5)])
            waited = time.monotonic() - t0
        assert [a.batch_index for a in acks] == [0, 1]
        assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = error.details()
        assert "\n" not in details and "Traceback" not in details and len(details) <= MAX_MESSAGE
        assert details == (
            f"table 't': {2 * nbytes} bytes of writes wait for its next cycle and this batch "
            f"adds {nbytes}, past the limit of {2 * nbytes} (max_pending_bytes; ticktable serve "
            f"--max-pending-bytes N), still over it after 0.5 s; cycles are behind: nothing of "
            f"this batch was staged, send it again later")
        assert waited >= 0.5
        assert table(server).pending_bytes == 2 * nbytes
        server.graph.run_cycle()  # the acknowledged batches, and nothing of the refused ones
        assert table(server).size == 2 * ROWS and table(server).pending_bytes == 0
        metrics = server.metrics
        assert metrics is not None
        assert metrics.registry.get_sample_value("ticktable_put_waits_total", {"table": "t"}) == 1
        assert metrics.totals().errors == {"RESOURCE_EXHAUSTED": 1}
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:  # the server serves on
            acks, error = put(ch, [batch(i) for i in range(2, 4)])
        assert error is None and len(acks) == 2
        server.graph.run_cycle()
        assert table(server).size == 4 * ROWS
    finally:
        server.shutdown()


class RawPut(threading.Thread):
    """:func:`put` of ``n`` batches on a thread; :attr:`out` is its (acks, error)."""

    def __init__(self, server: TicktableServer, n: int) -> None:
        super().__init__(daemon=True)
        self.port, self.n = server.port, n
        self.out: list[tuple[list[pb.PutAck], grpc.RpcError | None]] = []
        self.start()

    def run(self) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            self.out.append(put(ch, [batch(i) for i in range(self.n)]))

    def result(self) -> tuple[list[pb.PutAck], grpc.RpcError | None]:
        self.join(10)
        (out,) = self.out
        return out


def waiting(server: TicktableServer, nbytes: int) -> None:
    """Until ``nbytes`` wait in ``t``'s backlog, and a little longer (the next batch waits)."""
    t = table(server)
    deadline = time.monotonic() + 10
    while t.pending_bytes < nbytes and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert t.pending_bytes == nbytes


def test_a_waiting_write_goes_on_when_a_cycle_takes_the_backlog():
    nbytes = batch(0).get_total_buffer_size()
    server = start(max_pending_bytes=nbytes, put_wait=30.0)
    try:
        writer = RawPut(server, 3)
        for _ in range(2):  # each cycle lets one more batch in
            waiting(server, nbytes)  # one staged, the next one waiting
            server.graph.run_cycle()
        acks, error = writer.result()
        assert error is None and [a.batch_index for a in acks] == [0, 1, 2]
        server.graph.run_cycle()
        assert table(server).size == 3 * ROWS
        metrics = server.metrics
        assert metrics is not None
        assert metrics.registry.get_sample_value("ticktable_put_waits_total", {"table": "t"}) == 2
    finally:
        server.shutdown()


def test_shutdown_refuses_a_waiting_write_at_once():
    nbytes = batch(0).get_total_buffer_size()
    server = start(max_pending_bytes=nbytes, put_wait=60.0, shutdown_timeout=30.0)
    writer = RawPut(server, 3)
    waiting(server, nbytes)
    t0 = time.monotonic()
    assert server.shutdown()
    assert time.monotonic() - t0 < 10  # not the 60 s wait, nor the 30 s grace
    acks, error = writer.result()
    assert len(acks) == 1 and error is not None


# ------------------------------------------------------------------ the client sends it again
def appended(n: int) -> Iterator[pa.RecordBatch]:
    """``n`` batches for the append table ``a``, as a one-shot generator (it cannot be read
    twice: what the client sends again it must have kept)."""
    for i in range(n):
        yield batch(i)


def append_server(**config: object) -> TicktableServer:
    server = start(None, **config)
    server.create_table(pb.CreateTableRequest(name="a", schema=SCHEMA.serialize().to_pybytes(),
                                              kind=pb.TABLE_KIND_APPEND))
    return server


def test_a_streamed_push_sends_refused_batches_again_until_all_are_applied_once():
    """Cycles every 0.25 s take at most two batches' worth of backlog each: the writer is
    refused again and again, sends the rest again each time, and every row ends in the table
    exactly once and in order (an append table would show a batch applied twice)."""
    nbytes = batch(0).get_total_buffer_size()
    server = append_server(max_pending_bytes=2 * nbytes, put_wait=0.05)
    server.graph.start(0.25)
    try:
        with tt.connect(server.location) as client:
            summary = client.push("a", appended(24), atomic=False, chunk_rows=ROWS)
        assert summary.rows == 24 * ROWS and summary.batches == 24 and not summary.staged
        assert summary.retries >= 3, summary  # 24 batches at 2 a cycle: refused many times
        deadline = time.monotonic() + 10
        a = server.registry.get("a").table
        while a.size < 24 * ROWS and time.monotonic() < deadline:
            time.sleep(0.05)
        got = a.to_arrow()
        assert got.column("k").to_numpy().tolist() == list(range(24 * ROWS))
        metrics = server.metrics
        assert metrics is not None
        assert metrics.totals().errors["RESOURCE_EXHAUSTED"] == summary.retries
    finally:
        server.shutdown()


def test_a_streamed_push_raises_the_refusal_once_nothing_is_acknowledged_for_retry_for():
    """No cycle runs: after the two batches that fit, nothing is acknowledged; the push sends
    the rest again until ``retry_for`` passed without an ack, then raises the server's one
    line. ``retry_for=0`` raises the first refusal. The applied batches are exactly those
    acknowledged: a prefix."""
    nbytes = batch(0).get_total_buffer_size()
    server = append_server(max_pending_bytes=2 * nbytes, put_wait=0.05)
    try:
        with tt.connect(server.location) as client:
            t0 = time.monotonic()
            with pytest.raises(pa.ArrowInvalid, match=r"table 'a': .* past the limit of "
                               rf"{2 * nbytes} \(max_pending_bytes.*send it again later"):
                client.push("a", appended(6), atomic=False, chunk_rows=ROWS, retry_for=1.0)
            took = time.monotonic() - t0
            assert 1.0 <= took < 5.0, took
            with pytest.raises(pa.ArrowInvalid, match="send it again later"):
                client.push("a", appended(6), atomic=False, chunk_rows=ROWS, retry_for=0)
        metrics = server.metrics
        assert metrics is not None
        refusals = metrics.totals().errors["RESOURCE_EXHAUSTED"]
        assert refusals >= 4  # the first push tried several times over its second
        server.graph.run_cycle()
        got = server.registry.get("a").table.to_arrow()
        assert got.column("k").to_numpy().tolist() == list(range(2 * ROWS))
    finally:
        server.shutdown()
