"""bench_live: what a LiveTable pays per update, and for a snapshot into pandas.

1. Apply cost. A keyed table (Key int64, Sym string, Price float64, Qty int64) of each of
   --sizes rows gets --updates cycles of --change rows each: half modifies of existing
   keys, a quarter new keys, a quarter deletes (``--mix modify``: every row a modify, which
   piles up dead slots fastest). A raw subscriber on a real server (127.0.0.1) reads one
   message per cycle; the decoded messages are then applied, offline, to the client state
   (``clients.livestate.LiveState.apply``), timing each apply with ``perf_counter_ns``
   after --warmup untimed ones. Median, mean, p99 and max per update for every size side
   by side, and the ratio of medians to the smallest size: cost should follow the change,
   not the table. Every figure includes the incremental compaction that reclaims dead
   slots (``compacting``: the timed updates that cleaned part of the log, ``moved``: the
   live rows they copied).
2. Snapshot into pandas. A server in a spawned subprocess (its own GIL, as deployed)
   holds a keyed table of --snap-sizes rows (and 10M with --big); the client times
   ``LiveTable(...)`` until the snapshot is applied (``wait_for``), then the first ``.df``,
   a cached ``.df``, one --change-row update (round trip: the server's cycle, the send,
   the apply) and ``.df`` again after it (brought current in place since #39 item 6).
3. ``.df`` after an update (#39 item 6). A keyed table of each of --frame-sizes rows on a
   real server (127.0.0.1) gets --frame-updates --change-row updates of each kind, read one
   message per cycle by a raw subscriber: ``modify`` (every column of --change existing
   keys; the strings change too), ``modify-numeric`` (Price and Qty only), ``append``
   (new keys: rows at the end), ``remove`` (existing keys at random: rows anywhere) and
   ``insert`` (new keys taking the row keys the removes freed: rows anywhere), the last
   two taking turns. Offline, a LiveTable is fed the messages (``LiveTable.apply``) and
   ``.df`` is read after each one: it is brought current in place; the rebuild it replaced
   (``to_arrow().to_pandas()`` of the same rows: what ``.df`` cost before) is timed on
   the first --frame-rebuilds of each kind, in the same run. Median, mean and p99 of each,
   the ratio of the medians, and how many reads rebuilt (0: all in place); after each kind
   the frame is checked equal to the rebuild. ``--string-storage`` sets pandas'
   ``mode.string_storage`` for the frames (``pyarrow``, pandas' default: the ``Sym`` column
   is Arrow, spliced and combined; ``python``: Python strings written in place; ``both``:
   each in turn, fed the same messages).

Run: python bench/bench_live.py [--quick] [--big] [--only frames] [--string-storage both]
[--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.flight as fl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import SCHEMA, SYMS, batch, print_table, stats_ms, write_json  # noqa: E402
from clients.live import LiveTable  # noqa: E402
from clients.livestate import LiveState  # noqa: E402
from clients.wire import Endpoint  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from flight.pb import flight_pb2 as pb  # noqa: E402
from flight.server import ServerConfig, TicktableServer  # noqa: E402
from flight.streams.decoder import Message, read_message  # noqa: E402

LOAD_ROWS = 1 << 18  # rows per upsert while filling a table


def _fill(graph: UpdateGraph, table: Any, n: int, rng: np.random.Generator) -> None:
    for start in range(0, n, LOAD_ROWS):
        table.upsert(batch(rng, np.arange(start, min(n, start + LOAD_ROWS))))
        graph.run_cycle()


class _Workload:
    """Each cycle: ``change/2`` modifies, ``change/4`` new keys, ``change/4`` deletes
    (``modify_only``: ``change`` modifies)."""

    def __init__(self, n: int, change: int, rng: np.random.Generator,
                 modify_only: bool = False) -> None:
        self.live = np.arange(n, dtype=np.int64)  # keys present (unordered)
        self.next_key = n
        self.change, self.rng, self.modify_only = change, rng, modify_only

    def step(self, table: Any) -> None:
        r, c = self.rng, self.change
        if self.modify_only:
            table.upsert(batch(r, self.live[r.choice(self.live.size, c, replace=False)]))
            return
        pick = r.choice(self.live.size, c // 2 + c // 4, replace=False)
        modify, delete = self.live[pick[: c // 2]], self.live[pick[c // 2:]]
        new = np.arange(self.next_key, self.next_key + c // 4, dtype=np.int64)
        self.next_key += new.size
        keep = np.ones(self.live.size, dtype=bool)
        keep[pick[c // 2:]] = False
        self.live = np.concatenate([self.live[keep], new])
        table.upsert(batch(r, np.concatenate([modify, new])))
        table.delete(pa.table({"Key": delete}))


def capture(n: int, updates: int, change: int, seed: int,
            modify_only: bool = False) -> list[Message]:
    """The snapshot and one message per cycle, as a subscriber on a real server reads them."""
    rng = np.random.default_rng(seed)
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(history_updates=4)).start()
    client = fl.connect(server.location)
    try:
        table = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
        _fill(graph, table, n, rng)
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path("t"))
        writer.begin(pa.schema([]))
        req = pb.SubscriptionRequest(table="t")
        writer.write_metadata(pa.py_buffer(pb.ClientMessage(subscribe=req).SerializeToString()))
        schema = reader.schema
        messages = [read_message(reader, schema)]
        work = _Workload(n, change, rng, modify_only)
        for _ in range(updates):
            work.step(table)
            graph.run_cycle()
            messages.append(read_message(reader, schema))  # read each: nothing coalesces
        reader.cancel()
        try:
            writer.close()  # (else its destructor logs the cancelled call's status)
        except fl.FlightError:
            pass
        return messages
    finally:
        client.close()
        server.shutdown()


def time_apply(messages: list[Message], warmup: int) -> dict[str, Any]:
    state = LiveState(messages[0].added.schema)
    t = time.perf_counter_ns()
    state.apply(messages[0].meta, messages[0].added, messages[0].modified)
    snap_ms = (time.perf_counter_ns() - t) / 1e6
    samples: list[int] = []
    compacting = moved = 0
    gc.disable()  # a collection inside one apply would be billed to it
    try:
        for i, m in enumerate(messages[1:]):
            slots, rows = state.compacted_slots, state.compacted_rows
            t = time.perf_counter_ns()
            state.apply(m.meta, m.added, m.modified)
            dt = time.perf_counter_ns() - t
            if i >= warmup:
                samples.append(dt)
                compacting += state.compacted_slots > slots
                moved += state.compacted_rows - rows
    finally:
        gc.enable()
    t = time.perf_counter_ns()
    df = state.to_arrow().to_pandas()
    df_ms = (time.perf_counter_ns() - t) / 1e6
    return {**stats_ms(samples), "max_ms": max(samples) / 1e6, "snapshot_apply_ms": snap_ms,
            "compacting": compacting, "moved": moved, "log_slots": len(state.store),
            "rows": int(len(df)), "df_ms": df_ms}


# ---------------------------------------------------------------------------- snapshots
def _serve(n: int, change: int, conn: Any) -> None:
    """The server process: a keyed table of ``n`` rows; one update per 'update' command."""
    rng = np.random.default_rng(0)
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig()).start()
    table = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
    _fill(graph, table, n, rng)
    work = _Workload(n, change, rng)
    conn.send(server.location)
    while (cmd := conn.recv()) != "stop":
        assert cmd == "update"
        work.step(table)
        graph.run_cycle()
        publisher = server.registry.get("t").publisher
        assert publisher is not None
        conn.send(publisher.sequence)
    server.shutdown()
    conn.send("stopped")


def time_snapshot(n: int, change: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(n, change, child), daemon=True)
    proc.start()
    try:
        location = parent.recv()
        t0 = time.perf_counter()
        live = LiveTable(Endpoint(location).connect, "t")
        assert live.wait_for(timeout=600), "no snapshot"
        t1 = time.perf_counter()
        df = live.df
        t2 = time.perf_counter()
        assert live.df is df and len(df) == n
        t3 = time.perf_counter()
        parent.send("update")
        sequence = parent.recv()
        assert live.wait_for(sequence=sequence, timeout=60)
        t4 = time.perf_counter()
        assert len(live.df) == n
        t5 = time.perf_counter()
        live.close()
        parent.send("stop")
        parent.recv()
        return {"rows": n, "subscribe_s": t1 - t0, "first_df_s": t2 - t1,
                "cached_df_ms": (t3 - t2) * 1e3, "update_roundtrip_ms": (t4 - t3) * 1e3,
                "df_after_update_s": t5 - t4, "total_s": t2 - t0}
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


# ---------------------------------------------------------------------------- .df in place
FRAME_KINDS = ("modify", "modify-numeric", "append", "remove", "insert")


class _Frames:
    """A keyed table of :data:`SCHEMA` (``Key`` 0..n-1 at first) and updates of one kind at
    a time, tracking each key's symbol (a numeric modify keeps it)."""

    def __init__(self, n: int, change: int, rng: np.random.Generator) -> None:
        self.rng, self.change = rng, change
        self.sym = rng.integers(0, 1000, n)  # by key
        self.alive = np.arange(n, dtype=np.int64)  # the keys present (unordered)
        self.next_key = n

    def rows(self, keys: np.ndarray, new_sym: bool = True) -> pa.Table:
        r, n = self.rng, keys.size
        if new_sym:
            self.sym[keys] = r.integers(0, 1000, n)
        return pa.table({"Key": pa.array(keys, pa.int64()),
                         "Sym": SYMS.take(pa.array(self.sym[keys])),
                         "Price": pa.array(r.random(n) * 100),
                         "Qty": pa.array(r.integers(1, 1000, n))}, schema=SCHEMA)

    def step(self, table: Any, kind: str) -> None:
        r, c = self.rng, self.change
        if kind in ("modify", "modify-numeric"):
            keys = self.alive[r.choice(self.alive.size, c, replace=False)]
            table.upsert(self.rows(keys, new_sym=kind == "modify"))
        elif kind == "remove":
            pick = r.choice(self.alive.size, c, replace=False)
            table.delete(pa.table({"Key": self.alive[pick]}))
            self.alive = np.delete(self.alive, pick)
        else:  # append, insert: new keys (insert: after a remove, into the freed row keys)
            keys = np.arange(self.next_key, self.next_key + c, dtype=np.int64)
            self.next_key += c
            self.sym = np.concatenate([self.sym, np.zeros(c, dtype=self.sym.dtype)])
            self.alive = np.concatenate([self.alive, keys])
            table.upsert(self.rows(keys))


