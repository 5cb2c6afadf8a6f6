"""The aggregation kinds of ``agg_by``: one class per kind, one registry (:data:`KINDS`).

A kind tells the listener everything that differs between aggregations, so the listener
holds no branch on a kind's name (the :class:`AggKind` protocol):

* **parameters** — which of ``column``, ``weight``, ``p`` and ``order`` an
  :class:`~engine.ops.aggregate.spec.Agg` of the kind takes (:meth:`AggKind.check`, run
  when the ``Agg`` is built) and the parent columns it reads (:meth:`AggKind.inputs`:
  the weighted kinds and sorted_first/sorted_last read two);
* **output type** given the input columns' types, or a SchemaError naming the table and
  the column (:meth:`AggKind.output_type`, run when ``agg_by`` is called);
* **states** — the :class:`Need` values it reads: a state class over some columns, with an
  option. Aggregations whose needs have the same class and columns share one state, built
  with the union of their options: ``sum``, ``mean``, ``std`` and ``var`` of a column
  share one ``Moments`` (std and var add ``"spread"``); ``min``, ``max``, ``median`` and
  ``percentile`` share one ``OrderStats`` (median and percentile add ``"ranks"``). A state
  may need another over the same columns: ``Moments`` with ``"spread"`` heals from the
  column's ``OrderStats``, which is then built (and fed) first;
* **add-only parents** — :meth:`AggKind.needs` and :meth:`AggKind.reads_rows` are told
  how the parent's rows can change (:class:`Growth`): over an insert-only parent
  (:attr:`engine.table.Table.insert_only`: no removes, no modifies) ``min``/``max`` keep a
  ``RunningExtremes``; over an add-only one (:attr:`engine.table.Table.add_only`: only
  appends) ``first``/``last`` also keep a ``RowEnds`` and ``sorted_first``/``sorted_last``
  a ``BestRows`` (:mod:`._addonly`), with no sorted state;
* **refresh** — once the states took a cycle's events, which groups to evaluate again
  (:meth:`AggKind.touched`) and their new values (:meth:`AggKind.values`). The listener
  writes and reports only values that changed.

Where each kind lives, and its output type (the numeric kinds take integer, float and bool
columns):

==============================  ==============================  ===========================
kinds                           state                           output type
==============================  ==============================  ===========================
count                           the listener's group sizes      int64
sum, abs_sum                    ``Moments``; ``AbsSums``        int64 for integers and bools
                                (:mod:`._states`, :mod:`._sums`) (wrapping like numpy),
                                                                else float64
mean, std, var                  ``Moments`` (:mod:`._states`)   float64
min, max                        ``OrderStats`` (:mod:`._states`) the column's type (any
                                a ``ValueMultiset``; add-only:  fixed-width: numbers, bools,
                                ``RunningExtremes``             timestamps, dates, durations)
median, percentile              ``OrderStats``                  float64
weighted_sum                    ``WeightedSums`` (:mod:`._sums`) int64 when value and weight
                                one per (column, weight)        are integers or bools, else
                                                                float64
weighted_avg                    ``WeightedSums``                float64
count_distinct                  ``Distinct`` (:mod:`._states`)  int64
first, last                     the listener's ``RowKeySet``    the column's type (any)
                                (it also finds removed rows'
                                groups and follows parent
                                shifts); add-only: ``RowEnds``
sorted_first, sorted_last       ``OrderedRows``                 the value column's type
                                (:mod:`._ordered`), one per     (any); the order column is
                                order column (it holds row      fixed-width, a string or
                                keys, follows parent shifts);   a binary
                                add-only: ``BestRows``
==============================  ==============================  ===========================

Adding an aggregation is one class here, one line in :data:`KINDS` and a row in the table
above; a constructor in :mod:`~engine.ops.aggregate.agg` (``tt.agg.<kind>``) is optional
sugar, and the wire protocol carries any kind by name with its column, weight, ``p`` and
order column (``docs/protocol.md`` lists them for clients).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.columns import numpy_storage_dtype
from engine.errors import SchemaError
from engine.ops.aggregate._addonly import BestRows, RowEnds, RunningExtremes
from engine.ops.aggregate._keys import fetch, fetch_numpy, orderable
from engine.ops.aggregate._ordered import OrderedRows
from engine.ops.aggregate._states import Cycle, Distinct, Moments, OrderStats, State
from engine.ops.aggregate._sums import AbsSums, WeightedSums

if TYPE_CHECKING:
    from engine.columns import ColumnSource
    from engine.ops.aggregate._sortedset import RowKeySet
    from engine.ops.aggregate.spec import Agg
    from engine.table import Table

__all__ = ["KINDS", "AggKind", "Growth", "Need", "Refresh", "build_states"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
NumPair = tuple[npt.NDArray[Any], Mask | None]
Values: TypeAlias = "NumPair | pa.Array"  # numpy if fixed-width, else Arrow (first/last)
_PARAMS = ("column", "weight", "p", "order")


class Growth(IntEnum):
    """How a parent's rows can change, each promise stronger than the one before (fixed
    for the parent's life; the listener fails the table if the parent breaks it)."""

    #: anything: removes, modifies, shifts, adds anywhere
    ANY = 0
    #: no removes and no modifies (:attr:`engine.table.Table.insert_only`): values never
    #: leave a group, so min/max run; rows still arrive anywhere and shift
    INSERTS = 1
    #: only adds above every current row key (:attr:`engine.table.Table.add_only`): a
    #: group's first row is its first ever, its last the last it gained
    APPENDS = 2


