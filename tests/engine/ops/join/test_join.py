"""Joins: example cycles with exact updates, then a two-sided oracle (both parents change)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine._kernels import rowkeymap as _rowkeymap
from engine.errors import InvalidKeyError, SchemaError, TableFailed
from engine.graph import UpdateGraph
from engine.ops.join import _state as _joinstate
from engine.ops.join.listener import exact_join, join, left_outer_join, natural_join
from engine.rowset import RowSet
from engine.update import TableUpdate
from tests.oracle import SYMS, RandomSource, assert_same, cycles
from tests.replay import ReplayChecker

# example tests ---------------------------------------------------------------------------------


def _graph():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "Sym": pa.string(), "Qty": pa.int64()}, "Id", name="L")
    right = g.keyed_table({"Sym": pa.string(), "Px": pa.float64(), "Venue": pa.string()}, "Sym",
                          name="R")
    return g, left, right


class _Updates:
    def __init__(self, table):
        self.all: list[TableUpdate] = []
        table.listen(lambda u, t: self.all.append(u))

    def last(self, g) -> TableUpdate | None:
        n = len(self.all)
        g.run_cycle()
        return self.all[-1] if len(self.all) > n else None


def _rows(table):
    return [list(r.values()) for r in table.to_arrow().to_pylist()]


def _col(table, name):
    return table.to_arrow().column(name).to_pylist()


def test_natural_join_example_cycles():
    g, left, right = _graph()
    left.upsert({"Id": [1, 2, 3], "Sym": ["A", "B", "C"], "Qty": [10, 20, 30]})
    right.upsert({"Sym": ["A", "B"], "Px": [1.0, 2.0], "Venue": ["X", "Y"]})
    g.run_cycle()
    nj = left.natural_join(right, "Sym")
    assert nj.column_names == ["Id", "Sym", "Qty", "Px", "Venue"]
    assert nj.rowset == left.rowset  # the left table's rows and row keys
    assert _rows(nj) == [[1, "A", 10, 1.0, "X"], [2, "B", 20, 2.0, "Y"], [3, "C", 30, None, None]]
    ups = _Updates(nj)
    rk = dict(zip([1, 2, 3], left.rowset.keys().tolist(), strict=True))

    # a right value change modifies exactly the matching left rows, in that column only
    right.upsert({"Sym": ["A"], "Px": [1.5], "Venue": ["X"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[1]]) and u.modified_columns == {"Px"}
    assert not u.added and not u.removed and not u.shifted

    # a right row arriving for a key modifies the rows of that key, in every joined column
    right.upsert({"Sym": ["C"], "Px": [3.0], "Venue": ["Z"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[3]]) and u.modified_columns == {"Px", "Venue"}

    # a right row leaving: its left rows get nulls
    right.delete({"Sym": ["B"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[2]]) and u.modified_columns == {"Px", "Venue"}
    assert _rows(nj)[1] == [2, "B", 20, None, None]

    # a left non-key modify passes through with its columns
    left.upsert({"Id": [1], "Sym": ["A"], "Qty": [11]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[1]]) and u.modified_columns == {"Qty"}

    # a left key change re-points the row
    left.upsert({"Id": [1], "Sym": ["C"], "Qty": [11]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[1]])
    assert u.modified_columns == {"Sym", "Px", "Venue"}
    assert _rows(nj)[0] == [1, "C", 11, 3.0, "Z"]

    # one right modify touches every left row of its key
    right.upsert({"Sym": ["C"], "Px": [3.5], "Venue": ["Z"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys([rk[1], rk[3]]) and u.modified_columns == {"Px"}

    # left adds and removes pass through; an added row is never also modified
    left.delete({"Id": [2]})
    left.upsert({"Id": [4], "Sym": ["A"], "Qty": [40]})
    right.upsert({"Sym": ["A"], "Px": [9.0], "Venue": ["X"]})
    u = ups.last(g)
    assert u.removed == RowSet.from_keys([rk[2]])
    assert u.added.keys().tolist() == [left.rowset.last()]
    assert _rows(nj) == [[1, "C", 11, 3.5, "Z"], [3, "C", 30, 3.5, "Z"], [4, "A", 40, 9.0, "X"]]
    assert u.modified.isdisjoint(u.added)

    # nothing joined changed: the join is silent
    right.upsert({"Sym": ["B"], "Px": [1.0], "Venue": ["Q"]})  # no left row has key B
    assert ups.last(g) is None


def test_natural_join_right_row_replaced_and_keys_swapped():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.int64()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "K": pa.int64(), "V": pa.string()}, "RId")
    left.upsert({"Id": [1, 2, 3], "K": [10, 20, 30]})
    right.upsert({"RId": [7, 8], "K": [10, 20], "V": ["a", "b"]})
    g.run_cycle()
    nj = natural_join(left, right, "K", joins=["V"])
    ups = _Updates(nj)
    # swap the keys of the two right rows in one cycle
    right.upsert({"RId": [7, 8], "K": [20, 10], "V": ["a", "b"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys(left.rowset.keys()[:2]) and u.modified_columns == {"V"}
    assert _col(nj, "V") == ["b", "a", None]
    # delete a right row and add another with the same key in one cycle
    right.delete({"RId": [7]})
    right.upsert({"RId": [9], "K": [20], "V": ["c"]})
    u = ups.last(g)
    assert u.modified == RowSet.from_keys(left.rowset.keys()[1:2])
    assert _col(nj, "V") == ["b", "c", None]


def test_null_keys_never_match():
    g = UpdateGraph(validate=True)
    left = g.append_only_table({"S": pa.string(), "X": pa.int64()})
    right = g.keyed_table({"RId": pa.int64(), "S": pa.string(), "V": pa.int64()}, "RId")
    left.append({"S": ["a", None], "X": [1, 2]})
    right.upsert({"RId": [1, 2, 3], "S": ["a", None, None], "V": [10, 20, 30]})
    g.run_cycle()
    nj = natural_join(left, right, "S", joins=["V"])  # two null right keys are no duplicate
    assert _col(nj, "V")[:1] == [10] and pd.isna(nj.to_pandas()["V"][1])
    assert join(left, right, "S", joins=["V"]).to_pandas()["V"].tolist() == [10]
    outer = left_outer_join(left, right, "S", joins=["V"]).to_pandas()
    assert outer["X"].tolist() == [1, 2] and pd.isna(outer["V"][1])
    with pytest.raises(InvalidKeyError, match="no match"):
        exact_join(left, right, "S", joins=["V"])


def test_duplicate_right_key_fails_the_table():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "Sym": pa.string()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "Sym": pa.string(), "Px": pa.float64()}, "RId")
    left.upsert({"Id": [1], "Sym": ["A"]})
    right.upsert({"RId": [1, 2], "Sym": ["A", "B"], "Px": [1.0, 2.0]})
    g.run_cycle()
    nj = natural_join(left, right, "Sym", joins=["Px"])
    right.upsert({"RId": [2], "Sym": ["A"], "Px": [2.0]})  # B -> A: now A twice
    g.run_cycle()
    assert isinstance(nj.failure, InvalidKeyError)
    assert "2 rows with key (Sym='A')" in str(nj.failure) and "join()" in str(nj.failure)
    with pytest.raises(TableFailed):
        nj.to_arrow()
    with pytest.raises(InvalidKeyError, match="Sym='A'"):
        natural_join(left, right, "Sym", joins=["Px"])  # at construction it raises


def test_exact_join_missing_key_fails_the_table():
    g, left, right = _graph()
    left.upsert({"Id": [1, 2], "Sym": ["A", "B"], "Qty": [1, 2]})
    right.upsert({"Sym": ["A", "B"], "Px": [1.0, 2.0], "Venue": ["X", "Y"]})
    g.run_cycle()
    ej = exact_join(left, right, "Sym", joins=["Px"])
    ej2 = exact_join(left, right, "Sym", joins=["Px"])
    assert _col(ej, "Px") == [1.0, 2.0]
    left.upsert({"Id": [3], "Sym": ["C"], "Qty": [3]})  # a left row without a match
    g.run_cycle()
    assert isinstance(ej.failure, InvalidKeyError)
    assert "left row" in str(ej.failure) and "Sym='C'" in str(ej.failure)
    # a right row leaving under existing left rows fails it too
    g2, left2, right2 = _graph()
    left2.upsert({"Id": [1, 2], "Sym": ["A", "B"], "Qty": [1, 2]})
    right2.upsert({"Sym": ["A", "B"], "Px": [1.0, 2.0], "Venue": ["X", "Y"]})
    g2.run_cycle()
    ej3 = exact_join(left2, right2, "Sym")
    right2.delete({"Sym": ["B"]})
    g2.run_cycle()
    assert isinstance(ej3.failure, InvalidKeyError) and "Sym='B'" in str(ej3.failure)
    assert ej2.failure is not None  # same graph as ej: failed in the same cycle
    with pytest.raises(InvalidKeyError, match="no match"):
        exact_join(left2, right2, "Sym")


def test_schema_errors_and_renames():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "Sym": pa.string(), "Px": pa.float64()}, "Id")
    right = g.keyed_table({"Ticker": pa.string(), "Px": pa.float64(), "N": pa.int32()}, "Ticker")
    with pytest.raises(SchemaError, match=r'joins=\["Px_right=Px"\]'):
        natural_join(left, right, "Sym=Ticker")
    with pytest.raises(SchemaError, match="no key column"):
        natural_join(left, right, "Sym")
    with pytest.raises(SchemaError, match="has no column"):
        natural_join(left, right, "Sym=Ticker", joins=["Nope"])
    with pytest.raises(SchemaError, match="is int64 but"):
        natural_join(left, right, "Id=Ticker", joins=["N"])
    with pytest.raises(SchemaError, match="match_bits"):
        join(left, right, "Sym=Ticker", joins=["N"], match_bits=0)
    left.upsert({"Id": [1], "Sym": ["A"], "Px": [5.0]})
    right.upsert({"Ticker": ["A"], "Px": [6.0], "N": [3]})
    g.run_cycle()
    nj = natural_join(left, right, "Sym=Ticker", joins=["RPx=Px", "N"])
    assert nj.column_names == ["Id", "Sym", "Px", "RPx", "N"]
    assert nj.schema.field("N").type == pa.int32()
    assert _rows(nj) == [[1, "A", 5.0, 6.0, 3]]
    # integer keys of different widths match
    nj2 = natural_join(right, left, "N=Id", joins=["Sym"])
    assert _rows(nj2) == [["A", 6.0, 3, None]]


def test_join_row_keys_shifts_and_modifies():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.string()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "K": pa.string(), "V": pa.int64(), "W": pa.int64()},
                          "RId")
    left.upsert({"Id": [1, 2, 3], "K": ["a", "b", "a"]})
    right.upsert({"RId": [10, 11, 12], "K": ["a", "a", "b"], "V": [1, 2, 3], "W": [0, 0, 0]})
    g.run_cycle()
    j = join(left, right, "K", joins=["RId", "V", "W"], match_bits=16)
    B = 1 << 16
    assert j.rowset.keys().tolist() == [0, 1, B, 2 * B, 2 * B + 1]
    assert [[a, b] for a, b in zip(_col(j, "Id"), _col(j, "RId"), strict=True)] == [[1, 10], [1, 11], [2, 12], [3, 10], [3, 11]]
    ups = _Updates(j)
    # a right modify of V changes exactly its matches, in column V only
    right.upsert({"RId": [11], "K": ["a"], "V": [20], "W": [0]})
    u = ups.last(g)
    assert u.modified.keys().tolist() == [1, 2 * B + 1] and u.modified_columns == {"V"}
    assert not u.added and not u.removed and not u.shifted
    # the first match of key a leaves: later matches shift down inside their blocks
    right.delete({"RId": [10]})
    u = ups.last(g)
    assert u.removed.keys().tolist() == [0, 2 * B]
    assert list(zip(u.shifted.begins, u.shifted.ends, u.shifted.deltas, strict=True)) == [(1, 1, -1), (2 * B + 1, 2 * B + 1, -1)]
    assert not u.added and not u.modified
    assert [[a, b] for a, b in zip(_col(j, "Id"), _col(j, "RId"), strict=True)] == [[1, 11], [2, 12], [3, 11]]
    # a right row arrives with key b on the freed right row key 0, so it comes first in
    # right order: left row 2 gains a match at j=0 and its old match shifts to j=1
    right.upsert({"RId": [13], "K": ["b"], "V": [4], "W": [0]})
    u = ups.last(g)
    assert u.added.keys().tolist() == [B] and not u.removed
    assert list(zip(u.shifted.begins, u.shifted.ends, u.shifted.deltas, strict=True)) == [(B, B, 1)]
    assert [[a, b] for a, b in zip(_col(j, "Id"), _col(j, "RId"), strict=True)] == [[1, 11], [2, 13], [2, 12], [3, 11]]
    # a left key change removes the old rows and adds the new ones
    left.upsert({"Id": [2], "K": ["a"]})
    u = ups.last(g)
    assert u.removed.keys().tolist() == [B, B + 1] and u.added.keys().tolist() == [B]
    assert [[a, b] for a, b in zip(_col(j, "Id"), _col(j, "RId"), strict=True)] == [[1, 11], [2, 11], [3, 11]]
    # same values: the keyed source reports nothing, and neither does the join
    left.upsert({"Id": [1], "K": ["a"]})
    assert ups.last(g) is None


def test_join_left_value_modify_and_self_join():
    g = UpdateGraph(validate=True)
    t = g.keyed_table({"Id": pa.int64(), "K": pa.int64(), "X": pa.int64()}, "Id")
    t.upsert({"Id": [1, 2, 3], "K": [7, 7, 8], "X": [10, 20, 30]})
    g.run_cycle()
    j = join(t, t, "K", joins=["Id2=Id", "X2=X"], match_bits=16)  # a self join
    B = 1 << 16
    assert j.rowset.keys().tolist() == [0, 1, B, B + 1, 2 * B]
    assert list(zip(_col(j, "Id"), _col(j, "Id2"), strict=True)) == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 3)]
    ups = _Updates(j)
    t.upsert({"Id": [1], "K": [7], "X": [11]})  # left side: row 1's block; right side: X2
    u = ups.last(g)
    assert u.modified.keys().tolist() == [0, 1, B] and u.modified_columns == {"X", "X2"}
    assert not u.added and not u.removed and not u.shifted
    assert _col(j, "X") == [11, 11, 20, 20, 30] and _col(j, "X2") == [11, 20, 11, 20, 30]
    nj = natural_join(t, t, "Id", joins=["K2=K"])  # unique on Id: a natural self join
    t.upsert({"Id": [3], "K": [7], "X": [30]})
    g.run_cycle()
    assert _col(nj, "K2") == [7, 7, 7]
    assert list(zip(_col(j, "Id"), _col(j, "Id2"), strict=True)) == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)]


def test_left_outer_join_null_rows():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.int64()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "K": pa.int64()}, "RId")
    left.upsert({"Id": [1, 2], "K": [5, 6]})
    right.upsert({"RId": [1], "K": [5]})
    g.run_cycle()
    lo = left_outer_join(left, right, "K", match_bits=16)
    B = 1 << 16
    assert lo.rowset.keys().tolist() == [0, B]
    assert _rows(lo) == [[1, 5, 1], [2, 6, None]]
    ups = _Updates(lo)
    right.upsert({"RId": [2, 3], "K": [6, 6]})  # the null row of Id 2 becomes two matches
    u = ups.last(g)
    assert u.removed.keys().tolist() == [B] and u.added.keys().tolist() == [B, B + 1]
    assert _rows(lo) == [[1, 5, 1], [2, 6, 2], [2, 6, 3]]
    right.delete({"RId": [1]})  # Id 1 loses its only match: a null row
    u = ups.last(g)
    assert u.removed.keys().tolist() == [0] and u.added.keys().tolist() == [0]
    assert _rows(lo)[0] == [1, 5, None]


def test_match_bits_grow_with_one_rekeying_shift():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.int64()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "K": pa.int64()}, "RId")
    left.upsert({"Id": [1, 2, 3], "K": [5, 6, 5]})
    right.upsert({"RId": [1, 2], "K": [5, 6]})
    g.run_cycle()
    j = join(left, right, "K")
    assert j.listener.bits == 1  # one match per left row: keys stay dense (L << 1)
    assert j.rowset.keys().tolist() == [0, 2, 4]
    ups = _Updates(j)
    right.upsert({"RId": [3, 4], "K": [5, 5]})  # key 5: three matches, more than 2**1
    u = ups.last(g)
    assert j.listener.bits == 3  # (3 - 1).bit_length() + 1: room to grow
    assert j.rowset.keys().tolist() == [0, 1, 2, 8, 16, 17, 18]
    assert list(zip(u.shifted.begins, u.shifted.ends, u.shifted.deltas, strict=True)) == [(2, 2, 6), (4, 4, 12)]
    assert u.added.keys().tolist() == [1, 2, 17, 18] and not u.removed and not u.modified
    assert list(zip(_col(j, "Id"), _col(j, "RId"), strict=True)) == [
        (1, 1), (1, 3), (1, 4), (2, 2), (3, 1), (3, 3), (3, 4)]


def test_too_many_matches_fails():
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.int64()}, "Id")
    right = g.append_only_table({"K": pa.int64()})
    left.upsert({"Id": [1], "K": [1]})
    right.append({"K": [1, 1]})
    g.run_cycle()
    j = join(left, right, "K", match_bits=1)
    assert j.size == 2
    right.append({"K": [1]})
    g.run_cycle()
    assert isinstance(j.failure, InvalidKeyError) and "match_bits" in str(j.failure)


# the two-sided oracle -------------------------------------------------------------------------


class RightDriver:
    """A keyed right table (by ``RId``) whose join-key columns change, with a random writer.

    ``mode``: ``"unique"`` keeps non-null keys distinct (natural joins), ``"full"`` also keeps
    every key of ``domain`` present (exact joins), ``"many"`` allows duplicates.
    Each cycle it changes values, re-keys rows (swaps included), deletes rows, re-adds
    deleted ``RId``s and deleted keys, adds rows, sometimes empties the table.
    """

    def __init__(self, graph, rng, key_cols, domain, mode, max_rows=40, extra=()):
        self.rng, self.key_cols, self.mode, self.max_rows = rng, key_cols, mode, max_rows
        self.domain = list(domain)  # key tuples
        self.extra = list(extra)
        self.all_keys = self.domain + self.extra
        fields = [("RId", pa.int64())] + [(c, _KEY_TYPES[c]) for c in key_cols]
        fields += [("RV", pa.float64()), ("RS", pa.string())]
        self.schema = pa.schema(fields)
        self.table = graph.keyed_table(self.schema, "RId", name="right")
        self.rows: dict[int, tuple] = {}  # RId -> (key index or -1 for null, RV, RS)
        self.next_id = 0
        self.dead: list[int] = []
        if mode == "full":
            self._write({self._new_id(): (k, *self._vals()) for k in range(len(self.domain))}, [])

    def _new_id(self):
        if self.dead and self.rng.random() < 0.3:
            return self.dead.pop(int(self.rng.integers(0, len(self.dead))))  # re-added RId
        self.next_id += 1
        return self.next_id

    def _vals(self):
        r = self.rng
        rv = None if r.random() < 0.1 else float(r.integers(0, 50))
        rs = None if r.random() < 0.1 else str(r.choice(["x", "y", "z", "w"]))
        return rv, rs

    def _free_keys(self, rows):
        used = {v[0] for v in rows.values()}
        return [k for k in range(len(self.all_keys)) if k not in used]

    def _write(self, upserts, deletes):
        for rid, v in upserts.items():
            self.rows[rid] = v
        for rid in deletes:
            self.rows.pop(rid, None)
            self.dead.append(rid)
        if upserts:
            ids = list(upserts)
            cols = {"RId": ids}
            for i, c in enumerate(self.key_cols):
                cols[c] = [None if upserts[x][0] < 0 else self.all_keys[upserts[x][0]][i] for x in ids]
            cols["RV"] = [upserts[x][1] for x in ids]
            cols["RS"] = [upserts[x][2] for x in ids]
            self.table.upsert(pa.table(cols, schema=self.schema))
        if deletes:
            self.table.delete(pa.table({"RId": pa.array(deletes, pa.int64())}))

    def step(self):
        r = self.rng
        if r.random() < 0.1:
            return
        rows = dict(self.rows)
        ids = list(rows)
        upserts, deletes = {}, []
        if self.mode != "full" and ids and r.random() < 0.03:
            self._write({}, ids)  # empty the table
            return
        # value modifies
        for rid in r.choice(ids, min(len(ids), int(r.integers(0, 4))), replace=False) if ids else []:
            rid = int(rid)
            k = rows[rid][0]
            upserts[rid] = (k, *self._vals()) if r.random() < 0.7 else (k, rows[rid][1], self._vals()[1])
            rows[rid] = upserts[rid]
        # key swaps between two rows (one cycle)
        if len(ids) >= 2 and r.random() < 0.3:
            a, b = (int(x) for x in r.choice(ids, 2, replace=False))
            ka, kb = rows[a][0], rows[b][0]
            upserts[a] = (kb, *rows[a][1:])
            upserts[b] = (ka, *rows[b][1:])
            rows[a], rows[b] = upserts[a], upserts[b]
        # re-key a row to an unused (or, in many mode, any) key, or to null
        if ids and r.random() < 0.4:
            rid = int(r.choice(ids))
            if rid in rows and not (self.mode == "full" and rows[rid][0] < len(self.domain)):
                pool = self._free_keys(rows) if self.mode != "many" else range(len(self.all_keys))
                pool = list(pool) + ([-1] if r.random() < 0.2 and self.mode != "full" else [])
                if pool:
                    upserts[rid] = (int(r.choice(pool)), *rows[rid][1:])
                    rows[rid] = upserts[rid]
        # delete a row and re-add its key on a new row in the same cycle
        if ids and r.random() < 0.3:
            rid = int(r.choice(ids))
            if rid in rows and rid not in upserts:
                k = rows.pop(rid)[0]
                deletes.append(rid)
                nid = self._new_id()
                while nid in rows or nid in deletes:
                    nid = self._new_id()
                upserts[nid] = (k, *self._vals())
                rows[nid] = upserts[nid]
        # plain deletes (never of domain keys in full mode)
        if ids and r.random() < 0.5:
            for rid in r.choice(ids, min(len(ids), int(r.integers(1, 3))), replace=False):
                rid = int(rid)
                if rid in rows and rid not in upserts and not (
                    self.mode == "full" and 0 <= rows[rid][0] < len(self.domain)
                ):
                    rows.pop(rid)
                    deletes.append(rid)
        # adds
        for _ in range(int(r.integers(0, 4)) if len(rows) < self.max_rows else 0):
            if self.mode == "many":
                k = int(r.integers(-1, len(self.all_keys))) if r.random() < 0.9 else -1
            else:
                free = self._free_keys(rows)
                if self.mode == "full":
                    free = [k for k in free if k >= len(self.domain)]
                if not free:
                    break
                k = int(r.choice(free)) if r.random() < 0.9 else -1
                if self.mode == "full" and k < 0:
                    continue
            nid = self._new_id()
            while nid in rows or nid in deletes:
                nid = self._new_id()
            upserts[nid] = (k, *self._vals())
            rows[nid] = upserts[nid]
        self._write(upserts, deletes)


_KEY_TYPES = {"Sym": pa.string(), "Qty": pa.int64(), "RQ": pa.int64(), "Key": pa.int64()}
QTY = [(q,) for q in range(-5, 100)]
SYM = [(s,) for s in SYMS]


def match_positions(lt, rt, left_on, right_on, how):
    """(left position, right position) pairs of the join, sorted by both, recomputed in
    plain Python (a dict from key tuple to right positions). Null keys never match; an
    unmatched left row of a ``how="left"`` join pairs with right position -1."""
    lkeys = list(zip(*(lt.column(c).to_pylist() for c in left_on), strict=True))
    rkeys = list(zip(*(rt.column(c).to_pylist() for c in right_on), strict=True))
    index: dict[tuple, list[int]] = {}
    for j, k in enumerate(rkeys):
        if None not in k:
            index.setdefault(k, []).append(j)
    lp, rp = [], []
    for i, k in enumerate(lkeys):
        found = index.get(k, []) if None not in k else []
        if found:
            lp += [i] * len(found)
            rp += found
        elif how == "left":
            lp.append(i)
            rp.append(-1)
    return np.array(lp, dtype=np.int64), np.array(rp, dtype=np.int64)


def pandas_positions(lt, rt, left_on, right_on, how):
    """The same pairs from ``pandas.merge``, with null right keys dropped first (pandas
    matches NaN/None keys with each other) and sorted by (left, right) explicitly."""
    keys = [f"_k{i}" for i in range(len(left_on))]
    lk = pd.DataFrame({k: lt.column(c).to_pandas() for k, c in zip(keys, left_on, strict=True)})
    lk["_lp"] = np.arange(lt.num_rows)
    rk = pd.DataFrame({k: rt.column(c).to_pandas() for k, c in zip(keys, right_on, strict=True)})
    rk["_rp"] = np.arange(rt.num_rows)
    rk = rk[rk[keys].notna().all(axis=1)]
    m = lk.merge(rk, how=how, on=keys)
    unsorted = m["_lp"].to_numpy(), m["_rp"].fillna(-1).to_numpy().astype(np.int64)
    m = m.sort_values(["_lp", "_rp"], kind="stable")
    return (m["_lp"].to_numpy(), m["_rp"].fillna(-1).to_numpy().astype(np.int64)), unsorted


def expected_join(lt, rt, left_on, right_on, out, how):
    """The join recomputed from scratch: left columns at the left positions, ``out`` right
    columns at the right positions (null for an unmatched left row)."""
    lp, rp = match_positions(lt, rt, left_on, right_on, how)
    miss = rp < 0
    cols = {c: lt.column(c).take(pa.array(lp, pa.int64())) for c in lt.column_names}
    for o, src in out:
        cols[o] = rt.column(src).take(pa.array(np.maximum(rp, 0), mask=miss)) if rt.num_rows \
            else pa.nulls(len(rp), rt.schema.field(src).type)
    return pa.table(cols)


def assert_same_arrow(got, want, ctx):
    """Equal names, types and values (nulls included); pandas' diff print on a mismatch."""
    ok = got.column_names == want.column_names and got.num_rows == want.num_rows
    ok = ok and all(got.column(c).combine_chunks().equals(want.column(c).combine_chunks())
                    for c in got.column_names)
    if not ok:
        assert_same(got.to_pandas(), want.to_pandas(), ctx)
        raise AssertionError(f"MISMATCH {ctx}: types or nulls differ\n{got}\n{want}")


