"""flight/durability/journal.py: durability, order, group commit, recovery, and failing disks.

Real files in ``tmp_path`` and real fsyncs throughout. Damage is made on disk (bytes of a
record overwritten in the database file, a WAL cut short) or, for a full or read-only disk
where no small filesystem can be mounted, through SQLite's own limits on the journal's write
connection (``PRAGMA max_page_count`` makes SQLite report SQLITE_FULL, "database or disk is
full", exactly as a full disk does; ``PRAGMA query_only`` makes it report SQLITE_READONLY).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import flight.durability.journal as journal_module
import flight.durability.journal_files as journal_format
import flight.durability.payloads as journal_payloads
from engine.errors import (
    JournalClosed,
    JournalCorrupt,
    JournalFull,
    JournalIncompatible,
    JournalUnavailable,
    ServiceError,
)
from flight.durability.journal import FILENAME, Journal
from flight.durability.records import Chain, DedupeUpdate, ipc_bytes, read_ipc
from flight.errors import status_of

ROOT = Path(__file__).resolve().parents[3]


def _table(n: int, start: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(np.arange(start, start + n), pa.int64()),
                     "s": pa.array([f"s{i}" for i in range(start, start + n)]),
                     "x": pa.array(np.arange(n) * 0.5)})


def _marker(i: int, size: int = 4096) -> bytes:
    """A payload that is easy to find in the database file."""
    return b"".join(f"<record {i:04d} at {k:07d}>".encode() for k in range(0, size, 26))[:size]


def _sql(path: Path, statement: str) -> list[Any]:
    """Run one statement on the database file through a connection of its own."""
    raw = sqlite3.connect(path)
    try:
        with raw:
            return raw.execute(statement).fetchall()
    finally:
        raw.close()


def _damage(path: Path, needle: bytes) -> None:
    """Overwrite bytes in the middle of ``needle``, once, in the (checkpointed) database file."""
    assert not path.with_name(path.name + "-wal").exists()  # closed: all of it is in ``path``
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0
    data[at + len(needle) // 2: at + len(needle) // 2 + 8] = b"\x00garbage"
    path.write_bytes(bytes(data))


def _aligned(n: int) -> int:
    """``n`` bytes rounded up to the payload files' alignment."""
    return -(-n // journal_payloads.ALIGN) * journal_payloads.ALIGN


# ------------------------------------------------------------------------------ round trip
def test_round_trip_records_and_ipc_payloads(tmp_path: Path) -> None:
    t = _table(1000)
    with Journal.open(tmp_path) as j:
        assert j.append("create", "trades", b'{"schema": 1}') == 1
        assert j.append("append", "trades", b"m2", ipc_bytes(t)) == 2
        assert j.append("append", "trades", b"m3", ipc_bytes(t.to_batches()[0])) == 3
        assert j.append("cycle", None, b"") == 4
        assert j.stats().last_seq == 4
    with Journal.open(tmp_path) as j:
        got = list(j.records())
        assert [(r.seq, r.kind, r.table, r.meta) for r in got] == [
            (1, "create", "trades", b'{"schema": 1}'), (2, "append", "trades", b"m2"),
            (3, "append", "trades", b"m3"), (4, "cycle", None, b"")]
        assert got[0].payload == b"" and got[3].payload == b""
        assert read_ipc(got[1].payload).equals(t)
        assert read_ipc(got[2].payload).equals(t)
        assert [r.seq for r in j.records(after=2)] == [3, 4]
        assert j.append("drop", "trades", b"") == 5  # seqs go on after a reopen


def test_read_ipc_points_into_the_payload(tmp_path: Path) -> None:
    payload = ipc_bytes(_table(100)).to_pybytes()
    buf = pa.py_buffer(payload)
    values = read_ipc(payload).column("k").chunk(0).buffers()[1]
    assert buf.address <= values.address < buf.address + buf.size  # zero-copy


def test_size_and_stats(tmp_path: Path) -> None:
    with Journal.open(tmp_path) as j:
        before = j.size_bytes()
        j.append("append", "t", b"m", b"x" * 100_000)
        s = j.stats()
        assert (s.appended, s.commits, s.failed_commits, s.bytes_appended) == (1, 1, 0, 100_001)
        assert s.size_bytes == j.size_bytes() > before


# -------------------------------------------------------------- order and group commit
def test_apply_order_is_seq_order_under_16_writers(tmp_path: Path) -> None:
    applied: list[int] = []
    seen: set[int] = set()
    late: list[int] = []

    def apply(seq: int) -> None:
        applied.append(seq)
        seen.add(seq)

    def writer(w: int) -> None:
        for i in range(25):
            seq = j.append("append", f"t{w}", f"{w}:{i}".encode(), _marker(i, 2000), apply=apply)
            if seq not in seen:
                late.append(seq)  # acknowledged before its apply ran

    with Journal.open(tmp_path) as j:
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = j.stats()
    assert applied == sorted(applied) == list(range(1, 401))
    assert late == []
    assert stats.appended == 400
    assert stats.commits < stats.appended  # concurrent writers shared commits
    with Journal.open(tmp_path) as j:
        meta = {r.seq: r.meta for r in j.records()}
    assert len(meta) == 400 and {m.split(b":")[0] for m in meta.values()} == {
        str(w).encode() for w in range(16)}


def test_group_commit_writes_everything_queued_in_one_transaction(tmp_path: Path) -> None:
    entered, go = threading.Event(), threading.Event()
    applied: list[int] = []

    def block(seq: int) -> None:
        applied.append(seq)
        entered.set()
        assert go.wait(10)

    with Journal.open(tmp_path) as j:
        first = threading.Thread(target=j.append, args=("append", "t", b"first"),
                                 kwargs={"apply": block})
        first.start()
        assert entered.wait(10)  # the flusher is inside the first record's apply
        seqs = [j.append_nowait("append", "t", f"{i}".encode(), apply=applied.append)
                for i in range(15)]
        go.set()
        first.join()
    assert seqs == list(range(2, 17))
    assert applied == list(range(1, 17))
    assert j.stats().commits == 2  # the first record, then the 15 queued while it applied


def test_apply_exception_reaches_only_its_writer(tmp_path: Path) -> None:
    def refuse(seq: int) -> None:
        raise ValueError(f"record {seq} refused")

    results: dict[str, object] = {}

    def writer(name: str) -> None:
        try:
            results[name] = j.append("append", "t", name.encode(),
                                     apply=refuse if name == "bad" else None)
        except ValueError as exc:
            results[name] = exc

    with Journal.open(tmp_path) as j:
        threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "bad", "c")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert isinstance(results["bad"], ValueError)
        assert {type(results["a"]), type(results["c"])} == {int}
        assert j.append("append", "t", b"after") == 4  # the journal keeps running
        # durable before apply ran: replay meets the same refusal
        assert sorted(r.meta for r in j.records()) == [b"a", b"after", b"bad", b"c"]


