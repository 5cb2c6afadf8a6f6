"""bench_journal: acknowledged batches per second of the journal, against two alternatives.

Every backend makes each batch durable before acknowledging it, and concurrent writers share
flushes through the same group-commit loop (a queue, one flusher thread, one sync per group):

  sqlite  ``flight.durability.journal.Journal`` itself: SQLite in WAL mode, ``synchronous=FULL``,
          64 KiB pages, WAL checkpointed every 64 MiB; CRC32 per record, dedupe tables;
          payloads of 64 KiB or more in payload files beside it, written with ``pwrite``
          and ``fdatasync``-ed before the COMMIT that refers to them.
  lmdb    LMDB (``sync=True, metasync=True``): one write transaction per group, keys
          ``seq`` + meta / payload; CRC32 per record kept beside it (LMDB has none).
  file    an append-only file of length-prefixed records (seq, CRC32, lengths, meta,
          payload), one ``writev`` and one ``os.fsync`` per group.

Payload: --batch-rows rows of the benchmarks' 4-column table (int64, string, float64,
int64; ``bench._common.batch``), serialized once as Arrow IPC streams (so serialization is
not timed) and appended --batches times in all, split over --writers threads, each waiting
for its acknowledgement. Reported per backend and writer count: acknowledged batches/s,
rows/s and MB/s, transactions (fsyncs) and batches per transaction, ack latency
median/mean/p99, the ratio of batches/s to sqlite's, and read-back MB/s (open, read every
record and check its CRC: the start-up cost per MB of journal, from a warm page cache).

Run: python bench/bench_journal.py [--batches 96] [--writers 1 4 16] [--repeat 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import batch, print_table, stats_ms, write_json  # noqa: E402
from flight.durability.journal import Journal  # noqa: E402
from flight.durability.records import ipc_bytes  # noqa: E402

_Rec = tuple[int, bytes, Any, int]  # (seq, meta, payload, crc)


class _GroupLog:
    """The journal's group commit without the journal: ``write_group`` makes a group durable."""

    def __init__(self, write_group: Callable[[list[_Rec]], None]) -> None:
        self._write_group = write_group
        self._cond = threading.Condition()
        self._queue: deque[tuple[_Rec, Future[int]]] = deque()
        self._seq = 0
        self._closing = False
        self.commits = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def append(self, meta: bytes, payload: Any) -> int:
        body = zlib.crc32(payload, zlib.crc32(meta))  # on the writer's thread, as the journal
        fut: Future[int] = Future()
        with self._cond:
            self._seq += 1
            self._queue.append(((self._seq, meta, payload, body), fut))
            self._cond.notify()
        return fut.result()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                group, self._queue = list(self._queue), deque()
            self._write_group([rec for rec, _ in group])
            self.commits += 1
            for (seq, *_), fut in group:
                fut.set_result(seq)


# ------------------------------------------------------------------------------ backends
class _Sqlite:
    name = "sqlite"

    def __init__(self, root: Path) -> None:
        self.journal = Journal.open(root)

    def append(self, meta: bytes, payload: Any) -> int:
        return self.journal.append("append", "t", meta, payload)

    def commits(self) -> int:
        return self.journal.stats().commits

    def close(self) -> None:
        self.journal.close()

    @staticmethod
    def read_back(root: Path) -> int:
        with Journal.open(root) as j:  # open checks every CRC
            return sum(len(r.payload) + len(r.meta) for r in j.records())


class _Lmdb:
    name = "lmdb"

    def __init__(self, root: Path, map_size: int) -> None:
        import lmdb

        self.env = lmdb.open(str(root), map_size=map_size, sync=True, metasync=True)
        self.log = _GroupLog(self._write)

    def _write(self, group: list[_Rec]) -> None:
        with self.env.begin(write=True) as txn:
            for seq, meta, payload, body in group:
                key = seq.to_bytes(8, "big")
                txn.put(key + b"m", struct.pack("<I", body) + meta)
                txn.put(key + b"p", payload)

    def append(self, meta: bytes, payload: Any) -> int:
        return self.log.append(meta, payload)

    def commits(self) -> int:
        return self.log.commits

    def close(self) -> None:
        self.log.close()
        self.env.close()

    @staticmethod
    def read_back(root: Path) -> int:
        import lmdb

        env = lmdb.open(str(root), readonly=True, lock=False)
        total = 0
        with env.begin(buffers=True) as txn:
            it = iter(txn.cursor())
            for (_, m), (_, p) in zip(it, it, strict=True):  # keys sort: seq+b"m", seq+b"p"
                (body,) = struct.unpack_from("<I", m)
                if zlib.crc32(p, zlib.crc32(m[4:])) != body:
                    raise RuntimeError("lmdb record fails its CRC")
                total += len(p) + len(m) - 4
        env.close()
        return total


_HEAD = struct.Struct("<QIII")  # seq, crc, len(meta), len(payload)


