"""The oracle checks itself: a source table is its own recomputation, over every kind."""

from tests.oracle import run_oracle


def test_sources_through_the_oracle():
    run_oracle(lambda t: t, lambda df: df, seed=1)
