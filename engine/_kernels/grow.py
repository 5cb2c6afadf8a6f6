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
fresh column written in 4 KiB pages takes several times as long as in 2 MiB pages.

When the last view of a reserve is gone (its table was dropped, or it moved to a larger
reserve), the mapping is not unmapped but kept for the next reserve, its written pages
advised ``MADV_FREE``: the kernel takes them back only under memory pressure, and until
then the next table writes into pages that are already there. On a VM a fresh page costs
far more than a copy (figures: bench/README.md), so a table made and filled per load would
otherwise pay that for every row. At most
:data:`POOL_MAPPINGS` mappings holding :data:`POOL_BYTES` written bytes are kept; a reused
mapping's written part is zeroed as the array grows over it, so the result is the same
as from fresh pages.

Where the mapping cannot be made (a strict overcommit policy, an address-space limit, a
platform without anonymous ``mmap``), arrays grow by copying, as before. Nothing else
changes: the result is an ordinary writable numpy array; it is freed with its last view.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MIN_RESERVE_BYTES", "POOL_BYTES", "POOL_MAPPINGS", "RESERVE_FACTOR", "RESERVE_FROM_BYTES",
           "grown", "pooled", "reserved_capacity"]

#: Arrays of at least this many bytes grow inside a reserve (smaller ones by copying).
#: Below it glibc's heap serves them, reusing freed blocks with their pages mapped
#: (``flight.server.keep_freed_memory``); from 8 MB a table's columns live in reserves, and
#: with released reserves kept (below) a table made and filled per load writes into the
#: pages of the one dropped before it. (Without the pool, reserves from 8 MB made such a
#: table fault every page: 4 times the apply time, when reserves started at 32 MB.)
RESERVE_FROM_BYTES = 8 << 20
#: A new reserve holds this many times the array's new size ...
RESERVE_FACTOR = 16
#: ... and at least this many bytes.
MIN_RESERVE_BYTES = 1 << 30

#: Released reserves kept for reuse: at most this many mappings ...
POOL_MAPPINGS = 16
#: ... holding at most this many written (committed) bytes between them.
POOL_BYTES = 1 << 30

_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_NORESERVE", 0)


@dataclass(slots=True)
class _Mapping:
    """A reserve's mapping and how many of its bytes were ever handed out (may be written)."""

    mapping: mmap.mmap
    dirty: int = 0


_lock = threading.Lock()
_pool: list[_Mapping] = []  # released, newest last
_live: dict[int, _Mapping] = {}  # by start address, while an array uses it


def _address(a: npt.NDArray[Any]) -> int:
    return int(a.__array_interface__["data"][0])


def _release(m: _Mapping) -> None:
    """The last view of ``m`` is gone: keep it for the next reserve, or unmap it."""
    free = getattr(mmap, "MADV_FREE", None)
    if free is not None and m.dirty:
        try:
            m.mapping.madvise(free, 0, min(len(m.mapping), -(-m.dirty // mmap.PAGESIZE) * mmap.PAGESIZE))
        except (OSError, ValueError):  # a kernel without MADV_FREE: the pages stay as they are
            pass
    with _lock:  # an evicted mapping is unmapped when its last reference goes
        _pool.append(m)
        while len(_pool) > POOL_MAPPINGS or sum(p.dirty for p in _pool) > POOL_BYTES:
            _pool.pop(0)


def pooled() -> tuple[int, int]:
    """Released reserves kept for reuse: how many, and their written bytes."""
    with _lock:
        return len(_pool), sum(p.dirty for p in _pool)


def _take(nbytes: int) -> _Mapping | None:
    """A kept mapping of at least ``nbytes`` (the one with the most written), or None."""
    with _lock:
        fits = [i for i, p in enumerate(_pool) if len(p.mapping) >= nbytes]
        if not fits:
            return None
        return _pool.pop(max(fits, key=lambda i: _pool[i].dirty))


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

    ``fill=None`` leaves the new elements as the memory holds them (the kernel's zeros, or
    what an earlier array wrote into a reused reserve): for a caller that writes each one
    before it reads it, such as an append-only column, which then writes its rows once
    instead of zeroing them first.

    Examples
    --------
    >>> a = grown(np.arange(3), 5, fill=-1)
    >>> a.tolist()
    [0, 1, 2, -1, -1]
    """
    if n < a.size:
        raise ValueError(f"cannot grow an array of {a.size} elements to {n}")
    full = _whole(a)
    m = _live.get(_address(full)) if full is not None and n <= full.size else None
    if full is not None and m is not None:
        out = full[:n]  # pages past m.dirty were never written: still zeros
    else:
        nbytes = n * a.itemsize
        m = _new(nbytes) if nbytes >= RESERVE_FROM_BYTES else None
        if m is None:
            out = np.empty(n, dtype=a.dtype) if fill is None else np.zeros(n, dtype=a.dtype)
        else:
            whole = np.frombuffer(m.mapping, dtype=a.dtype, count=len(m.mapping) // a.itemsize)
            _live[_address(whole)] = m
            weakref.finalize(whole, _forget, _address(whole), m)
            out = whole[:n]
        out[: a.size] = a
    if m is not None:  # a reused mapping: what an earlier array wrote there reads as zeros
        dirty_end = min(n, -(-m.dirty // a.itemsize))
        if fill is not None and not fill and dirty_end > a.size:
            out[a.size:dirty_end] = 0
        m.dirty = max(m.dirty, n * a.itemsize)
    if fill is not None and fill and n > a.size:
        out[a.size:] = fill
    return out


def _new(nbytes: int) -> _Mapping | None:
    """A reserve for an array of ``nbytes``: a kept one that holds it, or a new mapping."""
    size = max(MIN_RESERVE_BYTES, RESERVE_FACTOR * nbytes)
    kept = _take(size)
    if kept is not None:
        return kept
    mapping = _reserve(size)
    return None if mapping is None else _Mapping(mapping)


def _forget(address: int, m: _Mapping) -> None:
    _live.pop(address, None)
    _release(m)
