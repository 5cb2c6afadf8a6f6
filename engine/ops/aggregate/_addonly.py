"""Aggregation states for an add-only parent (:attr:`engine.table.Table.add_only`).

A parent that only ever adds rows, at row keys above all its current ones, never takes a
value out of a group and never moves a row, so a group's extremes and its first and last
rows need no sorted state that could answer "what is left after this removal":

* :class:`RunningExtremes` — ``min`` and ``max``: one running value per group, combined
  each cycle with the reduction of the rows the group gained (in the order-preserving
  ``uint64`` encoding :class:`~engine.ops.aggregate._states.OrderStats` sorts by, so
  ``-0.0``/``0.0``, NaN and nulls come out exactly as there);
* :class:`RowEnds` — ``first`` and ``last``: each group's first row key (set once, when
  the group appears) and last row key (the largest it gained);
* :class:`BestRows` — ``sorted_first`` and ``sorted_last``: each group's best row so far
  (its key and order value), challenged each cycle by the best of the rows the group
  gained (strings: :class:`BestStrings`).

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
import pyarrow.compute as pc

from engine.columns import ArrowColumnSource, numpy_storage_dtype
from engine.errors import UpdateInvariantError
from engine.ops.aggregate._keys import decode, encode, valid_mask
from engine.ops.aggregate._states import Events, State, grown_to

__all__ = ["BestRows", "BestStrings", "RowEnds", "RunningExtremes"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
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
    holds_rows: ClassVar[bool] = False

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
    holds_rows: ClassVar[bool] = False

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


class BestRows:
    """Each group's first (option ``first``) and last (option ``last``) row in the order
    of one fixed-width column, for an add-only parent: rows without an order value (null,
    NaN) skipped, ties to the smaller row key for first, the larger for last.

    Per group and wanted end: the best row's key and its encoded order value. A cycle
    sorts the rows the touched groups gained together with their best rows by ``(group,
    order value, row key)`` and keeps each group's first (last) entry, so a held row beats
    a new equal one for first and loses to it for last (new keys are larger). ``changed``
    holds, per end (``True``: last), the groups whose best row changed this cycle and the
    groups first seen (their value is null until a row with an order value arrives).
    Strings and binaries: :class:`BestStrings` (:meth:`create` picks).
    """

    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> BestRows:
        ends = tuple(e for e, opt in ((False, "first"), (True, "last")) if opt in options)
        if numpy_storage_dtype(types[0]) is not None:
            return cls(ends)
        return BestStrings(ends, types[0])

    def __init__(self, ends: tuple[bool, ...]) -> None:
        self.ends_kept = ends
        self.key = {e: np.zeros(16, dtype=np.int64) for e in ends}
        self.has = {e: np.zeros(16, dtype=bool) for e in ends}
        self.enc = {e: np.zeros(16, dtype=np.uint64) for e in ends}
        self.seen = np.zeros(16, dtype=bool)
        self.groups = 0  # groups seen
        self.changed: dict[bool, I64] = {e: np.empty(0, dtype=np.int64) for e in ends}

    def _grow(self, cap: int) -> None:
        self.seen = grown_to(self.seen, cap)
        for e in self.ends_kept:
            self.key[e], self.has[e] = grown_to(self.key[e], cap), grown_to(self.has[e], cap)
            self.enc[e] = grown_to(self.enc[e], cap)

    def _with_order(self, values: Any) -> tuple[Mask, Any]:
        """Which new rows have an order value (not null, not NaN), and their values."""
        vals, valid = values
        ok = valid_mask(vals, valid)
        return ok, vals if ok.all() else vals[ok]

    def _order(self, end: bool, new: Any, held: I64) -> tuple[U64, U64]:
        """Sortable codes, comparable with each other, of the ``new`` order values and of
        the order values of the groups ``held``'s best rows."""
        return encode(new), self.enc[end][held]

    def _keep(self, end: bool, groups: I64, new: Any, won: I64, codes: U64) -> None:
        """Record the order values of the new best rows (``new[won]``, coded ``codes``)."""
        self.enc[end][groups] = codes

    def apply(self, ev: Events, minus: Sequence[Any], plus: Sequence[Any]) -> I64:
        _only_adds(ev, "sorted_first/last")
        touched = ev.touched
        if touched.size == 0:
            self.changed = {e: touched for e in self.ends_kept}
            return touched
        self._grow(int(touched[-1]) + 1)
        born = touched[~self.seen[touched]]
        self.seen[born] = True
        self.groups += born.size
        ok, new = self._with_order(plus[0])
        inv, keys = ev.inv[ok], ev.plus_keys[ok]
        for end in self.ends_kept:
            if not ok.any():
                self.changed[end] = born
                continue
            at = np.flatnonzero(self.has[end][touched])  # positions in touched
            held = touched[at]
            new_codes, held_codes = self._order(end, new, held)
            g = np.concatenate((at, inv))
            order = np.lexsort((np.concatenate((self.key[end][held], keys)),
                                np.concatenate((held_codes, new_codes)), g))
            gs = g[order]
            if end:  # the last entry of each group's run
                pick = order[np.flatnonzero(np.append(gs[1:] != gs[:-1], True))]
            else:
                pick = order[np.flatnonzero(np.insert(gs[1:] != gs[:-1], 0, True))]
            won = pick[pick >= at.size] - at.size  # new rows that beat the held best
            groups = touched[inv[won]]
            self.key[end][groups] = keys[won]
            self.has[end][groups] = True
            self._keep(end, groups, new, won, new_codes[won])
            self.changed[end] = np.union1d(born, groups)
        return touched

    def ends(self, slots: I64, largest: bool) -> tuple[I64, Mask]:
        """Each group's best row key for first (``largest``: last), and whether it has one."""
        return self.key[largest][slots], self.has[largest][slots]


class BestStrings(BestRows):
    """:class:`BestRows` of a string or binary column: the best values are kept in Arrow
    and the new rows ranked among them (``pyarrow.compute.rank``, bytewise)."""

    arrow: ClassVar[bool] = True

    def __init__(self, ends: tuple[bool, ...], type: pa.DataType) -> None:
        super().__init__(ends)
        self.type = type
        self.best = {e: ArrowColumnSource(type) for e in ends}

    def _with_order(self, values: Any) -> tuple[Mask, Any]:
        arr: pa.Array = values
        if not arr.null_count:
            return np.ones(len(arr), dtype=bool), arr
        ok = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        return ok, arr.filter(pa.array(ok))

    def _order(self, end: bool, new: Any, held: I64) -> tuple[U64, U64]:
        both = pa.concat_arrays([self.best[end].get(held), new])
        ranks = pc.rank(both, sort_keys="ascending", tiebreaker="dense").to_numpy(zero_copy_only=False)
        codes = np.asarray(ranks, dtype=np.uint64)
        return codes[held.size :], codes[: held.size]

    def _keep(self, end: bool, groups: I64, new: Any, won: I64, codes: U64) -> None:
        src = self.best[end]
        src.set(groups, new.take(pa.array(won)))
        if src.needs_compaction(self.groups):  # an overwrite appends: compact now and then
            src.compact(np.flatnonzero(self.has[end]))
