"""Source tables: where changes enter the graph.

Writes (``append``, ``upsert``, ``delete``) may come from any thread. They are checked at
once, by :meth:`SourceTable.check_batch` — a bad batch raises and stages nothing — and
applied together at the start of the next cycle, as one update. A writer may check a batch
and stage the :class:`CheckedBatch` later (:meth:`SourceTable.stage`): it is not checked
again.

* :class:`SourceTable` — the base of them all: staging from any thread, taken by the next
  cycle, and checkpoints (``export_state``/``restore_state``).
* :class:`AppendOnlyTable` — rows only arrive; keys ``0..n-1`` in arrival order.
* :class:`KeyedTable` — upsert and delete by key columns. A key keeps its row key for its
  whole life; row keys freed by deletes are reused in later cycles (so row order is row
  key order, not arrival order). Within one cycle the last write to a key wins, in the
  order the batches were staged and, inside a batch, the order of its rows. A modify is
  reported only for rows whose values really changed, and ``modified_columns`` names
  exactly the columns that changed. :meth:`KeyedTable.lookup` reads the rows of given
  keys, as the last cycle left them or with the staged writes folded in (the same last
  write wins); a lookup and the writes staged after it under
  :meth:`KeyedTable.write_lock` are atomic, which is how a write checked against the
  key's current row (differential triples) is staged without running a cycle.

Locks: the graph's shared lock, then a table's staging lock (a cycle holds the graph's
exclusive lock when it takes the staged writes); a writer that only stages takes the
staging lock alone.
* :class:`RingTable` — append-only with a bound: the oldest rows are removed.
* :class:`ReplicaTable` — changes exactly as a table of another server did: its updates,
  one for one, under its row keys (a mirrored table, :mod:`flight.links`).
* :class:`TimerTable` — one row per tick, for demos.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from engine._keyed import KeyedTable as KeyedTable
from engine._keyed import KeyLookup as KeyLookup
from engine._replica import ReplicaChange as ReplicaChange
from engine._replica import ReplicaReset as ReplicaReset
from engine._replica import ReplicaTable as ReplicaTable
from engine._source import CheckedBatch as CheckedBatch
from engine._source import SourceTable as SourceTable
from engine._source import TableLike as TableLike
from engine._source import as_schema as as_schema
from engine._source import conform as conform
from engine.columns import (
    AppendColumnSource,
    ColumnSource,
    NumpyColumnSource,
    RemappedColumnSource,
    WritableColumnSource,
    make_column_source,
    numpy_storage_dtype,
)
from engine.errors import SchemaError
from engine.rowset import KeyArray, RowSet
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

__all__ = ["AppendOnlyTable", "CheckedBatch", "KeyLookup", "KeyedTable", "ReplicaChange",
           "ReplicaReset", "ReplicaTable", "RingTable", "SourceTable", "TableLike", "TimerTable", "as_schema", "conform"]


class AppendOnlyTable(SourceTable):
    """Rows only arrive; row keys are ``0..size-1`` in arrival order.

    Fixed-width columns are numpy arrays (fast gathers of any keys, which sorted views and
    joins do); other columns are Arrow chunks indexed by position
    (:class:`AppendColumnSource`, no slot array to write). It is
    :attr:`~engine.table.Table.add_only`: every update only adds keys after the last.
    """

    add_only = True

    @staticmethod
    def _new_column(type: pa.DataType) -> WritableColumnSource:
        if numpy_storage_dtype(type) is not None:
            # rows only arrive: snapshots share the stored values (get_range)
            return NumpyColumnSource(type, written_before_read=True, append_only=True)
        return AppendColumnSource(type)

    def append(self, data: TableLike) -> None:
        """Stage rows to appear in the next cycle.

        :meth:`check_batch` (``"append"``) then :meth:`stage`.

        Raises
        ------
        SchemaError
            If columns are repeated, missing, unknown or of a type that cannot be cast safely.
        """
        self.stage(self.check_batch(data, "append"))

    def _compute_update(self) -> TableUpdate | None:
        pending = self._take_pending()
        if not pending:
            return None
        batch = pa.concat_tables([b for _, b in pending])
        n = batch.num_rows
        if n == 0:
            return None
        start = self.rowset.last() + 1 if self.rowset else 0
        for name, src in self._storage.items():
            src.set_new_range(start, batch.column(name))  # new keys: nothing previous to keep
        return TableUpdate.of(added=RowSet.from_range(start, start + n))

    def _restore(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        if keys.size and not (keys[0] == 0 and keys[-1] == keys.size - 1):
            raise SchemaError(f"table {self.name!r}: append-only row keys must be 0..n-1")
        if keys.size:
            for name, src in self._storage.items():
                src.set_new_range(0, rows.column(name))


class RingTable(SourceTable):
    """Append-only, keeping the newest ``capacity`` rows; older rows are removed.

    Row keys keep increasing; row key ``k`` is stored in slot ``k % capacity``.
    """

    def __init__(self, graph: UpdateGraph, schema: Any, capacity: int, *, name: str | None = None) -> None:
        if capacity <= 0:
            raise SchemaError(f"ring capacity must be positive, got {capacity}")
        self.capacity = capacity
        sch = as_schema(schema)
        cap = np.int64(capacity)

        def slot(k: KeyArray) -> KeyArray:
            return k % cap

        self._slot = slot
        storage = {f.name: make_column_source(f.type, capacity) for f in sch}
        views: dict[str, ColumnSource] = {n: RemappedColumnSource(s, slot) for n, s in storage.items()}
        super().__init__(graph, sch, name=name, columns=views)
        self._storage = storage
        self._next = 0

    def append(self, data: TableLike) -> None:
        """Stage rows; if more than ``capacity`` arrive in one cycle only the newest stay.

        :meth:`check_batch` (``"append"``) then :meth:`stage`.
        """
        self.stage(self.check_batch(data, "append"))

    def _compute_update(self) -> TableUpdate | None:
        pending = self._take_pending()
        if not pending:
            return None
        batch = pa.concat_tables([b for _, b in pending])
        n = batch.num_rows
        if n == 0:
            return None
        end = self._next + n
        keep_from = max(0, n - self.capacity)
        first_new = self._next + keep_from
        keys = np.arange(first_new, end, dtype=np.int64)
        for name, src in self._storage.items():
            self.graph.track(src)  # slots of removed rows are overwritten
            src.set(self._slot(keys), batch.column(name).slice(keep_from))
        self._next = end
        new_start = max(0, end - self.capacity)
        removed = self.rowset & RowSet.from_range(0, new_start) if self.rowset else RowSet()
        return TableUpdate.of(added=RowSet.from_range(first_new, end), removed=removed)

    def _export_extra(self) -> dict[str, Any]:
        return {"next": self._next}

    def _restore(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        nxt = int(extra["next"])
        if keys.size and (keys.size > self.capacity or keys[-1] >= nxt
                          or keys[-1] - keys[0] != keys.size - 1):
            raise SchemaError(f"table {self.name!r}: ring row keys must be one run below {nxt} "
                              f"of at most {self.capacity} keys")
        for name, src in self._storage.items():
            src.set(self._slot(keys), rows.column(name))
        self._next = nxt


class TimerTable(AppendOnlyTable):
    """Adds one row ``(Timestamp, Tick)`` per cycle once ``period`` seconds have passed."""

    def __init__(self, graph: UpdateGraph, period: float = 1.0, *, name: str | None = None) -> None:
        super().__init__(graph, pa.schema([("Timestamp", pa.timestamp("ns")), ("Tick", pa.int64())]), name=name)
        self.period = period
        self._last = 0.0
        self._tick = 0

    def _compute_update(self) -> TableUpdate | None:
        now = time.time()
        if now - self._last >= self.period:
            self._last = now
            self.append(pa.table({"Timestamp": pa.array([int(now * 1e9)], pa.timestamp("ns")),
                                  "Tick": pa.array([self._tick], pa.int64())}))
            self._tick += 1
        return super()._compute_update()
