"""Multi-table subscriptions (docs/protocol.md §7.11) driven with plain pyarrow.flight: one
stream, every table's messages of a step together and an end-of-step marker; coalescing over
the same steps for every table; resume per table; errors."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from engine.ops.aggregate import agg
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import (
    ReferenceView,
    StreamEnded,
    group_schemas,
    read_group_message,
)
from flight.streams.group import GroupMember
from tests.flight.conftest import OPEN

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def kv(keys, vals) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array([f"s{k}" for k in keys]),
                     "v": pa.array(vals, pa.float64())})


class GroupSub:
    """A raw multi-table subscriber: one DoExchange, one ReferenceView per table, applied a
    whole group at a time (at its end-of-step marker)."""

    def __init__(self, client: fl.FlightClient, *requests: pb.SubscriptionRequest) -> None:
        self.writer, self.reader = client.do_exchange(fl.FlightDescriptor.for_path("group"))
        OPEN.append(self)  # closed by tests/flight/conftest.py's fixtures
        msg = pb.ClientMessage(subscribe_group=pb.GroupSubscriptionRequest(tables=requests))
        self.writer.begin(pa.schema([]))
        self.writer.write_metadata(pa.py_buffer(msg.SerializeToString()))
        self.schemas = group_schemas(self.reader.schema)
        self.views = [ReferenceView(s) for s in self.schemas]
        self.metas: list[pb.UpdateMetadata] = []  # of the last group

    def read_group(self) -> int:
        """Read and apply one group; returns its step. Checks that every message of the
        group is at the marker's step, and that no table appears twice in it."""
        group = []
        while True:
            try:
                msg = read_group_message(self.reader, self.schemas)
            except StreamEnded:
                self.writer.done_writing()  # the protocol: finish writing, then read the status
                self.reader.read_chunk()  # raises the call's error status
                raise
            if msg.meta.end_of_step:
                break
            group.append(msg)
        step = msg.meta.step
        assert all(m.meta.step == step for m in group), [m.meta.step for m in group]
        tables = [m.meta.group_table for m in group]
        assert len(set(tables)) == len(tables), tables
        for m in group:
            self.views[m.meta.group_table].apply(m)
        self.metas = [m.meta for m in group]
        return step

    def changed(self) -> list[int]:
        return [m.group_table for m in self.metas]

    def close(self) -> None:
        try:
            self.writer.done_writing()
        except Exception:
            pass
        self.reader.cancel()


def req(table: str, **fields: Any) -> pb.SubscriptionRequest:
    return pb.SubscriptionRequest(table=table, **fields)


@pytest.fixture
def tables(server, graph):
    """``t`` (keyed), ``w = t.where(v > 2)``, ``a = t.agg_by(sum v, count by s)``, ``u``."""
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    u = server.registry.create_source("u", KV, "keyed", keys=["k"]).table
    server.registry.add("w", t.where(pc.field("v") > 2), "derived", parents=["t"])
    server.registry.add("a", t.agg_by([agg.sum("v"), agg.count("n")], by="s"), "derived",
                        parents=["t"])
    t.upsert(kv([1, 2, 3], [1.0, 2.0, 3.0]))
    u.upsert(kv([7], [7.0]))
    graph.run_cycle()
    return t, u


def current(server, name: str) -> pa.Table:
    return server.registry.get(name).table.to_arrow()


def assert_views(server, sub: GroupSub, names: list[str]) -> None:
    for view, name in zip(sub.views, names, strict=True):
        assert view.to_arrow().equals(current(server, name)), name


def test_first_group_then_one_group_per_changed_step(server, client, graph, tables):
    t, u = tables
    names = ["t", "w", "a", "u"]
    sub = GroupSub(client, *(req(n) for n in names))
    assert sub.schemas == [server.registry.get(n).table.schema for n in names]
    assert sub.read_group() == graph.step
    assert sub.changed() == [0, 1, 2, 3] and all(m.is_snapshot for m in sub.metas)
    assert_views(server, sub, names)
    t.upsert(kv([4], [4.0]))
    graph.run_cycle()
    assert sub.read_group() == graph.step
    assert sub.changed() == [0, 1, 2]  # u did not change: nothing of it
    assert all(m.coalesced == 1 and not m.is_snapshot for m in sub.metas)
    assert_views(server, sub, names)
    graph.run_cycle()  # nothing changes: no group at all
    u.upsert(kv([8], [8.0]))
    graph.run_cycle()
    assert sub.read_group() == graph.step
    assert sub.changed() == [3]
    t.upsert(kv([3], [0.5]))  # leaves w: w removes, a modifies, t modifies
    graph.run_cycle()
    assert sub.read_group() == graph.step and sub.changed() == [0, 1, 2]
    assert_views(server, sub, names)


