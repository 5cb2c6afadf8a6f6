"""bench/bench_fixed.py at a small size: a durable server with a subscriber process holding
every table, both kinds of cycle timed (no timing is asserted)."""

from __future__ import annotations

from bench import bench_fixed


def test_both_cycles_are_timed_with_a_subscriber_process():
    rows = bench_fixed.run(4, durable=True, subscribed=True, cycles=5)
    assert [r["cycle"] for r in rows] == ["idle", "one row"]
    for r in rows:
        assert r["tables"] == 4 and r["subscribers"] == 4 and r["server"] == "durable"
        assert r["n"] == 5 and 0 < r["cpu_median_ms"] and 0 < r["wall_median_ms"]
