"""The pandas DataFrame of a live subscription, kept current in place (issue #39 item 6).

:class:`LiveFrame` keeps the one DataFrame that :attr:`LiveTable.df
<clients.live.LiveTable.df>` returns equal to ``to_arrow().to_pandas()`` (same values,
dtypes, columns, ``RangeIndex``), and brings it current when it is read: it applies the
changes of the messages applied since the last read, in order, each as an
:class:`~clients.livestate.OrderedChange`, by position. Reading it after a small update
costs the update, not the table. It is rebuilt from Arrow (``to_pandas``) instead when more
than :attr:`LiveFrame.REBUILD_FRACTION` of the table changed since the last read (or its
removes and inserts would move more than :attr:`LiveFrame.MOVE_FACTOR` tables' worth of
rows), after a snapshot (the first one, a resume by snapshot, a column change), with a
viewport (its rows and their positions follow the viewport: it is small), or when its
columns cannot be kept (duplicate names, more than :attr:`LiveFrame.MAX_BLOCKS` numpy
columns, a pandas without the internals below).

How, per change (positions are ranks of the row keys, kept beside the frame in a sorted
array: a position is a ``searchsorted``):

* removed and inserted rows move the rows after them: the kept rows are moved as runs, in
  place (numpy moves overlapping slices as ``memmove`` does; an object column's pointers
  are moved so too, with its references kept exact: :meth:`_Splice._move_references`),
  into spare room at the end of each column's buffer (:func:`engine._kernels.grow.grown`:
  an append writes past the end, growing a large column inside reserved address space
  without a copy);
* modified rows are written in their modified columns;
* each column's kind says how (:class:`_NumpyColumn`: numpy dtypes, ``datetime64`` with or
  without a time zone, ``timedelta64``, and pandas' ``str`` dtype of ``python`` storage
  (what ``to_pandas`` gives under ``pd.options.mode.string_storage = "python"``: an object
  ndarray under a ``StringArray``, written in place like the others);
  :class:`_StringColumn`: pandas' ``str`` dtype of ``pyarrow`` storage (the default),
  whose Arrow arrays are immutable, so a change splices zero-copy slices and the column is
  combined into one chunk once it has :attr:`LiveFrame.STRING_CHUNKS` (until then a take
  of rows from it joins its chunks first, as Arrow does for any chunked column); anything
  else, such as a categorical, is converted again from Arrow after any message (a
  categorical's categories are the dictionaries of the Arrow chunks its rows are in, and
  any message can move rows between chunks of the client's value log);
* an integer or boolean column turns ``float64`` or ``object`` while it holds a null (as
  ``to_pandas`` does): its nulls are counted, and it is converted again from Arrow when
  its first null arrives or its last one goes.

Copy-on-Write. pandas 3 promises that what is derived from a frame (a column, a slice, a
shallow copy) behaves as a copy. A column's buffer is written in place only while pandas'
own reference tracking (``Block.refs``, what pandas' Copy-on-Write consults) says that no
such object shares it; otherwise the column is copied first, as pandas would. (A NumPy
array from ``to_numpy()`` views the buffer and follows it, as it does when pandas writes a
frame in place.) The frame itself is the one object that changes: each of its columns is
a block of its own over this module's buffer, and a change of length swaps new blocks
into the same ``DataFrame`` (as pandas' own ``inplace=True`` methods do).

pandas internals, all in the last section of this module and checked once by
:func:`_internals_work` (without them every read rebuilds, as before):
``DataFrame._mgr`` and ``_update_inplace``; the block manager's ``blocks``, ``blknos`` and
``iget_values``; ``Block.refs.has_reference()``; a ``StringArray``'s ``_ndarray`` and
``_simple_new``. Frames are built with
``pandas.api.internals.create_dataframe_from_blocks``, a column replaced with the public
``DataFrame.isetitem``.

Threads. :meth:`LiveFrame.note` runs on the reader thread under the state lock (it only
appends); :meth:`LiveFrame.pending` and :meth:`LiveFrame.rebuilding` under the state lock;
everything that touches the frame (:meth:`LiveFrame.catch_up`, :meth:`LiveFrame.install`)
under the caller's frame lock, outside the state lock, so the reader keeps applying.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from clients.livestate import OrderedChange

# engine._kernels is shared with clients by design (DESIGN.md §1)
from engine._kernels.arrays import expand
from engine._kernels.grow import grown
from flight.streams.decoder import apply_shifts

__all__ = ["LiveFrame"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]
_EMPTY: I64 = np.empty(0, dtype=np.int64)
Fetch = Callable[[list[str]], pa.Table | None]


# ------------------------------------------------------------------ the frame
class LiveFrame:
    """One DataFrame equal to the held rows' ``to_pandas()``, brought current in place when
    read (see the module docstring).

    The frame object never changes once built (:attr:`frame`): a rebuild swaps the new
    contents into it. Its caller serializes the reads (a frame lock) and holds the state
    lock for :meth:`note`, :meth:`pending`, :meth:`rebuilding` and :meth:`moved_on`.
    """

    REBUILD_FRACTION = 0.25
    """Changed rows (removed + added + modified) since the last read, as a share of the
    table, beyond which the next read rebuilds from Arrow instead."""
    REBUILD_MIN = 1024
    """Changed rows since the last read that are always applied in place, however small the
    table."""
    MOVE_FACTOR = 16
    """Rows moved by removes and inserts since the last read, in tables' sizes (of at least
    :attr:`MOVE_MIN` rows), beyond which the read rebuilds instead: a row moved in place is
    a ``memmove`` of it, tens of times cheaper than converting it with ``to_pandas``."""
    MOVE_MIN = 65_536
    STRING_CHUNKS = 256
    """A string column of more Arrow chunks than this is combined into one (a change splices
    slices in: one or two chunks per run of changed rows)."""
    MAX_BLOCKS = 100
    """A frame kept in place holds a block per column; past this many numpy ones pandas
    warns that it is "highly fragmented" when a column is added to it or to a shallow copy
    (``assign``), so a wider table is rebuilt on each change instead, as before."""

    def __init__(self) -> None:
        self.frame: pd.DataFrame | None = None
        self.rebuilds = 0  # full builds from Arrow (tests and benchmarks read it)
        self._pending: list[OrderedChange] = []
        self._pending_rows = 0
        self._stale = True  # the next read rebuilds
        self._tracking = False  # a build happened or is under way: notes are kept
        self._columns: list[_Column] | None = None  # None: every change rebuilds
        self._names: pd.Index | None = None  # the columns Index to_pandas built
        self._keys = _Keys(_EMPTY)
        self._mgr: Any = None  # the frame's block manager and blocks as last installed
        self._blocks: Any = None

    # -------------------------------------------------------------- under the state lock
    def note(self, update_change: OrderedChange | None, size: int) -> None:
        """Remember one applied message (``None``: it cannot be applied in place, such as a
        snapshot); ``size`` is the table's size after it."""
        if not self._tracking or self._stale:
            return
        if update_change is None:
            self.reset()
            return
        self._pending.append(update_change)
        self._pending_rows += update_change.rows
        if self._pending_rows > max(self.REBUILD_MIN, size * self.REBUILD_FRACTION):
            self.reset()

    def reset(self) -> None:
        """The state started over (or changed too much): the next read rebuilds."""
        self._stale = True
        self._pending, self._pending_rows = [], 0

    def pending(self) -> list[OrderedChange] | None:
        """The changes to apply for a read (handed over: :meth:`note` starts a new list),
        ``[]`` when :attr:`frame` is current, ``None`` when the read must rebuild."""
        if self.frame is None or self._stale:
            return None
        out, self._pending, self._pending_rows = self._pending, [], 0
        return out

    def moved_on(self) -> bool:
        """Whether a message was applied since the last :meth:`pending` or
        :meth:`rebuilding` (the state is no longer where the read started)."""
        return self._stale or bool(self._pending)

    def rebuilding(self) -> None:
        """A rebuild takes the held rows now: later messages are noted relative to them."""
        self._tracking, self._stale = True, False
        self._pending, self._pending_rows = [], 0

    # -------------------------------------------------------------- under the frame lock
    def install(self, built: pd.DataFrame, keys: I64, schema: pa.Schema,
                positions: I64 | None) -> pd.DataFrame:
        """Make :attr:`frame` the rows ``built`` (``to_pandas()`` of the held rows, whose
        row keys are ``keys``, ascending); ``positions``: the viewport's, else ``None``."""
        self.rebuilds += 1
        if positions is not None:
            built.index = pd.Index(positions, name="position")
        columns = None if positions is not None else _columns_of(built, schema)
        if columns is None:  # kept by rebuilding
            self._columns = None
            if self.frame is None:
                self.frame = built
            else:
                _replace(self.frame, built)
            return self.frame
        for c in columns:
            c.owned = True  # nothing but ``built`` (ours, gone after this) holds them
        self._columns, self._names = columns, built.columns
        self._keys = _Keys(np.array(keys, dtype=np.int64))
        self._install(shape=True)
        assert self.frame is not None
        return self.frame

    def catch_up(self, changes: Sequence[OrderedChange], fetch: Fetch) -> bool:
        """Apply ``changes`` (from :meth:`pending`) to :attr:`frame` in place; ``fetch``
        returns columns of the held rows as they are after them (``None``: the state moved
        on), for columns that must be converted again. False: rebuild instead (the frame
        may be half changed; a rebuild replaces all of it)."""
        if not changes:
            return True
        columns = self._columns
        if columns is None or self.frame is None or not self._still_ours():
            return False
        n = self._keys.n
        budget = self.MOVE_FACTOR * max(n, self.MOVE_MIN)
        shape = any(ch.removed.size or ch.added.size for ch in changes)
        for j, col in enumerate(columns):  # does a pandas object share a buffer?
            col.owned = not _referenced(_block_of(self._mgr, j))
        for ch in changes:
            plan = self._keys.apply(ch)
            if plan is None:
                log.warning("a LiveTable's frame lost track of its row keys (a bug): rebuilding")
                return False
            sp, mp = plan
            budget -= sp.n_new - sp.first if sp.moves else 0
            if budget < 0:
                log.debug("%d changes move too many rows: rebuilding", len(changes))
                return False
            self._apply(columns, ch, sp, mp)
        redo = [j for j, c in enumerate(columns) if c.needs_convert()]
        if redo:  # converted again from Arrow, as the rows are now
            table = fetch([columns[j].name for j in redo])
            if table is None:
                return False
            mgr = _manager(table.to_pandas())
            for i, j in enumerate(redo):
                field = table.schema.field(i)
                col = _column_of(field.name, _values_of(mgr, i), field, table.column(i).null_count)
                col.owned = col.replaced = True
                columns[j] = col
        for c in columns:
            c.tidy()
        self._install(shape=shape)
        return True

    # -------------------------------------------------------------- helpers
    def _still_ours(self) -> bool:
        """Whether the frame holds the blocks installed last (nothing else replaced them)."""
        return _manager(self.frame) is self._mgr and self._mgr.blocks is self._blocks

    def _apply(self, columns: list[_Column], ch: OrderedChange, sp: _Splice, mp: I64) -> None:
        """One change, every column (the keys are already applied)."""
        added = ch.added_rows() if ch.added.size else None
        modified = ch.modified_rows() if ch.modified.size else None
        touched = set(ch.modified_columns) if modified is not None else set()
        need_added = [c.name for c in columns if c.wants_pandas()] if added is not None else []
        need_mod = ([c.name for c in columns if c.wants_pandas() and c.name in touched]
                    if modified is not None else [])
        added_pd = _convert(added, need_added)
        mod_pd = _convert(modified, need_mod)
        for c in columns:
            new = None if added is None else _Part(added.column(c.name), added_pd.get(c.name))
            mod = (None if modified is None or c.name not in touched
                   else _Part(modified.column(c.name), mod_pd.get(c.name)))
            c.change(sp, new, mp, mod)

    def _install(self, *, shape: bool) -> None:
        """Give the frame the columns' current values: new blocks for all of them when the
        length changed (or on the first build), else only for the columns replaced."""
        columns, n = self._columns, int(self._keys.n)
        assert columns is not None and self._names is not None
        if shape or self.frame is None:
            # each buffer gets a new block, which would hide from pandas any object sharing
            # it: none does (every numpy column was just spliced, converted or installed)
            assert all(c.owned for c in columns if isinstance(c, _NumpyColumn))
            blocks = [(c.block(n), np.array([j], dtype=np.intp)) for j, c in enumerate(columns)]
            built = _internals().create_dataframe_from_blocks(blocks, pd.RangeIndex(n),
                                                              self._names)
            if self.frame is None:
                self.frame = built
            else:
                _replace(self.frame, built)
            for c in columns:
                c.replaced = False
        else:
            assert self.frame is not None
            for j, c in enumerate(columns):
                if c.replaced:
                    self.frame.isetitem(j, c.block(n, one_d=True))
                    c.adopt(_values_of(_manager(self.frame), j))
        self._mgr = _manager(self.frame)
        self._blocks = self._mgr.blocks