def test_columns_filters_and_a_table_twice(server, client, graph, tables):
    t, _ = tables
    big = pb.SubscriptionRequest(table="t", filter=_filter(server, "t", pc.field("v") >= 3))
    sub = GroupSub(client, req("t", columns=["v"]), big, req("a", columns=["s", "v"]))
    sub.read_group()
    t.upsert(kv([5, 1], [5.0, 1.5]))
    graph.run_cycle()
    step = sub.read_group()
    assert step == graph.step and sub.changed() == [0, 1, 2]
    assert sub.views[0].to_arrow().equals(current(server, "t").select(["v"]))
    rows = current(server, "t")
    assert sub.views[1].to_arrow().equals(rows.filter(pc.field("v") >= 3))
    assert sub.views[2].to_arrow().equals(current(server, "a").select(["s", "v"]))


def _filter(server, name: str, expr: pc.Expression) -> bytes:
    from flight import substrait

    return substrait.encode({"filter": expr}, server.registry.get(name).table.schema)


def test_slow_client_gets_the_same_steps_composed_for_every_table(server, client, graph,
                                                                   tables):
    t, u = tables
    names = ["t", "w", "a", "u"]
    sub = GroupSub(client, req("t", min_update_interval_ms=400), req("w"), req("a"), req("u"))
    sub.read_group()
    first = graph.step
    for i in range(5):  # within the interval: one group composing all five steps
        t.upsert(kv([10 + i], [10.0 + i]))
        if i == 3:
            u.upsert(kv([9], [9.0]))
        graph.run_cycle()
    assert sub.read_group() == graph.step == first + 5
    counts = {names[m.group_table]: m.coalesced for m in sub.metas}
    assert counts == {"t": 5, "w": 5, "a": 5, "u": 1}
    members = [s for s in server.subscriptions if isinstance(s, GroupMember)]
    assert {m.entry.name: m.coalesced for m in members} == {"t": 4, "w": 4, "a": 4, "u": 0}
    assert {m.step for m in members} == {graph.step}  # every table at the group's step
    assert_views(server, sub, names)


def test_resume_each_table_from_its_sequence(server, client, graph, tables):
    t, u = tables
    names = ["t", "a", "u"]
    sub = GroupSub(client, *(req(n) for n in names))
    sub.read_group()
    views = sub.views
    sub.close()
    for i in range(3):  # missed while disconnected
        t.upsert(kv([20 + i], [1.0]))
        graph.run_cycle()
    resume = [req(n, resume=True, resume_epoch=server.registry.get(n).publisher.epoch,
                  resume_sequence=v.sequence) for n, v in zip(names, views, strict=True)]
    resume[2].resume_epoch = "another"  # u: an epoch the server does not have
    again = GroupSub(client, *resume)
    again.views = views  # the state the first stream left
    assert again.read_group() == graph.step
    results = {names[m.group_table]: (m.resume, m.coalesced) for m in again.metas}
    assert results == {"t": (pb.RESUME_DELTAS, 3), "a": (pb.RESUME_DELTAS, 3),
                       "u": (pb.RESUME_SNAPSHOT, 0)}
    assert_views(server, again, names)
    t.upsert(kv([1], [9.0]))
    graph.run_cycle()
    assert again.read_group() == graph.step and again.changed() == [0, 1]
    assert_views(server, again, names)


def _refused(client, *requests: pb.SubscriptionRequest) -> Exception:
    """The error status of a refused group, as pyarrow raises it (the reading of the
    schema raises it: the server sends none)."""
    with pytest.raises((fl.FlightError, pa.ArrowException)) as info:
        sub = GroupSub(client, *requests)
        sub.read_group()
    return info.value


