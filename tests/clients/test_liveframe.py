"""LiveTable.df kept current in place (clients/liveframe.py, issue #39 item 6).

Examples first: how a change moves rows (a splice); a small update writes only its rows
into the same frame; appends land in spare room; what a user derived from the frame keeps
its values (Copy-on-Write); integer and boolean columns change dtype with their first and
last null; a categorical column is converted again; a frame changed by its user, a
viewport, a wide table, too many moves, a message arriving while a column converts and
lost row keys rebuild; reads on another thread than the reader see whole messages.

Then the property: a model table of many dtypes (nullable integers and booleans, floats,
strings, time zones, dates, categories) sends random messages to a LiveTable fed by hand
(no server: ``LiveTable.apply``) — removes, inserts in the middle, appends, modifies of some
columns, shifts, empty messages, snapshots, nulls coming and going — and ``live.df``, read
after a random number of them, equals ``live.to_arrow().to_pandas()`` every time, while
most reads are applied in place. Then the same through a real server, with a sorted
derived table (shifts).
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import weakref
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyroaring import BitMap64

from clients import liveframe
from clients.live import LiveTable
from clients.liveframe import LiveFrame
from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import TicktableServer
from tests.frames import assert_frame_same

TZ = "Europe/Paris"
SCHEMA = pa.schema([
    ("id", pa.int64()), ("i", pa.int64()), ("b", pa.bool_()), ("f", pa.float64()),
    ("s", pa.string()), ("t", pa.timestamp("us", tz=TZ)), ("n", pa.timestamp("ns")),
    ("u", pa.duration("ms")), ("d", pa.date32()), ("c", pa.dictionary(pa.int32(), pa.string())),
])
VALUE_COLUMNS = SCHEMA.names[1:]
Row = dict[str, Any]


def _bits(keys: Any) -> bytes:
    return BitMap64(sorted(int(k) for k in keys)).serialize()


def _no_server() -> Any:
    raise AssertionError("a LiveTable fed by hand never connects")


def _live(**options: Any) -> LiveTable:
    """A LiveTable that a test feeds with ``apply`` (no reader thread, no server)."""
    return LiveTable(_no_server, "t", start=False, **options)


def _same(live: LiveTable, context: str) -> pd.DataFrame:
    """``live.df`` equals the held rows converted from scratch; returns it."""
    got = live.df
    assert_frame_same(got, live.to_arrow().to_pandas(), obj=context)
    return got


class _Table:
    """The server's table (row key -> row) and the messages of one subscription to it.

    Every row keeps its ``id``; shifts move keys; nulls come and go in every nullable
    column, and the integer and boolean columns go through phases with and without nulls.
    """

    def __init__(self, rng: np.random.Generator, columns: list[str] | None = None) -> None:
        self.rng = rng
        self.rows: dict[int, Row] = {}
        self.seq = self.next_id = 0
        self.p_null = 0.05
        self.schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])

    def value(self, column: str) -> Any:
        r = self.rng
        if column != "f" and r.random() < (self.p_null if column in "ib" else 0.05):
            return None
        if column == "i":
            return int(r.integers(-(2**62), 2**62)) if r.random() < 0.1 else int(r.integers(100))
        if column == "b":
            return bool(r.random() < 0.5)
        if column == "f":
            return float("nan") if r.random() < 0.03 else float(r.integers(10**6)) / 8
        if column == "s":  # empty, ASCII and not
            k = int(r.integers(0, 6))
            return "" if k == 0 else ("", "é", "éé", "日本", "🙂")[k - 1] + f"s{int(r.integers(1000))}"
        if column in "tn":
            return dt.datetime(2026, 3, 29, tzinfo=dt.UTC if column == "t" else None) + \
                dt.timedelta(microseconds=int(r.integers(-10**12, 10**12)))
        if column == "u":
            return dt.timedelta(milliseconds=int(r.integers(-10**9, 10**9)))
        if column == "d":
            return dt.date(2000, 1, 1) + dt.timedelta(days=int(r.integers(10**4)))
        return f"c{int(r.integers(12))}"

    def new_row(self) -> Row:
        row = {c: self.value(c) for c in VALUE_COLUMNS}
        row["id"], self.next_id = self.next_id, self.next_id + 1
        return row

    def data(self, keys: list[int]) -> pa.Table:
        rows = [self.rows[k] for k in keys]
        cols = {}
        for f in self.schema:
            values = [row[f.name] for row in rows]
            if pa.types.is_dictionary(f.type):
                cols[f.name] = pa.array(values, pa.string()).dictionary_encode()
            else:
                cols[f.name] = pa.array(values, f.type)
        return pa.table(cols, schema=self.schema)

    def _meta(self, **fields: Any) -> pb.UpdateMetadata:
        self.seq += 1
        return pb.UpdateMetadata(sequence=self.seq, step=self.seq, epoch="e",
                                 columns=self.schema.names, table_size=len(self.rows), **fields)

    def snapshot(self) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        keys = sorted(self.rows)
        meta = self._meta(is_snapshot=True, added_rows=_bits(keys), added_data_rows=_bits(keys))
        return meta, self.data(keys), self.data([])

    def step(self, n_remove: int, n_add: int, n_modify: int, p_shift: float,
             at_end: bool = False) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        """Remove, shift, add (at random free keys, or past the last), then modify rows
        (each message a random subset of the columns); returns the delta message."""
        r = self.rng
        before = dict(self.rows)
        keys = np.array(sorted(self.rows), dtype=np.int64)
        removed = set(r.choice(keys, min(n_remove, keys.size), replace=False).tolist())
        survivors = np.array(sorted(set(keys.tolist()) - removed), dtype=np.int64)
        begins: list[int] = []
        ends: list[int] = []
        deltas: list[int] = []
        if survivors.size and r.random() < p_shift:  # move every key from b on by d
            b, d = int(r.choice(survivors)), int(r.integers(1, 6)) * int(r.choice([-1, 1]))
            if b + d >= 0 and not np.any((survivors >= b + d) & (survivors < b)):
                begins, ends, deltas = [b], [int(keys[-1])], [d]
        prev_of = {int(k) + (deltas[0] if begins and k >= begins[0] else 0): int(k)
                   for k in survivors}
        self.rows = {k: before[p] for k, p in prev_of.items()}
        top = max(self.rows, default=0)
        if at_end:
            added = list(range(top + 1, top + 1 + n_add))
        else:
            free = np.setdiff1d(np.arange(top + 40),
                                np.fromiter(self.rows, np.int64, len(self.rows)))
            added = r.choice(free, min(n_add, free.size), replace=False).tolist()
        for k in sorted(added):
            self.rows[k] = self.new_row()
        alive = np.array(sorted(prev_of), dtype=np.int64)
        modified = sorted(r.choice(alive, min(n_modify, alive.size), replace=False).tolist())
        names = self.schema.names
        changed = [c for c in names[1:] if r.random() < 0.5] or [str(r.choice(names[1:]))]
        for k in modified:
            row = dict(self.rows[k])
            for c in changed:
                row[c] = self.value(c)
            self.rows[k] = row
        meta = self._meta(added_rows=_bits(added), removed_rows=_bits(removed),
                          added_data_rows=_bits(added), modified_data_rows=_bits(modified),
                          shifts=pb.ShiftData(begins=begins, ends=ends, deltas=deltas))
        if modified:
            meta.modified.extend(pb.ColumnModified(column=c, rows=_bits(modified))
                                 for c in changed)
        return meta, self.data(sorted(added)), self.data(modified)

    def fill_nulls(self, column: str) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
        """Modify every row whose ``column`` is null: afterwards it holds none."""
        keys = sorted(k for k, row in self.rows.items() if row[column] is None)
        for k in keys:
            row = dict(self.rows[k])
            while row[column] is None:
                row[column] = self.value(column)
            self.rows[k] = row
        meta = self._meta(modified_data_rows=_bits(keys))
        if keys:
            meta.modified.append(pb.ColumnModified(column=column, rows=_bits(keys)))
        return meta, self.data([]), self.data(keys)


def _feed(live: LiveTable, message: tuple[pb.UpdateMetadata, pa.Table, pa.Table]) -> None:
    live.apply(*message)


def _start(rows: int, seed: int = 0, columns: list[str] | None = None,
           ) -> tuple[LiveTable, _Table]:
    table = _Table(np.random.default_rng(seed), columns)
    for k in range(rows):
        table.rows[3 * k] = table.new_row()  # gaps: inserts land between rows
    live = _live()
    _feed(live, table.snapshot())
    return live, table


def _buffer(live: LiveTable, column: str) -> np.ndarray:
    """The numpy memory behind ``column``'s block (what the frame shows)."""
    j = list(live.df.columns).index(column)
    values = live.df._mgr.iget_values(j)
    if isinstance(values, pd.arrays.StringArray):  # python storage: its object ndarray
        return values._ndarray
    return values if isinstance(values, np.ndarray) else values.asi8


