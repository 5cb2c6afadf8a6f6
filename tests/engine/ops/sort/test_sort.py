"""sort: example cycles with exact updates, the index's building blocks, then the oracle.

Row keys of a sorted table are its layout's choice; the examples pin them (rows start at
slot 64, two slots apart) because the point is to see exactly which keys an insert adds
and which it shifts.
"""

from __future__ import annotations

import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.errors import InputError, SchemaError
from engine.graph import UpdateGraph
from engine.ops.sort import _index as sort_index
from engine.ops.sort import _keys as sort_keys
from engine.ops.sort import _slots as sort_slots
from engine.ops.sort._index import SortIndex
from engine.ops.sort._keys import KeyEncoder
from engine.ops.sort._slots import LiveBits, Redirection
from engine.rowset import RowSet, RowSetShiftData
from engine.table import Table
from engine.update import TableUpdate
from tests.oracle import RandomSource, assert_same, run_oracle, share_cycles
from tests.replay import ReplayChecker
from tests.shifting import run_shifting_oracle

SCHEMA = pa.schema([("Id", pa.int64()), ("K", pa.string()), ("Price", pa.float64())])


def keyed(g: UpdateGraph, ids, ks, prices) -> Table:
    t = g.keyed_table(SCHEMA, "Id")
    t.upsert(pa.table({"Id": ids, "K": ks, "Price": prices}, schema=SCHEMA))
    g.run_cycle()
    return t


def record(table: Table) -> list[TableUpdate]:
    seen: list[TableUpdate] = []
    table.listen(lambda up, _t: seen.append(up))
    return seen


def assert_update(up: TableUpdate, added=(), removed=(), modified=(), shifted=((), (), ()),
                  modified_columns=()) -> None:
    assert up.added.keys().tolist() == list(added), f"added {up.added}"
    assert up.removed.keys().tolist() == list(removed), f"removed {up.removed}"
    assert up.modified.keys().tolist() == list(modified), f"modified {up.modified}"
    assert up.shifted == RowSetShiftData.from_arrays(*shifted), f"shifted {up.shifted}"
    assert up.modified_columns == frozenset(modified_columns), f"cols {up.modified_columns}"


def col(table: Table, name: str) -> list:
    """A column's values in row order (None for nulls)."""
    return table.to_arrow([name]).column(name).to_pylist()


def moved(up: TableUpdate, prev: RowSet) -> int:
    """Surviving rows whose key the update shifts."""
    return int(up.shifted.moved_keys(prev - up.removed)[0].size)


def sorted_frame(by: list[str], descending: list[bool]):
    """The recomputation: stable, null (and NaN) the largest value, per-column direction."""

    def expected(df: pd.DataFrame) -> pd.DataFrame:
        keys = []
        for col, desc in zip(by, descending, strict=True):
            s = df[col]
            null = s.isna().to_numpy()
            present = s[~null].to_numpy()
            uniq = np.unique(present)
            rank = np.full(len(df), uniq.size, dtype=np.int64)  # null after every value
            rank[~null] = np.searchsorted(uniq, present)
            keys.append(-rank if desc else rank)
        order = np.lexsort([np.arange(len(df))] + keys[::-1])  # ties keep row-key order
        return df.iloc[order]

    return expected


def checked(table: Table) -> Table:
    """The sorted table, with the index's own invariants checked after every cycle."""
    inner = table.listener.on_update

    def on_update(*updates):
        out = inner(*updates)
        table.listener.index.check()
        return out

    table.listener.on_update = on_update
    return table


# ---------------------------------------------------------------------------------------
# examples


def test_insert_between_rows_is_an_add_then_an_add_and_a_shift():
    """The seed's SortedKVTable: A, B, D sorted; C fits in a gap; CC needs D to move up."""
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2], ["A", "B", "D"], [1.0, 2.0, 3.0])
    s = t.sort("K")
    seen = record(s)
    assert s.rowset.keys().tolist() == [64, 66, 68]

    t.upsert(pa.table({"Id": [3], "K": ["C"], "Price": [4.0]}, schema=SCHEMA))
    g.run_cycle()
    assert_update(seen[-1], added=[67])  # a free slot between B and D: nothing moves

    t.upsert(pa.table({"Id": [4], "K": ["CC"], "Price": [5.0]}, schema=SCHEMA))
    g.run_cycle()
    assert_update(seen[-1], added=[68], shifted=([68], [68], [1]))  # D: 68 -> 69
    assert col(s, "K") == ["A", "B", "C", "CC", "D"]
    assert s.rowset.keys().tolist() == [64, 66, 67, 68, 69]


def test_modify_of_other_columns_is_a_modify_at_the_current_key():
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2], ["A", "B", "D"], [1.0, 2.0, 3.0])
    s = t.sort("K")
    seen = record(s)
    t.upsert(pa.table({"Id": [1], "K": ["B"], "Price": [20.0]}, schema=SCHEMA))
    g.run_cycle()
    assert_update(seen[-1], modified=[66], modified_columns=["Price"])
    assert col(s, "Price") == [1.0, 20.0, 3.0]


