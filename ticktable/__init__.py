"""Ticktable: live tables with precise deltas.

``import ticktable as tt`` gives the public API; the engine lives in ``engine`` and is
re-exported here so user code does not depend on the internal layout.
"""

from __future__ import annotations

from collections.abc import Sequence as _Sequence

from clients.client import Client as Client
from clients.client import connect as connect
from clients.live import LiveTable as LiveTable
from clients.live import Update as Update
from clients.remote import RemoteTable as RemoteTable
from engine import errors as errors
from engine.graph import UpdateGraph as _EngineGraph
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

__all__ = [
    "AppendOnlyTable",
    "Client",
    "KeyedTable",
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
]

__version__ = "0.1.0"


class UpdateGraph(_EngineGraph):
    """The update graph (:class:`engine.graph.UpdateGraph`), plus tables of other servers."""

    def remote_table(self, uri: str, name: str, *, local: str | None = None,
                     token: str | None = None, columns: _Sequence[str] | None = None,
                     give_up_after: float | None = None, timeout: float = 30.0) -> ReplicaTable:
        """Mirror table ``name`` of the server at ``uri`` into this graph: a source table
        that changes exactly as the origin does (its updates one for one, under its row
        keys), kept by a link that resumes after a break (DESIGN.md §11, :mod:`flight.links`).
        Derive from it like any table; ``close()`` it to stop following.

        Parameters
        ----------
        uri
            The origin: ``grpc://host:port`` (or ``grpc+tls://``).
        name
            The origin's table.
        local
            This table's name (default: ``name``).
        token
            The origin's bearer token (its read-only token is enough).
        columns
            Mirror only these columns (default: all).
        give_up_after
            Seconds out of sync after which the link stops and the table fails (default:
            retry for ever).
        timeout
            Seconds to wait for the origin's first answer (its schema).

        Raises
        ------
        TimeoutError
            If the origin did not answer in time (nothing keeps trying then).

        Examples
        --------
        >>> graph = tt.UpdateGraph()                                  # doctest: +SKIP
        >>> quotes = graph.remote_table("grpc://10.0.0.5:8815", "quotes")
        >>> graph.start(0.1); quotes.where(...)
        """
        from flight.links.link import Link, MirrorSpec

        spec = MirrorSpec(uri if "://" in uri else f"grpc://{uri}", name, local or "",
                          token=token, columns=tuple(columns) if columns else None,
                          give_up_after=give_up_after)
        link = Link(self, spec).start()
        try:
            return link.wait_table(timeout)
        except TimeoutError:
            link.close()
            raise


def __getattr__(name: str) -> object:
    # ``tt.spark`` imports pyspark, an optional extra: load it only when asked for
    if name == "spark":
        import importlib

        return importlib.import_module("ticktable.spark")
    raise AttributeError(f"module 'ticktable' has no attribute {name!r}")
