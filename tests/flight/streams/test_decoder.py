"""The reference decoder refuses a stream that breaks the protocol with ProtocolError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from pyroaring import BitMap64

from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import Message, ReferenceView, TriplesView, read_message

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])


@dataclass
class Chunk:
    data: Any = None
    app_metadata: Any = None


class Reader:
    """``read_chunk`` over a list of chunks, as a Flight stream reader."""

    def __init__(self, *chunks: Chunk) -> None:
        self.chunks = list(chunks)
        self.schema = KV

    def read_chunk(self) -> Chunk:
        if not self.chunks:
            raise StopIteration
        return self.chunks.pop(0)


def meta(**fields: Any) -> pb.UpdateMetadata:
    return pb.UpdateMetadata(**fields)


def rows(*keys: int) -> bytes:
    return BitMap64(keys).serialize()


def batch(*keys: int) -> pa.RecordBatch:
    return pa.record_batch({"k": pa.array(keys, pa.int64()),
                            "v": pa.array([float(k) for k in keys])}, schema=KV)


def test_a_good_snapshot_then_delta():
    view = ReferenceView(KV)
    first = read_message(Reader(
        Chunk(app_metadata=pa.py_buffer(meta(is_snapshot=True, added_rows=rows(0, 1),
                                             added_data_rows=rows(0, 1), num_added_batches=1,
                                             columns=["k", "v"], sequence=1,
                                             table_size=2).SerializeToString())),
        Chunk(data=batch(10, 11))))
    view.apply(first)
    assert view.to_arrow().column("k").to_pylist() == [10, 11]


def test_the_first_batch_may_carry_the_metadata():
    """The server's framing: the first record batch carries the UpdateMetadata; it counts as
    the first of the added batches, and a modified batch follows."""
    view = ReferenceView(KV)
    view.apply(read_message(Reader(
        Chunk(data=batch(10, 11), app_metadata=pa.py_buffer(meta(
            is_snapshot=True, added_rows=rows(0, 1), added_data_rows=rows(0, 1),
            num_added_batches=1, columns=["k", "v"], sequence=1,
            table_size=2).SerializeToString())))))
    m = read_message(Reader(
        Chunk(data=batch(12), app_metadata=pa.py_buffer(meta(
            added_rows=rows(2), added_data_rows=rows(2), modified_data_rows=rows(0),
            modified=[pb.ColumnModified(column="v", rows=rows(0))], num_added_batches=1,
            num_modified_batches=1, columns=["k", "v"], sequence=2,
            table_size=3).SerializeToString())),
        Chunk(data=batch(20))))
    assert m.added.column("k").to_pylist() == [12] and m.modified.column("k").to_pylist() == [20]
    view.apply(m)
    assert view.to_arrow().column("k").to_pylist() == [20, 11, 12]


@pytest.mark.parametrize("chunks, match", [
    ([Chunk(data=batch(1))], "bare record batch"),
    ([Chunk(data=batch(1), app_metadata=pa.py_buffer(meta().SerializeToString()))],
     r"carries a record batch but num_added_batches \+ num_modified_batches is 0"),
    ([Chunk(data=batch(1), app_metadata=pa.py_buffer(meta(num_added_batches=2).SerializeToString())),
      Chunk(data=batch(2), app_metadata=pa.py_buffer(meta(sequence=3).SerializeToString()))],
     "app_metadata on a record batch that is not the message's first"),
    ([Chunk(app_metadata=pa.py_buffer(b"\xff\xff\xff"))], "not an UpdateMetadata"),
    ([Chunk(app_metadata=pa.py_buffer(meta(num_added_batches=1).SerializeToString())),
      Chunk(app_metadata=pa.py_buffer(b""))], r"expected 1 record batch\(es\)"),
])
def test_read_message_refuses_broken_framing(chunks, match):
    with pytest.raises(ProtocolError, match=match):
        read_message(Reader(*chunks))


def _msg(m: pb.UpdateMetadata, added: pa.Table | None = None) -> Message:
    return Message(m, added if added is not None else KV.empty_table(), KV.empty_table())


@pytest.mark.parametrize("m, match", [
    (meta(format=pb.DELTA_FORMAT_TRIPLES), "UpdateMetadata.format"),
    (meta(removed_rows=rows(5)), r"UpdateMetadata.removed_rows has rows that are not held"),
    (meta(added_rows=rows(3), added_data_rows=rows(3)), r"1 data rows announced"),
    (meta(added_rows=rows(3), columns=["k", "v"]), r"no values for 1 held rows"),
])
def test_reference_view_refuses_messages_that_break_the_protocol(m, match):
    view = ReferenceView(KV)
    with pytest.raises(ProtocolError, match=match):
        view.apply(_msg(m))


def test_triples_view_refuses_the_other_format_and_negative_multiplicities():
    schema = pa.schema([("k", pa.int64()), ("__diff", pa.int64())])
    view = TriplesView(schema)
    with pytest.raises(ProtocolError, match="UpdateMetadata.format"):
        view.apply(Message(meta(format=pb.DELTA_FORMAT_UPDATES), schema.empty_table(),
                           schema.empty_table()))
    view.apply(Message(meta(format=pb.DELTA_FORMAT_TRIPLES, columns=["k"]),
                       pa.table({"k": [1], "__diff": [-1]}, schema=schema), schema.empty_table()))
    with pytest.raises(ProtocolError, match="__diff weights .* negative multiplicity"):
        view.to_arrow()
