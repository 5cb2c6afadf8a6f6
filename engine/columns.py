"""Column sources: row key -> value for one column, with previous values during a cycle.

Every source answers ``get(keys)`` (current values) and, while a cycle is updating,
``get_prev(keys)`` for keys of the *previous* key space (DESIGN.md §2). Writable sources
remember the old content of a slot the first time it is overwritten in a cycle, so
previous values cost memory only for what changed, and :meth:`end_cycle` drops them.

* :class:`NumpyColumnSource` — fixed-width types (ints, uints, floats, bool, timestamps,
  dates, durations) in a dense numpy array indexed by row key, plus a validity array
  created on the first null.
* :class:`ArrowColumnSource` — every other type (strings first of all): values live in
  append-only Arrow chunks, a dense int64 *slot* array maps row key -> value, and
  compaction at cycle end drops values no row points at. Gathers are Arrow ``take``.
  *Coded* (a keyed source's strings and binaries): each distinct value stored once, so a
  row's slot is its value's code and readers compare or group by codes.
* :class:`AppendColumnSource` — an append-only table's variable-width column: Arrow chunks
  merged geometrically, row key = position (no slot array).
* :class:`RemappedColumnSource` — a view of another source through a vectorized key map
  (ring buffers: key -> key % capacity).
* :class:`RedirectingColumnSource` — the base of columns read through a map their table's
  columns share; :func:`read_columns` reads several columns translating keys once per map.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine._kernels.arrays import aligned, member
from engine._kernels.grow import grown
from engine.errors import InputError, SchemaError
from engine.rowset import KeyArray, unique_keys

__all__ = [
    "AppendColumnSource",
    "ArrowColumnSource",
    "ColumnSource",
    "NumpyColumnSource",
    "RedirectingColumnSource",
    "RemappedColumnSource",
    "WritableColumnSource",
    "codable",
    "make_column_source",
    "numpy_storage_dtype",
    "read_columns",
    "read_range",
]


def numpy_storage_dtype(t: pa.DataType) -> np.dtype[Any] | None:
    """The numpy dtype that stores ``t`` bit for bit, or None if ``t`` is not fixed-width."""
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        if pa.types.is_float16(t):
            return None
        dtype: np.dtype[Any] = np.dtype(t.to_pandas_dtype())
        return dtype
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t):
        return np.dtype(np.int32)
    return None


def _as_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _as_typed_array(values: pa.Array | pa.ChunkedArray, type: pa.DataType) -> pa.Array:
    arr = _as_array(values)
    if arr.type != type:
        try:
            arr = arr.cast(type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"cannot store {arr.type} in a {type} column") from exc
    return arr


class ColumnSource:
    """Read side of a column: current and previous values by row key."""

    type: pa.DataType

    def get(self, keys: KeyArray) -> pa.Array:
        """Current values at ``keys`` (current key space), as an Arrow array."""
        raise NotImplementedError

    def get_prev(self, keys: KeyArray) -> pa.Array:
        """Values at ``keys`` (previous key space) as of the start of the cycle."""
        raise NotImplementedError

    def get_range(self, start: int, stop: int) -> pa.Array | pa.ChunkedArray:
        """Current values at keys ``start .. stop - 1`` (a snapshot of a dense table)."""
        return self.get(np.arange(start, stop, dtype=np.int64))

    def get_pylist(self, keys: KeyArray) -> list[Any]:
        """Current values at ``keys`` as Python values (``get(keys).to_pylist()``)."""
        out: list[Any] = self.get(keys).to_pylist()
        return out


class RedirectingColumnSource(ColumnSource):
    """A column that reads ``inner`` at keys translated by a map its table's other columns
    share (an aggregation's group slots, a sort's redirection, a computed column's slots).

    Subclasses give :meth:`translate`, :meth:`translate_prev` and :attr:`translation` (the
    shared map): :func:`read_columns` translates a batch of keys once per map, not once per
    column.
    """

    inner: ColumnSource

    @property
    def translation(self) -> object:
        """The object whose map this column reads through (shared by its sibling columns)."""
        raise NotImplementedError

    def translate(self, keys: KeyArray) -> KeyArray:
        """``inner``'s keys for current row ``keys``."""
        raise NotImplementedError

    def translate_prev(self, keys: KeyArray) -> KeyArray:
        """``inner``'s previous keys for row ``keys`` of the previous key space."""
        raise NotImplementedError

    def get(self, keys: KeyArray) -> pa.Array:
        return self.inner.get(self.translate(keys))

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self.inner.get_prev(self.translate_prev(keys))


def read_columns(sources: Iterable[ColumnSource], keys: KeyArray, *, prev: bool = False) -> list[pa.Array]:
    """Each source's current (``prev``: previous) values at ``keys``, as ``get`` gives them.

    Columns reading through the same map (:class:`RedirectingColumnSource`, nested or not)
    translate ``keys`` once between them: a 20-column aggregation looks its groups up once.
    """
    translated: dict[tuple[int, int], KeyArray] = {}  # (map, keys) -> keys; values keep ids alive

    def read(source: ColumnSource, at: KeyArray) -> pa.Array:
        while isinstance(source, RedirectingColumnSource):
            step = (id(source.translation), id(at))
            nxt = translated.get(step)
            if nxt is None:
                nxt = translated[step] = source.translate_prev(at) if prev else source.translate(at)
            source, at = source.inner, nxt
        return source.get_prev(at) if prev else source.get(at)

    return [read(s, keys) for s in sources]


def read_range(sources: Iterable[ColumnSource], start: int, stop: int) -> list[pa.Array | pa.ChunkedArray]:
    """Each source's current values at keys ``start .. stop - 1`` (a dense table's rows):
    ``get_range`` where a source stores by row key, one translation per map where not."""
    sources = list(sources)
    out: list[Any] = [None] * len(sources)
    redirected = []
    for i, s in enumerate(sources):
        if isinstance(s, RedirectingColumnSource):
            redirected.append(i)
        else:
            out[i] = s.get_range(start, stop)
    if redirected:
        keys = np.arange(start, stop, dtype=np.int64)
        for i, arr in zip(redirected, read_columns([sources[i] for i in redirected], keys), strict=True):
            out[i] = arr
    return out


class WritableColumnSource(ColumnSource):
    """A column source that owns its storage and tracks previous values while asked to."""

    def set(self, keys: KeyArray, values: pa.Array | pa.ChunkedArray) -> None:
        raise NotImplementedError

    def move(self, src: KeyArray, dst: KeyArray) -> None:
        """Bulk move for shifts: ``dst[i]`` takes the value of ``src[i]`` (all at once)."""
        self.set(dst, self.get(src))

    def set_new_range(self, start: int, values: pa.Array | pa.ChunkedArray) -> None:
        """Write ``values`` at keys ``start, start + 1, ...`` that held no row before this
        cycle (an append), so there is no previous value to keep."""
        self.set(np.arange(start, start + len(values), dtype=np.int64), values)

    def ensure_capacity(self, n: int) -> None:
        raise NotImplementedError

    def begin_cycle(self) -> None:
        """From now until :meth:`end_cycle`, overwritten values are kept as previous."""
        raise NotImplementedError

    def end_cycle(self) -> None:
        """Release previous values."""
        raise NotImplementedError


#: A cycle that saves at least a column's capacity over this many keys finds them through
#: a dense position array (:class:`_PrevSlots`).
PREV_DENSE_SHARE = 64


class _PrevSlots:
    """Old contents of slots overwritten this cycle: their keys, old values and validity,
    and how a key is found among them.

    Few keys are kept sorted and found by binary search. Once a cycle has saved a
    :data:`PREV_DENSE_SHARE`-th of the column's capacity, ``at`` indexes them instead: a
    dense position array over the column's slots (``at[key]``: the key's position, ``-1``
    for a key not saved), so a lookup is one gather (W1 at K=100,000: the cycle's
    previous-value lookups 3.1 -> 0.75 ms). Its 4 bytes a slot are kept by the column
    only while its cycles keep saving that many keys (:meth:`NumpyColumnSource.end_cycle`),
    and :meth:`forget` resets just the saved keys: a cycle's cost follows its keys.
    """

    __slots__ = ("keys", "values", "valid", "at")

    def __init__(self) -> None:
        self.keys: KeyArray = np.empty(0, dtype=np.int64)
        self.values: npt.NDArray[Any] | None = None
        self.valid: npt.NDArray[np.bool_] | None = None
        self.at: npt.NDArray[np.int32] | None = None

    def new_keys(self, keys: KeyArray) -> KeyArray:
        """The distinct keys among ``keys`` not saved yet."""
        k = unique_keys(keys)
        if self.keys.size:
            k = k[~member(self.keys, k)] if self.at is None else k[self.at[k] < 0]
        return k

    def add(self, keys: KeyArray, values: npt.NDArray[Any], valid: npt.NDArray[np.bool_]) -> None:
        """Save distinct ``keys`` (sorted) not saved yet, with their old values."""
        n = self.keys.size
        if self.values is None or n == 0:
            self.keys, self.values, self.valid = keys, values, valid
        else:
            assert self.valid is not None
            k = np.concatenate((self.keys, keys))
            v = np.concatenate((self.values, values))
            ok = np.concatenate((self.valid, valid))
            if self.at is None:  # kept sorted for the binary search
                order = np.argsort(k, kind="stable")
                k, v, ok = k[order], v[order], ok[order]
            self.keys, self.values, self.valid = k, v, ok
        if self.at is not None:
            self.at[keys] = np.arange(n, n + keys.size, dtype=np.int32)

    def index(self, at: npt.NDArray[np.int32]) -> None:
        """From now on find the saved keys through ``at`` (all ``-1``, the column's size)."""
        at[self.keys] = np.arange(self.keys.size, dtype=np.int32)
        self.at = at

    def lookup(self, keys: KeyArray) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.integer[Any]]]:
        """Which of ``keys`` are saved, and where: a position of ``keys``' saved values
        (some key saved) everywhere, meaningful where saved (so it can index unmasked)."""
        if self.at is not None:
            pos: npt.NDArray[np.integer[Any]] = self.at[keys]  # -1: not saved, the last position
            return pos >= 0, pos
        pos = np.searchsorted(self.keys, keys)
        np.minimum(pos, self.keys.size - 1, out=pos)
        return self.keys[pos] == keys, pos

    def forget(self) -> None:
        """Reset ``at`` at the saved keys (the cycle is over)."""
        if self.at is not None:
            self.at[self.keys] = -1


