"""The Python client over a real server: tables, snapshots, push in every mode, compositions.

The graph runs cycles by hand (``graph.run_cycle()``) so a test knows when a push is visible.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

import ticktable as tt
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

TRADES = pa.schema([("id", pa.int64()), ("sym", pa.string()), ("px", pa.float64()),
                    ("qty", pa.int64())])


@pytest.fixture
def graph() -> UpdateGraph:
    return UpdateGraph(validate=True)


@pytest.fixture
def server(graph: UpdateGraph) -> Iterator[TicktableServer]:
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def client(server: TicktableServer) -> Iterator[tt.Client]:
    with tt.connect(server.location) as c:
        yield c


def trades(rng: np.random.Generator, ids: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"id": ids.astype(np.int64),
                         "sym": rng.choice(["A", "B", "C", "D"], ids.size),
                         "px": np.round(rng.uniform(1, 100, ids.size), 2),
                         "qty": rng.integers(1, 10, ids.size)})


def test_connect_accepts_plain_host_port(server: TicktableServer) -> None:
    with tt.connect(f"127.0.0.1:{server.port}") as c:
        assert c.tables() == []
    assert repr(c) == f"<ticktable.Client grpc://127.0.0.1:{server.port}>"


def test_create_list_schema_stats_drop(client: tt.Client, graph: UpdateGraph) -> None:
    client.create_table("t", TRADES, "keyed", keys=["id"])
    client.create_table("log", TRADES)
    client.create_table("t", TRADES, "keyed", keys=["id"], if_not_exists=True)
    with pytest.raises(pa.ArrowException, match="already exists error, with message: table "
                                                "'t' already exists; drop it first") as exists:
        client.create_table("t", TRADES, "keyed", keys=["id"])
    assert type(exists.value) is pa.ArrowException  # ALREADY_EXISTS: pyarrow has no subclass
    with pytest.raises(ValueError, match="needs keys"):
        client.create_table("u", TRADES, "keyed")
    assert client.tables() == ["log", "t"]
    assert client.schema("t") == TRADES
    client.push("t", trades(np.random.default_rng(0), np.arange(5)), mode="upsert")
    graph.run_cycle()
    st = client.stats().set_index("name")
    assert st.loc["t", "size"] == 5 and st.loc["t", "kind"] == "keyed"
    assert st.loc["log", "size"] == 0 and st.attrs["step"] == graph.step
    assert st.attrs["web"] is None  # this server serves no web UI
    client.drop_table("log")
    assert client.tables() == ["t"]
    with pytest.raises(KeyError, match="no table 'log'"):
        client.schema("log")


def test_push_pandas_then_snapshot_columns_and_filter(client: tt.Client, graph: UpdateGraph) -> None:
    df = trades(np.random.default_rng(1), np.arange(1000))
    summary = client.push("t", df)  # created append-only from the frame's schema
    assert (summary.rows, summary.batches, summary.staged) == (1000, 1, True)
    assert summary.step == graph.step + 1
    assert client.snapshot("t").empty  # visible in the next cycle, all at once
    graph.run_cycle()
    pd.testing.assert_frame_equal(client.snapshot("t"), df)
    got = client.snapshot("t", columns=["sym", "px"], filter=pc.field("px") > 50, as_="arrow")
    assert isinstance(got, pa.Table) and got.column_names == ["sym", "px"]
    want = df[df.px > 50][["sym", "px"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.to_pandas(), want)
    with pytest.raises(tt.errors.ExpressionError, match="zz"):  # checked before sending
        client.snapshot("t", filter=pc.field("zz") > 1)
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.snapshot("nope")


def test_push_chunks_iterables_and_reports_progress(client: tt.Client, graph: UpdateGraph) -> None:
    rng = np.random.default_rng(2)
    parts = [trades(rng, np.arange(i * 70_000, (i + 1) * 70_000)) for i in range(3)]
    seen: list[int] = []
    gen = (pa.Table.from_pandas(p, preserve_index=False) for p in parts)  # consumed lazily
    summary = client.push("t", gen, chunk_rows=50_000, progress=seen.append)
    assert summary.rows == 210_000 and summary.batches == 6
    assert sum(seen) == 210_000 and max(seen) == 50_000
    graph.run_cycle()
    got = client.snapshot("t", as_="arrow")
    assert got.num_rows == 210_000
    assert pc.sum(got["id"]).as_py() == sum(range(210_000))


def test_push_casts_to_the_table_and_refuses_bad_columns(client: tt.Client,
                                                         graph: UpdateGraph) -> None:
    client.create_table("t", TRADES, "keyed", keys=["id"])
    # ints for a float column, columns in another order: matched by name, cast
    df = pd.DataFrame({"qty": [1, 2], "px": [10, 20], "sym": ["A", "B"], "id": [1, 2]})
    client.push("t", df, mode="upsert")
    graph.run_cycle()
    assert client.snapshot("t").to_dict("list") == {"id": [1, 2], "sym": ["A", "B"],
                                                    "px": [10.0, 20.0], "qty": [1, 2]}
    with pytest.raises(pa.ArrowInvalid, match="zz"):
        client.push("t", df.assign(zz=1), mode="upsert")
    with pytest.raises(pa.ArrowInvalid, match="cannot convert"):
        client.push("t", df.assign(qty=["x", "y"]), mode="upsert")
    # a push failing half-way leaves nothing (atomic) or what came before (atomic=False)
    good = pd.DataFrame({"id": [7], "sym": ["G"], "px": [1.0], "qty": [1]})
    for atomic in (True, False):
        with pytest.raises(pa.ArrowInvalid, match="cannot convert"):
            client.push("t", [good, good.assign(qty=["bad"])], mode="upsert", atomic=atomic)
        graph.run_cycle()
        assert (7 in client.snapshot("t")["id"].tolist()) is (not atomic)
        assert server_open_stages(client) == 0
    client.push("t", pd.DataFrame({"id": [7]}), mode="delete")
    with pytest.raises(KeyError):
        client.push("nope", df, create=False)
    with pytest.raises(ValueError, match="mode must be"):
        client.push("t", df, mode="merge")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot push"):
        client.push("t", 42)  # type: ignore[arg-type]
    graph.run_cycle()
    assert client.snapshot("t")["px"].tolist() == [10.0, 20.0]  # refused pushes changed nothing


def test_push_without_a_mode_upserts_a_keyed_table_and_a_refusal_names_its_cause(
        client: tt.Client, graph: UpdateGraph, caplog: pytest.LogCaptureFixture) -> None:
    client.create_table("t", TRADES, "keyed", keys=["id"])
    client.push("t", pd.DataFrame({"id": [1, 2], "sym": ["A", "B"], "px": [1.0, 2.0], "qty": [1, 1]}))
    client.push("t", pd.DataFrame({"id": [2], "sym": ["Z"], "px": [9.0], "qty": [5]}))  # an update
    client.push("log", pd.DataFrame({"x": [1, 1]}))  # created append-only: rows are appended
    client.push("log", pd.DataFrame({"x": [1]}))
    graph.run_cycle()
    assert client.snapshot("t").to_dict("list") == {"id": [1, 2], "sym": ["A", "Z"],
                                                    "px": [1.0, 9.0], "qty": [1, 5]}
    assert client.snapshot("log")["x"].tolist() == [1, 1, 1]
    # the refusal names the null key (not the mode), and the push's abort of a write that
    # staged nothing is not reported as a failure
    with caplog.at_level("WARNING"):
        with pytest.raises(pa.ArrowInvalid, match="key column 'id' has 1 null value"):
            client.push("t", pd.DataFrame({"id": [None], "sym": ["N"], "px": [0.0], "qty": [0]}))
    assert not [r for r in caplog.records if "abort" in r.getMessage()]


def server_open_stages(client: tt.Client) -> int:
    return int(client.stats().attrs["open_stages"])


def test_push_modes_against_a_dict_oracle(client: tt.Client, graph: UpdateGraph) -> None:
    """Random upserts, delete markers, deletes and appends; the snapshot equals the oracle."""
    rng = np.random.default_rng(3)
    client.create_table("k", TRADES, "keyed", keys=["id"])
    client.create_table("a", TRADES)
    state: dict[int, tuple[str, float, int]] = {}
    log: list[tuple[int, str, float, int]] = []
    for cycle in range(120):
        kind = rng.integers(0, 4)
        ids = np.unique(rng.integers(0, 300, int(rng.integers(0, 40))))
        df = trades(rng, ids)
        if kind == 0:
            client.push("k", df, mode="upsert")
            state.update(zip(df.id, zip(df.sym, df.px, df.qty, strict=True), strict=True))
        elif kind == 1:
            mark = rng.random(ids.size) < 0.5
            client.push("k", df.assign(__delete=mark), mode="upsert")
            for i, row, m in zip(df.id, zip(df.sym, df.px, df.qty, strict=True), mark, strict=True):
                if m:
                    state.pop(int(i), None)
                else:
                    state[int(i)] = row
        elif kind == 2:
            present = np.array(sorted(state), dtype=np.int64)
            gone = rng.choice(present, min(present.size, 10), replace=False) if present.size else present
            client.push("k", pd.DataFrame({"id": gone.astype(np.int64)}), mode="delete")
            for i in gone:
                state.pop(int(i))
        else:
            client.push("a", df)
            log.extend(zip(df.id, df.sym, df.px, df.qty, strict=True))
        graph.run_cycle()
        if cycle % 10 == 9:
            got = client.snapshot("k").sort_values("id").reset_index(drop=True)
            want = pd.DataFrame([(k, *v) for k, v in sorted(state.items())],
                                columns=["id", "sym", "px", "qty"])
            assert got.to_dict("list") == want.to_dict("list"), f"cycle {cycle}"
            assert client.snapshot("a").to_records(index=False).tolist() == log


def test_push_diff_mode(client: tt.Client, graph: UpdateGraph) -> None:
    client.create_table("d", TRADES, "keyed", keys=["id"])
    df = pd.DataFrame({"id": [1, 2], "sym": ["A", "B"], "px": [1.0, 2.0], "qty": [1, 1]})
    client.push("d", df.assign(__diff=1), mode="diff")
    graph.run_cycle()
    # retract id 1, change id 2 (a -1/+1 pair is a modify)
    change = pd.DataFrame({"id": [1, 2, 2], "sym": ["A", "B", "B"], "px": [1.0, 2.0, 5.0],
                           "qty": [1, 1, 1], "__diff": [-1, -1, 1]})
    client.push("d", change, mode="diff")
    graph.run_cycle()
    assert client.snapshot("d").to_dict("list") == {"id": [2], "sym": ["B"], "px": [5.0],
                                                    "qty": [1]}
    with pytest.raises(pa.ArrowInvalid):
        client.push("d", change.assign(__diff=[-1, -1, -1]), mode="diff")  # retracts absent rows


def test_token_is_sent_on_every_call(graph: UpdateGraph) -> None:
    with TicktableServer(graph, ServerConfig(token="s3cret")) as srv:
        with tt.connect(srv.location) as anon:
            with pytest.raises(fl.FlightUnauthenticatedError):
                anon.tables()
        with tt.connect(srv.location, token="s3cret") as c:
            c.push("t", trades(np.random.default_rng(4), np.arange(10)))
            graph.run_cycle()
            assert len(c.snapshot("t")) == 10
            agg = c.table("t").agg_by([tt.agg.count("n")])
            assert agg.snapshot()["n"].tolist() == [10]  # the TableService call carries it too


def test_remote_composition_is_live(client: tt.Client, graph: UpdateGraph) -> None:
    rng = np.random.default_rng(5)
    client.create_table("trades", TRADES, "keyed", keys=["id"])
    df = trades(rng, np.arange(200))
    client.push("trades", df, mode="upsert")
    graph.run_cycle()
    remote = (client.table("trades").where(pc.field("px") > 50)
              .agg_by([tt.agg.sum("qty"), tt.agg.count("n")], "sym").sort("sym"))
    assert "not created yet" in repr(remote)
    name = remote.name
    assert name in client.tables()

    def want(frame: pd.DataFrame) -> pd.DataFrame:
        g = frame[frame.px > 50].groupby("sym").agg(qty=("qty", "sum"), n=("qty", "size"))
        return g.reset_index().sort_values("sym").reset_index(drop=True)

    assert remote.snapshot().to_dict("list") == want(df).to_dict("list")
    for _ in range(5):  # the server keeps it current: no client involvement
        more = trades(rng, rng.integers(0, 300, 50))
        more = more.drop_duplicates("id", keep="last")
        client.push("trades", more, mode="upsert")
        graph.run_cycle()
        df = pd.concat([df[~df.id.isin(more.id)], more]).sort_values("id")
        assert client.snapshot(name).to_dict("list") == want(df).to_dict("list")


def test_remote_agg_by_every_registry_kind(client: tt.Client, graph: UpdateGraph) -> None:
    rng = np.random.default_rng(6)
    client.create_table("trades", TRADES, "keyed", keys=["id"])
    df = trades(rng, np.arange(300))
    df.loc[rng.random(300) < 0.1, "px"] = np.nan  # nulls on the wire
    client.push("trades", df, mode="upsert")
    graph.run_cycle()
    remote = client.table("trades").agg_by(
        [tt.agg.var("px", "var"), tt.agg.abs_sum("qty", "abs"),
         tt.agg.weighted_sum("px", "qty", "wsum"), tt.agg.weighted_avg("px", "qty", "wavg"),
         tt.agg.median("px", "med"), tt.agg.percentile("px", 0.25, "p25"),
         tt.agg.percentile("qty", 1.0, "p100"), tt.agg.sorted_last("px", order="id", name="last_px"),
         tt.agg.sorted_first("qty", "px", "qty_at_low")], "sym").sort("sym")
    assert remote.schema.field("wsum").type == pa.float64()
    assert remote.schema.field("abs").type == pa.int64()

    def want(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.reset_index(drop=True)  # unique labels for idxmax / idxmin
        ok = frame.px.notna()
        g = frame.assign(xw=(frame.px * frame.qty).where(ok), w=frame.qty.where(ok),
                         aq=frame.qty.abs()).groupby("sym")
        out = pd.DataFrame({"var": g.px.var(), "abs": g.aq.sum(), "wsum": g.xw.sum(),
                            "wavg": g.xw.sum() / g.w.sum(), "med": g.px.median(),
                            "p25": g.px.quantile(0.25), "p100": g.qty.quantile(1.0),
                            "last_px": frame.px[g.id.idxmax()].set_axis(g.id.idxmax().index),
                            # the lowest price is unique here (two decimals over 1..100)
                            "qty_at_low": frame.qty[g.px.idxmin()].set_axis(g.px.idxmin().index)})
        return out.reset_index().sort_values("sym").reset_index(drop=True)

    for step in range(4):  # the server keeps it current
        pd.testing.assert_frame_equal(remote.snapshot(), want(df), check_dtype=False,
                                      obj=f"step {step}")
        more = trades(rng, rng.integers(0, 400, 60)).drop_duplicates("id", keep="last")
        client.push("trades", more, mode="upsert")
        graph.run_cycle()
        df = pd.concat([df[~df.id.isin(more.id)], more]).sort_values("id")


def test_composition_binds_expressions_after_schema_changes(client: tt.Client,
                                                            graph: UpdateGraph) -> None:
    client.push("t", trades(np.random.default_rng(6), np.arange(50)))
    client.push("q", pd.DataFrame({"sym": ["A", "B", "C", "D"], "bid": [1.0, 2.0, 3.0, 4.0]}))
    graph.run_cycle()
    quotes = client.table("q")
    out = (client.table("t").update(notional=pc.field("px") * pc.field("qty").cast(pa.float64(), safe=False))
           .where(pc.field("notional") > 200)       # binds to the updated schema
           .natural_join(quotes, "sym", ["bid"])
           .view("id", "notional", "bid").create("rich"))
    assert out.name == "rich" and out.schema.names == ["id", "notional", "bid"]
    base = client.snapshot("t")
    base["notional"] = base.px * base.qty
    exp = base[base.notional > 200].merge(pd.DataFrame({"sym": list("ABCD"),
                                                        "bid": [1.0, 2.0, 3.0, 4.0]}), on="sym")
    got = out.snapshot()
    assert got.to_dict("list") == exp[["id", "notional", "bid"]].to_dict("list")
    with pytest.raises(pa.ArrowException, match="^table 'rich' already exists") as exists:
        client.table("t").head(3).create("rich")
    assert type(exists.value) is pa.ArrowException  # ALREADY_EXISTS, as Flight raises it
    replaced = client.table("t").head(3).create("rich", replace=True)
    assert len(replaced.snapshot()) == 3
    with pytest.raises(tt.errors.ExpressionError, match="zz"):
        client.table("t").where(pc.field("zz") > 1).create()
    with pytest.raises(KeyError, match="nope"):
        client.table("t").natural_join("nope", "sym").create()
    replaced.drop()
    assert "rich" not in client.tables()


def test_tls_with_token_for_calls_subscriptions_and_compositions(graph: UpdateGraph,
                                                                 tmp_path) -> None:
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    crt, key = (tmp_path / "cert.pem").read_bytes(), (tmp_path / "key.pem").read_bytes()
    cfg = ServerConfig(token="t0k", tls_cert=crt, tls_key=key)
    with TicktableServer(graph, cfg) as srv:
        port = srv.port
        with tt.connect(f"127.0.0.1:{port}", token="t0k", tls=str(tmp_path / "cert.pem")) as c:
            assert c.endpoint.location == f"grpc+tls://127.0.0.1:{port}"
            c.push("t", trades(np.random.default_rng(7), np.arange(20)))
            graph.run_cycle()
            with c.subscribe("t") as live:
                assert len(live.df) == 20
            assert c.table("t").count_by("n").snapshot()["n"].tolist() == [20]
        with tt.connect(f"grpc+tls://127.0.0.1:{port}", token="t0k", tls=crt) as c:
            assert "t" in c.tables()
        with tt.connect(f"127.0.0.1:{port}", token="t0k") as plain:  # no TLS: refused
            with pytest.raises(fl.FlightError):
                plain.tables()


def test_subscribe_with_a_filter_holds_the_matching_rows_live(client: tt.Client,
                                                              server: TicktableServer,
                                                              graph: UpdateGraph) -> None:
    """Rows moving into and out of the filter arrive as adds and removes, under the
    table's row keys; the filter is checked against the schema before subscribing."""
    rng = np.random.default_rng(11)
    client.create_table("trades", TRADES, "keyed", keys=["id"])
    df = trades(rng, np.arange(100))
    client.push("trades", df, mode="upsert")
    graph.run_cycle()
    live = client.subscribe("trades", columns=["id", "px"], filter=pc.field("px") > 50)
    try:
        assert live.wait_for()
        (entry,) = server.filters.entries()
        assert entry.publisher is not None
        for _ in range(5):
            more = trades(rng, rng.integers(0, 150, 40)).drop_duplicates("id", keep="last")
            client.push("trades", more, mode="upsert")
            graph.run_cycle()
            assert live.wait_for(sequence=entry.publisher.sequence)
            whole = server.registry.get("trades").table.to_arrow().to_pandas()  # table order
            want = whole[whole.px > 50][["id", "px"]].reset_index(drop=True)
            pd.testing.assert_frame_equal(live.df.reset_index(drop=True), want)
            assert live.size == len(want)
    finally:
        live.close()
    with pytest.raises(tt.errors.ExpressionError, match="zz"):  # checked before sending
        client.subscribe("trades", filter=pc.field("zz") > 1)
    with pytest.raises(KeyError, match="no table 'nope'"):
        client.subscribe("nope", filter=pc.field("px") > 1)