@pytest.fixture
def storage(request: pytest.FixtureRequest) -> Any:
    """pandas' string storage (``mode.string_storage``) for the test: ``to_pandas`` and so
    the frame hold strings as Arrow (``pyarrow``, the default) or Python objects."""
    with pd.option_context("mode.string_storage", request.param):
        yield request.param


# ------------------------------------------------------------------ examples
def test_a_splice_moves_the_kept_rows_in_runs():
    """a b c d e f: remove b and e (old positions 1, 4), insert X before a and Y before f
    (0 and 3 kept rows before them): X a c d Y f, moved in place as runs a, c d, f."""
    sp = liveframe._Splice(6, np.array([1, 4]), np.array([0, 3]))
    assert (sp.n_new, sp.first, sp.inserted.tolist()) == (6, 0, [0, 4])
    assert list(zip(sp.src.tolist(), sp.dst.tolist(), sp.length.tolist(), strict=True)) == [
        (0, 1, 1), (2, 2, 2), (5, 5, 1)]
    buf = np.array(list("abcdef") + ["-"], dtype=object)
    sp.move(buf)
    buf[sp.inserted] = ["X", "Y"]
    assert "".join(buf[:6]) == "XacdYf"
    # as pieces of (old, inserted, modified) with d (new position 3) modified to D
    source, start, at, length = sp.pieces(np.array([3]))
    parts = ["abcdef", "XY", "D"]
    assert "".join(parts[s][b:b + k] for s, b, k in zip(source, start, length, strict=True)) == "XacDYf"
    assert at.tolist() == [0, 1, 2, 3, 4, 5]


