"""The differential layer (DESIGN.md §4): Z-sets, versions, traces, the translator to and
from table updates, upserts, and dataflow operators over Z-set batches.

Read in this order: :mod:`.version` (times and frontiers), :mod:`.zset` (batches of
``(record, time, diff)`` and their algebra), :mod:`.trace` (indexed batches and shared,
compacting arrangements), :mod:`.linear` (map, filter, flat_map, explode, negate,
``join_function``, temporal filter; fused), :mod:`.upsert` (``(key, Optional[value])``
events to triples) and :mod:`.translator` (table updates to triples and back).
"""

from engine.differential.linear import Expansion as Expansion
from engine.differential.linear import LinearOperator as LinearOperator
from engine.differential.trace import IndexedZSet as IndexedZSet
from engine.differential.trace import Trace as Trace
from engine.differential.trace import TraceReader as TraceReader
from engine.differential.trace import index_with as index_with
from engine.differential.translator import apply_triples as apply_triples
from engine.differential.translator import snapshot_to_triples as snapshot_to_triples
from engine.differential.translator import update_to_triples as update_to_triples
from engine.differential.upsert import Upsert as Upsert
from engine.differential.version import Antichain as Antichain
from engine.differential.version import Frontier as Frontier
from engine.differential.version import Version as Version
from engine.differential.zset import ZSet as ZSet
from engine.differential.zset import concat as concat
from engine.differential.zset import consolidate as consolidate
from engine.differential.zset import minus as minus
from engine.differential.zset import negate as negate
from engine.differential.zset import plus as plus

__all__ = [
    "Antichain",
    "Expansion",
    "Frontier",
    "IndexedZSet",
    "LinearOperator",
    "Trace",
    "TraceReader",
    "Upsert",
    "Version",
    "ZSet",
    "apply_triples",
    "concat",
    "consolidate",
    "index_with",
    "minus",
    "negate",
    "plus",
    "snapshot_to_triples",
    "update_to_triples",
]
