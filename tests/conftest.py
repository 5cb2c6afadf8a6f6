import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from bench.ports import HeldPort

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


def pytest_collection_modifyitems(config, items):
    """Run the Spark tests first.

    Their session fixture starts Spark's JVM with ``subprocess.Popen(preexec_fn=...)``: a fork
    that runs Python in the child before ``exec``. Late in a run this process holds dozens of
    gRPC and server threads, and in one CI-like run (a fresh clone, 2026-11-28) the launcher
    died between fork and exec, silently, and every Spark test errored; the same tests passed
    alone and in two earlier full runs. Forking before the other tests start their servers
    keeps that hazard out of the run. Under pytest-xdist (``make test``: ``-n auto --dist
    loadgroup``) they are one group: one worker, one JVM, its first tests.
    """
    spark = [item for item in items if "/tests/spark/" in str(item.path)]
    if spark:
        rest = [item for item in items if "/tests/spark/" not in str(item.path)]
        items[:] = spark + rest
        for item in spark:  # one worker, one JVM, first (pytest-xdist's --dist loadgroup)
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture
def held_port() -> Iterator[HeldPort]:
    """A port for servers the test starts on it later (or never: connections are refused),
    kept from every other process until the test ends (:class:`bench.ports.HeldPort`)."""
    with HeldPort() as held:
        yield held
