"""The aggregation spec :class:`Agg` and its constructors (``tt.agg.sum(...)`` and friends).

An :class:`Agg` names a kind, its input column(s), its parameters and its output column; it
is a plain value (frozen, comparable, hashable) that travels to the server as one
``Aggregation`` message. What a kind means — which parameters it takes, which types it
accepts, the state it keeps — is the registry's (:mod:`engine.ops.aggregate._kinds`), so an
``Agg`` of any registered kind can be built directly: ``Agg("median", "Px", "Mid")``.
Semantics, null handling and types of every kind: :mod:`engine.ops.aggregate.listener`.

Examples
--------
>>> import pyarrow as pa
>>> from engine.graph import UpdateGraph
>>> from engine.ops.aggregate import agg
>>> g = UpdateGraph()
>>> t = g.keyed_table(pa.schema([("Sym", pa.string()), ("Key", pa.int64()),
...                              ("Px", pa.float64()), ("Qty", pa.int64())]), "Key")
>>> t.upsert(pa.table({"Sym": ["A", "A", "A", "B"], "Key": [1, 2, 3, 4],
...                    "Px": [10.0, 11.0, 14.0, 20.0], "Qty": [100, 300, 100, 5]}))
>>> _ = g.run_cycle()
>>> r = t.agg_by([agg.median("Px", "Mid"), agg.percentile("Px", 0.25, "P25"),
...               agg.weighted_avg("Px", "Qty", "VWAP"), agg.var("Px", "Var")], by="Sym")
>>> r.to_pandas()
  Sym   Mid   P25  VWAP       Var
0   A  11.0  10.5  11.4  4.333333
1   B  20.0  20.0  20.0       NaN
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SchemaError
from engine.ops.aggregate._kinds import KINDS

__all__ = [
    "Agg",
    "abs_sum",
    "count",
    "count_distinct",
    "first",
    "last",
    "make_agg",
    "max_",
    "mean",
    "median",
    "min_",
    "percentile",
    "std",
    "sum_",
    "var",
    "weighted_avg",
    "weighted_sum",
]


@dataclass(frozen=True, slots=True)
class Agg:
    """One aggregation: ``kind`` of ``column``, written to the output column ``name``.

    ``weight`` is the weight column of the weighted kinds and ``p`` the quantile of
    ``percentile``; other kinds leave them ``None``. Build it with the constructors
    (:func:`sum_`, :func:`count`, :func:`median`, ...), re-exported as ``tt.agg.sum`` and
    friends, or directly with any kind of the registry.

    Raises
    ------
    SchemaError
        If ``kind`` is unknown, or a column, weight or ``p`` is missing, extra or out of
        range for it.
    """

    kind: str
    column: str | None
    name: str
    weight: str | None = None
    p: float | None = None

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise SchemaError(f"unknown aggregation {self.kind!r} (known: {', '.join(KINDS)})")
        spec.check(self)


def make_agg(kind: str, column: str | None = None, name: str | None = None, *,
             weight: str | None = None, p: float | None = None) -> Agg:
    """An :class:`Agg` of any registered ``kind``, its name defaulting as the kind says
    (the column; ``"count"`` for count). What the TableService builds from the wire.

    Examples
    --------
    >>> make_agg("percentile", "Px", p=0.9)
    Agg(kind='percentile', column='Px', name='Px', weight=None, p=0.9)
    >>> make_agg("count").name
    'count'
    """
    spec = KINDS.get(kind)
    if spec is None:
        raise SchemaError(f"unknown aggregation {kind!r} (known: {', '.join(KINDS)})")
    return Agg(kind, column, name or spec.default_name(column), weight, p)


def sum_(col: str, name: str | None = None) -> Agg:
    """Sum of ``col`` per group: nulls and NaN skipped, 0 for a group without values.

    int64 for integer and bool columns (wrapping like numpy), float64 for floats.

    Examples
    --------
    >>> sum_("Qty")
    Agg(kind='sum', column='Qty', name='Qty', weight=None, p=None)
    """
    return Agg("sum", col, name or col)


def count(name: str = "count") -> Agg:
    """Number of rows per group (nulls included), in column ``name`` (int64).

    Examples
    --------
    >>> count("N")
    Agg(kind='count', column=None, name='N', weight=None, p=None)
    """
    return Agg("count", None, name)


def min_(col: str, name: str | None = None) -> Agg:
    """Smallest non-null value of ``col`` per group (null if none), in ``col``'s type.

    Examples
    --------
    >>> min_("Px", "Lo").name
    'Lo'
    """
    return Agg("min", col, name or col)


def max_(col: str, name: str | None = None) -> Agg:
    """Largest non-null value of ``col`` per group (null if none), in ``col``'s type.

    Examples
    --------
    >>> max_("Px", "Hi").name
    'Hi'
    """
    return Agg("max", col, name or col)


def mean(col: str, name: str | None = None) -> Agg:
    """Mean of the non-null values of ``col`` per group (float64; null if none).

    Examples
    --------
    >>> mean("Px").kind
    'mean'
    """
    return Agg("mean", col, name or col)


def std(col: str, name: str | None = None) -> Agg:
    """Sample standard deviation (``ddof=1``) of ``col`` per group (null below two values).

    See Also
    --------
    var : its square.

    Examples
    --------
    >>> std("Px", "PxStd").name
    'PxStd'
    """
    return Agg("std", col, name or col)


def var(col: str, name: str | None = None) -> Agg:
    """Sample variance (``ddof=1``) of ``col`` per group, as pandas ``var()`` (float64).

    Null below two values; NaN when the group holds an infinity. Shares its state with
    ``sum``, ``mean`` and ``std`` of the same column.

    Examples
    --------
    >>> var("Px", "PxVar")
    Agg(kind='var', column='Px', name='PxVar', weight=None, p=None)
    """
    return Agg("var", col, name or col)


def abs_sum(col: str, name: str | None = None) -> Agg:
    """Sum of the absolute values of ``col`` per group (0 for a group without values).

    Nulls and NaN skipped; int64 for integer and bool columns (wrapping like numpy: the
    absolute value of the smallest int64 is itself), float64 for floats.

    Examples
    --------
    >>> abs_sum("Pnl", "Gross")
    Agg(kind='abs_sum', column='Pnl', name='Gross', weight=None, p=None)
    """
    return Agg("abs_sum", col, name or col)


def weighted_sum(col: str, weight: str, name: str | None = None) -> Agg:
    """Sum of ``col * weight`` per group, over the rows where both are valid.

    A row whose value or weight is null or NaN is skipped; a group without such rows is
    null (as Deephaven's ``AggWSum``). int64 when both columns are integers or bools
    (wrapping like numpy), else float64 in IEEE arithmetic (``inf * 0`` is NaN).

    Examples
    --------
    >>> weighted_sum("Px", "Qty", "Notional")
    Agg(kind='weighted_sum', column='Px', name='Notional', weight='Qty', p=None)
    """
    return Agg("weighted_sum", col, name or col, weight=weight)


def weighted_avg(col: str, weight: str, name: str | None = None) -> Agg:
    """Weighted mean of ``col`` per group: ``sum(col * weight) / sum(weight)`` (float64).

    Both sums run over the same rows, those where value and weight are valid (not null,
    not NaN), as Deephaven's ``AggWAvg``; null when there is no such row or the weights
    sum to 0. Shares its state with :func:`weighted_sum` of the same two columns.

    Examples
    --------
    >>> weighted_avg("Px", "Qty", "VWAP")
    Agg(kind='weighted_avg', column='Px', name='VWAP', weight='Qty', p=None)
    """
    return Agg("weighted_avg", col, name or col, weight=weight)


def median(col: str, name: str | None = None) -> Agg:
    """Median of the non-null values of ``col`` per group: ``percentile(col, 0.5)``.

    The mean of the two middle values of an even group, float64, null without values.
    Kept incrementally: removing a group's median costs what any change costs.

    Examples
    --------
    >>> median("Px", "Mid")
    Agg(kind='median', column='Px', name='Mid', weight=None, p=None)
    """
    return Agg("median", col, name or col)


def percentile(col: str, p: float, name: str | None = None) -> Agg:
    """The ``p`` quantile (``0 <= p <= 1``) of the non-null values of ``col`` per group.

    Linear interpolation, as pandas ``quantile(p, interpolation="linear")``: with ``n``
    sorted values ``x``, ``h = p * (n - 1)`` and ``i = floor(h)``, the result is
    ``x[i] + (x[i+1] - x[i]) * (h - i)`` (``x[i]`` where ``h`` is whole or the two values
    are equal, so two equal infinities give that infinity, not NaN). float64; null
    without values. ``p=0`` is the min, ``p=1`` the max, ``p=0.5`` the median.

    Raises
    ------
    SchemaError
        If ``p`` is not a number in ``[0, 1]``.

    Examples
    --------
    >>> percentile("Px", 0.95, "P95")
    Agg(kind='percentile', column='Px', name='P95', weight=None, p=0.95)
    """
    return Agg("percentile", col, name or col, p=p)


def first(col: str, name: str | None = None) -> Agg:
    """Value of ``col`` in the group's first row (smallest parent row key), null or not.

    Examples
    --------
    >>> first("Px", "Open").name
    'Open'
    """
    return Agg("first", col, name or col)


def last(col: str, name: str | None = None) -> Agg:
    """Value of ``col`` in the group's last row (largest parent row key), null or not.

    Examples
    --------
    >>> last("Px", "Close").name
    'Close'
    """
    return Agg("last", col, name or col)


def count_distinct(col: str, name: str | None = None) -> Agg:
    """Number of distinct non-null values of ``col`` per group (int64).

    Examples
    --------
    >>> count_distinct("Venue", "Venues").kind
    'count_distinct'
    """
    return Agg("count_distinct", col, name or col)

