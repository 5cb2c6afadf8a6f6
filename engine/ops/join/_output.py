"""The output side of the joins in :mod:`engine.ops.join.listener`: schema, columns, row keys.

What the listeners build on, apart from the state (:mod:`engine.ops.join._state`):

* **the spec** — ``on`` and ``joins`` parsed (``"New=Old"`` pairs) and checked against both
  schemas, and the result schema: the left fields, then each ``joins`` column under its
  output name, always nullable (a left row may have no match).
* **the column views** — no join copies values. A left column of a natural join is the left
  table's column itself; every other output column is a view that maps an output row key
  to a row of the parent: a left row ``k >> R``, or through :meth:`JoinState.right_keys` a
  right row (null where there is none). Previous values read through the previous
  redirection, which :class:`JoinState` keeps readable until the cycle ends, and through
  the previous ``R``: :class:`MatchBits` only grows, and in the cycle it grows, reads of
  previous values use the old ``R``.
* **the many-to-many row keys** — output key ``(left_key << R) | j`` (the scheme is in
  :mod:`engine.ops.join.listener`). For the groups whose right list changed,
  :class:`GroupTransition` gives the positions ``j`` that went, that came, that stayed (and of
  those, the ones modified in place), and the runs of survivors that moved by one delta,
  so the listener shifts them instead of removing and adding them; :func:`group_pairs`
  pairs them with the left rows of each group, :class:`RowSetParts` collects the keys and
  ranges of one RowSet of the update.

Relied on: a group's right list is in right row-key order and shifts never reorder, so
the right rows that survive a cycle keep their relative order, and moving them by runs of
one delta is a valid shift. Group entries come back grouped by group index ``q`` in
ascending order (:meth:`JoinState.group_entries`; :func:`_entries` keeps it when it adds
the outer join's null rows), which :func:`group_pairs` needs. Slots fit in 32 bits (as the
group index of :mod:`engine.ops.join._state` also assumes), so ``(q << 33) | (slot + 1)``
is one exact code per entry, the null row (slot ``-1``) included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from engine._kernels.arrays import bitmap_of, expand, expand_with_owner, member
from engine.columns import ColumnSource
from engine.errors import SchemaError
from engine.rowset import KeyArray, RowSet

if TYPE_CHECKING:
    from engine.graph import UpdateGraph
    from engine.ops.join._state import JoinState
    from engine.table import Table


__all__ = ["GroupTransition", "MatchBits", "RowSetParts", "group_pairs", "join_columns", "join_schema",
           "parse_join_spec"]

_EMPTY = np.empty(0, dtype=np.int64)


# parsing -------------------------------------------------------------------------------------
def _pair(spec: str) -> tuple[str, str]:
    if "=" in spec:
        a, b = (s.strip() for s in spec.split("=", 1))
        return a, b
    return spec.strip(), spec.strip()


def parse_join_spec(
    left: Table, right: Table, on: str | Sequence[str], joins: Sequence[str] | None, op: str
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """The verb ``op``'s ``on`` and ``joins`` as ``(left_on, right_on, [(out_name,
    right_col)])``: ``"New=Old"`` pairs split, the default ``joins`` (every right column
    that is not a right key) filled in.

    Raises
    ------
    SchemaError
        Naming the verb, when the tables belong to different graphs, a key or joined
        column is missing, an output name repeats or clashes with a left column.
    """
    if left.graph is not right.graph:
        raise SchemaError(f"{op}: {left.name!r} and {right.name!r} belong to different update graphs")
    specs = [on] if isinstance(on, str) else list(on)
    if not specs:
        raise SchemaError(f"{op}: 'on' names no key column")
    pairs = [_pair(s) for s in specs]
    left_on, right_on = [p[0] for p in pairs], [p[1] for p in pairs]
    for names, table, side in ((left_on, left, "left"), (right_on, right, "right")):
        missing = [c for c in names if c not in table.schema.names]
        if missing:
            raise SchemaError(
                f"{op}: {side} table {table.name!r} has no key column(s) {missing} "
                f"(has: {', '.join(table.schema.names)})"
            )
    if joins is None:
        out = [(c, c) for c in right.schema.names if c not in right_on]
    else:
        out = [_pair(j) for j in ([joins] if isinstance(joins, str) else joins)]
        missing = [src for _, src in out if src not in right.schema.names]
        if missing:
            raise SchemaError(
                f"{op}: right table {right.name!r} has no column(s) {missing} "
                f"(has: {', '.join(right.schema.names)})"
            )
    names = [o for o, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SchemaError(f"{op}: joins names output column(s) {dup} more than once")
    clash = [o for o in names if o in left.schema.names]
    if clash:
        hint = ", ".join(f'"{o}_right={src}"' for o, src in out if o in clash)
        raise SchemaError(
            f"{op}: right column(s) {clash} clash with left columns of {left.name!r}; "
            f"rename them with joins=[{hint}] (\"New=Old\")"
        )
    return left_on, right_on, out


def join_schema(left: Table, right: Table, out: list[tuple[str, str]]) -> pa.Schema:
    """The left fields, then each joined right column under its output name, nullable."""
    fields = list(left.schema)
    fields += [right.schema.field(src).with_name(name).with_nullable(True) for name, src in out]
    return pa.schema(fields)


# column views -----------------------------------------------------------------------------------
class MatchBits:
    """``R``, the bits of a many-to-many output key holding the match position.

    It only grows; in the cycle it grows, reads of previous values use the old ``R``.
    """

    def __init__(self, graph: UpdateGraph, bits: int) -> None:
        self.graph, self.now, self._old, self._step = graph, bits, bits, -1

    def prev(self) -> int:
        g = self.graph
        return self._old if self._step == g.step and g.phase == "updating" else self.now

    def grow(self, bits: int) -> None:
        self._old, self._step, self.now = self.now, self.graph.step, bits


class _LeftView(ColumnSource):
    """A left column of a many-to-many join: output key ``k`` reads left row ``k >> R``."""

    def __init__(self, source: ColumnSource, bits: MatchBits) -> None:
        self.source, self.bits, self.type = source, bits, source.type

    def get(self, keys: KeyArray) -> pa.Array:
        return self.source.get(np.asarray(keys, dtype=np.int64) >> self.bits.now)

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self.source.get_prev(np.asarray(keys, dtype=np.int64) >> self.bits.prev())


class _RightView(ColumnSource):
    """A right column seen through the join: output row key -> right row key -> value."""

    def __init__(self, state: JoinState, source: ColumnSource, bits: MatchBits | None) -> None:
        self.state, self.source, self.bits = state, source, bits
        self.type = source.type

    def _read(self, keys: KeyArray, prev: bool) -> pa.Array:
        keys = np.asarray(keys, dtype=np.int64)
        bits = 0 if self.bits is None else self.bits.prev() if prev else self.bits.now
        rk, ok = self.state.right_keys(keys, bits, prev)
        get = self.source.get_prev if prev else self.source.get
        if ok.all():
            return get(rk)
        values = get(rk[ok])
        idx = np.cumsum(ok) - 1
        return values.take(pa.array(np.maximum(idx, 0), mask=~ok))

    def get(self, keys: KeyArray) -> pa.Array:
        return self._read(keys, False)

    def get_prev(self, keys: KeyArray) -> pa.Array:
        return self._read(keys, True)


def join_columns(state: JoinState, left: Table, right: Table, out: list[tuple[str, str]],
             bits: MatchBits | None) -> dict[str, ColumnSource]:
    """The output's columns, views that copy nothing: without ``bits`` (natural and exact
    joins, output key = left key) the left columns themselves, with ``bits`` views reading
    left row ``k >> R``; every joined column reads its right row through ``state``."""
    if bits is not None:
        cols: dict[str, ColumnSource] = {n: _LeftView(left.column(n), bits) for n in left.column_names}
    else:
        cols = dict(left.columns)
    for name, src in out:
        cols[name] = _RightView(state, right.column(src), bits)
    return cols


# many-to-many ------------------------------------------------------------------------------------
class GroupTransition:
    """How the right lists of the groups ``gids`` moved this cycle, as positions ``i`` in
    the lists per group index ``q`` (the outer join's null row included when ``outer``).

    ``rem_q, rem_i``: entries that went (previous positions); ``add_q, add_i``: that came
    (current positions); ``surv_q, surv_i``: that stayed (current positions), and of those
    ``vm_q, vm_i`` the ones whose right slot is in ``rvm`` (right rows modified in place); ``run_q, run_a,
    run_b, run_d``: the survivors as runs of one delta ``d`` over previous positions
    ``[a, b]`` in one group, in previous order, which the listener shifts.
    """

    def __init__(self, st: JoinState, gids: KeyArray, rvm: KeyArray, outer: bool) -> None:
        s_o, q_o, i_o = _entries(st, gids, True, outer)
        s_n, q_n, i_n = _entries(st, gids, False, outer)
        code_o = (q_o << 33) | (s_o + 1)
        code_n = (q_n << 33) | (s_n + 1)
        order = np.argsort(code_n, kind="stable")
        cs = code_n[order]
        if cs.size:
            p = np.minimum(np.searchsorted(cs, code_o), cs.size - 1)
            hit = cs[p] == code_o
        else:
            p = np.zeros(code_o.size, dtype=np.int64)
            hit = np.zeros(code_o.size, dtype=bool)
        matched = np.zeros(code_n.size, dtype=bool)
        matched[order[p[hit]]] = True
        self.rem_q, self.rem_i = q_o[~hit], i_o[~hit]
        self.add_q, self.add_i = q_n[~matched], i_n[~matched]
        self.surv_q, self.surv_i = q_n[matched], i_n[matched]
        # survivors in old order: runs of one delta inside one group
        sq, si = q_o[hit], i_o[hit]
        dl = i_n[order[p[hit]]] - si
        if sq.size:
            brk = np.flatnonzero((np.diff(sq) != 0) | (np.diff(dl) != 0))
            first = np.concatenate(([0], brk + 1))
            last = np.concatenate((brk, [sq.size - 1]))
            self.run_q, self.run_a, self.run_b, self.run_d = sq[first], si[first], si[last], dl[first]
        else:
            self.run_q = self.run_a = self.run_b = self.run_d = _EMPTY
        vm = matched & member(rvm, s_n)
        self.vm_q, self.vm_i = q_n[vm], i_n[vm]


def _entries(st: JoinState, gids: KeyArray, prev: bool, outer: bool) -> tuple[KeyArray, KeyArray, KeyArray]:
    """Group members ``(slot, q, position)``; the outer join's null row is slot ``-1``."""
    s, q, i = st.group_entries(gids, prev)
    if outer:
        empty = np.flatnonzero(st.counts(gids, prev) == 0).astype(np.int64)
        if empty.size:
            s = np.concatenate((s, np.full(empty.size, -1, dtype=np.int64)))
            q = np.concatenate((q, empty))
            i = np.concatenate((i, np.zeros(empty.size, dtype=np.int64)))
            order = np.argsort(q, kind="stable")
            s, q, i = s[order], q[order], i[order]
    return s, q, i


def group_pairs(row_q: KeyArray, ent_q: KeyArray, ngroups: int) -> tuple[KeyArray, KeyArray]:
    """Every (row, entry) pair where the entry belongs to the row's group.

    ``row_q`` is each row's group index, ``ent_q`` each entry's, sorted ascending, both
    below ``ngroups``. Returns the row index and the entry index of every pair, by row.
    """
    off = np.searchsorted(ent_q, np.arange(ngroups + 1, dtype=np.int64))
    pos, r = expand_with_owner(off[row_q], off[row_q + 1] - off[row_q])
    return r, pos


class RowSetParts:
    """Keys and half-open ranges collected for one RowSet of the update (:meth:`rowset`)."""

    def __init__(self) -> None:
        self.keys: list[KeyArray] = []
        self.starts: list[KeyArray] = []
        self.stops: list[KeyArray] = []

    def rowset(self) -> RowSet:
        keys = list(self.keys)
        ranges = None
        if self.starts:
            s, e = np.concatenate(self.starts), np.concatenate(self.stops)
            keep = e > s
            s, e = s[keep], e[keep]
            n = e - s
            if int(n.sum()) <= 2 * n.size:  # mostly one-row blocks: keys build cheaper than runs
                keys.append(expand(s, n))
            else:
                order = np.argsort(s)
                ranges = RowSet.from_ranges(s[order], e[order])
        out = RowSet(bitmap_of(np.concatenate(keys))) if keys else RowSet()
        return out if ranges is None else out | ranges