def test_append_inside_apply_is_refused_and_append_nowait_is_not(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    nested: list[int] = []

    def apply(seq: int) -> None:
        try:
            j.append("x", None, b"")
        except RuntimeError as exc:
            errors.append(exc)
        nested.append(j.append_nowait("marker", None, b""))

    with Journal.open(tmp_path) as j:
        assert j.append("append", "t", b"", apply=apply) == 1
    assert len(errors) == 1 and "append_nowait" in str(errors[0])
    assert nested == [2]
    with Journal.open(tmp_path) as j:
        assert [r.kind for r in j.records()] == ["append", "marker"]


def test_close_writes_what_is_queued_then_refuses(tmp_path: Path) -> None:
    j = Journal.open(tmp_path)
    seqs = [j.append_nowait("cycle", None, f"{i}".encode()) for i in range(50)]
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalClosed, match="closed"):
        j.append("append", "t", b"")
    with Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == seqs


def test_a_second_process_cannot_open_the_journal(tmp_path: Path) -> None:
    with Journal.open(tmp_path):
        with pytest.raises(JournalUnavailable, match="open in another process"):
            Journal.open(tmp_path)
    Journal.open(tmp_path).close()  # the lock goes with close()


# ----------------------------------------------------------------------- dedupe, truncate
def test_dedupe_state_is_as_durable_as_its_record(tmp_path: Path) -> None:
    with Journal.open(tmp_path) as j:
        j.append("append", "t", b"", dedupe=DedupeUpdate(streams=(("s1", 1),)))
        j.append("append", "t", b"", dedupe=DedupeUpdate(streams=(("s1", 2), ("s2", 7))))
        j.append("commit", None, b"", dedupe=DedupeUpdate(writes=(("w1", b"result-1"),)))
        j.append("commit", None, b"", dedupe=DedupeUpdate(writes=(("w1", b"again"),
                                                                  ("w2", b"result-2"))))
    with Journal.open(tmp_path) as j:
        assert j.last_batch_ids() == {"s1": 2, "s2": 7}
        assert j.committed_writes() == {"w1": b"result-1", "w2": b"result-2"}  # first wins
        assert j.forget_writes(older_than=0.0) == 0
        assert j.forget_writes(older_than=2e9) == 2
        assert j.committed_writes() == {}


