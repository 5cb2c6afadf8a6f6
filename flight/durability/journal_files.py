"""The journal's files (DESIGN.md §8): schema, connections, errors and the checks at open.

:mod:`flight.durability.journal` is the API and the group commit; this module is what is on disk and
how it is checked before the first write. ``<data dir>/journal.sqlite`` is an SQLite
database (WAL mode, ``synchronous=FULL``, 64 KiB pages) with the tables

* ``meta(key, value)``: ``format`` (``ticktable-journal``), ``version`` (:data:`VERSION`)
  and ``truncated_upto`` (so a seq is never handed out twice, even once all is truncated);
* ``records(seq, txn, kind, table_name, meta, payload, crc, seg, off, size)``: ``txn``
  numbers the transaction that wrote the record, ``crc`` is :func:`crc` over all the rest;
  a large payload is in a payload file (:mod:`flight.durability.payloads`): ``payload`` is
  empty and ``(seg, off, size)`` say where it is (NULL for an inline payload);
* ``dedupe_streams(stream_id, seq, batch_id, at)``: a short history per stream (the
  newest row wins), so that cutting a torn tail restores the batch id before it;
* ``dedupe_writes(write_id, result, seq, at)``.

``payloads/`` beside it holds the payload files; ``journal.lock`` is ``flock``-ed by the process that has the journal open.

The journal's errors, split by what the operator must do (:class:`~engine.errors.JournalError`
and its subclasses), are in the one tree of :mod:`engine.errors`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import google_crc32c
import pyarrow as pa

from engine.errors import JournalCorrupt, JournalFull, JournalIncompatible, JournalUnavailable
from flight.durability import payloads as _payloads

log = logging.getLogger(__name__)

#: The database's file name inside the data dir.
FILENAME = "journal.sqlite"
#: The on-disk format this module reads and writes; any other refuses to open, except
#: version 1 (every payload inline), which is upgraded in place.
VERSION = 2
_FORMAT = "ticktable-journal"

# 64 KiB pages: a 2 MB payload spans 32 overflow pages instead of 512 (bench_journal.py).
_PAGE_SIZE = 65536
# The flusher checkpoints the WAL into the database after this much WAL (SQLite's own
# autocheckpoint): one pause per 64 MiB written, instead of a WAL that grows until the
# next truncate().
_WAL_AUTOCHECKPOINT_PAGES = (64 << 20) // _PAGE_SIZE
SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 8, 10, 13, 14
# errors of the disk, not of the file's content (at open: JournalUnavailable, not Corrupt)
_CANNOT_WRITE = {SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN}

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE records(
    seq INTEGER PRIMARY KEY, txn INTEGER NOT NULL, kind TEXT NOT NULL, table_name TEXT,
    meta BLOB NOT NULL, payload BLOB NOT NULL, crc INTEGER NOT NULL,
    seg INTEGER, off INTEGER, size INTEGER);
CREATE TABLE dedupe_streams(
    stream_id TEXT NOT NULL, seq INTEGER NOT NULL, batch_id INTEGER NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (stream_id, seq)) WITHOUT ROWID;
CREATE TABLE dedupe_writes(
    write_id TEXT PRIMARY KEY, result BLOB NOT NULL, seq INTEGER NOT NULL, at REAL NOT NULL);
CREATE INDEX dedupe_writes_seq ON dedupe_writes(seq);
"""

_Row = tuple[int, int, str, "str | None"]  # (seq, txn, kind, table) of a record


