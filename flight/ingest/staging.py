"""Staging and transactions: stage slots, commit and abort, write ids remembered and expired.

:mod:`flight.ingest.put` decodes and checks a DoPut stream into :class:`~flight.ingest.parts.Part` s;
the :class:`StagingArea` puts them where they belong (DESIGN.md §5):

* without a ``write_id``, into their table at once (:meth:`StagingArea.apply`): visible
  after the next cycle;
* with one, into the stage slot ``(write_id, partition, attempt)``
  (:meth:`StagingArea.hold`), invisible until :meth:`StagingArea.commit` writes the
  chosen slots into their tables, all of them while holding the graph's exclusive lock, so
  one cycle applies them all, across tables. The write's other slots (failed task
  attempts) are dropped.

This module keeps the bookkeeping of writes: their stage slots, the commit decision, the
write ids remembered once finished, and expiry. How parts land in their tables (DIFF parts
resolved against the rows staged before them, under the graph's and the tables' locks) is
the :class:`~flight.ingest.parts.PartWriter` a :class:`StagingArea` holds and calls.

A commit returns once the cycle that applies it has finished when the graph runs
periodically (``CommitResult.step`` is that cycle); in manual mode it returns at once with
the step of the next cycle. Streaming micro-batches ``(stream_id, batch_id)`` are applied
once; the last batch id per stream and the results of committed write ids (for
``stage_ttl``) are kept in memory, so a restarted server forgets them. A janitor thread
drops writes nobody committed or aborted within ``stage_ttl``.

A write id the server does not know (nothing was ever held under it, and it was not
committed, aborted or dropped within ``stage_ttl``) is refused with
:class:`~engine.errors.WriteNotFound`
(NOT_FOUND) by a commit naming slots, or all of them, and by an abort: a mistyped write id
must not look like a write that committed nothing. A commit naming no slot is an empty
write whatever its id (a Spark job or micro-batch whose partitions were all empty). A
write the server dropped (``stage_ttl``, a restart) is still known, for ``stage_ttl``: its
commit says which slots are missing, as before the drop.

Locks, always in this order: the graph's lock (shared, or exclusive for a commit), then a
table's staging lock. The parts of one batch are staged under their table's staging lock
alone, all of them in one hold (:meth:`~engine.sources.SourceTable.stage_all`: one cycle
takes them all, and a cycle waiting for readers of the graph holds up no writer); a DIFF
part under the table's write lock. The StagingArea's own mutex guards its bookkeeping, is
held only briefly, and never while taking a graph or table lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.errors import InputError, LimitExceeded, Overloaded, TableNotFound, WriteNotFound
from engine.graph import UpdateGraph
from flight.ingest.parts import Part, PartWriter
from flight.limits import limit_text, quoted
from flight.pb import flight_pb2 as pb
from flight.streams.registry import TableEntry, TableRegistry

__all__ = ["StagingArea"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slot:
    parts: list[Part] = field(default_factory=list)
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


class StagingArea:
    """Stages checked writes into the registry's tables; holds and commits staged writes.

    Writing parts into tables (:meth:`apply`, :meth:`submit`, and a commit's critical
    section) is done by :attr:`writer`, a :class:`~flight.ingest.parts.PartWriter`; this
    class keeps the writes' bookkeeping.

    Thread-safe: every DoPut stream and action runs on its own thread.

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
    max_staged_bytes_per_write
        Bound on the bytes one uncommitted write holds (``None``: none); a batch that would
        pass it is refused with :class:`~engine.errors.LimitExceeded`. Read at each batch
        (a durable server's replay sets it).
    commit_timeout
        How long :meth:`commit` waits for the cycle that applies the commit.
    """

    def __init__(self, registry: TableRegistry, *, stage_ttl: float = 600.0,
                 max_staged_bytes: int = 4 << 30, max_staged_bytes_per_write: int | None = None,
                 commit_timeout: float = 60.0) -> None:
        self.registry = registry
        self.graph: UpdateGraph = registry.graph
        #: Writes checked parts into their tables, under the graph's and the tables' locks.
        self.writer = PartWriter(registry)
        self.stage_ttl = stage_ttl
        self.max_staged_bytes = max_staged_bytes
        self.max_staged_bytes_per_write = max_staged_bytes_per_write
        self.commit_timeout = commit_timeout
        self._lock = threading.Lock()  # guards the fields below; never held while waiting
        self._commit_lock = threading.Lock()
        self._writes: dict[str, _Write] = {}
        self._staged_bytes = 0
        self._committed: dict[str, tuple[float, pb.CommitResult]] = {}
        self._aborted: dict[str, float] = {}  # write id -> when (forgotten after stage_ttl)
        self._dropped: dict[str, float] = {}  # expired or dropped at a restart -> when
        self._stream_batches: dict[str, int] = {}
        self._cycle_done = threading.Condition()
        self._last_step = self.graph.step
        self._committed_step = 0  # the cycle that shows every commit answered so far
        self._remove_terminal = self.graph.add_terminal_listener(self._on_cycle_end)
        self._janitor: threading.Thread | None = None
        self._janitor_stop = threading.Event()
        #: Carries out what :meth:`expire` decided (:meth:`forget`); a durable server journals
        #: it first, since a replay cannot decide by the clock again.
        self.forgetter: Callable[[list[str], list[str], list[str], list[str]], int] = self.forget

    # writes without a write id --------------------------------------------------------------
    @property
    def synchronous(self) -> bool:
        """Always: :meth:`submit` applies at once (see :class:`flight.ingest.put.Stager`)."""
        return True

    def apply(self, entry: TableEntry, parts: list[Part]) -> None:
        """Stage the parts of one batch into ``entry``'s table for its next cycle, atomically:
        :meth:`PartWriter.apply <flight.ingest.parts.PartWriter.apply>`, which says what it
        raises."""
        self.writer.apply(entry, parts)

    def open_chain(self) -> object:
        """Nothing: in memory a stream's batches apply as they come, in order."""
        return None

    def submit(self, entry: TableEntry, parts: list[Part], chain: object = None) -> Future[None]:
        """:meth:`apply` at once, its outcome as a done future (the in-memory side of
        :meth:`flight.durability.durable.Durability.submit`; ``chain`` is not needed here)."""
        return self.writer.submit(entry, parts, chain)

    # stage slots ----------------------------------------------------------------------------
    def hold(self, write_id: str, slot: tuple[int, int], parts: list[Part], rows: int) -> None:
        """Hold checked ``parts`` (``rows`` rows of one batch) in the stage slot of ``write_id``.

        Raises
        ------
        InputError
            If the write was committed or aborted, or is being committed.
        LimitExceeded
            If the write would hold more than ``max_staged_bytes_per_write``.
        Overloaded
            If holding the parts would pass ``max_staged_bytes``.
        """
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
            limit = self.max_staged_bytes_per_write
            held = write.nbytes if write is not None else 0
            if limit is not None and held + nbytes > limit:  # the writer's doing: not Overloaded
                into = f" into table {quoted(self._shown(parts[0].table))}" if parts else ""
                raise LimitExceeded(
                    f"write {quoted(write_id)}{into}: a batch of {nbytes} bytes would make it "
                    f"hold {held + nbytes} bytes uncommitted, above "
                    f"{limit_text('max_staged_bytes_per_write', limit)}; commit smaller writes; "
                    f"nothing of the batch was staged")
            if self._staged_bytes + nbytes > self.max_staged_bytes:
                raise Overloaded(
                    f"staged writes hold {self._staged_bytes} bytes and this batch needs {nbytes} "
                    f"more (limit {self.max_staged_bytes}); commit or abort open writes, or retry "
                    f"later")
            if write is None:
                write = self._writes[write_id] = _Write()
                self._dropped.pop(write_id, None)  # written again: open, no longer dropped
            s = write.slots.setdefault(slot, _Slot())
            s.parts.extend(parts)
            s.rows += rows
            s.nbytes += nbytes
            write.touched = time.monotonic()
            self._staged_bytes += nbytes

    def commit(self, request: pb.CommitRequest, *, wait: bool | None = None) -> pb.CommitResult:
        """Write the chosen slots of a staged write into their tables atomically, in one cycle.

        The chosen slots (``slots``, or every slot with ``all_slots``) are staged into their
        tables in (partition, attempt) order while holding the graph's exclusive lock, so the
        next cycle applies all of them; the write's other slots are dropped. DIFF parts are
        checked now, against their tables' rows with the writes staged before folded in. On
        any error nothing is staged and the write stays open (abort it, or let it expire).

        With ``stream_id`` and ``has_batch`` the commit is a streaming micro-batch: if
        ``batch_id`` is not above the last one committed for ``stream_id``, the stages are
        dropped and the result says ``applied=False``. A retried commit of a write id that
        was already committed is answered the same way. A commit naming no slot (without
        ``all_slots``) commits nothing, whatever its write id (an empty write).

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
            ``rows`` committed, ``applied``, and ``step``: the cycle that makes it visible.

        Raises
        ------
        WriteNotFound
            If slots are named (or ``all_slots``) and the write id is not known.
        InputError
            A named slot was never written, the write was aborted, or a DIFF part is not a
            valid change of its table; :class:`TableNotFound` if a table was dropped
            meanwhile.
        TableFailed
            If a table of the write failed in an earlier cycle.
        """
        result = self.commit_now(request)
        if result.applied:
            self.wait_applied(result.step, wait)
        return result

    def commit_now(self, request: pb.CommitRequest) -> pb.CommitResult:
        """:meth:`commit` without waiting for the cycle that applies it."""
        with self._commit_lock:  # one commit at a time: stream batch ids are checked, then set
            result, n_slots = self._commit_locked(request)
        if result.applied:
            log.info("committed write %r: %d slot(s), %d rows, step %d", request.write_id,
                     n_slots, result.rows, result.step)
        return result

    def wait_applied(self, step: int, wait: bool | None = None) -> None:
        """Wait for cycle ``step`` (``wait=None``: only when the graph runs periodically)."""
        if self.graph.running if wait is None else wait:
            self._wait_for_step(step)

    def wait_committed(self, wait: bool | None = None) -> None:
        """Wait for the cycle that shows every commit answered before this call (``wait``
        as :meth:`wait_applied`'s): a reader that starts after it sees those writes."""
        with self._lock:
            step = self._committed_step
        if step > self._last_step:
            self.wait_applied(step, wait)

    def _commit_locked(self, request: pb.CommitRequest) -> tuple[pb.CommitResult, int]:
        write_id = request.write_id
        with self._lock:
            if write_id in self._aborted:
                raise InputError(f"write {write_id!r} was aborted; nothing of it can be committed, "
                                 f"write again with a new write_id")
            done = self._committed.get(write_id)
            if done is not None:
                return pb.CommitResult(rows=done[1].rows, applied=False, step=done[1].step), 0
            if (request.has_batch
                    and self._stream_batches.get(request.stream_id, -1) >= request.batch_id):
                dropped = self._drop_locked(write_id)
                log.info("commit of write %r: batch %d of stream %r was already applied; "
                         "%d slot(s) dropped", write_id, request.batch_id, request.stream_id,
                         dropped)
                return pb.CommitResult(rows=0, applied=False, step=self.graph.step), 0
            write = self._writes.get(write_id)
            have = write.slots if write is not None else {}
            if (write is None and (request.all_slots or request.slots)
                    and write_id not in self._dropped):
                raise WriteNotFound(self._unknown(write_id, request))
            if request.all_slots and write is None and request.has_batch:
                # marking the batch applied would make its replay a no-op: data lost for good
                raise InputError(
                    f"write {write_id!r} holds no batches to commit as batch {request.batch_id} "
                    f"of stream {request.stream_id!r} (a restart drops writes never committed); "
                    f"write the batch again")
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
            step = self.writer.write_commit(write_id, parts)
        except BaseException:
            with self._lock:
                if write is not None:
                    write.committing = False
            raise
        result = pb.CommitResult(rows=rows, applied=True, step=step)
        with self._lock:
            self._committed_step = max(self._committed_step, step)
            self._drop_locked(write_id)
            self._committed[write_id] = (time.monotonic(), result)
            if request.has_batch:
                self._stream_batches[request.stream_id] = request.batch_id
        return result, len(chosen)

    def _shown(self, name: str) -> str:
        """Table ``name`` as its messages name it: a pending table by the name it is filled
        for (:func:`~flight.streams.registry.pending_name`)."""
        try:
            return self.registry.get(name).table.name
        except TableNotFound:
            return name

    def _unknown(self, write_id: str, request: pb.CommitRequest) -> str:
        """Why a commit of ``write_id``, which the server does not know, is refused."""
        if request.all_slots and request.has_batch:
            what = (f"it holds no batches to commit as batch {request.batch_id} of stream "
                    f"{quoted(request.stream_id)}")
        elif request.all_slots:
            what = "it holds no batches"
        else:
            slots = sorted({(int(s.partition), int(s.attempt)) for s in request.slots})
            what = f"it has no slot(s) {_slot_names(slots[:10])}"
        return (f"no write {quoted(write_id)}: {what}; nothing was staged under this write id "
                f"(or it finished more than stage_ttl={self.stage_ttl:g} s ago): commit the "
                f"write_id the batches were sent with")

    def abort(self, request: pb.AbortRequest) -> int:
        """Drop every slot of a staged write; returns how many were dropped.

        Batches of the write that arrive later are refused, even when the write was not
        known yet (a task still sending its first batch when its job is aborted).

        Raises
        ------
        WriteNotFound
            If the write id was not known; its later batches are refused all the same.
        """
        write_id = request.write_id
        with self._lock:
            known = (write_id in self._writes or write_id in self._committed
                     or write_id in self._aborted or write_id in self._dropped)
            n = self._drop_locked(write_id)
            self._aborted[write_id] = time.monotonic()  # late batches are refused
        if not known:
            raise WriteNotFound(f"no write {quoted(write_id)} to abort: nothing was staged under "
                                f"this write id (or it finished more than stage_ttl="
                                f"{self.stage_ttl:g} s ago); batches sent with it are refused "
                                f"from now on")
        if n:
            log.info("aborted write %r: %d slot(s) dropped", write_id, n)
        return n

    def _drop_locked(self, write_id: str) -> int:
        write = self._writes.pop(write_id, None)
        if write is None:
            return 0
        self._staged_bytes -= write.nbytes
        return len(write.slots)

    # what a restart keeps ---------------------------------------------------------------------
    def export_memory(self) -> dict[str, object]:
        """What this staging area remembers of finished writes, as JSON-ready data.

        Committed write ids with their results, aborted and dropped write ids, and the last
        batch id per stream, each with its age in seconds (so ``stage_ttl`` keeps counting
        across a restart).
        """
        now = time.monotonic()
        with self._lock:
            return {
                "committed": {w: [now - t, r.rows, r.step] for w, (t, r) in self._committed.items()},
                "aborted": {w: now - t for w, t in self._aborted.items()},
                "dropped": {w: now - t for w, t in self._dropped.items()},
                "streams": dict(self._stream_batches),
            }

    def restore_memory(self, memory: dict[str, object]) -> None:
        """Remember finished writes again, from :meth:`export_memory`'s output."""
        now = time.monotonic()
        committed = memory["committed"]
        aborted = memory["aborted"]
        streams = memory["streams"]
        assert isinstance(committed, dict) and isinstance(aborted, dict)
        assert isinstance(streams, dict)
        with self._lock:
            for w, (age, rows, step) in committed.items():
                self._committed[w] = (now - age, pb.CommitResult(rows=rows, applied=True, step=step))
            for w, age in aborted.items():
                self._aborted[w] = now - age
            dropped = memory.get("dropped", {})  # absent from checkpoints of older servers
            assert isinstance(dropped, dict)
            for w, age in dropped.items():
                self._dropped[w] = now - age
            self._stream_batches.update({s: int(b) for s, b in streams.items()})

    def open_write_ids(self) -> list[str]:
        """The write ids holding batches, not yet committed, aborted or expired."""
        with self._lock:
            return list(self._writes)

    def drop_open(self) -> int:
        """Drop every write not committed (at a restart); returns how many there were."""
        with self._lock:
            open_ids = list(self._writes)
            now = time.monotonic()
            for w in open_ids:
                self._drop_locked(w)
                self._dropped[w] = now
        if open_ids:
            log.warning("dropped %d write(s) staged but never committed before the restart: %s",
                        len(open_ids), ", ".join(map(repr, open_ids[:10])))
        return len(open_ids)

    # housekeeping ---------------------------------------------------------------------------
    def expire(self, now: float | None = None) -> int:
        """Drop writes with no batch for ``stage_ttl`` seconds; returns the slots dropped.

        Committed, aborted and dropped write ids older than ``stage_ttl`` are forgotten too.
        This decides; :attr:`forgetter` carries it out. ``now`` is a :func:`time.monotonic`
        reading (the current one by default).
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [w for w, s in self._writes.items()
                     if not s.committing and now - s.touched > self.stage_ttl]
            committed = [w for w, (t, _) in self._committed.items() if now - t > self.stage_ttl]
            aborted = [w for w, t in self._aborted.items() if now - t > self.stage_ttl]
            dropped = [w for w, t in self._dropped.items() if now - t > self.stage_ttl]
        if not (stale or committed or aborted or dropped):
            return 0
        return self.forgetter(stale, committed, aborted, dropped)

    def forget(self, writes: list[str], committed: list[str], aborted: list[str],
               dropped: list[str] | None = None) -> int:
        """Drop the open ``writes`` (remembered as dropped) and forget the ``committed``,
        ``aborted`` and ``dropped`` write ids.

        A write being committed is kept. Returns the slots dropped.
        """
        slots = 0
        with self._lock:
            now = time.monotonic()
            for w in dropped or ():
                self._dropped.pop(w, None)
            gone = [w for w in writes if w in self._writes and not self._writes[w].committing]
            for w in gone:
                slots += self._drop_locked(w)
                self._dropped[w] = now
            for w in committed:
                self._committed.pop(w, None)
            for w in aborted:
                self._aborted.pop(w, None)
        if gone:
            log.warning("expired %d abandoned write(s) (%d slot(s)): %s", len(gone), slots,
                        ", ".join(map(repr, gone[:10])))
        return slots

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

    # waiting for a cycle --------------------------------------------------------------------
    def _on_cycle_end(self, step: int) -> None:
        with self._cycle_done:
            self._last_step = step
            self._cycle_done.notify_all()

    def _wait_for_step(self, step: int) -> None:
        with self._cycle_done:
            ok = self._cycle_done.wait_for(lambda: self._last_step >= step, self.commit_timeout)
        if not ok:
            log.warning("commit: cycle %d did not finish within %.1f s; the write is staged and "
                        "will be applied", step, self.commit_timeout)


def _slot_names(slots: list[tuple[int, int]]) -> str:
    return ", ".join(f"(partition {p}, attempt {a})" for p, a in slots)