class _Tracked:
    """An object whose references and death a test can watch."""

    __slots__ = ("__weakref__", "name")

    def __init__(self, name: int) -> None:
        self.name = name


def test_a_splice_moves_an_object_buffer_by_its_pointers_with_exact_references():
    """Random splices of an object buffer (its pointers moved as by ``memmove``, see
    ``_Splice._move_references``): after each, the rows are the model's, every live object
    holds exactly the references of its slot and the model's, a removed one is freed, and
    the spare slots hold ``None``."""
    rng = np.random.default_rng(11)
    model = [_Tracked(i) for i in range(50)]
    buf = np.empty(50, dtype=object)
    buf[:] = model
    n, made, gone = 50, 50, []
    for _ in range(300):
        removed = np.sort(rng.choice(n, int(rng.integers(0, min(n, 8) + 1)), replace=False))
        kept = n - removed.size
        points = np.sort(rng.integers(0, kept + 1, int(rng.integers(0, 8))))
        sp = liveframe._Splice(n, removed.astype(np.int64), points.astype(np.int64))
        buf = liveframe._room(buf, sp.n_new)
        gone += [weakref.ref(model[i]) for i in removed.tolist()]
        survivors = [o for i, o in enumerate(model) if i not in set(removed.tolist())]
        new = [_Tracked(made + j) for j in range(points.size)]
        made += points.size
        model = survivors
        for j, p in enumerate(points.tolist()):
            model.insert(p + j, new[j])
        sp.move(buf)
        buf[sp.inserted] = np.array(new + [None], dtype=object)[:-1]
        del new, survivors
        n = sp.n_new
        assert [o.name for o in buf[:n]] == [o.name for o in model]
        assert all(x is None for x in buf[n:])
        # its slot, the model, getrefcount's argument and the comprehension's name (a loop's
        # name would outlive the loop and keep a removed object alive once the model empties)
        counts = [(o.name, sys.getrefcount(o)) for o in model]
        assert all(c == 4 for _, c in counts), counts
        assert all(r() is None for r in gone)
    refs = [weakref.ref(o) for o in model]
    del model, buf
    assert all(r() is None for r in refs)


