"""A selective query finds its rows over the columns its ``WHERE`` reads first
(flight.sql.narrow, ``QueryRunner._narrow``), and a single-table query's snapshot holds only
the columns it reads (``read_columns``): every answer equals DuckDB's over the whole table,
whether the pass kept the rows, gave up at its cap or did not run, through randomized cycles
of appends, upserts and deletes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from engine.errors import QueryCancelled, SqlError
from engine.graph import UpdateGraph
from flight.sql import narrow
from flight.sql.parse import parse_one
from flight.sql.query import QueryRunner, named_tables, narrow_plan, read_columns
from flight.streams.registry import TableRegistry
from tests.flight.sql.sqlcheck import check_query

A = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.float64()), ("s", pa.string()),
               ("Mixed", pa.int32())])


def _rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    return pa.table({
        "id": np.arange(start, start + n),
        "g": pa.array(rng.integers(-20, 20, n), mask=rng.random(n) < 0.1),
        "x": pa.array(rng.random(n), mask=rng.random(n) < 0.05),
        "s": pa.array([f"s{v}" for v in rng.integers(0, 30, n)], mask=rng.random(n) < 0.05),
        "Mixed": rng.integers(0, 5, n).astype(np.int32),
    }, schema=A)


@pytest.fixture
def runner(monkeypatch):
    # small tables take the narrow pass, and its cap is often reached: both ways are run
    monkeypatch.setattr(narrow, "MIN_ROWS", 64)
    monkeypatch.setattr(narrow, "MIN_CAP", 4)
    monkeypatch.setattr(narrow, "CAP_DIVISOR", 16)
    monkeypatch.setattr(narrow, "MS_AGAIN", 0.0)  # worth running for any table of MIN_ROWS
    monkeypatch.setattr(narrow, "NS_POSITION", 0.0)
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    rng = np.random.default_rng(23)
    t = registry.create_source("t", A, "append").table
    for i in range(5):  # several chunks
        t.append(_rows(rng, 90 * i, 90))
    k = registry.create_source("k", A, "keyed", keys=["id"]).table
    k.upsert(_rows(rng, 0, 400))
    graph.run_cycle()
    r = QueryRunner(registry, timeout=30.0)
    yield graph, registry, r, rng
    r.shutdown()


class _Spy:
    """Counts narrow passes that kept their rows (``kept``) and the rows they kept."""

    def __init__(self, monkeypatch) -> None:
        self.kept = 0
        self.rows = 0
        take = narrow.take_rows

        def spy(rows: pa.Table, found: pa.Array) -> pa.Table:
            out = take(rows, found)
            self.kept += 1
            self.rows += out.num_rows
            return out

        monkeypatch.setattr(narrow, "take_rows", spy)


def _run(r: QueryRunner, sql: str, params: list | None = None) -> pa.Table:
    q = r.start(sql, params)
    return pa.Table.from_batches(list(r.batches(q)), q.schema)


_check = check_query


NARROWED = [  # (query, the WHERE's columns)
    ("SELECT * FROM t WHERE id + 0 = 7", ("id",)),
    ("SELECT * FROM t AS q WHERE q.g = 3 AND q.x > 0.5", ("g", "x")),
    ("SELECT id, s FROM k WHERE g IS NULL", ("g",)),
    ("SELECT * FROM t WHERE s LIKE 's1%' AND mixed = 2", ("s", "Mixed")),
    ("SELECT sum(x), count(*) FROM t WHERE g BETWEEN -2 AND 2", ("g",)),
    ("SELECT g, count(*) FROM t WHERE id % 7 = 0 GROUP BY g ORDER BY g NULLS FIRST", ("id",)),
    ("SELECT * FROM t WHERE id + 0 > ? ORDER BY id DESC LIMIT 3", ("id",)),
    ("SELECT * FROM t WHERE CAST(g AS VARCHAR) = '5' OR abs(g) = 19", ("g",)),
    ("SELECT upper(s) AS u FROM t WHERE x IN (0.5, 0.25) OR NOT (g <> 4)", ("g", "x")),
]

WHOLE = [  # no narrow pass
    "SELECT * FROM t WHERE random() < 0.5",  # volatile: a second run keeps other rows
    "SELECT * FROM t WHERE my_function(g) = 1",  # a function it does not know
    "SELECT g FROM t WHERE g = 3",  # reads nothing the WHERE does not
    "SELECT count(*) FROM t WHERE g = 3",
    "SELECT x + 1 AS z FROM t WHERE z > 1.5",  # an output's alias
    "SELECT * FROM t WHERE x = (SELECT max(x) FROM t)",  # t read twice
    "SELECT * FROM t WHERE g IN (SELECT g FROM k)",
    "SELECT * FROM t JOIN k ON t.g = k.g WHERE t.id = 7",
    "SELECT ?, * FROM t WHERE g = ?",  # a parameter outside the WHERE
    "SELECT * FROM t",
    "SELECT * FROM t WHERE EXISTS (SELECT 1)",
    "SELECT * FROM (SELECT * FROM t) WHERE g = 1",
]


@pytest.mark.parametrize("sql, columns", NARROWED)
def test_a_selective_where_reads_its_columns_first(runner, sql, columns):
    graph, registry, r, _ = runner
    tree = parse_one(sql)
    first = narrow_plan(tree, named_tables(tree, registry, "query"), [100] if "?" in sql else None)
    assert first is not None and first.columns == columns
    _check(registry, r, sql, [100] if "?" in sql else None)


@pytest.mark.parametrize("sql", WHOLE)
def test_other_shapes_run_over_the_whole_table(runner, sql):
    graph, registry, r, _ = runner
    tree = parse_one(sql)
    entries = named_tables(tree, registry, "query")
    params = [1, 3] if sql.count("?") == 2 else None
    assert narrow_plan(tree, entries, params) is None
    if "random()" in sql or "my_function" in sql or "z >" in sql:
        return  # no fixed answer to compare, or DuckDB refuses it
    _check(registry, r, sql, params)


def test_the_pass_keeps_few_rows_and_gives_up_past_its_cap(runner, monkeypatch):
    graph, registry, r, _ = runner
    spy = _Spy(monkeypatch)
    n = registry.get("t").table.size
    _check(registry, r, "SELECT * FROM t WHERE id + 0 = 17")
    assert (spy.kept, spy.rows) == (1, 1)
    _check(registry, r, "SELECT * FROM t WHERE id + 0 > 5 ORDER BY id")  # nearly every row
    assert spy.kept == 1  # past the cap: the query ran over the whole table
    _check(registry, r, "SELECT * FROM t WHERE id + 0 < 0")  # none kept: no rows to take
    assert (spy.kept, spy.rows) == (2, 1)
    assert narrow.cap(n) < n - 6


def test_a_pass_that_gave_up_waits_for_the_table_to_double(runner, monkeypatch):
    graph, registry, r, rng = runner
    runs: list[str] = []
    import flight.sql.query as query_module
    stream = query_module._stream
    monkeypatch.setattr(query_module, "_stream", lambda c, q, *a: runs.append(q) or stream(c, q, *a))
    t = registry.get("t").table
    sql = "SELECT * FROM t WHERE id % 1000 > 5 ORDER BY id"
    _check(registry, r, sql)
    assert len(runs) == 2  # the pass, given up, then the query
    _check(registry, r, sql)
    assert len(runs) == 3  # the query alone
    _check(registry, r, "SELECT * FROM t WHERE id % 1000 = 5")  # another WHERE runs its pass
    assert len(runs) == 4
    size = t.size
    t.append(_rows(rng, size, size))
    graph.run_cycle()
    _check(registry, r, sql)
    assert len(runs) == 6  # the table doubled: the pass runs again


def test_a_star_s_rows_are_its_answer_in_duckdb_s_types(runner, monkeypatch):
    graph, registry, r, rng = runner
    odd = pa.schema([("id", pa.int64()), ("ls", pa.large_string()),
                     ("d", pa.dictionary(pa.int32(), pa.string())),
                     ("ts", pa.timestamp("ms", tz="UTC")), ("b", pa.bool_())])
    o = registry.create_source("o", odd, "append").table
    n = 300
    o.append(pa.table({"id": np.arange(n), "ls": [f"v{i % 9}" for i in range(n)],
                       "d": pa.array([f"d{i % 4}" for i in range(n)]).dictionary_encode(),
                       "ts": pa.array(np.arange(n) * 1000, pa.timestamp("ms", tz="UTC")),
                       "b": np.arange(n) % 3 == 0}, schema=odd))
    graph.run_cycle()
    spy = _Spy(monkeypatch)
    runs: list[str] = []
    import flight.sql.query as query_module
    stream = query_module._stream
    monkeypatch.setattr(query_module, "_stream", lambda c, q, *a: runs.append(q) or stream(c, q, *a))
    _check(registry, r, "SELECT * FROM t WHERE id % 1000 = 17")  # DuckDB's types: its rows answer
    assert spy.kept == 1 and len(runs) == 1 and "__ticktable_narrow" in runs[0]
    _check(registry, r, "SELECT t.* FROM t WHERE id % 1000 = -3")  # no row
    assert spy.kept == 2 and len(runs) == 2
    _check(registry, r, "SELECT * FROM o WHERE id % 1000 = 17")  # other types: DuckDB answers
    assert spy.kept == 3 and len(runs) == 4
    _check(registry, r, "SELECT * FROM t WHERE id % 1000 = 17 LIMIT 1")  # a clause: DuckDB answers
    assert spy.kept == 4 and len(runs) == 6
    _check(registry, r, "SELECT a.* FROM t AS a WHERE id % 1000 = 17")
    assert spy.kept == 5 and len(runs) == 7
    with pytest.raises(SqlError, match='table "t" not found'):  # out of scope: DuckDB says so
        _run(r, "SELECT t.* FROM t AS a WHERE id % 1000 = 17")


def test_a_failing_pass_leaves_the_error_to_the_query(runner):
    graph, registry, r, _ = runner
    with pytest.raises(Exception, match="(?i)conversion|convert|cast"):
        _run(r, "SELECT * FROM t WHERE CAST(s AS INTEGER) = 3")
    assert _run(r, "SELECT * FROM t WHERE id % 1000 = 3").num_rows == 1  # the runner goes on


@pytest.mark.parametrize("step, where", [("narrow_table", "id % 1000 = 3"),  # DuckDB's pass
                                         ("_mask", "id + 0 = 3")])  # numpy's, between slices
def test_a_cancel_during_the_pass_stops_the_query(runner, monkeypatch, step, where):
    graph, registry, r, _ = runner
    real = getattr(narrow, step)

    def cancelling(*args):
        for handle in list(r._running):
            r.cancel(handle)
        return real(*args)

    monkeypatch.setattr(narrow, step, cancelling)
    with pytest.raises(QueryCancelled):
        q = r.start(f"SELECT * FROM t WHERE {where}")
        list(r.batches(q))
    monkeypatch.setattr(narrow, step, real)
    assert _run(r, f"SELECT * FROM t WHERE {where}").num_rows == 1


def test_a_snapshot_holds_the_columns_a_one_table_query_reads(runner):
    graph, registry, r, _ = runner
    for sql, cols in [("SELECT g, sum(x) FROM t GROUP BY g", ["g", "x"]),
                      ("SELECT count(*) FROM t WHERE MIXED = 1", ["Mixed"]),
                      ("SELECT q.s FROM k q WHERE q.id < 5", ["id", "s"]),
                      ("SELECT * FROM t WHERE g = 1", None),
                      ("SELECT t.* FROM t", None),
                      ("SELECT count(*) FROM t", None),
                      ("SELECT t.g, k.x FROM t JOIN k USING (id)", None)]:
        tree = parse_one(sql)
        entries = named_tables(tree, registry, "query")
        assert read_columns(tree, entries, entries[0]) == cols, sql
        _check(registry, r, sql)


def test_the_pass_runs_where_it_should_save_more_than_it_costs():
    star = narrow.NarrowPlan(("id",), "", star=True)
    again = narrow.NarrowPlan(("id",), "", star=False)
    big = pa.table({"id": np.zeros(4_000_000, np.int64), "y": np.zeros(4_000_000),
                    "s": pa.nulls(4_000_000, pa.string())})
    small = big.slice(0, 200_000)
    assert narrow.worth(big, star) and narrow.worth(big, again)
    assert narrow.worth(small, star) and not narrow.worth(small, again)  # the second query
    assert not narrow.worth(big.select(["id", "y"]).slice(0, 1_000_000), again)
    assert not narrow.worth(big.select(["id"]), star)  # nothing skipped


def test_take_rows_keeps_the_table_s_order_across_chunks():
    rng = np.random.default_rng(5)
    t = pa.Table.from_batches([_rows(rng, i * 50, 50).to_batches()[0] for i in range(7)])
    for _ in range(200):
        found = rng.choice(t.num_rows, size=int(rng.integers(0, 60)), replace=False)
        got = narrow.take_rows(t, pa.array(found.astype(np.uint32)))
        assert got.equals(t.take(np.sort(found)))
    assert narrow.take_rows(t.schema.empty_table(), pa.array([], pa.uint32())).num_rows == 0


def _where(rng: np.random.Generator) -> tuple[str, list | None]:
    """A random WHERE over A's columns (and its parameters)."""
    terms = [
        lambda: f"id + 0 = {int(rng.integers(-5, 600))}",
        lambda: f"id % {int(rng.integers(2, 50))} = {int(rng.integers(0, 3))}",
        lambda: f"g = {int(rng.integers(-21, 21))}",
        lambda: "g IS NULL",
        lambda: f"x > {rng.random():.3f}",
        lambda: f"s = 's{int(rng.integers(0, 31))}'",
        lambda: f"s LIKE 's{int(rng.integers(0, 4))}%'",
        lambda: f"Mixed IN ({int(rng.integers(0, 6))}, {int(rng.integers(0, 6))})",
        lambda: f"abs(g) BETWEEN {int(rng.integers(0, 10))} AND {int(rng.integers(10, 21))}",
        # the numpy pass's shapes too (NaN and other edges: the test of numpy's pass alone)
        lambda: f"x >= {rng.random():.3f}",
        lambda: f"x <> {rng.random():.2f}",
        lambda: f"s <> 's{int(rng.integers(0, 31))}'",
        lambda: f"s IN ('s{int(rng.integers(0, 31))}', 's{int(rng.integers(0, 31))}')",
        lambda: f"id * 2 < {int(rng.integers(0, 1200))}",
        lambda: f"3 + id > {int(rng.integers(0, 600))}",
        lambda: f"g BETWEEN {int(rng.integers(-21, 0))} AND {int(rng.integers(0, 21))}",
        lambda: "?",
    ]
    parts, params = [], []
    for _ in range(int(rng.integers(1, 4))):
        pick = int(rng.integers(0, len(terms)))
        if pick == len(terms) - 1:
            parts.append("id + 0 < ?")
            params.append(int(rng.integers(0, 700)))
        else:
            parts.append(terms[pick]())
    joiner = " AND " if rng.random() < 0.7 else " OR "
    return joiner.join(parts), params or None


