"""The Prometheus endpoint (flight/metrics.py) and the call log (flight/rpc/call_log.py), scraped
over real HTTP from a real server on 127.0.0.1, with real Flight traffic."""

from __future__ import annotations

import logging
import threading
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.graph import UpdateGraph
from flight.metrics import SQL_HELD
from flight.server import ServerConfig, TicktableServer

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture
def served(tmp_path):
    graph = UpdateGraph()
    srv = TicktableServer(graph, ServerConfig(metrics_port=0, data_dir=tmp_path / "d")).start()
    yield graph, srv
    srv.shutdown()


def test_metrics_follow_writes_cycles_subscribers_and_errors(served, caplog):
    graph, srv = served
    assert srv.metrics_port
    c = fl.connect(srv.location)
    from flight.pb import flight_pb2 as pb

    req = pb.CreateTableRequest(name="t", schema=KV.serialize().to_pybytes(),
                                kind=pb.TABLE_KIND_KEYED, keys=["k"])
    list(c.do_action(fl.Action("create_table", req.SerializeToString())))
    w, r = c.do_put(fl.FlightDescriptor.for_path("t"), KV)
    w.write_table(pa.table({"k": pa.array(range(1000), pa.int64()),
                            "v": pa.array([1.0] * 1000)}))
    w.done_writing()
    while r.read() is not None:
        pass
    w.close()
    graph.run_cycle()
    with caplog.at_level(logging.INFO, logger="ticktable.calls"):
        with pytest.raises(pa.ArrowKeyError):
            c.do_get(fl.Ticket(pb.SnapshotRequest(table="nope").SerializeToString())).read_all()
    m = _scrape(srv.metrics_port)
    assert m[("ticktable_put_rows_total", (("table", "t"),))] == 1000
    assert m[("ticktable_put_bytes_total", (("table", "t"),))] >= 16_000
    assert m[("ticktable_table_rows", (("kind", "keyed"), ("table", "t")))] == 1000
    assert m[("ticktable_table_changes_total", (("table", "t"),))] == 1000
    assert m[("ticktable_table_shared_deltas_total", (("table", "t"),))] == 0  # no subscriber
    assert m[("ticktable_errors_total", (("code", "NOT_FOUND"),))] == 1
    assert m[("ticktable_cycle_seconds_count", ())] >= 1
    assert m[("ticktable_journal_bytes", ())] > 0
    assert m[("ticktable_journal_flush_seconds_count", ())] >= 2  # the create and the batch
    assert m[("ticktable_step", ())] == graph.step
    # the error was logged with the client's address and its one-line answer
    line = next(r.getMessage() for r in caplog.records if "NOT_FOUND" in r.getMessage())
    assert "DoGet" in line and "127.0.0.1" in line and "nope" in line
    # a subscriber joining and leaving: INFO, with its address
    seen: list[str] = []
    left = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if record.levelno == logging.INFO and "DoExchange" in msg:
                seen.append(msg)
                if " after " in msg or " done in " in msg:
                    left.set()

    calls = logging.getLogger("ticktable.calls")
    watch, level = Watch(), calls.level
    calls.addHandler(watch)
    calls.setLevel(logging.INFO)
    try:
        from clients.client import connect

        tc = connect(srv.location)
        tc.subscribe("t").close()
        tc.close()
        assert left.wait(10), seen
    finally:
        calls.removeHandler(watch)
        calls.setLevel(level)
    import re

    joined = [m for m in seen if re.fullmatch(r"call DoExchange from \S*127\.0\.0\.1\S*", m)]
    assert joined, seen  # the start, before anything else of the call
    assert "127.0.0.1" in seen[-1] and seen.index(joined[0]) == 0
    c.close()


def test_the_stats_action_shows_the_numbers_of_the_metrics_endpoint(served):
    graph, srv = served
    from clients.client import connect

    tc = connect(srv.location)
    tc.create_table("t", KV, "keyed", keys=["k"])
    tc.push("t", pa.table({"k": pa.array(range(500), pa.int64()), "v": pa.array([2.0] * 500)}), "upsert")
    graph.run_cycle()
    with pytest.raises(KeyError):
        tc.snapshot("nope")
    # the cycle's marker record is appended and flushed after run_cycle returns (nobody
    # waits for it): read both once the journal's bytes and flush count agree between them
    deadline = time.monotonic() + 10
    while True:
        st = tc.stats()
        m = _scrape(srv.metrics_port)
        settled = (st.attrs["journal_flushes"] == m[("ticktable_journal_flush_seconds_count", ())]
                   and st.attrs["journal_bytes"] == m[("ticktable_journal_bytes", ())])
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (row,) = st[st["name"] == "t"].to_dict("records")
    assert row["put_rows"] == m[("ticktable_put_rows_total", (("table", "t"),))] == 500
    assert row["put_bytes"] == m[("ticktable_put_bytes_total", (("table", "t"),))] >= 8_000
    assert row["changes"] == m[("ticktable_table_changes_total", (("table", "t"),))] == 500
    assert st.attrs["errors"] == {"NOT_FOUND": 1}
    assert st.attrs["journal_bytes"] == m[("ticktable_journal_bytes", ())] > 0
    assert st.attrs["journal_flushes"] == m[("ticktable_journal_flush_seconds_count", ())] >= 2
    assert 0 < st.attrs["journal_flush_p50_ms"] <= st.attrs["journal_flush_p99_ms"]
    tc.close()


