"""Checked writes into their tables: :class:`Part`, and the :class:`PartWriter` that stages
parts under the graph's and tables' locks.

:mod:`flight.ingest.staging` holds, commits and forgets writes, under its own mutex; this
module is where their :class:`Part` s land in the registry's tables (DESIGN.md §5),
through the :class:`PartWriter` a :class:`~flight.ingest.staging.StagingArea` holds:

* the parts of one batch without a ``write_id``, into their table at once
  (:meth:`PartWriter.apply`, :meth:`PartWriter.submit`): visible after the next cycle;
* the parts of the chosen slots of one commit, in one critical section holding the graph's
  exclusive lock (:meth:`PartWriter.write_commit`), so one cycle applies them all, across
  tables.

A part's rows were checked once, by their table
(:meth:`~engine.sources.SourceTable.check_batch`), when the batch arrived; staging them
does not check them again (:meth:`~engine.sources.SourceTable.stage`).

A DIFF part (differential triples) is resolved into upserts and deletes by
:func:`engine.differential.resolve.resolve_triples`, against the key's current row
*including* the writes staged before it (:meth:`KeyedTable.lookup` with ``staged=True``),
and staged under the table's :meth:`~engine.sources.KeyedTable.write_lock`, so no other
write comes between the check and the staging. No cycle is run for it: consecutive DIFF
batches compose exactly whether or not a cycle ran between them. An invalid DIFF batch
raises :class:`~engine.errors.InputError` naming table and key, and stages nothing of the
batch (nothing of the write, at commit). The DIFF parts of one table in one commit are
summed into one batch (partitions have no order); a commit may not mix DIFF with other
modes for one table.

Locks, always in this order: the graph's lock (shared, or exclusive for a commit), then a
table's staging lock. The parts of one batch are staged under their table's staging lock
alone, all of them in one hold (:meth:`~engine.sources.SourceTable.stage_all`: one cycle
takes them all, and a cycle waiting for readers of the graph holds up no writer); a DIFF
part under the table's write lock. Nothing here takes the StagingArea's own mutex.
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.differential.resolve import KeyedWrites, resolve_triples
from engine.differential.zset import ZSet
from engine.errors import InputError, TableFailed, TableNotFound
from engine.sources import CheckedBatch, KeyedTable, SourceTable
from flight.rpc.framing import IpcMessage
from flight.streams.registry import TableEntry, TableRegistry
from flight.wire import PutMode

__all__ = ["Part", "PartWriter"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Part:
    """One checked write to one table, ready to stage.

    Attributes
    ----------
    table
        The table's name.
    rows
        The rows, checked by the table (:meth:`~engine.sources.SourceTable.check_batch`):
        an ``append``, ``upsert`` or ``delete`` (the key columns only); a ``diff`` part's
        rows are checked as an ``upsert``'s.
    diffs
        The weight per row of a ``diff`` part; ``None`` for any other.
    message
        The IPC message the rows were decoded from, when the check kept them as they came
        (the same buffers, in the table's schema): the journal writes its bytes rather than
        serializing the rows again. ``None`` for any other part.
    """

    table: str
    rows: CheckedBatch
    diffs: I64 | None = None
    message: IpcMessage | None = None

    @property
    def kind(self) -> PutMode:
        """How it changes the table: ``APPEND``, ``UPSERT``, ``DELETE`` or ``DIFF``."""
        return PutMode(self.rows.kind) if self.diffs is None else PutMode.DIFF

    @property
    def data(self) -> pa.Table:
        """The rows, in the table's schema."""
        return self.rows.data

    @property
    def nbytes(self) -> int:
        """The bytes of the buffers the part holds (whole buffers: the memory it keeps).

        ``get_total_buffer_size`` rather than Arrow's ``nbytes``: a part's buffers are its
        own (a conformed batch, or rows taken from one), and ``nbytes`` works out the
        slice of each buffer a column uses, which costs far more, and is asked several
        times per batch (staging, in-flight bytes, metrics)."""
        return int(self.rows.data.get_total_buffer_size()) + (
            self.diffs.nbytes if self.diffs is not None else 0)


class PartWriter:
    """Writes checked parts into the registry's tables: one batch at once, or a commit's parts.

    Takes the graph's and the tables' locks; a :class:`~flight.ingest.staging.StagingArea`
    holds one and calls it without holding its own mutex.

    Parameters
    ----------
    registry
        The server's tables.
    """

    def __init__(self, registry: TableRegistry) -> None:
        self.registry = registry
        self.graph = registry.graph

    # writes without a write id --------------------------------------------------------------
    def apply(self, entry: TableEntry, parts: list[Part]) -> None:
        """Stage the parts of one batch into ``entry``'s table for its next cycle, atomically.

        A DIFF part is resolved against the table's rows with the writes staged before it
        folded in, and staged under the table's write lock; no cycle is run. It is resolved
        before taking the lock (cycles go on meanwhile) and again under it only if a write
        was staged into the table since (:attr:`~engine.sources.SourceTable.stages`).

        Raises
        ------
        InputError
            If a DIFF part is not a valid change of the table (naming table and key); nothing
            of the batch is staged.
        TableFailed
            If the table failed in an earlier cycle.
        """
        table = entry.table
        if any(p.kind == PutMode.DIFF for p in parts):
            assert isinstance(table, KeyedTable) and len(parts) == 1, "diff is one keyed part"
            refused = "nothing of the batch was applied"
            stamp = table.stages
            try:
                early: KeyedWrites | None = _resolve(table, parts, refused)
            except InputError:
                early = None  # resolved again under the lock, which raises if it still holds
            with table.write_lock():
                if early is None or table.stages != stamp:
                    early = _resolve(table, parts, refused)
                early.stage(table)
        else:  # the table's own staging lock makes them atomic: one cycle takes them all
            assert isinstance(table, SourceTable) and all(p.diffs is None for p in parts)
            table.stage_all([p.rows for p in parts])

    def submit(self, entry: TableEntry, parts: list[Part], chain: object = None) -> Future[None]:
        """:meth:`apply` at once, its outcome as a done future (the in-memory side of
        :meth:`flight.durability.durable.Durability.submit`; ``chain`` is not needed here)."""
        out: Future[None] = Future()
        try:
            self.apply(entry, parts)
            out.set_result(None)
        except Exception as exc:
            out.set_exception(exc)
        return out

    # the parts of a commit ------------------------------------------------------------------
    def _resolve_early(self, parts: list[Part], refused: str
                       ) -> dict[str, tuple[KeyedTable, int, KeyedWrites]]:
        """The DIFF parts of a commit resolved before its critical section: per table, the
        table, its :attr:`~engine.sources.SourceTable.stages` when read, and the writes.

        Resolving reads the table (its staged writes folded in) and costs what the triples
        cost (~80 ms for 200k); done here, cycles go on meanwhile. :meth:`write_commit`
        takes the writes only if nothing was staged into the table since, and resolves
        again under its lock otherwise. A part that does not resolve now is left to that
        second try, which raises.
        """
        early: dict[str, tuple[KeyedTable, int, KeyedWrites]] = {}
        for n in dict.fromkeys(p.table for p in parts if p.kind == PutMode.DIFF):
            try:
                table = self.registry.get(n).table
            except TableNotFound:
                continue
            if not isinstance(table, KeyedTable) or table.failure is not None:
                continue
            if any(p.table == n and p.kind != PutMode.DIFF for p in parts):
                continue  # refused under the lock
            stamp = table.stages
            try:
                early[n] = (table, stamp, _resolve(table, [p for p in parts if p.table == n],
                                                   refused))
            except InputError:
                continue
        return early

    def write_commit(self, write_id: str, parts: list[Part]) -> int:
        """Stage the parts of a commit in one critical section; returns the step of the
        cycle that applies them.

        All of them are staged while holding the graph's exclusive lock, so the next cycle
        applies them all, across tables; DIFF parts are resolved first, against their
        tables' rows with the writes staged before folded in.

        Raises
        ------
        TableFailed
            If a table of the parts failed in an earlier cycle; nothing is staged.
        InputError
            If a commit mixes DIFF with other modes for one table, or a DIFF part is not a
            valid change of its table; nothing is staged.
        TableNotFound
            If a table of the parts was dropped.
        InputError
            If a table of the parts was dropped and created again as a derived table (a
            DIFF part's: as a table without keys); nothing is staged.
        """
        if not parts:
            return self.graph.step
        names = list(dict.fromkeys(p.table for p in parts))
        refused = f"nothing of write {write_id!r} was committed"
        early = self._resolve_early(parts, refused)
        with self.graph.exclusive_lock():
            entries = {n: self.registry.get(n) for n in names}
            for e in entries.values():
                if e.table.failure is not None:  # check all before staging any
                    raise TableFailed(f"table {e.name!r} failed: {e.table.failure}")
            for p in parts:  # a name dropped and created again since the write was held
                e = entries[p.table]
                want = KeyedTable if p.kind == PutMode.DIFF else SourceTable
                if not isinstance(e.table, want):
                    what = "a keyed table" if want is KeyedTable else "a source table"
                    article = "an" if e.kind[:1] in ("a", "e", "i", "o", "u") else "a"
                    now = "a view" if e.kind == "view" else f"{article} {e.kind} table"
                    raise InputError(
                        f"table {e.name!r} is {now} now, not {what} as when write "
                        f"{write_id!r} was staged (it was dropped and created again); nothing "
                        f"of the write was committed")
            diff_tables = sorted({p.table for p in parts if p.kind == PutMode.DIFF})
            mixed = [n for n in diff_tables
                     if any(p.table == n and p.kind != PutMode.DIFF for p in parts)]
            if mixed:
                raise InputError(f"table(s) {mixed}: a commit cannot mix diff writes with other "
                                 f"modes for one table; commit them in separate writes")
            with ExitStack() as held:
                resolved: dict[str, KeyedWrites] = {}
                for n in diff_tables:  # check everything before staging anything
                    table = entries[n].table
                    assert isinstance(table, KeyedTable)
                    held.enter_context(table.write_lock())  # no write between check and stage
                    done = early.get(n)
                    if done is not None and done[0] is table and done[1] == table.stages:
                        resolved[n] = done[2]  # nothing staged into it since: still true
                    else:
                        resolved[n] = _resolve(table, [p for p in parts if p.table == n],
                                               refused)
                for n in names:
                    table = entries[n].table
                    if n in resolved:
                        assert isinstance(table, KeyedTable)
                        resolved[n].stage(table)
                    else:
                        for part in parts:
                            if part.table == n:
                                _stage_part(table, part)
            step = self.graph.step + 1  # the next cycle takes every pending write
        self.graph.request_cycle()
        return step


def _resolve(table: KeyedTable, parts: list[Part], refused: str) -> KeyedWrites:
    """The upserts and deletes equivalent to the summed DIFF ``parts`` (hold the write lock).

    Raises
    ------
    InputError
        Of the class :func:`resolve_triples` raised, its message ending with ``refused``.
    """
    data = parts[0].data if len(parts) == 1 else pa.concat_tables([p.data for p in parts])
    diffs = np.concatenate([p.diffs for p in parts if p.diffs is not None])
    try:
        return resolve_triples(table, ZSet(data, diffs))
    except InputError as exc:
        raise type(exc)(f"{exc}; {refused}") from exc


def _stage_part(table: object, part: Part) -> None:
    """Stage one checked upsert, delete or append part into its table (no check again)."""
    assert isinstance(table, SourceTable) and part.diffs is None, part.kind
    table.stage(part.rows)
