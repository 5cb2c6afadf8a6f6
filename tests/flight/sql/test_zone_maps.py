"""A query over an append table scans only the blocks whose zone maps meet its ``WHERE``'s
ranges (flight.sql.query.value_ranges, SnapshotCache.prune): its answer equals DuckDB's
over the whole table for every shape, hit or miss, as the table grows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine.graph import UpdateGraph
from flight.sql.parse import parse_one
from flight.sql.query import QueryRunner, named_tables, value_ranges
from flight.sql.snapshots import SnapshotCache
from flight.streams.registry import TableRegistry
from tests.flight.sql.sqlcheck import check_query

A = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("small", pa.int8()), ("u", pa.uint64()),
               ("x", pa.float64()), ("s", pa.string())])
BLOCK = 16


def _rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    g = rng.integers(-40, 40, n)
    return pa.table({
        "id": np.arange(start, start + n),  # grows with the table: blocks prune
        "g": pa.array(g, mask=rng.random(n) < 0.1),  # random with nulls: few blocks prune
        "small": pa.array(rng.integers(-128, 128, n).astype(np.int8)),
        "u": pa.array((np.arange(start, start + n) * 3).astype(np.uint64)),
        "x": rng.random(n),
        "s": [f"s{i % 7}" for i in range(start, start + n)],
    }, schema=A)


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(SnapshotCache, "BLOCK", BLOCK)
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    rng = np.random.default_rng(17)
    t = registry.create_source("t", A, "append").table
    t.append(_rows(rng, 0, 300))
    # a block of nulls only in g
    t.append(pa.table({**{c: _rows(rng, 300, BLOCK).column(c) for c in A.names if c != "g"},
                       "g": pa.nulls(BLOCK, pa.int64())}, schema=A))
    t.append(_rows(rng, 300 + BLOCK, 500))
    k = registry.create_source("k", A, "keyed", keys=["id"]).table
    k.upsert(_rows(rng, 0, 100))
    graph.run_cycle()
    r = QueryRunner(registry, timeout=30.0)
    yield graph, registry, r, rng
    r.shutdown()


def _run(r: QueryRunner, sql: str, params: list | None = None) -> pa.Table:
    q = r.start(sql, params)
    return pa.Table.from_batches(list(r.batches(q)), q.schema)


def _scanned(r: QueryRunner, sql: str, params: list | None = None) -> int:
    """Rows of ``t`` the query's snapshot held (what DuckDB was given to scan)."""
    seen: list[int] = []
    prune = r.snapshots.prune

    def spy(*args, **kwargs):
        out = prune(*args, **kwargs)
        seen.append(out.num_rows)
        return out

    r.snapshots.prune = spy  # type: ignore[method-assign]
    try:
        _run(r, sql, params)
    finally:
        del r.snapshots.prune
    return seen[0] if seen else -1


_check = check_query


PRUNED = [  # (query, at most this many rows scanned of the 816)
    ("SELECT * FROM t WHERE id = 7", 2 * BLOCK),
    ("SELECT * FROM t WHERE 700 = id", 2 * BLOCK),
    ("SELECT * FROM t WHERE id = 15", 2 * BLOCK),  # a block's last row
    ("SELECT * FROM t WHERE id = 16", 2 * BLOCK),  # the next block's first row
    ("SELECT * FROM t WHERE id = -1", BLOCK),  # below every block: the partial one only
    ("SELECT * FROM t WHERE id = 100000", BLOCK),
    ("SELECT * FROM t WHERE id IN (3, 500, 501)", 4 * BLOCK),
    ("SELECT * FROM t WHERE id BETWEEN 40 AND 70", 4 * BLOCK),
    ("SELECT * FROM t WHERE id >= 40 AND id < 70 AND x > 0.5", 4 * BLOCK),
    ("SELECT * FROM t WHERE id > 780", 3 * BLOCK),
    ("SELECT * FROM t WHERE id < 20", 3 * BLOCK),
    ("SELECT * FROM t WHERE -5 < id AND 10 >= id", 2 * BLOCK),
    ("SELECT count(*), sum(x) FROM t WHERE id BETWEEN 100 AND 140", 5 * BLOCK),
    ("SELECT g, count(*) FROM t WHERE id < 64 GROUP BY g ORDER BY g NULLS FIRST", 5 * BLOCK),
    ("SELECT id, row_number() OVER (ORDER BY id DESC) FROM t WHERE id IN (8, 9) ORDER BY id",
     2 * BLOCK),
    ("SELECT * FROM t WHERE id > 100 AND id < 50", BLOCK),  # nothing can match
    ("SELECT * FROM t WHERE u = 300", 2 * BLOCK),  # unsigned
    ("SELECT * FROM t WHERE u = 301", 2 * BLOCK),
    ("SELECT * FROM t AS q WHERE q.id = 33 AND s LIKE 's%'", 2 * BLOCK),
    ("SELECT * FROM t WHERE id = 8 AND id = 9", BLOCK),
]

