"""Z-sets: batches of weighted records, and their algebra (concat, plus, minus, negate,
consolidate).

A Z-set maps records to integer weights. A *batch* lists updates ``(record, time, diff)``
(the triples of differential dataflow): an Arrow table of records, an ``int64`` weight per
row and, when the batch carries times, a version per row. The same record may appear on
several rows; the batch *means* the sum of their weights per (record, time), and rows
whose weights sum to zero mean nothing. :meth:`ZSet.consolidate` rewrites a batch into
its canonical form: one row per (record, time), no zero weights.

In Arrow (:meth:`ZSet.to_arrow`, :meth:`ZSet.from_arrow`) the weight is the column
``__diff`` (int64) and the time the column ``__time``: ``int64`` for one-coordinate
versions (a table's step), ``fixed_size_list<int64>[d]`` for ``d`` coordinates. In memory
the records stay an Arrow table, weights a numpy ``int64`` array and times a numpy
``int64`` array of shape ``(n, d)``, so every operation is a handful of vectorized calls.

Records are compared by value: ``null == null``, ``NaN == NaN``, ``0.0 == -0.0`` (see
:mod:`engine._kernels.hashing`). A batch holds at least one record column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from engine._kernels.arrays import numeric_view
from engine._kernels.hashing import combine, exact_hash, group_equal, hash_rows, same_rows
from engine.differential.version import Version, VersionLike, as_version, times_up_to
from engine.errors import InputError, SchemaError
from engine.reserved import DIFF, TIME

__all__ = ["DIFF", "TIME", "ZSet", "concat", "consolidate", "minus", "negate", "plus", "split_by_time"]

_RESERVED = (DIFF, TIME)


Views: TypeAlias = "Callable[[int, str], npt.NDArray[Any] | None]"
"""``views(i, name)``: :func:`~engine._kernels.arrays.numeric_view` of column ``name`` of
table ``i``, from a cache kept by the caller (a batch that never changes)."""


def take_rows(table: pa.Table, rows: npt.NDArray[np.int64], prefix: int = 0, views: Views | None = None) -> pa.Table:
    """``table.take(rows)``: null-free numeric columns gather in numpy (no Arrow kernel
    dispatch per call), the others through Arrow. ``prefix`` says ``rows`` starts with
    ``0, 1, ..., prefix - 1`` (copied, not gathered); ``views`` gives the columns' numeric
    views (see :data:`Views`)."""
    cols = []
    tail = rows[prefix:] if prefix else rows
    for name, col in zip(table.column_names, table.columns, strict=True):  # a loop per column
        v = numeric_view(col) if views is None else views(0, name)
        if v is None:
            taken = col.take(rows)
        elif prefix:
            taken = pa.array(np.concatenate((v[:prefix], v.take(tail))), type=col.type)
        else:
            taken = pa.array(v.take(rows), type=col.type)
        cols.append(taken)
    return pa.Table.from_arrays(cols, schema=table.schema)


def identity_prefix(rows: npt.NDArray[np.int64], k: int) -> int:
    """``k`` when ``rows[:k]`` is ``0, 1, ..., k - 1``, else 0."""
    if k == 0 or rows[0] != 0 or rows[k - 1] != k - 1:
        return 0
    return k if k == 1 or bool((rows[1:k] > rows[:k - 1]).all()) else 0


def take_rows_from(tables: Sequence[pa.Table], which_bounds: Sequence[int], rows: npt.NDArray[np.int64],
                   views: Views | None = None) -> pa.Table:
    """Rows of several tables of one schema, as one table: ``rows[b[i]:b[i + 1]]`` of
    ``tables[i]`` in order (``which_bounds`` = ``b``). Numeric columns are gathered into one
    numpy array (one Arrow array per column, no concatenation of tables); ``views`` gives
    the tables' numeric views (see :data:`Views`)."""
    schema = tables[0].schema
    n = rows.size
    cols: list[pa.Array | pa.ChunkedArray] = []
    for j, field in enumerate(schema):  # a loop per column
        views_j = [numeric_view(t.column(j)) if views is None else views(i, field.name)
                   for i, t in enumerate(tables)]
        found = [v for v in views_j if v is not None]
        if len(found) == len(views_j):
            out = np.empty(n, dtype=found[0].dtype)  # temporal columns: their int storage
            for i, v in enumerate(found):  # a loop per table
                lo, hi = which_bounds[i], which_bounds[i + 1]
                if hi > lo:
                    v.take(rows[lo:hi], out=out[lo:hi])
            cols.append(pa.array(out, type=field.type))
        else:
            parts = [tables[i].column(j).take(rows[which_bounds[i]:which_bounds[i + 1]])
                     for i in range(len(tables)) if which_bounds[i + 1] > which_bounds[i]]
            cols.append(pa.chunked_array([c for p in parts for c in p.chunks], type=field.type))
    return pa.Table.from_arrays(cols, schema=schema)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class ZSet:
    """A batch of updates ``(record, time, diff)``.

    Attributes
    ----------
    data
        The records, one row per update (no ``__diff``/``__time`` column).
    diffs
        ``int64`` weight per row; positive inserts copies, negative retracts them.
    times
        ``int64`` array of shape ``(n, d)``: the version of each row, or ``None`` for an
        untimed batch (a plain Z-set).

    Examples
    --------
    >>> z = ZSet.from_triples([("frank", 6, 1), ("frank", 8, 1), ("frank", 8, 1)], ["name"])
    >>> z.consolidate().to_triples()
    [(('frank',), (6,), 1), (('frank',), (8,), 2)]
    """

    data: pa.Table
    diffs: I64
    times: I64 | None = None

    def __post_init__(self) -> None:
        n = self.data.num_rows
        if self.data.num_columns == 0:
            raise SchemaError("a Z-set batch needs at least one record column")
        names = self.data.schema.names  # a tenth of Table.column_names' cost: every batch passes here
        bad = [c for c in names if c in _RESERVED]
        if bad:
            raise SchemaError(f"record columns may not be named {bad}: {_RESERVED} are reserved")
        if self.diffs.dtype != np.int64 or self.diffs.shape != (n,):
            raise InputError(f"diffs must be int64 of shape ({n},), got {self.diffs.dtype} {self.diffs.shape}")
        if self.times is not None and (
            self.times.dtype != np.int64 or self.times.ndim != 2 or self.times.shape[0] != n
            or self.times.shape[1] < 1
        ):
            raise InputError(f"times must be int64 of shape ({n}, d), got {self.times.dtype} {self.times.shape}")

    # construction -------------------------------------------------------------------
    @classmethod
    def empty(cls, schema: pa.Schema, dims: int | None = None) -> ZSet:
        """A batch with no rows (timed with ``dims`` coordinates when given)."""
        times = np.empty((0, dims), dtype=np.int64) if dims else None
        return cls(schema.empty_table(), np.empty(0, dtype=np.int64), times)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> ZSet:
        """Split ``__diff`` (required) and ``__time`` (optional) off an Arrow table.

        Raises
        ------
        SchemaError
            If ``__diff`` is missing or not integer, or ``__time`` has an unusable type.
        """
        if DIFF not in table.column_names:
            raise SchemaError(f"a Z-set table needs an integer {DIFF!r} column (has: {table.column_names})")
        dcol = table.column(DIFF)
        if not pa.types.is_integer(dcol.type) or dcol.null_count:
            raise SchemaError(f"column {DIFF!r} must be a non-null integer column, got {dcol.type}")
        diffs = np.asarray(dcol.to_numpy(), dtype=np.int64)
        times = None
        if TIME in table.column_names:
            times = _times_from_arrow(table.column(TIME))
        data = table.drop_columns([c for c in _RESERVED if c in table.column_names])
        return cls(data, diffs, times)

    @classmethod
    def from_triples(
        cls, triples: Iterable[tuple[Any, VersionLike | None, int]], schema: pa.Schema | Sequence[str]
    ) -> ZSet:
        """From Python ``(record, time, diff)`` triples: for examples and tests, not hot paths.

        ``record`` is a tuple of column values (or a bare value for one column); ``time`` a
        :class:`Version`, an int or a tuple of ints, or ``None`` for every row (untimed).
        """
        rows = list(triples)
        names = schema.names if isinstance(schema, pa.Schema) else list(schema)
        recs = [r if isinstance(r, tuple) else (r,) for r, _, _ in rows]
        cols = list(zip(*recs, strict=True)) if recs else [() for _ in names]
        if isinstance(schema, pa.Schema):
            data = pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)],
                                        schema=schema)
        else:
            data = pa.Table.from_arrays([pa.array(list(c)) for c in cols], names=names)
        diffs = np.array([d for _, _, d in rows], dtype=np.int64)
        ts = [t for _, t, _ in rows]
        if rows and all(t is None for t in ts):
            times = None
        elif any(t is None for t in ts):
            raise InputError("either every triple has a time or none has")
        else:
            vs = [as_version(t) for t in ts]  # type: ignore[arg-type]
            dims = {len(v) for v in vs}
            if len(dims) > 1:
                raise InputError(f"triples mix versions of {sorted(dims)} coordinates")
            times = np.array([v.coords for v in vs], dtype=np.int64).reshape(len(vs), -1) if vs else None
        return cls(data, diffs, times)

    # reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.data.num_rows)

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    @property
    def schema(self) -> pa.Schema:
        return self.data.schema

    @property
    def dims(self) -> int | None:
        """Coordinates per version, ``None`` when untimed."""
        return None if self.times is None else int(self.times.shape[1])

    def __repr__(self) -> str:
        return f"ZSet({self.num_rows} rows, columns={self.data.column_names}, dims={self.dims})"

    def to_arrow(self) -> pa.Table:
        """Records plus ``__diff`` (and ``__time`` when timed) as one Arrow table."""
        out = self.data.append_column(DIFF, pa.array(self.diffs, pa.int64()))
        if self.times is not None:
            out = out.append_column(TIME, _times_to_arrow(self.times))
        return out

    def to_pandas(self) -> pd.DataFrame:
        """:meth:`to_arrow` as pandas (times as tuples when they have several coordinates)."""
        df: pd.DataFrame = self.to_arrow().to_pandas()
        if self.times is not None and self.times.shape[1] > 1:
            df[TIME] = [tuple(t) for t in self.times.tolist()]
        return df

    def to_triples(self) -> list[tuple[tuple[Any, ...], tuple[int, ...] | None, int]]:
        """Python ``(record tuple, time tuple or None, diff)`` per row, in row order (tests)."""
        cols = [c.to_pylist() for c in self.data.columns]
        recs = list(zip(*cols, strict=True)) if cols else []
        ts: list[tuple[int, ...] | None] = (
            [tuple(t) for t in self.times.tolist()] if self.times is not None else [None] * len(recs)
        )
        return [(r, t, int(d)) for r, t, d in zip(recs, ts, self.diffs.tolist(), strict=True)]

    # row selection ------------------------------------------------------------------
    def take(self, rows: npt.ArrayLike) -> ZSet:
        """The rows at ``rows`` (int indices), in that order."""
        idx = np.asarray(rows, dtype=np.int64)
        return ZSet(take_rows(self.data, idx), self.diffs.take(idx),
                    None if self.times is None else self.times.take(idx, axis=0))

    def filter(self, mask: npt.NDArray[np.bool_]) -> ZSet:
        """The rows where ``mask`` is true."""
        return self.take(np.flatnonzero(mask))

    def with_time(self, time: VersionLike) -> ZSet:
        """Every row stamped with ``time`` (replacing any times)."""
        if type(time) is tuple and time and all(type(c) is int and c >= 0 for c in time):
            coords: tuple[int, ...] = time  # a scheduler's time: already a version's coordinates
        else:
            coords = as_version(time).coords
        times = np.empty((self.num_rows, len(coords)), dtype=np.int64)
        times[:] = coords
        return ZSet(self.data, self.diffs, times)

    def without_times(self) -> ZSet:
        """The same updates as an untimed batch."""
        return self if self.times is None else ZSet(self.data, self.diffs, None)

    # algebra ------------------------------------------------------------------------
    def negate(self) -> ZSet:
        """Every weight's sign flipped."""
        return ZSet(self.data, -self.diffs, self.times)

    def consolidate(self) -> ZSet:
        """One row per distinct (record, time) with the summed weight; zero weights dropped.

        Rows keep the order in which each (record, time) first appears. A batch that is
        already consolidated is returned as is.
        """
        n = self.num_rows
        if n == 0:
            return self
        h = hash_rows(self.data)
        if self.times is not None:
            for j in range(self.times.shape[1]):  # one pass per coordinate
                h = combine(h, self.times[:, j].view(np.uint64))
        exact = self.times is None and exact_hash(self.schema, self.data.column_names)
        order, starts = group_equal(h, None if exact else self._same)
        if starts.size == n and np.all(self.diffs != 0):
            return self
        sums = np.add.reduceat(self.diffs[order], starts)
        first = np.minimum.reduceat(order, starts)
        keep = sums != 0
        first, sums = first[keep], sums[keep]
        o = np.argsort(first)
        return ZSet(self.data.take(first[o]), sums[o], None if self.times is None else self.times[first[o]])

    def _same(self, i: I64, j: I64) -> npt.NDArray[np.bool_]:
        eq = same_rows(self.data, i, j)
        if self.times is not None:
            eq &= (self.times[i] == self.times[j]).all(axis=1)
        return eq

    def accumulate(self, at: VersionLike | None = None) -> ZSet:
        """The collection at version ``at``: rows with ``time <= at``, untimed, consolidated.

        With ``at=None`` every row counts (the sum over all times).
        """
        z = self
        if at is not None:
            if self.times is None:
                raise InputError("accumulate(at=...) needs a timed batch")
            z = self.filter(times_up_to(self.times, as_version(at)))
        return z.without_times().consolidate()

    def equals(self, other: ZSet) -> bool:
        """Same Z-set (same weight for every (record, time)), whatever the row order."""
        return minus(self, other).num_rows == 0

    def times_as_versions(self) -> list[Version]:
        """The distinct versions of this batch, in lexicographic order (tests, small batches)."""
        if self.times is None:
            return []
        return [Version(tuple(t)) for t in np.unique(self.times, axis=0).tolist()]


