"""The journal of durable tables (DESIGN.md §8): every change, on stable storage before its ack.

A :class:`Journal` is one SQLite database, ``<data dir>/journal.sqlite``, in WAL mode with
``synchronous=FULL``: a transaction that returned from COMMIT has been fsynced. Records are
``(seq, kind, table, meta, payload)``: ``kind`` and ``meta`` (protobuf or JSON bytes) are
the caller's, ``payload`` is an Arrow IPC stream (:func:`~flight.durability.records.ipc_bytes`,
:func:`~flight.durability.records.read_ipc`) or empty. A payload of 64 KiB or more is
written once to a payload file beside the database and made durable before the COMMIT
that refers to it (:mod:`flight.durability.payloads`).

Contract, relied on by the server and by replay:

* **Acknowledged means durable.** :meth:`Journal.append` returns only after the COMMIT
  that holds its record; an exception means the record was not acknowledged (and, unless
  the exception came from ``apply``, not applied).
* **Apply order is seq order.** Seqs are handed out in the order records are queued.
  One flusher thread writes everything queued in one transaction (one fsync: group
  commit), then runs each record's ``apply(seq)`` in seq order, in the flusher thread,
  waking that record's writer after its own ``apply``. The server stages writes there, so
  staging order is journal order and replaying :meth:`Journal.records` in order reproduces
  last-write-wins exactly. A record whose ``apply`` raised stays in the journal (it was
  durable before ``apply`` ran): replay calls the same ``apply`` and meets the same refusal.
* **Dedupe state is exactly as durable as its record**: :class:`DedupeUpdate` rows are
  written in the record's transaction (:meth:`Journal.last_batch_ids`,
  :meth:`Journal.committed_writes`).
* **Start-up never drops acknowledged data silently.** :meth:`Journal.open` runs
  ``PRAGMA quick_check`` and verifies every record's CRC32 (over seq, transaction, kind,
  table, meta and payload). Failing records at the very end, all in the last transaction,
  are a torn tail: that transaction is cut with a WARNING naming its records (a COMMIT
  that never completed was not acknowledged). Failing records anywhere else, a file that
  is not a database, or a failed ``quick_check``: :class:`JournalCorrupt`; another format
  version: :class:`JournalIncompatible`; both name the file. The common crash needs none
  of this: SQLite itself discards a WAL transaction whose COMMIT never reached the disk.
* **A failed write loses nothing earlier.** Disk full, read-only or I/O errors roll the
  group back and raise :class:`JournalUnavailable` (:class:`JournalFull` for a full disk)
  in each of its writers; the journal keeps serving reads, and the next group tries again.
  ``JournalUnavailable`` is a :class:`~engine.errors.ServiceError`: the server's status
  table answers it with UNAVAILABLE.

Threads: any thread may append and read; one flusher thread owns the write connection and
runs ``apply``; each read opens its own connection (WAL readers never block the writer).
The files and the checks at open are in :mod:`flight.durability.journal_files`, the errors
in the one tree of :mod:`engine.errors` (re-exported here); the
values callers pass and read back (:class:`DedupeUpdate`, :class:`Chain`, :class:`Record`,
:class:`JournalStats`, ``Blob``) and the payload encoding are in :mod:`flight.durability.records`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import (
    JournalClosed,
    JournalFull,
    JournalUnavailable,
)
from flight.durability import journal_files as _fmt
from flight.durability import payloads as _payloads
from flight.durability.journal_files import FILENAME as FILENAME
from flight.durability.journal_files import VERSION as VERSION
from flight.durability.records import (
    Blob,
    Chain,
    DedupeUpdate,
    Framed,
    JournalStats,
    Payload,
    Record,
    payload_size,
)

__all__ = [
    "FILENAME",
    "VERSION",
    "Journal",
]

log = logging.getLogger(__name__)

# One transaction takes at most this much payload (and at least one record).
_MAX_GROUP_BYTES = 64 << 20


# ----------------------------------------------------------------------------------- journal
@dataclass(slots=True)
class _Pending:
    """A queued record: seq handed out, body CRC computed by its writer's thread."""

    seq: int
    kind: str
    table: str | None
    meta: Blob
    payload: Payload  # a Framed one is always bound for a payload file
    body_crc: int
    nbytes: int
    apply: Callable[[int], object] | None
    dedupe: DedupeUpdate | None
    future: Future[int]
    chain: Chain | None = None


