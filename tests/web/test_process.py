"""The web UI runs in a process of its own, below the server, and goes with the server."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

import ticktable as tt
from engine.errors import PortInUse
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

ROOT = Path(__file__).resolve().parents[2]


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sched", ["idle", "nice"])
def test_the_web_ui_runs_in_its_own_process_below_the_server(sched):
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(http_port=0, web_sched=sched)).start()
    try:
        assert server.web is not None
        pid = server.web.pid
        assert pid is not None and pid != os.getpid() and _alive(pid)
        src = server.registry.create_source("t", pa.schema([("k", pa.int64())]), "append")
        src.table.append(pa.table({"k": [1, 2, 3]}))
        graph.run_cycle()
        listing = json.loads(urllib.request.urlopen(server.web.url + "api/tables",
                                                    timeout=10).read())
        assert [(t["name"], t["rows"]) for t in listing["tables"]] == [("t", 3)]
        assert listing["step"] == graph.step
        threads = _threads(pid)
        assert len(threads) > 1  # the HTTP loop and Perspective's engine too
        for tid in threads:
            if sched == "idle":
                assert os.sched_getscheduler(tid) == os.SCHED_IDLE
            else:
                assert os.getpriority(os.PRIO_PROCESS, tid) == 19
        # the server's own threads keep their priority
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        server.shutdown()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_web_port_in_use_is_one_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        with pytest.raises(PortInUse, match=rf"cannot serve the web UI on 127.0.0.1:{port}: "
                                            rf".*\(--http-port -1 turns it off\)$"):
            TicktableServer(UpdateGraph(), ServerConfig(http_port=port)).start()
    finally:
        s.close()


def test_the_web_process_ends_when_the_server_is_killed():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--in-memory",
         "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the server ended before printing the web UI's address"
            m = re.match(r"web UI at (\S+)", line)
            url = m.group(1) if m else None
        assert url is not None
        children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split()]
        assert len(children) == 1
        child = children[0]
        assert urllib.request.urlopen(url + "api/tables", timeout=10).status == 200
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the web process outlived its killed server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_a_web_process_that_dies_is_started_again_on_the_same_port():
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(http_port=0, metrics_port=0)).start()
    try:
        assert server.web is not None
        first, url = server.web.pid, server.web.url
        assert first is not None
        client = tt.connect(server.location)
        assert client.stats().attrs["web"] == {"url": url, "running": True, "pid": first,
                                               "restarts": 0, "open_tables": 0}
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (server.web.restarts == 0 or server.web.pid == first) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.web.restarts == 1 and server.web.pid != first
        assert server.web.url == url
        listing = json.loads(urllib.request.urlopen(url + "api/tables", timeout=10).read())
        assert listing["tables"] == []
        # what a user sees: stats, ``ticktable ls`` and the metrics say it was restarted
        assert client.stats().attrs["web"] == {"url": url, "running": True,
                                               "pid": server.web.pid, "restarts": 1,
                                               "open_tables": 0}
        ls = subprocess.run([sys.executable, "-m", "ticktable.cli", "ls", "--uri",
                             server.location], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
        assert ls.returncode == 0, ls.stderr
        assert ls.stdout.splitlines() == [
            "no tables", f"web UI at {url}: running (pid {server.web.pid}), 0 table(s) open, "
                         f"1 restart(s)"]
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        assert {"ticktable_web_up 1.0", "ticktable_web_restarts_total 1.0",
                "ticktable_web_open_tables 0.0"} <= set(metrics.splitlines())
        server.web.close()  # now it is down for good
        assert client.stats().attrs["web"]["running"] is False
        client.close()
    finally:
        server.shutdown()


def test_the_web_process_logs_through_the_servers_handlers(caplog):
    """Its records reach the server's logging (one stream, the server's format)."""
    import logging

    with caplog.at_level(logging.INFO):
        server = TicktableServer(UpdateGraph(), ServerConfig(http_port=0)).start()
        try:
            assert server.web is not None and server.web.wait_ready(60)
            pid, url = server.web.pid, server.web.url
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not [
                    r for r in caplog.records if r.name == "flight.web.child"]:
                time.sleep(0.05)
        finally:
            server.shutdown()
    lines = [r.getMessage() for r in caplog.records if r.name == "flight.web.child"]
    assert lines == [f"web process {pid} serves the page at {url}"], lines
    assert pid != os.getpid()


def test_a_refused_page_request_is_logged_at_info_not_warning(caplog):
    """A browser before its login, a missing file: answered requests, like the Flight side's
    ``ticktable.calls`` lines (tornado's default puts every 4xx at WARNING)."""
    import logging
    import urllib.error

    with caplog.at_level(logging.INFO):
        server = TicktableServer(UpdateGraph(), ServerConfig(http_port=0, token="t0k")).start()
        try:
            assert server.web is not None and server.web.wait_ready(60)
            for path in ("api/tables", "no/such/page"):
                with pytest.raises(urllib.error.HTTPError):
                    urllib.request.urlopen(server.web.url + path, timeout=10)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(
                    [r for r in caplog.records if r.name == "tornado.access"]) < 2:
                time.sleep(0.05)
        finally:
            server.shutdown()
    access = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records
              if r.name == "tornado.access"]
    assert access == [("INFO", "401 GET /api/tables"), ("INFO", "404 GET /no/such/page")], access
