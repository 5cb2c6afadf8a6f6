"""Limits (#18 item 3): each is refused RESOURCE_EXHAUSTED in one line, and nothing more.

Per limit, over raw gRPC on a real server (the exact code and message) and with pyarrow's
Flight client where users meet it (``ArrowInvalid``): the message names the table or
column, the limit's value and the ``ticktable serve`` flag; nothing of the refused request
is applied, and the server serves on. Then gRPC's own receive limit, and a durable server
restarted with other limits (it replays under the limits each record was journaled with).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import LimitExceeded
from engine.graph import UpdateGraph
from flight import substrait
from flight.errors import MAX_MESSAGE
from flight.ingest.value_sizes import check_values
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.pb import table_service_pb2_grpc as tgrpc
from flight.rpc.framing import batch_frames, frame, parse_flight_data
from flight.server import ServerConfig, TicktableServer
from flight.streams.per_client import SubscriptionsPerClient, client_of

FLIGHT = "/arrow.flight.protocol.FlightService/"
C = grpc.StatusCode
KV = pa.schema([("k", pa.int64()), ("s", pa.string())])


# ------------------------------------------------------------------------------ helpers
class Wire:
    """Raw gRPC calls on a server's one port: exact status codes and messages."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.ch = channel

    def action(self, kind: str, body: object) -> list[bytes]:
        call = self.ch.unary_stream(FLIGHT + "DoAction",
                                    request_serializer=fpb.Action.SerializeToString,
                                    response_deserializer=fpb.Result.FromString)
        raw = body.SerializeToString()  # type: ignore[attr-defined]
        return [r.body for r in call(fpb.Action(type=kind, body=raw), timeout=10)]

    def create(self, name: str, schema: pa.Schema, kind: int = pb.TABLE_KIND_APPEND,
               keys: tuple[str, ...] = ()) -> None:
        self.action("create_table", pb.CreateTableRequest(
            name=name, schema=schema.serialize().to_pybytes(), kind=kind, keys=list(keys)))

    def put(self, table: str, schema: pa.Schema, batches: list[pa.RecordBatch],
            request: pb.PutRequest | None = None) -> list[pb.PutAck]:
        desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=[table])
        first = frame(descriptor=desc.SerializeToString(),
                      header=pa.ipc.read_message(schema.serialize()).metadata)
        meta = request.SerializeToString() if request is not None else None
        call = self.ch.stream_stream(FLIGHT + "DoPut")
        return [pb.PutAck.FromString(fpb.PutResult.FromString(a).app_metadata)
                for a in call(iter([first, *batch_frames(schema, batches, meta)]), timeout=10)]

    def derive(self, request: tpb.CreateDerivedTableRequest) -> str:
        return str(tgrpc.TableServiceStub(self.ch).CreateDerivedTable(request, timeout=10).name)


class Subscribed:
    """A raw DoExchange subscription held open until :meth:`close`."""

    def __init__(self, ch: grpc.Channel, table: str) -> None:
        self._done = threading.Event()
        desc = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=[table])
        sub = pb.ClientMessage(subscribe=pb.SubscriptionRequest(table=table))
        first = frame(descriptor=desc.SerializeToString(), app_metadata=sub.SerializeToString())

        def requests() -> Iterator[bytes]:
            yield first
            self._done.wait(30)  # writing stays open: the subscription lasts while it does

        self.call = ch.stream_stream(FLIGHT + "DoExchange")(requests(), timeout=30)

    def first(self) -> bytes:
        """The stream's first message (the schema): it was accepted."""
        return bytes(next(self.call))

    def close(self) -> None:
        self._done.set()
        self.call.cancel()


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status ``call`` fails with; its message is one bounded line."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    code, details = info.value.code(), info.value.details()
    assert "\n" not in details and "Traceback" not in details and len(details) <= MAX_MESSAGE
    return code, details


