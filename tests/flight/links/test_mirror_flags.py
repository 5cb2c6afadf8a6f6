"""``ticktable serve --mirror URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]``: the text
(:func:`flight.links.parse_mirror`), then real ``ticktable serve`` processes: an origin and
a mirror of some of its columns and the rows a SQL condition keeps, equal to the origin's
rows filtered and projected from scratch (under its row keys) after every push, rows
entering and leaving the filter by modification; a durable mirror restarted with the same
flag (the origin down) or without it keeps its columns and filter; bad flags end the start
with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ticktable as tt
from bench.crash import ServerProcess
from engine.errors import InputError
from flight.links import Link, MirrorSpec, parse_mirror
from tests.flight.links.test_durable_mirrors import _stats, _subscribed

ROOT = Path(__file__).resolve().parents[3]
KV = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])
#: the condition of the mirrors below: an '&' and an '=' inside it, a string literal
WHERE = "v > 0.5 AND s <> 'R&D=x'"


# ------------------------------------------------------------------------ the text
@pytest.mark.parametrize("text, want", [
    ("grpc://h:8815/t", ("grpc://h:8815", "t", "t", None, None)),
    ("h:8815/trades=big?columns=k,v&filter=v > 1",
     ("grpc://h:8815", "trades", "big", ("k", "v"), "v > 1")),
    # any order; spaces around column names; '&', '=' and '?' inside the condition
    (f"grpc+tls://[::1]:9/t=x?filter={WHERE} OR s = '?'&columns= k , s",
     ("grpc+tls://[::1]:9", "t", "x", ("k", "s"), f"{WHERE} OR s = '?'")),
    ("h:1/t?filter=s = 'a&b'", ("grpc://h:1", "t", "t", None, "s = 'a&b'")),
])
def test_a_mirror_text_carries_columns_and_a_filter(text, want):
    spec = parse_mirror(text)
    assert (spec.uri, spec.table, spec.name, spec.columns, spec.where) == want
    assert spec.filter is None  # compiled against the origin's schema by bind()


@pytest.mark.parametrize("text, error", [
    ("h:1/t?", "nothing after '?'"),
    ("h:1/t?colums=k", "unknown option 'colums' (options: columns, filter)"),
    ("h:1/t?v>1", "option 'v>1' is not NAME=VALUE"),
    ("h:1/t?columns=k&columns=v", "option 'columns' given twice"),
    ("h:1/t?columns=k,,v", "columns='k,,v': expected column names separated by commas"),
    ("h:1/t?columns=k,k", "columns: 'k' given twice"),
    ("h:1/t?filter=", "filter '': empty condition"),
    ("h:1/t?filter=v >", "filter 'v >': SQL syntax error at line 1, column 3"),
    ("h:1/t?filter=v > 1 ORDER BY v", "SQL syntax error at line 1, column 14: Invalid"),
    ("h:1/t=?filter=v > 1", "empty table or local name"),
])
def test_a_bad_mirror_text_names_the_bad_part(text, error):
    with pytest.raises(InputError) as info:
        parse_mirror(text)
    assert str(info.value).startswith(f"mirror {text!r}: ") and error in str(info.value)
    assert "\n" not in str(info.value)


def test_bind_checks_columns_and_compiles_the_filter_as_sql_where():
    spec = parse_mirror(f"h:1/t=big?columns=k,v&filter={WHERE}").bind(KV)
    assert spec.filter is not None and spec.where == WHERE
    assert MirrorSpec.from_json(spec.to_json()) == spec  # text and bytes, as journaled
    for text, error in [
        ("h:1/t=big?columns=k,vv", "mirror 'big' of grpc://h:1/t: columns: table 't' has no "
                                   "column 'vv' (has: k, v, s)"),
        ("h:1/t=big?filter=vv > 1", "mirror 'big' of grpc://h:1/t: filter: column 'vv' does "
                                    "not exist (columns: k, v, s)"),
        ("h:1/t=big?filter=v + 1", "mirror 'big' of grpc://h:1/t: filter: condition v + 1 is "
                                   "double, not a boolean"),
        ("h:1/t=big?filter=count(*) > 1", "filter: aggregate COUNT(*) is not allowed"),
    ]:
        with pytest.raises(InputError) as info:
            parse_mirror(text).bind(KV)
        assert error in str(info.value), info.value
    with pytest.raises(InputError, match="not compiled"):  # never followed unfiltered
        Link(tt.UpdateGraph(), parse_mirror("h:1/t?filter=v > 1"))


# ---------------------------------------------------------------- real processes
def _serve(started: list[ServerProcess], tmp_path: Path, name: str, *flags: str,
           port: int = 0) -> ServerProcess:
    p = ServerProcess(tmp_path / name, tmp_path / f"{name}.log", port=port, interval=0.02,
                      args=("--http-port", "-1", *flags))
    started.append(p)
    return p


def _eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _filtered(location: str) -> tuple[list[int], pa.Table]:
    """The origin's ``t`` filtered by WHERE and cut to ``k, v`` from scratch, row keys and
    order kept."""
    keys, rows = _subscribed(location, "t")
    mask = pc.fill_null(pc.and_kleene(pc.greater(rows["v"], 0.5),
                                      pc.not_equal(rows["s"], "R&D=x")), False)
    kept = [k for k, m in zip(keys, mask.to_pylist(), strict=True) if m]
    return kept, rows.filter(mask).select(["k", "v"])


def _mirrored(origin: ServerProcess, mirror: ServerProcess, what: str) -> None:
    want = _filtered(origin.location)

    def equal() -> bool:
        try:
            keys, rows = _subscribed(mirror.location, "big")
        except Exception:  # noqa: BLE001 - not made yet: the origin has not answered
            return False
        return keys == want[0] and rows.equals(want[1])

    _eventually(equal, what=f"the mirror = the origin filtered ({what})")


def _push(location: str, frame: dict[str, list[Any]], mode: str = "upsert") -> None:
    with tt.connect(location, timeout=30) as c:
        c.push("t", pd.DataFrame(frame), mode=mode)


def test_a_filtered_mirror_of_some_columns_from_the_command_line(processes, tmp_path,
                                                                  held_port):
    a = _serve(processes, tmp_path, "a", port=held_port.port)  # held while A is down
    with tt.connect(a.location, timeout=30) as c:
        c.create_table("t", KV, "keyed", keys=["k"])
    _push(a.location, {"k": [1, 2, 3, 4], "v": [0.9, 0.1, 0.7, 0.6],
                       "s": ["x", "x", "R&D=x", "y"]})
    flag = f"{a.location}/t=big?columns=k,v&filter={WHERE}"
    b = _serve(processes, tmp_path, "b", "--mirror", flag, "--checkpoint-seconds", "0.2")
    _mirrored(a, b, "first snapshot: 1 and 4")
    assert _stats(b.location, "big").link.in_sync
    steps: list[tuple[str, dict[str, list[Any]], str]] = [
        ("2 enters by its v", {"k": [2], "v": [0.8], "s": ["x"]}, "upsert"),
        ("1 leaves by its v, 3 enters by its s", {"k": [1, 3], "v": [0.2, 0.7],
                                                  "s": ["x", "z"]}, "upsert"),
        ("4 leaves by its s, 5 and 6 added, one in", {"k": [4, 5, 6], "v": [0.6, 0.55, 0.3],
                                                      "s": ["R&D=x", "y", "y"]}, "upsert"),
        ("5 modified in place, staying in", {"k": [5], "v": [0.99], "s": ["y"]}, "upsert"),
        ("2 deleted", {"k": [2]}, "delete"),
    ]
    for what, frame, mode in steps:
        _push(a.location, frame, mode)
        _mirrored(a, b, what)
    assert _subscribed(b.location, "big")[1].schema.names == ["k", "v"]

    # restarted with the same flag while the origin is down: taken as remembered, no wait
    b.stop()
    a.stop()
    b = _serve(processes, tmp_path, "b", "--mirror", flag, "--mirror-timeout", "0.5")
    keys, rows = _subscribed(b.location, "big")
    assert rows.schema.names == ["k", "v"] and sorted(rows["k"].to_pylist()) == [3, 5]
    a = _serve(processes, tmp_path, "a", port=held_port.port)  # durable: t comes back
    _push(a.location, {"k": [6, 5], "v": [0.9, 0.4], "s": ["y", "y"]})
    _mirrored(a, b, "after both restarts: 6 in, 5 out")

    # restarted without the flag: the journal and checkpoint keep columns and filter
    b.stop()
    b = _serve(processes, tmp_path, "b")
    _push(a.location, {"k": [7, 3], "v": [0.8, 0.1], "s": ["R&D=x", "z"]})
    _mirrored(a, b, "without the flag: 7 stays out, 3 leaves")
    for p in (b, a):
        assert p.stop() == 0, p.stderr_tail()


def _fails(args: list[str], *lines: str) -> None:
    """``serve --in-memory ARGS`` exits 2 before serving, its stderr one line holding all
    of ``lines``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--in-memory",
                          "--port", "0", "--http-port", "-1", *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 2, out
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""
    for line in lines:
        assert line in out.stderr, out.stderr


