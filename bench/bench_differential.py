"""bench_differential — issue 4's D3 and the linear operators, sizes side by side.

D3: ``--events`` upsert events (``--deletes`` of them deletes) over ``K`` distinct int64
keys with an int64 value in [0, 1000), in batches of ``--batch``, into a keyed collection
(:class:`engine.differential.upsert.Upsert`, which reads and writes its trace), then a
count of live rows by value bucket (``value // 100``). The count is, for now, a plain
vectorized reduce over the upsert's output (``np.bincount`` of the buckets weighted by
the diffs); TODO(#4): replace it with the reduce/count operator once it exists. At the
end the counts are checked against pandas recomputing the last value per key. ``K`` is
taken from ``--sizes``. Printed per size: events/s (wall clock and process CPU time,
which is less sensitive to other processes on the machine), per-batch median / p99 /
max, and the trace's size.

Linear: one fused chain (filter, map, flat_map, negate) and consolidate over batches of
``--linear-sizes`` rows: median ms and rows/s.

Run: python bench/bench_differential.py [--sizes 10000 100000 1000000] [--events 1000000]
     [--batch 10000] [--linear-sizes 10000 100000 1000000] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine.differential.linear import Expansion, LinearOperator  # noqa: E402
from engine.differential.upsert import DELETE, Upsert  # noqa: E402
from engine.differential.zset import ZSet  # noqa: E402

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
BUCKET = 100
N_BUCKETS = 1000 // BUCKET


def make_events(rng: np.random.Generator, n: int, n_keys: int, deletes: float, batch: int) -> list[pa.Table]:
    k = rng.integers(0, n_keys, n)
    v = rng.integers(0, 1000, n)
    d = rng.random(n) < deletes
    return [pa.table({"k": k[i:i + batch], "v": v[i:i + batch], DELETE: d[i:i + batch]})
            for i in range(0, n, batch)]


def expected_counts(batches: list[pa.Table]) -> np.ndarray:
    """From scratch: the last event per key, deletes dropped, counted by bucket."""
    df = pd.concat([b.to_pandas() for b in batches], ignore_index=True)
    last = df.groupby("k", sort=False).tail(1)
    live = last[~last[DELETE]]
    return np.bincount(live["v"].to_numpy() // BUCKET, minlength=N_BUCKETS)


def run_d3(n_keys: int, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(n_keys)
    batches = make_events(rng, args.events, n_keys, args.deletes, args.batch)
    up = Upsert(SCHEMA, "k")
    counts = np.zeros(N_BUCKETS, dtype=np.int64)
    wall: list[int] = []
    out_rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for step, b in enumerate(batches):
        t = time.perf_counter_ns()
        out = up.step(b, step)
        buckets = out.data.column("v").to_numpy() // BUCKET
        counts += np.bincount(buckets, weights=out.diffs, minlength=N_BUCKETS).astype(np.int64)
        wall.append(time.perf_counter_ns() - t)
        out_rows += out.num_rows
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if not np.array_equal(counts, expected_counts(batches)):
        raise AssertionError(f"K={n_keys}: counts by bucket differ from the recomputation")
    st = stats_ms(wall)
    return {
        "keys": n_keys, "events": args.events, "batch": args.batch,
        "events_per_s": args.events / elapsed, "events_per_cpu_s": args.events / cpu,
        "batch_median_ms": st["median_ms"], "batch_p99_ms": st["p99_ms"],
        "batch_max_ms": float(np.max(wall) / 1e6), "triples_out": out_rows,
        "trace_rows": len(up.trace), "trace_batches": len(up.trace.batches),
    }


def _pairs(t: pa.Table) -> Expansion:
    # each record twice, the copy with its value halved
    n = t.num_rows
    p = np.concatenate((np.arange(n), np.arange(n)))
    v = t.column("v").to_numpy()
    return Expansion(p, pa.table({"k": t.column("k").to_numpy()[p], "v": np.concatenate((v, v // 2))}))


CHAIN = (LinearOperator().filter(pc.field("v") < 900)
         .map({"k": "k", "v": pc.add(pc.field("v"), 1)})
         .flat_map(_pairs).negate())


def run_linear(n: int, repeat: int) -> dict:
    rng = np.random.default_rng(n)
    z = ZSet(pa.table({"k": rng.integers(0, n, n), "v": rng.integers(0, 1000, n)}),
             rng.choice([-1, 1, 2], n).astype(np.int64), np.full((n, 1), 3, dtype=np.int64))
    out: dict = {"rows": n}
    for name, fn in (("fused_chain", lambda: CHAIN(z)), ("consolidate", z.consolidate)):
        fn()  # warm up
        samples = []
        for _ in range(repeat):
            t = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t)
        med = stats_ms(samples)["median_ms"]
        out[f"{name}_ms"] = med
        out[f"{name}_rows_per_s"] = n / (med / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                    help="distinct keys for D3")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--deletes", type=float, default=0.1)
    ap.add_argument("--linear-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_differential.json)")
    args = ap.parse_args()

    load = os.getloadavg()[0]
    d3 = [run_d3(k, args) for k in args.sizes]
    base = d3[0]["batch_median_ms"]
    for r in d3:
        r["ratio"] = r["batch_median_ms"] / base
    print_table(f"D3: {args.events:,} upserts ({args.deletes:.0%} deletes) in batches of {args.batch:,} "
                f"+ count by bucket (load average {load:.1f} on {os.cpu_count()} CPUs)", d3,
                ["keys", "events_per_s", "events_per_cpu_s", "batch_median_ms", "batch_p99_ms",
                 "batch_max_ms", "trace_rows", "trace_batches", "ratio"])
    lin = [run_linear(n, args.repeat) for n in args.linear_sizes]
    for r in lin:
        r["ratio"] = r["fused_chain_ms"] / lin[0]["fused_chain_ms"]
    print_table("Linear: fused filter/map/flat_map/negate and consolidate, one batch", lin,
                ["rows", "fused_chain_ms", "fused_chain_rows_per_s", "consolidate_ms",
                 "consolidate_rows_per_s", "ratio"])
    write_json("bench_differential", {"args": vars(args), "load_average": load, "d3": d3, "linear": lin},
               args.json)


if __name__ == "__main__":
    main()
