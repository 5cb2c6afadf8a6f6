"""The gRPC TableService over a real server, channel and update graph.

Every operation kind is built remotely and, beside it, locally with the engine's fluent API
on the same source tables; both then live through seeded cycles of appends, upserts and
deletes and must stay equal (values, order, types) after every cycle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.sources import AppendOnlyTable, KeyedTable
from engine.table import Table
from flight import substrait
from flight.pb import flight_pb2 as pb
from flight.pb import table_service_pb2 as tpb
from flight.pb import table_service_pb2_grpc as tgrpc
from flight.server import ServerConfig, TicktableServer
from flight.streams.registry import TableRegistry

TRADES = pa.schema([("Sym", pa.string()), ("Key", pa.int64()), ("Price", pa.float64()),
                    ("Qty", pa.int64())])
QUOTES = pa.schema([("Sym", pa.string()), ("Bid", pa.float64())])
SYMS = ["A", "B", "C", "D", "E"]
TOKEN = "s3cret"


def trades_rows(rng: random.Random, keys: list[int]) -> pa.Table:
    return pa.table({
        "Sym": [rng.choice(SYMS) for _ in keys],
        "Key": pa.array(keys, pa.int64()),
        "Price": pa.array([None if rng.random() < 0.1 else round(rng.uniform(1, 100), 2)
                           for _ in keys], pa.float64()),
        "Qty": pa.array([rng.randint(1, 9) for _ in keys], pa.int64()),
    }, schema=TRADES)


def quotes_rows(rng: random.Random, syms: list[str]) -> pa.Table:
    return pa.table({"Sym": syms, "Bid": [round(rng.uniform(1, 100), 2) for _ in syms]},
                    schema=QUOTES)


class Env:
    """A registry with three sources, a TableService on port 0 and a stub."""

    def __init__(self, token: str | None = None) -> None:
        self.graph = UpdateGraph(validate=True)
        self.registry = TableRegistry(self.graph)
        self.rng = random.Random(7)
        trades = self.registry.create_source("trades", TRADES, "keyed", keys=["Key"]).table
        quotes = self.registry.create_source("quotes", QUOTES, "keyed", keys=["Sym"]).table
        more = self.registry.create_source("more", TRADES, "append").table
        assert isinstance(trades, KeyedTable) and isinstance(quotes, KeyedTable)
        assert isinstance(more, AppendOnlyTable)
        self.trades, self.quotes, self.more = trades, quotes, more
        self.trades.upsert(trades_rows(self.rng, list(range(20))))
        self.quotes.upsert(quotes_rows(self.rng, SYMS))
        self.more.append(trades_rows(self.rng, list(range(100, 105))))
        self.graph.run_cycle()
        self.server = TicktableServer(self.graph, ServerConfig(token=token),
                                      registry=self.registry).start()
        self.port = self.server.port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = tgrpc.TableServiceStub(self.channel)
        self.metadata = [("authorization", f"Bearer {token}")] if token else []

    def tick(self) -> None:
        """One cycle of seeded changes to every source: upserts, new keys, deletes, appends."""
        rng = self.rng
        keys = rng.sample(range(30), 6)  # existing keys (modifies) and new ones (adds)
        self.trades.upsert(trades_rows(rng, keys))
        gone = rng.sample(range(30), 2)
        self.trades.delete(pa.table({"Key": pa.array(gone, pa.int64())}))
        self.quotes.upsert(quotes_rows(rng, rng.sample(SYMS, 2)))
        start = 200 + 10 * self.graph.step
        self.more.append(trades_rows(rng, list(range(start, start + rng.randint(0, 3)))))
        self.graph.run_cycle()

    def create(self, ops: list[tpb.Operation], *, parent: str = "trades", name: str = "",
               replace: bool = False) -> tpb.CreateDerivedTableResponse:
        req = tpb.CreateDerivedTableRequest(name=name, parent=parent, ops=ops, replace=replace)
        resp: tpb.CreateDerivedTableResponse = self.stub.CreateDerivedTable(
            req, metadata=self.metadata, timeout=10)
        return resp

    def close(self) -> None:
        self.channel.close()
        self.server.shutdown()


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def code_of(call: Callable[..., object], *args: object, **kwargs: object
            ) -> tuple[grpc.StatusCode, str]:
    """The status code and details of the error ``call(*args, **kwargs)`` must raise."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    err = info.value
    return err.code(), err.details()


