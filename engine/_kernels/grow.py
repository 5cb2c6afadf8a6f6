"""Growing a dense numpy array without copying it: large arrays live in reserved address space.

A column indexed by row key is one dense array (gathers of any keys are one numpy take),
and it grows by doubling. Growing by copying costs the whole column in the one cycle that
crosses a power of two: appending 65,536 rows to a 16M-row table copied 128 MB per int64
column there, a cycle 100 times longer than its neighbours. :func:`grown` avoids that.

Once an array passes :data:`RESERVE_FROM_BYTES`, it lives at the start of an anonymous
private mapping of :data:`RESERVE_FACTOR` times its size (at least :data:`MIN_RESERVE_BYTES`),
mapped with ``MAP_NORESERVE``. Memory is committed page by page when first written, so the
reserve costs address space, not memory; growing within it is a longer view of the same
pages (no copy, and the pages beyond the old end are still the kernel's zeros). Only when
the reserve is exhausted is the array copied, into a new reserve ``RESERVE_FACTOR`` times
larger: a 1 GiB reserve holds 128M int64 rows before its first copy.

The mapping is advised as huge-page memory (``MADV_HUGEPAGE``), as numpy does for its own
large arrays: on a VM a 4 KiB page fault costs about as much as zeroing the page, so a
fresh 96 MB column written in 4 KiB pages took 4 times as long as in 2 MiB pages.

Where the mapping cannot be made (a strict overcommit policy, an address-space limit, a
platform without anonymous ``mmap``), arrays grow by copying, as before. Nothing else
changes: the result is an ordinary writable numpy array; it is freed with its last view.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MIN_RESERVE_BYTES", "RESERVE_FACTOR", "RESERVE_FROM_BYTES", "grown", "reserved_capacity"]

#: Arrays of at least this many bytes grow inside a reserve (smaller ones by copying).
#: glibc serves smaller blocks from its heap, reusing freed ones with their pages already
#: mapped (``flight.server.keep_freed_memory`` keeps them), and maps larger ones fresh: a
#: reserve is fresh pages too, so below this it would fault where the heap does not
#: (a table made and filled per put: 4 times the apply time with reserves from 8 MB).
RESERVE_FROM_BYTES = 32 << 20
#: A new reserve holds this many times the array's new size ...
RESERVE_FACTOR = 16
#: ... and at least this many bytes.
MIN_RESERVE_BYTES = 1 << 30

_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_NORESERVE", 0)


def _reserve(nbytes: int) -> mmap.mmap | None:
    """An anonymous mapping of ``nbytes`` (zeros, committed when written), or None."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    try:
        m = mmap.mmap(-1, nbytes, flags=_FLAGS)
    except (OSError, ValueError, OverflowError):  # ENOMEM under strict overcommit or RLIMIT_AS
        return None
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:  # a kernel without transparent huge pages
            pass
    return m


def _whole(a: npt.NDArray[Any]) -> npt.NDArray[Any] | None:
    """The whole reserve ``a`` is the start of, or None when ``a`` is not in one."""
    full = a.base  # a view's base is the array over the whole mapping (np.frombuffer's)
    if not isinstance(full, np.ndarray):
        return None
    mem: Any = full.base  # np.frombuffer's base: a memoryview of the mapping
    if (isinstance(mem, memoryview) and isinstance(mem.obj, mmap.mmap)
            and full.dtype == a.dtype and full.ndim == 1 and a.ndim == 1
            and a.__array_interface__["data"][0] == full.__array_interface__["data"][0]):
        return full
    return None


def reserved_capacity(a: npt.NDArray[Any]) -> int:
    """How many elements ``a`` can grow to without a copy (its own size when not reserved)."""
    full = _whole(a)
    return a.size if full is None else full.size


def grown(a: npt.NDArray[Any], n: int, fill: Any = 0) -> npt.NDArray[Any]:
    """``a``'s values followed by ``fill`` up to ``n`` elements (``n >= a.size``).

    In place (the same memory, a longer view) when ``a`` is the start of a reserve that
    holds ``n``; else a new array, in a new reserve once it is large. Either way the old
    array must no longer be written: the caller replaces it with the result.

    Examples
    --------
    >>> a = grown(np.arange(3), 5, fill=-1)
    >>> a.tolist()
    [0, 1, 2, -1, -1]
    """
    if n < a.size:
        raise ValueError(f"cannot grow an array of {a.size} elements to {n}")
    full = _whole(a)
    if full is not None and n <= full.size:
        out = full[:n]  # the pages past a.size were never written: still zeros
    else:
        nbytes = n * a.itemsize
        m = None
        if nbytes >= RESERVE_FROM_BYTES:
            size = max(MIN_RESERVE_BYTES, RESERVE_FACTOR * nbytes)
            m = _reserve(size - size % a.itemsize)
        out = np.zeros(n, dtype=a.dtype) if m is None else np.frombuffer(m, dtype=a.dtype)[:n]
        out[: a.size] = a
    if fill and n > a.size:
        out[a.size:] = fill
    return out