def test_bad_mirror_flags_end_the_start_with_one_line(processes, tmp_path, held_port):
    a = _serve(processes, tmp_path, "a")
    with tt.connect(a.location, timeout=30) as c:
        c.create_table("t", KV, "keyed", keys=["k"])
    at = a.location
    _fails(["--mirror", "http://h:1/t"], "ticktable serve: mirror 'http://h:1/t': the origin's "
                                         "URI must be grpc:// or grpc+tls://")
    _fails(["--mirror", f"{at}/t?colums=k"], "unknown option 'colums' (options: columns, filter)")
    _fails(["--mirror", f"{at}/t?filter=v >>"], f"ticktable serve: mirror '{at}/t?filter=v >>': "
                                                "filter 'v >>': SQL syntax error at line 1")
    _fails(["--mirror", f"{at}/t=big?columns=k,vv"],
           f"ticktable serve: mirror 'big' of {at}/t: columns: table 't' has no column 'vv' "
           f"(has: k, v, s)")
    _fails(["--mirror", f"{at}/t=big?filter=vv > 1"],
           f"ticktable serve: mirror 'big' of {at}/t: filter: column 'vv' does not exist "
           f"(columns: k, v, s)")
    _fails(["--mirror", f"{at}/t=big?filter=s > 1"],
           f"ticktable serve: mirror 'big' of {at}/t: filter: condition s > 1: ")
    _fails(["--mirror", f"grpc://127.0.0.1:{held_port.port}/t?filter=v > 1",  # refused
            "--mirror-timeout", "0.3"], "no answer from", "within 0.3 s", "--mirror-timeout")
    assert a.stop() == 0, a.stderr_tail()


def test_serve_help_shows_the_mirror_syntax():
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "serve", "--help"],
                         capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    text = " ".join(out.split())
    assert "--mirror URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]" in text
    assert ("--mirror \"grpc://10.0.0.5:8815/trades=big_trades?columns=sym,px&filter=px > 100 "
            "AND sym <> 'X'\"") in text
    assert "--mirror-timeout SECONDS" in text
