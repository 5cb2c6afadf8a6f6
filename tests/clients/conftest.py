"""A real Flight server on 127.0.0.1 (port 0) and a factory of live subscriptions to it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from clients.live import LiveTable
from clients.wire import Endpoint
from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer
from tests.frames import assert_frame_same

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def kv(keys: list[int], vals: list[float], strs: list[str] | None = None) -> pa.Table:
    strs = strs if strs is not None else [f"s{k}" for k in keys]
    return pa.table({"k": pa.array(keys, pa.int64()), "s": pa.array(strs, pa.string()),
                     "v": pa.array(vals, pa.float64())})


def rows_at(table: pa.Table, ranges: list[tuple[int, int]] | None) -> tuple[pa.Table, np.ndarray]:
    """The rows of ``table`` at the viewport's positions, and those positions."""
    if ranges is None:
        return table, np.arange(table.num_rows)
    pos = [np.arange(min(b, table.num_rows), min(e, table.num_rows)) for b, e in ranges]
    p = np.unique(np.concatenate(pos)) if pos else np.empty(0, np.int64)
    return table.take(pa.array(p, pa.int64())), p


def assert_view(live: LiveTable, want_table: pa.Table, ranges: list[tuple[int, int]] | None,
                context: str) -> None:
    """``live.df`` equals the server's rows (at the viewport's positions, as its index)."""
    want, pos = rows_at(want_table, ranges)
    got = live.df
    try:
        assert_frame_same(got.reset_index(drop=True), want.to_pandas())
        assert got.index.tolist() == pos.tolist(), "index is not the rows' positions"
    except AssertionError as exc:
        raise AssertionError(f"{context}: {live!r} differs from the server\n"
                             f"got:\n{got}\nwant:\n{want.to_pandas()}") from exc


class Gate:
    """A ``connect`` for LiveTable that a test can hold shut (to keep a client away)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.open = threading.Event()
        self.open.set()
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if not self.open.wait(30):
            raise TimeoutError("the test never opened the gate")
        return Endpoint(self.location).connect()


@pytest.fixture
def graph() -> UpdateGraph:
    return UpdateGraph(validate=True)


@pytest.fixture
def lives() -> Iterator[list[LiveTable]]:
    """Every LiveTable a test opened, closed at teardown (before the server stops)."""
    opened: list[LiveTable] = []
    yield opened
    for live in opened:
        live.close()


@pytest.fixture
def server(graph: UpdateGraph, lives: list[LiveTable]) -> Iterator[TicktableServer]:
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    for live in lives:
        live.close()
    srv.shutdown()


@pytest.fixture
def subscribe(server: TicktableServer, lives: list[LiveTable]) -> Callable[..., LiveTable]:
    """``subscribe(table, **options)``: a LiveTable on the test server, closed at teardown."""

    def make(table: str, connect: Any = None, **options: Any) -> LiveTable:
        live = LiveTable(connect or Endpoint(server.location).connect, table, **options)
        lives.append(live)
        return live

    return make
