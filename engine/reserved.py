"""The column names the engine gives a meaning to, so no table may use them.

Dependency-free, like :mod:`engine.errors`: :mod:`flight.wire` re-exports these names as
part of the wire vocabulary (the engine never imports ``flight``), so a client learns
them without importing the engine's internals.

=========  ===============================================================================
name       meaning
=========  ===============================================================================
``DIFF``   a triple's weight, ``int64`` (:class:`engine.differential.zset.ZSet` in Arrow)
``TIME``   a triple's time: ``int64``, or ``fixed_size_list<int64>[d]`` for ``d``
           coordinates
``DELETE`` an upsert event's marker, ``bool``: true deletes the key
           (:class:`engine.differential.upsert.Upsert`)
=========  ===============================================================================
"""

from __future__ import annotations

__all__ = ["DELETE", "DIFF", "TIME"]

DIFF = "__diff"
TIME = "__time"
DELETE = "__delete"
