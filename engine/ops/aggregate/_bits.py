"""Whole-batch bit and count structures under the sorted sets of :mod:`._sortedset`.

* :class:`LiveBits` — a bitset with summary levels: next/prev set bit for a batch of
  positions in ``O(log64 N)`` numpy calls (which base entries of an LSM level are live).
* :class:`Fenwick` — a binary indexed tree of non-negative int64 counts: point updates,
  prefix sums and "which position holds the element of rank ``r``" for a batch at a time,
  each in ``O(log N)`` vectorized rounds (order statistics: median, percentile).

Both answer a batch of queries with a fixed number of numpy calls, never a Python loop per
query.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import sorted_unique

__all__ = ["Fenwick", "LiveBits"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
_SIX = np.int64(6)
_63 = np.int64(63)
_2_53 = np.uint64(1 << 53)


# bit tricks -------------------------------------------------------------------------------
def _hsb(x: U64) -> I64:
    """Index of the highest set bit of each (non-zero) word."""
    big = x >= _2_53
    # float64 holds 53 bits exactly; shift bigger words down first so rounding cannot carry
    _, e = np.frexp(np.where(big, x >> np.uint64(11), x).astype(np.float64))
    return e.astype(np.int64) - 1 + np.where(big, 11, 0)


def _ctz(x: U64) -> I64:
    """Index of the lowest set bit of each (non-zero) word."""
    with np.errstate(over="ignore"):
        return _hsb(x & (~x + _ONE))


def _pack(flags: Mask) -> U64:
    padded = np.zeros((flags.size + 63) // 64 * 64, dtype=bool)
    padded[: flags.size] = flags
    return np.packbits(padded, bitorder="little").view("<u8").astype(np.uint64)


class LiveBits:
    """A bitset over ``n`` positions (all set at first) with summary levels, for
    vectorized next/prev-set-bit: level ``k+1`` has a bit per non-zero word of level ``k``,
    and a search climbs only as far as it must."""

    def __init__(self, n: int) -> None:
        levels = [_pack(np.ones(n, dtype=bool))]
        while levels[-1].size > 1:
            levels.append(_pack(levels[-1] != 0))
        self.levels = levels

    def set(self, pos: I64) -> None:
        for words in self.levels:
            if pos.size == 0:
                return
            w = pos >> _SIX
            np.bitwise_or.at(words, w, _ONE << (pos & _63).astype(np.uint64))
            pos = sorted_unique(w)

    def clear(self, pos: I64) -> None:
        for words in self.levels:
            if pos.size == 0:
                return
            w = pos >> _SIX
            np.bitwise_and.at(words, w, ~(_ONE << (pos & _63).astype(np.uint64)))
            uw = sorted_unique(w)
            pos = uw[words[uw] == 0]

    def next_set(self, pos: I64, level: int = 0) -> I64:
        """Smallest set position ``>= pos`` for each query, ``-1`` where there is none."""
        words = self.levels[level]
        out = np.full(pos.size, -1, dtype=np.int64)
        w = pos >> _SIX
        inb = w < words.size
        word = np.zeros(pos.size, dtype=np.uint64)
        word[inb] = words[w[inb]] & (_ALL << (pos[inb] & _63).astype(np.uint64))
        hit = word != 0
        out[hit] = (w[hit] << _SIX) + _ctz(word[hit])
        miss = np.flatnonzero(~hit)
        if miss.size and level + 1 < len(self.levels):
            up = self.next_set(w[miss] + 1, level + 1)
            ok = up >= 0
            out[miss[ok]] = (up[ok] << _SIX) + _ctz(words[up[ok]])
        return out

    def prev_set(self, pos: I64, level: int = 0) -> I64:
        """Largest set position ``<= pos`` for each query, ``-1`` where there is none."""
        words = self.levels[level]
        out = np.full(pos.size, -1, dtype=np.int64)
        w = pos >> _SIX
        inb = (pos >= 0) & (w < words.size)
        word = np.zeros(pos.size, dtype=np.uint64)
        word[inb] = words[w[inb]] & (_ALL >> (_63 - (pos[inb] & _63)).astype(np.uint64))
        hit = word != 0
        out[hit] = (w[hit] << _SIX) + _hsb(word[hit])
        miss = np.flatnonzero(~hit & (pos >= 0))
        if miss.size and level + 1 < len(self.levels):
            up = self.prev_set(w[miss] - 1, level + 1)
            ok = up >= 0
            out[miss[ok]] = (up[ok] << _SIX) + _hsb(words[up[ok]])
        return out


class Fenwick:
    """Counts at positions ``0 .. n-1`` with prefix sums and rank search, batch at a time.

    A binary indexed tree: ``tree[i]`` (1-based) holds the sum of the ``i & -i`` counts
    ending at position ``i - 1``. Counts must stay non-negative for :meth:`search`.

    Examples
    --------
    >>> f = Fenwick(np.array([2, 0, 3, 1]))
    >>> f.prefix(np.array([0, 1, 3, 4])).tolist()
    [0, 2, 5, 6]
    >>> pos, within = f.search(np.array([0, 1, 2, 5]))
    >>> pos.tolist(), within.tolist()
    ([0, 0, 2, 3], [0, 1, 0, 0])
    """

    def __init__(self, counts: I64) -> None:
        """Build from ``counts`` in ``O(n)`` (cumulative sums, no per-position updates)."""
        n = counts.size
        c = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=c[1:])
        i = np.arange(1, n + 1, dtype=np.int64)
        self.tree = np.zeros(n + 1, dtype=np.int64)
        self.tree[1:] = c[1:] - c[i - (i & -i)]
        self.n = n
        self._top = 1 << (n.bit_length() - 1) if n else 0  # highest power of two <= n

    def add(self, pos: I64, delta: I64) -> None:
        """``counts[pos[i]] += delta[i]`` (positions may repeat)."""
        i, d = pos + 1, delta
        while i.size:
            np.add.at(self.tree, i, d)
            i = i + (i & -i)
            keep = i <= self.n
            if not keep.all():
                i, d = i[keep], d[keep]

    def prefix(self, pos: I64) -> I64:
        """``counts[:pos[i]].sum()`` for each query."""
        out = np.zeros(pos.size, dtype=np.int64)
        i = pos.copy()
        while True:
            live = np.flatnonzero(i > 0)
            if live.size == 0:
                return out
            out[live] += self.tree[i[live]]
            i[live] -= i[live] & -i[live]

    def search(self, rank: I64) -> tuple[I64, I64]:
        """Position of the element of rank ``rank`` (0-based, counting multiplicity), and
        its rank among that position's own count.

        Each query must be below the total count. One descent of ``log2 n`` rounds:
        position ``p`` is the largest with ``prefix(p) <= rank``.
        """
        pos = np.zeros(rank.size, dtype=np.int64)
        rem = rank.copy()
        step = self._top
        while step:
            nxt = pos + step
            val = self.tree[np.minimum(nxt, self.n)]
            ok = (nxt <= self.n) & (val <= rem)
            pos[ok] = nxt[ok]
            rem[ok] -= val[ok]
            step >>= 1
        return pos, rem
