"""examples/pandas_subscriber.py as a subprocess against a real, ticking server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

ROOT = Path(__file__).resolve().parents[2]
QUOTES = pa.schema([("Sym", pa.string()), ("Bid", pa.float64())])


def test_pandas_subscriber_example_prints_updates_and_frames() -> None:
    graph = UpdateGraph(validate=True)
    graph.start(0.02)
    server = TicktableServer(graph, ServerConfig()).start()
    quotes = server.registry.create_source("board", QUOTES, "keyed", keys=["Sym"]).table
    stop = threading.Event()
    rng = np.random.default_rng(0)

    def tick() -> None:
        while not stop.wait(0.05):
            syms = rng.choice(["A", "B", "C"], 2, replace=False)
            quotes.upsert({"Sym": syms, "Bid": rng.uniform(1, 9, 2)})  # type: ignore[attr-defined]

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "pandas_subscriber.py"), "--uri",
             server.location, "--table", "board", "--seconds", "2"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        stop.set()
        t.join()
        server.shutdown()
        graph.stop()
    assert out.returncode == 0, out.stderr
    steps = re.findall(r"step (\d+): \+(\d+) -(\d+) ~(\d+) rows", out.stdout)
    assert len(steps) >= 5, out.stdout
    assert int(steps[0][1]) >= 1  # the snapshot arrives as added rows
    assert any(int(s[3]) for s in steps)  # later ticks modify quotes
    assert "Bid_was" in out.stdout  # modified rows shown with their previous values
    frames = re.findall(r"--- board as of step \d+: (\d+) rows", out.stdout)
    assert frames and int(frames[-1]) == 3
