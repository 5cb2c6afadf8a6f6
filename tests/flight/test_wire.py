"""The wire vocabulary: each name defined once, and the action table driving the server.

The action table is read by ListActions, the read-only token's check, the dispatch and
the journal; these tests hold the server to each of its columns, over the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import engine.differential.upsert
import engine.differential.zset
import flight.wire as wire
from engine.errors import InputError
from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.wire import ACTIONS, PUT_MODES, SOURCE_KINDS, Action, PutMode, RecordKind, TableKind

KV = pa.schema([("k", pa.int64()), ("v", pa.string())])
FULL = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer full")])
READ = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer read")])


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[TicktableServer]:
    """A durable server with both tokens; no periodic cycles (so no cycle markers)."""
    srv = TicktableServer(UpdateGraph(), ServerConfig(token="full", read_token="read",
                                                      data_dir=tmp_path / "data")).start()
    yield srv
    srv.shutdown()


# ------------------------------------------------------------------------ names
def test_reserved_columns_are_the_engines():
    assert (wire.DIFF, wire.TIME) == (engine.differential.zset.DIFF, engine.differential.zset.TIME)
    assert wire.DELETE == engine.differential.upsert.DELETE
    assert PutMode.UPSERT.columns == (wire.DELETE,)
    assert PutMode.DIFF.columns == (wire.DIFF, wire.TIME)
    assert PutMode.APPEND.columns == PutMode.DELETE.columns == ()


def test_modes_and_kinds_round_trip_through_the_proto():
    assert [m.proto for m in PUT_MODES] == [pb.PUT_MODE_APPEND, pb.PUT_MODE_UPSERT,
                                            pb.PUT_MODE_DELETE, pb.PUT_MODE_DIFF]
    assert {PutMode.from_proto(v) for v in pb.PutMode.values()} == set(PUT_MODES)
    assert PutMode.from_proto(99) is None
    assert {TableKind.from_proto(v) for v in pb.TableKind.values()} == set(SOURCE_KINDS)
    assert [TableKind.from_proto(k.proto) for k in SOURCE_KINDS] == list(SOURCE_KINDS)
    assert TableKind.from_proto(99) is None
    with pytest.raises(KeyError):
        _ = TableKind.DERIVED.proto


def test_an_enum_member_is_its_wire_string():
    assert PutMode.UPSERT == "upsert" and f"{TableKind.KEYED}" == "keyed"
    assert "diff" in PUT_MODES and "derived" not in SOURCE_KINDS
    assert type(RecordKind.CREATE.value) is str


# ---------------------------------------------------------------------- actions
def test_each_action_is_run_by_the_server_method_of_its_name():
    assert len({a.name for a in ACTIONS}) == len(ACTIONS)
    for a in ACTIONS:
        assert callable(getattr(TicktableServer, a.name)), a.name
    with pytest.raises(InputError) as info:
        wire.action_named("nope")
    assert str(info.value) == f"unknown action 'nope'; actions: {', '.join(a.name for a in ACTIONS)}"
    # the actions there always were keep their order (new ones come after them)
    assert str(info.value).startswith("unknown action 'nope'; actions: create_table, drop_table, "
                                      "commit, abort, stats")


def test_list_actions_is_the_table(durable):
    with fl.connect(durable.location) as c:
        listed = [(a.type, a.description) for a in c.list_actions(READ)]
    sql_actions = [("CreatePreparedStatement", "Flight SQL"), ("ClosePreparedStatement", "Flight SQL"),
                   ("CancelFlightInfo", "Flight SQL"), ("SetSessionOptions", "Flight SQL"),
                   ("GetSessionOptions", "Flight SQL"), ("CloseSession", "Flight SQL")]
    assert listed == [(a.name, a.description) for a in ACTIONS] + sql_actions
    assert listed[:5] == [("create_table", "CreateTableRequest -> empty"),  # as they always were
                          ("drop_table", "DropTableRequest -> empty"),
                          ("commit", "CommitRequest -> CommitResult"),
                          ("abort", "AbortRequest -> empty"),
                          ("stats", "empty -> Stats")]


def _bodies(c: fl.FlightClient) -> dict[str, bytes]:
    """A valid body per action taking a request; the write ids it commits and aborts hold
    a batch."""
    for write_id in ("w1", "w2"):
        writer, reader = c.do_put(fl.FlightDescriptor.for_path("t"), KV, FULL)
        writer.write_with_metadata(
            pa.record_batch([pa.array([1]), pa.array(["a"])], schema=KV),
            pa.py_buffer(pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=write_id)
                         .SerializeToString()))
        writer.done_writing()
        reader.read()
        writer.close()
    return {
        "create_table": pb.CreateTableRequest(name="new", schema=KV.serialize().to_pybytes(),
                                              kind=pb.TABLE_KIND_APPEND).SerializeToString(),
        "drop_table": pb.DropTableRequest(name="new").SerializeToString(),
        "commit": pb.CommitRequest(write_id="w1", slots=[pb.StageSlot()]).SerializeToString(),
        "abort": pb.AbortRequest(write_id="w2").SerializeToString(),
    }


def _run(c: fl.FlightClient, a: Action, body: bytes, options: fl.FlightCallOptions) -> list[bytes]:
    return [r.body.to_pybytes() for r in c.do_action(fl.Action(a.name, body), options)]


def test_each_action_answers_journals_and_authorizes_as_its_row_says(durable):
    journal = durable.durability.journal
    assert journal is not None
    with fl.connect(durable.location) as c:
        create = pb.CreateTableRequest(name="t", schema=KV.serialize().to_pybytes(),
                                       kind=pb.TABLE_KIND_APPEND)
        list(c.do_action(fl.Action("create_table", create.SerializeToString()), FULL))
        bodies = _bodies(c)
        for a in ACTIONS:
            assert a.request is None or a.name in bodies, f"{a.name} needs a body in _bodies"
            body = bodies.get(a.name, b"")
            if not a.read_only:
                with pytest.raises(fl.FlightUnauthorizedError, match=f"run action '{a.name}'"):
                    _run(c, a, body, READ)
            last = max((r.seq for r in journal.records(after=0)), default=0)
            out = _run(c, a, body, READ if a.read_only else FULL)
            written = [r.kind for r in journal.records(after=last)]
            assert written == ([a.journal] if a.journal is not None else []), a.name
            assert len(out) == (a.result is not None), a.name
            if a.result is not None:
                a.result.FromString(out[0])  # parses as the row's result
