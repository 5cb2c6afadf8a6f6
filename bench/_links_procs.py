"""The processes of bench/bench_links.py: servers, a TCP proxy, writers and subscribers.

bench_links spawns (never forks) each of them, so every server, writer and subscriber runs
on its own GIL, as in a deployment. Protocol as bench/_sql_server.py's: a process sends
``("ok", value)`` once it is up, then answers each command ``(name, *args)`` with
``("ok", result)`` or ``("error", one line)``; ``("stop",)`` ends it.

Clocks: every time recorded here is ``time.perf_counter`` (or its ``_ns``), which is
CLOCK_MONOTONIC on Linux and so comparable across the processes of one host; the writer puts
``perf_counter_ns()`` taken just before each push in the rows (column ``sent_ns``).

The table: keyed on ``k``; a push upserts ``rows`` distinct random keys, all with the same
``seq`` (unique per push, across writers) and ``sent_ns``; ``px`` and ``qty`` are payload.
The table is loaded with every key once (``seq`` -1) before the clock starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([("k", pa.int64()), ("seq", pa.int64()), ("sent_ns", pa.int64()),
                    ("px", pa.float64()), ("qty", pa.int64())])


def rows(rng: np.random.Generator, keys: np.ndarray, seq: int, sent_ns: int) -> pa.Table:
    """One push: ``keys`` with ``seq`` and ``sent_ns`` on every row, random payload."""
    n = keys.size
    return pa.table({"k": keys, "seq": np.full(n, seq, np.int64),
                     "sent_ns": np.full(n, sent_ns, np.int64), "px": rng.random(n) * 100,
                     "qty": rng.integers(1, 1000, n, dtype=np.int64)}, schema=SCHEMA)


def _failure(exc: BaseException) -> str:
    traceback.print_exc()
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _loop_commands(conn: Any, commands: dict[str, Callable[..., Any]]) -> None:
    """Answer commands until ``stop`` (whose own handler, if any, runs first)."""
    while True:
        name, *args = conn.recv()
        try:
            reply = ("ok", commands[name](*args))
        except Exception as exc:
            reply = ("error", _failure(exc))
        conn.send(reply)
        if name == "stop":
            return


# ---------------------------------------------------------------------------- servers
class _LinkLog:
    """Wraps ``Link._apply`` and ``Link._set_state`` (class-wide, in this process only) to
    record, per mirror: each message staged (when, bytes the link counted for it, snapshot
    or not, the resume answer, rows) and each state change (when, state, detail).

    With :attr:`wake` set, a staged message also wakes the graph's cycle thread
    (``request_cycle``, as a committed push does), so the mirror applies it at once instead
    of at its next periodic cycle: not what main does, a measurement of what it would give.
    """

    def __init__(self) -> None:
        from flight.links.link import Link

        self.wake = False
        self.lock = threading.Lock()
        self.messages: dict[str, list[tuple[float, int, bool, int, int]]] = {}
        self.states: dict[str, list[tuple[float, str, str]]] = {}
        apply, set_state = Link._apply, Link._set_state
        log = self

        def logged_apply(link: Any, table: Any, meta: Any, added: Any, modified: Any,
                         first: bool) -> None:
            before = link.bytes_received
            apply(link, table, meta, added, modified, first)
            if log.wake:  # what if a link woke its graph (main's waits for the next cycle)
                link.graph.request_cycle()
            with log.lock:
                log.messages.setdefault(link.spec.name, []).append(
                    (time.perf_counter(), link.bytes_received - before, bool(meta.is_snapshot),
                     int(meta.resume), added.num_rows + modified.num_rows))

        def logged_state(link: Any, state: str, detail: str = "") -> None:
            set_state(link, state, detail)
            with log.lock:
                log.states.setdefault(link.spec.name, []).append((time.perf_counter(), state, detail))

        Link._apply = logged_apply  # type: ignore[method-assign,assignment]
        Link._set_state = logged_state  # type: ignore[method-assign,assignment]

    def of(self, name: str) -> dict[str, list[Any]]:
        with self.lock:
            return {"messages": list(self.messages.get(name, [])),
                    "states": list(self.states.get(name, []))}


def serve(conn: Any, params: dict[str, Any]) -> None:
    """A TicktableServer cycling every ``params["interval"]`` s; commands until ``stop``."""
    logging.basicConfig(level=logging.WARNING, format="server %(levelname)s %(name)s: %(message)s")
    from engine.graph import UpdateGraph
    from flight.server import ServerConfig, TicktableServer

    try:
        links = _LinkLog()
        graph = UpdateGraph()
        server = TicktableServer(graph, ServerConfig()).start()
        graph.start(params["interval"], priority=params["priority"])
    except Exception as exc:
        conn.send(("error", _failure(exc)))
        return
    lock = threading.Lock()
    cycles: list[tuple[float, float]] = []  # (when it ended, its duration in ms)

    def on_cycle(step: int) -> None:
        with lock:
            cycles.append((time.perf_counter(), graph.last_cycle_seconds * 1e3))

    graph.add_terminal_listener(on_cycle)
    conn.send(("ok", {"location": server.location, "priority": graph.priority}))

    def take_cycles() -> list[tuple[float, float]]:
        with lock:
            out = cycles.copy()
            cycles.clear()
        return out

    def mirror(spec: str, timeout: float) -> str:
        link = server.mirror(spec)
        link.wait_table(timeout)
        if not link.wait_in_sync(timeout):
            raise TimeoutError(f"mirror {spec} not in sync after {timeout:g} s")
        return link.spec.name

    def link(name: str) -> dict[str, Any]:
        ln = server.links.get(name)
        if ln is None:
            raise KeyError(f"no mirror {name!r}")
        return {"in_sync": ln.in_sync, "state": ln.state, "reconnects": ln.reconnects,
                "messages": ln.messages, "bytes_received": ln.bytes_received,
                "resumed_with_deltas": ln.resumed_with_deltas,
                "resumed_with_snapshot": ln.resumed_with_snapshot, **links.of(name)}

    def stats() -> dict[str, float]:
        s = server.stats()
        return {"cycle_p50_ms": s.cycle_p50_ms, "cycle_p99_ms": s.cycle_p99_ms, "step": s.step}

    def wake(on: bool) -> None:
        links.wake = on

    def stop() -> None:
        graph.stop()
        server.shutdown()

    _loop_commands(conn, {
        "mirror": mirror, "link": link, "cycles": take_cycles, "stats": stats,
        "drop": lambda name: server.durability.drop_table(name), "wake": wake, "stop": stop})


# ---------------------------------------------------------------------------- the proxy
class _Proxy:
    """A TCP forwarder on 127.0.0.1 to ``target``: what runs between a mirror and its origin
    so the bench can cut the link as a network would (both ends see the connection reset).

    While cut, every open connection is aborted and new ones are aborted as soon as they
    are accepted. Per connection it keeps when it opened and, for the origin-to-mirror
    direction, the cumulative bytes forwarded after each read: the bytes on the wire.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.cut = False
        self.open: set[asyncio.StreamWriter] = set()
        self.conns: list[dict[str, Any]] = []
        self.refused = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        rec: dict[str, Any] = {"opened": time.perf_counter(), "down": [], "up_bytes": 0}
        self.conns.append(rec)
        self.open |= {writer, up_w}
        try:
            await asyncio.gather(self._pipe(reader, up_w, rec, False),
                                 self._pipe(up_r, writer, rec, True))
        finally:
            self.open -= {writer, up_w}
            for w in (writer, up_w):
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    rec: dict[str, Any], down: bool) -> None:
        total = 0
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                total += len(data)
                if down:
                    rec["down"].append((time.perf_counter(), total))
                else:
                    rec["up_bytes"] = total
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()  # one side gone: so is the other

    def set_cut(self, cut: bool) -> float:
        self.cut = cut
        if cut:
            for w in list(self.open):
                w.transport.abort()
        return time.perf_counter()


