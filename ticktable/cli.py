"""The ``ticktable`` command line.

Until the Flight server lands, ``ticktable demo`` runs an in-process live market table, a
sorted board derived from it and an aggregate, and prints the board changing cycle by
cycle with each update's size.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.graph import UpdateGraph
from engine.ops import agg
from engine.update import TableUpdate

SYMS = np.array(["AAPL", "MSFT", "GOOG", "AMZN", "META", "NVDA", "IBM", "ORCL"], dtype=object)


def _demo(args: argparse.Namespace) -> int:
    graph = UpdateGraph(validate=args.validate)
    quotes = graph.keyed_table(
        pa.schema([("Sym", pa.string()), ("Bid", pa.float64()), ("Ask", pa.float64()), ("Size", pa.int64())]),
        "Sym", name="quotes",
    )
    rng = np.random.default_rng(args.seed)
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

    # derived live tables: each cycle they get one precise update from the quotes' update
    board = quotes.update(Spread=pc.field("Ask") - pc.field("Bid")).sort("Bid", descending=True)
    stats = quotes.agg_by([agg.count("Symbols"), agg.mean("Bid", "MeanBid"), agg.max("Size", "MaxSize")])

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ticktable", description="Ticktable: live tables with precise deltas.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run an in-process live table and print its updates")
    demo.add_argument("--interval", type=float, default=0.5, help="seconds between cycles (default 0.5)")
    demo.add_argument("--cycles", type=int, default=None, help="stop after this many cycles")
    demo.add_argument("--seed", type=int, default=None)
    demo.add_argument("--validate", action="store_true", help="validate every update")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
