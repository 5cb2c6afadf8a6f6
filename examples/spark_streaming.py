"""Stream Spark's ``rate`` source into a Ticktable table.

Start a server first (``make run`` or ``ticktable serve``), then::

    python examples/spark_streaming.py --uri grpc://127.0.0.1:8815 --seconds 20

(``--seconds 0`` runs until interrupted.)
and watch the table live from pandas (``tt.connect(uri).subscribe("ticks")``). Each
micro-batch becomes visible at once; run it again with the same ``--checkpoint`` and the
query resumes where it stopped, a replayed micro-batch being applied only once.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading

from pyspark.sql.streaming import StreamingQueryListener

from clients.spark import local_session


class _FirstRows(StreamingQueryListener):
    """Sets ``arrived`` when a micro-batch with rows has been written."""

    def __init__(self) -> None:
        self.arrived = threading.Event()

    # Spark's listener interface (its method names)
    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        if event.progress.numInputRows > 0:
            self.arrived.set()

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.arrived.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uri", default="grpc://127.0.0.1:8815")
    ap.add_argument("--table", default="ticks")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="run this long after the first rows arrive, then stop (0: run until "
                         "interrupted)")
    ap.add_argument("--rows-per-second", type=int, default=100)
    ap.add_argument("--checkpoint", default=None,
                    help="checkpoint folder, kept to resume from (default: a new one, removed "
                         "at the end)")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    spark = local_session("ticktable-spark-streaming", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    first = _FirstRows()
    spark.streams.addListener(first)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="ticktable-ckpt-")
    query = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second)
             .load()
             .writeStream.format("ticktable").option("uri", args.uri)
             .option("checkpointLocation", checkpoint)  # the stream id lives here
             .trigger(processingTime="500 milliseconds")
             .start(args.table))
    print(f"streaming into {args.table!r} at {args.uri} (checkpoint {checkpoint})")
    try:
        if args.seconds > 0:
            first.arrived.wait()  # the query starts slowly: count the seconds from its first rows
            threading.Event().wait(args.seconds)
        else:
            query.awaitTermination()
    except KeyboardInterrupt:
        pass
    query.stop()
    progress = query.lastProgress or {}
    back = spark.read.format("ticktable").option("uri", args.uri).load(args.table)
    print(f"stopped after batch {progress.get('batchId')}; {args.table!r} holds "
          f"{back.count()} rows")
    spark.stop()
    if args.checkpoint is None:  # nobody can resume from a folder only this run knew
        shutil.rmtree(checkpoint, ignore_errors=True)


if __name__ == "__main__":
    main()
