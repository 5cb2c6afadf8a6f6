"""A journal written by an older tree recovers here: the on-disk format did not change.

``journal_1046a18/data`` is the data dir of a durable server at revision 1046a18 (before
``flight/`` was split into packages) that took appends, upserts, an upsert with a delete
marker, a delete, a staged write committed and a derived ``agg_by`` table, then stopped
without its shutdown checkpoint, so recovery replays every record from the journal.
``journal_1046a18/expected`` holds each table as that server held it: rows in row order
and their row keys (``__row_key``), which a source table keeps across a restart; a derived
table is rebuilt, so its rows and order are compared, not its row keys (the operation's own,
DESIGN.md §3: an aggregation's changed with its order rule after 1046a18). To write such a fixture from another tree, run
``journal_1046a18/make.py OUT`` with that tree first on ``PYTHONPATH``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest

from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer

FIXTURE = Path(__file__).parent / "journal_1046a18"


def _held(server: TicktableServer, graph: UpdateGraph, name: str) -> pa.Table:
    with graph.shared_lock():
        table = server.registry.get(name).table
        data = table.to_arrow()
        keys = pa.array(table.rowset.keys(), pa.int64())
    return data.append_column("__row_key", keys)


@pytest.fixture
def recovered(tmp_path: Path):
    shutil.copytree(FIXTURE / "data", tmp_path / "data")
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(
        port=0, data_dir=tmp_path / "data", checkpoint_seconds=3600)).start()
    graph.start(0.02)
    yield server, graph
    server.shutdown()
    graph.stop()


def test_journal_of_1046a18_recovers_rows_order_and_source_row_keys(recovered):
    server, graph = recovered
    expected = sorted(p.stem for p in (FIXTURE / "expected").glob("*.arrow"))
    assert expected == ["derived_1", "log", "trades"]
    for name in expected:
        want = pa.ipc.open_file(FIXTURE / "expected" / f"{name}.arrow").read_all()
        got = _held(server, graph, name)
        if name.startswith("derived_"):  # rebuilt at start: its row keys are the operation's
            got, want = got.drop_columns("__row_key"), want.drop_columns("__row_key")
        assert got.equals(want), f"{name}:\nrecovered {got.to_pydict()}\nwritten {want.to_pydict()}"


def test_recovered_tables_take_new_writes(recovered):
    server, graph = recovered
    before = _held(server, graph, "log").num_rows
    done: list[object] = []
    schema = pa.schema([("seq", pa.int64()), ("msg", pa.string())])
    server.puts.put("log", pb.PutRequest(mode=pb.PUT_MODE_APPEND),
                    pa.table({"seq": [500], "msg": ["new"]}, schema=schema).to_batches(),
                    done.append)
    deadline = time.monotonic() + 10
    while _held(server, graph, "log").num_rows == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held(server, graph, "log").column("seq").to_pylist()[-1] == 500