def capture_frames(n: int, change: int, updates: int, seed: int,
                   ) -> tuple[Message, list[tuple[str, Message]]]:
    """The snapshot of an ``n``-row keyed table, then ``updates`` messages of each kind in
    :data:`FRAME_KINDS` (remove and insert taking turns), as a subscriber reads them."""
    rng = np.random.default_rng(seed)
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(history_updates=4)).start()
    client = fl.connect(server.location)
    work = _Frames(n, change, rng)
    try:
        table = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
        for start in range(0, n, LOAD_ROWS):
            table.upsert(work.rows(np.arange(start, min(n, start + LOAD_ROWS)), new_sym=False))
            graph.run_cycle()
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path("t"))
        writer.begin(pa.schema([]))
        req = pb.SubscriptionRequest(table="t")
        writer.write_metadata(pa.py_buffer(pb.ClientMessage(subscribe=req).SerializeToString()))
        schema = reader.schema
        snapshot = read_message(reader, schema)
        messages: list[tuple[str, Message]] = []
        order = [[k] * updates for k in FRAME_KINDS[:3]] + [["remove", "insert"] * updates]
        for kind in (k for ks in order for k in ks):
            work.step(table, kind)
            graph.run_cycle()
            messages.append((kind, read_message(reader, schema)))  # read each: no coalescing
        reader.cancel()
        try:
            writer.close()
        except fl.FlightError:
            pass
        return snapshot, messages
    finally:
        client.close()
        server.shutdown()