def test_recomputation_agrees_with_pandas_merge():
    """The oracle's recomputation equals pandas' merge; pandas 3.1 also keeps left order and,
    within a left row, right order (we sort explicitly anyway)."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        syms = np.array(list(SYMS[:4]) + [None], dtype=object)
        lt = pa.table({"S": pa.array(syms[rng.integers(0, 5, rng.integers(0, 30))], pa.string())})
        lt = lt.append_column("Q", pa.array(rng.integers(0, 3, lt.num_rows), pa.int64()))
        rt = pa.table({"S": pa.array(syms[rng.integers(0, 5, rng.integers(0, 12))], pa.string())})
        rt = rt.append_column("Q", pa.array(rng.integers(0, 3, rt.num_rows), pa.int64()))
        for on in (["S"], ["S", "Q"], ["Q"]):
            for how in ("inner", "left"):
                (plp, prp), (ulp, urp) = pandas_positions(lt, rt, on, on, how)
                lp, rp = match_positions(lt, rt, on, on, how)
                assert np.array_equal(lp, plp) and np.array_equal(rp, prp), (trial, on, how)
                assert np.array_equal(ulp, plp) and np.array_equal(urp, prp), (trial, on, how)


class PrevChecker:
    """Inside each cycle, previous values at previous keys must equal last cycle's snapshot."""

    def __init__(self, table):
        self.table, self.errors = table, []
        self.snap()
        table.listen(self._on_update)

    def snap(self):
        self.keys = self.table.rowset.keys().copy()
        self.data = self.table.to_arrow()

    def _on_update(self, up, table):
        if not np.array_equal(table.prev_rowset.keys(), self.keys):
            self.errors.append("prev_rowset differs from last cycle's rowset")
            return
        got = table.rows(self.keys, prev=True)
        if not got.equals(self.data):
            for c in self.data.column_names:
                if not got.column(c).equals(self.data.column(c)):
                    self.errors.append(f"get_prev of column {c!r} differs from last cycle")

    def check(self, ctx):
        assert not self.errors, f"{ctx}: {self.errors[:3]}"
        self.snap()


