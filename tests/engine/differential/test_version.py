"""Versions and frontiers: seed 002 (v5) examples, then lattice laws with hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.differential.version import (
    Antichain,
    Version,
    advance_times,
    times_less_equal,
    times_up_to,
)
from engine.errors import InputError

# ---------------------------------------------------------------------------------------
# examples


def test_product_order_examples():
    a, b, c = Version(1, 1), Version(3, 2), Version(2, 4)
    assert a <= b and a <= c
    assert not (b <= c) and not (c <= b)           # incomparable
    assert Version(2, 2) <= Version(2, 2) and not (Version(2, 2) < Version(2, 2))
    assert Version(1, 2) < Version(1, 3)
    assert Version(5) == Version((5,)) == Version([5]) and Version(5) != Version(5, 0)


def test_join_and_meet_are_coordinatewise():
    assert Version(1, 4).join(Version(3, 2)) == Version(3, 4)
    assert Version(1, 4).meet(Version(3, 2)) == Version(1, 2)


def test_seed_frontier_example():
    # seed 002: f = Antichain([(2, 5), (4, 1)]); f <= (3, 6) but not f <= (3, 3)
    f = Antichain([(2, 5), (4, 1)])
    assert f.less_equal_version(Version(3, 6))
    assert not f.less_equal_version(Version(3, 3))
    assert f.less_equal_version(Version(4, 1)) and not f.less_than_version(Version(4, 1))


def test_frontier_after_closing_the_origin():
    # seed 002: once (0, 0) is done, the versions that may still get data start at
    # {(1, 0), (0, 1)}: an antichain of two incomparable elements
    f = Antichain([(1, 0), (0, 1), (1, 1), (5, 7)])
    assert f.elements == (Version(0, 1), Version(1, 0))
    assert not f.less_equal_version(Version(0, 0))
    assert all(f.less_equal_version(Version(i, j)) for i in range(3) for j in range(3) if (i, j) != (0, 0))


def test_frontier_meet_and_join():
    f, g = Antichain([(0, 2)]), Antichain([(2, 0)])
    assert f.meet(g) == Antichain([(0, 2), (2, 0)])
    assert f.join(g) == Antichain([(2, 2)])
    assert f.meet(Antichain()) == f                 # the empty frontier is the top
    assert f.join(Antichain()) == Antichain()
    assert Antichain([(0, 2), (2, 0)]).less_equal(Antichain([(2, 2)]))
    assert not Antichain([(2, 2)]).less_equal(Antichain([(0, 2), (2, 0)]))
    assert Antichain([(1, 1)]).less_equal(Antichain())


def test_frontiers_only_advance():
    f = Antichain([3])
    f.check_advance(Antichain([5]))
    f.check_advance(Antichain())
    with pytest.raises(InputError, match="cannot go back"):
        f.check_advance(Antichain([2]))
    with pytest.raises(InputError, match="behind the frontier"):
        f.check_version(Version(2))
    f.check_version(Version(3))


def test_compaction_keeps_what_the_future_can_see():
    # seed 002: with frontier {(3, 3)}, (2, 4) and (2, 3) must not be merged: (3, 3) sees
    # (2, 3) but not (2, 4). Advanced, they become (3, 4) and (3, 3): still distinct.
    f = Antichain([(3, 3)])
    assert Version(2, 4).advance_by(f) == Version(3, 4)
    assert Version(2, 3).advance_by(f) == Version(3, 3)
    # a total order collapses everything before the frontier onto it
    assert Version(1).advance_by(Antichain([7])) == Version(7)
    assert Version(9).advance_by(Antichain([7])) == Version(9)
    # two-element frontier: the meet of the joins
    assert Version(0, 0).advance_by(Antichain([(1, 0), (0, 1)])) == Version(0, 0)
    assert Version(0, 5).advance_by(Antichain([(1, 0), (0, 1)])) == Version(0, 5)


def test_bad_versions():
    with pytest.raises(InputError, match="non-negative"):
        Version(-1)
    with pytest.raises(InputError, match="coordinates"):
        Version(1).less_equal(Version(1, 2))
    with pytest.raises(InputError, match="one dimension"):
        Antichain([(1,), (1, 2)])
    with pytest.raises(InputError, match="no nested scope"):
        Version(1).truncate()
    assert Version(1).extend().truncate() == Version(1)


def test_vectorized_helpers_on_examples():
    t = np.array([[0, 5], [2, 2], [4, 4]], dtype=np.int64)
    f = Antichain([(1, 0), (0, 3)])
    assert times_less_equal(f, t).tolist() == [True, True, True]
    assert times_less_equal(Antichain([(3, 3)]), t).tolist() == [False, False, True]
    assert times_up_to(t, Version(2, 5)).tolist() == [True, True, False]
    assert advance_times(t, Antichain([(3, 3)])).tolist() == [[3, 5], [3, 3], [4, 4]]


# ---------------------------------------------------------------------------------------
# laws

DIMS = 2
coord = st.integers(0, 6)
versions = st.tuples(coord, coord).map(Version)
antichains = st.lists(versions, max_size=4).map(Antichain)


@given(versions, versions, versions)
def test_product_order_is_a_partial_order(a, b, c):
    assert a <= a
    if a <= b and b <= a:
        assert a == b
    if a <= b and b <= c:
        assert a <= c
    if a <= b:
        assert a.sort_key() <= b.sort_key()        # lexicographic extends the order


@given(versions, versions, versions)
def test_lattice_laws(a, b, c):
    assert a.join(b) == b.join(a) and a.meet(b) == b.meet(a)
    assert a.join(b.join(c)) == a.join(b).join(c)
    assert a.meet(b.meet(c)) == a.meet(b).meet(c)
    assert a.join(a.meet(b)) == a and a.meet(a.join(b)) == a
    assert a <= a.join(b) and a.meet(b) <= a
    # least upper bound: anything above both is above the join
    if a <= c and b <= c:
        assert a.join(b) <= c
    if c <= a and c <= b:
        assert c <= a.meet(b)


@given(antichains)
def test_antichain_elements_are_incomparable(f):
    for x in f:
        for y in f:
            assert x == y or not (x <= y)


@given(antichains, antichains, versions)
def test_frontier_meet_join_are_union_and_intersection_of_upper_sets(f, g, v):
    assert f.meet(g).less_equal_version(v) == (f.less_equal_version(v) or g.less_equal_version(v))
    assert f.join(g).less_equal_version(v) == (f.less_equal_version(v) and g.less_equal_version(v))
    assert f.meet(g).less_equal(f) and f.less_equal(f.join(g))


@given(antichains, antichains, st.lists(versions, min_size=1, max_size=6))
def test_frontier_order_is_inclusion_of_upper_sets(f, g, probes):
    if f.less_equal(g):
        for v in probes:
            if g.less_equal_version(v):
                assert f.less_equal_version(v)


@given(versions, antichains.filter(bool), st.lists(versions, min_size=1, max_size=8))
def test_advance_by_preserves_comparisons_beyond_the_frontier(t, f, probes):
    adv = t.advance_by(f)
    assert t <= adv
    for u in probes:
        if f.less_equal_version(u):
            assert (t <= u) == (adv <= u)


@given(st.lists(versions, min_size=1, max_size=10), antichains.filter(bool))
def test_vectorized_advance_and_compare_match_the_scalar_ones(ts, f):
    arr = np.array([t.coords for t in ts], dtype=np.int64).reshape(-1, DIMS)
    assert advance_times(arr, f).tolist() == [list(t.advance_by(f).coords) for t in ts]
    assert times_less_equal(f, arr).tolist() == [f.less_equal_version(t) for t in ts]
