"""A selective scan's rows found first over the columns its ``WHERE`` reads (late
materialization).

DuckDB scans a registered Arrow table column by column, all of each column the query reads:
``SELECT * FROM t WHERE sym = 'AAPL'`` over a 10M-row table of 20 columns converts 20
columns of 10M values to keep a few rows. A mature scan reads the filter's columns first and
the rest only for the rows kept. DuckDB's own tables do that; its Arrow scan has no row
number to come back with. So the server does it in two passes, both DuckDB's:

1. **The narrow pass.** The query's table, cut to the columns its ``WHERE`` reads plus a
   column of row positions (:class:`Positions`: one shared ``uint32`` range, sliced
   zero-copy), is scanned by ``SELECT position FROM table WHERE <the query's WHERE> LIMIT
   cap + 1``: the positions of the rows the ``WHERE`` keeps.
2. **The query.** If no more than ``cap`` rows were kept, the table is replaced, for this
   query, by exactly those rows (:func:`take_rows`, in the table's order), and the query
   runs as written over them. Otherwise it runs over the whole table as before: a
   ``WHERE`` that keeps many rows stops the narrow pass early at ``cap + 1``, so the pass
   costs little exactly when it does not pay.

The query's answer cannot change: it has the shape of
:func:`flight.sql.query.key_points`'s (one table, named once in its ``FROM``; SQL filters
rows before it groups, windows, orders or limits them), its ``WHERE`` is run again over the
kept rows, and rows keep their order. What :func:`plan` refuses: a ``WHERE`` that calls a
function it does not know (a volatile one would keep other rows the second time), reads a
subquery, a window or an aggregate, names a column the table does not have (DuckDB lets a
``WHERE`` name an output's alias), or reads every column the query reads (nothing to gain);
a parameter outside the ``WHERE``; and a table of fewer than :data:`MIN_ROWS` rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from sqlglot import exp

__all__ = ["MIN_ROWS", "POSITION", "NarrowPlan", "Positions", "plan", "read_columns", "star_only",
           "take_rows", "worth"]

#: The narrow pass runs for tables of at least this many rows: below it, DuckDB's second
#: query (its parse, bind and plan, ~0.3 ms) costs more than the columns it skips.
MIN_ROWS = 1 << 19

#: The narrow pass keeps at most ``rows // CAP_DIVISOR`` rows (or :data:`MIN_CAP`): taking
#: more rows from every column costs about what scanning the other columns saved.
CAP_DIVISOR = 128
MIN_CAP = 1024

#: The position column's name in the narrow pass (a table with a column of this name
#: keeps its queries on the whole table).
POSITION = "__ticktable_position"
#: The narrow pass's table name.
NARROW_TABLE = "__ticktable_narrow"

#: Expression nodes a ``WHERE`` may hold for the narrow pass: operators, literals, columns,
#: casts and deterministic functions. A function outside these (``random()``, an unknown
#: name, which sqlglot parses as ``Anonymous``) keeps the query on the whole table.
_REFUSED = (exp.Select, exp.Subquery, exp.Window, exp.AggFunc, exp.Anonymous, exp.Rand,
            exp.Exists, exp.Lambda)


@dataclass(frozen=True, slots=True)
class NarrowPlan:
    """What the narrow pass reads and runs for one query.

    ``columns`` are the table's columns the ``WHERE`` reads (schema names), ``sql`` the pass
    (``SELECT position ... LIMIT {limit}``, the limit filled in by :meth:`text`). ``star``:
    the query is ``SELECT * FROM table WHERE ...`` and nothing more, so the rows the pass
    keeps, in the table's order, are its answer (DuckDB need not run it again).
    """

    columns: tuple[str, ...]
    sql: str
    star: bool = False

    def text(self, rows: int) -> str:
        """The pass's SQL for a table of ``rows`` rows (its ``LIMIT`` is the cap + 1)."""
        return self.sql.replace("__TICKTABLE_LIMIT__", str(cap(rows) + 1))