# operation builders -------------------------------------------------------------------------
def where(expr: pc.Expression) -> tpb.Operation:
    return tpb.Operation(where=tpb.Where(predicate=substrait.encode({"p": expr}, TRADES)))


def named(kind: str, columns: Sequence[str] = (), schema: pa.Schema = TRADES,
          **exprs: pc.Expression) -> tpb.Operation:
    spec = tpb.NamedExpressions(columns=columns,
                                expressions=substrait.encode(exprs, schema) if exprs else b"")
    op = tpb.Operation()
    getattr(op, kind).CopyFrom(spec)
    return op


def slice_op(kind: str, start: int, stop: int | None = None) -> tpb.Operation:
    return tpb.Operation(slice=tpb.Slice(kind=kind, start=start, stop=stop or 0,
                                         has_stop=stop is not None))


def join_op(kind: str, right: str, on: Sequence[str], joins: Sequence[str] = ()) -> tpb.Operation:
    return tpb.Operation(join=tpb.Join(kind=kind, right=right, on=on, joins=joins))


def sort_op(by: Sequence[str], desc: Sequence[bool] = ()) -> tpb.Operation:
    return tpb.Operation(sort=tpb.Sort(by=by, descending=desc))


PX_QTY = pc.field("Price") * pc.field("Qty").cast(pa.float64(), safe=False)
# the positional trap: the predicate reads the 4th and the 1st column, the base schema
# of its Substrait form has them at positions 1 and 0
TRAP = (pc.field("Qty") > 3) & (pc.field("Sym") != "C")


@dataclass
class Case:
    ops: list[tpb.Operation]
    local: Callable[[Env], Table]


