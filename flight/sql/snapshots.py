"""Arrow snapshots of several live tables taken at one step (DESIGN.md §10).

A query names tables; :meth:`SnapshotCache.take` reads all of them under one hold of the
graph's shared lock, so a join of two tables sees one consistent moment, and reports that
step. A table's snapshot is kept while the table does not change (``Table.last_step``), so
queries between two changes of a table share one copy of it instead of taking another:
reading a 10M-row table that did not change since the last query costs nothing.

Only the columns a query names are read (``columns``); a snapshot is an Arrow table the
query engine scans in place (DuckDB reads Arrow without converting it).

**Zone maps.** An append table's rows never change once written, so the minimum and maximum
of an integer column over each block of :attr:`SnapshotCache.BLOCK` rows never change
either: :meth:`SnapshotCache.prune` keeps them per table (computed once per block, as the
table grows) and narrows a snapshot to the blocks that can hold rows within a query's
ranges (:func:`flight.sql.query.value_ranges`). A point lookup by a column that grows with
the table (an id, a sequence number, a time in integer units) then scans one block instead
of the table; DuckDB's scan of an Arrow table has no such index of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


@dataclass(slots=True)
class _Zones:
    """An append table's per-block minimum and maximum of some integer columns."""

    table: Table
    mins: dict[str, np.ndarray] = field(default_factory=dict)
    maxs: dict[str, np.ndarray] = field(default_factory=dict)


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
        self._zones: dict[str, _Zones] = {}
        self._lock = threading.Lock()

    #: Rows per block of a zone map (:meth:`prune`).
    BLOCK = 65_536

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
        if kept is not None and (kept.table is not table or kept.last_step != table.last_step):
            kept = None
        if kept is not None and set(columns) <= set(kept.columns):
            return kept.rows.select(list(columns))
        wanted = columns
        if kept is not None:  # the same rows, more columns: keep what the kept snapshot had too
            wanted = tuple(c for c in table.column_names if c in set(columns) | set(kept.columns))
        rows = table.to_arrow(wanted, lock=False)
        with self._lock:
            self._kept.pop(name, None)
            self._kept[name] = _Kept(table, table.last_step, wanted, rows)
            while len(self._kept) > self.max_tables:
                self._kept.pop(next(iter(self._kept)))
        return rows.select(list(columns)) if wanted != columns else rows

    def prune(self, name: str, table: Table, rows: pa.Table,
              ranges: Mapping[str, Sequence[tuple[int, int]]]) -> pa.Table:
        """``rows`` (a snapshot of append table ``table``, all its rows in order) narrowed to
        the blocks whose zone maps meet, for every column of ``ranges``, one of its closed
        intervals ``[lo, hi]``, and to its last, partial block: zero-copy slices, in order.
        Every row whose values lie within the ranges is kept; ``rows`` itself when most blocks
        meet them."""
        n = rows.num_rows
        full = n // self.BLOCK
        if full < 2:
            return rows
        keep = np.ones(full, dtype=bool)
        for column, intervals in ranges.items():
            mins, maxs = self._zones_of(name, table, rows, column, full)
            mins, maxs = mins[:full], maxs[:full]
            info = np.iinfo(mins.dtype)
            meets = np.zeros(full, dtype=bool)
            for lo, hi in intervals:
                if lo > info.max or hi < info.min or lo > hi:
                    continue  # no value of the column's type lies within
                lo, hi = max(lo, int(info.min)), min(hi, int(info.max))  # exact in the dtype
                meets |= (maxs >= lo) & (mins <= hi)
            keep &= meets
        if keep.sum() * 2 > full:
            return rows
        # runs of kept blocks, then the partial block (rows appended since the last full one)
        edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
        parts = [rows.slice(int(b) * self.BLOCK, int(e - b) * self.BLOCK)
                 for b, e in zip(edges[::2], edges[1::2], strict=True)]
        if n > full * self.BLOCK:
            parts.append(rows.slice(full * self.BLOCK))
        if not parts:
            return rows.schema.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def _zones_of(self, name: str, table: Table, rows: pa.Table, column: str,
                  full: int) -> tuple[np.ndarray, np.ndarray]:
        """``column``'s per-block minimum and maximum over the first ``full`` blocks of
        ``rows``, in the column's own integer type (exact), computed for the blocks not seen
        before (a block of nulls only has the type's maximum as its minimum and its minimum
        as its maximum: only an unbounded range keeps it)."""
        dtype = rows.schema.field(column).type.to_pandas_dtype()
        with self._lock:
            zones = self._zones.get(name)
            if zones is None or zones.table is not table:
                zones = self._zones[name] = _Zones(table)
            mins = zones.mins.get(column, np.empty(0, dtype))
            maxs = zones.maxs.get(column, np.empty(0, dtype))
        done = mins.size
        if done < full:
            block = self.BLOCK
            part = rows.column(column).slice(done * block, (full - done) * block)
            info = np.iinfo(dtype)
            lows = pc.fill_null(part, info.max).to_numpy().reshape(-1, block).min(axis=1)
            highs = pc.fill_null(part, info.min).to_numpy().reshape(-1, block).max(axis=1)
            mins, maxs = np.concatenate((mins, lows)), np.concatenate((maxs, highs))
            with self._lock:
                if zones.mins.get(column, mins).size <= mins.size:
                    zones.mins[column], zones.maxs[column] = mins, maxs
        return mins, maxs

    def forget(self, name: str) -> None:
        """Drop ``name``'s kept snapshot and zone maps (the table was dropped or replaced)."""
        with self._lock:
            self._kept.pop(name, None)
            self._zones.pop(name, None)

    def kept_bytes(self) -> int:
        """Bytes the kept snapshots hold."""
        with self._lock:
            return sum(k.rows.nbytes for k in self._kept.values())