@dataclass(frozen=True, slots=True)
class Need:
    """A state an aggregation reads: ``state`` over ``columns``, with an ``option``.

    Equal needs (class and columns; the option is not compared) share one state, built
    with the union of their options."""

    state: type[State]
    columns: tuple[str, ...]
    option: str = field(default="", compare=False)


class Refresh:
    """What a cycle hands the kinds once the states took its events.

    ``touched`` are the groups whose membership changed, ``size`` every group's row count
    after the cycle, ``state_touched`` the groups each state saw events for, ``growth``
    how the parent's rows can change (the states were chosen for it).
    """

    def __init__(self, parent: Table, cy: Cycle, touched: I64, size: I64, states: dict[Need, State],
                 state_touched: dict[Need, I64], rows: RowKeySet | None, growth: Growth) -> None:
        self.parent, self.cy, self.touched, self.size = parent, cy, touched, size
        self.growth = growth
        self.states, self.state_touched, self.rows = states, state_touched, rows
        self._memo: dict[object, Any] = {}

    def memo(self, key: object, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per cycle for aggregations sharing ``key``."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def row_groups(self) -> tuple[I64, Mask]:
        """Live groups whose first or last row may have changed — membership changes, and
        groups of modified rows that stayed (whether the row is first or last is cheaper
        to ignore) — and which of them changed membership."""

        def make() -> tuple[I64, Mask]:
            cy, touched = self.cy, self.touched
            stay = np.unique(cy.m_new[~cy.moved]) if cy.moved.size else touched[:0]
            every = np.union1d(touched, stay) if stay.size else touched
            every = every[self.size[every] > 0]
            in_touched = np.isin(every, touched) if stay.size else np.ones(every.size, dtype=bool)
            return every, in_touched

        out: tuple[I64, Mask] = self.memo("row_groups", make)
        return out


class AggKind(Protocol):
    """One kind of aggregation (see the module docstring); an instance per kind in
    :data:`KINDS`."""

    #: the kind's name, as ``Agg.kind`` and the wire protocol spell it
    name: ClassVar[str]
    #: which of "column", "weight", "p", "order" an Agg of this kind takes
    params: ClassVar[tuple[str, ...]]

    def check(self, agg: Agg) -> None:
        """Raise SchemaError if ``agg`` lacks a parameter the kind takes, or has one more."""
        ...

    def default_name(self, column: str | None) -> str:
        """The output column's name when none is given."""
        ...

    def inputs(self, agg: Agg) -> tuple[str, ...]:
        """The parent columns ``agg`` reads, in order (value, then weight or order)."""
        ...

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        """The output type for inputs of ``types``; SchemaError if they do not fit."""
        ...

    def reads_rows(self, growth: Growth) -> bool:
        """Whether it reads the listener's per-group row-key set (first/last), over a
        parent whose rows change as ``growth`` says."""
        ...

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        """The states ``agg`` reads (the first is the one whose touched groups it
        refreshes), over a parent whose rows change as ``growth`` says."""
        ...

    def touched(self, agg: Agg, cx: Refresh) -> I64:
        """The groups (sorted slots) whose value of ``agg`` may have changed this cycle."""
        ...

    def values(self, agg: Agg, cx: Refresh, slots: I64) -> Values:
        """New values of ``agg`` for the live ``slots`` (a subset of :meth:`touched`)."""
        ...


def _numeric(agg: Agg, column: str, t: pa.DataType, table: str, role: str = "") -> None:
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) \
            and numpy_storage_dtype(t) is not None:
        return
    raise SchemaError(
        f"{agg.kind}({column!r}) needs a numeric {role}column, but {column!r} of table "
        f"{table!r} is {t}; use count/count_distinct/first/last instead"
    )


