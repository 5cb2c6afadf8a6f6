"""A mirror's CPU per upstream message, by piece, in one process (issue #37's hop goal).

What a chain mirror does with each delta of ``bench_links.py --sections chain`` (1,000 rows
of a 1M-key keyed table, every value column modified), without the network:

- ``link``: the link's decode and staging of the message (:meth:`flight.links.Link._apply`:
  the metadata parsed, its row sets, one :class:`~engine.sources.ReplicaChange` staged);
- ``cycle``: the cycle that applies it (:class:`~engine.sources.ReplicaTable`);
- ``delta``: the message built for the mirror's own subscribers and downstream links
  (:meth:`flight.streams.codec.DeltaCodec.delta`, the link's status in it).

Each is ``time.thread_time`` per message; the first fifth of the messages are left out.

Run: PYTHONPATH=. python bench/bench_link_pieces.py [MESSAGES]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyarrow as pa

from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.sources import ReplicaTable
from engine.update import TableUpdate
from flight.links.link import Link
from flight.links.spec import MirrorSpec
from flight.pb import flight_pb2 as pb
from flight.streams.codec import DeltaCodec

KEYS = 1_000_000
ROWS = 1_000
SCHEMA = pa.schema([("k", pa.int64()), ("seq", pa.int64()), ("sent_ns", pa.int64()),
                    ("px", pa.float64()), ("qty", pa.int64())])


def _rows(rng: np.random.Generator, keys: np.ndarray, seq: int) -> pa.Table:
    n = keys.size
    return pa.table({"k": keys, "seq": np.full(n, seq, np.int64), "sent_ns": np.full(n, seq, np.int64),
                     "px": rng.random(n) * 100, "qty": rng.integers(1, 1000, n, dtype=np.int64)},
                    schema=SCHEMA)


def main(messages: int) -> None:
    rng = np.random.default_rng(1)
    g = UpdateGraph()
    r = ReplicaTable(g, SCHEMA, name="t")
    keys = np.arange(KEYS, dtype=np.int64)
    r.reset(keys, _rows(rng, keys, -1), position=("e", 0))
    g.run_cycle()
    link = Link(g, MirrorSpec(uri="grpc://127.0.0.1:1", table="t"), table=r)  # never started
    got: list[TableUpdate] = []
    r.listen(lambda u, _t: got.append(u))
    codec = DeltaCodec(r, epoch="e2", format=pb.DELTA_FORMAT_UPDATES, columns=SCHEMA.names,
                       viewport=None, batch_rows=65536, status=link.status)
    msgs = []  # as the origin sends them: 1,000 keys modified, every value column
    for i in range(messages):
        k = np.sort(rng.choice(KEYS, ROWS, replace=False)).astype(np.int64)
        rows = RowSet.from_keys(k, assume_sorted=True).serialize()
        meta = pb.UpdateMetadata(epoch="e", step=i + 1, table_size=KEYS, sequence=i + 1,
                                 format=pb.DELTA_FORMAT_UPDATES, columns=SCHEMA.names,
                                 coalesced=1, modified_data_rows=rows, num_modified_batches=1)
        meta.modified.extend(pb.ColumnModified(column=c, rows=rows) for c in SCHEMA.names[1:])
        msgs.append((meta.SerializeToString(), _rows(rng, k, i)))
    empty = SCHEMA.empty_table()
    tt = time.thread_time
    parts: dict[str, list[float]] = {"link": [], "cycle": [], "delta": []}
    for i, (data, modified) in enumerate(msgs):
        t0 = tt()
        meta = pb.UpdateMetadata()
        meta.ParseFromString(data)
        link._apply(r, meta, empty, modified, False)
        t1 = tt()
        g.run_cycle()
        t2 = tt()
        codec.delta(got.pop(), held=None, sequence=i + 1, step=i + 1, count=1)
        t3 = tt()
        parts["link"].append(t1 - t0)
        parts["cycle"].append(t2 - t1)
        parts["delta"].append(t3 - t2)
    skip = messages // 5
    total = np.sum([np.array(v) for v in parts.values()], axis=0)
    for name, v in [*parts.items(), ("total", list(total))]:
        x = np.array(v[skip:]) * 1e6
        print(f"{name:6s} median {np.median(x):7.1f} us  mean {x.mean():7.1f}  "
              f"p99 {np.percentile(x, 99):7.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
