"""Durable tables (DESIGN.md §8): journal before acknowledging, checkpoint, recover.

:class:`Durability` is the one door through which the server changes durable state:
writes into source tables (DoPut with or without a ``write_id``), commits and aborts,
``create_table``, ``drop_table``, derived tables built through the TableService and
mirrors (:mod:`flight.links`). Each change is a journal record
(:mod:`flight.durability.journal`) made durable *before* it is applied and acknowledged;
the apply runs in the journal's flusher thread in journal order, so the order in which
writes reach the tables is the journal's order, and replaying the journal reproduces it.
Without a data directory (``--in-memory``) the same methods apply at once.

Cycles and records. A cycle takes whatever was staged before it. :class:`Durability` is
the graph's *cycle gate* (:attr:`engine.graph.UpdateGraph.cycle_gate`): a lock held around
every cycle and around every apply, so a cycle always takes whole records and the records
it took are exactly those up to the last one applied when it started. That position is
journaled as a ``cycle`` marker whenever it moved; replay runs a cycle at each marker, so a
keyed table hands out the same row keys again (freed keys are reused from the next cycle).

Checkpoints (:mod:`flight.durability.checkpoint`), written off the cycle thread: under the gate, one
cycle takes everything staged, then the source tables' rows with their row keys and
allocator state, the catalog (source tables, durable derived tables in creation order),
the staging area's memory (committed write ids, last batch id per stream, aborted ids)
and the journal positions of the writes still held uncommitted are captured under the
graph's shared lock; the files are written after the gate is released. Then the journal
up to the checkpoint's position is dropped, except what open writes still hold.

Recovery (:meth:`Durability.recover`, before the server listens and before periodic
cycles start): the checkpoint's tables, with their row keys, and the catalog's derived
tables come back; the held writes are read again; then every record after the checkpoint
is applied in journal order, with a cycle at each marker and one at the end. Writes still
held uncommitted after that are dropped (a Spark commit of them fails, and Spark retries
the job); every committed write id and stream batch id is remembered, so a retry after
the restart still applies once. Demo and embedded tables the server did not create
through these methods are not durable. A creation or held batch is replayed under the
limits it was journaled with (:mod:`flight.limits`), the checkpoint under none, so a
restart with other limits refuses nothing that was accepted and accepts nothing refused.

A table created with rows or replacing another (``CREATE TABLE ... AS``, ADBC's ingest) is
first a *pending* table (:func:`~flight.streams.registry.pending_name`): created, filled and
committed as any table is, then given its name by one ``rename`` record, which drops the
table it replaces in the same step. Recovery drops the pending tables left (their
``rename`` never became durable), journaled as drops; so after a crash the name holds the
old table or the new one, whole.

What the clock or a restart decides is journaled too, as a ``forget`` record: the writes
expired after ``stage_ttl`` (and the finished write ids forgotten then), and the open
writes recovery drops. A replay cannot decide these again, and without the record it
would bring back a write whose commit, after the expiry or the restart, found it gone.

Mirrors (DESIGN.md §11). What a mirror follows (:meth:`Durability.mirror`: its origin,
table, local name, columns and ``give_up_after``, never its token: the server's
``mirror_token`` is presented after a restart) is a ``mirror`` record, written when the
mirror is new or follows something else than what is remembered (a ``--mirror`` flag given
again at a restart writes nothing and starts nothing twice); a drop forgets it. A mirror's
table is checkpointed as a source table is, its rows with their row keys, and with its
position in its origin's history (the origin's epoch and sequence of the last change
applied); recovery brings it back as a :class:`~engine.sources.ReplicaTable` of kind
``mirror`` before any link starts, and the server then resumes every mirror it remembers
from that position.

The changes a mirror applies are *not* journaled: its origin holds them. The trade-off:
after a restart a mirror is as of the last checkpoint, not as of the moment the server
stopped, and catches up from its origin: with the updates it missed as one delta when the
origin still holds them (its history: the last 256 updates by default, docs/protocol.md
§7.7), else with a snapshot applied as only its difference from the checkpointed rows. To
keep that position recent, the bytes mirrors stage count toward the checkpoint thresholds
as journaled bytes do (:meth:`Durability.mirrored`), so a busy mirror is checkpointed as
often as a busy journal. Anything derived from a mirror sees the catch-up as ordinary
updates.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from engine.errors import InputError, TableExists
from engine.graph import UpdateGraph
from engine.sources import ReplicaTable, SourceTable
from flight.durability.checkpoint import read_checkpoint, write_checkpoint
from flight.durability.journal import Journal
from flight.durability.payloads import EXTERNAL_MIN_BYTES
from flight.durability.records import (
    Blob,
    Chain,
    Framed,
    Payload,
    Record,
    ipc_bytes,
    payload_size,
    read_ipc,
)
from flight.ingest.parts import Part
from flight.ingest.staging import StagingArea
from flight.links.spec import MirrorSpec, held_by
from flight.pb import flight_pb2 as pb
from flight.streams.registry import PENDING_PREFIX, TableEntry, TableRegistry, is_pending
from flight.wire import DIFF, ROW_KEY, PutMode, RecordKind, TableKind

__all__ = ["Durability", "RecoveryReport"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Durability.recover` brought back."""

    checkpoint_seq: int
    tables: int
    rows: int
    records: int
    cycles: int
    dropped_writes: int
    seconds: float


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def encode_parts(parts: list[Part]) -> tuple[list[dict[str, Any]], Payload]:
    """Parts as JSON descriptions and one payload of concatenated IPC streams.

    One part that keeps the IPC message its rows came in (:attr:`Part.message`) and is
    bound for a payload file is that message's stream as it is, in pieces
    (:class:`~flight.durability.records.Framed`): its rows are not serialized again.
    """
    message = parts[0].message if len(parts) == 1 else None
    if message is not None and parts[0].diffs is None:
        p = parts[0]
        framed = Framed(*message.stream_pieces(p.data.schema))
        if framed.nbytes >= EXTERNAL_MIN_BYTES:
            return [{"table": p.table, "kind": p.kind.value, "bytes": framed.nbytes,
                     "diffs": False}], framed
    metas, blobs = [], []
    for p in parts:  # one IPC stream per part
        data = p.data
        if p.diffs is not None:
            data = data.append_column(DIFF, pa.array(p.diffs, pa.int64()))
        blob = ipc_bytes(data)
        metas.append({"table": p.table, "kind": p.kind.value, "bytes": blob.size,
                      "diffs": p.diffs is not None})
        blobs.append(blob)
    if len(blobs) == 1:  # the common case: the IPC buffer itself, no copy
        return metas, blobs[0]
    return metas, b"".join(blobs)


