"""The translator between table updates and differential triples (DESIGN.md §4).

Tables to triples: a cycle's :class:`TableUpdate` of a table becomes one consolidated
batch at ``time = (graph step,)``: removed rows' previous values and modified rows'
previous values with weight ``-1``, added rows' and modified rows' current values with
``+1`` (:func:`update_to_triples`; :func:`snapshot_to_triples` gives a table's current
rows). Row keys and positions do not travel: a table is a multiset of rows here.

Triples to tables: a batch is applied to a :class:`~engine.sources.KeyedTable` as deletes
and upserts (:func:`apply_triples`), which the table reports in its next cycle as one
update: a ``-1``/``+1`` pair for one key at one time is a modify. A keyed table holds each
key at most once, so the batch must be consistent with it; the rules and the resolution
into upserts and deletes live in :mod:`engine.differential.resolve`, shared with DoPut's
DIFF mode.

The bridges (:mod:`engine.differential.bridge`) are a listener calling
:func:`update_to_triples` each cycle (after one :func:`snapshot_to_triples`) and a keyed
table calling :func:`apply_triples` with a dataflow's output in the same cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine._kernels.hashing import rows_equal
from engine.differential.resolve import resolve_triples
from engine.differential.version import VersionLike
from engine.differential.zset import ZSet, concat
from engine.errors import InputError
from engine.sources import KeyedTable

if TYPE_CHECKING:
    from engine.table import Table
    from engine.update import TableUpdate

__all__ = ["apply_triples", "snapshot_to_triples", "update_to_triples"]


def _names(table: Table, columns: Sequence[str] | None) -> list[str]:
    names = list(columns) if columns is not None else table.column_names
    for n in names:
        table.column(n)  # raises SchemaError naming the table's columns
    return names


def update_to_triples(
    table: Table,
    update: TableUpdate,
    *,
    time: VersionLike | None = None,
    columns: Sequence[str] | None = None,
) -> ZSet:
    """The triples of ``table``'s update in the running cycle.

    Call it while the cycle runs (from a listener registered with ``table.listen``):
    previous values are read from the column sources and exist only then.

    Parameters
    ----------
    table
        The table that produced ``update`` this cycle.
    update
        Its update.
    time
        The version of the triples; the graph's step by default.
    columns
        The record columns (all by default). A modify touching none of them adds nothing.

    Returns
    -------
    ZSet
        One consolidated, timed batch.
    """
    names = _names(table, columns)
    at = time if time is not None else table.graph.step
    parts: list[ZSet] = []
    removed = update.removed.keys()                      # previous key space
    if removed.size:
        parts.append(ZSet(table.rows(removed, names, prev=True), np.full(removed.size, -1, np.int64)))
    if update.modified and update.modified_columns & set(names):
        cur = update.modified.keys()                     # current key space
        prev = update.shifted.unapply_keys(cur)          # the same rows, previous key space
        old = table.rows(prev, names, prev=True)
        new = table.rows(cur, names)
        changed = np.flatnonzero(~rows_equal(old, new))
        if changed.size:
            parts.append(ZSet(old.take(changed), np.full(changed.size, -1, np.int64)))
            parts.append(ZSet(new.take(changed), np.ones(changed.size, np.int64)))
    added = update.added.keys()                          # current key space
    if added.size:
        parts.append(ZSet(table.rows(added, names), np.ones(added.size, np.int64)))
    if not parts:
        schema = pa.schema([table.schema.field(n) for n in names])
        return ZSet.empty(schema).with_time(at)
    return concat(*parts).with_time(at).consolidate()


def snapshot_to_triples(
    table: Table, *, time: VersionLike | None = None, columns: Sequence[str] | None = None
) -> ZSet:
    """Every current row of ``table`` with weight ``+1`` at ``time`` (the step by default)."""
    names = _names(table, columns)
    data = table.to_arrow(names)
    at = time if time is not None else table.graph.step
    return ZSet(data, np.ones(data.num_rows, np.int64)).with_time(at).consolidate()


def apply_triples(table: KeyedTable, batch: ZSet) -> None:
    """Stage ``batch`` on a keyed table as deletes and upserts, for its next cycle.

    The batch is resolved by :func:`~engine.differential.resolve.resolve_triples` against
    the rows the table will hold once its staged writes are applied, and staged under the
    table's :meth:`~engine.sources.KeyedTable.write_lock`: no other write comes between the
    check and the staging, and consecutive batches compose exactly without a cycle between
    them. Times (one coordinate, or none) are walked in order, so a key's state after its
    last time is what the table will hold. A refused batch stages nothing.

    Raises
    ------
    SchemaError
        If the batch's columns are not the table's.
    InputError
        If a weight is not ``+1``/``-1``, a key gets two rows at one time, a ``-1``
        retracts a row the key does not hold, or a ``+1`` adds a second row for a key.
    """
    if not isinstance(table, KeyedTable):
        raise InputError(f"apply_triples needs a KeyedTable, got {type(table).__name__}")
    with table.write_lock():
        resolve_triples(table, batch).stage(table)