def run_join_oracle(build, expected, *, right, seed=0, n_cycles=None, kinds=("append", "keyed", "ring"),
                    max_rows=120):
    """``run_oracle`` with a second, randomly driven right table on the same graph.

    ``right(graph, rng)`` returns a list of drivers (objects with ``.table`` and ``.step()``);
    ``build(left, *right_tables)`` makes the table under test and ``expected(left_df,
    *right_dfs)`` recomputes it. Checks each cycle: values and order, the replay of the
    updates (validated by the graph), and previous values.
    """
    total = n_cycles if n_cycles is not None else cycles()
    per_kind = max(1, total // len(kinds))
    for k_i, kind in enumerate(kinds):
        rng = np.random.default_rng([seed, k_i])
        g = UpdateGraph(validate=True)
        src = RandomSource(g, kind, rng, max_rows)
        drivers = right(g, rng)
        src.step()
        for d in drivers:
            d.step()
        g.run_cycle()
        result = build(src.table, *(d.table for d in drivers))
        replay, prev = ReplayChecker(result), PrevChecker(result)
        for c in range(per_kind):
            src.step()
            for d in drivers:
                d.step()
            g.run_cycle()
            ctx = f"seed={seed} kind={kind} cycle={c}"
            if result.failure is not None:
                raise AssertionError(f"{ctx}: result failed") from result.failure
            want = expected(src.table.to_arrow(), *(d.table.to_arrow() for d in drivers))
            assert_same_arrow(result.to_arrow(), want, ctx)
            try:
                replay.check()
            except AssertionError:
                print(f"REPLAY MISMATCH {ctx}")
                raise
            prev.check(ctx)


def _drivers(key_cols, domain, mode, extra=(), n=1, max_rows=40):
    return lambda g, rng: [RightDriver(g, rng, key_cols, domain, mode, max_rows, extra) for _ in range(n)]


OUT = [("RId", "RId"), ("RV", "RV"), ("RS", "RS")]


def test_oracle_natural_join_on_string_key():
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "left"),
        right=_drivers(["Sym"], SYM, "unique", extra=[("ZZZ",)]), seed=1, n_cycles=cycles(1200),
    )


