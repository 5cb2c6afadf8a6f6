"""The server process of bench/bench_flight.py: one section's server, driven over a pipe.

bench_flight spawns (never forks) one process per section and server. ``tree`` is the root
of the source tree whose ``engine`` and ``flight`` this process serves: the working tree,
or a ``git worktree`` of an older revision. It goes first on ``sys.path`` before anything
imports them, which is why neither this module, bench/_common.py nor bench_flight.py (re-run
here by ``spawn`` as ``__mp_main__``) imports them at module level. ``tree=None`` is the
baseline, "raw": a bare ``pyarrow.flight`` server that imports no Ticktable code (its DoPut
acknowledges each batch once read, unless started with ``acks=False``).

Protocol: the process sends ``("ok", ready)`` once it serves, then answers each command
``(name, *args)`` with ``("ok", result)``; ``("stop",)`` shuts the server down and ends the
process. A failure, at start too, is answered ``("error", one line)`` (the traceback goes
to this process's stderr) and the process waits to be stopped. Every process answers
``("cpu",)`` with its CPU seconds so far, all threads (``time.process_time``), and
``("threads",)`` with the same per thread group (:func:`thread_cpu`).
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from bench._common import SCHEMA, batch


class _Section(NamedTuple):
    ready: Any  # sent once the server listens: what the client connects to
    commands: dict[str, Callable[..., Any]]
    close: Callable[[], Any]


def serve(conn: Any, tree: str | None, section: str, params: dict[str, Any]) -> None:
    """Entry point of the process: serve ``section`` from ``tree`` until told to stop."""
    sec: _Section | None = None
    try:
        if tree is not None:
            _use_tree(tree)
        sec = _SECTIONS[section](**params)
    except Exception as exc:
        conn.send(("error", _failure(exc)))
    else:
        conn.send(("ok", sec.ready))
    commands: dict[str, Callable[..., Any]] = {"cpu": time.process_time, "threads": thread_cpu,
                                                "gc": gc_census,
                                                **(sec.commands if sec else {})}
    while True:
        name, *args = conn.recv()
        if name == "stop":
            break
        try:
            reply = ("ok", commands[name](*args))
        except Exception as exc:
            reply = ("error", _failure(exc))
        conn.send(reply)
    try:
        if sec is not None:
            sec.close()
    except Exception as exc:
        conn.send(("error", _failure(exc)))
    else:
        conn.send(("ok", "bye"))


def gc_census() -> tuple[int, float]:
    """The objects the cyclic collector tracks in this process, and the milliseconds one full
    collection of them takes now."""
    import gc

    tracked = len(gc.get_objects())
    t0 = time.perf_counter()
    gc.collect()
    return tracked, (time.perf_counter() - t0) * 1e3


def thread_cpu() -> dict[str, tuple[float, int]]:
    """CPU seconds and minor page faults so far of this process's threads, by group: the
    Python name of a Python thread, else the kernel's (gRPC's ``event_engine``, Arrow's
    pools), digits and a trailing ``_N`` or ``-N`` dropped so a pool is one group. Threads
    that ended are not counted (a difference of two calls is what the live ones did)."""
    import os
    import re

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[float, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        try:  # nanoseconds on the CPU; stat's utime + stime count 10 ms ticks
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            seconds = (int(fields[11]) + int(fields[12])) / tick
        name = re.sub(r"[-_ ]?\d+$", "", names.get(int(tid), comm)) or comm
        cpu, faults = out.get(name, (0.0, 0))
        out[name] = (cpu + seconds, faults + int(fields[7]))
    return out


def _failure(exc: BaseException) -> str:
    traceback.print_exc()
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _use_tree(tree: str) -> None:
    early = sorted(m for m in ("engine", "flight", "clients", "ticktable") if m in sys.modules)
    if early:  # they would come from whichever tree imported them first
        raise RuntimeError(f"imported before the tree was chosen: {', '.join(early)}")
    sys.path.insert(0, tree)
    import flight  # sys.path wins over the editable install's finder, which comes after it

    where = Path(flight.__file__ or "").resolve()
    if not where.is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"flight imported from {where}, not from {tree}")


def _start_server() -> tuple[Any, Any]:
    from engine.graph import UpdateGraph
    from flight.server import ServerConfig, TicktableServer

    # the two-port server also starts a TableService unless grpc_port is None; the
    # one-port server has no such field
    kw: dict[str, Any] = {}
    if "grpc_port" in {f.name for f in dataclasses.fields(ServerConfig)}:
        kw["grpc_port"] = None
    graph = UpdateGraph()
    return graph, TicktableServer(graph, ServerConfig(**kw)).start()


def _cycle_priority(priority: str, graph: Any = None, interval: float = 0.0) -> str:
    """Cycles at ``priority`` as ``ticktable serve --cycle-priority`` runs them: ``graph``
    started on its periodic thread at it, or (no graph) the calling thread, which drives the
    cycles, put at it. A tree without ``engine.priority`` runs them normal. Returns what the
    cycle thread got."""
    import inspect

    from engine.graph import UpdateGraph

    # the tree's own graph says whether it has priorities (an import of engine.priority
    # alone could find this tree's module through the editable install)
    if "priority" not in inspect.signature(UpdateGraph.start).parameters:  # an older tree
        if graph is not None:
            graph.start(interval)
        return "normal"
    if graph is None:
        from engine.priority import set_thread_priority

        return set_thread_priority(priority)
    graph.start(interval, priority=priority)
    return str(graph.priority)


# ---------------------------------------------------------------------------- raw
class _RawServer(fl.FlightServerBase):  # type: ignore[misc]
    """The baseline: DoGet streams a prepared table, DoPut reads the batches and (``acks``)
    answers each with a ``PutResult`` once read, as our server answers each once staged:
    the same acknowledgement a client of either waits for."""

    def __init__(self, acks: bool = True) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables: dict[str, pa.Table] = {}
        self.put_rows = 0
        self.acks = acks

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        return fl.RecordBatchStream(self.tables[ticket.ticket.decode()])

    def do_put(self, context: Any, descriptor: fl.FlightDescriptor, reader: Any, writer: Any) -> None:
        rows = index = 0
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.data is not None:
                rows += chunk.data.num_rows
                if self.acks:  # batch index, its rows, rows so far: a PutAck's fields
                    writer.write(pa.py_buffer(struct.pack("<qqq", index, chunk.data.num_rows, rows)))
                index += 1
        self.put_rows = rows


def _snapshot_rows(sizes: list[int]) -> Iterator[tuple[str, pa.Table]]:
    """Table ``snap<n>`` for each size as 1M-row appends, seeded: every server gets the same."""
    rng = np.random.default_rng(1)
    for n in sizes:
        for s in range(0, n, 1_000_000):
            yield f"snap{n}", batch(rng, np.arange(s, min(n, s + 1_000_000)))


def _serve_raw(sizes: list[int], acks: bool = True) -> _Section:
    raw = _RawServer(acks)
    parts: dict[str, list[pa.Table]] = {}
    for name, rows in _snapshot_rows(sizes):
        parts.setdefault(name, []).append(rows)
    for name, p in parts.items():  # one chunk per column, as Table.to_arrow gathers it
        raw.tables[name] = pa.concat_tables(p).combine_chunks()
    return _Section(f"grpc://127.0.0.1:{raw.port}", {}, raw.shutdown)


# ---------------------------------------------------------------------------- 1. snapshot
def _serve_snapshot(sizes: list[int]) -> _Section:
    graph, server = _start_server()
    for name, rows in _snapshot_rows(sizes):
        if name not in server.registry.names():
            server.registry.create_source(name, SCHEMA, "append")
        server.registry.get(name).table.append(rows)
        graph.run_cycle()

    def profile(name: str, repeat: int) -> dict[str, list[int]]:
        """The gather our DoGet does per call, under the shared lock."""
        table = server.registry.get(name).table
        out: dict[str, list[int]] = {"to_arrow": [], **{c: [] for c in SCHEMA.names}}
        for _ in range(repeat):
            t = time.perf_counter_ns()
            table.to_arrow()
            out["to_arrow"].append(time.perf_counter_ns() - t)
            keys = table.rowset.keys()  # cached per RowSet: the gathers alone
            for c in SCHEMA.names:
                t = time.perf_counter_ns()
                table.column(c).get(keys)
                out[c].append(time.perf_counter_ns() - t)
        return out

    return _Section(server.location, {"profile": profile}, server.shutdown)


# ---------------------------------------------------------------------------- 2. latency
def _serve_latency(rows: int, change: int, rate: float, seed: int = 2,
                   priority: str = "realtime") -> _Section:
    graph, server = _start_server()
    table = server.registry.create_source("quotes", SCHEMA, "keyed", keys=["Key"]).table
    rng = np.random.default_rng(seed)
    table.upsert(batch(rng, np.arange(rows)))
    graph.run_cycle()
    pool = [batch(rng, np.sort(rng.choice(rows, change, replace=False))) for _ in range(64)]
    ends: dict[int, float] = {}
    writes: dict[int, float] = {}  # step -> just before its rows were staged

    def on_end(step: int) -> None:
        if table.cycle_update is not None:
            ends[step] = time.perf_counter()

    graph.add_terminal_listener(on_end)
    prof = _SenderProfile()

    def run(n_cycles: int) -> dict[str, Any]:
        """Drive ``n_cycles`` cycles at ``rate``; cycle ends, durations and CPU used."""
        got = _cycle_priority(priority)  # this thread runs the cycles
        prof.reset()
        ends.clear()
        writes.clear()
        durations, cycle_cpu = [], []
        interval = 1.0 / rate
        cpu0, driver0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        next_at = time.perf_counter()
        first = graph.step + 1
        for i in range(n_cycles):
            writes[graph.step + 1] = time.perf_counter()
            table.upsert(pool[i % len(pool)])
            cpu0 = time.thread_time()
            graph.run_cycle()
            cycle_cpu.append(time.thread_time() - cpu0)  # after-cycle callbacks included
            durations.append(graph.last_cycle_seconds)
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.perf_counter()
        driver1 = time.thread_time()
        time.sleep(0.2)  # let the senders finish the last step before reading the counters
        cpu1, wall1 = time.process_time(), time.perf_counter()
        return {"first_step": first, "last_step": graph.step, "ends": dict(ends), "writes": dict(writes),
                "cycle_ms": [d * 1e3 for d in durations],
                "cycle_cpu_ms": [d * 1e3 for d in cycle_cpu],
                "cpu_s": cpu1 - cpu0, "driver_cpu_s": driver1 - driver0, "cycle_priority": got,
                "server_cpu": (cpu1 - cpu0) / (wall1 - wall0), "sender": prof.summary()}

    return _Section(server.location, {"run": run}, server.shutdown)


class _SenderProfile:
    """Wall time the server spends building messages (under the shared lock) and writing them.

    "build" is a subscription building its own message (``Subscription._next_message``) or a
    fan-out building the one its members share (``FanOut`` builds, see flight/streams/fanout.py);
    "write" is writing one message to one stream (``Subscription._send``). Wraps those for
    the latency section; the numbers include waiting for the GIL, which is the point on a
    busy 2-core machine. A tree without one of those hooks reports ``None`` for it.
    """

    def __init__(self) -> None:
        try:  # flight/ by family since the package split; an older tree is flat
            from flight.streams.fanout import FanOut
            from flight.streams.subscription import Subscription
        except ImportError:
            from flight.fanout import FanOut  # type: ignore[no-redef]
            from flight.subscription import Subscription  # type: ignore[no-redef]

        self.lock = threading.Lock()
        self.samples: dict[str, list[float]] = {}
        for name, attr in (("build", "_next_message"), ("write", "_send")):
            if hasattr(Subscription, attr):
                setattr(Subscription, attr, self._timed(name, getattr(Subscription, attr)))
        fanout: Any = FanOut  # its __init__ is replaced, which its own type forbids
        init = fanout.__init__

        def fanout_init(fan: Any, *a: Any, **kw: Any) -> None:
            init(fan, *a, **kw)
            if hasattr(fan, "_build"):
                fan._build = self._timed("shared_build", fan._build)

        fanout.__init__ = fanout_init

    def _timed(self, name: str, fn: Any) -> Any:
        self.samples[name] = []

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

    def summary(self) -> dict[str, float | int | None]:
        with self.lock:
            out: dict[str, float | int | None] = {}
            for k in ("build", "shared_build", "write"):
                v = self.samples.get(k)
                a = np.array(v or [0.0]) * 1e3
                out[f"{k}_median_ms"] = None if v is None else float(np.median(a))
                out[f"{k}_p99_ms"] = None if v is None else float(np.percentile(a, 99))
                out[f"{k}_total_s"] = None if v is None else float(a.sum() / 1e3)
            for key, k in (("messages", "write"), ("own_builds", "build"), ("shared_builds", "shared_build")):
                v = self.samples.get(k)
                out[key] = None if v is None else len(v)
            return out


# ---------------------------------------------------------------------------- 3. ingest
def _serve_ingest(interval: float, priority: str = "realtime") -> _Section:
    graph, server = _start_server()
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

    def create(name: str, kind: str) -> None:
        entry = server.registry.create_source(name, SCHEMA, kind, keys=["Key"] if kind == "keyed" else None)
        with cond:
            watch.update(table=entry.table, touched=0, log=[])

    def wait(rows: int, timeout: float) -> dict[str, Any]:
        """Until ``rows`` rows were applied in total: when that cycle ended, cycle times."""
        with cond:
            cond.wait_for(lambda: watch["touched"] >= rows, timeout)
            hit = next(((t, c) for t, c, _ in watch["log"] if c >= rows), None)
            steps = [k for _, _, k in watch["log"]]
        deadline = time.monotonic() + 5 * interval + 5
        while steps and steps[-1] not in durations and time.monotonic() < deadline:
            time.sleep(0.005)  # the applying cycle's duration is known one cycle later
        return {"applied_at": hit[0] if hit else None, "size": watch["table"].size,
                "cycle_ms": [durations[k] * 1e3 for k in steps if k in durations]}

    def drop(name: str) -> None:
        with cond:
            watch.update(table=None)
        server.registry.drop(name)

    def pause() -> None:  # no cycles run while paused (profile: the put alone)
        graph.stop()

    def resume() -> None:
        _cycle_priority(priority, graph, interval)

    def close() -> None:
        graph.stop()
        server.shutdown()

    graph.add_terminal_listener(on_end)
    got = _cycle_priority(priority, graph, interval)
    commands: dict[str, Callable[..., Any]] = {"create": create, "wait": wait, "drop": drop, "pause": pause, "resume": resume,
                                                   "priority": lambda: got}
    return _Section(server.location, commands, close)


_SECTIONS: dict[str, Callable[..., _Section]] = {
    "raw": _serve_raw, "snapshot": _serve_snapshot, "latency": _serve_latency, "ingest": _serve_ingest,
}
