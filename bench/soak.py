"""soak — one server under a steady, mixed load for minutes or hours (issue #18 item 9; not CI).

Three spawned processes, so that none shares a GIL with another:

* **the server**, over its own update graph cycling every ``--interval`` s (in memory, or
  durable with ``--data-dir``), timing every cycle;
* **the writers**: four threads, each one long DoPut stream upserting ``--rows`` rows
  (5% of them deletes, random keys in ``[0, --keys)``) every 10 ms, two into ``orders``
  and two into ``quotes`` (both keyed on ``Key``, the benchmarks' 4-column schema);
  acknowledgements are read on a thread of their own, so a slow ack does not slow the
  schedule, only flow control does;
* **this process**: ``--subscribers`` :class:`~clients.live.LiveTable` subscriptions (one
  reader thread each) over the two sources and three derived tables built through the
  TableService (``client.table(...)``): ``by_price`` = ``orders.sort("Price")``,
  ``enriched`` = ``orders.natural_join(quotes, "Key")`` and ``by_sym`` =
  ``orders.agg_by(..., "Sym")``. The mix (:data:`_MIX`, repeated every 20) has full
  tables, viewports (some scrolling every 5 s), a column subset, and slow subscribers
  whose callback sleeps 0.25-2 s per update (their reader stops reading meanwhile, so
  the transport's flow control holds the server's sender back and the server coalesces).

Every 10 s one line: elapsed seconds; the cycles of that window (count, p50/p99/max of
their durations measured in the server process, and p99 of the gap from one cycle's end
to the next, which includes waiting for subscribers to release the graph's lock); the
largest subscriber lag in graph steps (the server's ``stats`` action: steps since the
last message its sender wrote; then per subscriber here, graph step minus the step of the
last message it applied, fast and slow apart); the server's RSS and CPU (percent of one
core); rows acknowledged so far and the rate of the window; and the server's and this
process's warning counts. When ``ServerConfig`` has a
``metrics_port`` the server gets one and a few lines of ``/metrics`` follow each report.

At the end the writers stop, every subscriber waits for its table's last update, and each
is compared exactly with a DoGet snapshot (a viewport with the snapshot's rows at its
positions, a column subset with those columns). Printed: lag per kind of subscriber,
mismatches, cycle p50/p99 and the largest lag after ``--warmup``, the RSS growth from the
first report after the warm-up to the last one, and the writers' rate and ack latency.

Run: python bench/soak.py [--duration 600] [--subscribers 100] [--warmup 30]
     [--keys 100000] [--interval 0.1] [--data-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

import ticktable as tt  # noqa: E402
from bench._common import SCHEMA, batch, print_table, write_json  # noqa: E402
from bench._soak_procs import (  # noqa: E402
    PERIOD,
    WRITERS,
    Counting,
    ServerProcess,
    count_warnings,
    rss_mb,
    run_writers,
)
from clients.live import LiveTable  # noqa: E402
from flight.server import ServerConfig  # noqa: E402

REPORT_SECONDS = 10.0
SCROLL_SECONDS = 5.0
VIEW_ROWS = 100


# ------------------------------------------------------------------ subscribers
@dataclass(frozen=True, slots=True)
class _Spec:
    """One kind of subscriber: its table, viewport, columns and pace.

    ``viewport`` holds where each window of ``VIEW_ROWS`` rows begins, as a fraction of
    ``--keys``.
    """

    table: str
    viewport: tuple[float, ...] | None = None
    columns: tuple[str, ...] | None = None
    slow: float = 0.0  # seconds its callback sleeps per update
    scroll: bool = False  # moves its viewport every SCROLL_SECONDS

    def label(self) -> str:
        parts = [self.table]
        if self.viewport is not None:
            parts.append("scrolling viewport" if self.scroll else "viewport")
        if self.columns is not None:
            parts.append("columns " + ",".join(self.columns))
        if self.slow:
            parts.append(f"slow {self.slow:g}s")
        return " ".join(parts)


_TOP = (0.0,)
_MID = (0.45,)
_TWO = (0.0, 0.8)
#: Subscriber ``i`` is ``_MIX[i % 20]``; the first 20 cover every kind.
_MIX = (
    _Spec("by_sym"), _Spec("by_price", _TOP), _Spec("enriched", _MID), _Spec("orders"),
    _Spec("by_sym", slow=0.25), _Spec("by_price", _MID), _Spec("enriched"),
    _Spec("by_price", _TOP, scroll=True), _Spec("by_price", _TOP, slow=0.5),
    _Spec("quotes", columns=("Key", "Price")), _Spec("by_sym"), _Spec("by_price", _TWO),
    _Spec("enriched", slow=1.0), _Spec("by_sym"), _Spec("enriched", _TOP),
    _Spec("orders", slow=2.0), _Spec("by_sym", _TOP), _Spec("by_price", _TOP),
    _Spec("by_sym"), _Spec("by_sym", columns=("Sym", "N")),
)


class _Subscriber:
    def __init__(self, client: tt.Client, spec: _Spec, nkeys: int) -> None:
        self.spec = spec
        self.updates = 0
        self.lag_max = 0  # graph steps behind, at the reports after the warm-up
        self.lag_last = 0
        vp = None if spec.viewport is None else [
            (int(a * nkeys), int(a * nkeys) + VIEW_ROWS) for a in spec.viewport]
        self.live: LiveTable = client.subscribe(
            spec.table, columns=list(spec.columns) if spec.columns else None, viewport=vp,
            on_update=self._on_update)

    def _on_update(self, update: Any) -> None:
        self.updates += 1
        if self.spec.slow:
            time.sleep(self.spec.slow)  # the reader thread stops reading: flow control

    def scroll(self, rng: np.random.Generator) -> None:
        size = self.live.size
        begin = int(rng.integers(0, max(1, size - VIEW_ROWS)))
        self.live.set_viewport([(begin, begin + VIEW_ROWS)], timeout=0)


def _build_tables(client: tt.Client, nkeys: int) -> None:
    """The two keyed sources, loaded with every key once, and the three derived tables."""
    rng = np.random.default_rng(1)
    for name in ("orders", "quotes"):
        client.create_table(name, SCHEMA, "keyed", keys=["Key"])
        client.push(name, batch(rng, np.arange(nkeys)), mode="upsert")
    orders = client.table("orders")
    orders.sort("Price").create("by_price")
    orders.natural_join("quotes", "Key", ["QPrice=Price", "QQty=Qty"]).create("enriched")
    orders.agg_by([tt.agg.sum("Qty"), tt.agg.mean("Price", "AvgPrice"),
                   tt.agg.max("Price", "MaxPrice"), tt.agg.count("N")], "Sym").create("by_sym")


# ------------------------------------------------------------------ reports
def _metrics(port: int) -> list[str]:
    """A few lines of the server's Prometheus endpoint: step, cycles, rows put, worst lag."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError as exc:
        return [f"(metrics endpoint: {exc})"]
    samples = [x for x in text.splitlines() if x and not x.startswith("#")]
    picked = [x for x in samples if x.startswith(_METRICS)]
    lags = [x for x in samples if x.startswith("ticktable_table_max_lag_steps")]
    if lags:  # the table with the furthest-behind subscriber
        picked.append(max(lags, key=lambda x: float(x.rsplit(" ", 1)[1])))
    return picked or samples[:4]


