"""``snapshot``: a static copy of a table's current rows.

The copy has its own storage and row keys ``0..n-1`` (the source's order), no parent and
no listener: it never updates, so it outlives its source's failures and closing.
"""

from __future__ import annotations

import numpy as np

from engine.columns import ColumnSource, make_column_source
from engine.rowset import RowSet
from engine.table import Table
from engine.update import TableUpdate

__all__ = ["snapshot"]


class _StaticTable(Table):
    """A table that never changes after it is built."""

    def _compute_update(self) -> TableUpdate | None:
        return None


def snapshot(table: Table) -> Table:
    """A static copy of ``table``'s current rows: own storage, row keys ``0..n-1``.

    The copy never updates and has no parent, so it outlives its source's failures.

    Examples
    --------
    >>> s = t.snapshot(); s.size == t.size
    True
    """
    graph = table.graph
    with graph.shared_lock():
        table.check_alive()
        keys = table.rowset.keys()
        n = keys.size
        new_keys = np.arange(n, dtype=np.int64)
        columns: dict[str, ColumnSource] = {}
        for f in table.schema:  # one copy per column
            storage = make_column_source(f.type, n)
            storage.set(new_keys, table.column(f.name).get(keys))
            columns[f.name] = storage
        return _StaticTable(graph, table.schema, columns, RowSet.from_range(0, n))