def _integral(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_boolean(t))


class _Kind:
    """Defaults: one column, values computed from the first needed state."""

    name: ClassVar[str]
    params: ClassVar[tuple[str, ...]] = ("column",)

    def check(self, agg: Agg) -> None:
        for param in _PARAMS:
            given = getattr(agg, param) is not None
            if given and param not in self.params:
                raise SchemaError(f"aggregation {self.name!r} takes no {param} "
                                  f"(got {getattr(agg, param)!r})")
            if not given and param in self.params:
                raise SchemaError(f"aggregation {self.name!r} needs a {param}")

    def default_name(self, column: str | None) -> str:
        return column or self.name

    def inputs(self, agg: Agg) -> tuple[str, ...]:
        return tuple(c for c in (agg.column, agg.weight, agg.order) if c is not None)

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        raise NotImplementedError

    def reads_rows(self, growth: Growth) -> bool:
        return False

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        return ()

    def touched(self, agg: Agg, cx: Refresh) -> I64:
        return cx.state_touched[self.needs(agg, cx.growth)[0]]

    def values(self, agg: Agg, cx: Refresh, slots: I64) -> Values:
        return self.evaluate(agg, cx.states[self.needs(agg, cx.growth)[0]], slots)

    def evaluate(self, agg: Agg, state: Any, slots: I64) -> NumPair:
        """New values from the kind's first state (typed by the subclass)."""
        raise NotImplementedError


class _StateKind(_Kind):
    """A kind reading one state, of class ``state`` over its inputs, with ``option``."""

    state: ClassVar[type[State]]
    option: ClassVar[str] = ""

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        return (Need(self.state, self.inputs(agg), self.option),)


# the kinds ----------------------------------------------------------------------------------
class Count(_Kind):
    name = "count"
    params: ClassVar[tuple[str, ...]] = ()

    def check(self, agg: Agg) -> None:
        if agg.column is not None:
            raise SchemaError(f"count takes no column (got {agg.column!r}); it counts rows, "
                              f"use count_distinct for values")
        super().check(agg)

    def default_name(self, column: str | None) -> str:
        return "count"

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        return pa.int64()

    def touched(self, agg: Agg, cx: Refresh) -> I64:
        return cx.touched

    def values(self, agg: Agg, cx: Refresh, slots: I64) -> Values:
        return cx.size[slots], None


