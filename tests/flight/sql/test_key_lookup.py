"""A query that looks rows up by a keyed table's key reads them through the key index
(flight.sql.query.key_points): its answer equals DuckDB's over the whole table for every
shape, hit or miss, and the table is never copied for it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.graph import UpdateGraph
from flight.sql.parse import parse_one
from flight.sql.query import QueryRunner, key_points, named_tables
from flight.streams.registry import TableRegistry
from tests.flight.sql.sqlcheck import duck_answer, mismatch

T = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
C = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.int64())])


@pytest.fixture
def runner():
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    rng = np.random.default_rng(5)
    n = 2_000
    t = registry.create_source("t", T, "keyed", keys=["id"]).table
    t.upsert(pa.table({"id": np.arange(-50, n - 50), "g": rng.integers(0, 20, n),
                       "x": rng.random(n), "s": [f"s{i % 97}" for i in range(n)]}, schema=T))
    c = registry.create_source("c", C, "keyed", keys=["a", "b"]).table
    c.upsert(pa.table({"a": [f"k{i % 10}" for i in range(100)], "b": np.arange(100) // 10,
                       "v": np.arange(100)}, schema=C))
    a = registry.create_source("appended", T, "append").table
    a.append(pa.table({"id": [1, 2], "g": [1, 1], "x": [0.5, 0.25], "s": ["p", "q"]}, schema=T))
    graph.run_cycle()
    r = QueryRunner(registry, timeout=30.0)
    yield graph, registry, r
    r.shutdown()


def _run(r: QueryRunner, sql: str) -> pa.Table:
    q = r.start(sql)
    return pa.Table.from_batches(list(r.batches(q)), q.schema)


def _full(registry: TableRegistry, sql: str) -> pa.Table:
    """DuckDB's answer over whole copies of every table: what the scan answers."""
    return duck_answer(sql, {n: registry.get(n).table.to_arrow() for n in registry.names()})


LOOKUPS = [
    "SELECT * FROM t WHERE id = 7",
    "SELECT * FROM t WHERE id = -3",
    "SELECT * FROM t WHERE 7 = id",
    "SELECT * FROM t WHERE id = 999999",  # a miss
    "SELECT s, x * 2 AS y FROM t WHERE t.id = 12",
    "SELECT * FROM t AS q WHERE q.id IN (1, 5, 5, 1949, 123456)",
    "SELECT * FROM t WHERE id = 7 AND x > 2",  # the rest of WHERE still applies
    "SELECT * FROM t WHERE id IN (3, 4) AND g >= 0 AND s LIKE 's%'",
    "SELECT count(*), sum(x) FROM t WHERE id IN (1, 2, 3)",
    "SELECT g, count(*) FROM t WHERE id IN (1, 2, 3, 40) GROUP BY g ORDER BY g",
    "SELECT id, row_number() OVER (ORDER BY id DESC) FROM t WHERE id IN (8, 9, 10) ORDER BY id",
    "SELECT * FROM t WHERE id IN (8, 9, 10) ORDER BY id DESC LIMIT 2",
    "SELECT *, (SELECT 1) AS one FROM t WHERE id = 8",
    "SELECT * FROM c WHERE a = 'k3' AND b = 0",
    "SELECT v FROM c WHERE b = 9 AND a = 'k9' AND v > 0",
    "SELECT v FROM c WHERE a = 'nope' AND b = 1",
]

SCANS = [
    "SELECT * FROM t WHERE id = 7 OR id = 8",  # OR: not every row pinned
    "SELECT * FROM t WHERE g = 3",  # not the key
    "SELECT * FROM t WHERE id = '7'",  # DuckDB casts the text: the scan decides
    "SELECT * FROM t WHERE id = 7.5",
    "SELECT * FROM t WHERE id > 7 AND id < 9",
    "SELECT * FROM t WHERE id = 7 AND x = (SELECT max(x) FROM t)",  # t read twice
    "SELECT * FROM (SELECT id + 1 AS id, x FROM t) WHERE id = 7",  # not t's id
    "SELECT x AS id FROM t WHERE id = 7",  # an output named like the key
    "SELECT * FROM t JOIN c ON t.g = c.v WHERE t.id = 7",
    "SELECT * FROM t WHERE id = 7 UNION ALL SELECT * FROM t WHERE id = 8",
    "SELECT * FROM c WHERE a = 'k3'",  # half a composite key
    "SELECT * FROM c WHERE a IN ('k3', 'k4') AND b = 0",
    "SELECT * FROM appended WHERE id = 1",  # no key index
    "SELECT * FROM t WHERE id = 9223372036854775808",  # past int64: the scan's error or rows
]


