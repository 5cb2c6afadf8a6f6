"""A live subscription: a table kept current in the background (DESIGN.md §5-6).

:class:`LiveTable` runs one reader thread per subscription. It opens a ``DoExchange``
stream, applies every message the server sends (:mod:`flight.streams.decoder` is the protocol's
definition) to a columnar, keyed client state, and hands each applied message to
callbacks and iterators as an :class:`Update`. When the stream breaks it reconnects with
backoff and resumes from the last applied message (the server answers with one composed
delta, or a new snapshot when it no longer holds the missed updates). The reader thread,
reconnecting and the consumers are :class:`~clients.subscription.Subscription`'s, shared
with :class:`~clients.livegroup.LiveGroup`; what is a table's own is here.

Cost follows the update, not the table: the state lives in :mod:`clients.livestate`
(keys in a Roaring bitmap, values in an append-only log of Arrow arrays, a vectorized
``key -> slot`` index).

A DataFrame is built only when asked for. The pandas one (:attr:`LiveTable.df`) is one
object kept current in place (:mod:`clients.liveframe`): a read applies the messages applied
since the last one, so it costs what changed, not the table. The polars one
(:attr:`LiveTable.pl`) and the Arrow table (:meth:`LiveTable.to_arrow`) are built once per
applied message, in O(rows held) (:class:`_View`); so are the parts of an :class:`Update`.

Iterators (``for update in live``; ``async for``) each have one bounded queue
(:mod:`clients.queues`). Past ``maxsize`` queued updates the queue is dropped and the next
item is a catch-up snapshot, so a slow iterator costs memory bounded by ``maxsize``, never
by the stream.

Threads. The reader thread applies a message under the state lock and bumps a version;
readers materialize under the same lock, so they never see half an update. The reader
only notes what a message changed for the pandas frame; the frame is changed by reads of
:attr:`LiveTable.df` alone, one at a time (the frame lock, taken before the state lock),
outside the state lock but for handing the notes over. Callbacks
run on the reader thread after the lock is released. The reader offers each update to
the consumers under the state lock (:meth:`UpdateQueue.offer` takes the consumer's
condition), and a catch-up resets a consumer under the state lock, then its condition; a
consumer never takes the state lock while it holds its condition, so the order is always
state lock, then consumer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from clients.frames import to_polars
from clients.liveframe import LiveFrame
from clients.livestate import LiveState, Update
from clients.queues import UpdateQueue
from clients.subscription import Connect, Subscription
from engine.errors import ProtocolError
from flight.pb import flight_pb2 as pb
from flight.streams.decoder import Message, read_message

if TYPE_CHECKING:
    import polars as pl

__all__ = ["LiveTable", "Update"]

log = logging.getLogger(__name__)

Ranges = list[tuple[int, int]]
I64 = npt.NDArray[np.int64]
_NO_KEYS: I64 = np.empty(0, dtype=np.int64)


def _check_viewport(ranges: Sequence[tuple[int, int]] | None) -> Ranges | None:
    """``ranges`` as a list of ``(begin, end)`` int pairs (``None``: no viewport).

    Raises
    ------
    ProtocolError
        If a range is not ``0 <= begin <= end``.
    """
    if ranges is None:
        return None
    out = [(int(b), int(e)) for b, e in ranges]
    bad = [r for r in out if not 0 <= r[0] <= r[1]]
    if bad:
        raise ProtocolError(f"bad viewport range(s) {bad}: each is (begin, end) with "
                            f"0 <= begin <= end, end exclusive")
    return out


# ------------------------------------------------------------------ the live table
class LiveTable(Subscription[Update]):
    """A server table kept current in the background: a DataFrame plus a stream of updates.

    The DataFrame is pandas (:attr:`df`: one object, brought current in place when read)
    or polars (:attr:`pl`), or the rows are an Arrow table (:meth:`to_arrow`); each is
    built when first asked for after an update.

    A reader thread subscribes (``DoExchange``), applies every message the server sends
    and reconnects with backoff when the stream breaks, resuming where it left off (the
    server sends the missed updates composed into one, or a new snapshot). It stops for
    good only on :meth:`close` or a permanent error (table dropped, access denied, bad
    request), which is then :attr:`error`. Applying an update costs work proportional to
    the update, not the table; a DataFrame is built only when asked for.

    Each applied message is an :class:`Update`, handed to callbacks (:meth:`on_update`) and
    to every iterator (``for update in live``, ``async for update in live``,
    :meth:`updates`). An iterator receives every update from the moment it started, in a
    bounded queue; one that falls more than ``maxsize`` behind gets a catch-up snapshot
    instead of the updates it missed (see :meth:`updates`).

    Parameters
    ----------
    connect
        Returns a new ``FlightClient`` and the call options (auth headers) for one stream;
        called again on every reconnect (the previous client is closed). A
        :class:`~clients.failover.Rotation` of several servers' endpoints is advanced
        when a stream fails before its first message, so the subscription fails over to
        the next server in turn when its own does not answer (and stays on its server
        after a break it recovers from); :attr:`uri` says where it is.
    table
        The table's name.
    columns
        Subscribe to these columns only (``None``: all). The view keeps the table's order.
    filter
        Hold only the rows for which this predicate is true: one boolean Substrait
        ExtendedExpression (``flight.substrait.encode({"filter": expr}, schema)``;
        :meth:`Client.subscribe <clients.client.Client.subscribe>` encodes a
        ``pyarrow.compute`` expression), sent with every subscribe, resumes included
        (``None``: every row).
    viewport
        Hold values only for rows at these position ranges ``[begin, end)``: a scrolling
        window over a large (e.g. sorted) table. Row keys are tracked for the whole table.
    on_update
        A callback for every applied message (see :meth:`on_update`).
    min_update_interval_ms
        The server coalesces updates to at most one message per interval.
    max_batch_rows
        Rows per record batch (0: the server's default).
    reconnect
        Reconnect after a broken stream; if false, the first failure is :attr:`error`.
    reconnect_delay, max_reconnect_delay
        Backoff: the first wait, doubled after each failed attempt up to the maximum.
    start
        Start the reader thread now (else call :meth:`start`).

    Examples
    --------
    >>> live = LiveTable(connect, "trades", columns=["sym", "px"])  # doctest: +SKIP
    >>> live.wait_for()                      # the first snapshot  # doctest: +SKIP
    True
    >>> for update in live:                  # every update from now on  # doctest: +SKIP
    ...     print(update.added)
    """

    FIRST_SNAPSHOT_TIMEOUT = 60.0
    """How long :attr:`df`, :attr:`pl` and :meth:`to_arrow` wait for the first snapshot."""

    def __init__(self, connect: Connect, table: str, *, columns: Sequence[str] | None = None,
                 filter: bytes | None = None, viewport: Sequence[tuple[int, int]] | None = None,
                 on_update: Callable[[Update], None] | None = None,
                 min_update_interval_ms: int = 0, max_batch_rows: int = 0,
                 reconnect: bool = True, reconnect_delay: float = 0.2,
                 max_reconnect_delay: float = 5.0, start: bool = True) -> None:
        super().__init__(connect, table, table, thread_name=f"ticktable-live-{table}",
                         lock=threading.Lock(),  # the state, the cache, the consumers
                         on_update=on_update, reconnect=reconnect,
                         reconnect_delay=reconnect_delay, max_reconnect_delay=max_reconnect_delay)
        self.table = table
        self._want_columns = list(columns) if columns is not None else None
        self._filter = bytes(filter) if filter else b""  # the same in every subscribe
        self._want_viewport = _check_viewport(viewport)
        self._interval = int(min_update_interval_ms)
        self._batch_rows = int(max_batch_rows)
        self._close_callbacks: list[Callable[[], None]] = []
        self._state: LiveState | None = None
        self._version = 0
        self._cache: _View | None = None
        self._frames = LiveFrame()  # the pandas frame: changed by reads of df alone
        self._df_lock = threading.Lock()  # one df read at a time; taken before _lock
        self._send_lock = threading.Lock()  # wanted columns/viewport, the writer, writes
        self._writer: Any = None
        self._grid: Any = None  # a clients.notebook.LiveGrid, once displayed in Jupyter
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def close(self, timeout: float = 10.0) -> None:
        """End the subscription and wait (up to ``timeout``) for the reader thread.

        Then run the :meth:`on_close` callbacks, once: a second ``close`` runs none.
        """
        super().close(timeout)
        with self._lock:
            callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("an on_close callback of %r failed", self.table)

    def on_close(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once, when :meth:`close` is first called (usable as a decorator).

        It runs on the closing thread after the stream ended (the reader thread has
        stopped, unless it outlived ``close``'s timeout); not when the subscription fails
        on its own, which still needs a ``close``. An exception is logged and does not stop
        the other callbacks. Registered after ``close``, it is never called.
        """
        with self._lock:
            if not self._closing.is_set():
                self._close_callbacks.append(callback)
        return callback

    # ------------------------------------------------------------------ the view
    @property
    def df(self) -> pd.DataFrame:
        """The held rows in table order as a pandas DataFrame: one object, brought current in
        place each time it is read.

        Every read returns the same DataFrame (``live.df is live.df``). A read first applies
        what the messages applied since the last read changed, in place and by position:
        modified rows written, removed and added rows taken out and put in (see
        :mod:`clients.liveframe`), so it costs what changed, not the table. It is built
        again from the Arrow rows instead (and its contents swapped into the same object)
        after a snapshot, when a large share of the rows changed, or with a viewport.
        Between reads it does not change: the reader thread never touches it.

        It equals ``to_arrow().to_pandas()`` (values, dtypes, columns) as of the last
        message applied when the read began, never part of one: in a callback, the
        callback's update (so :attr:`step` read there is its step). The index is each row's
        position in the table: a ``RangeIndex`` without a viewport, else the held positions
        (named ``position``).

        String columns follow pandas' ``mode.string_storage`` option as it is when the frame
        is built (the first read, and each rebuild): ``"pyarrow"`` (pandas' default) keeps
        them as Arrow, which cannot be written in place, so a modify of a string column
        may copy that column; ``"python"`` (``pd.set_option(
        "mode.string_storage", "python")`` before the first read) holds Python strings,
        written in place, so such a modify costs only its rows (a build converts each
        string into a Python object, slower and larger than Arrow's).

        To keep a moment, take ``live.df.copy()`` or :meth:`to_arrow`: the frame you hold
        changes at the next read, on whatever thread it happens. What you derive from it (a
        column, a slice, a shallow copy) keeps its values, as pandas' Copy-on-Write promises
        (a column another object shares is copied before it is written); a NumPy array from
        ``to_numpy()`` views the frame and follows it, as with any frame pandas writes in
        place. Treat the frame as read-only: a change of yours may be overwritten, or make
        the next read rebuild it.

        Before the first snapshot this waits for it (up to
        :attr:`FIRST_SNAPSHOT_TIMEOUT` seconds).

        Raises
        ------
        TimeoutError
            If no snapshot arrived in time.
        Exception
            :attr:`error`, if the subscription failed before its first snapshot.

        Examples
        --------
        >>> df = live.df                   # the frame, current now      # doctest: +SKIP
        >>> live.df is df                  # later reads bring it current  # doctest: +SKIP
        True
        >>> before = live.df.copy()        # a moment kept apart           # doctest: +SKIP
        """
        self._wait_first()
        with self._df_lock:
            with self._lock:
                changes = self._frames.pending()
            if changes is not None:
                try:
                    if self._frames.catch_up(changes, self._held_columns):
                        frame = self._frames.frame
                        assert frame is not None
                        return frame
                except Exception:  # a bug: the rebuild below replaces the half-changed frame
                    log.exception("could not bring %r's DataFrame current in place; rebuilding",
                                  self.table)
            with self._lock:
                view = self._current_view()
                self._frames.rebuilding()
            # pandas outside the state lock: the Arrow table is immutable
            return self._frames.install(view.table.to_pandas(), view.keys, view.table.schema,
                                        view.positions)

    def _held_columns(self, columns: list[str]) -> pa.Table | None:
        """These columns of the held rows, if no message was applied since the frame's read
        began (else ``None``)."""
        with self._lock:
            st = self._state
            if st is None or not st.messages or self._frames.moved_on():
                return None
            return st.to_arrow(columns)

    @property
    def pl(self) -> pl.DataFrame:
        """The held rows in table order as a polars DataFrame (built once per applied message).

        The same rows as :attr:`df`, as a new frame after each applied message (not kept in
        place): consistent as of :attr:`step`, waiting for the first snapshot, cached and
        shared until the next message (treat it as read-only), built only when asked for
        (``polars.from_arrow`` of :meth:`to_arrow`). Polars has no index: with a viewport the
        rows held are listed without their positions (they are :attr:`df`'s index).

        Raises
        ------
        ModuleNotFoundError
            If polars is not installed (``pip install 'ticktable[polars]'``).
        TimeoutError
            If no snapshot arrived in time.
        Exception
            :attr:`error`, if the subscription failed before its first snapshot.

        Examples
        --------
        >>> live = client.subscribe("trades")                       # doctest: +SKIP
        >>> live.pl.group_by("sym").agg(pl.col("qty").sum())       # doctest: +SKIP
        """
        view = self._view()
        if view.polars is None:  # polars outside the lock: the table is immutable
            view.polars = to_polars(view.table)
        return view.polars

    def to_arrow(self) -> pa.Table:
        """The held rows in table order as a pyarrow Table, built once per applied message
        (immutable: it keeps its moment; see :attr:`df`)."""
        self._wait_first()
        with self._lock:
            return self._current_view().table

    def _view(self) -> _View:
        self._wait_first()
        with self._lock:
            return self._current_view()

    def _wait_first(self) -> None:
        """Wait for the first snapshot (see :attr:`df`)."""
        if not self._get(lambda s: True, False) and not self.wait_for(
                timeout=self.FIRST_SNAPSHOT_TIMEOUT) and not self._done.is_set():
            raise TimeoutError(f"no snapshot of {self.table!r} within "
                               f"{self.FIRST_SNAPSHOT_TIMEOUT} s ({self!r})")

    def _current_view(self) -> _View:
        """Under the state lock: the view of the last applied message."""
        if self._cache is None or self._cache.version != self._version:
            st = self._state
            if st is None or not st.messages:  # closed before any snapshot
                self._cache = _View(self._version, pa.table({}), _NO_KEYS, None)
            else:
                keys, table = st.held_rows()
                self._cache = _View(self._version, table, keys, st.held_positions())
        return self._cache

    def _get(self, fn: Callable[[LiveState], Any], default: Any) -> Any:
        with self._lock:
            st = self._state
            return default if st is None or not st.messages else fn(st)

    @property
    def step(self) -> int:
        """The server's graph step as of the last applied message (0 before any)."""
        return int(self._get(lambda s: s.step, 0))

    @property
    def sequence(self) -> int:
        """The table's update sequence number as of the last applied message."""
        return int(self._get(lambda s: s.sequence, 0))

    @property
    def link(self) -> dict[str, Any] | None:
        """For a mirrored table (a table of another server followed by this one,
        docs/protocol.md §14): its link's status as of the last message (``in_sync``,
        ``state``, ``origin``, ``detail``, reconnect and resume counts,
        ``out_of_sync_seconds``); ``None`` for other tables. A mirror that goes out of sync
        or back sends a message of no rows carrying it, so it is current."""
        link: dict[str, Any] | None = self._get(lambda s: s.link, None)
        return link

    @property
    def in_sync(self) -> bool:
        """False while the table is a mirror whose link is not in sync (its rows are the
        last it received); True otherwise."""
        link = self.link
        return True if link is None else bool(link["in_sync"])

    @property
    def size(self) -> int:
        """The table's row count, rows outside the viewport included."""
        return int(self._get(lambda s: s.size, 0))

    @property
    def columns(self) -> list[str]:
        """The columns held (as applied; empty before the first snapshot)."""
        return list(self._get(lambda s: s.columns, []))

    @property
    def viewport(self) -> Ranges | None:
        """The viewport as applied (``None``: every row is held)."""
        vp = self._get(lambda s: s.viewport, None)
        return None if vp is None else list(vp)

    def __repr__(self) -> str:
        vp = "" if self.viewport is None else f" viewport={self.viewport}"
        cols = self.columns
        shown = ", ".join(cols[:8]) + (f", ... ({len(cols)})" if len(cols) > 8 else "")
        return (f"<LiveTable {self.table!r} {self._status()} size={self.size} step={self.step} "
                f"sequence={self.sequence}{vp} columns=[{shown}]>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """In a Jupyter kernel: a live grid of this table (:class:`clients.notebook.LiveGrid`,
        one per LiveTable, however often it is displayed). Elsewhere ``None``: IPython
        then shows :func:`repr`, and nothing Jupyter-related is imported."""
        from clients import notebook

        if not notebook.in_notebook() or (self._grid is None and self._done.is_set()):
            return None  # (closed before it was shown: its text says so)
        try:
            if self._grid is None or (self._grid.closed and not self._done.is_set()):
                self._grid = notebook.LiveGrid(self)  # (a closed table keeps its last grid)
        except ModuleNotFoundError as exc:  # no widget: the text, and how to get the grid
            return {"text/plain": f"{self!r}\n({exc})"}
        data, meta = self._grid._repr_mimebundle_(include, exclude)
        return {**data, "text/plain": repr(self)}, meta

    # ------------------------------------------------------------------ waiting
    def wait_for(self, sequence: int | None = None, step: int | None = None,
                 timeout: float | None = 10.0) -> bool:
        """Wait until the view has applied at least ``sequence`` and ``step``.

        With neither, wait for the first snapshot. A table that does not change sends
        nothing, so a later graph step may never arrive: prefer ``sequence`` (the table's
        own update counter, e.g. the server publisher's).

        Returns
        -------
        bool
            False on timeout or when the subscription was closed.

        Raises
        ------
        Exception
            :attr:`error`, if the subscription failed for good.
        """
        def ready() -> bool:
            st = self._state
            return (st is not None and st.messages > 0
                    and (sequence is None or st.sequence >= sequence)
                    and (step is None or st.step >= step))

        return self._wait(ready, timeout)

    # ------------------------------------------------------------------ updates
    def _catch_up(self, consumer: UpdateQueue[Update]) -> Update | None:
        with self._lock:
            skipped = consumer.take_catch_up()
            st = self._state
            if st is None or not st.messages:
                return None  # nothing to show yet: the first snapshot will follow
            return st.catch_up(skipped)

    # ------------------------------------------------------------------ changes
    def set_viewport(self, ranges: Sequence[tuple[int, int]] | None,
                     timeout: float | None = 10.0) -> bool:
        """Hold only the rows at these position ranges ``[begin, end)`` (``None``: all).

        Sent on the open stream (or with the next subscribe). Waits up to ``timeout``
        seconds (0: not at all) for the server's message that applies it.

        Returns
        -------
        bool
            Whether :attr:`viewport` shows the new ranges on return.
        """
        vp = _check_viewport(ranges)
        change = pb.SubscriptionChange(set_viewport=True, has_viewport=vp is not None)
        change.viewport.extend(pb.PositionRange(begin=b, end=e) for b, e in vp or [])
        with self._send_lock:
            self._want_viewport = vp
            self._send(change)
        return self._wait_applied(lambda st: st.viewport == vp, timeout)

    def set_columns(self, columns: Sequence[str] | None, timeout: float | None = 10.0) -> bool:
        """Subscribe to these columns (``None``: all); the server sends a new snapshot.

        Returns
        -------
        bool
            Whether :attr:`columns` shows the new columns on return (see :meth:`set_viewport`).
        """
        want = list(columns) if columns is not None else None
        change = pb.SubscriptionChange(set_columns=True, columns=want or [])
        with self._send_lock:
            self._want_columns = want
            self._send(change)
        return self._wait_applied(lambda st: self._columns_match(st, want), timeout)

    def _send(self, change: pb.SubscriptionChange) -> None:
        if self._writer is None:
            return  # the next subscribe carries it
        body = pb.ClientMessage(change=change).SerializeToString()
        try:
            self._writer.write_metadata(pa.py_buffer(body))
        except Exception:  # the stream is breaking: the reconnect subscribes with it
            log.debug("could not send a change to %r", self.table, exc_info=True)

    def _wait_applied(self, done: Callable[[LiveState], bool], timeout: float | None) -> bool:
        def ready() -> bool:
            st = self._state
            return st is not None and st.messages > 0 and done(st)

        return self._wait(ready, timeout, raise_error=False)

    @staticmethod
    def _columns_match(st: LiveState, want: list[str] | None) -> bool:
        if want is None:
            return st.columns == list(st.table_schema.names)
        return set(st.columns) == set(want)

    # ------------------------------------------------------------------ the stream
    def _subscribe(self, writer: Any, reader: Any) -> Callable[[], Message]:
        with self._send_lock:  # a change is sent after the subscribe, or carried in it
            writer.begin(pa.schema([]))
            request = self.subscription_request()
            writer.write_metadata(pa.py_buffer(
                pb.ClientMessage(subscribe=request).SerializeToString()))
            self._writer = writer
        schema = reader.schema
        return lambda: read_message(reader, schema)

    def _receive(self, msg: Message) -> None:
        update = self.apply(msg.meta, msg.added, msg.modified)
        if not self._connected:
            self._connected = True
            log.info("subscribed to %r (%s)", self.table, update.resumed)

    def _stream_closed(self) -> None:
        with self._send_lock:
            self._writer = None

    def set_connected(self, connected: bool) -> None:
        """Say whether the stream of a table whose reader is not its own (a
        :class:`~clients.livegroup.LiveGroup`'s) is open and delivering: :attr:`connected`."""
        self._connected = connected

    def end(self, error: BaseException | None) -> None:
        """Stop a table whose reader is not its own (a
        :class:`~clients.livegroup.LiveGroup`'s): ``error`` becomes :attr:`error` (``None``:
        closed), waiting readers and iterators wake."""
        self._error = error
        self._closing.set()
        self._finish()

    def subscription_request(self) -> pb.SubscriptionRequest:
        """The subscribe message: what is wanted now, and where to resume from (also a
        :class:`~clients.livegroup.LiveGroup`'s, per table)."""
        req = pb.SubscriptionRequest(table=self.table, columns=self._want_columns or [],
                                     min_update_interval_ms=self._interval,
                                     max_batch_rows=self._batch_rows, filter=self._filter)
        if self._want_viewport is not None:
            req.has_viewport = True
            req.viewport.extend(pb.PositionRange(begin=b, end=e) for b, e in self._want_viewport)
        with self._lock:
            st = self._state
            # A resume sends only what changed, so it needs the same columns, and (without a
            # viewport now) every row held before: the server resends a viewport in full.
            if (st is not None and st.messages and st.epoch
                    and self._columns_match(st, self._want_columns)
                    and (self._want_viewport is not None or st.viewport is None)):
                req.resume, req.resume_epoch, req.resume_sequence = True, st.epoch, st.sequence
        return req

    def apply(self, meta: pb.UpdateMetadata, added: pa.Table, modified: pa.Table) -> Update:
        """Apply one message of this table's stream, then tell the iterators and callbacks.

        Called by the reader: this table's thread, or for a table of a
        :class:`~clients.livegroup.LiveGroup` (never started on its own) the group's.

        Raises
        ------
        ProtocolError
            If the message does not fit the state (which then starts over).
        """
        with self._lock:
            if self._state is None:
                self._state = LiveState(added.schema)
            try:
                update = self._state.apply(meta, added, modified)
            except BaseException:  # maybe half-applied: start over from a new snapshot
                self._state = LiveState(self._state.table_schema)
                self._version += 1
                self._frames.reset()
                raise
            self._version += 1
            self._frames.note(update.in_order(), self._state.size)
            self._offer(update)
        self._call_back(update)
        return update


# ------------------------------------------------------------------ the view
class _View:
    """The held rows of one applied message as Arrow, their row keys and (with a viewport)
    positions; the polars frame is built on demand."""

    __slots__ = ("version", "table", "keys", "positions", "polars")

    def __init__(self, version: int, table: pa.Table, keys: I64,
                 positions: I64 | None) -> None:
        self.version, self.table, self.keys, self.positions = version, table, keys, positions
        self.polars: pl.DataFrame | None = None