SCANNED = [  # no range: the whole table
    "SELECT * FROM t WHERE id = 7 OR id = 8",
    "SELECT * FROM t WHERE x < 0.1",  # not an integer column
    "SELECT * FROM t WHERE id = '7'",  # DuckDB casts the text
    "SELECT * FROM t WHERE id = 7.5",
    "SELECT * FROM t WHERE id + 1 = 8",
    "SELECT * FROM t WHERE NOT id = 7",
    "SELECT * FROM t WHERE id = 7 AND x = (SELECT max(x) FROM t)",  # t read twice
    "SELECT * FROM (SELECT id + 1 AS id, x FROM t) WHERE id = 7",
    "SELECT * FROM t JOIN k ON t.g = k.g WHERE t.id = 7",
    "SELECT * FROM k WHERE id < 7",  # keyed: rows change in place
    "SELECT * FROM t WHERE id IN (SELECT id FROM k)",
]

ANSWERED = [  # pruned or not: every answer is the scan's
    "SELECT * FROM t WHERE g = 3",
    "SELECT * FROM t WHERE g BETWEEN -2 AND 2 ORDER BY id",
    "SELECT * FROM t WHERE g < -39",
    "SELECT * FROM t WHERE small = -128",
    "SELECT * FROM t WHERE small = 1000",  # outside int8: DuckDB's comparison, no match
    "SELECT * FROM t WHERE small > -1000 AND small < 1000 ORDER BY id",
    "SELECT * FROM t WHERE u < 0",
    "SELECT * FROM t WHERE id = 9223372036854775807",
    "SELECT * FROM t WHERE id >= -9223372036854775808 AND id < 3",
    "SELECT * FROM t WHERE g IS NULL AND id < 400",
    "SELECT * FROM t WHERE g = 5 AND id > 200 ORDER BY id DESC LIMIT 3",
]


@pytest.mark.parametrize("sql, most", PRUNED)
def test_ranges_of_an_append_table_scan_few_blocks_and_answer_as_the_scan(runner, sql, most):
    graph, registry, r, _ = runner
    tree = parse_one(sql)
    assert value_ranges(tree, named_tables(tree, registry, "query")) is not None
    assert _scanned(r, sql) <= most
    _check(registry, r, sql)


@pytest.mark.parametrize("sql", SCANNED)
def test_other_shapes_have_no_ranges(runner, sql):
    graph, registry, r, _ = runner
    tree = parse_one(sql)
    assert value_ranges(tree, named_tables(tree, registry, "query")) is None
    _check(registry, r, sql)


@pytest.mark.parametrize("sql", ANSWERED)
def test_any_column_answers_as_the_scan(runner, sql):
    graph, registry, r, _ = runner
    _check(registry, r, sql)


@pytest.mark.parametrize("sql, params, ranged", [
    ("SELECT * FROM t WHERE id = ?", [42], True),
    ("SELECT * FROM t WHERE id > ?", [800], True),
    ("SELECT * FROM t WHERE id = ?", ["42"], False),
    ("SELECT * FROM t WHERE id = ? AND g > ?", [42, 1], False),
])
def test_the_one_parameter_bounds_a_column(runner, sql, params, ranged):
    graph, registry, r, _ = runner
    tree = parse_one(sql)
    assert (value_ranges(tree, named_tables(tree, registry, "query"), params) is not None) == ranged
    _check(registry, r, sql, params)


def test_zone_maps_follow_the_table_as_it_grows_and_is_replaced(runner):
    graph, registry, r, rng = runner
    t = registry.get("t").table
    size = t.size
    for step in range(60):
        n = int(rng.integers(0, 3 * BLOCK))
        t.append(_rows(rng, size, n))
        size += n
        graph.run_cycle()
        for _ in range(3):
            lo = int(rng.integers(-5, size + 5))
            hi = lo + int(rng.integers(0, 2 * BLOCK))
            g = int(rng.integers(-40, 40))
            for sql in (f"SELECT * FROM t WHERE id = {lo}",
                        f"SELECT * FROM t WHERE id BETWEEN {lo} AND {hi} ORDER BY id",
                        f"SELECT count(*) FROM t WHERE id >= {lo} AND g = {g}",
                        f"SELECT * FROM t WHERE g >= {g} AND g <= {g + 1} ORDER BY id"):
                _check(registry, r, sql)
        if step == 30:  # the same name, another table: its zone maps start over
            registry.drop("t")
            r.snapshots.forget("t")
            t = registry.create_source("t", A, "append").table
            t.append(_rows(rng, 5000, 100))  # other ids under the same name
            size = 100
            graph.run_cycle()
            _check(registry, r, "SELECT * FROM t WHERE id = 5003")
            assert _run(r, "SELECT id FROM t WHERE id = 3").num_rows == 0
