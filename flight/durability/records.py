"""What goes into the journal and comes back out (DESIGN.md §8): its values and payloads.

:mod:`flight.durability.journal` is the API and the group commit; this module holds the values that
cross that API and the encoding of a record's payload:

* :data:`Blob`, the bytes-like values a record's ``meta`` and ``payload`` may be, and
  :data:`Payload`, a ``Blob`` or a :class:`~flight.durability.payloads.Framed` payload in
  pieces (:func:`payload_size`);
* :class:`DedupeUpdate`, idempotency state written in the same transaction as its record;
* :class:`Chain`, one writer's records, which become durable as a prefix;
* :class:`Record`, a durable record as :meth:`~flight.durability.journal.Journal.records` reads it;
* :class:`JournalStats`, the counters of the ``stats`` action;
* :func:`ipc_bytes` and :func:`read_ipc`, a payload as one Arrow IPC stream and back;
* :class:`AlignedSlabs`, the reused page-aligned memory :func:`ipc_bytes` writes large
  payloads into.

Invariants relied on:

* **Nothing handed over changes**: the journal checksums a record on its writer's thread
  and writes it later from the flusher's, so the frozen values cannot change and a
  ``Blob`` must not be written to until its record's future is done. The one exception
  is a chain's ``broken``: set once, never cleared, by the flusher under the journal's
  lock, and read under that lock.
* **A payload is one IPC stream, read up to its end-of-stream marker.** :func:`ipc_bytes`
  may follow the marker with zero padding (a stream bound for a payload file, laid out
  in page-aligned memory for ``O_DIRECT``, :mod:`flight.durability.payloads`); the padding
  is stored and checksummed like the rest, and :func:`read_ipc` never sees it. A payload
  that is not aligned is still correct: it is written through the page cache.
* **Aligned memory is reused only when unreferenced** (:class:`AlignedSlabs`): a slab goes
  back into use once no view of it is left, so a payload never changes while its record
  is queued, or while anything read from it lives.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flight.durability import payloads as _payloads
from flight.durability.payloads import Framed as Framed

__all__ = [
    "AlignedSlabs",
    "Blob",
    "Chain",
    "DedupeUpdate",
    "Framed",
    "JournalStats",
    "Payload",
    "Record",
    "ipc_bytes",
    "payload_size",
    "read_ipc",
]

#: Bytes-like values the journal stores: ``bytes``, ``memoryview``, ``pyarrow.Buffer``, ...
Blob: TypeAlias = "bytes | bytearray | memoryview | pa.Buffer"
#: A record's payload: a ``Blob``, or a large one in pieces (written without joining them).
Payload: TypeAlias = "Blob | Framed"


def payload_size(payload: Payload) -> int:
    """The bytes of ``payload``."""
    return payload.nbytes if isinstance(payload, Framed) else memoryview(payload).nbytes


@dataclass(frozen=True, slots=True)
class DedupeUpdate:
    """Idempotency state written in the same transaction as its record.

    ``streams``: ``(stream_id, batch_id)`` pairs, each stream's last applied batch id from
    now on. ``writes``: ``(write_id, result)`` pairs, a write committed with this result
    (the first result recorded for a write id stays).
    """

    streams: tuple[tuple[str, int], ...] = ()
    writes: tuple[tuple[str, bytes], ...] = ()


class Chain:
    """Records of one writer that must become durable as a prefix (one DoPut stream).

    Pass the same chain to :meth:`~flight.durability.journal.Journal.submit` for each record. Once one
    of them fails to become durable (disk full, read-only, I/O error), the chain is broken:
    its records still queued fail with the same error without being written, and later
    submits are refused, so no record of the chain is durable after one that is not.
    """

    __slots__ = ("broken",)

    def __init__(self) -> None:
        self.broken: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One journaled change, as :meth:`~flight.durability.journal.Journal.records` reads it back."""

    seq: int
    kind: str
    table: str | None
    meta: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counters for the ``stats`` action (since this process opened the journal)."""

    last_seq: int          # the highest durable seq (0: none yet)
    appended: int          # records made durable
    commits: int           # transactions (fsyncs) that made them durable
    failed_commits: int    # transactions rolled back (disk full, read-only, I/O error)
    bytes_appended: int    # meta + payload bytes made durable
    size_bytes: int        # the files on disk now (database + WAL)


def ipc_bytes(data: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """Serialize ``data`` as one Arrow IPC stream, for a record's ``payload``.

    Uncompressed: LZ4 costs the writer's thread more than it saves of the payload file's
    write (bench/README.md). Returns a ``pyarrow.Buffer``: bytes-like, the journal takes
    it without a copy into ``bytes``.

    A stream of :data:`~flight.durability.payloads.EXTERNAL_MIN_BYTES` or more (bound for a
    payload file) is written into page-aligned memory and zero-padded to a multiple of
    :data:`~flight.durability.payloads.ALIGN` (Arrow readers stop at the end-of-stream
    marker), so the journal can write it with ``O_DIRECT``: no copy into the page cache,
    and a fraction of the CPU a write through it takes. That memory is a slab of
    :class:`AlignedSlabs`, reused once nothing refers to the returned buffer.
    """
    size = 0
    if data.get_total_buffer_size() >= _payloads.EXTERNAL_MIN_BYTES:  # O(1), unlike nbytes
        mock = pa.MockOutputStream()  # the stream's size, without writing it
        with ipc.new_stream(mock, data.schema) as writer:
            writer.write(data)
        size = mock.size()
    if size < _payloads.EXTERNAL_MIN_BYTES:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, data.schema) as writer:
            writer.write(data)
        return sink.getvalue()
    padded = -(-size // _payloads.ALIGN) * _payloads.ALIGN
    view = _SLABS.take(padded)
    view[size:] = 0
    buf = pa.py_buffer(view)
    with ipc.new_stream(pa.FixedSizeBufferWriter(buf), data.schema) as writer:
        writer.write(data)
    return buf


class AlignedSlabs:
    """Page-aligned memory for payloads bound for ``O_DIRECT``, reused once nothing refers to it.

    Fresh memory for each payload costs the kernel's page faults and zeroing: with a
    stream's payloads in flight (so that the allocator cannot hand the last one's pages
    back) 100-200 us per 2.3 MB batch, more than the copy into it (bench/README.md). A
    slab is handed out again only when no view of it is left: its reference count is
    back to the pool's own (every view, ``pyarrow.Buffer`` over it and Arrow array read
    from it holds a reference to the slab through NumPy's ``base``). So the journal's
    rule, a handed-over ``Blob`` never changes while anyone may read it, still holds.

    At most ``keep_bytes`` of slabs are kept; past it a payload gets memory of its own,
    as before. Thread-safe: the pool's list is changed under its lock, and a slab's
    count can only drop to the pool's own outside it.
    """

    def __init__(self, keep_bytes: int = 128 << 20, align: int = _payloads.ALIGN) -> None:
        self._keep = keep_bytes
        self._align = align
        self._lock = threading.Lock()
        self._slabs: list[np.ndarray] = []  # unaligned arrays; the aligned part is used
        self._held = 0                      # bytes in self._slabs

    def take(self, nbytes: int) -> np.ndarray:
        """A writable, ``align``-aligned ``uint8`` array of ``nbytes`` (a multiple of ``align``).

        A free slab at least this large, and at most twice it (or 1 MiB more), is
        reused; else a new one is made, kept if the pool has room.
        """
        align, limit = self._align, max(2 * nbytes, nbytes + (1 << 20))
        with self._lock:
            slabs = self._slabs
            for i in range(len(slabs)):
                # 2: the list's reference and getrefcount's argument; any more is a view
                if sys.getrefcount(slabs[i]) == 2 and nbytes + align <= slabs[i].size <= limit:
                    return self._aligned(slabs[i], nbytes)
            size = -(-nbytes // (256 << 10)) * (256 << 10) + align
            raw = np.empty(size, np.uint8)
            if self._held + size > self._keep:  # make room: drop free slabs
                kept = []
                for i in range(len(slabs)):
                    if sys.getrefcount(slabs[i]) == 2 and self._held + size > self._keep:
                        self._held -= slabs[i].size
                    else:
                        kept.append(slabs[i])
                self._slabs = slabs = kept
            if self._held + size <= self._keep:
                slabs.append(raw)
                self._held += size
            return self._aligned(raw, nbytes)

    def held_bytes(self) -> int:
        """Bytes of slabs the pool keeps (free or in use)."""
        with self._lock:
            return self._held

    def _aligned(self, raw: np.ndarray, nbytes: int) -> np.ndarray:
        start = -raw.ctypes.data % self._align
        return raw[start: start + nbytes]


#: The slabs :func:`ipc_bytes` writes payload-file-bound streams into.
_SLABS = AlignedSlabs()


def read_ipc(payload: Blob) -> pa.Table:
    """The Arrow table in an IPC stream ``payload``; its columns point into ``payload``."""
    return ipc.open_stream(pa.py_buffer(payload)).read_all()
