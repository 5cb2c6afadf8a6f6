"""The differential layer (DESIGN.md §4): Z-sets, versions, traces, the translator to and
from table updates, upserts, and dataflow operators over Z-set batches.

Read in this order: :mod:`.version` (times and frontiers), :mod:`.zset` (batches of
``(record, time, diff)`` and their algebra), :mod:`.indexed` (batches indexed by key),
:mod:`.trace` (shared, compacting arrangements of them), :mod:`.linear` (map, filter,
flat_map, explode, negate, ``join_function``, temporal filter; fused), :mod:`.upsert`
(``(key, Optional[value])`` events to triples), :mod:`.translator` (table updates to
triples and back), then the dataflow: :mod:`.dataflow` (graph, inputs, frontiers,
scheduler, linear/concat/consolidate nodes, probes), :mod:`.join` (arrangements, delta
join), :mod:`.reduce` (count, sum, min, max, distinct), :mod:`.iterate` (fixed points with
``(version, iteration)`` times) and :mod:`.bridge` (live tables in and out).
"""

from engine.differential.bridge import CollectionTable as CollectionTable
from engine.differential.bridge import collection_to_table as collection_to_table
from engine.differential.bridge import to_collection as to_collection
from engine.differential.dataflow import Collection as Collection
from engine.differential.dataflow import Dataflow as Dataflow
from engine.differential.dataflow import InputHandle as InputHandle
from engine.differential.dataflow import Probe as Probe
from engine.differential.indexed import IndexedZSet as IndexedZSet
from engine.differential.indexed import index_with as index_with
from engine.differential.join import Arranged as Arranged
from engine.differential.join import join_stream as join_stream
from engine.differential.join import join_trace as join_trace
from engine.differential.linear import Expansion as Expansion
from engine.differential.linear import LinearOperator as LinearOperator
from engine.differential.reduce import distinct_trace as distinct_trace
from engine.differential.resolve import KeyedWrites as KeyedWrites
from engine.differential.resolve import resolve_triples as resolve_triples
from engine.differential.trace import Trace as Trace
from engine.differential.trace import TraceReader as TraceReader
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
    "Arranged",
    "Collection",
    "CollectionTable",
    "Dataflow",
    "Expansion",
    "Frontier",
    "IndexedZSet",
    "InputHandle",
    "KeyedWrites",
    "LinearOperator",
    "Probe",
    "Trace",
    "TraceReader",
    "Upsert",
    "Version",
    "ZSet",
    "apply_triples",
    "collection_to_table",
    "concat",
    "consolidate",
    "distinct_trace",
    "index_with",
    "join_stream",
    "join_trace",
    "minus",
    "negate",
    "plus",
    "resolve_triples",
    "snapshot_to_triples",
    "to_collection",
    "update_to_triples",
]
