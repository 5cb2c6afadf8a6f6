"""bench_flight's servers: the trees they run from and one process per server (see bench_flight).

A server process imports ``engine`` and ``flight`` from its own tree (bench/_tree_child.py),
which is why this module and its callers import those only inside functions.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.flight as fl

from bench._tree_child import serve

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- trees
def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextmanager
def server_trees(old: str, old_tree: str | None = None
                 ) -> Iterator[tuple[list[tuple[str, str]], dict[str, dict[str, Any]]]]:
    """The trees to serve from, as (label, root), and what each is (for the JSON).

    "old" is a detached worktree of ``old`` in a temporary directory, removed on exit, or
    the checkout at ``old_tree`` as it is (only read); ``old == "none"`` without
    ``old_tree`` leaves only "new", this working tree.
    """
    info: dict[str, dict[str, Any]] = {"new": {
        "path": str(ROOT), "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(_git("status", "--porcelain", "--", "engine", "flight")),
    }}
    if old_tree is not None:
        path = Path(old_tree).resolve()
        commit = _git("-C", str(path), "rev-parse", "HEAD")
        info["old"] = {"rev": f"checkout {path}", "commit": commit, "path": str(path),
                       "uncommitted_changes": bool(_git("-C", str(path), "status", "--porcelain",
                                                        "--", "engine", "flight"))}
        yield [("old", str(path)), ("new", str(ROOT))], info
        return
    if old == "none":
        yield [("new", str(ROOT))], info
        return
    commit = _git("rev-parse", "--verify", f"{old}^{{commit}}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_flight_"))
    path = tmp / "old"
    _git("worktree", "add", "--detach", str(path), commit)
    try:
        info["old"] = {"rev": old, "commit": commit, "path": str(path)}
        yield [("old", str(path)), ("new", str(ROOT))], info
    finally:
        _git("worktree", "remove", "--force", str(path))
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------- server processes
class ServerFailed(Exception):
    """A server process failed to start or to answer a command (its one-line reason)."""


class ServerChild:
    """A server process for one section (spawned: no inherited threads or locks)."""

    def __init__(self, section: str, tree: str | None, params: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child_conn, tree, section, params), daemon=True)
        self.proc.start()
        child_conn.close()  # so that a process that died reads as EOF here
        self.broken = False
        try:
            self.ready = self._reply(300.0)
        except ServerFailed:
            self.close()
            raise

    def call(self, *cmd: Any, timeout: float = 300.0) -> Any:
        try:
            self.conn.send(cmd)
        except OSError as exc:
            self.broken = True
            raise ServerFailed(f"server process gone (exit code {self.proc.exitcode})") from exc
        return self._reply(timeout)

    def _reply(self, timeout: float) -> Any:
        try:
            if not self.conn.poll(timeout):
                self.broken = True
                raise ServerFailed(f"no answer in {timeout:g} s")
            status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.broken = True
            raise ServerFailed(f"server process ended (exit code {self.proc.exitcode})") from exc
        if status != "ok":
            raise ServerFailed(value)
        return value

    def close(self) -> None:
        if not self.broken and self.proc.is_alive():
            try:
                self.call("stop", timeout=60.0)
            except ServerFailed as exc:
                print(f"   server stop failed: {exc}")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


class Servers:
    """One section's server processes by label ("old", "new", "raw"), with a client each.

    A server that fails to start or to answer, or whose answers fail a check, is stopped
    and left out of the rest of the section; its reason goes to ``failures``.
    """

    def __init__(self, section: str, failures: list[dict[str, str]]) -> None:
        self.section = section
        self.failures = failures
        self.children: dict[str, ServerChild] = {}
        self.clients: dict[str, fl.FlightClient] = {}
        self.raw_acks = False  # whether the raw server answers each DoPut batch

    def start(self, label: str, tree: str | None, **params: Any) -> None:
        """Start server ``label`` from ``tree`` (``None``: raw) and connect to it."""
        with self.guard(label):
            child = ServerChild("raw" if tree is None else self.section, tree, params)
            self.children[label] = child
            self.clients[label] = fl.connect(child.ready)

    def labels(self, turn: int = 0, *, raw: bool = True) -> list[str]:
        """The servers still in, in start order rotated by ``turn`` (so none always goes first)."""
        names = [k for k in self.children if raw or k != "raw"]
        k = turn % len(names) if names else 0
        return names[k:] + names[:k]

    @contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """Run a step against server ``label``; if it raises, leave that server out."""
        try:
            yield
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ServerFailed) else f"{type(exc).__name__}: {exc}"
            self.failures.append({"section": self.section, "server": label, "error": reason})
            print(f"   !! {self.section}: the {label} server failed and is left out: {reason}")
            self._drop(label)

    def _drop(self, label: str) -> None:
        client = self.clients.pop(label, None)
        if client is not None:
            client.close()
        child = self.children.pop(label, None)
        if child is not None:
            child.close()

    def close(self) -> None:
        for label in list(self.children):
            self._drop(label)


def relative(base: float | None, t: float | None) -> float | None:
    """Throughput relative to ``base``: base time / time."""
    return None if base is None or not t else base / t
