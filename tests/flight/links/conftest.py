"""Fixtures of the links' tests that start real ``ticktable serve`` processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.crash import ServerProcess


@pytest.fixture
def processes() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill()