class _MomentKind(_StateKind):
    state = Moments

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        assert agg.column is not None
        _numeric(agg, agg.column, types[0], table)
        return pa.float64()


class Sum(_MomentKind):
    name = "sum"

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        super().output_type(agg, types, table)
        return pa.float64() if pa.types.is_floating(types[0]) else pa.int64()

    def evaluate(self, agg: Agg, state: Moments, slots: I64) -> NumPair:
        return state.sum(slots)


class Mean(_MomentKind):
    name = "mean"

    def evaluate(self, agg: Agg, state: Moments, slots: I64) -> NumPair:
        return state.mean(slots)


class Std(_MomentKind):
    name = "std"
    option = "spread"

    def evaluate(self, agg: Agg, state: Moments, slots: I64) -> NumPair:
        return state.std(slots)


class Var(_MomentKind):
    name = "var"
    option = "spread"

    def evaluate(self, agg: Agg, state: Moments, slots: I64) -> NumPair:
        return state.var(slots)


class _OrderKind(_StateKind):
    state = OrderStats

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        if numpy_storage_dtype(types[0]) is None:
            raise SchemaError(
                f"{agg.kind}({agg.column!r}) needs a fixed-width column (numbers, bools, "
                f"timestamps), but {agg.column!r} of table {table!r} is {types[0]}; "
                f"use first/last or sort then first_by instead"
            )
        return types[0]


class Min(_OrderKind):
    """Over an insert-only parent (values never leave a group) a running value per group
    (``RunningExtremes``), else the ``OrderStats`` shared with median and percentile;
    :class:`Max` alike."""

    name = "min"

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        if growth >= Growth.INSERTS:
            return (Need(RunningExtremes, self.inputs(agg), self.name),)
        return super().needs(agg, growth)

    def evaluate(self, agg: Agg, state: OrderStats | RunningExtremes, slots: I64) -> NumPair:
        return state.min(slots)


class Max(Min):
    name = "max"

    def evaluate(self, agg: Agg, state: OrderStats | RunningExtremes, slots: I64) -> NumPair:
        return state.max(slots)


class Percentile(_OrderKind):
    name = "percentile"
    params: ClassVar[tuple[str, ...]] = ("column", "p")
    option = "ranks"

    def check(self, agg: Agg) -> None:
        super().check(agg)
        p: object = agg.p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) \
                or not 0.0 <= p <= 1.0:
            raise SchemaError(f"percentile({agg.column!r}) needs 0 <= p <= 1, got p={p!r}")

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        assert agg.column is not None
        _numeric(agg, agg.column, types[0], table)
        return pa.float64()

    def quantile(self, agg: Agg) -> float:
        assert agg.p is not None
        return float(agg.p)

    def evaluate(self, agg: Agg, state: OrderStats, slots: I64) -> NumPair:
        return state.quantile(slots, self.quantile(agg))


class Median(Percentile):
    name = "median"
    params: ClassVar[tuple[str, ...]] = ("column",)

    def check(self, agg: Agg) -> None:
        _Kind.check(self, agg)

    def quantile(self, agg: Agg) -> float:
        return 0.5


class AbsSum(_StateKind):
    name = "abs_sum"
    state = AbsSums

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        assert agg.column is not None
        _numeric(agg, agg.column, types[0], table)
        return pa.float64() if pa.types.is_floating(types[0]) else pa.int64()

    def evaluate(self, agg: Agg, state: AbsSums, slots: I64) -> NumPair:
        return state.total(slots)


class WeightedSum(_StateKind):
    name = "weighted_sum"
    params: ClassVar[tuple[str, ...]] = ("column", "weight")
    state = WeightedSums

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        assert agg.column is not None and agg.weight is not None
        _numeric(agg, agg.column, types[0], table)
        _numeric(agg, agg.weight, types[1], table, "weight ")
        return pa.int64() if _integral(types[0]) and _integral(types[1]) else pa.float64()

    def evaluate(self, agg: Agg, state: WeightedSums, slots: I64) -> NumPair:
        return state.total(slots)


