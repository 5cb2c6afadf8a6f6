"""Indexed batches: a timed batch sorted by key, and key lookups in one batch or a spine of them.

An :class:`IndexedZSet` is a timed batch whose rows are sorted so that the rows of one key
are contiguous. The sort key is one ``uint64`` per row: the key hash's high 40 bits over
the record hash's low 24 bits, so rows of one key sit together and, within them, equal
records sit together (which lets merges consolidate by comparing neighbours). A lookup of
a whole array of keys goes through a bucket directory (the sort key's top bits -> first
row, built once per batch with one ``bincount``): two gathers per probe instead of two
binary searches (a lookup of a few keys binary-searches instead, and batches much smaller
than the probe set share one occupancy filter, so a spine's small batches cost about one
pass over the probes). Keys whose hashes share the high bits interleave; lookups here
filter on the full key hash, and a caller whose key hash is not exact filters on the key
values too (:meth:`~engine.differential.trace.Trace.lookup` does), so a collision never
returns a wrong row. A batch keyed by one integer column over a range not much wider than
the batch also gets a direct-address index (key value -> its rows), which many probes (and
a few probes of a big batch, where every level of a binary search is a cache miss) use
instead: no hash comparison, no bucket collisions. A batch is sorted by one sort of its
order keys with the row index packed into their low bits (then a fix-up of the rare runs
tied in the remaining bits), a third of a radix argsort's time at the sizes of a step's
delta.

Relies on: rows ascending by ``order_key`` (so one key's rows, and equal records, are
contiguous) and a batch never changing once built (its indexes are built on first use and
kept). Equal (key hash, record hash) pairs prove equal records only when both hashes are
exact (:func:`exact_records`). :mod:`engine.differential.trace` keeps these batches in a
compacting, shared spine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import expand_with_owner, numeric_view
from engine._kernels.hashing import combine, exact_hash, hash_rows
from engine.differential.zset import ZSet, take_rows
from engine.errors import SchemaError

__all__ = ["RUN_MAX_BATCHES", "IndexedZSet", "SpineRun", "exact_records", "index_with", "int_key_values",
           "locate_in_spine"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

_LO_BITS = 24
_LO = np.uint64((1 << _LO_BITS) - 1)
_HI = ~_LO


@dataclass(frozen=True, slots=True, eq=False)
class IndexedZSet:
    """A timed batch indexed by ``keys`` (seed 003's Indexed Z-Set).

    Attributes
    ----------
    keys
        The key columns (part of the records).
    batch
        The updates, sorted by ``order_key``.
    key_hash, rec_hash
        Per row: stable hash of the key columns, and of the whole record.
    order_key
        Per row, ascending: ``key_hash`` high bits over ``rec_hash`` low bits.
    """

    keys: tuple[str, ...]
    batch: ZSet
    key_hash: U64
    rec_hash: U64
    order_key: U64
    _directory: dict[int, tuple[int, I64]] | None = field(default=None, repr=False)
    _dense: tuple[int, I64, I64 | None] | bool | None = field(default=None, repr=False)
    _views: dict[str, npt.NDArray[Any] | None] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return self.batch.num_rows

    def numeric_column(self, name: str) -> npt.NDArray[Any] | None:
        """:func:`~engine._kernels.arrays.numeric_view` of the column ``name`` (kept: every
        lookup that gathers records from this batch asks again)."""
        try:
            return self._views[name]
        except KeyError:
            v = self._views[name] = numeric_view(self.batch.data.column(name))
            return v

    def _dense_index(self) -> tuple[int, I64, I64 | None] | None:
        """``(low, first, count)`` when the key is one null-free integer column over a
        range not much wider than the batch: the rows of key ``v`` are ``first[v - low]``
        on, ``count[v - low]`` of them (direct addressing, no hash comparison). When every
        key has one row, ``count`` is ``None`` and ``first`` is ``-1`` for absent keys.
        Built on first use."""
        if self._dense is None:
            object.__setattr__(self, "_dense", self._build_dense() or False)
        return self._dense if isinstance(self._dense, tuple) else None

    def _build_dense(self) -> tuple[int, I64, I64 | None] | None:
        n = len(self)
        v = int_key_values(self.batch.data, self.keys)
        if v is None or n == 0:
            return None
        low, high = int(v.min()), int(v.max())
        width = high - low + 1
        if width > 4 * n + 1024:
            return None
        kh = self.key_hash
        starts = np.flatnonzero(np.concatenate(([True], kh[1:] != kh[:-1])))  # runs of one key
        off = v.take(starts) - low
        first = np.full(width, -1, dtype=np.int64)
        first[off] = starts
        if not np.array_equal(first.take(off), starts):
            return None  # a key in two runs (another key's hash interleaves): hash lookups only
        if starts.size == n:  # one row per key
            return low, first, None
        count = np.zeros(width, dtype=np.int64)
        count[off] = np.diff(np.append(starts, n))
        return low, first, count

    def _dense_rows(self, values: I64) -> tuple[I64, I64 | None] | None:
        """Per key value: ``(first, count)`` from the direct-address index (count ``None``
        for a batch of one row per key: ``first`` is then the row, or -1)."""
        dense = self._dense_index()
        if dense is None:
            return None
        low, first, count = dense
        off = values - low
        if values.size == 0 or (int(off.min()) >= 0 and int(off.max()) < first.size):
            return first.take(off), None if count is None else count.take(off)
        inside = (off >= 0) & (off < first.size)
        off = np.where(inside, off, 0)
        if count is None:
            return np.where(inside, first.take(off), -1), None
        return first.take(off), np.where(inside, count.take(off), 0)

    def value_ranges(self, values: I64) -> tuple[I64, I64] | None:
        """Per key value (one integer key column), its rows ``start:start + count``
        through the direct-address index (exact); ``None`` when the batch has none."""
        found = self._dense_rows(values)
        if found is None:
            return None
        start, cnt = found
        if cnt is None:
            present = start >= 0
            return np.where(present, start, 0), present.astype(np.int64)
        return start, cnt

    def locate_values(self, values: I64) -> tuple[I64, I64] | None:
        """:meth:`locate` by the key values themselves (one integer key column), through
        the direct-address index; ``None`` when the batch has none."""
        found = self._dense_rows(values)
        if found is None:
            return None
        start, cnt = found
        if cnt is None:  # one row per key: no expansion
            if start.size == 0 or int(start.min()) >= 0:  # every probe found
                return np.arange(start.size, dtype=np.int64), start
            probe = (start >= 0).nonzero()[0]
            return probe, start.take(probe)
        rows, probe = expand_with_owner(start, cnt)
        return probe, rows

    def _bucket_starts(self, probes: int = 0) -> tuple[int, I64]:
        """``(shift, starts)``: rows of bucket ``b = order_key >> shift`` are
        ``starts[b]:starts[b + 1]``; at most about one key per bucket, and for a small batch
        probed by many keys, enough buckets that most probes find theirs empty (built on
        first use, one per size)."""
        own = int(np.ceil(np.log2(len(self) + 1))) + 1          # <= 1/2 row per bucket
        want = int(np.ceil(np.log2(probes + 1)))
        bits = max(1, min(40, max(own, min(want, own + 10))))
        if self._directory is None:
            object.__setattr__(self, "_directory", {})
        assert self._directory is not None
        found = self._directory.get(bits)
        if found is None:
            shift = 64 - bits
            top = self.order_key >> np.uint64(shift)
            starts = np.zeros((1 << bits) + 1, dtype=np.int64)
            np.cumsum(np.bincount(top.astype(np.int64), minlength=1 << bits), out=starts[1:])
            found = self._directory[bits] = (shift, starts)
        return found

    @classmethod
    def build(cls, batch: ZSet, keys: Sequence[str], *, one_time: bool = False) -> IndexedZSet:
        """Index ``batch`` by the columns ``keys`` (``one_time``: every row is at one
        version, so reordering leaves the times as they are).

        Raises
        ------
        SchemaError
            If a key column is missing.
        """
        keys = tuple(keys)
        missing = [k for k in keys if k not in batch.schema.names]
        if not keys or missing:
            raise SchemaError(f"key column(s) {missing or list(keys)} not in {batch.schema.names}")
        kh = hash_rows(batch.data, keys)
        values = [c for c in batch.schema.names if c not in keys]
        if values:
            # one integer value column mixes in as it is: for a given key the record hash is
            # still a bijection of the value (so exact, see exact_records)
            raw = int_key_values(batch.data, values)
            rh = combine(kh, raw.view(np.uint64) if raw is not None else hash_rows(batch.data, values))
            ok = (kh & _HI) | (rh & _LO)
        else:  # the record is its key: the order key is the key hash
            rh = ok = kh
        order = argsort_u64(ok)
        if order.size < 2048 and np.all(order[1:] > order[:-1]):
            return cls(keys, batch, kh, rh, ok)
        if one_time and batch.times is not None:
            z = ZSet(take_rows(batch.data, order), batch.diffs.take(order), batch.times)
        else:
            z = batch.take(order)
        kh = kh.take(order)
        return cls(keys, z, kh, rh.take(order) if values else kh, ok.take(order) if values else kh)

    def locate(self, probe_hash: U64) -> tuple[I64, I64]:
        """Rows whose key hash equals a probe's: ``(probe index, row)`` pairs, ordered by
        probe and then row."""
        # the bucket's rows (a key's rows: binary searches for a few probes), then the
        # rows of the probe's key among them
        if probe_hash.size <= _FEW:
            lo, hi = self.ranges(probe_hash)
        else:
            shift, starts = self._bucket_starts(probe_hash.size)
            b = (probe_hash >> np.uint64(shift)).astype(np.intp)
            lo, hi = starts.take(b), starts.take(b + 1)
        rows, probe = expand_with_owner(lo, hi - lo)
        return _confirm(probe, rows, self.key_hash, probe_hash)

    def ranges(self, probe_hash: U64) -> tuple[I64, I64]:
        """Per probe, the rows ``lo:hi`` whose order key has the probe's key hash bits (two
        binary searches; rows of another key sharing those bits may be among them)."""
        return (self.order_key.searchsorted(probe_hash & _HI),
                self.order_key.searchsorted(probe_hash | _LO, "right"))


_FEW = 64  # probes looked up by binary search rather than through a bucket directory
_DENSE_FEW = 1 << 16  # batches this big are probed by value even by a few probes


def int_key_values(table: pa.Table, keys: Sequence[str]) -> I64 | None:
    """The values of ``keys`` as int64 when they are one null-free integer column (not
    uint64), else ``None``: what a direct-address index and a probe by value take
    (:meth:`IndexedZSet.locate_values`)."""
    if len(keys) != 1:
        return None
    col = table.column(keys[0])
    if not pa.types.is_integer(col.type) or col.null_count or pa.types.is_uint64(col.type):
        return None
    return np.asarray(col.to_numpy()).astype(np.int64, copy=False)


def _confirm(probe: I64, rows: I64, key_hash: U64, probe_hash: U64) -> tuple[I64, I64]:
    """The pairs whose row has the probe's full key hash."""
    hit = key_hash.take(rows) == probe_hash.take(probe)
    if hit.all():
        return probe, rows
    sel = hit.nonzero()[0]
    return probe.take(sel), rows.take(sel)


