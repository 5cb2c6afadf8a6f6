"""Client commands of the ``ticktable`` CLI: ``ls``, ``tail``, ``push`` and ``sql``.

Each is a function of parsed arguments returning an exit code; :mod:`ticktable.cli` wires
them into argparse with :func:`add_commands`. They talk to a server like any client does
(``--uri``, ``--token``; defaults from ``TICKTABLE_URI`` / ``TICKTABLE_TOKEN``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import TicktableError
from flight.wire import PUT_MODES, PutMode

if TYPE_CHECKING:  # imported by the commands that run: the parser is built without them
    import pyarrow as pa

    from clients.client import Client

__all__ = ["add_commands", "read_file_batches", "statements"]

DEFAULT_URI = "grpc://127.0.0.1:8815"


def _client(args: argparse.Namespace) -> Client:
    from clients.client import connect

    return connect(args.uri, token=args.token or None)


def _fail(msg: str) -> int:
    print(f"ticktable: {msg}", file=sys.stderr)
    return 1


_FLIGHT_PREFIX = re.compile(r"^Flight returned (?P<status>[a-z ]+?) error, with message: ")


def server_message(exc: BaseException) -> str:
    """A server's refusal in one line as the gRPC status and the server's own words
    (``NOT_FOUND: no table 'nope'``), without pyarrow's "Flight returned ... error, with
    message:" and gRPC's debug context."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = text.splitlines()[0] if text else type(exc).__name__
    text = text.split(". gRPC client debug context:")[0].split(". Detail:")[0]
    m = _FLIGHT_PREFIX.match(text)
    if m is None:
        return text
    return f"{m.group('status').upper().replace(' ', '_')}: {text[m.end():]}"


def _errors(fn: Any) -> Any:
    """Report a server's refusal or an unreachable server as one line, exit code 1."""

    def run(args: argparse.Namespace) -> int:
        import pyarrow as pa
        import pyarrow.flight as fl

        try:
            code: int = fn(args)
            return code
        except KeyError as exc:
            return _fail(server_message(exc) if exc.args else "no such table")
        except fl.FlightUnavailableError as exc:
            from clients.failover import unreachable_reason

            return _fail(f"cannot reach a server at {args.uri} ({unreachable_reason(exc)}); "
                         f"start one with 'ticktable serve' or pass --uri")
        except fl.FlightUnauthenticatedError:
            return _fail("the server wants a token: pass --token or set TICKTABLE_TOKEN")
        except (pa.ArrowException, fl.FlightError, OSError, ValueError, TicktableError) as exc:
            return _fail(server_message(exc))

    return run


# ---------------------------------------------------------------------------------- ls
@_errors
def _ls(args: argparse.Namespace) -> int:
    with _client(args) as client:
        stats = client.stats()
    if stats.empty:
        print("no tables")
    else:
        print(stats.drop(columns=["sequence"]).to_string(index=False))
        print(f"step {stats.attrs['step']}, cycle p50 {stats.attrs['cycle_p50_ms']:.2f} ms, "
              f"p99 {stats.attrs['cycle_p99_ms']:.2f} ms")
    web = stats.attrs["web"]
    if web is not None:
        state = (f"running (pid {web['pid']})" if web["running"]
                 else "down (it ended too often to be restarted; see the server's log)")
        print(f"web UI at {web['url']}: {state}, {web['open_tables']} table(s) open, "
              f"{web['restarts']} restart(s)")
    return 0


