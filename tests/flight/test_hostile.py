"""Hostile and mistaken clients (#18): each gets its exact gRPC code and a one-line message.

First the cases a tester reported against the old server, one test each, over raw gRPC
channels (exact status codes) and ``pyarrow.flight`` clients: garbled DoPut bodies,
duplicate columns, an absurd ring capacity, unhashable keys refused at create, framings
that are honoured (PutRequest on the schema message, subscribe on the descriptor message),
plain-name tickets of missing tables, commits and aborts of unknown write ids, and
megabytes of input that must not come back. Then read-only access: the read token may
snapshot, subscribe and list; everything else answers PERMISSION_DENIED; over TLS too.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from engine.errors import InputError, WriteNotFound
from engine.graph import UpdateGraph
from flight.errors import MAX_MESSAGE
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.pb import table_service_pb2_grpc as tgrpc
from flight.rpc.framing import IpcDecoder, batch_frames, frame, parse_flight_data
from flight.server import ServerConfig, TicktableServer
from flight.streams.registry import MAX_RING_CAPACITY
from tests.flight.conftest import Sub

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])
FLIGHT = "/arrow.flight.protocol.FlightService/"
C = grpc.StatusCode
FULL, READ = "full-s3cret", "read-s3cret"


def _kv(keys: list[int], vals: list[float]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(vals, pa.float64())})


def _desc(name: str) -> bytes:
    return fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=[name]).SerializeToString()


def _schema_frame(schema: pa.Schema, *, table: str = "t", app_metadata: bytes | None = None) -> bytes:
    """The first DoPut message: descriptor and schema (and, optionally, the PutRequest)."""
    return frame(descriptor=_desc(table), header=pa.ipc.read_message(schema.serialize()).metadata,
                 app_metadata=app_metadata)


class Wire:
    """Raw gRPC calls on the server's one port, with an optional bearer token."""

    def __init__(self, channel: grpc.Channel, token: str | None = None) -> None:
        self.ch = channel
        self.md = [("authorization", f"Bearer {token}")] if token else None

    def handshake(self) -> list[fpb.HandshakeResponse]:
        call = self.ch.stream_stream(FLIGHT + "Handshake",
                                     request_serializer=fpb.HandshakeRequest.SerializeToString,
                                     response_deserializer=fpb.HandshakeResponse.FromString)
        return list(call(iter([fpb.HandshakeRequest(protocol_version=1)]), timeout=10,
                         metadata=self.md))

    def list_flights(self) -> list[str]:
        call = self.ch.unary_stream(FLIGHT + "ListFlights",
                                    request_serializer=fpb.Criteria.SerializeToString,
                                    response_deserializer=fpb.FlightInfo.FromString)
        return [i.flight_descriptor.path[0] for i in call(fpb.Criteria(), timeout=10,
                                                           metadata=self.md)]

    def info(self, name: str) -> fpb.FlightInfo:
        call = self.ch.unary_unary(FLIGHT + "GetFlightInfo",
                                   request_serializer=fpb.FlightDescriptor.SerializeToString,
                                   response_deserializer=fpb.FlightInfo.FromString)
        return call(fpb.FlightDescriptor.FromString(_desc(name)), timeout=10, metadata=self.md)

    def schema(self, name: str) -> pa.Schema:
        call = self.ch.unary_unary(FLIGHT + "GetSchema",
                                   request_serializer=fpb.FlightDescriptor.SerializeToString,
                                   response_deserializer=fpb.SchemaResult.FromString)
        res = call(fpb.FlightDescriptor.FromString(_desc(name)), timeout=10, metadata=self.md)
        return pa.ipc.read_schema(pa.py_buffer(res.schema))

    def get(self, ticket: bytes) -> pa.Table:
        call = self.ch.unary_stream(FLIGHT + "DoGet", request_serializer=fpb.Ticket.SerializeToString)
        dec = IpcDecoder(iter(list(call(fpb.Ticket(ticket=ticket), timeout=10, metadata=self.md))),
                         "DoGet")
        schema = dec.read_schema()
        batches = []
        while True:
            try:
                chunk = dec.read_chunk()
            except StopIteration:
                return pa.Table.from_batches(batches, schema)
            if chunk.data is not None:
                batches.append(chunk.data)

    def put(self, messages: list[bytes]) -> list[pb.PutAck]:
        call = self.ch.stream_stream(FLIGHT + "DoPut")
        return [pb.PutAck.FromString(fpb.PutResult.FromString(a).app_metadata)
                for a in call(iter(messages), timeout=10, metadata=self.md)]

    def subscribe(self, first: bytes) -> pb.UpdateMetadata:
        """Open a DoExchange with ``first`` as its only message; the first update's metadata."""
        call_ = self.ch.stream_stream(FLIGHT + "DoExchange")
        done = threading.Event()

        def requests() -> Iterator[bytes]:
            yield first
            done.wait(10)  # keep writing open: the subscription lasts while it is

        call = call_(requests(), timeout=10, metadata=self.md)
        try:
            # the schema, then the snapshot's first batch carrying its metadata
            msgs = [parse_flight_data(next(call)) for _ in range(2)]
            assert msgs[0].header is not None and msgs[1].app_metadata is not None
            meta = pb.UpdateMetadata.FromString(bytes(msgs[1].app_metadata))
            assert (msgs[1].header is not None) == (meta.num_added_batches > 0)
            return meta
        finally:
            done.set()
            call.cancel()

    def list_actions(self) -> list[str]:
        call = self.ch.unary_stream(FLIGHT + "ListActions", request_serializer=fpb.Empty.SerializeToString,
                                    response_deserializer=fpb.ActionType.FromString)
        return [a.type for a in call(fpb.Empty(), timeout=10, metadata=self.md)]

    def action(self, kind: str, body: Any = None) -> list[bytes]:
        call = self.ch.unary_stream(FLIGHT + "DoAction", request_serializer=fpb.Action.SerializeToString,
                                    response_deserializer=fpb.Result.FromString)
        raw = b"" if body is None else body.SerializeToString()
        return [r.body for r in call(fpb.Action(type=kind, body=raw), timeout=10,
                                     metadata=self.md)]

    def tables(self) -> tgrpc.TableServiceStub:
        return tgrpc.TableServiceStub(self.ch)

    def reflect(self) -> set[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(self.ch)
        [answer] = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]), timeout=10, metadata=self.md))
        return {s.name for s in answer.list_services_response.service}


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status ``call`` fails with; its message must be one bounded line."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    code, details = info.value.code(), info.value.details()
    assert "\n" not in details and len(details) <= MAX_MESSAGE, details[:300]
    return code, details


