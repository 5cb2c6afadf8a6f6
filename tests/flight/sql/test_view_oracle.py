"""THE ORACLE of live SQL views: random queries over random live tables, against DuckDB.

Queries come from a small grammar covering every supported shape (filters, projections
with arithmetic and functions, group-bys with each aggregate, global aggregates, HAVING,
ORDER BY with LIMIT/OFFSET, UNION ALL, DISTINCT, inner and left joins of the two tables,
grouped joins), over the sources' numbers and strings and their derived ``DECIMAL(8, 2)``,
timestamp and date columns (decimal arithmetic and aggregates, time literals and INTERVALs,
date_trunc, time_bucket, extract, casts, and the string and number functions). Two random
sources (``tests.oracle.RandomSource``: append-only, keyed with
upserts and deletes, or ring; nulls, emptied tables, all-rows-modified cycles) drive each
query's view; after every cycle

* the view equals DuckDB's answer to the same SQL over ``to_arrow()`` snapshots of the
  sources at that step (``tests.flight.sql.sqlcheck.mismatch``: multisets, and sequences of
  the ORDER BY columns);
* every update of every table passed ``TableUpdate.validate`` (the graph validates), and a
  ``ReplayChecker`` rebuilt from the view's updates equals it.

``TICKTABLE_CYCLES`` scales the run (default 300 cycles in all), ``TICKTABLE_SEED`` picks
the seed (printed).
"""

from __future__ import annotations

import collections
import datetime
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.graph import UpdateGraph
from engine.table import Table
from flight.sql.views import compile_view
from tests.flight.sql.sqlcheck import duck_answer, mismatch
from tests.oracle import KINDS, RandomSource, cycles
from tests.replay import ReplayChecker

PER_QUERY = 15  # cycles per query

#: 2024-02-27 12:00 in microseconds: ``Ts`` runs from there across the leap day into March
BASE_US = 1_709_035_200_000_000
_MICROS = pc.add(pc.add(pc.multiply(pc.field("Qty"), pc.scalar(37 * 60_000_000)),
                        pc.multiply(pc.field("Key"), pc.scalar(3_600_000_000))), pc.scalar(BASE_US))


def with_money_and_times(t: Table) -> Table:
    """``t`` with ``Amt`` (``Price`` as ``DECIMAL(8, 2)``), ``Ts`` (a microsecond timestamp
    from ``Key`` and ``Qty``; null where ``Price`` is) and ``Day`` (``Ts``'s date; null where
    ``Sym`` is), derived live, so that DuckDB reads the same values the view does."""
    ts = pc.if_else(pc.field("Price").is_null(), pc.scalar(pa.scalar(None, pa.int64())), _MICROS)
    t = t.update(Amt=pc.field("Price").cast(pa.decimal128(8, 2)), Ts=ts.cast(pa.timestamp("us")))
    return t.update(Day=pc.if_else(pc.field("Sym").is_null(), pc.scalar(pa.scalar(None, pa.date32())),
                                   pc.field("Ts").cast(pa.date32())))


def _exact_types(view: Table, want: pa.Table) -> str | None:
    """A decimal (of a scale), date or time column of DuckDB's answer has the view's type
    exactly (integers may differ: DuckDB's integer sums are HUGEINTs, DECIMAL(38, 0) in
    Arrow, the view's int64)."""
    for f, w in zip(view.schema, want.schema, strict=True):
        exact = pa.types.is_temporal(w.type) or (pa.types.is_decimal(w.type) and w.type.scale > 0)
        if exact and f.type != w.type:
            return f"column {f.name} is {f.type}, DuckDB's {w.type}"
    return None


@dataclass
class Query:
    shape: str
    sql: str
    order: tuple[str, ...] = ()
    limited: bool = False