SHAPES = [
    "SELECT * FROM {t} WHERE {w}",
    "SELECT * FROM {t} WHERE {w} ORDER BY id",
    "SELECT id, s, x * 2 AS x2 FROM {t} WHERE {w} ORDER BY id DESC LIMIT 5",
    "SELECT g, count(*), sum(x) FROM {t} WHERE {w} GROUP BY g",
    "SELECT count(*), min(s), max(id) FROM {t} AS a WHERE {w}",
    "SELECT DISTINCT s FROM {t} WHERE {w}",
    "SELECT id, row_number() OVER (PARTITION BY g ORDER BY id) FROM {t} WHERE {w}",
]


def test_randomized_queries_answer_as_the_whole_scan_through_cycles(runner, monkeypatch):
    graph, registry, r, rng = runner
    spy = _Spy(monkeypatch)
    t, k = registry.get("t").table, registry.get("k").table
    queries = 0
    size = t.size
    for _ in range(40):
        n = int(rng.integers(0, 40))
        t.append(_rows(rng, size, n))
        size += n
        ids = rng.integers(0, 500, int(rng.integers(0, 30)))
        k.upsert(_rows(rng, 0, 500).take(np.unique(ids)))
        gone = rng.integers(0, 500, int(rng.integers(0, 10)))
        k.delete(pa.table({"id": np.unique(gone)}))
        graph.run_cycle()
        for _ in range(8):
            w, params = _where(rng)
            sql = SHAPES[int(rng.integers(0, len(SHAPES)))].format(
                t="t" if rng.random() < 0.6 else "k", w=w)
            _check(registry, r, sql, params)
            queries += 1
    assert queries == 320
    assert spy.kept > 60, spy.kept  # the pass kept its rows often, and gave up often too
    assert spy.kept < queries - 60, spy.kept
    assert r.narrow_passes["numpy"] > 30, r.narrow_passes  # numpy's pass, and DuckDB's
    assert r.narrow_passes["numpy"] < spy.kept + r.narrow_passes["gave_up"] - 30


