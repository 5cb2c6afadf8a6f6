"""Table: a RowSet and named column sources that change once per cycle.

Source tables (``engine.sources``) take writes from outside and apply them at the start
of a cycle; derived tables (``engine.ops``) own a listener that turns their parents'
updates into their own. Either way the graph commits the update: the previous RowSet is
kept until the cycle ends, the update is validated when the graph asks, and the table's
listeners are told.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd
import pyarrow as pa

from engine.columns import read_columns, read_range
from engine.errors import SchemaError, TableFailed
from engine.rowset import RowSet, as_key_array

if TYPE_CHECKING:
    from engine.columns import ColumnSource
    from engine.differential.dataflow import Collection, Dataflow
    from engine.graph import UpdateGraph
    from engine.update import TableUpdate

__all__ = ["DerivedTable", "Derivation", "Listener", "ListenerHandle", "Table", "derive"]

log = logging.getLogger(__name__)

_names = itertools.count(1)

UpdateCallback = Callable[["TableUpdate", "Table"], None]
FailureCallback = Callable[[BaseException, "Table"], None]


class Listener(Protocol):
    """Turns parent updates into the child's update.

    ``on_update`` takes one positional argument per parent (``None`` for a parent that is
    silent this cycle) and returns the child's update, or ``None`` when it has none.
    ``result`` is the child table, set by :func:`derive` once the child exists.
    """

    result: Table

    @property
    def on_update(self) -> Callable[..., TableUpdate | None]: ...


class ListenerHandle:
    """Returned by :meth:`Table.listen`; :meth:`remove` stops the notifications."""

    def __init__(self, table: Table, entry: tuple[UpdateCallback, FailureCallback | None]) -> None:
        self._table = table
        self._entry: tuple[UpdateCallback, FailureCallback | None] | None = entry

    def remove(self) -> None:
        # forgetting the callbacks too: a listener object usually holds its handle, and
        # the cycle through its bound methods would keep it (and the table, with all its
        # columns) alive until the cyclic garbage collector happened to run
        entry, self._entry = self._entry, None
        if entry is not None and entry in self._table._listeners:
            self._table._listeners.remove(entry)


class Table:
    """A live table: ``rowset`` (row keys in order) plus one column source per column.

    Read it consistently from any thread with :meth:`to_arrow` / :meth:`to_pandas`
    (they take the graph's shared lock). ``prev_rowset`` is the RowSet at the start of
    the running cycle and equals ``rowset`` outside cycles.

    ``add_only`` promises that every update of the table only adds rows, at row keys
    above all its current ones: no removes, modifies or shifts, ever. It is False unless
    the table's kind guarantees it (an :class:`~engine.sources.AppendOnlyTable`, and a
    ``where`` or a column operation over an add-only parent); operations may rely on it
    (``agg_by`` keeps cheaper states) and fail the table if it is broken.

    ``insert_only`` is the weaker promise that no update removes or modifies a row: rows
    arrive anywhere in the order, and rows may shift. ``add_only`` implies it; an inner
    ``join`` of two insert-only tables keeps it (a late right row adds a match inside an
    earlier left row's block; a left row outgrowing its block shifts every row), and so
    does a ``where`` over one. ``agg_by`` keeps running ``min``/``max`` over it.
    """

    add_only: bool = False
    _insert_only: bool = False

    def __init__(
        self,
        graph: UpdateGraph,
        schema: pa.Schema,
        columns: dict[str, ColumnSource],
        rowset: RowSet | None = None,
        *,
        parents: Sequence[Table] = (),
        name: str | None = None,
    ) -> None:
        if [f.name for f in schema] != list(columns):
            raise SchemaError(f"columns {list(columns)} do not match schema {schema.names}")
        self.graph = graph
        self.schema = schema
        self.name = name or f"table_{next(_names)}"
        self.parents: tuple[Table, ...] = tuple(parents)
        self._columns = dict(columns)
        self.rowset = rowset if rowset is not None else RowSet()
        self._prev_rowset: RowSet | None = None
        self._update: TableUpdate | None = None
        self.failure: BaseException | None = None
        self.last_step = graph.step
        self._listeners: list[tuple[UpdateCallback, FailureCallback | None]] = []
        self.closed = False
        graph._add_node(self)

    # reading ------------------------------------------------------------------------
    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    @property
    def size(self) -> int:
        return len(self.rowset)

    def __len__(self) -> int:
        return len(self.rowset)

    @property
    def insert_only(self) -> bool:
        """No update of this table removes or modifies a row (see the class docstring)."""
        return self.add_only or self._insert_only

    @property
    def prev_rowset(self) -> RowSet:
        return self._prev_rowset if self._prev_rowset is not None else self.rowset

    @property
    def cycle_update(self) -> TableUpdate | None:
        """This cycle's update, while the cycle runs and after this table was visited."""
        return self._update

    def column(self, name: str) -> ColumnSource:
        """The column source named ``name``.

        Raises
        ------
        SchemaError
            If there is no such column.
        """
        try:
            return self._columns[name]
        except KeyError:
            raise SchemaError(
                f"table {self.name!r} has no column {name!r} (has: {', '.join(self._columns)})"
            ) from None

    @property
    def columns(self) -> dict[str, ColumnSource]:
        return dict(self._columns)

    def check_alive(self) -> None:
        """Raise :class:`~engine.errors.TableFailed` if the table failed in an earlier cycle.

        A failed table keeps its last rows but takes no more updates (DESIGN.md §2); readers
        that serve it (a snapshot, a subscription, a feed) ask this first.
        """
        if self.failure is not None:
            raise TableFailed(f"table {self.name!r} failed: {self.failure}") from self.failure

    def to_arrow(self, columns: Iterable[str] | None = None, *, lock: bool = True) -> pa.Table:
        """A consistent snapshot of the current rows, in row-key order.

        ``lock=False`` reads without taking the graph's shared lock: for a caller that holds
        it already and reads several tables at one step (taking it twice could wait behind
        a cycle waiting for the first).

        Raises
        ------
        TableFailed
            If the table failed in an earlier cycle.
        """
        names = list(columns) if columns is not None else self.column_names
        with self.graph.shared_lock() if lock else contextlib.nullcontext():
            self.check_alive()
            rs = self.rowset
            sources = [self.column(n) for n in names]
            if rs and rs.last() - rs.first() + 1 == len(rs):  # dense keys: ranges, no gather
                arrays = read_range(sources, rs.first(), rs.last() + 1)
            else:
                arrays = read_columns(sources, rs.keys())
        fields = [self.schema.field(n) for n in names]
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def to_pandas(self, columns: Iterable[str] | None = None) -> pd.DataFrame:
        """:meth:`to_arrow` as a pandas DataFrame."""
        df: pd.DataFrame = self.to_arrow(columns).to_pandas()
        return df

    def rows(self, keys: Any, columns: Iterable[str] | None = None, *, prev: bool = False) -> pa.Table:
        """Values at row ``keys`` (previous key space and values when ``prev``)."""
        k = as_key_array(keys)
        names = list(columns) if columns is not None else self.column_names
        arrays = read_columns([self.column(n) for n in names], k, prev=prev)
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(n) for n in names]))

    def __repr__(self) -> str:
        state = "failed" if self.failure is not None else f"{self.size} rows"
        return f"<{type(self).__name__} {self.name!r}: {state}, columns={self.column_names}>"

    # listening ----------------------------------------------------------------------
    def listen(
        self, on_update: UpdateCallback, on_failure: FailureCallback | None = None
    ) -> ListenerHandle:
        """Call ``on_update(update, table)`` inside every cycle in which this table changes.

        The callback runs on the cycle thread after the table committed its update, so it
        may read current and previous values. If it raises, it is removed (and
        ``on_failure`` told); the table is unaffected.
        """
        entry = (on_update, on_failure)
        self._listeners.append(entry)
        return ListenerHandle(self, entry)

    # the graph's side ---------------------------------------------------------------
    def _compute_update(self) -> TableUpdate | None:
        raise NotImplementedError

    def _take_for_cycle(self) -> None:
        """Set aside the writes the coming cycle applies (source tables; ``graph.cycle_gate``)."""

    def _commit(self, update: TableUpdate, *, validate: bool) -> None:
        prev = self.rowset
        cur = self._next_rowset(update, prev)
        if validate:
            update.validate(prev, cur, self._columns)
        self._prev_rowset = prev
        self.rowset = cur
        self._update = update
        self.last_step = self.graph.step

    def _next_rowset(self, update: TableUpdate, prev: RowSet) -> RowSet:
        """The RowSet after ``update``: ``update.apply(prev)``, unless the table knows it
        more cheaply (``validate`` still checks the two agree)."""
        return update.apply(prev)

    def _refresh(self) -> None:
        """Called when the table had nothing to report this cycle."""

    def _notify(self, update: TableUpdate) -> None:
        for entry in list(self._listeners):
            try:
                entry[0](update, self)
            except Exception as exc:
                log.error("listener %r on table %r raised; removed", entry[0], self.name,
                          exc_info=True)
                self._listeners.remove(entry)
                if entry[1] is not None:
                    entry[1](exc, self)

    def _fail(self, exc: BaseException, cause: BaseException | None = None) -> None:
        if cause is not None:
            exc.__cause__ = cause
        self.failure = exc
        for _, on_failure in list(self._listeners):
            if on_failure is not None:
                try:
                    on_failure(exc, self)
                except Exception:
                    log.exception("failure listener on table %r raised", self.name)

    def _end_cycle(self) -> None:
        self._prev_rowset = None
        self._update = None

    # fluent operations (each family lives in engine/ops/<family>.py) ---------------
    def where(self, predicate: Any) -> Table:
        """Keep the rows for which the boolean ``pyarrow.compute`` expression is true."""
        from engine.ops.filter import where

        return where(self, predicate)

    def update(self, **exprs: Any) -> Table:
        """Add or replace columns computed from ``pyarrow.compute`` expressions."""
        from engine.ops.select import update

        return update(self, **exprs)

    def view(self, *columns: str, **exprs: Any) -> Table:
        """Keep ``columns`` plus computed ``exprs``, in that order (computed on read)."""
        from engine.ops.select import view

        return view(self, *columns, **exprs)

    def select(self, *columns: str, **exprs: Any) -> Table:
        """Keep ``columns`` plus computed ``exprs``, in that order (computed and stored)."""
        from engine.ops.select import select

        return select(self, *columns, **exprs)

    def drop_columns(self, *columns: str) -> Table:
        """All columns but ``columns``."""
        from engine.ops.select import drop_columns

        return drop_columns(self, *columns)

    def rename_columns(self, mapping: dict[str, str]) -> Table:
        """Rename columns ``{old: new}``."""
        from engine.ops.select import rename_columns

        return rename_columns(self, mapping)

    def sort(self, by: str | Sequence[str], descending: bool | Sequence[bool] = False) -> Table:
        """Rows ordered by ``by`` (stable; see engine.ops.sort for nulls)."""
        from engine.ops.sort.listener import sort

        return sort(self, by, descending)

    def head(self, n: int) -> Table:
        """The first ``n`` rows."""
        from engine.ops.slice import head

        return head(self, n)

    def tail(self, n: int) -> Table:
        """The last ``n`` rows."""
        from engine.ops.slice import tail

        return tail(self, n)

    def slice(self, start: int, stop: int | None) -> Table:
        """Rows at positions ``start <= p < stop`` (negative counts from the end)."""
        from engine.ops.slice import slice_

        return slice_(self, start, stop)

    def natural_join(self, right: Table, on: str | Sequence[str], joins: Sequence[str] | None = None) -> Table:
        """Each row plus the columns ``joins`` of the right row with equal ``on`` (null if none)."""
        from engine.ops.join.listener import natural_join

        return natural_join(self, right, on, joins)

    def exact_join(self, right: Table, on: str | Sequence[str], joins: Sequence[str] | None = None) -> Table:
        """Like :meth:`natural_join`, but every row must have exactly one match."""
        from engine.ops.join.listener import exact_join

        return exact_join(self, right, on, joins)

    def join(self, right: Table, on: str | Sequence[str], joins: Sequence[str] | None = None) -> Table:
        """Many-to-many inner join on ``on``."""
        from engine.ops.join.listener import join

        return join(self, right, on, joins)

    def left_outer_join(self, right: Table, on: str | Sequence[str], joins: Sequence[str] | None = None) -> Table:
        """Many-to-many join keeping left rows without a match (right columns null)."""
        from engine.ops.join.listener import left_outer_join

        return left_outer_join(self, right, on, joins)

    def agg_by(self, aggs: Any, by: str | Sequence[str] = ()) -> Table:
        """One row per group of ``by`` with the aggregations ``aggs`` (engine.ops.aggregate).

        Groups are in order of their first row in this table's current rows, as a
        recomputation gives, whatever the history (a restart's rebuild agrees).
        """
        from engine.ops.aggregate.listener import agg_by

        return agg_by(self, aggs, by)

    def first_by(self, by: str | Sequence[str]) -> Table:
        """The first row of each group."""
        from engine.ops.aggregate.listener import first_by

        return first_by(self, by)

    def last_by(self, by: str | Sequence[str]) -> Table:
        """The last row of each group."""
        from engine.ops.aggregate.listener import last_by

        return last_by(self, by)

    def count_by(self, name: str, by: str | Sequence[str] = ()) -> Table:
        """Row count per group, in column ``name``."""
        from engine.ops.aggregate.listener import count_by

        return count_by(self, name, by)

    def merge(self, *others: Table) -> Table:
        """This table's rows followed by each of ``others`` (same schema)."""
        from engine.ops.merge import merge

        return merge(self, *others)

    def snapshot(self) -> Table:
        """A static copy of the current rows; it never updates."""
        from engine.ops.snapshot import snapshot

        return snapshot(self)

    def to_collection(self, dataflow: Dataflow | None = None,
                      columns: Sequence[str] | None = None) -> Collection:
        """Feed this table's changes into a dataflow as a collection of its rows.

        The collection starts with the current rows at ``(step,)`` and receives each
        cycle's changes as triples; ``collection.to_table(keys=...)`` brings a result back
        as a live table updated in the same cycle (:mod:`engine.differential.bridge`).
        """
        from engine.differential.bridge import to_collection

        return to_collection(self, dataflow, columns)

    def close(self) -> None:
        """Detach from the graph: no more updates (children stop updating too)."""
        self.closed = True
        self.graph._remove_node(self)


