"""Z-set batches: seed 001/003 examples (plus, minus, negate, accumulation), Arrow form,
exact grouping under hash collisions, algebra laws (hypothesis), and the consolidate
oracle over random versions."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._kernels import hashing as _hashing
from engine.differential import zset as zset_module
from engine.differential.zset import (
    DIFF,
    TIME,
    ZSet,
    concat,
    consolidate,
    minus,
    negate,
    plus,
    take_rows,
    take_rows_from,
)
from engine.errors import InputError, SchemaError
from tests.engine.differential._reference import SCHEMA, counter, key, random_batch

# ---------------------------------------------------------------------------------------
# examples


def _x(triples):
    return ZSet.from_triples(triples, ["x"])


A = [(0, 0, 1), (1, 0, 1), (2, 0, 2), (3, 0, 1)]
B = [(0, 0, 1), (1, 0, -1), (2, 0, 1)]


def test_seed_plus():
    assert plus(_x(A), _x(B)).to_triples() == [((0,), (0,), 2), ((2,), (0,), 3), ((3,), (0,), 1)]


def test_seed_minus():
    assert minus(_x(A), _x(B)).to_triples() == [((1,), (0,), 2), ((2,), (0,), 1), ((3,), (0,), 1)]


def test_seed_negate():
    z = _x([(0, 0, 1), (1, 0, -1), (2, 0, -2)])
    assert negate(z).to_triples() == [((0,), (0,), -1), ((1,), (0,), 1), ((2,), (0,), 2)]


def test_seed_names_accumulate_over_time():
    # seed 001: frank +1 at 6, frank +1 and david +1 at 8, frank -2 at 9
    z = ZSet.from_triples([("frank", 6, 1), ("frank", 8, 1), ("david", 8, 1), ("frank", 9, -2)], ["name"])
    assert z.accumulate(5).to_triples() == []
    assert z.accumulate(6).to_triples() == [(("frank",), None, 1)]
    assert z.accumulate(8).to_triples() == [(("frank",), None, 2), (("david",), None, 1)]
    assert z.accumulate(9).to_triples() == [(("david",), None, 1)]


def test_consolidate_keeps_first_appearance_order_and_drops_zeros():
    z = ZSet.from_triples([("b", 1, 1), ("a", 1, 2), ("b", 1, -1), ("a", 1, 1), ("c", 2, 0)], ["s"])
    assert consolidate(z).to_triples() == [(("a",), (1,), 3)]
    z2 = ZSet.from_triples([("b", 1, 1), ("a", 1, 2), ("b", 2, 1)], ["s"])
    assert z2.consolidate() is z2                  # already canonical: returned as is


def test_consolidate_compares_by_value():
    # null == null, NaN == NaN, 0.0 == -0.0; records of several columns
    z = ZSet.from_triples([
        ((None, float("nan")), None, 1),
        ((None, float("nan")), None, 1),
        (("a", 0.0), None, 1),
        (("a", -0.0), None, 1),
        (("a", None), None, -1),
        (("a", None), None, 2),
    ], pa.schema([("s", pa.string()), ("f", pa.float64())]))
    got = consolidate(z)
    assert [(r[0], d) for r, _, d in got.to_triples()] == [(None, 2), ("a", 2), ("a", 1)]
    assert got.to_triples()[2][0] == ("a", None)


def test_arrow_round_trip_one_and_two_coordinates():
    z = ZSet.from_triples([((1, "x"), 3, 2), ((2, None), 4, -1)], ["k", "v"])
    t = z.to_arrow()
    assert t.column_names == ["k", "v", DIFF, TIME]
    assert t.schema.field(TIME).type == pa.int64()
    assert ZSet.from_arrow(t).to_triples() == z.to_triples()
    z2 = ZSet.from_triples([((1,), (0, 1), 1), ((2,), (3, 0), -1)], ["k"])
    t2 = z2.to_arrow()
    assert pa.types.is_fixed_size_list(t2.schema.field(TIME).type)
    assert ZSet.from_arrow(t2).to_triples() == z2.to_triples()
    untimed = ZSet.from_arrow(pa.table({"k": [1], DIFF: [5]}))
    assert untimed.times is None and untimed.to_triples() == [((1,), None, 5)]


def test_bad_batches():
    with pytest.raises(SchemaError, match="__diff"):
        ZSet.from_arrow(pa.table({"k": [1]}))
    with pytest.raises(SchemaError, match="reserved"):
        ZSet(pa.table({DIFF: [1]}), np.ones(1, np.int64))
    with pytest.raises(InputError, match="shape"):
        ZSet(pa.table({"k": [1, 2]}), np.ones(1, np.int64))
    with pytest.raises(SchemaError, match="different schemas"):
        concat(_x(A), ZSet.from_triples([("a", 0, 1)], ["x"]))
    with pytest.raises(InputError, match="coordinates"):
        concat(_x(A), ZSet.from_triples([(1, (0, 0), 1)], ["x"]))
    with pytest.raises(SchemaError, match="cannot hold"):
        ZSet(pa.table({"l": pa.array([[1], [1]])}), np.ones(2, np.int64)).consolidate()


def test_hash_collisions_never_merge_different_records(monkeypatch):
    # every record hashes alike: grouping must still be exact
    monkeypatch.setattr(zset_module, "hash_rows", lambda t, names=None: np.zeros(t.num_rows, np.uint64))
    rng = np.random.default_rng(7)
    z = random_batch(rng, 300, times=(0,), time_spread=2)
    want = counter(z)
    got = z.consolidate()
    assert counter(got) == want
    assert len(got) == len(want)


def test_string_hashes_are_stable_across_slices_and_chunks():
    a = pa.array(["", "a", "ab", None, "ba", "héllo", "a" * 300])
    h = _hashing.hash_column(a)
    assert np.array_equal(_hashing.hash_column(a.slice(2)), h[2:])
    assert np.array_equal(_hashing.hash_column(pa.chunked_array([a.slice(0, 3), a.slice(3)])), h)
    assert np.array_equal(_hashing.hash_column(a.cast(pa.large_string())), h)
    assert len(set(h.tolist())) == len(h)


# ---------------------------------------------------------------------------------------
# laws

records = st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3),
                    st.sampled_from([0.0, -0.0, 1.5, float("nan"), None]))
triples = st.lists(st.tuples(records, st.integers(0, 2), st.integers(-3, 3)), max_size=25)


def _rows(z: ZSet) -> list:
    """Triples with canonical values (NaN compares unequal to itself in Python)."""
    return [(key(r), t, d) for r, t, d in z.to_triples()]


def _z(ts) -> ZSet:
    return ZSet.from_triples(ts, SCHEMA) if ts else ZSet.empty(SCHEMA, 1)


@given(triples)
def test_consolidate_is_idempotent_and_preserves_weights(ts):
    z = _z(ts)
    c = z.consolidate()
    assert counter(c) == counter(z)
    assert len(c) == len(counter(z))                # one row per (record, time), no zeros
    assert _rows(c.consolidate()) == _rows(c)


@given(triples, triples, triples)
def test_plus_is_commutative_and_associative(a, b, c):
    za, zb, zc = _z(a), _z(b), _z(c)
    assert plus(za, zb).equals(plus(zb, za))
    assert plus(za, plus(zb, zc)).equals(plus(plus(za, zb), zc))
    assert counter(plus(za, zb)) == _sum(counter(za), counter(zb))


def _sum(a: Counter, b: Counter) -> Counter:
    out = Counter(a)
    for k, w in b.items():
        out[k] += w
    return Counter({k: w for k, w in out.items() if w})


@given(triples, triples)
def test_negate_and_minus(a, b):
    za, zb = _z(a), _z(b)
    assert _rows(negate(negate(za))) == _rows(za)
    assert plus(za, negate(za)).num_rows == 0
    assert minus(za, zb).equals(plus(za, negate(zb)))
    assert minus(za, za).num_rows == 0
    assert counter(plus(za, zb)) == _sum(counter(za), counter(zb))


# ---------------------------------------------------------------------------------------
# oracle: consolidate over >= 500 random versions


def test_consolidate_oracle_over_random_versions():
    # 520 versions of random updates at a few times, so that batches cancel each other
    rng = np.random.default_rng(11)
    acc_in = ZSet.empty(SCHEMA, 1)                     # every input update, raw
    acc_out = ZSet.empty(SCHEMA, 1)
    reference: Counter = Counter()
    for v in range(520):
        batch = random_batch(rng, int(rng.integers(0, 30)), times=(0,), time_spread=4, keys=4)
        acc_in = concat(acc_in, batch)
        if v % 32 == 0:
            acc_in = ZSet(acc_in.data.combine_chunks(), acc_in.diffs, acc_in.times)
        acc_out = plus(acc_out, batch.consolidate())   # the incremental output
        reference = _sum(reference, counter(batch))    # per-row Python model
        scratch = acc_in.consolidate()                 # the operator from scratch
        assert counter(acc_out) == reference, f"version {v}"
        assert scratch.equals(acc_out), f"version {v}"
        assert len(scratch) == len(reference) == len(acc_out)
        at = int(rng.integers(0, 5))                  # the collection at a version
        want: Counter = Counter()
        for (rec, t), w in reference.items():
            if t[0] <= at:
                want[(rec, None)] += w
        assert counter(acc_out.accumulate(at), times=False) == Counter({k: w for k, w in want.items() if w})


def test_take_rows_matches_arrow_take():
    # numeric null-free columns gather in numpy, the others through Arrow: same tables
    rng = np.random.default_rng(3)
    n = 500
    t = pa.table({
        "i32": pa.array(rng.integers(-9, 9, n), pa.int32()),
        "u8": pa.array(rng.integers(0, 255, n), pa.uint8()),
        "f": rng.random(n),
        "with_nulls": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int64()),
        "s": pa.array([f"v{i % 13}" for i in range(n)]),
        "ts": pa.array(rng.integers(0, 10**12, n), pa.timestamp("us", tz="UTC")),
    })
    rows = rng.integers(0, n, 900)
    assert take_rows(t, rows).equals(t.take(rows))
    parts = [t.slice(0, 200), pa.concat_tables([t.slice(200, 100), t.slice(300, 200)]), t.slice(0, 0)]
    bounds = [0, 300, 300 + 400, 700]
    per = [rng.integers(0, 200, 300), rng.integers(0, 300, 400), np.empty(0, np.int64)]
    got = take_rows_from(parts, bounds, np.concatenate(per))
    want = pa.concat_tables([p.take(r) for p, r in zip(parts, per, strict=True)])
    assert got.to_pylist() == want.to_pylist()
    assert got.schema == t.schema


def test_take_rows_with_an_identity_prefix():
    rng = np.random.default_rng(4)
    t = pa.table({"i": rng.integers(0, 9, 300), "s": [str(i % 7) for i in range(300)]})
    rows = np.concatenate((np.arange(300), rng.integers(0, 300, 50)))
    assert zset_module.identity_prefix(rows, 300) == 300
    assert take_rows(t, rows, 300).equals(t.take(rows))
    assert zset_module.identity_prefix(rows, 301) == 0          # row 300 is not 300
    shuffled = rows.copy()
    shuffled[[5, 6]] = shuffled[[6, 5]]
    assert zset_module.identity_prefix(shuffled, 300) == 0      # ends right, middle out of order
    assert zset_module.identity_prefix(rows[1:], 10) == 0
    assert zset_module.identity_prefix(rows, 0) == 0
