"""Values in, keys out: the value plumbing of ``engine.ops.aggregate``.

* reading parent columns as Arrow arrays or ``(numpy values, validity)`` pairs;
* per-row equality with nulls and NaN equal to themselves (is an output really changed?);
* hashing rows by their group-by values (:func:`hash_arrays`) — exact bits for one
  fixed-width column, otherwise a 64-bit hash computed straight from the Arrow buffers
  (strings included, no Python objects);
* order-preserving ``uint64`` encodings of numbers (:func:`encode`, :func:`decode`) for
  the sorted structures behind min/max;
* :class:`U64Map`, a vectorized ``uint64 -> int64`` hash map (group index, row-key index,
  distinct counts).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine.columns import ColumnSource, NumpyColumnSource, numpy_storage_dtype

__all__ = [
    "U64Map",
    "arrow_equal",
    "column_hash",
    "decode",
    "encode",
    "fetch",
    "fetch_numpy",
    "hash_arrays",
    "mix64",
    "numeric_bits",
    "numpy_of",
    "unique_first",
    "valid_mask",
    "values_equal",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]

_SIGN = np.uint64(1 << 63)
_CANON_NAN = np.float64(np.nan).view(np.uint64)
_NULL_BITS = np.uint64(0x7C3A1B2E5D4F6A98)
_SEEDS = (np.uint64(0x5EED5EED12345678), np.uint64(0xC0FFEE0DDBA11F00))
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ONE = np.uint64(1)
_DICT_MIN = 4096  # from this many values on, strings are dictionary-encoded before hashing
_ARROW_UNIQUE_MIN = 1024  # from this many on, unique_first uses Arrow's hash table


def mix64(x: U64) -> U64:
    """The splitmix64 finalizer: a bijective scramble of ``uint64`` values."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


# h2 of nulls: differs from mix64(_NULL_BITS ^ seed), the h2 of a value whose bits are
# _NULL_BITS (the h1 of nulls), so (h1, h2) tells a null from that value
_NULL_BITS2 = np.uint64((int(mix64(np.array([_NULL_BITS ^ _SEEDS[1]]))[0]) + 1) % 2**64)


# reading parent values ------------------------------------------------------------------
def fetch(src: ColumnSource, keys: I64, prev: bool) -> pa.Array:
    """Values at ``keys`` as one Arrow array (previous values and key space when ``prev``)."""
    arr = src.get_prev(keys) if prev else src.get(keys)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def fetch_numpy(src: ColumnSource, keys: I64, prev: bool) -> NumPair:
    """``(values, validity or None)`` at ``keys`` in the column's numpy storage dtype."""
    if isinstance(src, NumpyColumnSource):
        return src.get_prev_numpy(keys) if prev else src.get_numpy(keys)
    return numpy_of(fetch(src, keys, prev))


def numpy_of(arr: pa.Array) -> NumPair:
    """A fixed-width Arrow array as ``(values, validity or None)`` without per-value work."""
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
    ok = np.ones(values.size, dtype=bool) if valid is None else valid.copy()
    if values.dtype.kind == "f":
        ok &= ~np.isnan(values)
    return ok


def values_equal(old: NumPair, new: NumPair) -> Mask:
    """Per row: same value, null equal to null, NaN equal to NaN."""
    (a, av), (b, bv) = old, new
    same: Mask = np.asarray(a == b, dtype=bool)
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    if av is None and bv is None:
        return same
    av = np.ones(a.size, dtype=bool) if av is None else av
    bv = np.ones(b.size, dtype=bool) if bv is None else bv
    return (av & bv & same) | (~av & ~bv)


def arrow_equal(old: pa.Array, new: pa.Array) -> Mask:
    """:func:`values_equal` for any Arrow type."""
    eq = pc.fill_null(pc.equal(old, new), False)
    same = pc.or_(eq, pc.and_(pc.is_null(old), pc.is_null(new)))
    if pa.types.is_floating(old.type):
        same = pc.or_(same, pc.and_(pc.fill_null(pc.is_nan(old), False),
                                    pc.fill_null(pc.is_nan(new), False)))
    return np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)