# -------------------------------------------------------------------------------- tail
class _Rate:
    """Updates and changed rows per second over the last few seconds."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self.events: deque[tuple[float, int]] = deque()

    def add(self, rows: int) -> None:
        now = time.monotonic()
        self.events.append((now, rows))
        while self.events and self.events[0][0] < now - self.window:
            self.events.popleft()

    def rates(self) -> tuple[float, float]:
        if not self.events:
            return 0.0, 0.0
        span = max(time.monotonic() - self.events[0][0], 1e-3)
        span = min(max(span, 1.0), self.window)
        return len(self.events) / span, sum(r for _, r in self.events) / span


@_errors
def _tail(args: argparse.Namespace) -> int:
    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    rate = _Rate()
    changed = threading.Event()
    n = args.rows

    with _client(args) as client:
        live = client.subscribe(args.table, columns=columns, viewport=[(0, n)])
        want: list[tuple[int, int]] = [(0, n)]

        def on_update(update: Any) -> None:
            rate.add(len(update.added) + len(update.removed) + len(update.modified))
            changed.set()

        live.on_update(on_update)
        tty = sys.stdout.isatty() and not args.plain
        shown = 0
        try:
            while args.count is None or shown < args.count:
                if not changed.wait(args.interval):
                    if live.error is not None:
                        raise live.error
                    continue
                changed.clear()
                size = live.size
                tail = [(max(0, size - n), size)]
                if tail != want:  # keep the view on the newest rows as the table grows
                    want = tail
                    live.set_viewport(tail)
                    continue
                df = live.df
                ups, rows = rate.rates()
                head = (f"{args.table}: {size} rows, step {live.step}, {ups:.1f} updates/s, "
                        f"{rows:,.0f} rows/s" + (" (last rows)" if size > n else ""))
                if tty:
                    sys.stdout.write("\x1b[H\x1b[2J")
                print(head)
                print(df.to_string(index=False) if len(df) else "(no rows)", flush=True)
                shown += 1
        except KeyboardInterrupt:
            pass
        finally:
            live.close()
    return 0


# -------------------------------------------------------------------------------- push
def read_file_batches(path: str, batch_rows: int = 1 << 17) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Stream a Parquet, CSV or Arrow IPC (file or stream) file as record batches.

    Returns the schema, the batches (read lazily) and the row count when the format
    knows it up front (Parquet, Arrow files), for a progress bar.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if not p.exists():
        raise FileNotFoundError(f"no file {path!r}")
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        f = pq.ParquetFile(p)
        return f.schema_arrow, f.iter_batches(batch_size=batch_rows), f.metadata.num_rows
    if suffix in (".csv", ".tsv", ".txt"):
        import pyarrow.csv as pcsv

        parse = pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
        reader = pcsv.open_csv(p, parse_options=parse)
        return reader.schema, iter(reader), None
    if suffix in (".arrow", ".feather", ".ipc", ".arrows"):
        import pyarrow as pa
        import pyarrow.ipc as ipc

        try:
            rf = ipc.open_file(p)
            return rf.schema, (rf.get_batch(i) for i in range(rf.num_record_batches)), None
        except pa.ArrowInvalid:
            rs = ipc.open_stream(p)
            return rs.schema, iter(rs), None
    raise ValueError(f"cannot tell the format of {path!r} from its suffix; use .parquet, .csv, "
                     f".tsv or .arrow/.feather")


@_errors
def _push(args: argparse.Namespace) -> int:
    schema, batches, total = read_file_batches(args.file)
    keys = [k for k in args.keys.split(",") if k] if args.keys else None
    # argparse checked the choices; without --mode: upsert with --keys, else by the table
    # (upsert into a keyed table, append otherwise)
    mode: Any = args.mode or (PutMode.UPSERT if keys else None)
    progress: Any = False
    bar = None
    if not args.quiet:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(total=total, unit="rows", unit_scale=True, desc=f"push {args.table}",
                   file=sys.stderr)
        progress = bar.update
    start = time.perf_counter()
    try:
        with _client(args) as client:
            summary = client.push(args.table, batches, mode=mode, keys=keys, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    secs = time.perf_counter() - start
    step = f", visible at step {summary.step}" if summary.step >= 0 else ""
    print(f"pushed {summary.rows} rows into {args.table!r} ({summary.mode}) in {secs:.2f} s"
          f" ({summary.rows / max(secs, 1e-9):,.0f} rows/s){step}")
    return 0


# --------------------------------------------------------------------------------- sql
def statements(text: str) -> list[str]:
    """The statements of ``text``: split at ``;`` when it has one, else one per line.

    Kept simple: a ``;`` inside a string literal splits too. Blank pieces are skipped.
    """
    pieces = text.split(";") if ";" in text else text.splitlines()
    return [p.strip() for p in pieces if p.strip()]


@_errors
def _sql(args: argparse.Namespace) -> int:
    if args.query in (None, "-"):
        todo = statements(sys.stdin.read())
    else:
        todo = [args.query] if args.query.strip() else []
    if not todo:
        return _fail("no SQL statement given (pass QUERY, or statements on stdin)")
    import pyarrow.flight as fl

    with _client(args) as client:
        for i, statement in enumerate(todo):
            try:
                result = client.sql(statement)
            except (KeyError, OSError, ValueError, TicktableError) as exc:
                if len(todo) == 1 or isinstance(exc, (fl.FlightUnavailableError, fl.FlightUnauthenticatedError)):
                    raise
                # which of the statements read from stdin failed (the ones before it ran)
                return _fail(f"statement {i + 1} of {len(todo)}: {server_message(exc)}")
            if i:
                print()
            if len(result.columns) and len(result):
                print(result.to_string(index=False), flush=True)
            else:
                names = ", ".join(map(str, result.columns))
                print(f"(no rows{': ' + names if names else ''})", flush=True)
    return 0


# ------------------------------------------------------------------------------- wiring
def _connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--uri", default=os.environ.get("TICKTABLE_URI", DEFAULT_URI),
                   help=f"server to talk to (default $TICKTABLE_URI or {DEFAULT_URI})")
    p.add_argument("--token", default=os.environ.get("TICKTABLE_TOKEN"),
                   help="bearer token (default $TICKTABLE_TOKEN)")


def add_commands(sub: Any) -> None:
    """Add ``ls``, ``tail``, ``push`` and ``sql`` to an argparse subparsers object."""
    ls = sub.add_parser("ls", help="list the server's tables with sizes and subscribers",
                        description="List every table: kind, size, last step, subscribers "
                                    "and how far the slowest is behind.")
    _connection_args(ls)
    ls.set_defaults(func=_ls)

    tail = sub.add_parser("tail", help="watch a table's newest rows and update rate live",
                          description="Subscribe to TABLE and redraw its last rows and its "
                                      "update rate as they change (Ctrl-C to stop).")
    tail.add_argument("table", help="table name")
    _connection_args(tail)
    tail.add_argument("-n", "--rows", type=int, default=20, help="rows to show (default 20)")
    tail.add_argument("--columns", default=None, help="comma-separated columns (default all)")
    tail.add_argument("--interval", type=float, default=0.5,
                      help="seconds between redraws at most (default 0.5)")
    tail.add_argument("--count", type=int, default=None, help="stop after this many redraws")
    tail.add_argument("--plain", action="store_true",
                      help="print each view below the last instead of redrawing the screen")
    tail.set_defaults(func=_tail)

    push = sub.add_parser("push", help="push a Parquet/CSV/Arrow file into a table",
                          description="Stream FILE (Parquet, CSV/TSV or Arrow IPC) into TABLE "
                                      "as one atomic write; creates the table if missing.")
    push.add_argument("file", help="a .parquet, .csv, .tsv, .arrow or .feather file")
    push.add_argument("table", help="table name")
    _connection_args(push)
    push.add_argument("--mode", choices=[m.value for m in PUT_MODES], default=None,
                      help="write mode (default: upsert with --keys or into a keyed table, "
                           "else append)")
    push.add_argument("--keys", default=None,
                      help="comma-separated key columns (creates a keyed table if missing)")
    push.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    push.set_defaults(func=_push)

    sql = sub.add_parser("sql", help="run SQL on the server and print the result",
                         description="Run QUERY over Arrow Flight SQL and print its rows as a "
                                     "table; an update (INSERT, UPDATE, DELETE, CREATE or DROP "
                                     "TABLE or VIEW) prints the rows it changed. Without QUERY, or "
                                     "with '-', run the statements read from stdin: "
                                     "separated by ';', or one per line when there is no "
                                     "';'. The first failure stops, in one line, exit "
                                     "status 1.")
    sql.add_argument("query", nargs="?", default=None, metavar="QUERY",
                     help="one SQL statement, run as given (omitted, or '-': read stdin)")
    _connection_args(sql)
    sql.set_defaults(func=_sql)
