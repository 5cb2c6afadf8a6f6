"""bench_flight: the Flight server end to end over real gRPC on 127.0.0.1.

Topology: the Ticktable server (and, in the same child process, the bare pyarrow.flight
baseline servers) run in a *spawned subprocess*; the clients run in this process. On a
2-core machine this keeps server and client work on separate GILs, as in a deployment,
so neither side's Python work is billed to the other's GIL. Both processes read
``time.perf_counter`` (CLOCK_MONOTONIC on Linux: one clock for the whole machine), so
cycle-end times taken in the server process compare with decode times taken here.

Measures:
  1. Snapshot DoGet of --snap-sizes rows (int64, string, float64, int64) into pandas
     (``read_all().to_pandas()``) against a bare ``FlightServerBase`` returning
     ``RecordBatchStream`` of the same Arrow table; the ratio raw_time / our_time.
     Profile: server-side ``Table.to_arrow`` (the gather under the shared lock), client
     transfer (``read_all``) and ``to_pandas`` separately.
  2. Delta latency, cycle end -> client decode (``read_message``), for --change-row upserts
     into a --keyed-rows keyed table at --rate cycles/s, with each of --subscribers.
     The server process drives the cycles itself (upsert a pre-built batch, ``run_cycle``,
     sleep to the next tick: what ``start(1/rate)`` does with a writer that stages once
     per tick); a terminal listener stamps each cycle's end. Each subscriber reads on its
     own thread with its own connection. A message that coalesced several cycles counts
     once per cycle it covers, each against its own cycle end. The ReferenceView apply is
     timed separately (offline, on the messages the first subscriber received).
  3. DoPut ingest: --append-rows rows in --put-batch-rows batches into an append table
     with the graph running (``start(0.1)``), against a bare server that just reads the
     batches; and 1M-key upserts (PUT_MODE_UPSERT) into a keyed table, first as inserts
     then as updates of every key, timed until the cycle that applies the last row ends.

Run: python bench/bench_flight.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import SCHEMA, batch, median, print_table, stats_ms, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from flight.decoder import ReferenceView, StreamEnded, read_message  # noqa: E402
from flight.pb import flight_pb2 as pb  # noqa: E402
from flight.server import ServerConfig, TicktableServer  # noqa: E402


# ---------------------------------------------------------------------------- server side
class _RawServer(fl.FlightServerBase):  # type: ignore[misc]
    """The baseline: DoGet streams a prepared table, DoPut only reads the batches."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables: dict[str, pa.Table] = {}
        self.put_rows = 0

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        return fl.RecordBatchStream(self.tables[ticket.ticket.decode()])

    def do_put(self, context: Any, descriptor: fl.FlightDescriptor, reader: Any, writer: Any) -> None:
        rows = 0
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.data is not None:
                rows += chunk.data.num_rows
        self.put_rows = rows


def _child(conn: Any, section: str, params: dict[str, Any]) -> None:
    """Entry point of the server process: one benchmark section, driven over ``conn``."""
    {"snapshot": _serve_snapshot, "latency": _serve_latency, "ingest": _serve_ingest}[section](conn, **params)


def _new_server() -> tuple[UpdateGraph, TicktableServer]:
    graph = UpdateGraph()
    return graph, TicktableServer(graph, ServerConfig(grpc_port=None)).start()


def _serve_snapshot(conn: Any, sizes: list[int]) -> None:
    graph, server = _new_server()
    raw = _RawServer()
    rng = np.random.default_rng(1)
    for n in sizes:
        name = f"snap{n}"
        table = server.registry.create_source(name, SCHEMA, "append").table
        for s in range(0, n, 1_000_000):
            table.append(batch(rng, np.arange(s, min(n, s + 1_000_000))))
            graph.run_cycle()
        raw.tables[name] = table.to_arrow()  # the very table our DoGet builds
    conn.send((server.location, f"grpc://127.0.0.1:{raw.port}"))
    while True:
        cmd = conn.recv()
        if cmd[0] == "profile":  # the gather our DoGet does per call, under the shared lock
            table = server.registry.get(cmd[1]).table
            out: dict[str, list[int]] = {"to_arrow": [], **{c: [] for c in SCHEMA.names}}
            for _ in range(cmd[2]):
                t = time.perf_counter_ns()
                table.to_arrow()
                out["to_arrow"].append(time.perf_counter_ns() - t)
                keys = table.rowset.keys()  # cached per RowSet: the gathers alone
                for c in SCHEMA.names:
                    t = time.perf_counter_ns()
                    table.column(c).get(keys)
                    out[c].append(time.perf_counter_ns() - t)
            conn.send(out)
        else:
            break
    server.shutdown()
    raw.shutdown()
    conn.send("bye")