class Grammar:
    """Random SQL of the supported shapes over tables ``t1`` and ``t2`` (Sym, Key, Price, Qty)."""

    SYMS = ("AAPL", "MSFT", "GOOG", "IBM")

    def __init__(self, rng: np.random.Generator) -> None:
        self.r = rng

    def pick(self, options):
        return options[int(self.r.integers(0, len(options)))]

    def pred(self, q: str = "", depth: int = 0) -> str:
        p = f"{q}." if q else ""
        atoms = [
            lambda: f"{p}Qty > {int(self.r.integers(-5, 100))}",
            lambda: f"{p}Price <= {float(self.r.integers(0, 40)) * 2.5}",
            lambda: f"{p}Sym = '{self.pick(self.SYMS)}'",
            lambda: f"{p}Sym IN ('{self.pick(self.SYMS)}', '{self.pick(self.SYMS)}')",
            lambda: f"{p}Price IS NULL",
            lambda: f"{p}Sym IS NOT NULL",
            lambda: f"{p}Qty BETWEEN {int(self.r.integers(-5, 50))} AND {int(self.r.integers(50, 100))}",
            lambda: f"{p}Sym LIKE '{self.pick(('A%', '%M%', '_B_'))}'",
            lambda: f"{p}Qty * 2 - {p}Price > {int(self.r.integers(0, 100))}",
            lambda: f"{p}Sym NOT IN ('{self.pick(self.SYMS)}')",
            lambda: f"{p}Amt > {self.r.integers(0, 4000) / 40:.2f}",
            lambda: f"{p}Amt BETWEEN {int(self.r.integers(0, 40))} AND {self.r.integers(0, 400) / 4:.2f}",
            lambda: f"{p}Ts >= TIMESTAMP '{self.moment()}'",
            lambda: f"{p}Ts < TIMESTAMP '{self.moment()}' + INTERVAL {int(self.r.integers(1, 48))} HOUR",
            lambda: f"{p}Day {self.pick(('=', '<', '>='))} DATE '{self.moment()[:10]}'",
            lambda: f"hour({p}Ts) BETWEEN {int(self.r.integers(0, 12))} AND {int(self.r.integers(12, 24))}",
            lambda: f"{self.pick(('starts_with', 'contains', 'ends_with'))}({p}Sym, '{self.pick(('A', 'O', 'M', 'L'))}')",
            lambda: f"greatest({p}Qty, {int(self.r.integers(0, 50))}) < {int(self.r.integers(0, 100))}",
            lambda: f"{p}Qty % {int(self.r.integers(2, 6))} = 0",
            lambda: f"round({p}Price, 1) > {int(self.r.integers(0, 100))}",
            lambda: f"substr({p}Sym, 2, 1) {self.pick(('<', '>='))} 'M'",
        ]
        roll = self.r.random()
        if depth < 2 and roll < 0.2:
            return f"({self.pred(q, depth + 1)} AND {self.pred(q, depth + 1)})"
        if depth < 2 and roll < 0.35:
            return f"({self.pred(q, depth + 1)} OR {self.pred(q, depth + 1)})"
        if depth < 2 and roll < 0.42:
            return f"NOT ({self.pred(q, depth + 1)})"
        return self.pick(atoms)()

    def moment(self) -> str:
        """A time among the sources' ``Ts`` (2024-02-27 to mid-March, across the leap day)."""
        day = datetime.date(2024, 2, 27) + datetime.timedelta(days=int(self.r.integers(0, 14)))
        return f"{day} {int(self.r.integers(0, 24)):02d}:{self.pick(('00', '30', '59'))}:00"

    def where(self, q: str = "") -> str:
        return f" WHERE {self.pred(q)}" if self.r.random() < 0.6 else ""

    def scalar(self, q: str = "") -> str:
        p = f"{q}." if q else ""
        return self.pick([
            f"{p}Qty", f"{p}Price", f"{p}Sym", f"{p}Key", f"{p}Qty * 2 + 1", f"{p}Price / 2",
            f"{p}Qty - {p}Price", f"upper({p}Sym)", f"length({p}Sym)", f"{p}Qty / 3",
            f"CASE WHEN {p}Qty > 50 THEN 'hi' WHEN {p}Qty < 0 THEN 'neg' ELSE 'lo' END",
            f"coalesce({p}Price, -1)", f"CAST({p}Qty AS DOUBLE)", f"CAST({p}Price AS BIGINT)",
            f"{p}Price IS NULL", f"-{p}Qty", f"abs({p}Qty - 50)", f"{p}Sym || '.x'",
            f"lower({p}Sym) LIKE 'a%'",
            f"{p}Amt", f"{p}Amt * 2", f"{p}Amt + {p}Qty", f"{p}Amt / 4", f"-{p}Amt",
            f"{p}Amt - 0.25", f"{p}Amt * 1.5 > {p}Price",
            f"{p}Ts", f"{p}Day", f"date_trunc('hour', {p}Ts)", f"date_trunc('day', {p}Ts)",
            f"date_trunc('month', {p}Day)", f"date_trunc('week', {p}Ts)",
            f"time_bucket(INTERVAL '6 hours', {p}Ts)", f"time_bucket(INTERVAL 15 MINUTES, {p}Ts)",
            f"{p}Ts + INTERVAL 90 MINUTE", f"{p}Day + INTERVAL 1 DAY", f"{p}Ts - INTERVAL '1 day 2 hours'",
            f"extract(dow FROM {p}Ts)", f"year({p}Day)", f"hour({p}Ts)", f"dayofyear({p}Ts)",
            f"epoch({p}Ts)", f"CAST({p}Ts AS DATE)", f"CAST({p}Day AS TIMESTAMP)",
            f"nullif({p}Qty, 0)", f"greatest({p}Qty, 10)", f"least({p}Price, 50.0)",
            f"replace({p}Sym, 'A', 'a')", f"left({p}Sym, 2)", f"right({p}Sym, 1)",
            f"concat({p}Sym, '-', {p}Qty)", f"floor({p}Price / 3)", f"ceil({p}Price / 4)",
            f"trim(concat(' ', {p}Sym, ' '))", f"nullif({p}Sym, 'IBM')",
            f"round({p}Price, {self.pick((-1, 0, 1, 2))})", f"round({p}Price / 3)",
            f"round({p}Amt, {self.pick((-1, 0, 1))})", f"round({p}Qty, -1)",
            f"substr({p}Sym, {self.pick((-3, 0, 1, 2))}, {self.pick((-1, 1, 2, 5))})",
            f"substring({p}Sym, {self.pick((-2, 2))})", f"{p}Qty % 7", f"{p}Price % 3",
            f"{p}Qty // 4", f"trunc({p}Price / 3)", f"sign({p}Qty - 50)",
        ])

    def agg(self, q: str = "") -> str:
        p = f"{q}." if q else ""
        return self.pick([
            "count(*)", f"count({p}Price)", f"count({p}Sym)", f"sum({p}Qty)", f"sum({p}Price)",
            f"avg({p}Price)", f"avg({p}Qty)", f"min({p}Qty)", f"max({p}Price)", f"min({p}Price)",
            f"max({p}Qty)", f"stddev({p}Qty)", f"variance({p}Price)", f"median({p}Price)",
            f"median({p}Qty)", f"count(DISTINCT {p}Sym)", f"quantile_cont({p}Qty, 0.75)",
            f"sum({p}Qty * 2)", f"mean({p}Qty)", f"stddev_samp({p}Price)",
            f"sum({p}Amt)", f"min({p}Amt)", f"max({p}Amt)", f"avg({p}Amt)", f"stddev({p}Amt)",
            f"min({p}Ts)", f"max({p}Ts)", f"count({p}Ts)", f"max({p}Day)", f"min({p}Day)",
            f"count(DISTINCT {p}Day)", f"sum({p}Amt * 2)",
        ])

    def select_list(self, items: list[str]) -> tuple[str, list[str]]:
        """Items, each aliased c<i> or not; returns the list and the output names to order by."""
        parts, names = [], []
        for i, e in enumerate(items):
            if self.r.random() < 0.5 or e in names or any(ch in e for ch in "-( ."):
                parts.append(f"{e} AS c{i}")
                names.append(f"c{i}")
            else:
                parts.append(e)
                names.append(e)
        return ", ".join(parts), names

    def query(self) -> Query:
        shape = self.pick(["filter", "project", "group", "global", "having", "order_limit",
                           "union_all", "distinct", "join", "left_join", "join_group"])
        r = self.r
        if shape == "filter":
            return Query(shape, f"SELECT * FROM t1 WHERE {self.pred()}")
        if shape == "project":
            items = [self.scalar() for _ in range(int(r.integers(1, 5)))]
            sel, _ = self.select_list(items)
            return Query(shape, f"SELECT {sel} FROM t1{self.where()}")
        if shape in ("group", "having"):
            keys = self.pick([["Sym"], ["Price"], ["Sym", "Price"], ["Qty > 50"], ["Sym", "Qty < 20"],
                              ["Day"], ["Amt"], ["Sym", "Day"], ["date_trunc('hour', Ts)"],
                              ["time_bucket(INTERVAL '6 hours', Ts)"], ["CAST(Ts AS DATE)"]])
            aggs = [self.agg() for _ in range(int(r.integers(1, 4)))]
            sel, _ = self.select_list(keys + aggs)
            group = ", ".join(keys)
            having = f" HAVING {self.pick(['count(*) > 1', 'sum(Qty) > 50', 'max(Price) < 60', 'avg(Qty) BETWEEN 20 AND 70', 'count(Price) >= 2 OR min(Qty) < 0'])}" \
                if shape == "having" else ""
            return Query(shape, f"SELECT {sel} FROM t1{self.where()} GROUP BY {group}{having}")
        if shape == "global":
            sel, _ = self.select_list([self.agg() for _ in range(int(r.integers(1, 5)))])
            return Query(shape, f"SELECT {sel} FROM t1{self.where()}")
        if shape == "order_limit":
            items = [self.pick(["Qty", "Price", "Sym", "Key", "Qty * 2 + 1", "Price / 2", "Amt", "Ts",
                                "Day", "Amt * 2"])
                     for _ in range(int(r.integers(1, 4)))]
            sel, names = self.select_list(items)
            keys = list(dict.fromkeys(self.pick(names) for _ in range(int(r.integers(1, 3)))))
            order = ", ".join(f"{k if k.isidentifier() else f'{names.index(k) + 1}'}"
                              f"{self.pick(['', ' ASC', ' DESC'])}{self.pick(['', '', ' NULLS FIRST', ' NULLS LAST'])}"
                              for k in keys)
            limited = r.random() < 0.7
            limit = f" LIMIT {int(r.integers(0, 12))}" if limited else ""
            if limited and r.random() < 0.3:
                limit += f" OFFSET {int(r.integers(0, 5))}"
            return Query(shape, f"SELECT {sel} FROM t1{self.where()} ORDER BY {order}{limit}",
                         tuple(keys), limited)
        if shape == "union_all":
            cols = self.pick([["Sym"], ["Qty", "Price"], ["Sym", "Qty"], ["Key"], ["Amt", "Ts"], ["Day"]])
            c = ", ".join(cols)
            return Query(shape, f"SELECT {c} FROM t1{self.where()} UNION ALL SELECT {c} FROM t2{self.where()}")
        if shape == "distinct":
            cols = self.pick([["Sym"], ["Sym", "Price"], ["Qty > 50", "Sym"], ["Price"], ["Day"],
                              ["Amt", "Sym"], ["date_trunc('day', Ts)"]])
            sel, _ = self.select_list(cols)
            return Query(shape, f"SELECT DISTINCT {sel} FROM t1{self.where()}")
        on = self.pick(["l.Sym = r.Sym", "l.Sym = r.Sym AND l.Qty = r.Qty", "r.Key = l.Key",
                        "USING (Sym)", "l.Price = r.Price", "l.Day = r.Day", "l.Amt = r.Amt"])
        cond = on if on.startswith("USING") else f"ON {on}"
        join = "LEFT JOIN" if shape == "left_join" else self.pick(["JOIN", "INNER JOIN"])
        where = self.where(self.pick(["l", "r"]))
        if shape == "join_group":
            key = "Sym" if on.startswith("USING") else self.pick(["l.Sym", "r.Sym", "l.Qty > 50", "r.Day"])
            sel, _ = self.select_list([key, self.agg("l"), self.agg("r")])
            return Query(shape, f"SELECT {sel} FROM t1 AS l {join} t2 AS r {cond}{where} GROUP BY {key}")
        items = [self.scalar("l"), self.scalar("r"), self.pick(["l.Key", "r.Key", "r.Qty"])]
        sel, _ = self.select_list(items)
        return Query(shape, f"SELECT {sel} FROM t1 AS l {join} t2 AS r {cond}{where}")


