"""A live table in Jupyter: Perspective's grid, ticking with every update (DESIGN.md §6, §9).

:class:`LiveGrid` shows a :class:`~clients.live.LiveTable` in a notebook as Perspective's
Jupyter widget (``perspective.widget.PerspectiveWidget``, an anywidget) over a Perspective
table indexed by row key, as the web UI's grids are (:mod:`flight.web.feed`): each
:class:`~clients.livestate.Update` becomes its :class:`~clients.livestate.KeyedChange` (rows
to upsert, row keys to remove; a shift moves rows to new keys), applied as one ``remove``
and one ``update`` of Arrow IPC, never a Python step per row. Perspective keeps an indexed
table in index order, and row keys are in table order, so the grid lists rows as the table
does. :func:`ticktable.show` (``tt.show``) opens one for a table by name; a ``LiveTable``
that is a cell's value displays as one (:meth:`LiveTable._repr_mimebundle_
<clients.live.LiveTable._repr_mimebundle_>`); anywhere else it is its plain ``repr``.
This module imports neither :mod:`clients.live` (which imports it to display a table) nor
:mod:`clients.client`: what a grid asks of its table is :class:`ShownTable`.

Nothing here imports Jupyter, ipywidgets, anywidget or Perspective's widget until a grid is
made: importing ``ticktable`` or :mod:`clients` never loads them.

Threads. A grid reads its LiveTable's updates on a thread of its own (an iterator started
with a snapshot of the view, atomically: ``live.updates(snapshot=True)``), so a slow
browser never holds up the LiveTable's reader; an iterator that falls behind gets a
catch-up snapshot, applied as a ``replace``. Perspective's engine takes updates from any
thread, and it answers the widget's views by sending comm messages, which ipykernel
routes through its IOPub thread from any thread (as ipywidgets does for a widget changed
from a thread); the kernel's own loop serves the browser's requests meanwhile. The thread
ends when the LiveTable closes or fails, or when the grid is closed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from flight.web.feed import conform, perspective_schema, to_ipc
from flight.wire import ROW_KEY

if TYPE_CHECKING:
    from clients.livestate import KeyedChange, Update
    from clients.queues import BlockingUpdates

__all__ = ["Closeable", "LiveGrid", "ShownTable", "in_notebook", "widget_class"]

log = logging.getLogger(__name__)

#: What to install for the grid (the ``notebook`` extra: anywidget, ipywidgets).
INSTALL = "pip install 'ticktable[notebook]'"


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython inside ipykernel), where a widget can
    show. Imports nothing: outside IPython it is False at once."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


#: The grid widget's module in the browser: it imports Perspective's widget module once per
#: page and renders every grid with it. anywidget imports a widget's module again for each
#: widget, and Perspective's (5.5.1) defines custom elements unguarded, so a second
#: Perspective widget on a page would fail ("the name "regular-layout" has already been
#: used"); loaded once, every grid also shares one Perspective engine in the page.
_ESM = """
const KEY = Symbol.for("ticktable.perspective-widget");
function perspective(model) {
  globalThis[KEY] ??= import(URL.createObjectURL(
    new Blob([model.get("_perspective_esm")], { type: "text/javascript" })));
  return globalThis[KEY];
}
export default {
  async render(context) {
    return (await perspective(context.model)).default.render(context);
  },
};
"""

_GRID_WIDGET: Any = None


def widget_class() -> Any:
    """Perspective's widget with :data:`_ESM` as its module (made once, on first use).

    Raises
    ------
    ModuleNotFoundError
        If the widget's packages are missing, saying what to install.
    """
    global _GRID_WIDGET
    if _GRID_WIDGET is None:
        try:
            import traitlets
            from perspective.widget import PerspectiveWidget
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"a live grid needs Perspective's Jupyter widget, whose "
                                      f"{exc.name} is not installed: {INSTALL}",
                                      name=exc.name) from exc

        class GridWidget(PerspectiveWidget):  # type: ignore[misc]
            """Perspective's widget, its module loaded once per page (see ``_ESM``)."""

            _esm = _ESM
            _perspective_esm = traitlets.Unicode(str(PerspectiveWidget._esm)).tag(sync=True)

        _GRID_WIDGET = GridWidget
    return _GRID_WIDGET