def _times_from_arrow(col: pa.Array | pa.ChunkedArray) -> I64:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        raise SchemaError(f"column {TIME!r} has {col.null_count} null time(s)")
    if pa.types.is_integer(col.type):
        return np.asarray(col.to_numpy(), dtype=np.int64).reshape(-1, 1)
    if pa.types.is_fixed_size_list(col.type) and pa.types.is_integer(col.type.value_type):
        d = col.type.list_size
        flat = col.flatten()
        return np.asarray(flat.to_numpy(), dtype=np.int64).reshape(-1, d)
    raise SchemaError(f"column {TIME!r} must be int64 or fixed_size_list<int64>, got {col.type}")


def _times_to_arrow(times: I64) -> pa.Array:
    if times.shape[1] == 1:
        return pa.array(times[:, 0], pa.int64())
    return pa.FixedSizeListArray.from_arrays(pa.array(times.reshape(-1), pa.int64()), times.shape[1])


def _check_compatible(batches: Sequence[ZSet]) -> None:
    schema = batches[0].data.schema
    dims = batches[0].dims
    for b in batches[1:]:  # a loop per batch
        s = b.data.schema
        if not s.equals(schema) and (s.names != schema.names or s.types != schema.types):
            raise SchemaError(f"Z-set batches have different schemas: {schema} vs {s}")
        if b.dims != dims:
            raise InputError(f"cannot combine batches with times of {dims} and {b.dims} coordinates")


