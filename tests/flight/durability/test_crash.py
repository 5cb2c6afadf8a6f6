"""Crash tests: a real server subprocess killed with SIGKILL, and the durability bugs it found.

``test_sigkill_at_five_moments_keeps_every_promise`` runs the harness of ``bench/crash.py``
(five kill points, one seed): writers appending, upserting and deleting, staging two-table
transactions that commit, abort or are abandoned, and committing stream batches; the server
killed right after a checkpoint starts, right after a commit was sent, or after a random
delay; restarted on the same data dir; everything acknowledged checked against the
client's model. ``bench/crash.py --kill-points 50`` is the long run.

The tests after it pin bugs the crash runs found, in one process (a "crash" closes the
journal without the shutdown checkpoint, as tests/flight/durability/test_durable.py does).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from bench.crash import run
from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer

T = pa.schema([("k", pa.int64())])


def test_sigkill_at_five_moments_keeps_every_promise(tmp_path):
    rep = run(5, seed=16, data_dir=tmp_path / "data", watchdog=240.0)
    summary = f"{rep.figures()}\nrounds: {rep.rounds}\nfailures: {rep.failures}"
    assert rep.checked > 0 and len(rep.restart_seconds) == 7, summary
    assert rep.lost == 0, summary
    assert rep.duplicated == 0, summary
    assert rep.uncommitted_visible == 0, summary
    assert rep.torn == 0, summary
    assert rep.derived_mismatches == 0, summary
    assert rep.subscriber_mismatches == 0, summary
    assert rep.writer_errors == 0, summary
    # the interesting moments were really hit, not only quiet ones
    assert rep.mid_checkpoint_kills + rep.mid_commit_kills >= 1, summary


# ------------------------------------------------------------------ bugs the crash runs found
class Node:
    """An in-process durable server over ``data_dir``; ``crash()`` skips the checkpoint."""

    def __init__(self, data_dir: Path) -> None:
        self.graph = UpdateGraph()
        self.server = TicktableServer(self.graph, ServerConfig(
            data_dir=data_dir, checkpoint_seconds=3600)).start()
        self.graph.start(0.02)

    def rows(self, name: str) -> list[int]:
        return sorted(self.server.registry.get(name).table.to_arrow().column("k").to_pylist())

    def hold(self, write_id: str, keys: list[int]) -> None:
        self.server.puts.put("t", pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=write_id),
                             pa.table({"k": keys}, schema=T).to_batches(), lambda ack: None)

    def commit(self, request: pb.CommitRequest) -> pb.CommitResult:
        out = pb.CommitResult()
        raw = self.server.action("commit", request.SerializeToString())
        assert raw is not None
        out.ParseFromString(raw)
        return out

    def stop(self, *, crash: bool = False) -> None:
        if crash:
            self.server.durability.close(checkpoint=False)
        self.server.shutdown()
        self.graph.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[list[Node]]:
    nodes: list[Node] = []
    yield nodes
    for n in nodes:
        if n.server._grpc is not None:
            n.stop()


def _start(nodes: list[Node], data_dir: Path) -> Node:
    nodes.append(Node(data_dir))
    return nodes[-1]


def test_a_write_dropped_at_a_restart_stays_dropped_after_the_next_crash(node, tmp_path):
    # a Spark driver commits after the server came back: the write is gone, the commit is
    # empty; replaying the journal after a second crash must not bring the write back
    data = tmp_path / "data"
    a = _start(node, data)
    a.server.durability.create_table("t", T, "append", keys=[], capacity=0,
                                     if_not_exists=False)
    a.hold("w", [1, 2])
    a.stop(crash=True)
    b = _start(node, data)
    assert b.server.recovery is not None and b.server.recovery.dropped_writes == 1
    late = b.commit(pb.CommitRequest(write_id="w", all_slots=True))
    assert late.rows == 0 and b.rows("t") == []
    b.stop(crash=True)
    c = _start(node, data)
    assert c.rows("t") == []


def test_an_expired_write_stays_expired_after_a_crash(node, tmp_path):
    data = tmp_path / "data"
    a = _start(node, data)
    a.server.durability.create_table("t", T, "append", keys=[], capacity=0,
                                     if_not_exists=False)
    a.hold("w", [1, 2])
    assert a.server.staging.expire(now=1e12) == 1  # past stage_ttl
    with pytest.raises(Exception, match="no slot"):
        a.commit(pb.CommitRequest(write_id="w", slots=[pb.StageSlot()]))
    a.stop(crash=True)
    b = _start(node, data)
    assert b.rows("t") == []


def test_a_forgotten_aborted_write_id_can_be_used_again_after_a_crash(node, tmp_path):
    # abort, stage_ttl passes (the id is forgotten), the id is written and committed again:
    # the replay must forget it at the same point, or it refuses the acknowledged commit
    data = tmp_path / "data"
    a = _start(node, data)
    a.server.durability.create_table("t", T, "append", keys=[], capacity=0,
                                     if_not_exists=False)
    a.hold("w", [1])
    a.server.action("abort", pb.AbortRequest(write_id="w").SerializeToString())
    a.server.staging.expire(now=1e12)
    a.hold("w", [7, 8])
    assert a.commit(pb.CommitRequest(write_id="w", all_slots=True)).rows == 2
    assert a.rows("t") == [7, 8]
    a.stop(crash=True)
    b = _start(node, data)
    assert b.rows("t") == [7, 8]


def test_a_checkpoint_at_the_same_position_never_removes_the_current_one(node, tmp_path,
                                                                        monkeypatch):
    # two clean restarts without a write: the shutdown checkpoints share a journal position;
    # a crash while the second is published must leave the first one readable
    data = tmp_path / "data"
    a = _start(node, data)
    a.server.durability.create_table("t", T, "append", keys=[], capacity=0,
                                     if_not_exists=False)
    a.hold("w", [5])
    a.commit(pb.CommitRequest(write_id="w", all_slots=True))
    a.stop()
    b = _start(node, data)
    b.stop()
    c = _start(node, data)
    ckdir = data / "checkpoints"
    current = (ckdir / "CURRENT").read_text()
    real = os.replace

    def power_cut(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if str(src).endswith(".partial"):  # publishing the new checkpoint
            raise KeyboardInterrupt("power cut")
        real(src, dst)

    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(KeyboardInterrupt):
        c.server.durability.checkpoint()
    monkeypatch.undo()
    assert (ckdir / "CURRENT").read_text() == current and (ckdir / current).is_dir()
    c.stop(crash=True)
    d = _start(node, data)
    assert d.rows("t") == [5]


def test_sigkill_during_large_do_put_batches_loses_nothing_acknowledged(tmp_path):
    # 65,536-row batches (journaled as their received IPC messages, their bodies written
    # with O_DIRECT from the received bytes): a server killed mid-stream restarts with a
    # prefix of whole batches holding at least every acknowledged row
    import threading

    import numpy as np
    import pyarrow.flight as fl

    from bench.bench_durable import _Server

    n, rows = 65_536, 24
    batches = [pa.record_batch([pa.array(np.arange(i * n, (i + 1) * n)),
                                pa.array([f"s{k % 89}" for k in range(n)]),
                                pa.array(np.full(n, 0.5))], names=["k", "s", "v"])
               for i in range(rows)]
    schema = batches[0].schema
    data = tmp_path / "data"
    server = _Server(data)
    create = pb.CreateTableRequest(name="t", schema=schema.serialize().to_pybytes(),
                                   kind=pb.TABLE_KIND_APPEND)
    list(server.client.do_action(fl.Action("create_table", create.SerializeToString())))
    acked: list[int] = []
    enough = threading.Event()

    def put() -> None:
        try:
            writer, reader = server.client.do_put(fl.FlightDescriptor.for_path("t"), schema)
            for b in batches:
                writer.write_batch(b)
            writer.done_writing()
            while (ack := reader.read()) is not None:
                a = pb.PutAck()
                a.ParseFromString(ack.to_pybytes())
                acked.append(a.total_rows)
                if len(acked) >= 6:
                    enough.set()
        except Exception:  # noqa: BLE001 - the server was killed under it
            pass
        finally:
            enough.set()

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    assert enough.wait(120)
    server.proc.kill()  # SIGKILL, mid-stream
    server.proc.join()
    thread.join(60)
    assert acked and acked[-1] < rows * n, "the kill came after the stream ended"
    server.client.close()
    again = _Server(data)
    try:
        got = again.call("size", "t")
        keys = None
        if got:
            import ticktable as tt

            with tt.connect(again.location) as c:
                keys = c.snapshot("t")["k"].to_numpy()
    finally:
        again.stop()
    assert got >= acked[-1] and got % n == 0, (got, acked[-1])
    assert keys is not None and np.array_equal(keys, np.arange(got))