CASES: dict[str, Case] = {
    "where": Case([where(TRAP)], lambda e: e.trades.where(TRAP)),
    "where_price": Case([where(pc.field("Price") > 40.0)],
                        lambda e: e.trades.where(pc.field("Price") > 40.0)),
    "update": Case(
        [named("update", Notional=PX_QTY, Key2=pc.field("Key") + 1, Qty=pc.field("Qty") * 10)],
        lambda e: e.trades.update(Notional=PX_QTY, Key2=pc.field("Key") + 1,
                                  Qty=pc.field("Qty") * 10)),
    "select": Case(
        [named("select", ["Sym"], Px2=pc.field("Price") * 2.0, Q=pc.field("Qty"),
               Big=pc.field("Qty") > 4)],
        lambda e: e.trades.select("Sym", Px2=pc.field("Price") * 2.0, Q=pc.field("Qty"),
                                  Big=pc.field("Qty") > 4)),
    "view": Case(
        [named("view", ["Key", "Sym"], Half=pc.field("Price") / 2.0, N=PX_QTY)],
        lambda e: e.trades.view("Key", "Sym", Half=pc.field("Price") / 2.0, N=PX_QTY)),
    "select_columns_only": Case([named("select", ["Qty", "Sym"])],
                                lambda e: e.trades.select("Qty", "Sym")),
    "drop_columns": Case([named("drop_columns", ["Qty", "Sym"])],
                         lambda e: e.trades.drop_columns("Qty", "Sym")),
    "rename": Case([tpb.Operation(rename=tpb.Rename(mapping={"Price": "Px", "Sym": "S"}))],
                   lambda e: e.trades.rename_columns({"Price": "Px", "Sym": "S"})),
    "sort": Case([sort_op(["Sym", "Price"], [False, True])],
                 lambda e: e.trades.sort(["Sym", "Price"], [False, True])),
    "sort_one": Case([sort_op(["Qty"])], lambda e: e.trades.sort("Qty")),
    "head": Case([sort_op(["Price"]), slice_op("head", 5)],
                 lambda e: e.trades.sort("Price").head(5)),
    "tail": Case([slice_op("tail", 4)], lambda e: e.trades.tail(4)),
    "slice": Case([slice_op("slice", 2, 7)], lambda e: e.trades.slice(2, 7)),
    "slice_open": Case([slice_op("slice", -5)], lambda e: e.trades.slice(-5, None)),
    "natural_join": Case([join_op("natural", "quotes", ["Sym"], ["Bid"])],
                         lambda e: e.trades.natural_join(e.quotes, "Sym", ["Bid"])),
    "exact_join": Case([join_op("exact", "quotes", ["Sym"])],
                       lambda e: e.trades.exact_join(e.quotes, "Sym")),
    "inner_join": Case([join_op("inner", "more", ["Sym"], ["K2=Key", "Q2=Qty"])],
                       lambda e: e.trades.join(e.more, "Sym", ["K2=Key", "Q2=Qty"])),
    "left_outer_join": Case(
        [where(pc.field("Qty") > 5), join_op("left_outer", "more", ["Sym"], ["P2=Price"])],
        lambda e: e.trades.where(pc.field("Qty") > 5).left_outer_join(e.more, "Sym",
                                                                      ["P2=Price"])),
    "agg_by": Case(
        [tpb.Operation(agg_by=tpb.AggBy(by=["Sym"], aggs=[
            tpb.Aggregation(op="sum", column="Qty"),
            tpb.Aggregation(op="count", name="N"),
            tpb.Aggregation(op="mean", column="Price", name="AvgPx"),
            tpb.Aggregation(op="min", column="Price", name="MinPx"),
            tpb.Aggregation(op="max", column="Price", name="MaxPx"),
            tpb.Aggregation(op="std", column="Price", name="StdPx"),
            tpb.Aggregation(op="first", column="Key", name="FirstKey"),
            tpb.Aggregation(op="last", column="Key", name="LastKey"),
            tpb.Aggregation(op="count_distinct", column="Qty", name="Distinct"),
        ]))],
        lambda e: e.trades.agg_by([
            agg.sum("Qty"), agg.count("N"), agg.mean("Price", "AvgPx"),
            agg.min("Price", "MinPx"), agg.max("Price", "MaxPx"), agg.std("Price", "StdPx"),
            agg.first("Key", "FirstKey"), agg.last("Key", "LastKey"),
            agg.count_distinct("Qty", "Distinct")], "Sym")),
    "agg_by_registry_kinds": Case(
        [tpb.Operation(agg_by=tpb.AggBy(by=["Sym"], aggs=[
            tpb.Aggregation(op="var", column="Price", name="VarPx"),
            tpb.Aggregation(op="abs_sum", column="Qty", name="AbsQty"),
            tpb.Aggregation(op="weighted_sum", column="Price", weight="Qty", name="Notional"),
            tpb.Aggregation(op="weighted_avg", column="Price", weight="Qty", name="VWAP"),
            tpb.Aggregation(op="median", column="Price", name="Mid"),
            tpb.Aggregation(op="percentile", column="Price", p=0.9, name="P90"),
            tpb.Aggregation(op="percentile", column="Qty", p=0.0, name="P0"),
        ]))],
        lambda e: e.trades.agg_by([
            agg.var("Price", "VarPx"), agg.abs_sum("Qty", "AbsQty"),
            agg.weighted_sum("Price", "Qty", "Notional"), agg.weighted_avg("Price", "Qty", "VWAP"),
            agg.median("Price", "Mid"), agg.percentile("Price", 0.9, "P90"),
            agg.percentile("Qty", 0.0, "P0")], "Sym")),
    "agg_by_sorted": Case(
        [tpb.Operation(agg_by=tpb.AggBy(by=["Sym"], aggs=[
            tpb.Aggregation(op="sorted_last", column="Qty", order="Price", name="QtyAtHi"),
            tpb.Aggregation(op="sorted_first", column="Key", order="Price"),
        ]))],
        lambda e: e.trades.agg_by([
            agg.sorted_last("Qty", "Price", "QtyAtHi"), agg.sorted_first("Key", "Price")], "Sym")),
    "agg_total": Case(
        [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(op="sum", column="Qty"),
                                              tpb.Aggregation(op="count")]))],
        lambda e: e.trades.agg_by([agg.sum("Qty"), agg.count()])),
    "first_by": Case([tpb.Operation(by_keys=tpb.ByKeys(kind="first_by", by=["Sym"]))],
                     lambda e: e.trades.first_by("Sym")),
    "last_by": Case([tpb.Operation(by_keys=tpb.ByKeys(kind="last_by", by=["Sym", "Qty"]))],
                    lambda e: e.trades.last_by(["Sym", "Qty"])),
    "count_by": Case([tpb.Operation(by_keys=tpb.ByKeys(kind="count_by", by=["Sym"],
                                                       name="N"))],
                     lambda e: e.trades.count_by("N", "Sym")),
    "merge": Case([tpb.Operation(merge_with="more")], lambda e: e.trades.merge(e.more)),
    "chain": Case(
        [where(pc.field("Price") > 10.0), named("update", Notional=PX_QTY),
         tpb.Operation(merge_with="more_n"), sort_op(["Notional"], [True]), slice_op("head", 6)],
        lambda e: e.trades.where(pc.field("Price") > 10.0).update(Notional=PX_QTY)
        .merge(e.more.update(Notional=PX_QTY)).sort("Notional", True).head(6)),
    "no_ops": Case([], lambda e: e.trades),
}


