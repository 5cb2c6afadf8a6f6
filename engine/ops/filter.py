"""``where``: the rows of a table for which a boolean expression is true, kept live.

The child shares the parent's column sources (no copy) and its key space: its RowSet is
a subset of the parent's, so the parent's shifts pass through unchanged and the child's
previous values are the parent's. Per cycle the predicate is evaluated only on the rows
the parent added, and on the rows it modified *if* the update touched a column the
predicate reads; otherwise membership cannot have changed and modifies pass through. A
row that starts or stops matching is an add or a remove, never a modify.

Cost per cycle: bitmap algebra between the update's row sets and the child's RowSet
(the whole RowSet is copied only in cycles with a shift, to apply it; cost per 65,536-key
container, never per row), and one vectorized evaluation over ``added`` plus, when an
input column changed, ``modified``: the cost follows the change, not the table
(``bench/bench_ops.py`` holds the change fixed while the table grows).
Null counts as false, as in SQL.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine import expr as _expr
from engine.errors import ExpressionError
from engine.rowset import KeyArray, RowSet, RowSetShiftData
from engine.table import Derivation, derive
from engine.update import TableUpdate

if TYPE_CHECKING:
    import pyarrow.compute as pc

    from engine.table import Table

__all__ = ["WhereListener", "where"]

log = logging.getLogger(__name__)


def where(table: Table, predicate: pc.Expression) -> Table:
    """Keep the rows for which ``predicate`` is true.

    Live: a row that starts or stops matching is an add or a remove, never a modify.
    A null result counts as false.

    Parameters
    ----------
    table
        The parent table.
    predicate
        Boolean ``pyarrow.compute`` expression over the parent's columns, by name.

    Returns
    -------
    Table
        A derived table sharing ``table``'s columns and row keys.

    Raises
    ------
    ExpressionError
        If ``predicate`` names a missing column, refers to a column by position, or is not
        boolean.

    Examples
    --------
    >>> t.where(pc.field("Price") > 50).size
    2
    """
    bound = _expr.bind(predicate, table.schema, table_name=table.name, what="where predicate")
    if bound.type != pa.bool_():
        raise ExpressionError(
            f"where predicate on table {table.name!r} must be boolean, but {bound.text} is "
            f"{bound.type} (compare it, e.g. pc.field('x') > 0)"
        )

    def plan() -> Derivation:
        listener = WhereListener(table, bound)
        # over an add-only parent only added rows are filtered, kept at their keys
        return Derivation(table.schema, table.columns, listener.matching(table.rowset), listener,
                          add_only=table.add_only, insert_only=table.insert_only)

    return derive([table], plan)


class WhereListener:
    """Keeps ``result`` equal to ``parent.where(predicate)``, one cycle at a time.

    Parameters
    ----------
    parent
        The filtered table.
    predicate
        The bound predicate; ``predicate.inputs`` are the columns whose modification can
        change a row's membership.
    """

    result: Table

    def __init__(self, parent: Table, predicate: _expr.BoundExpression) -> None:
        self.parent = parent
        self.predicate = predicate
        self._inputs = frozenset(predicate.inputs)

    def matching(self, rows: RowSet) -> RowSet:
        """The members of ``rows`` (parent's current key space) that satisfy the predicate."""
        if not rows:
            return rows
        keys = rows.keys()
        return RowSet.from_keys(keys[self._mask(keys)], assume_sorted=True)

    def _mask(self, keys: KeyArray) -> npt.NDArray[np.bool_]:
        values = _expr.gather(self.parent.columns, self.predicate.inputs, keys)
        return _expr.predicate_mask(self.predicate, values, keys.size)

    def on_update(self, up: TableUpdate | None) -> TableUpdate | None:
        if up is None:
            return None
        before = self.result.rowset                    # previous key space
        removed = up.removed & before
        if up.shifted:
            survivors = before - removed
            kept = up.shifted.apply(survivors)         # current key space from here on
            # filtering never moves keys: the parent's shifts are the child's, reported
            # only when they move one of the child's rows
            moved = kept != survivors
            shifted = up.shifted if moved else RowSetShiftData.empty()
        else:
            # without a shift the current key space is the previous one, and a modified
            # row is never a removed one, so ``before`` stands for ``before - removed``
            # below (building that would copy the whole RowSet every cycle)
            kept = before
            shifted = RowSetShiftData.empty()
        modified = up.modified & kept
        if up.modified and up.modified_columns & self._inputs:
            # membership can change only for rows whose predicate inputs changed; one
            # evaluation covers them and the added rows
            add_keys, mod_keys = up.added.keys(), up.modified.keys()
            mask = self._mask(np.concatenate((add_keys, mod_keys)))
            added = RowSet.from_keys(add_keys[mask[: add_keys.size]], assume_sorted=True)
            hits = RowSet.from_keys(mod_keys[mask[add_keys.size:]], assume_sorted=True)
            added |= hits - kept                       # started matching
            left = modified - hits                     # stopped matching (current key space)
            removed |= up.shifted.unapply(left)        # removed is reported pre-shift
            modified &= hits
        else:
            added = self.matching(up.added)
        if not (added or removed or modified or shifted):
            return None                                # silent this cycle
        cols = up.modified_columns if modified else frozenset()
        return TableUpdate(added, removed, modified, shifted, cols)
