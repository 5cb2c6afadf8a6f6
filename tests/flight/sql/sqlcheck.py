"""Comparing a live SQL view with DuckDB's answer to the same SQL over the same rows.

Values are compared after normalizing: numbers as floats (DuckDB's HUGEINT sums arrive as
decimals, the view's as int64), ``-0.0`` as ``0.0``, floats to 9 significant digits for the
multiset order and then with a relative tolerance (float sums and moments depend on the
order of additions), NaN equal to NaN.
"""

from __future__ import annotations

import decimal
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from engine.table import Table

#: one connection for every answer in this process, opened at the first (opening one costs
#: tens of milliseconds, more than most answers), used by one thread at a time
_duck: list[duckdb.DuckDBPyConnection] = []
_duck_lock = threading.Lock()


def duck_answer(sql: str, tables: Mapping[str, pa.Table], params: list[Any] | None = None) -> pa.Table:
    """DuckDB's answer to ``sql`` over ``tables`` (registered under their names, and only
    those: each is unregistered before the next answer)."""
    with _duck_lock:
        if not _duck:
            _duck.append(duckdb.connect())
        con = _duck[0]
        try:
            for name, data in tables.items():
                con.register(name, data)
            return con.sql(sql, params=params).to_arrow_table()
        finally:
            for name in tables:
                con.unregister(name)


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float, decimal.Decimal)):
        f = float(v)
        if math.isnan(f):
            return "NaN"
        return f + 0.0  # -0.0 -> 0.0
    return v


def _key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, "")
    if isinstance(v, float):
        return (1, float(f"{v:.9g}"))
    return (2, str(v)) if isinstance(v, str) else (3, repr(v))


def _rows(t: pa.Table, columns: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    names = list(columns) if columns is not None else t.column_names
    cols = [[_norm(v) for v in t.column(t.column_names.index(n)).to_pylist()] for n in names]
    return list(zip(*cols, strict=True)) if cols else [()] * t.num_rows


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def _same_rows(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(_same(x, y) for x, y in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True))


def mismatch(got: pa.Table, want: pa.Table, order: Sequence[str] = (), limited: bool = False
             ) -> str | None:
    """Why ``got`` (the view) differs from ``want`` (DuckDB), or None when it agrees.

    Always: the same column names and row count. Without ``order``: the same rows as
    multisets. With ``order`` (the output columns ORDER BY names): the same sequence of
    those columns, and unless ``limited`` (a LIMIT may cut a tie either way) the same
    multiset of whole rows.
    """
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != DuckDB's {want.column_names}"
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows != DuckDB's {want.num_rows}"
    if order:
        g, w = _rows(got, order), _rows(want, order)
        if not _same_rows(g, w):
            return f"ORDER BY columns {list(order)} differ:\n  view   {g}\n  duckdb {w}"
        if limited:
            return None
    rk = lambda r: tuple(_key(v) for v in r)  # noqa: E731
    g, w = sorted(_rows(got), key=rk), sorted(_rows(want), key=rk)
    if not _same_rows(g, w):
        extra = [r for r in g if r not in w][:10]
        missing = [r for r in w if r not in g][:10]
        return f"rows differ: view only {extra}; duckdb only {missing}"
    return None


def check_view(view: Table, sql: str, sources: Mapping[str, Table], order: Sequence[str] = (),
               limited: bool = False) -> None:
    """Assert the live ``view`` equals DuckDB's answer to ``sql`` over the sources now."""
    want = duck_answer(sql, {n: t.to_arrow() for n, t in sources.items()})
    problem = mismatch(view.to_arrow(), want, order, limited)
    assert problem is None, f"{sql}: {problem}"


def check_query(registry: Any, runner: Any, sql: str, params: list[Any] | None = None) -> None:
    """``runner``'s answer to ``sql`` (a :class:`~flight.sql.query.QueryRunner` over
    ``registry``'s tables) equals DuckDB's over the whole tables: the same schema, and the
    same rows (as sequences under a top-level ``ORDER BY``, else as multisets). DuckDB's
    answer takes back the types the server gives a duration or zoned timestamp column read
    as it is (:func:`flight.sql.query.duration_outputs`; tested against the tables in
    test_query)."""
    from flight.sql.parse import parse_one
    from flight.sql.query import duration_outputs, named_tables, restore_durations

    query = runner.start(sql, params)
    got = pa.Table.from_batches(list(runner.batches(query)), query.schema)
    want = duck_answer(sql, {n: registry.get(n).table.to_arrow() for n in registry.names()}, params)
    tree = parse_one(sql)
    held = {i: t for i, t in duration_outputs(tree, named_tables(tree, registry, "query")).items()
            if want.schema.field(i).type != t}
    if held:
        want = pa.Table.from_batches([restore_durations(b, held) for b in want.to_batches()]
                                     or [], restore_durations(want.schema, held))
    assert got.num_rows == want.num_rows, sql
    assert got.schema.equals(want.schema), (sql, got.schema, want.schema)
    if parse_one(sql).args.get("order") is not None:  # the result's order, not a window's
        assert got.to_pylist() == want.to_pylist(), sql
    else:
        assert mismatch(got, want) is None, sql

