"""Push-back for writes: a table's writes waiting for a cycle stay bounded (#39 item 5).

A write without a ``write_id`` is acknowledged once it is staged for the table's next
cycle (in memory) or journaled (durable). When cycles fall behind, staging would grow
without bound: every writer acknowledged at once, the rows piling up in memory until a
cycle takes them. :class:`Backlog` admits a batch only while the table's staged bytes
(:attr:`~engine.sources.SourceTable.pending_bytes`) plus the batch stay within
``max_pending_bytes``. Past it the writer's stream waits for a cycle to take them, and
meanwhile reads nothing more: gRPC's flow control holds the writer (the server announces
only a small window per stream, ``put_window_bytes``: see :mod:`flight.server`). A batch
still over the limit after ``wait_seconds`` is refused with :class:`BacklogFull`
(RESOURCE_EXHAUSTED, naming the table and the limit): nothing of it is staged, the
batches before it stay, and the writer may send it again later.

The limit is per table and soft: writers admitted together may pass it by a batch each.
A table with nothing staged admits any batch (``max_put_batch_bytes`` bounds that), so a
batch larger than the limit is never refused for its size alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from engine.errors import BacklogFull
from engine.graph import UpdateGraph
from engine.sources import SourceTable
from flight.limits import limit_text, quoted
from flight.wire import RETRY_LATER

__all__ = ["Backlog"]


class Backlog:
    """Admits a table's writes while what waits for its next cycle stays under a limit.

    Parameters
    ----------
    graph
        The server's update graph: each cycle's end wakes the writers that wait.
    max_pending_bytes
        Bytes a table's staged writes may hold before a cycle takes them.
    wait_seconds
        How long a batch waits for room before it is refused.
    on_wait
        Called with the table's name and the seconds waited, for every batch that waited
        (admitted or refused).
    """

    def __init__(self, graph: UpdateGraph, *, max_pending_bytes: int, wait_seconds: float,
                 on_wait: Callable[[str, float], None] | None = None) -> None:
        self.max_pending_bytes = max_pending_bytes
        self.wait_seconds = wait_seconds
        self._on_wait = on_wait
        self._cycles = threading.Condition()
        self._closed = False
        self._remove = graph.add_terminal_listener(self._cycle_ended)

    def _cycle_ended(self, step: int) -> None:
        with self._cycles:
            self._cycles.notify_all()

    def admit(self, name: str, table: SourceTable, nbytes: int,
              ahead: Callable[[], int] | None = None) -> float:
        """Wait until staging ``nbytes`` more into ``table`` keeps it within the limit;
        returns the seconds waited (0.0 when there was room).

        ``ahead`` gives the bytes of the writer's earlier batches admitted but not staged
        yet (on their way through a durable server's journal): they count as waiting.

        Raises
        ------
        BacklogFull
            If there is still no room after ``wait_seconds``, or the server is closing.
        """
        limit = self.max_pending_bytes
        if self._fits(table, nbytes, ahead):
            return 0.0
        start = time.monotonic()
        deadline = start + self.wait_seconds
        try:
            with self._cycles:
                while not self._fits(table, nbytes, ahead):
                    left = deadline - time.monotonic()
                    if self._closed or left <= 0:
                        pending = table.pending_bytes + (ahead() if ahead is not None else 0)
                        why = ("the server is shutting down" if self._closed else
                               f"still over it after {self.wait_seconds:g} s")
                        raise BacklogFull(
                            f"table {quoted(table.name)}: {pending} bytes of writes wait for its next "
                            f"cycle and this batch adds {nbytes}, past "
                            f"{limit_text('max_pending_bytes', limit)}, {why}; cycles are "
                            f"behind: {RETRY_LATER}")
                    # a cycle's end wakes this; the journal landing a batch does not
                    self._cycles.wait(left if ahead is None else min(left, 0.02))
        finally:
            waited = time.monotonic() - start
            if self._on_wait is not None:
                self._on_wait(name, waited)
        return waited

    def _fits(self, table: SourceTable, nbytes: int, ahead: Callable[[], int] | None) -> bool:
        pending = table.pending_bytes + (ahead() if ahead is not None else 0)
        return pending == 0 or pending + nbytes <= self.max_pending_bytes

    def close(self) -> None:
        """Stop waiting: writers still waiting are refused; no cycle wakes this any more."""
        self._remove()
        with self._cycles:
            self._closed = True
            self._cycles.notify_all()
