"""The Ticktable server: Arrow Flight, the TableService, health and reflection on one port
(DESIGN.md §5).

One ``grpc.aio`` server (:mod:`flight.rpc.aio`: its event loop writes every stream, the
handlers run on threads) hosts ``arrow.flight.protocol.FlightService`` (:mod:`flight.rpc.flight_service`:
snapshots, subscriptions, writes, actions), ``ticktable_proto.v1.TableService``
(:mod:`flight.rpc.table_service`), the standard health service and server reflection. One
interceptor checks the bearer token for every service but health; TLS when a certificate
and key are given. The port is bound exclusively (``SO_REUSEPORT`` off): a port in use is
an error at start, never a shared port.

Embedding::

    graph = UpdateGraph(); graph.start(0.1)
    with TicktableServer(graph, ServerConfig(port=0)) as server:
        print(server.location)
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
from grpc_health.v1 import health_pb2

from engine.errors import (
    InputError,
    PermissionDenied,
    PortInUse,
    ProtocolError,
    ServiceError,
    TableExists,
    Unauthenticated,
)
from engine.graph import UpdateGraph
from flight.durability.durable import Durability, RecoveryReport
from flight.ingest.backlog import Backlog
from flight.ingest.put import PutHandler
from flight.ingest.staging import StagingArea
from flight.limits import (
    MAX_COLUMNS,
    MAX_PENDING_BYTES,
    MAX_PUT_BATCH_BYTES,
    MAX_STAGED_BYTES_PER_WRITE,
    MAX_SUBSCRIPTIONS_PER_CLIENT,
    MAX_TABLES,
    MAX_VALUE_BYTES,
    PUT_WAIT,
    PUT_WINDOW_BYTES,
)
from flight.links import Link, Links, MirrorSpec, parse_mirror
from flight.links.follow import OriginFollower
from flight.links.spec import one_line, origin_schema
from flight.metrics import Metrics
from flight.pb import flight_pb2 as pb
from flight.rpc.aio import AioServer
from flight.rpc.call_log import CallLog
from flight.rpc.requests import parse
from flight.streams.filtered import FilteredTables
from flight.streams.per_client import SubscriptionsPerClient
from flight.streams.registry import TableRegistry, quoted
from flight.streams.subscription import Subscriber, SubscriptionOptions
from flight.wire import TableKind, action_named

if TYPE_CHECKING:
    from flight.sql.service import FlightSqlService
    from flight.web.link import WebProcess

__all__ = ["ServerConfig", "TicktableServer"]

log = logging.getLogger(__name__)

#: Largest HTTP/2 frame the server accepts (what gRPC's BDP probing would have raised the
#: 16 KiB default to for a fast sender): a few frames for a batch of megabytes.
_MAX_FRAME_BYTES = 4 << 20

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8


def keep_freed_memory(trim_bytes: int = 256 << 20, mmap_bytes: int = 32 << 20) -> bool:
    """Let glibc's malloc reuse freed memory for large blocks rather than return it at once.

    gRPC hands each received message to Python as a ``bytes`` object (a DoPut batch is a few
    MB). By default glibc maps every block this large fresh and unmaps it when freed, or
    trims the heap as soon as a few MB at its top are free, so every message is copied into
    new pages the kernel must zero first, the largest single cost of a DoPut stream. Blocks
    up to ``mmap_bytes`` come from the heap, and up to ``trim_bytes`` freed at its top are
    kept for the next ones.

    Threads keep the heaps they allocate from, too. By default glibc gives each thread a
    heap of its own (a 64 MB mapping) and unmaps a heap as soon as all of it is free,
    whatever the trim threshold: a DoPut stream's messages, received on the event loop's
    thread and freed after the cycle that applied them, came back to fresh pages, faulted
    in one by one on the event loop. Threads created from now on share the heaps there
    are, and with a 64 MB top pad glibc keeps an emptied heap mapped (it unmaps one only
    when the heap before it has that much to spare): the next messages land in pages that
    are already there (bench_flight's ingest section; figures in bench/README.md).

    Process-wide; call it before the server's threads start. A no-op (returning
    ``False``) where the C library is not glibc.
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_bytes)
                    and libc.mallopt(_M_TRIM_THRESHOLD, trim_bytes)
                    and libc.mallopt(_M_TOP_PAD, 64 << 20)
                    and libc.mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False


