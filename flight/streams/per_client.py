"""Open subscriptions per client address, at most ``max_subscriptions_per_client`` each.

The limit itself, its default and flag are in :mod:`flight.limits`.
"""

from __future__ import annotations

import threading

from engine.errors import LimitExceeded
from flight.limits import limit_text

__all__ = ["SubscriptionsPerClient", "client_of"]


def client_of(peer: str) -> str:
    """The client address of a gRPC peer: its host, without the port.

    Examples
    --------
    >>> client_of("ipv4:127.0.0.1:50312"), client_of("ipv6:[::1]:50312")
    ('127.0.0.1', '[::1]')
    >>> client_of("unix:/tmp/sock")
    'unix:/tmp/sock'
    """
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in address:
        return address.rsplit(":", 1)[0]
    return peer


class SubscriptionsPerClient:
    """Subscriptions open per client address (:func:`client_of`), at most ``limit`` each.

    Thread-safe; ``limit`` ``None``: no limit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str, what: str) -> None:
        """Count one more open for ``client``; ``what`` names it in a refusal.

        Raises
        ------
        LimitExceeded
            If ``client`` holds ``limit`` open already (nothing is counted).
        """
        with self._lock:
            n = self._open.get(client, 0)
            if self.limit is not None and n >= self.limit:
                raise LimitExceeded(
                    f"{what} refused: client {client} has {n} subscriptions open, "
                    f"{limit_text('max_subscriptions_per_client', self.limit)}; close one first")
            self._open[client] = n + 1

    def release(self, client: str) -> None:
        """Count one fewer open for ``client`` (one :meth:`acquire` ended)."""
        with self._lock:
            n = self._open.get(client, 0) - 1
            if n > 0:
                self._open[client] = n
            else:
                self._open.pop(client, None)

    def count(self, client: str) -> int:
        """How many ``client`` holds open."""
        with self._lock:
            return self._open.get(client, 0)