# ---------------------------------------------------------------- the pass without DuckDB
#: Columns whose values DuckDB and numpy could disagree on: integer extremes, NaN, infinities,
#: signed zeros, huge doubles, nulls everywhere, empty and accented strings.
TRICKY = pa.schema([("i8", pa.int8()), ("i32", pa.int32()), ("u16", pa.uint16()),
                    ("big", pa.int64()), ("d", pa.float64()), ("s", pa.string()),
                    ("ls", pa.large_string())])


def _tricky(rng: np.random.Generator, n: int) -> pa.Table:
    def pick(pool: list, dtype: Any = None) -> np.ndarray:
        return np.array([pool[i] for i in rng.integers(0, len(pool), n)], dtype=dtype)

    nulls = lambda: rng.random(n) < 0.15  # noqa: E731
    edge64 = [-(2**63), -(2**63) + 5, -3, -1, 0, 1, 2, 7, 2**53 + 1, 2**62, 2**63 - 6, 2**63 - 1]
    doubles = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -2.5, 1e300, -1e-300, 3.0,
               0.1, 0.30000000000000004, 2.0**53 + 2, 1e3, 7.0]
    strings = ["", "a", "s1", "s2", "é", "日本", "a\x00b", "S1", " s1"]
    return pa.table({
        "i8": pa.array(pick([-128, -1, 0, 1, 3, 127], np.int8), mask=nulls()),
        "i32": pa.array(pick([-(2**31), -5, 0, 3, 2**31 - 1], np.int32), mask=nulls()),
        "u16": pa.array(pick([0, 1, 3, 65535], np.uint16), mask=nulls()),
        "big": pa.array(pick(edge64, np.int64), mask=nulls()),
        "d": pa.array(pick(doubles, np.float64), mask=nulls()),
        "s": pa.array(pick(strings, object), pa.string(), mask=nulls()),
        "ls": pa.array(pick(strings, object), pa.large_string(), mask=nulls()),
    }, schema=TRICKY)


