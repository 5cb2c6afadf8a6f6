"""A ``uint64 -> int64`` map kept as sorted arrays: searches instead of hash probes.

:class:`SortedU64Map` has :class:`~engine._kernels.hashmap.U64Map`'s interface and serves
the row-key map's sparse layout while it is small enough
(:mod:`engine._kernels.rowkeymap`). A lookup is one ``searchsorted`` over a large sorted
*base* and one over a small sorted *delta* (about ten numpy calls whatever the batch),
where the hash map pays a probe round of about fifteen calls per slot of its longest
chain, two to five rounds for a batch of hundreds of keys. New keys above every key held
(row keys of a table that appends) are appended to the base; others are merged into the
delta, which is merged into the base once it passes an eighth of it (``O(n)`` per
merge, amortized ``O(1)`` per key, and no rebuild of a whole table at once as the hash
map's growth makes). Deleted keys leave tombstones (value ``-1``) that a later insert of
the same key revives and the next merge drops.

Lookups cost ``O(log n)`` per key where the hash map's are ``O(1)``: past a few hundred
thousand entries the hash map wins (cache misses of a binary search in megabytes), so the
row-key map moves a sorted map that grows past ``rowkeymap.SORTED_MAX`` into a hash map.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.hashmap import U64Map

__all__ = ["AdaptiveU64Map", "SortedU64Map"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_EMPTY_U = np.empty(0, dtype=np.uint64)
_EMPTY_I = np.empty(0, dtype=np.int64)


def _find(keys: U64, q: U64) -> tuple[I64, Mask]:
    """Position of each of ``q`` in the sorted ``keys`` (not empty) and whether it is there."""
    pos = np.searchsorted(keys, q)
    np.minimum(pos, keys.size - 1, out=pos)
    hit: Mask = keys.take(pos) == q
    return pos, hit


def _merged(ak: U64, av: I64, bk: U64, bv: I64) -> tuple[U64, I64]:
    """The sorted union of two sorted, disjoint key arrays with their values."""
    at = np.searchsorted(ak, bk) + np.arange(bk.size)  # where b's entries land
    n = ak.size + bk.size
    rest = np.ones(n, dtype=bool)
    rest[at] = False
    keys = np.empty(n, dtype=np.uint64)
    vals = np.empty(n, dtype=np.int64)
    keys[at], vals[at] = bk, bv
    keys[rest], vals[rest] = ak, av
    return keys, vals


class SortedU64Map:
    """Distinct ``uint64`` keys -> non-negative ``int64`` values in sorted arrays.

    The methods of :class:`~engine._kernels.hashmap.U64Map`, with the same contracts
    (inserted keys absent and distinct, values ``>= 0``, ``-1`` for absent keys).

    Parameters
    ----------
    keys, values
        Entries to start with (any order).

    Examples
    --------
    >>> m = SortedU64Map()
    >>> m.insert(np.array([7, 9], dtype=np.uint64), np.array([0, 1]))
    >>> m.lookup(np.array([9, 8, 7], dtype=np.uint64)).tolist()
    [1, -1, 0]
    """

    #: the delta is merged into the base once it holds more than max(this, base / 8)
    #: entries (tests shrink it)
    delta_min = 4096

    __slots__ = ("count", "_bk", "_bv", "_bn", "_dk", "_dv", "_dead")

    def __init__(self, keys: U64 | None = None, values: I64 | None = None) -> None:
        self.count = 0
        self._bk, self._bv, self._bn = _EMPTY_U, _EMPTY_I, 0  # base (with room to append)
        self._dk, self._dv = _EMPTY_U, _EMPTY_I  # delta, exact size
        self._dead = 0  # tombstones in base and delta
        if keys is not None and keys.size:
            assert values is not None
            o = np.argsort(keys)
            self._set_base(np.asarray(keys, dtype=np.uint64)[o], np.asarray(values, dtype=np.int64)[o])
            self.count = keys.size

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return int(self._bk.nbytes + self._bv.nbytes + self._dk.nbytes + self._dv.nbytes)

    def _set_base(self, keys: U64, vals: I64) -> None:
        n = keys.size
        cap = n + n // 2 + 64  # room for appends
        self._bk = np.empty(cap, dtype=np.uint64)
        self._bv = np.empty(cap, dtype=np.int64)
        self._bk[:n], self._bv[:n] = keys, vals
        self._bn = n

    def _top(self) -> int:
        """The largest key held, tombstones included (-1: none)."""
        top = int(self._bk[self._bn - 1]) if self._bn else -1
        return max(top, int(self._dk[-1])) if self._dk.size else top

    # reading -----------------------------------------------------------------------------
    def lookup(self, h: U64) -> I64:
        """Value per key, ``-1`` where absent."""
        h = np.asarray(h, dtype=np.uint64)
        if self._bn:
            bk = self._bk[: self._bn]
            pos, hit = _find(bk, h)
            out = np.where(hit, self._bv.take(pos), -1)
        else:
            out = np.full(h.size, -1, dtype=np.int64)
        if self._dk.size:
            pos, hit = _find(self._dk, h)
            np.copyto(out, self._dv.take(pos), where=hit)
        return out

    def items(self) -> tuple[U64, I64]:
        """``(keys, values)`` of every entry, keys ascending."""
        k, v = _merged(self._bk[: self._bn], self._bv[: self._bn], self._dk, self._dv)
        live = v >= 0
        return k[live], v[live]

    # writing -----------------------------------------------------------------------------
    def insert(self, h: U64, values: I64) -> None:
        """Add keys known to be absent and distinct among themselves, with their values."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        self.count += h.size
        if h.size > 1 and not bool((h[1:] > h[:-1]).all()):
            o = np.argsort(h)
            h, values = h[o], values[o]
        if self._dead:  # an absent key found is a tombstone: revived in place
            h, values = self._revive(h, values)
            if h.size == 0:
                return
        if int(h[0]) > self._top():  # above every key: appended
            if self._dk.size:
                self._dk, self._dv = np.concatenate((self._dk, h)), np.concatenate((self._dv, values))
            else:
                self._append_base(h, values)
        elif self._dk.size:
            self._dk, self._dv = _merged(self._dk, self._dv, h, values)
        else:
            self._dk, self._dv = h, values.copy()
        if self._dk.size > max(self.delta_min, self._bn // 8):
            self._merge()

    def _append_base(self, h: U64, values: I64) -> None:
        n, m = self._bn, h.size
        if n + m > self._bk.size:
            self._set_base(np.concatenate((self._bk[:n], h)), np.concatenate((self._bv[:n], values)))
            return
        self._bk[n : n + m], self._bv[n : n + m] = h, values
        self._bn = n + m

    def _revive(self, h: U64, values: I64) -> tuple[U64, I64]:
        """Give tombstoned keys among ``h`` their values; returns the others."""
        keep = np.ones(h.size, dtype=bool)
        for keys, vals in ((self._bk[: self._bn], self._bv), (self._dk, self._dv)):
            if keys.size:
                pos, hit = _find(keys, h)
                hit &= keep
                if hit.any():
                    vals[pos[hit]] = values[hit]
                    self._dead -= int(np.count_nonzero(hit))
                    keep &= ~hit
        if keep.all():
            return h, values
        return h[keep], values[keep]

    def _merge(self) -> None:
        """Fold the delta into the base and drop the tombstones (``O(n)``)."""
        k, v = _merged(self._bk[: self._bn], self._bv[: self._bn], self._dk, self._dv)
        if self._dead:
            live = v >= 0
            k, v = k[live], v[live]
            self._dead = 0
        self._set_base(k, v)
        self._dk, self._dv = _EMPTY_U, _EMPTY_I

    def _positions(self, h: U64) -> tuple[I64, Mask, I64, Mask]:
        """Where each key is live: base position and hit, delta position and hit."""
        if self._bn:
            bpos, bhit = _find(self._bk[: self._bn], h)
            bhit &= self._bv.take(bpos) >= 0
        else:
            bpos, bhit = np.zeros(h.size, dtype=np.int64), np.zeros(h.size, dtype=bool)
        if self._dk.size:
            dpos, dhit = _find(self._dk, h)
            dhit &= self._dv.take(dpos) >= 0
        else:
            dpos, dhit = bpos, np.zeros(h.size, dtype=bool)
        return bpos, bhit, dpos, dhit

    def delete(self, h: U64) -> None:
        """Remove keys (absent ones are ignored)."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        bpos, bhit, dpos, dhit = self._positions(h)
        self._bv[bpos[bhit]] = -1
        self._dv[dpos[dhit]] = -1
        gone = int(np.count_nonzero(bhit)) + int(np.count_nonzero(dhit))
        self.count -= gone
        self._dead += gone
        if self._dead > max(self.delta_min, self.count):  # mostly tombstones: compact
            self._merge()

    def set_values(self, h: U64, values: I64) -> None:
        """Change the values of keys that are present (absent keys are ignored)."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        bpos, bhit, dpos, dhit = self._positions(h)
        self._bv[bpos[bhit]] = values[bhit]
        self._dv[dpos[dhit]] = values[dhit]

    def clear(self) -> None:
        """Remove every entry."""
        self.__init__()  # type: ignore[misc]


class AdaptiveU64Map:
    """A :class:`SortedU64Map` while it holds at most :attr:`sorted_max` entries and no
    call passes more than :attr:`batch_max` keys, then a
    :class:`~engine._kernels.hashmap.U64Map` (once and for good): the same methods.

    For maps that are small in most uses and large in some (a hash -> group map of an
    aggregation with thousands of groups, or a keyed source's millions of keys): searches
    while they are cheap, probes once a search's cache misses cost more (a large map, or a
    batch of thousands of random keys: about ten misses per key against one).

    Examples
    --------
    >>> m = AdaptiveU64Map()
    >>> m.insert(np.array([7, 9], dtype=np.uint64), np.array([0, 1]))
    >>> m.lookup(np.array([9, 8, 7], dtype=np.uint64)).tolist(), m.hashed
    ([1, -1, 0], False)
    """

    #: entries past which the map turns into a hash map (tests change it)
    sorted_max = 1 << 18
    #: keys of one call past which it does too (tests change it)
    batch_max = 2048

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: SortedU64Map | U64Map = SortedU64Map()

    def __len__(self) -> int:
        return self._map.count

    @property
    def count(self) -> int:
        """How many entries the map holds."""
        return self._map.count

    @property
    def hashed(self) -> bool:
        """True once the map turned into a hash map."""
        return isinstance(self._map, U64Map)

    def _for(self, n: int, more: int = 0) -> SortedU64Map | U64Map:
        """The map for a call of ``n`` keys (``more`` of them new): hashed first if the call
        is too large or the entries would be too many."""
        m = self._map
        if isinstance(m, SortedU64Map) and (n > self.batch_max or m.count + more > self.sorted_max):
            k, v = m.items()
            self._map = m = U64Map(k.size + more)
            m.insert(k, v)
        return m

    def lookup(self, h: U64) -> I64:
        """Value per key, ``-1`` where absent."""
        return self._for(np.size(h)).lookup(h)

    def insert(self, h: U64, values: I64) -> None:
        """Add keys known to be absent and distinct among themselves, with their values."""
        self._for(np.size(h), np.size(h)).insert(h, values)

    def delete(self, h: U64) -> None:
        """Remove keys (absent ones are ignored)."""
        self._for(np.size(h)).delete(h)

    def set_values(self, h: U64, values: I64) -> None:
        """Change the values of keys that are present (absent keys are ignored)."""
        self._for(np.size(h)).set_values(h, values)

    def items(self) -> tuple[U64, I64]:
        """``(keys, values)`` of every entry (ascending while sorted)."""
        return self._map.items()