@pytest.fixture
def wire(server: TicktableServer) -> Iterator[Wire]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield Wire(ch)


@pytest.fixture
def kv(server: TicktableServer, graph: UpdateGraph) -> Any:
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    return t


def _create(name: str, schema: pa.Schema, kind: int, keys: tuple[str, ...] = (),
            capacity: int = 0) -> pb.CreateTableRequest:
    return pb.CreateTableRequest(name=name, schema=schema.serialize().to_pybytes(), kind=kind,
                                 keys=list(keys), capacity=capacity)


# ---------------------------------------------------------------------- issue #18, item 1
@pytest.mark.parametrize("garble", ["short", "truncated", "offsets", "header"])
def test_a_garbled_or_truncated_put_body_is_invalid_argument_naming_the_table(
        server, wire, graph, garble):
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    table = server.registry.create_source("s", schema, "keyed", keys=["k"]).table
    b = pa.record_batch({"k": pa.array([7, 8], pa.int64()), "s": ["ab", "cde"]}, schema=schema)
    [good] = batch_frames(schema, [b])
    real = parse_flight_data(good)
    assert real.header is not None and real.body is not None
    header, body = bytes(real.header), bytes(real.body)
    if garble == "short":
        body = body[:5]
    elif garble == "truncated":
        body = body[: len(body) // 2]
    elif garble == "offsets":  # the right length, but string offsets pointing anywhere
        body = b"\xff" * len(body)
    else:
        header = b"not a flatbuffer" * 4
    code, details = refused(lambda: wire.put([_schema_frame(schema, table="s"),
                                              frame(header=header, body=body)]))
    assert code == C.INVALID_ARGUMENT
    assert details.startswith("DoPut into 's': malformed")
    graph.run_cycle()
    assert table.size == 0  # nothing of it was written


def test_duplicate_column_names_are_refused_naming_the_column(server, wire, kv, client):
    dup = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("v", pa.float64())])
    b = pa.record_batch([pa.array([3], pa.int64()), pa.array([3.0]), pa.array([4.0])], schema=dup)
    code, details = refused(lambda: wire.put([_schema_frame(dup), *batch_frames(dup, [b])]))
    assert (code, details) == (C.INVALID_ARGUMENT, "DoPut into 't': column 'v' appears 2 times; "
                                                   "column names must be unique")
    # pyarrow's client sees the same refusal
    w, _ = client.do_put(fl.FlightDescriptor.for_path("t"), dup)
    with pytest.raises(pa.ArrowInvalid, match="column 'v' appears 2 times"):
        w.write_batch(b)
        w.close()
    # and a table cannot be created with them either
    code, details = refused(lambda: wire.action("create_table", _create(
        "d", dup, pb.TABLE_KIND_APPEND)))
    assert (code, details) == (C.INVALID_ARGUMENT, "table 'd': column 'v' appears 2 times; "
                                                   "column names must be unique")


