"""Flight SQL against a real server, through clients nobody here wrote: ADBC's Flight SQL
driver (Go) under adbc-driver-manager's DB-API, pandas ``read_sql`` and polars
``read_database`` on that connection; raw gRPC only where a status code must be read."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import grpc
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from google.protobuf import any_pb2

from engine.graph import UpdateGraph
from engine.sources import AppendOnlyTable
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import flight_sql_pb2 as sqlpb
from flight.server import ServerConfig, TicktableServer

TOKEN, READ = "full-token", "read-token"
TRADES = pa.schema([("sym", pa.string()), ("px", pa.float64()), ("qty", pa.int64())])
QUOTES = pa.schema([("sym", pa.string()), ("bid", pa.float64())])


def _server(**cfg: object) -> tuple[UpdateGraph, TicktableServer]:
    graph = UpdateGraph(validate=True)
    srv = TicktableServer(graph, ServerConfig(token=TOKEN, read_token=READ, **cfg)).start()  # type: ignore[arg-type]
    trades = srv.registry.create_source("trades", TRADES, "append").table
    quotes = srv.registry.create_source("quotes", QUOTES, "keyed", keys=["sym"]).table
    trades.append(pa.table({"sym": ["a", "b", "a"], "px": [1.0, 2.0, 3.0], "qty": [1, 2, 3]},
                           schema=TRADES))
    quotes.upsert(pa.table({"sym": ["a", "b"], "bid": [1.5, 2.5]}, schema=QUOTES))
    graph.run_cycle()
    graph.start(0.02)
    return graph, srv


@pytest.fixture
def server() -> Iterator[TicktableServer]:
    graph, srv = _server()
    yield srv
    srv.shutdown()
    graph.stop()


def _connect(srv: TicktableServer, token: str = TOKEN) -> flightsql.Connection:
    return flightsql.connect(srv.location, autocommit=True, db_kwargs={
        "adbc.flight.sql.authorization_header": f"Bearer {token}"})


@pytest.fixture
def conn(server: TicktableServer) -> Iterator[flightsql.Connection]:
    with _connect(server) as c:
        yield c


def _big(srv: TicktableServer, rows: int) -> AppendOnlyTable:
    """An append table ``big`` of one int64 column ``a`` holding ``0 .. rows-1``, applied."""
    big = srv.registry.create_source("big", pa.schema([("a", pa.int64())]), "append").table
    assert isinstance(big, AppendOnlyTable)
    big.append(pa.table({"a": pa.array(range(rows), pa.int64())}))
    deadline = time.monotonic() + 30  # a cycle of the server's applies it
    while big.size != rows:
        assert time.monotonic() < deadline, f"{rows} rows not applied in 30 s"
        time.sleep(0.01)
    return big


def _rows(conn: flightsql.Connection, query: str, params: tuple[object, ...] | None = None
          ) -> list[tuple[object, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return list(cur.fetchall())


# ------------------------------------------------------------------------------ metadata
def test_metadata_as_adbc_asks_for_it(conn):
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "Ticktable" and info["vendor_version"]
    assert info["vendor_arrow_version"] == pa.__version__
    assert sorted(conn.adbc_get_table_types()) == [
        "APPEND TABLE", "DERIVED TABLE", "KEYED TABLE", "MIRROR TABLE", "RING TABLE", "VIEW"]
    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    (schema,) = objects[0]["catalog_db_schemas"]
    assert schema["db_schema_name"] == "main"
    tables = {t["table_name"]: t for t in schema["db_schema_tables"]}
    assert tables["trades"]["table_type"] == "APPEND TABLE"
    assert tables["quotes"]["table_type"] == "KEYED TABLE"
    assert [c["column_name"] for c in tables["trades"]["table_columns"]] == ["sym", "px", "qty"]
    assert conn.adbc_get_table_schema("trades") == TRADES
    filtered = conn.adbc_get_objects(depth="tables", table_name_filter="quo%").read_all()
    names = [t["table_name"] for c in filtered.to_pylist() for s in c["catalog_db_schemas"]
             for t in s["db_schema_tables"]]
    assert names == ["quotes"]


def _command(server: TicktableServer, message, token: str = TOKEN) -> pa.Table:
    any_ = any_pb2.Any()
    any_.Pack(message)
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    with fl.connect(server.location) as c:
        info = c.get_flight_info(fl.FlightDescriptor.for_command(any_.SerializeToString()), opts)
        table = c.do_get(info.endpoints[0].ticket, opts).read_all()
    assert table.schema == info.schema
    return table


def test_primary_keys_type_info_and_sql_info(server):
    keys = _command(server, sqlpb.CommandGetPrimaryKeys(table="quotes")).to_pylist()
    assert [(k["table_name"], k["column_name"], k["key_sequence"]) for k in keys] == [
        ("quotes", "sym", 1)]
    assert _command(server, sqlpb.CommandGetPrimaryKeys(table="trades")).num_rows == 0
    types = _command(server, sqlpb.CommandGetXdbcTypeInfo()).to_pylist()
    assert {"BIGINT", "DOUBLE", "VARCHAR", "BOOLEAN", "TIMESTAMP"} <= {t["type_name"] for t in types}
    bigint = _command(server, sqlpb.CommandGetXdbcTypeInfo(data_type=sqlpb.XDBC_BIGINT))
    assert bigint.column("type_name").to_pylist() == ["BIGINT"]
    info = {r["info_name"]: r["value"] for r in _command(server, sqlpb.CommandGetSqlInfo(
        info=[sqlpb.FLIGHT_SQL_SERVER_NAME, sqlpb.FLIGHT_SQL_SERVER_READ_ONLY,
              sqlpb.FLIGHT_SQL_SERVER_CANCEL, sqlpb.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT])
        ).to_pylist()}
    assert info == {0: "Ticktable", 3: False, 9: True, 100: 60_000}
    read = {r["info_name"]: r["value"] for r in _command(server, sqlpb.CommandGetSqlInfo(
        info=[sqlpb.FLIGHT_SQL_SERVER_READ_ONLY]), READ).to_pylist()}
    assert read == {3: True}  # the read token's connection is told it may not write
    assert _command(server, sqlpb.CommandGetCatalogs()).num_rows == 0


# ------------------------------------------------------------------------------- queries
def test_queries_parameters_and_arrow_results(conn):
    assert _rows(conn, "SELECT sym, sum(px) AS s FROM trades GROUP BY sym ORDER BY sym") == [
        ("a", 4.0), ("b", 2.0)]
    assert _rows(conn, "SELECT sym, qty FROM trades WHERE qty > ? ORDER BY qty", (1,)) == [
        ("b", 2), ("a", 3)]
    with conn.cursor() as cur:
        cur.execute("SELECT t.sym, t.px, q.bid FROM trades t JOIN quotes q ON t.sym = q.sym "
                    "WHERE t.px > ? ORDER BY t.px", (1.5,))
        table = cur.fetch_arrow_table()
    assert table.column_names == ["sym", "px", "bid"]
    assert table.to_pylist() == [{"sym": "b", "px": 2.0, "bid": 2.5},
                                 {"sym": "a", "px": 3.0, "bid": 1.5}]
    assert int(table.schema.metadata[b"ticktable.step"]) >= 1  # the step it was taken at


def test_a_parameter_cast_runs(conn):
    """``?::TYPE``, as pandas and BI tools write a typed parameter (sqlglot alone refused it)."""
    assert _rows(conn, "SELECT ?::INTEGER + 1 AS n", (41,)) == [(42,)]
    assert _rows(conn, "SELECT count(*) FROM trades WHERE qty > ?::BIGINT", (1,)) == [(2,)]


def test_results_of_many_batches_and_of_one_both_arrive_whole():
    """A result past two batches is read on a thread as DoGet sends it; one read whole when
    its query started is sent from the event loop (flight.rpc.aio's loop_first). Both
    arrive whole, and the cursor a query leaves for the next one shows each cycle's rows."""
    graph, srv = _server(max_batch_rows=1000)
    try:
        big = _big(srv, 10_000)
        with _connect(srv) as conn:
            for rows in range(10_000, 10_003):
                with conn.cursor() as cur:
                    cur.execute("SELECT a FROM big ORDER BY a")
                    assert cur.fetch_arrow_table().column("a").to_pylist() == list(range(rows))
                assert _rows(conn, f"SELECT a FROM big WHERE a + 0 = {rows - 1}") == [(rows - 1,)]
                big.append(pa.table({"a": pa.array([rows], pa.int64())}))
                deadline = time.monotonic() + 5  # a cycle later, the next query sees it
                while _rows(conn, "SELECT count(*) FROM big") != [(rows + 1,)]:
                    assert time.monotonic() < deadline
        assert srv.sql.runner.running() == 0
    finally:
        srv.shutdown()
        graph.stop()


def test_pandas_read_sql_and_polars_read_database(conn):
    df = pd.read_sql("SELECT * FROM trades ORDER BY px", conn)
    assert df.to_dict("list") == {"sym": ["a", "b", "a"], "px": [1.0, 2.0, 3.0], "qty": [1, 2, 3]}
    frame = pl.read_database("SELECT sym, count(*) AS n FROM trades GROUP BY sym ORDER BY sym",
                             conn)
    assert frame.to_dict(as_series=False) == {"sym": ["a", "b"], "n": [2, 1]}


def test_a_join_reads_both_tables_at_one_step(server, conn):
    """Two tables written in the same cycle are never seen at different steps."""
    schema = pa.schema([("n", pa.int64())])
    left = server.registry.create_source("left_t", schema, "append").table
    right = server.registry.create_source("right_t", schema, "append").table
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with server.graph.exclusive_lock():  # both land in the same cycle
                left.append(pa.table({"n": [n]}, schema=schema))
                right.append(pa.table({"n": [n]}, schema=schema))
            time.sleep(0.003)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = []
        for _ in range(60):
            (row,) = _rows(conn, "SELECT (SELECT count(*) FROM left_t), (SELECT count(*) FROM right_t)")
            seen.append(row)
    finally:
        stop.set()
        writer.join()
    assert all(a == b for a, b in seen), [r for r in seen if r[0] != r[1]][:5]
    assert seen[-1][0] > seen[0][0]  # the tables were live while queried


def test_cycles_run_while_a_query_runs_and_the_timeout_stops_it():
    graph, srv = _server(sql_timeout=1.0)
    try:
        _big(srv, 3_000_000)
        before = graph.step
        t0 = time.monotonic()
        with _connect(srv) as conn, pytest.raises(adbc_driver_manager.Error) as raised:
            _rows(conn, "SELECT count(*) FROM big x, big y WHERE x.a + y.a = 7")
        took = time.monotonic() - t0
        assert "query timeout of 1 s" in str(raised.value)
        assert "DeadlineExceeded" in str(raised.value)  # gRPC DEADLINE_EXCEEDED, as ADBC names it
        assert 0.9 < took < 10
        assert graph.step - before >= 10  # the cycle (every 20 ms) kept running meanwhile
        with _connect(srv) as conn:  # and the server serves on
            assert _rows(conn, "SELECT count(*) FROM big") == [(3_000_000,)]
    finally:
        srv.shutdown()
        graph.stop()


def test_cancel_flight_info_stops_a_query(server):
    """CancelFlightInfo on a query's FlightInfo: CANCELLED, and its ticket reads nothing."""
    opts = [("authorization", f"Bearer {TOKEN}")]
    any_ = any_pb2.Any()
    any_.Pack(sqlpb.CommandStatementQuery(query="SELECT * FROM trades"))
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        info_call = ch.unary_unary("/arrow.flight.protocol.FlightService/GetFlightInfo",
                                   fpb.FlightDescriptor.SerializeToString,
                                   fpb.FlightInfo.FromString)
        info = info_call(fpb.FlightDescriptor(type=fpb.FlightDescriptor.CMD,
                                              cmd=any_.SerializeToString()), metadata=opts)
        assert pb.UpdateMetadata.FromString(info.app_metadata).step >= 1
        action = ch.unary_stream("/arrow.flight.protocol.FlightService/DoAction",
                                 fpb.Action.SerializeToString, fpb.Result.FromString)
        (result,) = action(fpb.Action(type="CancelFlightInfo", body=fpb.CancelFlightInfoRequest(
            info=info).SerializeToString()), metadata=opts)
        assert fpb.CancelFlightInfoResult.FromString(result.body).status == \
            fpb.CANCEL_STATUS_CANCELLED
        do_get = ch.unary_stream("/arrow.flight.protocol.FlightService/DoGet",
                                 fpb.Ticket.SerializeToString, lambda b: b)
        with pytest.raises(grpc.RpcError) as raised:
            list(do_get(info.endpoint[0].ticket, metadata=opts))
        assert raised.value.code() == grpc.StatusCode.CANCELLED
        assert "cancelled by its client" in raised.value.details()
    assert server.sql.runner.running() == 0


# -------------------------------------------------------------------------------- writes
def test_adbc_ingest_create_append_replace(server, conn):
    data = pa.table({"x": pa.array([1, 2, 3], pa.int64()), "s": ["a", "b", "c"]})
    with conn.cursor() as cur:
        assert cur.adbc_ingest("loaded", data, mode="create") == 3
        assert cur.adbc_ingest("loaded", data.slice(0, 1), mode="append") == 1
    assert server.registry.get("loaded").kind == "append"
    assert _rows(conn, "SELECT count(*), sum(x) FROM loaded") == [(4, 7)]
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error, match="already exists"):
        cur.adbc_ingest("loaded", data, mode="create")
    with conn.cursor() as cur:
        assert cur.adbc_ingest("loaded", data.slice(1), mode="replace") == 2
        assert cur.adbc_ingest("fresh", data, mode="create_append") == 3
    assert _rows(conn, "SELECT sum(x) FROM loaded") == [(5,)]
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error, match="unknown column"):
        cur.adbc_ingest("loaded", pa.table({"y": [1]}), mode="append")
    assert _rows(conn, "SELECT sum(x) FROM loaded") == [(5,)]  # nothing of a bad write


