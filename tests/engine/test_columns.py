"""Column sources: every supported type round-trips with nulls; previous values per cycle."""

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

import engine.columns as columns_mod
from engine.columns import (
    AppendColumnSource,
    ArrowColumnSource,
    NumpyColumnSource,
    RemappedColumnSource,
    _ArrowStore,
    make_column_source,
)
from engine.errors import InputError, SchemaError

K = lambda *k: np.array(k, dtype=np.int64)  # noqa: E731

CASES = [
    (pa.int8(), [1, None, -3]), (pa.int16(), [1, None, -3]), (pa.int32(), [1, None, 2**31 - 1]),
    (pa.int64(), [1, None, -(2**63)]), (pa.uint8(), [0, None, 255]), (pa.uint16(), [1, None, 9]),
    (pa.uint32(), [1, None, 2**32 - 1]), (pa.uint64(), [1, None, 2**64 - 1]),
    (pa.float32(), [1.5, None, float("nan")]), (pa.float64(), [1.5, None, -0.0]),
    (pa.bool_(), [True, None, False]),
    (pa.timestamp("ns"), [1, None, 3]), (pa.timestamp("us", tz="UTC"), [1, None, 3]),
    (pa.date32(), [dt.date(2026, 1, 1), None, dt.date(1970, 1, 2)]),
    (pa.duration("ms"), [5, None, 7]),
    (pa.string(), ["a", None, "ccc"]), (pa.large_string(), ["x", None, ""]),
    (pa.binary(), [b"\x00", None, b"zz"]), (pa.list_(pa.int64()), [[1], None, []]),
]


@pytest.mark.parametrize("typ, values", CASES, ids=[str(t) for t, _ in CASES])
def test_roundtrip_with_nulls(typ, values):
    src = make_column_source(typ)
    arr = pa.array(values, typ)
    src.set(K(5, 0, 9), arr)
    got = src.get(K(5, 0, 9))
    assert got.type == typ
    assert got.to_pylist() == arr.to_pylist() or (
        pa.types.is_floating(typ) and str(got.to_pylist()) == str(arr.to_pylist()))
    assert src.get(K(9, 5)).to_pylist()[1] == arr.to_pylist()[0]
    # overwrite a null with a value and back
    src.set(K(0), pa.array([values[0]], typ))
    assert src.get(K(0)).to_pylist() == [arr.to_pylist()[0]]


@pytest.mark.parametrize("typ, values", [
    (pa.int64(), [1, 2, 3]), (pa.string(), ["a", "b", "c"]), (pa.bool_(), [True, False, None]),
])
def test_previous_values_only_while_tracking(typ, values):
    src = make_column_source(typ)
    first, second, third = (pa.array([v], typ) for v in values)
    src.set(K(4), first)
    src.begin_cycle()
    src.set(K(4), second)
    src.set(K(4), third)  # second write in the same cycle: previous stays the first value
    assert src.get_prev(K(4)).to_pylist() == first.to_pylist()
    assert src.get(K(4)).to_pylist() == third.to_pylist()
    src.end_cycle()
    assert src.get_prev(K(4)).to_pylist() == third.to_pylist()  # released: prev == current
    src.set(K(4), first)  # not tracking: nothing kept
    assert src.get_prev(K(4)).to_pylist() == first.to_pylist()


def test_move_keeps_previous_values_of_overwritten_slots():
    src = NumpyColumnSource(pa.int64())
    src.set(K(0, 1, 2, 3), pa.array([10, 11, 12, 13]))
    src.begin_cycle()
    src.move(K(1, 2), K(2, 3))  # shift keys 1..2 by +1, all at once
    assert src.get(K(2, 3)).to_pylist() == [11, 12]
    assert src.get_prev(K(1, 2, 3)).to_pylist() == [11, 12, 13]


