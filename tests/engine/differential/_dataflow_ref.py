"""Shared helpers for the dataflow tests: random input changes and from-scratch references
as Python counters (per-row Python is fine here: it is the slow, obvious model)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from engine.differential.zset import ZSet


def as_counter(z: ZSet) -> Counter:
    c: Counter = Counter()
    for rec, _, d in z.to_triples():
        c[rec] += d
    return Counter({k: w for k, w in c.items() if w != 0})


def batch(schema: pa.Schema, rows: list[tuple], weights: list[int], time: int) -> ZSet:
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    data = pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema, strict=True)],
                                schema=schema)
    return ZSet(data, np.asarray(weights, dtype=np.int64)).with_time(time)


class RandomInput:
    """A collection changed at random: inserts (weights up to 3), deletes of held records,
    and now and then negative weights for records not held."""

    def __init__(self, rng: np.random.Generator, schema: pa.Schema, make_record) -> None:
        self.rng = rng
        self.schema = schema
        self.make = make_record
        self.state: Counter = Counter()

    def change(self, n: int, time: int) -> ZSet:
        rng = self.rng
        rows: list[tuple] = []
        ws: list[int] = []
        held = [k for k, w in self.state.items() if w != 0]
        for _ in range(n):
            r = rng.random()
            if r < 0.35 and held:
                rec = held[int(rng.integers(len(held)))]
                w = -self.state[rec] if rng.random() < 0.7 else -1
            elif r < 0.45:
                rec, w = self.make(rng), -int(rng.integers(1, 3))
            else:
                rec, w = self.make(rng), int(rng.integers(1, 4))
            if w == 0:
                continue
            rows.append(rec)
            ws.append(w)
            self.state[rec] += w
        self.state = Counter({k: w for k, w in self.state.items() if w != 0})
        return batch(self.schema, rows, ws, time)


def ref_join(a: Counter, b: Counter, ka: int = 0, kb: int = 0) -> Counter:
    """Join on column ``ka`` of ``a``'s records and ``kb`` of ``b``'s; b's key dropped."""
    by: dict = {}
    for rb, wb in b.items():
        by.setdefault(rb[kb], []).append((rb[:kb] + rb[kb + 1:], wb))
    out: Counter = Counter()
    for ra, wa in a.items():
        for rest, wb in by.get(ra[ka], []):
            out[ra + rest] += wa * wb
    return Counter({k: w for k, w in out.items() if w != 0})


def ref_reduce(c: Counter, key: int, fn: str, col: int | None = None) -> Counter:
    groups: dict = {}
    for rec, w in c.items():
        groups.setdefault(rec[key], []).append((rec, w))
    out: Counter = Counter()
    for k, recs in groups.items():
        if fn in ("count", "sum"):
            total = sum(w for _, w in recs)
            if total == 0:
                continue
            out[(k, total if fn == "count" else sum(w * r[col] for r, w in recs))] += 1
        else:
            vals = [r[col] for r, w in recs if w > 0]
            if vals:
                out[(k, min(vals) if fn == "min" else max(vals))] += 1
    return out


def ref_distinct(c: Counter) -> Counter:
    return Counter({k: 1 for k, w in c.items() if w > 0})


class Accumulated:
    """A probe's output accumulated incrementally (draining it after every step)."""

    def __init__(self, probe) -> None:
        self.probe = probe
        self.value: Counter = Counter()

    def update(self) -> Counter:
        self.value.update(as_counter(self.probe.drain()))
        self.value = Counter({k: w for k, w in self.value.items() if w != 0})
        return self.value
