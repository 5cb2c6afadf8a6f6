"""Array helpers written once: distinct values, membership, range expansion, bit scans,
key shifts, bitmaps from keys or ranges, the numeric view of an Arrow column, and aligned
copies of Arrow data that is not.

Every helper takes whole numpy arrays and loops over none of their elements in Python.
They replace copies that lived in the join state, the sort index, the row-set module and
the client: sort-based on purpose, because numpy 2.x's hash-based ``np.unique`` and
``np.isin`` are slower on large int64 arrays (``bench/bench_library.py`` measures it).

Row keys are non-negative int64; shift ranges are ``(begin, end, delta)`` with ``end``
*inclusive*, sorted and disjoint (``engine.rowset.RowSetShiftData`` and the wire's
``ShiftData`` both use that form).
"""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyroaring import BitMap64

__all__ = [
    "aligned",
    "aligned_table",
    "bitmap_from_ranges",
    "bitmap_from_sorted",
    "bitmap_from_words",
    "bitmap_of",
    "expand",
    "expand_with_owner",
    "distinct_key_order",
    "highest_bit",
    "key_order",
    "lowest_bit",
    "member",
    "numeric_view",
    "row_for_message",
    "shift_keys",
    "sort_keys",
    "sorted_unique",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]

_EMPTY = np.empty(0, dtype=np.int64)
_ONE = np.uint64(1)
_SERIAL_COOKIE = 12347  # portable Roaring: a run-container bitmap
_NO_OFFSET_THRESHOLD = 4  # portable Roaring: offsets follow from this many containers on