def _eventually(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``cond`` held within ``timeout`` s (a closed stream ends on the server's time)."""
    done = threading.Event()
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        done.wait(0.02)
    return True


@pytest.fixture
def graph() -> UpdateGraph:
    return UpdateGraph(validate=True)


@pytest.fixture
def limited(graph: UpdateGraph) -> Iterator[TicktableServer]:
    """A server with small limits."""
    cfg = ServerConfig(max_tables=3, max_columns=4, max_value_bytes=1000,
                       max_subscriptions_per_client=2, max_staged_bytes_per_write=4000,
                       max_put_batch_bytes=10_000, max_metadata_bytes=500)
    srv = TicktableServer(graph, cfg).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def wire(limited: TicktableServer) -> Iterator[Wire]:
    with grpc.insecure_channel(f"127.0.0.1:{limited.port}") as ch:
        yield Wire(ch)


def _rows(srv: TicktableServer, name: str) -> list[dict[str, object]]:
    return srv.registry.get(name).table.to_arrow().to_pylist()


def _serving(srv: TicktableServer, wire: Wire) -> None:
    """The server still takes writes and answers snapshots."""
    if "alive" not in srv.registry.names():
        wire.create("alive", pa.schema([("x", pa.int64())]))
    before = srv.registry.get("alive").table.size
    wire.put("alive", pa.schema([("x", pa.int64())]), [pa.record_batch({"x": [1]})])
    srv.graph.run_cycle()
    assert srv.registry.get("alive").table.size == before + 1


# ------------------------------------------------------------------- columns per table
def test_a_table_of_too_many_columns_is_refused_at_create(limited, wire):
    wide = pa.schema([(f"c{i}", pa.int64()) for i in range(5)])
    code, details = refused(lambda: wire.create("wide", wide))
    assert code == C.RESOURCE_EXHAUSTED
    assert details == ("table 'wide' would have 5 columns, above the limit of 4 (max_columns; "
                       "ticktable serve --max-columns N); use fewer columns or split the table")
    assert "wide" not in limited.registry.names()
    wire.create("four", pa.schema([(f"c{i}", pa.int64()) for i in range(4)]))  # at the limit
    _serving(limited, wire)


def test_a_derived_table_of_too_many_columns_is_refused(limited, wire, graph):
    four = pa.schema([(f"c{i}", pa.int64()) for i in range(4)])
    wire.create("four", four)
    ops = [tpb.Operation(update=tpb.NamedExpressions(
        expressions=substrait.encode({"c4": pc.field("c0") + 1}, four)))]
    code, details = refused(lambda: wire.derive(tpb.CreateDerivedTableRequest(
        parent="four", name="five", ops=ops)))
    assert code == C.RESOURCE_EXHAUSTED
    assert details.startswith("table 'five' would have 5 columns, above the limit of 4 "
                              "(max_columns; ticktable serve --max-columns N)")
    assert limited.registry.names() == ["four"]
    assert limited.registry.get("four").children == set()  # nothing registered
    _serving(limited, wire)



# ------------------------------------------------------------------- tables per server
def test_tables_past_the_limit_are_refused_and_a_drop_makes_room(limited, wire):
    schema = pa.schema([("x", pa.int64())])
    for name in ("a", "b", "c"):
        wire.create(name, schema)
    code, details = refused(lambda: wire.create("d", schema))
    assert code == C.RESOURCE_EXHAUSTED
    assert details == ("cannot create table 'd': the server holds 3 tables, the limit of 3 "
                       "(max_tables; ticktable serve --max-tables N); drop tables no longer "
                       "needed")
    code, details = refused(lambda: wire.derive(tpb.CreateDerivedTableRequest(parent="a",
                                                                              name="view")))
    assert code == C.RESOURCE_EXHAUSTED and details.startswith("cannot create table 'view'")
    wire.action("create_table", pb.CreateTableRequest(  # asking for one that exists is fine
        name="a", schema=schema.serialize().to_pybytes(), if_not_exists=True))
    assert limited.registry.names() == ["a", "b", "c"]
    wire.action("drop_table", pb.DropTableRequest(name="c"))
    wire.create("d", schema)
    assert limited.registry.names() == ["a", "b", "d"]


# ---------------------------------------------------------------- string/binary values
VALUE_CASES = {
    "string": pa.array(["ok", "x" * 1001]),
    "binary": pa.array([b"ok", b"x" * 1001]),
    "large_string": pa.array(["ok", "x" * 1001], pa.large_string()),
    "large_binary": pa.array([b"ok", b"x" * 1001], pa.large_binary()),
    "dictionary": pa.array(["ok", "x" * 1001]).dictionary_encode(),
    "list": pa.array([["ok"], ["a", "x" * 1001]]),
    "struct": pa.array([{"f": "ok"}, {"f": "x" * 1001}]),
}


@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_a_batch_with_a_value_past_the_limit_is_refused_naming_table_and_column(
        limited, wire, case):
    values = VALUE_CASES[case]
    schema = pa.schema([("k", pa.int64()), ("s", values.type)])
    wire.create("t", schema)
    ok = pa.record_batch([pa.array([1]), values.slice(0, 1)], schema=schema)
    bad = pa.record_batch([pa.array([2, 3]), values], schema=schema)
    code, details = refused(lambda: wire.put("t", schema, [ok, bad]))
    assert code == C.RESOURCE_EXHAUSTED
    assert details == ("table 't': column 's' holds a value of 1001 bytes, above the limit of "
                       "1000 (max_value_bytes; ticktable serve --max-value-bytes N); send "
                       "smaller values")
    limited.graph.run_cycle()
    assert [r["k"] for r in _rows(limited, "t")] == [1]  # the batch before stays, not the bad one
    _serving(limited, wire)


def test_values_at_the_limit_and_nulls_pass_and_pyarrow_clients_see_arrow_invalid(limited,
                                                                                   wire):
    wire.create("t", KV, pb.TABLE_KIND_KEYED, keys=("k",))
    at_limit = pa.record_batch({"k": [1, 2], "s": ["x" * 1000, None]}, schema=KV)
    assert wire.put("t", KV, [at_limit], pb.PutRequest(mode=pb.PUT_MODE_UPSERT))[0].rows == 2
    client = fl.connect(limited.location)
    w, _ = client.do_put(fl.FlightDescriptor.for_path("t"), KV)
    with pytest.raises(pa.ArrowInvalid, match="column 's' holds a value of 1001 bytes"):
        w.write_batch(pa.record_batch({"k": [3], "s": ["y" * 1001]}, schema=KV))
        w.close()
    client.close()
    limited.graph.run_cycle()
    assert sorted(r["k"] for r in _rows(limited, "t")) == [1, 2]


def test_check_values_sees_slices_maps_and_views_and_skips_other_types():
    big = "x" * 11
    assert check_values("t", pa.table({"s": pa.array(["a", big]).slice(0, 1)}), 10) is None
    m = pa.array([[("k", big)], [("k", "v")]], pa.map_(pa.string(), pa.string()))
    assert check_values("t", pa.table({"m": m.slice(1)}), 10) is None
    for arr in (m, pa.array([big], pa.string_view()), pa.array([[big]], pa.list_(pa.string(), 1))):
        with pytest.raises(LimitExceeded, match="column 'c' holds a value of 11 bytes"):
            check_values("t", pa.table({"c": arr}), 10)
    check_values("t", pa.table({"n": pa.array([10**9]), "f": [1.5]}), 1)  # no strings: nothing
    check_values("t", pa.table({"s": [big]}), None)  # no limit


def test_check_values_takes_a_table_within_the_limit_whole_without_looking_into_it():
    """A table whose buffers together fit the limit passes at once: no value of it, in a
    dictionary, a view's data, a list, a struct or a map, can be longer than them."""
    big = "x" * 11
    m = pa.array([[("k", big)]], pa.map_(pa.string(), pa.string()))
    arrays = [pa.array([big]), pa.array([big.encode()], pa.large_binary()),
              pa.array([big]).dictionary_encode(), pa.array([big * 2], pa.string_view()),
              pa.array([[big]], pa.list_(pa.string())), m,
              pa.array([{"s": big}], pa.struct([("s", pa.string())]))]
    for arr in arrays:
        table = pa.table({"c": arr})
        total = table.get_total_buffer_size()
        longest = 22 if pa.types.is_string_view(arr.type) else 11
        assert total >= longest, arr.type  # the bound the shortcut relies on
        check_values("t", table, total)  # within: passes without a look
        with pytest.raises(LimitExceeded, match="column 'c' holds a value of"):
            check_values("t", table, 10)  # past it: looked into, and refused



@settings(max_examples=1500, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.text(max_size=12), st.binary(max_size=12)), max_size=30),
       large=st.booleans(), start=st.integers(0, 30), length=st.integers(0, 30),
       limit=st.integers(0, 40), chunks=st.integers(1, 3))
