"""Bad input gets a clear status and loses nothing; other clients are unaffected."""

from __future__ import annotations

import gc
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from tests.flight.conftest import OPEN, Sub

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def kv(keys, vals) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "s": [f"s{k}" for k in keys],
                     "v": pa.array(vals, pa.float64())})


@pytest.fixture
def table(server, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(kv([1, 2, 3], [1.0, 2.0, 3.0]))
    graph.run_cycle()
    return t


def _exchange(client, metadata: bytes | None):
    w, r = client.do_exchange(fl.FlightDescriptor.for_path("t"))
    if metadata is not None:
        w.begin(pa.schema([]))
        w.write_metadata(pa.py_buffer(metadata))
    else:
        batch = pa.record_batch({"x": pa.array([1], pa.int64())})
        w.begin(batch.schema)
        w.write_batch(batch)
    return w, r


@pytest.mark.parametrize("metadata", [b"\xff\xff\xff garbage", b"\x0a\x05ab", None],
                         ids=["garbage", "truncated", "no-metadata"])
def test_malformed_subscription_metadata(client, table, metadata):
    w, r = _exchange(client, metadata)
    with pytest.raises(pa.ArrowInvalid, match="DoExchange: (malformed|missing)"):
        r.read_chunk()
    try:
        w.close()  # finishes the call; it reports the same status again
    except pa.ArrowInvalid:
        pass
    ok = Sub(client, "t")  # the server keeps serving
    ok.read()
    assert ok.view.to_arrow().num_rows == 3


def test_unknown_table_and_column(client, table):
    with pytest.raises(KeyError, match="no table 'nope'.*tables: t"):
        Sub(client, "nope").read()
    with pytest.raises(pa.ArrowInvalid, match=r"no column\(s\) \['zz'\]"):
        Sub(client, "t", columns=["zz"]).read()
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.get_flight_info(fl.FlightDescriptor.for_path("nope"))
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.do_get(fl.Ticket(pb.SnapshotRequest(table="nope").SerializeToString())).read_all()


def test_unknown_column_in_snapshot_filter(client, table):
    from pyarrow import substrait

    other = pa.schema([("zz", pa.int64())])
    f = bytes(substrait.serialize_expressions([pc.field("zz") > 1], ["f"], other))
    req = pb.SnapshotRequest(table="t", filter=f)
    with pytest.raises(pa.ArrowInvalid, match="filter on table 't'.*zz"):
        client.do_get(fl.Ticket(req.SerializeToString())).read_all()
    # a filter that is no Substrait message at all: one line naming the table
    req = pb.SnapshotRequest(table="t", filter=b"\x08not substrait")
    with pytest.raises(pa.ArrowInvalid, match="filter on table 't'") as err:
        client.do_get(fl.Ticket(req.SerializeToString())).read_all()
    assert "Traceback" not in str(err.value)


def test_snapshot_with_columns_and_filter(client, table):
    from pyarrow import substrait

    f = bytes(substrait.serialize_expressions([pc.field("v") >= 2.0], ["f"], KV))
    req = pb.SnapshotRequest(table="t", columns=["k"], filter=f)
    got = client.do_get(fl.Ticket(req.SerializeToString())).read_all()
    assert got.to_pydict() == {"k": [2, 3]}
    assert client.do_get(fl.Ticket(b"t")).read_all().num_rows == 3


def test_wrong_schema_put_loses_nothing(client, table, graph):
    w, r = client.do_put(fl.FlightDescriptor.for_path("t"), pa.schema([("k", pa.string())]))
    with pytest.raises(pa.ArrowInvalid, match="'t'"):
        w.write_batch(pa.record_batch({"k": ["x"]}))
        w.close()
    graph.run_cycle()
    assert table.to_arrow().equals(kv([1, 2, 3], [1.0, 2.0, 3.0]).cast(KV))


def test_oversized_batch_and_metadata_are_refused(graph):
    srv = TicktableServer(graph, ServerConfig(max_put_batch_bytes=10_000,
                                              max_metadata_bytes=100)).start()
    try:
        srv.registry.create_source("a", pa.schema([("x", pa.int64())]), "append")
        c = fl.connect(srv.location)
        w, r = c.do_put(fl.FlightDescriptor.for_path("a"), pa.schema([("x", pa.int64())]))
        with pytest.raises(pa.ArrowInvalid, match="exceeds the limit"):
            w.write_batch(pa.record_batch({"x": pa.array(range(5000), pa.int64())}))
            w.close()
        w, r = c.do_exchange(fl.FlightDescriptor.for_path("a"))
        w.begin(pa.schema([]))
        w.write_metadata(pa.py_buffer(b"\x00" * 1000))
        with pytest.raises(pa.ArrowInvalid, match="exceeds the limit"):
            r.read_chunk()
        graph.run_cycle()
        assert srv.registry.get("a").table.size == 0
    finally:
        srv.shutdown()


def test_unknown_action_and_bad_bodies(client, table):
    with pytest.raises(pa.ArrowInvalid, match="unknown action 'nope'"):
        list(client.do_action(fl.Action("nope", b"")))
    with pytest.raises(pa.ArrowInvalid, match="create_table: malformed"):
        list(client.do_action(fl.Action("create_table", b"\xff\xff")))
    body = pb.CreateTableRequest(name="x", schema=b"not a schema").SerializeToString()
    with pytest.raises(pa.ArrowInvalid, match="not an Arrow IPC schema"):
        list(client.do_action(fl.Action("create_table", body)))


def test_actions_create_stats_drop(client, server, graph, table):
    schema = pa.schema([("x", pa.int64())])
    body = pb.CreateTableRequest(name="a", schema=schema.serialize().to_pybytes(),
                                 kind=pb.TABLE_KIND_APPEND).SerializeToString()
    list(client.do_action(fl.Action("create_table", body)))
    assert [f.descriptor.path[0] for f in client.list_flights()] == [b"a", b"t"]
    assert client.get_schema(fl.FlightDescriptor.for_path("a")).schema.equals(schema)
    w, r = client.do_put(fl.FlightDescriptor.for_path("a"), schema)
    w.write_batch(pa.record_batch({"x": [1, 2]}))
    w.close()
    graph.run_cycle()
    sub = Sub(client, "t")
    sub.read()
    stats = pb.Stats()
    stats.ParseFromString(next(iter(client.do_action(fl.Action("stats", b"")))).body.to_pybytes())
    by = {t.name: t for t in stats.tables}
    assert by["a"].size == 2 and by["t"].subscribers == 1 and stats.step == graph.step
    list(client.do_action(fl.Action("drop_table", pb.DropTableRequest(name="a").SerializeToString())))
    assert [f.descriptor.path[0] for f in client.list_flights()] == [b"t"]
    sub.close()


def test_drop_ends_subscriptions_with_a_clear_status(client, server, table):
    sub = Sub(client, "t")
    sub.read()
    server.registry.drop("t")
    with pytest.raises(KeyError, match="table 't' was dropped"):
        sub.read()


@pytest.fixture
def secured(graph):
    srv = TicktableServer(graph, ServerConfig(token="s3cret")).start()
    srv.registry.create_source("t", KV, "keyed", keys=["k"])
    yield srv
    srv.shutdown()


def test_unauthenticated_calls_are_refused(secured):
    bad = fl.connect(secured.location)
    for call in (lambda: list(bad.list_flights()),
                 lambda: bad.do_get(fl.Ticket(b"t")).read_all(),
                 lambda: list(bad.do_action(fl.Action("stats", b""))),
                 lambda: bad.get_flight_info(fl.FlightDescriptor.for_path("t"))):
        with pytest.raises(fl.FlightUnauthenticatedError, match="bearer token"):
            call()
    wrong = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])
    with pytest.raises(fl.FlightUnauthenticatedError):
        list(bad.list_flights(options=wrong))
    good = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer s3cret")])
    assert [f.descriptor.path[0] for f in bad.list_flights(options=good)] == [b"t"]


