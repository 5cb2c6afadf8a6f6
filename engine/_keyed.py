"""The keyed source table (:class:`KeyedTable`, exported by :mod:`engine.sources`, whose
docstring states its semantics): upsert and delete by key columns, the last write to a key
in a cycle wins, modifies only where a value changed, lookups of keys' rows.

A cycle of a few writes (at most ``FEW_KEYS``) skips the vectorized machinery where its
setup is the cost: distinct hashes mean distinct keys (no grouping), and integer, string
and binary keys are verified as Python values
(:func:`~engine._kernels.hashing.few_rows_equal`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import distinct_key_order, key_order, numeric_view, sort_keys
from engine._kernels.hashing import (
    Same,
    exact_hash,
    exact_values,
    few_rows_equal,
    group_equal,
    hash_rows,
    plain_type,
    rows_equal,
    same_rows,
    values_equal,
)
from engine._kernels.ids import IdAllocator
from engine._kernels.keymap import ExactKeyMap, IntKeyMap
from engine._source import SourceTable, TableLike, conform
from engine.columns import (
    ArrowColumnSource,
    NumpyColumnSource,
    WritableColumnSource,
    codable,
    compact_stale,
    make_column_source,
)
from engine.errors import InvalidKeyError, SchemaError
from engine.rowset import KeyArray, RowSet
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

__all__ = ["KeyLookup", "KeyedTable"]

FEW_KEYS = 16  # up to this many keys are compared as Python values (module attribute: tests change it)
_NO_KEYS = np.empty(0, dtype=np.int64)
_NO_KEYS.flags.writeable = False


def _key_hashes(t: pa.Table, keys: list[str]) -> npt.NDArray[np.uint64]:
    """One uint64 per row for its key: for one integer-like key column the value's own
    bits (:func:`~engine._kernels.hashing.exact_values`, exact, and dense where the keys
    are: :class:`~engine._kernels.keymap.IntKeyMap`); otherwise its hash
    (:func:`~engine._kernels.hashing.hash_rows`), and callers verify the key values where
    hashes match (:class:`~engine._kernels.keymap.ExactKeyMap`), so colliding keys coexist.
    """
    if len(keys) == 1 and exact_hash(t.schema, keys):
        return exact_values(t.column(keys[0])).view(np.uint64)
    return hash_rows(t, keys)


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """What a keyed table holds for some keys (:meth:`KeyedTable.lookup`).

    Attributes
    ----------
    rows
        The rows held for the keys that were found, every column, in the order the keys
        were asked (a key asked twice appears twice).
    position
        Per key asked: its row in ``rows``, or ``-1`` where the table holds no row for it.
    row_keys
        Per row of ``rows``: its row key, or ``-1`` for a row staged for a key the table
        does not hold yet (a new key gets its row key when a cycle applies it).
    """

    rows: pa.Table
    position: KeyArray
    row_keys: KeyArray

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        """Per key asked: whether the table holds a row for it."""
        return self.position >= 0


class KeyedTable(SourceTable):
    """Upsert and delete rows by key columns (DESIGN.md §2 keyed source).

    Parameters
    ----------
    keys
        The key column name(s). Key values may not be null.

    Notes
    -----
    Keys are compared exactly: a 64-bit hash finds the row of a key, equality of the key
    values decides (one integer-like key column is its own exact hash). Two distinct keys
    with equal hashes are two rows, like any other two keys.
    """

    write_kinds = ("upsert", "delete")

    @staticmethod
    def _new_column(type: pa.DataType) -> WritableColumnSource:
        # strings and binaries coded (ArrowColumnSource's docstring): a modify compares
        # codes, and readers group by them, while the column's values are few
        if codable(type):
            return ArrowColumnSource(type, coded=True)
        return make_column_source(type)

    def __init__(self, graph: UpdateGraph, schema: Any, keys: list[str] | str, *, name: str | None = None) -> None:
        super().__init__(graph, schema, name=name)
        key_list = [keys] if isinstance(keys, str) else list(keys)
        unknown = [k for k in key_list if k not in self.schema.names]
        if not key_list or unknown:
            raise SchemaError(f"key column(s) {unknown or key_list} not in {self.schema.names}")
        self.keys = key_list
        self._values = [n for n in self.schema.names if n not in key_list]
        # key -> row key
        self._index: ExactKeyMap | IntKeyMap = (IntKeyMap() if exact_hash(self.schema, key_list)
                                                else ExactKeyMap(exact=False))
        # keys whose Python values compare as values_equal does (see few_rows_equal)
        self._plain_keys = all(plain_type(self.schema.field(k).type) for k in key_list)
        self._row_keys = IdAllocator()  # a freed row key is reused from the next cycle on

    def _checked(self, data: TableLike, kind: str) -> pa.Table:
        t = conform(self.name, self.schema, data, columns=self.keys if kind == "delete" else None)
        self._check_keys(t)
        return t

    def _key_columns(self) -> tuple[str, ...]:
        return tuple(self.keys)

    def _check_keys(self, t: pa.Table) -> None:
        for k in self.keys:
            nulls = t.column(k).null_count
            if nulls:
                raise InvalidKeyError(f"table {self.name!r}: key column {k!r} has {nulls} null "
                                      f"value(s); keys may not be null")

    def upsert(self, data: TableLike) -> None:
        """Stage inserts-or-updates by key; all columns must be given.

        :meth:`check_batch` (``"upsert"``) then :meth:`stage`.

        Raises
        ------
        SchemaError
            If columns are repeated, missing, unknown or mistyped.
        InvalidKeyError
            If a key column holds nulls.
        """
        self.stage(self.check_batch(data, "upsert"))

    def delete(self, keys: TableLike) -> None:
        """Stage deletes; ``keys`` has exactly the key columns. Absent keys are ignored.

        :meth:`check_batch` (``"delete"``) then :meth:`stage`.

        Raises
        ------
        SchemaError
            If the columns are not exactly the key columns, or one cannot be cast.
        InvalidKeyError
            If a key column holds nulls.
        """
        self.stage(self.check_batch(keys, "delete"))

    @contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold off cycles and every other writer of this table, to check and then stage.

        Inside the block nothing changes what :meth:`lookup` answers (``staged=True``
        included) but this thread's own :meth:`upsert` and :meth:`delete`, which therefore
        land right after the writes a lookup saw. Takes the graph's shared lock (re-entrant
        inside a cycle), then the table's staging lock; re-entrant. Other writers of the
        table and the next cycle wait: hold it briefly.

        Examples
        --------
        >>> with t.write_lock():
        ...     if not t.lookup({"k": [1]}, staged=True).found[0]:
        ...         t.upsert({"k": [1], "v": [0.0]})  # insert only if absent
        """
        if self._writer == threading.get_ident():
            yield
            return
        with self.graph.shared_lock(), self._pending_lock:
            self._writer = threading.get_ident()
            try:
                yield
            finally:
                self._writer = None

    def lookup(self, keys: TableLike, *, staged: bool = False, lock: bool = True) -> KeyLookup:
        """The rows this table holds for ``keys``, which are present, and their row keys.

        Keys are compared exactly: a hash finds the candidate row, equality of the key
        values decides. Reads under the graph's shared lock, so a lookup never sees a cycle
        half-applied (call it from a listener during a cycle to see that cycle's rows).

        With ``staged=False`` (the default) the answer is the table as the last cycle left
        it, what :meth:`to_arrow` shows. With ``staged=True`` the writes staged for the next
        cycle are folded in, in staging order, the last write to a key winning: the rows
        the table will hold once the next cycle applies what is staged now. That answer
        stays true only while no one else stages: hold :meth:`write_lock` to check a write
        against it and stage the write atomically.

        Parameters
        ----------
        keys
            Exactly the key columns (a pyarrow Table or RecordBatch, a pandas DataFrame or a
            dict of columns); types are cast when the cast is safe. A key may be repeated.
        staged
            Fold in the writes staged for the next cycle.
        lock
            ``False`` reads without taking the graph's shared lock, for a caller that holds
            it already (as :meth:`~engine.table.Table.to_arrow`'s ``lock``); not with
            ``staged``.

        Returns
        -------
        KeyLookup
            ``rows`` of the keys found (all columns, in the order asked), ``position`` per
            key (``-1``: absent) and ``row_keys`` per row (``-1``: a staged new key).

        Raises
        ------
        SchemaError
            If ``keys`` has other columns than the key columns, or one cannot be cast.
        InvalidKeyError
            If a key column holds nulls.
        TableFailed
            If the table failed in an earlier cycle.

        Examples
        --------
        >>> t = graph.keyed_table(pa.schema([("k", pa.int64()), ("v", pa.float64())]), "k")
        >>> t.upsert({"k": [1, 2], "v": [1.0, 2.0]}); graph.run_cycle()
        >>> t.delete({"k": [1]}); t.upsert({"k": [3], "v": [3.0]})
        >>> t.lookup({"k": [1, 3, 2]}).position.tolist()
        [0, -1, 1]
        >>> got = t.lookup({"k": [1, 3, 2]}, staged=True)
        >>> got.position.tolist(), got.rows.column("v").to_pylist(), got.row_keys.tolist()
        ([-1, 0, 1], [3.0, 2.0], [-1, 1])
        """
        t = conform(self.name, self.schema, keys, columns=self.keys)
        self._check_keys(t)
        held: AbstractContextManager[None] = (
            self.write_lock() if staged or self._writer == threading.get_ident()
            else self.graph.shared_lock() if lock else nullcontext())
        with held:
            self.check_alive()
            return self._lookup(t, staged)

    def _lookup(self, t: pa.Table, staged: bool) -> KeyLookup:
        n = t.num_rows
        h = _key_hashes(t, self.keys)
        held = self._index.lookup(h, self._same_as_held(t))  # row key as the last cycle left it
        present = held >= 0
        decided = np.zeros(n, dtype=bool)
        staged_row = np.full(n, -1, np.int64)
        upserts: pa.Table | None = None
        if staged and self._pending:
            decided, staged_row, upserts = self._staged_writes(t, h)
            present = np.where(decided, staged_row >= 0, present)
        at = np.flatnonzero(present)
        from_table, from_staged = at[~decided[at]], at[decided[at]]
        rows = self.rows(held[from_table])
        if from_staged.size:
            assert upserts is not None
            rows = pa.concat_tables([rows, upserts.take(pa.array(staged_row[from_staged]))])
            rows = rows.take(pa.array(np.argsort(np.concatenate([from_table, from_staged]),
                                                 kind="stable")))
        position = np.full(n, -1, np.int64)
        position[at] = np.arange(at.size)
        return KeyLookup(rows, position, held[at])

    def _staged_writes(self, t: pa.Table, h: npt.NDArray[np.uint64]
                       ) -> tuple[npt.NDArray[np.bool_], KeyArray, pa.Table | None]:
        """Per key of ``t``: does a staged write decide it, and its row in the staged upserts
        (``-1``: deleted); the last write in staging order wins. Hold the staging lock."""
        ups = [b for kind, b in self._pending if kind == "upsert"]
        upserts = pa.concat_tables(ups) if ups else None
        key_parts, row_of = [], []
        offset = 0
        for kind, b in self._pending:  # one step per staged batch
            key_parts.append(b.select(self.keys))
            if kind == "upsert":
                row_of.append(np.arange(offset, offset + b.num_rows, dtype=np.int64))
                offset += b.num_rows
            else:
                row_of.append(np.full(b.num_rows, -1, np.int64))
        staged_keys = pa.concat_tables(key_parts)
        n_staged = staged_keys.num_rows
        if n_staged == 0:  # only empty batches are staged
            return np.zeros(t.num_rows, dtype=bool), np.full(t.num_rows, -1, np.int64), upserts
        both = pa.concat_tables([staged_keys, t]).combine_chunks()
        hashes = np.concatenate([_key_hashes(staged_keys, self.keys), h])
        order, starts = group_equal(
            hashes, None if self._exact_keys() else (lambda i, j: same_rows(both, i, j)))
        last = np.maximum.reduceat(np.where(order < n_staged, order, -1), starts)  # per group
        group = np.empty(hashes.size, np.int64)
        group[order] = np.repeat(np.arange(starts.size), np.diff(np.append(starts, hashes.size)))
        write = last[group[n_staged:]]  # per key of t: its last staged write, -1 none
        decided = write >= 0
        row = np.where(decided, np.concatenate(row_of)[np.maximum(write, 0)], -1)
        return decided, row, upserts

    def _exact_keys(self) -> bool:
        """Whether :func:`_key_hashes` is exact (one integer-like key column)."""
        return self._index.exact

    def _same_as_held(self, t: pa.Table) -> Same | None:
        """``same(i, row_keys)``: row ``i`` of the key table ``t`` is the key stored at
        ``row_keys`` (current values); ``None`` for exact keys."""
        if self._index.exact:
            return None

        def same(i: KeyArray, row_keys: KeyArray) -> npt.NDArray[np.bool_]:
            if t.num_rows <= FEW_KEYS and self._plain_keys:
                return few_rows_equal([t.column(k) for k in self.keys], i,
                                      [self._storage[k].get_pylist(row_keys) for k in self.keys])
            stored = pa.Table.from_arrays([self._storage[k].get(row_keys) for k in self.keys],
                                          names=self.keys)
            return rows_equal(t.select(self.keys).take(pa.array(i)), stored)
        return same

    def _compute_update(self) -> TableUpdate | None:
        self._row_keys.release()
        pending = self._take_pending()
        if not pending:
            return None
        # all staged writes as one table of (keys, op, row in the upsert data); last wins.
        # ``up_all``: every write an upsert, at its own row (no op or row arrays to build)
        data: pa.Table | None
        if len(pending) == 1:  # the usual cycle: one staged batch, used as it is
            kind, data = pending[0]
            up_all = kind == "upsert"
            if not up_all:
                data = None
            keys_t = pending[0][1].select(self.keys)
        else:
            ups = [b for kind, b in pending if kind == "upsert"]
            data = pa.concat_tables(ups) if ups else None
            up_all = len(ups) == len(pending)
            key_parts, is_up, row_of = [], [], []
            offset = 0
            for kind, b in pending:  # one step per staged batch
                key_parts.append(b.select(self.keys))
                up = kind == "upsert"
                is_up.append(np.full(b.num_rows, up))
                row_of.append(np.arange(offset, offset + b.num_rows) if up else np.full(b.num_rows, -1))
                offset += b.num_rows if up else 0
            keys_t = pa.concat_tables(key_parts)
        if keys_t.num_rows == 0:
            return None
        if any(c.num_chunks != 1 for c in keys_t.columns):
            keys_t = keys_t.combine_chunks()
        h = _key_hashes(keys_t, self.keys)
        held_sorted = False  # the held keys' last writes come in row-key order
        if self._index.exact:  # looked up first: a held key's writes share its row key
            found = self._index.lookup(h, None)  # exact keys need no verification
            last = _last_writes(h, found)
            found = found[last]
            held_sorted = True
        else:
            if h.size <= FEW_KEYS and len(set(h.tolist())) == h.size:
                last = np.arange(h.size)  # a few writes, distinct hashes: distinct keys
            else:
                order, starts = group_equal(  # writes grouped by key, exactly
                    h, lambda i, j: same_rows(keys_t, i, j))
                last = _last_of_groups(order, starts)
            written = keys_t if last.size == h.size else keys_t.take(pa.array(last))  # last is sorted
            found = self._index.lookup(h[last], self._same_as_held(written))
        h = h[last]
        present = found >= 0
        if up_all:
            up_mask, rows = None, last  # every write an upsert of the staged row it is at
            removed_keys = _NO_KEYS
        elif len(pending) == 1:  # deletes alone
            up_mask, rows = np.zeros(last.size, dtype=bool), np.full(last.size, -1)
        else:
            up_mask = np.concatenate(is_up)[last]
            rows = np.concatenate(row_of)[last]

        if up_mask is not None:  # deletes of present keys -> removed
            del_sel = ~up_mask & present
            removed_keys = found[del_sel] if held_sorted else sort_keys(found[del_sel])
            self._index.delete(h[del_sel], found[del_sel])
            self._row_keys.free(removed_keys)

        # upserts of present keys -> modifies where a value really changed
        mod_sel = present if up_mask is None else up_mask & present
        mod_keys, mod_rows = found[mod_sel], rows[mod_sel]
        if not held_sorted:  # one row key per written key: a permutation sorts them
            order = distinct_key_order(mod_keys, self._row_keys.end)
            mod_keys, mod_rows = mod_keys[order], mod_rows[order]
        changed_any = np.zeros(mod_keys.size, dtype=bool)
        changed_cols: list[str] = []
        # a coded column's staged values by code, each column looked up once for the
        # modifies and the adds (ArrowColumnSource.encode)
        codes: dict[str, npt.NDArray[np.int64]] = {}
        if mod_keys.size:
            assert data is not None
            take: pa.Array | None = None  # mod_rows for Arrow, made once if needed
            for name in self._values:  # one pass per column
                src = self._storage[name]
                numeric = _numeric_changes(src, data.column(name), mod_keys, mod_rows)
                if numeric is not None:  # numpy end to end: no Arrow round trip
                    diff, new_np = numeric
                    if diff.any():
                        changed_cols.append(name)
                        changed_any |= diff
                        self.graph.track(src)
                        assert isinstance(src, NumpyColumnSource)
                        src.set_numpy(mod_keys[diff], new_np[diff])
                    continue
                coded = src.encode(data.column(name)) if isinstance(src, ArrowColumnSource) else None
                if coded is not None:  # codes: equal codes are equal values
                    assert isinstance(src, ArrowColumnSource)
                    codes[name] = coded
                    new_codes = coded[mod_rows]
                    diff = new_codes != src.codes(mod_keys)
                    if diff.any():
                        changed_cols.append(name)
                        changed_any |= diff
                        self.graph.track(src)
                        src.set_codes(mod_keys[diff], new_codes[diff])
                    continue
                if take is None:
                    take = pa.array(mod_rows)
                new = data.column(name).take(take)
                old = src.get(mod_keys)
                diff = _differs(old, new)
                if diff.any():
                    changed_cols.append(name)
                    changed_any |= diff
                    self.graph.track(src)
                    src.set(mod_keys[diff], new.filter(pa.array(diff)))
        modified = mod_keys[changed_any]

        # upserts of absent keys -> added, on reused or fresh row keys
        add_sel = ~present if up_mask is None else up_mask & ~present
        n_add = int(np.count_nonzero(add_sel))
        added_keys = self._row_keys.allocate(n_add)
        if n_add:
            assert data is not None
            add_rows = rows[add_sel]
            self._index.insert(h[add_sel], added_keys)
            order = np.argsort(added_keys)
            added_keys, add_rows = added_keys[order], add_rows[order]
            # the usual append: rows that follow each other in the staged data (a slice, no
            # take) onto row keys that follow each other (sorted and distinct: their ends tell)
            consecutive = n_add == 1 or bool((np.diff(add_rows) == 1).all())
            new_rows = data.slice(int(add_rows[0]), n_add) if consecutive else data.take(pa.array(add_rows))
            run = int(added_keys[-1]) - int(added_keys[0]) == n_add - 1
            for name, src in self._storage.items():
                # reused keys were freed in an earlier cycle: no previous value to keep
                src.ensure_capacity(self._row_keys.end)
                coded = codes.get(name)
                if coded is not None:  # looked up above: written by code
                    assert isinstance(src, ArrowColumnSource)
                    if run:
                        src.set_new_range_codes(int(added_keys[0]), coded[add_rows])
                    else:
                        src.set_codes(added_keys, coded[add_rows])
                elif run:  # slice writes, nothing saved as previous
                    src.set_new_range(int(added_keys[0]), new_rows.column(name))
                else:
                    src.set(added_keys, new_rows.column(name))
        return TableUpdate.of(
            added=RowSet.from_keys(added_keys, assume_sorted=True),
            removed=RowSet.from_keys(removed_keys, assume_sorted=True),
            modified=RowSet.from_keys(modified, assume_sorted=True),
            modified_columns=changed_cols,
        )

    def _end_cycle(self) -> None:
        super()._end_cycle()
        compact_stale(self._storage.values(), self.size, self.rowset.keys)

    def _export_extra(self) -> dict[str, Any]:
        return {"row_keys": self._row_keys.export()}

    def _restore(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        self._row_keys.restore(extra["row_keys"])
        for name, src in self._storage.items():
            src.ensure_capacity(self._row_keys.end)
            src.set(keys, rows.column(name))
        if keys.size:
            self._index.insert(_key_hashes(rows.select(self.keys).combine_chunks(), self.keys), keys)


def _last_of_groups(order: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The last write of each group of equal keys (``group_equal``'s), in staging order."""
    if starts.size == order.size:  # every key written once
        return np.arange(order.size)
    mark = np.zeros(order.size, dtype=bool)  # distinct positions: marked, not sorted
    mark[np.maximum.reduceat(order, starts)] = True
    return np.flatnonzero(mark)


def _last_writes(h: npt.NDArray[np.uint64], found: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The last write per key (positions in staging order), for exact keys already looked
    up: first those of held keys, in order of their row keys, then those of absent keys,
    in staging order.

    Writes of a held key (``found >= 0``) share its row key: a stable sort of the row keys
    (radix passes, :func:`~engine._kernels.arrays.key_order`) puts them together in
    staging order, cheaper than sorting the 64-bit hashes of every write, and leaves the
    held keys sorted (the modified and removed rows need no second sort). Only the writes
    of absent keys are grouped by hash.
    """
    held = np.flatnonzero(found >= 0)
    parts = []
    if held.size:
        o = key_order(found[held])
        rk = found[held][o]
        end = np.ones(o.size, dtype=bool)
        np.not_equal(rk[1:], rk[:-1], out=end[:-1])
        parts.append(held[o[end]])
    new = np.flatnonzero(found < 0)
    if new.size:
        order, starts = group_equal(h[new], None)
        parts.append(new[_last_of_groups(order, starts)])
    return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else held


def _numeric_changes(src: WritableColumnSource, col: pa.ChunkedArray, keys: KeyArray, rows: KeyArray,
                     ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[Any]] | None:
    """For a numpy-stored column and null-free numeric new values: which of ``keys`` get a
    different value from ``col[rows]``, and those new values (numpy). None: use Arrow.

    The same rule as :func:`_differs`: NaN equals NaN, 0.0 equals -0.0, and a null before
    (the column's validity) differs from any value now.
    """
    if not isinstance(src, NumpyColumnSource) or src.dtype == np.bool_:
        return None
    whole = numeric_view(col, combine=True)
    if whole is None or whole.dtype != src.dtype:
        return None
    new = whole[rows]
    old, valid = src.get_numpy(keys)
    same = old == new
    if new.dtype.kind == "f":
        same |= np.isnan(old) & np.isnan(new)
    if valid is not None:
        same &= valid
    return ~same, new


def _differs(old: pa.Array | pa.ChunkedArray, new: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Per row: do the values differ (null equals null; NaN equals NaN; nested values
    compare element by element)?"""
    return ~values_equal(old, new)
