"""Durable tables in one process: restart restores rows, order, row keys and promises.

A real server on 127.0.0.1 with a real data dir (real fsyncs). A "crash" here closes the
journal without the shutdown checkpoint; killing a real server is tests/flight/durability/test_crash.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ticktable as tt
from engine.errors import CheckpointError
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.registry import is_pending, pending_name
from flight.wire import TableKind

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


class Node:
    """A server over a data dir, with a client; ``stop(crash=True)`` skips the checkpoint."""

    def __init__(self, data_dir: Path, **config: object) -> None:
        self.graph = UpdateGraph(validate=True)
        cfg = ServerConfig(data_dir=data_dir, checkpoint_seconds=3600, **config)  # type: ignore[arg-type]
        self.server = TicktableServer(self.graph, cfg).start()
        self.graph.start(0.02)
        self.client = tt.connect(self.server.location)
        self.client.__enter__()

    def table(self, name: str) -> object:
        return self.server.registry.get(name).table

    def state(self, name: str) -> tuple[list[int], list[dict[str, object]]]:
        """Row keys and rows, read consistently."""
        t = self.server.registry.get(name).table
        with self.graph.shared_lock():
            return t.rowset.keys().tolist(), t.to_arrow().to_pylist()

    def stop(self, *, crash: bool = False) -> None:
        self.client.close()
        if crash:
            self.server.durability.close(checkpoint=False)
        self.server.shutdown()
        self.graph.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def nodes(data_dir: Path) -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for n in started:
        if n.server._grpc is not None:
            n.stop()


def start(nodes: list[Node], data_dir: Path, **config: object) -> Node:
    n = Node(data_dir, **config)
    nodes.append(n)
    return n


def _write_everything(n: Node, rng: np.random.Generator) -> None:
    c = n.client
    c.create_table("kv", KV, "keyed", keys=["k"])
    c.create_table("log", KV, "append")
    c.create_table("ring", KV, "ring", capacity=7)
    for i in range(6):  # upserts and deletes: freed row keys get reused, order is row-key order
        keys = rng.choice(40, 15, replace=False)
        c.push("kv", pd.DataFrame({"k": keys, "s": [f"s{x}" for x in keys],
                                   "v": rng.normal(size=15)}), mode="upsert")
        c.push("kv", pd.DataFrame({"k": rng.choice(40, 5, replace=False)}), mode="delete")
        c.push("log", pd.DataFrame({"k": [i] * 3, "s": ["a", None, "c"], "v": [1.0, 2.0, i]}))
        c.push("ring", pd.DataFrame({"k": [i, i], "s": ["r", "r"], "v": [0.5, 1.5]}))
    c.table("kv").where(pc.field("v") > 0).create("positive")
    c.table("kv").agg_by([tt.agg.sum("v"), tt.agg.count()], by="s").create()


def test_restart_restores_rows_order_row_keys_and_derived_tables(nodes, data_dir):
    rng = np.random.default_rng(7)
    a = start(nodes, data_dir)
    _write_everything(a, rng)
    names = a.client.tables()
    before = {name: a.state(name) for name in names}
    a.stop()  # clean: a checkpoint, then the journal is cut back

    b = start(nodes, data_dir)
    assert b.client.tables() == names
    for name in ("kv", "log", "ring"):  # sources: same rows, same order, same row keys
        assert b.state(name) == before[name], name
    kv = pd.DataFrame(b.state("kv")[1])
    assert b.state("positive")[1] == kv[kv.v > 0].to_dict("records")  # derived: recomputed
    derived = [n for n in names if n.startswith("derived_")]
    assert len(derived) == 1 and b.state(derived[0])[1] == before[derived[0]][1]
    assert b.server.recovery is not None and b.server.recovery.records == 0  # all checkpointed

    # more writes, then a crash (no checkpoint): the journal alone brings them back
    b.client.push("kv", pd.DataFrame({"k": [1000, 1001], "s": ["x", "y"], "v": [3.0, -3.0]}),
                  mode="upsert")
    b.client.push("kv", pd.DataFrame({"k": [1000]}), mode="delete")
    b.client.push("kv", pd.DataFrame({"k": [1002], "s": ["z"], "v": [9.0]}), mode="upsert")
    b.client.push("log", pd.DataFrame({"k": [99], "s": ["late"], "v": [0.0]}))
    b.client.drop_table("ring")
    b.client.table("log").where(pc.field("k") == 99).create("late")
    names = b.client.tables()
    before = {name: b.state(name) for name in names}
    b.stop(crash=True)

    c = start(nodes, data_dir)
    assert c.client.tables() == names
    for name in names:
        assert c.state(name) == before[name], name
    assert c.server.recovery is not None and c.server.recovery.records >= 6


def test_a_data_dir_given_as_text_works_like_a_path(nodes, data_dir):
    # ServerConfig(data_dir="...") as a user writes it: start failed in recovery ("str / str")
    a = start(nodes, str(data_dir))  # type: ignore[arg-type]
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    a.client.push("kv", pd.DataFrame({"k": [1, 2], "s": ["a", "b"], "v": [0.5, 1.5]}), mode="upsert")
    before = a.state("kv")
    a.stop(crash=True)  # the journal alone, then a checkpoint at the clean stop below
    b = start(nodes, str(data_dir))  # type: ignore[arg-type]
    assert b.state("kv") == before and b.server.recovery is not None and b.server.recovery.records
    b.stop()
    c = start(nodes, str(data_dir))  # type: ignore[arg-type]
    assert c.state("kv") == before and c.server.recovery is not None
    assert c.server.recovery.records == 0  # every record in the checkpoint


def test_replay_hands_out_the_same_row_keys_as_the_live_cycles(nodes, data_dir):
    # keys freed in a cycle are reused from the next one: replay must cut cycles alike
    a = start(nodes, data_dir)
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    for i in range(8):
        a.client.push("kv", pd.DataFrame({"k": [10 * i, 10 * i + 1], "s": ["a", "b"],
                                          "v": [1.0, 2.0]}), mode="upsert")
        a.client.push("kv", pd.DataFrame({"k": [10 * i]}), mode="delete")
    before = a.state("kv")
    a.stop(crash=True)
    b = start(nodes, data_dir)
    assert b.state("kv") == before
    assert b.server.recovery is not None and b.server.recovery.cycles >= 2


def test_commits_and_batch_ids_survive_open_writes_do_not(nodes, data_dir):
    a = start(nodes, data_dir)
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    srv = a.server
    batch = pa.table({"k": [1, 2], "s": ["a", "b"], "v": [1.0, 2.0]}, schema=KV)

    def hold(write_id: str, table: pa.Table) -> None:
        srv.puts.put("kv", pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id=write_id),
                     table.to_batches(), lambda ack: None)

    hold("done", batch)
    res = srv.action("commit", pb.CommitRequest(
        write_id="done", slots=[pb.StageSlot()], stream_id="s1", batch_id=5,
        has_batch=True).SerializeToString())
    assert res is not None
    hold("open", pa.table({"k": [3], "s": ["c"], "v": [3.0]}, schema=KV))
    a.stop(crash=True)

    b = start(nodes, data_dir)
    assert sorted(r["k"] for r in b.state("kv")[1]) == [1, 2]  # the open write is not visible
    assert b.server.recovery is not None and b.server.recovery.dropped_writes == 1
    again = pb.CommitResult()
    again.ParseFromString(b.server.action("commit", pb.CommitRequest(
        write_id="done", slots=[pb.StageSlot()]).SerializeToString()))
    assert again.applied is False  # a retried commit of a committed write applies once
    replay = pb.CommitRequest(write_id="replayed", slots=[pb.StageSlot()], stream_id="s1",
                              batch_id=5, has_batch=True)
    b.server.puts.put("kv", pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="replayed"),
                      pa.table({"k": [7], "s": ["x"], "v": [7.0]}, schema=KV).to_batches(),
                      lambda ack: None)
    out = pb.CommitResult()
    out.ParseFromString(b.server.action("commit", replay.SerializeToString()))
    assert out.applied is False  # stream batch 5 was applied before the restart
    with pytest.raises(tt.errors.InputError, match="no slot"):
        b.server.action("commit", pb.CommitRequest(write_id="open",
                                                   slots=[pb.StageSlot()]).SerializeToString())


def test_a_table_filled_but_never_renamed_is_gone_after_a_restart(nodes, data_dir):
    """A pending table (CREATE TABLE ... AS, a replacing ingest) takes its name in one
    journaled step: renamed before the crash, it is the table after the restart; not yet
    renamed (its rows committed, and in a checkpoint or only in the journal), it is
    dropped and the table of that name is as it was. A second restart agrees."""
    a = start(nodes, data_dir)
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    srv = a.server

    def fill(name: str, ks: list[int]) -> str:
        pending = pending_name()
        srv.durability.create_table(pending, KV, TableKind.APPEND, keys=[], capacity=0,
                                    if_not_exists=False, pending_for=name)
        srv.puts.put(pending, pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=pending),
                     pa.table({"k": ks, "s": ["x"] * len(ks), "v": [1.0] * len(ks)},
                              schema=KV).to_batches(), lambda ack: None)
        srv.durability.commit(pb.CommitRequest(write_id=pending, all_slots=True))
        return pending

    srv.durability.rename(fill("kv", [2, 3]), "kv", replace=True)  # kv: 2, 3, append-only
    fill("kv", [9])
    assert srv.durability.checkpoint() is not None  # holds the pending table and its row
    fill("other", [5])
    assert [r["k"] for r in a.state("kv")[1]] == [2, 3]
    assert a.server.registry.names() == ["kv"]
    a.stop(crash=True)
    for _ in range(2):
        b = start(nodes, data_dir)
        assert b.server.registry.names() == ["kv"]
        assert not [e.name for e in b.server.registry.entries_in_order() if is_pending(e.name)]
        assert sorted(r["k"] for r in b.state("kv")[1]) == [2, 3]
        assert b.server.registry.get("kv").kind == TableKind.APPEND
        b.stop(crash=True)


def test_a_replacement_at_the_table_limit_is_made_and_a_new_table_refused_for_good(
        nodes, data_dir):
    """``max_tables`` counts a pending table when it takes its name: a ``CREATE OR REPLACE``
    at the limit is made (both tables exist for a moment), a new table is refused, naming
    it, and a restart under the same or no limit agrees (the rename is journaled with its
    limits, as a creation is)."""
    import adbc_driver_flightsql.dbapi as flightsql
    import adbc_driver_manager

    a = start(nodes, data_dir, max_tables=1)
    with flightsql.connect(a.server.location, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t AS SELECT 1 AS x")
        cur.execute("CREATE OR REPLACE TABLE t AS SELECT 2 AS x")
        with pytest.raises(adbc_driver_manager.Error, match="cannot create table 'u'.*max_tables"):
            cur.execute("CREATE TABLE u AS SELECT 3 AS x")
    assert a.server.registry.names() == ["t"] and len(a.server.registry.entries_in_order()) == 1
    a.stop(crash=True)
    for config in ({"max_tables": 1}, {}):
        b = start(nodes, data_dir, **config)
        assert b.server.registry.names() == ["t"]
        assert b.state("t")[1] == [{"x": 2}]
        b.stop(crash=True)


def test_in_memory_keeps_nothing(nodes, tmp_path):
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig()).start()
    try:
        assert not server.durability.durable and server.recovery is None
        server.durability.create_table("t", KV, "append", keys=[], capacity=0,
                                       if_not_exists=False)
    finally:
        server.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_checkpoint_stops_start_up_naming_the_file(nodes, data_dir):
    a = start(nodes, data_dir)
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    a.client.push("kv", pd.DataFrame({"k": [1], "s": ["a"], "v": [1.0]}), mode="upsert")
    a.stop()
    (ckpt,) = [p for p in (data_dir / "checkpoints").iterdir() if p.is_dir()]
    (part,) = list(ckpt.glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-7] + b"garbage")
    with pytest.raises(CheckpointError, match=str(part)):
        TicktableServer(UpdateGraph(), ServerConfig(data_dir=data_dir)).start()
    part.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        TicktableServer(UpdateGraph(), ServerConfig(data_dir=data_dir)).start()


def test_a_push_whose_staged_rows_a_restart_dropped_fails_instead_of_writing_nothing(
        nodes, data_dir, monkeypatch):
    a = start(nodes, data_dir)
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    real = a.server.durability.commit

    def restarted_in_between(request, **kw):
        a.server.staging.drop_open()  # what recovery does to writes never committed
        return real(request, **kw)

    monkeypatch.setattr(a.server.durability, "commit", restarted_in_between)
    with pytest.raises(pa.ArrowInvalid, match="no slot"):
        a.client.push("kv", pd.DataFrame({"k": [1], "s": ["a"], "v": [1.0]}), mode="upsert")
    monkeypatch.undo()
    summary = a.client.push("kv", pd.DataFrame({"k": [1], "s": ["a"], "v": [1.0]}), mode="upsert")
    assert summary.rows == 1 and a.state("kv")[1] == [{"k": 1, "s": "a", "v": 1.0}]


def test_writes_are_acknowledged_while_a_cycle_runs_and_go_to_the_next_one(tmp_path):
    import threading

    from engine.table import Derivation, derive
    from flight.ingest.parts import Part

    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(data_dir=tmp_path)).start()
    try:
        d = server.durability
        entry = d.create_table("kv", KV, "keyed", keys=["k"], capacity=0, if_not_exists=False)
        inside, release = threading.Event(), threading.Event()

        class Slow:  # a derived table whose listener holds the cycle until told
            def on_update(self, up):
                inside.set()
                assert release.wait(30)
                return up

        derive([entry.table], lambda: Derivation(KV, entry.table.columns, RowSet(), Slow()))
        row = pa.table({"k": [1], "s": ["a"], "v": [1.0]}, schema=KV)
        d.apply(entry, [Part("kv", entry.table.check_batch(row, "upsert"))])
        cycle = threading.Thread(target=graph.run_cycle)
        cycle.start()
        assert inside.wait(30)
        d.apply(entry, [Part("kv", entry.table.check_batch(  # acked now
            row.set_column(2, "v", pa.array([2.0])), "upsert"))])
        release.set()
        cycle.join(30)
        assert entry.table.to_arrow().column("v").to_pylist() == [1.0]  # the cycle took record 1
        graph.run_cycle()
        assert entry.table.to_arrow().column("v").to_pylist() == [2.0]
    finally:
        server.shutdown()


def _do_put(location: str, name: str, batches: list[pa.RecordBatch]) -> int:
    """One DoPut stream through pyarrow's client; the rows acknowledged."""
    import pyarrow.flight as fl

    client = fl.connect(location)
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(name), batches[0].schema)
    for b in batches:
        writer.write_batch(b)
    writer.done_writing()
    acked = 0
    while (ack := reader.read()) is not None:
        put_ack = pb.PutAck()
        put_ack.ParseFromString(ack.to_pybytes())
        acked = put_ack.total_rows
    writer.close()
    client.close()
    return acked


