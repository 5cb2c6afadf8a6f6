"""``Client.sql`` and ``Client.subscribe_sql`` over a real server's Flight SQL.

The graph runs cycles on its own thread (a query's snapshot and an update's commit wait
for cycles); a test waits for a LiveTable with its ``wait_for``, never by sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

import ticktable as tt
from engine.errors import ProtocolError
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

TRADES = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "sym": ["A", "B", "A"],
                   "px": [10.0, 61.5, 99.0]})


@pytest.fixture
def server() -> Iterator[TicktableServer]:
    graph = UpdateGraph(validate=True)
    graph.start(0.01)
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    srv.shutdown()
    graph.stop()


@pytest.fixture
def client(server: TicktableServer) -> Iterator[tt.Client]:
    with tt.connect(server.location) as c:
        c.push("trades", TRADES, keys=["id"])
        yield c


def test_select_as_pandas_arrow_and_polars_with_the_step(client: tt.Client,
                                                          server: TicktableServer) -> None:
    df = client.sql("SELECT sym, px FROM trades WHERE px > 50 ORDER BY px")
    pd.testing.assert_frame_equal(df, pd.DataFrame({"sym": ["B", "A"], "px": [61.5, 99.0]}))
    assert isinstance(df.attrs["step"], int) and 0 < df.attrs["step"] <= server.graph.step

    table = client.sql("SELECT id FROM trades ORDER BY id", as_="arrow")
    assert isinstance(table, pa.Table)
    assert table.column("id").to_pylist() == [1, 2, 3]
    step = int(table.schema.metadata[b"ticktable.step"])
    assert df.attrs["step"] <= step <= server.graph.step
    frame = client.sql("SELECT sym, px FROM trades WHERE px > ? ORDER BY px", [50],
                       as_="polars")
    assert isinstance(frame, pl.DataFrame)
    assert frame.schema == pl.Schema({"sym": pl.String, "px": pl.Float64})
    assert frame.to_dict(as_series=False) == {"sym": ["B", "A"], "px": [61.5, 99.0]}
    with pytest.raises(ValueError, match="as_ must be 'pandas', 'arrow' or 'polars'"):
        client.sql("SELECT 1", as_="numpy")  # type: ignore[call-overload]


def test_params_bind_through_a_prepared_statement(client: tt.Client,
                                                  server: TicktableServer) -> None:
    df = client.sql("SELECT id FROM trades WHERE sym = ? AND px > $2 ORDER BY id", ["A", 50])
    assert df["id"].tolist() == [3]
    assert isinstance(df.attrs["step"], int)
    assert client.sql("SELECT id FROM trades WHERE sym = ?", ["Z"]).empty
    assert not server.sql._prepared  # every statement was closed


def test_insert_then_select_sees_it(client: tt.Client) -> None:
    count = client.sql("INSERT INTO trades VALUES (4, 'C', 12.5)")
    assert count["count"].tolist() == [1] and count.attrs["step"] is None
    bound = client.sql("INSERT INTO trades (id, sym, px) VALUES (?, ?, ?)", [5, "D", 1.0],
                       as_="arrow")
    assert bound.to_pydict() == {"count": [1]}
    df = client.sql("SELECT id, sym FROM trades WHERE id >= 4 ORDER BY id")
    assert df.to_dict("list") == {"id": [4, 5], "sym": ["C", "D"]}
    assert client.sql("DELETE FROM trades WHERE sym = ?", ["A"])["count"].tolist() == [2]
    assert client.sql("SELECT count(*) AS n FROM trades")["n"].tolist() == [3]


def test_a_syntax_error_names_line_and_column(client: tt.Client) -> None:
    with pytest.raises(pa.ArrowInvalid, match=r"SQL syntax error at line 2, column \d+"):
        client.sql("SELECT id\nFROM trades WHERE WHERE")
    with pytest.raises(pa.ArrowInvalid, match=r"SQL syntax error at line 1, column \d+"):
        client.sql("SELECT id FROM trades WHERE id = ? AND AND", [1])  # on prepare


def test_an_unknown_table_is_not_found(client: tt.Client) -> None:
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.sql("SELECT * FROM nope")
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.sql("SELECT * FROM nope WHERE x = ?", [1])


def test_subscribe_sql_is_live_and_its_view_is_dropped_on_close(client: tt.Client) -> None:
    live = client.subscribe_sql("SELECT id, px FROM trades WHERE px > 50")
    name = live.table
    assert name.startswith("__sql_") and name in client.tables()  # visible to all
    assert live.wait_for()
    assert sorted(live.df["id"].tolist()) == [2, 3]

    seen = live.sequence
    client.push("trades", pa.table({"id": pa.array([7, 8], pa.int64()), "sym": ["C", "C"],
                                    "px": [70.0, 1.0]}))
    assert live.wait_for(sequence=seen + 1)
    assert sorted(live.df["id"].tolist()) == [2, 3, 7]

    live.close()
    assert name not in client.tables()
    live.close()  # a second close drops nothing more, and does not fail


def test_a_filtered_subscription_keeps_its_temporary_view(client: tt.Client,
                                                          server: TicktableServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary view goes once no one subscribes to it: a filtered subscriber (of the
    view's shared filtered table, not of the view itself) counts."""
    monkeypatch.setattr(type(server.sql), "TEMPORARY_SWEEP", 0.02)  # from its next wait
    live = client.subscribe_sql("SELECT id, px FROM trades", filter=pc.field("px") > 50)
    name = live.table
    assert live.wait_for() and sorted(live.df["id"].tolist()) == [2, 3]
    time.sleep(0.8)  # sweeps every 0.02 s once the one pending (0.5 s at most) ran
    assert name in client.tables()
    seen = live.sequence
    client.push("trades", pa.table({"id": pa.array([7], pa.int64()), "sym": ["C"],
                                    "px": [70.0]}))
    assert live.wait_for(sequence=seen + 1) and sorted(live.df["id"].tolist()) == [2, 3, 7]
    live.close()
    assert name not in client.tables()


