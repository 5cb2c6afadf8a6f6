"""engine._kernels.keymap against a dict, with real hashes and with forced collisions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels import rowkeymap, rowstore
from engine._kernels.hashing import hash_rows
from engine._kernels.keymap import ExactKeyMap, IntKeyMap, StoredKeyMap

SCHEMA = pa.schema([("s", pa.string()), ("n", pa.int64())])


def _hasher(mode):
    """Row hash of a key table: real, or squeezed into a few values (forced collisions)."""
    if mode == "real":
        return lambda t: hash_rows(t)
    k = np.uint64({"one": 1, "few": 3}[mode])
    return lambda t: hash_rows(t) % k


def _table(keys):
    return pa.table({"s": [k[0] for k in keys], "n": [k[1] for k in keys]}, schema=SCHEMA)


class _Ids:
    """Dense ids with reuse, as the engine's callers allocate them."""

    def __init__(self):
        self.next, self.free = 0, []

    def __call__(self, n):
        take = self.free[:n]
        self.free = self.free[n:]
        fresh = list(range(self.next, self.next + n - len(take)))
        self.next += len(fresh)
        return np.array(take + fresh, dtype=np.int64)


def test_colliding_keys_coexist_and_deletes_keep_the_others():
    m = ExactKeyMap(exact=False)
    stored = {0: "a", 1: "b", 2: "c"}
    m.insert(np.array([7, 7, 7], dtype=np.uint64), np.array([0, 1, 2]))
    assert m.chained == 2

    def lookup(probe):
        def same(i, ids):
            return np.array([probe[p] == stored[d] for p, d in zip(i, ids, strict=True)], dtype=bool)
        return m.lookup(np.full(len(probe), 7, dtype=np.uint64), same).tolist()

    assert lookup(["c", "a", "b", "z"]) == [2, 0, 1, -1]
    m.delete(np.array([7], dtype=np.uint64), np.array([1]))  # the middle of the chain
    del stored[1]
    assert lookup(["c", "a", "b"]) == [2, 0, -1]
    m.delete(np.array([7], dtype=np.uint64), np.array([2]))  # the head
    del stored[2]
    assert lookup(["c", "a"]) == [-1, 0]
    assert len(m) == 1


def test_exact_map_never_calls_same():
    m = ExactKeyMap(exact=True)
    m.insert(np.array([1, 2], dtype=np.uint64), np.array([10, 20]))
    assert m.lookup(np.array([2, 3], dtype=np.uint64), None).tolist() == [20, -1]


#: values as an integer key column holds them: dense from 0, far apart, negative (the map
#: leaves its row-key map for good), and uint64 bits past 2**63 (negative as int64)
#: (few values, so deletes and lookups meet inserted ones; negatives rarer, so most runs stay
#: in the row-key map for a while)
_dense = st.integers(0, 20)
_int_value = st.one_of(_dense, _dense, _dense, st.sampled_from([2**40, 2**40 + 3, 2**62 - 1, 2**63 - 1]),
                       st.sampled_from([-1, -5, -(2**63), 2**64 - 1 - 2**64]))
_int_ops = st.lists(st.tuples(st.sampled_from(["insert", "delete", "lookup"]),
                              st.lists(_int_value, max_size=12)), max_size=25)


