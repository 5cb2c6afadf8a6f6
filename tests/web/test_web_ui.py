"""The web UI in a real browser (headless Chromium through Playwright) against a real server.

Cells are read from the datagrid's DOM (``regular-table`` inside the viewer's shadow
roots): what is on screen, not what the page's script holds.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

import ticktable as tt
from bench.ports import HeldPort
from tests.web.conftest import ARTIFACTS, cells, open_grid, start_server, wait_cells

N = 5_000
SCHEMA = pa.schema([("sym", pa.string()), ("px", pa.float64()), ("n", pa.int64())])
FEEDS = ["perspective", "arrow"]

@pytest.fixture(scope="module")
def prices(web):
    """Keyed table ``prices``: N rows, sym S00000.., px, n."""
    client = tt.connect(web.location)
    syms = [f"S{i:05d}" for i in range(N)]
    client.push("prices", pa.table({"sym": syms, "px": np.arange(N) * 0.5,
                                    "n": np.arange(N, dtype=np.int64)}, schema=SCHEMA),
                mode="upsert", keys=["sym"])
    yield client
    client.close()


def test_the_page_lists_the_tables_and_keeps_them_current(web, prices, page):
    page.goto(web.web.url)
    row = page.locator('#tables tr[data-table="prices"]')
    row.wait_for()
    assert row.locator("td").all_inner_texts()[:3] == ["prices", "keyed", f"{N:,}"]
    prices.push("extra", pa.table({"a": [1, 2, 3]}))
    extra = page.locator('#tables tr[data-table="extra"] td:nth-child(3)')
    extra.wait_for(timeout=10_000)
    assert extra.inner_text() == "3"
    prices.drop_table("extra")
    page.locator('#tables tr[data-table="extra"]').wait_for(state="detached", timeout=10_000)


@pytest.mark.parametrize("feed", FEEDS)
def test_an_opened_table_shows_the_server_row_count_and_a_push_within_a_second(
        web, prices, page, feed):
    open_grid(page, web, "prices", feed)
    rows = page.locator('section.grid[data-table="prices"] .rows')
    size = len(web.registry.get("prices").table.rowset)
    page.wait_for_function(
        "([n]) => document.querySelector('section.grid[data-table=\"prices\"] .rows')"
        "?.dataset.rows === String(n)", arg=[size], timeout=5000)
    assert rows.inner_text() == f"{size:,} rows"
    wait_cells(page, "prices", "c.rows.length > 5 && c.rows[0][0] === 'S00000'")
    grid = cells(page, "prices")
    assert grid["head"] == ["sym", "px", "n"]  # the row key column is hidden
    # a push from Python: on screen within 1 s of the write being acknowledged visible
    value = 777_000 + FEEDS.index(feed)
    prices.push("prices", pa.table({"sym": ["S00000"], "px": [1.25], "n": [value]},
                                   schema=SCHEMA), mode="upsert")
    t0 = time.monotonic()
    wait_cells(page, "prices", f"c.rows[0][0] === 'S00000' && c.rows[0][2] === '{value:,}'",
               timeout=1000)
    assert time.monotonic() - t0 < 1.0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"web-grid-{feed}.png"))


@pytest.mark.parametrize("feed", FEEDS)
def test_sorting_in_the_viewer_reorders_rows(web, prices, page, feed):
    open_grid(page, web, "prices", feed)
    wait_cells(page, "prices", "c.rows.length > 5 && c.rows[0][0] === 'S00000'")
    header = page.locator('section.grid[data-table="prices"] regular-table thead tr:last-child th',
                          has_text="px")
    header.first.click()  # the datagrid sorts by a clicked column, descending first
    wait_cells(page, "prices", "c.rows[0][0] !== 'S00000'")
    shown = [r[0] for r in cells(page, "prices")["rows"][:5]]
    table = web.registry.get("prices").table.to_arrow().to_pandas()
    top = table.sort_values("px", ascending=False, kind="stable")["sym"].tolist()[:5]
    assert shown == top


@pytest.mark.parametrize("feed", FEEDS)
def test_a_removed_row_disappears(web, prices, page, feed):
    open_grid(page, web, "prices", feed)
    sym = f"S{1 + FEEDS.index(feed):05d}"
    wait_cells(page, "prices", f"c.rows.some((r) => r[0] === '{sym}')")
    before = len(web.registry.get("prices").table.rowset)
    prices.push("prices", pa.table({"sym": [sym]}), mode="delete")
    # waits that only bound a hang (the suite runs on loaded machines): what is asserted is
    # that the row goes and the count follows, not how fast
    wait_cells(page, "prices", f"c.rows.length > 5 && !c.rows.some((r) => r[0] === '{sym}')")
    page.wait_for_function(
        "([n]) => document.querySelector('section.grid[data-table=\"prices\"] .rows')"
        "?.dataset.rows === String(n)", arg=[before - 1], timeout=10_000)


def test_an_unknown_table_in_the_url_says_so(web, prices, page):
    page.goto(f"{web.web.url}?t=nosuch")
    msg = page.locator('section.grid[data-table="nosuch"] .message')
    msg.wait_for(timeout=5000)
    assert 'no table named "nosuch"' in msg.inner_text()
    assert "prices" in msg.inner_text()


def test_a_dropped_table_shows_its_state_in_the_grid_header(web, prices, page):
    prices.push("doomed", pa.table({"a": [1, 2, 3]}))
    open_grid(page, web, "doomed", "perspective")
    prices.drop_table("doomed")
    state = page.locator('section.grid[data-table="doomed"] .state')
    page.wait_for_function(
        "() => document.querySelector('section.grid[data-table=\"doomed\"] .state')"
        "?.classList.contains('dropped')", timeout=5000)
    assert "dropped" in state.inner_text()


@pytest.mark.parametrize("feed", FEEDS)
def test_a_table_made_again_after_a_drop_goes_live_again(web, prices, page, feed):
    # also what a restart looks like when the page lists the tables before one is back
    name = f"again_{feed}"
    prices.push(name, pa.table({"k": ["a"], "v": [1]}), mode="upsert", keys=["k"])
    open_grid(page, web, name, feed)
    wait_cells(page, name, "c.rows.length === 1 && c.rows[0][1] === '1'")
    prices.drop_table(name)
    page.wait_for_selector(f'section.grid[data-table="{name}"] .state.dropped', timeout=5000)
    prices.push(name, pa.table({"k": ["a", "b"], "v": [2, 3]}), mode="upsert", keys=["k"])
    page.wait_for_selector(f'section.grid[data-table="{name}"] .state.live', timeout=10_000)
    wait_cells(page, name, "c.rows.length === 2 && c.rows[0][1] === '2'")


def _status(url, **kw):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, **kw), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_token_gate_serves_only_the_login_page_without_the_token(browser):
    server, graph = start_server(token="s3cret", read_token="r3ad")
    try:
        tt.connect(server.location, token="s3cret").push("t", pa.table({"a": [1, 2]}))
        base = server.web.url
        for path in ("", "api/tables", "static/app.js", "ws/arrow?table=t",
                     "static/vendor/@perspective-dev/server/dist/wasm/perspective-server.wasm"):
            code, body = _status(base + path)
            assert code == 401, path
            assert b"perspective" not in body.lower() or path == "", path
        code, body = _status(base)
        assert b'id="login"' in body and b"app.js" not in body
        assert _status(base + "login")[0] == 200
        code, body = _status(base + "api/tables", headers={"Authorization": "Bearer r3ad"})
        assert code == 200 and [t["name"] for t in json.loads(body)["tables"]] == ["t"]
        assert _status(base + "api/login", data=b'{"token": "wrong"}')[0] == 401

        context = browser.new_context()
        page = context.new_page()
        page.goto(base + "?t=t")
        page.locator("#token").wait_for()
        assert not page.locator("perspective-viewer").count()
        page.fill("#token", "nope")
        page.click("button[type=submit]")
        page.locator("#error", has_text="Wrong token").wait_for()
        page.fill("#token", "r3ad")  # the read-only token is enough to watch
        page.click("button[type=submit]")
        page.wait_for_selector('section.grid[data-table="t"] .state.live', timeout=20_000)
        cookie = [c for c in context.cookies() if c["name"] == "ticktable_session"][0]
        assert cookie["httpOnly"] and cookie["value"] not in ("r3ad", "s3cret")
        context.close()
    finally:
        server.shutdown()
        graph.stop()


def test_a_failed_table_shows_its_error_in_the_grid_header(web, prices, page):
    import pyarrow.compute as pc

    src = web.registry.create_source("fragile", pa.schema([("a", pa.int64()), ("b", pa.int64())]),
                                     "keyed", keys=["a"])
    src.table.upsert(pa.table({"a": [1], "b": [1]}))
    ratio = src.table.update(r=pc.divide(pc.field("a"), pc.field("b")))  # fails when b is 0
    web.registry.add("ratio", ratio, "derived", parents=["fragile"])
    open_grid(page, web, "ratio", "perspective")
    src.table.upsert(pa.table({"a": [2], "b": [0]}))
    page.wait_for_function(
        "() => document.querySelector('section.grid[data-table=\"ratio\"] .state')"
        "?.classList.contains('failed')", timeout=5000)
    assert "failed" in page.locator('section.grid[data-table="ratio"] .state').inner_text()


@pytest.mark.parametrize("feed", FEEDS)
def test_the_page_reconnects_by_itself_after_a_server_restart(browser, feed, held_port):
    web_port = HeldPort()  # both held: free of others between the shutdown and the restart
    ports = {"port": held_port.port, "http_port": web_port.port}
    first, graph = start_server(**ports)
    tt.connect(first.location).push("t", pa.table({"k": ["a"], "v": [1]}), mode="upsert",
                                    keys=["k"])
    context = browser.new_context()
    page = context.new_page()
    try:
        open_grid(page, first, "t", feed)
        wait_cells(page, "t", "c.rows.length === 1 && c.rows[0][1] === '1'")
        first.shutdown()
        graph.stop()
        page.wait_for_selector('section.grid[data-table="t"] .state.reconnecting', timeout=10_000)
        second, graph = start_server(**ports)  # the same ports, new tables
        try:
            tt.connect(second.location).push("t", pa.table({"k": ["a"], "v": [2]}),
                                             mode="upsert", keys=["k"])
            page.wait_for_selector('section.grid[data-table="t"] .state.live', timeout=15_000)
            wait_cells(page, "t", "c.rows.length === 1 && c.rows[0][1] === '2'")
        finally:
            second.shutdown()
            graph.stop()
    finally:
        context.close()
        web_port.close()


@pytest.mark.parametrize("feed", FEEDS)
def test_the_page_reconnects_after_the_web_process_dies(browser, feed):
    """The web UI's own process is killed: the server starts a new one on the same port and
    the open page goes live again, showing what changed meanwhile."""
    import os
    import signal

    server, graph = start_server()
    client = tt.connect(server.location)
    client.push("t", pa.table({"k": ["a"], "v": [1]}), mode="upsert", keys=["k"])
    context = browser.new_context()
    page = context.new_page()
    try:
        open_grid(page, server, "t", feed)
        wait_cells(page, "t", "c.rows.length === 1 && c.rows[0][1] === '1'")
        assert server.web is not None and server.web.pid is not None
        os.kill(server.web.pid, signal.SIGKILL)
        client.push("t", pa.table({"k": ["a"], "v": [2]}), mode="upsert", keys=["k"])
        page.wait_for_selector('section.grid[data-table="t"] .state.live', timeout=20_000)
        wait_cells(page, "t", "c.rows.length === 1 && c.rows[0][1] === '2'", timeout=20_000)
        assert server.web.restarts == 1
    finally:
        context.close()
        client.close()
        server.shutdown()
        graph.stop()


def test_the_web_ui_is_served_over_tls_with_flights_certificate(browser, tmp_path):
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    server, graph = start_server(tls_cert=(tmp_path / "cert.pem").read_bytes(),
                                 tls_key=(tmp_path / "key.pem").read_bytes(), token="s3cret")
    try:
        assert server.web.url.startswith("https://")
        context = browser.new_context(ignore_https_errors=True)  # self-signed
        page = context.new_page()
        page.goto(server.web.url)
        page.fill("#token", "s3cret")
        page.click("button[type=submit]")
        page.locator("#connection.live").wait_for(timeout=10_000)
        cookie = [c for c in context.cookies() if c["name"] == "ticktable_session"][0]
        assert cookie["secure"]
        context.close()
    finally:
        server.shutdown()
        graph.stop()


@pytest.mark.parametrize("feed", FEEDS)
def test_a_table_no_longer_watched_is_released(web, prices, browser, feed):
    context = browser.new_context()
    page = context.new_page()
    open_grid(page, web, "prices", feed)
    page.goto(f"{web.web.url}?t=prices&feed={feed}")  # a reload: the old socket goes
    page.wait_for_selector('section.grid[data-table="prices"] .state.live', timeout=20_000)

    def held():  # the server's feeds of the table to the web process
        return sum(f.name == "prices" for f in list(web.web.feeds.values()))

    deadline = time.monotonic() + 5
    while held() != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held() == 1  # the reloaded page's grid only
    context.close()

    def subscribed():  # feeds still on the table's publisher (a feed is closed on a thread
        # of its own after it leaves web.feeds: both must be gone, each in its own time)
        return [s for s in web.registry.get("prices").publisher.subscribers
                if type(s).__name__ == "TableFeed"]

    deadline = time.monotonic() + 5
    while (held() or subscribed()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held() == 0
    assert not subscribed()  # the feed left the table's publisher


#: an init script: <perspective-viewer> defines itself 1.5 s later than it would (its
#: WebAssembly compiling slowly on a busy machine); the grid's states are kept in __states
LATE_VIEWER = """
const define = customElements.define.bind(customElements);
customElements.define = (name, ...rest) => name === "perspective-viewer"
  ? setTimeout(() => define(name, ...rest), 1500) : define(name, ...rest);
