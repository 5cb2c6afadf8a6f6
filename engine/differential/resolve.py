"""Triples to a keyed table's writes: the one place their semantics live (DESIGN.md §4).

:func:`resolve_triples` turns a batch of differential triples for a
:class:`~engine.sources.KeyedTable` into the upserts and deletes with the same effect, or
an :class:`~engine.errors.InputError` naming the table and the key when the batch is not a
valid change of the table. It stages nothing:
:func:`~engine.differential.translator.apply_triples` and the DIFF mode of DoPut both call
it, then stage the result under the table's :meth:`~engine.sources.KeyedTable.write_lock`.

A keyed table holds each key at most once, so after consolidation per (record, time):

* every weight is ``+1`` or ``-1``;
* per key and time there is at most one ``-1`` and one ``+1`` (a pair is an update);
* a ``-1`` retracts the row the key holds at that point: the table's row, with the
  writes staged before folded in (``lookup(staged=True)``), or the key's ``+1`` at its
  previous time in the batch;
* a ``+1`` without a ``-1`` is for a key that holds no row then.

Times (one coordinate, or none) are walked in order; the key's last time decides: its
``+1`` is upserted, otherwise the key is deleted. An untimed batch is one step per key
(DoPut's DIFF mode drops ``__time``: a batch is one transaction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import row_for_message
from engine._kernels.hashing import (
    exact_hash,
    group_equal,
    hash_column,
    hash_rows,
    rows_equal,
    same_rows,
)
from engine.differential.zset import ZSet
from engine.errors import InputError, SchemaError
from engine.sources import KeyedTable, conform

__all__ = ["KeyedWrites", "resolve_triples", "takes_triples"]

I64 = npt.NDArray[np.int64]


def takes_triples(schema: pa.Schema) -> bool:
    """Whether triples can carry rows of ``schema``: their records are hashed and compared
    (:mod:`engine._kernels.hashing`), which nested values (lists, structs, maps) cannot be.

    Examples
    --------
    >>> takes_triples(pa.schema([("k", pa.int64()), ("v", pa.string())]))
    True
    >>> takes_triples(pa.schema([("k", pa.int64()), ("v", pa.list_(pa.int64()))]))
    False
    """
    try:
        for f in schema:
            hash_column(pa.array([], f.type), f.name)
    except SchemaError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class KeyedWrites:
    """The writes that apply a batch of triples to a keyed table.

    Attributes
    ----------
    upserts
        Rows to upsert (every column of the table), one per key, in the order the batch
        first names them.
    deletes
        The key columns of the keys to delete; disjoint from the keys of ``upserts``.
    """

    upserts: pa.Table
    deletes: pa.Table

    @property
    def num_rows(self) -> int:
        return int(self.upserts.num_rows + self.deletes.num_rows)

    def stage(self, table: KeyedTable) -> None:
        """Stage the deletes and upserts on ``table`` for its next cycle.

        Hold ``table.write_lock()`` across :func:`resolve_triples` and this call, so no
        other write comes between the check and the staging.
        """
        if self.deletes.num_rows:
            table.delete(self.deletes)
        if self.upserts.num_rows:
            table.upsert(self.upserts)


def resolve_triples(table: KeyedTable, batch: ZSet) -> KeyedWrites:
    """The upserts and deletes with the effect of ``batch`` on ``table``.

    Checked against the rows ``table`` will hold once its staged writes are applied
    (``table.lookup(keys, staged=True)``), so consecutive batches compose exactly without a
    cycle in between. Pure: reads the table, stages nothing. To stage the result
    atomically, hold ``table.write_lock()`` around this call and :meth:`KeyedWrites.stage`.

    Parameters
    ----------
    table
        The keyed table the triples are for.
    batch
        Triples over the table's columns (any order, safe casts), untimed or with
        one-coordinate times.

    Returns
    -------
    KeyedWrites
        The upserts and the deletes (either may be empty).

    Raises
    ------
    SchemaError
        If the batch's columns are not the table's.
    InputError
        Naming the table and the first offending row or key: a weight other than ``+1`` or
        ``-1`` after consolidation, two ``+1`` (or ``-1``) rows for one key at one time, a
        ``-1`` retracting a row the key does not hold, or a ``+1`` adding a second row for
        a key.

    Examples
    --------
    >>> t.upsert({"k": [1], "v": [1.0]}); graph.run_cycle()
    >>> z = ZSet.from_triples([((1, 1.0), None, -1), ((1, 2.0), None, 1),
    ...                        ((2, 5.0), None, 1)], t.schema)
    >>> resolve_triples(t, z).upserts.to_pylist()
    [{'k': 1, 'v': 2.0}, {'k': 2, 'v': 5.0}]
    """
    if not isinstance(table, KeyedTable):
        raise InputError(f"triples resolve against a KeyedTable, got {type(table).__name__} "
                         f"{getattr(table, 'name', '?')!r}")
    if batch.dims is not None and batch.dims != 1:
        raise InputError(f"table {table.name!r}: keyed tables take one-coordinate times (or "
                         f"none), got {batch.dims}")
    keys = list(table.keys)
    data = conform(table.name, table.schema, batch.data)
    z = ZSet(data, batch.diffs, batch.times).consolidate()
    n = z.num_rows
    if n == 0:
        return KeyedWrites(table.schema.empty_table(), data.select(keys).slice(0, 0))
    timed = z.times is not None

    def at(i: int) -> str:
        return f" at time {int(z.times[i, 0])}" if z.times is not None else ""

    bad = np.flatnonzero(np.abs(z.diffs) != 1)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"table {table.name!r} is keyed by {keys}: it holds each row at most once, so its "
            f"weights must sum to +1 or -1 per row{' and time' if timed else ''}, got "
            f"{int(z.diffs[i])} for {row_for_message(z.data, i)}{at(i)} ({bad.size} such row(s))")
    t = np.zeros(n, np.int64) if z.times is None else z.times[:, 0]
    key_cols = z.data.select(keys)
    order, starts = group_equal(
        hash_rows(z.data, keys),
        None if exact_hash(z.schema, keys) else (lambda i, j: same_rows(key_cols, i, j)))
    gid = np.empty(n, np.int64)
    gid[order] = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))

    # one step per (key, time), in time order; inside a step -1 sorts before +1
    o = np.lexsort((z.diffs, t, gid))
    g, tt, d = gid[o], t[o], z.diffs[o]
    new_step = np.ones(n, dtype=bool)
    new_step[1:] = (g[1:] != g[:-1]) | (tt[1:] != tt[:-1])
    step = np.cumsum(new_step) - 1
    n_steps = int(step[-1]) + 1
    minus = np.full(n_steps, -1, np.int64)  # row of z retracted per step
    plus = np.full(n_steps, -1, np.int64)   # row of z added per step
    for sign, slot in ((-1, minus), (1, plus)):  # one pass per sign
        sel = d == sign
        counts = np.bincount(step[sel], minlength=n_steps)
        if counts.max(initial=0) > 1:
            s = int(np.flatnonzero(counts > 1)[0])
            members = o[step == s]
            members = members[z.diffs[members] == sign]
            i = int(members[0])
            raise InputError(
                f"table {table.name!r}: key {row_for_message(key_cols, i)} gets {int(counts[s])} "
                f"{'+1' if sign > 0 else '-1'} rows{at(i)} "
                f"({[row_for_message(z.data, int(m)) for m in members[:3]]}); a keyed table holds one "
                f"row per key, so a key changes by at most one -1 and one +1"
                f"{' per time' if timed else ''}")
        slot[step[sel]] = o[sel]
    step_key = g[new_step]
    first = np.ones(n_steps, dtype=bool)
    first[1:] = step_key[1:] != step_key[:-1]

    # the key's row before each step: the table's (staged writes folded in), then the
    # previous step's +1
    held = table.lookup(key_cols.take(pa.array(o[new_step][first])), staged=True)
    cur = held.rows
    src = pa.concat_tables([cur, z.data])
    before = np.full(n_steps, -1, np.int64)
    before[first] = held.position
    later = np.flatnonzero(~first)
    prev_plus = plus[later - 1]
    before[later] = np.where(prev_plus >= 0, cur.num_rows + prev_plus, -1)
    had, has_minus = before >= 0, minus >= 0
    wrong = has_minus & ~had
    check = np.flatnonzero(has_minus & had)
    if check.size:
        wrong[check] = ~rows_equal(src.take(pa.array(before[check])),
                                   z.data.take(pa.array(minus[check])))
    if wrong.any():
        s = int(np.flatnonzero(wrong)[0])
        i = int(minus[s])
        holds = row_for_message(src, int(before[s])) if before[s] >= 0 else None
        raise InputError(
            f"table {table.name!r}: diff row {row_for_message(z.data, i)} with weight -1{at(i)} retracts a "
            f"row key {row_for_message(key_cols, i)} does not hold (it holds {holds})")
    second = ~has_minus & had
    if second.any():
        s = int(np.flatnonzero(second)[0])
        i = int(plus[s])
        raise InputError(
            f"table {table.name!r}: diff row {row_for_message(z.data, i)} with weight +1{at(i)} adds a "
            f"second row for key {row_for_message(key_cols, i)}, which holds {row_for_message(src, int(before[s]))}; "
            f"retract that row (-1) in the same {'time' if timed else 'batch'}")

    # the last step of each key decides: its +1 is upserted, else the key is deleted
    last = np.ones(n_steps, dtype=bool)
    last[:-1] = step_key[1:] != step_key[:-1]
    final_plus = plus[last]
    ups = np.sort(final_plus[final_plus >= 0])
    dels = np.sort(minus[last][final_plus < 0])
    return KeyedWrites(z.data.take(pa.array(ups, pa.int64())),
                       key_cols.take(pa.array(dels, pa.int64())))
