"""Key -> slot maps of a keyed state (:class:`KeyIndex`): the upsert's index of its records."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels import rowkeymap
from engine._kernels.hashing import Same, hash_rows
from engine._kernels.keymap import ExactKeyMap
from engine._kernels.rowkeymap import RowKeyMap
from engine._kernels.rowstore import FlatRowStore, RowStore
from engine.differential.indexed import int_key_values

I64 = npt.NDArray[np.int64]


class KeyIndex:
    """Key -> slot of the upsert's state, for keys given as rows of a table.

    One integer key column is mapped by its values in a
    :class:`~engine._kernels.rowkeymap.RowKeyMap` (a dense array while the values are dense,
    a hash map once they are sparse; the value is the key, so nothing is verified), as long
    as every value is non-negative: the first negative one moves every key to the general
    map, once and for good. Other keys go to an
    :class:`~engine._kernels.keymap.ExactKeyMap`: the hash finds the slot, the key values
    stored with the slot's record decide.

    A ``RowKeyMap`` turns sparse (sorted, then hashed: :attr:`RowKeyMap.hashed`) once and
    for good when its keys are sparse, which an
    upsert's first batches often are (10,000 keys drawn from a million). So the index
    keeps the bounds of every value it inserted, and once the map is sparse and these
    bounds pass the dense rule for the keys it holds (``4 * count + SPARSE_SLACK``), with
    the count at least twice what it was when the map was last found sparse (so a map on
    the rule's edge is not rebuilt over and over: the rebuilds are amortized O(1) per
    key), it rebuilds the map from its entries, dense.
    """

    def __init__(self, keys: tuple[str, ...], exact: bool, records: RowStore | FlatRowStore) -> None:
        self._keys = list(keys)
        self._records = records
        self._map = ExactKeyMap(exact)
        self._by_value: RowKeyMap | None = RowKeyMap() if int_key_values(
            records.schema.empty_table(), keys) is not None else None
        self._lo, self._hi = 0, -1  # every value inserted by value lies in [_lo, _hi]
        self._dense_from = 0  # count from which a sparse map may be rebuilt dense (0: unseen)

    def __len__(self) -> int:
        return len(self._by_value) if self._by_value is not None else len(self._map)

    def _same(self, table: pa.Table, rows: I64) -> Same | None:
        if self._map.exact:
            return None
        key_cols = table.select(self._keys)

        def same(i: I64, ids: I64) -> npt.NDArray[np.bool_]:
            return self._records.equal_at(key_cols, rows[i], ids, self._keys)

        return same

    def values(self, table: pa.Table) -> I64 | None:
        """The key values of ``table``'s rows while keys are mapped by value and these
        are all ``>= 0`` (so :meth:`lookup_values` finds them and inserting them keeps the
        map), else None."""
        if self._by_value is None:
            return None
        v = int_key_values(table, self._keys)
        if v is None or (v.size and int(v.min()) < 0):
            return None
        return v

    def lookup_values(self, values: I64) -> I64:
        """Slot of each key value (from :meth:`values`; repeats allowed), -1 if none."""
        assert self._by_value is not None
        return self._by_value.lookup(values)

    def _values(self, table: pa.Table, rows: I64) -> I64:
        v = int_key_values(table, self._keys)
        assert v is not None
        return v.take(rows)

    def lookup(self, table: pa.Table, rows: I64, kh: npt.NDArray[np.uint64]) -> I64:
        """Slot of the key of each row ``rows[i]`` (distinct keys, hashed ``kh[i]``), -1 if none."""
        if self._by_value is not None:
            return self._by_value.lookup(self._values(table, rows))
        return self._map.lookup(kh, self._same(table, rows))

    def insert(self, table: pa.Table, rows: I64, kh: npt.NDArray[np.uint64] | None, ids: I64) -> None:
        """Map the keys of ``rows`` (absent, distinct) to ``ids``, whose records are stored
        (``kh``, their hashes, may be None when the keys are mapped by value, all ``>= 0``)."""
        if self._by_value is not None:
            v = self._values(table, rows)
            if v.size == 0:
                return
            if int(v.min()) >= 0:
                self.insert_values(v, ids)
                return
            self._to_general()
        assert kh is not None
        self._map.insert(kh, ids)

    def insert_values(self, values: I64, ids: I64) -> None:
        """:meth:`insert` of key values (from :meth:`values`: keys mapped by value, every
        value ``>= 0``)."""
        m = self._by_value
        assert m is not None
        if values.size == 0:
            return
        m.insert(values, ids)
        lo, hi = int(values.min()), int(values.max())
        self._lo, self._hi = (lo, hi) if self._hi < 0 else (min(lo, self._lo), max(hi, self._hi))
        if m.hashed:
            self._maybe_dense()

    def delete_values(self, values: I64) -> None:
        """:meth:`delete` of key values (from :meth:`values`)."""
        assert self._by_value is not None
        self._by_value.remove(values)

    def delete(self, table: pa.Table, rows: I64, kh: npt.NDArray[np.uint64] | None, ids: I64) -> None:
        """Unmap the keys of ``rows`` (present, mapped to ``ids``; ``kh`` as for :meth:`insert`)."""
        if self._by_value is not None:
            self._by_value.remove(self._values(table, rows))
        else:
            assert kh is not None
            self._map.delete(kh, ids)

    def _maybe_dense(self) -> None:
        """Rebuild the sparse by-value map dense once its keys are (see the class docstring)."""
        m = self._by_value
        assert m is not None
        if not self._dense_from:
            self._dense_from = 2 * len(m)
        elif len(m) >= self._dense_from and self._hi - self._lo + 1 <= 4 * len(m) + rowkeymap.SPARSE_SLACK:
            keys, slots = m.items(ordered=False)
            self._by_value = RowKeyMap()
            self._by_value.insert(keys, slots)
            self._dense_from = 0

    def _to_general(self) -> None:
        assert self._by_value is not None
        _, ids = self._by_value.items()
        self._by_value = None
        self._map.insert(hash_rows(self._records.get(ids, self._keys)), ids)
