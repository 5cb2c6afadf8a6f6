"""W1 on Deephaven, the peer (run with a Python that has ``deephaven-server``, pyarrow and
numpy, never a Ticktable dependency): the same chain, seed and rows as ``bench_ops.py``'s W1.

A keyed input table (``input_table(..., key_cols="Key")``) loaded with N rows, then::

    f = src.where("Price > 50")
    u = f.update("Notional = Price * Qty")
    s = u.sort("Notional")
    a = u.agg_by([sum_("Notional"), count_("count"), avg("Price")], by="Sym")

Each cycle upserts K modified rows (new Price; Sym and Qty kept) and appends 1,000 rows,
drawn from ``numpy.random.default_rng(7)`` in the same order as ``bench_ops.py`` draws them
for the same ``--sizes`` and ``--changes``, so both engines see the same data. The rows go in
with ``add_async`` and a ``requestRefresh`` of the update graph; a cycle's time is from the
update graph's cycle start (``cycleStartNanoTime``) to the later of the listeners on ``s`` and
``a`` (``System.nanoTime`` in each): the source's apply and all four operations, without the
wait for the cycle to begin. Warm-up cycles (the JIT) are dropped. Checked against pandas at
the end. Prints one JSON line per (N, K).

Set up (once; Java 11 or later on the PATH, ``make test`` checks for one):
    python3 -m venv /path/to/deephaven-venv
    /path/to/deephaven-venv/bin/pip install deephaven-server==42.7 pyarrow numpy

Run: /path/to/deephaven-venv/bin/python bench/_deephaven_w1.py [--sizes 1000000] [--changes 1000 100000]
(or through ``bench_ops.py --deephaven /path/to/deephaven-venv/bin/python``, which prints both)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import socket
import threading
import time

import numpy as np
import pyarrow as pa

APPEND = 1000
SYMS = np.array([f"S{i:04d}" for i in range(1000)], dtype=object)


class _Mirror:
    """The rows as the peer holds them, by key (keys are 0..next_key, dense): for the
    modifies' kept Sym and Qty, and the final check."""

    def __init__(self, size: int) -> None:
        self.sym = np.zeros(size, dtype=np.int64)
        self.price = np.zeros(size)
        self.qty = np.zeros(size, dtype=np.int64)

    def put(self, keys: np.ndarray, sym: np.ndarray, price: np.ndarray, qty: np.ndarray) -> None:
        self.sym[keys], self.price[keys], self.qty[keys] = sym, price, qty


def _draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``bench_ops.rows``' draws, in its order: Sym codes, Price, Qty."""
    sym = rng.integers(0, 1000, n)
    price = rng.random(n) * 100
    qty = rng.integers(1, 100, n)
    return sym, price, qty


def _arrow(keys: np.ndarray, sym: np.ndarray, price: np.ndarray, qty: np.ndarray) -> pa.Table:
    return pa.table({"Sym": pa.array(SYMS[sym], pa.string()), "Key": keys, "Price": price, "Qty": qty})


def _stats(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns, dtype=float) / 1e6
    return {"median_ms": float(np.median(ms)), "mean_ms": float(ms.mean()),
            "p99_ms": float(np.percentile(ms, 99)), "n": int(ms.size)}


def run(n: int, k: int, cycles: int, warmup: int, rng: np.random.Generator) -> dict:
    import jpy
    from deephaven import agg, dtypes, input_table
    from deephaven.arrow import to_table
    from deephaven.table_listener import listen

    nano = jpy.get_type("java.lang.System").nanoTime
    src = input_table({"Sym": dtypes.string, "Key": dtypes.int64, "Price": dtypes.double,
                       "Qty": dtypes.int64}, key_cols="Key")
    ug = src.update_graph.j_update_graph
    total = cycles + warmup
    mirror = _Mirror(n + APPEND * (total + 1))
    t0 = time.perf_counter()
    for s0 in range(0, n, 1_000_000):
        keys = np.arange(s0, min(n, s0 + 1_000_000))
        sym, price, qty = _draw(rng, keys.size)
        mirror.put(keys, sym, price, qty)
        src.add(to_table(_arrow(keys, sym, price, qty)))
    load_s = time.perf_counter() - t0
    f = src.where("Price > 50")
    u = f.update("Notional = Price * Qty")
    s = u.sort("Notional")
    a = u.agg_by([agg.sum_("Notional"), agg.count_("count"), agg.avg("Price")], by="Sym")

    ends: dict[str, int] = {}
    done = {"s": threading.Event(), "a": threading.Event()}
    starts: list[int] = []

    def on(name: str):
        def fn(update, is_replay) -> None:  # noqa: ARG001 - deephaven's listener signature
            ends[name] = nano()
            if name == "s":
                starts.append(ug.cycleStartNanoTime())
            done[name].set()
        return fn

    handles = [listen(s, on("s")), listen(a, on("a"))]
    samples: list[int] = []
    next_key = n
    for c in range(total):
        mod = rng.integers(0, next_key, k)
        keys = np.concatenate((mod, np.arange(next_key, next_key + APPEND)))
        sym, price, qty = _draw(rng, keys.size)
        sym[:k], qty[:k] = mirror.sym[mod], mirror.qty[mod]
        # a key drawn twice keeps its last row, as an upsert does
        mirror.put(keys, sym, price, qty)
        next_key += APPEND
        batch = to_table(_arrow(keys, sym, price, qty))
        for e in done.values():
            e.clear()
        starts.clear()
        src.add_async(batch)
        ug.requestRefresh()
        for name, e in done.items():
            if not e.wait(120):
                raise RuntimeError(f"cycle {c}: no update on {name} within 120 s")
        if c >= warmup:
            samples.append(max(ends.values()) - starts[-1])
    for h in handles:
        h.stop()
    want = _check(mirror, next_key, s, a)
    return {"N": n, "K": k, "load_s": load_s, "chain": _stats(samples), "rows_s": want}


def _check(mirror: _Mirror, size: int, s, a) -> int:
    """The final sort and aggregation against numpy over the mirror."""
    from deephaven.arrow import to_arrow

    price, qty, sym = mirror.price[:size], mirror.qty[:size], mirror.sym[:size]
    keep = price > 50
    notional = np.sort(price[keep] * qty[keep], kind="stable")
    got = to_arrow(s.view(["Notional"])).column("Notional").to_numpy()
    if got.size != notional.size or not np.allclose(got, notional):
        raise AssertionError(f"sort differs from numpy: {got.size} rows against {notional.size}")
    groups = np.unique(sym[keep]).size
    if a.size != groups:
        raise AssertionError(f"agg_by has {a.size} groups against numpy's {groups}")
    return int(notional.size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--changes", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2,
                    help="cycles dropped before timing; pass bench_ops' own --warmup so both draw the same rows")
    ap.add_argument("--heap", default="8g")
    args = ap.parse_args()
    from deephaven_server import Server

    with socket.socket() as sock:  # a free port: the server's web port is unused here
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = Server(port=port, jvm_args=[f"-Xmx{args.heap}"])
    server.start()
    version = importlib.metadata.version("deephaven-server")
    rng = np.random.default_rng(7)
    for n in args.sizes:
        for k in args.changes:
            if k >= n:
                continue
            r = run(n, k, args.cycles, args.warmup, rng)
            r["deephaven"] = version
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