def test_ingest_of_many_batches_is_atomic(server, conn):
    """A bad batch after good ones: nothing of the ingest is visible."""
    server.registry.create_source("atomic", pa.schema([("x", pa.int64())]), "append")
    good = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    bad = pa.record_batch({"x": pa.array(["not", "ints"])})
    reader = pa.RecordBatchReader.from_batches(good.schema, [good, good])
    with conn.cursor() as cur:
        assert cur.adbc_ingest("atomic", reader, mode="append") == 2000
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error):
        cur.adbc_ingest("atomic", pa.RecordBatchReader.from_batches(
            pa.schema([("x", pa.string())]), [bad.cast(pa.schema([("x", pa.string())]))]),
            mode="append")
    assert _rows(conn, "SELECT count(*) FROM atomic") == [(2000,)]


def test_a_write_is_answered_before_its_cycle_and_every_later_query_sees_it():
    """An ingest or INSERT is answered once journaled, before the cycle that applies it
    (here every cycle starts 0.3 s late); a query (or a DELETE's WHERE) started after the
    answer waits for that cycle."""
    graph = UpdateGraph(validate=True)
    srv = TicktableServer(graph, ServerConfig(token=TOKEN)).start()
    srv.registry.create_source("kv", pa.schema([("k", pa.int64()), ("v", pa.int64())]), "keyed",
                               keys=["k"])
    run_cycle = graph.run_cycle

    def late_cycle() -> int:  # the cycle thread calls graph.run_cycle: this one
        time.sleep(0.3)
        return run_cycle()

    graph.run_cycle = late_cycle  # type: ignore[method-assign]
    graph.start(1.0)
    try:
        with _connect(srv) as c, c.cursor() as cur:
            for i in range(3):
                cur.adbc_ingest("kv", pa.table({"k": [i, 100 + i], "v": [i, i]}), mode="append")
                cur.execute("SELECT count(*), sum(v) FROM kv")
                assert cur.fetchall() == [(2 * (i + 1), i * (i + 1))]
                cur.execute(f"INSERT INTO kv VALUES ({200 + i}, 1)")
                cur.execute(f"DELETE FROM kv WHERE k = {200 + i}")  # sees the INSERT
                assert cur.fetchall() == [(1,)]
                cur.execute(f"SELECT count(*) FROM kv WHERE k = {200 + i}")
                assert cur.fetchall() == [(0,)]
    finally:
        srv.shutdown()
        graph.stop()


