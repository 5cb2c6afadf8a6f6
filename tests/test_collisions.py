"""Forced hash collisions never merge two distinct keys, anywhere (DESIGN.md §3).

Every hash of a non-exact key goes through :func:`engine._kernels.hashing.hash_column`;
the ``collide`` fixture squeezes it into one or three values, so nearly every pair of
string or multi-column keys collides — in keyed sources, aggregations, joins, the
differential layer (traces, joins, reductions) and the ingestion path alike. Each test
drives random cycles and compares with a from-scratch pandas/Python computation. The
client's row index (a row-key map, exact keys) is checked with every row key sent to one
of three home slots of its hash map.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine import _keyed
from engine._kernels import hashing, hashmap, rowkeymap
from engine.differential.dataflow import Dataflow
from engine.differential.zset import ZSet
from engine.graph import UpdateGraph
from engine.ops.aggregate.listener import Agg, agg_by
from engine.sources import KeyedTable
from tests.clients.conftest import assert_view, graph, lives, server, subscribe  # noqa: F401
from tests.oracle import RandomSource

WORDS = ["a", "b", "ab", "ba", "", "héllo", "x" * 11, "x" * 12, "aaaaaaaaa"]
CYCLES = 60


@pytest.fixture(params=[1, 3], ids=["one-hash", "three-hashes"])
def collide(request, monkeypatch):
    """Every non-exact key hashes to one of ``k`` values (exact keys stay exact)."""
    real = hashing.hash_column
    k = np.uint64(request.param)
    monkeypatch.setattr(hashing, "hash_column", lambda col, name="?": real(col, name) % k)
    probe = pa.table({"s": WORDS, "n": list(range(len(WORDS)))})
    assert np.unique(_keyed._key_hashes(probe, ["s"])).size <= request.param  # the patch reaches
    assert np.unique(hashing.hash_rows(probe, ["s", "n"])).size <= request.param ** 2
    return request.param


def _norm(v: Any) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _rows(table: Any, columns: list[str]) -> Counter:
    """The rows as a multiset of tuples (nulls as None, whole floats as ints)."""
    df = table.to_pandas() if not isinstance(table, pd.DataFrame) else table
    return Counter(tuple(_norm(v) for v in r) for r in df[columns].itertuples(index=False, name=None))


# ------------------------------------------------------------------ keyed sources
@pytest.mark.parametrize("keys", [["s"], ["s", "n"]])
def test_keyed_source_upserts_and_deletes(collide, keys):
    g = UpdateGraph(validate=True)
    schema = pa.schema([("s", pa.string()), ("n", pa.int64()), ("v", pa.int64())])
    t = KeyedTable(g, schema, keys)
    model: dict[tuple, int] = {}
    rng = np.random.default_rng(collide)
    for cycle in range(CYCLES):
        m = int(rng.integers(0, 8))
        s = [WORDS[i] for i in rng.integers(0, len(WORDS), m)]
        n = rng.integers(0, 3, m).tolist()
        v = rng.integers(0, 100, m).tolist()
        t.upsert({"s": s, "n": n, "v": v})
        for row in zip(s, n, v, strict=True):
            model[row[:len(keys)] if len(keys) == 2 else (row[0],)] = row
        d = int(rng.integers(0, 4))
        ds = [WORDS[i] for i in rng.integers(0, len(WORDS), d)]
        dn = rng.integers(0, 3, d).tolist()
        t.delete({"s": ds, "n": dn} if len(keys) == 2 else {"s": ds})
        for key in zip(ds, dn, strict=True):
            model.pop(key if len(keys) == 2 else (key[0],), None)
        g.run_cycle()
        assert t.failure is None
        got = _rows(t, ["s", "n", "v"])
        assert got == Counter(model.values()), f"cycle {cycle}"
        look = list(model)[:5] + [("zz", 9)]
        asked = {"s": [k[0] for k in look]} | ({"n": [k[1] for k in look]} if len(keys) == 2 else {})
        if len(keys) == 1:
            asked = {"s": list(dict.fromkeys(k[0] for k in look))}
        found = t.lookup(asked)
        want = [(model.get((s,) if len(keys) == 1 else (s, n)) is not None)
                for s, n in zip(asked["s"], asked.get("n", [0] * len(asked["s"])), strict=True)]
        assert found.found.tolist() == want


# ------------------------------------------------------------------ aggregations
@pytest.mark.parametrize("by", [["s"], ["s", "n"]])
def test_agg_by_keeps_colliding_groups_apart(collide, by):
    g = UpdateGraph(validate=True)
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("n", pa.int64()), ("v", pa.int64())])
    src = KeyedTable(g, schema, "id")
    out = agg_by(src, [Agg("sum", "v", "total"), Agg("count", None, "rows"),
                       Agg("count_distinct", "s", "kinds")], by=by)
    rng = np.random.default_rng(10 + collide)
    for cycle in range(CYCLES):
        m = int(rng.integers(0, 10))
        ids = rng.integers(0, 40, m)
        src.upsert({"id": ids, "s": [WORDS[i] for i in rng.integers(0, len(WORDS), m)],
                    "n": rng.integers(0, 3, m), "v": rng.integers(0, 50, m)})
        src.delete({"id": rng.integers(0, 40, int(rng.integers(0, 4)))})
        g.run_cycle()
        assert out.failure is None
        df = src.to_pandas()
        want = df.groupby(by).agg(total=("v", "sum"), rows=("v", "size"), kinds=("s", "nunique")).reset_index()
        assert _rows(out, [*by, "total", "rows", "kinds"]) == _rows(want, [*by, "total", "rows", "kinds"]), \
            f"cycle {cycle}"


def test_agg_by_an_integer_column_tells_null_from_its_hash_twin():
    # an integer key is its own exact hash, and a null hashes as -2**63 does: they are two groups
    g = UpdateGraph(validate=True)
    schema = pa.schema([("id", pa.int64()), ("k", pa.int64())])
    src = KeyedTable(g, schema, "id")
    out = agg_by(src, [Agg("count", None, "rows")], by="k")
    src.upsert({"id": [1, 2, 3, 4], "k": pa.array([None, -(2**63), None, 5], pa.int64())})
    g.run_cycle()
    got = Counter((r["k"], r["rows"]) for r in out.to_arrow().to_pylist())
    assert got == Counter({(None, 2): 1, (-(2**63), 1): 1, (5, 1): 1})


# ------------------------------------------------------------------ joins
def _join_model(kind: str, left: pd.DataFrame, right: pd.DataFrame, on: list[str]) -> pd.DataFrame:
    how = "left" if kind in ("natural_join", "left_outer_join") else "inner"
    return left.merge(right, on=on, how=how)


@pytest.mark.parametrize("on", [["s"], ["s", "n"]])
@pytest.mark.parametrize("kind", ["natural_join", "exact_join", "join", "left_outer_join"])
def test_joins_match_only_equal_keys(collide, kind, on):
    g = UpdateGraph(validate=True)
    left = KeyedTable(g, pa.schema([("id", pa.int64()), ("s", pa.string()), ("n", pa.int64()),
                                    ("lv", pa.int64())]), "id")
    unique_right = kind in ("natural_join", "exact_join")
    right_schema = pa.schema([("rid", pa.int64()), ("s", pa.string()), ("n", pa.int64()), ("rv", pa.int64())])
    right = KeyedTable(g, right_schema.remove(0) if unique_right else right_schema,
                       on if unique_right else "rid")
    keys = [(w, n) for w in WORDS for n in range(2)]
    if kind == "exact_join":  # every left key must have its right row: all of them, always
        right.upsert({"s": [k[0] for k in keys], "n": [k[1] for k in keys], "rv": list(range(len(keys)))})
        g.run_cycle()
    out = getattr(left, kind)(right, on=on, joins=["rv"])
    rng = np.random.default_rng(20 + collide)
    cols = ["id", "s", "n", "lv", "rv"]
    for cycle in range(CYCLES):
        m = int(rng.integers(0, 6))
        pick = [keys[i] for i in rng.integers(0, len(keys), m)]
        left.upsert({"id": rng.integers(0, 25, m), "s": [p[0] for p in pick], "n": [p[1] for p in pick],
                     "lv": rng.integers(0, 9, m)})
        left.delete({"id": rng.integers(0, 25, int(rng.integers(0, 3)))})
        m = int(rng.integers(0, 5))
        pick = [keys[i] for i in rng.integers(0, len(keys), m)]
        if unique_right:
            right.upsert({"s": [p[0] for p in pick], "n": [p[1] for p in pick], "rv": rng.integers(0, 9, m)})
            if kind == "natural_join" and rng.random() < 0.3:
                gone = [keys[i] for i in rng.integers(0, len(keys), 2)]
                right.delete({c: [p[i] for p in gone] for i, c in enumerate(["s", "n"]) if c in on}
                             if on == ["s", "n"] else {"s": list(dict.fromkeys(p[0] for p in gone))})
        else:
            right.upsert({"rid": rng.integers(0, 20, m), "s": [p[0] for p in pick], "n": [p[1] for p in pick],
                          "rv": rng.integers(0, 9, m)})
            right.delete({"rid": rng.integers(0, 20, int(rng.integers(0, 3)))})
        g.run_cycle()
        assert out.failure is None, out.failure
        rdf = right.to_pandas()[[*on, "rv"]]
        want = _join_model(kind, left.to_pandas(), rdf, on)
        assert _rows(out, cols) == _rows(want, cols), f"cycle {cycle}"


# ------------------------------------------------------------------ the differential layer
def test_differential_join_count_min_and_distinct_on_string_keys(collide):
    a_schema = pa.schema([("s", pa.string()), ("a", pa.int64())])
    b_schema = pa.schema([("s", pa.string()), ("b", pa.int64())])
    df = Dataflow()
    ca, ia = df.input(a_schema)
    cb, ib = df.input(b_schema)
    joined = ca.join(cb, "s").probe()
    counted = ca.count("s").probe()
    least = ca.reduce("s", {"m": ("min", "a")}).probe()
    distinct = ca.distinct().probe()
    rng = np.random.default_rng(30 + collide)
    a: Counter = Counter()
    b: Counter = Counter()
    for v in range(CYCLES):
        batches = []
        for held, schema, handle in ((a, a_schema, ia), (b, b_schema, ib)):
            triples = []
            for _ in range(int(rng.integers(0, 6))):
                rec = (WORDS[int(rng.integers(0, len(WORDS)))], int(rng.integers(0, 3)))
                w = -1 if held[rec] > 0 and rng.random() < 0.4 else 1
                held[rec] += w
                triples.append((rec, v, w))
            batches.append(triples)
            handle.send(ZSet.from_triples(triples, schema) if triples else ZSet.empty(schema), v)
            handle.advance_to(v + 1)
        df.step()
        want_join = Counter()
        for (s, x), wa in a.items():
            for (t, y), wb in b.items():
                if s == t and wa * wb:
                    want_join[(s, x, y)] += wa * wb
        assert _acc(joined) == +want_join, f"version {v}"
        by_s: dict[str, list[int]] = {}
        for (s, x), w in a.items():
            by_s.setdefault(s, []).extend([x] * w)
        assert _acc(counted) == Counter({(s, len(xs)): 1 for s, xs in by_s.items() if xs}), f"version {v}"
        assert _acc(least) == Counter({(s, min(xs)): 1 for s, xs in by_s.items() if xs}), f"version {v}"
        assert _acc(distinct) == Counter({r: 1 for r, w in a.items() if w > 0}), f"version {v}"


def _acc(probe: Any) -> Counter:
    out: Counter = Counter()
    for rec, _, w in probe.accumulate().to_triples():
        out[tuple(rec)] += w
    return +out


# ------------------------------------------------------------------ the client's row index
def test_client_row_index_with_every_key_in_three_home_slots(server, graph, subscribe, monkeypatch):  # noqa: F811
    """A live client view of a keyed table (string keys, whose source map collides too)
    stays equal to the server's table while its row-key map probes long chains."""
    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", 0)  # the row-key map is hashed at once
    monkeypatch.setattr(rowkeymap, "SORTED_MAX", 0)  # ... not sorted
    monkeypatch.setattr(hashmap.U64Map, "_home", lambda self, h: (h % np.uint64(3)).astype(np.int64) & self._mask)
    real = hashing.hash_column
    monkeypatch.setattr(hashing, "hash_column", lambda col, name="?": real(col, name) % np.uint64(2))
    rng = np.random.default_rng(5)
    src = RandomSource(graph, "keyed", rng, max_rows=60)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    by_sym = KeyedTable(graph, pa.schema([("Sym", pa.string()), ("Price", pa.float64())]), "Sym", name="by_sym")
    server.registry.add("by_sym", by_sym, "keyed", keys=["Sym"])
    live, live_sym = subscribe("src"), subscribe("by_sym")
    for cycle in range(80):
        src.step()
        if rng.random() < 0.7:
            syms = [WORDS[i] for i in rng.integers(0, len(WORDS), 3)]
            by_sym.upsert({"Sym": syms, "Price": rng.random(3)})
        graph.run_cycle()
        for view, table, name in ((live, src.table, "src"), (live_sym, by_sym, "by_sym")):
            assert view.wait_for(sequence=server.registry.get(name).publisher.sequence), f"cycle {cycle}"
            assert_view(view, table.to_arrow(), None, f"cycle {cycle}")