# ------------------------------------------------------------------ row keys and positions
class _Splice:
    """How one change moves the rows, by position: ``n`` rows become ``n_new``.

    The rows at old positions ``removed`` go; a new row goes where ``points`` says (the
    number of kept rows before it; ascending, repeats allowed), landing at ``inserted``.
    The kept rows keep their order, as runs of consecutive rows: run ``i`` moves
    ``length[i]`` rows from ``src[i]`` to ``dst[i]``. Rows before ``first`` do not move.
    """

    __slots__ = ("n", "n_new", "removed", "inserted", "src", "dst", "length", "first", "moves")

    def __init__(self, n: int, removed: I64, points: I64) -> None:
        kept = n - removed.size
        before = removed - np.arange(removed.size)  # kept rows before each removed row
        starts = np.unique(np.concatenate(([0], before, points)))
        starts = starts[starts < kept]
        self.n, self.n_new, self.removed = n, kept + points.size, removed
        self.inserted: I64 = points + np.arange(points.size)
        self.length: I64 = np.diff(np.append(starts, kept))
        self.src: I64 = starts + np.searchsorted(before, starts, side="right")
        self.dst: I64 = starts + np.searchsorted(points, starts, side="right")
        self.moves = bool(removed.size or points.size)
        self.first = min(int(removed[0]) if removed.size else n,
                         int(self.inserted[0]) if points.size else n)

    def move(self, buf: npt.NDArray[Any]) -> None:
        """Move the kept rows within ``buf`` (it holds ``max(n, n_new)`` rows): runs going
        left in order, then runs going right from the last, so none overwrites a run
        before it moved. An object buffer's pointers are moved instead
        (:meth:`_move_references`); its other slots are then ``None``."""
        if buf.dtype == object and _POINTERS:
            self._move_references(buf)
            return
        left = self.dst < self.src
        for s, d, k in zip(self.src[left].tolist(), self.dst[left].tolist(),
                           self.length[left].tolist(), strict=True):
            buf[d:d + k] = buf[s:s + k]
        right = self.dst > self.src
        for s, d, k in zip(self.src[right].tolist()[::-1], self.dst[right].tolist()[::-1],
                           self.length[right].tolist()[::-1], strict=True):
            buf[d:d + k] = buf[s:s + k]

    def _move_references(self, buf: npt.NDArray[np.object_]) -> None:
        """:meth:`move` for an object buffer (C-contiguous), as a ``memmove`` of its
        pointers: numpy's own move takes a reference to each moved object and drops one (at
        10M rows about ten times a ``memmove``, each object's count being touched).

        References stay exact: each object is held by as many slots as it has references
        from them. The removed rows' slots and the spare ones in ``[n, n_new)`` are first
        set to ``None`` through numpy (their objects' references dropped, ``None``'s
        taken); then the range ``[first, max(n, n_new))`` is rewritten in one numpy call:
        each kept row's pointer to its new slot, ``None`` to every other slot of the range
        (the inserted rows', those past ``n_new``), as many as the ``None`` slots it held
        (the removed and the spare). One call: no signal handler (a KeyboardInterrupt) runs
        halfway, and a thread reading the buffer meanwhile only ever meets pointers to live
        objects (a kept row's object at two slots for a moment)."""
        lo, hi = self.first, max(self.n, self.n_new)
        if lo >= hi:
            return
        buf[self.removed] = None
        buf[self.n:hi] = None
        words = _pointers(buf)
        new = np.empty(hi - lo, dtype=np.intp)
        moved = self.dst >= lo  # (the runs before ``first`` stay; none straddles it)
        for s, d, k in zip(self.src[moved].tolist(), self.dst[moved].tolist(),
                           self.length[moved].tolist(), strict=True):
            new[d - lo:d - lo + k] = words[s:s + k]
        new[self.inserted - lo] = id(None)
        new[self.n_new - lo:] = id(None)
        words[lo:hi] = new

    def pieces(self, modified: I64) -> tuple[I64, I64, I64, I64]:
        """The new rows as pieces ``(source, start, at, length)`` in order: source 0 is
        the old rows, 1 the inserted rows, 2 the rows written at the new positions
        ``modified`` (ascending), which overlay the other two."""
        ins_at, ins_len, ins_from = _runs(self.inserted)
        at = np.concatenate((self.dst, ins_at))
        order = np.argsort(at, kind="stable")
        at = at[order]
        src = np.concatenate((np.zeros(self.dst.size, np.int64), np.ones(ins_at.size, np.int64)))[order]
        start = np.concatenate((self.src, ins_from))[order]
        if not modified.size:
            return src, start, at, np.diff(np.append(at, self.n_new))
        m_at, m_len, m_from = _runs(modified)
        cuts = np.unique(np.concatenate((at, m_at, m_at + m_len)))
        cuts = cuts[cuts < self.n_new]
        k = np.searchsorted(m_at, cuts, side="right") - 1
        kk = np.maximum(k, 0)
        in_mod = (k >= 0) & (cuts < m_at[kk] + m_len[kk])
        s = np.searchsorted(at, cuts, side="right") - 1
        source = np.where(in_mod, 2, src[s])
        begin = np.where(in_mod, m_from[kk] + cuts - m_at[kk], start[s] + cuts - at[s])
        return source, begin, cuts, np.diff(np.append(cuts, self.n_new))