@dataclass(slots=True)
class ServerConfig:
    """How the server listens and its limits.

    Attributes
    ----------
    host, port
        The listening address of every service (port 0: pick a free one).
    token
        Bearer token every call must present (``None``: no authentication).
    read_token
        A second bearer token, for reading only: snapshots, subscriptions, listings and
        stats; writes, creates, drops and compositions answer PERMISSION_DENIED
        (:mod:`flight.rpc.auth`). Needs ``token``.
    tls_cert, tls_key
        PEM certificate chain and private key: serve TLS (``grpc+tls://``).
    max_batch_rows
        Upper bound on rows per record batch sent to subscribers.
    max_metadata_bytes
        Largest ``app_metadata`` accepted from a client.
    max_put_batch_bytes
        Largest record batch accepted by DoPut (``ticktable serve --max-message-bytes``);
        gRPC refuses any message more than ``max_metadata_bytes`` + 1 MiB larger.
    max_value_bytes
        Longest string or binary value a DoPut batch may hold.
    max_columns
        Columns a table may have (created, or derived).
    max_tables
        Tables the server holds at most, source and derived.
    max_subscriptions_per_client
        Subscriptions open at once from one client address (its host, any port).
    max_staged_bytes_per_write
        Bytes one uncommitted write (one ``write_id``) may hold.
    max_pending_bytes, put_wait
        Bytes of writes a table may have waiting for its next cycle; a DoPut batch past it
        waits for a cycle to take them, at most ``put_wait`` seconds, and is then refused
        with RESOURCE_EXHAUSTED (:mod:`flight.ingest.backlog`).
    put_window_bytes
        How far a writer may send ahead of what the server has read: the HTTP/2 window the
        server announces for each stream, fixed (gRPC's BDP probing, which grows it to
        megabytes, is off), besides the message the server is reading. Writes queued in
        the transport are acknowledged late; this keeps them to a few batches, so a writer
        faster than the server waits in its write call (flow control) instead.
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
        How long :meth:`TicktableServer.shutdown` waits for in-flight calls to finish
        before cancelling them.
    metrics_port
        Serve Prometheus metrics over HTTP at ``/metrics`` on this port of ``host`` (0: any
        free one; ``None``: no metrics endpoint): :mod:`flight.metrics`.
    max_calls
        Calls served at once (each stream holds one of them while it lasts); more are
        refused with RESOURCE_EXHAUSTED.
    http_port
        Serve the web UI (:mod:`flight.web`) on this port of ``host`` (0: any free one;
        ``None``: no web UI), gated by the same tokens and on the same TLS certificate.
    web_feed
        How the web UI feeds a grid by default: ``"perspective"`` (Perspective's Python
        server holds the table) or ``"arrow"`` (Arrow IPC into the browser's engine).
    web_interval
        Seconds between two changes sent to one grid at most (what a table changes in
        between is composed into the next): the web path's cost follows this rate, not
        the cycle rate.
    web_sched
        How the web UI's process (:mod:`flight.web.link`) runs: ``"idle"`` (``SCHED_IDLE``:
        only on cores the server leaves idle; on a machine kept busy by other work the page
        may stall, the server never) or ``"nice"`` (nice 19: a small share even then).
    sql_timeout
        Seconds a Flight SQL query may run, from its start to its last batch read
        (:mod:`flight.sql.query`); past it DuckDB is interrupted and the client gets
        DEADLINE_EXCEEDED.
    sql_memory_mb
        Memory DuckDB may use for all running queries together; a query past it gets
        RESOURCE_EXHAUSTED.
    mirrors
        Tables of other servers to mirror here (:mod:`flight.links`): each a
        :class:`~flight.links.MirrorSpec` or its text
        ``URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]``
        (:func:`~flight.links.parse_mirror`). A durable server also brings back the mirrors
        it had (:meth:`TicktableServer.mirror`); one given here again, by its local name,
        starts once. One with columns or a filter is checked against its origin table's
        schema by :meth:`TicktableServer.start`, before the port is bound (see
        ``mirror_timeout``), unless the server remembers it as it is given.
    mirror_of
        Servers to mirror whole (``ticktable serve --mirror-of``): every table of each,
        following its creates and drops (:mod:`flight.links.follow`).
    mirror_token
        The bearer token mirrors present to their origins (a spec's own token wins).
    mirror_give_up
        Seconds a mirror may stay out of sync before it stops trying and fails (``None``:
        it retries for ever).
    mirror_timeout
        Seconds :meth:`TicktableServer.start` waits for the origin of a mirror with columns
        or a filter to answer with its table's schema (``ticktable serve --mirror
        URI/TABLE?filter=...``); past it, start fails with a ServiceError.
    filter_linger
        Seconds the table of a filtered subscription (one per table and filter, shared:
        :mod:`flight.streams.filtered`) is kept after its last subscriber left, so that a
        subscriber reconnecting within that time resumes with the updates it missed.

    A request past a limit is refused with RESOURCE_EXHAUSTED naming the limit and its
    ``ticktable serve`` flag; :mod:`flight.limits` has the table of limits and defaults.
    data_dir
        Where durable tables live (journal and checkpoints, :mod:`flight.durability.durable`); tables
        created through the server come back after a restart. ``None``: in memory only.
    checkpoint_bytes, checkpoint_seconds
        A checkpoint is written once the journal grew by this many bytes, or this many
        seconds passed with something journaled.
    """

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    read_token: str | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    max_batch_rows: int = 65_536
    max_metadata_bytes: int = 1 << 20
    max_put_batch_bytes: int = MAX_PUT_BATCH_BYTES
    max_value_bytes: int = MAX_VALUE_BYTES
    max_columns: int = MAX_COLUMNS
    max_tables: int = MAX_TABLES
    max_subscriptions_per_client: int = MAX_SUBSCRIPTIONS_PER_CLIENT
    max_staged_bytes_per_write: int = MAX_STAGED_BYTES_PER_WRITE
    max_pending_bytes: int = MAX_PENDING_BYTES
    put_wait: float = PUT_WAIT
    put_window_bytes: int = PUT_WINDOW_BYTES
    history_updates: int = 256
    max_pending: int = 32
    stage_ttl: float = 600.0
    end_grace_seconds: float = 10.0
    shutdown_timeout: float = 30.0
    data_dir: str | PathLike[str] | None = None
    checkpoint_bytes: int = 512 << 20
    checkpoint_seconds: float = 300.0
    max_calls: int = 1000
    metrics_port: int | None = None
    http_port: int | None = None
    web_feed: str = "perspective"
    web_interval: float = 0.05
    web_sched: str = "idle"
    sql_timeout: float = 60.0
    sql_memory_mb: int = 2048
    mirrors: list[Any] = field(default_factory=list)
    mirror_of: list[str] = field(default_factory=list)
    mirror_token: str | None = None
    mirror_give_up: float | None = None
    mirror_timeout: float = 30.0
    filter_linger: float = 60.0

    def check(self) -> None:
        """Refuse a setting out of its range, naming it (:class:`TicktableServer` calls this
        first, before anything is bound or read).

        Raises
        ------
        InputError
            For the first setting out of range: a port outside 0-65535 (gRPC would wrap
            70000 to 4464), a count below 1, negative seconds, a read token without a
            token or equal to it, a TLS certificate without its key.
        """
        for name in ("port", "metrics_port", "http_port"):
            value = getattr(self, name)
            if value is None and name != "port":
                continue
            if not _is_int(value) or not 0 <= value <= 65535:
                raise InputError(f"{name} is {value!r}: a port is 0 (any free one) to 65535"
                                 + ("" if name == "port" else ", or None for none"))
        for name in ("max_batch_rows", "max_metadata_bytes", "max_put_batch_bytes",
                     "max_value_bytes", "max_columns", "max_tables",
                     "max_subscriptions_per_client", "max_staged_bytes_per_write",
                     "max_pending_bytes", "put_window_bytes", "max_pending", "max_calls", "checkpoint_bytes", "sql_memory_mb"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InputError(f"{name} is {value!r}: it must be an integer of at least 1")
        if not _is_int(self.history_updates) or self.history_updates < 0:
            raise InputError(f"history_updates is {self.history_updates!r}: it must be an "
                             f"integer of at least 0")
        for name in ("stage_ttl", "end_grace_seconds", "shutdown_timeout", "web_interval",
                     "filter_linger", "put_wait"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value >= 0:
                raise InputError(f"{name} is {value!r}: it must be a number of seconds, 0 or more")
        for name in ("checkpoint_seconds", "sql_timeout"):
            seconds: object = getattr(self, name)
            if not isinstance(seconds, int | float) or not seconds > 0:
                raise InputError(f"{name} is {seconds!r}: it must be a number of seconds "
                                 f"above 0")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise InputError("TLS needs both a certificate and a key")
        if self.read_token and not self.token:
            raise InputError("a read token needs a token too: without one every call may write")
        if self.read_token and self.read_token == self.token:
            raise InputError("the read token must differ from the token")


def _unbound(host: str, port: int, address: str) -> str:
    """Why gRPC could not bind ``address`` (it does not say): a host that is no address, an
    address of another machine, or the port (in use, or below 1024 without the right)."""
    import errno
    import os
    import socket

    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return f"cannot listen on {address}: the host {host!r} is not an address ({reason})"
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            return f"cannot listen on {address}: {reason} (is {host} an address of this machine?)"
    return f"cannot listen on {address}: the port is in use or not allowed"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ticktable")
    except PackageNotFoundError:
        return "0+unknown"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TicktableServer:
    """Flight, the TableService, health and reflection over one :class:`UpdateGraph`.

    Parameters
    ----------
    graph
        The update graph (run its cycles with ``graph.start(interval)``).
    config
        Addresses, credentials and limits.
    registry
        Tables to serve (a new, empty registry by default).

    Raises
    ------
    InputError
        If a setting of ``config`` is out of range (:meth:`ServerConfig.check`).

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
        cfg = self.config
        cfg.check()
        self.registry = registry or TableRegistry(graph, history_updates=cfg.history_updates,
                                                  max_tables=cfg.max_tables,
                                                  max_columns=cfg.max_columns)
        self.staging = StagingArea(self.registry, stage_ttl=cfg.stage_ttl,
                                   max_staged_bytes_per_write=cfg.max_staged_bytes_per_write)
        self.durability = Durability(graph, self.registry, self.staging,
                                     data_dir=self.config.data_dir,
                                     checkpoint_bytes=self.config.checkpoint_bytes,
                                     checkpoint_seconds=self.config.checkpoint_seconds)
        self.recovery: RecoveryReport | None = None
        self.metrics: Metrics | None = None
        #: admits writes while a table's writes waiting for a cycle stay bounded
        self.backlog = Backlog(graph, max_pending_bytes=cfg.max_pending_bytes,
                               wait_seconds=cfg.put_wait, on_wait=self._on_put_wait)
        self.puts = PutHandler(self.registry, self.durability,
                               max_metadata_bytes=self.config.max_metadata_bytes,
                               max_batch_bytes=self.config.max_put_batch_bytes,
                               max_value_bytes=self.config.max_value_bytes,
                               backlog=self.backlog)
        self.sub_options = SubscriptionOptions(max_batch_rows=self.config.max_batch_rows,
                                               max_pending=self.config.max_pending)
        self._subs: dict[int, Subscriber] = {}
        #: the tables of filtered subscriptions, shared per table and filter; not listed
        self.filters = FilteredTables(self.registry, linger=cfg.filter_linger)
        #: subscriptions open per client address, at most max_subscriptions_per_client each
        self.subscriptions_per_client = SubscriptionsPerClient(cfg.max_subscriptions_per_client)
        self._subs_lock = threading.Lock()
        self._stuck_readers = 0
        self._cycle_ms: collections.deque[float] = collections.deque(maxlen=1000)
        self._remove_terminal = graph.add_terminal_listener(self._on_cycle)
        self._grpc: AioServer | None = None
        self._port: int | None = None
        self.metrics_port: int | None = None
        self.web: WebProcess | None = None
        #: the Flight SQL service, built by the first call that needs it (:attr:`sql`)
        self._sql: FlightSqlService | None = None
        self._sql_lock = threading.Lock()
        self.links = Links(self)
        self.followers: list[OriginFollower] = []
        self._mirrors = [self._mirror_spec(m) for m in cfg.mirrors]  # bad text: refused now

    # ------------------------------------------------------------------ lifecycle
    @property
    def sql(self) -> FlightSqlService:
        """The server's Flight SQL service (:mod:`flight.sql`), built on first use: by the
        first Flight SQL call, or the recovery of a SQL view. A server that never serves
        SQL does not import or start the SQL engine (sqlglot, DuckDB: ~0.3 s of a start)."""
        sql = self._sql
        if sql is not None:
            return sql
        with self._sql_lock:
            if self._sql is None:
                from flight.sql.service import FlightSqlService

                cfg = self.config
                sql = FlightSqlService(self, version=_version(), timeout=cfg.sql_timeout,
                                       memory_mb=cfg.sql_memory_mb)
                if self.metrics is not None:
                    self._sql_metrics(sql, self.metrics)
                self._sql = sql
            return self._sql

    @staticmethod
    def _sql_metrics(sql: FlightSqlService, metrics: Metrics) -> None:
        sql.runner.on_done = metrics.on_query
        metrics.sql_runner = sql.runner

    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.config.tls_cert else "grpc"

    @property
    def location(self) -> str:
        """The Flight URI clients connect to."""
        return f"{self.scheme}://{self.config.host}:{self.port}"

    @property
    def port(self) -> int:
        """The port every service is on."""
        if self._port is None:
            raise RuntimeError("the server is not started")
        return self._port

    @property
    def grpc_port(self) -> int:
        """The TableService's port: the same as :attr:`port` (kept for callers of the
        two-port server)."""
        return self.port

    def start(self, prepare: Callable[[TicktableServer], None] | None = None) -> TicktableServer:
        """Recover durable tables, bind the port and serve in the background.

        With a ``data_dir``, the last acknowledged state comes back first (call this before
        ``graph.start``): see :meth:`flight.durability.durable.Durability.recover`.

        Parameters
        ----------
        prepare
            Called with the server after the recovery and before the port is bound: tables
            it registers are there from the first answer (the health check's SERVING
            included), as ``ticktable serve --demo``'s are. If it raises, nothing is served.

        Returns
        -------
        TicktableServer
            ``self``.

        Raises
        ------
        PortInUse
            If the port cannot be bound (in use, or not allowed).
        """
        cfg = self.config
        keep_freed_memory()  # before the threads recovery and serving start
        if self.durability.durable and self.recovery is None:
            from flight.rpc.table_service import derived_builder

            self.durability.set_deriver(derived_builder(
                self.registry, views=lambda request: self.sql.build_view(request)))
            try:
                self.recovery = self.durability.recover()
            except BaseException:
                self.durability.close(checkpoint=False)  # release the data dir
                raise
        try:
            # counted always (the stats action shows them); served over HTTP on request
            self.metrics = Metrics(self)
            self.durability.on_put = self.metrics.on_put
            if self._sql is not None:  # built by the recovery of a view
                self._sql_metrics(self._sql, self.metrics)
            if self.durability.journal is not None:
                self.durability.journal.on_flush = self.metrics.on_flush
            # a mirror's columns and filter are checked before the port is bound: a bad
            # one stops the start, with nothing served
            self._mirrors = [self._checked(spec) for spec in self._mirrors]
            if prepare is not None:
                prepare(self)
            self._grpc, self._port = self._serve()
            if cfg.metrics_port is not None:
                self.metrics_port = self.metrics.serve(cfg.metrics_port, cfg.host)
            if cfg.http_port is not None:
                from flight.web.link import WebProcess

                self.web = WebProcess(self, cfg.http_port, feed=cfg.web_feed,
                                      min_interval=cfg.web_interval,
                                      sched=cfg.web_sched).start()
        except BaseException:
            if self._grpc is not None:
                self._grpc.stop(None)
                self._grpc = None
            if self.metrics is not None:
                self.metrics.close()
                self.metrics = None
            if self.web is not None:
                self.web.close()
                self.web = None
            self.durability.close(checkpoint=False)  # release the data dir and the graph
            self._remove_terminal()
            raise
        self.staging.start_janitor(min(60.0, max(1.0, cfg.stage_ttl / 4)))
        self.durability.start()
        self._start_mirrors()
        log.info("serving Flight, the TableService, health and reflection at %s", self.location)
        return self

    def _serve(self) -> tuple[AioServer, int]:
        from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

        from flight.pb import arrow_flight_pb2, table_service_pb2
        from flight.rpc.auth import BearerTokenInterceptor
        from flight.rpc.flight_service import SERVICE_NAME as FLIGHT_SERVICE
        from flight.rpc.flight_service import FlightService
        from flight.rpc.table_service import SERVICE_NAME, add_table_service

        cfg = self.config
        options = [
            ("grpc.so_reuseport", 0),  # a port in use is an error, never a shared port
            # room for a batch at its limit with its metadata; past it gRPC answers
            # RESOURCE_EXHAUSTED itself, before a handler sees the message
            ("grpc.max_receive_message_length",
             min(cfg.max_put_batch_bytes + cfg.max_metadata_bytes + (1 << 20), (1 << 31) - 1)),
            ("grpc.max_send_message_length", -1),
            # flow control that holds a writer the server cannot keep up with: a fixed
            # window per stream (BDP probing would grow it to megabytes, each queued unread
            # and acknowledged seconds late), and large frames, so that a large batch,
            # whose whole size is announced once the server reads it, still comes in a few
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", cfg.put_window_bytes),
            ("grpc.http2.max_frame_size", _MAX_FRAME_BYTES),
        ]
        address = f"{cfg.host}:{cfg.port}"

        def setup(server: grpc.aio.Server) -> int:  # on the server's event loop
            server.add_generic_rpc_handlers((FlightService(self).handler(),))
            health = add_table_service(server, self.registry, durability=self.durability)
            health.set(FLIGHT_SERVICE, health_pb2.HealthCheckResponse.SERVING)
            # the sync servicer: every handler runs on a thread (flight.rpc.aio)
            reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
                reflection.ReflectionServicer((
                    arrow_flight_pb2.DESCRIPTOR.services_by_name["FlightService"].full_name,
                    table_service_pb2.DESCRIPTOR.services_by_name["TableService"].full_name,
                    "grpc.health.v1.Health", reflection.SERVICE_NAME)), server)
            assert SERVICE_NAME == "ticktable_proto.v1.TableService"
            try:
                if cfg.tls_cert and cfg.tls_key:
                    bound = server.add_secure_port(
                        address, grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)]))
                else:
                    bound = server.add_insecure_port(address)
            except RuntimeError as exc:  # grpcio raises when it cannot bind
                raise PortInUse(_unbound(cfg.host, cfg.port, address)) from exc
            if not bound:
                raise PortInUse(_unbound(cfg.host, cfg.port, address))
            return int(bound)

        server = AioServer(setup, [CallLog(self.metrics),
                                   *([BearerTokenInterceptor(cfg.token, cfg.read_token)]
                                     if cfg.token else [])],
                           max_calls=cfg.max_calls, options=options,
                           give_way=self.graph.give_way,
                           # DoGet starts on the loop: a Flight SQL result read whole
                           # when its query started needs no thread (flight.rpc.aio)
                           loop_first=[f"/{FLIGHT_SERVICE}/DoGet"])
        return server, server.start()

    def serve_forever(self) -> None:
        """Block until :meth:`shutdown` (or a signal) stops the server."""
        if self._grpc is None:
            self.start()
        server = self._grpc
        assert server is not None
        while not server.wait(0.5):  # a timeout, so signals reach the main thread
            pass

    def shutdown(self) -> bool:
        """Stop serving: subscriptions end, staged writes are dropped.

        Every subscriber is sent an end-of-stream message; new calls are refused at once,
        calls in flight get ``config.shutdown_timeout`` to finish and are then cancelled.
        Returns ``False`` if some were still open then.
        """
        if self.web is not None:
            self.web.close()
            self.web = None
        for follower in self.followers:
            follower.close()
        self.links.close()
        with self._subs_lock:
            subs = list(self._subs.values())
        for sub in subs:
            sub.close()
        self.filters.close()
        self.backlog.close()  # a write waiting for room is refused now, not after put_wait
        clean = True
        if self._grpc is not None:
            clean = self._grpc.stop(grace=self.config.shutdown_timeout)
            if not clean:
                log.error("shutdown: calls still open %.0f s after they were cancelled",
                          self.config.shutdown_timeout + 5.0)
            self._grpc = None
        self.staging.stop()
        with self._sql_lock:
            if self._sql is not None:
                self._sql.close()
        self.durability.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self._remove_terminal()
        return clean

    def __enter__(self) -> TicktableServer:
        return self.start() if self._grpc is None else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def mirror(self, spec: MirrorSpec | str) -> Link:
        """Mirror a table of another server here (``ticktable serve --mirror``): a table
        of kind ``mirror``, registered once the origin answers (see :mod:`flight.links`).

        On a durable server the mirror is journaled (what it follows, not its token) and
        comes back after a restart, resuming from its last checkpoint
        (:mod:`flight.durability.durable`).

        A text with a filter (``URI/TABLE?filter=CONDITION``) is compiled against the
        origin table's schema, read first (waiting up to ``config.mirror_timeout``).

        Raises
        ------
        InputError
            For a text that is not ``URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]``, or
            a filter that does not fit the origin's table (:meth:`MirrorSpec.bind`).
        TableExists
            If the local name is taken.
        ServiceError
            If the origin of a text with a filter did not answer in time.
        """
        spec = self._mirror_spec(spec)
        if spec.where is not None and spec.filter is None:
            spec = self._checked(spec)
        self.links.check(spec)  # refused before it is journaled
        return self.durability.mirror(spec.name, spec.to_json(), lambda: self.links.add(spec))

    def _checked(self, spec: MirrorSpec) -> MirrorSpec:
        """``spec`` with its columns checked and its filter compiled against the origin's
        schema (:meth:`MirrorSpec.bind`). A spec the server remembers as it is (a durable
        restart with the same ``--mirror``) is taken as remembered, with its filter's
        bytes: the origin need not be up."""
        if spec.columns is None and spec.where is None:
            return spec
        doc = self.durability.mirrors.get(spec.name)
        if doc is not None:
            known = MirrorSpec.from_json(doc, token=spec.token)
            if dataclasses.replace(known, filter=spec.filter) == spec:
                return known
        try:
            schema = origin_schema(spec, self.config.mirror_timeout)
        except TimeoutError as exc:
            raise ServiceError(f"{exc}: its columns and filter are checked against the "
                               f"origin's table before the server starts (--mirror-timeout)"
                               ) from None
        except (fl.FlightError, pa.ArrowException) as exc:  # the origin answered, refusing
            access = {fl.FlightUnauthenticatedError: Unauthenticated,
                      fl.FlightUnauthorizedError: PermissionDenied}.get(type(exc))
            what = f"mirror {spec.name!r}: {spec.origin} did not give its schema: {one_line(exc)}"
            if access is not None:
                raise access(f"{what} (the origin's token: --mirror-token)") from None
            raise ServiceError(what) from None
        return spec.bind(schema)

    def _start_mirrors(self) -> None:
        """Start the mirrors recovery remembered and those of ``config.mirrors``: a mirror
        given again (by its local name) starts once, following what the config says."""
        given = {spec.name for spec in self._mirrors}
        for name, doc in self.durability.mirrors.items():
            if name in given:
                continue
            try:
                self.links.add(self._mirror_spec(MirrorSpec.from_json(doc)))
            except TableExists as exc:  # a table created under its name before it connected
                log.error("mirror %r of %s/%s not resumed: %s", name, doc["uri"], doc["table"], exc)
        for spec in self._mirrors:
            self.mirror(spec)
        cfg = self.config
        self.followers = [OriginFollower(self, uri, token=cfg.mirror_token,
                                         give_up_after=cfg.mirror_give_up).start()
                          for uri in cfg.mirror_of]

    def _mirror_spec(self, spec: MirrorSpec | str) -> MirrorSpec:
        cfg = self.config
        if isinstance(spec, str):
            spec = parse_mirror(spec, give_up_after=cfg.mirror_give_up)
        if spec.token is None and cfg.mirror_token is not None:
            spec = dataclasses.replace(spec, token=cfg.mirror_token)
        return spec

    # ------------------------------------------------------------------ bookkeeping
    def read_only(self, context: grpc.ServicerContext) -> bool:
        """Whether a call came with the read-only token (:mod:`flight.rpc.auth`)."""
        from flight.rpc.auth import is_read_only

        return is_read_only(context.invocation_metadata(), self.config.token,
                            self.config.read_token)

    def track_subscription(self, sub: Subscriber, delta: int) -> None:
        """Count ``sub`` as open (``delta`` +1) or closed (-1): :attr:`subscriptions`."""
        with self._subs_lock:
            if delta > 0:
                self._subs[id(sub)] = sub
            else:
                self._subs.pop(id(sub), None)
        sql = self._sql  # no SQL service yet: no temporary view either
        if delta > 0 and sql is not None:
            sql.subscribed(sub.entry.name)  # a temporary view goes when they all leave

    @property
    def subscriptions(self) -> list[Subscriber]:
        with self._subs_lock:
            return list(self._subs.values())

    def _on_cycle(self, step: int) -> None:
        self._cycle_ms.append(self.graph.last_cycle_seconds * 1e3)

    def _on_put_wait(self, table: str, seconds: float) -> None:
        metrics = self.metrics
        if metrics is not None:
            metrics.on_put_wait(table, seconds)

    # --------------------------------------------------------------------- actions
    def action(self, kind: str, body: bytes) -> bytes | None:
        """Run one DoAction (a row of :data:`flight.wire.ACTIONS`): the method of its name,
        with the body parsed as its request; returns the serialized result (or ``None``)."""
        row = action_named(kind)
        run = getattr(self, row.name)
        out = run() if row.request is None else run(parse(row.request(), body, row.name))
        return None if row.result is None else bytes(out.SerializeToString())

    def create_table(self, req: pb.CreateTableRequest) -> None:
        """The ``create_table`` action: a source table (:data:`flight.wire.CREATE_TABLE`)."""
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(req.schema))
            _ = [f.name for f in schema]  # field names must be UTF-8
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # also an Int128
            raise ProtocolError(f"create_table {quoted(req.name)}: schema is not an Arrow "
                                f"IPC schema ({exc})") from exc
        kind = TableKind.from_proto(req.kind)
        if kind is None:
            raise ProtocolError(f"create_table {quoted(req.name)}: unknown kind {req.kind}")
        self.durability.create_table(req.name, schema, kind, keys=list(req.keys),
                                     capacity=int(req.capacity),
                                     if_not_exists=req.if_not_exists)

    def drop_table(self, req: pb.DropTableRequest) -> None:
        """The ``drop_table`` action (:data:`flight.wire.DROP_TABLE`); a mirror whose origin
        never answered (no table yet) is forgotten too."""
        if req.name not in self.registry.names() and self.links.forget(req.name):
            return
        self.registry.get(req.name)
        self.durability.drop_table(req.name)

    def commit(self, req: pb.CommitRequest) -> pb.CommitResult:
        """The ``commit`` action: publish a staged write (:data:`flight.wire.COMMIT`)."""
        return self.durability.commit(req)

    def abort(self, req: pb.AbortRequest) -> None:
        """The ``abort`` action: drop a staged write (:data:`flight.wire.ABORT`)."""
        self.durability.abort(req)

    def stats(self) -> pb.Stats:
        """The ``stats`` action (:data:`flight.wire.STATS`): per table size, last step,
        subscribers and lag, changes and DoPut rows/bytes; cycle durations; error answers
        by code; the journal's size and flush latency (the numbers of the metrics endpoint,
        :mod:`flight.metrics`); the web UI's process."""
        ms = np.asarray(self._cycle_ms, dtype=np.float64)
        out = pb.Stats(step=self.graph.step, last_cycle_ms=self.graph.last_cycle_seconds * 1e3,
                       cycle_p50_ms=float(np.median(ms)) if ms.size else 0.0,
                       cycle_p99_ms=float(np.percentile(ms, 99)) if ms.size else 0.0,
                       open_stages=self.staging.open_stages,
                       table_service_port=self._port or 0)
        counts = self.metrics.totals() if self.metrics is not None else None
        subs = self.subscriptions
        for e in self.registry.entries():
            mine = [s for s in subs if s.entry.listed is e]  # filtered subscriptions too
            last = e.table.last_step
            # behind its own table: a filtered one is silent while its parent's changes miss it
            lag = max((max(0, s.entry.table.last_step - s.step) for s in mine), default=0)
            t = pb.TableStats(
                name=e.name, size=len(e.table.rowset), last_step=last, subscribers=len(mine),
                max_lag_steps=lag, kind=e.kind,
                sequence=e.publisher.sequence if e.publisher else 0)
            link = e.status() if e.status is not None else None
            if link is not None:
                t.link.CopyFrom(link)
            if counts is not None:
                t.changes = counts.changes.get(e.name, 0)
                t.put_rows = counts.put_rows.get(e.name, 0)
                t.put_bytes = counts.put_bytes.get(e.name, 0)
            out.tables.append(t)
        if counts is not None:
            out.errors.update(counts.errors)
            out.journal_flushes = counts.flushes
            out.journal_flush_p50_ms = counts.flush_p50_ms
            out.journal_flush_p99_ms = counts.flush_p99_ms
        journal = self.durability.journal
        out.journal_bytes = journal.size_bytes() if journal is not None else 0
        if self.web is not None:
            web = self.web
            out.web.CopyFrom(pb.WebStats(url=web.url, running=web.running, pid=web.pid or 0,
                                         restarts=web.restarts, open_tables=len(web.feeds)))
        return out