def test_a_small_update_writes_only_its_rows_into_the_same_frame():
    live, table = _start(2000, columns=["id", "i", "f", "t", "n", "u"])
    table.p_null = 0.0
    df = _same(live, "first read")
    before = {c: _buffer(live, c).copy() for c in ("f", "t", "n", "u")}
    memory = {c: _buffer(live, c).__array_interface__["data"][0] for c in ("f", "t", "n", "u")}
    rebuilds = live._frames.rebuilds
    message = table.step(0, 0, 7, 0.0)
    _feed(live, message)
    assert live.df is df  # the same object, brought current
    assert live.df is df  # (read again with nothing new: as it was)
    _same(live, "after 7 modifies")
    assert live._frames.rebuilds == rebuilds  # not converted again
    keys = np.array(sorted(table.rows))
    written = np.searchsorted(keys, BitMap64.deserialize(message[0].modified_data_rows).to_array())
    changed = {c.column for c in message[0].modified}
    for c in ("f", "t", "n", "u"):
        now = _buffer(live, c)
        assert now.__array_interface__["data"][0] == memory[c]  # the same buffer
        differ = np.flatnonzero((now != before[c]) & ~(np.isnan(now) & np.isnan(before[c]))
                                if c == "f" else now != before[c])
        assert set(differ.tolist()) <= set(written.tolist())  # only the modified rows
        if c not in changed:
            assert differ.size == 0


def test_appends_write_into_spare_room():
    live, table = _start(3000, columns=["id", "f", "s"])
    _same(live, "first read")
    _feed(live, table.step(0, 5, 0, 0.0, at_end=True))
    _same(live, "first append (the column moves to a buffer with room)")
    memory = _buffer(live, "f").__array_interface__["data"][0]
    rebuilds = live._frames.rebuilds
    for cycle in range(20):
        _feed(live, table.step(0, 5, 2, 0.0, at_end=True))
        _same(live, f"append {cycle}")
        assert _buffer(live, "f").__array_interface__["data"][0] == memory
    assert live._frames.rebuilds == rebuilds and isinstance(live.df.index, pd.RangeIndex)
    assert live.df.s.array._pa_array.num_chunks <= LiveFrame.STRING_CHUNKS


@pytest.mark.parametrize("storage", ["python"], indirect=True)
def test_python_strings_are_written_in_place(storage):
    """With pandas' ``python`` string storage a string column is an object ndarray under a
    ``StringArray`` (``str`` dtype, NaN for a null), as ``to_pandas`` gives: a modify writes
    its rows into the same buffer, an append lands in spare room."""
    live, table = _start(2000, columns=["id", "s", "f"])
    df = _same(live, "first read")
    assert df["s"].dtype == pd.StringDtype("python", na_value=np.nan)
    before = _buffer(live, "s").copy()
    memory = _buffer(live, "s").__array_interface__["data"][0]
    rebuilds = live._frames.rebuilds
    message = table.step(0, 0, 7, 0.0)
    while "s" not in {c.column for c in message[0].modified}:
        _feed(live, message)
        message = table.step(0, 0, 7, 0.0)
    _feed(live, message)
    assert _same(live, "after 7 modifies") is df and live._frames.rebuilds == rebuilds
    now = _buffer(live, "s")
    assert now.__array_interface__["data"][0] == memory  # the same buffer, written in place
    keys = np.array(sorted(table.rows))
    written = np.searchsorted(keys, BitMap64.deserialize(message[0].modified_data_rows).to_array())
    differ = np.flatnonzero(~pd.isna(now) & (now != before) | (pd.isna(now) != pd.isna(before)))
    assert set(differ.tolist()) <= set(written.tolist())
    _feed(live, table.step(0, 5, 0, 0.0, at_end=True))
    _same(live, "first append (the column moves to a buffer with room)")
    memory = _buffer(live, "s").__array_interface__["data"][0]
    for cycle in range(10):
        _feed(live, table.step(0, 5, 2, 0.0, at_end=True))
        _same(live, f"append {cycle}")
        assert _buffer(live, "s").__array_interface__["data"][0] == memory
    for cycle in range(10):  # removes and inserts in the middle: moved in place
        _feed(live, table.step(3, 3, 4, 0.3))
        _same(live, f"splice {cycle}")
    assert live._frames.rebuilds == rebuilds