_POINTERS = sys.implementation.name == "cpython"  # an object array holds PyObject pointers


def _pointers(buf: npt.NDArray[np.object_]) -> npt.NDArray[np.intp]:
    """The pointers of the C-contiguous object array ``buf``, as a writable ``intp`` array
    over its memory (it does not keep ``buf`` alive: the caller holds it)."""
    assert buf.flags.c_contiguous and buf.flags.writeable
    face = {"data": (buf.__array_interface__["data"][0], False), "shape": buf.shape,
            "typestr": np.dtype(np.intp).str, "version": 3}
    words: npt.NDArray[np.intp] = np.asarray(types.SimpleNamespace(__array_interface__=face))
    return words


def _runs(pos: I64) -> tuple[I64, I64, I64]:
    """Ascending positions as runs of consecutive ones: ``(first, length, index of first)``."""
    if not pos.size:
        return _EMPTY, _EMPTY, _EMPTY
    first = np.concatenate(([0], np.flatnonzero(np.diff(pos) != 1) + 1))
    return pos[first], np.diff(np.append(first, pos.size)), first


class _Keys:
    """The frame's row keys in order (ascending): a row's position is the rank of its key."""

    __slots__ = ("buf", "n")

    def __init__(self, keys: I64) -> None:
        self.buf, self.n = keys, keys.size

    def apply(self, ch: OrderedChange) -> tuple[_Splice, I64] | None:
        """Apply ``ch`` to the keys; returns how the rows move and the new positions of its
        modified rows, or ``None`` if a key is not where it must be (then rebuild)."""
        n = self.n
        rp = _find(self.buf[:n], ch.removed)  # previous key space
        if rp is None:
            return None
        sp_rm = _Splice(n, rp, _EMPTY)
        if sp_rm.moves:
            sp_rm.move(self.buf)
        n1 = sp_rm.n_new
        begins, ends, _ = ch.shifts
        if begins.size and n1:  # shifts move keys, never rows (no reordering)
            lo = int(np.searchsorted(self.buf[:n1], begins[0]))
            hi = int(np.searchsorted(self.buf[:n1], ends.max(), side="right"))
            if lo < hi:
                self.buf[lo:hi] = apply_shifts(self.buf[lo:hi], ch.shifts)
        points = np.searchsorted(self.buf[:n1], ch.added)  # current key space from here on
        sp_in = _Splice(n1, _EMPTY, points)
        if sp_in.moves:
            self.buf = _room(self.buf, sp_in.n_new)
            sp_in.move(self.buf)
            self.buf[sp_in.inserted] = ch.added
        self.n = sp_in.n_new
        mp = _find(self.buf[:self.n], ch.modified)
        if mp is None:
            return None
        return _Splice(n, rp, points), mp


