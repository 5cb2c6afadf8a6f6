"""Aggregation by group: ``agg_by``, ``first_by``, ``last_by``, ``count_by`` (DESIGN.md §3).

The result has one row per group of equal ``by`` values: the ``by`` columns, then one
column per :class:`Agg`. It is kept current one cycle at a time, at a cost that follows the
parent's change, never the parent's size.

Semantics (pandas ``groupby(by, dropna=False)`` where pandas has an answer):

* **Groups.** Null keys form their own group (one per distinct combination of nulls and
  values). Floats: ``-0.0`` and ``0.0`` are one key, every NaN is one key (distinct from
  null). ``by=()`` makes one group of the whole table; like Deephaven, it has *no row*
  while the parent is empty.
* **Nulls.** Every aggregation but ``count``, ``first``, ``last`` and the sorted ones
  skips nulls and float NaN (pandas cannot tell them apart); ``count`` counts rows. The
  sum and abs_sum of a group without values are 0, its mean/min/max/median/percentile
  null, its std and var null below two values (sample, ``ddof=1``). ``+inf`` and ``-inf``
  follow IEEE (``inf - inf`` is NaN; std and var are NaN when a group holds an infinity).
  ``first``/``last`` take the value of the group's first/last row, null or not, and
  ``sorted_first``/``sorted_last`` the value of their row (chosen among the rows whose
  order value is not null or NaN).
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
* **Sorted first and last** (Deephaven's ``AggSortedFirst``/``AggSortedLast``) are by the
  order of another column: ``sorted_first(col, order)`` is ``col`` in the row with the
  smallest ``order`` value, ties to the smallest row key (``sorted_last``: largest value,
  largest row key) — per group, the first (last) row of a stable ``sort(order)`` over the
  rows whose ``order`` is not null and not NaN. Those rows are never chosen; a group
  without any is null. Strings order bytewise, ``-0.0`` ties with ``0.0``.

What each kind reads, its output type, its checks and the state it shares with others are
the registry's (:mod:`engine.ops.aggregate._kinds`); this module iterates over kinds and
states without naming any.

**Order of the result** (DESIGN.md §3: the order a recomputation gives): the groups are in
order of their *first row in the parent's current rows* — a group comes before another when
its first row (the one with the smallest parent row key) does. That is the order a build
from scratch gives (pandas ``groupby(sort=False)`` over the parent's rows in order), so the
live result and one built afresh over the same parent — as a durable server rebuilds its
derived tables at a restart — agree row for row, whatever history led there. ``by=()``: one
row, row key 0.

Row keys: a group's row key *is* its first row's parent row key (distinct: the groups
partition the rows), which makes row-key order the order above. So:

* a parent shift that moves first rows shifts the result alike (the parent's ranges that
  move one of its rows);
* a group whose first row changes — the row leaves the table or the group, or a row with a
  smaller parent key joins (a new row on a reused parent key, say) — is removed at its old
  key and added at its new one, also where its place among the groups stays the same;
* a group is modified only when one of its aggregate values changed at a key it keeps, and
  ``modified_columns`` names exactly the aggregates that changed in some modified row (key
  columns never change).

Why not the other way round, rebuilding at a restart in the order the live result had:
that order is history (which group came first, which one was emptied in which cycle, which
freed key it got back) that no recomputation can know, so a checkpoint would have to carry
it for every derived table, and a fresh ``agg_by`` over the same rows would still disagree.
Keying groups by their first rows keeps the per-cycle cost following the change (each
touched group's first row is one search in the row-key index below). Its price: that index
for every aggregation with a ``by`` (first and last keep it anyway), and a remove and an add
where a group's first row changes instead of a modify.

How a cycle runs (every step is numpy over the changed rows, no loop per row or group):

1. Rows are grouped by hashing their ``by`` values (:func:`~engine._kernels.hashing.hash_columns`)
   and looking them up in an :class:`~engine._kernels.keymap.ExactKeyMap` (key -> slot):
   the hash finds the candidate group, the values decide, checked against the group's key
   values stored by slot (``key_cols``), so two distinct keys with equal hashes are two
   groups. One integer-like column is its own exact hash: only null-ness is compared.
   New groups get slots. Added and modified rows are hashed once, together, in the
   current key space; removed rows (and modified rows whose ``by`` values changed) in the
   previous one — or, when there is a ``by`` (so the row-key index below exists), looked
   up there without reading any key.
2. Each row leaving a group is a *minus* event (previous values), each row joining one a
   *plus* event (current values); a modify that keeps its group is both, and only for the
   aggregations whose input it modified. A cycle that touches nothing the aggregation reads
   returns no update at all.
3. States (``engine.ops.aggregate._states``, ``._sums``) fold the events in per touched
   group with ``np.unique``/``np.bincount``, each state once for every aggregation sharing
   it; min/max/median/percentile (and std/var, see below) keep a per-group sorted multiset
   of values, median/percentile with a rank tree over it, and a per-group sorted set of
   parent row keys that follows the parent's shifts (``engine.ops.aggregate._sortedset``)
   gives every group's first row (its row key) and first/last (until the parent shifts,
   or its scans cost more than the changes paid for, it is only a map from row key to
   group with each group's bounds: a first row that leaves is found by a scan of the gap
   to the group's next row, see :class:`RowKeySet`); sorted_first/last keep
   their own rows in order of their order column (``engine.ops.aggregate._ordered``).
   Over an insert-only parent (:attr:`~engine.table.Table.insert_only`: no row is ever
   removed or modified, as in an inner join of append-only tables) min/max keep one
   running value per group instead, and over an add-only one
   (:attr:`~engine.table.Table.add_only`: rows only arrive, above every current key)
   first/last also keep each group's first and last row key
   (``engine.ops.aggregate._addonly``), and a ``by`` keeps no row-key set: a group's row
   key is its first row's, set once when the group appears (a map from those keys to the
   groups serves the result's reads); an update of such a parent that removes or
   modifies rows (add-only: or shifts them, or adds below its last key) fails the table
   before any state changes.
4. Each aggregation's kind names the groups to evaluate again and computes their new
   values, which are compared with the current output; only real changes are written
   (with previous values tracked) and reported.
5. Values are stored by *slot* (a dense group id, reused from the cycle after its group
   went); the result's columns read a row key's slot from the row-key index, and during a
   cycle a previous row key's slot through the cycle's shift, or from the groups whose key
   went (:meth:`AggListener.prev_slots_of`).

Costs per cycle: ``O(changed rows + touched groups)`` numpy work, plus for a ``by`` (the
row-key index) and for min/max/median/percentile/std/var the sorted structures, which are
LSM trees: ``O(log N)`` searches per change and an ``O(N)`` merge every ``N/8`` new entries
(amortized ``O(1)`` per change; the merge itself pauses a cycle by tens of milliseconds per
million rows). Median and percentile add ``O(log N)`` rank-tree rounds per change and per
touched group, never a scan of a group: removing a group's median costs what any change
costs. A parent shift costs ``O(rows moved)`` (with a ``by``, or first/last). Memory: the
group index and per-group state arrays, and for the sorted multiset ~40 bytes per distinct
value per group (~56 with the rank tree), for the row-key index (a ``by``, or first/last)
~120 bytes per parent row (a row-key hash and the sorted set).

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
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.hashing import (
    Same,
    exact_hash,
    few_rows_equal,
    hash_columns,
    plain_type,
    rows_equal,
    rows_equal_at,
    values_equal,
)
from engine._kernels.ids import IdAllocator
from engine._kernels.keymap import ExactKeyMap
from engine._kernels.rowkeymap import RowKeyMap
from engine.columns import (
    ColumnSource,
    NumpyColumnSource,
    RedirectingColumnSource,
    WritableColumnSource,
    codable,
    compact_stale,
    make_column_source,
)
from engine.errors import SchemaError, TableFailed, UpdateInvariantError
from engine.ops.aggregate._codes import CodedGroups
from engine.ops.aggregate._keys import fetch, fetch_numpy, numpy_of, pairs_equal
from engine.ops.aggregate._kinds import KINDS, Growth, Need, Refresh, Values, build_states
from engine.ops.aggregate._sortedset import RowKeySet
from engine.ops.aggregate._states import Cycle, Events
from engine.ops.aggregate.spec import Agg as Agg
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Derivation, DerivedTable, Table, derive
from engine.update import TableUpdate

__all__ = ["Agg", "AggListener", "agg_by", "count_by", "first_by", "last_by"]

#: whether an insert-only parent that is not add-only gets the running min/max (tests
#: switch it off to drive the same oracle through the sorted states)
RUNNING_OVER_INSERTS = True
#: whether an aggregation with a ``by`` over an add-only parent keeps only each group's
#: first row (its row key) instead of every row's group (tests switch it off likewise)
FIRSTS_OVER_APPENDS = True
#: whether the row-key set stays flat through removes (:class:`RowKeySet`'s
#: ``flat_removes``; tests switch it off to drive the same oracle through its entries)
FLAT_REMOVES = True
#: the first rows' map stays dense while groups hold up to about this many rows on
#: average: the result's reads look rows up there once per column and reader, and a
#: hashed lookup is probe rounds where a dense one is a take (tests set 0: hashed)
FIRSTS_DENSE_RATIO = 32


def _growth(parent: Table) -> Growth:
    """The strongest promise ``parent`` makes about how its rows change."""
    if parent.add_only:
        return Growth.APPENDS
    if parent.insert_only and RUNNING_OVER_INSERTS:
        return Growth.INSERTS
    return Growth.ANY

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]
_EMPTY_I = np.empty(0, dtype=np.int64)


# building ---------------------------------------------------------------------------------
def _union(arrays: Iterable[I64]) -> I64:
    """The sorted distinct values of ``arrays`` (each sorted and distinct)."""
    parts = list(arrays)
    if len(parts) == 1:
        return parts[0]
    return np.unique(np.concatenate(parts)) if parts else _EMPTY_I


def _in_sorted(sorted_set: I64, values: I64) -> Mask:
    """Which ``values`` are in ``sorted_set`` (sorted, not empty): one search, no sort."""
    at = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    found: Mask = sorted_set[at] == values
    return found


def _coded_keys(arrays: list[pa.Array], by: Sequence[str]) -> tuple[U64, I64, I64] | None:
    """For one string or binary key column without nulls, its distinct keys by a
    dictionary encoding (Arrow's, exact): ``(hashes, rep, inv)`` as
    :meth:`AggListener._distinct_rows` gives them (``rep`` one row per distinct key, in row
    order; ``inv`` each row's position in ``rep``), with each row's hash, the distinct
    keys alone hashed. None for other keys (hashed row by row, then grouped by hash).

    A cycle's rows repeat a few thousand keys (symbols): one pass of Arrow's hash table
    does what a hash of every row, a sort of the hashes and a check of every row against
    its representative did."""
    if len(arrays) != 1:
        return None
    arr = arrays[0]
    t = arr.type
    if arr.null_count or not (pa.types.is_string(t) or pa.types.is_large_string(t)
                              or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return None
    enc = arr.dictionary_encode()
    inv = np.asarray(enc.indices.to_numpy(), dtype=np.int64)
    nd = len(enc.dictionary)
    # the dictionary is in order of first appearance: a key's first row is where the
    # running maximum of the indices grows (checked, not assumed)
    grows = np.empty(inv.size, dtype=bool)
    grows[0] = True
    run = np.maximum.accumulate(inv)
    np.greater(run[1:], run[:-1], out=grows[1:])
    rep = np.flatnonzero(grows)
    if rep.size != nd or not (inv[rep] == np.arange(nd)).all():
        return None
    return hash_columns([enc.dictionary], by, nd)[inv], rep, inv


def _at(same: Same | None, rows: I64, both: bool) -> Same | None:
    """``same`` over the batch's ``rows`` only: position ``i`` stands for row ``rows[i]``
    (in the second argument too when ``both``: a ``same_batch``)."""
    if same is None:
        return None
    if both:
        return lambda i, j: same(rows[i], rows[j])
    return lambda i, j: same(rows[i], j)


def _as_list(by: str | Sequence[str]) -> list[str]:
    return [by] if isinstance(by, str) else list(by)


def agg_by(table: Table, aggs: Agg | Sequence[Agg], by: str | Sequence[str] = ()) -> Table:
    """One row per group of ``by`` with the aggregations ``aggs``, kept live.

    Order: groups in order of their first row in the parent's current rows, as a
    recomputation gives (pandas ``groupby(by, sort=False)`` over the parent in row order),
    whatever the history: a group whose first row leaves moves to where its next row is.
    Each group's row key is its first row's parent row key. See the module docstring for
    the reasons, null semantics and types.

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
        stored: dict[str, WritableColumnSource] = {**listener.key_cols, **listener.out_cols}
        columns: dict[str, ColumnSource] = (
            {n: _GroupColumn(c, listener) for n, c in stored.items()} if by_list else dict(stored))
        return Derivation(schema, columns, listener.initial_rowset, listener,
                          name=f"{table.name}.agg_by")

    return derive([table], plan, table_class=_AggTable)


def first_by(table: Table, by: str | Sequence[str]) -> Table:
    """The first row (smallest row key) of each group: ``by`` columns, then the others."""
    by_list = _as_list(by)
    return agg_by(table, [Agg("first", c, c) for c in table.column_names if c not in by_list], by_list)


def last_by(table: Table, by: str | Sequence[str]) -> Table:
    """The last row (largest row key) of each group: ``by`` columns, then the others."""
    by_list = _as_list(by)
    return agg_by(table, [Agg("last", c, c) for c in table.column_names if c not in by_list], by_list)


def count_by(table: Table, name: str, by: str | Sequence[str] = ()) -> Table:
    """Number of rows per group of ``by``, in column ``name``."""
    return agg_by(table, [Agg("count", None, name)], by)


class _AggTable(DerivedTable):
    """The result table; after a cycle its listener forgets the cycle's previous row keys,
    and the Arrow-backed columns are compacted when they bloat."""

    def _end_cycle(self) -> None:
        super()._end_cycle()
        listener = self.listener
        assert isinstance(listener, AggListener)
        listener.end_cycle()
        compact_stale([*listener.key_cols.values(), *listener.out_cols.values()], self.size,
                      lambda: listener.slots_of(self.rowset.keys()))


class _GroupColumn(RedirectingColumnSource):
    """A result column stored by group slot, read by row key (the group's first parent row)."""

    def __init__(self, inner: WritableColumnSource, listener: AggListener) -> None:
        self.inner = inner
        self.type = inner.type
        self._listener = listener

    @property
    def translation(self) -> object:
        return self._listener

    def translate(self, keys: I64) -> I64:
        return self._listener.slots_of(np.asarray(keys, dtype=np.int64))

    def translate_prev(self, keys: I64) -> I64:
        return self._listener.prev_slots_of(np.asarray(keys, dtype=np.int64))


# the listener -----------------------------------------------------------------------------
class _Live(NamedTuple):
    """The groups a cycle evaluates for some aggregations: ``slots``, alive (sorted), and
    the positions of those that existed before the cycle (``None``: every one did)."""

    slots: I64
    existed: I64 | None


#: group one string or binary key read from a coded column by its codes (tests switch it off)
CODED_GROUPS = True


class AggListener:
    """Keeps the result of :func:`agg_by` equal to a recomputation, one cycle at a time:
    same rows, same order (groups by first row), same values."""

    result: Table

    #: a batch of at least this many rows is interned one row per distinct key (see
    #: :meth:`_distinct_rows`); below it, deduplicating costs more than it saves
    DISTINCT_MIN = 32
    #: after a batch found mostly distinct, this many batches skip the search (a merge's
    #: new rows, new groups nearly all: the sort found nothing to save, cycle after cycle)
    DISTINCT_SKIP = 7
    #: from this many rows on, one string or binary key column without nulls is grouped
    #: by its dictionary encoding (:func:`_coded_keys`): 25,000 rows of 1,000 symbols
    #: (hash, sort, check) 1.6 -> 0.7 ms; at 750 rows its fixed cost loses 40 us (tests lower it)
    CODED_MIN = 4096
    #: a batch of at most this many rows checks its string, binary or integer group keys
    #: against the groups' as Python values (:func:`few_rows_equal`), not by Arrow
    FEW_KEYS = 16
    #: a cycle's modified groups are united by one flag per slot while the slots number
    #: at most this many per changed value (:meth:`_modified`; tests set 0: sorted)
    FLAG_SLOTS = 16

    def __init__(self, parent: Table, by: list[str], aggs: list[Agg], schema: pa.Schema) -> None:
        self.parent = parent
        self.graph = parent.graph
        self.by = by
        self.by_set = frozenset(by)
        self.aggs = aggs
        self.kinds = [KINDS[a.kind] for a in aggs]
        # what the parent promises about its rows: kinds keep cheaper states for a
        # stronger promise (fixed for life)
        self.growth = _growth(parent)
        self.inputs = frozenset(c for a, k in zip(aggs, self.kinds, strict=True) for c in k.inputs(a))
        self.key_cols: dict[str, WritableColumnSource] = {
            k: make_column_source(parent.schema.field(k).type) for k in by
        }
        self.out_cols: dict[str, WritableColumnSource] = {
            a.name: make_column_source(schema.field(a.name).type) for a in aggs
        }
        # one state per distinct need (shared by the aggregations over the same columns),
        # dependencies first: the order they are fed in every cycle
        self.states = build_states([n for a, k in zip(aggs, self.kinds, strict=True) for n in k.needs(a, self.growth)],
                                   lambda cols: [parent.schema.field(c).type for c in cols])
        # each row's group in parent row-key order: the groups' first rows (their row keys
        # here, when there is a ``by``) and first/last. Over an add-only parent a group's
        # first row is its first ever and no row leaves a group: each group's first row
        # (``first_row``, by slot, and ``firsts``, its inverse) is all a ``by`` needs.
        reads_rows = any(k.reads_rows(self.growth) for k in self.kinds)
        self.firsts: RowKeyMap | None = None
        if by and not reads_rows and self.growth is Growth.APPENDS and FIRSTS_OVER_APPENDS:
            self.firsts = RowKeyMap(dense_ratio=FIRSTS_DENSE_RATIO)
        # rows leaving groups keep the set flat (a group's first row is searched again only
        # when it leaves, by a scan of the gap to its next row: RowKeySet's docstring)
        self.rows = RowKeySet(flat_removes=FLAT_REMOVES) if (by and self.firsts is None) or reads_rows else None
        # each group's first row by slot: over an add-only parent the truth; over the
        # row-key set a cache of its answers where ``first_ok`` (see :meth:`_first_rows`)
        self.first_row = np.zeros(16 if by else 0, dtype=np.int64)
        self.first_ok = np.zeros(16 if by and self.firsts is None else 0, dtype=bool)
        # states holding row keys of their own (sorted_first/last) see every shift
        self.row_states = any(st.holds_rows for st in self.states.values())
        # group key -> slot: hash, then verify against key_cols (one integer-like column:
        # its hash is exact, so only null-ness is compared, against the one null group)
        self.exact_key = exact_hash([parent.schema.field(k).type for k in by])
        # several fixed-width key columns: verified and stored in numpy, no Arrow tables
        stored_keys = [self.key_cols[k] for k in by]
        self._numpy_keys: list[NumpyColumnSource] | None = None
        self._plain_keys = all(plain_type(parent.schema.field(k).type) for k in by)
        if by and not self.exact_key and all(isinstance(c, NumpyColumnSource) for c in stored_keys):
            self._numpy_keys = [c for c in stored_keys if isinstance(c, NumpyColumnSource)]
        self.index = ExactKeyMap(exact=not by)
        # one string or binary key read from a coded column: groups by code (_codes.py)
        self.codes = (CodedGroups() if CODED_GROUPS and len(by) == 1
                      and codable(parent.schema.field(by[0]).type) else None)
        self._distinct_skip = 0  # batches left that skip _distinct_rows' search
        self.null_slot = -1  # the group of the null key, for an exact key column
        self._one = -1  # without a ``by``: the one group's slot, once interned
        self.size = np.zeros(16, dtype=np.int64)
        self.slot_hash = np.zeros(16, dtype=np.uint64)
        self.slots = IdAllocator()  # a freed slot is reused from the next cycle on
        # this cycle's output: removed row keys (sorted, previous key space) with their
        # groups' slots, and the shift, for get_prev (see prev_slots_of)
        self._gone_keys, self._gone_slots = _EMPTY_I, _EMPTY_I
        self._shift = RowSetShiftData.empty()
        # this cycle's added and modified groups (row keys, slots), for its readers (_groups_at)
        self._recent: tuple[I64, I64] | None = None
        self._recent_sorted: tuple[I64, I64] | None = None
        self._in_cycle = False
        out = self._process(TableUpdate.of(added=parent.rowset))
        self.initial_rowset = out.added

    # groups ------------------------------------------------------------------------------
    def _alloc(self, n: int) -> I64:
        slots = self.slots.allocate(n)
        if self.slots.end > self.size.size:
            cap = max(self.slots.end, 2 * self.size.size)
            for name in ("size", "slot_hash", "first_row", "first_ok"):
                old = getattr(self, name)
                if old.size == 0:  # not kept for this aggregation
                    continue
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
        elif not self.by:  # the one group, when it has rows
            slots = np.full(keys.size, self._one if self._one >= 0 and self.size[self._one] else -1)
        else:
            arrays = self._key_arrays(keys, True)
            slots = self.index.lookup(hash_columns(arrays, self.by, keys.size),
                                      self._same_as_group(arrays, self._key_pairs(arrays)))
        if (slots < 0).any():
            raise UpdateInvariantError(
                "A1", f"rows {keys[slots < 0][:10].tolist()} of {self.parent.name!r} belong to no group"
            )
        return slots

    def _assign(self, keys: I64) -> I64:
        """Slots of rows (current key space and values); new groups get slots, in order of
        their first row (so keys follow the parent's row order). Exact: a hash finds the
        group, its stored key values decide; or a coded key's code, mapped from an earlier
        such answer (:class:`CodedGroups`)."""
        if keys.size == 0:
            return _EMPTY_I
        if not self.by:  # one group: interned by one row while it has no rows, then known
            if self._one < 0 or self.size[self._one] == 0:
                self._one = int(self._assign_values(keys[:1])[0])
            return np.full(keys.size, self._one)
        if self.codes is not None:
            found = self.codes.lookup(self.parent.column(self.by[0]), keys)
            if found is not None:
                slots, codes = found
                miss = np.flatnonzero(slots < 0)
                if miss.size:  # in row order: new groups still take slots by first row
                    got = self._assign_values(keys[miss])
                    slots[miss] = got
                    self.codes.learn(codes[miss], got)
                return slots
        return self._assign_values(keys)

    def _assign_values(self, keys: I64) -> I64:
        """:meth:`_assign` by the key values: hashed, then verified."""
        arrays = self._key_arrays(keys, prev=False)
        coded = _coded_keys(arrays, self.by) if keys.size >= self.CODED_MIN else None
        pairs = self._key_pairs(arrays)
        same, same_batch = self._same_as_group(arrays, pairs), self._same_in_batch(arrays, pairs)
        rep: I64 | None
        if coded is not None:
            h, rep, inv = coded
        else:
            h = hash_columns(arrays, self.by, keys.size)
            rep, inv = self._distinct_rows(h, same_batch)
        if rep is None:
            slots, fresh, rows = self.index.intern(h, same, same_batch, self._alloc)
        else:  # the map sees one row per distinct key, in row order
            slots, fresh, rows = self.index.intern(h[rep], _at(same, rep, False), _at(same_batch, rep, True),
                                                   self._alloc)
            slots, rows = slots[inv], rep[rows]
        if fresh.size:
            self.slot_hash[fresh] = h[rows]
            if pairs is not None and self._numpy_keys is not None:
                for src, (v, ok) in zip(self._numpy_keys, pairs, strict=True):
                    src.set_numpy(fresh, v[rows], None if ok is None else ok[rows])
            else:
                for k, arr in zip(self.by, arrays, strict=True):  # one write per key column
                    self.key_cols[k].set(fresh, arr.take(pa.array(rows)))
            if self.exact_key and arrays[0].null_count:
                null = np.flatnonzero(~arrays[0].is_valid().to_numpy(zero_copy_only=False)[rows])
                if null.size:
                    self.null_slot = int(fresh[null[0]])
        return slots

    def _distinct_rows(self, h: U64, same_batch: Same | None) -> tuple[I64 | None, I64]:
        """``(rep, inv)``: one row per distinct key (``rep``, in row order) and each row's
        position in ``rep``, when the batch repeats keys; ``(None, _)`` when it does not,
        is small, or two of its keys share a hash (the map's chains sort those out), and
        for :attr:`DISTINCT_SKIP` batches after one that was mostly distinct (either way
        the map interns the same keys: this only saves work).

        A batch of a cycle often holds many rows per group (bids of a hot auction): the
        hash map then probes and verifies each group once, not each row."""
        if h.size < self.DISTINCT_MIN:
            return None, _EMPTY_I
        if self._distinct_skip:
            self._distinct_skip -= 1
            return None, _EMPTY_I
        o = np.argsort(h)  # equal hashes in any order: each run's first row is its minimum
        hs = h[o]
        head = np.empty(h.size, dtype=bool)
        head[0] = True
        np.not_equal(hs[1:], hs[:-1], out=head[1:])
        starts = np.flatnonzero(head)
        if 2 * starts.size > h.size:  # mostly distinct: the map's work is the same either way
            self._distinct_skip = self.DISTINCT_SKIP
            return None, _EMPTY_I
        first = np.minimum.reduceat(o, starts)
        inv = np.empty(h.size, dtype=np.int64)
        inv[o] = np.cumsum(head) - 1
        if same_batch is not None and not same_batch(np.arange(h.size), first[inv]).all():
            return None, _EMPTY_I
        order = np.argsort(first)  # new groups take slots in order of their first row
        rank = np.empty(order.size, dtype=np.int64)
        rank[order] = np.arange(order.size)
        return first[order], rank[inv]

    def _key_pairs(self, arrays: list[pa.Array]) -> list[NumPair] | None:
        """The key columns as ``(values, validity)`` pairs when they are all fixed-width
        (and more than one exact column): then verified in numpy."""
        return [numpy_of(a) for a in arrays] if self._numpy_keys is not None else None

    def _same_as_group(self, arrays: list[pa.Array], pairs: list[NumPair] | None) -> Same | None:
        """``same(i, slots)``: row ``i`` of ``arrays`` (``pairs``, if given, the same
        values in numpy) has the key of the groups ``slots``."""
        if not self.by:
            return None
        if pairs is not None and self._numpy_keys is not None:
            stored = self._numpy_keys

            def same_numpy(i: I64, slots: I64) -> Mask:
                out = np.ones(i.size, dtype=bool)
                for src, (v, ok) in zip(stored, pairs, strict=True):  # one pass per column
                    out &= pairs_equal(src.get_numpy(slots), (v[i], None if ok is None else ok[i]))
                return out
            return same_numpy
        if self.exact_key:  # equal exact hashes: equal values, or a null and one value
            probe_null = (~arrays[0].is_valid().to_numpy(zero_copy_only=False)
                          if arrays[0].null_count else None)

            def same_exact(i: I64, slots: I64) -> Mask:
                cand_null: Mask = slots == self.null_slot
                return cand_null == probe_null[i] if probe_null is not None else ~cand_null
            return same_exact
        probe = pa.Table.from_arrays(arrays, names=self.by)
        few = self._plain_keys and probe.num_rows <= self.FEW_KEYS

        def same(i: I64, slots: I64) -> Mask:
            if few:
                return few_rows_equal(arrays, i, [self.key_cols[k].get_pylist(slots) for k in self.by])
            stored = pa.Table.from_arrays([self.key_cols[k].get(slots) for k in self.by], names=self.by)
            return rows_equal(probe.take(pa.array(i)), stored)
        return same

    def _same_in_batch(self, arrays: list[pa.Array], pairs: list[NumPair] | None) -> Same | None:
        """``same(i, j)``: rows ``i`` and ``j`` of ``arrays`` have equal keys."""
        if not self.by:
            return None
        if pairs is not None:
            def same_numpy(i: I64, j: I64) -> Mask:
                out = np.ones(i.size, dtype=bool)
                for v, ok in pairs:
                    out &= pairs_equal((v[i], None if ok is None else ok[i]), (v[j], None if ok is None else ok[j]))
                return out
            return same_numpy
        if self.exact_key:
            valid = arrays[0].is_valid().to_numpy(zero_copy_only=False) if arrays[0].null_count else None
            return None if valid is None else (lambda i, j: valid[i] == valid[j])
        probe = pa.Table.from_arrays(arrays, names=self.by)
        return lambda i, j: rows_equal_at(probe, i, probe, j)

    # row keys ----------------------------------------------------------------------------
    def slots_of(self, keys: I64) -> I64:
        """The slot of the group at each row key (current key space)."""
        if not self.by:
            return keys  # the one group's row key is its slot
        return self._groups_at(keys)  # a group's row key is its first row's

    def _groups_at(self, keys: I64) -> I64:
        """The group whose first row is at each of ``keys`` (current key space).

        The readers of a cycle's update read its added and modified rows, several times
        (each reader, current and previous values): those are found among them
        (:meth:`_recent_groups`, one sorted search), and only other keys in the map (a
        hashed one probes in rounds)."""
        recent = self._recent_groups() if keys.size else None
        if recent is None:
            return self._mapped_groups(keys)
        rk, rs = recent
        pos = np.searchsorted(rk, keys)
        np.minimum(pos, rk.size - 1, out=pos)
        out = rs[pos]
        miss = rk[pos] != keys
        if miss.any():
            out[miss] = self._mapped_groups(keys[miss])
        return out

    def _mapped_groups(self, keys: I64) -> I64:
        """:meth:`_groups_at` from the map of every group's row key."""
        if self.firsts is not None:
            return self.firsts.lookup(keys)
        assert self.rows is not None
        return self.rows.groups_of(keys)

    def _recent_groups(self) -> tuple[I64, I64] | None:
        """This cycle's added and modified groups as ``(row keys, slots)`` sorted by key,
        or None outside a cycle's reads (or when the map is a dense window: one ``take``)."""
        if self._recent is None or self._recent[0].size == 0:
            return None
        if self._recent_sorted is None:
            k, slots = self._recent
            o = np.argsort(k)
            self._recent_sorted = k[o], slots[o]
        return self._recent_sorted

    def prev_slots_of(self, keys: I64) -> I64:
        """The slot of the group at each row key of the previous key space (this cycle's)."""
        if not self.by:
            return keys
        slots = self._groups_at(self._shift.apply_keys(keys))  # rows that kept their key
        if self._gone_keys.size and keys.size:
            pos = np.minimum(np.searchsorted(self._gone_keys, keys), self._gone_keys.size - 1)
            gone = self._gone_keys[pos] == keys
            slots[gone] = self._gone_slots[pos[gone]]
        return slots

    def end_cycle(self) -> None:
        """The cycle is over: previous row keys are current ones again."""
        self._gone_keys, self._gone_slots = _EMPTY_I, _EMPTY_I
        self._shift = RowSetShiftData.empty()
        self._recent = self._recent_sorted = None

    def _first_rows(self, slots: I64) -> I64:
        """Each group's first parent row key (garbage for a group without rows), in the
        key space the row-key set holds now.

        Over the row-key set, ``first_row`` caches its answers where ``first_ok``: a group
        asked for is searched once, then read, until the cycle that touches it (which
        writes its new first row, :meth:`_keep_firsts`) or shifts the parent (which
        forgets every cached row). Between :meth:`_move_rows` and :meth:`_keep_firsts` the
        touched groups' entries are stale, and so is every entry of a shifting cycle:
        nothing reads them there."""
        if self.firsts is not None:
            return self.first_row[slots]
        assert self.rows is not None
        out = self.first_row[slots]
        miss = np.flatnonzero(~self.first_ok[slots])
        if miss.size:
            found = self.rows.min_of(slots[miss])[0].view(np.int64)
            out[miss] = found
            self.first_row[slots[miss]] = found
            self.first_ok[slots[miss]] = True
        return out

    def _old_firsts(self, touched: I64, size_old: I64) -> I64:
        """The touched groups' first rows before the cycle (previous key space; 0 for a
        group new this cycle): only groups that had rows are searched (a cycle that
        makes many groups, as a merge's new rows do, searched each for nothing)."""
        had = size_old > 0
        if had.all():
            return self._first_rows(touched)
        out = np.zeros(touched.size, dtype=np.int64)
        if had.any():
            out[had] = self._first_rows(touched[had])
        return out

    def _keep_firsts(self, shifted: bool, touched: I64, first_new: I64, alive: Mask) -> None:
        """The cycle's end for the first-row cache: a shift forgets every group's cached
        row (moved in the parent), then the touched groups' new first rows are kept (the
        ``alive`` ones: a group gone has none)."""
        if self.firsts is not None:
            return
        if shifted:
            self.first_ok[:] = False
        self.first_row[touched] = first_new
        self.first_ok[touched] = alive

    def _new_firsts(self, up: TableUpdate, members: Events, touched: I64, first_old: I64,
                    had: Mask) -> I64:
        """Each touched group's first row after the cycle (current key space), from its old
        one and the rows joining it; only a group whose first row left it (removed, or
        moved to another group) is searched, after the row-key set has moved
        (:meth:`_research_firsts`). Returns -1 for those."""
        nm = members.nm
        keep = had.copy()
        if nm:  # a group whose first row is among its leaving rows lost it
            inv_m = members.inv[:nm]
            keep[inv_m[members.minus_keys == first_old[inv_m]]] = False
        out = np.full(touched.size, np.iinfo(np.int64).max, dtype=np.int64)
        out[keep] = up.shifted.apply_keys(first_old[keep]) if up.shifted else first_old[keep]
        np.minimum.at(out, members.inv[nm:], members.plus_keys)
        out[had & ~keep] = -1
        return out

    # the cycle ---------------------------------------------------------------------------
    def on_update(self, *updates: TableUpdate | None) -> TableUpdate | None:
        up = updates[0]
        if up is None:
            return None
        if self.growth is not Growth.ANY:
            self._check_growth(up)
        self.slots.release()  # slots freed last cycle may be reused from now on
        self._recent = self._recent_sorted = None  # the groups change from here on
        self._in_cycle = True
        try:
            out = self._process(up)
        finally:
            self._in_cycle = False
        return None if out.empty() else out

    def _check_growth(self, up: TableUpdate) -> None:
        """Fail the table, before any state changes, if the parent broke its promise: the
        running states cannot take a removal or a modify, the add-only ones no move either."""
        broken = [what for what, there in (("removes", up.removed), ("modifies", up.modified)) if there]
        if self.growth is Growth.APPENDS:
            prev = self.parent.prev_rowset
            if up.shifted:
                broken.append("shifts")
            if up.added and prev and up.added.first() <= prev.last():
                broken.append("adds below its last row key")
        if broken:
            promise = "add-only" if self.growth is Growth.APPENDS else "insert-only"
            raise TableFailed(
                f"table {self.result.name!r}: its parent {self.parent.name!r} is {promise} but "
                f"sent {', '.join(broken)}; agg_by keeps {promise} states for such a parent")

    def _cycle(self, up: TableUpdate) -> Cycle | None:
        """Group every changed row; None when nothing this aggregation reads changed."""
        cy = Cycle(up.modified_columns)
        key_mod = bool(cy.modcols & self.by_set)
        use_mod = bool(up.modified) and (key_mod or bool(cy.modcols & self.inputs))
        if not (up.added or up.removed or use_mod or (up.shifted and self.row_states)):
            return None
        if up.shifted and (self.rows is not None or self.row_states):
            cy.shifted = self._moved(up)
        cy.r_keys = up.removed.keys()
        cy.a_keys = up.added.keys()
        if use_mod:
            cy.m_keys = up.modified.keys()
            cy.m_prev = up.shifted.unapply_keys(cy.m_keys)
        if use_mod and not key_mod and self.rows is not None:
            # a modify of values only keeps its row's group: the row-key structure has it,
            # so the modified rows' keys are neither read nor hashed
            old = self._lookup(np.concatenate((cy.r_keys, cy.m_prev)))
            cur = np.concatenate((self._assign(cy.a_keys), old[cy.r_keys.size :]))
            old = old[: cy.r_keys.size]
        else:
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

    def _process(self, up: TableUpdate) -> TableUpdate:
        """Fold ``up`` in; returns the result's update (possibly empty)."""
        cy = self._cycle(up)
        if cy is None:
            if up.shifted and self.rows is not None:
                self._shift_rows(self._moved(up))
                if self.by:
                    self.first_ok[:] = False  # cached first rows moved with the parent
            self._shift = self._out_shift(up, _EMPTY_I)
            return TableUpdate.of(shifted=self._shift)
        members = cy.events()
        touched = members.touched
        size_old = self.size[touched]
        size_new = size_old + np.bincount(members.inv, weights=members.sign,
                                          minlength=touched.size).round().astype(np.int64)
        self.size[touched] = size_new
        first_old = self._old_firsts(touched, size_old) if self.by else touched  # previous key space
        first_new = self._new_firsts(up, members, touched, first_old, size_old > 0) if self.by else touched
        if self.rows is not None:
            self._move_rows(up, cy)
            lost = np.flatnonzero((first_new < 0) & (size_new > 0))
            if lost.size and self.by:  # their first row left: the row-key set knows the next
                first_new[lost] = self.rows.min_of(touched[lost])[0].view(np.int64)
        if self.firsts is not None:
            born = size_old == 0
            if born.any():
                self.first_row[touched[born]] = first_new[born]
                self.firsts.insert(first_new[born], touched[born])
        cx = Refresh(self.parent, cy, touched, self.size, self.states, self._apply_states(cy), self.rows,
                     self.growth)
        existed_cache: dict[int, _Live] = {}
        changed: dict[str, I64] = {}  # aggregation -> the slots whose value it changed
        for a, kind in zip(self.aggs, self.kinds, strict=True):
            t = kind.touched(a, cx)
            if id(t) not in existed_cache:
                existed_cache[id(t)] = self._live(t, touched, size_old)
            live = existed_cache[id(t)]
            mod = self._write(a, live, kind.values(a, cx, live.slots) if live.slots.size else None)
            if mod.size:
                changed[a.name] = mod
        had, has = size_old > 0, size_new > 0
        dead = touched[had & ~has]
        if dead.size:
            self.index.delete(self.slot_hash[dead], dead)
            if self.null_slot >= 0 and (dead == self.null_slot).any():
                self.null_slot = -1
            self.slots.free(dead)
            if self.codes is not None:
                self.codes.forget(dead)
        if self.by:
            return self._rekey(up, touched, had, has, first_old, first_new, changed)
        return TableUpdate.of(  # the one group's row key is its slot
            added=RowSet.from_keys(touched[~had & has], assume_sorted=True),
            removed=RowSet.from_keys(dead, assume_sorted=True),
            modified=RowSet.from_keys(_union(changed.values()), assume_sorted=True),
            modified_columns=changed.keys(),
        )

    def _rekey(self, up: TableUpdate, touched: I64, had: Mask, has: Mask, first_old: I64,
               first_new: I64, changed: dict[str, I64]) -> TableUpdate:
        """The update when row keys are first rows: a touched group keeps its row key while
        its first row stays its first row (the same surviving parent row, maybe shifted);
        otherwise it leaves its old key (previous key space) for its new one (current).
        ``first_new``: the touched groups' first rows now."""
        self._keep_firsts(bool(up.shifted), touched, first_new, has)
        stays = had & has & (up.shifted.apply_keys(first_old) == first_new)
        if up.removed and stays.any():  # a removed row's key may be another's after the shift
            stays &= ~up.removed.contains_all(first_old)
        gone, born = had & ~stays, has & ~stays
        o = np.argsort(first_old[gone])
        self._gone_keys, self._gone_slots = first_old[gone][o], touched[gone][o]
        self._shift = self._out_shift(up, self._gone_keys)
        mod, changed = self._modified(touched[had & born], changed)
        # the touched groups' first rows are cached by now (_keep_firsts); groups whose
        # values changed while their rows stayed (modifies in place) were cached before
        mod_keys = self._first_rows(mod)
        if self._in_cycle and (self.rows is not None or (self.firsts is not None and self.firsts.hashed)):
            # the rows the readers of this update read: the added and the modified
            self._recent = np.concatenate((first_new[born], mod_keys)), np.concatenate((touched[born], mod))
        return TableUpdate.of(
            added=RowSet.from_keys(first_new[born]),
            removed=RowSet.from_keys(self._gone_keys, assume_sorted=True),
            modified=RowSet.from_keys(mod_keys),
            shifted=self._shift,
            modified_columns=changed.keys(),
        )

    def _modified(self, rekeyed: I64, changed: dict[str, I64]) -> tuple[I64, dict[str, I64]]:
        """The groups modified at a key they keep (sorted slots): those whose value some
        aggregation changed (``changed``: sorted slots per aggregation), less the
        ``rekeyed`` ones (an add at their new key, not a modify); and ``changed`` without
        the aggregations left with no such group.

        While the slots number at most :attr:`FLAG_SLOTS` per changed value, one flag per
        slot unites them (writes and one scan); above, the changes are concatenated and
        sorted (``np.unique``)."""
        total = sum(m.size for m in changed.values())
        if total == 0:
            return _EMPTY_I, changed
        if self.slots.end > self.FLAG_SLOTS * total:  # many groups, few changed: sort
            if rekeyed.size:
                kept = {n: m[~_in_sorted(rekeyed, m)] for n, m in changed.items()}
                changed = {n: m for n, m in kept.items() if m.size}
            return _union(changed.values()), changed
        flags = np.zeros(self.slots.end, dtype=bool)
        for m in changed.values():
            flags[m] = True
        if rekeyed.size:
            flags[rekeyed] = False
            changed = {n: m for n, m in changed.items() if flags[m].any()}
        return np.flatnonzero(flags), changed

    def _out_shift(self, up: TableUpdate, gone: I64) -> RowSetShiftData:
        """The parent's shift ranges that move a row of the result that keeps its key
        (``gone``: the result's removed keys, sorted): first rows move with the parent."""
        if not (up.shifted and self.by):
            return RowSetShiftData.empty()
        prev, _ = up.shifted.moved_keys(self.result.rowset)  # the result's previous keys
        if gone.size and prev.size:
            prev = prev[~np.isin(prev, gone, assume_unique=True)]
        if prev.size == 0:
            return RowSetShiftData.empty()
        sh = up.shifted
        i = np.unique(np.searchsorted(sh.begins, prev, "right") - 1)
        return RowSetShiftData.from_arrays(sh.begins[i], sh.ends[i], sh.deltas[i])

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
    def _moved(self, up: TableUpdate) -> tuple[I64, I64]:
        """The parent rows ``up``'s shift moves, among those that stay: previous keys,
        current keys."""
        if not (up.shifted and self._in_cycle):
            return _EMPTY_I, _EMPTY_I
        return up.shifted.moved_keys(self.parent.prev_rowset - up.removed)

    def _shift_rows(self, moved: tuple[I64, I64]) -> None:
        assert self.rows is not None
        self.rows.shift(*moved)

    def _move_rows(self, up: TableUpdate, cy: Cycle) -> None:
        """Row-key structure: removals (previous keys), shift, moves and adds (current keys)."""
        assert self.rows is not None
        self.rows.remove_keys(cy.r_keys)
        self._shift_rows(cy.shifted)
        mk = cy.m_keys[cy.moved]
        self.rows.remove_keys(mk)
        self.rows.insert_keys(np.concatenate((cy.m_new[cy.moved], cy.a_slot)), np.concatenate((mk, cy.a_keys)))

    # output ------------------------------------------------------------------------------
    def _live(self, t: I64, touched: I64, size_old: I64) -> _Live:
        """The slots of ``t`` still alive, and which of them existed before."""
        live = self.size[t] > 0
        slots = t if live.all() else t[live]
        if touched.size == 0:
            return _Live(slots, None)
        # membership-touched slots existed iff they had rows before
        pos = np.minimum(np.searchsorted(touched, slots), touched.size - 1)
        existed = (touched[pos] != slots) | (size_old[pos] > 0)
        return _Live(slots, None if existed.all() else np.flatnonzero(existed))

    def _write(self, a: Agg, live: _Live, new: Values | None) -> I64:
        """Write the new values of ``a`` (for the live slots) where they changed; return
        the modified slots (those that existed before)."""
        slots, ex = live.slots, live.existed
        if slots.size == 0 or new is None:
            return _EMPTY_I
        src = self.out_cols[a.name]
        if ex is None:  # the usual case: compare every slot, no gathers by position
            if isinstance(new, tuple):
                assert isinstance(src, NumpyColumnSource)
                same = pairs_equal(src.get_numpy(slots), new)
            else:
                same = values_equal(src.get(slots), new)
        else:
            same = np.zeros(slots.size, dtype=bool)
            if ex.size and isinstance(new, tuple):
                assert isinstance(src, NumpyColumnSource)
                vals, valid = new
                same[ex] = pairs_equal(src.get_numpy(slots[ex]), (vals[ex], None if valid is None else valid[ex]))
            elif ex.size:
                assert not isinstance(new, tuple)
                same[ex] = values_equal(src.get(slots[ex]), new if ex.size == slots.size else new.take(pa.array(ex)))
        write = np.flatnonzero(~same)
        if write.size == 0:
            return _EMPTY_I
        if self._in_cycle:
            self.graph.track(src)
        every = write.size == slots.size
        if isinstance(new, tuple):
            assert isinstance(src, NumpyColumnSource)
            vals, valid = new
            if every:
                src.set_numpy(slots, np.asarray(vals, dtype=src.dtype), valid)
            else:
                src.set_numpy(slots[write], np.asarray(vals[write], dtype=src.dtype),
                              None if valid is None else valid[write])
        else:  # variable-width first/last: Arrow all the way
            src.set(slots if every else slots[write], new if every else new.take(pa.array(write)))
        if ex is None:
            return slots if every else slots[write]
        changed = np.zeros(slots.size, dtype=bool)
        changed[ex] = True
        changed[np.flatnonzero(same)] = False
        return slots[changed]
