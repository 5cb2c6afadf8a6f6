"""Updates a consumer has received but not yet sent, composed into one when it sends.

Every consumer of a table's publisher (a subscription's stream, a fan-out, a web feed) is
called inside the cycle with each update and sends later, on a thread of its own, when the
previous message has gone: what arrives meanwhile waits in a :class:`PendingUpdates`. When
the consumer sends, :meth:`PendingUpdates.take` hands it everything waiting as one
:class:`Run`, the updates composed exactly (:func:`~engine.update.compose`): the message
brings its client from before the first of them to the state after the last.

Bounded. A consumer that falls behind (a slow client, a busy browser) must not cost memory
in proportion to how far behind it is: past ``bound`` waiting updates, each new one is
composed into the one before it, in the cycle (one compose per cycle, so the cycle's cost
stays flat). Memory is then at most ``bound`` updates (each bounded by the table's size),
and the client still converges: it receives fewer, larger messages. Row sets only: values
are read when the message is built, never queued.

``TRIPLES`` streams also queue each update's triples, which exist only inside the cycle
(they hold previous values); past ``bound`` batches they are consolidated into one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from engine.differential.zset import ZSet, concat
from engine.update import compose
from flight.streams.registry import HistoryEntry

__all__ = ["PendingUpdates", "Run", "compose_run"]


def compose_run(entries: Sequence[HistoryEntry]) -> HistoryEntry:
    """Consecutive history entries as one: the same change, from before the first entry to
    after the last.

    Parameters
    ----------
    entries
        At least one entry; each starts where the one before it ended.

    Returns
    -------
    HistoryEntry
        The last entry's sequence and step, the first entry's ``prev``, and the updates
        composed exactly (applying it equals applying each in turn).
    """
    first, last = entries[0], entries[-1]
    if len(entries) == 1:
        return first
    update = first.update
    for e in entries[1:]:
        update = compose(update, e.update, first.prev)  # prev: the row set before the first
    return HistoryEntry(last.sequence, last.step, update, first.prev)


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive updates of one table taken as one message's input.

    Attributes
    ----------
    entry
        The updates composed into one (:func:`compose_run`).
    count
        How many table updates it covers.
    triples
        For a ``TRIPLES`` stream: their triples, each at its own cycle's time, consolidated.
    """

    entry: HistoryEntry
    count: int
    triples: ZSet | None = None

    def then(self, later: Run) -> Run:
        """This run followed by ``later`` (which starts where this one ends), as one."""
        triples = (self.triples if later.triples is None else later.triples
                   if self.triples is None else concat(self.triples, later.triples).consolidate())
        return Run(compose_run((self.entry, later.entry)), self.count + later.count, triples)


class PendingUpdates:
    """A consumer's waiting updates (see the module docstring).

    Thread-safe: the cycle appends while the consumer's thread takes. The lock is held to
    add an entry or to swap the list out, never while :meth:`take` composes, so the cycle
    never waits on a consumer composing what it took.

    Parameters
    ----------
    bound
        Waiting entries (and triples batches) held at most; past it, the newest update is
        composed into the one before it.
    """

    __slots__ = ("_count", "_entries", "_lock", "_triples", "bound")

    def __init__(self, bound: int) -> None:
        self.bound = max(1, bound)
        self._lock = threading.Lock()
        self._entries: list[HistoryEntry] = []
        self._count = 0  # table updates in _entries (some may be composed)
        self._triples: list[ZSet] = []

    def __len__(self) -> int:
        """Entries held (a composed one counts once): at most ``bound``."""
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def count(self) -> int:
        """Table updates waiting."""
        return self._count

    def append(self, entry: HistoryEntry, triples: ZSet | None = None) -> None:
        """Add the next update (and, for a ``TRIPLES`` stream, its triples).

        Called inside the cycle: past ``bound`` it composes (or consolidates) here.
        """
        with self._lock:
            entries = self._entries
            entries.append(entry)
            self._count += 1
            if len(entries) > self.bound:  # the consumer is behind: one compose per cycle
                entries[-2:] = [compose_run(entries[-2:])]
            if triples is not None:
                self._triples.append(triples)
                if len(self._triples) > self.bound:
                    self._triples = [concat(*self._triples).consolidate()]

    def take(self) -> Run | None:
        """Everything waiting, as one run (``None`` when nothing waits); empties the queue."""
        with self._lock:
            entries, self._entries = self._entries, []
            count, self._count = self._count, 0
            batches, self._triples = self._triples, []
        if not entries:
            return None
        triples = (None if not batches else batches[0] if len(batches) == 1
                   else concat(*batches).consolidate())
        return Run(compose_run(entries), count, triples)
