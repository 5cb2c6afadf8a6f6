"""``assert_frame_equal`` at the cost of ``DataFrame.equals`` when the frames are identical.

pandas' ``assert_frame_equal`` walks every column through ``assert_series_equal`` (a
categorical one element by element): ~10 ms for a 6-column frame of a few hundred rows,
which tests reading a frame after each of thousands of messages paid thousands of times.
:func:`assert_frame_same` first checks, in a few vectorized calls, that the two frames are
identical in every way ``assert_frame_equal``'s defaults look at (and more strictly: exact
values, the same types of index and columns, categories in the same order); only a pair
that is not goes through ``assert_frame_equal``, whose verdict and message stand.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pandas.api.types import is_object_dtype


def identical(got: pd.DataFrame, want: pd.DataFrame) -> bool:
    """Whether ``assert_frame_equal(got, want)`` with its defaults would pass, and more:
    the same index and column labels (type, dtype, names, values), flags and dtypes,
    categorical columns with the same categories in the same order, and
    ``DataFrame.equals`` (exact values, NA where NA). ``equals`` takes None for NaN in an
    ``object`` column, which ``assert_frame_equal`` does not: there each pair of values must
    also be one object, or of one type and equal, or both NaN (:func:`_same_objects`)."""
    if type(got) is not type(want) or got.shape != want.shape or got.flags != want.flags:
        return False
    for a, b in ((got.index, want.index), (got.columns, want.columns)):
        if type(a) is not type(b) or a.dtype != b.dtype or a.names != b.names or not a.equals(b):
            return False
    dtypes = list(got.dtypes)
    if dtypes != list(want.dtypes):
        return False
    for i, dtype in enumerate(dtypes):
        if is_object_dtype(dtype):
            if not _same_objects(got.iloc[:, i].to_numpy(), want.iloc[:, i].to_numpy()):
                return False
        elif isinstance(dtype, pd.CategoricalDtype):
            a, b = got.iloc[:, i].cat.categories, want.iloc[:, i].cat.categories
            if type(a) is not type(b) or a.dtype != b.dtype or not a.equals(b):
                return False
    return got.equals(want)


def _same_objects(a: Any, b: Any) -> bool:
    """Each pair one object, or of one type and equal, or both NaN (a value whose
    comparison is not a plain bool, an array or ``pd.NA``, makes the pair not the same)."""
    try:
        return all(x is y or (type(x) is type(y) and bool(x == y or (x != x and y != y)))
                   for x, y in zip(a, b, strict=True))
    except (TypeError, ValueError):
        return False


def assert_frame_same(got: pd.DataFrame, want: pd.DataFrame, **options: Any) -> None:
    """``pd.testing.assert_frame_equal(got, want, **options)``, skipped for identical frames
    (:func:`identical`; ``options`` may only loosen what it checks)."""
    if not identical(got, want):
        pd.testing.assert_frame_equal(got, want, **options)