def _numpy_term(rng: np.random.Generator) -> tuple[str, list]:
    """A random term of a shape the numpy pass takes (and its parameter, if any)."""
    op = ["=", "<>", "!=", "<", "<=", ">", ">="][int(rng.integers(0, 7))]
    ints = ["-128", "0", "1", "3", "127", "200", "-40000", "65535", "2147483647", "2147483648",
            "9223372036854775807", "-9223372036854775808", "9007199254740993", "7", "0003"]
    doubles = ["0.5", "-2.5", "0", "3", "1e3", "1e300", "-1e-300", "0.1", "0.30000000000004",
               "-0.0", "9007199254740992", "7", "2.5e-1", "12345678901234.5", ".5", "3.", "1.5E-3"]
    strings = ["''", "'a'", "'s1'", "'é'", "'日本'", "'S1'", "' s1'", "'zz'"]
    col = ["i8", "i32", "u16", "big", "d", "s", "ls"][int(rng.integers(0, 7))]
    lits = doubles if col == "d" else strings if col in ("s", "ls") else ints
    lit = lambda: lits[int(rng.integers(0, len(lits)))]  # noqa: E731
    if col in ("s", "ls"):
        op = ["=", "<>"][int(rng.integers(0, 2))]
    shape = int(rng.integers(0, 8))
    if shape == 7:  # an OR of equalities of one column: an IN
        side = "(big + 5)" if col == "big" and rng.random() < 0.3 else col
        return "(" + " OR ".join(f"{side} = {lit()}" for _ in range(int(rng.integers(2, 4)))) + ")", []
    if shape == 6:
        return f"{col} IS {'NOT ' if rng.random() < 0.5 else ''}NULL", []
    if col == "big" and shape == 0:  # arithmetic: BIGINT only
        side = ["big + 5", "big - 5", "big * 2", "3 + big", "(big + 0)", "big * -1", "big * 0",
                "big - -7"][int(rng.integers(0, 8))]
        return f"{side} {op} {lit()}", []
    if shape == 1 and col not in ("s", "ls"):
        return f"{col} BETWEEN {lit()} AND {lit()}", []
    if shape == 2:
        return f"{col} IN ({', '.join(lit() for _ in range(int(rng.integers(1, 4))))})", []
    if shape == 3:  # the one parameter
        value: Any = {"d": float(rng.choice([0.5, -0.0, 3.0, 1e300])),
                      "s": "s1", "ls": "é"}.get(col, int(rng.choice([0, 3, -1, 127, 2**40])))
        return (f"? {op} {col}" if rng.random() < 0.5 else f"{col} {op} ?"), [value]
    if shape == 4:
        return f"{lit()} {op} {col}", []
    return f"{col} {op} {lit()}", []


