"""iterate: seed 002's geometric series (v4/v5), whose retraction at version 2 is where
lexicographically ordered times fail, checked iteration by iteration; then reachability
and connected components maintained over a graph whose edges are added and removed at
every version, against BFS and union-find recomputed from scratch (>= 500 versions)."""

from __future__ import annotations

from collections import Counter, defaultdict, deque

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.differential.dataflow import Collection, Dataflow
from engine.differential.zset import ZSet
from engine.errors import InputError, SchemaError
from tests.engine.differential._dataflow_ref import Accumulated, batch

X = pa.schema([("x", pa.int64())])


def _geometric(log):
    def body(c: Collection) -> Collection:
        return (c.map({"x": pc.field("x") * 2}).concat(c).filter(pc.field("x") <= 50)
                .distinct().consolidate()
                .inspect(lambda v, b: log.append((v.coords, sorted((r[0], d) for r, _, d in b.to_triples())))))
    return body


def test_seed002_geometric_series_under_retraction():
    log: list = []
    df = Dataflow()
    coll, inp = df.input(X)
    probe = coll.iterate(_geometric(log)).probe()
    results = []
    for v, rows in [(0, [(1, 1)]), (1, [(16, 1), (3, 1)]), (2, [(3, -1)])]:
        inp.send(ZSet.from_triples([(x, v, w) for x, w in rows], X))
        inp.advance_to(v + 1)
        assert probe.less_than(v)
        df.step()
        assert not probe.less_than(v)
        results.append(sorted(r[0] for r, _, _ in probe.accumulate(v).to_triples()))
    assert results == [[1, 2, 4, 8, 16, 32], [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48], [1, 2, 4, 8, 16, 32]]
    # seed 002 v5's debug output, iteration by iteration
    assert log == [
        ((0, 0), [(1, 1), (2, 1)]), ((0, 1), [(4, 1)]), ((0, 2), [(8, 1)]), ((0, 3), [(16, 1)]),
        ((0, 4), [(32, 1)]),
        ((1, 0), [(3, 1), (6, 1), (16, 1), (32, 1)]), ((1, 1), [(12, 1)]), ((1, 2), [(24, 1)]),
        ((1, 3), [(16, -1), (48, 1)]), ((1, 4), [(32, -1)]),
        # lexicographic times emit only (3, -1) here and leave 6, 12, 24, 48 behind
        ((2, 0), [(3, -1), (6, -1)]), ((2, 1), [(12, -1)]), ((2, 2), [(24, -1)]), ((2, 3), [(48, -1)]),
    ]
    assert [sorted(r[0] for r, _, _ in b.to_triples()) for b in probe.batches][2] == [3, 6, 12, 24, 48]
    assert all(d == -1 for _, _, d in probe.batches[2].to_triples())


def test_iterate_body_must_keep_columns_and_converge():
    df = Dataflow()
    coll, inp = df.input(X)
    with pytest.raises(SchemaError, match="keep the columns"):
        coll.iterate(lambda c: c.map({"y": "x"}))
    probe = coll.iterate(lambda c: c.map({"x": pc.field("x") + 1}).distinct(), max_rounds=50).probe()
    inp.send(ZSet.from_triples([(1, 0, 1)], X))
    inp.advance_to(1)
    with pytest.raises(InputError, match="fixed point"):
        df.step()
    del probe


E = pa.schema([("node", pa.int64()), ("dst", pa.int64())])
N = pa.schema([("node", pa.int64())])


def reachability(edges: Collection, roots: Collection) -> Collection:
    return roots.iterate(lambda r: r.join(edges, "node").map({"node": "dst"}).concat(roots).distinct())


def bfs(edges: set, root: int) -> set:
    adj = defaultdict(list)
    for s, d in edges:
        adj[s].append(d)
    seen, todo = {root}, deque([root])
    while todo:
        for d in adj[todo.popleft()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _random_graph_changes(rng, n_nodes, n_edges, versions, per_version):
    """Per version: (added edges, removed edges); every version adds and removes."""
    edges: set = set()
    out = []
    for v in range(versions):
        add, rem = set(), set()
        want = n_edges if v == 0 else per_version
        while len(add) < want:
            e = (int(rng.integers(n_nodes)), int(rng.integers(n_nodes)))
            if e not in edges:
                add.add(e)
        if v:
            cur = sorted(edges)
            for i in rng.choice(len(cur), size=min(per_version, len(cur)), replace=False):
                rem.add(cur[i])
        edges = (edges - rem) | add
        out.append((sorted(add), sorted(rem), set(edges)))
    return out


def test_reachability_oracle():
    rng = np.random.default_rng(11)
    df = Dataflow()
    edges, ie = df.input(E)
    roots, ir = df.input(N)
    acc = Accumulated(reachability(edges, roots).probe())
    ir.send(batch(N, [(0,)], [1], 0))
    for v, (add, rem, cur) in enumerate(_random_graph_changes(rng, 40, 45, 500, 2)):
        ie.send(batch(E, add + rem, [1] * len(add) + [-1] * len(rem), v))
        for h in (ie, ir):
            h.advance_to(v + 1)
        df.step()
        want = Counter({(n,): 1 for n in bfs(cur, 0)})
        got = acc.update()
        assert got == want, f"version {v}: only incremental {got - want}, only BFS {want - got}"


def _components(edges: set, nodes: range) -> dict:
    parent = {n: n for n in nodes}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for s, d in edges:
        a, b = find(s), find(d)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {n: min(m for m in nodes if find(m) == find(n)) for n in nodes}


def test_connected_components_oracle():
    rng = np.random.default_rng(5)
    n = 30
    L = pa.schema([("node", pa.int64()), ("label", pa.int64())])
    df = Dataflow()
    edges, ie = df.input(E)
    labels, il = df.input(L)
    sym = edges.concat(edges.map({"node": "dst", "dst": "node"}))

    def body(lab: Collection) -> Collection:
        moved = lab.join(sym, "node").map({"node": "dst", "label": "label"})
        return moved.concat(lab).min("node", "label", name="label")

    acc = Accumulated(labels.iterate(body).probe())
    il.send(batch(L, [(i, i) for i in range(n)], [1] * n, 0))
    for v, (add, rem, cur) in enumerate(_random_graph_changes(rng, n, 20, 500, 1)):
        ie.send(batch(E, add + rem, [1] * len(add) + [-1] * len(rem), v))
        for h in (ie, il):
            h.advance_to(v + 1)
        df.step()
        want = Counter({(k, lab): 1 for k, lab in _components(cur, range(n)).items()})
        got = acc.update()
        assert got == want, f"version {v}: only incremental {got - want}, only union-find {want - got}"