def test_insert_and_delete(server, conn):
    with conn.cursor() as cur:
        cur.execute("INSERT INTO trades VALUES ('c', 9.0, 9), ('d', 4.0, 4)")
        assert cur.fetchall() == [(2,)]
        cur.execute("INSERT INTO trades (sym, qty) SELECT sym, qty * 10 FROM trades WHERE sym = ?",
                    ("b",))
    assert _rows(conn, "SELECT sym, px, qty FROM trades WHERE sym IN ('c', 'd', 'b') ORDER BY qty"
                 ) == [("b", 2.0, 2), ("d", 4.0, 4), ("c", 9.0, 9), ("b", None, 20)]
    with conn.cursor() as cur:
        cur.execute("INSERT INTO quotes VALUES ('a', 9.5), ('z', 0.5)")  # upserts by key
        cur.execute("DELETE FROM quotes WHERE bid < ?", (1.0,))
        assert cur.fetchall() == [(1,)]
    assert _rows(conn, "SELECT * FROM quotes ORDER BY sym") == [("a", 9.5), ("b", 2.5)]
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error,
                                             match="DELETE takes a keyed table"):
        cur.execute("DELETE FROM trades WHERE qty > 1")
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error, match="do not fit"):
        cur.execute("INSERT INTO trades VALUES ('e', 'not a number', 1)")
    assert _rows(conn, "SELECT count(*) FROM trades") == [(6,)]


