"""The one map from row keys (non-negative int64) to int64 values (slots, positions).

Every operation that stores something per parent row needs "which slot holds row key
``k``?" for a whole array of keys, with inserts, removes and shifts of the parent's keys.
:class:`RowKeyMap` answers with one of two layouts:

* **dense** — an int64 array over a window ``[base, base + len)`` of key space, ``-1``
  where no key is: a lookup is one numpy ``take``. Sources, ring tables, filters and sorts
  of them, and most derived tables have dense keys.
* **hashed** — for sparse key spaces (merge regions at ``i << 40``, the blocks of a
  many-to-many join): an immutable sorted *base* of keys with their values beside them,
  plus a vectorized :class:`~engine._kernels.hashmap.U64Map` *delta* for keys added since
  the base was built. A big batch of keys (a snapshot's, sorted as a bitmap gives them)
  becomes the base as it comes: a copy, no hashing. A key removed from the base leaves a
  tombstone (value ``-1``, key kept) that a move or a put revives in place, so a shift
  closing a gap writes values, not keys.

**The one switch-over rule.** The map is dense while the live keys span at most
``4 * count + SPARSE_SLACK`` key positions. It is checked when an insert falls outside the
window (the window is then refitted to the live keys with an eighth of their span as room
below and half of it above, so refits are amortized O(1) per key, also for a ring table's
sliding keys); past it the map turns hashed, once and for good. Why 4: the window costs 8
bytes per key position over about 1.6 times the span, so at most about 52 bytes per live
key, no more than the hashed delta costs (40-80 bytes per entry at its load of 1/4 to 1/2),
while a dense lookup is one ``take``, many times faster than probing.
``SPARSE_SLACK`` (64k positions, under 1 MiB) keeps small tables dense whatever their
keys; tests shrink it to exercise the hashed mode.

**The one fold rule (hashed).** The delta is folded into a new base (tombstones dropped),
at a cost of O(base) plus sorting the delta, when

* an insert brings more than ``1 / _BATCH`` of the entries (base and delta): hashing that
  many keys would cost more than the fold (a snapshot, the first batches of a table, a
  shift of most keys); or
* reads have probed the delta, since it last grew, for about what a fold costs
  (``_DELTA_CALL`` per probe plus two per key, in keys folded): ski rental, so a map that
  is mostly read settles as one sorted base, while one that churns never pays to sort its
  delta (a fold would not stop the probes: the delta fills again), which then works as
  the plain hash map it is.

Each fold is paid for by the inserts or the probes since the last one, so it is amortized
O(1) per change or probe (O(log) for sorting the delta). Tombstones past a quarter of the
base (checked when keys are added) end it: removes made them (the delta holds under a
quarter as many keys) and a fold drops them; or the map churns, and the base is
*dissolved*: its live keys join the delta's in one new hash map, the plain hash map the map
is from then on (until a fold). Hashing them costs about what a bulk load saved by not
hashing the base; before, removes pay for looking in the base first. Removes never drop
tombstones, as a move removes before it inserts and should revive them.

**Lookups in the base** go through a radix directory (:class:`_Directory`): the span of the
keys split into one or two buckets per key, so a key is at its bucket's first or second
position (one vectorized round each; the few others are binary-searched); a bucket holding
more than ``_SCAN`` keys (merge regions: dense islands in a huge span) gets a directory of
its own over its keys' span. Building it is O(base), so a base is first probed by
``np.searchsorted`` and the directory is built once the keys probed pass ``base / _RENT``
(ski rental: a bulk load followed by a few lookups never pays for it, a busy map pays once
per base). Lookups and removes probe the part holding more keys first, the other for the
keys it did not have.

Keys within one call are distinct; values are ``>= 0`` (``-1`` means absent). Shifts move
keys, not values: :meth:`RowKeyMap.move` and :meth:`RowKeyMap.shift` remove every mover
before inserting any, so a range may land on keys another range vacated.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import expand, highest_bit, shift_keys
from engine._kernels.hashmap import U64Map

__all__ = ["SPARSE_SLACK", "RowKeyMap"]

I64 = npt.NDArray[np.int64]

SPARSE_SLACK = 65536  # dense while live keys span <= 4 * count + this (module attribute: tests shrink it)
_BATCH = 8  # hashed: an insert of more than 1/_BATCH of the entries folds (see the module doc)
_MIN_WINDOW = 1024
_SCAN = 8  # a directory bucket with more keys than this gets a directory of its own
_FEW = 64  # keys in such buckets below this are binary-searched, not looked up a level down
_RENT = 32  # build a base's directory once the keys probed in it pass base / _RENT
_DELTA_CALL = 3072  # a probe of the delta costs about a fold of this many keys, plus 2 per key
_EMPTY = np.empty(0, dtype=np.int64)


class RowKeyMap:
    """Row key -> non-negative int64 value (``-1`` when absent), whole arrays at a time.

    Dense while keys are dense, hashed when they are sparse (see the module docstring for
    the one switch-over rule and the one fold rule). Every method takes int64 arrays of
    distinct non-negative keys.

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

    Sparse keys inserted as one sorted batch become the hashed layout's base as they are:

    >>> m = RowKeyMap()
    >>> m.insert(np.array([5, 1 << 40, 1 << 41]), np.array([0, 1, 2]))
    >>> m.hashed, m.lookup(np.array([1 << 40, 6])).tolist()
    (True, [1, -1])
    """

    __slots__ = ("count", "_base", "_vals", "_sparse", "_lo", "_hi")

    def __init__(self) -> None:
        self.count = 0
        self._base = 0
        self._vals: I64 = np.full(0, -1, dtype=np.int64)
        self._sparse: _Sparse | None = None
        self._lo, self._hi = 0, -1  # dense: every live key is in [_lo, _hi] (a superset)

    def __len__(self) -> int:
        return self.count

    @property
    def hashed(self) -> bool:
        """True once the map switched to the hashed layout (it never switches back)."""
        return self._sparse is not None

    # reading -----------------------------------------------------------------------------
    def lookup(self, keys: I64) -> I64:
        """Value of each key, ``-1`` where absent."""
        if self._sparse is not None:
            return self._sparse.lookup(keys)
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

    def items(self) -> tuple[I64, I64]:
        """``(keys, values)`` of every entry, keys ascending (new arrays)."""
        if self._sparse is not None:
            return self._sparse.items()
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
        if keys.size:
            self._insert(keys, values, revive=False)

    def _insert(self, keys: I64, values: I64, revive: bool) -> None:
        self._fit(keys)
        sp = self._sparse
        if sp is not None:
            sp.insert(keys, values, revive)
            self.count = sp.count
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
        sp = self._sparse
        if sp is not None:
            sp.put(keys, values)
            self.count = sp.count
            return
        idx = keys - self._base
        self.count += int(np.count_nonzero(self._vals.take(idx) < 0))
        self._vals[idx] = values

    def set_values(self, keys: I64, values: I64) -> None:
        """Give keys that are all present now new values (one write, no presence check:
        use :meth:`put` when some may be absent)."""
        if keys.size == 0:
            return
        if self._sparse is not None:
            self._sparse.set_values(keys, values)
        else:
            self._vals[keys - self._base if self._base else keys] = values

    def remove(self, keys: I64) -> I64:
        """Unmap keys; returns their values (``-1`` for keys that were absent)."""
        if keys.size == 0:
            return _EMPTY
        sp = self._sparse
        if sp is not None:
            old = sp.remove(keys)
            self.count = sp.count
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
            if new.size:
                self._insert(new, vals, revive=True)  # keys often land where others left
        else:
            if ok.any():
                self._insert(new[ok], vals[ok], revive=True)
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
        """Make the dense window cover ``keys`` (about to be inserted), or turn hashed."""
        lo = int(keys.min())
        if lo < 0:
            raise ValueError(f"row keys are non-negative, got {lo}")
        if self._sparse is not None:
            return
        k_lo, k_hi = lo, int(keys.max())
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
        if span > 4 * (self.count + keys.size) + SPARSE_SLACK:  # the live keys are the base
            self._sparse = _Sparse(live.astype(np.int64) + base, vals.take(live))
            self._vals = _EMPTY
            return
        new_base = max(0, lo - span // 8)
        grown = np.full(hi - new_base + 1 + span // 2 + _MIN_WINDOW, -1, dtype=np.int64)
        if live.size:
            a, b = int(live[0]), int(live[-1]) + 1
            grown[base + a - new_base : base + b - new_base] = vals[a:b]
        self._base, self._vals = new_base, grown
        self._lo, self._hi = lo, hi


class _Sparse:
    """The hashed layout: a sorted base with tombstones, plus a delta hash map.

    Invariants: ``keys`` is sorted and distinct and never written (a fold replaces it, a
    dissolve empties it); ``vals[i]`` is the value of ``keys[i]``, ``-1`` for a tombstone, and
    ``vals`` has one more entry, ``-1``, so position ``-1`` (not found) reads as absent;
    ``dead`` counts the tombstones; a live key is in exactly one of the base and ``delta``
    (a tombstone's key may be live in the delta: inserts look for tombstones to revive only
    where that is likely to pay).
    """

    __slots__ = ("keys", "vals", "dead", "delta", "_log", "_dir", "_probes", "_delta_probes")

    def __init__(self, keys: I64, vals: I64) -> None:
        """Take sorted distinct ``keys`` (owned from now on) and their values."""
        self._set_base(keys, np.append(vals, -1))
        self._clear_delta()

    def _set_base(self, keys: I64, vals: I64) -> None:
        """Sorted distinct ``keys`` with ``vals`` and their extra ``-1`` (owned) as the base."""
        self.keys, self.vals = keys, vals
        self.dead = 0
        self._dir: _Directory | None = None
        self._probes = 0  # keys probed in the base while it has no directory

    def _clear_delta(self) -> None:
        self.delta = U64Map()
        # the delta's entries as they were added, while it only grew: (keys, values) batches
        self._log: tuple[list[I64], list[I64]] | None = ([], [])
        self._delta_probes = 0  # what probing it cost since it grew, in keys folded (_DELTA_CALL)

    @property
    def count(self) -> int:
        return self.keys.size - self.dead + self.delta.count

    # reading -----------------------------------------------------------------------------
    def find(self, q: I64) -> I64:
        """Base position of each key (live or tombstone), ``-1`` where it is not a base key."""
        keys = self.keys
        if keys.size == 0:
            return np.full(q.size, -1, dtype=np.int64)
        d = self._dir
        if d is None:
            self._probes += q.size
            if self._probes * _RENT < keys.size:  # binary searches cost less than building it
                p = np.searchsorted(keys, q)
                np.minimum(p, keys.size - 1, out=p)
                out: I64 = np.where(keys.take(p) == q, p, -1)
                return out
            d = self._dir = _Directory(keys)
        return d.find(q)

    def lookup(self, q: I64) -> I64:
        if not self.delta.count:
            return self.vals.take(self.find(q))
        if 2 * self.delta.count > self.keys.size:  # most keys are in the delta: probe it first
            out = self._in_delta(q)
            if self.keys.size > self.dead:
                miss = np.flatnonzero(out < 0)
                if miss.size:
                    out[miss] = self.vals.take(self.find(q.take(miss)))
        else:
            out = self.vals.take(self.find(q))
            miss = np.flatnonzero(out < 0)
            if miss.size:
                out[miss] = self._in_delta(q.take(miss))
        if self._delta_probes > self.keys.size + self.delta.count:
            self._fold(_EMPTY, _EMPTY)
        return out

    def _in_delta(self, keys: I64) -> I64:
        self._delta_probes += _DELTA_CALL + 2 * keys.size
        return self.delta.lookup(keys.view(np.uint64))

    def items(self) -> tuple[I64, I64]:
        """``(keys, values)`` of every entry, keys ascending (new arrays)."""
        k, v = self._live()
        if self.delta.count:
            k, v = _union(k, v, *self._delta_items())
            return k, v[:-1]
        return k.copy(), v.copy()

    def _live(self) -> tuple[I64, I64]:
        """The base's live entries (views when it has no tombstones)."""
        k, v = self.keys, self.vals[:-1]
        if self.dead:
            live = v >= 0
            return k[live], v[live]
        return k, v

    def _delta_items(self) -> tuple[I64, I64]:
        """The delta's entries: as they were added while the delta only grew (sorted batches
        stay sorted runs, which :func:`_union` merges rather than sorts), else in hash order."""
        if self._log is not None:
            return np.concatenate(self._log[0]), np.concatenate(self._log[1])
        dk, dv = self.delta.items()
        return dk.view(np.int64), dv

    # writing -----------------------------------------------------------------------------
    def insert(self, keys: I64, values: I64, revive: bool = False) -> None:
        """Add absent keys; ``revive``: look for their tombstones first (a move's keys often
        land on keys it vacated), else they go to the delta (or a fold)."""
        if revive and self.dead and not self._folds(keys.size):
            p = self.find(keys)  # an absent key found in the base is a tombstone
            back = p >= 0
            n = int(np.count_nonzero(back))
            if n:
                self.vals[p[back]] = values[back]
                self.dead -= n
                if n == keys.size:
                    return
                keys, values = keys[~back], values[~back]
        self._add(keys, values)

    def _folds(self, more: int) -> bool:
        """Whether adding ``more`` keys folds the delta into the base (the module's rule)."""
        return more * _BATCH > self.keys.size + self.delta.count

    def _add(self, keys: I64, values: I64) -> None:
        """Add keys that are live nowhere: to the delta, or fold all into a new base."""
        worn = 4 * self.dead > self.keys.size  # tombstones past a quarter of the base
        if self._folds(keys.size) or worn and 4 * self.delta.count < self.dead:
            self._fold(keys, values)  # (the second: removes made the tombstones, not churn)
            return
        if worn:  # churn: dissolve the base into one new delta
            dk, dv = self.delta.items()
            k, v = self._live()
            keys = np.concatenate((dk.view(np.int64), k, keys))
            values = np.concatenate((dv, v, values))
            self._set_base(_EMPTY, np.full(1, -1, dtype=np.int64))
            self._clear_delta()
            self._log = None
        if not self.delta.count:  # room for what follows, rather than growing by rebuilds
            self.delta = U64Map(max(keys.size, min(16 * keys.size, self.keys.size // 2)))
        self.delta.insert(keys.view(np.uint64), values)
        self._delta_probes = 0  # a fold pays off by reads while the delta stays as it is
        if self._log is not None:
            self._log[0].append(keys.copy())
            self._log[1].append(values.copy())

    def _fold(self, keys: I64, values: I64) -> None:
        """Fold the delta and ``keys`` (live nowhere) into a new base, without tombstones."""
        if self.delta.count:
            dk, dv = self._delta_items()
            keys, values = np.concatenate((dk, keys)), np.concatenate((dv, values))
        self._set_base(*_union(*self._live(), keys, values))
        self._clear_delta()

    def put(self, keys: I64, values: I64) -> None:
        p = self.find(keys)
        old = self.vals.take(p)
        if self.delta.count:  # a tombstone's key may be live in the delta: set it there
            gone = np.flatnonzero(old < 0)
            if gone.size:
                there = self._in_delta(keys.take(gone)) >= 0
                if there.any():
                    at = gone[there]
                    self.delta.set_values(keys.take(at).view(np.uint64), values.take(at))
                    self._log = None
                    p[at] = -2  # done
        base = p >= 0  # live keys and tombstones of the base: written in place (revived)
        self.dead -= int(np.count_nonzero(old[base] < 0))
        self.vals[p[base]] = values[base]
        new = p == -1
        if new.any():
            self._add(keys[new], values[new])

    def set_values(self, keys: I64, values: I64) -> None:
        p = self.find(keys)
        live = self.vals.take(p) >= 0
        if live.all():
            self.vals[p] = values
            return
        self.vals[p[live]] = values[live]
        out = ~live
        self.delta.set_values(keys[out].view(np.uint64), values[out])
        self._log = None

    def remove(self, keys: I64) -> I64:
        if 2 * self.delta.count > self.keys.size:  # most keys are in the delta: probe it first
            old = self._in_delta(keys)
            hit = old >= 0
            if hit.any():
                self.delta.delete(keys[hit].view(np.uint64))
                self._log = None
            rest = np.flatnonzero(~hit)
            if rest.size and self.keys.size > self.dead:
                old[rest] = self._kill(keys.take(rest))
            return old
        old = self._kill(keys)
        rest = np.flatnonzero(old < 0)
        if self.delta.count and rest.size:
            k = keys.take(rest)
            found = self._in_delta(k)
            if (found >= 0).any():
                old[rest] = found
                self.delta.delete(k.view(np.uint64))
                self._log = None
        return old

    def _kill(self, keys: I64) -> I64:
        """Turn the base's live ``keys`` into tombstones; returns their values (-1 elsewhere)."""
        p = self.find(keys)
        old = self.vals.take(p)
        hit = old >= 0
        n = int(np.count_nonzero(hit))
        if n:
            self.vals[p[hit]] = -1
            self.dead += n
        return old


def _union(k1: I64, v1: I64, k2: I64, v2: I64) -> tuple[I64, I64]:
    """The entries of sorted ``k1`` and of ``k2`` (any order, keys in neither ``k1`` nor
    twice) as new arrays, sorted by key; the values get the extra ``-1`` of :class:`_Sparse`.

    ``k2`` is sorted by itself (timsort: sorted batches are runs it merges rather than
    sorts), then placed among ``k1`` by one ``searchsorted``: O(k1 + k2 log k2), and no
    array of the size of both is sorted."""
    n, m = k1.size, k2.size
    if m > 1 and not (k2[1:] > k2[:-1]).all():
        order = np.argsort(k2, kind="stable")
        k2, v2 = k2.take(order), v2.take(order)
    k = np.empty(n + m, dtype=np.int64)
    v = np.empty(n + m + 1, dtype=np.int64)
    v[-1] = -1
    if not n or not m or k2[0] > k1[-1]:  # one part, or the new keys all come after
        k[:n], k[n:], v[:n], v[n:-1] = k1, k2, v1, v2
        return k, v
    at = np.searchsorted(k1, k2)
    at += np.arange(m)  # where each new key lands among all
    k[at], v[at] = k2, v2
    rest = np.ones(n + m, dtype=bool)
    rest[at] = False
    k[rest], v[:-1][rest] = k1, v1
    return k, v


class _Directory:
    """Where each key of a sorted array is, found from the key's bits (a radix directory).

    Level 1 splits the span of the ``n`` keys into at most ``2**(floor(log2(n)) + 1)``
    equal buckets, so spread keys have one bucket or two each: a key is found at its
    bucket's first position, or its second, in one vectorized round each (the few left
    are binary-searched; more rounds would cost more). A bucket holding more than ``_SCAN``
    keys is a *segment* of level 2, split the same way over its own keys' span: a merge's
    regions, dense islands at ``i << 40``, each fill one level-1 bucket and spread out in
    their own. Keys in a bucket still that full at level 2 are binary-searched.

    The key at the position found is the proof: a bucket computed for a key that is not
    there (below the first key, past the last, overflowing) finds nothing, never a wrong
    position.
    """

    __slots__ = ("_keys", "_levels")

    def __init__(self, keys: I64) -> None:
        self._keys = keys
        lo = np.zeros(1, dtype=np.int64)
        hi = np.full(1, keys.size, dtype=np.int64)
        self._levels = [_Level(keys, lo, hi)]
        full = self._levels[0].full
        if full.size:
            lv = self._levels[0]
            self._levels.append(_Level(keys, lv.starts.take(full).astype(np.int64),
                                       lv.starts.take(full + 1).astype(np.int64)))

    def find(self, q: I64) -> I64:
        """Position of each key in the sorted array, ``-1`` where absent."""
        keys = self._keys
        top = self._levels[0]
        b = (q - top.first[0]) >> top.shift[0]
        np.clip(b, 0, top.buckets[0] - 1, out=b)
        lo, hi = top.starts.take(b), top.starts.take(b + 1)
        k = keys.take(lo)
        out: I64 = np.where(k == q, lo, -1)
        more = (k < q) & (hi - lo > 1)
        if top.full.size:
            deep = hi - lo > _SCAN
            if deep.any():
                more &= ~deep
                idx = np.flatnonzero(deep)
                if idx.size > _FEW:
                    self._deeper(q, b, out, idx)
                else:  # a level costs more than binary searches for a few keys
                    _search(keys, q.take(idx), out, idx)
        idx = np.flatnonzero(more)
        if idx.size:
            _scan(keys, q.take(idx), lo.take(idx) + 1, hi.take(idx), out, idx)
        return out

    def _deeper(self, q: I64, b: I64, out: I64, idx: I64) -> None:
        """Level 2 for the keys ``q[idx]`` that fell in full level-1 buckets ``b[idx]``."""
        keys, top, lv = self._keys, self._levels[0], self._levels[1]
        seg = np.searchsorted(top.full, b.take(idx))  # full buckets are the segments, in order
        qq = q.take(idx)
        nb = lv.buckets.take(seg)
        b2 = lv.offset.take(seg) + np.clip((qq - lv.first.take(seg)) >> lv.shift.take(seg), 0, nb - 1)
        lo, hi = lv.starts.take(b2), lv.starts.take(b2 + 1)
        _scan(keys, qq, lo, hi, out, idx)


def _scan(keys: I64, q: I64, pos: I64, hi: I64, out: I64, idx: I64) -> None:
    """``out[idx[i]] = p`` where ``keys[p] == q[i]`` for ``p`` in ``[pos[i], hi[i])``: one
    vectorized round for the first position, then a binary search for the few keys left
    (the directory keeps about one key per bucket: a round per position would cost more)."""
    k = keys.take(pos)
    hit = k == q
    out[idx[hit]] = pos[hit]
    rest = np.flatnonzero((k < q) & (pos + 1 < hi))
    if rest.size:
        _search(keys, q.take(rest), out, idx.take(rest))


def _search(keys: I64, q: I64, out: I64, idx: I64) -> None:
    """``out[idx[i]]`` = position of ``q[i]`` in ``keys`` or ``-1``, by binary search."""
    p = np.searchsorted(keys, q)
    np.minimum(p, keys.size - 1, out=p)
    out[idx] = np.where(keys.take(p) == q, p, -1)


class _Level:
    """One level of a :class:`_Directory`: segments (position ranges of the sorted keys),
    each split into equal buckets of key span; ``starts[offset[s] + b]`` is the first
    position of bucket ``b`` of segment ``s``, and each segment has one extra entry, its end.
    ``full`` lists the buckets holding more than ``_SCAN`` keys."""

    __slots__ = ("first", "shift", "buckets", "offset", "starts", "full")

    def __init__(self, keys: I64, lo: I64, hi: I64) -> None:
        size = hi - lo
        self.first = keys.take(lo)
        span = keys.take(hi - 1) - self.first
        bits = highest_bit(size.view(np.uint64)) + 1  # n < 2**bits <= 2n buckets for n keys
        self.shift = np.maximum(highest_bit(span.view(np.uint64)) + 1 - bits, 0)
        self.buckets = (span >> self.shift) + 1
        ends = np.cumsum(self.buckets + 1)
        self.offset = ends - self.buckets - 1
        if lo.size == 1:  # one segment: every key, in order
            ids = (keys[int(lo[0]) : int(hi[0])] - self.first[0]) >> self.shift[0]
        else:
            owner = np.repeat(np.arange(lo.size), size)
            ids = self.offset.take(owner) + ((keys.take(expand(lo, size)) - self.first.take(owner))
                                             >> self.shift.take(owner))
        counts = np.bincount(ids, minlength=int(ends[-1]))
        pos = np.int32 if keys.size < 2**31 else np.int64  # int32: half the cache misses
        starts = np.empty(counts.size + 1, dtype=np.int64)
        starts[0] = 0
        np.cumsum(counts, out=starts[1:])  # keys before each bucket, counted over the segments
        if lo.size == 1:  # bucket b is starts[b]:starts[b + 1], the extra entry the end
            if lo[0]:
                starts += lo[0]
            self.starts = starts[:-1].astype(pos)
        else:  # each segment's buckets start at its first position
            self.starts = (starts[:-1] + np.repeat(lo - starts.take(self.offset), self.buckets + 1)
                           ).astype(pos)
        self.full = np.flatnonzero(counts > _SCAN)