def test_the_numpy_pass_keeps_exactly_the_rows_duckdb_keeps():
    """Random WHEREs of the shapes the pass takes over columns of edge values, in chunks
    sliced at offsets: numpy's positions equal DuckDB's (``SELECT position ... WHERE``)
    for every one it evaluates; the ones it leaves (arithmetic that could overflow) are
    counted."""
    import duckdb

    rng = np.random.default_rng(71)
    con = duckdb.connect()
    evaluated = left = 0
    for round_ in range(60):
        whole = _tricky(rng, 600)
        cuts = np.sort(rng.choice(np.arange(1, 600), size=int(rng.integers(0, 5)), replace=False))
        pieces = [whole.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, 600], strict=True)]
        rows = pa.concat_tables(pieces)  # chunks at offsets into shared buffers
        con.register("w", rows.append_column("pos", pa.array(np.arange(600))))
        for _ in range(25):
            parts, params = [], []
            for _ in range(int(rng.integers(1, 4))):
                term, p = _numpy_term(rng)
                if p and params:  # one parameter at most
                    continue
                parts.append(term)
                params += p
            where_sql = " AND ".join(parts)
            tree = parse_one(f"SELECT pos FROM w WHERE {where_sql}")
            terms = narrow.terms(tree.args["where"].this, {"w"}, TRICKY, params)
            assert terms is not None, where_sql
            got = narrow.scan(rows, terms, limit=10_000)
            try:
                want = con.execute(f"SELECT pos FROM w WHERE {where_sql} ORDER BY pos",
                                   params or None).fetchnumpy()["pos"]
            except duckdb.OutOfRangeException:
                want = None
            if got is None:
                assert any(t.arith for t in terms), where_sql
                left += 1
                continue
            assert want is not None, f"DuckDB raised, numpy answered: {where_sql}"
            assert got.tolist() == want.tolist(), (round_, where_sql, params)
            evaluated += 1
        con.unregister("w")
    print(f"\n{evaluated} WHEREs evaluated by numpy as DuckDB does, {left} left to DuckDB")
    assert evaluated > 1000 and left > 10


