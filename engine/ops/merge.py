"""``merge``: several tables with one schema, one after the other.

Row keys of a merge: parent ``i`` owns the region ``[i << 40, (i + 1) << 40)``, and its
row key ``k`` is the merge's key ``(i << 40) | k``. Regions keep the parents in argument
order, so position order is "all rows of parent 0, then parent 1, ...", as a
concatenation. Each parent's update maps into its region unchanged (the shifts too, as
ranges offset by ``i << 40``); a cycle in which several parents change produces one
update. A parent row key of ``2**40`` or more cannot be placed and fails the merge with
:class:`~engine.errors.InvalidKeyError` (source tables use keys ``0..n`` and would need
a trillion rows; ops with sparse key spaces should keep below 2**40 to be mergeable).
At most ``2**23`` parents fit the int64 key. A merge's own keys reach ``2**40`` as soon as
its second parent has rows, so merging a merge directly is *flattened*:
``merge(merge(a, b), c)`` is ``merge(a, b, c)`` (same rows, same order), which keeps
fluent chains like ``a.merge(b).merge(c)`` working; a table *derived* from a merge
(``merge(a, b).where(p)``) keeps the merge's keys and cannot be merged again.

Columns are :class:`MergedColumnSource` views that split a batch of keys by region with
numpy (one ``get`` per parent that owns some of the keys) and put the values back in
request order with one Arrow ``take``. A column that every parent reads from one source
(views of one table passing a column through, as a sliding window's hops do) is a
:class:`SharedMergedColumnSource` instead: one read of that source at the keys' local
parts, no split. Per cycle the merge costs the parents' updates
shifted into their regions: bitmap work, no per-row Python.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine._kernels.rowkeymap import REGION_BITS  # row-key maps split by these regions
from engine.columns import ColumnSource, RedirectingColumnSource
from engine.errors import InvalidKeyError, SchemaError
from engine.rowset import KeyArray, RowSet, RowSetShiftData
from engine.table import Derivation, Table, derive
from engine.update import TableUpdate

if TYPE_CHECKING:
    pass

__all__ = ["REGION_BITS", "MergeListener", "MergedColumnSource", "SharedMergedColumnSource", "merge"]

log = logging.getLogger(__name__)

_LOCAL_MASK = np.int64((1 << REGION_BITS) - 1)
_MAX_PARENTS = 1 << (63 - REGION_BITS)


class MergedColumnSource(ColumnSource):
    """One column of a merge: routes each key to the parent owning its region."""

    def __init__(self, parts: list[ColumnSource], type: pa.DataType) -> None:
        self.type = type
        self._parts = parts

    def _route(self, keys: KeyArray, prev: bool) -> pa.Array:
        k = np.asarray(keys, dtype=np.int64)
        if k.size == 0:
            return pa.array([], type=self.type)
        region = k >> REGION_BITS
        local = k & _LOCAL_MASK
        lo, hi = int(region.min()), int(region.max())
        if hi >= len(self._parts):
            raise InvalidKeyError(f"row key {int(k[region >= len(self._parts)][0])} is not in a merge region")
        if lo == hi:  # the common case: all keys from one parent
            part = self._parts[lo]
            return part.get_prev(local) if prev else part.get(local)
        in_order = bool((region[1:] >= region[:-1]).all())  # e.g. keys of a RowSet
        order = np.arange(k.size) if in_order else np.argsort(region, kind="stable")
        bounds = np.searchsorted(region[order], np.arange(lo, hi + 2))
        pieces = []
        for r in range(lo, hi + 1):  # one gather per parent
            idx = order[bounds[r - lo]:bounds[r - lo + 1]]
            if idx.size:
                part = self._parts[r]
                pieces.append(part.get_prev(local[idx]) if prev else part.get(local[idx]))
        gathered = pa.concat_arrays([p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p
                                     for p in pieces])
        if in_order:
            return gathered
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return gathered.take(pa.array(inverse))

    def get(self, keys: KeyArray) -> pa.Array:
        return self._route(keys, prev=False)

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self._route(keys, prev=True)


class _Regions:
    """A merge's key map for its shared columns: a key's region names the parent, its low
    bits are the parent's key (one object per merge, so :func:`~engine.columns.read_columns`
    strips the regions once for all of them)."""

    def __init__(self, parents: int) -> None:
        self.parents = parents

    def local(self, keys: KeyArray) -> KeyArray:
        k = np.asarray(keys, dtype=np.int64)
        if k.size and int(k.max()) >> REGION_BITS >= self.parents:
            raise InvalidKeyError(f"row key {int(k.max())} is not in a merge region")
        out: KeyArray = k & _LOCAL_MASK
        return out


class SharedMergedColumnSource(RedirectingColumnSource):
    """A merge's column whose parents all read one source: row key ``(i << 40) | k`` is the
    source's ``k`` whatever ``i``, so a batch is one read of the source (no split by
    region, no gather back into order), and a numpy reader reaches the source's storage."""

    def __init__(self, inner: ColumnSource, regions: _Regions) -> None:
        self.inner = inner
        self.type = inner.type
        self._regions = regions

    @property
    def translation(self) -> object:
        return self._regions

    def translate(self, keys: KeyArray) -> KeyArray:
        return self._regions.local(keys)

    def translate_prev(self, keys: KeyArray) -> KeyArray:
        return self._regions.local(keys)  # regions never move: a previous key's region is its parent's


