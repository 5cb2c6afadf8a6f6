"""Linear operators on Z-set batches, fused: map, filter, flat_map, explode, negate,
the general ``join_function`` and the temporal filter built on it (seed 001).

An operator ``OP`` is *linear* when ``OP(x + y) == OP(x) + OP(y)``: it can be applied to
each update of a batch on its own, so it needs no state and passes frontiers through
unchanged. The dataflow graph (:mod:`engine.differential.dataflow`) runs a chain of them
as one node, fusing consecutive ones. Seed 001 shows they are all one operator: ``join_function(logic)``, where
``logic`` maps a record to updates ``(record2, time2, diff2)`` and the input update
``(record, time, diff)`` becomes ``(record2, time.join(time2), diff * diff2)``. Here
``logic`` works on a whole Arrow table of records at once and returns an
:class:`Expansion`: the output records, the input row (``parents``) each came from, and
optionally a time and a weight per output row.

A :class:`LinearOperator` is a chain of such stages, built fluently and applied in one
pass (``followed_by`` composes two chains): consecutive expression stages (``map`` with
``pyarrow.compute`` expressions, ``filter`` with a predicate expression) run as a single
Acero plan, and every stage only gathers numpy weights and times by ``parents``; no
intermediate batch is built, consolidated or checked between stages. Callables are
vectorized functions of an Arrow table, never per-record Python. Outputs are not
consolidated (use :meth:`ZSet.consolidate`).

Null handling: a filter keeps a record only where its predicate is true (null is false).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from engine import expr as _expr
from engine.differential.zset import DIFF, TIME, ZSet
from engine.errors import ExpressionError, InputError

__all__ = ["Expansion", "LinearOperator"]

I64 = npt.NDArray[np.int64]
_ROW = "__row"

ArrayResult: TypeAlias = "npt.ArrayLike | pa.Array | pa.ChunkedArray"
TableFn: TypeAlias = Callable[[pa.Table], pa.Table]
MaskFn: TypeAlias = Callable[[pa.Table], ArrayResult]
IntSpec: TypeAlias = "pc.Expression | str | Callable[[pa.Table], ArrayResult]"


@dataclass(frozen=True, slots=True)
class Expansion:
    """What ``logic`` makes of a table of ``n`` records (the general linear operator).

    Attributes
    ----------
    parents
        Per output row, the input row (``0 <= p < n``) it comes from; any number of
        output rows per input row, in any order.
    data
        The output records.
    times
        Optional ``(m, d)`` int64 versions, joined (coordinate-wise max) with the input
        row's time. ``None`` keeps the input time.
    diffs
        Optional int64 weights, multiplied with the input row's weight. ``None`` is 1.
    """

    parents: npt.ArrayLike
    data: pa.Table
    times: npt.ArrayLike | None = None
    diffs: npt.ArrayLike | None = None


@dataclass(frozen=True, slots=True)
class _Project:
    exprs: tuple[tuple[str, pc.Expression], ...]
    columns: tuple[str, ...] | None = None   # set when every output is an input column by name
    # set when every output is an input column by name or an _IntOp: computed in numpy
    simple: tuple[str | _IntOp, ...] | None = None


@dataclass(frozen=True, slots=True)
class _IntOp:
    """``column op scalar``: one of Arrow's unchecked integer ``add``, ``subtract``,
    ``multiply`` and ``divide`` of a column by an int64 scalar, which numpy computes with
    the same result on a null-free int64 column (both wrap on overflow; ``divide``
    truncates toward zero, and only a divisor ``> 0`` is taken: Arrow's errors and its
    ``INT64_MIN / -1`` stay with Arrow)."""

    column: str
    op: str
    scalar: int

    def __call__(self, data: pa.Table) -> pa.Array | None:
        """The result on ``data``, or None when the column is missing, is not a null-free
        int64 column, or the divisor is not positive (the expression then goes to Acero)."""
        if self.column not in data.schema.names:
            return None
        col = data.column(self.column)
        if col.type != pa.int64() or col.null_count or (self.op == "divide" and self.scalar <= 0):
            return None
        a = np.asarray(col.to_numpy(), dtype=np.int64)
        k = self.scalar
        if self.op == "add":
            return pa.array(a + k)
        if self.op == "subtract":
            return pa.array(a - k)
        if self.op == "multiply":
            return pa.array(a * k)
        q = a // k  # floor; truncation differs for a negative dividend not a multiple of k
        if a.size and int(a.min()) < 0:
            q += (a < 0) & (a % k != 0)
        return pa.array(q)


_INT_OP = re.compile(r"(add|subtract|multiply|divide)\((.+), (-?[0-9]+)\)")


def _simple(e: pc.Expression) -> str | _IntOp | None:
    """``e`` as a column name or an :class:`_IntOp` when it is one of those exactly.

    The expression's text proposes the candidate, which must then be equal to ``e``
    (``Expression.equals``: same function, field reference and typed scalar), so a
    look-alike (a nested field, an int32 scalar, a checked function) is never taken for one.
    """
    text = str(e)
    if pc.field(text).equals(e):
        return text
    m = _INT_OP.fullmatch(text)
    if m is None:
        return None
    op, column, k = m.group(1), m.group(2), int(m.group(3))
    if not -(1 << 63) <= k < (1 << 63):
        return None
    return _IntOp(column, op, k) if getattr(pc, op)(pc.field(column), pc.scalar(k)).equals(e) else None


@dataclass(frozen=True, slots=True)
class _Where:
    predicate: pc.Expression


@dataclass(frozen=True, slots=True)
class _Call:
    fn: TableFn


@dataclass(frozen=True, slots=True)
class _Mask:
    fn: MaskFn


@dataclass(frozen=True, slots=True)
class _Expand:
    logic: Callable[[pa.Table], Expansion]
    what: str
    times: bool
    diffs: bool


@dataclass(frozen=True, slots=True)
class _Temporal:
    lower: IntSpec
    upper: IntSpec


@dataclass(frozen=True, slots=True)
class _Negate:
    pass


_Stage: TypeAlias = "_Project | _Where | _Call | _Mask | _Expand | _Temporal | _Negate"


class _State:
    """Records flowing through the stages, with the weights and times they carry."""

    __slots__ = ("data", "diffs", "times")

    def __init__(self, data: pa.Table, diffs: I64, times: I64 | None) -> None:
        self.data, self.diffs, self.times = data, diffs, times

    def gather(self, rows: I64, data: pa.Table) -> None:
        self.data = data
        self.diffs = self.diffs[rows]
        self.times = None if self.times is None else self.times[rows]


class LinearOperator:
    """A fused chain of linear stages, applied to a batch in one pass.

    Build it fluently from the identity, then call it on batches. Each method returns a
    new operator; the chain itself is immutable and can be shared.

    Examples
    --------
    Seed 001's ``map(|x| (x, x.len()))`` over a collection of names:

    >>> names = ZSet.from_triples([("frank", 6, 1), ("frank", 8, 1), ("david", 8, 1),
    ...                            ("frank", 9, -2)], ["name"])
    >>> op = LinearOperator().map({"name": "name", "len": pc.utf8_length(pc.field("name"))})
    >>> op(names).to_triples()[:2]
    [(('frank', 5), (6,), 1), (('frank', 5), (8,), 1)]
    """

    __slots__ = ("stages",)

    def __init__(self, stages: Sequence[_Stage] = ()) -> None:
        self.stages: tuple[_Stage, ...] = tuple(stages)

    def __repr__(self) -> str:
        return f"LinearOperator({', '.join(type(s).__name__.lstrip('_').lower() for s in self.stages)})"

    def _then(self, stage: _Stage) -> LinearOperator:
        return LinearOperator(self.stages + (stage,))

    @property
    def keeps_times(self) -> bool:
        """Whether every output row is at its input row's time (no ``join_function`` or
        ``temporal_filter`` stage)."""
        return not any(isinstance(s, _Temporal) or (isinstance(s, _Expand) and s.times) for s in self.stages)

    @property
    def reads(self) -> set[str] | None:
        """The input columns the chain reads, when it starts by picking columns by name (a
        ``map`` of column names, after any ``negate``); ``None``: maybe every column."""
        for s in self.stages:  # a loop per leading negate
            if isinstance(s, _Negate):
                continue
            if isinstance(s, _Project) and s.columns is not None:
                return set(s.columns)
            return None
        return None

    @property
    def renames(self) -> list[tuple[str, str]] | None:
        """``(output name, input column)`` per output column when the whole chain is one
        ``map`` of column names (it only picks and renames columns); else ``None``."""
        if len(self.stages) != 1:
            return None
        s = self.stages[0]
        if not isinstance(s, _Project) or s.columns is None:
            return None
        return [(name, col) for (name, _), col in zip(s.exprs, s.columns, strict=True)]

    def followed_by(self, other: LinearOperator) -> LinearOperator:
        """This chain, then ``other``'s, as one operator (seed 001's ``followed_by``)."""
        return LinearOperator(self.stages + other.stages)

    # stages -------------------------------------------------------------------------
    def map(self, f: Mapping[str, pc.Expression | str] | TableFn) -> LinearOperator:
        """Replace each record by a new one.

        Parameters
        ----------
        f
            ``{name: expression or column name}`` giving the output columns in order, or a
            function from a table of records to a table with as many rows.
        """
        if callable(f):
            return self._then(_Call(f))
        exprs = tuple((name, pc.field(e) if isinstance(e, str) else e) for name, e in f.items())
        if not exprs:
            raise ExpressionError("map needs at least one output column")
        for name, e in exprs:
            if not isinstance(e, pc.Expression):
                raise ExpressionError(
                    f"map column {name!r}: expected a pyarrow.compute.Expression or a column name, "
                    f"got {type(e).__name__}"
                )
            if name in (DIFF, TIME, _ROW):
                raise ExpressionError(f"map cannot make a column named {name!r} (reserved)")
        renames = tuple(e for e in f.values() if isinstance(e, str))
        simple = tuple(_simple(e) for _, e in exprs)
        return self._then(_Project(exprs, renames if len(renames) == len(exprs) else None,
                                   None if None in simple else simple))  # type: ignore[arg-type]

    def filter(self, predicate: pc.Expression | MaskFn) -> LinearOperator:
        """Keep the records for which ``predicate`` is true (a boolean expression, or a
        function from a table to a boolean array)."""
        if isinstance(predicate, pc.Expression):
            return self._then(_Where(predicate))
        if callable(predicate):
            return self._then(_Mask(predicate))
        raise ExpressionError(
            f"filter: expected a pyarrow.compute.Expression or a callable, got {type(predicate).__name__}"
        )

    def flat_map(self, f: Callable[[pa.Table], Expansion]) -> LinearOperator:
        """Replace each record by any number of records (``f`` returns an
        :class:`Expansion` without times or diffs)."""
        return self._then(_Expand(f, "flat_map", times=False, diffs=False))

    def explode(self, f: Callable[[pa.Table], Expansion]) -> LinearOperator:
        """Replace each record by weighted records (``f`` returns an :class:`Expansion`
        with ``diffs``, multiplied with the input weights; negative flips the sign)."""
        return self._then(_Expand(f, "explode", times=False, diffs=True))

    def join_function(self, logic: Callable[[pa.Table], Expansion]) -> LinearOperator:
        """The general linear operator: join the batch with the updates ``logic`` makes.

        Each output row gets time ``input_time.join(time2)`` and weight
        ``input_diff * diff2``.
        """
        return self._then(_Expand(logic, "join_function", times=True, diffs=True))

    def temporal_filter(self, lower: IntSpec | None, upper: IntSpec | None) -> LinearOperator:
        """Keep each record only at versions whose first coordinate ``c`` has
        ``lower <= c < upper``.

        ``lower``/``upper`` are integer expressions, column names or functions of the
        records; either may be ``None`` (no bound), and a null value means no bound for
        that record. An upper bound at or below the lower one keeps the record never.
        Built on :meth:`join_function`: a record becomes ``(record, (lower, 0..), +1)``
        and ``(record, (upper, 0..), -1)``; pairs that cancel (both land at the input
        time) are dropped. The input must be timed.
        """
        if lower is None and upper is None:
            return self
        return self._then(_Temporal(lower, upper))

    def negate(self) -> LinearOperator:
        """Flip every weight."""
        return self._then(_Negate())

    # applying -----------------------------------------------------------------------
    def __call__(self, batch: ZSet) -> ZSet:
        """Apply the chain to ``batch``.

        Raises
        ------
        ExpressionError
            If an expression does not fit the records, or a function breaks its contract.
        InputError
            If times are produced for an untimed batch, or their dimension differs.
        """
        st = _State(batch.data, batch.diffs, batch.times)
        i = 0
        stages = self.stages
        while i < len(stages):
            j = i
            while j < len(stages) and isinstance(stages[j], (_Project, _Where)):
                j += 1
            if j > i:  # a run of expression stages: one Acero plan
                run = stages[i:j]
                if all(isinstance(s, _Project) and s.columns is not None for s in run):
                    _select(st, run)  # type: ignore[arg-type]
                elif not (all(isinstance(s, _Project) and s.simple is not None for s in run)
                          and _compute(st, run)) and not _direct(st, run):  # type: ignore[arg-type]
                    _run_plan(st, run)  # type: ignore[arg-type]
                i = j
                continue
            _apply(st, stages[i])
            i += 1
        return ZSet(st.data, st.diffs, st.times)


def _columns(t: pa.Table) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in t.schema)


def _run_plan(st: _State, stages: Sequence[_Project | _Where]) -> None:
    # a filter drops rows: each output row carries its input row (_ROW) to gather the
    # weights and times by. Projections alone keep every row in order (one thread), so
    # the weights and times stay as they are.
    filters = any(isinstance(s, _Where) for s in stages)
    row = [_ROW] if filters else []
    table = st.data.append_column(_ROW, pa.array(np.arange(st.data.num_rows, dtype=np.int64))) if filters else st.data
    decls = [acero.Declaration("table_source", acero.TableSourceNodeOptions(table))]
    for s in stages:
        if isinstance(s, _Where):
            decls.append(acero.Declaration("filter", acero.FilterNodeOptions(s.predicate)))
        else:
            names = [n for n, _ in s.exprs] + row
            decls.append(acero.Declaration(
                "project", acero.ProjectNodeOptions([e for _, e in s.exprs] + [pc.field(c) for c in row], names)))
    try:
        # one thread keeps the output rows in input order
        out = acero.Declaration.from_sequence(decls).to_table(use_threads=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as exc:
        text = "; ".join(
            f"filter {s.predicate}" if isinstance(s, _Where)
            else "map " + ", ".join(f"{n}={e}" for n, e in s.exprs) for s in stages
        )
        raise ExpressionError(f"{text} failed on records ({_columns(st.data)}): {exc}") from exc
    if not filters:
        st.data = out
        return
    rows = np.asarray(out.column(_ROW).to_numpy(), dtype=np.int64)
    st.gather(rows, out.drop_columns([_ROW]))


#: each expression stage's binding to the schemas it met: (stage, schema) by (id(stage), schema),
#: the stage kept so that its id is not another's; bounded by the stages and schemas a
#: process makes (a dataflow's operators meet one schema each)
_BOUND: dict[tuple[int, pa.Schema], tuple[object, list[_expr.BoundExpression] | None]] = {}
_BOUND_MAX = 4096


def _bound(stage: _Project | _Where, schema: pa.Schema) -> list[_expr.BoundExpression] | None:
    """The stage's expressions bound to ``schema`` when each has a direct tree
    (:mod:`engine.expr`), else None (also when they do not bind: the plan says why)."""
    key = (id(stage), schema)
    hit = _BOUND.get(key)
    if hit is not None and hit[0] is stage:
        return hit[1]
    exprs = [stage.predicate] if isinstance(stage, _Where) else [e for _, e in stage.exprs]
    try:
        bound: list[_expr.BoundExpression] | None = [
            _expr.bind(e, schema, table_name="records", what="expression") for e in exprs]
    except ExpressionError:
        bound = None
    if bound is not None and (any(b.direct is None for b in bound) or (
            isinstance(stage, _Where) and bound[0].type != pa.bool_())):
        bound = None  # the plan refuses a predicate that is not boolean, naming it
    if len(_BOUND) >= _BOUND_MAX:
        _BOUND.clear()
    _BOUND[key] = (stage, bound)
    return bound


def _direct(st: _State, stages: Sequence[_Project | _Where]) -> bool:
    """The stages by calling their expressions' functions on the columns (``engine.expr``'s
    direct path: a plan costs more to set up than a step's batch takes); False, with ``st``
    untouched, when an expression has no direct tree or fails (the plan then runs and
    reports the failure its own way). Off with ``engine.expr.DIRECT`` (tests run the plan)."""
    if not _expr.DIRECT:
        return False
    data, rows = st.data, None
    for s in stages:
        bound = _bound(s, data.schema)
        if bound is None:
            return False
        cols = {n: data.column(n) for n in data.schema.names}
        try:
            if isinstance(s, _Where):
                keep = np.flatnonzero(_expr.predicate_mask(bound[0], cols, data.num_rows))
                data = data.take(keep)
                rows = keep if rows is None else rows[keep]
            else:
                data = pa.Table.from_arrays(_expr.evaluate_many(bound, cols, data.num_rows),
                                            names=[n for n, _ in s.exprs])
        except ExpressionError:
            return False
    if rows is None:
        st.data = data
    else:
        st.gather(rows, data)
    return True


def _compute(st: _State, stages: Sequence[_Project]) -> bool:
    """Projections of columns and :class:`_IntOp` s in numpy (an Acero plan costs more to
    set up than these take on a step's batch, and Arrow's integer ``divide`` several times
    numpy's); False, with ``st`` untouched, when one of them does not fit the records."""
    data = st.data
    for s in stages:
        assert s.simple is not None
        cols: list[pa.Array | pa.ChunkedArray | None] = [
            (data.column(x) if x in data.schema.names else None) if isinstance(x, str) else x(data)
            for x in s.simple]
        if any(c is None for c in cols):
            return False
        data = pa.Table.from_arrays(cols, names=[n for n, _ in s.exprs])
    st.data = data
    return True


def _select(st: _State, stages: Sequence[_Project]) -> None:
    """Projections that only pick and rename columns: no plan needed (small batches pay
    most of an Acero plan's cost in setting it up)."""
    data = st.data
    for s in stages:
        assert s.columns is not None
        missing = [c for c in s.columns if c not in data.column_names]
        if missing:
            raise ExpressionError(f"map: no column(s) {missing} in the records ({_columns(data)})")
        data = pa.Table.from_arrays([data.column(c) for c in s.columns], names=[n for n, _ in s.exprs])
    st.data = data


def _as_numpy(values: npt.ArrayLike | pa.Array | pa.ChunkedArray) -> npt.NDArray[np.generic]:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.null_count:
            if pa.types.is_boolean(values.type):
                values = values.fill_null(False)
            else:
                raise ExpressionError(f"expected no nulls, got {values.null_count}")
        return np.asarray(values.to_numpy(zero_copy_only=False))
    return np.asarray(values)


def _apply(st: _State, s: _Stage) -> None:
    n = st.data.num_rows
    if isinstance(s, _Negate):
        st.diffs = -st.diffs
    elif isinstance(s, _Call):
        out = s.fn(st.data)
        if not isinstance(out, pa.Table) or out.num_rows != n:
            got = f"{out.num_rows} rows" if isinstance(out, pa.Table) else type(out).__name__
            raise ExpressionError(f"map function {s.fn!r} must return a pyarrow Table of {n} rows, got {got}")
        bad = [c for c in out.column_names if c in (DIFF, TIME)]
        if bad:
            raise ExpressionError(f"map function {s.fn!r} returned reserved column(s) {bad}")
        st.data = out
    elif isinstance(s, _Mask):
        mask = _as_numpy(s.fn(st.data))
        if mask.dtype != np.bool_ or mask.shape != (n,):
            raise ExpressionError(f"filter function {s.fn!r} must return {n} booleans, got {mask.dtype} {mask.shape}")
        rows = np.flatnonzero(mask)
        st.gather(rows, st.data.take(rows))
    elif isinstance(s, _Expand):
        _expand(st, s.logic(st.data), s)
    elif isinstance(s, _Temporal):
        _temporal(st, s)
    else:  # expression stages run as plans in __call__
        _run_plan(st, [s])


def _expand(st: _State, exp: Expansion, s: _Expand) -> None:
    n = st.data.num_rows
    what = s.what
    if not isinstance(exp, Expansion):
        raise ExpressionError(f"{what} logic must return an Expansion, got {type(exp).__name__}")
    m = exp.data.num_rows
    parents = np.asarray(exp.parents, dtype=np.int64).reshape(-1)
    if parents.size != m:
        raise ExpressionError(f"{what} logic returned {parents.size} parents for {m} output rows")
    if m and (parents.min() < 0 or parents.max() >= n):
        raise ExpressionError(f"{what} logic returned parents outside 0..{n - 1}")
    bad = [c for c in exp.data.column_names if c in (DIFF, TIME)]
    if bad:
        raise ExpressionError(f"{what} logic returned reserved column(s) {bad}")
    diffs = st.diffs[parents]
    if exp.diffs is not None:
        if not s.diffs:
            raise ExpressionError(f"{what} logic may not return diffs (use explode or join_function)")
        d2 = np.asarray(exp.diffs, dtype=np.int64).reshape(-1)
        if d2.size != m:
            raise ExpressionError(f"{what} logic returned {d2.size} diffs for {m} output rows")
        diffs = diffs * d2
    times = None if st.times is None else st.times[parents]
    if exp.times is not None:
        if not s.times:
            raise ExpressionError(f"{what} logic may not return times (use join_function)")
        t2 = np.asarray(exp.times, dtype=np.int64)
        if t2.ndim == 1:
            t2 = t2.reshape(-1, 1)
        if times is None:
            raise InputError(f"{what} logic returned times but the batch is untimed")
        if t2.shape != times.shape:
            raise InputError(f"{what} logic returned times of shape {t2.shape}, expected {times.shape}")
        times = np.maximum(times, t2)  # the lattice join of versions
    st.data, st.diffs, st.times = exp.data, diffs, times


def _int_values(spec: IntSpec, data: pa.Table, what: str) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Evaluate a bound: ``(values, valid)``, nulls invalid."""
    if isinstance(spec, str):
        spec = pc.field(spec)
    if isinstance(spec, pc.Expression):
        st = _State(data, np.zeros(data.num_rows, dtype=np.int64), None)
        _run_plan(st, [_Project(((what, spec),))])
        arr: object = st.data.column(0)
    else:
        arr = spec(data)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.Array):
        if not pa.types.is_integer(arr.type):
            raise ExpressionError(f"temporal_filter {what} bound must be an integer, got {arr.type}")
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        vals = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return vals, np.asarray(valid, dtype=bool)
    vals = np.asarray(arr)
    if vals.dtype.kind not in "iu" or vals.shape != (data.num_rows,):
        raise ExpressionError(f"temporal_filter {what} bound must give {data.num_rows} integers")
    return vals.astype(np.int64), np.ones(vals.size, dtype=bool)


def _temporal(st: _State, s: _Temporal) -> None:
    if st.times is None:
        raise InputError("temporal_filter needs a timed batch (its bounds are versions)")
    n, d = st.times.shape
    data = st.data
    lo, lo_ok = _int_values(s.lower, data, "lower") if s.lower is not None else \
        (np.zeros(n, np.int64), np.zeros(n, bool))
    hi, hi_ok = _int_values(s.upper, data, "upper") if s.upper is not None else \
        (np.zeros(n, np.int64), np.zeros(n, bool))
    lo = np.where(lo_ok, np.maximum(lo, 0), 0)
    hi = np.maximum(hi, lo)                      # an empty interval: the pair cancels
    up = np.flatnonzero(hi_ok)
    parents = np.concatenate((np.arange(n, dtype=np.int64), up))
    t2 = np.zeros((parents.size, d), dtype=np.int64)
    t2[:n, 0] = lo
    t2[n:, 0] = hi[up]
    d2 = np.concatenate((np.ones(n, np.int64), -np.ones(up.size, np.int64)))
    times = np.maximum(st.times[parents], t2)
    # a record retracted no later than it appears never shows: drop both rows of the pair
    cancel = (times[n:] == times[up]).all(axis=1)
    keep = np.ones(parents.size, dtype=bool)
    keep[up[cancel]] = False
    keep[n + np.flatnonzero(cancel)] = False
    rows = parents[keep]
    st.data = data.take(rows)
    st.diffs = st.diffs[rows] * d2[keep]
    st.times = times[keep]