def test_oracle_natural_join_on_renamed_int_key():
    out = [("V", "RV"), ("RS", "RS")]
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, "Qty=RQ", joins=["V=RV", "RS"]),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["RQ"], out, "left"),
        right=_drivers(["RQ"], QTY[::3], "unique", extra=[(200,), (201,)]), seed=2, n_cycles=cycles(600),
    )


def test_oracle_natural_join_on_two_keys():
    dom = [(s, q) for s in SYMS[:4] for q in range(-5, 15)]
    run_join_oracle(
        lambda lt, r: natural_join(lt, r, ["Sym", "Qty"]),
        lambda lt, r: expected_join(lt, r, ["Sym", "Qty"], ["Sym", "Qty"], OUT, "left"),
        right=_drivers(["Sym", "Qty"], dom, "unique", max_rows=60), seed=3, n_cycles=cycles(600),
    )


def test_oracle_exact_join():
    run_join_oracle(
        lambda lt, r: exact_join(lt, r, "Qty"),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["Qty"], OUT, "left"),
        right=_drivers(["Qty"], QTY, "full", extra=[(q,) for q in range(100, 110)], max_rows=130),
        seed=4,
    )


def test_oracle_join_many_to_many():
    run_join_oracle(
        lambda lt, r: join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "inner"),
        right=_drivers(["Sym"], SYM, "many", extra=[("ZZZ",)], max_rows=30), seed=5,
        n_cycles=cycles(1200), max_rows=60,
    )


