"""Upserts to triples: ``(key, Optional[value])`` events become ``(record, time, diff)``
(seed 000).

An upsert names a key and its new value, or no value (a delete). Turning it into
differential updates needs the key's current value: a change retracts the old record
(``-1``) and inserts the new one (``+1``). Repeating the current value, or deleting an
absent key, says nothing and produces nothing.

The operator keeps the **current record of each key** itself: an exact key map (a hash
finds the key's slot, the key values decide, :class:`~engine._kernels.keymap.ExactKeyMap`)
over a :class:`~engine._kernels.rowstore.RowStore` of records by slot. Finding the current
values of a batch's keys is one probe of that map and one gather, whatever the history:
the arrangement is not searched. Events of one batch are grouped by key and time, the last
event per (key, time) wins, and each key's distinct times are walked in order from its
current record, all vectorized. A batch at one time with one integer key column (values
``>= 0``, mapped by value) is neither hashed nor sorted: its events find their slots
first, and the last event per slot wins (only new keys' events are sorted). Records of
fixed-width columns (numbers, temporals) are kept in a
:class:`~engine._kernels.rowstore.FlatRowStore` and compared and gathered in numpy.

The operator publishes the **arrangement of its output**: a :class:`Trace` of the output
collection keyed by the key columns, which other operators read
(``upsert.trace.reader()``). It is made when first asked for, from the state (the current
records at the last time, what a trace written all along holds once compacted there), and
written by every step from then on; an upsert that nobody reads pays nothing for it. A
trace given to the constructor is written from the start, and may hold updates already:
the state starts as its accumulation. The upsert is the trace's only writer;
:meth:`Upsert.validate` checks that the state and the trace accumulated to the present
hold the same records. When a step's updates would leave the trace holding more than
twice as many updates as the state has records (plus a slack), and every reader has moved
to the present, the upsert replaces the trace's history, this step's updates included, by
its state (:meth:`Trace.rebuild`: one sort of the live records instead of the insert and
the merges that would compact the history down to them); a reader held at an older
version keeps the history, and the merges compact it as before.

Times are single-coordinate versions that never go back: a batch's times are ``>=``
every time already processed, so the trace can be compacted up to the last time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import row_for_message
from engine._kernels.hashing import (
    exact_hash,
    group_equal,
    hash_rows,
    rows_equal,
    rows_equal_at,
    same_rows,
)
from engine._kernels.ids import IdAllocator
from engine._kernels.rowstore import (
    FlatColumn,
    FlatRowStore,
    RowStore,
    flat_columns,
    flat_equal_at,
    flat_table,
    flat_take,
)
from engine.differential.keyindex import KeyIndex
from engine.differential.trace import Trace
from engine.differential.version import Antichain, Version
from engine.differential.zset import TIME, ZSet
from engine.errors import InputError, InvalidKeyError, SchemaError, UpdateInvariantError
from engine.reserved import DELETE
from engine.sources import as_schema, conform

__all__ = ["DELETE", "Upsert"]

I64 = npt.NDArray[np.int64]
# updates the trace may hold beyond twice the state before the state replaces them: a small
# state is not rebuilt every step
_REBUILD_SLACK = 4096
# a batch's integer keys spanning at most 4 * events + this are marked by value (no lookup
# of every event's slot)
_DENSE_SLACK = 65536


class Upsert:
    """Turns batches of upsert events into consolidated triples, keeping each key's current record.

    Parameters
    ----------
    schema
        The record columns (keys and values).
    keys
        The key column(s).
    trace
        An existing arrangement of the collection to write from the start (keyed by
        ``keys``, one-coordinate times; the state starts as what it holds). When omitted,
        :attr:`trace` is made on first use.

    Examples
    --------
    Seed 000's sequence for one key, one event per time:

    >>> up = Upsert(pa.schema([("first", pa.string()), ("last", pa.string())]), "first")
    >>> for t, last in enumerate(["mcsherry", "zappa", None, "oz", "oz", None]):
    ...     ev = pa.table({"first": ["frank"], "last": [last], DELETE: [last is None]})
    ...     print(t, up.step(ev, t).to_triples())
    0 [(('frank', 'mcsherry'), (0,), 1)]
    1 [(('frank', 'mcsherry'), (1,), -1), (('frank', 'zappa'), (1,), 1)]
    2 [(('frank', 'zappa'), (2,), -1)]
    3 [(('frank', 'oz'), (3,), 1)]
    4 []
    5 [(('frank', 'oz'), (5,), -1)]
    """

    def __init__(self, schema: Any, keys: str | Sequence[str], *, trace: Trace | None = None) -> None:
        self.schema = as_schema(schema)
        self.keys = (keys,) if isinstance(keys, str) else tuple(keys)
        missing = [k for k in self.keys if k not in self.schema.names]
        if not self.keys or missing:
            raise SchemaError(f"key column(s) {missing or list(self.keys)} not in {self.schema.names}")
        self.values = [n for n in self.schema.names if n not in self.keys]
        if trace is not None and (trace.keys != self.keys or trace.dims != 1 or not trace.schema.equals(self.schema)):
            raise SchemaError(
                f"the trace (keys {list(trace.keys)}, {trace.dims}-coordinate times, {trace.schema}) "
                f"does not fit the upsert (keys {list(self.keys)}, 1-coordinate times, {self.schema})"
            )
        self._trace = trace
        self._reader = trace.reader() if trace is not None else None
        self._exact = exact_hash(self.schema, self.keys)
        # the state: key -> slot, slot -> current record
        # fixed-width columns (numbers, temporals) are kept and compared in numpy
        self._records: RowStore | FlatRowStore = (
            FlatRowStore(self.schema) if FlatRowStore.fits(self.schema) else RowStore(self.schema))
        self._value_at = [self.schema.names.index(n) for n in self.values]
        self._key_at = [self.schema.names.index(n) for n in self.keys]
        self._index = KeyIndex(self.keys, self._exact, self._records)
        self._slots = IdAllocator()
        # per slot, the stamp of its key's last event so far (see _last_by_slot)
        self._last = np.full(1024, -1, dtype=np.int64)
        # per key value less the batch's least, the same for a batch of dense keys
        self._by_key = np.full(1024, -1, dtype=np.int64)
        self._stamp = 0
        self.time: int | None = None
        if trace is not None:
            self._load(trace)

    def __len__(self) -> int:
        """Keys with a current record."""
        return len(self._records)

    @property
    def trace(self) -> Trace:
        """The arrangement of the output, keyed by the key columns, for operators to share
        (``upsert.trace.reader()``).

        Given to the constructor, it is written from the start. Otherwise it is made on
        first use from the state: one batch of the current records at the last time
        processed, which is what the trace written from the start would hold once
        compacted to that time (and every reader starts there: the upsert's own hold is
        on the present). From then on every step writes to it.
        """
        if self._trace is None:
            trace = Trace(self.schema, self.keys, dims=1)
            self._reader = trace.reader()
            if self.time is not None:
                trace.insert(self._present())
                self._reader.set_logical_compaction(Antichain([Version(self.time)]))
            self._trace = trace
        return self._trace

    def step(self, events: pa.Table, time: int | None = None) -> ZSet:
        """Apply a batch of events; return their triples (also inserted into the trace once
        it is published, see :attr:`trace`).

        Parameters
        ----------
        events
            Every schema column, plus optionally ``__delete`` (bool; true deletes the key,
            its values are ignored) and ``__time`` (int64 per event). Within one (key,
            time), the last event wins.
        time
            The version of events without a ``__time`` column.

        Returns
        -------
        ZSet
            Consolidated triples: per changed key and time, ``-1`` for the old record and
            ``+1`` for the new one; ordered by time, and within a time retractions first.

        Raises
        ------
        SchemaError
            If columns are missing, unknown or mistyped.
        InvalidKeyError
            If a key column has nulls.
        InputError
            If a time is missing or earlier than a time already processed.
        """
        ev, times, deleted, (first, last) = self._split(events, time)
        n = ev.num_rows
        if n == 0:
            return ZSet.empty(self.schema, 1)
        self._slots.release()  # slots freed by the last step may be reused from now on
        values = self._index.values(ev) if first == last else None
        if values is not None and isinstance(self._records, FlatRowStore):
            out = self._step_flat(ev, values, deleted, first)
        else:
            out = self._step(ev, np.full(n, first, dtype=np.int64) if times is None else times, deleted, values)
        self.time = last
        if self._trace is not None:  # published: keep the arrangement current
            assert self._reader is not None
            # this operator will only ask about the present from now on
            present = Antichain([Version(self.time)])
            self._reader.set_logical_compaction(present)
            if (len(self._trace) + out.num_rows > 2 * len(self._records) + _REBUILD_SLACK
                    and self._trace.since == present):
                # the history would outweigh the state and no reader needs it: one sort of
                # the state (this step's updates applied) replaces the merges that would
                # compact it, and the insert of this step's updates
                self._trace.rebuild(self._present())
            else:
                self._trace.insert(out)
        return out

    def _step_flat(self, ev: pa.Table, values: I64, deleted: npt.NDArray[np.bool_], time: int) -> ZSet:
        """:meth:`step` for one time, keys mapped by value (``values``) and fixed-width
        records: each key's last event against its stored record, read and written in
        place in the :class:`FlatRowStore` (no copy of the keys' current records). Each
        output column is one array, filled by two gathers (retractions from the store,
        insertions from the events), whose second half is also what the state takes."""
        store = self._records
        assert isinstance(store, FlatRowStore)
        win, slot = self._last_by_slot(values)
        evc = flat_columns(ev)
        had = slot >= 0
        has = ~deleted.take(win)
        changed = had != has
        both = np.flatnonzero(had & has)
        held = store.columns()
        if both.size and self.values:
            sb, wb = slot.take(both), win.take(both)
            same = flat_equal_at(held[self._value_at[0]], sb, evc[self._value_at[0]], wb)
            for c in self._value_at[1:]:
                same &= flat_equal_at(held[c], sb, evc[c], wb)
            changed[both] = ~same
        retract = np.flatnonzero(changed & had)
        insert = np.flatnonzero(changed & has)
        # a retracted record's key is its event's: only its values are read from the store
        sr, wr, wi = slot.take(retract), win.take(retract), win.take(insert)
        r = retract.size
        cols = [_gather_two(evc[c] if c in self._key_at else held[c], wr if c in self._key_at else sr, evc[c], wi)
                for c in range(len(evc))]
        diffs = np.ones(r + insert.size, np.int64)
        diffs[:r] = -1
        out = ZSet(flat_table(cols, self.schema), diffs, np.full((diffs.size, 1), time, dtype=np.int64))
        # the state: deleted keys leave, changed ones take their last event's record
        gone = np.flatnonzero(had & ~has)  # a deleted key changes
        if gone.size:
            ids = slot.take(gone)
            self._index.delete_values(values.take(win.take(gone)))
            store.drop(ids)
            self._slots.free(ids)
        if insert.size:
            ids = slot.take(insert)
            fresh = np.flatnonzero(ids < 0)
            if fresh.size:
                ids[fresh] = self._slots.allocate(fresh.size)
                self._index.insert_values(values.take(wi.take(fresh)), ids.take(fresh))
            store.put_columns(ids, [(v[r:], None if ok is None else ok[r:]) for v, ok in cols], fresh)
        return out

    def _step(self, ev: pa.Table, times: I64, deleted: npt.NDArray[np.bool_], values: I64 | None) -> ZSet:
        """:meth:`step` in general: several times, or keys by hash, or records through
        Arrow (``values``: the key values when keys are mapped by value, see
        :meth:`~engine.differential.keyindex.KeyIndex.values`)."""
        kh: npt.NDArray[np.uint64] | None
        if values is not None:  # one time, integer keys >= 0 by value: no hashes, no sort
            kh = None
            win, slot = self._last_by_slot(values)
            first = np.ones(win.size, dtype=bool)
            heads = win
        else:
            kh = hash_rows(ev, self.keys)
            win, first = self._winners(ev, kh, times)
            heads = win[first]  # per distinct key (in ``win`` order), its first winner
            slot = self._index.lookup(ev, heads, kh[heads])
        found = np.flatnonzero(slot >= 0)
        flat = isinstance(self._records, FlatRowStore)
        evc = flat_columns(ev) if flat else None
        nl = found.size  # the keys' current records: rows [0, nl) of the source, events after
        live_of_key = np.full(heads.size, -1, dtype=np.int64)
        live_of_key[found] = np.arange(nl)

        # previous state of each winner: the key's current record for its first time,
        # the key's previous winner after that (``prev`` indexes live rows then events)
        prev = np.full(win.size, -1, dtype=np.int64)
        prev[first] = live_of_key
        later = np.flatnonzero(~first)
        before = win[later - 1]
        prev[later] = np.where(deleted[before], -1, nl + before)
        had = prev >= 0
        has = ~deleted[win]
        changed = had != has
        both = np.flatnonzero(had & has)
        if evc is not None:
            assert isinstance(self._records, FlatRowStore)
            src = [_flat_concat(a, b) for a, b in zip(self._records.take(slot[found]), evc, strict=True)]
            if both.size and self.values:
                same = np.ones(both.size, dtype=bool)
                for c in self._value_at:
                    same &= flat_equal_at(src[c], prev[both], evc[c], win[both])
                changed[both] = ~same
        else:
            src_tbl = pa.concat_tables([self._records.get(slot[found]), ev])
            if both.size and self.values:
                changed[both] = ~rows_equal_at(src_tbl.select(self.values), prev[both],
                                               ev.select(self.values), win[both])
        out_retract = np.flatnonzero(changed & had)
        out_insert = np.flatnonzero(changed & has)

        # retractions, then insertions; by time when the batch has several
        rows = np.concatenate((prev[out_retract], nl + win[out_insert]))  # in the source
        t_out = times[win[np.concatenate((out_retract, out_insert))]]
        diffs = np.concatenate((np.full(out_retract.size, -1, np.int64), np.ones(out_insert.size, np.int64)))
        if times.min() != times.max():
            order = np.argsort(t_out, kind="stable")
            rows, diffs, t_out = rows[order], diffs[order], t_out[order]
        if evc is not None:
            data = flat_table(flat_take(src, rows), self.schema)
        else:
            data = src_tbl.take(rows)
        out = ZSet(data, diffs, t_out.reshape(-1, 1))
        self._advance(kh, win, first, slot, changed, deleted, ev, evc)
        return out

    def _present(self) -> ZSet:
        """The current records (in no particular order), each timed at the last time processed."""
        assert self.time is not None
        records = self._records.rows()
        n = records.num_rows
        return ZSet(records, np.ones(n, dtype=np.int64), np.full((n, 1), self.time, dtype=np.int64))

    def _advance(self, kh: npt.NDArray[np.uint64] | None, win: I64, first: npt.NDArray[np.bool_], slot: I64,
                 changed: npt.NDArray[np.bool_], deleted: npt.NDArray[np.bool_], ev: pa.Table,
                 evc: list[FlatColumn] | None) -> None:
        """The state after the batch: each key's last winner decides (a key that did not
        change in the batch is left as it is). ``kh`` may be None when the key index maps
        the keys by value."""
        if first.all():  # one winner per key
            last, touched = np.arange(win.size), changed
        else:
            starts = np.flatnonzero(first)
            last = np.append(starts[1:], win.size) - 1  # per key: its last winner (index in ``win``)
            touched = np.logical_or.reduceat(changed, starts)
        gone = deleted[win[last]]
        drop = np.flatnonzero(touched & gone & (slot >= 0))
        put = np.flatnonzero(touched & ~gone)
        if drop.size:
            ids = slot[drop]
            rows = win[last[drop]]
            self._index.delete(ev, rows, None if kh is None else kh[rows], ids)
            self._records.drop(ids)
            self._slots.free(ids)
        if put.size == 0:
            return
        ids = slot[put]
        new = np.flatnonzero(ids < 0)
        if new.size:
            ids[new] = self._slots.allocate(new.size)
            rows = win[last[put[new]]]
            self._index.insert(ev, rows, None if kh is None else kh[rows], ids[new])
        if evc is not None:
            assert isinstance(self._records, FlatRowStore)
            self._records.put_columns(ids, flat_take(evc, win[last[put]]))
        else:
            self._records.put(ids, ev.take(win[last[put]]))

    def _split(self, events: pa.Table, time: int | None
               ) -> tuple[pa.Table, I64 | None, npt.NDArray[np.bool_], tuple[int, int]]:
        """Records, per-event times (None when every event is at ``time``), delete flags and
        the least and greatest time (both 0 for no events), checked."""
        n = events.num_rows
        names = events.schema.names  # a fraction of Table.column_names' cost
        if DELETE in names:
            col = events.column(DELETE)
            if not pa.types.is_boolean(col.type):
                raise SchemaError(f"column {DELETE!r} must be boolean, got {col.type}")
            deleted = _bools(col)
        else:
            deleted = np.zeros(n, dtype=bool)
        if TIME in names:
            tcol = events.column(TIME)
            if not pa.types.is_integer(tcol.type) or tcol.null_count:
                raise SchemaError(f"column {TIME!r} must be a non-null integer column, got {tcol.type}")
            times = np.asarray(tcol.to_numpy(), dtype=np.int64)
            bounds = (int(times.min()), int(times.max())) if n else (0, 0)
        elif time is not None:
            times = None  # one time: the flat step needs no array of it
            bounds = (int(time), int(time))
        else:
            raise InputError(f"upsert events need a time: pass time= or a {TIME!r} column")
        if n and (bounds[0] < 0 or (self.time is not None and bounds[0] < self.time)):
            raise InputError(
                f"upsert events at time {bounds[0]} are behind the last processed time "
                f"{self.time}: times must not go back"
            )
        reserved = [c for c in (DELETE, TIME) if c in names]
        ev = conform("upsert", self.schema, events.drop_columns(reserved) if reserved else events)
        for k in self.keys:
            nulls = ev.column(k).null_count
            if nulls:
                raise InvalidKeyError(f"upsert key column {k!r} has {nulls} null value(s)")
        return ev, times, deleted, bounds

    def _last_by_slot(self, values: I64) -> tuple[I64, I64]:
        """One time, keys by value: per distinct key its last event and its slot (-1 for a
        new key), in no particular order.

        Each event gets a stamp (stamps grow from batch to batch), and the last event per
        key is the one whose stamp ``np.maximum.at`` leaves in a scratch array (never
        reset: older batches' stamps are smaller). When the batch's keys are dense the
        array is by key value (less the batch's least) and only the winners look up their
        slots. Otherwise every event looks up its slot, mapped keys are marked by slot, and
        only the events of new keys are sorted.
        """
        n = values.size
        lo = int(values.min())
        span = int(values.max()) - lo + 1
        if span <= 4 * n + _DENSE_SLACK:  # the batch's keys are dense: mark by key value
            if self._by_key.size < span:
                self._by_key = np.full(max(span, 2 * self._by_key.size), -1, dtype=np.int64)
            at = values - lo
            stamp = np.arange(self._stamp, self._stamp + n, dtype=np.int64)
            self._stamp += n
            np.maximum.at(self._by_key, at, stamp)
            win = np.flatnonzero(self._by_key.take(at) == stamp)
            return win, self._index.lookup_values(values.take(win))
        slot_all = self._index.lookup_values(values)
        old = np.flatnonzero(slot_all >= 0)
        stamp = old + self._stamp  # event i's stamp is self._stamp + i
        self._stamp += n
        if self._last.size < self._slots.end:
            self._last = np.concatenate((self._last, np.full(max(self._slots.end, 2 * self._last.size)
                                                             - self._last.size, -1, dtype=np.int64)))
        at = slot_all.take(old)
        np.maximum.at(self._last, at, stamp)
        win_old = old[self._last.take(at) == stamp]
        new = np.flatnonzero(slot_all < 0)
        if new.size == 0:
            return win_old, slot_all[win_old]
        vn = values.take(new)
        bits = max(1, (new.size - 1).bit_length())
        if lo + span - 1 < 1 << (63 - bits):
            # each new event's key over its index among them: one sort of plain integers
            # puts equal keys together, each key's last event at the end of its run
            packed = vn << bits
            packed |= np.arange(new.size, dtype=np.int64)
            packed.sort()
            last = np.empty(new.size, dtype=bool)
            last[-1] = True
            top = packed >> bits
            np.not_equal(top[1:], top[:-1], out=last[:-1])
            win_new = new.take(packed[last] & ((1 << bits) - 1))
        else:
            order = np.argsort(vn)  # equal keys together (quicksort: faster than a stable sort)
            vs = vn.take(order)
            starts = np.empty(new.size, dtype=bool)
            starts[0] = True
            np.not_equal(vs[1:], vs[:-1], out=starts[1:])
            win_new = np.maximum.reduceat(new.take(order), np.flatnonzero(starts))
        return (np.concatenate((win_old, win_new)),
                np.concatenate((slot_all.take(win_old), np.full(win_new.size, -1, dtype=np.int64))))

    def _winners(self, ev: pa.Table, kh: npt.NDArray[np.uint64],
                 times: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        """The last event per (key, time), ordered by key then time; and which is a key's first."""
        n = ev.num_rows
        key_cols = ev.select(list(self.keys))

        def same(i: I64, j: I64) -> npt.NDArray[np.bool_]:
            return same_rows(key_cols, i, j)

        order, starts = group_equal(kh, None if self._exact else same)
        if times.min() == times.max():  # one time: the latest event per key
            win = np.maximum.reduceat(order, starts)
            return win, np.ones(win.size, dtype=bool)
        gid = np.empty(n, dtype=np.int64)
        gid[order] = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))
        o = np.lexsort((np.arange(n), times, gid))
        g, t = gid[o], times[o]
        last = np.ones(n, dtype=bool)
        last[:-1] = (g[1:] != g[:-1]) | (t[1:] != t[:-1])
        win = o[last]
        wg = gid[win]
        first = np.ones(win.size, dtype=bool)
        first[1:] = wg[1:] != wg[:-1]
        return win, first

    def _load(self, trace: Trace) -> None:
        """Start from what a given trace holds: its accumulation, one record per key."""
        held = trace.accumulate()
        if held.num_rows == 0:
            return
        bad = (held.diffs != 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"the upsert trace holds record {row_for_message(held.data, i)} with weight "
                f"{int(held.diffs[i])}; an upsert trace holds each key at most once (write it only "
                f"through this Upsert)"
            )
        kh = hash_rows(held.data, self.keys)
        key_cols = held.data.select(list(self.keys))

        def same(i: I64, j: I64) -> npt.NDArray[np.bool_]:
            return same_rows(key_cols, i, j)

        _, starts = group_equal(kh, None if self._exact else same)
        if starts.size != held.num_rows:
            raise InputError("the upsert trace holds two live values for one key; write it only through this Upsert")
        ids = self._slots.allocate(held.num_rows)
        self._records.put(ids, held.data)
        self._index.insert(held.data, np.arange(ids.size), kh, ids)
        if trace.batches:
            self.time = int(max(int(b.batch.times.max()) for b in trace.batches))  # type: ignore[union-attr]

    def validate(self) -> None:
        """Check the state (tests call this after every step):

          U1  the key map holds one entry per stored record and finds each record's slot
              by its key (so one record per key);
          U2  once the trace is published, the trace accumulated holds exactly the stored
              records, each with weight 1.

        Raises
        ------
        UpdateInvariantError
            Naming the part that disagrees, with up to ten records found in only one of
            state and trace (the trace was written by someone else, or this operator has
            a bug).
        """
        ids = self._records.ids()
        mine = self._records.get(ids)
        kh = hash_rows(mine, self.keys)
        if len(self._index) != ids.size or not np.array_equal(
                self._index.lookup(mine, np.arange(ids.size), kh), ids):
            raise UpdateInvariantError(
                "U1", f"upsert state: the key map ({len(self._index)} keys) does not find the "
                f"{ids.size} stored records at their slots")
        if self._trace is None:
            return
        held = self._trace.accumulate()
        if held.num_rows == mine.num_rows and bool((held.diffs == 1).all()):
            a = held.data.sort_by([(c, "ascending") for c in self.schema.names])
            b = mine.sort_by([(c, "ascending") for c in self.schema.names])
            if rows_equal(a, b).all():
                return
        trace_rows = set(map(_row_key, held.data.to_pylist()))
        state_rows = set(map(_row_key, mine.to_pylist()))
        only_t = sorted(trace_rows - state_rows, key=repr)[:10]
        only_s = sorted(state_rows - trace_rows, key=repr)[:10]
        raise UpdateInvariantError(
            "U2", f"upsert state and trace differ: {held.num_rows} trace records, {mine.num_rows} in the "
            f"state; only in the trace: {only_t}; only in the state: {only_s}"
        )


