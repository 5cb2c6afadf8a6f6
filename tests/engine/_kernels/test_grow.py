"""engine._kernels.grow: large arrays grow in place inside a reserve; values never change."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from engine._kernels import grow
from engine._kernels.grow import grown, reserved_capacity
from engine.columns import NumpyColumnSource

ROOT = Path(__file__).resolve().parents[3]


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture(autouse=True)
def _own_pool(monkeypatch):
    """Each test starts with no released reserves kept (they would change capacities)."""
    monkeypatch.setattr(grow, "_pool", [])


def test_small_arrays_grow_by_copying():
    a = np.arange(5, dtype=np.int64)
    b = grown(a, 9, fill=-1)
    assert b.tolist() == [0, 1, 2, 3, 4, -1, -1, -1, -1]
    assert reserved_capacity(b) == 9  # not in a reserve
    assert grown(np.ones(3, dtype=bool), 5, True).tolist() == [True] * 5
    with pytest.raises(ValueError, match="cannot grow an array of 5 elements to 4"):
        grown(a, 4)


def test_a_large_array_moves_once_into_a_reserve_then_grows_in_place(monkeypatch):
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 16)
    a = np.arange(100, dtype=np.int64)
    b = grown(a, 200)  # 1,600 bytes: into a reserve of 16x (below the minimum: 64 KiB)
    assert reserved_capacity(b) == (1 << 16) // 8
    assert b[:100].tolist() == list(range(100)) and not b[100:].any()
    b[150] = 7
    c = grown(b, 4_000)  # inside the reserve: the same memory, a longer view
    assert _addr(c) == _addr(b) and c.size == 4_000
    assert c[150] == 7 and not c[200:].any()  # never-written pages are zeros
    d = grown(c, 8_192, fill=3)  # the whole reserve, filled past the old end
    assert _addr(d) == _addr(b) and (d[4_000:] == 3).all() and d[150] == 7
    e = grown(d, 8_193)  # past the reserve: copied into a new one 16x as large
    assert _addr(e) != _addr(d) and reserved_capacity(e) == 16 * 8_193
    assert np.array_equal(e[:8_192], d) and e[8_192] == 0


def test_a_column_keeps_its_values_across_growth_in_and_past_reserves(monkeypatch):
    # a column grown by random writes, appends and nulls, against a list: its values and
    # validity stay exact while its storage moves between copies, reserves and views
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 9)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 12)
    rng = np.random.default_rng(5)
    src = NumpyColumnSource(pa.int64())
    expect: dict[int, int | None] = {}
    end = 0
    for _ in range(300):
        if rng.random() < 0.5:  # append a run
            n = int(rng.integers(1, 200))
            vals = [None if rng.random() < 0.05 else int(v) for v in rng.integers(0, 1 << 40, n)]
            src.set_new_range(end, pa.array(vals, pa.int64()))
            expect.update(zip(range(end, end + n), vals, strict=True))
            end += n
        else:  # overwrite keys, some past the end (a sparse write grows the column too)
            keys = np.unique(rng.integers(0, end + 300, int(rng.integers(1, 40))))
            vals = [None if rng.random() < 0.05 else int(v) for v in rng.integers(0, 1 << 40, keys.size)]
            src.set(keys.astype(np.int64), pa.array(vals, pa.int64()))
            expect.update(zip(keys.tolist(), vals, strict=True))
            end = max(end, int(keys.max()) + 1)
        keys = np.fromiter(expect, dtype=np.int64)
        assert src.get(keys).to_pylist() == list(expect.values())
    assert reserved_capacity(src._values) > src.capacity  # it ended in a reserve


def test_without_address_space_for_a_reserve_arrays_grow_by_copying():
    # a real mmap failure: the address space is limited below the 1 GiB reserve, so every
    # growth copies, and the values are the same
    code = textwrap.dedent("""
        import resource, sys
        import numpy as np
        import pyarrow as pa
        sys.path.insert(0, sys.argv[1])
        from engine._kernels.grow import reserved_capacity
        from engine.columns import NumpyColumnSource
        src = NumpyColumnSource(pa.int64())
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), hard))
        n = 5_000_000  # 40 MB: over the size that asks for a reserve
        src.set_new_range(0, pa.array(np.arange(n, dtype=np.int64)))
        assert reserved_capacity(src._values) == src.capacity, "reserved"
        assert src.get(np.array([0, 1, n - 1])).to_pylist() == [0, 1, n - 1]
        print("copied", src.capacity)
    """)
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("copied ")


def test_a_large_column_grows_without_moving():
    # the real thresholds: a column of 5M int64 values (40 MB) lives in a reserve, and
    # appends up to 80M rows extend it where it is
    src = NumpyColumnSource(pa.int64())
    src.set_new_range(0, pa.array(np.arange(5_000_000, dtype=np.int64)))
    where = _addr(src._values)
    assert reserved_capacity(src._values) >= 80_000_000
    src.set_new_range(5_000_000, pa.array(np.arange(5_000_000, dtype=np.int64)))
    assert _addr(src._values) == where and src.capacity >= 10_000_000
    assert src.get(np.array([4_999_999, 5_000_000, 9_999_999])).to_pylist() == [4_999_999, 0, 4_999_999]


def test_a_released_reserve_is_reused_and_reads_as_zeros(monkeypatch):
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 16)
    a = grown(np.arange(100, dtype=np.int64), 1_000)
    a[:] = -1  # every byte it was given is written
    where = _addr(a)
    del a  # its table was dropped: the mapping is kept, not unmapped
    assert grow.pooled() == (1, 8_000)
    b = grown(np.arange(3, dtype=np.float32), 1_500)  # another dtype, in the same pages
    assert _addr(b) == where and grow.pooled() == (0, 0)
    assert b[:3].tolist() == [0.0, 1.0, 2.0] and not b[3:].any()
    c = grown(b, 2_500)  # in place, over the rest of what the first array wrote
    assert _addr(c) == where and not c[3:].any()
    assert (grown(c, 3_000, fill=7)[2_500:] == 7).all()


def test_fill_none_grows_over_a_reused_reserve_without_zeroing_it(monkeypatch):
    # an append-only column writes each row as it grows to it: what an earlier array wrote
    # there is left, not zeroed first (fresh pages are the kernel's zeros either way)
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 16)
    a = grown(np.arange(100, dtype=np.int64), 1_000)
    a[:] = -1
    where = _addr(a)
    del a
    b = grown(np.arange(3, dtype=np.int64), 1_000, fill=None)
    assert _addr(b) == where
    assert b[:3].tolist() == [0, 1, 2] and (b[3:] == -1).all()
    c = grown(b, 1_500, fill=None)  # in place, past what was written: the kernel's zeros
    assert _addr(c) == where and (c[3:1_000] == -1).all() and not c[1_000:].any()
    assert grown(np.arange(3, dtype=np.int64), 5, fill=None)[:3].tolist() == [0, 1, 2]  # small


def test_an_append_only_column_in_a_reused_reserve_reads_what_was_appended(monkeypatch):
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 16)
    old = NumpyColumnSource(pa.int64())
    old.set_new_range(0, pa.array(np.full(5_000, -7, dtype=np.int64)))
    del old  # its reserve is kept, its pages still hold -7
    rng = np.random.default_rng(5)
    src, want = NumpyColumnSource(pa.int64(), written_before_read=True), []
    for _ in range(40):
        vals = [None if rng.random() < 0.1 else int(v) for v in rng.integers(0, 99, int(rng.integers(1, 300)))]
        src.set_new_range(len(want), pa.array(vals, pa.int64()))
        want += vals
        assert src.get_range(0, len(want)).to_pylist() == want
    assert grow.pooled() == (0, 0)  # it did grow into the reused reserve


def test_released_reserves_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 16)
    monkeypatch.setattr(grow, "POOL_MAPPINGS", 3)
    monkeypatch.setattr(grow, "POOL_BYTES", 20_000)
    live = [grown(np.zeros(1, np.int64), 1_000) for _ in range(5)]  # 8,000 bytes written each
    for a in live:
        a[:] = 1
    live.clear()
    assert grow.pooled() == (2, 16_000)  # 3 would hold 24,000 bytes
    live = [grown(np.zeros(1, np.int64), 1_000) for _ in range(5)]  # two reused, three new
    assert all(not a[1:].any() for a in live)


def test_arrays_in_reused_reserves_keep_exact_values(monkeypatch):
    # random arrays of several dtypes made, grown, written and dropped, against copies kept
    # aside: a mapping passed from one to the next never shows the earlier one's bytes
    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 9)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 14)
    monkeypatch.setattr(grow, "POOL_MAPPINGS", 4)
    rng = np.random.default_rng(11)
    dtypes = [np.int64, np.float64, np.int32, np.bool_, np.uint8]
    live: list[tuple[np.ndarray, np.ndarray]] = []  # (array, expected values)
    reused = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.3 or not live:
            dt = dtypes[int(rng.integers(len(dtypes)))]
            start = np.asarray(rng.integers(0, 100, int(rng.integers(1, 50)))).astype(dt)
            n = int(rng.integers(start.size, 3_000))
            kept = grow.pooled()[0]
            a = grown(start, n)
            reused += grow.pooled()[0] < kept
            live.append((a, np.concatenate([start, np.zeros(n - start.size, dt)])))
        elif op < 0.6:
            i = int(rng.integers(len(live)))
            a, want = live[i]
            n = int(rng.integers(a.size, a.size + 3_000))
            fill = 0 if rng.random() < 0.7 else 1
            b = grown(a, n, fill)
            want = np.concatenate([want, np.full(n - a.size, fill, a.dtype)])
            live[i] = (b, want)
        elif op < 0.85:
            a, want = live[int(rng.integers(len(live)))]
            at = rng.integers(0, a.size, int(rng.integers(1, 100)))
            v = np.asarray(rng.integers(0, 100, at.size)).astype(a.dtype)
            a[at] = v
            want[at] = v
        else:
            live.pop(int(rng.integers(len(live))))
        for a, want in live:
            assert np.array_equal(a, want)
    assert reused > 20


def test_tables_in_reused_reserves_match_recomputation(monkeypatch):
    # the oracle over tables whose columns live in reserves from a few hundred bytes and
    # are handed on: each kind's source and result columns reuse the mappings the tables
    # before them released (validate after every cycle, against recomputation)
    import pyarrow.compute as pc

    from tests.oracle import run_oracle

    monkeypatch.setattr(grow, "RESERVE_FROM_BYTES", 1 << 8)
    monkeypatch.setattr(grow, "MIN_RESERVE_BYTES", 1 << 14)
    monkeypatch.setattr(grow, "POOL_MAPPINGS", 64)
    reused = []
    take = grow._take

    def counting(nbytes):
        got = take(nbytes)
        reused.append(got is not None)
        return got

    monkeypatch.setattr(grow, "_take", counting)
    for seed in range(3):
        for kind in ("append", "keyed", "ring"):
            gc.collect()  # the graph before (graph <-> tables: a cycle) releases its reserves
            before = len(reused)
            run_oracle(lambda t: t.where(pc.field("Price") > 50).update(N=pc.field("Price") * pc.field("Qty")),
                       lambda df: (lambda f: f.assign(N=f.Price * f.Qty))(df[df.Price > 50]),
                       seed=seed, n_cycles=200, max_rows=400, kinds=(kind,))
            if seed or kind != "append":  # every graph after the first starts in kept mappings
                assert any(reused[before:]), f"seed {seed} {kind}: no reserve reused"
