"""The server image's exact commands, run as processes (Docker itself does not run here).

The ``ENTRYPOINT`` + ``CMD`` and the ``HEALTHCHECK`` command are parsed from
``docker/Dockerfile`` and run with the image's ``ENV`` (ports swapped for free ones, which the
image reads from the same variables), so a change to the Dockerfile is tested as written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ticktable as tt

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def instructions() -> dict[str, str]:
    """Each instruction's argument (continuation lines joined; the last one of a kind wins)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out[word.upper()] = out.get(word.upper(), "") + " " + rest if word.upper() == "ENV" \
                else rest
    return out


def image_env(env_line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(env_line))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dockerfile_is_small_and_non_root() -> None:
    ins = instructions()
    assert ins["FROM"].endswith("-slim")
    assert ins["USER"] == "ticktable"
    assert "spark" not in ins["RUN"]  # the server image carries no Spark/Java
    assert "useradd --system --uid 10001" in ins["RUN"]


def test_image_entrypoint_serves_and_its_healthcheck_passes(tmp_path: Path) -> None:
    ins = instructions()
    argv = json.loads(ins["ENTRYPOINT"]) + json.loads(ins["CMD"])
    health = json.loads(ins["HEALTHCHECK"].split("CMD", 1)[1])
    assert argv[:2] == ["ticktable", "serve"] and health[0] == "ticktable"
    env = dict(os.environ, **image_env(ins["ENV"]))
    flight_port, grpc_port = free_port(), free_port()
    env.update(TICKTABLE_PORT=str(flight_port), TICKTABLE_GRPC_PORT=str(grpc_port))
    assert env["TICKTABLE_DATA_DIR"] == "/data"  # the image's volume; here a temporary dir
    env["TICKTABLE_DATA_DIR"] = str(tmp_path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's ticktable
    assert env["TICKTABLE_HOST"] == "0.0.0.0"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/")
    try:
        deadline = time.monotonic() + 30
        while True:  # what Docker does: run the health check until it passes
            check = subprocess.run(health, env=env, capture_output=True, text=True, timeout=30)
            if check.returncode == 0:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, check.stderr
            time.sleep(0.2)
        assert "SERVING" in check.stdout
        with tt.connect(f"127.0.0.1:{flight_port}") as client:
            assert client.tables() == ["board", "quotes", "stats"]
            assert len(client.snapshot("quotes")) >= 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert f"serving Flight at grpc://0.0.0.0:{flight_port}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