def test_truncate_keeps_later_records_each_streams_last_batch_and_the_seq_counter(
        tmp_path: Path) -> None:
    with Journal.open(tmp_path) as j:
        for i in range(1, 11):
            j.append("append", "t", b"", b"x" * 50_000,
                     dedupe=DedupeUpdate(streams=((f"s{i % 2}", i),)))
        assert j.truncate(6) == 6
        assert [r.seq for r in j.records()] == [7, 8, 9, 10]
        assert j.last_batch_ids() == {"s0": 10, "s1": 9}
        # the history: the newest row <= 6 of each stream, then all of them
        assert _sql(j.path, "SELECT stream_id, seq FROM dedupe_streams ORDER BY seq") == [
            ("s1", 5), ("s0", 6), ("s1", 7), ("s0", 8), ("s1", 9), ("s0", 10)]
        assert j.truncate(10) == 4
        with pytest.raises(ValueError, match="next seq 11"):
            j.truncate(11)
        assert not os.path.getsize(j.path.with_name(FILENAME + "-wal"))  # checkpointed
    with Journal.open(tmp_path) as j:
        assert list(j.records()) == []
        assert j.append("append", "t", b"") == 11  # never reuses a truncated seq
        assert j.last_batch_ids() == {"s0": 10, "s1": 9}


# ------------------------------------------------------------------------- torn tail, damage
def _five_records(path: Path) -> None:
    with Journal.open(path) as j:
        for i in range(1, 6):
            j.append("append", "trades", f"m{i}".encode(), _marker(i),
                     dedupe=DedupeUpdate(streams=(("s", i),), writes=((f"w{i}", b"ok"),)))


def test_torn_tail_is_cut_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _five_records(tmp_path)
    _damage(tmp_path / FILENAME, _marker(5)[1000:1100])
    with caplog.at_level(logging.WARNING):
        j = Journal.open(tmp_path)
    with j:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "torn tail of 1 record" in warnings[0]
        assert "seq 5 (append 'trades')" in warnings[0] and FILENAME in warnings[0]
        assert [r.seq for r in j.records()] == [1, 2, 3, 4]
        assert all(r.payload == _marker(r.seq) for r in j.records())
        assert j.last_batch_ids() == {"s": 4}  # the cut record's batch id is undone
        assert set(j.committed_writes()) == {"w1", "w2", "w3", "w4"}
        assert j.append("append", "trades", b"m5 again") == 5
    caplog.clear()
    with caplog.at_level(logging.WARNING), Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2, 3, 4, 5]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_torn_transaction_is_cut_whole(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    # a COMMIT is atomic: when its last record is torn, its whole records go with it
    entered, go = threading.Event(), threading.Event()

    def block(seq: int) -> None:
        entered.set()
        assert go.wait(10)

    with Journal.open(tmp_path) as j:
        j.append("append", "t", b"", _marker(1))
        first = threading.Thread(target=j.append, args=("append", "t", b"", _marker(2)),
                                 kwargs={"apply": block})
        first.start()
        assert entered.wait(10)
        for i in (3, 4, 5):  # queued while the flusher applies seq 2: one transaction
            j.append_nowait("append", "t", b"", _marker(i))
        go.set()
        first.join()
    assert j.stats().commits == 3
    _damage(tmp_path / FILENAME, _marker(5)[1000:1100])
    with caplog.at_level(logging.WARNING), Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2]
    assert "torn tail of 3 record(s)" in caplog.text and "1 failing" in caplog.text
    assert "seq 3 (append 't'), seq 4 (append 't'), seq 5 (append 't')" in caplog.text


