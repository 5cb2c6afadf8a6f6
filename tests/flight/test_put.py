"""DoPut over real Flight: acknowledgements, staged transactions, replayed batch ids."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as fl

from flight.pb import flight_pb2 as pb

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def put(client, table, batches, request: pb.PutRequest | None, close=True):
    w, r = client.do_put(fl.FlightDescriptor.for_path(table), KV)
    acks = []
    for i, b in enumerate(batches):
        if i == 0 and request is not None:
            w.write_with_metadata(b, pa.py_buffer(request.SerializeToString()))
        else:
            w.write_batch(b)
        buf = r.read()
        a = pb.PutAck()
        a.ParseFromString(buf.to_pybytes())
        acks.append(a)
    if close:
        w.close()
    return w, acks


def batch(keys, v=1.0):
    return pa.record_batch({"k": pa.array(keys, pa.int64()), "v": [v] * len(keys)}, schema=KV)


def commit(client, **kw) -> pb.CommitResult:
    res = next(iter(client.do_action(fl.Action("commit", pb.CommitRequest(**kw).SerializeToString()))))
    out = pb.CommitResult()
    out.ParseFromString(res.body.to_pybytes())
    return out


def test_plain_put_acknowledges_every_batch(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    _, acks = put(client, "t", [batch([1, 2]), batch([2, 3], 5.0)], None)
    assert [(a.batch_index, a.rows, a.total_rows, a.staged) for a in acks] == [
        (0, 2, 2, False), (1, 2, 4, False)]
    graph.run_cycle()
    assert t.to_arrow().to_pydict() == {"k": [1, 2, 3], "v": [1.0, 5.0, 5.0]}


def test_writer_killed_mid_transaction_leaves_nothing(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    req = pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="job1", partition=0, attempt=0)
    w, acks = put(client, "t", [batch([1, 2]), batch([3])], req, close=False)
    assert all(a.staged for a in acks)
    w.close()  # the writer goes away; nobody commits
    graph.run_cycle()
    assert t.size == 0
    res = next(iter(client.do_action(fl.Action(
        "abort", pb.AbortRequest(write_id="job1").SerializeToString()))), None)
    assert res is None
    graph.run_cycle()
    assert t.size == 0


def test_commit_publishes_chosen_attempts_once(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    put(client, "t", [batch([1, 2])],
        pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="w", partition=0, attempt=0))
    put(client, "t", [batch([3, 4])],  # a failed first attempt of partition 1
        pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="w", partition=1, attempt=0))
    put(client, "t", [batch([5])],
        pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="w", partition=1, attempt=1))
    res = commit(client, write_id="w", slots=[pb.StageSlot(partition=0, attempt=0),
                                              pb.StageSlot(partition=1, attempt=1)])
    assert res.applied and res.rows == 3
    step = graph.run_cycle()
    assert t.to_arrow().column("k").to_pylist() == [1, 2, 5]
    assert t.last_step == step  # one cycle made the whole job visible


def test_replayed_stream_batch_is_applied_once(server, client, graph):
    t = server.registry.create_source("a", KV, "append").table
    for attempt in range(2):  # the same micro-batch 7, replayed after a restart
        put(client, "a", [batch([1, 2])],
            pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=f"q-7-{attempt}"))
        res = commit(client, write_id=f"q-7-{attempt}", all_slots=True, stream_id="q",
                     batch_id=7, has_batch=True)
        assert res.applied == (attempt == 0)
        graph.run_cycle()
    assert t.size == 2
