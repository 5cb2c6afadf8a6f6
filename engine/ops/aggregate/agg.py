"""The aggregation constructors under their short names, for ``tt.agg.sum(...)`` and friends.

``sum``, ``min`` and ``max`` shadow the builtins on purpose, inside this namespace only;
:mod:`engine.ops.aggregate` defines them as ``sum_``, ``min_`` and ``max_``.

Examples
--------
>>> from engine.ops.aggregate import agg
>>> t.agg_by([agg.sum("Qty"), agg.count(), agg.std("Price", "PxStd")], by="Sym")
"""

from __future__ import annotations

from engine.ops.aggregate.listener import Agg as Agg
from engine.ops.aggregate.listener import count as count
from engine.ops.aggregate.listener import count_distinct as count_distinct
from engine.ops.aggregate.listener import first as first
from engine.ops.aggregate.listener import last as last
from engine.ops.aggregate.listener import max_ as max  # noqa: A004
from engine.ops.aggregate.listener import mean as mean
from engine.ops.aggregate.listener import min_ as min  # noqa: A004
from engine.ops.aggregate.listener import std as std
from engine.ops.aggregate.listener import sum_ as sum  # noqa: A004

__all__ = ["Agg", "count", "count_distinct", "first", "last", "max", "mean", "min", "std", "sum"]
