"""Reductions: ``count``, ``sum``, ``min``, ``max`` per group and ``distinct`` (seed 002's
reduce, seed 003's Aggregate / Distinct / Distinct Trace).

Semantics, on the collection accumulated at a version (weights may be negative):

* ``count`` is a group's total weight, ``sum(col)`` the weighted sum of ``col``; a group
  with ``count`` and ``sum`` aggregates exists while its total weight is not zero;
* ``min(col)``/``max(col)`` range over the group's records of positive weight; the group
  exists while it has one;
* ``distinct`` holds each record of positive weight once.

Every output row has weight 1. ``sum``/``min``/``max`` columns must be null-free integers
(results int64) or floats (results float64). A reduce takes either ``count``/``sum``
aggregates or ``min``/``max`` ones, not both (reduce twice and join to combine them).

How a change is computed. With ``f`` the reduction applied per group and ``X[t]`` the
input accumulated at ``t``, the output must accumulate to ``f(X[t])`` at every time. On
the integer grid of versions that fixes the output's change at ``t`` by Moebius
inversion over the product order: ``sum over subsets S of coordinates of
(-1)^|S| f(X[t - 1_S])`` (for ``(e, i)``: ``f(X[e,i]) - f(X[e-1,i]) - f(X[e,i-1]) +
f(X[e-1,i-1])``, seed 003's Distinct Trace; seed 002's "couch" correction is the last
three terms). A group needs evaluating at ``(e, i)`` only if its input changed at
``(e, i)``, or it changed earlier in epoch ``e`` and its history holds a change at
iteration ``i`` from an earlier epoch; those later iterations are *scheduled* when the
group is first evaluated (differential dataflow's "interesting times"). Evaluating reads
the group's updates from the arranged input (one trace lookup for all the groups of the
time), masks them per corner time and aggregates with numpy.

Root-scope fast paths keep per-group state instead of re-reading history: ``count``/``sum``
(a group's new value is its old value plus the change) and ``distinct`` (a record's
accumulated weight), in a vectorized hash map; a step costs the size of its change. Groups
are found by a 64-bit hash of their values and told apart exactly: one integer group column
is its own exact hash, other groups are verified against a stored copy of their values
(:class:`~engine._kernels.keymap.StoredKeyMap`), so two groups never merge. A batch's rows are grouped without sorting: by offset for one integer
group column over a narrow range (count/sum add up over the whole range and keep the groups
whose aggregates changed; only those values are hashed), else by state slot
(a mark array when the state is small next to the batch); integer sums go through
``np.add.at`` (exact, and faster than a float ``bincount`` at these sizes).

Inside an ``iterate``, ``distinct`` of one integer column keeps state too
(:class:`_LoopDistinctNode`): per record, its input accumulated at every iteration of the
current and the previous outer version, as two dense rows of cumulative weights, so the
four corners are two gathers and there is no arrangement to insert into or look up; past a
size budget (records x iterations) or on a null record it moves that history into a trace
and goes on as the general reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import numeric_view
from engine._kernels.hashing import exact_hash, group_equal, hash_column, hash_rows, same_rows
from engine._kernels.hashmap import U64Map
from engine._kernels.keymap import StoredKeyMap
from engine.differential.dataflow import Collection, Node, Scope, Time
from engine.differential.indexed import IndexedZSet, int_key_values
from engine.differential.join import ArrangeNode, arrange
from engine.differential.trace import SMALL_BATCHES, Lookup, Trace
from engine.differential.version import Version, VersionLike, as_version
from engine.differential.zset import ZSet, concat, take_rows
from engine.errors import InputError, SchemaError

__all__ = ["Agg", "distinct_trace"]

Agg: TypeAlias = "tuple[str] | tuple[str, str]"
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

_LINEAR = ("count", "sum")
_ORDER = ("min", "max")


@dataclass(frozen=True)
class _Spec:
    """What a reduce computes: ``by`` columns, then ``(name, fn, column)`` per aggregate
    (``fn`` in count/sum/min/max), or ``distinct``."""

    by: tuple[str, ...]
    aggs: tuple[tuple[str, str, str | None], ...]
    distinct: bool
    schema: pa.Schema

    @property
    def linear(self) -> bool:
        return not self.distinct and all(fn in _LINEAR for _, fn, _ in self.aggs)


def _make_spec(schema: pa.Schema, by: tuple[str, ...], aggs: Mapping[str, Agg]) -> _Spec:
    missing = [b for b in by if b not in schema.names]
    if not by or missing:
        raise SchemaError(f"reduce: group column(s) {missing or list(by)} not in {schema.names}")
    if not aggs:
        raise InputError("reduce needs at least one aggregate, e.g. {'n': ('count',)}")
    out = []
    fields = [schema.field(b) for b in by]
    for name, agg in aggs.items():
        fn = agg[0]
        col = agg[1] if len(agg) > 1 else None
        if fn == "count":
            col = None
            typ = pa.int64()
        elif fn in ("sum", "min", "max"):
            if col is None or col not in schema.names:
                raise SchemaError(f"reduce: aggregate {name!r} = {fn}({col}) needs a column of "
                                  f"{schema.names}")
            t = schema.field(col).type
            if pa.types.is_integer(t) or pa.types.is_boolean(t):
                typ = pa.int64()
            elif pa.types.is_floating(t):
                typ = pa.float64()
            else:
                raise SchemaError(f"reduce: {fn}({col!r}) needs an integer or float column, got {t}")
        else:
            raise InputError(f"reduce: unknown aggregate {fn!r} for {name!r} "
                             f"(use count, sum, min or max)")
        if name in by:
            raise SchemaError(f"reduce: aggregate name {name!r} is also a group column")
        out.append((name, fn, col))
        fields.append(pa.field(name, typ))
    kinds = {fn in _LINEAR for _, fn, _ in out}
    if len(kinds) > 1:
        raise InputError("reduce: count/sum and min/max have different group semantics; reduce "
                         "twice and join the results")
    return _Spec(by, tuple(out), False, pa.schema(fields))


def _values(table: pa.Table, col: str, what: str) -> npt.NDArray[np.generic]:
    arr = table.column(col)
    if arr.null_count:
        raise InputError(f"reduce: {what} column {col!r} has {arr.null_count} null value(s); "
                         f"fill or filter them first")
    v = np.asarray(arr.to_numpy())
    return v.astype(np.float64 if v.dtype.kind == "f" else np.int64, copy=False)


def _distinct_rows(table: pa.Table) -> pa.Table:
    """``table`` without repeated rows (in no particular order)."""
    names = table.column_names
    keys = _distinct_keys([(table, hash_rows(table, names))], names)[0]
    return keys.table() if isinstance(keys, _IntKeys) else keys


def _distinct_keys(parts: list[tuple[_Keys, U64]], by: Sequence[str]) -> tuple[_Keys, U64]:
    """The group keys of ``parts`` (tables of the ``by`` columns, or :class:`_IntKeys`, each
    with its rows' key hashes) without repeats, with their key hashes (first occurrences, in
    order): each key is hashed once, by whoever built it (the arrangement indexed the delta
    already).

    One null-free integer-like column (an exact hash) is deduplicated in numpy, by hash,
    and comes back as :class:`_IntKeys` in key-hash order: no Arrow concatenation, no
    gather per part, no table until one is asked for."""
    first_part = parts[0][0]
    schema = first_part.schema
    if len(by) == 1 and exact_hash(schema, by):
        views = [p.values if isinstance(p, _IntKeys) else numeric_view(p.column(0)) for p, _ in parts]
        if all(v is not None for v in views):
            h = parts[0][1] if len(parts) == 1 else np.concatenate([k for _, k in parts])
            v = views[0] if len(parts) == 1 else np.concatenate(views)  # type: ignore[arg-type]
            if h.size > 1:
                new = np.empty(h.size, dtype=bool)
                new[0] = True
                if len(parts) == 1 and bool((h[1:] >= h[:-1]).all()):  # an indexed delta: in hash order
                    np.not_equal(h[1:], h[:-1], out=new[1:])
                    if not new.all():
                        h, v = h[new], v[new]  # type: ignore[index]
                else:
                    order = h.argsort(kind="stable")
                    h = h.take(order)
                    np.not_equal(h[1:], h[:-1], out=new[1:])
                    if not new.all():
                        order, h = order[new], h[new]
                    v = v.take(order)  # type: ignore[union-attr]
            return _IntKeys(by[0], v, schema.field(0).type), h  # type: ignore[arg-type]
    tables = [p.table() if isinstance(p, _IntKeys) else p for p, _ in parts]
    if len(parts) == 1:
        table, h = tables[0], parts[0][1]
    else:  # one chunk per column: later gathers from it go through numpy (take_rows)
        table = pa.concat_tables(tables).combine_chunks()
        h = np.concatenate([k for _, k in parts])
    if table.num_rows <= 1:
        return table, h
    same = None if exact_hash(table.schema, by) else (lambda i, j: same_rows(table, i, j))
    order, starts = group_equal(h, same)
    if starts.size == table.num_rows:
        return table, h
    first = np.sort(np.minimum.reduceat(order, starts))
    return take_rows(table, first), h.take(first)


@dataclass(frozen=True)
class _IntKeys:
    """Groups of one integer-like column as their numpy values (storage type of ``type``),
    taken and sliced without Arrow; a table only when one is asked for."""

    name: str
    values: npt.NDArray[Any]
    type: pa.DataType

    @property
    def num_rows(self) -> int:
        return int(self.values.size)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(self.name, self.type)])

    def table(self) -> pa.Table:
        return _int_table(self.name, self.values, self.type)

    def take(self, sel: I64) -> pa.Table:
        """The groups ``sel`` as a table."""
        return _int_table(self.name, self.values.take(sel), self.type)

    def subset(self, sel: I64) -> _IntKeys:
        """The groups ``sel``, still as values."""
        return _IntKeys(self.name, self.values.take(sel), self.type)

    def slice(self, offset: int, length: int) -> _IntKeys:
        return _IntKeys(self.name, self.values[offset:offset + length], self.type)


def _int_table(name: str, values: npt.NDArray[Any], typ: pa.DataType) -> pa.Table:
    if values.dtype == np.int64 and typ != pa.int64() and not pa.types.is_temporal(typ):
        arr = pa.array(values, type=pa.int64()).cast(typ)  # int64 values of a narrower column
    else:
        arr = pa.array(values, type=typ)
    return pa.Table.from_arrays([arr], names=[name])


_Keys: TypeAlias = "pa.Table | _IntKeys"


@dataclass
class _Entries:
    """A trace's updates for ``m`` groups, sorted by (group, record)."""

    probe: I64          # group per entry
    diffs: I64
    times: I64
    gstart: I64         # first entry of each (group, record) run
    values: dict[str, npt.NDArray[np.generic]]
    lookup: Lookup
    order: I64          # entry -> position in the lookup