class WeightedAvg(WeightedSum):
    name = "weighted_avg"

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        super().output_type(agg, types, table)
        return pa.float64()

    def evaluate(self, agg: Agg, state: WeightedSums, slots: I64) -> NumPair:
        return state.average(slots)


class CountDistinct(_StateKind):
    name = "count_distinct"
    state = Distinct

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        return pa.int64()

    def evaluate(self, agg: Agg, state: Distinct, slots: I64) -> NumPair:
        return state.count(slots)


class First(_Kind):
    """The value in the group's first row (smallest parent row key); :class:`Last` the
    last. Both read the listener's row-key set, any column type; over an add-only parent
    they read a ``RowEnds`` instead (a group's first row is its first ever, its last the
    last it gained)."""

    name = "first"
    largest: ClassVar[bool] = False

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        return types[0]

    def reads_rows(self, growth: Growth) -> bool:
        return growth is not Growth.APPENDS

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        return (Need(RowEnds, ()),) if growth is Growth.APPENDS else ()

    def touched(self, agg: Agg, cx: Refresh) -> I64:
        if cx.growth is Growth.APPENDS:  # a group's first row is set once; its last moves with every add
            ends = cx.states[Need(RowEnds, ())]
            assert isinstance(ends, RowEnds)
            return cx.state_touched[Need(RowEnds, ())] if self.largest else ends.born
        every, in_touched = cx.row_groups()
        if agg.column in cx.cy.modcols or in_touched.all():
            return every
        out: I64 = cx.memo("row_groups_touched", lambda: every[in_touched])
        return out

    def values(self, agg: Agg, cx: Refresh, slots: I64) -> Values:
        assert agg.column is not None
        src = cx.parent.column(agg.column)
        if cx.growth is Growth.APPENDS:
            held = cx.states[Need(RowEnds, ())]
            assert isinstance(held, RowEnds)
            return self._fetch(src, held.last[slots] if self.largest else held.first[slots])
        assert cx.rows is not None
        rows = cx.rows
        every, _ = cx.row_groups()

        def ends() -> I64:
            found = rows.max_of(every) if self.largest else rows.min_of(every)
            return found[0].view(np.int64)

        keys: I64 = cx.memo(("row_ends", self.largest), ends)
        if slots.size != every.size:  # slots are a subset of every
            keys = keys[np.searchsorted(every, slots)]
        return self._fetch(src, keys)

    @staticmethod
    def _fetch(src: ColumnSource, keys: I64) -> Values:
        return fetch_numpy(src, keys, False) if numpy_storage_dtype(src.type) is not None \
            else fetch(src, keys, False)


class Last(First):
    name = "last"
    largest = True