@pytest.mark.parametrize("share", [4, 0])
def test_previous_values_across_writes_growth_and_cycles_match_a_copy(monkeypatch, share):
    """Random writes (repeating keys, nulls, a write that grows the column mid-cycle):
    ``get_prev`` is the copy taken at the start of the cycle, and after the cycle what was
    saved is forgotten (prev == current, also for keys saved in an earlier cycle). With
    ``share`` 4 some cycles turn to the dense position array part way (and the column
    keeps it only after such a cycle); with 0 none does."""
    import engine.columns as columns_module

    monkeypatch.setattr(columns_module, "PREV_DENSE_SHARE", share)
    rng = np.random.default_rng(3)
    src = NumpyColumnSource(pa.float64())
    n = 40
    src.set(np.arange(n), pa.array(rng.random(n)))
    dense = 0
    for c in range(60):
        start = src.get(np.arange(n))
        src.begin_cycle()
        for _ in range(int(rng.integers(0, 4))):
            keys = rng.integers(0, n, int(rng.integers(1, 12)))
            vals = [None if v < 0.1 else float(v) for v in rng.random(keys.size)]
            src.set(keys, pa.array(vals, pa.float64()))
        if c % 7 == 3:  # grows the column past its capacity, saving as it goes
            src.set(np.arange(n, 2 * n), pa.array(rng.random(n)))
            start = pa.concat_arrays([start, pa.array([0.0] * n)])  # new keys read as zero before
            n *= 2
        probe = rng.permutation(n)
        assert src.get_prev(probe).to_pylist() == start.take(pa.array(probe)).to_pylist(), c
        assert src._prev is not None
        went_dense = src._prev.at is not None
        dense += went_dense
        src.end_cycle()
        assert (src._prev_at is not None) == went_dense, c  # kept only after a dense cycle
        if went_dense:
            assert (src._prev_at == -1).all(), c  # every saved key reset
        assert src.get_prev(probe).to_pylist() == src.get(probe).to_pylist(), c
    assert (0 < dense < 60) if share == 4 else dense == 0


def test_arrow_store_compacts_and_keeps_values():
    src = ArrowColumnSource(pa.string())
    keys = np.arange(100, dtype=np.int64)
    for i in range(40):
        src.set(keys, pa.array([f"v{i}-{k}" for k in range(100)]))
    assert src.needs_compaction(100)
    src.compact(keys)
    assert not src.needs_compaction(100)
    assert src.get(K(0, 99)).to_pylist() == ["v39-0", "v39-99"]


def test_arrow_values_are_kept_aligned_whatever_they_arrive_as():
    # a record batch decoded in place from a Flight body can sit one byte past an 8-byte
    # boundary; what a source keeps is realigned (Arrow kernels and Acero may assume it)
    values = pa.array(["a", None, "ccc"] * 10)
    raw = [None if b is None else pa.py_buffer(b"\0" + b.to_pybytes()).slice(1)
           for b in values.buffers()]
    shifted = pa.Array.from_buffers(pa.string(), len(values), raw, null_count=values.null_count)
    assert {b.address % 8 for b in shifted.buffers() if b is not None} == {1}
    for src in (ArrowColumnSource(pa.string()), AppendColumnSource(pa.string())):
        keys = np.arange(30, dtype=np.int64)
        if isinstance(src, AppendColumnSource):
            src.set_new_range(0, shifted)
        else:
            src.set(keys, shifted)
        kept = src.get(keys)
        assert kept.equals(values)
        assert {b.address % 8 for b in kept.buffers() if b is not None} == {0}


def test_remapped_source_reads_through_key_map():
    inner = NumpyColumnSource(pa.int64())
    inner.set(K(0, 1, 2), pa.array([7, 8, 9]))
    ring = RemappedColumnSource(inner, lambda k: k % 3)
    assert ring.get(K(3, 5)).to_pylist() == [7, 9]


def test_type_errors_are_schema_errors():
    with pytest.raises(SchemaError, match="cannot store"):
        NumpyColumnSource(pa.int64()).set(K(0), pa.array(["x"]))
    with pytest.raises(SchemaError, match="not fixed-width"):
        NumpyColumnSource(pa.string())


def test_arrow_source_contiguous_runs_slice_across_chunks():
    """Runs of consecutive slots are served by chunk slices; values equal a plain gather."""
    from engine.columns import ArrowColumnSource

    src = ArrowColumnSource(pa.string())
    values: list[str | None] = []
    key = 0
    for size in (5, 3, 9, 1, 17, 4):  # appends of varied sizes: several chunks, merges
        vals = [f"v{key + i}" if (key + i) % 7 else None for i in range(size)]
        src.ensure_capacity(key + size)
        src.set(np.arange(key, key + size, dtype=np.int64), pa.array(vals, pa.string()))
        values += vals
        key += size
    for lo, hi in ((0, key), (3, 20), (7, 8), (12, key), (0, 1)):
        got = src.get(np.arange(lo, hi, dtype=np.int64))
        assert got.to_pylist() == values[lo:hi]
    rev = np.arange(key - 1, -1, -1, dtype=np.int64)  # not a run: the gather path
    assert src.get(rev).to_pylist() == values[::-1]


