"""The one store of Arrow rows by dense id: what a map's keys or an operator's current
records are kept in when the caller has no column sources of its own.

:class:`~engine._kernels.keymap.StoredKeyMap` keeps one copy of each distinct key here, the
differential upsert (:mod:`engine.differential.upsert`) each key's current record. Rows
live in append-only Arrow levels whose sizes halve from the oldest to the newest, so each
stored row is copied ``O(log n)`` times in all, plus one ``int64`` array from id to global
row. A replaced or dropped row stays where it is until a compaction, which runs once the
stored rows outnumber twice the live ones (plus :data:`_SLACK`): every call costs what it
touches, amortized, never the whole store.

:class:`FlatRowStore` keeps rows of fixed-width columns (integers, floats, temporals) as
one numpy array per column indexed by id instead: a get is a gather, a put a scatter,
nothing is compacted, and callers that work in numpy take and give the columns as they are
(:func:`flat_columns`, :func:`flat_take`, :func:`flat_table`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.hashing import rows_equal, rows_equal_at

__all__ = ["FlatColumn", "FlatRowStore", "RowStore", "flat_columns", "flat_equal_at", "flat_table", "flat_take"]

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
        cols = [c if c.type == f.type else c.cast(f.type)
                for c, f in zip(rows.columns, self.schema, strict=True)]
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


# fixed-width rows as numpy arrays by id --------------------------------------------------
FlatColumn = tuple[npt.NDArray[np.generic], Mask | None]
"""One column as numpy: ``(values, valid)``, ``valid`` ``None`` when every value is valid
(a null's value is 0)."""


def _numpy_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy type that holds a fixed-width Arrow type's values, None when there is none."""
    if pa.types.is_integer(t) or (pa.types.is_floating(t) and t != pa.float16()):
        dt: np.dtype = np.dtype(t.to_pandas_dtype())
        return dt
    if pa.types.is_temporal(t) and t.bit_width in (32, 64) and not pa.types.is_interval(t):
        return np.dtype(np.int64 if t.bit_width == 64 else np.int32)
    return None


def flat_columns(table: pa.Table) -> list[FlatColumn]:
    """Every column of ``table`` (fixed-width types, see :class:`FlatRowStore`) as numpy, one
    view or one copy each."""
    out: list[FlatColumn] = []
    for col in table.columns:
        dt = _numpy_dtype(col.type)
        if dt is None:
            raise TypeError(f"not a fixed-width column: {col.type}")
        if isinstance(col, pa.ChunkedArray):
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        else:
            arr = col
        if pa.types.is_temporal(arr.type):
            arr = arr.view(pa.int64() if dt == np.int64 else pa.int32())
        if arr.null_count:
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            out.append((np.asarray(arr.fill_null(0).to_numpy(), dtype=dt), valid))
        else:
            out.append((np.asarray(arr.to_numpy(), dtype=dt), None))
    return out


def flat_table(cols: list[FlatColumn], schema: pa.Schema) -> pa.Table:
    """The Arrow table of numpy columns (``schema``'s types, matched by position)."""
    arrays = [pa.array(v, type=f.type, mask=None if ok is None or ok.all() else ~ok)
              for (v, ok), f in zip(cols, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def flat_take(cols: list[FlatColumn], rows: I64) -> list[FlatColumn]:
    """The columns' values at ``rows``."""
    return [(v.take(rows), None if ok is None else ok.take(rows)) for v, ok in cols]


def flat_equal_at(a: FlatColumn, i: I64, b: FlatColumn, j: I64) -> Mask:
    """Per pair: value ``i[k]`` of ``a`` equals value ``j[k]`` of ``b``, as
    :func:`~engine._kernels.hashing.values_equal` says (nulls equal nulls, NaN equals NaN)."""
    x, y = a[0].take(i), b[0].take(j)
    eq: Mask = x == y
    if x.dtype.kind == "f":
        eq |= np.isnan(x) & np.isnan(y)
    if a[1] is None and b[1] is None:
        return eq
    xv = np.ones(i.size, dtype=bool) if a[1] is None else a[1].take(i)
    yv = np.ones(j.size, dtype=bool) if b[1] is None else b[1].take(j)
    out: Mask = (eq & xv & yv) | ~(xv | yv)
    return out


class FlatRowStore:
    """:class:`RowStore`'s interface for rows of fixed-width columns (integers, floats,
    dates, times, timestamps, durations): one numpy array per column indexed by id (and a
    validity array once a column holds a null), so a get is one gather per column and a
    put one scatter, and nothing is ever compacted (a dropped id's slot waits for the id's
    reuse). :meth:`take` and :meth:`put_columns` give and take the numpy columns
    themselves (:func:`flat_columns`).

    Parameters
    ----------
    schema
        The stored columns; :meth:`fits` says whether they can be stored here.

    Examples
    --------
    >>> s = FlatRowStore(pa.schema([("k", pa.int64()), ("x", pa.float64())]))
    >>> s.put(np.array([3, 0]), pa.table({"k": [3, 0], "x": [0.5, None]}))
    >>> s.get(np.array([0, 3])).to_pylist(), len(s)
    ([{'k': 0, 'x': None}, {'k': 3, 'x': 0.5}], 2)
    """

    def __init__(self, schema: pa.Schema) -> None:
        if not self.fits(schema):
            raise TypeError(f"FlatRowStore holds fixed-width columns only, got {schema}")
        self.schema = schema
        self._names = list(schema.names)
        self._held = np.zeros(1024, dtype=bool)
        self._values = [np.zeros(1024, dtype=_numpy_dtype(f.type)) for f in schema]
        self._valid: list[Mask | None] = [None] * len(schema)
        self._live = 0

    @staticmethod
    def fits(schema: pa.Schema) -> bool:
        """Whether every column of ``schema`` has a fixed-width numpy type."""
        return all(_numpy_dtype(f.type) is not None for f in schema)

    def __len__(self) -> int:
        """Ids that hold a row."""
        return self._live

    @property
    def stored(self) -> int:
        """Rows held: the live ones (nothing dead is kept)."""
        return self._live

    def _fit(self, n: int) -> None:
        size = self._held.size
        if n <= size:
            return
        size = max(n, 2 * size)
        self._held = np.concatenate((self._held, np.zeros(size - self._held.size, dtype=bool)))
        self._values = [np.concatenate((v, np.zeros(size - v.size, dtype=v.dtype))) for v in self._values]
        self._valid = [None if ok is None else np.concatenate((ok, np.ones(size - ok.size, dtype=bool)))
                       for ok in self._valid]

    def ids(self) -> I64:
        """Every id that holds a row, ascending."""
        return np.flatnonzero(self._held).astype(np.int64, copy=False)

    def rows(self) -> pa.Table:
        """Every row held, by ascending id."""
        return self.get(self.ids())

    def columns(self) -> list[FlatColumn]:
        """Every column's arrays, indexed by id (the store's own: read them, never write;
        an id holding no row has some value there)."""
        return list(zip(self._values, self._valid, strict=True))

    def take(self, ids: I64, columns: list[str] | None = None) -> list[FlatColumn]:
        """The numpy columns (all, or ``columns``) of the rows of ``ids`` (each holding one)."""
        at = range(len(self._names)) if columns is None else [self._names.index(c) for c in columns]
        return flat_take([(self._values[c], self._valid[c]) for c in at], ids)

    def get(self, ids: I64, columns: list[str] | None = None) -> pa.Table:
        """The rows of ``ids`` (each holding one), in that order; with ``columns``, only those."""
        ids = np.asarray(ids, dtype=np.int64)
        schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
        return flat_table(self.take(ids, columns), schema)

    def equal_at(self, table: pa.Table, i: I64, ids: I64, columns: list[str] | None = None) -> Mask:
        """Per pair: row ``i[k]`` of ``table`` equals the row of ``ids[k]`` (columns matched
        by position with the stored ``columns``, all of them by default). Compared in numpy
        (:func:`flat_equal_at`) when ``table``'s columns are fixed-width too."""
        ids = np.asarray(ids, dtype=np.int64)
        if not all(_numpy_dtype(c.type) is not None for c in table.columns):
            return rows_equal(table.take(i), self.get(ids, columns))
        i = np.asarray(i, dtype=np.int64)
        at = range(len(self._names)) if columns is None else [self._names.index(c) for c in columns]
        out = np.ones(i.size, dtype=bool)
        for c, col in zip(at, flat_columns(table), strict=True):  # one pass per column
            out &= flat_equal_at(col, i, (self._values[c], self._valid[c]), ids)
        return out

    def put(self, ids: I64, rows: pa.Table) -> None:
        """Store ``rows[k]`` as the row of ``ids[k]`` (distinct ids), replacing any it held."""
        cols = [c if c.type == f.type else c.cast(f.type)
                for c, f in zip(rows.columns, self.schema, strict=True)]
        self.put_columns(np.asarray(ids, dtype=np.int64),
                         flat_columns(pa.Table.from_arrays(cols, schema=self.schema)))

    def put_columns(self, ids: I64, cols: list[FlatColumn], fresh: I64 | None = None) -> None:
        """:meth:`put` of numpy columns (the schema's types, by position). ``fresh``, when
        given, says which of ``ids`` (by position) hold no row now: every other one holds
        one, so only these are marked held (and the store's size checked by them)."""
        if ids.size == 0:
            return
        if fresh is None:
            self._fit(int(ids.max()) + 1)
            self._live += ids.size - int(np.count_nonzero(self._held[ids]))
            self._held[ids] = True
        elif fresh.size:
            new = ids.take(fresh)
            self._fit(int(new.max()) + 1)
            self._live += new.size
            self._held[new] = True
        for c, (v, ok) in enumerate(cols):
            self._values[c][ids] = v
            if ok is not None and self._valid[c] is None:
                self._valid[c] = np.ones(self._held.size, dtype=bool)
            valid = self._valid[c]
            if valid is not None:
                valid[ids] = True if ok is None else ok

    def drop(self, ids: I64) -> None:
        """Forget the rows of ``ids`` (which hold one)."""
        ids = np.asarray(ids, dtype=np.int64)
        self._held[ids] = False
        self._live -= ids.size
