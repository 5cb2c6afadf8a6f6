"""bench_core: the update-model core at 1M vs 10M rows (issue 2's "must show").

Measures, sizes side by side with the ratio to the smallest:
  * keyed upsert cycles of --change rows (90% modifies of existing keys, 10% new keys)
  * append cycles of --change rows of (int64, string, float64, int64): rows/s, and the
    slowest cycle (the one whose append outgrows the columns' capacity)
  * compose of two large updates (adds, removes, modifies and shifts)
  * RowSet.positions_of for 100k keys

Run: python bench/bench_core.py [--sizes 1000000 10000000] [--change 10000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import SCHEMA, batch, print_table, stats_ms, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.rowset import RowSet, RowSetShiftData  # noqa: E402
from engine.update import TableUpdate, compose  # noqa: E402


def bench_keyed(n: int, change: int, repeat: int, rng: np.random.Generator) -> dict:
    g = UpdateGraph()
    t = g.keyed_table(SCHEMA, "Key")
    t0 = time.perf_counter()
    step = 1_000_000
    for s in range(0, n, step):
        t.upsert(batch(rng, np.arange(s, min(n, s + step))))
        g.run_cycle()
    load = time.perf_counter() - t0
    next_new = n
    samples = []
    for i in range(repeat + 3):
        n_new = change // 10
        keys = np.concatenate((rng.choice(next_new, change - n_new, replace=False) if i == 0 else
                               rng.integers(0, next_new, change - n_new),
                               np.arange(next_new, next_new + n_new)))
        next_new += n_new
        t.upsert(batch(rng, keys))
        t_start = time.perf_counter_ns()
        g.run_cycle()
        if i >= 3:  # warm-up cycles dropped
            samples.append(time.perf_counter_ns() - t_start)
    return {"size": n, "load_s": load, **stats_ms(samples)}


def bench_append(total: int, change: int, rng: np.random.Generator) -> dict:
    g = UpdateGraph()
    t = g.append_only_table(SCHEMA)
    batches = [batch(rng, np.arange(i, i + change)) for i in range(0, 20 * change, change)]
    samples = []
    t0 = time.perf_counter()
    for i in range(total // change):
        t.append(batches[i % len(batches)])
        s = time.perf_counter_ns()
        g.run_cycle()
        samples.append(time.perf_counter_ns() - s)
    wall = time.perf_counter() - t0
    assert t.size == total
    return {"size": total, "rows_per_s": total / wall, "cycle_rows_per_s": total / (sum(samples) / 1e9),
            **stats_ms(samples), "max_ms": max(samples) / 1e6}


def bench_compose(n: int, repeat: int, rng: np.random.Generator) -> dict:
    prev = RowSet.from_range(0, n)
    k = n // 10
    samples = []
    for _ in range(repeat):
        removed = RowSet.from_keys(rng.choice(n, k, replace=False))
        modified = RowSet.from_keys(rng.choice(n, k, replace=False)) - removed
        u1 = TableUpdate.of(added=RowSet.from_range(n, n + k), removed=removed, modified=modified,
                            modified_columns=["Price"])
        mid = u1.apply(prev)
        # u2 opens a gap in the middle: every key above n/2 moves up by 10
        u2 = TableUpdate.of(shifted=RowSetShiftData.from_arrays([n // 2], [n + k], [10]),
                            added=RowSet.from_range(n // 2, n // 2 + 10),
                            modified=RowSet.from_keys(rng.choice(n // 2, k, replace=False)) & mid,
                            modified_columns=["Qty"])
        samples.append(time_ns(lambda u1=u1, u2=u2: compose(u1, u2, prev)))
    return {"size": n, "update_rows": 3 * k, **stats_ms(samples)}


def bench_positions(n: int, repeat: int, rng: np.random.Generator) -> dict:
    rs = RowSet.from_keys(np.sort(rng.choice(3 * n, n, replace=False)), assume_sorted=False)
    probe = rs.keys()[rng.integers(0, n, 100_000)]
    samples = []
    cold = time_ns(lambda: RowSet(rs.bitmap).positions_of(probe))  # includes to_array once
    for _ in range(repeat):
        samples.append(time_ns(lambda: rs.positions_of(probe)))
    return {"size": n, "cold_ms": cold / 1e6, **stats_ms(samples)}


def time_ns(fn) -> int:
    t = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t


def with_ratio(rows: list[dict], key: str = "median_ms") -> list[dict]:
    base = rows[0][key]
    for r in rows:
        r["ratio"] = r[key] / base if base else float("nan")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--change", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--append-total", type=int, default=10_000_000)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_core.json)")
    args = ap.parse_args()
    rng = np.random.default_rng(42)

    keyed = with_ratio([bench_keyed(n, args.change, args.repeat, rng) for n in args.sizes])
    print_table(f"keyed upsert cycle, {args.change:,} upserts (90% modify, 10% new)", keyed,
                ["size", "load_s", "median_ms", "mean_ms", "p99_ms", "ratio"])
    app = bench_append(args.append_total, args.change, rng)
    print_table(f"append {args.append_total:,} rows in {args.change:,}-row cycles", [app],
                ["size", "rows_per_s", "cycle_rows_per_s", "median_ms", "mean_ms", "p99_ms", "max_ms"])
    comp = with_ratio([bench_compose(n, max(5, args.repeat // 3), rng) for n in args.sizes])
    print_table("compose(u1, u2) with 10% removes, 10% modifies, 10% adds, a shift", comp,
                ["size", "update_rows", "median_ms", "mean_ms", "p99_ms", "ratio"])
    pos = with_ratio([bench_positions(n, args.repeat, rng) for n in args.sizes])
    print_table("positions_of(100k keys)", pos, ["size", "cold_ms", "median_ms", "mean_ms", "p99_ms", "ratio"])
    write_json("bench_core", {"args": vars(args), "keyed": keyed, "append": app, "compose": comp,
                              "positions_of": pos}, args.json)


if __name__ == "__main__":
    main()