def test_the_string_storage_is_the_one_at_the_last_build():
    """pandas' option is read when the frame is (re)built: changed later, it takes effect at
    the next rebuild (a snapshot here); until then the frame keeps its storage."""
    live, table = _start(100, columns=["id", "s"])
    df = _same(live, "first read")
    assert df["s"].dtype.storage == "pyarrow"
    with pd.option_context("mode.string_storage", "python"):
        _feed(live, table.step(1, 1, 3, 0.0))
        assert live.df is df and df["s"].dtype.storage == "pyarrow"
        _feed(live, table.snapshot())
        assert _same(live, "rebuilt") is df and df["s"].dtype.storage == "python"
        _feed(live, table.step(1, 1, 3, 0.0))
        assert _same(live, "in place") is df and live._frames.rebuilds == 2
    _feed(live, table.step(1, 1, 3, 0.0))
    assert live.df is df and df["s"].dtype.storage == "python"


@pytest.mark.parametrize("storage", ["pyarrow", "python"], indirect=True)
def test_what_was_derived_from_the_frame_keeps_its_values(storage):
    """pandas' Copy-on-Write: a column, a slice, a shallow copy taken before a read keep the
    values of their moment; the frame itself is current (and still the same object)."""
    live, table = _start(500, columns=["id", "i", "f", "s", "t", "n"])
    df = _same(live, "first read")
    column, head, shallow, copy = df["f"], df.iloc[:300], df.copy(deep=False), df.copy()
    strings, times, naive = df["s"], df["t"], df["n"]
    kept = [x.copy() for x in (column, head, shallow, strings, times, naive)]
    for cycle in range(3):  # modifies only, then a change of length
        _feed(live, table.step(0, 0, 40, 0.0) if cycle < 2 else table.step(5, 5, 40, 0.3))
        assert _same(live, f"cycle {cycle}") is df
        pd.testing.assert_series_equal(column, kept[0])
        pd.testing.assert_frame_equal(head, kept[1])
        pd.testing.assert_frame_equal(shallow, kept[2])
        pd.testing.assert_series_equal(strings, kept[3])
        pd.testing.assert_series_equal(times, kept[4])
        pd.testing.assert_series_equal(naive, kept[5])
    assert not copy.equals(df)


def test_integer_and_boolean_columns_follow_their_nulls():
    """``to_pandas`` makes an integer column float64 (a boolean one object) while it holds a
    null: the frame's dtype changes with the first null and back with the last."""
    live, table = _start(300, columns=["id", "i", "b", "f"])
    table.p_null = 0.0
    for c in ("i", "b"):
        _feed(live, table.fill_nulls(c))
    assert [str(x) for x in _same(live, "no nulls").dtypes] == ["int64", "int64", "bool", "float64"]
    table.p_null = 0.5
    _feed(live, table.step(0, 0, 20, 0.0))
    while not all(any(r[c] is None for r in table.rows.values()) for c in ("i", "b")):
        _feed(live, table.step(0, 0, 20, 0.0))
    assert [str(x) for x in _same(live, "nulls").dtypes] == ["int64", "float64", "object", "float64"]
    table.p_null = 0.0
    _feed(live, table.step(3, 3, 10, 0.0))  # nulls counted through a change of length
    _same(live, "still nulls")
    for c in ("i", "b"):
        _feed(live, table.fill_nulls(c))
    assert [str(x) for x in _same(live, "none left").dtypes] == ["int64", "int64", "bool", "float64"]


def test_categorical_and_date_columns():
    live, table = _start(200, columns=["id", "c", "d", "s"])
    df = _same(live, "first read")
    assert [str(x) for x in df.dtypes] == ["int64", "category", "object", "str"]
    for cycle in range(10):  # changes of length, then modifies only
        _feed(live, table.step(2, 3, 5, 0.3) if cycle < 5 else table.step(0, 0, 5, 0.0))
        assert _same(live, f"cycle {cycle}") is df


