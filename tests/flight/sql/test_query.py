"""flight.sql.query's kept cursors and results read whole at start: a kept cursor never
serves a stale snapshot, never serves two queries at once, and is never interrupted for a
query that has ended."""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from engine.errors import QueryCancelled, QueryTimeout, TableNotFound
from engine.graph import UpdateGraph
from flight.sql.parse import parse_one
from flight.sql.query import QueryRunner
from flight.streams.registry import TableRegistry

A = pa.schema([("id", pa.int64()), ("x", pa.float64())])


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": np.arange(start, start + n), "x": np.arange(start, start + n) * 0.5},
                    schema=A)


@pytest.fixture
def served():
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    t = registry.create_source("t", A, "append").table
    t.append(_rows(0, 100))
    graph.run_cycle()
    r = QueryRunner(registry, timeout=30.0, batch_rows=16)  # 16-row batches: 100 rows are 7
    yield graph, registry, t, r
    r.shutdown()


def _run(r: QueryRunner, sql: str) -> pa.Table:
    q = r.start(sql)
    return pa.Table.from_batches(list(r.batches(q)), q.schema)


def _idle_names(r: QueryRunner) -> list[dict[str, object]]:
    return [{k: src.rows for k, src in c.names.items()} for c in r._idle]


def test_a_kept_cursor_sees_the_rows_of_each_cycle(served):
    graph, _, t, r = served
    assert _run(r, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [100]
    assert len(r._idle) == 1
    kept = r._idle[0]
    for cycle in range(1, 6):  # each query after a cycle sees that cycle's rows
        t.append(_rows(100 * cycle, 100))
        graph.run_cycle()
        got = _run(r, "SELECT count(*) AS n, max(id) AS top FROM t")
        assert got.to_pylist() == [{"n": 100 * (cycle + 1), "top": 100 * (cycle + 1) - 1}]
        assert r._idle == [kept]  # the same cursor, its name registered once
    assert _idle_names(r) == [{"t": None}]  # an idle cursor holds no snapshot


def test_concurrent_queries_each_have_their_own_cursor(served):
    _, _, _, r = served
    # results of 7 batches: not read whole at start, so each holds its cursor while read
    a = r.start("SELECT id FROM t ORDER BY id")
    b = r.start("SELECT id FROM t WHERE id % 2 = 0 ORDER BY id")
    assert a.cursor is not None and b.cursor is not None and a.cursor is not b.cursor
    got_a, got_b = [], []
    for x, y in itertools.zip_longest(r.batches(a), r.batches(b)):  # interleaved
        got_a += [x] if x is not None else []
        got_b += [y] if y is not None else []
    assert pa.Table.from_batches(got_a).column("id").to_pylist() == list(range(100))
    assert pa.Table.from_batches(got_b).column("id").to_pylist() == list(range(0, 100, 2))
    assert len(r._idle) == 2


def test_queries_on_threads_agree_with_their_snapshot(served):
    graph, _, t, r = served
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        try:
            for i in range(30):
                q = r.start(f"SELECT count(*) AS n, sum(id) AS s FROM t WHERE id >= {seed + i}")
                got = pa.Table.from_batches(list(r.batches(q))).to_pylist()[0]
                rows = 100 * q.step  # the rows at the query's step: 100 per cycle
                lo = seed + i
                assert got["n"] == rows - lo
                assert got["s"] == sum(range(lo, rows))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in (0, 7, 13)]
    for th in threads:
        th.start()
    for c in range(2, 12):  # cycles while they read: each cycle adds 100 rows
        t.append(_rows(100 * (c - 1), 100))
        graph.run_cycle()
    for th in threads:
        th.join(60)
    assert not errors, errors[0]
    assert len(r._idle) <= r.CURSORS_KEPT


