"""DoPut: decode, check, stage or hold, acknowledge (flight/ingest/put.py).

First at the handler level (an Env without a server: every put mode, schema errors, DIFF
semantics, no cycle ever run by a put), then over real Flight on 127.0.0.1 port 0
(acknowledgements, staged transactions, replayed batch ids, DIFF errors on the wire).
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.errors import InputError, InvalidKeyError, SchemaError, TableNotFound
from flight.pb import flight_pb2 as pb
from tests.flight.writes import APPEND, COMPOSITE, DELETE, DIFF, UPSERT, Env, diff, kv, row
from tests.flight.writes import batch as as_batch


@pytest.fixture
def env():
    e = Env()
    yield e
    e.staging.stop()


# --- append and ring ------------------------------------------------------------------------
def test_append_acks_each_batch_and_rows_appear_next_cycle(env):
    env.create("t", "append")
    acks = env.put("t", APPEND, kv([1, 2], ["a", None], [0.5, None]), kv([3], ["c"], [3.0]),
                   kv([], [], []))
    assert [(a.batch_index, a.rows, a.total_rows, a.staged) for a in acks] == [
        (0, 2, 2, False), (1, 1, 3, False), (2, 0, 3, False)]
    assert env.rows("t") == []
    step = env.graph.run_cycle()
    assert env.rows("t") == [row(1, "a", 0.5), row(2, None, None), row(3, "c", 3.0)]
    assert [s for s, _ in env.updates["t"]] == [step]


def test_append_accepts_reordered_and_safely_castable_columns(env):
    env.create("t", "append")
    env.put("t", APPEND, {"v": pa.array([1.5]), "k": pa.array([7], pa.int32()), "s": ["x"]})
    env.graph.run_cycle()
    assert env.rows("t") == [row(7, "x", 1.5)]


def test_ring_keeps_newest(env):
    env.create("r", "ring", capacity=3)
    env.put("r", APPEND, kv([1, 2], ["a", "b"], [1, 2]), kv([3, 4], ["c", "d"], [3, 4]))
    env.graph.run_cycle()
    assert [r["k"] for r in env.rows("r")] == [2, 3, 4]


def test_mode_must_fit_the_table(env):
    env.create("kt")
    env.create("at", "append")
    with pytest.raises(InputError, match=r"keyed by \['k'\].*PUT_MODE_UPSERT"):
        env.put("kt", APPEND, kv([1], ["a"], [1]))
    for mode in (UPSERT, DELETE, DIFF):
        with pytest.raises(InputError, match="write it with PUT_MODE_APPEND"):
            env.put("at", mode, kv([1], ["a"], [1]))
    with pytest.raises(TableNotFound, match="no table 'nope'"):
        env.put("nope", APPEND, kv([1], ["a"], [1]))
    derived = env.registry.get("at").table.where(pa.compute.field("k") > 0)
    env.registry.add("d", derived, "derived", parents=["at"])
    with pytest.raises(InputError, match="not a source table"):
        env.put("d", APPEND, kv([1], ["a"], [1]))


# --- schema errors --------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"k": [1], "s": ["a"]}, r"table 't': missing column\(s\) \['v'\]"),
    ({"k": [1], "s": ["a"], "v": [1.0], "w": [2]}, r"table 't': unknown column\(s\) \['w'\]"),
    ({"k": ["x"], "s": ["a"], "v": [1.0]}, r"table 't': column 'k' has type string, expected int64"),
    ({"k": [1], "s": ["a"], "v": [1.0], "__diff": [1]}, r"unknown column\(s\) \['__diff'\]"),
])
def test_schema_errors_name_table_and_columns_and_apply_nothing_of_the_batch(env, bad, match):
    env.create("t", "append")
    acks = []
    batches = [kv([1], ["ok"], [1.0]), pa.RecordBatch.from_pydict(bad), kv([2], ["never"], [2.0])]
    with pytest.raises(SchemaError, match=match):
        env.puts.put("t", pb.PutRequest(mode=APPEND), iter(batches), acks.append)
    assert len(acks) == 1  # the good batch before the bad one was applied and acknowledged
    env.graph.run_cycle()
    assert env.rows("t") == [row(1, "ok", 1.0)]


def test_keyed_schema_errors(env):
    env.create("t")
    with pytest.raises(SchemaError, match=r"missing column\(s\) \['v'\]"):
        env.put("t", UPSERT, {"k": [1], "s": ["a"]})
    with pytest.raises(SchemaError, match=r"column '__delete' has type int64, expected bool"):
        env.put("t", UPSERT, {"k": [1], "s": ["a"], "v": [1.0], "__delete": [1]})
    with pytest.raises(SchemaError, match=r"unknown column\(s\) \['s'\]"):
        env.put("t", DELETE, {"k": [1], "s": ["a"]})
    with pytest.raises(SchemaError, match=r"needs an int64 weight column '__diff'"):
        env.put("t", DIFF, kv([1], ["a"], [1.0]))
    with pytest.raises(SchemaError, match=r"column '__diff' has type double"):
        env.put("t", DIFF, {"k": [1], "s": ["a"], "v": [1.0], "__diff": [1.0]})
    with pytest.raises(InvalidKeyError, match=r"key column 'k' has 1 null"):
        env.put("t", UPSERT, {"k": pa.array([None, 2], pa.int64()), "s": ["a", "b"], "v": [1.0, 2.0]})
    env.graph.run_cycle()
    assert env.rows("t") == []


# --- upsert and delete ----------------------------------------------------------------------
def test_upsert_and_delete_marker_last_row_per_key_decides(env):
    t = env.create("t")
    env.put("t", UPSERT, kv([1, 2, 3, 4], ["a", "b", "c", "d"], [1, 2, 3, 4]))
    env.graph.run_cycle()
    env.put("t", UPSERT, kv(
        [1, 1, 2, 2, 5, 5, 4, 6, 6],
        ["x", "-", "-", "y", "e1", "e2", "-", "f", "-"],
        [10, 0, 0, 20, 5, 50, 0, 6, 0],
        __delete=[False, True, True, None, False, False, True, False, True]))
    step = env.graph.run_cycle()
    # 1: upsert then delete -> deleted; 2: delete then upsert -> y; 5: last upsert;
    # 4: deleted; 6: inserted then deleted -> absent; 3 untouched
    assert env.keyed("t") == {2: row(2, "y", 20.0), 3: row(3, "c", 3.0), 5: row(5, "e2", 50.0)}
    (s, u), = env.updates["t"][1:]
    assert s == step and t.last_step == step
    assert len(u.removed) == 2 and len(u.modified) == 1 and len(u.added) == 1


def test_upsert_without_marker_is_last_wins_across_batches(env):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2, 1], ["a", "b", "c"], [1, 2, 3]), kv([2], ["z"], [9]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "c", 3.0), 2: row(2, "z", 9.0)}


def test_upsert_delete_marker_with_composite_string_keys(env):
    env.create("c", schema=COMPOSITE, keys=("sym", "n"))
    b = {"sym": ["a", "a", "b", "a"], "n": pa.array([1, 2, 1, 1], pa.int32()),
         "v": [1.0, 2.0, 3.0, 4.0], "__delete": [False, False, False, True]}
    env.put("c", UPSERT, b)
    env.graph.run_cycle()
    assert sorted((r["sym"], r["n"], r["v"]) for r in env.rows("c")) == [("a", 2, 2.0), ("b", 1, 3.0)]


def test_delete_mode_takes_key_columns_and_ignores_absent_keys(env):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2, 3], ["a", "b", "c"], [1, 2, 3]))
    env.graph.run_cycle()
    env.put("t", DELETE, {"k": [2, 9]}, {"k": pa.array([3], pa.int32())})
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "a", 1.0)}


# --- diff -----------------------------------------------------------------------------------
def test_diff_applies_inserts_updates_deletes_and_noops(env):
    t = env.create("t")
    env.put("t", DIFF, diff([1, 2, 3], ["a", "b", "c"], [1, 2, 3], [1, 1, 1]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "a", 1.0), 2: row(2, "b", 2.0), 3: row(3, "c", 3.0)}
    # update 1, delete 2, no-op on 3 (+1/-1 of one row), insert 4 via +1 +1 -1, __time ignored
    env.put("t", DIFF, diff(
        [1, 1, 2, 3, 3, 4, 4, 4],
        ["a", "A", "b", "c", "c", "d", "d", "d"],
        [1, 10, 2, 3, 3, 4, 4, 4],
        [-1, 1, -1, 1, -1, 1, 1, -1],
        time_=[5, 5, 5, 5, 5, 6, 6, 7]))
    step = env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "A", 10.0), 3: row(3, "c", 3.0), 4: row(4, "d", 4.0)}
    (s, u), = env.updates["t"][1:]
    assert s == step and (len(u.added), len(u.removed), len(u.modified)) == (1, 1, 1)
    assert u.modified_columns == frozenset({"s", "v"})
    assert t.pending_rows == 0


@pytest.mark.parametrize("batch, match", [
    (diff([9], ["x"], [9], [-1]), r"diff row .*'k': 9.* retracts a row key \{'k': 9\} does not hold \(it holds None\)"),
    (diff([1, 1], ["zz", "n"], [1, 5], [-1, 1]), r"retracts a row key \{'k': 1\} does not hold \(it holds \{'k': 1, 's': 'a'"),
    (diff([1], ["n"], [5], [1]), r"adds a second row for key \{'k': 1\}.*retract that row"),
    (diff([7, 7], ["p", "q"], [1, 2], [1, 1]), r"key \{'k': 7\} gets 2 \+1 rows"),
    (diff([1, 1], ["a", "a"], [1, 1], [-1, -1]), r"weights must sum to \+1 or -1 per row, got -2"),
    (diff([5], ["e"], [5], [2]), r"got 2 for"),
])
def test_invalid_diff_batches_apply_nothing(env, batch, match):
    env.create("t")
    env.put("t", UPSERT, kv([1, 2], ["a", "b"], [1, 2]))
    env.graph.run_cycle()
    before = env.keyed("t")
    # valid changes of other keys in the same batch are not applied either
    bad = pa.concat_tables([pa.Table.from_batches([batch]), pa.Table.from_batches(
        [diff([2, 2, 3], ["b", "B", "c"], [2, 2, 3], [-1, 1, 1])])]).combine_chunks().to_batches()[0]
    with pytest.raises(InputError, match=match) as exc:
        env.put("t", DIFF, bad)
    assert "nothing of the batch was applied" in str(exc.value)
    assert env.registry.get("t").table.pending_rows == 0
    env.graph.run_cycle()
    assert env.keyed("t") == before


def test_diff_batches_before_a_cycle_compose_with_pending_writes(env):
    env.create("t")
    env.put("t", UPSERT, kv([1], ["a"], [1]))             # pending, not yet applied
    env.put("t", DIFF, diff([1, 1], ["a", "b"], [1, 2], [-1, 1]))   # sees the pending upsert
    env.put("t", DIFF, diff([1, 1, 2], ["b", "c", "x"], [2, 3, 0], [-1, 1, 1]))
    env.put("t", DIFF, diff([2], ["x"], [0], [-1]))
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "c", 3.0)}

def test_a_put_never_runs_a_cycle(env, monkeypatch):
    """A DIFF check sees the writes staged before it by folding them in, not by a cycle."""
    t = env.create("t")
    env.put("t", UPSERT, kv([1], ["a"], [1]))
    env.graph.run_cycle()

    def no_cycles():
        raise AssertionError("a DoPut ran a cycle")

    monkeypatch.setattr(env.graph, "run_cycle", no_cycles)
    step = env.graph.step
    env.put("t", UPSERT, kv([1, 2], ["b", "x"], [2, 0]))
    env.put("t", DIFF, diff([1, 1, 2], ["b", "c", "x"], [2, 3, 0], [-1, 1, -1]))
    with pytest.raises(InputError, match=r"retracts a row key \{'k': 1\} does not hold \(it holds "
                                         r"\{'k': 1, 's': 'c'"):
        env.put("t", DIFF, diff([1], ["b"], [2], [-1]))
    assert env.graph.step == step and t.pending_rows == 4  # 2 upserts, then 1 upsert + 1 delete
    monkeypatch.undo()
    env.graph.run_cycle()
    assert env.keyed("t") == {1: row(1, "c", 3.0)}


def test_an_upsert_with_deletes_does_not_wait_for_readers_of_the_graph(env):
    """Its two parts (upserts, deletes) are staged under the table's staging lock alone: a
    snapshot holding the graph, and a cycle waiting for it, hold up no writer (#39 item 5)."""
    env.create("t")
    env.put("t", UPSERT, kv([1, 2], ["a", "b"], [1, 2]))
    env.graph.run_cycle()
    reading, release = threading.Event(), threading.Event()

    def reader():
        with env.graph.shared_lock():
            reading.set()
            release.wait(30)

    threads = [threading.Thread(target=reader)]
    threads[0].start()
    assert reading.wait(10)
    cycle = threading.Thread(target=env.graph.run_cycle)  # waits for the reader
    cycle.start()
    deadline = time.monotonic() + 10
    while not env.graph._lock._writers_waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert env.graph._lock._writers_waiting  # new readers now wait behind the cycle
    put = threading.Thread(target=env.put, args=("t", UPSERT, kv(
        [1, 2, 3], ["x", "-", "c"], [10, 0, 3], __delete=[False, True, False])))
    put.start()
    put.join(10)
    try:
        assert not put.is_alive(), "the put waited for the graph's readers"
        assert env.registry.get("t").table.pending_rows == 3  # both parts staged
    finally:
        release.set()
        threads[0].join(10)
        cycle.join(10)
        put.join(10)
    assert env.keyed("t") == {1: row(1, "x", 10.0), 3: row(3, "c", 3.0)}


def test_the_parts_of_a_batch_land_in_one_cycle_while_cycles_run(env):
    """Each batch upserts key 1 and deletes key 2 (or the reverse): a cycle taking one part
    without the other would leave both keys present, or neither."""
    env.create("t")
    env.put("t", UPSERT, kv([1], ["a"], [0]))
    env.graph.run_cycle()
    stop = threading.Event()
    seen: list[set[int]] = []

    def cycles():
        while not stop.is_set():
            env.graph.run_cycle()
            seen.append(set(env.keyed("t")))

    runner = threading.Thread(target=cycles)
    runner.start()
    try:
        for i in range(1, 400):
            up, down = (2, 1) if i % 2 else (1, 2)
            env.put("t", UPSERT, kv([up, down], ["u", "-"], [i, 0], __delete=[False, True]))
    finally:
        stop.set()
        runner.join(30)
    env.graph.run_cycle()
    seen.append(set(env.keyed("t")))
    assert len(seen) > 10
    assert all(len(keys) == 1 for keys in seen), [k for k in seen if len(k) != 1][:5]


def test_a_diff_batch_sees_the_earlier_batches_of_its_own_stream(env):
    env.create("t")
    acks = env.put("t", DIFF, diff([1], ["a"], [1], [1]), diff([1, 1], ["a", "b"], [1, 2], [-1, 1]),
                   diff([1], ["b"], [2], [-1]))
    assert [a.total_rows for a in acks] == [1, 3, 4]
    env.graph.run_cycle()
    assert env.keyed("t") == {}


# --- over real Flight ---------------------------------------------------------------------
KV2 = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def put(client, table, batches, request: pb.PutRequest | None, close=True):
    w, r = client.do_put(fl.FlightDescriptor.for_path(table), KV2)
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
    return pa.record_batch({"k": pa.array(keys, pa.int64()), "v": [v] * len(keys)}, schema=KV2)


def commit(client, **kw) -> pb.CommitResult:
    res = next(iter(client.do_action(fl.Action("commit", pb.CommitRequest(**kw).SerializeToString()))))
    out = pb.CommitResult()
    out.ParseFromString(res.body.to_pybytes())
    return out


def test_plain_put_acknowledges_every_batch(server, client, graph):
    t = server.registry.create_source("t", KV2, "keyed", keys=["k"]).table
    _, acks = put(client, "t", [batch([1, 2]), batch([2, 3], 5.0)], None)
    assert [(a.batch_index, a.rows, a.total_rows, a.staged) for a in acks] == [
        (0, 2, 2, False), (1, 2, 4, False)]
    graph.run_cycle()
    assert t.to_arrow().to_pydict() == {"k": [1, 2, 3], "v": [1.0, 5.0, 5.0]}


def test_bodies_framed_by_pyarrow_are_read_in_place_and_aligned_where_needed(server, client, graph):
    # pyarrow's client frames a body one byte past an 8-byte boundary; the server decodes it
    # in place and aligns only what needs it: the keys a delete marker groups through Acero
    # (this suite runs with ACERO_ALIGNMENT_HANDLING=error) and the string values it keeps
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    keyed = server.registry.create_source("t", schema, "keyed", keys=["k"]).table
    appended = server.registry.create_source("a", schema, "append").table
    rows = {"k": pa.array([1, 2, 2, 3], pa.int64()), "s": ["x", "y", "z", "w"]}
    for name, request, data in (
            ("t", pb.PutRequest(mode=pb.PUT_MODE_UPSERT),
             pa.record_batch({**rows, "__delete": [False, False, False, True]})),
            ("a", pb.PutRequest(mode=pb.PUT_MODE_APPEND), pa.record_batch(rows))):
        w, r = client.do_put(fl.FlightDescriptor.for_path(name), data.schema)
        w.write_with_metadata(data, pa.py_buffer(request.SerializeToString()))
        w.done_writing()
        assert r.read() is not None
        w.close()
    graph.run_cycle()
    assert keyed.to_arrow().to_pydict() == {"k": [1, 2], "s": ["x", "z"]}
    assert appended.to_arrow().to_pydict() == rows | {"k": [1, 2, 2, 3]}
    assert appended.to_arrow().filter(pc.field("s") > "x").column("k").to_pylist() == [2, 2]


def test_writer_killed_mid_transaction_leaves_nothing(server, client, graph):
    t = server.registry.create_source("t", KV2, "keyed", keys=["k"]).table
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
    t = server.registry.create_source("t", KV2, "keyed", keys=["k"]).table
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
    t = server.registry.create_source("a", KV2, "append").table
    for attempt in range(2):  # the same micro-batch 7, replayed after a restart
        put(client, "a", [batch([1, 2])],
            pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=f"q-7-{attempt}"))
        res = commit(client, write_id=f"q-7-{attempt}", all_slots=True, stream_id="q",
                     batch_id=7, has_batch=True)
        assert res.applied == (attempt == 0)
        graph.run_cycle()
    assert t.size == 2


