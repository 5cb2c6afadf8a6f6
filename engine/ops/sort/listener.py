"""``sort``: a table's rows ordered by one or more columns, kept live.

Order: by the ``by`` columns in priority order, each ascending or descending; ties keep
the parent's row-key order (a stable sort, also for descending columns). **Null is the
largest value** (NaN counts as null): nulls come last in an ascending column and first
in a descending one, as pandas ``sort_values(na_position="last")`` for ascending and
``na_position="first"`` for descending. ``-0.0`` ties with ``0.0``; strings compare by
code point (bytewise UTF-8).

The sorted table copies no column data: each column reads the parent's column through a
redirection, output row key -> parent row key (and previous values through the previous
redirection). Its row keys are slots of a gapped key space kept by
:class:`engine.ops.sort._index.SortIndex`, so that

* a row inserted between two rows is one add, plus a shift of a few neighbours when the
  gap is full (never a cascade of modifies); keys stay dense (about two slots per row),
  so the sorted table's RowSet stays cheap Roaring containers;
* a row whose sort key changes is a remove and an add; a row whose other columns change
  is a modify at its current key; a parent shift changes no output key (only the
  redirection follows it).

Cost per cycle follows the change: a batched ``searchsorted`` per new row on the sort
codes, lookups by parent key, and writes to the few slots that change; see
``bench/bench_sort.py`` for the measured figures.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine._kernels.arrays import sort_keys, sorted_unique
from engine.columns import ColumnSource, RedirectingColumnSource
from engine.errors import InputError
from engine.ops.sort._index import SortIndex
from engine.ops.sort._keys import encoder_for
from engine.ops.sort._slots import Redirection
from engine.rowset import KeyArray, RowSet, RowSetShiftData
from engine.table import Derivation, DerivedTable, derive
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.table import Table

__all__ = ["RedirectedColumnSource", "SortListener", "SortedTable", "sort"]

log = logging.getLogger(__name__)

_EMPTY = np.empty(0, dtype=np.int64)


class RedirectedColumnSource(RedirectingColumnSource):
    """A parent column seen through the sort's redirection (output key -> parent key)."""

    def __init__(self, inner: ColumnSource, redirection: Redirection) -> None:
        self.inner = inner
        self.type = inner.type
        self._redirection = redirection

    @property
    def translation(self) -> object:
        return self._redirection

    def translate(self, keys: KeyArray) -> KeyArray:
        return self._redirection.pk(keys)

    def translate_prev(self, keys: KeyArray) -> KeyArray:
        # previous output keys -> previous parent keys (read with the parent's previous values)
        return self._redirection.prev_pk(keys)


def _by_list(table: Table, by: str | Sequence[str], descending: bool | Sequence[bool]
             ) -> tuple[list[str], list[bool]]:
    cols = [by] if isinstance(by, str) else list(by)
    if not cols:
        raise InputError(f"sort of table {table.name!r} needs at least one column in 'by'")
    for c in cols:
        if not isinstance(c, str):
            raise InputError(f"sort of table {table.name!r}: 'by' holds column names, got {c!r}")
    dupes = sorted({c for c in cols if cols.count(c) > 1})
    if dupes:
        raise InputError(f"sort of table {table.name!r}: column(s) {dupes} appear twice in 'by'")
    if isinstance(descending, (bool, np.bool_)):
        desc = [bool(descending)] * len(cols)
    else:
        desc = list(descending)
        if len(desc) != len(cols) or not all(isinstance(d, (bool, np.bool_)) for d in desc):
            raise InputError(
                f"sort of table {table.name!r}: 'descending' must be one bool or one bool per "
                f"column of 'by' ({len(cols)}), got {descending!r}"
            )
        desc = [bool(d) for d in desc]
    return cols, desc


def sort(table: Table, by: str | Sequence[str], descending: bool | Sequence[bool] = False) -> Table:
    """The rows of ``table`` ordered by the columns ``by``.

    Stable: rows with equal keys keep the parent's order. Null is the largest value, so
    nulls (and NaN) come last in an ascending column and first in a descending one.
    Live: a row inserted in the middle is an add (plus a shift of a few neighbours'
    keys), a row whose sort key changes is a remove and an add, and a row whose other
    columns change is a modify.

    Parameters
    ----------
    table
        The parent table.
    by
        A column name, or a list of them in priority order.
    descending
        One bool for every column, or one per column of ``by``.

    Returns
    -------
    Table
        A derived table with the parent's schema, reading the parent's columns (no copy).

    Raises
    ------
    SchemaError
        If a column of ``by`` does not exist or has a type that cannot be sorted.
    InputError
        If ``by`` is empty or repeats a column, or ``descending`` does not match ``by``.

    Examples
    --------
    Sort by price, largest first, ties by symbol:

    >>> t.sort(["Price", "Sym"], descending=[True, False]).to_pandas()  # doctest: +SKIP
    """
    cols, desc = _by_list(table, by, descending)
    encoders = [encoder_for(table.schema, c, d, table.name) for c, d in zip(cols, desc, strict=True)]

    def plan() -> Derivation:
        redirection = Redirection(64)
        index = SortIndex(encoders, [table.column(c) for c in cols], redirection)
        slots = index.build(table.rowset.keys())
        columns: dict[str, ColumnSource] = {
            name: RedirectedColumnSource(table.column(name), redirection) for name in table.column_names
        }
        spec = ", ".join(f"{c}{' desc' if d else ''}" for c, d in zip(cols, desc, strict=True))
        return Derivation(table.schema, columns, RowSet.from_keys(slots, assume_sorted=True),
                          SortListener(table, index, redirection, cols),
                          name=f"{table.name}.sort({spec})")

    return derive([table], plan, table_class=SortedTable)


