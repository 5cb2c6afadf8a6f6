"""The clients' benchmarks in one run (issue: clients), with the targets checked.

1. Spark -> server (:mod:`bench.bench_spark`): N rows (int64, string, float64, int64) through
   the ``ticktable`` data source, against one driver-side ``toArrow`` DoPut (``push``) and a
   ``mapInArrow`` that only counts rows (Spark's own hand-off ceiling); target: data source
   >= 0.8x the ceiling.
2. LiveTable (:mod:`bench.bench_live`): the apply cost of a 1,000-row update on a 1M-row
   subscribed table vs a 10k-row one (median, mean, p99; target: ratio of medians <= 2),
   and subscribe -> snapshot -> ``.df`` for 1M and 10M rows.

Each part runs in its own process (Spark's JVM, 10M-row frames) and writes its JSON to
``bench/results/``; this script prints both tables and a summary of the targets.

    python bench/bench_clients.py                 # 5M Spark rows, 1M and 10M snapshots
    python bench/bench_clients.py --quick         # small sizes, to check it runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _run(script: str, args: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=HERE.parent)
    result: dict = json.loads(out.read_text())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000, help="Spark rows (default 5M)")
    ap.add_argument("--repeat", type=int, default=3, help="Spark repeats (medians)")
    ap.add_argument("--quick", action="store_true", help="small sizes, to check it runs")
    ap.add_argument("--skip-spark", action="store_true")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = []
    if not args.skip_spark:
        rows = 200_000 if args.quick else args.rows
        spark = _run("bench_spark.py", ["--rows", str(rows), "--repeat", str(args.repeat)],
                     RESULTS / "bench_clients_spark.json")
        by = {r["path"]: r for r in spark["results"]}
        ratio = by["datasource"]["rows_per_s"] / by["ceiling"]["rows_per_s"]
        summary.append(f"Spark data source / mapInArrow ceiling at {rows:,} rows: {ratio:.2f} "
                       f"(target >= 0.8: {'met' if ratio >= 0.8 else 'MISSED'}); "
                       f"data source {by['datasource']['rows_per_s']:,.0f} rows/s, push "
                       f"{by['push']['rows_per_s']:,.0f} rows/s, ceiling "
                       f"{by['ceiling']['rows_per_s']:,.0f} rows/s")
    live_args = ["--quick"] if args.quick else ["--big"]
    live = _run("bench_live.py", live_args, RESULTS / "bench_clients_live.json")
    small, big = live["apply"][0], live["apply"][-1]
    ratio = big["median_ms"] / small["median_ms"]
    summary.append(f"LiveTable apply, 1k-row update: {big['size']:,} rows median "
                   f"{big['median_ms']:.3f} ms (p99 {big['p99_ms']:.2f}) vs {small['size']:,} rows "
                   f"{small['median_ms']:.3f} ms: ratio {ratio:.2f} (target <= 2: "
                   f"{'met' if ratio <= 2 else 'MISSED'})")
    for s in live["snapshot"]:
        summary.append(f"snapshot -> .df of {s['rows']:,} rows: {s['total_s']:.2f} s "
                       f"(subscribe {s['subscribe_s']:.2f} s, first .df {s['first_df_s']:.2f} s)")
    print("\n== summary")
    for line in summary:
        print(" ", line)


if __name__ == "__main__":
    main()
