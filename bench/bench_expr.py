"""bench_expr — what an expression costs a small cycle: the direct path against Acero's plan.

``engine.expr`` evaluates an expression by calling its ``pyarrow.compute`` functions on the
columns when it can rebuild the expression from its text (the direct path), and through
one Acero ``table_source -> project`` plan otherwise. This bench runs ops whose expressions
have options (``cast``, ``round``), typed null literals (SQL's ``CASE ... ELSE NULL``),
timestamp literals, float literals and ``isin``, each way in the same process, in turns (``engine.expr.DIRECT`` on,
then off, round by round), and reports the thread CPU of each op per cycle:

* ``update``/``where`` on a keyed table of --rows rows, --change rows upserted a cycle
  (one graph per way, the same writes);
* a differential ``LinearOperator`` filter + map on a batch of 50 and of 1,000 records.

``direct / plan`` is the ratio of the medians, round by round.

Run: python bench/bench_expr.py [--rows 1000] [--change 8] [--cycles 2000] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine import expr as _expr  # noqa: E402
from engine.differential.linear import LinearOperator  # noqa: E402
from engine.differential.zset import ZSet  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.table import Table  # noqa: E402

F = pc.field
SCHEMA = pa.schema([("K", pa.int64()), ("Sym", pa.string()), ("Price", pa.float64()),
                    ("Qty", pa.int64()), ("Ts", pa.timestamp("us"))])
BASE_US = 1_709_517_540_000_000  # 2024-03-04 01:59:00

OPS: dict[str, Callable[[Table], Table]] = {
    "update(cast, round)": lambda t: t.update(
        Label=pc.binary_join_element_wise(F("Sym"), F("Qty").cast(pa.string()), "/"),
        P2=pc.round(F("Price"), 2), Q=F("Qty").cast(pa.float64())),
    "where(Ts >= timestamp)": lambda t: t.where(
        F("Ts") >= pc.scalar(pa.scalar(dt.datetime(2024, 3, 4, 1, 59), pa.timestamp("us")))),
    "update(CASE .. ELSE NULL)": lambda t: t.update(
        Hi=pc.if_else(F("Price") > 50, F("Price"), pa.scalar(None, pa.float64()))),
    # literals the text does not type (2.0 prints "2") and an option holding an array
    "update(Price * 2.0 + 0.5)": lambda t: t.update(P2=F("Price") * 2.0 + 0.5),
    "where(Sym.isin([...]))": lambda t: t.where(F("Sym").isin(["A", "C"])),
}
LINEAR = LinearOperator().filter(F("K") > 2).map(
    {"S": pc.utf8_upper(F("Sym")), "K2": F("K").cast(pa.float64()), "X": "X"})


def _rows(rng: np.random.Generator, keys: np.ndarray) -> dict[str, Any]:
    n = keys.size
    return {"K": keys, "Sym": rng.choice(["A", "B", "C"], n), "Price": rng.uniform(0, 100, n),
            "Qty": rng.integers(0, 100, n),
            "Ts": pa.array(BASE_US + rng.integers(-10**9, 10**9, n), pa.timestamp("us"))}


class _Ops:
    """One graph: a keyed source and every op of :data:`OPS` on it, each op's listener timed."""

    def __init__(self, rows: int) -> None:
        self.graph = UpdateGraph()
        self.src = self.graph.keyed_table(SCHEMA, "K")
        self.src.upsert(_rows(np.random.default_rng(0), np.arange(rows)))
        self.spent: dict[str, list[int]] = {name: [] for name in OPS}
        for name, make in OPS.items():
            listener = make(self.src).listener
            listener.on_update = self._timed(listener.on_update, self.spent[name])
        self.graph.run_cycle()

    @staticmethod
    def _timed(fn: Callable[..., Any], into: list[int]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            t = time.thread_time_ns()
            try:
                return fn(*args)
            finally:
                into.append(time.thread_time_ns() - t)
        return run

    def cycle(self, rows: dict[str, Any]) -> None:
        self.src.upsert(rows)
        self.graph.run_cycle()


def run(rows: int, change: int, cycles: int, rounds: int) -> list[dict[str, Any]]:
    ways = {True: _Ops(rows), False: _Ops(rows)}  # direct path on / off
    linear = {n: ZSet.from_triples([((str(i % 7), i, i / 3), 0, 1) for i in range(n)], ["Sym", "K", "X"])
              for n in (50, 1000)}
    samples: dict[tuple[str, bool], list[int]] = {}
    ratios: dict[str, list[float]] = {}
    rng = np.random.default_rng(1)
    for _ in range(rounds):
        med: dict[tuple[str, bool], float] = {}
        for direct in (True, False):
            _expr.DIRECT = direct
            try:
                ops = ways[direct]
                for spent in ops.spent.values():
                    spent.clear()
                writes = np.random.default_rng(int(rng.integers(1 << 30)))  # the same writes both ways
                for c in range(cycles + cycles // 10):
                    if c == cycles // 10:  # the first tenth warms up
                        for spent in ops.spent.values():
                            spent.clear()
                    ops.cycle(_rows(writes, np.unique(writes.integers(0, rows, change))))
                for name, spent in ops.spent.items():
                    samples.setdefault((name, direct), []).extend(spent)
                    med[(name, direct)] = float(np.median(spent))
                for n, batch in linear.items():
                    name = f"linear filter + map, {n:,} records"
                    spent = []
                    for i in range(cycles + cycles // 10):
                        t = time.thread_time_ns()
                        LINEAR(batch)
                        if i >= cycles // 10:
                            spent.append(time.thread_time_ns() - t)
                    samples.setdefault((name, direct), []).extend(spent)
                    med[(name, direct)] = float(np.median(spent))
            finally:
                _expr.DIRECT = True
        for name in {n for n, _ in med}:
            ratios.setdefault(name, []).append(med[(name, True)] / med[(name, False)])
    out = []
    for name in ratios:
        d, p = stats_ms(samples[(name, True)]), stats_ms(samples[(name, False)])
        out.append({"case": name,
                    "direct_us": f"{d['median_ms'] * 1e3:.1f} / {d['mean_ms'] * 1e3:.1f} / {d['p99_ms'] * 1e3:.1f}",
                    "plan_us": f"{p['median_ms'] * 1e3:.1f} / {p['mean_ms'] * 1e3:.1f} / {p['p99_ms'] * 1e3:.1f}",
                    "direct_over_plan": ", ".join(f"{r:.2f}" for r in ratios[name]),
                    "direct": d, "plan": p, "ratios": ratios[name]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000, help="rows of the keyed source")
    ap.add_argument("--change", type=int, default=8, help="keys upserted a cycle (distinct among them)")
    ap.add_argument("--cycles", type=int, default=2_000, help="cycles per way and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = run(args.rows, args.change, args.cycles, args.rounds)
    print_table(f"thread CPU per cycle of each op, median / mean / p99 us ({args.rows:,} rows, "
                f"{args.change} upserted a cycle); direct / plan per round",
                rows, ["case", "direct_us", "plan_us", "direct_over_plan"])
    write_json("bench_expr", {"args": vars(args), "results": rows}, args.json)


if __name__ == "__main__":
    main()
