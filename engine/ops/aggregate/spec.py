"""The aggregation spec :class:`Agg`: a kind of the registry, its columns and parameters.

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

__all__ = ["Agg", "make_agg"]


@dataclass(frozen=True, slots=True)
class Agg:
    """One aggregation: ``kind`` of ``column``, written to the output column ``name``.

    ``weight`` is the weight column of the weighted kinds, ``p`` the quantile of
    ``percentile`` and ``order`` the column ``sorted_first``/``sorted_last`` order rows
    by; other kinds leave them ``None``. Build it with the constructors of
    :mod:`engine.ops.aggregate.agg` (``tt.agg.sum``, ``tt.agg.count``, ...), or directly
    with any kind of the registry.

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
    order: str | None = None

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise SchemaError(f"unknown aggregation {self.kind!r} (known: {', '.join(KINDS)})")
        spec.check(self)


def make_agg(kind: str, column: str | None = None, name: str | None = None, *,
             weight: str | None = None, p: float | None = None, order: str | None = None) -> Agg:
    """An :class:`Agg` of any registered ``kind``, its name defaulting as the kind says
    (the column; ``"count"`` for count). What the TableService builds from the wire.

    Examples
    --------
    >>> make_agg("percentile", "Px", p=0.9)
    Agg(kind='percentile', column='Px', name='Px', weight=None, p=0.9, order=None)
    >>> make_agg("count").name
    'count'
    """
    spec = KINDS.get(kind)
    if spec is None:
        raise SchemaError(f"unknown aggregation {kind!r} (known: {', '.join(KINDS)})")
    return Agg(kind, column, name or spec.default_name(column), weight, p, order)