def _column(parts: list[ColumnSource], type: pa.DataType, regions: _Regions) -> ColumnSource:
    """The merge's column over the parents' ``parts``: shared when they are one source."""
    if len(parts) > 1 and all(p is parts[0] for p in parts):
        return SharedMergedColumnSource(parts[0], regions)
    return MergedColumnSource(parts, type)


def _schema_difference(first: Table, other: Table, position: int) -> str | None:
    a, b = first.schema, other.schema
    if a.names == b.names and all(x.type == y.type for x, y in zip(a, b, strict=True)):
        return None
    problems = []
    missing = [n for n in a.names if n not in b.names]
    extra = [n for n in b.names if n not in a.names]
    if missing:
        problems.append(f"it lacks column(s) {missing}")
    if extra:
        problems.append(f"it has extra column(s) {extra}")
    for f in b:
        if f.name in a.names and a.field(f.name).type != f.type:
            problems.append(f"column {f.name!r} is {f.type} there but {a.field(f.name).type} in {first.name!r}")
    if not problems:
        problems.append(f"its columns are in the order {b.names}, not {a.names}")
    return (
        f"merge: table {other.name!r} (argument {position}) does not have the schema of "
        f"{first.name!r}: {'; '.join(problems)} (select/rename/cast columns so all schemas match)"
    )


def _check_keys(table: Table, rows: RowSet) -> None:
    if rows and rows.last() > _LOCAL_MASK:
        raise InvalidKeyError(
            f"merge: table {table.name!r} has row key {rows.last()}, beyond the 2**40 keys a "
            f"merge region holds; merge a table with a compact key space (e.g. a snapshot "
            f"or a select of it)"
        )


def merge(*tables: Table) -> Table:
    """The rows of ``tables`` one after the other, kept live.

    Parameters
    ----------
    *tables
        Tables with the same column names, order and types, on one update graph.

    Raises
    ------
    SchemaError
        If no table is given, or the schemas differ (the message names the difference).
    InvalidKeyError
        If a parent has a row key of ``2**40`` or more (now, or in a later cycle: then
        the merge fails).

    Examples
    --------
    >>> merge(t.where(pc.field("Qty") > 0), t.where(pc.field("Qty") <= 0)).size == t.size
    True
    """
    if not tables:
        raise SchemaError("merge needs at least one table")
    first = tables[0]
    for i, t in enumerate(tables[1:], start=2):
        if t.graph is not first.graph:
            raise SchemaError(f"merge: table {t.name!r} (argument {i}) is on another update graph")
        problem = _schema_difference(first, t, i)
        if problem:
            raise SchemaError(problem)
    # a merge of merges is the merge of their parents: their keys would not fit a region
    tables = tuple(p for t in tables for p in _merged_parents(t))
    if len(tables) > _MAX_PARENTS:
        raise SchemaError(f"merge takes at most {_MAX_PARENTS} tables, got {len(tables)}")

    def plan() -> Derivation:
        rowset = RowSet()
        for i, t in enumerate(tables):  # one region per parent
            _check_keys(t, t.rowset)
            rowset |= t.rowset.shift(i << REGION_BITS)
        regions = _Regions(len(tables))
        columns: dict[str, ColumnSource] = {
            f.name: _column([t.column(f.name) for t in tables], f.type, regions)
            for f in first.schema
        }
        return Derivation(first.schema, columns, rowset, MergeListener(tables))

    return derive(tables, plan)


def _merged_parents(table: Table) -> tuple[Table, ...]:
    listener = getattr(table, "listener", None)
    return listener.parents if isinstance(listener, MergeListener) else (table,)


class MergeListener:
    """Maps each parent's update into its key region and unions them into one update."""

    result: Table

    def __init__(self, parents: tuple[Table, ...]) -> None:
        self.parents = parents

    def on_update(self, *updates: TableUpdate | None) -> TableUpdate | None:
        added, removed, modified = RowSet(), RowSet(), RowSet()
        begins: list[KeyArray] = []
        ends: list[KeyArray] = []
        deltas: list[KeyArray] = []
        cols: set[str] = set()
        for i, (parent, up) in enumerate(zip(self.parents, updates, strict=True)):  # one step per parent
            if up is None:
                continue
            _check_keys(parent, parent.rowset)
            off = i << REGION_BITS
            added |= up.added.shift(off)
            removed |= up.removed.shift(off)          # previous key space, same region
            if up.modified:
                modified |= up.modified.shift(off)
                cols |= up.modified_columns
            if up.shifted:
                s = up.shifted
                begins.append(s.begins + off)
                ends.append(s.ends + off)
                deltas.append(s.deltas)
        if begins:
            # regions ascend with i, so the concatenated ranges stay sorted and disjoint
            shifted = RowSetShiftData.from_arrays(np.concatenate(begins), np.concatenate(ends),
                                                  np.concatenate(deltas))
        else:
            shifted = RowSetShiftData.empty()
        if not (added or removed or modified or shifted):
            return None
        return TableUpdate(added, removed, modified, shifted, frozenset(cols) if modified else frozenset())