def _entries(found: Lookup, spec: _Spec) -> _Entries:
    order = np.lexsort((found.rec_hash, found.probe))
    probe = found.probe[order]
    rh = found.rec_hash[order]
    new = np.ones(probe.size, dtype=bool)
    new[1:] = (probe[1:] != probe[:-1]) | (rh[1:] != rh[:-1])
    n = probe.size
    values: dict[str, npt.NDArray[np.generic]] = {}
    cols = {c for _, fn, c in spec.aggs if c is not None}
    if cols and n:
        recs = found.records(order)
        for c in cols:  # a loop per aggregate column
            values[c] = _values(recs, c, "aggregate")
    return _Entries(probe, found.diffs[order], found.times[order], np.flatnonzero(new), values,
                    found, order)


def _evaluate(keys: pa.Table, ent: _Entries, corner: Time, spec: _Spec) -> pa.Table | None:
    """``f`` of the groups' collections accumulated at ``corner``: one row per present group."""
    if ent.probe.size == 0:
        return None
    inc = (ent.times <= np.asarray(corner, dtype=np.int64)).all(axis=1)
    w = np.where(inc, ent.diffs, 0)
    rw = np.add.reduceat(w, ent.gstart)               # weight per (group, record)
    gprobe = ent.probe[ent.gstart]
    kstart = np.flatnonzero(np.concatenate(([True], gprobe[1:] != gprobe[:-1])))
    kprobe = gprobe[kstart]
    cols: list[pa.Array] = []
    if spec.linear:
        cnt = np.add.reduceat(rw, kstart)
        present = cnt != 0
        for _, fn, c in spec.aggs:  # a loop per aggregate
            if fn == "count":
                cols.append(pa.array(cnt[present]))
            else:
                assert c is not None
                v = ent.values[c][ent.gstart]
                cols.append(pa.array(np.add.reduceat(rw * v, kstart)[present]))
    else:
        positive = rw > 0
        present = np.add.reduceat(positive.astype(np.int64), kstart) > 0
        for _, fn, c in spec.aggs:
            assert c is not None
            v = ent.values[c][ent.gstart]
            big = np.inf if v.dtype.kind == "f" else np.iinfo(np.int64).max
            if fn == "min":
                r = np.minimum.reduceat(np.where(positive, v, big), kstart)
            else:
                r = np.maximum.reduceat(np.where(positive, v, -big), kstart)
            cols.append(pa.array(r[present]))
    if not present.any():
        return None
    kt = keys.take(kprobe[present])
    names = list(spec.by) + [n for n, _, _ in spec.aggs]
    return pa.Table.from_arrays(list(kt.columns) + cols, names=names).cast(spec.schema)


