"""THE ORACLE of live SQL views: random queries over random live tables, against DuckDB.

Queries come from a small grammar covering every supported shape (filters, projections
with arithmetic and functions, group-bys with each aggregate, global aggregates, HAVING,
ORDER BY with LIMIT/OFFSET, UNION ALL, DISTINCT, inner and left joins of the two tables,
grouped joins). Two random sources (``tests.oracle.RandomSource``: append-only, keyed with
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
import os
from dataclasses import dataclass

import numpy as np

from engine.graph import UpdateGraph
from flight.sql.views import compile_view
from tests.flight.sql.sqlcheck import duck_answer, mismatch
from tests.oracle import KINDS, RandomSource, cycles
from tests.replay import ReplayChecker

PER_QUERY = 15  # cycles per query


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
        ]
        roll = self.r.random()
        if depth < 2 and roll < 0.2:
            return f"({self.pred(q, depth + 1)} AND {self.pred(q, depth + 1)})"
        if depth < 2 and roll < 0.35:
            return f"({self.pred(q, depth + 1)} OR {self.pred(q, depth + 1)})"
        if depth < 2 and roll < 0.42:
            return f"NOT ({self.pred(q, depth + 1)})"
        return self.pick(atoms)()

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
        ])

    def agg(self, q: str = "") -> str:
        p = f"{q}." if q else ""
        return self.pick([
            "count(*)", f"count({p}Price)", f"count({p}Sym)", f"sum({p}Qty)", f"sum({p}Price)",
            f"avg({p}Price)", f"avg({p}Qty)", f"min({p}Qty)", f"max({p}Price)", f"min({p}Price)",
            f"max({p}Qty)", f"stddev({p}Qty)", f"variance({p}Price)", f"median({p}Price)",
            f"median({p}Qty)", f"count(DISTINCT {p}Sym)", f"quantile_cont({p}Qty, 0.75)",
            f"sum({p}Qty * 2)", f"mean({p}Qty)", f"stddev_samp({p}Price)",
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
            keys = self.pick([["Sym"], ["Price"], ["Sym", "Price"], ["Qty > 50"], ["Sym", "Qty < 20"]])
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
            items = [self.pick(["Qty", "Price", "Sym", "Key", "Qty * 2 + 1", "Price / 2"])
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
            cols = self.pick([["Sym"], ["Qty", "Price"], ["Sym", "Qty"], ["Key"]])
            c = ", ".join(cols)
            return Query(shape, f"SELECT {c} FROM t1{self.where()} UNION ALL SELECT {c} FROM t2{self.where()}")
        if shape == "distinct":
            cols = self.pick([["Sym"], ["Sym", "Price"], ["Qty > 50", "Sym"], ["Price"]])
            sel, _ = self.select_list(cols)
            return Query(shape, f"SELECT DISTINCT {sel} FROM t1{self.where()}")
        on = self.pick(["l.Sym = r.Sym", "l.Sym = r.Sym AND l.Qty = r.Qty", "r.Key = l.Key",
                        "USING (Sym)", "l.Price = r.Price"])
        cond = on if on.startswith("USING") else f"ON {on}"
        join = "LEFT JOIN" if shape == "left_join" else self.pick(["JOIN", "INNER JOIN"])
        where = self.where(self.pick(["l", "r"]))
        if shape == "join_group":
            key = "Sym" if on.startswith("USING") else self.pick(["l.Sym", "r.Sym", "l.Qty > 50"])
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
        tables = {"t1": srcs[0].table, "t2": srcs[1].table}
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
            problem = mismatch(view.to_arrow(), want, q.order, q.limited)
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