class _File:
    name = "file"

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root / "journal.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        dfd = os.open(root, os.O_RDONLY)  # the new file's directory entry is durable too
        os.fsync(dfd)
        os.close(dfd)
        self.log = _GroupLog(self._write)

    def _write(self, group: list[_Rec]) -> None:
        parts: list[Any] = []
        for seq, meta, payload, body in group:
            parts += [_HEAD.pack(seq, body, len(meta), memoryview(payload).nbytes), meta, payload]
        done = os.writev(self.fd, parts)
        rest = b"".join(parts)[done:] if done < sum(memoryview(p).nbytes for p in parts) else b""
        while rest:  # a short write: rare on a regular file
            rest = rest[os.write(self.fd, rest):]
        os.fsync(self.fd)

    def append(self, meta: bytes, payload: Any) -> int:
        return self.log.append(meta, payload)

    def commits(self) -> int:
        return self.log.commits

    def close(self) -> None:
        self.log.close()
        os.close(self.fd)

    @staticmethod
    def read_back(root: Path) -> int:
        data = memoryview((root / "journal.log").read_bytes())
        at = total = 0
        while at < len(data):
            _, body, nm, np_ = _HEAD.unpack_from(data, at)
            meta = data[at + _HEAD.size: at + _HEAD.size + nm]
            payload = data[at + _HEAD.size + nm: at + _HEAD.size + nm + np_]
            if zlib.crc32(payload, zlib.crc32(meta)) != body:
                raise RuntimeError("file record fails its CRC")
            at += _HEAD.size + nm + np_
            total += nm + np_
        return total


# ------------------------------------------------------------------------------------ run
def run_one(backend: str, writers: int, payloads: list[Any], batches: int, rows: int,
            base: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=base))
    total_bytes = batches * memoryview(payloads[0]).nbytes
    if backend == "sqlite":
        store: Any = _Sqlite(root)
    elif backend == "lmdb":
        store = _Lmdb(root, map_size=max(1 << 30, 4 * total_bytes))
    else:
        store = _File(root)
    for i in range(4):  # warm up: files created, first pages allocated
        store.append(b"warmup", payloads[i % len(payloads)])
    warm_commits = store.commits()
    lat: list[int] = []
    lock = threading.Lock()
    per = batches // writers

    def writer(w: int) -> None:
        mine = []
        for i in range(per):
            meta = f"{w}:{i}".encode()
            t = time.perf_counter_ns()
            store.append(meta, payloads[(w + i) % len(payloads)])
            mine.append(time.perf_counter_ns() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    t0 = time.perf_counter_ns()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = (time.perf_counter_ns() - t0) / 1e9
    commits = store.commits() - warm_commits
    store.close()
    n = per * writers
    nbytes = n * memoryview(payloads[0]).nbytes
    t1 = time.perf_counter_ns()
    read = type(store).read_back(root)
    read_s = (time.perf_counter_ns() - t1) / 1e9
    shutil.rmtree(root)
    return {"backend": backend, "writers": writers, "batches": n,
            "batches_per_s": n / wall, "Mrows_per_s": n * rows / wall / 1e6,
            "MB_per_s": nbytes / wall / 1e6, "commits": commits,
            "batches_per_commit": n / max(commits, 1), **stats_ms(lat),
            "read_MB_per_s": read / read_s / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-rows", type=int, default=65_536)
    ap.add_argument("--batches", type=int, default=96, help="batches per run, over all writers")
    ap.add_argument("--writers", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--backends", nargs="+", default=["sqlite", "lmdb", "file"],
                    choices=["sqlite", "lmdb", "file"])
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the median is shown")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", default=None,
                    help="output path (default bench/results/bench_journal.json)")
    args = ap.parse_args()
    rng = np.random.default_rng(42)
    payloads = [ipc_bytes(batch(rng, np.arange(k * args.batch_rows, (k + 1) * args.batch_rows)))
                for k in range(8)]
    mb = memoryview(payloads[0]).nbytes / 1e6
    base = Path(tempfile.mkdtemp(prefix="bench_journal-", dir=args.dir))
    rows: list[dict[str, Any]] = []
    try:
        for writers in args.writers:
            for backend in args.backends:
                runs = [run_one(backend, writers, payloads, args.batches, args.batch_rows, base)
                        for _ in range(args.repeat)]
                runs.sort(key=lambda r: r["batches_per_s"])
                rows.append(runs[len(runs) // 2])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in rows:
        ref = next((s for s in rows if s["backend"] == "sqlite" and s["writers"] == r["writers"]),
                   None)
        r["x_sqlite"] = r["batches_per_s"] / ref["batches_per_s"] if ref else None
    print_table(f"acknowledged (durable) appends of {args.batch_rows:,}-row batches "
                f"({mb:.2f} MB each as Arrow IPC), {args.batches} per run, median of "
                f"{args.repeat}", rows,
                ["backend", "writers", "batches_per_s", "Mrows_per_s", "MB_per_s", "x_sqlite",
                 "commits", "batches_per_commit", "median_ms", "mean_ms", "p99_ms",
                 "read_MB_per_s"])
    import sqlite3

    versions = {"sqlite": sqlite3.sqlite_version}
    if "lmdb" in args.backends:
        import lmdb

        versions["lmdb"] = ".".join(map(str, lmdb.version()))
    write_json("bench_journal", {"args": vars(args), "payload_MB": mb, "results": rows,
                                 **versions}, args.json)


if __name__ == "__main__":
    main()