def test_a_categorical_follows_its_categories_when_other_columns_change():
    """``to_pandas`` takes a categorical's categories from the dictionaries of the Arrow
    chunks its rows are in: a modify of another column (or the value log's compaction)
    moves rows to new chunks, so the categories change though the values do not."""
    live, table = _start(100, columns=["id", "c", "f"])
    df = _same(live, "first read")
    for cycle in range(100):
        _feed(live, table.step(0, 0, 30, 0.0))
        assert _same(live, f"cycle {cycle}") is df


def test_a_frame_changed_by_its_user_is_rebuilt():
    live, table = _start(100, columns=["id", "f", "s"])
    df = _same(live, "first read")
    df["extra"] = 1.0  # (read-only by contract: the next read puts the view back)
    _feed(live, table.step(0, 0, 3, 0.0))
    assert _same(live, "after a user's column") is df and "extra" not in df.columns
    df.pop("s")
    _feed(live, table.step(1, 1, 3, 0.0))
    assert _same(live, "after a user's pop") is df


def test_a_viewport_rebuilds_the_same_frame():
    live, table = _start(50, columns=["id", "f"])
    meta, added, modified = table.snapshot()
    keys = sorted(table.rows)
    meta.has_viewport = True
    meta.viewport.append(pb.PositionRange(begin=5, end=9))
    meta.added_data_rows = _bits(keys[5:9])
    df = live.df
    live.apply(meta, table.data(keys[5:9]), modified)
    assert live.df is df and live.df.index.tolist() == [5, 6, 7, 8]
    assert live.df.index.name == "position"
    pd.testing.assert_frame_equal(live.df.reset_index(drop=True), live.to_arrow().to_pandas())


def test_a_read_rebuilds_when_a_message_arrives_while_it_converts_a_column(monkeypatch):
    """A categorical column is converted again from the held rows: if the reader applied a
    message meanwhile, the rows are no longer those the read started from, so it rebuilds
    (at the newer message) instead."""
    live, table = _start(100, columns=["id", "c"])
    df = _same(live, "first read")
    fetch = LiveTable._held_columns

    def late(self: LiveTable, columns: list[str]) -> pa.Table | None:
        _feed(self, table.step(1, 1, 2, 0.0))  # (as the reader thread would, meanwhile)
        return fetch(self, columns)

    monkeypatch.setattr(LiveTable, "_held_columns", late)
    rebuilds = live._frames.rebuilds
    _feed(live, table.step(0, 0, 5, 0.0))
    assert _same(live, "after the late message") is df
    assert live._frames.rebuilds == rebuilds + 1 and live.sequence == table.seq


def test_many_moves_rebuild(monkeypatch):
    """Removes and inserts in the middle move the rows after them; past ``MOVE_FACTOR``
    tables' worth of moved rows since the last read, a rebuild costs less."""
    monkeypatch.setattr(LiveFrame, "MOVE_MIN", 1)
    monkeypatch.setattr(LiveFrame, "MOVE_FACTOR", 2)
    live, table = _start(100, columns=["id", "f"])
    df = _same(live, "first read")
    rebuilds = live._frames.rebuilds
    for _ in range(5):  # each moves about half the rows
        _feed(live, table.step(1, 1, 0, 0.0))
    assert _same(live, "after 5 inserts and removes") is df
    assert live._frames.rebuilds == rebuilds + 1


def test_reads_on_another_thread_see_one_message_at_a_time():
    """A thread applies 200 messages (as the reader does) while another reads ``df`` in a
    loop: every frame it reads is the rows of one message, never part of one."""
    live, table = _start(150, seed=4, columns=["id", "i", "f", "s", "t"])
    rng = np.random.default_rng(4)
    messages = [table.step(int(rng.integers(0, 4)), int(rng.integers(0, 4)),
                           int(rng.integers(0, 9)), 0.3) for _ in range(200)]
    seen: set[int] = set()

    def digest(frame: pd.DataFrame) -> int:
        return int(pd.util.hash_pandas_object(frame, index=True).sum())

    states = {digest(live.to_arrow().to_pandas())}
    done = threading.Event()

    def reader() -> None:
        for m in messages:
            live.apply(*m)
            states.add(digest(live.to_arrow().to_pandas()))
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    while not done.is_set():
        seen.add(digest(live.df))
    thread.join()
    assert len(seen) > 3 and seen <= states
    _same(live, "at the end")


