"""Charts, titles, views kept in the URL and the table info panel, in a real browser.

A chart is WebGL drawn on canvases (Perspective's viewer-charts), so what it shows is read
from its pixels: a screenshot of the plugin's element, decoded in the page, gives the
height of each bar. The bars of a keyed table's values must stand in the values' ratios,
before a push and after it: the chart redrew with the new value, not merely exists.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ticktable as tt
from tests.web.conftest import ARTIFACTS, cells, open_grid, start_server, wait_cells

FEEDS = ["perspective", "arrow"]
Y_BAR = {"plugin": "Y Bar", "columns": ["v"], "group_by": ["sym"]}

# a screenshot (base64 PNG) of a bar chart -> the heights in pixels of its bars, left to
# right: runs of pixel columns holding the bars' blue, each as tall as its tallest column
BARS_JS = """async (png) => {
  const blob = await (await fetch(`data:image/png;base64,${png}`)).blob();
  const bmp = await createImageBitmap(blob);
  const canvas = new OffscreenCanvas(bmp.width, bmp.height);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(bmp, 0, 0);
  const {data, width, height} = ctx.getImageData(0, 0, bmp.width, bmp.height);
  const counts = new Array(width).fill(0);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = 4 * (y * width + x);
      if (data[i + 2] > 150 && data[i] < 60 && data[i + 2] - data[i + 1] > 60) counts[x]++;
    }
  }
  const bars = [];
  let run = null;
  counts.forEach((n, x) => {
    if (n > 0) { run ??= {w: 0, h: 0}; run.w++; run.h = Math.max(run.h, n); }
    else if (run) { bars.push(run); run = null; }
  });
  if (run) bars.push(run);
  return bars.filter((b) => b.w >= 4).map((b) => b.h);
}"""

# the titles shown in a grid's viewer (its layout tabs, in shadow roots)
TITLES_JS = """(name) => {
  const sec = document.querySelector(`section.grid[data-table="${name}"]`);
  const out = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.classList.contains("psp-tab-title")) out.push(el.textContent);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  if (sec) walk(sec);
  return out;
}"""

SAVED_JS = """async (name) => {
  const v = document.querySelector(`section.grid[data-table="${name}"] perspective-viewer`);
  return await v.save();
}"""


@pytest.fixture(scope="module")
def client(web):
    c = tt.connect(web.location)
    yield c
    c.close()


def view_hash(views: dict[str, dict]) -> str:
    """The URL hash that keeps ``views`` (table name -> viewer configuration)."""
    enc = {name: base64.urlsafe_b64encode(json.dumps(cfg).encode()).decode().rstrip("=")
           for name, cfg in views.items()}
    return "#" + urllib.parse.urlencode(enc)


def url_views(url: str) -> dict[str, dict]:
    """The views a page's URL keeps, decoded."""
    frag = urllib.parse.urlsplit(url).fragment
    return {name: json.loads(base64.urlsafe_b64decode(enc + "=" * (-len(enc) % 4)))
            for name, enc in urllib.parse.parse_qsl(frag)}


def wait_url(page, test, timeout=10.0):
    """Wait until ``test(url_views(page.url))`` holds; the views last seen if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        views = url_views(page.url)
        if test(views):
            return views
        if time.monotonic() > deadline:
            raise AssertionError(f"the URL never kept the expected views; it has {views}")
        page.wait_for_timeout(50)


def chart(page, name, plugin="y-bar"):
    return page.locator(f'section.grid[data-table="{name}"] perspective-viewer-charts-{plugin}')


def bar_heights(page, name):
    png = chart(page, name).screenshot()
    return page.evaluate(BARS_JS, base64.b64encode(png).decode())


def wait_bars(page, name, ratios, timeout=10.0):
    """Wait until the chart's bars stand in ``ratios`` (to the last bar, within 4%)."""
    deadline = time.monotonic() + timeout
    while True:
        heights = bar_heights(page, name) if chart(page, name).count() else []
        if len(heights) == len(ratios) and heights[-1] > 50 and all(
                abs(h / heights[-1] - r) <= 0.04 * r for h, r in zip(heights, ratios, strict=True)):
            return heights
        if time.monotonic() > deadline:
            raise AssertionError(f"bars {heights} never stood in the ratios {ratios}")
        page.wait_for_timeout(50)


