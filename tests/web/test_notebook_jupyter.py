"""A notebook in a real JupyterLab (from PyPI), in Chromium: its grids tick after a push.

The test process serves a Ticktable server on 127.0.0.1 and starts ``jupyter lab`` (no
browser, a held port, a token; its config, data, runtime, settings and workspaces under
the test's tmp dir, so nothing is written outside it; the venv's lab extensions stay
visible). The notebook's cells are the README's notebook lines as written (the server's
URI swapped in), after a cell connecting the ``client`` the README's earlier lines made.
Chromium runs all cells; once both grids (``tt.show`` and a ``LiveTable`` as a cell's
value) show the table, the test process (another process than the kernel) pushes a
change (a modify, an add, then a delete) and the grids' cells must show it. Screenshots before and after go to
``test-artifacts/``. JupyterLab and its kernel are shut down through the server's API.

jupyterlab, ipykernel, ipywidgets and anywidget come with the ``dev`` extra: missing, the
test fails saying what to install, never skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import ticktable as tt
from bench.ports import HeldPort
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer
from tests.web.conftest import ARTIFACTS, open_page

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOKEN = "ticktable-notebook-test"

#: Every ``<regular-table>`` in the page's grids, in document order: each grid's body
#: rows as on screen (perspective-viewer keeps its datagrid in shadow roots).
GRIDS = """() => {
  const grids = [];
  for (const viewer of document.querySelectorAll("perspective-viewer")) {
    const found = [];
    const walk = (root) => {
      for (const el of root.querySelectorAll("*")) {
        if (el.tagName === "REGULAR-TABLE") found.push(el);
        if (el.shadowRoot) walk(el.shadowRoot);
      }
    };
    walk(viewer);
    if (viewer.shadowRoot) walk(viewer.shadowRoot);
    grids.push(found.length ? [...found[0].querySelectorAll("tbody tr")].map(
      (tr) => [...tr.querySelectorAll("td,th")].map((e) => e.textContent.trim())) : null);
  }
  return grids;
}"""

NOTEBOOK = "(() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; " \
           "return w && w.sessionContext ? w : null; })()"


def readme_cells() -> list[str]:
    """The README's notebook block, one cell per paragraph."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "tt.show(" in b]
    return [c.strip() for c in code.split("\n\n") if c.strip()]


def notebook(cells: list[str]) -> dict[str, Any]:
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                   "outputs": [], "source": src} for i, src in enumerate(cells)],
    }


def require_jupyter() -> None:
    missing = []
    for module in ("jupyterlab", "ipykernel", "ipywidgets", "anywidget"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            missing.append(module)
    if missing:
        pytest.fail(f"the notebook test needs {', '.join(missing)}: pip install -e '.[dev]' "
                    f"(or pip install jupyterlab ipykernel 'ticktable[notebook]')")


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll ``url`` until it answers 200 (JupyterLab is up), failing if the process ends."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"jupyter lab did not answer within {timeout} s:\n"
                        f"{log.read_text()[-3000:]}")
        time.sleep(0.2)  # a poll interval, not a wait for something to happen


@pytest.fixture
def ticktable_server() -> Iterator[TicktableServer]:
    graph = UpdateGraph()
    graph.start(0.05)
    server = TicktableServer(graph, ServerConfig()).start()
    yield server
    server.shutdown()
    graph.stop()


@pytest.fixture
def jupyter_lab(tmp_path: Path, held_port: HeldPort) -> Iterator[str]:
    """``jupyter lab`` serving ``tmp_path/nb`` on a held port; yields its base URL."""
    require_jupyter()
    root = tmp_path / "nb"
    root.mkdir()
    home = tmp_path / "jupyter"
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "JUPYTER_PLATFORM_DIRS": "1"}
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)  # no "get notified about Jupyter news?" over the screenshots
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = held_port.port  # held until jupyter binds it (tornado: SO_REUSEADDR)
    log = tmp_path / "jupyter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
             f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
             "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
             "--ServerApp.terminals_enabled=False", "--allow-root",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             f"--LabApp.user_settings_dir={home / 'settings'}",
             f"--LabApp.workspaces_dir={home / 'workspaces'}"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/api/status?token={TOKEN}", proc, log, 60)
        yield url
    finally:
        try:  # the server's own shutdown stops its kernels
            req = urllib.request.Request(f"{url}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {TOKEN}"})
            urllib.request.urlopen(req, timeout=10).close()
        except (urllib.error.URLError, OSError):
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"jupyter lab did not shut down:\n{log.read_text()[-3000:]}")


def outputs_text(page: Any) -> str:
    return str(page.evaluate(
        "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".map((e) => e.innerText).join('\\n---\\n')"))


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page tall enough for both grids, failing on uncaught errors."""
    yield from open_page(browser, 1300, 1500)


def wait_grids(page: Any, want: list[list[list[str]]], timeout: float) -> None:
    """Wait until the page's grids show exactly ``want`` (each grid's rows of cells)."""
    try:
        page.wait_for_function(f"(want) => JSON.stringify(({GRIDS})()) === JSON.stringify(want)",
                               arg=want, timeout=timeout, polling="raf")
    except Exception as exc:
        raise AssertionError(f"the grids show {page.evaluate(GRIDS)}, not {want}; the cells' "
                             f"outputs:\n{outputs_text(page)}") from exc


def test_notebook_grids_tick_after_a_push(ticktable_server, jupyter_lab, tmp_path, page):
    client = tt.connect(ticktable_server.location)
    client.push("trades", pd.DataFrame({"id": [1, 2], "sym": ["A", "B"], "px": [10.0, 60.0]}),
                mode="upsert", keys=["id"])
    cells = [f"import ticktable as tt\nclient = tt.connect({ticktable_server.location!r})"]
    cells += [c.replace("grpc://127.0.0.1:8815", ticktable_server.location)
              for c in readme_cells()]
    (tmp_path / "nb" / "live.ipynb").write_text(json.dumps(notebook(cells)))

    page.goto(f"{jupyter_lab}/lab/tree/live.ipynb?token={TOKEN}")
    page.wait_for_function(f"() => {{ const w = {NOTEBOOK}; const k = w && "
                           f"w.sessionContext.session && w.sessionContext.session.kernel; "
                           f"return !!k && k.status === 'idle'; }}", timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # tt.show sorted by px descending, the LiveTable in table order; the row key hidden
    wait_grids(page, [[["2", "B", "60.00"], ["1", "A", "10.00"]],
                      [["1", "A", "10.00"], ["2", "B", "60.00"]]], 60_000)
    assert "LiveTable 'trades'" not in outputs_text(page)  # grids, not the text repr
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "notebook_widget_before_push.png"))

    # another process than the kernel writes: the grids' cells change
    client.push("trades", pd.DataFrame({"id": [1, 3], "sym": ["A", "C"], "px": [123.25, 7.5]}),
                mode="upsert", keys=["id"])
    wait_grids(page, [[["1", "A", "123.25"], ["2", "B", "60.00"], ["3", "C", "7.50"]],
                      [["1", "A", "123.25"], ["2", "B", "60.00"], ["3", "C", "7.50"]]], 30_000)
    page.screenshot(path=str(ARTIFACTS / "notebook_widget_after_push.png"))
    client.push("trades", pd.DataFrame({"id": [2]}), mode="delete")  # a row leaves both
    wait_grids(page, [[["1", "A", "123.25"], ["3", "C", "7.50"]],
                      [["1", "A", "123.25"], ["3", "C", "7.50"]]], 30_000)
    client.close()