def _corners(t: Time) -> list[tuple[Time, int]]:
    """``(t - 1_S, (-1)^|S|)`` for every subset ``S`` of coordinates, inside the grid."""
    out = []
    d = len(t)
    for mask in range(1 << d):  # 2 or 4 corners
        c = tuple(t[j] - ((mask >> j) & 1) for j in range(d))
        if min(c) >= 0:
            out.append((c, -1 if bin(mask).count("1") % 2 else 1))
    return out


def _distinct_change(keys: _Keys, probe: I64, diffs: I64, times: I64, t: Time) -> ZSet | None:
    """``distinct``'s change at ``t`` (Moebius over the corners) for the records ``keys``,
    given their trace entries (``probe``: the key of each): per record, the signed sum over
    the corners of "present there", then the records whose sum is not 0. Every corner at
    once (an entry's inclusion per corner is one ``(n, corners)`` mask), summed per record
    and corner without sorting the entries; a group is a whole record, so the records are
    gathered from ``keys``, not from the trace's batches."""
    if probe.size == 0:
        return None
    corners, signs = _corner_arrays(t)  # corners by coordinate: (d, k)
    inc = times[:, 0, None] <= corners[0]                            # (entries, corners)
    for j in range(1, corners.shape[0]):  # a loop per coordinate (numpy's all(axis) is slow here)
        inc &= times[:, j, None] <= corners[j]
    k = signs.size
    rw = np.zeros(keys.num_rows * k, dtype=np.int64)  # weight per record and corner
    np.add.at(rw, (probe[:, None] * k + np.arange(k)).ravel(), (inc * diffs[:, None]).ravel())
    net = (rw.reshape(-1, k) > 0) @ signs
    pos = np.flatnonzero(net)
    if pos.size == 0:
        return None
    return ZSet(keys.take(pos) if isinstance(keys, _IntKeys) else take_rows(keys, pos), net[pos])


_OFFSETS: dict[int, tuple[I64, I64]] = {}


