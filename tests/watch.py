"""What a run is doing while it runs: failures the moment they happen, and a clock line.

A CI run that is cut off by its time limit prints neither pytest's failure summary nor its
durations, only dots: nothing says which test failed, whether the machine was slow all along
or one test hung. This plugin (loaded by ``tests/conftest.py``; on the controller under
pytest-xdist, which hears every worker's start and report) writes:

* ``[watch 12:34] FAILED <nodeid> (call, 3.2 s): <last line of the error>`` as soon as a test
  fails, so a cut-off log still names it;
* every :data:`TICK` seconds, ``[watch 10:00] 1,234 of 2,273 done, 0 failed; load 2.1/2.3/2.0;
  running: <nodeid> (1:02), ...; slowest since the last line: <nodeid> (41.1 s)``: the pace of
  the run, the machine's load average (a load far above the workers' count says the machine
  was shared), the tests in flight with how long each has run (a test that hangs is named
  while it hangs), and the longest test since the line before.

``TICKTABLE_WATCH_TICK`` sets the tick in seconds (``0`` turns the clock line off).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

#: seconds between two clock lines
TICK = float(os.environ.get("TICKTABLE_WATCH_TICK", "300"))


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Watch:
    """Tracks the tests in flight and the failures, and writes the lines above."""

    def __init__(self, config: pytest.Config, tick: float) -> None:
        self._config = config
        self._tick = tick
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}
        self._done = 0
        self._failed = 0
        self._total: int | None = None
        self._slowest: tuple[str, float] = ("", 0.0)  # the longest call since the last line
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd = os.dup(2)

    def start(self) -> None:
        if self._tick > 0:
            self._thread = threading.Thread(target=self._loop, name="watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the clock, with a last line (the run's end: its pace and longest test)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._write(self.status())
        os.close(self._fd)

    def _write(self, text: str) -> None:
        # to a copy of the terminal's stderr: pytest captures fds 1 and 2 during a test that
        # runs in this process, and the clock line comes from another thread
        line = f"\n[watch {_clock(time.monotonic() - self._start)}] {text}\n"
        with self._lock:
            os.write(self._fd, line.encode(errors="replace"))

    def _loop(self) -> None:
        while not self._stop.wait(self._tick):
            self._write(self.status())

    def status(self) -> str:
        """One line: how many tests are done and failed, and those still running."""
        now = time.monotonic()
        with self._lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
            done, failed, total = self._done, self._failed, self._total
            slowest, self._slowest = self._slowest, ("", 0.0)
        of = f" of {total:,}" if total is not None else ""
        flight = ", ".join(f"{nodeid} ({_clock(now - t0)})" for nodeid, t0 in running)
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        line = (f"{done:,}{of} done, {failed} failed; load {load}; running: "
                f"{flight or 'nothing'}")
        if slowest[0]:
            line += f"; slowest since the last line: {slowest[0]} ({slowest[1]:.1f} s)"
        return line

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._total = len(ids)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        with self._lock:
            self._running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            with self._lock:
                self._failed += 1
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = (crash.message if crash is not None else report.longreprtext).splitlines()
            last = lines[0].strip() if lines else ""
            self._write(f"FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s): "
                        f"{last[:300]}")
        if report.when == "call" and report.duration > self._slowest[1]:
            with self._lock:
                self._slowest = (report.nodeid, report.duration)
        if report.when == "teardown":
            with self._lock:
                self._running.pop(report.nodeid, None)
                self._done += 1


def pytest_configure(config: pytest.Config) -> None:
    """Register a :class:`Watch` in the process that reports: not in an xdist worker."""
    if hasattr(config, "workerinput"):
        return
    watch = Watch(config, TICK)
    config.pluginmanager.register(watch, "ticktable-watch")
    watch.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    watch = config.pluginmanager.get_plugin("ticktable-watch")
    if watch is not None:
        watch.stop()