def test_writes_are_durable_across_a_restart(tmp_path):
    graph, srv = _server(data_dir=tmp_path)
    try:
        with _connect(srv) as conn, conn.cursor() as cur:
            cur.adbc_ingest("kept", pa.table({"x": [1, 2]}), mode="create")
            cur.execute("INSERT INTO kept VALUES (3)")
    finally:
        srv.shutdown()
        graph.stop()
    graph = UpdateGraph()
    srv = TicktableServer(graph, ServerConfig(data_dir=tmp_path, token=TOKEN)).start()
    graph.start(0.02)
    try:
        with _connect(srv) as conn:
            assert _rows(conn, "SELECT x FROM kept ORDER BY x") == [(1,), (2,), (3,)]
    finally:
        srv.shutdown()
        graph.stop()


# --------------------------------------------------------------------- bad and hostile
@pytest.mark.parametrize("query, code, words", [
    ("SELEC * FROM trades", "INVALID_ARGUMENT", "line 1, column"),
    ("SELECT * FROM nope", "NOT_FOUND", "no table 'nope'"),
    ("SELECT * FROM read_csv('/etc/passwd')", "INVALID_ARGUMENT", "table function"),
    ("SELECT * FROM read_parquet('x.parquet')", "INVALID_ARGUMENT", "table function"),
    ("SELECT * FROM information_schema.tables", "INVALID_ARGUMENT", "qualified names"),
    ("SELECT * FROM duckdb_settings()", "INVALID_ARGUMENT", "table function"),
    ("ATTACH '/tmp/evil.db'", "INVALID_ARGUMENT", "not supported"),
    ("COPY trades TO '/tmp/out.csv'", "INVALID_ARGUMENT", "not supported"),
    ("INSTALL httpfs", "INVALID_ARGUMENT", "not supported"),
    ("LOAD httpfs", "INVALID_ARGUMENT", "not supported"),
    ("SET memory_limit = '100GB'", "INVALID_ARGUMENT", "not supported"),
    ("PRAGMA database_list", "INVALID_ARGUMENT", "not supported"),
    ("SELECT 1; SELECT 2", "INVALID_ARGUMENT", "one statement"),
    ("SELECT nosuch FROM trades", "INVALID_ARGUMENT", "nosuch"),
    ("SELECT * FROM trades WHERE px > (SELECT max(x) FROM read_csv_auto('/etc/hosts'))",
     "INVALID_ARGUMENT", "table function"),
])
def test_bad_and_hostile_sql_is_refused_in_one_line(conn, query, code, words):
    with pytest.raises(adbc_driver_manager.Error) as raised:
        _rows(conn, query)
    message = str(raised.value)
    assert code in message and words in message, message
    assert "Traceback" not in message and "internal error" not in message
    assert _rows(conn, "SELECT count(*) FROM trades") == [(3,)]  # serving on, nothing changed