def argsort_u64(a: U64) -> I64:
    """A stable argsort of ``uint64`` values: one sort of the values with each row's index
    packed into their low ``b`` bits (``2**b >= len(a)``), so numpy's vectorized sort of
    plain integers does the work (several times faster than an argsort, whose comparisons
    go through the index); the rare runs tied in the top ``64 - b`` bits come out in index
    order and are then ordered by the whole value (a stable sort of those rows alone).
    Past ``2**20`` rows, where ties in the top bits would be common, numpy's stable
    argsort."""
    n = a.size
    b = max(1, (n - 1).bit_length())
    if b > _PACK_MAX_BITS:
        return np.argsort(a, kind="stable").astype(np.int64, copy=False)
    low = np.uint64((1 << b) - 1)
    packed = (a & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    top = packed >> np.uint64(b)
    tie = top[1:] == top[:-1]  # the sorted top bits: no gather of the values
    perm: I64 = np.bitwise_and(packed, low, out=packed).view(np.int64)
    if not tie.any():
        return perm
    at = np.flatnonzero(tie)
    if (a.take(perm.take(at + 1)) < a.take(perm.take(at))).any():  # a tied run out of order in the low bits
        pos = np.flatnonzero(np.concatenate((tie, [False])) | np.concatenate(([False], tie)))
        sub = perm.take(pos)
        perm[pos] = sub.take(np.argsort(a.take(sub), kind="stable"))
    return perm


_PACK_MAX_BITS = 20
_STEP = np.uint64(1 << _LO_BITS)  # from one key hash's order keys to the next's

KeyValues: TypeAlias = "Callable[[], I64 | None] | None"
"""The probes' key values for direct-address lookups (:func:`int_key_values`), asked for
only when some batch can use them."""


def locate_in_spine(spine: Sequence[IndexedZSet], ph: U64, key_values: KeyValues = None
                    ) -> tuple[I64, I64, list[int]]:
    """:meth:`IndexedZSet.locate` in every batch of a spine: ``(probe, row, per-batch
    counts)``, grouped by batch in spine order, for probes with key hashes ``ph`` (and,
    with one integer key column, a function giving their key values, see
    :func:`int_key_values`, called only when some batch can use them).
    The pairs match on the full key hash; a caller whose key hash is not exact compares the
    key values too.

    A few probes binary-search every batch and expand all the ranges at once. Batches much
    smaller than a large probe set share one occupancy filter (their key hashes' top bits):
    only the probes that may be in one of them go on, binary-searching those batches
    together, so many small batches cost about one pass over the probes. The others are
    probed by key value (``values``) where they have a direct-address index, else through
    their bucket directory."""
    n = ph.size
    if n <= _FEW and len(spine) > 1:
        return _search_all(spine, ph, key_values)
    small = [i for i, b in enumerate(spine) if len(b) * 8 < n]
    found: list[tuple[I64, I64] | None] = [None] * len(spine)
    if n >= 1024 and small:
        bits = min(24, int(np.ceil(np.log2(n))) + 3)
        shift = np.uint64(64 - bits)
        occupied = np.zeros(1 << bits, dtype=bool)
        for i in small:  # a loop per small batch
            occupied[(spine[i].order_key >> shift).astype(np.intp)] = True
        cand = occupied.take((ph >> shift).astype(np.intp)).nonzero()[0]
        sp, sr, counts = _search_all([spine[i] for i in small], ph.take(cand), None)
        sp = cand.take(sp)
        at = 0
        for i, c in zip(small, counts, strict=True):
            found[i] = (sp[at:at + c], sr[at:at + c])
            at += c
    values = key_values() if key_values is not None and None in found else None
    for i, b in enumerate(spine):  # a loop per trace batch
        if found[i] is None and values is not None:
            found[i] = b.locate_values(values)
    parts = [f if f is not None else b.locate(ph) for b, f in zip(spine, found, strict=True)]
    if not parts:
        e = np.empty(0, np.int64)
        return e, e, []
    if len(parts) == 1:
        return parts[0][0], parts[0][1], [parts[0][0].size]
    return (np.concatenate([p for p, _ in parts]), np.concatenate([r for _, r in parts]),
            [p.size for p, _ in parts])


def _search_all(spine: Sequence[IndexedZSet], ph: U64, values: KeyValues) -> tuple[I64, I64, list[int]]:
    """:meth:`IndexedZSet.locate` in every batch by binary search, all the ranges expanded
    and confirmed at once (for a few probes, or the probes that passed the small batches'
    filter): ``(probe, row, per-batch counts)``, grouped by batch in spine order. Big
    batches go by key value when they have a direct-address index (a binary search of a
    big cold array is a cache miss per level).

    The probes' bounds are computed once: a key's rows are the order keys from ``ph & _HI``
    up to (not including) ``(ph & _HI) + 2**24``, so one ``searchsorted`` of both bounds per
    batch finds them (the bound past the largest key, which would wrap, goes through
    :meth:`IndexedZSet.ranges` instead); batches where no probe has a row skip the
    confirmation."""
    n = ph.size
    qlo = ph & _HI
    if n and int(qlo.max()) == int(_HI):  # the upper bound of the top key would wrap
        bounds2 = None
    else:
        bounds2 = np.concatenate((qlo, qlo + _STEP))
    ranges = []
    inexact = []  # batches searched by hash bits: their entries need the full-hash check
    vals: I64 | None = None
    for i, b in enumerate(spine):  # a loop per trace batch
        if vals is None and values is not None and len(b) >= _DENSE_FEW:
            vals = values()
            if vals is None:
                values = None
        dense = b.value_ranges(vals) if vals is not None and len(b) >= _DENSE_FEW else None
        if dense is not None:
            ranges.append(np.concatenate((dense[0], dense[0] + dense[1])))
        else:
            ranges.append(b.order_key.searchsorted(bounds2) if bounds2 is not None
                          else np.concatenate(b.ranges(ph)))
            inexact.append(i)
    both = np.concatenate(ranges).reshape(len(spine), 2, n)  # (batch, lo/hi, probe)
    lo = both[:, 0].ravel()
    rows, probe = expand_with_owner(lo, both[:, 1].ravel() - lo)
    bounds = probe.searchsorted(np.arange(len(spine) + 1) * n).tolist()
    if n:
        probe %= n
    inexact = [i for i in inexact if bounds[i + 1] > bounds[i]]
    if inexact:  # one comparison of full key hashes for those batches' entries
        want = ph.take(probe)
        kh = want.copy()
        for i in inexact:  # a loop per trace batch
            spine[i].key_hash.take(rows[bounds[i]:bounds[i + 1]], out=kh[bounds[i]:bounds[i + 1]])
        hit = kh == want
        if not hit.all():
            keep = hit.nonzero()[0]
            probe, rows = probe.take(keep), rows.take(keep)
            bounds = keep.searchsorted(bounds).tolist()
    return probe, rows, [bounds[i + 1] - bounds[i] for i in range(len(spine))]


_RUN_BITS = 6  # batch-number bits of a SpineRun search key
_RUN_SHIFT = np.uint64(_RUN_BITS)
_RUN_BATCH = np.uint64(64 - _RUN_BITS)
_RUN_STEP = np.uint64(1 << (_LO_BITS - _RUN_BITS))  # from one key's search keys to the next's
RUN_MAX_BATCHES = (1 << _RUN_BITS) - 1  # the last batch's top bound would wrap
_RUN_TOPS = np.arange(RUN_MAX_BATCHES, dtype=np.uint64)[:, None] << _RUN_BATCH  # batch b's search-key bits


class SpineRun:
    """Batches of a spine laid end to end, so that a few probes find their rows in all of
    them with one binary search and gather their weights and times with one take each.

    Row ``r`` of the ``b``-th batch is at ``starts[b] + r``; its search key is ``b`` in the
    top six bits over the order key's top 58 (the low bits of the record hash dropped): the
    batches are in spine order and each is sorted, so the keys are ascending, and a key's
    rows in batch ``b`` are the search keys from ``b << 58 | (hash & _HI) >> 6`` up to that
    plus ``2**18`` (for the top key, the next batch's first). A trace keeps one, and
    :meth:`sync` keeps it level with the spine, which changes at the end only (a batch
    appended, the last batches merged): the batches still in place keep their rows, so an
    insert costs the rows it adds, not a pass over the run. At most :data:`RUN_MAX_BATCHES`
    batches; the searches cost per (probe, batch) pair, so it suits a few probes.
    """

    def __init__(self, dims: int) -> None:
        self.batches: list[IndexedZSet] = []
        self.starts: list[int] = [0]
        self._search = np.empty(0, dtype=np.uint64)
        self._key_hash = np.empty(0, dtype=np.uint64)
        self._diffs = np.empty(0, dtype=np.int64)
        self._times = np.empty((0, dims), dtype=np.int64)

    def sync(self, spine: Sequence[IndexedZSet]) -> None:
        """Hold exactly the batches ``spine`` (at most :data:`RUN_MAX_BATCHES`): keep the
        longest prefix already held, append the rest."""
        if len(spine) > RUN_MAX_BATCHES:
            raise ValueError(f"a spine run holds at most {RUN_MAX_BATCHES} batches, got {len(spine)}")
        k = 0
        held = self.batches
        while k < len(held) and k < len(spine) and held[k] is spine[k]:  # a loop per batch
            k += 1
        if k == len(held) == len(spine):
            return
        del held[k:]
        del self.starts[k + 1:]
        add = spine[k:]
        n0 = self.starts[-1]
        need = n0 + sum(len(b) for b in add)
        if need > self._search.size:  # grow by doubling: appends cost the rows they add
            cap = max(need, 2 * self._search.size, 256)
            self._search = _grown(self._search, n0, cap)
            self._key_hash = _grown(self._key_hash, n0, cap)
            self._diffs = _grown(self._diffs, n0, cap)
            self._times = _grown(self._times, n0, cap)
        at = n0
        for b in add:  # a loop per appended batch
            m = len(b)
            top = np.uint64(len(held)) << _RUN_BATCH
            np.right_shift(b.order_key, _RUN_SHIFT, out=self._search[at:at + m])
            self._search[at:at + m] |= top
            self._key_hash[at:at + m] = b.key_hash
            self._diffs[at:at + m] = b.batch.diffs
            assert b.batch.times is not None  # a trace's batches are timed
            self._times[at:at + m] = b.batch.times
            at += m
            held.append(b)
            self.starts.append(at)

    def locate(self, ph: U64) -> tuple[I64, I64, list[int]]:
        """:meth:`IndexedZSet.locate` in every batch held: ``(probe, position, per-batch
        counts)``, grouped by batch in spine order; a position is a row of the run (the
        batch's row plus its start)."""
        nb, n = len(self.batches), ph.size
        tops = _RUN_TOPS[:nb] if nb <= RUN_MAX_BATCHES else np.arange(nb, dtype=np.uint64)[:, None] << _RUN_BATCH
        q = ph & _HI
        q >>= _RUN_SHIFT
        lo = (tops | q).ravel()
        found = self._search[:self.starts[-1]].searchsorted(np.concatenate((lo, lo + _RUN_STEP)))
        start = found[:lo.size]
        count = found[lo.size:] - start
        pos, owner = expand_with_owner(start, count)  # owner: batch * n + probe
        probe = owner % n if n else owner
        hit = self._key_hash.take(pos) == ph.take(probe)  # the full key hash
        if hit.all():
            return probe, pos, count.reshape(nb, n).sum(axis=1).tolist() if n else [0] * nb
        keep = hit.nonzero()[0]
        pos, probe, owner = pos.take(keep), probe.take(keep), owner.take(keep)
        bounds = owner.searchsorted(np.arange(nb + 1, dtype=np.int64) * n).tolist()
        return probe, pos, [bounds[i + 1] - bounds[i] for i in range(nb)]

    def diffs(self, pos: I64) -> I64:
        """The weights of the rows at ``pos``."""
        return self._diffs.take(pos)

    def times(self, pos: I64) -> I64:
        """The versions of the rows at ``pos``."""
        return self._times.take(pos, axis=0)


def _grown(a: npt.NDArray[Any], n: int, cap: int) -> npt.NDArray[Any]:
    """``a``'s first ``n`` rows in a new array of ``cap`` rows."""
    out = np.empty((cap,) + a.shape[1:], dtype=a.dtype)
    out[:n] = a[:n]
    return out


def index_with(batch: ZSet, keys: Sequence[str]) -> IndexedZSet:
    """Index a batch by key columns (seed 003's Index With).

    To index by a computed key, add it as a column first (``LinearOperator.map``).
    """
    return IndexedZSet.build(batch, keys)


def exact_records(schema: pa.Schema, keys: Sequence[str]) -> bool:
    """Whether equal (key hash, record hash) pairs prove equal records.

    True when the key hash and the value hash are both exact (one integer-like column
    each, or no value column): the record hash then separates the values of one key.
    """
    values = [n for n in schema.names if n not in keys]
    return exact_hash(schema, keys) and (not values or exact_hash(schema, values))
