"""The web UI's HTTP server: tornado on an event loop thread of its own.

Routes (all but the login page behind :class:`~flight.web.gate.Gate`; a request without
credentials gets 401, and a page request the login page with it):

==========================  ==========================================================
``/``                       the page (``static/index.html``): the table list and grids
``/login``                  the login page (asks for the token once)
``/api/login``              POST ``{"token": ...}``: sets the session cookie, or 401
``/api/logout``             POST: clears it
``/api/tables``             GET: the tables (name, kind, keys, parents, schema, rows,
                            subscribers, last step, state; a mirror's link status,
                            :func:`~flight.web.link.link_json`, and ``pending`` while its
                            origin has not answered, so it is no table yet) and the server's
                            default feed, as JSON
``/api/tables/NAME``        GET: that table's row of the list and the server's step, as
                            JSON (a grid's info panel); 404 with one line if there is none
``/static/...``             the built front-end (``make web`` builds it from ``web/``)
``/ws/perspective?table=``  feed ``perspective``: Perspective's websocket protocol
``/ws/arrow?table=``        feed ``arrow``: snapshot and changes as Arrow IPC
==========================  ==========================================================

It runs in the web process (:mod:`flight.web.child`), fed by the server over the link
(:mod:`flight.web.link`), on the Flight server's host and TLS certificate when it has one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tornado.httpserver
import tornado.web
import tornado.websocket

from engine.errors import InputError, TableFailed, TableNotFound
from flight.web.feed import FEEDS
from flight.web.gate import COOKIE, Gate

if TYPE_CHECKING:
    from flight.web.gateway import Credits
    from flight.web.hub import HostedTable, PerspectiveHub
    from flight.web.link import Settings
    from flight.web.remote import RemoteFeed, RemoteTables

__all__ = ["FEEDS", "STATIC", "WebServer"]

log = logging.getLogger(__name__)
_access = logging.getLogger("tornado.access")


def _log_request(handler: tornado.web.RequestHandler) -> None:
    """One line per request, as tornado writes it, at INFO for 1xx-4xx (a browser before
    its login, a missing file: answered, like the Flight side's ``ticktable.calls``) and at
    ERROR for 5xx (tornado's default puts every 4xx at WARNING)."""
    status = handler.get_status()
    level = logging.ERROR if status >= 500 else logging.INFO
    if _access.isEnabledFor(level):
        request = handler.request
        ms = 1000.0 * request.request_time()
        _access.log(level, "%d %s %s (%s) %.2fms", status, request.method, request.uri,
                    request.remote_ip, ms)

#: Where ``make web`` puts the built front-end.
STATIC = Path(__file__).parent / "static"
_LOGIN = Path(__file__).parent / "login.html"


class WebServer:
    """Serves the web UI (in the web process) of the server behind ``tables``.

    Parameters
    ----------
    tables
        The server's tables, over the link.
    settings
        Host, HTTP port (0: any free one), default feed (``"perspective"`` or ``"arrow"``;
        a page may ask for the other with ``?feed=``), tokens and TLS.
    """

    def __init__(self, tables: RemoteTables, settings: Settings) -> None:
        if settings.feed not in FEEDS:
            raise InputError(f"unknown web feed {settings.feed!r}; use one of "
                             f"{', '.join(FEEDS)}")
        self.tables_source = tables
        self.settings = settings
        self.feed = settings.feed
        self.gate = Gate(settings.token, settings.read_token)
        self.tls = bool(settings.tls_cert)
        self.port: int | None = None
        self.hub: PerspectiveHub | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._http: tornado.httpserver.HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._arrow_feeds: set[RemoteFeed] = set()
        self.sockets: set[tornado.websocket.WebSocketHandler] = set()  # open, on the loop

    @property
    def url(self) -> str:
        """The page's address."""
        return f"{'https' if self.tls else 'http'}://{self.settings.host}:{self.port}/"

    def start(self) -> WebServer:
        """Serve on the server's listening sockets (``settings.fds``), on a thread of its own."""
        from flight.web.hub import PerspectiveHub

        sockets = [socket.socket(fileno=fd) for fd in self.settings.fds]
        for sock in sockets:
            sock.setblocking(False)
        self.port = int(sockets[0].getsockname()[1])
        ssl_ctx = self._ssl_context()
        self.hub = PerspectiveHub(self.tables_source)
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            self._http = tornado.httpserver.HTTPServer(self._app(), ssl_options=ssl_ctx,
                                                       max_buffer_size=64 << 20)
            self._http.add_sockets(sockets)
            loop.call_soon(started.set)
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="ticktable-web", daemon=True)
        self._thread.start()
        started.wait()
        return self

    def close(self) -> None:
        """Stop serving: sockets close, feeds stop, Perspective's tables are freed."""
        loop = self.loop
        if loop is not None and self._thread is not None:
            async def stop() -> None:
                if self._http is not None:
                    self._http.stop()
                    for sock in list(self.sockets):  # detached from the HTTP server
                        sock.close(1001, "server shutting down")
                    await self._http.close_all_connections()

            try:
                asyncio.run_coroutine_threadsafe(stop(), loop).result(5.0)
            except (TimeoutError, RuntimeError):
                log.warning("web: connections still open at shutdown")
            for feed in list(self._arrow_feeds):
                feed.close()
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(5.0)
        if self.hub is not None:
            self.hub.close()
        self.loop = None

    def _ssl_context(self) -> ssl.SSLContext | None:
        cfg = self.settings
        if not (cfg.tls_cert and cfg.tls_key):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # the standard library loads a certificate chain from files only
        with tempfile.TemporaryDirectory(prefix="ticktable-tls-") as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(cfg.tls_cert)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(cfg.tls_key)
            ctx.load_cert_chain(cert, key)
        return ctx

    def _app(self) -> tornado.web.Application:
        opts = {"web": self}
        return tornado.web.Application([
            (r"/", _PageHandler, opts),
            (r"/login", _LoginPageHandler, opts),
            (r"/api/login", _LoginHandler, opts),
            (r"/api/logout", _LogoutHandler, opts),
            (r"/api/tables", _TablesHandler, opts),
            (r"/api/tables/(.+)", _TableHandler, opts),
            (r"/static/(.*)", _StaticHandler, {**opts, "path": str(STATIC)}),
            (r"/ws/perspective", _PerspectiveSocket, opts),
            (r"/ws/arrow", _ArrowSocket, opts),
        ], websocket_max_message_size=64 << 20, compress_response=True,
            log_function=_log_request)

    # ------------------------------------------------------------------ the list
    def tables(self) -> tuple[int, list[dict[str, Any]]]:
        """The server's step, and each table's name, kind, rows, subscribers (over Flight
        and grids open here), last step, state and link (a mirror's; blocks for the
        server's answer)."""
        step, tables = self.tables_source.tables()
        web_viewers: dict[str, int] = {}
        if self.hub is not None:
            for name, h in self.hub.hosted().items():
                web_viewers[name] = web_viewers.get(name, 0) + h.viewers
        for feed in list(self._arrow_feeds):
            web_viewers[feed.name] = web_viewers.get(feed.name, 0) + 1
        for t in tables:
            t["subscribers"] += web_viewers.get(t["name"], 0)
        return step, tables


class _Handler(tornado.web.RequestHandler):
    """Every handler but the login page's: the gate first."""

    web: WebServer
    public = False

    def initialize(self, web: WebServer) -> None:
        self.web = web

    def prepare(self) -> None:
        if self.public or self.web.gate.allows(self.get_cookie(COOKIE),
                                               self.request.headers.get("Authorization")):
            return
        self.set_status(401)
        if self.request.path.startswith(("/api/", "/ws/")):
            self.finish({"error": "missing or wrong token: log in at /login, or send "
                                  "'authorization: Bearer <token>'"})
        else:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(_LOGIN.read_bytes())

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Cache-Control", "no-store")


class _PageHandler(_Handler):
    def get(self) -> None:
        page = STATIC / "index.html"
        if not page.exists():
            self.set_status(503)
            self.finish("the web UI's assets are not built: run 'make web' (npm) in the "
                        "ticktable checkout")
            return
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(page.read_bytes())


class _LoginPageHandler(_Handler):
    public = True

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(_LOGIN.read_bytes())


class _LoginHandler(_Handler):
    public = True

    def post(self) -> None:
        try:
            token = json.loads(self.request.body or b"{}").get("token", "")
        except (ValueError, AttributeError):
            token = ""
        if self.web.gate.open:
            self.set_status(204)
            return
        session = self.web.gate.session_for(str(token)) if token else None
        if session is None:
            self.set_status(401)
            self.finish({"error": "wrong token"})
            return
        self.set_cookie(COOKIE, session, httponly=True, samesite="Strict", secure=self.web.tls,
                        path="/")
        self.set_status(204)


class _LogoutHandler(_Handler):
    public = True

    def post(self) -> None:
        self.clear_cookie(COOKIE, path="/")
        self.set_status(204)


class _TablesHandler(_Handler):
    async def get(self) -> None:
        assert self.web.loop is not None
        step, tables = await self.web.loop.run_in_executor(None, self.web.tables)
        self.finish({"feed": self.web.feed, "feeds": list(FEEDS), "step": step,
                     "tables": tables})


class _TableHandler(_Handler):
    async def get(self, name: str) -> None:
        assert self.web.loop is not None
        step, tables = await self.web.loop.run_in_executor(None, self.web.tables)
        row = next((t for t in tables if t["name"] == name), None)
        if row is None:
            names = ", ".join(sorted(t["name"] for t in tables)) or "none"
            self.set_status(404)
            self.finish({"error": f"no table named {name!r} (tables: {names})"[:300]})
            return
        self.finish({"step": step, "table": row})


class _StaticHandler(tornado.web.StaticFileHandler):
    web: WebServer

    def initialize(self, web: WebServer, path: str) -> None:  # type: ignore[override]
        self.web = web
        super().initialize(path)

    def prepare(self) -> None:
        if not self.web.gate.allows(self.get_cookie(COOKIE),
                                    self.request.headers.get("Authorization")):
            raise tornado.web.HTTPError(401)

    def set_extra_headers(self, path: str) -> None:
        if path.endswith(".wasm"):
            self.set_header("Content-Type", "application/wasm")


class _Socket(tornado.websocket.WebSocketHandler):
    """A websocket behind the gate, same-origin only, naming its table in ``?table=``."""

    web: WebServer

    def initialize(self, web: WebServer) -> None:
        self.web = web

    def prepare(self) -> None:
        if not self.web.gate.allows(self.get_cookie(COOKIE),
                                    self.request.headers.get("Authorization")):
            raise tornado.web.HTTPError(401)

    def table_name(self) -> str:
        return self.get_argument("table", "")

    def open(self) -> Any:
        self.web.sockets.add(self)

    def on_close(self) -> None:
        self.web.sockets.discard(self)

    def refuse(self, exc: Exception) -> None:
        """Close with a code the page shows: 4404 no such table, 4409 failed table."""
        code = 4404 if isinstance(exc, TableNotFound) else 4409
        self.close(code, str(exc)[:120])


class _PerspectiveSocket(_Socket):
    """Perspective's websocket protocol for one grid (one table held for it meanwhile)."""

    hosted: HostedTable | None = None
    session: Any = None

    async def open(self) -> None:
        super().open()
        hub = self.web.hub
        assert hub is not None and self.web.loop is not None
        self.set_nodelay(True)  # request/response: Nagle's delay would add ~40 ms a round trip
        try:
            self.hosted = await self.web.loop.run_in_executor(None, hub.acquire,
                                                              self.table_name())
        except (TableNotFound, TableFailed) as exc:
            self.refuse(exc)
            return
        except Exception:
            log.exception("web: could not open table %r in Perspective", self.table_name())
            self.close(1011, "internal error")
            return
        loop = self.web.loop

        def send(msg: bytes) -> None:  # Perspective's thread
            loop.call_soon_threadsafe(self._send, msg)

        self.session = await loop.run_in_executor(hub.executor, hub.server.new_session, send)

    def _send(self, msg: bytes) -> None:
        if self.ws_connection is not None and not self.ws_connection.is_closing():
            self.write_message(msg, binary=True)

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes) and self.session is not None and self.web.hub is not None:
            self.web.hub.executor.submit(self.session.handle_request, message)

    def on_close(self) -> None:
        super().on_close()
        hub = self.web.hub
        if hub is None:
            return
        if self.session is not None:
            from flight.web.hub import EngineClosed

            try:
                hub.executor.submit(self.session.close)
            except EngineClosed:  # the hub is closing: its sessions go with it
                pass
            self.session = None
        if self.hosted is not None:
            hosted, self.hosted = self.hosted, None
            threading.Thread(target=hub.release, args=(hosted,), daemon=True,
                             name="ticktable-web-release").start()


class _ArrowSocket(_Socket):
    """Feed ``arrow``: the table's snapshot and changes as Arrow IPC (flight.web.gateway)."""

    feed: RemoteFeed | None = None
    credits: Credits | None = None

    async def open(self) -> None:
        from flight.web.gateway import Credits, follow

        super().open()
        loop = self.web.loop
        assert loop is not None
        self.set_nodelay(True)
        self.credits = Credits()
        credits = self.credits
        try:
            feed = await loop.run_in_executor(
                None, lambda: follow(self.web.tables_source, self.table_name(), self, loop,
                                     credits))
        except (TableNotFound, TableFailed) as exc:
            self.refuse(exc)
            return
        if credits.closed:  # the page went while the table was being followed
            feed.close()
            return
        self.feed = feed
        self.web._arrow_feeds.add(feed)

    def on_message(self, message: str | bytes) -> None:
        if message == "ack" and self.credits is not None:
            self.credits.give()

    def on_close(self) -> None:
        super().on_close()
        if self.credits is not None:
            self.credits.close()
        if self.feed is not None:
            feed, self.feed = self.feed, None
            self.web._arrow_feeds.discard(feed)
            threading.Thread(target=feed.close, daemon=True,
                             name="ticktable-web-release").start()
