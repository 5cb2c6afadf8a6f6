"""A mirror on the web page (flight/links, DESIGN.md §11): listed as a mirror of its origin's
table, and saying so, in the list and over its grid, while its link is not in sync.

Two servers in this process: the origin (A) holds a keyed table, the mirror (B) mirrors it
and serves the page. A goes away and a new origin comes up on its port, as a restarted
server would; or A is not there yet when B starts mirroring it. A's port is held meanwhile
(bench.ports.HeldPort): refused, as no server's, and taken by no other process.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import ticktable as tt
from bench.ports import HeldPort
from tests.web.conftest import open_grid, start_server, wait_cells

SCHEMA = pa.schema([("sym", pa.string()), ("px", pa.float64())])
FEEDS = ["perspective", "arrow"]

ROW = '#tables tr[data-table="prices_a"]'
GRID = 'section.grid[data-table="prices_a"]'


def _origin(**config):
    """A server without a web UI holding keyed table ``prices``."""
    return start_server(http_port=None, **config)


#: the grid's rows as ``sym=px``, sorted and joined by commas (a JS expression over ``c``)
ROWS = "c.rows.map((r) => `${r[0]}=${r[1]}`).sort().join(',')"


@pytest.mark.parametrize("feed", FEEDS)
def test_a_mirror_is_listed_with_its_origin_and_says_when_it_is_not_in_sync(
        browser, page, tmp_path, feed):
    held = HeldPort()  # A's, and its successor's
    port = held.port
    origin, origin_graph = _origin(port=port)
    up = [(origin, origin_graph)]
    mirror, mirror_graph = start_server()
    try:
        client = tt.connect(origin.location)
        client.push("prices", pa.table({"sym": ["a", "b"], "px": [1.0, 2.0]}, schema=SCHEMA),
                    mode="upsert", keys=["sym"])
        client.close()
        link = mirror.mirror(f"{origin.location}/prices=prices_a")
        assert link.wait_in_sync(10)

        # listed as a mirror of A's table, in sync: no badge
        open_grid(page, mirror, "prices_a", feed)
        row = page.locator(ROW)
        # the cells' text (the DOM's, not its layout: innerText puts the block "of ..." on a
        # line of its own only once the stylesheet applies, which a loaded machine can read
        # before it does)
        texts = row.locator("td").all_text_contents()
        assert texts[:3] == ["prices_a", f"mirror of {origin.location}/prices", "2"]
        assert texts[5] == "live"
        assert row.get_attribute("data-link") == "in-sync"
        assert not row.locator(".badge").count()
        assert page.locator(f"{GRID} .banner").is_hidden()
        assert page.locator(f"{GRID} header .origin").inner_text() == (
            f"mirror of {origin.location}/prices")
        wait_cells(page, "prices_a", f"{ROWS} === 'a=1.00,b=2.00'")

        # a push to A reaches B's grid
        client = tt.connect(origin.location)
        client.push("prices", pa.table({"sym": ["b", "c"], "px": [2.5, 3.0]}, schema=SCHEMA),
                    mode="upsert")
        client.close()
        wait_cells(page, "prices_a", f"{ROWS} === 'a=1.00,b=2.50,c=3.00'")

        # A goes: the list's badge and the grid's banner say so within a few seconds
        origin.shutdown()
        origin_graph.stop()
        up.clear()
        t0 = time.monotonic()
        page.locator(f"{ROW} .badge.not-in-sync").wait_for(timeout=5000)
        page.locator(f"{GRID} .banner").wait_for(state="visible", timeout=5000)
        shown = time.monotonic() - t0
        assert shown < 5.0
        assert row.get_attribute("data-link") == "not-in-sync"
        assert row.locator(".badge").inner_text() == "not in sync: disconnected"
        banner = page.locator(f"{GRID} .banner .what").inner_text()
        assert banner.startswith(f"Not in sync with {origin.location}/prices: disconnected, for ")
        assert banner.endswith("the rows shown are the last received.")
        # why, in one line: the origin's last word (it was shutting down) or, once the link
        # retried, the refused connection
        detail = page.locator(f"{GRID} .banner .detail").inner_text()
        assert "shutting down" in detail or "failed to connect" in detail, detail
        # the grid keeps the last rows it had
        wait_cells(page, "prices_a", f"{ROWS} === 'a=1.00,b=2.50,c=3.00'")
        shot = tmp_path / f"mirror-not-in-sync-{feed}.png"
        page.screenshot(path=str(shot))
        print(f"the mirror out of sync ({feed}), {shown:.1f} s after its origin went: {shot}")

        # a new origin on A's port, with other rows: back in sync, the banner goes and the
        # grid shows the new origin's rows (what A had and it has not is removed)
        origin, origin_graph = _origin(port=port)
        up.append((origin, origin_graph))
        client = tt.connect(origin.location)
        client.push("prices", pa.table({"sym": ["c", "d"], "px": [30.0, 40.0]}, schema=SCHEMA),
                    mode="upsert", keys=["sym"])
        client.close()
        page.locator(f"{GRID} .banner").wait_for(state="hidden", timeout=20_000)
        page.locator(f"{ROW} .badge").wait_for(state="detached", timeout=5000)
        assert link.in_sync
        assert page.locator(ROW).get_attribute("data-link") == "in-sync"
        wait_cells(page, "prices_a", f"{ROWS} === 'c=30.00,d=40.00'")
        assert page.locator(f"{GRID} .state").inner_text() == "live"
    finally:
        page.close()  # before its server goes, which its viewer would report as an error
        mirror.shutdown()
        mirror_graph.stop()
        for server, graph in up:
            server.shutdown()
            graph.stop()
        held.close()


def test_a_mirror_whose_origin_has_not_answered_is_listed_and_goes_live_when_it_does(page):
    held = HeldPort()  # nobody listens on it until the origin comes up there
    port = held.port
    mirror, mirror_graph = start_server()
    up = []
    try:
        link = mirror.mirror(f"grpc://127.0.0.1:{port}/prices=prices_a")
        page.goto(f"{mirror.web.url}?t=prices_a")
        row = page.locator(ROW)
        page.locator(f"{ROW} .badge.not-in-sync").wait_for(timeout=5000)
        texts = row.locator("td").all_text_contents()
        assert texts[1] == f"mirror of grpc://127.0.0.1:{port}/prices"
        assert texts[2] == "0" and texts[5] == "waiting"
        msg = page.locator(f"{GRID} .message")
        msg.wait_for(timeout=5000)
        assert msg.inner_text().startswith('Mirror "prices_a" has no rows yet: ')
        assert page.locator(f"{GRID} .state").inner_text() == "waiting"
        page.locator(f"{GRID} .banner").wait_for(state="visible", timeout=5000)
        assert "prices_a" not in mirror.registry.names() and not link.in_sync

        origin, origin_graph = _origin(port=port)
        up.append((origin, origin_graph))
        client = tt.connect(origin.location)
        client.push("prices", pa.table({"sym": ["a"], "px": [1.0]}, schema=SCHEMA),
                    mode="upsert", keys=["sym"])
        client.close()
        page.wait_for_selector(f"{GRID} .state.live", timeout=20_000)
        wait_cells(page, "prices_a", f"{ROWS} === 'a=1.00'")
        page.locator(f"{GRID} .banner").wait_for(state="hidden", timeout=5000)
        assert not page.locator(f"{GRID} .message").count()
        page.locator(f"{ROW} .badge").wait_for(state="detached", timeout=5000)
    finally:
        page.close()
        mirror.shutdown()
        mirror_graph.stop()
        for server, graph in up:
            server.shutdown()
            graph.stop()
        held.close()