def test_a_wal_cut_mid_transaction_loses_only_that_transaction(tmp_path: Path) -> None:
    # a crash mid-COMMIT: copy the files while the journal is open, the WAL cut inside the
    # last transaction's frames; SQLite's WAL checksums drop that transaction
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    with Journal.open(tmp_path / "live") as j:
        for i in range(1, 6):
            j.append("append", "t", b"", _marker(i, 100_000))
        wal = j.path.with_name(FILENAME + "-wal")
        shutil.copy(j.path, crashed / FILENAME)
        shutil.copytree(j.path.with_name("payloads"), crashed / "payloads")
        data = wal.read_bytes()
        (crashed / (FILENAME + "-wal")).write_bytes(data[:len(data) - 30_000])
    [segment] = (crashed / "payloads").iterdir()  # the five payloads, written before COMMIT
    assert segment.stat().st_size == 4 * _aligned(len(_marker(1, 100_000))) + len(
        _marker(1, 100_000))
    with Journal.open(crashed) as j:
        assert [r.seq for r in j.records()] == [1, 2, 3, 4]
        assert all(r.payload == _marker(r.seq, 100_000) for r in j.records())
    assert segment.stat().st_size == 3 * _aligned(len(_marker(1, 100_000))) + len(
        _marker(1, 100_000))  # the unacknowledged payload is cut


def test_damage_before_the_tail_refuses_to_start(tmp_path: Path) -> None:
    _five_records(tmp_path)
    _damage(tmp_path / FILENAME, _marker(2)[1000:1100])
    for _ in range(2):  # nothing was cut: it refuses again
        with pytest.raises(JournalCorrupt) as info:
            Journal.open(tmp_path)
        msg = str(info.value)
        assert str(tmp_path / FILENAME) in msg and "record seq 2 (append 'trades')" in msg
        assert "\n" not in msg


def test_a_failing_tail_over_several_transactions_refuses_to_start(tmp_path: Path) -> None:
    _five_records(tmp_path)  # one record per transaction
    _damage(tmp_path / FILENAME, _marker(4)[1000:1100])
    _damage(tmp_path / FILENAME, _marker(5)[1000:1100])
    with pytest.raises(JournalCorrupt, match="more than the last transaction"):
        Journal.open(tmp_path)


def test_an_incompatible_or_foreign_data_dir_refuses_to_start(tmp_path: Path) -> None:
    Journal.open(tmp_path / "old").close()
    _sql(tmp_path / "old" / FILENAME, "UPDATE meta SET value = '99' WHERE key = 'version'")
    with pytest.raises(JournalIncompatible, match="has format version 99, this Ticktable "
                                                  "reads version 2") as info:
        Journal.open(tmp_path / "old")
    assert str(tmp_path / "old" / FILENAME) in str(info.value)

    (tmp_path / "foreign").mkdir()
    _sql(tmp_path / "foreign" / FILENAME, "CREATE TABLE t(x)")
    with pytest.raises(JournalIncompatible, match="not a Ticktable journal"):
        Journal.open(tmp_path / "foreign")

    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / FILENAME).write_bytes(b"not a database at all" * 500)
    with pytest.raises(JournalCorrupt, match="is damaged or not an SQLite database"):
        Journal.open(tmp_path / "garbage")


def test_a_failed_quick_check_refuses_to_start(tmp_path: Path) -> None:
    _five_records(tmp_path)
    path = tmp_path / FILENAME
    [(root,)] = _sql(path, "SELECT rootpage FROM sqlite_master WHERE name = 'dedupe_writes_seq'")
    [(size,)] = _sql(path, "PRAGMA page_size")
    data = bytearray(path.read_bytes())
    data[(root - 1) * size + 1: (root - 1) * size + 5] = b"\xff" * 4  # the index's b-tree header
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match=f"journal {path}: PRAGMA quick_check failed: "
                                             f".*Page {root}") as info:
        Journal.open(tmp_path)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------ kill -9
