"""bench_ops — benchmark W1 of issue 3: a live chain against pandas recomputing it.

Source: a keyed table of N rows (Sym: string, 1,000 distinct; Key: int64 unique;
Price: float64; Qty: int64). Chain::

    f = src.where(Price > 50)
    u = f.update(Notional = Price * Qty)
    s = u.sort("Notional")
    a = u.agg_by([sum(Notional), count, mean(Price)], by="Sym")

Each cycle modifies K random rows' Price and appends 1,000 rows. Printed per (N, K): the
per-cycle median / mean / p99 of the whole chain and of each op, and, in the same run, the
median time for pandas to recompute the chain from scratch on the same data.

W2 (``--addonly CYCLES``, issue #39 item 8): an append-only table (G: int64, X: float64)
gains 5,000 rows into 1,000 groups a cycle; one ``agg_by(<kind>("X"), by="G")`` per kind
(and one with no ``by``), each on its own graph from an empty table, timed in its listener
(per-cycle median / mean / p99 after the warm-up), so add-only min/max/first/last compare
with count/sum.

W3 (``--fixed CYCLES``, issue #39 item 7, the fixed cost of a cycle): a keyed table
(Key: int64, Sym: string, X: float64, Q: int64) of 20,000 rows and an append-only one with
the same columns, each with one ``agg_by`` of nine kinds (sum, count, mean, min, max, first,
last, std, count_distinct) by ``Sym`` (1,000 groups); each cycle upserts (keyed: half
modifies of existing keys, half new keys) or appends K rows, K = 20 and 200; per-cycle
listener median / mean / p99 after the warm-up.

W4 (``--sorted CYCLES``, issue #39 item 8): ``agg_by(sorted_last("Qty", order="Price"),
by="Sym")`` against the pipeline it replaces, ``sort("Price")`` then ``agg_by(last("Qty"),
by="Sym")``, each on its own graph fed the same rows: an append-only table of 100,000 rows
gaining K rows a cycle into 1,000 groups, and a keyed table of 100,000 rows taking K upserts a
cycle (half modifies of Price and Qty, half new keys), K = 1,000 and 10,000. CPU time
(``time.process_time``: other work may share the machine) of the whole cycle and of the
operations' listeners, per-cycle median / mean / p99 after the warm-up.

W5 (``--small CYCLES``, issue #39 item 10, the fixed cost of an ordered aggregation): a
keyed table of 120 rows (Key, Sym: 8 groups, X: float64, Q: int64, S: a string over
several words) taking 1-10 upserts or deletes a cycle (modifies of X and Q, new keys,
deletes; the size stays near 120), one ``agg_by`` of sorted_first and sorted_last of Q
ordered by X and by S, by Sym. CPU time (``time.process_time``) of the listener per cycle
and of each ``OrderedRows.apply`` call, median / mean / p99 after the warm-up: at this size
what is measured is the per-call constant, not the change.

Run: python bench/bench_ops.py [--sizes 1000000 10000000] [--changes 1000 100000] [--cycles 20]
     python bench/bench_ops.py --addonly 300   (W2 only)
     python bench/bench_ops.py --fixed 300     (W3 only)
     python bench/bench_ops.py --sorted 100    (W4 only)
     python bench/bench_ops.py --small 2000    (W5 only)
     python bench/bench_ops.py --sizes 1000000 --warmup 20 --deephaven /path/to/deephaven-venv/bin/python
                                               (W1, then the same rows on Deephaven: bench/_deephaven_w1.py)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.ops.aggregate import agg  # noqa: E402
from engine.table import Table  # noqa: E402

SCHEMA = pa.schema([("Sym", pa.string()), ("Key", pa.int64()), ("Price", pa.float64()), ("Qty", pa.int64())])
SYMS = pa.array([f"S{i:04d}" for i in range(1000)])
APPEND = 1000


def rows(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    n = keys.size
    return pa.table({"Sym": SYMS.take(pa.array(rng.integers(0, 1000, n))), "Key": keys,
                     "Price": rng.random(n) * 100, "Qty": rng.integers(1, 100, n)}, schema=SCHEMA)


def pandas_chain(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    f = df[df["Price"] > 50]
    u = f.assign(Notional=f["Price"] * f["Qty"])
    s = u.sort_values("Notional", kind="stable")
    a = u.groupby("Sym", sort=False).agg(Notional=("Notional", "sum"), count=("Key", "size"),
                                          Price=("Price", "mean"))
    return s, a


class _Timed:
    """Times a derived table's listener's on_update (wrapped on the listener itself: the
    table may check its listener's class, as agg_by's result does at the end of a cycle)."""

    def __init__(self, table, clock=time.perf_counter_ns):
        self.inner = table.listener.on_update
        self.clock = clock
        self.samples: list[int] = []
        table.listener.on_update = self.on_update

    def on_update(self, *ups):
        t = self.clock()
        out = self.inner(*ups)
        self._last = self.clock() - t
        return out

    def take(self) -> int:
        v, self._last = getattr(self, "_last", 0), 0
        return v


def run(n: int, k: int, cycles: int, rng: np.random.Generator, check: bool, warmup: int = 2) -> dict:
    g = UpdateGraph()
    src = g.keyed_table(SCHEMA, "Key", name="src")
    t0 = time.perf_counter()
    for s in range(0, n, 1_000_000):
        src.upsert(rows(rng, np.arange(s, min(n, s + 1_000_000))))
        g.run_cycle()
    load_src = time.perf_counter() - t0
    t0 = time.perf_counter()
    f = src.where(pc.field("Price") > 50)
    u = f.update(Notional=pc.field("Price") * pc.field("Qty"))
    s = u.sort("Notional")
    a = u.agg_by([agg.sum("Notional"), agg.count("count"), agg.mean("Price")], by="Sym")
    build = time.perf_counter() - t0
    timers = {name: _Timed(t) for name, t in [("where", f), ("update", u), ("sort", s), ("agg_by", a)]}
    per_op: dict[str, list[int]] = {name: [] for name in timers}
    whole, src_cycle, pandas_ns = [], [], []
    next_key = n
    for c in range(cycles + warmup):
        mod = rng.integers(0, next_key, k)
        batch = rows(rng, np.concatenate((mod, np.arange(next_key, next_key + APPEND))))
        # keep Sym and Qty of modified rows: only Price changes for them
        cur = src.lookup(pa.table({"Key": mod})).rows.select(["Sym", "Qty"])
        batch = batch.set_column(0, "Sym", pa.concat_arrays([cur.column("Sym").combine_chunks(),
                                                             batch.column("Sym").slice(k).combine_chunks()]))
        batch = batch.set_column(3, "Qty", pa.concat_arrays([cur.column("Qty").combine_chunks(),
                                                             batch.column("Qty").slice(k).combine_chunks()]))
        next_key += APPEND
        src.upsert(batch)
        t = time.perf_counter_ns()
        g.run_cycle()
        total = time.perf_counter_ns() - t
        ops = {name: tm.take() for name, tm in timers.items()}
        if c >= warmup:  # warm-up cycles dropped
            whole.append(total)
            for name, v in ops.items():
                per_op[name].append(v)
            src_cycle.append(total - sum(ops.values()))
            if c < warmup + min(cycles, 7):  # pandas: a few recomputations are enough for a median
                df = src.to_pandas()
                t = time.perf_counter_ns()
                pandas_chain(df)
                pandas_ns.append(time.perf_counter_ns() - t)
    if check:
        ps, pa_ = pandas_chain(src.to_pandas())
        got = s.to_pandas()
        assert np.allclose(got["Notional"].to_numpy(), ps["Notional"].to_numpy())
        assert len(a) == len(pa_)
    out = {"N": n, "K": k, "load_src_s": load_src, "build_chain_s": build, "chain": stats_ms(whole),
           "source_apply": stats_ms(src_cycle), "ops": {m: stats_ms(v) for m, v in per_op.items()},
           "pandas": stats_ms(pandas_ns)}
    out["speedup_vs_pandas"] = out["pandas"]["median_ms"] / out["chain"]["median_ms"]
    return out


ADD_ROWS, ADD_GROUPS = 5_000, 1_000
ADD_KINDS = ("count", "sum", "min", "max", "first", "last")


def run_addonly(kind: str, by: str | tuple[()], cycles: int, seed: int) -> dict:
    """W2: one aggregation of ``kind`` over an append-only table, per-cycle listener time."""
    rng = np.random.default_rng(seed)
    g = UpdateGraph()
    t = g.append_only_table(pa.schema([("G", pa.int64()), ("X", pa.float64())]), name="ticks")
    a = t.agg_by([agg.count("N") if kind == "count" else getattr(agg, kind)("X")], by=by)
    timer = _Timed(a)
    samples: list[int] = []
    warm = 10
    for c in range(cycles + warm):
        t.append(pa.table({"G": rng.integers(0, ADD_GROUPS, ADD_ROWS), "X": rng.random(ADD_ROWS)}))
        g.run_cycle()
        v = timer.take()
        if c >= warm:
            samples.append(v)
    return {"kind": kind, "by": by or "-", **stats_ms(samples)}


def main_addonly(cycles: int, json_path: str | None) -> None:
    results = [run_addonly(k, by, cycles, seed=11) for by in ("G", ()) for k in ADD_KINDS]
    print_table(f"W2 append-only: {ADD_ROWS:,} rows into {ADD_GROUPS:,} groups a cycle, "
                f"{cycles} cycles (agg_by listener, ms)",
                [{"by": r["by"], "kind": r["kind"], "median": r["median_ms"], "mean": r["mean_ms"],
                  "p99": r["p99_ms"]} for r in results], ["by", "kind", "median", "mean", "p99"])
    write_json("bench_ops_addonly", {"cycles": cycles, "rows": ADD_ROWS, "groups": ADD_GROUPS,
                                     "results": results}, json_path)


FIX_SCHEMA = pa.schema([("Key", pa.int64()), ("Sym", pa.string()), ("X", pa.float64()), ("Q", pa.int64())])
FIX_ROWS = 20_000


def _fix_rows(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    n = keys.size
    return pa.table({"Key": keys, "Sym": SYMS.take(pa.array(rng.integers(0, 1000, n))),
                     "X": rng.random(n) * 100, "Q": rng.integers(0, 50, n)}, schema=FIX_SCHEMA)


def _loaded(source: str, rows: int, rng: np.random.Generator) -> tuple[UpdateGraph, Table]:
    """A graph with one table ``src`` ("keyed" on Key, or append-only) of ``rows`` rows of
    :data:`FIX_SCHEMA`, after its first cycle."""
    g = UpdateGraph()
    keyed = source == "keyed"
    t = g.keyed_table(FIX_SCHEMA, "Key", name="src") if keyed else g.append_only_table(FIX_SCHEMA, name="src")
    load = _fix_rows(rng, np.arange(rows))
    if keyed:
        t.upsert(load)
    else:
        t.append(load)
    g.run_cycle()
    return g, t


def run_fixed(source: str, k: int, cycles: int, seed: int) -> dict:
    """W3: agg_by of nine kinds by Sym; K changed rows a cycle; per-cycle listener time."""
    rng = np.random.default_rng(seed)
    g, t = _loaded(source, FIX_ROWS, rng)
    keyed = source == "keyed"
    a = t.agg_by([agg.sum("X", "sum"), agg.count("n"), agg.mean("X", "mean"), agg.min("X", "min"),
                  agg.max("X", "max"), agg.first("X", "first"), agg.last("X", "last"),
                  agg.std("X", "std"), agg.count_distinct("Q", "distinct")], by="Sym")
    timer = _Timed(a)
    samples: list[int] = []
    warm, next_key = 10, FIX_ROWS
    for c in range(cycles + warm):
        if keyed:
            old = rng.integers(0, next_key, k - k // 2)
            old = np.unique(old)
            keys = np.concatenate((old, np.arange(next_key, next_key + k // 2)))
            next_key += k // 2
            t.upsert(_fix_rows(rng, keys))
        else:
            t.append(_fix_rows(rng, np.arange(next_key, next_key + k)))
            next_key += k
        g.run_cycle()
        v = timer.take()
        if c >= warm:
            samples.append(v)
    return {"source": source, "K": k, **stats_ms(samples)}


def main_fixed(cycles: int, json_path: str | None) -> None:
    results = [run_fixed(src, k, cycles, seed=5) for src in ("keyed", "append") for k in (20, 200)]
    print_table(f"W3 fixed cost: agg_by of 9 kinds by Sym (1,000 groups) over {FIX_ROWS:,} rows, "
                f"{cycles} cycles (agg_by listener, ms)",
                [{"source": r["source"], "K": r["K"], "median": r["median_ms"], "mean": r["mean_ms"],
                  "p99": r["p99_ms"]} for r in results], ["source", "K", "median", "mean", "p99"])
    write_json("bench_ops_fixed", {"cycles": cycles, "rows": FIX_ROWS, "results": results}, json_path)


SORT_ROWS = 100_000


def run_sorted(source: str, k: int, pipeline: str, cycles: int, seed: int) -> dict:
    """W4: sorted_last against sort + last; K changed rows a cycle; per-cycle CPU time."""
    rng = np.random.default_rng(seed)  # the same rows for both pipelines
    g, t = _loaded(source, SORT_ROWS, rng)
    keyed = source == "keyed"
    if pipeline == "sorted_last":
        out = t.agg_by([agg.sorted_last("Q", order="X", name="QHi")], by="Sym")
        timers = [_Timed(out, time.process_time_ns)]
    else:
        s = t.sort("X")
        out = s.agg_by([agg.last("Q", "QHi")], by="Sym")
        timers = [_Timed(s, time.process_time_ns), _Timed(out, time.process_time_ns)]
    whole: list[int] = []
    ops: list[int] = []
    warm, next_key = 10, SORT_ROWS
    for c in range(cycles + warm):
        if keyed:
            old = np.unique(rng.integers(0, next_key, k - k // 2))
            keys = np.concatenate((old, np.arange(next_key, next_key + k // 2)))
            next_key += k // 2
            t.upsert(_fix_rows(rng, keys))
        else:
            t.append(_fix_rows(rng, np.arange(next_key, next_key + k)))
            next_key += k
        c0 = time.process_time_ns()
        g.run_cycle()
        total = time.process_time_ns() - c0
        spent = sum(tm.take() for tm in timers)
        if c >= warm:
            whole.append(total)
            ops.append(spent)
    top = out.to_arrow().sort_by("Sym").column("QHi").to_pylist()
    return {"source": source, "K": k, "pipeline": pipeline, "cycle": stats_ms(whole), "ops": stats_ms(ops),
            "result": top}


def main_sorted(cycles: int, json_path: str | None) -> None:
    results = []
    for src in ("append", "keyed"):
        for k in (1_000, 10_000):
            pair = [run_sorted(src, k, p, cycles, seed=9) for p in ("sorted_last", "sort+last")]
            assert pair[0]["result"] == pair[1]["result"], "the two pipelines disagree"
            results += pair
    rows = [{"source": r["source"], "K": r["K"], "pipeline": r["pipeline"],
             "ops_median": r["ops"]["median_ms"], "ops_mean": r["ops"]["mean_ms"], "ops_p99": r["ops"]["p99_ms"],
             "cycle_median": r["cycle"]["median_ms"], "cycle_p99": r["cycle"]["p99_ms"]} for r in results]
    print_table(f"W4 sorted_last vs sort + last: {SORT_ROWS:,} rows, 1,000 groups, {cycles} cycles "
                f"(CPU ms: the operations' listeners, and the whole cycle)", rows, list(rows[0]))
    for r in results:
        r.pop("result")
    write_json("bench_ops_sorted", {"cycles": cycles, "rows": SORT_ROWS, "results": results}, json_path)


SMALL_SCHEMA = pa.schema([("Key", pa.int64()), ("Sym", pa.string()), ("X", pa.float64()), ("Q", pa.int64()),
                          ("S", pa.string())])
SMALL_ROWS = 120


def _small_rows(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    n = keys.size
    q = rng.integers(0, 50, n)
    return pa.table({"Key": keys, "Sym": SYMS.take(pa.array(rng.integers(0, 8, n))), "X": rng.random(n) * 100,
                     "Q": q, "S": pa.array([f"instrument:long-prefix/{v}" for v in q])}, schema=SMALL_SCHEMA)


def run_small(cycles: int, seed: int) -> dict:
    """W5: sorted_first/last by X and by S over a 120-row keyed table, 1-10 changes a cycle."""
    rng = np.random.default_rng(seed)
    g = UpdateGraph()
    t = g.keyed_table(SMALL_SCHEMA, "Key", name="src")
    t.upsert(_small_rows(rng, np.arange(SMALL_ROWS)))
    g.run_cycle()
    a = t.agg_by([agg.sorted_first("Q", order="X", name="F"), agg.sorted_last("Q", order="X", name="L"),
                  agg.sorted_first("Q", order="S", name="FS"), agg.sorted_last("Q", order="S", name="LS")],
                 by="Sym")
    timer = _Timed(a, time.process_time_ns)
    applies: list[int] = []
    for state in a.listener.states.values():  # an OrderedRows per order column
        inner = state.apply

        def timed_apply(*args, inner=inner):
            c0 = time.process_time_ns()
            out = inner(*args)
            applies.append(time.process_time_ns() - c0)
            return out

        state.apply = timed_apply  # type: ignore[method-assign]
    samples: list[int] = []
    warm, next_key = 50, SMALL_ROWS
    for c in range(cycles + warm):
        keys = t.to_arrow().column("Key").to_numpy()
        n = int(rng.integers(1, 11))
        if rng.random() < 0.3 and keys.size:
            t.delete(pa.table({"Key": rng.choice(keys, min(n, keys.size), replace=False)}))
        else:
            new = n // 2 if keys.size < SMALL_ROWS else 0
            old = rng.choice(keys, min(n - new, keys.size), replace=False)
            t.upsert(_small_rows(rng, np.concatenate((old, np.arange(next_key, next_key + new)))))
            next_key += new
        if c == warm:
            applies.clear()
        g.run_cycle()
        v = timer.take()
        if c >= warm:
            samples.append(v)
    return {"listener": stats_ms(samples), "apply": stats_ms(applies)}


def main_small(cycles: int, json_path: str | None) -> None:
    r = run_small(cycles, seed=3)
    rows = [{"what": w, "median": r[w]["median_ms"], "mean": r[w]["mean_ms"], "p99": r[w]["p99_ms"], "n": r[w]["n"]}
            for w in ("listener", "apply")]
    print_table(f"W5 sorted_first/last over {SMALL_ROWS} keyed rows, 1-10 changes a cycle, {cycles} cycles "
                f"(CPU ms: the agg_by listener per cycle, OrderedRows.apply per call)", rows, list(rows[0]))
    write_json("bench_ops_small", {"cycles": cycles, "rows": SMALL_ROWS, "results": r}, json_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--changes", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="W1 cycles dropped before timing")
    ap.add_argument("--check", action="store_true", help="compare the final result with pandas")
    ap.add_argument("--deephaven", default=None, metavar="PYTHON",
                    help="also run W1 on Deephaven with this interpreter (one that has deephaven-server)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--addonly", type=int, default=0, metavar="CYCLES",
                    help="run only W2 (append-only agg_by per kind) for CYCLES cycles")
    ap.add_argument("--fixed", type=int, default=0, metavar="CYCLES",
                    help="run only W3 (the fixed cost of a small agg_by cycle) for CYCLES cycles")
    ap.add_argument("--sorted", type=int, default=0, metavar="CYCLES",
                    help="run only W4 (sorted_last against sort + last) for CYCLES cycles")
    ap.add_argument("--small", type=int, default=0, metavar="CYCLES",
                    help="run only W5 (sorted_first/last over a 120-row table) for CYCLES cycles")
    args = ap.parse_args()
    if args.small:
        main_small(args.small, args.json)
        return
    if args.sorted:
        main_sorted(args.sorted, args.json)
        return
    if args.fixed:
        main_fixed(args.fixed, args.json)
        return
    if args.addonly:
        main_addonly(args.addonly, args.json)
        return
    rng = np.random.default_rng(7)
    results = []
    for n in args.sizes:
        for k in args.changes:
            if k >= n:
                continue
            r = run(n, k, args.cycles, rng, args.check, args.warmup)
            results.append(r)
            row = {"N": n, "K": k, "chain_med": r["chain"]["median_ms"], "chain_mean": r["chain"]["mean_ms"],
                   "chain_p99": r["chain"]["p99_ms"], "source": r["source_apply"]["median_ms"],
                   **{f"{m}_med": r["ops"][m]["median_ms"] for m in r["ops"]},
                   "pandas_med": r["pandas"]["median_ms"], "speedup": r["speedup_vs_pandas"]}
            print_table(f"W1 N={n:,} K={k:,} (cycle = K Price modifies + {APPEND:,} appends; ms)", [row],
                        list(row))
    base = {r["K"]: r["chain"]["median_ms"] for r in results if r["N"] == min(args.sizes)}
    summary = [{"N": r["N"], "K": r["K"], "chain_med_ms": r["chain"]["median_ms"],
                "ratio_to_smallest_N": r["chain"]["median_ms"] / base[r["K"]] if r["K"] in base else None,
                "pandas_med_ms": r["pandas"]["median_ms"], "speedup": r["speedup_vs_pandas"]} for r in results]
    print_table("W1 summary", summary, list(summary[0]))
    out = {"args": vars(args), "results": results}
    if args.deephaven:
        out["deephaven"] = _deephaven_w1(args, results)
    write_json("bench_ops", out, args.json)


def _deephaven_w1(args: argparse.Namespace, ours: list[dict]) -> list[dict]:
    """W1 on Deephaven: bench/_deephaven_w1.py run by the ``--deephaven`` interpreter after
    ours, on the same rows (same seed, sizes, changes, cycles and warm-up), printed beside ours."""
    script = Path(__file__).resolve().parent / "_deephaven_w1.py"
    heap = f"{max(4, 2 * max(args.sizes) // 1_000_000 + 2)}g"
    cmd = [args.deephaven, str(script), "--sizes", *map(str, args.sizes), "--changes", *map(str, args.changes),
           "--cycles", str(args.cycles), "--warmup", str(args.warmup), "--heap", heap]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    peer = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not peer:
        sys.exit(f"bench_ops: Deephaven's W1 failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    theirs = {(r["N"], r["K"]): r for r in peer}
    rows = []
    for r in ours:
        d = theirs[(r["N"], r["K"])]
        rows.append({"N": r["N"], "K": r["K"], "tt_med": r["chain"]["median_ms"], "tt_mean": r["chain"]["mean_ms"],
                     "tt_p99": r["chain"]["p99_ms"], "dh_med": d["chain"]["median_ms"],
                     "dh_mean": d["chain"]["mean_ms"], "dh_p99": d["chain"]["p99_ms"],
                     "dh_over_tt": d["chain"]["median_ms"] / r["chain"]["median_ms"],
                     "pandas_med": r["pandas"]["median_ms"]})
    print_table(f"W1 against Deephaven {peer[0]['deephaven']} (bench/_deephaven_w1.py, same rows; a cycle from "
                f"its start to the last result's listener; ms)", rows, list(rows[0]))
    return peer


if __name__ == "__main__":
    main()