@pytest.mark.parametrize("where", [
    "i32 = 2.5",  # an integer column against a decimal: DuckDB compares as DECIMAL
    "d = 0.1234567890123456",  # 16 digits: DuckDB's DECIMAL cast to DOUBLE may round twice
    "d > 18446744073709551616",  # past 2**53
    "i8 + 1 = 3",  # arithmetic on a narrow type (DuckDB's literal typing decides its width)
    "5 - big = 3",
    "big + 1.5 > 3",
    "s > 'a'",  # string order: left to DuckDB
    "s = 3",
    "big = NULL",
    "big IN (1, NULL)",
    "d IS DISTINCT FROM 3",
    "big + 1 IS NULL",
    "abs(big) = 3",
    "big = $1",
    "big = big",
    "NOT big = 3",
    "big = 3 OR i32 = 4",  # an OR of two columns
    "big = 3 OR big > 4",
    "(big + 1 = 3 OR big = 4)",
    "CAST(big AS DOUBLE) > 2",
    "big BETWEEN SYMMETRIC 5 AND 1",
])
def test_the_numpy_pass_leaves_other_terms_to_duckdb(where):
    tree = parse_one(f"SELECT * FROM w WHERE big = 1 AND {where}")
    assert narrow.terms(tree.args["where"].this, {"w"}, TRICKY, [3]) is None


