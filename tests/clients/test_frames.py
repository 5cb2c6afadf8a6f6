"""polars in the Python client (:mod:`clients.frames`) over a real server: snapshots and SQL
as polars, pushes of polars frames, a LiveTable's ``.pl`` and an update's ``.pl`` parts,
and the error when polars is not installed.

Cycles run by hand (``graph.run_cycle()``); a LiveTable is waited for with ``wait_for``.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import polars as pl
import polars.testing as plt
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ticktable as tt
from clients.frames import MISSING, from_polars, is_polars, require_polars
from engine.graph import UpdateGraph
from flight.server import TicktableServer

UTC = dt.UTC
ROWS = pa.schema([("id", pa.int64()), ("sym", pa.string()), ("px", pa.float64()),
                  ("ts", pa.timestamp("us", tz="UTC")), ("day", pa.date32()),
                  ("ok", pa.bool_()), ("n", pa.int32())])


def rows(ids: list[int]) -> pa.Table:
    """Rows of ``ROWS`` with a null in every column but ``id`` on every third row."""
    def maybe(i: int, value: object) -> object:
        return None if i % 3 == 2 else value

    return pa.table({
        "id": ids,
        "sym": [maybe(i, f"s{i}") for i in ids],
        "px": [maybe(i, i / 4) for i in ids],
        "ts": [maybe(i, dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i))
               for i in ids],
        "day": [maybe(i, dt.date(2024, 1, 1) + dt.timedelta(days=i)) for i in ids],
        "ok": [maybe(i, i % 2 == 0) for i in ids],
        "n": [maybe(i, i * 10) for i in ids],
    }, schema=ROWS)


@pytest.fixture
def client(server: TicktableServer) -> Iterator[tt.Client]:
    with tt.connect(server.location) as c:
        yield c


# ------------------------------------------------------------------ snapshots and SQL
def test_snapshot_as_polars_equals_the_arrow_snapshot(client: tt.Client,
                                                      graph: UpdateGraph) -> None:
    client.create_table("t", ROWS, "keyed", keys=["id"])
    client.push("t", rows(list(range(9))))
    graph.run_cycle()
    arrow = client.snapshot("t", as_="arrow")
    got = client.snapshot("t", as_="polars")
    assert isinstance(got, pl.DataFrame)
    assert got.schema == pl.Schema({"id": pl.Int64(), "sym": pl.String(), "px": pl.Float64(),
                                    "ts": pl.Datetime("us", "UTC"), "day": pl.Date(),
                                    "ok": pl.Boolean(), "n": pl.Int32()})
    assert got.to_dicts() == arrow.to_pylist()  # values, nulls and timestamps alike
    assert got.null_count().row(0) == (0, 3, 3, 3, 3, 3, 3)
    # columns and a filter run on the server, as_ passed by position as well
    some = client.snapshot("t", ["sym", "px"], pc.field("px") > 1, "polars")
    plt.assert_frame_equal(some, got.filter(pl.col("px") > 1).select("sym", "px"))
    remote = client.table("t").where(pc.field("n") >= 40).snapshot(as_="polars")
    plt.assert_frame_equal(remote, got.filter(pl.col("n") >= 40))
    with pytest.raises(ValueError, match="as_ must be 'pandas', 'arrow' or 'polars'"):
        client.snapshot("t", as_="numpy")  # type: ignore[call-overload]


# ------------------------------------------------------------------ push
def test_push_polars_appends_and_upserts(client: tt.Client, graph: UpdateGraph) -> None:
    frame = pl.from_arrow(rows(list(range(6))))
    assert isinstance(frame, pl.DataFrame)
    summary = client.push("log", frame)  # created append-only from the frame's schema
    assert summary.rows == 6
    assert client.schema("log") == ROWS  # plain Arrow types, as from pandas
    client.push("log", frame.lazy().filter(pl.col("id") < 2))  # a LazyFrame, collected
    client.push("log", [frame.head(1), frame.tail(1).lazy()])  # an iterable of them
    graph.run_cycle()
    plt.assert_frame_equal(client.snapshot("log", as_="polars"), pl.concat(
        [frame, frame.head(2), frame.head(1), frame.tail(1)]))

    client.push("k", frame, keys=["id"])  # created keyed: upserts by id from now on
    changed = frame.filter(pl.col("id").is_in([1, 4])).with_columns(
        sym=pl.lit("new"), px=pl.lit(None, pl.Float64))
    client.push("k", changed)
    client.push("k", frame.filter(pl.col("id").is_in([0, 3])).with_columns(__delete=True))
    client.push("k", pl.DataFrame({"id": [5]}), mode="delete")
    graph.run_cycle()
    want = frame.update(changed, on="id", include_nulls=True).filter(
        ~pl.col("id").is_in([0, 3, 5]))
    plt.assert_frame_equal(client.snapshot("k", as_="polars").sort("id"), want)


def test_create_table_takes_a_polars_frame_or_lazy_frame_for_its_schema(
        client: tt.Client) -> None:
    frame = pl.from_arrow(rows([1, 2]))
    assert isinstance(frame, pl.DataFrame)
    client.create_table("a", frame)
    client.create_table("b", frame.lazy().select("id", "sym"), "keyed", keys=["id"])
    assert client.schema("a") == ROWS
    assert client.schema("b") == pa.schema([("id", pa.int64()), ("sym", pa.string())])


def test_from_polars_gives_the_plain_arrow_types() -> None:
    frame = pl.DataFrame({"s": ["a", None], "b": [b"x", None], "l": [["a"], []],
                          "st": [{"f": "x"}, None],
                          "c": pl.Series(["x", "y"], dtype=pl.Categorical)})
    table = from_polars(frame)
    assert table.schema.field("s").type == pa.string()
    assert table.schema.field("b").type == pa.binary()
    assert table.schema.field("l").type == pa.list_(pa.string())
    assert table.schema.field("st").type == pa.struct([("f", pa.string())])
    assert table.schema.field("c").type.value_type == pa.string()
    assert table.to_pylist() == frame.to_dicts()
    assert is_polars(frame) and is_polars(frame.lazy()) and not is_polars(table)


# ------------------------------------------------------------------ LiveTable.pl, Update.pl
KVT = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64()),
                 ("ts", pa.timestamp("us", tz="UTC"))])
PARTS = ("added", "removed", "modified", "modified_previous")


def kvt(rng: np.random.Generator, keys: np.ndarray) -> pl.DataFrame:
    """Rows of ``KVT`` for ``keys``, about one value in five null."""
    n = keys.size
    null = rng.random((3, n)) < 0.2
    ts = [dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=int(x))
          for x in rng.integers(0, 10**9, n)]
    return pl.DataFrame({
        "k": keys.astype(np.int64),
        "s": [None if z else f"s{int(x)}" for z, x in zip(null[0], rng.integers(0, 9, n),
                                                         strict=True)],
        "v": [None if z else float(x) for z, x in zip(null[1], rng.integers(0, 20, n),
                                                     strict=True)],
        "ts": [None if z else t for z, t in zip(null[2], ts, strict=True)],
    }, schema={"k": pl.Int64, "s": pl.String, "v": pl.Float64,
               "ts": pl.Datetime("us", "UTC")})


def same(got: pl.DataFrame, want: pl.DataFrame, context: str) -> None:
    try:
        plt.assert_frame_equal(got, want)
    except AssertionError as exc:
        raise AssertionError(f"{context}: {exc}\ngot:\n{got}\nwant:\n{want}") from exc


def test_live_pl_and_update_parts_follow_random_writes(
        client: tt.Client, graph: UpdateGraph, server: TicktableServer) -> None:
    """Random polars upserts (nulls included) and deletes into a keyed table; after every
    cycle ``live.pl`` equals the server's rows and ``live.df`` converted, on the table, on
    a sorted view of it (shifts) and on a moving viewport over that view; every update's
    polars parts equal its pandas parts."""
    rng = np.random.default_rng(5)
    client.create_table("t", KVT, "keyed", keys=["k"])
    board = server.registry.get("t").table.sort(["v", "k"], descending=[True, False])
    server.registry.add("board", board, "derived", parents=["t"])
    ranges = [(0, 8)]
    views = [(client.subscribe("t", max_batch_rows=5), "t", None),
             (client.subscribe("board"), "board", None),
             (client.subscribe("board", viewport=ranges), "board", ranges)]
    updates = [live.updates(timeout=10, snapshot=True) for live, _, _ in views]
    seen = [-1] * len(views)
    present: set[int] = set()
    rows_in = dict.fromkeys(PARTS, 0)  # rows seen per part, every kind must occur
    for cycle in range(40):
        keys = np.unique(rng.integers(0, 60, int(rng.integers(0, 12))))
        if keys.size:
            client.push("t", kvt(rng, keys))
            present.update(keys.tolist())
        if present and rng.random() < 0.5:
            gone = rng.choice(sorted(present), min(len(present), 4), replace=False)
            client.push("t", pl.DataFrame({"k": gone.astype(np.int64)}), mode="delete")
            present.difference_update(gone.tolist())
        graph.run_cycle()
        b = int(rng.integers(0, 20))
        moved = [(b, b + int(rng.integers(0, 10)))]
        if rng.random() < 0.2 and moved != ranges:  # applied by a message of its own
            ranges = moved
            views[2] = (views[2][0], "board", ranges)
            assert views[2][0].set_viewport(ranges), f"cycle {cycle}: viewport not applied"
        for i, (live, name, vp) in enumerate(views):
            publisher = server.registry.get(name).publisher
            assert publisher is not None
            assert live.wait_for(sequence=publisher.sequence), f"cycle {cycle}: {live!r}"
            got = live.pl
            assert got is live.pl, "cached per applied message"
            rows = server.registry.get(name).table.to_arrow(list(KVT.names))
            if vp is not None:
                at = sorted({p for b, e in vp for p in range(b, min(e, rows.num_rows))})
                rows = rows.take(pa.array(at, pa.int64()))
            context = f"cycle {cycle}, {live!r}"
            same(got, pl.from_arrow(rows), context)  # type: ignore[arg-type]
            same(got, pl.from_pandas(live.df.reset_index(drop=True)), context)
            while seen[i] < live.sequence:
                u = next(updates[i])
                for part in PARTS:
                    same(getattr(u.pl, part), pl.from_pandas(getattr(u, part)),
                         f"{context}, {u!r} {part}")
                    rows_in[part] += getattr(u.pl, part).height
                assert u.pl.added is u.pl.added  # cached with the update
                seen[i] = u.sequence
    assert min(rows_in.values()) > 0 and board.size > 0


# ------------------------------------------------------------------ without polars
def test_without_polars_every_polars_path_names_the_extra(
        client: tt.Client, graph: UpdateGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    client.push("t", rows([1, 2]), keys=["id"])
    graph.run_cycle()
    got: list[tt.Update] = []
    live = client.subscribe("t", on_update=got.append)
    assert live.wait_for()
    monkeypatch.setitem(sys.modules, "polars", None)  # import polars now fails
    missing = r"polars is not installed: pip install 'ticktable\[polars\]'"
    with pytest.raises(ModuleNotFoundError, match=missing) as exc:
        require_polars()
    assert exc.value.name == "polars" and str(exc.value) == MISSING
    with pytest.raises(ModuleNotFoundError, match=missing):
        client.snapshot("nope", as_="polars")  # refused before asking: no KeyError
    with pytest.raises(ModuleNotFoundError, match=missing):
        client.sql("SELECT 1", as_="polars")
    with pytest.raises(ModuleNotFoundError, match=missing):
        live.pl  # noqa: B018
    with pytest.raises(ModuleNotFoundError, match=missing):
        got[0].pl.added  # noqa: B018
    # pandas and Arrow go on as ever
    assert live.df["id"].tolist() == [1, 2] and client.snapshot("t").shape == (2, 7)
    assert got[0].added["id"].tolist() == [1, 2]
    client.push("t", rows([3]).to_pandas())
    graph.run_cycle()
    assert live.wait_for(sequence=2) and live.size == 3


def test_importing_ticktable_does_not_import_polars() -> None:
    code = ("import sys, ticktable, clients.client, clients.live, clients.frames\n"
            "tt = ticktable.connect('grpc://127.0.0.1:1')\n"
            "assert 'polars' not in sys.modules, 'polars was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
