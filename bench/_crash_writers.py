"""The crash test's writers: threads that write until the server dies, and the stream retry.

Each writer records what it is about to send in the :class:`~bench._crash_model.Model`
(in flight), sends it, and records it as acknowledged once the call returned; the first
failed call ends the writer (after the kill that is expected, before it a finding).
Used by ``bench/crash.py``.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

import ticktable as tt
from bench._crash_model import (
    ACKED,
    INFLIGHT,
    KEYS_PER_WRITER,
    LOG,
    ST,
    STREAM,
    TXA,
    TXB,
    CrashReport,
    Model,
    Tx,
    kv_apply,
)
from clients.wire import Endpoint, action, put_batches
from flight.pb import flight_pb2 as pb
from flight.wire import ABORT, COMMIT


class Commits:
    """Commits sent and not yet answered; the kill happens under :attr:`lock` to snapshot them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[int] = set()
        self.failed: set[int] = set()
        self.sent = threading.Event()
        self._next = 0

    @contextmanager
    def track(self) -> Iterator[None]:
        with self.lock:
            self._next += 1
            token = self._next
            self.active.add(token)
        self.sent.set()
        try:
            yield
        except BaseException:
            with self.lock:
                self.failed.add(token)
            raise
        finally:
            with self.lock:
                self.active.discard(token)


@dataclass
class Round:
    """What the writers of one round share."""

    endpoint: Endpoint
    model: Model
    report: CrashReport
    token: str
    stop: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    commits: Commits = field(default_factory=Commits)

    def failed(self, exc: BaseException, what: str) -> None:
        """A writer's call raised: expected after the kill, a finding before it."""
        if not self.killed.is_set():
            with self.model.lock:
                self.report.writer_errors += 1
            self.report.fail(f"{what} refused while the server was up: "
                             f"{type(exc).__name__}: {str(exc)[:300]}")


def appender(r: Round, rng: random.Random, w: int) -> None:
    """Append batches tagged with a unique batch id; a third of them as staged pushes."""
    with tt.connect(r.endpoint.uri, timeout=15) as client:
        while not r.stop.is_set():
            b = r.model.next_id()
            # a tenth large enough (over 64 KiB as Arrow IPC) to go to the journal's payload files
            n = rng.randint(2_500, 5_000) if rng.random() < 0.1 else rng.randint(1, 40)
            data = pa.table({"w": [w] * n, "b": [b] * n, "i": list(range(n)),
                             "x": [rng.random() for _ in range(n)]}, schema=LOG)
            r.model.appends[b] = (n, INFLIGHT)
            try:
                client.push("log", data, create=False, atomic=rng.random() < 0.3)
            except Exception as exc:
                return r.failed(exc, f"append of batch {b}")
            r.model.appends[b] = (n, ACKED)


def keyed_writer(r: Round, rng: random.Random, w: int) -> None:
    """Upserts, deletes and upserts with ``__delete`` over keys only this writer touches."""
    keys = list(range(w * 1000, w * 1000 + KEYS_PER_WRITER))
    with tt.connect(r.endpoint.uri, timeout=15) as client:
        while not r.stop.is_set():
            op = rng.choice(("upsert", "upsert", "delete", "mixed"))
            chosen = rng.sample(keys, rng.randint(1, 12))
            if op == "delete":
                ups: dict[int, tuple[int, int, str]] = {}
                dels = set(chosen)
            else:
                cut = len(chosen) // 2 if op == "mixed" else 0
                dels = set(chosen[:cut])
                ups = {k: (w, r.model.next_id(), rng.choice("abc")) for k in chosen[cut:]}
            r.model.kv_inflight[w] = (ups, dels)
            try:
                if op == "delete":
                    client.push("kv", pa.table({"k": sorted(dels)}), mode="delete",
                                create=False, atomic=rng.random() < 0.5)
                else:
                    rows = [(k, *ups[k], False) for k in ups] + [(k, w, 0, "", True)
                                                                  for k in dels]
                    rng.shuffle(rows)
                    data = pa.table({"k": [x[0] for x in rows], "w": [x[1] for x in rows],
                                     "v": [x[2] for x in rows], "s": [x[3] for x in rows],
                                     "__delete": [x[4] for x in rows]})
                    if op == "upsert":
                        data = data.drop_columns(["__delete"])
                    client.push("kv", data, mode="upsert", create=False,
                                atomic=rng.random() < 0.5)
            except Exception as exc:
                return r.failed(exc, f"keyed {op} of writer {w}")
            with r.model.lock:
                r.model.kv = kv_apply(r.model.kv, ups, dels)
                r.model.kv_inflight[w] = None
                r.model.kv_acked += 1


def _put(client: Any, r: Round, table: str, data: pa.Table, write_id: str,
         partition: int) -> None:
    put_batches(client, r.endpoint.options(timeout=15), table, data.schema, data.to_batches(),
                pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id=write_id, partition=partition))


def _commit(client: Any, r: Round, request: pb.CommitRequest) -> pb.CommitResult:
    with r.commits.track():
        result: pb.CommitResult = action(client, r.endpoint.options(timeout=15), COMMIT, request)
    return result


