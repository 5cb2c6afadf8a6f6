"""Linear operators: the seed 000/001/003 examples, errors, laws (linearity, fusion equals
sequential application) and an oracle per operator over >= 500 random versions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import expr as _expr
from engine.differential import linear
from engine.differential.linear import Expansion, LinearOperator
from engine.differential.zset import ZSet, concat, minus, plus
from engine.errors import ExpressionError, InputError
from tests.engine.differential._reference import SCHEMA, counter, key, random_batch

# ---------------------------------------------------------------------------------------
# examples

NAMES = [("frank", 6, 1), ("frank", 8, 1), ("david", 8, 1), ("frank", 9, -2)]


def test_seed001_map_appends_the_length():
    z = ZSet.from_triples(NAMES, ["name"])
    op = LinearOperator().map({"name": "name", "len": pc.utf8_length(pc.field("name"))})
    assert op(z).to_triples() == [
        (("frank", 5), (6,), 1), (("frank", 5), (8,), 1), (("david", 5), (8,), 1), (("frank", 5), (9,), -2),
    ]


def _copies_from_3x_until_4x(t: pa.Table) -> Expansion:
    # seed 001: logic(x) = [(2x, 3x, x), (2x, 4x, -x)]
    x = t.column("x").to_numpy()
    n = x.size
    return Expansion(
        parents=np.concatenate((np.arange(n), np.arange(n))),
        data=pa.table({"y": np.concatenate((2 * x, 2 * x))}),
        times=np.concatenate((3 * x, 4 * x)),
        diffs=np.concatenate((x, -x)),
    )


def test_seed001_join_function_example():
    z = ZSet.from_triples([(x, 0, 1) for x in range(10)], ["x"])
    out = LinearOperator().join_function(_copies_from_3x_until_4x)(z).consolidate()
    want = {((2 * x,), (3 * x,), x) for x in range(1, 10)} | {((2 * x,), (4 * x,), -x) for x in range(1, 10)}
    assert set(out.to_triples()) == want
    # the collection at time 13: x with 3x <= 13 < 4x, i.e. x = 4 (12 <= 13 < 16)
    assert out.accumulate(13).to_triples() == [((8,), None, 4)]
    # the input's time joins in: a record inserted at time 20 appears at max(20, 3x)
    late = LinearOperator().join_function(_copies_from_3x_until_4x)(ZSet.from_triples([(6, 20, 1)], ["x"]))
    assert late.to_triples() == [((12,), (20,), 6), ((12,), (24,), -6)]


def test_seed001_explode_counts_into_weights():
    # (key, count) -> count copies of key, without making count rows; negative counts flip
    z = ZSet.from_triples([(("a", 3), 0, 1), (("b", 2), 0, -1), (("c", -4), 1, 2)], ["key", "count"])
    op = LinearOperator().explode(
        lambda t: Expansion(np.arange(t.num_rows), t.select(["key"]), diffs=t.column("count").to_numpy())
    )
    assert op(z).to_triples() == [(("a",), (0,), 3), (("b",), (0,), -2), (("c",), (1,), -8)]


def test_seed001_temporal_filter():
    z = ZSet.from_triples([
        ((1, 3, 7), 2, 1),      # inserted at 2: visible 3..6
        ((2, 3, 7), 5, 1),      # inserted at 5: visible 5..6 (input time joins in)
        ((3, 3, 7), 8, 1),      # inserted at 8: never visible (the pair cancels, dropped)
        ((4, 6, 6), 0, 1),      # empty interval: never visible
        ((7, 5, 2), 0, 1),      # upper below lower: never visible either
        ((5, 4, None), 0, 2),   # no upper bound: from 4 on
        ((6, None, 2), 0, 1),   # no lower bound: until 2
    ], ["id", "lo", "hi"])
    out = LinearOperator().temporal_filter("lo", "hi")(z)
    assert sorted(out.to_triples(), key=lambda r: (r[0][0], r[1])) == [
        ((1, 3, 7), (3,), 1), ((1, 3, 7), (7,), -1),
        ((2, 3, 7), (5,), 1), ((2, 3, 7), (7,), -1),
        ((5, 4, None), (4,), 2),
        ((6, None, 2), (0,), 1), ((6, None, 2), (2,), -1),
    ]
    assert [r[0][0] for r in out.accumulate(5).to_triples()] == [1, 2, 5]
    # in a nested scope the bound applies to the first coordinate, the rest stays
    z2 = ZSet.from_triples([((1, 3, 7), (2, 4), 1)], ["id", "lo", "hi"])
    assert LinearOperator().temporal_filter("lo", "hi")(z2).to_triples() == [
        ((1, 3, 7), (3, 4), 1), ((1, 3, 7), (7, 4), -1)]


def test_seed003_filter():
    z = ZSet.from_triples([(0, 0, 1), (1, 0, 2), (2, 1, -3)], ["x"])
    is_positive = LinearOperator().filter(pc.field("x") >= 1)
    assert is_positive(z).to_triples() == [((1,), (0,), 2), ((2,), (1,), -3)]
    as_function = LinearOperator().filter(lambda t: pc.greater_equal(t.column("x"), 1))
    assert as_function(z).to_triples() == is_positive(z).to_triples()


def test_seed003_map_and_negate():
    # seed 003's Map example repeats its Filter example; this is the map it describes
    z = ZSet.from_triples([(0, 0, 1), (1, 0, 2), (2, 1, -3)], ["x"])
    assert LinearOperator().map({"x": pc.field("x") * 10})(z).to_triples() == [
        ((0,), (0,), 1), ((10,), (0,), 2), ((20,), (1,), -3)]
    z2 = ZSet.from_triples([(0, 0, 1), (1, 0, -1), (2, 0, -2)], ["x"])
    assert LinearOperator().negate()(z2).to_triples() == [((0,), (0,), -1), ((1,), (0,), 1), ((2,), (0,), 2)]


FRANK = [(("frank", "mcsherry"), 0, 1), (("frank", "mcsherry"), 1, -1), (("frank", "zappa"), 1, 1),
         (("frank", "zappa"), 2, -1), (("frank", "oz"), 3, 1), (("frank", "oz"), 5, -1)]


def test_seed000_filter_projection_and_count():
    z = ZSet.from_triples(FRANK, ["first", "last"])
    starts_z = LinearOperator().filter(pc.starts_with(pc.field("last"), "z"))
    assert starts_z(z).to_triples() == [(("frank", "zappa"), (1,), 1), (("frank", "zappa"), (2,), -1)]
    last = LinearOperator().map({"last": "last"})(z)
    assert last.to_triples() == [(("mcsherry",), (0,), 1), (("mcsherry",), (1,), -1), (("zappa",), (1,), 1),
                                 (("zappa",), (2,), -1), (("oz",), (3,), 1), (("oz",), (5,), -1)]
    # the changes are the changes in count per last name: the count at 3 is oz: 1
    assert last.accumulate(3).to_triples() == [(("oz",), None, 1)]


def test_flat_map_and_fused_chain():
    z = ZSet.from_triples([("to be", 0, 1), ("be", 1, 2)], ["s"])

    def words(t: pa.Table) -> Expansion:
        lists = pc.utf8_split_whitespace(t.column("s"))
        return Expansion(pc.list_parent_indices(lists).to_numpy(), pa.table({"w": pc.list_flatten(lists)}))

    op = LinearOperator().flat_map(words).filter(pc.field("w") != "to").negate()
    assert op(z).to_triples() == [(("be",), (0,), -1), (("be",), (1,), -2)]
    assert repr(op) == "LinearOperator(expand, where, negate)"


def test_errors_name_the_problem():
    z = ZSet.from_triples([((1, "a"), 0, 1)], ["k", "s"])
    with pytest.raises(ExpressionError, match="nope"):
        LinearOperator().filter(pc.field("nope") > 1)(z)
    with pytest.raises(ExpressionError, match="failed"):
        LinearOperator().filter(pc.field("s"))(z)                      # not boolean
    with pytest.raises(ExpressionError, match="1 rows"):
        LinearOperator().map(lambda t: t.slice(0, 0))(z)
    with pytest.raises(ExpressionError, match="may not return diffs"):
        LinearOperator().flat_map(lambda t: Expansion([0], t, diffs=[2]))(z)
    with pytest.raises(ExpressionError, match="parents outside"):
        LinearOperator().flat_map(lambda t: Expansion([3], t))(z)
    with pytest.raises(InputError, match="untimed"):
        LinearOperator().join_function(lambda t: Expansion([0], t, times=[4]))(z.without_times())
    with pytest.raises(InputError, match="timed batch"):
        LinearOperator().temporal_filter("k", None)(z.without_times())
    with pytest.raises(ExpressionError, match="integer"):
        LinearOperator().temporal_filter(pc.field("k").cast(pa.float64()), None)(z)
    with pytest.raises(ExpressionError, match="reserved"):
        LinearOperator().map({"__diff": "k"})


# ---------------------------------------------------------------------------------------
# the operator menu: vectorized operator + per-record Python model
#   model(record) -> [(record2, first time coordinate, diff2)]

Model = Callable[[tuple], list[tuple[tuple, int, int]]]


def _flat(t: pa.Table) -> Expansion:
    k = t.column("K").to_numpy()
    c = k % 3
    p = np.repeat(np.arange(k.size), c)
    i = np.arange(p.size) - np.repeat(np.cumsum(c) - c, c)
    return Expansion(p, pa.table({"K": k[p], "I": i}))


def _explode(t: pa.Table) -> Expansion:
    return Expansion(np.arange(t.num_rows), t.select(["Sym"]), diffs=t.column("K").to_numpy() - 2)


def _window(t: pa.Table) -> Expansion:
    k = t.column("K").to_numpy()
    n = k.size
    return Expansion(np.concatenate((np.arange(n), np.arange(n))), pa.table({"K": np.concatenate((k, k))}),
                     times=np.concatenate((k, k + 2)), diffs=np.concatenate((np.ones(n), -np.ones(n))))


_NO_UPPER = pc.scalar(pa.scalar(None, pa.int64()))
UPPER = pc.if_else(pc.equal(pc.field("Sym"), "a"), _NO_UPPER, pc.add(pc.field("K"), 3))

OPS: dict[str, tuple[LinearOperator, Model]] = {
    "map_expr": (LinearOperator().map({"K2": pc.multiply(pc.field("K"), 2), "Sym": "Sym"}),
                 lambda r: [((r[1] * 2, r[0]), 0, 1)]),
    "map_fn": (LinearOperator().map(lambda t: pa.table({"S": pc.utf8_upper(t.column("Sym")), "K": t.column("K")})),
               lambda r: [((None if r[0] is None else r[0].upper(), r[1]), 0, 1)]),
    "filter_expr": (LinearOperator().filter(pc.field("K") > 2), lambda r: [(r, 0, 1)] if r[1] > 2 else []),
    "filter_fn": (LinearOperator().filter(lambda t: pc.or_kleene(pc.is_null(t.column("X")),
                                                                 pc.greater(t.column("X"), 1.0))),
                  lambda r: [(r, 0, 1)] if r[2] is None or r[2] > 1 else []),
    "flat_map": (LinearOperator().flat_map(_flat), lambda r: [((r[1], i), 0, 1) for i in range(r[1] % 3)]),
    "explode": (LinearOperator().explode(_explode), lambda r: [((r[0],), 0, r[1] - 2)]),
    "join_function": (LinearOperator().join_function(_window), lambda r: [((r[1],), r[1], 1), ((r[1],), r[1] + 2, -1)]),
    "temporal_filter": (LinearOperator().temporal_filter("K", UPPER),
                        lambda r: [(r, r[1], 1)] + ([] if r[0] in ("a", None) else [(r, r[1] + 3, -1)])),
    "negate": (LinearOperator().negate(), lambda r: [(r, 0, -1)]),
}


def _chain(*models: Model) -> Model:
    def run(r):
        out = [(r, 0, 1)]
        for m in models:
            out = [(r3, max(t2, t3), d2 * d3) for r2, t2, d2 in out for r3, t3, d3 in m(r2)]
        return out
    return run


OPS["fused"] = (
    OPS["filter_fn"][0].followed_by(OPS["temporal_filter"][0]).negate()
    .map({"Sym": "Sym", "K": pc.add(pc.field("K"), 1), "X": "X"}).filter(pc.field("K") < 6)
    .flat_map(_flat).join_function(_window),
    _chain(OPS["filter_fn"][1], OPS["temporal_filter"][1], OPS["negate"][1],
           lambda r: [((r[0], r[1] + 1, r[2]), 0, 1)], lambda r: [(r, 0, 1)] if r[1] < 6 else [],
           OPS["flat_map"][1], lambda r: [((r[0],), r[0], 1), ((r[0],), r[0] + 2, -1)]),  # on (K, I)
)


#: the operators with expression stages: their oracle runs again through Acero's plan
#: (the direct path, engine.expr's, is the default)
EXPRESSIONS = ["map_expr", "filter_expr", "fused"]


def _model_at(model: Model, records: dict, collection: Counter, at: int) -> Counter:
    """The model applied from scratch to ``collection`` (the input at version ``at``)."""
    out: Counter = Counter()
    for k, w in collection.items():
        for r2, t2, d2 in model(records[k]):
            if t2 <= at:                      # join(t, t2) <= at  iff  t <= at and t2 <= at
                out[(key(r2), None)] += w * d2
    return Counter({k: w for k, w in out.items() if w})


def _collection_at(timed: Counter, at: int) -> Counter:
    out: Counter = Counter()
    for (k, t), w in timed.items():
        if t[0] <= at:
            out[k] += w
    return Counter({k: w for k, w in out.items() if w})


# ---------------------------------------------------------------------------------------
# oracle: each operator over >= 500 random versions


@pytest.mark.parametrize("name", list(OPS))
def test_operator_oracle_over_random_versions(name):
    op, model = OPS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    acc_in = ZSet.empty(SCHEMA, 1)
    acc_out: ZSet | None = None
    records: dict = {}                     # canonical record -> a real one, for the model
    timed: Counter = Counter()             # the input, (record, time) -> weight
    now: Counter = Counter()               # the input collection at the latest version
    for v in range(510):
        # inserts, deletes, weights > 1 and negative weights at this version
        batch = random_batch(rng, int(rng.integers(0, 12)), times=(v,))
        out = op(batch)
        acc_in = concat(acc_in, batch)
        acc_out = out.consolidate() if acc_out is None else plus(acc_out, out)
        for rec, t, w in batch.to_triples():
            records.setdefault(key(rec), rec)
            timed[(key(rec), t)] += w
            now[key(rec)] += w
        got = counter(acc_out.accumulate(v), times=False)
        assert got == _model_at(model, records, now, v), f"{name}: version {v}"
        if v % 25 == 0 or v == 509:
            assert op(acc_in).equals(acc_out), f"{name}: version {v}: incremental != from scratch"
            acc_in = ZSet(acc_in.data.combine_chunks(), acc_in.diffs, acc_in.times)
            at = int(rng.integers(0, v + 1))
            got = counter(acc_out.accumulate(at), times=False)
            assert got == _model_at(model, records, _collection_at(timed, at), at), f"{name}: at {at}"


def test_concat_plus_minus_oracle_over_random_versions():
    rng = np.random.default_rng(5)
    a_in = b_in = ZSet.empty(SCHEMA, 1)
    outs = {"concat": ZSet.empty(SCHEMA, 1), "plus": ZSet.empty(SCHEMA, 1), "minus": ZSet.empty(SCHEMA, 1)}
    for v in range(510):
        a = random_batch(rng, int(rng.integers(0, 8)), times=(v,))
        b = random_batch(rng, int(rng.integers(0, 8)), times=(v,))
        a_in, b_in = concat(a_in, a), concat(b_in, b)
        outs["concat"] = concat(outs["concat"], concat(a, b))
        outs["plus"] = plus(outs["plus"], plus(a, b))
        outs["minus"] = plus(outs["minus"], minus(a, b))
        if v % 25 == 0 or v == 509:
            ca, cb = counter(a_in), counter(b_in)
            want_plus = Counter({k: ca.get(k, 0) + cb.get(k, 0) for k in set(ca) | set(cb)})
            want_minus = Counter({k: ca.get(k, 0) - cb.get(k, 0) for k in set(ca) | set(cb)})
            assert counter(outs["concat"]) == counter(plus(a_in, b_in)) == from_nonzero(want_plus)
            assert counter(outs["plus"]) == from_nonzero(want_plus)
            assert counter(outs["minus"]) == counter(minus(a_in, b_in)) == from_nonzero(want_minus)
            a_in = ZSet(a_in.data.combine_chunks(), a_in.diffs, a_in.times)
            b_in = ZSet(b_in.data.combine_chunks(), b_in.diffs, b_in.times)
            outs["concat"] = outs["concat"].consolidate()


def from_nonzero(c: Counter) -> Counter:
    return Counter({k: w for k, w in c.items() if w})


# ---------------------------------------------------------------------------------------
# laws

SCHEMA_PRESERVING = {
    "filter_expr": OPS["filter_expr"][0],
    "filter_fn": OPS["filter_fn"][0],
    "temporal_filter": OPS["temporal_filter"][0],
    "negate": OPS["negate"][0],
    "map_same": LinearOperator().map({"Sym": "Sym", "K": pc.subtract(pc.field("K"), 1), "X": "X"}),
    "map_fn_same": LinearOperator().map(lambda t: t.set_column(1, "K", pc.add(t.column("K"), 1))),
    "copies": LinearOperator().flat_map(lambda t: Expansion(np.repeat(np.arange(t.num_rows), 2),
                                                             t.take(np.repeat(np.arange(t.num_rows), 2)))),
    "explode_same": LinearOperator().explode(lambda t: Expansion(np.arange(t.num_rows), t,
                                                                  diffs=t.column("K").to_numpy() - 1)),
    "shift_time": LinearOperator().join_function(lambda t: Expansion(np.arange(t.num_rows), t,
                                                                      times=t.column("K").to_numpy())),
}

seeds = st.integers(0, 2**32 - 1)
chains = st.lists(st.sampled_from(sorted(SCHEMA_PRESERVING)), min_size=1, max_size=6)


@given(chains, seeds)
def test_fusion_equals_sequential_application(names, seed):
    batch = random_batch(np.random.default_rng(seed), 40, times=(1,), time_spread=3)
    fused = LinearOperator()
    for n in names:
        fused = fused.followed_by(SCHEMA_PRESERVING[n])
    sequential = batch
    for n in names:
        sequential = SCHEMA_PRESERVING[n](sequential).consolidate()
    assert fused(batch).equals(sequential)


@given(st.sampled_from(sorted(OPS)), seeds, seeds)
def test_operators_are_linear(name, s1, s2):
    op = OPS[name][0]
    a = random_batch(np.random.default_rng(s1), 20, times=(1,), time_spread=3)
    b = random_batch(np.random.default_rng(s2), 20, times=(1,), time_spread=3)
    assert op(concat(a, b)).equals(concat(op(a), op(b)))
    assert op(a.negate()).equals(op(a).negate())


def test_a_projection_keeps_each_row_with_its_weight_and_time():
    # projections alone run without a row column: the plan must keep every row in order,
    # over several of Acero's batches (its table source cuts at 32k rows), chunked input too
    n = 100_003
    rng = np.random.default_rng(3)
    k = rng.permutation(n).astype(np.int64)
    data = pa.concat_tables([pa.table({"K": k[:40_000]}), pa.table({"K": k[40_000:]})])
    batch = ZSet(data, k * 3 - 7, (k * 5).reshape(-1, 1))
    out = LinearOperator().map({"M": pc.add(pc.field("K"), 1), "K": "K"})(batch)
    m = out.data.column("M").to_numpy()
    assert np.array_equal(m, k + 1) and np.array_equal(out.data.column("K").to_numpy(), k)
    assert np.array_equal(out.diffs, k * 3 - 7) and np.array_equal(out.times[:, 0], k * 5)


_INT64 = np.iinfo(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_integer_arithmetic_by_a_scalar_is_arrows(seed):
    """``map`` of a column by an int64 scalar (unchecked add, subtract, multiply, divide)
    runs in numpy: on random int64 columns (negatives, the extremes, several chunks, now
    and then nulls or another type, which go to Acero) and random scalars (zero and
    negative divisors included) every output, its type and every error are what Arrow's
    own plan gives."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(0, 300))
        v = rng.integers(-1000, 1000, n) * rng.choice([1, 1, 10**12], n)
        if n:
            v[rng.integers(0, n, 3)] = rng.choice([_INT64.min, _INT64.max, _INT64.min + 1, -1, 0], 3)
        mask = (rng.random(n) < 0.2) if rng.random() < 0.15 else None
        typ = pa.int32() if rng.random() < 0.1 else pa.int64()
        arr = pa.array(v.astype(np.int32) if typ == pa.int32() else v, typ, mask=mask)
        cut = int(rng.integers(0, n + 1))
        data = pa.Table.from_batches([pa.record_batch([arr.slice(0, cut)], ["v"]),
                                      pa.record_batch([arr.slice(cut)], ["v"])])
        batch = ZSet(data, np.ones(n, dtype=np.int64), np.zeros((n, 1), dtype=np.int64))
        op = str(rng.choice(["add", "subtract", "multiply", "divide"]))
        k = int(rng.choice([0, 1, -1, 7, -7, 100, 3, 2**40, _INT64.max, _INT64.min]))
        exprs = {"v": "v", "r": getattr(pc, op)(pc.field("v"), pc.scalar(k))}
        chain = LinearOperator().map(exprs).map({"r2": pc.divide(pc.field("r"), pc.scalar(3)), "v": "v"})
        reference = LinearOperator([_arrow_only(s) for s in chain.stages])
        try:
            want = reference(batch)
        except ExpressionError as exc:
            with pytest.raises(ExpressionError, match=str(exc).split(": ")[-1]):
                chain(batch)
            continue
        got = chain(batch)
        assert got.data.schema.equals(want.data.schema), (op, k, got.data.schema, want.data.schema)
        assert got.data.equals(want.data), (op, k, v.tolist(), got.data.column("r2").to_pylist())
        assert np.array_equal(got.diffs, want.diffs) and np.array_equal(got.times, want.times)


