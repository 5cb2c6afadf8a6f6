"""RowStore: a few explicit puts, replaces and drops, then random operations against a dict
(strings with nulls, so rows go through Arrow), with compaction bounding what is held and
the whole store (``rows``) holding exactly the model's rows; the same for FlatRowStore's
numpy columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine._kernels import rowstore
from engine._kernels.hashing import rows_equal, values_equal
from engine._kernels.rowstore import FlatRowStore, RowStore, flat_columns, flat_equal_at

SCHEMA = pa.schema([("s", pa.string()), ("n", pa.int64())])


def _rows(pairs):
    return pa.table({"s": pa.array([p[0] for p in pairs], pa.string()),
                     "n": pa.array([p[1] for p in pairs], pa.int64())})


def test_put_replace_drop():
    st = RowStore(SCHEMA)
    st.put(np.array([2, 0]), _rows([("b", 2), ("a", 0)]))
    st.put(np.array([2]), pa.table({"s": ["c"], "n": pa.array([5], pa.int32())}))  # cast to int64
    assert st.get(np.array([0, 2, 0])).to_pylist() == [{"s": "a", "n": 0}, {"s": "c", "n": 5}, {"s": "a", "n": 0}]
    assert st.get(np.array([2]), ["n"]).to_pylist() == [{"n": 5}]
    assert len(st) == 2 and st.stored == 3
    assert st.equal_at(pa.table({"k": ["a", "x"]}), np.array([0, 1]), np.array([0, 2]), ["s"]).tolist() == [True, False]
    assert sorted(st.rows().column("s").to_pylist()) == ["a", "c"]   # the replaced "b" is not held
    st.drop(np.array([0]))
    assert len(st) == 1 and st.get(np.array([2])).column("s").to_pylist() == ["c"]
    assert st.rows().to_pylist() == [{"s": "c", "n": 5}] and RowStore(SCHEMA).rows().num_rows == 0


@pytest.mark.parametrize("flat_max", [0, 1 << 16])  # comparisons by level, or concatenated
def test_random_operations_against_a_dict(flat_max, monkeypatch):
    monkeypatch.setattr(rowstore, "FLAT_MAX", flat_max)
    rng = np.random.default_rng(5)
    st = RowStore(SCHEMA)
    model: dict[int, tuple] = {}
    for step in range(400):
        n = int(rng.integers(0, 300))
        ids = np.unique(rng.integers(0, 2000, n))
        rng.shuffle(ids)
        if rng.random() < 0.3:
            gone = np.array([i for i in ids.tolist() if i in model], dtype=np.int64)
            st.drop(gone)
            for i in gone.tolist():
                del model[i]
        else:
            pairs = [(None if rng.random() < 0.1 else f"v{int(rng.integers(0, 50))}", step) for _ in ids]
            st.put(ids, _rows(pairs))
            model.update(zip(ids.tolist(), pairs, strict=True))
        assert len(st) == len(model)
        assert st.stored <= 2 * len(model) + 1024 + 300
        probe = np.array(list(model), dtype=np.int64)
        rng.shuffle(probe)
        got = st.get(probe)
        assert list(zip(got.column("s").to_pylist(), got.column("n").to_pylist(), strict=True)) == \
            [model[i] for i in probe.tolist()], f"step {step}"
        everything = st.rows()                  # the whole store, in storage order
        assert sorted(zip(everything.column("s").to_pylist(), everything.column("n").to_pylist(), strict=True),
                      key=repr) == sorted(model.values(), key=repr), f"step {step}"
        if probe.size:
            eq = st.equal_at(_rows([model[i] for i in probe.tolist()]), np.arange(probe.size), probe)
            assert eq.all()
            other = np.roll(probe, 1)  # against another id's row: equal only where the rows are
            eq = st.equal_at(_rows([model[i] for i in probe.tolist()]), np.arange(probe.size), other)
            assert eq.tolist() == [model[a] == model[b] for a, b in zip(probe.tolist(), other.tolist(), strict=True)]


FLAT = pa.schema([("t", pa.timestamp("us")), ("x", pa.float64()), ("d", pa.date32()), ("i", pa.int32())])


def _flat_rows(rows):
    return pa.table({name: pa.array([r[c] for r in rows], FLAT.field(name).type)
                     for c, name in enumerate(FLAT.names)})


def test_flat_store_random_operations_against_a_dict():
    """FlatRowStore (numpy columns by id): puts with nulls in any column, replaces and drops
    against a dict; gets, the whole store and equal_at agree with the model, and its numpy
    columns compare as Arrow's values_equal does (nulls equal nulls, NaN equals NaN)."""
    assert FlatRowStore.fits(FLAT) and not FlatRowStore.fits(SCHEMA)
    rng = np.random.default_rng(7)
    st = FlatRowStore(FLAT)
    model: dict[int, tuple] = {}

    def value(c):
        if rng.random() < 0.15:
            return None
        v = int(rng.integers(-3, 3))
        return [v, [float(v), float("nan")][int(rng.random() < 0.1)], v, v][c]

    for step in range(300):
        ids = np.unique(rng.integers(0, 3000, int(rng.integers(0, 200))))
        rng.shuffle(ids)
        if rng.random() < 0.3:
            gone = np.array([i for i in ids.tolist() if i in model], dtype=np.int64)
            st.drop(gone)
            for i in gone.tolist():
                del model[i]
        else:
            rows = [tuple(value(c) for c in range(4)) for _ in ids]
            st.put(ids, _flat_rows(rows))
            model.update(zip(ids.tolist(), rows, strict=True))
        assert len(st) == len(model) == st.stored
        probe = np.array(list(model), dtype=np.int64)
        rng.shuffle(probe)
        want = _flat_rows([model[i] for i in probe.tolist()])
        got = st.get(probe)
        assert got.schema == FLAT and rows_equal(got, want).all(), f"step {step}"
        assert np.array_equal(st.ids(), np.sort(probe))
        assert rows_equal(st.rows(), st.get(np.sort(probe))).all()
        if probe.size:
            assert st.equal_at(want, np.arange(probe.size), probe).all()
            other = np.roll(probe, 1)            # another id's row: equal where values agree
            assert np.array_equal(st.equal_at(want, np.arange(probe.size), other),
                                  rows_equal(want, st.get(other))), f"step {step}"
            wide = want.set_column(3, "i", want.column(3).cast(pa.int64()))  # another int width
            assert np.array_equal(st.equal_at(wide, np.arange(probe.size), other),
                                  rows_equal(want, st.get(other))), f"step {step}"
            cols, mine = flat_columns(want), st.take(other)
            for c, name in enumerate(FLAT.names):
                expect = values_equal(want.column(name), st.get(other, [name]).column(0))
                assert np.array_equal(flat_equal_at(cols[c], np.arange(probe.size), mine[c],
                                                    np.arange(probe.size)), expect), f"step {step} {name}"