def _execute_update(conn: flightsql.Connection, statement: str) -> int:
    """ADBC's ``ExecuteUpdate``: a ``CommandStatementUpdate`` DoPut of a descriptor and no
    data (DB-API's ``execute`` runs a query instead)."""
    with conn.cursor() as cur:
        cur.adbc_statement.set_sql_query(statement)
        return cur.adbc_statement.execute_update()


def test_rowcount_is_the_rows_a_statement_changed(conn):
    """PEP 249: after ``execute`` of a statement that writes, ``rowcount`` is the rows it
    affected (ADBC reads the FlightInfo's ``total_records``); the result row holds it too."""
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE rc (k BIGINT PRIMARY KEY, n BIGINT)")
        cur.execute("INSERT INTO rc VALUES (1, 0), (2, 0), (3, 0), (4, 0)")
        assert cur.rowcount == 4 and cur.fetchall() == [(4,)]
        cur.execute("UPDATE rc SET n = 1 WHERE k < 4")
        assert cur.rowcount == 3 and cur.fetchall() == [(3,)]
        cur.execute("DELETE FROM rc WHERE k > 10")
        assert cur.rowcount == 0 and cur.fetchall() == [(0,)]


def test_execute_update_answers_its_count(conn):
    assert _execute_update(conn, "CREATE TABLE u (k BIGINT PRIMARY KEY, n BIGINT)") == 0
    assert _execute_update(conn, "INSERT INTO u VALUES (1, 0), (2, 0), (3, 0)") == 3
    assert _execute_update(conn, "UPDATE u SET n = n + k WHERE k > 1") == 2
    assert _execute_update(conn, "DELETE FROM u WHERE k = 3") == 1
    assert _rows(conn, "SELECT * FROM u ORDER BY k") == [(1, 0), (2, 2)]
    for statement, words in (("SELECT 1", "a query returns rows"),
                             ("SELEC 1", "line 1, column 7"),
                             ("UPDATE nope SET n = 1", "no table 'nope'")):
        with pytest.raises(adbc_driver_manager.Error) as raised:
            _execute_update(conn, statement)
        assert words in str(raised.value) and "EOF" not in str(raised.value), raised.value