def assert_same(remote: Table, local: Table, where_: str) -> None:
    got, want = remote.to_pandas(), local.to_pandas()
    pd.testing.assert_frame_equal(got, want, obj=where_)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_operation_matches_local_chain(env: Env, case: str) -> None:
    spec = CASES[case]
    if case == "chain":  # merge needs equal schemas: give "more" the same column remotely
        env.create([named("update", Notional=PX_QTY)], parent="more", name="more_n")
    resp = env.create(spec.ops)
    entry = env.registry.get(resp.name)
    local = spec.local(env)
    assert entry.kind == "derived"
    assert pa.ipc.read_schema(pa.py_buffer(resp.schema)).equals(local.schema)
    assert entry.table is not local
    assert_same(entry.table, local, f"{case} at creation")
    for cycle in range(6):
        env.tick()
        assert_same(entry.table, local, f"{case} after cycle {cycle}")
    assert env.trades.name == "trades"  # the parent kept its name


def test_join_and_merge_parents_are_registered(env: Env) -> None:
    resp = env.create([tpb.Operation(merge_with="trades"), join_op("natural", "quotes", ["Sym"])],
                      parent="more", name="j")
    assert resp.name == "j"
    assert env.registry.get("j").parents == ["more", "trades", "quotes"]
    assert "j" in env.registry.get("quotes").children


def test_server_picks_unique_names(env: Env) -> None:
    env.create([slice_op("head", 1)], name="derived_1")
    names = [env.create([slice_op("head", 2)]).name for _ in range(2)]
    assert names == ["derived_2", "derived_3"]


def test_positional_trap_with_full_base_schema(env: Env) -> None:
    """A third-party client serializing against the whole (reordered) schema."""
    reordered = pa.schema([TRADES.field("Qty"), TRADES.field("Price"), TRADES.field("Sym"),
                           TRADES.field("Key")])
    pred = (pc.field("Sym") == "A") | (pc.field("Qty") >= 7)
    buf = bytes(pa.substrait.serialize_expressions([pred], ["p"], reordered))
    resp = env.create([tpb.Operation(where=tpb.Where(predicate=buf))])
    local = env.trades.where(pred)
    table = env.registry.get(resp.name).table
    for _ in range(4):
        assert_same(table, local, "full base schema")
        env.tick()
    rows = table.to_pandas()
    assert ((rows.Sym == "A") | (rows.Qty >= 7)).all()


