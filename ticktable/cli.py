"""The ``ticktable`` command line.

``ticktable ls``, ``tail TABLE``, ``push FILE TABLE`` and ``sql [QUERY]`` are clients of a
running server (:mod:`clients.commands`). ``ticktable serve`` runs the server over one
update graph: Arrow Flight (and Flight SQL), the gRPC TableService, health and reflection
on one port; ``--demo`` adds a ticking ``quotes`` table, a sorted ``board`` and an
aggregate ``stats`` derived from it. ``ticktable demo`` runs the same tables in-process
and prints the board changing cycle by cycle with each update's size. ``ticktable
health`` asks a server's gRPC health service (the container health check), over TLS too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TypeVar

from engine.errors import InputError, TicktableError
from engine.priority import PRIORITIES

T = TypeVar("T")


def _read(path: str | None, flag: str) -> bytes | None:
    """The file given to ``flag``; one line naming both when it cannot be read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InputError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def default_data_dir(given: str | None) -> Path:
    """``--data-dir``, else ``$TICKTABLE_DATA_DIR``, else the platform's user data directory."""
    if given:
        return Path(given)
    env = os.environ.get("TICKTABLE_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("ticktable", appauthor=False))


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _demo(args: argparse.Namespace) -> int:
    from ticktable._demo import run

    return run(args)


def _serve(args: argparse.Namespace) -> int:
    from engine.graph import UpdateGraph
    from flight.server import ServerConfig, TicktableServer
    from flight.wire import TableKind
    from ticktable._demo import QUOTES, demo_tables, ticker

    token = args.token or os.environ.get("TICKTABLE_TOKEN") or None
    graph = UpdateGraph()
    data_dir = None if args.in_memory else default_data_dir(args.data_dir)
    read_token = args.read_token or os.environ.get("TICKTABLE_READ_TOKEN") or None
    metrics = args.metrics_port
    try:
        tls_cert, tls_key = _read(args.tls_cert, "--tls-cert"), _read(args.tls_key, "--tls-key")
    except InputError as exc:
        print(f"ticktable serve: {exc}", file=sys.stderr)
        return 2
    sql = {name: value for name, value in (("sql_timeout", args.sql_timeout),
                                           ("sql_memory_mb", args.sql_memory_mb),
                                           ("filter_linger", args.filter_linger),
                                           ("mirror_timeout", args.mirror_timeout))
           if value is not None}  # unset: ServerConfig's defaults
    mirror_token = args.mirror_token or os.environ.get("TICKTABLE_MIRROR_TOKEN") or None
    config = ServerConfig(host=args.host, port=args.port, token=token, read_token=read_token,
                          tls_cert=tls_cert, tls_key=tls_key,
                          data_dir=data_dir, checkpoint_seconds=args.checkpoint_seconds,
                          checkpoint_bytes=args.checkpoint_bytes,
                          metrics_port=None if metrics is None or metrics < 0 else metrics,
                          max_put_batch_bytes=args.max_message_bytes,
                          max_value_bytes=args.max_value_bytes, max_columns=args.max_columns,
                          max_tables=args.max_tables,
                          max_subscriptions_per_client=args.max_subscriptions_per_client,
                          max_staged_bytes_per_write=args.max_staged_bytes_per_write,
                          max_pending_bytes=args.max_pending_bytes, put_wait=args.put_wait,
                          put_window_bytes=args.put_window_bytes,
                          http_port=_http_port(args),
                          web_feed=args.web_feed, web_interval=args.web_interval,
                          web_sched=args.web_sched, mirrors=list(args.mirror or []),
                          mirror_of=list(args.mirror_of or []),
                          mirror_token=mirror_token, mirror_give_up=args.mirror_give_up, **sql)
    def demo(server: TicktableServer) -> None:
        """The demo's tables, before the port is bound: a client (or a health check) that
        gets an answer finds all three."""
        quotes = server.registry.create_source("quotes", QUOTES, TableKind.KEYED, keys=["Sym"])
        board, stats = demo_tables(quotes.table)
        server.registry.add("board", board, TableKind.DERIVED, parents=["quotes"])
        server.registry.add("stats", stats, TableKind.DERIVED, parents=["quotes"])

    try:
        server = TicktableServer(graph, config).start(demo if args.demo else None)
    except TicktableError as exc:  # damaged data, a port in use...: one line, no traceback
        print(f"ticktable serve: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    if args.demo:
        tick = ticker(server.registry.get("quotes").table, args.seed)  # type: ignore[arg-type]

        def ticking() -> None:
            while not stop.wait(args.interval):
                tick()

        tick()
        threading.Thread(target=ticking, name="ticktable-demo", daemon=True).start()
    graph.start(args.interval, priority=args.cycle_priority)
    print(f"ticktable serving Flight at {server.location}", flush=True)
    if server.metrics_port:
        print(f"metrics at http://{args.host}:{server.metrics_port}/metrics", flush=True)
    if args.demo:
        print("tables: quotes (ticking), board (sorted by Bid), stats (aggregate). "
              "Watch one from pandas:\n"
              f"  {sys.executable} -c \"import ticktable as tt, time; "
              f"live = tt.connect('{server.location}').subscribe('board'); "
              f"[print(live.df, end='\\n\\n') or time.sleep(1) for _ in range(5)]\"\n"
              f"or from a terminal: ticktable tail board --uri {server.location}", flush=True)
    if server.web is not None:  # after the lines scripts read first (Flight, metrics, demo)
        print(f"web UI at {server.web.url} (open it in a browser)", flush=True)
    if server.recovery is not None:
        r = server.recovery
        print(f"tables are kept in {data_dir} (--in-memory keeps nothing): {r.tables} "
              f"restored, {r.rows} checkpointed row(s) and {r.records} journal record(s) in "
              f"{r.seconds:.2f} s", flush=True)
    else:
        print("in memory: every table is gone when the server stops", flush=True)
    if graph.priority == "realtime":
        print(f"cycles every {args.interval:g} s on a real-time thread (SCHED_FIFO)", flush=True)
    elif args.cycle_priority == "realtime":
        print(f"cycles every {args.interval:g} s on a normal thread: real-time needs root, "
              "CAP_SYS_NICE or ulimit -r >= 1 (other busy processes may delay a cycle)",
              flush=True)

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.2):
        pass
    clean = server.shutdown()
    graph.stop()
    if not clean:
        # A call outlived its cancellation: leave without joining the server's worker
        # threads (the interpreter's exit would wait for that call forever).
        print("ticktable stopped (some clients never closed their streams)", flush=True)
        os._exit(0)
    print("ticktable stopped", flush=True)
    return 0


def _http_port(args: argparse.Namespace) -> int | None:
    """The web UI's port (``None``: off): ``--http-port``, ``$TICKTABLE_HTTP_PORT``, 8817.

    With ``--port 0`` and neither given, any free port: a server started for a test or a
    benchmark must not depend on 8817 being free.
    """
    port: int | None = args.http_port
    if port is None:
        port = _env_int("TICKTABLE_HTTP_PORT", 0 if args.port == 0 else 8817)
    return None if port < 0 else port


def _env_int(name: str, default: T) -> int | T:
    """``$name`` as an integer, ``default`` when unset or empty; a value that is not an
    integer ends the command with one line naming the variable (exit status 2)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        print(f"ticktable: ${name} is {text!r}, not an integer", file=sys.stderr)
        raise SystemExit(2) from None


def _period(text: str) -> float:
    """An argparse type: seconds above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: seconds, 0 or more."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _size(n: int) -> str:
    """``n`` bytes for a help text: ``64 MiB``, ``1 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _add_limits(serve: argparse.ArgumentParser) -> None:
    """The ``--max-*`` flags of ``serve`` (flight.limits has the table)."""
    from flight import limits as lim

    group = serve.add_argument_group(
        "limits", "A request past one is refused with RESOURCE_EXHAUSTED, in one line naming "
                  "the table or column, the limit and its flag; nothing of it is applied.")
    group.add_argument("--max-message-bytes", type=_positive, default=lim.MAX_PUT_BATCH_BYTES,
                       metavar="N",
                       help=f"largest record batch a client may write (DoPut), in bytes; gRPC "
                            f"itself refuses a message more than 2 MiB larger (default "
                            f"{_size(lim.MAX_PUT_BATCH_BYTES)})")
    group.add_argument("--max-value-bytes", type=_positive, default=lim.MAX_VALUE_BYTES,
                       metavar="N",
                       help=f"longest string or binary value a written batch may hold, in "
                            f"bytes (default {_size(lim.MAX_VALUE_BYTES)})")
    group.add_argument("--max-columns", type=_positive, default=lim.MAX_COLUMNS, metavar="N",
                       help=f"columns a table may have, created or derived (default "
                            f"{lim.MAX_COLUMNS})")
    group.add_argument("--max-tables", type=_positive, default=lim.MAX_TABLES, metavar="N",
                       help=f"tables the server holds, source and derived (default "
                            f"{lim.MAX_TABLES})")
    group.add_argument("--max-subscriptions-per-client", type=_positive,
                       default=lim.MAX_SUBSCRIPTIONS_PER_CLIENT, metavar="N",
                       help=f"subscriptions open at once from one client address, whatever "
                            f"its port (default {lim.MAX_SUBSCRIPTIONS_PER_CLIENT})")
    group.add_argument("--max-staged-bytes-per-write", type=_positive,
                       default=lim.MAX_STAGED_BYTES_PER_WRITE, metavar="N",
                       help=f"bytes one uncommitted write (one write_id) may hold (default "
                            f"{_size(lim.MAX_STAGED_BYTES_PER_WRITE)})")
    group.add_argument("--max-pending-bytes", type=_positive, default=lim.MAX_PENDING_BYTES,
                       metavar="N",
                       help=f"bytes of writes a table may have waiting for its next cycle; a "
                            f"write past it waits for a cycle (the writer is held by flow "
                            f"control), then is refused (default "
                            f"{_size(lim.MAX_PENDING_BYTES)})")
    group.add_argument("--put-wait", type=_seconds, default=lim.PUT_WAIT, metavar="SECONDS",
                       help=f"how long a write past --max-pending-bytes waits for a cycle "
                            f"before it is refused (default {lim.PUT_WAIT:g})")
    group.add_argument("--put-window-bytes", type=_positive, default=lim.PUT_WINDOW_BYTES,
                       metavar="N",
                       help=f"how far a writer may send ahead of what the server has read, "
                            f"the HTTP/2 window of each stream (default "
                            f"{_size(lim.PUT_WINDOW_BYTES)})")


def _add_sql(serve: argparse.ArgumentParser) -> None:
    """The Flight SQL flags of ``serve``; unset, ServerConfig's ``sql_*`` defaults apply
    (stated here, not imported: flight.server imports grpc, which reads GRPC_VERBOSITY once,
    before :func:`main` has set it)."""
    group = serve.add_argument_group(
        "Flight SQL", "Queries run in DuckDB over one-step snapshots of the tables.")
    group.add_argument("--sql-timeout", type=_period, default=None, metavar="SECONDS",
                       help="seconds a query may run, from its start to its last batch "
                            "read; past it the client gets DEADLINE_EXCEEDED (default 60)")
    group.add_argument("--sql-memory-mb", type=_positive, default=None, metavar="N",
                       help="memory DuckDB may use for all running queries together, in "
                            "MB; a query past it gets RESOURCE_EXHAUSTED (default 2048)")


def _add_links(serve: argparse.ArgumentParser) -> None:
    """The flags of ``serve`` that mirror tables of other servers (:mod:`flight.links`)."""
    group = serve.add_argument_group(
        "Links", "Tables of other servers mirrored here: each changes as its origin does, "
                 "under the origin's row keys, and resumes with deltas after a break. "
                 "Example: --mirror \"grpc://10.0.0.5:8815/trades=big_trades"
                 "?columns=sym,px&filter=px > 100 AND sym <> 'X'\"")
    group.add_argument("--mirror", action="append",
                       metavar="URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]",
                       help="mirror TABLE of the server at URI (grpc://host:port) as LOCAL "
                            "(default: TABLE); repeat for more tables. After '?', options "
                            "joined by '&', in any order: columns=A,B mirrors only these "
                            "columns; filter=CONDITION only the rows for which the SQL "
                            "condition (what may follow WHERE) is true, filtered on the "
                            "origin. Nothing is URL-encoded: quote the whole value for the "
                            "shell. Columns and filter are checked against the origin's table "
                            "before the server starts (see --mirror-timeout). A durable server "
                            "keeps its mirrors, columns and filter included, across restarts "
                            "(drop_table ends one)")
    group.add_argument("--mirror-of", action="append", metavar="URI",
                       help="mirror every table of the server at URI under its own name, "
                            "following the tables it creates and drops; repeatable")
    group.add_argument("--mirror-token", default=None, metavar="TOKEN",
                       help="bearer token for the origins (their read-only token is enough; "
                            "default: $TICKTABLE_MIRROR_TOKEN)")
    group.add_argument("--mirror-give-up", type=_period, default=None, metavar="SECONDS",
                       help="a mirror out of sync this long stops trying and fails, telling "
                            "its subscribers (default: retry for ever)")
    group.add_argument("--mirror-timeout", type=_period, default=None, metavar="SECONDS",
                       help="how long the start waits for the origin of a --mirror with "
                            "columns or a filter to answer with its table's schema; past it "
                            "the server does not start (default 30; not waited for when a "
                            "durable server remembers that mirror as given)")
    group.add_argument("--filter-linger", type=_seconds, default=None, metavar="SECONDS",
                       help="as an origin: how long the table of a filtered subscription (a "
                            "filtered mirror's) is kept after its last subscriber left, so that "
                            "a link reconnecting within it resumes with deltas (default 60)")


def _health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"{args.host}:{args.port}"

    def fail(msg: str) -> int:
        print(f"ticktable health: {target}: {msg}", file=sys.stderr)
        return 1

    tls = args.tls or args.tls_ca is not None
    if args.tls_server_name and not tls:
        return fail("--tls-server-name needs --tls or --tls-ca")
    try:
        roots = _read(args.tls_ca, "--tls-ca")
    except InputError as exc:
        return fail(str(exc))
    options = ([("grpc.ssl_target_name_override", args.tls_server_name)]
               if args.tls_server_name else [])
    token = args.token or None
    metadata = [("authorization", f"Bearer {token}")] if token else None
    channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(roots), options) if tls
               else grpc.insecure_channel(target, options))
    try:
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=args.timeout, metadata=metadata)
    except grpc.RpcError as exc:
        # e.g. UNAVAILABLE: nothing listens, or the TLS handshake failed (plain vs TLS, an
        # untrusted certificate, a name the certificate does not carry)
        details = " ".join((exc.details() or "").split())
        return fail(f"{exc.code().name}: {details}" if details else exc.code().name)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{target}: {name}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ticktable", description="Ticktable: live tables with precise deltas.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run an in-process live table and print its updates")
    demo.add_argument("--interval", type=_seconds, default=0.5, help="seconds between cycles (default 0.5)")
    demo.add_argument("--cycles", type=int, default=None, help="stop after this many cycles")
    demo.add_argument("--seed", type=int, default=None)
    demo.add_argument("--validate", action="store_true", help="validate every update")
    demo.set_defaults(func=_demo)
    serve = sub.add_parser("serve", help="run the server (Arrow Flight and the TableService)",
                           description="Serve live tables until SIGTERM/Ctrl-C. One port "
                                       "carries Arrow Flight, the gRPC TableService "
                                       "(ticktable_proto.v1), gRPC health and server reflection. "
                                       "Clients are held to the limits below (--max-*): "
                                       "message size, value size, columns per table, "
                                       "tables, subscriptions per client, staged bytes per "
                                       "write, writes waiting for a cycle.")
    serve.add_argument("--host", default=os.environ.get("TICKTABLE_HOST", "127.0.0.1"),
                       help="address to bind (default $TICKTABLE_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=_env_int("TICKTABLE_PORT", 8815),
                       help="the port of every service (0: any free port; default "
                            "$TICKTABLE_PORT or 8815)")
    serve.add_argument("--token", default=None,
                       help="bearer token every call must carry (or set TICKTABLE_TOKEN)")
    serve.add_argument("--read-token", default=None,
                       help="bearer token for read-only access: snapshots, subscriptions, "
                            "listings and stats; writes, creates, drops and compositions answer "
                            "PERMISSION_DENIED (needs --token; or set TICKTABLE_READ_TOKEN)")
    serve.add_argument("--metrics-port", type=int,
                       default=_env_int("TICKTABLE_METRICS_PORT", None),
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free "
                            "port; default $TICKTABLE_METRICS_PORT, else none)")
    serve.add_argument("--http-port", type=int, default=None,
                       help="serve the web UI (tables live in the browser) on this port "
                            "(0: any free port; -1: no web UI; default $TICKTABLE_HTTP_PORT, "
                            "else 8817, or any free port when --port is 0)")
    serve.add_argument("--web-feed", choices=["perspective", "arrow"], default="perspective",
                       help="how the web UI feeds a grid: 'perspective' (default: "
                            "Perspective's Python server holds the table, the browser "
                            "fetches its viewport) or 'arrow' (the table streams into the "
                            "browser's engine as Arrow IPC)")
    serve.add_argument("--web-interval", type=float, default=0.05, metavar="SECONDS",
                       help="the web UI sends a grid at most one change per this many "
                            "seconds, composing what changed in between (default 0.05; "
                            "0: every cycle)")
    serve.add_argument("--web-sched", choices=["idle", "nice"], default="idle",
                       help="how the web UI's own process runs: 'idle' (default: "
                            "SCHED_IDLE, only on cores the server leaves idle) or 'nice' "
                            "(nice 19)")
    serve.add_argument("--log-format", choices=["text", "json"], default="text",
                       help="log lines as text (default) or one JSON object per line")
    serve.add_argument("--tls-cert", default=None, help="PEM certificate chain file (enables TLS)")
    serve.add_argument("--tls-key", default=None, help="PEM private key file")
    serve.add_argument("--interval", type=_period, default=0.1,
                       help="seconds between update cycles (default 0.1)")
    serve.add_argument("--cycle-priority", choices=list(PRIORITIES), default="realtime",
                       help="how the cycle thread runs: 'realtime' (default: SCHED_FIFO when "
                            "the process may, i.e. root, CAP_SYS_NICE or ulimit -r >= 1, so "
                            "other busy processes cannot delay a cycle; else normal, said at "
                            "start) or 'normal'; the mirrors' link threads run as the cycle "
                            "thread does")
    serve.add_argument("--demo", action="store_true",
                       help="add a ticking 'quotes' table and tables derived from it")
    serve.add_argument("--seed", type=int, default=None, help="demo data seed")
    serve.add_argument("--data-dir", default=None,
                       help="where tables are kept across restarts (default $TICKTABLE_DATA_DIR, "
                            "else the user data directory, e.g. ~/.local/share/ticktable)")
    serve.add_argument("--in-memory", action="store_true",
                       help="keep nothing: every table is gone when the server stops")
    serve.add_argument("--checkpoint-seconds", type=float, default=300.0,
                       help="write a checkpoint once this many seconds passed with something "
                            "journaled or mirrored (default 300)")
    serve.add_argument("--checkpoint-bytes", type=int, default=512 << 20,
                       help="write a checkpoint once the journal grew by this many bytes, "
                            "mirrors' changes counted (default 512 MiB)")
    _add_limits(serve)
    _add_sql(serve)
    _add_links(serve)
    serve.set_defaults(func=_serve)
    health = sub.add_parser("health", help="exit 0 when a server reports SERVING (gRPC health)",
                            description="Ask a server's gRPC health service, on its one port "
                                        "(the container health check). A TLS server needs "
                                        "--tls or --tls-ca.")
    health.add_argument("--host", default="127.0.0.1", help="server address (default 127.0.0.1)")
    health.add_argument("--port", type=int, default=_env_int("TICKTABLE_PORT", 8815),
                        help="server port (default $TICKTABLE_PORT or 8815)")
    health.add_argument("--tls", action="store_true",
                        help="connect with TLS, trusting the system's root certificates")
    health.add_argument("--tls-ca", default=os.environ.get("TICKTABLE_TLS_CA") or None,
                        metavar="FILE",
                        help="connect with TLS, trusting the PEM certificate(s) in FILE (e.g. "
                             "the server's self-signed --tls-cert; default $TICKTABLE_TLS_CA)")
    health.add_argument("--tls-server-name", default=None, metavar="NAME",
                        help="the name the server's certificate must carry, when it is not "
                             "--host (e.g. checking 127.0.0.1 inside a container)")
    health.add_argument("--token", default=os.environ.get("TICKTABLE_TOKEN"),
                        help="bearer token to send (default $TICKTABLE_TOKEN; the health "
                             "service itself needs none)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    health.set_defaults(func=_health)
    from clients.commands import add_commands

    add_commands(sub)
    args = parser.parse_args(argv)
    if not args.verbose:
        # gRPC's C core writes its own ERROR lines to stderr, read once when grpc is first
        # imported (below, by serve and health): a port in use would print its log line
        # beside our one-line error. Failures reach us as exceptions; -v keeps the lines.
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    level = logging.DEBUG if args.verbose else logging.WARNING
    if getattr(args, "log_format", "text") == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.func is _serve and not args.verbose:
        logging.getLogger("ticktable.calls").setLevel(logging.INFO)  # error answers, with peer
    elif not args.verbose:  # a client command says what failed in its own one line
        logging.getLogger("clients.subscription").setLevel(logging.CRITICAL)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
