"""``ticktable serve`` as a real subprocess: it serves, ticks the demo, and stops cleanly;
a port in use ends it with one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.decoder import ReferenceView, read_message

ROOT = Path(__file__).resolve().parents[2]


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop a server as a service manager does (SIGTERM); its output, once it exited 0."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out, err


def _reap(proc: subprocess.Popen[str]) -> None:
    """Kill a server a failed test left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_serve_demo_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--demo",
         "--interval", "0.05", "--seed", "1", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        m = re.fullmatch(r"ticktable serving Flight at (grpc://[\d.]+:(\d+))\n", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        location, port = m.group(1), int(m.group(2))
        assert "board" in proc.stdout.readline()
        client = fl.connect(location)
        names = sorted(f.descriptor.path[0].decode() for f in client.list_flights())
        assert names == ["board", "quotes", "stats"]
        board = client.do_get(fl.Ticket(b"board")).read_pandas()
        assert list(board.columns) == ["Sym", "Bid", "Ask", "Size", "Spread"]
        assert board["Bid"].is_monotonic_decreasing and len(board) >= 1
        w, r = client.do_exchange(fl.FlightDescriptor.for_path("quotes"))
        import pyarrow as pa

        w.begin(pa.schema([]))
        w.write_metadata(pa.py_buffer(pb.ClientMessage(
            subscribe=pb.SubscriptionRequest(table="quotes")).SerializeToString()))
        view = ReferenceView(r.schema)
        for _ in range(4):  # the snapshot, then live deltas as the demo ticks
            view.apply(read_message(r))
        assert view.sequence >= 3 and view.to_arrow().num_rows >= 1
        w.done_writing()
        r.cancel()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:  # health: Flight's port
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        client.close()
        out, err = _stop(proc)
        assert "ticktable stopped" in out
    finally:
        _reap(proc)


def test_serve_demo_answers_nothing_before_its_tables_are_there(tmp_path):
    """The first answer, a health check's SERVING included, comes with the demo's three
    tables. A fresh clone's CI once saw SERVING and then only ``quotes``: the port was bound
    before ``board`` and ``stats`` were made (tests/ticktable/test_docker.py). Here their
    making is slowed by 1.5 s, so a health check polled from the start lands in that gap
    if it exists."""
    from bench.ports import HeldPort

    held = HeldPort()
    slow = ("import time, ticktable._demo as d; make = d.demo_tables; "
            "d.demo_tables = lambda q: (time.sleep(1.5), make(q))[1]; "
            "from ticktable.cli import main; raise SystemExit(main(__import__('sys').argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", slow, "serve", "--port", str(held.port), "--demo", "--in-memory",
         "--http-port", "-1", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        with grpc.insecure_channel(f"127.0.0.1:{held.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:  # what an orchestrator does: ask until SERVING
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "no SERVING in 60 s"
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    time.sleep(0.01)
                    continue
                if status.status == health_pb2.HealthCheckResponse.SERVING:
                    break
        with fl.connect(f"grpc://127.0.0.1:{held.port}") as client:
            names = sorted(f.descriptor.path[0].decode() for f in client.list_flights())
        assert names == ["board", "quotes", "stats"]
        _, err = _stop(proc)
    finally:
        _reap(proc)
        held.close()


def test_serve_help_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--help"],
                         capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    for opt in ("--host", "--port", "--token", "--tls-cert", "--tls-key", "--demo",
                "--data-dir", "--in-memory", "--read-token", "--metrics-port", "--log-format",
                "--cycle-priority", "--sql-timeout", "--sql-memory-mb", "--filter-linger",
                *LIMITS):
        assert opt in out
    assert "--grpc-port" not in out
    text = " ".join(out.split())  # argparse wraps lines
    assert ("Clients are held to the limits below (--max-*): message size, value size, "
            "columns per table, tables, subscriptions per client, staged bytes per write, "
            "writes waiting for a cycle." in text)
    assert "A request past one is refused with RESOURCE_EXHAUSTED" in text
    for opt, default in LIMITS.items():  # each states its default, ServerConfig's
        assert re.search(re.escape(opt) + r" N [^-]*\(default " + re.escape(default) + r"\)",
                         text), opt
    assert re.search(r"--put-wait SECONDS how long [^()]*\(default 2\)", text)


#: serve's limit flags and the defaults their help states (ServerConfig's own)
LIMITS = {"--max-message-bytes": "256 MiB", "--max-value-bytes": "64 MiB",
          "--max-columns": "4096", "--max-tables": "10000",
          "--max-subscriptions-per-client": "1000", "--max-staged-bytes-per-write": "1 GiB",
          "--max-pending-bytes": "256 MiB", "--put-window-bytes": "64 KiB"}


def test_the_stated_limit_defaults_are_the_servers():
    cfg = ServerConfig()
    assert (cfg.max_put_batch_bytes, cfg.max_value_bytes, cfg.max_columns, cfg.max_tables,
            cfg.max_subscriptions_per_client, cfg.max_staged_bytes_per_write,
            cfg.max_pending_bytes, cfg.put_wait, cfg.put_window_bytes) == (
        256 << 20, 64 << 20, 4096, 10_000, 1000, 1 << 30, 256 << 20, 2.0, 64 << 10)


def test_serve_limit_flags_reach_the_server(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--in-memory",
         "--max-tables", "1", "--max-columns", "2", "--max-value-bytes", "10",
         "--max-message-bytes", "100000", "--max-subscriptions-per-client", "5",
         "--max-staged-bytes-per-write", "1000", "--interval", "60",
         "--max-pending-bytes", "1", "--put-wait", "0", "--put-window-bytes", "32768"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        m = re.fullmatch(r"ticktable serving Flight at (grpc://[\d.]+:\d+)\n",
                         proc.stdout.readline())
        assert m, proc.stderr.read() if proc.poll() is not None else "no location"
        client = fl.connect(m.group(1))

        def create(name: str, schema: pa.Schema) -> None:
            list(client.do_action(fl.Action("create_table", pb.CreateTableRequest(
                name=name, schema=schema.serialize().to_pybytes()).SerializeToString())))

        with pytest.raises(pa.ArrowInvalid, match=r"table 'w' would have 3 columns, above the "
                                                  r"limit of 2 \(max_columns; ticktable serve "
                                                  r"--max-columns N\)"):
            create("w", pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.int64())]))
        schema = pa.schema([("s", pa.string())])
        create("t", schema)
        with pytest.raises(pa.ArrowInvalid, match=r"the server holds 1 tables, the limit of 1 "):
            create("u", schema)
        w, _ = client.do_put(fl.FlightDescriptor.for_path("t"), schema)
        with pytest.raises(pa.ArrowInvalid, match=r"column 's' holds a value of 11 bytes, above "
                                                  r"the limit of 10 "):
            w.write_batch(pa.record_batch({"s": ["x" * 11]}))
            w.close()
        # no cycle for 60 s: a second batch finds the first waiting, past a limit of 1 byte
        w, _ = client.do_put(fl.FlightDescriptor.for_path("t"), schema)
        with pytest.raises(pa.ArrowInvalid, match=r"table 't': \d+ bytes of writes wait for its "
                                                  r"next cycle .* past the limit of 1 "
                                                  r"\(max_pending_bytes; ticktable serve "
                                                  r"--max-pending-bytes N\), still over it "
                                                  r"after 0 s"):
            w.write_batch(pa.record_batch({"s": ["a"]}))
            w.write_batch(pa.record_batch({"s": ["b"]}))
            w.close()
        client.close()
        _, err = _stop(proc)
    finally:
        _reap(proc)
    bad = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--max-tables", "0"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert bad.returncode == 2 and "--max-tables: must be at least 1, got 0" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--filter-linger",
                          "-1"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert bad.returncode == 2 and "--filter-linger: must be a number of seconds" in bad.stderr


def test_serve_on_a_port_in_use_fails_with_one_line(tmp_path):
    with TicktableServer(UpdateGraph(), ServerConfig()) as running:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-m", "ticktable.cli", "serve", "--port", str(running.port),
             "--data-dir", str(tmp_path)],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert out.stderr.splitlines() == [
            f"ticktable serve: cannot listen on 127.0.0.1:{running.port}: the port is in use "
            f"or not allowed"], out.stderr
        assert out.stdout == ""
        assert fl.connect(running.location).list_actions()  # the first server is untouched


