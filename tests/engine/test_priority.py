"""The cycle thread's priority (engine.priority): real-time when the kernel grants it, normal
and said why when it does not, never passed on to the threads it starts.

What the process may take is read from the kernel independently of the code under test
(``CapEff`` in /proc/self/status and ``RLIMIT_RTPRIO``); the refusal is tested for real, in a
child started without ``CAP_SYS_NICE`` (``setpriv``) and with ``RLIMIT_RTPRIO`` 0.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from engine.errors import InputError
from engine.graph import UpdateGraph
from engine.priority import check_priority, set_thread_priority, thread_priority

ROOT = Path(__file__).resolve().parents[2]
CAP_SYS_NICE = 23


def _may_take_realtime() -> bool:
    caps = next(int(line.split()[1], 16) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("CapEff:"))
    return bool(caps >> CAP_SYS_NICE & 1) or resource.getrlimit(resource.RLIMIT_RTPRIO)[0] >= 1


EXPECTED = "realtime" if _may_take_realtime() else "normal"


def _in_thread(fn):
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_realtime_is_taken_by_the_calling_thread_only():
    def body():
        got = set_thread_priority("realtime")
        policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
        param = os.sched_getparam(0).sched_priority
        child = _in_thread(lambda: (os.sched_getscheduler(0), thread_priority()))
        return got, policy, param, child

    got, policy, param, child = _in_thread(body)
    assert got == EXPECTED
    if EXPECTED == "realtime":
        assert (policy, param) == (os.SCHED_FIFO, 1)  # the lowest real-time priority
    else:
        assert policy == os.SCHED_OTHER
    # a thread the real-time thread starts is a normal one (SCHED_RESET_ON_FORK)
    assert child == (os.SCHED_OTHER, "normal")
    # and the test's own thread was never touched
    assert os.sched_getscheduler(0) == os.SCHED_OTHER and thread_priority() == "normal"


def test_normal_leaves_the_thread_as_it_is():
    assert _in_thread(lambda: (set_thread_priority("normal"), os.sched_getscheduler(0))) == (
        "normal", os.SCHED_OTHER)


@pytest.mark.parametrize("bad", ["fifo", "", None, 1, "Realtime"])
def test_an_unknown_priority_is_one_line_naming_it(bad):
    for call in (check_priority, set_thread_priority, lambda p: UpdateGraph().start(0.1, priority=p)):
        with pytest.raises(InputError) as err:
            call(bad)
        msg = str(err.value)
        assert "\n" not in msg and repr(bad) in msg and "realtime, normal" in msg


def test_graph_cycle_thread_runs_at_the_priority_asked_for():
    for asked in ("realtime", "normal"):
        graph = UpdateGraph()
        t = graph.append_only_table(pa.schema([("x", pa.int64())]))
        seen: list[str] = []
        graph.add_terminal_listener(lambda step, seen=seen: seen.append(thread_priority()))
        graph.start(0.005, priority=asked)
        try:
            want = EXPECTED if asked == "realtime" else "normal"
            assert graph.priority == want
            assert graph._thread is not None
            assert thread_priority(graph._thread.native_id) == want
            t.append(pa.table({"x": [1, 2, 3]}))
            graph.request_cycle()
            deadline = time.monotonic() + 10
            while t.size < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert t.size == 3
            assert seen and set(seen) == {want}  # cycles ran on that thread
        finally:
            graph.stop()
        assert graph.priority == "normal"
    assert thread_priority() == "normal"  # the caller's own thread is untouched


def test_refused_without_cap_sys_nice_and_rtprio_says_why_and_stays_normal():
    code = (
        "import logging, resource, threading\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))\n"
        "from engine.graph import UpdateGraph\n"
        "from engine.priority import thread_priority\n"
        "g = UpdateGraph(); g.start(0.01, priority='realtime')\n"
        "print(g.priority, thread_priority(g._thread.native_id)); g.stop()\n")
    proc = subprocess.run(
        ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["normal", "normal"]
    lines = [ln for ln in proc.stderr.splitlines() if "cycle thread" in ln]
    assert lines == ["INFO the cycle thread runs at normal priority: real-time needs CAP_SYS_NICE "
                     "or RLIMIT_RTPRIO >= 1 (e.g. docker run --cap-add SYS_NICE)"]
    assert "Traceback" not in proc.stderr
