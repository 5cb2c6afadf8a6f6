"""The replica source table (:class:`ReplicaTable`, exported by :mod:`engine.sources`): a
table that changes exactly as another table changed, under that table's row keys.

A table of another server is mirrored into the local graph this way (DESIGN.md §11): each
update of the origin, as a subscription delivers it, is staged as one :class:`ReplicaChange`
and the cycle that takes it commits one update with the same removes, shifts, adds and
modifies under the same row keys, so the replica's rows, row keys and order are the
origin's, and every table derived from it sees the origin's own deltas.

When the history in between is lost (a broken link the origin cannot resume, an origin that
restarted), :meth:`ReplicaTable.reset` stages the origin's whole state instead; the cycle
that takes it commits only the difference from what the replica holds (rows gone, rows
new, rows whose values changed), never "remove everything, add everything".

Row keys are the origin's, so they may be sparse (a sorted or merged table's keys): values
live in dense *slots* and a :class:`~engine._kernels.rowkeymap.RowKeyMap` maps row key to
slot. A slot freed in a cycle is reused from the next one, and the key -> slot map of the
previous state is kept for the cycle (removed keys, the shift), so previous values are
readable while listeners run.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from engine._kernels.arrays import member
from engine._kernels.hashing import values_equal
from engine._kernels.ids import IdAllocator
from engine._kernels.rowkeymap import RowKeyMap
from engine._source import CheckedBatch, SourceTable, TableLike, as_schema, conform
from engine.columns import ColumnSource, RedirectingColumnSource, compact_stale, make_column_source
from engine.errors import InputError, ProtocolError, quoted
from engine.rowset import KeyArray, RowSet, RowSetShiftData
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.graph import UpdateGraph

__all__ = ["ReplicaChange", "ReplicaReset", "ReplicaTable"]

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    """One update of the origin table, to be applied as it is.

    Attributes
    ----------
    removed, shifted, added, modified, modified_columns
        The origin's update (:class:`~engine.update.TableUpdate`'s key spaces: ``removed``
        before it, ``added`` and ``modified`` after it).
    added_rows, modified_rows
        The values of the ``added`` and ``modified`` rows, one row per key in ascending key
        order, every column of the replica (a modified row's columns not in
        ``modified_columns`` are not read).
    position
        Where this change leaves the replica in the origin's history (the origin's epoch
        and sequence, say): :attr:`ReplicaTable.position` once applied. Opaque here.
    """

    removed: RowSet
    shifted: RowSetShiftData
    added: RowSet
    modified: RowSet
    modified_columns: frozenset[str]
    added_rows: pa.Table
    modified_rows: pa.Table
    position: Any = None


@dataclass(frozen=True, slots=True)
class ReplicaReset:
    """The origin's whole state: ``rows`` at the ascending row ``keys`` (see
    :meth:`ReplicaTable.reset`)."""

    keys: KeyArray
    rows: pa.Table
    position: Any = None


class _SlotColumn(RedirectingColumnSource):
    """A replica's column: values in slots, read through the table's row key -> slot map."""

    def __init__(self, table: ReplicaTable, inner: ColumnSource) -> None:
        self._table = table
        self.inner = inner
        self.type = inner.type

    @property
    def translation(self) -> object:
        return self._table

    def translate(self, keys: KeyArray) -> KeyArray:
        return self._table._slots_of(keys)

    def translate_prev(self, keys: KeyArray) -> KeyArray:
        return self._table._prev_slots_of(keys)


@dataclass(slots=True)
class _Prev:
    """This cycle's previous key space, as far as it differs from the current one."""

    removed_keys: KeyArray = field(default_factory=lambda: _EMPTY)  # ascending
    removed_slots: KeyArray = field(default_factory=lambda: _EMPTY)
    shifted: RowSetShiftData = field(default_factory=RowSetShiftData.empty)


