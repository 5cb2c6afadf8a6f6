"""Dataflow graphs over Z-set batches: inputs with frontiers, operators, probes, and the
scheduler that runs them one closed version at a time (seed 002, v2-v5).

A :class:`Dataflow` holds nodes in *scopes*. The root scope's versions are ``(step,)``
(one coordinate, totally ordered); an ``iterate`` opens a nested scope whose versions are
``(step, iteration)`` under the product partial order (seed 002 v5). Every edge carries
batches of ``(record, time, diff)`` (:class:`~engine.differential.zset.ZSet`: an Arrow
table of records, int64 weights, an ``(n, d)`` int64 time array).

Scheduling. A scope keeps the set of times at which some node has pending input (or has
asked to run, as a reduce re-evaluating keys at a later iteration does). It repeatedly
takes the least pending time ``t`` in lexicographic order (a linear extension of the
product order) and visits its nodes in creation order (a topological order: a node is
created after its inputs), handing each node *all* of its input at ``t`` at once.
Operators only ever emit at times ``>= t`` (a join with history at a later iteration emits
at that later iteration), so when ``t`` is processed every update at a time ``<= t`` has
already been delivered: each node sees each of its times complete, once. The root scope
processes the times that the inputs' frontiers have closed; an iterate node runs its inner
scope for one outer version until no time is pending (the fixed point).

Frontiers. An :class:`InputHandle` accepts data only at versions at or beyond its frontier
(an :class:`~engine.differential.version.Antichain`), and :meth:`InputHandle.advance_to`
only moves it forward. :meth:`Dataflow.step` processes every version the inputs closed; a
:class:`Probe` then reports the same frontier (everything before it is final).

Columns. Before the first step the graph is pruned by demand: an arrangement stores, and a
join emits, only the columns some operator downstream reads (a root count/sum reads its
group and summed columns; operators that may depend on every column, such as distinct,
min/max, linear maps and probes, read them all). A join is bilinear and a projection
linear, so the collections downstream are exactly the same.

Linear operators (``map``, ``filter``, ``flat_map``, ``explode``, ``join_function``,
``temporal_filter``, ``negate``) are fused: applying one to the output of another builds
one :class:`~engine.differential.linear.LinearOperator` chain run in one pass, and a node
nobody reads (the unfused intermediate) is dropped when the graph is finalized, at the
first step. The graph must be complete by then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine.differential.handles import InputHandle, Probe
from engine.differential.linear import Expansion, IntSpec, LinearOperator, MaskFn, TableFn
from engine.differential.version import Antichain, Version
from engine.differential.zset import ZSet, concat, split_by_time
from engine.errors import InputError, SchemaError

if TYPE_CHECKING:
    from engine.differential.join import Arranged
    from engine.differential.reduce import Agg

__all__ = ["Collection", "Dataflow", "InputHandle", "InputNode", "Node", "Probe", "ProbeNode", "Scope"]

Time: TypeAlias = tuple[int, ...]
I64 = npt.NDArray[np.int64]


def extend_times(batch: ZSet, coord: int) -> ZSet:
    """Enter a nested scope: append a coordinate to every time."""
    assert batch.times is not None
    extra = np.full((batch.num_rows, 1), coord, dtype=np.int64)
    return ZSet(batch.data, batch.diffs, np.hstack((batch.times, extra)))


class Scope:
    """Nodes sharing one version type, and the times at which some node has work.

    Versions here have ``dims`` coordinates: the root scope's are ``(step,)``, an
    iterate's inner scope (whose ``parent`` is the scope around the loop) adds the
    iteration. A node that has input, or wants to run, at a time adds it to :attr:`times`;
    :meth:`run` processes them least first, visiting :attr:`nodes` in creation order (the
    scheduling contract is in the module docstring). :meth:`wire` makes it runnable.
    """

    def __init__(self, dataflow: Dataflow, parent: Scope | None, dims: int) -> None:
        self.dataflow = dataflow
        self.parent = parent
        self.dims = dims
        self.nodes: list[Node] = []
        self.times: set[Time] = set()
        self.rounds = 0
        self._since_memo: dict[Time, Antichain] = {}
        self.entered: dict[int, tuple[Node, Node]] = {}   # outer node id -> (outer, inner)

    @property
    def nested(self) -> bool:
        return self.parent is not None

    def join_since(self, t: Time) -> Antichain:
        """How far a join's traces may compact while ``t`` is processed: lub with any later
        time is unchanged by advancing history to the current outer version."""
        v = t[:-1] + (0,) if self.nested else t
        return self._since(v)

    def reduce_since(self, t: Time) -> Antichain:
        """How far a reduce's trace may compact at ``t``: it must still tell the previous
        outer version (``t[0] - 1``) from the current one."""
        return self._since((max(t[0] - 1, 0),) + (0,) * (self.dims - 1))

    def _since(self, v: Time) -> Antichain:
        """``Antichain([v])``, built once per outer version (every operator asks every round)."""
        found = self._since_memo.get(v)
        if found is None:
            if len(self._since_memo) >= 8:  # older versions are not asked about again
                self._since_memo.clear()
            found = self._since_memo[v] = Antichain([v])
        return found

    def run(self, limit: int | None = None, max_rounds: int | None = None) -> None:
        """Process pending times in order (root: those whose outer version is < ``limit``)."""
        while True:
            ready = self.times if limit is None else {t for t in self.times if t[0] < limit}
            if not ready:
                return
            t = min(ready)
            self.rounds += 1
            if max_rounds is not None and self.rounds > max_rounds:
                raise InputError(
                    f"iterate did not reach a fixed point in {max_rounds} rounds (at {t}); "
                    f"make sure the body consolidates (distinct/reduce/consolidate) and converges"
                )
            for node in self.nodes:  # a loop per operator per time
                if node.has_work(t):
                    node.step(t)
            self.times.discard(t)

    def wire(self) -> None:
        """Make the scope runnable, once its graph is complete: keep the nodes some sink
        depends on, connect each to its consumers, narrow the nodes to the columns read
        downstream (:func:`_prune`), let nodes absorb a ``map`` of column names after them
        (:func:`_absorb_renames`) and :meth:`~Node.finalize` each node."""
        live: set[int] = set()
        stack = [n for n in self.nodes if n.is_sink]
        while stack:
            n = stack.pop()
            if id(n) in live:
                continue
            live.add(id(n))
            stack.extend(n.inputs)
        self.nodes = [n for n in self.nodes if id(n) in live]
        for n in self.nodes:
            for port, i in enumerate(n.inputs):
                i.consumers.append((n, port))
        _prune(self)
        _absorb_renames(self)
        for n in self.nodes:
            n.finalize()


class Node:
    """One operator of a scope: ``process(t, batches)`` sees all of its input at ``t`` at once.

    What an operator (a subclass, in this module or in :mod:`.join`, :mod:`.reduce`,
    :mod:`.iterate`) implements and may rely on:

    * build it before the dataflow's first step, from inputs in the same scope; it joins
      the scope's :attr:`~Scope.nodes` after them (creation order is topological);
    * :meth:`process` gets one entry per input port (``None``: no input at ``t``) and
      returns its output change, at times ``>= t`` (all at ``t`` when the class sets
      ``emits_at_input_time``); :meth:`emit` hands it to the consumers;
    * class attributes: ``n_inputs`` (ports), ``is_sink`` (kept without consumers, such as
      probes), ``emits_consolidated`` (its output at a time is one consolidated batch); a node that runs at times with no input (a reduce re-evaluating groups)
      overrides :meth:`has_work` and adds those times to ``scope.times``;
    * hooks called once, when the scope is wired: :meth:`input_demand` and
      :meth:`restrict` (columns read downstream), then :meth:`finalize`.

    ``arrangements`` holds the shared arrangements of this node's output by key columns
    (:func:`engine.differential.join.arrange`), so every join and reduce on the same keys
    reads one trace.
    """

    n_inputs = 1
    is_sink = False
    scope: Scope

    def __init__(self, scope: Scope, inputs: Sequence[Node], schema: pa.Schema) -> None:
        if scope.dataflow._finalized:
            raise InputError("the dataflow already ran: build every operator before the first step")
        for i in inputs:
            if i.scope is not scope:
                raise InputError("operator inputs must be in the operator's scope (enter them first)")
        self.scope = scope
        self.inputs = list(inputs)
        self.schema = schema
        self.consumers: list[tuple[Node, int]] = []
        self._pending: dict[Time, list[list[ZSet]]] = {}
        self.arrangements: dict[tuple[str, ...], Any] = {}
        scope.nodes.append(self)

    def push(self, port: int, t: Time, batch: ZSet) -> None:
        if batch.num_rows == 0:
            return
        slot = self._pending.get(t)
        if slot is None:
            slot = self._pending[t] = [[] for _ in range(max(self.n_inputs, 1))]
        slot[port].append(batch)
        self.scope.times.add(t)

    def has_work(self, t: Time) -> bool:
        return t in self._pending

    def step(self, t: Time) -> None:
        parts = self._pending.pop(t, None)
        batches: list[ZSet | None] = [None] * max(self.n_inputs, 1) if parts is None else \
            [concat(*p) if p else None for p in parts]
        out = self.process(t, batches)
        if out is not None and out.num_rows:
            self.emit(out, t if self.emits_at_input_time else None)

    # every output row is at the time being processed (no split by time needed)
    emits_at_input_time = False
    # each batch this node emits is consolidated (one row per (record, time), no zero
    # weights) and it emits at most once per time, so a consumer need not consolidate it
    emits_consolidated = False

    def emit(self, out: ZSet, t: Time | None = None) -> None:
        """Hand ``out`` to the consumers, by time (all at ``t`` when given)."""
        for tt, b in [(t, out)] if t is not None else split_by_time(out):  # a loop per output time
            for node, port in self.consumers:
                node.push(port, tt, b)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        raise NotImplementedError

    def finalize(self) -> None:
        """Called once, after consumers are wired (nested scopes wire theirs here)."""

    def input_demand(self, port: int, need: set[str] | None) -> set[str] | None:
        """The columns of input ``port`` this node reads when its consumers read ``need`` of
        its own output (``None``: every column). The default reads them all."""
        return None

    def restrict(self, need: set[str]) -> None:
        """Produce only the columns ``need`` (at least) from now on: a node that can narrows
        its output schema; the default keeps it. Called once, before the first step."""

    def rename_output(self, renames: list[tuple[str, str]], schema: pa.Schema) -> bool:
        """Emit ``schema`` from now on: per ``(name, column)`` of ``renames``, the column
        ``column`` of the current output named ``name`` (the ``map`` of column names that
        was this node's only consumer). True when the node can; the default cannot. Called
        once, after :meth:`restrict`."""
        return False


class InputNode(Node):
    """Where an :class:`InputHandle` pushes its batches: passes them on as they are."""

    n_inputs = 1
    emits_at_input_time = True

    def __init__(self, scope: Scope, schema: pa.Schema) -> None:
        super().__init__(scope, [], schema)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        return batches[0]


class _LinearNode(Node):
    def __init__(self, scope: Scope, source: Node, op: LinearOperator) -> None:
        probe = op(ZSet.empty(source.schema, scope.dims))
        super().__init__(scope, [source], probe.schema)
        self.op = op
        self.emits_at_input_time = op.keeps_times

    def input_demand(self, port: int, need: set[str] | None) -> set[str] | None:
        return self.op.reads  # a chain that starts by picking columns reads those only

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        return None if b is None else self.op(b)


class _ConcatNode(Node):
    emits_at_input_time = True

    def __init__(self, scope: Scope, inputs: Sequence[Node]) -> None:
        schema = inputs[0].schema
        for i in inputs[1:]:
            if i.schema.names != schema.names or i.schema.types != schema.types:
                raise SchemaError(f"concat: collections have different columns: {schema} vs {i.schema}")
        super().__init__(scope, inputs, schema)
        self.n_inputs = len(inputs)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        parts = [b for b in batches if b is not None]
        return concat(*parts) if parts else None


class _ConsolidateNode(Node):
    emits_at_input_time = True

    def __init__(self, scope: Scope, source: Node) -> None:
        super().__init__(scope, [source], source.schema)

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        return None if b is None else b.consolidate()


class _InspectNode(Node):
    emits_at_input_time = True

    def __init__(self, scope: Scope, source: Node, fn: Callable[[Version, ZSet], None]) -> None:
        super().__init__(scope, [source], source.schema)
        self.fn = fn

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is not None:
            self.fn(Version(t), b)
        return b


class ProbeNode(Node):
    """The sink behind a :class:`Probe`: keeps every batch (``batches``) and those not yet
    drained (``new``)."""

    is_sink = True

    def __init__(self, scope: Scope, source: Node) -> None:
        super().__init__(scope, [source], source.schema)
        self.batches: list[ZSet] = []
        self.new: list[ZSet] = []

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is not None:
            self.batches.append(b)
            self.new.append(b)
        return None


class Dataflow:
    """A graph of differential operators over collections (seed 002), run by :meth:`step`.

    Build it with :meth:`input` and the :class:`Collection` methods, attach probes, then
    send data, advance the inputs' frontiers and call :meth:`step`.
    """

    def __init__(self) -> None:
        self.root = Scope(self, None, 1)
        self.inputs: list[InputHandle] = []
        self._finalized = False
        self.frontier = Antichain([Version(0)])
        self.bridges: list[Any] = []   # table bridges (engine.differential.bridge)

    def input(self, schema: pa.Schema) -> tuple[Collection, InputHandle]:
        """A new input: the collection it feeds and the handle to send to it."""
        if not isinstance(schema, pa.Schema) or len(schema) == 0:
            raise SchemaError("a dataflow input needs a pyarrow schema with at least one column")
        node = InputNode(self.root, schema)
        handle = InputHandle(node)
        self.inputs.append(handle)
        return Collection(node), handle

    def _finalize(self) -> None:
        if self._finalized:
            return
        self.root.wire()
        self._finalized = True

    def step(self) -> None:
        """Process every version the inputs' frontiers have closed."""
        self._finalize()
        f = Antichain()
        for h in self.inputs:
            f = f.meet(h.frontier)
        self.root.run(limit=f.elements[0][0] if f else None)
        self.frontier = f


def _absorb_renames(scope: Scope) -> None:
    """A node whose only consumer is a ``map`` of column names (picking and renaming
    columns) names its output itself when it can (:meth:`Node.rename_output`), and the map
    leaves the graph: one node, one batch and one hand-off less per time (a join followed
    by ``map({"node": "dst"})``, as in a reachability loop)."""
    for n in list(scope.nodes):  # a loop per operator, once
        if len(n.consumers) != 1:
            continue
        c, _ = n.consumers[0]
        renames = c.op.renames if isinstance(c, _LinearNode) else None
        if renames is None or not n.rename_output(renames, c.schema):
            continue
        n.consumers = c.consumers
        for d, port in c.consumers:
            d.inputs[port] = n
        scope.nodes.remove(c)


def _prune(scope: Scope) -> None:
    """Demand analysis: from the sinks back, the columns each node's consumers read; nodes
    that can (arrangements, joins) then drop the others, so a trace stores and a join
    gathers only what some operator downstream uses. Creation order is topological, so
    every consumer's demand is known before its input's."""
    demand: dict[int, set[str] | None] = {}
    for n in reversed(scope.nodes):  # a loop per operator, once
        need: set[str] | None = set() if n.consumers and not n.is_sink else None
        for c, port in n.consumers:
            d = c.input_demand(port, demand[id(c)])
            if d is None or need is None:
                need = None
                break
            need |= d
        demand[id(n)] = need
        if need is not None and not set(n.schema.names) <= need:
            n.restrict(need)


class Collection:
    """A changing multiset of records: the output of one dataflow node.

    Methods build new operators and return their collections; nothing runs until
    :meth:`Dataflow.step`. Records are compared by value (null equals null, NaN equals
    NaN). Despite the names, collections are unordered.
    """

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def scope(self) -> Scope:
        return self.node.scope

    @property
    def dataflow(self) -> Dataflow:
        return self.node.scope.dataflow

    @property
    def schema(self) -> pa.Schema:
        return self.node.schema

    def __repr__(self) -> str:
        return f"Collection({type(self.node).__name__.lstrip('_')}, columns={self.schema.names})"

    def _local(self, other: Collection) -> Node:
        """``other``'s node in this collection's scope (entering it into an iterate)."""
        if other.dataflow is not self.dataflow:
            raise InputError("collections of different dataflows cannot be combined")
        if other.scope is self.scope:
            return other.node
        from engine.differential.iterate import enter

        return enter(other.node, self.scope)

    # linear ---------------------------------------------------------------------------
    def _linear(self, op: LinearOperator) -> Collection:
        node = self.node
        if isinstance(node, _LinearNode):  # fuse into the upstream chain
            return Collection(_LinearNode(self.scope, node.inputs[0], node.op.followed_by(op)))
        return Collection(_LinearNode(self.scope, node, op))

    def map(self, f: Mapping[str, pc.Expression | str] | TableFn) -> Collection:
        """New records from expressions (``{name: expr}``) or a table function."""
        return self._linear(LinearOperator().map(f))

    def filter(self, predicate: pc.Expression | MaskFn) -> Collection:
        """Keep the records for which ``predicate`` is true."""
        return self._linear(LinearOperator().filter(predicate))

    def flat_map(self, f: Callable[[pa.Table], Expansion]) -> Collection:
        """Any number of records per record (see :class:`LinearOperator.flat_map`)."""
        return self._linear(LinearOperator().flat_map(f))

    def explode(self, f: Callable[[pa.Table], Expansion]) -> Collection:
        """Weighted records per record (weights multiply)."""
        return self._linear(LinearOperator().explode(f))

    def join_function(self, logic: Callable[[pa.Table], Expansion]) -> Collection:
        """The general linear operator (seed 001): times join, weights multiply."""
        return self._linear(LinearOperator().join_function(logic))

    def temporal_filter(self, lower: IntSpec | None, upper: IntSpec | None) -> Collection:
        """Each record only at versions ``lower <= v[0] < upper``."""
        return self._linear(LinearOperator().temporal_filter(lower, upper))

    def negate(self) -> Collection:
        """Every weight's sign flipped."""
        return self._linear(LinearOperator().negate())

    # unions ---------------------------------------------------------------------------
    def concat(self, *others: Collection) -> Collection:
        """The union of the collections (weights add), not consolidated."""
        return Collection(_ConcatNode(self.scope, [self.node] + [self._local(o) for o in others]))

    plus = concat

    def minus(self, other: Collection) -> Collection:
        """This collection minus ``other`` (weights subtract)."""
        return self.concat(Collection(self._local(other)).negate())

    def consolidate(self) -> Collection:
        """One row per (record, time) in every batch, zero weights dropped."""
        return Collection(_ConsolidateNode(self.scope, self.node))

    def inspect(self, fn: Callable[[Version, ZSet], None]) -> Collection:
        """Call ``fn(version, batch)`` on every batch passing through (debugging, tests)."""
        return Collection(_InspectNode(self.scope, self.node, fn))

    # keyed ----------------------------------------------------------------------------
    def index_with(self, keys: Sequence[str] | str) -> Arranged:
        """This collection arranged by ``keys`` (a trace shared by every join on them)."""
        from engine.differential.join import arrange

        return arrange(self.node, (keys,) if isinstance(keys, str) else tuple(keys))

    def join(self, other: Collection | Arranged, on: Sequence[str] | str) -> Collection:
        """Pairs of records with equal ``on`` columns: this collection's columns, then
        ``other``'s others. Weights multiply, times join."""
        from engine.differential.join import join

        return join(self, other, (on,) if isinstance(on, str) else tuple(on))

    def reduce(self, by: Sequence[str] | str, aggs: Mapping[str, Agg]) -> Collection:
        """Aggregates per group of ``by`` columns: ``{name: ("count",) | ("sum", col) |
        ("min", col) | ("max", col)}``; see :mod:`engine.differential.reduce`."""
        from engine.differential.reduce import reduce

        return reduce(self, (by,) if isinstance(by, str) else tuple(by), aggs)

    def count(self, by: Sequence[str] | str, name: str = "count") -> Collection:
        """Total weight per group (groups of total weight 0 are absent)."""
        return self.reduce(by, {name: ("count",)})

    def sum(self, by: Sequence[str] | str, column: str, name: str | None = None) -> Collection:
        """Weighted sum of ``column`` per group."""
        return self.reduce(by, {name or f"sum_{column}": ("sum", column)})

    def min(self, by: Sequence[str] | str, column: str, name: str | None = None) -> Collection:
        """Least ``column`` among the group's records of positive weight."""
        return self.reduce(by, {name or f"min_{column}": ("min", column)})

    def max(self, by: Sequence[str] | str, column: str, name: str | None = None) -> Collection:
        """Greatest ``column`` among the group's records of positive weight."""
        return self.reduce(by, {name or f"max_{column}": ("max", column)})

    def distinct(self) -> Collection:
        """Each record of positive weight once (weight 1)."""
        from engine.differential.reduce import distinct

        return distinct(self)

    def iterate(self, body: Callable[[Collection], Collection], *,
                max_rounds: int | None = None) -> Collection:
        """The fixed point of ``body`` from this collection (seed 002 v5).

        Inside, versions are ``(step, iteration)``: the variable starts as this collection
        and at iteration ``i + 1`` is ``body``'s result at ``i``; the output is the result
        once nothing changes. Collections from outside used in ``body`` enter the loop
        unchanged at every iteration. The body must consolidate (``distinct``, a reduce or
        ``consolidate``) for the loop to notice it has converged.
        """
        from engine.differential.iterate import iterate

        return iterate(self, body, max_rounds)

    # output ---------------------------------------------------------------------------
    def probe(self) -> Probe:
        """An output probe on this collection (root scope)."""
        if self.scope.nested:
            raise InputError("probe a collection outside the iterate (or use inspect inside)")
        return Probe(ProbeNode(self.scope, self.node))

    def to_table(self, keys: Sequence[str] | str, name: str | None = None) -> Any:
        """This collection as a live keyed table (see :mod:`engine.differential.bridge`)."""
        from engine.differential.bridge import collection_to_table

        return collection_to_table(self, keys, name=name)

