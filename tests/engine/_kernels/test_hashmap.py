"""engine._kernels.hashmap: U64Map against a plain dict, with and without clustered probes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels.hashmap import U64Map


class _Clustered(U64Map):
    """Every key's home is one of three slots: long probe chains, tombstones in the way."""

    def _home(self, h):
        return (h % np.uint64(3)).astype(np.int64) & self._mask  # slots are int64


class _Scalar(U64Map):
    """Every lookup walks its probe chains as plain integers, whatever the batch's size."""

    scalar_max = 1 << 30


class _Vectorized(U64Map):
    """Every lookup in probe rounds of numpy calls, even of one key."""

    scalar_max = 0


class _ClusteredScalar(_Clustered):
    scalar_max = 1 << 30


def _u64(xs):
    return np.array(xs, dtype=np.uint64)


def test_insert_lookup_delete_example():
    m = U64Map()
    m.insert(_u64([7, 9, 2**64 - 1]), np.array([0, 1, 5]))
    assert m.lookup(_u64([9, 8, 7, 2**64 - 1])).tolist() == [1, -1, 0, 5]
    m.delete(_u64([9, 4]))
    assert len(m) == 2
    assert m.lookup(_u64([9, 7])).tolist() == [-1, 0]
    m.set_values(_u64([7, 3]), np.array([11, 12]))
    assert m.lookup(_u64([7, 3])).tolist() == [11, -1]
    keys, vals = m.items()
    assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == {7: 11, 2**64 - 1: 5}


def test_empty_arrays():
    m = U64Map()
    m.insert(_u64([]), np.array([], dtype=np.int64))
    assert m.lookup(_u64([])).size == 0
    m.delete(_u64([]))
    assert len(m) == 0


@pytest.mark.parametrize("cls", [U64Map, _Clustered])
def test_grows_and_keeps_entries(cls):
    m = cls(capacity=4)
    keys = np.arange(0, 30_000, 3, dtype=np.uint64)
    for part in np.array_split(keys, 7):
        m.insert(part, part.astype(np.int64) * 2)
    assert len(m) == keys.size
    assert (m.lookup(keys) == keys.astype(np.int64) * 2).all()
    assert (m.lookup(keys + _u64(1)) == -1).all()


@pytest.mark.parametrize("cls", [_Clustered, _ClusteredScalar])
def test_deleted_slot_does_not_hide_later_keys(cls):
    m = cls()
    m.insert(_u64([0, 3, 6, 9]), np.arange(4))  # one chain: 0, 3, 6, 9 from home 0
    m.delete(_u64([3]))
    assert m.lookup(_u64([0, 3, 6, 9])).tolist() == [0, -1, 2, 3]
    m.insert(_u64([12]), np.array([4]))  # reuses the tombstone
    assert m.lookup(_u64([0, 6, 9, 12])).tolist() == [0, 2, 3, 4]


_ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "delete", "set"]),
        st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1)), max_size=30),
    ),
    max_size=25,
)


@pytest.mark.parametrize("cls", [U64Map, _Clustered, _Scalar, _Vectorized, _ClusteredScalar])
@given(ops=_ops)
def test_against_dict(cls, ops):
    m, model = cls(), {}
    counter = 0
    for op, ks in ops:
        ks = list(dict.fromkeys(ks))  # distinct within a batch
        if op == "insert":
            new = [k for k in ks if k not in model]
            vals = list(range(counter, counter + len(new)))
            counter += len(new)
            m.insert(_u64(new), np.array(vals, dtype=np.int64))
            model.update(zip(new, vals, strict=True))
        elif op == "delete":
            m.delete(_u64(ks))
            for k in ks:
                model.pop(k, None)
        else:
            vals = list(range(counter, counter + len(ks)))
            counter += len(ks)
            m.set_values(_u64(ks), np.array(vals, dtype=np.int64))
            for k, v in zip(ks, vals, strict=True):
                if k in model:
                    model[k] = v
        assert len(m) == len(model)
        probe = ks + list(model)
        got = m.lookup(_u64(probe)).tolist()
        assert got == [model.get(k, -1) for k in probe]
    keys, vals = m.items()
    assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == model


