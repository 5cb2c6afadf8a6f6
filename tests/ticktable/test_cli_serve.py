"""``ticktable serve`` as a real subprocess: it serves, ticks the demo, and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pyarrow.flight as fl
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flight.decoder import ReferenceView, read_message
from flight.pb import flight_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def test_serve_demo_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ticktable.cli", "serve", "--port", "0", "--grpc-port", "0",
         "--demo", "--interval", "0.05", "--seed", "1", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        m = re.match(r"ticktable serving Flight at (grpc://[\d.]+:\d+), TableService on port (\d+)",
                     line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        location, grpc_port = m.group(1), int(m.group(2))
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
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "ticktable stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_help_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--help"],
                         capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    for opt in ("--host", "--port", "--token", "--tls-cert", "--tls-key", "--demo",
                "--data-dir", "--in-memory"):
        assert opt in out
