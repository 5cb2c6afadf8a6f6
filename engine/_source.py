"""The base of source tables (:mod:`engine.sources`): the one check a write passes, and
staging of checked writes from any thread, taken by the next cycle.

Every write is checked once, by :meth:`SourceTable.check_batch`: it turns what a writer
passes (an Arrow table or batch, a pandas DataFrame, a dict of columns) into a
:class:`CheckedBatch` of the table's schema, which :meth:`SourceTable.stage` takes as it
is. The write methods (``append``, ``upsert``, ``delete``) are the two calls in a row; a
server checks a batch when it arrives and stages it (or holds it for a commit) later.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from engine.columns import (
    ColumnSource,
    WritableColumnSource,
    make_column_source,
    read_columns,
    read_range,
)
from engine.errors import InputError, SchemaError, quoted
from engine.rowset import KeyArray, RowSet
from engine.table import Table

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

__all__ = ["CheckedBatch", "SourceTable", "TableLike", "as_schema", "conform"]

TableLike: TypeAlias = "pa.Table | pa.RecordBatch | pd.DataFrame | dict[str, Any]"

_serials = itertools.count(1)  # one per source table: which table checked a batch


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

    Column order may differ; types are cast when the cast is safe (no overflow or loss). A
    field of ``schema`` that is not nullable (``NOT NULL``) takes no null.

    Raises
    ------
    SchemaError
        Naming a repeated column, or the missing, unexpected or mistyped columns, or a
        column declared not nullable that holds nulls.
    """
    t = _to_arrow(data)
    if columns is None and t.schema.equals(schema, check_metadata=True):
        _not_null(table_name, schema, t)
        return t  # already conformed (rows read from a table of this schema, say)
    want = columns if columns is not None else schema.names
    have = t.column_names
    if len(set(have)) < len(have):  # pyarrow cannot tell the columns apart (KeyError below)
        column, n = next((c, n) for c, n in Counter(have).items() if n > 1)
        raise SchemaError(f"table {quoted(table_name)}: column {quoted(column)} appears {n} "
                          f"times; column names must be unique")
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
    out = pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(n) for n in want]))
    _not_null(table_name, schema, out)
    return out


def _not_null(table_name: str, schema: pa.Schema, t: pa.Table) -> None:
    """Refuse nulls in the columns of ``t`` that ``schema`` declares not nullable."""
    for f in schema:
        if not f.nullable and f.name in t.column_names:
            n = t.column(f.name).null_count
            if n:
                raise SchemaError(f"table {quoted(table_name)}: column {quoted(f.name)} is NOT "
                                  f"NULL and the rows hold {n} null(s)")


@dataclass(frozen=True, slots=True)
class CheckedBatch:
    """Rows checked for one write into one source table: staged as they are.

    Made by :meth:`SourceTable.check_batch`, and by :meth:`take` and :meth:`deletes` from
    one; :meth:`SourceTable.stage` does not check it again when given to the table that
    checked it. Holds no reference to that table (a batch held for a commit does not keep
    a dropped table alive).

    Attributes
    ----------
    kind
        The write: ``"append"``, ``"upsert"`` or ``"delete"``.
    data
        The rows in the table's schema: its columns in its order and types (a ``"delete"``:
        the key columns only). Key columns hold no nulls.
    keys
        The table's key columns (none for an append-only or ring table).
    checked_by
        Which table checked it (a number of its own per source table).
    """

    kind: str
    data: pa.Table
    keys: tuple[str, ...]
    checked_by: int

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def take(self, rows: npt.NDArray[np.int64]) -> CheckedBatch:
        """The write of the given rows only (row numbers of :attr:`data`), still checked."""
        return CheckedBatch(self.kind, self.data.take(rows), self.keys, self.checked_by)

    def deletes(self, rows: npt.NDArray[np.int64]) -> CheckedBatch:
        """A ``"delete"`` of the keys of the given rows of this keyed write, still checked."""
        assert self.keys, "a delete is of a keyed table's rows"
        return CheckedBatch("delete", self.data.select(list(self.keys)).take(rows), self.keys,
                            self.checked_by)


