import asyncio
import contextlib
import faulthandler
import os
import random
import sys
from collections.abc import Iterator
from typing import TextIO

import pytest
from hypothesis import HealthCheck, settings

from bench.ports import HeldPort

#: failures named the moment they happen, and a clock line with the tests in flight
pytest_plugins = ("tests.watch", "pytester")

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The server decodes Flight bodies without a copy, so their buffers are as aligned as
# protobuf's framing left them; Acero's aggregation and join kernels may assume alignment.
# Any test that hands Acero a misaligned buffer fails (Arrow reads this at Acero's first
# check; spawned servers inherit it).
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "error")


#: seconds after its start that a test still running is ended from C: every thread's stack is
#: printed and its process exits (pytest-xdist then names the test, and replaces the worker).
#: pytest-timeout's signal fails a hung test first (``timeout`` in pyproject.toml: 300 s); this
#: is for a hang its signal handler cannot break, a deadlock holding the GIL in C
HARD_LIMIT = 420.0
_stderr: TextIO | None = None


#: a seed hunt (tests/seeds.py): every seeded ``np.random.default_rng`` mixed with this number
SEED_MIX = os.environ.get("TICKTABLE_SEED_MIX", "")
if SEED_MIX:
    from tests.seeds import install

    install(int(SEED_MIX))


#: a test-order hunt: every test but Spark's (still first) in an order drawn from this number,
#: the same in every xdist worker; for state a test leaves behind that a later one trips on
TEST_ORDER = os.environ.get("TICKTABLE_TEST_ORDER", "")


def pytest_report_header(config):
    lines = [f"seed mix: TICKTABLE_SEED_MIX={SEED_MIX}"] if SEED_MIX else []
    if TEST_ORDER:
        lines.append(f"test order: TICKTABLE_TEST_ORDER={TEST_ORDER}")
    return lines or None


def pytest_configure(config):
    """Keep a copy of the terminal's stderr: pytest captures fd 2 during each test, and what
    a process writes there just before it exits would be lost with the capture."""
    global _stderr
    _stderr = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


def pytest_unconfigure(config):
    global _stderr
    if _stderr is not None:
        _stderr.close()
        _stderr = None


def hard_limit(item: pytest.Item) -> float:
    """:data:`HARD_LIMIT`, or for a test given a longer ``timeout`` mark (pytest-timeout's),
    that timeout plus the same two minutes' margin."""
    mark = item.get_closest_marker("timeout")
    if mark is None or not mark.args:
        return HARD_LIMIT
    return max(HARD_LIMIT, float(mark.args[0]) + 120.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm :data:`HARD_LIMIT` around each test (faulthandler's watchdog is a C thread: it
    needs no GIL)."""
    faulthandler.dump_traceback_later(hard_limit(item), exit=True, file=_stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


WEB = "tests/web/"


@contextlib.contextmanager
def _no_borrowed_loop(item: pytest.Item) -> Iterator[None]:
    """Outside tests/web, no event loop runs in the main thread while ``item`` runs.

    The web tests' session-scoped ``browser`` is Playwright's sync API: its event loop runs
    in a greenlet of the main thread and stays the thread's running loop from the first web
    test to the worker's end. A later test calling ``asyncio.run`` in that worker failed
    ("cannot be called from a running event loop"): five tests of tests/clients and
    tests/flight/rpc whenever a worker ran a web test first (``make test``'s order runs
    tests/web last; ``pytest tests/web tests/clients`` did not). The loop is put aside for
    a test outside tests/web and put back after it.
    """
    loop = asyncio._get_running_loop()
    if loop is None or item.nodeid.startswith(WEB):
        yield
        return
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(loop)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_borrowed_loop(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_borrowed_loop(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None:  # the session's fixtures end here: the browser's with its loop
        yield
        return
    with _no_borrowed_loop(item):
        yield


def pytest_collection_modifyitems(config, items):
    """Run the Spark tests first.

    Their session fixture starts Spark's JVM with ``subprocess.Popen(preexec_fn=...)``: a fork
    that runs Python in the child before ``exec``. Late in a run this process holds dozens of
    gRPC and server threads, and in one CI-like run (a fresh clone, 2026-11-28) the launcher
    died between fork and exec, silently, and every Spark test errored; the same tests passed
    alone and in two earlier full runs. Forking before the other tests start their servers
    keeps that hazard out of the run. Under pytest-xdist (``make test``: ``-n auto --dist
    loadgroup``) they are one group: one worker, one JVM, its first tests (the group is made
    by :func:`pytest_xdist_make_scheduler`).

    With ``TICKTABLE_TEST_ORDER=N`` the other tests follow in an order drawn from ``N``.
    """
    spark = [item for item in items if "/tests/spark/" in str(item.path)]
    rest = [item for item in items if "/tests/spark/" not in str(item.path)]
    if TEST_ORDER:
        random.Random(int(TEST_ORDER)).shuffle(rest)
    items[:] = spark + rest


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the Spark tests one group, known by their path.

    They were marked ``xdist_group("spark")``, but pytest-xdist's loadgroup carries a test's
    group in its node id (``...@spark``), which pytest 9.2 no longer lets a plugin change
    (pytest-xdist issue #1386): every Spark test went its own way and both workers started a
    JVM (8.5 s each, in a fresh-clone CI's durations). ``xdist_group`` marks, if any, still
    group as before.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if nodeid.startswith(SPARK) else super()._split_scope(nodeid)

    return Scheduling(config, log)


SPARK = "tests/spark/"


@pytest.fixture
def held_port() -> Iterator[HeldPort]:
    """A port for servers the test starts on it later (or never: connections are refused),
    kept from every other process until the test ends (:class:`bench.ports.HeldPort`)."""
    with HeldPort() as held:
        yield held
