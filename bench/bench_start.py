"""bench_start: how long the ``ticktable`` command takes to be of use, against another tree.

Two commands, each started ``--runs`` times, this tree's and ``--vs``'s in turns (A B B A
...: a drifting machine moves both alike):

* ``serve``: ``ticktable serve --port 0 --in-memory --http-port -1`` from its start to its
  ``serving Flight`` line (the port bound, cycles running), and the CPU the process spent
  by then (``/proc/PID/stat``); then it is stopped.
* ``health``: ``ticktable health --port 1`` (nothing listens: the answer is at once), the
  container's ``HEALTHCHECK`` every 10 s, start to exit; its CPU from ``wait4``.

Printed per tree: median, mean and max of wall and CPU milliseconds; and this tree's median
over the other's. Each tree runs under its own ``PYTHONPATH`` with this interpreter.

Run: python bench/bench_start.py --vs /path/to/other/tree [--runs 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
SERVE = ["serve", "--port", "0", "--in-memory", "--http-port", "-1"]
HEALTH = ["health", "--port", "1"]


def _cmd(root: Path, args: list[str]) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("TICKTABLE_PORT", None)
    return [sys.executable, "-m", "ticktable.cli", *args], env


def serve_once(root: Path) -> tuple[float, float]:
    """Wall and CPU milliseconds from exec to the ``serving Flight`` line."""
    cmd, env = _cmd(root, SERVE)
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=root, env=env)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if "serving Flight" in line:
                break
        else:
            raise RuntimeError(f"{root}: serve ended before serving (exit {p.wait()})")
        wall = time.perf_counter() - t
        fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        p.terminate()
        p.wait(30)
    return wall * 1e3, cpu * 1e3


def health_once(root: Path) -> tuple[float, float]:
    """Wall and CPU milliseconds of a health check that finds nothing listening."""
    cmd, env = _cmd(root, HEALTH)
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,
                         env=env)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 1:  # UNAVAILABLE: exit 1
        raise RuntimeError(f"{root}: health exited {p.returncode}")
    return wall * 1e3, (usage.ru_utime + usage.ru_stime) * 1e3


def run(other: Path, runs: int) -> list[dict[str, Any]]:
    trees = {"this": HERE, "vs": other}
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for what, once in (("serve", serve_once), ("health", health_once)):
        for tree in trees.values():  # warm the page cache, not counted
            once(tree)
        for i in range(runs):
            order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
            for name, root in order:
                got.setdefault((what, name), []).append(once(root))
    rows = []
    for (what, name), samples in got.items():
        wall = [w for w, _ in samples]
        cpu = [c for _, c in samples]
        rows.append({"command": what, "tree": name, "runs": runs,
                     "wall_median_ms": statistics.median(wall), "wall_mean_ms": statistics.mean(wall),
                     "wall_max_ms": max(wall), "cpu_median_ms": statistics.median(cpu),
                     "cpu_mean_ms": statistics.mean(cpu), "cpu_max_ms": max(cpu)})
    for row in rows:
        if row["tree"] == "this":
            vs = next(r for r in rows if r["command"] == row["command"] and r["tree"] == "vs")
            row["x_wall"] = row["wall_median_ms"] / vs["wall_median_ms"]
            row["x_cpu"] = row["cpu_median_ms"] / vs["cpu_median_ms"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vs", type=Path, required=True, help="another checkout of ticktable")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", default=None, help="where to write the results (default "
                                                  "bench/results/bench_start.json)")
    args = ap.parse_args()
    rows = run(args.vs.resolve(), args.runs)
    print_table(f"ticktable's start: this tree ({HERE}) and {args.vs}, in turns; x_* = this "
                f"tree's median over the other's", rows, list(rows[0]))
    write_json("bench_start", {"vs": str(args.vs), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