@pytest.mark.parametrize("feed", FEEDS)
def test_a_chart_redraws_with_a_pushed_value(web, client, page, feed):
    name = f"bars_{feed}"
    client.push(name, pa.table({"sym": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]}),
                mode="upsert", keys=["sym"])
    outside = []
    page.on("request", lambda r: None if r.url.startswith((web.web.url, "blob:", "data:"))
            else outside.append(r.url))
    page.goto(f"{web.web.url}?t={name}&feed={feed}{view_hash({name: Y_BAR})}")
    page.wait_for_selector(f'section.grid[data-table="{name}"] .state.live', timeout=20_000)
    before = wait_bars(page, name, [1 / 3, 2 / 3, 1])
    ARTIFACTS.mkdir(exist_ok=True)
    chart(page, name).screenshot(path=str(ARTIFACTS / f"chart_before_push_{feed}.png"))
    client.push(name, pa.table({"sym": ["a"], "v": [6.0]}), mode="upsert")
    after = wait_bars(page, name, [2, 2 / 3, 1], timeout=5.0)  # a is now twice c
    chart(page, name).screenshot(path=str(ARTIFACTS / f"chart_after_push_{feed}.png"))
    page.screenshot(path=str(ARTIFACTS / f"chart_page_{feed}.png"))
    assert after[0] > before[0] and after[2] < before[2]  # a grew, c shrank with the axis
    assert not outside, f"the page fetched from elsewhere: {outside}"


def test_each_viewer_is_titled_with_its_table(web, client, page):
    client.push("titled_a", pa.table({"k": ["x"], "v": [1]}), mode="upsert", keys=["k"])
    client.push("titled_b", pa.table({"k": ["y"], "v": [2]}), mode="upsert", keys=["k"])
    bars = {"plugin": "Y Bar", "columns": ["v"], "group_by": ["k"]}
    page.goto(f"{web.web.url}?t=titled_a&t=titled_b{view_hash({'titled_b': bars})}")
    for name in ("titled_a", "titled_b"):
        page.wait_for_selector(f'section.grid[data-table="{name}"] .state.live', timeout=20_000)
        page.wait_for_function(f"(n) => ({TITLES_JS})(n).includes(n)", arg=name, timeout=5000)
        assert page.evaluate(TITLES_JS, name) == [name]
        assert page.evaluate(SAVED_JS, name)["title"] == name


def test_the_url_keeps_each_view_and_reopens_them(web, client, page, browser):
    client.push("rt_grid", pa.table({"k": [f"k{i}" for i in range(20)],
                                     "px": [float((7 * i) % 20) for i in range(20)]}),
                mode="upsert", keys=["k"])
    client.push("rt_chart", pa.table({"sym": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]}),
                mode="upsert", keys=["sym"])
    open_grid(page, web, "rt_grid", "perspective")
    page.locator('#tables tr[data-table="rt_chart"]').click()  # opened from the list
    page.wait_for_selector('section.grid[data-table="rt_chart"] .state.live', timeout=20_000)
    wait_cells(page, "rt_grid", "c.rows.length === 20")
    # the user sorts the grid (a click on its header) and makes the other a line chart
    page.locator('section.grid[data-table="rt_grid"] regular-table thead tr:last-child th',
                 has_text="px").first.click()
    page.evaluate("""async () => {
      const v = document.querySelector('section.grid[data-table="rt_chart"] perspective-viewer');
      await v.restore({plugin: "Y Line", columns: ["v"], group_by: ["sym"]});
    }""")
    views = wait_url(page, lambda v: v.get("rt_grid", {}).get("sort") == [["px", "desc"]]
                     and v.get("rt_chart", {}).get("plugin") == "Y Line")
    assert views["rt_chart"]["group_by"] == ["sym"] and views["rt_chart"]["columns"] == ["v"]
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["t"] == [
        "rt_grid", "rt_chart"]

    context = browser.new_context(viewport={"width": 1400, "height": 800})  # a fresh page
    try:
        again = context.new_page()
        again.goto(page.url)
        for name in ("rt_grid", "rt_chart"):
            again.wait_for_selector(f'section.grid[data-table="{name}"] .state.live',
                                    timeout=20_000)
        chart(again, "rt_chart", "y-line").wait_for(timeout=10_000)
        grid, line = again.evaluate(SAVED_JS, "rt_grid"), again.evaluate(SAVED_JS, "rt_chart")
        assert grid["sort"] == [["px", "desc"]] and grid["plugin"] == "Datagrid"
        assert (line["plugin"], line["columns"], line["group_by"]) == ("Y Line", ["v"], ["sym"])
        wait_cells(again, "rt_grid", "c.rows.length === 20 && c.rows[0][1] === '19.00'")
        shown = [float(r[1]) for r in cells(again, "rt_grid")["rows"]]
        assert shown == sorted(shown, reverse=True)
    finally:
        context.close()