def test_new_sort_key_is_a_remove_and_an_add():
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2], ["A", "B", "D"], [1.0, 2.0, 3.0])
    s = t.sort("Price")
    seen = record(s)
    t.upsert(pa.table({"Id": [0], "K": ["A"], "Price": [9.0]}, schema=SCHEMA))
    g.run_cycle()
    assert_update(seen[-1], added=[70], removed=[64])  # appended after D
    assert col(s, "K") == ["B", "D", "A"]
    # a modify of the sort column that keeps the value keeps the row
    t.upsert(pa.table({"Id": [0, 1], "K": ["a", "B"], "Price": [9.0, 2.5]}, schema=SCHEMA))
    g.run_cycle()
    assert_update(seen[-1], added=[66], removed=[66], modified=[70],
                  modified_columns=["K", "Price"])
    assert col(s, "K") == ["B", "D", "a"]


def test_delete_is_a_remove():
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2], ["A", "B", "D"], [1.0, 2.0, 3.0])
    s = t.sort("K", descending=True)
    seen = record(s)
    t.delete(pa.table({"Id": [1]}))
    g.run_cycle()
    assert_update(seen[-1], removed=[66])
    assert col(s, "K") == ["D", "A"]


def test_nulls_are_largest_and_ties_keep_row_key_order():
    g = UpdateGraph(validate=True)
    price = pa.array([2.0, None, -0.0, float("nan"), 0.0, 2.0, None], pa.float64())
    t = keyed(g, list(range(7)), list("abcdefg"), price)
    asc = t.sort("Price")
    desc = t.sort("Price", descending=True)
    # -0.0 ties with 0.0 (rows c, e); NaN and null tie (rows b, d, g), all in row-key order
    assert col(asc, "K") == list("ceafbdg")
    assert col(desc, "K") == list("bdgafce")
    by_pandas = t.to_pandas().sort_values("Price", kind="stable", na_position="last")
    assert col(asc, "K") == by_pandas.K.tolist()


def test_several_columns_each_with_its_direction():
    g = UpdateGraph(validate=True)
    t = keyed(g, list(range(6)), ["x", "y", "x", None, "y", "x"], [3.0, 1.0, 5.0, 2.0, None, 3.0])
    s = t.sort(["K", "Price"], descending=[True, False])
    assert list(zip(col(s, "K"), col(s, "Price"), strict=True)) == [
        (None, 2.0), ("y", 1.0), ("y", None), ("x", 3.0), ("x", 3.0), ("x", 5.0)]
    assert col(s, "Id") == [3, 1, 4, 0, 5, 2]


def test_long_strings_and_64_bit_extremes_that_codes_cannot_settle():
    """Strings sharing 7+ leading bytes and int64 max vs null are settled on the values."""
    g = UpdateGraph(validate=True)
    schema = pa.schema([("Id", pa.int64()), ("S", pa.string()), ("N", pa.int64())])
    t = g.keyed_table(schema, "Id")
    imax, imin = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    t.upsert(pa.table({"Id": [0, 1, 2, 3], "S": ["instrument/b", "instrument/d", "instr", None],
                       "N": [imax, None, imin, 5]}, schema=schema))
    g.run_cycle()
    by_s = checked(t.sort("S"))
    by_n = checked(t.sort("N", descending=True))
    assert col(by_n, "Id") == [1, 0, 3, 2]
    t.upsert(pa.table({"Id": [4, 5, 6], "S": ["instrument/c", "instrument/a", "instrument/cc"],
                       "N": [None, imax, imax - 1]}, schema=schema))
    g.run_cycle()
    assert col(by_s, "S") == [
        "instr", "instrument/a", "instrument/b", "instrument/c", "instrument/cc",
        "instrument/d", None]
    assert col(by_n, "Id") == [1, 4, 0, 5, 6, 3, 2]


def test_one_insert_in_the_middle_of_100k_rows_moves_few_keys():
    g = UpdateGraph(validate=True)
    n = 100_000
    schema = pa.schema([("Id", pa.int64()), ("Price", pa.float64())])
    t = g.keyed_table(schema, "Id")
    t.upsert(pa.table({"Id": np.arange(n), "Price": np.arange(n) * 1.0}, schema=schema))
    g.run_cycle()
    s = t.sort("Price")
    seen = record(s)
    # every insert lands right after 50,000.0 (and before the previous one): the worst
    # spot, the gap keeps being full
    for i in range(60):
        prev = s.rowset
        t.upsert(pa.table({"Id": [n + i], "Price": [50_000.0 + 0.5 / (i + 1)]}, schema=schema))
        g.run_cycle()
        up = seen[-1]
        assert len(up.added) == 1 and not up.modified and not up.removed
        assert moved(up, prev) < n // 100, f"insert {i} moved {moved(up, prev)} keys"
    got = s.to_pandas().Price.to_numpy()
    assert np.all(np.diff(got) >= 0) and got.size == n + 60