def _bools(col: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """A boolean column as numpy, nulls false: the bits unpacked by numpy (a third of
    Arrow's conversion) when the column is one chunk."""
    if col.null_count:
        col = col.fill_null(False)
    if col.num_chunks != 1:
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)
    arr = col.chunk(0)
    n, off = len(arr), arr.offset
    if n == 0:
        return np.zeros(0, dtype=bool)
    bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, count=off + n, bitorder="little")[off:].view(bool)


def _gather_two(a: FlatColumn, i: I64, b: FlatColumn, j: I64) -> FlatColumn:
    """``a``'s values at ``i`` followed by ``b``'s at ``j``, gathered into one array."""
    values = np.empty(i.size + j.size, dtype=a[0].dtype)
    np.take(a[0], i, out=values[:i.size])
    np.take(b[0], j, out=values[i.size:])
    if a[1] is None and b[1] is None:
        return values, None
    valid = np.ones(values.size, dtype=bool)
    if a[1] is not None:
        np.take(a[1], i, out=valid[:i.size])
    if b[1] is not None:
        np.take(b[1], j, out=valid[i.size:])
    return values, valid


def _flat_concat(a: FlatColumn, b: FlatColumn) -> FlatColumn:
    """Column ``a``'s values followed by ``b``'s."""
    values = np.concatenate((a[0], b[0]))
    if a[1] is None and b[1] is None:
        return values, None
    valid = [np.ones(x[0].size, dtype=bool) if x[1] is None else x[1] for x in (a, b)]
    return values, np.concatenate(valid)


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.values())
