"""soak's other two processes: the server and the writers (see bench/soak.py), and the
warning counter every process installs.

Spawned processes start from these functions, so this module imports only what they need.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

import ticktable as tt
from bench._common import SCHEMA, batch
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer

PERIOD = 0.010  # each writer's batch interval
DELETE_SHARE = 0.05
WRITERS = ("orders", "orders", "quotes", "quotes")
WIRE = SCHEMA.append(pa.field("__delete", pa.bool_()))  # upserts with a delete marker


# ------------------------------------------------------------------ warnings, counted
class Counting(logging.Handler):
    """Counts WARNING+ records by logger and message template; ERRORs are printed too."""

    def __init__(self, prefix: str) -> None:
        super().__init__(logging.WARNING)
        self.prefix = prefix
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.levelname} {record.name}: {record.msg}"] += 1
        if record.levelno >= logging.ERROR:
            print(f"{self.prefix} {record.levelname} {record.name}: {record.getMessage()}",
                  file=sys.stderr, flush=True)


def count_warnings(prefix: str) -> Counting:
    handler = Counting(prefix)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    root.addHandler(handler)
    return handler


# ------------------------------------------------------------------ the server process
def _serve(conn: Any, data_dir: str | None, interval: float, metrics: bool) -> None:
    warnings = count_warnings("server")
    graph = tt.UpdateGraph()
    extra: dict[str, Any] = {"metrics_port": 0} if metrics else {}  # any free port
    server = TicktableServer(graph, ServerConfig(
        data_dir=Path(data_dir) if data_dir else None, **extra)).start()
    lock = threading.Lock()
    cycles: list[tuple[float, float]] = []  # (when it ended, its duration in ms)

    def on_cycle(step: int) -> None:
        with lock:
            cycles.append((time.monotonic(), graph.last_cycle_seconds * 1e3))

    graph.add_terminal_listener(on_cycle)
    graph.start(interval)
    conn.send((server.location, os.getpid(), server.metrics_port if metrics else None))
    while True:
        cmd = conn.recv()
        if cmd == "cycles":  # the cycles since the last call, and the warnings so far
            with lock:
                out = cycles.copy()
                cycles.clear()
            conn.send((out, dict(warnings.counts)))
        elif cmd == "stop":
            graph.stop()
            server.shutdown()
            conn.send("bye")
            return


class ServerProcess:
    def __init__(self, data_dir: str | None, interval: float, metrics: bool) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, data_dir, interval, metrics),
                                daemon=True)
        self.proc.start()
        self.location, self.pid, self.metrics_port = self.conn.recv()

    def cycles(self) -> tuple[list[tuple[float, float]], dict[str, int]]:
        self.conn.send("cycles")
        return self.conn.recv()  # type: ignore[no-any-return]

    def stop(self) -> None:
        try:
            self.conn.send("stop")
            self.conn.recv()
        except (EOFError, OSError):  # it is gone already (Ctrl-C reaches it too)
            pass
        self.proc.join(30)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------ the writer process
def run_writers(location: str, nkeys: int, rows: int, stop: Any, acked: Any, conn: Any) -> None:
    logging.basicConfig(level=logging.WARNING, format="writers %(levelname)s %(name)s: %(message)s")
    out: list[dict[str, Any]] = [{} for _ in WRITERS]
    threads = [threading.Thread(target=_writer, name=f"writer-{i}",
                                args=(location, i, nkeys, rows, stop, acked, out))
               for i in range(len(WRITERS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.send(out)


def _writer(location: str, i: int, nkeys: int, rows: int, stop: Any, acked: Any,
            out: list[dict[str, Any]]) -> None:
    """One DoPut stream into ``WRITERS[i]``: ``rows`` upserts every ``PERIOD`` s until ``stop``.

    A writer that falls more than a second behind its schedule drops the missed ticks
    (counted) instead of bursting to catch up.
    """
    table = WRITERS[i]
    rng = np.random.default_rng(100 + i)
    client = fl.connect(location)
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(table), WIRE)
    sent: collections.deque[float] = collections.deque()
    latency: list[float] = []
    failure: list[BaseException] = []

    def acks() -> None:
        try:
            while reader.read() is not None:
                latency.append((time.perf_counter() - sent.popleft()) * 1e3)
                with acked.get_lock():
                    acked[i] += rows
        except Exception as exc:
            failure.append(exc)

    reader_thread = threading.Thread(target=acks, name=f"acks-{i}", daemon=True)
    reader_thread.start()
    meta = pa.py_buffer(pb.PutRequest(mode=pb.PUT_MODE_UPSERT).SerializeToString())
    batches = skipped = 0
    behind = 0.0
    due = time.monotonic()
    try:
        while not stop.is_set() and not failure:
            t = batch(rng, rng.integers(0, nkeys, rows))
            t = t.append_column("__delete", pa.array(rng.random(rows) < DELETE_SHARE))
            b = t.to_batches()[0]
            sent.append(time.perf_counter())
            if batches == 0:
                writer.write_with_metadata(b, meta)
            else:
                writer.write_batch(b)
            batches += 1
            due += PERIOD
            late = time.monotonic() - due
            behind = max(behind, late)
            if late < 0:
                stop.wait(-late)
            elif late > 1.0:
                skipped += int(late / PERIOD)
                due = time.monotonic()
        writer.done_writing()
        reader_thread.join(60)
    except Exception as exc:
        failure.append(exc)
    finally:
        writer.close()
        client.close()
    lat = np.array(latency or [np.nan])
    out[i] = {"table": table, "batches": batches, "acked_batches": len(latency),
              "ack_p50_ms": float(np.median(lat)), "ack_mean_ms": float(lat.mean()),
              "ack_p99_ms": float(np.percentile(lat, 99)),
              "ack_max_ms": float(lat.max()), "max_behind_s": behind,
              "skipped_ticks": skipped, "error": repr(failure[0]) if failure else None}
