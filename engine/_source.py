"""The base of source tables (:mod:`engine.sources`): staging of writes from any thread,
taken by the next cycle, and the checks that turn what a writer passes (an Arrow table or
batch, a pandas DataFrame, a dict of columns) into a table of the source's schema.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa

from engine.columns import (
    ColumnSource,
    WritableColumnSource,
    make_column_source,
)
from engine.errors import InputError, SchemaError
from engine.rowset import KeyArray, RowSet
from engine.table import Table

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

TableLike: TypeAlias = "pa.Table | pa.RecordBatch | pd.DataFrame | dict[str, Any]"


def as_schema(schema: Any) -> pa.Schema:
    """Accept a ``pa.Schema``, a list of ``(name, type)`` pairs or a ``{name: type}`` dict."""
    if isinstance(schema, pa.Schema):
        return schema
    if isinstance(schema, dict):
        return pa.schema(list(schema.items()))
    return pa.schema(schema)


def _to_arrow(data: TableLike) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, dict):
        return pa.table(data)
    raise SchemaError(f"expected a pyarrow Table/RecordBatch, a pandas DataFrame or a dict, got {type(data).__name__}")


def conform(table_name: str, schema: pa.Schema, data: TableLike, columns: list[str] | None = None) -> pa.Table:
    """Check ``data`` against ``schema`` (or its ``columns``) and return it in schema order.

    Column order may differ; types are cast when the cast is safe (no overflow or loss).

    Raises
    ------
    SchemaError
        Naming the missing, unexpected or mistyped columns.
    """
    t = _to_arrow(data)
    if columns is None and t.schema.equals(schema, check_metadata=True):
        return t  # already conformed (a writer's check before staging, say)
    want = columns if columns is not None else schema.names
    have = t.column_names
    missing = [c for c in want if c not in have]
    extra = [c for c in have if c not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing column(s) {missing}")
        if extra:
            parts.append(f"unknown column(s) {extra}")
        raise SchemaError(f"table {table_name!r}: {' and '.join(parts)} (expected: {want})")
    arrays = []
    for name in want:
        col = t.column(name)
        ftype = schema.field(name).type
        if col.type != ftype:
            try:
                col = col.cast(ftype, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaError(
                    f"table {table_name!r}: column {name!r} has type {col.type}, "
                    f"expected {ftype} ({exc})"
                ) from exc
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(n) for n in want]))


class SourceTable(Table):
    """The base of every source table: writers stage, the next cycle applies.

    A writer (any thread) checks its data, then stages it with :meth:`_stage`, which takes
    only the table's staging lock. In the cycle, the table's ``_compute_update`` takes what
    is staged with :meth:`_take_pending` and returns one update for all of it, applied in
    the order it was staged. With a ``graph.cycle_gate`` (durability), the graph first
    calls :meth:`_take_for_cycle` on every table, which sets the writes staged so far aside
    for that cycle, so writes staged after it wait for the next one.

    A subclass implements ``_compute_update`` (staged writes -> storage and a
    :class:`~engine.update.TableUpdate`) and :meth:`_restore` (a checkpoint's rows and row
    keys -> storage); it may override :meth:`_new_column` (one column's storage) and
    :meth:`_export_extra` (what its next writes depend on besides the rows). Checkpoints
    go through :meth:`export_state` and :meth:`restore_state`.
    """

    def __init__(self, graph: UpdateGraph, schema: Any, *, name: str | None = None,
                 columns: dict[str, ColumnSource] | None = None) -> None:
        sch = as_schema(schema)
        if len(set(sch.names)) != len(sch.names):
            raise SchemaError(f"duplicate column names in {sch.names}")
        self._storage: dict[str, WritableColumnSource] = {f.name: self._new_column(f.type) for f in sch}
        super().__init__(graph, sch, columns if columns is not None else dict(self._storage), name=name)
        self._pending: list[tuple[str, pa.Table]] = []
        # re-entrant: a thread holding it for a check-then-stage stages through _stage
        self._pending_lock = threading.RLock()
        self._taken: list[tuple[str, pa.Table]] | None = None  # see _take_for_cycle
        self._writer: int | None = None  # thread holding write_lock()

    @staticmethod
    def _new_column(type: pa.DataType) -> WritableColumnSource:
        return make_column_source(type)

    def _stage(self, kind: str, batch: pa.Table) -> None:
        self._check_alive()
        with self._pending_lock:
            self._pending.append((kind, batch))

    def _take_pending(self) -> list[tuple[str, pa.Table]]:
        with self._pending_lock:
            if self._taken is not None:  # set aside when the cycle began
                pending, self._taken = self._taken, None
                return pending
            pending, self._pending = self._pending, []
        return pending

    def _take_for_cycle(self) -> None:
        if self.parents:  # written by its own listener during the cycle (a dataflow's table)
            return
        with self._pending_lock:
            self._taken = (self._taken or []) + self._pending
            self._pending = []

    @property
    def pending_rows(self) -> int:
        with self._pending_lock:
            return sum(b.num_rows for _, b in self._pending)

    # durability: the state a checkpoint keeps ---------------------------------------
    def export_state(self) -> tuple[pa.Table, KeyArray, dict[str, Any]]:
        """This table's rows in row-key order, their row keys, and what its next writes
        depend on (JSON-ready), for a checkpoint.

        Call between cycles with the graph's shared lock held; staged writes are not part
        of it (the journal holds them).
        """
        keys = self.rowset.keys()
        rs = self.rowset
        if rs and rs.last() - rs.first() + 1 == len(rs):  # dense keys: ranges, no gather
            arrays = [self.column(n).get_range(rs.first(), rs.last() + 1) for n in self.column_names]
        else:
            arrays = [self.column(n).get(keys) for n in self.column_names]
        return pa.Table.from_arrays(arrays, schema=self.schema), keys, self._export_extra()

    def _export_extra(self) -> dict[str, Any]:
        return {}

    def restore_state(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        """Become exactly what :meth:`export_state` gave: same rows, same row keys.

        Only for a new table, before its first cycle and before anything derives from it.

        Raises
        ------
        SchemaError
            If ``rows`` does not match the schema.
        """
        if self.rowset or self.parents:
            raise InputError(f"table {self.name!r}: restore_state needs a new table")
        data = conform(self.name, self.schema, rows)
        self._restore(data, np.asarray(keys, dtype=np.int64), extra)
        self.rowset = RowSet.from_keys(np.asarray(keys, dtype=np.int64), assume_sorted=True)

    def _restore(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        raise NotImplementedError
