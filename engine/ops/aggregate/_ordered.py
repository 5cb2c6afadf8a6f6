"""Per-group rows in the order of one column: the state behind sorted_first and sorted_last.

:class:`OrderedRows` answers, for a batch of groups at once, "which row has the smallest
(largest) value of the order column, the smallest (largest) row key among equal values",
through any change: rows added, removed, modified, moved between groups or shifted.
Rows whose order value is null (or NaN) are not held: they are never a group's answer.

Layout: a trie per group over the rows' values, each value a sequence of order-preserving
``uint64`` words — one for a number (:func:`~engine.ops.aggregate._keys.encode`), one per
seven bytes for a string or binary (:class:`~engine.ops.aggregate._keys.StringWords`):

* **nodes** — ids for the ``(parent, word)`` pairs held, with the number of rows under
  each; a node's parent is its group (``-1 - slot``) for a value's first word, else the
  node of the word before. A node is a *leaf* where its value ends (every node of a
  number; a string's word with a marker below 8), and holds the rows with exactly that
  value in its group;
* **ordering** — a :class:`~engine.ops.aggregate._sortedset.ValueMultiset` of ``(slot,
  first word)`` counting rows (``top``), and one of ``(node, next word)`` for the nodes
  that go on (``deep``, strings only), each live pair carrying its node's id (they are
  the nodes' only index: a value's node is found by searching its pair): the smallest
  value of a group is its smallest first word's node, then that node's smallest next
  word's, and so on to a leaf — one batched min/max query per word of the longest value
  asked for, never a scan of a group;
* **ties** — a :class:`~engine.ops.aggregate._sortedset.RowKeySet` of the leaves' row
  keys (the leaf is its "group"): the smallest or largest row key among the rows with the
  value, following parent shifts.

A cycle removes the rows leaving groups (previous key space), moves the shifted ones, then
adds the rows joining groups (current key space); row counts change along each row's path
with one ``np.unique`` per level (leaving and joining rows netted in one pass), and nodes
left without rows are dropped. Cost per cycle: ``O(changed rows * words per value)`` numpy
work plus the sorted structures' ``O(log N)`` searches (their LSM merges amortized), and
``O(rows moved)`` for a parent shift. Memory: the row-key set (~120 bytes per held row)
plus a node and a multiset entry per distinct value per group (per word, for strings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.ids import IdAllocator
from engine.columns import numpy_storage_dtype
from engine.errors import UpdateInvariantError
from engine.ops.aggregate._keys import StringWords, encode, valid_mask
from engine.ops.aggregate._sortedset import RowKeySet, ValueMultiset, lex_order
from engine.ops.aggregate._states import Events, State, grown_to

__all__ = ["OrderedRows", "OrderedStrings"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]
Levels = list[tuple[I64, U64]]  # per word: (which held rows have it, the word)
Changes = tuple[I64, U64, I64, I64]  # a multiset's (group, word, rows, node)

_EMPTY_I = np.empty(0, dtype=np.int64)


class OrderedRows:
    """The rows of each group in order of one fixed-width column (numbers, bools,
    temporals), ties by row key; strings and binaries get :class:`OrderedStrings`
    (:meth:`create` picks). See the module docstring."""

    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = True

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> OrderedRows:
        return cls() if numpy_storage_dtype(types[0]) is not None else OrderedStrings()

    def __init__(self) -> None:
        self.top = ValueMultiset(ids=True)  # (slot, first word) -> rows, and its node
        self.deep = ValueMultiset(ids=True)  # (node, next word) -> rows, and its node (strings)
        self.ids = IdAllocator()  # node ids; freed ones are reusable from the next cycle
        self.n_parent = np.zeros(1024, dtype=np.int64)  # -1 - slot for a first word
        self.n_word = np.zeros(1024, dtype=np.uint64)
        self.n_rows = np.zeros(1024, dtype=np.int64)  # rows under the node
        self.rows = RowKeySet()  # leaf -> its rows' keys

    # values as words ---------------------------------------------------------------
    def _levels(self, values: Any) -> tuple[Mask, Levels]:
        """Which rows have an order value, and the words of those rows, level by level."""
        vals, valid = values
        ok = valid_mask(vals, valid)
        held = vals if ok.all() else vals[ok]
        return ok, [(np.arange(held.size, dtype=np.int64), encode(held))]

    def _goes_on(self, words: U64) -> Mask:
        """Which nodes (by their words) are not leaves."""
        return np.zeros(words.size, dtype=bool)

    # nodes -------------------------------------------------------------------------
    def _alloc(self, n: int) -> I64:
        ids = self.ids.allocate(n)
        cap = self.ids.end
        self.n_parent, self.n_word = grown_to(self.n_parent, cap), grown_to(self.n_word, cap)
        self.n_rows = grown_to(self.n_rows, cap)
        return ids

    def _intern(self, parent: I64, words: U64, first: bool) -> I64:
        """The node of each ``(parent, word)`` (``first``: the values' first words, whose
        parents are groups), made where it is new: a pair held at the start of the cycle is
        live in its multiset, which carries its node (the cycle's changes to the multisets
        wait until its adds are in, so a node the cycle's removes emptied is found again)."""
        ids = self.top.ids_of(-1 - parent, words) if first else self.deep.ids_of(parent, words)
        miss = np.flatnonzero(ids < 0)
        if miss.size:  # one new node per distinct pair
            o = miss[np.argsort(words[miss])]
            w = words[o]
            tie = np.flatnonzero(w[1:] == w[:-1])
            if tie.size:  # words shared by rows: order each such run by parent too
                run = np.union1d(tie, tie + 1)
                wr = w[run]
                which = np.cumsum(np.concatenate(([False], wr[1:] != wr[:-1])))  # the run of each
                o[run] = o[run][lex_order(which, parent[o[run]].view(np.uint64))]
            p, w = parent[o], words[o]
            starts = np.ones(o.size, dtype=bool)
            starts[1:] = (p[1:] != p[:-1]) | (w[1:] != w[:-1])
            new = self._alloc(int(np.count_nonzero(starts)))
            ids[o] = new[np.cumsum(starts) - 1]
            self.n_parent[new], self.n_word[new], self.n_rows[new] = p[starts], w[starts], 0
        return ids

    def _count(self, leaves: I64, signs: I64, top: list[Changes], deep: list[Changes]) -> I64:
        """Add ``signs[i]`` (-1: a row leaves, +1: one joins) to the counts along the path of
        ``leaves[i]``, appending the multisets' changes to ``top`` and ``deep``; returns the
        nodes left without rows (distinct)."""
        nodes, inv = np.unique(leaves, return_inverse=True)
        d = np.bincount(inv.reshape(-1), weights=signs, minlength=nodes.size).astype(np.int64)
        emptied = []
        while nodes.size:  # one round per word: leaves, their parents, ...
            after = self.n_rows[nodes] + d  # nodes are distinct: no lost updates
            if (after < 0).any():
                raise UpdateInvariantError("A1", "sorted_first/last removed a row it does not hold")
            emptied.append(nodes[after == 0])
            self.n_rows[nodes] = after
            par, words = self.n_parent[nodes], self.n_word[nodes]
            first = par < 0
            if first.all():  # numbers: the one round
                top.append((-1 - par, words, d, nodes))
                break
            top.append((-1 - par[first], words[first], d[first], nodes[first]))
            on = ~first
            deep.append((par[on], words[on], d[on], nodes[on]))
            nodes, inv = np.unique(par[on], return_inverse=True)
            d = np.bincount(inv.reshape(-1), weights=d[on], minlength=nodes.size).astype(np.int64)
        return np.concatenate(emptied) if len(emptied) > 1 else emptied[0] if emptied else _EMPTY_I

    @staticmethod
    def _update(multiset: ValueMultiset, changes: list[Changes]) -> None:
        """One update of ``multiset`` with the cycle's ``changes`` (a row moving within a
        group nets out there)."""
        if len(changes) == 1:
            multiset.update(*changes[0])
        elif changes:
            multiset.update(*(np.concatenate(c) for c in zip(*changes, strict=True)))

    # the cycle -----------------------------------------------------------------------
    def apply(self, ev: Events, minus: Sequence[Any], plus: Sequence[Any]) -> I64:
        leaves = _EMPTY_I
        if ev.nm:  # previous key space; rows without an order value are not held
            leaves = self.rows.discard_keys(ev.minus_keys)
            leaves = leaves[leaves >= 0]
        gone = leaves.size
        prev, cur = ev.shifted
        if prev.size:
            held = self.rows.groups_of(prev) >= 0
            self.rows.shift(prev[held], cur[held])
        if ev.slots.size > ev.nm:  # current key space
            ok, levels = self._levels(plus[0])
            parent = -1 - ev.slots[ev.nm :][ok]
            node = np.empty(parent.size, dtype=np.int64)
            for k, (at, words) in enumerate(levels):  # a loop per word of the longest value, not per row
                node[at] = self._intern(parent[at], words, k == 0)
                parent[at] = node[at]
            self.rows.insert_keys(node, ev.plus_keys[ok])
            leaves = np.concatenate((leaves, node))
        if leaves.size == 0:
            return ev.touched
        top: list[Changes] = []
        deep: list[Changes] = []
        signs = np.ones(leaves.size, dtype=np.int64)
        signs[:gone] = -1
        emptied = self._count(leaves, signs, top, deep)  # a row moving within a node nets out
        self._update(self.top, top)
        self._update(self.deep, deep)
        if emptied.size:  # nodes left without rows
            self.ids.free(emptied)
            self.ids.release()
        return ev.touched

    def ends(self, slots: I64, largest: bool) -> tuple[I64, Mask]:
        """Each group's first row in order (``largest``: its last) — the row key, and
        whether the group holds a row with an order value (else the key is garbage)."""
        node, found = self.top.extreme_ids(slots, largest)
        hit = np.flatnonzero(found)
        node = node[hit]
        on = np.flatnonzero(self._goes_on(self.n_word[node]))
        while on.size:  # one round per word, for the groups whose best value goes on
            node[on], below = self.deep.extreme_ids(node[on], largest)
            if not below.all():
                raise UpdateInvariantError("A1", "sorted_first/last lost the rest of a value it holds")
            on = on[self._goes_on(self.n_word[node[on]])]
        keys = np.zeros(slots.size, dtype=np.int64)
        rows, _ = self.rows.max_of(node) if largest else self.rows.min_of(node)
        keys[hit] = rows.view(np.int64)
        return keys, found


class OrderedStrings(OrderedRows):
    """:class:`OrderedRows` of a string or binary column: bytewise order, a node per seven
    bytes (:class:`~engine.ops.aggregate._keys.StringWords`)."""

    arrow: ClassVar[bool] = True

    def _levels(self, values: Any) -> tuple[Mask, Levels]:
        arr: pa.Array = values
        ok = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count \
            else np.ones(len(arr), dtype=bool)
        sw = StringWords(arr.filter(pa.array(ok)) if arr.null_count else arr)
        levels: Levels = []
        k = 0
        while True:
            at = sw.rows_at(k)
            if at.size == 0:
                return ok, levels
            levels.append((at, sw.words(k, at)))
            k += 1

    def _goes_on(self, words: U64) -> Mask:
        return StringWords.goes_on(words)
