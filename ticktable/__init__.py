"""Ticktable: live tables with precise deltas.

``import ticktable as tt`` gives the public API; the engine lives in ``engine`` and is
re-exported here so user code does not depend on the internal layout.
"""

from __future__ import annotations

import dataclasses as _dataclasses
from collections.abc import Sequence as _Sequence

import pyarrow.compute as _pc

from clients.client import Client as Client
from clients.client import connect as connect
from clients.live import LiveTable as LiveTable
from clients.live import Update as Update
from clients.livegroup import GroupUpdate as GroupUpdate
from clients.livegroup import LiveGroup as LiveGroup
from clients.notebook import LiveGrid as LiveGrid
from clients.notebook import show as show
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


class UpdateGraph(_EngineGraph):
    """The update graph (:class:`engine.graph.UpdateGraph`), plus tables of other servers."""

    def remote_table(self, uri: str, name: str, *, local: str | None = None,
                     token: str | None = None, columns: _Sequence[str] | None = None,
                     filter: _pc.Expression | bytes | None = None,
                     give_up_after: float | None = None, timeout: float = 30.0) -> ReplicaTable:
        """Mirror table ``name`` of the server at ``uri`` into this graph: a source table
        that changes exactly as the origin does (its updates one for one, under its row
        keys), kept by a link that resumes after a break (DESIGN.md §11, :mod:`flight.links`).
        Derive from it like any table; ``close()`` it to stop following.

        With a ``filter`` the table holds the origin's rows for which it is true, filtered
        on the origin (only they cross the network): a row that starts or stops matching
        there is an add or a remove here, under the origin's row keys and in its order.

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
        filter
            A boolean ``pyarrow.compute`` expression over the origin table's columns
            (``pc.field("px") > 50``), checked against its schema (read from the origin
            first) and sent as Substrait; or those Substrait bytes
            (:attr:`flight.links.MirrorSpec.filter`). Default: every row.
        give_up_after
            Seconds out of sync after which the link stops and the table fails (default:
            retry for ever).
        timeout
            Seconds to wait for the origin's first answer (its schema).

        Raises
        ------
        TimeoutError
            If the origin did not answer in time (nothing keeps trying then).
        ExpressionError
            If ``filter`` names a column the origin's table does not have, does not fit
            its types or is not boolean (checked before subscribing).
        InputError
            If the origin refused the subscription (filter bytes that do not fit its table,
            an unknown column): at once, with the origin's one-line reason.

        Examples
        --------
        >>> graph = tt.UpdateGraph()                                  # doctest: +SKIP
        >>> quotes = graph.remote_table("grpc://10.0.0.5:8815", "quotes")
        >>> big = graph.remote_table("grpc://10.0.0.5:8815", "quotes", local="big",
        ...                          filter=pc.field("px") > 50)
        >>> graph.start(0.1); quotes.where(...)
        """
        import time

        from flight.links.link import Link, MirrorSpec, encode_filter, origin_schema

        spec = MirrorSpec(uri if "://" in uri else f"grpc://{uri}", name, local or "",
                          token=token, columns=tuple(columns) if columns else None,
                          give_up_after=give_up_after,
                          filter=(filter or None) if isinstance(filter, bytes) else None)
        end = time.monotonic() + timeout
        if isinstance(filter, _pc.Expression):
            schema = origin_schema(spec, timeout)
            spec = _dataclasses.replace(spec, filter=encode_filter(filter, schema, name))
        elif filter is not None and not isinstance(filter, bytes):
            raise errors.ExpressionError(
                f"filter on table {name!r}: expected a pyarrow.compute.Expression or Substrait "
                f"bytes, got {type(filter).__name__}")
        link = Link(self, spec).start()
        try:
            return link.wait_table(max(0.0, end - time.monotonic()))
        except BaseException:
            link.close()
            raise


def __getattr__(name: str) -> object:
    # ``tt.spark`` imports pyspark, an optional extra: load it only when asked for
    if name == "spark":
        import importlib

        return importlib.import_module("ticktable.spark")
    raise AttributeError(f"module 'ticktable' has no attribute {name!r}")