@pytest.mark.parametrize("capacity", [2**62, MAX_RING_CAPACITY + 1, 0, -5])
def test_a_ring_capacity_out_of_bounds_is_invalid_argument(server, wire, capacity):
    schema = pa.schema([("x", pa.int64())])
    code, details = refused(lambda: wire.action("create_table", _create(
        "r", schema, pb.TABLE_KIND_RING, capacity=capacity)))
    assert code == C.INVALID_ARGUMENT
    assert details == (f"ring table 'r' needs a capacity of 1 to {MAX_RING_CAPACITY} rows, got "
                       f"{capacity} (a ring allocates its capacity at once)")
    assert wire.list_flights() == []
    wire.action("create_table", _create("r", schema, pb.TABLE_KIND_RING, capacity=1000))
    assert wire.list_flights() == ["r"]


@pytest.mark.parametrize("key_type", [pa.list_(pa.int64()), pa.struct([("a", pa.int64())]),
                                      pa.map_(pa.string(), pa.int64()), pa.null(),
                                      pa.dictionary(pa.int32(), pa.list_(pa.int8()))],
                         ids=["list", "struct", "map", "null", "dictionary-of-lists"])
def test_a_key_column_that_cannot_be_hashed_is_refused_at_create(server, wire, key_type):
    schema = pa.schema([("id", key_type), ("v", pa.float64())])
    code, details = refused(lambda: wire.action("create_table", _create(
        "k", schema, pb.TABLE_KIND_KEYED, keys=("id",))))
    assert code == C.INVALID_ARGUMENT
    assert details.startswith(f"keyed table 'k': key column 'id' has type {key_type}, which a "
                              f"key cannot have")
    assert wire.list_flights() == []  # not accepted to fail at the first write


@pytest.mark.parametrize("keys, message", [
    (("k", "k"), "keyed table 'k': key column 'k' is named 2 times in keys"),
    (("nope",), "keyed table 'k': key column 'nope' is not in the schema (k: int64, v: double)"),
    ((), "keyed table 'k' needs key columns (keys=...)"),
])
def test_bad_keys_are_refused_at_create_naming_them(server, wire, keys, message):
    code, details = refused(lambda: wire.action("create_table", _create(
        "k", KV, pb.TABLE_KIND_KEYED, keys=keys)))
    assert (code, details) == (C.INVALID_ARGUMENT, message)


def test_a_put_request_on_the_schema_message_is_honoured(server, wire, kv, graph):
    delete = pb.PutRequest(mode=pb.PUT_MODE_DELETE).SerializeToString()
    keys = pa.schema([("k", pa.int64())])
    body = pa.record_batch({"k": pa.array([1], pa.int64())})
    acks = wire.put([_schema_frame(keys, app_metadata=delete), *batch_frames(keys, [body])])
    assert [(a.rows, a.staged) for a in acks] == [(1, False)]
    graph.run_cycle()
    assert kv.to_arrow().column("k").to_pylist() == [2]  # a DELETE, not an upsert of the keys
    # sent twice (schema message and first batch) it is refused, not guessed
    code, details = refused(lambda: wire.put([_schema_frame(keys, app_metadata=delete),
                                              *batch_frames(keys, [body], first_metadata=delete)]))
    assert code == C.INVALID_ARGUMENT and details.startswith("DoPut into 't': a PutRequest came "
                                                             "with both")


