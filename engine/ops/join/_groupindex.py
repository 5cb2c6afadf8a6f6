"""Which rows of a group: :class:`GroupIndex`, the members of each group id as sorted
``gid << 32 | slot`` codes, for a join's "which left rows does this right change touch"
(and its pending index, keyed by a key hash's top bits instead of a gid).

A large sorted base plus a small sorted delta, merged with amortized cost; deletion is lazy
(an entry is live while its slot is live and still in that gid), and the owner rebuilds
the index once :attr:`GroupIndex.stale` entries pile up.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import expand, sorted_unique
from engine.rowset import KeyArray

__all__ = ["INDEX_MIN_DELTA", "GroupIndex"]

Mask = npt.NDArray[np.bool_]

_EMPTY = np.empty(0, dtype=np.int64)
_SLOT_BITS = 32
#: merge the delta into the base past max(this, base / 8) (module attribute: tests shrink it)
INDEX_MIN_DELTA = 16384


class GroupIndex:
    """gid -> member slots as sorted ``gid << 32 | slot`` codes: base + sorted delta.

    Inserts are appended unsorted and sorted into the delta at the next :meth:`query` (or
    once they pass the delta's limit), so cycles that only insert (left rows arriving
    while no right row changes) pay one append each. Deletion is lazy: :meth:`query`
    keeps an entry only when ``live[slot]`` and ``gid_of[slot] == gid``; :attr:`stale`
    counts dead entries so the owner can rebuild.
    """

    def __init__(self) -> None:
        self.base = _EMPTY
        self.delta = _EMPTY
        self.stale = 0
        self._fresh: list[KeyArray] = []  # inserted codes not sorted in yet
        self._n_fresh = 0

    def __len__(self) -> int:
        return int(self.base.size + self.delta.size) + self._n_fresh

    def reset(self, gids: KeyArray, slots: KeyArray) -> None:
        self.base = np.sort((gids << _SLOT_BITS) | slots)
        self.delta = _EMPTY
        self.stale = 0
        self._fresh, self._n_fresh = [], 0

    def insert(self, gids: KeyArray, slots: KeyArray) -> None:
        if gids.size == 0:
            return
        self._fresh.append((gids << _SLOT_BITS) | slots)
        self._n_fresh += gids.size
        if self._n_fresh > max(INDEX_MIN_DELTA, self.base.size // 8):
            self._sort_in()

    def _sort_in(self) -> None:
        """Merge the appended codes into the delta, and the delta into the base past its limit."""
        if not self._fresh:
            return
        codes = np.sort(np.concatenate(self._fresh) if len(self._fresh) > 1 else self._fresh[0])
        self._fresh, self._n_fresh = [], 0
        self.delta = _merge_sorted(self.delta, codes)
        if self.delta.size > max(INDEX_MIN_DELTA, self.base.size // 8):
            self.base = _merge_sorted(self.base, self.delta)
            self.delta = _EMPTY

    def query(self, gids: KeyArray, gid_of: KeyArray, live: Mask) -> KeyArray:
        """Live slots in the sorted distinct ``gids``, sorted and distinct."""
        if gids.size == 0:
            return _EMPTY
        self._sort_in()
        parts = []
        for codes in (self.base, self.delta):  # two sorted runs
            if codes.size == 0:
                continue
            lo = np.searchsorted(codes, gids << _SLOT_BITS)
            hi = np.searchsorted(codes, (gids + 1) << _SLOT_BITS)
            pos = expand(lo, hi - lo)
            if pos.size:
                parts.append(codes[pos])
        if not parts:
            return _EMPTY
        codes = np.concatenate(parts) if len(parts) > 1 else parts[0]
        slots = codes & ((1 << _SLOT_BITS) - 1)
        ok = live[slots] & (gid_of[slots] == (codes >> _SLOT_BITS))
        slots = slots[ok]
        if slots.size > live.size // 8:  # dense result: a mark array beats sorting
            mark = np.zeros(live.size, dtype=bool)
            mark[slots] = True
            return np.flatnonzero(mark).astype(np.int64)
        return sorted_unique(slots)


def _merge_sorted(a: KeyArray, b: KeyArray) -> KeyArray:
    """The sorted union (with repeats) of two sorted arrays: a stable sort of the two runs
    side by side merges them (timsort finds the runs), without ``np.insert``'s index work."""
    if a.size == 0:
        return b
    return np.sort(np.concatenate((a, b)), kind="stable")
