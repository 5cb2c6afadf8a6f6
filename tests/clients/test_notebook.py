"""The notebook grid without a browser: Perspective's table behind the widget equals what
the LiveTable holds, row key for row key, after every cycle of random writes to a keyed
table and a sorted view of it (adds, removes, modifies, shifts), with a moving viewport, a
column change and broken streams; a LiveTable's text repr outside Jupyter, which imports
nothing of Jupyter; an update's :meth:`~clients.livestate.Update.by_row_key` by example.

A browser in a real JupyterLab is ``tests/web/test_notebook_jupyter.py``'s.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import ticktable as tt
from clients.livestate import Update
from clients.notebook import LiveGrid, in_notebook
from engine.graph import UpdateGraph
from flight.server import TicktableServer
from flight.web.feed import conform, perspective_schema
from tests.clients.conftest import kv
from tests.clients.test_live import keyed, seq
from tests.oracle import RandomSource


def grid_rows(grid: LiveGrid) -> pa.Table:
    """What the grid's Perspective table holds, in its order (the index: row key)."""
    view = grid.table.view()
    try:
        got = pa.ipc.open_stream(view.to_arrow()).read_all()
    finally:
        view.delete()
    return pa.table({n: (c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c)
                     for n, c in zip(got.column_names, got.columns, strict=True)})


def server_rows(table, positions: np.ndarray | None, columns: list[str] | None) -> pa.Table:
    """The server table's rows at ``positions`` (None: all) under their row keys, as the
    grid should hold them."""
    keys = table.rowset.keys()
    rows = table.to_arrow(columns)
    if positions is not None:
        positions = positions[positions < keys.size]
        keys, rows = keys[positions], rows.take(pa.array(positions, pa.int64()))
    return conform(rows, keys, perspective_schema(rows.schema))


def assert_grid(grid: LiveGrid, want: pa.Table, context: str) -> None:
    got = grid_rows(grid)
    try:
        assert got.column_names == want.column_names, "columns differ"
        pd.testing.assert_frame_equal(got.to_pandas(), want.to_pandas(), check_dtype=False)
    except AssertionError as exc:
        raise AssertionError(f"{context}: the grid differs from the server\n"
                             f"got:\n{got.to_pandas()}\nwant:\n{want.to_pandas()}") from exc


def viewport_positions(ranges: list[tuple[int, int]]) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(b, e) for b, e in ranges] + [np.empty(0, int)]))


# ------------------------------------------------------------------ examples
def test_by_row_key_of_a_sorted_view(server: TicktableServer, graph: UpdateGraph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv([1, 2, 3], [10.0, 20.0, 30.0]))
    graph.run_cycle()
    server.registry.add("board", src.sort("v", descending=True), "derived", parents=["t"])
    got: list[Update] = []
    live = subscribe("board", on_update=got.append)
    assert live.wait_for()
    first = got[0].by_row_key()
    board = server.registry.get("board").table
    assert first.snapshot and first.keys.tolist() == board.rowset.keys().tolist()
    assert first.rows.column("k").to_pylist() == [3, 2, 1] and first.removes.size == 0
    before = board.rowset.keys().tolist()
    src.upsert(kv([4, 2], [25.0, 21.0], ["s4", "x2"]))  # 4 lands between 3 and 2: a shift
    graph.run_cycle()
    assert live.wait_for(sequence=seq(server, "board"))
    ch = got[-1].by_row_key()
    after = board.rowset.keys().tolist()
    held = dict(zip(before, [3, 2, 1], strict=True))  # a dict keyed by row key, replayed
    for k in ch.removes.tolist():
        del held[k]
    held.update(zip(ch.keys.tolist(), ch.rows.column("k").to_pylist(), strict=True))
    assert sorted(held) == after and [held[k] for k in after] == [3, 4, 2, 1]
    assert not ch.snapshot and set(ch.removes.tolist()).isdisjoint(ch.keys.tolist())
    assert ch.rows.column("s").to_pylist()[ch.rows.column("k").to_pylist().index(2)] == "x2"