def test_subscribe_and_descriptor_in_one_first_message_is_served(server, wire, kv):
    for request in (pb.SubscriptionRequest(), pb.SubscriptionRequest(table="t")):
        sub = pb.ClientMessage(subscribe=request).SerializeToString()
        meta = wire.subscribe(frame(descriptor=_desc("t"), app_metadata=sub))
        assert (meta.table_size, meta.num_added_batches) == (2, 1)
    sub = pb.ClientMessage(subscribe=pb.SubscriptionRequest()).SerializeToString()
    code, details = refused(lambda: wire.subscribe(frame(descriptor=_desc("nosuch"),
                                                         app_metadata=sub)))
    assert code == C.NOT_FOUND and details.startswith("no table 'nosuch'")


# ---------------------------------------------------------------------- issue #35, item 6
_SUBSCRIBE_T = pb.ClientMessage(subscribe=pb.SubscriptionRequest(table="t")).SerializeToString()
_NO_DESCRIPTOR = "DoExchange: the first message must carry a FlightDescriptor (PATH [table])"


@pytest.mark.parametrize("first", [
    b"",  # a FlightData without any field: no descriptor, no header, no body
    frame(header=pa.ipc.read_message(pa.schema([]).serialize()).metadata),  # begin(), no path
    frame(app_metadata=_SUBSCRIBE_T),  # a subscribe naming the table, but no descriptor
], ids=["empty", "schema", "subscribe"])
def test_a_first_exchange_message_without_a_descriptor_is_invalid_argument(
        server, wire, kv, client, first):
    # writing stays open (the stream was silent then) and writing finished
    code, details = refused(lambda: wire.subscribe(first))
    assert (code, details) == (C.INVALID_ARGUMENT, _NO_DESCRIPTOR)
    call = wire.ch.stream_stream(FLIGHT + "DoExchange")(iter([first]), timeout=10)
    code, details = refused(lambda: next(call))
    assert (code, details) == (C.INVALID_ARGUMENT, _NO_DESCRIPTOR)
    # the server serves on: the same subscribe with the descriptor, and pyarrow's client
    assert wire.subscribe(frame(descriptor=_desc("t"), app_metadata=_SUBSCRIBE_T)).table_size == 2
    sub = Sub(client, "t")
    sub.read()
    assert sub.view.to_arrow().num_rows == 2


def test_a_plain_ticket_naming_no_table_is_not_found(server, wire, kv, client):
    assert wire.get(b"t").num_rows == 2  # a plain name
    assert wire.get(pb.SnapshotRequest(table="t", columns=["v"]).SerializeToString()).num_columns == 1
    for ticket, name in ((b"nosuch", "nosuch"), ("tr\u00e4des".encode(), "tr\u00e4des"),
                         (pb.SnapshotRequest(table="gone").SerializeToString(), "gone")):
        code, details = refused(lambda t=ticket: wire.get(t))
        assert code == C.NOT_FOUND and details.startswith(f"no table {name!r} (tables: t)")
    with pytest.raises(KeyError, match="no table 'nosuch'"):  # pyarrow's NOT_FOUND
        client.do_get(fl.Ticket(b"nosuch")).read_all()
    # bytes that are neither text nor a SnapshotRequest: a malformed ticket
    code, details = refused(lambda: wire.get(b"\xff\xfe\x00garbage"))
    assert code == C.INVALID_ARGUMENT and details.startswith("DoGet ticket: malformed "
                                                             "SnapshotRequest")
    code, details = refused(lambda: wire.get(b""))
    assert code == C.INVALID_ARGUMENT and details.startswith("DoGet ticket names no table")


