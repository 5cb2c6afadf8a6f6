"""Row sets and row shifts: the key spaces of the update model (DESIGN.md §2).

A :class:`RowSet` is an immutable, ordered set of row keys (non-negative int64) over a
``pyroaring.BitMap64``; a row's *position* is its rank in that order. A
:class:`RowSetShiftData` moves ranges of surviving keys by a delta without reordering them.

Cost model (what keeps the hot path vectorized):

* building from keys goes through ``array.array('Q')`` (the fast path into pyroaring);
  building from ranges writes the portable Roaring serialization with numpy and
  deserializes it once, so neither loops in Python per key or per range;
* algebra (``|``, ``&``, ``-``) is bitmap algebra, cost per container;
* ``keys()`` converts once and caches the numpy array (a RowSet never changes), so
  ``positions_of`` / ``keys_at`` are ``searchsorted`` / fancy indexing on that array.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from engine._kernels.arrays import bitmap_from_ranges as _bitmap_from_ranges
from engine._kernels.arrays import bitmap_from_sorted as _bitmap_from_sorted
from engine._kernels.arrays import shift_keys
from engine._kernels.arrays import sorted_unique as unique_keys
from engine.errors import InvalidKeyError, UpdateInvariantError

__all__ = ["KeyArray", "RowSet", "RowSetShiftData", "as_key_array", "unique_keys"]

KeyArray = npt.NDArray[np.int64]


def as_key_array(keys: Any) -> KeyArray:
    """``keys`` (any integer array-like) as a flat int64 array of row keys.

    An int64 array is not converted. Keys are not checked to be non-negative, sorted or
    distinct: callers that need that check it.

    Raises
    ------
    InvalidKeyError
        If ``keys`` is non-empty and not of an integer dtype.
    """
    arr = np.asarray(keys)
    if arr.dtype != np.int64:
        if arr.size and arr.dtype.kind not in "iu":
            raise InvalidKeyError(f"row keys must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr.reshape(-1)


def _searchsorted(haystack: KeyArray, needles: KeyArray) -> npt.NDArray[np.intp]:
    """``np.searchsorted`` that sorts large unsorted needles first (fewer cache misses:
    consecutive needles probe neighbouring parts of ``haystack``)."""
    if needles.size < 4096 or bool(np.all(needles[1:] >= needles[:-1])):
        return np.searchsorted(haystack, needles)
    order = np.argsort(needles, kind="stable")
    out = np.empty(needles.size, dtype=np.intp)
    out[order] = np.searchsorted(haystack, needles[order])
    return out


class RowSet:
    """An immutable ordered set of row keys (non-negative int64).

    Positions are ranks: the first key is at position 0. Set algebra returns new RowSets.

    Examples
    --------
    >>> rs = RowSet.from_range(10, 15) | RowSet.from_keys([3])
    >>> rs.keys().tolist(), rs.positions_of([3, 12]).tolist()
    ([3, 10, 11, 12, 13, 14], [0, 3])
    """

    __slots__ = ("_bm", "_keys")

    def __init__(self, bitmap: BitMap64 | None = None) -> None:
        self._bm = bitmap if bitmap is not None else BitMap64()
        self._keys: KeyArray | None = None

    # construction ---------------------------------------------------------------
    @classmethod
    def empty(cls) -> RowSet:
        return cls()

    @classmethod
    def from_keys(cls, keys: Any, *, assume_sorted: bool = False) -> RowSet:
        """Build from integer keys (any order, duplicates allowed unless ``assume_sorted``).

        Raises
        ------
        InvalidKeyError
            If a key is negative.
        """
        arr = as_key_array(keys)
        if arr.size == 0:
            return cls()  # an update's empty parts: no bitmap to build
        if not assume_sorted:
            arr = unique_keys(arr)
        if arr[0] < 0:
            raise InvalidKeyError(f"row keys must be non-negative, got {int(arr[0])}")
        rs = cls(_bitmap_from_sorted(arr))
        if assume_sorted:
            rs._keys = arr
        return rs

    @classmethod
    def from_range(cls, start: int, stop: int) -> RowSet:
        """All keys ``start <= k < stop``."""
        if start < 0:
            raise InvalidKeyError(f"row keys must be non-negative, got range start {start}")
        bm = BitMap64()
        if stop > start:
            bm.add_range(start, stop)
        return cls(bm)

    @classmethod
    def from_ranges(cls, starts: Any, stops: Any) -> RowSet:
        """Union of half-open ranges ``[starts[i], stops[i])``, sorted and disjoint."""
        s, e = as_key_array(starts), as_key_array(stops)
        if s.size != e.size:
            raise InvalidKeyError("starts and stops differ in length")
        if s.size and s.min() < 0:
            raise InvalidKeyError(f"row keys must be non-negative, got range start {int(s.min())}")
        if s.size > 1 and np.any(s[1:] < e[:-1]):
            raise InvalidKeyError("ranges must be sorted and disjoint")
        return cls(_bitmap_from_ranges(s, e))

    @classmethod
    def deserialize(cls, data: bytes) -> RowSet:
        """Inverse of :meth:`serialize` (portable 64-bit Roaring format)."""
        return cls(BitMap64.deserialize(data))

    # queries -----------------------------------------------------------------------
    @property
    def bitmap(self) -> BitMap64:
        """The underlying bitmap; do not mutate it."""
        return self._bm

    def __len__(self) -> int:
        return len(self._bm)

    @property
    def size(self) -> int:
        return len(self._bm)

    def __bool__(self) -> bool:
        return bool(self._bm)

    def __contains__(self, key: int) -> bool:
        return key in self._bm

    def __iter__(self) -> Iterator[int]:
        return iter(self._bm)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowSet) and self._bm == other._bm

    def __hash__(self) -> int:  # pragma: no cover - RowSets are not meant as dict keys
        raise TypeError("RowSet is unhashable")

    def __repr__(self) -> str:
        if len(self) <= 8:
            return f"RowSet({self.keys().tolist()})"
        return f"RowSet(size={len(self)}, first={self.first()}, last={self.last()})"

    def first(self) -> int:
        return int(self._bm.min())

    def last(self) -> int:
        return int(self._bm.max())

    def keys(self) -> KeyArray:
        """All keys as a sorted int64 array (cached; treat as read-only)."""
        if self._keys is None:
            if not self._bm:
                self._keys = np.empty(0, dtype=np.int64)
            else:
                self._keys = np.frombuffer(self._bm.to_array(), dtype=np.int64)
        return self._keys

    def ranges(self) -> tuple[KeyArray, KeyArray]:
        """Maximal runs of consecutive keys as half-open ``(starts, stops)`` arrays."""
        k = self.keys()
        if k.size == 0:
            return k, k
        brk = np.flatnonzero(np.diff(k) != 1)
        starts = np.concatenate(([k[0]], k[brk + 1]))
        stops = np.concatenate((k[brk] + 1, [k[-1] + 1]))
        return starts, stops

    def positions_of(self, keys: Any) -> npt.NDArray[np.int64]:
        """Position of each key; ``-1`` where the key is not in the set."""
        q = as_key_array(keys)
        k = self.keys()
        pos = _searchsorted(k, q)
        ok = pos < k.size
        ok[ok] = k[pos[ok]] == q[ok]
        return np.where(ok, pos, -1)

    def keys_at(self, positions: Any) -> KeyArray:
        """Keys at the given positions (negative positions count from the end).

        Raises
        ------
        IndexError
            If a position is out of range.
        """
        p = as_key_array(positions)
        k = self.keys()
        if p.size and (p.max() >= k.size or p.min() < -k.size):
            raise IndexError(f"position out of range for a RowSet of size {k.size}")
        return k[p]

    def slice(self, start: int, stop: int) -> RowSet:
        """The keys at positions ``start <= p < stop`` (Python slice semantics)."""
        return RowSet(self._bm[start:stop])

    def contains_all(self, keys: Any) -> npt.NDArray[np.bool_]:
        """Boolean membership of each key."""
        return self.positions_of(keys) >= 0

    def issubset(self, other: RowSet) -> bool:
        return self._bm.issubset(other._bm)

    def isdisjoint(self, other: RowSet) -> bool:
        return self._bm.isdisjoint(other._bm)

    def serialize(self) -> bytes:
        """Portable 64-bit Roaring serialization (readable by CRoaring, Java, Go)."""
        return bytes(self._bm.serialize())

    # algebra -----------------------------------------------------------------------
    def __or__(self, other: RowSet) -> RowSet:
        return RowSet(self._bm | other._bm)

    def __and__(self, other: RowSet) -> RowSet:
        return RowSet(self._bm & other._bm)

    def __sub__(self, other: RowSet) -> RowSet:
        return RowSet(self._bm - other._bm)

    def __xor__(self, other: RowSet) -> RowSet:
        return RowSet(self._bm ^ other._bm)

    def __le__(self, other: RowSet) -> bool:
        return self.issubset(other)

    def shift(self, delta: int) -> RowSet:
        """Every key moved by ``delta``."""
        if delta and self._bm and self.first() + delta < 0:
            raise InvalidKeyError(f"shift by {delta} makes key {self.first()} negative")
        return RowSet(self._bm.shift(delta)) if delta else self


def _concat_keys(parts: list[KeyArray]) -> KeyArray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


class RowSetShiftData:
    """Ranges of surviving row keys moved by a delta: ``(begin, end, delta)``, end inclusive.

    Invariants (checked by :meth:`validate`, enforced by :meth:`from_arrays`):
      S1  ``begin <= end`` and ``delta != 0`` for every range
      S2  ranges are sorted and disjoint before the shift
      S3  ranges are sorted and disjoint after the shift (shifts never reorder rows)
      S4  no key is shifted below zero
    Adjacent ranges with the same delta are coalesced.

    Examples
    --------
    >>> s = RowSetShiftData.from_arrays([2], [4], [1])
    >>> s.apply(RowSet.from_keys([0, 1, 2, 3, 4])).keys().tolist()
    [0, 1, 3, 4, 5]
    """

    __slots__ = ("begins", "ends", "deltas", "_spans")

    begins: KeyArray
    ends: KeyArray
    deltas: KeyArray

    def __init__(self, begins: KeyArray, ends: KeyArray, deltas: KeyArray) -> None:
        self.begins = begins
        self.ends = ends
        self.deltas = deltas
        self._spans: dict[bool, RowSet] = {}  # the shifted keys as a RowSet, built once

    EMPTY: RowSetShiftData

    @classmethod
    def empty(cls) -> RowSetShiftData:
        return _EMPTY_SHIFT

    @classmethod
    def from_arrays(cls, begins: Any, ends: Any, deltas: Any) -> RowSetShiftData:
        """Validate and coalesce ranges given as three equal-length arrays.

        Ranges with a zero delta are dropped.

        Raises
        ------
        UpdateInvariantError
            If the ranges break S1..S4.
        """
        b, e, d = as_key_array(begins), as_key_array(ends), as_key_array(deltas)
        if not (b.size == e.size == d.size):
            raise UpdateInvariantError("S1", "begins, ends and deltas differ in length")
        nz = d != 0
        if not nz.all():
            b, e, d = b[nz], e[nz], d[nz]
        out = cls(b, e, d)
        out.validate()
        return out._coalesced()

    def _coalesced(self) -> RowSetShiftData:
        b, e, d = self.begins, self.ends, self.deltas
        if b.size < 2:
            return self
        join = (b[1:] == e[:-1] + 1) & (d[1:] == d[:-1])
        if not join.any():
            return self
        start = np.concatenate(([True], ~join))
        end = np.concatenate((~join, [True]))
        return RowSetShiftData(b[start], e[end], d[start])

    def __len__(self) -> int:
        return int(self.begins.size)

    def __bool__(self) -> bool:
        return self.begins.size > 0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RowSetShiftData)
            and np.array_equal(self.begins, other.begins)
            and np.array_equal(self.ends, other.ends)
            and np.array_equal(self.deltas, other.deltas)
        )

    def __hash__(self) -> int:  # pragma: no cover
        raise TypeError("RowSetShiftData is unhashable")

    def __repr__(self) -> str:
        triples = list(zip(self.begins.tolist(), self.ends.tolist(), self.deltas.tolist(), strict=False))
        if len(triples) > 6:
            return f"RowSetShiftData({triples[:6]}... {len(triples)} ranges)"
        return f"RowSetShiftData({triples})"

    def validate(self) -> None:
        """Raise :class:`UpdateInvariantError` naming the first broken rule (S1..S4)."""
        b, e, d = self.begins, self.ends, self.deltas
        if b.size == 0:
            return
        bad = np.flatnonzero((b > e) | (d == 0))
        if bad.size:
            raise UpdateInvariantError("S1", f"empty range or zero delta at {self._quote(bad)}")
        bad = np.flatnonzero(b[1:] <= e[:-1])
        if bad.size:
            raise UpdateInvariantError("S2", f"ranges overlap or are unsorted at {self._quote(bad)}")
        bad = np.flatnonzero(b[1:] + d[1:] <= e[:-1] + d[:-1])
        if bad.size:
            raise UpdateInvariantError(
                "S3", f"ranges overlap or reorder after shifting at {self._quote(bad)}"
            )
        bad = np.flatnonzero(b + d < 0)
        if bad.size:
            raise UpdateInvariantError("S4", f"keys shifted below zero at {self._quote(bad)}")

    def _quote(self, idx: npt.NDArray[np.intp]) -> str:
        i = idx[:10]
        return str(list(zip(self.begins[i].tolist(), self.ends[i].tolist(), self.deltas[i].tolist(), strict=False)))

    # applying ----------------------------------------------------------------------
    def apply_keys(self, keys: Any) -> KeyArray:
        """Map keys of the previous key space to the current one (unshifted keys stay)."""
        k = as_key_array(keys)
        if not self or k.size == 0:
            return k
        return shift_keys(k, self.begins, self.ends, self.deltas)

    def unapply_keys(self, keys: Any) -> KeyArray:
        """Map keys of the current key space back to the previous one."""
        k = as_key_array(keys)
        if not self or k.size == 0:
            return k
        return shift_keys(k, self.begins + self.deltas, self.ends + self.deltas, -self.deltas)

    def _moving(self, rs: RowSet, begins: KeyArray, ends: KeyArray, after: bool = False) -> RowSet:
        """The members of ``rs`` inside a range. A small ``rs`` (a viewport's rows against
        a sort's thousands of ranges) is looked up key by key in the sorted ranges; a large
        one is intersected with the ranges' RowSet, built once per shift (every subscriber
        of a table applies the same one)."""
        if len(rs) * 8 < begins.size:
            keys = rs.keys()
            i = np.searchsorted(begins, keys, side="right") - 1
            inside = (i >= 0) & (keys <= ends[np.maximum(i, 0)])
            return RowSet.from_keys(keys[inside], assume_sorted=True)
        span = self._spans.get(after)
        if span is None:
            span = self._spans[after] = RowSet(_bitmap_from_ranges(begins, ends + 1))
        return rs & span

    def apply(self, rs: RowSet) -> RowSet:
        """Shift a RowSet of the previous key space into the current key space.

        Cost follows the keys inside shifted ranges, not the size of ``rs``.
        """
        if not self or not rs:
            return rs
        moving = self._moving(rs, self.begins, self.ends)
        if not moving:
            return rs
        moved = self.apply_keys(moving.keys())
        return (rs - moving) | RowSet.from_keys(moved, assume_sorted=True)

    def unapply(self, rs: RowSet) -> RowSet:
        """Shift a RowSet of the current key space back into the previous key space."""
        if not self or not rs:
            return rs
        moving = self._moving(rs, self.begins + self.deltas, self.ends + self.deltas, after=True)
        if not moving:
            return rs
        moved = self.unapply_keys(moving.keys())
        return (rs - moving) | RowSet.from_keys(moved, assume_sorted=True)

    def moved_keys(self, rs: RowSet) -> tuple[KeyArray, KeyArray]:
        """``(previous, current)`` keys of the members of ``rs`` (previous key space) that move."""
        if not self or not rs:
            e = np.empty(0, dtype=np.int64)
            return e, e
        prev = self._moving(rs, self.begins, self.ends).keys()
        return prev, self.apply_keys(prev)

    def inverse(self) -> RowSetShiftData:
        """The shift that undoes this one."""
        if not self:
            return self
        return RowSetShiftData(self.begins + self.deltas, self.ends + self.deltas, -self.deltas)

    @classmethod
    def from_moves(cls, prev_keys: Any, cur_keys: Any) -> RowSetShiftData:
        """Tightest shift ranges for surviving keys moving ``prev_keys[i] -> cur_keys[i]``.

        Pass *all* surviving keys (movers and non-movers), sorted and order-preserving:
        a run of consecutive keys with one non-zero delta becomes one range spanning them.
        """
        p, c = as_key_array(prev_keys), as_key_array(cur_keys)
        if p.size == 0:
            return _EMPTY_SHIFT
        d = c - p
        brk = np.flatnonzero(np.diff(d) != 0)
        first = np.concatenate(([0], brk + 1))
        last = np.concatenate((brk, [p.size - 1]))
        nz = d[first] != 0
        return cls.from_arrays(p[first[nz]], p[last[nz]], d[first[nz]])


_EMPTY_SHIFT = RowSetShiftData(
    np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
)
RowSetShiftData.EMPTY = _EMPTY_SHIFT
