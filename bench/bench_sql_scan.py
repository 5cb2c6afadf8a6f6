"""bench_sql_scan: one-table queries in the server's query runner, this tree against an old one.

What :mod:`flight.sql.narrow` and the column-cut snapshots change is DuckDB's scan of a live
table, so this times ``QueryRunner.start`` plus reading the result, in-process (no gRPC:
the fixed cost of a call is ``bench_sql.py``'s), over a table wider than ``bench_sql``'s:
``id``, ``g``, ``x`` (int64), ``y`` (float64) and two string columns, ``sym`` (5,000
symbols) and ``note``. Queries (a new literal each time where there is one):

  point by a computed key    ``SELECT * ... WHERE x * 1000 + g = v`` (~100 rows; no index)
  symbol's rows              ``SELECT * ... WHERE sym = 'S0042'`` (~rows/5,000)
  symbol's two columns       ``SELECT id, y ... WHERE sym = ...``
  newest rows, same text     ``SELECT * ... WHERE id + 0 > rows - 100,000`` (past the
                             narrow pass's cap: its worst case, then remembered)
  half the rows, aggregated  ``SELECT count(*), sum(x) ... WHERE y < 0.5``

With ``--old-tree PATH`` the same measurement runs in a subprocess with PATH's code, the
trees taking turns ``--rounds`` times; each round prints p50 / mean / p99 ms per query, and
the end the per-query medians of new/old over the rounds.

Run: python bench/bench_sql_scan.py [--rows N] [--repeat N] [--old-tree PATH] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent

QUERIES = {
    "point by a computed key": "SELECT * FROM t WHERE x * 1000 + g = {v}",
    "symbol's rows": "SELECT * FROM t WHERE sym = '{s}'",
    "symbol's two columns": "SELECT id, y FROM t WHERE sym = '{s}'",
    "newest rows, same text": "SELECT * FROM t WHERE id + 0 > {newest}",
    "half the rows, aggregated": "SELECT count(*), sum(x) FROM t WHERE y < 0.5",
}


def measure(rows: int, repeat: int) -> dict[str, list[float]]:
    """Milliseconds per query kind, ``repeat`` of each, kinds taking turns."""
    from engine.graph import UpdateGraph
    from flight.sql.query import QueryRunner
    from flight.streams.registry import TableRegistry

    rng = np.random.default_rng(1)
    schema = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.int64()),
                        ("y", pa.float64()), ("sym", pa.string()), ("note", pa.string())])
    graph = UpdateGraph()
    registry = TableRegistry(graph)
    table = cast(Any, registry.create_source("t", schema, "append").table)
    syms = np.array([f"S{i:04d}" for i in range(5000)], dtype=object)
    step = 1 << 20
    for start in range(0, rows, step):
        n = min(step, rows - start)
        table.append(pa.table({
            "id": np.arange(start, start + n), "g": rng.integers(0, 1000, n),
            "x": rng.integers(0, 100, n), "y": rng.random(n),
            "sym": pa.array(syms[rng.integers(0, 5000, n)]),
            "note": pa.array(syms[rng.integers(0, 5000, n)])}, schema=schema))
    graph.run_cycle()
    runner = QueryRunner(registry)
    out: dict[str, list[float]] = {k: [] for k in QUERIES}
    try:
        for _ in range(repeat):
            for kind, text in QUERIES.items():
                sql = text.format(v=int(rng.integers(0, 100_000)), newest=rows - 100_000,
                                  s=f"S{int(rng.integers(0, 5000)):04d}")
                t0 = time.perf_counter()
                query = runner.start(sql)
                for _batch in runner.batches(query):
                    pass
                out[kind].append((time.perf_counter() - t0) * 1e3)
    finally:
        runner.shutdown()
        graph.stop()
    return out


def _stats(ms: list[float]) -> str:
    p99 = float(np.percentile(ms, 99))
    return f"{statistics.median(ms):8.2f} / {statistics.fmean(ms):8.2f} / {p99:8.2f}"


def _run_tree(tree: Path, rows: int, repeat: int) -> dict[str, list[float]]:
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
            f"import bench_sql_scan as b; print(json.dumps(b.measure({rows}, {repeat})))")
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    got: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=9, help="queries of each kind per round")
    ap.add_argument("--old-tree", type=Path, default=None, help="a checkout to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    trees = [("new", ROOT)] + ([("old", args.old_tree.resolve())] if args.old_tree else [])
    ratios: dict[str, list[float]] = {k: [] for k in QUERIES}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        got: dict[str, dict[str, list[float]]] = {}
        for name, tree in order:
            load = os.getloadavg()[0]
            got[name] = _run_tree(tree, args.rows, args.repeat)
            print(f"round {r + 1} {name} ({tree}, load {load:.1f}); ms p50 / mean / p99")
            for kind, ms in got[name].items():
                print(f"  {kind:28s} {_stats(ms)}")
        if "old" in got:
            for kind in QUERIES:
                ratios[kind].append(statistics.median(got["new"][kind])
                                    / statistics.median(got["old"][kind]))
    if args.old_tree:
        print("new / old, p50 per round:")
        for kind, xs in ratios.items():
            print(f"  {kind:28s} " + " ".join(f"{x:.2f}" for x in xs)
                  + f"  (median {statistics.median(xs):.2f})")


if __name__ == "__main__":
    main()
