"""Additive per-group states besides :class:`~engine.ops.aggregate._states.Moments`.

* :class:`AbsSums` — per group, the number of valid values of one column and the sum of
  their absolute values (``abs_sum``).
* :class:`WeightedSums` — per group, over the rows where a value column *and* a weight
  column are both valid: the number of such rows, ``sum(value * weight)`` and
  ``sum(weight)`` (``weighted_sum``, ``weighted_avg``; one state per (value, weight) pair).

"Valid" is the pandas rule of every state here: not null and, for floats, not NaN.

Both keep their sums in :class:`~engine.ops.aggregate._states.GroupSum`, as ``Moments``
does: int64, exact and wrapping like numpy, when every input is an integer or bool column;
otherwise float64, compensated across cycles, with the infinities and NaN (``inf * 0``)
counted apart, so a term that leaves leaves no trace. A group that loses its last valid
row is reset to exact zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.columns import numpy_storage_dtype
from engine.ops.aggregate._keys import valid_mask
from engine.ops.aggregate._states import Events, GroupSum, State, grown_to, signed_counts

__all__ = ["AbsSums", "WeightedSums"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]


def _is_float(t: pa.DataType) -> bool:
    dtype = numpy_storage_dtype(t)
    assert dtype is not None
    return dtype.kind == "f"


class AbsSums:
    """Number of valid values and sum of their absolute values, per group."""

    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> AbsSums:
        return cls(_is_float(types[0]))

    def __init__(self, is_float: bool) -> None:
        self.is_float = is_float
        self.n = np.zeros(16, dtype=np.int64)
        self.sum = GroupSum(is_float)

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        touched, inv, sign = ev.touched, ev.inv, ev.sign
        if touched.size == 0:
            return touched
        cap = int(touched[-1]) + 1
        self.n = grown_to(self.n, cap)
        self.sum.ensure(cap)
        (mv,), (pv,) = minus, plus
        vals = np.concatenate((mv[0], pv[0]))
        ok = np.concatenate((valid_mask(*mv), valid_mask(*pv)))
        n_new = self.n[touched] + signed_counts(inv, sign, ok, touched.size)
        self.n[touched] = n_new
        with np.errstate(over="ignore"):
            terms = np.abs(vals.astype(np.float64 if self.is_float else np.int64))
        self.sum.add(touched, inv, sign, terms, ok)
        self.sum.reset(touched[n_new == 0])
        return touched

    def total(self, slots: I64) -> NumPair:
        """The sums (0 for a group without values)."""
        return self.sum.value(slots), None


class WeightedSums:
    """Over rows with a valid value and a valid weight: their number, ``sum(x * w)`` and
    ``sum(w)``, per group (columns: value, weight)."""

    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> WeightedSums:
        float_weight = _is_float(types[1])
        return cls(_is_float(types[0]) or float_weight, float_weight)

    def __init__(self, float_products: bool, float_weights: bool) -> None:
        self.float_products = float_products
        self.n = np.zeros(16, dtype=np.int64)
        self.xw = GroupSum(float_products)
        self.w = GroupSum(float_weights)

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        touched, inv, sign = ev.touched, ev.inv, ev.sign
        if touched.size == 0:
            return touched
        cap = int(touched[-1]) + 1
        self.n = grown_to(self.n, cap)
        self.xw.ensure(cap)
        self.w.ensure(cap)
        (mx, mw), (px, pw) = minus, plus
        x = np.concatenate((mx[0], px[0]))
        w = np.concatenate((mw[0], pw[0]))
        ok = (np.concatenate((valid_mask(*mx), valid_mask(*px)))
              & np.concatenate((valid_mask(*mw), valid_mask(*pw))))
        n_new = self.n[touched] + signed_counts(inv, sign, ok, touched.size)
        self.n[touched] = n_new
        kind = np.float64 if self.float_products else np.int64
        with np.errstate(over="ignore", invalid="ignore"):
            products = x.astype(kind) * w.astype(kind)
        self.xw.add(touched, inv, sign, products, ok)
        self.w.add(touched, inv, sign, w, ok)
        empty = touched[n_new == 0]
        self.xw.reset(empty)
        self.w.reset(empty)
        return touched

    def total(self, slots: I64) -> NumPair:
        """``sum(x * w)``; null for a group without rows (Deephaven's ``AggWSum``)."""
        return self.xw.value(slots), self.n[slots] > 0

    def average(self, slots: I64) -> NumPair:
        """``sum(x * w) / sum(w)`` as float64; null without rows or when ``sum(w) == 0``."""
        num = self.xw.value(slots).astype(np.float64)
        den = self.w.value(slots).astype(np.float64)
        valid = (self.n[slots] > 0) & (den != 0)
        with np.errstate(invalid="ignore", over="ignore"):
            return num / np.where(valid, den, 1.0), valid
