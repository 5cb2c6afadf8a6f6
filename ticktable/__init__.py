"""Ticktable: live tables with precise deltas.

``import ticktable as tt`` gives the public API; the engine lives in ``engine`` and is
re-exported here so user code does not depend on the internal layout.

Each name is imported on first use (PEP 562): ``ticktable health``, the container's health
check, runs in a fraction of the second that importing every client and the engine takes.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from clients.client import Client as Client
    from clients.client import connect as connect
    from clients.live import LiveTable as LiveTable
    from clients.live import Update as Update
    from clients.livegroup import GroupUpdate as GroupUpdate
    from clients.livegroup import LiveGroup as LiveGroup
    from clients.notebook import LiveGrid as LiveGrid
    from clients.remote import RemoteTable as RemoteTable
    from engine import errors as errors
    from engine.ops.aggregate import agg as agg
    from engine.rowset import RowSet as RowSet
    from engine.rowset import RowSetShiftData as RowSetShiftData
    from engine.sources import AppendOnlyTable as AppendOnlyTable
    from engine.sources import KeyedTable as KeyedTable
    from engine.sources import ReplicaTable as ReplicaTable
    from engine.sources import RingTable as RingTable
    from engine.sources import TimerTable as TimerTable
    from engine.table import Table as Table
    from engine.update import TableUpdate as TableUpdate
    from engine.update import compose as compose
    from ticktable import spark as spark
    from ticktable._api import UpdateGraph as UpdateGraph
    from ticktable._api import show as show

__all__ = [
    "AppendOnlyTable",
    "Client",
    "GroupUpdate",
    "KeyedTable",
    "LiveGrid",
    "LiveGroup",
    "LiveTable",
    "RemoteTable",
    "ReplicaTable",
    "RingTable",
    "RowSet",
    "RowSetShiftData",
    "Table",
    "TableUpdate",
    "TimerTable",
    "Update",
    "UpdateGraph",
    "agg",
    "compose",
    "connect",
    "errors",
    "show",
]

__version__ = "0.1.0"

#: where each name of ``__all__`` comes from: (module, attribute; None for the module)
_WHERE: dict[str, tuple[str, str | None]] = {
    "AppendOnlyTable": ("engine.sources", "AppendOnlyTable"),
    "Client": ("clients.client", "Client"),
    "GroupUpdate": ("clients.livegroup", "GroupUpdate"),
    "KeyedTable": ("engine.sources", "KeyedTable"),
    "LiveGrid": ("clients.notebook", "LiveGrid"),
    "LiveGroup": ("clients.livegroup", "LiveGroup"),
    "LiveTable": ("clients.live", "LiveTable"),
    "RemoteTable": ("clients.remote", "RemoteTable"),
    "ReplicaTable": ("engine.sources", "ReplicaTable"),
    "RingTable": ("engine.sources", "RingTable"),
    "RowSet": ("engine.rowset", "RowSet"),
    "RowSetShiftData": ("engine.rowset", "RowSetShiftData"),
    "Table": ("engine.table", "Table"),
    "TableUpdate": ("engine.update", "TableUpdate"),
    "TimerTable": ("engine.sources", "TimerTable"),
    "Update": ("clients.live", "Update"),
    "UpdateGraph": ("ticktable._api", "UpdateGraph"),
    "agg": ("engine.ops.aggregate", "agg"),
    "compose": ("engine.update", "compose"),
    "connect": ("clients.client", "connect"),
    "errors": ("engine.errors", None),
    "show": ("ticktable._api", "show"),
    # ``tt.spark`` imports pyspark, an optional extra (not in ``__all__``)
    "spark": ("ticktable.spark", None),
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ticktable' has no attribute {name!r}")
    module = _importlib.import_module(where[0])
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