def _corner_arrays(t: Time) -> tuple[I64, I64]:
    """Every corner ``t - 1_S`` and its sign ``(-1)^|S|`` as arrays, ``(corners (d, k),
    signs (k,))``: coordinate ``j`` of corner ``c`` is ``corners[j, c]``. Corners off the
    grid (a coordinate of -1) are kept: no update is at or before them, so they add 0. The
    offsets and signs are built once per dimension."""
    d = len(t)
    found = _OFFSETS.get(d)
    if found is None:
        cs = _corners((1,) * d)  # every corner of the unit time is on the grid
        found = _OFFSETS[d] = (np.array([[1 - x for x in c] for c, _ in cs], dtype=np.int64).T.copy(),
                               np.array([s for _, s in cs], dtype=np.int64))
    offsets, signs = found
    return np.array(t, dtype=np.int64)[:, None] - offsets, signs


def _change(keys: pa.Table, ent: _Entries, t: Time, spec: _Spec) -> ZSet | None:
    """The output's change at ``t`` for the groups ``keys`` (Moebius over the corners;
    ``distinct`` has its own, :func:`_distinct_change`)."""
    parts = []
    for c, sign in _corners(t):
        rows = _evaluate(keys, ent, c, spec)
        if rows is not None and rows.num_rows:
            parts.append(ZSet(rows, np.full(rows.num_rows, sign, np.int64)))
    if not parts:
        return None
    out = concat(*parts).consolidate()
    return out if out.num_rows else None


class _TraceEval:
    """The general reduce's evaluation over a trace of its input (any scope, any
    aggregate): at ``t``, the groups of the delta and those scheduled for ``t`` are looked
    up in the trace (which holds the delta already) and their change computed by Moebius
    inversion (see the module docstring). Shared by :class:`_ReduceNode` (an arranged
    input) and :class:`_LoopDistinctNode` (its own trace, once it leaves its dense rows)."""

    def __init__(self, scope: Scope, trace: Trace, spec: _Spec) -> None:
        self.scope = scope
        self.trace = trace
        self.spec = spec
        self._reader = trace.reader()
        self.scheduled: dict[Time, list[tuple[_Keys, U64]]] = {}  # groups, their key hashes

    def run(self, t: Time, delta: tuple[pa.Table, U64] | None) -> ZSet | None:
        """The change at ``t`` for the groups of ``delta`` (the ``by`` columns of the
        input at ``t`` and their key hashes) and those scheduled for ``t``."""
        since = self.scope.reduce_since(t)
        if self._reader.since != since:
            self._reader.set_logical_compaction(since)
        parts = self.scheduled.pop(t, [])
        if delta is not None:
            parts.append(delta)
        if not parts:
            return None
        groups, kh = _distinct_keys(parts, self.spec.by)
        keys = groups.table() if isinstance(groups, _IntKeys) else groups
        found = self.trace.lookup(keys, key_hash=kh)
        if self.spec.distinct:  # a group is one record: no sort of the entries, no table per corner
            probe, times = found.probe, found.times
            if self.scope.nested:
                self._schedule(groups, kh, probe, times, t)
            out = _distinct_change(groups, probe, found.diffs, times, t)
        else:
            ent = _entries(found, self.spec)
            if self.scope.nested:
                self._schedule(keys, kh, ent.probe, ent.times, t)
            out = _change(keys, ent, t, self.spec)
        return None if out is None else out.with_time(t)

    def _schedule(self, keys: _Keys, kh: U64, probe: I64, times: I64, t: Time) -> None:
        """Groups with history at a later iteration of an earlier epoch must be evaluated
        again at that iteration of this epoch (``probe``, ``times``: the group and version
        of each of their trace entries)."""
        later = (times[:, 0] < t[0]) & (times[:, -1] > t[-1])
        if not later.any():
            return
        m = np.int64(keys.num_rows)
        code = np.sort(times[later, -1] * m + probe[later])
        code = code[np.concatenate(([True], code[1:] != code[:-1]))]  # each (iteration, group) once
        its, probes = code // m, code % m
        bounds = np.flatnonzero(np.concatenate(([True], its[1:] != its[:-1], [True]))).tolist()
        groups = keys.subset(probes) if isinstance(keys, _IntKeys) else take_rows(keys, probes)
        hashes = kh.take(probes)  # by iteration: one gather, then slices
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):  # a loop per later iteration
            tt = t[:-1] + (int(its[a]),)
            self.scheduled.setdefault(tt, []).append((groups.slice(a, b - a), hashes[a:b]))
            self.scope.times.add(tt)


class _ReduceNode(Node):
    """The general reduce over an arranged input: any scope, any aggregate."""

    emits_at_input_time = True  # a change at t, for the groups evaluated at t
    emits_consolidated = True  # one change per group (distinct: per record) at t

    def __init__(self, scope: Scope, source: ArrangeNode, spec: _Spec) -> None:
        super().__init__(scope, [source], spec.schema)
        self.arranged = source
        self.spec = spec
        self._eval = _TraceEval(scope, source.trace, spec)

    def has_work(self, t: Time) -> bool:
        return t in self._pending or t in self._eval.scheduled

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        delta = None
        if batches[0] is not None:
            indexed, kh = self.arranged.delta(t, batches[0])  # as the arrangement indexed it
            data = indexed.data.select(list(self.spec.by))
            delta = (data, hash_rows(data, self.spec.by) if kh is None else kh)
        return self._eval.run(t, delta)


