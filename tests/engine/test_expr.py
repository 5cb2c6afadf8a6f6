"""engine/expr.py's direct path: which expressions get one, and that it gives exactly what
the Acero plan gives (values, nulls, types, errors); then select/where oracles with the
path forced off (the other oracles run it on: it is the default)."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import expr as _expr
from engine.errors import ExpressionError
from tests.oracle import run_oracle

SCHEMA = pa.schema([("i", pa.int64()), ("j", pa.int32()), ("x", pa.float64()), ("y", pa.float64()),
                    ("s", pa.string()), ("b", pa.bool_()), ("c", pa.bool_()), ("t", pa.timestamp("us")),
                    ("d", pa.date32())])
I, J, X, Y, S, B, C, T, D = (pc.field(n) for n in SCHEMA.names)  # noqa: E741
#: 2024-03-04 01:59:00.123456, and the same instant in other units and zones
AT = dt.datetime(2024, 3, 4, 1, 59, 0, 123456)

DIRECT = [
    X - Y, I * 2, I + J, X * 2.5, X / Y, I / J, I * X, pc.negate_checked(I), pc.abs(X),
    X > Y, I <= 3, S == 'a"b\\', S != "A", X * 1e20, Y * 1e-7, (X > 1) & (Y < 2), B | ~C,
    pc.and_not_kleene(B, C), pc.utf8_upper(S), pc.utf8_length(S), I, (I + J) * (X - 1.5),
    B == True,  # noqa: E712  (a comparison with a literal true)
    S == "é",
    pc.is_null(X),  # no options given: the function's defaults, as in the plan
    # calls with options, printed as "{name=value, ...}" and passed back as keywords
    X.is_null(), pc.is_null(X, nan_is_null=True), I.cast(pa.float64()), I.cast(pa.string()),
    X.cast(pa.int64(), safe=False), X.cast(pa.int32()), I.cast(pa.decimal128(22, 2)),
    I.cast(pa.timestamp("ns")), I.cast(pa.timestamp("ms", tz="UTC")), J.cast(pa.int8()),
    pc.round(X, 1), pc.round(Y, ndigits=1, round_mode="half_up"), pc.round(X * 3.5, -1),
    pc.utf8_slice_codeunits(S, 0, 2), pc.match_substring(S, "a"),
    pc.match_substring(S, "A", ignore_case=True),
    pc.if_else(I < 2, S, pc.binary_join_element_wise(pc.scalar("p:"), S, I.cast(pa.string()), "/")),
    # typed null literals, printed "null[double]" (what SQL's CASE and aggregations make)
    pc.if_else(X > 1, X, pa.scalar(None, pa.float64())), pc.if_else(B, I, pa.scalar(None, pa.int64())),
    pc.if_else(B, S, pa.scalar(None, pa.string())),
    pc.if_else(C, I.cast(pa.timestamp("us")), pa.scalar(None, pa.timestamp("us"))),
    pc.if_else(C, J.cast(pa.decimal128(19, 0)), pa.scalar(None, pa.decimal128(19, 0))),
    X == pc.scalar(None),  # "null[null]": a null of the null type
    # calls of literals inside one that reads a column: computed as scalars
    I + (pc.scalar(1) + pc.scalar(2)), X / pc.scalar(2).cast(pa.float64()),
    pc.if_else(B, pc.scalar(" ").cast(pa.string()), S),
    # date and timestamp literals: a timestamp's unit is its fraction's digits, "Z" is UTC
    T < pc.scalar(pa.scalar(AT, pa.timestamp("us"))), T >= pc.scalar(pa.scalar(AT, pa.timestamp("ns"))),
    T > pc.scalar(pa.scalar(AT.replace(microsecond=0), pa.timestamp("s"))),
    T.cast(pa.timestamp("us", tz="UTC")) < pc.scalar(pa.scalar(AT, pa.timestamp("ms", tz="UTC"))),
    T < pc.scalar(pa.scalar(dt.datetime(1969, 12, 31, 23, 59, 59, 999999), pa.timestamp("us"))),
    D == pc.scalar(dt.date(2024, 3, 4)), D < pc.scalar(dt.date(1969, 7, 20)),
    pc.if_else(T < pc.scalar(pa.scalar(AT, pa.timestamp("us"))), D, pa.scalar(None, pa.date32())),
    # literals whose type the text does not show ("2", "5", "inf", "a\nb" escaped), taken
    # from the expression's serialized form
    X * 2.0, I * pc.scalar(pa.scalar(2, pa.int32())), S == "a\nb", X * float("inf"),
    J.cast(pa.float32()) - pc.scalar(pa.scalar(0.1, pa.float32())), X > float("-inf"),
    pc.add_checked(T, pc.scalar(pa.scalar(5, pa.duration("us")))),
    I.cast(pa.decimal128(22, 2)) > pc.scalar(pa.scalar(decimal.Decimal("1.25"))),
    pc.if_else(B, I.cast(pa.decimal128(10, 0)), pc.scalar(pa.scalar(0, pa.decimal128(10, 0)))),
    T.cast(pa.timestamp("us", tz="Europe/Paris")) < pc.scalar(pa.scalar(AT, pa.timestamp("us", tz="Europe/Paris"))),
    # options holding arrays, likewise
    I.isin([1, 2]), S.isin(["a", "é", None]), pc.is_in(J, pa.array([0, None], pa.int32()), skip_nulls=True),
    pc.index_in(S, pa.array(["A", "a\nb"])), ~X.isin([0.5, -1.0]),
]
NOT_DIRECT = [
    pc.match_substring(S, 'a"b'),             # an option's string prints unescaped
    pc.scalar(1) + pc.scalar(2),              # constant: for the plan (it folds constants)
    pc.multiply_checked(I, pc.scalar(2**62) + 2**62),  # a constant part that overflows: the plan's
]


def bound(e: pc.Expression) -> _expr.BoundExpression:
    return _expr.bind(e, SCHEMA, table_name="t", what="test")


@pytest.mark.parametrize("e", DIRECT, ids=str)
def test_direct_tree_for_simple_expressions(e):
    assert bound(e).direct is not None


@pytest.mark.parametrize("e", NOT_DIRECT, ids=str)
def test_no_direct_tree_when_it_would_not_rebuild_the_expression(e):
    assert bound(e).direct is None


def test_a_column_named_like_a_literal_is_left_to_the_plan():
    """``inf + 1`` reads column ``inf``: the expression has one literal, the tree read from
    its text two: no direct tree, and the plan's answer."""
    schema = pa.schema([("inf", pa.float64()), ("nan", pa.float64())])
    cols = {"inf": pa.array([1.5, None]), "nan": pa.array([2.0, 3.0])}
    for e, want in ((pc.field("inf") + 1.0, [2.5, None]),
                    (pc.field("nan") * pc.field("inf"), [3.0, None])):
        b = _expr.bind(e, schema, table_name="t", what="test")
        assert b.direct is None
        assert _expr.evaluate(b, {c: cols[c] for c in b.inputs}, 2).to_pylist() == want


