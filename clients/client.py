"""The Python client: ``tt.connect(uri)`` and what a connection can do.

A :class:`Client` wraps one Arrow Flight connection per server (and, lazily, a gRPC channel
to the server's TableService, on the same port, for :meth:`Client.table` compositions).
Given several URIs (an origin and its mirrors, holding the same tables) it sends each call
to the server that answers and spreads subscriptions over them (see :class:`Client`;
:mod:`clients.failover` is how). Every call carries the bearer token; errors are the
server's, raised as pyarrow raises them: ``KeyError`` for an unknown table,
``pyarrow.ArrowInvalid`` for input the server refused (the message names the table or
column and the way out), plain ``pyarrow.ArrowException`` for a name already taken,
``pyarrow.flight.FlightUnauthenticatedError`` for a missing or wrong token,
``pyarrow.flight.FlightUnavailableError`` when the server cannot be reached. An expression
that does not fit a table's schema is refused before anything is sent, with
``ticktable.errors.ExpressionError``.

Frames are pandas by default; polars, an optional extra (``pip install
'ticktable[polars]'``), wherever a frame goes in or comes out: ``as_="polars"``,
``push(polars_frame)`` (:mod:`clients.frames`).

>>> import ticktable as tt
>>> client = tt.connect("grpc://127.0.0.1:8815")          # doctest: +SKIP
>>> client.push("trades", df, mode="upsert", keys=["id"])  # doctest: +SKIP
>>> live = client.subscribe("trades")                      # doctest: +SKIP
>>> live.df                                                # doctest: +SKIP
>>> client.sql("SELECT sym, sum(qty) FROM trades GROUP BY sym")  # doctest: +SKIP
>>> mirrored = tt.connect("grpc://origin:8815,grpc://mirror:8815")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
from google.protobuf import any_pb2
from google.protobuf.message import Message

from clients.failover import Attempt, Servers, split_uris
from clients.frames import (
    FrameKind,
    from_polars,
    is_polars,
    polars_schema,
    require_polars,
    to_polars,
)
from clients.wire import Endpoint, PutSummary, action, chunks, put_batches
from engine.errors import ProtocolError, SqlError
from flight.pb import flight_pb2 as pb
from flight.pb import flight_sql_pb2 as fsql
from flight.wire import (
    ABORT,
    COMMIT,
    CREATE_TABLE,
    DELETE,
    DROP_TABLE,
    PUT_MODES,
    SOURCE_KINDS,
    STATS,
    PutMode,
    TableKind,
)

if TYPE_CHECKING:
    import polars as pl

    from clients.live import LiveTable
    from clients.livegroup import GroupUpdate, LiveGroup
    from clients.remote import RemoteTable

__all__ = ["Client", "PutSummary", "connect"]

PutData: TypeAlias = ("pd.DataFrame | pl.DataFrame | pl.LazyFrame | pa.Table | pa.RecordBatch"
                     " | pa.RecordBatchReader"
                     " | Iterable[pd.DataFrame | pl.DataFrame | pl.LazyFrame | pa.Table"
                     " | pa.RecordBatch]")
SchemaLike: TypeAlias = "pa.Schema | pd.DataFrame | pl.DataFrame | pl.LazyFrame | pa.Table"
log = logging.getLogger(__name__)


def connect(uri: str | Sequence[str] = "grpc://127.0.0.1:8815", token: str | None = None,
            tls: bool | bytes | str = False, *, verify: bool = True,
            timeout: float | None = 60.0) -> Client:
    """Connect to a Ticktable server, or to several that hold the same tables.

    Parameters
    ----------
    uri
        ``grpc://host:port``, ``grpc+tls://host:port`` or ``host[:port]`` (port 8815). Or
        several: a list or tuple of them, or one string of them separated by commas
        (``"grpc://a:8815,grpc://b:8815"``): an origin and its mirrors, assumed to hold the
        same tables. How calls and subscriptions use them: :class:`Client`.
    token
        Bearer token (default: the ``TICKTABLE_TOKEN`` environment variable, if set).
        The same for every URI, as are ``tls``, ``verify`` and ``timeout``.
    tls
        ``True`` for TLS with the system's roots, or the root certificate(s): PEM ``bytes``
        or the path of a PEM file.
    verify
        ``False`` skips server certificate verification (self-signed test setups only).
    timeout
        Seconds for each unary call (listings, actions); streams have no limit.

    Returns
    -------
    Client
        A connected client; the servers are contacted on the first call.

    Raises
    ------
    ValueError
        If ``uri`` holds no URI, or an empty one (``"a:1,,b:2"``).
    TypeError
        If a URI is not a string.
    ProtocolError
        If a URI's scheme is not one Ticktable speaks.

    Examples
    --------
    >>> with tt.connect("grpc://127.0.0.1:8815") as client:   # doctest: +SKIP
    ...     print(client.tables())
    ['board', 'quotes', 'stats']

    An origin and its mirror; subscriptions alternate between them:

    >>> client = tt.connect(["grpc://origin:8815", "mirror"])  # doctest: +SKIP
    >>> client.uris                                            # doctest: +SKIP
    ('grpc://origin:8815', 'grpc://mirror:8815')
    """
    uris = split_uris(uri)
    endpoints = [Endpoint(u, token=token, tls=tls, verify=verify, timeout=timeout)
                 for u in uris]
    return Client(endpoints[0] if len(endpoints) == 1 else endpoints)


class Client:
    """A connection to a Ticktable server, or to several holding the same tables.

    Made by :func:`connect`. Thread-safe: calls may come from several threads;
    subscriptions use connections of their own so a slow stream never delays a call.

    **Several URIs.** The servers are taken to hold the same tables (an origin and its
    mirrors); the client does not keep them in step: each write goes to one of them.

    * A call (:meth:`tables`, :meth:`schema`, :meth:`stats`, :meth:`snapshot`,
      :meth:`create_table`, :meth:`drop_table`, :meth:`push`, :meth:`sql`) runs whole on
      one server: the one that answered last (at first, the first URI). When it fails with
      UNAVAILABLE it is tried once on each other server, in the order given, if the rule
      below allows; the client then stays on the server that answered (no fail-back).
    * The rule, by what the failed call may have done. A read (:meth:`tables`,
      :meth:`schema`, :meth:`stats`, :meth:`snapshot`, :meth:`sql` of a query) is retried
      after any UNAVAILABLE. A write (:meth:`create_table`, :meth:`drop_table`, :meth:`sql`
      of an ``INSERT``, ``UPDATE``, ``DELETE``, ``CREATE`` or ``DROP`` or anything else that is
      not a query) is retried only when gRPC never sent it: "failed to connect to all
      addresses" (refused, reset before HTTP/2 was up) or a name that did not resolve. A
      write that failed once sent (the connection broke, the server was shutting down) is
      raised as it is, whether or not the server applied it: retrying could apply it
      twice. A :meth:`push` is a read of the table's schema, then its rows, staged under
      a new write id and invisible until the commit, then the commit, a write: a failure
      while sending the rows is retried (with a new write id; the rows staged on the first
      server are aborted, or expire there) when ``data`` can be read again (a DataFrame, an Arrow table or record
      batch, or a list or tuple of these), and raised once a one-shot iterable or reader
      started going out. With ``atomic=False`` the rows are applied as they arrive:
      sending them is a write.
    * When no server answers, the error is one ``pyarrow.flight.FlightUnavailableError``
      naming the call and every URI tried, with why each failed. A failed attempt before
      one that answered is logged as a warning. A timeout is not retried: a host that
      drops packets rather than refusing holds a call until gRPC gives up connecting (an
      UNAVAILABLE, retried) or the call's ``timeout`` passes (raised).
    * Subscriptions are spread over the servers: this client's i-th :meth:`subscribe`
      starts on URI i mod n. Its :class:`~clients.live.LiveTable` reconnects to its own
      server after a broken stream (resuming by deltas), and to the next one in turn when
      that one does not answer; there it resumes from a snapshot (another server's table
      is another epoch) and so ends equal to that server's table. ``live.uri`` says where
      it is. A subscription to a temporary view (:meth:`subscribe_sql`) or to a
      composition (:meth:`table`) stays on the server that made it.
    * With one URI none of this applies: every call goes to it and its errors are raised
      as pyarrow raised them.

    Parameters
    ----------
    endpoint
        The server, or several (a sequence, in the order calls try them).
    """

    def __init__(self, endpoint: Endpoint | Sequence[Endpoint]) -> None:
        self._servers = Servers([endpoint] if isinstance(endpoint, Endpoint) else endpoint)
        self._live: list[LiveTable | LiveGroup] = []

    # ------------------------------------------------------------------ servers
    @property
    def endpoint(self) -> Endpoint:
        """The endpoint calls go to now (the only one, with one URI)."""
        return self._servers.active.endpoint

    @property
    def uri(self) -> str:
        """The URI calls go to now, normalized (``grpc://host:port``): the last that
        answered."""
        return self._servers.active.location

    @property
    def uris(self) -> tuple[str, ...]:
        """Every URI of this client, normalized, in the order given."""
        return self._servers.uris

    @property
    def _flight(self) -> fl.FlightClient:
        """The Flight client of the server calls go to (a test breaks it to see a close
        survive a connection that is gone)."""
        return self._servers.active.flight

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close every subscription opened here, then the connections."""
        for live in list(self._live):
            live.close()
        self._live.clear()
        self._servers.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if len(self.uris) == 1:
            return f"<ticktable.Client {self.uri}>"
        return f"<ticktable.Client {', '.join(self.uris)} (on {self.uri})>"

    # ------------------------------------------------------------------ metadata
    def tables(self) -> list[str]:
        """Names of every table on the server, sorted."""

        def run(at: Attempt) -> list[str]:
            names = []
            for info in at.flight.list_flights(b"", at.endpoint.options()):
                raw = info.descriptor.path[0]
                names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            return sorted(names)

        return self._servers.call("tables()", run)

    def schema(self, name: str) -> pa.Schema:
        """The Arrow schema of table ``name`` (``KeyError`` if there is none)."""
        return self._servers.call(f"schema({name!r})", lambda at: _schema_on(at, name))

    def stats(self) -> pd.DataFrame:
        """Per table: size, last step, kind, subscribers and their lag, update sequence,
        rows changed and DoPut rows/bytes since the server started.

        The server's figures are in the frame's ``attrs``: ``step``, ``cycle_p50_ms``,
        ``cycle_p99_ms``, ``last_cycle_ms``, ``open_stages``, ``errors`` (error answers by
        gRPC code name), ``journal_bytes``, ``journal_flushes``, ``journal_flush_p50_ms``
        and ``journal_flush_p99_ms`` (0 on an in-memory server), and ``web``: the web UI's
        process as a dict (``url``, ``running``, ``pid``, ``restarts``, ``open_tables``),
        ``None`` when the server serves no web UI.
        """
        st: pb.Stats = self._servers.call(
            "stats()", lambda at: action(at.flight, at.endpoint.options(), STATS))
        cols = ["name", "kind", "size", "last_step", "subscribers", "max_lag_steps", "sequence",
                "changes", "put_rows", "put_bytes"]
        rows = [{c: getattr(t, c) for c in cols} for t in st.tables]
        df = pd.DataFrame(rows, columns=cols)
        df.attrs.update(step=st.step, cycle_p50_ms=st.cycle_p50_ms, cycle_p99_ms=st.cycle_p99_ms,
                        last_cycle_ms=st.last_cycle_ms, open_stages=st.open_stages,
                        errors=dict(st.errors), journal_bytes=st.journal_bytes,
                        journal_flushes=st.journal_flushes,
                        journal_flush_p50_ms=st.journal_flush_p50_ms,
                        journal_flush_p99_ms=st.journal_flush_p99_ms,
                        web={"url": st.web.url, "running": st.web.running, "pid": st.web.pid,
                             "restarts": st.web.restarts, "open_tables": st.web.open_tables}
                        if st.HasField("web") else None)
        return df

    # ------------------------------------------------------------------ snapshots
    @overload
    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: Literal["pandas"] = "pandas") -> pd.DataFrame: ...

    @overload
    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: Literal["arrow"] = ...) -> pa.Table: ...

    @overload
    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: Literal["polars"] = ...) -> pl.DataFrame: ...

    @overload
    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: FrameKind = ...) -> pd.DataFrame | pa.Table | pl.DataFrame: ...

    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: FrameKind = "pandas") -> pd.DataFrame | pa.Table | pl.DataFrame:
        """A consistent snapshot of table ``name`` (one cycle's state, in row order).

        Parameters
        ----------
        columns
            Columns to fetch (default: all).
        filter
            A ``pyarrow.compute`` boolean expression evaluated on the server, e.g.
            ``pc.field("Price") > 50`` (sent as Substrait).
        as_
            ``"pandas"`` for a DataFrame, ``"arrow"`` for a ``pyarrow.Table``,
            ``"polars"`` for a ``polars.DataFrame`` (made by ``polars.from_arrow``: see
            :mod:`clients.frames`).

        Raises
        ------
        KeyError
            If there is no such table.
        pyarrow.ArrowInvalid
            If a column is unknown or the filter does not fit the table.
        ModuleNotFoundError
            With ``as_="polars"``, if polars is not installed (before anything is sent).

        Examples
        --------
        >>> client.snapshot("trades", as_="polars")                 # doctest: +SKIP
        shape: (2, 3)
        ┌─────┬─────┬──────┐
        │ id  ┆ sym ┆ px   │
        │ --- ┆ --- ┆ ---  │
        │ i64 ┆ str ┆ f64  │
        ╞═════╪═════╪══════╡
        │ 1   ┆ A   ┆ 10.0 │
        │ 2   ┆ B   ┆ 60.0 │
        └─────┴─────┴──────┘
        """
        _check_as(as_)

        def run(at: Attempt) -> pa.Table:
            req = pb.SnapshotRequest(table=name, columns=list(columns or ()))
            if filter is not None:
                from flight import substrait

                req.filter = substrait.encode({"filter": filter}, _schema_on(at, name))
            reader = at.flight.do_get(fl.Ticket(req.SerializeToString()), at.endpoint.options())
            return reader.read_all()

        table = self._servers.call(f"snapshot({name!r})", run)
        return _frame(table, as_)

    # ------------------------------------------------------------------ tables
    def create_table(self, name: str, schema: SchemaLike,
                     kind: TableKind | str = TableKind.APPEND,
                     keys: Sequence[str] | None = None, *, capacity: int = 0,
                     if_not_exists: bool = False) -> None:
        """Create a source table that :meth:`push` (and Spark) can write to.

        Parameters
        ----------
        schema
            An Arrow schema, or data whose schema to take: a pandas or polars DataFrame
            (or polars LazyFrame, of which no row is computed) or an Arrow table.
        kind
            A source :class:`~flight.wire.TableKind`, or its name: ``"append"`` (rows only
            added), ``"keyed"`` (upserts and deletes by ``keys``) or ``"ring"`` (the last
            ``capacity`` rows).
        if_not_exists
            Do nothing if a table of that name already exists.

        Raises
        ------
        pyarrow.ArrowException
            If a table of that name exists and ``if_not_exists`` is false (ALREADY_EXISTS,
            for which pyarrow has no subclass).
        """
        req = _create_request(name, schema, kind, keys, capacity, if_not_exists)

        def run(at: Attempt) -> None:
            with at.effect():
                action(at.flight, at.endpoint.options(), CREATE_TABLE, req)

        self._servers.call(f"create_table({name!r})", run)

    def drop_table(self, name: str) -> None:
        """Drop table ``name``; its subscribers are told the table is gone."""

        def run(at: Attempt) -> None:
            with at.effect():
                action(at.flight, at.endpoint.options(), DROP_TABLE, pb.DropTableRequest(name=name))

        self._servers.call(f"drop_table({name!r})", run)

    def push(self, name: str, data: PutData, mode: PutMode | str | None = None,
             keys: Sequence[str] | None = None, *, create: bool = True,
             progress: bool | Callable[[int], None] = False,
             chunk_rows: int = 1 << 17, atomic: bool = True,
             retry_for: float = 60.0) -> PutSummary:
        """Write rows into table ``name``, all visible in one server cycle.

        By default the rows are sent as one staged write and committed when all arrived: the
        server applies them in a single cycle (subscribers see one update), and a push that
        fails half-way (bad batch, lost connection) leaves nothing behind. When the server
        runs cycles periodically, ``push`` returns once they are visible (``step`` in the
        result says which cycle).

        Parameters
        ----------
        data
            A pandas or polars DataFrame (or polars LazyFrame, collected), an Arrow table or
            record batch, a ``RecordBatchReader``, or an iterable of any of these (streamed:
            nothing is collected in memory). Columns are matched by name and cast to the
            table's types.
        mode
            A :class:`~flight.wire.PutMode`, or its name; ``None`` (the default):
            ``"upsert"`` into a keyed table, else ``"append"``.
            ``"append"`` adds rows; ``"upsert"`` inserts or replaces rows by key (a bool
            ``__delete`` column marks keys to delete); ``"delete"`` removes the keys given
            (key columns only); ``"diff"`` applies differential triples (an int64 ``__diff``
            weight column: +1 insert, -1 retract).
        keys
            Key columns, used when the table does not exist yet and ``create`` is true: the
            table is created keyed on them (else append-only).
        create
            Create the table from the data's schema when it does not exist.
        progress
            ``True`` shows a tqdm progress bar of rows sent; a callable receives the rows of
            each batch as it is sent.
        chunk_rows
            Rows per record batch on the wire (large frames are sent in chunks).
        atomic
            ``False`` streams the rows straight into the table instead: each batch is
            applied from the next cycle after it arrives (for unbounded iterables), and a
            failure leaves the batches before it applied.
        retry_for
            With ``atomic=False``: when the server's cycles fall behind, it refuses a batch
            once the table's writes waiting for a cycle pass its limit (RESOURCE_EXHAUSTED,
            "send it again later"); the push then sends that batch and the rest again after
            a short backoff, so a fast writer slows to what the server takes. It gives up,
            raising the refusal, after ``retry_for`` seconds in which the server
            acknowledged nothing; 0 raises the first refusal. ``retries`` in the result
            counts them. (An atomic push is never refused so: its rows wait apart from the
            table until its commit.)

        With several URIs the push runs whole on one server; when it is sent again to the
        next (see :class:`Client` for when), ``progress`` counts the rows again.

        Returns
        -------
        PutSummary
            Rows and batches the server acknowledged.

        Raises
        ------
        KeyError
            If the table does not exist and ``create`` is false.
        pyarrow.ArrowInvalid
            If the server refuses the rows: a missing or mistyped column, a mode that does
            not fit the table, null keys. Nothing of a refused batch is applied.
        """
        if mode is not None and mode not in PUT_MODES:
            raise ValueError(f"mode must be one of {sorted(m.value for m in PUT_MODES)}, not "
                             f"{mode!r}")
        fixed = PutMode(mode) if mode is not None else None
        replayable = _replayable(data)
        peeked: tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]] | None = _peek(
            _batches(data))
        bar: Any = None

        def run(at: Attempt) -> PutSummary:
            nonlocal peeked, bar
            if peeked is None:  # a retry: read the data again
                peeked = _peek(_batches(data))
            first, rest = peeked
            given = fixed
            descriptor = fl.FlightDescriptor.for_path(name)
            try:
                info = at.flight.get_flight_info(descriptor, at.endpoint.options())
            except KeyError:
                if not create or first is None:
                    raise
                data_schema = _strip(first.schema,
                                     given or (PutMode.UPSERT if keys else PutMode.APPEND))
                # if_not_exists: harmless to repeat, here or on the next server
                action(at.flight, at.endpoint.options(), CREATE_TABLE, _create_request(
                    name, data_schema, TableKind.KEYED if keys else TableKind.APPEND, keys,
                    0, True))
                info = at.flight.get_flight_info(descriptor, at.endpoint.options())
            target = info.schema
            if given is None:
                keyed = info.app_metadata == TableKind.KEYED.encode()
                given = PutMode.UPSERT if keyed else PutMode.APPEND
            wire = _wire_schema(target, first.schema if first is not None else target, given)
            stream = (_conform(b, wire, name) for b in _chain(first, rest))
            cb: Callable[[int], None] | None = progress if callable(progress) else None
            if progress is True:
                if bar is None:
                    from tqdm.auto import tqdm  # type: ignore[import-untyped]

                    bar = tqdm(unit="rows", unit_scale=True, desc=f"push {name}")
                else:  # sent again, to another server
                    bar.reset()
                cb = bar.update
            if replayable:
                peeked = None  # the rows start going out: a retry reads them again
            else:
                at.settle()  # a one-shot input starts going out: it cannot be sent again
            request = pb.PutRequest(mode=given.proto)
            if not atomic:  # each batch is applied as it arrives: sending is the write
                with at.effect():
                    summary = put_batches(at.flight, at.endpoint.options(timeout=None), name,
                                          wire, chunks(stream, chunk_rows), request, cb,
                                          retry_for=retry_for)
                return dataclasses.replace(summary, mode=given.value)
            request.write_id = f"push-{uuid.uuid4().hex}"
            try:  # staged rows are invisible until the commit: a retry duplicates nothing
                summary = put_batches(at.flight, at.endpoint.options(timeout=None), name, wire,
                                      chunks(stream, chunk_rows), request, cb)
                # name the one slot written: if the server lost it (a restart drops writes
                # never committed), the commit fails instead of committing nothing; without a
                # batch the server never saw the write id, and naming no slot is an empty write
                commit = pb.CommitRequest(write_id=request.write_id,
                                          slots=[pb.StageSlot()] if summary.batches else [])
                with at.effect():
                    done: pb.CommitResult = action(
                        at.flight, at.endpoint.options(timeout=None), COMMIT, commit)
                return PutSummary(rows=int(done.rows), batches=summary.batches, staged=True,
                                  step=int(done.step), mode=given.value)
            except BaseException:
                _abort_quietly(at, request.write_id)
                raise

        try:
            return self._servers.call(f"push into {name!r}", run)
        finally:
            if bar is not None:
                bar.close()

    # ------------------------------------------------------------------ live
    def subscribe(self, name: str, columns: Sequence[str] | None = None,
                  viewport: Sequence[tuple[int, int]] | None = None,
                  on_update: Callable[[Any], None] | None = None, *,
                  filter: pc.Expression | None = None, uri: str | None = None,
                  **options: Any) -> LiveTable:
        """Subscribe to table ``name``: a :class:`~clients.live.LiveTable` kept current.

        With several URIs, the i-th subscription of this client starts on URI i mod n and
        fails over to the next in turn when its server does not answer (see
        :class:`Client`); :attr:`~clients.live.LiveTable.uri` says where it is.

        With a ``filter`` the subscription holds the rows for which it is true, kept live on
        the server: a row that starts or stops matching arrives as an add or a remove,
        under the table's own row keys and in its order. Subscribers of one table with the
        same filter share its evaluation; a reconnect within the server's
        ``filter_linger`` (60 s by default) resumes with the updates missed.

        Parameters
        ----------
        columns
            Columns to receive (default: all).
        viewport
            Position ranges ``[(begin, end), ...]`` (end exclusive) whose rows to hold; the
            rest of the table is tracked by key only. With a ``filter``, positions among
            the matching rows.
        on_update
            Called with each applied :class:`~clients.live.Update`.
        filter
            A boolean ``pyarrow.compute`` expression over the table's columns, e.g.
            ``pc.field("px") > 50``, evaluated on the server (sent as Substrait, in every
            subscribe and resume of this subscription); a null result counts as false.
        uri
            Subscribe on this one of :attr:`uris` only, never failing over (a table only
            that server has); as given to :func:`connect` or normalized.
        options
            Passed to :class:`~clients.live.LiveTable` (``min_update_interval_ms``,
            ``max_batch_rows``, ``reconnect``...).

        Raises
        ------
        ValueError
            If ``uri`` is not one of :attr:`uris`.
        ExpressionError
            If ``filter`` does not fit the table's schema (a missing column, a type it
            does not accept); checked against the table's schema before subscribing.
        KeyError
            With a ``filter``: if there is no such table (its schema is read first).

        Examples
        --------
        >>> big = client.subscribe("quotes", filter=pc.field("px") > 50)  # doctest: +SKIP
        >>> big.wait_for(); big.df                                       # doctest: +SKIP
          sym    px
        0   B  55.0
        """
        from clients.live import LiveTable

        predicate = None
        if filter is not None:
            from flight import substrait

            def encode(at: Attempt) -> bytes:
                return substrait.encode({"filter": filter}, _schema_on(at, name))

            what = f"subscribe({name!r}, filter=...)"
            predicate = (self._servers.call(what, encode) if uri is None
                         else self._servers.on(uri, encode))
        live = LiveTable(self._servers.rotation(uri), name, columns=columns, viewport=viewport,
                         on_update=on_update, filter=predicate, **options)
        self._live = [x for x in self._live if not x.closed]
        self._live.append(live)
        return live

    def subscribe_many(self, names: Sequence[str], *,
                       columns: Mapping[str, Sequence[str]] | None = None,
                       on_update: Callable[[GroupUpdate], None] | None = None,
                       filters: Mapping[str, pc.Expression] | None = None,
                       uri: str | None = None, **options: Any) -> LiveGroup:
        """Subscribe to several tables together: a :class:`~clients.livegroup.LiveGroup`,
        every table at the same server step after each update, never a mix.

        One stream carries them all (docs/protocol.md §7.11): per server step the server
        sends the changes of every table that changed, then marks the step's end, and the
        group applies them together. A callback or iterator receives one
        :class:`~clients.livegroup.GroupUpdate` per step (``g.step``, and ``g[name]`` the
        :class:`~clients.live.Update` of each table that changed); inside a callback every
        table's view (``group[name].df``) is at ``g.step``. A slow client receives the
        steps it missed composed, over the same steps for every table; after a broken
        connection each table resumes from where it was, and the tables are again at one
        step. Every row of each table is held (no viewports).

        Parameters
        ----------
        names
            The tables, each once (e.g. a table and tables derived from it).
        columns
            Per table, the columns to receive (tables not named: all).
        on_update
            Called with each :class:`~clients.livegroup.GroupUpdate`.
        filters
            Per table, a boolean ``pyarrow.compute`` expression evaluated on the server, as
            :meth:`subscribe`'s ``filter``.
        uri
            Subscribe on this one of :attr:`uris` only (see :meth:`subscribe`).
        options
            Passed to :class:`~clients.livegroup.LiveGroup` (``min_update_interval_ms``,
            ``max_batch_rows``, ``reconnect``...).

        Raises
        ------
        ValueError
            If ``names`` is empty or repeats a table, ``columns`` or ``filters`` name a
            table not in it, or ``uri`` is not one of :attr:`uris`.
        ExpressionError
            If a filter does not fit its table's schema.

        Examples
        --------
        >>> group = client.subscribe_many(["orders", "totals"])      # doctest: +SKIP
        >>> group.wait_for()                                          # doctest: +SKIP
        True
        >>> for g in group:                  # orders and totals at step g.step  # doctest: +SKIP
        ...     print(g.step, sorted(g), group["totals"].df)
        """
        from clients.livegroup import LiveGroup

        predicates: dict[str, bytes] = {}
        for name, expr in (filters or {}).items():
            from flight import substrait

            def encode(at: Attempt, name: str = name, expr: pc.Expression = expr) -> bytes:
                return substrait.encode({"filter": expr}, _schema_on(at, name))

            what = f"subscribe_many(filters={{{name!r}: ...}})"
            predicates[name] = (self._servers.call(what, encode) if uri is None
                                else self._servers.on(uri, encode))
        group = LiveGroup(self._servers.rotation(uri), names, columns=columns,
                          filters=predicates, on_update=on_update, **options)
        self._live = [x for x in self._live if not x.closed]
        self._live.append(group)
        return group

    # ------------------------------------------------------------------ SQL
    @overload
    def sql(self, text: str, params: Sequence[Any] | None = None, *,
            as_: Literal["pandas"] = "pandas") -> pd.DataFrame: ...

    @overload
    def sql(self, text: str, params: Sequence[Any] | None = None, *,
            as_: Literal["arrow"]) -> pa.Table: ...

    @overload
    def sql(self, text: str, params: Sequence[Any] | None = None, *,
            as_: Literal["polars"]) -> pl.DataFrame: ...

    @overload
    def sql(self, text: str, params: Sequence[Any] | None = None, *,
            as_: FrameKind = "pandas") -> pd.DataFrame | pa.Table | pl.DataFrame: ...

    def sql(self, text: str, params: Sequence[Any] | None = None, *,
            as_: FrameKind = "pandas") -> pd.DataFrame | pa.Table | pl.DataFrame:
        """Run one SQL statement on the server (Arrow Flight SQL) and return its result.

        A ``SELECT`` reads one consistent snapshot of every table it names, all taken at
        the same server step; the step is in the result: ``df.attrs["step"]`` for pandas,
        the schema metadata ``b"ticktable.step"`` for Arrow (a polars frame has no place
        for it: ask for Arrow, then ``polars.from_arrow``). An update statement
        (``INSERT``; ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on a keyed table; ``CREATE``
        and ``DROP TABLE``; ``CREATE`` and ``DROP VIEW``) runs at once, its rows visible in
        one cycle, and returns one row: ``count``, the rows it changed (0 for a table or a
        view made or dropped); it has no step (``attrs["step"]`` is ``None``).

        Parameters
        ----------
        text
            One statement, DuckDB's dialect. Table names are the server's tables.
        params
            Values for the statement's placeholders (``?`` or ``$1``), in order: the
            statement is prepared, the values bound as one row (types as ``pyarrow.array``
            infers them), then it runs and the prepared statement is closed. Empty or
            ``None``: the text runs as it is.
        as_
            ``"pandas"`` for a DataFrame, ``"arrow"`` for a ``pyarrow.Table``,
            ``"polars"`` for a ``polars.DataFrame``.

        Returns
        -------
        pandas.DataFrame or pyarrow.Table or polars.DataFrame
            The rows, in the query's order.

        Raises
        ------
        pyarrow.ArrowInvalid
            A syntax error (the message names line and column), an unknown column, a
            statement the server does not run, or values that do not fit a table.
        KeyError
            A table the server does not have (``pyarrow.ArrowKeyError``).
        pyarrow.flight.FlightTimedOutError
            The query ran past the server's limit (``ticktable serve --sql-timeout``).
        pyarrow.flight.FlightUnauthorizedError
            An update with the read-only token.
        ModuleNotFoundError
            With ``as_="polars"``, if polars is not installed (before anything is sent).

        Examples
        --------
        >>> client.sql("SELECT sym, px FROM trades WHERE px > 50 ORDER BY px")  # doctest: +SKIP
          sym     px
        0   B   61.5
        1   A   99.0
        >>> client.sql("SELECT * FROM trades WHERE sym = ?", ["A"], as_="arrow")  # doctest: +SKIP
        pyarrow.Table
        ...

        With several URIs a query is a read, retried on the next server after any
        UNAVAILABLE; any other statement is a write, retried only when it was never sent
        (see :class:`Client`). Either runs whole on one server.

        An update returns the rows it changed:

        >>> client.sql("INSERT INTO trades VALUES (7, 'C', 12.5, 3)")  # doctest: +SKIP
           count
        0      1
        """
        _check_as(as_)
        write = len(self.uris) > 1 and not _is_query(text)
        table = self._servers.call("sql()", lambda at: _sql_on(at, text, params, write=write))
        if as_ != "pandas":
            return _frame(table, as_)
        df = table.to_pandas()
        step = (table.schema.metadata or {}).get(b"ticktable.step")
        df.attrs["step"] = int(step) if step is not None else None
        return df

    def subscribe_sql(self, text: str, **subscribe_kwargs: Any) -> LiveTable:
        """Subscribe to the result of a SQL query, kept current as its tables change.

        The query becomes a temporary live view on the server, ``CREATE TEMPORARY VIEW
        __sql_<random hex> AS <text>``, which this subscribes to (:meth:`subscribe`). The
        view is dropped when the :class:`~clients.live.LiveTable` is closed, or this client
        is; and by the server once its last subscriber left, so a process that dies
        without closing leaves nothing behind (a temporary view is not journaled either).
        While subscribed, the view is a table like any other: others see it under that
        name (:meth:`tables`, ``ticktable ls``) and may subscribe to it too.

        With several URIs the view is created where calls go (a write: see
        :class:`Client`), and the subscription stays on that server: the view exists only
        there, and goes with it.

        Parameters
        ----------
        text
            One ``SELECT`` the server can keep live (see the server's ``CREATE VIEW``).
        subscribe_kwargs
            Passed to :meth:`subscribe` (``columns``, ``viewport``, ``on_update``...).

        Returns
        -------
        LiveTable
            Its :attr:`~clients.live.LiveTable.table` is the view's name.

        Raises
        ------
        pyarrow.ArrowInvalid
            If the query does not parse (the message names line and column) or cannot be
            kept live.
        KeyError
            If the query names a table the server does not have.

        Examples
        --------
        >>> live = client.subscribe_sql(                               # doctest: +SKIP
        ...     "SELECT sym, sum(qty) AS qty FROM trades GROUP BY sym")
        >>> live.wait_for()                                            # doctest: +SKIP
        True
        >>> live.df                                                    # doctest: +SKIP
          sym  qty
        0   A   12
        >>> live.close()                            # drops the view  # doctest: +SKIP
        """
        name = f"__sql_{uuid.uuid4().hex}"
        create = f'CREATE TEMPORARY VIEW "{name}" AS {text}'

        def run(at: Attempt) -> str:
            _sql_on(at, create, None, write=True)
            return at.server.location

        uri = self._servers.call("subscribe_sql()", run)
        try:
            live = self.subscribe(name, uri=uri, **subscribe_kwargs)
        except BaseException:
            self._drop_view_quietly(name, uri)
            raise
        live.on_close(lambda: self._drop_view_quietly(name, uri))
        return live

    def _drop_view_quietly(self, name: str, uri: str) -> None:
        """Drop a temporary view on its server (``DROP VIEW IF EXISTS``: dropped by hand
        already is fine); a connection that is gone leaves it (logged at debug)."""
        drop = f'DROP VIEW IF EXISTS "{name}"'
        try:
            self._servers.on(uri, lambda at: _sql_on(at, drop, None, write=True))
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            log.debug("could not drop the temporary view %r: %s", name, exc)

    def table(self, name: str) -> RemoteTable:
        """A server-side table to compose from: ``client.table("t").where(...).agg_by(...)``.

        The operations run on the server as live tables; see :class:`~clients.remote.RemoteTable`.
        """
        from clients.remote import RemoteTable

        return RemoteTable._root(self, name)

    # ------------------------------------------------------------------ TableService
    def _table_service(self) -> tuple[Any, list[tuple[str, str]], str]:
        """The TableService stub of the server calls go to (connected on first use), the
        call metadata, and that server's URI (where what the stub creates lives)."""
        server = self._servers.active
        meta = [(k.decode(), v.decode()) for k, v in server.endpoint.headers()]
        return server.table_service(), meta, server.location