# a loop's distinct keeps its records' history in dense rows (records x iterations) while
# they hold at most this many cells each, then in a trace
_DENSE_CELLS = 1 << 21


class _LoopDistinctNode(Node):
    """``distinct`` inside an ``iterate`` over one integer column: each record's history in
    two dense rows of cumulative weights by iteration, no arrangement, no trace lookups.

    The scope's times are ``(e, i)`` and it runs one outer version ``e`` to its fixed point
    before the next, so a record's history is two rows (of its state slot ``s``, in the
    value -> slot map of :class:`_GroupState`): ``now[s, i]``, the input accumulated at
    ``(e_s, i)`` where ``e_s`` is the last version that changed it, and ``before[s, i]``,
    at ``(e_s - 1, i)``. A record first changed in a later version moves ``now`` into
    ``before`` (nothing changed it in between). At ``(e, i)`` the four corners of the
    Moebius sum (:func:`_distinct_change`) are then ``now[s, i]``, ``now[s, i - 1]``,
    ``before[s, i]`` and ``before[s, i - 1]``: two gathers. A record evaluated at ``(e, i)``
    is evaluated again at the next iteration where ``before`` changes (the "interesting
    times" of the module docstring); its inputs of version ``e`` at later iterations arrive
    there by themselves.

    Past :data:`_DENSE_CELLS` cells per row array, or on a null record, the history moves
    into a trace (``before``'s steps at ``(e - 1, i)``, which the reduce's compaction
    frontier makes equivalent to their versions, ``now``'s at ``(e, i)``) and the node
    continues as the general reduce (:class:`_TraceEval`).
    """

    emits_at_input_time = True
    emits_consolidated = True

    def __init__(self, scope: Scope, source: Node) -> None:
        super().__init__(scope, [source], source.schema)
        self.name = source.schema.names[0]
        self.type = source.schema.field(0).type
        self.spec = _Spec((self.name,), (), True, source.schema)
        self.state = _GroupState()
        self.values = np.zeros(0, np.int64)          # per slot: its record
        self.epoch = np.zeros(0, np.int64)           # per slot: e_s (-1: never changed)
        self.now = np.zeros((0, 1), np.int64)        # per slot and iteration, cumulative
        self.before = np.zeros((0, 1), np.int64)
        self._due: dict[Time, list[I64]] = {}        # slots to evaluate again at a time
        self._eval: _TraceEval | None = None         # once the history is in a trace

    def has_work(self, t: Time) -> bool:
        return t in self._pending or t in self._due or (self._eval is not None and t in self._eval.scheduled)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if self._eval is None:
            values = None if b is None else int_key_values(b.data, (self.name,))
            if b is not None and values is None:  # a null record
                self._to_trace(t)
            else:
                return self._dense(t, values, None if b is None else b.diffs)
        assert self._eval is not None
        delta = None
        if b is not None:
            ib = IndexedZSet.build(b.with_time(t), self.spec.by, one_time=True)
            self._eval.trace.insert(ib)
            delta = (ib.batch.data, ib.key_hash)
        return self._eval.run(t, delta)

    def _dense(self, t: Time, values: I64 | None, diffs: I64 | None) -> ZSet | None:
        e, i = t
        due = self._due.pop(t, [])
        if values is not None and diffs is not None:
            slots = self.state._value_slots(values, self.type, self.name)
            if not self._fits(i):
                self._to_trace(t, due)
                return self.process(t, [ZSet(_int_table(self.name, values, self.type), diffs)])
            self.values[slots] = values
            due.append(slots)
        g = due[0] if len(due) == 1 else np.concatenate(due)
        if g.size > 1:  # each record once (sort and mask: np.unique's wrappers cost more here)
            g = np.sort(g)
            g = g[np.concatenate(([True], g[1:] != g[:-1]))]
        stale = g[self.epoch.take(g) != e]
        if stale.size:  # first change in version e: the old "now" is "before" e
            self.before[stale] = self.now[stale]
            self.epoch[stale] = e
        if values is not None and diffs is not None:
            np.add.at(self.now[:, i:], slots, diffs[:, None])  # cumulative: every later iteration
        cols = slice(i - 1, i + 1) if i else slice(0, 1)
        now, before = self.now[g, cols], self.before[g, cols]
        net = (now[:, -1] > 0).astype(np.int64) - (before[:, -1] > 0)
        if i:
            net -= (now[:, 0] > 0).astype(np.int64) - (before[:, 0] > 0)
        if i + 1 < self.before.shape[1]:  # the next iteration where an earlier version changed it
            steps = self.before[g, i:]
            moved = steps[:, 1:] != steps[:, :-1]
            later = moved.any(axis=1)
            if later.any():
                nxt = moved.argmax(axis=1)[later] + (i + 1)
                gl = g[later]
                for j in set(nxt.tolist()):  # a loop per later iteration
                    tt = (e, j)
                    self._due.setdefault(tt, []).append(gl[nxt == j])
                    self.scope.times.add(tt)
        pos = np.flatnonzero(net)
        if pos.size == 0:
            return None
        return ZSet(_int_table(self.name, self.values.take(g.take(pos)), self.type), net.take(pos)).with_time(t)

    def _fits(self, i: int) -> bool:
        """Make room for the slots allocated so far and iteration ``i``; False when that
        would pass :data:`_DENSE_CELLS`."""
        have, w = self.now.shape
        if self.state.size <= have and i < w:
            return True
        rows = have if self.state.size <= have else max(self.state.size, 2 * have, 256)
        width = w if i < w else max(i + 1, 2 * w)
        if rows * width > _DENSE_CELLS:
            return False
        self.values = np.concatenate((self.values, np.zeros(rows - have, np.int64)))
        self.epoch = np.concatenate((self.epoch, np.full(rows - have, -1, np.int64)))
        for name in ("now", "before"):  # cumulative: a new iteration holds the last one's value
            old = getattr(self, name)
            new = np.zeros((rows, width), np.int64)
            new[:have, :w] = old
            new[:have, w:] = old[:, w - 1:w]
            setattr(self, name, new)
        return True

    def _to_trace(self, t: Time, due: list[I64] | None = None) -> None:
        """Move the history (and the records due later) into a trace; the general reduce
        continues from there."""
        e = t[0]
        changed = (self.epoch == e)[:, None]
        # the input accumulated up to version e - 1 (a record not changed in e: all of it),
        # and version e's own changes
        parts = [(np.where(changed, self.before, self.now), e - 1), (np.where(changed, self.now - self.before, 0), e)]
        rows, its, diffs, times = [], [], [], []
        for cum, at in parts:  # the steps of each cumulative row are the updates
            step = np.diff(cum, axis=1, prepend=0)
            r, c = np.nonzero(step)
            if r.size and at >= 0:  # nothing is before version 0
                rows.append(r)
                its.append(c)
                diffs.append(step[r, c])
                times.append(np.full(r.size, at, np.int64))
        trace = Trace(self.schema, self.spec.by, dims=2, policy=SMALL_BATCHES)
        self._eval = _TraceEval(self.scope, trace, self.spec)
        if rows:
            r = np.concatenate(rows)
            tm = np.stack((np.concatenate(times), np.concatenate(its)), axis=1)
            trace.insert(ZSet(_int_table(self.name, self.values.take(r), self.type), np.concatenate(diffs), tm))
        pending = list(self._due.items()) + ([(t, due)] if due else [])
        for tt, slots in pending:  # a loop per time with records due
            keys = _int_table(self.name, self.values.take(np.unique(np.concatenate(slots))), self.type)
            self._eval.scheduled.setdefault(tt, []).append((keys, hash_rows(keys)))
        self._due = {}


