"""Value sizes in a DoPut batch: no string or binary value longer than ``max_value_bytes``.

The limit itself, its default and flag are in :mod:`flight.limits`.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import LimitExceeded
from flight.limits import limit_text, quoted

__all__ = ["check_values"]


def _is_bytes(t: pa.DataType) -> bool:
    """Whether ``t`` is a string or binary type with offsets (``binary_length`` reads it)."""
    return (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t))


def _longest(arr: pa.Array) -> int:
    """Bytes of the longest string or binary value in ``arr``, nested ones included."""
    t = arr.type
    if _is_bytes(t):
        return int(pc.max(pc.binary_length(arr)).as_py() or 0)  # nulls skipped
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _longest(arr.cast(pa.large_binary()))  # binary_length has no view kernel
    if pa.types.is_dictionary(t):  # the values its indices use, not the whole dictionary
        if _is_bytes(t.value_type):  # lengths, not values, taken per row
            return int(pc.max(pc.take(pc.binary_length(arr.dictionary), arr.indices)).as_py()
                       or 0)
        return _longest(arr.dictionary.take(arr.indices))
    if pa.types.is_map(t):  # keys and items, of this slice only
        return max(_longest(pa.ListArray.from_arrays(arr.offsets, arr.keys).flatten()),
                   _longest(pa.ListArray.from_arrays(arr.offsets, arr.items).flatten()))
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return _longest(arr.flatten())
    if pa.types.is_struct(t):
        return max((_longest(f) for f in arr.flatten()), default=0)
    return 0


def _span(arr: pa.Array) -> float:
    """Bytes a string or binary array's values take together (from two offsets); infinite
    for any other type (their values are measured one by one)."""
    t = arr.type
    if not _is_bytes(t) or len(arr) == 0:
        return 0 if _is_bytes(t) else math.inf
    dtype = np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32
    try:
        offsets = np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr) + 1)
    except (TypeError, ValueError):  # no offsets buffer of that size: measure each value
        return math.inf
    return int(offsets[-1]) - int(offsets[arr.offset])


def _holds_values(t: pa.DataType) -> bool:
    """Whether values of type ``t`` can hold strings or binaries."""
    if pa.types.is_dictionary(t):
        return _holds_values(t.value_type)
    if _is_bytes(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return True
    return any(_holds_values(t.field(i).type) for i in range(t.num_fields))


def check_values(table: str, data: pa.Table, limit: int | None) -> None:
    """Refuse ``data`` if a string or binary value, nested ones included, passes ``limit``.

    Strings and binaries of every width, in dictionaries (the values used), lists, structs
    and maps; unions are not looked into. Vectorized: a ``binary_length`` and a ``max``
    per column chunk and nesting level. ``limit`` ``None``: no limit.

    Raises
    ------
    LimitExceeded
        Naming the table, the first column too long and its longest value's size.

    Examples
    --------
    >>> check_values("t", pa.table({"s": ["ab", "abcdef"]}), 4)
    Traceback (most recent call last):
    ...
    engine.errors.LimitExceeded: table 't': column 's' holds a value of 6 bytes, above the \
limit of 4 (max_value_bytes; ticktable serve --max-value-bytes N); send smaller values
    """
    if limit is None or data.get_total_buffer_size() <= limit:
        # no value is longer than all the buffers together (dictionaries, views' data and
        # nested children included): the common batch, far below the limit, in 0.2 us
        return
    for name, col in zip(data.column_names, data.columns, strict=True):
        if not _holds_values(col.type):
            continue
        if all(_span(chunk) <= limit for chunk in col.chunks):
            continue  # no value can be longer than all of them together
        longest = max((_longest(chunk) for chunk in col.chunks), default=0)
        if longest > limit:
            raise LimitExceeded(
                f"table {quoted(table)}: column {quoted(name)} holds a value of {longest} "
                f"bytes, above {limit_text('max_value_bytes', limit)}; send smaller values")