def test_serve_with_metrics_json_logs_and_a_read_token(tmp_path):
    import json
    import urllib.request

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--metrics-port", "0",
         "--log-format", "json", "--token", "full", "--read-token", "reader", "--in-memory"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        m = re.fullmatch(r"ticktable serving Flight at (grpc://[\d.]+:\d+)\n",
                         proc.stdout.readline())
        assert m
        metrics = re.fullmatch(r"metrics at (http://[\d.]+:\d+/metrics)\n",
                               proc.stdout.readline())
        assert metrics
        reader = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer reader")])
        client = fl.connect(m.group(1))
        assert list(client.list_flights(options=reader)) == []
        with pytest.raises(fl.FlightUnauthorizedError, match="read-only token"):
            list(client.do_action(fl.Action("drop_table", b""), options=reader))
        text = urllib.request.urlopen(metrics.group(1), timeout=10).read().decode()
        assert 'ticktable_errors_total{code="PERMISSION_DENIED"} 1.0' in text
        client.close()
        _, err = _stop(proc)
        lines = [json.loads(line) for line in err.splitlines() if line.strip()]
        denied = [r for r in lines if "PERMISSION_DENIED" in r["message"]]
        assert denied and denied[0]["logger"] == "ticktable.calls" and denied[0]["level"] == "INFO"
        assert "127.0.0.1" in denied[0]["message"] and "DoAction" in denied[0]["message"]
    finally:
        _reap(proc)


