"""The server process of bench/bench_sql.py: a TicktableServer with a live table, over a pipe.

bench_sql spawns (never forks) this process, so the server's cycles, gRPC threads and DuckDB
run on their own GIL, as in a deployment, and the clients' work stays in the bench process.
Protocol as bench/_tree_child.py's: the process sends ``("ok", location)`` once it serves,
then answers each command ``(name, *args)`` with ``("ok", result)`` or ``("error", one
line)``; ``("stop",)`` shuts the server down.

What it records, for the ``log`` command (cleared by ``mark``), each from the server's own
clock (``time.perf_counter``, CLOCK_MONOTONIC: comparable with the bench process's):
  cycle_ms      ``graph.last_cycle_seconds`` per cycle (what ``TicktableServer.stats`` reports:
                the cycle under the graph's exclusive lock)
  run_cycle_ms  the whole ``graph.run_cycle`` call, so waiting for the lock counts (a query's
                snapshot holds the shared lock while it reads the table)
  cycle_end     when each cycle ended
  snapshot      ``SnapshotCache.take`` per query: (ms, whether the table changed since the
                last take, i.e. the cache could not serve it)
  query_start   ``QueryRunner.start`` per query: parse, snapshot, DuckDB's start (ms)
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

#: The live table's columns: a unique id, ~1,000 groups, an integer and a float in [0, 1).
SQL_SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("x", pa.int64()), ("y", pa.float64())])
GROUPS = 1000
_CHUNK = 1_000_000


def sql_rows(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    """``n`` rows of :data:`SQL_SCHEMA` with ids ``start..start+n-1``."""
    return pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                     "g": rng.integers(0, GROUPS, n, dtype=np.int64),
                     "x": rng.integers(0, 1000, n, dtype=np.int64),
                     "y": rng.random(n)}, schema=SQL_SCHEMA)


def table_chunks(n: int, seed: int = 1) -> Iterator[pa.Table]:
    """The live table's first ``n`` rows in 1M-row chunks, seeded: both processes make the same."""
    rng = np.random.default_rng(seed)
    for s in range(0, n, _CHUNK):
        yield sql_rows(rng, s, min(_CHUNK, n - s))


def _failure(exc: BaseException) -> str:
    traceback.print_exc()
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


class _Recorder:
    """Wraps the graph's cycle and the SQL runner's start and snapshot to time them."""

    def __init__(self, server: Any) -> None:
        self.lock = threading.Lock()
        self.logs: dict[str, list[Any]] = {}
        self.mark()
        graph = server.graph
        run_cycle = graph.run_cycle

        def timed_cycle() -> int:  # graph.start's loop calls self.run_cycle: this one
            t = time.perf_counter()
            step = run_cycle()
            self.add("run_cycle_ms", (time.perf_counter() - t) * 1e3)
            return step

        graph.run_cycle = timed_cycle
        graph.add_terminal_listener(self._on_cycle)
        self.graph = graph

        runner = server.sql.runner
        cache = runner.snapshots
        take, start = cache.take, runner.start
        seen: dict[str, int] = {}  # table -> last_step at its last snapshot, as the cache keeps it

        def timed_take(tables: Any) -> Any:
            t = time.perf_counter()
            snap = take(tables)
            ms = (time.perf_counter() - t) * 1e3
            changed = False
            for name, table, _ in tables:
                changed |= seen.get(name) != table.last_step
                seen[name] = table.last_step
            self.add("snapshot", (ms, changed))
            return snap

        def timed_start(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            out = start(*args, **kw)
            self.add("query_start", (time.perf_counter() - t) * 1e3)
            return out

        cache.take = timed_take
        runner.start = timed_start

    def _on_cycle(self, step: int) -> None:
        self.add("cycle_ms", self.graph.last_cycle_seconds * 1e3)
        self.add("cycle_end", time.perf_counter())

    def add(self, key: str, value: Any) -> None:
        with self.lock:
            self.logs.setdefault(key, []).append(value)

    def mark(self) -> None:
        with self.lock:
            self.logs = {k: [] for k in ("cycle_ms", "run_cycle_ms", "cycle_end", "snapshot",
                                         "query_start")}

    def take_logs(self) -> dict[str, list[Any]]:
        with self.lock:
            return {k: list(v) for k, v in self.logs.items()}


class _Writer:
    """After every cycle (``rows`` 0: stopped): appends ``rows`` new rows to ``table`` and
    upserts ``rows`` rows of existing ids (new values) into each table of ``keyed``."""

    def __init__(self, graph: Any, table: Any, first_id: int) -> None:
        self.table = table
        self.keyed: list[Any] = []
        self.rows = 0
        self.next_id = first_id
        self.cycled = threading.Event()
        self.stopped = threading.Event()
        graph.add_terminal_listener(lambda step: self.cycled.set())
        self.thread = threading.Thread(target=self._run, daemon=True, name="bench-writer")
        self.thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(7)
        while not self.stopped.is_set():
            self.cycled.wait(1.0)
            self.cycled.clear()
            n = self.rows
            if n:
                self.table.append(sql_rows(rng, self.next_id, n))
                for k in self.keyed:
                    ids = np.unique(rng.integers(0, self.next_id, n))
                    k.upsert(sql_rows(rng, 0, ids.size).set_column(0, "id", pa.array(ids)))
                self.next_id += n


def _profile(server: Any, queries: list[str], repeat: int, lines: int) -> str:
    """pyinstrument over ``repeat`` rounds of ``queries`` through the server's SQL service
    (GetFlightInfo's and DoGet's work, gRPC left out), on this thread."""
    from pyinstrument import Profiler

    from flight.pb import arrow_flight_pb2 as fpb
    from flight.pb import flight_sql_pb2 as sql
    from flight.sql.service import pack

    service = server.sql
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for _ in range(repeat):
        for q in queries:
            desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.CMD,
                                        cmd=pack(sql.CommandStatementQuery(query=q)))
            info = service.flight_info(desc, read_only=False)
            for _frame in service.do_get(info.endpoint[0].ticket.ticket, read_only=False) or ():
                pass
    profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False).splitlines()
    start = next((i + 1 for i, line in enumerate(text) if line.startswith("Profile at")), 0)
    return "\n".join(line for line in text[start:start + lines] if line.strip())


