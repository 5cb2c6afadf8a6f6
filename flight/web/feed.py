"""One live table as a stream of *changes* keyed by row key: what a Perspective table needs.

Perspective keeps a table by an *index* column: ``update`` upserts rows by index and
``remove`` drops index values. A :class:`TableFeed` turns a server table into that: a
first :class:`Change` holding every row (the snapshot), then one per run of updates
holding the rows to upsert (added, modified, and moved by a shift, with their current
values) and the row keys to remove. The row key travels as an extra column,
:data:`ROW_KEY`, which is the Perspective table's index.

Key spaces. A composed update ``u`` leads from the row set ``prev`` to the current one,
``cur``. Perspective holds ``prev``'s keys. A shift moves surviving rows to new keys:
those rows are upserted at their current key and their previous key is removed unless
some row holds it now. So ``remove = (u.removed | moved_prev) - cur`` and ``upsert =
u.added | u.modified | moved_cur``: the cost follows the change, never the table.

Threads. The update cycle calls :meth:`TableFeed.on_table_update` (through the table's
:class:`~flight.streams.registry.Publisher`), which only queues the update in the feed's
:class:`~flight.streams.pending.PendingUpdates`: the cycle never waits for a browser. The
feed's own thread takes what is queued as one composed update (updates never change, so
without the graph's lock), then takes the graph's shared lock, which no cycle runs under,
only to add what cycles queued meanwhile and read the rows it must send, releases it and
hands the :class:`Change` to its ``deliver`` callback. While ``deliver`` runs (a slow
browser, a busy Perspective engine) updates keep queuing; past ``max_pending`` the cycle
composes each new one into the newest queued (exact :func:`~engine.update.compose`, one
per cycle), so a slow consumer costs at most ``max_pending`` updates of memory and
receives fewer, larger changes:
:attr:`TableFeed.coalesced` counts the updates that never travelled on their own. With ``min_interval``, a change is built
at most that often (what arrives in between is composed): a screen shows a value for a few
frames at least, and the per-change cost of the consumer (Perspective's engine, the
viewers' redraws) stops growing with the cycle rate.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.rowset import RowSet
from engine.update import TableUpdate
from flight.streams.pending import PendingUpdates
from flight.streams.registry import HistoryEntry, TableEntry
from flight.wire import ROW_KEY

__all__ = ["FEEDS", "ROW_KEY", "SNAPSHOT_CHUNK_ROWS", "Change", "TableFeed", "conform",
           "perspective_schema", "split_snapshot", "to_ipc"]

log = logging.getLogger(__name__)

#: The two ways to feed a grid (``perspective``, the default, and ``arrow``).
FEEDS = ("perspective", "arrow")
#: Rows per part of a large snapshot (the first part is the snapshot, the rest upserts).
SNAPSHOT_CHUNK_ROWS = 500_000


#: The nice value of the web path's threads (feeds, Perspective's engine, the HTTP loop).
WEB_NICE = 10


def lower_priority() -> None:
    """Run the calling thread at :data:`WEB_NICE` (Linux: threads have nice values of their
    own): when the cores are busy, the update cycle goes before the web path, which only
    composes more while it waits."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WEB_NICE)
        except OSError:  # not allowed here: the thread keeps its priority
            pass


@dataclass(frozen=True, slots=True)
class Change:
    """What a Perspective table keyed by :data:`ROW_KEY` must do to reach one step.

    Attributes
    ----------
    snapshot
        True for the first change (``upserts`` holds every row; nothing to remove).
    upserts
        Rows to insert or overwrite, in :func:`perspective_schema`, :data:`ROW_KEY` first.
    removes
        Row keys to drop (int64), none of them in ``upserts``.
    step, sequence
        The graph step and the publisher's sequence number this change reaches.
    updates
        How many table updates it covers (0 for a snapshot, more than 1 when coalesced).
    size
        Rows in the table at that step.
    """

    snapshot: bool
    upserts: pa.Table
    removes: npt.NDArray[np.int64]
    step: int
    sequence: int
    updates: int
    size: int