@pytest.mark.parametrize("args, env, line", [
    (["--port", "70000"], {}, "ticktable serve: port is 70000: a port is 0 (any free one) to "
                              "65535"),
    (["--port", "0", "--http-port", "99999"], {},
     "ticktable serve: http_port is 99999: a port is 0 (any free one) to 65535, or None for none"),
    ([], {"TICKTABLE_PORT": "abc"}, "ticktable: $TICKTABLE_PORT is 'abc', not an integer"),
    (["--port", "0"], {"TICKTABLE_HTTP_PORT": "x"},
     "ticktable: $TICKTABLE_HTTP_PORT is 'x', not an integer"),
])
def test_serve_with_a_bad_port_fails_with_one_line(args, env, line):
    _fails_with_one_line(args, env, line)


def test_serve_with_a_bad_file_address_or_period_fails_with_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    _fails_with_one_line(["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(afile)], {},
                         f"ticktable serve: cannot read --tls-cert {tmp_path / 'none.pem'}: No "
                         f"such file or directory")
    _fails_with_one_line(["--port", "0", "--data-dir", str(afile)], {},
                         f"ticktable serve: journal.sqlite: the data dir {afile} is a file, not a "
                         f"directory", in_memory=False)
    _fails_with_one_line(["--port", "0", "--host", "999.1.1.1"], {},
                         "ticktable serve: cannot listen on 999.1.1.1:0: the host '999.1.1.1' is "
                         "not an address (Name or service not known)")
    _fails_with_one_line(["--port", "0", "--host", "192.0.2.1"], {},  # TEST-NET-1: not ours
                         "ticktable serve: cannot listen on 192.0.2.1:0: Cannot assign requested "
                         "address (is 192.0.2.1 an address of this machine?)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--interval", "0"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == ("ticktable serve: error: argument --interval: must "
                                           "be a number of seconds above 0, got 0")


def _fails_with_one_line(args: list[str], env: dict[str, str], line: str, *,
                         in_memory: bool = True) -> None:
    args = ["--in-memory", *args] if in_memory else args
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [line], out.stderr
    assert out.stdout == ""


def _fifo_tasks(pid: int) -> list[int]:
    """The threads of process ``pid`` that run under SCHED_FIFO."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if os.sched_getscheduler(int(task.name)) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO:
                out.append(int(task.name))
        except ProcessLookupError:
            continue
    return out


@pytest.mark.parametrize("flags", [[], ["--cycle-priority", "normal"],
                                   ["--bounding-set=-sys_nice"]], ids=["default", "normal", "refused"])
def test_serve_cycle_priority(flags):
    """By default the cycle thread, and only it, runs real-time (when the process may: root
    here, or CAP_SYS_NICE); --cycle-priority normal leaves it normal; refused (no
    CAP_SYS_NICE, RLIMIT_RTPRIO 0) the server says so in one line and serves."""
    from tests.engine.test_priority import EXPECTED

    cmd = [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--in-memory",
           "--http-port", "-1", "--interval", "0.05"]
    if flags and flags[0].startswith("--bounding-set"):
        cmd = ["prlimit", "--rtprio=0:0", "setpriv", *flags, "--inh-caps=-sys_nice", *cmd]
        want = "normal"
    else:
        cmd += flags
        want = EXPECTED if not flags else "normal"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    try:
        m = re.fullmatch(r"ticktable serving Flight at (grpc://[\d.]+:\d+)\n",
                         proc.stdout.readline())
        assert m, proc.stderr.read() if proc.poll() is not None else "no location"
        lines = [proc.stdout.readline() for _ in range(2 if flags != ["--cycle-priority", "normal"] else 1)]
        assert lines[0] == "in memory: every table is gone when the server stops\n"
        if want == "realtime":
            assert lines[1] == "cycles every 0.05 s on a real-time thread (SCHED_FIFO)\n"
            assert len(_fifo_tasks(proc.pid)) == 1  # the cycle thread, no other
        else:
            assert not _fifo_tasks(proc.pid)
            if flags != ["--cycle-priority", "normal"]:
                assert lines[1] == ("cycles every 0.05 s on a normal thread: real-time needs root, "
                                    "CAP_SYS_NICE or ulimit -r >= 1 (other busy processes may "
                                    "delay a cycle)\n")
        client = fl.connect(m.group(1))  # and it serves
        assert list(client.list_flights()) == []
        client.close()
        out, err = _stop(proc)
        assert "Traceback" not in err
    finally:
        _reap(proc)
