"""Watch a live table from pandas: the DataFrame stays current, each update arrives as parts.

    make run                                   # in one terminal: the demo server
    python examples/pandas_subscriber.py       # in another: watch 'board' for 10 s

``live.df`` is one pandas DataFrame, brought current in place each time it is read (what
changed since the last read is applied to it); ``on_update`` receives each update's added /
removed / modified rows as DataFrames (with previous values).
"""

from __future__ import annotations

import argparse
import time

import ticktable as tt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="grpc://127.0.0.1:8815", help="server (default %(default)s)")
    parser.add_argument("--table", default="board", help="table to watch (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to watch")
    parser.add_argument("--token", default=None, help="bearer token, if the server wants one")
    args = parser.parse_args(argv)

    def show(update: tt.Update) -> None:
        print(f"step {update.step}: +{len(update.added)} -{len(update.removed)} "
              f"~{len(update.modified)} rows", flush=True)
        if len(update.modified):
            changed = update.modified.join(update.modified_previous, rsuffix="_was")
            print(changed.head(3).to_string(index=False), flush=True)

    with tt.connect(args.uri, token=args.token) as client:
        with client.subscribe(args.table, on_update=show) as live:
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                print(f"--- {args.table} as of step {live.step}: {live.size} rows", flush=True)
                print(live.df.head(10).to_string(index=False), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
