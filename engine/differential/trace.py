"""Traces (arrangements): a collection's history, indexed by key.

A :class:`Trace` accumulates indexed batches
(:class:`~engine.differential.indexed.IndexedZSet`: rows of one key contiguous, looked up
by key hash; see :mod:`engine.differential.indexed`) in a *spine*, merged size-tiered by
its :class:`MergePolicy`: once the last ``fanout`` batches are of one size class
(``fanout`` x apart, from ``base`` rows), they are merged into one. Every update is merged
``O(log n)`` times and a lookup probes about ``fanout`` batches per size class. The
default (4 from 1,024 rows) suits a step's batches; :data:`SMALL_BATCHES` (8 from 64 rows)
suits the rounds of an ``iterate``, whose batches hold a few rows each: with a 1,024-row
floor every batch below it is of class 0, so the spine's tail (a whole small collection)
was rewritten every few rounds. (Merging two batches whenever the
newer is half the older, the binary-counter policy, does more merge work per update in
the upsert benchmark, for fewer batches to probe: bench/README.md.) Merges *compact*: every
time is advanced by the trace's compaction frontier (:func:`advance_times`) and equal
(record, time) neighbours are summed, zeros dropped; accumulations at versions beyond the
frontier are unchanged by this. Rows merged as equal are confirmed equal by value unless
the record hash is exact (:func:`exact_records`).

A lookup locates the probe keys in every batch of the spine at once (by full key hash,
see :mod:`engine.differential.indexed`; a few probes search the spine's batches below
``_RUN_MIN_BIG`` rows as one :class:`~engine.differential.indexed.SpineRun`, which the
trace keeps level with its spine, so a lookup's searches and gathers do not multiply with
the batches) and, unless the key hash is exact, drops rows whose
key values differ, so a collision never returns a wrong row; the records are gathered
only when asked for (:class:`Lookup`).

A trace is shared: each operator that reads it holds a :class:`TraceReader` whose
frontier says which versions it will still ask about. The trace compacts to the meet of
the open readers' frontiers, so no reader loses history it may still need.
A writer that keeps the collection's present value itself may replace the whole history
by it once every reader has moved to the present (:meth:`Trace.rebuild`); the trace
checks that no update it holds is later than that.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import expand_with_owner
from engine._kernels.hashing import exact_hash, group_equal, hash_rows, rows_equal, same_rows
from engine.differential.indexed import (
    RUN_MAX_BATCHES,
    IndexedZSet,
    SpineRun,
    exact_records,
    int_key_values,
    locate_in_spine,
)
from engine.differential.version import Antichain, Version, VersionLike, advance_times, as_version
from engine.differential.zset import ZSet, concat, take_rows, take_rows_from
from engine.errors import InputError, SchemaError

__all__ = ["SMALL_BATCHES", "Lookup", "MergePolicy", "Trace", "TraceReader"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

# lookups go through the spine run (SpineRun) for at most this many (probe, batch) pairs
# (the run's one search costs per pair); batches this big are probed by themselves, by key
# value where they can be (a search of a big cold array is a cache miss per level)
_RUN_PROBES = 1024
_RUN_MIN_BIG = 1 << 16



def _merged_order(parts: Sequence[IndexedZSet]) -> I64:
    """The permutation of the concatenated parts that sorts them by order key (stable)."""
    if len(parts) == 2:
        a, b = parts
        na, nb = len(a), len(b)
        # b's rows go after the a rows with an equal or smaller order key
        pos_b = np.searchsorted(a.order_key, b.order_key, "right") + np.arange(nb)
        from_b = np.zeros(na + nb, dtype=bool)
        from_b[pos_b] = True
        src = np.empty(na + nb, dtype=np.int64)
        src[from_b] = np.arange(na, na + nb)
        src[~from_b] = np.arange(na)
        return src
    # timsort finds the sorted runs and merges them
    return np.argsort(np.concatenate([p.order_key for p in parts]), kind="stable")


def _merge(parts: Sequence[IndexedZSet], since: Antichain, at: I64 | None = None) -> IndexedZSet:
    """Merge indexed batches (in arrival order), advance times by ``since``, consolidate.

    Equal records are neighbours in order-key order; only the neighbouring pairs whose
    hashes agree (``pair``: rows ``i`` and ``i + 1``) are examined further, so the passes
    over every row are the gathers and the two comparisons that find those pairs.
    ``at``, when given, is the one version every row's time advances to (``since`` is that
    version and no row is later): the times are then neither gathered nor compared.
    """
    src = _merged_order(parts)
    both = concat(*(p.batch for p in parts))
    assert both.times is not None
    order_key = np.concatenate([p.order_key for p in parts]).take(src)
    rec_hash = np.concatenate([p.rec_hash for p in parts]).take(src)
    pair = np.flatnonzero((order_key[1:] == order_key[:-1]) & (rec_hash[1:] == rec_hash[:-1]))
    times: I64 | None = None
    if at is None:
        times = both.times[src]
        if since:
            times = advance_times(times, since)
        # runs of 3+ equal records may hold several times in any order: sort those rows by
        # time inside their run, so that equal (record, time) rows become neighbours
        starts, counts = _runs(pair)
        long = counts >= 2
        if long.any():
            pos, run = expand_with_owner(pair[starts[long]], counts[long] + 1)
            o = np.lexsort(tuple(times[pos, j] for j in range(times.shape[1] - 1, -1, -1)) + (run,))
            src[pos] = src[pos[o]]
            times[pos] = times[pos[o]]
        if pair.size:
            pair = pair[(times[pair] == times[pair + 1]).all(axis=1)]
    key_hash = np.concatenate([p.key_hash for p in parts])
    if pair.size:  # confirm: equal hashes are proof only when the record hash is exact
        a, b = src[pair], src[pair + 1]
        if exact_records(both.schema, parts[0].keys):
            pair = pair[key_hash[a] == key_hash[b]]
        else:
            pair = pair[same_rows(both.data, a, b)]
    diffs = both.diffs.take(src)
    if pair.size == 0:  # nothing to consolidate: a reordering
        out = ZSet(both.data.take(src), diffs, times if times is not None else _at_rows(at, src.size))
        return IndexedZSet(parts[0].keys, out, key_hash.take(src), rec_hash, order_key)
    # each run of equal updates becomes its first row, weighted by the run's sum
    starts, _ = _runs(pair)
    diffs[pair[starts]] += np.add.reduceat(diffs[pair + 1], starts)
    keep_mask = diffs != 0
    keep_mask[pair + 1] = False
    keep = np.flatnonzero(keep_mask)
    rows = src.take(keep)
    out = ZSet(both.data.take(rows), diffs.take(keep), times[keep] if times is not None else _at_rows(at, keep.size))
    return IndexedZSet(parts[0].keys, out, key_hash.take(rows), rec_hash.take(keep), order_key.take(keep))


def _at_rows(at: I64 | None, n: int) -> I64:
    """``n`` rows of times at the version ``at`` (a merge that skipped the times, see :func:`_merge`)."""
    assert at is not None
    out = np.empty((n, at.size), dtype=np.int64)
    out[:] = at
    return out


def _runs(pair: I64) -> tuple[I64, I64]:
    """Runs of consecutive values in ``pair`` (ascending): where each starts in ``pair``,
    and how many values it holds (a run of ``c`` pairs links ``c + 1`` rows)."""
    if pair.size == 0:
        e = np.empty(0, dtype=np.int64)
        return e, e
    first = np.ones(pair.size, dtype=bool)
    first[1:] = pair[1:] != pair[:-1] + 1
    starts = np.flatnonzero(first)
    return starts, np.diff(np.append(starts, pair.size))


@dataclass(frozen=True, slots=True)
class MergePolicy:
    """When a trace merges its batches (size-tiered): once the last ``fanout`` batches are
    of one size class, they become one. A batch of ``n`` rows is of class
    ``floor(log_fanout(max(n, base) / base))``: every batch below ``base`` rows is of class 0.

    Raises
    ------
    InputError
        If ``fanout < 2`` or ``base < 1``.
    """

    fanout: int = 4   # batches merged at once; a lookup probes about this many per class
    base: int = 1024  # rows in the smallest size class

    def __post_init__(self) -> None:
        if self.fanout < 2 or self.base < 1:
            raise InputError(f"a merge policy needs fanout >= 2 and base >= 1, got {self}")

    def level(self, n: int) -> int:
        """Size class of a batch of ``n`` rows."""
        return int(math.log(max(n, self.base) / self.base) / math.log(self.fanout))


SMALL_BATCHES = MergePolicy(fanout=8, base=64)


@dataclass(frozen=True, slots=True, eq=False)
class Lookup:
    """What a trace holds for some probe keys, gathered lazily.

    The per-entry arrays are numpy; the records themselves are taken from the trace's
    batches only when asked for (:meth:`records`), so an operator that needs few of them
    (the live value of each key, say) does not gather the rest.

    Attributes
    ----------
    probe
        Per entry, the index of the probe key it belongs to.
    rec_hash
        Per entry, the record hash (equal records have equal hashes).
    diffs
        Per entry, its weight (versions: :attr:`times`).
    """

    probe: I64
    diffs: I64
    _batches: tuple[IndexedZSet, ...]
    _bounds: list[int]  # entries _bounds[i]:_bounds[i + 1] are in _batches[i]
    _rows: I64       # per entry: row in that batch
    _schema: pa.Schema
    _dims: int
    _times: I64 | None = None  # gathered with the diffs when every reader needs them

    @property
    def _which(self) -> I64:
        """Per entry, the index of its trace batch."""
        return np.repeat(np.arange(len(self._batches), dtype=np.int64), np.diff(self._bounds))

    @property
    def rec_hash(self) -> U64:
        """Per entry, the record hash (equal records have equal hashes; gathered on demand)."""
        return self._gather(lambda b: b.rec_hash, np.uint64)  # type: ignore[no-any-return]

    def _gather(self, part: Any, dtype: Any) -> Any:
        """Per entry, ``part(batch)[row]`` (a gather per trace batch)."""
        if not self._batches:
            return np.empty(0, dtype=dtype)
        if len(self._batches) == 1:
            return part(self._batches[0])[self._rows]
        out = np.empty((self.probe.size,) + part(self._batches[0]).shape[1:], dtype=dtype)
        b = self._bounds
        for i, batch in enumerate(self._batches):  # a loop per trace batch
            out[b[i]:b[i + 1]] = part(batch)[self._rows[b[i]:b[i + 1]]]
        return out

    def __len__(self) -> int:
        return int(self.probe.size)

    @property
    def first_count(self) -> int:
        """Entries from the first trace batch (they come first)."""
        return self._bounds[1] if len(self._bounds) > 1 else 0

    def records(self, sel: npt.ArrayLike | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """The records of the entries ``sel`` (all by default), in that order; with
        ``columns``, only those columns."""
        def data(b: int) -> pa.Table:
            d = self._batches[b].batch.data
            return d if columns is None else d.select(list(columns))

        if sel is None:  # entries are grouped by trace batch, in batch order
            if self.probe.size == 0:
                return self._schema.empty_table() if columns is None else \
                    self._schema.empty_table().select(list(columns))
            if len(self._batches) == 1:
                return take_rows(data(0), self._rows, views=self._views)
            return take_rows_from([data(b) for b in range(len(self._batches))], self._bounds, self._rows,
                                  views=self._views)
        idx = np.asarray(sel, dtype=np.int64)
        if idx.size == 0:
            return self._schema.empty_table() if columns is None else \
                self._schema.empty_table().select(list(columns))
        if len(self._batches) == 1:
            return data(0).take(self._rows[idx])
        which = self._which[idx]
        groups = [np.flatnonzero(which == b) for b in range(len(self._batches))]  # a counting sort
        parts = [data(b).take(self._rows[idx[g]])
                 for b, g in enumerate(groups) if g.size]  # one take per trace batch
        order = np.concatenate(groups)
        gathered = pa.concat_tables(parts)
        if np.all(order[1:] > order[:-1]):
            return gathered
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return gathered.take(inverse)

    def _views(self, b: int, name: str) -> npt.NDArray[Any] | None:
        return self._batches[b].numeric_column(name)

    @property
    def times(self) -> I64:
        """Per entry, its version (gathered on demand)."""
        if self._times is not None:
            return self._times
        if not self._batches:
            return np.empty((0, self._dims), dtype=np.int64)
        return self._gather(lambda b: b.batch.times, np.int64)  # type: ignore[no-any-return]

    @property
    def entries(self) -> ZSet:
        """Every entry as a timed batch (not consolidated across trace batches)."""
        return ZSet(self.records(), self.diffs, self.times)


class TraceReader:
    """One operator's hold on a :class:`Trace`: the versions it may still ask about.

    The trace compacts no further than the meet of its open readers' frontiers.
    """

    def __init__(self, trace: Trace, since: Antichain) -> None:
        self.trace = trace
        self.since = since
        self.closed = False

    def set_logical_compaction(self, frontier: Antichain) -> None:
        """Promise to ask only about versions beyond ``frontier`` from now on.

        Raises
        ------
        InputError
            If ``frontier`` is behind the reader's current one.
        """
        self.since.check_advance(frontier)
        self.since = frontier

    def close(self) -> None:
        """Release the hold; the trace may compact past this reader's frontier."""
        if not self.closed:
            self.closed = True
            self.trace._readers.remove(self)