class _Wrapping(U64Map):
    """Homes in the last 16 slots: chains wrap past the table's end into its start."""

    def _home(self, h):
        return (self._mask - 15) + (h % np.uint64(16)).astype(np.int64)


class _WrappingScalar(_Wrapping):
    scalar_max = 1 << 30


def _delete(m: U64Map, model: dict[int, int], ks: np.ndarray) -> None:
    m.delete(ks)
    for k in ks.tolist():
        model.pop(k, None)


def _check(m: U64Map, model: dict[int, int], probe: np.ndarray) -> None:
    """Every probed key's value (or -1) and the size equal the model's."""
    assert m.lookup(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
    assert len(m) == len(model)


# the scalar walk of clustered or wrapping homes follows chains thousands of slots long in
# Python for every probed key (in use it serves at most ``scalar_max`` = 8 keys): one seed,
# and probes of 200 keys instead of 1,000 (the same chains and tombstones, walked fewer times)
@pytest.mark.parametrize(("cls", "seed"), [
    *((c, s) for c in (U64Map, _Clustered, _Wrapping, _Scalar) for s in range(3)),
    (_ClusteredScalar, 0), (_WrappingScalar, 0)])
def test_large_batches_against_dict(cls, seed):
    # batches above and below the size at which probe rounds read windows of slots, with
    # deletes leaving tombstones inside chains: every lookup equals a dict's
    rng = np.random.default_rng(seed)
    m, model = cls(), {}
    universe = rng.choice(2**62, 3_000, replace=False).astype(np.uint64)
    for step in range(40):
        n = int(rng.choice([1, 7, 100, 300, 900]))
        ks = rng.choice(universe, n, replace=False)
        if step % 3 == 2:
            _delete(m, model, ks)
        else:
            new = np.array([k for k in ks.tolist() if k not in model], dtype=np.uint64)
            vals = np.arange(step * 1_000, step * 1_000 + new.size)
            m.insert(new, vals)
            model.update(zip(new.tolist(), vals.tolist(), strict=True))
        probes = 200 if cls in (_ClusteredScalar, _WrappingScalar) else 1_000
        _check(m, model, rng.choice(universe, probes, replace=False))


@pytest.mark.parametrize(("cls", "seed"), [
    *((c, s) for c in (U64Map, _Clustered, _Wrapping, _Vectorized) for s in range(3)), (_Scalar, 0)])
def test_lookup_ends_then_insert_at_against_dict(cls, seed):
    # an intern's two halves: lookup_ends of a batch of present and absent keys, then
    # insert_at of the absent ones where their probes ended (shared end slots, tombstones
    # in the chains, batches that make the table grow, a few keys walked as integers, one key
    # placed at its end slot directly)
    rng = np.random.default_rng([seed, 7])
    m, model = cls(), {}
    universe = rng.choice(2**62, 4_000, replace=False).astype(np.uint64)
    for step in range(40):
        n = int(rng.choice([1, 5, 40, 300, 900]))
        ks = rng.choice(universe, n, replace=False)
        if step % 4 == 3:
            _delete(m, model, ks)
            continue
        vals, ends = m.lookup_ends(ks)
        assert vals.tolist() == [model.get(k, -1) for k in ks.tolist()]
        assert (ends[vals >= 0] == -1).all()
        held = ends >= 0
        assert (m._vals[ends[held]] == -1).all()  # each end is an empty slot
        new = vals < 0
        nv = np.arange(step * 1_000, step * 1_000 + int(new.sum()))
        m.insert_at(ks[new], nv, ends[new])
        model.update(zip(ks[new].tolist(), nv.tolist(), strict=True))
        _check(m, model, rng.choice(universe, 1_000, replace=False))
    keys, vals = m.items()
    assert dict(zip(keys.tolist(), vals.tolist(), strict=True)) == model