def _serve_latency(conn: Any, rows: int, change: int, rate: float, seed: int = 2) -> None:
    graph, server = _new_server()
    table = server.registry.create_source("quotes", SCHEMA, "keyed", keys=["Key"]).table
    rng = np.random.default_rng(seed)
    table.upsert(batch(rng, np.arange(rows)))
    graph.run_cycle()
    pool = [batch(rng, np.sort(rng.choice(rows, change, replace=False))) for _ in range(64)]
    ends: dict[int, float] = {}

    def on_end(step: int) -> None:
        if table.cycle_update is not None:
            ends[step] = time.perf_counter()

    graph.add_terminal_listener(on_end)
    prof = _SenderProfile()
    conn.send(server.location)
    while True:
        cmd = conn.recv()
        if cmd[0] != "run":
            break
        prof.reset()
        cpu0, wall0 = os.times(), time.perf_counter()
        n_cycles = cmd[1]
        ends.clear()
        durations = []
        interval = 1.0 / rate
        next_at = time.perf_counter()
        first = graph.step + 1
        for i in range(n_cycles):
            table.upsert(pool[i % len(pool)])
            graph.run_cycle()
            durations.append(graph.last_cycle_seconds)
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.perf_counter()
        time.sleep(0.2)  # let the senders finish the last step before reading the counters
        cpu1, wall1 = os.times(), time.perf_counter()
        conn.send({"first_step": first, "last_step": graph.step, "ends": dict(ends),
                   "cycle_ms": [d * 1e3 for d in durations],
                   "server_cpu": (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (wall1 - wall0),
                   "sender": prof.summary()})
    server.shutdown()
    conn.send("bye")


class _SenderProfile:
    """Wall time the server spends building messages (under the shared lock) and writing them.

    "build" is a subscription building its own message (``Subscription._next_message``) or a
    fan-out building the one its members share (``FanOut`` builds, see flight/fanout.py);
    "write" is writing one message to one stream (``Subscription._send``). Wraps those for
    the latency section; the numbers include waiting for the GIL, which is the point on a
    busy 2-core machine.
    """

    def __init__(self) -> None:
        from flight.fanout import FanOut
        from flight.subscription import Subscription

        self.lock = threading.Lock()
        self.samples: dict[str, list[float]] = {"build": [], "shared_build": [], "write": []}
        for name, attr in (("build", "_next_message"), ("write", "_send")):
            setattr(Subscription, attr, self._timed(name, getattr(Subscription, attr)))
        init = FanOut.__init__

        def fanout_init(fan: Any, *a: Any, **kw: Any) -> None:
            init(fan, *a, **kw)
            fan._build = self._timed("shared_build", fan._build)

        FanOut.__init__ = fanout_init  # type: ignore[method-assign]

    def _timed(self, name: str, fn: Any) -> Any:
        def wrapped(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                dt = time.perf_counter() - t
                with self.lock:
                    self.samples[name].append(dt)

        return wrapped

    def reset(self) -> None:
        with self.lock:
            for v in self.samples.values():
                v.clear()

    def summary(self) -> dict[str, float]:
        with self.lock:
            out = {}
            for k, v in self.samples.items():
                a = np.array(v or [0.0]) * 1e3
                out[f"{k}_median_ms"] = float(np.median(a))
                out[f"{k}_p99_ms"] = float(np.percentile(a, 99))
                out[f"{k}_total_s"] = float(a.sum() / 1e3)
            out["messages"] = len(self.samples["write"])
            out["own_builds"] = len(self.samples["build"])
            out["shared_builds"] = len(self.samples["shared_build"])
            return out


def _serve_ingest(conn: Any, interval: float) -> None:
    graph, server = _new_server()
    raw = _RawServer()
    watch: dict[str, Any] = {"table": None, "touched": 0, "log": []}
    cond = threading.Condition()

    durations: dict[int, float] = {}

    def on_end(step: int) -> None:
        # last_cycle_seconds is set after the terminal listeners: here it is the previous cycle's
        durations[step - 1] = graph.last_cycle_seconds
        t = watch["table"]
        if t is None or t.cycle_update is None:
            return
        u = t.cycle_update
        now = time.perf_counter()
        with cond:
            watch["touched"] += len(u.added) + len(u.modified)
            watch["log"].append((now, watch["touched"], step))
            cond.notify_all()

    graph.add_terminal_listener(on_end)
    graph.start(interval)
    conn.send((server.location, f"grpc://127.0.0.1:{raw.port}"))
    while True:
        cmd = conn.recv()
        if cmd[0] == "create":
            _, name, kind = cmd
            entry = server.registry.create_source(name, SCHEMA, kind,
                                                  keys=["Key"] if kind == "keyed" else None)
            with cond:
                watch.update(table=entry.table, touched=0, log=[])
            conn.send("ok")
        elif cmd[0] == "wait":  # until `rows` rows were applied in total; when that cycle ended
            _, rows, timeout = cmd
            with cond:
                cond.wait_for(lambda rows=rows: watch["touched"] >= rows, timeout)
                hit = next(((t, c) for t, c, _ in watch["log"] if c >= rows), None)
                steps = [k for _, _, k in watch["log"]]
            deadline = time.monotonic() + 5 * interval + 5
            while steps and steps[-1] not in durations and time.monotonic() < deadline:
                time.sleep(0.005)  # the applying cycle's duration is known one cycle later
            cycles = [durations[k] * 1e3 for k in steps if k in durations]
            conn.send({"applied_at": hit[0] if hit else None, "cycle_ms": cycles,
                       "size": watch["table"].size})
        elif cmd[0] == "pause":  # no cycles run while paused (profile: the put alone)
            graph.stop()
            conn.send("ok")
        elif cmd[0] == "resume":
            graph.start(interval)
            conn.send("ok")
        elif cmd[0] == "drop":
            with cond:
                watch.update(table=None)
            server.registry.drop(cmd[1])
            conn.send("ok")
        else:
            break
    graph.stop()
    server.shutdown()
    raw.shutdown()
    conn.send("bye")


class _Child:
    """A server process for one section (spawned, so no inherited threads or locks)."""

    def __init__(self, section: str, **params: Any) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(child_conn, section, params), daemon=True)
        self.proc.start()
        self.ready = self.conn.recv()

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def close(self) -> None:
        try:
            self.call("stop")
        finally:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.terminate()


# ---------------------------------------------------------------------------- 1. snapshot
def _doget(client: fl.FlightClient, name: str) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    tbl = client.do_get(fl.Ticket(name.encode())).read_all()
    t1 = time.perf_counter()
    df = tbl.to_pandas()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(df)


def bench_snapshot(sizes: list[int], repeats: list[int]) -> list[dict]:
    child = _Child("snapshot", sizes=sizes)
    ours_loc, raw_loc = child.ready
    ours, raw = fl.connect(ours_loc), fl.connect(raw_loc)
    out = []
    try:
        for n, rep in zip(sizes, repeats, strict=True):
            name = f"snap{n}"
            _doget(ours, name)  # warm-up both paths once
            _doget(raw, name)
            o, r = [], []
            for _ in range(rep):  # interleaved so load changes hit both
                o.append(_doget(ours, name))
                r.append(_doget(raw, name))
            assert all(x[2] == n for x in o + r)
            prof = child.call("profile", name, max(2, rep))
            our_t = median([a + b for a, b, _ in o])
            raw_t = median([a + b for a, b, _ in r])
            out.append({
                "size": n, "repeats": rep,
                "ours_s": our_t, "raw_s": raw_t, "ratio": raw_t / our_t,
                "ours_read_s": median([a for a, _, _ in o]), "raw_read_s": median([a for a, _, _ in r]),
                "ours_pandas_s": median([b for _, b, _ in o]), "raw_pandas_s": median([b for _, b, _ in r]),
                "read_ratio": median([a for a, _, _ in r]) / median([a for a, _, _ in o]),
                "server_to_arrow_s": median([g / 1e9 for g in prof["to_arrow"]]),
                **{f"gather_{c}_s": median([g / 1e9 for g in prof[c]]) for c in SCHEMA.names},
            })
    finally:
        ours.close()
        raw.close()
        child.close()
    return out


# ---------------------------------------------------------------------------- 2. latency
class _Subscriber:
    """A raw DoExchange subscriber reading on its own thread (see tests/flight/conftest.py)."""

    def __init__(self, location: str, table: str, keep: bool) -> None:
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
        try:
            while True:
                msg = read_message(self.reader, self.schema)
                t = time.perf_counter()
                self.records.append((msg.meta.step, t, msg.meta.coalesced))
                if self.keep:
                    self.messages.append(msg)
                self.last_step = msg.meta.step
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


def bench_latency(rows: int, change: int, rate: float, cycles: int, warmup: int,
                  subscribers: list[int]) -> tuple[list[dict], dict]:
    child = _Child("latency", rows=rows, change=change, rate=rate)
    loc = child.ready
    out = []
    view_stats: dict = {}
    try:
        for n_subs in subscribers:
            subs = [_Subscriber(loc, "quotes", keep=(i == 0 and n_subs == subscribers[0])) for i in range(n_subs)]
            deadline = time.monotonic() + 60
            while any(s.last_step < 0 for s in subs) and time.monotonic() < deadline:
                time.sleep(0.01)  # every snapshot decoded
            cpu0, wall0 = os.times(), time.perf_counter()
            res = child.call("run", warmup + cycles)
            last = res["last_step"]
            deadline = time.monotonic() + 30
            while any(s.last_step < last for s in subs) and time.monotonic() < deadline:
                time.sleep(0.005)
            behind = sum(s.last_step < last for s in subs)
            cpu1, wall1 = os.times(), time.perf_counter()
            client_cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (wall1 - wall0)
            for s in subs:
                s.close()
            errors = [repr(s.error) for s in subs if s.error is not None and s.last_step < last]
            measured = set(range(res["first_step"] + warmup, last + 1))
            ends = res["ends"]
            lat_ns, msgs, coalesced = [], 0, 0
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
            st = stats_ms(lat_ns)
            cyc = np.array(res["cycle_ms"][warmup:])
            span = ends[last] - ends[min(measured)]
            out.append({
                "subscribers": n_subs, "cycles": len(measured),
                "rate_hz": (len(measured) - 1) / span if span > 0 else float("nan"),
                "p50_ms": float(np.percentile(np.array(lat_ns) / 1e6, 50)),
                **st, "max_ms": max(lat_ns) / 1e6, "messages": msgs, "coalesced_msgs": coalesced,
                "cycle_median_ms": float(np.median(cyc)), "cycle_p99_ms": float(np.percentile(cyc, 99)),
                "behind_at_end": behind, "errors": errors[:3],
                "server_cpu_cores": res["server_cpu"], "client_cpu_cores": client_cpu,
                **{f"sender_{k}": v for k, v in res["sender"].items()},
            })
            if subs[0].keep:
                view_stats = _view_cost(subs[0])
    finally:
        child.close()
    return out, view_stats


def _view_cost(sub: _Subscriber) -> dict:
    """ReferenceView.apply per message, offline on the messages one subscriber decoded."""
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


def bench_ingest(append_rows: int, keyed_rows: int, batch_rows: int, repeat: int,
                 interval: float) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(3)
    app_batches = _batches(rng, np.arange(append_rows), batch_rows)
    child = _Child("ingest", interval=interval)
    ours_loc, raw_loc = child.ready
    ours, raw = fl.connect(ours_loc), fl.connect(raw_loc)
    append_meta = pb.PutRequest(mode=pb.PUT_MODE_APPEND).SerializeToString()
    upsert_meta = pb.PutRequest(mode=pb.PUT_MODE_UPSERT).SerializeToString()
    o_put, o_app, r_put, cyc = [], [], [], []
    keyed_out = []
    try:
        for i in range(repeat + 1):  # the first round warms both paths up and is dropped
            name = f"app{i}"
            child.call("create", name, "append")
            t0 = time.perf_counter()
            acks = _put(ours, name, app_batches, append_meta)
            t1 = time.perf_counter()
            res = child.call("wait", append_rows, 60.0)
            assert res["size"] == append_rows and acks == len(app_batches), (res["size"], acks)
            child.call("drop", name)
            t2 = time.perf_counter()
            _put(raw, name, app_batches, append_meta)
            t3 = time.perf_counter()
            if i:
                o_put.append(t1 - t0)
                o_app.append(res["applied_at"] - t0)
                r_put.append(t3 - t2)
                cyc.extend(res["cycle_ms"])
        paused = []  # profile: the same put with no cycle running meanwhile, then one cycle
        for i in range(repeat):
            name = f"paused{i}"
            child.call("create", name, "append")
            child.call("pause")
            t0 = time.perf_counter()
            _put(ours, name, app_batches, append_meta)
            t1 = time.perf_counter()
            child.call("resume")
            res = child.call("wait", append_rows, 60.0)
            child.call("drop", name)
            paused.append((t1 - t0, res["applied_at"] - t0, res["cycle_ms"]))
        our_put, our_app, raw_put = median(o_put), median(o_app), median(r_put)
        append_out = [{
            "rows": append_rows, "batch_rows": batch_rows, "repeats": repeat,
            "raw_rows_per_s": append_rows / raw_put,
            "ours_acked_rows_per_s": append_rows / our_put,
            "ours_applied_rows_per_s": append_rows / our_app,
            "ratio_acked": raw_put / our_put, "ratio_applied": raw_put / our_app,
            "cycle_median_ms": float(np.median(cyc)), "cycle_max_ms": float(np.max(cyc)),
            "cycles_per_put": len(cyc) / repeat,
            "paused_acked_rows_per_s": append_rows / median([p[0] for p in paused]),
            "paused_ratio_acked": raw_put / median([p[0] for p in paused]),
            "paused_applied_rows_per_s": append_rows / median([p[1] for p in paused]),
            "one_cycle_apply_ms": median([max(p[2]) for p in paused]),
        }]

        for i in range(repeat):
            name = f"keyed{i}"
            child.call("create", name, "keyed")
            rows = []
            for phase in ("insert", "update"):
                b = _batches(rng, rng.permutation(keyed_rows), batch_rows)
                t0 = time.perf_counter()
                _put(ours, name, b, upsert_meta)
                t1 = time.perf_counter()
                res = child.call("wait", keyed_rows * (1 if phase == "insert" else 2), 120.0)
                assert res["size"] == keyed_rows, res["size"]
                rows.append((phase, t1 - t0, res["applied_at"] - t0, max(res["cycle_ms"])))
                if i == 0:
                    t2 = time.perf_counter()
                    _put(raw, name, b, upsert_meta)
                    rows[-1] += (time.perf_counter() - t2,)
            child.call("drop", name)
            keyed_out.append(rows)
        keyed = []
        for j, phase in enumerate(("insert", "update")):
            acked = median([r[j][1] for r in keyed_out])
            applied = median([r[j][2] for r in keyed_out])
            keyed.append({"phase": phase, "rows": keyed_rows, "repeats": repeat,
                          "acked_rows_per_s": keyed_rows / acked,
                          "applied_rows_per_s": keyed_rows / applied,
                          "raw_rows_per_s": keyed_rows / keyed_out[0][j][4],
                          "max_cycle_ms": max(r[j][3] for r in keyed_out)})
    finally:
        ours.close()
        raw.close()
        child.close()
    return append_out, keyed


# ---------------------------------------------------------------------------- main
def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--snap-sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--snap-repeats", type=int, nargs="+", default=[5, 3])
    ap.add_argument("--keyed-rows", type=int, default=100_000)
    ap.add_argument("--change", type=int, default=1_000)
    ap.add_argument("--rate", type=float, default=100.0, help="cycles per second")
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--subscribers", type=int, nargs="+", default=[1, 50])
    ap.add_argument("--append-rows", type=int, default=4_000_000)
    ap.add_argument("--upsert-rows", type=int, default=1_000_000)
    ap.add_argument("--put-batch-rows", type=int, default=65_536)
    ap.add_argument("--put-repeat", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.1, help="graph.start interval for ingest")
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_flight.json)")
    args = ap.parse_args()
    if args.quick:
        args.snap_sizes, args.snap_repeats = [1_000_000], [2]
        args.cycles, args.subscribers = 100, [1, 10]
        args.append_rows, args.upsert_rows, args.put_repeat = 1_000_000, 200_000, 1
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"nproc {os.cpu_count()}; server in a spawned subprocess, clients in this process")
    t_all = time.perf_counter()

    snap = bench_snapshot(args.snap_sizes, (args.snap_repeats * len(args.snap_sizes))[:len(args.snap_sizes)])
    print_table("1. snapshot DoGet -> pandas (median s)", snap,
                ["size", "repeats", "ours_s", "raw_s", "ratio", "ours_read_s", "raw_read_s", "read_ratio",
                 "ours_pandas_s", "raw_pandas_s", "server_to_arrow_s"])
    print_table("    profile: server-side gather per DoGet (median s; to_arrow holds the shared lock)", snap,
                ["size", "server_to_arrow_s", *[f"gather_{c}_s" for c in SCHEMA.names]])

    lat, view = bench_latency(args.keyed_rows, args.change, args.rate, args.cycles, args.warmup,
                              args.subscribers)
    print_table(f"2. delta latency cycle end -> read_message done, {args.change:,}-row upserts into "
                f"{args.keyed_rows:,} keyed rows at {args.rate:g}/s", lat,
                ["subscribers", "cycles", "rate_hz", "p50_ms", "median_ms", "mean_ms", "p99_ms", "max_ms",
                 "messages", "coalesced_msgs", "cycle_median_ms", "cycle_p99_ms", "behind_at_end"])
    print_table("    profile: server builds (own = per subscriber, shared = per fan-out) and per-stream writes "
                "(wall ms incl. GIL waits), CPU cores used per process", lat,
                ["subscribers", "sender_messages", "sender_own_builds", "sender_build_median_ms",
                 "sender_shared_builds", "sender_shared_build_median_ms", "sender_shared_build_p99_ms",
                 "sender_write_median_ms", "sender_write_p99_ms", "sender_write_total_s",
                 "server_cpu_cores", "client_cpu_cores"])
    for r in lat:
        if r["errors"]:
            print(f"   subscriber errors ({r['subscribers']} subs): {r['errors']}")
    if view:
        print_table("   ReferenceView.apply per delta message (offline, not in the latency above)", [view],
                    ["rows_held", "snapshot_apply_ms", "median_ms", "mean_ms", "p99_ms", "n"])

    app, keyed = bench_ingest(args.append_rows, args.upsert_rows, args.put_batch_rows, args.put_repeat,
                              args.interval)
    print_table(f"3a. DoPut append, graph.start({args.interval:g}) (median of {args.put_repeat})", app,
                ["rows", "batch_rows", "raw_rows_per_s", "ours_acked_rows_per_s", "ours_applied_rows_per_s",
                 "ratio_acked", "ratio_applied", "cycle_median_ms", "cycle_max_ms", "cycles_per_put"])
    print_table("    profile: the same put with cycles paused, then one cycle applying it all", app,
                ["rows", "paused_acked_rows_per_s", "paused_ratio_acked", "paused_applied_rows_per_s",
                 "one_cycle_apply_ms"])
    print_table("3b. DoPut PUT_MODE_UPSERT into a keyed table (applied = until the applying cycle ended)", keyed,
                ["phase", "rows", "acked_rows_per_s", "applied_rows_per_s", "raw_rows_per_s", "max_cycle_ms"])

    summary = []
    for r in snap:
        summary.append({"benchmark": f"DoGet {r['size']:,} rows -> pandas", "measured": f"ratio {r['ratio']:.2f}",
                        "target": "raw/ours >= 0.8", "verdict": _verdict(r["ratio"] >= 0.8)})
    for r in lat:
        n = r["subscribers"]
        if n == 1:
            summary.append({"benchmark": "delta latency, 1 subscriber",
                            "measured": f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms",
                            "target": "p50 <= 3 ms, p99 <= 15 ms",
                            "verdict": _verdict(r["p50_ms"] <= 3 and r["p99_ms"] <= 15)})
        else:
            summary.append({"benchmark": f"delta latency, {n} subscribers",
                            "measured": f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms",
                            "target": "p99 <= 50 ms" if n == 50 else "(none)",
                            "verdict": _verdict(r["p99_ms"] <= 50) if n == 50 else ""})
    a = app[0]
    summary.append({"benchmark": f"DoPut append {a['rows']:,} rows",
                    "measured": f"{a['ours_acked_rows_per_s'] / 1e6:.2f}M rows/s acked "
                                f"({a['ratio_acked']:.2f}x raw), {a['ours_applied_rows_per_s'] / 1e6:.2f}M "
                                f"applied ({a['ratio_applied']:.2f}x)",
                    "target": "acked >= 0.5x raw", "verdict": _verdict(a["ratio_acked"] >= 0.5)})
    for r in keyed:
        summary.append({"benchmark": f"DoPut upsert {r['rows']:,} keys ({r['phase']})",
                        "measured": f"{r['applied_rows_per_s'] / 1e6:.2f}M rows/s applied",
                        "target": "(report)", "verdict": ""})
    load_end = os.getloadavg()
    print_table("summary", summary, ["benchmark", "measured", "target", "verdict"])
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    write_json("bench_flight_quick" if args.quick else "bench_flight", {"args": vars(args), "load_start": load_start, "load_end": load_end,
                                "topology": "server in a spawned subprocess, clients in the bench process",
                                "snapshot": snap, "latency": lat, "reference_view_apply": view,
                                "ingest_append": app, "ingest_keyed": keyed, "summary": summary}, args.json)


if __name__ == "__main__":
    main()
