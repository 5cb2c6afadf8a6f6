"""A second Flight SQL client nobody here wrote: InfluxData's ``flightsql-dbapi`` (pure
Python over ``pyarrow.flight``, with a PEP 249 DB-API).

It runs in a process of its own: its generated ``flight_sql`` protobuf module registers
the same message names as the server's (``arrow.flight.protocol.sql.*``), and protobuf
keeps one of each per process. The script prints what each call answered, as JSON.

What it found: its ``execute_update`` reads the ``DoPutUpdateResult`` before it closes its
side of the DoPut, and the server answered a ``CommandStatementUpdate`` only once the
client had closed, so each statement waited for the call's deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

TOKEN = "full-token"

SCRIPT = r'''
import json, sys
import pyarrow as pa
from flightsql import FlightSQLClient, TableRef, connect

host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = FlightSQLClient(host=host, port=port, insecure=True, token=token, metadata={})
out = {}

def rows(info):
    return client.do_get(info.endpoints[0].ticket).read_all().to_pylist()

out["create"] = client.execute_update(
    "CREATE TABLE t (k BIGINT PRIMARY KEY, n BIGINT, s VARCHAR NOT NULL)")
out["insert"] = client.execute_update("INSERT INTO t VALUES (1, 0, 'a'), (2, 0, 'b'), (3, 0, 'c')")
out["update"] = client.execute_update("UPDATE t SET n = n + k WHERE k >= 2")
out["delete"] = client.execute_update("DELETE FROM t WHERE k = 3")
try:
    client.execute_update("INSERT INTO t VALUES (9, 9, NULL)")
except Exception as exc:
    out["refused"] = str(exc)
out["select"] = rows(client.execute("SELECT * FROM t ORDER BY k"))
out["tables"] = [r["table_name"] for r in rows(client.get_tables(include_schema=True))]
out["keys"] = [r["column_name"] for r in rows(client.get_primary_keys(TableRef(table="t")))]
out["schemas"] = rows(client.get_db_schemas())
with client.prepare("SELECT s FROM t WHERE k = ?") as stmt:
    out["prepared"] = rows(stmt.execute(pa.record_batch({"k": [2]})))
conn = connect(client)
cur = conn.cursor()
cur.execute("SELECT k, n FROM t WHERE k > ? ORDER BY k", [0])
out["dbapi"] = [list(r) for r in cur.fetchall()]
out["description"] = [d[0] for d in cur.description]
cur.executemany("INSERT INTO t VALUES (?, ?, ?)", [(10, 1, "x"), (11, 2, "y")])
cur.execute("CREATE VIEW per_n AS SELECT n, count(*) AS c FROM t GROUP BY n")
cur.execute("SELECT * FROM per_n ORDER BY n")
out["view"] = [list(r) for r in cur.fetchall()]
print(json.dumps(out))
'''


@pytest.fixture
def server() -> Iterator[TicktableServer]:
    graph = UpdateGraph(validate=True)
    srv = TicktableServer(graph, ServerConfig(token=TOKEN)).start()
    graph.start(0.02)
    yield srv
    srv.shutdown()
    graph.stop()


def test_flightsql_dbapi_creates_writes_reads_and_makes_a_view(server):
    host, port = server.location.removeprefix("grpc://").rsplit(":", 1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not our pb modules
    done = subprocess.run([sys.executable, "-c", SCRIPT, host, port, TOKEN], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["create"], out["insert"], out["update"], out["delete"]) == (0, 3, 2, 1)
    assert "column 's' is NOT NULL" in out["refused"] and "Traceback" not in out["refused"]
    assert out["select"] == [{"k": 1, "n": 0, "s": "a"}, {"k": 2, "n": 2, "s": "b"}]
    assert out["tables"] == ["t"] and out["keys"] == ["k"]
    assert out["schemas"] == [{"catalog_name": None, "db_schema_name": "main"}]
    assert out["prepared"] == [{"s": "b"}]
    assert out["dbapi"] == [[1, 0], [2, 2]] and out["description"] == ["k", "n"]
    assert out["view"] == [[0, 1], [1, 1], [2, 2]]  # n=0: k 1; n=1: k 10; n=2: k 2 and 11