@pytest.mark.parametrize("sql", LOOKUPS)
def test_a_lookup_by_key_answers_what_the_scan_answers_without_copying(runner, sql):
    graph, registry, r = runner
    tree = parse_one(sql)
    assert key_points(tree, named_tables(tree, registry, "query")) is not None
    got = _run(r, sql)
    assert r.snapshots.kept_bytes() == 0  # no copy of the table was taken
    expected = _full(registry, sql)
    assert got.num_rows == expected.num_rows
    if "ORDER BY" in sql:
        assert got.to_pylist() == expected.to_pylist()
    else:
        assert mismatch(got, expected) is None


#: the shapes whose answer is the rows of their keys, as found (DuckDB does not run)
BY_KEYS = {"SELECT * FROM t WHERE id = 7", "SELECT * FROM t WHERE id = -3",
           "SELECT * FROM t WHERE 7 = id", "SELECT * FROM t WHERE id = 999999",
           "SELECT * FROM t AS q WHERE q.id IN (1, 5, 5, 1949, 123456)",
           "SELECT * FROM c WHERE a = 'k3' AND b = 0", "SELECT v FROM c WHERE a = 'nope' AND b = 1"}


@pytest.mark.parametrize(("sql", "params"), [(s, None) for s in LOOKUPS] + [
    ("SELECT * FROM t WHERE id = ?", [42]), ("SELECT q.* FROM t AS q WHERE q.id = ?", [-50]),
    ("SELECT * FROM c WHERE b = ? AND a = 'k4'", [0]),
    ("SELECT S, x AS price, q.g, id FROM t AS q WHERE q.id = ?", [7]),
    ("SELECT v, v, a AS \"B\" FROM c WHERE b = ? AND a = 'k4'", [0])])
def test_select_star_of_pinned_keys_is_the_rows_found_in_duckdbs_types(runner, monkeypatch, sql,
                                                                       params):
    """``SELECT * FROM t WHERE <key> = v [AND ...]`` (or ``SELECT`` of its columns), every
    term a key's pin and nothing more, answers the rows the key index found, in the schema
    and names DuckDB gives (no DuckDB query:
    its parse, bind and run were ~1.4 ms of a 3 ms GetFlightInfo); any other shape still
    runs in DuckDB. Both equal DuckDB's answer over the whole table, names and types too."""
    from flight.sql import query as _query

    graph, registry, r = runner
    runs: list[str] = []
    real = _query._stream
    list(r.batches(r.start(sql, params)))  # a text's schema is bound once (DuckDB, no rows)
    monkeypatch.setattr(_query, "_stream", lambda cursor, text, *a: runs.append(text)
                        or real(cursor, text, *a))
    got = pa.Table.from_batches(list(r.batches(q := r.start(sql, params))), q.schema)
    expected = duck_answer(sql, {n: registry.get(n).table.to_arrow() for n in registry.names()},
                           params)
    assert (runs == []) == (sql in BY_KEYS or params is not None), runs
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in expected.schema]
    if "ORDER BY" in sql:
        assert got.to_pylist() == expected.to_pylist()
    else:
        assert mismatch(got, expected) is None


@pytest.mark.parametrize("sql", SCANS)
def test_other_shapes_scan_the_table(runner, sql):
    graph, registry, r = runner
    tree = parse_one(sql)
    assert key_points(tree, named_tables(tree, registry, "query")) is None


