"""bench_demo: the CPU of one cycle of ``make run``'s demo, whole and per table (issue #39 item 7).

The demo of ``ticktable/_demo.py`` (``make run``): a keyed ``quotes`` table of 8 symbols with 1-3 rows
upserted a cycle (``ticktable._demo.ticker``), ``board = quotes.update(Spread=...).sort("Bid",
descending=True)`` and ``stats = quotes.agg_by(...)`` (``demo_tables``). After a warm-up,
each cycle (the tick that stages the rows, then ``graph.run_cycle()``) is timed by the
thread's CPU (``time.thread_time_ns``: what this thread spent, whatever else runs), and so
is each table's part of it: the source's update and each listener. The goal is a cycle of
at most 1 ms; most of it is a fixed cost per table and call, not rows.

Run: python bench/bench_demo.py [--cycles 3000] [--warmup 300] [--seed 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from ticktable._demo import QUOTES, demo_tables, ticker  # noqa: E402


class _Part:
    """Thread CPU of one callable, summed over the cycle (wrapped on its instance)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.inner = getattr(owner, name)
        self.spent = 0
        setattr(owner, name, self)

    def __call__(self, *args: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return self.inner(*args)
        finally:
            self.spent += time.thread_time_ns() - t

    def take(self) -> int:
        v, self.spent = self.spent, 0
        return v


def run(cycles: int, warmup: int, seed: int) -> list[dict[str, Any]]:
    g = UpdateGraph()
    quotes = g.keyed_table(QUOTES, "Sym", name="quotes")
    tick = ticker(quotes, seed)
    board, stats = demo_tables(quotes)
    select = board.listener.parent
    parts = {"source (keyed)": _Part(quotes, "_compute_update"),
             "update(Spread)": _Part(select.listener, "on_update"),
             "sort(Bid)": _Part(board.listener, "on_update"),
             "agg_by": _Part(stats.listener, "on_update")}
    samples: dict[str, list[int]] = {"cycle incl. tick": [], "tick": [], **{k: [] for k in parts}}
    for c in range(warmup + cycles):
        t0 = time.thread_time_ns()
        tick()
        t1 = time.thread_time_ns()
        g.run_cycle()
        t2 = time.thread_time_ns()
        spent = {k: p.take() for k, p in parts.items()}
        if c >= warmup:
            samples["cycle incl. tick"].append(t2 - t0)
            samples["tick"].append(t1 - t0)
            for k, v in spent.items():
                samples[k].append(v)
    return [{"part": k, **stats_ms(v)} for k, v in samples.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_demo.json)")
    args = ap.parse_args()
    rows = run(args.cycles, args.warmup, args.seed)
    print_table(f"make run's demo: thread CPU per cycle, {args.cycles} cycles (ms)",
                [{"part": r["part"], "median": r["median_ms"], "mean": r["mean_ms"], "p99": r["p99_ms"]}
                 for r in rows], ["part", "median", "mean", "p99"])
    write_json("bench_demo", {"cycles": args.cycles, "warmup": args.warmup, "seed": args.seed,
                              "results": rows}, args.json)


if __name__ == "__main__":
    main()
