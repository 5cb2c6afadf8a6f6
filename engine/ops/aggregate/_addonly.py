"""Aggregation states for an add-only parent (:attr:`engine.table.Table.add_only`).

A parent that only ever adds rows, at row keys above all its current ones, never takes a
value out of a group and never moves a row, so a group's extremes and its first and last
rows need no sorted state that could answer "what is left after this removal":

* :class:`RunningExtremes` — ``min`` and ``max``: one running value per group, combined
  each cycle with the reduction of the rows the group gained (in the order-preserving
  ``uint64`` encoding :class:`~engine.ops.aggregate._states.OrderStats` sorts by, so
  ``-0.0``/``0.0``, NaN and nulls come out exactly as there);
* :class:`RowEnds` — ``first`` and ``last``: each group's first row key (set once, when
  the group appears) and last row key (the largest it gained).

Both take only *plus* events; a *minus* event (a removed or modified row) is an
:class:`~engine.errors.UpdateInvariantError`. The listener fails the table before one can
reach them, when an update of its add-only parent removes, modifies or shifts rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.columns import numpy_storage_dtype
from engine.errors import UpdateInvariantError
from engine.ops.aggregate._keys import decode, encode, valid_mask
from engine.ops.aggregate._states import Events, State, grown_to

__all__ = ["RowEnds", "RunningExtremes"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]

_TOP = np.iinfo(np.uint64).max


def _only_adds(ev: Events, state: str) -> None:
    if ev.nm:
        raise UpdateInvariantError(
            "A2", f"{state} of an add-only parent got {ev.nm} rows leaving groups "
                  f"(keys {ev.minus_keys[:10].tolist()})")


class RunningExtremes:
    """Min (option ``min``) and max (option ``max``) of one fixed-width column per group,
    for an add-only parent: nulls and NaN skipped, null for a group without values."""

    arrow: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> RunningExtremes:
        dtype = numpy_storage_dtype(types[0])
        assert dtype is not None
        return cls(dtype, "min" in options, "max" in options)

    def __init__(self, dtype: np.dtype[Any], want_min: bool, want_max: bool) -> None:
        self.dtype = dtype
        self.want_min, self.want_max = want_min, want_max
        self.lo = np.zeros(16, dtype=np.uint64)  # encoded; meaningful where ``has``
        self.hi = np.zeros(16, dtype=np.uint64)
        self.has = np.zeros(16, dtype=bool)

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        _only_adds(ev, "min/max")
        touched = ev.touched
        if touched.size == 0:
            return touched
        (vals, valid), = plus
        ok = valid_mask(vals, valid)
        inv = ev.inv if ok.all() else ev.inv[ok]
        enc = encode(vals if ok.all() else vals[ok])
        cap = int(touched[-1]) + 1
        self.lo, self.hi, self.has = grown_to(self.lo, cap), grown_to(self.hi, cap), grown_to(self.has, cap)
        seen = np.bincount(inv, minlength=touched.size) > 0
        at = touched[seen]
        had = self.has[at]
        if self.want_min:
            red = np.full(touched.size, _TOP, dtype=np.uint64)
            np.minimum.at(red, inv, enc)
            self.lo[at] = np.where(had, np.minimum(self.lo[at], red[seen]), red[seen])
        if self.want_max:
            red = np.zeros(touched.size, dtype=np.uint64)
            np.maximum.at(red, inv, enc)
            self.hi[at] = np.where(had, np.maximum(self.hi[at], red[seen]), red[seen])
        self.has[at] = True
        return touched

    def min(self, slots: I64) -> NumPair:
        return decode(self.lo[slots], self.dtype), self.has[slots]

    def max(self, slots: I64) -> NumPair:
        return decode(self.hi[slots], self.dtype), self.has[slots]


class RowEnds:
    """Each group's first and last parent row key, for an add-only parent: the first is
    set when the group appears (``born``: this cycle's new groups), the last is the
    largest key it gained. Reads no column."""

    arrow: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> RowEnds:
        return cls()

    def __init__(self) -> None:
        self.first = np.zeros(16, dtype=np.int64)
        self.last = np.zeros(16, dtype=np.int64)
        self.has = np.zeros(16, dtype=bool)
        self.born = np.empty(0, dtype=np.int64)  # sorted

    def apply(self, ev: Events, minus: Sequence[Any], plus: Sequence[Any]) -> I64:
        _only_adds(ev, "first/last")
        touched, keys = ev.touched, ev.plus_keys
        if touched.size == 0:
            self.born = touched
            return touched
        cap = int(touched[-1]) + 1
        self.first, self.last = grown_to(self.first, cap), grown_to(self.last, cap)
        self.has = grown_to(self.has, cap)
        top = np.full(touched.size, -1, dtype=np.int64)
        np.maximum.at(top, ev.inv, keys)
        self.last[touched] = top  # keys arrive above every key a group holds
        new = ~self.has[touched]
        self.born = touched[new]
        if self.born.size:
            low = np.full(touched.size, np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(low, ev.inv, keys)
            self.first[self.born] = low[new]
            self.has[self.born] = True
        return touched