def test_without_the_pandas_internals_every_change_rebuilds(monkeypatch):
    monkeypatch.setattr(liveframe, "_WORKS", False)  # (as with another pandas)
    live, table = _start(50, columns=["id", "f", "s"])
    df = _same(live, "first read")
    for cycle in range(3):
        _feed(live, table.step(1, 1, 2, 0.0))
        assert _same(live, f"cycle {cycle}") is df
    assert live._frames.rebuilds == 4


def test_a_wide_table_is_rebuilt_so_that_pandas_does_not_warn(monkeypatch):
    """A frame kept in place has a block per column: pandas warns when a column is added to
    one of more than 100 (``assign`` does), so a wider table is rebuilt on each change."""
    monkeypatch.setattr(LiveFrame, "MAX_BLOCKS", 3)
    live, table = _start(50, columns=["id", "i", "f", "n"])  # 4 numpy columns
    df = _same(live, "first read")
    _feed(live, table.step(1, 1, 2, 0.0))
    assert _same(live, "rebuilt") is df and live._frames.rebuilds == 2
    df.assign(x=1.0)  # (pandas' warning would fail here: filterwarnings = error)


def test_a_frame_that_lost_its_row_keys_rebuilds(caplog):
    live, table = _start(50, columns=["id", "f"])
    df = _same(live, "first read")
    live._frames._keys.buf[10] += 1  # (a bug would do this)
    _feed(live, table.step(0, 0, 50, 0.0))
    assert _same(live, "rebuilt") is df
    assert "lost track of its row keys" in caplog.text


# ------------------------------------------------------------------ the property
def _random_message(rng: np.random.Generator, table: _Table,
                    ) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table]:
    """One random message: now and then a snapshot, a fill of an int/bool column's nulls,
    an empty message (changing how often nulls come); else removes, inserts (anywhere or at
    the end), modifies of some columns and shifts, now and then a large change."""
    roll = rng.random()
    if roll < 0.01:
        return table.snapshot()
    if roll < 0.04:
        return table.fill_nulls(str(rng.choice(["i", "b"])))
    if roll < 0.06:
        table.p_null = float(rng.choice([0.0, 0.02, 0.3]))
        return table.step(0, 0, 0, 0.0)  # empty
    big = rng.random() < 0.03
    return table.step(int(rng.integers(0, 30 if big else 6)),
                      int(rng.integers(0, 30 if big else 6)),
                      int(rng.integers(0, 30 if big else 12)), 0.3,
                      at_end=rng.random() < 0.3)


@pytest.mark.parametrize(("seed", "gather", "storage"), [
    (1, False, "pyarrow"), (2, True, "pyarrow"), (3, False, "pyarrow"),
    (4, False, "python"), (5, False, "python")], indirect=["storage"])
def test_random_messages_read_at_random(monkeypatch, seed, gather, storage):
    """Random messages (removes, inserts, appends, modifies of some columns, shifts, nulls,
    empty messages, now and then a snapshot or a large change that rebuilds); ``live.df``
    read after 0 to 6 of them equals ``to_arrow().to_pandas()``, always the same object,
    and most reads are applied in place. Lowered limits: string columns combine often, a
    rebuild needs changes of more than 100 rows; a string column's change is a gather
    (``gather``) or spliced slices (Arrow strings), or written in place (``python``
    strings, an object ndarray)."""
    monkeypatch.setattr(LiveFrame, "REBUILD_MIN", 100)
    monkeypatch.setattr(LiveFrame, "STRING_CHUNKS", 12)
    monkeypatch.setattr(liveframe._StringColumn, "GATHER_RATIO", 10**9 if gather else 0)
    rng = np.random.default_rng(seed)
    live, table = _start(int(rng.integers(60, 200)), seed=seed)
    df = _same(live, f"seed {seed} first read")
    assert df["s"].dtype.storage == storage
    reads = messages = 0
    due = int(rng.integers(0, 7))
    while messages < 600:
        _feed(live, _random_message(rng, table))
        messages += 1
        if due == 0:
            assert _same(live, f"seed {seed} message {messages}") is df
            reads += 1
            due = int(rng.integers(0, 7))
        else:
            due -= 1
    assert reads > 130
    assert live._frames.rebuilds < reads / 4  # mostly in place


