"""``iterate``: a fixed point with ``(version, iteration)`` times (seed 002 v5).

For an outer version ``e`` with input change ``dX``, the loop's variable gets ``dX`` at
``(e, 0)`` and ``-dX`` at ``(e, 1)`` (so it accumulates to ``X`` at iteration 0 only), and
the body's result change at ``(e, i)`` is fed back at ``(e, i + 1)``: the variable at
iteration ``i + 1`` is the body's result at ``i``. Collections from outside the loop enter
at ``(e, 0)`` and hold at every iteration. The loop's output at ``e`` is the sum of the
result's changes over all iterations of ``e`` (its value at the fixed point).

Times are partially ordered: ``(1, 2)`` sees ``(0, 2)`` and ``(1, 1)`` but not ``(0, 3)``.
That is what keeps the second iteration of version 1 from inheriting the second
iteration of version 0 wholesale, the failure of lexicographic times under retractions
(seed 002 v4); joins and reduces inside the loop combine history by the lattice join and
re-evaluate groups at the iterations where earlier versions changed them
(:mod:`engine.differential.reduce`). Per outer version, each iteration processes only the
changes at that iteration (semi-naive), and the loop ends when no operator has anything
pending: the body must consolidate (``distinct``, a reduce or ``consolidate``) so that
changes that cancel are seen to cancel. Loops do not nest (yet).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.differential.dataflow import Collection, Node, Scope, Time, extend_times
from engine.differential.zset import ZSet, concat
from engine.errors import InputError, SchemaError

__all__: list[str] = []


class _SourceNode(Node):
    """A node fed from outside its scope (the loop variable, an entered collection)."""

    n_inputs = 1
    emits_at_input_time = True  # fed at one time per push

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        return batches[0]


class _FeedbackNode(Node):
    """Consolidates the body's result at ``(e, i)`` (unless its node emits consolidated
    batches), feeds it back at ``(e, i + 1)`` and keeps it for the loop's output."""

    is_sink = True

    def __init__(self, scope: Scope, result: Node, variable: _SourceNode) -> None:
        super().__init__(scope, [result], result.schema)
        self.variable = variable
        self.out: list[ZSet] = []

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        b = batches[0]
        if b is None:
            return None
        c = b if self.inputs[0].emits_consolidated else b.consolidate()
        if c.num_rows:
            self.out.append(c)
            assert c.times is not None
            nxt = c.times.copy()
            nxt[:, -1] += 1
            self.variable.push(0, t[:-1] + (t[-1] + 1,), ZSet(c.data, c.diffs, nxt))
        return None


class _IterateNode(Node):
    """The loop, as one node of the outer scope: inputs are the loop's input and every
    collection entered into the body."""

    def __init__(self, scope: Scope, source: Node, inner: Scope, variable: _SourceNode,
                 feedback: _FeedbackNode, entered: list[tuple[Node, Node]],
                 max_rounds: int | None) -> None:
        super().__init__(scope, [source] + [o for o, _ in entered], feedback.schema)
        self.n_inputs = 1 + len(entered)
        self.inner = inner
        self.variable = variable
        self.feedback = feedback
        self.entered = [i for _, i in entered]
        self.max_rounds = max_rounds

    def finalize(self) -> None:
        self.inner.wire()

    def process(self, t: Time, batches: list[ZSet | None]) -> ZSet | None:
        x = batches[0]
        if x is not None:
            self.variable.push(0, t + (0,), extend_times(x, 0))
            self.variable.push(0, t + (1,), extend_times(x.negate(), 1))
        for node, b in zip(self.entered, batches[1:], strict=True):
            if b is not None:
                node.push(0, t + (0,), extend_times(b, 0))
        self.inner.rounds = 0
        self.inner.run(max_rounds=self.max_rounds)
        out, self.feedback.out = self.feedback.out, []
        if not out:
            return None
        res = concat(*out).without_times().consolidate()
        return res.with_time(t) if res.num_rows else None


def enter(node: Node, scope: Scope) -> Node:
    """``node``'s collection inside the loop ``scope`` (the same at every iteration)."""
    if scope.parent is not node.scope:
        raise InputError("a collection can only enter the loop directly inside its own scope")
    found = scope.entered.get(id(node))
    if found is None:
        found = scope.entered[id(node)] = (node, _SourceNode(scope, [], node.schema))
    return found[1]


def iterate(coll: Collection, body: Callable[[Collection], Collection],
            max_rounds: int | None) -> Collection:
    """See :meth:`Collection.iterate`."""
    outer = coll.scope
    if outer.nested:
        raise InputError("iterate inside iterate is not supported yet")
    inner = Scope(outer.dataflow, outer, outer.dims + 1)
    variable = _SourceNode(inner, [], coll.schema)
    result = body(Collection(variable))
    if not isinstance(result, Collection):
        raise InputError(f"the iterate body must return a Collection, got {type(result).__name__}")
    if result.scope is not inner:
        raise InputError("the iterate body must return a collection computed inside the loop")
    if result.schema.names != coll.schema.names or result.schema.types != coll.schema.types:
        raise SchemaError(f"the iterate body must keep the columns {coll.schema} (it feeds back), "
                          f"got {result.schema}")
    feedback = _FeedbackNode(inner, result.node, variable)
    entered = list(inner.entered.values())
    node = _IterateNode(outer, coll.node, inner, variable, feedback, entered, max_rounds)
    return Collection(node)