@pytest.mark.parametrize("typ, values", CASES, ids=[str(t) for t, _ in CASES])
def test_set_new_range_of_many_chunks_writes_each_in_place(typ, values):
    """An append of a chunked column (chunks with and without nulls, an empty one) reads
    back exactly, after earlier rows and across a capacity growth."""
    src = make_column_source(typ)
    src.set_new_range(0, pa.array(values[:1], typ))
    parts = [pa.array(values, typ), pa.array([], typ), pa.array([values[0], values[2]], typ),
             pa.array([values[1]] * 40, typ)]
    col = pa.chunked_array(parts, typ)
    src.set_new_range(1, col)
    want = pa.array(values[:1], typ).to_pylist() + col.to_pylist()
    got = src.get(np.arange(len(want), dtype=np.int64))
    assert got.type == typ
    assert str(got.to_pylist()) == str(want)


def test_set_new_range_run_writes_consecutive_values_in_blocks():
    """Slot runs longer than one block (and an offset start) are the plain arange."""
    from engine.columns import _RUN_BLOCK

    src = NumpyColumnSource(pa.int64())
    n = 2 * _RUN_BLOCK.size + 5
    src.set_new_range_run(3, 100, n)
    assert np.array_equal(src.get_numpy(np.arange(3, 3 + n, dtype=np.int64))[0],
                          np.arange(100, 100 + n, dtype=np.int64))
    src.set_new_range_run(3 + n, 7, 0)  # nothing
    assert src.capacity >= 3 + n


@pytest.mark.parametrize("defer", [0, 3, None])  # appends merged at once, after 3, the default
@pytest.mark.parametrize("small", [None, 0])  # 0: every gather takes chunk by chunk
@pytest.mark.parametrize("max_merge", [None, 64])
@pytest.mark.parametrize("typ", [pa.int64(), pa.string(), pa.float64()])
@pytest.mark.parametrize("seed", range(3))
def test_append_source_reads_equal_the_appended_values(typ, seed, max_merge, small, defer):
    # appends of 1 to 200 rows, some as multi-chunk arrays: every read (random gathers, runs
    # across chunks, ranges, previous values) equals the concatenated input; with a small
    # max_merge, many chunks stop merging and reads cross them; with appends deferred, reads
    # cross the waiting chunks (runs) or merge them first (gathers)
    rng = np.random.default_rng(seed)
    src = AppendColumnSource(typ)
    if defer is not None:
        src._store.defer = defer
    if max_merge is not None:
        src._store.max_merge = max_merge
    if small is not None:
        src._store.small = small
    cap = src._store.max_merge
    expect: list = []
    for _ in range(120):
        n = int(rng.choice([1, 2, 5, 30, 70, 200]))
        raw = [None if rng.random() < 0.1 else int(v) for v in rng.integers(0, 1000, n)]
        vals = raw if typ != pa.string() else [None if v is None else f"s{v}" for v in raw]
        arr = pa.array(vals, type=typ)
        if n >= 4 and rng.random() < 0.3:  # chunks of a put's batches, an empty one too
            cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(1, 5))))
            bounds = [0, *cuts.tolist(), n]
            arr = pa.chunked_array([arr.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)],
                                   type=typ)
        model = _merged([len(c) for c in src._store.chunks], n, cap)
        src.set_new_range(len(expect), arr)
        expect.extend(vals)
        sizes = [len(c) for c in src._store.chunks]
        assert {b.address % 8 for c in src._store.chunks for b in c.buffers() if b is not None} <= {0}
        if src._store.defer:  # up to `defer` waiting chunks after the merged ones
            waiting = src._store._pending
            assert waiting <= src._store.defer
            sizes = sizes[: len(sizes) - waiting]
        else:
            assert sizes == model  # the merges chunk-by-chunk appends and merges would make
        levels = [_level(x) for x in sizes]
        if not sizes:
            pass
        elif len(expect) <= cap:  # levels never rise along the chunks; under FAN chunks a level
            assert levels == sorted(levels, reverse=True), sizes
            assert max(levels.count(lv) for lv in set(levels)) < FAN, sizes
        else:  # merges stop at the cap: past it, chunks accumulate
            assert len(sizes) <= 2 * len(expect) / cap + FAN * (_level(cap) + 2), sizes
        k = rng.integers(0, len(expect), int(rng.integers(1, 50)))
        assert src.get(k).to_pylist() == [expect[i] for i in k]
        a = int(rng.integers(0, len(expect)))
        b = int(rng.integers(a, len(expect) + 1))
        assert src.get(np.arange(a, b)).to_pylist() == expect[a:b]
        assert src.get_range(a, b).to_pylist() == expect[a:b]
        assert src.get_prev(k).to_pylist() == [expect[i] for i in k]
    if len(expect) <= cap:  # O(FAN log_FAN n) chunks
        assert len(src._store.chunks) <= (FAN - 1) * (_level(len(expect)) + 1) + src._store._pending


