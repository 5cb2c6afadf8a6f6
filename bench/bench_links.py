"""bench_links: server-to-server links (mirrors) — latency per hop, resume after a cut, fan-out
(issue #37).

Every server, writer, subscriber and the proxy is a spawned process of its own
(bench/_links_procs.py), so none shares a GIL with another; this process only drives them
over pipes and computes the figures. All run on this host: times are ``perf_counter``
(CLOCK_MONOTONIC) in every process, compared directly. The servers cycle every --interval s
(``ticktable serve``'s default) at --cycle-priority; a push asks for a cycle at once, and
so does a mirror's link for each message it stages.

The table: keyed on ``k``, loaded with every one of --keys keys first; each push (the
writer's ``tt.connect(A).push(t, rows, mode="upsert")``, which returns once the rows are
visible on A) upserts --rows distinct random keys, all rows carrying the push's ``seq`` and
``sent_ns`` (``perf_counter_ns()`` just before ``push``). A subscriber (``client.subscribe``,
all columns) stamps ``perf_counter_ns()`` when its ``on_update`` callback starts (the message
is applied) and records the ``seq`` and ``sent_ns`` values the message carries.

Topology of sections 1 and 2 (one run of servers)::

    writer -> A --proxy--> B --> C --> D        (B mirrors A through the TCP proxy,
              |            |     |     |         C mirrors B, D mirrors C)
             sub          sub   sub   sub       (one subscriber process per server)

1. Added latency per hop: two writer threads share --rate pushes/s of --rows rows into A
   (a push returns once A applied it: one thread could not keep the rate when a push takes
   over 1/rate), --seconds after --warmup. For each push seen by all four subscribers,
   hop k's latency is the time A..D's subscriber applied it minus the time the subscriber of
   the server before it did (so it also holds the difference of the two subscribers' own
   delays, and can be negative); also writer -> A (``sent_ns`` to A's subscriber: push,
   A's cycle, fan-out) and end to end A -> D and writer -> D. p50/mean/p99/max per hop;
   goal p99 <= 10 ms per hop. Hop A -> B goes through the proxy (another process: two more
   loopback sockets). (Before 2026-11-28 22:30 a mirror waited for its next periodic cycle,
   so a hop added up to --interval; its link now wakes the cycle for every staged message,
   as a push does.) CPU per process (% of one core) and of the machine meanwhile.
2. Resume after a cut: while the writer goes on, the proxy aborts B's connection and every
   new one for --cut-seconds (as a reset network would), then forwards again. From B's link
   (instrumented in B's process): the first message after the restore, delta or snapshot
   (the origin keeps 256 updates of history), and the bytes the link counted for it
   (``Link.bytes_received``: Arrow buffers plus metadata) and the bytes the proxy forwarded
   on that connection until B was in sync (the wire: gRPC framing included). Against it: a
   fresh mirror of the same table on B from scratch (``t_fresh``, through the proxy too,
   then dropped), its snapshot's bytes counted the same two ways. Times from the restore:
   until B's link was in sync, and until the subscribers of B, C and D had applied the last
   push sent before the restore. The cut's pushes and the link's reconnect attempts are
   counted.

3. Fan-out (separate servers, a table of --fan-keys keys): --fan-writers writer threads (one
   process), each asking --fan-rate pushes/s of --fan-rows rows into A, for --fan-seconds
   after --warmup, in three cases: writers only (no subscriber: the baseline); --fan-procs
   subscriber processes x --fan-subs subscriptions all on A; A plus --fan-procs mirror
   servers, subscriber process i subscribing its --fan-subs to mirror i. For each: A's cycle
   p99 (the ``stats`` action's ``cycle_p99_ms``, over A's last 1,000 cycles, and over the
   window's cycles as timed in A's process, with the p99 gap between cycle ends); the
   delivered latency (``sent_ns`` to a subscriber's callback, every push of the window at
   every subscriber, waiting up to --drain s after the writers stop for late deliveries);
   the writers' acknowledgement (``push`` returned minus ``sent_ns``); rows/s acknowledged
   against asked; deliveries (a push seen by a subscriber) of expected (pushes x
   subscribers: a subscriber that fell behind receives composed deltas, in which a push
   whose every row a later push overwrote is gone, as a keyed table's values should be, or a
   catch-up snapshot when the origin's history no longer reaches back: counted); CPU by role (A, the mirrors, the subscriber
   processes, the writers: % of one core) and the machine's (% of all cores). The subscriber
   processes run at nice :data:`FAN_NICE` (see there). With --fan-pin, A and the writer
   process keep to the first CPU and the mirrors and subscriber processes to the others, in
   every case: on one host, that stands in for the mirrors' and clients' own machines, so
   the writers' figures show what serving them costs A rather than what the host's other
   processes take from it. Goals: the writers unaffected by the
   number of subscribers (here: rows/s >= 0.95x the writers-only case); ack p99 <= 1 s with
   400 subscribers.

Run: python bench/bench_links.py [--quick] [--sections chain fanout] [--json PATH]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import print_table, write_json  # noqa: E402
from bench._links_procs import SCHEMA, proxy, rows, serve, subscribe, write  # noqa: E402

RESUME = {0: "none", 1: "deltas", 2: "snapshot"}  # flight.proto's ResumeResult


def _stats(ms: np.ndarray | list[float]) -> dict[str, float | int | None]:
    a = np.asarray(ms, dtype=float)
    if not a.size:
        return {"p50_ms": None, "mean_ms": None, "p99_ms": None, "max_ms": None, "n": 0}
    return {"p50_ms": float(np.median(a)), "mean_ms": float(a.mean()),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "n": int(a.size)}


def _machine() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)  # idle, iowait


def _busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    return 100.0 * (after[0] - before[0]) / max(1, after[1] - before[1])


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(procs: list[Proc]) -> float:
    """User + system CPU seconds of ``procs``, all threads."""
    total = 0.0
    for p in procs:
        stat = Path(f"/proc/{p.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


class CpuWindow:
    """CPU of the bench's processes by role, and of the whole machine, over a window."""

    def __init__(self, roles: dict[str, list[Proc]]) -> None:
        self.roles = roles
        self.machine = _machine()
        self.at = time.perf_counter()
        self.cpu = {r: _cpu_s(ps) for r, ps in roles.items()}

    def end(self) -> dict[str, float]:
        """Percent of one core per role, and ``machine`` as percent of all cores."""
        dt = time.perf_counter() - self.at
        out = {r: 100.0 * (_cpu_s(ps) - self.cpu[r]) / dt for r, ps in self.roles.items()}
        out["machine"] = _busy_pct(self.machine, _machine())
        return out


