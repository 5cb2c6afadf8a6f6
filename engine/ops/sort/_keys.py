"""Sort keys as order-preserving ``uint64`` codes (the comparisons of engine.ops.sort).

Every sort column gets a :class:`KeyEncoder` that turns Arrow values into ``uint64`` codes
whose unsigned order is the sort order, so numpy compares whole batches at once
(``searchsorted``, ``lexsort``). Order semantics, for every column:

* **null is the largest value** (NaN counts as null): nulls come last in an ascending
  column and first in a descending one (pandas ``na_position="last"`` / ``"first"``);
* ``-0.0`` equals ``0.0``; strings and binaries compare bytewise (UTF-8 code point order,
  as Python and Arrow do); a ``decimal128`` of up to 18 digits compares by its unscaled
  value (exact: one scale per column);
* descending is the bitwise complement of the ascending code (so nulls flip to first).

Codes are *exact* (equal codes mean equal sort values) except in two places, where
:meth:`KeyEncoder.ambiguous` says so and :meth:`KeyEncoder.compare` settles ties on the
Arrow values:

* strings and binaries: the code holds the first 7 bytes and ``min(length, 8)``, so it is
  exact for values shorter than 8 bytes and ambiguous between two longer values sharing
  their first 7 bytes;
* 64-bit integers (and 64-bit temporal types): null and the largest value share the top
  code.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import SchemaError

__all__ = ["KeyEncoder", "MAX_CODE", "SORTABLE", "as_arrow", "encoder_for", "order_batch",
           "sortable"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

MAX_CODE = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_SIGN = np.uint64(0x8000_0000_0000_0000)
_MAX_INT, _SIGN_INT = int(MAX_CODE), int(_SIGN)
#: float batches of up to this many values are encoded as Python numbers (tests change it)
FEW_FLOATS = 8
_PREFIX = 7  # bytes of a string kept in its code


def as_arrow(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous Arrow array (sources may hand back chunked arrays)."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _valid(arr: pa.Array) -> Mask | None:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _fixed(arr: pa.Array, dtype: Any) -> npt.NDArray[Any]:
    """The value buffer of a fixed-width array as numpy, without copying."""
    buf = arr.buffers()[1]
    n = len(arr)
    if buf is None or n == 0:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + n)[arr.offset :]


#: A decimal of up to this many digits sorts by its unscaled value, an int64 (|v| < 10**18).
_DECIMAL_DIGITS = 18
#: The types a sort key may have, in words.
SORTABLE = (f"sortable types are integers, floats, decimals of up to {_DECIMAL_DIGITS} digits, "
            f"booleans, strings, binaries, dates, times, timestamps and durations")


def sortable(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` can be a sort key (:data:`SORTABLE`)."""
    try:
        KeyEncoder("", t, False)
    except SchemaError:
        return False
    return True


def _decimal_units(arr: pa.Array) -> npt.NDArray[np.int64]:
    """A ``decimal128`` array's unscaled values (``1.25`` of scale 2 is 125) as int64, the
    low word of each 16-byte two's complement value: exact while they fit 63 bits."""
    buf = arr.buffers()[1]
    n = len(arr)
    if buf is None or n == 0:
        return np.zeros(n, dtype=np.int64)
    words = np.frombuffer(buf, dtype="<i8", count=2 * (arr.offset + n))
    return np.ascontiguousarray(words[2 * arr.offset :: 2])


def _float_codes_few(arr: pa.Array, descending: bool) -> U64:
    """:meth:`KeyEncoder.encode` of a few floats, value by value: the same codes (the bits
    of ``x + 0.0``, negatives flipped, positives with the sign bit set; null and NaN the
    largest), for a handful of values cheaper than the vectorized passes."""
    out = []
    for v in arr.to_pylist():  # at most FEW_FLOATS values
        if v is None or v != v:
            code = _MAX_INT
        else:
            bits = int.from_bytes(struct.pack("<d", v + 0.0), "little")  # -0.0 -> 0.0
            code = (~bits & _MAX_INT) if bits >= _SIGN_INT else bits | _SIGN_INT
        out.append(_MAX_INT ^ code if descending else code)
    return np.array(out, dtype=np.uint64)