_METRICS = ("ticktable_step ", "ticktable_cycle_seconds_count", "ticktable_cycle_seconds_sum",
            "ticktable_put_rows_total")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class _Monitor:
    """One report line every REPORT_SECONDS; what each window saw, kept for the summary."""

    HEADER = (f"{'t_s':>5} {'cycles':>6} {'p50_ms':>7} {'p99_ms':>7} {'max_ms':>7} {'gap99':>6} "
              f"{'lag':>4} {'(table)':<9} {'fast':>4} {'slow':>4} {'rss_mb':>7} {'cpu%':>5} "
              f"{'rows':>11} {'rows/s':>8} {'warn':>5}")

    def __init__(self, server: ServerProcess, client: tt.Client, subs: list[_Subscriber],
                 acked: Any, warnings: Counting, warmup: float,
                 metrics_port: int | None) -> None:
        self.server, self.client, self.subs = server, client, subs
        self.acked, self.warnings, self.warmup = acked, warnings, warmup
        self.metrics_port = metrics_port
        self.reports: list[dict[str, Any]] = []
        self.cycles_after_warmup: list[float] = []
        self.gaps_after_warmup: list[float] = []
        self._last_end: float | None = None
        self._rows = 0
        self._cpu = _cpu_seconds(server.pid)
        self._at = time.monotonic()

    def report(self, elapsed: float) -> None:
        ends_durations, server_warnings = self.server.cycles()
        ends = [e for e, _ in ends_durations]
        cycles = [d for _, d in ends_durations]
        # a cycle's gap: from the end of the one before (waiting for the lock included)
        gaps = np.diff(([] if self._last_end is None else [self._last_end]) + ends) * 1e3
        self._last_end = ends[-1] if ends else self._last_end
        st = self.client.stats()
        now, cpu, rows = time.monotonic(), _cpu_seconds(self.server.pid), int(sum(self.acked[:]))
        step = int(st.attrs["step"])
        for s in self.subs:  # behind the graph by this many steps as of its last update
            s.lag_last = step - s.live.step
            if elapsed >= self.warmup:
                s.lag_max = max(s.lag_max, s.lag_last)
        fast = max((s.lag_last for s in self.subs if not s.spec.slow), default=0)
        slow = max((s.lag_last for s in self.subs if s.spec.slow), default=0)
        ms = np.array(cycles or [np.nan])
        worst = st.iloc[int(np.argmax(st["max_lag_steps"].to_numpy()))]
        row = {"elapsed_s": round(elapsed, 1), "cycles": len(cycles),
               "cycle_p50_ms": float(np.median(ms)), "cycle_p99_ms": float(np.percentile(ms, 99)),
               "cycle_max_ms": float(ms.max()),
               "cycle_gap_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else float("nan"),
               "max_lag_steps": int(worst["max_lag_steps"]),
               "max_lag_table": str(worst["name"]), "lag_fast_steps": fast,
               "lag_slow_steps": slow, "server_subscribers": int(st["subscribers"].sum()),
               "server_rss_mb": rss_mb(self.server.pid),
               "server_cpu_pct": 100 * (cpu - self._cpu) / (now - self._at),
               "rows_written": rows, "rows_per_s": (rows - self._rows) / (now - self._at),
               "warnings": sum(server_warnings.values()) + sum(self.warnings.counts.values()),
               "step": step}
        self._rows, self._cpu, self._at = rows, cpu, now
        if elapsed >= self.warmup:
            self.cycles_after_warmup.extend(cycles)
            self.gaps_after_warmup.extend(gaps.tolist())
        print(f"{elapsed:5.0f} {len(cycles):6d} {row['cycle_p50_ms']:7.1f} "
              f"{row['cycle_p99_ms']:7.1f} {row['cycle_max_ms']:7.1f} "
              f"{row['cycle_gap_p99_ms']:6.0f} "
              f"{row['max_lag_steps']:4d} {row['max_lag_table']:<9} {fast:4d} {slow:4d} "
              f"{row['server_rss_mb']:7.0f} {row['server_cpu_pct']:5.0f} {rows:11,d} "
              f"{row['rows_per_s']:8,.0f} {row['warnings']:5d}", flush=True)
        if self.metrics_port is not None:
            lines = _metrics(self.metrics_port)
            for line in lines:
                print(f"      {line}")
            row["metrics"] = lines
        self.reports.append(row)