class ShownTable(Protocol):
    """What a grid asks of the table it shows: a :class:`~clients.live.LiveTable` is one."""

    table: str
    FIRST_SNAPSHOT_TIMEOUT: float

    def wait_for(self, *, timeout: float | None) -> bool: ...

    def updates(self, *, snapshot: bool) -> BlockingUpdates[Update]: ...

    def close(self, timeout: float) -> None: ...


class Closeable(Protocol):
    """What a grid asks of the client it owns (a :class:`~clients.client.Client`)."""

    def close(self) -> None: ...


class LiveGrid:
    """A :class:`~clients.live.LiveTable` shown as Perspective's grid: it ticks with every
    update the table receives.

    In Jupyter, a grid displays as the widget (the value of a cell, or ``display(grid)``);
    elsewhere its ``repr`` is text. The widget's own settings (sort, filter, group by,
    the plugin) are the viewer's, as in the web UI; the rows and their order are the
    table's. What a LiveTable holds is what the grid shows: its columns, and with a
    viewport, the rows held.

    Parameters
    ----------
    live
        The table to show. The grid waits (up to ``timeout``) for its first snapshot.
    owned
        Close ``live`` (and ``client``) when the grid is closed (what
        :func:`ticktable.show` does for a subscription it opened).
    client
        A client to close with the grid (with ``owned``).
    timeout
        Seconds to wait for the first snapshot (default:
        :attr:`LiveTable.FIRST_SNAPSHOT_TIMEOUT <clients.live.LiveTable.FIRST_SNAPSHOT_TIMEOUT>`).
    viewer
        Settings of Perspective's viewer: ``columns`` (shown, in order), ``sort``
        (``[["px", "desc"]]``), ``filter``, ``group_by``, ``split_by``, ``aggregates``,
        ``plugin``, ``theme``, ``title`` (default: the table's name)...

    Raises
    ------
    ModuleNotFoundError
        If the widget's packages are missing (``pip install 'ticktable[notebook]'``).
    TimeoutError
        If no snapshot arrived in time.
    Exception
        The LiveTable's :attr:`~clients.live.LiveTable.error`, if it failed before its
        first snapshot.

    Attributes
    ----------
    live
        The LiveTable shown.
    widget
        The ``perspective.widget.PerspectiveWidget``.
    table
        The Perspective table it views, indexed by :data:`~flight.wire.ROW_KEY`.
    """

    def __init__(self, live: ShownTable, *, owned: bool = False, client: Closeable | None = None,
                 timeout: float | None = None, **viewer: Any) -> None:
        grid_widget = widget_class()
        import perspective

        self.live = live
        self._owned, self._client = owned, client
        wait = live.FIRST_SNAPSHOT_TIMEOUT if timeout is None else timeout
        if not live.wait_for(timeout=wait):
            raise TimeoutError(f"no snapshot of {live.table!r} within {wait} s ({live!r})")
        # the view now, then every update; its close() ends the thread's loop
        self._updates = live.updates(snapshot=True)
        first = next(self._updates)  # at once: the view has had its snapshot
        change = first.by_row_key()
        self._schema = perspective_schema(change.rows.schema)
        self._server = perspective.Server()  # this grid's engine: gone with the grid
        self._perspective = self._server.new_local_client()
        self.table = self._perspective.table(
            to_ipc(conform(change.rows, change.keys, self._schema)), index=ROW_KEY)
        viewer.setdefault("columns", change.rows.schema.names)
        viewer.setdefault("title", live.table)
        viewer.setdefault("settings", False)  # the grid first; the viewer's panel a click away
        self.widget = grid_widget(self.table, **viewer)
        self._cond = threading.Condition()
        self._step, self._sequence = first.step, first.sequence
        self._applied = self._updates.delivered
        self._closed = False
        self._stopping = False  # close() was called
        self.error: BaseException | None = None
        """Why the grid stopped following its table, if it failed (``None`` otherwise)."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ticktable-grid-{live.table}")
        self._thread.start()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            for update in self._updates:
                self._apply(update.by_row_key())
                with self._cond:
                    self._step, self._sequence = update.step, update.sequence
                    self._applied = self._updates.delivered  # (only next() moves it)
                    self._cond.notify_all()
        except Exception as exc:  # the LiveTable failed (it says why), or Perspective did
            self.error = exc
            log.warning("the grid of %r stopped: %s", self.live.table, exc)
        finally:
            self._updates.close()  # nothing queues for a reader that is gone
            with self._cond:
                self._closed = True
                self._cond.notify_all()
                stopping = self._stopping
        if not stopping:  # the table closed or failed: the grid says it is not live any more
            why = "closed" if self.error is None else f"stopped: {self.error}"
            self.widget.title = f"{self.widget.title} ({why} at step {self._step})"

    def _apply(self, change: KeyedChange) -> None:
        if change.snapshot:
            schema = perspective_schema(change.rows.schema)
            data = to_ipc(conform(change.rows, change.keys, schema))
            if schema.equals(self._schema):
                self.table.replace(data)
            else:  # other columns (LiveTable.set_columns): a new table for the viewer (the
                # old one, which the browser's views may still hold, goes with the grid)
                self._schema = schema
                self.table = self._perspective.table(data, index=ROW_KEY)
                self.widget.load(self.table)
                self.widget.columns = change.rows.schema.names
            return
        if change.removes.size:  # previous key space: before the upserts take their keys
            self.table.remove(to_ipc(pa.table({ROW_KEY: pa.array(change.removes, pa.int64())})),
                              format="arrow")
        if change.keys.size:
            self.table.update(to_ipc(conform(change.rows, change.keys, self._schema)))

    # ------------------------------------------------------------------ state
    @property
    def step(self) -> int:
        """The server step of the last update the grid shows."""
        return self._step

    @property
    def sequence(self) -> int:
        """The table's sequence number as of the last update the grid shows."""
        return self._sequence

    @property
    def received(self) -> int:
        """How many updates the grid's table has handed it: every message the table applied
        since the grid started (a viewport or column change too)."""
        return self._updates.offered

    @property
    def applied(self) -> int:
        """How many of the updates :attr:`received` the grid shows (a catch-up snapshot
        shows all those before it)."""
        return self._applied

    @property
    def closed(self) -> bool:
        """Whether the grid stopped following its table (closed, or its table closed)."""
        return self._closed

    def wait_for(self, sequence: int | None = None, step: int | None = None,
                 timeout: float | None = 10.0, *, applied: int | None = None) -> bool:
        """Wait until the grid shows at least ``sequence`` and ``step`` (as
        :meth:`LiveTable.wait_for <clients.live.LiveTable.wait_for>`, for what the grid
        shows), and has :attr:`applied` at least ``applied`` updates. Returns False on
        timeout or once the grid stopped short of them.

        A viewport or column change is a new snapshot at the same step and sequence: to
        wait until the grid shows it, and everything else its table applied before the
        call, use ``grid.wait_for(applied=grid.received)``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not ((sequence is None or self._sequence >= sequence)
                       and (step is None or self._step >= step)
                       and (applied is None or self._applied >= applied)):
                left = None if deadline is None else deadline - time.monotonic()
                if self._closed or (left is not None and left <= 0):
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop following the table and close the widget (and, when the grid owns them,
        the LiveTable and its client); waits up to ``timeout`` for the grid's thread."""
        with self._cond:
            self._stopping = True
        self._updates.close()  # the thread's loop ends
        if self._owned:
            self.live.close(timeout)
            if self._client is not None:
                self._client.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.widget.close()

    def __enter__(self) -> LiveGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """The widget's bundle (Jupyter shows the live grid), with this grid's text repr."""
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        return {**data, "text/plain": repr(self)}, meta

    def __repr__(self) -> str:
        state = "closed" if self._closed else "live"
        return f"<LiveGrid {state} step={self._step} of {self.live!r}>"