window.__states = [];
new MutationObserver(() => {
  const el = document.querySelector("section.grid .state");
  if (el && window.__states.at(-1) !== el.textContent) window.__states.push(el.textContent);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


@pytest.mark.parametrize("feed", FEEDS)
def test_a_grid_whose_rows_come_before_the_viewer_is_defined_waits_for_it(web, prices, browser,
                                                                          feed):
    # perspective.js finds its engine through the <perspective-viewer> element: called
    # before the element is defined, it threw, and the arrow feed kept that failure for
    # good (a reload, everything cached, brought the snapshot first)
    context = browser.new_context()
    context.add_init_script(LATE_VIEWER)
    page = context.new_page()
    try:
        open_grid(page, web, "prices", feed)
        assert page.evaluate("window.__states").count("live") == 1
        assert not [s for s in page.evaluate("window.__states") if "reconnecting" in s]
    finally:
        context.close()


def test_a_sql_view_is_listed_and_shown_live(web, prices, page):
    """A view made over Flight SQL (ADBC's driver) is a table of the page like any other."""
    import adbc_driver_flightsql.dbapi as flightsql

    with flightsql.connect(web.location, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE VIEW cheap AS SELECT sym, px * 2 AS px2 FROM prices WHERE px < 1.6")
    try:
        page.goto(web.web.url)
        row = page.locator('#tables tr[data-table="cheap"]')
        row.wait_for()
        assert row.locator("td").all_inner_texts()[:2] == ["cheap", "view"]
        open_grid(page, web, "cheap", "arrow")
        prices.push("prices", pa.table({"sym": ["Q00001"], "px": [0.25], "n": [1]},
                                       schema=SCHEMA), mode="upsert")  # other tests delete rows
        wait_cells(page, "cheap", "c.rows.some((r) => r[0] === 'Q00001' && r[1] === '0.50')")
        assert cells(page, "cheap")["head"] == ["sym", "px2"]
        prices.push("prices", pa.table({"sym": ["Q00001"], "px": [0.375], "n": [2]},
                                       schema=SCHEMA), mode="upsert")
        wait_cells(page, "cheap", "c.rows.some((r) => r[0] === 'Q00001' && r[1] === '0.75')")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-sql-view.png"))
    finally:
        prices.drop_table("cheap")
        prices.push("prices", pa.table({"sym": ["Q00001"]}), mode="delete")
