"""The demo of ``ticktable demo`` and ``ticktable serve --demo``: a keyed ``quotes`` table of
8 symbols with 1-3 rows upserted a tick, ``board`` (quotes with a spread, sorted by bid) and
``stats`` (an aggregate of quotes)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.graph import UpdateGraph
from engine.ops.aggregate import agg
from engine.sources import KeyedTable
from engine.table import Table
from engine.update import TableUpdate

__all__ = ["QUOTES", "demo_tables", "run", "ticker"]

SYMS = np.array(["AAPL", "MSFT", "GOOG", "AMZN", "META", "NVDA", "IBM", "ORCL"], dtype=object)


QUOTES = pa.schema([("Sym", pa.string()), ("Bid", pa.float64()), ("Ask", pa.float64()),
                    ("Size", pa.int64())])


def ticker(quotes: KeyedTable, seed: int | None) -> Callable[[], None]:
    """A function that upserts a few random quotes (the demo's market data)."""
    rng = np.random.default_rng(seed)
    mid = dict(zip(SYMS.tolist(), rng.uniform(50, 500, SYMS.size), strict=False))

    def tick() -> None:
        n = int(rng.integers(1, 4))
        syms = rng.choice(SYMS, n, replace=False)
        bids = []
        for s in syms:  # demo data generator: a handful of symbols per tick
            mid[s] *= 1 + rng.normal(0, 0.002)
            bids.append(round(mid[s], 2))
        bid = np.array(bids)
        quotes.upsert({"Sym": syms, "Bid": bid, "Ask": np.round(bid * 1.001, 2),
                       "Size": rng.integers(1, 50, n) * 100})

    return tick


def demo_tables(quotes: Table) -> tuple[Table, Table]:
    board = quotes.update(Spread=pc.field("Ask") - pc.field("Bid")).sort("Bid", descending=True)
    stats = quotes.agg_by([agg.count("Symbols"), agg.mean("Bid", "MeanBid"),
                           agg.max("Size", "MaxSize")])
    return board, stats


def run(args: argparse.Namespace) -> int:
    graph = UpdateGraph(validate=args.validate)
    quotes = graph.keyed_table(QUOTES, "Sym", name="quotes")
    tick = ticker(quotes, args.seed)

    # derived live tables: each cycle they get one precise update from the quotes' update
    board, stats = demo_tables(quotes)

    seen: list[TableUpdate] = []

    def show(step: int) -> None:
        # a terminal listener: runs once every table of the cycle has updated
        if not seen:
            return
        update = seen.pop()
        print(f"\nstep {step}: +{len(update.added)} added, ~{len(update.modified)} modified "
              f"({', '.join(sorted(update.modified_columns)) or '-'}), -{len(update.removed)} removed, "
              f"{len(update.shifted)} shifted range(s)")
        print(board.to_pandas().to_string(index=False))
        print(stats.to_pandas().to_string(index=False))

    board.listen(lambda update, table: seen.append(update))
    graph.add_terminal_listener(show)
    print("ticktable demo: a live 'quotes' table updated every "
          f"{args.interval:g}s (Ctrl-C to stop)")
    cycles = 0
    try:
        while args.cycles is None or cycles < args.cycles:
            tick()
            graph.run_cycle()
            cycles += 1
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0