def test_commit_and_abort_of_an_unknown_write_id_are_not_found(server, wire, kv, graph):
    for commit in (pb.CommitRequest(write_id="nope", all_slots=True),
                   pb.CommitRequest(write_id="nope", slots=[pb.StageSlot(partition=2)]),
                   pb.CommitRequest(write_id="nope", all_slots=True, stream_id="q", batch_id=1,
                                    has_batch=True)):
        code, details = refused(lambda c=commit: wire.action("commit", c))
        assert code == C.NOT_FOUND and details.startswith("no write 'nope': ")
    code, details = refused(lambda: wire.action("abort", pb.AbortRequest(write_id="nope")))
    assert code == C.NOT_FOUND and details.startswith("no write 'nope' to abort")
    # ... and a batch sent under it afterwards is refused (a task outliving its aborted job)
    req = pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="nope").SerializeToString()
    b = pa.record_batch({"k": pa.array([9], pa.int64()), "v": [9.0]})
    code, details = refused(lambda: wire.put([_schema_frame(KV),
                                              *batch_frames(KV, [b], first_metadata=req)]))
    assert code == C.INVALID_ARGUMENT and "write 'nope' was aborted" in details
    # a known write commits and aborts as before; naming no slot is an empty write
    wire.put([_schema_frame(KV), *batch_frames(KV, [b], first_metadata=pb.PutRequest(
        mode=pb.PUT_MODE_UPSERT, write_id="w").SerializeToString())])
    wire.action("abort", pb.AbortRequest(write_id="w"))
    wire.action("abort", pb.AbortRequest(write_id="w"))  # twice: still known
    [raw] = wire.action("commit", pb.CommitRequest(write_id="spark-empty-job"))
    assert pb.CommitResult.FromString(raw).rows == 0
    graph.run_cycle()
    assert kv.to_arrow().column("k").to_pylist() == [1, 2]


def test_a_write_dropped_at_a_restart_stays_known_across_restarts(tmp_path):
    # a Spark driver committing after a restart learns its slots are gone (INVALID_ARGUMENT),
    # not that the write id is unknown; the server remembers it through checkpoints too
    def start() -> tuple[UpdateGraph, TicktableServer]:
        graph = UpdateGraph()
        return graph, TicktableServer(graph, ServerConfig(data_dir=tmp_path)).start()

    def action(srv: TicktableServer, kind: str, msg: Any) -> bytes | None:
        return srv.action(kind, msg.SerializeToString())

    graph, a = start()
    a.durability.create_table("t", KV, "keyed", keys=["k"], capacity=0, if_not_exists=False)
    a.puts.put("t", pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="w"),
               _kv([1], [1.0]).to_batches(), lambda ack: None)
    a.durability.close(checkpoint=False)  # a crash: the write is journaled, never committed
    a.shutdown()
    for clean in (True, False):  # a clean stop writes a checkpoint: the memory is in it
        graph, b = start()
        assert b.recovery is not None
        with pytest.raises(InputError, match=r"write 'w' has no slot\(s\) \(partition 0"):
            action(b, "commit", pb.CommitRequest(write_id="w", slots=[pb.StageSlot()]))
        with pytest.raises(WriteNotFound, match="no write 'other'"):
            action(b, "commit", pb.CommitRequest(write_id="other", slots=[pb.StageSlot()]))
        if clean:
            b.shutdown()
    raw = action(b, "commit", pb.CommitRequest(write_id="w", all_slots=True))
    assert raw is not None and pb.CommitResult.FromString(raw).rows == 0
    b.shutdown()


HUGE = [("x" * (5 << 20), "x"), ("\u00e9" * (5 << 20), "\u00e9"), ("\u4e2d" * (2 << 20), "\u4e2d")]


@pytest.mark.parametrize("text, char", HUGE, ids=["ascii", "latin", "cjk"])
def test_megabytes_of_input_get_a_bounded_answer(server, wire, kv, client, text, char):
    # without a bound, a non-ASCII message passes gRPC's header limit: the client would see
    # RESOURCE_EXHAUSTED "metadata size exceeds" instead of the error
    schema = pa.schema([("x", pa.int64())])
    head = char * 100
    cases = [
        (lambda: wire.action("create_table", _create(text, schema, pb.TABLE_KIND_APPEND)),
         C.INVALID_ARGUMENT, f"bad table name '{head}'... ({len(text)} characters)"),
        (lambda: wire.get(text.encode()), C.NOT_FOUND, f"no table '{head}'... ({len(text)} char"),
        (lambda: wire.info(text), C.NOT_FOUND, f"no table '{head}'..."),
        (lambda: wire.action("commit", pb.CommitRequest(write_id=text, all_slots=True)),
         C.NOT_FOUND, f"no write '{head}'..."),
        (lambda: wire.put([_schema_frame(KV, table=text)]), C.NOT_FOUND, f"no table '{head}'..."),
        (lambda: wire.action(text), C.INVALID_ARGUMENT, f"unknown action '{head}'..."),
    ]
    for call, code, start in cases:
        got, details = refused(call)
        assert (got, details[:len(start)]) == (code, start)
    with pytest.raises(KeyError, match="no table") as info:  # pyarrow's client alike
        client.get_flight_info(fl.FlightDescriptor.for_path(text))
    assert len(str(info.value)) < 3 * MAX_MESSAGE  # pyarrow repeats the message once


