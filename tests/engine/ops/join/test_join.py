"""Joins: example cycles with exact updates (the two-sided oracle: test_join_oracle.py)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from engine.errors import InvalidKeyError, SchemaError, TableFailed
from engine.graph import UpdateGraph
from engine.ops.join.listener import exact_join, join, left_outer_join, natural_join
from engine.rowset import RowSet
from engine.update import TableUpdate

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


@pytest.mark.parametrize("how", ["natural", "exact", "join", "left_outer"])
def test_a_left_row_following_its_right_row_to_a_new_key_gets_the_right_row_s_new_values(how):
    """Left row 1 moves GOOG -> IBM in the cycle in which its right row 47 moves GOOG -> IBM
    too (a swap with 46) and changes its value: the same right row matches before and after,
    with a new value, so the row is modified in V. A seed hunt of the join oracle found this
    (the natural join's update left the row out: a subscriber kept 4.0)."""
    from tests.replay import ReplayChecker

    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "Sym": pa.string()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "Sym": pa.string(), "V": pa.float64()}, "RId")
    left.upsert({"Id": [1, 2], "Sym": ["GOOG", "AAPL"]})  # no other left row holds IBM
    right.upsert({"RId": [45, 46, 47], "Sym": ["AAPL", "IBM", "GOOG"], "V": [1.0, 15.0, 4.0]})
    g.run_cycle()
    make = {"natural": natural_join, "exact": exact_join, "join": join,
            "left_outer": left_outer_join}[how]
    out = make(left, right, "Sym", joins=["RId", "V"])
    replay, ups = ReplayChecker(out), _Updates(out)
    left.upsert({"Id": [1], "Sym": ["IBM"]})
    right.upsert({"RId": [46, 47], "Sym": ["GOOG", "IBM"], "V": [15.0, 33.0]})
    u = ups.last(g)
    rows = sorted(out.to_arrow().to_pylist(), key=lambda r: (r["Id"], r["RId"]))
    assert rows == [{"Id": 1, "Sym": "IBM", "RId": 47, "V": 33.0},
                    {"Id": 2, "Sym": "AAPL", "RId": 45, "V": 1.0}]
    assert u is not None
    replay.check()  # the rows the update names, read now, equal the table


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


def test_join_left_rows_waiting_for_their_key():
    # left rows whose key no right row has wait for it; the right row that brings the key
    # adds their matches (a waiting row modified in that cycle too), and a row that left
    # the key meanwhile is not matched by it
    g = UpdateGraph(validate=True)
    left = g.keyed_table({"Id": pa.int64(), "K": pa.string(), "X": pa.int64()}, "Id")
    right = g.keyed_table({"RId": pa.int64(), "K": pa.string()}, "RId")
    left.upsert({"Id": [1, 2, 3], "K": ["a", "b", "b"], "X": [0, 0, 0]})
    g.run_cycle()
    j = join(left, right, "K", joins=["RId"], match_bits=16)
    assert j.size == 0
    ups = _Updates(j)
    left.upsert({"Id": [4, 3], "K": ["b", "b"], "X": [0, 5]})  # row 4 arrives, row 3 changes X
    right.upsert({"RId": [7], "K": ["b"]})
    u = ups.last(g)
    rk = dict(zip([1, 2, 3, 4], left.rowset.keys().tolist(), strict=True))
    assert u.added.keys().tolist() == [rk[i] << 16 for i in (2, 3, 4)]
    assert not u.removed and not u.modified and not u.shifted
    assert _rows(j) == [[2, "b", 0, 7], [3, "b", 5, 7], [4, "b", 0, 7]]
    left.upsert({"Id": [1], "K": ["c"], "X": [0]})  # leaves key a in the cycle a arrives
    right.upsert({"RId": [8], "K": ["a"]})
    assert ups.last(g) is None
    left.upsert({"Id": [1], "K": ["a"], "X": [0]})
    u = ups.last(g)
    assert u.added.keys().tolist() == [rk[1] << 16] and not u.removed and not u.modified
    assert _rows(j)[0] == [1, "a", 0, 8]


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