class _GroupState:
    """Per-group state slots: exact group hash -> slot in a vectorized hash map, or, for
    groups whose hash is not exact, group values -> slot (hash, then verify)."""

    def __init__(self) -> None:
        self.index = U64Map()  # exact group hashes -> slot
        self.keys: StoredKeyMap | None = None  # other groups: their values -> slot
        self.size = 0
        # one integer group column: value - low -> slot (-1: ask the hash map); slots never
        # move, so the cache is never wrong, at most incomplete
        self._by_value: tuple[int, I64] | None = None

    def _value_slots(self, values: I64, column: pa.DataType, name: str) -> I64:
        """Slots of integer group values (repeats allowed), through the value cache; values
        too far apart for one (a range over 4x the groups) go to the hash map."""
        if values.size == 0:
            return values
        lo, hi = int(values.min()), int(values.max())
        cache = self._by_value
        if cache is None or lo < cache[0] or hi >= cache[0] + cache[1].size:
            low = lo if cache is None else min(lo, cache[0])
            high = hi if cache is None else max(hi, cache[0] + cache[1].size - 1)
            if high - low >= 4 * (self.size + values.size) + 1024:  # too sparse: this range only
                if hi - lo >= 4 * (self.size + values.size) + 1024:  # even the values' own
                    return self.slots(hash_column(pa.array(values, type=pa.int64()).cast(column), name))
                cache, low, high = None, lo, hi
            fresh = np.full(high - low + 1, -1, dtype=np.int64)
            if cache is not None:
                fresh[cache[0] - low: cache[0] - low + cache[1].size] = cache[1]
            cache = self._by_value = (low, fresh)
        off = values - cache[0]
        s = cache[1].take(off)
        miss = np.flatnonzero(s < 0)
        if miss.size:  # first sight of these values here: the hash map (allocating)
            v = pa.array(values.take(miss), type=pa.int64()).cast(column)
            s[miss] = cache[1][off.take(miss)] = self.slots(hash_column(v, name))
        return s

    def slots(self, h: U64) -> I64:
        """Slot per exact hash (repeats allowed), allocating new ones."""
        s = self.index.lookup(h)
        new = np.flatnonzero(s < 0)
        if new.size:
            uh, inv = np.unique(h[new], return_inverse=True)
            fresh = np.arange(self.size, self.size + uh.size, dtype=np.int64)
            self.index.insert(uh, fresh)
            s[new] = fresh[inv.reshape(-1)]
            self.size += uh.size
        return s

    def dense(self, table: pa.Table, by: Sequence[str], only: Callable[[I64, int], I64] | None = None
              ) -> tuple[I64, I64, I64, I64, int] | None:
        """One integer group column over a range not much wider than the batch:
        ``(slots, values, offset, present, width)``, per present value (``present`` offsets
        into the range, ascending) its state slot and the value, and per row its offset into the
        range (so ``bincount(offset, ..., width)[present]`` aggregates per group); only the
        distinct values are hashed, and nothing is sorted. ``only(offset, width)``, when
        given, says which offsets to keep instead of every present one (say, the groups whose
        aggregates changed). ``None`` when the column is not such a column."""
        if len(by) != 1 or table.num_rows < 1024:
            return None
        col = table.column(by[0])
        if not pa.types.is_integer(col.type) or col.null_count:
            return None
        v = np.asarray(col.to_numpy()).astype(np.int64, copy=False)
        lo, hi = int(v.min()), int(v.max())
        if hi - lo >= 4 * v.size:
            return None
        off = v - lo
        width = hi - lo + 1
        present = np.flatnonzero(np.bincount(off, minlength=width)) if only is None else only(off, width)
        values = present + lo
        return self._value_slots(values, col.type, by[0]), values, off, present, width

    def groups(self, table: pa.Table, by: Sequence[str] | None = None) -> tuple[I64, I64, I64]:
        """The groups of ``table``'s rows (by the values of ``by``, all columns by default):
        ``(slots, first, group)``, each group's state slot (allocating new ones), a row of
        it, and each row's index into ``slots`` (see also :meth:`dense`)."""
        names = table.column_names if by is None else list(by)
        h = hash_rows(table, names)
        if exact_hash(table.schema, names):
            return _factorize(self.slots(h), self.size)
        if self.keys is None:
            self.keys = StoredKeyMap(table.schema if by is None else table.select(names).schema)
        slot, _ = self.keys.intern(table if by is None else table.select(names), h, self._new_slots)
        return _factorize(slot, self.size)

    def _new_slots(self, n: int) -> I64:
        out = np.arange(self.size, self.size + n, dtype=np.int64)
        self.size += n
        return out