def run(seed: int, n_cycles: int, *, keep_going: bool = False) -> dict[str, object]:
    """Run random queries for ``n_cycles`` cycles in all; the figures (and mismatches when
    ``keep_going``, else the first one raises)."""
    rng = np.random.default_rng(seed)
    grammar = Grammar(rng)
    shapes: collections.Counter[str] = collections.Counter()
    mismatches: list[str] = []
    done = queries = 0
    while done < n_cycles:
        q = grammar.query()
        queries += 1
        shapes[q.shape] += 1
        g = UpdateGraph(validate=True)
        kinds = (KINDS[int(rng.integers(0, 3))], KINDS[int(rng.integers(0, 3))])
        srcs = [RandomSource(g, k, rng, max_rows=40) for k in kinds]
        tables = {"t1": with_money_and_times(srcs[0].table), "t2": with_money_and_times(srcs[1].table)}
        view = compile_view(q.sql, tables.__getitem__).table
        replay = ReplayChecker(view)
        for c in range(PER_QUERY):
            ctx = f"seed={seed} query#{queries} ({q.shape}, sources {kinds}) cycle={c}: {q.sql}"
            if c:
                for s in srcs:
                    if rng.random() < 0.8:
                        s.step()
                g.run_cycle()
            done += 1
            if view.failure is not None:
                raise AssertionError(f"{ctx}: the view failed") from view.failure
            want = duck_answer(q.sql, {n: t.to_arrow() for n, t in tables.items()})
            problem = mismatch(view.to_arrow(), want, q.order, q.limited) or _exact_types(view, want)
            if problem is not None:
                if not keep_going:
                    raise AssertionError(f"MISMATCH {ctx}\n{problem}")
                mismatches.append(f"{ctx}\n{problem}")
                break
            replay.check()
    return {"queries": queries, "cycles": done, "shapes": dict(shapes), "mismatches": mismatches}


def test_views_equal_duckdb_every_cycle():
    seed = int(os.environ.get("TICKTABLE_SEED", "0"))
    print(f"SQL view oracle: seed={seed}")
    figures = run(seed, cycles(300))
    print(f"SQL view oracle: {figures}")
