"""bench_library — the library calls our design choices rest on, measured here.

Docstrings in engine/ say *which* call we use and why; the figures behind the "why" live
here, where they can be re-measured when numpy, pyarrow or pyroaring change:

* distinct int64 values: ``np.unique`` (hash-based in numpy 2.x when no ``return_*`` flag
  is set) against sort + neighbour diff (``engine._kernels.arrays.sorted_unique``);
* sorting a cycle's worth of row keys or slots: ``np.sort`` against 16-bit radix passes
  (``engine._kernels.arrays.sort_keys``);
* argsort of random uint64 hashes: quicksort against a stable sort (grouping by hash);
* a RowSet (pyroaring ``BitMap64``) built from sorted keys: from a numpy array, from an
  ``array('Q')`` over the same buffer, from bit words (``engine._kernels.arrays.bitmap_from_sorted``
  on keys filling a quarter of their span), and from ranges;
* expression evaluation: one Acero ``table_source -> project`` plan against
  ``pyarrow.dataset`` and against ``pc`` kernels called directly, for 2,000 and 1M rows
  (the fixed cost of a plan is why ops batch rows and expressions into one plan);
* pandas ``hash_array`` on ten strings (why no hash goes through Python objects).

Run: python bench/bench_library.py [--sizes 500000 1000000] [--repeat 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import array
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyroaring import BitMap64

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine._kernels.arrays import bitmap_from_sorted, sort_keys  # noqa: E402


def _time(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    fn()  # warm up
    samples = []
    for _ in range(repeat):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return stats_ms(samples)


def _sort_unique(a: np.ndarray) -> np.ndarray:
    k = np.sort(a)
    return k[np.concatenate(([True], k[1:] != k[:-1]))]


def _plan(table: pa.Table, expr: pc.Expression) -> pa.Table:
    decl = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(table)),
        acero.Declaration("project", acero.ProjectNodeOptions([expr], ["out"])),
    ])
    return decl.to_table(use_threads=False)


def run(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    rows: list[dict[str, Any]] = []

    def add(case: str, n: int, fn: Callable[[], Any]) -> None:
        s = _time(fn, repeat)
        rows.append({"case": case, "rows": n, **s, "repeat": s["n"]})

    for n in sizes:
        keys = rng.integers(0, n // 2, n).astype(np.int64)
        add("np.unique int64", n, lambda keys=keys: np.unique(keys))
        add("sort + diff unique int64", n, lambda keys=keys: _sort_unique(keys))
        slots = rng.integers(0, 2 * n, n // 10).astype(np.int64)  # a cycle's slots or row keys
        add("np.sort int64 (n/10 keys < 2n)", n // 10, lambda k=slots: np.sort(k))
        add("sort_keys int64 (n/10 keys < 2n)", n // 10, lambda k=slots: sort_keys(k))
        h = rng.integers(0, 2**63, n, dtype=np.int64).view(np.uint64)
        add("argsort uint64 quicksort", n, lambda h=h: np.argsort(h))
        add("argsort uint64 stable", n, lambda h=h: np.argsort(h, kind="stable"))
        sk = np.unique(rng.integers(0, 4 * n, n)).astype(np.uint64)
        add("BitMap64 from numpy", sk.size, lambda sk=sk: BitMap64(sk))
        add("BitMap64 from array('Q')", sk.size,
            lambda sk=sk: BitMap64(array.array("Q", sk.tobytes())))
        add("bitmap_from_sorted (bit words)", sk.size, lambda sk=sk: bitmap_from_sorted(sk.view(np.int64)))
        add("BitMap64 add_range (1 range)", sk.size,
            lambda n=n: BitMap64().add_range(0, n))
    for n in (2_000, *sizes):
        t = pa.table({"x": rng.random(n), "y": rng.integers(0, 100, n)})
        expr = pc.field("x") * pc.field("y") + 1
        add("Acero plan x*y+1", n, lambda t=t, expr=expr: _plan(t, expr))
        add("pyarrow.dataset x*y+1", n,
            lambda t=t, expr=expr: ds.dataset(t).to_table(columns={"out": expr}))
        add("pc kernels x*y+1", n,
            lambda t=t: pc.add(pc.multiply(t.column("x"), t.column("y")), 1))
    strings = np.array([f"s{i}" for i in range(10)], dtype=object)
    add("pandas hash_array, 10 strings", 10, lambda: pd.util.hash_array(strings))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = run(args.sizes, args.repeat)
    print_table("library calls (ms)", rows, ["case", "rows", "median_ms", "mean_ms", "p99_ms"])
    write_json("bench_library", {"sizes": args.sizes, "repeat": args.repeat, "rows": rows},
               args.json)


if __name__ == "__main__":
    main()