def test_a_long_message_is_cut_by_its_size_on_the_wire():
    from flight.errors import grpc_status

    for char in ("x", "\u00e9", "\u4e2d", "\U0001f600", "%"):
        _, message = grpc_status(InputError("column " + char * 100_000))
        wire_bytes = sum(1 if " " <= c <= "~" and c != "%" else 3 * len(c.encode())
                         for c in message)
        assert wire_bytes <= MAX_MESSAGE and message.endswith("more characters)")


# ---------------------------------------------------------------------- issue #18, item 7
@pytest.fixture
def guarded(graph: UpdateGraph) -> Iterator[TicktableServer]:
    srv = TicktableServer(graph, ServerConfig(token=FULL, read_token=READ)).start()
    t = srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(_kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    yield srv
    srv.shutdown()


_SUB = pb.ClientMessage(subscribe=pb.SubscriptionRequest()).SerializeToString()

#: What the read token may do: (name, call, check of its result).
READS: list[tuple[str, Callable[[Wire], Any], Callable[[Any], bool]]] = [
    ("Handshake", lambda w: w.handshake(), lambda r: len(r) == 1),
    ("ListFlights", lambda w: w.list_flights(), lambda r: r == ["t"]),
    ("GetFlightInfo", lambda w: w.info("t"), lambda r: r.total_records == 2),
    ("GetSchema", lambda w: w.schema("t"), lambda r: r.equals(KV)),
    ("DoGet", lambda w: w.get(b"t"), lambda r: r.num_rows == 2),
    ("DoExchange", lambda w: w.subscribe(frame(descriptor=_desc("t"), app_metadata=_SUB)),
     lambda r: r.table_size == 2),
    ("ListActions", lambda w: w.list_actions(), lambda r: "stats" in r),
    ("stats", lambda w: w.action("stats"),
     lambda r: [t.name for t in pb.Stats.FromString(r[0]).tables] == ["t"]),
    ("ListTables", lambda w: w.tables().ListTables(tpb.ListTablesRequest(), timeout=10,
                                                   metadata=w.md),
     lambda r: [t.name for t in r.tables] == ["t"]),
    ("reflection", lambda w: w.reflect(), lambda r: "ticktable_proto.v1.TableService" in r),
]

_ROW = pa.record_batch({"k": pa.array([5], pa.int64()), "v": [5.0]})

#: What only the full token may do: (name, call); each changes something when allowed.
WRITES: list[tuple[str, Callable[[Wire], Any]]] = [
    ("DoPut", lambda w: w.put([_schema_frame(KV), *batch_frames(KV, [_ROW])])),
    ("create_table", lambda w: w.action("create_table", _create("new", KV, pb.TABLE_KIND_APPEND))),
    ("CreateDerivedTable", lambda w: w.tables().CreateDerivedTable(
        tpb.CreateDerivedTableRequest(name="view", parent="t"), timeout=10, metadata=w.md)),
    ("commit", lambda w: w.action("commit", pb.CommitRequest(write_id="none"))),
    ("abort", lambda w: w.action("abort", pb.AbortRequest(write_id="staged"))),
    ("drop_table", lambda w: w.action("drop_table", pb.DropTableRequest(name="t"))),
    ("DropTable", lambda w: w.tables().DropTable(pb.DropTableRequest(name="t"), timeout=10,
                                                 metadata=w.md)),
]


@pytest.mark.parametrize("name, call, ok", READS, ids=[r[0] for r in READS])
def test_the_read_token_may_read(guarded, name, call, ok):
    with grpc.insecure_channel(f"127.0.0.1:{guarded.port}") as ch:
        assert ok(call(Wire(ch, READ)))
        assert ok(call(Wire(ch, FULL)))
        code, details = refused(lambda: call(Wire(ch)))
        assert code == C.UNAUTHENTICATED and "bearer token" in details
        code, _ = refused(lambda: call(Wire(ch, "wrong")))
        assert code == C.UNAUTHENTICATED


@pytest.mark.parametrize("name, call", WRITES, ids=[w[0] for w in WRITES])
def test_the_read_token_may_not_write(guarded, graph, name, call):
    with grpc.insecure_channel(f"127.0.0.1:{guarded.port}") as ch:
        before = Wire(ch, FULL).get(b"t")
        code, details = refused(lambda: call(Wire(ch, READ)))
        assert code == C.PERMISSION_DENIED and details.startswith("the read-only token may not ")
        assert name in details  # the method or action
        code, _ = refused(lambda: call(Wire(ch)))
        assert code == C.UNAUTHENTICATED
        graph.run_cycle()
        full = Wire(ch, FULL)
        assert full.list_flights() == ["t"] and full.get(b"t").equals(before)  # unchanged
        if name == "abort":  # the full token may: it needs a staged write to abort
            full.put([_schema_frame(KV), *batch_frames(KV, [_ROW], first_metadata=pb.PutRequest(
                mode=pb.PUT_MODE_UPSERT, write_id="staged").SerializeToString())])
        call(full)


def test_the_read_token_may_not_run_unknown_actions_or_ones_it_lacks(guarded):
    with grpc.insecure_channel(f"127.0.0.1:{guarded.port}") as ch:
        code, details = refused(lambda: Wire(ch, READ).action("nope"))
        assert (code, details) == (C.PERMISSION_DENIED, "the read-only token may not run action "
                                   "'nope': writes, creates, drops and compositions need the full "
                                   "token")
        code, _ = refused(lambda: Wire(ch, FULL).action("nope"))
        assert code == C.INVALID_ARGUMENT


def test_pyarrow_clients_see_permission_denied_as_unauthorized(guarded):
    c = fl.connect(guarded.location)
    read = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {READ}".encode())])
    assert c.do_get(fl.Ticket(b"t"), options=read).read_all().num_rows == 2
    w, _ = c.do_put(fl.FlightDescriptor.for_path("t"), KV, options=read)
    with pytest.raises(fl.FlightUnauthorizedError, match="read-only token may not call "
                                                         "/arrow.flight.protocol.FlightService/DoPut"):
        w.write_batch(_ROW)
        w.close()
    with pytest.raises(fl.FlightUnauthorizedError, match="run action 'drop_table'"):
        list(c.do_action(fl.Action("drop_table", b""), options=read))
    c.close()


@pytest.mark.parametrize("config, message", [
    (ServerConfig(read_token=READ), "a read token needs a token too"),
    (ServerConfig(token=FULL, read_token=FULL), "the read token must differ from the token"),
])
def test_a_read_token_needs_a_different_full_token(graph, config, message):
    with pytest.raises(InputError, match=message):
        TicktableServer(graph, config).start()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (as in test_tls.py)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return (d / "cert.pem").read_bytes(), (d / "key.pem").read_bytes()


def test_both_tokens_over_tls(graph, cert):
    crt, key = cert
    srv = TicktableServer(graph, ServerConfig(token=FULL, read_token=READ, tls_cert=crt,
                                              tls_key=key)).start()
    try:
        srv.registry.create_source("t", KV, "keyed", keys=["k"])
        creds = grpc.ssl_channel_credentials(root_certificates=crt)
        with grpc.secure_channel(f"127.0.0.1:{srv.port}", creds) as ch:
            read, full = Wire(ch, READ), Wire(ch, FULL)
            put = [_schema_frame(KV), *batch_frames(KV, [_ROW])]
            code, _ = refused(lambda: read.put(put))
            assert code == C.PERMISSION_DENIED
            assert [a.rows for a in full.put(put)] == [1]
            graph.run_cycle()
            assert read.get(b"t").num_rows == 1
            assert read.subscribe(frame(descriptor=_desc("t"), app_metadata=_SUB)).table_size == 1
            code, _ = refused(lambda: Wire(ch).get(b"t"))
            assert code == C.UNAUTHENTICATED
        c = fl.connect(srv.location, tls_root_certs=crt)
        opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {READ}".encode())])
        assert [f.descriptor.path[0] for f in c.list_flights(options=opts)] == [b"t"]
        with pytest.raises(fl.FlightUnauthorizedError):
            list(c.do_action(fl.Action("create_table", b""), options=opts))
        c.close()
    finally:
        srv.shutdown()