def test_subscribe_sql_views_go_with_the_client(server: TicktableServer) -> None:
    with tt.connect(server.location) as c:
        c.push("trades", TRADES, keys=["id"])
        live = c.subscribe_sql("SELECT sym FROM trades", columns=["sym"])
        assert live.wait_for() and live.columns == ["sym"]
        assert live.table in c.tables()
    with tt.connect(server.location) as other:
        assert other.tables() == ["trades"]


def test_subscribe_sql_refusals_leave_no_view(client: tt.Client) -> None:
    with pytest.raises(pa.ArrowInvalid, match="SQL syntax error at line 1"):
        client.subscribe_sql("SELECT FROM FROM")
    with pytest.raises(KeyError, match="'nope'"):
        client.subscribe_sql("SELECT * FROM nope")
    with pytest.raises(ProtocolError, match="bad viewport"):  # the LiveTable's: the view goes
        client.subscribe_sql("SELECT * FROM trades", viewport=[(5, 1)])
    assert client.tables() == ["trades"]


def test_a_closed_connection_leaves_the_view_to_the_server(server: TicktableServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The client cannot drop its view (its connection is gone, logged at debug); the
    server drops the temporary view itself once its last subscriber left."""
    c = tt.connect(server.location)
    c.push("trades", TRADES, keys=["id"])
    live = c.subscribe_sql("SELECT id FROM trades")
    assert live.wait_for()
    c._flight.close()  # the connection is gone before the LiveTable closes
    with caplog.at_level("DEBUG", logger="clients.client"):
        live.close()
    assert "could not drop the temporary view" in caplog.text
    with tt.connect(server.location) as other:
        deadline = time.monotonic() + 10
        while live.table in other.tables() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.tables() == ["trades"]
    assert [t.name for t in server.graph.tables] == ["trades"]  # its operations too
    with pytest.raises((fl.FlightError, pa.ArrowException, OSError)):
        c.tables()


def test_a_temporary_view_is_not_journaled_and_no_durable_view_reads_one(
        tmp_path: Path) -> None:
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(data_dir=tmp_path)).start()
    graph.start(0.02)
    try:
        with tt.connect(server.location) as c:
            c.push("trades", TRADES, keys=["id"])
            c.sql("CREATE TEMPORARY VIEW tmp AS SELECT id, sym FROM trades")
            with pytest.raises(pa.ArrowInvalid, match="reads temporary view"):
                c.sql("CREATE VIEW kept AS SELECT id FROM tmp")
            c.sql("CREATE VIEW kept AS SELECT id FROM trades")
    finally:
        server.shutdown()
        graph.stop()
    graph = UpdateGraph()
    server = TicktableServer(graph, ServerConfig(data_dir=tmp_path)).start()
    try:
        assert sorted(server.registry.names()) == ["kept", "trades"]
    finally:
        server.shutdown()


def test_create_and_drop_view_through_sql(client: tt.Client) -> None:
    assert client.sql("CREATE VIEW dear AS SELECT id FROM trades WHERE px > 50")[
        "count"].tolist() == [0]
    assert client.sql("SELECT id FROM dear ORDER BY id")["id"].tolist() == [2, 3]
    client.drop_table("dear")


def test_drop_view_through_sql(client: tt.Client) -> None:
    client.sql("CREATE VIEW dear AS SELECT id FROM trades")
    client.sql("DROP VIEW IF EXISTS dear")
    assert client.tables() == ["trades"]
    client.sql("CREATE VIEW dear AS SELECT id FROM trades")
    client.sql("DROP VIEW dear")
    assert client.tables() == ["trades"]