_CHILD = textwrap.dedent("""
    import sys, threading
    from flight.durability.records import DedupeUpdate
    from flight.durability.journal import Journal
    j = Journal.open(sys.argv[1])
    out = threading.Lock()
    def size(i):  # every 7th payload goes to a payload file, the others stay inline
        return 70_000 + 331 * (i % 50) if i % 7 == 3 else 1000 + 37 * (i % 300)
    def writer(w):
        for i in range(100_000):
            payload = bytes([w]) * size(i)
            seq = j.append("append", f"t{w}", f"{w}:{i}".encode(), payload,
                           dedupe=DedupeUpdate(streams=((f"s{w}", i),)))
            with out:
                print(seq, w, i, flush=True)
    for w in range(4):
        threading.Thread(target=writer, args=(w,)).start()
""")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_acknowledged_record_survives_kill_9(tmp_path: Path, seed: int) -> None:
    kill_after = int(np.random.default_rng(seed).integers(1, 200))
    acked = []
    with (tmp_path / "stderr").open("w+") as err, subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path / "data")], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=err, text=True) as child:
        watchdog = threading.Timer(60, child.kill)  # bounded even if the child hangs
        watchdog.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:  # every whole line printed was acknowledged
                if not line.endswith("\n"):  # a print cut by the kill
                    break
                acked.append(tuple(map(int, line.split())))
                if len(acked) == kill_after:
                    child.send_signal(signal.SIGKILL)
        finally:
            watchdog.cancel()
    assert child.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    assert len(acked) >= kill_after
    with Journal.open(tmp_path / "data") as j:
        records = {r.seq: r for r in j.records()}
        batches = j.last_batch_ids()
    for seq, w, i in acked:
        r = records[seq]
        assert (r.table, r.meta) == (f"t{w}", f"{w}:{i}".encode())
        assert r.payload == bytes([w]) * (70_000 + 331 * (i % 50) if i % 7 == 3
                                          else 1000 + 37 * (i % 300))
        assert batches[f"s{w}"] >= i


# ------------------------------------------------------------------- full, read-only disk
@pytest.fixture
def writers(monkeypatch: pytest.MonkeyPatch) -> list[sqlite3.Connection]:
    """The journal's write connections, to set SQLite's limits on them."""
    made: list[sqlite3.Connection] = []
    real = journal_format.connect

    def spy(path: Path, *, readonly: bool) -> sqlite3.Connection:
        conn = real(path, readonly=readonly)
        if not readonly:
            made.append(conn)
        return conn

    monkeypatch.setattr(journal_format, "connect", spy)
    return made


def test_a_full_disk_fails_the_write_and_loses_nothing(
        tmp_path: Path, writers: list[sqlite3.Connection],
        caplog: pytest.LogCaptureFixture) -> None:
    with Journal.open(tmp_path) as j:
        for i in range(1, 4):
            j.append("append", "t", b"", _marker(i), dedupe=DedupeUpdate(streams=(("s", i),)))
        conn = writers[-1]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        # the disk is "full": SQLite reports SQLITE_FULL as it does for ENOSPC
        assert conn.execute(f"PRAGMA max_page_count = {pages}").fetchone()[0] == pages
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                j.append("append", "t", b"", b"y" * 60_000,  # inline: in SQLite's pages
                         dedupe=DedupeUpdate(streams=(("s", 100 + w),)))
            except JournalFull as exc:
                errors.append(exc)

        with caplog.at_level(logging.ERROR):
            threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert len(errors) == 8 and len({id(e) for e in errors}) == 8  # each writer its own
        msg = str(errors[0])
        assert msg.startswith(f"{FILENAME}: disk full") and "retry later" in msg
        assert str(tmp_path) not in msg and "\n" not in msg  # a client may see it
        assert isinstance(errors[0], JournalUnavailable) and isinstance(errors[0], ServiceError)
        assert status_of(errors[0]).grpc.name == "UNAVAILABLE"
        assert "disk full" in caplog.text
        stats = j.stats()
        assert (stats.appended, stats.commits, stats.last_seq) == (3, 3, 3)
        assert 1 <= stats.failed_commits <= 8
        # reads keep working and nothing acknowledged is lost
        assert [r.payload for r in j.records()] == [_marker(i) for i in (1, 2, 3)]
        assert j.last_batch_ids() == {"s": 3}
        conn.execute("PRAGMA max_page_count = 1000000")  # space freed
        seq = j.append("append", "t", b"", b"z" * 300_000)
        assert seq == 12
    with Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2, 3, 12]
        assert j.last_batch_ids() == {"s": 3}


