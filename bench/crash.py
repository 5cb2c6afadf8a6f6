"""Crash test (#16 item 6): SIGKILL a real durable server at random moments, check every promise.

Each *kill point* is one round against a ``ticktable serve --data-dir`` subprocess on
loopback, always the same data dir and port:

1. **Start** the server (small checkpoint thresholds, so checkpoints happen every second)
   and time it until it listens (``restart seconds``; its own recovery time is parsed from
   its second line). Round 0 creates the tables and, through the TableService, the derived
   tables ``kv_a`` (``kv.where(s == "a")``) and ``kv_by_w`` (``kv.agg_by([sum v, count], by
   w)``).
2. **Retry the stream**: the stream batch whose commit was in flight at the kill is sent
   again with the same ``(stream_id, batch_id)`` (it must apply exactly once, whether or not
   the first try made it), and the last acknowledged batch is replayed (it must be refused).
3. **Verify** the restored state against the client-side model of acknowledged writes (see
   :func:`_verify`): every acknowledged append batch present exactly once and whole, an
   unacknowledged one whole or absent; per keyed writer, the rows equal the model, or the
   model plus its one unacknowledged write; every committed transaction whole in both of
   its tables, a commit in flight all-or-nothing, staged, abandoned and aborted
   transactions absent; stream batches once; derived tables equal to their recomputation
   with pandas from the restored ``kv``; a subscriber that lived through the restart (it
   reconnects by itself) and one attached now both converge to the snapshot. Whatever an
   unacknowledged write turned out to be is then folded into the model.
4. **Write and kill**: five writer threads (appends, two keyed writers doing upserts,
   deletes and upserts with ``__delete``, staged two-table transactions that commit at once,
   later (across checkpoints) or abort or are abandoned, and stream micro-batches with
   batch ids) run until the server is killed with SIGKILL. The transaction writer starts
   with *late commits*: write ids the previous server held open at the kill (dropped at
   its restart) are committed now, as a Spark driver would; they must stay invisible
   after this restart and every later one. Rounds rotate over three kill
   moments: ``checkpoint`` (as soon as ``checkpoints/`` shows a ``.partial`` directory or a
   new checkpoint being published), ``commit`` (0-3 ms after a writer sent a commit) and
   ``delay`` (a random time). A kill counts as *mid-checkpoint* when the disk shows an
   unfinished checkpoint afterwards, and as *mid-commit* when a commit was sent before the
   kill and never answered.

After the last kill one more start verifies, then a clean stop (SIGTERM: the shutdown
checkpoint) and a last start verify again. Everything is bounded: per-call timeouts, joins
with timeouts and an overall watchdog that kills the server.

The model and the checks are in ``bench/_crash_model.py``, the writers in
``bench/_crash_writers.py``. Usable from tests (:func:`run` returns a
:class:`~bench._crash_model.CrashReport`) and as a script::

    python bench/crash.py --kill-points 50 --seed 1 [--json]
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

import ticktable as tt  # noqa: E402
from bench._common import print_table, write_json  # noqa: E402
from bench._crash_model import (  # noqa: E402
    ACKED,
    KEYED_WRITERS,
    CrashReport,
    Model,
    Watch,
    create_tables,
    verify,
)
from bench._crash_writers import (  # noqa: E402
    Round,
    appender,
    keyed_writer,
    retry_stream,
    streamer,
    transactions,
)
from bench.ports import HeldPort  # noqa: E402
from clients.wire import Endpoint  # noqa: E402

__all__ = ["CrashReport", "ServerProcess", "run"]

STRATEGIES = ("checkpoint", "commit", "delay")
_SERVING = re.compile(r"ticktable serving Flight at (\S+)")
_RECOVERED = re.compile(r"journal record\(s\) in ([\d.]+) s")


# ------------------------------------------------------------------------------ the server
class ServerProcess:
    """``ticktable serve`` over ``data_dir`` in a subprocess; SIGKILL or SIGTERM it.

    The constructor returns once the server listens (its first stdout line), raising
    ``RuntimeError`` with the end of its stderr if it exits or stays silent for
    ``startup_timeout`` seconds. Stdout is drained by a thread; stderr goes to ``log_path``.

    Parameters
    ----------
    data_dir
        The server's ``--data-dir``.
    port
        A fixed port (0: any free one; a restart on the same port keeps clients' URIs).
    checkpoint_seconds, checkpoint_bytes
        The server's checkpoint thresholds.
    verbose
        ``-v``: the server logs at DEBUG (lifecycle lines such as refused stream replays).
    args
        More flags of ``serve``, after these (a flag given again wins: ``("--http-port",
        "-1")`` serves no web UI).
    """

    def __init__(self, data_dir: Path, log_path: Path, *, port: int = 0,
                 interval: float = 0.02, checkpoint_seconds: float = 0.5,
                 checkpoint_bytes: int = 64 << 10, verbose: bool = False,
                 startup_timeout: float = 60.0, args: Sequence[str] = ()) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "ticktable.cli", *(["-v"] if verbose else []), "serve",
               "--data-dir", str(data_dir), "--port", str(port),
               "--interval", str(interval), "--checkpoint-seconds", str(checkpoint_seconds),
               "--checkpoint-bytes", str(checkpoint_bytes),
               # a restart reuses the Flight port, and a fixed --port would put the web UI on
               # 8817: any free port instead, so two harnesses (or a server left on 8817)
               # never collide
               "--http-port", "0", *args]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        self._stderr = open(log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._drain, name="crash-server-stdout", daemon=True).start()
        first = self._line(startup_timeout)
        m = _SERVING.match(first or "")
        if m is None:
            self.kill()
            raise RuntimeError(f"ticktable serve did not start ({first!r}); stderr ends:\n"
                               f"{self.stderr_tail()}")
        self.start_seconds = time.perf_counter() - t0
        self.location = m.group(1)
        found = None
        for _ in range(3):  # the web UI's line may come first
            found = _RECOVERED.search(self._line(10.0) or "")
            if found:
                break
        self.recovery_seconds = float(found.group(1)) if found else float("nan")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed at EOF: the process is gone
            for line in self.proc.stdout:
                self.lines.put(line)

    def _line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stderr_tail(self, chars: int = 3000) -> str:
        if not self._stderr.closed:  # kill() closed it: what it wrote is on disk
            self._stderr.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._stderr.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (clean shutdown, with its checkpoint); SIGKILL after ``timeout`` seconds."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        self._stderr.close()
        return code


def _checkpoint_names(ckdir: Path) -> set[str]:
    try:
        return set(os.listdir(ckdir))
    except FileNotFoundError:
        return set()


def _published(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith("ckpt-") and not n.endswith(".partial")}


def _unfinished(ckdir: Path, before: set[str]) -> bool:
    """Whether the disk shows a checkpoint begun this round and not finished.

    A new ``.partial`` directory or ``.tmp`` file (files being written), or a new
    checkpoint beside an older one or not yet named by ``CURRENT`` (being published).
    A kill after the clean-up but before the journal was cut leaves no trace here.
    """
    names = _checkpoint_names(ckdir)
    new = names - before
    if any(n.endswith((".partial", ".tmp")) for n in new):
        return True
    fresh = _published(new)
    if not fresh:
        return False
    try:
        current = (ckdir / "CURRENT").read_text().strip()
    except FileNotFoundError:
        current = ""
    return len(_published(names)) > 1 or current not in fresh


def _kill_when(r: Round, server: ServerProcess, strategy: str, rng: random.Random,
               ckdir: Path, info: dict[str, Any]) -> None:
    """Wait for this round's moment, then SIGKILL the server (bounded waits only)."""
    pause = threading.Event()  # never set: its wait is a bounded pause
    pause.wait(rng.uniform(0.2, 0.8))  # the writers get going
    if strategy == "checkpoint":
        target = rng.choice(("writing", "publishing"))
        before = _published(_checkpoint_names(ckdir))
        deadline = time.monotonic() + 4.0
        info["moment"] = "timeout"
        while time.monotonic() < deadline and not r.stop.is_set():
            names = _checkpoint_names(ckdir)
            if target == "writing" and any(n.endswith(".partial") for n in names):
                info["moment"] = "checkpoint writing"
                break
            if target == "publishing" and _published(names) - before:
                info["moment"] = "checkpoint published"
                break
            pause.wait(0.0005)
    elif strategy == "commit":
        r.commits.sent.clear()
        got = r.commits.sent.wait(3.0)
        pause.wait(rng.uniform(0.0, 0.003))
        info["moment"] = "after a commit was sent" if got else "timeout"
    else:
        pause.wait(rng.uniform(0.0, 2.0))
        info["moment"] = "random delay"
    with r.commits.lock:  # the commits unanswered at this instant
        r.killed.set()
        server.proc.send_signal(signal.SIGKILL)
        info["commits_at_kill"] = set(r.commits.active)
    r.stop.set()
    server.kill()


def run(kill_points: int, seed: int, data_dir: Path, *, checkpoint_seconds: float = 0.5,
        checkpoint_bytes: int = 64 << 10, watchdog: float = 900.0,
        echo: Callable[[str], None] | None = None) -> CrashReport:
    """Run ``kill_points`` rounds of write-then-SIGKILL against one data dir; see the module doc.

    Parameters
    ----------
    kill_points
        How many times the server is killed (rounds).
    seed
        Seeds every random choice (timings still vary from run to run).
    data_dir
        The server's data dir (created; its logs go to ``<data_dir>-logs``).
    checkpoint_seconds, checkpoint_bytes
        The server's checkpoint thresholds (small: checkpoints happen during the rounds).
    watchdog
        Seconds after which the run is abandoned: the server is killed and TimeoutError raised.
    echo
        Called with one line per round (progress), e.g. ``print``.

    Returns
    -------
    CrashReport
        The figures; ``report.problems == 0`` when every promise held.
    """
    rng = random.Random(seed)
    rep = CrashReport(kill_points, seed)
    model = Model(kv_inflight={w: None for w in range(KEYED_WRITERS)})
    logs = data_dir.with_name(data_dir.name + "-logs")
    held = HeldPort()  # every server's, free of others between a kill and the restart
    port = held.port
    ckdir = data_dir / "checkpoints"
    t_start = time.perf_counter()
    expired = threading.Event()
    current: list[ServerProcess] = []

    def on_watchdog() -> None:
        expired.set()
        for s in current:
            s.kill()

    timer = threading.Timer(watchdog, on_watchdog)
    timer.daemon = True
    timer.start()
    watcher: tt.Client | None = None
    long_lived: Watch | None = None

    def start(n: int) -> tuple[ServerProcess, tt.Client]:
        if expired.is_set():
            raise TimeoutError(f"crash run passed its watchdog of {watchdog:.0f} s")
        server = ServerProcess(data_dir, logs / f"server-{n:03d}.log", port=port,
                               checkpoint_seconds=checkpoint_seconds,
                               checkpoint_bytes=checkpoint_bytes)
        current[:] = [server]
        rep.restart_seconds.append(server.start_seconds)
        rep.recovery_seconds.append(server.recovery_seconds)
        return server, tt.connect(server.location, timeout=15)

    try:
        for rnd in range(kill_points + 2):
            server, client = start(rnd)
            r = Round(Endpoint(server.location, timeout=15), model, rep, f"{seed}-{rnd}")
            with client:
                if rnd == 0:
                    create_tables(client)
                if long_lived is None:  # it reconnects by itself across kills
                    watcher = tt.connect(server.location, timeout=15)
                    long_lived = Watch(watcher, "kv", reconnect_delay=0.1,
                                       max_reconnect_delay=0.5)
                retry_stream(r, rep)
                verify(client, model, rep, long_lived)
            info: dict[str, Any] = {"round": rnd, "start s": round(server.start_seconds, 3)}
            if rnd > kill_points:  # verified after the clean stop: done
                break
            if rnd == kill_points:  # verified after the last kill: now a clean stop
                long_lived.live.close()  # an open stream would hold the shutdown up
                assert watcher is not None
                watcher.close()
                long_lived = watcher = None
                info["moment"] = f"clean stop (exit {server.stop()})"
                rep.rounds.append(info)
                continue
            strategy = STRATEGIES[rnd % len(STRATEGIES)]
            info["strategy"] = strategy
            seeds = [rng.randrange(1 << 30) for _ in range(6)]
            threads = [threading.Thread(target=appender, args=(r, random.Random(seeds[0]), 0)),
                       *(threading.Thread(target=keyed_writer,
                                          args=(r, random.Random(seeds[1 + w]), w))
                         for w in range(KEYED_WRITERS)),
                       threading.Thread(target=transactions, args=(r, random.Random(seeds[3]))),
                       threading.Thread(target=streamer, args=(r, random.Random(seeds[4])))]
            names_before = _checkpoint_names(ckdir)
            t0 = time.perf_counter()
            for t in threads:
                t.daemon = True
                t.start()
            _kill_when(r, server, strategy, random.Random(seeds[5]), ckdir, info)
            info["write s"] = round(time.perf_counter() - t0, 3)
            for t in threads:
                t.join(30.0)
                if t.is_alive():
                    rep.writer_errors += 1
                    rep.fail(f"round {rnd}: a writer did not stop within 30 s of the kill")
            unfinished = _unfinished(ckdir, names_before)
            rep.checkpoints_seen += len(_published(_checkpoint_names(ckdir) - names_before))
            info["mid-checkpoint"] = unfinished
            info["mid-commit"] = bool(info.pop("commits_at_kill") & r.commits.failed)
            rep.mid_checkpoint_kills += unfinished
            rep.mid_commit_kills += info["mid-commit"]
            rep.rounds.append(info)
            if echo is not None:
                echo(f"round {rnd}: {strategy} -> {info['moment']}; mid-checkpoint "
                     f"{unfinished}, mid-commit {info['mid-commit']}; problems so far "
                     f"{rep.problems}")
    finally:
        timer.cancel()
        for s in current:
            s.kill()
        if long_lived is not None:
            long_lived.live.close()
        if watcher is not None:
            watcher.close()
        held.close()
    m = model
    rep.checked = (sum(state == ACKED for _, state in m.appends.values()) + m.kv_acked
                   + sum(tx.status == "committed" for tx in m.tx.values()) + len(m.stream))
    rep.seconds = time.perf_counter() - t_start
    return rep


# ---------------------------------------------------------------------------------- script
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kill-points", type=int, default=50, help="rounds (default 50)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=None,
                        help="where the server keeps its tables (default: a temporary dir)")
    parser.add_argument("--watchdog", type=float, default=1800.0,
                        help="abandon the run after this many seconds (default 1800)")
    parser.add_argument("--json", nargs="?", const="", default=None,
                        help="write JSON (to bench/results/crash.json, or the path given)")
    args = parser.parse_args(argv)
    # clients warn about every stream the kills break and every abort they cannot send
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="ticktable-crash-") as tmp:
        data_dir = Path(args.data_dir) if args.data_dir else Path(tmp) / "data"
        rep = run(args.kill_points, args.seed, data_dir, watchdog=args.watchdog, echo=print)
    figures = rep.figures()
    print_table(f"crash test: {rep.kill_points} SIGKILLs, seed {rep.seed}, "
                f"{rep.seconds:.0f} s", [figures], list(figures))
    moments = Counter(str(x.get("moment")) for x in rep.rounds)
    print_table("kill moments", [{"moment": k, "kills": v} for k, v in sorted(moments.items())],
                ["moment", "kills"])
    print(f"\nunacknowledged writes found applied {rep.inflight_applied}, dropped "
          f"{rep.inflight_dropped}; stream retries refused as already applied "
          f"{rep.stream_retries_refused}; checkpoints published during rounds "
          f"{rep.checkpoints_seen}")
    for f in rep.failures[:20]:
        print("FAIL:", f)
    if args.json is not None:
        write_json("crash", {"figures": figures, "report": asdict(rep)}, args.json or None)
    return 0 if rep.problems == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
