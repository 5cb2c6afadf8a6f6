"""A real server with its web UI on 127.0.0.1, and Debian's Chromium driven by Playwright.

Playwright launches the Chromium of :func:`ticktable.chromium_check.chromium_path`
(``/usr/bin/chromium``) and never downloads one. A missing Chromium or unbuilt assets fail
the tests (``make test`` installs and builds both), never skip them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer
from flight.web.app import STATIC
from ticktable.chromium_check import find_chromium

#: Where browser tests leave screenshots (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    path, version = find_chromium()
    if version is None:
        pytest.fail(f"no working Chromium at {path}: run 'python -m ticktable.chromium_check' "
                    f"(Debian/Ubuntu: sudo apt-get install -y chromium)")
    if not (STATIC / "index.html").exists():
        pytest.fail(f"the web UI's assets are not built in {STATIC}: run 'make web'")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True)
        yield b
        b.close()


def start_server(**config: Any) -> tuple[TicktableServer, UpdateGraph]:
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(**{"http_port": 0, **config})).start()
    graph.start(0.05)
    return server, graph


@pytest.fixture(scope="module")
def web() -> Iterator[TicktableServer]:
    """A server (cycles every 50 ms) with its web UI on a free port."""
    server, graph = start_server()
    yield server
    server.shutdown()
    graph.stop()


def open_page(browser: Any, width: int, height: int) -> Iterator[Any]:
    """A fresh page (its own cookies) of ``width`` x ``height``; after its test, fails on
    any uncaught error the page raised (a fixture's body: ``yield from open_page(...)``)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (its own cookies), 1400x800."""
    yield from open_page(browser, 1400, 800)


# the grid's cells: header names and body rows, as on screen
CELLS = """(name) => {
  const sec = document.querySelector(`section.grid[data-table="${name}"]`);
  if (!sec) return null;
  const found = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "REGULAR-TABLE") found.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(sec);
  if (!found.length) return null;
  const rt = found[0];
  return {
    head: [...rt.querySelectorAll("thead tr:last-child th")].map((e) => e.textContent),
    rows: [...rt.querySelectorAll("tbody tr")].map(
      (tr) => [...tr.querySelectorAll("td,th")].map((e) => e.textContent)),
  };
}"""


def cells(page, name):
    return page.evaluate(CELLS, name)


def wait_cells(page, name, js_test, timeout=10_000):
    """Wait until ``js_test(cells)`` holds (a JS expression over ``c``), polling each frame."""
    page.wait_for_function(f"([name]) => {{ const c = ({CELLS})(name); return !!c && ({js_test}); }}",
                           arg=[name], timeout=timeout, polling="raf")


def open_grid(page, web, name, feed):
    page.goto(f"{web.web.url}?t={name}&feed={feed}")
    page.wait_for_selector(f'section.grid[data-table="{name}"] .state.live', timeout=20_000)