# lists and drops ------------------------------------------------------------------------------
def test_list_tables(env: Env) -> None:
    env.create([slice_op("head", 3)], name="top")
    resp = env.stub.ListTables(tpb.ListTablesRequest(), timeout=10)
    infos = {t.name: t for t in resp.tables}
    assert sorted(infos) == ["more", "quotes", "top", "trades"]
    assert infos["top"].kind == "derived" and infos["top"].parent == "trades"
    assert infos["top"].size == 3
    assert infos["trades"].kind == "keyed" and list(infos["trades"].keys) == ["Key"]
    assert infos["trades"].size == 20 and infos["trades"].parent == ""
    assert pa.ipc.read_schema(pa.py_buffer(infos["more"].schema)).equals(TRADES)


def test_drop_table(env: Env) -> None:
    env.create([slice_op("head", 3)], name="top")
    drop = env.stub.DropTable
    assert drop(pb.DropTableRequest(name="top"), timeout=10).dropped
    assert not drop(pb.DropTableRequest(name="top"), timeout=10).dropped
    assert "top" not in env.registry.names()
    assert "top" not in env.registry.get("trades").children
    env.tick()  # the graph keeps running without it


def test_drop_table_with_children_is_refused(env: Env) -> None:
    env.create([slice_op("head", 3)], name="top")
    code, msg = code_of(env.stub.DropTable, pb.DropTableRequest(name="trades"), timeout=10)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'trades'" in msg and "top" in msg and "drop them first" in msg
    assert "trades" in env.registry.names()


def test_replace(env: Env) -> None:
    env.create([slice_op("head", 3)], name="top")
    env.create([slice_op("head", 5)], name="top", replace=True)
    env.tick()
    assert env.registry.get("top").table.size == 5
    code, msg = code_of(env.create, [slice_op("head", 1)], parent="top", name="top",
                        replace=True)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "reads it" in msg


# errors --------------------------------------------------------------------------------------
def test_unknown_parent_is_not_found(env: Env) -> None:
    code, msg = code_of(env.create, [slice_op("head", 1)], parent="nope")
    assert code == grpc.StatusCode.NOT_FOUND
    assert "'nope'" in msg and "trades" in msg


def test_unknown_join_table_is_not_found(env: Env) -> None:
    code, msg = code_of(env.create, [join_op("natural", "nope", ["Sym"])])
    assert code == grpc.StatusCode.NOT_FOUND and "'nope'" in msg


def test_unknown_column_in_predicate(env: Env) -> None:
    wide = TRADES.append(pa.field("Pricee", pa.float64()))
    buf = substrait.encode({"p": pc.field("Pricee") > 1.0}, wide)
    nodes = len(env.graph.tables)
    code, msg = code_of(env.create, [slice_op("head", 9),
                                     tpb.Operation(where=tpb.Where(predicate=buf))])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'Pricee'" in msg and "operation 1 (where)" in msg and "Price" in msg
    assert len(env.graph.tables) == nodes  # the half-built chain was detached
    assert env.registry.names() == ["more", "quotes", "trades"]


def test_wrongly_typed_column_in_expression(env: Env) -> None:
    other = TRADES.set(3, pa.field("Qty", pa.float64()))
    buf = substrait.encode({"p": pc.field("Qty") > 1.0}, other)
    code, msg = code_of(env.create, [tpb.Operation(where=tpb.Where(predicate=buf))])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'Qty'" in msg and "int64" in msg and "double" in msg


