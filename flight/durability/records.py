"""What goes into the journal and comes back out (DESIGN.md §8): its values and payloads.

:mod:`flight.durability.journal` is the API and the group commit; this module holds the values that
cross that API and the encoding of a record's payload:

* :data:`Blob`, the bytes-like values a record's ``meta`` and ``payload`` may be;
* :class:`DedupeUpdate`, idempotency state written in the same transaction as its record;
* :class:`Chain`, one writer's records, which become durable as a prefix;
* :class:`Record`, a durable record as :meth:`~flight.durability.journal.Journal.records` reads it;
* :class:`JournalStats`, the counters of the ``stats`` action;
* :func:`ipc_bytes` and :func:`read_ipc`, a payload as one Arrow IPC stream and back.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flight.durability import payloads as _payloads

__all__ = [
    "Blob",
    "Chain",
    "DedupeUpdate",
    "JournalStats",
    "Record",
    "ipc_bytes",
    "read_ipc",
]

#: Bytes-like values the journal stores: ``bytes``, ``memoryview``, ``pyarrow.Buffer``, ...
Blob: TypeAlias = "bytes | bytearray | memoryview | pa.Buffer"


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
    and a fraction of the CPU a write through it takes.
    """
    if data.nbytes < _payloads.EXTERNAL_MIN_BYTES:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, data.schema) as writer:
            writer.write(data)
        return sink.getvalue()
    mock = pa.MockOutputStream()  # the stream's size, without writing it
    with ipc.new_stream(mock, data.schema) as writer:
        writer.write(data)
    size = mock.size()
    align = _payloads.ALIGN
    padded = -(-size // align) * align
    raw = np.empty(padded + align, np.uint8)
    start = -raw.ctypes.data % align
    view = raw[start: start + padded]
    view[size:] = 0
    buf = pa.py_buffer(view)
    with ipc.new_stream(pa.FixedSizeBufferWriter(buf), data.schema) as writer:
        writer.write(data)
    return buf


def read_ipc(payload: Blob) -> pa.Table:
    """The Arrow table in an IPC stream ``payload``; its columns point into ``payload``."""
    return ipc.open_stream(pa.py_buffer(payload)).read_all()