def test_the_numpy_pass_answers_a_star_without_duckdb(runner, monkeypatch):
    graph, registry, r, rng = runner
    spy = _Spy(monkeypatch)
    runs: list[str] = []
    import flight.sql.query as query_module
    stream = query_module._stream
    monkeypatch.setattr(query_module, "_stream", lambda c, q, *a: runs.append(q) or stream(c, q, *a))
    _check(registry, r, "SELECT * FROM t WHERE id + 0 = 17")
    assert (spy.kept, len(runs), r.narrow_passes["numpy"]) == (1, 0, 1)  # no DuckDB at all
    _check(registry, r, "SELECT id, s FROM t WHERE g = 3 AND x > 0.5 ORDER BY id")
    assert (spy.kept, len(runs), r.narrow_passes["numpy"]) == (2, 1, 2)  # the query alone
    _check(registry, r, "SELECT * FROM t WHERE s IN ('s1', 's2') AND id BETWEEN 3 AND ?", [300])
    assert r.narrow_passes["numpy"] == 3 and len(runs) == 1
    _check(registry, r, "SELECT * FROM t WHERE id % 1000 = 17")  # DuckDB's pass, the answer
    assert r.narrow_passes["numpy"] == 3 and len(runs) == 2 and "__ticktable_narrow" in runs[-1]
    _check(registry, r, "SELECT * FROM t WHERE id + 0 > 5 ORDER BY id")  # past the cap
    assert r.narrow_passes["gave_up"] == 1 and r.narrow_passes["numpy"] == 4


def test_an_overflow_is_duckdb_s_to_raise(runner):
    graph, registry, r, rng = runner
    big = registry.create_source("huge", pa.schema([("v", pa.int64()), ("w", pa.int64())]),
                                 "append").table
    big.append(pa.table({"v": np.array([2**63 - 1, 5] * 100, np.int64),
                         "w": np.arange(200, dtype=np.int64)}))
    graph.run_cycle()
    with pytest.raises(Exception, match="(?i)overflow"):  # as over the whole table
        _run(r, "SELECT * FROM huge WHERE v + 1 IN (6, 7)")
    # DuckDB moves the literal across a comparison (v = 5): no error, and its answer
    _check(registry, r, "SELECT * FROM huge WHERE v + 1 = 6")
    assert r.narrow_passes["numpy"] == 0
    _check(registry, r, "SELECT * FROM huge WHERE v - 1 = 4")  # no overflow: numpy's
    assert r.narrow_passes["numpy"] == 1


def test_the_numpy_pass_leaves_a_chunk_of_another_type_or_a_failure_to_duckdb(runner, monkeypatch):
    graph, registry, r, _ = runner
    tree = parse_one("SELECT * FROM w WHERE s = 's1' AND big + 1 > 3 AND d IS NULL")
    terms = narrow.terms(tree.args["where"].this, {"w"}, TRICKY)
    assert terms is not None
    rows = pa.table({"s": pa.array(["s1", "s2"]).dictionary_encode(), "big": [1, 5],
                     "d": [None, 1.0]})
    assert narrow.scan(rows, terms, 10) is None  # a dictionary where the schema said string
    rows = rows.set_column(0, "s", pa.array(["s1", "s2"]))
    assert narrow.scan(rows, terms, 10).tolist() == []  # d is null in row 0, big + 1 > 3 in 1
    assert narrow.scan(rows.set_column(1, "big", pa.array([3, 5], pa.int32())), terms, 10) is None
    assert narrow.scan(rows.set_column(1, "big", pa.array([3.0, 5.0])), terms, 10) is None
    floats = narrow.terms(parse_one("SELECT * FROM w WHERE d > 2").args["where"].this, {"w"}, TRICKY)
    assert floats is not None and narrow.scan(pa.table({"d": [1, 3]}), floats, 10) is None

    def failing(term, values):
        raise pa.ArrowInvalid("no")

    monkeypatch.setattr(narrow, "_mask", failing)
    _check(registry, r, "SELECT * FROM t WHERE id + 0 = 17")  # DuckDB's pass answers
    assert r.narrow_passes["numpy"] == 0 and r.narrow_passes["kept"] == 1
