"""Joins of two live tables: ``natural_join``, ``exact_join``, ``join``, ``left_outer_join``.

Modules: :mod:`.listener` (the verbs and their listeners), :mod:`._state` (the
incremental state every join keeps: row slots, key groups, the right rows per group) and
:mod:`._output` (parsing the join's columns, the output's column views, many-to-many row
keys).
"""

from engine.ops.join.listener import JoinListener as JoinListener
from engine.ops.join.listener import NaturalJoinListener as NaturalJoinListener
from engine.ops.join.listener import exact_join as exact_join
from engine.ops.join.listener import join as join
from engine.ops.join.listener import left_outer_join as left_outer_join
from engine.ops.join.listener import natural_join as natural_join

__all__ = ["JoinListener", "NaturalJoinListener", "exact_join", "join", "left_outer_join",
           "natural_join"]
