"""Bridges: a live edge table feeds reachability via iterate, exposed as a live keyed table
that is right in the same cycle (examples, then 300 random cycles against BFS over the edge
table's current rows, with the replay checker and update validation)."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pyarrow as pa
import pytest

from engine.differential.bridge import CollectionTable, collection_to_table, to_collection
from engine.errors import InputError
from engine.graph import UpdateGraph
from tests.replay import ReplayChecker

EDGES = pa.schema([("id", pa.int64()), ("src", pa.int64()), ("dst", pa.int64())])


def _reach_table(graph: UpdateGraph, edges, roots) -> CollectionTable:
    e = to_collection(edges, columns=["src", "dst"]).map({"node": "src", "dst": "dst"})
    r = to_collection(roots, e.dataflow)
    reach = r.iterate(lambda x: x.join(e, "node").map({"node": "dst"}).concat(r).distinct())
    return collection_to_table(reach, keys=["node"], name="reach")


def _bfs(edges: pa.Table, roots: list[int]) -> list[int]:
    adj = defaultdict(list)
    for s, d in zip(edges.column("src").to_pylist(), edges.column("dst").to_pylist(), strict=True):
        adj[s].append(d)
    seen, todo = set(roots), deque(roots)
    while todo:
        for d in adj[todo.popleft()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return sorted(seen)


def _setup():
    g = UpdateGraph(validate=True)
    edges = g.keyed_table(EDGES, "id", name="edges")
    roots = g.keyed_table(pa.schema([("node", pa.int64())]), "node", name="roots")
    roots.upsert(pa.table({"node": [0]}))
    edges.upsert(pa.table({"id": [0, 1], "src": [0, 1], "dst": [1, 2]}))
    g.run_cycle()
    return g, edges, roots


def test_reachability_table_same_cycle():
    g, edges, roots = _setup()
    reach = _reach_table(g, edges, roots)
    assert sorted(reach.to_pandas()["node"]) == [0, 1, 2]
    seen = []
    reach.listen(lambda up, t: seen.append((g.step, len(up.added), len(up.removed))))
    edges.upsert(pa.table({"id": [2], "src": [2], "dst": [3]}))
    g.run_cycle()
    assert sorted(reach.to_pandas()["node"]) == [0, 1, 2, 3]
    assert seen == [(g.step, 1, 0)]
    edges.delete(pa.table({"id": [1]}))      # 1 -> 2 goes: 2 and 3 are unreachable
    g.run_cycle()
    assert sorted(reach.to_pandas()["node"]) == [0, 1]
    assert seen[-1] == (g.step, 0, 2)
    g.run_cycle()                             # nothing changed: no update
    assert len(seen) == 2
    with pytest.raises(InputError, match="computed by a dataflow"):
        reach.upsert(pa.table({"node": [9]}))


def test_bridge_rejects_late_inputs():
    g, edges, roots = _setup()
    reach = _reach_table(g, edges, roots)
    with pytest.raises(InputError):
        to_collection(edges, reach.dataflow)


def test_reachability_table_oracle():
    rng = np.random.default_rng(3)
    g, edges, roots = _setup()
    reach = _reach_table(g, edges, roots)
    replay = ReplayChecker(reach)
    n_nodes, next_id = 30, 2
    for cycle in range(300):
        cur = edges.to_arrow()
        ids = cur.column("id").to_pylist()
        k = int(rng.integers(1, 4))
        new = {"id": list(range(next_id, next_id + k)), "src": rng.integers(0, n_nodes, k).tolist(),
               "dst": rng.integers(0, n_nodes, k).tolist()}
        next_id += k
        if ids and rng.random() < 0.5:         # move an edge: a modify of the edge table
            i = int(rng.choice(ids))
            new["id"].append(i)
            new["src"].append(int(rng.integers(n_nodes)))
            new["dst"].append(int(rng.integers(n_nodes)))
        edges.upsert(pa.table(new))
        if len(ids) > 30:
            gone = rng.choice(ids, size=int(rng.integers(1, 4)), replace=False)
            edges.delete(pa.table({"id": [int(i) for i in gone if i not in new["id"]]}))
        if cycle % 50 == 25:
            roots.upsert(pa.table({"node": [int(rng.integers(n_nodes))]}))
        g.run_cycle()
        want = _bfs(edges.to_arrow(), roots.to_arrow().column("node").to_pylist())
        assert sorted(reach.to_pandas()["node"]) == want, f"cycle {cycle}"
        replay.check()
