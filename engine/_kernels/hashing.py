"""Row hashes, row equality and exact grouping, whole columns at a time.

Shared by keyed sources (key -> row) and the differential layer (consolidation, indexing
and traces group rows by their values). Each row is hashed to a
``uint64`` with numpy, and the hash is *stable*: the same values hash the same in every
batch, so a key found in one batch is found by its hash in a trace built from others.
Grouping sorts by hash and then **verifies** that rows grouped together are equal
(:func:`group_equal`), so a hash collision can cost a little time but never merges two
different records. A single integer key column hashes through a bijection
(:func:`mix64`), so its hash is exact and needs no verification (:func:`exact_hash`).

Per type (``h`` is the column's hash, nulls get one fixed hash per column):

* integers, booleans, dates, times, timestamps, durations: the int64 value, mixed;
* floats: the float64 bits with ``-0.0`` folded into ``0.0`` and every NaN into one NaN,
  matching :func:`rows_equal` (which treats ``0.0 == -0.0`` and ``NaN == NaN``);
* strings and binaries: a polynomial hash of the bytes, computed from the Arrow offsets
  and data buffers in one numpy pass (no per-value Python), mixed with the length;
* decimals go through their string form; dictionaries are decoded first.

Other types (lists, structs, maps) are refused with a :class:`SchemaError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import SchemaError

__all__ = [
    "exact_hash",
    "group_equal",
    "hash_column",
    "hash_rows",
    "mix64",
    "rows_equal",
    "rows_equal_at",
    "same_rows",
    "values_equal",
]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BYTE_MUL = np.uint64(0x100000001B3)
_NULL = np.uint64(0x5BD1E9955BD1E995)
_COMBINE = np.uint64(0xFF51AFD7ED558CCD)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

_powers = np.ones(1, dtype=np.uint64)


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


def combine(h: U64, other: U64) -> U64:
    """Order-dependent combination of two hash columns."""
    if np.ndim(h) == 0:
        with np.errstate(over="ignore"):
            return mix64(h * _COMBINE + other + GOLDEN)
    z = h * _COMBINE
    z += other
    z += GOLDEN
    return _mix64_array(z)


def _byte_powers(n: int) -> U64:
    global _powers
    if _powers.size < n:
        p = np.empty(max(n, 2 * _powers.size), dtype=np.uint64)
        p[0] = 1
        p[1:] = np.cumprod(np.full(p.size - 1, _BYTE_MUL, dtype=np.uint64))  # wraps mod 2**64
        _powers = p
    return _powers[:n]


def _hash_binary(arr: pa.Array) -> U64:
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)
    off = off[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    lo, hi = int(off[0]), int(off[-1])
    lengths = np.diff(off)
    data = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi] if bufs[2] is not None else np.empty(0, np.uint8)
    with np.errstate(over="ignore"):
        if data.size:
            pos = np.arange(data.size, dtype=np.int64) - np.repeat(off[:-1] - lo, lengths)
            contrib = (data.astype(np.uint64) + np.uint64(1)) * _byte_powers(int(lengths.max()))[pos]
            cs = np.empty(data.size + 1, dtype=np.uint64)
            cs[0] = 0
            np.cumsum(contrib, out=cs[1:])
            sums = cs[off[1:] - lo] - cs[off[:-1] - lo]
        else:
            sums = np.zeros(len(arr), dtype=np.uint64)
        return mix64(sums ^ mix64(lengths.astype(np.uint64) + GOLDEN))


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


def _hashable(arr: pa.Array, name: str) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        return _hashable(arr.dictionary_decode(), name)
    if pa.types.is_decimal(t):
        return arr.cast(pa.string())
    if (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t)
            or pa.types.is_floating(t) or pa.types.is_null(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return arr
    raise SchemaError(
        f"column {name!r} has type {t}, which Z-set records cannot hold (use integers, floats, "
        f"booleans, temporal types, strings, binaries or decimals; encode nested values first)"
    )


def _single(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def hash_column(col: pa.Array | pa.ChunkedArray, name: str = "?") -> U64:
    """A stable uint64 hash per value of one column (see the module docstring per type)."""
    arr = _single(col)
    if arr.type == pa.int64() and not arr.null_count:  # the common case, without the type walk
        return _mix64_array(np.asarray(arr.to_numpy()).view(np.uint64))
    arr = _hashable(arr, name)
    t = arr.type
    n = len(arr)
    if pa.types.is_null(t):
        return np.full(n, _NULL, dtype=np.uint64)
    if pa.types.is_floating(t):
        f = (arr.fill_null(0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
        f = f.astype(np.float64, copy=True)
        f[f == 0.0] = 0.0          # folds -0.0 into 0.0
        f[np.isnan(f)] = np.nan     # one NaN bit pattern
        h = mix64(f.view(np.uint64) + GOLDEN)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        h = _hash_binary(arr)
    else:
        h = mix64(_int64_values(arr).view(np.uint64))
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        h = np.where(valid, h, _NULL)
    return h


def hash_rows(table: pa.Table, names: Sequence[str] | None = None) -> U64:
    """A stable uint64 hash per row over the columns ``names`` (all columns by default)."""
    cols = list(names) if names is not None else table.column_names
    if len(cols) == 1:
        return hash_column(table.column(cols[0]), cols[0])
    if not cols:
        return np.full(table.num_rows, GOLDEN, dtype=np.uint64)
    # a multiply-add fold of the column hashes (order-dependent), mixed once at the end
    h = hash_column(table.column(cols[0]), cols[0]) + GOLDEN
    with np.errstate(over="ignore"):
        for name in cols[1:]:  # one pass per column
            h *= _COMBINE
            h += hash_column(table.column(name), name)
    return mix64(h)


def exact_hash(schema: pa.Schema, names: Sequence[str]) -> bool:
    """True when :func:`hash_rows` over ``names`` is injective (one integer-like column)."""
    if len(names) != 1:
        return False
    t = schema.field(names[0]).type
    if pa.types.is_dictionary(t):
        return False
    return bool(pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t))


def values_equal(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Per position: equal values, with null == null, NaN == NaN and 0.0 == -0.0."""
    a, b = _single(a), _single(b)
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    if pa.types.is_dictionary(b.type):
        b = b.dictionary_decode()
    if pa.types.is_null(a.type) and pa.types.is_null(b.type):
        return np.ones(len(a), dtype=bool)
    eq = pc.fill_null(pc.equal(a, b), False)
    if a.null_count or b.null_count:
        eq = pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        eq = pc.or_(eq, pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False)))
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)


