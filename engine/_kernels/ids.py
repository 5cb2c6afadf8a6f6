"""The one allocator of dense int64 ids (row keys, slots, group ids) with deferred frees.

An id freed during a cycle may still be read in that cycle (a removed row's previous
values live under its old id until the cycle ends), so it must not be handed out again
before the next cycle: :meth:`IdAllocator.free` parks ids, :meth:`IdAllocator.release`
(called at the start of the next cycle) makes them reusable. Allocation takes reusable ids
first, **first freed, first reused** (ids freed in one call keep the order they were given
in, so sorted frees come back sorted), then fresh ids counting up from
:attr:`IdAllocator.end`. FIFO rather than lowest-first on purpose: keeping the free list
sorted costs a sort per cycle, FIFO a concatenation.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["IdAllocator"]

I64 = npt.NDArray[np.int64]

_EMPTY = np.empty(0, dtype=np.int64)


class IdAllocator:
    """Dense non-negative ids, reused first-freed-first from the cycle after they are freed.

    Attributes
    ----------
    end
        One past the largest id ever handed out: arrays indexed by id need this many entries.

    Examples
    --------
    >>> ids = IdAllocator()
    >>> ids.allocate(4).tolist()
    [0, 1, 2, 3]
    >>> ids.free(np.array([2, 0]))
    >>> ids.allocate(2).tolist()      # freed ids wait for the next cycle
    [4, 5]
    >>> ids.release()
    >>> ids.allocate(3).tolist()
    [2, 0, 6]
    """

    __slots__ = ("end", "_free", "_later")

    def __init__(self) -> None:
        self.end = 0
        self._free: I64 = _EMPTY  # reusable now, in the order they were freed
        self._later: list[I64] = []  # freed this cycle

    @property
    def reusable(self) -> int:
        """How many freed ids the next :meth:`allocate` calls may reuse."""
        return int(self._free.size)

    def allocate(self, n: int) -> I64:
        """``n`` distinct ids: reusable ones (first freed first), then fresh ones (ascending)."""
        free = self._free
        take = min(n, free.size)
        fresh = np.arange(self.end, self.end + n - take, dtype=np.int64)
        self.end += n - take
        if not take:
            return fresh
        self._free = free[take:]
        return np.concatenate((free[:take], fresh))  # a copy: callers own what they get

    def free(self, ids: I64) -> None:
        """Give back distinct live ids; they are reused only after the next :meth:`release`."""
        if ids.size:
            self._later.append(ids)

    def export(self) -> dict[str, object]:
        """The allocator's whole state, JSON-ready (for a checkpoint): see :meth:`restore`."""
        later = np.concatenate(self._later) if self._later else _EMPTY
        return {"end": self.end, "free": self._free.tolist(), "later": later.tolist()}

    def restore(self, state: dict[str, object]) -> None:
        """Become the allocator :meth:`export` described (same ids, in the same order)."""
        end, free, later = state["end"], state["free"], state["later"]
        assert isinstance(end, int) and isinstance(free, list) and isinstance(later, list)
        self.end = end
        self._free = np.asarray(free, dtype=np.int64)
        self._later = [np.asarray(later, dtype=np.int64)] if later else []

    def release(self) -> None:
        """Start of a new cycle: the ids freed so far become reusable."""
        if self._later:
            self._free = np.concatenate((self._free, *self._later))
            self._later = []
