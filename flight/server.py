"""The Ticktable Arrow Flight server (DESIGN.md §5).

=================  ==================================================================
Flight call        what it does
=================  ==================================================================
ListFlights        every table: schema, size, kind
GetFlightInfo      one table (descriptor path ``[name]``); its ticket is a SnapshotRequest
GetSchema          one table's schema
DoGet              a consistent snapshot; the ticket is a ``SnapshotRequest`` (columns,
                   Substrait filter) or a plain table name
DoExchange         a subscription (:mod:`flight.subscription`): the first client message's
                   ``app_metadata`` is a ``ClientMessage`` with ``subscribe``
DoPut              ingestion (:mod:`flight.put`, staged by :mod:`flight.staging`); the first
                   message's ``app_metadata`` is a ``PutRequest`` (none: append, or upsert
                   for a keyed table)
DoAction           ``create_table``, ``drop_table``, ``commit``, ``abort``, ``stats``
=================  ==================================================================

Every handler answers an error through the one table of :mod:`flight.errors`.

The gRPC ``TableService`` and health service run on a second port
(:func:`flight.service.serve_table_service`). Both ports check the bearer token when one
is configured, and use TLS when a certificate and key are given.

Embedding::

    graph = UpdateGraph(); graph.start(0.1)
    with TicktableServer(graph, ServerConfig(port=0)) as server:
        print(server.location)
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from engine.errors import InputError, ProtocolError, SchemaError
from engine.graph import UpdateGraph
from flight._requests import check_metadata_size, parse, table_name
from flight.auth import BearerTokenMiddlewareFactory
from flight.durable import Durability, RecoveryReport
from flight.errors import flight_errors
from flight.pb import flight_pb2 as pb
from flight.put import PutHandler
from flight.registry import TableEntry, TableRegistry
from flight.staging import StagingArea
from flight.subscription import Subscription, SubscriptionOptions

__all__ = ["ServerConfig", "TicktableServer"]

log = logging.getLogger(__name__)

KIND_NAMES = {pb.TABLE_KIND_APPEND: "append", pb.TABLE_KIND_KEYED: "keyed",
              pb.TABLE_KIND_RING: "ring"}


@dataclass(slots=True)
class ServerConfig:
    """How the server listens and its limits.

    Attributes
    ----------
    host, port
        The Flight listening address (port 0: pick a free one).
    grpc_port
        The TableService port (0: pick a free one; ``None``: do not start it).
    token
        Bearer token every call must present (``None``: no authentication).
    tls_cert, tls_key
        PEM certificate chain and private key: serve TLS (``grpc+tls://``).
    max_batch_rows
        Upper bound on rows per record batch sent to subscribers.
    max_metadata_bytes
        Largest ``app_metadata`` accepted from a client.
    max_put_batch_bytes
        Largest record batch accepted by DoPut.
    history_updates
        Per table, recent updates kept for resuming subscribers.
    max_pending
        Per subscriber, updates queued before they are composed into one.
    stage_ttl
        Seconds after which an untouched staged write is dropped.
    end_grace_seconds
        How long a subscription ended by the server waits for its client to finish writing
        before a warning is logged (the handler keeps waiting; see :meth:`TicktableServer.shutdown`).
    shutdown_timeout
        How long :meth:`TicktableServer.shutdown` waits for in-flight calls to finish.
    data_dir
        Where durable tables live (journal and checkpoints, :mod:`flight.durable`); tables
        created through the server come back after a restart. ``None``: in memory only.
    checkpoint_bytes, checkpoint_seconds
        A checkpoint is written once the journal grew by this many bytes, or this many
        seconds passed with something journaled.
    """

    host: str = "127.0.0.1"
    port: int = 0
    grpc_port: int | None = 0
    token: str | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    max_batch_rows: int = 65_536
    max_metadata_bytes: int = 1 << 20
    max_put_batch_bytes: int = 256 << 20
    history_updates: int = 256
    max_pending: int = 32
    stage_ttl: float = 600.0
    end_grace_seconds: float = 10.0
    shutdown_timeout: float = 30.0
    data_dir: Path | None = None
    checkpoint_bytes: int = 512 << 20
    checkpoint_seconds: float = 300.0


class _FlightService(flight.FlightServerBase):  # type: ignore[misc]
    def __init__(self, server: TicktableServer, location: str, **kw: Any) -> None:
        super().__init__(location, **kw)
        self.server = server

    # ------------------------------------------------------------------ metadata
    def _info(self, entry: TableEntry) -> flight.FlightInfo:
        ticket = pb.SnapshotRequest(table=entry.name).SerializeToString()
        return flight.FlightInfo(entry.table.schema, flight.FlightDescriptor.for_path(entry.name),
                                 [flight.FlightEndpoint(ticket, [])], len(entry.table.rowset), -1,
                                 app_metadata=entry.kind.encode())

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[flight.FlightInfo]:
        with flight_errors():
            infos = [self._info(e) for e in self.server.registry.entries()]
        yield from infos

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        with flight_errors():
            return self._info(self.server.registry.get(table_name(descriptor)))

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        with flight_errors():
            return flight.SchemaResult(self.server.registry.get(table_name(descriptor)).table.schema)

    # ------------------------------------------------------------------ snapshots
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        with flight_errors():
            req = self._snapshot_request(ticket.ticket)
            entry = self.server.registry.get(req.table)
            table = entry.table
            columns = list(req.columns) or None
            if columns:
                unknown = [c for c in columns if c not in table.schema.names]
                if unknown:
                    raise SchemaError(f"table {req.table!r} has no column(s) {unknown} "
                                      f"(columns: {', '.join(table.schema.names)})")
            if req.filter:
                from flight.substrait import filter_table

                snap = filter_table(table.to_arrow(), req.filter)
                if columns:
                    snap = snap.select(columns)
            else:
                snap = table.to_arrow(columns)
            # record batches of at most max_batch_rows (zero-copy slices): no client has to
            # take a message of the whole table, and sending pipelines with encoding
            batches = snap.to_batches(max_chunksize=self.server.config.max_batch_rows)
            return flight.RecordBatchStream(pa.Table.from_batches(batches, schema=snap.schema))

    def _snapshot_request(self, raw: bytes) -> pb.SnapshotRequest:
        try:
            name = raw.decode()
        except UnicodeDecodeError:
            name = None
        if name is not None and name in self.server.registry.names():
            return pb.SnapshotRequest(table=name)
        req = parse(pb.SnapshotRequest(), raw, "DoGet ticket")
        if not req.table:
            raise ProtocolError("DoGet ticket names no table; use a SnapshotRequest or a "
                                "table name")
        return req

    # -------------------------------------------------------------- subscriptions
    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any,
                    writer: Any) -> None:
        with flight_errors():
            try:
                first = reader.read_chunk()
            except StopIteration:  # the client closed without sending anything: nothing to do
                return
            meta = first.app_metadata
            check_metadata_size(meta, self.server.config.max_metadata_bytes, "DoExchange")
            msg = parse(pb.ClientMessage(), None if meta is None else meta.to_pybytes(),
                         "DoExchange")
            if msg.WhichOneof("body") != "subscribe":
                raise ProtocolError("the first DoExchange message must be a subscribe")
            req = msg.subscribe
            if not req.table and descriptor.descriptor_type == flight.DescriptorType.PATH:
                req.table = table_name(descriptor)
            entry = self.server.registry.get(req.table)
            sub = Subscription(entry, req, self.server.sub_options)
            self.server._track(sub, +1)
            reading = threading.Event()  # set when the reader thread is done with `reader`
            t = threading.Thread(target=self._read_changes, args=(reader, sub, reading),
                                 daemon=True, name=f"ticktable-sub-{entry.name}")
            t.start()
            try:
                sub.run(writer, context)
            except Exception as exc:
                # The stream ends from our side: tell the client to finish writing.
                if not context.is_cancelled():
                    try:
                        sub.send_end(writer, str(exc))
                    except Exception:
                        log.debug("could not send end of stream", exc_info=True)
                raise
            finally:
                sub.close()
                self.server._track(sub, -1)
                # pyarrow frees the reader when this handler returns, and it has no server-side
                # cancel, so a reader thread still blocked in read_chunk would then touch freed
                # memory. Never return before it is done: it ends when the client finishes
                # writing, cancels, or its connection drops.
                self._wait_reader(reading, entry.name, context)

    def _wait_reader(self, reading: threading.Event, name: str, context: Any) -> None:
        # An Event, not Thread.join: join registers this gRPC thread as a dummy Python thread.
        grace = self.server.config.end_grace_seconds
        if reading.wait(grace):
            return
        with self.server._subs_lock:
            self.server._stuck_readers += 1
        try:
            while not reading.wait(grace):
                log.warning("subscriber %s to %r has not finished writing; holding its handler "
                            "until it does or disconnects", context.peer(), name)
        finally:
            with self.server._subs_lock:
                self.server._stuck_readers -= 1

    def _read_changes(self, reader: Any, sub: Subscription, reading: threading.Event) -> None:
        try:
            self._read_change_loop(reader, sub)
        finally:
            reading.set()

    def _read_change_loop(self, reader: Any, sub: Subscription) -> None:
        limit = self.server.config.max_metadata_bytes
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return  # the client is done writing; keep sending
            except Exception:
                sub.close()  # the client went away
                return
            try:
                meta = chunk.app_metadata
                if meta is None or meta.size > limit:
                    raise ProtocolError("subscription changes need metadata within the limit")
                msg = parse(pb.ClientMessage(), meta.to_pybytes(), "subscription change")
                if msg.WhichOneof("body") != "change":
                    raise ProtocolError("expected a subscription change")
                sub.change(msg.change)
            except ProtocolError as exc:
                sub.on_table_failure(exc)
                return

    # ------------------------------------------------------------------ ingestion
    def do_put(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any,
               writer: Any) -> None:
        with flight_errors():
            self.server.puts.serve(descriptor, reader, writer)

    # -------------------------------------------------------------------- actions
    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("create_table", "CreateTableRequest -> empty"),
                ("drop_table", "DropTableRequest -> empty"),
                ("commit", "CommitRequest -> CommitResult"),
                ("abort", "AbortRequest -> empty"),
                ("stats", "empty -> Stats")]

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        with flight_errors():
            body = action.body.to_pybytes() if action.body is not None else b""
            out = self.server.action(action.type, body)
        if out is not None:
            yield out


class TicktableServer:
    """The Flight server plus the gRPC TableService over one :class:`UpdateGraph`.

    Parameters
    ----------
    graph
        The update graph (run its cycles with ``graph.start(interval)``).
    config
        Addresses, credentials and limits.
    registry
        Tables to serve (a new, empty registry by default).

    Examples
    --------
    >>> graph = UpdateGraph(); graph.start(0.05)
    >>> server = TicktableServer(graph).start()
    >>> server.location
    'grpc://127.0.0.1:...'
    >>> server.shutdown(); graph.stop()
    """

    def __init__(self, graph: UpdateGraph, config: ServerConfig | None = None,
                 registry: TableRegistry | None = None) -> None:
        self.graph = graph
        self.config = config or ServerConfig()
        self.registry = registry or TableRegistry(graph,
                                                  history_updates=self.config.history_updates)
        self.staging = StagingArea(self.registry, stage_ttl=self.config.stage_ttl)
        self.durability = Durability(graph, self.registry, self.staging,
                                     data_dir=self.config.data_dir,
                                     checkpoint_bytes=self.config.checkpoint_bytes,
                                     checkpoint_seconds=self.config.checkpoint_seconds)
        self.recovery: RecoveryReport | None = None
        self.puts = PutHandler(self.registry, self.durability,
                               max_metadata_bytes=self.config.max_metadata_bytes,
                               max_batch_bytes=self.config.max_put_batch_bytes)
        self.sub_options = SubscriptionOptions(max_batch_rows=self.config.max_batch_rows,
                                               max_pending=self.config.max_pending)
        self._subs: dict[int, Subscription] = {}
        self._subs_lock = threading.Lock()
        self._stuck_readers = 0
        self._cycle_ms: collections.deque[float] = collections.deque(maxlen=1000)
        self._remove_terminal = graph.add_terminal_listener(self._on_cycle)
        self._flight: _FlightService | None = None
        self._grpc: Any = None
        self.grpc_port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.config.tls_cert else "grpc"

    @property
    def location(self) -> str:
        """The Flight URI clients connect to."""
        if self._flight is None:
            raise RuntimeError("the server is not started")
        return f"{self.scheme}://{self.config.host}:{self._flight.port}"

    @property
    def port(self) -> int:
        if self._flight is None:
            raise RuntimeError("the server is not started")
        return int(self._flight.port)

    def start(self) -> TicktableServer:
        """Recover durable tables, bind both ports and serve in the background.

        With a ``data_dir``, the last acknowledged state comes back first (call this before
        ``graph.start``): see :meth:`flight.durable.Durability.recover`.

        Returns
        -------
        TicktableServer
            ``self``.
        """
        cfg = self.config
        if self.durability.durable and self.recovery is None:
            from flight.service import derived_builder

            self.durability.set_deriver(derived_builder(self.registry))
            try:
                self.recovery = self.durability.recover()
            except BaseException:
                self.durability.close(checkpoint=False)  # release the data dir
                raise
        kw: dict[str, Any] = {}
        if cfg.token:
            kw["middleware"] = {"auth": BearerTokenMiddlewareFactory(cfg.token)}
        if cfg.tls_cert:
            if not cfg.tls_key:
                raise InputError("TLS needs both a certificate and a key")
            kw["tls_certificates"] = [(cfg.tls_cert, cfg.tls_key)]
        self._flight = _FlightService(self, f"{self.scheme}://{cfg.host}:{cfg.port}", **kw)
        if cfg.grpc_port is not None:
            from flight.service import serve_table_service

            self._grpc, self.grpc_port = serve_table_service(
                self.registry, host=cfg.host, port=cfg.grpc_port, token=cfg.token,
                tls_cert=cfg.tls_cert, tls_key=cfg.tls_key, durability=self.durability)
        self.staging.start_janitor(min(60.0, max(1.0, cfg.stage_ttl / 4)))
        self.durability.start()
        log.info("serving Flight at %s, TableService on port %s", self.location, self.grpc_port)
        return self

    def serve_forever(self) -> None:
        """Block until :meth:`shutdown` (or a signal) stops the Flight server."""
        if self._flight is None:
            self.start()
        assert self._flight is not None
        self._flight.serve()

    def shutdown(self) -> bool:
        """Stop serving: subscriptions end, staged writes are dropped.

        Every subscriber is sent an end-of-stream message. A client that never finishes writing
        holds its call open (pyarrow cannot cancel a call from the server side), so this waits
        at most ``config.shutdown_timeout`` for in-flight calls and returns ``False`` if some are
        still open then (the process should exit; the port stays bound until it does).
        """
        with self._subs_lock:
            subs = list(self._subs.values())
        for sub in subs:
            sub.close()
        if self._grpc is not None:
            self._grpc.stop(grace=1.0)
            self._grpc = None
        clean = True
        if self._flight is not None:
            stopper = threading.Thread(target=self._flight.shutdown, daemon=True,
                                       name="ticktable-flight-shutdown")
            stopper.start()
            stopper.join(self.config.shutdown_timeout)
            if stopper.is_alive():
                clean = False
                log.error("Flight shutdown still waits for %d call(s) after %.0f s (clients that "
                          "never finished writing); giving up", self._stuck_readers or len(subs),
                          self.config.shutdown_timeout)
            self._flight = None
        self.staging.stop()
        self.durability.close()
        self._remove_terminal()
        return clean

    def __enter__(self) -> TicktableServer:
        return self.start() if self._flight is None else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ bookkeeping
    def _track(self, sub: Subscription, delta: int) -> None:
        with self._subs_lock:
            if delta > 0:
                self._subs[id(sub)] = sub
            else:
                self._subs.pop(id(sub), None)

    @property
    def subscriptions(self) -> list[Subscription]:
        with self._subs_lock:
            return list(self._subs.values())

    def _on_cycle(self, step: int) -> None:
        self._cycle_ms.append(self.graph.last_cycle_seconds * 1e3)

    # --------------------------------------------------------------------- actions
    def action(self, kind: str, body: bytes) -> bytes | None:
        """Run one DoAction; returns the serialized result message (or ``None``)."""
        reg = self.registry
        if kind == "create_table":
            req = parse(pb.CreateTableRequest(), body, "create_table")
            try:
                schema = pa.ipc.read_schema(pa.py_buffer(req.schema))
            except (pa.ArrowInvalid, OSError) as exc:
                raise ProtocolError(f"create_table {req.name!r}: schema is not an Arrow IPC "
                                    f"schema ({exc})") from exc
            kind_name = KIND_NAMES.get(req.kind)
            if kind_name is None:
                raise ProtocolError(f"create_table {req.name!r}: unknown kind {req.kind}")
            self.durability.create_table(req.name, schema, kind_name, keys=list(req.keys),
                                         capacity=int(req.capacity),
                                         if_not_exists=req.if_not_exists)
            return None
        if kind == "drop_table":
            req2 = parse(pb.DropTableRequest(), body, "drop_table")
            reg.get(req2.name)
            self.durability.drop_table(req2.name)
            return None
        if kind == "commit":
            res = self.durability.commit(parse(pb.CommitRequest(), body, "commit"))
            return bytes(res.SerializeToString())
        if kind == "abort":
            self.durability.abort(parse(pb.AbortRequest(), body, "abort"))
            return None
        if kind == "stats":
            return bytes(self.stats().SerializeToString())
        raise InputError(f"unknown action {kind!r}; actions: create_table, drop_table, commit, "
                         f"abort, stats")

    def stats(self) -> pb.Stats:
        """Per table size, last step, subscribers and lag; cycle durations."""
        ms = np.asarray(self._cycle_ms, dtype=np.float64)
        out = pb.Stats(step=self.graph.step, last_cycle_ms=self.graph.last_cycle_seconds * 1e3,
                       cycle_p50_ms=float(np.median(ms)) if ms.size else 0.0,
                       cycle_p99_ms=float(np.percentile(ms, 99)) if ms.size else 0.0,
                       open_stages=self.staging.open_stages,
                       table_service_port=self.grpc_port or 0)
        subs = self.subscriptions
        for e in self.registry.entries():
            mine = [s for s in subs if s.entry is e]
            last = e.table.last_step
            lag = max((max(0, last - s.step) for s in mine), default=0)
            out.tables.append(pb.TableStats(
                name=e.name, size=len(e.table.rowset), last_step=last, subscribers=len(mine),
                max_lag_steps=lag, kind=e.kind,
                sequence=e.publisher.sequence if e.publisher else 0))
        return out
