"""The live sort's index: rows in sort order on a gapped slot space (engine.ops.sort).

A *slot* is an output row key of the sorted table; slot order is sort order. Slots live
in a dense space ``[0, capacity)`` (a power of two) with free slots between rows, in the
manner of a packed-memory array (PMA), so that these arrays are indexed by output key
(building blocks in engine.ops.sort._slots):

* ``codes[j][slot]``: the sort code of key column ``j`` (engine.ops.sort._keys), plus a
  *fence* holding ``codes[0]`` at every 64th slot;
* ``Redirection[slot]``: the parent row key (the sorted table's columns read through it);
* ``LiveBits``: which slots hold a row (successor/predecessor, counts per window).

A free slot between rows is a *ghost*: it holds the codes and parent key of the next live
slot (Invariant G: *between the first and the last row, each ghost holds its successor's
codes and parent key*). So ``codes[0]`` is sorted over that span and a new row's place is
a two-level ``searchsorted`` (fence, then one 64-slot block); ties on ``codes[0]`` go to a
vectorized bisection over the other codes and the parent key (and the values, where codes
are inexact). G also names each slot's successor: ``pk_index[pk[slot]]``. Removes and
parent shifts record the slots they change and :meth:`SortIndex._refill` restores G over
the runs that end there; placements fill the ghosts they create directly.

Placing new rows (cost follows the change; rows with the same place form a group):

1. a gap with room takes the group in free slots: an add, nothing moves;
2. a gap one slot short pushes the run of at most 8 rows beside it (the nearer side) by
   one slot: an add and one shift range, like the seed's SortedKVTable (D shifted by 1);
3. other full gaps take the smallest aligned window of ``2**l`` slots (``l >= 4``) around
   them whose density, new rows included, is at most ``tau(l)`` (0.9 for 16 slots
   falling to 0.7 for the whole space) and re-spread it: half of its free slots evenly,
   half next to its insertion points, by group size (a point that keeps receiving rows,
   e.g. the end of a group when sorting by a low-cardinality column, gets more room);
   the window's survivors move, one shift range per run of equal delta;
4. rows after the last row are appended two slots apart (the space grows at the end);
   rows before the first take the free slots in front of it;
5. when the rows fill more than 65% of the slots between the first and the last row (a
   PMA's resize), or the front has no room left, everything is laid out again, two slots
   apart: every row moves, amortized over the inserts that filled the space.

A batch of at most ``FEW_MAX`` rows whose groups all fit where they go (cases 1, 2 and 4,
and the front with room) is placed as plain integers (:meth:`SortIndex._place_few`): one
``searchsorted`` on the fence, a bisection of one block per row, the gap and its ghosts by
integer arithmetic; and a few touched slots are refilled so (:meth:`SortIndex._refill_few`).
Same slots, same ghosts as the vectorized path, which takes any batch that needs room made;
at a handful of rows numpy's per-call cost, not the rows, is what the vectorized path spends.

This module keeps the slot state, the search, the placement itself, full layouts and
Invariant G; which runs a push moves and which windows are re-spread, and how (cases 2
and 3), are computed in engine.ops.sort._room, from the live bits, which it only reads.

Parent keys map to slots through a ``RowKeyMap`` (dense array, or hash map for sparse keys).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyroaring import BitMap64

from engine._kernels.arrays import bitmap_from_words, expand, sort_keys, sorted_unique
from engine._kernels.rowkeymap import RowKeyMap
from engine.columns import ColumnSource
from engine.errors import UpdateInvariantError
from engine.ops.sort._keys import MAX_CODE, KeyEncoder, as_arrow, order_batch
from engine.ops.sort._room import (
    outermost_windows,
    push_one,
    push_runs,
    respread,
    respread_windows,
    window_membership,
)
from engine.ops.sort._slots import LiveBits, Redirection, pow2_at_least, shift_from_runs
from engine.rowset import RowSetShiftData

__all__ = ["SortIndex"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
T = TypeVar("T", bound=np.generic)

_ONE = np.uint64(1)
_EMPTY = np.empty(0, dtype=np.int64)
_END = 1 << 62  # past every slot: the end of a claim at the back

BULK_RATIO = 16        # a batch of at least 1/16 of the rows left is merged, not placed ...
BULK_MIN = 4096        # ... in a table of at least this many rows (module attribute: tests shrink it)
FEW_MAX = 32           # a batch of at most this many rows is placed as plain integers (tests change it)
TAU_SPAN = 0.65        # rows per slot between the first and last row that calls for a new layout
SPACING = 2            # slots per row when laying out or appending
MIN_FRONT = 64         # free slots in front of the first row after a full layout


def _shift_at(old: I64, new: I64, breaks: I64) -> RowSetShiftData:
    """:func:`shift_from_runs` of survivors ``old -> new`` whose delta changes at most at
    the indices ``breaks`` (any order, repeats and ``old.size`` allowed): the shift read
    at those indices only."""
    n = old.size
    if n == 0:
        return RowSetShiftData.empty()
    at = np.zeros(n + 1, dtype=bool)  # one pass over flags beats sorting the breaks
    at[0] = True
    at[breaks] = True
    starts = np.flatnonzero(at[:n])
    d = new[starts] - old[starts]
    run = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))  # runs of one delta
    starts, d = starts[run], d[run]
    ends = np.append(starts[1:] - 1, n - 1)
    nz = d != 0
    return RowSetShiftData.from_arrays(old[starts[nz]], old[ends[nz]], d[nz])


def _lay_out(out: npt.NDArray[T], front: int, end: int, *parts: tuple[I64, npt.NDArray[T]],
             zeroed: bool) -> npt.NDArray[T]:
    """``out`` with rows at slots ``front, front + SPACING, ... < end`` (``parts``: positions
    among them and values), the ghosts before each row holding its value (Invariant G) and
    zeros elsewhere (``zeroed``: ``out`` is zero already); written in place."""
    rows = out[front:end:SPACING]  # a strided view: the rows are written once, then copied
    for at, values in parts:
        rows[at] = values
    for back in range(1, SPACING):
        out[front - back : end - back : SPACING] = rows
    if zeroed:
        out[front - SPACING + 1 : front] = 0  # nothing before the first row
    else:
        out[:front] = 0
        out[end - SPACING + 1 :] = 0
    return out


# the index ------------------------------------------------------------------------------
class SortIndex:
    """Parent rows kept in sort order on gapped slots (see the module docstring).

    Parameters
    ----------
    encoders
        One per sort column, in priority order.
    columns
        The parent's column sources of those columns (current values are read for new
        rows, and for ties that codes cannot settle).
    redirection
        Slot -> parent key storage shared with the sorted table's columns.
    """

    def __init__(self, encoders: Sequence[KeyEncoder], columns: Sequence[ColumnSource],
                 redirection: Redirection) -> None:
        self.encoders = list(encoders)
        self._columns = list(columns)
        self._redir = redirection
        self.capacity = 64
        self._codes: list[U64] = [np.zeros(64, dtype=np.uint64) for _ in self.encoders]
        self._fence = np.zeros(1, dtype=np.uint64)  # codes[0] at every 64th slot
        self._live_bits = LiveBits(64)
        self._unset: list[I64] = []  # removed slots whose live bits are not cleared yet
        self._pks = RowKeyMap()
        self._events: list[I64] = []
        # (front, end) of the last full layout while only removes followed it (its rows
        # are still at front, front + SPACING, ... but for the slots in _gone), else None
        self._grid: tuple[int, int] | None = None
        self._gone: list[I64] = []
        self.size = 0
        self.moved = 0  # survivors moved by the last insert (for benchmarks and tests)
        self.relaid = False  # the last insert laid every row out again
        # the survivors the last insert moved, (old slots, new slots), both sorted: the
        # members of the previous rows that its shift moves, and where (unless relaid)
        self.moves: tuple[I64, I64] = (_EMPTY, _EMPTY)
        # the last insert's slots for its rows, sorted, and the slots removed since the
        # insert or finish before it, sorted, when a bulk merge had them (else None)
        self.placed_sorted: I64 | None = None
        self.removed_sorted: I64 | None = None
        self._gone_mark = 0  # entries of _gone that predate the current removes

    @property
    def _live(self) -> LiveBits:
        """Which slots hold a row. Removes after a full layout defer clearing their bits
        to the first read (:meth:`remove`): a bulk merge lays the bits out anew without
        reading them, so it never pays for the clears."""
        if self._unset:
            unset = self._unset
            self._unset = []
            self._live_bits.clear(np.concatenate(unset) if len(unset) > 1 else unset[0])
        return self._live_bits

    @_live.setter
    def _live(self, bits: LiveBits) -> None:
        self._live_bits, self._unset = bits, []

    # reading ---------------------------------------------------------------------------
    def slots_of(self, pks: I64) -> I64:
        """Slots of parent keys (``-1`` where absent)."""
        return self._pks.lookup(pks)

    def codes_at(self, j: int, slots: I64) -> U64:
        return self._codes[j][slots]

    def live_slots(self) -> I64:
        """Every live slot, sorted (O(capacity); for layouts and tests)."""
        return self._live.all_live()

    def live_bitmap(self) -> BitMap64:
        """The live slots as a bitmap, from the live bits' words (O(capacity / 64))."""
        words = self._live.words
        pad = -words.size % 1024  # whole Roaring containers of 2**16 slots
        return bitmap_from_words(np.concatenate((words, np.zeros(pad, dtype=np.uint64))) if pad else words)

    def encode(self, pks: I64) -> tuple[list[U64], list[pa.Array]]:
        """Codes and current values of the sort columns at parent keys ``pks``."""
        values = [as_arrow(col.get(pks)) for col in self._columns]
        return [enc.encode(v) for enc, v in zip(self.encoders, values, strict=True)], values

    # changing ---------------------------------------------------------------------------
    def build(self, pks: I64) -> I64:
        """Lay out the parent's rows (``pks`` sorted); returns their slots, sorted."""
        codes, values = self.encode(pks)
        order = order_batch(self.encoders, values, codes, pks, pks_sorted=True)
        slots, _ = self._relayout([c[order] for c in codes], pks[order],
                                  np.zeros(pks.size, dtype=np.int64), MIN_FRONT)
        return slots

    def remove(self, pks: I64) -> I64:
        """Take rows out by parent key (previous parent key space); returns their slots."""
        if pks.size == 0:
            return _EMPTY
        slots = self._pks.remove(pks)
        if (slots < 0).any():  # the table fails: the half-applied state is never read
            bad = pks[slots < 0][:10].tolist()
            raise UpdateInvariantError("I1", f"sort: parent removed or re-keyed rows it never had: {bad}")
        self.size -= slots.size
        self._events.append(slots)
        if self._grid is not None:
            self._gone.append(slots)
            self._unset.append(slots)  # cleared when the bits are read next (see _live)
        else:
            self._live.clear(slots)
        return slots

    def repoint(self, prev_pks: I64, cur_pks: I64) -> None:
        """Follow a parent shift: rows at ``prev_pks`` now have parent keys ``cur_pks``.

        Keys no longer present (removed or re-keyed this cycle) are skipped. Shifts keep the
        parent's order, so the rows' order among ties (by parent key) is unchanged.
        """
        slots = self._pks.move(prev_pks, cur_pks)  # absent keys (-1) are not mapped
        ok = slots >= 0
        if not ok.any():
            return
        slots, cur_pks = slots[ok], cur_pks[ok]
        self._redir.write(slots, cur_pks)
        self._events.append(slots)

    def insert(self, pks: I64, known: tuple[list[U64], list[pa.Array]] | None = None
               ) -> tuple[I64, RowSetShiftData]:
        """Add rows by current parent key; returns their slots (aligned with ``pks``) and
        the shift of the survivors that had to move to make room.

        ``known``: the rows' codes and values when the caller has them already (as
        :meth:`encode` gives them). A batch of at least ``1 / BULK_RATIO`` of the rows
        left (of at least ``BULK_MIN``) is merged with them in one pass (:meth:`_merge`)
        instead of placed gap by gap.
        """
        self.moved = 0
        self.relaid = False
        self.moves = (_EMPTY, _EMPTY)
        self.placed_sorted = self.removed_sorted = None
        try:
            return self._insert(pks, known)
        finally:
            self._gone_mark = len(self._gone)

    def _insert(self, pks: I64, known: tuple[list[U64], list[pa.Array]] | None) -> tuple[I64, RowSetShiftData]:
        if pks.size == 0:
            self._refill()
            return _EMPTY, RowSetShiftData.empty()
        if known is None:
            codes, values = self.encode(pks)
        else:
            codes, values = known
        order = order_batch(self.encoders, values, codes, pks)
        codes = [c[order] for c in codes]
        if not all(enc.exact for enc in self.encoders):  # values settle ties codes cannot
            values = [v.take(pa.array(order)) for v in values]
        pks_o = pks[order]
        if self.size >= max(BULK_MIN, 1) and pks.size * BULK_RATIO >= self.size:
            slots, shift = self._merge(codes, values, pks_o)
            self.placed_sorted = slots  # rows in key order take ascending slots
            out = np.empty(pks.size, dtype=np.int64)
            out[order] = slots
            return out, shift
        self._refill()  # invariant G before searching
        placed = self._place_few(codes, values, pks_o) if pks.size <= FEW_MAX else None
        slots, shift = placed if placed is not None else self._place(codes, values, pks_o)
        self._refill()
        out = np.empty(pks.size, dtype=np.int64)
        out[order] = slots
        return out, shift

    def finish(self) -> None:
        """Restore invariant G after removes and repoints (when nothing was inserted)."""
        self.placed_sorted = self.removed_sorted = None
        self._refill()
        self._gone_mark = len(self._gone)

    # search -----------------------------------------------------------------------------
    def _search(self, codes: list[U64], values: list[pa.Array], pks: I64, lo: int, hi: int) -> I64:
        """For rows sorted by key: the first slot in ``[lo, hi)`` sorting after each (or ``hi``)."""
        q0 = codes[0]
        out = self._lower_bound(q0, lo, hi)
        inb = np.flatnonzero(out < hi)
        tie = inb[self._codes[0][out[inb]] == q0[inb]]
        if tie.size:
            self._settle_ties(out, tie, codes, values, pks, lo, hi)
        return out

    def _search_few(self, codes: list[U64], values: list[pa.Array], pks: I64, lo: int, hi: int) -> I64:
        """:meth:`_search` for a few rows: one ``searchsorted`` on the fence for all of
        them, then a bisection of each one's block of 64 codes as plain integers."""
        c0 = self._codes[0]
        f0 = (lo + 63) >> 6
        q0 = codes[0].tolist()
        at = np.searchsorted(self._fence[f0:(hi + 63) >> 6], codes[0], side="left").tolist()
        out: list[int] = []
        tie: list[int] = []
        for i, (q, j) in enumerate(zip(q0, at, strict=True)):
            base = ((f0 + j - 1) << 6) + 1 if j > 0 else lo  # codes before base are < q
            block = c0[base:min(base + 64, hi)].tolist()
            k = bisect_left(block, q)
            out.append(base + k)
            if k < len(block) and block[k] == q:
                tie.append(i)
        found = np.array(out, dtype=np.int64)
        if tie:
            self._settle_ties(found, np.array(tie, dtype=np.int64), codes, values, pks, lo, hi)
        return found

    def _settle_ties(self, out: I64, tie: I64, codes: list[U64], values: list[pa.Array], pks: I64,
                     lo: int, hi: int) -> None:
        """Narrow ``out[tie]``, rows whose first code ties there, by the rest of the key."""
        qt = codes[0][tie]
        top = qt == MAX_CODE  # no code above it: its ties run to the end
        b = np.full(tie.size, hi, dtype=np.int64)
        b[~top] = self._lower_bound(qt[~top] + _ONE, lo, hi)
        out[tie] = self._narrow(out[tie], b, tie, codes, values, pks)

    def _lower_bound(self, q: U64, lo: int, hi: int) -> I64:
        """First slot in ``[lo, hi)`` whose first code is ``>= q`` (else ``hi``), for
        sorted ``q``.

        Two levels: ``searchsorted`` on the fence (every 64th code, small enough to stay
        in cache), then six branchless bisection steps inside one block of 64 slots. The
        queries above the last code (a suffix, ``q`` sorted) answer ``hi`` at once; for
        the others a probe at or past ``hi`` reads the last code, which is not below
        them, so the steps need no bounds test (three numpy calls a step).
        """
        c0 = self._codes[0]
        f0, f1 = (lo + 63) >> 6, (hi + 63) >> 6  # fence entries inside [lo, hi)
        j = np.searchsorted(self._fence[f0:f1], q, side="left")
        # codes before base are < q; the answer is within base .. base + 64
        out = np.where(j > 0, ((f0 + j - 1) << 6) + 1, lo)
        cut = int(np.searchsorted(q, c0[hi - 1], side="right"))
        out[cut:] = hi
        base, q = out[:cut], q[:cut]
        last = hi - 1
        probe = np.empty_like(base)
        for half in (32, 16, 8, 4, 2, 1):
            np.add(base, half - 1, out=probe)
            np.minimum(probe, last, out=probe)
            np.add(base, half, out=base, where=c0.take(probe) < q)
        np.minimum(base, last, out=probe)
        base += c0.take(probe) < q
        return out

    def _narrow(self, lo: I64, hi: I64, q: I64, codes: list[U64], values: list[pa.Array],
                pks: I64, at: I64 | None = None) -> I64:
        """Binary search, all queries at once, inside ranges where the first code ties
        (ranges of slots, or of positions in the slot array ``at``)."""
        lo, hi = lo.copy(), hi.copy()
        act = np.arange(q.size)
        while act.size:
            mid = (lo[act] + hi[act]) >> 1
            after = self._slot_after(mid if at is None else at[mid], q[act], codes, values, pks)
            hi[act[after]] = mid[after]
            lo[act[~after]] = mid[~after] + 1
            act = act[lo[act] < hi[act]]
        return lo

    def _slot_after(self, slots: I64, q: I64, codes: list[U64], values: list[pa.Array],
                    pks: I64) -> Mask:
        """Whether the row (or ghost) at each slot sorts after query row ``q``; first codes tie."""
        after = np.zeros(slots.size, dtype=bool)
        open_ = np.ones(slots.size, dtype=bool)
        for j, enc in enumerate(self.encoders):
            cq = codes[j][q]
            if j:
                cs = self._codes[j][slots]
                after |= open_ & (cs > cq)
                open_ &= cs == cq
            if not enc.exact:
                amb = np.flatnonzero(open_ & enc.ambiguous(cq))
                if amb.size:
                    here = as_arrow(self._columns[j].get(self._redir.pk(slots[amb])))
                    cmp = enc.compare(here, values[j].take(pa.array(q[amb])))
                    after[amb[cmp > 0]] = True
                    open_[amb[cmp != 0]] = False
        rest = np.flatnonzero(open_)
        after[rest] = self._redir.pk(slots[rest]) > pks[q[rest]]
        return after

    # placing ------------------------------------------------------------------------------
    def _place(self, codes: list[U64], values: list[pa.Array], pks: I64) -> tuple[I64, RowSetShiftData]:
        """Slots for rows sorted by key (see the module docstring for the policy)."""
        m = pks.size
        if self.size == 0:
            return self._relayout(codes, pks, np.zeros(m, dtype=np.int64), MIN_FRONT)
        first, last = self._live.first(), self._live.last()
        ins = self._search(codes, values, pks, first, last + 1)
        if self.size + m > TAU_SPAN * (last - first + 1) and self.size + m > 1024:
            # the table got dense everywhere (a PMA's resize): windows would have to grow
            # to a good part of it to find room, so lay everything out again
            return self._relayout_with(codes, pks, ins)
        # rows with the same insertion slot form a group, placed together in one gap
        gstart = np.flatnonzero(np.concatenate(([True], np.diff(ins) != 0)))
        gi = ins[gstart]
        gr = np.diff(np.append(gstart, m))
        back = gi == last + 1
        front = gi == first
        t = np.full(gi.size, -1, dtype=np.int64)
        # by invariant G a slot holds its successor's parent key: no bit-tree walk needed
        t[~back] = self._pks.lookup(self._redir.pk(gi[~back]))
        p = np.where(front, -1, gi - 1)  # the live row before the gap (Invariant G)
        middle = ~front & ~back
        short = middle & (t - p - 1 < gr)  # gaps without room

        # a gap one slot short borrows a free slot next to it by pushing a short run of rows
        push_lo, push_hi, push_by = push_runs(self._live, gi, p, t, short & (t - p == gr),
                                              front, back)
        pushing = push_by != 0

        windows = np.empty((0, 2), dtype=np.int64)  # (level, index) of re-spread windows
        starts = stops = _EMPTY
        win = np.full(gi.size, -1, dtype=np.int64)
        inside = np.zeros(gi.size, dtype=bool)
        cap = t
        pending = np.flatnonzero(short & ~pushing)
        cum = np.concatenate(([0], np.cumsum(gr))) if pending.size else _EMPTY
        while pending.size:
            found = respread_windows(self._live, self.capacity, gi, cum, pending)
            if found is None:
                return self._relayout_with(codes, pks, ins)
            windows = outermost_windows(np.concatenate((windows, found)))
            starts, stops, win, inside, cap = window_membership(windows, gi, t)
            # a push into a window gives way to it; a gap that runs into a window may only
            # use its part before the window
            k = np.searchsorted(starts, push_hi, side="right") - 1
            into = pushing & (k >= 0) & (stops[np.maximum(k, 0)] > push_lo)
            pushing &= ~(into | inside)
            pending = np.flatnonzero(middle & ~inside & ~pushing & (cap - p - 1 < gr))
        if (front & ~inside & (t < gr)).any():
            return self._relayout_with(codes, pks, ins, front=True)

        slots = np.empty(m, dtype=np.int64)
        grp = np.repeat(np.arange(gi.size), gr)
        j = np.arange(m) - gstart[grp]
        r = gr[grp]
        # 1. gaps with room: evenly inside a block of at most 2r+1 free slots
        rows = (middle & ~inside & ~pushing)[grp]
        if rows.any():
            g = grp[rows]
            f = cap[g] - p[g] - 1
            bs = np.minimum(f, 2 * r[rows] + 1)
            off = np.minimum((f - bs) // 2, bs)
            slots[rows] = p[g] + off + ((j[rows] + 1) * (bs + 1)) // (r[rows] + 1)
        # 2. pushed gaps: every slot of the widened gap
        rows = pushing[grp]
        if rows.any():
            g = grp[rows]
            slots[rows] = p[g] + np.minimum(push_by[g], 0) + 1 + j[rows]
        # 3. before the first row: a block ending right before it
        rows = (front & ~inside)[grp]
        if rows.any():
            g = grp[rows]
            bs = np.minimum(t[g], 2 * r[rows] + 1)
            slots[rows] = t[g] - bs - 1 + ((j[rows] + 1) * (bs + 1)) // (r[rows] + 1)
        # 4. after the last row: spacing 2, growing the space
        rows = (back & ~inside)[grp]
        if rows.any():
            slots[rows] = last + SPACING * (j[rows] + 1)
            self._grow(int(slots[rows].max()) + 1)
        # 5. survivors that make room: pushed runs, and re-spread windows
        old: list[I64] = []
        new: list[I64] = []
        owner: list[I64] = []
        g = np.flatnonzero(pushing)
        if g.size:
            run_lo = np.where(push_by[g] > 0, t[g], push_lo[g] + 1)
            run_n = np.where(push_by[g] > 0, push_hi[g] - t[g], p[g] - push_lo[g])
            old.append(expand(run_lo, run_n))
            new.append(old[0] + np.repeat(push_by[g], run_n))
            owner.append(np.repeat(np.arange(g.size, dtype=np.int64), run_n))
        laid = whose = _EMPTY
        if starts.size:
            s_old, s_new, s_own, laid, whose = respread(self._live, starts, stops, inside, win,
                                                        gi, gr, gstart, grp, slots)
            old.append(s_old)
            new.append(s_new)
            owner.append(s_own + g.size)
        shift = RowSetShiftData.empty()
        if old:
            old_a, new_a, own_a = np.concatenate(old), np.concatenate(new), np.concatenate(owner)
            order = np.argsort(old_a, kind="stable")
            old_a, new_a, own_a = old_a[order], new_a[order], own_a[order]
            self._move(old_a, new_a)
            shift = shift_from_runs(old_a, new_a, own_a)
        # Invariant G outside windows: each new row fills the ghosts between it and the row
        # before it in its group (or the gap's live row before); a block in front of the
        # first row also fills the run up to that row. Pushed runs keep G by themselves
        # (each ghost still precedes the same row); windows are filled below. The ghosts
        # before a new row take its codes and parent key from the batch, written with the
        # rows in one store.
        direct = ~inside[grp]
        if not direct.any():
            self._store(slots, codes, pks)
        else:
            k = np.flatnonzero(direct)
            g = grp[k]
            before = np.where(j[k] > 0, slots[np.maximum(k - 1, 0)], np.where(front[g], -1, p[g]))
            before = np.where(pushing[g] & (j[k] == 0), slots[k] - 1, before)
            n = slots[k] - before - 1
            sel = (before >= 0) & (n > 0)
            n_sel = n[sel]
            ghosts = expand(before[sel] + 1, n_sel)
            whom = np.repeat(k[sel], n_sel)  # the batch row each ghost copies
            tail = k[(front[g]) & (j[k] == r[k] - 1)]
            n = t[grp[tail]] - slots[tail] - 1
            sel = n > 0
            if sel.any():  # the run up to the first row copies that row (a survivor)
                src = np.repeat(t[grp[tail]][sel], n[sel])
                dst = np.concatenate((slots, ghosts, expand(slots[tail][sel] + 1, n[sel])))
                w_codes = [np.concatenate((c_, c_[whom], old_c[src]))
                           for c_, old_c in zip(codes, self._codes, strict=True)]
                w_pks = np.concatenate((pks, pks[whom], self._redir.pk(src)))
            else:
                dst = np.concatenate((slots, ghosts))
                w_codes = [np.concatenate((c_, c_[whom])) for c_ in codes]
                w_pks = np.concatenate((pks, pks[whom]))
            self._store(slots, codes, pks, (dst, w_codes, w_pks))
        if starts.size:
            self._fill_windows(starts, stops, laid, whose)
        return slots, shift

    def _place_few(self, codes: list[U64], values: list[pa.Array], pks: I64
                   ) -> tuple[I64, RowSetShiftData] | None:
        """:meth:`_place` for a few rows, as plain integers, when every group fits where it
        goes: a gap with room (case 1), a gap one slot short that pushes a run aside (case
        2), after the last row (case 4) or in front of the first with room. None when one
        needs a window re-spread or a new layout (cases 3 and 5): :meth:`_place` then
        decides for the whole batch. Slots, pushes and ghost fills are :meth:`_place`'s."""
        m = pks.size
        if self.size == 0:
            return None
        live = self._live
        first, last = live.first(), live.last()
        if self.size + m > TAU_SPAN * (last - first + 1) and self.size + m > 1024:
            return None
        ins = self._search_few(codes, values, pks, first, last + 1).tolist()
        # groups of rows with one insertion slot gi: (gi, rows, p, t, push, claim lo, hi),
        # p and t the live rows around the gap (p = -1 in front, t = -1 at the back)
        groups: list[tuple[int, int, int, int, int, int, int]] = []
        i = 0
        while i < m:
            gi = ins[i]
            r = 1
            while i + r < m and ins[i + r] == gi:
                r += 1
            i += r
            if gi == last + 1:
                groups.append((gi, r, last, -1, 0, gi, _END))
                continue
            t = live.succ_one(gi)
            if gi == first:
                if t < r:
                    return None
                groups.append((gi, r, -1, t, 0, 0, t - 1))
                continue
            p = gi - 1  # by Invariant G, the live row before the gap
            if t - gi >= r:
                groups.append((gi, r, p, t, 0, gi, t - 1))
                continue
            if t - gi < r - 1:
                return None
            by, lo, hi = push_one(live, p, t)
            if by == 0:
                return None
            groups.append((gi, r, p, t, by, lo, hi))
        for g in groups:  # a push's claim may not touch another group's gap or claim
            if g[4] and any(h is not g and g[5] <= h[6] and h[5] <= g[6] for h in groups):
                return None

        slots: list[int] = []
        ghosts: list[tuple[int, int, int]] = []  # (first ghost, count, slot they copy)
        moves: list[tuple[int, int, int]] = []  # survivors pushed: (old slot, new slot, group)
        for k, (gi, r, p, t, by, lo, hi) in enumerate(groups):
            before = p
            if by:  # the widened gap, every slot of it; the run keeps its ghosts
                at = [p + min(by, 0) + 1 + j for j in range(r)]
                run = range(t, hi) if by > 0 else range(lo + 1, p + 1)
                moves.extend((s, s + by, k) for s in run)
                before = at[0] - 1
            elif t < 0:  # after the last row: spacing 2, the space grows
                at = [last + SPACING * (j + 1) for j in range(r)]
            elif p < 0:  # in front of the first row: a block ending before it
                bs = min(t, 2 * r + 1)
                at = [t - bs - 1 + ((j + 1) * (bs + 1)) // (r + 1) for j in range(r)]
                if t - at[-1] > 1:  # the run up to the first row
                    ghosts.append((at[-1] + 1, t - at[-1] - 1, t))
            else:  # evenly inside a block of at most 2r + 1 free slots
                f = t - gi
                bs = min(f, 2 * r + 1)
                off = min((f - bs) // 2, bs)
                at = [p + off + ((j + 1) * (bs + 1)) // (r + 1) for j in range(r)]
            for s in at:  # Invariant G: the ghosts before each new row take its values
                if before >= 0 and s - before > 1:
                    ghosts.append((before + 1, s - before - 1, s))
                before = s
            slots.extend(at)
        shift = RowSetShiftData.empty()
        if moves:
            moves.sort()
            old, new, owner = (np.array(x, dtype=np.int64) for x in zip(*moves, strict=True))
            self._move(old, new)
            shift = shift_from_runs(old, new, owner)
        out = np.array(slots, dtype=np.int64)
        self._grow(max(slots) + 1)
        self._store(out, codes, pks)
        self._copy_runs(ghosts)
        return out, shift

    def _copy_runs(self, runs: list[tuple[int, int, int]]) -> None:
        """:meth:`_copy` of runs ``(start, count, source)`` given as plain integers."""
        if not runs:
            return
        n = sum(c for _, c, _ in runs)
        if n <= 64:
            dst = [d for a, c, _ in runs for d in range(a, a + c)]
            src = [s for _, c, s in runs for _ in range(c)]
            self._copy(np.array(dst, dtype=np.int64), np.array(src, dtype=np.int64))
            return
        a, c, s = (np.array(x, dtype=np.int64) for x in zip(*runs, strict=True))
        self._copy(expand(a, c), np.repeat(s, c))

    def _fill_windows(self, starts: I64, stops: I64, laid: I64, whose: I64) -> None:
        """Invariant G over re-spread windows (``laid``: their rows, sorted, by window).

        Inside a window every ghost takes the next row's values; the run before a window
        takes its first row's, and the ghosts after its last row take those at the slot
        just past the window (the next row's, by G) unless the window ends the table.
        """
        head = np.flatnonzero(np.concatenate(([True], whose[1:] != whose[:-1])))
        prev = np.empty(laid.size, dtype=np.int64)
        prev[1:] = laid[:-1]
        prev[head] = self._live.pred(starts[whose[head]] - 1)  # the live row before the window
        n = laid - prev - 1
        sel = (prev >= 0) & (n > 0)
        self._copy(expand(prev[sel] + 1, n[sel]), np.repeat(laid[sel], n[sel]))
        tail_end = np.append(head[1:], laid.size) - 1
        end = stops[whose[tail_end]]
        n = end - laid[tail_end] - 1
        sel = (n > 0) & (end <= self._live.last())
        self._copy(expand(laid[tail_end][sel] + 1, n[sel]), np.repeat(end[sel], n[sel]))

    def _move(self, old: I64, new: I64) -> None:
        """Move survivors ``old -> new`` (all at once; sources may be other rows' targets)."""
        moving = old != new
        self.moved = int(moving.sum())
        if not self.moved:
            return
        src, dst = old[moving], new[moving]
        self.moves = (src, dst)
        self._grid = None
        old_codes = [c_[src] for c_ in self._codes]
        old_pk = self._redir.pk(src)
        self._live.clear(src)
        self._put(dst, old_codes, old_pk)
        self._pks.set_values(old_pk, dst)
        self._live.set(dst)

    def _put(self, slots: I64, codes: list[U64], pks: I64) -> None:
        """Write codes and parent keys at ``slots`` (and the fence)."""
        for c_, new in zip(self._codes, codes, strict=True):
            c_[slots] = new
        self._redir.write(slots, pks)
        at = (slots & 63) == 0
        if at.any():
            self._fence[slots[at] >> 6] = codes[0][at]

    def _copy(self, dst: I64, src: I64) -> None:
        """Give slots ``dst`` the codes and parent keys of slots ``src``."""
        if dst.size:
            self._put(dst, [c_[src] for c_ in self._codes], self._redir.pk(src))

    def _store(self, slots: I64, codes: list[U64], pks: I64,
               writes: tuple[I64, list[U64], I64] | None = None) -> None:
        """Add rows at free ``slots``; ``writes``: the slots, codes and parent keys to
        write instead of the rows' alone (the rows and ghosts filled with them)."""
        self._grid = None
        self._put(*(writes if writes is not None else (slots, codes, pks)))
        self._pks.insert(pks, slots)
        self._live.set(slots)
        self.size += slots.size

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = pow2_at_least(max(need, 2 * self.capacity))
        for j, c_ in enumerate(self._codes):
            grown = np.zeros(cap, dtype=np.uint64)
            grown[: c_.size] = c_
            self._codes[j] = grown
        self._fence = self._codes[0][::64].copy()
        self._live.grow(cap)
        self._redir.ensure_capacity(cap)
        self.capacity = cap

    # full layouts -------------------------------------------------------------------------
    def _merge(self, codes: list[U64], values: list[pa.Array], pks: I64) -> tuple[I64, RowSetShiftData]:
        """Rows sorted by key merged with the survivors in one pass and laid out again.

        For a batch that is a good part of the table: placing it gap by gap costs many
        scattered passes per row (search, room, Invariant G), a full layout a few
        sequential passes over the table. The survivors are ranked by their codes alone
        (live slots, so Invariant G is not needed: the removes and repoints of the cycle
        are never refilled), ties settled as :meth:`_search` settles them.

        When only removes followed the last full layout (a bulk cycle after a bulk cycle),
        the survivors are that layout's slots less the removed ones, and the survivors'
        shift changes only where a new row goes in or a removed row was
        (:meth:`_grid_survivors`): no scan of the live bits, no pass over every delta.
        """
        if self._grid is not None:
            surv, breaks = self._grid_survivors()
        else:
            surv, breaks = self._live.all_live(), None
        c0 = self._codes[0].take(surv)
        q0 = codes[0]
        before = np.searchsorted(c0, q0, side="left")
        inb = np.flatnonzero(before < c0.size)
        tie = inb[c0[before[inb]] == q0[inb]]  # first codes tie: the rest of the key decides
        if tie.size:
            stop = np.searchsorted(c0, q0[tie], side="right")
            before[tie] = self._narrow(before[tie], stop, tie, codes, values, pks, at=surv)
        n = self.size + pks.size
        first = int(surv[0]) if surv.size else -1  # the live bits' first(), not read
        room = max(MIN_FRONT, min(first, n // 4))
        return self._relayout(codes, pks, before, room, surv, c0, breaks)

    def _grid_survivors(self) -> tuple[I64, I64]:
        """The live slots of the last full layout, and the survivors (by index) that
        follow a removed row: with the rows ``before`` which the new ones go, the only
        places where the survivors' shift can change."""
        assert self._grid is not None
        front, end = self._grid
        keep = np.ones((end - front) // SPACING, dtype=bool)
        gone = (np.concatenate(self._gone) - front) // SPACING if self._gone else _EMPTY
        keep[gone] = False
        surv = np.flatnonzero(keep).astype(np.int64)
        surv *= SPACING
        surv += front
        # the removed rows' places in the layout, sorted (radix passes over the few of
        # them, cheaper than a scan of the mostly set flags); the survivor after the j-th
        # removed row (in layout order) has index at[j] - j
        at = sort_keys(gone)
        if self._gone_mark == 0:  # all of them removed since the last insert or finish
            self.removed_sorted = at * SPACING + front
        at -= np.arange(at.size, dtype=np.int64)
        return surv, at

    def _relayout_with(self, codes: list[U64], pks: I64, ins: I64, front: bool = False
                       ) -> tuple[I64, RowSetShiftData]:
        n = self.size + pks.size
        room = max(MIN_FRONT, n // 4) if front else max(MIN_FRONT, min(self._live.first(), n // 4))
        surv = self._live.all_live() if self.size else _EMPTY
        # new row i goes before the survivors at slots >= ins[i]
        return self._relayout(codes, pks, np.searchsorted(surv, ins, side="left"), room, surv)

    def _relayout(self, codes: list[U64], pks: I64, before: I64, front: int, surv: I64 | None = None,
                  surv_c0: U64 | None = None, breaks: I64 | None = None) -> tuple[I64, RowSetShiftData]:
        """Every row (survivors ``surv``, live slots in order, and new rows sorted by key,
        new row ``i`` going before survivor ``before[i]``) at slots ``front + 2k``; every
        survivor moves. ``surv_c0``: the survivors' first codes, when the caller read them;
        ``breaks``: survivors (by index) other than those of ``before`` where the
        survivors' shift may change, when the caller knows them (else it is read off
        every survivor's)."""
        if surv is None:
            surv = self._live.all_live() if self.size else _EMPTY
        n_s, m = surv.size, pks.size
        n = n_s + m
        end = front + SPACING * n  # rows at front, front + SPACING, ... (a slice of slots)
        # merge two sorted sequences: positions in the merged order (new row i goes before
        # survivor before[i], after the new rows before it)
        at_new = before + np.arange(m)
        flags = np.ones(n, dtype=bool)  # the survivors' positions: the others (a prefix sum
        flags[at_new] = False           # of the new rows' counts costs several times more)
        at_surv = np.flatnonzero(flags)
        new = front + SPACING * at_new
        surv_new = front + SPACING * at_surv
        cap = pow2_at_least(end + 64)
        old_pk = self._redir.pk(surv)
        for j, c_ in enumerate(self._codes):
            kept = surv_c0 if j == 0 and surv_c0 is not None else c_.take(surv)
            # the survivors' codes are read: an array of the right size is written over
            # (no fresh array to fault in and zero), else a new one
            same = c_.size == cap
            self._codes[j] = _lay_out(c_ if same else np.zeros(cap, dtype=np.uint64), front, end,
                                      (at_surv, kept), (at_new, codes[j]), zeroed=not same)
        # a new array: the old one serves the cycle's previous values
        self._redir.replace(_lay_out(np.zeros(cap, dtype=np.int64), front, end, (at_surv, old_pk),
                                     (at_new, pks), zeroed=True))
        self._fence = self._codes[0][::64].copy()
        self._live = LiveBits.from_step(cap, front, end, SPACING)
        self.capacity = cap
        self._pks.set_values(old_pk, surv_new)
        self._pks.insert(pks, new)
        self.size = n
        self._events = []
        self._grid, self._gone = (front, end), []
        self.moved = n_s
        self.relaid = True
        if breaks is None:
            return new, shift_from_runs(surv, surv_new)
        return new, _shift_at(surv, surv_new, np.concatenate((before, breaks)))

    # invariant G ----------------------------------------------------------------------------
    def _refill(self) -> None:
        """Give every ghost in a run touched since the last call its successor's values."""
        if not self._events:
            return
        if sum(e.size for e in self._events) <= FEW_MAX:
            self._refill_few()
            return
        ev = sorted_unique(np.concatenate(self._events))
        self._events = []
        t = self._live.succ(ev)
        t = sorted_unique(t[t >= 0])
        p = self._live.pred(t - 1)
        n = t - p - 1
        sel = (p >= 0) & (n > 0)  # ghosts before the first row are never searched
        if not sel.any():
            return
        self._copy(expand(p[sel] + 1, n[sel]), np.repeat(t[sel], n[sel]))

    def _refill_few(self) -> None:
        """:meth:`_refill` of a few touched slots, as plain integers."""
        live = self._live
        runs = []
        done = set()
        for e in sorted({s for ev in self._events for s in ev.tolist()}):
            t = live.succ_one(e)
            if t < 0 or t in done:
                continue
            done.add(t)
            p = live.pred_one(t - 1)
            if p >= 0 and t - p > 1:  # ghosts before the first row are never searched
                runs.append((p + 1, t - p - 1, t))
        self._events = []
        self._copy_runs(runs)

    # checking -------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise UpdateInvariantError if the index is inconsistent (slow; for tests)."""
        live = self._live.all_live()
        if live.size != self.size:
            raise UpdateInvariantError("sort", f"{live.size} live slots but size {self.size}")
        if live.size == 0:
            return
        lo, hi = int(live[0]), int(live[-1]) + 1
        succ = live[np.searchsorted(live, np.arange(lo, hi))]
        for j, c_ in enumerate(self._codes):
            if not np.array_equal(c_[lo:hi], c_[succ]):
                raise UpdateInvariantError("sort", f"ghost codes of column {j} break invariant G")
        pk = self._redir.pk(np.arange(lo, hi))
        if not np.array_equal(pk, self._redir.pk(succ)):
            raise UpdateInvariantError("sort", "ghost parent keys break invariant G")
        if all(enc.exact for enc in self.encoders):  # else ties may need the values
            keys = [self._redir.pk(live)] + [c_[live] for c_ in reversed(self._codes)]
            if not np.array_equal(np.lexsort(keys), np.arange(live.size)):
                raise UpdateInvariantError("sort", "rows are not in (codes, parent key) order")
        back = self._pks.lookup(self._redir.pk(live))
        if not np.array_equal(back, live):
            raise UpdateInvariantError("sort", "parent key index disagrees with the redirection")

