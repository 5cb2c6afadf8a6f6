"""The cycle thread's scheduling priority: real-time when the process may take it.

A cycle is short (a thousand-row upsert into a million-row keyed table takes less than a
scheduler slice) and every subscriber waits for it. On a machine it shares with other busy
processes (a browser showing the web UI, a Spark executor), a normal thread that wakes for
its cycle can wait a whole scheduler slice behind one of them, and lose the core to
another in the middle of the cycle: with the web UI open in Chromium on the same cores,
that wait shows in the cycle's p99 (``bench/bench_web.py --cycle-priority normal``;
figures in bench/README.md).

``realtime`` puts the calling thread under ``SCHED_FIFO`` at priority 1, the lowest
real-time one: it runs as soon as it wakes and keeps its core until it sleeps again, ahead
of every normal thread and process. Two things keep that safe: the kernel leaves 5% of
every second to normal threads (``/proc/sys/kernel/sched_rt_runtime_us``), and
``SCHED_RESET_ON_FORK`` makes every thread or process the cycle thread starts a normal one.
Python's lock still takes turns between threads, so the cycle thread lends the interpreter
to the server's other threads as before.

Taking it needs ``CAP_SYS_NICE`` (root has it) or an ``RLIMIT_RTPRIO`` of at least 1
(``ulimit -r``, ``docker run --cap-add SYS_NICE``, systemd's ``LimitRTPRIO=1``); without
either, the thread stays normal and says why once in the log. ``normal`` leaves the thread
as it is.
"""

from __future__ import annotations

import logging
import os

from engine.errors import InputError

__all__ = ["PRIORITIES", "check_priority", "set_thread_priority", "thread_priority"]

log = logging.getLogger(__name__)

#: The priorities a cycle thread can ask for.
PRIORITIES = ("realtime", "normal")

_RT_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the rest


def check_priority(priority: object) -> str:
    """``priority`` if it is one of :data:`PRIORITIES`, else an :class:`InputError`."""
    if priority not in PRIORITIES:
        raise InputError(f"cycle priority is {priority!r}: expected one of {', '.join(PRIORITIES)}")
    return str(priority)


def set_thread_priority(priority: str) -> str:
    """Put the calling thread at ``priority`` (one of :data:`PRIORITIES`) if it may.

    Returns the priority the thread runs at afterwards: ``"realtime"`` only when the
    kernel granted it (otherwise the reason is logged once, at INFO, and the thread
    stays ``"normal"``).

    Raises
    ------
    InputError
        If ``priority`` is not one of :data:`PRIORITIES`.
    """
    if check_priority(priority) == "normal":
        return thread_priority()
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:  # not Linux
        log.info("the cycle thread runs at normal priority: this platform has no SCHED_FIFO")
        return "normal"
    try:
        setter(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(_RT_PRIORITY))
    except PermissionError:
        log.info("the cycle thread runs at normal priority: real-time needs CAP_SYS_NICE or "
                 "RLIMIT_RTPRIO >= 1 (e.g. docker run --cap-add SYS_NICE)")
        return "normal"
    except OSError as exc:  # a kernel without real-time scheduling, a container that hides it
        log.info("the cycle thread runs at normal priority: SCHED_FIFO refused (%s)",
                 exc.strerror or exc)
        return "normal"
    return "realtime"


def thread_priority(native_id: int = 0) -> str:
    """``"realtime"`` if the thread ``native_id`` (0: the calling one) runs under a
    real-time policy, else ``"normal"``."""
    getter = getattr(os, "sched_getscheduler", None)
    if getter is None:
        return "normal"
    policy = getter(native_id) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    return "realtime" if policy in (os.SCHED_FIFO, os.SCHED_RR) else "normal"
