"""The one map from row keys (non-negative int64) to int64 values (slots, positions).

Every operation that stores something per parent row needs "which slot holds row key
``k``?" for a whole array of keys, with inserts, removes and shifts of the parent's keys.
:class:`RowKeyMap` answers with one of two layouts:

* **dense** — an int64 array over a window ``[base, base + len)`` of key space, ``-1``
  where no key is: a lookup is one numpy ``take``. Sources, ring tables, filters and sorts
  of them, and most derived tables have dense keys.
* **regions** — one map of its own (dense or hashed by the same rule) per region of
  ``2**REGION_BITS`` keys, for keys that are dense within a few regions: a merge's parent
  ``i`` owns the region ``i << 40`` (:mod:`engine.ops.merge`). A lookup splits its keys by
  region (one sort when they span several) and is one ``take`` per region.
* **sorted** — sparse key spaces (the blocks of a many-to-many join, keys in more than
  ``MAX_REGIONS`` regions, a merge's keys where its parents' keys are sparse) while they
  hold at most ``SORTED_MAX`` keys and no call passes more than ``SORTED_BATCH``: the keys
  in sorted arrays
  (:class:`~engine._kernels.sortedmap.SortedU64Map`), a lookup two ``searchsorted`` calls
  where a hash map probes in rounds, new keys appended or merged into a small delta.
* **hashed** — past ``SORTED_MAX`` keys or ``SORTED_BATCH`` keys a call, the vectorized
  :class:`~engine._kernels.hashmap.U64Map` with the row key as its own ``uint64`` key
  (lookups ``O(1)`` per key where a search is ``O(log n)`` cache misses).

**The one switch-over rule.** The map is dense while the live keys span at most
``4 * count + SPARSE_SLACK`` key positions. It is checked when an insert falls outside the
window (the window is then refitted to the live keys with an eighth of their span as room
below and half of it above, so refits are amortized O(1) per key, also for a ring table's
sliding keys); past it the map turns to regions when its keys lie in 2 to ``MAX_REGIONS``
regions and each region's keys keep the rule within it, else sparse (sorted, then hashed
once it grows past ``SORTED_MAX``), once and for good (regions turn sparse when a key arrives in one region too many, or one region's keys
spread: a probe per region would cost more than one probe of all the keys). Why 4: the window costs 8
bytes per key position over about 1.6 times the span, so at most about 52 bytes per live
key, which is what the hashed map costs (40-80 bytes per entry at its load of 1/4 to 1/2),
while a dense lookup is one ``take``, many times faster than probing. ``SPARSE_SLACK``
(64k positions, under 1 MiB) keeps small tables dense whatever their keys; tests shrink
it to exercise the hashed mode. A map that holds one key in every few of a dense key
space (an aggregation's groups by their first rows) may pass a larger ratio than 4: it
pays more bytes per key than the hashed map, for a lookup that stays one ``take``.

Keys within one call are distinct; values are ``>= 0`` (``-1`` means absent). Shifts move
keys, not values: :meth:`RowKeyMap.move` and :meth:`RowKeyMap.shift` remove every mover
before inserting any, so a range may land on keys another range vacated.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import shift_keys
from engine._kernels.hashmap import U64Map
from engine._kernels.sortedmap import SortedU64Map

__all__ = ["MAX_REGIONS", "REGION_BITS", "SORTED_MAX", "SPARSE_SLACK", "RowKeyMap"]

I64 = npt.NDArray[np.int64]

SPARSE_SLACK = 65536  # dense while live keys span <= 4 * count + this (module attribute: tests shrink it)
_MIN_WINDOW = 1024
#: a region is the keys sharing ``key >> REGION_BITS`` (a merge's parent's keys)
REGION_BITS = 40
#: regions a map splits into before it turns hashed (module attribute: tests change it)
MAX_REGIONS = 64
#: a sparse map keeps its keys sorted up to this many, then turns into a hash map: lookups
#: of 300-2,000 fresh sorted keys spread over the map break even with the hash map's at
#: about 60,000 keys and cost 1.3-1.8x its time at 250,000 (recent keys, as a table's
#: changed rows mostly are, stay 2x ahead there) (module attribute: tests change it)
SORTED_MAX = 1 << 17
#: ... and while no call passes more keys than this: a batch of thousands of random keys
#: costs a search's cache misses per key where a hash map's probe costs one (tests change it)
SORTED_BATCH = 2048
_EMPTY = np.empty(0, dtype=np.int64)


class RowKeyMap:
    """Row key -> non-negative int64 value (``-1`` when absent), whole arrays at a time.

    Dense while keys are dense, hashed when they are sparse (see the module docstring for
    the one rule). Every method takes int64 arrays of distinct non-negative keys.

    Attributes
    ----------
    count
        How many keys are mapped.

    Examples
    --------
    >>> m = RowKeyMap()
    >>> m.insert(np.array([10, 11, 12]), np.array([0, 1, 2]))
    >>> m.lookup(np.array([11, 5, 12])).tolist()
    [1, -1, 2]
    >>> m.shift(np.array([11, 12]), np.array([11]), np.array([12]), np.array([5]))[1].tolist()
    [16, 17]
    >>> m.items()[0].tolist(), m.hashed
    ([10, 16, 17], False)
    """

    __slots__ = ("count", "_base", "_vals", "_hash", "_regions", "_lo", "_hi", "_ratio")

    def __init__(self, dense_ratio: int = 4) -> None:
        self._ratio = dense_ratio  # the rule's 4, for a map holding a sparse subset of a dense key space
        self.count = 0
        self._base = 0
        self._vals: I64 = np.full(0, -1, dtype=np.int64)
        self._hash: U64Map | SortedU64Map | None = None  # sparse: sorted, then hashed
        self._regions: dict[int, RowKeyMap] | None = None  # region -> its keys' map
        self._lo, self._hi = 0, -1  # dense: every live key is in [_lo, _hi] (a superset)

    def __len__(self) -> int:
        return self.count

    @property
    def hashed(self) -> bool:
        """True once the map left the one dense window (by region, sorted or hashed: it
        never goes back)."""
        return self._hash is not None or self._regions is not None

    @property
    def layout(self) -> str:
        """``"dense"``, ``"regions"``, ``"sorted"`` or ``"hashed"`` (see the module docstring)."""
        if self._hash is not None:
            return "sorted" if isinstance(self._hash, SortedU64Map) else "hashed"
        return "regions" if self._regions is not None else "dense"

    # reading -----------------------------------------------------------------------------
    def _sparse_for(self, n: int) -> U64Map | SortedU64Map:
        """The sparse map, for a call of ``n`` keys: a sorted one turns hashed first if the
        call passes more than ``SORTED_BATCH`` keys (once and for good)."""
        assert self._hash is not None
        if n > SORTED_BATCH and isinstance(self._hash, SortedU64Map):
            self._to_hashed(0, hashed=True)
        assert self._hash is not None
        return self._hash

    def lookup(self, keys: I64) -> I64:
        """Value of each key, ``-1`` where absent."""
        if self._hash is not None:
            return self._sparse_for(keys.size).lookup(keys.view(np.uint64))
        if self._regions is not None:
            return self._read_regions(keys, RowKeyMap.lookup)
        return self._dense_get(keys - self._base if self._base else keys)

    def _dense_get(self, idx: I64) -> I64:
        """Dense lookup by window index (``key - base``)."""
        try:
            if idx.size and int(idx.min()) < 0:  # below the window (or not a row key)
                raise IndexError
            return self._vals.take(idx)  # take: faster than fancy indexing, raises past the end
        except IndexError:
            return self._outside(idx)

    def _outside(self, idx: I64) -> I64:
        """Dense lookup where some window indexes fall outside the window."""
        vals = self._vals
        ok = (idx >= 0) & (idx < vals.size)
        out = np.full(idx.size, -1, dtype=np.int64)
        out[ok] = vals[idx[ok]]
        return out

    def window(self) -> tuple[int, I64] | None:
        """``(base, values)`` of the dense layout, for scans: ``values[k - base]`` is key
        ``k``'s value (``-1``: absent) and every key outside ``[base, base + len(values))``
        is absent; None in the other layouts. A view to read, never to write."""
        if self._hash is not None or self._regions is not None:
            return None
        return self._base, self._vals

    def items(self, ordered: bool = True) -> tuple[I64, I64]:
        """``(keys, values)`` of every entry, keys ascending (in no particular order when
        not ``ordered``: a hashed map's entries are not sorted then)."""
        if isinstance(self._hash, SortedU64Map):
            k, v = self._hash.items()
            return k.view(np.int64), v
        if self._hash is not None:
            k, v = self._hash.items()
            if not ordered:
                return k.view(np.int64), v
            order = np.argsort(k)
            return k[order].view(np.int64), v[order]
        if self._regions is not None:  # regions in key order: keys ascending
            parts = [self._regions[r].items() for r in sorted(self._regions)]
            if not parts:
                return _EMPTY, _EMPTY
            return np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts])
        if not self.count:
            return _EMPTY, _EMPTY
        lo, hi = self._lo, self._hi
        part = self._vals[lo - self._base : hi - self._base + 1]
        if part.size == self.count:  # no holes (a snapshot, an append-only table)
            return np.arange(lo, hi + 1, dtype=np.int64), part.copy()
        live = np.flatnonzero(part >= 0)
        return live.astype(np.int64) + lo, part[live]

    # writing -----------------------------------------------------------------------------
    def insert(self, keys: I64, values: I64) -> None:
        """Map keys that are absent now.

        Raises
        ------
        ValueError
            If a key is negative (not a row key).
        """
        if keys.size == 0:
            return
        self._fit(keys)
        if self._hash is not None:
            self._sparse_for(keys.size).insert(keys.view(np.uint64), values)
            if self._hash.count > SORTED_MAX and isinstance(self._hash, SortedU64Map):
                self._to_hashed(0)
        elif self._regions is not None:
            self._each_region(keys, values, RowKeyMap.insert)
        else:
            self._vals[keys - self._base if self._base else keys] = values
        self.count += keys.size

    def put(self, keys: I64, values: I64) -> None:
        """Map keys whether present or not (present ones get the new value).

        Raises
        ------
        ValueError
            If a key is negative (not a row key).
        """
        if keys.size == 0:
            return
        self._fit(keys)
        if self._regions is not None:
            self._each_region(keys, values, RowKeyMap.put)
            self.count = (self._hash.count if self._hash is not None
                          else sum(sub.count for sub in self._regions.values()))
            return
        h = self._hash
        if h is None:
            idx = keys - self._base
            self.count += int(np.count_nonzero(self._vals.take(idx) < 0))
            self._vals[idx] = values
            return
        h = self._sparse_for(keys.size)
        u = keys.view(np.uint64)
        new = h.lookup(u) < 0
        if not new.all():
            h.set_values(u, values)  # absent keys are ignored here, inserted below
        if new.any():
            h.insert(u[new], values[new])
        self.count = h.count
        if h.count > SORTED_MAX and isinstance(h, SortedU64Map):
            self._to_hashed(0)

    def set_values(self, keys: I64, values: I64) -> None:
        """Give keys that are all present now new values (one write, no presence check:
        use :meth:`put` when some may be absent)."""
        if keys.size == 0:
            return
        if self._hash is not None:
            self._sparse_for(keys.size).set_values(keys.view(np.uint64), values)
        elif self._regions is not None:
            self._each_region(keys, values, RowKeyMap.set_values)
        else:
            self._vals[keys - self._base if self._base else keys] = values

    def remove(self, keys: I64) -> I64:
        """Unmap keys; returns their values (``-1`` for keys that were absent)."""
        if keys.size == 0:
            return _EMPTY
        h = self._hash
        if h is not None:
            h = self._sparse_for(keys.size)
            u = keys.view(np.uint64)
            old = h.lookup(u)
            h.delete(u)
            self.count = h.count
            return old
        if self._regions is not None:
            old = self._read_regions(keys, RowKeyMap.remove)
            self.count -= int(np.count_nonzero(old >= 0))
            return old
        idx = keys - self._base if self._base else keys
        old = self._dense_get(idx)
        hit = old >= 0
        n = int(np.count_nonzero(hit))
        self._vals[idx if n == idx.size else idx[hit]] = -1
        self.count -= n
        return old

    def move(self, old: I64, new: I64) -> I64:
        """Remap ``old[i] -> new[i]`` all at once (every ``old`` leaves before any ``new``
        arrives); returns the moved values, ``-1`` where ``old[i]`` was absent (not mapped)."""
        vals = self.remove(old)
        ok = vals >= 0
        if ok.all():
            self.insert(new, vals)
        else:
            self.insert(new[ok], vals[ok])
        return vals

    def shift(self, keys: I64, begins: I64, ends: I64, deltas: I64) -> tuple[I64, I64, I64]:
        """Apply shift ranges to the present ``keys`` that fall in them.

        A key in the inclusive range ``[begins[i], ends[i]]`` moves by ``deltas[i]`` (the
        ranges are sorted and disjoint, as ``RowSetShiftData``'s): one ``searchsorted`` for
        all ranges, then one :meth:`move`. Keys the map does not hold must not be passed
        where a mover would land on them.

        Returns
        -------
        ``(old, new, values)`` of the keys that moved.
        """
        dst = shift_keys(keys, begins, ends, deltas)
        moving = dst != keys
        src, dst = keys[moving], dst[moving]
        return src, dst, self.move(src, dst)

    # layout ------------------------------------------------------------------------------
    def _fit(self, keys: I64) -> None:
        """Make the dense window cover ``keys`` (about to be inserted), or split the map by
        region, or turn it hashed (the module docstring's rule)."""
        lo = int(keys.min())
        if lo < 0:
            raise ValueError(f"row keys are non-negative, got {lo}")
        if self._hash is not None:
            return
        k_lo, k_hi = lo, int(keys.max())
        if self._regions is not None:
            r_lo, r_hi = k_lo >> REGION_BITS, k_hi >> REGION_BITS
            if r_lo == r_hi and (r_lo in self._regions or len(self._regions) < MAX_REGIONS):
                return
            if len(self._regions) + r_hi - r_lo + 1 <= MAX_REGIONS:  # room for any of them
                return
            new = set(np.unique(keys >> REGION_BITS).tolist())
            if len(self._regions.keys() | new) > MAX_REGIONS:  # one region too many: hashed
                self._to_hashed(keys.size)
            return
        lo, hi = (min(k_lo, self._lo), max(k_hi, self._hi)) if self.count else (k_lo, k_hi)
        base, vals = self._base, self._vals
        if lo >= base and hi < base + vals.size:
            self._lo, self._hi = lo, hi
            return
        live = _EMPTY
        if self.count:  # the live keys, within their bounds
            live = np.flatnonzero(vals[self._lo - base : self._hi - base + 1] >= 0) + (self._lo - base)
            lo, hi = min(k_lo, base + int(live[0])), max(k_hi, base + int(live[-1]))
        span = hi - lo + 1
        if span > self._ratio * (self.count + keys.size) + SPARSE_SLACK:
            held = live.astype(np.int64) + base
            if self._dense_by_region(np.concatenate([held, keys])):
                self._regions, self._vals = {}, _EMPTY
                if live.size:
                    self._each_region(held, vals[live], RowKeyMap.insert)
                return
            index = _sparse(self.count + keys.size, keys.size)
            if live.size:
                index.insert((live.astype(np.int64) + base).view(np.uint64), vals[live])
            self._hash, self._vals = index, _EMPTY
            return
        new_base = max(0, lo - span // 8)
        grown = np.full(hi - new_base + 1 + span // 2 + _MIN_WINDOW, -1, dtype=np.int64)
        if live.size:
            a, b = int(live[0]), int(live[-1]) + 1
            grown[base + a - new_base : base + b - new_base] = vals[a:b]
        self._base, self._vals = new_base, grown
        self._lo, self._hi = lo, hi

    def _dense_by_region(self, keys: I64) -> bool:
        """Whether ``keys`` (every key the map is to hold) lie in 2 to ``MAX_REGIONS``
        regions, each within the dense rule on its own."""
        regions, at, counts = np.unique(keys >> REGION_BITS, return_inverse=True, return_counts=True)
        if not 1 < regions.size <= MAX_REGIONS:
            return False
        lo = np.full(regions.size, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(regions.size, -1, dtype=np.int64)
        np.minimum.at(lo, at, keys)
        np.maximum.at(hi, at, keys)
        return bool((hi - lo + 1 <= self._ratio * counts + SPARSE_SLACK).all())

    def _read_regions(self, keys: I64, read: Callable[[RowKeyMap, I64], I64]) -> I64:
        """``read`` (lookup, remove) each region's keys in its map: a value per key, ``-1``
        where its region has no map."""
        assert self._regions is not None
        out = np.full(keys.size, -1, dtype=np.int64)
        for region, at in _by_region(keys):
            sub = self._regions.get(region)
            if sub is not None:
                if at is None:
                    return read(sub, keys)
                out[at] = read(sub, keys[at])
        return out

    def _each_region(self, keys: I64, values: I64, write: Callable[[RowKeyMap, I64, I64], None]) -> None:
        """``write`` each region's keys and values into its map (made when it is new); the
        whole map turns hashed once one region's map did (a probe per region would cost
        more than one probe of all keys)."""
        assert self._regions is not None
        sparse = False
        for region, at in _by_region(keys):
            sub = self._regions.get(region)
            if sub is None:
                sub = self._regions[region] = RowKeyMap(self._ratio)
            if at is None:
                write(sub, keys, values)
            else:
                write(sub, keys[at], values[at])
            sparse = sparse or sub._hash is not None  # sorted or hashed
        if sparse:
            self._to_hashed(0)

    def _to_hashed(self, more: int, *, hashed: bool = False) -> None:
        """Move every entry (of the regions, or of a sorted map grown past ``SORTED_MAX``
        or passed a large batch) into one sparse map: sorted while they are few enough and
        not ``hashed``, else hashed (room for ``more``)."""
        k, v = self.items()
        self._regions = None
        self._hash = U64Map(k.size + more) if hashed else _sparse(k.size + more, more)
        self._hash.insert(k.view(np.uint64), v)


def _sparse(n: int, batch: int) -> U64Map | SortedU64Map:
    """An empty sparse map for about ``n`` keys, arriving ``batch`` at a time: sorted up to
    ``SORTED_MAX`` keys and ``SORTED_BATCH`` a batch, else hashed."""
    return SortedU64Map() if n <= SORTED_MAX and batch <= SORTED_BATCH else U64Map(n)


def _by_region(keys: I64) -> list[tuple[int, I64 | None]]:
    """``(region, positions of its keys)`` for each region ``keys`` touch, positions
    ``None`` when every key is in that one region."""
    if keys.size == 0:
        return []
    r = keys >> REGION_BITS
    first = int(r[0])
    if keys.size == 1 or (int(r.min()) == first and int(r.max()) == first):
        return [(first, None)]
    order = np.argsort(r, kind="stable")
    rs = r[order]
    cuts = np.flatnonzero(rs[1:] != rs[:-1]) + 1
    bounds = [0, *cuts.tolist(), keys.size]
    return [(int(rs[b]), order[b:e]) for b, e in zip(bounds[:-1], bounds[1:], strict=True)]