@pytest.mark.parametrize("slack", [rowkeymap.SPARSE_SLACK, 0])
@given(ops=_int_ops)
def test_int_key_map_against_dict(slack, ops):
    # slack 0: the row-key map turns regions or hashed as soon as values spread
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rowkeymap, "SPARSE_SLACK", slack)
        m, ids = IntKeyMap(), _Ids()
        model: dict[int, int] = {}
        for op, values in ops:
            v = np.array(values, dtype=np.int64).view(np.uint64)
            if op == "insert":
                new = list(dict.fromkeys(x for x in values if x not in model))
                got = ids(len(new))
                m.insert(np.array(new, dtype=np.int64).view(np.uint64), got)
                model.update(zip(new, got.tolist(), strict=True))
            elif op == "delete":
                present = list(dict.fromkeys(x for x in values if x in model))
                m.delete(np.array(present, dtype=np.int64).view(np.uint64),
                         np.array([model[x] for x in present], dtype=np.int64))
                for x in present:
                    ids.free.append(model.pop(x))
            else:
                assert m.lookup(v, None).tolist() == [model.get(x, -1) for x in values]
            assert len(m) == len(model)
            if any(x < 0 for x in model):
                assert m.layout == "hashed"
        everything = np.array(list(model), dtype=np.int64).view(np.uint64)
        assert m.lookup(everything).tolist() == list(model.values())


def test_int_key_map_is_dense_for_dense_values():
    m = IntKeyMap()
    m.insert(np.arange(1_000_000, dtype=np.uint64), np.arange(1_000_000))
    assert m.layout == "dense"
    assert m.lookup(np.array([999_999, 1_000_000, 5], dtype=np.uint64)).tolist() == [999_999, -1, 5]
    m.insert(np.array([-1], dtype=np.int64).view(np.uint64), np.array([7]))
    assert m.layout == "hashed" and len(m) == 1_000_001
    assert m.lookup(np.array([-1, 5], dtype=np.int64).view(np.uint64)).tolist() == [7, 5]


_key = st.tuples(st.sampled_from(["a", "b", "", "héllo", "x" * 20, "ab"]), st.integers(-3, 3))
_ops = st.lists(
    st.tuples(st.sampled_from(["intern", "delete", "lookup"]), st.lists(_key, max_size=12)),
    max_size=20,
)


@pytest.mark.parametrize("mode", ["real", "few", "one"])
@given(ops=_ops)
def test_exact_key_map_against_dict(mode, ops):
    hasher = _hasher(mode)
    m, ids = ExactKeyMap(exact=False), _Ids()
    model: dict[tuple, int] = {}
    stored: dict[int, tuple] = {}  # the caller's own key storage, by id
    for op, keys in ops:
        t = _table(keys)
        h = hasher(t)

        def same(i, cand, keys=keys):
            return np.array([keys[p] == stored[c] for p, c in zip(i, cand, strict=True)], dtype=bool)

        def same_batch(i, j, keys=keys):
            return np.array([keys[a] == keys[b] for a, b in zip(i, j, strict=True)], dtype=bool)

        if op == "intern":
            got, added, first = m.intern(h, same, same_batch, ids)
            for new_id, row in zip(added.tolist(), first.tolist(), strict=True):
                stored[new_id] = keys[row]
                model[keys[row]] = new_id
            assert got.tolist() == [model[k] for k in keys]
            assert len(set(added.tolist())) == added.size
        elif op == "delete":
            present = list(dict.fromkeys(k for k in keys if k in model))
            pt = _table(present)
            m.delete(hasher(pt), np.array([model[k] for k in present], dtype=np.int64))
            for k in present:
                ids.free.append(model[k])
                del stored[model.pop(k)]
        else:
            assert m.lookup(h, same).tolist() == [model.get(k, -1) for k in keys]
        assert len(m) == len(model)
    everything = list(model)
    if everything:
        t = _table(everything)

        def same_all(i, cand):
            return np.array([everything[p] == stored[c] for p, c in zip(i, cand, strict=True)], dtype=bool)

        assert m.lookup(hasher(t), same_all).tolist() == [model[k] for k in everything]


