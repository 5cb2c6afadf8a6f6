"""engine._kernels.ids: IdAllocator against a plain model (a set of live ids and a FIFO)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels.ids import IdAllocator


def _a(xs: list[int]) -> npt.NDArray[np.int64]:
    return np.array(xs, dtype=np.int64)


def test_example_cycles():
    ids = IdAllocator()
    assert ids.allocate(3).tolist() == [0, 1, 2]
    ids.free(_a([2, 0]))
    assert ids.allocate(1).tolist() == [3]  # freed this cycle: not yet
    assert ids.reusable == 0
    ids.release()  # the next cycle
    ids.free(_a([1]))
    assert ids.allocate(3).tolist() == [2, 0, 4]  # first freed first, in the order given
    ids.release()
    assert ids.allocate(2).tolist() == [1, 5]
    assert ids.end == 6


def test_empty_calls():
    ids = IdAllocator()
    assert ids.allocate(0).size == 0
    ids.free(_a([]))
    ids.release()
    assert ids.end == 0 and ids.reusable == 0


def test_allocated_ids_are_the_callers():
    ids = IdAllocator()
    ids.free(ids.allocate(4))
    ids.release()
    got = ids.allocate(2)
    got[:] = -7  # must not reach the free list
    assert ids.allocate(2).tolist() == [2, 3]


_cycles = st.lists(  # per cycle: (allocations, indexes of live ids to free)
    st.lists(st.tuples(st.integers(0, 20), st.lists(st.integers(0, 10**6), max_size=15)),
             max_size=4),
    max_size=12,
)


@given(cycles=_cycles)
def test_against_a_model(cycles):
    ids = IdAllocator()
    live: set[int] = set()
    reusable: list[int] = []  # the model: FIFO of ids freed in earlier cycles
    freed_now: list[int] = []
    end = 0
    for calls in cycles:
        ids.release()
        reusable += freed_now
        freed_now = []
        for n, picks in calls:
            got = ids.allocate(n).tolist()
            take = min(n, len(reusable))
            want = reusable[:take] + list(range(end, end + n - take))
            reusable = reusable[take:]
            end += n - take
            assert got == want
            assert not live & set(got)  # never an id that is live
            live |= set(got)
            pool = sorted(live)
            gone = list(dict.fromkeys(pool[p % len(pool)] for p in picks)) if pool else []
            ids.free(_a(gone))
            live -= set(gone)
            freed_now += gone
        assert ids.end == end and ids.reusable == len(reusable)
