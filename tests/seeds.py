"""Seed hunts: every seeded ``np.random.default_rng`` of a test run mixed with another number.

The oracles draw their random cycles from fixed seeds, so every run checks the same cycles.
``TICKTABLE_SEED_MIX=N pytest ...`` (tests/conftest.py installs :func:`install`) seeds each
``np.random.default_rng(seed)`` with ``[seed, N]`` instead (``[*seed, N]`` for a sequence): the
same tests over other cycles, reproducible by the same ``N``. The run's header names it.
A hunt over the oracles found a join bug the usual seeds never reach (bench/README.md,
"Other seeds").

A few tests also assert what their cycles covered (e.g. the sort's
``test_oracle_merged_batches_by_price``: a merge of 40 rows or more among them). Such a test
forces the shape it counts (``run_oracle(step=...)``: that one writes a whole-table modify
every 40th cycle), so its count holds under any mix; it failed under most mixes while it
waited for the random writer to make one. A coverage count short of its mark under a mix is
such a test to fix, not an engine fault; a mismatch or a replay difference is a fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["install", "mixed_seed"]

_ORIGINAL = np.random.default_rng


def mixed_seed(seed: Any, mix: int) -> Any:
    """``seed`` with ``mix`` appended; a generator, bit generator, seed sequence or ``None``
    as it is (nothing to mix into)."""
    if seed is None or isinstance(seed, np.random.Generator | np.random.BitGenerator
                                  | np.random.SeedSequence):
        return seed
    if isinstance(seed, Sequence | np.ndarray):
        return [*(int(s) for s in seed), mix]
    return [int(seed), mix]


def install(mix: int) -> None:
    """Make ``np.random.default_rng`` mix ``mix`` into every seed it is given."""

    def default_rng(seed: Any = None) -> np.random.Generator:
        return _ORIGINAL(mixed_seed(seed, mix))

    np.random.default_rng = default_rng