def decode_parts(metas: list[dict[str, Any]], payload: Blob, registry: TableRegistry) -> list[Part]:
    """Inverse of :func:`encode_parts`: each part's rows checked by its table in ``registry``
    (:meth:`~engine.sources.SourceTable.check_batch`), as rows arriving from a client are.

    Raises
    ------
    TableNotFound
        If a part's table is not in ``registry``.
    InputError
        If it is not a source table, or its check refuses the rows.
    """
    parts, at = [], 0
    for m in metas:  # one IPC stream per part
        data = read_ipc(memoryview(payload)[at: at + m["bytes"]])
        at += m["bytes"]
        diffs = None
        if m["diffs"]:
            diffs = np.asarray(data.column(DIFF).to_numpy(), dtype=np.int64)
            data = data.drop_columns([DIFF])
        table = registry.get(m["table"]).table
        if not isinstance(table, SourceTable):
            raise InputError(f"table {m['table']!r} is not a source table; it takes no writes")
        kind = PutMode.UPSERT if diffs is not None else PutMode(m["kind"])  # a diff's rows: an upsert's
        parts.append(Part(m["table"], table.check_batch(data, kind), diffs))
    return parts


class Durability:
    """Journals and applies every change to durable server state; checkpoints; recovers.

    Parameters
    ----------
    graph, registry, staging
        The server's update graph, tables and staging area.
    data_dir
        Where the journal and checkpoints live; ``None``: in memory, nothing is kept.
    checkpoint_bytes, checkpoint_seconds
        A checkpoint is written when the journal has grown by this many bytes, or this
        many seconds have passed with something journaled, whichever comes first; bytes
        staged into mirrors count as journaled (:meth:`mirrored`).
    """

    def __init__(self, graph: UpdateGraph, registry: TableRegistry, staging: StagingArea, *,
                 data_dir: str | os.PathLike[str] | None = None, checkpoint_bytes: int = 512 << 20,
                 checkpoint_seconds: float = 300.0) -> None:
        self.graph = graph
        self.registry = registry
        self.staging = staging
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoint_seconds = checkpoint_seconds
        self.journal: Journal | None = Journal.open(self.data_dir) if self.data_dir is not None else None
        self._gate = threading.RLock()  # held around every apply and every cycle
        self._applied = 0               # last journal seq applied (under the gate)
        self._marked = 0                # last position written as a cycle marker
        self._derived: list[tuple[str, bytes]] = []  # durable derived tables, in order
        self._derive: Callable[[bytes], str] | None = None
        self._mirrors: dict[str, dict[str, Any]] = {}  # mirror name -> its spec, in order
        # in a replay a remembered mirror holds its name, as its link (not started yet)
        # did: a creation it refused stays refused. Only for records written so ("claims"
        # in their meta; an older journal's were accepted, and the table that took a
        # mirror's name must be dropped, which forgets the mirror, before another can)
        self._claims_on = False
        registry.claims.append(self._claim)
        self._holds: dict[str, set[int]] = {}  # write id -> seqs of its held batches
        self._checkpointer: threading.Thread | None = None
        self._stop = threading.Event()
        self._since_bytes = 0
        self._last_checkpoint = time.monotonic()
        self.checkpoints = 0
        #: called as ``on_put(table, rows, nbytes)`` for each batch accepted into a table
        self.on_put: Callable[[str, int, int], None] | None = None
        if self.journal is not None:
            graph.cycle_gate = self
            staging.forgetter = self.forget

    @property
    def durable(self) -> bool:
        return self.journal is not None

    # the cycle gate -----------------------------------------------------------------------
    def __enter__(self) -> Durability:
        self._gate.acquire()
        if self._applied != self._marked and self.journal is not None:
            # this cycle takes every record up to self._applied: mark it for replay
            self._marked = self._applied
            self.journal.append_nowait(RecordKind.CYCLE.value, None,
                                       json.dumps({"through": self._applied}).encode())
        return self

    def __exit__(self, *exc: object) -> None:
        self._gate.release()

    # the write path -----------------------------------------------------------------------
    def _record(self, kind: RecordKind, table: str | None, meta: dict[str, Any], payload: Payload,
                apply: Callable[[int], T]) -> T:
        """Journal, then apply in journal order; in memory, apply at once."""
        if self.journal is None:
            return apply(0)
        return self._submit(kind, table, meta, payload, apply, None).result()

    def _submit(self, kind: RecordKind, table: str | None, meta: dict[str, Any], payload: Payload,
                apply: Callable[[int], T], chain: Chain | None) -> Future[T]:
        """Queue a record; the future is the apply's result once durable and applied."""
        assert self.journal is not None
        out: Future[T] = Future()

        def run(seq: int) -> None:
            with self._gate:
                try:
                    out.set_result(apply(seq))
                except BaseException as exc:
                    out.set_exception(exc)
                    raise
                finally:
                    self._applied = seq

        done = self.journal.submit(kind.value, table, json.dumps(meta).encode(), payload, apply=run,
                                   chain=chain)
        # not durable (the apply never ran): the journal's error is the answer
        done.add_done_callback(lambda f: None if out.done() or f.exception() is None
                               else out.set_exception(f.exception()))
        self._since_bytes += payload_size(payload) + 64
        return out

    @property
    def synchronous(self) -> bool:
        """Whether :meth:`submit` is done when it returns: in memory, with no journal."""
        return self.journal is None

    def apply(self, entry: TableEntry, parts: list[Part]) -> None:
        """Stage the parts of one batch into ``entry``'s table (see :meth:`StagingArea.apply`)."""
        if self.journal is None:  # in memory: nothing to encode
            self.staging.apply(entry, parts)
        else:
            metas, payload = encode_parts(parts)
            self._record(RecordKind.APPLY, entry.name, {"parts": metas}, payload,
                         lambda seq: self.staging.apply(entry, parts))
        self._count(parts)

    def _count(self, parts: list[Part]) -> None:
        if self.on_put is not None and parts:
            self.on_put(parts[0].table, sum(p.data.num_rows for p in parts),
                        sum(p.nbytes for p in parts))

    def open_chain(self) -> Chain | None:
        """A new :class:`~flight.durability.records.Chain` for one DoPut stream's batches
        (``None`` in memory, where they apply at once and in order)."""
        return None if self.journal is None else Chain()

    def submit(self, entry: TableEntry, parts: list[Part], chain: object) -> Future[None]:
        """:meth:`apply` without waiting: the future is done once the batch is durable and
        staged. Batches of one ``chain`` (one DoPut stream) become durable as a prefix.

        Only for writes whose refusal at apply time is permanent for the table (append,
        upsert, delete: a failed table), so that no batch after a refused one could apply.
        ``chain`` is what :meth:`open_chain` gave the stream.
        """
        if self.journal is None:  # in memory: at once
            out = self.staging.submit(entry, parts)
        else:
            assert isinstance(chain, Chain), "a durable stream's chain comes from open_chain"
            metas, payload = encode_parts(parts)
            out = self._submit(RecordKind.APPLY, entry.name, {"parts": metas}, payload,
                               lambda seq: self.staging.apply(entry, parts), chain)
        if self.on_put is not None:
            on_put, rows, nbytes = self.on_put, sum(p.data.num_rows for p in parts), \
                sum(p.nbytes for p in parts)
            out.add_done_callback(lambda f: None if f.exception() is not None
                                  else on_put(entry.name, rows, nbytes))
        return out

    def hold(self, write_id: str, slot: tuple[int, int], parts: list[Part], rows: int) -> None:
        """Hold a batch of an uncommitted write (see :meth:`StagingArea.hold`)."""
        if self.journal is None:  # in memory: nothing to encode
            self.staging.hold(write_id, slot, parts, rows)
            self._count(parts)
            return
        metas, payload = encode_parts(parts)

        def run(seq: int) -> None:
            self.staging.hold(write_id, slot, parts, rows)
            if self.journal is not None:
                self._holds.setdefault(write_id, set()).add(seq)

        self._record(RecordKind.HOLD, None, {"write_id": write_id, "slot": list(slot), "rows": rows,
                                    "parts": metas, "limits": self._limits()}, payload, run)
        self._count(parts)

    def commit(self, request: pb.CommitRequest, *, wait: bool | None = None) -> pb.CommitResult:
        """Commit a staged write (see :meth:`StagingArea.commit`)."""
        def run(seq: int) -> pb.CommitResult:
            result = self.staging.commit_now(request)
            self._holds.pop(request.write_id, None)
            return result

        result = self._record(RecordKind.COMMIT, None,
                              {"request": _b64(request.SerializeToString())}, b"", run)
        if result.applied:
            self.staging.wait_applied(result.step, wait)
        return result

    def abort(self, request: pb.AbortRequest) -> int:
        """Abort a staged write (see :meth:`StagingArea.abort`)."""
        def run(seq: int) -> int:
            self._holds.pop(request.write_id, None)
            return self.staging.abort(request)

        return self._record(RecordKind.ABORT, None, {"write_id": request.write_id}, b"", run)

    def forget(self, writes: list[str], committed: list[str], aborted: list[str],
               dropped: list[str] | None = None) -> int:
        """Drop expired writes and forget old write ids (see :meth:`StagingArea.forget`)."""
        meta = {"writes": writes, "committed": committed, "aborted": aborted,
                "dropped": dropped or []}
        return self._record(RecordKind.FORGET, None, meta, b"",
                            lambda seq: self.staging.forget(writes, committed, aborted, dropped))

    def create_table(self, name: str, schema: pa.Schema, kind: str, *, keys: list[str],
                     capacity: int, if_not_exists: bool, pending_for: str | None = None
                     ) -> TableEntry:
        """Create a durable source table (see :meth:`TableRegistry.create_source`).

        With ``pending_for``, ``name`` is a pending table's
        (:func:`~flight.streams.registry.pending_name`) that is to be ``pending_for`` once
        filled (:meth:`rename`); its messages name it so. A restart drops it if it was not
        renamed."""
        if is_pending(name) != (pending_for is not None):
            raise InputError(f"bad table name {name!r}: names starting with {PENDING_PREFIX!r} "
                             f"are the server's own (tables being filled)")
        meta = {"schema": _b64(schema.serialize().to_pybytes()), "kind": kind, "keys": keys,
                "capacity": capacity, "if_not_exists": if_not_exists, "limits": self._limits(),
                "claims": True}
        if pending_for is not None:
            meta["shows_as"] = pending_for
        return self._record(RecordKind.CREATE, name, meta, b"", lambda seq: self._create(name, meta))

    def _create(self, name: str, meta: dict[str, Any]) -> TableEntry:
        schema = pa.ipc.read_schema(pa.py_buffer(_unb64(meta["schema"])))
        entry = self.registry.create_source(name, schema, meta["kind"], keys=list(meta["keys"]),
                                            capacity=int(meta["capacity"]),
                                            if_not_exists=bool(meta["if_not_exists"]),
                                            pending=is_pending(name))
        if meta.get("shows_as"):
            entry.table.name = meta["shows_as"]
        entry.durable = True
        return entry

    def rename(self, pending: str, name: str, *, replace: bool) -> TableEntry:
        """The pending table ``pending``, filled, takes the name ``name``, in one journal
        record (see :meth:`TableRegistry.rename`): after a crash, either it has the name
        and every row committed into it, or the table that had the name is as it was."""
        meta = {"to": name, "replace": replace, "claims": True, "limits": self._limits()}
        return self._record(RecordKind.RENAME, pending, meta, b"",
                            lambda seq: self._rename(pending, meta))

    def _rename(self, pending: str, meta: dict[str, Any]) -> TableEntry:
        return self.registry.rename(pending, meta["to"], replace=bool(meta["replace"]))

    def drop_table(self, name: str) -> bool:
        """Drop a table (see :meth:`TableRegistry.drop`)."""
        return self._record(RecordKind.DROP, name, {}, b"", lambda seq: self._drop(name))

    def _drop(self, name: str) -> bool:
        self._derived = [(n, r) for n, r in self._derived if n != name]
        self._mirrors.pop(name, None)
        return self.registry.drop(name)

    def mirror(self, name: str, spec: dict[str, Any], start: Callable[[], T]) -> T:
        """Start mirror ``name`` and remember what it follows, for restarts.

        ``spec`` is the mirror's JSON description (:meth:`flight.links.MirrorSpec.to_json`:
        no token); ``start()`` starts its link and returns it. A ``mirror`` record is
        journaled first unless ``name`` is remembered with this very ``spec`` (a mirror
        given again at a restart); once ``start()`` returned, ``spec`` is remembered.
        """
        if self._mirrors.get(name) == spec:
            return start()

        def run(seq: int) -> T:
            out = start()
            self._mirrors[name] = spec
            return out

        return self._record(RecordKind.MIRROR, name, {"spec": spec}, b"", run)

    @property
    def mirrors(self) -> dict[str, dict[str, Any]]:
        """Mirror name -> the spec :meth:`mirror` remembered (from the checkpoint and the
        journal after a restart), in the order they were started."""
        return dict(self._mirrors)

    def mirrored(self, nbytes: int) -> None:
        """Count ``nbytes`` staged into a mirror toward the next checkpoint: a mirror's
        changes are not journaled, its last checkpoint is where it resumes from."""
        self._since_bytes += nbytes

    def derive(self, request: bytes, build: Callable[[], str]) -> str:
        """Build a derived table and keep its definition (``request``) for restarts.

        ``build`` creates and registers the table and returns its name.
        """
        def run(seq: int) -> str:
            name = build()
            self._derived.append((name, request))
            self.registry.get(name).durable = True
            return name

        return self._record(RecordKind.DERIVE, None, {"request": _b64(request), "limits": self._limits(),
                                                          "claims": True},
                            b"", run)

    def _limits(self) -> dict[str, int | None]:
        """The limits a creation or a held batch is journaled with (see :meth:`_limited`)."""
        return {"max_tables": self.registry.max_tables, "max_columns": self.registry.max_columns,
                "max_staged_bytes_per_write": self.staging.max_staged_bytes_per_write}

    @contextmanager
    def _limited(self, limits: dict[str, int | None]) -> Iterator[None]:
        """Apply under ``limits`` (a limit not named: none), then the server's own again.

        Recovery restores the checkpoint under no limits and replays each record under the
        limits it was journaled with: a restart with other limits neither loses a table or
        a batch that was accepted nor brings back one that was refused.
        """
        reg, staging = self.registry, self.staging
        saved = reg.max_tables, reg.max_columns, staging.max_staged_bytes_per_write
        reg.max_tables, reg.max_columns = limits.get("max_tables"), limits.get("max_columns")
        staging.max_staged_bytes_per_write = limits.get("max_staged_bytes_per_write")
        try:
            yield
        finally:
            reg.max_tables, reg.max_columns, staging.max_staged_bytes_per_write = saved

    def set_deriver(self, derive: Callable[[bytes], str]) -> None:
        """How recovery rebuilds a derived table from its definition (the TableService).

        ``derive(request)`` builds and registers the table and returns its name.
        """
        self._derive = derive

    # checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> Path | None:
        """Write a checkpoint now and drop the journal it covers; ``None`` in memory."""
        if self.journal is None or self.data_dir is None:
            return None
        with self._gate:
            self.graph.run_cycle()  # takes everything staged: the tables hold every record
            seq = self._applied
            with self.graph.shared_lock():
                tables, state = self._capture()
        path = write_checkpoint(self.data_dir / "checkpoints", seq, tables, state)
        holds = [s for seqs in state["holds"].values() for s in seqs]
        self.journal.truncate(min([seq, *(s - 1 for s in holds)]))
        self._since_bytes = 0
        self._last_checkpoint = time.monotonic()
        self.checkpoints += 1
        return path

    def _capture(self) -> tuple[dict[str, pa.Table], dict[str, Any]]:
        tables: dict[str, pa.Table] = {}
        catalog = []
        for e in self.registry.entries_in_order():  # creation order: parents first
            mirror = e.kind == TableKind.MIRROR and isinstance(e.table, ReplicaTable)
            if not getattr(e, "durable", False) or not (e.is_source or mirror):
                continue
            # a mirror's state: its position in the origin's history (ReplicaTable)
            rows, keys, alloc = e.table.export_state()  # type: ignore[attr-defined]
            tables[e.name] = rows.append_column(ROW_KEY, pa.array(keys, pa.int64()))
            catalog.append({"name": e.name, "kind": e.kind, "keys": e.keys,
                            "capacity": getattr(e.table, "capacity", 0),
                            "schema": _b64(e.table.schema.serialize().to_pybytes()),
                            "state": alloc})
        state = {
            "catalog": catalog,
            "derived": [{"name": n, "request": _b64(r)} for n, r in self._derived],
            "mirrors": [{"name": n, "spec": s} for n, s in self._mirrors.items()],
            "staging": self.staging.export_memory(),
            "holds": self._open_holds(),
            "step": self.graph.step,
        }
        return tables, state

    def _open_holds(self) -> dict[str, list[int]]:
        """Journal positions of the batches held by writes still open (expired ones go)."""
        open_ids = set(self.staging.open_write_ids())
        self._holds = {w: s for w, s in self._holds.items() if w in open_ids}
        return {w: sorted(s) for w, s in self._holds.items()}

    def start(self) -> None:
        """Write checkpoints in the background when the journal has grown or time passed."""
        if self.journal is None or self._checkpointer is not None:
            return

        def loop() -> None:
            while not self._stop.wait(1.0):
                due = (self._since_bytes >= self.checkpoint_bytes
                       or (self._since_bytes and time.monotonic() - self._last_checkpoint
                           >= self.checkpoint_seconds))
                if due:
                    try:
                        self.checkpoint()
                    except Exception:
                        log.exception("checkpoint failed; the journal keeps every change")

        self._checkpointer = threading.Thread(target=loop, name="ticktable-checkpoint",
                                              daemon=True)
        self._checkpointer.start()

    def close(self, *, checkpoint: bool = True) -> None:
        """Stop the background checkpoints, write a last one (clean shutdown), close."""
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
            self._checkpointer = None
        if self.journal is None:
            return
        if checkpoint:
            try:
                self.checkpoint()
            except Exception:
                log.exception("the shutdown checkpoint failed; the journal keeps every change")
        self.journal.close()
        self.journal = None
        if self.graph.cycle_gate is self:
            self.graph.cycle_gate = None

    # recovery -----------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Bring back the last acknowledged state (before the server listens).

        Raises
        ------
        CheckpointError, JournalError
            Damage that would lose acknowledged data: start-up stops, naming the file
            (:class:`~engine.errors.CheckpointError`, :class:`~engine.errors.JournalError`).
        """
        assert self.journal is not None and self.data_dir is not None
        if self.graph.running:
            raise RuntimeError("recover before the update graph runs periodically")
        t0 = time.perf_counter()
        with self._limited({}):  # what the checkpoint holds was accepted
            start, rows, records, n, cycles = self._recover_records()
        self._applied = self._marked = max([start, *(r.seq for r in records)])
        open_ids = self.staging.open_write_ids()
        if open_ids:  # journaled: a later replay drops them here too, before later commits
            self._record(RecordKind.FORGET, None, {"writes": open_ids, "committed": [], "aborted": []},
                         b"", lambda seq: self.staging.drop_open())
        dropped = len(open_ids)
        self._holds.clear()
        for e in self.registry.entries_in_order():  # filled, never renamed: never seen
            if is_pending(e.name):
                log.info("dropping %r, being filled as %r when the server stopped", e.name,
                         e.table.name)
                self.drop_table(e.name)
        report = RecoveryReport(start, len(self.registry.entries()), rows, n, cycles, dropped,
                                time.perf_counter() - t0)
        log.info("recovered: checkpoint at %d, %d table(s), %d rows, %d journal record(s) in "
                 "%d cycle(s), %d uncommitted write(s) dropped, %.2f s", start, report.tables,
                 rows, n, cycles, dropped, report.seconds)
        return report

    def _recover_records(self) -> tuple[int, int, list[Record], int, int]:
        """Restore the checkpoint and replay the journal after it (see :meth:`recover`).

        Returns the checkpoint's position, its rows, the records read, how many were
        replayed and the cycles run.
        """
        assert self.data_dir is not None
        ckpt = read_checkpoint(self.data_dir / "checkpoints")
        start, rows, holds = 0, 0, {}
        if ckpt is not None:
            start = ckpt.seq
            rows = self._restore(ckpt.tables, ckpt.state)
            holds = {w: set(s) for w, s in ckpt.state["holds"].items()}
        wanted = {s for seqs in holds.values() for s in seqs}
        first = min([start, *(s - 1 for s in wanted)])
        records = list(self._records(first))
        markers = sorted({json.loads(r.meta)["through"] for r in records
                          if r.kind == RecordKind.CYCLE and r.seq > start})
        cycles = n = 0
        for rec in records:  # journal order
            if rec.seq <= start:
                if rec.seq in wanted:  # a batch of a write still open at the checkpoint
                    self._replay(rec)
                continue
            if rec.kind == RecordKind.CYCLE:
                continue
            while markers and markers[0] < rec.seq:
                self.graph.run_cycle()
                cycles += 1
                markers.pop(0)
            self._replay(rec)
            n += 1
        self.graph.run_cycle()  # whatever the last records staged
        return start, rows, records, n, cycles + 1

    def _records(self, after: int) -> Iterator[Record]:
        assert self.journal is not None
        yield from self.journal.records(after=after)

    def _restore(self, tables: dict[str, pa.Table], state: dict[str, Any]) -> int:
        rows = 0
        for c in state["catalog"]:  # creation order
            meta = {"schema": c["schema"], "kind": c["kind"], "keys": c["keys"],
                    "capacity": c["capacity"], "if_not_exists": False}
            entry = (self._create_mirror(c["name"], meta["schema"]) if c["kind"] == TableKind.MIRROR
                     else self._create(c["name"], meta))
            data = tables[c["name"]]
            keys = np.asarray(data.column(ROW_KEY).to_numpy(), dtype=np.int64)
            entry.table.restore_state(data.drop_columns([ROW_KEY]), keys,  # type: ignore[attr-defined]
                                      c["state"])
            rows += data.num_rows
        self.graph.step = max(self.graph.step, int(state["step"]))
        self.staging.restore_memory(state["staging"])
        # a checkpoint written before mirrors were durable has none
        self._mirrors = {m["name"]: m["spec"] for m in state.get("mirrors", [])}
        for d in state["derived"]:
            self._rebuild(_unb64(d["request"]), d["name"])
        return rows

    def _create_mirror(self, name: str, schema: str) -> TableEntry:
        """A mirror's table as its checkpoint left it, to be filled by ``restore_state``;
        its link starts after recovery (:meth:`mirrors`)."""
        table = ReplicaTable(self.graph, pa.ipc.read_schema(pa.py_buffer(_unb64(schema))),
                             name=name)
        entry = self.registry.add(name, table, TableKind.MIRROR)
        entry.durable = True
        return entry

    def _rebuild(self, request: bytes, name: str) -> None:
        if self._derive is None:
            raise InputError(f"derived table {name!r} cannot be rebuilt: no TableService")
        built = self._derive(request)
        self._derived.append((built, request))
        self.registry.get(built).durable = True

    def _claim(self, name: str, kind: str) -> str | None:
        """See :attr:`TableRegistry.claims`: in a replay, a remembered mirror's name is its
        own (live, its link holds it: :class:`flight.links.Links`)."""
        spec = self._mirrors.get(name)
        if spec is None or kind == TableKind.MIRROR or not self._claims_on:
            return None
        return held_by(name, MirrorSpec.from_json(spec).origin)

    def _remember_mirror(self, name: str, spec: dict[str, Any]) -> None:
        """Replay of a ``mirror`` record: remembered, its link started after recovery (a
        table of another kind under its name refuses it again, as it refused the link)."""
        if name in self.registry.names() and self.registry.get(name).kind != TableKind.MIRROR:
            raise TableExists(f"table {name!r} already exists; mirror not restored")
        self._mirrors[name] = spec

    def _replay(self, rec: Record) -> None:
        """Apply one journal record again, as its write did (refusals repeat, and are skipped)."""
        meta = json.loads(rec.meta) if rec.meta else {}
        self._claims_on = bool(meta.get("claims"))  # checked when written (absent before)
        try:
            with self._limited(meta.get("limits", {})):  # none in older journals
                self._dispatch(rec, meta)
        except Exception as exc:  # the write was refused the first time too
            log.debug("replay of record %d (%s) refused again: %s", rec.seq, rec.kind, exc)
        finally:
            self._claims_on = False

    def _dispatch(self, rec: Record, meta: dict[str, Any]) -> None:
        kind = rec.kind
        if kind == RecordKind.APPLY:
            assert rec.table is not None
            self.staging.apply(self.registry.get(rec.table),
                               decode_parts(meta["parts"], rec.payload, self.registry))
        elif kind == RecordKind.HOLD:
            self.staging.hold(meta["write_id"], (int(meta["slot"][0]), int(meta["slot"][1])),
                              decode_parts(meta["parts"], rec.payload, self.registry),
                              int(meta["rows"]))
            self._holds.setdefault(meta["write_id"], set()).add(rec.seq)
        elif kind == RecordKind.COMMIT:
            req = pb.CommitRequest()
            req.ParseFromString(_unb64(meta["request"]))
            self._holds.pop(req.write_id, None)
            self.staging.commit_now(req)
        elif kind == RecordKind.ABORT:
            self._holds.pop(meta["write_id"], None)
            self.staging.abort(pb.AbortRequest(write_id=meta["write_id"]))
        elif kind == RecordKind.CREATE:
            assert rec.table is not None
            self._create(rec.table, meta)
        elif kind == RecordKind.DROP:
            assert rec.table is not None
            self._drop(rec.table)
        elif kind == RecordKind.RENAME:
            assert rec.table is not None
            self._rename(rec.table, meta)
        elif kind == RecordKind.DERIVE:
            self._rebuild(_unb64(meta["request"]), "?")
        elif kind == RecordKind.MIRROR:
            assert rec.table is not None
            self._remember_mirror(rec.table, meta["spec"])
        elif kind == RecordKind.FORGET:
            self.staging.forget(meta["writes"], meta["committed"], meta["aborted"],
                                meta.get("dropped"))  # absent from older journals
        else:
            log.warning("journal record %d has unknown kind %r; skipped", rec.seq, kind)
