"""bench/bench_expr.py at a small size: every case timed both ways, the direct path put
back on after it (no timing is asserted)."""

from __future__ import annotations

from bench import bench_expr
from engine import expr as _expr


def test_every_case_runs_both_ways_and_leaves_the_direct_path_on():
    rows = bench_expr.run(rows=50, change=4, cycles=20, rounds=2)
    assert sorted(r["case"] for r in rows) == sorted([*bench_expr.OPS, "linear filter + map, 50 records",
                                                      "linear filter + map, 1,000 records"])
    for r in rows:
        assert r["direct"]["n"] == r["plan"]["n"] == 2 * 20 and len(r["ratios"]) == 2
        assert all(x > 0 for x in r["ratios"])
    assert _expr.DIRECT is True
