"""engine._kernels.hashing: stable hashes, one equality rule, exact grouping."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels import hashing
from engine._kernels.hashing import (
    exact_hash,
    group_equal,
    hash_column,
    hash_rows,
    mix64,
    rows_equal,
    same_rows,
    values_equal,
)
from engine.errors import SchemaError


def test_strings_hash_alike_in_every_layout():
    a = pa.array(["", "a", "ab", None, "ba", "héllo", "a" * 300, "abcdefgh", "abcdefgh\x00"])
    h = hash_column(a)
    assert np.array_equal(hash_column(a.slice(2)), h[2:])
    assert np.array_equal(hash_column(pa.chunked_array([a.slice(0, 3), a.slice(3)])), h)
    for t in (pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(), pa.binary_view()):
        assert np.array_equal(hash_column(a.cast(t)), h), t
    assert np.array_equal(hash_column(a.dictionary_encode()), h)
    assert len(set(h.tolist())) == len(h)


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view(), pa.binary(),
                                 pa.large_binary(), pa.binary_view()])
def test_a_few_strings_hash_as_integers_exactly_as_vectorized(typ):
    """Keys hashed in a batch of a few are looked up from batches of any size: the plain
    integer path must give the vectorized path's hashes bit for bit."""
    rng = np.random.default_rng(11)
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)
    alphabet = list("ab\x00zé€😀")
    for _ in range(300):
        n = int(rng.integers(0, 2 * hashing.FEW_STRINGS))
        values = []
        for _ in range(n):
            size = int(rng.integers(0, 40))
            v = "".join(rng.choice(alphabet, size)) if text else bytes(rng.integers(0, 256, size, np.uint8))
            values.append(None if rng.random() < 0.1 else v)
        a = pa.array(values, typ)
        if n > 2 and rng.random() < 0.5:
            a = a.slice(1, n - 2)  # offsets that do not start at 0
        few, vec = hashing._hash_binary_few(a), hashing._hash_binary(a)
        valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        assert np.array_equal(few[valid], vec[valid]), values  # nulls: hash_column's to set
        if len(a) <= hashing.FEW_STRINGS:
            assert np.array_equal(hash_column(a)[valid], vec[valid])


def test_repeated_strings_hash_through_a_dictionary_alike():
    a = pa.array([f"s{i % 10}" for i in range(10_000)])
    assert np.array_equal(hash_column(a), hashing._hash_binary(a))


@pytest.mark.parametrize("values, typ", [
    ([1, None, 2, 1], pa.decimal128(10, 2)),
    ([1, None, 2, 1], pa.decimal256(40, 2)),
    ([1, None, 2, 1], pa.decimal32(5, 2)),
    ([b"ab", None, b"cd", b"ab"], pa.binary(2)),
    ([dt.datetime(2024, 1, 1), None, dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 1)], pa.timestamp("us", "UTC")),
    ([dt.date(2024, 1, 1), None, dt.date(2024, 1, 2), dt.date(2024, 1, 1)], pa.date32()),
    ([pa.MonthDayNano([1, 2, 3]), None, pa.MonthDayNano([1, 2, 4]), pa.MonthDayNano([1, 2, 3])],
     pa.month_day_nano_interval()),
    ([True, None, False, True], pa.bool_()),
])
def test_fixed_width_types(values, typ):
    if typ in (pa.decimal128(10, 2), pa.decimal256(40, 2), pa.decimal32(5, 2)):
        values = [None if v is None else decimal.Decimal(v) for v in values]
    a = pa.array(values, typ)
    h = hash_column(a)
    assert h[0] == h[3] and len({h[0], h[1], h[2]}) == 3
    assert np.array_equal(hash_column(a.slice(1)), h[1:])
    assert values_equal(a, a).all()
    assert values_equal(a, a.take([3, 1, 2, 0])).tolist() == [True, True, True, True]


def test_floats_fold_signed_zero_and_nan():
    a = pa.array([0.0, -0.0, math.nan, None, 1.5])
    h = hash_column(a)
    assert h[0] == h[1] and h[2] != h[0] and h[3] not in (h[0], h[2])
    assert values_equal(a, pa.array([-0.0, 0.0, math.nan, None, 1.5])).all()
    assert np.array_equal(hash_column(a.cast(pa.float32())), h)


def test_nested_types_are_refused():
    with pytest.raises(SchemaError, match="cannot hold"):
        hash_column(pa.array([[1], [2]]), "l")


