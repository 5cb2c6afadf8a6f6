"""Reductions: seed 003's Aggregate, Distinct, Distinct Incremental and Distinct Trace
(with (epoch, iteration) times) examples, then oracles over 500 random versions for
count, sum, min, max and distinct (root fast paths and the general trace-based path)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.differential.dataflow import Collection, Dataflow
from engine.differential.join import arrange
from engine.differential.reduce import _make_spec, _ReduceNode, distinct_trace
from engine.differential.trace import Trace
from engine.differential.zset import ZSet
from engine.errors import InputError
from tests.engine.differential._dataflow_ref import (
    Accumulated,
    RandomInput,
    ref_distinct,
    ref_reduce,
)

X = pa.schema([("x", pa.int64())])
KV = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _run(build, schema, batches):
    df = Dataflow()
    coll, inp = df.input(schema)
    probe = build(coll).probe()
    for v, b in enumerate(batches):
        inp.send(b, v)
        inp.advance_to(v + 1)
        df.step()
    return probe


def test_seed003_aggregate_count():
    b = ZSet.from_triples([((1, "foo"), None, 1), ((1, "bar"), None, 1), ((2, "baz"), None, 1)], KV)
    probe = _run(lambda c: c.count("k"), KV, [b])
    assert sorted(probe.accumulate().to_triples()) == [((1, 2), None, 1), ((2, 1), None, 1)]


def test_seed003_distinct():
    b = ZSet.from_triples([(0, None, 1), (1, None, 2), (2, None, -1), (3, None, 0)], X)
    probe = _run(lambda c: c.distinct(), X, [b])
    assert sorted(probe.accumulate().to_triples()) == [((0,), None, 1), ((1,), None, 1)]


@pytest.mark.parametrize(("history", "expected"), [
    ([(0, 0, 1)], [((2,), None, 1)]),
    ([(2, 1, 1), (3, 1, 1)], [((0,), None, 1), ((3,), None, -1)]),
    ([(0, 2, -1)], [((0,), None, 1), ((2,), None, 1)]),
])
def test_seed003_distinct_incremental(history, expected):
    batch = ZSet.from_triples([(0, None, 2), (2, None, 1), (3, None, -1)], X)
    trace = Trace(X, ["x"])
    trace.insert(ZSet.from_triples(history, X))
    assert sorted(distinct_trace(batch, trace, time=3).to_triples()) == expected


def test_seed003_distinct_trace_epoch_iteration():
    b00 = ZSet.from_triples([(0, (0, 0), 1), (2, (0, 0), 1), (3, (0, 0), -1)], X)
    b01 = ZSet.from_triples([(5, (0, 1), 1)], X)
    b10 = ZSet.from_triples([(5, (1, 0), 1)], X)
    b11 = ZSet.from_triples([(0, (1, 1), 1), (1, (1, 1), 1), (2, (1, 1), -1), (3, (1, 1), 1),
                             (4, (1, 1), -1)], X)
    trace = Trace(X, ["x"], dims=2)
    got = []
    for b in (b00, b01, b10, b11):
        got.append(sorted(distinct_trace(b, trace).to_triples()))
        trace.insert(b)
    assert got == [
        [((0,), None, 1), ((2,), None, 1)],
        [((5,), None, 1)],
        [((5,), None, 1)],
        [((1,), None, 1), ((2,), None, -1), ((5,), None, -1)],
    ]


def test_reduce_examples_min_max_sum():
    s = pa.schema([("k", pa.string()), ("x", pa.int64())])
    b0 = ZSet.from_triples([(("a", 3), None, 1), (("a", 5), None, 2), (("b", 1), None, 1)], s)
    b1 = ZSet.from_triples([(("a", 3), None, -1), (("b", 1), None, -1), (("b", 9), None, 1)], s)
    for build, want0, want1 in [
        (lambda c: c.min("k", "x", name="m"), [(("a", 3), 1), (("b", 1), 1)], [(("a", 5), 1), (("b", 9), 1)]),
        (lambda c: c.max("k", "x", name="m"), [(("a", 5), 1), (("b", 1), 1)], [(("a", 5), 1), (("b", 9), 1)]),
        (lambda c: c.sum("k", "x", name="m"), [(("a", 13), 1), (("b", 1), 1)], [(("a", 10), 1), (("b", 9), 1)]),
    ]:
        probe = _run(build, s, [b0, b1])
        assert sorted((r, d) for r, _, d in probe.accumulate(0).to_triples()) == want0
        assert sorted((r, d) for r, _, d in probe.accumulate(1).to_triples()) == want1
        # a change is a retraction of the old row and an insertion of the new one
        assert all(abs(d) == 1 for _, _, d in probe.batches[1].to_triples())


def test_reduce_rejects_mixed_aggregates():
    df = Dataflow()
    c, _ = df.input(pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    with pytest.raises(InputError, match="reduce twice"):
        c.reduce("k", {"n": ("count",), "m": ("min", "x")})


S = pa.schema([("k", pa.int64()), ("x", pa.int64()), ("s", pa.string())])


def _record(rng):
    return (int(rng.integers(6)), int(rng.integers(-4, 10)), "pq"[int(rng.integers(2))])


def _general(fn, col):
    """The trace-based reduce at the root (what the loops use), not the fast path."""
    def build(c: Collection) -> Collection:
        spec = _make_spec(c.schema, ("k",), {"out": (fn, col) if col else (fn,)})
        return Collection(_ReduceNode(c.scope, arrange(c.node, ("k",)).node, spec))
    return build


@pytest.mark.parametrize(("name", "build", "ref"), [
    ("count", lambda c: c.count("k"), lambda st: ref_reduce(st, 0, "count")),
    ("sum", lambda c: c.sum("k", "x"), lambda st: ref_reduce(st, 0, "sum", 1)),
    ("min", lambda c: c.min("k", "x"), lambda st: ref_reduce(st, 0, "min", 1)),
    ("max", lambda c: c.max("k", "x"), lambda st: ref_reduce(st, 0, "max", 1)),
    ("distinct", lambda c: c.distinct(), ref_distinct),
    ("general count", _general("count", None), lambda st: ref_reduce(st, 0, "count")),
    ("general sum", _general("sum", "x"), lambda st: ref_reduce(st, 0, "sum", 1)),
])
def test_reduce_oracle(name, build, ref):
    rng = np.random.default_rng(abs(hash(name)) % 1000)
    df = Dataflow()
    coll, inp = df.input(S)
    acc = Accumulated(build(coll).probe())
    src = RandomInput(rng, S, _record)
    for v in range(500):
        if rng.random() < 0.9:
            inp.send(src.change(int(rng.integers(0, 6)), v))
        inp.advance_to(v + 1)
        df.step()
        got = acc.update()
        assert got == ref(src.state), f"{name}: version {v}: only got {got - ref(src.state)}, " \
                                      f"only expected {ref(src.state) - got}"


@pytest.mark.parametrize(("key_type", "key_range", "big_values"), [
    (pa.int32(), (-700, 700), False),         # dense integer groups: factorized by offset
    (pa.int64(), (-(10**15), 10**15), False),  # sparse keys: hashed per row
    (pa.int64(), (0, 40), True),               # sums past 2**53 / rows: exact integer adds
])
def test_count_sum_over_large_batches(key_type, key_range, big_values):
    # batches of thousands of rows (the vectorized factorizations), inserts and retractions
    # of earlier rows, checked against a from-scratch recount after every version
    rng = np.random.default_rng(key_range[1] % 997)
    pool = rng.integers(*key_range, 300)  # a pool, so groups repeat
    _check_count_sum(rng, key_type, big_values, lambda v, n: rng.choice(pool, n),
                     lambda v: int(rng.integers(1_000, 4_000)))


def test_count_sum_with_moving_group_ranges():
    # dense batches whose group values move along (the value -> slot cache grows), jump far
    # away and back (too sparse to cache together), and small batches in between that take
    # the hash map: every path must agree on each group's slot
    rng = np.random.default_rng(5)
    bases = [0, 3_000, -2_000, 10**12, 500, -(10**12), 3_000]

    def pick(v: int, n: int) -> np.ndarray:
        base = bases[v % len(bases)]
        return base + rng.integers(0, 400, n)

    def window(v: int, k: np.ndarray) -> np.ndarray:  # retract rows of this version's range only
        base = bases[v % len(bases)]
        return (k >= base) & (k < base + 400)

    _check_count_sum(rng, pa.int64(), False, pick, lambda v: 300 if v % 3 == 2 else int(rng.integers(1_100, 3_000)),
                     window)


def _check_count_sum(rng, key_type, big_values, pick, size, retractable=None):
    schema = pa.schema([("k", key_type), ("x", pa.int64())])
    df = Dataflow()
    coll, inp = df.input(schema)
    acc = Accumulated(coll.reduce("k", {"n": ("count",), "s": ("sum", "x")}).probe())
    live_k = np.empty(0, np.int64)
    live_x = np.empty(0, np.int64)
    hi_x = 2**60 if big_values else 1000
    for v in range(40):
        n_add = size(v)
        k_add = pick(v, n_add)
        x_add = rng.integers(-hi_x, hi_x, n_add)
        pool = np.arange(live_k.size) if retractable is None else np.flatnonzero(retractable(v, live_k))
        gone = rng.choice(pool, min(pool.size, int(rng.integers(0, 1_500))), replace=False)
        k = np.concatenate((k_add, live_k[gone]))
        x = np.concatenate((x_add, live_x[gone]))
        w = np.concatenate((np.ones(n_add, np.int64), -np.ones(gone.size, np.int64)))
        inp.send(ZSet(pa.table({"k": pa.array(k, key_type), "x": x}), w), v)
        keep = np.ones(live_k.size, bool)
        keep[gone] = False
        live_k = np.concatenate((live_k[keep], k_add))
        live_x = np.concatenate((live_x[keep], x_add))
        inp.advance_to(v + 1)
        df.step()
        got = acc.update()
        want: dict = {}
        for kk, xx in zip(live_k.tolist(), live_x.tolist(), strict=True):  # Python ints: exact
            n, s = want.get(kk, (0, 0))
            want[kk] = (n + 1, s + xx)
        expect = {((kk, n, (s + 2**63) % 2**64 - 2**63), 1) for kk, (n, s) in want.items()}
        assert set(got.items()) == expect, f"version {v}"
