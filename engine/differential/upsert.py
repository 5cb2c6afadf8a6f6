"""Upserts to triples: ``(key, Optional[value])`` events become ``(record, time, diff)``
(seed 000).

An upsert names a key and its new value, or no value (a delete). Turning it into
differential updates needs the key's current value: a change retracts the old record
(``-1``) and inserts the new one (``+1``). Repeating the current value, or deleting an
absent key, says nothing and produces nothing.

The current values are read from the **arrangement the output is written to**: a
:class:`Trace` of the output collection keyed by the key columns, which other operators
may share (``upsert.trace.reader()``); the operator keeps no private copy of the state.
As in seed 000's arrangement-based operator, events of one batch are sorted by key and
time, the last event per (key, time) wins, and each key's distinct times are walked in
order from the value found in the trace, all vectorized (numpy over the events, one
``searchsorted`` per trace batch for the lookups).

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
from engine.differential.indexed import exact_records
from engine.differential.trace import Trace
from engine.differential.version import Antichain, Version
from engine.differential.zset import TIME, ZSet
from engine.errors import InputError, InvalidKeyError, SchemaError
from engine.reserved import DELETE
from engine.sources import as_schema, conform

__all__ = ["DELETE", "Upsert"]

I64 = npt.NDArray[np.int64]


class Upsert:
    """Turns batches of upsert events into consolidated triples, keeping a keyed trace.

    Parameters
    ----------
    schema
        The record columns (keys and values).
    keys
        The key column(s).
    trace
        The arrangement to read and write (keyed by ``keys``, one-coordinate times). A new
        one is made when omitted; pass the collection's existing arrangement to share it.

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
        if trace is None:
            trace = Trace(self.schema, self.keys, dims=1)
        elif trace.keys != self.keys or trace.dims != 1 or not trace.schema.equals(self.schema):
            raise SchemaError(
                f"the trace (keys {list(trace.keys)}, {trace.dims}-coordinate times, {trace.schema}) "
                f"does not fit the upsert (keys {list(self.keys)}, 1-coordinate times, {self.schema})"
            )
        self.trace = trace
        self._reader = trace.reader()
        self._exact = exact_hash(self.schema, self.keys)
        self._exact_records = exact_records(self.schema, self.keys)
        self.time: int | None = None

    def step(self, events: pa.Table, time: int | None = None) -> ZSet:
        """Apply a batch of events; return their triples (also inserted into the trace).

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
        ev, times, deleted = self._split(events, time)
        n = ev.num_rows
        if n == 0:
            return ZSet.empty(self.schema, 1)
        win, first = self._winners(ev, times)
        live, live_of_key = self._current(ev.select(list(self.keys)).take(win[first]))

        # previous state of each winner: the trace's value for the key's first time,
        # the key's previous winner after that (``src`` indexes live rows then events)
        src_tbl = pa.concat_tables([live, ev])
        prev = np.full(win.size, -1, dtype=np.int64)
        prev[first] = live_of_key
        later = np.flatnonzero(~first)
        before = win[later - 1]
        prev[later] = np.where(deleted[before], -1, live.num_rows + before)
        had = prev >= 0
        has = ~deleted[win]
        changed = had != has
        both = np.flatnonzero(had & has)
        if both.size and self.values:
            changed[both] = ~rows_equal_at(src_tbl.select(self.values), prev[both],
                                           ev.select(self.values), win[both])
        out_retract = np.flatnonzero(changed & had)
        out_insert = np.flatnonzero(changed & has)

        # retractions, then insertions; by time when the batch has several
        t_out = times[win[np.concatenate((out_retract, out_insert))]]
        data = pa.concat_tables([src_tbl.take(prev[out_retract]), ev.take(win[out_insert])])
        diffs = np.concatenate((np.full(out_retract.size, -1, np.int64), np.ones(out_insert.size, np.int64)))
        if times.min() != times.max():
            order = np.argsort(t_out, kind="stable")
            data, diffs, t_out = data.take(order), diffs[order], t_out[order]
        out = ZSet(data, diffs, t_out.reshape(-1, 1))
        self.trace.insert(out)
        self.time = int(times.max())
        # this operator will only ask about the present from now on
        self._reader.set_logical_compaction(Antichain([Version(self.time)]))
        return out

    def _split(self, events: pa.Table, time: int | None) -> tuple[pa.Table, I64, npt.NDArray[np.bool_]]:
        """Records, per-event times and delete flags, checked."""
        n = events.num_rows
        if DELETE in events.column_names:
            col = events.column(DELETE)
            if not pa.types.is_boolean(col.type):
                raise SchemaError(f"column {DELETE!r} must be boolean, got {col.type}")
            deleted = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        else:
            deleted = np.zeros(n, dtype=bool)
        if TIME in events.column_names:
            tcol = events.column(TIME)
            if not pa.types.is_integer(tcol.type) or tcol.null_count:
                raise SchemaError(f"column {TIME!r} must be a non-null integer column, got {tcol.type}")
            times = np.asarray(tcol.to_numpy(), dtype=np.int64)
        elif time is not None:
            times = np.full(n, int(time), dtype=np.int64)
        else:
            raise InputError(f"upsert events need a time: pass time= or a {TIME!r} column")
        if n and (times.min() < 0 or (self.time is not None and times.min() < self.time)):
            raise InputError(
                f"upsert events at time {int(times.min())} are behind the last processed time "
                f"{self.time}: times must not go back"
            )
        ev = conform("upsert", self.schema,
                     events.drop_columns([c for c in (DELETE, TIME) if c in events.column_names]))
        for k in self.keys:
            nulls = ev.column(k).null_count
            if nulls:
                raise InvalidKeyError(f"upsert key column {k!r} has {nulls} null value(s)")
        return ev, times, deleted

    def _winners(self, ev: pa.Table, times: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        """The last event per (key, time), ordered by key then time; and which is a key's first."""
        n = ev.num_rows
        kh = hash_rows(ev, self.keys)
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

    def _current(self, probe: pa.Table) -> tuple[pa.Table, I64]:
        """The live record of each probe key in the trace: ``(records, row per key or -1)``."""
        found = self.trace.lookup(probe.select(list(self.keys)))
        live_of_key = np.full(probe.num_rows, -1, dtype=np.int64)
        if len(found) == 0:
            return self.schema.empty_table(), live_of_key

        def same(i: I64, j: I64) -> npt.NDArray[np.bool_]:
            if self._exact_records:  # one key: equal record hashes are equal values
                return found.probe[i] == found.probe[j]  # type: ignore[no-any-return]
            # records are gathered only for entries whose hash matches another's
            recs = found.records(np.concatenate((i, j)))
            return rows_equal(recs.slice(0, i.size), recs.slice(i.size))

        order, starts = group_equal(found.rec_hash, same)
        sums = np.add.reduceat(found.diffs[order], starts)
        bad = (sums != 0) & (sums != 1)
        if bad.any():
            entry = int(order[starts[np.flatnonzero(bad)[0]]])
            raise InputError(
                f"the upsert trace holds record {row_for_message(found.records([entry]), 0)} with weight "
                f"{int(sums[bad][0])}; an upsert trace holds each key at most once (write it only "
                f"through this Upsert)"
            )
        reps = np.minimum.reduceat(order, starts)[sums == 1]
        keys_of = found.probe[reps]
        if keys_of.size and np.bincount(keys_of).max() > 1:
            raise InputError("the upsert trace holds two live values for one key; write it only through this Upsert")
        live_of_key[keys_of] = np.arange(reps.size)
        return found.records(reps), live_of_key