# ------------------------------------------------------------------------------ connections
def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with our PRAGMAs."""
    if readonly:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")  # a new file only: before WAL mode
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT_PAGES}")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


class transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on an exception before COMMIT."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self._conn.execute("COMMIT")
        elif self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def body_crc(meta: Any, payload: Any, *, external: bool) -> int:
    """The CRC of a record's ``meta`` then ``payload`` (bytes-like, or
    :class:`~flight.durability.payloads.Framed`: over its pieces in order).

    A payload in a payload file: CRC32C (``google-crc32c``, in hardware where the CPU has
    it: several times faster than zlib's CRC32 on the writer's thread). An inline payload:
    zlib's CRC32, as format version 1 wrote it.
    """
    if external:
        value = google_crc32c.value(_bytes_like(meta))
        for piece in (payload.pieces() if isinstance(payload, _payloads.Framed) else (payload,)):
            value = google_crc32c.extend(value, _bytes_like(piece))
        return int(value)
    return zlib.crc32(payload, zlib.crc32(meta))


def _bytes_like(data: Any) -> Any:
    return data if isinstance(data, (bytes, pa.Buffer)) else pa.py_buffer(data)


def crc(seq: int, txn: int, kind: str, table: str | None, body_crc: int) -> int:
    """CRC32 of a record: ``body_crc`` (over meta, then payload) continued over the rest."""
    return zlib.crc32(repr((seq, txn, kind, table)).encode(), body_crc)


def primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of ``exc`` (``SQLITE_FULL``, ...), if it has one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def classify(exc: sqlite3.Error, path: Path) -> tuple[type[JournalUnavailable], str]:
    """The error class and a one-line reason for a write that failed with ``exc``."""
    primary = primary_code(exc)
    if primary == SQLITE_FULL:
        return JournalFull, f"disk full ({exc})"
    try:
        readonly = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    if primary == SQLITE_READONLY or readonly:
        return JournalUnavailable, f"read-only ({exc})"
    if primary == SQLITE_IOERR:
        return JournalUnavailable, f"I/O error ({exc})"
    return JournalUnavailable, f"cannot write ({getattr(exc, 'sqlite_errorname', 'error')}: {exc})"


def disk_size(path: Path) -> int:
    """Bytes on disk of the database, its WAL and the payload files."""
    total = _payloads.disk_size(path.parent)
    for p in (path, path.with_name(path.name + "-wal")):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


# ------------------------------------------------------------------------------------- open
def open_files(root: Path) -> tuple[Path, sqlite3.Connection, int, int, int,
                                    _payloads.PayloadWriter]:
    """Lock, open and check the journal in ``root``.

    Returns (path, connection, lock fd, next seq, next txn, payload writer).

    Raises the errors :meth:`~flight.durability.journal.Journal.open` documents.
    """
    path = root / FILENAME
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission, a read-only disk
        what = "is a file, not a directory" if root.is_file() else f"cannot be created ({exc.strerror})"
        raise JournalUnavailable(path, f"the data dir {root} {what}") from exc
    lock_fd = _lock(root / "journal.lock", path)
    try:
        conn = connect(path, readonly=False)
        try:
            next_seq, next_txn = _recover(conn, path)
            ends = dict(conn.execute("SELECT seg, max(off + size) FROM records "
                                     "WHERE seg IS NOT NULL GROUP BY seg").fetchall())
            try:
                payloads = _payloads.open_payloads(root, ends)
            except OSError as exc:  # tidying a payload file on a read-only or failing disk
                full, reason = _payloads.classify(exc, root / _payloads.DIRNAME / "x")
                raise (JournalFull if full else JournalUnavailable)(
                    path, f"cannot tidy the payload files in {root / _payloads.DIRNAME}: "
                          f"{reason}") from exc
        except BaseException:
            conn.close()
            raise
    except sqlite3.Error as exc:
        os.close(lock_fd)
        if primary_code(exc) in _CANNOT_WRITE:
            cls, reason = classify(exc, path)
            raise cls(path, f"cannot open {path}: {reason}") from exc
        raise JournalCorrupt(path, f"is damaged or not an SQLite database ({exc})") from exc
    except BaseException:
        os.close(lock_fd)
        raise
    return path, conn, lock_fd, next_seq, next_txn, payloads


def _lock(lock_path: Path, path: Path) -> int:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        reason = "read-only" if exc.errno == errno.EROFS else "cannot write"
        raise JournalUnavailable(path, f"cannot open {lock_path}: {reason} ({exc.strerror})"
                                 ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalUnavailable(path, f"{path} is open in another process (it holds "
                                 f"{lock_path.name}); stop it first") from None
    return fd


def _recover(conn: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Check the file, create or verify the schema, cut a torn tail: (next seq, next txn)."""
    problems = [" ".join(r[0].split()) for r in conn.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise JournalCorrupt(path, f"PRAGMA quick_check failed: {problems[0]}"
                             + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} INSERT INTO meta VALUES "
                           f"('format', '{_FORMAT}'), ('version', '{VERSION}'), "
                           f"('truncated_upto', '0'); COMMIT;")
        log.info("journal %s created (format version %d)", path, VERSION)
    elif "meta" not in tables:
        raise JournalIncompatible(path, "is an SQLite database but not a Ticktable journal "
                                  "(no meta table); point the server at another data dir")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("format") != _FORMAT:
        raise JournalIncompatible(path, f"is not a Ticktable journal (format "
                                  f"{meta.get('format')!r}); point the server at another data dir")
    if meta.get("version") == "1":  # payloads all inline: add the payload-file columns
        with transaction(conn):
            for column in ("seg", "off", "size"):
                conn.execute(f"ALTER TABLE records ADD COLUMN {column} INTEGER")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(VERSION),))
        meta["version"] = str(VERSION)
        log.info("journal %s upgraded from format version 1 to %d", path, VERSION)
    if meta.get("version") != str(VERSION):
        raise JournalIncompatible(path, f"has format version {meta.get('version')}, this "
                                  f"Ticktable reads version {VERSION}: run the Ticktable that "
                                  f"wrote it, or move the data dir aside")
    _cut_torn_tail(conn, path)
    last_seq, last_txn = conn.execute("SELECT max(seq), max(txn) FROM records").fetchone()
    return max(last_seq or 0, int(meta["truncated_upto"])) + 1, (last_txn or 0) + 1


