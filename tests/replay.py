"""The replay checker: a table rebuilt only from its updates, as a remote client would.

It starts from one snapshot and then applies each update — remove, shift, add, and for
modified rows only the columns in ``modified_columns`` — using just the rows the update
carries (added rows, modified rows' changed columns). After every cycle it must equal
``table.to_arrow()``; a column changed but not reported as modified shows up as a
difference.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.table import Table
from engine.update import TableUpdate


class ReplayChecker:
    def __init__(self, table: Table) -> None:
        self.table = table
        self.keys = table.rowset.keys().copy()
        self.data = table.to_arrow()
        self.updates = 0
        self.handle = table.listen(self._on_update)

    def _on_update(self, up: TableUpdate, table: Table) -> None:
        self.updates += 1
        keys, data = self.keys, self.data
        if up.removed:
            keep = up.removed.positions_of(keys) < 0
            keys, data = keys[keep], data.filter(pa.array(keep))
        if up.shifted:
            keys = up.shifted.apply_keys(keys)
            assert np.all(np.diff(keys) > 0), "shift reordered the replica's keys"
        if up.modified:
            mk = up.modified.keys()
            pos = np.searchsorted(keys, mk)
            assert np.array_equal(keys[pos], mk), "modified keys missing from the replica"
            cols = sorted(up.modified_columns)
            fresh = table.rows(mk, cols)
            n = data.num_rows
            idx = np.arange(n)
            idx[pos] = n + np.arange(mk.size)
            for c in cols:
                merged = pa.concat_arrays([_arr(data.column(c)), _arr(fresh.column(c))])
                data = data.set_column(data.schema.get_field_index(c), c, merged.take(pa.array(idx)))
        if up.added:
            ak = up.added.keys()
            rows = table.rows(ak)
            keys = np.concatenate((keys, ak))
            data = pa.concat_tables([data, rows])
            order = np.argsort(keys, kind="stable")
            keys, data = keys[order], data.take(pa.array(order))
        self.keys, self.data = keys, data

    def check(self, snapshot: pa.Table | None = None) -> None:
        """Assert the replica equals the table now (keys and values).

        ``snapshot``: the table's ``to_arrow()`` taken since its last cycle, when the caller
        has one (then it is not read a second time)."""
        assert np.array_equal(self.keys, self.table.rowset.keys()), "replica keys differ"
        expect = self.table.to_arrow() if snapshot is None else snapshot
        got = self.data.combine_chunks()
        if not got.equals(expect.combine_chunks()):
            for c in expect.column_names:
                a, b = _arr(got.column(c)), _arr(expect.column(c))
                if not _equal(a, b):
                    diff = [i for i in range(len(a)) if not _equal(a.slice(i, 1), b.slice(i, 1))][:10]
                    raise AssertionError(
                        f"replica of {self.table.name!r} differs in column {c!r} at positions "
                        f"{diff}: replica {[a[i].as_py() for i in diff]} vs table "
                        f"{[b[i].as_py() for i in diff]}"
                    )
            if not got.schema.equals(expect.schema):
                raise AssertionError("replica differs from the table")


def _equal(a: pa.Array, b: pa.Array) -> bool:
    """``a.equals(b)``, but NaN equal to NaN (Arrow's equals says NaN != NaN)."""
    if a.equals(b):
        return True
    if a.type != b.type or len(a) != len(b) or not pa.types.is_floating(a.type):
        return False
    if not a.is_null().equals(b.is_null()):
        return False
    x = a.fill_null(0).to_numpy(zero_copy_only=False)
    y = b.fill_null(0).to_numpy(zero_copy_only=False)
    return bool(np.array_equal(x, y, equal_nan=True))


def _arr(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