def random_columns(rng: np.random.Generator, n: int) -> dict[str, pa.Array | pa.ChunkedArray]:
    def nulls() -> np.ndarray:
        return rng.random(n) < 0.2

    big = np.array([0, 1, -1, 2**62, -(2**62), 2**63 - 1])
    ints = np.where(rng.random(n) < 0.1, big[rng.integers(0, big.size, n)], rng.integers(-5, 6, n))
    x = rng.integers(-4, 5, n) * 0.5
    x[rng.random(n) < 0.1] = np.nan
    cols: dict[str, pa.Array | pa.ChunkedArray] = {
        "i": pa.array(ints, mask=nulls()),
        "j": pa.array(rng.integers(-3, 4, n).astype(np.int32), mask=nulls()),
        "x": pa.array(x, mask=nulls()),
        "y": pa.array(rng.integers(-4, 5, n) * 0.25, mask=nulls()),
        "s": pa.array(np.array(["a", "A", 'a"b\\', "", "é", "a\nb"], dtype=object)[rng.integers(0, 6, n)],
                      mask=nulls()),
        "b": pa.array(rng.random(n) < 0.5, mask=nulls()),
        "c": pa.array(rng.random(n) < 0.5, mask=nulls()),
        # around AT, and around the epoch (before and after it)
        "t": pa.array(np.where(rng.random(n) < 0.5, 1_709_517_540_123_456, 0)
                      + rng.integers(-3, 4, n) * 500_000, pa.timestamp("us"), mask=nulls()),
        "d": pa.array(np.where(rng.random(n) < 0.5, 19_786, -165) + rng.integers(-2, 3, n),
                      pa.int32(), mask=nulls()).cast(pa.date32()),
    }
    if n > 2 and rng.random() < 0.5:  # chunked inputs, chunked differently
        cols["x"] = pa.chunked_array([cols["x"].slice(0, 1), cols["x"].slice(1)])
        cols["y"] = pa.chunked_array([cols["y"].slice(0, n - 2), cols["y"].slice(n - 2)])
    return cols