class NumpyColumnSource(WritableColumnSource):
    """Fixed-width values in a dense numpy array indexed by row key.

    Keys are offsets into the array, so use it for dense key spaces (sources, op-owned
    slots); sparse key spaces go through a redirection.

    Slots never written read as zero, unless ``written_before_read``: then the slots the
    array grows by hold whatever its memory held (see :func:`~engine._kernels.grow.grown`),
    for an owner that writes every key before any reader sees it (an append-only table,
    whose appends write their keys as the array grows to them).

    ``append_only``: a key once written is never written again (an append-only table's
    column), so :meth:`get_range` hands out its values without a copy: the array only
    grows past them, in place or into a new reserve that leaves the old one to its views
    (:func:`~engine._kernels.grow.grown`).
    """

    def __init__(self, type: pa.DataType, capacity: int = 0, *,
                 written_before_read: bool = False, append_only: bool = False) -> None:
        dtype = numpy_storage_dtype(type)
        if dtype is None:
            raise SchemaError(f"type {type} is not fixed-width; use ArrowColumnSource")
        self.type = type
        self.dtype = dtype
        self._tail: Any = None if written_before_read else 0  # grown's fill
        self._append_only = append_only
        self._values: npt.NDArray[Any] = np.zeros(max(capacity, 16), dtype=dtype)
        self._valid: npt.NDArray[np.bool_] | None = None
        self._prev: _PrevSlots | None = None
        self._prev_at: npt.NDArray[np.int32] | None = None  # _PrevSlots.at, between cycles

    # storage --------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self._values.size)

    def ensure_capacity(self, n: int) -> None:
        if n <= self._values.size:
            return
        cap = max(n, self._values.size * 2)
        self._values = grown(self._values, cap, self._tail)  # large: in place (_kernels/grow.py)
        if self._prev_at is not None:
            self._prev_at = grown(self._prev_at, cap, -1)
            if self._prev is not None and self._prev.at is not None:
                self._prev.at = self._prev_at
        if self._valid is not None:
            self._valid = grown(self._valid, cap, True)

    def _split(self, values: pa.Array | pa.ChunkedArray) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_] | None]:
        arr = _as_typed_array(values, self.type)
        valid = None
        if arr.null_count:
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_boolean(arr.type):
            data = (pc.fill_null(arr, False) if arr.null_count else arr).to_numpy(zero_copy_only=False)
        else:
            buf = arr.buffers()[1]
            data = np.frombuffer(buf, dtype=self.dtype, count=arr.offset + len(arr))[arr.offset :]
        return data, valid

    def _to_arrow(self, data: npt.NDArray[Any], valid: npt.NDArray[np.bool_] | None) -> pa.Array:
        n = data.size
        if valid is not None and valid.all():
            valid = None
        if pa.types.is_boolean(self.type):
            return pa.array(data, type=pa.bool_(), mask=None if valid is None else ~valid)
        mask_buf = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = 0 if valid is None else int(n - np.count_nonzero(valid))
        data = np.ascontiguousarray(data)
        return pa.Array.from_buffers(self.type, n, [mask_buf, pa.py_buffer(data)], null_count)

    # reading ----------------------------------------------------------------------
    def get_numpy(self, keys: KeyArray) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_] | None]:
        """Current ``(values, validity or None)`` at ``keys``."""
        return _gather(self._values, keys), None if self._valid is None else self._valid.take(keys)

    def get_prev_numpy(self, keys: KeyArray) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_] | None]:
        """Previous ``(values, validity or None)`` at previous-key-space ``keys``."""
        # fresh arrays (gathers), so the saved values are written into them
        values = _gather(self._values, keys)
        valid = None if self._valid is None else self._valid.take(keys)
        p = self._prev
        if p is None or p.keys.size == 0:
            return values, valid
        hit, pos = p.lookup(keys)
        if hit.any():
            assert p.values is not None and p.valid is not None
            # unmasked gathers of the saved values, one masked copy: no compress of hits
            np.copyto(values, p.values[pos], where=hit)
            if valid is not None or not p.valid.all():
                if valid is None:
                    valid = np.ones(keys.size, dtype=bool)
                np.copyto(valid, p.valid[pos], where=hit)
        return values, valid

    def get(self, keys: KeyArray) -> pa.Array:
        return self._to_arrow(*self.get_numpy(keys))

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self._to_arrow(*self.get_prev_numpy(keys))

    def get_range(self, start: int, stop: int) -> pa.Array:
        n = stop - start
        if self._append_only and self._values.dtype != np.bool_:
            # no copy: these keys are never written again (a snapshot of 10M rows in
            # microseconds instead of a copy under the graph's shared lock)
            valid = None if self._valid is None else self._valid[start:stop]
            return self._to_arrow(self._values[start:stop], valid)
        if n < _POOL_GATHER or self._values.dtype == np.bool_:
            return super().get_range(start, stop)
        buf = pa.allocate_buffer(n * self._values.itemsize)  # see _gather
        data = np.frombuffer(buf, dtype=self._values.dtype)
        data[:] = self._values[start:stop]  # one copy: later cycles overwrite _values
        valid = None if self._valid is None else self._valid[start:stop].copy()
        return self._to_arrow(data, valid)

    # writing ----------------------------------------------------------------------
    def _save_prev(self, keys: KeyArray) -> None:
        p = self._prev
        if p is None:
            return
        new = p.new_keys(keys)
        if new.size:
            valid = np.ones(new.size, dtype=bool) if self._valid is None else self._valid[new]
            p.add(new, self._values[new], valid)
            if p.at is None and p.keys.size * PREV_DENSE_SHARE >= self._values.size:
                if self._prev_at is None or self._prev_at.size != self._values.size:
                    self._prev_at = np.full(self._values.size, -1, dtype=np.int32)
                p.index(self._prev_at)

    def set(self, keys: KeyArray, values: pa.Array | pa.ChunkedArray) -> None:
        data, valid = self._split(values)
        self.set_numpy(keys, data, valid)

    def set_numpy(
        self, keys: KeyArray, data: npt.NDArray[Any], valid: npt.NDArray[np.bool_] | None = None
    ) -> None:
        """Write raw values (and validity, None meaning all valid) at ``keys``."""
        if keys.size == 0:
            return
        self.ensure_capacity(int(keys.max()) + 1)
        self._save_prev(keys)
        self._values[keys] = data
        if valid is not None and not valid.all():
            if self._valid is None:
                self._valid = np.ones(self._values.size, dtype=bool)
            self._valid[keys] = valid
        elif self._valid is not None:
            self._valid[keys] = True

    def set_new_range(self, start: int, values: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(values, pa.ChunkedArray) and values.num_chunks > 1:
            # chunk by chunk into place: no combined copy of the whole append first (a fresh
            # buffer as large as the append, whose page faults cost more than the copy)
            self.ensure_capacity(start + len(values))
            for chunk in values.chunks:
                self.set_new_range_numpy(start, *self._split(chunk))
                start += len(chunk)
            return
        data, valid = self._split(values)
        self.set_new_range_numpy(start, data, valid)

    def set_new_range_run(self, start: int, first: int, n: int) -> None:
        """:meth:`set_new_range` of the values ``first, first + 1, ...`` (an int column),
        written block by block without materializing them."""
        if n == 0:
            return
        self.ensure_capacity(start + n)
        out = self._values[start:start + n]
        for b in range(0, n, _RUN_BLOCK.size):
            m = min(_RUN_BLOCK.size, n - b)
            np.add(_RUN_BLOCK[:m], first + b, out=out[b:b + m])
        if self._valid is not None:
            self._valid[start:start + n] = True

    def set_new_range_numpy(self, start: int, data: npt.NDArray[Any],
                            valid: npt.NDArray[np.bool_] | None = None) -> None:
        """:meth:`set_new_range` of raw values: slice writes, nothing saved as previous."""
        n = data.size
        if n == 0:
            return
        end = start + n
        self.ensure_capacity(end)
        self._values[start:end] = data
        if valid is not None and not valid.all():
            if self._valid is None:
                self._valid = np.ones(self._values.size, dtype=bool)
            self._valid[start:end] = valid
        elif self._valid is not None:
            self._valid[start:end] = True

    def move(self, src: KeyArray, dst: KeyArray) -> None:
        if src.size == 0:
            return
        data, valid = self.get_numpy(src)
        self.set_numpy(dst, data.copy(), None if valid is None else valid.copy())

    def begin_cycle(self) -> None:
        if self._prev is None:
            self._prev = _PrevSlots()

    def end_cycle(self) -> None:
        p = self._prev
        if p is not None and p.at is not None:
            p.forget()  # kept for the next cycle that saves as many keys
        elif p is not None:
            self._prev_at = None  # a cycle that saved few keys: its 4 bytes a slot go
        self._prev = None


#: 0, 1, 2, ...: the block :meth:`NumpyColumnSource.set_new_range_run` adds an offset to.
_RUN_BLOCK = np.arange(1 << 16, dtype=np.int64)

#: Gathers of at least this many values go to Arrow's memory pool (see :func:`_gather`).
_POOL_GATHER = 1 << 16


def _gather(values: npt.NDArray[Any], keys: KeyArray) -> npt.NDArray[Any]:
    """``values[keys]``; a large result is written into a buffer of Arrow's memory pool.

    A snapshot of a big table gathers hundreds of MB per call. numpy's allocations of that
    size are fresh ``mmap``s, returned to the OS when freed, so every snapshot paid the page
    faults again; the Arrow pool (mimalloc/jemalloc) keeps and reuses them. The array is
    then wrapped for Arrow without a copy either way.
    """
    if keys.size < _POOL_GATHER or values.dtype == np.bool_:
        return values.take(keys)  # take: about a third cheaper than fancy indexing
    buf = pa.allocate_buffer(keys.size * values.itemsize)
    out = np.frombuffer(buf, dtype=values.dtype)
    np.take(values, keys, out=out)
    return out


#: ArrowColumnSource.get_pylist reads up to this many values one by one (tests change it)
_FEW_SCALARS = 16


def _keepable(chunks: list[pa.Array], keep_bytes: int) -> bool:
    """Whether waiting ``chunks`` may stay as they came: ``keep_bytes`` or more on average,
    and none a small slice of a larger buffer (kept, it would hold the whole buffer)."""
    used = [c.nbytes for c in chunks]
    if sum(used) < keep_bytes * len(chunks):
        return False
    for c, u in zip(chunks, used, strict=True):
        # what keeping the chunk holds: its buffers whole (a sliced array's are), or the
        # buffer each is a view of (a column of a decoded Flight body: the whole body)
        held = sum(b.size if b.parent is None else b.parent.size for b in c.buffers() if b is not None)
        if held > 2 * u + keep_bytes:
            return False
    return True


def _level(n: int, fan: int) -> int:
    """The level of a chunk of ``n`` values: ``floor(log_fan(n))`` (``fan`` a power of 2)."""
    return (max(n, 1).bit_length() - 1) // (fan.bit_length() - 1)


class _ArrowStore:
    """Append-only Arrow values in a few geometrically sized chunks (cheap ``take``).

    Chunks merge by levels (a tiered LSM): a chunk of ``n`` values is of level
    ``floor(log_fan(n))``; ``fan_in`` chunks of one level merge into one of the next, and
    a chunk of a lower level than an append is merged into it. Each value is copied about
    ``log_fan(n / append)`` times (a binary counter copies it ``log_2`` times: measured at
    1,000 appends of 1,000 URLs, 0.06 s of copying against 0.21-0.32 s), for at most
    ``fan_in - 1`` chunks a level (a random gather of 1,000 of those 1M values: 0.17 ms
    against 0.12 ms in 2 chunks). No merge makes a chunk of more than ``max_merge`` values:
    the cycle that makes one waits for its whole copy. Past that size chunks just
    accumulate; a gather takes from each chunk it hits.

    With :attr:`defer` set (an append-only table's columns), appends are kept as they came
    and merged together later, as one append, once more than ``defer`` of them wait or a
    gather needs the store (:meth:`settle`): a column nobody gathers from (a source's
    strings that no operator reads) copies each value once per ``defer`` appends instead of
    at every level, and one that is gathered from every cycle merges as before. Runs of
    consecutive slots (a cycle's new rows) read the waiting chunks as slices.

    Until the first gather, waiting appends that are large (:attr:`keep_bytes` on average,
    none a small slice of a larger buffer) are not merged when they settle but kept as
    they came, each a chunk of its own: a source's column that no operator gathers from
    (q5's bid URLs) is never copied, where each settle copied it into fresh memory (page
    faults cost more than the copy). The chunks' overhead is bounded by their size, and
    appends stay ``O(1)`` however many chunks there are (:attr:`offsets` grows in a
    reserve). The first gather merges every chunk kept so far by levels, as appends of up
    to ``max_merge`` values (each value copied about once more), and from then on the
    store merges as above.

    Readers share the graph's lock, and a gather merges the waiting appends: every read
    and every change of the chunks holds the store's own lock, so a run read on one thread
    never meets the chunk list another thread's gather is merging.
    """

    #: no merge makes a chunk larger than this (an append larger than it stays whole)
    max_merge = 1 << 21
    #: chunks of one level that merge into one of the next
    fan_in = 4
    #: a gather across the chunks of a store of at most this many values concatenates them
    #: and takes once: 3 values of a 4-chunk, 12-value store (a small keyed table's strings)
    #: 40 -> 6 us; 4,096 values in 12 chunks 16 us
    small = 4096
    #: a gather of at least this many slots checks whether they ascend (a pass over them),
    #: which saves a search per slot and a second take (module tests lower it)
    ordered_min = 256
    #: appends kept unmerged until more than this many wait (0: each merges at once)
    defer = 0
    #: before the first gather, waiting appends of at least this many bytes on average are
    #: kept as they came when they settle (no copy): a chunk's own overhead (its Python and
    #: Arrow objects, under a kilobyte) stays a small part of it. 64 appends of 920 URLs,
    #: 4 MB, were copied in 0.4-10 ms depending on whether the allocator had the pages
    keep_bytes = 8 << 10

    def __init__(self, type: pa.DataType, *, null_slot: bool = True, defer: int = 0) -> None:
        self.type = type
        # slot 0 is the null default unless told otherwise
        self.chunks: list[pa.Array] = [pa.nulls(1, type)] if null_slot else []
        # chunk c holds slots offsets[c] .. offsets[c + 1] - 1; ``offsets`` is a view of
        # the start of ``_offsets``, which has room to append ends without a copy
        self._offsets = np.zeros(64, dtype=np.int64)
        self.offsets: npt.NDArray[np.int64] = self._offsets[:0]
        self._push_ends(np.array([0, 1] if null_slot else [0], dtype=np.int64))
        self.defer = defer
        self._pending = 0  # the last chunks: appends not merged yet
        self._gathered = False  # a gather has read the store: settles merge from then on
        self._kept = 0  # chunks kept as they came at a settle, never merged (class docstring)
        self._lock = threading.RLock()  # the chunks' changes and reads (class docstring)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def append(self, values: pa.Array) -> npt.NDArray[np.int64]:
        """Store ``values``; returns their slots."""
        start = self.append_run(values)
        return np.arange(start, start + len(values), dtype=np.int64)

    def append_run(self, values: pa.Array | pa.ChunkedArray) -> int:
        """Store ``values`` as one chunk; returns the first of their (consecutive) slots.

        Merging by levels (class docstring) keeps ``O(fan_in log_fan n)`` chunks below
        ``max_merge``, ``O(log_fan max_merge)`` copies per value, and no merge copies more
        than ``max_merge`` values in one cycle. The merges an
        append sets off are worked out on lengths first and made in one concatenation of
        the stored chunks they take and ``values``' own chunks, so each value is copied
        once per append: not once to combine an append of several chunks, again per merge.
        """
        new = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
        n = sum(len(c) for c in new)
        with self._lock:
            start = len(self)
            if n == 0:
                return start
            if self.defer:  # kept as it came (realigned if need be), merged later
                parts = [aligned(c) for c in new if len(c)]
                self.chunks.extend(parts)
                if len(parts) == 1:
                    self._push_ends(np.array([start + n], dtype=np.int64))
                else:
                    self._push_ends(start + np.cumsum([len(c) for c in parts]))
                self._pending += len(parts)
                if self._pending > self.defer:
                    self.settle()
                return start
            self._merge_in(new, n)
            return start

    def _push_ends(self, ends: npt.NDArray[np.int64]) -> None:
        """Append chunk ends to :attr:`offsets` (amortized: the reserve doubles when full)."""
        n, m = self.offsets.size, ends.size
        if n + m > self._offsets.size:
            grown = np.zeros(max(2 * self._offsets.size, n + m), dtype=np.int64)
            grown[:n] = self.offsets
            self._offsets = grown
        self._offsets[n : n + m] = ends
        self.offsets = self._offsets[: n + m]

    def settle(self) -> None:
        """Merge the appends kept unmerged (:attr:`defer`), as one append of all of them;
        before the first gather, large ones are kept as they came (class docstring)."""
        with self._lock:
            k = self._pending
            if not k:
                return
            self._pending = 0
            new = self.chunks[-k:]
            if not self._gathered and _keepable(new, self.keep_bytes):
                self._kept += k  # each stays a chunk of its own: no copy
                return
            del self.chunks[-k:]  # the offsets stay whole until the merge's (same length)
            self._merge_in(new, sum(len(c) for c in new))

    def _first_gather(self) -> None:
        """Before the first gather: merge the chunks kept as they came (by levels, as
        appends of at most ``max_merge`` values) and the waiting ones; settles merge from
        now on."""
        self._gathered = True
        if not self._kept:
            self.settle()
            return
        old = self.chunks
        self.chunks, self._pending, self._kept = [], 0, 0
        self.offsets = self._offsets[:0]
        self._push_ends(np.zeros(1, dtype=np.int64))
        group: list[pa.Array] = []
        n = 0
        for c in old:  # one pass over the chunks, each copied once here
            if group and n + len(c) > self.max_merge:
                self._merge_in(group, n)
                group, n = [], 0
            group.append(c)
            n += len(c)
        if group:
            self._merge_in(group, n)

    def _merge_in(self, new: list[pa.Array], n: int) -> None:
        """Store the ``n`` values of the chunks ``new`` as one chunk, with the merges by
        levels they set off (see :meth:`append_run`)."""
        offs = self.offsets  # the stored chunks' bounds: offs[:len(chunks) + 1]

        def length(c: int) -> int:  # read from the end only: no pass over every chunk
            return int(offs[c + 1] - offs[c])

        last, keep = n, len(self.chunks)  # the new last chunk's length; stored chunks kept
        fan = self.fan_in
        while keep >= 1:
            level = _level(last, fan)
            if _level(length(keep - 1), fan) < level:  # a smaller chunk before a larger append
                if last + length(keep - 1) > self.max_merge:
                    break
                keep -= 1
                last += length(keep)
                continue
            # fan - 1 stored chunks of the new last chunk's level: the fan merge into one
            j = keep
            while j >= 1 and keep - j < fan - 1 and _level(length(j - 1), fan) == level:
                j -= 1
            if keep - j < fan - 1 or last + int(offs[keep] - offs[j]) > self.max_merge:
                break
            last += int(offs[keep] - offs[j])
            keep = j
        parts = [*self.chunks[keep:], *(c for c in new if len(c))]
        # one part is kept as it is, realigned if need be (a decoded Flight body may not be
        # aligned); a concatenation is a new, aligned array
        self.chunks[keep:] = [aligned(parts[0]) if len(parts) == 1 else pa.concat_arrays(parts)]
        base = int(offs[keep])
        self.offsets = self._offsets[: keep + 1]  # the kept chunks' bounds, then the new end
        self._push_ends(np.array([base + last], dtype=np.int64))

    def take(self, slots: npt.NDArray[np.int64]) -> pa.Array:
        if slots.size == 0:
            return pa.array([], type=self.type)
        with self._lock:
            return self._take(slots)

    def _take(self, slots: npt.NDArray[np.int64]) -> pa.Array:
        first = int(slots[0])
        if slots.size == 1 or (int(slots[-1]) - first == slots.size - 1
                               and bool((np.diff(slots) == 1).all())):
            return self._run(first, slots.size)  # e.g. a whole append-only table: slices
        if not self._gathered:  # the first gather: the chunks kept so far merge
            self._first_gather()
        elif self._pending:  # a gather: the waiting appends merge first
            self.settle()
        if len(self.chunks) == 1:
            return self.chunks[0].take(pa.array(slots))
        if len(self) <= self.small:  # one concatenation of a few values, one take
            return pa.concat_arrays(self.chunks).take(pa.array(slots))
        if slots.size >= self.ordered_min and bool((slots[1:] >= slots[:-1]).all()):
            # ascending slots (rows read in row-key order whose values were never rewritten,
            # e.g. a keyed source's strings): each chunk's are one run of them, cut at the
            # chunk bounds, and the parts are already in order (no search per slot, no
            # sort, no take back into order: 100k strings of 1M in 7 chunks 1.4 -> 0.5 ms)
            bounds = np.searchsorted(slots, self.offsets).tolist()
            parts = [self.chunks[c].take(pa.array(slots[bounds[c]:bounds[c + 1]] - self.offsets[c]))
                     for c in range(len(self.chunks)) if bounds[c + 1] > bounds[c]]
            return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        which = np.searchsorted(self.offsets, slots, side="right") - 1
        if which.min() == which.max():
            c = int(which[0])
            return self.chunks[c].take(pa.array(slots - self.offsets[c]))
        # one take per chunk hit (of its slots, grouped), then one take back into order
        order = np.argsort(which, kind="stable")
        local = pa.array((slots - self.offsets[which])[order])
        bounds = np.searchsorted(which[order], np.arange(len(self.chunks) + 1)).tolist()
        parts = [self.chunks[c].take(local.slice(bounds[c], bounds[c + 1] - bounds[c]))
                 for c in range(len(self.chunks)) if bounds[c + 1] > bounds[c]]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return pa.concat_arrays(parts).take(pa.array(inverse))

    def pylist(self, slots: list[int]) -> list[Any]:
        """Python values at ``slots``, one scalar read each (callers bound ``len(slots)``)."""
        with self._lock:
            at = (np.searchsorted(self.offsets, slots, side="right") - 1).tolist()
            offsets = self.offsets[at].tolist()
            # at most _FEW_SCALARS (ArrowColumnSource.get_pylist)
            return [self.chunks[c][s - o].as_py() for s, c, o in zip(slots, at, offsets, strict=True)]

    def _run(self, first: int, n: int) -> pa.Array:
        """Slots ``first .. first + n - 1``: chunk slices, no gather."""
        parts = self._slices(first, n)
        return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)

    def _slices(self, first: int, n: int) -> list[pa.Array]:
        c = int(np.searchsorted(self.offsets, first, side="right")) - 1
        parts = []
        pos, left = first, n
        while left > 0:  # one slice per chunk the run crosses
            off = int(self.offsets[c])
            take = min(left, len(self.chunks[c]) - (pos - off))
            parts.append(self.chunks[c].slice(pos - off, take))
            pos, left, c = pos + take, left - take, c + 1
        return parts or [pa.array([], type=self.type)]

    def run_chunked(self, first: int, n: int) -> pa.ChunkedArray:
        """Slots ``first .. first + n - 1`` as a chunked array of chunk slices (no copy)."""
        with self._lock:
            return pa.chunked_array(self._slices(first, n), type=self.type)


