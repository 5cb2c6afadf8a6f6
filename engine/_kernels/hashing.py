"""The one row hash and the one equality rule, whole columns at a time.

Everything that groups, indexes or matches rows by value (keyed sources, aggregations,
joins, the differential layer, ingestion) hashes here and compares here. The policy is
**hash, then verify**: a hash only finds candidates, :func:`values_equal` decides, so a
collision costs a comparison, never a merge of two different keys. The one exception is
declared by :func:`exact_hash`: a single integer-like column hashes through a bijection
(:func:`mix64`), so equal hashes are proof and verification can be skipped.

Hashes are *stable*: the same values hash the same in every batch, slice, chunking and
offset width (``string``, ``large_string`` and ``string_view`` agree), so a key found in one
batch is found by its hash in a structure built from others. Per type (nulls get one fixed
hash, the same in every column and type):

* integers, booleans, dates, times, timestamps, durations: ``mix64`` of the int64 value;
* floats: the float64 bits with ``-0.0`` folded into ``0.0`` and every NaN into one NaN,
  matching :func:`values_equal` (``0.0 == -0.0``, ``NaN == NaN``), mixed;
* strings and binaries (plain, large, view): the bytes read eight at a time straight from
  Arrow's buffers (two aligned ``uint64`` gathers and shifts per word, no per-byte pass and
  no Python objects), each word folded in with ``mix64``; longer batches with many repeats
  (judged on a sample) hash their dictionary once instead, and a few values (at most
  ``FEW_STRINGS``) are hashed as plain Python integers, by the same steps;
* decimals, fixed-size binaries, month-day-nano intervals: their fixed-width bytes, folded
  as words; dictionaries hash their dictionary, gathered by index.

Other types (lists, structs, maps) are refused with a :class:`SchemaError`.

The hash constants (splitmix64's multipliers, the golden ratio) are defined here and
nowhere else; :mod:`engine._kernels.hashmap` imports :data:`GOLDEN`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import SchemaError

__all__ = [
    "GOLDEN",
    "Same",
    "combine",
    "exact_hash",
    "exact_type",
    "exact_values",
    "few_rows_equal",
    "group_equal",
    "hash_column",
    "hash_columns",
    "hash_rows",
    "mix64",
    "plain_type",
    "rows_equal",
    "rows_equal_at",
    "same_rows",
    "values_equal",
]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
Column: TypeAlias = "pa.Array | pa.ChunkedArray"

_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finalizer multipliers
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: Fibonacci hashing, seeds
_COMBINE = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's fmix multiplier, for folding columns
_S3, _S7, _S27, _S30, _S31 = np.uint64(3), np.uint64(7), np.uint64(27), np.uint64(30), np.uint64(31)
_ONE, _63, _ALL = np.uint64(1), np.uint64(63), np.uint64(0xFFFFFFFFFFFFFFFF)
_DICT_MIN = 4096  # from this many strings on, a sample decides whether to hash a dictionary
_DICT_SAMPLE = 1024
FEW_STRINGS = 16  # up to this many strings hash as plain integers (module attribute: tests change it)


# mixing ------------------------------------------------------------------------------------
def mix64(x: U64) -> U64:
    """splitmix64's finalizer: a bijection on uint64 that spreads every input bit."""
    if np.ndim(x) == 0:  # scalars warn on overflow; arrays wrap
        with np.errstate(over="ignore"):
            return _mix64_array(np.atleast_1d(np.asarray(x, dtype=np.uint64)))[0]  # type: ignore[no-any-return]
    return _mix64_array(x)


def _mix64_array(x: U64) -> U64:
    # in place on two temporaries: a hash is computed for every row of a batch
    z = x >> _S30
    z ^= x
    z *= _M1
    t = z >> _S27
    z ^= t
    z *= _M2
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


# the hash of a null, in every column: that of the int64 -2**63 (pandas' NaT), the one value
# an exact integer-like hash cannot tell from a null (see exact_hash)
_NULL = _mix64_array(np.array([1 << 63], dtype=np.uint64))[0]