def test_an_invalid_diff_batch_over_flight_names_table_and_key(server, client, graph):
    t = server.registry.create_source("t", KV2, "keyed", keys=["k"]).table
    t.upsert(pa.table({"k": pa.array([1], pa.int64()), "v": [1.0]}))
    graph.run_cycle()
    req = pb.PutRequest(mode=pb.PUT_MODE_DIFF)
    good = pa.record_batch({"k": pa.array([1, 1], pa.int64()), "v": [1.0, 2.0],
                            "__diff": pa.array([-1, 1], pa.int64())})
    bad = pa.record_batch({"k": pa.array([1], pa.int64()), "v": [1.0],
                           "__diff": pa.array([-1], pa.int64())})  # 1 holds 2.0 now
    w, r = client.do_put(fl.FlightDescriptor.for_path("t"), good.schema)
    w.write_with_metadata(good, pa.py_buffer(req.SerializeToString()))
    ack = pb.PutAck()
    ack.ParseFromString(r.read().to_pybytes())
    assert (ack.rows, ack.staged) == (2, False)
    with pytest.raises(pa.ArrowInvalid, match=r"table 't': diff row \{'k': 1, 'v': 1.0\} with "
                                             r"weight -1 retracts a row key \{'k': 1\} does not "
                                             r"hold \(it holds \{'k': 1, 'v': 2.0\}\); nothing "
                                             r"of the batch was applied"):
        w.write_batch(bad)
        w.close()
    graph.run_cycle()
    assert t.to_arrow().to_pydict() == {"k": [1], "v": [2.0]}


