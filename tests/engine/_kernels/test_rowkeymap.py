"""engine._kernels.rowkeymap: RowKeyMap against a plain dict, dense and hashed (a sorted base
and a delta: bulk loads, tombstones, folds, dissolves, the base's directory), with shifts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels import rowkeymap
from engine._kernels.rowkeymap import RowKeyMap


def _a(xs: list[int]) -> npt.NDArray[np.int64]:
    return np.array(xs, dtype=np.int64)


def _check(m: RowKeyMap, model: dict[int, int]) -> None:
    keys, vals = m.items()
    assert keys.tolist() == sorted(model)
    assert vals.tolist() == [model[k] for k in sorted(model)]
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
    m.insert(far, _a([1, 2]))  # too sparse for an array: a hash map now
    assert m.hashed
    assert m.lookup(_a([12, 13, 19, 1 << 40, (1 << 40) + 5, 3])).tolist() == [-1, 7, 109, 1, 2, -1]
    assert m.count == 11


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


def _sparse(m: RowKeyMap) -> rowkeymap._Sparse:
    assert m._sparse is not None
    return m._sparse


def test_sorted_sparse_batch_becomes_the_base():
    keys = np.frombuffer((np.arange(10_000, dtype=np.int64) << 24).tobytes(), dtype=np.int64)
    m = RowKeyMap()
    m.insert(keys, np.arange(keys.size))  # read-only input (a bitmap's array)
    sp = _sparse(m)
    assert m.hashed and sp.delta.count == 0 and sp.keys.tolist() == keys.tolist()
    assert sp.keys.base is None  # copied: the caller may reuse its arrays
    assert m.lookup(_a([0, 5 << 24, (5 << 24) + 1, 9999 << 24, 10_000 << 24])).tolist() == [
        0, 5, -1, 9999, -1]
    _check(m, dict(zip(keys.tolist(), range(keys.size), strict=True)))


def test_unsorted_batch_is_sorted_into_the_base():
    m = RowKeyMap()
    keys = (np.random.default_rng(0).permutation(10_000) << 30).astype(np.int64)
    m.insert(keys, keys >> 30)
    assert _sparse(m).delta.count == 0
    _check(m, {k: k >> 30 for k in keys.tolist()})


def test_tombstones_revive_in_place():
    keys = np.arange(10_000, dtype=np.int64) << 24
    k = keys.tolist()
    m = RowKeyMap()
    m.insert(keys, np.arange(10_000))
    sp = _sparse(m)
    m.remove(keys[100:200])
    assert sp.dead == 100 and m.count == 9900
    assert m.lookup(keys[99:101]).tolist() == [99, -1]
    m.insert(keys[150:160], np.arange(10))  # a plain insert does not look: to the delta
    assert sp.delta.count == 10 and sp.dead == 100
    m.put(keys[160:170], np.arange(10))  # a put looks anyway: revived in place
    assert sp.delta.count == 10 and sp.dead == 90 and m.count == 9920
    m.put(keys[[149, 150]], _a([70, 71]))  # a tombstone, and a tombstone's key live in the delta
    assert sp.delta.count == 10 and sp.dead == 89 and m.count == 9921
    m.set_values(keys[[151, 160]], _a([72, 73]))
    assert m.lookup(keys[148:153]).tolist() == [-1, 70, 71, 72, 2]
    # a shift closing a gap lands on the keys it vacates: values move, keys stay
    m.remove(keys[:1])
    m.move(keys[1:50], keys[:49])
    assert sp.delta.count == 10 and sp.dead == 90 and _sparse(m) is sp
    model = {k[i]: i for i in range(10_000) if not 100 <= i < 200}
    model.update(zip(k[:49], range(1, 50), strict=True))
    del model[k[49]]
    model.update(zip(k[149:170], [70, 71, 72, *range(2, 10), 73, *range(1, 10)], strict=True))
    assert m.move(_a([k[149], 12345]), _a([k[149] + 1, 12346])).tolist() == [70, -1]  # one absent
    model[k[149] + 1] = model.pop(k[149])
    _check(m, model)


def test_the_fold_rule():
    keys = np.arange(40_000, dtype=np.int64) << 24
    m, model = RowKeyMap(), dict[int, int]()

    def insert(a: int, b: int) -> None:
        m.insert(keys[a:b], np.arange(b - a))
        model.update(zip(keys[a:b].tolist(), range(b - a), strict=True))

    def remove(a: int, b: int) -> None:
        m.remove(keys[a:b])
        for k in keys[a:b].tolist():
            del model[k]

    insert(0, 10_000)  # into nothing: the base
    sp = _sparse(m)
    remove(0, 1000)
    insert(10_000, 11_000)  # 1000 * 8 < 10k entries: to the delta
    insert(11_000, 11_250)
    assert sp.delta.count == 1250 and sp.dead == 1000 and sp.keys.size == 10_000
    insert(11_250, 12_750)  # 1500 * 8 > 11_250 entries: a fold
    assert sp.delta.count == 0 and sp.dead == 0 and sp.keys.size == m.count == 11_750
    remove(1000, 4000)  # removes never drop tombstones
    assert sp.dead == 3000 and sp.keys.size == 11_750
    insert(12_750, 12_760)  # tombstones past a quarter, a small delta: a fold
    assert sp.dead == 0 and sp.delta.count == 0 and sp.keys.size == m.count == 8760
    for a in range(20_000, 25_000, 1000):  # churn: inserts to the delta, then removes
        insert(a, a + 1000)
    remove(4000, 6200)
    assert sp.dead == 2200 and sp.delta.count == 5000
    insert(30_000, 30_010)  # tombstones past a quarter, a big delta: the base dissolves
    assert sp.keys.size == 0 and sp.dead == 0 and sp.delta.count == m.count == 11_570
    remove(20_000, 20_010)  # the delta holds most keys: probed first
    _check(m, model)


def test_lookups_fold_a_delta_they_keep_probing():
    keys = np.arange(20_000, dtype=np.int64) << 24
    m = RowKeyMap()
    m.insert(keys[:10_000], np.arange(10_000))
    sp = _sparse(m)
    m.insert(keys[10_000:10_100], np.arange(100))
    probe = keys[9950:10_050]
    for _ in range(3):  # each probe of the delta costs 3072 + 2 * 50 keys folded; 10_100 held
        assert sp.delta.count == 100
        assert m.lookup(probe).tolist() == [*range(9950, 10_000), *range(50)]
    m.lookup(probe)
    assert sp.delta.count == 0 and sp.keys.size == 10_100
    assert m.lookup(probe).tolist() == [*range(9950, 10_000), *range(50)]


def test_small_maps_fold_small_batches():
    m = RowKeyMap()
    m.insert(_a([1 << 40]), _a([0]))  # dense
    m.insert(_a([5, 1 << 41]), _a([1, 2]))  # hashed: 2 keys * 8 > the 1 held: one base
    sp = _sparse(m)
    assert sp.keys.tolist() == [5, 1 << 40, 1 << 41] and sp.delta.count == 0
    _check(m, {5: 1, 1 << 40: 0, 1 << 41: 2})


@pytest.mark.parametrize("kind", ["uniform", "regions", "island", "clustered", "tiny"])
@pytest.mark.parametrize("scan", [0, 1, 8])
def test_directory_finds_what_binary_search_finds(kind, scan):
    rng = np.random.default_rng(7)
    if kind == "uniform":
        keys = np.unique(rng.integers(0, 1 << 40, 50_000))
    elif kind == "regions":  # a merge: dense islands at i << 40
        keys = np.concatenate([(i << 40) + np.arange(5000) * (1 + i) for i in range(4)])
    elif kind == "island":  # spread keys and one dense island: a level-2 segment alone
        keys = np.unique(np.concatenate([rng.integers(0, 1 << 49, 5000), (1 << 50) + np.arange(5000)]))
    elif kind == "clustered":
        keys = np.unique(np.concatenate([c + rng.integers(0, 1 << k, 3000)
                                         for k, c in zip([4, 12, 30, 50], [0, 1 << 20, 1 << 40, 1 << 55],
                                                         strict=True)]))
    else:
        keys = _a([7])
    keys = keys.astype(np.int64)
    q = np.concatenate([rng.choice(keys, 20_000), keys[:5] - 1, keys[-5:] + 1, _a([-1, -(1 << 62), 1 << 62]),
                        rng.integers(0, keys[-1] + 2, 5000)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowkeymap, "_SCAN", scan)
        found = rowkeymap._Directory(keys).find(q)
    p = np.minimum(np.searchsorted(keys, q), keys.size - 1)
    assert found.tolist() == np.where(keys[p] == q, p, -1).tolist()


# property tests -----------------------------------------------------------------------------
_keys = st.lists(st.one_of(st.integers(0, 60), st.integers(0, 1 << 45)), max_size=25)
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


@pytest.mark.parametrize("slack", [0, 65536])
@given(ops=_ops)
def test_against_dict(slack, ops):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowkeymap, "SPARSE_SLACK", slack)  # 0: most maps turn hashed
        _run_against_dict(ops)


# the hashed layout's parts: folds at every chance or almost never, the base probed by
# binary search or by a directory with crowded buckets everywhere
_HASHED = [pytest.param(b, r, s, c, id=f"batch{b}-rent{r}-scan{s}-call{c}")
           for b, r, s, c in [(8, 32, 8, 3072), (1, 10**9, 0, 0), (1, 10**9, 8, 64),
                              (10**9, 10**9, 1, 10**9), (2, 0, 8, 3072)]]


@pytest.mark.parametrize(("batch", "rent", "scan", "call"), _HASHED)
@given(bulk=st.lists(st.one_of(st.integers(0, 60), st.integers(0, 1 << 45)), max_size=40, unique=True),
       ops=_ops)
def test_hashed_against_dict(batch, rent, scan, call, bulk, ops):
    """A sorted bulk load (the base), then the random operations."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowkeymap, "SPARSE_SLACK", 0)
        mp.setattr(rowkeymap, "_BATCH", batch)
        mp.setattr(rowkeymap, "_RENT", rent)
        mp.setattr(rowkeymap, "_SCAN", scan)
        mp.setattr(rowkeymap, "_DELTA_CALL", call)
        _run_against_dict(ops, sorted(bulk))


def _run_against_dict(ops: list[tuple[str, list[int], int, int]], bulk: Sequence[int] = ()) -> None:
    m, model = RowKeyMap(), dict[int, int]()
    m.insert(_a(list(bulk)), _a(list(range(len(bulk)))))
    model.update(zip(bulk, range(len(bulk)), strict=True))
    counter = len(bulk)
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
