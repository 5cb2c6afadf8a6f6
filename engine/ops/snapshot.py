"""``snapshot``: a static copy of a table's current rows; ``static_table``: a table of given rows.

The copy has its own storage and row keys ``0..n-1`` (the source's order), no parent and
no listener: it never updates, so it outlives its source's failures and closing. A
``static_table`` is the same kind of table, built from an Arrow table instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine.columns import ColumnSource, make_column_source
from engine.rowset import RowSet
from engine.table import Table
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

__all__ = ["snapshot", "static_table"]


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


def static_table(graph: UpdateGraph, data: pa.Table, name: str | None = None) -> Table:
    """A table on ``graph`` holding ``data``'s rows (row keys ``0..n-1``) that never updates.

    A constant operand for operations on live tables: SQL's global aggregate joins its
    one-row result to a one-row static table, so that an empty input still gives a row.

    Examples
    --------
    >>> static_table(g, pa.table({"one": [0]})).to_arrow().to_pydict()
    {'one': [0]}
    """
    n = data.num_rows
    keys = np.arange(n, dtype=np.int64)
    columns: dict[str, ColumnSource] = {}
    for f, col in zip(data.schema, data.columns, strict=True):  # one copy per column
        storage = make_column_source(f.type, n)
        storage.set(keys, col)
        columns[f.name] = storage
    return _StaticTable(graph, data.schema, columns, RowSet.from_range(0, n), name=name)