def rows_equal(a: pa.Table, b: pa.Table) -> npt.NDArray[np.bool_]:
    """Per row: every column equal (columns matched by position, see :func:`values_equal`)."""
    out = np.ones(a.num_rows, dtype=bool)
    for i in range(a.num_columns):  # one pass per column
        out &= values_equal(a.column(i), b.column(i))
    return out


def _primitive_numpy(col: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.generic] | None:
    """A numpy view (or one copy) of a null-free integer/float/temporal column, else None."""
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)
                              or pa.types.is_temporal(t)):
        return None
    if pa.types.is_temporal(t):
        col = col.view(pa.int64() if t.bit_width == 64 else pa.int32()) if isinstance(col, pa.Array) \
            else pa.chunked_array([c.view(pa.int64() if t.bit_width == 64 else pa.int32()) for c in col.chunks])
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 0:
            return np.empty(0)
        if col.num_chunks > 1:
            return np.concatenate([np.asarray(c.to_numpy()) for c in col.chunks])
        col = col.chunk(0)
    return np.asarray(col.to_numpy())


def rows_equal_at(a: pa.Table, i: I64, b: pa.Table, j: I64) -> npt.NDArray[np.bool_]:
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


def same_rows(table: pa.Table, i: I64, j: I64) -> npt.NDArray[np.bool_]:
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


Same = Callable[[I64, I64], npt.NDArray[np.bool_]]


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
    order = np.argsort(h)  # quicksort: ~5x faster than a stable sort on random hashes
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


def _split_collisions(h: U64, order: I64, new: npt.NDArray[np.bool_], same: Same) -> tuple[I64, I64]:
    """Exact groups when distinct rows share a hash (rare): refine by rounds of pivots.

    Each round compares every unresolved row with the first unresolved row of its hash
    group and settles the equal ones; rounds are as many as distinct records share one
    hash (almost always 2), each one vectorized over all groups.
    """
    n = h.size
    group = np.cumsum(new) - 1                  # hash group per position in ``order``
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