def _sub_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ticktable-sub")]


def test_connect_disconnect_cycles_leak_nothing(server, table, graph):
    """1,000 connects/disconnects (snapshots, subscriptions dropped mid-stream)."""
    def once(i: int) -> None:
        c = fl.connect(server.location)
        if i % 2:
            c.do_get(fl.Ticket(b"t")).read_all()
        else:
            s = Sub(c, "t")
            s.read()
            s.reader.cancel()  # vanish mid-stream, without finishing
        c.close()

    for i in range(50):  # warm up thread pools
        once(i)
    gc.collect()
    threads_before = threading.active_count()
    for i in range(1000):
        once(i)
        if i % 100 == 0:
            table.upsert(kv([i], [float(i)]))
            graph.run_cycle()
    deadline = time.monotonic() + 10
    while server.subscriptions and time.monotonic() < deadline:
        graph.run_cycle()
        time.sleep(0.05)
    assert server.subscriptions == []
    while _sub_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sub_threads() == []  # every subscription's sender and reader ended
    # gRPC's call pool keeps its threads for reuse (at most one per concurrent call)
    assert threading.active_count() <= threads_before + 2, sorted(
        t.name for t in threading.enumerate())
    ok = Sub(fl.connect(server.location), "t")
    ok.read()
    assert ok.view.to_arrow().equals(table.to_arrow())