def test_session_options_say_the_one_schema_and_change_nothing(server):
    """ADBC reads its current schema from the session option ``schema``; setting it to
    ``main`` is accepted, to another is refused naming the option; CloseSession (sent by
    the driver as it closes) is answered, not an unknown action. The read token may."""
    with _connect(server, READ) as conn:
        assert conn.adbc_current_db_schema == "main"
        with pytest.raises(adbc_driver_manager.Error, match="current catalog not supported"):
            conn.adbc_current_catalog  # noqa: B018  (no catalogs: the driver says so)
        option = adbc_driver_manager.ConnectionOptions.CURRENT_DB_SCHEMA.value
        conn.adbc_connection.set_options(**{option: "main"})
        with pytest.raises(adbc_driver_manager.Error, match="'schema' \\(invalid value\\)"):
            conn.adbc_connection.set_options(**{option: "other"})
        assert conn.adbc_current_db_schema == "main"
    client = fl.connect(server.location)
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {READ}".encode())])
    request = fpb.SetSessionOptionsRequest()
    request.session_options["catalog"].string_value = ""
    request.session_options["x"].bool_value = True
    request.session_options["schema"].int64_value = 1
    result = fpb.SetSessionOptionsResult()
    result.ParseFromString(next(iter(client.do_action(
        fl.Action("SetSessionOptions", request.SerializeToString()), options))).body.to_pybytes())
    assert {k: v.value for k, v in result.errors.items()} == {
        "x": fpb.SetSessionOptionsResult.INVALID_NAME,
        "schema": fpb.SetSessionOptionsResult.INVALID_VALUE}
    closed = fpb.CloseSessionResult()
    closed.ParseFromString(next(iter(client.do_action(fl.Action("CloseSession", b""),
                                                      options))).body.to_pybytes())
    assert closed.status == fpb.CloseSessionResult.CLOSED
    assert {"SetSessionOptions", "GetSessionOptions", "CloseSession"} <= {
        a.type for a in client.list_actions(options)}
    client.close()


def test_the_read_token_may_query_but_not_write(server):
    with _connect(server, READ) as conn:
        assert _rows(conn, "SELECT count(*) FROM trades WHERE qty > ?", (0,)) == [(3,)]
        for statement in ("INSERT INTO trades VALUES ('x', 1.0, 1)",
                          "DELETE FROM quotes WHERE sym = 'a'",
                          "CREATE VIEW v AS SELECT * FROM trades"):
            with pytest.raises(adbc_driver_manager.Error, match="PermissionDenied"):
                _rows(conn, statement)
        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error,
                                                 match="PermissionDenied"):
            cur.adbc_ingest("trades", pa.table({"sym": ["x"], "px": [1.0], "qty": [1]}),
                            mode="append")
        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error,
                                                 match="PermissionDenied"):
            cur.executemany("INSERT INTO trades VALUES (?, ?, ?)", [("x", 1.0, 1)])
        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error,
                                                 match="PermissionDenied"):
            cur.adbc_statement.set_sql_query("DELETE FROM quotes")
            cur.adbc_statement.execute_update()
    with _connect(server) as conn:
        assert _rows(conn, "SELECT count(*) FROM trades") == [(3,)]
    with _connect(server, "wrong") as conn, pytest.raises(adbc_driver_manager.Error,
                                                          match="UNAUTHENTICATED"):
        _rows(conn, "SELECT 1")


