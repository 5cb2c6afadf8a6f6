"""tests/watch.py in a real pytest run: a failure is named when it happens, and the clock line
names the test in flight, with or without pytest-xdist."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

INNER = '''
import time

def test_fails():
    assert 1 == 2, "the numbers differ"

def test_hangs():
    time.sleep(4)
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_watch_names_failures_and_tests_in_flight(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  workers: list[str]) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("TICKTABLE_WATCH_TICK", "1")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "tests.watch", "-p", "no:cacheprovider",
                                           *workers)
    result.assert_outcomes(passed=1, failed=1)
    err = result.errlines
    failed = [i for i, line in enumerate(err) if "FAILED test_inner.py::test_fails" in line]
    assert len(failed) == 1, err
    assert "(call, " in err[failed[0]] and "AssertionError: the numbers differ" in err[failed[0]]
    # written while the run goes on: a later clock line counts it, with the hanging test named
    later = [line for line in err[failed[0]:] if line.startswith("[watch ")
             and "of 2 done, 1 failed; load " in line
             and "running: test_inner.py::test_hangs (0:0" in line]
    assert later, err
    # the last line is written as the run ends, with nothing running; the first line after
    # test_hangs ended (that one, or a clock line just before it) names it the slowest
    assert "2 of 2 done, 1 failed" in err[-1] and "running: nothing" in err[-1], err
    assert any("slowest since the last line: test_inner.py::test_hangs (4." in line
               for line in err), err
    assert all("; load " in line for line in err if "done," in line)