def test_server_shutdown_ends_subscriptions(graph):
    srv = TicktableServer(graph, ServerConfig()).start()
    srv.registry.create_source("t", KV, "keyed", keys=["k"])
    sub = Sub(fl.connect(srv.location), "t")
    sub.read()
    done = threading.Thread(target=srv.shutdown)
    done.start()
    with pytest.raises(fl.FlightUnavailableError, match="shutting down"):
        sub.read()
    done.join(15)
    assert not done.is_alive()
    _ = UpdateGraph


def test_a_client_that_never_finishes_writing_cannot_hurt_the_server(graph):
    """The server ends a stream; its client ignores that. The call is over on the server's
    side (gRPC ends it with its status whether or not the client finished writing), everyone
    else is served, shutdown is not held up by it, and the client's eventual read and close
    are clean."""
    srv = TicktableServer(graph, ServerConfig(end_grace_seconds=0.2,
                                              shutdown_timeout=1.0)).start()
    srv.registry.create_source("t", KV, "keyed", keys=["k"])
    srv.registry.create_source("u", KV, "keyed", keys=["k"])
    stubborn_client = fl.connect(srv.location)
    stubborn = Sub(stubborn_client, "t")
    stubborn.read()
    srv.registry.drop("t")  # the server ends the stubborn stream; it never calls done_writing
    time.sleep(1.0)  # several end-of-stream graces pass
    other = fl.connect(srv.location)
    w, _ = other.do_put(fl.FlightDescriptor.for_path("u"), KV)
    w.write_table(kv([1], [1.0]))
    w.close()
    graph.run_cycle()
    assert other.do_get(fl.Ticket(b"u")).read_all().num_rows == 1
    watcher = Sub(other, "u")
    watcher.read()
    assert watcher.view.to_arrow().num_rows == 1
    watcher.close()
    t0 = time.monotonic()
    assert srv.shutdown() is True  # nothing of the stubborn call is left to wait for
    assert time.monotonic() - t0 < 5
    with pytest.raises(KeyError, match="dropped"):
        stubborn.read()  # it finally reads its end of stream and finishes writing
    OPEN.remove(stubborn)
    stubborn_client.close()
    other.close()


@pytest.mark.parametrize("setting, message", [
    ({"port": 70000}, "port is 70000: a port is 0 (any free one) to 65535"),
    ({"port": -1}, "port is -1: a port is 0 (any free one) to 65535"),
    ({"http_port": -1}, "http_port is -1: a port is 0 (any free one) to 65535, or None for none"),
    ({"metrics_port": 65536}, "metrics_port is 65536: a port is 0 (any free one) to 65535, or "
                              "None for none"),
    ({"max_calls": 0}, "max_calls is 0: it must be an integer of at least 1"),
    ({"max_batch_rows": 2.5}, "max_batch_rows is 2.5: it must be an integer of at least 1"),
    ({"max_pending": True}, "max_pending is True: it must be an integer of at least 1"),
    ({"history_updates": -1}, "history_updates is -1: it must be an integer of at least 0"),
    ({"shutdown_timeout": -1.0}, "shutdown_timeout is -1.0: it must be a number of seconds, 0 "
                                 "or more"),
    ({"web_interval": float("nan")}, "web_interval is nan: it must be a number of seconds, 0 or "
                                     "more"),
    ({"checkpoint_seconds": 0}, "checkpoint_seconds is 0: it must be a number of seconds above 0"),
    ({"tls_cert": b"x"}, "TLS needs both a certificate and a key"),
    ({"read_token": "r"}, "a read token needs a token too: without one every call may write"),
    ({"token": "t", "read_token": "t"}, "the read token must differ from the token"),
])
def test_a_setting_out_of_range_is_refused_naming_it(setting, message):
    from engine.errors import InputError

    graph = UpdateGraph()
    with pytest.raises(InputError) as info:
        TicktableServer(graph, ServerConfig(**setting))
    assert str(info.value) == message
