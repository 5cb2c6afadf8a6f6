"""The two ends of a dataflow: :class:`InputHandle` (batches in, a frontier that advances)
and :class:`Probe` (batches out, and how far they are final). See
:mod:`engine.differential.dataflow`, which makes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from engine.differential.version import Antichain, Version, VersionLike, as_version
from engine.differential.zset import ZSet, concat, split_by_time
from engine.errors import InputError, SchemaError

if TYPE_CHECKING:
    from engine.differential.dataflow import InputNode, ProbeNode

__all__ = ["InputHandle", "Probe"]


class Probe:
    """The output end of a collection: its batches so far and how far they are final.

    Everything at versions before :attr:`frontier` has been delivered.
    """

    def __init__(self, node: ProbeNode) -> None:
        self._node = node

    @property
    def frontier(self) -> Antichain:
        return self._node.scope.dataflow.frontier

    @property
    def schema(self) -> pa.Schema:
        return self._node.schema

    @property
    def batches(self) -> list[ZSet]:
        """Every output batch so far (one per processed version that changed the output)."""
        return list(self._node.batches)

    def drain(self) -> ZSet:
        """The output batches since the previous drain, as one timed batch (consolidated)."""
        new, self._node.new = self._node.new, []
        if not new:
            return ZSet.empty(self.schema, 1)
        return concat(*new).consolidate()

    def accumulate(self, at: VersionLike | None = None) -> ZSet:
        """The output collection at version ``at`` (every version so far by default)."""
        if not self._node.batches:
            return ZSet.empty(self.schema)
        return concat(*self._node.batches).accumulate(None if at is None else as_version(at))

    def less_than(self, v: VersionLike) -> bool:
        """Whether the output may still change at versions ``<= v`` (seed 002's
        ``probe_frontier_less_than``)."""
        f = self.frontier
        return bool(f) and f.less_equal_version(as_version(v))


class InputHandle:
    """Where data enters a dataflow: batches at versions, and a frontier that advances.

    Examples
    --------
    >>> df = Dataflow()
    >>> coll, inp = df.input(pa.schema([("x", pa.int64())]))
    >>> probe = coll.map({"y": pc.field("x") * 2}).probe()
    >>> inp.send(ZSet.from_triples([(1, 0, 1), (2, 0, 1)], ["x"])); inp.advance_to(1); df.step()
    >>> sorted(probe.accumulate().to_triples())
    [((2,), None, 1), ((4,), None, 1)]
    """

    def __init__(self, node: InputNode) -> None:
        self._node = node
        self.frontier = Antichain([Version(0)])

    @property
    def schema(self) -> pa.Schema:
        return self._node.schema

    def send(self, batch: ZSet, time: VersionLike | None = None) -> None:
        """Stage ``batch`` (its own times, else ``time``, else the frontier's version).

        Raises
        ------
        InputError
            If a version is behind the frontier or has more than one coordinate.
        SchemaError
            If the columns differ from the input's.
        """
        s = self._node.schema
        if not batch.schema.equals(s) and (batch.schema.names != s.names or batch.schema.types != s.types):
            raise SchemaError(f"input batch columns {batch.schema} do not match the input's {s}")
        if batch.times is None:
            if time is None:
                if not self.frontier:
                    raise InputError("the input is closed (empty frontier): it takes no more data")
                time = self.frontier.elements[0]
            batch = batch.with_time(time)
        assert batch.times is not None
        if batch.times.shape[1] != 1:
            raise InputError(f"root inputs take one-coordinate versions, got {batch.times.shape[1]}")
        if batch.num_rows == 0:
            return
        parts = split_by_time(batch)
        self.frontier.check_version(Version(min(t for t, _ in parts)))
        for t, b in parts:
            self._node.push(0, t, b)

    def advance_to(self, frontier: VersionLike | Antichain) -> None:
        """Promise that no more data comes before ``frontier`` (an empty antichain closes)."""
        new = frontier if isinstance(frontier, Antichain) else Antichain([as_version(frontier)])
        self.frontier.check_advance(new)
        self.frontier = new

    def close(self) -> None:
        """No more data at all."""
        self.advance_to(Antichain())
