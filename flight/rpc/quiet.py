"""Calls the calls log (:mod:`flight.rpc.call_log`) writes at DEBUG rather than INFO.

A handler marks its call with :func:`quiet` (a Flight SQL query's parameters bound through
DoPut: part of a query, not a writer joining); the log reads the mark with :func:`is_quiet`
and drops it with :func:`forget` when the call ends. Kept apart from the log, which the
server builds, so that a handler needs nothing of it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["forget", "is_quiet", "quiet"]

_quiet: set[int] = set()  # id() of the contexts of the calls marked, until each ends


def quiet(context: Any) -> None:
    """Log the call of ``context`` at DEBUG, not INFO."""
    _quiet.add(id(context))


def is_quiet(context: Any) -> bool:
    """Whether :func:`quiet` marked the call of ``context``."""
    return id(context) in _quiet


def forget(context: Any) -> None:
    """The call of ``context`` ended: its mark goes."""
    _quiet.discard(id(context))
