"""The aggregation constructors, ``tt.agg.sum(...)`` and friends: one per kind of the registry.

Each builds an :class:`~engine.ops.aggregate.spec.Agg` of one kind of
:data:`engine.ops.aggregate._kinds.KINDS`, which holds what the kind means (its parameters,
types and state); a kind without a constructor here is still reachable as
``Agg(kind, column, name)``. ``sum``, ``min`` and ``max`` shadow the builtins on purpose,
inside this namespace only.

Examples
--------
>>> from engine.ops.aggregate import agg
>>> t.agg_by([agg.sum("Qty"), agg.count(), agg.std("Price", "PxStd")], by="Sym")
>>> t.agg_by([agg.median("Price"), agg.percentile("Price", 0.9, "P90"),
...           agg.weighted_avg("Price", "Qty", "VWAP")], by="Sym")
"""

from __future__ import annotations

from engine.ops.aggregate.spec import Agg as Agg

__all__ = [
    "Agg",
    "abs_sum",
    "count",
    "count_distinct",
    "first",
    "last",
    "max",
    "mean",
    "median",
    "min",
    "percentile",
    "sorted_first",
    "sorted_last",
    "std",
    "sum",
    "var",
    "weighted_avg",
    "weighted_sum",
]


def sum(col: str, name: str | None = None) -> Agg:
    """Sum of ``col`` per group: nulls and NaN skipped, 0 for a group without values.

    int64 for integer and bool columns (wrapping like numpy), float64 for floats.

    Examples
    --------
    >>> sum("Qty")
    Agg(kind='sum', column='Qty', name='Qty', weight=None, p=None, order=None)
    """
    return Agg("sum", col, name or col)


def count(name: str = "count") -> Agg:
    """Number of rows per group (nulls included), in column ``name`` (int64).

    Examples
    --------
    >>> count("N")
    Agg(kind='count', column=None, name='N', weight=None, p=None, order=None)
    """
    return Agg("count", None, name)


def min(col: str, name: str | None = None) -> Agg:
    """Smallest non-null value of ``col`` per group (null if none), in ``col``'s type.

    Examples
    --------
    >>> min("Px", "Lo").name
    'Lo'
    """
    return Agg("min", col, name or col)


def max(col: str, name: str | None = None) -> Agg:
    """Largest non-null value of ``col`` per group (null if none), in ``col``'s type.

    Examples
    --------
    >>> max("Px", "Hi").name
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
    Agg(kind='var', column='Px', name='PxVar', weight=None, p=None, order=None)
    """
    return Agg("var", col, name or col)


def abs_sum(col: str, name: str | None = None) -> Agg:
    """Sum of the absolute values of ``col`` per group (0 for a group without values).

    Nulls and NaN skipped; int64 for integer and bool columns (wrapping like numpy: the
    absolute value of the smallest int64 is itself), float64 for floats.

    Examples
    --------
    >>> abs_sum("Pnl", "Gross")
    Agg(kind='abs_sum', column='Pnl', name='Gross', weight=None, p=None, order=None)
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
    Agg(kind='weighted_sum', column='Px', name='Notional', weight='Qty', p=None, order=None)
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
    Agg(kind='weighted_avg', column='Px', name='VWAP', weight='Qty', p=None, order=None)
    """
    return Agg("weighted_avg", col, name or col, weight=weight)


def median(col: str, name: str | None = None) -> Agg:
    """Median of the non-null values of ``col`` per group: ``percentile(col, 0.5)``.

    The mean of the two middle values of an even group, float64, null without values.
    Kept incrementally: removing a group's median costs what any change costs.

    Examples
    --------
    >>> median("Px", "Mid")
    Agg(kind='median', column='Px', name='Mid', weight=None, p=None, order=None)
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
    Agg(kind='percentile', column='Px', name='P95', weight=None, p=0.95, order=None)
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


def sorted_first(col: str, order: str, name: str | None = None) -> Agg:
    """Value of ``col`` in the group's first row in the order of column ``order``.

    The row with the smallest ``order`` value, and among equal values the one with the
    smallest parent row key: per group, the first row of ``sort(order)`` (a stable sort)
    over the rows whose ``order`` value is not null and not NaN; rows without one are
    never chosen, and a group without any is null. The value is taken null or not, in
    ``col``'s type (any type). ``order`` may be any fixed-width column (numbers, bools,
    timestamps, dates, durations; ``-0.0`` ties with ``0.0``) or a string or binary
    column (bytewise: code point order). Deephaven's ``AggSortedFirst``.

    Aggregations ordered by the same column share one state, whatever their values.

    See Also
    --------
    sorted_last : the last row in that order.
    first : the first row in parent row order.

    Examples
    --------
    >>> sorted_first("Qty", order="Price", name="QtyAtLow")
    Agg(kind='sorted_first', column='Qty', name='QtyAtLow', weight=None, p=None, order='Price')
    """
    return Agg("sorted_first", col, name or col, order=order)


def sorted_last(col: str, order: str, name: str | None = None) -> Agg:
    """Value of ``col`` in the group's last row in the order of column ``order``.

    The row with the largest ``order`` value, and among equal values the one with the
    largest parent row key: per group, the last row of ``sort(order)`` (a stable sort)
    over the rows whose ``order`` value is not null and not NaN, so "the row with the
    highest price" skips rows without a price; a group without any is null. Types as
    :func:`sorted_first`. Deephaven's ``AggSortedLast``.

    Examples
    --------
    >>> sorted_last("Qty", order="Price")
    Agg(kind='sorted_last', column='Qty', name='Qty', weight=None, p=None, order='Price')
    """
    return Agg("sorted_last", col, name or col, order=order)


def count_distinct(col: str, name: str | None = None) -> Agg:
    """Number of distinct non-null values of ``col`` per group (int64).

    Examples
    --------
    >>> count_distinct("Venue", "Venues").kind
    'count_distinct'
    """
    return Agg("count_distinct", col, name or col)

