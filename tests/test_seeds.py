"""tests/seeds.py: a seed hunt changes every seeded draw, reproducibly, and says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.seeds import mixed_seed


def test_mixed_seeds_are_other_draws_and_the_same_for_the_same_mix():
    draw = [np.random.default_rng(mixed_seed(s, 4903)).integers(1 << 30) for s in (1, [1, 2])]
    again = [np.random.default_rng(mixed_seed(s, 4903)).integers(1 << 30) for s in (1, [1, 2])]
    plain = [np.random.default_rng(s).integers(1 << 30) for s in (1, [1, 2])]
    other = [np.random.default_rng(mixed_seed(s, 4904)).integers(1 << 30) for s in (1, [1, 2])]
    assert draw == again and draw != plain and draw != other
    assert mixed_seed(np.int64(7), 3) == [7, 3] and mixed_seed(np.array([1, 2]), 3) == [1, 2, 3]
    seq = np.random.SeedSequence(5)
    assert mixed_seed(None, 3) is None and mixed_seed(seq, 3) is seq


def test_the_hunt_reaches_every_seeded_generator_and_is_named_in_the_header(pytester, monkeypatch):
    # default_rng's generator, built without it (a run under a mix of its own patches it)
    expect = int(np.random.Generator(np.random.PCG64([1, 4903])).integers(1 << 30))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_draw=f"""
        import numpy as np

        def test_draw():
            assert np.random.default_rng(1).integers(1 << 30) == {expect}
    """)
    monkeypatch.setenv("TICKTABLE_SEED_MIX", "4903")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["seed mix: TICKTABLE_SEED_MIX=4903"])
    result.assert_outcomes(passed=1)