def _step_against_dict(m, ids, model, op, t, keys, hasher):
    """One ``op`` ("intern", "delete" or "lookup") of table ``t`` on ``m`` and on ``model``,
    the dict from each row's key as compared (``keys``) to its id; checks both agree."""
    h = hasher(t)
    if op == "intern":
        got, added = m.intern(t, h, ids)
        for k, i in zip(keys, got.tolist(), strict=True):
            model.setdefault(k, i)
        assert got.tolist() == [model[k] for k in keys]
    elif op == "delete":
        present = list(dict.fromkeys(k for k in keys if k in model))
        gone = np.array([model.pop(k) for k in present], dtype=np.int64)
        m.delete(gone)
        ids.free += gone.tolist()
    else:
        assert m.lookup(t, h).tolist() == [model.get(k, -1) for k in keys]
    assert len(m) == len(model)


@pytest.mark.parametrize("mode", ["real", "few", "one"])
@given(ops=_ops)
def test_stored_key_map_against_dict(mode, ops):
    hasher = _hasher(mode)
    m, ids = StoredKeyMap(SCHEMA), _Ids()
    model: dict[tuple, int] = {}
    for op, keys in ops:
        _step_against_dict(m, ids, model, op, _table(keys), keys, hasher)
    if model:
        keys = list(model)
        assert m.lookup(_table(keys), hasher(_table(keys))).tolist() == list(model.values())
        assert m.keys_of(np.array(list(model.values()))).to_pylist() == \
            [{"s": s, "n": n} for s, n in keys]


def test_stored_key_map_compacts_and_keeps_the_live_keys():
    m, ids = StoredKeyMap(SCHEMA), _Ids()
    keys = [(f"k{i}", i % 7) for i in range(5000)]
    t = _table(keys)
    h = hash_rows(t) % np.uint64(64)  # many collisions
    got, _ = m.intern(t, h, ids)
    m.delete(got[:4500])
    ids.free += got[:4500].tolist()
    rest = _table(keys[4500:])
    assert (m.lookup(rest, hash_rows(rest) % np.uint64(64)) == got[4500:]).all()
    assert (m.lookup(t.slice(0, 4500), h[:4500]) == -1).all()
    assert m._keys.stored == 500 and len(m._keys) == 500


def test_stored_key_map_exact_key_stores_nothing():
    m = StoredKeyMap(pa.schema([("k", pa.int64())]))
    t = pa.table({"k": [5, 6, 5]})
    got, added = m.intern(t, hash_rows(t), _Ids())
    assert got.tolist() == [0, 1, 0] and added.tolist() == [0, 1]
    assert m._keys.stored == 0


FLAT_SCHEMA = pa.schema([("n", pa.int64()), ("x", pa.float64())])
_flat_key = st.tuples(st.one_of(st.none(), st.integers(-3, 3)),
                      st.sampled_from([None, 0.0, -0.0, 1.5, float("nan")]))
_flat_ops = st.lists(
    st.tuples(st.sampled_from(["intern", "delete", "lookup"]), st.lists(_flat_key, max_size=12)),
    max_size=20,
)


def _canon(key):
    """A fixed-width key as the map compares it: -0.0 is 0.0, NaN equals NaN, nulls equal."""
    n, x = key
    return n, None if x is None else ("nan" if x != x else x + 0.0)


@pytest.mark.parametrize("mode", ["real", "few", "one"])
@given(ops=_flat_ops)
def test_stored_key_map_of_fixed_width_keys_against_dict(mode, ops):
    """Fixed-width key columns are stored in numpy (FlatRowStore) and checked there: nulls,
    NaN and -0.0 as Arrow compares them, colliding hashes held apart."""
    hasher = _hasher(mode)
    m, ids = StoredKeyMap(FLAT_SCHEMA), _Ids()
    assert isinstance(m._keys, rowstore.FlatRowStore)
    model: dict[tuple, int] = {}

    def table(keys):
        return pa.table({"n": pa.array([k[0] for k in keys], pa.int64()),
                         "x": pa.array([k[1] for k in keys], pa.float64())}, schema=FLAT_SCHEMA)

    for op, keys in ops:
        _step_against_dict(m, ids, model, op, table(keys), [_canon(k) for k in keys], hasher)
