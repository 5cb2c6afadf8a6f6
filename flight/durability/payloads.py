"""The journal's payload files: large record payloads, written once, beside the database.

A payload of :data:`EXTERNAL_MIN_BYTES` or more (a record batch's Arrow IPC stream) is not
stored in SQLite: it is appended to the current file of ``<data dir>/payloads/``
(``00000001.ipc``, ``00000002.ipc``, ...) and its record in ``journal.sqlite`` holds
``(seg, off, size)`` instead; its CRC is CRC32C (:func:`flight.durability.journal_files.body_crc`).

Why: SQLite writes a large blob twice (into the WAL, then into the database at the WAL's
checkpoint, stalling the flusher meanwhile) and copies it through its page cache:
committing a batch that way takes several times what writing it to a payload file takes
(figures: bench/README.md). Each payload starts at a multiple of :data:`ALIGN`; one that
:func:`flight.durability.records.ipc_bytes` laid out in aligned, padded memory is written
with ``O_DIRECT`` (DMA from that memory, no copy into the page cache, a fraction of the
CPU), any other through the page cache.
A :class:`Framed` payload (a received message's body between a small head and tail,
not copied) is placed so that its body's address and file offset agree modulo
:data:`ALIGN`: the body's whole pages go out with ``O_DIRECT`` straight from where they
are, its partial first and last pages, with the head and the tail, from a page or two
copied into aligned memory (zeros around them). Such a payload starts wherever that puts
it in its first page, not at a multiple of :data:`ALIGN`; a group's ``O_DIRECT`` pages
are back to back, written with one ``pwritev``.
Filesystems without ``O_DIRECT`` (tmpfs) get the page cache for all.

The database stays the single source of truth and the commit point:

* a group's payloads are written and ``fdatasync``-ed *before* the SQLite COMMIT that
  refers to them, and a new file's directory entry is ``fsync``-ed before the file is
  first referred to, so a committed record's payload is always whole on disk;
* bytes after the last committed payload of a file (a crash or a failed write between
  the payload write and the COMMIT) were never acknowledged: :func:`open_payloads` cuts
  them, and deletes files no record refers to;
* a file a record refers to that is missing or short, or a payload failing its CRC, is
  judged like any failing record by the torn-tail rule of :mod:`flight.durability.journal_files`.

Writes happen only in the journal's flusher thread; reads (recovery) open their own
descriptors.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

#: Payloads at least this large go to a payload file; smaller ones stay in the database.
EXTERNAL_MIN_BYTES = 64 << 10
#: A payload file is closed for writing once it holds this much; the next write starts one.
SEGMENT_BYTES = 64 << 20
#: Payload offsets (and, where the payload allows it, lengths and addresses) are multiples
#: of this, so that they can be written with O_DIRECT (no copy into the page cache).
ALIGN = 4096
#: The payload files' directory inside the data dir.
DIRNAME = "payloads"

#: Payloads per pwritev, below every platform's IOV_MAX (1024 on Linux).
_MAX_IOV = 512

_NAME = re.compile(r"^(\d{8})\.ipc$")


@dataclass(frozen=True, slots=True)
class Framed:
    """A payload in three pieces, written (and checksummed) back to back as one.

    ``body`` is the bulk, left where it is (the body of a record batch's IPC message as
    received: copying it into aligned memory for ``O_DIRECT`` would cost more than its
    write); ``head`` and ``tail`` are small. Like any payload handed to the journal, none
    of the pieces may change until its record's future is done.
    """

    head: bytes
    body: memoryview
    tail: bytes

    @property
    def nbytes(self) -> int:
        """The payload's size."""
        return len(self.head) + self.body.nbytes + len(self.tail)

    def pieces(self) -> tuple[Any, Any, Any]:
        """The three pieces, in order."""
        return self.head, self.body, self.tail


def segment_path(root: Path, seg: int) -> Path:
    """The file of payload segment ``seg`` in data dir ``root``."""
    return root / DIRNAME / f"{seg:08d}.ipc"


def _segments(root: Path) -> dict[int, Path]:
    folder = root / DIRNAME
    if not folder.is_dir():
        return {}
    out = {}
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_size(root: Path) -> int:
    """Bytes in the payload files of data dir ``root``."""
    total = 0
    for p in _segments(root).values():
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