@pytest.mark.parametrize("sql, params, pinned", [
    ("SELECT * FROM t WHERE id = ?", [42], True),
    ("SELECT * FROM t WHERE id = ?", [-50], True),
    ("SELECT * FROM t WHERE id = ?", [10**12], True),  # a miss
    ("SELECT * FROM c WHERE a = 'k4' AND b = ?", [0], True),
    ("SELECT * FROM t WHERE id = ?", ["42"], False),  # DuckDB casts the text
    ("SELECT * FROM t WHERE id = ?", [True], False),
    ("SELECT * FROM t WHERE id = ? AND g > ?", [42, 1], False),  # which ? is which: the scan
    ("SELECT * FROM t WHERE id = $1", [42], False),
])
def test_a_lookup_by_the_one_parameter(runner, sql, params, pinned):
    graph, registry, r = runner
    tree = parse_one(sql)
    assert (key_points(tree, named_tables(tree, registry, "query"), params) is not None) == pinned
    q = r.start(sql, params)
    got = pa.Table.from_batches(list(r.batches(q)), q.schema)
    expected = duck_answer(sql, {n: registry.get(n).table.to_arrow() for n in registry.names()}, params)
    assert got.num_rows == expected.num_rows and mismatch(got, expected) is None


def test_a_lookup_sees_the_step_it_reports_while_the_table_changes(runner):
    graph, registry, r = runner
    t = registry.get("t").table
    for i in range(30):
        t.upsert(pa.table({"id": [7], "g": [i], "x": [float(i)], "s": ["v"]}, schema=T))
        if i % 3:
            t.delete(pa.table({"id": [8]}))
        else:
            t.upsert(pa.table({"id": [8], "g": [i], "x": [0.0], "s": ["w"]}, schema=T))
        graph.run_cycle()
        q = r.start("SELECT id, g FROM t WHERE id IN (7, 8) ORDER BY id")
        got = pa.Table.from_batches(list(r.batches(q)), q.schema).to_pylist()
        assert q.step == graph.step
        assert got == ([{"id": 7, "g": i}] + ([] if i % 3 else [{"id": 8, "g": i}]))


def test_a_prepared_texts_schema_is_bound_once_per_tables_schemas(runner, monkeypatch):
    # a DB-API cursor prepares every text it runs: the schema is remembered per text,
    # parameter count and named tables' schemas, and bound again when a table is made
    # again with other columns; a parameter with a value is always bound (its type counts)
    graph, registry, r = runner
    binds: list[str] = []
    real = QueryRunner._bound_schema

    def counted(self, sql, *args):
        binds.append(sql)
        return real(self, sql, *args)

    monkeypatch.setattr(QueryRunner, "_bound_schema", counted)
    sql = "SELECT s, x * 2 AS y FROM appended WHERE id > ?"
    first = r.schema_of(sql, [None], parse_one(sql))
    assert r.schema_of(sql, [None], parse_one(sql)).equals(first) and len(binds) == 1
    assert first.names == ["s", "y"] and first.field("y").type == pa.float64()
    other = "SELECT s, x * 2 AS y FROM appended"  # another text
    assert r.schema_of(other, None, parse_one(other)).equals(first) and len(binds) == 2
    assert r.schema_of("SELECT ? AS v", [1], parse_one("SELECT ? AS v")).field("v").type == pa.int32()
    assert r.schema_of("SELECT ? AS v", [1 << 40], parse_one("SELECT ? AS v")).field("v").type == pa.int64()
    assert len(binds) == 4
    registry.drop("appended")
    registry.create_source("appended", pa.schema([("id", pa.int64()), ("s", pa.int32()), ("x", pa.int64())]),
                           "append")
    again = r.schema_of(sql, [None], parse_one(sql))
    assert len(binds) == 5 and again.field("s").type == pa.int32() and again.field("y").type == pa.int64()
    with pytest.raises(Exception, match="x2"):  # a failure is not remembered: it fails again
        r.schema_of("SELECT x2 FROM appended", None, parse_one("SELECT x2 FROM appended"))
    with pytest.raises(Exception, match="x2"):
        r.schema_of("SELECT x2 FROM appended", None, parse_one("SELECT x2 FROM appended"))
