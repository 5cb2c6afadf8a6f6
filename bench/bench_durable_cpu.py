"""bench_durable_cpu: where a durable DoPut append's CPU goes, against the same in memory.

Two sections, each run against the tree it is started from (``cwd`` and ``PYTHONPATH``), so
that one script measures two checkouts in turns:

* **server** (default): ``bench_durable``'s two servers (in memory and durable, spawned
  processes), ``--rounds`` puts of 4M rows in 65,536-row batches to each, alternating;
  per round the durable/in-memory ratio of acked rows/s (median, mean, p1, p99), and per
  server the CPU per batch of its threads (``/proc``: Python threads and gRPC's
  ``event_engine``) and its minor page faults per batch. CPU per batch is the figure to
  read on a loaded machine: wall time moves with the neighbours, CPU much less.
* **journal** (``--journal``): the journal alone, in this process: one writer serializes
  each batch (``ipc_bytes``) and submits it, keeping at most 64 MiB in flight (as a DoPut
  stream does); rows/s, and CPU per batch of the writer (serialization, submit with its
  CRC) and of the flusher (of which the payload write).

Run: python bench/bench_durable_cpu.py [--rounds 15] | --journal [--batches 600]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.getcwd())
from bench._common import batch  # noqa: E402
from bench.bench_durable import _batches, _Server  # noqa: E402
from flight.pb import flight_pb2 as pb  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _thread_cpu(pid: int, names: dict[int, str] | None = None) -> collections.Counter[str]:
    """Seconds of CPU per thread name (digits stripped) of process ``pid``: its Python
    name where ``names`` (native id -> name) has it; ``"all"``, the process's total (threads
    that ended count there only)."""
    out: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        name = (names or {}).get(int(tid)) or stat[stat.index("(") + 1: stat.rindex(")")]
        name = name.rstrip("0123456789-_ ")
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] += (int(fields[11]) + int(fields[12])) / _TICK
    fields = Path(f"/proc/{pid}/stat").read_text()
    fields = fields[fields.rindex(")") + 2:]
    out["all"] = (int(fields.split()[11]) + int(fields.split()[12])) / _TICK
    return out


def _faults(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[7])


def server(rounds: int) -> None:
    """The servers section (see the module docstring)."""
    rows = 4_000_000
    app = _batches(np.random.default_rng(3), np.arange(rows))
    tmp = Path(tempfile.mkdtemp(prefix="tt-durcpu-"))
    servers = {"mem": _Server(None), "dur": _Server(tmp / "data")}
    wall: dict[str, list[float]] = {m: [] for m in servers}
    faults: dict[str, list[float]] = {m: [] for m in servers}
    cpu: dict[str, collections.Counter[str]] = {m: collections.Counter() for m in servers}
    try:
        for i in range(rounds + 1):  # round 0 warms up
            for mode, srv in servers.items():
                name = f"a{i}"
                srv.create(name, "append")
                srv.call("watch", name)
                names = srv.call("threads")
                f0, t0 = _faults(srv.proc.pid), time.perf_counter()
                c0 = _thread_cpu(srv.proc.pid, names)
                srv.put(name, app, pb.PUT_MODE_APPEND)
                t1 = time.perf_counter()
                c1, f1 = _thread_cpu(srv.proc.pid, names), _faults(srv.proc.pid)
                srv.call("wait", rows)
                srv.drop(name)
                if i:
                    wall[mode].append(t1 - t0)
                    faults[mode].append((f1 - f0) / len(app))
                    for k in c1:
                        cpu[mode][k] += (c1[k] - c0.get(k, 0)) / len(app) / rounds
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = np.array(wall["mem"]) / np.array(wall["dur"])
    print(f"durable/in memory, acked rows/s per round: median {np.median(ratio):.2f} mean "
          f"{ratio.mean():.2f} p1 {np.percentile(ratio, 1):.2f} p99 {np.percentile(ratio, 99):.2f}")
    for mode in servers:
        w = np.array(wall[mode])
        threads = {k: round(v * 1e6) for k, v in cpu[mode].most_common() if v * 1e6 >= 5}
        total = threads.pop("all", 0)
        print(f"  {mode}: {rows / np.median(w) / 1e6:.1f}M rows/s (mean {rows / w.mean() / 1e6:.1f}); "
              f"server CPU {total} us/batch, threads alive at the end {threads}; "
              f"{np.median(faults[mode]):.0f} page faults/batch")


def journal(batches: int) -> None:
    """The journal section (see the module docstring)."""
    from flight.durability import journal as journal_mod
    from flight.durability import payloads
    from flight.durability.records import ipc_bytes

    t = pa.Table.from_batches(batch(np.random.default_rng(3), np.arange(65_536)).to_batches())
    split: collections.Counter[str] = collections.Counter()

    def timed(cls: Any, name: str, key: str) -> None:
        orig = getattr(cls, name)

        def run(*args: Any) -> Any:
            c0 = time.thread_time()
            try:
                return orig(*args)
            finally:
                split[key] += time.thread_time() - c0
        setattr(cls, name, run)

    timed(journal_mod.Journal, "_commit", "flusher")
    timed(payloads.PayloadWriter, "write", "payload write")
    root = Path(tempfile.mkdtemp(prefix="tt-jcpu-"))
    room = threading.Semaphore(28)  # 64 MiB of 2.3 MB batches in flight
    futures: list[Future[int]] = []
    try:
        with journal_mod.Journal.open(root) as j:
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(batches):
                room.acquire()
                a0 = time.thread_time()
                payload = ipc_bytes(t)
                a1 = time.thread_time()
                future = j.submit("apply", "t", b'{"parts":[{"table":"t"}]}', payload,
                                  apply=lambda seq: None)
                split["serialize"] += a1 - a0
                split["submit"] += time.thread_time() - a1
                del payload
                future.add_done_callback(lambda f: room.release())
                futures.append(future)
            for future in futures:
                future.result()
            wall, writer = time.perf_counter() - t0, time.thread_time() - c0
            flt = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    us = {k: round(v / batches * 1e6) for k, v in split.items()}
    print(f"{batches * 65_536 / wall / 1e6:.1f}M rows/s, {batches * t.nbytes / wall / 1e9:.2f} GB/s; "
          f"writer {writer / batches * 1e6:.0f} us/batch (serialize {us['serialize']}, submit "
          f"{us['submit']}, {flt / batches:.1f} page faults); flusher {us['flusher']} us/batch "
          f"(payload write {us['payload write']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--journal", action="store_true", help="the journal alone, in this process")
    ap.add_argument("--batches", type=int, default=600)
    args = ap.parse_args()
    if args.journal:
        journal(args.batches)
    else:
        server(args.rounds)


if __name__ == "__main__":
    main()