def test_exact_hash_rule():
    s = pa.schema([("i", pa.int32()), ("t", pa.timestamp("ns")), ("s", pa.string()),
                   ("d", pa.dictionary(pa.int8(), pa.int64())), ("f", pa.float64())])
    assert exact_hash(s, ["i"]) and exact_hash(s, ["t"]) and exact_hash([pa.bool_()])
    assert not exact_hash(s, ["s"]) and not exact_hash(s, ["d"]) and not exact_hash(s, ["f"])
    assert not exact_hash(s, ["i", "t"]) and not exact_hash(s, [])


@given(st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=50))
def test_integer_hash_is_injective(xs):
    h = hash_rows(pa.table({"k": pa.array(xs, pa.int64())}))
    assert len(set(h.tolist())) == len(xs)
    assert np.array_equal(hash_rows(pa.table({"k": pa.array(xs, pa.int64())})), mix64(
        np.array(xs, dtype=np.int64).view(np.uint64)))


_rows = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(["", "a", "ab", "héllo", "b" * 17])),
                           st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=False, width=32)),
                           st.one_of(st.none(), st.integers(-5, 5))), max_size=40)


def _table(rows):
    return pa.table({"s": pa.array([r[0] for r in rows], pa.string()),
                     "f": pa.array([r[1] for r in rows], pa.float64()),
                     "i": pa.array([r[2] for r in rows], pa.int64())})


def _canon(row):
    s, f, i = row
    if f is not None:
        f = "nan" if math.isnan(f) else f + 0.0
    return (s, f, i)


@pytest.mark.parametrize("squeeze", [None, 1, 3])
@given(rows=_rows)
def test_group_equal_is_exact_even_when_everything_collides(squeeze, rows):
    t = _table(rows)
    h = hash_rows(t)
    if squeeze:
        h = h % np.uint64(squeeze)
    order, starts = group_equal(h, lambda i, j: same_rows(t, i, j))
    groups = np.split(order, starts[1:]) if order.size else []
    got = sorted(sorted(g.tolist()) for g in groups)
    model: dict = {}
    for k, r in enumerate(rows):
        model.setdefault(_canon(r), []).append(k)
    assert got == sorted(model.values())


@given(rows=_rows)
def test_equal_rows_hash_alike_across_batches(rows):
    t = _table(rows)
    h = hash_rows(t)
    assert np.array_equal(hash_rows(t.slice(len(rows) // 2)), h[len(rows) // 2:])
    rev = t.take(np.arange(len(rows))[::-1])
    assert rows_equal(t, rev.take(np.arange(len(rows))[::-1])).all()
    by_value: dict = {}
    for k, r in enumerate(rows):
        by_value.setdefault(_canon(r), set()).add(int(h[k]))
    assert all(len(v) == 1 for v in by_value.values())


def _same(x: object, y: object) -> bool:
    """Python reference of values_equal's rule: NaN == NaN, recursively."""
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    return x == y


_ELEM = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, math.nan]))
_LIST = st.one_of(st.none(), st.lists(_ELEM, max_size=3))
_STRUCT = st.one_of(st.none(), st.fixed_dictionaries({"x": _ELEM, "y": _LIST}))
_MAP = st.one_of(st.none(), st.lists(st.tuples(st.sampled_from("ab"), _ELEM), max_size=2))
_NESTED = [
    (pa.list_(pa.float64()), _LIST),
    (pa.large_list(pa.float64()), _LIST),
    (pa.struct([("x", pa.float64()), ("y", pa.list_(pa.float64()))]), _STRUCT),
    (pa.list_(pa.struct([("x", pa.float64()), ("y", pa.list_(pa.float64()))])), st.one_of(st.none(), st.lists(_STRUCT, max_size=2))),
    (pa.map_(pa.string(), pa.float64()), _MAP),
]


@pytest.mark.parametrize("i", range(len(_NESTED)))
@given(data=st.data())
def test_values_equal_of_nested_values_matches_python(i, data):
    typ, values = _NESTED[i]
    pairs = data.draw(st.lists(st.tuples(values, values) | values.map(lambda v: (v, v)), max_size=12))
    offset = data.draw(st.integers(0, 2))
    pad = [None] * offset
    a = pa.array(pad + [p[0] for p in pairs], typ).slice(offset)
    b = pa.array(pad + [p[1] for p in pairs], typ).slice(offset)
    expect = [_same(x, y) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]
    assert values_equal(a, b).tolist() == expect
    assert values_equal(pa.chunked_array([a[:2], a[2:]], typ), b).tolist() == expect
