"""D2's workload, numpy only (shared by bench_differential and the Pathway peer script, whose
venv has no Ticktable): a random directed graph of E edges on E/4 nodes, then per step
``change`` edges added and ``change`` removed, and the BFS that checks the result."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def initial(e: int) -> tuple[np.random.Generator, int, np.ndarray, set[int]]:
    """``(rng, n_nodes, code, edges)``: an edge is ``src * n_nodes + dst`` in ``code``
    (load order) and in the set ``edges`` (the live edges, updated by :func:`steps`)."""
    rng = np.random.default_rng(e)
    n_nodes = max(e // 4, 2)
    code = np.unique(rng.integers(0, n_nodes, 2 * e) * n_nodes + rng.integers(0, n_nodes, 2 * e))
    code = rng.permutation(code)[:e]
    return rng, n_nodes, code, set(code.tolist())


def steps(rng: np.random.Generator, n_nodes: int, edges: set[int], n_steps: int,
          change: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per step, ``(added, removed)`` edge codes; ``edges`` is updated before each yield."""
    for _ in range(n_steps):
        add: list[int] = []
        while len(add) < change:
            c = int(rng.integers(n_nodes)) * n_nodes + int(rng.integers(n_nodes))
            if c not in edges and c not in add:
                add.append(c)
        cur = np.fromiter(edges, dtype=np.int64, count=len(edges))
        rem = rng.choice(cur, change, replace=False)
        edges.difference_update(rem.tolist())
        edges.update(add)
        yield np.array(add, dtype=np.int64), rem


def bfs(src: np.ndarray, dst: np.ndarray, n_nodes: int, root: int) -> np.ndarray:
    """Vectorized BFS (numpy, CSR rebuilt from the edge arrays): a loop per level only."""
    order = np.argsort(src, kind="stable")
    d = dst[order]
    starts = np.searchsorted(src[order], np.arange(n_nodes + 1))
    seen = np.zeros(n_nodes, dtype=bool)
    seen[root] = True
    frontier = np.array([root])
    while frontier.size:
        lo, hi = starts[frontier], starts[frontier + 1]
        cnt = hi - lo
        if cnt.sum() == 0:
            break
        idx = np.repeat(lo - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt) + np.arange(cnt.sum())
        nxt = np.unique(d[idx])
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    return np.flatnonzero(seen)


def reachable(edges: set[int], n_nodes: int, root: int = 0) -> np.ndarray:
    """The nodes reachable from ``root`` over ``edges`` (sorted)."""
    cur = np.fromiter(edges, dtype=np.int64, count=len(edges))
    return bfs(cur // n_nodes, cur % n_nodes, n_nodes, root)
