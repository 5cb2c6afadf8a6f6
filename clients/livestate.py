"""The client-side state of a live subscription: keys, values and the updates applied.

:class:`LiveState` applies one subscription message (:mod:`flight.streams.decoder` defines them) at a
cost that follows the message, not the table:

* the table's row keys as a Roaring bitmap (positions, the viewport, validation);
* the values as an append-only log of Arrow arrays per column (:class:`_Store`): an
  added or modified row is appended (zero-copy from the received batches) and its key
  pointed at the new *slot*; once dead slots outnumber the live ones, each message also
  cleans a head of the log a few times its own size (live rows copied to the tail, the
  head dropped), so compaction costs every message a share, never one the whole table;
* ``row key -> slot`` in a :class:`~engine._kernels.rowkeymap.RowKeyMap` (a dense array
  while the keys are dense, a vectorized hash map when they are sparse).

Shifts are applied with :func:`flight.streams.decoder.apply_shifts`, one ``searchsorted`` over the
range begins; the ranges become a bitmap with
:func:`~engine._kernels.arrays.bitmap_from_ranges` (no Python step per range).

:class:`Update` is what one applied message changed, with its DataFrames built lazily
(pandas, or polars through :attr:`Update.pl`, a :class:`PolarsParts`), and on request
as a :class:`KeyedChange` (:meth:`Update.by_row_key`): the same change for a table kept
by row key, such as a Perspective grid (:mod:`clients.notebook`); or as an
:class:`OrderedChange` (:meth:`Update.in_order`): for a table kept in table order, such as
the pandas frame :mod:`clients.liveframe` keeps in place.
:mod:`clients.live` runs the stream, reconnects and hands updates to users.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
from pyroaring import BitMap64

from clients.frames import to_polars

# engine._kernels is shared with clients by design (DESIGN.md §1); a public name for it needs
# flight's imports changed too, so it waits for the flight restructure
from engine._kernels.arrays import bitmap_from_ranges, bitmap_from_sorted
from engine._kernels.rowkeymap import RowKeyMap
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import apply_shifts

if TYPE_CHECKING:
    import polars as pl

__all__ = ["KeyedChange", "LiveState", "OrderedChange", "PolarsParts", "Update"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]
Ranges = list[tuple[int, int]]
_EMPTY_KEYS: I64 = np.empty(0, dtype=np.int64)
_RESUMED = {pb.RESUME_NONE: "none", pb.RESUME_DELTAS: "deltas", pb.RESUME_SNAPSHOT: "snapshot"}


class _ProtocolViolation(ProtocolError):
    """The stream does not follow the protocol (or the state lost rows): reconnect."""


# ------------------------------------------------------------------ row sets and shifts
def _bitmap(data: bytes) -> BitMap64:
    return BitMap64.deserialize(data) if data else BitMap64()


def _keys(bm: BitMap64) -> I64:
    return np.frombuffer(bm.to_array(), dtype=np.int64) if bm else _EMPTY_KEYS


def _shift_bitmap(bm: BitMap64, shifts: tuple[I64, I64, I64]) -> tuple[I64, I64]:
    """Apply ``shifts`` to ``bm`` in place; returns the keys that moved, before and after."""
    begins, ends, deltas = shifts
    if not begins.size or not bm:
        return _EMPTY_KEYS, _EMPTY_KEYS
    ranges = bitmap_from_ranges(begins, ends + 1)
    moving = bm & ranges
    if not moving:
        return _EMPTY_KEYS, _EMPTY_KEYS
    src = _keys(moving)
    dst = apply_shifts(src, shifts)
    bm.difference_update(ranges)  # every range is emptied before any key lands
    bm.update(bitmap_from_sorted(dst))
    return src, dst


def _keys_at(bm: BitMap64, viewport: Ranges) -> BitMap64:
    """The keys at the viewport's positions (ranges clipped to the table)."""
    n = len(bm)
    out = BitMap64()
    for b, e in viewport:
        b, e = min(b, n), min(e, n)
        if b < e:
            r = BitMap64()
            r.add_range(bm[b], bm[e - 1] + 1)  # select the ends, then one range intersection
            out |= bm & r
    return out