# hashing --------------------------------------------------------------------------------
def numeric_bits(values: npt.NDArray[Any]) -> U64:
    """Bits identifying each number: -0.0 and 0.0 agree, every NaN is one NaN."""
    kind = values.dtype.kind
    if kind == "f":
        x = values.astype(np.float64) + 0.0
        bits = x.view(np.uint64).copy()
        bits[np.isnan(x)] = _CANON_NAN
        return bits
    if kind == "u":
        return values.astype(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def _binary_hash(arr: pa.Array) -> tuple[U64, U64]:
    """Two independent 64-bit hashes of each string/binary value, from the Arrow buffers
    (no Python objects).

    Each is a sum over bytes of ``mix64(seed, position, byte)`` plus the length:
    tabulation-like, so unlike a polynomial hash modulo 2**64 it has no structured
    collisions; the two differ only in their seed.
    """
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())
    elif pa.types.is_string(t):
        arr = arr.cast(pa.binary())
    elif pa.types.is_large_string(t):
        arr = arr.cast(pa.large_binary())
    large = pa.types.is_large_binary(arr.type)
    n = len(arr)
    if n == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32,
                         count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    lens = np.diff(offs)
    start, end = int(offs[0]), int(offs[-1])
    out = []
    with np.errstate(over="ignore"):
        if end > start:
            data = np.frombuffer(bufs[2], dtype=np.uint8)[start:end].astype(np.uint64)
            pos = (np.arange(start, end, dtype=np.int64) - np.repeat(offs[:-1], lens)).astype(np.uint64)
            cell = pos << np.uint64(8) | data
            nonempty = lens > 0
            at = (offs[:-1] - start)[nonempty]
        for seed in _SEEDS:
            h = mix64(lens.astype(np.uint64) ^ seed)
            if end > start:
                h[nonempty] += np.add.reduceat(mix64(cell ^ seed), at)
            out.append(mix64(h))
    return out[0], out[1]