def test_check_values_refuses_exactly_the_values_past_the_limit(values, large, start, length,
                                                                   limit, chunks):
    # the span shortcut (offsets: all values together within the limit) must not change a
    # verdict: refused iff one value, of this slice only, is longer than the limit
    text = all(v is None or isinstance(v, str) for v in values)
    typ = ((pa.large_string() if large else pa.string()) if text
           else (pa.large_binary() if large else pa.binary()))
    vals = [v.encode() if isinstance(v, str) and not text else v for v in values]
    arr = pa.array(vals, typ).slice(start, length)
    pieces = [arr.slice(i * len(arr) // chunks, len(arr) // chunks + 1) for i in range(chunks)]
    col = pa.chunked_array([p for p in pieces if len(p)] or [arr], typ)
    longest = max((len(v.encode() if isinstance(v, str) else v)
                   for v in col.to_pylist() if v is not None), default=0)
    if longest > limit:
        with pytest.raises(LimitExceeded, match=f"holds a value of {longest} bytes"):
            check_values("t", pa.table({"c": col}), limit)
    else:
        check_values("t", pa.table({"c": col}), limit)

# ------------------------------------------------------------------------ message size
def test_a_batch_past_max_put_batch_bytes_is_refused_naming_the_table(limited, wire):
    schema = pa.schema([("x", pa.int64())])
    wire.create("t", schema)
    big = pa.record_batch({"x": pa.array(range(2000), pa.int64())})  # 16 000 bytes
    code, details = refused(lambda: wire.put("t", schema, [big]))
    assert code == C.RESOURCE_EXHAUSTED
    assert details == ("DoPut into 't': record batch of 16000 bytes exceeds the limit of 10000 "
                       "(max_put_batch_bytes; ticktable serve --max-message-bytes N); send "
                       "smaller batches")
    limited.graph.run_cycle()
    assert limited.registry.get("t").table.size == 0
    _serving(limited, wire)


def test_metadata_past_its_limit_is_resource_exhausted(limited, wire):
    wire.create("t", KV, pb.TABLE_KIND_KEYED, keys=("k",))
    request = pb.PutRequest(mode=pb.PUT_MODE_UPSERT, write_id="w" * 600)
    code, details = refused(lambda: wire.put(
        "t", KV, [pa.record_batch({"k": [1], "s": ["a"]}, schema=KV)], request))
    assert code == C.RESOURCE_EXHAUSTED
    assert details.startswith("DoPut into 't': metadata of ")
    assert details.endswith(" bytes exceeds the limit of 500 "
                            "(ServerConfig.max_metadata_bytes); send less metadata")


def test_a_message_past_grpcs_receive_limit_is_resource_exhausted_and_logged_once(
        limited, wire, caplog):
    # the limit is max_put_batch_bytes + max_metadata_bytes + 1 MiB; gRPC answers itself
    schema = pa.schema([("x", pa.string())])
    wire.create("t", schema)
    huge = pa.record_batch({"x": ["y" * (2 << 20)]})
    with caplog.at_level(logging.INFO):
        code, details = refused(lambda: wire.put("t", schema, [huge]))
        client = fl.connect(limited.location)
        w, _ = client.do_put(fl.FlightDescriptor.for_path("t"), schema)
        with pytest.raises(pa.ArrowInvalid, match="resource exhausted.*larger than max"):
            w.write_batch(huge)
            w.close()
        client.close()
        _serving(limited, wire)
    assert code == C.RESOURCE_EXHAUSTED
    assert details.startswith("SERVER: Received message larger than max (")
    assert limited.registry.get("t").table.size == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no "internal error"
    # one start and one end line per call. gRPC's aio server shows the handler a refused
    # message as the end of the client's messages, and tells the call's end apart from a
    # normal one only sometimes before the handler returns (measured: neither cancelled()
    # nor done() is set at that end), so the end line reads "ended by the client (... larger
    # than gRPC's receive limit ...)" or "done"
    lines = [r.getMessage() for r in caplog.records if r.name == "ticktable.calls"
             and "call DoPut" in r.getMessage()]
    starts = [m for m in lines if re.fullmatch(r"call DoPut from \S+", m)]
    ends = [m for m in lines if m not in starts]
    assert len(starts) == len(ends) >= 2, lines
    assert all(re.fullmatch(r"call DoPut from \S+ (done in|ended by the client after) "
                            r"[\d.]+ s( \(it cancelled, or sent a message larger than "
                            r"gRPC's receive limit: RESOURCE_EXHAUSTED\))?", m) for m in ends), ends


# -------------------------------------------------------------- subscriptions per client
def test_subscriptions_past_the_limit_per_client_are_refused_until_one_closes(limited, wire):
    wire.create("t", KV)
    with grpc.insecure_channel(f"127.0.0.1:{limited.port}") as other:  # another connection
        subs = [Subscribed(wire.ch, "t"), Subscribed(other, "t")]
        try:
            for s in subs:
                assert parse_flight_data(s.first()).header is not None  # the schema: accepted
            third = Subscribed(wire.ch, "t")
            code, details = refused(third.first)
            assert code == C.RESOURCE_EXHAUSTED
            assert details == ("subscription to 't' refused: client 127.0.0.1 has 2 "
                               "subscriptions open, the limit of 2 "
                               "(max_subscriptions_per_client; ticktable serve "
                               "--max-subscriptions-per-client N); close one first")
            third.close()
            _serving(limited, wire)
            subs.pop().close()
            assert _eventually(lambda: limited.subscriptions_per_client.count("127.0.0.1") == 1)
            subs.append(Subscribed(wire.ch, "t"))
            assert parse_flight_data(subs[-1].first()).header is not None
        finally:
            for s in subs:
                s.close()
    assert _eventually(lambda: limited.subscriptions_per_client.count("127.0.0.1") == 0)


def test_a_refused_subscription_counts_nothing():
    per = SubscriptionsPerClient(1)
    per.acquire("h", "subscription to 't'")
    with pytest.raises(LimitExceeded, match="client h has 1 subscriptions open"):
        per.acquire("h", "subscription to 't'")
    per.acquire("other", "subscription to 't'")  # per client address
    per.release("h")
    per.acquire("h", "subscription to 't'")
    assert (per.count("h"), per.count("other"), per.count("nobody")) == (1, 1, 0)
    assert client_of("ipv4:10.0.0.7:5123") == "10.0.0.7"
    assert client_of("ipv6:[::1]:5123") == "[::1]"


# ---------------------------------------------------------- staged bytes per transaction
def test_a_write_past_its_staged_bytes_is_refused_and_others_are_not(limited, wire):
    wire.create("t", pa.schema([("x", pa.int64())]))
    schema = pa.schema([("x", pa.int64())])
    batch = pa.record_batch({"x": pa.array(range(200), pa.int64())})  # 1600 bytes

    def hold(write_id: str, n: int, partition: int = 0) -> list[pb.PutAck]:
        return wire.put("t", schema, [batch] * n,
                        pb.PutRequest(write_id=write_id, partition=partition))

    assert len(hold("w", 2)) == 2  # 3200 bytes held
    code, details = refused(lambda: hold("w", 1, partition=1))
    assert code == C.RESOURCE_EXHAUSTED
    assert details == ("write 'w' into table 't': a batch of 1600 bytes would make it hold "
                       "4800 bytes uncommitted, above the limit of 4000 "
                       "(max_staged_bytes_per_write; ticktable serve "
                       "--max-staged-bytes-per-write N); commit smaller writes; nothing of "
                       "the batch was staged")
    assert len(hold("other", 2)) == 2  # the limit is per write
    [raw] = wire.action("commit", pb.CommitRequest(write_id="w", all_slots=True))
    assert pb.CommitResult.FromString(raw).rows == 400  # the refused batch is not in it
    limited.graph.run_cycle()
    assert limited.registry.get("t").table.size == 400
    assert limited.staging.staged_bytes == 3200  # "other" only


# ------------------------------------------------------------- a restart, other limits
def _start(data_dir: Path, **limits: int) -> TicktableServer:
    return TicktableServer(UpdateGraph(), ServerConfig(data_dir=data_dir, **limits)).start()


def test_a_restart_with_other_limits_keeps_what_was_accepted_and_not_what_was_refused(
        tmp_path):
    schema = pa.schema([("x", pa.int64())])
    wide = pa.schema([(f"c{i}", pa.int64()) for i in range(3)])
    a = _start(tmp_path, max_tables=2, max_columns=3, max_staged_bytes_per_write=2000)
    with grpc.insecure_channel(f"127.0.0.1:{a.port}") as ch:
        w = Wire(ch)
        w.create("a", wide)
        w.create("b", schema)
        assert refused(lambda: w.create("c", schema))[0] == C.RESOURCE_EXHAUSTED
        batch = pa.record_batch({"x": pa.array(range(200), pa.int64())})  # 1600 bytes
        w.put("b", schema, [batch], pb.PutRequest(write_id="w"))
        assert refused(lambda: w.put("b", schema, [batch], pb.PutRequest(
            write_id="w", partition=1)))[0] == C.RESOURCE_EXHAUSTED
        w.action("commit", pb.CommitRequest(write_id="w", all_slots=True))
    a.durability.close(checkpoint=False)  # a crash: the journal is replayed
    a.shutdown()

    # lower limits: everything accepted comes back
    b = _start(tmp_path, max_tables=1, max_columns=1, max_staged_bytes_per_write=10)
    assert b.registry.names() == ["a", "b"] and b.registry.get("b").table.size == 200
    with grpc.insecure_channel(f"127.0.0.1:{b.port}") as ch:
        code, details = refused(lambda: Wire(ch).create("c", schema))
        assert code == C.RESOURCE_EXHAUSTED and "holds 2 tables, the limit of 1" in details
    b.durability.close(checkpoint=False)
    b.shutdown()

    # higher limits: what was refused stays refused
    c = _start(tmp_path, max_tables=10, max_columns=10, max_staged_bytes_per_write=1 << 20)
    assert c.registry.names() == ["a", "b"] and c.registry.get("b").table.size == 200
    c.shutdown()


def test_the_server_passes_its_limits_on(limited):
    assert (limited.registry.max_tables, limited.registry.max_columns) == (3, 4)
    assert limited.staging.max_staged_bytes_per_write == 4000
    assert limited.puts.max_value_bytes == 1000 and limited.subscriptions_per_client.limit == 2
    defaults = TicktableServer(UpdateGraph(), ServerConfig())
    assert (defaults.registry.max_tables, defaults.registry.max_columns) == (10_000, 4096)
    assert defaults.puts.max_value_bytes == 64 << 20
    assert defaults.staging.max_staged_bytes_per_write == 1 << 30
    assert defaults.subscriptions_per_client.limit == 1000
    defaults.shutdown()