def outcome(b: _expr.BoundExpression, cols, n: int, direct: bool):
    _expr.DIRECT = direct
    try:
        return _expr.evaluate(b, cols, n)
    except ExpressionError as exc:
        return f"{type(exc.__cause__).__name__}: {exc}"
    finally:
        _expr.DIRECT = True


def same(a: pa.Array, b: pa.Array) -> bool:
    """Equal types, nulls and values (NaN equal to NaN, unlike ``Array.equals``)."""
    return (a.type == b.type and a.is_valid().equals(b.is_valid())
            and a.to_pandas().equals(b.to_pandas()))


def test_direct_path_gives_what_the_plan_gives():
    # values, nulls (Kleene logic, NaN), implicit casts, overflow and division by zero
    rng = np.random.default_rng(7)
    bounds = [bound(e) for e in DIRECT + NOT_DIRECT]
    for _ in range(60):
        n = int(rng.choice([0, 1, 3, 8, 40]))
        cols = random_columns(rng, n)
        for b in bounds:
            plan, direct = outcome(b, cols, n, False), outcome(b, cols, n, True)
            if isinstance(plan, str) or isinstance(direct, str):
                assert plan == direct, b.text
            else:
                assert direct.type == b.type and plan.type == b.type, b.text
                assert same(direct, plan), (b.text, direct, plan)
    # several expressions, some direct and some not, in one call keep their order
    mixed = [bound(e) for e in (X - Y, X.is_null(), I * 2, pc.scalar(3))]
    cols = random_columns(rng, 8)
    _expr.DIRECT = False
    want = _expr.evaluate_many(mixed, cols, 8)
    _expr.DIRECT = True
    got = _expr.evaluate_many(mixed, cols, 8)
    assert [same(g, w) for g, w in zip(got, want, strict=True)] == [True] * 4


@pytest.fixture
def plan_only(monkeypatch):
    monkeypatch.setattr(_expr, "DIRECT", False)


def test_update_and_where_oracle_through_the_plan(plan_only):
    P, Q = pc.field("Price"), pc.field("Qty")

    def expected(df):
        out = df.assign(Price=df.Price * 2, N=df.Price * 2 * df.Qty, U=df.Sym.str.upper())
        return out[(out.N > 100) | out.Sym.isna()]

    run_oracle(lambda t: t.update(Price=P * 2, N=pc.field("Price") * Q, U=pc.utf8_upper(pc.field("Sym")))
               .where((pc.field("N") > 100) | pc.is_null(pc.field("Sym"))),
               expected, seed=31, n_cycles=300)
