"""Links: tables of other servers mirrored into this one (DESIGN.md §11).

A mirror is a :class:`~engine.sources.ReplicaTable` fed by a :class:`~flight.links.link.Link`
(one subscription to the origin). The server's :class:`Links` holds its mirrors: it
registers each one as a table of kind ``mirror`` once the origin's schema is known, puts
the link's status in the table's entry (so every message of the mirror's streams carries
it, and ``stats`` shows it) and sends a status message to the mirror's subscribers when the
link goes out of sync or back.

On a durable server a mirror's table is checkpointed with its position in the origin's
history, and what it follows is journaled (:mod:`flight.durability.durable`): after a restart
the table comes back before the links start, and :meth:`Links.add` resumes it from there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import TableExists
from engine.sources import ReplicaTable
from flight.links.link import Link, LinkGaveUp
from flight.links.spec import MirrorSpec, held_by, parse_mirror
from flight.pb import flight_pb2 as pb
from flight.wire import TableKind

if TYPE_CHECKING:
    from flight.server import TicktableServer

__all__ = ["Link", "LinkGaveUp", "Links", "MirrorSpec", "parse_mirror"]

log = logging.getLogger(__name__)


class Links:
    """The server's mirrors, by local name.

    Parameters
    ----------
    server
        The server whose registry holds the mirrors and whose subscribers are told of
        their links' status.
    """

    def __init__(self, server: TicktableServer) -> None:
        self.server = server
        self.registry = server.registry
        self._links: dict[str, Link] = {}
        self._lock = threading.Lock()
        self.registry.on_drop.append(self._dropped)
        self.registry.claims.append(self._claim)

    def add(self, spec: MirrorSpec) -> Link:
        """Start mirroring ``spec``'s table as ``spec.name``.

        A mirror restored from a checkpoint (a table of kind ``mirror`` under that name)
        resumes from where it was; otherwise the name must be free.

        Raises
        ------
        TableExists
            If the name is taken by a table that is not a mirror, or by another mirror.
        """
        name = spec.name
        # the registry's lock first (its order everywhere): no table takes the name between
        # the check and the link holding it (see _claim)
        with self.registry.lock, self._lock:
            restored = self._free(spec)
            link = Link(self.registry.graph, spec, table=restored, on_table=self._register,
                        on_status=self._status_changed,
                        on_staged=self.server.durability.mirrored)
            self._links[name] = link
            if restored is not None:
                self.registry.get(name).status = link.status
        return link.start()

    def check(self, spec: MirrorSpec) -> None:
        """Raise what :meth:`add` would raise for ``spec``'s name, changing nothing (a durable
        server checks before it journals the mirror)."""
        with self._lock:
            self._free(spec)

    def _free(self, spec: MirrorSpec) -> ReplicaTable | None:
        """The replica to resume under ``spec``'s name, if one was restored (under the lock)."""
        name = spec.name
        if name in self._links:
            raise TableExists(f"table {name!r} already mirrors {self._links[name].spec.origin}")
        if name not in self.registry.names():
            return None
        entry = self.registry.get(name)
        if entry.kind != TableKind.MIRROR or not isinstance(entry.table, ReplicaTable):
            raise TableExists(f"table {name!r} already exists (a {entry.kind} table); "
                              f"mirror {spec.origin} under another name (URI/TABLE=LOCAL)")
        return entry.table

    def _claim(self, name: str, kind: str) -> str | None:
        """A mirror holds its name from its start: before its origin's first answer
        registers its table (of kind ``mirror``), no other table may take the name (asked
        under the registry's lock, see :attr:`TableRegistry.claims`)."""
        if kind == TableKind.MIRROR:
            return None
        with self._lock:
            link = self._links.get(name)
        return None if link is None else held_by(name, link.spec.origin)

    def forget(self, name: str) -> bool:
        """Stop mirror ``name`` and forget it, with its table if it has one (a mirror whose
        origin never answered has none): journaled on a durable server. Whether there was
        such a mirror."""
        with self._lock:
            known = name in self._links
        if not known:
            return False
        self.server.durability.drop_table(name)  # the table's drop closes the link too
        with self._lock:
            link = self._links.pop(name, None)
        if link is not None:
            link.close()
        return True

    def get(self, name: str) -> Link | None:
        """The link feeding mirror ``name``, if it is one."""
        with self._lock:
            return self._links.get(name)

    def links(self) -> list[Link]:
        with self._lock:
            return list(self._links.values())

    def close(self) -> None:
        """Stop every link (the mirrors keep their rows)."""
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()

    # ------------------------------------------------------------------ callbacks
    def _register(self, table: ReplicaTable) -> None:
        """On the link's thread, at its first connection: expose the replica."""
        link = self.get(table.name)
        entry = self.registry.add(table.name, table, TableKind.MIRROR)
        entry.durable = self.server.durability.durable  # checkpointed with the source tables
        if link is not None:
            entry.status = link.status

    def _status_changed(self, link: Link) -> None:
        """Tell the mirror's subscribers: each gets a message carrying the new status. While
        the link has changes staged that no cycle applied yet (it just came back in sync),
        they are told after the cycle that applies them, so "in sync" never arrives before
        the rows it vouches for."""
        table = link.table
        if table is None or not table.pending_changes:
            self._tell(link)
            return
        graph = self.registry.graph
        removers: list[Callable[[], None]] = []  # set before a cycle can call after_cycle

        def after_cycle(step: int) -> None:
            if removers and (not table.pending_changes or table.closed):
                removers.pop()()
                self._tell(link)

        with graph.shared_lock():  # no cycle ends between adding it and keeping its remover
            removers.append(graph.add_terminal_listener(after_cycle))

    def _tell(self, link: Link) -> None:
        for sub in self.server.subscriptions:  # filtered subscriptions of the mirror too
            if sub.entry.name == link.spec.name and sub.entry.listed.table is link.table:
                sub.change(pb.SubscriptionChange())

    def _dropped(self, name: str) -> None:
        with self._lock:
            link = self._links.pop(name, None)
        if link is not None:
            link.close()