def test_garbage_substrait(env: Env) -> None:
    for junk in (b"\x00garbage\xff", b"\x0a\x05hello"):
        code, msg = code_of(env.create, [tpb.Operation(where=tpb.Where(predicate=junk))])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "Substrait" in msg
        code, _ = code_of(env.create,
                          [tpb.Operation(update=tpb.NamedExpressions(expressions=junk))])
        assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_operations(env: Env) -> None:
    two = substrait.encode({"a": pc.field("Qty") > 1, "b": pc.field("Qty") < 5}, TRADES)
    price = substrait.encode({"p": pc.field("Price") * 2.0}, TRADES)
    bad = {
        "empty": [tpb.Operation()],
        "two predicates": [tpb.Operation(where=tpb.Where(predicate=two))],
        "not boolean": [tpb.Operation(where=tpb.Where(predicate=price))],
        "slice kind": [slice_op("middle", 1)],
        "join kind": [join_op("cross", "quotes", ["Sym"])],
        "agg op": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(op="mode",
                                                                        column="Qty")]))],
        "agg no p": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(op="percentile",
                                                                          column="Qty")]))],
        "agg p range": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="percentile", column="Qty", p=1.5)]))],
        "agg no weight": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="weighted_avg", column="Price")]))],
        "agg weight column": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="weighted_sum", column="Price", weight="Nope")]))],
        "agg extra p": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="median", column="Price", p=0.5)]))],
        "agg column": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(op="sum",
                                                                            column="Nope")]))],
        "agg no order": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="sorted_last", column="Qty")]))],
        "agg extra order": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="max", column="Qty", order="Price")]))],
        "agg order column": [tpb.Operation(agg_by=tpb.AggBy(aggs=[tpb.Aggregation(
            op="sorted_first", column="Qty", order="Nope")]))],
        "sort column": [sort_op(["Nope"])],
        "drop column": [named("drop_columns", ["Nope"])],
        "by kind": [tpb.Operation(by_keys=tpb.ByKeys(kind="median_by", by=["Sym"]))],
        "no parent": [],
    }
    for what, ops in bad.items():
        parent = "" if what == "no parent" else "trades"
        code, msg = code_of(env.create, ops, parent=parent)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (what, code, msg)
        assert msg, what
    assert env.registry.names() == ["more", "quotes", "trades"]


def test_duplicate_name_already_exists(env: Env) -> None:
    env.create([slice_op("head", 1)], name="top")
    code, msg = code_of(env.create, [slice_op("head", 2)], name="top")
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert "'top'" in msg and "replace" in msg
    code, _ = code_of(env.create, [slice_op("head", 2)], name="trades")
    assert code == grpc.StatusCode.ALREADY_EXISTS


def test_failed_parent_is_failed_precondition(env: Env) -> None:
    top = env.registry.get("trades").table
    top.failure = RuntimeError("boom")
    code, msg = code_of(env.create, [slice_op("head", 1)])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "'trades'" in msg


# auth and health -----------------------------------------------------------------------------
@pytest.fixture
def secured() -> Iterator[Env]:
    e = Env(token=TOKEN)
    yield e
    e.close()


def test_token_required(secured: Env) -> None:
    req = tpb.ListTablesRequest()
    for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", TOKEN)]):
        code, msg = code_of(secured.stub.ListTables, req, metadata=metadata, timeout=10)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in msg
    code, _ = code_of(secured.stub.CreateDerivedTable,
                      tpb.CreateDerivedTableRequest(parent="trades"), timeout=10)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert secured.registry.names() == ["more", "quotes", "trades"]
    ok = secured.stub.ListTables(req, metadata=secured.metadata, timeout=10)
    assert len(ok.tables) == 3
    assert secured.create([slice_op("head", 2)]).name == "derived_1"


def test_health_needs_no_token(secured: Env) -> None:
    stub = health_pb2_grpc.HealthStub(secured.channel)
    for service in ("", "ticktable_proto.v1.TableService"):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
