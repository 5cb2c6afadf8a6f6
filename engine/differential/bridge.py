"""Bridges between live tables and dataflows (DESIGN.md §4).

:func:`to_collection` feeds a table into a dataflow: its current rows at version
``(graph.step,)``, then every cycle's update as triples at ``(step,)`` (a listener on the
table calls :func:`~engine.differential.translator.update_to_triples` while the cycle
runs, when previous values are readable).

:func:`collection_to_table` exposes a root collection as a live keyed table *in the same
update graph*: the table is derived from every table feeding the dataflow, so in a cycle
in which one of them changes it is visited after them; its listener closes version
``(step,)`` on the dataflow's inputs, runs the dataflow, and applies the output's triples
with :func:`~engine.differential.translator.apply_triples`, which turns them into the
table's update for this very cycle (a ``-1``/``+1`` pair on one key is a modify). So a
cycle that changes an edge table also updates a reachability table built from it.

The output must be a keyed collection: at every version at most one row per key, of
weight 1 (``distinct``, a reduce, or a join of such).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.differential.dataflow import Collection, Dataflow, InputHandle, Probe
from engine.differential.translator import apply_triples, snapshot_to_triples, update_to_triples
from engine.errors import InputError, TableFailed
from engine.sources import KeyedTable
from engine.table import DerivedTable

if TYPE_CHECKING:
    from engine.table import Table
    from engine.update import TableUpdate

__all__ = ["CollectionTable", "collection_to_table", "to_collection"]


class _Bridge:
    """One table feeding one dataflow input."""

    def __init__(self, table: Table, handle: InputHandle, columns: list[str]) -> None:
        self.table = table
        self.handle = handle
        self.columns = columns

    def on_update(self, update: TableUpdate, table: Table) -> None:
        batch = update_to_triples(table, update, time=(table.graph.step,), columns=self.columns)
        self.handle.send(batch)


def to_collection(table: Table, dataflow: Dataflow | None = None,
                  columns: Sequence[str] | None = None) -> Collection:
    """A collection fed by ``table``'s rows (one record per row, weight 1) as it changes.

    Parameters
    ----------
    table
        The live table.
    dataflow
        The dataflow to add the input to (a new one by default). Collections combined in
        one computation must share a dataflow, so pass the first one's
        ``collection.dataflow`` when bridging a second table.
    columns
        The record columns (all by default).

    Raises
    ------
    InputError
        If the dataflow already feeds a table of another graph, or already ran.
    """
    df = dataflow if dataflow is not None else Dataflow()
    if df._finalized:
        raise InputError("bridge every table into the dataflow before making its output table")
    graphs = {id(b.table.graph) for b in df.bridges}
    if graphs and id(table.graph) not in graphs:
        raise InputError(f"table {table.name!r} is in another update graph than the dataflow's tables")
    names = list(columns) if columns is not None else table.column_names
    schema = pa.schema([table.schema.field(n) for n in names])
    coll, handle = df.input(schema)
    with table.graph.shared_lock():
        step = table.graph.step
        handle.send(snapshot_to_triples(table, time=(step,), columns=names))
        bridge = _Bridge(table, handle, names)
        table.listen(bridge.on_update)
    handle.advance_to(step)
    df.bridges.append(bridge)
    return coll


class CollectionTable(KeyedTable, DerivedTable):
    """A keyed table kept equal to a dataflow's output collection.

    Written only by its listener (through :func:`apply_triples`); ``upsert`` and ``delete``
    from outside raise.
    """

    def __init__(self, collection: Collection, keys: list[str], name: str | None) -> None:
        df = collection.dataflow
        graph = df.bridges[0].table.graph
        self._writing = False
        KeyedTable.__init__(self, graph, collection.schema, keys, name=name)
        self.parents = tuple(b.table for b in df.bridges)
        self.dataflow = df
        self.probe: Probe = collection.probe()
        self.listener = _CollectionListener(self)

    def upsert(self, data: object) -> None:
        if not self._writing:
            raise InputError(f"table {self.name!r} is computed by a dataflow; it cannot be written")
        KeyedTable.upsert(self, data)

    def delete(self, keys: object) -> None:
        if not self._writing:
            raise InputError(f"table {self.name!r} is computed by a dataflow; it cannot be written")
        KeyedTable.delete(self, keys)

    def _run(self, step: int) -> TableUpdate | None:
        """Close version ``step`` on every input, run the dataflow, stage and apply."""
        for b in self.dataflow.bridges:
            b.handle.advance_to(step + 1)
        self.dataflow.step()
        out = self.probe.drain()
        if out.num_rows == 0:
            return None
        self._writing = True
        try:
            apply_triples(self, out)
        finally:
            self._writing = False
        return KeyedTable._compute_update(self)

    def _compute_update(self) -> TableUpdate | None:
        return self.listener.on_update(*(p.cycle_update for p in self.parents))


class _CollectionListener:
    def __init__(self, table: CollectionTable) -> None:
        self.table = table
        self.result: Table = table

    def on_update(self, *updates: TableUpdate | None) -> TableUpdate | None:
        return self.table._run(self.table.graph.step)


def collection_to_table(collection: Collection, keys: Sequence[str] | str,
                        name: str | None = None) -> CollectionTable:
    """``collection`` as a live keyed table, updated in the same cycle as its sources.

    Parameters
    ----------
    collection
        A root-scope collection of a dataflow fed by tables (:func:`to_collection`).
    keys
        The key columns: the collection holds at most one row per key at every version.
    name
        The table's name.

    Raises
    ------
    InputError
        If the dataflow has no table input, has other inputs, or already ran; or, in a
        later cycle, if the output is not keyed (the table then fails).
    """
    df = collection.dataflow
    if collection.scope.nested:
        raise InputError("to_table needs a collection outside any iterate")
    if not df.bridges:
        raise InputError("to_table needs a dataflow fed by tables (table.to_collection())")
    if len(df.inputs) != len(df.bridges):
        raise InputError("to_table needs every input of the dataflow to come from a table")
    if df._finalized:
        raise InputError("the dataflow already has an output table (make one per dataflow)")
    key_list = [keys] if isinstance(keys, str) else list(keys)
    graph = df.bridges[0].table.graph
    with graph.exclusive_lock():
        for b in df.bridges:  # a child of a failed or closed table would never update
            b.table.check_alive()
            if b.table.closed:
                raise TableFailed(f"table {b.table.name!r} is closed; derive from a live table")
        table = CollectionTable(collection, key_list, name)
        update = table._run(graph.step)
        if update is not None:  # the initial rows: no cycle runs, nothing to notify
            table.rowset = update.apply(table.rowset)
    return table
