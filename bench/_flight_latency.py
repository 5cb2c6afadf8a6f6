"""bench_flight's section 2: delta latency and the server's CPU per message (see bench_flight).

Subscriber 0 reads in the bench's process, the others in spawned client processes; the
client-side decoder (``flight.streams.decoder``, ``flight.pb``) is this tree's for every server,
imported inside functions (a spawned process re-imports this module).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from bench._common import median, stats_ms
from bench._flight_servers import ServerChild, Servers


# ---------------------------------------------------------------------------- 2. latency
def _memory_mib(pid: int | None = None) -> dict[str, float]:
    """A process's resident memory now and its peak (``VmRSS``, ``VmHWM``) in MiB, and its
    threads (``Threads``); ``{}`` where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid or 'self'}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    kb = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in lines)
          if k in ("VmRSS", "VmHWM", "Threads")}
    return {"rss": kb["VmRSS"] / 1024, "peak": kb["VmHWM"] / 1024, "threads": kb["Threads"]}


class _Subscriber:
    """A raw DoExchange subscriber reading on its own thread (see tests/flight/conftest.py)."""

    def __init__(self, location: str, table: str, keep: bool) -> None:
        from flight.pb import flight_pb2 as pb

        self.client = fl.connect(location)
        self.writer, self.reader = self.client.do_exchange(fl.FlightDescriptor.for_path(table))
        self.writer.begin(pa.schema([]))
        req = pb.SubscriptionRequest(table=table)
        self.writer.write_metadata(pa.py_buffer(pb.ClientMessage(subscribe=req).SerializeToString()))
        self.schema = self.reader.schema
        self.keep = keep
        self.messages: list[Any] = []
        self.records: list[tuple[int, float, int]] = []  # (step, decoded at, coalesced)
        self.last_step = -1
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        from flight.streams.decoder import StreamEnded, read_message

        try:
            while True:
                msg = read_message(self.reader, self.schema)
                t = time.perf_counter()
                self.records.append((msg.meta.step, t, msg.meta.coalesced))
                self.last_step = msg.meta.step
                if self.keep:
                    self.messages.append(msg)
                # decoded, and not held while the next one is awaited: 1,000 subscribers each
                # holding their last message (the snapshot, until the first delta) would be
                # the table 1,000 times over in the client processes
                del msg
        except (StopIteration, StreamEnded):
            return
        except Exception as exc:  # cancelled by close(), or a real failure (reported)
            self.error = exc

    def close(self) -> None:
        self.reader.cancel()
        self.thread.join(10)
        try:  # the call ends as cancelled; consume that status here rather than in a destructor
            self.writer.close()
        except Exception:
            pass
        self.client.close()


def _subscriber_proc(location: str, n: int, conn: Any, nice: int = 0) -> None:
    """A client process holding ``n`` subscribers: "ready" once every snapshot is decoded,
    then, told the run's last step, its subscribers' records once they reached it. ``nice``:
    its scheduling niceness (above 0: the server goes first when the cores are full, as
    with clients on other machines)."""
    if nice:
        os.nice(nice)
    subs = [_Subscriber(location, "quotes", keep=False) for _ in range(n)]
    deadline = time.monotonic() + 60
    while any(s.last_step < 0 for s in subs) and time.monotonic() < deadline:
        time.sleep(0.01)
    cpu = os.times()
    conn.send(("ready", cpu.user + cpu.system, _memory_mib()))
    last = conn.recv()
    deadline = time.monotonic() + 30
    while any(s.last_step < last for s in subs) and time.monotonic() < deadline:
        time.sleep(0.005)
    cpu = os.times()
    out = [(s.records, s.last_step, None if s.error is None else repr(s.error)) for s in subs]
    for s in subs:
        s.close()
    # CPU seconds so far (the ready ones subtracted); this process's peak memory
    conn.send((out, cpu.user + cpu.system, _memory_mib()))


class _Remote:
    """Subscribers of a spawned client process, read back as (records, last_step, error)."""

    def __init__(self, records: list[tuple[int, float, int]], last_step: int, error: str | None) -> None:
        self.records, self.last_step, self.error = records, last_step, error


