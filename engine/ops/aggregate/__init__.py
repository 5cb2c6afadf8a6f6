"""Aggregation by group: ``agg_by``, ``first_by``, ``last_by``, ``count_by``.

Modules: :mod:`.listener` (the verbs, :class:`Agg` and the listener), :mod:`.agg` (the
aggregation constructors under their short names, ``tt.agg.sum(...)``), :mod:`._states`
(per-group states), :mod:`._sortedset` (per-group sorted sets behind min, max, first and
last) and :mod:`._keys` (reading values, hashing group keys, order-preserving encodings).
"""

from engine.ops.aggregate import agg as agg
from engine.ops.aggregate.listener import Agg as Agg
from engine.ops.aggregate.listener import AggListener as AggListener
from engine.ops.aggregate.listener import agg_by as agg_by
from engine.ops.aggregate.listener import count_by as count_by
from engine.ops.aggregate.listener import first_by as first_by
from engine.ops.aggregate.listener import last_by as last_by

__all__ = ["Agg", "AggListener", "agg", "agg_by", "count_by", "first_by", "last_by"]