class SortedTable(DerivedTable):
    """The sorted table. After a cycle that laid every row out again (a merged batch, a
    resize), its RowSet is read off the index's live bits rather than by shifting every
    row key of the previous one."""

    listener: SortListener

    def _next_rowset(self, update: TableUpdate, prev: RowSet) -> RowSet:
        laid = self.listener.take_layout()
        if laid is not None:
            return laid
        moved = self.listener.take_moves()
        if moved is None:
            return update.apply(prev)
        # the shift's moving rows are the survivors the index moved: no search of the
        # shift's ranges among the previous rows (one bitmap, changed in place)
        src, dst = moved
        bm = prev.bitmap - update.removed.bitmap
        bm -= RowSet.from_keys(src, assume_sorted=True).bitmap
        bm |= RowSet.from_keys(dst, assume_sorted=True).bitmap
        bm |= update.added.bitmap
        return RowSet(bm)


class SortListener:
    """Keeps ``result`` equal to ``parent`` sorted, one cycle at a time.

    Parameters
    ----------
    parent
        The sorted table.
    index
        The index holding the parent's rows in order, keyed by the result's row keys.
    redirection
        Result row key -> parent row key, shared with the result's columns.
    by
        The sort columns (a modify touching none of them cannot move a row).
    """

    result: Table

    def __init__(self, parent: Table, index: SortIndex, redirection: Redirection,
                 by: Sequence[str]) -> None:
        self.parent = parent
        self.index = index
        self._redirection = redirection
        self._by = frozenset(by)
        self._layout: RowSet | None = None  # the rows after this cycle's full layout
        self._moves: tuple[np.ndarray, np.ndarray] | None = None  # this cycle's moved survivors

    def take_moves(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The survivors this cycle moved, ``(previous keys, current keys)`` (sorted), when
        the update's shift is exactly those moves (no full layout), else None; once."""
        moves, self._moves = self._moves, None
        return moves

    def take_layout(self) -> RowSet | None:
        """The result's rows if this cycle laid them all out again (once), else None."""
        laid, self._layout = self._layout, None
        return laid

    def on_update(self, up: TableUpdate | None) -> TableUpdate | None:
        if up is None:
            return None
        idx = self.index
        self.parent.graph.track(self._redirection)  # before the first write of the cycle
        # removed rows: previous parent key space -> previous result key space
        removed = [idx.remove(up.removed.keys())]
        stay = _EMPTY
        rekeyed = _EMPTY
        known: tuple[list[np.ndarray], list[pa.Array]] | None = None
        if up.modified:
            cur = up.modified.keys()
            prev = up.shifted.unapply_keys(cur)
            slots = idx.slots_of(prev)
            if up.modified_columns & self._by:
                moved, codes, values = self._key_changed(slots, prev, cur)
                removed.append(idx.remove(prev[moved]))  # a new sort key: remove + add
                rekeyed = cur[moved]
                slots = slots[~moved]
                if rekeyed.size == cur.size:  # their codes are known: only the added rows are encoded
                    known = (codes, values)
                elif rekeyed.size:
                    sel = np.flatnonzero(moved)
                    known = ([c[sel] for c in codes], [v.take(pa.array(sel)) for v in values])
            stay = slots  # previous result key space until our own shift is known
        if up.shifted:
            # the parent moved keys: only the redirection follows, output keys stay
            prev_k, cur_k = up.shifted.moved_keys(self.parent.prev_rowset - up.removed)
            idx.repoint(prev_k, cur_k)
        added = up.added.keys()
        new = np.concatenate((added, rekeyed))
        if known is not None and added.size:
            a_codes, a_values = idx.encode(added)
            known = ([np.concatenate((a, m)) for a, m in zip(a_codes, known[0], strict=True)],
                     [pa.concat_arrays([a, m]) for a, m in zip(a_values, known[1], strict=True)])
        self._layout = self._moves = None
        if new.size:
            slots_new, shift = idx.insert(new, known)
            if idx.relaid:
                self._layout = RowSet(idx.live_bitmap())
            elif shift:
                self._moves = idx.moves
        else:
            idx.finish()
            slots_new, shift = _EMPTY, RowSetShiftData.empty()
        gone = idx.removed_sorted  # the removed rows are distinct rows: distinct slots
        if gone is None:
            gone = sorted_unique(np.concatenate(removed))
        modified = sorted_unique(shift.apply_keys(stay)) if stay.size else _EMPTY
        log.debug("sort %r: +%d -%d ~%d, %d moved", self.result.name, slots_new.size, gone.size,
                  modified.size, idx.moved)
        return TableUpdate.of(
            added=RowSet.from_keys(sort_keys(slots_new) if idx.placed_sorted is None else idx.placed_sorted,
                                   assume_sorted=True),
            removed=RowSet.from_keys(gone, assume_sorted=True),
            modified=RowSet.from_keys(modified, assume_sorted=True),
            shifted=shift,
            modified_columns=up.modified_columns,
        )

    def _key_changed(self, slots: KeyArray, prev: KeyArray, cur: KeyArray
                     ) -> tuple[np.ndarray, list[np.ndarray], list[pa.Array]]:
        """Which modified rows have a new sort key (their stored codes against new values),
        with the codes and values of all of them."""
        idx = self.index
        codes, values = idx.encode(cur)
        changed = np.zeros(cur.size, dtype=bool)
        for j, enc in enumerate(idx.encoders):
            old = idx.codes_at(j, slots)
            changed |= old != codes[j]
            if not enc.exact:
                amb = np.flatnonzero(~changed & enc.ambiguous(codes[j]))
                if amb.size:
                    before = self.parent.column(enc.column).get_prev(prev[amb])
                    changed[amb[enc.compare(before, values[j].take(pa.array(amb))) != 0]] = True
        return changed, codes, values