def test_a_table_made_again_with_other_columns_is_read_in_its_new_columns(served):
    graph, registry, _, r = served
    assert _run(r, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [100]
    registry.drop("t")
    t = registry.create_source("t", pa.schema([("name", pa.string())]), "append").table
    t.append(pa.table({"name": ["a", "b"]}))
    graph.run_cycle()
    assert _run(r, "SELECT * FROM t ORDER BY name").to_pylist() == [{"name": "a"}, {"name": "b"}]
    assert len(r._idle) == 1


def test_a_cancelled_query_s_cursor_is_closed_not_kept(served):
    _, _, _, r = served
    q = r.start("SELECT id FROM t")  # 7 batches: still reading
    assert q.reader is not None
    read = r.batches(q)
    next(read)
    assert r.cancel(q.handle)
    with pytest.raises(QueryCancelled):
        list(read)
    assert r._idle == []  # interrupted: never given to another query
    assert _run(r, "SELECT count(*) AS n FROM t").column("n").to_pylist() == [100]


def test_a_result_read_whole_at_start_frees_its_cursor_and_still_answers_a_cancel(served):
    _, _, _, r = served
    q = r.start("SELECT count(*) AS n FROM t")
    assert q.reader is None and q.cursor is None and len(q.ready) == 1  # read whole
    assert len(r._idle) == 1
    # another query runs on the freed cursor while the first result waits for its DoGet
    assert _run(r, "SELECT max(id) AS m FROM t").column("m").to_pylist() == [99]
    assert r.cancel(q.handle)  # it still stops the first result from being sent ...
    with pytest.raises(QueryCancelled):
        list(r.batches(q))
    b = r.start("SELECT id FROM t WHERE id < 3")  # ... and interrupts nothing that runs now
    assert pa.Table.from_batches(list(r.batches(b))).column("id").to_pylist() == [0, 1, 2]
    assert not r.cancel(q.handle)  # ended: nothing to cancel


def test_an_empty_result_read_whole_at_start_is_one_batch_of_no_rows(served):
    _, _, _, r = served
    q = r.start("SELECT id, x FROM t WHERE id < 0")
    assert q.reader is None
    batches = list(r.batches(q))
    assert len(batches) == 1 and batches[0].num_rows == 0
    assert batches[0].schema.names == ["id", "x"]


def test_a_duckdb_without_submit_runs_the_query_as_a_relation(served):
    """``_stream`` runs a text once through the connection's ``_submit``; a connection
    without it (another DuckDB) gives the same batches through its relation."""
    from flight.sql.query import _stream

    _graph, _registry, t, r = served
    con = r._db.cursor()
    try:
        con.register("t", t.to_arrow())

        class Relational:
            """The cursor without its ``_submit``."""

            def sql(self, text, params=None):
                return con.sql(text, params=params)

        text = "SELECT id, x * 2 AS y FROM t WHERE id % 7 = ? ORDER BY id"
        got = _stream(con, text, [3], 16).read_all()
        via = _stream(Relational(), text, [3], 16).read_all()
        assert got.equals(via)
        assert got.column("id").to_pylist() == list(range(3, 100, 7))
        with pytest.raises(duckdb.Error):  # one statement: sql() would run all but the last
            _stream(con, "SELECT 1; SELECT 2", None, 16)
    finally:
        con.close()


def test_the_reaper_leaves_a_query_that_is_starting_to_its_thread():
    """A query that outlives the timeout while its start is inside DuckDB is interrupted
    by the reaper and closed by the thread that started it: closing a DuckDB connection
    while another thread runs a query on it corrupts the heap (next test)."""
    graph = UpdateGraph()
    registry = TableRegistry(graph)
    big = registry.create_source("big", pa.schema([("a", pa.int64())]), "append").table
    big.append(pa.table({"a": np.arange(1_000_000)}))
    graph.run_cycle()
    r = QueryRunner(registry, timeout=0.05)
    closed_on: list[str] = []
    close_cursor = QueryRunner._close_cursor

    def recording(cursor: duckdb.DuckDBPyConnection) -> None:
        closed_on.append(threading.current_thread().name)
        close_cursor(cursor)

    r._close_cursor = recording  # type: ignore[method-assign]
    try:
        for _ in range(3):
            with pytest.raises(QueryTimeout):
                r.start("SELECT count(*) FROM big x, big y WHERE x.a + y.a = 7")
        assert closed_on == [threading.current_thread().name] * 3
        assert r.running() == 0
        # a result that waits for a DoGet past the timeout is dropped by the reaper; its start
        # must end within the timeout, which 0.05 s did not on a loaded machine (one CI run)
        r.timeout = 1.0
        q = r.start("SELECT a FROM big")  # 16 batches: its cursor is still reading
        assert q.cursor is not None
        deadline = time.monotonic() + 10
        # the reaper takes the query out of the running ones, then closes its reader (DuckDB
        # may take a while with an interrupted stream), then its cursor
        while (r.running() or len(closed_on) < 4) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.running() == 0 and closed_on[3:] == ["ticktable-sql-reaper"]
        with pytest.raises(TableNotFound):
            r.get(q.handle)
    finally:
        r.shutdown()


#: what the stress scripts below share: a process with a 200,000-row table ``big``
_PRELUDE = """
import faulthandler, random, sys, threading, time
faulthandler.enable()
import numpy as np, pyarrow as pa
from engine.errors import QueryCancelled, QueryTimeout, TableNotFound
from engine.graph import UpdateGraph
from flight.sql.query import QueryRunner
from flight.streams.registry import TableRegistry
graph = UpdateGraph()
registry = TableRegistry(graph)
big = registry.create_source("big", pa.schema([("a", pa.int64())]), "append").table
big.append(pa.table({"a": np.arange(200_000)}))
graph.run_cycle()
"""


def _stress(script: str, seconds: float, enough: int) -> dict[str, int]:
    """Run ``script`` after :data:`_PRELUDE` in a process of its own (a heap corruption
    aborts it, not the test's worker) for ``seconds``, and on, up to 60 s, until each
    outcome it counts was seen ``enough`` times (a loaded machine runs fewer queries a
    second); the outcomes it counted and printed."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", _PRELUDE + _UNTIL + script, str(seconds),
                           str(enough)], cwd=root, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


_UNTIL = """
start = time.monotonic()
def going(seen, kinds):
    # at least argv[1] seconds; then until every kind was seen argv[2] times (60 s at most)
    spent = time.monotonic() - start
    if spent < float(sys.argv[1]):
        return True
    return spent < 60 and any(seen.get(k, 0) <= int(sys.argv[2]) for k in kinds)
"""

_STRESS = """
r = QueryRunner(registry, timeout=0.02)
stop = threading.Event()
def churn():  # the GIL changes hands as among a server's threads
    while not stop.is_set():
        sum(range(1000))
threading.Thread(target=churn, daemon=True).start()
rng = random.Random(7)
seen = {}
while going(seen, ("ok", "QueryTimeout")):
    # the last: a query that ends (beside the churn, each read waits for the GIL: a
    # 1.5M-row answer took 70-240 ms on a slow day, past every shorter timeout)
    r.timeout = rng.choice([0.005, 0.01, 0.02, 0.04, 0.5])
    n = rng.randint(100, 30_000)
    try:  # as the server does: start (GetFlightInfo), then get and read (DoGet)
        q = r.start(f"SELECT x.a, y.a FROM big x, big y WHERE x.a < {n} AND y.a < 50 "
                    "AND x.a + y.a > 7")
        rows = sum(b.num_rows for b in r.batches(r.get(q.handle)))
        kind = "ok"
    except (QueryTimeout, TableNotFound) as exc:
        kind = type(exc).__name__
    seen[kind] = seen.get(kind, 0) + 1
stop.set()
r.shutdown()
print(sorted(seen.items()))
"""


def test_queries_stopped_by_the_timeout_at_any_moment_never_corrupt_the_process():
    """Queries whose timeouts fall at random moments of their start and reads, beside a
    thread that takes the GIL: the process ends cleanly. Before the reaper left a starting
    query to its thread, this aborted within seconds in half the runs ("malloc(): mismatching
    next->prev_size"), and a heap corrupted that way can also hang the process."""
    seen = _stress(_STRESS, 5, 10)
    assert seen.get("ok", 0) > 10 and seen.get("QueryTimeout", 0) > 10, seen


_SHUTDOWN = """
rng = random.Random(3)
seen = {}
def run(r, n):
    for _ in range(3):
        try:
            q = r.start(f"SELECT x.a, y.a FROM big x, big y WHERE x.a < {n} AND y.a < 50 "
                        "AND x.a + y.a > 7")
            sum(b.num_rows for b in r.batches(r.get(q.handle)))
            kind = "ok"
        except QueryCancelled:
            kind = "cancelled"
        seen[kind] = seen.get(kind, 0) + 1
while going(seen, ("ok", "cancelled")):
    r = QueryRunner(registry, timeout=30)
    threads = [threading.Thread(target=run, args=(r, rng.randint(100, 20_000))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(rng.random() * 0.02)
    r.shutdown()  # raises nothing, whatever the queries are doing
    for t in threads:
        t.join()
print(sorted(seen.items()))
"""


def test_a_shutdown_while_queries_run_interrupts_them_and_closes_the_database():
    """Runners shut down at random moments of two threads' queries: every query ends (read
    whole, or cancelled), and the database is closed only once no thread is inside DuckDB.
    Before, closing it under a running query raised DuckDB's "connection is busy" out of
    the server's shutdown (before the journal was closed)."""
    seen = _stress(_SHUTDOWN, 3, 5)
    assert seen.get("ok", 0) > 5 and seen.get("cancelled", 0) > 5, seen


def test_a_query_after_shutdown_is_refused(served):
    _, _, _, r = served
    r.shutdown()
    with pytest.raises(QueryCancelled, match="shutting down"):
        r.start("SELECT count(*) FROM t")


def test_texts_differing_in_untyped_literals_share_one_prepared_schema(served, monkeypatch):
    """A DB-API cursor prepares each new text: a point lookup with a new literal in its
    WHERE binds once per shape, a literal that can type the result keeps its text's own."""
    graph, registry, _, r = served
    binds: list[str] = []
    bound = r._bound_schema

    def counting(sql, *args):
        binds.append(sql)
        return bound(sql, *args)

    monkeypatch.setattr(r, "_bound_schema", counting)
    for i in range(5):
        sql = f"SELECT * FROM t WHERE id + 0 = {i} ORDER BY id LIMIT {i + 1}"
        assert r.schema_of(sql, None, parse_one(sql)) == _run(r, sql).schema.remove_metadata()
    assert len(binds) == 1
    for text in ("SELECT 1 AS v FROM t", "SELECT 10000000000 AS v FROM t"):  # INTEGER, BIGINT
        r.schema_of(text, None, parse_one(text))
    assert len(binds) == 3
    assert r.schema_of("SELECT 10000000000 AS v FROM t", None,
                       parse_one("SELECT 10000000000 AS v FROM t")).field("v").type == pa.int64()
    assert r.schema_of("SELECT 1 AS v FROM t", None,
                       parse_one("SELECT 1 AS v FROM t")).field("v").type == pa.int32()


def test_the_reaper_outlives_a_failure_while_stopping_a_query(served, caplog):
    """An unexpected error while stopping one late query is logged, and the reaper goes on
    stopping the others (a reaper thread that died would leave every query untimed)."""
    graph, registry, _, r = served
    r.timeout = 0.05
    interrupt = r._interrupt
    failed: list[bytes] = []

    def failing_once(query, why):
        if not failed:
            failed.append(query.handle)
            raise RuntimeError("a failure while stopping a query")
        interrupt(query, why)

    r._interrupt = failing_once  # type: ignore[method-assign]
    big = registry.create_source("big", pa.schema([("a", pa.int64())]), "append").table
    big.append(pa.table({"a": np.arange(200_000)}))
    graph.run_cycle()
    with caplog.at_level("ERROR", logger="flight.sql.query"):
        with pytest.raises(QueryTimeout):  # the second round of the reaper stops it
            r.start("SELECT count(*) FROM big x, big y WHERE x.a + y.a = 7")
    assert failed and "SQL reaper: stopping query" in caplog.text
    assert r._reaper.is_alive()



def test_parameter_rows_are_read_by_place_whatever_their_names():
    """A bound batch's columns are parameters by place: two of one name stay two (rows as
    dicts kept one of them), and a batch of rows without columns binds rows of nothing."""
    from flight.sql.query import check_params

    batch = pa.record_batch([pa.array([1, 2]), pa.array(["a", None]), pa.array([0.5, 1.5])],
                            names=["p", "p", ""])
    assert check_params(batch, "prepared update parameters") == [[1, "a", 0.5], [2, None, 1.5]]
    assert check_params(pa.table({"x": pa.array([], pa.int64())}), "w") == []
    assert check_params(pa.record_batch([], schema=pa.schema([])), "w") == []
    assert check_params(None, "w") == []


@pytest.mark.parametrize(("sql", "params", "typed"), [
    ("SELECT id, id, x AS id FROM t", None, 0),  # outputs of one name
    ("SELECT x, x + 1, count(*) OVER () FROM t WHERE id > ?", [None], 0),
    ("SELECT * FROM t AS a JOIN t AS b USING (id)", None, 0),
    ("SELECT ? AS p, id FROM t", [None], 1),  # a NULL parameter's column: its type unknown
])
def test_a_prepared_texts_schema_is_the_schema_of_its_answer(served, sql, params, typed):
    """What a prepare reports as the dataset schema (bound over empty tables) is the schema
    the query's answer comes in, names included (a subquery's binder made ``id, id_1``)."""
    graph, registry, t, r = served
    bound = r.schema_of(sql, params, parse_one(sql))
    q = r.start(sql, [1] if params else None)
    answer = pa.Table.from_batches(list(r.batches(q)), q.schema)
    assert bound.names == answer.schema.names
    assert bound.types[typed:] == answer.schema.types[typed:]


def _answer_as_prepared(sql: str, name: str, rows: pa.Table) -> tuple:
    """A keyed table ``name`` of ``rows`` and the answer to ``sql`` over it, checked to come
    in the schema a prepare of ``sql`` reports."""
    graph = UpdateGraph(validate=True)
    registry = TableRegistry(graph)
    t = registry.create_source(name, rows.schema, "keyed", keys=["id"]).table
    t.upsert(rows)
    graph.run_cycle()
    r = QueryRunner(registry, timeout=30.0)
    try:
        q = r.start(sql)
        got = pa.Table.from_batches(list(r.batches(q)), q.schema)
        prepared = r.schema_of(sql, None, parse_one(sql))
    finally:
        r.shutdown()
    assert prepared.names == got.schema.names and prepared.types == got.schema.types
    return t, got


D = pa.schema([("id", pa.int64()), ("s", pa.duration("s")), ("ms", pa.duration("ms")),
               ("us", pa.duration("us")), ("ns", pa.duration("ns"))])


@pytest.mark.parametrize(("sql", "durations"), [
    ("SELECT * FROM d", {"s": "s", "ms": "ms", "us": "us", "ns": "ns"}),
    ("SELECT d.* FROM d WHERE id > 1", {"s": "s", "ms": "ms", "us": "us", "ns": "ns"}),
    ("SELECT ns AS lat, id, q.us FROM d AS q", {"lat": "ns", "us": "us"}),
    ("SELECT ns, count(*) AS n FROM d GROUP BY ns", {"ns": "ns"}),
    ("SELECT d.ms, e.id FROM d JOIN d AS e USING (id)", {"ms": "ms"}),
    ("SELECT ns * 2 AS twice, max(us) AS hi FROM d GROUP BY ns", {}),  # DuckDB's INTERVALs
    ("SELECT ns FROM d UNION ALL SELECT ns FROM d", {}),
    ("SELECT * EXCLUDE (id) FROM d", {}),
])
def test_a_duration_column_read_as_it_is_comes_back_a_duration(sql, durations):
    """DuckDB reads an Arrow duration as an INTERVAL and answers one (pandas sees objects);
    an output that is a table's duration column as it is comes back in the table's type,
    to DuckDB's microsecond, in the answer and in a prepare's schema alike. Other outputs
    stay DuckDB's INTERVALs."""
    ns = [1_500, -2_000_000_001, None, 90061 * 10**9 + 7]  # a day and more: DuckDB's days
    t, got = _answer_as_prepared(sql, "d", pa.table(
        {"id": [1, 2, 3, 4], "s": [1, -2, None, 90061], "ms": [1, -2001, None, 5],
         "us": [2, -3, None, 86_400_000_001], "ns": ns}, schema=D))
    for name in got.column_names:
        if name in durations:
            assert got.schema.field(name).type == pa.duration(durations[name]), name
        else:
            assert not pa.types.is_duration(got.schema.field(name).type), name
    if "lat" in durations:  # to the microsecond, nulls kept, a day and more too
        want = [None if v is None else int(v / 1000) * 1000 for v in ns]  # toward zero
        assert sorted(got.column("lat").cast(pa.int64()).to_pylist(), key=str) == sorted(want, key=str)
    if sql == "SELECT * FROM d":
        assert got.sort_by("id").select(["s", "ms", "us"]).equals(t.to_arrow().sort_by("id").select(["s", "ms", "us"]))


Z = pa.schema([("id", pa.int64()), ("paris", pa.timestamp("us", tz="Europe/Paris")),
               ("tokyo", pa.timestamp("s", tz="Asia/Tokyo")), ("utc", pa.timestamp("ns", tz="UTC")),
               ("plain", pa.timestamp("ms"))])


@pytest.mark.parametrize(("sql", "kept"), [
    ("SELECT * FROM z", ["paris", "tokyo", "utc", "plain"]),
    ("SELECT tokyo AS t, paris, id FROM z WHERE id > 1", ["t", "paris"]),
    ("SELECT paris + INTERVAL 1 HOUR AS later, max(utc) AS hi FROM z GROUP BY paris", []),
])
def test_a_zoned_timestamp_read_as_it_is_keeps_its_zone_and_unit(sql, kept):
    """DuckDB answers a timestamp zoned in Europe/Paris as one zoned in Etc/UTC (seconds as
    microseconds): read as it is, it comes back in the table's zone and unit, the same
    instants; an expression over it is DuckDB's."""
    t, got = _answer_as_prepared(sql, "z", pa.table(
        {"id": [1, 2, 3], "paris": [1_700_000_000_123_456, None, -5],
         "tokyo": [1_700_000_000, 86_400, None], "utc": [1, None, 10**18 + 7],
         "plain": [1_700_000_000_123, 0, None]}, schema=Z))
    source = {"t": "tokyo", "paris": "paris", "tokyo": "tokyo", "utc": "utc", "plain": "plain"}
    held = t.to_arrow()
    for name in got.column_names:
        if name in kept:
            assert got.schema.field(name).type == Z.field(source[name]).type, name
            want = held.filter(pa.compute.greater(held.column("id"), 1)) if "id > 1" in sql else held
            assert sorted(got.column(name).cast(pa.int64()).to_pylist(), key=str) == sorted(
                want.column(source[name]).cast(pa.int64()).to_pylist(), key=str), name
        elif pa.types.is_timestamp(got.schema.field(name).type):
            assert got.schema.field(name).type.tz in (None, "Etc/UTC", "UTC"), name
