"""``ticktable sql`` against ``ticktable serve`` (both real subprocesses), and serve's SQL flags."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from google.protobuf import any_pb2

import ticktable as tt
from flight.pb import flight_sql_pb2 as fsql
from flight.server import ServerConfig

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("TICKTABLE_TOKEN", "TICKTABLE_URI", "TICKTABLE_PORT", "GRPC_VERBOSITY"):
        out.pop(var, None)
    return out


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ticktable.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)


@pytest.fixture(scope="module")
def uri() -> Iterator[str]:
    """A ``ticktable serve`` subprocess (in memory, any free port) with a ``trades`` table."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--in-memory",
         "--http-port", "-1", "--interval", "0.02", "--cycle-priority", "normal",
         "--sql-timeout", "7.5", "--sql-memory-mb", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        m = re.fullmatch(r"ticktable serving Flight at (grpc://[\d.]+:\d+)\n",
                         proc.stdout.readline())
        assert m, proc.stderr.read() if proc.poll() is not None else "no location"
        with tt.connect(m.group(1)) as client:
            client.push("trades", pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                                            "sym": ["A", "B", "A"], "px": [10.0, 61.5, 99.0]}),
                        keys=["id"])
        yield m.group(1)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sql_prints_the_rows(uri: str) -> None:
    out = cli("sql", "--uri", uri, "SELECT sym, px FROM trades WHERE px > 50 ORDER BY px")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["sym   px", "  B 61.5", "  A 99.0", ""]
    assert out.stderr == ""
    empty = cli("sql", "--uri", uri, "SELECT id FROM trades WHERE px < 0")
    assert (empty.returncode, empty.stdout) == (0, "(no rows: id)\n")


def test_sql_runs_the_statements_on_stdin(uri: str) -> None:
    script = ("INSERT INTO trades VALUES (4, 'C', 12.5);\n"
              "SELECT id FROM trades WHERE sym = 'C';\n"
              "DELETE FROM trades WHERE id = 4;\n")
    out = cli("sql", "--uri", uri, stdin=script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == [" count", "     1", "", " id", "  4", "", " count", "     1",
                                      ""]
    lines = cli("sql", "--uri", uri, "-", stdin="SELECT 1 AS a\n\nSELECT 2 AS b\n")
    assert lines.stdout.split() == ["a", "1", "b", "2"], lines.stderr


def test_a_bad_query_exits_1_with_one_line(uri: str) -> None:
    # the status and the server's words, not pyarrow's "Flight returned ... error, with message:"
    for query, message in (("SELECT id\nFROM trades WHERE WHERE",
                            "ticktable: INVALID_ARGUMENT: SQL syntax error at line 2, column "),
                           ("SELECT * FROM nope", "ticktable: NOT_FOUND: no table 'nope'; tables: ")):
        out = cli("sql", "--uri", uri, query)
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr
    # the first failing statement stops the rest, and is named
    out = cli("sql", "--uri", uri, stdin="SELECT 1 AS a; SELECT * FROM nope; SELECT 3 AS c")
    assert out.returncode == 1 and out.stdout.split() == ["a", "1"]
    assert out.stderr.startswith("ticktable: statement 2 of 3: NOT_FOUND: no table 'nope'; ")
    assert out.stderr.count("\n") == 1, out.stderr
    for args, stdin in (((), " ;\n"), ((" ",), None)):
        nothing = cli("sql", "--uri", uri, *args, stdin=stdin)
        assert (nothing.returncode, nothing.stderr) == (
            1, "ticktable: no SQL statement given (pass QUERY, or statements on stdin)\n")


def test_an_unreachable_server_is_one_line() -> None:
    out = cli("sql", "--uri", "grpc://127.0.0.1:1", "SELECT 1")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert out.stderr == ("ticktable: cannot reach a server at grpc://127.0.0.1:1 (failed to connect: "
                          "Connection refused); start one with 'ticktable serve' or pass --uri\n")


def test_serve_sql_flags_reach_the_server(uri: str) -> None:
    holder = any_pb2.Any()
    holder.Pack(fsql.CommandGetSqlInfo(info=[fsql.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT]))
    client = fl.connect(uri)
    info = client.get_flight_info(fl.FlightDescriptor.for_command(holder.SerializeToString()))
    got = client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
    assert [r["value"] for r in got] == [7500]  # milliseconds
    with tt.connect(uri) as c:
        limit = c.sql("SELECT current_setting('memory_limit') AS m")["m"].tolist()
    assert limit == ["286.1 MiB"]  # 300 MB: DuckDB reads MB as 1000^2 bytes


def test_serve_refuses_bad_sql_flags() -> None:
    for flag, value in (("--sql-timeout", "0"), ("--sql-memory-mb", "0")):
        out = cli("serve", "--port", "0", "--in-memory", flag, value)
        assert out.returncode == 2
        assert re.search(rf"argument {flag}: must be .*{value}", out.stderr.splitlines()[-1])


def test_serve_help_states_the_servers_sql_defaults() -> None:
    text = " ".join(cli("serve", "--help").stdout.split())  # argparse wraps lines
    cfg = ServerConfig()
    assert f"DEADLINE_EXCEEDED (default {cfg.sql_timeout:g})" in text
    assert f"RESOURCE_EXHAUSTED (default {cfg.sql_memory_mb})" in text
