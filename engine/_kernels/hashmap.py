"""The one vectorized hash map from ``uint64`` keys to non-negative ``int64`` values.

Keyed sources ask "which row holds this key?" for 10k keys against 10M, aggregations
"which slot holds this group?", sorts and selects "where is this row key?": each at a cost
that follows the batch, not the map. :class:`U64Map` answers whole arrays at a time:
open addressing with linear probing over numpy arrays, where one probe *round* advances
every still-unresolved key of the batch at once. Rounds are few because the load stays
low (at most 1/2; rebuilt to 1/4), and once few keys are left a round reads a window of
8 slots per key: each round costs numpy calls whatever its size, and walking the longest
probe chains one slot a round made a batch of 1,000 keys pay five or six rounds.

The keys are ``uint64`` as given (hashes, row keys, encoded values); the map scrambles them
itself (a multiplicative hash on the high bits), so sequential keys spread evenly. Keys are
distinct by contract: the map stores one value per key. Exact key equality of what the
``uint64`` stands for is not this map's business (see :mod:`engine._kernels.keymap`).

A batch of a few keys (at most ``U64Map.scalar_max``) walks each probe chain with plain
integers instead: the same slots, without a round of numpy calls per probe.

Deletions leave tombstones, so lookups of other keys probing past a deleted slot still find
them; tombstones are reused by inserts and dropped by the (vectorized) rebuild that runs
when live plus dead entries pass half of the table.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.hashing import GOLDEN

__all__ = ["U64Map"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_EMPTY = -1
_DEAD = -2
_MIN_BITS = 10
#: slots a probe round reads per key once at most _FEW keys are left (see U64Map._slots)
_WINDOW = 8
_FEW = 256
#: rounds that read one slot per key whatever is left (a batch of a few keys pays no more)
_SINGLE_ROUNDS = 2
#: ... and while at most this many keys are left (a window round costs more numpy calls)
_FEW_SINGLE = 16
_STEPS = np.arange(_WINDOW, dtype=np.int64)


class U64Map:
    """Map distinct ``uint64`` keys to non-negative ``int64`` values, whole arrays at a time.

    Every method takes arrays and loops over probe rounds, never over keys. Values must be
    ``>= 0`` (negative values mark empty and deleted slots). Memory: 20 bytes per slot, so
    40-80 bytes per entry.

    Parameters
    ----------
    capacity
        Entries to make room for up front (the table grows by itself as needed).

    Examples
    --------
    >>> m = U64Map()
    >>> m.insert(np.array([7, 9], dtype=np.uint64), np.array([0, 1]))
    >>> m.lookup(np.array([9, 8, 7], dtype=np.uint64)).tolist()
    [1, -1, 0]
    """

    #: batches of at most this many keys are looked up one probe chain at a time, as plain
    #: integers: a round of numpy calls costs more than a few keys' chains (tests change it)
    scalar_max = 8

    def __init__(self, capacity: int = 0) -> None:
        self._alloc(capacity)
        self.count = 0

    def _alloc(self, need: int) -> None:
        bits = max(_MIN_BITS, int(np.ceil(np.log2(max(need, 2) * 4))))  # load 1/4 after a rebuild
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1  # slots are int64: numpy indexes with them without a cast
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._vals = np.full(1 << bits, _EMPTY, dtype=np.int64)
        self._claim = np.zeros(1 << bits, dtype=np.int32)  # scratch for inserts
        self._dead = 0

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """Bytes held by the table's arrays."""
        return int(self._keys.nbytes + self._vals.nbytes + self._claim.nbytes)

    def _home(self, h: U64) -> I64:
        # integer arithmetic on arrays wraps silently (no errstate needed: entering one
        # costs more than a few keys' probe walks); the slot fits in int64, and int64
        # indexes cost a third of what uint64 ones do (numpy casts those on every gather)
        home: I64 = ((np.asarray(h, dtype=np.uint64) * GOLDEN) >> self._shift).view(np.int64)
        return home

    def _slots(self, h: U64) -> I64:
        """Slot of each key, ``-1`` where absent.

        The first round, and every round while more than :data:`_FEW` keys are
        unresolved, reads one slot per key (most keys end at their home slot, and a batch
        of a few keys pays no more than that); after it, a round reads a window of
        :data:`_WINDOW` slots per key (one 2-d gather), so the keys with long probe chains
        end in one or two rounds, not one round per slot of their chain, unless at most
        :data:`_FEW_SINGLE` keys are left for the second round (one slot each: a window
        round costs more calls). A key resolves at the first slot holding it (a hit) or
        empty (absent); dead slots are passed.
        """
        if h.size <= self.scalar_max:
            return self._slots_few(h)
        return self._probe(h, False)

    def _probe(self, h: U64, values: bool, ends: I64 | None = None) -> I64:
        """:meth:`_slots` of more than a few keys; with ``values``, each key's value
        instead of its slot (``-1`` where absent either way). With ``ends`` (``-1`` per
        key), an absent key's entry there becomes the empty slot its probe ended at.

        The first round reads every key's home slot without compressing anything (most
        keys end there); the keys left go on from the slot after it."""
        keys, vals, mask = self._keys, self._vals, self._mask
        s = self._home(h)
        v = vals.take(s)
        hit = (v >= 0) & (keys.take(s) == h)
        out = np.where(hit, v if values else s, -1)
        if ends is not None:
            empty = v == _EMPTY
            ends[empty] = s[empty]
        idx = np.flatnonzero(~hit & (v != _EMPTY))
        if idx.size == 0:
            return out
        s, hh = (s[idx] + 1) & mask, h[idx]
        single = _SINGLE_ROUNDS - 1
        while idx.size:
            if (single and idx.size <= _FEW_SINGLE) or idx.size > _FEW:
                single = max(single - 1, 0)
                v = vals.take(s)
                hit = (v >= 0) & (keys.take(s) == hh)
                out[idx[hit]] = (v if values else s)[hit]
                if ends is not None:
                    empty = v == _EMPTY
                    ends[idx[empty]] = s[empty]
                go = ~hit & (v != _EMPTY)
                idx, s, hh = idx[go], (s[go] + 1) & mask, hh[go]
                continue
            win = (s[:, None] + _STEPS) & mask
            vw = vals.take(win)
            hitw = (vw >= 0) & (keys.take(win) == hh[:, None])
            stop = hitw | (vw == _EMPTY)
            first = stop.argmax(axis=1)
            rows = np.arange(idx.size)
            done = stop[rows, first]
            found = done & hitw[rows, first]
            out[idx[found]] = (vw if values else win)[found, first[found]]
            if ends is not None:
                end = done & ~found
                ends[idx[end]] = win[end, first[end]]
            go = ~done
            idx, s, hh = idx[go], (s[go] + _WINDOW) & mask, hh[go]
        return out

    def _slots_few(self, h: U64) -> I64:
        """:meth:`_slots` of a few keys: each one's probe chain walked with plain integers."""
        return np.array(self._walk_few(h), dtype=np.int64)

    def _walk_few(self, h: U64, ends: list[int] | None = None) -> list[int]:
        """Slot of each of a few keys (``-1``: absent), walked as Python integers; with
        ``ends``, each key's end slot is appended to it (the empty slot where an absent
        key's walk stopped, ``-1`` for a present key)."""
        # the (contiguous) arrays' memoryviews: indexing one gives a Python int in half
        # the time ``ndarray.item`` takes
        keys, vals = self._keys.data, self._vals.data
        mask, empty = int(self._mask), _EMPTY
        out = []
        for k, s in zip(h.tolist(), self._home(h).tolist(), strict=True):  # <= scalar_max keys
            while True:  # a hit, or an empty slot: absent; dead slots are passed
                v = vals[s]
                if v == empty or (v >= 0 and keys[s] == k):
                    out.append(s if v >= 0 else -1)
                    if ends is not None:
                        ends.append(-1 if v >= 0 else s)
                    break
                s = (s + 1) & mask
        return out

    def lookup(self, h: U64) -> I64:
        """Value per key, ``-1`` where absent."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size <= self.scalar_max:
            vals = self._vals
            return np.array([vals.item(s) if s >= 0 else -1 for s in self._walk_few(h)],
                            dtype=np.int64)
        return self._probe(h, True)

    def lookup_ends(self, h: U64) -> tuple[I64, I64]:
        """:meth:`lookup`, and for each absent key the empty slot its probe ended at
        (``-1`` for present keys): where :meth:`insert_at` puts it."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size <= self.scalar_max:  # a few keys: their chains walked as plain integers
            vals = self._vals
            out: list[int] = []
            end: list[int] = []
            for s in self._walk_few(h, end):
                out.append(vals.item(s) if s >= 0 else -1)
            return np.array(out, dtype=np.int64), np.array(end, dtype=np.int64)
        ends = np.full(h.size, -1, dtype=np.int64)
        return self._probe(h, True, ends), ends

    def insert_at(self, h: U64, values: I64, ends: I64) -> None:
        """:meth:`insert` of keys absent and distinct, given the ``ends`` a
        :meth:`lookup_ends` of them returned, with no change to the map since.

        Each key takes the empty slot its probe ended at (lookups of it walk from its home
        past occupied and dead slots to there): one round, no probing. Keys sharing an
        end slot, keys without one (``-1``), and every key when the table must grow, are
        placed as :meth:`insert` places them."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        if 2 * (self.count + self._dead + h.size) > self._vals.size:
            self.insert(h, values)
            return
        if h.size == 1 and ends[0] >= 0:  # one key (a cycle's one new key): no claim round
            at = int(ends[0])
            self._keys[at], self._vals[at] = h[0], values[0]
            self.count += 1
            return
        idx = np.arange(h.size, dtype=np.int32)
        has = ends >= 0
        cs, fi = (ends, idx) if has.all() else (ends[has], idx[has])
        claim = self._claim
        claim[cs] = fi
        won = claim.take(cs) == fi
        ws, wi = cs[won], fi[won]
        self._keys[ws] = h[wi]
        self._vals[ws] = values[wi]
        self.count += h.size
        if ws.size < h.size:
            rest = np.ones(h.size, dtype=bool)
            rest[wi] = False
            self._place(h[rest], values[rest])

    def insert(self, h: U64, values: I64) -> None:
        """Add keys known to be absent and distinct among themselves, with their values."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        if 2 * (self.count + self._dead + h.size) > self._vals.size:
            live = self._vals >= 0
            k, v = self._keys[live], self._vals[live]
            self._alloc(self.count + h.size)
            if k.size:
                self._place(k, v)
        self._place(h, values)
        self.count += h.size

    def _place(self, h: U64, values: I64) -> None:
        """Store each key in the first free (empty or dead) slot from its home on.

        Each round, each key wants the first free slot from where it stands: one slot read
        per key in the first round and while many are left, a window of :data:`_WINDOW`
        slots once at most :data:`_FEW` are (as :meth:`_slots`). Among keys wanting one slot, one claims it: each
        scatters its index into the slot and keeps the slot if it reads itself back (no
        sort). A key that lost goes on from the slot it lost (now taken), a key that saw no
        free slot from the slot after those it read.
        """
        idx = np.arange(h.size, dtype=np.int32)
        s = self._home(h)
        keys, vals, claim, mask = self._keys, self._vals, self._claim, self._mask
        single = _SINGLE_ROUNDS
        while idx.size:
            if (single and (single == _SINGLE_ROUNDS or idx.size <= _FEW_SINGLE)) or idx.size > _FEW:
                single = max(single - 1, 0)
                some = vals.take(s) < 0
                fs, step = s, 1
            else:
                win = (s[:, None] + _STEPS) & mask
                free = vals.take(win) < 0
                first = free.argmax(axis=1)
                rows = np.arange(idx.size)
                some, fs, step = free[rows, first], win[rows, first], _WINDOW
            cand = np.flatnonzero(some)
            fi, cs = idx[cand], fs[cand]
            claim[cs] = fi
            won = claim.take(cs) == fi
            ws = cs[won]
            if self._dead:
                self._dead -= int(np.count_nonzero(vals.take(ws) == _DEAD))
            keys[ws] = h[fi[won]]
            vals[ws] = values[fi[won]]
            if cand.size == idx.size and won.all():
                return
            nxt = (s + step) & mask  # saw no free slot: after those it read
            nxt[cand] = cs  # lost its slot: from that slot on (now taken)
            go = np.ones(idx.size, dtype=bool)
            go[cand[won]] = False
            idx, s = idx[go], nxt[go]

    def delete(self, h: U64) -> None:
        """Remove keys (absent ones are ignored)."""
        s = self._slots(np.asarray(h, dtype=np.uint64))
        s = s[s >= 0]
        self._vals[s] = _DEAD
        self._dead += s.size
        self.count -= s.size

    def set_values(self, h: U64, values: I64) -> None:
        """Change the values of keys that are present (absent keys are ignored)."""
        s = self._slots(np.asarray(h, dtype=np.uint64))
        found = s >= 0
        self._vals[s[found]] = np.asarray(values, dtype=np.int64)[found]

    def items(self) -> tuple[U64, I64]:
        """``(keys, values)`` of every entry, in no particular order."""
        live = self._vals >= 0
        return self._keys[live], self._vals[live]

    def clear(self) -> None:
        """Remove every entry (keeps the current table size)."""
        self._vals.fill(_EMPTY)
        self.count = 0
        self._dead = 0