def combine(h: U64, other: U64) -> U64:
    """Order-dependent combination of two hash columns."""
    if np.ndim(h) == 0:
        with np.errstate(over="ignore"):
            return mix64(h * _COMBINE + other + GOLDEN)
    z = h * _COMBINE
    z += other
    z += GOLDEN
    return _mix64_array(z)


# per type ----------------------------------------------------------------------------------
def _single(col: Column) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 0:
            return pa.array([], type=col.type)
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _int_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_boolean(t)
                or (pa.types.is_temporal(t) and t.bit_width <= 64))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
                or pa.types.is_binary_view(t))


def _fixed_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t)
                or t == pa.month_day_nano_interval())


def _int64_values(arr: pa.Array) -> I64:
    t = arr.type
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.int8())
    elif pa.types.is_temporal(t):
        arr = arr.view(pa.int64() if t.bit_width == 64 else pa.int32())
    if arr.null_count:
        arr = arr.fill_null(0)
    v = np.asarray(arr.to_numpy(zero_copy_only=False))
    out: I64 = v.view(np.int64) if v.dtype == np.uint64 else v.astype(np.int64, copy=False)
    return out


def _hash_binary(arr: pa.Array) -> U64:
    """Hash each string/binary value by its bytes, eight at a time, from Arrow's buffers.

    Word ``j`` of a value starting at byte ``o`` is read as two aligned ``uint64`` of the
    data buffer, shifted and or-ed, then masked to the value's length; each word is folded
    in with :func:`mix64` starting from ``length * GOLDEN``. Rounds are as many as the
    longest value has words; each touches only the values still that long.
    """
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())
        t = arr.type
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    n = len(arr)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset: arr.offset + n + 1]
    o0, o1 = int(off[0]), int(off[-1])
    lens = np.diff(off).astype(np.int64)
    h = lens.astype(np.uint64) * GOLDEN
    if o1 == o0:
        return h
    words = np.zeros((o1 - o0 + 15) // 8, dtype=np.uint64)  # the bytes, zero-padded, aligned
    words.view(np.uint8)[: o1 - o0] = np.frombuffer(bufs[2], dtype=np.uint8, count=o1 - o0, offset=o0)
    start = (off[:-1] - o0).astype(np.uint64)
    longest = int(lens.max())
    act: I64 | None = None  # values still long enough, once some are not
    j = 0
    with np.errstate(over="ignore"):
        while 8 * j < longest:
            if act is None and int(lens.min()) <= 8 * j:
                act = np.flatnonzero(lens > 8 * j)
            elif act is not None:
                act = act[lens[act] > 8 * j]
            o = start + np.uint64(8 * j) if act is None else start[act] + np.uint64(8 * j)
            rem = lens - 8 * j if act is None else lens[act] - 8 * j
            q = o >> _S3
            r = (o & _S7) << _S3  # bit offset of the value's byte in its aligned word
            w = words[q] >> r
            w |= (words[q + _ONE] << _ONE) << (_63 - r)  # two shifts: r == 0 gives 0
            if int(rem.min()) < 8:  # last partial word: keep the value's bytes only
                keep = np.minimum(rem, 8).astype(np.uint64) << _S3
                w &= ~((_ALL << _ONE) << (keep - _ONE))
            if act is None:
                h ^= w
                h = _mix64_array(h)
            else:
                h[act] = _mix64_array(h[act] ^ w)
            j += 1
    return h


_MASK = (1 << 64) - 1
_M1_INT, _M2_INT, _GOLDEN_INT = int(_M1), int(_M2), int(GOLDEN)


def _hash_binary_few(arr: pa.Array) -> U64:
    """:func:`_hash_binary` of a few values, as plain integers (the same hashes: word by
    word from ``length * GOLDEN``, each zero-padded word folded in with mix64); for a
    handful of keys numpy's per-call cost is most of the vectorized version's time."""
    out = []
    for v in arr.to_pylist():  # nulls hash as anything here: _hash_values overwrites them
        b = b"" if v is None else v.encode() if isinstance(v, str) else v
        h = (len(b) * _GOLDEN_INT) & _MASK
        for j in range(0, len(b), 8):
            z = h ^ int.from_bytes(b[j:j + 8], "little")
            z = ((z ^ (z >> 30)) * _M1_INT) & _MASK
            z = ((z ^ (z >> 27)) * _M2_INT) & _MASK
            h = z ^ (z >> 31)
        out.append(h)
    return np.array(out, dtype=np.uint64)


def _hash_strings(arr: pa.Array) -> U64:
    """:func:`_hash_binary`, through a dictionary when a sample shows many repeats, or as
    plain integers for at most ``FEW_STRINGS`` values."""
    n = len(arr)
    if n <= FEW_STRINGS:
        return _hash_binary_few(arr)
    # a dictionary pays from ~1 repeat in 40 sampled values on; with fewer repeats,
    # building it costs more than it saves
    if n >= _DICT_MIN and len(pc.unique(arr.slice(0, _DICT_SAMPLE))) * 40 <= 39 * _DICT_SAMPLE:
        enc = pc.dictionary_encode(arr)
        return _hash_dictionary(enc)
    return _hash_binary(arr)


def _hash_dictionary(arr: pa.DictionaryArray) -> U64:
    d = _hash_values(arr.dictionary, "dictionary")
    idx = arr.indices
    if idx.null_count:
        idx = idx.fill_null(0)
    i = np.asarray(idx.to_numpy(zero_copy_only=False))
    if d.size == 0:
        return np.full(len(arr), _NULL, dtype=np.uint64)
    out: U64 = d[i]
    return out


def _hash_fixed(arr: pa.Array) -> U64:
    """Decimals, fixed-size binaries, intervals: their bytes as words (4-byte ones as ints)."""
    n = len(arr)
    width = arr.type.byte_width
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * width: (arr.offset + n) * width]
    if width % 8:  # decimal32, odd fixed-size binaries: pad each value to whole words
        pad = np.zeros((n, (width + 7) // 8 * 8), dtype=np.uint8)
        pad[:, :width] = raw.reshape(n, width)
        raw = pad.ravel()
        width = pad.shape[1]
    w = raw.reshape(n, width).copy().view(np.uint64)  # copy: the buffer may be unaligned
    h = np.full(n, GOLDEN ^ np.uint64(width), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(w.shape[1]):  # one pass per 8 bytes of width
            h ^= w[:, k]
            h = _mix64_array(h)
    return h


def _hash_values(arr: pa.Array, name: str) -> U64:
    """Hash per value of one (non-chunked) array, nulls included (see the module docstring)."""
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        h = _hash_dictionary(arr)
    elif _int_like(t):
        h = _mix64_array(_int64_values(arr).view(np.uint64))
    elif pa.types.is_floating(t):
        f = (arr.fill_null(0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
        f = f.astype(np.float64, copy=True)
        f[f == 0.0] = 0.0  # folds -0.0 into 0.0
        f[np.isnan(f)] = np.nan  # one NaN bit pattern
        h = _mix64_array(f.view(np.uint64) + GOLDEN)
    elif _is_binary(t):
        h = _hash_strings(arr)
    elif _fixed_bytes(t):
        h = _hash_fixed(arr)
    elif pa.types.is_null(t):
        return np.full(n, _NULL, dtype=np.uint64)
    else:
        raise SchemaError(
            f"column {name!r} has type {t}, which keys and records cannot hold (they are hashed and compared) "
            f"(use integers, floats, booleans, temporal types, strings, binaries or decimals; "
            f"encode nested values first)"
        )
    if arr.null_count:
        h[~arr.is_valid().to_numpy(zero_copy_only=False)] = _NULL
    return h


# rows --------------------------------------------------------------------------------------
def hash_column(col: Column, name: str = "?") -> U64:
    """A stable uint64 hash per value of one column (see the module docstring per type).

    Every hash of a non-exact key passes through this function (looked up at call time),
    so a test that replaces it reaches every user of the kernels.
    """
    arr = _single(col)
    if arr.type == pa.int64() and not arr.null_count:  # the common case, without the type walk
        return _mix64_array(np.asarray(arr.to_numpy()).view(np.uint64))
    return _hash_values(arr, name)


def exact_values(col: Column) -> I64:
    """The ``int64`` values of one integer-like column (:func:`exact_type`; nulls as 0):
    what its hash is :func:`mix64` of, so they are as exact a key as the hash. ``uint64``
    values keep their bits (past ``2**63 - 1`` they read negative), booleans are 0 and 1,
    temporal values their integer counts."""
    arr = _single(col)
    if arr.type == pa.int64() and not arr.null_count:
        return np.asarray(arr.to_numpy())
    return _int64_values(arr)


def _exact_column(arr: pa.Array) -> U64:
    if arr.type == pa.int64() and not arr.null_count:
        return _mix64_array(np.asarray(arr.to_numpy()).view(np.uint64))
    return _hash_values(arr, "?")


def hash_columns(cols: Sequence[Column], names: Sequence[str] | None = None,
                 num_rows: int | None = None) -> U64:
    """A stable uint64 hash per row over the given columns (order matters).

    One exact-typed column (:func:`exact_type`) hashes through :func:`mix64` alone; other
    columns go through :func:`hash_column` and are folded with a multiply-add, mixed once
    at the end. No columns: every row hashes alike (``num_rows`` rows).
    """
    if len(cols) == 1:
        arr = _single(cols[0])
        if exact_type(arr.type):
            return _exact_column(arr)
        return hash_column(arr, names[0] if names else "?")
    if not cols:
        return np.full(num_rows or 0, GOLDEN, dtype=np.uint64)
    label = list(names) if names else [str(i) for i in range(len(cols))]
    h = hash_column(cols[0], label[0]) + GOLDEN
    # arithmetic on uint64 arrays wraps without a warning: no errstate (entering one costs
    # more than hashing a few keys)
    for col, name in zip(cols[1:], label[1:], strict=True):  # one pass per column
        h *= _COMBINE
        h += hash_column(col, name)
    return _mix64_array(h)


def hash_rows(table: pa.Table, names: Sequence[str] | None = None) -> U64:
    """A stable uint64 hash per row over the columns ``names`` (all columns by default)."""
    cols = list(names) if names is not None else table.column_names
    return hash_columns([table.column(c) for c in cols], cols, table.num_rows)


def exact_type(t: pa.DataType) -> bool:
    """True when one column of type ``t`` hashes injectively (integer-like, not dictionary)."""
    return _int_like(t)


def exact_hash(schema: pa.Schema | Sequence[pa.DataType], names: Sequence[str] | None = None) -> bool:
    """True when the row hash over ``names`` is injective, so equal hashes prove equal keys.

    That is one integer-like column (integers, booleans, dates, times, timestamps,
    durations; not a dictionary), whose hash is :func:`mix64` of its value: a bijection.
    The one exception is a null, which hashes as ``-2**63`` (pandas' ``NaT``) does: callers
    that may hold both in such a column and must tell them apart compare validity
    themselves (aggregations do; sources and joins never hold null keys).

    Parameters
    ----------
    schema
        A schema (with ``names``, default all its columns) or the key columns' types.
    """
    if isinstance(schema, pa.Schema):
        types = [schema.field(n).type for n in (names if names is not None else schema.names)]
    else:
        types = list(schema)
    return len(types) == 1 and exact_type(types[0])


# equality ----------------------------------------------------------------------------------
def _comparable(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        return _comparable(arr.dictionary_decode())
    if t == pa.float16():
        return arr.cast(pa.float32())
    if t == pa.month_day_nano_interval():
        return arr.view(pa.binary(16))
    if pa.types.is_string_view(t):  # compute kernels do not mix views with other layouts
        return arr.cast(pa.large_string())
    if pa.types.is_binary_view(t):
        return arr.cast(pa.large_binary())
    if pa.types.is_map(t):  # compared as the list of (key, value) entries it is
        entry = pa.struct([t.key_field, t.item_field])
        return arr.cast(pa.large_list(entry) if pa.types.is_large_list(t) else pa.list_(entry))
    return arr


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
                or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _nested_equal(a: pa.Array, b: pa.Array) -> Mask:
    """:func:`values_equal` of struct and list columns (compute's ``equal`` has no kernel
    for them): a struct by its fields, a list by its length and then its elements, the
    elements of all rows compared at once and folded back to rows by their parent index."""
    a_null: Mask = np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    b_null: Mask = np.asarray(b.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    out: Mask = a_null & b_null
    both = np.flatnonzero(~a_null & ~b_null)
    if both.size == 0:
        return out
    if both.size != len(a):
        take = pa.array(both)
        a, b = a.take(take), b.take(take)
    if pa.types.is_struct(a.type):
        same = np.ones(both.size, dtype=bool)
        for fa, fb in zip(a.flatten(), b.flatten(), strict=True):  # one pass per field
            same &= values_equal(fa, fb)
    elif _is_list(a.type):
        la = np.asarray(pc.list_value_length(a).to_numpy(zero_copy_only=False), dtype=np.int64)
        lb = np.asarray(pc.list_value_length(b).to_numpy(zero_copy_only=False), dtype=np.int64)
        same = la == lb
        rows = np.flatnonzero(same)
        if rows.size:
            if rows.size != both.size:
                take = pa.array(rows)
                a, b = a.take(take), b.take(take)
            unequal = ~values_equal(pc.list_flatten(a), pc.list_flatten(b))
            parents = np.asarray(pc.list_parent_indices(a).to_numpy(zero_copy_only=False), dtype=np.int64)
            same[rows[np.unique(parents[unequal])]] = False
    else:  # unions and the like: rare, compared as Python values
        same = np.fromiter((x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)),
                           dtype=bool, count=both.size)
    out[both] = same
    return out


def plain_type(t: pa.DataType) -> bool:
    """Whether Python's ``==`` on this type's values is :func:`values_equal`'s rule
    (integers, strings and binaries; floats are not: NaN), ``None`` included: a null
    equals a null and nothing else, as grouping has it."""
    return bool(pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def few_rows_equal(probe: Sequence[Column], rows: npt.NDArray[np.int64],
                   stored: Sequence[list[Any]]) -> Mask:
    """Per ``k``: row ``rows[k]`` of the key columns ``probe`` (a few rows, of
    :func:`plain_type` types) has the key values ``stored[c][k]``, compared as Python
    values: for a few keys, a ``take`` and an Arrow comparison per column cost more than
    the values themselves."""
    at = rows.tolist()
    out = [True] * len(at)
    for col, held in zip(probe, stored, strict=True):  # one pass per key column
        values = col.to_pylist()
        out = [o and values[r] == v for o, r, v in zip(out, at, held, strict=True)]
    return np.array(out, dtype=bool)


def values_equal(a: Column, b: Column) -> Mask:
    """Per position: equal values, with null == null, NaN == NaN and 0.0 == -0.0; struct,
    list and map values compare field by field and element by element by the same rule."""
    a, b = _comparable(_single(a)), _comparable(_single(b))
    if pa.types.is_nested(a.type) and pa.types.is_nested(b.type):
        return _nested_equal(a, b)
    if pa.types.is_null(a.type) or pa.types.is_null(b.type):
        return np.asarray(pc.and_(pc.is_null(a), pc.is_null(b)).to_numpy(zero_copy_only=False), dtype=bool)
    eq = pc.fill_null(pc.equal(a, b), False)
    if a.null_count or b.null_count:
        eq = pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False)))
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)


def rows_equal(a: pa.Table, b: pa.Table) -> Mask:
    """Per row: every column equal (columns matched by position, see :func:`values_equal`)."""
    out = np.ones(a.num_rows, dtype=bool)
    for i in range(a.num_columns):  # one pass per column
        out &= values_equal(a.column(i), b.column(i))
    return out


def _primitive_numpy(col: Column) -> npt.NDArray[np.generic] | None:
    """A numpy view (or one copy) of a null-free integer/float/temporal column, else None."""
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)
                              or (pa.types.is_temporal(t) and t.bit_width <= 64)):
        return None
    if t == pa.float16():
        return None
    if pa.types.is_temporal(t):
        vt = pa.int64() if t.bit_width == 64 else pa.int32()
        col = col.view(vt) if isinstance(col, pa.Array) else pa.chunked_array([c.view(vt) for c in col.chunks], vt)
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 0:
            return np.empty(0)
        if col.num_chunks > 1:
            return np.concatenate([np.asarray(c.to_numpy()) for c in col.chunks])
        col = col.chunk(0)
    return np.asarray(col.to_numpy())


def rows_equal_at(a: pa.Table, i: I64, b: pa.Table, j: I64) -> Mask:
    """Per pair: row ``i[k]`` of ``a`` equals row ``j[k]`` of ``b`` (columns by position).

    Null-free numeric columns compare in numpy without gathering through Arrow.
    """
    out = np.ones(i.size, dtype=bool)
    if i.size == 0:
        return out
    for c in range(a.num_columns):  # one pass per column
        x, y = _primitive_numpy(a.column(c)), _primitive_numpy(b.column(c))
        if x is None or y is None:
            out &= values_equal(a.column(c).take(i), b.column(c).take(j))
        elif x.dtype.kind == "f":
            u, v = x[i], y[j]
            out &= (u == v) | (np.isnan(u) & np.isnan(v))
        else:
            out &= x[i] == y[j]
    return out


def same_rows(table: pa.Table, i: I64, j: I64) -> Mask:
    """Per pair: rows ``i[k]`` and ``j[k]`` of ``table`` are equal (as :func:`rows_equal`).

    Null-free numeric columns compare in numpy without gathering through Arrow.
    """
    out = np.ones(i.size, dtype=bool)
    if i.size == 0:
        return out
    for name in table.column_names:  # one pass per column
        col = table.column(name)
        x = _primitive_numpy(col)
        if x is None:
            out &= values_equal(col.take(i), col.take(j))
        elif x.dtype.kind == "f":
            a, b = x[i], x[j]
            out &= (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            out &= x[i] == x[j]
    return out


Same = Callable[[I64, I64], Mask]
"""``same(i, j)``: per pair, are the things at ``i[k]`` and ``j[k]`` equal (vectorized)."""


def group_equal(h: U64, same: Same | None) -> tuple[I64, I64]:
    """Group rows by value: ``(order, starts)`` with each group contiguous in ``order``.

    Rows are grouped by ``h``; ``same(i, j)`` (row indices, vectorized) then confirms that
    rows sharing a hash are equal. Rows that are not (a hash collision) are split apart, so
    the grouping is exact. ``same=None`` declares the hash exact. Rows within a group are in
    no particular order (``np.minimum.reduceat(order, starts)`` gives each group's first row).

    Returns
    -------
    order
        A permutation of ``range(len(h))``.
    starts
        Positions in ``order`` where each group begins.
    """
    n = h.size
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(h)  # quicksort: faster than a stable sort on random hashes (bench_library)
    hs = h[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(hs[1:], hs[:-1], out=new[1:])
    if same is not None and not new.all():
        members = np.flatnonzero(~new)
        first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
        ok = same(order[members], order[first[members]])
        if not ok.all():
            return _split_collisions(h, order, new, same)
    return order.astype(np.int64, copy=False), np.flatnonzero(new)


def _split_collisions(h: U64, order: I64, new: Mask, same: Same) -> tuple[I64, I64]:
    """Exact groups when distinct rows share a hash (rare): refine by rounds of pivots.

    Each round compares every unresolved row with the first unresolved row of its hash
    group and settles the equal ones; rounds are as many as distinct records share one
    hash (almost always 2), each one vectorized over all groups.
    """
    n = h.size
    group = np.cumsum(new) - 1  # hash group per position in ``order``
    sub = np.full(n, -1, dtype=np.int64)
    rnd = 0
    while (sub < 0).any():
        todo = np.flatnonzero(sub < 0)
        g = group[todo]
        is_pivot = np.empty(todo.size, dtype=bool)
        is_pivot[0] = True
        np.not_equal(g[1:], g[:-1], out=is_pivot[1:])
        pivot = todo[np.maximum.accumulate(np.where(is_pivot, np.arange(todo.size), 0))]
        eq = same(order[todo], order[pivot])
        eq[is_pivot] = True
        sub[todo[eq]] = rnd
        rnd += 1
    o2 = np.lexsort((sub, group))
    order = order[o2]
    g2, s2 = group[o2], sub[o2]
    start = np.empty(n, dtype=bool)
    start[0] = True
    start[1:] = (g2[1:] != g2[:-1]) | (s2[1:] != s2[:-1])
    return order.astype(np.int64, copy=False), np.flatnonzero(start)
