"""bench_coded: a cycle of a few upserts into a keyed table whose string column holds many
distinct values, against another tree in turns (issue #39 item 7: a cycle's cost follows
its change).

A keyed table (``Id`` int64 key, ``Name`` string, ``Px`` float64) of 10,000 rows whose
``Name`` column holds ``D`` distinct values (a coded column: each distinct value stored
once, rows point at it). Each cycle upserts 5 existing ids with names drawn from the ``D``
(some new to their rows, so the column is written), then ``graph.run_cycle()``, timed by
the thread's CPU. Also timed alone: ``ArrowColumnSource.encode`` of 5 values of the ``D``,
what the write costs the column. ``D`` is 8, 100, 1,000 and 4,000 (the column codes up to
``CODED_MAX``, 4,096). A cost that follows the change is flat across ``D``.

Each tree runs in a child process under its own ``PYTHONPATH``, this tree's and ``--vs``'s
in turns (A B B A ...), ``--rounds`` times; medians over rounds of each child's median.

Run: python bench/bench_coded.py [--vs OTHER_TREE] [--rounds 4] [--cycles 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
if "--child" not in sys.argv:  # a child measures the tree on its PYTHONPATH
    sys.path.insert(0, str(HERE))

from bench._common import print_table, write_json  # noqa: E402

DISTINCT = (8, 100, 1_000, 4_000)
ROWS = 10_000
WRITES = 5


def child(cycles: int) -> dict[str, Any]:
    """One tree's figures, in this process (the tree is the one on ``sys.path``)."""
    import numpy as np
    import pyarrow as pa

    import engine
    from engine.graph import UpdateGraph

    assert Path(engine.__file__).resolve().parent.parent == Path(os.environ["PYTHONPATH"]).resolve()
    out: dict[str, Any] = {}
    for d in DISTINCT:
        rng = np.random.default_rng(d)
        names = np.array([f"name-{i:05d}" for i in range(d)], dtype=object)
        g = UpdateGraph()
        t = g.keyed_table(pa.schema([("Id", pa.int64()), ("Name", pa.string()), ("Px", pa.float64())]), "Id")
        t.upsert({"Id": np.arange(ROWS), "Name": names[np.arange(ROWS) % d], "Px": rng.random(ROWS)})
        g.run_cycle()
        batches = [{"Id": rng.choice(ROWS, WRITES, replace=False), "Name": names[rng.integers(0, d, WRITES)],
                    "Px": rng.random(WRITES)} for _ in range(cycles)]
        spent = []
        for b in batches:
            t.upsert(b)
            t0 = time.thread_time_ns()
            g.run_cycle()
            spent.append(time.thread_time_ns() - t0)
        src = t._storage["Name"]
        assert src.coded, "the column stopped coding"
        probe = [pa.array(names[rng.integers(0, d, WRITES)].tolist(), pa.string()) for _ in range(cycles)]
        enc = []
        for p in probe:
            t0 = time.perf_counter_ns()
            src.encode(p)
            enc.append(time.perf_counter_ns() - t0)
        c = np.array(spent[cycles // 10:]) / 1e3
        e = np.array(enc[cycles // 10:]) / 1e3
        out[str(d)] = {"cycle_us": [float(np.median(c)), float(c.mean()), float(np.percentile(c, 99))],
                       "encode_us": [float(np.median(e)), float(e.mean()), float(np.percentile(e, 99))]}
    return out


def _run_tree(root: Path, cycles: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, str(HERE / "bench" / "bench_coded.py"), "--child", "--cycles", str(cycles)]
    done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(other: Path | None, rounds: int, cycles: int) -> list[dict[str, Any]]:
    trees = {"this": HERE} if other is None else {"this": HERE, "vs": other}
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            got[name].append(_run_tree(trees[name], cycles))
    rows = []
    for d in DISTINCT:
        row: dict[str, Any] = {"distinct": d}
        for name in trees:
            for what in ("cycle_us", "encode_us"):
                per_round = sorted(x[str(d)][what] for x in got[name])
                mid = per_round[len(per_round) // 2]
                row[f"{name}_{what}"] = mid  # the round of the median median: median, mean, p99
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vs", type=Path, default=None, help="another checkout of ticktable")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_coded.json)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.cycles)))
        return
    rows = run(args.vs.resolve() if args.vs else None, args.rounds, args.cycles)
    table = []
    for r in rows:
        for name in ("this", "vs"):
            if f"{name}_cycle_us" not in r:
                continue
            c, e = r[f"{name}_cycle_us"], r[f"{name}_encode_us"]
            table.append({"distinct": r["distinct"], "tree": name,
                          "cycle p50/mean/p99 us": f"{c[0]:.0f} / {c[1]:.0f} / {c[2]:.0f}",
                          "encode p50/mean/p99 us": f"{e[0]:.1f} / {e[1]:.1f} / {e[2]:.1f}"})
    print_table(f"{WRITES} upserts a cycle into {ROWS:,} rows, a string column of D distinct values "
                f"(thread CPU; medians of {args.rounds} rounds)", table,
                ["distinct", "tree", "cycle p50/mean/p99 us", "encode p50/mean/p99 us"])
    write_json("bench_coded", {"vs": str(args.vs) if args.vs else None, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