class ReplicaTable(SourceTable):
    """A source table that changes exactly as another table did (see the module docstring).

    Writers do not write into it: :meth:`apply` stages one update of the origin and
    :meth:`reset` the origin's whole state; each cycle takes one staged change (and asks
    the graph for another cycle while more wait), so every change staged becomes exactly
    one update of this table.

    Attributes
    ----------
    position
        The ``position`` of the last change applied (``None`` before the first): where
        the replica is in the origin's history, as the caller tracks it.

    Examples
    --------
    >>> r = ReplicaTable(graph, pa.schema([("v", pa.int64())]), name="r")
    >>> r.apply(ReplicaChange(RowSet(), RowSetShiftData.empty(), RowSet.from_keys([5, 9]),
    ...                       RowSet(), frozenset(), pa.table({"v": [50, 90]}),
    ...                       pa.table({"v": pa.array([], pa.int64())}), position=1))
    >>> graph.run_cycle(); r.rowset.keys().tolist(), r.position
    ([5, 9], 1)
    """

    write_kinds = ()

    def __init__(self, graph: UpdateGraph, schema: Any, *, name: str | None = None) -> None:
        sch = as_schema(schema)
        storage = {f.name: make_column_source(f.type) for f in sch}  # indexed by slot
        super().__init__(graph, sch, name=name,
                         columns={n: _SlotColumn(self, s) for n, s in storage.items()})
        self._storage = storage
        self._map = RowKeyMap()
        self._ids = IdAllocator()
        self._prev = _Prev()
        self._queue: collections.deque[ReplicaChange | ReplicaReset | BaseException] = (
            collections.deque())
        self._queue_lock = threading.Lock()
        self.position: Any = None
        #: what feeds this table (a :class:`flight.links.Link`, say): its ``close()`` is
        #: called when the table is closed
        self.source: Any = None

    # staging --------------------------------------------------------------------------
    def check_batch(self, data: TableLike, kind: str) -> CheckedBatch:
        """Refused: a replica changes only as its origin does."""
        raise InputError(f"table {quoted(self.name)} mirrors a table of another server: it "
                         f"takes no writes (write to the origin)")

    def apply(self, change: ReplicaChange) -> None:
        """Stage one update of the origin, applied as it is by a coming cycle (one cycle
        per staged change, in staging order).

        Raises
        ------
        TableFailed
            If the table failed in an earlier cycle.
        """
        self.check_alive()
        with self._queue_lock:
            self._queue.append(change)

    def reset(self, keys: KeyArray, rows: TableLike, position: Any = None) -> None:
        """Stage the origin's whole state: ``rows`` at the ascending, distinct row ``keys``.
        The cycle that takes it commits only the difference from what this table holds
        then: keys gone are removed, new keys added, rows whose values differ modified.

        Raises
        ------
        SchemaError
            If ``rows`` does not match the schema.
        ProtocolError
            If ``keys`` is not ascending and distinct, or not as long as ``rows``.
        """
        self.check_alive()
        keys = np.asarray(keys, dtype=np.int64)
        data = conform(self.name, self.schema, rows)
        if keys.size != data.num_rows or (keys.size > 1 and not (np.diff(keys) > 0).all()) \
                or (keys.size and keys[0] < 0):
            raise ProtocolError(f"table {quoted(self.name)}: a reset needs one ascending, "
                                f"distinct, non-negative row key per row ({keys.size} keys, "
                                f"{data.num_rows} rows)")
        with self._queue_lock:
            self._queue.append(ReplicaReset(keys, data, position))

    def fail(self, exc: BaseException) -> None:
        """Stage a failure: the cycle that takes it fails the table with ``exc`` (after the
        changes staged before it), as when its origin can no longer be followed."""
        with self._queue_lock:
            self._queue.append(exc)

    def close(self) -> None:
        """Detach from the graph and close what feeds this table."""
        super().close()
        source, self.source = self.source, None
        if source is not None:
            source.close()

    @property
    def pending_changes(self) -> int:
        """Changes staged and not applied yet."""
        with self._queue_lock:
            return len(self._queue)

    @property
    def pending_rows(self) -> int:
        with self._queue_lock:
            return sum(c.rows.num_rows if isinstance(c, ReplicaReset)
                       else c.added_rows.num_rows + c.modified_rows.num_rows
                       for c in self._queue if not isinstance(c, BaseException))

    # the cycle --------------------------------------------------------------------------
    def _compute_update(self) -> TableUpdate | None:
        self._prev = _Prev()
        self._ids.release()  # slots freed in earlier cycles: their previous values are gone
        with self._queue_lock:
            change = self._queue.popleft() if self._queue else None
            more = bool(self._queue)
        if more:
            self.graph.request_cycle()
        if change is None:
            return None
        if isinstance(change, BaseException):
            raise change
        if isinstance(change, ReplicaReset):
            change = self._difference(change)
        update = self._apply(change)
        self.position = change.position
        return update

    def _apply(self, c: ReplicaChange) -> TableUpdate:
        held = self.rowset
        if not c.removed <= held:
            raise ProtocolError(f"table {quoted(self.name)}: the origin removed "
                                f"{len(c.removed - held)} row key(s) the replica does not hold")
        rk = c.removed.keys()
        if rk.size:
            slots = self._map.remove(rk)
            self._prev.removed_keys, self._prev.removed_slots = rk, slots
            self._ids.free(slots)
        if c.shifted:
            old, new = c.shifted.moved_keys(held - c.removed)
            self._map.move(old, new)
            self._prev.shifted = c.shifted
        ak = c.added.keys()
        if ak.size:
            if c.added_rows.num_rows != ak.size:
                raise ProtocolError(f"table {quoted(self.name)}: {ak.size} rows added with "
                                    f"{c.added_rows.num_rows} rows of values")
            if (self._map.lookup(ak) >= 0).any():
                raise ProtocolError(f"table {quoted(self.name)}: the origin added row keys the "
                                    f"replica holds")
            slots = self._ids.allocate(ak.size)
            self._map.insert(ak, slots)
            for name, src in self._storage.items():
                self.graph.track(src)
                src.ensure_capacity(self._ids.end)
                src.set(slots, c.added_rows.column(name))
        mk = c.modified.keys()
        if mk.size and c.modified_columns:
            if c.modified_rows.num_rows != mk.size:
                raise ProtocolError(f"table {quoted(self.name)}: {mk.size} rows modified with "
                                    f"{c.modified_rows.num_rows} rows of values")
            slots = self._map.lookup(mk)
            if (slots < 0).any():
                raise ProtocolError(f"table {quoted(self.name)}: the origin modified row keys "
                                    f"the replica does not hold")
            for name in c.modified_columns:
                src = self._storage[name]
                self.graph.track(src)
                src.set(slots, c.modified_rows.column(name))
        return TableUpdate.of(added=c.added, removed=c.removed, modified=c.modified,
                              shifted=c.shifted, modified_columns=c.modified_columns)

    def _difference(self, reset: ReplicaReset) -> ReplicaChange:
        """The change from what this table holds to ``reset``'s state, with no shift."""
        held = self.rowset
        new = RowSet.from_keys(reset.keys, assume_sorted=True)
        removed, added, common = held - new, new - held, held & new
        ck = common.keys()
        at = np.searchsorted(reset.keys, ck)
        rows = reset.rows
        changed = np.zeros(ck.size, dtype=bool)
        columns: list[str] = []
        if ck.size:
            take = pa.array(at)
            for name in self.schema.names:
                differs = ~values_equal(self.column(name).get(ck), rows.column(name).take(take))
                if differs.any():
                    changed |= differs
                    columns.append(name)
        mk = ck[changed]
        ak = added.keys()
        return ReplicaChange(
            removed=removed, shifted=RowSetShiftData.empty(), added=added,
            modified=RowSet.from_keys(mk, assume_sorted=True), modified_columns=frozenset(columns),
            added_rows=rows.take(pa.array(np.searchsorted(reset.keys, ak))),
            modified_rows=rows.take(pa.array(at[changed])), position=reset.position)

    def _end_cycle(self) -> None:
        super()._end_cycle()
        compact_stale(self._storage.values(), self.size, lambda: np.sort(self._map.items()[1]))

    # reading through slots ----------------------------------------------------------------
    def _slots_of(self, keys: KeyArray) -> KeyArray:
        return self._map.lookup(np.asarray(keys, dtype=np.int64))

    def _prev_slots_of(self, keys: KeyArray) -> KeyArray:
        """Slots of keys of the previous key space (this cycle's removed keys included)."""
        keys = np.asarray(keys, dtype=np.int64)
        p = self._prev
        now = p.shifted.apply_keys(keys) if p.shifted else keys
        slots = self._map.lookup(now)
        if p.removed_keys.size:
            gone = member(p.removed_keys, keys)
            if gone.any():
                slots[gone] = p.removed_slots[np.searchsorted(p.removed_keys, keys[gone])]
        return slots

    # checkpoints ----------------------------------------------------------------------------
    def _export_extra(self) -> dict[str, Any]:
        return {"position": self.position}

    def _restore(self, rows: pa.Table, keys: KeyArray, extra: dict[str, Any]) -> None:
        slots = self._ids.allocate(keys.size)
        if keys.size:
            self._map.insert(keys, slots)
            for name, src in self._storage.items():
                src.ensure_capacity(self._ids.end)
                src.set(slots, rows.column(name))
        self.position = extra.get("position")