def _count_concats(monkeypatch) -> list[list[int]]:
    """Record each ``pa.concat_arrays`` call from now on as its arrays' lengths."""
    calls: list[list[int]] = []
    concat = pa.concat_arrays

    def counting(arrays, *a, **k):
        calls.append([len(x) for x in arrays])
        return concat(arrays, *a, **k)

    monkeypatch.setattr(pa, "concat_arrays", counting)
    return calls


def test_append_source_merges_deferred_appends_once(monkeypatch):
    # appends wait as they came: no copy until more than `defer` wait, then one merge of
    # all of them as one append; a gather merges the waiting ones first, a run reads them
    src = AppendColumnSource(pa.string())
    src._store.defer = 4
    calls = _count_concats(monkeypatch)
    expect: list[str] = []
    for i in range(4):
        vals = [f"v{i}-{j}" for j in range(5)]
        src.set_new_range(len(expect), pa.array(vals))
        expect += vals
    assert calls == [] and [len(c) for c in src._store.chunks] == [5, 5, 5, 5]
    assert src.get_range(3, 12).to_pylist() == expect[3:12]  # a run: slices, no merge
    assert src.get(np.arange(4, 16)).to_pylist() == expect[4:16]
    assert calls == [[1, 5, 5, 1]]  # the run's slices, concatenated: no merge
    assert src._store._pending == 4
    calls.clear()
    vals = [f"w{j}" for j in range(5)]
    src.set_new_range(len(expect), pa.array(vals))  # a fifth waits: all merge as one append of 25
    expect += vals
    assert calls == [[5, 5, 5, 5, 5]]
    assert [len(c) for c in src._store.chunks] == _merged([], 25, src._store.max_merge)
    calls.clear()
    src.set_new_range(len(expect), pa.array(["x", "y"]))
    expect += ["x", "y"]
    assert calls == [] and src._store._pending == 1
    assert src.get(np.array([26, 0, 25])).to_pylist() == [expect[26], expect[0], expect[25]]
    assert src._store._pending == 0  # the gather merged it (as an append of 2 would)
    assert [len(c) for c in src._store.chunks] == _merged([25], 2, src._store.max_merge)


def test_append_source_keeps_large_appends_as_they_came_until_the_first_gather(monkeypatch):
    # a column nobody gathers from: large waiting appends settle without a copy, each a
    # chunk of its own, read as runs and ranges; the first gather merges them by levels
    # (one copy), and from then on settles merge as before
    src = AppendColumnSource(pa.string())
    src._store.defer, src._store.keep_bytes = 3, 40
    calls = _count_concats(monkeypatch)
    expect: list[str] = []
    for i in range(30):
        vals = [f"value-{i}-{j}-" + "x" * 20 for j in range(4)]  # ~100 bytes: kept
        src.set_new_range(len(expect), pa.array(vals))
        expect += vals
    assert calls == [] and [len(c) for c in src._store.chunks] == [4] * 30
    assert src._store._kept == 28 and src._store._pending == 2
    assert src.get_range(5, 113).to_pylist() == expect[5:113]  # slices of the chunks
    assert src.get(np.arange(0, 120)).to_pylist() == expect    # a run, not a gather
    calls.clear()
    k = np.array([119, 0, 57, 58, 3])
    assert src.get(k).to_pylist() == [expect[i] for i in k]    # the first gather
    assert calls == [[4] * 30]  # one concatenation: every value copied once
    assert [len(c) for c in src._store.chunks] == _merged([], 120, src._store.max_merge)
    assert src._store._kept == 0 and src._store._gathered
    calls.clear()
    for i in range(4):  # gathered: waiting appends merge again, however large
        vals = [f"more-{i}-{j}-" + "y" * 30 for j in range(4)]
        src.set_new_range(len(expect), pa.array(vals))
        expect += vals
    assert calls == [[4, 4, 4, 4]]
    assert src.get(np.arange(len(expect))[::-3]).to_pylist() == expect[::-3]


