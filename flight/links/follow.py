"""Mirroring a whole server (``ticktable serve --mirror-of URI``): every table of the origin
becomes a mirror here, under its own name, and the origin's creates and drops are followed.

An :class:`OriginFollower` lists the origin's tables (``ListFlights``) every ``poll``
seconds: a table the origin has and this server does not is mirrored
(:meth:`~flight.server.TicktableServer.mirror`, so a durable server journals it); a mirror
this follower made whose table the origin no longer lists is dropped here (unless tables
of this server derive from it: then it stays, out of sync, and the log says why). A name
this server already uses for a table of its own is left alone, said once in the log; a
client's temporary SQL view (``__sql_...``) is not mirrored.
Between a drop at the origin and the next listing the mirror's link reports the origin's
``NOT_FOUND``: it is out of sync, never silently stale.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import pyarrow.flight as fl

from engine.errors import InputError, TableExists, TicktableError
from flight.links.spec import MirrorSpec, one_line

if TYPE_CHECKING:
    from flight.server import TicktableServer

__all__ = ["OriginFollower"]

log = logging.getLogger(__name__)


class OriginFollower:
    """Keeps a mirror here of every table of the server at ``uri`` (see the module docstring).

    Parameters
    ----------
    server
        This server.
    uri
        The origin: ``grpc://host:port``.
    token
        The origin's bearer token (its read-only token is enough).
    poll
        Seconds between two listings of the origin's tables.
    give_up_after
        Passed to every mirror (:class:`~flight.links.spec.MirrorSpec`).
    """

    def __init__(self, server: TicktableServer, uri: str, *, token: str | None = None,
                 poll: float = 1.0, give_up_after: float | None = None) -> None:
        if "://" not in uri:
            uri = f"grpc://{uri}"
        self.server = server
        self.uri = uri.rstrip("/")
        self.token = token
        self.poll = poll
        self.give_up_after = give_up_after
        self.listings = 0
        self.last_error = ""
        self._refused: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ticktable-mirror-of")

    def start(self) -> OriginFollower:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # the origin is down: the mirrors' links say so
                text = one_line(exc)
                if text != self.last_error:
                    log.warning("mirror-of %s: cannot list its tables: %s", self.uri, text)
                self.last_error = text
            self._stop.wait(self.poll)

    def origin_tables(self) -> list[str]:
        """The origin's table names (one ``ListFlights``)."""
        client = fl.FlightClient(self.uri)
        headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
        try:
            infos = client.list_flights(b"", fl.FlightCallOptions(headers=headers, timeout=10.0))
            names = []
            for info in infos:
                raw = info.descriptor.path[0]
                names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            return names
        finally:
            client.close()

    @property
    def mirrored(self) -> set[str]:
        """This server's mirrors of the origin's tables (also those a restart brought back)."""
        return {link.spec.name for link in self.server.links.links()
                if link.spec.uri == self.uri and link.spec.name == link.spec.table}

    def sync_once(self) -> None:
        """List the origin's tables once; mirror the new ones, drop the mirrors of the gone."""
        # a client's temporary SQL view (Client.subscribe_sql) is its own, not the origin's
        names = {n for n in self.origin_tables() if not n.startswith("__sql_")}
        self.listings += 1
        self.last_error = ""
        here = set(self.server.registry.names())
        for name in sorted(names - self.mirrored):
            if self.server.links.get(name) is not None:  # a mirror made otherwise (a flag)
                continue
            if name in here:
                if name not in self._refused:
                    self._refused.add(name)
                    log.warning("mirror-of %s: table %r is not mirrored: this server has a "
                                "table of that name", self.uri, name)
                continue
            try:
                self.server.mirror(MirrorSpec(self.uri, name, token=self.token,
                                              give_up_after=self.give_up_after))
            except (TableExists, InputError) as exc:
                log.warning("mirror-of %s: table %r: %s", self.uri, name, exc)
        for name in sorted(self.mirrored - names):
            try:
                if name in self.server.registry.names():
                    self.server.durability.drop_table(name)
                else:  # its origin never answered: no table, only the link
                    self.server.links.forget(name)
            except TicktableError as exc:  # tables here derive from it: it stays
                if name not in self._refused:
                    self._refused.add(name)
                    log.warning("mirror-of %s: table %r was dropped there but stays here: %s",
                                self.uri, name, exc)
                continue
            self._refused.discard(name)
            log.info("mirror-of %s: table %r was dropped there; its mirror is dropped here",
                     self.uri, name)
