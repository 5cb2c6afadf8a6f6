"""tests/conftest.py's test-order hunt: ``TICKTABLE_TEST_ORDER=N`` runs the tests in an order
drawn from ``N`` (Spark's first, as always), the same in every xdist worker, and says so."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

NAMES = [f"test_{c}" for c in "abcdefghij"]


@pytest.fixture
def inner(pytester, monkeypatch):
    """A suite of ten tests, each appending its name to ``ran.txt``, under this conftest."""
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    body = "\n".join(f"def {n}():\n    open('ran.txt', 'a').write('{n}\\n')\n" for n in NAMES)
    pytester.makepyfile(test_inner=body)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    return pytester


def _ran(pytester) -> list[str]:
    return (pytester.path / "ran.txt").read_text().split()


def test_the_order_is_drawn_from_the_number_and_named_in_the_header(inner, monkeypatch):
    monkeypatch.setenv("TICKTABLE_TEST_ORDER", "7")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(["test order: TICKTABLE_TEST_ORDER=7"])
    want = list(NAMES)
    random.Random(7).shuffle(want)
    assert _ran(inner) == want != NAMES


def test_without_the_number_the_order_is_the_files(inner, monkeypatch):
    monkeypatch.delenv("TICKTABLE_TEST_ORDER", raising=False)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=10)
    assert "test order" not in result.stdout.str()
    assert _ran(inner) == NAMES


def test_every_xdist_worker_collects_the_same_order(inner, monkeypatch):
    """pytest-xdist refuses a run whose workers collected different orders."""
    monkeypatch.setenv("TICKTABLE_TEST_ORDER", "11")
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=10)
    assert sorted(_ran(inner)) == NAMES
