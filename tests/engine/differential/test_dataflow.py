"""The dataflow graph: inputs and frontiers, linear operators fused into one node,
concat/minus/consolidate, the general linear operator and temporal filter in a graph,
probes, and the errors that guard them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.differential import Dataflow, Expansion, ZSet
from engine.differential.dataflow import _LinearNode
from engine.errors import InputError, SchemaError

X = pa.schema([("x", pa.int64())])


def _triples(z: ZSet):
    return sorted((r, d) for r, _, d in z.to_triples())


def test_linear_chain_is_fused_into_one_node():
    df = Dataflow()
    c, inp = df.input(X)
    out = c.map({"x": pc.field("x") + 1}).filter(pc.field("x") > 2).negate().map({"y": "x"})
    probe = out.probe()
    inp.send(ZSet.from_triples([(1, 0, 1), (2, 0, 3), (5, 0, -1)], X))
    inp.advance_to(1)
    df.step()
    assert _triples(probe.accumulate()) == [((3,), -3), ((6,), 1)]
    linear = [n for n in df.root.nodes if isinstance(n, _LinearNode)]
    assert len(linear) == 1 and len(linear[0].op.stages) == 4   # one pass, dead nodes dropped


def test_concat_minus_consolidate_and_frontiers():
    df = Dataflow()
    a, ia = df.input(X)
    b, ib = df.input(X)
    probe = a.concat(b).minus(b).consolidate().probe()
    ia.send(ZSet.from_triples([(1, 0, 1), (2, 1, 2)], X))
    ib.send(ZSet.from_triples([(7, 0, 1)], X))
    ia.advance_to(2)
    ib.advance_to(1)
    df.step()                         # only version 0 is closed on both inputs
    assert probe.frontier.elements[0].coords == (1,)
    assert [b.times[0, 0] for b in probe.batches] == [0]
    assert probe.less_than(1) and not probe.less_than(0)
    ib.advance_to(2)
    df.step()
    assert _triples(probe.accumulate()) == [((1,), 1), ((2,), 2)]
    with pytest.raises(InputError, match="behind the frontier"):
        ia.send(ZSet.from_triples([(3, 1, 1)], X))
    with pytest.raises(InputError, match="cannot go back"):
        ia.advance_to(1)
    with pytest.raises(InputError, match="build every operator"):
        a.negate()


def test_join_function_explode_and_temporal_filter_in_a_graph():
    # seed 001: x copies of 2x from version 3x until 4x
    def logic(t: pa.Table) -> Expansion:
        x = t.column("x").to_numpy()
        n = x.size
        p = np.concatenate((np.arange(n), np.arange(n)))
        return Expansion(p, pa.table({"x": np.concatenate((2 * x, 2 * x))}),
                         times=np.concatenate((3 * x, 4 * x)), diffs=np.concatenate((x, -x)))

    df = Dataflow()
    c, inp = df.input(X)
    probe = c.join_function(logic).probe()
    window = c.temporal_filter("x", pc.field("x") + 2).probe()
    # a count emits at the time it runs: it must see each row at the row's own time
    counts = c.join_function(logic).count("x").probe()
    window_counts = c.temporal_filter("x", pc.field("x") + 2).count("x").probe()
    inp.send(ZSet.from_triples([(1, 0, 1), (2, 0, 1)], X))
    for v in range(9):
        inp.advance_to(v + 1)
        df.step()
        want = sorted(((2 * x,), x) for x in (1, 2) if 3 * x <= v < 4 * x)
        assert _triples(probe.accumulate(v)) == want, v
        assert _triples(counts.accumulate(v)) == sorted(((2 * x, x), 1) for x in (1, 2) if 3 * x <= v < 4 * x), v
        assert _triples(window.accumulate(v)) == sorted(((x,), 1) for x in (1, 2) if x <= v < x + 2), v
        assert _triples(window_counts.accumulate(v)) == sorted(((x, 1), 1) for x in (1, 2) if x <= v < x + 2), v


def test_input_checks():
    df = Dataflow()
    c, inp = df.input(X)
    with pytest.raises(SchemaError):
        inp.send(ZSet.from_triples([("a", 0, 1)], ["x"]))
    with pytest.raises(InputError, match="one-coordinate"):
        inp.send(ZSet.from_triples([(1, (0, 0), 1)], X))
    inp.close()
    with pytest.raises(InputError, match="closed"):
        inp.send(ZSet.from_triples([(1, None, 1)], X))
