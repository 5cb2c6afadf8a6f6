"""Fuzz a live server (#18 item 4): mutated client bytes at every method, from a few threads.

A ``ticktable serve`` subprocess (durable, in a temporary data dir) is sent ``--cases``
calls built by :mod:`bench._fuzz_cases` (tickets, action bodies, DoPut and DoExchange
frames, Substrait filters, TableService requests, each valid then mutated) from
``--threads`` client threads, while the clients of :mod:`bench._fuzz_watch` work beside
them: a writer upserting, deleting and appending into two watched tables, and three
subscribers following them. Every few hundred cases what the fuzz created is dropped again.

At the end: the watched tables must equal the writer's model and every subscriber its
table (exact), the server must be the same process, alive, and still answering. Printed:
cases, answers by status code (per method family), INTERNAL/UNKNOWN answers and what the
server logged for them, messages with a traceback or a path (or over several lines, or
too long), hangs, server restarts, subscriber mismatches, and the server log's ERROR
records. The exit code is 1 when any of these is not zero::

    python bench/fuzz.py --cases 100000 --seed 1 [--threads 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

import pyarrow.flight as fl  # noqa: E402

from bench import _fuzz_cases as fz  # noqa: E402
from bench import _fuzz_judge as fj  # noqa: E402
from bench import _fuzz_watch as fw  # noqa: E402
from bench._common import print_table, write_json  # noqa: E402
from bench.crash import ServerProcess  # noqa: E402

CLEANUP_EVERY = 500  # cases between two cleanups
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+) ([\w.]+): (.*)$")
_NATIVE = ("E0000", "W0000", "I0000", "/arrow/", "WARNING: All log messages")
_REF = re.compile(r"ref=(\w+)")
#: A derived table whose client's expression fails on later rows (a division by zero)
#: fails, logged at ERROR as the style says; the client's doing, not a server bug.
_CLIENT_CAUSED = re.compile(r"engine\.errors\.(InputError|SchemaError|InvalidKeyError|"
                            r"ExpressionError|LimitExceeded)\b")


class Tally:
    """What the fuzz threads saw, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cases = 0
        self.codes: Counter[str] = Counter()
        self.by_family: dict[str, Counter[str]] = {}
        self.bad: Counter[str] = Counter()  # INTERNAL/UNKNOWN by case label
        self.undecodable_internal = 0       # INTERNAL from gRPC's request deserializer
        self.internal_refs: dict[str, str] = {}  # ref -> case label
        self.message_problems: Counter[str] = Counter()
        self.hangs = 0
        self.examples: list[dict[str, Any]] = []
        self.cleanup_problems: list[str] = []
        self.client_errors: Counter[str] = Counter()

    def add(self, case: fz.Case, answer: fj.Answer) -> None:
        family = case.method.rsplit("/", 1)[1]
        sent = b"".join(case.request) if isinstance(case.request, list) else case.request
        problems = fj.violations(answer, sent)
        with self.lock:
            self.cases += 1
            self.codes[answer.code] += 1
            self.by_family.setdefault(family, Counter())[answer.code] += 1
            if answer.code in fj.BAD_CODES:
                if (answer.details == "Exception deserializing request!"
                        and fz.undecodable(case)):
                    self.undecodable_internal += 1
                else:
                    self.bad[case.label] += 1
                    ref = _REF.search(answer.details)
                    if ref:
                        self.internal_refs[ref.group(1)] = case.label
            if answer.code == "DEADLINE_EXCEEDED":
                self.hangs += 1
            for p in problems:
                if not p.startswith("status ") and not p.startswith("no answer"):
                    self.message_problems[p] += 1
            if problems and len(self.examples) < 20:
                req = case.request if isinstance(case.request, list) else [case.request]
                self.examples.append({"case": case.label, "code": answer.code,
                                      "problems": problems, "details": answer.details[:300],
                                      "texts": [t[:300] for t in answer.texts],
                                      "request_hex": [r[:200].hex() for r in req][:4]})


def _fuzz(location: str, seed: int, budget: Any, tally: Tally, stop: threading.Event,
          timeout: float) -> None:
    rnd = random.Random(seed)
    target = location.split("://", 1)[1]
    with grpc.insecure_channel(target) as channel:
        while not stop.is_set() and budget():
            case = fz.random_case(rnd)
            try:
                answer = fj.send(channel, case, timeout=timeout, idle=0.2)
            except Exception as exc:  # the client side failed: count it, keep going
                with tally.lock:
                    tally.client_errors[f"{type(exc).__name__}: {str(exc)[:100]}"] += 1
                continue
            tally.add(case, answer)


