"""Value plumbing of ``engine.ops.aggregate``: reading values and order-preserving codes.

* reading parent columns as Arrow arrays or ``(numpy values, validity)`` pairs
  (:func:`fetch`, :func:`fetch_numpy`, :func:`numpy_of`);
* which values an aggregation counts (:func:`valid_mask`) and per-row equality of
  ``(values, validity)`` pairs (:func:`pairs_equal`: is an output really changed?), the
  rule of :func:`engine._kernels.hashing.values_equal`;
* order-preserving ``uint64`` encodings of numbers (:func:`encode`, :func:`decode`) for
  the sorted structures behind min/max, and of strings and binaries as a sequence of words
  (:class:`StringWords`) for sorted_first/sorted_last (:func:`orderable`).

Hashing group keys and the hash maps are kernels (:mod:`engine._kernels`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine._kernels.arrays import numeric_view
from engine.columns import (
    ColumnSource,
    NumpyColumnSource,
    RedirectingColumnSource,
    numpy_storage_dtype,
)

__all__ = [
    "StringWords",
    "decode",
    "encode",
    "fetch",
    "fetch_numpy",
    "numpy_of",
    "orderable",
    "pairs_equal",
    "valid_mask",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]

_SIGN = np.uint64(1 << 63)
_WORD = 7  # bytes of a string per word (the word's low byte is its marker)

# reading parent values ------------------------------------------------------------------
def fetch(src: ColumnSource, keys: I64, prev: bool) -> pa.Array:
    """Values at ``keys`` as one Arrow array (previous values and key space when ``prev``)."""
    arr = src.get_prev(keys) if prev else src.get(keys)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def fetch_numpy(src: ColumnSource, keys: I64, prev: bool) -> NumPair:
    """``(values, validity or None)`` at ``keys`` in the column's numpy storage dtype.

    A column read through maps (a computed column stored by slot, a sorted table's) down
    to numpy storage is read there, keys translated map by map: no Arrow array between."""
    inner, at = src, keys
    while isinstance(inner, RedirectingColumnSource):
        at = inner.translate_prev(at) if prev else inner.translate(at)
        inner = inner.inner
    if isinstance(inner, NumpyColumnSource):
        return inner.get_prev_numpy(at) if prev else inner.get_numpy(at)
    return numpy_of(fetch(src, keys, prev))


def numpy_of(arr: pa.Array) -> NumPair:
    """A fixed-width Arrow array as ``(values, validity or None)`` without per-value work.

    Null-free numbers and temporals are :func:`~engine._kernels.arrays.numeric_view`'s view;
    this adds the validity and the bit-packed booleans."""
    if not arr.null_count and not pa.types.is_boolean(arr.type):
        view = numeric_view(arr, combine=True)
        if view is not None:
            return view, None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    if pa.types.is_boolean(arr.type):
        data = (pc.fill_null(arr, False) if arr.null_count else arr).to_numpy(zero_copy_only=False)
        return np.asarray(data, dtype=bool), valid
    dtype = numpy_storage_dtype(arr.type)
    assert dtype is not None, arr.type
    if len(arr) == 0:
        return np.empty(0, dtype=dtype), valid
    buf = arr.buffers()[1]
    data = np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset :]
    return data, valid


def valid_mask(values: npt.NDArray[Any], valid: Mask | None) -> Mask:
    """Rows an aggregation counts: not null and, for floats, not NaN (pandas semantics)."""
    if values.dtype.kind != "f":
        return np.ones(values.size, dtype=bool) if valid is None else valid.copy()
    ok: Mask = np.isnan(values)
    np.logical_not(ok, out=ok)
    if valid is not None:
        ok &= valid
    return ok


def pairs_equal(old: NumPair, new: NumPair) -> Mask:
    """Per row: same value, null equal to null, NaN equal to NaN (``-0.0 == 0.0``)."""
    (a, av), (b, bv) = old, new
    same: Mask = np.asarray(a == b, dtype=bool)
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    if av is None and bv is None:
        return same
    av = np.ones(a.size, dtype=bool) if av is None else av
    bv = np.ones(b.size, dtype=bool) if bv is None else bv
    return (av & bv & same) | (~av & ~bv)


# order-preserving encodings ------------------------------------------------------------
def encode(values: npt.NDArray[Any]) -> U64:
    """``uint64`` whose unsigned order is the numeric order (floats: -0.0 as 0.0, no NaN)."""
    kind = values.dtype.kind
    if kind == "f":
        bits = (values.astype(np.float64) + 0.0).view(np.uint64)
        return np.where(bits & _SIGN, ~bits, bits | _SIGN)
    if kind in "ub":
        return values.astype(np.uint64)
    return values.astype(np.int64).view(np.uint64) ^ _SIGN


def decode(enc: U64, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """Inverse of :func:`encode` into ``dtype``."""
    kind = dtype.kind
    if kind == "f":
        bits = np.where(enc & _SIGN, enc & ~_SIGN, ~enc)
        return bits.view(np.float64).astype(dtype)
    if kind in "ub":
        return enc.astype(dtype)
    return (enc ^ _SIGN).view(np.int64).astype(dtype)


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                or pa.types.is_large_binary(t))


def orderable(t: pa.DataType) -> bool:
    """Whether rows can be ordered by a column of type ``t`` (sorted_first/sorted_last):
    fixed-width (numbers, bools, temporals: :func:`encode`) or strings and binaries
    (:class:`StringWords`)."""
    return numpy_storage_dtype(t) is not None or _is_text(t)


class StringWords:
    """Strings or binaries as sequences of order-preserving ``uint64`` words.

    Word ``k`` of a value holds its bytes ``[7k, 7k + 7)`` in its high seven bytes (zero
    padded) and ``min(len - 7k, 8)`` in its low byte, the *marker*: 8 means the value goes
    on in word ``k + 1``, less that it ends in this word. Comparing two values bytewise
    (UTF-8 code point order for strings) is comparing their words in turn: a value that is
    a prefix of another has the smaller marker where it ends. Word ``k`` exists for
    ``k == 0`` and for values of at least ``7k + 1`` bytes. (``engine.ops.sort`` codes a
    string as its word 0.)
    """

    def __init__(self, arr: pa.Array) -> None:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        n = len(arr)
        bufs = arr.buffers()
        if n:
            offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32,
                                    count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
        else:
            offsets = np.zeros(1, dtype=np.int64)
        self.data = np.frombuffer(bufs[2], dtype=np.uint8) if n and bufs[2] is not None \
            else np.zeros(1, dtype=np.uint8)
        self.starts = offsets[:-1]
        self.lengths = offsets[1:] - self.starts

    def rows_at(self, k: int) -> I64:
        """The values that have a word ``k``."""
        if k == 0:
            return np.arange(self.lengths.size, dtype=np.int64)
        return np.flatnonzero(self.lengths >= _WORD * k + 1)

    def words(self, k: int, rows: I64) -> U64:
        """Word ``k`` of the values ``rows`` (which have one)."""
        left = self.lengths[rows] - _WORD * k
        mat = np.zeros((rows.size, 8), dtype=np.uint8)
        j = np.arange(_WORD)
        inside = j[None, :] < np.minimum(left, _WORD)[:, None]
        head = mat[:, :_WORD]
        head[inside] = self.data[(self.starts[rows, None] + _WORD * k + j[None, :])[inside]]
        mat[:, _WORD] = np.minimum(left, _WORD + 1)
        out: U64 = mat.view(">u8").reshape(rows.size).astype(np.uint64)
        return out

    @staticmethod
    def goes_on(words: U64) -> Mask:
        """Which words are followed by another (marker 8)."""
        out: Mask = (words & np.uint64(0xFF)) == np.uint64(_WORD + 1)
        return out
