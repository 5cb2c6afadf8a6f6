"""bench/bench_live.py's ``.df`` section at a small size: every kind of update is read in
place (none rebuilt) and equals the rebuild (checked inside; no timing is asserted)."""

from __future__ import annotations

from bench import bench_live


def test_df_after_each_kind_of_update_is_read_in_place():
    rows = bench_live.time_frames(20_000, 200, updates=4, warmup=1, rebuilds=2,
                                  storages=("pyarrow", "python"))
    assert [(r["strings"], r["update"]) for r in rows] == [
        (s, k) for s in ("pyarrow", "python") for k in bench_live.FRAME_KINDS]
    for r in rows:
        assert r["size"] == 20_000 and r["rebuilt"] == 0
        assert r["df_n"] == 4 and r["rebuild_n"] == 2 and 0 < r["df_median_ms"]
