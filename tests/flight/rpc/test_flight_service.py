"""Arrow Flight served by grpcio on the server's one port (flight/rpc/flight_service.py, framing.py).

Real servers on 127.0.0.1 read by unmodified ``pyarrow.flight`` clients and raw gRPC
channels: every Flight call, the TableService, health and reflection on one port; the
hand framing both ways (record batches, dictionaries, metadata-only messages, the
PutRequest on the schema message); zero-copy decoding of what a client sends; an exclusive
port; bounded shutdown; and malformed frames answered with INVALID_ARGUMENT.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from engine.errors import PortInUse
from engine.graph import UpdateGraph
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.pb import table_service_pb2_grpc as tgrpc
from flight.rpc import framing
from flight.rpc.framing import IpcDecoder, batch_frames, frame, parse_flight_data, schema_frame
from flight.server import ServerConfig, TicktableServer
from tests.flight.conftest import OPEN, Sub

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def _kv(keys, vals):
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(vals, pa.float64())})


# ------------------------------------------------------------------------------ framing
def test_frames_are_flight_data_messages_protobuf_reads_alike():
    b = pa.record_batch({"x": pa.array(np.arange(1000)), "s": pa.array([f"s{i}" for i in range(1000)])})
    (raw,) = batch_frames(b.schema, [b], first_metadata=b"meta")
    msg = fpb.FlightData.FromString(raw)  # the generated class parses our hand framing
    assert msg.app_metadata == b"meta" and len(msg.data_body) > 8000
    assert pa.ipc.read_message(pa.py_buffer(
        b"\xff\xff\xff\xff" + len(msg.data_header).to_bytes(4, "little") + msg.data_header
        + msg.data_body)).type == "record batch"
    parsed = parse_flight_data(raw)
    assert bytes(parsed.header) == msg.data_header and bytes(parsed.body) == msg.data_body
    assert parsed.descriptor is None
    # and our parser reads what protobuf writes, descriptor included
    d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"])
    pbuf = fpb.FlightData(flight_descriptor=d, app_metadata=b"m").SerializeToString()
    back = parse_flight_data(pbuf)
    assert bytes(back.app_metadata) == b"m" and back.header is None
    assert framing.descriptor_of(back.descriptor).path == [b"t"]


@pytest.mark.parametrize("rows, cols", [(0, 1), (1, 1), (1000, 3), (7, 5)])
def test_batch_frames_slice_header_and_body_as_read_message_does(rows, cols):
    rng = np.random.default_rng(rows + cols)
    t = pa.table({f"c{i}" if i % 2 else f"name_{i}_{'x' * i}":  # header sizes of every padding
                  pa.array(rng.integers(0, 9, rows + 3)) if i % 2 else
                  pa.array([None if v == 0 else f"s{v}" for v in rng.integers(0, 9, rows + 3)])
                  for i in range(cols)})
    for b in (t.to_batches()[0].slice(3, rows), t.to_batches()[0].slice(0, rows)):
        (raw,) = batch_frames(b.schema, [b])
        msg = pa.ipc.read_message(b.serialize())
        parsed = parse_flight_data(raw)
        assert bytes(parsed.header) == msg.metadata.to_pybytes()
        assert bytes(parsed.body or b"") == msg.body.to_pybytes()
        dec = IpcDecoder(iter([schema_frame(b.schema), raw]), "test")
        dec.read_schema()
        assert dec.read_chunk().data.equals(b)


def test_a_delta_table_becomes_as_few_batches_as_its_row_limit_allows():
    from flight.streams.codec import record_batches as _batches

    one = pa.table({"k": pa.array(np.arange(10))})
    assert [x.num_rows for x in _batches(one, 4)] == [4, 4, 2]
    assert [x.num_rows for x in _batches(one, 10)] == [10]
    ragged = pa.table({"k": pa.chunked_array([np.arange(3), np.arange(7)]),  # chunks that do
                       "v": pa.chunked_array([np.arange(6), np.arange(4)])})  # not line up
    got = _batches(ragged, 5)
    assert [x.num_rows for x in got] == [5, 5] and pa.Table.from_batches(got).equals(ragged)
    assert _batches(one.slice(0, 0), 4) == []


def test_decoded_batches_point_into_the_received_bytes_wherever_the_body_lands():
    b = pa.record_batch({"x": pa.array(np.arange(100_000)), "s": pa.array([f"s{i}" for i in range(100_000)])})
    offsets = set()
    for pad in range(8):  # app_metadata of every length mod 8: the body lands at each offset
        (raw,) = batch_frames(b.schema, [b], first_metadata=b"m" * (pad + 1))
        received = bytes(raw)  # what gRPC hands the handler
        dec = IpcDecoder(iter([schema_frame(b.schema), received]), "test")
        assert dec.read_schema() == b.schema
        chunk = dec.read_chunk()
        assert chunk.data.equals(b)
        start = pa.py_buffer(received).address
        buffers = [x for c in chunk.data.columns for x in c.buffers() if x is not None]
        assert all(start <= x.address < start + len(received) for x in buffers)  # no copy
        offsets |= {x.address % 8 for x in buffers}
        with pytest.raises(StopIteration):
            dec.read_chunk()
    assert offsets == set(range(8))  # aligned or not: what needs alignment realigns


def test_dictionary_columns_round_trip_through_the_framing():
    d = pa.array(["a", "b", "a", None]).dictionary_encode()
    b1 = pa.record_batch({"d": d, "x": pa.array([1, 2, 3, 4])})
    b2 = pa.record_batch({"d": pa.array(["z", "z"]).dictionary_encode(), "x": pa.array([5, 6])})
    frames = [schema_frame(b1.schema), *batch_frames(b1.schema, [b1, b2], first_metadata=b"m")]
    dec = IpcDecoder(iter(frames), "test")
    dec.read_schema()
    c1, c2 = dec.read_chunk(), dec.read_chunk()
    assert c1.data.to_pylist() == b1.to_pylist() and c2.data.to_pylist() == b2.to_pylist()
    assert c1.app_metadata.to_pybytes() == b"m" and c2.app_metadata is None


@pytest.mark.parametrize("raw, match", [
    (b"\x12\x80", "truncated"),
    (b"\x12\x05abc", "runs past the end"),
    (b"\x0f", "wire type 7"),
    (frame(header=b"\x00" * 16), "malformed Arrow IPC message"),
])
def test_malformed_frames_are_protocol_errors(raw, match):
    from engine.errors import ProtocolError

    dec = IpcDecoder(iter([raw]), "DoPut into 't'")
    with pytest.raises(ProtocolError, match=match):
        dec.read_schema()


# --------------------------------------------------------------------- one port, all services
def test_flight_table_service_health_and_reflection_share_one_port(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        names = [x.name for x in tgrpc.TableServiceStub(ch).ListTables(
            tpb.ListTablesRequest(), timeout=10).tables]
        assert names == ["t"]
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "ticktable_proto.v1.TableService", "arrow.flight.protocol.FlightService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status \
                == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        [answer] = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]), timeout=10))
        services = {s.name for s in answer.list_services_response.service}
        assert {"arrow.flight.protocol.FlightService", "ticktable_proto.v1.TableService",
                "grpc.health.v1.Health"} <= services
    assert client.do_get(fl.Ticket(b"t")).read_all().num_rows == 2
    info = client.get_flight_info(fl.FlightDescriptor.for_path("t"))
    assert info.total_records == 2 and info.schema == KV
    assert client.get_schema(fl.FlightDescriptor.for_path("t")).schema == KV
    assert [a.type for a in client.list_actions()] == [
        "create_table", "drop_table", "commit", "abort", "stats",
        "CreatePreparedStatement", "ClosePreparedStatement", "CancelFlightInfo",
        "SetSessionOptions", "GetSessionOptions", "CloseSession"]
    stats = pb.Stats.FromString(next(iter(client.do_action(fl.Action("stats", b"")))).body
                                .to_pybytes())
    assert stats.table_service_port == server.port


def test_handshake_and_poll_flight_info(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        hs = ch.stream_stream("/arrow.flight.protocol.FlightService/Handshake",
                              request_serializer=fpb.HandshakeRequest.SerializeToString,
                              response_deserializer=fpb.HandshakeResponse.FromString)
        [r] = list(hs(iter([fpb.HandshakeRequest(protocol_version=3)]), timeout=10))
        assert r.protocol_version == 3
        poll = ch.unary_unary("/arrow.flight.protocol.FlightService/PollFlightInfo",
                              request_serializer=fpb.FlightDescriptor.SerializeToString)
        with pytest.raises(grpc.RpcError) as info:
            poll(fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"]), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_put_request_on_the_schema_message_is_honoured_and_twice_is_refused(server, client,
                                                                         graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    delete = pb.PutRequest(mode=pb.PUT_MODE_DELETE).SerializeToString()
    keys = pa.schema([("k", pa.int64())])
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        put = ch.stream_stream("/arrow.flight.protocol.FlightService/DoPut")
        desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"]).SerializeToString()
        body = pa.record_batch({"k": pa.array([1], pa.int64())})
        msgs = [frame(descriptor=desc, header=pa.ipc.read_message(keys.serialize()).metadata,
                      app_metadata=delete), *batch_frames(keys, [body])]
        acks = [pb.PutAck.FromString(fpb.PutResult.FromString(a).app_metadata)
                for a in put(iter(msgs), timeout=10)]
        assert [a.rows for a in acks] == [1]
        graph.run_cycle()
        assert t.to_arrow().column("k").to_pylist() == [2]  # a delete, not an upsert
        twice = [msgs[0], *batch_frames(keys, [body], first_metadata=delete)]
        with pytest.raises(grpc.RpcError) as info:
            list(put(iter(twice), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "send it once" in info.value.details()


def test_subscribe_on_the_descriptor_message_is_honoured(server, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1], [1.0]))
    graph.run_cycle()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        exchange = ch.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")
        desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"]).SerializeToString()
        sub = pb.ClientMessage(subscribe=pb.SubscriptionRequest()).SerializeToString()
        done = threading.Event()

        def requests():
            yield frame(descriptor=desc, app_metadata=sub)  # one message: both together
            done.wait(10)

        call = exchange(requests(), timeout=10)
        # the schema, then the one batch carrying the snapshot's metadata
        first = [parse_flight_data(next(call)) for _ in range(2)]
        assert first[0].header is not None and first[1].app_metadata is not None
        assert first[1].header is not None and first[1].body is not None
        meta = pb.UpdateMetadata.FromString(bytes(first[1].app_metadata))
        assert meta.table_size == 1 and meta.num_added_batches == 1
        done.set()
        call.cancel()


def test_the_port_is_exclusive_and_in_use_is_one_error(server):
    with pytest.raises(PortInUse, match=f"127.0.0.1:{server.port}"):
        TicktableServer(UpdateGraph(), ServerConfig(port=server.port)).start()
    # the first server still answers alone
    c = fl.connect(server.location)
    assert list(c.list_flights()) == []
    c.close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        with pytest.raises(PortInUse):
            TicktableServer(UpdateGraph(), ServerConfig(port=s.getsockname()[1])).start()
    finally:
        s.close()


def test_prepare_runs_after_recovery_and_before_the_port_is_bound(tmp_path):
    """``start(prepare)``: the recovered tables are there for it, no client can connect
    while it runs, what it registers is in the first answer; if it raises, nothing is
    served and the data dir is free for the next start."""
    from bench.ports import HeldPort
    from clients.client import connect

    first = TicktableServer(UpdateGraph(), ServerConfig(data_dir=tmp_path)).start()
    first.registry.create_source("kept", KV, "keyed", keys=["k"])  # not journaled: gone
    with connect(first.location) as client:  # journaled
        client.create_table("durable", KV, "append")
    first.shutdown()

    seen: list[object] = []
    with HeldPort() as held:
        def prepare(srv: TicktableServer) -> None:
            seen.append(sorted(srv.registry.names()))
            with socket.socket() as probe:  # nothing listens yet
                seen.append(probe.connect_ex(("127.0.0.1", held.port)))
            srv.registry.create_source("made", KV, "keyed", keys=["k"])

        srv = TicktableServer(UpdateGraph(), ServerConfig(port=held.port, data_dir=tmp_path)
                              ).start(prepare)
        try:
            assert seen[0] == ["durable"] and seen[1] != 0
            with fl.connect(srv.location) as c:
                assert sorted(f.descriptor.path[0].decode() for f in c.list_flights()) == [
                    "durable", "made"]
        finally:
            srv.shutdown()

        def fails(srv: TicktableServer) -> None:
            raise ValueError("no demo today")

        with pytest.raises(ValueError, match="no demo today"):
            TicktableServer(UpdateGraph(), ServerConfig(port=held.port, data_dir=tmp_path)).start(fails)
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", held.port)) != 0
        again = TicktableServer(UpdateGraph(), ServerConfig(port=held.port, data_dir=tmp_path)).start()
        try:
            assert sorted(again.registry.names()) == ["durable"]
        finally:
            again.shutdown()


def test_shutdown_ends_open_streams_within_its_grace(graph):
    srv = TicktableServer(graph, ServerConfig(shutdown_timeout=1.0)).start()
    srv.registry.create_source("t", KV, "keyed", keys=["k"])
    c = fl.connect(srv.location)
    s = Sub(c, "t")
    s.read()
    # a DoPut that never finishes writing
    w, _ = c.do_put(fl.FlightDescriptor.for_path("t"), KV)
    w.write_table(_kv([1], [1.0]))
    t0 = time.monotonic()
    assert srv.shutdown() is True
    assert time.monotonic() - t0 < 4
    with pytest.raises(fl.FlightUnavailableError, match="shutting down"):
        s.read()  # its end of stream, then the status
    OPEN.remove(s)
    c.close()


def test_unauthenticated_streams_are_refused_at_once(graph):
    srv = TicktableServer(graph, ServerConfig(token="s3cret")).start()
    try:
        srv.registry.create_source("t", KV, "keyed", keys=["k"])
        c = fl.connect(srv.location)
        t0 = time.monotonic()
        with pytest.raises(fl.FlightUnauthenticatedError, match="bearer token"):
            # refused without waiting for a first message: at the call itself when the
            # refusal is back before pyarrow hands out the streams (a fresh-clone CI run
            # saw that), else at the first read
            _, reader = c.do_exchange(fl.FlightDescriptor.for_path("t"))
            reader.read_chunk()
        assert time.monotonic() - t0 < 5
        with pytest.raises(fl.FlightUnauthenticatedError):
            # the same for a put: at the call (pyarrow writes the schema there, and the
            # refusal may already be back: a fresh-clone CI run saw that), else at a write
            w, _ = c.do_put(fl.FlightDescriptor.for_path("t"), KV)
            w.write_table(_kv([1], [1.0]))
            w.close()
        graph.run_cycle()
        assert srv.registry.get("t").table.size == 0  # nothing of the refused put was applied
        with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:  # health needs no token
            assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=10).status == 1
        c.close()
    finally:
        srv.shutdown()


def test_a_failed_start_releases_the_data_dir(server, tmp_path):
    graph = UpdateGraph()
    with pytest.raises(PortInUse):
        TicktableServer(graph, ServerConfig(port=server.port, data_dir=tmp_path / "d")).start()
    assert graph.cycle_gate is None
    again = TicktableServer(UpdateGraph(), ServerConfig(data_dir=tmp_path / "d")).start()
    again.shutdown()  # the journal was not left locked by the failed start


def test_doget_tells_the_step_of_its_snapshot(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    graph.run_cycle()
    reader = client.do_get(fl.Ticket(b"t"))
    chunk = reader.read_chunk()  # an empty table: one batch of no rows, with the metadata
    meta = pb.UpdateMetadata.FromString(chunk.app_metadata.to_pybytes())
    assert chunk.data.num_rows == 0 and meta.is_snapshot and meta.step == graph.step
    assert meta.table_size == 0 and list(meta.columns) == ["k", "v"]
    t.upsert(_kv(range(200_000), [1.0] * 200_000))
    graph.run_cycle()
    graph.run_cycle()
    req = pb.SnapshotRequest(table="t", columns=["v"]).SerializeToString()
    reader = client.do_get(fl.Ticket(req))
    first = reader.read_chunk()
    meta = pb.UpdateMetadata.FromString(first.app_metadata.to_pybytes())
    assert meta.step == graph.step and meta.table_size == 200_000 and list(meta.columns) == ["v"]
    assert meta.epoch == server.registry.get("t").publisher.epoch
    rest = reader.read_all()
    assert first.data.num_rows + rest.num_rows == 200_000
    assert client.do_get(fl.Ticket(b"t")).read_pandas().shape == (200_000, 2)  # pandas unaffected


def test_subscribe_on_the_schema_message_is_honoured(server, client, graph):
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        exchange = ch.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")
        desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=["t"]).SerializeToString()
        sub = pb.ClientMessage(subscribe=pb.SubscriptionRequest()).SerializeToString()
        done = threading.Event()

        def requests():
            yield frame(descriptor=desc, header=pa.ipc.read_message(
                pa.schema([]).serialize()).metadata, app_metadata=sub)
            done.wait(10)

        call = exchange(requests(), timeout=10)
        first = [parse_flight_data(next(call)) for _ in range(2)]  # schema, batch + metadata
        meta = pb.UpdateMetadata.FromString(bytes(first[1].app_metadata))
        assert first[1].header is not None and meta.num_added_batches == 1
        assert meta.is_snapshot and meta.table_size == 2
        done.set()
        call.cancel()


def test_a_durable_put_acks_each_batch_before_the_next_is_sent(tmp_path):
    """A client that waits for each ack before it sends the next batch is answered: the ack
    goes out when the batch is durable, not when the next message arrives."""
    graph = UpdateGraph()
    srv = TicktableServer(graph, ServerConfig(data_dir=tmp_path / "d")).start()
    try:
        c = fl.connect(srv.location)
        req = pb.CreateTableRequest(name="t", schema=KV.serialize().to_pybytes(),
                                    kind=pb.TABLE_KIND_KEYED, keys=["k"])
        list(c.do_action(fl.Action("create_table", req.SerializeToString())))
        w, r = c.do_put(fl.FlightDescriptor.for_path("t"), KV)
        done = threading.Event()
        acks: list[pb.PutAck] = []

        def lockstep():
            for i in range(5):
                w.write_batch(_kv([i], [float(i)]).to_batches()[0])
                acks.append(pb.PutAck.FromString(r.read().to_pybytes()))  # wait for its ack
            done.set()

        t = threading.Thread(target=lockstep, daemon=True)
        t.start()
        assert done.wait(20), f"stuck after {len(acks)} acks"
        assert [(a.batch_index, a.total_rows) for a in acks] == [(i, i + 1) for i in range(5)]
        w.done_writing()
        w.close()
        c.close()
    finally:
        srv.shutdown()


def test_the_server_keeps_freed_memory_for_large_blocks_on_glibc():
    # received DoPut messages are a few MB each: glibc must reuse freed heap memory for them
    # rather than map (and the kernel zero) fresh pages for every one
    import platform

    from flight.server import keep_freed_memory

    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


_HEAPS = """
import ctypes, os, sys, tempfile, threading
sys.path.insert(0, {root!r})
import pyarrow  # noqa: F401  (as the server: imported, and its threads started, first)
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
def heaps():  # malloc_info lists one <heap> per arena
    fd, path = tempfile.mkstemp()
    os.close(fd)
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp))
    libc.fclose(ctypes.c_void_p(fp))
    text = open(path).read()
    os.unlink(path)
    return text.count("<heap nr=")
