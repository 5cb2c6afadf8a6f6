"""Per-group aggregation states for ``engine.ops.aggregate`` (vectorized, incremental).

Every state keeps arrays indexed by *group slot* (the output row key) and takes one
batch of events per cycle: ``minus`` rows leaving a group (previous values) and ``plus``
rows joining one (current values). A modified row that stays in its group is a minus and a
plus of the same slot. Per-group deltas come from ``np.bincount`` / ``np.add.at`` over the
inverse of ``np.unique(slots)``: the cost follows the events, never the table.

Every state follows the :class:`State` protocol: built by ``create`` from its input
columns' types and the options its aggregations asked for, fed by ``apply`` with one
value array per input column. The registry (:mod:`engine.ops.aggregate._kinds`) decides
which aggregations share a state.

The sums carried across cycles are written once, here, and every state that sums builds on
them (:mod:`engine.ops.aggregate._sums` too):

* :class:`CompensatedSum` — a float64 sum per slot with Knuth's two-sum residue carried
  across cycles, so a value added in one cycle and removed in another leaves no trace;
* :class:`GroupSum` — the sum of a column's terms per group: int64 exact, or float64 in a
  :class:`CompensatedSum` with ``+inf``, ``-inf`` and NaN counted apart, read as IEEE
  arithmetic over the current terms would give it.

The states:

* :class:`Moments` — count of valid values, sum (a :class:`GroupSum`) and, for
  ``std``/``var``, compensated sums of ``x - K`` and ``(x - K)**2`` about a per-group
  reference ``K``. ``K`` is a *data value* (the group's first value, re-chosen as the batch
  value nearest the mean when the mean drifts away), so ``x - K`` is small, exact for data
  on a grid, and the textbook cancellation of ``sum(x**2) - sum(x)**2/n`` does not happen.
  What running sums cannot avoid — the rounding left by values far larger than the group's
  current spread — is bounded and healed from the column's :class:`OrderStats`: min == max
  resets to an exact 0, and a group whose error bound passes :attr:`Moments.TOLERANCE` is
  recomputed from its values. Infinities are counted apart (by the sum), so removing an
  infinity restores a finite sum and spread.
* :class:`OrderStats` — min, max and (with the ``ranks`` option) values of any rank,
  for median and percentile, through a :class:`ValueMultiset` of order-preserving
  ``uint64`` encodings.
* :class:`Distinct` — per ``(group, value)`` counts in an exact key map (:class:`StoredKeyMap`;
  :class:`NumericDistinct`, for integer and float columns, verifies against the pairs kept
  in numpy, with no Arrow work in a cycle); a group's distinct count changes when a count
  crosses zero.

Null semantics follow pandas ``groupby``: nulls (and float NaN, which pandas cannot tell
from null) are skipped by every state here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from engine._kernels.hashing import combine, hash_columns, mix64
from engine._kernels.ids import IdAllocator
from engine._kernels.keymap import ExactKeyMap, StoredKeyMap
from engine.columns import numpy_storage_dtype
from engine.errors import UpdateInvariantError
from engine.ops.aggregate._keys import (
    decode,
    encode,
    valid_mask,
)
from engine.ops.aggregate._sortedset import ValueMultiset

__all__ = ["CompensatedSum", "Cycle", "Distinct", "Events", "GroupSum", "Moments", "NumericDistinct", "OrderStats", "State",
           "grown_to", "signed_counts"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]

_EMPTY_I = np.empty(0, dtype=np.int64)
#: -1 then +1, each ``_SIGNS_HALF`` times: the signs of a cycle's events are a slice of it
_SIGNS_HALF = 4096
_SIGNS = np.repeat(np.array([-1, 1], dtype=np.int64), _SIGNS_HALF)
_SIGNS.flags.writeable = False


class State(Protocol):
    """Per-group state of one or more parent columns, shared by the aggregations reading it.

    ``arrow`` says how :meth:`apply` wants values: Arrow arrays, or ``(numpy values,
    validity or None)`` pairs in the columns' storage dtypes. ``holds_rows`` says whether
    it keeps parent row keys: it then sees every cycle that shifts the parent (with no
    other event, if need be) and moves its keys by :attr:`Events.shifted`.
    """

    arrow: ClassVar[bool]
    holds_rows: ClassVar[bool]

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> State:
        """A state over columns of ``types``; ``dep(cls)`` is the state of class ``cls``
        over the same columns (built first, and fed first every cycle)."""
        ...

    def apply(self, ev: Events, minus: Sequence[Any], plus: Sequence[Any]) -> I64:
        """Fold one cycle's events in (one value array per column, for the ``minus`` and
        the ``plus`` rows); returns the slots touched."""
        ...


# states ---------------------------------------------------------------------------------
class Events:
    """One cycle's events for a set of inputs: rows leaving groups (``minus``, previous key
    space, the first ``nm``) then rows joining groups (``plus``, current key space), with
    ``touched = unique(slots)`` and ``inv`` its inverse, computed once for every state.

    ``shifted`` takes a state holding row keys from one key space to the other: the
    parent rows the cycle's shift moved, ``(previous keys, current keys)``, among the rows
    that stayed (not removed). Such a state removes its minus rows, moves these, then adds
    its plus rows: in any other order a key could be held twice."""

    __slots__ = ("minus_keys", "plus_keys", "slots", "sign", "nm", "touched", "inv", "shifted")

    def __init__(self, minus_keys: I64, minus_slots: I64, plus_keys: I64, plus_slots: I64,
                 shifted: tuple[I64, I64] = (_EMPTY_I, _EMPTY_I)) -> None:
        self.minus_keys, self.plus_keys = minus_keys, plus_keys
        self.shifted = shifted
        self.slots = np.concatenate((minus_slots, plus_slots))
        self.nm = nm = minus_slots.size
        n = self.slots.size
        if nm <= _SIGNS_HALF and n - nm <= _SIGNS_HALF:  # a read-only view: no allocation
            self.sign = _SIGNS[_SIGNS_HALF - nm : _SIGNS_HALF - nm + n]
        else:
            self.sign = np.ones(n, dtype=np.int64)
            self.sign[:nm] = -1
        self.touched, self.inv = _unique_slots(self.slots)

    def split(self) -> tuple[I64, I64]:
        return self.slots[: self.nm], self.slots[self.nm :]


class Cycle:
    """One cycle's row movements: slots and parent row keys of removed, added and modified
    rows, and the :class:`Events` views the states consume."""

    __slots__ = ("r_keys", "r_slot", "a_keys", "a_slot", "m_keys", "m_prev", "m_old", "m_new",
                 "moved", "modcols", "shifted", "_events")

    def __init__(self, modcols: frozenset[str]) -> None:
        self.r_keys = self.r_slot = self.a_keys = self.a_slot = _EMPTY_I
        self.m_keys = self.m_prev = self.m_old = self.m_new = _EMPTY_I
        self.moved = np.empty(0, dtype=bool)
        self.modcols = modcols
        self.shifted: tuple[I64, I64] = (_EMPTY_I, _EMPTY_I)  # see Events.shifted
        self._events: dict[bool, Events] = {}

    def events(self, stay: bool = False) -> Events:
        """Membership events (removed, added, moved rows); with ``stay`` also the modified
        rows that kept their group, as a minus and a plus of it (for inputs they modified)."""
        stay = stay and self.moved.size > 0 and not self.moved.all()
        if stay not in self._events:
            sel = slice(None) if stay else self.moved
            self._events[stay] = Events(
                np.concatenate((self.r_keys, self.m_prev[sel])), np.concatenate((self.r_slot, self.m_old[sel])),
                np.concatenate((self.a_keys, self.m_keys[sel])), np.concatenate((self.a_slot, self.m_new[sel])),
                self.shifted,
            )
        return self._events[stay]


#: up to this many events, :func:`_unique_slots` works on Python integers (tests change it)
FEW_EVENTS = 32


def _unique_slots(slots: I64) -> tuple[I64, I64]:
    """``np.unique(slots, return_inverse=True)``; by counting when slots are dense (O(n)),
    as Python integers when they are few (``np.unique``'s fixed cost is ~20 us)."""
    if slots.size <= FEW_EVENTS:
        if slots.size == 0:
            return _EMPTY_I, _EMPTY_I
        vals = slots.tolist()
        u = sorted(set(vals))
        if len(u) == 1:
            return np.array(u, dtype=np.int64), np.zeros(slots.size, dtype=np.int64)
        pos = {v: i for i, v in enumerate(u)}
        return np.array(u, dtype=np.int64), np.array([pos[v] for v in vals], dtype=np.int64)
    if slots.size < 256:
        return np.unique(slots, return_inverse=True)
    top = int(slots.max()) + 1
    if top > 4 * slots.size:
        return np.unique(slots, return_inverse=True)
    present = np.bincount(slots, minlength=top) > 0
    touched = np.flatnonzero(present)
    rank = np.cumsum(present) - 1
    return touched, rank[slots]


def signed_counts(inv: I64, sign: I64, mask: Mask, nt: int) -> I64:
    """Per touched group (``inv`` indexes ``nt`` of them), the number of events selected by
    ``mask``, each counted with its ``sign`` (-1 leaving, +1 joining)."""
    return np.bincount(inv, weights=np.where(mask, sign, 0), minlength=nt).round().astype(np.int64)


def grown_to(arr: npt.NDArray[Any], cap: int) -> npt.NDArray[Any]:
    """``arr`` itself when it holds slots ``[0, cap)``, else a copy at least twice as long
    whose new slots are zero (the caller replaces ``arr`` with it)."""
    if cap <= arr.size:
        return arr
    out = np.zeros(max(cap, 2 * arr.size), dtype=arr.dtype)
    out[: arr.size] = arr
    return out


# sums carried across cycles ------------------------------------------------------------
def _two_sum(hi: F64, lo: F64, at: I64, b: npt.NDArray[Any]) -> None:
    """``hi[at] + lo[at] += b`` keeping the rounding error of the addition in ``lo``
    (Knuth's two-sum: ``s + err == a + b`` exactly)."""
    a = hi[at]
    s = a + b
    bb = s - a
    hi[at] = s
    lo[at] += (a - (s - bb)) + (b - bb)


class CompensatedSum:
    """A float64 sum per slot that does not drift across cycles: ``hi + lo``, where ``lo``
    carries the rounding error of every addition (:func:`_two_sum`), so a value added in
    one cycle and removed in another leaves no trace.

    Only finite terms: :class:`GroupSum` counts the infinities and NaN apart. :meth:`set`
    replaces a slot's sum by an exact value (no residue), for a caller that recomputed it.
    """

    __slots__ = ("hi", "lo")

    def __init__(self) -> None:
        self.hi = np.zeros(16, dtype=np.float64)
        self.lo = np.zeros(16, dtype=np.float64)

    def ensure(self, cap: int) -> None:
        """Room for slots ``[0, cap)``."""
        self.hi = grown_to(self.hi, cap)
        self.lo = grown_to(self.lo, cap)

    def add(self, at: I64, deltas: npt.NDArray[Any]) -> None:
        """Add ``deltas[i]`` to the sum of slot ``at[i]`` (``at`` distinct)."""
        _two_sum(self.hi, self.lo, at, deltas)

    def set(self, slots: I64, values: npt.NDArray[Any]) -> None:
        self.hi[slots] = values
        self.lo[slots] = 0.0

    def reset(self, slots: I64) -> None:
        self.hi[slots] = 0.0
        self.lo[slots] = 0.0

    def value(self, slots: I64) -> F64:
        return self.hi[slots] + self.lo[slots]


#: finite terms larger than this (in magnitude) are summed apart, scaled by ``2**-_SCALE``:
#: the sum of up to ``2**120`` smaller terms cannot overflow, nor can the scaled ones'
_HUGE = 2.0**900
_SCALE = 600


class GroupSum:
    """The sum of one column's current terms per group, as summing them afresh would give it.

    int64, exact and wrapping like numpy, when every term is an integer (``is_float``
    false). Otherwise float64: finite terms in a :class:`CompensatedSum`, and ``+inf``,
    ``-inf`` and NaN terms counted apart, so a term that leaves leaves no trace and a sum
    reads as IEEE arithmetic over the current terms would: NaN if a term is NaN or both
    infinities are present, else the infinity present, else the compensated finite sum.
    Finite terms above ``2**900`` are summed apart, scaled by ``2**-600`` (exactly), so
    finite terms whose sum passes float64's range read as that infinity while they are
    present and leave no trace when they go (a running sum would hold ``inf - inf``).
    A caller resets a group that lost its last term (:meth:`reset`: exact zeros).
    """

    __slots__ = ("is_float", "exact", "finite", "huge", "pinf", "ninf", "nan")

    def __init__(self, is_float: bool) -> None:
        self.is_float = is_float
        self.exact = np.zeros(16, dtype=np.int64)
        self.finite = CompensatedSum()
        self.huge = CompensatedSum()  # the terms above _HUGE, times 2**-_SCALE
        self.pinf = np.zeros(16, dtype=np.int64)
        self.ninf = np.zeros(16, dtype=np.int64)
        self.nan = np.zeros(16, dtype=np.int64)

    def ensure(self, cap: int) -> None:
        """Room for slots ``[0, cap)``."""
        self.exact = grown_to(self.exact, cap)
        self.finite.ensure(cap)
        self.huge.ensure(cap)
        self.pinf = grown_to(self.pinf, cap)
        self.ninf = grown_to(self.ninf, cap)
        self.nan = grown_to(self.nan, cap)

    def add(self, touched: I64, inv: I64, sign: I64, terms: npt.NDArray[Any], ok: Mask) -> Mask:
        """Add ``sign * terms`` where ``ok`` to the groups ``touched[inv]``; returns the
        terms that went to the finite sum (``ok``, less the infinities and NaN)."""
        nt = touched.size
        if not self.is_float:
            ds = np.zeros(nt, dtype=np.int64)
            np.add.at(ds, inv[ok], terms[ok].astype(np.int64) * sign[ok])
            self.exact[touched] += ds
            return ok
        x = terms.astype(np.float64)
        fin = ok & np.isfinite(x)
        if not fin.all() and (ok & ~fin).any():
            self.pinf[touched] += signed_counts(inv, sign, ok & (x == np.inf), nt)
            self.ninf[touched] += signed_counts(inv, sign, ok & (x == -np.inf), nt)
            self.nan[touched] += signed_counts(inv, sign, ok & np.isnan(x), nt)
        terms = np.where(fin, x * sign, 0.0)
        huge = np.abs(terms) > _HUGE
        if huge.any():
            self.huge.add(touched, np.bincount(inv, weights=np.where(
                huge, np.ldexp(terms, -_SCALE), 0.0), minlength=nt))
            terms[huge] = 0.0
        self.finite.add(touched, np.bincount(inv, weights=terms, minlength=nt))
        return fin

    def reset(self, slots: I64) -> None:
        self.exact[slots] = 0
        self.finite.reset(slots)
        self.huge.reset(slots)
        self.pinf[slots] = 0
        self.ninf[slots] = 0
        self.nan[slots] = 0

    def infinities(self, slots: I64) -> I64:
        """How many of each group's terms are ``+inf`` or ``-inf`` (0 for integers)."""
        return self.pinf[slots] + self.ninf[slots]

    def value(self, slots: I64) -> npt.NDArray[Any]:
        if not self.is_float:
            return self.exact[slots]
        p, m = self.pinf[slots] > 0, self.ninf[slots] > 0
        nan = (self.nan[slots] > 0) | (p & m)
        out = self.finite.value(slots)
        big = self.huge.value(slots)
        if big.any():
            with np.errstate(over="ignore"):  # past float64's range: that infinity
                out = np.ldexp(big, _SCALE) + out
        return np.where(nan, np.nan, np.where(p, np.inf, np.where(m, -np.inf, out)))


class Moments:
    """Count, sum and spread of one numeric column per group (sum, mean, std and var).

    With the ``spread`` option (std, var) it also reads the column's :class:`OrderStats`
    (its dependency, updated before :meth:`apply`): a group whose min equals its max is reset to an exact zero
    spread, and a group whose error bound — ``eps`` times the magnitude of everything its
    sum of squares ever absorbed (``mag``) — passes ``1e-10`` of that sum is recomputed
    from its values (cost: the group's distinct values; rare, as it takes a history tens
    of thousands of times the group's current spread, or a change of scale).
    """

    #: relative error of the sum of squared deviations above which a group is recomputed
    TOLERANCE = 1e-10
    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> Moments:
        dtype = numpy_storage_dtype(types[0])
        assert dtype is not None
        if "spread" not in options:
            return cls(dtype, False)
        values = dep(OrderStats)
        assert isinstance(values, OrderStats)
        return cls(dtype, True, values)

    def __init__(self, dtype: np.dtype[Any], want_std: bool, values: OrderStats | None = None) -> None:
        self.is_float = dtype.kind == "f"
        self.want_std = want_std
        assert values is not None or not want_std
        self.values = values
        self.n = np.zeros(16, dtype=np.int64)  # valid values (infinities included)
        self.total = GroupSum(self.is_float)
        self.k = np.zeros(16, dtype=np.float64)
        self.sk = CompensatedSum()  # sum of x - k over the finite values
        self.qk = CompensatedSum()  # sum of (x - k)**2 over the finite values
        self.mag = np.zeros(16, dtype=np.float64)  # sum of |terms| the sum of squares absorbed

    def _ensure(self, cap: int) -> None:
        self.n = grown_to(self.n, cap)
        self.total.ensure(cap)
        self.k = grown_to(self.k, cap)
        self.sk.ensure(cap)
        self.qk.ensure(cap)
        self.mag = grown_to(self.mag, cap)

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        """Fold one cycle's events in; returns the slots touched."""
        touched, inv, sign, nm = ev.touched, ev.inv, ev.sign, ev.nm
        if touched.size == 0:
            return touched
        (minus_v,), (plus_v,) = minus, plus
        self._ensure(int(touched[-1]) + 1)
        vals = np.concatenate((minus_v[0], plus_v[0]))
        ok = np.concatenate((valid_mask(*minus_v), valid_mask(*plus_v)))
        n_old = self.n[touched]
        n_new = n_old + signed_counts(inv, sign, ok, touched.size)
        self.n[touched] = n_new
        nfin_old = n_old - self.total.infinities(touched)
        fin = self.total.add(touched, inv, sign, vals, ok)
        if self.want_std:
            nfin_new = n_new - self.total.infinities(touched)
            # finite values whose squares (or differences) pass float64's range make the
            # running sums non-finite: _heal recomputes those groups from their values
            with np.errstate(over="ignore", invalid="ignore"):
                self._apply_spread(touched, inv, sign, vals.astype(np.float64), fin, nm, nfin_old,
                                   nfin_new)
                self._heal(touched, nfin_new)
        empty = touched[n_new == 0]
        if empty.size:  # exact zeros for a group that lost its last value
            self.total.reset(empty)
            self.sk.reset(empty)
            self.qk.reset(empty)
            self.k[empty] = 0.0
            self.mag[empty] = 0.0
        return touched

    def _apply_spread(self, touched: I64, inv: I64, sign: I64, x: F64, fin: Mask, nm: int,
                      nfin_old: I64, nfin_new: I64) -> None:
        nt = touched.size
        plus_fin = fin.copy()
        plus_fin[:nm] = False
        # a group without finite values takes the first new value as its reference K
        fresh = nfin_old <= 0
        if fresh.any():
            cand = np.flatnonzero(plus_fin & fresh[inv])
            u, first = np.unique(inv[cand], return_index=True)
            t = touched[u]
            self.k[t] = x[cand[first]]
            self.sk.reset(t)
            self.qk.reset(t)
            self.mag[t] = 0.0
        k = self.k[touched][inv]
        d = np.where(fin, x - k, 0.0)
        dd = d * d
        self.sk.add(touched, np.bincount(inv, weights=d * sign, minlength=nt))
        self.qk.add(touched, np.bincount(inv, weights=dd * sign, minlength=nt))
        self.mag[touched] += np.bincount(inv, weights=dd, minlength=nt)
        # re-centre where the mean drifted away from K (the squares would cancel): the new
        # K is the batch value nearest the mean, so for data on a grid x - K stays exact
        nf = nfin_new.astype(np.float64)
        sk = self.sk.value(touched)
        qk = self.qk.value(touched)
        drift = (nf > 0) & (sk * sk > 0.5 * qk * np.maximum(nf, 1.0))
        if drift.any():
            mean = self.k[touched] + sk / np.maximum(nf, 1.0)
            cand = np.flatnonzero(plus_fin & drift[inv])
            if cand.size:
                dist = np.abs(x[cand] - mean[inv[cand]])
                order = cand[np.lexsort((dist, inv[cand]))]
                u, first = np.unique(inv[order], return_index=True)
                pick = order[first]
                better = np.abs(x[pick] - mean[u]) < np.abs(self.k[touched[u]] - mean[u])
                u, pick = u[better], pick[better]
                t = touched[u]
                delta = x[pick] - self.k[t]
                nfu, sku, qku = nf[u], sk[u], qk[u]
                self.mag[t] += np.abs(2.0 * delta * sku) + nfu * delta * delta
                self.qk.set(t, np.maximum(qku - 2.0 * delta * sku + nfu * delta * delta, 0.0))
                self.sk.set(t, sku - nfu * delta)
                self.k[t] = x[pick]
        gone = touched[nfin_new <= 0]
        self.sk.reset(gone)
        self.qk.reset(gone)
        self.mag[gone] = 0.0

    def _heal(self, touched: I64, nfin: I64) -> None:
        """Exact zero spread where min == max; recompute groups whose error bound is too big."""
        assert self.values is not None
        only_finite = (nfin > 0) & (self.total.infinities(touched) == 0)
        t = touched[only_finite]
        if t.size == 0:
            return
        lo, _ = self.values.min(t)
        hi, _ = self.values.max(t)
        flat = lo == hi
        f = t[flat]
        self.k[f] = lo[flat].astype(np.float64)
        self.sk.reset(f)
        self.qk.reset(f)
        self.mag[f] = 0.0
        t = t[~flat]
        qk = np.maximum(self.qk.value(t), 0.0)
        broken = ~(np.isfinite(qk) & np.isfinite(self.sk.value(t)) & np.isfinite(self.mag[t]))
        bad = t[broken | (8.0 * np.finfo(np.float64).eps * self.mag[t] > self.TOLERANCE * qk)]
        if bad.size:
            self._recompute(bad)

    def _recompute(self, groups: I64) -> None:
        """Rebuild the spread of ``groups`` from their values, two-pass about the mean."""
        assert self.values is not None
        owner, enc, cnt = self.values.set.entries(groups)
        x = decode(enc, self.values.dtype).astype(np.float64)
        c = cnt.astype(np.float64)
        n = np.bincount(owner, weights=c, minlength=groups.size)
        mean = np.bincount(owner, weights=c * x, minlength=groups.size) / np.maximum(n, 1.0)
        d = x - mean[owner]
        self.k[groups] = mean
        self.sk.set(groups, np.bincount(owner, weights=c * d, minlength=groups.size))
        squares = np.bincount(owner, weights=c * d * d, minlength=groups.size)
        self.qk.set(groups, squares)
        self.mag[groups] = squares

    def sum(self, slots: I64) -> NumPair:
        return self.total.value(slots), None

    def mean(self, slots: I64) -> NumPair:
        n = self.n[slots]
        total = self.sum(slots)[0].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = total / np.maximum(n, 1)
        return out, n > 0

    def var(self, slots: I64) -> NumPair:
        """Sample variance (``ddof=1``): null below two values, NaN with an infinity."""
        n = self.n[slots]
        nfin = n - self.total.infinities(slots)
        nf = np.maximum(nfin, 2).astype(np.float64)
        sk = self.sk.value(slots)
        qk = self.qk.value(slots)
        with np.errstate(over="ignore", invalid="ignore"):  # squares past float64's range
            var = np.maximum(qk - sk * sk / nf, 0.0) / (nf - 1.0)
        return np.where(nfin < n, np.nan, var), n > 1

    def std(self, slots: I64) -> NumPair:
        """Sample standard deviation: the square root of :meth:`var`."""
        var, valid = self.var(slots)
        return np.sqrt(var), valid


class OrderStats:
    """Min, max and (option ``ranks``) quantiles of one numeric column per group.

    The values live in a :class:`ValueMultiset`. Without ``ranks`` it is *lazy*: a cycle's
    events wait in a log, and each group's min and max (for the ends asked about before)
    are carried by slot from the events alone, which decides them unless a value at the
    current end leaves without a value reaching it joining: a group's new max is the
    largest value joining it when that reaches its old max (the joining values are held
    after the cycle), else its old max when no leaving value is its old max. Only a group
    those rules cannot decide (its max left) is asked of the multiset, which takes the
    log first; so does :attr:`set`, and the log is folded in once it passes
    ``max(PENDING_MIN, len(multiset))`` events (memory stays ``O(live values)``, and each
    fold is one batch where every cycle's update was one). Over add-mostly data (counts
    that grow, prices that rise) no group's end is ever asked of the multiset.
    """

    arrow: ClassVar[bool] = False
    holds_rows: ClassVar[bool] = False

    #: the lazy log is folded into the multiset past this many events (or its size)
    PENDING_MIN = 4096

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> OrderStats:
        dtype = numpy_storage_dtype(types[0])
        assert dtype is not None
        return cls(dtype, "ranks" in options)

    def __init__(self, dtype: np.dtype[Any], ranks: bool = False) -> None:
        self.dtype = dtype
        self.ranks = ranks
        self._set = ValueMultiset(ranks)
        # the last min (False) and max (True) asked since the values last changed, by slots:
        # std heals from the min and max of the very groups min and max then ask for
        self._ends: dict[bool, tuple[I64, U64, Mask]] = {}
        # lazy (no ranks): events not yet in the multiset, valid values per slot, and each
        # end asked about so far (max: True) by slot, where ``_end_ok`` says it is current
        self._pend: list[tuple[I64, U64, I64]] = []
        self._npend = 0
        self._n = np.zeros(16, dtype=np.int64)
        self._end_val: dict[bool, U64] = {}
        self._end_ok: dict[bool, Mask] = {}

    @property
    def set(self) -> ValueMultiset:
        """The multiset of every group's values, current (the lazy log folded in)."""
        self._fold()
        return self._set

    def _fold(self) -> None:
        """Fold the lazy log into the multiset."""
        if not self._pend:
            return
        g, v, d = (np.concatenate(parts) for parts in zip(*self._pend, strict=True))
        self._pend, self._npend = [], 0
        self._set.update(g, v, d)

    def _grow(self, cap: int) -> None:
        if cap <= self._n.size:
            return
        cap = max(cap, 2 * self._n.size)
        self._n = grown_to(self._n, cap)
        for largest in self._end_val:  # new slots: unknown ends
            self._end_val[largest] = grown_to(self._end_val[largest], cap)
            self._end_ok[largest] = grown_to(self._end_ok[largest], cap)

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        self._ends.clear()
        if ev.slots.size == 0:
            return ev.touched
        (minus_v,), (plus_v,) = minus, plus
        vals = np.concatenate((minus_v[0], plus_v[0]))
        ok = np.concatenate((valid_mask(*minus_v), valid_mask(*plus_v)))
        every = bool(ok.all())
        g = ev.slots if every else ev.slots[ok]
        enc = encode(vals if every else vals[ok])
        sign = ev.sign if every else ev.sign[ok]
        if self.ranks:
            self._set.update(g, enc, sign)
            return ev.touched
        if g.size:
            self._carry(ev.touched, ev.inv if every else ev.inv[ok], enc, sign)
            self._pend.append((g, enc, sign))
            self._npend += g.size
            if self._npend > max(self.PENDING_MIN, len(self._set)):
                self._fold()
        return ev.touched

    def _carry(self, touched: I64, inv: I64, enc: U64, sign: I64) -> None:
        """Carry the valid-value counts and the known ends of ``touched`` through a
        cycle's valid events (``inv`` indexes ``touched``; minus events have sign -1)."""
        self._grow(int(touched[-1]) + 1)
        nt = touched.size
        n_old = self._n[touched]
        n_new = n_old + np.bincount(inv, weights=sign, minlength=nt).round().astype(np.int64)
        if (n_new < 0).any():
            raise UpdateInvariantError("A1", "a value was removed from a group that does not hold it")
        self._n[touched] = n_new
        if not self._end_val:
            return
        joins = sign > 0
        j_inv, j_enc = inv[joins], enc[joins]
        l_inv, l_enc = inv[~joins], enc[~joins]
        has = np.zeros(nt, dtype=bool)
        has[j_inv] = True
        new = n_old == 0
        for largest, val in self._end_val.items():
            okf = self._end_ok[largest]
            cur = val[touched]
            known = okf[touched]
            best = np.full(nt, 0 if largest else np.iinfo(np.uint64).max, dtype=np.uint64)
            (np.maximum if largest else np.minimum).at(best, j_inv, j_enc)
            reach = has & ((best >= cur) if largest else (best <= cur))
            lost = np.zeros(nt, dtype=bool)  # a leaving value at the known end
            lost[l_inv[(l_enc >= cur[l_inv]) if largest else (l_enc <= cur[l_inv])]] = True
            take = new | (known & reach)
            val[touched] = np.where(take, best, cur)
            okf[touched] = take | (known & ~lost) | (n_new == 0)

    def _end(self, slots: I64, largest: bool) -> NumPair:
        last = self._ends.get(largest)
        if last is not None and last[0].size == slots.size and np.array_equal(last[0], slots):
            enc, found = last[1], last[2]
        elif self.ranks:
            enc, found = self._set.max_of(slots) if largest else self._set.min_of(slots)
            self._ends[largest] = (slots.copy(), enc, found)
        else:
            if slots.size:
                self._grow(int(slots.max()) + 1)
            if largest not in self._end_val:  # asked for the first time: carried from now on
                self._end_val[largest] = np.zeros(self._n.size, dtype=np.uint64)
                self._end_ok[largest] = np.zeros(self._n.size, dtype=bool)
            val, okf = self._end_val[largest], self._end_ok[largest]
            miss = np.flatnonzero(~okf[slots])
            if miss.size:  # ends the events could not decide: the multiset's
                ask = np.unique(slots[miss])
                held = self.set
                got, _ = held.max_of(ask) if largest else held.min_of(ask)
                val[ask] = got
                okf[ask] = True
            enc, found = val[slots], self._n[slots] > 0
            self._ends[largest] = (slots.copy(), enc, found)
        return decode(enc, self.dtype), found.copy()

    def min(self, slots: I64) -> NumPair:
        return self._end(slots, largest=False)

    def max(self, slots: I64) -> NumPair:
        return self._end(slots, largest=True)

    def quantile(self, slots: I64, p: float) -> NumPair:
        """Linear-interpolated quantile ``p`` of each group's values, as float64.

        With ``n`` values ``x[0] <= ... <= x[n-1]``, ``h = p * (n - 1)``, ``i = floor(h)``:
        ``x[i]`` where ``h`` is whole or ``x[i] == x[i+1]``, else
        ``x[i] + (x[i+1] - x[i]) * (h - i)`` (pandas ``quantile(p)``); null without values.
        Two rank queries per group (one batch), never a scan of a group.
        """
        n = self.set.count_of(slots)
        has = np.flatnonzero(n > 0)
        out = np.zeros(slots.size, dtype=np.float64)
        if has.size == 0:
            return out, n > 0
        g, m = slots[has], n[has]
        h = p * (m - 1).astype(np.float64)
        lo = np.floor(h).astype(np.int64)
        frac = h - lo
        between = np.flatnonzero(frac > 0)
        enc = self.set.kth(np.concatenate((g, g[between])), np.concatenate((lo, lo[between] + 1)))
        x = decode(enc, self.dtype).astype(np.float64)
        val = x[: g.size].copy()
        a, b = val[between], x[g.size :]
        with np.errstate(invalid="ignore", over="ignore"):
            val[between] = np.where(a == b, a, a + (b - a) * frac[between])
        out[has] = val
        return out, n > 0


class Distinct:
    """Number of distinct valid values of one column per group (any type: Arrow values).

    Counts per ``(slot, value)`` pair, kept in a :class:`StoredKeyMap`: a hash finds the
    pair, equality of the slot and the value decides, so two different values are never
    counted as one (floats: ``-0.0`` is ``0.0``; nulls and NaN are skipped). Integer and
    float columns get a :class:`NumericDistinct` instead (:meth:`create` picks).
    """

    arrow: ClassVar[bool] = True
    holds_rows: ClassVar[bool] = False

    @classmethod
    def create(cls, types: Sequence[pa.DataType], options: frozenset[str],
               dep: Callable[[type[State]], State]) -> Distinct:
        t = types[0]
        if pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
            return NumericDistinct()
        return cls()

    def __init__(self) -> None:
        self.pairs: StoredKeyMap | None = None  # (slot, value) -> entry id
        self.e_cnt = np.zeros(1024, dtype=np.int64)  # rows per entry
        self.ids = IdAllocator()  # entry ids; freed ones are reusable at once
        self.nd = np.zeros(16, dtype=np.int64)

    def _alloc(self, n: int) -> I64:
        ids = self.ids.allocate(n)
        self.e_cnt = grown_to(self.e_cnt, self.ids.end)
        return ids

    @staticmethod
    def _counted(arr: pa.Array) -> Mask:
        """Values that count: not null, not NaN."""
        ok = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(len(arr), dtype=bool)
        if pa.types.is_floating(arr.type):
            ok &= ~np.asarray(pc.fill_null(pc.is_nan(arr), False).to_numpy(zero_copy_only=False), dtype=bool)
        return ok

    def apply(self, ev: Events, minus: Sequence[pa.Array], plus: Sequence[pa.Array]) -> I64:
        if ev.slots.size == 0:
            return ev.touched
        parts = [a.dictionary_decode() if pa.types.is_dictionary(a.type) else a for a in (minus[0], plus[0])]
        values = pa.concat_arrays(parts)
        ok = self._counted(values)
        pairs = pa.table({"slot": pa.array(ev.slots[ok], pa.int64()), "value": values.filter(pa.array(ok))})
        if self.pairs is None:
            self.pairs = StoredKeyMap(pairs.schema)
        ids, _ = self.pairs.intern(pairs, hash_columns(pairs.columns), self._alloc)
        self._count(ev, ok, ids)
        return ev.touched

    def _count(self, ev: Events, ok: Mask, ids: I64) -> None:
        """Add the signs of the counted events (``ok``) to their entries ``ids``; a group's
        distinct count moves where an entry's count leaves or reaches zero."""
        self.nd = grown_to(self.nd, int(ev.touched[-1]) + 1)
        uid, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        us = ev.slots[ok][first]
        net = np.bincount(inv.reshape(-1), weights=ev.sign[ok], minlength=uid.size).round().astype(np.int64)
        c0 = self.e_cnt[uid]
        c1 = c0 + net
        if (c1 < 0).any():
            raise UpdateInvariantError("A1", "count_distinct removed a value its group does not hold")
        self.e_cnt[uid] = c1
        gone = uid[c1 == 0]
        if gone.size:
            self._forget(gone)
            self.ids.free(gone)
            self.ids.release()
        step = (c1 > 0).astype(np.int64) - (c0 > 0).astype(np.int64)
        np.add.at(self.nd, us, step)

    def _forget(self, gone: I64) -> None:
        """Drop the entries ``gone`` (their counts reached zero) from the key map."""
        assert self.pairs is not None
        self.pairs.delete(gone)

    def count(self, slots: I64) -> NumPair:
        return self.nd[slots], None


class NumericDistinct(Distinct):
    """:class:`Distinct` of an integer or float column, in numpy (no Arrow in a cycle).

    Values are compared as 64-bit patterns: integers widened to ``int64`` (``uint64``
    wraps, still one pattern per value), floats to ``float64`` with ``-0.0`` made ``0.0``,
    so equal patterns are equal values (NaN is skipped). Each entry's slot, pattern and
    hash are kept by entry id; an :class:`ExactKeyMap` finds candidates by hash and those
    arrays decide.
    """

    arrow: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.map = ExactKeyMap(exact=False)  # (slot, value bits) -> entry id
        self.e_slot = np.zeros(1024, dtype=np.int64)
        self.e_bits = np.zeros(1024, dtype=np.int64)
        self.e_hash = np.zeros(1024, dtype=np.uint64)

    def _alloc(self, n: int) -> I64:
        ids = super()._alloc(n)
        self.e_slot = grown_to(self.e_slot, self.ids.end)
        self.e_bits = grown_to(self.e_bits, self.ids.end)
        self.e_hash = grown_to(self.e_hash, self.ids.end)
        return ids

    @staticmethod
    def _bits(v: npt.NDArray[Any]) -> I64:
        if v.dtype.kind == "f":
            out: I64 = (v.astype(np.float64) + 0.0).view(np.int64)  # -0.0 + 0.0 is 0.0
            return out
        wide: I64 = v.astype(np.int64)
        return wide

    def apply(self, ev: Events, minus: Sequence[NumPair], plus: Sequence[NumPair]) -> I64:
        if ev.slots.size == 0:
            return ev.touched
        (minus_v,), (plus_v,) = minus, plus
        vals = np.concatenate((minus_v[0], plus_v[0]))
        ok = np.concatenate((valid_mask(*minus_v), valid_mask(*plus_v)))
        all_ok = bool(ok.all())
        slots = ev.slots if all_ok else ev.slots[ok]
        bits = self._bits(vals if all_ok else vals[ok])
        h = combine(mix64(slots.view(np.uint64)), mix64(bits.view(np.uint64)))

        def same(i: I64, ids: I64) -> Mask:
            eq: Mask = (self.e_slot[ids] == slots[i]) & (self.e_bits[ids] == bits[i])
            return eq

        def same_batch(i: I64, j: I64) -> Mask:
            eq: Mask = (slots[i] == slots[j]) & (bits[i] == bits[j])
            return eq

        ids, added, first = self.map.intern(h, same, same_batch, self._alloc)
        if added.size:
            self.e_slot[added], self.e_bits[added], self.e_hash[added] = slots[first], bits[first], h[first]
        self._count(ev, ok, ids)
        return ev.touched

    def _forget(self, gone: I64) -> None:
        self.map.delete(self.e_hash[gone], gone)
