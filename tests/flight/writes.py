"""Shared by the DoPut and staging tests: an Env without a server, and batch builders."""

from __future__ import annotations

import pyarrow as pa

from engine.graph import UpdateGraph
from flight.ingest.put import PutHandler
from flight.ingest.staging import StagingArea
from flight.pb import flight_pb2 as pb
from flight.streams.registry import TableRegistry

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])
COMPOSITE = pa.schema([("sym", pa.string()), ("n", pa.int32()), ("v", pa.float64())])

APPEND, UPSERT, DELETE, DIFF = (pb.PUT_MODE_APPEND, pb.PUT_MODE_UPSERT, pb.PUT_MODE_DELETE,
                                pb.PUT_MODE_DIFF)


class Env:
    """A graph (validate=True), a registry, its staging area and DoPut handler; no server."""

    def __init__(self, **kw):
        self.graph = UpdateGraph(validate=True)
        self.registry = TableRegistry(self.graph)
        self.staging = StagingArea(self.registry, **kw)
        self.puts = PutHandler(self.registry, self.staging)
        self.updates: dict[str, list[tuple[int, object]]] = {}

    def create(self, name, kind="keyed", schema=KV, keys=("k",), capacity=0):
        e = self.registry.create_source(name, schema, kind, keys=list(keys) if kind == "keyed" else None,
                                        capacity=capacity)
        seen = self.updates.setdefault(name, [])
        e.table.listen(lambda u, t: seen.append((t.graph.step, u)))
        return e.table

    def put(self, name, mode, *batches, write_id="", partition=0, attempt=0):
        acks = []
        req = pb.PutRequest(mode=mode, write_id=write_id, partition=partition, attempt=attempt)
        total = self.puts.put(name, req, [batch(b) for b in batches], acks.append)
        assert total == sum(a.rows for a in acks)
        return acks

    def commit(self, write_id, slots=(), all_slots=False, **kw):
        req = pb.CommitRequest(write_id=write_id, all_slots=all_slots,
                               slots=[pb.StageSlot(partition=p, attempt=a) for p, a in slots], **kw)
        return self.staging.commit(req)

    def rows(self, name):
        t = self.registry.get(name).table
        return t.to_arrow().to_pylist()

    def keyed(self, name, key="k"):
        return {r[key]: r for r in self.rows(name)}


def batch(b):
    if isinstance(b, pa.RecordBatch):
        return b
    if isinstance(b, pa.Table):
        return b.combine_chunks().to_batches()[0] if b.num_rows else pa.RecordBatch.from_pylist([], b.schema)
    return pa.RecordBatch.from_pydict(b)


def kv(k, s, v, **extra):
    cols = {"k": pa.array(k, pa.int64()), "s": pa.array(s, pa.string()), "v": pa.array(v, pa.float64())}
    for name, values in extra.items():
        cols[name] = pa.array(values, pa.bool_() if name == "__delete" else pa.int64())
    return pa.record_batch(cols)


def row(k, s, v):
    return {"k": k, "s": s, "v": v}


def diff(k, s, v, d, time_=None, ktype=None):
    b = {"k": pa.array(k, ktype or pa.int64()), "s": pa.array(s, pa.string()), "v": pa.array(v, pa.float64()),
         "__diff": pa.array(d, pa.int64())}
    if time_ is not None:
        b["__time"] = pa.array(time_, pa.int64())
    return pa.record_batch(b)