# --------------------------------------------------------------------------------- views
def _wait_for(conn: flightsql.Connection, query: str, expected: list[tuple[object, ...]]) -> None:
    deadline = time.monotonic() + 10
    while (got := _rows(conn, query)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == expected


def test_create_view_is_a_live_listed_derived_table(server, conn):
    with conn.cursor() as cur:
        cur.execute("CREATE VIEW by_sym AS SELECT sym, sum(qty) AS n, count(*) AS c FROM trades "
                    "WHERE px > 0 GROUP BY sym")
    entry = server.registry.get("by_sym")
    assert entry.kind == "view" and entry.parents == ["trades"]
    assert conn.adbc_get_table_schema("by_sym").names == ["sym", "n", "c"]
    tables = conn.adbc_get_objects(depth="tables", table_name_filter="by_sym").read_all()
    assert tables.to_pylist()[0]["catalog_db_schemas"][0]["db_schema_tables"][0][
        "table_type"] == "VIEW"
    _wait_for(conn, "SELECT * FROM by_sym ORDER BY sym", [("a", 4, 2), ("b", 2, 1)])
    with conn.cursor() as cur:
        cur.execute("INSERT INTO trades VALUES ('b', 5.0, 10), ('c', 1.0, 1)")
    # the view updates incrementally: its rows equal the same SQL over the source's rows
    _wait_for(conn, "SELECT * FROM by_sym ORDER BY sym", [("a", 4, 2), ("b", 12, 2), ("c", 1, 1)])
    assert _rows(conn, "SELECT * FROM by_sym ORDER BY sym") == _rows(
        conn, "SELECT sym, sum(qty), count(*) FROM trades WHERE px > 0 GROUP BY sym ORDER BY sym")
    nodes = len(server.graph.tables)
    with conn.cursor() as cur:
        cur.execute("CREATE OR REPLACE VIEW by_sym AS SELECT sym, max(px) AS hi FROM trades "
                    "WHERE qty > 1 GROUP BY sym")
    assert len(server.graph.tables) == nodes  # the replaced view's operations are gone
    _wait_for(conn, "SELECT * FROM by_sym ORDER BY sym", [("a", 3.0), ("b", 5.0)])
    with conn.cursor() as cur:
        cur.execute("DROP VIEW by_sym")
    assert "by_sym" not in server.registry.names()
    # every operation the view was built of left the graph: nothing of it updates any more
    assert [t.name for t in server.graph.tables] == ["trades", "quotes"]
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error, match="not a view"):
        cur.execute("DROP VIEW trades")


@pytest.mark.parametrize("sql, clause", [
    ("SELECT * FROM trades FULL OUTER JOIN quotes USING (sym)", "FULL"),
    ("SELECT sym, row_number() OVER () FROM trades", "window"),
    ("SELECT * FROM trades LIMIT 2", "LIMIT"),
])
def test_a_view_clause_that_does_not_map_is_refused_by_name(server, conn, sql, clause):
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as raised:
        cur.execute(f"CREATE VIEW nope AS {sql}")
    assert "INVALID_ARGUMENT" in str(raised.value) and clause in str(raised.value)
    assert "nope" not in server.registry.names()


def test_views_are_journaled_as_sql_and_rebuilt_after_a_restart(tmp_path):
    graph, srv = _server(data_dir=tmp_path)
    try:
        with _connect(srv) as conn, conn.cursor() as cur:
            cur.adbc_ingest("orders", pa.table({"sym": ["a", "b", "a"], "q": [1, 2, 3]}),
                            mode="create")
            cur.execute("CREATE VIEW totals AS SELECT sym, sum(q) AS q FROM orders GROUP BY sym")
    finally:
        srv.shutdown()
        graph.stop()
    graph = UpdateGraph(validate=True)
    srv = TicktableServer(graph, ServerConfig(data_dir=tmp_path, token=TOKEN)).start()
    graph.start(0.02)
    try:
        assert srv.registry.get("totals").kind == "view"
        with _connect(srv) as conn:
            _wait_for(conn, "SELECT * FROM totals ORDER BY sym", [("a", 4), ("b", 2)])
            with conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES ('b', 5)")
            _wait_for(conn, "SELECT * FROM totals ORDER BY sym", [("a", 4), ("b", 7)])
    finally:
        srv.shutdown()
        graph.stop()


def test_a_query_past_the_memory_limit_is_refused_and_the_server_serves_on():
    graph, srv = _server(sql_memory_mb=40)
    try:
        _big(srv, 3_000_000)
        with _connect(srv) as conn:
            with pytest.raises(adbc_driver_manager.Error) as raised:
                _rows(conn, "SELECT string_agg(a::VARCHAR, ',') FROM big")
            assert "(ResourceExhausted;" in str(raised.value)  # the gRPC status, as ADBC names it
            assert "--sql-memory-mb" in str(raised.value)
            assert _rows(conn, "SELECT count(*) FROM big") == [(3_000_000,)]
    finally:
        srv.shutdown()
        graph.stop()


def test_a_temporary_view_nobody_subscribes_to_goes_after_its_grace(server, conn, monkeypatch):
    monkeypatch.setattr(type(server.sql), "TEMPORARY_GRACE", 0.5)
    with conn.cursor() as cur:
        cur.execute("CREATE TEMPORARY VIEW brief AS SELECT sym FROM trades")
        cur.execute("CREATE VIEW lasting AS SELECT sym FROM trades")
    assert server.registry.get("brief").kind == "view"
    deadline = time.monotonic() + 10
    while "brief" in server.registry.names() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(server.registry.names()) == ["lasting", "quotes", "trades"]