def _string_codes(arr: pa.Array, large: bool) -> U64:
    n = len(arr)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32,
                            count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(1, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    mat = np.zeros((n, 8), dtype=np.uint8)
    j = np.arange(_PREFIX)
    inside = j[None, :] < np.minimum(lengths, _PREFIX)[:, None]
    head = mat[:, :_PREFIX]
    head[inside] = data[(starts[:, None] + j[None, :])[inside]]
    mat[:, _PREFIX] = np.minimum(lengths, _PREFIX + 1)
    return mat.view(">u8").reshape(n).astype(np.uint64)


class KeyEncoder:
    """Order-preserving codes for one sort column (see the module docstring).

    Parameters
    ----------
    column
        Column name (for messages).
    type
        The column's Arrow type.
    descending
        Sort this column from largest to smallest (nulls first).
    """

    def __init__(self, column: str, type: pa.DataType, descending: bool) -> None:
        self.column = column
        self.type = type
        self.descending = descending
        self._view: pa.DataType | None = None  # integer view of a temporal type
        t = type
        if pa.types.is_floating(t) and not pa.types.is_float16(t):
            self._kind = "float"
        elif pa.types.is_boolean(t):
            self._kind = "bool"
        elif pa.types.is_signed_integer(t):
            self._kind = "int"
        elif pa.types.is_unsigned_integer(t):
            self._kind = "uint"
        elif (pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t)
              or pa.types.is_time64(t)):
            self._kind = "int"
            self._view = pa.int64()
        elif pa.types.is_date32(t) or pa.types.is_time32(t):
            self._kind = "int"
            self._view = pa.int32()
        elif pa.types.is_decimal128(t) and t.precision <= _DECIMAL_DIGITS:
            self._kind = "decimal"
        elif pa.types.is_string(t) or pa.types.is_binary(t):
            self._kind = "str"
        elif (pa.types.is_large_string(t) or pa.types.is_large_binary(t)
              or pa.types.is_string_view(t) or pa.types.is_binary_view(t)):
            self._kind = "large_str"
        else:
            raise SchemaError(f"cannot sort by column {column!r} of type {t}: {SORTABLE} (cast "
                              f"the column first, e.g. with update())")
        width = (self._view if self._view is not None else t).bit_width if self._kind in ("int", "uint") else 0
        #: whether two equal codes can hide different values (strings, 64-bit integers)
        self.exact = self._kind not in ("str", "large_str") and width != 64

    # codes ------------------------------------------------------------------------
    def encode(self, values: pa.Array | pa.ChunkedArray) -> U64:
        """The codes of ``values`` (descending already applied)."""
        arr = as_arrow(values)
        kind = self._kind
        if kind == "large_str" and (pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type)):
            arr = arr.cast(pa.large_binary() if pa.types.is_binary_view(arr.type) else pa.large_string())
        if kind == "float" and len(arr) <= FEW_FLOATS:
            return _float_codes_few(arr, self.descending)
        valid = _valid(arr)
        if kind == "float":
            x = _fixed(arr, arr.type.to_pandas_dtype()).astype(np.float64) + 0.0  # -0.0 -> 0.0
            bits = x.view(np.uint64)
            codes = np.where(bits >= _SIGN, ~bits, bits | _SIGN)
            nan = np.isnan(x)
            valid = ~nan if valid is None else valid & ~nan
        elif kind == "bool":
            codes = np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=np.uint64)
        elif kind == "int":
            if self._view is not None:
                arr = arr.view(self._view)
            codes = _fixed(arr, arr.type.to_pandas_dtype()).astype(np.int64).view(np.uint64) ^ _SIGN
        elif kind == "uint":
            codes = _fixed(arr, arr.type.to_pandas_dtype()).astype(np.uint64)
        elif kind == "decimal":
            codes = _decimal_units(arr).view(np.uint64) ^ _SIGN
        else:
            codes = _string_codes(arr, large=kind == "large_str")
        if valid is not None:
            codes = np.where(valid, codes, MAX_CODE)
        return ~codes if self.descending else codes

    def ambiguous(self, codes: U64) -> Mask:
        """Where an equal code does not imply an equal value (only for inexact encoders)."""
        asc = ~codes if self.descending else codes
        if self._kind in ("str", "large_str"):
            out = (asc & np.uint64(0xFF)) == np.uint64(_PREFIX + 1)
        else:
            out = asc == MAX_CODE
        return np.asarray(out, dtype=bool)

    # exact comparisons on values ----------------------------------------------------
    def compare(self, a: pa.Array, b: pa.Array) -> npt.NDArray[np.int8]:
        """Per row: ``-1``/``0``/``1`` as ``a`` sorts before/with/after ``b``."""
        a, b = as_arrow(a), as_arrow(b)
        an = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        bn = np.asarray(b.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        lt = np.asarray(pc.fill_null(pc.less(a, b), False).to_numpy(zero_copy_only=False), dtype=bool)
        gt = np.asarray(pc.fill_null(pc.greater(a, b), False).to_numpy(zero_copy_only=False), dtype=bool)
        out = np.where(lt, -1, np.where(gt, 1, 0)).astype(np.int8)
        out[an & ~bn] = 1  # null is the largest value
        out[~an & bn] = -1
        return -out if self.descending else out

    def rank(self, values: pa.Array | pa.ChunkedArray, codes: U64) -> U64:
        """Keys that sort a batch exactly: the codes, or dense ranks where codes are inexact."""
        if self.exact or not self.ambiguous(codes).any():
            return codes
        arr = as_arrow(values)
        valid = _valid(arr)
        present = arr if valid is None else arr.filter(pa.array(valid))
        ranks = pc.rank(present, sort_keys="descending" if self.descending else "ascending",
                        tiebreaker="dense")
        ranked = np.asarray(ranks.to_numpy(zero_copy_only=False), dtype=np.uint64)
        if valid is None:
            return ranked
        # null is the largest value: after everything ascending, before everything descending
        out = np.full(len(arr), 0 if self.descending else ranked.size + 1, dtype=np.uint64)
        out[valid] = ranked
        return out


def encoder_for(schema: pa.Schema, column: str, descending: bool, table_name: str) -> KeyEncoder:
    """The encoder of ``column``, or SchemaError naming the table's columns."""
    if column not in schema.names:
        raise SchemaError(
            f"cannot sort table {table_name!r} by {column!r}: no such column "
            f"(has: {', '.join(schema.names)})"
        )
    return KeyEncoder(column, schema.field(column).type, descending)


def order_batch(encoders: Sequence[KeyEncoder], values: Sequence[pa.Array], codes: Sequence[U64],
                pks: I64, *, pks_sorted: bool = False) -> I64:
    """The permutation that sorts a batch of rows by the sort keys, ties by parent key.

    With ``pks_sorted`` the batch is already in parent-key order and a stable sort on the
    keys alone keeps ties in that order.
    """
    if pks.size < 2:
        return np.arange(pks.size, dtype=np.int64)
    ranks = [enc.rank(v, c) for enc, v, c in zip(reversed(encoders), reversed(values), reversed(codes), strict=True)]
    if len(ranks) == 1:
        # a sort of the one key, then of its tied runs by parent key: neither a radix sort
        # into parent-key order first nor a lexsort of two 64-bit keys
        return _argsort_ties_by(ranks[0], None if pks_sorted else pks)
    return np.lexsort(ranks if pks_sorted else [pks, *ranks]).astype(np.int64)


def _argsort_ties_by(k: npt.NDArray[Any], tiebreak: I64 | None) -> I64:
    """The permutation sorting ``k``, ties by ``tiebreak`` (distinct), or by position
    where it is None (``argsort(k, kind="stable")``), faster on mostly distinct keys.

    numpy's stable sort of 64-bit keys is a timsort; a quicksort, then a sort of the tied
    runs only, does less work when few keys tie (figures: bench/README.md).
    """
    order = np.argsort(k).astype(np.int64)
    ks = k[order]
    tie = ks[1:] == ks[:-1]
    if not tie.any():
        return order
    in_run = np.concatenate((tie, [False])) | np.concatenate(([False], tie))
    run = np.cumsum(np.concatenate(([True], ~tie)))  # run id of each sorted position
    sub = np.flatnonzero(in_run)
    by = order[sub] if tiebreak is None else tiebreak[order[sub]]
    fix = np.lexsort((by, run[sub]))  # distinct within a run: any sort is stable
    order[sub] = order[sub][fix]
    return order