def test_without_a_journal_each_batch_is_staged_before_the_next_is_read(env):
    # nothing to pipeline in memory: the batches are staged on the stream's own thread, one
    # by one (no reader thread, no hand-off per batch)
    env.create("t", "append")
    table = env.registry.get("t").table
    assert env.puts.staging.synchronous
    seen = []

    def batches():
        for i in range(4):
            seen.append(table.pending_rows)
            yield as_batch(kv([i], [f"s{i}"], [float(i)]))

    assert env.puts.put("t", pb.PutRequest(mode=APPEND), batches(), lambda a: None) == 4
    assert seen == [0, 1, 2, 3]


# --- pipelined acknowledgements ---------------------------------------------------------------
class _SlowStager:
    """A stager whose submits complete when the test says (as a journal's fsync would)."""

    synchronous = False  # a submit is done later: the put pipelines

    def __init__(self, staging):
        self.staging = staging
        self.futures: list = []
        self.submitted = 0
        self.broken = None  # once set, submits fail at once (a broken chain)

    def apply(self, entry, parts):
        self.staging.apply(entry, parts)

    def hold(self, *args):
        self.staging.hold(*args)

    def open_chain(self):
        return object()

    def submit(self, entry, parts, chain):
        from concurrent.futures import Future
        f = Future()
        if self.broken is not None:
            f.set_exception(self.broken)
        self.futures.append((f, entry, parts))
        self.submitted += 1
        return f