#: a coded :class:`ArrowColumnSource` keeps at most this many distinct values (and its
#: null); a write that would pass it leaves the column uncoded for good. A write of more
#: than :data:`FEW_ENCODE` values looks them up in all of them (Arrow's ``index_in`` builds
#: its hash set per call), so it costs ``O(distinct + written)``: 2,000 strings among 1,000
#: ~60 us, among 4,096 ~240 us, among 65,536 ~5 ms (one of the 2-core VM's slower days)
CODED_MAX = 4096

#: a coded write of at most this many values looks each up in a dict of the stored
#: values: ``O(written)``, whatever the number of distinct values (a cycle's few writes
#: into a column of thousands of names pay for their own values, not the dictionary's)
FEW_ENCODE = 64


def codable(type: pa.DataType) -> bool:
    """Whether an :class:`ArrowColumnSource` of ``type`` can be coded (strings, binaries)."""
    return bool(pa.types.is_string(type) or pa.types.is_large_string(type)
                or pa.types.is_binary(type) or pa.types.is_large_binary(type))


class ArrowColumnSource(WritableColumnSource):
    """Any Arrow type, values in append-only chunks and a slot per row key.

    Overwriting a row appends its new value and repoints the slot, so previous values
    are still in the store for the rest of the cycle; :meth:`end_cycle` compacts the
    store when more than half of it is unreachable.

    ``coded`` (strings and binaries, :func:`codable`): the store holds each distinct value
    once (slot 0 the null), so a row's slot is its value's *code*: equal codes are equal
    values, exactly. A write looks its values up among the stored ones (:meth:`encode`)
    and appends only those not held yet; readers compare and group by codes
    (:meth:`codes`: a keyed source's modified rows, ``agg_by``'s groups) instead of
    gathering, hashing and comparing strings. Past :data:`CODED_MAX` distinct values the
    column stops coding (its slots stay valid, no longer distinct); :attr:`code_epoch`
    changes whenever a code may stop standing for the value it stood for (the column
    stops coding, or a compaction renumbers the store), so a reader's map of codes is
    valid while the epoch it was built in lasts.
    """

    def __init__(self, type: pa.DataType, capacity: int = 0, *, coded: bool = False) -> None:
        self.type = type
        self._store = _ArrowStore(type)
        self._slots = NumpyColumnSource(pa.int64(), capacity)
        self._live = 0
        #: coded: every stored value as one array (slot order, slot 0 the null) and the
        #: lookup options over it; None when not coded
        self._dict: pa.Array | None = None
        self._lookup: pc.SetLookupOptions | None = None
        self._py: list[Any] | None = None  # coded: the stored values as Python values
        self._code_of: dict[Any, int] = {}  # coded: code (slot) per stored Python value
        self.code_epoch = 0
        if coded and codable(type):
            self._set_dict(pa.nulls(1, type))

    def _set_dict(self, values: pa.Array, added: pa.Array | None = None) -> None:
        """Code by ``values``; ``added``: the values it has past the current dictionary."""
        self._dict = values
        self._lookup = pc.SetLookupOptions(value_set=values, skip_nulls=False)  # null -> slot 0
        if added is None or self._py is None:
            self._py = values.to_pylist()
            self._code_of = {v: i for i, v in enumerate(self._py)}
        else:  # the new values only: a growing dictionary costs what it grows by
            new = added.to_pylist()
            self._code_of.update(zip(new, range(len(self._py), len(self._py) + len(new)), strict=True))
            self._py.extend(new)

    @property
    def coded(self) -> bool:
        """Whether slots are codes now (equal slots, equal values; class docstring)."""
        return self._dict is not None

    def codes(self, keys: KeyArray) -> npt.NDArray[np.int64]:
        """The codes (slots) of the current values at ``keys``; meaningful while :attr:`coded`."""
        out: npt.NDArray[np.int64] = self._slots.get_numpy(keys)[0]
        return out

    def encode(self, values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64] | None:
        """The codes of ``values``, storing those not held yet; None when the column is
        not coded, or stops coding here (they would pass :data:`CODED_MAX`). Codes are
        slots: write them with :meth:`set_codes` or :meth:`set_new_range_codes`."""
        if self._dict is None:
            return None
        if values.type != self.type:
            values = _as_typed_array(values, self.type)
        if len(values) <= FEW_ENCODE:
            return self._encode_few(values.to_pylist())
        found = pc.call_function("index_in", [values], self._lookup)
        if found.null_count:  # values not held yet (a null value finds slot 0)
            new = pc.unique(values.filter(found.is_null()))
            if len(self._dict) + len(new) > CODED_MAX + 1:
                self._uncode()
                return None
            new = _as_array(new)
            start = self._store.append_run(new)
            assert start == len(self._dict), (start, len(self._dict))
            self._set_dict(pa.concat_arrays([self._dict, new]), new)
            found = pc.call_function("index_in", [values], self._lookup)
        codes = found.to_numpy()
        out: npt.NDArray[np.int64] = codes.astype(np.int64)
        return out

    def _encode_few(self, values: list[Any]) -> npt.NDArray[np.int64] | None:
        """:meth:`encode` of a few values, each looked up in ``_code_of``."""
        code_of = self._code_of
        codes = [code_of.get(v, -1) for v in values]  # a null is slot 0's None
        if -1 in codes:  # values not held yet: stored once each, in order of first sight
            new = list(dict.fromkeys(v for v, c in zip(values, codes, strict=True) if c < 0))
            assert self._dict is not None
            if len(self._dict) + len(new) > CODED_MAX + 1:
                self._uncode()
                return None
            added = pa.array(new, type=self.type)
            start = self._store.append_run(added)
            assert start == len(self._dict), (start, len(self._dict))
            self._set_dict(pa.concat_arrays([self._dict, added]), added)
            codes = [code_of[v] for v in values]
        return np.array(codes, dtype=np.int64)

    def _uncode(self) -> None:
        """Stop coding: later writes append their values as an uncoded column's do."""
        self._dict = self._lookup = self._py = None
        self._code_of = {}
        self.code_epoch += 1

    def ensure_capacity(self, n: int) -> None:
        self._slots.ensure_capacity(n)

    def _take(self, slots: npt.NDArray[np.int64]) -> pa.Array:
        d = self._dict
        if d is not None:  # every value in one array: one take, no chunks to cross
            return d.take(pa.array(slots)) if slots.size else pa.array([], type=self.type)
        return self._store.take(slots)

    def get(self, keys: KeyArray) -> pa.Array:
        return self._take(self._slots.get_numpy(keys)[0])

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self._take(self._slots.get_prev_numpy(keys)[0])

    def get_range(self, start: int, stop: int) -> pa.Array:
        return self._take(self._slots._values[start:stop])

    def get_pylist(self, keys: KeyArray) -> list[Any]:
        # a few values read one by one: no gather, no Arrow array to convert back
        if keys.size > _FEW_SCALARS:
            return super().get_pylist(keys)
        slots = self._slots.get_numpy(keys)[0].tolist()
        py = self._py
        if py is not None:  # coded: every value held as a Python value too
            return [py[s] for s in slots]
        return self._store.pylist(slots)

    def set(self, keys: KeyArray, values: pa.Array | pa.ChunkedArray) -> None:
        if keys.size == 0:
            return
        codes = self.encode(values)
        if codes is not None:
            self._slots.set_numpy(keys, codes)
            return
        slots = self._store.append(_as_typed_array(values, self.type))
        self._slots.set_numpy(keys, slots)

    def set_codes(self, keys: KeyArray, codes: npt.NDArray[np.int64]) -> None:
        """Write values by their codes (:meth:`encode`'s, this epoch's) at ``keys``."""
        self._slots.set_numpy(keys, codes)

    def set_new_range(self, start: int, values: pa.Array | pa.ChunkedArray) -> None:
        if len(values):
            codes = self.encode(values)
            if codes is not None:
                self._slots.set_new_range_numpy(start, codes)
                return
            first = self._store.append_run(_as_typed_array(values, self.type))
            self._slots.set_new_range_run(start, first, len(values))

    def set_new_range_codes(self, start: int, codes: npt.NDArray[np.int64]) -> None:
        """:meth:`set_new_range` of values by their codes (:meth:`encode`'s, this epoch's)."""
        self._slots.set_new_range_numpy(start, codes)

    def move(self, src: KeyArray, dst: KeyArray) -> None:
        if src.size:
            self._slots.set_numpy(dst, self._slots.get_numpy(src)[0].copy())

    def begin_cycle(self) -> None:
        self._slots.begin_cycle()

    def end_cycle(self) -> None:
        self._slots.end_cycle()

    def needs_compaction(self, live: int) -> bool:
        """True when most of the store is unreachable from ``live`` rows."""
        return len(self._store) > 2 * max(live, 1024)

    def compact(self, live_keys: KeyArray) -> None:
        """Rewrite the store to hold only the values of ``live_keys`` (outside a cycle)."""
        values = self.get(live_keys)
        self._store = _ArrowStore(self.type)
        if self._dict is not None:  # renumbered: codes of the last epoch mean nothing now
            self._set_dict(pa.nulls(1, self.type))
            self.code_epoch += 1
            codes = self.encode(values)
            if codes is not None:
                self._slots.set_numpy(live_keys, codes)
                return
        self._slots.set_numpy(live_keys, self._store.append(values))


