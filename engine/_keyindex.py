"""A vectorized open-addressing hash map from uint64 key hashes to int64 row keys.

Keyed sources need "which row holds this key?" for a batch of 10k keys against 10M,
at a cost that follows the batch. Linear probing over numpy arrays does every probe
round for the whole batch at once; rounds are few at load <= 0.5. Deletions leave
tombstones; the table is rebuilt (vectorized) when live + dead entries pass the load.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_EMPTY = -1
_DEAD = -2
_MULT = np.uint64(0x9E3779B97F4A7C15)
_MAX_LOAD = 0.5

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class KeyIndex:
    """Map distinct ``uint64`` hashes to non-negative ``int64`` values, whole arrays at a time."""

    def __init__(self, capacity: int = 1024) -> None:
        self._alloc(capacity)
        self.count = 0

    def _alloc(self, capacity: int) -> None:
        bits = max(10, int(np.ceil(np.log2(max(capacity, 2) / _MAX_LOAD))))
        self._bits = bits
        self._mask = np.uint64((1 << bits) - 1)
        self._hashes = np.zeros(1 << bits, dtype=np.uint64)
        self._values = np.full(1 << bits, _EMPTY, dtype=np.int64)
        self._claim = np.zeros(1 << bits, dtype=np.int64)  # scratch for inserts
        self._dead = 0

    def __len__(self) -> int:
        return self.count

    def _home(self, h: U64) -> U64:
        with np.errstate(over="ignore"):
            return (h * _MULT) >> np.uint64(64 - self._bits)

    def _find(self, h: U64) -> tuple[I64, I64]:
        """``(slot, value)`` per hash; ``-1`` for both where absent."""
        n = h.size
        slot_out = np.full(n, -1, dtype=np.int64)
        val_out = np.full(n, -1, dtype=np.int64)
        idx = np.arange(n)
        s = self._home(h)
        hh = h
        while idx.size:
            v = self._values[s]
            hit = (v >= 0) & (self._hashes[s] == hh)
            if hit.any():
                slot_out[idx[hit]] = s[hit].astype(np.int64)
                val_out[idx[hit]] = v[hit]
            go = ~hit & (v != _EMPTY)
            idx, s, hh = idx[go], (s[go] + np.uint64(1)) & self._mask, hh[go]
        return slot_out, val_out

    def lookup(self, h: U64) -> I64:
        """Value per hash, ``-1`` where absent."""
        return self._find(np.asarray(h, dtype=np.uint64))[1]

    def insert(self, h: U64, values: I64) -> None:
        """Add hashes known to be absent and distinct."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        if (self.count + self._dead + h.size) > _MAX_LOAD * self._values.size:
            self._rehash(self.count + h.size)
        self._place(h, values)
        self.count += h.size

    def _place(self, h: U64, values: I64) -> None:
        idx = np.arange(h.size)
        s = self._home(h)
        while idx.size:
            v = self._values[s]
            cand = np.flatnonzero(v < 0)
            # among keys probing the same free slot this round, one claims it: each scatters
            # its index into the slot and keeps the slot if it reads itself back (no sort)
            self._claim[s[cand]] = cand
            win = cand[self._claim[s[cand]] == cand]
            ws = s[win]
            self._dead -= int(np.count_nonzero(self._values[ws] == _DEAD))
            self._hashes[ws] = h[idx[win]]
            self._values[ws] = values[idx[win]]
            lose = np.ones(idx.size, dtype=bool)
            lose[win] = False
            idx, s = idx[lose], (s[lose] + np.uint64(1)) & self._mask

    def delete(self, h: U64) -> None:
        """Remove hashes (absent ones are ignored)."""
        slot, _ = self._find(np.asarray(h, dtype=np.uint64))
        slot = slot[slot >= 0]
        self._values[slot] = _DEAD
        self._dead += slot.size
        self.count -= slot.size

    def set_values(self, h: U64, values: I64) -> None:
        """Change the value of hashes that are present."""
        slot, _ = self._find(np.asarray(h, dtype=np.uint64))
        self._values[slot] = values

    def _rehash(self, need: int) -> None:
        live = self._values >= 0
        h, v = self._hashes[live], self._values[live]
        self._alloc(max(need, 2 * self.count, 1024))
        if h.size:
            self._place(h, v)

    def items(self) -> tuple[U64, I64]:
        live = self._values >= 0
        return self._hashes[live], self._values[live]
