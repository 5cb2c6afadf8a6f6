"""One local SparkSession for every Spark test, a real server per test, a pandas subscriber.

The session is ``local[2,4]``: two task threads and up to four attempts per task, so a task
that fails is retried (plain ``local[2]`` fails the job at the first task failure). Small
shuffles and no UI keep it quick; starting it costs ~15 s, paid once per run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from clients.spark import local_session

    session = local_session("ticktable-tests", "local[2,4]", conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.stopTimeout": "30s",
    })
    session.sparkContext.setLogLevel("ERROR")  # expected task failures would log stack traces
    yield session
    session.stop()


@pytest.fixture
def server() -> Iterator[TicktableServer]:
    """A server whose graph runs cycles every 50 ms, so commits become visible by themselves."""
    graph = UpdateGraph(validate=True)
    graph.start(0.05)
    srv = TicktableServer(graph, ServerConfig(port=0)).start()
    yield srv
    srv.shutdown()
    graph.stop()


class Subscriber:
    """A pandas subscriber: a :class:`~clients.live.LiveTable` plus ``wait(pred)``.

    ``wait(pred)`` blocks until the predicate over the live table holds (or fails the test
    after ``timeout`` seconds); ``frame()`` is the live DataFrame.
    """

    def __init__(self, location: str, table: str) -> None:
        import ticktable as tt

        self.client = tt.connect(location)
        self._changed = threading.Condition()
        self.live = self.client.subscribe(table, on_update=self._notify)

    def _notify(self, update: Any) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait(self, pred: Callable[[Any], bool], timeout: float = 60.0) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: self.live.error is not None or pred(self.live),
                                        timeout)
        if self.live.error is not None:
            raise AssertionError("the subscription failed") from self.live.error
        assert ok, f"subscriber: condition not reached in {timeout} s (size {self.live.size})"

    def frame(self) -> Any:
        """The live table as a pandas DataFrame."""
        return self.live.df

    def close(self) -> None:
        self.client.close()  # closes the subscription too


@pytest.fixture
def subscribe(server: TicktableServer) -> Iterator[Callable[[str], Subscriber]]:
    subs: list[Subscriber] = []

    def open_(table: str) -> Subscriber:
        subs.append(Subscriber(server.location, table))
        return subs[-1]

    yield open_
    for s in subs:  # before the server shuts down: an open stream would hold it up
        s.close()
