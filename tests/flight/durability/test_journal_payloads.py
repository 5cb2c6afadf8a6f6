"""flight/durability/payloads.py through the journal: large payloads in files of their own,
written once, page-aligned, torn or damaged files at recovery, and the format upgrade.

Real files in ``tmp_path`` and real fsyncs, as in ``test_journal.py`` (whose helpers make
the records and the damage here).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import flight.durability.payloads as journal_payloads
from engine.errors import JournalCorrupt, JournalUnavailable
from flight.durability.journal import FILENAME, Journal
from flight.durability.records import AlignedSlabs, DedupeUpdate, Framed, ipc_bytes, read_ipc
from tests.flight.durability.test_journal import _aligned, _five_records, _marker, _sql, _table


# ----------------------------------------------------------------------------- payload files
def _payload_files(root: Path) -> list[Path]:
    return sorted((root / "payloads").glob("*.ipc"))


def test_large_payloads_are_written_once_to_payload_files(tmp_path: Path) -> None:
    t = _table(20_000)
    big = ipc_bytes(t)
    assert big.size >= journal_payloads.EXTERNAL_MIN_BYTES
    with Journal.open(tmp_path) as j:
        j.append("append", "t", b"m1", _marker(1))          # inline
        j.append("append", "t", b"m2", big)                  # to a payload file
        j.append("append", "t", b"m3", _marker(3, 200_000))  # to the same file
        [(inline, seg, off, size)] = _sql(j.path, "SELECT length(payload), seg, off, size "
                                                  "FROM records WHERE seq = 1")
        assert (inline, seg, off, size) == (len(_marker(1)), None, None, None)
        assert _sql(j.path, "SELECT length(payload), seg, off, size FROM records "
                            "WHERE seq > 1 ORDER BY seq") == [
            (0, 1, 0, big.size), (0, 1, big.size, len(_marker(3, 200_000)))]
        assert segment_bytes(tmp_path)[:big.size] == big.to_pybytes()
        [segment] = _payload_files(tmp_path)
        assert segment.stat().st_size == big.size + len(_marker(3, 200_000))
        assert j.size_bytes() >= segment.stat().st_size + j.path.stat().st_size
    with Journal.open(tmp_path) as j:
        got = list(j.records())
        assert got[0].payload == _marker(1) and got[2].payload == _marker(3, 200_000)
        assert read_ipc(got[1].payload).equals(t)
        j.append("append", "t", b"m4", _marker(4, 100_000))  # after a reopen: a new file
    assert [p.name for p in _payload_files(tmp_path)] == ["00000001.ipc", "00000002.ipc"]


def segment_bytes(root: Path) -> bytes:
    [segment] = _payload_files(root)
    return segment.read_bytes()


def test_a_payload_bound_for_a_file_is_page_aligned_and_padded(tmp_path: Path) -> None:
    # laid out for O_DIRECT: aligned address, length a multiple of ALIGN, zero padding
    t = _table(20_000)
    big, small = ipc_bytes(t), ipc_bytes(_table(10))
    assert big.address % journal_payloads.ALIGN == 0 and big.size % journal_payloads.ALIGN == 0
    plain = pa.BufferOutputStream()
    with pa.ipc.new_stream(plain, t.schema) as w:
        w.write(t)
    exact = plain.getvalue()
    assert big.to_pybytes()[:exact.size] == exact.to_pybytes()
    assert set(big.to_pybytes()[exact.size:]) <= {0}
    assert read_ipc(big).equals(t)
    assert small.size < journal_payloads.EXTERNAL_MIN_BYTES  # small ones stay as they are
    with Journal.open(tmp_path) as j:  # an aligned and an unaligned payload in one file
        j.append("append", "t", b"", _marker(1, 100_000))
        j.append("append", "t", b"", big)
    with Journal.open(tmp_path) as j:
        got = list(j.records())
        assert got[0].payload == _marker(1, 100_000) and read_ipc(got[1].payload).equals(t)
    assert _sql(tmp_path / FILENAME, "SELECT off FROM records ORDER BY seq") == [
        (0,), (_aligned(len(_marker(1, 100_000))),)]


def test_a_filesystem_refusing_o_direct_writes_gets_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # some filesystems open O_DIRECT but answer EINVAL to its writes: fall back, lose nothing
    direct = _refuse_direct(monkeypatch)
    t = _table(20_000)
    with Journal.open(tmp_path) as j:
        assert j.append("append", "t", b"", ipc_bytes(t)) == 1
        assert j.append("append", "t", b"", ipc_bytes(t)) == 2
    assert direct  # it was tried
    monkeypatch.undo()
    with Journal.open(tmp_path) as j:
        assert [read_ipc(r.payload).equals(t) for r in j.records()] == [True, True]


def test_a_group_of_aligned_payloads_is_one_pwritev_and_a_short_one_is_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a group's aligned payloads go out back to back in one O_DIRECT pwritev; one that
    # writes less than asked (here: the first payload and half a page of the second) has
    # the rest written through the page cache, and every payload reads back whole
    calls: list[int] = []
    real_pwritev = os.pwritev

    def short(fd: int, views: Any, offset: int) -> int:
        calls.append(len(views))
        first = memoryview(views[0]).nbytes
        return real_pwritev(fd, [views[0], memoryview(views[1])[:2048]], offset) \
            if len(views) > 1 and first + 2048 <= sum(memoryview(v).nbytes for v in views) \
            else real_pwritev(fd, views, offset)

    monkeypatch.setattr(journal_payloads.os, "pwritev", short)
    tables = [_table(20_000 + i) for i in range(3)]
    blobs = [ipc_bytes(t) for t in tables]
    if not all(b.address % journal_payloads.ALIGN == 0 for b in blobs):
        pytest.skip("no aligned memory")
    writer = journal_payloads.open_payloads(tmp_path, {})
    seg, offsets = writer.write(blobs)
    writer.close()
    if calls:  # a filesystem with O_DIRECT (tmpfs has none: all through the page cache)
        assert calls == [3]
    assert offsets == [0, blobs[0].size, blobs[0].size + blobs[1].size]
    data = journal_payloads.segment_path(tmp_path, seg).read_bytes()
    for t, b, off in zip(tables, blobs, offsets, strict=True):
        assert data[off: off + b.size] == b.to_pybytes()
        assert read_ipc(data[off: off + b.size]).equals(t)


def _framed_cases() -> tuple[bytes, list[Framed]]:
    """Framed payloads whose bodies are slices of one buffer at every kind of alignment:
    page-aligned, one byte past, one byte short of a page, a head longer than a page,
    and a body shorter than a page (nothing of it written from where it is)."""
    memory = _marker(0, 1 << 20)
    view = memoryview(memory)
    start = -pa.py_buffer(memory).address % journal_payloads.ALIGN  # the first aligned byte
    cuts = [(start, 200_000, 300), (start + 1, 150_001, 57), (start + 4095, 70_000, 1),
            (start + 8, 80_000, 5000), (start + 300_000, 100, 2)]
    return memory, [Framed(b"H" * head, view[at: at + n], b"\xff\xff\xff\xff\0\0\0\0")
                    for at, n, head in cuts]


def test_framed_payloads_go_out_with_o_direct_from_where_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a framed payload's body is placed where its address and file offset agree modulo
    # ALIGN: its whole pages are written from the caller's memory (no copy), the rest from
    # aligned pages of its own; framed and aligned payloads back to back are one pwritev,
    # an unaligned payload between them goes through the page cache; all read back whole
    memory, framed = _framed_cases()
    lo, hi = pa.py_buffer(memory).address, pa.py_buffer(memory).address + len(memory)
    aligned = ipc_bytes(_table(20_000))
    payloads: list[Any] = [framed[0], framed[1], aligned, framed[2], _marker(9, 70_000),
                           framed[3], framed[4]]
    calls: list[tuple[int, list[tuple[int, int]]]] = []
    real_pwritev = os.pwritev

    def spy(fd: int, views: Any, offset: int) -> int:
        calls.append((offset, [(pa.py_buffer(v).address, memoryview(v).nbytes) for v in views]))
        return real_pwritev(fd, views, offset)

    monkeypatch.setattr(journal_payloads.os, "pwritev", spy)
    writer = journal_payloads.open_payloads(tmp_path, {})
    seg, offsets = writer.write(payloads)
    writer.close()
    data = journal_payloads.segment_path(tmp_path, seg).read_bytes()
    for payload, off in zip(payloads, offsets, strict=True):
        whole = (b"".join(bytes(p) for p in payload.pieces()) if isinstance(payload, Framed)
                 else bytes(payload))
        assert data[off: off + len(whole)] == whole
    assert offsets == sorted(offsets)
    if not calls:
        pytest.skip("no O_DIRECT here (tmpfs): all through the page cache")
    assert len(calls) == 2  # the unaligned payload splits the group's run in two
    for offset, views in calls:
        assert offset % journal_payloads.ALIGN == 0
        assert all(a % journal_payloads.ALIGN == 0 and n % journal_payloads.ALIGN == 0
                   for a, n in views)
    from_memory = [n for _, views in calls for a, n in views if lo <= a < hi]
    whole_pages = []  # each body's whole pages, from where they were (the short one has none)
    for f in framed:
        a, n, page = pa.py_buffer(f.body).address, f.body.nbytes, journal_payloads.ALIGN
        if (a + n) // page * page > -(-a // page) * page:
            whole_pages.append((a + n) // page * page - -(-a // page) * page)
    assert from_memory == whole_pages and len(whole_pages) == 4
    for payload, off in zip(payloads, offsets, strict=True):
        if isinstance(payload, Framed):  # the body at an offset agreeing with its address
            body = pa.py_buffer(payload.body).address
            assert (off + len(payload.head) - body) % journal_payloads.ALIGN == 0


def test_framed_payloads_through_the_journal_and_a_refusing_filesystem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the CRC covers the pieces in order (checked at open), with O_DIRECT and without it
    _, framed = _framed_cases()
    with Journal.open(tmp_path / "a") as j:
        seqs = [j.append("append", "t", b"m", p) for p in framed]
    _refuse_direct(monkeypatch)
    with Journal.open(tmp_path / "b") as j:
        assert [j.append("append", "t", b"m", p) for p in framed] == seqs
    monkeypatch.undo()
    for root in (tmp_path / "a", tmp_path / "b"):
        with Journal.open(root) as j:
            assert [r.payload for r in j.records()] == [
                b"".join(bytes(x) for x in p.pieces()) for p in framed]
    # a byte of a body's page written from the caller's memory, damaged: caught at open
    _damage_payload(tmp_path / "a", bytes(framed[0].body[180_000:180_026]))
    with pytest.raises(JournalCorrupt):
        Journal.open(tmp_path / "a")


def _refuse_direct(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """``pwrite`` and ``pwritev`` answering EINVAL on O_DIRECT descriptors opened from now
    on (some filesystems open O_DIRECT but refuse its writes); returns those descriptors."""
    direct: set[int] = set()
    real_open, real_pwrite, real_pwritev = os.open, os.pwrite, os.pwritev

    def spy_open(path: Any, flags: int, *args: Any) -> int:
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct.add(fd)
        return fd

    def refusing(real: Any) -> Any:
        def write(fd: int, data: Any, offset: int) -> int:
            if fd in direct:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, data, offset)
        return write

    monkeypatch.setattr(journal_payloads.os, "open", spy_open)
    monkeypatch.setattr(journal_payloads.os, "pwrite", refusing(real_pwrite))
    monkeypatch.setattr(journal_payloads.os, "pwritev", refusing(real_pwritev))
    return direct


def test_aligned_memory_is_reused_only_when_nothing_refers_to_it() -> None:
    # a payload's slab goes back into use only once no buffer, view or array read from it
    # is left: a payload never changes while its record is queued or its rows are read
    t, other = _table(20_000), _table(20_000).slice(1)
    slabs = AlignedSlabs(keep_bytes=64 << 20)
    first = slabs.take(1 << 20)
    address = first.ctypes.data
    assert address % journal_payloads.ALIGN == 0
    first[:] = 7
    held = pa.py_buffer(first)
    del first
    second = slabs.take(1 << 20)  # the first is held (through ``held``): a new slab
    assert second.ctypes.data != address and set(held.to_pybytes()) == {7}
    del second
    view = memoryview(held)
    del held
    third = slabs.take(1 << 20)   # still held, through ``view``
    assert third.ctypes.data != address
    del view, third
    fourth = slabs.take(1 << 20)  # nothing refers to it: reused
    assert fourth.ctypes.data == address
    del fourth
    # through ipc_bytes: rows read from a payload keep its memory as it was
    payload = ipc_bytes(t)
    rows = read_ipc(payload)
    del payload
    for _ in range(5):
        ipc_bytes(other)
    assert rows.equals(t)


def test_the_pool_keeps_at_most_its_bytes() -> None:
    slabs = AlignedSlabs(keep_bytes=3 << 20)
    held = [slabs.take(1 << 20) for _ in range(4)]  # the fourth is past the pool's room
    assert slabs.held_bytes() <= 3 << 20
    assert len({h.ctypes.data for h in held}) == 4
    del held
    big = slabs.take(2 << 20)  # room made by dropping free slabs
    assert slabs.held_bytes() <= 3 << 20 and big.size == 2 << 20


def test_truncate_deletes_the_payload_files_no_record_refers_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_payloads, "SEGMENT_BYTES", 250_000)  # a file per 3 records
    with Journal.open(tmp_path) as j:
        for i in range(1, 10):
            j.append("append", "t", b"", _marker(i, 100_000))
        assert len(_payload_files(tmp_path)) == 3
        j.truncate(4)  # records 1-3 were the first file; record 4 keeps the second
        assert [p.name for p in _payload_files(tmp_path)] == ["00000002.ipc", "00000003.ipc"]
        j.truncate(9)  # every record: the file being written goes too
        assert _payload_files(tmp_path) == []
        assert j.append("append", "t", b"", _marker(10, 100_000)) == 10
    with Journal.open(tmp_path) as j:
        assert [(r.seq, r.payload) for r in j.records()] == [(10, _marker(10, 100_000))]


def _five_payload_records(path: Path) -> None:
    with Journal.open(path) as j:
        for i in range(1, 6):
            j.append("append", "trades", f"m{i}".encode(), _marker(i, 100_000),
                     dedupe=DedupeUpdate(streams=(("s", i),)))


def _damage_payload(root: Path, needle: bytes) -> None:
    [segment] = _payload_files(root)
    data = bytearray(segment.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0
    data[at: at + 8] = b"\x00garbage"
    segment.write_bytes(bytes(data))


def test_a_torn_payload_at_the_tail_is_cut(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    _five_payload_records(tmp_path)
    _damage_payload(tmp_path, _marker(5, 100_000)[50_000:50_100])
    with caplog.at_level(logging.WARNING), Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2, 3, 4]
        assert j.last_batch_ids() == {"s": 4}
    assert "torn tail of 1 record(s)" in caplog.text and "seq 5 (append 'trades')" in caplog.text
    [segment] = _payload_files(tmp_path)
    assert segment.stat().st_size == 3 * _aligned(len(_marker(1, 100_000))) + len(
        _marker(1, 100_000))


def test_a_damaged_or_missing_payload_file_refuses_to_start(tmp_path: Path) -> None:
    _five_payload_records(tmp_path / "damaged")
    _damage_payload(tmp_path / "damaged", _marker(2, 100_000)[50_000:50_100])
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(tmp_path / "damaged")
    msg = str(info.value)
    assert "record seq 2 (append 'trades')" in msg and "\n" not in msg
    assert str(_payload_files(tmp_path / "damaged")[0]) in msg

    _five_payload_records(tmp_path / "missing")
    [segment] = _payload_files(tmp_path / "missing")
    segment.unlink()
    for _ in range(2):  # nothing was cut or deleted: it refuses again
        with pytest.raises(JournalCorrupt, match="refers to payload file .*00000001.ipc, which "
                                                 "is missing") as info:
            Journal.open(tmp_path / "missing")
        assert "record seq 1 (append 'trades')" in str(info.value)


def test_a_payload_file_no_record_refers_to_is_deleted_at_open(tmp_path: Path) -> None:
    # a crash after a new file was made, before the COMMIT that would have referred to it
    _five_payload_records(tmp_path)
    stray = tmp_path / "payloads" / "00000007.ipc"
    stray.write_bytes(b"never acknowledged" * 1000)
    with Journal.open(tmp_path) as j:
        assert not stray.exists()
        assert [r.seq for r in j.records()] == [1, 2, 3, 4, 5]
        j.append("append", "t", b"", _marker(6, 100_000))
    assert [p.name for p in _payload_files(tmp_path)] == ["00000001.ipc", "00000008.ipc"]


def test_payload_files_that_cannot_be_tidied_at_open_refuse_in_one_line(tmp_path: Path) -> None:
    _five_payload_records(tmp_path)
    stray = tmp_path / "payloads" / "00000009.ipc"
    stray.write_bytes(b"never acknowledged")
    (tmp_path / "payloads").chmod(0o500)  # the stray file cannot be deleted
    try:
        if os.access(tmp_path / "payloads", os.W_OK):  # root ignores the mode bits
            (tmp_path / "payloads").chmod(0o700)
            blocker = tmp_path / "payloads" / "00000009.ipc"
            blocker.unlink()
            blocker.mkdir()  # a directory where a file is: unlink fails for root too
            (blocker / "x").write_bytes(b"")
        with pytest.raises(JournalUnavailable, match="cannot tidy the payload files") as info:
            Journal.open(tmp_path)
        assert "\n" not in str(info.value)
    finally:
        (tmp_path / "payloads").chmod(0o700)
    shutil.rmtree(tmp_path / "payloads" / "00000009.ipc", ignore_errors=True)
    stray.unlink(missing_ok=True)
    with Journal.open(tmp_path) as j:  # the lock was released: it opens once tidied
        assert [r.seq for r in j.records()] == [1, 2, 3, 4, 5]


def test_a_version_1_journal_is_upgraded_in_place(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    _five_records(tmp_path)  # inline payloads only, as version 1 wrote them
    for column in ("seg", "off", "size"):
        _sql(tmp_path / FILENAME, f"ALTER TABLE records DROP COLUMN {column}")
    _sql(tmp_path / FILENAME, "UPDATE meta SET value = '1' WHERE key = 'version'")
    with caplog.at_level(logging.INFO), Journal.open(tmp_path) as j:
        assert [r.payload for r in j.records()] == [_marker(i) for i in range(1, 6)]
        assert j.append("append", "t", b"", _marker(6, 100_000)) == 6
    assert "upgraded from format version 1 to 2" in caplog.text
    with Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2, 3, 4, 5, 6]
        assert list(j.records())[-1].payload == _marker(6, 100_000)