def test_errors_before_the_stream(server, client, tables):
    err = _refused(client, req("t"), req("nope"))
    assert isinstance(err, KeyError) and "no table 'nope'" in str(err)  # NOT_FOUND
    err = _refused(client, req("t"), req("u", has_viewport=True))
    assert "tables[1] ('u') has a viewport" in str(err) and isinstance(err, pa.ArrowInvalid)
    err = _refused(client, req("t", format=pb.DELTA_FORMAT_TRIPLES))
    assert "DELTA_FORMAT_UPDATES only" in str(err)
    err = _refused(client, req("t", columns=["zz"]))
    assert "table 't' has no column(s) ['zz']" in str(err)
    err = _refused(client)
    assert "holds 0 tables" in str(err)
    err = _refused(client, req(""))
    assert "tables[0].table is empty" in str(err)
    assert "Traceback" not in str(err)
    sub = GroupSub(client, req("t"))  # the server keeps serving
    sub.read_group()


def test_a_change_ends_the_stream(server, client, graph, tables):
    sub = GroupSub(client, req("t"), req("u"))
    sub.read_group()
    msg = pb.ClientMessage(change=pb.SubscriptionChange(set_columns=True))
    sub.writer.write_metadata(pa.py_buffer(msg.SerializeToString()))
    with pytest.raises(pa.ArrowInvalid, match="takes no SubscriptionChange"):
        sub.read_group()


def test_a_dropped_table_ends_the_stream_as_for_one_table(server, client, graph, tables):
    sub = GroupSub(client, req("t"), req("u"))
    sub.read_group()
    server.registry.drop("u")
    with pytest.raises(KeyError, match="table 'u' was dropped"):
        sub.read_group()


def test_subscribers_are_counted_per_table_and_limited(graph):
    from flight.server import ServerConfig, TicktableServer

    srv = TicktableServer(graph, ServerConfig(max_subscriptions_per_client=2)).start()
    client = fl.connect(srv.location)
    try:
        srv.registry.create_source("t", KV, "keyed", keys=["k"])
        srv.registry.create_source("u", KV, "keyed", keys=["k"])
        sub = GroupSub(client, req("t"), req("u"))
        sub.read_group()
        counts = {s.name: s.subscribers for s in srv.stats().tables}
        assert counts == {"t": 1, "u": 1}
        with pytest.raises(pa.ArrowInvalid, match="has 2 subscriptions open"):
            GroupSub(client, req("t")).read_group()
        sub.close()
    finally:
        while OPEN:
            OPEN.pop().close()
        client.close()
        srv.shutdown()


def test_a_table_failing_mid_stream_ends_it_as_for_one_table(server, client, graph, tables):
    t, _ = tables
    ratio = pc.Expression._call("divide", [pc.field("k"), pc.field("v").cast("int64")])
    server.registry.add("bad", t.where(ratio > 0), "derived", parents=["t"])
    sub = GroupSub(client, req("t"), req("bad"))
    sub.read_group()
    t.upsert(kv([9], [0.0]))  # 9 / 0: integer division by zero fails 'bad' in this cycle
    graph.run_cycle()
    with pytest.raises(pa.ArrowInvalid, match="table 'bad' failed: .*divide by zero"):
        while True:
            sub.read_group()


def test_dictionary_columns_travel_in_the_union(server, client, graph):
    schema = pa.schema([("k", pa.int64()), ("d", pa.dictionary(pa.int32(), pa.string()))])
    t = server.registry.create_source("dict", schema, "keyed", keys=["k"]).table
    u = server.registry.create_source("plain", KV, "keyed", keys=["k"]).table
    t.upsert(pa.table({"k": [1, 2], "d": pa.array(["x", "y"]).dictionary_encode()},
                      schema=schema))
    u.upsert(kv([1], [1.0]))
    graph.run_cycle()
    sub = GroupSub(client, req("plain"), req("dict"))
    sub.read_group()
    t.upsert(pa.table({"k": [3], "d": pa.array(["z"]).dictionary_encode()}, schema=schema))
    graph.run_cycle()
    sub.read_group()
    assert sub.changed() == [1]
    got = sub.views[1].to_arrow()
    assert got.column("d").to_pylist() == ["x", "y", "z"] and got.num_rows == 3