def _find(keys: I64, want: I64) -> I64 | None:
    """Positions of the keys ``want`` in the sorted ``keys``, or ``None`` if one is absent."""
    if not want.size:
        return _EMPTY
    pos = np.searchsorted(keys, want)
    if int(pos[-1]) >= keys.size or not np.array_equal(keys[pos], want):
        return None
    return pos.astype(np.int64, copy=False)


def _room(buf: npt.NDArray[Any], n: int) -> npt.NDArray[Any]:
    """``buf`` with room for ``n`` rows: itself, or its rows in a larger buffer (in place
    inside a reserve, :func:`~engine._kernels.grow.grown`), with an eighth to spare."""
    if n <= buf.size:
        return buf
    want = max(n, buf.size + buf.size // 8 + 64)
    if buf.dtype == object:  # (a reserve holds no Python objects)
        out = np.empty(want, dtype=object)
        out[:buf.size] = buf
        return out
    return grown(buf, want, fill=None)


# ------------------------------------------------------------------ columns
class _Part:
    """A change's values for one column: Arrow, and as ``to_pandas`` converts them for a
    numpy column whose values Arrow's ``to_numpy`` would not give (dates, decimals, ...)."""

    __slots__ = ("arrow", "pandas")

    def __init__(self, arrow: pa.ChunkedArray, pandas: pd.Series | None) -> None:
        self.arrow, self.pandas = arrow, pandas


class _Column(Protocol):
    """One column of the frame and the values behind its block."""

    name: str
    owned: bool  # its buffer may be written in place (no pandas object shares it)
    replaced: bool  # its values are a new object: the frame needs a new block for it

    def writable(self) -> bool: ...

    def wants_pandas(self) -> bool: ...

    def change(self, sp: _Splice, added: _Part | None, mp: I64, modified: _Part | None) -> None: ...

    def needs_convert(self) -> bool: ...

    def tidy(self) -> None: ...

    def block(self, n: int, one_d: bool = False) -> Any: ...

    def adopt(self, values: Any) -> None: ...


def _columns_of(built: pd.DataFrame, schema: pa.Schema) -> list[_Column] | None:
    """The columns of a frame ``to_pandas`` built, or ``None`` if they cannot be kept in
    place (then every change rebuilds)."""
    if not _internals_work():
        return None
    index = built.index
    if (not isinstance(index, pd.RangeIndex) or index.start != 0 or index.step != 1
            or index.name is not None or list(built.columns) != list(schema.names)
            or not built.columns.is_unique):
        return None
    mgr = _manager(built)
    columns = [_column_of(f.name, _values_of(mgr, j), f, -1) for j, f in enumerate(schema)]
    if sum(isinstance(c, _NumpyColumn) for c in columns) > LiveFrame.MAX_BLOCKS:
        return None
    return columns


def _column_of(name: str, values: Any, field: pa.Field, nulls: int) -> _Column:
    """The column kind for the pandas ``values`` of ``field`` (``nulls``: its null count,
    ``-1``: count them)."""
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return _NumpyColumn(name, values, field, nulls)
    if isinstance(values, (pd.arrays.DatetimeArray, pd.arrays.TimedeltaArray)) and values.ndim == 1:
        return _NumpyColumn(name, values, field, nulls)
    if isinstance(values, pd.arrays.ArrowStringArray):
        return _StringColumn(name, values)
    if isinstance(values, pd.arrays.StringArray) and values.dtype.storage == "python":
        return _NumpyColumn(name, values, field, nulls)  # its object ndarray
    return _WholeColumn(name, values)


class _NumpyColumn:
    """Values in a numpy buffer with room to grow (``buf[:n]`` are the rows): numpy dtypes,
    ``datetime64`` (with or without a time zone) and ``timedelta64`` as their int64, and
    pandas' strings of ``python`` storage (a ``StringArray``) as its object ndarray (Python
    ``str`` and the dtype's ``na_value``), which unlike Arrow's can be written in place.

    An integer or boolean column is ``float64`` or ``object`` while it holds a null
    (``to_pandas``'s rule): ``nulls`` counts them; the first one arriving, or the last one
    going, makes it :meth:`needs_convert`.
    """

    __slots__ = ("name", "owned", "replaced", "dtype", "buf", "n", "_unit", "_strings",
                 "_direct", "nullable", "nulls", "_convert")

    def __init__(self, name: str, values: Any, field: pa.Field, nulls: int) -> None:
        self.name, self.dtype = name, values.dtype
        self._unit: np.dtype[Any] | None = None  # a datetimelike's numpy dtype
        self._strings = False  # a StringArray of python storage (its object ndarray)
        if isinstance(values, np.ndarray):
            buf = values
        elif isinstance(values, pd.arrays.StringArray):
            buf, self._strings = _backing(values), True
        else:  # its int64 (a view: the same memory)
            buf = values.asi8
            kind = "M8" if isinstance(values, pd.arrays.DatetimeArray) else "m8"
            self._unit = np.dtype(f"{kind}[{values.unit}]")
        self.buf, self.n = buf, buf.size
        self.owned = self.replaced = False
        t = field.type
        self.nullable = pa.types.is_integer(t) or pa.types.is_boolean(t)
        # Arrow's to_numpy gives what to_pandas holds for these (no pandas object needed)
        self._direct = self.nullable or self._strings or any(is_(t) for is_ in (
            pa.types.is_floating, pa.types.is_timestamp, pa.types.is_duration))
        if self.nullable and nulls < 0:
            nulls = int(pd.isna(buf).sum()) if self._holds_nulls() else 0
        self.nulls = max(nulls, 0) if self.nullable else 0
        self._convert = False

    def _holds_nulls(self) -> bool:
        """An integer or boolean column in its null-holding dtype (float64 / object)."""
        return self.nullable and self.dtype.kind in "fO"

    def writable(self) -> bool:
        """Whether the buffer itself may be written (not Arrow's memory, seen zero-copy)."""
        return bool(self.buf.flags.writeable and self.buf.flags.c_contiguous)

    def wants_pandas(self) -> bool:
        return not (self._convert or self._direct)

    def needs_convert(self) -> bool:
        return self._convert or (self._holds_nulls() and self.nulls == 0)

    def change(self, sp: _Splice, added: _Part | None, mp: I64, modified: _Part | None) -> None:
        if self._convert:
            return
        new = None if added is None else self._values(added)
        mod = None if modified is None else self._values(modified)
        if (added is not None and new is None) or (modified is not None and mod is None):
            self._convert = True  # a null arrived in an int/bool column (or a dtype differs)
            return
        if sp.moves:
            if self._holds_nulls() and sp.removed.size:
                self.nulls -= int(pd.isna(self.buf[sp.removed]).sum())
            if self.owned and self.writable():
                self.buf = _room(self.buf, sp.n_new)  # in place within a reserve
                sp.move(self.buf)
            else:  # shared (or Arrow's): the kept runs into a buffer of our own
                out = _room(np.empty(0, dtype=self.buf.dtype), sp.n_new)
                for s, d, k in zip(sp.src.tolist(), sp.dst.tolist(), sp.length.tolist(),
                                   strict=True):
                    out[d:d + k] = self.buf[s:s + k]
                self.buf, self.owned = out, True
            self.n, self.replaced = sp.n_new, True
            if new is not None and added is not None:
                self.buf[sp.inserted] = new
                if self._holds_nulls():
                    self.nulls += added.arrow.null_count
        if mod is not None and modified is not None:
            if not (self.owned and self.writable()):
                self.buf, self.owned, self.replaced = self.buf[:self.n].copy(), True, True
            if self._holds_nulls():
                self.nulls += modified.arrow.null_count - int(pd.isna(self.buf[mp]).sum())
            self.buf[mp] = mod

    def _values(self, part: _Part) -> npt.NDArray[Any] | None:
        """``part``'s values as this buffer holds them, or ``None`` if they do not fit its
        dtype (then the column is converted again)."""
        if self._direct:
            v: npt.NDArray[Any] = part.arrow.to_numpy(zero_copy_only=False)
            if self._strings:  # Python str, None for a null: the dtype's NA
                if part.arrow.null_count:
                    v[pd.isna(v)] = self.dtype.na_value
                return v if v.dtype == object else None
        else:
            assert part.pandas is not None  # (wants_pandas: LiveFrame converted it)
            v = part.pandas.to_numpy()
        if self._unit is not None:  # datetimelike: the same unit, held as int64
            return v.view(np.int64) if v.dtype == self._unit else None
        if v.dtype == self.dtype:
            return v if not self.nullable or self._holds_nulls() or not part.arrow.null_count \
                else None
        if self._holds_nulls() and v.dtype.kind in "iub":  # no null among these: cast
            return v
        return None  # the first null of an int/bool column (to_pandas changes its dtype)

    def tidy(self) -> None:
        pass

    def block(self, n: int, one_d: bool = False) -> Any:
        rows = self.buf[:n]
        if self._strings:  # (an extension block: always 1-D)
            return _wrap(self.dtype, rows)
        if self._unit is not None:
            rows = rows.view(self._unit)
            if isinstance(self.dtype, pd.DatetimeTZDtype):  # pyarrow's own way, no copy
                return pd.array(rows.view(np.int64), dtype=self.dtype, copy=False)
            return pd.array(rows, copy=False) if one_d else rows[None, :]
        return rows if one_d else rows[None, :]

    def adopt(self, values: Any) -> None:
        if self._strings:
            buf = _backing(values)
        else:
            buf = values if isinstance(values, np.ndarray) else values.asi8
        self.buf, self.n, self.owned, self.replaced = buf, buf.size, True, False


class _StringColumn:
    """pandas' ``str`` dtype: an Arrow ``large_string`` chunked array, immutable, so each
    change builds a new one from zero-copy slices of the old and the new values."""

    __slots__ = ("name", "owned", "replaced", "dtype", "data")

    GATHER_RATIO = 200  # a piece costs about as much as gathering this many rows

    def __init__(self, name: str, values: Any) -> None:
        self.name, self.dtype = name, values.dtype
        self.data: pa.ChunkedArray = values.__arrow_array__()
        self.owned = self.replaced = False

    def writable(self) -> bool:
        return True  # never written: replaced

    def wants_pandas(self) -> bool:
        return False

    def needs_convert(self) -> bool:
        return False

    def change(self, sp: _Splice, added: _Part | None, mp: I64, modified: _Part | None) -> None:
        if not sp.moves and modified is None:
            return
        source, start, _, length = sp.pieces(mp if modified is not None else _EMPTY)
        parts = [self.data, _large(added), _large(modified)]
        if source.size * self.GATHER_RATIO > sp.n_new:  # a gather costs less than the pieces
            offsets = np.array([0, len(parts[0]), len(parts[0]) + len(parts[1])])
            where = expand(offsets[source] + start, length)
            whole = pa.chunked_array([c for p in parts for c in p.chunks], type=self.data.type)
            self.data = whole.take(pa.array(where))
        else:
            chunks = []
            for s, b, k in zip(source.tolist(), start.tolist(), length.tolist(), strict=True):
                chunks.extend(parts[s].slice(b, k).chunks)
            self.data = pa.chunked_array(chunks, type=self.data.type)
        self.replaced = True

    def tidy(self) -> None:
        """Keep the chunks few: appended ones merge while the last is at least half the one
        before (as a binary counter: O(log) chunks), and past ``STRING_CHUNKS`` all of
        them into one."""
        chunks = self.data.chunks
        if len(chunks) > LiveFrame.STRING_CHUNKS:
            chunks = [self.data.combine_chunks()]
        while len(chunks) >= 2 and len(chunks[-2]) <= 2 * len(chunks[-1]):
            chunks[-2:] = [pa.concat_arrays(chunks[-2:])]
        if len(chunks) != self.data.num_chunks:
            self.data = pa.chunked_array(chunks, type=self.data.type)

    def block(self, n: int, one_d: bool = False) -> Any:
        string_array: Any = pd.arrays.ArrowStringArray  # (its stubs lack ``dtype``)
        return string_array(self.data, dtype=self.dtype)

    def adopt(self, values: Any) -> None:
        self.data, self.replaced = values.__arrow_array__(), False


def _large(part: _Part | None) -> pa.ChunkedArray:
    if part is None:
        return pa.chunked_array([], type=pa.large_string())
    return pc.cast(part.arrow, pa.large_string())


class _WholeColumn:
    """Any other column (a categorical, ...): converted again from Arrow after any message,
    even one that does not touch it (a categorical's categories are the dictionaries of the
    chunks its rows are in: a modify of another column, or the value log's compaction,
    moves rows to another chunk)."""

    __slots__ = ("name", "owned", "replaced", "values", "_convert")

    def __init__(self, name: str, values: Any) -> None:
        self.name, self.values = name, values
        self.owned = self.replaced = self._convert = False

    def writable(self) -> bool:
        return True

    def wants_pandas(self) -> bool:
        return False

    def needs_convert(self) -> bool:
        return self._convert

    def change(self, sp: _Splice, added: _Part | None, mp: I64, modified: _Part | None) -> None:
        self._convert = True

    def tidy(self) -> None:
        pass

    def block(self, n: int, one_d: bool = False) -> Any:
        return self.values

    def adopt(self, values: Any) -> None:
        self.values, self.replaced = values, False


def _convert(rows: pa.Table | None, names: list[str]) -> dict[str, pd.Series]:
    """``rows``' columns ``names`` as ``to_pandas`` converts them."""
    if rows is None or not names:
        return {}
    df = rows.select(names).to_pandas()
    return {name: df[name] for name in names}


# ------------------------------------------------------------------ pandas internals
def _manager(frame: Any) -> Any:
    return frame._mgr


def _block_of(mgr: Any, j: int) -> Any:
    return mgr.blocks[mgr.blknos[j]]


def _values_of(mgr: Any, j: int) -> Any:
    return mgr.iget_values(j)


def _referenced(block: Any) -> bool:
    """Whether another pandas object shares the block's values (pandas' Copy-on-Write test)."""
    return bool(block.refs.has_reference())


def _backing(strings: Any) -> npt.NDArray[np.object_]:
    """The object ndarray behind a ``StringArray`` (the memory its block shows)."""
    values: npt.NDArray[np.object_] = strings._ndarray
    return values


def _wrap(dtype: Any, rows: npt.NDArray[np.object_]) -> Any:
    """A ``StringArray`` of ``dtype`` over ``rows``, as pandas slices one: no copy, no
    validation (the rows are ``str`` or the dtype's ``na_value``, written by us)."""
    string_array: Any = pd.arrays.StringArray
    return string_array._simple_new(rows, dtype)


def _replace(frame: Any, other: pd.DataFrame) -> None:
    """Swap ``other``'s contents into ``frame`` (what pandas' ``inplace=True`` methods do)."""
    frame._update_inplace(other)


def _internals() -> Any:
    return importlib.import_module("pandas.api.internals")


_WORKS: bool | None = None


def _internals_work() -> bool:
    """Whether the pandas internals this module uses are there and behave (once)."""
    global _WORKS
    if _WORKS is None:
        try:
            buf = np.arange(3, dtype=np.int64)
            df = _internals().create_dataframe_from_blocks(
                [(buf[None, :], np.array([0], dtype=np.intp))], pd.RangeIndex(3), pd.Index(["a"]))
            mgr = _manager(df)
            first = not _referenced(_block_of(mgr, 0))
            view = df["a"]
            shared = _referenced(_block_of(mgr, 0))
            del view
            _replace(df, df.iloc[:2])
            strings = pd.array(["x", None], dtype=pd.StringDtype("python", na_value=np.nan))
            back = _backing(strings)
            again = _wrap(strings.dtype, back[:1])
            _WORKS = (first and shared and np.shares_memory(_values_of(mgr, 0), buf)
                      and len(df) == 2 and again.dtype == strings.dtype
                      and np.shares_memory(_backing(again), back))
        except Exception:  # another pandas: rebuild every time, as before
            log.debug("pandas internals for in-place frames not available", exc_info=True)
            _WORKS = False
    return _WORKS