def test_append_source_merges_small_or_sliced_appends_before_the_first_gather():
    # appends below keep_bytes on average merge at their settle; so does a small slice of
    # a larger array (kept, it would hold the whole array) and a column of a larger buffer
    src = AppendColumnSource(pa.string())
    src._store.defer, src._store.keep_bytes = 2, 200
    big = pa.array(["z" * 50] * 100)
    for part in ([f"s{i}" for i in range(5)], big.slice(10, 5), big.slice(20, 5)):
        src.set_new_range(len(src), pa.array(part) if isinstance(part, list) else part)
    assert src._store._kept == 0 and len(src._store.chunks) == 1
    body = pa.py_buffer(b"\0" * 100_000)  # a decoded message's columns: views of its body
    offsets = pa.py_buffer(np.arange(0, 1010, 10, dtype=np.int32).tobytes())
    view = pa.Array.from_buffers(pa.string(), 100, [None, offsets, body.slice(0, 1000)])
    for _ in range(3):
        src.set_new_range(len(src), view)
    assert src._store._kept == 0
    for _ in range(3):
        src.set_new_range(len(src), pa.array(["w" * 400] * 3))  # 1,200 bytes each: kept
    assert src._store._kept == 3


@pytest.mark.parametrize("seed", range(4))
def test_append_source_with_kept_chunks_reads_equal_the_appended_values(seed):
    # appends of 1 to 200 values (some multi-chunk, some slices of a larger array) with
    # every settle keeping what it may (keep_bytes 0): runs, ranges and Python values
    # each cycle equal the input; gathers come rarely, the first merging the kept chunks,
    # after which the chunks keep the levels' shape
    rng = np.random.default_rng(seed)
    src = AppendColumnSource(pa.string())
    src._store.defer, src._store.keep_bytes = int(rng.integers(0, 5)), 0
    src._store.max_merge = [64, 1 << 21][seed % 2]  # 64: the first gather merges in groups
    store = src._store
    expect: list = []
    gathered = False
    for step in range(300):
        n = int(rng.choice([1, 2, 5, 30, 70, 200]))
        vals = [None if rng.random() < 0.1 else f"s{step}-{j}" for j in range(n)]
        arr = pa.array(vals, pa.string())
        if n >= 4 and rng.random() < 0.3:
            cut = int(rng.integers(1, n))
            arr = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], type=pa.string())
        elif rng.random() < 0.2:
            arr = pa.array(["pad"] * 3 + vals + ["pad"], pa.string()).slice(3, n)
        src.set_new_range(len(expect), arr)
        expect.extend(vals)
        assert int(store.offsets[-1]) == len(expect) == len(src)
        assert np.array_equal(np.diff(store.offsets), [len(c) for c in store.chunks])
        a = int(rng.integers(0, len(expect)))
        b = int(rng.integers(a, len(expect) + 1))
        assert src.get_range(a, b).to_pylist() == expect[a:b], f"step {step}"
        assert src.get(np.arange(a, b)).to_pylist() == expect[a:b], f"step {step}"
        few = rng.integers(0, len(expect), 5)
        assert store.pylist(few.tolist()) == [expect[i] for i in few], f"step {step}"
        if rng.random() < 0.02 or (step == 250 and not gathered):
            k = rng.integers(0, len(expect), int(rng.integers(1, 60)))
            assert src.get(k).to_pylist() == [expect[i] for i in k], f"step {step}"
            gathered = True
            assert store._kept == 0
        if not gathered:
            assert store._pending <= store.defer
        elif len(expect) <= store.max_merge:
            sizes = [len(c) for c in store.chunks][: len(store.chunks) - store._pending]
            levels = [_level(x) for x in sizes]
            assert levels == sorted(levels, reverse=True), (step, sizes)
    assert gathered


