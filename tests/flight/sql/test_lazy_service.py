"""The server builds its Flight SQL service on first use: plain Flight (DoPut, DoGet, a
subscription, ListFlights, actions) never imports sqlglot or DuckDB; the first Flight SQL
call builds the service (counted by the metrics), and a durable server whose journal holds a
SQL view builds it to recover the view. Each run in a fresh interpreter, whose imports are
the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PLAIN_THEN_SQL = '''
import json, sys, time
import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as fl
from clients.client import connect
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

SQL = ("duckdb", "sqlglot", "flight.sql.service")
loaded = lambda: sorted(m for m in SQL if m in sys.modules)
out = {}
graph = UpdateGraph(validate=True)
srv = TicktableServer(graph, ServerConfig(port=0)).start()
graph.start(0.02)
try:
    out["started"] = loaded()
    with connect(srv.location) as c:
        c.create_table("t", pa.schema([("k", pa.int64()), ("v", pa.float64())]), "keyed",
                       keys=["k"])
        c.push("t", pa.table({"k": [1, 2, 3], "v": [0.5, 1.5, 2.5]}))
        deadline = time.monotonic() + 30
        while len(c.snapshot("t")) < 3:  # a cycle applies the push
            assert time.monotonic() < deadline
            time.sleep(0.01)
        live = c.subscribe("t")
        assert live.wait_for(timeout=30)
        out["subscribed_rows"] = len(live.df)
        live.close()
    flights = [f.descriptor.path for f in fl.FlightClient(srv.location).list_flights()]
    out["listed"] = [p[0].decode() for p in flights]
    out["after_plain_flight"] = loaded()
    with flightsql.connect(srv.location, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT sum(v) AS s FROM t WHERE k >= 2")
        out["sum"] = cur.fetchall()[0][0]
    out["after_sql"] = loaded()
    out["metrics_runner"] = srv.metrics.sql_runner is srv.sql.runner
finally:
    srv.shutdown()
    graph.stop()
print(json.dumps(out))
'''

RECOVER_VIEW = '''
import json, sys
from pathlib import Path
import pyarrow as pa
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

data, step = sys.argv[1], sys.argv[2]
out = {}
graph = UpdateGraph()
srv = TicktableServer(graph, ServerConfig(port=0, data_dir=Path(data))).start()
try:
    if step == "make":
        import adbc_driver_flightsql.dbapi as flightsql
        from clients.client import connect
        graph.start(0.02)
        with connect(srv.location) as c:
            c.create_table("t", pa.schema([("k", pa.int64()), ("v", pa.float64())]), "keyed",
                           keys=["k"])
            c.push("t", pa.table({"k": [1, 2, 3], "v": [0.5, 1.5, 2.5]}))
        with flightsql.connect(srv.location, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE VIEW big AS SELECT k, v FROM t WHERE v > 1")
    else:
        out["loaded_by_recovery"] = "flight.sql.service" in sys.modules  # no call came
        out["view_rows"] = srv.registry.get("big").table.to_arrow().sort_by("k").to_pylist()
        out["metrics_runner"] = srv.metrics.sql_runner is srv.sql.runner
finally:
    srv.shutdown()
    graph.stop()
print(json.dumps(out))
'''


def _run(script: str, *args: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_plain_flight_leaves_the_sql_engine_unloaded_until_the_first_sql_call():
    out = _run(PLAIN_THEN_SQL)
    assert out["started"] == [] and out["after_plain_flight"] == []
    assert out["subscribed_rows"] == 3 and "t" in out["listed"]  # type: ignore[operator]
    assert out["sum"] == 4.0  # the first Flight SQL call built the service and ran
    assert out["after_sql"] == ["duckdb", "flight.sql.service", "sqlglot"]
    assert out["metrics_runner"] is True


def test_a_journaled_view_builds_the_service_at_recovery(tmp_path):
    data = str(tmp_path / "data")
    assert _run(RECOVER_VIEW, data, "make") == {}
    out = _run(RECOVER_VIEW, data, "recover")
    assert out["loaded_by_recovery"] is True
    assert out["view_rows"] == [{"k": 2, "v": 1.5}, {"k": 3, "v": 2.5}]
    assert out["metrics_runner"] is True
