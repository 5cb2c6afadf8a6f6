"""Ticktable: live tables with precise deltas.

``import ticktable as tt`` gives the public API; the engine lives in ``engine`` and is
re-exported here so user code does not depend on the internal layout.
"""

from __future__ import annotations

from clients.client import Client as Client
from clients.client import connect as connect
from clients.live import LiveTable as LiveTable
from clients.live import Update as Update
from clients.remote import RemoteTable as RemoteTable
from engine import errors as errors
from engine.graph import UpdateGraph as UpdateGraph
from engine.ops.aggregate import agg as agg
from engine.rowset import RowSet as RowSet
from engine.rowset import RowSetShiftData as RowSetShiftData
from engine.sources import AppendOnlyTable as AppendOnlyTable
from engine.sources import KeyedTable as KeyedTable
from engine.sources import RingTable as RingTable
from engine.sources import TimerTable as TimerTable
from engine.table import Table as Table
from engine.update import TableUpdate as TableUpdate
from engine.update import compose as compose

__all__ = [
    "AppendOnlyTable",
    "Client",
    "KeyedTable",
    "LiveTable",
    "RemoteTable",
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
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ``tt.spark`` imports pyspark, an optional extra: load it only when asked for
    if name == "spark":
        import importlib

        return importlib.import_module("ticktable.spark")
    raise AttributeError(f"module 'ticktable' has no attribute {name!r}")