def test_a_read_only_disk_fails_the_write_and_the_next_one_retries(
        tmp_path: Path, writers: list[sqlite3.Connection]) -> None:
    with Journal.open(tmp_path) as j:
        j.append("append", "t", b"before")
        writers[-1].execute("PRAGMA query_only = ON")
        with pytest.raises(JournalUnavailable, match="read-only") as info:
            j.append("append", "t", b"lost")
        assert not isinstance(info.value, JournalFull)
        with pytest.raises(JournalUnavailable, match="read-only"):
            j.truncate(1)
        assert [r.meta for r in j.records()] == [b"before"]
        writers[-1].execute("PRAGMA query_only = OFF")
        assert j.append("append", "t", b"after") == 3
    with Journal.open(tmp_path) as j:
        assert [r.meta for r in j.records()] == [b"before", b"after"]


_TMPFS_CHILD = textwrap.dedent("""
    import json, os, subprocess, sys
    from engine.errors import JournalUnavailable
    from flight.durability.journal import Journal
    mnt = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
    out = {}
    j = Journal.open(mnt)
    out["before"] = [j.append("append", "t", b"", b"a" * 100_000) for _ in range(3)]
    filler = os.path.join(mnt, "filler")
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"f" * 65536)
                f.flush()
        except OSError:
            pass
    try:
        j.append("append", "t", b"", b"b" * 300_000)
    except JournalUnavailable as exc:
        out["full"] = [type(exc).__name__, str(exc)]
    out["read_while_full"] = [r.seq for r in j.records()]
    os.remove(filler)
    out["after_free"] = j.append("append", "t", b"", b"c" * 300_000)
    j.close()
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)  # refused with files open
    try:
        Journal.open(mnt).close()
    except JournalUnavailable as exc:
        out["readonly"] = [type(exc).__name__, str(exc)]
    subprocess.run(["mount", "-o", "remount,rw", mnt], check=True)
    with Journal.open(mnt) as j:
        out["reopened"] = [r.seq for r in j.records()]
    print(json.dumps(out))
""")


def test_a_real_full_and_read_only_filesystem(tmp_path: Path) -> None:
    """A 4 MB tmpfs in a private mount namespace (needs root or user namespaces).

    Full while running; read-only at start-up (Linux refuses to remount a filesystem
    read-only while a file on it is open for writing, so a running journal cannot see it).
    """
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small filesystem here (needs unshare and namespaces)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run([unshare, "-rm", "--propagation", "private", sys.executable, "-c",
                           _TMPFS_CHILD, str(mnt)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["before"] == [1, 2, 3]
    assert out["full"][0] == "JournalFull" and "disk full" in out["full"][1]
    assert out["read_while_full"] == [1, 2, 3]
    assert out["after_free"] == 5
    assert out["readonly"][0] == "JournalUnavailable" and "read-only" in out["readonly"][1]
    assert out["reopened"] == [1, 2, 3, 5]


def test_a_chain_stays_a_prefix_when_one_of_its_records_fails(
        tmp_path: Path, writers: list[sqlite3.Connection],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelined writer (one DoPut stream): once a record of its chain is not made
    durable, its records queued behind are not written and its next submit is refused."""
    monkeypatch.setattr(journal_module, "_MAX_GROUP_BYTES", 1)  # one record per transaction
    release = threading.Event()
    with Journal.open(tmp_path) as j:
        chain, other = Chain(), Chain()
        first = j.submit("append", "t", b"", _marker(1), chain=chain)
        assert first.result() == 1
        # hold the flusher inside an apply so the next records queue up behind it
        blocker = j.submit("append", "t", b"", _marker(2), apply=lambda seq: release.wait(10))
        failing = j.submit("append", "t", b"", b"y" * 60_000, chain=chain)  # inline
        behind = j.submit("append", "t", b"", _marker(4), chain=chain)
        conn = writers[-1]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from now on
        release.set()
        assert blocker.result() == 2
        with pytest.raises(JournalFull, match="disk full"):
            failing.result()
        with pytest.raises(JournalFull, match="an earlier record of this stream"):
            behind.result()
        conn.execute("PRAGMA max_page_count = 1000000")  # space freed
        with pytest.raises(JournalFull, match="an earlier record of this stream"):
            j.submit("append", "t", b"", _marker(6), chain=chain)  # refused at once
        assert j.submit("append", "t", b"", _marker(5), chain=other).result() == 5  # others go on
    with Journal.open(tmp_path) as j:
        assert [r.seq for r in j.records()] == [1, 2, 5]