# distinct values and membership ----------------------------------------------------------
def sorted_unique(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Sorted distinct values of ``a`` (a new array, also when ``a`` has fewer than 2).

    Sort + neighbour diff: numpy 2.x's hash-based ``np.unique`` is slower on large arrays.
    Large arrays of row keys or slots sort by :func:`sort_keys`.

    Examples
    --------
    >>> sorted_unique(np.array([3, 1, 3, 2])).tolist()
    [1, 2, 3]
    """
    if a.size < 2:
        return a.copy()
    if (a[1:] > a[:-1]).all():  # already strictly increasing (row keys often are): numpy's
        return a.copy()          # default sort takes as long on sorted input (55 ms per 1M)
    s = sort_keys(a) if a.dtype == np.int64 else np.sort(a)
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


RADIX_MIN = 2048      # below this many keys numpy's comparison sort is as fast
_RADIX_MAX_BITS = 48  # keys below 2**48: at most three 16-bit passes


def key_order(keys: I64) -> npt.NDArray[np.intp]:
    """A stable permutation sorting ``keys`` (int64; row keys, slots, positions).

    Non-negative keys below ``2**48`` in batches of ``RADIX_MIN`` or more sort by least
    significant digit first, 16 bits a pass (numpy's stable sort of ``uint16`` is a radix
    sort): two passes below ``2**32``, each a few times cheaper than a comparison sort of
    int64 (measured in ``bench/bench_library.py``). Anything else goes to ``np.argsort(kind="stable")``.

    Examples
    --------
    >>> key_order(np.array([70000, 3, 70000, 1])).tolist()
    [3, 1, 0, 2]
    """
    if keys.size < RADIX_MIN:
        return np.argsort(keys, kind="stable")
    lo, hi = int(keys.min()), int(keys.max())
    if lo < 0 or hi >= 1 << _RADIX_MAX_BITS:
        return np.argsort(keys, kind="stable")
    order: npt.NDArray[np.intp] | None = None
    for shift in range(0, max(hi.bit_length(), 1), 16):
        part = keys if order is None else keys[order]
        digit = (part >> shift).astype(np.uint16)  # the cast keeps the low 16 bits
        step = np.argsort(digit, kind="stable")
        order = step if order is None else order[step]
    assert order is not None
    return order


def sort_keys(keys: I64) -> I64:
    """``np.sort(keys)`` for int64 keys, by :func:`key_order` where that is faster.

    Examples
    --------
    >>> sort_keys(np.array([5, 1, 5, 0])).tolist()
    [0, 1, 5, 5]
    """
    if keys.size < RADIX_MIN:
        return np.sort(keys)
    out: I64 = keys[key_order(keys)]
    return out


def distinct_key_order(keys: I64, end: int) -> npt.NDArray[np.intp]:
    """The permutation sorting ``keys``: distinct, non-negative and below ``end``.

    When the keys fill at least a third of ``0 .. end - 1``, by scattering their positions
    into an array of ``end`` and reading it back in key order: O(end) and no comparison
    sort. Sparser keys take :func:`key_order` (radix passes from ``RADIX_MIN`` keys on,
    cheaper than the O(end) pass below a third; ``np.argsort`` for fewer keys).

    Examples
    --------
    >>> distinct_key_order(np.array([7, 2, 5]), 8).tolist()
    [1, 2, 0]
    """
    if keys.size < 2 or 3 * keys.size < end:
        return key_order(keys)
    pos = np.full(end, -1, dtype=np.intp)
    pos[keys] = np.arange(keys.size)
    return pos[pos >= 0]


def member(sorted_arr: npt.NDArray[Any], q: npt.NDArray[Any]) -> Mask:
    """``q[i] in sorted_arr`` for each ``i`` (``sorted_arr`` ascending; searchsorted, no ``np.isin``).

    Examples
    --------
    >>> member(np.array([2, 5, 9]), np.array([5, 6, 9, 10])).tolist()
    [True, False, True, False]
    """
    if sorted_arr.size == 0 or q.size == 0:
        return np.zeros(q.size, dtype=bool)
    pos = np.searchsorted(sorted_arr, q)
    pos[pos == sorted_arr.size] = 0
    out: Mask = sorted_arr[pos] == q
    return out


# ranges -------------------------------------------------------------------------------------
def expand(starts: I64, counts: I64) -> I64:
    """The ranges ``[starts[i], starts[i] + counts[i])`` concatenated in order.

    Examples
    --------
    >>> expand(np.array([10, 3]), np.array([2, 3])).tolist()
    [10, 11, 3, 4, 5]
    """
    counts = counts.astype(np.int64, copy=False)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    if total == 0:
        return _EMPTY
    out: I64 = np.arange(total, dtype=np.int64) - (ends - counts - starts).repeat(counts)
    return out


def expand_with_owner(starts: I64, counts: I64) -> tuple[I64, I64]:
    """:func:`expand`, plus for each value the range ``i`` it came from (its offset in the
    range is ``values - starts[owner]``).

    Examples
    --------
    >>> [a.tolist() for a in expand_with_owner(np.array([10, 3]), np.array([2, 1]))]
    [[10, 11, 3], [0, 0, 1]]
    """
    counts = counts.astype(np.int64, copy=False)
    ends = np.cumsum(counts)
    total = int(ends[-1]) if ends.size else 0
    if total == 0:
        return _EMPTY, _EMPTY
    owner = np.arange(counts.size, dtype=np.int64).repeat(counts)
    values: I64 = np.arange(total, dtype=np.int64) - (ends - counts - starts).repeat(counts)
    return values, owner


def shift_keys(keys: I64, begins: I64, ends: I64, deltas: I64) -> I64:
    """``keys`` after the shift: a key in the inclusive range ``[begins[i], ends[i]]`` moves
    by ``deltas[i]``, any other key stays. One ``searchsorted`` on the range begins, so the
    cost follows the keys, not the number of ranges; ``keys`` need not be sorted. Many
    sorted keys (a table's rows under a sort's shift) search the other way round: each
    range's begin among the keys, counted up to each key.

    The inverse shift is ``shift_keys(keys, begins + deltas, ends + deltas, -deltas)``.

    Examples
    --------
    >>> shift_keys(np.array([0, 2, 4, 7]), np.array([2, 6]), np.array([4, 9]), np.array([1, -1])).tolist()
    [0, 3, 5, 6]
    """
    if begins.size == 0 or keys.size == 0:
        return keys
    if keys.size >= max(4 * begins.size, RADIX_MIN) and bool((keys[1:] >= keys[:-1]).all()):
        # range r holds keys[lo[r]:hi[r]]: its delta is added from lo[r] and taken off at hi[r]
        lo = np.searchsorted(keys, begins, side="left")
        hi = np.searchsorted(keys, ends, side="right")
        step = np.zeros(keys.size + 1, dtype=np.int64)
        np.add.at(step, lo, deltas)
        np.subtract.at(step, hi, deltas)
        moved: I64 = keys + np.cumsum(step[: keys.size])
        return moved
    i = np.searchsorted(begins, keys, side="right") - 1
    safe = np.maximum(i, 0)
    inside = (i >= 0) & (keys <= ends[safe])
    out: I64 = keys + np.where(inside, deltas[safe], 0)
    return out


# bit scans ----------------------------------------------------------------------------------
def lowest_bit(m: U64) -> I64:
    """Index of the lowest set bit of each (non-zero) word."""
    low = m & (~m + _ONE)
    return (np.frexp(low.astype(np.float64))[1] - 1).astype(np.int64)


def highest_bit(m: U64) -> I64:
    """Index of the highest set bit of each (non-zero) word."""
    e = (np.frexp(m.astype(np.float64))[1] - 1).clip(0, 63).astype(np.int64)  # the method: np.clip's wrapper costs more than the clip
    e -= (_ONE << e.astype(np.uint64)) > m  # the float conversion may round up a power of two
    return np.asarray(e, dtype=np.int64)


# bitmaps --------------------------------------------------------------------------------------
DENSE_MIN = 8192   # from this many keys, at least one in 64 of their span: built from bit words
SMALL_MAX = 32     # up to this many keys: built from a list of Python integers (tests change it)
FEW_RANGES = 8     # up to this many ranges: added one by one (tests change it)
FEW_KEYS = 8       # up to this many unsorted keys: bitmap_of builds from their list (tests change it)
_CONTAINER = 1 << 16  # keys per Roaring container
_ARRAY_MAX = 4096     # a container of more keys is a bitmap of 2**16 bits
_NO_RUN_COOKIE = 12346  # portable Roaring: array and bitmap containers only, offsets always


def bitmap_from_sorted(keys: I64) -> BitMap64:
    """A bitmap of sorted distinct keys.

    Through ``array('Q')`` (pyroaring's fast path in, still a step per key in C), or, for
    ``DENSE_MIN`` keys or more filling at least one in 64 of their span, written as the
    portable Roaring serialization and deserialized once (:func:`_containers`): a
    container of more than 4,096 keys as bit words (one flag per key position, packed),
    a smaller one as the low 16 bits of its keys, a few passes over the keys and the
    span instead of a step per key (``bench/bench_library.py``).

    Examples
    --------
    >>> list(bitmap_from_sorted(np.array([1, 5, 1 << 40])))
    [1, 5, 1099511627776]
    """
    if keys.size == 0:
        return BitMap64()
    if keys.size <= SMALL_MAX:  # a few keys: Python integers cost less than the array's bytes
        return BitMap64(keys.tolist())
    if keys.size >= DENSE_MIN:
        base = int(keys[0]) & ~(_CONTAINER - 1)
        span = int(keys[-1]) - base + 1
        if span <= 64 * keys.size:
            n = -(-span // _CONTAINER)
            at = np.searchsorted(keys, base + _CONTAINER * np.arange(n + 1))  # container bounds
            card = np.diff(at)
            words: U64 | None = None
            if (card > _ARRAY_MAX).any():
                flags = np.zeros(n * _CONTAINER, dtype=bool)
                flags[keys - base] = True
                words = np.packbits(flags, bitorder="little").view(np.uint64)
            per = words.reshape(n, -1) if words is not None else None

            def payload(i: int, k: int) -> bytes:
                if k > _ARRAY_MAX:
                    assert per is not None
                    return bytes(per[i].data)
                return (keys[at[i] : at[i + 1]] & 0xFFFF).astype(np.uint16).tobytes()

            return _containers(base, card, payload)
    return BitMap64(array.array("Q", np.ascontiguousarray(keys, dtype=np.int64).tobytes()))


def bitmap_from_words(words: U64, base: int = 0) -> BitMap64:
    """The bitmap whose key ``base + 64 * i + b`` is in it when bit ``b`` of ``words[i]`` is set.

    ``base`` is a multiple of ``2**16`` and ``words`` a whole number of Roaring containers
    (1,024 words each). A container of more than 4,096 keys is its words as they are, a
    smaller one its keys; one step per non-empty container and per ``2**32`` keys.

    Examples
    --------
    >>> w = np.zeros(1024, dtype=np.uint64)
    >>> w[0], w[1] = 0b101, 1
    >>> list(bitmap_from_words(w, 1 << 32))
    [4294967296, 4294967298, 4294967360]
    """
    per = words.reshape(-1, _CONTAINER // 64)
    card = np.bitwise_count(per).sum(axis=1, dtype=np.int64)

    def payload(i: int, k: int) -> bytes:
        if k > _ARRAY_MAX:
            return bytes(per[i].data)
        bits = np.unpackbits(per[i].view(np.uint8), bitorder="little")
        return np.flatnonzero(bits).astype(np.uint16).tobytes()

    return _containers(base, card, payload)


def _containers(base: int, card: I64, payload: Callable[[int, int], bytes]) -> BitMap64:
    """A bitmap from its containers: container ``i`` holds keys ``base + i * 2**16 + ...``,
    ``card[i]`` of them, serialized as ``payload(i, card[i])`` (words above 4,096 keys,
    16-bit keys below). Empty containers are skipped; one step per container."""
    full = np.flatnonzero(card)
    if full.size == 0:
        return BitMap64()
    ckey = (base >> 16) + full  # container keys: the high 48 bits of their keys
    high = ckey >> 16
    bstart = np.flatnonzero(np.diff(high, prepend=high[0] ^ 1) != 0)
    bstop = np.append(bstart[1:], full.size)
    parts: list[bytes] = [np.uint64(bstart.size).tobytes()]
    for b0, b1 in zip(bstart.tolist(), bstop.tolist(), strict=True):  # one step per 2**32 keys
        c = full[b0:b1]
        n = c.size
        cc = card[c]
        size = np.where(cc > _ARRAY_MAX, 8192, 2 * cc)  # payload bytes per container
        head = np.empty(2 + 2 * n, dtype=np.uint32)  # cookie, count, (key, card - 1), offsets
        head[0], head[1] = _NO_RUN_COOKIE, n
        desc = head[2 : 2 + n].view(np.uint16).reshape(n, 2)
        desc[:, 0] = ckey[b0:b1] & 0xFFFF
        desc[:, 1] = cc - 1
        head[2 + n :] = 8 + 8 * n + np.cumsum(size) - size
        parts.append(np.uint32(int(high[b0])).tobytes())
        parts.append(head.tobytes())
        parts.extend(payload(i, k) for i, k in zip(c.tolist(), cc.tolist(), strict=True))
    return BitMap64.deserialize(b"".join(parts))


def bitmap_of(keys: I64, span: int = 0) -> BitMap64:
    """A bitmap of unsorted keys with repeats; ``span`` (all keys below it) allows a mark array.

    Many keys in a small span are marked in a bool array instead of sorted, and runs of
    consecutive keys go in as ranges (building a bitmap key by key is slow).

    Examples
    --------
    >>> list(bitmap_of(np.array([5, 1, 2, 1, 3])))
    [1, 2, 3, 5]
    """
    if keys.size == 0:
        return BitMap64()
    if keys.size <= FEW_KEYS:  # a cycle's few changed rows: one C call, no sort or search
        few = keys.tolist()
        if min(few) >= 0:
            return BitMap64(few)
    if span and keys.size * 8 > span:
        mark = np.zeros(span, dtype=bool)
        mark[keys] = True
        k = np.flatnonzero(mark).astype(np.int64)
    else:
        k = sorted_unique(keys)
    brk = np.flatnonzero(np.diff(k) != 1)
    if brk.size * 4 < k.size:
        starts = np.concatenate((k[:1], k[brk + 1]))
        stops = np.concatenate((k[brk] + 1, k[-1:] + 1))
        return bitmap_from_ranges(starts, stops)
    return bitmap_from_sorted(k)


def bitmap_from_ranges(starts: I64, stops: I64) -> BitMap64:
    """Half-open, sorted, disjoint ranges ``[starts[i], stops[i])`` as a bitmap.

    Writes the portable Roaring serialization (run containers) with numpy and deserializes
    it once: no Python step per range or key, one per ``2**32`` keys of key space. Up to
    ``FEW_RANGES`` ranges are added one by one instead (a cycle's few changed rows: the
    serialization's fixed cost is ~70 µs, a range's add ~1 µs).

    Examples
    --------
    >>> list(bitmap_from_ranges(np.array([1, 7]), np.array([3, 9])))
    [1, 2, 7, 8]
    """
    if starts.size <= FEW_RANGES:  # a few ranges: one C call each beats the serialization's passes
        bm = BitMap64()
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            if b > a:
                bm.add_range(a, b)
        return bm
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if starts.size == 0:
        return BitMap64()
    touching = starts[1:] == stops[:-1]
    if touching.any():  # Roaring runs must not touch: merge adjacent ranges
        starts = starts[np.concatenate(([True], ~touching))]
        stops = stops[np.concatenate((~touching, [True]))]
    s = starts.astype(np.uint64)
    e = stops.astype(np.uint64)
    first_chunk = s >> np.uint64(16)
    last_chunk = (e - np.uint64(1)) >> np.uint64(16)
    npieces = (last_chunk - first_chunk + np.uint64(1)).astype(np.int64)
    rng = np.repeat(np.arange(starts.size), npieces)
    within = np.arange(rng.size) - np.repeat(np.cumsum(npieces) - npieces, npieces)
    chunk = first_chunk[rng] + within.astype(np.uint64)
    pstart = np.maximum(s[rng], chunk << np.uint64(16))
    pstop = np.minimum(e[rng], (chunk + np.uint64(1)) << np.uint64(16))
    # containers = distinct chunks (pieces are sorted by chunk already)
    cbound = np.flatnonzero(np.diff(chunk, prepend=chunk[0] ^ np.uint64(1)) != 0)
    cchunk = chunk[cbound]
    nruns = np.diff(np.append(cbound, chunk.size)).astype(np.int64)
    lengths = (pstop - pstart).astype(np.int64)
    card = np.add.reduceat(lengths, cbound)
    high = cchunk >> np.uint64(16)
    bbound = np.flatnonzero(np.diff(high, prepend=high[0] ^ np.uint64(1)) != 0)
    bstops = np.append(bbound, high.size)
    # one 16-bit word stream per container: [nruns, (start, len-1) * nruns]
    run_start = (pstart & np.uint64(0xFFFF)).astype(np.uint16)
    run_len1 = (lengths - 1).astype(np.uint16)
    parts: list[bytes] = [np.uint64(bbound.size).tobytes()]
    for b in range(bbound.size):  # one iteration per 2**32 keys of key space
        c0, c1 = bstops[b], bstops[b + 1]
        n = int(c1 - c0)
        r0 = int(cbound[c0])
        r1 = int(cbound[c1]) if c1 < cbound.size else chunk.size
        nr = nruns[c0:c1]
        words_per = 1 + 2 * nr
        body = np.empty(int(words_per.sum()), dtype=np.uint16)
        head_at = np.cumsum(words_per) - words_per
        body[head_at] = nr.astype(np.uint16)
        mask = np.ones(body.size, dtype=bool)
        mask[head_at] = False
        pairs = np.empty((r1 - r0, 2), dtype=np.uint16)
        pairs[:, 0] = run_start[r0:r1]
        pairs[:, 1] = run_len1[r0:r1]
        body[mask] = pairs.reshape(-1)
        flags = np.zeros((n + 7) // 8 * 8, dtype=bool)
        flags[:n] = True
        desc = np.empty((n, 2), dtype=np.uint16)
        desc[:, 0] = (cchunk[c0:c1] & np.uint64(0xFFFF)).astype(np.uint16)
        desc[:, 1] = (card[c0:c1] - 1).astype(np.uint16)
        header = [
            np.uint32(int(high[c0])).tobytes(),
            np.uint32(_SERIAL_COOKIE | ((n - 1) << 16)).tobytes(),
            np.packbits(flags, bitorder="little").tobytes(),
            desc.tobytes(),
        ]
        if n >= _NO_OFFSET_THRESHOLD:
            start = 4 + len(header[2]) + 4 * n + 4 * n
            offsets = start + 2 * head_at
            header.append(offsets.astype(np.uint32).tobytes())
        parts.extend(header)
        parts.append(body.tobytes())
    return BitMap64.deserialize(b"".join(parts))


# the numeric view of a column -------------------------------------------------------------------
def numeric_view(col: pa.Array | pa.ChunkedArray, *, combine: bool = False) -> npt.NDArray[Any] | None:
    """A numpy view of a null-free integer, floating-point or temporal column, else None.

    Zero-copy for an array or a one-chunk chunked array. Temporal columns (timestamps,
    dates, times, durations) come as their int64 or int32 storage, so values compare and
    gather as integers and go back with ``pa.array(values, type=col.type)``. A chunked
    array of several chunks gives None, or with ``combine`` one concatenated copy; one of no
    chunks gives an empty array. Booleans (bit-packed), nulls and other types give None.

    Parameters
    ----------
    col
        The column.
    combine
        Concatenate several chunks into one array (a copy) instead of returning None.

    Examples
    --------
    >>> numeric_view(pa.chunked_array([[1, 2, 3]])).tolist()
    [1, 2, 3]
    >>> numeric_view(pa.array([1, None])) is None
    True
    """
    if col.null_count:
        return None
    t = col.type
    if t.id in _PLAIN_IDS and (not isinstance(col, pa.ChunkedArray) or col.num_chunks == 1):
        # the common case, told by the type's id (the type predicates cost more than the view)
        return np.asarray((col.chunk(0) if isinstance(col, pa.ChunkedArray) else col).to_numpy(zero_copy_only=True))
    temporal = pa.types.is_temporal(t) and not pa.types.is_interval(t)
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or temporal):
        return None
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks != 1:
            if col.num_chunks and not combine:
                return None
            parts = [numeric_view(c) for c in col.chunks]
            if any(p is None for p in parts):
                return None
            return np.concatenate(parts) if parts else np.empty(0, dtype=_storage(t))  # type: ignore[arg-type]
        col = col.chunk(0)
    if temporal:
        dtype = _storage(t)
        if dtype is None:
            return None
        if len(col) == 0:
            return np.empty(0, dtype=dtype)
        view = np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col),
                             offset=col.offset * dtype.itemsize)
        view.flags.writeable = False  # as to_numpy's views: Arrow's memory is immutable
        return view
    return np.asarray(col.to_numpy(zero_copy_only=True))


# integer and floating-point type ids: their numeric view is to_numpy's
_PLAIN_IDS = frozenset(t.id for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
                                      pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64()))


# alignment ------------------------------------------------------------------------------------
_ALIGN = 8


def _is_aligned(a: pa.Array) -> bool:
    if any(b is not None and b.size and b.address % _ALIGN for b in a.buffers()):
        return False
    return not pa.types.is_dictionary(a.type) or _is_aligned(a.dictionary)


def aligned(values: pa.Array) -> pa.Array:
    """``values`` itself when every buffer it uses starts on an 8-byte boundary, else a copy
    whose buffers do.

    An Arrow IPC body lays its buffers out at multiples of 8 from its start, but a Flight
    body starts wherever protobuf's framing put it in the received bytes (pyarrow's client:
    one byte past a multiple of 8), and the server decodes it without a copy. numpy reads
    such buffers as they are, and so do Arrow's compute kernels on x86-64 and arm64; what
    keeps Arrow buffers for later (a store's chunks) or hands them to Acero (whose
    aggregation and join kernels may assume alignment) calls this first, so the copy is
    paid where alignment is needed, and only for the columns that need it.
    """
    if _is_aligned(values):
        return values
    if pa.types.is_dictionary(values.type):  # concatenating one keeps its dictionary as it is
        return pa.DictionaryArray.from_arrays(aligned(values.indices), aligned(values.dictionary),
                                              ordered=values.type.ordered)
    return pa.concat_arrays([values])


def aligned_table(table: pa.Table) -> pa.Table:
    """``table`` itself when every chunk is aligned, else a table in which the columns that
    were not are copied (see :func:`aligned`)."""
    columns = list(table.columns)
    changed = False
    for i, col in enumerate(columns):
        if not all(_is_aligned(chunk) for chunk in col.chunks):
            columns[i] = pa.chunked_array([aligned(chunk) for chunk in col.chunks], type=col.type)
            changed = True
    return pa.Table.from_arrays(columns, schema=table.schema) if changed else table


def _storage(t: pa.DataType) -> np.dtype[Any] | None:
    """The numpy dtype a numeric or temporal Arrow type is stored as."""
    if pa.types.is_temporal(t):
        width = t.bit_width
        return np.dtype(np.int64) if width == 64 else np.dtype(np.int32) if width == 32 else None
    dtype: np.dtype[Any] = np.dtype(t.to_pandas_dtype())
    return dtype


def row_for_message(data: pa.Table | pa.RecordBatch, i: int) -> dict[str, object]:
    """Row ``i`` to quote in an error message: Python values, or Arrow's text for a value
    Python cannot hold (a timestamp past year 9999), so quoting a row never fails itself."""
    one = data.slice(i, 1)
    try:
        row: dict[str, object] = one.to_pylist()[0]
    except (OverflowError, ValueError):
        row = {name: _value_text(col) for name, col in zip(one.column_names, one.columns,
                                                             strict=True)}
    return row


def _value_text(col: pa.ChunkedArray | pa.Array) -> object:
    try:
        return col.to_pylist()[0]
    except (OverflowError, ValueError):
        try:
            return col.cast(pa.string()).to_pylist()[0]
        except (pa.ArrowException, OverflowError, ValueError):
            return f"<a {col.type} value>"
