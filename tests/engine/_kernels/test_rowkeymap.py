"""engine._kernels.rowkeymap: RowKeyMap against a plain dict, dense, by region, sorted and
hashed, with shifts; engine._kernels.sortedmap's SortedU64Map against a dict."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels import rowkeymap
from engine._kernels.rowkeymap import RowKeyMap
from engine._kernels.sortedmap import SortedU64Map


def _a(xs: list[int]) -> npt.NDArray[np.int64]:
    return np.array(xs, dtype=np.int64)


def _check(m: RowKeyMap, model: dict[int, int]) -> None:
    keys, vals = m.items()
    assert keys.tolist() == sorted(model)
    assert vals.tolist() == [model[k] for k in sorted(model)]
    keys, vals = m.items(ordered=False)  # the same entries, in any order
    assert keys.size == len(model) and dict(zip(keys.tolist(), vals.tolist(), strict=True)) == model
    assert m.count == len(m) == len(model)


def test_dense_example():
    m = RowKeyMap()
    m.insert(_a([3, 4, 5]), _a([0, 1, 2]))
    assert m.lookup(_a([2, 3, 5, 6, 10**6])).tolist() == [-1, 0, 2, -1, -1]
    assert m.remove(_a([4, 9])).tolist() == [1, -1]  # absent keys are ignored
    m.put(_a([5, 7]), _a([20, 21]))  # 5 overwritten, 7 new
    m.set_values(_a([7]), _a([22]))
    m.set_values(_a([7]), _a([21]))
    assert m.move(_a([3, 5]), _a([5, 6])).tolist() == [0, 20]  # 3 lands where 5 left
    assert not m.hashed
    _check(m, {5: 0, 6: 20, 7: 21})


def test_goes_from_dense_to_hash_when_keys_spread():
    m = RowKeyMap()
    m.insert(np.arange(10, 20), np.arange(100, 110))
    assert m.lookup(_a([9, 10, 19, 20])).tolist() == [-1, 100, 109, -1]
    m.remove(_a([12]))
    m.put(_a([13]), _a([7]))
    far = _a([1 << 40, (1 << 40) + 5])
    m.insert(far, _a([1, 2]))  # too sparse for an array: a map per region now
    assert m.hashed
    assert m.lookup(_a([12, 13, 19, 1 << 40, (1 << 40) + 5, 3])).tolist() == [-1, 7, 109, 1, 2, -1]
    assert m.count == 11


def test_keys_dense_within_regions_get_a_dense_map_per_region():
    # a merge of three parents: each one's keys dense in its region of 2**40
    m = RowKeyMap()
    keys = np.concatenate([np.arange(100) + (r << 40) for r in range(3)])
    m.insert(keys, np.arange(300))
    assert m.layout == "regions" and m.hashed
    assert all(sub.layout == "dense" for sub in m._regions.values())
    probe = _a([5, (1 << 40) + 7, (2 << 40) + 99, (3 << 40) + 1, 100, -1])
    assert m.lookup(probe).tolist() == [5, 107, 299, -1, -1, -1]
    assert m.lookup(_a([(1 << 40) + 3])).tolist() == [103]  # one region: no split
    assert m.remove(_a([(2 << 40) + 1, 3, (5 << 40)])).tolist() == [201, 3, -1]
    m.shift(_a([(1 << 40) + k for k in range(100)]), _a([1 << 40]), _a([(1 << 40) + 99]), _a([10]))
    model = {int(k): i for i, k in enumerate(keys.tolist())}
    del model[(2 << 40) + 1], model[3]
    model = {(k + 10 if k >> 40 == 1 else k): v for k, v in model.items()}
    _check(m, model)
    assert m.lookup(_a([(1 << 40) + 10, (1 << 40)])).tolist() == [100, -1]


def test_regions_turn_hashed_past_max_regions(monkeypatch):
    monkeypatch.setattr(rowkeymap, "MAX_REGIONS", 3)
    m = RowKeyMap()
    m.insert(_a([1, (1 << 40) + 1]), _a([0, 1]))
    assert m.layout == "regions"
    m.insert(_a([(2 << 40) + 1]), _a([2]))  # three regions: still by region
    assert m.layout == "regions"
    m.insert(_a([(7 << 40), 2]), _a([3, 4]))  # a fourth: sparse, once and for good
    assert m.layout == "sorted"
    _check(m, {1: 0, 2: 4, (1 << 40) + 1: 1, (2 << 40) + 1: 2, 7 << 40: 3})


def test_regions_turn_hashed_when_one_region_spreads():
    m = RowKeyMap()
    m.insert(_a([0, 1, 1 << 40]), _a([0, 1, 2]))
    assert m.layout == "regions"
    far = (1 << 40) + 4 + rowkeymap.SPARSE_SLACK + 10  # region 1 spreads past the rule
    m.put(_a([far, 1]), _a([3, 4]))
    assert m.layout == "sorted"
    _check(m, {0: 0, 1: 4, 1 << 40: 2, far: 3})
    m = RowKeyMap()
    m.insert(_a([0, 1 << 40, (1 << 40) + 1 + 4 * 3 + rowkeymap.SPARSE_SLACK]), _a([0, 1, 2]))
    assert m.layout == "sorted"  # sparse within region 1 from the start


def test_the_one_threshold():
    edge = 4 * 2 + rowkeymap.SPARSE_SLACK  # the span allowed for 2 keys
    m = RowKeyMap()
    m.insert(_a([0]), _a([0]))
    m.insert(_a([edge - 1]), _a([1]))  # outside the first window, span == edge: still dense
    assert not m.hashed
    _check(m, {0: 0, edge - 1: 1})
    m = RowKeyMap()
    m.insert(_a([0]), _a([0]))
    m.insert(_a([edge]), _a([1]))  # span edge + 1: hashed, once and for good
    assert m.hashed
    m.remove(_a([edge]))
    m.insert(_a([1]), _a([2]))
    assert m.hashed
    _check(m, {0: 0, 1: 2})


@pytest.mark.parametrize("ratio", [4, 32])
def test_the_threshold_with_another_ratio(ratio):
    edge = ratio * 2 + rowkeymap.SPARSE_SLACK  # the span allowed for 2 keys
    for last, hashed in ((edge - 1, False), (edge, True)):
        m = RowKeyMap(dense_ratio=ratio)
        m.insert(_a([0]), _a([0]))
        m.insert(_a([last]), _a([1]))
        assert m.hashed is hashed
        _check(m, {0: 0, last: 1})


def test_window_slides_with_ring_keys():
    m = RowKeyMap()
    for start in range(0, 2_000_000, 50_000):  # a ring of 100k rows moving up
        new = np.arange(start + 100_000, start + 150_000, dtype=np.int64)
        m.insert(new, new % 7)
        if start:
            m.remove(np.arange(start, start + 50_000, dtype=np.int64))
    assert not m.hashed and m.count == 100_000
    assert m._vals.size < 4 * 100_000  # the window follows the keys, it does not grow
    keys = np.arange(2_000_000, 2_100_000, dtype=np.int64)
    assert (m.lookup(keys) == keys % 7).all()


def test_negative_keys_are_absent_and_refused():
    m = RowKeyMap()
    m.insert(_a([0, 1]), _a([5, 6]))
    assert m.lookup(_a([-1, 0, -5])).tolist() == [-1, 5, -1]
    assert m.remove(_a([-1])).tolist() == [-1]
    with pytest.raises(ValueError, match="non-negative"):
        m.insert(_a([-3]), _a([1]))


def test_shift_moves_ranges_at_once():
    m = RowKeyMap()
    m.insert(_a([1, 2, 3, 7, 8]), _a([10, 20, 30, 70, 80]))
    src, dst, vals = m.shift(_a([1, 2, 3, 7, 8]), _a([2, 7]), _a([3, 8]), _a([3, 2]))
    assert (src.tolist(), dst.tolist(), vals.tolist()) == ([2, 3, 7, 8], [5, 6, 9, 10], [20, 30, 70, 80])
    _check(m, {1: 10, 5: 20, 6: 30, 9: 70, 10: 80})
    m.shift(_a([5, 6, 9, 10]), _a([5, 9]), _a([6, 10]), _a([-3, -4]))  # down onto vacated keys
    _check(m, {1: 10, 2: 20, 3: 30, 5: 70, 6: 80})


# property tests -----------------------------------------------------------------------------
# small keys, keys anywhere, and merge-like keys: dense within a few regions of 2**40
_keys = st.lists(st.one_of(st.integers(0, 60), st.integers(0, 1 << 45),
                           st.tuples(st.integers(0, 5), st.integers(0, 200)).map(lambda t: (t[0] << 40) + t[1])),
                 max_size=25)
_ops = st.lists(
    st.tuples(st.sampled_from(["insert", "put", "set", "remove", "move", "shift"]), _keys,
              st.integers(-70, 70), st.integers(-70, 70)),
    max_size=30,
)


def _two_ranges(present: list[int], cut: int, d1: int, d2: int) -> tuple[list[int], list[int], list[int]]:
    """Valid shift ranges over the sorted ``present`` keys: ``present[:cut]`` moves by about
    ``d1``, ``present[cut:]`` by about ``d2``, clamped so nothing goes below 0 or reorders."""
    b: list[int] = []
    e: list[int] = []
    d: list[int] = []
    if not present:
        return b, e, d
    cut = cut % (len(present) + 1)
    if cut:
        d1 = max(d1, -present[0])
        if d1:
            b, e, d = [present[0]], [present[cut - 1]], [d1]
    else:
        d1 = 0
    if cut < len(present):
        if cut:
            d2 = max(d2, present[cut - 1] + d1 + 1 - present[cut])
        else:
            d2 = max(d2, -present[0])
        if d2:
            b, e, d = [*b, present[cut]], [*e, present[-1]], [*d, d2]
    return b, e, d


@pytest.mark.parametrize(("slack", "regions", "sorted_max", "sorted_batch"),
                         [(0, 64, 1 << 17, 2048), (0, 64, 0, 2048), (0, 64, 12, 2048),
                          (0, 64, 1 << 17, 6), (65536, 64, 1 << 17, 2048), (65536, 3, 1 << 17, 2048),
                          (65536, 1, 1 << 17, 2048), (65536, 3, 0, 2048), (65536, 3, 1 << 17, 6)])
@given(ops=_ops)
def test_against_dict(slack, regions, sorted_max, sorted_batch, ops):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowkeymap, "SPARSE_SLACK", slack)  # 0: most maps turn sparse
        mp.setattr(rowkeymap, "MAX_REGIONS", regions)  # 1: never by region; 3: often one too many
        mp.setattr(rowkeymap, "SORTED_MAX", sorted_max)  # 0: sparse is hashed; 12: sorted, then hashed
        mp.setattr(rowkeymap, "SORTED_BATCH", sorted_batch)  # 6: a larger call turns it hashed
        mp.setattr(SortedU64Map, "delta_min", 2)  # the sorted map's merges and compactions, often
        _run_against_dict(ops)


def test_sparse_turns_hashed_past_sorted_max(monkeypatch):
    monkeypatch.setattr(rowkeymap, "SORTED_MAX", 5)
    m = RowKeyMap()
    m.insert(_a([0, 1 << 30]), _a([0, 1]))  # sparse in one region
    assert m.layout == "sorted"
    m.insert(_a([5, 7, 9]), _a([2, 3, 4]))  # 5 keys: still sorted
    assert m.layout == "sorted"
    m.put(_a([9, 11]), _a([5, 6]))  # a sixth: hashed, once and for good
    assert m.layout == "hashed"
    m.remove(_a([0, 5, 7]))
    assert m.layout == "hashed"
    _check(m, {9: 5, 11: 6, 1 << 30: 1})


def test_sparse_turns_hashed_at_a_large_call(monkeypatch):
    monkeypatch.setattr(rowkeymap, "SORTED_BATCH", 3)
    m = RowKeyMap()
    m.insert(_a([0, 1 << 30]), _a([0, 1]))
    assert m.layout == "sorted"
    assert m.lookup(_a([0, 5, 1 << 30])).tolist() == [0, -1, 1]  # 3 keys: still sorted
    assert m.layout == "sorted"
    assert m.lookup(_a([0, 5, 6, 1 << 30])).tolist() == [0, -1, -1, 1]  # 4: hashed first
    assert m.layout == "hashed"
    m = RowKeyMap()
    m.insert(_a([0]), _a([0]))
    m.insert(_a([1 << 30, 1 << 31, 1 << 32, 1 << 33]), _a([1, 2, 3, 4]))  # sparse, and large
    assert m.layout == "hashed"
    _check(m, {0: 0, 1 << 30: 1, 1 << 31: 2, 1 << 32: 3, 1 << 33: 4})


# SortedU64Map on its own: uint64 keys of the whole range, appends, merges, tombstones
_u64_keys = st.lists(st.one_of(st.integers(0, 40), st.integers(0, (1 << 64) - 1)), max_size=20)


@pytest.mark.parametrize("delta_min", [1, 3, 4096])
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "append", "delete", "set"]), _u64_keys),
                    max_size=30))
def test_sorted_map_against_dict(delta_min, ops):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SortedU64Map, "delta_min", delta_min)
        m, model = SortedU64Map(), dict[int, int]()
        counter = 0
        for op, ks in ops:
            ks = list(dict.fromkeys(ks))
            if op == "append":  # keys above every key held: the base's append path
                top = max(model, default=-1)
                ks = [top + 1 + k for k in sorted(k % 50 for k in ks) if top + 1 + k < 1 << 64]
                ks = list(dict.fromkeys(ks))
            vals = list(range(counter, counter + len(ks)))
            counter += len(ks)
            u = np.array(ks, dtype=np.uint64)
            if op in ("insert", "append"):
                new = [k not in model for k in ks]
                m.insert(u[new], np.array(vals, dtype=np.int64)[new])
                model.update((k, v) for k, v, n in zip(ks, vals, new, strict=True) if n)
            elif op == "delete":
                m.delete(u)
                for k in ks:
                    model.pop(k, None)
            else:
                m.set_values(u, np.array(vals, dtype=np.int64))
                model.update((k, v) for k, v in zip(ks, vals, strict=True) if k in model)
            assert len(m) == len(model)
            keys, got = m.items()
            assert keys.tolist() == sorted(model)
            assert got.tolist() == [model[k] for k in sorted(model)]
            probe = np.array([*ks, 0, 1, 41, (1 << 64) - 1], dtype=np.uint64)
            assert m.lookup(probe).tolist() == [model.get(int(k), -1) for k in probe.tolist()]


def _run_against_dict(ops: list[tuple[str, list[int], int, int]]) -> None:
    m, model = RowKeyMap(), dict[int, int]()
    counter = 0
    for op, ks, n, n2 in ops:
        ks = list(dict.fromkeys(ks))  # distinct within a call
        vals = list(range(counter, counter + len(ks)))
        counter += len(ks)
        if op == "insert":
            ks = [k for k in ks if k not in model]
            m.insert(_a(ks), _a(vals[: len(ks)]))
            model.update(zip(ks, vals, strict=False))
        elif op == "put":
            m.put(_a(ks), _a(vals))
            model.update(zip(ks, vals, strict=True))
        elif op == "set":  # present keys only
            ks = [k for k in ks if k in model]
            m.set_values(_a(ks), _a(vals[: len(ks)]))
            model.update(zip(ks, vals, strict=False))
        elif op == "remove":
            got = m.remove(_a(ks))
            assert got.tolist() == [model.pop(k, -1) for k in ks]
        elif op == "move":  # present keys move to keys that are absent or among the movers
            src = [k for k in ks if k in model]
            free = [k + 1 + abs(n) for k in src]
            dst = list(dict.fromkeys(d for d in free if d not in model or d in src))[: len(src)]
            src = src[: len(dst)]
            moved = [model.pop(k) for k in src]
            assert m.move(_a(src), _a(dst)).tolist() == moved
            model.update(zip(dst, moved, strict=True))
        else:
            present = sorted(model)
            b, e, d = _two_ranges(present, len(ks), n, n2)
            movers, _, got = m.shift(_a(present), _a(b), _a(e), _a(d))
            want = {}
            for k in present:
                i = next((j for j in range(len(b)) if b[j] <= k <= e[j]), None)
                want[k if i is None else k + d[i]] = model[k]
            assert got.tolist() == [model[k] for k in movers.tolist()]
            model = want
        _check(m, model)
        probe = _a([*ks, 0, 1, 61, 1 << 44])
        assert m.lookup(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
