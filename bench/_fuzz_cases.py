"""Fuzz cases for a live Ticktable server (#18 item 4): build, send, judge.

A *case* is one call of one method of the server's port with client bytes: valid
messages (tickets, action bodies, ``FlightData`` frames, Substrait filters, TableService
requests) built at random from the fixture's tables, then mutated (bit flips, truncation,
inserted and deleted bytes, interesting integers, protobuf fields swapped, renumbered,
duplicated or dropped, length prefixes made huge, frames dropped, repeated or reordered,
a frame's header and body mutated inside it: bench/_fuzz_mutate.py). The same generator serves
``tests/flight/test_fuzz.py``, where hypothesis drives ``rnd`` (``st.randoms()``: failures
shrink), and ``bench/fuzz.py`` (a seeded ``random.Random``, 100k cases).

Whatever the bytes, the server must answer with a specific status: never INTERNAL or
UNKNOWN (our bug), with details of one bounded line that hold no traceback and no file
path (``violations`` in bench/_fuzz_judge.py, which sends the cases). Writes, drops and replacements only ever name the fuzz tables
(:data:`FUZZ_TABLES` and the names in :data:`CREATED`); the watched tables are read only,
so a checker can model their contents exactly while the fuzz runs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench._fuzz_mutate import INTERESTING, maybe_mutate, mutate_bytes, mutate_frames, split_fields
from flight import substrait
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import flight_sql_pb2 as sqlpb
from flight.pb import table_service_pb2 as tpb
from flight.rpc.framing import batch_frames, frame, schema_frame
from flight.wire import ABORT, ACTIONS, COMMIT, CREATE_TABLE, DROP_TABLE, STATS

FLIGHT = "/arrow.flight.protocol.FlightService/"
TABLES = "/ticktable_proto.v1.TableService/"

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])
# no nested types: a keyed table cannot yet overwrite a list value (see test_fuzz.py)
WIDE = pa.schema([("k", pa.int64()), ("i", pa.int32()), ("b", pa.bool_()),
                  ("t", pa.timestamp("us")), ("d", pa.dictionary(pa.int32(), pa.string())),
                  ("bin", pa.binary())])

#: Read-only for the fuzz: a writer and subscribers check these exactly.
WATCHED = {"watched_keyed": ("keyed", KV, ["k"], 0), "watched_append": ("append", KV, [], 0)}
#: The tables fuzz cases write into, drop and recreate (name -> kind, schema, keys, capacity).
FUZZ_TABLES = {"fz_keyed": ("keyed", KV, ["k"], 0), "fz_append": ("append", KV, [], 0),
               "fz_ring": ("ring", KV, [], 64), "fz_wide": ("keyed", WIDE, ["k"], 0)}
#: Names fuzz cases may create (tables, derived tables) and so drop again.
CREATED = ("fz_new", "fz_new2", "fz_derived", "fz_derived2")
#: Write ids of staged writes: the cleanup aborts them.
WRITE_IDS = ("", "", "", "w1", "w2")
_BOGUS = ("", "nope", "x" * 300, "fz_\x00", "fz_keyed ", "täble", "FZ_KEYED")
_COLUMNS = ("k", "s", "v", "i", "b", "t", "d", "l", "bin", "zz", "", "__delete", "__diff",
            "__time", "count", "k ")

def all_tables() -> list[str]:
    return [*WATCHED, *FUZZ_TABLES]


# ------------------------------------------------------------------------- valid pieces
def _name(rnd: random.Random, *, writable: bool = False) -> str:
    c = rnd.random()
    if c < 0.75:
        return rnd.choice(list(FUZZ_TABLES) if writable else all_tables())
    return rnd.choice(CREATED) if c < 0.9 else rnd.choice(_BOGUS)


def _columns(rnd: random.Random) -> list[str]:
    return [rnd.choice(_COLUMNS) for _ in range(rnd.choice((0, 0, 1, 1, 2, 3)))]


def _int(rnd: random.Random) -> int:
    return rnd.choice((rnd.randint(-3, 20), rnd.choice(INTERESTING)))


_EXPRS: list[tuple[str, dict[str, Any], pa.Schema]] = [
    ("k > 5", {"f": pc.field("k") > 5}, KV),
    ("v < 0.5 and s valid", {"f": (pc.field("v") < 0.5) & pc.field("s").is_valid()}, KV),
    ("s == a", {"f": pc.field("s") == "a"}, KV),
    ("k + 1 (not boolean)", {"f": pc.field("k") + 1}, KV),
    ("two", {"a": pc.field("k") * 2, "b": pc.field("v") - 1.0}, KV),
    ("zz missing", {"f": pc.field("zz") > 1}, pa.schema([("zz", pa.int64())])),
    ("k as string", {"f": pc.field("k") == "1"}, pa.schema([("k", pa.string())])),
    ("k / 0", {"f": pc.divide(pc.field("k"), pc.scalar(0)) > 1}, KV),
    ("i > 1", {"f": pc.field("i") > 1}, WIDE),
    ("is_in", {"f": pc.field("k").isin([1, 2, 3])}, KV),
]
_SUBSTRAIT: list[bytes] | None = None


def substrait_messages() -> list[bytes]:
    """Valid Substrait ExtendedExpressions over the fuzz schemas (some do not fit them)."""
    global _SUBSTRAIT
    if _SUBSTRAIT is None:
        _SUBSTRAIT = [substrait.encode(exprs, schema) for _, exprs, schema in _EXPRS]
    return _SUBSTRAIT


def _substrait(rnd: random.Random) -> bytes:
    c = rnd.random()
    if c < 0.05:
        return b""
    if c < 0.1:
        return rnd.randbytes(rnd.randint(1, 40))
    return maybe_mutate(rnd, rnd.choice(substrait_messages()), 0.4)


_TYPES = (pa.int64(), pa.int32(), pa.int8(), pa.uint64(), pa.float64(), pa.float32(), pa.bool_(),
          pa.string(), pa.large_string(), pa.binary(), pa.timestamp("us"), pa.timestamp("ns", "UTC"),
          pa.date32(), pa.time64("us"), pa.duration("ms"), pa.decimal128(10, 2), pa.null(),
          pa.list_(pa.int64()), pa.struct([("a", pa.int64())]), pa.dictionary(pa.int32(), pa.string()),
          pa.map_(pa.string(), pa.int64()), pa.float16(), pa.binary(3))


def random_schema(rnd: random.Random) -> pa.Schema:
    n = rnd.randint(0, 4)
    names = [rnd.choice(_COLUMNS) for _ in range(n)]
    return pa.schema([(nm, rnd.choice(_TYPES)) for nm in names])


def _values(rnd: random.Random, typ: pa.DataType, n: int, nulls: bool) -> pa.Array:
    """``n`` values of ``typ`` (some null when ``nulls``), edge values included; all null
    for the types without a generator here."""
    if pa.types.is_dictionary(typ):
        return _values(rnd, typ.value_type, n, nulls).dictionary_encode().cast(typ)
    if pa.types.is_integer(typ):
        info = np.iinfo(typ.to_pandas_dtype())
        pool: tuple[Any, ...] = (int(info.min), int(info.max), 0, 1, 7, 42)
    elif pa.types.is_temporal(typ):
        width = typ.bit_width
        pool = (0, 1, -1, (1 << (width - 1)) - 1, -(1 << (width - 1)))
    elif typ in (pa.float32(), pa.float64()):
        pool = (0.5, -0.0, float("nan"), float("inf"), 1e308, 3.0)
    elif pa.types.is_boolean(typ):
        pool = (True, False)
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
        pool = ("a", "b", "", "\u00fc" * 3, "x" * 100)
    elif pa.types.is_binary(typ):
        pool = (b"", b"\x00", b"\xff\xfe", b"abc")
    elif pa.types.is_list(typ):
        pool = ([], [1], [1, 2, 3])
    else:
        return pa.nulls(n, typ)
    vals = [None if nulls and rnd.random() < 0.3 else rnd.choice(pool) for _ in range(n)]
    if pa.types.is_temporal(typ):
        ints = pa.array(vals, pa.int32() if typ.bit_width == 32 else pa.int64())
        return ints.view(typ)
    return pa.array(vals, typ)


def random_batch(rnd: random.Random, schema: pa.Schema, mode: int) -> pa.RecordBatch:
    """A batch for ``schema`` and put ``mode``, often wrong: a column missing, extra,
    renamed, retyped or duplicated; null keys; reserved columns of any type."""
    fields = list(schema)
    if mode == pb.PUT_MODE_DELETE and rnd.random() < 0.8:
        fields = fields[:1]
    if mode == pb.PUT_MODE_UPSERT and rnd.random() < 0.3:
        fields.append(pa.field("__delete", rnd.choice((pa.bool_(), pa.bool_(), pa.int64()))))
    if mode == pb.PUT_MODE_DIFF and rnd.random() < 0.8:
        fields.append(pa.field("__diff", rnd.choice((pa.int64(), pa.int64(), pa.int8(),
                                                     pa.uint64(), pa.float64()))))
        if rnd.random() < 0.3:
            fields.append(pa.field("__time", rnd.choice((pa.int64(), pa.string()))))
    for _ in range(rnd.choice((0, 0, 0, 1, 2))):
        i = rnd.randrange(len(fields) + 1)
        op = rnd.randrange(5)
        if op == 0 and fields:
            del fields[min(i, len(fields) - 1)]
        elif op == 1:
            fields.insert(i, pa.field(rnd.choice(_COLUMNS), rnd.choice(_TYPES)))
        elif op == 2 and fields:  # retype
            j = min(i, len(fields) - 1)
            fields[j] = pa.field(fields[j].name, rnd.choice(_TYPES))
        elif op == 3 and fields:  # duplicate
            fields.insert(i, rnd.choice(fields))
        elif op == 4 and fields:  # rename
            j = min(i, len(fields) - 1)
            fields[j] = pa.field(rnd.choice(_COLUMNS), fields[j].type)
    n = rnd.choice((0, 1, 2, 3, 10, 40))
    arrays = [_values(rnd, f.type, n, nulls=rnd.random() < 0.2) for f in fields]
    if (mode == pb.PUT_MODE_DIFF and arrays and fields[-1].name == "__diff"
            and (pa.types.is_integer(fields[-1].type) or pa.types.is_floating(fields[-1].type))):
        arrays[-1] = pa.array([rnd.choice((1, 1, -1, 0, 2)) for _ in range(n)]).cast(
            fields[-1].type, safe=False)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(
        [pa.field(f.name, a.type) for f, a in zip(fields, arrays, strict=True)]))


def _descriptor(rnd: random.Random, name: str) -> bytes:
    c = rnd.random()
    if c < 0.9:
        d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=[name])
    elif c < 0.94:
        d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.CMD, cmd=name.encode())
    elif c < 0.97:
        d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH, path=[name, name])
    else:
        d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH)
    return maybe_mutate(rnd, d.SerializeToString(), 0.05)


# --------------------------------------------------------------------------------- cases
@dataclass(slots=True)
class Case:
    """One call: ``method`` (a full gRPC path), ``shape`` (``uu`` unary-unary, ``us``
    unary-stream, ``ss`` stream-stream) and the request bytes (a list for streams)."""

    method: str
    shape: str
    request: bytes | list[bytes]
    what: str = ""

    @property
    def label(self) -> str:
        return f"{self.method.rsplit('/', 1)[1]}{':' + self.what if self.what else ''}"


def case_doget(rnd: random.Random) -> Case:
    c = rnd.random()
    if c < 0.25:
        ticket = _name(rnd).encode()
        what = "name"
    elif c < 0.9:
        req = pb.SnapshotRequest(table=_name(rnd), columns=_columns(rnd))
        if rnd.random() < 0.5:
            req.filter = _substrait(rnd)
        ticket = req.SerializeToString()
        what = "SnapshotRequest"
    else:
        ticket = rnd.randbytes(rnd.randint(0, 30))
        what = "random"
    ticket = maybe_mutate(rnd, ticket, 0.3)
    return Case(FLIGHT + "DoGet", "us", fpb.Ticket(ticket=ticket).SerializeToString(), what)


def _create_table_body(rnd: random.Random) -> bytes:
    if rnd.random() < 0.5:
        name = rnd.choice(("fz_new", "fz_new2"))
        kind, schema, keys, cap = rnd.choice(list(FUZZ_TABLES.values()))
        schema_bytes = schema.serialize().to_pybytes()
    else:
        name = _name(rnd, writable=True)
        schema = random_schema(rnd)
        schema_bytes = schema.serialize().to_pybytes()
        keys = schema.names[:rnd.randint(0, 2)]
        cap = _int(rnd)
    req = pb.CreateTableRequest(
        name=name, schema=maybe_mutate(rnd, schema_bytes, 0.3),
        kind=pb.TableKind.ValueType(rnd.choice((0, 1, 2, 1, 5))), keys=keys if rnd.random() < 0.8 else _columns(rnd),
        capacity=rnd.choice((cap, cap, _int(rnd))), if_not_exists=rnd.random() < 0.3)
    return req.SerializeToString()


def _commit_body(rnd: random.Random) -> bytes:
    req = pb.CommitRequest(write_id=rnd.choice(WRITE_IDS),
                           slots=[pb.StageSlot(partition=_int(rnd), attempt=_int(rnd))
                                  for _ in range(rnd.randint(0, 2))],
                           all_slots=rnd.random() < 0.5)
    if rnd.random() < 0.3:
        req.stream_id = rnd.choice(("s1", "s2", ""))
        req.batch_id = _int(rnd)
        req.has_batch = rnd.random() < 0.8
    return req.SerializeToString()


def case_doaction(rnd: random.Random) -> Case:
    kind = rnd.choice((CREATE_TABLE.name, CREATE_TABLE.name, DROP_TABLE.name, COMMIT.name,
                       ABORT.name, STATS.name, "", CREATE_TABLE.name.upper(), "nope"))
    if kind.lower() == CREATE_TABLE.name:
        body = _create_table_body(rnd)
    elif kind == DROP_TABLE.name:
        body = pb.DropTableRequest(name=_name(rnd, writable=True)).SerializeToString()
    elif kind == COMMIT.name:
        body = _commit_body(rnd)
    elif kind == ABORT.name:
        body = pb.AbortRequest(write_id=rnd.choice(WRITE_IDS)).SerializeToString()
    else:
        body = rnd.randbytes(rnd.randint(0, 20))
    if rnd.random() < 0.05:
        kind = mutate_bytes(rnd, kind.encode()).decode("utf-8", "replace")
    body = maybe_mutate(rnd, body, 0.4)
    return Case(FLIGHT + "DoAction", "us", fpb.Action(type=kind, body=body).SerializeToString(),
                kind if kind in {a.name for a in ACTIONS} else "unknown")


def _put_request(rnd: random.Random, kind: str) -> bytes:
    if rnd.random() < 0.85:
        mode = pb.PUT_MODE_APPEND if kind != "keyed" else rnd.choice((1, 1, 2, 3, 3))
    else:
        mode = rnd.choice((0, 1, 2, 3, 9))
    req = pb.PutRequest(mode=pb.PutMode.ValueType(mode), write_id=rnd.choice(WRITE_IDS))
    if req.write_id or rnd.random() < 0.1:
        req.partition, req.attempt = _int(rnd), _int(rnd)
    return maybe_mutate(rnd, req.SerializeToString(), 0.15)


def case_doput(rnd: random.Random) -> Case:
    name = _name(rnd, writable=True)
    kind, schema, _, _ = FUZZ_TABLES.get(name, FUZZ_TABLES["fz_keyed"])
    request = _put_request(rnd, kind)
    mode = pb.PutRequest.FromString(request).mode if _parses(pb.PutRequest, request) else 0
    batches = [random_batch(rnd, schema, mode)]
    while rnd.random() < 0.3:
        batches.append(random_batch(rnd, batches[0].schema, mode) if rnd.random() < 0.7
                       else batches[0])
    sch = batches[0].schema
    on_schema = rnd.random() < 0.3
    with_batch = not on_schema and rnd.random() < 0.9
    try:
        body = list(batch_frames(sch, [b for b in batches if b.schema.equals(sch)],
                                 first_metadata=request if with_batch else None))
    except (pa.ArrowException, ValueError):
        body = []
    first = frame(descriptor=_descriptor(rnd, name),
                  header=_schema_header(sch), app_metadata=request if on_schema else None)
    frames = [first, *body]
    if rnd.random() < 0.1:
        frames.insert(rnd.randint(1, len(frames)), frame(app_metadata=rnd.randbytes(8)))
    what = "valid"
    if rnd.random() < 0.6:
        frames = mutate_frames(rnd, frames, _foreign(rnd))
        what = "mutated"
    return Case(FLIGHT + "DoPut", "ss", frames, what)


def _schema_header(schema: pa.Schema) -> bytes:
    f = split_fields(schema_frame(schema))
    assert f is not None and f["header"] is not None
    return f["header"]


def _foreign(rnd: random.Random) -> list[bytes]:
    """Frames of other streams: a schema of another table, a dictionary batch, a metadata
    message, an empty frame."""
    b = random_batch(rnd, WIDE, pb.PUT_MODE_UPSERT)
    try:
        frames = [schema_frame(b.schema), *batch_frames(b.schema, [b])]
    except (pa.ArrowException, ValueError):
        frames = []
    return [*frames, frame(app_metadata=b"\x08\x01"), b""]


def _subscription(rnd: random.Random, name: str) -> pb.SubscriptionRequest:
    req = pb.SubscriptionRequest(table=name if rnd.random() < 0.7 else "", columns=_columns(rnd))
    if rnd.random() < 0.4:
        req.has_viewport = rnd.random() < 0.8
        for _ in range(rnd.randint(0, 3)):
            req.viewport.append(pb.PositionRange(begin=_int(rnd), end=_int(rnd)))
    if rnd.random() < 0.3:
        req.max_batch_rows = rnd.choice((0, 1, 2, 7, (1 << 32) - 1))
    if rnd.random() < 0.2:
        req.format = pb.DeltaFormat.ValueType(rnd.choice((0, 1, 1, 7)))
    if rnd.random() < 0.2:
        req.min_update_interval_ms = rnd.choice((0, 1, 50))
    if rnd.random() < 0.2:
        req.resume = True
        req.resume_epoch = rnd.choice(("", "x", "0" * 32))
        req.resume_sequence = rnd.choice((0, 1, 5, (1 << 64) - 1))
    return req


def _change(rnd: random.Random) -> pb.SubscriptionChange:
    ch = pb.SubscriptionChange(set_columns=rnd.random() < 0.5, columns=_columns(rnd),
                               set_viewport=rnd.random() < 0.5, has_viewport=rnd.random() < 0.5)
    for _ in range(rnd.randint(0, 2)):
        ch.viewport.append(pb.PositionRange(begin=_int(rnd), end=_int(rnd)))
    return ch


def case_doexchange(rnd: random.Random) -> Case:
    name = _name(rnd)
    sub = pb.ClientMessage(subscribe=_subscription(rnd, name)).SerializeToString()
    sub = maybe_mutate(rnd, sub, 0.25)
    desc = _descriptor(rnd, name) if rnd.random() < 0.9 else None
    if rnd.random() < 0.5:
        frames = [frame(descriptor=desc, app_metadata=sub)]
    else:
        empty = _schema_header(pa.schema([]) if rnd.random() < 0.8 else KV)
        frames = [frame(descriptor=desc, header=empty), frame(app_metadata=sub)]
    for _ in range(rnd.choice((0, 0, 1, 2))):
        msg = pb.ClientMessage(change=_change(rnd)) if rnd.random() < 0.85 else \
            pb.ClientMessage(subscribe=_subscription(rnd, name))
        frames.append(frame(app_metadata=maybe_mutate(rnd, msg.SerializeToString(), 0.2)))
    what = "valid"
    if rnd.random() < 0.4:
        frames = mutate_frames(rnd, frames, _foreign(rnd))
        what = "mutated"
    return Case(FLIGHT + "DoExchange", "ss", frames, what)


def _operation(rnd: random.Random) -> tpb.Operation:
    op = tpb.Operation()
    kind = rnd.choice(("where", "update", "select", "view", "drop_columns", "rename", "sort",
                       "slice", "join", "agg_by", "by_keys", "merge_with", "none"))
    if kind == "where":
        op.where.predicate = _substrait(rnd)
    elif kind in ("update", "select", "view", "drop_columns"):
        spec = getattr(op, kind)
        spec.SetInParent()
        if rnd.random() < 0.6:
            spec.expressions = _substrait(rnd)
        spec.columns.extend(_columns(rnd))
    elif kind == "rename":
        op.rename.SetInParent()
        for _ in range(rnd.randint(0, 2)):
            op.rename.mapping[rnd.choice(_COLUMNS)] = rnd.choice(_COLUMNS)
    elif kind == "sort":
        op.sort.by.extend(_columns(rnd))
        op.sort.descending.extend([rnd.random() < 0.5 for _ in range(rnd.randint(0, 2))])
    elif kind == "slice":
        op.slice.kind = rnd.choice(("head", "tail", "slice", "", "middle"))
        op.slice.start = _int(rnd)
        op.slice.stop = _int(rnd)
        op.slice.has_stop = rnd.random() < 0.5
    elif kind == "join":
        op.join.kind = rnd.choice(("natural", "exact", "inner", "left_outer", "cross", ""))
        op.join.right = _readable_small(rnd)
        op.join.on.extend(_columns(rnd) or ["k"])
        op.join.joins.extend(_columns(rnd))
    elif kind == "agg_by":
        op.agg_by.SetInParent()
        for _ in range(rnd.randint(0, 3)):
            a = op.agg_by.aggs.add(op=rnd.choice(("sum", "count", "min", "max", "mean", "std",
                                                   "var", "abs_sum", "median", "percentile",
                                                   "weighted_sum", "weighted_avg", "first", "last",
                                                   "count_distinct", "nope", "")),
                                   column=rnd.choice(_COLUMNS), name=rnd.choice(_COLUMNS),
                                   weight=rnd.choice(_COLUMNS))
            if rnd.random() < 0.5:
                a.p = rnd.choice((0.5, 0.0, 1.0, -1.0, 2.0, float("nan"), float("inf")))
        op.agg_by.by.extend(_columns(rnd))
    elif kind == "by_keys":
        op.by_keys.kind = rnd.choice(("first_by", "last_by", "count_by", "nope"))
        op.by_keys.by.extend(_columns(rnd))
        op.by_keys.name = rnd.choice(_COLUMNS)
    elif kind == "merge_with":
        op.merge_with = _readable_small(rnd)
    return op


def _readable_small(rnd: random.Random) -> str:
    """A table to read in a derived table: a bounded one (never the growing append tables,
    whose joins would grow quadratically over a long run)."""
    return rnd.choice(("fz_keyed", "fz_ring", "fz_wide", "watched_keyed", "fz_derived", "nope",
                       ""))


def case_table_service(rnd: random.Random) -> Case:
    c = rnd.random()
    if c < 0.75:
        req = tpb.CreateDerivedTableRequest(
            name=rnd.choice(("", "fz_derived", "fz_derived2", *CREATED[:2], "fz_keyed")),
            parent=_readable_small(rnd), replace=rnd.random() < 0.3,
            ops=[_operation(rnd) for _ in range(rnd.choice((0, 1, 1, 2, 3)))])
        if req.name == "":  # a server-picked name the cleanup could not tell from a user's
            req.name = rnd.choice(("fz_derived", "fz_derived2"))
        return Case(TABLES + "CreateDerivedTable", "uu",
                    maybe_mutate(rnd, req.SerializeToString(), 0.3), "create")
    if c < 0.9:
        body = pb.DropTableRequest(name=_name(rnd, writable=True)).SerializeToString()
        return Case(TABLES + "DropTable", "uu", maybe_mutate(rnd, body, 0.3), "drop")
    return Case(TABLES + "ListTables", "uu", maybe_mutate(rnd, b"", 0.5), "list")


def case_metadata(rnd: random.Random) -> Case:
    """The small Flight calls: GetFlightInfo, GetSchema, ListFlights, ListActions,
    Handshake, PollFlightInfo."""
    method = rnd.choice(("GetFlightInfo", "GetSchema", "ListFlights", "ListActions", "Handshake",
                         "PollFlightInfo"))
    if method in ("GetFlightInfo", "GetSchema", "PollFlightInfo"):
        return Case(FLIGHT + method, "uu", _descriptor(rnd, _name(rnd)))
    if method == "Handshake":
        msgs = [maybe_mutate(rnd, fpb.HandshakeRequest(protocol_version=_int(rnd) & 0xFFFF,
                                                       payload=rnd.randbytes(4))
                             .SerializeToString(), 0.3) for _ in range(rnd.randint(0, 2))]
        return Case(FLIGHT + method, "ss", msgs)
    return Case(FLIGHT + method, "us", maybe_mutate(rnd, b"", 0.3))


# ------------------------------------------------------------------------- Flight SQL
_READ_SQL = (
    "SELECT * FROM {t}", "SELECT k, v FROM {t} WHERE v > {n} ORDER BY k LIMIT 5",
    "SELECT s, count(*), sum(v), avg(v) FROM {t} GROUP BY s",
    "SELECT a.k, b.v FROM {t} a JOIN {u} b ON a.k = b.k", "SELECT * FROM {t} WHERE k = ?",
    "WITH c AS (SELECT k FROM {t}) SELECT count(*) FROM c", "SELECT {n} / 0",
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM information_schema.tables",
    "ATTACH '/tmp/fz.db'", "COPY {t} TO '/tmp/fz.csv'", "INSTALL httpfs", "SET threads = 64",
    "PRAGMA version", "SELECT * FROM duckdb_settings()", "SELECT 1; SELECT 2", "SELEC",
    "SELECT repeat('x', 100000000)", "SELECT * FROM range(100000000000)", "",
)
#: Updates name only the fuzz tables (the watched ones stay read only).
_WRITE_SQL = (
    "INSERT INTO {w} VALUES ({n}, 's', {n}.5)", "INSERT INTO {w} (k) SELECT k + 1000 FROM {w}",
    "DELETE FROM {w} WHERE k > {n}", "DELETE FROM {w}", "CREATE VIEW {c} AS SELECT * FROM {w}",
    "CREATE VIEW {c} AS SELECT s, sum(v) AS t FROM {w} GROUP BY s",
    "CREATE OR REPLACE VIEW {c} AS SELECT k FROM {w} WHERE v > {n}", "DROP VIEW {c}",
    "DROP VIEW IF EXISTS {c}", "INSERT INTO {w} VALUES (?, ?, ?)", "UPDATE {w} SET v = 1",
    "UPDATE {w} SET v = v + {n}, s = upper(s) WHERE k < {n}", "UPDATE {w} SET v = ? WHERE k = ?",
    "UPDATE {w} SET k = 1", "CREATE TABLE {c} (k BIGINT PRIMARY KEY, s VARCHAR, v DOUBLE)",
    "CREATE TABLE IF NOT EXISTS {c} AS SELECT * FROM {w} WHERE k < {n}",
    "CREATE OR REPLACE TABLE {c} (a INT DEFAULT 1)", "DROP TABLE {c}", "DROP TABLE IF EXISTS {c}",
    "INSERT INTO {w} VALUES ({n}, 's', 1.5) ON CONFLICT DO NOTHING",
    "INSERT INTO {w} VALUES ({n}, 't', 2.5), ({n}, 'u', 3.5) ON CONFLICT (k) DO UPDATE SET "
    "s = excluded.s", "INSERT OR IGNORE INTO {w} SELECT * FROM {w}", "TRUNCATE {c}",
    "DELETE FROM {w} USING {w} AS o WHERE {w}.k = o.k + {n} RETURNING *",
)


def _sql_text(rnd: random.Random, *, write: bool) -> str:
    fuzz = [n for n in FUZZ_TABLES if FUZZ_TABLES[n][1] is KV]
    text = rnd.choice(_WRITE_SQL if write else _READ_SQL).format(
        t=_name(rnd), u=_name(rnd), n=_int(rnd) % 1000, w=rnd.choice(fuzz),
        c=rnd.choice(CREATED))
    raw = maybe_mutate(rnd, text.encode(), 0.2)
    return raw.decode("utf-8", errors="replace")


def _any(message: Any) -> bytes:
    from google.protobuf import any_pb2

    out = any_pb2.Any()
    out.Pack(message)
    return out.SerializeToString()


def _sql_command(rnd: random.Random) -> bytes:
    c = rnd.random()
    if c < 0.45:
        msg: Any = sqlpb.CommandStatementQuery(query=_sql_text(rnd, write=False))
    elif c < 0.5:
        msg = sqlpb.CommandPreparedStatementQuery(prepared_statement_handle=rnd.randbytes(8))
    else:
        msg = rnd.choice((
            sqlpb.CommandGetSqlInfo(info=[_int(rnd) & 0xFFFFFFFF for _ in range(rnd.randint(0, 3))]),
            sqlpb.CommandGetCatalogs(), sqlpb.CommandGetDbSchemas(db_schema_filter_pattern="%"),
            sqlpb.CommandGetTables(table_name_filter_pattern=rnd.choice(("%", "fz_%", "_", "[")),
                                   include_schema=rnd.random() < 0.5,
                                   table_types=rnd.choice(([], ["VIEW"], ["x"]))),
            sqlpb.CommandGetTableTypes(), sqlpb.CommandGetPrimaryKeys(table=_name(rnd)),
            sqlpb.CommandGetXdbcTypeInfo(data_type=_int(rnd) & 0x7FFFFFFF),
            sqlpb.CommandGetImportedKeys(table=_name(rnd)),
            sqlpb.CommandGetCrossReference(pk_table=_name(rnd), fk_table=_name(rnd))))
    return maybe_mutate(rnd, _any(msg), 0.15)


def case_sql(rnd: random.Random) -> Case:
    """Flight SQL: commands in GetFlightInfo/GetSchema, tickets in DoGet, its actions, and
    updates, prepared parameters and ingestion in DoPut; SQL texts valid, hostile, mutated."""
    c = rnd.random()
    if c < 0.4:
        d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.CMD, cmd=_sql_command(rnd))
        method = rnd.choice(("GetFlightInfo", "GetFlightInfo", "GetSchema"))
        return Case(FLIGHT + method, "uu", d.SerializeToString(), "sql")
    if c < 0.55:
        ticket = rnd.choice((_any(sqlpb.TicketStatementQuery(statement_handle=rnd.randbytes(8))),
                             _any(sqlpb.TicketStatementQuery(statement_handle=b"count:x")),
                             _sql_command(rnd)))
        return Case(FLIGHT + "DoGet", "us", fpb.Ticket(ticket=maybe_mutate(rnd, ticket, 0.2))
                    .SerializeToString(), "sql")
    if c < 0.7:
        kind = rnd.choice(("CreatePreparedStatement", "ClosePreparedStatement",
                           "CancelFlightInfo", "SetSessionOptions", "GetSessionOptions",
                           "CloseSession"))
        if kind == "SetSessionOptions":
            options = fpb.SetSessionOptionsRequest()
            for name in rnd.sample(("schema", "catalog", "x", ""), rnd.randint(0, 3)):
                value = options.session_options[name]
                pick = rnd.randint(0, 4)
                if pick == 0:
                    value.string_value = rnd.choice(("main", "", "other", "\x00"))
                elif pick == 1:
                    value.bool_value = True
                elif pick == 2:
                    value.int64_value = _int(rnd)
                elif pick == 3:
                    value.string_list_value.values.extend(["main", "x"])
            body = options.SerializeToString()
        elif kind in ("GetSessionOptions", "CloseSession"):
            body = rnd.choice((b"", rnd.randbytes(rnd.randint(1, 8))))
        elif kind == "CreatePreparedStatement":
            body = _any(sqlpb.ActionCreatePreparedStatementRequest(
                query=_sql_text(rnd, write=rnd.random() < 0.3)))
        elif kind == "ClosePreparedStatement":
            body = _any(sqlpb.ActionClosePreparedStatementRequest(
                prepared_statement_handle=rnd.randbytes(8)))
        else:
            info = fpb.FlightInfo(endpoint=[fpb.FlightEndpoint(ticket=fpb.Ticket(ticket=_any(
                sqlpb.TicketStatementQuery(statement_handle=rnd.randbytes(8)))))])
            body = fpb.CancelFlightInfoRequest(info=info).SerializeToString()
        return Case(FLIGHT + "DoAction", "us", fpb.Action(
            type=kind, body=maybe_mutate(rnd, body, 0.2)).SerializeToString(), "sql")
    k = rnd.random()
    if k < 0.5:
        cmd: Any = sqlpb.CommandStatementUpdate(query=_sql_text(rnd, write=True))
    elif k < 0.6:
        cmd = sqlpb.CommandPreparedStatementQuery(prepared_statement_handle=rnd.randbytes(8))
    else:
        opts = sqlpb.CommandStatementIngest.TableDefinitionOptions(
            if_not_exist=rnd.randint(0, 2), if_exists=rnd.randint(0, 3))
        cmd = sqlpb.CommandStatementIngest(table=rnd.choice([*FUZZ_TABLES, *CREATED]),
                                           table_definition_options=opts)
    d = fpb.FlightDescriptor(type=fpb.FlightDescriptor.CMD,
                             cmd=maybe_mutate(rnd, _any(cmd), 0.1)).SerializeToString()
    schema = rnd.choice((KV, random_schema(rnd)))
    batches = [random_batch(rnd, schema, 0) for _ in range(rnd.randint(0, 2))]
    if batches:
        schema = batches[0].schema  # a batch may leave a column out or add one
    try:
        frames = list(batch_frames(schema, [b for b in batches if b.schema.equals(schema)]))
    except (pa.ArrowException, ValueError):
        frames = []
    msgs = [frame(descriptor=d, header=_schema_header(schema)), *frames]
    if rnd.random() < 0.15:  # the descriptor alone, as ADBC's ExecuteUpdate sends it
        msgs = [frame(descriptor=d)]
    return Case(FLIGHT + "DoPut", "ss", mutate_frames(rnd, msgs, _foreign(rnd)) if rnd.random() < 0.2 else msgs,
                "sql")


#: Case builders and their weights in a mixed run.
BUILDERS: dict[str, tuple[Callable[[random.Random], Case], int]] = {
    "DoGet": (case_doget, 3), "DoAction": (case_doaction, 3), "DoPut": (case_doput, 4),
    "DoExchange": (case_doexchange, 3), "TableService": (case_table_service, 3),
    "metadata": (case_metadata, 1), "FlightSQL": (case_sql, 3),
}


def random_case(rnd: random.Random) -> Case:
    names = list(BUILDERS)
    build = rnd.choices(names, weights=[BUILDERS[n][1] for n in names])[0]
    return BUILDERS[build][0](rnd)


def _parses(cls: Any, raw: bytes) -> bool:
    try:
        cls.FromString(raw)
    except Exception:
        return False
    return True


#: Request message class of each non-hand-framed method: a case whose outer message does
#: not parse is answered by grpcio's deserializer before any Ticktable code runs.
REQUEST_TYPES: dict[str, Any] = {
    FLIGHT + "DoGet": fpb.Ticket, FLIGHT + "DoAction": fpb.Action,
    FLIGHT + "GetFlightInfo": fpb.FlightDescriptor, FLIGHT + "GetSchema": fpb.FlightDescriptor,
    FLIGHT + "PollFlightInfo": fpb.FlightDescriptor, FLIGHT + "ListFlights": fpb.Criteria,
    FLIGHT + "ListActions": fpb.Empty, FLIGHT + "Handshake": fpb.HandshakeRequest,
    TABLES + "CreateDerivedTable": tpb.CreateDerivedTableRequest,
    TABLES + "DropTable": pb.DropTableRequest, TABLES + "ListTables": tpb.ListTablesRequest,
}


def undecodable(case: Case) -> bool:
    """Whether the case's request message (not a hand-framed stream) fails to parse."""
    cls = REQUEST_TYPES.get(case.method)
    if cls is None:
        return False
    reqs = case.request if isinstance(case.request, list) else [case.request]
    return not all(_parses(cls, r) for r in reqs)