class SortedFirst(_Kind):
    """The value in the group's first row in the order of another column: the smallest
    order value, the smallest row key among equal ones (``sort(order)`` then ``first_by``,
    over the rows with an order value: null and NaN are skipped); :class:`SortedLast` the
    last (largest value, largest row key). An ``OrderedRows`` per order column, or over an
    add-only parent a ``BestRows``, shared by the aggregations ordered by that column; the
    value column is read only for the groups whose value may have changed."""

    name = "sorted_first"
    params: ClassVar[tuple[str, ...]] = ("column", "order")
    largest: ClassVar[bool] = False

    def output_type(self, agg: Agg, types: Sequence[pa.DataType], table: str) -> pa.DataType:
        if not orderable(types[1]):
            raise SchemaError(
                f"{agg.kind}({agg.column!r}, order={agg.order!r}) needs an order column of "
                f"numbers, bools, timestamps, dates, durations, strings or binaries, but "
                f"{agg.order!r} of table {table!r} is {types[1]}; cast it first (update())")
        return types[0]

    def needs(self, agg: Agg, growth: Growth) -> tuple[Need, ...]:
        assert agg.order is not None
        best = growth is Growth.APPENDS
        return (Need(BestRows if best else OrderedRows, (agg.order,), "last" if self.largest else "first"),)

    def touched(self, agg: Agg, cx: Refresh) -> I64:
        need = self.needs(agg, cx.growth)[0]
        if cx.growth is Growth.APPENDS:
            best = cx.states[need]
            assert isinstance(best, BestRows)
            return best.changed[self.largest]
        base = cx.state_touched[need]
        cy = cx.cy
        if agg.column not in cy.modcols or not cy.moved.size or cy.moved.all():
            return base

        def make() -> I64:  # groups whose rows' values changed, the row staying in them
            stay = np.unique(cy.m_new[~cy.moved])
            out: I64 = np.union1d(base, stay)
            return out

        out: I64 = cx.memo(("sorted_touched", need), make)
        return out

    def values(self, agg: Agg, cx: Refresh, slots: I64) -> Values:
        assert agg.column is not None
        need = self.needs(agg, cx.growth)[0]
        state = cx.states[need]
        assert isinstance(state, (BestRows, OrderedRows))
        last: dict[str, Any] = cx.memo(("sorted_ends", need, self.largest), dict)
        if "slots" in last and np.array_equal(last["slots"], slots):
            keys, found = last["ends"]
        else:  # once per cycle for the aggregations ordered by one column
            keys, found = state.ends(slots, self.largest)
            last["slots"], last["ends"] = slots, (keys, found)
        return _fetch_found(cx.parent.column(agg.column), keys, found)


class SortedLast(SortedFirst):
    name = "sorted_last"
    largest = True


def _fetch_found(src: ColumnSource, keys: I64, found: Mask) -> Values:
    """Values of ``src`` at ``keys`` where ``found``, null elsewhere."""
    hit = np.flatnonzero(found)
    every = hit.size == found.size
    if numpy_storage_dtype(src.type) is not None:
        vals, valid = fetch_numpy(src, keys if every else keys[hit], False)
        if every:
            return vals, valid
        out = np.zeros(found.size, dtype=vals.dtype)
        out[hit] = vals
        ok = np.zeros(found.size, dtype=bool)
        ok[hit] = True if valid is None else valid
        return out, ok
    arr = fetch(src, keys if every else keys[hit], False)
    if every:
        return arr
    at = np.zeros(found.size, dtype=np.int64)
    at[hit] = np.arange(hit.size, dtype=np.int64)
    return arr.take(pa.array(at, mask=~found))


#: every aggregation kind by name: one line per kind
KINDS: dict[str, AggKind] = {
    "sum": Sum(),
    "count": Count(),
    "min": Min(),
    "max": Max(),
    "mean": Mean(),
    "std": Std(),
    "var": Var(),
    "abs_sum": AbsSum(),
    "weighted_sum": WeightedSum(),
    "weighted_avg": WeightedAvg(),
    "median": Median(),
    "percentile": Percentile(),
    "first": First(),
    "last": Last(),
    "count_distinct": CountDistinct(),
    "sorted_first": SortedFirst(),
    "sorted_last": SortedLast(),
}


def build_states(needs: Sequence[Need], types_of: Callable[[tuple[str, ...]], list[pa.DataType]]
                 ) -> dict[Need, State]:
    """One state per distinct need (options merged), dependencies before their dependents
    (the order the listener feeds them in)."""
    options: dict[Need, set[str]] = {}
    for n in needs:
        options.setdefault(n, set())
        if n.option:
            options[n].add(n.option)
    built: dict[Need, State] = {}

    def make(need: Need) -> State:
        if need not in built:
            state = need.state.create(types_of(need.columns), frozenset(options.get(need, ())),
                                      lambda cls: make(Need(cls, need.columns)))
            built[need] = state  # after its dependencies: dict order is feeding order
        return built[need]

    for n in options:
        make(n)
    return built