def _grow(a: npt.NDArray[np.generic], n: int) -> npt.NDArray[np.generic]:
    if a.size >= n:
        return a
    out = np.zeros(max(n, 2 * a.size, 1024), dtype=a.dtype)
    out[:a.size] = a
    return out


def _factorize(row_slot: I64, size: int) -> tuple[I64, I64, I64]:
    """``(slots, first, group)``: the distinct state slots of a batch's rows, a row of each, and each row's index into ``slots``. A mark array over the state when it is
    small next to the batch (no sort), a sort otherwise: the cost follows the batch."""
    n = row_slot.size
    if size <= 4 * n + 1024:
        rep = np.full(size, -1, dtype=np.int64)
        rep[row_slot] = np.arange(n, dtype=np.int64)  # some row of each slot
        slots = np.flatnonzero(rep >= 0)
        dense = np.empty(size, dtype=np.int64)
        dense[slots] = np.arange(slots.size, dtype=np.int64)
        return slots, rep[slots], dense[row_slot]
    slots, first, group = np.unique(row_slot, return_index=True, return_inverse=True)
    return slots, first.astype(np.int64), group.reshape(-1).astype(np.int64)


def _group_sum(group: I64, values: npt.NDArray[Any], m: int) -> npt.NDArray[Any]:
    """Per group, the sum of ``values`` (exact for integers)."""
    if values.dtype.kind == "f":
        return np.bincount(group, weights=values, minlength=m)
    out = np.zeros(m, dtype=np.int64)
    np.add.at(out, group, values)  # exact int64 adds (numpy's unbuffered fast path)
    return out


