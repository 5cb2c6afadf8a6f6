"""bench_differential — issue 4's D3 and the linear operators, sizes side by side.

D3: ``--events`` upsert events (``--deletes`` of them deletes) over ``K`` distinct int64
keys with an int64 value in [0, 1000), in batches of ``--batch``, into a keyed collection
(:class:`engine.differential.upsert.Upsert`), then a count of live rows by value bucket
(``value // 100``): the upsert's triples feed a dataflow input, then ``map`` (the bucket)
and the ``count`` operator, stepped once per batch. Each size runs twice: with no
operator reading the upsert's arrangement (``arranged`` no: the upsert publishes none),
and with the arrangement written every step (``arranged`` yes: a trace given to the
upsert, as when a join shares it). The peer, in the same run and on the same events, is
pandas doing the same per batch: the current value per key in a Series indexed by key
(the batch's last event per key replaces the key's row, deletes drop it), then the count
by bucket, in the faster (at that size, in that run) of two idioms: ``isin`` + ``concat``
(the state's rows of the batch's keys dropped, the batch's last rows appended), and
``concat`` + ``index.duplicated(keep="last")`` (the batch appended, the last row per key
kept), the fastest of the pandas idioms tried (see bench/README.md). At the end the counts are checked against pandas recomputing the last value
per key. ``K`` is taken from ``--sizes``. Printed per size: events/s (wall clock and
process CPU time, which is less sensitive to other processes on the machine), per-batch
median / mean / p99 / max, pandas' events/s and per-batch figures, and the ratio.

Linear: one fused chain (filter, map, flat_map, negate) and consolidate over batches of
``--linear-sizes`` rows: median ms and rows/s.

D1: orders(order_id, cust_id, amount) JOIN customers(cust_id, region) -> count and
sum(amount) by region, through the dataflow (delta join against both traces, root-scope
count/sum). Each step inserts 1% orders, deletes 0.5% and moves 0.1% of the customers;
pandas recomputes the whole result per step (merge + groupby) for the first
``--pandas-steps`` steps. The final result is checked against pandas.

D2: reachability from node 0 by ``iterate`` over a random directed graph of E edges on
E/4 nodes; each step adds and removes ``--d2-change`` edges; the recompute baseline is a
vectorized numpy BFS (CSR rebuilt from the edge arrays each step). Checked at the end.

Run: python bench/bench_differential.py [--only d1 d2 d3 linear] [--d1-sizes 100000 1000000]
     [--d2-sizes 10000 100000] [--steps 50] [--sizes 10000 100000 1000000] [--events 1000000]
     [--batch 10000] [--linear-sizes 10000 100000 1000000] [--repeat 5] [--json PATH]
     [--pathway PATH_TO_A_PYTHON_WITH_PATHWAY]  (D2 on Pathway too, same workload)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _d2_graph as d2_graph  # noqa: E402
from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine.differential.dataflow import Dataflow  # noqa: E402
from engine.differential.linear import Expansion, LinearOperator  # noqa: E402
from engine.differential.trace import Trace  # noqa: E402
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


def pandas_d3(batches: list[pa.Table]) -> tuple[list[int], np.ndarray]:
    """The same work in pandas, batch by batch: per-batch wall times and the last counts."""
    state = pd.Series(dtype="int64")
    counts = np.zeros(N_BUCKETS, dtype=np.int64)
    wall: list[int] = []
    for b in batches:
        t = time.perf_counter_ns()
        df = b.to_pandas()
        last = df.drop_duplicates("k", keep="last")
        ups = last[~last[DELETE].to_numpy()]
        state = pd.concat([state[~state.index.isin(last["k"])],
                           pd.Series(ups["v"].to_numpy(), index=ups["k"].to_numpy())])
        counts = np.bincount(state.to_numpy() // BUCKET, minlength=N_BUCKETS)
        wall.append(time.perf_counter_ns() - t)
    return wall, counts


def pandas_d3_dup(batches: list[pa.Table]) -> tuple[list[int], np.ndarray]:
    """The other pandas idiom, batch by batch: the batch appended to the state, the last
    row per key kept (``index.duplicated``), deletes (marked -1: values are >= 0) dropped.
    Faster than ``isin`` + ``concat`` while the state is small; per-batch wall times and
    the last counts."""
    state = pd.Series(dtype="int64")
    counts = np.zeros(N_BUCKETS, dtype=np.int64)
    wall: list[int] = []
    for b in batches:
        t = time.perf_counter_ns()
        df = b.to_pandas()
        ups = pd.Series(np.where(df[DELETE].to_numpy(), -1, df["v"].to_numpy()), index=df["k"].to_numpy())
        state = pd.concat([state, ups])
        state = state[~state.index.duplicated(keep="last")]
        state = state[state.to_numpy() >= 0]
        counts = np.bincount(state.to_numpy() // BUCKET, minlength=N_BUCKETS)
        wall.append(time.perf_counter_ns() - t)
    return wall, counts


def run_d3(n_keys: int, args: argparse.Namespace, arranged: bool) -> dict:
    rng = np.random.default_rng(n_keys)
    batches = make_events(rng, args.events, n_keys, args.deletes, args.batch)
    up = Upsert(SCHEMA, "k", trace=Trace(SCHEMA, "k") if arranged else None)
    # the count by bucket is a dataflow: map (bucket = v // 100), then the count operator
    flow = Dataflow()
    coll, inp = flow.input(SCHEMA)
    probe = coll.map({"bucket": pc.divide(pc.field("v"), pc.scalar(BUCKET))}).count("bucket").probe()
    wall: list[int] = []
    out_rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for step, b in enumerate(batches):
        t = time.perf_counter_ns()
        out = up.step(b, step)
        inp.send(out, step)
        inp.advance_to(step + 1)
        flow.step()
        wall.append(time.perf_counter_ns() - t)
        out_rows += out.num_rows
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = np.zeros(N_BUCKETS, dtype=np.int64)
    final = probe.accumulate().to_arrow()
    if np.any(final.column("__diff").to_numpy() != 1):
        raise AssertionError(f"K={n_keys}: the count output is not a set of rows")
    counts[final.column("bucket").to_numpy()] = final.column("count").to_numpy()
    want = expected_counts(batches)
    if not np.array_equal(counts, want):
        raise AssertionError(f"K={n_keys}: counts by bucket differ from the recomputation")
    st = stats_ms(wall)
    row = {
        "keys": n_keys, "arranged": "yes" if arranged else "no", "events": args.events,
        "batch": args.batch, "events_per_s": args.events / elapsed, "events_per_cpu_s": args.events / cpu,
        "batch_median_ms": st["median_ms"], "batch_mean_ms": st["mean_ms"], "batch_p99_ms": st["p99_ms"],
        "batch_max_ms": float(np.max(wall) / 1e6), "triples_out": out_rows, "live_keys": int(counts.sum()),
    }
    if not arranged:
        return row
    # the peer is the faster of the two pandas idioms at this size
    peers = {}
    for name, peer in (("isin", pandas_d3), ("dup", pandas_d3_dup)):
        pd_wall, pd_counts = peer(batches)
        if not np.array_equal(pd_counts, want):
            raise AssertionError(f"K={n_keys}: pandas' counts ({name}) differ from the recomputation")
        peers[name] = pd_wall
    best = min(peers, key=lambda name: sum(peers[name]))
    ps = stats_ms(peers[best])
    return row | {"pandas_idiom": best, "pandas_events_per_s": args.events / (sum(peers[best]) / 1e9),
                  "pandas_isin_events_per_s": args.events / (sum(peers["isin"]) / 1e9),
                  "pandas_dup_events_per_s": args.events / (sum(peers["dup"]) / 1e9),
                  "pandas_batch_median_ms": ps["median_ms"], "pandas_batch_mean_ms": ps["mean_ms"],
                  "pandas_batch_p99_ms": ps["p99_ms"]}


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


# ---------------------------------------------------------------------------------------
# D1: orders JOIN customers, count and sum(amount) by region


ORDERS = pa.schema([("order_id", pa.int64()), ("cust_id", pa.int64()), ("amount", pa.int64())])
CUSTOMERS = pa.schema([("cust_id", pa.int64()), ("region", pa.int64())])
N_CUSTOMERS = 10_000
N_REGIONS = 50


def _zset(schema: pa.Schema, cols: list[np.ndarray], diffs: np.ndarray, step: int) -> ZSet:
    data = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)
    return ZSet(data, diffs.astype(np.int64), np.full((data.num_rows, 1), step, dtype=np.int64))


def _d1_pandas(cust: np.ndarray, amount: np.ndarray, live: np.ndarray, region: np.ndarray) -> pd.DataFrame:
    orders = pd.DataFrame({"cust_id": cust[live], "amount": amount[live]})
    customers = pd.DataFrame({"cust_id": np.arange(region.size), "region": region})
    j = orders.merge(customers, on="cust_id")
    return j.groupby("region").agg(n=("amount", "size"), total=("amount", "sum"))


def run_d1(n: int, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(n)
    cap = n + int(n * 0.01) * (args.steps + 1)
    cust = rng.integers(0, N_CUSTOMERS, cap)
    amount = rng.integers(1, 1000, cap)
    live = np.zeros(cap, dtype=bool)
    live[:n] = True
    next_id = n
    region = rng.integers(0, N_REGIONS, N_CUSTOMERS)

    df = Dataflow()
    orders, io = df.input(ORDERS)
    customers, ic = df.input(CUSTOMERS)
    probe = orders.join(customers, "cust_id").reduce("region", {"n": ("count",), "total": ("sum", "amount")}).probe()

    def close(step: int) -> None:
        io.advance_to(step + 1)
        ic.advance_to(step + 1)
        df.step()

    t0 = time.perf_counter()
    ids = np.arange(n)
    io.send(_zset(ORDERS, [ids, cust[:n], amount[:n]], np.ones(n), 0))
    ic.send(_zset(CUSTOMERS, [np.arange(N_CUSTOMERS), region], np.ones(N_CUSTOMERS), 0))
    close(0)
    load_s = time.perf_counter() - t0

    wall: list[int] = []
    pandas_ns: list[int] = []
    n_ins, n_del, n_move = int(n * 0.01), int(n * 0.005), int(N_CUSTOMERS * 0.001)
    for step in range(1, args.steps + 1):
        # prepare the change (not timed): new orders, deleted live orders, moved customers
        new = np.arange(next_id, next_id + n_ins)
        next_id += n_ins
        live_ids = np.flatnonzero(live)
        gone = rng.choice(live_ids, n_del, replace=False)
        moved = rng.choice(N_CUSTOMERS, n_move, replace=False)
        old_region = region[moved]
        new_region = (old_region + rng.integers(1, N_REGIONS, n_move)) % N_REGIONS
        od = _zset(ORDERS, [np.concatenate((new, gone)), cust[np.concatenate((new, gone))],
                            amount[np.concatenate((new, gone))]],
                   np.concatenate((np.ones(n_ins), -np.ones(n_del))), step)
        cd = _zset(CUSTOMERS, [np.concatenate((moved, moved)), np.concatenate((old_region, new_region))],
                   np.concatenate((-np.ones(n_move), np.ones(n_move))), step)
        live[new] = True
        live[gone] = False
        region[moved] = new_region
        t = time.perf_counter_ns()
        io.send(od)
        ic.send(cd)
        close(step)
        wall.append(time.perf_counter_ns() - t)
        if step <= args.pandas_steps:
            t = time.perf_counter_ns()
            _d1_pandas(cust, amount, live, region)
            pandas_ns.append(time.perf_counter_ns() - t)
    want = _d1_pandas(cust, amount, live, region)
    got = probe.accumulate().to_pandas().set_index("region").sort_index()
    if not (np.array_equal(got["n"].to_numpy(), want["n"].to_numpy())
            and np.array_equal(got["total"].to_numpy(), want["total"].to_numpy())):
        raise AssertionError(f"D1 N={n}: counts/sums by region differ from pandas")
    st, sp = stats_ms(wall), stats_ms(pandas_ns)
    return {"orders": n, "load_s": load_s, "step_median_ms": st["median_ms"], "step_mean_ms": st["mean_ms"],
            "step_p99_ms": st["p99_ms"], "pandas_median_ms": sp["median_ms"],
            "speedup": sp["median_ms"] / st["median_ms"]}


# ---------------------------------------------------------------------------------------
# D2: reachability from a root over a random directed graph, 10 edges added + 10 removed per step


EDGES = pa.schema([("node", pa.int64()), ("dst", pa.int64())])
NODES = pa.schema([("node", pa.int64())])


def run_d2(e: int, args: argparse.Namespace) -> dict:
    rng, n_nodes, code, edges = d2_graph.initial(e)

    df = Dataflow()
    ecoll, ie = df.input(EDGES)
    roots, ir = df.input(NODES)
    reach = roots.iterate(lambda r: r.join(ecoll, "node").map({"node": "dst"}).concat(roots).distinct())
    probe = reach.probe()

    def close(step: int) -> None:
        ie.advance_to(step + 1)
        ir.advance_to(step + 1)
        df.step()

    t0 = time.perf_counter()
    ie.send(_zset(EDGES, [code // n_nodes, code % n_nodes], np.ones(code.size), 0))
    ir.send(_zset(NODES, [np.array([0])], np.ones(1), 0))
    close(0)
    load_s = time.perf_counter() - t0
    reached = int(probe.accumulate().num_rows)

    wall: list[int] = []
    cpu: list[int] = []
    bfs_ns: list[int] = []
    for step, (add, rem) in enumerate(d2_graph.steps(rng, n_nodes, edges, args.steps, args.d2_change), 1):
        ch = np.concatenate((np.array(add, dtype=np.int64), rem))
        batch = _zset(EDGES, [ch // n_nodes, ch % n_nodes],
                      np.concatenate((np.ones(len(add)), -np.ones(rem.size))), step)
        t, c = time.perf_counter_ns(), time.process_time_ns()
        ie.send(batch)
        close(step)
        wall.append(time.perf_counter_ns() - t)
        cpu.append(time.process_time_ns() - c)
        t = time.perf_counter_ns()
        want = d2_graph.reachable(edges, n_nodes)
        bfs_ns.append(time.perf_counter_ns() - t)
    got = np.sort(probe.accumulate().data.column("node").to_numpy())
    if not np.array_equal(got, want):
        raise AssertionError(f"D2 E={e}: reachable set differs from BFS")
    st, sc, sb = stats_ms(wall), stats_ms(cpu), stats_ms(bfs_ns)
    return {"edges": e, "nodes": n_nodes, "reached": int(got.size), "reached_at_load": reached,
            "load_s": load_s, "step_median_ms": st["median_ms"], "step_mean_ms": st["mean_ms"],
            "step_p99_ms": st["p99_ms"], "cpu_median_ms": sc["median_ms"], "cpu_mean_ms": sc["mean_ms"],
            "cpu_p99_ms": sc["p99_ms"], "bfs_numpy_median_ms": sb["median_ms"],
            "speedup": sb["median_ms"] / st["median_ms"]}


def _pathway_d2(args: argparse.Namespace) -> list[dict]:
    """D2 on Pathway: bench/_pathway_d2.py run by the ``--pathway`` interpreter, one JSON line per size."""
    script = Path(__file__).resolve().parent / "_pathway_d2.py"
    cmd = [args.pathway, str(script), "--sizes", *map(str, args.d2_sizes), "--steps", str(args.steps),
           "--d2-change", str(args.d2_change), "--warmup", "0"]  # the same steps as ours: same final graph
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                    help="distinct keys for D3")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--deletes", type=float, default=0.1)
    ap.add_argument("--linear-sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=["d1", "d2", "d3", "linear"],
                    default=["d1", "d2", "d3", "linear"])
    ap.add_argument("--d1-sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="orders for D1")
    ap.add_argument("--d2-sizes", type=int, nargs="+", default=[10_000, 100_000], help="edges for D2")
    ap.add_argument("--steps", type=int, default=50, help="timed steps for D1 and D2")
    ap.add_argument("--pandas-steps", type=int, default=10, help="D1 steps also timed with pandas")
    ap.add_argument("--d2-change", type=int, default=10, help="D2 edges added and removed per step")
    ap.add_argument("--pathway", default=None, metavar="PYTHON",
                    help="also run D2 on Pathway with this interpreter (one that has pathway and numpy)")
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_differential.json)")
    args = ap.parse_args()

    load = os.getloadavg()[0]
    out: dict = {"args": vars(args), "load_average": load}
    if "d1" in args.only:
        d1 = out["d1"] = [run_d1(n, args) for n in args.d1_sizes]
        print_table(f"D1: orders JOIN customers ({N_CUSTOMERS:,}), count + sum(amount) by region "
                    f"({N_REGIONS} regions); per step +1% orders, -0.5%, 0.1% customers move; "
                    f"pandas merge+groupby from scratch per step (load average {load:.1f})", d1,
                    ["orders", "load_s", "step_median_ms", "step_mean_ms", "step_p99_ms",
                     "pandas_median_ms", "speedup"])
    if "d2" in args.only:
        d2 = out["d2"] = [run_d2(e, args) for e in args.d2_sizes]
        print_table(f"D2: reachability from node 0, E edges over E/4 nodes, {args.d2_change} added + "
                    f"{args.d2_change} removed per step; recompute = vectorized numpy BFS "
                    f"(CSR rebuilt per step)", d2,
                    ["edges", "nodes", "reached", "load_s", "step_median_ms", "step_mean_ms",
                     "step_p99_ms", "cpu_median_ms", "cpu_mean_ms", "cpu_p99_ms", "bfs_numpy_median_ms",
                     "speedup"])
        if args.pathway:
            peer = out["d2_pathway"] = _pathway_d2(args)
            for row, mine in zip(peer, d2, strict=True):
                row["vs_ticktable"] = row["step_median_ms"] / mine["step_median_ms"]
            print_table(f"D2 on Pathway {peer[0]['pathway']} (bench/_pathway_d2.py, same graph and changes; "
                        f"vs_ticktable > 1: Ticktable is faster)", peer,
                        ["edges", "reached", "step_median_ms", "step_mean_ms", "step_p99_ms", "cpu_median_ms",
                         "cpu_mean_ms", "cpu_p99_ms", "vs_ticktable"])
    if "d3" in args.only:
        out["d3"] = _d3(args, load)
    if "linear" in args.only:
        out["linear"] = _linear(args)
    write_json("bench_differential", out, args.json)


def _d3(args: argparse.Namespace, load: float) -> list[dict]:
    d3 = []
    for k in args.sizes:
        bare, arranged = run_d3(k, args, False), run_d3(k, args, True)  # pandas runs with the second
        for r in (bare, arranged):
            r["vs_pandas"] = r["events_per_s"] / arranged["pandas_events_per_s"]
        d3 += [bare, arranged]
    print_table(f"D3: {args.events:,} upserts ({args.deletes:.0%} deletes) in batches of {args.batch:,} "
                f"+ count by bucket (load average {load:.1f} on {os.cpu_count()} CPUs); vs_pandas: "
                f"events/s over pandas' in the same run", d3,
                ["keys", "arranged", "events_per_s", "events_per_cpu_s", "batch_median_ms", "batch_mean_ms",
                 "batch_p99_ms", "batch_max_ms", "live_keys", "pandas_idiom", "pandas_events_per_s",
                 "pandas_isin_events_per_s", "pandas_dup_events_per_s", "pandas_batch_median_ms",
                 "pandas_batch_mean_ms", "pandas_batch_p99_ms", "vs_pandas"])
    return d3


def _linear(args: argparse.Namespace) -> list[dict]:
    lin = [run_linear(n, args.repeat) for n in args.linear_sizes]
    for r in lin:
        r["ratio"] = r["fused_chain_ms"] / lin[0]["fused_chain_ms"]
    print_table("Linear: fused filter/map/flat_map/negate and consolidate, one batch", lin,
                ["rows", "fused_chain_ms", "fused_chain_rows_per_s", "consolidate_ms",
                 "consolidate_rows_per_s", "ratio"])
    return lin


if __name__ == "__main__":
    main()