# ------------------------------------------------------------------ value storage
class _Frozen:
    """An immutable view of the value log: columns of Arrow chunks and their first slots.

    It holds its own chunks and ``base``, so the slots it covered stay readable after the
    store dropped its head (:meth:`_Store.drop_head`) or appended more.
    """

    __slots__ = ("chunks", "offsets", "sizes", "rows", "base", "schema")

    def __init__(self, schema: pa.Schema, chunks: tuple[tuple[Any, ...], ...],
                 sizes: list[int], base: int) -> None:
        self.schema, self.chunks, self.base = schema, chunks, base
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = base + np.cumsum(self.sizes) - self.sizes  # each chunk's first slot
        self.rows = int(self.sizes.sum())

    def select(self, columns: list[str]) -> _Frozen:
        """The same slots, in ``columns`` only (no copy)."""
        at = [self.schema.get_field_index(c) for c in columns]
        return _Frozen(pa.schema([self.schema.field(i) for i in at]),
                       tuple(self.chunks[i] for i in at), self.sizes.tolist(), self.base)

    def take(self, slots: I64) -> pa.Table:
        """The rows at ``slots`` (in that order) as a table.

        Runs of consecutive slots (a snapshot's rows, a batch appended together) become
        zero-copy slices of the chunks; scattered slots are gathered.
        """
        n = slots.size
        if n == 0:
            return self.schema.empty_table()
        starts = np.flatnonzero(np.diff(slots) != 1) + 1
        if starts.size < max(1, n // 32):
            cols = self._slices(slots, np.concatenate(([0], starts)))
        elif len(self.sizes) == 1 or n * 8 >= self.rows:  # Arrow concatenates: O(rows)
            idx = pa.array(slots - self.base)
            cols = [pa.chunked_array(c, type=f.type).take(idx)
                    for c, f in zip(self.chunks, self.schema, strict=True)]
        else:  # a few scattered rows: take from the chunks they live in
            cid = np.searchsorted(self.offsets, slots, side="right") - 1
            used = np.unique(cid)
            if int(self.sizes[used].sum()) <= 8 * n + 4096:
                # small chunks: join just those (one concatenation per column, O(their
                # rows)) and gather once, not one take per chunk and column
                at = np.cumsum(self.sizes[used]) - self.sizes[used]  # each one's first row
                idx = pa.array(slots - self.offsets[cid] + at[np.searchsorted(used, cid)])
                picked = used.tolist()
                cols = [pa.concat_arrays([c[i] for i in picked]).take(idx) for c in self.chunks]
                return pa.Table.from_arrays(cols, schema=self.schema)
            order = np.argsort(cid, kind="stable")
            cs = cid[order]
            cuts = np.flatnonzero(np.diff(cs)) + 1
            inverse = np.empty(n, dtype=np.int64)
            inverse[order] = np.arange(n)
            groups = [(int(cs[a]), pa.array(slots[order[a:b]] - self.offsets[cs[a]]))
                      for a, b in zip(np.concatenate(([0], cuts)).tolist(),
                                      np.concatenate((cuts, [n])).tolist(), strict=True)]
            inv = pa.array(inverse)
            cols = [pa.concat_arrays([c[g].take(local) for g, local in groups]).take(inv)
                    for c in self.chunks]
        return pa.Table.from_arrays(cols, schema=self.schema)

    def _slices(self, slots: I64, run_at: I64) -> list[Any]:
        """Columns made of slices, one per run of slots and chunk it crosses."""
        first = slots[run_at]
        last = slots[np.concatenate((run_at[1:], [slots.size])) - 1]
        c0 = np.searchsorted(self.offsets, first, side="right") - 1
        c1 = np.searchsorted(self.offsets, last, side="right") - 1
        pieces = c1 - c0 + 1
        chunk = np.repeat(c0, pieces) + (np.arange(pieces.sum()) - np.repeat(
            np.cumsum(pieces) - pieces, pieces))
        lo = np.maximum(np.repeat(first, pieces), self.offsets[chunk])
        hi = np.minimum(np.repeat(last, pieces) + 1, self.offsets[chunk] + self.sizes[chunk])
        spans = list(zip(chunk.tolist(), (lo - self.offsets[chunk]).tolist(),
                         (hi - lo).tolist(), strict=True))
        return [pa.chunked_array([c[i].slice(at, size) for i, at, size in spans], type=f.type)
                for c, f in zip(self.chunks, self.schema, strict=True)]


class _Store:
    """Log of row values by slot: one list of Arrow arrays per column, and each slot's key.

    Slots are numbered in append order and never reused; the log holds ``[base, end)``.
    :meth:`drop_head` forgets the oldest slots without renumbering the others, so slots
    held elsewhere (the key index, a :class:`_Frozen` view) keep their meaning.

    With every slot the log records the row key it was written for (:meth:`key_of`), kept
    current for the slots the key index points at (:meth:`rekey` after a shift). A slot
    ``s`` is then live exactly when ``index.lookup(key_of(s)) == s``: no key points at a
    dead slot, and slots are never reused, so a dead slot's stale key finds another slot
    or none.
    """

    _SMALL = 32_768  # tail chunks below this are merged geometrically (O(log) chunks)
    _MIN_RING = 1024

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._chunks: list[list[Any]] = [[] for _ in schema]
        self._sizes: list[int] = []
        self.base = 0  # slot of the first row held
        self.end = 0  # slot of the next row appended
        self._ring: I64 = _EMPTY_KEYS  # slot s's row key at s % ring.size: no copy to drop
        self._frozen: _Frozen | None = None

    def __len__(self) -> int:
        return self.end - self.base

    def append(self, table: pa.Table, keys: I64) -> int:
        """Append ``table``'s rows (in this store's columns), written for row ``keys``;
        returns the first slot."""
        first = self.end
        if table.num_rows == 0:
            return first
        self._record(first, keys)
        table = table.select(self.schema.names)
        for batch in table.to_batches():
            if batch.num_rows:
                for col, arr in zip(self._chunks, batch.columns, strict=True):
                    col.append(arr)
                self._sizes.append(batch.num_rows)
                self.end += batch.num_rows
        s = self._sizes
        while len(s) >= 2 and s[-1] < self._SMALL and s[-2] <= 2 * s[-1]:
            for col in self._chunks:
                col[-2:] = [pa.concat_arrays(col[-2:])]
            s[-2:] = [s[-2] + s[-1]]
        self._frozen = None
        return first

    def _record(self, first: int, keys: I64) -> None:
        """Write the keys of slots ``first, first + 1, ...``, growing the ring by half
        (amortized O(1) per slot) when the log would outgrow it."""
        need = self.end - self.base + keys.size
        if need > self._ring.size:
            self.reserve(need + need // 2)
        self._write(first, keys)

    def reserve(self, slots: int) -> None:
        """Make room for the keys of ``slots`` slots held at once (copies the held ones:
        reserve the log's bound up front and a table that does not grow never pays it)."""
        if slots > self._ring.size:
            held = self.key_of(np.arange(self.base, self.end, dtype=np.int64))
            self._ring = np.empty(max(self._MIN_RING, slots), dtype=np.int64)
            self._write(self.base, held)

    def _write(self, first: int, keys: I64) -> None:
        ring, n = self._ring, keys.size
        at = first % ring.size
        cut = min(n, ring.size - at)  # the ring wraps after ``cut`` keys
        ring[at:at + cut] = keys[:cut]
        ring[:n - cut] = keys[cut:]

    def key_of(self, slots: I64) -> I64:
        """The row key each of ``slots`` (in ``[base, end)``) was written, or last re-keyed,
        for."""
        return self._ring[slots % self._ring.size] if slots.size else _EMPTY_KEYS

    def rekey(self, slots: I64, keys: I64) -> None:
        """Live rows at ``slots`` now have row ``keys`` (a shift moved them)."""
        if slots.size:
            self._ring[slots % self._ring.size] = keys

    def drop_head(self, n: int) -> None:
        """Forget the oldest ``n`` slots: whole chunks go, the first kept one is sliced
        (zero-copy; its memory is freed with its last row)."""
        if not 0 <= n <= len(self):
            raise ValueError(f"cannot drop {n} of the {len(self)} slots held")
        self.base += n
        sizes = self._sizes
        gone = 0
        while gone < len(sizes) and n >= sizes[gone]:
            n -= sizes[gone]
            gone += 1
        if gone:
            del sizes[:gone]
            for col in self._chunks:
                del col[:gone]
        if n:
            sizes[0] -= n
            for col in self._chunks:
                col[0] = col[0].slice(n)
        self._frozen = None

    def frozen(self) -> _Frozen:
        if self._frozen is None:
            self._frozen = _Frozen(self.schema, tuple(tuple(c) for c in self._chunks),
                                   self._sizes, self.base)
        return self._frozen


# ------------------------------------------------------------------ updates
class _Rows:
    """Rows of an update, materialized on first access (slots into a frozen log)."""

    __slots__ = ("_frozen", "_slots", "count", "_table", "_df", "_pl")

    def __init__(self, frozen: _Frozen, slots: I64 | Callable[[], I64], count: int) -> None:
        self._frozen, self._slots, self.count = frozen, slots, count
        self._table: pa.Table | None = None
        self._df: pd.DataFrame | None = None
        self._pl: pl.DataFrame | None = None

    def arrow(self) -> pa.Table:
        if self._table is None:
            slots = self._slots() if callable(self._slots) else self._slots
            self._table = self._frozen.take(slots)
        return self._table

    def df(self) -> pd.DataFrame:
        if self._df is None:
            self._df = self.arrow().to_pandas()
        return self._df

    def polars(self) -> pl.DataFrame:
        if self._pl is None:
            self._pl = to_polars(self.arrow())
        return self._pl


@dataclass(frozen=True, slots=True)
class KeyedChange:
    """An :class:`Update` as a table indexed by row key applies it (what
    :meth:`Update.by_row_key` returns): Perspective's grid keeps the row key as its index.

    Apply: drop ``removes``, then insert or overwrite the rows at ``keys`` with ``rows``
    (for a snapshot, replace everything with them). The result holds exactly the held rows,
    each under its current row key. A shift moves rows to new keys: they are upserted at
    their current key and their previous key is removed unless a row holds it now, so the
    cost follows the change and the rows that moved, never the table (as
    :class:`flight.web.feed.Change` does on the server).

    Attributes
    ----------
    snapshot
        ``rows`` is the whole view: replace what is held.
    keys
        Row keys of ``rows`` (current key space), ascending.
    rows
        Current values at ``keys``, in the subscribed columns.
    removes
        Row keys (previous key space) no longer held under that key, none in ``keys``.
    """

    snapshot: bool
    keys: I64
    rows: pa.Table
    removes: I64


class OrderedChange:
    """An :class:`Update` as a table kept in table order applies it (what
    :meth:`Update.in_order` returns): :class:`clients.liveframe.LiveFrame` keeps a pandas
    DataFrame current this way, by position.

    Apply, to rows held in ascending row key order (a row's position is its rank): remove
    the rows of the keys ``removed`` (previous key space); move the keys ``shifts`` moves
    (a shift never reorders rows, so no row changes position); insert the rows
    :meth:`added_rows` at the ranks of the keys ``added`` (current key space); overwrite the
    rows of the keys ``modified`` with :meth:`modified_rows`, in ``modified_columns``.

    Attributes
    ----------
    removed
        Row keys removed, previous key space, ascending.
    shifts
        ``(begins, ends, deltas)``: the message's shift ranges (ends inclusive), from the
        previous key space to the current one.
    added, modified
        Row keys, current key space, ascending (disjoint); their rows, in the subscribed
        columns and the same order, are :meth:`added_rows` and :meth:`modified_rows`.
    modified_columns
        The columns whose values may have changed in the modified rows.
    """

    __slots__ = ("removed", "shifts", "added", "modified", "modified_columns", "_added",
                 "_modified")

    def __init__(self, removed: I64, shifts: tuple[I64, I64, I64], added: I64, modified: I64,
                 modified_columns: tuple[str, ...], added_rows: _Rows,
                 modified_rows: _Rows) -> None:
        self.removed, self.shifts, self.added, self.modified = removed, shifts, added, modified
        self.modified_columns = modified_columns
        self._added, self._modified = added_rows, modified_rows

    @property
    def rows(self) -> int:
        """Rows the change removes, adds or overwrites (what applying it costs)."""
        return int(self.removed.size + self.added.size + self.modified.size)

    def added_rows(self) -> pa.Table:
        """Values of the rows at ``added`` (built on first call, from the values held then)."""
        return self._added.arrow()

    def modified_rows(self) -> pa.Table:
        """Current values of the rows at ``modified`` (as :meth:`added_rows`)."""
        return self._modified.arrow()


class _DeltaKeys:
    """What one delta did by row key, kept as the arrays applying it computed anyway; the
    :class:`KeyedChange` is worked out only when asked for (:meth:`change`).

    ``upserts`` are ``(keys, slots)`` pairs in priority order (the first pair holding a key
    gives its newest slot: data sent, then modified, then moved); ``gone`` are keys in the
    previous key space that may no longer be held there; ``dropped`` are current keys that
    left the viewport (a moved row among them is not upserted).
    """

    __slots__ = ("_frozen", "_upserts", "_gone", "_dropped", "_shifts")

    def __init__(self, frozen: _Frozen, upserts: list[tuple[I64, I64]], gone: list[I64],
                 dropped: I64, shifts: tuple[I64, I64, I64]) -> None:
        self._frozen, self._upserts, self._gone = frozen, upserts, gone
        self._dropped, self._shifts = dropped, shifts

    def change(self) -> KeyedChange:
        (ad, ad_s), (md, md_s), (mv, mv_s) = self._upserts
        gone = list(self._gone)
        if self._dropped.size:  # moved, then out of the viewport: not held any more
            keep = ~np.isin(mv, self._dropped)
            mv, mv_s = mv[keep], mv_s[keep]
            gone.append(apply_shifts(self._dropped, self._shifts, inverse=True))
        keys, first = np.unique(np.concatenate([ad, md, mv]), return_index=True)
        slots = np.concatenate([ad_s, md_s, mv_s])[first]
        removes = np.setdiff1d(np.concatenate(gone), keys)  # a key held again is upserted
        return KeyedChange(False, keys, self._frozen.take(slots), removes)


@dataclass(frozen=True, slots=True, repr=False)
class Update:
    """One applied message of a subscription, as the held rows it changed.

    The frames are built on first access (an update nobody looks at costs nothing) and
    are cached; treat them as read-only. Each lists rows in table order (ascending row
    key) under a plain ``RangeIndex``, in the subscribed columns. The same parts as polars
    DataFrames are :attr:`pl`'s (``update.pl.added``...), built and cached apart from the
    pandas ones: ask for one kind, and the other is never built.

    With a viewport they cover held rows only: ``added`` are rows that entered the view
    (new rows, or rows that moved into it), ``removed`` rows that left it (deleted, or moved
    out). When ``is_snapshot`` is true, ``added`` is the whole view: replace what you hold
    (``removed`` then lists the rows held before; it is empty for a consumer's catch-up
    snapshot, see ``skipped``).

    Attributes
    ----------
    step, sequence
        The server's graph step and the table's sequence number this message reached.
    is_snapshot
        The message replaced the whole state (first message, column change, resume).
    resumed
        ``"none"``, or how a reconnect resumed: ``"deltas"`` (missed updates composed into
        this one) or ``"snapshot"`` (history was gone: a new snapshot).
    modified_columns
        Columns whose values may have changed in ``modified``.
    skipped
        For an iterator that fell behind: how many updates this catch-up snapshot replaces.
    """

    step: int
    sequence: int
    is_snapshot: bool
    resumed: str
    modified_columns: tuple[str, ...]
    skipped: int
    _added: _Rows
    _removed: _Rows
    _modified: _Rows
    _previous: _Rows
    _keyed: _DeltaKeys | tuple[I64, _Rows]  # a snapshot: its keys and rows
    _ordered: tuple[I64, I64, I64] | None = None  # a delta without viewport: its keys
    # removed, added and modified (see in_order)

    def in_order(self) -> OrderedChange | None:
        """This update as a table kept in table order applies it (see
        :class:`OrderedChange`), or ``None`` when it is a snapshot (replace everything) or
        the view holds a viewport's rows (whose positions follow the viewport).

        Costs nothing until the rows are read (:meth:`OrderedChange.added_rows`).
        """
        if self._ordered is None or isinstance(self._keyed, tuple):
            return None
        removed, added, modified = self._ordered
        return OrderedChange(removed, self._keyed._shifts, added, modified,
                             self.modified_columns, self._added, self._modified)

    def by_row_key(self) -> KeyedChange:
        """This update as a table indexed by row key applies it (see :class:`KeyedChange`).

        Worked out on each call from what applying the message computed (the rows a shift
        moved are read from the values held then), in work proportional to the update and
        the rows it moved.

        Examples
        --------
        >>> ch = update.by_row_key()                              # doctest: +SKIP
        >>> grid.remove(ch.removes); grid.upsert(ch.keys, ch.rows)  # doctest: +SKIP
        """
        if isinstance(self._keyed, tuple):
            keys, rows = self._keyed
            return KeyedChange(True, keys, rows.arrow(), _EMPTY_KEYS)
        return self._keyed.change()

    @property
    def added(self) -> pd.DataFrame:
        """Values of the rows added (or that entered the viewport)."""
        return self._added.df()

    @property
    def removed(self) -> pd.DataFrame:
        """Previous values of the rows removed (or that left the viewport)."""
        return self._removed.df()

    @property
    def modified(self) -> pd.DataFrame:
        """Current values of the modified rows."""
        return self._modified.df()

    @property
    def modified_previous(self) -> pd.DataFrame:
        """Previous values of the modified rows, row for row with :attr:`modified`."""
        return self._previous.df()

    @property
    def pl(self) -> PolarsParts:
        """The parts as polars DataFrames: ``update.pl.added``, ``.removed``,
        ``.modified``, ``.modified_previous`` (see :class:`PolarsParts`).

        Examples
        --------
        >>> live.on_update(lambda u: print(u.pl.added, u.pl.modified))  # doctest: +SKIP
        """
        return PolarsParts(self)

    def __repr__(self) -> str:
        kind = " snapshot" if self.is_snapshot else ""
        return (f"<Update{kind} seq={self.sequence} step={self.step} +{self._added.count} "
                f"-{self._removed.count} ~{self._modified.count} resumed={self.resumed}>")


class PolarsParts:
    """An :class:`Update`'s parts as polars DataFrames (what :attr:`Update.pl` returns).

    The attributes are named as the update's pandas parts, and hold the same rows in the
    same order (table order, the subscribed columns); polars has no index. Each is built on
    first access, from the same Arrow rows as the pandas part (``polars.from_arrow``), and
    cached with the update. polars is an optional extra: without it, reading a part raises
    ``ModuleNotFoundError`` naming ``pip install 'ticktable[polars]'``.

    Examples
    --------
    >>> for update in live:                                     # doctest: +SKIP
    ...     new = update.pl.added
    ...     print(new.filter(pl.col("px") > 50))
    """

    __slots__ = ("_update",)

    def __init__(self, update: Update) -> None:
        self._update = update

    @property
    def added(self) -> pl.DataFrame:
        """Values of the rows added (or that entered the viewport): :attr:`Update.added`."""
        return self._update._added.polars()

    @property
    def removed(self) -> pl.DataFrame:
        """Previous values of the rows removed (or that left the viewport):
        :attr:`Update.removed`."""
        return self._update._removed.polars()

    @property
    def modified(self) -> pl.DataFrame:
        """Current values of the modified rows: :attr:`Update.modified`."""
        return self._update._modified.polars()

    @property
    def modified_previous(self) -> pl.DataFrame:
        """Previous values of the modified rows, row for row with :attr:`modified`:
        :attr:`Update.modified_previous`."""
        return self._update._previous.polars()

    def __repr__(self) -> str:
        return f"<PolarsParts of {self._update!r}>"


# ------------------------------------------------------------------ client state
def _link(meta: pb.UpdateMetadata) -> dict[str, object]:
    """A mirror's ``LinkStatus`` (docs/protocol.md §14) as a plain dict."""
    st = meta.link
    return {"in_sync": st.in_sync, "state": st.state, "origin": st.origin, "detail": st.detail,
            "reconnects": int(st.reconnects), "resumed_with_deltas": int(st.resumed_with_deltas),
            "resumed_with_snapshot": int(st.resumed_with_snapshot),
            "out_of_sync_seconds": float(st.out_of_sync_seconds)}


class LiveState:
    """The subscriber's view, rebuilt from ``UPDATES`` messages (cost per message follows it).

    :meth:`apply` takes the messages in stream order, each as its metadata and its added
    and modified record batches (:func:`flight.streams.decoder.read_message`), and returns the
    :class:`Update` it made. Not thread-safe: :class:`clients.live.LiveTable` applies and
    reads it under its state lock. After a :class:`ProtocolError` the state may be half
    applied: start a new one (the next subscribe brings a snapshot).

    Invariants (checked while applying; a message breaking them raises ProtocolError):
      S1  ``held`` (None: every key) is the keys at the viewport's positions in ``keys``
      S2  ``index`` maps exactly the held keys to slots of ``store``
      S3  ``len(keys)`` is the table size the server reported
    Kept by construction (the tests check it):
      S4  ``store.key_of(slots) == keys`` for ``keys, slots = index.items()``

    Compaction is incremental (:meth:`_compact`): each message cleans a bounded head of the
    value log, so no message pays for the whole table.

    Attributes
    ----------
    compacted_slots, compacted_rows
        Slots the compaction dropped from the log's head, and the live rows among them
        it copied to the tail, since this state began.
    """

    COMPACT_SLACK = 65_536  # dead slots tolerated beyond the live ones
    COMPACT_FACTOR = 4  # head slots cleaned per row a message appended or removed (>= 2)
    COMPACT_MIN = 2_048  # ... and at least these (a message of a few rows still cleans)

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema  # of the columns held
        self.table_schema = schema  # of the stream: every column of the table
        self.columns: list[str] = list(schema.names)
        self.keys = BitMap64()
        self.held: BitMap64 | None = None
        self.viewport: Ranges | None = None
        self.store = _Store(schema)
        self.index = RowKeyMap()
        self.epoch, self.sequence, self.step, self.messages = "", 0, 0, 0
        self.link: dict[str, object] | None = None  # a mirror's LinkStatus, as a dict
        self.compacted_slots = self.compacted_rows = 0

    @property
    def size(self) -> int:
        return len(self.keys)

    def apply(self, meta: pb.UpdateMetadata, added: pa.Table, modified: pa.Table) -> Update:
        """Apply one message; returns what it changed in the held rows.

        Raises
        ------
        ProtocolError
            If the message does not fit the state (the stream is broken). The state may
            then be half-applied: discard it.
        """
        if meta.format != pb.DELTA_FORMAT_UPDATES:
            raise _ProtocolViolation("UpdateMetadata.format: LiveTable reads DELTA_FORMAT_UPDATES")
        ad_bm, md_bm = _bitmap(meta.added_data_rows), _bitmap(meta.modified_data_rows)
        if len(ad_bm) != added.num_rows or len(md_bm) != modified.num_rows:
            raise _ProtocolViolation(f"data rows announced {len(ad_bm)} + {len(md_bm)} (UpdateMetadata."
                                     f"added_data_rows/modified_data_rows), sent {added.num_rows} + "
                                     f"{modified.num_rows}")
        viewport = [(r.begin, r.end) for r in meta.viewport] if meta.has_viewport else None
        update = (self._snapshot(meta, added, ad_bm, md_bm, viewport) if meta.is_snapshot
                  else self._delta(meta, added, modified, ad_bm, md_bm, viewport))
        self.viewport = viewport
        self.epoch, self.sequence, self.step = meta.epoch, meta.sequence, meta.step
        self.link = _link(meta) if meta.HasField("link") else None
        self.messages += 1
        return update

    def _snapshot(self, meta: pb.UpdateMetadata, added: pa.Table, data: BitMap64,
                  md_bm: BitMap64, viewport: Ranges | None) -> Update:
        keys = _bitmap(meta.added_rows)
        held = None if viewport is None else _keys_at(keys, viewport)
        if meta.removed_rows or md_bm or meta.shifts.begins:
            raise _ProtocolViolation("a snapshot carries UpdateMetadata.added_rows only (no removed "
                                     "rows, modified data or shifts)")
        if data != (keys if held is None else held) or len(keys) != meta.table_size:
            raise _ProtocolViolation("snapshot: UpdateMetadata.added_data_rows are not the held rows "
                                     "(or table_size is wrong)")
        columns = list(meta.columns)
        if not set(columns) <= set(added.schema.names):
            raise _ProtocolViolation(f"snapshot: UpdateMetadata.columns {columns} not in the stream "
                                     f"schema {added.schema.names}")
        old_frozen, old_index = self.store.frozen(), self.index
        self.table_schema = added.schema
        self.schema = pa.schema([added.schema.field(c) for c in columns])
        self.columns = columns
        k = _keys(data)
        self.store = _Store(self.schema)
        self.store.reserve(self._bound(k.size))  # a table that keeps its size never regrows it
        self.store.append(added, k)
        self.index = _index_of(k)
        self.keys, self.held = keys, held
        frozen = self.store.frozen()
        empty = _Rows(frozen, _EMPTY_KEYS, 0)
        rows = _Rows(frozen, np.arange(k.size, dtype=np.int64), k.size)
        return Update(meta.step, meta.sequence, True, _RESUMED.get(meta.resume, "none"), (), 0,
                      rows, _Rows(old_frozen, lambda: old_index.items()[1], len(old_index)),
                      empty, empty, (k, rows))

    def _delta(self, meta: pb.UpdateMetadata, added: pa.Table, modified: pa.Table,
               ad_bm: BitMap64, md_bm: BitMap64, viewport: Ranges | None) -> Update:
        if list(meta.columns) != self.columns or not self.messages:
            raise _ProtocolViolation(f"a delta for UpdateMetadata.columns {list(meta.columns)}, held "
                                     f"{self.columns} (columns change only by a snapshot)")
        removed, added_rows = _bitmap(meta.removed_rows), _bitmap(meta.added_rows)
        s = meta.shifts
        shifts = (np.asarray(s.begins, dtype=np.int64), np.asarray(s.ends, dtype=np.int64),
                  np.asarray(s.deltas, dtype=np.int64))
        if not removed.issubset(self.keys):
            raise _ProtocolViolation("UpdateMetadata.removed_rows has rows that are not in the table")
        expected = len(self.keys) - len(removed) + len(added_rows)
        keys = self.keys  # changed in place from here on
        keys.difference_update(removed)
        if self.held is None:
            removed_held, held = removed, None
        else:
            removed_held, held = removed & self.held, self.held - removed
        k_src, k_dst = _shift_bitmap(keys, shifts)
        if not added_rows.isdisjoint(keys):
            raise _ProtocolViolation("UpdateMetadata.added_rows has rows that already exist")
        keys.update(added_rows)
        if len(keys) != expected or len(keys) != meta.table_size:
            raise _ProtocolViolation(f"table size {len(keys)} after the update, UpdateMetadata."
                                     f"table_size says {meta.table_size} (shifts collided?)")
        h_src, h_dst = (k_src, k_dst) if held is None else _shift_bitmap(held, shifts)
        held_new = None if viewport is None else _keys_at(keys, viewport)
        # which held rows are new, dropped (viewport) or re-sent (resume with a viewport)
        if held is None and held_new is None:
            newly, dropped = added_rows, BitMap64()
        else:
            before = held if held is not None else keys - added_rows  # held, current keys
            target = held_new if held_new is not None else keys
            newly, dropped = target - before, before - target
        if not (newly.issubset(ad_bm) and ad_bm.issubset(held_new if held_new is not None
                                                          else keys)
                and md_bm.issubset(keys) and md_bm.isdisjoint(newly)):
            raise _ProtocolViolation("UpdateMetadata.added_data_rows/modified_data_rows do not match "
                                     "the rows held")
        resent = ad_bm - newly
        if held_new is not None and not md_bm.issubset(held_new):
            raise _ProtocolViolation("UpdateMetadata.modified_data_rows has rows outside the viewport")
        # row key -> slot: remove (previous key space), shift, drop, then write the data
        index = self.index
        rem_k = _keys(removed_held)
        rem_s = _require(index.remove(rem_k), "removed")
        h_s = _EMPTY_KEYS  # the moved rows' slots
        if h_src.size:
            h_s = _require(index.remove(h_src), "shifted")
            index.put(h_dst, h_s)  # put: never trust
            self.store.rekey(h_s, h_dst)  # live slots know their keys (for compaction)
        drop_k = _keys(dropped)
        drop_s = _require(index.remove(drop_k), "dropped")
        ad, md, rs = _keys(ad_bm), _keys(md_bm), _keys(resent)
        md_prev = _require(index.lookup(md), "modified")
        rs_prev = _require(index.lookup(rs), "re-sent")
        ad_s = self.store.append(added, ad) + np.arange(ad.size, dtype=np.int64)
        md_s = self.store.append(modified, md) + np.arange(md.size, dtype=np.int64)
        index.put(ad, ad_s)
        index.set_values(md, md_s)  # present: md_prev above found every one
        self.held = held_new
        # the update's parts, in key order (removed in the previous key space)
        frozen = self.store.frozen()
        if rs.size:
            new_k = _keys(newly)
            new_s = ad_s[np.searchsorted(ad, new_k)]
            mod_k = np.concatenate([md, rs])
            order = np.argsort(mod_k, kind="stable")
            mod_k = mod_k[order]
            mod_s = np.concatenate([md_s, ad_s[np.searchsorted(ad, rs)]])[order]
            prev_s = np.concatenate([md_prev, rs_prev])[order]
        else:
            new_k, new_s, mod_k, mod_s, prev_s = ad, ad_s, md, md_s, md_prev
        # in table order (Update.in_order): every row is held, before and after
        ordered = (rem_k, new_k, mod_k) if held is None and held_new is None else None
        if drop_k.size:
            pre = apply_shifts(drop_k, shifts, inverse=True)
            order = np.argsort(np.concatenate([rem_k, pre]), kind="stable")
            rem_s = np.concatenate([rem_s, drop_s])[order]
        cols = tuple(c.column for c in meta.modified) if md.size else ()
        if rs.size:
            cols = tuple(self.columns)
        update = Update(meta.step, meta.sequence, False, _RESUMED.get(meta.resume, "none"),
                        cols, 0, _Rows(frozen, new_s, new_s.size),
                        _Rows(frozen, rem_s, rem_s.size), _Rows(frozen, mod_s, mod_s.size),
                        _Rows(frozen, prev_s, prev_s.size),
                        _DeltaKeys(frozen, [(ad, ad_s), (md, md_s), (h_dst, h_s)],
                                   [rem_k, h_src], drop_k, shifts), ordered)
        self._compact(ad.size + md.size + rem_k.size + drop_k.size)
        return update

    def _compact(self, work: int) -> None:
        """Clean the head of the value log if dead slots outnumber the live ones (+ slack).

        A copying log cleaner: the oldest ``max(COMPACT_MIN, COMPACT_FACTOR * work)`` slots
        (``work``: the rows this message appended or removed) are checked against the key
        index, their live rows appended to the tail (their keys re-pointed) and the head
        dropped. No message copies more than that, so the cost per message stays a constant
        times the message, and the whole table is never copied at once.

        Why the log stays bounded (``L`` live rows, ``W`` slots held, ``k`` the factor): a
        *pass* cleans the ``W0`` slots held when it starts. It moves at most the ``L0``
        rows live in them (each once: a moved row lands past the pass's end) and, cleaning
        ``k`` slots per row appended, lets at most ``W0 / k`` rows be appended, so the pass
        ends with ``W1 <= L0 + W0 / k``. Starting at the trigger, ``W0 ~ 2 L0 + S``, a pass
        ends at ``1.5 L0 + S / 4`` for ``k = 4``: under the trigger, so cleaning stops and
        the dead fraction converges instead of drifting up. Within a pass the log grows by
        at most ``L0 / k`` (only while the head it cleans is all live), so it holds at most
        ``2.25 L + S`` plus one message's rows, under the ``3 L + S`` the whole-table copy
        needed at its peak; when rows die at random (the head, being oldest, has the most
        dead) cleaning reclaims more than a message appends and the log stays near
        ``2 L + S``.
        """
        store, index = self.store, self.index
        live = len(index)
        if len(store) - live <= live + self.COMPACT_SLACK:
            return
        n = min(len(store), max(self.COMPACT_MIN, self.COMPACT_FACTOR * work))
        slots = np.arange(store.base, store.base + n, dtype=np.int64)
        keys = store.key_of(slots)
        keep = index.lookup(keys) == slots
        moved = int(np.count_nonzero(keep))
        if moved:
            head = store.frozen().take(slots)  # slices of the head's chunks (zero-copy)
            keys = keys[keep]
            first = store.append(head.filter(pa.array(keep)), keys)
            index.set_values(keys, first + np.arange(moved, dtype=np.int64))
        store.drop_head(n)  # Updates already made keep their own frozen views
        self.compacted_slots += n
        self.compacted_rows += moved

    def _bound(self, live: int) -> int:
        """Slots the value log can hold with ``live`` rows (see :meth:`_compact`)."""
        return 2 * live + live // 4 + 2 * self.COMPACT_SLACK

    def held_slots(self) -> tuple[I64, I64]:
        """``(keys, slots)`` of the held rows, keys ascending."""
        if self.held is None and not self.index.hashed:
            keys, slots = self.index.items()
        else:  # the bitmap has the keys in order; a hashed index would sort its own
            keys = _keys(self.keys if self.held is None else self.held)
            slots = self.index.lookup(keys)
        if keys.size != (len(self.keys) if self.held is None else len(self.held)):
            raise _ProtocolViolation("the client state lost rows (a bug): resubscribe")
        return keys, _require(slots, "held")

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        """The held rows in table order (the subscribed columns, or these of them)."""
        return self.held_rows(columns)[1]

    def held_rows(self, columns: list[str] | None = None) -> tuple[I64, pa.Table]:
        """The held rows' keys (ascending) and values in table order (as :meth:`to_arrow`)."""
        keys, slots = self.held_slots()
        frozen = self.store.frozen()
        return keys, (frozen if columns is None else frozen.select(columns)).take(slots)

    def held_positions(self) -> I64 | None:
        """The table positions of the held rows, ascending (``None``: every row is held,
        at positions ``0..size-1``)."""
        if self.viewport is None:
            return None
        n = self.size
        parts = [np.arange(min(b, n), min(e, n), dtype=np.int64) for b, e in self.viewport]
        return np.unique(np.concatenate(parts)) if parts else _EMPTY_KEYS

    def catch_up(self, skipped: int) -> Update:
        """A snapshot update of the current view (an iterator that fell behind)."""
        frozen = self.store.frozen()
        keys, slots = self.held_slots()
        empty = _Rows(frozen, _EMPTY_KEYS, 0)
        rows = _Rows(frozen, slots, slots.size)
        return Update(self.step, self.sequence, True, "none", (), skipped,
                      rows, empty, empty, empty, (keys, rows))


def _index_of(keys: I64) -> RowKeyMap:
    """``keys[i] -> i``: the index of a store written in key order."""
    index = RowKeyMap()
    index.insert(keys, np.arange(keys.size, dtype=np.int64))
    return index


def _require(slots: I64, what: str) -> I64:
    if slots.size and int(slots.min()) < 0:
        raise _ProtocolViolation(f"{what} rows that the client does not hold")
    return slots


# ------------------------------------------------------------------ errors