class Trace:
    """A collection's updates by key and version, compacted below a frontier.

    Parameters
    ----------
    schema
        The record columns.
    keys
        The key columns the trace is indexed by.
    dims
        Coordinates per version.
    policy
        When batches merge (:class:`MergePolicy`; the default suits a step's batches).

    Examples
    --------
    >>> tr = Trace(pa.schema([("k", pa.int64()), ("v", pa.string())]), ["k"])
    >>> tr.insert(ZSet.from_triples([((1, "a"), 0, 1), ((1, "a"), 1, -1), ((1, "b"), 1, 1)], ["k", "v"]))
    >>> tr.accumulate(at=0).to_triples(), tr.accumulate(at=1).to_triples()
    ([((1, 'a'), None, 1)], [((1, 'b'), None, 1)])
    """

    def __init__(self, schema: pa.Schema, keys: Sequence[str] | str, *, dims: int = 1,
                 policy: MergePolicy = MergePolicy()) -> None:
        self.schema = schema
        self.keys = (keys,) if isinstance(keys, str) else tuple(keys)
        missing = [k for k in self.keys if k not in schema.names]
        if not self.keys or missing:
            raise SchemaError(f"key column(s) {missing or list(self.keys)} not in {schema.names}")
        if dims < 1:
            raise InputError(f"a trace's versions need at least one coordinate, got dims={dims}")
        self.dims = dims
        self.policy = policy
        self.exact_keys = exact_hash(schema, self.keys)
        self._spine: list[IndexedZSet] = []
        self._readers: list[TraceReader] = []
        self._since = Antichain([Version((0,) * dims)])
        # per coordinate, the latest time ever inserted (a rebuild's rows sit at the
        # frontier, which never goes back: they need no entry)
        self._upper: I64 | None = None
        self._run = SpineRun(dims)  # the spine's small batches, end to end (for lookups)

    # sharing ------------------------------------------------------------------------
    def reader(self) -> TraceReader:
        """A new hold on this trace, starting at its current compaction frontier."""
        r = TraceReader(self, self.since)
        self._readers.append(r)
        return r

    @property
    def since(self) -> Antichain:
        """The compaction frontier: the meet of the open readers' frontiers."""
        if self._readers:
            f = self._readers[0].since
            for r in self._readers[1:]:
                f = f.meet(r.since)
            self._since = f
        return self._since

    # writing ------------------------------------------------------------------------
    def insert(self, batch: ZSet | IndexedZSet) -> None:
        """Add a timed batch of updates (merging batches as the spine requires).

        Raises
        ------
        SchemaError
            If the batch's columns are not the trace's.
        InputError
            If the batch is untimed or its versions have another dimension.
        """
        z = batch.batch if isinstance(batch, IndexedZSet) else batch
        times = self._checked_times(z)
        if z.num_rows == 0:
            return
        latest = times.max(axis=0)
        self._upper = latest if self._upper is None else np.maximum(self._upper, latest)
        ib = batch if isinstance(batch, IndexedZSet) and batch.keys == self.keys \
            else IndexedZSet.build(z, self.keys, one_time=bool((times.min(axis=0) == latest).all()))
        self._spine.append(ib)
        # size-tiered: the last `fanout` batches merge once they are all of one size class
        fan, level = self.policy.fanout, self.policy.level
        while len(self._spine) >= fan and level(len(self._spine[-fan])) <= level(len(self._spine[-1])):
            parts = self._spine[-fan:]
            del self._spine[-fan:]
            merged = _merge(parts, self.since, self._one_version())
            if len(merged):
                self._spine.append(merged)

    def _one_version(self) -> I64 | None:
        """The compaction frontier's coordinates when it is one version and no update
        stored is later: every stored time then advances to it (see :func:`_merge`)."""
        frontier = self.since
        if len(frontier) != 1 or self._upper is None:
            return None
        at = np.asarray(frontier.elements[0].coords, dtype=np.int64)
        return at if bool((self._upper <= at).all()) else None

    def _checked_times(self, z: ZSet) -> I64:
        """``z``'s times, once its columns and version dimension are found to be the trace's."""
        if not z.schema.equals(self.schema) and (
                z.schema.names != self.schema.names or z.schema.types != self.schema.types):
            raise SchemaError(f"batch columns {z.schema} do not match the trace's {self.schema}")
        if z.times is None or z.times.shape[1] != self.dims:
            raise InputError(f"trace batches need times of {self.dims} coordinate(s), got {z.dims}")
        return z.times

    def rebuild(self, accumulation: ZSet) -> None:
        """Replace every stored update by ``accumulation``: the collection at the compaction
        frontier, each row timed there.

        When every update ever inserted is at or before the frontier (one version), this is
        what a full :meth:`compact` leaves, and every version a reader may still ask about
        accumulates to the same collection. A writer that keeps that collection itself
        (:class:`~engine.differential.upsert.Upsert`) builds it with one sort instead of
        merging the history down to it. The trace takes the rows on trust: the writer's own
        check says whether they agree with what it inserted (``Upsert.validate``, U2).

        Raises
        ------
        InputError
            If the frontier is not one version, an update was inserted at a later time, or a
            row of ``accumulation`` is not timed at the frontier.
        SchemaError
            If the columns are not the trace's.
        """
        frontier = self.since
        if len(frontier) != 1:
            raise InputError(f"a trace is rebuilt at one version; its compaction frontier is {frontier!r}")
        at = np.asarray(frontier.elements[0].coords, dtype=np.int64)
        if self._upper is not None and bool((self._upper > at).any()):
            raise InputError(
                f"cannot rebuild the trace at {frontier!r}: it holds updates up to "
                f"{tuple(self._upper.tolist())}, which a rebuild would lose")
        times = self._checked_times(accumulation)
        if bool((times != at).any()):
            raise InputError(f"a rebuild's rows must all be timed at the frontier {frontier!r}")
        self._spine = [IndexedZSet.build(accumulation, self.keys, one_time=True)] if accumulation.num_rows else []

    def project(self, names: Sequence[str]) -> None:
        """Store only the columns ``names`` (which keep the keys), before any update arrives.

        Raises
        ------
        InputError
            If the trace holds updates already.
        SchemaError
            If a key column is left out or a name is not a column.
        """
        if self._spine:
            raise InputError("a trace's columns can only be narrowed while it is empty")
        missing = [n for n in self.keys if n not in names] + [n for n in names if n not in self.schema.names]
        if missing:
            raise SchemaError(f"project: column(s) {missing} are keys left out or not in {self.schema.names}")
        self.schema = pa.schema([self.schema.field(n) for n in names])

    def compact(self) -> None:
        """Merge every batch into one, advancing times to the frontier and consolidating."""
        if not self._spine:
            return
        parts = self._spine
        if len(parts) == 1:
            only = parts[0]
            parts = [only, IndexedZSet(only.keys, ZSet.empty(self.schema, self.dims), only.key_hash[:0],
                                       only.rec_hash[:0], only.order_key[:0])]
        merged = _merge(parts, self.since, self._one_version())
        self._spine = [merged] if len(merged) else []

    # reading ------------------------------------------------------------------------
    def __len__(self) -> int:
        """Updates stored (after the consolidation merges have done so far)."""
        return sum(len(b) for b in self._spine)

    @property
    def batches(self) -> tuple[IndexedZSet, ...]:
        return tuple(self._spine)

    def to_zset(self) -> ZSet:
        """Every stored update, with times (not consolidated across batches)."""
        if not self._spine:
            return ZSet.empty(self.schema, self.dims)
        return concat(*(b.batch for b in self._spine))

    def lookup(self, keys: pa.Table, *, key_hash: U64 | None = None,
               batches: Sequence[IndexedZSet] | None = None) -> Lookup:
        """Every stored update of the keys in ``keys`` (a table of the key columns).

        ``key_hash`` is ``keys``' hash when the caller has it already; ``batches`` a
        snapshot of the spine (:attr:`batches`, taken earlier) to read instead of the
        current one.

        Raises
        ------
        SchemaError
            If ``keys`` lacks a key column.
        """
        names = keys.schema.names
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise SchemaError(f"lookup keys lack column(s) {missing} (trace keys: {list(self.keys)})")
        ph = hash_rows(keys, self.keys) if key_hash is None else key_hash
        spine = tuple(self._spine) if batches is None else tuple(batches)
        # the leading big batches are probed one by one (by key value where they can be),
        # the others through the spine run: one search and one gather for all of them
        big = 0
        while big < len(spine) and len(spine[big]) >= _RUN_MIN_BIG:  # a loop per big batch
            big += 1
        run = spine[big:]
        if len(run) < 2 or len(run) > RUN_MAX_BATCHES or len(run) * ph.size > _RUN_PROBES:
            big, run = len(spine), ()  # one batch gains nothing from the run
        hit_batches: list[IndexedZSet] = []
        sizes: list[int] = []
        probes: list[I64] = []
        all_rows: list[I64] = []
        all_diffs: list[I64] = []
        all_times: list[I64] = []
        # partially ordered versions (a loop's): every reader needs the times, so they are
        # gathered in the same pass as the diffs
        timed = self.dims > 1
        if big:
            probe, rows, counts = locate_in_spine(spine[:big], ph, lambda: int_key_values(keys, self.keys))
            at = 0
            for b, c in zip(spine[:big], counts, strict=True):  # a loop per big batch
                if c:
                    r = rows[at:at + c]
                    hit_batches.append(b)
                    sizes.append(c)
                    all_diffs.append(b.batch.diffs.take(r))
                    if timed:
                        all_times.append(b.batch.times.take(r, axis=0))  # type: ignore[union-attr]
                at += c
            probes.append(probe)
            all_rows.append(rows)
        if run:
            self._run.sync(run)
            probe, pos, counts = self._run.locate(ph)
            starts = [self._run.starts[i] for i, c in enumerate(counts) if c]
            hit_batches.extend(b for b, c in zip(run, counts, strict=True) if c)
            run_sizes = [c for c in counts if c]
            sizes.extend(run_sizes)
            probes.append(probe)
            all_rows.append(pos - np.repeat(np.asarray(starts, dtype=np.int64), run_sizes) if starts else pos)
            all_diffs.append(self._run.diffs(pos))
            if timed:
                all_times.append(self._run.times(pos))
        if not hit_batches:
            e = np.empty(0, np.int64)
            return Lookup(e, e, (), [0], e, self.schema, self.dims)
        spine = tuple(hit_batches)
        bounds = list(itertools.accumulate(sizes, initial=0))
        probe = probes[0] if len(probes) == 1 else np.concatenate(probes)
        rows = all_rows[0] if len(all_rows) == 1 else np.concatenate(all_rows)
        diffs = all_diffs[0] if len(all_diffs) == 1 else np.concatenate(all_diffs)
        times = None if not timed else all_times[0] if len(all_times) == 1 else np.concatenate(all_times)
        out = Lookup(probe, diffs, spine, bounds, rows, self.schema, self.dims, times)
        if not self.exact_keys:  # different keys with one hash: drop them
            names = list(self.keys)
            ok = rows_equal(out.records().select(names), keys.select(names).take(probe))
            if not ok.all():
                kept = np.searchsorted(np.flatnonzero(ok), bounds).tolist()  # entries stay grouped
                out = Lookup(probe[ok], diffs[ok], spine, kept, rows[ok], self.schema, self.dims,
                             None if times is None else times[ok])
        return out

    def _distinct(self, keys: pa.Table) -> pa.Table:
        """``keys`` without repeated keys (a lookup answers once per probe)."""
        k = keys.select(list(self.keys))

        def same(i: I64, j: I64) -> npt.NDArray[np.bool_]:
            return same_rows(k, i, j)

        order, starts = group_equal(hash_rows(k, self.keys), None if self.exact_keys else same)
        if starts.size == k.num_rows:
            return k
        return k.take(np.sort(np.minimum.reduceat(order, starts)))

    def accumulate(self, at: VersionLike | None = None, keys: pa.Table | None = None) -> ZSet:
        """The collection at version ``at`` (all updates with time ``<= at``), untimed.

        ``at=None`` sums every update (seed 003's Consolidate of a trace). With ``keys``,
        only those keys.

        Raises
        ------
        InputError
            If ``at`` is not beyond the compaction frontier (that history is compacted).
        """
        z = self.to_zset() if keys is None else self.lookup(self._distinct(keys)).entries
        if at is None:
            return z.accumulate()
        v = as_version(at)
        if not self.since.less_equal_version(v):
            raise InputError(
                f"cannot accumulate at {v!r}: the trace is compacted to {self.since!r}; "
                f"hold a TraceReader to keep older versions"
            )
        return z.accumulate(v)