class DerivedTable(Table):
    """A table computed from parents by a :class:`Listener`."""

    listener: Listener

    def _compute_update(self) -> TableUpdate | None:
        return self.listener.on_update(*(p._update for p in self.parents))


@dataclass(slots=True)
class Derivation:
    """What an operation's plan hands to :func:`derive`: the child's first state and listener.

    ``rowset`` is in the child's key space as of the parents' current rows; the listener
    takes over from there, one cycle at a time.
    """

    schema: pa.Schema
    columns: dict[str, ColumnSource]
    rowset: RowSet
    listener: Listener
    name: str | None = None
    #: the child only ever adds rows at the end (see :attr:`Table.add_only`)
    add_only: bool = False
    #: the child never removes or modifies a row (see :attr:`Table.insert_only`)
    insert_only: bool = False


def derive(parents: Sequence[Table], plan: Callable[[], Derivation], *,
           table_class: type[DerivedTable] = DerivedTable) -> DerivedTable:
    """Build a derived table: the one way every operation makes its child.

    Under the graph's shared lock (no cycle runs meanwhile, so the parents' rows, the
    state ``plan`` builds from them and the child's first rows agree), checks that the
    parents share one update graph and are alive, runs ``plan``, builds the child, wires
    its listener (``listener.result`` is the child) and adds it to the graph.

    Parameters
    ----------
    parents
        The tables the child is computed from, in the order its listener's ``on_update``
        takes their updates.
    plan
        Builds the operation's state from the parents' current rows and returns the
        :class:`Derivation`. It runs under the shared lock, after the checks.
    table_class
        A :class:`DerivedTable` subclass, for results with their own end-of-cycle work.

    Raises
    ------
    SchemaError
        If the parents are on different update graphs.
    TableFailed
        If a parent has failed or been closed.
    """
    graph = parents[0].graph
    for i, p in enumerate(parents[1:], start=2):
        if p.graph is not graph:
            raise SchemaError(f"table {p.name!r} (argument {i}) is on another update graph "
                              f"than {parents[0].name!r}")
    with graph.shared_lock():
        for p in parents:
            p.check_alive()
            if p.closed:
                raise TableFailed(f"table {p.name!r} is closed; derive from a live table")
        d = plan()
        child = table_class(graph, d.schema, d.columns, d.rowset, parents=parents, name=d.name)
        child.add_only = d.add_only
        child._insert_only = d.insert_only
        d.listener.result = child
        child.listener = d.listener
    return child
