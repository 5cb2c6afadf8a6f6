"""A Structured Streaming query survives a SIGKILL of a durable server without duplicates.

The server is a real ``ticktable serve --data-dir`` subprocess (``bench.crash.ServerProcess``,
checkpoints every half second), killed with SIGKILL between micro-batches and restarted on
the same data dir and port. The query, restarted from its checkpoint location, replays its
last micro-batch: the server, which applied that batch before the kill, must refuse it
(the stream's batch ids are durable), and every row must be there exactly once.

The server logs at DEBUG (``-v``) to a file: its INFO lines after recovery say which
micro-batches it committed and which replay it refused, which is how this test sees inside
the subprocess.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import ticktable as tt
from bench.crash import ServerProcess

# PySpark 4.x warns that it "does not yet fully support pandas >= 3.0.0" (see test_spark.py).
pytestmark = pytest.mark.filterwarnings(
    "ignore:PySpark does not yet fully support pandas:FutureWarning")

TICKS = pa.schema([("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.int64())])
_COMMITTED = re.compile(r"committed write 'spark-[0-9a-f]+-(\d+)'")


def _until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``pred`` (another process's state) until it holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()  # never set: a bounded pause between polls
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:.0f} s"
        tick.wait(0.2)


def _served(server: ServerProcess) -> str:
    """What the server logged since it recovered (recovery logs the commits it replays)."""
    text = server.log_path.read_text(errors="replace")
    return text[text.find("flight.durability.durable: recovered:"):]


def _committed(server: ServerProcess) -> list[int]:
    """The micro-batch ids the server committed (applied) since it recovered."""
    return [int(b) for b in _COMMITTED.findall(_served(server))]


def _size(uri: str) -> int:
    with tt.connect(uri, timeout=10) as client:
        t = client.snapshot("ticks", as_="arrow")
        assert isinstance(t, pa.Table)
        return int(t.num_rows)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.kill()


def test_a_streaming_query_survives_a_server_sigkill_without_duplicates(spark, servers,
                                                                         tmp_path, held_port):
    port = held_port.port  # the restarted server's too: Spark's URI stays
    data, checkpoint = tmp_path / "data", tmp_path / "spark-checkpoint"

    def serve(name: str) -> ServerProcess:
        server = ServerProcess(data, tmp_path / f"{name}.log", port=port, verbose=True)
        servers.append(server)
        return server

    def query() -> Any:
        return (spark.readStream.format("rate").option("rowsPerSecond", 100)
                .option("numPartitions", 2).load()
                .writeStream.format("ticktable").option("uri", uri)
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="300 milliseconds").start("ticks"))

    a = serve("a")
    uri = a.location
    with tt.connect(uri, timeout=10) as client:
        client.create_table("ticks", TICKS, "append")
    q = query()
    _until(lambda: len(set(_committed(a))) >= 3, 60, "three micro-batches committed")
    q.stop()
    first_id = q.id
    # Settle: a commit the stop interrupted may still be landing on the server.
    sizes = [_size(uri)]

    def quiet() -> bool:
        sizes.append(_size(uri))
        return sizes[-1] == sizes[-2]

    _until(quiet, 10, "a quiet table")
    before = sizes[-1]
    done = max(_committed(a))
    a.kill()  # SIGKILL: no shutdown checkpoint

    # Make Spark forget the last micro-batch the server applied, as if the query died before
    # writing its commit log: the restarted query runs it again with the same offsets.
    # Batches planned after it are forgotten too (the commit log must trail the offsets by
    # one). A batch the server applied but Spark never logged is replayed anyway.
    for log_dir, first in (("commits", done), ("offsets", done + 1)):
        for p in (checkpoint / log_dir).iterdir():
            if p.name.isdigit() and int(p.name) >= first:
                p.unlink()
                (checkpoint / log_dir / f".{p.name}.crc").unlink(missing_ok=True)

    b = serve("b")
    assert b.location == uri
    assert _size(uri) == before  # every acknowledged micro-batch survived the SIGKILL
    q = query()
    try:
        _until(lambda: any(x > done for x in _committed(b)), 60, "a new micro-batch committed")
    finally:
        q.stop()
    assert q.id == first_id and q.exception() is None  # the same stream, resumed
    log = _served(b)
    assert re.search(rf"batch {done} of stream 'spark-{first_id}' was already applied", log), \
        f"the replay of batch {done} was not refused"
    assert done not in _committed(b)
    with tt.connect(uri, timeout=10) as client:
        t = client.snapshot("ticks", as_="arrow")
    assert isinstance(t, pa.Table)
    values = np.sort(t.column("value").to_numpy())
    assert values.size > before
    np.testing.assert_array_equal(values, np.arange(values.size))  # each row once, no gaps
