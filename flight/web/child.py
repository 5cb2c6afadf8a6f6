"""The web UI's process: ``python -m flight.web.child`` (started by
:class:`~flight.web.link.WebProcess`; the link's protocol is in :mod:`flight.web.link`).

It lowers its own priority first (``SCHED_IDLE``, or nice 19), so every thread it starts
(Perspective's engine, the HTTP server's loop, the feeds) runs only when the server's
threads do not. Its view of the server is :class:`~flight.web.remote.RemoteTables`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection

from flight.web.link import Settings
from flight.web.remote import RemoteTables

__all__ = ["main"]

log = logging.getLogger("flight.web.child")  # also when run as __main__


def _lower_priority(sched: str) -> None:
    """Every thread of the process below the server's threads (threads started later
    inherit it from the thread starting them; libraries start some at import)."""
    if not sys.platform.startswith("linux"):
        return
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            if sched == "idle":
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            else:
                os.setpriority(os.PRIO_PROCESS, tid, 19)
        except OSError:  # a thread that ended meanwhile, or not allowed here
            continue


class _LinkLog(logging.Handler):
    """Log records go to the server, which logs them with its own handlers (text or JSON,
    one stream); to stderr once the link is gone."""

    def __init__(self, tables: RemoteTables) -> None:
        super().__init__()
        self._tables = tables
        self._fallback = logging.StreamHandler()
        self._fallback.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [web process] %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        if not self._tables.send(("log", record.levelno, record.name, text)):
            self._fallback.emit(record)


def main() -> None:
    """Entry point: serve the web UI until the server stops or closes the link."""
    conn = Connection(int(os.environ.pop("TICKTABLE_WEB_FD")))
    settings: Settings = conn.recv()
    _lower_priority(settings.sched)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us
    from flight.web.app import WebServer

    done = threading.Event()
    tables = RemoteTables(conn, done.set)
    logging.basicConfig(level=settings.log_level, handlers=[_LinkLog(tables)])
    web = WebServer(tables, settings)
    try:
        web.start()
    except Exception as exc:
        log.exception("web: could not start")
        conn.send(("error", "other", f"the web UI could not start: {exc}"))
        return
    tables.start()
    conn.send(("ready", web.port))
    log.info("web process %d serves the page at %s", os.getpid(), web.url)
    done.wait()
    web.close()


if __name__ == "__main__":
    main()
