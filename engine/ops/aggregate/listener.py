"""Aggregation by group: ``agg_by``, ``first_by``, ``last_by``, ``count_by`` (DESIGN.md §3).

The result has one row per group of equal ``by`` values: the ``by`` columns, then one
column per :class:`Agg`. It is kept current one cycle at a time, at a cost that follows the
parent's change, never the parent's size.

Semantics (pandas ``groupby(by, dropna=False)`` where pandas has an answer):

* **Groups.** Null keys form their own group (one per distinct combination of nulls and
  values). Floats: ``-0.0`` and ``0.0`` are one key, every NaN is one key (distinct from
  null). ``by=()`` makes one group of the whole table; like Deephaven, it has *no row*
  while the parent is empty.
* **Nulls.** Every aggregation but ``count``, ``first`` and ``last`` skips nulls and
  float NaN (pandas cannot tell them apart); ``count`` counts rows. The sum and abs_sum of
  a group without values are 0, its mean/min/max/median/percentile null, its std and var
  null below two values (sample, ``ddof=1``). ``+inf`` and ``-inf`` follow IEEE
  (``inf - inf`` is NaN; std and var are NaN when a group holds an infinity).
  ``first``/``last`` take the value of the group's first/last row, null or not.
* **Weighted** (pandas has none; Deephaven's ``AggWSum``/``AggWAvg``): ``weighted_sum``
  is ``sum(x * w)`` and ``weighted_avg`` is ``sum(x * w) / sum(w)``, both over the rows
  where the value ``x`` *and* the weight ``w`` are valid (not null, not NaN). A group
  without such rows is null for both; ``weighted_avg`` is null too when its weights sum to
  0. Products follow IEEE (``inf * 0`` is NaN).
* **Order statistics.** ``percentile(col, p)`` is pandas ``quantile(p,
  interpolation="linear")``: with ``n`` sorted values ``x``, ``h = p * (n - 1)``,
  ``i = floor(h)``: ``x[i] + (x[i+1] - x[i]) * (h - i)``, or ``x[i]`` where ``h`` is whole
  or ``x[i] == x[i+1]`` (so two equal infinities give that infinity where pandas says NaN).
  ``median`` is ``percentile(col, 0.5)``: pandas ``median`` up to the last bit (pandas
  computes ``(a + b) / 2``, which differs only by rounding or when ``a + b`` overflows).
* **Types.** Each kind's output type, given its input columns' types, is the registry's
  (the table in :mod:`engine.ops.aggregate._kinds`).
* **First and last** are by parent row order (row-key order): ``first`` is the row with
  the smallest row key in the group.

What each kind reads, its output type, its checks and the state it shares with others are
the registry's (:mod:`engine.ops.aggregate._kinds`); this module iterates over kinds and
states without naming any.

Row keys and order of the result: a group's row key is assigned when the group appears and
kept for its whole life, so the rows are in order of first appearance (for the initial
build: parent row order). A group whose last row leaves is removed; its key is freed and
reused from the next cycle on, so a later group may take an earlier position. A group's
row is modified only when one of its aggregate values changed, and ``modified_columns``
names exactly the aggregates that changed in some row (key columns never change). Nothing
shifts.

How a cycle runs (every step is numpy over the changed rows, no loop per row or group):

1. Rows are grouped by hashing their ``by`` values (:func:`~engine._kernels.hashing.hash_columns`)
   and looking them up in an :class:`~engine._kernels.keymap.ExactKeyMap` (key -> slot):
   the hash finds the candidate group, the values decide, checked against the group's key
   values stored by slot (``key_cols``), so two distinct keys with equal hashes are two
   groups. One integer-like column is its own exact hash: only null-ness is compared.
   New groups get slots. Added and modified rows are hashed once, together, in the
   current key space; removed rows (and modified rows whose ``by`` values changed) in the
   previous one — or, when first/last keep a row-key index anyway, looked up there
   without reading any key.
2. Each row leaving a group is a *minus* event (previous values), each row joining one a
   *plus* event (current values); a modify that keeps its group is both, and only for the
   aggregations whose input it modified. A cycle that touches nothing the aggregation reads
   returns no update at all.
3. States (``engine.ops.aggregate._states``, ``._sums``) fold the events in per touched
   group with ``np.unique``/``np.bincount``, each state once for every aggregation sharing
   it; min/max/median/percentile (and std/var, see below) keep a per-group sorted multiset
   of values, median/percentile with a rank tree over it, and first/last a per-group
   sorted set of parent row keys that follows the parent's shifts
   (``engine.ops.aggregate._sortedset``).
4. Each aggregation's kind names the groups to evaluate again and computes their new
   values, which are compared with the current output; only real changes are written
   (with previous values tracked) and reported.

Costs per cycle: ``O(changed rows + touched groups)`` numpy work, plus for
min/max/median/percentile/std/var and first/last the sorted structures, which are LSM
trees: ``O(log N)`` searches per change and an ``O(N)`` merge every ``N/8`` new entries
(amortized ``O(1)`` per change; the merge itself pauses a cycle by tens of milliseconds per
million rows). Median and percentile add ``O(log N)`` rank-tree rounds per change and per
touched group, never a scan of a group: removing a group's median costs what any change
costs. A parent shift costs first/last ``O(rows moved)``. Memory: the group index and
per-group state arrays, and for the sorted multiset ~40 bytes per distinct value per group
(~56 with the rank tree), for first/last ~120 bytes per parent row (a row-key hash and the
sorted set).

Precision: integer sums are exact. Float sums (sum, abs_sum, the weighted sums) are
carried across cycles with two-sum compensation (a value added in one cycle and removed in
another leaves no trace). ``std`` and ``var`` sum deviations from a per-group reference
value chosen among the data near the mean (``Moments``), snap to an exact 0 when a
group's min equals its max, and recompute a group from its values when an error bound
says its state lost precision (after a change of scale, say). Within one cycle, the values a group receives are summed plainly, so an
incremental float result can differ from a fresh one in the last bits, as any two
summation orders do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.hashing import (
    Same,
    exact_hash,
    hash_columns,
    rows_equal,
    rows_equal_at,
    values_equal,
)
from engine._kernels.ids import IdAllocator
from engine._kernels.keymap import ExactKeyMap
from engine.columns import (
    ColumnSource,
    NumpyColumnSource,
    WritableColumnSource,
    compact_stale,
    make_column_source,
)
from engine.errors import SchemaError, UpdateInvariantError
from engine.ops.aggregate import agg
from engine.ops.aggregate._keys import fetch, fetch_numpy, pairs_equal
from engine.ops.aggregate._kinds import KINDS, Need, Refresh, Values, build_states
from engine.ops.aggregate._sortedset import RowKeySet
from engine.ops.aggregate._states import Cycle
from engine.ops.aggregate.spec import Agg as Agg
from engine.rowset import RowSet
from engine.table import Derivation, DerivedTable, Table, derive
from engine.update import TableUpdate

__all__ = ["Agg", "AggListener", "agg_by", "count_by", "first_by", "last_by"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]
_EMPTY_I = np.empty(0, dtype=np.int64)


# building ---------------------------------------------------------------------------------
def _as_list(by: str | Sequence[str]) -> list[str]:
    return [by] if isinstance(by, str) else list(by)


def agg_by(table: Table, aggs: Agg | Sequence[Agg], by: str | Sequence[str] = ()) -> Table:
    """One row per group of ``by`` with the aggregations ``aggs``, kept live.

    See the module docstring for null semantics, types and row order.

    Parameters
    ----------
    table
        The parent table.
    aggs
        One :class:`Agg` or a sequence of them (``tt.agg.sum("Qty")``, ...).
    by
        Group-by column name(s); ``()`` aggregates the whole table into at most one row.

    Returns
    -------
    Table
        Columns ``by`` (in order) then one column per aggregation.

    Raises
    ------
    SchemaError
        If a column is missing, an aggregation does not fit its column's type, or two
        output columns share a name.

    Examples
    --------
    >>> from engine.ops.aggregate import agg
    >>> t.agg_by([agg.sum("Qty"), agg.max("Price", "Hi")], by="Sym").to_pandas()
        Sym  Qty     Hi
    0  AAPL   30  101.5
    """
    specs = [aggs] if isinstance(aggs, Agg) else list(aggs)
    by_list = _as_list(by)
    if not specs and not by_list:
        raise SchemaError("agg_by needs at least one aggregation or one group-by column")
    for a in specs:
        if not isinstance(a, Agg):
            raise SchemaError(f"aggs must be Agg values (tt.agg.sum(...), ...), got {a!r}")
    names = table.column_names
    for c in by_list + [c for a in specs for c in KINDS[a.kind].inputs(a)]:
        if c not in names:
            raise SchemaError(f"table {table.name!r} has no column {c!r} (has: {', '.join(names)})")
    out_names = by_list + [a.name for a in specs]
    dup = sorted({n for n in out_names if out_names.count(n) > 1})
    if dup:
        raise SchemaError(f"agg_by would create duplicate output column(s) {dup}; pass name= to rename")
    fields = [table.schema.field(k) for k in by_list]
    for a in specs:
        types = [table.schema.field(c).type for c in KINDS[a.kind].inputs(a)]
        fields.append(pa.field(a.name, KINDS[a.kind].output_type(a, types, table.name)))
    schema = pa.schema(fields)

    def plan() -> Derivation:
        listener = AggListener(table, by_list, specs, schema)
        columns: dict[str, ColumnSource] = dict(listener.key_cols)
        columns.update(listener.out_cols)
        return Derivation(schema, columns, listener.initial_rowset, listener,
                          name=f"{table.name}.agg_by")

    return derive([table], plan, table_class=_AggTable)


def first_by(table: Table, by: str | Sequence[str]) -> Table:
    """The first row (smallest row key) of each group: ``by`` columns, then the others."""
    by_list = _as_list(by)
    return agg_by(table, [agg.first(c) for c in table.column_names if c not in by_list], by_list)


def last_by(table: Table, by: str | Sequence[str]) -> Table:
    """The last row (largest row key) of each group: ``by`` columns, then the others."""
    by_list = _as_list(by)
    return agg_by(table, [agg.last(c) for c in table.column_names if c not in by_list], by_list)


def count_by(table: Table, name: str, by: str | Sequence[str] = ()) -> Table:
    """Number of rows per group of ``by``, in column ``name``."""
    return agg_by(table, [agg.count(name)], by)


class _AggTable(DerivedTable):
    """The result table; compacts its Arrow-backed columns after a cycle when they bloat."""

    def _end_cycle(self) -> None:
        super()._end_cycle()
        compact_stale(self._columns.values(), self.size, self.rowset.keys)


# the listener -----------------------------------------------------------------------------
class AggListener:
    """Keeps the result of :func:`agg_by` equal to a recomputation, one cycle at a time."""

    result: Table

    def __init__(self, parent: Table, by: list[str], aggs: list[Agg], schema: pa.Schema) -> None:
        self.parent = parent
        self.graph = parent.graph
        self.by = by
        self.by_set = frozenset(by)
        self.aggs = aggs
        self.kinds = [KINDS[a.kind] for a in aggs]
        self.inputs = frozenset(c for a, k in zip(aggs, self.kinds, strict=True) for c in k.inputs(a))
        self.key_cols: dict[str, WritableColumnSource] = {
            k: make_column_source(parent.schema.field(k).type) for k in by
        }
        self.out_cols: dict[str, WritableColumnSource] = {
            a.name: make_column_source(schema.field(a.name).type) for a in aggs
        }
        # one state per distinct need (shared by the aggregations over the same columns),
        # dependencies first: the order they are fed in every cycle
        self.states = build_states([n for a, k in zip(aggs, self.kinds, strict=True) for n in k.needs(a)],
                                   lambda cols: [parent.schema.field(c).type for c in cols])
        self.rows = RowKeySet() if any(k.reads_rows for k in self.kinds) else None
        # group key -> slot: hash, then verify against key_cols (one integer-like column:
        # its hash is exact, so only null-ness is compared, against the one null group)
        self.exact_key = exact_hash([parent.schema.field(k).type for k in by])
        self.index = ExactKeyMap(exact=not by)
        self.null_slot = -1  # the group of the null key, for an exact key column
        self.size = np.zeros(16, dtype=np.int64)
        self.slot_hash = np.zeros(16, dtype=np.uint64)
        self.group_keys = IdAllocator()  # a freed group key is reused from the next cycle on
        self._in_cycle = False
        added, _, _, _ = self._process(TableUpdate.of(added=parent.rowset))
        self.initial_rowset = RowSet.from_keys(added, assume_sorted=True)

    # groups ------------------------------------------------------------------------------
    def _alloc(self, n: int) -> I64:
        slots = self.group_keys.allocate(n)
        if self.group_keys.end > self.size.size:
            cap = max(self.group_keys.end, 2 * self.size.size)
            for name in ("size", "slot_hash"):
                old = getattr(self, name)
                grown = np.zeros(cap, dtype=old.dtype)
                grown[: old.size] = old
                setattr(self, name, grown)
        return slots

    def _key_arrays(self, keys: I64, prev: bool) -> list[pa.Array]:
        return [fetch(self.parent.column(k), keys, prev) for k in self.by]

    def _lookup(self, keys: I64) -> I64:
        """Slots of rows (previous key space and values) whose group exists."""
        if keys.size == 0:
            return _EMPTY_I
        if self.rows is not None:  # the row-key structure knows every row's group
            slots = self.rows.groups_of(keys)
        else:
            arrays = self._key_arrays(keys, True)
            slots = self.index.lookup(hash_columns(arrays, self.by, keys.size), self._same_as_group(arrays))
        if (slots < 0).any():
            raise UpdateInvariantError(
                "A1", f"rows {keys[slots < 0][:10].tolist()} of {self.parent.name!r} belong to no group"
            )
        return slots

    def _assign(self, keys: I64) -> I64:
        """Slots of rows (current key space and values); new groups get slots, in order of
        their first row (so keys follow the parent's row order). Exact: a hash finds the
        group, its stored key values decide."""
        if keys.size == 0:
            return _EMPTY_I
        arrays = self._key_arrays(keys, prev=False)
        h = hash_columns(arrays, self.by, keys.size)
        slots, fresh, rows = self.index.intern(h, self._same_as_group(arrays),
                                               self._same_in_batch(arrays), self._alloc)
        if fresh.size:
            self.slot_hash[fresh] = h[rows]
            for k, arr in zip(self.by, arrays, strict=True):  # one write per key column
                self.key_cols[k].set(fresh, arr.take(pa.array(rows)))
            if self.exact_key and arrays[0].null_count:
                null = np.flatnonzero(~arrays[0].is_valid().to_numpy(zero_copy_only=False)[rows])
                if null.size:
                    self.null_slot = int(fresh[null[0]])
        return slots

    def _same_as_group(self, arrays: list[pa.Array]) -> Same | None:
        """``same(i, slots)``: row ``i`` of ``arrays`` has the key of the groups ``slots``."""
        if not self.by:
            return None
        if self.exact_key:  # equal exact hashes: equal values, or a null and one value
            probe_null = (~arrays[0].is_valid().to_numpy(zero_copy_only=False)
                          if arrays[0].null_count else None)

            def same_exact(i: I64, slots: I64) -> Mask:
                cand_null: Mask = slots == self.null_slot
                return cand_null == probe_null[i] if probe_null is not None else ~cand_null
            return same_exact
        probe = pa.Table.from_arrays(arrays, names=self.by)

        def same(i: I64, slots: I64) -> Mask:
            stored = pa.Table.from_arrays([self.key_cols[k].get(slots) for k in self.by], names=self.by)
            return rows_equal(probe.take(pa.array(i)), stored)
        return same

    def _same_in_batch(self, arrays: list[pa.Array]) -> Same | None:
        """``same(i, j)``: rows ``i`` and ``j`` of ``arrays`` have equal keys."""
        if not self.by:
            return None
        if self.exact_key:
            valid = arrays[0].is_valid().to_numpy(zero_copy_only=False) if arrays[0].null_count else None
            return None if valid is None else (lambda i, j: valid[i] == valid[j])
        probe = pa.Table.from_arrays(arrays, names=self.by)
        return lambda i, j: rows_equal_at(probe, i, probe, j)

    # the cycle ---------------------------------------------------------------------------
    def on_update(self, *updates: TableUpdate | None) -> TableUpdate | None:
        up = updates[0]
        if up is None:
            return None
        self.group_keys.release()  # keys freed last cycle may be reused from now on
        self._in_cycle = True
        try:
            added, removed, modified, cols = self._process(up)
        finally:
            self._in_cycle = False
        if not (added.size or removed.size or modified.size):
            return None
        return TableUpdate.of(
            added=RowSet.from_keys(added, assume_sorted=True),
            removed=RowSet.from_keys(removed, assume_sorted=True),
            modified=RowSet.from_keys(modified, assume_sorted=True),
            modified_columns=cols,
        )

    def _cycle(self, up: TableUpdate) -> Cycle | None:
        """Group every changed row; None when nothing this aggregation reads changed."""
        cy = Cycle(up.modified_columns)
        key_mod = bool(cy.modcols & self.by_set)
        use_mod = bool(up.modified) and (key_mod or bool(cy.modcols & self.inputs))
        if not (up.added or up.removed or use_mod):
            return None
        cy.r_keys = up.removed.keys()
        cy.a_keys = up.added.keys()
        if use_mod:
            cy.m_keys = up.modified.keys()
            cy.m_prev = up.shifted.unapply_keys(cy.m_keys)
        # previous key space: removed rows and, if a key column changed, modified rows
        old = self._lookup(np.concatenate((cy.r_keys, cy.m_prev)) if key_mod else cy.r_keys)
        # current key space: added and modified rows (one hash and lookup for both)
        cur = self._assign(np.concatenate((cy.a_keys, cy.m_keys)))
        cy.r_slot, cy.a_slot = old[: cy.r_keys.size], cur[: cy.a_keys.size]
        if use_mod:
            cy.m_new = cur[cy.a_keys.size :]
            cy.m_old = old[cy.r_keys.size :] if key_mod else cy.m_new
            cy.moved = cy.m_old != cy.m_new
        return cy

    def _process(self, up: TableUpdate) -> tuple[I64, I64, I64, frozenset[str]]:
        """Fold ``up`` in; returns (added, removed, modified) slots and modified columns."""
        cy = self._cycle(up)
        if cy is None:
            if up.shifted and self.rows is not None:
                self._shift_rows(up)
            return _EMPTY_I, _EMPTY_I, _EMPTY_I, frozenset()
        members = cy.events()
        touched = members.touched
        size_old = self.size[touched]
        size_new = size_old + np.bincount(members.inv, weights=members.sign,
                                          minlength=touched.size).round().astype(np.int64)
        self.size[touched] = size_new
        if self.rows is not None:
            self._move_rows(up, cy)
        cx = Refresh(self.parent, cy, touched, self.size, self.states, self._apply_states(cy), self.rows)
        existed_cache: dict[int, tuple[I64, Mask, Mask]] = {}
        changed: list[I64] = []
        cols: set[str] = set()
        for a, kind in zip(self.aggs, self.kinds, strict=True):
            t = kind.touched(a, cx)
            if id(t) not in existed_cache:
                existed_cache[id(t)] = self._live(t, touched, size_old)
            live = existed_cache[id(t)]
            mod = self._write(a, live, kind.values(a, cx, live[0]) if live[0].size else None)
            if mod.size:
                changed.append(mod)
                cols.add(a.name)
        added = touched[(size_old == 0) & (size_new > 0)]
        removed = touched[(size_old > 0) & (size_new == 0)]
        if removed.size:
            self.index.delete(self.slot_hash[removed], removed)
            if self.null_slot >= 0 and (removed == self.null_slot).any():
                self.null_slot = -1
            self.group_keys.free(removed)
        modified = np.unique(np.concatenate(changed)) if len(changed) > 1 else (changed[0] if changed else _EMPTY_I)
        return added, removed, modified, frozenset(cols)

    def _apply_states(self, cy: Cycle) -> dict[Need, I64]:
        """Feed each state its events and its columns' values; returns its touched slots.

        A state sees modified rows that kept their group when it reads a modified column;
        values read once per (column, format, events) serve every state reading them."""
        out: dict[Need, I64] = {}
        fetched: dict[tuple[str, bool, bool], tuple[Any, Any]] = {}
        for need, st in self.states.items():  # dependencies first (std heals from the values)
            stay = any(c in cy.modcols for c in need.columns)
            ev = cy.events(stay)
            minus, plus = [], []
            for col in need.columns:
                key = (col, st.arrow, stay)
                if key not in fetched:
                    src = self.parent.column(col)
                    get = fetch if st.arrow else fetch_numpy
                    fetched[key] = (get(src, ev.minus_keys, True), get(src, ev.plus_keys, False))
                minus.append(fetched[key][0])
                plus.append(fetched[key][1])
            out[need] = st.apply(ev, minus, plus)
        return out

    # first / last ----------------------------------------------------------------------
    def _shift_rows(self, up: TableUpdate) -> None:
        assert self.rows is not None
        if up.shifted and self._in_cycle:
            prev, cur = up.shifted.moved_keys(self.parent.prev_rowset - up.removed)
            self.rows.shift(prev, cur)

    def _move_rows(self, up: TableUpdate, cy: Cycle) -> None:
        """Row-key structure: removals (previous keys), shift, moves and adds (current keys)."""
        assert self.rows is not None
        self.rows.remove_keys(cy.r_keys)
        self._shift_rows(up)
        mk = cy.m_keys[cy.moved]
        self.rows.remove_keys(mk)
        self.rows.insert_keys(np.concatenate((cy.m_new[cy.moved], cy.a_slot)), np.concatenate((mk, cy.a_keys)))

    # output ------------------------------------------------------------------------------
    def _live(self, t: I64, touched: I64, size_old: I64) -> tuple[I64, Mask, Mask]:
        """``(slots of t still alive, mask of those in t, which of them existed before)``."""
        live = self.size[t] > 0
        slots = t[live]
        existed = np.ones(slots.size, dtype=bool)
        if touched.size:  # membership-touched slots existed iff they had rows before
            pos = np.minimum(np.searchsorted(touched, slots), touched.size - 1)
            existed = (touched[pos] != slots) | (size_old[pos] > 0)
        return slots, live, existed

    def _write(self, a: Agg, live: tuple[I64, Mask, Mask], new: Values | None) -> I64:
        """Write the new values of ``a`` (for the live slots) where they changed; return
        the modified slots."""
        slots, _, existed = live
        if slots.size == 0 or new is None:
            return _EMPTY_I
        src = self.out_cols[a.name]
        ex = np.flatnonzero(existed)
        same = np.zeros(slots.size, dtype=bool)
        if isinstance(new, tuple):
            assert isinstance(src, NumpyColumnSource)
            vals, valid = new
            if ex.size:
                same[ex] = pairs_equal(src.get_numpy(slots[ex]), (vals[ex], None if valid is None else valid[ex]))
            write = np.flatnonzero(~same)
            if write.size:
                if self._in_cycle:
                    self.graph.track(src)
                src.set_numpy(slots[write], np.asarray(vals[write], dtype=src.dtype),
                              None if valid is None else valid[write])
        else:  # variable-width first/last: Arrow all the way
            if ex.size:
                same[ex] = values_equal(src.get(slots[ex]), new if ex.size == slots.size else new.take(pa.array(ex)))
            write = np.flatnonzero(~same)
            if write.size:
                if self._in_cycle:
                    self.graph.track(src)
                src.set(slots[write], new if write.size == slots.size else new.take(pa.array(write)))
        return slots[existed & ~same]
