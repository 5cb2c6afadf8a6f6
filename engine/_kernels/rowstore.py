"""The one store of Arrow rows by dense id: what a map's keys or an operator's current
records are kept in when the caller has no column sources of its own.

:class:`~engine._kernels.keymap.StoredKeyMap` keeps one copy of each distinct key here, the
differential upsert (:mod:`engine.differential.upsert`) each key's current record. Rows
live in append-only Arrow levels whose sizes halve from the oldest to the newest, so each
stored row is copied ``O(log n)`` times in all, plus one ``int64`` array from id to global
row. A replaced or dropped row stays where it is until a compaction, which runs once the
stored rows outnumber twice the live ones (plus :data:`_SLACK`): every call costs what it
touches, amortized, never the whole store.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.hashing import rows_equal, rows_equal_at

__all__ = ["RowStore"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_SLACK = 1024  # dead rows tolerated on top of the live count before a compaction
#: a store of at most this many rows keeps its levels concatenated for comparisons too, so
#: that :meth:`RowStore.equal_at` compares in numpy (a join's few right keys, checked
#: against every left row whose hash meets one, each cycle)
FLAT_MAX = 65536


class RowStore:
    """Rows of one schema by dense non-negative id, whole arrays at a time.

    Ids are the caller's and should be dense (small, reused after drops): the store holds
    an array indexed by id.

    Parameters
    ----------
    schema
        The stored columns. Tables given to :meth:`put` have columns of these types (or
        types whose values cast to them, such as ``int32`` for ``int64``), matched by
        position; they are stored cast to ``schema``.

    Examples
    --------
    >>> s = RowStore(pa.schema([("k", pa.string())]))
    >>> s.put(np.array([3, 0]), pa.table({"k": ["c", "a"]}))
    >>> s.put(np.array([3]), pa.table({"k": ["d"]}))      # replaces id 3's row
    >>> s.get(np.array([0, 3])).column("k").to_pylist(), len(s)
    (['a', 'd'], 2)
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._row = np.full(1024, -1, dtype=np.int64)  # id -> global row, -1 when none
        self._levels: list[pa.Table] = []  # oldest (largest) first
        self._starts: list[int] = []  # global row of each level's first row
        self._rows = 0
        self._live = 0
        self._flat: pa.Table | None = None  # the levels concatenated (small stores), until a put

    def __len__(self) -> int:
        """Ids that hold a row."""
        return self._live

    @property
    def stored(self) -> int:
        """Rows held, live and dead: compaction keeps this under ``2 * len(self) + 1024``."""
        return self._rows

    def _fit(self, n: int) -> None:
        if n > self._row.size:
            size = max(n, 2 * self._row.size)
            self._row = np.concatenate((self._row, np.full(size - self._row.size, -1, np.int64)))

    def _stored(self, rows: I64, columns: list[str] | None = None) -> pa.Table:
        """The stored rows at ``rows`` (global row numbers), in that order."""
        levels = self._levels if columns is None else [lv.select(columns) for lv in self._levels]
        if len(levels) == 1:
            return levels[0].take(rows)
        lv = np.searchsorted(np.asarray(self._starts), rows, side="right") - 1
        parts, pos = [], []
        for k, (level, start) in enumerate(zip(levels, self._starts, strict=True)):  # per level
            at = np.flatnonzero(lv == k)
            if at.size:
                parts.append(level.take(rows[at] - start))
                pos.append(at)
        got = pa.concat_tables(parts)
        order = np.concatenate(pos)
        if np.all(order[1:] > order[:-1]):
            return got
        inv = np.empty(rows.size, dtype=np.int64)
        inv[order] = np.arange(rows.size, dtype=np.int64)
        return got.take(inv)

    def ids(self) -> I64:
        """Every id that holds a row, ascending (costs the id range: for checks, not hot paths)."""
        return np.flatnonzero(self._row >= 0).astype(np.int64, copy=False)

    def rows(self) -> pa.Table:
        """Every row held, in storage order, not by id: a copy of the whole store in one pass
        over the stored rows and one take per level (no reordering, unlike
        ``get(ids())``)."""
        if not self._levels:
            return self.schema.empty_table()
        held = np.zeros(self._rows, dtype=bool)
        held[self._row[self._row >= 0]] = True
        parts = []
        for level, start in zip(self._levels, self._starts, strict=True):  # per level
            at = np.flatnonzero(held[start:start + level.num_rows])
            parts.append(level if at.size == level.num_rows else level.take(at))
        return pa.concat_tables(parts)

    def get(self, ids: I64, columns: list[str] | None = None) -> pa.Table:
        """The rows of ``ids`` (each holding one), in that order; with ``columns``, only those."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0 or not self._levels:
            empty = self.schema.empty_table()
            return empty if columns is None else empty.select(columns)
        return self._stored(self._row[ids], columns)

    def equal_at(self, table: pa.Table, i: I64, ids: I64, columns: list[str] | None = None) -> Mask:
        """Per pair: row ``i[k]`` of ``table`` equals the row of ``ids[k]`` (columns matched
        by position with the stored ``columns``, all of them by default)."""
        rows = self._row[np.asarray(ids, dtype=np.int64)]
        if len(self._levels) > 1 and self._rows <= FLAT_MAX and self._flat is None:
            self._flat = pa.concat_tables(self._levels).combine_chunks()
        if len(self._levels) == 1 or self._flat is not None:
            level = self._levels[0] if len(self._levels) == 1 else self._flat
            assert level is not None
            return rows_equal_at(table, i, level if columns is None else level.select(columns), rows)
        return rows_equal(table.take(i), self._stored(rows, columns))

    def put(self, ids: I64, rows: pa.Table) -> None:
        """Store ``rows[k]`` as the row of ``ids[k]`` (distinct ids), replacing any it held."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self._fit(int(ids.max()) + 1)
        self._flat = None
        self._live += int(np.count_nonzero(self._row[ids] < 0))
        cols = [c.cast(f.type) for c, f in zip(rows.columns, self.schema, strict=True)]
        rows = pa.Table.from_arrays(cols, schema=self.schema).combine_chunks()
        self._row[ids] = np.arange(self._rows, self._rows + rows.num_rows, dtype=np.int64)
        self._levels.append(rows)
        self._starts.append(self._rows)
        self._rows += rows.num_rows
        while len(self._levels) > 1 and 2 * self._levels[-1].num_rows >= self._levels[-2].num_rows:
            merged = pa.concat_tables(self._levels[-2:]).combine_chunks()
            self._levels[-2:] = [merged]
            self._starts.pop()
        self._maybe_compact()

    def drop(self, ids: I64) -> None:
        """Forget the rows of ``ids`` (which hold one)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self._row[ids] = -1
        self._live -= ids.size
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        if self._rows > 2 * self._live + _SLACK:
            live = np.flatnonzero(self._row >= 0)
            rows = self._row[live]
            kept = self._stored(rows).combine_chunks() if rows.size else self.schema.empty_table()
            self._row[live] = np.arange(live.size, dtype=np.int64)
            self._levels, self._starts = ([kept], [0]) if live.size else ([], [])
            self._flat = None
            self._rows = self._live = int(live.size)
