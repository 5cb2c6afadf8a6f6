"""Per-group sorted sets: the state behind incremental min, max, median, first and last.

Both structures here hold pairs ``(group, value)`` — ``value`` a ``uint64`` whose unsigned
order is the order wanted — and answer "smallest / largest live value of each of these
groups" for a whole batch of groups at once:

* :class:`ValueMultiset` — values with multiplicities (order-preserving encodings of
  numbers, for min/max); entries are found by vectorized binary search, no hashing. With
  ``ranks=True`` it also answers "the value of rank ``k`` in group ``g``" (median,
  percentile), see below;
* :class:`RowKeySet` — parent row keys, each in one group (for first/last); entries are
  found through a :class:`~engine._kernels.rowkeymap.RowKeyMap` (an array indexed by row
  key while the parent's keys are dense, a hash otherwise), and :meth:`RowKeySet.shift`
  follows parent shifts.

Layout, an LSM tree of two levels, so that every cost follows the change:

* **base** — pairs sorted by ``(group, value)``; group ``g`` owns positions
  ``[gstart[g], gend[g])``. An entry whose count drops to zero stays in place as a
  tombstone and its bit in a hierarchical bitset
  (:class:`~engine.ops.aggregate._bits.LiveBits`) is cleared, so "first live position at
  or after ``gstart[g]``" is one vectorized next-set-bit search of ``O(log64 N)`` numpy
  calls per batch, however many tombstones the group holds (a group of a million rows
  losing its maximum every cycle costs what any group costs).
* **delta** — a sorted array of the pairs created since the last merge, rebuilt in
  ``O(delta)`` in the cycles it changes.

When the delta passes ``max(MERGE_MIN, N/8)`` entries, or tombstones pass the live
entries, delta and base are merged in ``O(N)`` (amortized ``O(1)`` per change, as in any
LSM tree; the merge itself is a pause of tens of milliseconds per million entries).

**Ranks** (``ValueMultiset(ranks=True)``). Base positions never move between merges, so
every delta pair has a fixed *insertion point* in the base (the base position it sorts
before). One :class:`~engine.ops.aggregate._bits.Fenwick` tree over ``2 * len(base) + 1``
slots interleaves the two levels in ``(group, value)`` order: slot ``2p + 1`` counts base
position ``p``, slot ``2p`` counts the delta pairs whose insertion point is ``p``. A count
change is one tree update (``O(log N)``); the value of rank ``k`` in group ``g`` is one
prefix sum (the values of the groups before ``g``), one descent of the tree to the slot
holding global rank ``before + k`` and, when that slot is a gap, one binary search among
the delta pairs inserted there. No group is ever scanned, so removing a group's median
costs what any change costs: ``O(changes * log N)`` numpy work per cycle.

Row keys shift (the parent moves surviving rows without reordering them), so in a
:class:`RowKeySet` live entries stay sorted when their keys are rewritten in place;
tombstones keep stale keys, but they are never searched (skipped by the bitset, dropped
at merge), so their order does not matter.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import expand_with_owner, key_order
from engine._kernels.ids import IdAllocator
from engine._kernels.rowkeymap import RowKeyMap
from engine.errors import UpdateInvariantError
from engine.ops.aggregate._bits import Fenwick, LiveBits

__all__ = ["RowKeySet", "ValueMultiset", "lex_order"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
T = TypeVar("T", bound=np.generic)

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_U = np.empty(0, dtype=np.uint64)
_IN_DELTA = -2  # RowKeySet's position of an entry in the delta (found by a search)
_TAIL = -3  # RowKeySet's position of tail entry t: _TAIL - t


#: :func:`lex_order` tries one sort of a packed key from this many pairs on
PACK_MIN = 64


def lex_order(g: I64, v: U64) -> I64:
    """Stable permutation sorting pairs by ``(g, v)`` (``g`` non-negative).

    When the groups' bits and the values' span fit in 62 bits (small slots, values close
    together: counts, prices, times), one sort of ``g << bits | (v - min(v))`` (a radix
    sort from :data:`~engine._kernels.arrays.RADIX_MIN` on); else two stable argsorts,
    which beat ``lexsort`` on small batches."""
    if g.size >= PACK_MIN:
        low = v.min()
        bits = int(v.max() - low).bit_length()
        if bits + int(g.max()).bit_length() <= 62:
            return key_order((g << bits) | (v - low).view(np.int64))
    o = np.argsort(v, kind="stable")
    return o[np.argsort(g[o], kind="stable")]


def _grow(arr: npt.NDArray[T], cap: int, fill: int = 0) -> npt.NDArray[T]:
    if cap <= arr.size:
        return arr
    out = np.full(max(cap, 2 * arr.size), fill, dtype=arr.dtype)
    out[: arr.size] = arr
    return out


def _segment_search(vals: U64, lo: I64, hi: I64, q: U64) -> I64:
    """First position in ``[lo, hi)`` with ``vals >= q`` (``vals`` sorted in each segment).

    One vectorized bisection round per bit of the widest segment (a loop over bits, not
    over queries).
    """
    lo, hi = lo.copy(), hi.copy()
    if lo.size == 0 or vals.size == 0:
        return lo
    last = vals.size - 1
    for _ in range(int((hi - lo).max()).bit_length()):
        active = lo < hi
        mid = (lo + hi) >> 1
        lt = vals[np.minimum(mid, last)] < q
        lo = np.where(active & lt, mid + 1, lo)
        hi = np.where(active & ~lt, mid, hi)
    return lo


def _find(vals: U64, lo: I64, hi: I64, q: U64) -> tuple[I64, Mask]:
    """``(position, found)`` of each ``q`` in its segment ``[lo, hi)`` of sorted ``vals``
    (the position is where ``q`` would be inserted when absent)."""
    pos = _segment_search(vals, lo, hi, q)
    found = pos < hi
    found[found] = vals[pos[found]] == q[found]
    return pos, found


def _expand(lo: I64, hi: I64) -> tuple[I64, I64]:
    """All positions of the ranges ``[lo[i], hi[i])``, with the ``i`` each belongs to."""
    pos, owner = expand_with_owner(lo, np.maximum(hi - lo, 0))
    return owner, pos


class _Merger:
    """Interleaves sorted base columns with delta values going in at positions ``at``
    (non-decreasing): the base's positions found once, then two scatters per column
    (``np.insert`` sorts; a scatter by positions is about half a masked assignment)."""

    def __init__(self, at: I64) -> None:
        self._dpos = at + np.arange(at.size, dtype=np.int64)
        self._bpos: npt.NDArray[np.intp] | None = None

    def __call__(self, base: npt.NDArray[T], delta: npt.NDArray[Any]) -> npt.NDArray[T]:
        n = base.size + delta.size
        if self._bpos is None:
            mask = np.ones(n, dtype=bool)
            mask[self._dpos] = False
            self._bpos = np.flatnonzero(mask)
        out = np.empty(n, dtype=base.dtype)
        out[self._dpos] = delta
        out[self._bpos] = base
        return out


class _Sorted:
    """The base + delta layout and the min/max queries shared by both structures.

    Searches by ``(group, value)`` go through a *coarse key*, one sortable ``uint64``:
    the group in the high 32 bits and the value, shifted down so that the range seen at
    the last merge takes at most half of 32 bits (the rest is room above it) and clipped,
    in the low ones. It is monotone in ``(group,
    value)``, so ``np.searchsorted`` on it narrows each query to the few entries sharing
    its coarse key, and a short bisection on the full value finishes.
    """

    #: the delta is merged once it holds more than ``max(MERGE_MIN, N/8)`` entries
    MERGE_MIN = 4096

    def __init__(self) -> None:
        self._b_v: U64 = _EMPTY_U  # base values, sorted within each group's segment
        self._b_k: U64 = _EMPTY_U  # base coarse keys (non-decreasing)
        self._gstart: I64 = _EMPTY_I
        self._gend: I64 = _EMPTY_I
        self._bits = LiveBits(0)
        self._dead = 0
        self._d_g: I64 = _EMPTY_I  # delta, sorted by (group, value)
        self._d_v: U64 = _EMPTY_U
        self._d_k: U64 = _EMPTY_U
        self._vmin, self._vmax, self._vshift = np.uint64(0), _ALL, np.uint64(32)

    def __len__(self) -> int:
        """Number of live entries."""
        return int(self._b_v.size - self._dead + self._d_g.size)

    def _fit_coarse(self, lo: int, hi: int, bits: int, below: bool) -> None:
        """Choose the coarse transform for values in ``[lo, hi]``: they take at most
        ``bits`` of the 32 bits, the rest is room above them (and, ``below``, a quarter of
        it below ``lo``). Only while no coarse key is stored: a merge, or an empty set."""
        shift = max(0, (hi - lo).bit_length() - bits)
        room = 1 << (32 + shift)
        vmin = max(0, lo - room // 4) if below else lo
        self._vmin, self._vmax = np.uint64(vmin), np.uint64(min(2**64 - 1, vmin + room - 1))
        self._vshift = np.uint64(shift)

    def _fit_empty(self, v: U64) -> None:
        """A first insert into an empty set fits the transform to its values, with room
        around them until the first merge fits it again (values of any order of magnitude,
        and row keys growing as a parent appends, keep coarse keys of their own)."""
        if self._b_v.size == 0 and self._d_v.size == 0 and v.size:
            self._fit_coarse(int(v.min()), int(v.max()), bits=24, below=True)

    def _coarse(self, g: I64, v: U64) -> U64:
        low = (np.minimum(np.maximum(v, self._vmin), self._vmax) - self._vmin) >> self._vshift  # not np.clip: its wrappers cost more
        return (g.astype(np.uint64) << np.uint64(32)) | low

    @staticmethod
    def _locate(keys: U64, vals: U64, qk: U64, qv: U64) -> tuple[I64, Mask]:
        """``(position, found)`` of each query among sorted ``(keys, vals)``; the position
        is the insertion point when absent.

        One ``searchsorted`` settles a query whose coarse key is absent or whose first
        entry is the match (the usual case); only the rest pay for a second search and a
        bisection of their tie range."""
        pos = np.searchsorted(keys, qk, "left")
        if keys.size == 0:
            return pos, np.zeros(qk.size, dtype=bool)
        at = np.minimum(pos, keys.size - 1)
        tie = (pos < keys.size) & (keys[at] == qk)
        found = tie & (vals[at] == qv)
        more = np.flatnonzero(tie & ~found)
        if more.size:
            hi = np.searchsorted(keys, qk[more], "right")
            pos[more], found[more] = _find(vals, pos[more], hi, qv[more])
        return pos, found

    def _segments(self, g: I64) -> tuple[I64, I64]:
        """Base segment ``[lo, hi)`` of each group (empty for groups newer than the base)."""
        ok = g < self._gstart.size
        lo = np.zeros(g.size, dtype=np.int64)
        hi = np.zeros(g.size, dtype=np.int64)
        lo[ok], hi[ok] = self._gstart[g[ok]], self._gend[g[ok]]
        return lo, hi

    def _delta_insert(self, g: I64, v: U64, k: U64, at: I64 | None, *extra: tuple[I64, I64]) -> list[I64]:
        """Insert pairs sorted by ``(g, v)`` (absent from the delta, coarse keys ``k``) into
        the delta at positions ``at`` (found here when None); each ``(column, values)`` of
        ``extra`` is inserted alongside. Returns the new extra columns."""
        if at is None:
            at = self._locate(self._d_k, self._d_v, k, v)[0]
        merge = _Merger(at)
        self._d_g, self._d_v, self._d_k = merge(self._d_g, g), merge(self._d_v, v), merge(self._d_k, k)
        return [merge(col, vals) for col, vals in extra]

    def _delta_keep(self, keep: Mask) -> None:
        self._d_g, self._d_v, self._d_k = self._d_g[keep], self._d_v[keep], self._d_k[keep]

    def _should_merge(self) -> bool:
        live = self._b_v.size - self._dead
        return self._d_g.size > max(self.MERGE_MIN, live // 8) or self._dead > max(self.MERGE_MIN, live)

    def _merge_base(self, alive: Mask) -> _Merger:
        """Replace the base by its ``alive`` entries plus the delta; clears the delta.

        Returns the :class:`_Merger` that interleaves the subclass's own columns the same
        way."""
        b_g = np.repeat(np.arange(self._gstart.size, dtype=np.int64), self._gend - self._gstart)
        b_v = self._b_v
        if not alive.all():
            b_g, b_v = b_g[alive], b_v[alive]
        d_g, d_v = self._d_g, self._d_v
        if b_v.size or d_v.size:  # a fresh coarse transform over the current values
            lo = min(int(b_v.min()) if b_v.size else 2**64 - 1, int(d_v.min()) if d_v.size else 2**64 - 1)
            hi = max(int(b_v.max()) if b_v.size else 0, int(d_v.max()) if d_v.size else 0)
            # the current values take at most a quarter of the 32 bits: values up to three
            # ranges past the largest (new row keys of an appending parent, above every
            # merged one) keep coarse keys of their own instead of all tying at the top
            self._fit_coarse(lo, hi, bits=30, below=False)
        b_k, d_k = self._coarse(b_g, b_v), self._coarse(d_g, d_v)
        merger = _Merger(self._locate(b_k, b_v, d_k, d_v)[0])
        ngroups = max(self._gstart.size, int(d_g[-1]) + 1 if d_g.size else 0)
        counts = np.bincount(b_g, minlength=ngroups) + np.bincount(d_g, minlength=ngroups)
        self._gend = np.cumsum(counts)
        self._gstart = self._gend - counts
        self._b_v, self._b_k = merger(b_v, d_v), merger(b_k, d_k)
        self._bits = LiveBits(self._b_v.size)
        self._dead = 0
        self._d_g, self._d_v, self._d_k = _EMPTY_I, _EMPTY_U, _EMPTY_U
        return merger

    def _extreme(self, groups: I64, largest: bool, where: I64 | None = None) -> tuple[U64, Mask]:
        """Each group's smallest (``largest``: largest) live value, and whether it has one;
        with ``where``, also writes there the value's base position, or ``-2 - `` its delta
        position."""
        val = np.zeros(groups.size, dtype=np.uint64)
        found = np.zeros(groups.size, dtype=bool)
        if self._b_v.size:
            lo, hi = self._segments(groups)
            sel = np.flatnonzero(lo < hi)
            lo, hi = lo[sel], hi[sel]
            if largest:
                p = self._bits.prev_set(hi - 1)
                ok = (p >= 0) & (p >= lo)
            else:
                p = self._bits.next_set(lo)
                ok = (p >= 0) & (p < hi)
            val[sel[ok]] = self._b_v[p[ok]]
            found[sel[ok]] = True
            if where is not None:
                where[sel[ok]] = p[ok]
        if self._d_g.size:
            lo = np.searchsorted(self._d_g, groups, "left")
            hi = np.searchsorted(self._d_g, groups, "right")
            has = np.flatnonzero(lo < hi)
            dp = (hi - 1 if largest else lo)[has]
            dv = self._d_v[dp]
            cur, had = val[has], found[has]
            better = ~had | ((dv > cur) if largest else (dv < cur))
            val[has] = np.where(better, dv, cur)
            found[has] = True
            if where is not None:
                where[has[better]] = -2 - dp[better]
        return val, found

    def min_of(self, groups: I64) -> tuple[U64, Mask]:
        """Smallest live value of each group, and whether the group holds any."""
        return self._extreme(groups, largest=False)

    def max_of(self, groups: I64) -> tuple[U64, Mask]:
        """Largest live value of each group, and whether the group holds any."""
        return self._extreme(groups, largest=True)


class ValueMultiset(_Sorted):
    """Values with multiplicities per group; min and max per group, vectorized.

    With ``ranks`` it also keeps per-group counts and the Fenwick tree of the module
    docstring, for :meth:`count_of` and :meth:`kth` (order statistics). With ``ids`` each
    live pair also carries the caller's ``int64`` id (given with every :meth:`update` of
    it, the same while the pair is live): :meth:`ids_of` finds the ids of pairs and
    :meth:`extreme_ids` those of each group's smallest or largest pair (OrderedRows' trie
    nodes: the multisets are their only index).
    """

    def __init__(self, ranks: bool = False, ids: bool = False) -> None:
        super().__init__()
        self._b_c: I64 = _EMPTY_I  # count per base position (0: tombstone)
        self._d_c: I64 = _EMPTY_I
        self.ids = ids
        self._b_i: I64 = _EMPTY_I  # id per base position (stale on a tombstone), with ``ids``
        self._d_i: I64 = _EMPTY_I
        self.ranks = ranks
        self._d_at: I64 = _EMPTY_I  # insertion point of each delta pair in the base (ranks only)
        self._fen = Fenwick(np.zeros(1, dtype=np.int64))  # 2 * len(base) + 1 slots
        self._n = np.zeros(16, dtype=np.int64)  # live values per group (ranks only)
        self._dcum: I64 | None = None  # 0, then cumulative delta counts (cached per cycle)

    def update(self, g: I64, v: U64, d: I64, ids: I64 | None = None) -> None:
        """Add ``d[i]`` (may be negative) to the count of ``(g[i], v[i])``; with ``ids``
        (needed when the multiset keeps them), ``ids[i]`` is that pair's id.

        Raises
        ------
        UpdateInvariantError
            If a count would go negative (a value removed that the group does not hold).
        """
        if g.size == 0:
            return
        assert (ids is not None) == self.ids
        o = lex_order(g, v)
        g, v, d = g[o], v[o], d[o]
        first = np.flatnonzero(np.concatenate(([True], (g[1:] != g[:-1]) | (v[1:] != v[:-1]))))
        g, v, net = g[first], v[first], np.add.reduceat(d, first)
        nz = net != 0
        g, v, net = g[nz], v[nz], net[nz]
        i = ids[o][first][nz] if ids is not None else _EMPTY_I
        if self.ranks and g.size:
            self._n = _grow(self._n, int(g[-1]) + 1)
            np.add.at(self._n, g, net)
            self._dcum = None
        self._fit_empty(v)
        k = self._coarse(g, v)
        at = np.zeros(g.size, dtype=np.int64) if self.ranks else _EMPTY_I  # insertion points in the base
        if self._b_v.size:  # base: counts change in place, the bitset follows
            pos, hit = self._locate(self._b_k, self._b_v, k, v)
            bp = pos[hit]
            c0 = self._b_c[bp]
            c1 = c0 + net[hit]
            if (c1 < 0).any():
                raise UpdateInvariantError("A1", "a value was removed from a group that does not hold it")
            self._b_c[bp] = c1
            if self.ids:  # a tombstone coming back may have a new id
                self._b_i[bp] = i[hit]
            if self.ranks:
                self._fen.add(2 * bp + 1, net[hit])
            died, born = bp[(c0 > 0) & (c1 == 0)], bp[(c0 == 0) & (c1 > 0)]
            self._bits.clear(died)
            self._bits.set(born)
            self._dead += died.size - born.size
            rest = ~hit
            g, v, k, net = g[rest], v[rest], k[rest], net[rest]
            if self.ranks:
                at = pos[rest]
            if self.ids:
                i = i[rest]
        if g.size:  # delta: counts in place, new pairs inserted, zero counts dropped
            pos, hit = self._locate(self._d_k, self._d_v, k, v)
            self._d_c[pos[hit]] += net[hit]
            new = ~hit
            if (net[new] < 0).any() or (self._d_c[pos[hit]] < 0).any():
                raise UpdateInvariantError("A1", "a value was removed from a group that does not hold it")
            if self.ranks:
                self._fen.add(2 * at, net)
            if new.any():  # the delta's side columns: counts, insertion points (ranks), ids
                side = [(self._d_c, net[new])]
                if self.ranks:
                    side.append((self._d_at, at[new]))
                if self.ids:
                    side.append((self._d_i, i[new]))
                cols = iter(self._delta_insert(g[new], v[new], k[new], pos[new], *side))
                self._d_c = next(cols)
                if self.ranks:
                    self._d_at = next(cols)
                if self.ids:
                    self._d_i = next(cols)
            keep = self._d_c != 0
            if not keep.all():
                self._delta_keep(keep)
                self._d_c = self._d_c[keep]
                if self.ranks:
                    self._d_at = self._d_at[keep]
                if self.ids:
                    self._d_i = self._d_i[keep]
        if self._should_merge():
            self._merge()

    def ids_of(self, g: I64, v: U64) -> I64:
        """The id of each pair ``(g[i], v[i])`` held (count above zero), ``-1`` for the
        others. Needs ``ids``."""
        assert self.ids
        out = np.full(g.size, -1, dtype=np.int64)
        if g.size == 0 or len(self) == 0:
            return out
        k = self._coarse(g, v)
        if self._b_v.size:  # a tombstone is not held: its id is stale
            pos, hit = self._locate(self._b_k, self._b_v, k, v)
            at = np.flatnonzero(hit)
            at = at[self._b_c[pos[at]] > 0]
            out[at] = self._b_i[pos[at]]
        if self._d_v.size:  # the delta holds no zero counts
            pos, hit = self._locate(self._d_k, self._d_v, k, v)
            out[hit] = self._d_i[pos[hit]]
        return out

    def extreme_ids(self, groups: I64, largest: bool) -> tuple[I64, Mask]:
        """The id of each group's smallest (``largest``: largest) live value, and whether
        the group holds one (else the id is garbage). Needs ``ids``."""
        assert self.ids
        where = np.zeros(groups.size, dtype=np.int64)
        _, found = self._extreme(groups, largest, where)
        out = np.zeros(groups.size, dtype=np.int64)
        b = found & (where >= 0)
        out[b] = self._b_i[where[b]]
        d = found & (where < 0)
        out[d] = self._d_i[-2 - where[d]]
        return out, found

    def entries(self, groups: I64) -> tuple[I64, U64, I64]:
        """Every live ``(value, count)`` of ``groups``: ``(index into groups, value, count)``.

        Costs the size of those groups (it is how a group is recomputed from scratch)."""
        owner, pos = _expand(*self._segments(groups))
        c = self._b_c[pos]
        keep = c > 0
        d_owner, d_pos = _expand(np.searchsorted(self._d_g, groups, "left"),
                                 np.searchsorted(self._d_g, groups, "right"))
        return (np.concatenate((owner[keep], d_owner)), np.concatenate((self._b_v[pos[keep]], self._d_v[d_pos])),
                np.concatenate((c[keep], self._d_c[d_pos])))

    def count_of(self, groups: I64) -> I64:
        """Number of live values (with multiplicity) of each group (needs ``ranks``)."""
        assert self.ranks
        out = np.zeros(groups.size, dtype=np.int64)
        ok = groups < self._n.size
        out[ok] = self._n[groups[ok]]
        return out

    def kth(self, groups: I64, k: I64) -> U64:
        """The value of rank ``k[i]`` (0-based, counting multiplicity) in ``groups[i]``.

        Needs ``ranks``; every ``k[i]`` must be below :meth:`count_of` the group. Cost:
        ``O(log N)`` numpy rounds over the batch (see the module docstring).
        """
        assert self.ranks
        if groups.size == 0:
            return _EMPTY_U
        nb = self._b_v.size
        start = np.full(groups.size, nb, dtype=np.int64)  # groups newer than the base: at its end
        old = groups < self._gstart.size
        start[old] = self._gstart[groups[old]]
        before = self._fen.prefix(2 * start)  # base positions and gaps before the segment
        dcum = self._delta_cum()
        if self._d_g.size:  # ... plus earlier groups' delta pairs sharing the segment's gap
            r0 = np.searchsorted(self._d_at, start, "left")
            e = np.searchsorted(self._d_g, groups, "left")
            before += dcum[np.maximum(e, r0)] - dcum[r0]
        slot, within = self._fen.search(before + k)
        out = np.empty(groups.size, dtype=np.uint64)
        base = (slot & 1) == 1
        out[base] = self._b_v[slot[base] >> 1]
        gap = np.flatnonzero(~base)
        if gap.size:  # the pair of rank `within` among the delta pairs inserted at this gap
            r0 = np.searchsorted(self._d_at, slot[gap] >> 1, "left")
            j = np.searchsorted(dcum, dcum[r0] + within[gap], "right") - 1
            out[gap] = self._d_v[j]
        return out

    def _delta_cum(self) -> I64:
        if self._dcum is None:
            self._dcum = np.zeros(self._d_c.size + 1, dtype=np.int64)
            np.cumsum(self._d_c, out=self._dcum[1:])
        return self._dcum

    def _merge(self) -> None:
        """Fold the delta into the base and drop tombstones (O(N), amortized over changes)."""
        alive = self._b_c > 0
        b_c, d_c = self._b_c[alive], self._d_c
        merger = self._merge_base(alive)
        self._b_c = merger(b_c, d_c)
        if self.ids:
            self._b_i = merger(self._b_i[alive], self._d_i)
        self._d_c, self._d_at, self._d_i, self._dcum = _EMPTY_I, _EMPTY_I, _EMPTY_I, None
        if self.ranks:
            slots = np.zeros(2 * self._b_c.size + 1, dtype=np.int64)
            slots[1::2] = self._b_c
            self._fen = Fenwick(slots)


class RowKeySet(_Sorted):
    """Parent row keys per group, following parent shifts; first and last row per group.

    Above the base and the delta, new entries go to a *tail* in arrival order, unsorted:
    an insert appends (no search, no copy of the delta), a remove clears the entry's live
    flag, a shift rewrites its key in place (entries keep their tail positions). A query
    for at most :attr:`SCAN_GROUPS` groups scans the tail for them while it holds at most
    :attr:`SCAN_MAX` entries; any other query sorts the tail into the delta first (a query
    every cycle, as first/last make, then pays what inserting into the delta cost), and so
    does a merge. So a parent's changes cost their own size until someone asks for many
    groups' first or last rows (the aggregation's first-row cache asks for few, rarely),
    not the delta's.

    Until the first remove or shift the set is *flat*: the map holds each row key's group
    and each group's smallest and largest row key are kept by group (a minimum and a
    maximum per insert, a ``take`` per query), with no entries, tail or merges at all. A
    parent whose rows only arrive and change values (a count over appended rows, a merge
    of views of one) keeps it flat for good; the first remove or shift builds the entries
    from the map (``O(n)``, once) and the set goes on as above.

    With ``flat_removes`` a remove keeps the set flat too: it only unmaps the keys, and
    each group's smallest and largest row keys become *bounds* (no live key of the group
    lies outside them). A query checks a bound in the map (one ``take``: the group still
    holds that key) and only where it does not, *scans* the map's dense window from the
    bound inwards for the group's first live key (slices of twice the mean gap between a
    group's rows, doubling), which tightens the bound. So a row leaving costs
    an unmap, and a lost first row the gap to the group's next one: a group of ``m`` rows
    spread over ``n`` keys, ``n / m`` keys on average (W1's 500 rows a group over a
    million keys: ~2,000 keys, a few microseconds). Scans are paid for by changes: each
    insert or remove credits :attr:`SCAN_CREDIT` keys of scanning (the balance capped at
    four keys per row plus :attr:`SCAN_SLACK`, about what rebuilding the entries costs),
    and a query that would overdraw the balance, or finds the map no longer dense (a
    hashed map cannot be scanned), builds the entries and goes on as above; so does a
    shift. The scans' cost is thus amortized ``O(1)`` keys per change, as the merges'
    is, and a parent whose rows leave groups at random keeps no sorted entries at all.
    """

    #: a query for at most this many groups may scan the tail ...
    SCAN_GROUPS = 8
    #: ... while it holds at most this many entries
    SCAN_MAX = 16384
    #: ``flat_removes``: a scan looks at twice the mean gap between a group's rows first, at
    #: least this many keys per group, then twice as many each round (a slice is charged
    #: its length, at least this many: its fixed cost)
    SCAN_WIDTH = 1024
    #: ... where the first slice is this many mean gaps between a group's rows (tests set 0)
    SCAN_GAPS = 2
    #: ... and each insert or remove of a key pays for this many keys of scanning
    SCAN_CREDIT = 32
    #: ... on top of a first balance of this many (the balance's cap: 4 per row plus this)
    SCAN_SLACK = 1 << 16

    def __init__(self, flat_removes: bool = False) -> None:
        super().__init__()
        self.flat_removes = flat_removes
        self._map = RowKeyMap()  # row key -> entry id (dense while the parent's keys are)
        self._eg = np.zeros(1024, dtype=np.int64)  # entry -> group
        # entry -> base position, or _IN_DELTA, or _TAIL - its tail position
        self._epos = np.full(1024, -1, dtype=np.int64)
        self._entry_ids = IdAllocator()  # entry ids; freed ones are reusable at once
        self._b_ids: I64 = _EMPTY_I
        self._d_ids: I64 = _EMPTY_I
        self._t_g = np.zeros(1024, dtype=np.int64)  # tail: group, row key, entry id, live
        self._t_k = np.zeros(1024, dtype=np.int64)
        self._t_ids = np.zeros(1024, dtype=np.int64)
        self._t_live = np.zeros(1024, dtype=bool)
        self._t_n = 0  # tail entries, live or not
        self._t_dead = 0
        # flat (see the class docstring): the map holds groups, not entry ids; each
        # group's smallest and largest row key (none: the int64 maximum and -1)
        self._flat = True
        self._f_lo = np.full(16, np.iinfo(np.int64).max, dtype=np.int64)
        self._f_hi = np.full(16, -1, dtype=np.int64)
        self._loose = False  # flat, after a remove: f_lo and f_hi are bounds (see the class docstring)
        self._budget = self.SCAN_SLACK  # keys the flat layout's scans may still look at

    def __len__(self) -> int:
        if self._flat:
            return self._map.count
        return super().__len__() + self._t_n - self._t_dead

    def _flat_grow(self, cap: int) -> None:
        if cap > self._f_lo.size:
            cap = max(cap, 2 * self._f_lo.size)
            self._f_lo = _grow(self._f_lo, cap, np.iinfo(np.int64).max)
            self._f_hi = _grow(self._f_hi, cap, -1)

    def _unflatten(self) -> None:
        """Leave the flat layout: every row becomes an entry of the tail (the next query
        or merge sorts them in), mapped by entry id."""
        self._flat = False
        keys, g = self._map.items()
        self._f_lo = self._f_hi = _EMPTY_I
        if keys.size == 0:
            return
        ids = self._alloc(keys.size)
        self._eg[ids] = g
        self._map.set_values(keys, ids)
        self._append_tail(g, keys, ids)

    def _should_merge(self) -> bool:
        live = self._b_v.size - self._dead
        return (self._d_g.size + self._t_n > max(self.MERGE_MIN, live // 8)
                or self._dead > max(self.MERGE_MIN, live))

    def _alloc(self, n: int) -> I64:
        ids = self._entry_ids.allocate(n)
        self._eg = _grow(self._eg, self._entry_ids.end)
        self._epos = _grow(self._epos, self._entry_ids.end, -1)
        return ids

    def _ids(self, keys: I64, what: str) -> I64:
        ids = self._map.lookup(keys)
        if (ids < 0).any():
            raise UpdateInvariantError("A1", f"{what} row keys {keys[ids < 0][:10].tolist()} are in no group")
        return ids

    def _delta_positions(self, ids: I64, keys: I64) -> I64:
        """The delta positions of entries ``ids`` (in the delta, holding row ``keys``): one
        search of the delta, whose positions move with every insert (so they are not kept
        per entry: rewriting them cost the delta's size every cycle)."""
        v = keys.view(np.uint64)
        return self._locate(self._d_k, self._d_v, self._coarse(self._eg[ids], v), v)[0]

    def groups_of(self, keys: I64) -> I64:
        """The group of each row key (``-1`` where absent)."""
        if self._flat:
            return self._map.lookup(keys)
        ids = self._map.lookup(keys)
        return np.where(ids >= 0, self._eg[np.maximum(ids, 0)], -1)

    def insert_keys(self, g: I64, keys: I64) -> None:
        """Add row ``keys`` (absent, distinct) to groups ``g`` (appended to the tail)."""
        if keys.size == 0:
            return
        if self._flat:
            self._map.insert(keys, g)
            self._flat_grow(int(g.max()) + 1)
            np.minimum.at(self._f_lo, g, keys)
            np.maximum.at(self._f_hi, g, keys)
            if self._loose:
                self._credit(keys.size)
            return
        ids = self._alloc(keys.size)
        self._eg[ids] = g
        self._map.insert(keys, ids)
        self._append_tail(g, keys, ids)

    def _append_tail(self, g: I64, keys: I64, ids: I64) -> None:
        """Append entries ``ids`` (row ``keys`` in groups ``g``, mapped) to the tail."""
        start, end = self._t_n, self._t_n + keys.size
        if end > self._t_g.size:
            self._t_g, self._t_k = _grow(self._t_g, end), _grow(self._t_k, end)
            self._t_ids, self._t_live = _grow(self._t_ids, end), _grow(self._t_live, end)
        self._t_g[start:end], self._t_k[start:end], self._t_ids[start:end] = g, keys, ids
        self._t_live[start:end] = True
        self._epos[ids] = _TAIL - np.arange(start, end, dtype=np.int64)
        self._t_n = end
        if self._should_merge():
            self._merge()

    def _compact_tail(self) -> None:
        """Drop the tail's dead entries (those removed outnumber the live ones: queries
        would scan them, and a parent that keeps replacing rows would grow it forever)."""
        n = self._t_n
        keep = np.flatnonzero(self._t_live[:n])
        m = keep.size
        for col in (self._t_g, self._t_k, self._t_ids):
            col[:m] = col[keep]
        self._t_live[:m] = True
        self._t_live[m:n] = False
        self._t_n, self._t_dead = m, 0
        self._epos[self._t_ids[:m]] = _TAIL - np.arange(m, dtype=np.int64)

    def _flush(self) -> None:
        """Sort the tail's live entries into the delta; the tail is empty after."""
        n = self._t_n
        if n == 0:
            return
        live = self._t_live[:n]
        g, keys, ids = self._t_g[:n][live], self._t_k[:n][live], self._t_ids[:n][live]
        self._t_n = self._t_dead = 0
        if keys.size == 0:
            return
        v = keys.view(np.uint64)
        self._fit_empty(v)
        o = key_order(keys)  # by (group, row key): radix passes over small non-negative ints
        o = o[key_order(g[o])]
        g, v = g[o], v[o]
        (self._d_ids,) = self._delta_insert(g, v, self._coarse(g, v), None, (self._d_ids, ids[o]))
        self._epos[ids] = _IN_DELTA

    def _credit(self, n: int) -> None:
        """``n`` keys inserted or removed while flat and loose pay for later scans."""
        self._budget = min(self._budget + self.SCAN_CREDIT * n, 4 * self._map.count + self.SCAN_SLACK)

    def _flat_remove(self, keys: I64) -> I64:
        """Unmap row ``keys`` (distinct) of the flat layout, which stays flat: each
        group's smallest and largest keys become bounds. Returns the groups (``-1``: absent)."""
        groups = self._map.remove(keys)
        self._loose = True
        self._credit(keys.size)
        return groups

    def _flat_extreme(self, groups: I64, largest: bool) -> tuple[U64, Mask] | None:
        """:meth:`_extreme` in the flat layout; None where a scan it needs is not possible
        or not paid for (the caller builds the entries and asks them)."""
        if groups.size:
            self._flat_grow(int(groups.max()) + 1)
        ends = (self._f_hi if largest else self._f_lo)[groups]
        held: Mask = self._f_hi[groups] >= 0
        if self._loose and groups.size:  # bounds: is each still its group's key?
            at = np.flatnonzero(held)
            stale = at[self._map.lookup(ends[at]) != groups[at]]
            if stale.size:
                g = groups[stale]
                if not self._scan(np.unique(g) if g.size > 1 else g, largest):
                    return None
                ends = (self._f_hi if largest else self._f_lo)[groups]
                held = self._f_hi[groups] >= 0
        return np.where(held, ends, 0).view(np.uint64), held

    def _scan(self, g: I64, largest: bool) -> bool:
        """Tighten the bound of each group of ``g`` (distinct, each with a bound its map
        entry no longer confirms) to the group's first (``largest``: last) live key, or
        mark the group empty, by scanning the dense window from the bound inwards: slices
        of twice the mean gap between a group's rows (window keys * groups / rows), at
        least :attr:`SCAN_WIDTH` keys, doubling (a scan mostly ends in one), each charged
        its length, at least :attr:`SCAN_WIDTH` (its fixed cost). False, with
        some groups maybe tightened (their bounds stay bounds), where the map is not dense
        or a slice would overdraw the balance."""
        win = self._map.window()
        if win is None:
            return False
        base, vals = win
        groups = int(np.count_nonzero(self._f_hi >= 0))
        first = max(self.SCAN_WIDTH, self.SCAN_GAPS * vals.size * groups // max(1, self._map.count))
        # window positions [lo, hi]: every live key lies in the window
        los = np.maximum(self._f_lo[g] - base, 0).tolist()
        his = np.minimum(self._f_hi[g] - base, vals.size - 1).tolist()
        for grp, lo, hi in zip(g.tolist(), los, his, strict=True):
            width, key = first, -1
            while lo <= hi:
                a, b = (max(lo, hi - width + 1), hi + 1) if largest else (lo, min(hi + 1, lo + width))
                cost = max(self.SCAN_WIDTH, b - a)
                if cost > self._budget:
                    return False
                self._budget -= cost
                m = vals[a:b] == grp
                at = b - a - 1 - int(m[::-1].argmax()) if largest else int(m.argmax())
                if m[at]:
                    key = base + a + at
                    break
                if largest:
                    hi = a - 1
                else:
                    lo = b
                width *= 2
            if key < 0:  # no live key left: the group is empty
                self._f_lo[grp], self._f_hi[grp] = np.iinfo(np.int64).max, -1
            elif largest:
                self._f_hi[grp] = key
            else:
                self._f_lo[grp] = key
        return True

    def _extreme(self, groups: I64, largest: bool, where: I64 | None = None) -> tuple[U64, Mask]:
        assert where is None, "a RowKeySet answers values only"
        if self._flat:
            flat = self._flat_extreme(groups, largest)
            if flat is not None:
                return flat
            self._unflatten()
        if self._t_n and (groups.size > self.SCAN_GROUPS or self._t_n > self.SCAN_MAX):
            self._flush()
        val, found = super()._extreme(groups, largest)
        n = self._t_n
        if n == self._t_dead or groups.size == 0:
            return val, found
        # the tail's entries of the groups asked about: each group's best among them
        tg = self._t_g[:n]
        sel = np.flatnonzero(np.isin(tg, groups) & self._t_live[:n])  # a pass per group
        if sel.size == 0:
            return val, found
        ug = np.unique(groups)
        at = np.searchsorted(ug, tg[sel])
        best = np.full(ug.size, -1 if largest else np.iinfo(np.int64).max, dtype=np.int64)
        (np.maximum if largest else np.minimum).at(best, at, self._t_k[:n][sel])
        has = np.zeros(ug.size, dtype=bool)
        has[at] = True
        q = np.searchsorted(ug, groups)
        tb, th = best[q].view(np.uint64), has[q]
        better = th & (~found | ((tb > val) if largest else (tb < val)))
        val[better] = tb[better]
        found |= th
        return val, found

    def remove_keys(self, keys: I64) -> None:
        """Remove row ``keys`` (present, distinct)."""
        if keys.size == 0:
            return
        if self._flat and self.flat_removes:
            absent = self._flat_remove(keys) < 0
            if absent.any():
                raise UpdateInvariantError("A1", f"removed row keys {keys[absent][:10].tolist()} are in no group")
            return
        if self._flat:
            self._unflatten()
        ids = self._ids(keys, "removed")
        self._map.remove(keys)
        self._drop(ids, keys)

    def discard_keys(self, keys: I64) -> I64:
        """Remove those of row ``keys`` (distinct) that are present; returns the group
        each key was in (``-1`` where absent): :meth:`groups_of` and :meth:`remove_keys`
        in one search."""
        if keys.size == 0:
            return _EMPTY_I
        if self._flat and self.flat_removes:
            return self._flat_remove(keys)
        if self._flat:
            self._unflatten()
        ids = self._map.remove(keys)
        held = ids >= 0
        if held.all():
            groups = self._eg[ids]
        else:
            groups = np.full(keys.size, -1, dtype=np.int64)
            ids, keys = ids[held], keys[held]
            groups[held] = self._eg[ids]
        self._drop(ids, keys)
        return groups

    def _drop(self, ids: I64, keys: I64) -> None:
        """Drop the entries ``ids`` of row ``keys`` just unmapped."""
        pos = self._epos[ids]
        inbase = pos >= 0
        self._bits.clear(pos[inbase])  # base ids stay taken until the merge drops them
        self._dead += int(inbase.sum())
        if not inbase.all():
            out = ~inbase
            tail = pos <= _TAIL
            if tail.any():  # a flag: tail positions move only when it is compacted
                self._t_live[_TAIL - pos[tail]] = False
                self._t_dead += int(tail.sum())
                if self._t_dead > max(64, self._t_n // 2):
                    self._compact_tail()
            delta = pos == _IN_DELTA
            if delta.any():
                keep = np.ones(self._d_ids.size, dtype=bool)
                keep[self._delta_positions(ids[delta], keys[delta])] = False
                self._delta_keep(keep)
                self._d_ids = self._d_ids[keep]
            self._epos[ids[out]] = -1
            self._entry_ids.free(ids[out])
            self._entry_ids.release()
        if self._should_merge():
            self._merge()

    def shift(self, prev: I64, cur: I64) -> None:
        """Row keys ``prev[i]`` (present) are now ``cur[i]``; relative order is unchanged."""
        if prev.size == 0:
            return
        if self._flat:
            self._unflatten()
        ids = self._ids(prev, "shifted")
        c = cur.view(np.uint64)
        self._map.move(prev, cur)
        pos = self._epos[ids]
        k = self._coarse(self._eg[ids], c)
        b, t = pos >= 0, pos <= _TAIL
        d = pos == _IN_DELTA
        dp = self._delta_positions(ids[d], prev[d]) if d.any() else _EMPTY_I  # before any write
        self._b_v[pos[b]], self._b_k[pos[b]] = c[b], k[b]
        self._d_v[dp], self._d_k[dp] = c[d], k[d]
        self._t_k[_TAIL - pos[t]] = cur[t]  # the tail is unsorted: keys change in place

    def _merge(self) -> None:
        """Fold the tail and the delta into the base and drop tombstones (O(N), amortized
        over changes)."""
        self._flush()
        alive = self._live_mask()
        dead = self._b_ids[~alive]
        if dead.size:  # removed rows' ids are free once the base forgets them
            self._epos[dead] = -1
            self._entry_ids.free(dead)
            self._entry_ids.release()
        b_ids, d_ids = self._b_ids[alive], self._d_ids
        self._b_ids = self._merge_base(alive)(b_ids, d_ids)
        self._d_ids = _EMPTY_I
        self._epos[self._b_ids] = np.arange(self._b_ids.size, dtype=np.int64)

    def _live_mask(self) -> Mask:
        """Base positions whose bit is set (rows still present)."""
        words = self._bits.levels[0].astype("<u8")
        return np.unpackbits(words.view(np.uint8), bitorder="little")[: self._b_v.size].astype(bool)