def _arrow_only(stage):
    """The same projection, without its numpy form: Acero evaluates it."""
    from engine.differential.linear import _Project

    assert isinstance(stage, _Project)
    return _Project(stage.exprs, stage.columns, None)


def test_look_alike_expressions_go_to_arrow():
    """Only an exact ``column op int64 scalar`` is computed in numpy; look-alikes (checked
    functions, an int32 scalar, a nested field) are not."""
    from engine.differential.linear import _IntOp

    simple = [s.simple for s in LinearOperator().map({
        "a": pc.divide(pc.field("v"), pc.scalar(100)),
        "b": "v",
        "c": pc.field("v, w"),
        "d": pc.subtract(pc.field("x, y"), pc.scalar(-5)),
    }).stages]
    assert simple == [(_IntOp("v", "divide", 100), "v", "v, w", _IntOp("x, y", "subtract", -5))]
    for e in (pc.field("v") / 100, pc.divide(pc.field("v"), pc.scalar(pa.scalar(100, pa.int32()))),
              pc.divide(pc.field(("a", "b")), pc.scalar(2)), pc.add(pc.field("v"), pc.scalar(1.5)),
              pc.divide(pc.field("v"), pc.scalar(100)).cast(pa.int32())):
        assert LinearOperator().map({"a": e}).stages[0].simple is None, str(e)


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expression_stages_through_the_plan_oracle(name, monkeypatch):
    monkeypatch.setattr(_expr, "DIRECT", False)
    test_operator_oracle_over_random_versions(name)


def test_expression_stages_take_the_direct_path_and_leave_the_plan_for_the_rest(monkeypatch):
    plans = []
    real = linear._run_plan
    monkeypatch.setattr(linear, "_run_plan", lambda st, run: plans.append(len(run)) or real(st, run))
    batch = random_batch(np.random.default_rng(3), 40, times=(0,))
    op = LinearOperator().filter(pc.field("K") > 2).map(
        {"S": pc.utf8_upper(pc.field("Sym")), "K": pc.multiply(pc.field("K"), 2)})
    got = counter(op(batch), times=False)
    assert plans == []  # the filter and the map called their functions on the columns
    want: Counter = Counter()
    for (sym, k, _), _, d in batch.to_triples():
        if k is not None and k > 2:
            want[(key((None if sym is None else sym.upper(), k * 2)), None)] += d
    assert got == Counter({r: w for r, w in want.items() if w})
    LinearOperator().filter(pc.field("Sym").isin(["a", "b"]))(batch)  # an array option, direct
    assert plans == []
    # an option's string with a quote prints unescaped: not read back, a plan
    LinearOperator().filter(pc.match_substring(pc.field("Sym"), 'a"b'))(batch)
    assert plans == [1]