def test_oracle_left_outer_join():
    run_join_oracle(
        lambda lt, r: left_outer_join(lt, r, "Sym"),
        lambda lt, r: expected_join(lt, r, ["Sym"], ["Sym"], OUT, "left"),
        right=_drivers(["Sym"], SYM, "many", extra=[("ZZZ",)], max_rows=30), seed=6,
        n_cycles=cycles(900), max_rows=60,
    )


def test_oracle_left_outer_join_int_key_small_blocks():
    run_join_oracle(
        lambda lt, r: left_outer_join(lt, r, "Qty=RQ", match_bits=3),
        lambda lt, r: expected_join(lt, r, ["Qty"], ["RQ"], OUT, "left"),
        right=_drivers(["RQ"], QTY[:12], "many", max_rows=20), seed=7, n_cycles=cycles(600), max_rows=60,
    )


# chains: a join's shifts feed another join, on either side -----------------------------------
_OUT2 = [("RId2", "RId"), ("RV2", "RV"), ("RS2", "RS")]
_J2 = ["RId2=RId", "RV2=RV", "RS2=RS"]


def test_oracle_chain_join_then_natural_join():
    # left shifts reach the natural join (join output moves rows when matches come and go)
    run_join_oracle(
        lambda lt, r1, r2: natural_join(join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "inner"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=8, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_chain_outer_join_then_join_then_outer():
    run_join_oracle(
        lambda lt, r1, r2: left_outer_join(
            left_outer_join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2, match_bits=4),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "left"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[:10], "many", 25)],
        seed=9, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_chain_right_side_shifts():
    # the right side is itself a join, so it shifts, re-keys and removes under the left
    out = [("RId", "RId"), ("RV", "RV"), ("RS", "RS"), ("RId2", "RId2")]
    run_join_oracle(
        lambda lt, r1, r2: join(lt, left_outer_join(r1, r2, "RS", joins=["RId2=RId", "RQ"]), "Sym",
                               joins=["RId", "RV", "RS", "RId2"]),
        lambda lt, r1, r2: expected_join(
            lt, expected_join(r1, r2, ["RS"], ["RS"], [("RId2", "RId"), ("RQ", "RQ")], "left"),
            ["Sym"], ["Sym"], out, "inner"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 15),
                              RightDriver(g, rng, ["RQ"], QTY[:6], "many", 8)],
        seed=10, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_chain_natural_join_on_shifting_right():
    # the right side is a join unique on (Sym, Qty) whose rows shift as matches come and go
    inner = [("Qty", "Qty"), ("RV2", "RV")]
    out = [("RV", "RV"), ("RV2", "RV2")]
    run_join_oracle(
        lambda lt, ra, rb: natural_join(
            lt, join(ra, rb, "RS", joins=["Qty", "RV2=RV"]), ["Sym", "Qty"], joins=["RV", "RV2"]),
        lambda lt, ra, rb: expected_join(
            lt, expected_join(ra, rb, ["RS"], ["RS"], inner, "inner"),
            ["Sym", "Qty"], ["Sym", "Qty"], out, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "unique", 8),
                              RightDriver(g, rng, ["Qty"], QTY[:40], "unique", 40)],
        seed=11, n_cycles=cycles(600), max_rows=60,
    )


