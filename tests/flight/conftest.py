"""A real Flight server on 127.0.0.1 (port 0) over a real update graph, and a raw client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.decoder import ReferenceView, StreamEnded, TriplesView, read_message

OPEN: list[Sub] = []


@pytest.fixture(autouse=True)
def _close_streams() -> Iterator[None]:
    """Close every subscription a test opened (an open stream keeps its client busy)."""
    yield
    while OPEN:
        OPEN.pop().close()


@pytest.fixture
def graph() -> UpdateGraph:
    return UpdateGraph(validate=True)


@pytest.fixture
def server(graph: UpdateGraph) -> Iterator[TicktableServer]:
    srv = TicktableServer(graph, ServerConfig()).start()
    yield srv
    while OPEN:  # a stream still open at shutdown would wait out the end-of-stream grace
        OPEN.pop().close()
    srv.shutdown()


@pytest.fixture
def client(server: TicktableServer) -> Iterator[fl.FlightClient]:
    c = fl.connect(server.location)
    yield c
    while OPEN:
        OPEN.pop().close()
    c.close()


class Sub:
    """A raw protocol-level subscriber: a DoExchange stream plus the reference decoder."""

    def __init__(self, client: fl.FlightClient, table: str, **request: Any) -> None:
        self.writer, self.reader = client.do_exchange(fl.FlightDescriptor.for_path(table))
        OPEN.append(self)
        req = pb.SubscriptionRequest(table=table, **request)
        self.writer.begin(pa.schema([]))
        self.writer.write_metadata(pa.py_buffer(
            pb.ClientMessage(subscribe=req).SerializeToString()))
        self.schema = self.reader.schema
        triples = req.format == pb.DELTA_FORMAT_TRIPLES
        self.view: ReferenceView | TriplesView = (
            TriplesView(self.schema) if triples else ReferenceView(self.schema))
        self.last: Any = None

    def read(self) -> pb.UpdateMetadata:
        try:
            msg = read_message(self.reader, self.schema)
        except StreamEnded:
            self.writer.done_writing()  # the protocol: finish writing, then read the status
            self.reader.read_chunk()  # raises the call's error status
            raise
        self.view.apply(msg)
        self.last = msg
        return msg.meta

    def until(self, sequence: int) -> None:
        while self.view.sequence < sequence:
            self.read()

    def change(self, **fields: Any) -> None:
        msg = pb.ClientMessage(change=pb.SubscriptionChange(**fields))
        self.writer.write_metadata(pa.py_buffer(msg.SerializeToString()))

    def close(self) -> None:
        try:
            self.writer.done_writing()
        except Exception:
            pass
        self.reader.cancel()


def vp(*ranges: tuple[int, int]) -> list[pb.PositionRange]:
    return [pb.PositionRange(begin=b, end=e) for b, e in ranges]


def viewport_rows(table: pa.Table, ranges: list[tuple[int, int]]) -> pa.Table:
    import numpy as np

    pos = [np.arange(max(b, 0), min(e, table.num_rows)) for b, e in ranges]
    p = np.unique(np.concatenate(pos)) if pos else np.empty(0, np.int64)
    return table.take(pa.array(p, pa.int64()))