def test_pipelined_acks_come_in_order_and_only_once_each_batch_landed(env):
    import threading
    env.create("t", "append")
    stager = _SlowStager(env.staging)
    env.puts.staging = stager
    env.puts.max_in_flight_bytes = 1 << 30
    acks: list = []
    batches = [as_batch(kv([i], [f"s{i}"], [float(i)])) for i in range(5)]
    done = threading.Event()

    def run():
        env.puts.put("t", pb.PutRequest(mode=APPEND), batches, acks.append)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while stager.submitted < 5:  # every batch is read and submitted without waiting
        assert t.is_alive() and time.monotonic() < deadline, "the put ended or stalled"
        t.join(0.01)
    assert acks == []
    for k in (2, 0):  # batch 2 lands first: nothing may be acknowledged before batch 0
        f, entry, parts = stager.futures[k]
        env.staging.apply(entry, parts)
        f.set_result(None)
    for f, entry, parts in (stager.futures[1], stager.futures[3], stager.futures[4]):
        env.staging.apply(entry, parts)
        f.set_result(None)
    assert done.wait(5)
    t.join()
    assert [(a.batch_index, a.total_rows) for a in acks] == [(i, i + 1) for i in range(5)]


def test_pipelined_stream_waits_when_too_much_is_in_flight(env):
    import threading
    env.create("t", "append")
    stager = _SlowStager(env.staging)
    env.puts.staging = stager
    env.puts.max_in_flight_bytes = 1  # every batch passes the bound: one at a time
    acks: list = []
    batches = [as_batch(kv([i], [f"s{i}"], [float(i)])) for i in range(3)]
    t = threading.Thread(target=lambda: env.puts.put("t", pb.PutRequest(mode=APPEND), batches,
                                                      acks.append))
    t.start()
    deadline = time.monotonic() + 30
    for i in range(3):
        while stager.submitted < i + 1:
            assert t.is_alive() and time.monotonic() < deadline, "the put ended or stalled"
            t.join(0.01)
        t.join(0.05)
        assert stager.submitted == i + 1  # the next batch is not read before this one lands
        stager.futures[i][0].set_result(None)
    t.join(5)
    assert [a.batch_index for a in acks] == [0, 1, 2]