def test_oracle_tiny_amortization_thresholds(monkeypatch):
    # compaction, index merges and rebuilds, and hash-mode key maps on every few cycles
    for name in ("SPARSE_SLACK", "INDEX_MIN_DELTA", "INDEX_MIN_STALE", "POOL_MIN_GARBAGE"):
        monkeypatch.setattr(_rowkeymap if name == "SPARSE_SLACK" else _joinstate, name, 0)
    run_join_oracle(
        lambda lt, r1, r2: natural_join(left_outer_join(lt, r1, "Sym"), r2, "Qty=RQ", joins=_J2),
        lambda lt, r1, r2: expected_join(expected_join(lt, r1, ["Sym"], ["Sym"], OUT, "left"),
                                        r2, ["Qty"], ["RQ"], _OUT2, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=12, n_cycles=cycles(300), max_rows=60,
    )


# chains with where and sort -------------------------------------------------------------------
def _sorted(t, col):
    """Stable ascending sort with nulls last (the sort op's order)."""
    v = t.column(col).to_numpy(zero_copy_only=False).astype(float)
    return t.take(pa.array(np.argsort(np.where(np.isnan(v), np.inf, v), kind="stable")))


def _where_price(t, bound):
    price = t.column("Price").to_numpy(zero_copy_only=False).astype(float)
    return t.filter(pa.array(np.nan_to_num(price, nan=-np.inf) > bound))


def test_oracle_chain_where_natural_join_sort():
    # sort reads the join's previous values of modified rows and re-sorts on a joined column
    run_join_oracle(
        lambda lt, r: natural_join(lt.where(pc.field("Price") > 20), r, "Sym").sort("RV"),
        lambda lt, r: _sorted(expected_join(_where_price(lt, 20), r, ["Sym"], ["Sym"], OUT, "left"), "RV"),
        right=_drivers(["Sym"], SYM, "unique", extra=[("ZZZ",)]), seed=13, n_cycles=cycles(600),
    )


def test_oracle_chain_sort_join_sort():
    # the sort's shifts and gapped keys reach both joins as their left side
    _OUT3 = [("RV3", "RV"), ("RS3", "RS")]
    run_join_oracle(
        lambda lt, r1, r2: natural_join(join(lt.sort("Price"), r1, "Sym").sort("RV"), r2,
                                        "Qty=RQ", joins=["RV3=RV", "RS3=RS"]),
        lambda lt, r1, r2: expected_join(
            _sorted(expected_join(_sorted(lt, "Price"), r1, ["Sym"], ["Sym"], OUT, "inner"), "RV"),
            r2, ["Qty"], ["RQ"], _OUT3, "left"),
        right=lambda g, rng: [RightDriver(g, rng, ["Sym"], SYM, "many", 20),
                              RightDriver(g, rng, ["RQ"], QTY[::2], "unique", 40)],
        seed=14, n_cycles=cycles(600), max_rows=60,
    )