@dataclass(slots=True)
class _Task:
    """Maintenance (truncate, forget) run by the flusher in queue order, alone."""

    run: Callable[[sqlite3.Connection], int]
    future: Future[int]


class Journal:
    """A durable, ordered log of changes with group commit; see the module docstring.

    Thread-safe. One flusher thread owns the write connection; readers open their own.
    Open with :meth:`open`; close with :meth:`close` (or ``with``).
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int, next_seq: int,
                 next_txn: int, payloads: _payloads.PayloadWriter) -> None:
        self._path = path
        self._payloads = payloads
        self._conn: sqlite3.Connection | None = conn
        self._lock_fd = lock_fd
        self._cond = threading.Condition()
        self._queue: deque[_Pending | _Task] = deque()
        self._next_seq = next_seq
        self._next_txn = next_txn
        self._closing = False
        self._broken: BaseException | None = None
        self._last_seq = next_seq - 1
        self._appended = self._commits = self._failed = self._bytes = 0
        #: called with each group commit's seconds (write and fsync), from the flusher
        self.on_flush: Callable[[float], None] | None = None
        self._flusher = threading.Thread(target=self._run, name="ticktable-journal",
                                         daemon=True)
        self._flusher.start()

    # open --------------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> Journal:
        """Open (or create) the journal in data dir ``directory`` and check all of it.

        Cuts a torn tail with a WARNING naming the records dropped.

        Raises
        ------
        JournalCorrupt
            Damage before the tail, a failed ``quick_check``, or not a database.
        JournalIncompatible
            Another format version, or an SQLite file that is not a Ticktable journal.
        JournalUnavailable
            Another process has the journal open, or the file cannot be opened.
        """
        path, conn, lock_fd, next_seq, next_txn, payloads = _fmt.open_files(
            Path(directory).resolve())
        log.info("journal %s open: next seq %d, %.1f MB on disk", path, next_seq,
                 _fmt.disk_size(path) / 1e6)
        return cls(path, conn, lock_fd, next_seq, next_txn, payloads)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # writes ------------------------------------------------------------------------------
    def append(self, kind: str, table: str | None, meta: Blob, payload: Payload = b"", *,
               apply: Callable[[int], object] | None = None,
               dedupe: DedupeUpdate | None = None) -> int:
        """Journal one record and return its seq once it is durable (and applied).

        Parameters
        ----------
        kind
            What the record is, a plain ``str`` (the checksum covers its ``repr``): the
            caller's (:class:`flight.wire.RecordKind` values, for the server).
        table
            The table it changes, or None.
        meta
            The caller's metadata (protobuf or JSON bytes).
        payload
            An Arrow IPC stream (:func:`~flight.durability.records.ipc_bytes`), or empty.
        apply
            Called as ``apply(seq)`` in the flusher thread after the COMMIT, in seq order
            with every other record's; must be quick and must not call :meth:`append`.
        dedupe
            Idempotency state to record in the same transaction.

        Returns
        -------
        int
            The record's seq.

        Raises
        ------
        JournalUnavailable
            The record could not be made durable (:class:`JournalFull`, :class:`JournalClosed`).
        Exception
            Whatever ``apply`` raised: the record is durable, but the change was refused.
        """
        if threading.current_thread() is self._flusher:
            raise RuntimeError("Journal.append inside apply would wait for itself; "
                               "use append_nowait")
        return self._submit(kind, table, meta, payload, apply, dedupe)[1].result()

    def submit(self, kind: str, table: str | None, meta: Blob, payload: Payload = b"", *,
               apply: Callable[[int], object] | None = None,
               dedupe: DedupeUpdate | None = None, chain: Chain | None = None) -> Future[int]:
        """Queue one record and return at once: a future of its seq, done once it is durable
        and applied (:meth:`append` waits for it). Lets one writer keep several records in
        flight, acknowledging each as its future completes.

        Parameters as :meth:`append`; ``chain`` makes the writer's records durable as a
        prefix (:class:`Chain`). The future raises what :meth:`append` would.

        Raises
        ------
        JournalUnavailable
            At once, if the journal is closed or broken, or ``chain`` is broken.
        """
        return self._submit(kind, table, meta, payload, apply, dedupe, chain)[1]

    def append_nowait(self, kind: str, table: str | None, meta: Blob, payload: Payload = b"", *,
                      apply: Callable[[int], object] | None = None,
                      dedupe: DedupeUpdate | None = None) -> int:
        """Queue a record nobody waits for (cycle markers) and return its seq at once.

        Ordered with every other record; a failure to write it, or an exception from its
        ``apply``, is logged. Parameters as :meth:`append`.
        """
        seq, future = self._submit(kind, table, meta, payload, apply, dedupe)
        future.add_done_callback(lambda f: _log_failure(f, seq, kind, table))
        return seq

    def truncate(self, upto: int) -> int:
        """Delete the records with ``seq <= upto`` (a checkpoint holds them); return how many.

        One transaction, then the WAL is checkpointed and truncated and the payload files
        no record refers to any more are deleted; queued after every record already
        appended. Not while :meth:`records` is being iterated. Each stream's dedupe history is pruned to its newest row
        at or before ``upto``.
        """
        with self._cond:
            if upto >= self._next_seq:
                raise ValueError(f"truncate({upto}): no record up to {upto} has been appended "
                                 f"(next seq {self._next_seq})")

        def run(conn: sqlite3.Connection) -> int:
            with _fmt.transaction(conn):
                n = conn.execute("DELETE FROM records WHERE seq <= ?", (upto,)).rowcount
                conn.execute(
                    "DELETE FROM dedupe_streams AS d WHERE seq < ("
                    "  SELECT max(e.seq) FROM dedupe_streams AS e"
                    "  WHERE e.stream_id = d.stream_id AND e.seq <= ?)", (upto,))
                conn.execute("UPDATE meta SET value = max(CAST(value AS INTEGER), ?) "
                             "WHERE key = 'truncated_upto'", (upto,))
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            live = {seg for (seg,) in conn.execute(
                "SELECT DISTINCT seg FROM records WHERE seg IS NOT NULL")}
            self._payloads.release(live)
            return int(n)

        return self._task(run)

    def forget_writes(self, older_than: float) -> int:
        """Delete the committed writes recorded before ``older_than`` (``time.time()``)."""

        def run(conn: sqlite3.Connection) -> int:
            with _fmt.transaction(conn):
                return int(conn.execute("DELETE FROM dedupe_writes WHERE at < ?",
                                        (older_than,)).rowcount)

        return self._task(run)

    def close(self) -> None:
        """Write everything queued, stop the flusher and close the files. Idempotent."""
        if threading.current_thread() is self._flusher:
            raise RuntimeError("Journal.close inside apply would wait for itself")
        with self._cond:
            if self._closing:
                already = True
            else:
                already, self._closing = False, True
                self._cond.notify_all()
        self._flusher.join()
        if already:
            return
        if self._conn is not None:
            self._conn.close()  # the last connection: SQLite checkpoints and removes the WAL
            self._conn = None
        self._payloads.close()
        os.close(self._lock_fd)
        log.info("journal %s closed at seq %d", self._path, self._last_seq)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reads -------------------------------------------------------------------------------
    def records(self, after: int = 0) -> Iterator[Record]:
        """The durable records with ``seq > after``, in seq order, read as they are iterated.

        One consistent snapshot: records made durable while iterating are not seen.
        """
        conn = _fmt.connect(self._path, readonly=True)
        reader = _payloads.PayloadReader(self._path.parent)
        try:
            rows = conn.execute("SELECT seq, kind, table_name, meta, payload, seg, off, size "
                                "FROM records WHERE seq > ? ORDER BY seq", (after,))
            for seq, kind, table, meta, payload, seg, off, size in rows:
                if seg is not None:
                    payload = reader.read(seg, off, size)
                yield Record(seq, kind, table, meta, payload)
        finally:
            reader.close()
            conn.close()

    def last_batch_ids(self) -> dict[str, int]:
        """Each stream's last applied batch id, as durable as the record that set it."""
        # SQLite returns the bare column from the row holding max(seq)
        return {s: b for s, b, _ in self._read(
            "SELECT stream_id, batch_id, max(seq) FROM dedupe_streams GROUP BY stream_id")}

    def committed_writes(self) -> dict[str, bytes]:
        """The result recorded for each committed write id not yet forgotten."""
        return {w: r for w, r in self._read("SELECT write_id, result FROM dedupe_writes")}

    def size_bytes(self) -> int:
        """Bytes on disk now: the database and its WAL."""
        return _fmt.disk_size(self._path)

    def stats(self) -> JournalStats:
        """Counters since open, and the size on disk."""
        with self._cond:
            return JournalStats(self._last_seq, self._appended, self._commits, self._failed,
                                self._bytes, _fmt.disk_size(self._path))

    # internals ---------------------------------------------------------------------------
    def _read(self, sql: str) -> list[Any]:
        conn = _fmt.connect(self._path, readonly=True)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def _submit(self, kind: str, table: str | None, meta: Blob, payload: Payload,
                apply: Callable[[int], object] | None,
                dedupe: DedupeUpdate | None,
                chain: Chain | None = None) -> tuple[int, Future[int]]:
        # the body CRC is the expensive part: computed here, on the writer's thread
        size = payload_size(payload)
        if isinstance(payload, Framed) and size < _payloads.EXTERNAL_MIN_BYTES:
            payload = b"".join(payload.pieces())  # stored inline: SQLite takes bytes
        body = _fmt.body_crc(meta, payload, external=size >= _payloads.EXTERNAL_MIN_BYTES)
        nbytes = memoryview(meta).nbytes + size
        future: Future[int] = Future()
        with self._cond:
            self._check_open()
            if chain is not None and chain.broken is not None:
                raise chain.broken
            seq = self._next_seq
            self._next_seq += 1
            self._queue.append(_Pending(seq, kind, table, meta, payload, body, nbytes, apply,
                                        dedupe, future, chain))
            self._cond.notify_all()
        return seq, future

    def _task(self, run: Callable[[sqlite3.Connection], int]) -> int:
        future: Future[int] = Future()
        with self._cond:
            self._check_open()
            self._queue.append(_Task(run, future))
            self._cond.notify_all()
        return future.result()

    def _check_open(self) -> None:
        if self._broken is not None:
            raise JournalUnavailable(self._path, f"the journal's writer stopped "
                                     f"({self._broken!r}); restart the server")
        if self._closing:
            raise JournalClosed(self._path, "the journal is closed (shutting down); retry "
                                "against the restarted server")

    def _run(self) -> None:
        """The flusher: drain the queue, one transaction per group, until closed and empty."""
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait()
                    if not self._queue:
                        return
                    head = self._queue.popleft()
                    group: list[_Pending] = []
                    if isinstance(head, _Pending):
                        group.append(head)
                        size = head.nbytes
                        while (self._queue and isinstance(self._queue[0], _Pending)
                               and size + self._queue[0].nbytes <= _MAX_GROUP_BYTES):
                            nxt = self._queue.popleft()
                            assert isinstance(nxt, _Pending)  # checked in the loop condition
                            size += nxt.nbytes
                            group.append(nxt)
                if isinstance(head, _Task):
                    self._run_task(head)
                else:
                    self._commit(group)
        except BaseException as exc:  # our bug: fail every writer rather than hang them
            log.error("journal %s: the flusher stopped", self._path, exc_info=exc)
            with self._cond:
                self._broken = exc
                queued, self._queue = list(self._queue), deque()
            for item in queued:
                item.future.set_exception(JournalUnavailable(
                    self._path, f"the journal's writer stopped ({exc!r}); restart the server"))

    def _writer(self) -> sqlite3.Connection:
        if self._conn is None:  # dropped after an I/O error: start afresh
            self._conn = _fmt.connect(self._path, readonly=False)
        return self._conn

    def _commit(self, group: list[_Pending]) -> None:
        txn, now = self._next_txn, time.time()
        t0 = time.perf_counter()
        mark = self._payloads.mark()
        where = self._write_payloads(group)
        if where is None:
            return
        rows = [(p.seq, txn, p.kind, p.table, p.meta, b"" if p.seq in where else p.payload,
                 _fmt.crc(p.seq, txn, p.kind, p.table, p.body_crc),
                 *where.get(p.seq, (None, None, None))) for p in group]
        streams = [(sid, p.seq, bid, now) for p in group if p.dedupe
                   for sid, bid in p.dedupe.streams]
        writes = [(wid, res, p.seq, now) for p in group if p.dedupe
                  for wid, res in p.dedupe.writes]
        try:
            conn = self._writer()
            with _fmt.transaction(conn):
                conn.executemany("INSERT INTO records(seq, txn, kind, table_name, meta, payload, "
                                 "crc, seg, off, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 rows)
                if streams:
                    conn.executemany("INSERT INTO dedupe_streams(stream_id, seq, batch_id, at) "
                                     "VALUES (?, ?, ?, ?)", streams)
                if writes:
                    conn.executemany("INSERT OR IGNORE INTO dedupe_writes(write_id, result, seq, "
                                     "at) VALUES (?, ?, ?, ?)", writes)
        except sqlite3.Error as exc:
            if not self._committed_anyway(exc, group):
                self._payloads.rollback(mark)
                self._fail(group, *_fmt.classify(exc, self._path))
                return
        except Exception as exc:  # a value sqlite cannot bind: nothing was written
            if not self._committed_anyway(exc, group):
                self._payloads.rollback(mark)
            self._break_chains(group, lambda: JournalUnavailable(
                self._path, "an earlier record of this stream was not written"))
            for p in group:
                p.future.set_exception(exc)
            return
        self._next_txn += 1
        if self.on_flush is not None:
            self.on_flush(time.perf_counter() - t0)
        with self._cond:
            self._commits += 1
            self._appended += len(group)
            self._bytes += sum(p.nbytes for p in group)
            self._last_seq = group[-1].seq
        for p in group:  # seq order: staging order == journal order
            if p.apply is not None:
                try:
                    p.apply(p.seq)
                except Exception as exc:  # the writer's own refusal: only it hears of it
                    p.future.set_exception(exc)
                    continue
            p.future.set_result(p.seq)

    def _committed_anyway(self, exc: Exception, group: list[_Pending]) -> bool:
        """After a failed COMMIT: roll back, and say whether the group is on disk after all.

        An I/O error may come after the commit record reached the WAL; the journal's content
        is the truth, so a fresh connection looks. Other errors keep the connection.
        """
        conn, io_error = self._conn, _fmt.primary_code(exc) == _fmt.SQLITE_IOERR
        try:
            if conn is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            io_error = True
        if io_error and conn is not None:
            conn.close()
            self._conn = None
        try:
            n = self._writer().execute("SELECT count(*) FROM records WHERE seq BETWEEN ? AND ?",
                                       (group[0].seq, group[-1].seq)).fetchone()[0]
        except sqlite3.Error:
            return False
        return bool(n == len(group))

    def _write_payloads(self, group: list[_Pending]) -> dict[int, tuple[int, int, int]] | None:
        """Write the group's large payloads to a payload file, durably: ``seq -> (seg, off,
        size)``; or fail the group and return None."""
        big = [p for p in group if payload_size(p.payload) >= _payloads.EXTERNAL_MIN_BYTES]
        if not big:
            return {}
        try:
            seg, offsets = self._payloads.write([p.payload for p in big])
        except OSError as exc:
            file = _payloads.segment_path(self._path.parent, self._payloads.current or 0)
            full, reason = _payloads.classify(exc, file)
            self._fail(group, JournalFull if full else JournalUnavailable, reason, file)
            return None
        return {p.seq: (seg, off, payload_size(p.payload))
                for p, off in zip(big, offsets, strict=True)}

    def _fail(self, group: list[_Pending], cls: type[JournalUnavailable], reason: str,
              path: Path | None = None) -> None:
        path = path or self._path
        log.error("journal %s: %s; %d record(s) not written (seq %d..%d)", path, reason,
                  len(group), group[0].seq, group[-1].seq)
        message = (f"{reason}: the write was not made durable and nothing of it was applied; "
                   f"retry later")
        with self._cond:
            self._failed += 1
        self._break_chains(group, lambda: cls(path, f"{reason}: an earlier record of "
                                              f"this stream was not made durable; nothing "
                                              f"after it was written"))
        for p in group:  # one exception object per writer: each raises it on its own thread
            p.future.set_exception(cls(path, message))

    def _break_chains(self, group: list[_Pending], error: Callable[[], BaseException]) -> None:
        """The group was not written: break its records' chains, fail what queues behind."""
        with self._cond:
            for p in group:
                if p.chain is not None and p.chain.broken is None:
                    p.chain.broken = error()
            dropped = [p for p in self._queue if isinstance(p, _Pending)
                       and p.chain is not None and p.chain.broken is not None]
            if dropped:
                self._queue = deque(p for p in self._queue
                                    if not (isinstance(p, _Pending) and p.chain is not None
                                            and p.chain.broken is not None))
        for p in dropped:  # queued behind a failed record of their stream: never written
            assert p.chain is not None and p.chain.broken is not None
            p.future.set_exception(p.chain.broken)

    def _run_task(self, task: _Task) -> None:
        try:
            task.future.set_result(task.run(self._writer()))
        except sqlite3.Error as exc:
            cls, reason = _fmt.classify(exc, self._path)
            task.future.set_exception(cls(self._path, reason))
        except Exception as exc:
            task.future.set_exception(exc)


def _log_failure(future: Future[int], seq: int, kind: str, table: str | None) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("journal: record seq %d (%s %s) appended without waiting failed: %s", seq,
                  kind, table, exc)
