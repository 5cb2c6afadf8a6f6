"""Building blocks of the sort index (engine.ops.sort._index), all vectorized.

* :class:`LiveBits`: which slots of a dense slot space hold a row, as bit words plus
  64-ary summary levels; successor/predecessor queries and counts per aligned window for
  whole arrays of slots at once (and as plain integers for one slot, or up to ``FEW``
  slots set or cleared, where numpy's per-call cost is most of the work);
* :class:`Redirection`: output row key -> parent row key, dense by output key, keeping the
  value each slot had at the start of the cycle (the sorted table's ``get_prev``);
* :func:`shift_from_runs` and :func:`pow2_at_least`, small helpers of the layout.

Parent row key -> slot is an :class:`~engine._kernels.rowkeymap.RowKeyMap`; sort-based
unique, membership, range expansion and bit scans are :mod:`engine._kernels.arrays`'.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import expand, highest_bit, lowest_bit, member, sorted_unique
from engine.columns import WritableColumnSource
from engine.ops.sort._keys import as_arrow
from engine.rowset import RowSetShiftData

__all__ = ["LiveBits", "Redirection", "pow2_at_least", "shift_from_runs"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_ALL_INT = (1 << 64) - 1
FEW = 8  # from this many slots down, bits are set and cleared with plain integers


# small vectorized helpers -------------------------------------------------------------
def pow2_at_least(n: int) -> int:
    return 1 << max(6, int(n - 1).bit_length())


def shift_from_runs(old: I64, new: I64, group: I64 | None = None) -> RowSetShiftData:
    """Shift ranges for survivors moving ``old -> new``; a range never spans two groups.

    ``old`` is sorted and lists every survivor of each group (movers and non-movers), so a
    range ``[old[a], old[b]]`` holds exactly the survivors ``a..b``. No ``group``: one group.
    """
    if old.size == 0:
        return RowSetShiftData.empty()
    d = new - old
    step = np.diff(d) != 0
    if group is not None:
        step |= np.diff(group) != 0
    brk = np.flatnonzero(step)
    first = np.concatenate(([0], brk + 1))
    last = np.concatenate((brk, [old.size - 1]))
    nz = d[first] != 0
    return RowSetShiftData.from_arrays(old[first[nz]], old[last[nz]], d[first[nz]])


# which slots hold a row ----------------------------------------------------------------
def _levels_for(words0: U64) -> list[U64]:
    levels = [words0]
    while levels[-1].size > 1:
        nz = levels[-1] != 0
        pad = (-nz.size) % 64
        if pad:
            nz = np.concatenate((nz, np.zeros(pad, dtype=bool)))
        levels.append(np.packbits(nz, bitorder="little").view(np.uint64))
    return levels


class LiveBits:
    """The set of live slots in ``[0, capacity)``: bit words plus 64-ary summary levels.

    ``levels[0]`` has one bit per slot; bit ``i`` of ``levels[k + 1]`` says whether word
    ``i`` of ``levels[k]`` is non-zero. Successor and predecessor queries climb only as far
    as the nearest non-empty word, whole arrays of queries at a time.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._levels = _levels_for(np.zeros(capacity // 64, dtype=np.uint64))

    @property
    def words(self) -> U64:
        return self._levels[0]

    @classmethod
    def from_slots(cls, capacity: int, slots: I64) -> LiveBits:
        out = cls.__new__(cls)
        out.capacity = capacity
        flags = np.zeros(capacity, dtype=bool)
        flags[slots] = True
        out._levels = _levels_for(np.packbits(flags, bitorder="little").view(np.uint64))
        return out

    @classmethod
    def from_step(cls, capacity: int, start: int, stop: int, step: int) -> LiveBits:
        """The slots ``range(start, stop, step)`` live (a full layout).

        A step dividing 64 sets the same bits in every word the range covers: the words
        are written whole (no flag per slot to pack)."""
        out = cls.__new__(cls)
        out.capacity = capacity
        stop = min(stop, capacity)
        if 64 % step or start >= stop:
            flags = np.zeros(capacity, dtype=bool)
            flags[start:stop:step] = True
            out._levels = _levels_for(np.packbits(flags, bitorder="little").view(np.uint64))
            return out
        last = start + (stop - 1 - start) // step * step  # the range's last slot
        pattern = sum(1 << b for b in range(start % step, 64, step))  # slot 64w + b: b = start mod step
        words = np.zeros(capacity // 64, dtype=np.uint64)
        w0, w1 = start >> 6, last >> 6
        words[w0 : w1 + 1] = pattern
        words[w0] &= np.uint64((pattern >> (start & 63)) << (start & 63))
        words[w1] &= np.uint64(pattern & ((2 << (last & 63)) - 1))
        out._levels = _levels_for(words)
        return out

    def grow(self, capacity: int) -> None:
        words = np.zeros(capacity // 64, dtype=np.uint64)
        words[: self._levels[0].size] = self._levels[0]
        self.capacity = capacity
        self._levels = _levels_for(words)

    def set(self, slots: I64) -> None:
        if slots.size <= FEW:
            self._set_few(slots.tolist())
            return
        pos = slots
        for words in self._levels:
            if pos.size == 0:
                return
            w = pos >> 6
            was_empty = words[w] == 0
            np.bitwise_or.at(words, w, _ONE << (pos & 63).astype(np.uint64))
            pos = sorted_unique(w[was_empty])  # only newly non-empty words change one level up

    def clear(self, slots: I64) -> None:
        if slots.size <= FEW:
            self._clear_few(slots.tolist())
            return
        pos = slots
        for words in self._levels:
            if pos.size == 0:
                return
            w = pos >> 6
            np.bitwise_and.at(words, w, ~(_ONE << (pos & 63).astype(np.uint64)))
            w = w[words[w] == 0]
            pos = sorted_unique(w)  # words that emptied clear their bit one level up

    def _set_few(self, slots: list[int]) -> None:
        for pos in slots:  # a step per level, only while a word was empty
            for words in self._levels:
                w = pos >> 6
                word = int(words[w])
                words[w] = word | (1 << (pos & 63))
                if word:
                    break
                pos = w

    def _clear_few(self, slots: list[int]) -> None:
        for pos in slots:  # a step per level, only while a word empties
            for words in self._levels:
                w = pos >> 6
                word = int(words[w]) & ~(1 << (pos & 63))
                words[w] = word
                if word:
                    break
                pos = w

    def succ_one(self, pos: int) -> int:
        """:meth:`succ` of one slot, with plain integers (climbs only to the nearest
        non-empty word, as :meth:`succ`)."""
        levels = self._levels
        pos = max(pos, 0)
        lvl = 0
        while True:
            words = levels[lvl]
            w = pos >> 6
            if w >= words.size:
                return -1
            m = int(words[w]) >> (pos & 63)
            if m:
                pos += (m & -m).bit_length() - 1
                break
            if lvl + 1 == len(levels):
                return -1
            pos, lvl = w + 1, lvl + 1  # the next word: a bit index one level up
        while lvl:  # down again through the lowest bit of each word
            lvl -= 1
            word = int(levels[lvl][pos])
            pos = (pos << 6) + (word & -word).bit_length() - 1
        return pos

    def pred_one(self, pos: int) -> int:
        """:meth:`pred` of one slot, with plain integers."""
        levels = self._levels
        pos = min(pos, self.capacity - 1)
        lvl = 0
        while True:
            if pos < 0:
                return -1
            w = pos >> 6
            m = int(levels[lvl][w]) & ((2 << (pos & 63)) - 1)
            if m:
                pos = (w << 6) + m.bit_length() - 1
                break
            if lvl + 1 == len(levels):
                return -1
            pos, lvl = w - 1, lvl + 1
        while lvl:
            lvl -= 1
            pos = (pos << 6) + int(levels[lvl][pos]).bit_length() - 1
        return pos

    def free_succ_one(self, pos: int) -> int:
        """:meth:`free_succ` of one slot, with plain integers."""
        words = self._levels[0]
        w = pos >> 6
        m = ~int(words[w]) & (_ALL_INT << (pos & 63)) & _ALL_INT
        if not m and w + 1 < words.size:
            w += 1
            m = ~int(words[w]) & _ALL_INT
        return (w << 6) + (m & -m).bit_length() - 1 if m else -1

    def free_pred_one(self, pos: int) -> int:
        """:meth:`free_pred` of one slot, with plain integers."""
        words = self._levels[0]
        w = pos >> 6
        m = ~int(words[w]) & ((2 << (pos & 63)) - 1)
        if not m and w > 0:
            w -= 1
            m = ~int(words[w]) & _ALL_INT
        return (w << 6) + m.bit_length() - 1 if m else -1

    def succ(self, pos: I64) -> I64:
        """Smallest live slot ``>= pos`` for each query, ``-1`` if there is none."""
        return self._succ(0, np.maximum(pos, 0))

    def _succ(self, lvl: int, pos: I64) -> I64:
        words = self._levels[lvl]
        ok = pos < words.size * 64
        p = np.where(ok, pos, 0)
        w = p >> 6
        m = words[w] & (_ALL << (p & 63).astype(np.uint64))
        hit = ok & (m != 0)
        out = np.where(hit, (w << 6) + lowest_bit(m), -1)
        miss = np.flatnonzero(ok & ~hit)
        if miss.size and lvl + 1 < len(self._levels):
            nxt = self._succ(lvl + 1, w[miss] + 1)
            found = nxt >= 0
            out[miss[found]] = (nxt[found] << 6) + lowest_bit(words[nxt[found]])
        return out

    def pred(self, pos: I64) -> I64:
        """Largest live slot ``<= pos`` for each query, ``-1`` if there is none."""
        return self._pred(0, np.minimum(pos, self.capacity - 1))

    def _pred(self, lvl: int, pos: I64) -> I64:
        words = self._levels[lvl]
        ok = pos >= 0
        p = np.where(ok, pos, 0)
        w = p >> 6
        m = words[w] & (_ALL >> (63 - (p & 63)).astype(np.uint64))
        hit = ok & (m != 0)
        out = np.where(hit, (w << 6) + highest_bit(m), -1)
        miss = np.flatnonzero(ok & ~hit)
        if miss.size and lvl + 1 < len(self._levels):
            prv = self._pred(lvl + 1, w[miss] - 1)
            found = prv >= 0
            out[miss[found]] = (prv[found] << 6) + highest_bit(words[prv[found]])
        return out

    def free_succ(self, pos: I64) -> I64:
        """First free slot ``>= pos`` within the word of ``pos`` or the next one, else ``-1``."""
        words = self._levels[0]
        out = np.full(pos.size, -1, dtype=np.int64)
        w = pos >> 6
        m = ~words[w] & (_ALL << (pos & 63).astype(np.uint64))
        hit = m != 0
        out[hit] = (w[hit] << 6) + lowest_bit(m[hit])
        nxt = np.flatnonzero(~hit & (w + 1 < words.size))
        m = ~words[w[nxt] + 1]
        ok = m != 0
        out[nxt[ok]] = ((w[nxt[ok]] + 1) << 6) + lowest_bit(m[ok])
        return out

    def free_pred(self, pos: I64) -> I64:
        """Last free slot ``<= pos`` within the word of ``pos`` or the one before, else ``-1``."""
        words = self._levels[0]
        out = np.full(pos.size, -1, dtype=np.int64)
        w = pos >> 6
        m = ~words[w] & (_ALL >> (63 - (pos & 63)).astype(np.uint64))
        hit = m != 0
        out[hit] = (w[hit] << 6) + highest_bit(m[hit])
        prv = np.flatnonzero(~hit & (w > 0))
        m = ~words[w[prv] - 1]
        ok = m != 0
        out[prv[ok]] = ((w[prv[ok]] - 1) << 6) + highest_bit(m[ok])
        return out

    def first(self) -> int:
        """The smallest live slot, or -1 (one query: plain integers, a step per level)."""
        top = len(self._levels) - 1
        if not int(self._levels[top][0]):
            return -1
        w = 0
        for lvl in range(top, -1, -1):
            word = int(self._levels[lvl][w])
            w = (w << 6) + ((word & -word).bit_length() - 1)
        return w

    def last(self) -> int:
        """The largest live slot, or -1."""
        top = len(self._levels) - 1
        if not int(self._levels[top][0]):
            return -1
        w = 0
        for lvl in range(top, -1, -1):
            w = (w << 6) + (int(self._levels[lvl][w]).bit_length() - 1)
        return w

    def count(self, level: int, windows: I64) -> I64:
        """Live slots in each aligned window ``[w << level, (w + 1) << level)``."""
        words = self._levels[0]
        if level >= 6:
            block = words.reshape(-1, 1 << (level - 6))[windows]
            return np.asarray(np.bitwise_count(block).sum(axis=1), dtype=np.int64)
        start = windows << level
        bits = (words[start >> 6] >> (start & 63).astype(np.uint64)) & np.uint64((1 << (1 << level)) - 1)
        return np.asarray(np.bitwise_count(bits), dtype=np.int64)

    def live_in(self, starts: I64, stops: I64) -> tuple[I64, I64]:
        """Live slots of sorted disjoint windows ``[starts[i], stops[i])`` and their window ``i``."""
        w0 = starts >> 6
        nw = ((stops + 63) >> 6) - w0
        widx = expand(w0, nw)
        bits = np.unpackbits(self._levels[0][widx].view(np.uint8), bitorder="little")
        pos = np.flatnonzero(bits)
        slots = widx[pos >> 6] * 64 + (pos & 63)
        owner = np.repeat(np.arange(starts.size, dtype=np.int64), nw)[pos >> 6]
        keep = (slots >= starts[owner]) & (slots < stops[owner])
        return slots[keep], owner[keep]

    def all_live(self) -> I64:
        """Every live slot, sorted: the words from the first live one to the last (the
        space past the last row may be as large again as the rows' span)."""
        first = self.first()
        if first < 0:
            return np.empty(0, dtype=np.int64)
        w0, w1 = first >> 6, (self.last() >> 6) + 1
        bits = np.unpackbits(self._levels[0][w0:w1].view(np.uint8), bitorder="little")
        out = np.flatnonzero(bits).astype(np.int64)
        out += w0 << 6
        return out


# output key -> parent key ---------------------------------------------------------------
class Redirection(WritableColumnSource):
    """Output row key -> parent row key, dense by output key, with previous values.

    Register it with ``graph.track`` before the first write of a cycle: from then until
    :meth:`end_cycle` the value a slot had at the start of the cycle is kept the first time
    the slot is overwritten (a mark per slot says which are kept, so a write costs what it
    writes), and :meth:`prev_pk` answers in the previous key space, with parent keys of
    the parent's previous key space. A full layout swaps the whole array; the old one then
    serves previous values.
    """

    def __init__(self, capacity: int) -> None:
        self.type = pa.int64()
        self._pk = np.zeros(capacity, dtype=np.int64)
        self._marked = np.zeros(capacity, dtype=bool)
        self._tracking = False
        self._kept_keys: list[I64] = []
        self._kept_vals: list[I64] = []
        self._lookup: tuple[I64, I64] | None = None
        self._before: I64 | None = None

    def pk(self, keys: I64) -> I64:
        """Current parent keys at output ``keys``."""
        return self._pk.take(keys)  # take: about a third cheaper than fancy indexing

    def prev_pk(self, keys: I64) -> I64:
        """Parent keys (previous key spaces) at previous output ``keys``."""
        if not self._kept_keys and self._before is None:
            return self._pk[keys]
        base = self._before if self._before is not None else self._pk
        out = base[np.minimum(keys, base.size - 1)]
        if self._kept_keys:
            if self._lookup is None:
                k = np.concatenate(self._kept_keys)
                order = np.argsort(k, kind="stable")
                self._lookup = (k[order], np.concatenate(self._kept_vals)[order])
            kk, kv = self._lookup
            hit = member(kk, keys)
            if hit.any():
                out = out.copy()
                out[hit] = kv[np.searchsorted(kk, keys[hit])]
        return out

    def write(self, keys: I64, values: I64) -> None:
        """Set distinct ``keys`` (current output keys) to parent keys ``values``."""
        if keys.size == 0:
            return
        if self._tracking and self._before is None:
            fresh = keys[~self._marked[keys]]
            if fresh.size:
                self._marked[fresh] = True
                self._kept_keys.append(fresh)
                self._kept_vals.append(self._pk[fresh])
                self._lookup = None
        self._pk[keys] = values

    def replace(self, pk: I64) -> None:
        """Swap in a whole new array (a full layout)."""
        if self._tracking and self._before is None:
            self._before = self._pk
        self._pk = pk
        if self._marked.size < pk.size:
            self._marked = np.zeros(pk.size, dtype=bool)
            for k in self._kept_keys:
                self._marked[k] = True

    # WritableColumnSource ---------------------------------------------------------------
    def get(self, keys: I64) -> pa.Array:
        return pa.array(self.pk(keys), type=pa.int64())

    def get_prev(self, keys: I64) -> pa.Array:
        return pa.array(self.prev_pk(keys), type=pa.int64())

    def set(self, keys: I64, values: pa.Array | pa.ChunkedArray) -> None:
        self.write(keys, np.asarray(as_arrow(values).to_numpy(zero_copy_only=False), dtype=np.int64))

    def ensure_capacity(self, n: int) -> None:
        if n > self._pk.size:
            grown = np.zeros(n, dtype=np.int64)
            grown[: self._pk.size] = self._pk
            self._pk = grown
        if n > self._marked.size:  # a full layout may have left _marked larger than _pk
            marked = np.zeros(n, dtype=bool)
            marked[: self._marked.size] = self._marked
            self._marked = marked

    def begin_cycle(self) -> None:
        self._tracking = True

    def end_cycle(self) -> None:
        for k in self._kept_keys:
            self._marked[k] = False
        self._tracking = False
        self._kept_keys, self._kept_vals = [], []
        self._lookup = None
        self._before = None
