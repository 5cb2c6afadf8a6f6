"""``ticktable ls / push / tail / health`` as real subprocesses against a real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

ROOT = Path(__file__).resolve().parents[2]
ROWS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("TICKTABLE_TOKEN", "TICKTABLE_TLS_CA", "TICKTABLE_PORT", "GRPC_VERBOSITY"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "ticktable.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture
def running() -> Iterator[TicktableServer]:
    graph = UpdateGraph()
    graph.start(0.02)
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    srv.shutdown()
    graph.stop()


def data(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids], "x": ids * 0.5}, schema=ROWS)


def test_push_each_file_format_then_ls(running: TicktableServer, tmp_path: Path) -> None:
    uri = running.location
    pq.write_table(data(250_000), tmp_path / "a.parquet", row_group_size=50_000)
    pcsv.write_csv(data(1000, 250_000), tmp_path / "b.csv")
    feather.write_feather(data(500, 251_000), tmp_path / "c.arrow")
    for name in ("a.parquet", "b.csv", "c.arrow"):
        out = cli("push", str(tmp_path / name), "events", "--uri", uri)
        assert out.returncode == 0, out.stderr
        assert re.search(r"pushed \d+ rows into 'events' \(append\) .* visible at step \d+",
                         out.stdout), out.stdout
    assert "250k/250k" in cli("push", str(tmp_path / "a.parquet"), "copy", "--uri",
                              uri).stderr  # the progress bar knows a Parquet file's size
    table = running.registry.get("events").table.to_arrow()
    assert table.num_rows == 251_500
    assert table.column("id").to_pylist() == list(range(251_500))
    assert table.column("name")[250_010].as_py() == "n250010"

    keyed = data(10).set_column(2, "x", pa.array(np.full(10, 7.0)))
    pq.write_table(keyed, tmp_path / "k.parquet")
    for _ in range(2):  # an upsert twice: keyed, so no duplicates
        out = cli("push", str(tmp_path / "k.parquet"), "latest", "--keys", "id", "--uri", uri,
                  "--quiet")
        assert out.returncode == 0 and "(upsert)" in out.stdout, out.stderr
        assert out.stderr == ""
    assert running.registry.get("latest").table.to_arrow().column("x").to_pylist() == [7.0] * 10
    # into the keyed table that now exists, without --keys or --mode: upserted, not refused
    out = cli("push", str(tmp_path / "k.parquet"), "latest", "--uri", uri, "--quiet")
    assert out.returncode == 0 and "(upsert)" in out.stdout, out.stderr
    assert running.registry.get("latest").table.size == 10

    out = cli("ls", "--uri", uri)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:-1]}
    assert lines["events"][1:3] == ["append", "251500"]
    assert lines["latest"][1:3] == ["keyed", "10"]
    assert out.stdout.splitlines()[-1].startswith("step ")


def test_commands_fail_with_one_clear_line(running: TicktableServer, tmp_path: Path) -> None:
    out = cli("push", str(tmp_path / "missing.parquet"), "t", "--uri", running.location)
    assert out.returncode == 1 and "no file" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "x.json").write_text("{}")
    out = cli("push", str(tmp_path / "x.json"), "t", "--uri", running.location)
    assert out.returncode == 1 and "cannot tell the format" in out.stderr
    out = cli("tail", "nope", "--uri", running.location, "--count", "1")
    assert out.returncode == 1 and "no table 'nope'" in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr  # not also the live table's log line
    pq.write_table(data(3), tmp_path / "d.parquet")
    running.registry.create_source("typed", pa.schema([("id", pa.int64()), ("name", pa.int64()),
                                                       ("x", pa.float64())]), "append")
    out = cli("push", str(tmp_path / "d.parquet"), "typed", "--uri", running.location, "-q")
    assert out.returncode == 1 and "cannot convert" in out.stderr, out.stderr
    assert running.registry.get("typed").table.size == 0
    dead = "grpc://127.0.0.1:1"
    out = cli("ls", "--uri", dead)
    assert out.returncode == 1 and "cannot reach a server" in out.stderr, out.stderr


def test_tail_shows_the_newest_rows_and_the_rate(running: TicktableServer) -> None:
    table = running.registry.create_source("ticks", ROWS, "append").table
    stop = threading.Event()

    def feed() -> None:
        i = 0
        while not stop.wait(0.03):
            table.append(data(5, i))  # type: ignore[attr-defined]
            i += 5

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        out = cli("tail", "ticks", "--uri", running.location, "-n", "4", "--count", "6",
                  "--interval", "0.05", "--plain", "--columns", "id,x")
    finally:
        stop.set()
        t.join()
    assert out.returncode == 0, out.stderr
    heads = re.findall(r"ticks: (\d+) rows, step \d+, ([\d.]+) updates/s, ([\d,]+) rows/s",
                       out.stdout)
    assert len(heads) == 6, out.stdout
    sizes = [int(h[0]) for h in heads]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert float(heads[-1][1]) > 0
    blocks = out.stdout.split("ticks: ")[1:]
    last = blocks[-1].splitlines()
    assert last[1].split() == ["id", "x"]
    ids = [int(line.split()[0]) for line in last[2:]]
    assert len(ids) == 4 and ids == list(range(ids[0], ids[0] + 4))
    assert ids[-1] >= sizes[-1] - 10  # the newest rows, not the first ones


def test_health_loads_neither_the_engine_nor_the_clients(running: TicktableServer) -> None:
    # the container's HEALTHCHECK runs it every 10 s: it took 1.2 s of CPU when the package
    # imported every client and the engine (pandas, pyarrow, numpy) first
    heavy = ("pandas", "pyarrow", "numpy", "engine.graph", "clients.client", "flight.server",
             "duckdb")
    code = (f"import sys\nfrom ticktable.cli import main\n"
            f"rc = main(['health', '--port', '{running.port}'])\n"
            f"print(rc, sorted(m for m in {heavy!r} if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"127.0.0.1:{running.port}: SERVING", "0 []"]


def test_health_command(running: TicktableServer) -> None:
    out = cli("health", "--port", str(running.port))  # health shares Flight's port
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"127.0.0.1:{running.port}: SERVING\n"
    out = cli("health", "--port", "1")
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.startswith("ticktable health: 127.0.0.1:1: UNAVAILABLE")
    assert len(out.stderr.splitlines()) == 1, out.stderr


def _self_signed(d: Path, san: str) -> Path:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=ticktable-test", "-addext", f"subjectAltName={san}",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return d / "cert.pem"


def _one_line_failure(out: subprocess.CompletedProcess[str], port: int, code: str) -> None:
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr.startswith(f"ticktable health: 127.0.0.1:{port}: {code}"), out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_health_command_over_tls(tmp_path: Path) -> None:
    cert = _self_signed(tmp_path, "DNS:localhost,IP:127.0.0.1")
    graph = UpdateGraph()
    cfg = ServerConfig(token="t0k", tls_cert=cert.read_bytes(),
                       tls_key=(tmp_path / "key.pem").read_bytes())
    with TicktableServer(graph, cfg) as srv:
        port = str(srv.port)
        serving = f"127.0.0.1:{port}: SERVING\n"
        for extra in ([], ["--token", "t0k"]):  # health needs no token; sending one is fine
            out = cli("health", "--port", port, "--tls-ca", str(cert), *extra)
            assert out.returncode == 0 and out.stdout == serving, out.stderr
        out = cli("health", "--port", port, "--tls-server-name", "localhost",
                  "--tls-ca", str(cert))
        assert out.returncode == 0 and out.stdout == serving, out.stderr
        _one_line_failure(cli("health", "--port", port), srv.port, "UNAVAILABLE")  # plain
        # --tls trusts the system's roots, which do not include a self-signed certificate
        _one_line_failure(cli("health", "--port", port, "--tls"), srv.port, "UNAVAILABLE")


def test_health_command_with_a_certificate_for_another_name(tmp_path: Path) -> None:
    """A certificate naming the host a container is reached by, checked on 127.0.0.1."""
    cert = _self_signed(tmp_path, "DNS:ticktable.example")
    cfg = ServerConfig(tls_cert=cert.read_bytes(), tls_key=(tmp_path / "key.pem").read_bytes())
    with TicktableServer(UpdateGraph(), cfg) as srv:
        port = str(srv.port)
        _one_line_failure(cli("health", "--port", port, "--tls-ca", str(cert)), srv.port,
                          "UNAVAILABLE")
        out = cli("health", "--port", port, "--tls-ca", str(cert),
                  "--tls-server-name", "ticktable.example")
        assert out.returncode == 0 and out.stdout == f"127.0.0.1:{port}: SERVING\n", out.stderr
        _one_line_failure(cli("health", "--port", port, "--tls-server-name", "ticktable.example"),
                          srv.port, "--tls-server-name needs --tls or --tls-ca")
        _one_line_failure(cli("health", "--port", port, "--tls-ca", str(tmp_path / "none.pem")),
                          srv.port, "cannot read --tls-ca")