# ------------------------------------------------------------------ the end
def _settle(client: tt.Client, interval: float, timeout: float = 120.0) -> dict[str, int]:
    """Each table's last update sequence, once no sequence moved for a few cycles."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    still = 0
    while still < 3 and time.monotonic() < deadline:
        time.sleep(max(0.3, 3 * interval))
        st = client.stats()
        now = dict(zip(st["name"], st["sequence"].astype(int), strict=True))
        still = still + 1 if now == last else 0
        last = now
    return last


def _check(client: tt.Client, subs: list[_Subscriber], sequences: dict[str, int],
           timeout: float = 300.0) -> list[dict[str, Any]]:
    """Every subscriber against a snapshot of its table; the mismatches, described.

    Slow subscribers first read what the transport still buffers for them (up to a minute
    of 2 s callbacks), hence the long ``timeout``; one still behind after it is reported.
    """
    deadline = time.monotonic() + timeout
    for s in subs:
        s.live.wait_for(sequence=sequences[s.spec.table],
                        timeout=max(0.0, deadline - time.monotonic()))
    snaps: dict[str, pa.Table] = {}
    for name in sequences:
        snap = client.snapshot(name, as_="arrow")
        assert isinstance(snap, pa.Table)
        snaps[name] = snap
    bad = []
    for i, s in enumerate(subs):
        live = s.live
        snap = snaps[s.spec.table]
        got = live.to_arrow()
        cols = live.columns or snap.column_names
        want = snap.select(cols)
        vp = live.viewport
        if vp is not None:
            pos = [np.arange(min(b, snap.num_rows), min(e, snap.num_rows)) for b, e in vp]
            want = want.take(pa.array(np.unique(np.concatenate(pos)), pa.int64()))
        problem = None
        if live.error is not None:
            problem = f"failed: {live.error!r}"
        elif live.sequence != sequences[s.spec.table]:
            problem = f"at sequence {live.sequence}, the table at {sequences[s.spec.table]}"
        elif live.size != snap.num_rows:
            problem = f"size {live.size}, snapshot {snap.num_rows}"
        elif not got.select(cols).equals(want):
            problem = _first_difference(got.select(cols), want)
        if problem is not None:
            bad.append({"subscriber": i, "kind": s.spec.label(), "viewport": vp,
                        "problem": problem})
    return bad


def _first_difference(got: pa.Table, want: pa.Table) -> str:
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows held, the snapshot has {want.num_rows} there"
    for name in want.column_names:
        a, b = got[name].combine_chunks(), want[name].combine_chunks()
        if not a.equals(b):
            diff = np.flatnonzero(~np.asarray(a.to_numpy(zero_copy_only=False)
                                               == b.to_numpy(zero_copy_only=False)))
            at = int(diff[0]) if diff.size else 0
            return (f"column {name!r} differs at {diff.size} row(s), first at {at}: "
                    f"{got.slice(at, 1).to_pylist()} vs {want.slice(at, 1).to_pylist()}")
    return "same values, different types"


# ------------------------------------------------------------------ main
def run(args: argparse.Namespace) -> dict[str, Any]:
    warnings = count_warnings("client")
    logging.getLogger("clients.subscription").setLevel(logging.ERROR)  # reconnects: counted below
    server = ServerProcess(args.data_dir, args.interval,
                           metrics="metrics_port" in ServerConfig.__dataclass_fields__)
    metrics_port = server.metrics_port
    ctx = mp.get_context("spawn")
    stop, acked = ctx.Event(), ctx.Array("q", len(WRITERS))
    writers_conn, child = ctx.Pipe()
    writers = ctx.Process(target=run_writers, daemon=True,
                          args=(server.location, args.keys, args.rows, stop, acked, child))
    client = tt.connect(server.location)
    subs: list[_Subscriber] = []
    try:
        t0 = time.perf_counter()
        _build_tables(client, args.keys)
        subs = [_Subscriber(client, _MIX[i % len(_MIX)], args.keys)
                for i in range(args.subscribers)]
        for s in subs:
            s.live.wait_for(timeout=120)
        print(f"server {server.location} (pid {server.pid}), tables loaded with {args.keys:,} "
              f"keys and {len(subs)} subscribers connected in {time.perf_counter() - t0:.1f} s; "
              f"{len(WRITERS)} writers x {args.rows:,} rows / {PERIOD * 1e3:g} ms for "
              f"{args.duration:g} s; " + (f"metrics at http://127.0.0.1:{metrics_port}/metrics"
                                          if metrics_port else "no metrics endpoint"),
              flush=True)
        print(_Monitor.HEADER)
        server.cycles()  # the load and the first snapshots are not the soak's cycles
        monitor = _Monitor(server, client, subs, acked, warnings, args.warmup, metrics_port)
        writers.start()
        start = time.monotonic()
        rng = np.random.default_rng(7)
        next_report, next_scroll = REPORT_SECONDS, SCROLL_SECONDS
        while next_report <= args.duration + 1e-6:
            time.sleep(max(0.0, min(next_report, next_scroll) - (time.monotonic() - start)))
            elapsed = time.monotonic() - start
            if elapsed >= next_scroll:
                for s in subs:
                    if s.spec.scroll:
                        s.scroll(rng)
                next_scroll += SCROLL_SECONDS
            if elapsed >= next_report:
                monitor.report(elapsed)
                next_report += REPORT_SECONDS
        t_end = time.monotonic()
        stop.set()
        writer_stats = writers_conn.recv()  # once every batch sent was acknowledged
        writers.join(30)
        t_acked = time.monotonic()
        sequences = _settle(client, args.interval)
        t_settled = time.monotonic()
        mismatches = _check(client, subs, sequences)
        print(f"\nwind-down: writers' last acks {t_acked - t_end:.1f} s after they stopped, "
              f"tables still {t_settled - t_acked:.1f} s later, subscribers caught up and "
              f"checked in {time.monotonic() - t_settled:.1f} s", flush=True)
        _, server_warnings = server.cycles()
    finally:
        stop.set()
        for s in subs:
            s.live.close(timeout=2)
        client.close()
        server.stop()
    return _summary(args, monitor, writer_stats, mismatches,
                    {"server": server_warnings, "client": dict(warnings.counts)})


def _summary(args: argparse.Namespace, monitor: _Monitor, writer_stats: list[dict[str, Any]],
             mismatches: list[dict[str, Any]], warnings: dict[str, dict[str, int]]) -> dict[str, Any]:
    reports, subs = monitor.reports, monitor.subs
    after = [r for r in reports if r["elapsed_s"] >= args.warmup] or reports[-1:]
    base, last = after[0], reports[-1]
    ms = np.array(monitor.cycles_after_warmup or [np.nan])
    gaps = np.array(monitor.gaps_after_warmup or [np.nan])
    summary = {
        "cycles": int(ms.size), "cycle_p50_ms": float(np.median(ms)),
        "cycle_p99_ms": float(np.percentile(ms, 99)), "cycle_max_ms": float(ms.max()),
        "cycle_gap_p50_ms": float(np.median(gaps)),
        "cycle_gap_p99_ms": float(np.percentile(gaps, 99)),
        "max_lag_steps": max(r["max_lag_steps"] for r in after),
        "max_lag_fast_steps": max(r["lag_fast_steps"] for r in after),
        "max_lag_slow_steps": max(r["lag_slow_steps"] for r in after),
        "rss_base_mb": base["server_rss_mb"], "rss_last_mb": last["server_rss_mb"],
        "rss_growth_pct": 100 * (last["server_rss_mb"] / base["server_rss_mb"] - 1),
        "rss_base_at_s": base["elapsed_s"],
        "rows_written": last["rows_written"],
        "rows_per_s": last["rows_written"] / max(1e-9, last["elapsed_s"]),
        "target_rows_per_s": len(WRITERS) * args.rows / PERIOD,
        "subscribers_checked": len(subs), "mismatches": len(mismatches),
        "reconnects": sum(s.live.reconnects for s in subs),
    }
    kinds: dict[str, list[_Subscriber]] = {}
    for s in subs:
        kinds.setdefault(s.spec.label(), []).append(s)
    by_kind = [{"kind": k, "n": len(v), "updates": sum(s.updates for s in v) // len(v),
                "lag_max": max(s.lag_max for s in v), "lag_last": max(s.lag_last for s in v)}
               for k, v in kinds.items()]
    print_table("subscribers by kind: updates applied (mean), lag in steps after the warm-up "
                "(max) and at the last report", by_kind,
                ["kind", "n", "updates", "lag_max", "lag_last"])
    print(f"\n== after the {args.warmup:g} s warm-up ({summary['cycles']} cycles)")
    print(f"cycle p50 {summary['cycle_p50_ms']:.1f} ms, p99 {summary['cycle_p99_ms']:.1f} ms, "
          f"max {summary['cycle_max_ms']:.1f} ms; from one cycle's end to the next (the "
          f"interval is {args.interval * 1e3:g} ms): p50 {summary['cycle_gap_p50_ms']:.0f} ms, "
          f"p99 {summary['cycle_gap_p99_ms']:.0f} ms")
    print(f"max subscriber lag {summary['max_lag_steps']} steps (server stats); per "
          f"subscriber: fast {summary['max_lag_fast_steps']}, slow "
          f"{summary['max_lag_slow_steps']}; reconnects {summary['reconnects']}")
    print(f"server RSS {summary['rss_base_mb']:.0f} MB at {summary['rss_base_at_s']:.0f} s -> "
          f"{summary['rss_last_mb']:.0f} MB: {summary['rss_growth_pct']:+.1f}%")
    print(f"rows written {summary['rows_written']:,} ({summary['rows_per_s']:,.0f}/s, target "
          f"{summary['target_rows_per_s']:,.0f}/s)")
    for w in writer_stats:
        print(f"  writer {w['table']}: ack p50 {w['ack_p50_ms']:.1f} ms mean "
              f"{w['ack_mean_ms']:.1f} ms p99 "
              f"{w['ack_p99_ms']:.1f} ms max {w['ack_max_ms']:.0f} ms, max behind "
              f"{w['max_behind_s']:.2f} s, skipped ticks {w['skipped_ticks']}"
              + (f", error {w['error']}" if w["error"] else ""))
    print(f"subscribers checked against snapshots: {len(subs)}, mismatches: {len(mismatches)}")
    for m in mismatches[:10]:
        print(f"  #{m['subscriber']} {m['kind']} {m['viewport'] or ''}: {m['problem']}")
    for side, counts in warnings.items():
        for msg, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5]:
            print(f"  {side} log x{n}: {msg}")
    return {"args": vars(args), "summary": summary, "reports": reports, "by_kind": by_kind,
            "writers": writer_stats, "mismatches": mismatches, "warnings": warnings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of writing")
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--warmup", type=float, default=30.0,
                    help="seconds left out of the cycle figures; RSS growth is from here")
    ap.add_argument("--keys", type=int, default=100_000, help="key space of each source table")
    ap.add_argument("--rows", type=int, default=1000, help="rows per writer batch")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between cycles")
    ap.add_argument("--data-dir", default=None, help="durable server data dir (default: in memory)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.duration < REPORT_SECONDS:
        ap.error(f"--duration must be at least {REPORT_SECONDS:g} s (one report)")
    write_json("soak", run(args), args.json)


if __name__ == "__main__":
    main()
