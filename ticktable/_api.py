"""What :mod:`ticktable` defines itself (re-exported there, loaded on first use): the update
graph with tables of other servers, and :func:`show`."""

from __future__ import annotations

import dataclasses as _dataclasses
from collections.abc import Sequence as _Sequence
from typing import Any as _Any

import pyarrow.compute as _pc

from clients.client import Client, connect
from clients.live import LiveTable
from clients.notebook import LiveGrid
from clients.notebook import widget_class as _widget_class
from engine import errors
from engine.graph import UpdateGraph as _EngineGraph
from engine.sources import ReplicaTable

__all__ = ["UpdateGraph", "show"]


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

        from flight.links.link import Link
        from flight.links.spec import MirrorSpec, encode_filter, origin_schema

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



def show(table: str | LiveTable, *, uri: str | _Sequence[str] | None = None,
         client: Client | None = None, token: str | None = None,
         columns: _Sequence[str] | None = None, filter: _pc.Expression | None = None,
         **viewer: _Any) -> LiveGrid:
    """Show a table as a live grid in Jupyter: Perspective's widget, ticking with every update.

    The value of a notebook cell displays as the grid; ``display(tt.show(...))`` shows it
    from inside a cell. Given a name, it subscribes (on ``client``, or a client of its own
    connected to ``uri``), and closing the grid ends that subscription; given a
    :class:`~clients.live.LiveTable`, it shows it and leaves it open. A LiveTable that is a
    cell's value displays the same way, with the viewer's defaults.

    Parameters
    ----------
    table
        A table's name, or a LiveTable.
    uri, token
        Where to connect, when ``table`` is a name and no ``client`` is given (as
        :func:`~clients.client.connect`; default ``grpc://127.0.0.1:8815``, what
        ``make run`` serves).
    client
        Subscribe with this client instead (it stays open).
    columns
        The columns shown, in order: for a name, the columns subscribed to.
    filter
        For a name: subscribe to the rows for which this ``pyarrow.compute`` expression is
        true (filtered on the server, see :meth:`~clients.client.Client.subscribe`).
    viewer
        Settings of Perspective's viewer: ``sort=[["px", "desc"]]``, ``group_by``,
        ``split_by``, ``aggregates``, ``plugin``, ``theme``, ``title``; its own filter is
        ``viewer_filter=[["px", ">", 50]]`` (``filter`` is the subscription's).

    Returns
    -------
    LiveGrid
        The grid; ``close()`` it to stop following.

    Raises
    ------
    ModuleNotFoundError
        If the widget's packages are missing (``pip install 'ticktable[notebook]'``).

    Examples
    --------
    >>> tt.show("trades", uri="grpc://127.0.0.1:8815", sort=[["px", "desc"]])  # doctest: +SKIP
    """
    if "viewer_filter" in viewer:
        viewer["filter"] = viewer.pop("viewer_filter")
    if isinstance(table, LiveTable):
        if filter is not None:
            raise TypeError("filter subscribes to the rows it selects: pass a table's name "
                            "(a LiveTable already holds its rows); Perspective's own filter "
                            "is viewer_filter=")
        if columns is not None:
            viewer["columns"] = list(columns)
        return LiveGrid(table, **viewer)
    _widget_class()  # before subscribing: say what to install first
    own = client is None
    cl = client if client is not None else connect(
        uri if uri is not None else "grpc://127.0.0.1:8815", token)
    live = None
    try:
        live = cl.subscribe(table, columns=columns, filter=filter)
        return LiveGrid(live, owned=True, client=cl if own else None, **viewer)
    except BaseException:
        if live is not None:
            live.close()
        if own:
            cl.close()
        raise
