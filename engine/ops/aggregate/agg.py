"""The aggregation constructors under their short names, for ``tt.agg.sum(...)`` and friends.

``sum``, ``min`` and ``max`` shadow the builtins on purpose, inside this namespace only;
:mod:`engine.ops.aggregate.spec` defines them as ``sum_``, ``min_`` and ``max_``.

Examples
--------
>>> from engine.ops.aggregate import agg
>>> t.agg_by([agg.sum("Qty"), agg.count(), agg.std("Price", "PxStd")], by="Sym")
>>> t.agg_by([agg.median("Price"), agg.percentile("Price", 0.9, "P90"),
...           agg.weighted_avg("Price", "Qty", "VWAP")], by="Sym")
"""

from __future__ import annotations

from engine.ops.aggregate.spec import Agg as Agg
from engine.ops.aggregate.spec import abs_sum as abs_sum
from engine.ops.aggregate.spec import count as count
from engine.ops.aggregate.spec import count_distinct as count_distinct
from engine.ops.aggregate.spec import first as first
from engine.ops.aggregate.spec import last as last
from engine.ops.aggregate.spec import max_ as max  # noqa: A004
from engine.ops.aggregate.spec import mean as mean
from engine.ops.aggregate.spec import median as median
from engine.ops.aggregate.spec import min_ as min  # noqa: A004
from engine.ops.aggregate.spec import percentile as percentile
from engine.ops.aggregate.spec import std as std
from engine.ops.aggregate.spec import sum_ as sum  # noqa: A004
from engine.ops.aggregate.spec import var as var
from engine.ops.aggregate.spec import weighted_avg as weighted_avg
from engine.ops.aggregate.spec import weighted_sum as weighted_sum

__all__ = [
    "Agg",
    "abs_sum",
    "count",
    "count_distinct",
    "first",
    "last",
    "max",
    "mean",
    "median",
    "min",
    "percentile",
    "std",
    "sum",
    "var",
    "weighted_avg",
    "weighted_sum",
]