def _server_log(path: Path) -> dict[str, Any]:
    """ERROR records of the server's log, and the exception each traceback ended with."""
    records: list[tuple[str, str, str, list[str]]] = []
    for line in path.read_text(errors="replace").splitlines():
        m = _RECORD.match(line)
        if m:
            records.append((m.group(1), m.group(2), m.group(3), []))
        elif records and line.strip() and not line.startswith(_NATIVE):
            records[-1][3].append(line)
    errors = [r for r in records if r[0] in ("ERROR", "CRITICAL")]
    by_ref: dict[str, str] = {}
    summary: Counter[str] = Counter()
    client_caused = 0
    for _, logger, message, rest in errors:
        exc = rest[-1].strip()[:200] if rest else ""
        ref = _REF.search(message)
        if ref:
            by_ref[ref.group(1)] = exc
        if _CLIENT_CAUSED.match(exc):  # a table failed on what a client asked of it
            client_caused += 1
        summary[f"{logger}: {_REF.sub('ref=…', message)[:120]} | {exc}"] += 1
    return {"error_records": len(errors) - client_caused, "client_caused": client_caused,
            "tracebacks": sum(1 for r in records if any("Traceback" in x for x in r[3])),
            "by_ref": by_ref, "summary": summary}


def run(cases: int, seed: int, threads: int, timeout: float = 10.0) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ticktable-fuzz-"))
    log_path = work / "server.log"
    server = ServerProcess(work / "data", log_path, interval=0.02, checkpoint_seconds=30.0,
                           checkpoint_bytes=64 << 20)
    pid = server.proc.pid
    print(f"server pid {pid} at {server.location} (log {log_path})", flush=True)
    client = fl.connect(server.location)
    tally = Tally()
    try:
        fw.create_tables(client)
        writer = fw.Writer(server.location, seed).start()
        subs = [fw.Subscriber(server.location, "watched_keyed"),
                fw.Subscriber(server.location, "watched_keyed", ["k", "v"]),
                fw.Subscriber(server.location, "watched_append")]
        started = [0]
        lock = threading.Lock()

        def budget() -> bool:
            with lock:
                if started[0] >= cases:
                    return False
                started[0] += 1
                return True

        stop = threading.Event()
        t0 = time.perf_counter()
        workers = [threading.Thread(target=_fuzz, args=(server.location, seed * 1000 + i, budget,
                                                        tally, stop, timeout),
                                    name=f"fuzz-{i}", daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        channel = grpc.insecure_channel(server.location.split("://", 1)[1])
        next_cleanup, next_report = CLEANUP_EVERY, max(1, cases // 10)
        while any(w.is_alive() for w in workers):
            for w in workers:
                w.join(timeout=0.5)
            if server.proc.poll() is not None:
                stop.set()
                print(f"the server exited with code {server.proc.returncode}", flush=True)
                break
            done = tally.cases
            if done >= next_cleanup:
                tally.cleanup_problems += fw.cleanup(client, channel)
                next_cleanup = done + CLEANUP_EVERY
            if done >= next_report:
                rate = done / (time.perf_counter() - t0)
                print(f"  {done:,} cases, {rate:,.0f}/s, {dict(tally.codes.most_common(4))}",
                      flush=True)
                next_report += max(1, cases // 10)
        seconds = time.perf_counter() - t0
        channel.close()
        writer.stop()
        alive = server.proc.poll() is None
        mismatches = fw.check_exact(client, writer, subs) if alive else ["server gone"]
        answering = alive and bool(fw.sequences(client))
        for s in subs:
            s.close()
    finally:
        client.close()
    log = _server_log(log_path)
    stop_seconds = time.perf_counter()
    exit_code = server.stop(timeout=60.0) if server.proc.poll() is None else server.proc.returncode
    stop_seconds = time.perf_counter() - stop_seconds
    said = []
    while not server.lines.empty():
        said.append(server.lines.get().strip())
    causes: Counter[str] = Counter()
    for ref, label in tally.internal_refs.items():
        causes[f"{label}: {log['by_ref'].get(ref, '(not in the server log)')}"] += 1
    result = {
        "cases": tally.cases, "seed": seed, "threads": threads, "seconds": seconds,
        "answers_by_code": dict(tally.codes.most_common()),
        "answers_by_method": {k: dict(v) for k, v in sorted(tally.by_family.items())},
        "internal_or_unknown": sum(tally.bad.values()),
        "internal_or_unknown_by_case": dict(tally.bad.most_common()),
        "internal_causes": dict(causes.most_common()),
        "internal_undecodable_request": tally.undecodable_internal,
        "messages_with_traceback_or_path": tally.message_problems["traceback"]
        + tally.message_problems["path"],
        "message_problems": dict(tally.message_problems),
        "hangs": tally.hangs,
        "server_restarts": 0 if alive else 1,
        "server_pid": pid, "server_alive_at_end": alive, "server_answering_at_end": answering,
        "server_exit_code": exit_code, "server_stop_seconds": stop_seconds,
        "server_last_words": said[-1] if said else "",
        "subscriber_mismatches": len(mismatches), "mismatches": mismatches,
        "subscriber_messages": [s.messages for s in subs],
        "writer_writes": writer.writes, "writer_errors": writer.errors[:10],
        "cleanup_problems": tally.cleanup_problems[:10],
        "client_errors": dict(tally.client_errors),
        "server_error_records": log["error_records"], "server_tracebacks": log["tracebacks"],
        "server_tables_failed_by_client_input": log["client_caused"],
        "server_errors": dict(log["summary"].most_common(20)),
        "examples": tally.examples, "server_log": str(log_path),
    }
    if _clean(result):
        shutil.rmtree(work, ignore_errors=True)
        result["server_log"] = None
    return result


def _clean(r: dict[str, Any]) -> bool:
    return not (r["internal_or_unknown"] or r["internal_undecodable_request"]
                or r["messages_with_traceback_or_path"] or r["message_problems"] or r["hangs"]
                or r["server_restarts"] or r["subscriber_mismatches"] or r["server_error_records"]
                or r["writer_errors"] or r["client_errors"])


def report(r: dict[str, Any]) -> None:
    print(f"\n== fuzz: {r['cases']:,} cases in {r['seconds']:,.0f} s "
          f"({r['cases'] / max(r['seconds'], 1e-9):,.0f}/s), seed {r['seed']}, "
          f"{r['threads']} client threads")
    codes = [c for c, _ in Counter(r["answers_by_code"]).most_common()]
    rows = [{"method": m, **v, "total": sum(v.values())} for m, v in r["answers_by_method"].items()]
    rows.append({"method": "all", **r["answers_by_code"], "total": r["cases"]})
    print_table("answers by status code", rows, ["method", *codes, "total"])
    print(f"\nINTERNAL/UNKNOWN for client input: {r['internal_or_unknown']:,}")
    for label, n in r["internal_or_unknown_by_case"].items():
        print(f"    {n:6,}  {label}")
    for cause, n in r["internal_causes"].items():
        print(f"    {n:6,}  server log: {cause}")
    print(f"INTERNAL from gRPC's deserializer (request message does not parse): "
          f"{r['internal_undecodable_request']:,}")
    print(f"messages with a traceback or path: {r['messages_with_traceback_or_path']:,}"
          f"  (all message problems: {r['message_problems'] or 'none'})")
    print(f"hangs (no answer within the deadline): {r['hangs']:,}")
    print(f"server restarts: {r['server_restarts']}  (pid {r['server_pid']}, alive at the end: "
          f"{r['server_alive_at_end']}, answering: {r['server_answering_at_end']}; "
          f"stopped with exit code {r['server_exit_code']} in {r['server_stop_seconds']:.1f} s: "
          f"{r['server_last_words']!r})")
    print(f"subscriber mismatches: {r['subscriber_mismatches']}  (3 subscribers, "
          f"{sum(r['subscriber_messages']):,} messages; writer: {r['writer_writes']:,} writes, "
          f"{len(r['writer_errors'])} errors)")
    for m in r["mismatches"]:
        print(f"    {m}")
    print(f"server log: {r['server_error_records']:,} ERROR records, "
          f"{r['server_tracebacks']:,} tracebacks; besides, "
          f"{r['server_tables_failed_by_client_input']:,} derived table(s) failed on their "
          f"client's expression (InputError: expected)")
    for line, n in r["server_errors"].items():
        print(f"    {n:6,}  {line}")
    for what in ("client_errors", "cleanup_problems", "writer_errors"):
        if r[what]:
            print(f"{what.replace('_', ' ')}: {r[what]}")
    if r["server_log"]:
        print(f"server log kept: {r['server_log']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=3, help="fuzzing client threads (default 3)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON")
    args = p.parse_args(argv)
    result = run(args.cases, args.seed, args.threads)
    report(result)
    if args.json:
        write_json("fuzz", result, args.json)
    return 0 if _clean(result) else 1


if __name__ == "__main__":
    sys.exit(main())
