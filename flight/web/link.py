"""The web UI in a process of its own, fed by the server over a local socket (issue #17).

The page's work (Perspective's engine applying changes and answering the viewers, the
HTTP server and its websockets) runs in a child process, ``python -m flight.web.child``,
under ``SCHED_IDLE`` (or nice 19, :data:`SCHEDS`): it uses the cores only when the server
does not, and a web process starved by a busy machine stalls only itself, never the
server (it has a GIL of its own). In the server only the feeds stay
(:class:`~flight.web.feed.TableFeed`: the changes built under the graph's shared lock), one
per table the page has open.

The link is one ``socketpair`` carrying :mod:`multiprocessing.connection` messages (a
pickled tuple each; a change's rows follow as one raw message of Arrow IPC bytes):

=================================================  =============================================
child -> server                                    server -> child
=================================================  =============================================
``("ready", port)`` / ``("error", kind, text)``    first: :class:`Settings` (tokens, TLS, ...)
``("tables", rid)``                                ``("tables", rid, step, [table dicts])``
``("follow", fid, name)``                          ``("followed", fid)`` or ``("refused", fid,
                                                   kind, text)``, then ``("change", fid, ...)``
``("ack", fid)`` once a change was applied         at most one unacknowledged change per feed
``("log", level, logger, text)``                   (logged by the server's own handlers)
``("unfollow", fid)``                              ``("failed", fid, kind, text)``: table gone
-                                                  ``("stop",)``: close and exit
=================================================  =============================================

A feed waits for the child's ``ack`` before it builds its next change, so a slow page or a
busy web process makes the server compose more, never queue. When the server's process
ends, the child reads the end of the socket and exits. When the web process ends on its
own (killed, crashed), the server stops its feeds and starts a new one on the same port
(at most :data:`RESTARTS` times in :data:`RESTART_WINDOW` seconds); open pages reconnect.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

import flight
from engine.errors import PortInUse, TableFailed, TableNotFound, TicktableError
from engine.graph import UpdateGraph
from flight.links.link import GAVE_UP
from flight.pb import flight_pb2 as pb
from flight.streams.registry import TableRegistry
from flight.web.feed import FEEDS, Change, TableFeed, ipc_buffer
from flight.wire import TableKind

if TYPE_CHECKING:
    from flight.links import Links

__all__ = ["SCHEDS", "Settings", "WebProcess", "link_json", "read_change", "write_change"]

log = logging.getLogger(__name__)

#: How the web process runs: ``idle`` (SCHED_IDLE, the default) or ``nice`` (nice 19).
SCHEDS = ("idle", "nice")
_READY_TIMEOUT = 60.0
#: Restarts of a web process that ended on its own, at most, in any RESTART_WINDOW seconds.
RESTARTS = 5
RESTART_WINDOW = 60.0


@dataclass(frozen=True)
class Settings:
    """What the web process needs from the server's configuration (sent over the link, so
    tokens and keys never show in a process list)."""

    host: str
    port: int
    feed: str
    token: str | None
    read_token: str | None
    tls_cert: bytes | None
    tls_key: bytes | None
    sched: str = "idle"
    log_level: int = logging.INFO
    #: the listening sockets' file descriptors, which the server binds and the web process
    #: inherits (the same numbers there)
    fds: tuple[int, ...] = ()


def write_change(conn: Connection, fid: int, change: Change) -> None:
    """Send ``change`` of feed ``fid`` (two messages: the header, then the rows' IPC)."""
    conn.send(("change", fid, change.snapshot, change.step, change.sequence, change.updates,
               change.size, change.removes.astype("<i8").tobytes()))
    conn.send_bytes(memoryview(ipc_buffer(change.upserts)))  # no copy into bytes


def read_change(header: tuple[Any, ...], conn: Connection) -> tuple[int, Change]:
    """The change whose ``header`` :func:`write_change` sent (reads its rows from ``conn``)."""
    _, fid, snapshot, step, sequence, updates, size, removes = header
    upserts = pa.ipc.open_stream(conn.recv_bytes()).read_all()
    return fid, Change(snapshot, upserts, np.frombuffer(removes, "<i8").astype(np.int64), step,
                       sequence, updates, size)


def link_json(status: pb.LinkStatus) -> dict[str, Any]:
    """A mirror's link status as the table list shows it (``null`` for other tables):
    whether it is in sync, its state (``"in sync"``, ``"disconnected"``...), the table
    mirrored (``URI/TABLE``), why it is not in sync, its reconnects and for how long."""
    return {"in_sync": status.in_sync, "state": status.state, "origin": status.origin,
            "detail": status.detail, "reconnects": status.reconnects,
            "out_of_sync_seconds": round(status.out_of_sync_seconds, 3)}


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (all of IPv4 and IPv6 for ``""``/``"::"``)."""
    if host in ("", "::") and socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, backlog=128,
                                    dualstack_ipv6=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host or "0.0.0.0", port), family=family, backlog=128)


def _child_path() -> str:
    """The web process's ``PYTHONPATH``, under which it imports the very ``flight`` package
    this process runs: our path, and this package's root first unless an entry of our path
    is that root (an editable install finds it through a finder, not a path entry)."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(flight.__file__)))
    path = [p for p in sys.path if p]  # "" is the working directory, which the child skips
    if root not in (os.path.realpath(p) for p in path):
        path.insert(0, root)
    return os.pathsep.join(path)


class Served(Protocol):
    """What the link needs of the server (:class:`~flight.server.TicktableServer`)."""

    @property
    def config(self) -> Any: ...  # ServerConfig: host, tokens, TLS

    @property
    def registry(self) -> TableRegistry: ...

    @property
    def graph(self) -> UpdateGraph: ...

    @property
    def subscriptions(self) -> Any: ...  # the Flight subscriptions (``.entry.name``)

    @property
    def links(self) -> Links: ...


class _LinkFeed:
    """A :class:`TableFeed` whose changes go to the web process, one at a time."""

    def __init__(self, link: WebProcess, fid: int, name: str) -> None:
        self.link, self.fid, self.name = link, fid, name
        self._acked = threading.Semaphore(0)
        self._closed = threading.Event()
        self.feed = TableFeed(link.server.registry.get(name), self._deliver,
                              max_pending=link.max_pending, on_failure=self._failed,
                              min_interval=link.min_interval)

    def _deliver(self, change: Change) -> None:
        if self._closed.is_set() or not self.link.send_change(self.fid, change):
            return
        while not self._acked.acquire(timeout=0.5):  # the page applied it
            if self._closed.is_set():
                return

    def _failed(self, exc: BaseException) -> None:
        kind = "dropped" if isinstance(exc, TableNotFound) else "failed"
        text = str(exc) if isinstance(exc, TicktableError) else "the table stopped updating"
        if not isinstance(exc, TicktableError):
            log.warning("web: feed of table %r stopped: %s", self.name, exc)
        self.link.send(("failed", self.fid, kind, text))

    def ack(self) -> None:
        self._acked.release()

    def close(self) -> None:
        self._closed.set()
        self._acked.release()
        self.feed.close()


class WebProcess:
    """Runs the web UI of ``server`` in a child process and feeds it.

    Parameters
    ----------
    server
        The Flight server whose tables, tokens and TLS settings are used.
    port
        The HTTP port (0: any free one).
    feed
        The default feed of a grid: ``"perspective"`` or ``"arrow"``.
    min_interval
        Seconds between two changes sent to one grid at most.
    sched
        One of :data:`SCHEDS`.
    """

    def __init__(self, server: Served, port: int, *, feed: str = "perspective",
                 min_interval: float = 0.0, sched: str = "idle", max_pending: int = 16) -> None:
        if feed not in FEEDS:
            raise TicktableError(f"unknown web feed {feed!r}; use one of {', '.join(FEEDS)}")
        if sched not in SCHEDS:
            raise TicktableError(f"unknown web scheduling {sched!r}; use one of "
                                 f"{', '.join(SCHEDS)}")
        self.server = server
        cfg = server.config
        self.settings = Settings(cfg.host, port, feed, cfg.token, cfg.read_token,
                                 cfg.tls_cert, cfg.tls_key, sched,
                                 logging.getLogger("flight").getEffectiveLevel())
        self.min_interval = min_interval
        self.max_pending = max_pending
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        #: the feeds the page has open now, by feed id
        self.feeds: dict[int, _LinkFeed] = {}
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closing = False
        self._reader: threading.Thread | None = None
        self._restarts: list[float] = []
        self._listeners: list[socket.socket] | None = None
        self._ready = threading.Event()
        #: times the web process was restarted after it ended on its own
        self.restarts = 0

    @property
    def url(self) -> str:
        """The page's address."""
        scheme = "https" if self.settings.tls_cert else "http"
        return f"{scheme}://{self.settings.host}:{self.port}/"

    @property
    def pid(self) -> int | None:
        """The web process's id."""
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the web process is alive (``False`` once it ended more often than it is
        restarted, or after :meth:`close`)."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> WebProcess:
        """Bind the port and start the web process (without waiting for it: browsers that
        connect meanwhile wait in the socket's backlog; :meth:`wait_ready` waits).

        Raises
        ------
        PortInUse
            If the port cannot be bound.
        """
        if self._listeners is None:  # a restart keeps the sockets, so the same port
            host, port = self.settings.host, self.settings.port
            try:
                self._listeners = [_listen(host, port)]
            except OSError as exc:
                raise PortInUse(f"cannot serve the web UI on {host}:{port}: "
                                f"{exc.strerror or exc} (--http-port -1 turns it off)") from exc
            self.port = int(self._listeners[0].getsockname()[1])
            self.settings = dataclasses.replace(
                self.settings, port=self.port, fds=tuple(s.fileno() for s in self._listeners))
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=_child_path(), TICKTABLE_WEB_FD=str(theirs.fileno()))
        self._ready.clear()
        # -P: no working directory first on its path (``-m`` puts it there), where another
        # ``flight`` (a checkout whose page is not built, some other project) would win
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "flight.web.child"], env=env,
                                     pass_fds=(theirs.fileno(), *self.settings.fds),
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(self.settings)
        self._reader = threading.Thread(target=self._read, name="ticktable-web-link",
                                        daemon=True)
        self._reader.start()
        log.info("serving the web UI at %s (process %d)", self.url, self.proc.pid)
        return self

    def wait_ready(self, timeout: float = _READY_TIMEOUT) -> bool:
        """Wait until the web process serves; False if it did not in ``timeout`` seconds."""
        return self._ready.wait(timeout)

    def close(self) -> None:
        """Stop the web process (its sockets close) and every feed."""
        self._closing = True
        self.send(("stop",))
        if self.proc is not None:
            try:
                self.proc.wait(10.0)
            except subprocess.TimeoutExpired:
                log.warning("web: the web UI process did not stop in 10 s; killed")
                self._kill()
        if self._reader is not None:
            self._reader.join(5.0)
        self._close_feeds()
        if self._conn is not None:
            self._conn.close()
        for s in self._listeners or ():
            s.close()

    # ------------------------------------------------------------------ sending
    def send(self, msg: tuple[Any, ...]) -> bool:
        """Send ``msg`` to the web process; False once it is gone."""
        with self._send_lock:
            try:
                if self._conn is None:
                    return False
                self._conn.send(msg)
                return True
            except OSError:
                return False

    def send_change(self, fid: int, change: Change) -> bool:
        """Send a feed's change; False once the web process is gone."""
        with self._send_lock:
            try:
                if self._conn is None:
                    return False
                write_change(self._conn, fid, change)
                return True
            except OSError:
                return False

    # ------------------------------------------------------------------ receiving
    def _read(self) -> None:
        assert self._conn is not None
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._handle(msg)
            except Exception:
                log.exception("web: could not handle %r from the web UI process", msg[0])
        self._close_feeds()
        if not self._closing:
            code = self.proc.wait() if self.proc is not None else None
            self._restart(code)

    def _restart(self, code: int | None) -> None:
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW]
        if len(self._restarts) >= RESTARTS:
            log.error("web: the web UI process ended (exit code %s), the %d-th time in %g s; "
                      "not restarted: the page is down", code, len(self._restarts) + 1,
                      RESTART_WINDOW)
            return
        self._restarts.append(now)
        log.error("web: the web UI process ended (exit code %s); starting a new one", code)
        if self._conn is not None:
            self._conn.close()
        try:
            self.start()
        except Exception as exc:
            log.error("web: could not restart the web UI: %s", exc)
            return
        self.restarts += 1
        if self._closing:  # the server closed meanwhile: stop the new one too
            self.send(("stop",))

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "log":  # the web process's log record, through the server's handlers
            _, level, name, text = msg
            logger = logging.getLogger(name)
            if logger.isEnabledFor(level):
                logger.handle(logger.makeRecord(name, level, "(web process)", 0, text, (),
                                                None))
        elif kind == "ready":
            self._ready.set()
        elif kind == "error":
            log.error("web: %s", msg[2])
        elif kind == "ack":
            feed = self.feeds.get(msg[1])
            if feed is not None:
                feed.ack()
        elif kind == "tables":
            self.send(("tables", msg[1], self.server.graph.step, self._tables()))
        elif kind == "follow":
            self._follow(msg[1], msg[2])
        elif kind == "unfollow":
            with self._lock:
                feed = self.feeds.pop(msg[1], None)
            if feed is not None:  # not on this thread: a deliver may be waiting for an ack
                threading.Thread(target=feed.close, daemon=True,
                                 name="ticktable-web-unfollow").start()

    def _follow(self, fid: int, name: str) -> None:
        try:
            feed = _LinkFeed(self, fid, name)
        except TableNotFound as exc:
            self.send(("refused", fid, "notfound", str(exc)))
            return
        if feed.feed.table.failure is not None:
            self.send(("refused", fid, "failed", str(TableFailed(
                f"table {name!r} failed: {feed.feed.table.failure}"))))
            return
        with self._lock:
            self.feeds[fid] = feed
        self.send(("followed", fid))
        feed.feed.start()

    def _tables(self) -> list[dict[str, Any]]:
        server = self.server
        subs: dict[str, int] = {}
        for s in server.subscriptions:
            subs[s.entry.name] = subs.get(s.entry.name, 0) + 1
        out = []
        for e in server.registry.entries():
            failure = e.table.failure
            status = e.status() if e.status is not None else None
            out.append({"name": e.name, "kind": e.kind, "keys": e.keys, "parents": e.parents,
                        "schema": [[f.name, str(f.type)] for f in e.table.schema],
                        "rows": len(e.table.rowset), "last_step": e.table.last_step,
                        "subscribers": subs.get(e.name, 0),
                        "state": "failed" if failure is not None else "live",
                        "error": None if failure is None else f"table {e.name!r} failed: {failure}",
                        "link": None if status is None else link_json(status),
                        "pending": False})
        # a mirror whose origin has not answered yet is no table yet, but it is listed: the
        # page says it is not in sync rather than leave it out
        names = set(server.registry.names())
        for link in server.links.links():
            if link.spec.name not in names:
                status = link.status()
                out.append({"name": link.spec.name, "kind": TableKind.MIRROR, "keys": [],
                            "parents": [], "schema": [], "rows": 0, "last_step": 0, "subscribers": 0,
                            "state": "gave up" if status.state == GAVE_UP else "waiting",
                            "error": None, "link": link_json(status), "pending": True})
        return out

    def _close_feeds(self) -> None:
        with self._lock:
            feeds, self.feeds = list(self.feeds.values()), {}
        for f in feeds:
            f.close()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
