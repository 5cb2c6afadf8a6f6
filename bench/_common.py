"""Shared helpers for the benchmark scripts: timing stats, tables, JSON with versions."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

RESULTS = Path(__file__).parent / "results"


def stats_ms(samples_ns: list[int]) -> dict[str, float]:
    ms = np.array(samples_ns, dtype=float) / 1e6
    return {
        "median_ms": float(np.median(ms)),
        "mean_ms": float(ms.mean()),
        "p99_ms": float(np.percentile(ms, 99)),
        "n": int(ms.size),
    }


def timed(fn, *args: Any) -> int:
    t = time.perf_counter_ns()
    fn(*args)
    return time.perf_counter_ns() - t


def print_table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    print(f"\n== {title}")
    widths = [max([len(c), *(len(_fmt(r.get(c))) for r in rows)]) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=False)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(cols, widths, strict=False)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


def write_json(name: str, payload: dict[str, Any], path: str | None = None) -> Path:
    import pandas
    import pyarrow
    import pyroaring

    out = Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {"numpy": np.__version__, "pyarrow": pyarrow.__version__,
                     "pandas": pandas.__version__, "pyroaring": pyroaring.__version__},
        **payload,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nJSON written to {out}")
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


# the benchmarks' shared 4-column table (int64, string, float64, int64)
SCHEMA = pa.schema([("Key", pa.int64()), ("Sym", pa.string()), ("Price", pa.float64()),
                    ("Qty", pa.int64())])
SYMS = pa.array([f"SYM{i:04d}" for i in range(1000)])


def batch(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    """Rows of :data:`SCHEMA` for ``keys`` with random symbols, prices and quantities."""
    n = keys.size
    return pa.table({
        "Key": pa.array(keys, pa.int64()),
        "Sym": SYMS.take(pa.array(rng.integers(0, 1000, n))),
        "Price": pa.array(rng.random(n) * 100),
        "Qty": pa.array(rng.integers(1, 1000, n)),
    }, schema=SCHEMA)


_PAGE = 4096


def _touch_cost(conn: Any, blocks: int, block_bytes: int) -> None:
    """In a fresh process: µs per 4 KiB page to first write ``blocks`` kept blocks, then to
    rewrite the last one (memory already mapped: the copy alone)."""
    kept, first = [], []
    for _ in range(blocks):
        t = time.perf_counter()
        a = np.empty(block_bytes, dtype=np.uint8)
        a[:] = 1
        first.append(time.perf_counter() - t)
        kept.append(a)
    t = time.perf_counter()
    kept[-1][:] = 2
    again = time.perf_counter() - t
    pages = block_bytes / _PAGE
    conn.send({"first_touch_us_per_page": [x / pages * 1e6 for x in first],
               "rewrite_us_per_page": again / pages * 1e6})


def memory_touch_cost(blocks: int = 4, block_bytes: int = 256 << 20) -> dict[str, Any]:
    """What this machine charges for memory a process touches for the first time.

    A server that keeps what it ingests writes into memory it has not touched before; a
    server that discards each batch (the raw baseline) reuses the same pages. Where the
    first touch of a page costs many times its rewrite (a VM whose host backs guest memory
    lazily and takes freed pages back, for one), ingest figures depend on how much of the
    memory a run gets is fresh, and vary with it from run to run. Measured in a spawned
    process so that this one's memory does not change; run it after the timed sections.
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_touch_cost, args=(child, blocks, block_bytes), daemon=True)
    proc.start()
    try:
        out: dict[str, Any] = parent.recv()
    finally:
        proc.join(30)
    out["first_touch_median_us_per_page"] = median(out["first_touch_us_per_page"])
    out["bytes"] = blocks * block_bytes
    return out
