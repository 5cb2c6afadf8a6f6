"""The web UI under load (#17), both feeds side by side, in headless Chromium.

A keyed table of ``--rows`` rows (``id`` key, ``px``, ``qty``, ``seq``) takes ``--rate``
cycles per second, each upserting ``--batch`` rows stamped with the cycle's number in
``seq``: the ten *probe* rows (ids 0-9, the top of an unsorted grid, so always on screen)
and random others. The bench drives the cycles itself (in this process, with the server)
and notes each cycle's end on the wall clock; its thread asks for the priority ``ticktable
serve``'s cycle thread asks for (``--cycle-priority``, default ``realtime``: SCHED_FIFO when
the process may, :mod:`engine.priority`). The page (Playwright, Debian's Chromium) watches
the probe row's ``seq`` cell in the datagrid's DOM (a MutationObserver) and notes, on the
same clock, when each new value is first on screen.

Per feed (``perspective``: Perspective's Python server holds the table; ``arrow``: Arrow IPC
into the browser's engine) it prints:

- latency: for every cycle, the first frame showing its ``seq`` or a later one, minus the
  cycle's end (p50, mean, p99, max; target p99 <= 250 ms);
- cycles whose value was never on screen by itself (a later one replaced it within a
  frame, or the feed composed them) and the updates the feed composed (coalesced);
- server cycle time (p50/p99) with no page open and with the page open (target: p99 no
  worse than 1.5x);
- the web path's CPU, as cores: the server process's (server and driver) with no page
  open and with the page open, and their difference (``server_web_cores``: the feeds and
  the link), of which the feed threads' own (``feed_thread_cores``: building changes under
  the shared lock); the web UI's own process (``web_process_cores``: Perspective's engine,
  the HTTP server); ``web_cpu_cores`` is the sum; browser memory: the PSS of all Chromium
  processes and the page's JS heap;
- time to first paint of ``--paint-sizes`` tables: from navigation to the first rows drawn,
  and to every row in the page's Perspective table (the grid header's row count);
- a chart's latency (``--chart-pushes``): a Y Bar chart (viewer-charts, WebGL) of a 3-row
  keyed table, opened from a link keeping that view; the bench upserts one bar's value, runs
  the cycle and notes its end, and the page reads the bar heights from the chart's canvas
  every frame until they show that value (one push at a time, 50-150 ms apart): push ->
  chart changed (p50, mean, p99, max).

Usage: ``python bench/bench_web.py [--rows 1000000 --rate 100 --batch 1000 --seconds 20
--paint-sizes 1000000,10000000 --feeds perspective,arrow --repeat 3 --chart-pushes 300
--json PATH]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import print_table, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.priority import PRIORITIES, set_thread_priority  # noqa: E402
from flight.server import ServerConfig, TicktableServer  # noqa: E402
from ticktable.chromium_check import find_chromium  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("px", pa.float64()), ("qty", pa.int64()),
                    ("seq", pa.int64())])
PROBES = 10

# every frame: the probe row's seq as drawn, noted when it changes
PROBE_JS = """([name]) => {
  // a MutationObserver on the grid's <regular-table>: the moment the cell changed (it is
  // painted at the end of that frame), without polling every frame (a requestAnimationFrame
  // loop kept Chromium drawing 60 frames a second, taking CPU from the server it measures)
  window.__seen = [];
  let last = -1, rt = null, col = -1, obs = null;
  const find = () => {
    const sec = document.querySelector(`section.grid[data-table="${name}"]`);
    const walk = (root) => {
      for (const el of root.querySelectorAll("*")) {
        if (el.tagName === "REGULAR-TABLE") return el;
        if (el.shadowRoot) { const f = walk(el.shadowRoot); if (f) return f; }
      }
      return null;
    };
    return sec ? walk(sec) : null;
  };
  const read = () => {
    if (!rt) return;
    if (col < 0) col = [...rt.querySelectorAll("thead tr:last-child th")]
      .findIndex((e) => e.textContent === "seq");
    const tr = rt.querySelector("tbody tr");
    if (tr && col >= 0) {
      const td = tr.querySelectorAll("td,th")[col];
      const v = td ? parseInt(td.textContent.replaceAll(",", ""), 10) : NaN;
      if (v > last) { last = v; window.__seen.push([v, performance.timeOrigin + performance.now()]); }
    }
  };
  const attach = () => {
    if (obs) obs.disconnect();
    rt = find(); col = -1; obs = null;
    if (!rt) return;
    obs = new MutationObserver(read);
    obs.observe(rt, {subtree: true, childList: true, characterData: true});
    read();
  };
  setInterval(() => { if (!rt || !rt.isConnected) attach(); }, 250);  // made or replaced
  attach();
}"""

FIRST_ROWS_JS = """([name]) => {
  const sec = document.querySelector(`section.grid[data-table="${name}"]`);
  if (!sec) return false;
  const walk = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.tagName === "REGULAR-TABLE") return el;
      if (el.shadowRoot) { const f = walk(el.shadowRoot); if (f) return f; }
    }
    return null;
  };
  const rt = walk(sec);
  return !!rt && rt.querySelectorAll("tbody tr td").length > 0;
}"""


CHART_SCHEMA = pa.schema([("sym", pa.string()), ("v", pa.float64())])
CHART_VIEW = {"plugin": "Y Bar", "columns": ["v"], "group_by": ["sym"]}
CHART_MAX = 100.0  # bar c, the tallest: bar a's height over c's is a / 100

# every frame while a value is awaited: bar a's height over bar c's, read from the chart's
# WebGL canvas (one pixel column through each bar's middle, found once), noted with the
# frame's wall-clock time when it shows the value awaited
CHART_JS = """([name, maxv]) => {
  const sec = document.querySelector(`section.grid[data-table="${name}"]`);
  const canvas = () => sec.querySelector("perspective-viewer-charts-y-bar")
    ?.shadowRoot?.querySelector("canvas.webgl-canvas");
  const blue = (d, i) => d[i + 2] > 150 && d[i] < 60 && d[i + 2] - d[i + 1] > 60;
  let cols = null;  // x of bars a and c
  const find = (cv) => {
    const o = new OffscreenCanvas(cv.width, cv.height), g = o.getContext("2d");
    g.drawImage(cv, 0, 0);
    const d = g.getImageData(0, 0, cv.width, cv.height).data, runs = [];
    let start = -1;
    for (let x = 0; x <= cv.width; x++) {
      let hit = false;
      for (let y = 0; x < cv.width && y < cv.height && !hit; y += 2) hit = blue(d, 4 * (y * cv.width + x));
      if (hit && start < 0) start = x;
      if (!hit && start >= 0) { if (x - start >= 4) runs.push((start + x) >> 1); start = -1; }
    }
    return runs.length === 3 ? [runs[0], runs[2]] : null;
  };
  const height = (cv, x) => {
    const o = new OffscreenCanvas(1, cv.height), g = o.getContext("2d");
    g.drawImage(cv, x, 0, 1, cv.height, 0, 0, 1, cv.height);
    const d = g.getImageData(0, 0, 1, cv.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (blue(d, i)) n++;
    return n;
  };
  window.__chart = {shown: null};
  window.__await = (value) => {
    window.__chart = {shown: null};
    const tick = () => {
      const cv = canvas();
      if (cv && cv.width) {
        cols ??= find(cv);
        if (cols) {
          const hc = height(cv, cols[1]);
          const v = hc ? maxv * height(cv, cols[0]) / hc : NaN;
          if (Math.abs(v - value) <= 0.5) {
            window.__chart.shown = performance.timeOrigin + performance.now();
            return;
          }
        }
      }
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  };
}"""


def _feed_work(server: TicktableServer) -> float:
    """CPU seconds the server's feeds spent building changes (under the shared lock)."""
    web = server.web
    assert web is not None
    return sum(f.feed.build_seconds for f in list(web.feeds.values()))


def _web_process_cpu(server: TicktableServer) -> float:
    """CPU seconds of the web UI's process so far (all its threads)."""
    assert server.web is not None and server.web.pid is not None
    with open(f"/proc/{server.web.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _browser_pss_mb() -> float:
    """PSS of every Chromium process, in MB."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if "chromium" not in (proc / "cmdline").read_bytes().split(b"\0")[0].decode():
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, IndexError, UnicodeDecodeError):
            continue
    return total / 1024


def _make_table(server: TicktableServer, name: str, rows: int) -> None:
    entry = server.registry.create_source(name, SCHEMA, "keyed", keys=["id"])
    step = 1_000_000
    for start in range(0, rows, step):
        ids = np.arange(start, min(rows, start + step), dtype=np.int64)
        entry.table.upsert(pa.table({"id": ids, "px": ids * 0.01, "qty": ids % 1000,  # type: ignore[attr-defined]
                                     "seq": np.zeros(ids.size, np.int64)}, schema=SCHEMA))
        server.graph.run_cycle()


class Driver:
    """Runs ``rate`` cycles a second, each upserting ``batch`` rows stamped with its number."""

    def __init__(self, server: TicktableServer, name: str, rows: int, batch: int,
                 rate: float, priority: str = "realtime") -> None:
        self.graph = server.graph
        self.priority = priority  # asked for; ``got`` is what the thread runs at
        self.got = "normal"
        self.table = server.registry.get(name).table
        self.rows, self.batch, self.period = rows, batch, 1.0 / rate
        self.rng = np.random.default_rng(1)
        self.seq = 0
        self.ends: dict[int, float] = {}  # seq -> wall-clock end of its cycle
        self.cycle_ms: dict[int, float] = {}  # seq -> its cycle's duration
        # seq -> (on-CPU ms, ms waiting for a core) of the cycle's thread during the cycle
        self.sched_ms: dict[int, tuple[float, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bench-driver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _run(self) -> None:
        # the thread that runs the cycles asks for what ``ticktable serve``'s cycle thread
        # asks for (UpdateGraph.start(priority=...))
        self.got = set_thread_priority(self.priority)
        nxt = time.perf_counter()
        while not self._stop.is_set():
            self.seq += 1
            others = self.rng.integers(PROBES, self.rows, self.batch - PROBES)
            ids = np.unique(np.concatenate([np.arange(PROBES), others]))
            self.table.upsert(pa.table({  # type: ignore[attr-defined]
                "id": ids, "px": self.rng.random(ids.size), "qty": self.rng.integers(0, 1000, ids.size),
                "seq": np.full(ids.size, self.seq, np.int64)}, schema=SCHEMA))
            s0 = _schedstat()
            self.graph.run_cycle()
            self.ends[self.seq] = time.time() * 1e3
            s1 = _schedstat()
            self.sched_ms[self.seq] = ((s1[0] - s0[0]) / 1e6, (s1[1] - s0[1]) / 1e6)
            self.cycle_ms[self.seq] = self.graph.last_cycle_seconds * 1e3
            nxt += self.period
            wait = nxt - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                nxt = time.perf_counter()  # behind: no catch-up burst


def _schedstat() -> tuple[int, int]:
    """This thread's nanoseconds on a core and waiting for one (Linux schedstat)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu), int(waiting)
    except OSError:
        return 0, 0


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def run_feed(browser, server: TicktableServer, feed: str, args) -> dict:
    name = "bench"
    drv = Driver(server, name, args.rows, args.batch, args.rate, args.cycle_priority)
    # baseline: the server cycling with no page open
    drv.start()
    b_wall, b_cpu = time.perf_counter(), time.process_time()
    time.sleep(args.baseline)
    base_cpu = (time.process_time() - b_cpu) / (time.perf_counter() - b_wall)
    drv.stop()
    base_cycles = list(drv.cycle_ms.values())
    base_waits = _waits(drv)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    t0 = time.perf_counter()
    page.goto(f"{server.web.url}?t={name}&feed={feed}")
    page.wait_for_function(FIRST_ROWS_JS, arg=[name], timeout=600_000, polling="raf")
    paint_s = time.perf_counter() - t0
    page.evaluate(PROBE_JS, [name])
    drv.start()
    time.sleep(args.warmup)
    work0, wall0, proc0 = _feed_work(server), time.perf_counter(), time.process_time()
    webp0 = _web_process_cpu(server)
    first_seq = drv.seq + 1
    time.sleep(args.seconds)
    last_seq = drv.seq
    work1, wall1, proc1 = _feed_work(server), time.perf_counter(), time.process_time()
    webp1 = _web_process_cpu(server)
    time.sleep(1.0)  # let the last cycles reach the screen
    drv.stop()
    seen = page.evaluate("window.__seen")
    pss = _browser_pss_mb()
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    heap = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    coalesced = _coalesced(server)
    page.close()
    measured = [drv.cycle_ms[s] for s in range(first_seq, last_seq + 1)]
    page_waits = _waits(drv, range(first_seq, last_seq + 1))
    seen_seqs = np.array([s for s, _ in seen], dtype=np.int64)
    seen_at = np.array([t for _, t in seen], dtype=np.float64)
    lat, never = [], 0
    for s in range(first_seq, last_seq + 1):
        i = int(np.searchsorted(seen_seqs, s))
        if i == seen_seqs.size:
            never += 1
            continue
        lat.append(seen_at[i] - drv.ends[s])
    on_own = int(np.isin(np.arange(first_seq, last_seq + 1), seen_seqs).sum())
    wall = wall1 - wall0
    return {
        "feed": feed, "rows": args.rows, "cycle_priority": drv.got,
        "cycles": last_seq - first_seq + 1,
        "cycles_per_s": (last_seq - first_seq + 1) / wall,
        "first_paint_s": paint_s,
        "latency_p50_ms": _pct(lat, 50), "latency_mean_ms": float(np.mean(lat)) if lat else None,
        "latency_p99_ms": _pct(lat, 99), "latency_max_ms": max(lat) if lat else None,
        "never_on_screen": never, "shown_on_their_own": on_own,
        "feed_coalesced_updates": coalesced,
        "cycle_p50_ms_no_page": _pct(base_cycles, 50), "cycle_p99_ms_no_page": _pct(base_cycles, 99),
        "cycle_p50_ms_page": _pct(measured, 50), "cycle_p99_ms_page": _pct(measured, 99),
        "cycle_p99_ratio": _pct(measured, 99) / _pct(base_cycles, 99),
        # where a slow cycle's time went: on a core, waiting for a core, or neither (the
        # GIL or a lock held by another thread)
        **{f"{k}_no_page": v for k, v in base_waits.items()},
        **{f"{k}_page": v for k, v in page_waits.items()},
        "server_cpu_no_page": base_cpu, "server_cpu_page": (proc1 - proc0) / wall,
        "web_cpu_cores": (proc1 - proc0) / wall - base_cpu + (webp1 - webp0) / wall,
        "server_web_cores": (proc1 - proc0) / wall - base_cpu,
        "web_process_cores": (webp1 - webp0) / wall,
        "feed_thread_cores": (work1 - work0) / wall,
        "browser_pss_mb": pss, "page_js_heap_mb": heap.get("JSHeapUsedSize", 0) / 2**20,
    }


def _waits(drv: Driver, seqs: range | None = None) -> dict[str, float]:
    """p99 over the cycles of their thread's on-core, waiting-for-a-core and other
    (GIL or lock) milliseconds."""
    seqs = seqs if seqs is not None else range(min(drv.cycle_ms), max(drv.cycle_ms) + 1)
    cpu = [drv.sched_ms[s][0] for s in seqs if s in drv.sched_ms]
    runq = [drv.sched_ms[s][1] for s in seqs if s in drv.sched_ms]
    other = [drv.cycle_ms[s] - sum(drv.sched_ms[s]) for s in seqs if s in drv.sched_ms]
    return {"cycle_cpu_p99_ms": _pct(cpu, 99), "cycle_runq_p99_ms": _pct(runq, 99),
            "cycle_other_p99_ms": _pct(other, 99)}


def _browser_exe(path: str, sched: str) -> str:
    """Chromium's executable, or (``idle``) a script running it under ``chrt --idle 0``."""
    if sched == "normal":
        return path
    import tempfile

    script = Path(tempfile.mkdtemp(prefix="bench_web_")) / "chromium-idle"
    script.write_text(f'#!/bin/sh\nexec chrt --idle 0 "{path}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def _medians(live: list[dict]) -> list[dict]:
    """Per feed, the median over its rounds of the figures the issue sets targets for."""
    out = []
    for feed in dict.fromkeys(r["feed"] for r in live):
        rounds = [r for r in live if r["feed"] == feed]
        out.append({"feed": feed, "rounds": len(rounds), **{
            k: float(np.median([r[k] for r in rounds]))
            for k in ("latency_p50_ms", "latency_p99_ms", "cycle_p99_ms_no_page",
                      "cycle_p99_ms_page", "cycle_p99_ratio", "web_cpu_cores")}})
    return out


def _coalesced(server: TicktableServer) -> int:
    web = server.web
    assert web is not None
    return sum(f.feed.coalesced for f in list(web.feeds.values()))


def first_paint(browser, server: TicktableServer, feed: str, rows: int) -> dict:
    name = f"paint{rows}"
    if name not in server.registry.names():
        t0 = time.perf_counter()
        _make_table(server, name, rows)
        print(f"  built {name} ({rows:,} rows) in {time.perf_counter() - t0:.1f} s", flush=True)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    t0 = time.perf_counter()
    page.goto(f"{server.web.url}?t={name}&feed={feed}")
    loaded = None
    try:
        page.wait_for_function(FIRST_ROWS_JS, arg=[name], timeout=600_000, polling="raf")
        out = time.perf_counter() - t0
        page.wait_for_function(  # every row in the grid's table (the header's row count)
            "([name, n]) => document.querySelector(`section.grid[data-table=\"${name}\"] .rows`)"
            "?.dataset.rows === String(n)", arg=[name, rows], timeout=600_000)
        loaded = time.perf_counter() - t0
        state = page.locator(f'section.grid[data-table="{name}"] .state').inner_text()
        pss = _browser_pss_mb()
    except Exception as exc:  # the browser gave up (memory): the number is the failure
        out, state, pss = None, f"failed: {type(exc).__name__}: {str(exc)[:120]}", _browser_pss_mb()
    page.close()
    time.sleep(2.0)  # the server releases the table's Perspective copy
    res = {"feed": feed, "rows": rows, "first_paint_s": out, "all_rows_s": loaded,
           "state": state, "browser_pss_mb": pss}
    print(f"  {res}", flush=True)
    return res


def chart_latency(browser, server: TicktableServer, feed: str, pushes: int) -> dict:
    """Push -> chart changed, one push at a time (module docstring)."""
    name = f"chart_{feed}"
    entry = server.registry.create_source(name, CHART_SCHEMA, "keyed", keys=["sym"])
    table = entry.table
    table.upsert(pa.table({"sym": ["a", "b", "c"], "v": [10.0, 50.0, CHART_MAX]},  # type: ignore[attr-defined]
                          schema=CHART_SCHEMA))
    server.graph.run_cycle()
    view = base64.urlsafe_b64encode(json.dumps(CHART_VIEW).encode()).decode().rstrip("=")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{server.web.url}?t={name}&feed={feed}#{name}={view}")
    page.wait_for_selector(f'section.grid[data-table="{name}"] .state.live', timeout=60_000)
    page.evaluate(CHART_JS, [name, CHART_MAX])
    rng = np.random.default_rng(2)
    lat, missed = [], 0
    for i in range(pushes + 5):  # the first five warm up
        value = float(20 + (i * 7) % 70)  # 20..89, never the value before
        page.evaluate("(v) => window.__await(v)", value)
        table.upsert(pa.table({"sym": ["a"], "v": [value]}, schema=CHART_SCHEMA))  # type: ignore[attr-defined]
        server.graph.run_cycle()
        end = time.time() * 1e3
        try:
            page.wait_for_function("() => window.__chart.shown !== null", timeout=5000,
                                   polling=20)
        except Exception:  # not drawn in 5 s: counted, not timed
            missed += 1
            continue
        if i >= 5:
            lat.append(page.evaluate("() => window.__chart.shown") - end)
        time.sleep(rng.uniform(0.05, 0.15))
    page.close()
    server.registry.drop(name)
    server.graph.run_cycle()
    res = {"feed": feed, "pushes": len(lat), "missed": missed,
           "chart_p50_ms": _pct(lat, 50), "chart_mean_ms": float(np.mean(lat)) if lat else None,
           "chart_p99_ms": _pct(lat, 99), "chart_max_ms": max(lat) if lat else None}
    print(f"  {res}", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=100.0, help="cycles per second")
    ap.add_argument("--batch", type=int, default=1000, help="rows upserted per cycle")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per feed")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--baseline", type=float, default=10.0,
                    help="seconds of cycles with no page open, per feed")
    ap.add_argument("--feeds", default="perspective,arrow")
    ap.add_argument("--paint-sizes", default="1000000,10000000")
    ap.add_argument("--web-sched", choices=["idle", "nice"], default="idle",
                    help="ServerConfig.web_sched: how the web UI's process runs")
    ap.add_argument("--web-interval", type=float, default=0.05,
                    help="ServerConfig.web_interval: seconds between changes sent to a grid")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds per feed (no page, then the page), reported one by one and "
                         "as the median: the cycle p99 of a 2-core machine moves between runs")
    ap.add_argument("--browser-sched", choices=("normal", "idle"), default="normal",
                    help="'idle': Chromium runs under SCHED_IDLE (chrt --idle), as if it were on "
                         "another machine: on this one it shares the server's cores, and its "
                         "compositor threads raise themselves to nice -8")
    ap.add_argument("--cycle-priority", choices=PRIORITIES, default="realtime",
                    help="the cycle thread's priority (engine.priority), as `ticktable serve "
                         "--cycle-priority`: 'realtime' (its default) or 'normal'")
    ap.add_argument("--chart-pushes", type=int, default=300,
                    help="pushes timed to a bar chart's change, per feed (0: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    path, version = find_chromium()
    if version is None:
        print(f"bench_web: no Chromium at {path} (python -m ticktable.chromium_check)",
              file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    graph = UpdateGraph()  # cycles driven by the bench: no periodic thread
    server = TicktableServer(graph, ServerConfig(http_port=0, web_interval=args.web_interval,
                                                 web_sched=args.web_sched)).start()
    feeds = [f for f in args.feeds.split(",") if f]
    live, paints, charts = [], [], []
    try:
        _make_table(server, "bench", args.rows)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_browser_exe(path, args.browser_sched),
                                        headless=True)
            for rnd in range(args.repeat):
                for feed in feeds:  # feeds take turns, so load changes hit both alike
                    print(f"feed {feed}, round {rnd + 1}: {args.rows:,} rows, {args.rate:g} "
                          f"cycles/s of {args.batch:,}-row upserts, {args.seconds:g} s", flush=True)
                    live.append({"round": rnd + 1, **run_feed(browser, server, feed, args)})
                    print(f"  {live[-1]}", flush=True)
                    time.sleep(2.0)
            if args.chart_pushes:
                for feed in feeds:
                    print(f"chart: {args.chart_pushes} pushes, feed {feed}", flush=True)
                    charts.append(chart_latency(browser, server, feed, args.chart_pushes))
            for rows in [int(x) for x in args.paint_sizes.split(",") if x]:
                for feed in feeds:
                    print(f"first paint: {rows:,} rows, feed {feed}", flush=True)
                    paints.append(first_paint(browser, server, feed, rows))
            browser.close()
    finally:
        server.shutdown()
    got = sorted({r["cycle_priority"] for r in live})
    print(f"\nchromium {version} ({args.browser_sched} scheduling); nproc {os.cpu_count()}; "
          f"server and driver in this process; cycle thread asked for {args.cycle_priority}, "
          f"ran at {', '.join(got) or '-'}")
    medians = _medians(live)
    print_table(f"median over {args.repeat} rounds (targets: latency p99 <= 250 ms, cycle p99 "
                f"ratio <= 1.5)", medians, list(medians[0]) if medians else [])
    print_table("live table open in the page (latency: cycle end -> value on screen)", live, [
        "feed", "round", "rows", "cycles_per_s", "latency_p50_ms", "latency_mean_ms", "latency_p99_ms",
        "latency_max_ms", "never_on_screen", "shown_on_their_own", "feed_coalesced_updates"])
    print_table("server cost (targets: latency p99 <= 250 ms, cycle p99 ratio <= 1.5)", live, [
        "feed", "round", "cycle_priority", "cycle_p50_ms_no_page", "cycle_p99_ms_no_page", "cycle_p50_ms_page",
        "cycle_p99_ms_page", "cycle_p99_ratio", "server_cpu_no_page", "server_cpu_page",
        "web_cpu_cores", "server_web_cores", "web_process_cores", "feed_thread_cores",
        "browser_pss_mb", "page_js_heap_mb"])
    print_table("    profile: the cycle thread's time per cycle, p99 ms: on a core, waiting for a "
                "core (run queue), and neither (the GIL or a lock another thread held)", live, [
        "feed", "round", "cycle_cpu_p99_ms_no_page", "cycle_cpu_p99_ms_page", "cycle_runq_p99_ms_no_page",
        "cycle_runq_p99_ms_page", "cycle_other_p99_ms_no_page", "cycle_other_p99_ms_page"])
    if charts:
        print_table("a chart's latency: push (cycle end) -> a Y Bar chart showing it", charts,
                    ["feed", "pushes", "missed", "chart_p50_ms", "chart_mean_ms",
                     "chart_p99_ms", "chart_max_ms"])
    if paints:  # --paint-sizes "" skips them
        print_table("time to first paint (navigation -> first rows drawn)", paints,
                    ["feed", "rows", "first_paint_s", "all_rows_s", "browser_pss_mb", "state"])
    write_json("bench_web", {"chromium": version, "args": vars(args), "live": live,
                             "medians": medians, "first_paint": paints, "charts": charts},
               args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
