"""Ingestion: DoPut streams into source tables, staged writes, commit and abort (DESIGN.md §5).

A DoPut names a source table and a :class:`~flight.pb.flight_pb2.PutMode`; every record
batch is checked against the table (:func:`engine.sources.conform`) and acknowledged. A bad
batch raises and nothing of it is applied; the batches before it stay.

Modes (the last column names are reserved):

* ``APPEND`` — append and ring tables: rows are appended.
* ``UPSERT`` — keyed tables: insert-or-update by key; a bool column ``__delete`` (null means
  false) marks rows whose key is deleted instead. Inside one batch the last row per key
  decides, whether upsert or delete.
* ``DELETE`` — keyed tables: batches carry exactly the key columns.
* ``DIFF`` — keyed tables: differential triples, the table's columns plus an int64 weight
  ``__diff`` (an optional ``__time`` column is accepted and ignored). A batch is one
  transaction: its weights are summed per row, and per key the net effect must be a valid
  change of the key's current row — a ``-1`` of the current row and a ``+1`` of a new row
  (an update), a lone ``-1`` of the current row (a delete), a lone ``+1`` for an absent key
  (an insert). Anything else (retracting a row the key does not hold, two rows for one key,
  a net weight other than ``+1``/``-1``) raises :class:`~engine.errors.InputError` and
  applies nothing of the batch. The check needs the key's current row *including* writes
  staged for the next cycle, so when the table has pending writes they are applied first by
  running a cycle, under the graph's exclusive lock (see :meth:`Ingestor.put`).

Without a ``write_id`` a batch is staged into its table at once and is visible after the
next cycle. With one, the checked batch is held by the :class:`Ingestor` in the stage slot
``(write_id, partition, attempt)`` and is invisible until :meth:`Ingestor.commit` publishes
the chosen slots — all of them staged while holding the graph's exclusive lock, so one cycle
applies them all, across tables. The other slots of the write (failed task attempts) are
dropped. A commit returns once the cycle that applies it has finished when the graph runs
periodically (``CommitResult.step`` is that cycle); in manual mode it returns at once with the
step of the next cycle. Streaming micro-batches ``(stream_id, batch_id)`` are applied once;
the last batch id per stream and the results of committed write ids (for ``stage_ttl``) are
kept in memory, so a restarted server forgets them.

Locking: every staging into a table happens under the graph's shared lock, so a DIFF check
or a commit, which hold the exclusive lock, sees no staging interleaved with it. The
Ingestor's own mutex is held only briefly and never while taking the graph's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._hashing import exact_hash, group_equal, hash_rows, rows_equal, same_rows
from engine.differential.translator import _current_rows
from engine.differential.upsert import DELETE
from engine.differential.zset import DIFF, TIME
from engine.errors import InputError, InvalidKeyError, Overloaded, SchemaError
from engine.graph import UpdateGraph
from engine.sources import AppendOnlyTable, KeyedTable, RingTable, conform
from flight.pb import flight_pb2 as pb
from flight.registry import TableEntry, TableRegistry

__all__ = ["Ingestor"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]

_MODE_NAMES: dict[int, str] = {
    pb.PUT_MODE_APPEND: "append",
    pb.PUT_MODE_UPSERT: "upsert",
    pb.PUT_MODE_DELETE: "delete",
    pb.PUT_MODE_DIFF: "diff",
}


@dataclass(slots=True)
class _Part:
    """One checked write, ready to stage: ``kind`` is append, upsert, delete or diff."""

    table: str
    kind: str
    data: pa.Table
    diffs: I64 | None = None  # the weights of a diff part

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + (self.diffs.nbytes if self.diffs is not None else 0)


@dataclass(slots=True)
class _Slot:
    parts: list[_Part] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0


@dataclass(slots=True)
class _Write:
    slots: dict[tuple[int, int], _Slot] = field(default_factory=dict)
    touched: float = 0.0
    committing: bool = False

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slots.values())


class Ingestor:
    """Writes DoPut streams into the registry's source tables; holds staged writes.

    Thread-safe: each DoPut stream runs :meth:`put` on its own thread.

    Parameters
    ----------
    registry
        The server's tables.
    stage_ttl
        Seconds after its last batch an uncommitted write is dropped by :meth:`expire`.
        Committed write ids are remembered as long, so a retried commit is not re-applied.
    max_staged_bytes
        Bound on the bytes held by all uncommitted writes; a batch that would pass it is
        refused with :class:`~engine.errors.Overloaded`.
    commit_timeout
        How long :meth:`commit` waits for the cycle that applies the commit.
    """

    def __init__(self, registry: TableRegistry, *, stage_ttl: float = 600.0,
                 max_staged_bytes: int = 4 << 30, commit_timeout: float = 60.0) -> None:
        self.registry = registry
        self.graph: UpdateGraph = registry.graph
        self.stage_ttl = stage_ttl
        self.max_staged_bytes = max_staged_bytes
        self.commit_timeout = commit_timeout
        self._lock = threading.Lock()  # guards the fields below; never held while waiting
        self._commit_lock = threading.Lock()
        self._writes: dict[str, _Write] = {}
        self._staged_bytes = 0
        self._committed: dict[str, tuple[float, pb.CommitResult]] = {}
        self._aborted: dict[str, float] = {}  # write id -> when (forgotten after stage_ttl)
        self._stream_batches: dict[str, int] = {}
        self._cycle_done = threading.Condition()
        self._last_step = self.graph.step
        self._remove_terminal = self.graph.add_terminal_listener(self._on_cycle_end)
        self._janitor: threading.Thread | None = None
        self._janitor_stop = threading.Event()

    # DoPut ------------------------------------------------------------------------------
    def put(self, table_name: str, request: pb.PutRequest, batches: Iterable[pa.RecordBatch],
            ack: Callable[[pb.PutAck], None]) -> int:
        """Consume one DoPut stream; returns the number of rows received.

        Each batch is checked, then staged into the table (no ``write_id``: visible after
        the next cycle) or held in the stage slot ``(write_id, partition, attempt)``, then
        acknowledged with ``ack`` (``batch_index`` from 0, its ``rows``, ``total_rows`` so far,
        ``staged``).

        A DIFF batch without ``write_id`` is checked and staged while holding the graph's
        exclusive lock; if the table has pending writes, a cycle is run first (on this
        thread) so the check sees them. Consecutive DIFF batches therefore compose exactly.

        Parameters
        ----------
        table_name
            A source table of the registry.
        request
            The stream's first ``app_metadata``: mode and optional stage slot.
        batches
            The stream's record batches.
        ack
            Called once per batch, after it was applied or held.

        Raises
        ------
        TableNotFound
            If there is no such table.
        InputError
            If the mode does not fit the table (e.g. APPEND into a keyed table), or a DIFF
            batch is not a valid change of the table; :class:`SchemaError` for columns that
            are missing, unknown or mistyped; :class:`InvalidKeyError` for null keys.
        Overloaded
            If holding a staged batch would pass ``max_staged_bytes``.
        TableFailed
            If the table failed in an earlier cycle.
        """
        entry = self.registry.get(table_name)
        kind = _check_mode(entry, request.mode)
        staged = bool(request.write_id)
        slot = (int(request.partition), int(request.attempt))
        total = 0
        for index, batch in enumerate(batches):
            parts = _check_batch(entry, kind, batch)
            if staged:
                self._hold(request.write_id, slot, parts, batch.num_rows)
            elif kind == "diff":
                self._apply_diff_now(entry, parts)
            elif len(parts) == 1:  # the table's own pending lock makes one part atomic
                _stage(entry, parts)
            else:
                with self.graph.shared_lock():  # one cycle takes all parts; no commit in between
                    _stage(entry, parts)
            total += batch.num_rows
            ack(pb.PutAck(batch_index=index, rows=batch.num_rows, total_rows=total, staged=staged))
        return total

    def _apply_diff_now(self, entry: TableEntry, parts: list[_Part]) -> None:
        with self.graph.exclusive_lock():
            if _pending_rows(entry):
                self.graph.run_cycle()  # the check must see the writes staged before
            _stage(entry, _resolve_diff(entry, parts))
        self.graph.request_cycle()

    def _hold(self, write_id: str, slot: tuple[int, int], parts: list[_Part], rows: int) -> None:
        nbytes = sum(p.nbytes for p in parts)
        with self._lock:
            if write_id in self._committed:
                raise InputError(f"write {write_id!r} was already committed; use a new write_id")
            if write_id in self._aborted:
                raise InputError(f"write {write_id!r} was aborted; its batches are refused, use a "
                                 f"new write_id")
            write = self._writes.get(write_id)
            if write is not None and write.committing:
                raise InputError(f"write {write_id!r} is being committed; use a new write_id")
            if self._staged_bytes + nbytes > self.max_staged_bytes:
                raise Overloaded(
                    f"staged writes hold {self._staged_bytes} bytes and this batch needs {nbytes} "
                    f"more (limit {self.max_staged_bytes}); commit or abort open writes, or retry "
                    f"later")
            if write is None:
                write = self._writes[write_id] = _Write()
            s = write.slots.setdefault(slot, _Slot())
            s.parts.extend(parts)
            s.rows += rows
            s.nbytes += nbytes
            write.touched = time.monotonic()
            self._staged_bytes += nbytes

    # DoAction ---------------------------------------------------------------------------
    def commit(self, request: pb.CommitRequest, *, wait: bool | None = None) -> pb.CommitResult:
        """Publish the chosen slots of a staged write atomically, in one cycle.

        The chosen slots (``slots``, or every slot with ``all_slots``) are staged into their
        tables in (partition, attempt) order while holding the graph's exclusive lock, so the
        next cycle applies all of them; the write's other slots are dropped. DIFF parts are
        checked now, against the tables' current rows: the DIFF parts of one table in one
        commit are summed into one batch (partitions have no order), and a commit may not mix
        DIFF with other modes for one table. On any error nothing is published and the write
        stays open (abort it, or let it expire).

        With ``stream_id`` and ``has_batch`` the commit is a streaming micro-batch: if
        ``batch_id`` is not above the last one committed for ``stream_id``, the stages are
        dropped and the result says ``applied=False``. A retried commit of a write id that
        was already committed is answered the same way. An unknown write id with no slots
        named commits nothing (an empty write).

        Parameters
        ----------
        request
            The commit.
        wait
            Wait for the cycle that applies the commit and report its step (``None``: wait
            when the graph runs periodically; tests driving ``run_cycle`` do not wait, and
            get the step of that next cycle).

        Returns
        -------
        pb.CommitResult
            ``rows`` published, ``applied``, and ``step``: the cycle that makes it visible.

        Raises
        ------
        InputError
            A named slot was never written, or a DIFF part is not a valid change of its table; :class:`TableNotFound` if a
            table was dropped meanwhile.
        """
        write_id = request.write_id
        with self._commit_lock:  # one commit at a time: stream batch ids are checked, then set
            result, n_slots = self._commit_locked(request)
        if result.applied:
            log.info("committed write %r: %d slot(s), %d rows, step %d", write_id, n_slots,
                     result.rows, result.step)
            if self._graph_is_periodic() if wait is None else wait:
                self._wait_for_step(result.step)
        return result

    def _commit_locked(self, request: pb.CommitRequest) -> tuple[pb.CommitResult, int]:
        write_id = request.write_id
        with self._lock:
            if write_id in self._aborted:
                raise InputError(f"write {write_id!r} was aborted; nothing of it can be committed, "
                                 f"write again with a new write_id")
            done = self._committed.get(write_id)
            if done is not None:
                return pb.CommitResult(rows=done[1].rows, applied=False, step=done[1].step), 0
            if request.has_batch and self._stream_batches.get(request.stream_id, -1) >= request.batch_id:
                dropped = self._drop_locked(write_id)
                log.info("commit of write %r: batch %d of stream %r was already applied; "
                         "%d slot(s) dropped", write_id, request.batch_id, request.stream_id, dropped)
                return pb.CommitResult(rows=0, applied=False, step=self.graph.step), 0
            write = self._writes.get(write_id)
            have = write.slots if write is not None else {}
            if request.all_slots:
                chosen = sorted(have)
            else:
                chosen = sorted({(int(s.partition), int(s.attempt)) for s in request.slots})
                missing = [c for c in chosen if c not in have]
                if missing:
                    raise InputError(
                        f"write {write_id!r} has no slot(s) {_slot_names(missing)} (has: "
                        f"{_slot_names(sorted(have)) or 'none'}); commit only slots that were "
                        f"written")
            parts = [p for c in chosen for p in have[c].parts]
            rows = sum(have[c].rows for c in chosen)
            if write is not None:
                write.committing = True
        try:
            step = self._publish(parts)
        except BaseException:
            with self._lock:
                if write is not None:
                    write.committing = False
            raise
        result = pb.CommitResult(rows=rows, applied=True, step=step)
        with self._lock:
            self._drop_locked(write_id)
            self._committed[write_id] = (time.monotonic(), result)
            if request.has_batch:
                self._stream_batches[request.stream_id] = request.batch_id
        return result, len(chosen)

    def _publish(self, parts: list[_Part]) -> int:
        """Stage ``parts`` in one critical section; returns the step of the cycle applying them."""
        if not parts:
            return self.graph.step
        names = list(dict.fromkeys(p.table for p in parts))
        with self.graph.exclusive_lock():
            entries = {n: self.registry.get(n) for n in names}
            for e in entries.values():
                e.table._check_alive()
            diff_tables = {p.table for p in parts if p.kind == "diff"}
            mixed = sorted(n for n in diff_tables
                           if any(p.table == n and p.kind != "diff" for p in parts))
            if mixed:
                raise InputError(f"table(s) {mixed}: a commit cannot mix diff writes with other "
                                 f"modes for one table; commit them in separate writes")
            if any(_pending_rows(entries[n]) for n in diff_tables):
                self.graph.run_cycle()  # the diff check must see the writes staged before
            resolved: list[tuple[TableEntry, list[_Part]]] = []
            for n in names:  # check everything before staging anything
                mine = [p for p in parts if p.table == n]
                resolved.append((entries[n], _resolve_diff(entries[n], mine) if n in diff_tables
                                 else mine))
            for e, ps in resolved:
                _stage(e, ps)
            step = self.graph.step + 1  # the next cycle takes every pending write
        self.graph.request_cycle()
        return step

    def abort(self, request: pb.AbortRequest) -> int:
        """Drop every slot of a staged write; returns how many were dropped (0 if unknown)."""
        with self._lock:
            n = self._drop_locked(request.write_id)
            self._aborted[request.write_id] = time.monotonic()  # late batches are refused
        if n:
            log.info("aborted write %r: %d slot(s) dropped", request.write_id, n)
        return n

    def _drop_locked(self, write_id: str) -> int:
        write = self._writes.pop(write_id, None)
        if write is None:
            return 0
        self._staged_bytes -= write.nbytes
        return len(write.slots)

    # housekeeping -----------------------------------------------------------------------
    def expire(self, now: float | None = None) -> int:
        """Drop writes with no batch for ``stage_ttl`` seconds; returns the slots dropped.

        ``now`` is a :func:`time.monotonic` reading (the current one by default).
        """
        now = time.monotonic() if now is None else now
        dropped = 0
        with self._lock:
            stale = [w for w, s in self._writes.items()
                     if not s.committing and now - s.touched > self.stage_ttl]
            for w in stale:
                dropped += self._drop_locked(w)
            for w in [w for w, (t, _) in self._committed.items() if now - t > self.stage_ttl]:
                del self._committed[w]
            for w in [w for w, t in self._aborted.items() if now - t > self.stage_ttl]:
                del self._aborted[w]
        if stale:
            log.warning("expired %d abandoned write(s) (%d slot(s)): %s", len(stale), dropped,
                        ", ".join(map(repr, stale[:10])))
        return dropped

    def start_janitor(self, interval: float = 30.0) -> None:
        """Call :meth:`expire` every ``interval`` seconds on a background thread."""
        if self._janitor is not None:
            raise RuntimeError("the janitor is already running")
        self._janitor_stop.clear()

        def loop() -> None:
            while not self._janitor_stop.wait(interval):
                try:
                    self.expire()
                except Exception:
                    log.exception("expiring staged writes failed")

        self._janitor = threading.Thread(target=loop, name="ticktable-stage-janitor", daemon=True)
        self._janitor.start()

    def stop(self) -> None:
        """Stop the janitor and stop listening to the graph (at shutdown)."""
        self._janitor_stop.set()
        if self._janitor is not None:
            self._janitor.join()
            self._janitor = None
        self._remove_terminal()

    @property
    def open_stages(self) -> int:
        """Slots held by uncommitted writes."""
        with self._lock:
            return sum(len(w.slots) for w in self._writes.values())

    @property
    def staged_bytes(self) -> int:
        """Bytes held by uncommitted writes."""
        with self._lock:
            return self._staged_bytes

    # waiting for a cycle ------------------------------------------------------------------
    def _on_cycle_end(self, step: int) -> None:
        with self._cycle_done:
            self._last_step = step
            self._cycle_done.notify_all()

    def _graph_is_periodic(self) -> bool:
        # UpdateGraph has no public "running" flag (yet): its cycle thread says it
        return self.graph.running

    def _wait_for_step(self, step: int) -> None:
        with self._cycle_done:
            ok = self._cycle_done.wait_for(lambda: self._last_step >= step, self.commit_timeout)
        if not ok:
            log.warning("commit: cycle %d did not finish within %.1f s; the write is staged and "
                        "will be applied", step, self.commit_timeout)


# checking batches ---------------------------------------------------------------------------
def _check_mode(entry: TableEntry, mode: int) -> str:
    """The write kind for ``mode`` on ``entry``, or an InputError saying which mode fits."""
    name = _MODE_NAMES.get(mode)
    if name is None:
        raise InputError(f"unknown put mode {mode} for table {entry.name!r}")
    table = entry.table
    if isinstance(table, KeyedTable):
        if name == "append":
            raise InputError(
                f"table {entry.name!r} is keyed by {table.keys}: write it with PUT_MODE_UPSERT "
                f"(or DELETE / DIFF), not APPEND")
        return name
    if isinstance(table, AppendOnlyTable | RingTable):
        if name != "append":
            raise InputError(
                f"table {entry.name!r} is an {entry.kind} table without keys: write it with "
                f"PUT_MODE_APPEND ({name} needs a keyed table)")
        return name
    raise InputError(f"table {entry.name!r} is a {entry.kind} table, not a source table; only "
                     f"source tables (append, keyed, ring) take writes")


def _as_table(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    return batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])


def _check_batch(entry: TableEntry, kind: str, batch: pa.RecordBatch) -> list[_Part]:
    """Check one batch and turn it into parts to stage together (nothing is staged here)."""
    name, table = entry.name, entry.table
    data = _as_table(batch)
    if kind == "append":
        return [_Part(name, "append", conform(name, table.schema, data))]
    assert isinstance(table, KeyedTable)
    keys = list(table.keys)
    if kind == "delete":
        t = conform(name, table.schema, data, columns=keys)
        _check_keys(name, t, keys)
        return [_Part(name, "delete", t)]
    if kind == "upsert":
        flags = None
        if DELETE in data.column_names:
            flags = _bool_column(name, data, DELETE)
            data = data.drop_columns([DELETE])
        t = conform(name, table.schema, data)
        _check_keys(name, t, keys)
        if flags is None or not flags.any():
            return [_Part(name, "upsert", t)]  # the keyed table itself is last-wins
        return _split_upsert_delete(name, table, t, flags)
    # diff
    if DIFF not in data.column_names:
        raise SchemaError(f"table {name!r}: a PUT_MODE_DIFF batch needs an int64 weight column "
                          f"{DIFF!r} (has: {data.column_names})")
    diffs = _int_column(name, data, DIFF)
    data = data.drop_columns([c for c in (DIFF, TIME) if c in data.column_names])
    t = conform(name, table.schema, data)
    _check_keys(name, t, keys)
    return [_Part(name, "diff", t, diffs)]


def _bool_column(table: str, data: pa.Table, column: str) -> npt.NDArray[np.bool_]:
    col = data.column(column)
    if not pa.types.is_boolean(col.type):
        raise SchemaError(f"table {table!r}: column {column!r} has type {col.type}, expected bool "
                          f"(true marks a row whose key is deleted)")
    col = col.fill_null(False)
    return np.asarray(col.to_numpy(), dtype=bool)


def _int_column(table: str, data: pa.Table, column: str) -> I64:
    col = data.column(column)
    if not pa.types.is_integer(col.type):
        raise SchemaError(f"table {table!r}: column {column!r} has type {col.type}, expected int64")
    if col.null_count:
        raise SchemaError(f"table {table!r}: column {column!r} has {col.null_count} null weight(s)")
    if col.type != pa.int64():
        try:
            col = col.cast(pa.int64(), safe=True)
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"table {table!r}: column {column!r} does not fit int64 ({exc})") from exc
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _check_keys(table: str, data: pa.Table, keys: list[str]) -> None:
    for k in keys:
        nulls = data.column(k).null_count
        if nulls:
            raise InvalidKeyError(f"table {table!r}: key column {k!r} has {nulls} null value(s); "
                                  f"keys may not be null")


def _pending_rows(entry: TableEntry) -> int:
    table = entry.table
    assert isinstance(table, KeyedTable)
    return table.pending_rows


def _slot_names(slots: list[tuple[int, int]]) -> str:
    return ", ".join(f"(partition {p}, attempt {a})" for p, a in slots)


# turning parts into table writes ------------------------------------------------------------
def _key_groups(data: pa.Table, keys: list[str], schema: pa.Schema) -> tuple[I64, I64]:
    """``group_equal`` over the key columns: rows with equal keys share a group (exactly)."""
    key_cols = data.select(keys)
    return group_equal(hash_rows(key_cols),
                       None if exact_hash(schema, keys) else (lambda i, j: same_rows(key_cols, i, j)))


def _split_upsert_delete(name: str, table: KeyedTable, data: pa.Table,
                         deleted: npt.NDArray[np.bool_]) -> list[_Part]:
    """An upsert batch with ``__delete`` rows: the last row per key decides.

    Returns an upsert and a delete part on disjoint keys, so their order does not matter.
    """
    keys = list(table.keys)
    order, starts = _key_groups(data, keys, table.schema)
    last = np.sort(np.maximum.reduceat(order, starts))
    is_del = deleted[last]
    ups, dels = last[~is_del], last[is_del]
    out = []
    if ups.size:
        out.append(_Part(name, "upsert", data.take(ups)))
    if dels.size:
        out.append(_Part(name, "delete", data.select(keys).take(dels)))
    return out


def _resolve_diff(entry: TableEntry, parts: list[_Part]) -> list[_Part]:
    """The upserts and deletes equivalent to the summed diff ``parts``, checked against the
    table's current rows. Call holding the graph's exclusive lock, with no pending writes.

    Raises
    ------
    InputError
        Naming the first row or key whose net weight is not a valid change.
    """
    name, table = entry.name, entry.table
    assert isinstance(table, KeyedTable)
    keys = list(table.keys)
    data = parts[0].data if len(parts) == 1 else pa.concat_tables([p.data for p in parts])
    diffs = np.concatenate([p.diffs for p in parts if p.diffs is not None])
    if data.num_rows == 0:
        return []
    # consolidate: one weight per distinct row
    order, starts = group_equal(hash_rows(data), lambda i, j: same_rows(data, i, j))
    weight = np.add.reduceat(diffs[order], starts)
    rep = np.minimum.reduceat(order, starts)
    live = weight != 0
    rows, weight = rep[live], weight[live]
    if rows.size == 0:
        return []
    bad = np.flatnonzero(np.abs(weight) != 1)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"table {name!r} is keyed by {keys}: it holds each row at most once, so a diff batch's "
            f"weights must sum to +1 or -1 per row, got {int(weight[i])} for "
            f"{data.slice(int(rows[i]), 1).to_pylist()[0]} ({bad.size} such row(s)); nothing of "
            f"the batch was applied")
    # group the changed rows by key; each key may have at most one -1 and one +1
    sub = data.take(rows)
    korder, kstarts = _key_groups(sub, keys, table.schema)
    n_keys = kstarts.size
    gid = np.empty(rows.size, np.int64)
    gid[korder] = np.repeat(np.arange(n_keys), np.diff(np.append(kstarts, rows.size)))
    minus = np.full(n_keys, -1, np.int64)  # row of ``sub`` retracted per key
    plus = np.full(n_keys, -1, np.int64)   # row of ``sub`` added per key
    for sign, slot in ((-1, minus), (1, plus)):  # one pass per sign
        sel = np.flatnonzero(weight == sign)
        counts = np.bincount(gid[sel], minlength=n_keys)
        if counts.max(initial=0) > 1:
            g = int(np.flatnonzero(counts > 1)[0])
            members = sel[gid[sel] == g]
            raise InputError(
                f"table {name!r}: key {_key_of(sub, keys, int(members[0]))} gets "
                f"{int(counts[g])} {'+1' if sign > 0 else '-1'} rows "
                f"({sub.take(members[:3]).to_pylist()}); a keyed table holds one row per key, so "
                f"a diff batch changes a key by at most one -1 and one +1; nothing of the batch "
                f"was applied")
        slot[gid[sel]] = sel
    # the key's current row
    first_row = np.where(minus >= 0, minus, plus)
    cur, cur_of_key = _current_rows(table, sub.select(keys).take(first_row))
    had, has_minus, has_plus = cur_of_key >= 0, minus >= 0, plus >= 0
    wrong = has_minus & ~had
    check = np.flatnonzero(has_minus & had)
    if check.size:
        wrong[check] = ~rows_equal(cur.take(cur_of_key[check]), sub.take(minus[check]))
    if wrong.any():
        g = int(np.flatnonzero(wrong)[0])
        held = cur.slice(int(cur_of_key[g]), 1).to_pylist()[0] if had[g] else None
        raise InputError(
            f"table {name!r}: diff row {sub.slice(int(minus[g]), 1).to_pylist()[0]} with weight -1 "
            f"retracts a row key {_key_of(sub, keys, int(minus[g]))} does not hold (it holds "
            f"{held}); nothing of the batch was applied")
    second = has_plus & ~has_minus & had
    if second.any():
        g = int(np.flatnonzero(second)[0])
        raise InputError(
            f"table {name!r}: diff row {sub.slice(int(plus[g]), 1).to_pylist()[0]} with weight +1 "
            f"adds a second row for key {_key_of(sub, keys, int(plus[g]))}, which holds "
            f"{cur.slice(int(cur_of_key[g]), 1).to_pylist()[0]}; retract that row (-1) in the same "
            f"batch; nothing of the batch was applied")
    out = []
    if has_plus.any():
        out.append(_Part(name, "upsert", sub.take(np.sort(plus[has_plus]))))
    gone = has_minus & ~has_plus
    if gone.any():
        out.append(_Part(name, "delete", sub.select(keys).take(np.sort(minus[gone]))))
    return out


def _key_of(data: pa.Table, keys: list[str], row: int) -> dict[str, object]:
    return data.select(keys).slice(row, 1).to_pylist()[0]


def _stage(entry: TableEntry, parts: list[_Part]) -> None:
    """Stage checked upsert/delete/append parts into their table (call holding a graph lock)."""
    table = entry.table
    for part in parts:
        if isinstance(table, KeyedTable):
            if part.kind == "upsert":
                table.upsert(part.data)
            else:
                assert part.kind == "delete", part.kind
                table.delete(part.data)
        else:
            assert isinstance(table, AppendOnlyTable | RingTable) and part.kind == "append"
            table.append(part.data)
