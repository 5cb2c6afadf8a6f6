"""bench_fixed: what every cycle pays whatever its size (issue #39 item 7), 10 vs 100 tables.

A :class:`~flight.server.TicktableServer` in this process (metrics on; in memory, or durable
in a temporary directory) holds ``T`` tables: ``T/2`` keyed sources of 100 rows and, over
each, a ``where``. Cycles are run by this process's thread (``graph.run_cycle()``), timed
by that thread's CPU (``time.thread_time``: what the cycle's own thread spent, whatever
else runs) and by the wall clock, in two kinds:

* **idle**: nothing changed: the cost of looking at every table;
* **one row**: one source upserts one row, so one source and one derived table change.

Each with and without one subscription per table, held by a subscriber in a spawned
process (``tt.connect(...).subscribe`` of every table), so its reading costs this process
nothing: the cycle then builds the changed tables' messages (the fan-out builds them on the
cycle's thread). Sizes side by side, with the ratio of 100 tables' median to 10's: a cycle's
fixed cost should not grow with tables that did not change.

Run: python bench/bench_fixed.py [--tables 10 100] [--cycles 300] [--json PATH]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])
ROWS = 100


def _subscriber(location: str, names: list[str], ready: Any, stop: Any) -> None:
    """A spawned process holding one subscription per table until ``stop`` is set."""
    import ticktable as tt

    client = tt.connect(location)
    lives = [client.subscribe(n) for n in names]
    for live in lives:
        live.wait_for(timeout=60)  # its first snapshot
    ready.set()
    stop.wait(600)
    for live in lives:
        live.close()
    client.close()


def _server(tables: int, data_dir: str | None) -> tuple[Any, Any, list[Any]]:
    from engine.graph import UpdateGraph
    from flight.server import ServerConfig, TicktableServer
    from flight.wire import TableKind

    graph = UpdateGraph()
    cfg = ServerConfig(metrics_port=0, data_dir=Path(data_dir) if data_dir else None)
    srv = TicktableServer(graph, cfg).start()
    rng = np.random.default_rng(tables)
    sources = []
    for i in range(tables // 2):
        t = srv.registry.create_source(f"s{i}", KV, "keyed", keys=["k"]).table
        t.upsert(pa.table({"k": np.arange(ROWS), "v": rng.random(ROWS)}, schema=KV))
        srv.registry.add(f"d{i}", t.where(pc.field("v") > 0.5), TableKind.DERIVED, parents=[f"s{i}"])
        sources.append(t)
    graph.run_cycle()
    return graph, srv, sources


def _cycles(graph: Any, source: Any, change: bool, cycles: int) -> tuple[list[int], list[int]]:
    cpu, wall = [], []
    for i in range(cycles + 10):
        if change:
            source.upsert(pa.table({"k": [i % ROWS], "v": [float(i)]}, schema=KV))
        c, w = time.thread_time_ns(), time.perf_counter_ns()
        graph.run_cycle()
        if i >= 10:
            cpu.append(time.thread_time_ns() - c)
            wall.append(time.perf_counter_ns() - w)
    return cpu, wall


def run(tables: int, durable: bool, subscribed: bool, cycles: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        graph, srv, sources = _server(tables, tmp if durable else None)
        proc = stop = None
        try:
            if subscribed:
                ctx = mp.get_context("spawn")
                ready, stop = ctx.Event(), ctx.Event()
                proc = ctx.Process(target=_subscriber, daemon=True,
                                   args=(srv.location, srv.registry.names(), ready, stop))
                proc.start()
                if not ready.wait(120):
                    raise RuntimeError("the subscriber process did not subscribe in 120 s")
            out = []
            for kind, change in (("idle", False), ("one row", True)):
                cpu, wall = _cycles(graph, sources[0], change, cycles)
                c, w = stats_ms(cpu), stats_ms(wall)
                out.append({"tables": tables, "server": "durable" if durable else "in memory",
                            "subscribers": tables if subscribed else 0, "cycle": kind,
                            "cpu_median_ms": c["median_ms"], "cpu_mean_ms": c["mean_ms"],
                            "cpu_p99_ms": c["p99_ms"], "wall_median_ms": w["median_ms"],
                            "wall_p99_ms": w["p99_ms"], "n": c["n"]})
            return out
        finally:
            if stop is not None:
                stop.set()
            if proc is not None:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
            srv.shutdown()


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_fixed.json)")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for durable in (False, True):
        for subscribed in (False, True):
            for n in args.tables:
                rows += run(n, durable, subscribed, args.cycles)
    smallest = min(args.tables)
    base = {(r["server"], r["subscribers"] > 0, r["cycle"]): r["cpu_median_ms"]
            for r in rows if r["tables"] == smallest}
    for r in rows:
        b = base[(r["server"], r["subscribers"] > 0, r["cycle"])]
        r["x_smallest"] = r["cpu_median_ms"] / b if b else None
    print_table(f"fixed cost per cycle, the cycle thread's CPU and wall (ms), {args.cycles} cycles each; "
                f"x_smallest = CPU median / {smallest} tables'", rows,
                ["server", "subscribers", "tables", "cycle", "cpu_median_ms", "cpu_mean_ms", "cpu_p99_ms",
                 "wall_median_ms", "wall_p99_ms", "x_smallest"])
    write_json("bench_fixed", {"args": vars(args), "rows": rows}, args.json)
    return rows


if __name__ == "__main__":
    main()
