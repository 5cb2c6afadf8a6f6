"""Joins: seed 003's Join Stream and Join Trace examples, the delta join operator on
examples with partially ordered times, then an oracle over 600 random versions."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from engine.differential.dataflow import Dataflow, _LinearNode
from engine.differential.join import ArrangeNode, _JoinNode, join_stream, join_trace
from engine.differential.trace import Trace
from engine.differential.zset import ZSet
from engine.errors import SchemaError
from tests.engine.differential._dataflow_ref import (
    Accumulated,
    RandomInput,
    as_counter,
    batch,
    ref_join,
    ref_reduce,
)

KV1 = pa.schema([("k", pa.string()), ("v1", pa.int64())])
KV2 = pa.schema([("k", pa.string()), ("v2", pa.int64())])


def test_seed003_join_stream():
    a = ZSet.from_triples([(("a", 1), 0, 1), (("b", 2), 0, 2), (("c", 2), 0, 1)], KV1)
    b = ZSet.from_triples([(("a", 1), 0, 1), (("b", 3), 0, 1), (("b", 4), 0, -1)], KV2)
    got = join_stream(a, b, ["k"]).consolidate()
    assert sorted((r, d) for r, _, d in got.to_triples()) == [
        (("a", 1, 1), 1), (("b", 2, 3), 2), (("b", 2, 4), -2)]


def test_seed003_join_trace():
    zset = ZSet.from_triples([(("a", 0), 0, 1), (("a", 0), 0, -1), (("a", 1), 0, 1), (("b", 2), 0, 2),
                              (("c", 2), 0, 1)], KV1)
    trace = Trace(KV2, ["k"])
    trace.insert(ZSet.from_triples([(("a", 1), 0, 1), (("b", -3), 0, -1), (("b", 3), 0, 1),
                                    (("b", 4), 0, -1), (("c", 4), 0, 1)], KV2))
    got = join_trace(zset, trace).consolidate()
    assert sorted((r, d) for r, _, d in got.to_triples()) == [
        (("a", 1, 1), 1), (("b", 2, -3), -2), (("b", 2, 3), 2), (("b", 2, 4), -2), (("c", 2, 4), 1)]


def test_join_trace_times_are_joined():
    trace = Trace(KV2, ["k"], dims=2)
    trace.insert(ZSet.from_triples([(("a", 7), (0, 3), 1), (("a", 8), (2, 0), 1)], KV2))
    got = join_trace(ZSet.from_triples([(("a", 1), (1, 1), 2)], KV1), trace)
    assert sorted(got.to_triples()) == [(("a", 1, 7), (1, 3), 2), (("a", 1, 8), (2, 1), 2)]


def test_join_operator_examples():
    df = Dataflow()
    a, ia = df.input(KV1)
    b, ib = df.input(KV2)
    probe = a.join(b, "k").probe()
    ia.send(ZSet.from_triples([(("x", 1), 0, 1), (("y", 2), 0, 1)], KV1))
    ib.send(ZSet.from_triples([(("x", 10), 0, 1)], KV2))
    for h in (ia, ib):
        h.advance_to(1)
    df.step()
    assert probe.accumulate().to_triples() == [(("x", 1, 10), None, 1)]
    # both sides change at one version: dA join dB counted once
    ia.send(ZSet.from_triples([(("x", 3), 1, 2), (("y", 2), 1, -1)], KV1))
    ib.send(ZSet.from_triples([(("x", 10), 1, -1), (("x", 11), 1, 1), (("y", 5), 1, 1)], KV2))
    for h in (ia, ib):
        h.advance_to(2)
    df.step()
    assert sorted(probe.batches[-1].consolidate().to_triples()) == [
        (("x", 1, 10), (1,), -1), (("x", 1, 11), (1,), 1), (("x", 3, 11), (1,), 2)]
    assert probe.frontier.elements[0].coords == (2,)


def test_join_rejects_clashing_columns():
    df = Dataflow()
    a, _ = df.input(KV1)
    b, _ = df.input(pa.schema([("k", pa.string()), ("v1", pa.int64())]))
    with pytest.raises(SchemaError, match="rename"):
        a.join(b, "k")


def test_join_oracle():
    rng = np.random.default_rng(7)
    sa = pa.schema([("k", pa.int64()), ("s", pa.string())])
    sb = pa.schema([("k", pa.int64()), ("x", pa.int64())])
    df = Dataflow()
    a, ia = df.input(sa)
    b, ib = df.input(sb)
    probe = a.join(b.index_with("k"), "k").probe()
    acc = Accumulated(probe)
    ra = RandomInput(rng, sa, lambda r: (int(r.integers(8)), "abcd"[int(r.integers(4))]))
    rb = RandomInput(rng, sb, lambda r: (int(r.integers(8)), int(r.integers(5))))
    for v in range(600):
        if rng.random() < 0.9:
            ia.send(ra.change(int(rng.integers(0, 5)), v))
        if rng.random() < 0.9:
            ib.send(rb.change(int(rng.integers(0, 5)), v))
        for h in (ia, ib):
            h.advance_to(v + 1)
        df.step()
        assert acc.update() == ref_join(ra.state, rb.state), f"version {v}"


def _orders_customers(df: Dataflow):
    so = pa.schema([("oid", pa.int64()), ("k", pa.int64()), ("amount", pa.int64()), ("note", pa.string())])
    sc = pa.schema([("k", pa.int64()), ("region", pa.int64()), ("name", pa.string())])
    o, io = df.input(so)
    c, ic = df.input(sc)
    return so, sc, o, io, c, ic


def _random_versions(rng, df: Dataflow, orders, customers, *, amounts: int, versions: int):
    """Random changes of orders (amounts in ``[1, amounts)``) and customers, one version a
    step; yields each version and the reference join after it, (oid, k, amount, note,
    region, name) -> weight."""
    (so, io), (sc, ic) = orders, customers
    ro = RandomInput(rng, so, lambda r: (int(r.integers(20)), int(r.integers(6)),
                                         int(r.integers(1, amounts)), "xyz"[int(r.integers(3))]))
    rc = RandomInput(rng, sc, lambda r: (int(r.integers(6)), int(r.integers(3)), "pq"[int(r.integers(2))]))
    for v in range(versions):
        if rng.random() < 0.9:
            io.send(ro.change(int(rng.integers(0, 6)), v))
        if rng.random() < 0.9:
            ic.send(rc.change(int(rng.integers(0, 4)), v))
        io.advance_to(v + 1)
        ic.advance_to(v + 1)
        df.step()
        yield v, ref_join(ro.state, rc.state, 1, 0)


def test_join_into_count_sum_prunes_unread_columns():
    """The arrangements store, and the joins emit, only the columns the count/sum read; the
    results are exact against recomputation over 500 random versions (weights > 1,
    negative weights)."""
    rng = np.random.default_rng(11)
    df = Dataflow()
    so, sc, o, io, c, ic = _orders_customers(df)
    joined = o.join(c, "k")
    agg = joined.reduce("region", {"n": ("count",), "total": ("sum", "amount")}).probe()
    pairs = o.join(c.index_with("k"), "k")  # a second join sharing both arrangements
    keys_only = pairs.count("k").probe()  # reads the key alone
    acc, acc_keys = Accumulated(agg), Accumulated(keys_only)
    for v, j in _random_versions(rng, df, (so, io), (sc, ic), amounts=50, versions=500):
        want = Counter()
        for (r, n), w in ref_reduce(j, 4, "count").items():
            total = sum(w2 * rec[2] for rec, w2 in j.items() if rec[4] == r)
            want[(r, n, total)] += w
        assert acc.update() == want, f"version {v}"
        assert acc_keys.update() == ref_reduce(j, 1, "count"), f"version {v}"
    arranged = [n for n in df.root.nodes if isinstance(n, ArrangeNode)]
    # shared arrangements store the union of what their joins read
    assert sorted(n.trace.schema.names for n in arranged) == [["k", "amount"], ["k", "region"]]
    assert joined.schema.names == ["amount", "region"]
    assert pairs.schema.names == ["k"]


def test_join_into_column_picking_map_emits_only_those_columns():
    """A linear chain that starts by picking columns by name (a ``map`` of column names,
    also after a ``negate``) reads only those: the join before it emits only them, and
    the results are exact against recomputation over 300 random versions."""
    rng = np.random.default_rng(12)
    df = Dataflow()
    so, sc, o, io, c, ic = _orders_customers(df)
    joined = o.join(c, "k")
    picked = joined.map({"r": "region", "a": "amount"}).distinct().probe()
    negated = joined.negate().map({"r": "region"}).count("r").probe()
    acc_picked, acc_negated = Accumulated(picked), Accumulated(negated)
    for v, j in _random_versions(rng, df, (so, io), (sc, ic), amounts=4, versions=300):
        proj: Counter = Counter()
        for rec, w in j.items():
            proj[(rec[4], rec[2])] += w
        assert acc_picked.update() == Counter({rec: 1 for rec, w in proj.items() if w > 0}), f"version {v}"
        want = Counter()
        for (r, n), w in ref_reduce(j, 4, "count").items():
            want[(r, -n)] += w
        assert acc_negated.update() == want, f"version {v}"
    assert joined.schema.names == ["amount", "region"]


def test_join_absorbs_its_only_consumer_when_a_map_of_column_names():
    """A join whose only consumer picks and renames columns (here reordered and one
    repeated) names its output itself and the map leaves the graph; exact against
    recomputation over 300 random versions."""
    rng = np.random.default_rng(21)
    df = Dataflow()
    so, sc, o, io, c, ic = _orders_customers(df)
    renamed = o.join(c, "k").map({"r": "region", "a": "amount", "a2": "amount"})
    acc = Accumulated(renamed.probe())
    for v, j in _random_versions(rng, df, (so, io), (sc, ic), amounts=4, versions=300):
        want: Counter = Counter()
        for rec, w in j.items():
            want[(rec[4], rec[2], rec[2])] += w
        assert acc.update() == Counter({rec: w for rec, w in want.items() if w}), f"version {v}"
    assert not any(isinstance(n, _LinearNode) for n in df.root.nodes)
    join = next(n for n in df.root.nodes if isinstance(n, _JoinNode))
    assert join.schema.names == ["r", "a", "a2"]


def test_join_read_whole_keeps_every_column():
    df = Dataflow()
    so, sc, o, io, c, ic = _orders_customers(df)
    joined = o.join(c, "k")
    joined.reduce("region", {"n": ("count",)}).probe()
    whole = joined.probe()  # a probe reads every column: nothing is pruned upstream
    io.send(batch(so, [(1, 2, 10, "a"), (2, 2, 5, "b")], [1, 1], 0))
    ic.send(batch(sc, [(2, 7, "n")], [1], 0))
    io.advance_to(1)
    ic.advance_to(1)
    df.step()
    assert whole.schema.names == ["oid", "k", "amount", "note", "region", "name"]
    assert as_counter(whole.accumulate()) == Counter({(1, 2, 10, "a", 7, "n"): 1, (2, 2, 5, "b", 7, "n"): 1})