def test_repr_outside_a_notebook_is_text_and_imports_no_jupyter(server, graph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    live = subscribe("t")
    assert live.wait_for()
    assert not in_notebook()
    assert live._repr_mimebundle_() is None  # IPython outside a kernel shows repr()
    assert repr(live) == "<LiveTable 't' connected size=2 step=1 sequence=1 columns=[k, s, v]>"
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, ticktable, clients.notebook, clients.live\n"
         "bad = [m for m in sys.modules if m.split('.')[0] in ('IPython', 'ipykernel', "
         "'ipywidgets', 'anywidget', 'jupyter_client', 'comm') or m == 'perspective.widget']\n"
         "print(bad)"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_live_table_in_a_kernel_displays_as_one_grid(server, graph, subscribe, monkeypatch):
    """Under a kernel (an IPython shell with a ``kernel``, faked here) a LiveTable's bundle is
    its grid's widget: one grid however often it is shown; closed, it keeps its last grid;
    closed before it was shown, it is text."""
    import IPython

    assert not in_notebook()  # IPython, but no kernel
    shell = type("Shell", (), {"kernel": object()})()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert in_notebook()
    src = keyed(server, "t")
    src.upsert(kv([1], [1.0]))
    graph.run_cycle()
    live = subscribe("t")
    data, _ = live._repr_mimebundle_()
    view = data["application/vnd.jupyter.widget-view+json"]
    assert data["text/plain"] == repr(live) and view["model_id"] == live._grid.widget.model_id
    assert live._repr_mimebundle_()[0]["application/vnd.jupyter.widget-view+json"] == view
    grid = live._grid
    live.close()
    grid._thread.join(10)
    assert live._repr_mimebundle_()[0]["application/vnd.jupyter.widget-view+json"] == view
    never = subscribe("t")
    never.close()
    assert never._repr_mimebundle_() is None


def test_grid_follows_a_table_and_closes(server: TicktableServer, graph: UpdateGraph):
    src = keyed(server, "t")
    src.upsert(kv([1, 2], [1.0, 2.0]))
    graph.run_cycle()
    grid = tt.show("t", uri=server.location, sort=[["v", "desc"]])
    try:
        assert grid.widget.sort == [["v", "desc"]] and grid.widget.title == "t"
        assert grid.widget.columns == ["k", "s", "v"]  # the row key is not shown
        assert_grid(grid, server_rows(src, None, None), "first")
        src.upsert(kv([3], [3.0]))
        src.delete(pa.table({"k": pa.array([1], pa.int64())}))
        graph.run_cycle()
        assert grid.wait_for(sequence=seq(server, "t"))
        assert_grid(grid, server_rows(src, None, None), "after a cycle")
        assert "LiveGrid live" in repr(grid)
        bundle, _ = grid._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
    finally:
        grid.close()
    assert grid.closed and grid.live.closed and not grid._thread.is_alive()


def test_a_displayed_live_tables_grid_ends_with_it(server, graph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv([1], [1.0]))
    graph.run_cycle()
    live = subscribe("t")
    grid = tt.show(live, columns=["v", "k"])
    assert grid.widget.columns == ["v", "k"]
    grid.close()  # the grid's own close leaves the LiveTable open
    assert grid.closed and not grid._thread.is_alive() and not live.closed
    again = tt.show(live)
    live.close()
    again._thread.join(10)
    assert again.closed and not again._thread.is_alive()
    assert again.widget.title == "t (closed at step 1)"  # not live any more, and says so
    assert grid.widget.title == "t"


def test_show_needs_a_name_for_a_filter(server, graph, subscribe):
    src = keyed(server, "t")
    src.upsert(kv([1], [1.0]))
    graph.run_cycle()
    import pyarrow.compute as pc

    with pytest.raises(TypeError, match="viewer_filter"):
        tt.show(subscribe("t"), filter=pc.field("v") > 0)


# ------------------------------------------------------------------ the oracle
@pytest.mark.parametrize("seed", [3, 4])
def test_grid_equals_the_table_after_random_cycles(server, graph, subscribe, seed):
    """Random writes to a keyed table and a sorted view of it; after every cycle each grid's
    Perspective table holds exactly the LiveTable's rows under the server's row keys: the
    whole sorted view (shifts), a moving viewport over it, the source with a column
    change midway; streams broken twice resume by deltas."""
    rng = np.random.default_rng(seed)
    src = RandomSource(graph, "keyed", rng, max_rows=120)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    board = src.table.sort(["Price", "Key"], descending=[True, False])
    server.registry.add("board", board, "derived", parents=["src"])
    ranges = [(0, 10)]
    ordered = subscribe("board")
    window = subscribe("board", viewport=ranges)
    some = subscribe("src", columns=["Price", "Key"])
    grids = {name: LiveGrid(live) for name, live in
             (("ordered", ordered), ("window", window), ("some", some))}
    columns = ["Key", "Price"]  # a subscription's columns come in the table's order
    try:
        for cycle in range(120):
            src.step()
            graph.run_cycle()
            if cycle in (30, 90):
                ordered._drop_connection()
                window._drop_connection()
            if rng.random() < 0.1:
                b = int(rng.integers(0, 40))
                ranges = [(b, b + int(rng.integers(0, 15)))]
                assert window.set_viewport(ranges)
            if cycle == 60:
                assert some.set_columns(["Sym", "Key"])
                columns = ["Sym", "Key"]
            for name, grid in grids.items():
                live = grid.live
                table = board if live is not some else src.table
                assert live.wait_for(sequence=seq(server, "board" if table is board else "src"))
                # everything the table applied, a viewport or column change included (a
                # snapshot at the same step and sequence)
                assert grid.wait_for(applied=grid.received), f"{name} {cycle}"
                pos = viewport_positions(ranges) if live is window else None
                assert_grid(grid, server_rows(table, pos, None if live is not some else columns),
                            f"seed {seed} cycle {cycle} {name}")
        assert grids["some"].widget.columns == ["Sym", "Key"]  # the new table's columns
        assert ordered.reconnects == 2 and board.size > 0
    finally:
        for grid in grids.values():
            grid.close()
    assert not any(g._thread.is_alive() for g in grids.values())

