"""RowSet and RowSetShiftData: examples, then hypothesis laws against Python sets."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap64

from engine.errors import InvalidKeyError, UpdateInvariantError
from engine.rowset import RowSet, RowSetShiftData

# keys from a few scales so containers, runs and 32-bit buckets all get exercised
key = st.one_of(st.integers(0, 300), st.integers(0, 200_000), st.integers(2**32 - 50, 2**32 + 50))
keysets = st.sets(key, max_size=60)


def rs(s):
    return RowSet.from_keys(sorted(s))


def test_examples():
    r = RowSet.from_range(10, 15) | RowSet.from_keys([3])
    assert r.keys().tolist() == [3, 10, 11, 12, 13, 14]
    assert r.positions_of([3, 12, 99]).tolist() == [0, 3, -1]
    assert r.keys_at([0, -1]).tolist() == [3, 14]
    assert r.slice(1, 3).keys().tolist() == [10, 11]
    assert [a.tolist() for a in r.ranges()] == [[3, 10], [4, 15]]
    assert len(r) == 6 and r.first() == 3 and r.last() == 14
    assert RowSet.deserialize(r.serialize()) == r


def test_negative_keys_are_refused():
    with pytest.raises(InvalidKeyError, match="non-negative"):
        RowSet.from_keys([-1, 2])
    with pytest.raises(InvalidKeyError, match="non-negative"):
        RowSet.from_range(-5, 2)
    with pytest.raises(IndexError):
        RowSet.from_keys([1, 2]).keys_at([2])


def test_serialization_is_portable_roaring():
    r = RowSet.from_ranges([5, 2**33], [100_000, 2**33 + 10])
    assert BitMap64.deserialize(r.serialize()) == r.bitmap


@given(keysets, keysets)
def test_algebra_matches_sets(a, b):
    ra, rb = rs(a), rs(b)
    assert set((ra | rb).keys().tolist()) == a | b
    assert set((ra & rb).keys().tolist()) == a & b
    assert set((ra - rb).keys().tolist()) == a - b
    assert set((ra ^ rb).keys().tolist()) == a ^ b
    assert ra.issubset(ra | rb) and (ra <= rb) == (a <= b)
    assert ra.isdisjoint(rb) == a.isdisjoint(b)
    assert len(ra) == len(a) and bool(ra) == bool(a)


@given(keysets, st.lists(key, max_size=20), st.integers(-70, 70), st.integers(-70, 70))
def test_positions_and_slices(a, probe, lo, hi):
    r = rs(a)
    srt = sorted(a)
    want = [srt.index(k) if k in a else -1 for k in probe]
    assert r.positions_of(np.array(probe, dtype=np.int64)).tolist() == want
    if srt:
        pos = [p % len(srt) for p in probe]
        assert r.keys_at(pos).tolist() == [srt[p] for p in pos]
    assert r.slice(lo, hi).keys().tolist() == srt[lo:hi]


@given(st.lists(st.tuples(st.integers(0, 2**34), st.integers(1, 140_000)), max_size=30))
def test_from_ranges_matches_add_range(pairs):
    bm = BitMap64()
    starts, stops = [], []
    cursor = 0
    for gap, length in pairs:  # build sorted disjoint ranges
        s = cursor + gap % 300_000
        starts.append(s)
        stops.append(s + length)
        bm.add_range(s, s + length)
        cursor = s + length + 1
    assert RowSet.from_ranges(starts, stops).bitmap == bm
    r = RowSet.from_ranges(starts, stops)
    if starts:
        rs_, re_ = r.ranges()
        assert (RowSet.from_ranges(rs_, re_)) == r


@st.composite
def moves(draw):
    """Sorted survivors and an order-preserving new placement of them."""
    keys = sorted(draw(st.sets(st.integers(0, 5000), max_size=40)))
    n = len(keys)
    new = sorted(draw(st.sets(st.integers(0, 8000), min_size=n, max_size=n)))
    return np.array(keys, dtype=np.int64), np.array(new, dtype=np.int64)


@given(moves())
def test_shift_apply_unapply_roundtrip(mv):
    prev, cur = mv
    s = RowSetShiftData.from_moves(prev, cur)
    s.validate()
    r = RowSet.from_keys(prev, assume_sorted=True)
    assert s.apply(r).keys().tolist() == cur.tolist()
    assert s.unapply(s.apply(r)) == r
    assert s.apply_keys(prev).tolist() == cur.tolist()
    assert s.unapply_keys(cur).tolist() == prev.tolist()
    assert s.inverse().apply(s.apply(r)) == r
    moved_prev, moved_cur = s.moved_keys(r)
    assert np.all(moved_prev != moved_cur)


@given(moves(), st.data())
def test_shift_of_a_few_keys_among_many_ranges_matches_the_range_set(mv, data):
    """apply/unapply look a small RowSet up in the sorted ranges and intersect a large one
    with the ranges' (cached) RowSet: both give what a per-key model gives."""
    prev, cur = mv
    s = RowSetShiftData.from_moves(prev, cur)
    space = sorted(set(prev.tolist()) | set(range(0, 6000, 7)))
    for size in (1, 3, len(space)):  # below and above the cut-over to the range set
        keys = sorted(data.draw(st.sets(st.sampled_from(space), max_size=size)))
        r = RowSet.from_keys(np.array(keys, dtype=np.int64))
        moved = {int(a): int(b) for a, b in zip(prev, cur, strict=True)}
        inside = [k for k in keys if any(b <= k <= e for b, e in zip(s.begins, s.ends, strict=True))]
        model = sorted({moved[k] if k in moved else int(s.apply_keys(np.array([k]))[0])
                        if k in inside else k for k in keys})
        assert s.apply(r).keys().tolist() == model
        assert s.moved_keys(r)[0].tolist() == inside
        assert s.apply(r) == s.apply(r)  # the cached range set gives the same answer again


def test_shift_builder_validates_and_coalesces():
    s = RowSetShiftData.from_arrays([0, 3, 10], [2, 5, 12], [4, 4, 1])
    assert (s.begins.tolist(), s.ends.tolist(), s.deltas.tolist()) == ([0, 10], [5, 12], [4, 1])
    for args, rule in [
        (([5], [4], [1]), "S1"),            # empty range
        (([0, 3], [4, 6], [1, 1]), "S2"),   # overlapping before
        (([0, 5], [2, 6], [5, 0 + 1]), "S3"),  # 0..2 -> 5..7 overlaps 5..6 -> 6..7
        (([0], [2], [-1]), "S4"),          # below zero
    ]:
        with pytest.raises(UpdateInvariantError, match=rule):
            RowSetShiftData.from_arrays(*args)
    assert not RowSetShiftData.from_arrays([1], [2], [0])  # zero deltas are dropped


def test_shift_example_from_the_seed():
    # SortedKVTable: A, B, D at 0, 1, 2; C is inserted at 2 and D shifts to 3
    s = RowSetShiftData.from_arrays([2], [2], [1])
    assert s.apply(RowSet.from_keys([0, 1, 2])).keys().tolist() == [0, 1, 3]