class SourceTable(Table):
    """A table whose rows writers stage from any thread, and the next cycle applies.

    A write is checked once, by :meth:`check_batch`, then staged by :meth:`stage`; the
    write methods of the subclasses (:meth:`~engine.sources.AppendOnlyTable.append`,
    :meth:`~engine.sources.KeyedTable.upsert`, :meth:`~engine.sources.KeyedTable.delete`)
    do both. A writer that checks a batch on arrival and stages it later (a server holding
    it for a commit) calls them apart.

    Staging takes only the table's staging lock. In the cycle, the table's
    ``_compute_update`` takes what is staged with :meth:`_take_pending` and returns one update
    for all of it, applied in the order it was staged. With a ``graph.cycle_gate``
    (durability), the graph first calls :meth:`_take_for_cycle` on every table, which sets the
    writes staged so far aside for that cycle, so writes staged after it wait for the next one.

    A subclass implements ``_compute_update`` (staged writes -> storage and a
    :class:`~engine.update.TableUpdate`) and :meth:`_restore` (a checkpoint's rows and row
    keys -> storage); it may override :meth:`_new_column` (one column's storage) and
    :meth:`_export_extra` (what its next writes depend on besides the rows). Checkpoints
    go through :meth:`export_state` and :meth:`restore_state`.
    """

    #: The writes this table takes: the ``kind`` of :meth:`check_batch`.
    write_kinds: tuple[str, ...] = ("append",)

    def __init__(self, graph: UpdateGraph, schema: Any, *, name: str | None = None,
                 columns: dict[str, ColumnSource] | None = None) -> None:
        sch = as_schema(schema)
        if len(set(sch.names)) != len(sch.names):
            raise SchemaError(f"duplicate column names in {sch.names}")
        self._storage: dict[str, WritableColumnSource] = {f.name: self._new_column(f.type) for f in sch}
        super().__init__(graph, sch, columns if columns is not None else dict(self._storage), name=name)
        self._pending: list[tuple[str, pa.Table]] = []
        self._pending_bytes = 0  # the buffers of self._pending's batches
        # re-entrant: a thread holding it for a check-then-stage stages through stage_all
        self._pending_lock = threading.RLock()
        self._taken: list[tuple[str, pa.Table]] | None = None  # see _take_for_cycle
        self._writer: int | None = None  # thread holding write_lock()
        self._stages = 0  # see stages
        self._serial = next(_serials)

    # writes: checked once, then staged -----------------------------------------------
    def check_batch(self, data: TableLike, kind: str) -> CheckedBatch:
        """Check ``data`` for a ``kind`` write into this table; nothing is staged.

        The one check of a write: column names are unique, the columns are the table's
        (any order; types cast when the cast is safe: no overflow or loss), or exactly
        its key columns for a ``"delete"``, and key columns hold no nulls.

        Parameters
        ----------
        data
            A pyarrow Table or RecordBatch, a pandas DataFrame or a dict of columns.
        kind
            One of :attr:`write_kinds`: ``"append"`` for an append-only or ring table,
            ``"upsert"`` or ``"delete"`` for a keyed table.

        Returns
        -------
        CheckedBatch
            The rows in the table's schema, for :meth:`stage`.

        Raises
        ------
        InputError
            If the table does not take ``kind`` writes.
        SchemaError
            Naming the repeated, missing, unknown or mistyped column.
        InvalidKeyError
            If a key column holds nulls.

        Examples
        --------
        >>> checked = t.check_batch({"k": [1], "v": [1.0]}, "upsert")
        >>> t.stage(checked); graph.run_cycle()
        """
        if kind not in self.write_kinds:
            raise InputError(f"table {quoted(self.name)} takes {' and '.join(self.write_kinds)} "
                             f"writes, not {quoted(kind)}")
        return CheckedBatch(kind, self._checked(data, kind), self._key_columns(), self._serial)

    def _checked(self, data: TableLike, kind: str) -> pa.Table:
        """``data`` conformed for a ``kind`` write (one of :attr:`write_kinds`)."""
        return conform(self.name, self.schema, data)

    def _key_columns(self) -> tuple[str, ...]:
        return ()

    def stage(self, batch: CheckedBatch) -> None:
        """Stage a checked write for the next cycle.

        Not checked again when this table checked it; a batch another table checked (a
        write held for a commit while its table was dropped and created anew, say) is
        checked against this one first.

        Raises
        ------
        TableFailed
            If the table failed in an earlier cycle.
        InputError
            Whatever :meth:`check_batch` raises, for a batch another table checked.
        """
        self.stage_all((batch,))

    def stage_all(self, batches: Sequence[CheckedBatch]) -> None:
        """Stage several checked writes at once: one cycle takes all of them, in order.

        As :meth:`stage` for each (raising what it raises), under the table's staging lock
        alone, so no cycle and no other writer of this table comes in between; a batch that
        fails its check stages nothing of the others.
        """
        checked = [b if b.checked_by == self._serial else self.check_batch(b.data, b.kind)
                   for b in batches]
        self.check_alive()
        with self._pending_lock:
            for b in checked:
                self._pending.append((b.kind, b.data))
                self._pending_bytes += b.data.get_total_buffer_size()
            self._stages += 1

    @property
    def stages(self) -> int:
        """How many times writes were staged into this table (:meth:`stage_all` calls).

        The rows the table will hold once what is staged is applied (``lookup(staged=True)``
        of a keyed table) change only when this does: a cycle applying the staged writes
        does not change them. A check made against them stays true while this is unchanged,
        so it can be made without holding the table (and confirmed by this under its lock).
        """
        return self._stages

    @staticmethod
    def _new_column(type: pa.DataType) -> WritableColumnSource:
        return make_column_source(type)

    def _take_pending(self) -> list[tuple[str, pa.Table]]:
        # _taken is read and written by cycles alone (under the graph's exclusive lock);
        # writers only append to _pending, under the staging lock
        if self._taken is not None:  # set aside when the cycle began
            pending, self._taken = self._taken, None
            return pending
        if not self._pending:
            # nothing staged: a write staged from now on is the next cycle's, as it would
            # be had it waited for the lock after us (an idle source pays no lock)
            return []
        with self._pending_lock:
            pending, self._pending = self._pending, []
            self._pending_bytes = 0
        return pending

    def _take_for_cycle(self) -> None:
        if self.parents:  # written by its own listener during the cycle (a dataflow's table)
            return
        if not self._pending:  # nothing to set aside (as in _take_pending): no lock
            if self._taken is None:
                self._taken = []
            return
        with self._pending_lock:
            self._taken = (self._taken or []) + self._pending
            self._pending = []
            self._pending_bytes = 0

    @property
    def pending_rows(self) -> int:
        with self._pending_lock:
            return sum(b.num_rows for _, b in self._pending)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the writes staged for the next cycle (their Arrow buffers), not yet taken
        by a cycle; a cycle that began takes them (0 again) before it applies them."""
        return self._pending_bytes

    # durability: the state a checkpoint keeps ---------------------------------------
    def export_state(self) -> tuple[pa.Table, KeyArray, dict[str, Any]]:
        """This table's rows in row-key order, their row keys, and what its next writes
        depend on (JSON-ready), for a checkpoint.

        Call between cycles with the graph's shared lock held; staged writes are not part
        of it (the journal holds them).
        """
        keys = self.rowset.keys()
        rs = self.rowset
        sources = [self.column(n) for n in self.column_names]
        if rs and rs.last() - rs.first() + 1 == len(rs):  # dense keys: ranges, no gather
            arrays = read_range(sources, rs.first(), rs.last() + 1)
        else:
            arrays = read_columns(sources, keys)
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
