"""Independent references for the differential tests: Z-sets as Python counters.

Per-row Python is fine here: it is the slow, obvious model the vectorized code is checked
against. Values are canonicalized the way records compare (NaN equals NaN, -0.0 equals
0.0, null equals null).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from engine.differential.zset import ZSet

SCHEMA = pa.schema([("Sym", pa.string()), ("K", pa.int64()), ("X", pa.float64())])
SYMS = np.array(["a", "b", "c", None], dtype=object)
XS = np.array([0.0, -0.0, 1.5, float("nan"), 2.5], dtype=float)


def canon(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if v == 0.0:
            return 0.0
    return v


def key(record: Iterable) -> tuple:
    return tuple(canon(v) for v in record)


def counter(z: ZSet, *, times: bool = True) -> Counter:
    """``{(record, time): weight}`` without zeros (time ``None`` when untimed or not asked)."""
    c: Counter = Counter()
    for rec, t, d in z.to_triples():
        c[(key(rec), t if times else None)] += d
    return Counter({k: w for k, w in c.items() if w != 0})


def from_counter(c: Counter) -> Counter:
    return Counter({k: w for k, w in c.items() if w != 0})


def random_batch(rng: np.random.Generator, n: int, *, times: tuple[int, ...] | None = (0,),
                 time_spread: int = 0, keys: int = 6, max_weight: int = 3) -> ZSet:
    """``n`` random updates over SCHEMA: nulls, NaN, -0.0, repeated records, weights in
    ``[-max_weight, max_weight] - {0}``, times ``times`` (+ up to ``time_spread`` per coordinate)."""
    sym = SYMS[rng.integers(0, SYMS.size, n)]
    k = rng.integers(0, keys, n)
    x = XS[rng.integers(0, XS.size, n)]
    x_null = rng.random(n) < 0.1
    data = pa.table({
        "Sym": pa.array(sym, pa.string()),
        "K": pa.array(k, pa.int64()),
        "X": pa.array(x, pa.float64(), mask=x_null),
    })
    w = rng.integers(1, max_weight + 1, n) * rng.choice([-1, 1], n)
    tm = None
    if times is not None:
        base = np.asarray(times, dtype=np.int64)
        tm = np.tile(base, (n, 1)) + (rng.integers(0, time_spread + 1, (n, base.size)) if time_spread else 0)
        tm = tm.astype(np.int64)
    return ZSet(data, w.astype(np.int64), tm)