class Proc:
    """One spawned process of bench/_links_procs.py; ``call`` runs one of its commands."""

    def __init__(self, target: Any, params: dict[str, Any], timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, params), daemon=True)
        self.proc.start()
        child.close()
        self.hello: Any = self._reply(timeout)

    def call(self, *cmd: Any, timeout: float = 300.0) -> Any:
        self.conn.send(cmd)
        return self._reply(timeout)

    def _reply(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"process {self.proc.pid} did not answer in {timeout:g} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"process {self.proc.pid}: {value}")
        return value

    def close(self) -> None:
        try:
            self.call("stop", timeout=30.0)
        except (RuntimeError, OSError, EOFError):
            pass
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class Server(Proc):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(serve, {"interval": args.interval, "priority": args.cycle_priority})
        self.location: str = self.hello["location"]
        self.priority: str = self.hello["priority"]


def _close_all(procs: list[Proc]) -> None:
    for p in reversed(procs):
        p.close()


def _load(location: str, table: str, keys: int) -> None:
    """Create keyed ``table`` on the server and load every key once (``seq`` -1)."""
    import ticktable as tt

    rng = np.random.default_rng(1)
    with tt.connect(location) as c:
        c.create_table(table, SCHEMA, "keyed", keys=["k"])
        for s in range(0, keys, 1_000_000):
            c.push(table, rows(rng, np.arange(s, min(keys, s + 1_000_000)), -1, 0), mode="upsert")


def _first_recv(log: dict[str, Any]) -> dict[int, int]:
    """seq -> when a subscriber first applied it (ns)."""
    seq, recv = log["seq"], log["recv"]
    order = np.lexsort((recv, seq))
    seq, recv = seq[order], recv[order]
    first = np.r_[True, seq[1:] != seq[:-1]]
    return dict(zip(seq[first].tolist(), recv[first].tolist(), strict=True))


# ---------------------------------------------------------------------------- 1 and 2
HOPS = ("A", "B", "C", "D")
#: the chain's writer threads, sharing --rate: a push returns once A applied it, so one
#: thread alone could not keep 100 pushes/s whenever a push takes over 10 ms
CHAIN_WRITERS = 2
#: section 1's two configurations
MAIN = "main"


def bench_chain(args: argparse.Namespace) -> dict[str, Any]:
    procs: list[Proc] = []
    try:
        a = Server(args)
        procs.append(a)
        _load(a.location, "t", args.keys)
        px = Proc(proxy, {"host": "127.0.0.1", "port": int(a.location.rsplit(":", 1)[1])})
        procs.append(px)
        servers = {"A": a}
        upstream = px.hello
        for name in HOPS[1:]:
            s = Server(args)
            procs.append(s)
            t = time.perf_counter()
            s.call("mirror", f"{upstream}/t", 120.0)
            print(f"  {name} mirrors {upstream}/t: in sync in {time.perf_counter() - t:.1f} s",
                  flush=True)
            servers[name] = s
            upstream = s.location
        subs = {}
        for name in HOPS:
            sp = Proc(subscribe, {"uri": servers[name].location, "table": "t", "n": 1, "nice": 0})
            procs.append(sp)
            subs[name] = sp
        for sp in subs.values():
            assert sp.call("ready", 120.0), "a subscriber got no snapshot"
        wr = Proc(write, {"writers": CHAIN_WRITERS, "rate": args.rate / CHAIN_WRITERS,
                          "rows": args.rows, "keys": args.keys, "table": "t", "uri": a.location})
        procs.append(wr)
        print(f"  chain A -> B -> C -> D up ({args.keys:,} keys), priority {a.priority}; writing "
              f"{args.rate:g} pushes/s of {args.rows:,} rows", flush=True)

        # 1. latency (a mirror's link wakes its cycle for each message it stages)
        wr.call("start")
        latency = {}
        for config, warmup in ((MAIN, args.warmup),):
            time.sleep(warmup)
            for sp in subs.values():
                sp.call("mark")
            cpu = CpuWindow({**{n: [servers[n]] for n in HOPS}, "proxy": [px], "writer": [wr],
                             "subscribers": list(subs.values())})
            t0 = time.perf_counter()
            time.sleep(args.seconds)
            t1 = time.perf_counter()
            latency[config] = _hops(wr.call("log"), {n: sp.call("log") for n, sp in subs.items()}, t0, t1)
            latency[config]["cpu_pct"] = cpu.end()
        # 2. cut and resume
        t_cut = px.call("cut")
        time.sleep(args.cut_seconds)
        t_restore = px.call("restore")
        end = time.perf_counter() + args.resume_timeout
        while time.perf_counter() < end:
            st = servers["B"].call("link", "t")
            if st["in_sync"] and any(m[0] > t_restore for m in st["messages"]):
                break
            time.sleep(0.05)
        time.sleep(args.settle)
        fresh_t = time.perf_counter()
        servers["B"].call("mirror", f"{px.hello}/t=t_fresh", 120.0)
        fresh = servers["B"].call("link", "t_fresh")
        cut_link = servers["B"].call("link", "t")
        conns = px.call("conns")
        wlog = wr.call("log")
        wr.call("halt")
        sub_logs = {n: sp.call("log") for n, sp in subs.items()}
        sub_status = {n: sp.call("status") for n, sp in subs.items()}
        servers["B"].call("drop", "t_fresh")
        resume = _resume(t_cut, t_restore, fresh_t, cut_link, fresh, conns, wlog, sub_logs)
        resume["subscriber_reconnects"] = sum(s["reconnects"] for s in sub_status.values())
        return {"latency": latency, "resume": resume,
                "priority": a.priority, "writer_errors": wlog["errors"],
                "writer_error_count": wlog["error_count"]}
    finally:
        _close_all(procs)


def _hops(wlog: dict[str, Any], logs: dict[str, dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Per hop latency of the pushes sent in ``[t0, t1)`` that every subscriber applied."""
    sent = dict(zip(wlog["seq"].tolist(), wlog["sent"].tolist(), strict=True))
    window = {s for s, t in sent.items() if t0 * 1e9 <= t < t1 * 1e9}
    first = {n: _first_recv(log) for n, log in logs.items()}
    common = sorted(window.intersection(*(f.keys() for f in first.values())))
    at = {n: np.array([first[n][s] for s in common], dtype=np.int64) for n in HOPS}
    sent_at = np.array([sent[s] for s in common], dtype=np.int64)
    into = (sent_at / 1e9 - t0)  # seconds into the window

    def hop(name: str, ns: np.ndarray) -> dict[str, Any]:
        worst = np.argsort(ns)[::-1][:5]  # when the slowest happened: a pause shows as a cluster
        return {"hop": name, **_stats(ns / 1e6),
                "worst_at_s": [round(float(into[i]), 2) for i in worst]}

    rows_out = [hop("writer -> A", at["A"] - sent_at)]
    for prev, cur in zip(HOPS, HOPS[1:], strict=False):
        rows_out.append(hop(f"{prev} -> {cur}" + (" (via proxy)" if prev == "A" else ""), at[cur] - at[prev]))
    rows_out.append(hop("A -> D (3 hops)", at["D"] - at["A"]))
    rows_out.append(hop("writer -> D", at["D"] - sent_at))
    ack = (wlog["acked"] - wlog["sent"])[np.isin(wlog["seq"], list(window)) & (wlog["acked"] > 0)]
    return {"hops": rows_out, "pushes_in_window": len(window), "seen_by_all": len(common),
            "seen_by": {n: len(window & f.keys()) for n, f in first.items()},
            "messages": {n: int(log["messages"]) for n, log in logs.items()},
            "ack": _stats(ack / 1e6), "seconds": t1 - t0}


def _wire_bytes(conns: list[dict[str, Any]], after: float, until: float) -> tuple[int | None, float | None]:
    """Bytes forwarded to the mirror on the first connection opened after ``after`` that
    carried data, up to ``until``; and when that connection opened."""
    for c in conns:
        if c["opened"] >= after and c["down"]:
            got = [n for t, n in c["down"] if t <= until]
            return (got[-1] if got else 0), c["opened"]
    return None, None


def _resume(t_cut: float, t_restore: float, fresh_t: float, link: dict[str, Any],
            fresh: dict[str, Any], conns: dict[str, Any], wlog: dict[str, Any],
            sub_logs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    after = [m for m in link["messages"] if m[0] > t_restore]
    in_sync = [t for t, state, _ in link["states"] if t > t_restore and state == "in sync"]
    first = after[0] if after else None
    snap = fresh["messages"][0] if fresh["messages"] else None
    sync_t = in_sync[0] if in_sync else None
    fresh_sync = [t for t, state, _ in fresh["states"] if state == "in sync"]
    wire, opened = _wire_bytes(conns["conns"], t_restore, sync_t or float("inf"))
    wire_fresh, _ = _wire_bytes(conns["conns"], fresh_t, fresh_sync[0] if fresh_sync else float("inf"))
    sent = wlog["sent"] / 1e9
    during = int(((sent >= t_cut) & (sent < t_restore)).sum())
    before = wlog["seq"][sent < t_restore]
    last = int(before[np.argmax(wlog["sent"][sent < t_restore])]) if before.size else None
    caught: dict[str, float | None] = {}
    for name in HOPS[1:]:
        got = _first_recv(sub_logs[name]).get(last) if last is not None else None
        caught[name] = None if got is None else got / 1e9 - t_restore
    states = [(round(t - t_cut, 3), s) for t, s, _ in link["states"] if t >= t_cut]
    return {
        "cut_s": t_restore - t_cut, "pushes_during_cut": during,
        "refused_connections": conns["refused"],
        "states_after_cut": states,
        "reconnect_opened_s": None if opened is None else opened - t_restore,
        "resume": None if first is None else ("snapshot" if first[2] else "deltas"),
        "resume_answer": None if first is None else RESUME.get(first[3], str(first[3])),
        "resume_rows": None if first is None else first[4],
        "resume_bytes": None if first is None else first[1],
        "resume_wire_bytes": wire,
        "snapshot_rows": None if snap is None else snap[4],
        "snapshot_bytes": None if snap is None else snap[1],
        "snapshot_wire_bytes": wire_fresh,
        "link_in_sync_s": None if sync_t is None else sync_t - t_restore,
        "caught_up_s": caught,
        "resumed_with_deltas": link["resumed_with_deltas"],
        "resumed_with_snapshot": link["resumed_with_snapshot"],
    }


# ---------------------------------------------------------------------------- 3. fan-out
def _drain(subs: list[Proc], timeout: float) -> None:
    """Wait until no subscriber recorded anything for a second (or ``timeout``)."""
    end = time.perf_counter() + timeout
    last = None
    while time.perf_counter() < end:
        now = [sp.call("count") for sp in subs]
        if now == last:
            return
        last = now
        time.sleep(1.0)


CASES = ("writers only", "all on A", "A + mirrors")
#: the fan-out's subscriber processes run at this nice value: on a shared 2-core host they
#: cannot be on other machines, as clients would, and 400 subscriptions in Python can take
#: every core; niced, the servers and writers the goals are about get the CPU first
FAN_NICE = 10


def _pin(proc: Proc, cpus: set[int] | None) -> None:
    """Keep every thread of ``proc`` (and every thread it starts later) on ``cpus``."""
    if cpus is None:
        return
    for tid in os.listdir(f"/proc/{proc.proc.pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def _pin_sets(args: argparse.Namespace) -> tuple[set[int] | None, set[int] | None]:
    """(origin side, the rest) under --fan-pin: A and its writers on the first CPU, the mirrors
    and subscriber processes on the others; (None, None) without it."""
    if not args.fan_pin:
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--fan-pin needs at least 2 CPUs")
    return {cpus[0]}, set(cpus[1:])


def bench_fanout(args: argparse.Namespace, case: str) -> dict[str, Any]:
    procs: list[Proc] = []
    origin_cpus, other_cpus = _pin_sets(args)
    try:
        a = Server(args)
        _pin(a, origin_cpus)
        procs.append(a)
        _load(a.location, "f", args.fan_keys)
        targets: list[str] = []
        mirrors: list[Server] = []
        if case == "all on A":
            targets = [a.location] * args.fan_procs
        elif case == "A + mirrors":
            for _ in range(args.fan_procs):
                m = Server(args)
                _pin(m, other_cpus)
                procs.append(m)
                mirrors.append(m)
                m.call("mirror", f"{a.location}/f", 120.0)
                targets.append(m.location)
        t = time.perf_counter()
        subs = [Proc(subscribe, {"uri": u, "table": "f", "n": args.fan_subs, "nice": FAN_NICE})
                for u in targets]
        procs.extend(subs)
        for sp in subs:
            _pin(sp, other_cpus)
        for sp in subs:
            assert sp.call("ready", 600.0), "a subscriber got no snapshot"
        nsubs = len(subs) * args.fan_subs
        if subs:
            print(f"  {case}: {nsubs} subscribers ready in {time.perf_counter() - t:.1f} s", flush=True)
        wr = Proc(write, {"writers": args.fan_writers, "rate": args.fan_rate, "rows": args.fan_rows,
                          "keys": args.fan_keys, "table": "f", "uri": a.location})
        _pin(wr, origin_cpus)
        procs.append(wr)
        wr.call("start")
        time.sleep(args.warmup)
        for sp in subs:
            sp.call("mark")
        a.call("cycles")
        cpu = CpuWindow({"A": [a], "mirrors": list(mirrors), "subscribers": subs,
                         "writer": [wr]})
        t0 = time.perf_counter()
        time.sleep(args.fan_seconds)
        t1 = time.perf_counter()
        cpu_pct = cpu.end()
        cycles = a.call("cycles")
        stats = a.call("stats")
        wlog = wr.call("log")
        wr.call("halt")
        _drain(subs, args.drain)  # deliveries of the window's last pushes
        logs = [sp.call("log") for sp in subs]
        status = [sp.call("status") for sp in subs]
    finally:
        _close_all(procs)
    sent = wlog["sent"]
    win = (sent >= t0 * 1e9) & (sent < t1 * 1e9)
    ok = win & (wlog["acked"] > 0)
    window_seqs = wlog["seq"][win]
    lat, delivered = [], 0
    for log in logs:
        keep = np.isin(log["seq"], window_seqs)
        lat.append((log["recv"][keep] - log["sent"][keep]) / 1e6)
        delivered += int(keep.sum())
    ends = np.array([e for e, _ in cycles])
    gaps = np.diff(ends) * 1e3
    cyc = _stats([ms for _, ms in cycles])
    deliv = _stats(np.concatenate(lat) if lat else [])
    ack = _stats((wlog["acked"][ok] - sent[ok]) / 1e6)
    asked = args.fan_writers * args.fan_rate * args.fan_rows
    return {
        "case": case, "subscribers": nsubs, "servers": 1 + (args.fan_procs if case == "A + mirrors" else 0),
        "cycles": cyc["n"], "stats_cycle_p99_ms": stats["cycle_p99_ms"], "cycle_p50_ms": cyc["p50_ms"],
        "cycle_p99_ms": cyc["p99_ms"], "cycle_max_ms": cyc["max_ms"],
        "cycle_gap_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else None,
        "delivered_p50_ms": deliv["p50_ms"], "delivered_p99_ms": deliv["p99_ms"],
        "delivered_max_ms": deliv["max_ms"],
        "deliveries": delivered, "expected": int(win.sum()) * nsubs,
        "ack_p50_ms": ack["p50_ms"], "ack_p99_ms": ack["p99_ms"], "ack_max_ms": ack["max_ms"],
        "rows_per_s": float(wlog["rows"][ok].sum()) / (t1 - t0), "asked_rows_per_s": float(asked),
        "pushes": int(win.sum()), "skipped_ticks": int(sum(wlog["skipped"])),
        "push_errors": wlog["error_count"],
        "subscriber_reconnects": sum(s["reconnects"] for s in status),
        "catch_up_snapshots": sum(int(log["snapshots"]) for log in logs),
        "subscriber_errors": [e for s in status for e in s["errors"]][:3],
        "machine_busy_pct": cpu_pct.pop("machine"),
        **{f"cpu_{k}_pct": v for k, v in cpu_pct.items()},
    }


# ---------------------------------------------------------------------------- main
def _v(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def _summary(chain: dict[str, Any] | None, fan: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    if chain:
        for config, lat in chain["latency"].items():
            for r in lat["hops"]:
                name = r["hop"]
                per_hop = name.split(" (")[0] in ("A -> B", "B -> C", "C -> D")
                if not r["n"]:
                    continue
                out.append({"benchmark": f"latency {name}" + ("" if config == MAIN else f", {config}"),
                            "measured": f"p50 {r['p50_ms']:.1f} / mean {r['mean_ms']:.1f} / "
                                        f"p99 {r['p99_ms']:.1f} ms",
                            "goal": "p99 <= 10 ms" if per_hop else "(report)",
                            "verdict": _v(r["p99_ms"] <= 10) if per_hop else ""})
        r = chain["resume"]
        ratio = (r["resume_bytes"] / r["snapshot_bytes"]
                 if r["resume_bytes"] is not None and r["snapshot_bytes"] else None)
        out.append({"benchmark": f"resume after a {r['cut_s']:.1f} s cut ({r['pushes_during_cut']} pushes)",
                    "measured": f"{r['resume']}: {_mb(r['resume_bytes'])} vs a fresh snapshot's "
                                f"{_mb(r['snapshot_bytes'])}" + (f" ({ratio:.2f}x)" if ratio else ""),
                    "goal": "deltas < snapshot", "verdict": _v(None if ratio is None else
                                                            r["resume"] == "deltas" and ratio < 1)})
        out.append({"benchmark": "  time from restore to in sync",
                    "measured": f"link {_s(r['link_in_sync_s'])}; subscribers of B/C/D caught up "
                                + " / ".join(_s(r['caught_up_s'][n]) for n in HOPS[1:]),
                    "goal": "(report)", "verdict": ""})
    base = next((f for f in fan if f["case"] == "writers only"), None)
    for f in fan:
        out.append({"benchmark": f"fan-out, {f['case']} ({f['subscribers']} subscribers)",
                    "measured": f"ack p99 {_num(f['ack_p99_ms'])} ms, rows/s {f['rows_per_s']:,.0f} of "
                                f"{f['asked_rows_per_s']:,.0f}, A cycle p99 {_num(f['cycle_p99_ms'])} ms, "
                                f"delivered p99 {_num(f['delivered_p99_ms'])} ms",
                    "goal": "ack p99 <= 1 s" if f["subscribers"] else "(baseline)",
                    "verdict": _v(f["ack_p99_ms"] is not None and f["ack_p99_ms"] <= 1000)
                    if f["subscribers"] else ""})
        if base is not None and f is not base and base["rows_per_s"]:
            x = f["rows_per_s"] / base["rows_per_s"]
            out.append({"benchmark": "  writers vs no subscribers",
                        "measured": f"rows/s {x:.2f}x, ack p99 {_num(base['ack_p99_ms'])} -> "
                                    f"{_num(f['ack_p99_ms'])} ms",
                        "goal": "unaffected (>= 0.95x)", "verdict": _v(x >= 0.95)})
    return out


def _mb(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 1e6:.2f} MB"


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short sections, few subscribers: a smoke run")
    ap.add_argument("--sections", nargs="+", choices=("chain", "fanout"), default=["chain", "fanout"],
                    help="chain: sections 1 and 2; fanout: section 3")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between cycles (ticktable serve's)")
    ap.add_argument("--cycle-priority", choices=("realtime", "normal"), default="realtime",
                    help="the cycle thread's priority, as ticktable serve --cycle-priority")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of writing before each window")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys of the chain's table")
    ap.add_argument("--rate", type=float, default=100.0, help="the chain writer's pushes per second")
    ap.add_argument("--rows", type=int, default=1_000, help="rows per push (chain)")
    ap.add_argument("--seconds", type=float, default=30.0, help="section 1's window")
    ap.add_argument("--cut-seconds", type=float, default=1.0, help="how long the proxy cuts B's link")
    ap.add_argument("--resume-timeout", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of writing after B is in sync")
    ap.add_argument("--fan-keys", type=int, default=100_000, help="keys of the fan-out table")
    ap.add_argument("--fan-writers", type=int, default=4)
    ap.add_argument("--fan-rate", type=float, default=10.0, help="pushes per second per writer")
    ap.add_argument("--fan-rows", type=int, default=1_000)
    ap.add_argument("--fan-procs", type=int, default=4, help="subscriber processes (and mirrors)")
    ap.add_argument("--fan-subs", type=int, default=100, help="subscriptions per subscriber process")
    ap.add_argument("--fan-seconds", type=float, default=40.0, help="each fan-out case's window")
    ap.add_argument("--drain", type=float, default=120.0,
                    help="seconds at most for deliveries after the writers stop")
    ap.add_argument("--fan-pin", action="store_true",
                    help="fan-out: A and its writer process on the first CPU, the mirrors and "
                         "subscriber processes on the others (in every case), standing in for "
                         "separate hosts")
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_links.json)")
    if ap.parse_args().quick:  # smaller defaults; a value given on the command line still wins
        ap.set_defaults(warmup=2.0, keys=100_000, seconds=5.0, fan_subs=10, fan_seconds=5.0,
                        fan_keys=20_000)
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, nproc {os.cpu_count()}; "
          f"each server, writer, subscriber and the proxy in a spawned process")
    t_all = time.perf_counter()
    chain = None
    if "chain" in args.sections:
        chain = bench_chain(args)
        lats = chain["latency"]
        rows_1 = [{"config": c, **h} for c, lat in lats.items() for h in lat["hops"]]
        print_table(f"1. latency per hop (ms), cycles every {args.interval:g} s ({chain['priority']}); "
                    "each hop: its subscriber's time minus the one before's", rows_1,
                    ["config", "hop", "p50_ms", "mean_ms", "p99_ms", "max_ms", "n", "worst_at_s"])
        for c, lat in lats.items():
            print(f"   {c}: {lat['seen_by_all']} of {lat['pushes_in_window']} pushes of {lat['seconds']:.0f} s "
                  f"seen by all 4 subscribers ({lat['pushes_in_window'] / lat['seconds']:.0f}/s); push ack "
                  f"p50 {_num(lat['ack']['p50_ms'])} / p99 {_num(lat['ack']['p99_ms'])} ms; messages applied "
                  f"{lat['messages']}")
            print("     CPU, % of one core: " + ", ".join(f"{k} {v:.0f}" for k, v in lat["cpu_pct"].items()
                                                       if k != "machine")
                  + f"; machine {lat['cpu_pct']['machine']:.0f}% of all cores")
        r = chain["resume"]
        print_table("2. resume after a cut of B's link (bytes: counted by the link / on the wire)",
                    [{"what": "resume (first message after restore)", "kind": r["resume"],
                      "answer": r["resume_answer"], "rows": r["resume_rows"], "bytes": r["resume_bytes"],
                      "wire_bytes": r["resume_wire_bytes"]},
                     {"what": "fresh mirror from scratch", "kind": "snapshot", "rows": r["snapshot_rows"],
                      "bytes": r["snapshot_bytes"], "wire_bytes": r["snapshot_wire_bytes"]}],
                    ["what", "kind", "answer", "rows", "bytes", "wire_bytes"])
        print(f"   cut {r['cut_s']:.2f} s, {r['pushes_during_cut']} pushes meanwhile, "
              f"{r['refused_connections']} connection attempts refused; after the restore: new "
              f"connection at {_s(r['reconnect_opened_s'])}, link in sync at {_s(r['link_in_sync_s'])}, "
              f"subscribers caught up (the last push before the restore applied) at B "
              + ", C ".join([_s(r["caught_up_s"]["B"]), _s(r["caught_up_s"]["C"])])
              + f", D {_s(r['caught_up_s']['D'])}")
        print(f"   B's link states (s after the cut): {r['states_after_cut']}")
    fan: list[dict[str, Any]] = []
    if "fanout" in args.sections:
        for case in CASES:
            fan.append(bench_fanout(args, case))
        print_table(f"3. fan-out: {args.fan_writers} writers x {args.fan_rate:g} pushes/s x {args.fan_rows:,} "
                    f"rows into A ({args.fan_keys:,} keys), {args.fan_seconds:g} s per case: the writers and "
                    "the deliveries (ms)", fan,
                    ["case", "subscribers", "servers", "ack_p50_ms", "ack_p99_ms", "ack_max_ms", "rows_per_s",
                     "asked_rows_per_s", "skipped_ticks", "delivered_p50_ms", "delivered_p99_ms",
                     "delivered_max_ms", "deliveries", "expected", "catch_up_snapshots",
                     "subscriber_reconnects"])
        print_table("3. fan-out: A's cycles (ms; stats = the stats action, over A's last 1,000) and CPU "
                    "(% of one core; machine: % of all cores)", fan,
                    ["case", "cycles", "stats_cycle_p99_ms", "cycle_p50_ms", "cycle_p99_ms", "cycle_max_ms",
                     "cycle_gap_p99_ms", "cpu_A_pct", "cpu_mirrors_pct", "cpu_subscribers_pct",
                     "cpu_writer_pct", "machine_busy_pct"])
    summary = _summary(chain, fan)
    print_table("summary", summary, ["benchmark", "measured", "goal", "verdict"])
    load_end = os.getloadavg()
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    write_json("bench_links_quick" if args.quick else "bench_links", {
        "args": vars(args), "load_start": load, "load_end": load_end, "chain": chain,
        "fanout": fan, "summary": summary}, args.json)


if __name__ == "__main__":
    main()
