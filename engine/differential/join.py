"""Joins: arrangements (``index_with``), ``join_stream``/``join_trace`` on batches, and the
delta join operator of the dataflow (seed 002 v1/v5, seed 003's Join Stream/Join Trace).

The join of two collections is bilinear, so its change at a time is the change of each
side joined with the other side's history: with ``B_new`` the right trace *including* this
time's delta ``dB`` and ``A_old`` the left trace as it was *before* ``dA`` was inserted
(the arrangement keeps that snapshot of its spine for the consumers that run right after it),

    d(A join B) = dA join B_new + A_old join dB

and each pair of updates ``(a, ta, wa)``, ``(b, tb, wb)`` with at least one of them at this
time contributes ``(a ++ b, ta.join(tb), wa * wb)`` exactly once. The traces are probed by
key for the delta rows only (see :meth:`engine.differential.trace.Trace.lookup`), with the
deltas as the arrangements indexed them (key hashes computed once, probes in key order),
so a step costs the size of the change and of the matches it finds. In the root scope every
update of history is at or before the current step, so every pair is at the current step
and the traces' times are not read. An arrangement (:func:`arrange`) is shared: every join (and
reduce) on the same collection and keys reads one trace, each through its own
:class:`~engine.differential.trace.TraceReader`, which lets the trace compact history up to
the current outer version (a time's join with any later time is unchanged by that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import numeric_view
from engine.differential.dataflow import Collection, Node, Scope, Time
from engine.differential.indexed import IndexedZSet
from engine.differential.trace import SMALL_BATCHES, MergePolicy, Trace, TraceReader
from engine.differential.zset import ZSet, concat, identity_prefix, take_rows
from engine.errors import InputError, SchemaError

__all__ = ["ArrangeNode", "Arranged", "join_stream", "join_trace"]


class ArrangeNode(Node):
    """Inserts each batch into a trace keyed by ``keys`` and passes it on.

    The arrangement of :func:`arrange`, shared by every join and reduce on its node and
    keys: each reads the trace through its own :meth:`reader`, and a consumer running at
    ``t`` right after it reads the trace without ``t``'s delta from :meth:`before`, with it
    from :meth:`current`, and the delta as indexed from :meth:`delta`.

    Inside a loop, an arrangement read by joins only is read when the *other* side changes,
    which may be rarer than its own rounds (a loop variable joined with edges that change
    once a step): its batches wait, unindexed, until a join reads the trace, then go in as
    one batch (one indexing and one insert for several rounds, and a shorter spine).
    """

    emits_at_input_time = True

    def __init__(self, scope: Scope, source: Node, keys: tuple[str, ...]) -> None:
        missing = [k for k in keys if k not in source.schema.names]
        if not keys or missing:
            raise SchemaError(f"index_with: key column(s) {missing or list(keys)} not in "
                              f"{source.schema.names}")
        super().__init__(scope, [source], source.schema)
        self.keys = keys
        # in a loop, batches come per round and hold a few rows each
        self.trace = Trace(source.schema, keys, dims=scope.dims,
                           policy=SMALL_BATCHES if scope.nested else MergePolicy())
        self._hold = self.trace.reader()  # released once the consumers hold their own
        self._before: tuple[Time, tuple[IndexedZSet, ...]] | None = None
        self._indexed: tuple[Time, IndexedZSet] | None = None
        self._columns: list[str] | None = None  # the stored columns, when pruned
        self._lazy = False  # batches wait in _waiting until a consumer reads the trace
        self._waiting: list[tuple[Time, ZSet]] = []

    def input_demand(self, port: int, need: set[str] | None) -> set[str] | None:
        return None if need is None else need | set(self.keys)

    def restrict(self, need: set[str]) -> None:
        cols = [n for n in self.schema.names if n in need or n in self.keys]
        if len(cols) < len(self.schema):
            self.schema = pa.schema([self.schema.field(n) for n in cols])
            self.trace.project(cols)
            self._columns = cols

    def reader(self) -> TraceReader:
        return self.trace.reader()

    def finalize(self) -> None:
        self._hold.close()
        self._lazy = self.scope.nested and all(isinstance(c, _JoinNode) for c, _ in self.consumers)

    def before(self, t: Time) -> tuple[IndexedZSet, ...]:
        """The trace's batches as they were before this node inserted its input at ``t``
        (its consumers run at ``t`` right after it: the collection without ``t``'s delta)."""
        if self._waiting:
            self._insert_waiting(but=t)
        if self._before is not None and self._before[0] == t:
            return self._before[1]
        return self.trace.batches

    def current(self, t: Time) -> Trace:
        """The trace with every batch this node has had, ``t``'s delta included (inserted by
        itself, after a snapshot for :meth:`before`: a self-join reads both)."""
        if self._waiting:
            self._insert_waiting(but=t)
        if self._waiting:
            (_, b), = self._waiting
            self._waiting = []
            self._before = (t, self.trace.batches)
            self.trace.insert(IndexedZSet.build(b, self.keys, one_time=True))
        return self.trace

    def _insert_waiting(self, but: Time) -> None:
        """Index and insert the waiting batches as one, but the one at ``but`` (the last)."""
        keep = self._waiting[-1:] if self._waiting[-1][0] == but else []
        go = self._waiting[:len(self._waiting) - len(keep)]
        self._waiting = keep
        if go:
            z = concat(*(b for _, b in go))
            self.trace.insert(IndexedZSet.build(z, self.keys, one_time=len(go) == 1))

    def delta(self, t: Time, batch: ZSet) -> tuple[ZSet, npt.NDArray[np.uint64] | None]:
        """``batch`` (this node's input at ``t``) as indexed for the trace, with its key
        hashes: the same updates, sorted by key, which probes other traces in key order."""
        if self._indexed is not None and self._indexed[0] == t:
            ib = self._indexed[1]
            return ib.batch, ib.key_hash
        return batch, None

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is not None:
            if self._columns is not None:
                b = ZSet(b.data.select(self._columns), b.diffs, b.times)
            if self._lazy:  # a node's input at t is all at t
                self._waiting.append((t, b))
                return b
            self._before = (t, self.trace.batches)
            ib = IndexedZSet.build(b, self.keys, one_time=True)  # a node's input at t is all at t
            self._indexed = (t, ib)
            self.trace.insert(ib)
        return b


@dataclass(frozen=True)
class Arranged:
    """A collection indexed by key columns (seed 003's Indexed Z-Set over time).

    Made by :meth:`Collection.index_with`; join it with :meth:`Collection.join`.
    """

    node: ArrangeNode

    @property
    def keys(self) -> tuple[str, ...]:
        return self.node.keys

    @property
    def collection(self) -> Collection:
        return Collection(self.node)


def arrange(node: Node, keys: tuple[str, ...]) -> Arranged:
    """The (shared) arrangement of ``node``'s output by ``keys``."""
    found = node.arrangements.get(keys)
    if found is None:
        found = node.arrangements[keys] = ArrangeNode(node.scope, node, keys)
    return Arranged(found)


def _output_schema(left: pa.Schema, right: pa.Schema, on: tuple[str, ...]) -> pa.Schema:
    missing = [k for k in on if k not in left.names or k not in right.names]
    if not on or missing:
        raise SchemaError(f"join: key column(s) {missing or list(on)} must be in both sides "
                          f"({left.names} and {right.names}); rename them first")
    for k in on:
        if left.field(k).type != right.field(k).type:
            raise SchemaError(f"join: key column {k!r} is {left.field(k).type} on the left and "
                              f"{right.field(k).type} on the right; cast one side first")
    clash = [n for n in right.names if n not in on and n in left.names]
    if clash:
        raise SchemaError(f"join: column(s) {clash} are on both sides but not join keys; rename "
                          f"them on one side first")
    return pa.schema(list(left) + [f for f in right if f.name not in on])


def _pairs(batch: ZSet, trace: Trace, on: tuple[str, ...], names: Sequence[str], *,
           at: Time | None = None, batches: Sequence[IndexedZSet] | None = None,
           key_hash: npt.NDArray[np.uint64] | None = None, labels: Sequence[str] | None = None) -> ZSet | None:
    """``batch`` joined with every update in ``trace``: the output columns ``names`` (the
    key columns and ``batch``'s others from the batch, the trace's others from the trace),
    named ``labels`` when given.

    ``batches`` reads a snapshot of the trace's spine instead of the current one. ``at``
    says every row of ``batch`` is at that time and every update of the trace at or
    before it (a totally ordered scope), so every pair is at ``at``.
    """
    found = trace.lookup(batch.data.select(list(on)), batches=batches, key_hash=key_hash)
    if len(found) == 0:
        return None
    rows = found.probe
    n = batch.num_rows
    same_order = rows.size == n and bool(np.all(rows[1:] > rows[:-1]))  # each row once, in order
    want = set(names)
    mine = batch.data.select([c for c in batch.data.column_names if c in want])
    diffs = batch.diffs
    if not same_order:  # the first trace batch's entries often start with every probe in order
        k = identity_prefix(rows, min(found.first_count, n))
        if mine.num_columns:  # none when only the trace's columns are read downstream
            mine = take_rows(mine, rows, k)
        diffs = np.concatenate((diffs[:k], diffs.take(rows[k:]))) if k else diffs.take(rows)
    theirs = found.records(columns=[c for c in trace.schema.names if c not in on and c in want])
    diffs = diffs * found.diffs
    times = None
    if at is not None:
        times = np.full((rows.size, len(at)), at, dtype=np.int64)
    elif batch.times is not None:
        times = np.maximum(batch.times[rows], found.times)  # the lattice join of versions
    cols = dict(zip(mine.column_names, mine.columns, strict=True))
    cols.update(zip(theirs.column_names, theirs.columns, strict=True))
    return ZSet(pa.Table.from_arrays([cols[c] for c in names], names=list(labels or names)), diffs, times)


def _conform(out: ZSet, schema: pa.Schema) -> ZSet:
    if out.data.schema.equals(schema):
        return out
    return ZSet(out.data.cast(schema), out.diffs, out.times)


def _union(parts: list[ZSet], schema: pa.Schema) -> ZSet:
    """The two sides' pairs as one batch of ``schema``: numeric columns as one numpy
    array each (readers downstream get one chunk), the others concatenated by Arrow."""
    cols: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:  # a loop per column
        got = [p.data.column(field.name) for p in parts]
        views = [numeric_view(c) for c in got]
        if all(v is not None for v in views) and all(c.type == field.type for c in got):
            cols.append(pa.array(np.concatenate(views), type=field.type))  # type: ignore[arg-type]
        else:
            cols.append(pa.chunked_array([ch for c in got for ch in c.cast(field.type).chunks], type=field.type))
    times = None
    if parts[0].times is not None:
        times = np.concatenate([p.times for p in parts if p.times is not None])
    return ZSet(pa.Table.from_arrays(cols, schema=schema), np.concatenate([p.diffs for p in parts]), times)


def join_trace(batch: ZSet, trace: Trace, on: Sequence[str] | None = None) -> ZSet:
    """``batch`` joined with every update of ``trace`` (seed 003's Join Trace).

    Output records are ``batch``'s columns then the trace's non-key columns; weights
    multiply and times join (coordinate-wise max).

    Parameters
    ----------
    batch
        The updates of this time (timed with the trace's dimension).
    trace
        The other side's history.
    on
        The key columns (the trace's keys by default).
    """
    keys = tuple(on) if on is not None else trace.keys
    schema = _output_schema(batch.schema, trace.schema, keys)
    out = _pairs(batch, trace, keys, schema.names)
    return _conform(out, schema) if out is not None else ZSet.empty(schema, batch.dims)


def join_stream(a: ZSet, b: ZSet, on: Sequence[str]) -> ZSet:
    """Every pair of updates of ``a`` and ``b`` with equal ``on`` columns (seed 003's Join
    Stream): ``a``'s columns then ``b``'s others, weights multiplied, times joined."""
    keys = tuple(on)
    dims = a.dims or 1
    tr = Trace(b.schema, keys, dims=dims)
    bb = b if b.times is not None else b.with_time((0,) * dims)
    tr.insert(bb)
    out = join_trace(a if a.times is not None else a.with_time((0,) * dims), tr, keys)
    return out if a.times is not None else out.without_times()


class _JoinNode(Node):
    n_inputs = 2

    @property
    def emits_at_input_time(self) -> bool:  # type: ignore[override]
        return not self.scope.nested  # root scope: history is all before t, pairs are at t

    def __init__(self, scope: Scope, left: ArrangeNode, right: ArrangeNode,
                 on: tuple[str, ...]) -> None:
        super().__init__(scope, [left, right], _output_schema(left.schema, right.schema, on))
        self.on = on
        self.left, self.right = left, right
        self._readers = (left.reader(), right.reader())
        self._columns: list[str] | None = None  # the pairs' columns behind the output's, when renamed

    def input_demand(self, port: int, need: set[str] | None) -> set[str] | None:
        if need is None:
            return None
        side = (self.left if port == 0 else self.right).schema.names
        return set(self.on) | {c for c in side if c in need}

    def restrict(self, need: set[str]) -> None:
        # keep a column even when none is read (a count of pairs): a table of no columns has no rows
        keep = [f for f in self.schema if f.name in need] or [self.schema.field(self.on[0])]
        self.schema = pa.schema(keep)

    def rename_output(self, renames: list[tuple[str, str]], schema: pa.Schema) -> bool:
        if any(c not in self.schema.names for _, c in renames):
            return False
        self._columns = [c for _, c in renames]
        self.schema = schema
        return True

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        since = self.scope.join_since(t)
        for r in self._readers:
            if r.since != since:
                r.set_logical_compaction(since)
        # d(A join B) = dA join B_new + A_old join dB: every pair of updates with at least
        # one of them at t, once. B_new is the right trace now (its arrangement ran
        # first); A_old the left trace as it was before its arrangement inserted dA.
        at = None if self.scope.nested else t  # root scope: history is all before t
        dl, dr = batches
        labels = self.schema.names
        names = labels if self._columns is None else self._columns
        parts = []
        if dl is not None:
            dl, kh = self.left.delta(t, dl)
            p = _pairs(dl, self.right.current(t), self.on, names, at=at, key_hash=kh, labels=labels)
            if p is not None:
                parts.append(p)
        if dr is not None:
            dr, kh = self.right.delta(t, dr)
            old = self.left.before(t)  # the left trace's object, read through this snapshot
            p = _pairs(dr, self.left.trace, self.on, names, at=at, batches=old, key_hash=kh, labels=labels)
            if p is not None:
                parts.append(p)
        if not parts:
            return None
        if len(parts) == 1:
            return _conform(parts[0], self.schema)
        return _union(parts, self.schema)


def join(left: Collection, right: Collection | Arranged, on: tuple[str, ...]) -> Collection:
    """The delta join of two collections on ``on`` (see the module docstring)."""
    scope = left.scope
    if isinstance(right, Arranged):
        if right.keys != on:
            raise InputError(f"join on {list(on)} with a collection arranged by {list(right.keys)}; "
                             f"arrange it by the join keys")
        rnode: Node = right.node.inputs[0]
        if rnode.scope is not scope:
            rnode = left._local(Collection(rnode))
    else:
        rnode = left._local(right)
    _output_schema(left.schema, rnode.schema, on)
    la = arrange(left.node, on).node
    ra = arrange(rnode, on).node
    return Collection(_JoinNode(scope, la, ra, on))