def column_hash(arr: pa.Array) -> tuple[U64, U64, bool]:
    """``(h1, h2, exact)`` per value: two independent 64-bit identities of each value.

    Fixed-width types: ``h1`` is the value's bits, so the column is ``exact`` when it has no
    nulls; with nulls, ``h1`` gives them one fixed pattern that a value could share, but
    ``h2`` tells them apart, so ``(h1, h2)`` is still exact. Strings and binaries: two
    hashes of the bytes (128 bits together). Anything else goes through pandas' hashing
    of Python objects (slow, rare).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    if numpy_storage_dtype(arr.type) is not None:
        h1 = numeric_bits(numpy_of(arr)[0])
        with np.errstate(over="ignore"):
            h2 = mix64(h1 ^ _SEEDS[1])
        exact = valid is None
    elif (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
          or pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
          or pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type)):
        if len(arr) >= _DICT_MIN:  # hash each distinct string once (Arrow's C++ hash table)
            enc = pc.dictionary_encode(arr)
            d1, d2 = _binary_hash(enc.dictionary)
            idx = pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False)
            h1, h2 = (d1[idx], d2[idx]) if d1.size else (np.zeros(len(arr), np.uint64),) * 2
        else:
            h1, h2 = _binary_hash(arr)
        exact = False
    else:  # rare types (decimal, nested): pandas hashes their Python objects
        import pandas as pd

        obj = arr.to_pandas().to_numpy(dtype=object)
        h1 = pd.util.hash_array(obj).astype(np.uint64)
        h2 = pd.util.hash_array(obj, hash_key="ticktable-hash-2").astype(np.uint64)
        exact = False
    if valid is not None:
        h1 = np.where(valid, h1, _NULL_BITS)
        h2 = np.where(valid, h2, _NULL_BITS2)
    return h1, h2, exact


def hash_arrays(arrays: list[pa.Array], n: int) -> tuple[U64, U64, bool]:
    """Two independent ``uint64`` identities of each row's tuple of values, and whether the
    first alone is ``exact`` (injective).

    No columns: all rows are one group (zeros, exact). One fixed-width column without
    nulls: its bits (exact). Otherwise ``h1`` is a 64-bit hash to index by and ``h2`` an
    independent one to verify with: two different tuples agree on both with odds 2**-128.
    """
    if not arrays:
        z = np.zeros(n, dtype=np.uint64)
        return z, z, True
    if len(arrays) == 1:
        return column_hash(arrays[0])
    h1 = np.zeros(n, dtype=np.uint64)
    h2 = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, arr in enumerate(arrays):  # one pass per key column
            c1, c2, _ = column_hash(arr)
            h1 = mix64(h1 * np.uint64(0x100000001B3) ^ mix64(c1 + np.uint64(i)))
            h2 = mix64(h2 * np.uint64(0x9E3779B1) ^ mix64(c2 + np.uint64(i) + _SEEDS[0]))
    return h1, h2, False


def unique_first(h: U64) -> tuple[U64, I64, I64]:
    """``(uniques in order of first appearance, index of each one's first row, inverse)``.

    Large inputs go through Arrow's hash-based ``dictionary_encode`` (O(n)); small ones
    through ``np.unique``."""
    if h.size >= _ARROW_UNIQUE_MIN:
        enc = pc.dictionary_encode(pa.array(h))
        inv = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        uniq = enc.dictionary.to_numpy(zero_copy_only=False)
        first = np.empty(uniq.size, dtype=np.int64)
        first[inv[::-1]] = np.arange(h.size - 1, -1, -1, dtype=np.int64)  # last write: first row
        return uniq, first, inv
    uniq, first, inv = np.unique(h, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size, dtype=np.int64)
    return uniq[order], first[order], rank[inv]


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


class U64Map:
    """A ``uint64 -> int64`` hash map for whole arrays at a time (open addressing).

    Linear probing; the table doubles when live plus deleted entries pass half of it and
    is then sized for a load of 1/4, so probe chains stay short (20-40 bytes per slot,
    40-80 per entry). An insert round lets every key scatter its index into the slot it
    wants and keeps those that read themselves back (no sort per round).
    """

    def __init__(self) -> None:
        self._alloc(256)
        self.count = 0

    def _alloc(self, need: int) -> None:
        bits = max(10, int(np.ceil(np.log2(max(need, 2) * 4))))
        self._shift = np.uint64(64 - bits)
        self._mask = np.uint64((1 << bits) - 1)
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._vals = np.full(1 << bits, -1, dtype=np.int64)  # -1 empty, -2 deleted
        self._claim = np.full(1 << bits, -1, dtype=np.int32)  # scratch for inserts
        self._dead = 0

    def _home(self, h: U64) -> U64:
        with np.errstate(over="ignore"):
            return (h * _GOLDEN) >> self._shift

    def _slots(self, h: U64) -> I64:
        """Slot of each key, ``-1`` where absent."""
        out = np.full(h.size, -1, dtype=np.int64)
        idx = np.arange(h.size)
        s = self._home(h)
        while idx.size:
            v = self._vals[s]
            hit = (v >= 0) & (self._keys[s] == h[idx])
            out[idx[hit]] = s[hit].astype(np.int64)
            go = ~hit & (v != -1)
            idx, s = idx[go], (s[go] + _ONE) & self._mask
        return out

    def lookup(self, h: U64) -> I64:
        """Value per key, ``-1`` where absent."""
        s = self._slots(h)
        return np.where(s >= 0, self._vals[np.maximum(s, 0)], -1)

    def insert(self, h: U64, values: I64) -> None:
        """Add keys known to be absent and distinct."""
        if h.size == 0:
            return
        if 2 * (self.count + self._dead + h.size) > self._vals.size:
            live = self._vals >= 0
            k, v = self._keys[live], self._vals[live]
            self._alloc(self.count + h.size)
            self.count = 0
            self._place(k, v)
        self._place(h, values)

    def _place(self, h: U64, values: I64) -> None:
        self.count += h.size
        idx = np.arange(h.size, dtype=np.int32)
        s = self._home(h)
        while idx.size:
            free = self._vals[s] < 0
            fi, fs = idx[free], s[free]
            self._claim[fs] = fi
            won = self._claim[fs] == fi
            ws = fs[won]
            self._dead -= int(np.count_nonzero(self._vals[ws] == -2))
            self._keys[ws] = h[fi[won]]
            self._vals[ws] = values[fi[won]]
            lose = np.concatenate((np.flatnonzero(~free), np.flatnonzero(free)[~won]))
            idx, s = idx[lose], (s[lose] + _ONE) & self._mask

    def delete(self, h: U64) -> None:
        """Remove keys (absent ones are ignored)."""
        s = self._slots(h)
        s = s[s >= 0]
        self._vals[s] = -2
        self._dead += s.size
        self.count -= s.size
