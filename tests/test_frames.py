"""tests/frames.py: a pair ``identical`` passes is a pair ``assert_frame_equal`` passes; the
differences it must not let through go to ``assert_frame_equal`` and fail there."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.frames import assert_frame_same, identical


def _frame() -> pd.DataFrame:
    return pa.table({
        "i": pa.array([1, None, 3], pa.int64()),
        "f": pa.array([0.5, float("nan"), None], pa.float64()),
        "b": pa.array([True, None, False], pa.bool_()),
        "d": pa.array([dt.date(2026, 1, 1), None, dt.date(2026, 1, 3)], pa.date32()),
        "s": pa.array(["a", None, "c"], pa.string()),
        "c": pa.array(["x", "y", None], pa.string()).dictionary_encode(),
        "t": pa.array([1, None, 3], pa.timestamp("us", tz="Europe/Paris")),
    }).to_pandas()


def test_equal_frames_are_identical_and_pass():
    assert identical(_frame(), _frame())
    assert_frame_same(_frame(), _frame())


def _changed(change: str) -> pd.DataFrame:
    df = _frame()
    if change == "object None for NaN":
        df["d"] = df["d"].astype(object).where(df["d"].notna(), np.nan)
    elif change == "value":
        df.loc[2, "f"] = 0.5000001
    elif change == "category order":
        df["c"] = df["c"].cat.reorder_categories(["y", "x"])
    elif change == "index type":
        df.index = pd.Index([0, 1, 2], dtype="int64")
    elif change == "column name":
        df = df.rename(columns={"s": "S"})
    elif change == "dtype":
        df["f"] = df["f"].astype("float32")
    elif change == "string":
        df.loc[0, "s"] = "b"
    elif change == "bool type":
        df["b"] = pd.Series([1, None, 0], dtype=object)
    return df


@pytest.mark.parametrize("change", ["object None for NaN", "value", "category order",
                                    "index type", "column name", "dtype", "string", "bool type"])
def test_a_difference_is_not_identical(change):
    assert not identical(_changed(change), _frame())


@pytest.mark.parametrize("change", ["object None for NaN", "category order", "column name",
                                    "dtype", "string"])
def test_what_assert_frame_equal_refuses_still_fails(change):
    with pytest.raises(AssertionError):
        assert_frame_same(_changed(change), _frame())