def bench_latency(trees: list[tuple[str, str]], rows: int, change: int, rate: float, cycles: int,
                  warmup: int, subscribers: list[int],
                  failures: list[dict[str, str]], client_procs: int = 5,
                  priority: str = "realtime", rounds: int = 3, client_nice: int = 0,
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per subscriber count, ``rounds`` runs of every server in turn (old, new, old, new,
    ...), so a drift of the machine's speed hits them alike; each server's figures pool the
    cycles of its rounds."""
    servers = Servers("latency", failures)
    for label, tree in trees:
        servers.start(label, tree, rows=rows, change=change, rate=rate, priority=priority)
    out, views = [], []
    try:
        for n_subs in subscribers:
            runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for turn in range(rounds):
                for label in servers.labels(turn):
                    with servers.guard(label):
                        keep = n_subs == subscribers[0] and turn == 0
                        row, first = _latency_run(servers.children[label], n_subs, cycles, warmup,
                                                  keep, client_procs, client_nice)
                        runs[label].append(row)
                        if keep:
                            views.append({"server": label, **_view_cost(first)})
            out.extend({"subscribers": n_subs, "server": label, **_pooled(rs)} for label, rs in runs.items())
    finally:
        servers.close()
    return out, views


def _pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's rounds as one row: latencies pooled over every round's cycles, counts
    summed, the rest the median of the rounds; ``p50_rounds_ms`` each round's p50."""
    lat = [x for r in rounds for x in r.pop("_lat_ns")]
    write = [x for r in rounds for x in r.pop("_write_ns")]
    out: dict[str, Any] = {}
    for k, v in rounds[0].items():
        vals = [r[k] for r in rounds]
        if k in ("cycles", "messages", "coalesced_msgs", "delivered"):
            out[k] = sum(vals)
        elif k == "behind_at_end":
            out[k] = max(vals)
        elif k == "errors":
            out[k] = [e for r in rounds for e in r[k]][:3]
        elif all(isinstance(x, int | float) and not isinstance(x, bool) for x in vals):
            out[k] = median(vals)
        else:
            out[k] = v
    out.update(stats_ms(lat), p50_ms=float(np.percentile(np.array(lat) / 1e6, 50)), max_ms=max(lat) / 1e6,
               p50_rounds_ms=[r["p50_ms"] for r in rounds], rounds=len(rounds))
    if write:
        out.update(from_write_p50_ms=float(np.percentile(np.array(write) / 1e6, 50)),
                   from_write_p99_ms=float(np.percentile(np.array(write) / 1e6, 99)))
    return out


def _latency_run(child: ServerChild, n_subs: int, cycles: int, warmup: int, keep: bool,
                 client_procs: int, client_nice: int = 0) -> tuple[dict[str, Any], _Subscriber]:
    """Subscriber 0 reads in this process; the others are spread over ``client_procs``
    spawned client processes (50 subscribers are 50 clients, not 50 threads of one
    Python process contending for its GIL)."""
    subs: list[Any] = []
    procs: list[tuple[Any, Any]] = []
    ctx = mp.get_context("spawn")
    rest = n_subs - 1
    k = min(client_procs, rest)
    try:
        subs.append(_Subscriber(child.ready, "quotes", keep=keep))
        for j in range(k):
            parent, child_conn = ctx.Pipe()
            n = rest // k + (j < rest % k)
            p = ctx.Process(target=_subscriber_proc, args=(child.ready, n, child_conn, client_nice),
                            daemon=True)
            p.start()
            procs.append((p, parent))
        remote_cpu = 0.0
        for _, conn in procs:
            if not conn.poll(120):
                raise RuntimeError("a client process did not get its snapshots")
            remote_cpu -= conn.recv()[1]
        deadline = time.monotonic() + 60
        while subs[0].last_step < 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # every snapshot decoded
        server_ready = _memory_mib(child.proc.pid)
        gc_objects, gc_ms = child.call("gc")  # before the timed run
        cpu0, wall0 = os.times(), time.perf_counter()
        res = child.call("run", warmup + cycles)
        last = res["last_step"]
        for _, conn in procs:
            conn.send(last)
        deadline = time.monotonic() + 30
        while subs[0].last_step < last and time.monotonic() < deadline:
            time.sleep(0.005)
        cpu1, wall1 = os.times(), time.perf_counter()
        server_after = _memory_mib(child.proc.pid)
        client_peak = 0.0
        for p, conn in procs:
            out, cpu, mem = conn.recv()
            remote_cpu += cpu
            client_peak = max(client_peak, mem.get("peak", 0.0))
            subs.extend(_Remote(*o) for o in out)
            p.join(30)
        behind = sum(s.last_step < last for s in subs)
    finally:
        subs[0].close() if subs else None
        for p, _ in procs:
            if p.is_alive():
                p.kill()
    client_cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system + remote_cpu) / (wall1 - wall0)
    errors = [s.error if isinstance(s.error, str) else repr(s.error) for s in subs
              if s.error is not None and s.last_step < last]
    measured = set(range(res["first_step"] + warmup, last + 1))
    ends, writes = res["ends"], res.get("writes", {})
    lat_ns: list[int] = []
    write_ns: list[int] = []  # from the write (just before the rows were staged) instead
    msgs = coalesced = 0
    for s in subs:
        prev = s.records[0][0]  # the snapshot
        for step, t, co in s.records[1:]:
            covered = [k for k in range(prev + 1, step + 1) if k in ends]
            prev = step
            if not covered or covered[-1] not in measured:
                continue
            msgs += 1
            coalesced += co > 1
            lat_ns.extend(int((t - ends[k]) * 1e9) for k in covered if k in measured)
            write_ns.extend(int((t - writes[k]) * 1e9) for k in covered if k in measured and k in writes)
    # every message of the run (warm-up too): what the server's CPU over the run paid for
    delivered = sum(step >= res["first_step"] for s in subs for step, _, _ in s.records[1:])
    cyc = np.array(res["cycle_ms"][warmup:])
    cyc_cpu = np.array(res["cycle_cpu_ms"][warmup:])
    span = ends[last] - ends[min(measured)]
    return {
        "cycles": len(measured), "rate_hz": (len(measured) - 1) / span if span > 0 else float("nan"),
        "p50_ms": float(np.percentile(np.array(lat_ns) / 1e6, 50)),
        **stats_ms(lat_ns), "max_ms": max(lat_ns) / 1e6, "messages": msgs, "coalesced_msgs": coalesced,
        "from_write_p50_ms": float(np.percentile(np.array(write_ns) / 1e6, 50)) if write_ns else None,
        "from_write_p99_ms": float(np.percentile(np.array(write_ns) / 1e6, 99)) if write_ns else None,
        "cycle_median_ms": float(np.median(cyc)), "cycle_p99_ms": float(np.percentile(cyc, 99)),
        # the cycle thread's own CPU for run_cycle (its after-cycle builds too): a cycle whose
        # wall time is far above it waited, for the GIL or a core
        "cycle_cpu_median_ms": float(np.median(cyc_cpu)),
        "cycle_cpu_p99_ms": float(np.percentile(cyc_cpu, 99)),
        "behind_at_end": behind, "errors": errors[:3],
        "cycle_priority": res.get("cycle_priority", "normal"),
        "delivered": delivered, "server_cpu_s": res["cpu_s"], "driver_cpu_s": res["driver_cpu_s"],
        "cpu_per_msg_us": res["cpu_s"] / delivered * 1e6 if delivered else None,
        "serve_cpu_per_msg_us": (res["cpu_s"] - res["driver_cpu_s"]) / delivered * 1e6 if delivered else None,
        "server_cpu_cores": res["server_cpu"], "client_cpu_cores": client_cpu,
        # the server process lives through every subscriber count: its peak is so far
        "server_rss_ready_mib": server_ready.get("rss"), "server_rss_after_mib": server_after.get("rss"),
        "server_peak_mib": server_after.get("peak"), "client_proc_peak_mib": client_peak or None,
        "server_threads_ready": server_ready.get("threads"),
        "server_threads_after": server_after.get("threads"),
        "server_gc_objects": gc_objects, "server_full_gc_ms": gc_ms,
        **{f"sender_{k}": v for k, v in res["sender"].items()},
        "_lat_ns": lat_ns, "_write_ns": write_ns,  # pooled over rounds by _pooled
    }, subs[0]


def _view_cost(sub: _Subscriber) -> dict[str, Any]:
    """ReferenceView.apply per message, offline on the messages one subscriber decoded."""
    from flight.streams.decoder import ReferenceView

    view = ReferenceView(sub.schema)
    t = time.perf_counter_ns()
    view.apply(sub.messages[0])
    snap = time.perf_counter_ns() - t
    samples = []
    for m in sub.messages[1:]:
        t = time.perf_counter_ns()
        view.apply(m)
        samples.append(time.perf_counter_ns() - t)
    return {"snapshot_apply_ms": snap / 1e6, "rows_held": int(view.keys.size), **stats_ms(samples)}