def test_a_server_without_a_metrics_port_still_counts_for_stats():
    graph = UpdateGraph()
    with TicktableServer(graph, ServerConfig(port=0)) as srv:
        from clients.client import connect

        assert srv.metrics_port is None
        tc = connect(srv.location)
        tc.create_table("t", KV)
        tc.push("t", pa.table({"k": pa.array([1, 2], pa.int64()), "v": pa.array([1.0, 2.0])}))
        st = tc.stats()
        assert st.loc[st["name"] == "t", "put_rows"].tolist() == [2]
        assert st.attrs["journal_bytes"] == 0 and st.attrs["errors"] == {}
        tc.close()


def test_creating_tables_while_cycles_run_never_deadlocks():
    # a create holds the registry's lock and then takes the graph's; the metrics' cycle
    # listener (under the graph's lock) read the registry under its lock: the fuzz found
    # the server stuck, every call needing either lock hanging to its deadline
    graph = UpdateGraph()
    with TicktableServer(graph, ServerConfig(port=0)) as srv:
        graph.start(interval=0.0005)
        try:
            c = fl.connect(srv.location)
            from flight.pb import flight_pb2 as pb

            t = srv.registry.create_source("src", KV, "append").table

            def churn() -> None:  # every cycle has something to do
                while not done.is_set():
                    t.append(pa.table({"k": pa.array([1], pa.int64()), "v": pa.array([1.0])}))

            import threading

            done = threading.Event()
            writer = threading.Thread(target=churn, daemon=True)
            writer.start()
            opts = fl.FlightCallOptions(timeout=20)
            for i in range(150):
                req = pb.CreateTableRequest(name=f"t{i}", schema=KV.serialize().to_pybytes(),
                                            kind=pb.TABLE_KIND_APPEND)
                list(c.do_action(fl.Action("create_table", req.SerializeToString()), opts))
                list(c.do_action(fl.Action("stats", b""), opts))
            done.set()
            writer.join(10)
            assert len(srv.registry.names()) == 151
            c.close()
        finally:
            graph.stop()


def test_flight_sql_queries_are_counted_by_outcome(served):
    import adbc_driver_flightsql.dbapi as flightsql
    import adbc_driver_manager

    graph, srv = served
    srv.registry.create_source("t", KV, "append").table.append(pa.table({"k": [1], "v": [2.0]}))
    graph.run_cycle()
    with flightsql.connect(srv.location, autocommit=True) as conn, conn.cursor() as cur:
        for _ in range(3):
            cur.execute("SELECT sum(v) FROM t")
            assert cur.fetchall() == [(2.0,)]
        with pytest.raises(adbc_driver_manager.Error):
            cur.execute("SELECT 1 / 'x' FROM t")
    m = _scrape(srv.metrics_port)
    assert m[("ticktable_sql_queries_total", (("outcome", "ok"),))] == 3
    assert m[("ticktable_sql_queries_total", (("outcome", "error"),))] == 1
    assert m[("ticktable_sql_query_seconds_count", ())] == 4


def test_a_table_filled_before_it_takes_its_name_is_counted_under_that_name(served):
    """CREATE TABLE ... AS and a replacing ingest write into a table under a pending name
    first: their rows count under the table's own name, not one new series per statement."""
    import adbc_driver_flightsql.dbapi as flightsql

    graph, srv = served
    with flightsql.connect(srv.location, autocommit=True) as conn, conn.cursor() as cur:
        for _ in range(2):
            cur.adbc_ingest("loaded", pa.table({"k": [1, 2, 3], "v": [0.5] * 3}), mode="replace")
        graph.run_cycle()
        cur.execute("CREATE TABLE copy AS SELECT * FROM loaded WHERE k > 1")
    m = _scrape(srv.metrics_port)
    puts = {labels: v for (name, labels), v in m.items() if name == "ticktable_put_rows_total"}
    assert puts == {(("table", "loaded"),): 6, (("table", "copy"),): 2}


