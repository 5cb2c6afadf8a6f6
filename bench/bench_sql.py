"""bench_sql: Flight SQL on a live table against DuckDB in-process, and SQL views (issue #36).

Topology: the server (bench/_sql_server.py) runs in a spawned process with its graph cycling
every --interval s (``ticktable serve``'s default, at --cycle-priority), so its cycles,
gRPC threads and DuckDB have their own GIL; the clients (ADBC's Flight SQL driver, pyarrow
Flight) and the in-process DuckDB run here. The live table ``t`` is an append-only source
of --rows rows (``id`` unique, ``g`` in ~1,000 groups, ``x`` int64, ``y`` float64), made
from the same seed in both processes; ``k`` is a keyed table (key ``id``) of the same rows.
When live, a writer in the server appends --change rows to ``t`` after every cycle and
upserts about as many rows of existing ids (new values) into ``k``.

Measures:
  1. Query latency, end to end through ADBC (``cursor.execute`` + ``fetch_arrow_table``:
     GetFlightInfo, DoGet, decode) against DuckDB in this process over the same rows as one
     registered Arrow table (``duckdb.connect(config={"threads": --duckdb-threads})``; the
     server's DuckDB runs one thread), taking turns query by query: a point lookup
     (``WHERE id = <literal>``, a new id each time) on ``t`` (the server scans the blocks
     whose zone maps hold the id: ``t``'s ids grow with it; DuckDB scans the whole table),
     the same on ``t`` as ``WHERE id + 0 = <literal>`` ("point (scan)": the server scans the
     whole table, as for a column whose values do not grow with the table; DuckDB still runs
     ``id = <literal>``, its pushed-down filter), and on ``k`` (the server looks the key up
     in the keyed table's index; DuckDB scans its copy, registered as ``k`` too), and a group-by (``g, count(*), sum(x), avg(y)``). ``x_duckdb`` = DuckDB's median / Ticktable's (goal >= 0.8). Twice: live
     (the writer on: a query after a cycle finds the table changed and takes a new snapshot)
     and static (the writer off: every query reuses the one snapshot the cache keeps). The
     server's own timing of each ``SnapshotCache.take`` and ``QueryRunner.start`` is
     reported beside it (in the live table's rows the writer's rows are not in DuckDB's
     copy: a few thousand of --rows, the same groups).
  2. Cycle time with the writer only for --cycle-seconds, then as long with a client thread
     running the group-by back to back: the server's cycle duration (``last_cycle_seconds``,
     what ``stats()`` reports), the whole ``run_cycle`` call (which counts waiting for the
     graph's lock, held shared by a snapshot) and the gap between cycle ends.
  3. A live view's cycle cost (in this process, no server): ``CREATE VIEW``'s compiler
     (``flight.sql.views.compile_view``) against the same pipeline through the Python API,
     each on its own graph over a keyed source of --view-rows rows, plus a graph with the
     source alone; each cycle upserts --view-change rows (half new keys, half updates) into
     every graph, the graphs taking turns, and ``graph.run_cycle()`` is timed. ``x_python``
     = SQL view's median cycle / Python's (goal <= 1.1); "marginal" subtracts the source-only
     graph's cycle. A filter + group-by, and a join onto a 1,000-row keyed dimension.
  4. Ingest: --ingest-rows rows (bench/_common.py's 4-column schema) in --ingest-batch-rows
     batches into a fresh append table of a fresh server, through ADBC's ``adbc_ingest``
     (``mode="append"``: one DoPut of a ``CommandStatementIngest``, answered once journaled
     and committed, before the cycle that applies it)
     and through ``pyarrow.flight`` DoPut with the table's path (``PUT_MODE_APPEND``, every
     batch acked), taking turns; rows/s until answered (acked) and until the cycle that
     applied the last row ended. ``x_doput`` = ADBC rows/s / DoPut's (goal >= 0.8). Then the
     same two clients against a bare ``pyarrow.flight`` server that only counts rows (C++
     gRPC, no Python per message): the "(reference)" rows, what the clients themselves
     reach, so a ratio below it is the server's part. ``client_cpu_ms`` is this process's
     CPU per ingest while it sends (ADBC's Go driver runs in it), ``server_cpu_ms`` the
     server process's until the rows are applied: where each path's time goes.

  5. ``executemany`` (DB-API's batch: one DoPut of every parameter row) through ADBC of
     --executemany-rows rows: INSERT into an append and a keyed table, UPDATE and DELETE by
     key, against ``adbc_ingest`` of the same rows; each runs as one query over the rows.

Then pyinstrument over the server's SQL service (GetFlightInfo's and DoGet's work, gRPC
left out) for the live group-by and point lookup, an excerpt printed.

Run: python bench/bench_sql.py [--quick] [--rows N] [--sections ...] [--json PATH]
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
import pyarrow.compute as pc
import pyarrow.flight as fl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import SCHEMA, batch, print_table, write_json  # noqa: E402
from bench._sql_server import GROUPS, SQL_SCHEMA, serve, serve_reference, sql_rows, table_chunks  # noqa: E402

POINT = "SELECT * FROM t WHERE id = {id}"
#: the same lookup the server cannot narrow (``id + 0`` bounds no column: a whole scan, as
#: over a column whose values do not grow with the table); DuckDB runs ``POINT`` for it
POINT_SCAN = "SELECT * FROM t WHERE id + 0 = {id}"
POINT_KEYED = "SELECT * FROM k WHERE id = {id}"
#: the queries of section 1, by name
KINDS = ("point", "point (scan)", "point (keyed)", "group-by")
GROUP_BY = "SELECT g, count(*), sum(x), avg(y) FROM t GROUP BY g"


def _stats(ms: list[float]) -> dict[str, float | None]:
    if not ms:
        return {"p50_ms": None, "mean_ms": None, "p99_ms": None, "max_ms": None, "n": 0}
    a = np.asarray(ms, dtype=float)
    return {"p50_ms": float(np.median(a)), "mean_ms": float(a.mean()),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "n": int(a.size)}


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


class ServerProcess:
    """bench/_sql_server.py in a spawned process; ``call`` runs one of its commands."""

    def __init__(self, target: Any = serve) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, {}), daemon=True)
        self.proc.start()
        child.close()
        self.location: str = self._reply(120.0)

    def call(self, *cmd: Any, timeout: float = 600.0) -> Any:
        self.conn.send(cmd)
        return self._reply(timeout)

    def _reply(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"the server process did not answer in {timeout:g} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"server process: {value}")
        return value

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user + system, all its threads)."""
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        try:
            self.call("stop", timeout=60.0)
        except (RuntimeError, OSError, EOFError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def _adbc(location: str) -> Any:
    import adbc_driver_flightsql.dbapi as dbapi

    return dbapi.connect(location, autocommit=True)


# ---------------------------------------------------------------------------- 1. queries
#: the ways a query is run, taking turns: ADBC's statement (GetFlightInfo + DoGet), the
#: DB-API cursor (a text new to it is prepared first: CreatePreparedStatement, whose answer
#: carries the result schema, then GetFlightInfo of the prepared statement, DoGet, and
#: ClosePreparedStatement of the previous one), and DuckDB in this process
ENGINES = ("ticktable", "ticktable db-api", "duckdb")


def _timed(run: Any, q: str) -> tuple[float, pa.Table]:
    t = time.perf_counter()
    out = run(q)
    return (time.perf_counter() - t) * 1e3, out


def _same_groups(a: pa.Table, b: pa.Table) -> bool:
    """The group-by's answers agree (sorted by g; sums compared as floats)."""
    a, b = a.sort_by(a.column_names[0]), b.sort_by(b.column_names[0])
    return a.num_rows == b.num_rows and all(
        np.allclose(a.column(i).to_numpy().astype(float), b.column(i).to_numpy().astype(float))
        for i in range(a.num_columns))


def bench_queries(server: ServerProcess, local: pa.Table, rows: int, change: int, reps: int,
                  warmup: int, duckdb_threads: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import adbc_driver_manager as dm
    import duckdb

    duck = duckdb.connect(config={"threads": duckdb_threads})
    duck.register("t", local)
    duck.register("k", local)
    con = _adbc(server.location)
    cur = con.cursor()
    stmt = dm.AdbcStatement(con.adbc_connection)

    def adbc_statement(q: str) -> pa.Table:
        stmt.set_sql_query(q)
        handle, _ = stmt.execute_query()
        return pa.RecordBatchReader._import_from_c(handle.address).read_all()

    def dbapi(q: str) -> pa.Table:
        cur.execute(q)
        return cur.fetch_arrow_table()

    run = {"ticktable": adbc_statement, "ticktable db-api": dbapi,
           "duckdb": lambda q: duck.sql(q).to_arrow_table()}
    rng = np.random.default_rng(11)
    out: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    try:
        for mode in ("static", "live"):  # static first: DuckDB's copy has exactly the rows
            server.call("write", change if mode == "live" else 0)
            time.sleep(0.3)
            times: dict[tuple[str, str], list[float]] = {}
            for i in range(warmup + reps):
                if i == warmup:
                    server.call("mark")
                    times.clear()
                for kind in KINDS:
                    q = {"point": POINT, "point (scan)": POINT_SCAN, "point (keyed)": POINT_KEYED,
                         "group-by": GROUP_BY}[kind]
                    key = int(rng.integers(0, rows))
                    q = q.format(id=key) if "point" in kind else q
                    got = {}
                    for engine in ENGINES[i % 3:] + ENGINES[:i % 3]:  # turns rotate
                        ms, got[engine] = _timed(run[engine], POINT.format(id=key)
                                                 if engine == "duckdb" and kind == "point (scan)" else q)
                        times.setdefault((kind, engine), []).append(ms)
                    if mode == "static" and i == warmup:
                        same = (got["ticktable"].equals(got["duckdb"]) if "point" in kind
                                else _same_groups(got["ticktable"], got["duckdb"]))
                        checks[f"{kind} same as DuckDB"] = same
            log = server.call("log")
            snaps = log["snapshot"]
            fresh = [ms for ms, changed in snaps if changed]
            cached = [ms for ms, changed in snaps if not changed]
            for kind in KINDS:
                dd = _stats(times[kind, "duckdb"])
                for engine in ENGINES:
                    s = _stats(times[kind, engine])
                    out.append({"mode": mode, "query": kind, "engine": engine, "rows": rows, **s,
                                "x_duckdb": _ratio(dd["p50_ms"], s["p50_ms"]) if engine != "duckdb" else None})
            for what, ms in (("snapshot, table changed", fresh), ("snapshot, cached", cached),
                             ("QueryRunner.start", log["query_start"])):
                out.append({"mode": mode, "query": f"(server) {what}", "engine": "ticktable",
                            "rows": rows, **_stats(ms)})
            checks[f"{mode}: snapshots taken anew"] = f"{len(fresh)} of {len(snaps)}"
    finally:
        stmt.close()
        cur.close()
        con.close()
        duck.close()
    return out, checks


def profile_queries(server: ServerProcess, rows: int, change: int, repeat: int) -> dict[str, str]:
    """pyinstrument excerpts of the server's SQL work per query kind, the writer on."""
    server.call("write", change)
    rng = np.random.default_rng(5)
    out = {}
    out["group-by (live)"] = server.call("profile", [GROUP_BY], repeat, 45)
    out["point (live)"] = server.call("profile", [POINT.format(id=int(rng.integers(0, rows)))], repeat, 45)
    server.call("write", 0)
    time.sleep(0.3)
    out["group-by (static)"] = server.call("profile", [GROUP_BY], repeat, 30)
    return out


# ---------------------------------------------------------------------------- 2. cycles
def _cycle_row(phase: str, log: dict[str, list[Any]], seconds: float, queries: int,
               interval: float) -> dict[str, Any]:
    cyc, run = _stats(log["cycle_ms"]), _stats(log["run_cycle_ms"])
    gaps = np.diff(np.asarray(log["cycle_end"])) * 1e3
    fresh = [ms for ms, changed in log["snapshot"] if changed]
    return {"phase": phase, "seconds": seconds, "cycles": cyc["n"],
            "cycle_p50_ms": cyc["p50_ms"], "cycle_mean_ms": cyc["mean_ms"], "cycle_p99_ms": cyc["p99_ms"],
            "cycle_max_ms": cyc["max_ms"],
            "run_cycle_p50_ms": run["p50_ms"], "run_cycle_p99_ms": run["p99_ms"], "run_cycle_max_ms": run["max_ms"],
            "gap_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else None,
            "gap_max_ms": float(gaps.max()) if gaps.size else None,
            "late_gaps": int((gaps > interval * 1e3 * 1.5).sum()),
            "queries": queries, "new_snapshots": len(fresh),
            "snapshot_p50_ms": _stats(fresh)["p50_ms"]}


def bench_cycles(server: ServerProcess, change: int, seconds: float, interval: float) -> list[dict[str, Any]]:
    server.call("write", change)
    time.sleep(0.5)
    server.call("mark")
    time.sleep(seconds)
    rows = [_cycle_row("writer only", server.call("log"), seconds, 0, interval)]

    stop = threading.Event()
    done = [0]

    def client() -> None:
        import adbc_driver_manager as dm

        con = _adbc(server.location)
        stmt = dm.AdbcStatement(con.adbc_connection)
        stmt.set_sql_query(GROUP_BY)
        try:
            while not stop.is_set():
                handle, _ = stmt.execute_query()  # GetFlightInfo + DoGet, as in section 1
                pa.RecordBatchReader._import_from_c(handle.address).read_all()
                done[0] += 1
        finally:
            stmt.close()
            con.close()

    th = threading.Thread(target=client, daemon=True)
    th.start()
    time.sleep(0.5)
    server.call("mark")
    n0 = done[0]
    time.sleep(seconds)
    log = server.call("log")
    n = done[0] - n0
    stop.set()
    th.join(60)
    rows.append(_cycle_row("writer + group-by queries", log, seconds, n, interval))
    server.call("write", 0)
    return rows


# ---------------------------------------------------------------------------- 3. views
VIEWS = {
    "filter + group-by": (
        "SELECT g, sum(x) AS s, count(*) AS n FROM t WHERE y > 0.5 GROUP BY g",
        lambda t, d, tt: t.where(pc.field("y") > 0.5).agg_by([tt.agg.sum("x", "s"), tt.agg.count("n")], by="g"),
    ),
    "join": (
        "SELECT t.id, t.x, d.label FROM t JOIN d ON t.g = d.g",
        lambda t, d, tt: t.join(d, "g", ["label"]).view("id", "x", "label"),
    ),
}
_DIM = pa.schema([("g", pa.int64()), ("label", pa.string())])


def _view_graph(base: list[pa.Table], dim: pa.Table) -> tuple[Any, Any, Any]:
    from engine.graph import UpdateGraph

    graph = UpdateGraph()
    t = graph.keyed_table(SQL_SCHEMA, ["id"], name="t")
    d = graph.keyed_table(_DIM, ["g"], name="d")
    for chunk in base:
        t.upsert(chunk)
    d.upsert(dim)
    graph.run_cycle()
    return graph, t, d


def _canonical(table: pa.Table) -> pa.Table:
    cols = table.column_names
    return table.sort_by([(c, "ascending") for c in cols]).cast(
        pa.schema([pa.field(c, pa.float64() if pa.types.is_integer(table.schema.field(c).type)
                            else table.schema.field(c).type) for c in cols]))


def bench_views(rows: int, change: int, cycles: int, warmup: int) -> list[dict[str, Any]]:
    import ticktable as tt
    from flight.sql.views import compile_view

    base = list(table_chunks(rows, seed=3))
    dim = pa.table({"g": np.arange(GROUPS, dtype=np.int64),
                    "label": [f"group{i:04d}" for i in range(GROUPS)]}, schema=_DIM)
    out = []
    for name, (sql, build) in VIEWS.items():
        graphs = {}
        for label in ("sql view", "python api", "source only"):
            graph, t, d = _view_graph(base, dim)
            if label == "sql view":
                result = compile_view(sql, {"t": t, "d": d}.__getitem__, name="v").table
            elif label == "python api":
                result = build(t, d, tt)
            else:
                result = None
            graph.run_cycle()
            graphs[label] = (graph, t, result)
        rng = np.random.default_rng(9)
        next_id = rows
        times: dict[str, list[float]] = {k: [] for k in graphs}
        for i in range(warmup + cycles):
            upd = rng.choice(next_id, change - change // 2, replace=False)
            chunk = sql_rows(rng, next_id, change // 2)
            both = pa.concat_tables([sql_rows(rng, 0, upd.size).set_column(0, "id", pa.array(upd)), chunk])
            next_id += change // 2
            labels = list(graphs)
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:  # turns rotate
                graph, t, _ = graphs[label]
                t.upsert(both)
                t0 = time.perf_counter_ns()
                graph.run_cycle()
                if i >= warmup:
                    times[label].append((time.perf_counter_ns() - t0) / 1e6)
        same = _canonical(graphs["sql view"][2].to_arrow()).equals(
            _canonical(graphs["python api"][2].to_arrow().rename_columns(graphs["sql view"][2].column_names)))
        src = _stats(times["source only"])
        py = _stats(times["python api"])
        for label in graphs:
            s = _stats(times[label])
            row = {"pipeline": name, "graph": label, "rows": rows, "change": change, **s,
                   "marginal_p50_ms": None if label == "source only" else s["p50_ms"] - src["p50_ms"],
                   "x_python": _ratio(s["p50_ms"], py["p50_ms"]) if label == "sql view" else None,
                   "x_python_marginal": (_ratio(s["p50_ms"] - src["p50_ms"], py["p50_ms"] - src["p50_ms"])
                                         if label == "sql view" else None),
                   "same_result": same if label == "sql view" else None,
                   "view_rows": len(graphs[label][2].rowset) if graphs[label][2] is not None else None}
            out.append(row)
        for graph, _, _ in graphs.values():
            graph.stop()
        del graphs
    return out


# ---------------------------------------------------------------------------- 4. ingest
def _doput(client: fl.FlightClient, name: str, batches: list[pa.RecordBatch], meta: bytes) -> int:
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(name), SCHEMA)
    for i, b in enumerate(batches):
        if i == 0:
            writer.write_with_metadata(b, pa.py_buffer(meta))
        else:
            writer.write_batch(b)
    writer.done_writing()
    acks = 0
    while reader.read() is not None:
        acks += 1
    writer.close()
    return acks


def bench_ingest(rows: int, batch_rows: int, repeat: int, interval: float, priority: str) -> list[dict[str, Any]]:
    from flight.pb import flight_pb2 as pb

    rng = np.random.default_rng(3)
    data = batch(rng, np.arange(rows))
    batches = [b for s in range(0, rows, batch_rows) for b in data.slice(s, batch_rows).to_batches()]
    table = pa.Table.from_batches(batches, SCHEMA)
    meta = pb.PutRequest(mode=pb.PUT_MODE_APPEND).SerializeToString()
    schema_bytes = SCHEMA.serialize().to_pybytes()
    server = ServerProcess()
    runs: dict[str, list[tuple[float, float]]] = {"adbc_ingest": [], "doput": []}
    cpu: dict[str, list[tuple[float, float]]] = {}  # (client, server) CPU seconds per ingest
    try:
        server.call("start", interval, priority)
        con = _adbc(server.location)
        cur = con.cursor()
        client = fl.FlightClient(server.location)
        for r in range(repeat + 1):  # the first round warms both paths up and is dropped
            for how in (("adbc_ingest", "doput") if r % 2 == 0 else ("doput", "adbc_ingest")):
                name = f"ing_{how}_{r}"
                server.call("create", name, schema_bytes)
                c0, s0 = time.process_time(), server.cpu_seconds()
                t0 = time.perf_counter()
                if how == "adbc_ingest":
                    cur.adbc_ingest(name, table, mode="append")
                else:
                    acks = _doput(client, name, batches, meta)
                    assert acks == len(batches), f"{acks} acks for {len(batches)} batches"
                t1 = time.perf_counter()
                client_cpu = time.process_time() - c0  # ADBC's Go driver runs in this process
                applied = server.call("wait", name, rows, 120.0)
                assert applied is not None, f"{rows:,} rows not applied in 120 s"
                server_cpu = server.cpu_seconds() - s0  # up to the rows applied
                server.call("drop", name)
                if r:
                    runs[how].append((t1 - t0, applied - t0))
                    cpu.setdefault(how, []).append((client_cpu, server_cpu))
        cur.close()
        con.close()
        client.close()
    finally:
        server.close()
    reference = ServerProcess(serve_reference)  # the clients alone: a server that only counts
    try:
        con = _adbc(reference.location)
        cur = con.cursor()
        client = fl.FlightClient(reference.location)
        for r in range(repeat + 1):
            for how in (("adbc_ingest", "doput") if r % 2 == 0 else ("doput", "adbc_ingest")):
                c0, s0 = time.process_time(), reference.cpu_seconds()
                t0 = time.perf_counter()
                if how == "adbc_ingest":
                    cur.adbc_ingest(f"ref_{r}", table, mode="append")
                else:
                    _doput(client, f"ref_{r}", batches, meta)
                if r:
                    runs.setdefault(f"{how} (reference)", []).append((time.perf_counter() - t0, np.nan))
                    cpu.setdefault(f"{how} (reference)", []).append(
                        (time.process_time() - c0, reference.cpu_seconds() - s0))
        cur.close()
        con.close()
        client.close()
    finally:
        reference.close()
    out = []
    med = {k: (float(np.median([a for a, _ in v])), float(np.median([b for _, b in v]))) for k, v in runs.items()}
    for how, (acked, applied) in med.items():
        doput = med["doput (reference)" if "reference" in how else "doput"]
        adbc = how.startswith("adbc_ingest")
        out.append({"path": how, "rows": rows, "batch_rows": batch_rows, "repeats": repeat,
                    "acked_rows_per_s": rows / acked,
                    "applied_rows_per_s": rows / applied if applied == applied else None,
                    "acked_s_rounds": " ".join(f"{a:.2f}" for a, _ in runs[how]),
                    "client_cpu_ms": 1e3 * float(np.median([c for c, _ in cpu[how]])),
                    "server_cpu_ms": 1e3 * float(np.median([c for _, c in cpu[how]])),
                    "x_doput_acked": _ratio(doput[0], acked) if adbc else None,
                    "x_doput_applied": _ratio(doput[1], applied) if adbc and applied == applied else None})
    return out


# ---------------------------------------------------------------------------- 5. executemany
def bench_executemany(sizes: list[int], repeat: int, interval: float, priority: str) -> list[dict[str, Any]]:
    """DB-API ``executemany`` through ADBC (one DoPut of every parameter row, then the
    statement): INSERT into an append and a keyed table, UPDATE and DELETE of the keyed
    one's rows by key, against ``adbc_ingest`` of the same rows (the bulk path)."""
    server = ServerProcess()
    times: dict[tuple[str, int], list[float]] = {}
    try:
        server.call("start", interval, priority)
        con = _adbc(server.location)
        cur = con.cursor()
        base = 0
        for r in range(repeat + 1):  # the first round warms up and is dropped
            for n in sizes:
                a, k, g = f"em_a_{r}_{n}", f"em_k_{r}_{n}", f"em_g_{r}_{n}"
                cur.execute(f"CREATE TABLE {a} (id BIGINT, sym VARCHAR, px DOUBLE)")
                cur.execute(f"CREATE TABLE {k} (id BIGINT PRIMARY KEY, sym VARCHAR, px DOUBLE)")
                rows = [(base + i, f"s{i % 7}", i * 0.5) for i in range(n)]
                table = pa.table({"id": pa.array([x[0] for x in rows], pa.int64()),
                                  "sym": [x[1] for x in rows], "px": [x[2] for x in rows]})
                steps: list[tuple[str, Any, tuple[Any, ...]]] = [
                    ("INSERT, append table", cur.executemany, (f"INSERT INTO {a} VALUES (?, ?, ?)", rows)),
                    ("INSERT, keyed table", cur.executemany, (f"INSERT INTO {k} VALUES (?, ?, ?)", rows)),
                    ("UPDATE by key", cur.executemany, (f"UPDATE {k} SET px = px + ? WHERE id = ?",
                                                       [(1.0, x[0]) for x in rows])),
                    ("DELETE by key", cur.executemany, (f"DELETE FROM {k} WHERE id = ?",
                                                       [(x[0],) for x in rows])),
                    ("adbc_ingest (bulk)", cur.adbc_ingest, (g, table, "create"))]
                for what, call, call_args in steps:
                    t0 = time.perf_counter()
                    call(*call_args)
                    if r:
                        times.setdefault((what, n), []).append(time.perf_counter() - t0)
                base += n
        cur.close()
        con.close()
    finally:
        server.close()
    out = []
    for (what, n), ts in times.items():
        ingest = float(np.median(times[("adbc_ingest (bulk)", n)]))
        med = float(np.median(ts))
        out.append({"statement": what, "rows": n, "p50_ms": 1e3 * med, "mean_ms": 1e3 * float(np.mean(ts)),
                    "max_ms": 1e3 * max(ts), "rows_per_s": n / med, "x_ingest": ingest / med})
    return out


# ---------------------------------------------------------------------------- main
def _verdict(v: float | None, ok: bool) -> str:
    return "n/a" if v is None else ("PASS" if ok else "MISS")


def _summary(queries: list[dict[str, Any]], cycles: list[dict[str, Any]], views: list[dict[str, Any]],
             ingest: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for r in queries:
        if r.get("x_duckdb") is not None:
            x = r["x_duckdb"]
            out.append({"benchmark": f"{r['query']}, {r['rows']:,} rows, {r['mode']}, {r['engine']}",
                        "measured": f"p50 {r['p50_ms']:.1f} ms vs DuckDB's {r['p50_ms'] * x:.1f} ms: {x:.2f}x",
                        "goal": "DuckDB/Ticktable >= 0.8x", "verdict": _verdict(x, x >= 0.8)})
    if len(cycles) == 2:
        a, b = cycles
        out.append({"benchmark": "cycle p99, writer only -> with group-by queries",
                    "measured": f"{a['cycle_p99_ms']:.1f} -> {b['cycle_p99_ms']:.1f} ms "
                                f"(run_cycle incl. lock wait {a['run_cycle_p99_ms']:.1f} -> "
                                f"{b['run_cycle_p99_ms']:.1f} ms)",
                    "goal": "(report)", "verdict": ""})
    for r in views:
        if r["graph"] == "sql view":
            x = r["x_python"]
            out.append({"benchmark": f"view {r['pipeline']}, {r['change']:,} rows/cycle into {r['rows']:,}",
                        "measured": f"cycle p50 {r['p50_ms']:.2f} ms: {x:.2f}x Python "
                                    f"(marginal {_fmt(r['x_python_marginal'])}x)",
                        "goal": "<= 1.1x", "verdict": _verdict(x, x is not None and x <= 1.1)})
    for r in ingest:
        if r["path"] == "adbc_ingest (reference)":
            out.append({"benchmark": "  the clients alone (a pyarrow server that only counts rows)",
                        "measured": f"ADBC {r['acked_rows_per_s'] / 1e6:.2f}M rows/s: "
                                    f"{r['x_doput_acked']:.2f}x pyarrow DoPut",
                        "goal": "(reference)", "verdict": ""})
        if r["path"] == "adbc_ingest":
            x = r["x_doput_acked"]
            out.append({"benchmark": f"ADBC ingest {r['rows']:,} rows vs DoPut",
                        "measured": f"{r['acked_rows_per_s'] / 1e6:.2f}M rows/s acked: {x:.2f}x "
                                    f"(applied {_fmt(r['x_doput_applied'])}x)",
                        "goal": ">= 0.8x", "verdict": _verdict(x, x is not None and x >= 0.8)})
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the live table")
    ap.add_argument("--change", type=int, default=100, help="rows the writer appends per cycle")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between cycles (ticktable serve's)")
    ap.add_argument("--cycle-priority", choices=("realtime", "normal"), default="realtime",
                    help="the cycle thread's priority, as ticktable serve --cycle-priority")
    ap.add_argument("--repeat", type=int, default=30, help="queries of each kind per engine and mode")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--duckdb-threads", type=int, default=1,
                    help="threads of the in-process DuckDB (the server's runs 1)")
    ap.add_argument("--cycle-seconds", type=float, default=20.0, help="length of each cycle-time phase")
    ap.add_argument("--view-rows", type=int, default=1_000_000)
    ap.add_argument("--view-change", type=int, default=1_000)
    ap.add_argument("--view-cycles", type=int, default=200)
    ap.add_argument("--ingest-rows", type=int, default=4_000_000)
    ap.add_argument("--ingest-batch-rows", type=int, default=65_536)
    ap.add_argument("--ingest-repeat", type=int, default=5)
    ap.add_argument("--profile-repeat", type=int, default=5, help="queries per profile (0: none)")
    ap.add_argument("--sections", nargs="+",
                    choices=("queries", "cycles", "views", "ingest", "executemany"),
                    default=["queries", "cycles", "views", "ingest", "executemany"])
    ap.add_argument("--executemany-rows", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--json", default=None, help="output path (default bench/results/bench_sql.json)")
    if ap.parse_args().quick:  # smaller defaults; a size given on the command line still wins
        ap.set_defaults(rows=1_000_000, repeat=10, cycle_seconds=5.0, view_rows=200_000, view_cycles=50,
                        ingest_rows=1_000_000, ingest_repeat=2, profile_repeat=2)
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, nproc {os.cpu_count()}; "
          f"server in a spawned process, clients and DuckDB in this one")
    t_all = time.perf_counter()
    queries: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    cycles: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    got_priority = None
    if {"queries", "cycles"} & set(args.sections):
        server = ServerProcess()
        try:
            t = time.perf_counter()
            server.call("load", "t", args.rows)
            server.call("load", "k", args.rows, "keyed")
            local = pa.concat_tables(table_chunks(args.rows)).combine_chunks()
            got_priority = server.call("start", args.interval, args.cycle_priority)
            print(f"loaded {args.rows:,} rows in {time.perf_counter() - t:.1f} s; cycles every "
                  f"{args.interval:g} s ({got_priority}); writer: {args.change} rows per cycle when live")
            if "queries" in args.sections:
                queries, checks = bench_queries(server, local, args.rows, args.change, args.repeat,
                                                args.warmup, args.duckdb_threads)
                if args.profile_repeat:
                    profiles = profile_queries(server, args.rows, args.change, args.profile_repeat)
            del local
            if "cycles" in args.sections:
                cycles = bench_cycles(server, args.change, args.cycle_seconds, args.interval)
        finally:
            server.close()
    print_table(f"1. query latency end to end (ms), ADBC -> Ticktable vs DuckDB in-process "
                f"({args.duckdb_threads} thread(s)); x_duckdb = DuckDB p50 / Ticktable p50", queries,
                ["mode", "query", "engine", "rows", "p50_ms", "mean_ms", "p99_ms", "max_ms", "n", "x_duckdb"])
    if checks:
        print("   checks: " + ", ".join(f"{k}: {v}" for k, v in checks.items()))
    print_table(f"2. cycle time (ms), {args.change} rows appended per {args.interval:g} s cycle; run_cycle "
                "counts waiting for the graph's lock; gap = between cycle ends", cycles,
                ["phase", "seconds", "cycles", "cycle_p50_ms", "cycle_mean_ms", "cycle_p99_ms", "cycle_max_ms",
                 "run_cycle_p50_ms", "run_cycle_p99_ms", "run_cycle_max_ms", "gap_p99_ms", "gap_max_ms",
                 "late_gaps", "queries", "new_snapshots", "snapshot_p50_ms"])

    views: list[dict[str, Any]] = []
    if "views" in args.sections:
        views = bench_views(args.view_rows, args.view_change, args.view_cycles, 10)
    print_table("3. live view cycle (ms per graph.run_cycle), SQL view vs the Python API; marginal = "
                "minus the source-only graph", views,
                ["pipeline", "graph", "rows", "change", "p50_ms", "mean_ms", "p99_ms", "n", "marginal_p50_ms",
                 "x_python", "x_python_marginal", "same_result", "view_rows"])

    ingest: list[dict[str, Any]] = []
    if "ingest" in args.sections:
        ingest = bench_ingest(args.ingest_rows, args.ingest_batch_rows, args.ingest_repeat,
                              args.interval, args.cycle_priority)
    print_table(f"4. ingest into an append table, graph cycling every {args.interval:g} s "
                f"(median of {args.ingest_repeat}, taking turns)", ingest,
                ["path", "rows", "batch_rows", "acked_rows_per_s", "applied_rows_per_s", "x_doput_acked",
                 "x_doput_applied", "client_cpu_ms", "server_cpu_ms", "acked_s_rounds"])

    many: list[dict[str, Any]] = []
    if "executemany" in args.sections:
        many = bench_executemany(args.executemany_rows, args.ingest_repeat, args.interval,
                                 args.cycle_priority)
    print_table(f"5. DB-API executemany through ADBC (median of {args.ingest_repeat}); x_ingest = "
                "adbc_ingest of the same rows / executemany, by time", many,
                ["statement", "rows", "p50_ms", "mean_ms", "max_ms", "rows_per_s", "x_ingest"])

    for title, text in profiles.items():
        print(f"\n== profile: server SQL service, {title}, {args.profile_repeat} queries (pyinstrument)")
        print(text)
    summary = _summary(queries, cycles, views, ingest)
    print_table("summary", summary, ["benchmark", "measured", "goal", "verdict"])
    load_end = os.getloadavg()
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    write_json("bench_sql_quick" if args.quick else "bench_sql", {
        "args": vars(args), "cycle_priority": got_priority, "load_start": load, "load_end": load_end,
        "queries": queries, "checks": checks, "cycles": cycles, "views": views, "ingest": ingest,
        "executemany": many, "profiles": profiles, "summary": summary}, args.json)


if __name__ == "__main__":
    main()
