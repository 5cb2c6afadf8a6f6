"""Aggregation by group: ``agg_by``, ``first_by``, ``last_by``, ``count_by``.

Modules: :mod:`.listener` (the verbs and the listener), :mod:`.spec` (the spec
:class:`Agg` and its constructors), :mod:`.agg` (the constructors under their short
names, ``tt.agg.sum(...)``), :mod:`._kinds` (the registry: one class per aggregation kind),
:mod:`._states` and :mod:`._sums` (per-group states), :mod:`._addonly` (the states of
min, max, first and last over an add-only parent), :mod:`._sortedset` and :mod:`._bits`
(per-group sorted sets behind min, max, median, percentile, first and last) and
:mod:`._keys` (reading values, hashing group keys, order-preserving encodings);
:mod:`._ordered` holds the rows of each group in the order of a column (sorted_first and
sorted_last; over an add-only parent, :mod:`._addonly`).
"""

from engine.ops.aggregate import agg as agg
from engine.ops.aggregate.listener import AggListener as AggListener
from engine.ops.aggregate.listener import agg_by as agg_by
from engine.ops.aggregate.listener import count_by as count_by
from engine.ops.aggregate.listener import first_by as first_by
from engine.ops.aggregate.listener import last_by as last_by
from engine.ops.aggregate.spec import Agg as Agg

__all__ = ["Agg", "AggListener", "agg", "agg_by", "count_by", "first_by", "last_by"]