def test_the_sql_runner_s_held_bytes_and_narrow_passes_are_served(served, monkeypatch):
    import adbc_driver_flightsql.dbapi as flightsql

    from flight.sql import narrow

    monkeypatch.setattr(narrow, "MIN_ROWS", 64)  # a small table takes the narrow pass
    monkeypatch.setattr(narrow, "MIN_CAP", 4)
    monkeypatch.setattr(narrow, "NS_POSITION", 0.0)
    graph, srv = served
    n = 2000
    srv.registry.create_source("t", KV, "append").table.append(
        pa.table({"k": pa.array(range(n), pa.int64()), "v": pa.array([0.5] * n)}))
    graph.run_cycle()
    m = _scrape(srv.metrics_port)
    assert m[("ticktable_sql_held_bytes", (("what", "snapshots"),))] == 0
    assert m[("ticktable_sql_narrow_passes_total", (("outcome", "kept"),))] == 0
    with flightsql.connect(srv.location, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM t WHERE k % 100000 = 7")  # one row: kept
        assert cur.fetchall() == [(7, 0.5)]
        cur.execute("SELECT * FROM t WHERE k % 100000 > 3")  # past the cap: gave up
        assert len(cur.fetchall()) == n - 4
    m = _scrape(srv.metrics_port)
    assert m[("ticktable_sql_narrow_passes_total", (("outcome", "kept"),))] == 1
    assert m[("ticktable_sql_narrow_passes_total", (("outcome", "gave_up"),))] == 1
    assert m[("ticktable_sql_narrow_passes_total", (("outcome", "failed"),))] == 0
    assert m[("ticktable_sql_held_bytes", (("what", "snapshots"),))] >= n * 16  # t, kept
    assert m[("ticktable_sql_held_bytes", (("what", "positions"),))] >= n * 4
    assert tuple(srv.sql.runner.held()) == SQL_HELD  # the series served before the first call


def _until(test, timeout=15.0):
    """Whether ``test()`` held within ``timeout`` seconds (a link's state changes on its
    own thread, with backoff)."""
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _mirror(m, table):
    """A mirror's samples of a scrape, by short name."""
    return {"in_sync": m[("ticktable_mirror_in_sync", (("table", table),))],
            "out_of_sync_seconds": m[("ticktable_mirror_out_of_sync_seconds", (("table", table),))],
            "reconnects": m[("ticktable_mirror_reconnects_total", (("table", table),))],
            "deltas": m[("ticktable_mirror_resumes_total", (("kind", "deltas"), ("table", table)))],
            "snapshot": m[("ticktable_mirror_resumes_total",
                           (("kind", "snapshot"), ("table", table)))]}


def test_a_mirror_reports_whether_it_is_in_sync_its_reconnects_and_resumes(held_port):
    from clients.client import connect

    def origin(port=0):
        graph = UpdateGraph()
        srv = TicktableServer(graph, ServerConfig(port=port)).start()
        graph.start(0.02)
        tc = connect(srv.location)
        tc.create_table("t", KV, "keyed", keys=["k"])
        tc.push("t", pa.table({"k": pa.array([1, 2], pa.int64()), "v": [1.0, 2.0]}), "upsert")
        tc.close()
        return srv, graph

    a, a_graph = origin(held_port.port)  # held: free of others while no origin is up
    port, up = a.port, [(a, a_graph)]
    b_graph = UpdateGraph()
    b = TicktableServer(b_graph, ServerConfig(metrics_port=0)).start()
    b_graph.start(0.02)
    try:
        link = b.mirror(f"{a.location}/t=m")
        ghost = b.mirror(f"{a.location}/nosuch=ghost")  # never a table: counted all the same
        assert link.wait_in_sync(10)
        assert _until(lambda: ghost.state == "disconnected")
        assert "ghost" not in b.registry.names()
        m = _scrape(b.metrics_port)
        assert _mirror(m, "m") == {"in_sync": 1, "out_of_sync_seconds": 0, "reconnects": 0,
                                   "deltas": 0, "snapshot": 0}
        assert m[("ticktable_mirror_in_sync", (("table", "ghost"),))] == 0
        assert m[("ticktable_mirror_out_of_sync_seconds", (("table", "ghost"),))] > 0

        # the origin ends the stream: the link resumes with the deltas it missed
        for sub in a.subscriptions:
            sub.close()
        assert _until(lambda: link.resumed_with_deltas == 1 and link.in_sync)
        m = _mirror(_scrape(b.metrics_port), "m")
        assert (m["in_sync"], m["reconnects"], m["deltas"], m["snapshot"]) == (1, 1, 1, 0)

        # the origin goes: not in sync, and for longer at each scrape
        a.shutdown()
        a_graph.stop()
        up.clear()
        assert _until(lambda: not link.in_sync)
        first = _mirror(_scrape(b.metrics_port), "m")
        assert first["in_sync"] == 0
        assert _until(lambda: _mirror(_scrape(b.metrics_port), "m")["out_of_sync_seconds"]
                      > first["out_of_sync_seconds"] + 0.1)

        # a new origin on its port (a new epoch): back in sync from a snapshot
        up.append(origin(port))
        assert link.wait_in_sync(20)
        m = _mirror(_scrape(b.metrics_port), "m")
        assert m["in_sync"] == 1 and m["out_of_sync_seconds"] == 0
        assert m["reconnects"] >= 2 and (m["deltas"], m["snapshot"]) == (1, 1)
        st = b.stats()
        (row,) = [t for t in st.tables if t.name == "m"]
        assert (row.link.reconnects, row.link.resumed_with_deltas,
                row.link.resumed_with_snapshot) == (m["reconnects"], 1, 1)

        # a dropped mirror is no longer reported
        b.durability.drop_table("m")
        assert ("ticktable_mirror_in_sync", (("table", "m"),)) not in _scrape(b.metrics_port)
    finally:
        b.shutdown()
        b_graph.stop()
        for srv, graph in up:
            srv.shutdown()
            graph.stop()