if {keep}:
    from flight.server import keep_freed_memory
    assert keep_freed_memory()
before = heaps()
def work():  # what the event loop does with DoPut messages: large blocks, freed later
    kept = [bytes(bytearray(3 << 20)) for _ in range(4)]
    del kept
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(before, heaps())
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_threads_started_after_keep_freed_memory_get_no_heaps_of_their_own():
    # glibc gives threads heaps of their own and unmaps one as soon as all of it is free
    # (whatever the trim threshold), so DoPut messages received on the loop thread came back
    # to fresh pages in two of three bench runs; the server's threads share the heaps there
    # were. malloc_info lists the heaps in use.
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[3])

    def heaps(keep: bool) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", _HEAPS.format(root=root, keep=keep)],
                             capture_output=True, text=True, timeout=60, check=True)
        before, after = out.stdout.split()
        return int(before), int(after)

    before, after = heaps(keep=False)
    assert after > before  # each thread that allocated got a heap
    before, after = heaps(keep=True)
    assert after == before


_REFILL = """
import resource, sys, threading
sys.path.insert(0, {root!r})
go, faults = threading.Event(), []
def loop():  # a thread with a heap of its own, as threads started before the server have
    kept = [bytes(100)]
    go.wait()
    for _ in range(3):  # a put's messages (120 MB: more than one 64 MB heap), then freed
        f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        kept = [bytes(bytearray(3 << 20)) for _ in range(40)]
        del kept
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
t = threading.Thread(target=loop)
t.start()
if {keep}:
    from flight.server import keep_freed_memory
    assert keep_freed_memory()
go.set()
t.join()
print(*faults)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_thread_heap_emptied_by_a_put_is_reused_not_unmapped():
    # without the top pad, glibc unmapped the emptied heap after each put and the next put
    # faulted its 60 MB in again (15,361 pages per put here)
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[3])

    def faults(keep: bool) -> list[int]:
        out = subprocess.run([sys.executable, "-c", _REFILL.format(root=root, keep=keep)],
                             capture_output=True, text=True, timeout=60, check=True)
        return [int(x) for x in out.stdout.split()]

    first, *again = faults(keep=False)
    assert all(n > first / 4 for n in again)  # glibc's default: fresh pages every put
    first, *again = faults(keep=True)
    assert all(n < first / 50 for n in again), (first, again)


@pytest.mark.parametrize("kind", ["append", "keyed"])
def test_a_dropped_table_is_freed_at_once_not_by_the_cyclic_collector(server, client, graph, kind):
    # a dropped table's columns (hundreds of MB for a large table) must go when it is
    # dropped: a reference cycle (publisher -> listener handle -> the publisher's bound
    # methods) kept them until Python's cyclic collector happened to run
    import gc
    import weakref

    schema = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    entry = server.registry.create_source("d", schema, kind, keys=["k"] if kind == "keyed" else None)
    table = weakref.ref(entry.table)
    column = weakref.ref(entry.table._storage["v"])
    rows = pa.table({"k": np.arange(1_000), "v": np.random.default_rng(1).random(1_000)})
    (entry.table.upsert if kind == "keyed" else entry.table.append)(rows)
    graph.run_cycle()
    sub = Sub(client, "d")
    sub.until(1)
    del entry
    gc.collect()
    gc.disable()
    try:
        assert server.registry.drop("d")
        graph.run_cycle()
        with pytest.raises(pa.ArrowKeyError, match="table 'd' was dropped"):
            sub.read()  # the subscriber is told: NOT_FOUND
        sub.close()
        deadline = time.monotonic() + 10
        while (table() is not None or column() is not None) and time.monotonic() < deadline:
            time.sleep(0.01)  # the subscription's own thread lets go of it as it ends
        assert table() is None and column() is None
    finally:
        gc.enable()
