"""The translator between table updates and differential triples (DESIGN.md §4).

Tables to triples: a cycle's :class:`TableUpdate` of a table becomes one consolidated
batch at ``time = (graph step,)``: removed rows' previous values and modified rows'
previous values with weight ``-1``, added rows' and modified rows' current values with
``+1`` (:func:`update_to_triples`; :func:`snapshot_to_triples` gives a table's current
rows). Row keys and positions do not travel: a table is a multiset of rows here.

Triples to tables: a batch is applied to a :class:`~engine.sources.KeyedTable` as deletes
and upserts (:func:`apply_triples`), which the table reports in its next cycle as one
update: a ``-1``/``+1`` pair for one key at one time is a modify. A keyed table holds each
key at most once, so the batch must be consistent with it: weights ``+1``/``-1`` after
consolidation, at most one of each per key and time, and every ``-1`` retracting the
row the key holds at that point (the table's current row, or the key's ``+1`` at its
previous time in the batch).

The bridges (:mod:`engine.differential.bridge`) are a listener calling
:func:`update_to_triples` each cycle (after one :func:`snapshot_to_triples`) and a keyed
table calling :func:`apply_triples` with a dataflow's output in the same cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._hashing import exact_hash, group_equal, hash_rows, rows_equal, same_rows
from engine.differential.version import VersionLike
from engine.differential.zset import ZSet, concat
from engine.errors import InputError
from engine.sources import KeyedTable, _key_hashes, conform

if TYPE_CHECKING:
    from engine.table import Table
    from engine.update import TableUpdate

__all__ = ["apply_triples", "snapshot_to_triples", "update_to_triples"]

I64 = npt.NDArray[np.int64]


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

    The batch is consolidated per (record, time); times (one coordinate, or none) are
    walked in order, so a key's state after its last time is what the table will hold.
    Consistency is checked against the table's rows when staging (the table should have
    no other writer in the meantime).

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
    if batch.dims is not None and batch.dims != 1:
        raise InputError(
            f"table {table.name!r}: keyed tables take one-coordinate times (or none), got {batch.dims}"
        )
    data = conform(table.name, table.schema, batch.data)
    z = ZSet(data, batch.diffs, batch.times).consolidate()
    n = z.num_rows
    if n == 0:
        return
    bad = np.flatnonzero(np.abs(z.diffs) != 1)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"table {table.name!r} is keyed by {table.keys}: it holds each row at most once, so "
            f"triples need weights +1 or -1, got {int(z.diffs[i])} for "
            f"{z.data.slice(i, 1).to_pylist()[0]} ({bad.size} such row(s)); consolidate the "
            f"collection to distinct rows first"
        )
    keys = list(table.keys)
    t = np.zeros(n, np.int64) if z.times is None else z.times[:, 0]
    key_cols = z.data.select(keys)
    order, starts = group_equal(
        hash_rows(z.data, keys),
        None if exact_hash(z.schema, keys) else (lambda i, j: same_rows(key_cols, i, j)),
    )
    gid = np.empty(n, np.int64)
    gid[order] = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))

    # one step per (key, time), in time order; inside a step -1 sorts before +1
    o = np.lexsort((z.diffs, t, gid))
    g, tt, d = gid[o], t[o], z.diffs[o]
    new_step = np.ones(n, dtype=bool)
    new_step[1:] = (g[1:] != g[:-1]) | (tt[1:] != tt[:-1])
    step = np.cumsum(new_step) - 1
    n_steps = int(step[-1]) + 1
    minus = np.full(n_steps, -1, np.int64)
    plus = np.full(n_steps, -1, np.int64)
    for sign, slot in ((-1, minus), (1, plus)):  # one pass per sign
        sel = d == sign
        if np.bincount(step[sel], minlength=n_steps).max(initial=0) > 1:
            s = int(np.flatnonzero(np.bincount(step[sel], minlength=n_steps) > 1)[0])
            row = int(o[np.flatnonzero(step == s)[0]])
            raise InputError(
                f"table {table.name!r}: key {key_cols.slice(row, 1).to_pylist()[0]} gets two "
                f"{'+1' if sign > 0 else '-1'} rows at time {int(t[row])}; a keyed table holds one "
                f"row per key"
            )
        slot[step[sel]] = o[sel]
    step_key = g[new_step]
    first = np.ones(n_steps, dtype=bool)
    first[1:] = step_key[1:] != step_key[:-1]

    # the key's row before each step: the table's row, then the previous step's +1
    cur, cur_of_key = _current_rows(table, key_cols.take(o[new_step][first]))
    src = pa.concat_tables([cur, z.data])
    before = np.full(n_steps, -1, np.int64)
    before[first] = cur_of_key
    later = np.flatnonzero(~first)
    prev_plus = plus[later - 1]
    before[later] = np.where(prev_plus >= 0, cur.num_rows + prev_plus, -1)
    had, has_minus = before >= 0, minus >= 0
    wrong = has_minus & ~had
    check = np.flatnonzero(has_minus & had)
    if check.size:
        wrong[check] = ~rows_equal(src.take(before[check]), z.data.take(minus[check]))
    if wrong.any():
        s = int(np.flatnonzero(wrong)[0])
        held = src.slice(int(before[s]), 1).to_pylist()[0] if before[s] >= 0 else None
        raise InputError(
            f"table {table.name!r}: triple {z.data.slice(int(minus[s]), 1).to_pylist()[0]} at time "
            f"{int(t[minus[s]])} retracts a row the key does not hold (it holds {held})"
        )
    second = ~has_minus & had
    if second.any():
        s = int(np.flatnonzero(second)[0])
        raise InputError(
            f"table {table.name!r}: triple {z.data.slice(int(plus[s]), 1).to_pylist()[0]} at time "
            f"{int(t[plus[s]])} adds a second row for a key that holds "
            f"{src.slice(int(before[s]), 1).to_pylist()[0]}; retract it in the same time"
        )

    # the last step of each key decides: its +1 is upserted, else the key is deleted
    last = np.ones(n_steps, dtype=bool)
    last[:-1] = step_key[1:] != step_key[:-1]
    final_plus = plus[last]
    ups = final_plus[final_plus >= 0]
    dels = minus[last][final_plus < 0]
    if dels.size:
        table.delete(key_cols.take(dels))
    if ups.size:
        table.upsert(z.data.take(ups))


def _current_rows(table: KeyedTable, keys: pa.Table) -> tuple[pa.Table, I64]:
    """The table's current rows for distinct ``keys``: ``(rows, row index per key or -1)``.

    Reads the keyed table's key index (``KeyedTable`` has no public lookup yet).
    """
    found = table._index.lookup(_key_hashes(keys, table.keys))
    present = np.flatnonzero(found >= 0)
    rows = table.rows(found[present])
    if present.size:
        # a hash shared by two different keys: the table holds the other one
        ok = rows_equal(rows.select(list(table.keys)), keys.take(present))
        if not ok.all():
            present, rows = present[ok], rows.filter(pa.array(ok))
    out = np.full(keys.num_rows, -1, np.int64)
    out[present] = np.arange(present.size)
    return rows, out
