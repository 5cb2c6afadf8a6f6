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
import subprocess
import sys
import time
from pathlib import Path

import ticktable as tt
from bench.ports import HeldPort

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


def test_dockerfile_is_small_and_non_root() -> None:
    ins = instructions()
    assert ins["FROM"].endswith("-slim")
    assert ins["USER"] == "ticktable"
    assert "spark" not in ins["RUN"]  # the server image carries no Spark/Java
    assert "useradd --system --uid 10001" in ins["RUN"]


def test_image_serves_everything_on_one_port() -> None:
    ins = instructions()
    env = image_env(ins["ENV"])
    assert ins["EXPOSE"].split() == [env["TICKTABLE_PORT"]] == ["8815"]
    assert not any("GRPC_PORT" in k for k in env)


def run_image(tmp_path: Path, extra_args: list[str], extra_env: dict[str, str]) -> None:
    """Run the image's command (plus ``extra_args``) and its health check until it passes;
    then read the demo tables and stop it with SIGTERM."""
    ins = instructions()
    argv = json.loads(ins["ENTRYPOINT"]) + json.loads(ins["CMD"]) + extra_args
    health = json.loads(ins["HEALTHCHECK"].split("CMD", 1)[1])
    assert argv[:2] == ["ticktable", "serve"] and health[0] == "ticktable"
    env = dict(os.environ, **image_env(ins["ENV"]))
    env.pop("TICKTABLE_TOKEN", None)
    assert env["TICKTABLE_DATA_DIR"] == "/data"  # the image's volume; here a temporary dir
    env["TICKTABLE_DATA_DIR"] = str(tmp_path / "data")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's ticktable
    assert env["TICKTABLE_HOST"] == "0.0.0.0"
    tls = "--tls-cert" in extra_args
    held, web = HeldPort(), HeldPort()  # for the server, which binds them after a while
    port = held.port
    # the web UI too: left alone it takes 8817, which another run of this test may hold
    env.update(TICKTABLE_PORT=str(port), TICKTABLE_HTTP_PORT=str(web.port), **extra_env)
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
        assert check.stdout.strip() == f"127.0.0.1:{port}: SERVING"
        uri = f"grpc+tls://127.0.0.1:{port}" if tls else f"grpc://127.0.0.1:{port}"
        with tt.connect(uri, tls=env.get("TICKTABLE_TLS_CA", False)) as client:
            assert client.tables() == ["board", "quotes", "stats"]
            assert len(client.snapshot("quotes")) >= 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        scheme = "grpc+tls" if tls else "grpc"
        assert out.splitlines()[0] == f"ticktable serving Flight at {scheme}://0.0.0.0:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        held.close()
        web.close()


def test_image_entrypoint_serves_and_its_healthcheck_passes(tmp_path: Path) -> None:
    run_image(tmp_path, [], {})


def test_image_healthcheck_passes_over_tls(tmp_path: Path) -> None:
    """``docker run ... ticktable --tls-cert ... --tls-key ...`` with ``TICKTABLE_TLS_CA``
    set (docker/README.md): the unchanged HEALTHCHECK trusts that certificate."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    run_image(tmp_path, ["--tls-cert", str(tmp_path / "cert.pem"),
                         "--tls-key", str(tmp_path / "key.pem")],
              {"TICKTABLE_TLS_CA": str(tmp_path / "cert.pem")})
