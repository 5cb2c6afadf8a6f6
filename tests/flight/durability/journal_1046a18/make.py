"""Write this fixture again from a tree: ``PYTHONPATH=<tree> python make.py OUT``.

A durable server of that tree takes appends, upserts, an upsert with a delete marker, a
delete, a committed staged write and a derived ``agg_by`` table, then stops without its
shutdown checkpoint. ``OUT/data`` is its data dir; ``OUT/expected/<table>.arrow`` each table
as it held it (rows in row order, row keys in ``__row_key``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import ticktable as tt
from engine.graph import UpdateGraph
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer


def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    g = UpdateGraph()
    srv = TicktableServer(g, ServerConfig(port=0, data_dir=out / "data",
                                          checkpoint_seconds=3600)).start()
    g.start(0.02)
    c = tt.connect(f"grpc://127.0.0.1:{srv.port}")
    c.push("trades", pd.DataFrame({"id": [1, 2, 3, 4], "sym": ["A", "B", "A", "C"],
                                   "px": [10.0, 60.0, 70.5, 5.0]}), mode="upsert", keys=["id"])
    c.push("trades", pd.DataFrame({"id": [2, 5], "sym": ["B", "C"], "px": [61.0, 80.0]}),
           mode="upsert", keys=["id"])
    c.push("log", pd.DataFrame({"seq": list(range(20)), "msg": [f"m{i}" for i in range(20)]}),
           mode="append")
    c.push("log", pd.DataFrame({"seq": [20, 21], "msg": ["x", None]}), mode="append")
    big = c.table("trades").where(pc.field("px") > 50).agg_by(
        [tt.agg.count("n"), tt.agg.sum("px", "total")], "sym")
    derived = big.name  # created here, outside the lock below
    schema = pa.schema([("seq", pa.int64()), ("msg", pa.string())])
    srv.puts.put("log", pb.PutRequest(mode=pb.PUT_MODE_APPEND, write_id="w1"),
                 pa.table({"seq": [100, 101], "msg": ["s1", "s2"]}, schema=schema).to_batches(),
                 lambda ack: None)
    assert srv.action("commit", pb.CommitRequest(write_id="w1", all_slots=True)
                      .SerializeToString()) is not None
    c.push("trades", pd.DataFrame({"id": [3]}), mode="delete")
    c.push("trades", pd.DataFrame({"id": [1, 6], "sym": ["A", "D"], "px": [55.0, 1.0],
                                   "__delete": [True, False]}), mode="upsert")
    time.sleep(0.3)
    (out / "expected").mkdir()
    with g.shared_lock():
        for name in ["log", "trades", derived]:
            t = srv.registry.get(name).table
            data = t.to_arrow().append_column("__row_key", pa.array(t.rowset.keys(), pa.int64()))
            with pa.ipc.new_file(out / "expected" / f"{name}.arrow", data.schema) as w:
                w.write_table(data)
    srv.durability.close(checkpoint=False)
    srv.shutdown()
    g.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
