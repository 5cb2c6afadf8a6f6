"""``head``, ``tail`` and ``slice_``: a window of rows by position, kept live.

The window is resolved against the parent's current size every cycle, with Python slice
semantics (negative positions count from the end; ``head(-2)`` is all but the last two
rows and ``tail(-2)`` all but the first two, as in pandas). The child shares the parent's
column sources and key space; the parent's shifts pass through. Rows that enter the
window are adds, rows that leave it are removes, never modifies; a modify of a row that
stays in the window passes through.

Cost per cycle:

* a cycle without adds or removes (modifies, shifts) is O(change): positions cannot
  move, so the window is the old one shifted;
* otherwise the new window is derived from the old one: its surviving rows (shifted),
  plus the rows the parent added among them, cut to the new first/last key with
  rank-select lookups and ``remove_range`` — bitmap work per 65,536-key container of the
  window, never per row of it — plus the rows entering at either end, read by position
  (per row, but each of them is an add of this update). So a cycle costs
  O(change + window/65,536), far below materializing the window row by row with
  ``RowSet.slice``. Only a window
  replaced entirely (no surviving row) is read position by position, and then every
  row of it is an add anyway. The shift (un)application touches only keys that move.
* key spans are never materialized as range bitmaps unless compact: a window of a
  merge spans regions ``2**40`` keys apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import InputError
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Derivation, derive
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.table import Table

__all__ = ["SliceListener", "head", "slice_", "tail"]

log = logging.getLogger(__name__)

Resolver = Callable[[int], tuple[int, int]]


_FEW = 4096  # windows up to this many rows are read position by position


def _restrict(rows: RowSet, lo: int, hi: int) -> RowSet:
    """The keys ``lo <= k <= hi`` of ``rows``; cost per container of ``rows``, whatever the
    key span (a range bitmap over a sparse key space such as merge regions would not be)."""
    if not rows or hi < lo or rows.first() > hi or rows.last() < lo:
        return RowSet()
    if rows.first() >= lo and rows.last() <= hi:
        return rows
    bm = rows.bitmap.copy()
    if lo > 0:
        bm.remove_range(0, lo)
    if hi < rows.last():
        bm.remove_range(hi + 1, rows.last() + 1)
    return RowSet(bm)


def _window(rows: RowSet, start: int, stop: int) -> RowSet:
    """The keys at positions ``start <= p < stop`` (already clipped to ``rows``)."""
    if stop <= start:
        return RowSet()
    if start == 0 and stop == len(rows):
        return rows
    bm = rows.bitmap
    if stop - start <= _FEW:
        return RowSet(bm[start:stop])
    lo, hi = int(bm[start]), int(bm[stop - 1])  # rank-select, no per-row work
    if hi - lo <= 64 * (stop - start):  # a compact key span: a range bitmap is cheap
        return rows & RowSet.from_range(lo, hi + 1)
    return _restrict(rows, lo, hi)


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    return value


def head(table: Table, n: int) -> Table:
    """The first ``n`` rows (``n < 0``: all but the last ``-n``).

    Parameters
    ----------
    table
        The parent table.
    n
        Number of rows.

    Examples
    --------
    >>> t.head(2).size
    2
    """
    n = _check_int(n, "head: n")

    def resolve(size: int) -> tuple[int, int]:
        start, stop, _ = slice(0, n).indices(size)
        return start, stop

    return _build(table, resolve)


def tail(table: Table, n: int) -> Table:
    """The last ``n`` rows (``n < 0``: all but the first ``-n``).

    Examples
    --------
    >>> t.tail(2).size
    2
    """
    n = _check_int(n, "tail: n")

    def resolve(size: int) -> tuple[int, int]:
        start = max(size - n, 0) if n >= 0 else min(-n, size)
        return start, size

    return _build(table, resolve)


def slice_(table: Table, start: int, stop: int | None = None) -> Table:
    """The rows at positions ``start <= p < stop``, Python slice semantics.

    Negative positions count from the end; ``stop=None`` means the end. The window moves
    with the table: ``slice_(t, -10, -5)`` is always the 10th- to 6th-last rows.

    Examples
    --------
    >>> t.slice(1, None).size == t.size - 1
    True
    """
    start = _check_int(start, "slice: start")
    if stop is not None:
        stop = _check_int(stop, "slice: stop")
    py = slice(start, stop)

    def resolve(size: int) -> tuple[int, int]:
        s, e, _ = py.indices(size)
        return s, max(s, e)

    return _build(table, resolve)


def _build(table: Table, resolve: Resolver) -> Table:
    def plan() -> Derivation:
        rows = table.rowset
        return Derivation(table.schema, table.columns, _window(rows, *resolve(len(rows))),
                          SliceListener(table, resolve))

    return derive([table], plan)


class SliceListener:
    """Keeps ``result`` equal to the window ``resolve(parent.size)`` of the parent's rows."""

    result: Table

    def __init__(self, parent: Table, resolve: Resolver) -> None:
        self.parent = parent
        self._resolve = resolve

    def on_update(self, up: TableUpdate | None) -> TableUpdate | None:
        if up is None:
            return None
        before = self.result.rowset                       # previous key space
        if not (up.added or up.removed):
            # same size, same order: the window holds the same rows, maybe shifted
            now = up.shifted.apply(before)
            modified = up.modified & now
            moved = bool(up.shifted) and now != before
            if not (modified or moved):
                return None
            shifted = up.shifted if moved else RowSetShiftData.empty()
            cols = up.modified_columns if modified else frozenset()
            return TableUpdate(RowSet(), RowSet(), modified, shifted, cols)
        rows = self.parent.rowset
        kept = up.shifted.apply(before - up.removed)     # current key space from here on
        now = self._new_window(rows, kept, up.added)
        stayed = kept & now
        stayed_prev = up.shifted.unapply(stayed)         # removed is reported pre-shift
        removed = before - stayed_prev
        added = now - stayed
        modified = up.modified & stayed
        moved = bool(up.shifted) and stayed != stayed_prev
        shifted = up.shifted if moved else RowSetShiftData.empty()
        if not (added or removed or modified or shifted):
            return None
        cols = up.modified_columns if modified else frozenset()
        return TableUpdate(added, removed, modified, shifted, cols)

    def _new_window(self, rows: RowSet, kept: RowSet, added: RowSet) -> RowSet:
        """The window over ``rows`` (current), knowing ``kept``: the old window's surviving
        rows, shifted. The parent's rows between the first and last key of ``kept`` are
        ``kept`` plus rows added there (the old window was a block of positions and shifts
        keep order), so only rows entering at either end are read position by position."""
        start, stop = self._resolve(len(rows))
        if stop <= start:
            return RowSet()
        if not kept:
            return _window(rows, start, stop)
        bm = rows.bitmap
        kmin, kmax = kept.first(), kept.last()
        pmin, pmax = bm.rank(kmin) - 1, bm.rank(kmax) - 1  # positions in the parent now
        now = RowSet()
        lo, hi = max(start, pmin), min(stop - 1, pmax)
        if lo <= hi:
            inside = kept | _restrict(added, kmin, kmax)
            now = _restrict(inside, int(bm[lo]), int(bm[hi]))
        if start < pmin:
            now |= _window(rows, start, min(stop, pmin))       # entering at the front
        if stop > pmax + 1:
            now |= _window(rows, max(start, pmax + 1), stop)   # entering at the back
        return now
