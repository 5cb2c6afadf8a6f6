"""Write a Spark DataFrame into a Ticktable server, read it back, and push a small one.

Start a server first (``make run`` or ``ticktable serve``), then::

    python examples/spark_batch.py --uri grpc://127.0.0.1:8815 --rows 1000000

Every executor task streams its partition straight to the server; the job's rows become
visible together, in one server cycle, when Spark commits the job.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import functions as F

from clients.spark import local_session, push


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uri", default="grpc://127.0.0.1:8815")
    ap.add_argument("--table", default="trades")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    spark = local_session("ticktable-spark-batch", args.master)  # registers format("ticktable")
    spark.sparkContext.setLogLevel("ERROR")
    trades = spark.range(args.rows).select(
        F.col("id"),
        F.concat(F.lit("SYM"), F.lpad((F.col("id") % 500).cast("string"), 3, "0")).alias("sym"),
        (100 + F.rand(seed=1) * 10).alias("px"),
        (F.col("id") % 100 + 1).alias("qty"))

    t = time.perf_counter()
    (trades.write.format("ticktable").mode("append")  # Spark needs an explicit save mode
     .option("uri", args.uri).option("keys", "id")     # created keyed on id when missing
     .save(args.table))
    took = time.perf_counter() - t
    print(f"wrote {args.rows:,} rows into {args.table!r} in {took:.2f} s")

    back = spark.read.format("ticktable").option("uri", args.uri).load(args.table)
    print(f"{args.table!r} now holds {back.count()} rows; per symbol:")
    back.groupBy("sym").agg(F.sum("qty").alias("qty")).orderBy("sym").show(5)

    summary = push(trades.limit(1000), args.uri, f"{args.table}_sample")
    print(f"pushed {summary.rows} rows into {args.table + '_sample'!r} from the driver")
    spark.stop()


if __name__ == "__main__":
    main()