def test_a_stale_url_says_what_is_gone_and_shows_the_rest(web, client, page):
    client.push("stale_k", pa.table({"k": ["a", "b"], "v": [1, 2]}), mode="upsert", keys=["k"])
    client.push("stale_f", pa.table({"k": ["a", "b"], "v": [1, 2]}), mode="upsert", keys=["k"])
    views = {"gone": Y_BAR, "stale_k": {"plugin": "Datagrid", "columns": ["nosuch"]},
             "stale_f": {"filter": [["v", "~~", 1]]}}  # an operator the viewer refuses
    page.goto(f"{web.web.url}?t=gone&t=stale_k&t=stale_f{view_hash(views)}")
    msg = page.locator('section.grid[data-table="gone"] .message')
    msg.wait_for(timeout=5000)
    assert 'no table named "gone"' in msg.inner_text()
    page.wait_for_selector('section.grid[data-table="stale_k"] .state.live', timeout=20_000)
    note = page.locator('section.grid[data-table="stale_k"] .note')
    note.wait_for(timeout=5000)
    assert "no longer applies" in note.inner_text()
    wait_cells(page, "stale_k", "c.rows.length === 2")
    assert cells(page, "stale_k")["head"] == ["k", "v"]
    # the refused view: a new viewer shows the table's columns
    page.wait_for_selector('section.grid[data-table="stale_f"] .state.live', timeout=20_000)
    assert "no longer applies" in page.locator(
        'section.grid[data-table="stale_f"] .note').inner_text()
    wait_cells(page, "stale_f", "c.rows.length === 2")
    kept = wait_url(page, lambda v: "stale_k" in v and "stale_f" in v)  # the views shown
    assert kept["stale_k"]["columns"] == ["k", "v"]
    assert "filter" not in kept["stale_f"] and kept["stale_f"]["columns"] == ["k", "v"]


def test_a_view_kept_in_the_url_survives_the_token_gate(browser):
    server, graph = start_server(token="s3cret")
    context = browser.new_context(viewport={"width": 1400, "height": 800})
    try:
        tt.connect(server.location, token="s3cret").push(
            "g", pa.table({"sym": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]}), mode="upsert",
            keys=["sym"])
        page = context.new_page()
        page.goto(f"{server.web.url}?t=g{view_hash({'g': Y_BAR})}")
        page.fill("#token", "s3cret")
        page.click("button[type=submit]")
        page.wait_for_selector('section.grid[data-table="g"] .state.live', timeout=20_000)
        wait_bars(page, "g", [1 / 3, 2 / 3, 1])
    finally:
        context.close()
        server.shutdown()
        graph.stop()


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_info_panel_shows_kind_keys_parents_step_and_schema(web, client, page):
    client.push("info_src", pa.table({"k": ["a", "b"], "v": [1, 2]}), mode="upsert",
                keys=["k"])
    src = web.registry.get("info_src")
    web.registry.add("info_double", src.table.update(w=pc.multiply(pc.field("v"), 2)),
                     "derived", keys=["k"], parents=["info_src"])
    status, body = _get(f"{web.web.url}api/tables/info_double")
    assert status == 200
    row = body["table"]
    assert (row["kind"], row["keys"], row["parents"]) == ("derived", ["k"], ["info_src"])
    assert row["schema"] == [["k", "string"], ["v", "int64"], ["w", "int64"]]
    status, body = _get(f"{web.web.url}api/tables/nosuch")
    assert status == 404 and body["error"].startswith("no table named 'nosuch' (tables: ")

    open_grid(page, web, "info_double", "perspective")
    grid = page.locator('section.grid[data-table="info_double"]')
    grid.locator(".info-toggle").click()
    info = grid.locator(".info")

    def field(key):
        return info.locator(f'dd[data-key="{key}"]')

    field("kind").wait_for(timeout=5000)
    assert field("kind").inner_text() == "derived"
    assert field("keys").inner_text() == "k"
    assert field("parents").inner_text() == "info_src"
    assert field("rows").inner_text() == "2"
    assert [r.locator("td").all_inner_texts() for r in info.locator(".schema tbody tr").all()] \
        == [["k", "string"], ["v", "int64"], ["w", "int64"]]
    step = web.registry.get("info_double").table.last_step
    assert field("last step").inner_text() == str(step)
    # the panel follows the table: a push moves its step and row count
    client.push("info_src", pa.table({"k": ["c"], "v": [3]}), mode="upsert")
    page.wait_for_function(
        "([n]) => document.querySelector('section.grid[data-table=\"info_double\"] "
        ".info dd[data-key=\"rows\"]')?.textContent === String(n)", arg=[3], timeout=5000)
    assert int(field("last step").inner_text()) > step
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-table-info.png"))
    field("parents").locator("a", has_text="info_src").click()  # a parent opens beside it
    page.wait_for_selector('section.grid[data-table="info_src"] .state.live', timeout=20_000)
    grid.locator(".info-toggle").click()
    info.wait_for(state="hidden")