def perspective_schema(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema of a table's rows as sent to Perspective (:data:`ROW_KEY` first).

    Perspective reads integers, floats, booleans, strings, dates and timestamps; other
    types travel as text (decimals as float64), and dictionary columns decoded.
    """
    fields = [pa.field(ROW_KEY, pa.int64(), nullable=False)]
    for f in schema:
        fields.append(pa.field(f.name, _perspective_type(f.type)))
    return pa.schema(fields)


def _perspective_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        return _perspective_type(t.value_type)
    if pa.types.is_boolean(t) or pa.types.is_floating(t):
        return pa.float64() if pa.types.is_float16(t) else t
    if pa.types.is_unsigned_integer(t):
        return pa.float64() if t.bit_width == 64 else pa.int64()
    if pa.types.is_integer(t):
        return t
    if pa.types.is_decimal(t):
        return pa.float64()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_date(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        return t
    return pa.string()


def conform(rows: pa.Table, keys: npt.NDArray[np.int64], schema: pa.Schema) -> pa.Table:
    """``rows`` (values at ``keys``) in ``schema`` (:func:`perspective_schema`): the row key
    column first, types cast. Also the notebook grid's (:mod:`clients.notebook`)."""
    arrays: list[pa.Array | pa.ChunkedArray] = [pa.array(keys, pa.int64())]
    for f in list(schema)[1:]:
        col = rows.column(f.name)
        if not col.type.equals(f.type):
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                # no Arrow cast to text (lists, structs...): Python's own rendering
                col = pa.array([None if v is None else str(v) for v in col.to_pylist()],
                               pa.string())
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def split_snapshot(change: Change, rows: int = SNAPSHOT_CHUNK_ROWS,
                   first_rows: int | None = None) -> list[Change]:
    """A large snapshot as a snapshot of its first rows and upserts of the rest, ``rows``
    rows each (``first_rows`` in the first part, when given).

    A viewer draws the first rows while the others arrive, and no message or Perspective
    call is larger than a chunk (a browser holds a message whole, twice, while it decodes
    it; Perspective's thread serves viewers between two chunks).
    """
    n = change.upserts.num_rows
    first = rows if first_rows is None else first_rows
    if not change.snapshot or n <= first:
        return [change]
    starts = [0, *range(first, n, rows)]
    return [Change(i == 0, change.upserts.slice(s, (starts[i + 1] if i + 1 < len(starts)
                                                    else n) - s),
                   change.removes, change.step, change.sequence, change.updates, change.size)
            for i, s in enumerate(starts)]


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream (what Perspective's ``table``/``update`` read)."""
    out: bytes = ipc_buffer(table).to_pybytes()
    return out


def ipc_buffer(table: pa.Table) -> pa.Buffer:
    """:func:`to_ipc` without copying the stream into ``bytes``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


class TableFeed:
    """Turns one table's updates into :class:`Change` s, on a thread of its own.

    Parameters
    ----------
    entry
        The server table to follow.
    deliver
        Called on the feed's thread with each change, in order (the snapshot first).
        It may block: updates meanwhile are composed into the next change.
    max_pending
        Updates queued before the cycle composes them into one.
    on_failure
        Called once on the feed's thread when the table fails or is dropped (then the
        feed stops).
    min_interval
        Seconds from the start of one change's delivery to the building of the next (0:
        as soon as an update arrives).
    """

    def __init__(self, entry: TableEntry, deliver: Callable[[Change], None], *,
                 max_pending: int = 16,
                 on_failure: Callable[[BaseException], None] | None = None,
                 min_interval: float = 0.0) -> None:
        self.entry = entry
        self.table = entry.table
        self.graph = entry.table.graph
        self.schema = perspective_schema(self.table.schema)
        self._deliver = deliver
        self._on_failure = on_failure
        self._min_interval = min_interval
        self._cond = threading.Condition()
        self._pending = PendingUpdates(max_pending)
        self._failure: BaseException | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        #: table updates that never travelled on their own (composed with others)
        self.coalesced = 0
        #: changes delivered, the snapshot included
        self.changes = 0
        #: seconds the feed's thread spent building changes
        self.build_seconds = 0.0

    def start(self) -> TableFeed:
        """Start the feed's thread: the snapshot, then a change per run of updates."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ticktable-web-feed:{self.entry.name[:40]}")
        self._thread.start()
        return self

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop following the table (a ``deliver`` in progress finishes first)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        publisher = self.entry.publisher
        if publisher is not None:
            publisher.unsubscribe(self)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ------------------------------------------------------ the cycle's side (sink)
    def on_table_update(self, entry: HistoryEntry) -> None:
        with self._cond:
            self._pending.append(entry)  # one compose per cycle past max_pending
            self._cond.notify()

    def on_table_failure(self, exc: BaseException) -> None:
        with self._cond:
            self._failure = exc
            self._cond.notify()

    # ----------------------------------------------------------------- the thread
    def _run(self) -> None:
        lower_priority()
        publisher = self.entry.publisher
        assert publisher is not None
        try:
            t0 = time.thread_time()
            with self.graph.shared_lock():
                self.table.check_alive()
                first = self._snapshot(publisher.sequence)
                publisher.subscribe(self)
            self.build_seconds += time.thread_time() - t0
            due = time.monotonic() + self._min_interval
            self._deliver(first)
            self.changes += 1
            while True:
                with self._cond:
                    while not (self._pending or self._failure or self._closed):
                        self._cond.wait()
                    while not self._closed and (wait := due - time.monotonic()) > 0:
                        self._cond.wait(wait)  # updates arriving meanwhile join this change
                    if self._closed:
                        return
                    if self._failure is not None and not self._pending:
                        raise self._failure
                t0 = time.thread_time()
                run = self._pending.take()  # composed: updates never change, no lock needed
                assert run is not None  # only this thread takes
                with self.graph.shared_lock():  # no cycle runs while it is held
                    more = self._pending.take()  # what cycles added meanwhile (no more now)
                    if more is not None:
                        run = run.then(more)
                    e = run.entry
                    change = self._delta(e.update, e.prev, e.sequence, run.count)
                self.build_seconds += time.thread_time() - t0
                self.coalesced += run.count - 1
                due = time.monotonic() + self._min_interval
                self._deliver(change)
                self.changes += 1
        except Exception as exc:  # a failed or dropped table, or a broken consumer
            if self._closed:
                return
            if self._on_failure is not None:
                self._on_failure(exc)
            else:
                log.warning("web feed of table %r stopped: %s", self.entry.name, exc)
        finally:
            publisher.unsubscribe(self)

    def _snapshot(self, sequence: int) -> Change:
        """Under the shared lock: every row."""
        rs = self.table.rowset
        keys = rs.keys()
        if rs and rs.last() - rs.first() + 1 == len(rs):  # dense keys: ranges, no gather
            rows = pa.Table.from_arrays(
                [self.table.column(n).get_range(rs.first(), rs.last() + 1)
                 for n in self.table.column_names], schema=self.table.schema)
        else:
            rows = self.table.rows(keys)
        return Change(True, conform(rows, keys, self.schema), np.empty(0, np.int64),
                      self.graph.step, sequence, 0, len(keys))

    def _delta(self, update: TableUpdate, prev: RowSet, sequence: int, count: int) -> Change:
        """Under the shared lock: the change ``update`` made from ``prev`` to the current
        state. Only reading the rows needs the lock; the rest is small row-set algebra."""
        cur = self.table.rowset
        removed = update.removed
        upsert = update.added | update.modified
        if update.shifted:
            moved_prev, moved_cur = update.shifted.moved_keys(prev - update.removed)
            if moved_prev.size:
                removed = removed | RowSet.from_keys(moved_prev, assume_sorted=True)
                upsert = upsert | RowSet.from_keys(moved_cur, assume_sorted=True)
        keys = upsert.keys()
        rows = self.table.rows(keys)
        return Change(False, conform(rows, keys, self.schema), (removed - cur).keys(),
                      self.graph.step, sequence, count, len(cur))

