"""Low-level client calls: locations, and acknowledgements that do not add up."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from clients.wire import Endpoint, put_batches
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb


def test_locations_and_unsupported_schemes():
    assert Endpoint("localhost").location == "grpc://localhost:8815"
    assert Endpoint("grpc://h:1", tls=True).location == "grpc+tls://h:1"
    with pytest.raises(ProtocolError, match=r"unsupported scheme 'http' in 'http://h:1'"):
        _ = Endpoint("http://h:1").location


class _Writer:
    def write_with_metadata(self, batch: Any, meta: Any) -> None: ...
    def write_batch(self, batch: Any) -> None: ...
    def write_metadata(self, meta: Any) -> None: ...
    def done_writing(self) -> None: ...
    def close(self) -> None: ...


class _Reader:
    """Acknowledges only the first batch."""

    def __init__(self) -> None:
        self.acks = [pb.PutAck(batch_index=0, rows=1, total_rows=1).SerializeToString()]

    def read(self) -> Any:
        return pa.py_buffer(self.acks.pop()) if self.acks else None


class _Client:
    def do_put(self, descriptor: Any, schema: Any, options: Any) -> tuple[_Writer, _Reader]:
        return _Writer(), _Reader()


def test_a_server_that_acknowledges_fewer_batches_breaks_the_protocol():
    b = pa.record_batch({"x": pa.array([1], pa.int64())})
    with pytest.raises(ProtocolError, match=r"DoPut into 't': sent 2 batches \(2 rows\).*"
                                            r"acknowledged 1 \(PutAck.total_rows 1\)"):
        put_batches(_Client(), None, "t", b.schema, [b, b], pb.PutRequest())
