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

Lookups cost ``O(log n)`` per key where the hash map's are ``O(1)``: a search's cache
misses grow with the map and with keys spread over it (fresh random keys: slower than the
hash map from a few hundred; fresh sorted keys, as a table's row sets give: even at about
60,000 entries; recent keys, as a table's changed rows mostly are: 2x faster at 250,000),
so the row-key map moves a sorted map into a hash map past ``rowkeymap.SORTED_MAX`` keys or
``rowkeymap.SORTED_BATCH`` keys in one call, and hash -> id maps of random hashes
(:mod:`engine._kernels.keymap`) stay hash maps.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["SortedU64Map"]

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