class PayloadReader:
    """Reads payloads by ``(seg, off, size)``; keeps one descriptor per file until closed."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._fds: dict[int, int] = {}

    def read(self, seg: int, off: int, size: int) -> bytes:
        """The payload's bytes; shorter than ``size`` if the file ends before it.

        Raises
        ------
        FileNotFoundError
            If the segment's file does not exist.
        """
        fd = self._fds.get(seg)
        if fd is None:
            fd = self._fds[seg] = os.open(segment_path(self._root, seg), os.O_RDONLY)
        return os.pread(fd, size, off)

    def close(self) -> None:
        """Close every descriptor."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> PayloadReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PayloadWriter:
    """Appends payloads to the current segment file; owned by the journal's flusher.

    Open with :func:`open_payloads`.
    """

    def __init__(self, root: Path, next_seg: int) -> None:
        self._root = root
        self._next_seg = next_seg
        self._seg: int | None = None   # the file being written, if one is open
        self._fd = -1
        self._direct = -1
        self._end = 0                  # bytes of whole, durable payloads in it

    @property
    def current(self) -> int | None:
        """The segment being written, or None before the first write (or after a reset)."""
        return self._seg

    def mark(self) -> tuple[int | None, int]:
        """The position to :meth:`rollback` to if the next group is not committed."""
        return self._seg, self._end

    def write(self, payloads: Sequence[Any]) -> tuple[int, list[int]]:
        """Append ``payloads`` (bytes-like) to one file and make them durable.

        Returns the segment and each payload's offset. Starts a new file first if the
        current one holds :data:`SEGMENT_BYTES` or more.

        Raises
        ------
        OSError
            The disk is full, read-only or failing; nothing after :meth:`mark` counts.
        """
        if self._seg is None or self._end >= SEGMENT_BYTES:
            self._start()
        assert self._seg is not None
        offsets, at = [], self._end
        run: list[memoryview] = []   # aligned views back to back from run_at: one pwritev
        run_at = run_end = 0
        for payload in payloads:
            placed = self._placed(payload, at) if self._direct >= 0 else None
            if placed is not None:  # O_DIRECT: its pages, from a page boundary
                off, first, views = placed
                if run and (first != run_end or len(run) + len(views) > _MAX_IOV):
                    self._write_direct(run, run_at)
                    run = []
                if not run:
                    run_at = run_end = first
                run += views
                run_end += sum(v.nbytes for v in views)
                offsets.append(off)
                at = off + _size(payload)
                continue
            self._write_direct(run, run_at)
            run = []
            if not isinstance(payload, Framed):
                at = -(-at // ALIGN) * ALIGN
            offsets.append(at)
            pieces = payload.pieces() if isinstance(payload, Framed) else (payload,)
            _write_all(self._fd, [memoryview(v).cast("B") for v in pieces], at)
            at += _size(payload)
        self._write_direct(run, run_at)
        os.fdatasync(self._fd)
        self._end = at
        return self._seg, offsets

    @staticmethod
    def _placed(payload: Any, end: int) -> tuple[int, int, list[memoryview]] | None:
        """Where ``payload`` goes with ``O_DIRECT`` after ``end``: its offset, and the
        page-aligned views to write from a page boundary; ``None`` if it cannot.

        An aligned ``pyarrow.Buffer`` of whole pages starts at the next page. A
        :class:`Framed` payload's body is placed where its address and offset agree
        modulo :data:`ALIGN`, so that its whole pages are written from where they are;
        its partial first and last pages, with the head and tail, are copied into
        aligned memory of their own (zeros before the head and after the tail).
        """
        first = -(-end // ALIGN) * ALIGN
        if not isinstance(payload, Framed):
            if (isinstance(payload, pa.Buffer) and payload.address % ALIGN == 0
                    and payload.size % ALIGN == 0):
                return first, first, [memoryview(payload).cast("B")]
            return None
        body = payload.body.cast("B")
        address = pa.py_buffer(body).address
        off = first + (address - len(payload.head) - first) % ALIGN
        lo = -address % ALIGN                                     # body bytes before a page
        hi = (address + body.nbytes) // ALIGN * ALIGN - address   # ... up to its last page
        if hi <= lo:  # no whole page of the body: all of it copied
            return off, first, [_bounce(off - first, payload.head, body, payload.tail)]
        return off, first, [_bounce(off - first, payload.head, body[:lo]), body[lo:hi],
                            _bounce(0, body[hi:], payload.tail)]

    def _write_direct(self, views: list[memoryview], at: int) -> None:
        """Write aligned ``views``, back to back from ``at``, with one ``O_DIRECT`` pwritev
        (falling back to the page cache for what it did not write)."""
        if not views:
            return
        done = 0
        if self._direct >= 0:
            try:
                done = os.pwritev(self._direct, views, at)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # a filesystem that opens O_DIRECT but refuses its writes: the page cache
                log.info("journal: %s refuses O_DIRECT writes (%s); writing through the "
                         "page cache", segment_path(self._root, self._seg or 0), exc.strerror)
                os.close(self._direct)
                self._direct = -1
        for view in views:  # after a short write the rest is not aligned: the page cache
            if done >= view.nbytes:
                done -= view.nbytes
            else:
                _write_all(self._fd, [view[done:]], at + done)
                done = 0
            at += view.nbytes

    def rollback(self, mark: tuple[int | None, int]) -> None:
        """Forget what was written after ``mark`` (its COMMIT failed): later writes reuse it."""
        seg, end = mark
        if seg == self._seg:
            self._end = end

    def release(self, live: set[int]) -> int:
        """Delete the segment files no record refers to (after a truncate); return how many."""
        gone = 0
        for seg, path in _segments(self._root).items():
            if seg in live:
                continue
            if seg == self._seg:
                self._close_files()
            try:
                path.unlink()
                gone += 1
            except FileNotFoundError:
                pass
        return gone

    def close(self) -> None:
        """Close the current file."""
        if self._seg is not None:
            self._close_files()

    def _close_files(self) -> None:
        os.close(self._fd)
        if self._direct >= 0:
            os.close(self._direct)
        self._seg, self._fd, self._direct, self._end = None, -1, -1, 0

    def _start(self) -> None:
        folder = self._root / DIRNAME
        if not folder.is_dir():
            folder.mkdir()
            _fsync_dir(self._root)
        seg = self._next_seg
        fd = os.open(segment_path(self._root, seg), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _fsync_dir(folder)  # the new name is durable before a record refers to it
        except OSError:
            os.close(fd)
            raise
        if self._seg is not None:
            self._close_files()
        try:  # a second descriptor for aligned payloads: written without the page cache
            direct = os.open(segment_path(self._root, seg), os.O_WRONLY | os.O_DIRECT)
        except (OSError, AttributeError):  # tmpfs and others refuse O_DIRECT
            direct = -1
        self._seg, self._fd, self._direct, self._end = seg, fd, direct, 0
        self._next_seg = seg + 1


def _size(payload: Any) -> int:
    return payload.nbytes if isinstance(payload, Framed) else memoryview(payload).nbytes


def _bounce(zeros: int, *pieces: Any) -> memoryview:
    """``zeros`` zero bytes, then ``pieces``, in page-aligned memory padded with zeros to
    whole pages."""
    n = zeros + sum(memoryview(p).nbytes for p in pieces)
    raw = np.zeros(-(-n // ALIGN) * ALIGN + ALIGN, np.uint8)
    out = raw[-raw.ctypes.data % ALIGN:][: -(-n // ALIGN) * ALIGN]
    at = zeros
    for p in pieces:
        view = np.frombuffer(p, np.uint8)
        out[at: at + view.size] = view
        at += view.size
    return out.data


def _write_all(fd: int, views: list[memoryview], at: int) -> None:
    """pwrite ``views`` back to back from ``at``, however many calls it takes."""
    for view in views:
        done = 0
        while done < view.nbytes:  # pwrite may write less than asked
            done += os.pwrite(fd, view[done:], at + done)
        at += view.nbytes


def open_payloads(root: Path, ends: dict[int, int]) -> PayloadWriter:
    """Tidy the payload files at open and return the writer for new payloads.

    ``ends`` maps each segment some record refers to onto the end of its last payload.
    Bytes past that end (never acknowledged) are cut; files no record refers to are
    deleted. New payloads go to a new file.
    """
    files = _segments(root)
    for seg, path in files.items():
        end = ends.get(seg)
        if end is None:
            path.unlink()
            log.info("journal: deleted payload file %s (no record refers to it)", path)
        elif path.stat().st_size > end:
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            log.info("journal: cut payload file %s back to %d bytes (the rest was never "
                     "acknowledged)", path, end)
    return PayloadWriter(root, max([*files, *ends], default=0) + 1)


def classify(exc: OSError, path: Path) -> tuple[bool, str]:
    """For a failed payload write: (is the disk full, a one-line reason)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True, f"disk full ({exc.strerror})"
    try:
        readonly = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    if exc.errno == errno.EROFS or readonly:
        return False, f"read-only ({exc.strerror})"
    if exc.errno == errno.EIO:
        return False, f"I/O error ({exc.strerror})"
    return False, f"cannot write ({exc.strerror})"
