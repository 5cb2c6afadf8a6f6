"""Arrow snapshots of several live tables taken at one step (DESIGN.md §10).

A query names tables; :meth:`SnapshotCache.take` reads all of them under one hold of the
graph's shared lock, so a join of two tables sees one consistent moment, and reports that
step. A table's snapshot is kept while the table does not change (``Table.last_step``), so
queries between two changes of a table share one copy of it instead of taking another:
reading a 10M-row table that did not change since the last query costs nothing.

Only the columns a query names are read (``columns``); a snapshot is an Arrow table the
query engine scans in place (DuckDB reads Arrow without converting it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from engine.graph import UpdateGraph
from engine.table import Table

__all__ = ["Snapshot", "SnapshotCache"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Tables at one step: ``tables[name]`` is that table's rows at ``step``."""

    step: int
    tables: dict[str, pa.Table]


@dataclass(slots=True)
class _Kept:
    table: Table
    last_step: int
    columns: tuple[str, ...]
    rows: pa.Table


class SnapshotCache:
    """Takes snapshots at one step, keeping each table's last one while it is unchanged.

    Parameters
    ----------
    graph
        The graph every table lives in (one shared-lock hold reads them all).
    max_tables
        Snapshots kept at most (the least recently taken go first).
    """

    def __init__(self, graph: UpdateGraph, *, max_tables: int = 64) -> None:
        self.graph = graph
        self.max_tables = max_tables
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def take(self, tables: Sequence[tuple[str, Table, Sequence[str] | None]]) -> Snapshot:
        """Snapshots of ``tables`` (name, table, columns or ``None`` for all) at one step."""
        out: dict[str, pa.Table] = {}
        with self.graph.shared_lock():
            step = self.graph.step
            for name, table, columns in tables:
                cols = tuple(columns) if columns is not None else tuple(table.column_names)
                out[name] = self._read(name, table, cols)
        return Snapshot(step, out)

    def take_keys(self, name: str, table: Table, keys: pa.Table) -> Snapshot:
        """The rows ``table`` holds for ``keys`` (a keyed table's key columns), at one
        step: what a query that looks up those keys needs of it, read through the table's
        key index instead of copying the table."""
        with self.graph.shared_lock():
            step = self.graph.step
            table.check_alive()
            rows = table.lookup(keys, lock=False).rows  # type: ignore[attr-defined]
        return Snapshot(step, {name: rows})

    def _read(self, name: str, table: Table, columns: tuple[str, ...]) -> pa.Table:
        with self._lock:
            kept = self._kept.get(name)
        if (kept is not None and kept.table is table and kept.last_step == table.last_step
                and set(columns) <= set(kept.columns)):
            return kept.rows.select(list(columns))
        rows = table.to_arrow(columns, lock=False)
        with self._lock:
            self._kept.pop(name, None)
            self._kept[name] = _Kept(table, table.last_step, columns, rows)
            while len(self._kept) > self.max_tables:
                self._kept.pop(next(iter(self._kept)))
        return rows

    def forget(self, name: str) -> None:
        """Drop ``name``'s kept snapshot (the table was dropped or replaced)."""
        with self._lock:
            self._kept.pop(name, None)

    def kept_bytes(self) -> int:
        """Bytes the kept snapshots hold."""
        with self._lock:
            return sum(k.rows.nbytes for k in self._kept.values())