@pytest.mark.parametrize(("seed", "storage"), [(6, "python"), (7, "python")],
                         indirect=["storage"])
def test_python_strings_read_after_every_message(monkeypatch, seed, storage):
    """pandas' ``python`` string storage, ``live.df`` read after each of 1,500 random
    messages (as above): equal to ``to_arrow().to_pandas()`` every time, mostly in place."""
    monkeypatch.setattr(LiveFrame, "REBUILD_MIN", 100)
    rng = np.random.default_rng(seed)
    live, table = _start(int(rng.integers(60, 200)), seed=seed)
    df = _same(live, f"seed {seed} first read")
    assert df["s"].dtype == pd.StringDtype("python", na_value=np.nan)
    for message in range(1500):
        _feed(live, _random_message(rng, table))
        assert _same(live, f"seed {seed} message {message}") is df
    assert live._frames.rebuilds < 1500 / 20  # mostly in place


# ------------------------------------------------------------------ through a server
E2E = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64()),
                 ("n", pa.int64()), ("t", pa.timestamp("us", tz=TZ)), ("b", pa.bool_())])


def _rows(rng: np.random.Generator, keys: np.ndarray) -> pa.Table:
    n = keys.size
    null = rng.random(n) < 0.1
    return pa.table({
        "k": pa.array(keys, pa.int64()),
        "s": pa.array([f"s{int(x)}" for x in rng.integers(0, 50, n)], pa.string(),
                      mask=rng.random(n) < 0.05),
        "v": pa.array(rng.integers(0, 400, n) / 4.0),
        "n": pa.array(rng.integers(-9, 9, n), pa.int64(), mask=null),
        "t": pa.array(rng.integers(0, 10**15, n), pa.timestamp("us", tz=TZ)),
        "b": pa.array(rng.random(n) < 0.5, pa.bool_(), mask=rng.random(n) < 0.03),
    }, schema=E2E)


@pytest.mark.parametrize(("seed", "storage"), [(5, "pyarrow"), (8, "python")],
                         indirect=["storage"])
def test_through_a_server(server: TicktableServer, graph: UpdateGraph, subscribe, seed, storage):
    """A keyed table and the same sorted by ``v`` (inserts and removes anywhere, shifts),
    written at random for 120 cycles: both views, read after a random number of cycles,
    equal the server's rows converted from scratch, in the same frame, mostly in place."""
    rng = np.random.default_rng(seed)
    src = server.registry.create_source("src", E2E, "keyed", keys=["k"]).table
    src.upsert(_rows(rng, np.arange(300)))
    graph.run_cycle()
    board = src.sort("v")
    server.registry.add("board", board, "derived", parents=["src"])
    views = [(subscribe("src"), src), (subscribe("board", max_batch_rows=50), board)]
    frames = [live.df for live, _ in views]
    next_key, reads = 300, 0
    for cycle in range(120):
        keys = src.to_arrow().column("k").to_numpy()
        if keys.size:
            src.upsert(_rows(rng, rng.choice(keys, min(keys.size, int(rng.integers(0, 15))),
                                             replace=False)))
            src.delete(pa.table({"k": rng.choice(keys, int(rng.integers(0, 4)))}))
        src.upsert(_rows(rng, np.arange(next_key, next_key + int(rng.integers(0, 5)))))
        next_key += 5
        graph.run_cycle()
        if rng.random() < 0.4:
            reads += 1
            for (live, table), frame in zip(views, frames, strict=True):
                publisher = server.registry.get("src" if table is src else "board").publisher
                assert publisher is not None and live.wait_for(sequence=publisher.sequence)
                assert live.df is frame
                assert_frame_same(frame, live.to_arrow().to_pandas())
                assert_frame_same(frame, table.to_arrow().to_pandas(),
                                  obj=f"seed {seed} cycle {cycle} {live.table}")
    assert reads > 30
    for live, _ in views:
        assert live._frames.rebuilds <= 3, live