FAN = 4  # _ArrowStore.fan_in


def _level(n: int) -> int:
    return int(np.floor(np.log(n) / np.log(FAN) + 1e-9))


def _merged(sizes: list[int], n: int, cap: int) -> list[int]:
    """Chunk sizes after appending ``n`` values as one chunk, merging step by step: a chunk of
    a lower level than the last is merged into it; FAN chunks of one level become one."""
    sizes = [*sizes, n]
    while len(sizes) >= 2:
        if _level(sizes[-2]) < _level(sizes[-1]) and sizes[-2] + sizes[-1] <= cap:
            sizes[-2:] = [sizes[-2] + sizes[-1]]
        elif (len(sizes) >= FAN and len({_level(x) for x in sizes[-FAN:]}) == 1
              and sum(sizes[-FAN:]) <= cap):
            sizes[-FAN:] = [sum(sizes[-FAN:])]
        else:
            break
    return sizes


def test_the_store_merges_at_the_fan_in_it_is_modelled_with():
    assert _ArrowStore.fan_in == FAN


def test_an_append_and_the_merges_it_sets_off_are_one_concatenation(monkeypatch):
    # a put's cycle appends several batches; with the chunks it merges into they are copied
    # once, not once to combine the batches and again per merge of the cascade
    src = AppendColumnSource(pa.string())
    src._store.defer = 0  # each append merges at once
    for n in (16, 16, 16, 4, 4, 4):  # three chunks of level 2, three of level 1 (fan-in 4)
        src.set_new_range(len(src), pa.array([f"v{j}" for j in range(n)]))
    assert [len(c) for c in src._store.chunks] == [16, 16, 16, 4, 4, 4]
    calls = _count_concats(monkeypatch)
    batches = pa.chunked_array([pa.array(["a", "b", None]), pa.array(["c", "d", "e", "f"])])
    src.set_new_range(len(src), batches)
    # 7 values (level 1) make the fourth chunk of level 1: the four merge into 19 values
    # (level 2), the fourth of level 2: those merge into one of 67
    assert calls == [[16, 16, 16, 4, 4, 4, 3, 4]]
    assert [len(c) for c in src._store.chunks] == [67]
    assert src.get_range(60, 67).to_pylist() == ["a", "b", None, "c", "d", "e", "f"]


def test_append_source_merges_one_row_appends_into_few_chunks():
    src = AppendColumnSource(pa.int64())
    for i in range(1_000):  # a timer's one row per cycle
        src.set_new_range(i, pa.array([i]))
    assert len(src._store.chunks) <= 10 + src._store.defer  # merged ones, waiting ones
    src._store.settle()
    assert len(src._store.chunks) <= 10
    assert src.get_range(0, 1_000).to_pylist() == list(range(1_000))


def test_append_source_refuses_overwrites_and_gaps():
    src = AppendColumnSource(pa.int64())
    src.set_new_range(0, pa.array([1, 2, 3]))
    with pytest.raises(InputError, match="append at key 5"):
        src.set_new_range(5, pa.array([4]))
    with pytest.raises(InputError, match="cannot be overwritten"):
        src.set(K(0), pa.array([9]))


@pytest.mark.parametrize("few", [0, 1 << 30])
def test_arrow_source_python_values_of_a_few_keys(few, monkeypatch):
    # read one by one (``few`` large) or gathered (0): the same values, nulls included,
    # across chunks of several sizes and after overwrites
    from engine import columns

    monkeypatch.setattr(columns, "_FEW_SCALARS", few)
    rng = np.random.default_rng(3)
    src = ArrowColumnSource(pa.string())
    model: dict[int, str | None] = {}
    for rnd in range(60):
        keys = np.unique(rng.integers(0, 40, int(rng.integers(1, 12))))
        vals = [None if rng.random() < 0.2 else f"r{rnd}k{k}" for k in keys.tolist()]
        src.ensure_capacity(40)
        src.set(keys, pa.array(vals, pa.string()))
        model.update(zip(keys.tolist(), vals, strict=True))
        ask = rng.choice(np.array(sorted(model)), int(rng.integers(0, 20)))
        assert src.get_pylist(ask) == [model[k] for k in ask.tolist()]


