"""bench_aio: sync ``grpc.server`` against ``grpc.aio`` for Flight streams (issue #15 spike).

Issue #15 asked to measure sync grpcio against ``grpc.aio`` before choosing; this spike
serves one workload from both, stripped of everything but the transport:

* **sync**: ``grpc.server`` with a thread pool and a generic handler. A DoGet's response
  iterator drains a per-stream ``queue.Queue`` (depth --depth, woken by
  ``context.add_callback`` when the call ends); one publisher thread puts each message on
  every stream's queue (what ``flight.rpc.flight_service.FrameQueue`` and ``flight.streams.fanout`` do).
* **aio**: ``grpc.aio.server`` with the same generic handler; a DoGet is an async
  generator awaiting a per-stream ``asyncio.Queue``. The same kind of publisher thread
  hands each message to the event loop once (``loop.call_soon_threadsafe``), and the
  loop puts it on every stream's queue (a full queue drops it: counted, as ``dropped``).

Both send the same pre-framed ``FlightData`` bytes (:mod:`flight.rpc.framing`: one 1,000-row
batch of the shared 4-column table, header and body sliced once; per message only the
``app_metadata`` changes), with raw-bytes serializers (no protobuf re-encode).

Measures:
  1. Delta latency: --subscribers plain ``pyarrow.flight`` DoGet readers (own connection
     each, spread over --client-procs processes, so client work does not share the
     server's GIL) while the publisher sends --rate messages/s for --warmup + --seconds.
     Each message carries (sequence, ``time.monotonic_ns()``) in ``app_metadata``, taken
     when the publisher builds it; a reader stamps the same clock when ``read_chunk``
     returns. Warm-up messages are left out. Reported: p50/mean/p99 latency, messages
     delivered of those expected, server process CPU (``/proc/self/stat``, all threads,
     over the measured window) per message delivered and as % of one core, and how busy
     the whole machine was meanwhile (``/proc/stat``, % of both cores: clients and other
     processes included).
  2. DoPut ingest (unless --no-ingest): one client writes --put-batches batches of
     --put-rows rows; the server finds each message's fields (``parse_flight_data``, no
     decode into Arrow) and acks each batch with a ``PutResult``. Median of --repeat of
     rows/s, and server CPU (``/proc/<pid>/stat``) per batch.

Before every configuration the script waits (polling every 30 s) while soak.py,
bench_web.py, bench_flight.py or pytest run, as the machine is shared.

Run: python bench/bench_aio.py [--subscribers 1 50] [--seconds 20] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import SCHEMA, batch, print_table, write_json  # noqa: E402
from flight.rpc.framing import frame, parse_flight_data, put_result, schema_frame  # noqa: E402

SERVICE = "arrow.flight.protocol.FlightService"
OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.so_reuseport", 0)]
_META = struct.Struct("<qq")  # sequence, monotonic ns when built
BUSY = "soak.py|bench_web.py|bench_flight.py|pytest"
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- machine
def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all threads."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


def _machine() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]  # idle, iowait
    return sum(v) - idle, sum(v)


def _wait_idle() -> None:
    while True:
        done = subprocess.run(["pgrep", "-af", BUSY], capture_output=True, text=True)
        if not done.stdout.strip():
            return
        print(f"  waiting for: {done.stdout.strip().splitlines()[0][:100]} ...", flush=True)
        time.sleep(30)


# ----------------------------------------------------------------------------- server
class _Hub:
    """The streams open now, and one publisher thread feeding them (see module doc)."""

    def __init__(self, kind: str, n: int, depth: int, loop: asyncio.AbstractEventLoop | None):
        self.kind, self.n, self.depth, self.loop = kind, n, depth, loop
        self.members: list[Any] = []
        self.lock = threading.Lock()
        self.full = threading.Event()
        self.dropped = 0

    def join(self, q: Any) -> None:
        with self.lock:
            self.members.append(q)
            if len(self.members) >= self.n:
                self.full.set()

    def leave(self, q: Any) -> None:
        with self.lock:
            if q in self.members:
                self.members.remove(q)

    def _deliver(self, f: bytes | None) -> None:
        for q in list(self.members):
            if self.kind == "sync":
                try:
                    q.put(f, timeout=1.0)  # blocks while the stream's queue is full
                except queue.Full:
                    self.dropped += 1
            elif f is not None and q.qsize() >= self.depth:  # on the loop: must not block
                self.dropped += 1
            else:  # unbounded queue, so the end marker always gets in
                q.put_nowait(f)

    def publish(self, f: bytes | None) -> None:
        if self.loop is None:
            self._deliver(f)
        else:  # one wake of the loop per message, not per stream
            self.loop.call_soon_threadsafe(self._deliver, f)

    def run(self, rate: float, warm: int, n: int, header: Any, body: Any, out: Any) -> None:
        joined = self.full.wait(60)
        t0 = time.monotonic()
        cpu0 = wall0 = 0.0
        for seq in range(warm + n):
            delay = t0 + seq / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if seq == warm:
                cpu0, wall0 = _cpu_s(os.getpid()), time.monotonic()
            meta = _META.pack(seq - warm, time.monotonic_ns())  # negative: warm-up
            self.publish(frame(header=header, body=body, app_metadata=meta))
        cpu1, wall1 = _cpu_s(os.getpid()), time.monotonic()
        self.publish(None)
        out.put({"joined": len(self.members) if joined else -len(self.members),
                 "cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "dropped": self.dropped})


def _ack(raw: bytes, count: int) -> bytes | None:
    msg = parse_flight_data(raw)
    return put_result(str(count).encode()) if msg.body is not None else None


def _handlers(hub: _Hub, schema_frame: bytes, aio: bool) -> Any:
    if aio:
        async def do_get(request: bytes, context: Any) -> Any:
            q: asyncio.Queue[bytes | None] = asyncio.Queue()
            hub.join(q)
            try:
                yield schema_frame
                while (f := await q.get()) is not None:
                    yield f
            finally:
                hub.leave(q)

        async def do_put(requests: Any, context: Any) -> Any:
            count = 0
            async for raw in requests:
                if (ack := _ack(raw, count + 1)) is not None:
                    count += 1
                    yield ack
    else:
        def do_get(request: bytes, context: Any) -> Any:
            q: queue.Queue[bytes | None] = queue.Queue(hub.depth)

            def ended() -> None:  # cancelled, disconnected or finished: wake the iterator
                try:
                    q.put_nowait(None)
                except queue.Full:
                    pass

            context.add_callback(ended)
            hub.join(q)
            try:
                yield schema_frame
                while (f := q.get()) is not None:
                    yield f
            finally:
                hub.leave(q)

        def do_put(requests: Any, context: Any) -> Any:
            count = 0
            for raw in requests:
                if (ack := _ack(raw, count + 1)) is not None:
                    count += 1
                    yield ack

    raw = None  # pre-framed bytes pass through gRPC as they are
    return grpc.method_handlers_generic_handler(SERVICE, {
        "DoGet": grpc.unary_stream_rpc_method_handler(do_get, raw, raw),
        "DoPut": grpc.stream_stream_rpc_method_handler(do_put, raw, raw),
    })


def _serve(kind: str, subs: int, args: dict[str, Any], ready: Any, out: Any) -> None:
    """A server process: ``subs`` > 0 publishes once that many streams are open."""
    m = pa.ipc.read_message(batch(np.random.default_rng(0), np.arange(args["rows"])).to_batches()[0]
                            .serialize())
    start = (args["rate"], int(args["warmup"] * args["rate"]), int(args["seconds"] * args["rate"]),
             m.metadata, m.body, out)
    if kind == "sync":
        hub = _Hub(kind, subs, args["depth"], None)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=subs + 8), options=OPTIONS)
        server.add_generic_rpc_handlers((_handlers(hub, schema_frame(SCHEMA), aio=False),))
        ready.put(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        if subs:
            threading.Thread(target=hub.run, args=start, daemon=True).start()
        server.wait_for_termination()
        return

    async def main() -> None:
        hub = _Hub(kind, subs, args["depth"], asyncio.get_running_loop())
        server = grpc.aio.server(options=OPTIONS)
        server.add_generic_rpc_handlers((_handlers(hub, schema_frame(SCHEMA), aio=True),))
        ready.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        if subs:
            threading.Thread(target=hub.run, args=start, daemon=True).start()
        await server.wait_for_termination()

    asyncio.run(main())


# ----------------------------------------------------------------------------- clients
def _reader(port: int, out: list[Any]) -> None:
    client = fl.connect(f"grpc://127.0.0.1:{port}",
                        generic_options=[("grpc.use_local_subchannel_pool", 1)])  # own connection
    lat: list[int] = []
    reader = client.do_get(fl.Ticket(b"deltas"))
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        now = time.monotonic_ns()
        seq, sent = _META.unpack_from(chunk.app_metadata)
        if seq >= 0:
            lat.append(now - sent)
    client.close()
    out.append(np.array(lat, dtype=np.int64))


def _clients(port: int, n: int, out: Any) -> None:
    """A client process: ``n`` readers, one thread each."""
    got: list[Any] = []
    threads = [threading.Thread(target=_reader, args=(port, got)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(got)


# ----------------------------------------------------------------------------- runs
class _Server:
    def __init__(self, kind: str, subs: int, args: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.out = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_serve, args=(kind, subs, args, self.ready, self.out),
                                daemon=True)
        self.proc.start()
        self.port = self.ready.get(timeout=60)

    def stop(self) -> None:
        self.proc.terminate()  # our own child, by handle
        self.proc.join(10)


def latency(kind: str, subs: int, args: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    server = _Server(kind, subs, args)
    try:
        got = ctx.Queue()
        procs = min(args["client_procs"], subs)
        per = [subs // procs + (i < subs % procs) for i in range(procs)]
        clients = [ctx.Process(target=_clients, args=(server.port, k, got), daemon=True)
                   for k in per]
        busy0 = _machine()
        for c in clients:
            c.start()
        timeout = args["warmup"] + args["seconds"] + 120
        res = server.out.get(timeout=timeout)
        busy1 = _machine()
        lats = [a for _ in clients for a in got.get(timeout=60)]
        for c in clients:
            c.join(10)
    finally:
        server.stop()
    ns = np.concatenate(lats) if lats else np.zeros(0, np.int64)
    ms = ns / 1e6
    expected = subs * int(args["seconds"] * args["rate"])
    return {
        "server": kind, "subscribers": subs, "p50_ms": float(np.median(ms)),
        "mean_ms": float(ms.mean()), "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()), "delivered": int(ns.size), "expected": expected,
        "dropped": res["dropped"], "joined": res["joined"],
        "cpu_us_per_msg": res["cpu_s"] / max(ns.size, 1) * 1e6,
        "server_cpu_pct": 100 * res["cpu_s"] / res["wall_s"],
        "machine_busy_pct": 100 * (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1),
    }


def ingest(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    rows, n = args["put_rows"], args["put_batches"]
    batches = batch(rng, np.arange(rows)).to_batches(max_chunksize=rows)
    server = _Server(kind, 0, args)
    times, cpus = [], []
    try:
        client = fl.connect(f"grpc://127.0.0.1:{server.port}")
        for rep in range(args["repeat"] + 1):  # the first is warm-up
            cpu0, t0 = _cpu_s(server.proc.pid), time.perf_counter()
            writer, reader = client.do_put(fl.FlightDescriptor.for_path("t"), SCHEMA)
            for _ in range(n):
                writer.write_batch(batches[0])
            writer.done_writing()
            acks = 0
            while reader.read() is not None:
                acks += 1
            writer.close()
            dt, cpu = time.perf_counter() - t0, _cpu_s(server.proc.pid) - cpu0
            assert acks == n, f"{kind}: {acks} acks for {n} batches"
            if rep:
                times.append(dt)
                cpus.append(cpu)
        client.close()
    finally:
        server.stop()
    i = int(np.argsort(times)[len(times) // 2])  # the median run
    return {"server": kind, "batch_rows": rows, "batches": n, "rows_per_s": rows * n / times[i],
            "MB_per_s": batches[0].nbytes * n / times[i] / 1e6, "cpu_us_per_batch": cpus[i] / n * 1e6,
            "seconds": times[i]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--subscribers", type=int, nargs="+", default=[1, 50])
    p.add_argument("--servers", nargs="+", default=["sync", "aio"], choices=["sync", "aio"])
    p.add_argument("--rate", type=float, default=100.0, help="messages per second")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rows", type=int, default=1000, help="rows per streamed message")
    p.add_argument("--depth", type=int, default=4, help="per-stream queue depth")
    p.add_argument("--client-procs", type=int, default=5)
    p.add_argument("--put-rows", type=int, default=65536)
    p.add_argument("--put-batches", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-ingest", action="store_true")
    p.add_argument("--quick", action="store_true", help="3 s runs, 10 batches: development")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.quick:
        a.seconds, a.warmup, a.put_batches, a.repeat = 3.0, 1.0, 10, 1
    args = vars(a)
    lat_rows: list[dict[str, Any]] = []
    for subs in a.subscribers:
        for kind in a.servers:  # alternate, so drifting load hits both alike
            _wait_idle()
            print(f"latency: {kind}, {subs} subscriber(s) ...", flush=True)
            lat_rows.append(latency(kind, subs, args))
    print_table(f"Delta latency, {a.rows}-row messages at {a.rate:g}/s for {a.seconds:g} s "
                f"(server CPU per message delivered; machine: both cores, all processes)",
                lat_rows, ["server", "subscribers", "p50_ms", "mean_ms", "p99_ms", "max_ms",
                           "delivered", "expected", "dropped", "cpu_us_per_msg",
                           "server_cpu_pct", "machine_busy_pct"])
    put_rows: list[dict[str, Any]] = []
    if not a.no_ingest:
        for kind in a.servers:
            _wait_idle()
            print(f"ingest: {kind} ...", flush=True)
            put_rows.append(ingest(kind, args))
        print_table(f"DoPut ingest, {a.put_batches} x {a.put_rows}-row batches, each acked "
                    f"(median of {a.repeat})", put_rows,
                    ["server", "rows_per_s", "MB_per_s", "cpu_us_per_batch", "seconds"])
    write_json("bench_aio", {"args": args, "grpcio": grpc.__version__,
                             "latency": lat_rows, "ingest": put_rows}, a.json)


if __name__ == "__main__":
    main()