def cap(rows: int) -> int:
    """The most rows the narrow pass keeps for a table of ``rows`` rows."""
    return max(MIN_CAP, rows // CAP_DIVISOR)


def _fold(schema: pa.Schema) -> dict[str, str | None]:
    """Column names by their lower case (DuckDB's unquoted names are case-insensitive);
    ``None`` for a folding two columns share."""
    out: dict[str, str | None] = {}
    for name in schema.names:
        key = name.lower()
        out[key] = None if key in out else name
    return out


def read_columns(tree: exp.Expression, names: set[str], schema: pa.Schema) -> set[str] | None:
    """The columns of the query's one table that ``tree`` reads (schema names); ``None``
    when that is all of them or unknown (a ``*`` other than ``count(*)``'s, a column
    qualified by another name, a folding two columns share)."""
    fold = _fold(schema)
    out: set[str] = set()
    for star in tree.find_all(exp.Star):
        if not isinstance(star.parent, exp.Count):
            return None
    for col in tree.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            return None
        if col.table and col.table not in names:
            return None
        name = fold.get(col.name.lower(), "")
        if name is None:
            return None
        if name:
            out.add(name)
    return out


def plan(tree: exp.Expression, table: exp.Table, where: exp.Expression, names: set[str],
         schema: pa.Schema) -> NarrowPlan | None:
    """The narrow pass for a query of the one-table shape (see the module docstring), or
    ``None`` when it cannot run or cannot gain.

    ``table`` is the query's ``FROM`` table, ``where`` its ``WHERE`` condition, ``names``
    the names the table goes by in the query.
    """
    if any(where.find(kind) is not None for kind in _REFUSED) or isinstance(where, _REFUSED):
        return None
    if sum(1 for _ in tree.find_all(exp.Placeholder)) != sum(1 for _ in where.find_all(exp.Placeholder)):
        return None  # a parameter outside the WHERE: the pass's parameters would not line up
    fold = _fold(schema)
    if POSITION.lower() in fold:
        return None
    filtered: set[str] = set()
    for col in where.find_all(exp.Column):
        if col.table and col.table not in names:
            return None
        name = fold.get(col.name.lower())
        if name is None:
            return None  # an output's alias, or a name two columns share: leave it to DuckDB
        filtered.add(name)
    if not filtered:
        return None
    read = read_columns(tree, names, schema)
    if read is not None and read <= filtered:
        return None  # the query reads no column the WHERE does not
    alias = exp.to_identifier(table.alias_or_name, quoted=True).sql(dialect="duckdb")
    sql = (f'SELECT {alias}."{POSITION}" FROM "{NARROW_TABLE}" AS {alias} '
           f"WHERE {where.sql(dialect='duckdb')} LIMIT __TICKTABLE_LIMIT__")
    ordered = tuple(n for n in schema.names if n in filtered)
    return NarrowPlan(ordered, sql, star_only(tree, {table.alias_or_name}))


#: The parts a ``SELECT * FROM table WHERE ...`` has (any other, set, is a clause).
_STAR_PARTS = frozenset({"expressions", "from", "from_", "where"})


def star_only(tree: exp.Expression, names: set[str]) -> bool:
    """Whether ``tree`` is ``SELECT * FROM table WHERE ...`` (or ``name.*``, ``name`` the
    table's name in scope: its alias if it has one) and nothing more: no clause, no
    ``EXCLUDE``/``REPLACE``/``RENAME`` on the star."""
    if not isinstance(tree, exp.Select) or len(tree.expressions) != 1:
        return False
    if any(v for k, v in tree.args.items() if k not in _STAR_PARTS):
        return False
    star = tree.expressions[0]
    if isinstance(star, exp.Column) and isinstance(star.this, exp.Star):
        if star.table not in names or star.args.get("db") or star.args.get("catalog"):
            return False
        star = star.this
    return isinstance(star, exp.Star) and not any(star.args.values())


#: The cost model of :func:`worth`, in nanoseconds per row (DuckDB's scan of an Arrow
#: column through the server's stream, measured at 10M rows: ~0.19 for a fixed-width
#: column, the position column ~0.11) and milliseconds (the query run again over the kept
#: rows: DuckDB's parse, bind and plan).
NS_FIXED, NS_VARIABLE, NS_POSITION, MS_AGAIN = 0.19, 1.0, 0.11, 1.2


def worth(rows: pa.Table, first: NarrowPlan) -> bool:
    """Whether the narrow pass over ``rows`` (the query's snapshot, which holds the columns
    it reads) should save more than it costs: the columns its ``WHERE`` does not read are
    not scanned, the position column is, and a query other than ``SELECT *`` runs again
    over the kept rows. A gain only for large tables, more for wide rows and strings."""
    skipped = [f.type for f in rows.schema if f.name not in first.columns]
    ns = sum(NS_VARIABLE if not _fixed_width(t) else NS_FIXED for t in skipped)
    gain_ms = rows.num_rows * ns / 1e6
    cost_ms = rows.num_rows * NS_POSITION / 1e6 + (0.0 if first.star else MS_AGAIN)
    return gain_ms > cost_ms


def _fixed_width(t: pa.DataType) -> bool:
    try:
        return t.bit_width > 0
    except ValueError:
        return False


class Positions:
    """Row positions ``0 .. n-1`` as Arrow ``uint32`` arrays, sliced from one shared range.

    The range grows (by doubling) to the largest table a narrow pass read, and is kept:
    4 bytes a row of that table, once for the server, instead of a new array per query.
    """

    def __init__(self) -> None:
        self._range = np.arange(0, dtype=np.uint32)
        self._lock = threading.Lock()

    def first(self, n: int) -> pa.Array:
        """Positions ``0 .. n-1`` (zero-copy from the shared range); ``n`` < 2**32."""
        with self._lock:
            if self._range.size < n:
                size = max(n, 2 * self._range.size, 1 << 16)
                self._range = np.arange(min(size, 2**32 - 1), dtype=np.uint32)
            shared = self._range
        return pa.Array.from_buffers(pa.uint32(), n, [None, pa.py_buffer(shared)])

    @property
    def nbytes(self) -> int:
        """Bytes the shared range holds."""
        return int(self._range.nbytes)


def narrow_table(rows: pa.Table, columns: Sequence[str], positions: Positions) -> pa.Table:
    """``rows``' ``columns`` and their positions (:data:`POSITION`), zero-copy."""
    cols = [rows.column(c) for c in columns]
    return pa.Table.from_arrays([*cols, positions.first(rows.num_rows)],
                                names=[*columns, POSITION])


def take_rows(rows: pa.Table, found: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The rows of ``rows`` at the positions ``found`` (any order, no nulls), in the
    table's order: column by column, a column of several chunks chunk by chunk (a
    ``take`` over a chunked column would join its chunks first: ~24 ms for a 10M-row
    table of 153 chunks, whatever the rows taken)."""
    where = np.sort(np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64))
    if not where.size or not rows.num_columns:
        return rows.schema.empty_table()
    index = pa.array(where)
    cols: list[pa.Array] = []
    for column in rows.columns:
        if column.num_chunks == 1:
            cols.append(column.chunk(0).take(index))
            continue
        lengths = np.fromiter((len(c) for c in column.chunks), dtype=np.int64,
                              count=column.num_chunks)
        starts = np.concatenate(([0], np.cumsum(lengths)))
        chunk = np.searchsorted(starts, where, side="right") - 1
        edges = np.flatnonzero(np.diff(chunk)) + 1
        pieces = [column.chunk(int(chunk[b])).take(pa.array(where[b:e] - starts[chunk[b]]))
                  for b, e in zip(np.concatenate(([0], edges)), np.concatenate((edges, [where.size])),
                                  strict=True)]
        cols.append(pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0])
    return pa.Table.from_arrays(cols, schema=rows.schema)