@pytest.mark.parametrize("ordered_min", [0, 1 << 30])
@pytest.mark.parametrize("type_", [pa.string(), pa.int64()])
def test_store_gathers_ascending_and_other_slots_alike(ordered_min, type_, monkeypatch):
    # ascending slots are cut at the chunk bounds (ordered_min 0), any slots go through
    # the search per slot (1 << 30): the same values, nulls included, across chunks of
    # several sizes, repeated slots, runs, a chunk not hit, one chunk hit, and empty
    monkeypatch.setattr(_ArrowStore, "ordered_min", ordered_min)
    monkeypatch.setattr(_ArrowStore, "small", 0)  # never the one-concatenation shortcut
    rng = np.random.default_rng(11)
    store = _ArrowStore(type_)
    model: list = [None]
    for n in (50, 7, 20, 1, 13, 30):
        vals = [None if rng.random() < 0.2 else (f"v{len(model) + i}" if type_ == pa.string() else len(model) + i)
                for i in range(n)]
        store.append(pa.array(vals, type_))
        model += vals
    assert len(store.chunks) > 2
    for _ in range(200):
        k = int(rng.integers(0, 40))
        slots = rng.integers(0, len(model), k)
        if rng.random() < 0.6:
            slots = np.sort(slots)
        if rng.random() < 0.2:  # one chunk only
            c = int(rng.integers(0, len(store.chunks)))
            slots = np.sort(rng.integers(store.offsets[c], store.offsets[c + 1], k))
        got = store.take(slots.astype(np.int64))
        assert got.type == type_
        assert got.to_pylist() == [model[s] for s in slots.tolist()]