class _LinearAggNode(Node):
    """Root-scope count/sum: a group's new value is its old value plus the change."""

    emits_at_input_time = True

    def __init__(self, scope: Scope, source: Node, spec: _Spec) -> None:
        super().__init__(scope, [source], spec.schema)
        self.spec = spec
        self.state = _GroupState()
        self.cnt = np.zeros(0, np.int64)
        self.sums = [np.zeros(0, np.float64 if spec.schema.field(n).type == pa.float64() else np.int64)
                     for n, fn, _ in spec.aggs if fn == "sum"]

    def input_demand(self, port: int, need: set[str] | None) -> set[str] | None:
        # count and sum are linear: the groups and summed columns are all they read
        return set(self.spec.by) | {c for _, _, c in self.spec.aggs if c is not None}

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is None:
            return None
        spec = self.spec
        d = b.diffs
        summed: list[Any] = [_values(b.data, c, "sum") for _, fn, c in spec.aggs if fn == "sum" and c is not None]
        weighted = [d * v for v in summed]
        wide: list[Any] = []

        def changed_groups(off: I64, width: int) -> I64:
            # aggregate over the whole range; a group whose aggregates did not change emits nothing
            wide.extend(_group_sum(off, w, width) for w in [d, *weighted])
            nz = wide[0] != 0
            for w in wide[1:]:
                nz |= w != 0
            return np.flatnonzero(nz)

        found = self.state.dense(b.data, spec.by, changed_groups)
        if found is not None:
            slot, values, _, present, _ = found
            dcnt, *dsums = [w[present] for w in wide]
            key_type = spec.schema.field(spec.by[0]).type
            keys = _IntKeys(spec.by[0], values, key_type)
        else:
            slot, first, group = self.state.groups(b.data, spec.by)
            keys = b.data.select(list(spec.by)).take(first)
            dcnt = _group_sum(group, d, slot.size)
            dsums = [_group_sum(group, w, slot.size) for w in weighted]
        n = self.state.size
        self.cnt = _grow(self.cnt, n)  # type: ignore[assignment]
        self.sums = [_grow(s, n) for s in self.sums]  # type: ignore[misc]
        old_cnt = self.cnt[slot]
        new_cnt = old_cnt + dcnt
        olds: list[Any] = [s[slot] for s in self.sums]
        news = [o + ds for o, ds in zip(olds, dsums, strict=True)]
        changed = dcnt != 0
        for o, nw in zip(olds, news, strict=True):
            changed |= o != nw
        retract = np.flatnonzero(changed & (old_cnt != 0))
        insert = np.flatnonzero(changed & (new_cnt != 0))
        self.cnt[slot] = new_cnt
        for s, nw in zip(self.sums, news, strict=True):
            s[slot] = nw
        if retract.size + insert.size == 0:
            return None
        # the retractions (old values) then the insertions (new values), one table
        sel = np.concatenate((retract, insert))
        cols = list(keys.take(sel).columns)  # the groups' key columns
        it = iter(zip(olds, news, strict=True))
        for _, fn, _ in spec.aggs:  # a loop per aggregate
            old, new = (old_cnt, new_cnt) if fn == "count" else next(it)
            cols.append(pa.array(np.concatenate((old[retract], new[insert]))))
        diffs = np.concatenate((np.full(retract.size, -1, np.int64), np.ones(insert.size, np.int64)))
        return ZSet(pa.Table.from_arrays(cols, schema=spec.schema), diffs, np.full((sel.size, len(t)), t, np.int64))


class _DistinctNode(Node):
    """Root-scope distinct: each record's accumulated weight, in a hash map."""

    emits_at_input_time = True

    def __init__(self, scope: Scope, source: Node) -> None:
        super().__init__(scope, [source], source.schema)
        self.state = _GroupState()
        self.weight = np.zeros(0, np.int64)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is None:
            return None
        slot, first, group = self.state.groups(b.data)
        dw = _group_sum(group, b.diffs, slot.size)
        self.weight = _grow(self.weight, self.state.size)  # type: ignore[assignment]
        old = self.weight[slot]
        new = old + dw
        self.weight[slot] = new
        up = (old <= 0) & (new > 0)
        down = (old > 0) & (new <= 0)
        sel = np.flatnonzero(up | down)
        if sel.size == 0:
            return None
        return ZSet(b.data.take(first[sel]), np.where(up[sel], 1, -1).astype(np.int64)).with_time(t)


def reduce(coll: Collection, by: tuple[str, ...], aggs: Mapping[str, Agg]) -> Collection:
    """The reduce operator (see the module docstring)."""
    spec = _make_spec(coll.schema, by, aggs)
    if spec.linear and not coll.scope.nested:
        return Collection(_LinearAggNode(coll.scope, coll.node, spec))
    return Collection(_ReduceNode(coll.scope, arrange(coll.node, by).node, spec))


def distinct(coll: Collection) -> Collection:
    """The distinct operator (see the module docstring)."""
    if not coll.scope.nested:
        return Collection(_DistinctNode(coll.scope, coll.node))
    names = tuple(coll.schema.names)
    typ = coll.schema.field(0).type
    if len(names) == 1 and coll.scope.dims == 2 and pa.types.is_integer(typ) and not pa.types.is_uint64(typ):
        return Collection(_LoopDistinctNode(coll.scope, coll.node))
    spec = _Spec(names, (), True, coll.schema)
    return Collection(_ReduceNode(coll.scope, arrange(coll.node, names).node, spec))


def distinct_trace(batch: ZSet, trace: Trace, time: VersionLike | None = None) -> ZSet:
    """The change of ``distinct`` at ``time`` when ``batch`` arrives there, given the
    ``trace`` of earlier updates (seed 003's Distinct Trace; untimed result).

    ``time`` defaults to the batch's (single) time. Seed 003's untimed form, ``distinct``
    of ``trace + batch`` minus ``distinct`` of ``trace``, is this with ``time`` after every
    time of the trace.
    """
    if batch.times is None and time is None:
        raise InputError("distinct_trace needs a time: give the batch times or pass time=")
    at = as_version(time) if time is not None else Version(tuple(int(c) for c in batch.times[0]))  # type: ignore[index]
    b = batch.with_time(at)
    names = tuple(trace.schema.names)
    tmp = Trace(trace.schema, names, dims=len(at))
    tmp.insert(trace.to_zset())
    tmp.insert(b)
    # the batch's records, and the trace's: one of those can change at ``time`` without new
    # input there (seed 002's couch), and the corners give 0 for the others
    keys = _distinct_rows(pa.concat_tables([b.data, tmp.to_zset().data]))
    found = tmp.lookup(keys)
    out = _distinct_change(keys, found.probe, found.diffs, found.times, at.coords)
    return ZSet.empty(trace.schema) if out is None else out