def test_pipelined_failure_stops_the_stream_after_earlier_batches_are_acknowledged(env):
    env.create("t", "append")
    stager = _SlowStager(env.staging)
    env.puts.staging = stager
    acks: list = []
    good = [as_batch(kv([i], [f"s{i}"], [float(i)])) for i in range(2)]

    def batches():  # read by the handler's reader thread, ahead of the checks
        yield from good
        deadline = time.monotonic() + 10
        while stager.submitted < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        for f, entry, parts in stager.futures:  # both good batches land
            env.staging.apply(entry, parts)
            f.set_result(None)
        yield as_batch({"k": pa.array([9]), "nope": pa.array([1])})  # a schema error

    with pytest.raises(SchemaError, match="'t'"):
        env.puts.put("t", pb.PutRequest(mode=APPEND), batches(), acks.append)
    assert [a.batch_index for a in acks] == [0, 1]  # those before the bad one, acknowledged
    env.graph.run_cycle()
    assert [r["k"] for r in env.rows("t")] == [0, 1]
    # a refusal after submission (the journal could not write) ends the stream there
    stager.futures.clear()
    acks.clear()

    def failing():
        yield good[0]
        deadline = time.monotonic() + 10
        while not stager.futures and time.monotonic() < deadline:  # good[0] submitted
            time.sleep(0.001)
        stager.broken = InputError("the journal could not write")
        stager.futures[0][0].set_exception(stager.broken)
        yield good[1]

    with pytest.raises(InputError, match="could not write"):
        env.puts.put("t", pb.PutRequest(mode=APPEND), failing(), acks.append)
    assert acks == []
