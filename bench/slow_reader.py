"""slow_reader — how stale is what a LiveTable with a slow callback sees? (not CI)

One in-process server cycles every 0.1 s, each cycle upserting ``--rows`` rows of a
100k-key table; one :class:`~clients.live.LiveTable` subscribes with a callback that sleeps
``--callback`` seconds. Its lag (graph step minus the step of the update it was handed) is
printed over ``--seconds``, once with the subscription connection's fixed receive window
(``clients.wire.SUBSCRIPTION_WINDOW``) and once with gRPC's default, BDP-probed window,
with the server's message and coalescing counts.

Run: python bench/slow_reader.py [--seconds 40] [--callback 1.0] [--rows 5000]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

import ticktable as tt  # noqa: E402
from clients import wire  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from flight.server import ServerConfig, TicktableServer  # noqa: E402

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])
KEYS = 100_000


def run(window: tuple[tuple[str, Any], ...], seconds: float, callback: float, rows: int) -> dict[str, Any]:
    saved = wire.SUBSCRIPTION_WINDOW
    wire.SUBSCRIPTION_WINDOW = window
    graph = UpdateGraph()
    srv = TicktableServer(graph, ServerConfig(port=0)).start()
    rng = np.random.default_rng(0)
    t = srv.registry.create_source("t", SCHEMA, "keyed", keys=["k"]).table

    def data(keys: np.ndarray) -> pa.Table:
        return pa.table({"k": keys, "v": rng.random(keys.size),
                         "s": pa.array([f"x{i:08d}" for i in keys])}, schema=SCHEMA)

    t.upsert(data(np.arange(KEYS)))
    graph.start(interval=0.1)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            t.upsert(data(rng.integers(0, KEYS, rows)))
            time.sleep(0.1)

    threading.Thread(target=writer, daemon=True).start()
    client = tt.connect(srv.location)
    lags: list[tuple[float, int]] = []
    t0 = time.monotonic()
    live: Any = None

    def slow(_: Any) -> None:
        lags.append((time.monotonic() - t0, graph.step - live.step))
        time.sleep(callback)

    live = client.subscribe("t", on_update=slow)
    time.sleep(seconds)
    stop.set()
    sub = srv.subscriptions[0]
    out = {"lags": lags, "messages": sub.messages, "coalesced": sub.coalesced, "steps": graph.step}
    live.close()
    client.close()
    srv.shutdown()
    graph.stop()
    wire.SUBSCRIPTION_WINDOW = saved
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--callback", type=float, default=1.0)
    ap.add_argument("--rows", type=int, default=5000)
    args = ap.parse_args()
    for label, window in (("fixed 1 MiB window (subscriptions)", wire.SUBSCRIPTION_WINDOW),
                          ("gRPC default (BDP-probed)", ())):
        r = run(window, args.seconds, args.callback, args.rows)
        marks = [f"{t:4.0f}s:{lag}" for t, lag in r["lags"][::max(1, len(r["lags"]) // 10)]]
        last = [lag for _, lag in r["lags"][-5:]]
        print(f"{label}: lag in steps over time {' '.join(marks)}; last 5 median "
              f"{int(np.median(last))}; server messages {r['messages']}, coalesced "
              f"{r['coalesced']}, of {r['steps']} steps")


if __name__ == "__main__":
    main()