def test_a_table_grown_dense_is_laid_out_again(monkeypatch):
    """Random inserts fill the gaps; past 65% of the span every row moves (a PMA resize)."""
    monkeypatch.setattr(sort_index, "BULK_MIN", 1 << 40)  # batches placed gap by gap, never merged
    g = UpdateGraph(validate=True)
    rng = np.random.default_rng(5)
    schema = pa.schema([("Id", pa.int64()), ("Price", pa.float64())])
    t = g.keyed_table(schema, "Id")
    t.upsert(pa.table({"Id": np.arange(4000), "Price": rng.random(4000)}, schema=schema))
    g.run_cycle()
    s = checked(t.sort("Price"))
    replay = ReplayChecker(s)
    relaid = 0
    for i in range(12):
        prev = s.rowset
        ids = np.arange(4000 + 300 * i, 4300 + 300 * i)
        t.upsert(pa.table({"Id": ids, "Price": rng.random(300)}, schema=schema))
        g.run_cycle()
        replay.check()
        relaid += s.listener.index.moved == len(prev)  # a layout counts every survivor
    assert 1 <= relaid <= 3  # 4,000 -> 7,600 rows: once per ~30% of growth
    want = t.to_pandas().sort_values("Price", kind="stable").Id.tolist()
    assert col(s, "Id") == want


class Merges(list[int]):
    """Each merge's batch size; ``grid``: how many of them found the survivors on the
    last full layout (only removes since), not by a scan of the live bits."""

    grid = 0


@pytest.fixture
def merges(monkeypatch):
    """Batches of 1/16 of the table or more are merged at any table size (``BULK_MIN`` 0)."""
    monkeypatch.setattr(sort_index, "BULK_MIN", 0)
    seen = Merges()
    inner, grid = SortIndex._merge, SortIndex._grid_survivors

    def counted(self, codes, values, pks):
        seen.append(pks.size)
        return inner(self, codes, values, pks)

    def on_grid(self):
        seen.grid += 1
        return grid(self)

    monkeypatch.setattr(SortIndex, "_merge", counted)
    monkeypatch.setattr(SortIndex, "_grid_survivors", on_grid)
    return seen


def test_a_large_batch_is_merged_and_the_rows_between_move_as_a_block(merges):
    """A new sort key for 1 row of 4 is a merge: removed at its old key, added at its new
    one, and the survivors laid out again, two slots apart, moving in runs of equal shift."""
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2, 3], ["A", "B", "C", "D"], [1.0, 2.0, 3.0, 4.0])
    s = checked(t.sort("Price"))
    seen = record(s)
    assert s.rowset.keys().tolist() == [64, 66, 68, 70]
    t.upsert(pa.table({"Id": [0], "K": ["A"], "Price": [3.5]}, schema=SCHEMA))
    g.run_cycle()
    assert merges == [1]
    # B and C move down as one block; D keeps its key
    assert_update(seen[-1], added=[68], removed=[64], shifted=([66], [68], [-2]))
    assert col(s, "K") == ["B", "C", "A", "D"]
    assert s.rowset.keys().tolist() == [64, 66, 68, 70]


def test_merges_back_to_back_shift_the_rows_between_the_changes_as_blocks(merges):
    """A merge after a merge: the survivors are the last layout's slots less the removed
    ones, and the shift changes only where a row went in or out."""
    g = UpdateGraph(validate=True)
    ids = list(range(8))
    t = keyed(g, ids, list("ABCDEFGH"), [float(i) for i in ids])
    s = checked(t.sort("Price"))
    seen = record(s)
    t.upsert(pa.table({"Id": [2], "K": ["C"], "Price": [7.5]}, schema=SCHEMA))  # C to the end
    g.run_cycle()
    assert merges == [1] and merges.grid == 1  # the build was a full layout
    assert col(s, "K") == list("ABDEFGHC")
    t.delete(pa.table({"Id": [4]}))  # E goes, ...
    t.upsert(pa.table({"Id": [0, 8], "K": ["A", "I"], "Price": [6.5, 1.5]}, schema=SCHEMA))  # A moves, I is new
    g.run_cycle()
    assert merges == [1, 2] and merges.grid == 2
    assert col(s, "K") == list("BIDFGAHC")
    # A (64) and E (70) leave; B moves down a row, D stays, F and G move down as one
    # range, H and C stay; I and A come in at 66 and 74
    assert_update(seen[-1], added=[66, 74], removed=[64, 70], shifted=([66, 72], [66, 74], [-2, -2]))


