"""The join keys' common types: what a key column is compared as (:func:`key_kind`), the
one type both sides of a key pair are brought to (:func:`key_type`), and a batch of key
columns in those types with which rows have a null key (:func:`key_table`).

Both sides of an ``on`` pair must be of one kind: integers of any width and booleans
compare as ``int64``, floats as ``float64``, strings and binaries as their large types,
dictionaries as their values; any other type compares as itself. A row with a null in
any key column matches nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["key_kind", "key_table", "key_type"]

Mask = npt.NDArray[np.bool_]


def _as_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def key_kind(t: pa.DataType) -> str:
    """What a key column is compared as; both sides of a pair must have the same kind."""
    if pa.types.is_dictionary(t):
        return key_kind(t.value_type)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "integer"
    if pa.types.is_floating(t):
        return "floating"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return str(t)


_CANONICAL = {"integer": pa.int64(), "floating": pa.float64(), "string": pa.large_string(),
              "binary": pa.large_binary()}


def key_type(t: pa.DataType) -> pa.DataType:
    """The one type both sides' key columns of this kind are compared as."""
    return _CANONICAL.get(key_kind(t), t.value_type if pa.types.is_dictionary(t) else t)


def key_table(cols: list[pa.Array | pa.ChunkedArray], names: list[str]) -> tuple[pa.Table, Mask]:
    """``(keys, valid)``: the key columns in their :func:`key_type`, and per row whether no
    key is null (rows with a null key belong to no group)."""
    n = len(cols[0])
    valid = np.ones(n, dtype=bool)
    out = []
    for col in cols:  # one pass per key column
        arr = _as_array(col)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        want = key_type(arr.type)
        if arr.type != want:
            arr = arr.cast(want)
        if arr.null_count:
            valid &= arr.is_valid().to_numpy(zero_copy_only=False)
        out.append(arr)
    return pa.Table.from_arrays(out, names=names), valid