def _cut_torn_tail(conn: sqlite3.Connection, path: Path) -> None:
    """Verify every record's CRC; cut failing records at the end with their transaction.

    A COMMIT is atomic, so the records of a transaction that did not reach the disk whole
    all go, the whole ones among them too. Failing records anywhere else: JournalCorrupt.
    """
    bad: list[_Row] = []    # failing records since the last whole one
    last: list[_Row] = []   # the whole records of the last transaction seen whole
    files: dict[int, Path] = {}  # the payload file of each failing record that has one
    rows = conn.execute("SELECT seq, txn, kind, table_name, meta, payload, crc, seg, off, size "
                        "FROM records ORDER BY seq")
    with _payloads.PayloadReader(path.parent) as reader:
        for seq, txn, kind, table, meta, payload, stored, seg, off, size in rows:
            row = (seq, txn, kind, table)
            if seg is not None:
                try:
                    payload = reader.read(seg, off, size)
                except FileNotFoundError:
                    file = _payloads.segment_path(path.parent, seg)
                    raise JournalCorrupt(path, f"record {_name(row)} refers to payload file "
                                         f"{file}, which is missing") from None
            whole = (len(payload) == (size if seg is not None else len(payload))
                     and crc(seq, txn, kind, table,
                             body_crc(meta, payload, external=seg is not None)) == stored)
            if not whole and seg is not None:
                files[seq] = _payloads.segment_path(path.parent, seg)
            _judge(path, row, whole, bad, last, files)
    _cut(conn, path, bad, last)


def _judge(path: Path, row: _Row, whole: bool, bad: list[_Row], last: list[_Row],
           files: dict[int, Path]) -> None:
    """One record of the scan in seq order: a failing one joins ``bad``; a whole one after a
    failing one is damage before the tail; ``last`` keeps the last whole transaction."""
    if not whole:
        bad.append(row)
        return
    if bad:
        where = f" (its payload in {files[bad[0][0]]})" if bad[0][0] in files else ""
        raise JournalCorrupt(path, f"record {_name(bad[0])}{where} fails its checksum but "
                             f"record {row[0]} after it is whole (damage before the tail)")
    if last and last[-1][1] != row[1]:
        last.clear()
    last.append(row)


def _cut(conn: sqlite3.Connection, path: Path, bad: list[_Row], last: list[_Row]) -> None:
    """Cut the failing records ``bad`` with their transaction, if they are a torn tail."""
    if not bad:
        return
    txn = bad[0][1]
    if any(b[1] != txn for b in bad) or (last and txn < last[-1][1]):
        raise JournalCorrupt(path, f"{len(bad)} record(s) from {_name(bad[0])} on fail their "
                             f"checksums, in more than the last transaction")
    dropped = [r for r in last if r[1] == txn] + bad
    with transaction(conn):
        for table in ("records", "dedupe_streams", "dedupe_writes"):
            conn.execute(f"DELETE FROM {table} WHERE seq >= ?", (dropped[0][0],))
    shown = ", ".join(_name(r) for r in dropped[:10])
    more = f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""
    log.warning("journal %s: cut a torn tail of %d record(s), never acknowledged (%d failing "
                "their checksums; their transaction did not reach the disk whole): %s%s",
                path, len(dropped), len(bad), shown, more)


def _name(row: _Row) -> str:
    seq, _, kind, table = row
    return f"seq {seq} ({kind} {table!r})" if table is not None else f"seq {seq} ({kind})"