def time_frames(n: int, change: int, updates: int, warmup: int, rebuilds: int,
                seed: int = 3, storages: tuple[str, ...] = ("pyarrow",),
                ) -> list[dict[str, Any]]:
    """``.df`` after each captured message (in place), and the rebuild it replaced, with
    each of pandas' string ``storages`` in turn (the same messages)."""
    snapshot, messages = capture_frames(n, change, updates + warmup, seed)
    rows = []
    for storage in storages:
        with pd.option_context("mode.string_storage", storage):
            rows += _time_frames(n, snapshot, messages, warmup, rebuilds, storage)
        gc.collect()
    return rows


def _time_frames(n: int, snapshot: Message, messages: list[tuple[str, Message]], warmup: int,
                 rebuilds: int, storage: str) -> list[dict[str, Any]]:
    """:func:`time_frames` for one string storage (pandas' option is set by the caller)."""
    live = LiveTable(lambda: None, "t", start=False)  # fed by hand: no reader thread
    live.apply(snapshot.meta, snapshot.added, snapshot.modified)
    t = time.perf_counter_ns()
    _ = live.df
    first_ms = (time.perf_counter_ns() - t) / 1e6
    df_ns: dict[str, list[int]] = {k: [] for k in FRAME_KINDS}
    rebuild_ns: dict[str, list[int]] = {k: [] for k in FRAME_KINDS}
    rebuilt = dict.fromkeys(FRAME_KINDS, 0)
    seen = dict.fromkeys(FRAME_KINDS, 0)
    gc.collect()
    gc.disable()  # a collection inside one read would be billed to it
    try:
        for i, (kind, m) in enumerate(messages):
            live.apply(m.meta, m.added, m.modified)
            before = live._frames.rebuilds
            t = time.perf_counter_ns()
            _ = live.df
            dt = time.perf_counter_ns() - t
            seen[kind] += 1
            if seen[kind] > warmup:
                df_ns[kind].append(dt)
                rebuilt[kind] += live._frames.rebuilds - before
                if len(rebuild_ns[kind]) < rebuilds:
                    t = time.perf_counter_ns()
                    live.to_arrow().to_pandas()
                    rebuild_ns[kind].append(time.perf_counter_ns() - t)
                    gc.collect()
            following = messages[i + 1][0] if i + 1 < len(messages) else None
            if following != kind and following not in ("remove", "insert"):  # a kind's last
                pd.testing.assert_frame_equal(live.df, live.to_arrow().to_pandas())
    finally:
        gc.enable()
    rows = []
    for kind in FRAME_KINDS:
        df, rb = stats_ms(df_ns[kind]), stats_ms(rebuild_ns[kind])
        rows.append({"size": n, "strings": storage, "update": kind, "first_df_ms": first_ms,
                     **{f"df_{k}": v for k, v in df.items()},
                     **{f"rebuild_{k}": v for k, v in rb.items()},
                     "speedup": rb["median_ms"] / df["median_ms"], "rebuilt": rebuilt[kind]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,1000000", help="table sizes for the apply cost")
    ap.add_argument("--change", type=int, default=1000, help="rows per update")
    ap.add_argument("--mix", choices=["mixed", "modify"], default="mixed",
                    help="mixed: 1/2 modifies, 1/4 adds, 1/4 deletes; modify: modifies only")
    ap.add_argument("--updates", type=int, default=2500, help="timed cycles per size")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--snap-sizes", default="1000000")
    ap.add_argument("--big", action="store_true", help="also snapshot 10M rows (minutes)")
    ap.add_argument("--frame-sizes", default="1000000,10000000",
                    help="table sizes for .df after an update")
    ap.add_argument("--frame-updates", type=int, default=50, help="timed .df reads per kind")
    ap.add_argument("--frame-rebuilds", type=int, default=7,
                    help="timed rebuilds (to_arrow().to_pandas()) per kind")
    ap.add_argument("--string-storage", choices=["pyarrow", "python", "both"],
                    default="pyarrow", help="pandas' string storage for the frames")
    ap.add_argument("--only", choices=["apply", "snapshot", "frames"], default=None,
                    help="run this section only")
    ap.add_argument("--quick", action="store_true", help="small run to check it works")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    snaps = [int(s) for s in args.snap_sizes.split(",")] + ([10_000_000] if args.big else [])
    frame_sizes = [int(s) for s in args.frame_sizes.split(",")]
    if args.quick:
        sizes, snaps, args.updates, args.warmup = [10_000, 100_000], [100_000], 300, 20
        frame_sizes, args.frame_updates, args.frame_rebuilds = [100_000], 10, 3
    if args.only is not None:
        sizes = [] if args.only != "apply" else sizes
        snaps = [] if args.only != "snapshot" else snaps
        frame_sizes = [] if args.only != "frames" else frame_sizes

    rows = []
    for n in sizes:
        t = time.perf_counter()
        messages = capture(n, args.updates + args.warmup, args.change, seed=n,
                           modify_only=args.mix == "modify")
        print(f"captured {len(messages)} messages of a {n:,}-row table in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        rows.append({"size": n, **time_apply(messages, args.warmup)})
        del messages
    if rows:
        base = rows[0]["median_ms"]
        for r in rows:
            r["ratio"] = r["median_ms"] / base
        mix = (f"{args.change} modified" if args.mix == "modify" else
               f"{args.change // 2} modified, {args.change // 4} added, "
               f"{args.change // 4} removed")
        print_table(f"apply one {args.change}-row update ({mix}), {args.updates} timed", rows,
                    ["size", "median_ms", "mean_ms", "p99_ms", "max_ms", "ratio", "compacting",
                     "moved", "log_slots", "snapshot_apply_ms", "df_ms"])

    snap_rows = []
    for n in snaps:
        snap_rows.append(time_snapshot(n, args.change))
        print(f"snapshot of {n:,} rows done", flush=True)
    if snap_rows:
        print_table("subscribe -> snapshot applied -> .df (server in another process)",
                    snap_rows, ["rows", "subscribe_s", "first_df_s", "total_s", "cached_df_ms",
                                "update_roundtrip_ms", "df_after_update_s"])

    frame_rows = []
    for n in frame_sizes:
        t = time.perf_counter()
        storages = (("pyarrow", "python") if args.string_storage == "both"
                    else (args.string_storage,))
        frame_rows += time_frames(n, args.change, args.frame_updates, 3, args.frame_rebuilds,
                                  storages=storages)
        print(f".df after updates of a {n:,}-row table: {time.perf_counter() - t:.1f} s",
              flush=True)
    if frame_rows:
        print_table(f".df after one {args.change}-row update, in place vs rebuilt "
                    f"(to_arrow().to_pandas()), ms: {args.frame_updates} reads and "
                    f"{args.frame_rebuilds} rebuilds per kind", frame_rows,
                    ["size", "strings", "update", "df_median_ms", "df_mean_ms", "df_p99_ms",
                     "rebuild_median_ms", "rebuild_mean_ms", "rebuild_p99_ms", "speedup",
                     "rebuilt", "first_df_ms"])
    write_json("bench_live", {"args": vars(args), "apply": rows, "snapshot": snap_rows,
                              "frames": frame_rows}, args.json)


if __name__ == "__main__":
    main()
