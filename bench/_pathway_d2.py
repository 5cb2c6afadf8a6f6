"""D2 on Pathway, the peer (run with a Python that has ``pathway`` and numpy, never a
Ticktable dependency): the same graph, seeds and changes as ``bench_differential.py --only d2``
(:mod:`bench._d2_graph`), reachability from node 0 with ``pw.iterate``; per step, the time
from sending the step's edge changes (one commit) to the end of that time at the output
(``on_time_end`` of a subscription), after ``--warmup`` steps. Checked against BFS at the end.
Prints one JSON line per size.

Run: /path/to/pathway-venv/bin/python bench/_pathway_d2.py [--sizes 10000 100000] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pathway as pw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _d2_graph as d2_graph  # noqa: E402


class _Edge(pw.Schema):
    node: int = pw.column_definition(primary_key=True)
    dst: int = pw.column_definition(primary_key=True)


class _Node(pw.Schema):
    node: int


def _stats(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns, dtype=float) / 1e6
    return {"median_ms": float(np.median(ms)), "mean_ms": float(ms.mean()),
            "p99_ms": float(np.percentile(ms, 99))}


def run(e: int, n_steps: int, warmup: int, change: int) -> dict:
    rng, n_nodes, code, edges = d2_graph.initial(e)
    closed = threading.Event()
    wall: list[int] = []
    cpu: list[int] = []
    reached: dict[int, int] = {}

    class Edges(pw.io.python.ConnectorSubject):
        def run(self) -> None:
            for c in code.tolist():
                self.next(node=c // n_nodes, dst=c % n_nodes)
            closed.clear()
            self.commit()
            closed.wait()
            for step, (add, rem) in enumerate(d2_graph.steps(rng, n_nodes, edges, warmup + n_steps, change)):
                closed.clear()
                t, c0 = time.perf_counter_ns(), time.process_time_ns()
                for a in add.tolist():
                    self.next(node=a // n_nodes, dst=a % n_nodes)
                for r in rem.tolist():
                    self.delete(node=r // n_nodes, dst=r % n_nodes)
                self.commit()
                closed.wait()
                if step >= warmup:
                    wall.append(time.perf_counter_ns() - t)
                    cpu.append(time.process_time_ns() - c0)

    ecoll = pw.io.python.read(Edges(), schema=_Edge, autocommit_duration_ms=1)
    roots = pw.debug.table_from_rows(_Node, [(0,)])

    def body(reach: pw.Table, edges: pw.Table) -> dict[str, pw.Table]:
        nxt = edges.join(reach, edges.node == reach.node).select(node=edges.dst)
        both = pw.Table.concat_reindex(reach, nxt)
        return {"reach": both.groupby(both.node).reduce(node=both.node)}

    reach = pw.iterate(body, reach=pw.iterate_universe(roots), edges=ecoll)["reach"]

    # on_time_end fires only for times at which the sink changed: a stamp that changes every
    # step (a sum over the edges) shares the sink with the result, so each step ends once
    stamp = ecoll.reduce(node=pw.reducers.sum(ecoll.node * 7919 + ecoll.dst))
    out = pw.Table.concat_reindex(reach.select(reach.node, tag=0), stamp.select(stamp.node, tag=1))

    def on_change(key: object, row: dict, time: int, is_addition: bool) -> None:
        if row["tag"] == 0:
            n = row["node"]
            reached[n] = reached.get(n, 0) + (1 if is_addition else -1)

    pw.io.subscribe(out, on_change=on_change, on_time_end=lambda t: closed.set())
    t0 = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    total_s = time.perf_counter() - t0
    got = np.sort(np.array([n for n, w in reached.items() if w > 0], dtype=np.int64))
    want = d2_graph.reachable(edges, n_nodes)
    if not np.array_equal(got, want):
        raise AssertionError(f"Pathway D2 E={e}: reachable set differs from BFS ({got.size} vs {want.size})")
    sw, sc = _stats(wall), _stats(cpu)
    return {"edges": e, "reached": int(got.size), "steps": len(wall), "total_s": total_s,
            "step_median_ms": sw["median_ms"], "step_mean_ms": sw["mean_ms"], "step_p99_ms": sw["p99_ms"],
            "cpu_median_ms": sc["median_ms"], "cpu_mean_ms": sc["mean_ms"], "cpu_p99_ms": sc["p99_ms"],
            "pathway": pw.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--d2-change", type=int, default=10)
    args = ap.parse_args()
    for e in args.sizes:  # one pw.run per size
        print(json.dumps(run(e, args.steps, args.warmup, args.d2_change)), flush=True)


if __name__ == "__main__":
    main()