def _two_readers(round_: int, keep_bytes: int | None = None) -> list[BaseException]:
    """One thread gathers (merging 40 waiting appends, or with ``keep_bytes`` 0 the chunks
    kept as they came) while another reads runs and a gather of the same column; what
    either raised."""
    import threading

    src = AppendColumnSource(pa.string())
    src._store.defer = 64 if keep_bytes is None else 4
    if keep_bytes is not None:
        src._store.keep_bytes = keep_bytes
    expect: list[str] = []
    for i in range(40):  # 40 appends wait, unmerged
        vals = [f"r{round_}-{i}-{j}" for j in range(3)]
        src.set_new_range(len(expect), pa.array(vals))
        expect += vals
    n = len(expect)
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def gather() -> None:
        start.wait()
        try:
            assert src.get(np.arange(0, n, 2)).to_pylist() == expect[0::2]
        except BaseException as exc:
            failures.append(exc)

    def runs() -> None:
        start.wait()
        try:
            for _ in range(20):
                assert src.get(np.arange(n - 7, n)).to_pylist() == expect[-7:]
                assert src.get_range(1, n).to_pylist() == expect[1:]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=gather), threading.Thread(target=runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert src._store._pending == 0
    return failures


@pytest.mark.parametrize("keep_bytes", [None, 0])  # 0: the first gather merges kept chunks
def test_append_source_reads_on_two_threads_while_a_gather_merges_the_waiting_appends(keep_bytes):
    # readers share the graph's lock: one reader's gather merges the appends that wait
    # (settle) while another reads runs of the same column; every read sees whole values
    # (a run read across the merge once indexed past the shortened chunk list: IndexError)
    import sys

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as the interpreter can
    try:
        for round_ in range(60):
            failures = _two_readers(round_, keep_bytes)
            assert not failures, f"round {round_}: {failures[0]!r}"
    finally:
        sys.setswitchinterval(switch)


@pytest.mark.parametrize("type_", [pa.string(), pa.large_binary()])
@pytest.mark.parametrize("coded_max", [4096, 6])
@pytest.mark.parametrize("few_encode", [columns_mod.FEW_ENCODE, 4, 0])
def test_coded_source_reads_as_a_model_and_codes_are_values(type_, coded_max, few_encode, monkeypatch):
    # a coded ArrowColumnSource against a dict model over 300 random steps of writes (set,
    # set_new_range, encode + set_codes, moves), with nulls, previous values within each
    # cycle, and compactions between them; while coded, equal codes are equal values and
    # the store holds each value once. coded_max 6: the column stops coding partway.
    # few_encode: writes of 1-8 values are looked up in the column's dict (64), in Arrow's
    # index_in (0), or either by their size (4), against one dictionary
    monkeypatch.setattr(columns_mod, "CODED_MAX", coded_max)
    monkeypatch.setattr(columns_mod, "FEW_ENCODE", few_encode)
    rng = np.random.default_rng(7)
    alphabet = [None, "", "a", "b", "ab", "é", "a\x00", "S0001", "S0002", "zz"]

    def arr(vals):
        return pa.array([v.encode() if v is not None and type_ == pa.large_binary() else v for v in vals],
                        type_)

    src = ArrowColumnSource(type_, coded=True)
    model: dict[int, object] = {}
    end = 0
    coded_steps = uncoded_steps = 0
    for step in range(300):
        src.begin_cycle()
        before = dict(model)
        for _ in range(int(rng.integers(1, 4))):
            op = rng.integers(0, 4)
            vals = [alphabet[i] for i in rng.integers(0, len(alphabet) - (0 if step > 150 else 4),
                                                      int(rng.integers(1, 9)))]
            if op == 0 or not model:  # new rows
                src.set_new_range(end, arr(vals))
                model.update({end + i: v for i, v in enumerate(vals)})
                end += len(vals)
                src.ensure_capacity(end)
            elif op == 1:
                keys = rng.choice(np.array(sorted(model)), min(len(vals), len(model)), replace=False)
                src.set(keys, arr(vals[: keys.size]))
                model.update({int(k): v for k, v in zip(keys.tolist(), vals, strict=False)})
            elif op == 2:
                keys = rng.choice(np.array(sorted(model)), min(len(vals), len(model)), replace=False)
                codes = src.encode(arr(vals[: keys.size]))
                if codes is None:
                    src.set(keys, arr(vals[: keys.size]))
                else:
                    src.set_codes(keys, codes)
                model.update({int(k): v for k, v in zip(keys.tolist(), vals, strict=False)})
            else:
                keys = np.array(sorted(model))
                a, b = rng.choice(keys, 2)
                src.move(np.array([a]), np.array([b]))
                model[int(b)] = model[int(a)]
        keys = np.array(sorted(model), dtype=np.int64)
        got = src.get(keys).to_pylist()
        assert got == [arr([model[k]]).to_pylist()[0] for k in keys.tolist()], step
        few = rng.choice(keys, min(keys.size, 12), replace=False)  # read as Python values
        assert src.get_pylist(few) == [arr([model[k]]).to_pylist()[0] for k in few.tolist()], step
        old = np.array(sorted(before), dtype=np.int64)
        if old.size:
            assert src.get_prev(old).to_pylist() == arr([before[k] for k in old.tolist()]).to_pylist(), step
        if src.coded:
            coded_steps += 1
            codes = src.codes(keys)
            values = src.get(keys).to_pylist()
            by_code = dict(zip(codes.tolist(), values, strict=True))
            assert len(set(by_code.values())) == len(by_code)  # distinct codes, distinct values
            assert all(by_code[c] == v for c, v in zip(codes.tolist(), values, strict=True))
            assert len(src._store) == len(set(map(repr, src._dict.to_pylist())))  # each value once
            assert src._py == src._dict.to_pylist()  # the dict's values, by code
            assert src._code_of == {v: i for i, v in enumerate(src._py)}
        else:
            uncoded_steps += 1
        src.end_cycle()
        if step % 40 == 39:  # compaction, a new epoch when coded
            epoch = src.code_epoch
            was = src.coded
            src.compact(keys)
            assert src.code_epoch == epoch + (1 if was else 0)
            assert src.get(keys).to_pylist() == [arr([model[k]]).to_pylist()[0] for k in keys.tolist()]
    assert coded_steps and (uncoded_steps if coded_max < 10 else not uncoded_steps), (coded_steps, uncoded_steps)


def test_a_source_made_uncoded_or_of_other_types_is_not_coded():
    assert not ArrowColumnSource(pa.list_(pa.int64()), coded=True).coded
    assert not ArrowColumnSource(pa.string()).coded
    src = ArrowColumnSource(pa.string(), coded=True)
    assert src.coded and src.encode(pa.array(["a", None, "a", "b"])).tolist() == [1, 0, 1, 2]