def concat(*batches: ZSet) -> ZSet:
    """All updates of ``batches`` in one batch, not consolidated (the union of streams).

    Raises
    ------
    SchemaError
        If the batches' columns differ in names or types.
    """
    if not batches:
        raise InputError("concat needs at least one batch")
    if len(batches) == 1:
        return batches[0]
    _check_compatible(batches)
    schema = batches[0].data.schema
    data = pa.concat_tables([b.data if b.data.schema.equals(schema) else b.data.cast(schema) for b in batches])
    diffs = np.concatenate([b.diffs for b in batches])
    times = None if batches[0].times is None else \
        np.concatenate([b.times for b in batches if b.times is not None])
    return ZSet(data, diffs, times)


def consolidate(batch: ZSet) -> ZSet:
    """:meth:`ZSet.consolidate` as a function (seed 003's Consolidate on a batch)."""
    return batch.consolidate()


def negate(batch: ZSet) -> ZSet:
    """Every weight's sign flipped (seed 003's Negate)."""
    return batch.negate()


def plus(a: ZSet, b: ZSet) -> ZSet:
    """The sum of two Z-sets, consolidated (seed 003's Plus)."""
    return concat(a, b).consolidate()


def minus(a: ZSet, b: ZSet) -> ZSet:
    """``a`` minus ``b``, consolidated (seed 003's Minus)."""
    return concat(a, b.negate()).consolidate()


def split_by_time(batch: ZSet) -> list[tuple[tuple[int, ...], ZSet]]:
    """The rows of a timed batch grouped by time (a loop per distinct time only)."""
    assert batch.times is not None
    times = batch.times
    first = times[0]
    if times.shape[1] == 1:
        if times.min() == times.max():  # two reductions, no temporary
            return [((int(first[0]),), batch)]
    elif (times == first).all():
        return [(tuple(first.tolist()), batch)]
    if times.shape[1] == 2 and (times[:, 0] == first[0]).all():  # one outer version
        key = times[:, 1]
    else:
        key = np.unique(times, axis=0, return_inverse=True)[1].reshape(-1)  # lexicographic rank
    order = np.argsort(key, kind="stable")
    sk = key[order]
    bounds = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1], [True]))).tolist()
    s = batch.take(order)  # one gather, then a zero-copy slice per time
    assert s.times is not None
    return [(tuple(s.times[lo].tolist()), ZSet(s.data.slice(lo, hi - lo), s.diffs[lo:hi], s.times[lo:hi]))
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
