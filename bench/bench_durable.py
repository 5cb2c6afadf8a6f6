"""bench_durable — what durable tables cost (issue #16), durable against ``--in-memory``.

Sections, each in a fresh spawned server process (so the client and the server do not
share a GIL):

* **ingest**: DoPut append of ``--append-rows`` rows in 64K-row batches, and upsert of
  ``--upsert-rows`` keys (insert, then update), acknowledged and applied rows/s, the same
  run durable and in memory (target: durable >= 0.5x in memory);
* **restart**: a keyed table of ``--restart-rows`` rows (4 columns) written, the server
  stopped cleanly (a checkpoint) or killed (journal only), then the seconds until a new
  server serves it again (target: <= 10 s at 10M rows);
* **cycles**: the W1 chain of bench_ops.py (where, update, sort, agg_by) over a durable
  keyed table of ``--w1-rows`` rows with 1,000 modifies + 1,000 appends journaled per
  cycle: cycle p50/p99 with checkpoints written back to back meanwhile, and without
  (target: p99 with <= 2x without);
* **disk**: bytes per million rows in a checkpoint and in the journal, and how much the
  journal grew between two checkpoints of the cycles section.

Run: python bench/bench_durable.py [--append-rows 4000000] [--upsert-rows 1000000]
     [--restart-rows 10000000] [--w1-rows 1000000] [--json PATH]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import SCHEMA, batch, print_table, stats_ms, write_json  # noqa: E402
from engine.errors import TableNotFound  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.ops.aggregate import agg  # noqa: E402
from flight.ingest.parts import Part  # noqa: E402
from flight.pb import flight_pb2 as pb  # noqa: E402
from flight.server import ServerConfig, TicktableServer  # noqa: E402

BATCH = 65_536


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------ the server process
def _serve(conn: Any, data_dir: str | None, interval: float) -> None:
    graph = UpdateGraph()
    cfg = ServerConfig(data_dir=Path(data_dir) if data_dir else None,
                       checkpoint_seconds=3600, checkpoint_bytes=1 << 40)
    t0 = time.perf_counter()
    server = TicktableServer(graph, cfg).start()
    started = time.perf_counter() - t0
    cond = threading.Condition()
    applied: dict[str, Any] = {"name": None, "touched": 0, "at": []}

    def on_end(step: int) -> None:
        name = applied["name"]
        if name is None:
            return
        try:
            u = server.registry.get(name).table.cycle_update
        except TableNotFound:  # dropped after its round, before the next watch
            return
        if u is None:
            return
        with cond:
            applied["touched"] += len(u.added) + len(u.modified)
            applied["at"].append((time.perf_counter(), applied["touched"]))
            cond.notify_all()

    graph.add_terminal_listener(on_end)
    graph.start(interval)
    conn.send((server.location, started))
    while True:
        cmd = conn.recv()
        if cmd[0] == "watch":
            with cond:
                applied.update(name=cmd[1], touched=0, at=[])
            conn.send("ok")
        elif cmd[0] == "wait":  # until `rows` rows were applied; when that happened
            rows = cmd[1]
            with cond:
                cond.wait_for(lambda rows=rows: applied["touched"] >= rows, 300)
                hit = next((t for t, c in applied["at"] if c >= rows), None)
            conn.send(hit)
        elif cmd[0] == "threads":  # native id -> name (Python's names are not the OS's)
            conn.send({t.native_id: t.name for t in threading.enumerate()})
        elif cmd[0] == "size":
            conn.send(server.registry.get(cmd[1]).table.size)
        elif cmd[0] == "stop":
            graph.stop()
            server.shutdown()
            conn.send("bye")
            return


class _Server:
    def __init__(self, data_dir: Path | None, interval: float = 0.05) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, str(data_dir) if data_dir else None,
                                                     interval), daemon=True)
        t0 = time.perf_counter()
        self.proc.start()
        self.location, self.started = self.conn.recv()
        self.to_serving = time.perf_counter() - t0  # process start, imports, recovery, bind
        self.client = fl.connect(self.location)

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def create(self, name: str, kind: str) -> None:
        req = pb.CreateTableRequest(name=name, schema=SCHEMA.serialize().to_pybytes(),
                                    kind=pb.TABLE_KIND_KEYED if kind == "keyed"
                                    else pb.TABLE_KIND_APPEND, keys=["Key"] if kind == "keyed" else [])
        list(self.client.do_action(fl.Action("create_table", req.SerializeToString())))

    def put(self, name: str, batches: list[pa.RecordBatch], mode: int) -> None:
        writer, reader = self.client.do_put(fl.FlightDescriptor.for_path(name), SCHEMA)
        meta = pa.py_buffer(pb.PutRequest(mode=mode).SerializeToString())
        for i, b in enumerate(batches):
            if i == 0:
                writer.write_with_metadata(b, meta)
            else:
                writer.write_batch(b)
        writer.done_writing()
        while reader.read() is not None:
            pass
        writer.close()

    def drop(self, name: str) -> None:
        req = pb.DropTableRequest(name=name)
        list(self.client.do_action(fl.Action("drop_table", req.SerializeToString())))

    def stop(self, *, kill: bool = False) -> None:
        self.client.close()
        if kill:
            self.proc.kill()
        else:
            self.call("stop")
        self.proc.join()


def _batches(rng: np.random.Generator, keys: np.ndarray) -> list[pa.RecordBatch]:
    t = batch(rng, keys)
    return [b for s in range(0, keys.size, BATCH) for b in t.slice(s, BATCH).to_batches()]


# ------------------------------------------------------------------ sections
def bench_ingest(append_rows: int, upsert_rows: int, repeat: int) -> list[dict[str, Any]]:
    """Both servers up at once, their rounds interleaved (in memory, durable, in memory, ...)
    so that drift of the machine hits both alike; each round's tables are dropped after it,
    so every round starts from the same memory."""
    rng = np.random.default_rng(3)
    app = _batches(rng, np.arange(append_rows))
    ins = _batches(rng, rng.permutation(upsert_rows))
    upd = _batches(rng, rng.permutation(upsert_rows))
    modes = ("in-memory", "durable")
    cases = (("append", app, pb.PUT_MODE_APPEND, append_rows),
             ("upsert insert", ins, pb.PUT_MODE_UPSERT, upsert_rows),
             ("upsert update", upd, pb.PUT_MODE_UPSERT, upsert_rows))
    tmp = Path(tempfile.mkdtemp(prefix="tt-bench-"))
    servers = {m: _Server(tmp / "data" if m == "durable" else None) for m in modes}
    times: dict[tuple[str, str], tuple[list[float], list[float]]] = {
        (m, c[0]): ([], []) for m in modes for c in cases}
    journal_bytes = 0
    try:
        for i in range(repeat + 1):  # round 0 warms up and is dropped
            for mode in modes:
                srv = servers[mode]
                for case, batches, put_mode, rows in cases:
                    name = f"{case.split()[0]}{i}"
                    if case != "upsert update":  # the update phase rewrites the insert's table
                        srv.create(name, "append" if case == "append" else "keyed")
                    srv.call("watch", name)
                    t0 = time.perf_counter()
                    srv.put(name, batches, put_mode)
                    t1 = time.perf_counter()
                    hit = srv.call("wait", rows)
                    if i:
                        times[mode, case][0].append(t1 - t0)
                        times[mode, case][1].append(hit - t0)
                    if mode == "durable" and case == "upsert update":
                        journal_bytes = max(journal_bytes, _dir_bytes(tmp / "data"))
                    if case != "upsert insert":
                        srv.drop(name)
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = []
    for (mode, case), (acked, applied) in times.items():
        rows = next(c[3] for c in cases if c[0] == case)
        out.append({"mode": mode, "case": case, "rows": rows,
                    "acked_rows_per_s": rows / float(np.median(acked)),
                    "acked_rows_per_s_mean": rows / float(np.mean(acked)),
                    "applied_rows_per_s": rows / float(np.median(applied))})
    out[-1]["journal_bytes"] = journal_bytes
    for row in out:
        mem = next(r for r in out if r["mode"] == "in-memory" and r["case"] == row["case"])
        row["x_in_memory_acked"] = row["acked_rows_per_s"] / mem["acked_rows_per_s"]
        row["x_in_memory_applied"] = row["applied_rows_per_s"] / mem["applied_rows_per_s"]
    return out


def bench_restart(rows: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(5)
    out = []
    for how in ("clean (checkpoint)", "killed (journal)"):
        tmp = Path(tempfile.mkdtemp(prefix="tt-bench-"))
        try:
            srv = _Server(tmp / "data")
            srv.create("big", "keyed")
            srv.call("watch", "big")
            for s in range(0, rows, 1 << 20):  # a million keys per DoPut
                srv.put("big", _batches(rng, np.arange(s, min(rows, s + (1 << 20)))),
                        pb.PUT_MODE_UPSERT)
            srv.call("wait", rows)
            srv.stop(kill=how.startswith("killed"))
            disk = _dir_bytes(tmp / "data")
            srv = _Server(tmp / "data")
            size = srv.call("size", "big")
            assert size == rows, (size, rows)
            out.append({"restart": how, "rows": rows, "recovery_s": srv.started,
                        "process_to_serving_s": srv.to_serving, "disk_bytes": disk,
                        "disk_bytes_per_million_rows": disk / (rows / 1e6)})
            srv.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def bench_cycles(rows: int, cycles: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(11)
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="tt-bench-"))
    try:
        graph = UpdateGraph()
        server = TicktableServer(graph, ServerConfig(data_dir=tmp / "data",
                                                     checkpoint_seconds=3600,
                                                     checkpoint_bytes=1 << 40)).start()
        d = server.durability
        entry = d.create_table("src", SCHEMA, "keyed", keys=["Key"], capacity=0,
                               if_not_exists=False)
        src = entry.table
        d.apply(entry, [Part("src", src.check_batch(batch(rng, np.arange(rows)), "upsert"))])
        graph.run_cycle()
        f = src.where(pc.field("Price") > 50)
        u = f.update(Notional=pc.field("Price") * pc.field("Qty"))
        u.sort("Notional")
        u.agg_by([agg.sum("Notional"), agg.count(), agg.mean("Price")], by="Sym")
        next_key = rows
        for label in ("without checkpoints", "checkpoints back to back"):
            stop = threading.Event()
            sizes: list[tuple[int, int]] = []

            def checkpoints(stop: threading.Event = stop, sizes: list = sizes) -> None:
                while not stop.is_set():
                    before = d.journal.size_bytes() if d.journal else 0
                    d.checkpoint()
                    sizes.append((before, _dir_bytes(tmp / "data" / "checkpoints")))

            worker = threading.Thread(target=checkpoints, daemon=True)
            if label.startswith("checkpoints"):
                worker.start()
            samples = []
            for _ in range(cycles):
                mod = rng.integers(0, rows, 1000)
                new = np.arange(next_key, next_key + 1000)
                next_key += 1000
                d.apply(entry, [Part("src", src.check_batch(batch(rng, np.concatenate((mod, new))),
                                                              "upsert"))])
                t0 = time.perf_counter_ns()
                graph.run_cycle()
                samples.append(time.perf_counter_ns() - t0)
            stop.set()
            if worker.is_alive():
                worker.join()
            row = {"case": label, "rows": rows, "cycles": cycles, **stats_ms(samples)}
            if sizes:
                row["checkpoints"] = len(sizes)
                row["journal_growth_between_checkpoints_bytes"] = float(np.median([s[0] for s in sizes]))
                row["checkpoint_bytes_per_million_rows"] = sizes[-1][1] / (src.size / 1e6)
            out.append(row)
        server.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = out[0]["p99_ms"]
    for row in out:
        row["p99_x_without"] = row["p99_ms"] / base
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--append-rows", type=int, default=4_000_000)
    ap.add_argument("--upsert-rows", type=int, default=1_000_000)
    ap.add_argument("--restart-rows", type=int, default=10_000_000)
    ap.add_argument("--w1-rows", type=int, default=1_000_000)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=["ingest", "restart", "cycles"],
                    default=["ingest", "restart", "cycles"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {"args": vars(args)}
    if "ingest" in args.only:
        rows = bench_ingest(args.append_rows, args.upsert_rows, args.repeat)
        print_table("ingest: DoPut rows/s, durable vs in memory (target >= 0.5x)", rows,
                    ["mode", "case", "rows", "acked_rows_per_s", "applied_rows_per_s",
                     "x_in_memory_acked", "x_in_memory_applied"])
        result["ingest"] = rows
    if "restart" in args.only:
        rows = bench_restart(args.restart_rows)
        print_table("restart: seconds to serving again (target <= 10 s at 10M rows)", rows,
                    ["restart", "rows", "recovery_s", "process_to_serving_s",
                     "disk_bytes_per_million_rows"])
        result["restart"] = rows
    if "cycles" in args.only:
        rows = bench_cycles(args.w1_rows, args.cycles)
        print_table("W1 cycles with and without checkpoints (target p99 <= 2x)", rows,
                    ["case", "rows", "median_ms", "mean_ms", "p99_ms", "p99_x_without",
                     "checkpoints", "journal_growth_between_checkpoints_bytes",
                     "checkpoint_bytes_per_million_rows"])
        result["cycles"] = rows
    write_json("bench_durable", result, args.json)


if __name__ == "__main__":
    main()
