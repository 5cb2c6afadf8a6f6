"""Per-cycle cost of a live sort, with the change held fixed while the table grows.

A keyed source of N rows (Key, Price, Sym, Qty) is sorted by Price. Each measured cycle
changes the Price of K existing rows (each moves to a new place: a remove and an add in
the sorted table) and upserts K new rows with random prices (adds in the middle). The
time is that of the sort's listener alone (``SortListener.on_update``), wall clock and
the thread's CPU time (the latter is steadier on a shared machine); the source's own work
is not counted. Also reported: surviving rows moved (shifted) per cycle.

    .venv/bin/python bench/bench_sort.py --sizes 1000000 10000000 --change 1000 --repeat 50
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.ops.sort.listener import SortListener  # noqa: E402

SCHEMA = pa.schema([("Key", pa.int64()), ("Price", pa.float64()), ("Sym", pa.string()), ("Qty", pa.int64())])
SYMS = np.array(["AAPL", "MSFT", "GOOG", "IBM", "ORCL", "AMZN", "META", "NFLX"], dtype=object)


def _rows(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    n = keys.size
    return pa.table({
        "Key": pa.array(keys, pa.int64()),
        "Price": pa.array(rng.random(n) * 1000.0, pa.float64()),
        "Sym": pa.array(SYMS[rng.integers(0, SYMS.size, n)], pa.string()),
        "Qty": pa.array(rng.integers(1, 1000, n), pa.int64()),
    }, schema=SCHEMA)


def run(n: int, change: int, repeat: int, warmup: int, by: str, seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    g = UpdateGraph(validate=False)
    src = g.keyed_table(SCHEMA, "Key", name="src")
    src.upsert(_rows(rng, np.arange(n)))
    g.run_cycle()
    t0 = time.perf_counter()
    sorted_ = src.sort(by)
    build_s = time.perf_counter() - t0
    listener = sorted_.listener
    assert isinstance(listener, SortListener)
    timings: list[int] = []
    cpu: list[int] = []
    moved: list[int] = []
    inner = listener.on_update

    def timed(*updates):  # type: ignore[no-untyped-def]
        a, c = time.perf_counter_ns(), time.thread_time_ns()
        out = inner(*updates)
        cpu.append(time.thread_time_ns() - c)
        timings.append(time.perf_counter_ns() - a)
        moved.append(listener.index.moved)
        return out

    listener.on_update = timed  # type: ignore[method-assign]
    next_key = n
    for _ in range(warmup + repeat):
        existing = rng.choice(next_key, change, replace=False)  # keys never deleted here
        upd = _rows(rng, existing)
        new = _rows(rng, np.arange(next_key, next_key + change))
        next_key += change
        src.upsert(pa.concat_tables([upd, new]))
        g.run_cycle()
    t = np.array(timings[warmup:], dtype=np.float64) / 1e6
    c = np.array(cpu[warmup:], dtype=np.float64) / 1e6
    mv = np.array(moved[warmup:], dtype=np.float64)
    return {
        "size": n, "change": change, "build_s": build_s,
        "median_ms": float(np.median(t)), "mean_ms": float(t.mean()),
        "p99_ms": float(np.percentile(t, 99)), "max_ms": float(t.max()),
        "cpu_median_ms": float(np.median(c)), "cpu_p99_ms": float(np.percentile(c, 99)),
        "moved_mean": float(mv.mean()), "moved_max": float(mv.max()),
        "capacity": listener.index.capacity, "rows": sorted_.size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--change", type=int, default=1000, help="K: key-changing modifies and appends per cycle")
    ap.add_argument("--repeat", type=int, default=50, help="measured cycles per size")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--by", default="Price", help="sort column (Price, or Sym for many ties)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_sort.json)")
    args = ap.parse_args()

    results = []
    for n in args.sizes:
        r = run(n, args.change, args.repeat, args.warmup, args.by, args.seed)
        results.append(r)
        print(f"  size {n:>11,}: median {r['median_ms']:.2f} ms (build {r['build_s']:.1f} s)", flush=True)

    names = [("median_ms", "median ms"), ("mean_ms", "mean ms"), ("p99_ms", "p99 ms"),
             ("max_ms", "max ms"), ("cpu_median_ms", "cpu median ms"), ("cpu_p99_ms", "cpu p99 ms"),
             ("moved_mean", "moved keys/cycle")]
    print(f"\nsort by {args.by}: {args.change} key changes + {args.change} inserts per cycle, "
          f"{args.repeat} cycles")
    print(f"{'':>18}" + "".join(f"{r['size']:>14,}" for r in results) + "   ratio to smallest")
    for key, label in names:
        vals = [float(r[key]) for r in results]  # type: ignore[arg-type]
        ratio = " ".join(f"{v / vals[0]:.2f}" if vals[0] else "-" for v in vals)
        print(f"{label:>18}" + "".join(f"{v:>14.2f}" for v in vals) + f"   {ratio}")
    write_json("bench_sort", {"args": vars(args), "results": results}, args.json)


if __name__ == "__main__":
    main()
