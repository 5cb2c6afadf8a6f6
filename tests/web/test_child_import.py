"""The web process imports the ``flight`` package its server runs, whatever the working
directory holds (issue #35): ``ticktable serve`` started in a folder with another ``flight``
package still serves the page."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the venv's console script (``make`` installs it), as a user starts the server
TICKTABLE = Path(sys.executable).parent / "ticktable"


def _unbuilt_checkout(folder: Path) -> None:
    """A ticktable checkout whose front-end is not built: its page answers 503."""
    shutil.copytree(ROOT / "flight", folder / "flight",
                    ignore=shutil.ignore_patterns("static", "__pycache__"))


def _foreign_package(folder: Path) -> None:
    """Some other project's package of that name."""
    (folder / "flight").mkdir()
    (folder / "flight" / "__init__.py").write_text(
        'raise ImportError("a decoy flight package, not ticktable\'s")\n')


@pytest.mark.parametrize("decoy", [_unbuilt_checkout, _foreign_package],
                         ids=["unbuilt-checkout", "foreign-package"])
def test_serve_in_a_folder_with_another_flight_package_serves_the_page(tmp_path, decoy):
    assert TICKTABLE.exists(), f"no console script at {TICKTABLE}: run 'make'"
    decoy(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the server runs this checkout's flight
    proc = subprocess.Popen(
        [str(TICKTABLE), "serve", "--port", "0", "--in-memory", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line, "the server ended before printing the web UI's address"
            m = re.match(r"web UI at (\S+)", line)
            url = m.group(1) if m else None
        with urllib.request.urlopen(url, timeout=30) as resp:
            status, page = resp.status, resp.read().decode()
        assert status == 200
        assert "<title>Ticktable</title>" in page
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "decoy" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
