"""bench_flight: the Flight server end to end over real gRPC on 127.0.0.1, old server vs new.

Servers: "new" is this working tree; "old" is the tree at ``--old REV`` (default 4ddb344,
the last pyarrow-based server), checked out for the run with ``git worktree add --detach``
into a temporary directory and removed at the end; "raw" is a bare ``pyarrow.flight``
server, the baseline. The clients, and the client-side decoder (``flight.streams.decoder``,
``flight.pb``), are this tree's for every server.

Topology: each section spawns one process per server (bench/_tree_child.py), alive together
for the section; the clients run in this process and take turns, so load changes hit every
server alike. On a 2-core machine this keeps server and client work on separate GILs, as in
a deployment. A server process imports ``engine`` and ``flight`` from its own tree, which
is why this module and its parts (``_flight_servers``, ``_flight_latency``: each re-run by
``spawn`` in the processes it starts) import those only inside functions. Both sides read
``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for the whole machine), so
cycle-end times taken by a server compare with decode times taken here. A server that fails
to start or to answer is reported as failed for that section, and the run goes on with the
others.

Measures:
  1. Snapshot DoGet of --snap-sizes rows (int64, string, float64, int64) into pandas
     (``read_all().to_pandas()``); raw serves the same rows (checked) as one
     ``RecordBatchStream``; x_raw = raw_time / time. Profile: server-side
     ``Table.to_arrow`` (the gather under the shared lock), client transfer (``read_all``)
     and ``to_pandas`` separately.
  2. Delta latency, cycle end -> client decode (``read_message``), for --change-row upserts
     into a --keyed-rows keyed table at --rate cycles/s, with each of --subscribers, in
     --latency-rounds rounds per server taken in turn (each server's figures pool the cycles
     of its rounds; the summary lists each round's p50 too), with each cycle's wall time
     (``last_cycle_seconds``) and the CPU its thread spent in ``run_cycle`` (the after-cycle
     builds included: wall time far above it means the cycle waited for the GIL); and
     "from write": from just before the upsert staged its rows (what a writer waits for,
     the cycle itself included, so work moved into the cycle does not hide).
     The server process drives the cycles itself (upsert a pre-built batch, ``run_cycle``,
     sleep to the next tick: what ``start(1/rate)`` does with a writer that stages once
     per tick); a terminal listener stamps each cycle's end. Each subscriber reads on its
     own thread with its own connection: subscriber 0 in this process, the others spread
     over --client-procs spawned client processes (as separate clients would be; at
     --client-nice, the server goes first when the two cores are full, as with clients on
     other machines). A message that coalesced several cycles counts
     once per cycle it covers, each against its own cycle end. Memory: the server process's
     resident set once every subscriber decoded its snapshot and after the run, and the
     largest client process's peak (/proc VmRSS, VmHWM). Server CPU per message
     delivered: the server process's CPU seconds over the run (all threads, cycles too)
     over the messages the subscribers received; "serve" leaves out the thread driving the
     cycles. The ReferenceView apply is timed separately (offline, on the messages the
     first subscriber received).
  3. DoPut ingest: --append-rows rows in --put-batch-rows batches into an append table
     with the graph running (``start(0.1)``), against raw, which reads the batches and
     answers each with a PutResult as our server does (``--raw-acks none``: it only reads);
     and --upsert-rows keys upserted (PUT_MODE_UPSERT) into a keyed table, first as inserts
     then as updates of every key, timed until the cycle that applies the last row ends.
     Server CPU per batch: the server process's CPU seconds from the put's start to its
     last ack over the batches (with the graph running, cycles applying rows meanwhile
     count; "paused": the put alone). With an old tree, new over old round by round too
     (each pair seconds apart: the ratio to read on a busy machine). After it, what this
     machine charges for the first write to memory (``memory_touch_cost``): the servers
     keep what they ingest, raw does not, so where fresh pages cost many times a rewrite
     the append figures move with how much of a run's memory is fresh.

Run: python bench/bench_flight.py [--quick] [--old REV | --old none | --old-tree PATH]
     [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import SCHEMA, batch, median, memory_touch_cost, print_table, write_json  # noqa: E402
from bench._flight_latency import bench_latency  # noqa: E402
from bench._flight_servers import Servers, relative, server_trees  # noqa: E402


# ---------------------------------------------------------------------------- 1. snapshot
def _doget(client: fl.FlightClient, name: str, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    tbl = client.do_get(fl.Ticket(name.encode())).read_all()
    t1 = time.perf_counter()
    df = tbl.to_pandas()
    t2 = time.perf_counter()
    assert len(df) == n, (len(df), n)
    return t1 - t0, t2 - t1


def bench_snapshot(trees: list[tuple[str, str]], sizes: list[int], repeats: list[int],
                   failures: list[dict[str, str]]) -> list[dict[str, Any]]:
    servers = Servers("snapshot", failures)
    for label, tree in [*trees, ("raw", None)]:
        servers.start(label, tree, sizes=sizes)
    out = []
    try:
        for n, rep in zip(sizes, repeats, strict=True):
            name = f"snap{n}"
            tables = {}
            for label in servers.labels():  # warm every path up once
                with servers.guard(label):
                    tables[label] = servers.clients[label].do_get(fl.Ticket(name.encode())).read_all()
            ref = "raw" if "raw" in tables else next(iter(tables), "")
            for label in list(tables):
                with servers.guard(label):
                    assert tables[label].equals(tables[ref]), f"serves a different {name} than {ref}"
            del tables
            runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
            for r in range(rep):
                for label in servers.labels(turn=r):
                    with servers.guard(label):
                        runs[label].append(_doget(servers.clients[label], name, n))
            prof = {}
            for label in servers.labels(raw=False):
                with servers.guard(label):
                    prof[label] = servers.children[label].call("profile", name, max(2, rep))
            total = {k: median([a + b for a, b in v]) for k, v in runs.items()}
            read = {k: median([a for a, _ in v]) for k, v in runs.items()}
            for label in servers.labels():
                p = prof.get(label)
                out.append({
                    "size": n, "server": label, "repeats": rep,
                    "median_s": total[label], "read_s": read[label],
                    "pandas_s": median([b for _, b in runs[label]]),
                    "x_raw": relative(total.get("raw"), total[label]), "read_x_raw": relative(read.get("raw"), read[label]),
                    "server_to_arrow_s": median([g / 1e9 for g in p["to_arrow"]]) if p else None,
                    **{f"gather_{c}_s": median([g / 1e9 for g in p[c]]) if p else None for c in SCHEMA.names},
                })
    finally:
        servers.close()
    return out


# ---------------------------------------------------------------------------- 3. ingest
def _put(client: fl.FlightClient, name: str, batches: list[pa.RecordBatch], meta: bytes | None) -> int:
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(name), SCHEMA)
    for i, b in enumerate(batches):
        if i == 0 and meta is not None:
            writer.write_with_metadata(b, pa.py_buffer(meta))
        else:
            writer.write_batch(b)
    writer.done_writing()
    acks = 0
    while reader.read() is not None:
        acks += 1
    writer.close()
    return acks


def _batches(rng: np.random.Generator, keys: np.ndarray, rows_per_batch: int) -> list[pa.RecordBatch]:
    t = batch(rng, keys)
    return [b for s in range(0, keys.size, rows_per_batch) for b in t.slice(s, rows_per_batch).to_batches()]


def _timed_put(servers: Servers, label: str, name: str, batches: list[pa.RecordBatch], meta: bytes,
               total_rows: int, *, pause: bool = False) -> dict[str, Any]:
    """One DoPut to ``label``: until acked, server CPU meanwhile, and (not raw) until the
    cycle that brought the rows applied to the table to ``total_rows`` ended."""
    child = servers.children[label]
    if pause:
        child.call("pause")
    cpu0, th0 = child.call("cpu"), child.call("threads")
    t0 = time.perf_counter()
    acks = _put(servers.clients[label], name, batches, meta)
    t1 = time.perf_counter()
    cpu1, th1 = child.call("cpu"), child.call("threads")
    out: dict[str, Any] = {"acked_s": t1 - t0, "cpu_per_batch_s": (cpu1 - cpu0) / len(batches),
                           "threads": {k: ((c - th0.get(k, (0.0, 0))[0]) / len(batches),
                                           (f - th0.get(k, (0.0, 0))[1]) / len(batches))
                                       for k, (c, f) in th1.items()}}
    if label != "raw" or servers.raw_acks:
        assert acks == len(batches), f"{acks} acks for {len(batches)} batches"
    if label != "raw":  # raw keeps no table
        if pause:
            child.call("resume")
        res = child.call("wait", total_rows, 120.0)
        assert res["applied_at"] is not None, f"{total_rows:,} rows not applied in 120 s"
        out.update(applied_s=res["applied_at"] - t0, cycle_ms=res["cycle_ms"], size=res["size"])
    return out


def bench_ingest(trees: list[tuple[str, str]], append_rows: int, keyed_rows: int, batch_rows: int,
                 repeat: int, interval: float, failures: list[dict[str, str]],
                 priority: str = "realtime",
                 raw_acks: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from flight.pb import flight_pb2 as pb

    rng = np.random.default_rng(3)
    app_batches = _batches(rng, np.arange(append_rows), batch_rows)
    append_meta = pb.PutRequest(mode=pb.PUT_MODE_APPEND).SerializeToString()
    upsert_meta = pb.PutRequest(mode=pb.PUT_MODE_UPSERT).SerializeToString()
    servers = Servers("ingest", failures)
    for label, tree in trees:
        servers.start(label, tree, interval=interval, priority=priority)
    got = {label: servers.children[label].call("priority") for label in servers.labels()}
    servers.start("raw", None, sizes=[], acks=raw_acks)
    servers.raw_acks = raw_acks
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    paused: dict[str, list[dict[str, Any]]] = defaultdict(list)
    keyed_runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)  # by (phase, server)
    try:
        for i in range(repeat + 1):  # the first round warms every path up and is dropped
            for label in servers.labels(turn=i):
                with servers.guard(label):
                    name = f"app{i}"
                    if label != "raw":
                        servers.children[label].call("create", name, "append")
                    r = _timed_put(servers, label, name, app_batches, append_meta, append_rows)
                    if label != "raw":
                        assert r["size"] == append_rows, f"{r['size']:,} rows, not {append_rows:,}"
                        servers.children[label].call("drop", name)
                    if i:
                        runs[label].append(r)
        for i in range(repeat):  # profile: the same put with no cycle running meanwhile, then one cycle
            for label in servers.labels(turn=i, raw=False):
                with servers.guard(label):
                    name = f"paused{i}"
                    servers.children[label].call("create", name, "append")
                    paused[label].append(_timed_put(servers, label, name, app_batches, append_meta,
                                                    append_rows, pause=True))
                    servers.children[label].call("drop", name)

        for i in range(repeat):
            name = f"keyed{i}"
            for label in servers.labels(raw=False):
                with servers.guard(label):
                    servers.children[label].call("create", name, "keyed")
            for k, phase in enumerate(("insert", "update"), 1):
                b = _batches(rng, rng.permutation(keyed_rows), batch_rows)
                for label in servers.labels(turn=i + k, raw=i == 0):  # raw once: it keeps nothing
                    with servers.guard(label):
                        r = _timed_put(servers, label, name, b, upsert_meta, keyed_rows * k)
                        assert label == "raw" or r["size"] == keyed_rows, f"{r['size']:,} keys"
                        keyed_runs[phase, label].append(r)
            for label in servers.labels(raw=False):
                with servers.guard(label):
                    servers.children[label].call("drop", name)
        labels = servers.labels()
    finally:
        servers.close()

    def med(rs: list[dict[str, Any]], key: str) -> float:
        return median([r[key] for r in rs])

    raw_put = med(runs["raw"], "acked_s") if "raw" in labels else None
    append_out = []
    for label in labels:
        rs, ps = runs[label], paused[label] or runs[label]  # raw has no cycles to pause
        ours = label != "raw"
        cyc = [c for r in rs for c in r["cycle_ms"]] if ours else []
        append_out.append({
            "rows": append_rows, "batch_rows": batch_rows, "server": label, "repeats": repeat,
            "cycle_priority": got.get(label, "-"),
            "acked_rows_per_s": append_rows / med(rs, "acked_s"),
            "applied_rows_per_s": append_rows / med(rs, "applied_s") if ours else None,
            "x_raw_acked": relative(raw_put, med(rs, "acked_s")),
            # per round, against the raw put of the same round (rounds take turns, so both
            # see the machine in the same state): the spread says how much is noise
            "x_raw_acked_rounds": [relative(r0["acked_s"], r["acked_s"]) for r0, r in
                                   zip(runs["raw"], rs, strict=False)] if "raw" in labels else [],
            "x_raw_applied": relative(raw_put, med(rs, "applied_s")) if ours else None,
            # new against old, round by round (each pair a few seconds apart): the ratio to
            # read when the machine is busy, its spread beside it
            "x_old_acked_rounds": [relative(r0["acked_s"], r["acked_s"]) for r0, r in
                                   zip(runs["old"], rs, strict=False)]
            if label == "new" and "old" in labels else [],
            "cpu_per_batch_us": med(rs, "cpu_per_batch_s") * 1e6,
            "cycle_median_ms": float(np.median(cyc)) if cyc else None,
            "cycle_max_ms": float(np.max(cyc)) if cyc else None,
            "cycles_per_put": len(cyc) / repeat if ours else None,
            "paused_acked_rows_per_s": append_rows / med(ps, "acked_s"),
            "paused_x_raw_acked": relative(raw_put, med(ps, "acked_s")),
            "paused_applied_rows_per_s": append_rows / med(ps, "applied_s") if ours else None,
            "one_cycle_apply_ms": median([max(p["cycle_ms"]) for p in ps]) if ours else None,
            "paused_cpu_per_batch_us": med(ps, "cpu_per_batch_s") * 1e6,
            "threads": _threads(rs), "paused_threads": _threads(ps),
        })
    keyed = []
    for phase in ("insert", "update"):
        raw_s = med(keyed_runs[phase, "raw"], "acked_s") if keyed_runs[phase, "raw"] else None
        for label in labels:
            rs = keyed_runs[phase, label]
            ours = label != "raw"
            keyed.append({
                "phase": phase, "server": label, "rows": keyed_rows, "repeats": len(rs),
                "acked_rows_per_s": keyed_rows / med(rs, "acked_s"),
                "applied_rows_per_s": keyed_rows / med(rs, "applied_s") if ours else None,
                "x_raw_acked": relative(raw_s, med(rs, "acked_s")),
                "cpu_per_batch_us": med(rs, "cpu_per_batch_s") * 1e6,
                "max_cycle_ms": max(c for r in rs for c in r["cycle_ms"]) if ours else None,
            })
    return append_out, keyed


def _threads(rounds: list[dict[str, Any]], top: int = 4) -> str:
    """The server's busiest thread groups over ``rounds``: mean CPU µs and minor page faults
    per batch, e.g. ``ticktable-grpc-loop 590us/44pf``, the busiest first."""
    cpu: dict[str, float] = defaultdict(float)
    faults: dict[str, float] = defaultdict(float)
    for r in rounds:
        for k, (c, f) in r["threads"].items():
            cpu[k] += c / len(rounds)
            faults[k] += f / len(rounds)
    busiest = sorted(cpu, key=lambda k: -cpu[k])[:top]
    return ", ".join(f"{k} {cpu[k] * 1e6:.0f}us/{faults[k]:.0f}pf" for k in busiest if cpu[k] > 0)


# ---------------------------------------------------------------------------- main
def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _f(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _summary(snap: list[dict[str, Any]], lat: list[dict[str, Any]], app: list[dict[str, Any]],
             keyed: list[dict[str, Any]], failures: list[dict[str, str]],
             memory: dict[str, Any]) -> list[dict[str, str]]:
    """One line per server and target of the issue; old is "before", new "after"."""
    out = []
    for r in snap:
        if r["server"] != "raw":
            out.append({"benchmark": f"DoGet {r['size']:,} rows -> pandas", "server": r["server"],
                        "measured": f"{_f(r['x_raw'], '.2f')}x raw", "target": ">= 0.8x raw",
                        "verdict": _verdict(r["x_raw"] is not None and r["x_raw"] >= 0.8)})
    for r in lat:
        n, ms = r["subscribers"], (f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms (round p50s "
                                   f"{', '.join(f'{x:.2f}' for x in r['p50_rounds_ms'])})")
        if n == 1:
            target, ok = "p50 <= 1 ms, p99 <= 5 ms", r["p50_ms"] <= 1 and r["p99_ms"] <= 5
        else:
            target, ok = "p99 <= 20 ms", r["p99_ms"] <= 20
        out.append({"benchmark": f"delta latency, {n} subscriber{'s' * (n > 1)}", "server": r["server"],
                    "measured": ms, "target": target if n in (1, 50) else "(none)",
                    "verdict": _verdict(ok) if n in (1, 50) else ""})
    for r in lat:
        out.append({"benchmark": f"DoExchange server CPU per message, {r['subscribers']} subs",
                    "server": r["server"],
                    "measured": f"{_f(r['cpu_per_msg_us'], '.0f')} us ({_f(r['serve_cpu_per_msg_us'], '.0f')} "
                                "us without the cycles' thread)",
                    "target": "before/after", "verdict": ""})
    for r in app:
        if r["server"] != "raw":
            out.append({"benchmark": f"DoPut append {r['rows']:,} rows", "server": r["server"],
                        "measured": f"{r['acked_rows_per_s'] / 1e6:.2f}M rows/s acked "
                                    f"({_f(r['x_raw_acked'], '.2f')}x raw; rounds "
                                    f"{', '.join(_f(x, '.2f') for x in r['x_raw_acked_rounds'])}), "
                                    f"{r['applied_rows_per_s'] / 1e6:.2f}M applied",
                        "target": "acked >= 0.9x raw",
                        "verdict": _verdict(r["x_raw_acked"] is not None and r["x_raw_acked"] >= 0.9)})
    for r in app:
        if r["x_old_acked_rounds"]:
            x = np.array(r["x_old_acked_rounds"], dtype=float)
            out.append({"benchmark": "DoPut append, new over old in each round", "server": "new",
                        "measured": f"median {np.median(x):.2f}, mean {x.mean():.2f}, p1 "
                                    f"{np.percentile(x, 1):.2f}, p99 {np.percentile(x, 99):.2f} "
                                    f"({x.size} rounds)",
                        "target": "before/after", "verdict": ""})
    for r in app:
        out.append({"benchmark": f"DoPut server CPU per {r['batch_rows']:,}-row batch", "server": r["server"],
                    "measured": f"{r['paused_cpu_per_batch_us']:.0f} us (put alone), "
                                f"{r['cpu_per_batch_us']:.0f} us (cycles running)",
                    "target": "before/after", "verdict": ""})
    if memory:  # what the ingest figures above paid for the memory they kept (see memory_touch_cost)
        out.append({"benchmark": "this machine: first write to fresh memory", "server": "-",
                    "measured": f"{memory['first_touch_median_us_per_page']:.2f} us per 4 KiB page "
                                f"(rewrite {memory['rewrite_us_per_page']:.2f})",
                    "target": "(context)", "verdict": ""})
    for r in keyed:
        if r["server"] != "raw":
            out.append({"benchmark": f"DoPut upsert {r['rows']:,} keys ({r['phase']})", "server": r["server"],
                        "measured": f"{r['applied_rows_per_s'] / 1e6:.2f}M rows/s applied",
                        "target": "(report)", "verdict": ""})
    for f in failures:
        out.append({"benchmark": f"{f['section']} section", "server": f["server"],
                    "measured": f["error"][:100], "target": "", "verdict": "FAILED"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--old", default="4ddb344", metavar="REV",
                    help="git revision of the old server, served beside this tree ('none': this tree only)")
    ap.add_argument("--old-tree", default=None, metavar="PATH",
                    help="serve 'old' from this checkout as it is (e.g. a worktree of the "
                         "base) instead of a temporary worktree of --old")
    ap.add_argument("--snap-sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--snap-repeats", type=int, nargs="+", default=[5, 3])
    ap.add_argument("--keyed-rows", type=int, default=100_000)
    ap.add_argument("--change", type=int, default=1_000)
    ap.add_argument("--rate", type=float, default=100.0, help="cycles per second")
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--subscribers", type=int, nargs="+", default=[1, 50])
    ap.add_argument("--latency-rounds", type=int, default=3,
                    help="runs of each server per subscriber count, in turn (their cycles pooled)")
    ap.add_argument("--client-procs", type=int, default=5,
                    help="client processes the subscribers after the first are spread over")
    ap.add_argument("--client-nice", type=int, default=0,
                    help="niceness of the client processes (e.g. 10: the server goes first when "
                         "the cores are full, as with clients on other machines)")
    ap.add_argument("--append-rows", type=int, default=4_000_000)
    ap.add_argument("--upsert-rows", type=int, default=1_000_000)
    ap.add_argument("--put-batch-rows", type=int, default=65_536)
    ap.add_argument("--put-repeat", type=int, default=9,
                    help="append puts per server, taken in turn (median; each round's ratio listed)")
    ap.add_argument("--interval", type=float, default=0.1, help="graph.start interval for ingest")
    ap.add_argument("--raw-acks", choices=("each", "none"), default="each",
                    help="whether raw answers each DoPut batch with a PutResult, as ours does "
                         "(none: it only reads them, the baseline before 2026-11-30)")
    ap.add_argument("--sections", nargs="+", choices=("snapshot", "latency", "ingest"),
                    default=["snapshot", "latency", "ingest"], help="which sections to run")
    ap.add_argument("--cycle-priority", choices=("realtime", "normal"), default="realtime",
                    help="the cycle thread's priority, as `ticktable serve --cycle-priority` (its "
                         "default: realtime); a tree without engine.priority runs normal")
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_flight.json)")
    args = ap.parse_args()
    if args.quick:
        args.snap_sizes, args.snap_repeats = [1_000_000], [2]
        args.cycles, args.subscribers = 100, [1, 10]
        args.append_rows, args.upsert_rows, args.put_repeat = 1_000_000, 200_000, 1
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"nproc {os.cpu_count()}; servers in spawned subprocesses, clients in this process")
    t_all = time.perf_counter()
    failures: list[dict[str, str]] = []
    with server_trees(args.old, args.old_tree) as (trees, tree_info):
        for label, info in tree_info.items():
            print(f"{label}: {info.get('rev', 'working tree')} = {info['commit'][:10]} ({info['path']})"
                  + (", with uncommitted changes in engine/ or flight/" if info.get("uncommitted_changes") else ""))
        snap: list[dict[str, Any]] = []
        lat: list[dict[str, Any]] = []
        views: list[dict[str, Any]] = []
        app: list[dict[str, Any]] = []
        keyed: list[dict[str, Any]] = []
        if "snapshot" in args.sections:
            snap = bench_snapshot(trees, args.snap_sizes,
                                  (args.snap_repeats * len(args.snap_sizes))[:len(args.snap_sizes)], failures)
        print_table("1. snapshot DoGet -> pandas (median s; x_raw = raw time / time)", snap,
                    ["size", "server", "repeats", "median_s", "x_raw", "read_s", "read_x_raw", "pandas_s",
                     "server_to_arrow_s"])
        print_table("    profile: server-side gather per DoGet (median s; to_arrow holds the shared lock)",
                    [r for r in snap if r["server"] != "raw"],
                    ["size", "server", "server_to_arrow_s", *[f"gather_{c}_s" for c in SCHEMA.names]])

        if "latency" in args.sections:
            lat, views = bench_latency(trees, args.keyed_rows, args.change, args.rate, args.cycles,
                                       args.warmup, args.subscribers, failures, args.client_procs,
                                       args.cycle_priority, args.latency_rounds, args.client_nice)
        print_table(f"2. delta latency cycle end -> read_message done, {args.change:,}-row upserts into "
                    f"{args.keyed_rows:,} keyed rows at {args.rate:g}/s", lat,
                    ["subscribers", "server", "cycle_priority", "cycles", "rate_hz", "p50_ms", "median_ms", "mean_ms", "p99_ms",
                     "max_ms", "from_write_p50_ms", "from_write_p99_ms", "messages", "coalesced_msgs",
                     "cycle_median_ms", "cycle_p99_ms", "cycle_cpu_median_ms", "cycle_cpu_p99_ms",
                     "behind_at_end"])
        print_table("    server CPU per message delivered (whole process; serve = without the thread "
                    "driving the cycles), CPU cores used per process", lat,
                    ["subscribers", "server", "delivered", "server_cpu_s", "driver_cpu_s", "cpu_per_msg_us",
                     "serve_cpu_per_msg_us", "server_cpu_cores", "client_cpu_cores"])
        print_table("    memory (MiB): the server once every snapshot was decoded, after the run, its "
                    "peak so far; the largest client process's peak; the server's threads then, the "
                    "objects its collector tracks and one full collection's ms (once every "
                    "snapshot was decoded)", lat,
                    ["subscribers", "server", "server_rss_ready_mib", "server_rss_after_mib",
                     "server_peak_mib", "client_proc_peak_mib", "server_threads_ready",
                     "server_threads_after", "server_gc_objects", "server_full_gc_ms"])
        print_table("    profile: server builds (own = per subscriber, shared = per fan-out) and per-stream "
                    "writes (wall ms incl. GIL waits)", lat,
                    ["subscribers", "server", "sender_messages", "sender_own_builds", "sender_build_median_ms",
                     "sender_shared_builds", "sender_shared_build_median_ms", "sender_shared_build_p99_ms",
                     "sender_write_median_ms", "sender_write_p99_ms", "sender_write_total_s"])
        for r in lat:
            if r["errors"]:
                print(f"   subscriber errors ({r['server']}, {r['subscribers']} subs): {r['errors']}")
        print_table("   ReferenceView.apply per delta message (offline, not in the latency above)", views,
                    ["server", "rows_held", "snapshot_apply_ms", "median_ms", "mean_ms", "p99_ms", "n"])

        memory: dict[str, Any] = {}
        if "ingest" in args.sections:
            app, keyed = bench_ingest(trees, args.append_rows, args.upsert_rows, args.put_batch_rows,
                                      args.put_repeat, args.interval, failures, args.cycle_priority,
                                      args.raw_acks == "each")
            memory = memory_touch_cost()
    print_table(f"3a. DoPut append, graph.start({args.interval:g}) (median of {args.put_repeat}; "
                "CPU: server process, put start to last ack)", app,
                ["rows", "batch_rows", "server", "cycle_priority", "acked_rows_per_s", "applied_rows_per_s", "x_raw_acked",
                 "x_raw_applied", "cpu_per_batch_us", "cycle_median_ms", "cycle_max_ms", "cycles_per_put"])
    print_table("    profile: the same put with cycles paused, then one cycle applying it all "
                "(raw has no cycles: its one measurement)", app,
                ["rows", "server", "paused_acked_rows_per_s", "paused_x_raw_acked", "paused_applied_rows_per_s",
                 "one_cycle_apply_ms", "paused_cpu_per_batch_us"])
    print_table("    server threads per batch, mean of the rounds: CPU us / minor page faults "
                "(cycles running; then paused)", app, ["server", "threads"])
    print_table("    the same with cycles paused", app, ["server", "paused_threads"])
    print_table("3b. DoPut PUT_MODE_UPSERT into a keyed table (applied = until the applying cycle ended)", keyed,
                ["phase", "server", "rows", "acked_rows_per_s", "applied_rows_per_s", "x_raw_acked",
                 "cpu_per_batch_us", "max_cycle_ms"])

    summary = _summary(snap, lat, app, keyed, failures, memory)
    load_end = os.getloadavg()
    print_table("summary (old = before, new = after)", summary, ["benchmark", "server", "measured", "target",
                                                                 "verdict"])
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    write_json("bench_flight_quick" if args.quick else "bench_flight", {
        "args": vars(args), "trees": tree_info, "load_start": load_start, "load_end": load_end,
        "topology": "one spawned process per server (old, new, raw); subscriber 0 and the other "
                    f"clients in the bench process, subscribers 1.. over {args.client_procs} "
                    "spawned client processes",
        "snapshot": snap, "latency": lat, "reference_view_apply": views,
        "ingest_append": app, "ingest_keyed": keyed, "memory_touch": memory, "failures": failures,
        "summary": summary}, args.json)


if __name__ == "__main__":
    main()
