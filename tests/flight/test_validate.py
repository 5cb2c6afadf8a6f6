"""framing.validate_full: the same verdict as Arrow's full validation, on hostile bytes.

A received record batch is checked once before anything reads it. Its string columns are
checked in numpy when they are ASCII (offsets in order and inside the data, null count
matching the bitmap); everything else goes to Arrow. These tests corrupt string columns
the ways a client could (offsets, null counts, bytes that are not UTF-8, slices) and
require the same accept or refuse as ``RecordBatch.validate(full=True)`` every time.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flight.rpc.framing import _valid_ascii_strings, validate_full

TEXT = st.one_of(st.text(alphabet="abcXYZ09 ", max_size=6), st.text(max_size=4))


def _verdict(fn, batch: pa.RecordBatch) -> bool:
    try:
        fn(batch)
    except pa.ArrowInvalid:
        return False
    return True


def _positions(full: pa.Buffer, column: pa.Array) -> list[int | None]:
    """Where each buffer of ``column`` starts in the serialized message ``full``."""
    return [None if b is None else b.address - full.address for b in column.buffers()]


@st.composite
def _corrupted(draw: st.DrawFn) -> pa.RecordBatch:
    """A batch with a string column as a client could send it: read from IPC bytes without
    any check, after up to two corruptions of those bytes, then sliced."""
    large = draw(st.booleans())
    values = draw(st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=40))
    arr = pa.array(values, pa.large_string() if large else pa.string())
    good = pa.record_batch([pa.array(np.arange(len(arr))), arr], names=["k", "s"])
    full = good.serialize()
    read = ipc.read_record_batch(ipc.read_message(full), good.schema)
    validity_at, offsets_at, data_at = _positions(full, read.column(1))
    raw = bytearray(full.to_pybytes())
    width, fmt = (8, "<q") if large else (4, "<i")
    n_data = len(read.column(1).buffers()[2] or b"")
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["offset", "byte", "bit", "none"]))
        if how == "offset":
            at = offsets_at + width * draw(st.integers(0, len(arr)))
            v = draw(st.sampled_from([-1, 0, 1, n_data, n_data + 1, 1 << 20]))
            raw[at:at + width] = struct.pack(fmt, v)
        elif how == "byte" and n_data:
            raw[data_at + draw(st.integers(0, n_data - 1))] = draw(
                st.sampled_from([0x80, 0xC3, 0xFF, 0x7F, 0x41]))
        elif how == "bit" and validity_at is not None:  # the null count no longer matches
            raw[validity_at + draw(st.integers(0, (len(arr) - 1) // 8))] ^= 1 << draw(
                st.integers(0, 7))
    batch = ipc.read_record_batch(ipc.read_message(pa.py_buffer(bytes(raw))), good.schema)
    start = draw(st.integers(0, len(arr)))
    return batch.slice(start, draw(st.integers(0, len(arr) - start)))


@settings(max_examples=3000, deadline=None)
@given(_corrupted())
def test_same_verdict_as_arrows_full_validation(batch):
    assert _verdict(validate_full, batch) == _verdict(lambda b: b.validate(full=True), batch)


def test_the_numpy_path_is_taken_for_ascii_and_left_to_arrow_otherwise():
    ascii_ = pa.array(["SYM1", None, "", "xyz"])
    assert _valid_ascii_strings(ascii_)
    assert _valid_ascii_strings(ascii_.slice(1, 2))
    assert not _valid_ascii_strings(pa.array(["é"]))  # valid, but Arrow decides
    assert not _valid_ascii_strings(pa.array([1, 2]))
    assert not _valid_ascii_strings(pa.array([b"\xff"], pa.binary()))
    validate_full(pa.record_batch({"s": pa.array(["é", None, "ok"])}))  # accepted by Arrow


@pytest.mark.parametrize("data, message", [
    (b"ab\xff", "UTF8"),  # not UTF-8: left to Arrow, which names it
    (b"a\xc3", "UTF8"),   # a sequence cut short
])
def test_bytes_that_are_not_utf8_are_refused(data, message):
    arr = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(struct.pack("<2i", 0, len(data))),
                                                  pa.py_buffer(data)])
    with pytest.raises(pa.ArrowInvalid, match=message):
        validate_full(pa.record_batch({"s": arr}))