def test_sql_info_of_codes_the_server_does_not_know_is_an_empty_result(server):
    """The specification: unknown codes are left out (an empty dense-union result; the fuzz
    found it answered INTERNAL)."""
    table = _command(server, sqlpb.CommandGetSqlInfo(info=[99_999]))
    assert table.num_rows == 0 and table.schema.field("value").type.num_fields == 6


def test_get_schema_runs_nothing_and_never_writes(server):
    """GetSchema of a query binds it (no query starts); of an update, it is the count's
    schema and the update does not run."""
    def schema_of(query: str) -> pa.Schema:
        any_ = any_pb2.Any()
        any_.Pack(sqlpb.CommandStatementQuery(query=query))
        opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        with fl.connect(server.location) as c:
            return c.get_schema(fl.FlightDescriptor.for_command(any_.SerializeToString()),
                                opts).schema

    assert schema_of("SELECT sym, px * 2 AS p2 FROM trades WHERE qty > ?").names == ["sym", "p2"]
    assert server.sql.runner.running() == 0
    assert schema_of("INSERT INTO trades VALUES ('z', 1.0, 1)").names == ["count"]
    assert len(server.registry.get("trades").table.rowset) == 3  # nothing inserted


def test_a_staged_write_committed_into_its_name_now_a_view_is_refused_naming_it(server, conn):
    """The race the fuzz found (seed 4902) over the real wire: a write staged into ``t``,
    ``t`` dropped and created again as a live view (ADBC), then the commit. The commit is
    INVALID_ARGUMENT naming the table and the write (it was INTERNAL), nothing of it lands,
    and the view and the server go on."""
    from clients.client import connect

    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    with connect(server.location, token=TOKEN) as tt, fl.connect(server.location) as c:
        tt.create_table("t", TRADES, "append")
        w, r = c.do_put(fl.FlightDescriptor.for_path("t"), TRADES, opts)
        rows = pa.record_batch({"sym": ["z"], "px": [9.0], "qty": [9]}, schema=TRADES)
        req = pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id="w", partition=0, attempt=0)
        w.write_with_metadata(rows, pa.py_buffer(req.SerializeToString()))
        ack = pb.PutAck()
        ack.ParseFromString(r.read().to_pybytes())
        assert ack.staged and ack.rows == 1
        w.done_writing()
        w.close()
        tt.drop_table("t")
        with conn.cursor() as cur:
            cur.execute("CREATE VIEW t AS SELECT sym, qty FROM trades WHERE qty > 1")
        commit = fl.Action("commit", pb.CommitRequest(write_id="w", all_slots=True).SerializeToString())
        with pytest.raises(pa.ArrowInvalid, match=r"table 't' is a view now, not a source table as "
                                                  r"when write 'w' was staged \(it was dropped and "
                                                  r"created again\); nothing of the write was "
                                                  r"committed"):
            list(c.do_action(commit, opts))
        tt.push("trades", pa.table({"sym": ["c"], "px": [4.0], "qty": [4]}, schema=TRADES))
        deadline = time.monotonic() + 10  # the view follows trades, without the staged row
        while sorted(_rows(conn, "SELECT qty FROM t")) != [(2,), (3,), (4,)]:
            assert time.monotonic() < deadline, _rows(conn, "SELECT * FROM t")
            time.sleep(0.02)
        assert sorted(_rows(conn, "SELECT sym, qty FROM t")) == [("a", 3), ("b", 2), ("c", 4)]


def test_a_querys_parameters_are_not_logged_as_a_writer_joining(conn, caplog):
    """A parametrized query binds its parameters through a DoPut: logged at DEBUG like the
    query's other calls, while an ingest's and an INSERT's DoPut keep their two INFO lines."""
    import logging

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "ticktable.calls" and r.levelno == logging.INFO]

    with caplog.at_level(logging.DEBUG, logger="ticktable.calls"), conn.cursor() as cur:
        for px in (1.0, 2.0, 3.0):
            cur.execute("SELECT qty FROM trades WHERE px = ?", (px,))
            assert cur.fetchall() == [(int(px),)]
        assert lines() == []
        debug = [r.getMessage() for r in caplog.records if r.name == "ticktable.calls"
                 and r.levelno == logging.DEBUG and "call DoPut" in r.getMessage()]
        assert len(debug) == 6, debug  # still there, a start and an end each
        cur.adbc_ingest("trades", pa.table({"sym": ["c"], "px": [4.0], "qty": [4]},
                                           schema=TRADES), mode="append")
        cur.executemany("INSERT INTO trades VALUES (?, ?, ?)", [("d", 5.0, 5), ("e", 6.0, 6)])
    got = lines()
    assert len(got) == 4 and all("call DoPut from" in m for m in got), got
    assert [("done in" in m) for m in got] == [False, True, False, True], got