def _late_commits(client: Any, r: Round, rng: random.Random) -> bool:
    """Commit writes the previous server dropped at its restart, as a Spark driver would.

    Each such write is committed once, with its slots named (refused: no such slot) or
    with ``all_slots`` (an empty write: 0 rows); either way it must never become visible,
    after this restart or any later one. A write none of whose batches reached the journal
    is unknown to the server: its commit is refused either way (NOT_FOUND). Returns False
    when a call failed (the kill).
    """
    dropped = [t for t, tx in r.model.tx.items() if tx.status == "dropped"]
    for tag in dropped[-4:]:
        tx = r.model.tx[tag]
        tx.status = "late commit"
        wid = f"tx-{tag}"
        named = rng.random() < 0.5
        request = (pb.CommitRequest(write_id=wid, slots=[pb.StageSlot(partition=p)
                                                         for p in range(3)]) if named
                   else pb.CommitRequest(write_id=wid, all_slots=True))
        try:
            res = _commit(client, r, request)
        except pa.ArrowKeyError:  # WriteNotFound: nothing of it was ever journaled
            continue
        except pa.ArrowInvalid as exc:  # InputError: the slots are gone
            if named:
                continue
            r.failed(exc, f"late commit of transaction {tag}")
            return False
        except Exception as exc:
            r.failed(exc, f"late commit of transaction {tag}")
            return False
        if res.rows:
            with r.model.lock:
                r.report.uncommitted_visible += 1
            r.report.fail(f"late commit of dropped transaction {tag} published {res.rows} rows")
    return True


def transactions(r: Round, rng: random.Random) -> None:
    """Two-table staged writes: committed at once or later, aborted, or abandoned."""
    client, _ = r.endpoint.connect()
    later: list[int] = []
    try:
        if not _late_commits(client, r, rng):
            return
        while not r.stop.is_set():
            if later and rng.random() < 0.35:  # one staged earlier, maybe before a checkpoint
                tag = later.pop(0)
                fate = "commit"
            else:
                tag = r.model.next_id()
                tx = r.model.tx[tag] = Tx(rng.randint(2, 20), rng.randint(1, 20), "staging")
                wid = f"tx-{tag}"
                half = tx.na // 2
                try:
                    for p, (lo, hi) in enumerate(((0, half), (half, tx.na))):  # two slots
                        _put(client, r, "txa", pa.table({"t": [tag] * (hi - lo), "p": [p] * (hi - lo),
                                                         "i": list(range(lo, hi))}, schema=TXA),
                             wid, p)
                    _put(client, r, "txb", pa.table({"t": [tag] * tx.nb, "i": list(range(tx.nb)),
                                                     "note": ["b"] * tx.nb}, schema=TXB), wid, 2)
                except Exception as exc:
                    return r.failed(exc, f"staging transaction {tag}")
                tx.status = "open"
                x = rng.random()
                fate = "commit" if x < 0.5 else "later" if x < 0.7 else \
                    "abort" if x < 0.9 else "abandon"
            tx = r.model.tx[tag]
            wid = f"tx-{tag}"
            if fate == "later":
                later.append(tag)
            elif fate == "abort":
                tx.status = "aborting"
                try:
                    action(client, r.endpoint.options(timeout=15), ABORT,
                           pb.AbortRequest(write_id=wid))
                except Exception as exc:
                    return r.failed(exc, f"abort of transaction {tag}")
                tx.status = "aborted"
            elif fate == "commit":
                tx.status = "committing"
                try:
                    res = _commit(client, r, pb.CommitRequest(write_id=wid, all_slots=True))
                except Exception as exc:
                    return r.failed(exc, f"commit of transaction {tag}")
                if not res.applied or res.rows != tx.na + tx.nb:
                    r.report.writer_errors += 1
                    r.report.fail(f"commit of transaction {tag}: applied={res.applied} rows="
                                  f"{res.rows}, expected {tx.na + tx.nb}")
                tx.status = "committed"
    finally:
        client.close()


def _stream_batch(client: Any, r: Round, b: int, n: int) -> bool:
    """Stage ``n`` rows of stream batch ``b`` under a new write id, commit; ``applied``."""
    attempt = uuid.uuid4().hex[:8]
    wid = f"st-{r.token}-{b}-{attempt}"
    _put(client, r, "st", pa.table({"b": [b] * n, "i": list(range(n)), "a": [attempt] * n},
                                   schema=ST), wid, 0)
    res = _commit(client, r, pb.CommitRequest(write_id=wid, all_slots=True, stream_id=STREAM,
                                              batch_id=b, has_batch=True))
    return bool(res.applied)


def streamer(r: Round, rng: random.Random) -> None:
    """Micro-batches with increasing batch ids; now and then a replay that must be refused."""
    client, _ = r.endpoint.connect()
    m = r.model
    try:
        while not r.stop.is_set():
            b, n = m.stream_next, rng.randint(1, 30)
            m.stream_inflight = (b, n)
            try:
                applied = _stream_batch(client, r, b, n)
            except Exception as exc:
                return r.failed(exc, f"stream batch {b}")
            if not applied:
                r.report.writer_errors += 1
                r.report.fail(f"stream batch {b} (new) was refused as a replay")
            m.stream[b], m.stream_inflight, m.stream_next = n, None, b + 1
            if rng.random() < 0.15:  # Spark replaying its last micro-batch
                try:
                    if _stream_batch(client, r, b, n):
                        r.report.duplicated += 1
                        r.report.fail(f"stream batch {b} replayed and applied again")
                except Exception as exc:
                    return r.failed(exc, f"replay of stream batch {b}")
    finally:
        client.close()


def retry_stream(r: Round, rep: CrashReport) -> None:
    """The batch in flight at the kill, with the same batch id; then a replay of the last one."""
    m = r.model
    client, _ = r.endpoint.connect()
    try:
        if m.stream_inflight is not None:
            b, n = m.stream_inflight
            if not _stream_batch(client, r, b, n):
                rep.stream_retries_refused += 1  # the first try was applied before the kill
            m.stream[b], m.stream_inflight, m.stream_next = n, None, b + 1
        if m.stream:
            last = max(m.stream)
            if _stream_batch(client, r, last, m.stream[last]):
                rep.duplicated += 1
                rep.fail(f"stream batch {last} applied again after the restart")
    finally:
        client.close()