# ---------------------------------------------------------------------- calls on one server
def _schema_on(at: Attempt, name: str) -> pa.Schema:
    """The schema of table ``name`` on ``at``'s server."""
    res = at.flight.get_schema(fl.FlightDescriptor.for_path(name), at.endpoint.options())
    return res.schema


def _create_request(name: str, schema: SchemaLike,
                    kind: TableKind | str, keys: Sequence[str] | None, capacity: int,
                    if_not_exists: bool) -> pb.CreateTableRequest:
    """The CreateTable action's body (see :meth:`Client.create_table`)."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"kind must be one of {sorted(k.value for k in SOURCE_KINDS)}, not "
                         f"{kind!r}")
    if kind == TableKind.KEYED and not keys:
        raise ValueError(f"a keyed table needs keys (the columns that identify a row); "
                         f"e.g. create_table({name!r}, schema, 'keyed', keys=['id'])")
    sch = _schema_of(schema)
    return pb.CreateTableRequest(name=name, schema=sch.serialize().to_pybytes(),
                                 kind=TableKind(kind).proto, keys=list(keys or ()),
                                 capacity=capacity, if_not_exists=if_not_exists)


def _abort_quietly(at: Attempt, write_id: str) -> None:
    """Drop a failed push's staged rows on ``at``'s server (which also expires them on its
    own)."""
    try:
        action(at.flight, at.endpoint.options(), ABORT, pb.AbortRequest(write_id=write_id))
    except KeyError:  # NOT_FOUND: nothing was staged under it (the first batch failed)
        pass
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        log.warning("could not abort write %r (%s); the server drops it when it expires",
                    write_id, exc)


# ---------------------------------------------------------------------- Flight SQL
def _is_query(text: str) -> bool:
    """Whether ``text`` is a query, which only reads: what the server routes as one
    (:func:`flight.sql.parse.statement_kind`). A text that does not parse counts as a write
    (the server refuses it anyway)."""
    from flight.sql.parse import parse_one, statement_kind

    try:
        return statement_kind(parse_one(text)) == "select"
    except SqlError:
        return False


def _sql_on(at: Attempt, text: str, params: Sequence[Any] | None, *, write: bool) -> pa.Table:
    """Run one statement on ``at``'s server: as it is, or prepared with ``params`` bound.

    For a ``write``, the GetFlightInfo that runs the statement is the attempt's
    :meth:`~Attempt.effect` (preparing and binding change nothing).
    """
    if not params:
        return _sql_run(at, _sql_command(fsql.CommandStatementQuery(query=text)), write)
    return _sql_prepared(at, text, params, write)


def _sql_run(at: Attempt, descriptor: fl.FlightDescriptor, write: bool) -> pa.Table:
    """GetFlightInfo of a Flight SQL command, then DoGet of its one endpoint.

    Without the client's unary timeout: GetFlightInfo runs an update, or starts a
    query, and the server bounds both (``ticktable serve --sql-timeout``).
    """
    options = at.endpoint.options(timeout=None)
    with at.effect() if write else contextlib.nullcontext():
        info = at.flight.get_flight_info(descriptor, options)
    tables = [at.flight.do_get(endpoint.ticket, options).read_all()
              for endpoint in info.endpoints]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _sql_prepared(at: Attempt, text: str, params: Sequence[Any], write: bool) -> pa.Table:
    """Prepare ``text``, bind ``params`` (one row), run it, close the statement."""
    request = _pack(fsql.ActionCreatePreparedStatementRequest(query=text))
    results = list(at.flight.do_action(  # runs a query for its schema: no timeout
        fl.Action("CreatePreparedStatement", request), at.endpoint.options(timeout=None)))
    created = fsql.ActionCreatePreparedStatementResult()
    _unpack(results[0].body.to_pybytes(), created)
    handle = created.prepared_statement_handle
    try:
        names = (pa.ipc.read_schema(pa.py_buffer(created.parameter_schema)).names
                 if created.parameter_schema else [])
        names = names if len(names) == len(params) else [
            f"${i + 1}" for i in range(len(params))]
        batch = pa.RecordBatch.from_arrays([pa.array([v]) for v in params], names=names)
        bind = _sql_command(
            fsql.CommandPreparedStatementQuery(prepared_statement_handle=handle))
        writer, reader = at.flight.do_put(bind, batch.schema, at.endpoint.options(timeout=None))
        try:
            writer.write_batch(batch)
            writer.done_writing()
            answer = reader.read()
        finally:
            writer.close()
        if answer is not None:  # the server may name the bound statement anew
            bound = fsql.DoPutPreparedStatementResult()
            bound.ParseFromString(answer.to_pybytes())
            if bound.HasField("prepared_statement_handle"):
                handle = bound.prepared_statement_handle
        return _sql_run(at, _sql_command(
            fsql.CommandPreparedStatementQuery(prepared_statement_handle=handle)), write)
    finally:
        close = _pack(fsql.ActionClosePreparedStatementRequest(
            prepared_statement_handle=handle))
        try:
            list(at.flight.do_action(fl.Action("ClosePreparedStatement", close),
                                     at.endpoint.options()))
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            log.debug("could not close a prepared statement: %s", exc)


def _pack(message: Message) -> bytes:
    """``message`` in a serialized ``google.protobuf.Any`` (how Flight SQL sends commands)."""
    holder = any_pb2.Any()
    holder.Pack(message)
    return holder.SerializeToString()


def _unpack(raw: bytes, into: Message) -> None:
    """Parse the ``google.protobuf.Any`` ``raw`` into ``into`` (its type must match)."""
    holder = any_pb2.Any()
    holder.ParseFromString(raw)
    if not holder.Unpack(into):
        raise ProtocolError(f"Flight SQL: expected {into.DESCRIPTOR.full_name}, the server "
                            f"sent {holder.type_url}")


def _sql_command(message: Message) -> fl.FlightDescriptor:
    return fl.FlightDescriptor.for_command(_pack(message))


# ---------------------------------------------------------------------- data helpers
def _check_as(as_: str) -> None:
    """Refuse an unknown ``as_``; for ``"polars"``, check it is installed before any call."""
    if as_ not in ("pandas", "arrow", "polars"):
        raise ValueError(f"as_ must be 'pandas', 'arrow' or 'polars', not {as_!r}")
    if as_ == "polars":
        require_polars()


def _frame(table: pa.Table, as_: FrameKind) -> pd.DataFrame | pa.Table | pl.DataFrame:
    """``table`` as ``as_`` asks."""
    if as_ == "pandas":
        return table.to_pandas()
    return to_polars(table) if as_ == "polars" else table


def _schema_of(obj: SchemaLike) -> pa.Schema:
    if isinstance(obj, pa.Schema):
        return obj
    if isinstance(obj, pd.DataFrame):
        return pa.Schema.from_pandas(obj, preserve_index=False)
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        return obj.schema
    if is_polars(obj):
        return polars_schema(obj)
    raise TypeError(f"expected a pyarrow.Schema, a pandas or polars DataFrame or an Arrow "
                    f"table, got {type(obj).__name__}")


def _replayable(data: PutData) -> bool:
    """Whether ``data`` can be read again (so a push may be sent again to another server):
    a DataFrame, an Arrow table or record batch, or a list or tuple of these."""
    whole = (pd.DataFrame, pa.Table, pa.RecordBatch)

    def replayable(part: object) -> bool:
        return isinstance(part, whole) or is_polars(part)

    return replayable(data) or (isinstance(data, (list, tuple))
                                and all(replayable(part) for part in data))


def _batches(data: PutData) -> Iterator[pa.RecordBatch]:
    """Every record batch of ``data`` (lazily, for iterables and readers)."""
    if isinstance(data, pd.DataFrame):
        yield from pa.Table.from_pandas(data, preserve_index=False).to_batches()
    elif isinstance(data, pa.Table):
        yield from data.to_batches()
    elif isinstance(data, pa.RecordBatch):
        yield data
    elif isinstance(data, pa.RecordBatchReader):
        yield from data
    elif is_polars(data):  # a LazyFrame is collected here, once per attempt
        yield from from_polars(data).to_batches()
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
        for part in data:
            if isinstance(part, Iterable) and not isinstance(
                    part, (pd.DataFrame, pa.Table, pa.RecordBatch)) and not is_polars(part):
                raise TypeError("push takes an iterable of DataFrames, Arrow tables or record "
                                "batches, not nested iterables")
            yield from _batches(part)
    else:
        raise TypeError(f"cannot push a {type(data).__name__}: pass a pandas or polars "
                        f"DataFrame, an Arrow table or record batch, a RecordBatchReader, or "
                        f"an iterable of these")


def _peek(it: Iterator[pa.RecordBatch]) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    for first in it:
        return first, it
    return None, it


def _chain(first: pa.RecordBatch | None,
           rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if first is not None:
        yield first
        yield from rest


def _strip(schema: pa.Schema, mode: PutMode) -> pa.Schema:
    """``schema`` without the reserved columns of ``mode`` (they are not table columns)."""
    return pa.schema([f for f in schema if f.name not in mode.columns])


def _wire_schema(target: pa.Schema, data: pa.Schema, mode: PutMode) -> pa.Schema:
    """The schema batches are sent in: the table's columns the data has, plus mode columns.

    Columns the table lacks are kept (the server names them in its error); in ``delete``
    mode only the given (key) columns are sent.
    """
    fields = []
    for f in data:
        if f.name in mode.columns:  # passed through as they are
            fields.append(pa.field(f.name, pa.bool_() if f.name == DELETE else pa.int64()))
        elif f.name in target.names:
            fields.append(target.field(f.name))
        else:
            fields.append(f)
    if mode in (PutMode.APPEND, PutMode.UPSERT):
        order = {n: i for i, n in enumerate(target.names)}
        fields.sort(key=lambda f: order.get(f.name, len(order)))
    return pa.schema(fields)


def _conform(batch: pa.RecordBatch, schema: pa.Schema, table: str) -> pa.RecordBatch:
    if batch.schema.names != schema.names and set(batch.schema.names) == set(schema.names):
        batch = batch.select(schema.names)
    if batch.schema.equals(schema):
        return batch
    if batch.schema.names != schema.names:
        raise pa.ArrowInvalid(f"push into {table!r}: every batch must have the columns "
                              f"{schema.names}; got {batch.schema.names}")
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise pa.ArrowInvalid(f"push into {table!r}: cannot convert the data to the table's "
                              f"types ({exc})") from exc