def serve(conn: Any, params: dict[str, Any]) -> None:
    """Entry point of the process: one server, commands until ``stop``."""
    from engine.graph import UpdateGraph
    from flight.server import ServerConfig, TicktableServer

    try:
        graph = UpdateGraph()
        server = TicktableServer(graph, ServerConfig()).start()
        rec = _Recorder(server)
    except Exception as exc:
        conn.send(("error", _failure(exc)))
        return
    conn.send(("ok", server.location))
    writer: _Writer | None = None
    applied: dict[int, float] = {}  # step -> when that cycle ended
    graph.add_terminal_listener(lambda step: applied.__setitem__(step, time.perf_counter()))

    def load(name: str, rows: int, kind: str = "append") -> int:
        """Source table ``name`` of ``rows`` rows (:func:`table_chunks`), one cycle run: the
        writer's append table, or (``kind="keyed"``, keys ``id``, after the append table) a
        keyed table the writer upserts into."""
        nonlocal writer
        keys = ["id"] if kind == "keyed" else []
        table = server.registry.create_source(name, SQL_SCHEMA, kind, keys=keys).table
        for chunk in table_chunks(rows):
            table.upsert(chunk) if keys else table.append(chunk)
        graph.run_cycle()
        if keys:
            assert writer is not None, "load the append table first"
            writer.keyed.append(table)
        else:
            writer = _Writer(graph, table, rows)
        return len(table.rowset)

    def start(interval: float, priority: str) -> str:
        graph.start(interval, priority=priority)
        return str(graph.priority)

    def write(rows: int) -> None:
        assert writer is not None, "load a table first"
        writer.rows = rows

    def create(name: str, schema: bytes) -> None:
        server.durability.create_table(name, pa.ipc.read_schema(pa.py_buffer(schema)), "append",
                                       keys=[], capacity=0, if_not_exists=False)

    def drop(name: str) -> None:
        server.durability.drop_table(name)

    def wait(name: str, rows: int, timeout: float) -> float | None:
        """When the cycle that brought ``name`` to ``rows`` rows ended (None: not in time)."""
        table = server.registry.get(name).table
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(table.rowset) >= rows:
                with graph.shared_lock():
                    return applied.get(table.last_step)
            time.sleep(0.001)
        return None

    def stats() -> dict[str, float]:
        s = server.stats()
        return {"cycle_p50_ms": s.cycle_p50_ms, "cycle_p99_ms": s.cycle_p99_ms}

    commands: dict[str, Callable[..., Any]] = {
        "load": load, "start": start, "write": write, "create": create, "drop": drop,
        "wait": wait, "stats": stats, "mark": rec.mark, "log": rec.take_logs,
        "profile": lambda queries, repeat, lines=60: _profile(server, queries, repeat, lines),
        "cpu": time.process_time,
    }
    while True:
        name, *args = conn.recv()
        if name == "stop":
            break
        try:
            reply = ("ok", commands[name](*args))
        except Exception as exc:
            reply = ("error", _failure(exc))
        conn.send(reply)
    if writer is not None:
        writer.stopped.set()
    server.shutdown()
    graph.stop()
    conn.send(("ok", "bye"))


def serve_reference(conn: Any, params: dict[str, Any]) -> None:
    """Entry point of the ingest section's reference: a bare ``pyarrow.flight`` server (C++
    gRPC and IPC) that only counts the rows a DoPut brings, acking each batch of a path's
    DoPut and answering a Flight SQL command's with one ``DoPutUpdateResult``; what the two
    clients reach when the server costs nothing. Answers ``stop`` only."""
    import pyarrow.flight as fl

    from flight.pb import flight_sql_pb2 as sql

    class Counter(fl.FlightServerBase):  # type: ignore[misc]
        def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
            n = 0
            for chunk in reader:
                n += chunk.data.num_rows
                if descriptor.descriptor_type == fl.DescriptorType.PATH:
                    writer.write(pa.py_buffer(b"ack"))
            if descriptor.descriptor_type != fl.DescriptorType.PATH:
                writer.write(pa.py_buffer(sql.DoPutUpdateResult(record_count=n).SerializeToString()))

    server = Counter("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    conn.send(("ok", f"grpc://127.0.0.1:{server.port}"))
    while conn.recv()[0] != "stop":
        conn.send(("error", "the reference server answers only stop"))
    server.shutdown()
