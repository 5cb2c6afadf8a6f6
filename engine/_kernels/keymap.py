"""The one collision policy: hash, then verify equality of the real key values.

A keyed source maps keys to row keys, an aggregation group keys to slots, a join key
values to group ids. Each is an :class:`ExactKeyMap`: a map from key tuples to the
caller's non-negative ``int64`` ids in which a 64-bit hash (:mod:`engine._kernels.hashing`)
finds candidates and the key values decide. Two distinct keys whose hashes are equal are
two entries, never one and never an error.

Layout: a :class:`~engine._kernels.hashmap.U64Map` from each hash to the id of its first
entry (the *head*), plus a second one from id to the next id with the same hash, holding
only the rare chained entries. Every method works on whole batches: a lookup probes all
hashes at once, verifies all candidates with one call of the caller's ``same``, and walks
chains only for the rows whose candidate was a different key. Deleting an entry relinks
its chain, so the other keys sharing its hash stay findable.

Who verifies: callers that already store their keys (keyed sources by row key,
aggregations by slot) pass ``same(probe_index, candidate_id) -> bool mask`` against their
own storage; callers that store none (joins) use :class:`StoredKeyMap`, which keeps one
copy of each distinct key in Arrow. Exact keys (:func:`~engine._kernels.hashing.exact_hash`:
one integer-like column) are never verified: their hash is a bijection of the value.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.hashing import Same, exact_hash, group_equal, rows_equal_at
from engine._kernels.hashmap import U64Map
from engine._kernels.rowkeymap import RowKeyMap
from engine._kernels.rowstore import FlatRowStore, RowStore

__all__ = ["ExactKeyMap", "IntKeyMap", "StoredKeyMap"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_EMPTY = np.empty(0, dtype=np.int64)


def _runs(sorted_h: U64) -> Mask:
    """True where a run of equal values begins."""
    first = np.empty(sorted_h.size, dtype=bool)
    if sorted_h.size:
        first[0] = True
        np.not_equal(sorted_h[1:], sorted_h[:-1], out=first[1:])
    return first


class ExactKeyMap:
    """Key tuples -> non-negative ``int64`` ids; a hash finds candidates, ``same`` decides.

    The map never sees key values: methods take each key's hash, and lookups take a
    ``same(i, ids)`` callback answering, per pair, whether the probe at position ``i[k]``
    has the key of entry ``ids[k]`` (vectorized, over the caller's own key storage).

    Parameters
    ----------
    exact
        The hash is injective (:func:`~engine._kernels.hashing.exact_hash`): equal hashes
        prove equal keys, ``same`` is never called and no chains exist.

    Examples
    --------
    Two keys with one hash stay apart:

    >>> keys = ["a", "b"]
    >>> m = ExactKeyMap(exact=False)
    >>> m.insert(np.array([5, 5], dtype=np.uint64), np.array([0, 1]))
    >>> probe = ["b", "c"]
    >>> same = lambda i, ids: np.array([probe[p] == keys[d] for p, d in zip(i, ids)], dtype=bool)
    >>> m.lookup(np.array([5, 5], dtype=np.uint64), same).tolist()
    [1, -1]
    """

    def __init__(self, exact: bool) -> None:
        self.exact = exact
        self._heads = U64Map()  # hash -> id of its first entry
        self._next = U64Map()  # id -> next id with the same hash (chained entries only)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def chained(self) -> int:
        """Entries that share their hash with an earlier one (collisions held apart)."""
        return len(self._next)

    def lookup(self, h: U64, same: Same | None) -> I64:
        """Id per probe hash, ``-1`` where no entry has the probe's key.

        ``same`` may be ``None`` only for an exact map; it is called with candidate pairs
        only (equal hashes), once per chain round: almost always once in all.
        """
        return self._lookup(np.asarray(h, dtype=np.uint64), same)[0]

    def _lookup(self, h: U64, same: Same | None, ends: I64 | None = None) -> tuple[I64, I64]:
        """:meth:`lookup`, and the head id of each probe's hash (``-1``: no entry has it).
        With ``ends``, the heads' map writes there where each absent hash would go
        (:meth:`U64Map.lookup_ends`)."""
        if ends is None:
            heads = cand = self._heads.lookup(h)
        else:
            heads, ends[:] = self._heads.lookup_ends(h)
            cand = heads
        if self.exact:
            return cand, heads
        assert same is not None, "an inexact ExactKeyMap needs same() to verify candidates"
        out = np.full(h.size, -1, dtype=np.int64)
        idx = np.flatnonzero(cand >= 0)
        cand = cand[idx]
        while idx.size:  # one round per chain link: rows whose candidate was another key
            ok = same(idx, cand)
            out[idx[ok]] = cand[ok]
            if not self._next.count or ok.all():
                break
            idx, cand = idx[~ok], self._next.lookup(cand[~ok].view(np.uint64))
            more = cand >= 0
            idx, cand = idx[more], cand[more]
        return out, heads

    def insert(self, h: U64, ids: I64) -> None:
        """Add entries whose keys are absent from the map and distinct among themselves.

        New keys may share their hash with present ones or with each other: they are
        chained in front of the present entries.
        """
        self._insert(np.asarray(h, dtype=np.uint64), np.asarray(ids, dtype=np.int64), None)

    def _insert(self, h: U64, ids: I64, old: I64 | None, ends: I64 | None = None,
                distinct: bool = False) -> None:
        """:meth:`insert`; ``old``, if given, is each hash's head id now (``-1``: none),
        and ``ends`` where the heads' map would put each absent hash (from the lookup
        that found ``old``, the map unchanged since); ``distinct``: the hashes ``h`` are
        known to differ from each other (no sort to find out)."""
        if h.size == 0:
            return
        self.count += h.size
        if self.exact:
            if ends is None:
                self._heads.insert(h, ids)
            else:
                self._heads.insert_at(h, ids, ends)
            return
        if old is None:
            old = self._heads.lookup(h)
        fresh = old < 0
        if fresh.all():
            if not distinct:
                hs = np.sort(h)
                distinct = hs.size < 2 or bool((hs[1:] != hs[:-1]).all())
            if distinct:  # the common case
                if ends is None:
                    self._heads.insert(h, ids)
                else:
                    self._heads.insert_at(h, ids, ends)
                return
        order = np.argsort(h, kind="stable")
        hs, is_, olds = h[order], ids[order], old[order]
        first = _runs(hs)
        last = np.empty(hs.size, dtype=bool)
        last[:-1] = first[1:]
        last[-1] = True
        # within a run: each new id points to the next; the run's last to the old head
        inner = np.flatnonzero(~last)
        self._next.insert(is_[inner].view(np.uint64), is_[inner + 1])
        tail = np.flatnonzero(last & (olds >= 0))
        self._next.insert(is_[tail].view(np.uint64), olds[tail])
        head = np.flatnonzero(first)
        had = olds[head] >= 0
        self._heads.set_values(hs[head[had]], is_[head[had]])
        self._heads.insert(hs[head[~had]], is_[head[~had]])

    def delete(self, h: U64, ids: I64) -> None:
        """Remove the entries ``(h[k], ids[k])``, which must be present."""
        h = np.asarray(h, dtype=np.uint64)
        ids = np.asarray(ids, dtype=np.int64)
        if h.size == 0:
            return
        self.count -= h.size
        if self.exact or not self._next.count:
            self._heads.delete(h)
            return
        alone = (self._heads.lookup(h) == ids) & (self._next.lookup(ids.view(np.uint64)) < 0)
        self._heads.delete(h[alone])
        if not alone.all():
            self._relink(h[~alone], ids[~alone])

    def _relink(self, h: U64, gone: I64) -> None:
        """Drop ``gone`` from the chains of the hashes ``h`` and link the survivors again."""
        hashes = np.unique(h)
        cur = self._heads.lookup(hashes)
        grp = np.arange(hashes.size, dtype=np.int64)
        m_grp: list[I64] = []
        m_id: list[I64] = []
        while cur.size:  # one round per chain link, over all chains at once
            m_grp.append(grp)
            m_id.append(cur)
            nxt = self._next.lookup(cur.view(np.uint64))
            more = nxt >= 0
            grp, cur = grp[more], nxt[more]
        g, members = np.concatenate(m_grp), np.concatenate(m_id)
        order = np.argsort(g, kind="stable")  # chain order within each hash
        g, members = g[order], members[order]
        self._next.delete(members.view(np.uint64))
        self._heads.delete(hashes)
        keep = ~np.isin(members, gone)
        g, members = g[keep], members[keep]
        if members.size == 0:
            return
        first = _runs(g.view(np.uint64))
        nxt_same = np.flatnonzero(~first[1:])  # members[k + 1] follows members[k]
        self._next.insert(members[nxt_same].view(np.uint64), members[nxt_same + 1])
        self._heads.insert(hashes[g[first]], members[first])

    def intern(self, h: U64, same: Same | None, same_batch: Same | None,
               new_ids: Callable[[int], I64]) -> tuple[I64, I64, I64]:
        """Id per row, adding the rows' keys that are not present yet.

        Rows of the batch with equal keys get one id; new keys get ids from
        ``new_ids(count)``.

        Parameters
        ----------
        h
            Hash per row.
        same
            ``same(i, ids)``: row ``i[k]`` has the key of entry ``ids[k]`` (``None`` if exact).
        same_batch
            ``same_batch(i, j)``: rows ``i[k]`` and ``j[k]`` have equal keys (``None`` if exact).
        new_ids
            Allocates ``count`` new ids.

        Returns
        -------
        ids
            Id per row.
        added
            The new ids, in order of their first row.
        first
            Per new id, the first row that has its key (to store key values from).
        """
        h = np.asarray(h, dtype=np.uint64)
        ends = np.empty(h.size, dtype=np.int64)
        ids, heads = self._lookup(h, same, ends)
        miss = np.flatnonzero(ids < 0)
        if miss.size == 0:
            return ids, _EMPTY, _EMPTY
        if miss.size == 1:  # one new key (a few changed rows): nothing to group
            added = np.asarray(new_ids(1), dtype=np.int64)
            ids[miss] = added
            self._insert(h[miss], added, heads[miss], ends[miss], True)
            return ids, added, miss
        if self.exact or same_batch is None:
            order, starts = group_equal(h[miss], None)
        else:
            order, starts = group_equal(h[miss], lambda i, j: same_batch(miss[i], miss[j]))
        head_h = h[miss[order[starts]]]  # each new key's hash, ascending when no two share one
        distinct = head_h.size < 2 or bool((head_h[1:] > head_h[:-1]).all())
        sizes = np.diff(np.append(starts, order.size))
        first_pos = np.minimum.reduceat(order, starts)
        by_row = np.argsort(first_pos)  # groups in order of their first row
        first = miss[first_pos[by_row]]
        added = np.asarray(new_ids(first.size), dtype=np.int64)
        gid = np.empty(starts.size, dtype=np.int64)
        gid[by_row] = added
        ids[miss[order]] = np.repeat(gid, sizes)
        self._insert(h[first], added, heads[first], ends[first], distinct)  # as the lookup found them
        return ids, added, first


class IntKeyMap:
    """One integer-like key column's values -> non-negative ``int64`` ids: the
    :class:`ExactKeyMap` of an exact key, over the values themselves
    (:func:`~engine._kernels.hashing.exact_values`, as ``uint64`` bits) instead of their hashes.

    Values are usually dense (a source keyed by an id, a counter, a date): while every
    value is non-negative they live in a :class:`~engine._kernels.rowkeymap.RowKeyMap`,
    whose dense layout answers a lookup with one ``take`` where a hash map probes (and
    which turns hashed by itself when the values are sparse). The first negative value
    moves every entry into a :class:`~engine._kernels.hashmap.U64Map` over the values'
    bits, once and for good. Same methods as an exact :class:`ExactKeyMap`.

    Examples
    --------
    >>> m = IntKeyMap()
    >>> m.insert(np.array([3, 4], dtype=np.uint64), np.array([0, 1]))
    >>> m.lookup(np.array([4, 5], dtype=np.uint64), None).tolist()
    [1, -1]
    >>> m.insert(np.array([-7], dtype=np.int64).view(np.uint64), np.array([2]))
    >>> m.lookup(np.array([-7, 3], dtype=np.int64).view(np.uint64), None).tolist(), m.layout
    ([2, 0], 'hashed')
    """

    exact = True

    def __init__(self) -> None:
        self._rows: RowKeyMap | None = RowKeyMap()  # while every value is >= 0
        self._bits = U64Map()  # afterwards

    def __len__(self) -> int:
        return self.count

    @property
    def count(self) -> int:
        """How many entries the map holds."""
        return self._rows.count if self._rows is not None else self._bits.count

    @property
    def layout(self) -> str:
        """The row-key map's layout (``"dense"``, ``"regions"``, ``"hashed"``), or
        ``"hashed"`` once a negative value came."""
        return self._rows.layout if self._rows is not None else "hashed"

    def lookup(self, h: U64, same: Same | None = None) -> I64:  # noqa: ARG002 - exact: never verified
        """Id per value (``uint64`` bits), ``-1`` where absent."""
        h = np.asarray(h, dtype=np.uint64)
        if self._rows is None:
            return self._bits.lookup(h)
        return self._rows.lookup(h.view(np.int64))  # a negative value is absent from it

    def insert(self, h: U64, ids: I64) -> None:
        """Add entries whose values are absent and distinct."""
        h = np.asarray(h, dtype=np.uint64)
        ids = np.asarray(ids, dtype=np.int64)
        if h.size == 0:
            return
        if self._rows is not None:
            v = h.view(np.int64)
            if int(v.min()) >= 0:
                self._rows.insert(v, ids)
                return
            held, held_ids = self._rows.items()
            self._bits.insert(held.view(np.uint64), held_ids)
            self._rows = None
        self._bits.insert(h, ids)

    def delete(self, h: U64, ids: I64) -> None:  # noqa: ARG002 - ExactKeyMap's signature
        """Remove the entries of these values, which must be present."""
        h = np.asarray(h, dtype=np.uint64)
        if h.size == 0:
            return
        if self._rows is not None:
            self._rows.remove(h.view(np.int64))
        else:
            self._bits.delete(h)


class StoredKeyMap:
    """An :class:`ExactKeyMap` that keeps its own copy of each distinct key.

    For callers that store no key values (joins). Ids are the caller's and should be
    dense (small non-negative integers, reused after deletes): the keys live in a
    :class:`~engine._kernels.rowstore.RowStore` indexed by id, or a
    :class:`~engine._kernels.rowstore.FlatRowStore` (numpy) when every key column is
    fixed-width: storing one key is then a scatter per column and checking candidates a
    gather and a compare, where Arrow levels concatenated a table each. An exact key
    stores nothing.

    Parameters
    ----------
    schema
        The key columns. Key tables given later have columns of these types (or types
        equal values hash and compare alike with, such as ``int32`` for ``int64``), matched
        by position; stored keys are cast to ``schema``.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.exact = exact_hash(schema)
        self.map = ExactKeyMap(self.exact)
        self._hash = np.zeros(1024, dtype=np.uint64)  # id -> hash
        self._keys: RowStore | FlatRowStore = (
            FlatRowStore(schema) if FlatRowStore.fits(schema) else RowStore(schema))

    def __len__(self) -> int:
        return len(self.map)

    def _fit(self, n: int) -> None:
        if n > self._hash.size:
            size = max(n, 2 * self._hash.size)
            self._hash = np.concatenate((self._hash, np.zeros(size - self._hash.size, np.uint64)))

    def _same(self, keys: pa.Table) -> Same:
        def same(i: I64, ids: I64) -> Mask:
            return self._keys.equal_at(keys, i, ids)
        return same

    def lookup(self, keys: pa.Table, h: U64) -> I64:
        """Id per row of ``keys`` (hashed as ``h``), ``-1`` where absent."""
        return self.map.lookup(h, None if self.exact else self._same(keys))

    def intern(self, keys: pa.Table, h: U64, new_ids: Callable[[int], I64]) -> tuple[I64, I64]:
        """Id per row of ``keys``, adding absent keys with ids from ``new_ids``: ``(ids, added)``."""
        same_batch = None if self.exact else (lambda i, j: rows_equal_at(keys, i, keys, j))
        ids, added, first = self.map.intern(h, None if self.exact else self._same(keys),
                                            same_batch, new_ids)
        if added.size:
            self._fit(int(added.max()) + 1)
            self._hash[added] = h[first]
            if not self.exact:  # one new key (a few changed rows): a slice, not a take
                self._keys.put(added, keys.slice(int(first[0]), 1) if first.size == 1 else keys.take(first))
        return ids, added

    def delete(self, ids: I64) -> None:
        """Remove the entries ``ids`` (present)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self.map.delete(self._hash[ids], ids)
        if not self.exact:
            self._keys.drop(ids)

    def keys_of(self, ids: I64) -> pa.Table:
        """The stored keys of present ``ids`` (inexact maps only)."""
        return self._keys.get(np.asarray(ids, dtype=np.int64))