def proxy(conn: Any, params: dict[str, Any]) -> None:
    """The proxy of :class:`_Proxy` on an event loop of its own thread; commands here."""
    p = _Proxy((params["host"], params["port"]))
    loop = asyncio.new_event_loop()
    started: list[Any] = []
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(p.handle, "127.0.0.1", 0))
        started.append(server)
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True, name="proxy").start()
    ready.wait(30)
    port = started[0].sockets[0].getsockname()[1]
    conn.send(("ok", f"grpc://127.0.0.1:{port}"))

    def on_loop(fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), loop).result(10)

    _loop_commands(conn, {
        "cut": lambda: on_loop(lambda: p.set_cut(True)),
        "restore": lambda: on_loop(lambda: p.set_cut(False)),
        "conns": lambda: on_loop(lambda: {"conns": [dict(c, down=list(c["down"])) for c in p.conns],
                                          "refused": p.refused}),
        "stop": lambda: None})


# ---------------------------------------------------------------------------- writers
def write(conn: Any, params: dict[str, Any]) -> None:
    """``params["writers"]`` threads, each pushing ``rows`` rows ``rate`` times a second
    into ``table`` at ``uri`` through ``tt.connect(uri).push(..., mode="upsert")``, from
    ``start`` until ``stop``.

    A writer keeps a fixed schedule; a push that returns late delays the next one, and a
    writer more than one period behind skips the ticks it missed (counted) rather than
    bursting to catch up. Per push it records (writer, seq, sent, acknowledged: when
    ``push`` returned, perf_counter ns, rows; acknowledged 0 for a failed push).
    """
    logging.basicConfig(level=logging.WARNING, format="writer %(levelname)s %(name)s: %(message)s")
    import ticktable as tt

    n, rate, nrows = params["writers"], params["rate"], params["rows"]
    nkeys, table, uri = params["keys"], params["table"], params["uri"]
    stop = threading.Event()
    records: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(n)]
    skipped = [0] * n
    errors: list[str] = []

    def writer(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        client = tt.connect(uri)
        period = 1.0 / rate
        seq = i
        due = time.perf_counter()
        try:
            while not stop.is_set():
                drawn = np.unique(rng.integers(0, nkeys, nrows + nrows // 8))
                keys = np.sort(rng.choice(drawn, min(nrows, drawn.size), replace=False))
                sent = time.perf_counter_ns()
                try:
                    client.push(table, rows(rng, keys, seq, sent), mode="upsert")
                    records[i].append((i, seq, sent, time.perf_counter_ns(), keys.size))
                except Exception as exc:
                    records[i].append((i, seq, sent, 0, keys.size))
                    errors.append(_failure(exc))
                seq += n
                due += period
                late = time.perf_counter() - due
                if late < 0:
                    stop.wait(-late)
                elif late > period:
                    skipped[i] += int(late / period)
                    due = time.perf_counter()
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True, name=f"writer-{i}")
               for i in range(n)]
    conn.send(("ok", None))

    def start() -> float:
        for t in threads:
            t.start()
        return time.perf_counter()

    def log() -> dict[str, Any]:
        recs = [r for w in records for r in list(w)]
        a = np.array(recs, dtype=np.int64).reshape(-1, 5)
        return {"writer": a[:, 0], "seq": a[:, 1], "sent": a[:, 2], "acked": a[:, 3],
                "rows": a[:, 4], "skipped": list(skipped), "errors": errors[:5],
                "error_count": len(errors)}

    def halt() -> float:
        stop.set()
        for t in threads:
            t.join(60)
        return time.perf_counter()

    _loop_commands(conn, {"start": start, "log": log, "halt": halt, "stop": lambda: None})


# ---------------------------------------------------------------------------- subscribers
def subscribe(conn: Any, params: dict[str, Any]) -> None:
    """``params["n"]`` subscriptions (``LiveTable``, one reader thread each) to ``table`` at
    ``uri``, all columns, the process at ``nice``.

    For each message the callback stamps ``perf_counter_ns()`` when it starts (the message
    is applied: ``LiveTable.df`` would show it) and records every push the message carries:
    its ``seq`` and ``sent_ns`` (one per push; a message the server composed from several
    cycles carries several, less the pushes whose every row a later one overwrote). A
    snapshot counts too: after the first (taken before ``mark``, its rows at ``seq`` -1),
    one is how a subscriber the server's history no longer reaches back for catches up.
    ``log`` returns, for the records since ``mark``, the arrays ``sub``, ``seq``, ``sent``,
    ``recv`` (record for record), and the messages and snapshots applied.
    """
    logging.basicConfig(level=logging.WARNING, format="subscriber %(levelname)s %(name)s: %(message)s")
    import ticktable as tt

    os.nice(params["nice"])

    lock = threading.Lock()
    recs: list[tuple[int, np.ndarray, np.ndarray, int]] = []
    messages = [0, 0]  # applied since mark: all, snapshots

    def callback(i: int) -> Callable[[Any], None]:
        def on_update(u: Any) -> None:
            t = time.perf_counter_ns()
            # the rows as Arrow: Update's public frames (to_pandas) cost ~1.9 ms per 1,000-row
            # message against ~0.2 ms, and 400 subscribers would measure pandas
            parts = [u._added.arrow(), u._modified.arrow()]
            seq = np.concatenate([p["seq"].to_numpy() for p in parts])
            sent = np.concatenate([p["sent_ns"].to_numpy() for p in parts])
            seq, at = np.unique(seq, return_index=True)
            sent = sent[at]
            live = seq >= 0  # the rows loaded first carry seq -1
            with lock:
                recs.append((i, seq[live], sent[live], t))
                messages[0] += 1
                messages[1] += u.is_snapshot
        return on_update

    client = tt.connect(params["uri"])
    subs = [client.subscribe(params["table"], on_update=callback(i)) for i in range(params["n"])]
    conn.send(("ok", None))

    def ready(timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(s.wait_for(timeout=max(0.0, end - time.monotonic())) for s in subs)

    def mark() -> None:
        with lock:
            recs.clear()
            messages[:] = [0, 0]

    def log() -> dict[str, Any]:
        with lock:
            got = list(recs)
            msgs, snaps = messages
        if not got:
            e = np.empty(0, np.int64)
            return {"sub": e, "seq": e, "sent": e, "recv": e, "messages": msgs, "snapshots": snaps}
        sizes = [r[1].size for r in got]
        return {"sub": np.repeat([r[0] for r in got], sizes).astype(np.int64),
                "seq": np.concatenate([r[1] for r in got]),
                "sent": np.concatenate([r[2] for r in got]),
                "recv": np.repeat([r[3] for r in got], sizes).astype(np.int64),
                "messages": msgs, "snapshots": snaps}

    def status() -> dict[str, Any]:
        return {"reconnects": sum(s.reconnects for s in subs),
                "errors": [repr(s.error) for s in subs if s.error is not None][:3],
                "sequence_min": min(s.sequence for s in subs)}

    def stop() -> None:
        for s in subs:
            s.close(timeout=2)
        client.close()

    def count() -> int:
        with lock:
            return sum(r[1].size for r in recs)

    _loop_commands(conn, {"ready": ready, "mark": mark, "log": log, "count": count,
                          "status": status, "stop": stop})
