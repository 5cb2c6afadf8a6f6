"""engine._kernels.arrays: each helper against plain Python (sets, lists, loops)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels.arrays import (
    aligned,
    aligned_table,
    bitmap_from_ranges,
    bitmap_from_sorted,
    bitmap_from_words,
    bitmap_of,
    distinct_key_order,
    expand,
    expand_with_owner,
    highest_bit,
    key_order,
    lowest_bit,
    member,
    numeric_view,
    shift_keys,
    sort_keys,
    sorted_unique,
)

_ints = st.lists(st.integers(0, 200), max_size=60)
_wide = st.lists(st.one_of(st.integers(0, 300), st.integers(0, 1 << 62)), max_size=60)


def _a(xs: list[int]) -> npt.NDArray[np.int64]:
    return np.array(xs, dtype=np.int64)


@given(xs=_wide)
def test_sorted_unique(xs):
    got = sorted_unique(_a(xs))
    assert got.tolist() == sorted(set(xs)) and got.dtype == np.int64


@given(xs=_wide)
def test_sorted_unique_of_sorted_input_is_a_new_array(xs):
    a = _a(sorted(set(xs)))  # strictly increasing: returned without a sort
    got = sorted_unique(a)
    assert got.tolist() == a.tolist() and (got is not a or a.size == 0)
    if a.size:
        got[0] = -1
        assert a[0] != -1  # a copy, as for unsorted input


@pytest.mark.parametrize("hi", [1, 300, 1 << 16, 1 << 21, 1 << 33, 1 << 47, 1 << 62])
@pytest.mark.parametrize("n", [0, 5, 2047, 2048, 9000])
def test_key_order_is_a_stable_sort(n, hi):
    # from RADIX_MIN keys on, keys below 2**48 take 16-bit radix passes; repeats keep their order
    rng = np.random.default_rng(n + hi.bit_length())
    k = rng.integers(0, hi, n) if hi > 1 else np.zeros(n, dtype=np.int64)
    k[: n // 3] = k[n // 3 : 2 * (n // 3)]  # plenty of repeats
    assert key_order(k).tolist() == np.argsort(k, kind="stable").tolist()
    assert sort_keys(k).tolist() == sorted(k.tolist())


def test_key_order_leaves_negative_keys_to_numpy():
    k = np.arange(5000, dtype=np.int64)[::-1] - 2500
    assert sort_keys(k).tolist() == sorted(k.tolist())


@given(keys=st.sets(st.integers(0, 299), max_size=300), end=st.integers(300, 20_000))
def test_distinct_key_order_sorts_dense_and_sparse_keys(keys, end):
    # dense (>= 1 in 3 of 0..end-1): by scatter; sparser: key_order; both the sorting order
    k = np.random.default_rng(len(keys)).permutation(_a(sorted(keys)))
    order = distinct_key_order(k, end)
    assert k[order].tolist() == sorted(keys)
    assert sorted(order.tolist()) == list(range(k.size))


@given(hay=_ints, q=_ints)
def test_member(hay, q):
    assert member(_a(sorted(set(hay))), _a(q)).tolist() == [x in set(hay) for x in q]


@given(ranges=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 6)), max_size=20))
def test_expand(ranges):
    starts, counts = _a([s for s, _ in ranges]), _a([c for _, c in ranges])
    want = [(s + j, i, j) for i, (s, c) in enumerate(ranges) for j in range(c)]
    assert expand(starts, counts).tolist() == [v for v, _, _ in want]
    values, owner = expand_with_owner(starts, counts)
    offset = values - starts[owner]
    assert list(zip(values.tolist(), owner.tolist(), offset.tolist(), strict=True)) == want


@given(words=st.lists(st.integers(1, 2**64 - 1), max_size=40))
def test_bit_scans(words):
    w = np.array(words, dtype=np.uint64)
    assert lowest_bit(w).tolist() == [(x & -x).bit_length() - 1 for x in words]
    assert highest_bit(w).tolist() == [x.bit_length() - 1 for x in words]


def _ranges(draw_ranges: list[tuple[int, int, int]]) -> tuple[list[int], list[int], list[int]]:
    """Sorted disjoint inclusive ranges with deltas that keep them sorted, disjoint, >= 0."""
    begins: list[int] = []
    ends: list[int] = []
    deltas: list[int] = []
    floor = 0  # the smallest key a shifted range may start at
    cursor = 0
    for gap, length, delta in draw_ranges:
        b = cursor + gap
        e = b + length
        d = max(delta, floor - b)
        if d:
            begins.append(b)
            ends.append(e)
            deltas.append(d)
            floor = e + d + 1
        else:
            floor = max(floor, e + 1)
        cursor = e + 1
    return begins, ends, deltas


_shift = st.lists(st.tuples(st.integers(0, 10), st.integers(0, 5), st.integers(-8, 8)), max_size=8)


@given(keys=st.lists(st.integers(0, 120), max_size=50, unique=True), ranges=_shift)
def test_shift_keys_and_inverse(keys, ranges):
    b, e, d = _ranges(ranges)
    inside = [any(x <= k <= y for x, y in zip(b, e, strict=True)) for k in keys]
    landing = [any(x + z <= k <= y + z for x, y, z in zip(b, e, d, strict=True)) for k in keys]
    keys = [k for k, i, g in zip(keys, inside, landing, strict=True) if i or not g]  # no collisions
    want = []
    for k in keys:
        i = next((j for j in range(len(b)) if b[j] <= k <= e[j]), None)
        want.append(k if i is None else k + d[i])
    got = shift_keys(_a(keys), _a(b), _a(e), _a(d))
    assert got.tolist() == want
    back = shift_keys(got, _a(b) + _a(d), _a(e) + _a(d), -_a(d))
    assert back.tolist() == keys


@pytest.mark.parametrize("few", [None, 0, 1 << 30])  # FEW_KEYS: as set, never, always
@given(keys=st.lists(st.integers(0, 1 << 40), max_size=40), span=st.booleans())
def test_bitmaps(few, keys, span):
    from engine._kernels import arrays

    saved = arrays.FEW_KEYS
    arrays.FEW_KEYS = saved if few is None else few
    try:
        k = _a(keys)
        assert list(bitmap_from_sorted(_a(sorted(set(keys))))) == sorted(set(keys))
        small = [x % 500 for x in keys] * 3  # many repeats in a small span: the mark array
        assert list(bitmap_of(_a(small), 500 if span else 0)) == sorted(set(small))
        assert list(bitmap_of(k)) == sorted(set(keys))
        assert list(bitmap_of(k[::-1])) == sorted(set(keys))  # unsorted, repeats
    finally:
        arrays.FEW_KEYS = saved


@pytest.mark.parametrize("seed", range(4))
def test_shift_keys_of_many_sorted_keys_counts_ranges_up_to_each_key(seed):
    # more than 4 keys a range (and RADIX_MIN keys): the ranges are found among the keys
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 60_000, 20_000))
    begins = np.unique(rng.integers(-5, 60_000, 900))
    ends = np.minimum(begins + rng.integers(0, 90, begins.size), np.append(begins[1:] - 1, 1 << 40))
    deltas = rng.integers(-3, 4, begins.size)
    want = [k + next((int(d) for b, e, d in zip(begins, ends, deltas, strict=True) if b <= k <= e), 0)
            for k in keys[::97].tolist()]
    assert shift_keys(keys, begins, ends, deltas)[::97].tolist() == want
    assert shift_keys(keys[::-1], begins, ends, deltas)[::-1][::97].tolist() == want  # unsorted


@pytest.mark.parametrize("start", [0, 12_345, (1 << 32) - 200_000, (1 << 40) + 7])
@pytest.mark.parametrize("every", [1, 2, 17, 63, 300])
def test_bitmap_from_sorted_of_many_keys(start, every):
    # DENSE_MIN keys or more: bit words (dense enough: every <= 64) or array('Q') (sparser);
    # containers of both kinds (more and fewer than 4,096 keys), across a 2**32 boundary
    rng = np.random.default_rng(every)
    keys = start + np.arange(0, 400_000, every)
    keys = keys[rng.random(keys.size) < np.where(keys % 300_000 < 150_000, 0.99, 0.02)]
    got = bitmap_from_sorted(keys)
    assert len(got) == keys.size and np.array_equal(np.array(got.to_array(), dtype=np.int64), keys)


@pytest.mark.parametrize("small", [0, 1 << 30])
def test_bitmap_from_sorted_of_a_few_keys(small, monkeypatch):
    # from Python integers (``small`` large) or array('Q') (0): the same bitmap, keys past
    # 2**32 and 2**63 - 1 included
    from engine._kernels import arrays

    monkeypatch.setattr(arrays, "SMALL_MAX", small)
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 31, 32, 33):
        for high in (0, 1 << 32, (1 << 63) - 1000):
            keys = np.unique(high + rng.integers(0, 1000, n, dtype=np.int64))
            got = bitmap_from_sorted(keys)
            assert np.array_equal(np.array(got.to_array(), dtype=np.int64), keys)


def test_bitmap_from_words_skips_empty_containers():
    words = np.zeros(4 * 1024, dtype=np.uint64)
    words[1024 * 3 + 5] = 1 << 63  # the only key, in the fourth container
    assert list(bitmap_from_words(words, 1 << 16)) == [(1 << 16) + 3 * (1 << 16) + 5 * 64 + 63]
    assert list(bitmap_from_words(np.zeros(1024, dtype=np.uint64))) == []


def _laid_out(ranges, high):
    """``(starts, stops)`` of sorted, disjoint half-open ranges from ``(gap, length)`` pairs,
    the first starting ``high`` + its gap past 0."""
    starts, stops, at = [], [], high
    for gap, length in ranges:
        starts.append(at + gap)
        stops.append(at + gap + length)
        at += gap + length
    return starts, stops


@given(ranges=st.lists(st.tuples(st.integers(0, 70_000), st.integers(0, 140_000)), max_size=10),
       high=st.sampled_from([0, 1 << 32, (1 << 40) - 70_000]))
def test_bitmap_from_ranges(ranges, high):
    # sorted, disjoint (possibly touching or empty) half-open ranges, some crossing 2**16
    starts, stops = _laid_out(ranges, high)
    want = [x for s, e in zip(starts, stops, strict=True) for x in range(s, e)]
    got = bitmap_from_ranges(_a(starts), _a(stops))
    assert len(got) == len(want)
    if want:
        assert got.min() == want[0] and got.max() == want[-1]
        for s, e in zip(starts, stops, strict=True):
            if e > s:
                assert got.range_cardinality(s, e) == e - s


@given(ranges=st.lists(st.tuples(st.integers(0, 70_000), st.integers(0, 140_000)), max_size=8),
       high=st.sampled_from([0, 1 << 32, (1 << 40) - 70_000]))
def test_bitmap_from_ranges_few_equals_serialized(ranges, high):
    # up to FEW_RANGES ranges are added one by one: the same bitmap as the serialized path
    from engine._kernels import arrays

    starts, stops = _laid_out(ranges, high)
    few = bitmap_from_ranges(_a(starts), _a(stops))
    saved = arrays.FEW_RANGES
    arrays.FEW_RANGES = -1
    try:
        assert few == bitmap_from_ranges(_a(starts), _a(stops))
    finally:
        arrays.FEW_RANGES = saved


# the numeric view ---------------------------------------------------------------------------
_TYPES = [pa.int8(), pa.uint16(), pa.int32(), pa.int64(), pa.uint64(), pa.float16(), pa.float32(),
          pa.float64(), pa.timestamp("us"), pa.timestamp("ns", tz="UTC"), pa.date32(), pa.date64(),
          pa.time32("ms"), pa.time64("ns"), pa.duration("s")]


def _column(t: pa.DataType, values: list[int]) -> pa.Array:
    if pa.types.is_temporal(t):
        storage = np.array(values, dtype=np.int64 if t.bit_width == 64 else np.int32)
        return pa.array(storage).view(t)
    return pa.array(np.array(values).astype(t.to_pandas_dtype()), type=t)


@pytest.mark.parametrize("t", _TYPES, ids=str)
def test_numeric_view_is_zero_copy_and_round_trips(t):
    arr = _column(t, [5, 1, 7, 3, 9]).slice(1, 3)
    for col in (arr, pa.chunked_array([arr])):
        v = numeric_view(col)
        assert v is not None and not v.flags.writeable  # a view of Arrow's buffer
        assert pa.array(v, type=t).equals(arr)
    assert numeric_view(pa.chunked_array([arr, arr])) is None
    both = numeric_view(pa.chunked_array([arr, arr]), combine=True)
    assert both is not None and pa.array(both, type=t).equals(pa.concat_arrays([arr, arr]))
    empty = numeric_view(pa.chunked_array([], type=t))
    assert empty is not None and empty.size == 0


@pytest.mark.parametrize("col", [
    pa.array([1, None]), pa.array([True, False]), pa.array(["a"]), pa.array([1.5, None]),
    pa.chunked_array([[1], [None]]), pa.array([(1, 2, 3)], type=pa.month_day_nano_interval()),
    pa.array([1], type=pa.int32()).cast(pa.decimal128(15, 2)),
], ids=lambda c: str(c.type))
def test_numeric_view_refuses(col):
    assert numeric_view(col, combine=True) is None


def test_row_for_message_quotes_values_python_cannot_hold():
    from engine._kernels.arrays import row_for_message

    far = pa.array([1 << 62], pa.int64()).view(pa.timestamp("us"))
    t = pa.table({"k": pa.array([7], pa.int64()), "t": far})
    with pytest.raises(OverflowError):  # what quoting it with to_pylist does
        t.to_pylist()
    row = row_for_message(t, 0)
    assert row["k"] == 7 and "4611686018427387904" in str(row["t"])  # Arrow's text
    plain = pa.table({"k": [1, 2], "s": ["a", "b"]})
    assert row_for_message(plain, 1) == {"k": 2, "s": "b"}
    assert row_for_message(plain.to_batches()[0], 0) == {"k": 1, "s": "a"}


# --- aligned copies -------------------------------------------------------------------------
def misaligned(a: pa.Array) -> pa.Array:
    """``a`` with every buffer moved to one byte past an 8-byte boundary (values unchanged),
    as a record batch decoded in place from a Flight body that protobuf framed there."""
    def shifted(b: pa.Buffer | None) -> pa.Buffer | None:
        return None if b is None else pa.py_buffer(b"\0" + b.to_pybytes()).slice(1)

    return pa.Array.from_buffers(a.type, len(a), [shifted(b) for b in a.buffers()],
                                 null_count=a.null_count, offset=a.offset)


def addresses_mod_8(a: pa.Array) -> set[int]:
    return {b.address % 8 for b in a.buffers() if b is not None and b.size}


@pytest.mark.parametrize("a", [
    pa.array([1, None, 3], pa.int64()), pa.array([0.5, 1.5]), pa.array(["x", None, "yz"]),
    pa.array([True, None, False]), pa.array([1, 2, 3, 4], pa.int32()).slice(1, 2),
], ids=["int64", "float64", "string", "bool", "sliced int32"])
def test_aligned_copies_a_misaligned_array_once_and_keeps_an_aligned_one(a):
    assert aligned(a) is a  # pyarrow allocated it: 64-byte aligned
    m = misaligned(a)
    assert addresses_mod_8(m) == {1}
    out = aligned(m)
    assert out.equals(a)
    assert addresses_mod_8(out) == {0}
    assert aligned(out) is out


def test_aligned_looks_into_a_dictionary():
    a = pa.array(["b", "a", "b"]).dictionary_encode()
    m = pa.DictionaryArray.from_arrays(a.indices, misaligned(a.dictionary))
    out = aligned(m)
    assert out is not m and out.equals(a)
    assert addresses_mod_8(out.dictionary) == {0}


def test_aligned_table_copies_only_the_misaligned_columns():
    good = pa.array([1, 2, 3], pa.int64())
    t = pa.table({"a": good, "b": misaligned(pa.array(["x", "y", "z"]))})
    out = aligned_table(t)
    assert out.equals(t)
    assert out.column("a").chunk(0).buffers()[1].address == good.buffers()[1].address
    assert addresses_mod_8(out.column("b").chunk(0)) == {0}
    assert aligned_table(out) is out