def test_received_batches_are_journaled_as_they_came_and_replay_exactly(
        nodes, data_dir, monkeypatch):
    # a batch the check keeps as it came is journaled as its received IPC message (no
    # serialization); one the check changes (a cast, a delete marker) is serialized as
    # checked; after a crash both replay to the same rows, order and row keys
    import flight.durability.durable as durable_module

    kinds: list[str] = []
    real = durable_module.encode_parts

    def spy(parts):
        metas, payload = real(parts)
        kinds.append(type(payload).__name__)
        return metas, payload

    monkeypatch.setattr(durable_module, "encode_parts", spy)
    a = start(nodes, data_dir)
    a.client.create_table("log", KV, "append")
    a.client.create_table("kv", KV, "keyed", keys=["k"])
    rng = np.random.default_rng(7)

    def rows(start: int, n: int, key: pa.DataType | None = None) -> pa.RecordBatch:
        return pa.record_batch([pa.array(np.arange(start, start + n), key or pa.int64()),
                                pa.array([f"s{i % 97}" for i in range(n)]),
                                pa.array(rng.normal(size=n))], names=["k", "s", "v"])

    assert _do_put(a.server.location, "log", [rows(0, 20_000), rows(20_000, 30_000)]) == 50_000
    assert kinds == ["Framed", "Framed"]
    assert _do_put(a.server.location, "log", [rows(50_000, 20_000, pa.int32())]) == 20_000
    assert kinds[2:] == ["Buffer"]  # cast to the table's int64: serialized as checked
    assert _do_put(a.server.location, "kv", [rows(0, 20_000), rows(10_000, 20_000)]) == 40_000
    marked = rows(25_000, 20_000)
    marked = marked.append_column("__delete", pa.array(np.arange(20_000) % 3 == 0))
    assert _do_put(a.server.location, "kv", [marked]) == 20_000
    unmarked = rows(50_000, 20_000).append_column("__delete", pa.array(np.zeros(20_000, bool)))
    assert _do_put(a.server.location, "kv", [unmarked]) == 20_000  # the marker column dropped
    assert kinds[3:5] == ["Framed", "Framed"] and "Framed" not in kinds[5:]
    assert kinds[-1] == "Buffer"
    a.graph.run_cycle()
    before = a.state("log"), a.state("kv")
    assert len(before[0][1]) == 70_000 and len(before[1][1]) > 0
    a.stop(crash=True)
    b = start(nodes, data_dir)
    assert (b.state("log"), b.state("kv")) == before