def test_shift_read_at_the_breaks_is_the_shift_read_off_every_survivor():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        old = 100 + 10 * np.sort(rng.choice(1000, n, replace=False))
        at = np.unique(rng.integers(0, n + 1, int(rng.integers(1, 6))))  # the delta changes here
        delta = np.zeros(n, dtype=np.int64)
        for a, m in zip(at, rng.integers(-3, 4, at.size), strict=True):
            delta[a:] += m
        new = old + delta  # order kept: neighbours 10 apart move at most 3 closer
        extra = rng.integers(0, n + 1, int(rng.integers(0, 4)))  # breaks where nothing changes
        got = sort_index._shift_at(old, new, np.concatenate((at, extra)))
        assert got == sort_slots.shift_from_runs(old, new)


def test_oracle_bulk_cycles_back_to_back(merges):
    """W1's shape: every cycle modifies the sort key of a third of the rows (some to the
    value they had), deletes a tenth and adds a tenth, so each cycle is a merge right
    after a merge; every fifth cycle is a small one placed gap by gap in between."""
    rng = np.random.default_rng(41)
    schema = pa.schema([("Id", pa.int64()), ("Price", pa.float64()), ("Q", pa.int64())])
    g = UpdateGraph(validate=True)
    t = g.keyed_table(schema, "Id")
    n, next_id = 400, 400
    t.upsert(pa.table({"Id": np.arange(n), "Price": rng.integers(0, 50, n) * 1.0,
                       "Q": rng.integers(0, 9, n)}, schema=schema))
    g.run_cycle()
    s = checked(t.sort(["Price", "Q"]))
    replay = ReplayChecker(s)
    want = sorted_frame(["Price", "Q"], [False, False])
    for c in range(150):
        ids = t.to_pandas().Id.to_numpy()
        small = c % 5 == 4
        k = 2 if small else ids.size // 3
        mod = rng.choice(ids, k, replace=False)
        gone = rng.choice(np.setdiff1d(ids, mod), 0 if small else ids.size // 10, replace=False)
        new = np.arange(next_id, next_id + (1 if small else ids.size // 10))
        next_id += new.size
        keys = np.concatenate((mod, new))
        price = rng.integers(0, 50, keys.size) * 1.0  # ties, and some rows keep their price
        if gone.size:
            t.delete(pa.table({"Id": gone}))
        t.upsert(pa.table({"Id": keys, "Price": price, "Q": rng.integers(0, 9, keys.size)}, schema=schema))
        g.run_cycle()
        assert_same(s.to_pandas(), want(t.to_pandas()), f"cycle {c}")
        replay.check()
    assert merges.grid > 80  # the merges that followed a merge (120 merges)


def test_parent_shift_moves_no_output_key():
    """Sorting a sorted table: the parent's shifts only re-point the redirection."""
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2, 3], ["A", "B", "D", "E"], [4.0, 3.0, 2.0, 1.0])
    by_k = t.sort("K")
    by_price = by_k.sort("Price")
    seen_k, seen_p = record(by_k), record(by_price)
    t.upsert(pa.table({"Id": [4], "K": ["C"], "Price": [1.5]}, schema=SCHEMA))
    g.run_cycle()
    t.upsert(pa.table({"Id": [5], "K": ["CC"], "Price": [0.5]}, schema=SCHEMA))
    g.run_cycle()
    assert seen_k[-1].shifted  # D moved up in by_k ...
    assert_update(seen_p[-1], added=[62])  # ... by_price only gains the new row, in front
    assert col(by_price, "K") == ["CC", "E", "C", "D", "B", "A"]


def test_previous_values_read_through_the_previous_redirection():
    g = UpdateGraph(validate=True)
    t = keyed(g, [0, 1, 2], ["A", "B", "D"], [1.0, 2.0, 3.0])
    s = t.sort("Price")
    prev_rows: list[pa.Table] = []
    s.listen(lambda up, tb: prev_rows.append(tb.rows(up.removed.keys(), prev=True)))
    # A moves to the end (remove + add), B gets deleted
    t.upsert(pa.table({"Id": [0], "K": ["A"], "Price": [10.0]}, schema=SCHEMA))
    t.delete(pa.table({"Id": [1]}))
    g.run_cycle()
    assert prev_rows[-1].to_pydict() == {"Id": [0, 1], "K": ["A", "B"], "Price": [1.0, 2.0]}
    assert col(s, "K") == ["D", "A"]


def test_bad_arguments_say_what_is_wrong():
    g = UpdateGraph(validate=True)
    t = keyed(g, [0], ["A"], [1.0])
    with pytest.raises(SchemaError, match="no such column.*has: Id, K, Price"):
        t.sort("Prize")
    with pytest.raises(InputError, match="at least one column"):
        t.sort([])
    with pytest.raises(InputError, match="appear twice"):
        t.sort(["K", "K"])
    with pytest.raises(InputError, match="one bool per column"):
        t.sort(["K", "Price"], descending=[True])
    lists = g.append_only_table(pa.schema([("L", pa.list_(pa.int64()))]))
    with pytest.raises(SchemaError, match="cannot sort by column 'L'"):
        lists.sort("L")


# ---------------------------------------------------------------------------------------
# building blocks


def test_first_code_search_matches_searchsorted_over_the_rows():
    """``SortIndex._lower_bound`` (fence, then bisection steps without bounds tests) is
    ``searchsorted`` over the codes between the first and last row (sorted there by
    Invariant G): sorted queries with ties, codes below the first row, equal to and above
    the last one, and ranges narrower than a fence block."""
    rng = np.random.default_rng(7)
    g = UpdateGraph(validate=True)
    schema = pa.schema([("Id", pa.int64()), ("Price", pa.float64())])
    t = g.keyed_table(schema, "Id")
    # ties in half the rows (50 prices), the other half (and the last rows) distinct
    prices = np.where(rng.random(5_000) < 0.5, rng.integers(0, 50, 5_000) * 1.0, rng.random(5_000) * 1e4)
    t.upsert(pa.table({"Id": np.arange(5_000), "Price": prices}, schema=schema))
    g.run_cycle()
    s = t.sort("Price")
    for _ in range(3):  # gaps of every width: removes and inserts between the checks
        t.delete(pa.table({"Id": rng.choice(5_000, 300, replace=False)}))
        g.run_cycle()
        t.upsert(pa.table({"Id": np.arange(5_000), "Price": prices}, schema=schema))
        g.run_cycle()
        idx = s.listener.index
        idx.finish()
        live = idx.live_slots()
        first, last = int(live[0]), int(live[-1])
        c0 = idx._codes[0]
        c0[last + 1:] = 0  # past the last row codes are stale: the search must not read them
        for lo, hi in [(first, last + 1), (first, first + 40), (last - 70, last + 1),
                       (first + 65, last - 200)]:
            span = c0[lo:hi]
            pool = np.concatenate((span, span + np.uint64(1), [np.uint64(0), span[-1],
                                   np.uint64(2**64 - 1)]))
            q = np.sort(rng.choice(pool, 400))
            want = lo + np.searchsorted(span, q, side="left")
            assert idx._lower_bound(q, lo, hi).tolist() == want.tolist(), (lo, hi)


def test_live_bits_successor_and_predecessor_match_brute_force():
    rng = np.random.default_rng(3)
    cap = 1 << 14
    for density in (0.001, 0.05, 0.5, 0.97):
        slots = np.flatnonzero(rng.random(cap) < density)
        bits = LiveBits(cap)
        bits.set(slots)
        drop = rng.choice(slots, slots.size // 3, replace=False)
        bits.clear(drop)
        live = np.setdiff1d(slots, drop)
        assert np.array_equal(bits.all_live(), live)
        q = rng.integers(-3, cap + 3, 2000)
        i = np.searchsorted(live, q, side="left")
        succ = np.where(i < live.size, live[np.minimum(i, live.size - 1)], -1)
        j = np.searchsorted(live, q, side="right") - 1
        pred = np.where(j >= 0, live[np.maximum(j, 0)], -1)
        assert np.array_equal(bits.succ(q), succ)
        assert np.array_equal(bits.pred(q), pred)
        some = q[:300].tolist()
        assert [bits.succ_one(x) for x in some] == succ[:300].tolist()
        assert [bits.pred_one(x) for x in some] == pred[:300].tolist()
        inside = np.clip(q[:300], 0, cap - 1)
        assert [bits.free_succ_one(x) for x in inside.tolist()] == bits.free_succ(inside).tolist()
        assert [bits.free_pred_one(x) for x in inside.tolist()] == bits.free_pred(inside).tolist()
        if live.size:
            assert (bits.first(), bits.last()) == (live[0], live[-1])
        for level in (4, 6, 9):
            w = np.arange(cap >> level)
            want = np.bincount(live >> level, minlength=w.size)
            assert np.array_equal(bits.count(level, w), want)


def test_live_bits_of_a_layout_are_those_of_its_slots():
    # from_step writes whole words for a step dividing 64; any step, edges inside one
    # word or many, a range to the capacity's end or past it, and an empty range
    rng = np.random.default_rng(5)
    cases = [(256, 0, 256, 1), (256, 63, 65, 2), (256, 5, 6, 2), (256, 10, 10, 2), (256, 0, 300, 2),
             (512, 64, 128, 64), (512, 1, 512, 3), (512, 127, 129, 4)]
    for _ in range(300):
        cap = 64 << int(rng.integers(0, 5))
        start = int(rng.integers(0, cap))
        cases.append((cap, start, int(rng.integers(start, cap + 70)), int(rng.choice([1, 2, 3, 4, 8, 5, 32, 64]))))
    for cap, start, stop, step in cases:
        got = LiveBits.from_step(cap, start, stop, step)
        want = LiveBits.from_slots(cap, np.arange(start, min(stop, cap), step))
        assert got.all_live().tolist() == want.all_live().tolist(), (cap, start, stop, step)
        assert [lv.tolist() for lv in got._levels] == [lv.tolist() for lv in want._levels], (cap, start, stop, step)


def test_live_bits_set_and_clear_a_few_slots_as_integers(monkeypatch):
    """The plain-integer path (up to ``FEW`` slots) leaves the words and summary levels
    exactly as the vectorized one does."""
    rng = np.random.default_rng(4)
    cap = 1 << 14
    few, many = LiveBits(cap), LiveBits(cap)
    for _ in range(400):
        slots = rng.choice(cap, int(rng.integers(1, sort_slots.FEW + 1)), replace=False)
        op = "set" if rng.random() < 0.6 else "clear"
        getattr(few, op)(slots)
        with monkeypatch.context() as m:
            m.setattr(sort_slots, "FEW", 0)
            getattr(many, op)(slots)
        assert all(np.array_equal(a, b) for a, b in zip(few._levels, many._levels, strict=True))
    assert few.all_live().size > 100


def test_redirection_keeps_values_of_the_cycle_start():
    r = Redirection(16)
    r.write(np.arange(4), np.array([10, 11, 12, 13]))
    r.begin_cycle()
    r.write(np.array([1, 2]), np.array([21, 22]))
    r.write(np.array([2, 3]), np.array([32, 33]))
    assert r.pk(np.arange(4)).tolist() == [10, 21, 32, 33]
    assert r.prev_pk(np.arange(4)).tolist() == [10, 11, 12, 13]
    r.replace(np.array([5, 6, 7, 8, 9]))  # a full layout mid-cycle
    assert r.prev_pk(np.arange(4)).tolist() == [10, 11, 12, 13]
    r.end_cycle()
    assert r.prev_pk(np.arange(4)).tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("values", [
    pa.array([3, None, -7, 0, np.iinfo(np.int64).max, np.iinfo(np.int64).min], pa.int64()),
    pa.array([1.5, None, -0.0, float("inf"), float("-inf"), float("nan"), 0.0], pa.float64()),
    pa.array(["", "a", None, "ab", "a\x00", "abcdefg", "abcdefgh", "abcdefgz", "é"], pa.string()),
    pa.array([True, None, False], pa.bool_()),
    pa.array([5, None, 0, 255], pa.uint8()),
    pa.array([0, None, -10**15], pa.timestamp("us")),
    pa.array([decimal.Decimal(v) if v else None for v in (
        "1.25", "", "-7.50", "0", "0.01", "-0.01", "9999999999999999.99", "-9999999999999999.99")],
        pa.decimal128(18, 2)),
])
def test_codes_order_like_the_values(values, descending):
    enc = KeyEncoder("x", values.type, descending)
    codes = enc.encode(values)
    sign = -1 if descending else 1
    for i in range(len(values)):
        for j in range(len(values)):
            a, b = values[i].as_py(), values[j].as_py()
            a = None if isinstance(a, float) and np.isnan(a) else a
            b = None if isinstance(b, float) and np.isnan(b) else b
            want = 0 if a == b else (1 if a is None else -1 if b is None else (1 if a > b else -1))
            got = int(np.sign(int(codes[i]) - int(codes[j])))
            if got == 0 and not enc.exact and enc.ambiguous(codes[i:i + 1])[0]:
                got = int(enc.compare(values.slice(i, 1), values.slice(j, 1))[0])  # sort order too
            assert got == sign * want, (a, b, descending)


@pytest.mark.parametrize("pks_sorted", [False, True])
@pytest.mark.parametrize("distinct", [3, 50, 10**6])
def test_a_batch_orders_by_key_then_parent_key(pks_sorted, distinct):
    # one key column: ties (few distinct values) or none, parent keys in any order or
    # ascending (pks_sorted), values with nulls; the order of a lexsort by (key, parent key)
    rng = np.random.default_rng(distinct)
    enc = KeyEncoder("x", pa.float64(), False)
    for n in (0, 1, 2, 17, 3000):
        vals = rng.integers(0, distinct, n).astype(float)
        values = pa.array(vals, mask=rng.random(n) < 0.1)
        pks = rng.choice(10 * n + 1, n, replace=False).astype(np.int64)
        if pks_sorted:
            pks.sort()
        codes = enc.encode(values)
        got = sort_keys.order_batch([enc], [values], [codes], pks, pks_sorted=pks_sorted)
        assert got.tolist() == np.lexsort((pks, codes)).tolist()


@pytest.mark.parametrize("descending", [False, True])
def test_a_few_floats_encode_as_a_batch_does(descending, monkeypatch):
    # value by value (up to FEW_FLOATS) or vectorized: the same codes, for float64 and
    # float32, signed zeros, infinities, NaN, nulls, subnormals and extremes
    rng = np.random.default_rng(11)
    pool = [0.0, -0.0, 1.5, -1.5, float("inf"), float("-inf"), float("nan"), None, 5e-324,
            -5e-324, 1.7976931348623157e308, -1.7976931348623157e308, 0.1, -3.0]
    for t in (pa.float64(), pa.float32()):
        enc = KeyEncoder("x", t, descending)
        for _ in range(200):
            vals = pa.array([pool[i] for i in rng.integers(0, len(pool), int(rng.integers(0, 9)))], t)
            monkeypatch.setattr(sort_keys, "FEW_FLOATS", 1 << 30)
            few = enc.encode(vals)
            monkeypatch.setattr(sort_keys, "FEW_FLOATS", 0)
            batch = enc.encode(vals)
            assert few.dtype == batch.dtype and few.tolist() == batch.tolist(), vals


# ---------------------------------------------------------------------------------------
# the oracle: random sources (append, keyed, ring), recomputed and replayed every cycle


@pytest.fixture(params=["vectorized", "integers"])
def placement(request, monkeypatch):
    """Batches placed one way only: ``FEW_MAX`` (and ``LiveBits``' ``FEW``, the encoder's
    ``FEW_FLOATS``) 0, every batch vectorized, or unbounded, every batch tried as plain
    integers first (and the ghosts refilled so, floats encoded value by value). Call the
    returned function after the run: it checks which path ran."""
    few = 0 if request.param == "vectorized" else 1 << 30
    monkeypatch.setattr(sort_index, "FEW_MAX", few)
    monkeypatch.setattr(sort_slots, "FEW", few)
    monkeypatch.setattr(sort_keys, "FEW_FLOATS", few)
    share_cycles(monkeypatch, 2)
    placed: list[bool] = []
    inner = SortIndex._place_few

    def counted(self, codes, values, pks):
        out = inner(self, codes, values, pks)
        placed.append(out is not None)
        return out

    monkeypatch.setattr(SortIndex, "_place_few", counted)

    def check() -> None:
        if request.param == "vectorized":
            assert not placed
        else:  # most batches fit their gaps; the rest fell back to the vectorized path
            assert sum(placed) > 50 and not all(placed), (sum(placed), len(placed))
    return check


def test_oracle_by_price(placement):
    run_oracle(lambda t: checked(t.sort("Price")), sorted_frame(["Price"], [False]), seed=21)
    placement()


def test_oracle_by_sym_descending(placement):
    run_oracle(lambda t: checked(t.sort("Sym", descending=True)), sorted_frame(["Sym"], [True]),
               seed=22)
    placement()


def test_oracle_by_sym_then_price_mixed(placement):
    run_oracle(lambda t: checked(t.sort(["Sym", "Price"], descending=[False, True])),
               sorted_frame(["Sym", "Price"], [False, True]), seed=23)
    placement()


CHAIN_CYCLES = 500  # chains reuse the paths above; the three runs above are the long ones


def test_oracle_where_then_sort():
    run_oracle(lambda t: t.where(pc.field("Qty") > 20).sort(["Price", "Qty"], [True, False]),
               lambda df: sorted_frame(["Price", "Qty"], [True, False])(df[df.Qty > 20]),
               seed=24, n_cycles=CHAIN_CYCLES)


def test_oracle_sort_of_a_sort():
    run_oracle(lambda t: checked(t.sort("Price").sort("Sym")),
               lambda df: sorted_frame(["Sym"], [False])(sorted_frame(["Price"], [False])(df)),
               seed=25, n_cycles=CHAIN_CYCLES)


def test_oracle_sort_of_a_merge():
    """Merge regions are 2**40 keys apart: the parent-key index is a hash map there."""
    big, small = pc.field("Qty") > 50, pc.field("Qty") <= 50
    run_oracle(lambda t: checked(t.where(big).merge(t.where(small)).sort("Price", descending=True)),
               lambda df: sorted_frame(["Price"], [True])(pd.concat([df[df.Qty > 50], df[df.Qty <= 50]])),
               seed=29, n_cycles=CHAIN_CYCLES)


def test_oracle_sort_then_head_and_where():
    run_oracle(lambda t: t.sort("Qty", descending=True).where(pc.field("Price") < 60).head(5),
               lambda df: sorted_frame(["Qty"], [True])(df).query("Price < 60").head(5),
               seed=26, n_cycles=CHAIN_CYCLES)


LONG = pc.Expression._call("binary_join_element_wise",
                           [pc.scalar("instrument/"), pc.field("Sym"), pc.scalar("")])


def test_oracle_by_a_decimal_column(placement):
    """A ``decimal128`` key sorts by its unscaled value: ``Qty`` as ``DECIMAL(12, 2)`` (its
    negative values too) orders the rows as ``Qty`` does, ties by ``Price``."""
    cents = pc.field("Qty").cast(pa.int32()).cast(pa.decimal128(12, 2))  # int32: room for it

    def sorted_by_cents(t: Table) -> Table:
        return checked(t.update(D=cents).sort(["D", "Price"], [True, False])).view(*t.column_names)

    run_oracle(sorted_by_cents, sorted_frame(["Qty", "Price"], [True, False]), seed=31,
               n_cycles=CHAIN_CYCLES)
    placement()


def test_a_decimal_wider_than_18_digits_is_refused_by_name():
    g = UpdateGraph()
    t = g.append_only_table(pa.schema([("d", pa.decimal128(19, 2))]), name="wide")
    with pytest.raises(SchemaError, match=r"column 'd' of type decimal128\(19, 2\).*up to 18 digits"):
        t.sort("d")


def test_oracle_long_strings_after_update(placement):
    """Values sharing a 7+ byte prefix: every comparison goes back to the strings."""

    def expected(df: pd.DataFrame) -> pd.DataFrame:
        # null stays null as to_pandas gives it (a one-row table of a null Sym too: a map to
        # None made an object column [None] there, not the string column's NaN)
        df = df.assign(L="instrument/" + df.Sym)
        return sorted_frame(["L", "Qty"], [True, False])(df)

    run_oracle(lambda t: checked(t.update(L=LONG).sort(["L", "Qty"], [True, False])), expected,
               seed=27, n_cycles=CHAIN_CYCLES)
    placement()


def test_oracle_parent_that_shifts(placement):
    """A source whose updates carry shifts (shared with the filter tests)."""
    run_shifting_oracle([
        (lambda t: checked(t.sort("Price")), sorted_frame(["Price"], [False])),
        (lambda t: checked(t.sort(["Sym", "Qty"], [True, False])), sorted_frame(["Sym", "Qty"], [True, False])),
    ], seed=28, n_cycles=400)
    placement()


def _whole_table_price_modifies(src: RandomSource, rows: pa.Table | None, c: int) -> None:
    """The random cycles, but every 40th cycle of a keyed source grows it to 48 rows and
    the next negates every price (a null becomes a number): the order reverses, so a merge
    moves 40 rows or more, whatever the seed (the random writer's whole-table modifies can
    all fall on small tables, and a row given a new price may keep its place)."""
    t = src.table
    if src.kind != "keyed" or c % 40 < 38:
        src.step(rows)
    elif c % 40 == 38:
        if t.size < 48:
            t.upsert(src._rows(48 - t.size))
    else:
        cur = t.to_arrow() if rows is None else rows
        price = cur.column("Price")
        moved = pc.fill_null(pc.negate(price), pa.array(src.rng.integers(1, 5, cur.num_rows) * 2.5))
        t.upsert(cur.set_column(cur.schema.get_field_index("Price"), "Price", moved))


def test_oracle_merged_batches_by_price(merges):
    run_oracle(lambda t: checked(t.sort("Price")), sorted_frame(["Price"], [False]), seed=31,
               n_cycles=1200, step=_whole_table_price_modifies)
    assert len(merges) > 300 and max(merges) >= 40  # whole-table modifies among them
    assert merges.grid > 30  # and merges right after a merge


def test_oracle_merged_batches_nan_infinities_signed_zeros_and_nulls(merges):
    """Price / Qty: 0/0 is NaN, x/0 an infinity, 0/-5 is -0.0, a null price null."""
    ratio = pc.divide(pc.field("Price"), pc.field("Qty"))

    def expected(df: pd.DataFrame) -> pd.DataFrame:
        df = df.assign(R=df.Price / df.Qty)
        return sorted_frame(["R", "Sym"], [True, False])(df)

    run_oracle(lambda t: checked(t.update(R=ratio).sort(["R", "Sym"], [True, False])), expected,
               seed=32, n_cycles=900)
    assert len(merges) > 200


def test_oracle_merged_batches_of_long_strings_and_a_shifting_parent(merges):
    """Ties codes cannot settle are settled on the values of live rows; parent shifts."""

    def expected(df: pd.DataFrame) -> pd.DataFrame:
        df = df.assign(L="instrument/" + df.Sym)  # null stays null (NaN, as to_pandas gives it)
        return sorted_frame(["L", "Qty"], [True, False])(df)

    run_oracle(lambda t: checked(t.update(L=LONG).sort(["L", "Qty"], [True, False])), expected,
               seed=33, n_cycles=CHAIN_CYCLES)
    n = len(merges)
    run_shifting_oracle([
        (lambda t: checked(t.sort("Price")), sorted_frame(["Price"], [False])),
        (lambda t: checked(t.sort(["Sym", "Qty"], [True, False])), sorted_frame(["Sym", "Qty"], [True, False])),
    ], seed=34, n_cycles=400)
    assert n > 100 and len(merges) - n > 100
    assert merges.grid > 30