def compact_stale(sources: Iterable[ColumnSource], live: int, live_keys: Callable[[], KeyArray]) -> None:
    """Compact each :class:`ArrowColumnSource` among ``sources`` whose store is mostly
    unreachable from its ``live`` rows, keeping the values of ``live_keys()`` (asked for
    once, only when one needs it). Call outside a cycle's writes (a table's end of cycle)."""
    stale = [s for s in sources if isinstance(s, ArrowColumnSource) and s.needs_compaction(live)]
    if stale:
        keys = live_keys()
        for src in stale:
            src.compact(keys)


#: appends an append-only column keeps unmerged before merging them (``_ArrowStore.defer``)
APPEND_DEFER = 64


class AppendColumnSource(WritableColumnSource):
    """An append-only table's column, any type: row key ``k`` is position ``k`` in Arrow
    chunks (no slot array, no null slot). Appends wait as they came (up to
    :data:`APPEND_DEFER` of them, or until a gather), then merge as one chunk, and chunks
    merge by levels (``O(log n)`` chunks, so a gather of random keys takes from a few
    chunks). Rows never change, so previous values are current values.
    """

    def __init__(self, type: pa.DataType) -> None:
        self.type = type
        # a source's column that no operator gathers from merges its appends rarely
        self._store = _ArrowStore(type, null_slot=False, defer=APPEND_DEFER)

    def __len__(self) -> int:
        return len(self._store)

    def ensure_capacity(self, n: int) -> None:
        pass  # chunks arrive with their storage

    def get(self, keys: KeyArray) -> pa.Array:
        return self._store.take(np.asarray(keys, dtype=np.int64))

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self.get(keys)

    def get_range(self, start: int, stop: int) -> pa.ChunkedArray:
        """Keys ``start .. stop - 1`` as slices of the stored chunks (no copy)."""
        return self._store.run_chunked(start, stop - start)

    def set(self, keys: KeyArray, values: pa.Array | pa.ChunkedArray) -> None:
        raise InputError("rows of an append-only table cannot be overwritten")

    def move(self, src: KeyArray, dst: KeyArray) -> None:
        raise InputError("rows of an append-only table cannot move")

    def set_new_range(self, start: int, values: pa.Array | pa.ChunkedArray) -> None:
        if start != len(self._store):
            raise InputError(f"append at key {start}, but the column holds {len(self._store)} rows")
        if len(values):  # one chunk per append: its chunks concatenated with any merge
            if values.type != self.type:
                values = _as_typed_array(values, self.type)
            self._store.append_run(values)

    def begin_cycle(self) -> None:
        pass  # nothing is overwritten: no previous values to keep

    def end_cycle(self) -> None:
        pass


class RemappedColumnSource(ColumnSource):
    """Reads another source through a vectorized key map (e.g. ring slots)."""

    def __init__(self, inner: ColumnSource, key_map: Callable[[KeyArray], KeyArray]) -> None:
        self.inner = inner
        self.type = inner.type
        self._map = key_map

    def get(self, keys: KeyArray) -> pa.Array:
        return self.inner.get(self._map(keys))

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self.inner.get_prev(self._map(keys))


def make_column_source(type: pa.DataType, capacity: int = 0) -> WritableColumnSource:
    """The best writable source for ``type``."""
    if numpy_storage_dtype(type) is not None:
        return NumpyColumnSource(type, capacity)
    return ArrowColumnSource(type, capacity)
