"""Joins of two live tables: ``natural_join``, ``exact_join``, ``join``, ``left_outer_join``.

Semantics shared by all four:

* ``on`` names key columns present in both tables (``"Sym"`` or ``["Sym", "Venue"]``), or
  pairs with different names, ``"LeftCol=RightCol"``. Key types must agree: integers of
  any width match each other, floats match floats, strings match strings.
* ``joins`` names the right columns to add, by default every right column that is not a
  right key column; ``"New=Old"`` adds right column ``Old`` under the name ``New``. A name
  that clashes with a left column is a :class:`SchemaError`.
* **Null keys never match** (SQL semantics): a row with a null in any key column has no
  match, on either side. (pandas ``merge`` matches NaN/None keys with each other; we do
  not.) Float keys match by value with ``-0.0 == 0.0`` and NaN equal to NaN.
* Keys are compared exactly: a hash finds the candidate group of a key, equality of the
  real key values decides (:class:`engine._kernels.keymap.StoredKeyMap`), so two
  different keys never match each other, even when their 64-bit hashes are equal.

``natural_join`` / ``exact_join`` keep exactly the left table's rows, with the left row
keys (left shifts pass straight through). Right columns are read through a per-left-row
redirection (left row -> group of its key -> the one right row), so right shifts only
remap right rows. Row changes:

* a left row whose key changes, or whose key's right row is added, removed, re-keyed or
  replaced, is *modified* in all joined columns;
* a right row modified in some ``joins`` columns (key unchanged) modifies exactly the left
  rows pointing at it, with ``modified_columns`` those columns only;
* left modifies pass through with their ``modified_columns``.

More than one right row with the same (non-null) key fails the natural join's table
(:class:`InvalidKeyError` naming the key; use ``join`` for many matches); a left row
without a match fails an ``exact_join``. At construction the same conditions raise.

``join`` (inner, many-to-many) and ``left_outer_join`` give one row per (left row,
matching right row), ordered by left row, then by right row within a left row; the outer
join gives a left row without matches one row with null right columns.
**Row-key scheme**: output row key ``(left_key << R) | j`` where ``j`` is the position of
the match among that left row's matches (right-table order): each left row owns a block
of ``2**R`` keys, so left order then right order is key order, and left shifts move whole
blocks. When a left row gains or loses matches, its later matches *shift* inside its
block and no other row is touched. A left row whose key changes removes its old rows and
adds its new ones.

``R`` follows the data: it starts at the bits the largest match count needs, plus one
(at least 1), and when a left row outgrows its block it grows the same way, re-keying
every row with one shift in that cycle (O(rows), and each growth at least doubles the
room). Small ``R`` matters: RowSets are Roaring bitmaps with one container per 2**16
keys, so ``R = 16`` would put every left row in its own container and make each RowSet
operation on a 1M-row result a thousand times dearer. ``match_bits=`` fixes ``R``
instead; more than ``2**R`` matches then fail the table. Left row keys must stay below
``2**(63 - R)``.

This module keeps the verbs and their two listeners: how each cycle's parent updates
become the child's update, and the checks that fail a table (duplicate right keys, missing
matches, too many matches). The state (slots, groups, indexes) lives in
:mod:`engine.ops.join._state`; the output side (``on``/``joins`` parsing and the schema, the
column views, the many-to-many row-key arithmetic) in :mod:`engine.ops.join._output`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine._kernels.arrays import bitmap_of, member, row_for_message, sorted_unique
from engine.errors import InvalidKeyError, SchemaError
from engine.ops.join._output import (
    GroupTransition,
    MatchBits,
    RowSetParts,
    group_pairs,
    join_columns,
    join_schema,
    parse_join_spec,
)
from engine.ops.join._state import JoinState
from engine.rowset import KeyArray, RowSet, RowSetShiftData
from engine.table import Derivation, Table, derive
from engine.update import TableUpdate, compose

if TYPE_CHECKING:
    from engine.ops.join._state import Delta

__all__ = [
    "JoinListener",
    "NaturalJoinListener",
    "exact_join",
    "join",
    "left_outer_join",
    "natural_join",
]

_EMPTY = np.empty(0, dtype=np.int64)


def _key_text(table: Table, cols: list[str], key: int, prev: bool = False) -> str:
    row = row_for_message(table.rows(np.array([key], dtype=np.int64), cols, prev=prev), 0)
    return ", ".join(f"{c}={v!r}" for c, v in row.items())


# natural / exact ---------------------------------------------------------------------------------
class NaturalJoinListener:
    """Keeps a natural (or exact) join equal to its recomputation, one cycle at a time."""

    result: Table

    def __init__(self, state: JoinState, out: list[tuple[str, str]], exact: bool, name: str) -> None:
        self.state = state
        self.exact = exact
        self.name = name
        self.right_out = frozenset(o for o, _ in out)
        self.out_of: dict[str, set[str]] = {}
        for o, src in out:
            self.out_of.setdefault(src, set()).add(o)

    def check(self, gids: KeyArray) -> None:
        """Raise if a group has two right rows (or, exact, a left row has none)."""
        st = self.state
        if gids.size == 0:
            return
        cnt = st.counts(gids)
        dup = gids[cnt > 1]
        if dup.size:
            s, _, _ = st.group_entries(dup[:1])
            keys = st.r_rkey.get_numpy(s)[0]
            raise InvalidKeyError(
                f"{self.name}: right table {st.right.name!r} has {keys.size} rows with key "
                f"({_key_text(st.right, st.right_on, int(keys[0]))}) at row keys "
                f"{sorted(keys.tolist())[:10]}; a natural join allows one right row per key "
                f"(use join() for many matches)"
            )
        if self.exact:
            miss = gids[(cnt == 0) & (st.g_left[gids] > 0)]
            if miss.size:
                slots = st.left_members(miss[:1])
                self._missing(int(st.l_key[slots[0]]))

    def _missing(self, left_key: int) -> None:
        st = self.state
        raise InvalidKeyError(
            f"{self.name}: left row {left_key} ({_key_text(st.left, st.left_on, left_key)}) of "
            f"{st.left.name!r} has no match in {st.right.name!r}; exact_join needs exactly one "
            f"(use natural_join to get nulls instead; null keys never match)"
        )

    def _check_matched(self, keys: KeyArray, matches: KeyArray) -> None:
        if self.exact and (matches < 0).any():
            self._missing(int(keys[np.flatnonzero(matches < 0)[0]]))

    def on_update(self, lu: TableUpdate | None, ru: TableUpdate | None) -> TableUpdate | None:
        st = self.state
        d = st.apply(lu, ru)
        self.check(d.changed)
        mods: list[KeyArray] = []
        cols: set[str] = set()
        if d.added_slots.size:  # current key space from here on
            self._check_matched(d.added_keys, st.first_match(st.l_gid_now[d.added_slots]))
        if d.regroup_slots.size:
            m0 = st.first_match(d.regroup_old, prev=True)
            m1 = st.first_match(d.regroup_new)
            self._check_matched(d.regroup_keys, m1)
            hit = m0 != m1
            if hit.any():
                mods.append(d.regroup_keys[hit])
                cols |= self.right_out
            # the same right row before and after: it moved groups along with the left row
            # (a swap of keys on both sides), and this cycle may have changed its values too
            vm = ru.modified_columns & st.joins_src if ru is not None and ru.modified else ()
            same = np.flatnonzero(~hit & (m1 >= 0)) if vm else _EMPTY
            if same.size:
                rk = st.r_rkey.get_numpy(m1[same])[0]
                same = same[ru.modified.contains_all(rk)]  # type: ignore[union-attr]
                if same.size:
                    mods.append(d.regroup_keys[same])
                    for c in vm:
                        cols |= self.out_of.get(c, set())
        if d.changed.size:
            m0 = st.first_match(d.changed, prev=True)
            m1 = st.first_match(d.changed)
            moved = d.changed[m0 != m1]
            if moved.size:
                slots = st.stable_members(moved, d.new_gids)
                if slots.size:
                    mods.append(st.l_key[slots])
                    cols |= self.right_out
        if d.rvm_slots.size:
            slots = st.left_members(sorted_unique(st.r_gid[d.rvm_slots]))
            slots = slots[~st.fresh(slots)]
            if slots.size:
                mods.append(st.l_key[slots])
                for c in d.rvm_cols:
                    cols |= self.out_of.get(c, set())
        span = st.left.rowset.last() + 1 if st.left.rowset else 0
        modified = RowSet(bitmap_of(np.concatenate(mods), span)) if mods else RowSet()
        if lu is not None and lu.modified:
            modified = modified | lu.modified
            cols |= lu.modified_columns
        if lu is None:
            return TableUpdate.of(modified=modified, modified_columns=cols)
        return TableUpdate.of(lu.added, lu.removed, modified, lu.shifted, cols)


def _natural(left: Table, right: Table, on: str | Sequence[str], joins: Sequence[str] | None,
             exact: bool) -> Table:
    op = "exact_join" if exact else "natural_join"
    left_on, right_on, out = parse_join_spec(left, right, on, joins, op)

    def plan() -> Derivation:
        state = JoinState(left, right, left_on, right_on, [src for _, src in out])
        state.build()
        name = f"{left.name}.{op}({right.name})"
        listener = NaturalJoinListener(state, out, exact, name)
        listener.check(np.arange(state.gid_alloc.end, dtype=np.int64))
        if exact and left.rowset:
            lk = left.rowset.keys()
            listener._check_matched(lk, state.first_match(state.l_gid_now[state.lmap.lookup(lk)]))
        return Derivation(join_schema(left, right, out), join_columns(state, left, right, out, None),
                          left.rowset, listener, name=name)

    return derive([left, right], plan)


def natural_join(left: Table, right: Table, on: str | Sequence[str],
                 joins: Sequence[str] | None = None) -> Table:
    """Each left row plus the ``joins`` columns of the right row with equal ``on`` keys.

    The result has exactly the left table's rows, in its order and with its row keys; right
    columns are null where no right row matches. Live: see the module docstring for which
    rows a change modifies.

    Parameters
    ----------
    left, right
        Tables of the same update graph.
    on
        Key column(s) present in both, or ``"LeftCol=RightCol"`` pairs.
    joins
        Right columns to add (``"New=Old"`` renames); default: all right non-key columns.

    Returns
    -------
    Table
        Left columns followed by the ``joins`` columns.

    Raises
    ------
    SchemaError
        If a key column is missing, key types differ, or an added column clashes with a
        left column.
    InvalidKeyError
        If the right table holds two rows with one key (later: the table fails).

    Examples
    --------
    >>> px = g.keyed_table({"Sym": pa.string(), "Px": pa.float64()}, "Sym")
    >>> trades.natural_join(px, "Sym").column_names
    ['Sym', 'Qty', 'Px']
    """
    return _natural(left, right, on, joins, exact=False)


def exact_join(left: Table, right: Table, on: str | Sequence[str],
               joins: Sequence[str] | None = None) -> Table:
    """Like :func:`natural_join`, but every left row must match exactly one right row.

    A left row without a match (a null key never matches) raises at construction and
    fails the table in a later cycle.

    Raises
    ------
    SchemaError
        As :func:`natural_join`.
    InvalidKeyError
        If a left row has no match, or a right key appears twice.
    """
    return _natural(left, right, on, joins, exact=True)


# many-to-many ------------------------------------------------------------------------------------
class JoinListener:
    """Keeps ``join`` / ``left_outer_join`` equal to recomputation (row keys: module docstring)."""

    result: Table

    def __init__(self, state: JoinState, out: list[tuple[str, str]], bits: MatchBits,
                 fixed: bool, outer: bool, name: str) -> None:
        self.state, self.match_bits, self.fixed = state, bits, fixed
        self.outer, self.name = outer, name
        self.out_of: dict[str, set[str]] = {}
        for o, src in out:
            self.out_of.setdefault(src, set()).add(o)

    @property
    def bits(self) -> int:
        return self.match_bits.now

    def n_rows(self, gids: KeyArray, prev: bool = False) -> KeyArray:
        """Output rows per left row in group ``gids``."""
        n = self.state.counts(gids, prev)
        return np.maximum(n, 1) if self.outer else n

    def needed_bits(self, gids: KeyArray) -> int:
        """Bits to hold the matches of the groups ``gids`` that have left rows.

        Raises
        ------
        InvalidKeyError
            When they exceed a fixed ``match_bits``, or left row keys leave no room.
        """
        st = self.state
        gids = gids[gids >= 0]
        cnt = st.counts(gids)
        big = cnt > (1 << self.bits)
        big &= st.g_left[gids] > 0
        need = self.bits
        if big.any():
            top = int(cnt[big].max())
            if self.fixed:
                s, _, _ = st.group_entries(gids[big][:1])
                k = int(st.r_rkey.get_numpy(s[:1])[0][0])
                raise InvalidKeyError(
                    f"{self.name}: key ({_key_text(st.right, st.right_on, k)}) has {s.size} "
                    f"right rows, more than the {1 << self.bits} matches per left row that "
                    f"match_bits={self.bits} allows; pass more bits, or match_bits=None"
                )
            need = (top - 1).bit_length() + 1  # grow with room to spare (amortized)
        self._check_left_keys(need)
        return need

    def _check_left_keys(self, bits: int) -> None:
        """Raise InvalidKeyError when a left row key leaves no room for ``bits`` match bits."""
        left = self.state.left.rowset
        if left and left.last() >= 1 << (63 - bits):
            raise InvalidKeyError(
                f"{self.name}: left row key {left.last()} is too large for "
                f"{bits} match bits (left keys must be below 2**{63 - bits})"
            )

    def _unmatched(self, d: Delta, lu: TableUpdate | None) -> bool:
        """Whether the cycle cannot change an inner join's rows: no right group changed,
        no left row moved (shift) or changed group, and every left row added, removed or
        modified has no group before or after (so no output row). A left key that meets
        no right key (most of q5's re-keyed counts) then costs its lookup only."""
        if self.outer or d.changed.size or d.rvm_slots.size or d.regroup_slots.size:
            return False
        if lu is not None and lu.shifted:
            return False
        g = self.state.l_gid_now
        return not ((d.removed_gid >= 0).any() or (g[d.added_slots] >= 0).any()
                    or (g[d.modified_slots] >= 0).any())

    def _rekey(self, bits: int) -> TableUpdate:
        """The shift moving every row from ``R = self.bits`` to ``bits`` match bits (O(rows))."""
        k = self.result.rowset.keys()  # the previous rows: not committed yet this cycle
        moved = ((k >> self.bits) << bits) | (k & ((1 << self.bits) - 1))
        self.match_bits.grow(bits)
        return TableUpdate.of(shifted=RowSetShiftData.from_moves(k, moved))

    def on_update(self, lu: TableUpdate | None, ru: TableUpdate | None) -> TableUpdate | None:
        st = self.state
        d = st.apply(lu, ru)
        if self._unmatched(d, lu):
            self._check_left_keys(self.bits)  # as needed_bits does every cycle
            return None  # silent: no output row is added, removed, modified or moved
        need = self.needed_bits(np.concatenate((d.changed, st.l_gid_now[d.added_slots], d.regroup_new)))
        rekey = self._rekey(need) if need > self.bits else None
        up = self._update(d, lu)
        if rekey is None:
            return up
        return compose(rekey, up, self.result.rowset)

    def _update(self, d: Delta, lu: TableUpdate | None) -> TableUpdate:
        """The update in the key space of the current ``R`` (previous keys re-keyed too)."""
        st, R = self.state, self.bits
        lshift = lu.shifted if lu is not None else RowSetShiftData.empty()
        lmod = lu.modified if lu is not None else RowSet()
        removed, added, modified = RowSetParts(), RowSetParts(), RowSetParts()
        cols: set[str] = set()
        vm_cols: set[str] = set()
        for c in d.rvm_cols:
            vm_cols |= self.out_of.get(c, set())

        def block(parts: RowSetParts, lkeys: KeyArray, n: KeyArray) -> None:
            parts.starts.append(lkeys << R)
            parts.stops.append((lkeys << R) + n)

        # left rows removed (previous space), added, or moved to another group
        if d.removed_keys.size:
            block(removed, d.removed_keys, self.n_rows(d.removed_gid, prev=True))
        if d.added_keys.size:
            block(added, d.added_keys, self.n_rows(st.l_gid_now[d.added_slots]))
        if d.regroup_slots.size:
            block(removed, lshift.unapply_keys(d.regroup_keys), self.n_rows(d.regroup_old, prev=True))
            block(added, d.regroup_keys, self.n_rows(d.regroup_new))
        # stable left rows of groups whose right list changed
        punch, runs = _EMPTY, (_EMPTY, _EMPTY, _EMPTY)
        G = d.changed
        if G.size:
            slots = st.stable_members(G, d.new_gids)
            if slots.size:
                tr = GroupTransition(st, G, d.rvm_slots, self.outer)
                q = st.group_index(G, st.l_gid_now[slots])
                lc = st.l_key[slots]
                lp = lshift.unapply_keys(lc)
                r, e = group_pairs(q, tr.rem_q, G.size)
                removed.keys.append((lp[r] << R) | tr.rem_i[e])
                r, e = group_pairs(q, tr.add_q, G.size)
                added.keys.append((lc[r] << R) | tr.add_i[e])
                r, e = group_pairs(q, tr.run_q, G.size)
                base = lp[r] << R
                runs = (base | tr.run_a[e], base | tr.run_b[e],
                        ((lc[r] - lp[r]) << R) + tr.run_d[e])
                punch = lp
                r, e = group_pairs(q, tr.vm_q, G.size)
                if r.size:
                    modified.keys.append((lc[r] << R) | tr.vm_i[e])
                    cols |= vm_cols
                if lmod:
                    lm = st.left_modified(slots)
                    if lm.any():
                        r, e = group_pairs(q[lm], tr.surv_q, G.size)
                        if r.size:
                            modified.keys.append((lc[lm][r] << R) | tr.surv_i[e])
                            cols |= lu.modified_columns if lu is not None else set()
        # stable left rows of unchanged groups: left modifies and right in-place modifies
        if lmod:
            mk, ms = d.modified_keys, d.modified_slots
            g = st.l_gid_now[ms]
            keep = ~st.fresh(ms) & ~member(G, g)
            if keep.any():
                n = self.n_rows(g[keep])
                if n.any():
                    block(modified, mk[keep], n)
                    cols |= lu.modified_columns if lu is not None else set()
        if d.rvm_slots.size:
            g = st.r_gid[d.rvm_slots]
            gv = sorted_unique(g[~member(G, g)])
            gv = gv[st.g_left[gv] > 0]
            if gv.size:
                s_e, q_e, i_e = st.group_entries(gv)
                vm = member(d.rvm_slots, s_e)
                slots = st.left_members(gv)
                slots = slots[~st.fresh(slots)]
                r, e = group_pairs(st.group_index(gv, st.l_gid_now[slots]), q_e[vm], gv.size)
                if r.size:
                    modified.keys.append((st.l_key[slots][r] << R) | i_e[vm][e])
                    cols |= vm_cols
        shifted = self._shifts(lshift, punch, runs)
        mod = modified.rowset()
        return TableUpdate.of(added.rowset(), removed.rowset(), mod, shifted, cols if mod else ())

    def _shifts(self, lshift: RowSetShiftData, punch: KeyArray,
                runs: tuple[KeyArray, KeyArray, KeyArray]) -> RowSetShiftData:
        """Left shifts as whole blocks, minus the blocks of ``punch`` rows, plus ``runs``."""
        R = self.bits
        bs, es, ds = [runs[0]], [runs[1]], [runs[2]]
        if lshift:
            b, e, dd = lshift.begins, lshift.ends, lshift.deltas
            prev = self.state.left.prev_rowset
            if prev:
                e = np.minimum(e, prev.last())
            ok = b <= e
            b, e, dd = b[ok], e[ok], dd[ok]
            p = sorted_unique(punch)
            idx = np.searchsorted(b, p, side="right") - 1
            inside = (idx >= 0) & (p <= e[np.maximum(idx, 0)])
            p = p[inside]
            seg_s = np.sort(np.concatenate((b, p + 1)))
            seg_e = np.sort(np.concatenate((p - 1, e)))
            ok = seg_s <= seg_e
            seg_s, seg_e = seg_s[ok], seg_e[ok]
            seg_d = dd[np.searchsorted(b, seg_s, side="right") - 1]
            bs.append(seg_s << R)
            es.append((seg_e << R) | ((1 << R) - 1))
            ds.append(seg_d << R)
        b, e, dd = np.concatenate(bs), np.concatenate(es), np.concatenate(ds)
        if b.size == 0:
            return RowSetShiftData.empty()
        order = np.argsort(b)
        return RowSetShiftData.from_arrays(b[order], e[order], dd[order])


def _many(left: Table, right: Table, on: str | Sequence[str], joins: Sequence[str] | None,
          outer: bool, match_bits: int | None) -> Table:
    op = "left_outer_join" if outer else "join"
    if match_bits is not None and not 0 < match_bits < 48:
        raise SchemaError(f"{op}: match_bits must be between 1 and 47, got {match_bits}")
    left_on, right_on, out = parse_join_spec(left, right, on, joins, op)

    def plan() -> Derivation:
        state = JoinState(left, right, left_on, right_on, [src for _, src in out])
        state.build()
        name = f"{left.name}.{op}({right.name})"
        bits = MatchBits(left.graph, match_bits or 1)
        listener = JoinListener(state, out, bits, match_bits is not None, outer, name)
        bits.now = listener.needed_bits(np.arange(state.gid_alloc.end, dtype=np.int64))
        lk = left.rowset.keys()
        n = listener.n_rows(state.l_gid_now[state.lmap.lookup(lk)])
        keep = n > 0
        starts = lk[keep] << bits.now
        rowset = RowSet.from_ranges(starts, starts + n[keep])
        # Over parents that never remove or modify a row, an inner join never does either:
        # a left row brings its matches as a new block, a right row a new match in the
        # blocks of its key's left rows (later matches shift up inside them), and a left
        # row outgrowing its block re-keys by a shift. The outer join is not: a left row's
        # null row is removed when its first match arrives.
        insert_only = not outer and left.insert_only and right.insert_only
        return Derivation(join_schema(left, right, out), join_columns(state, left, right, out, bits),
                          rowset, listener, name=name, insert_only=insert_only)

    return derive([left, right], plan)


def join(left: Table, right: Table, on: str | Sequence[str], joins: Sequence[str] | None = None,
         *, match_bits: int | None = None) -> Table:
    """Many-to-many inner join: one row per (left row, matching right row).

    Rows come in left order, then right order within a left row; left rows without a
    match (null keys included) are dropped. Row keys are ``left_key << R | j`` (module
    docstring).

    Over two :attr:`~engine.table.Table.insert_only` parents (append-only tables, say) the
    result is insert-only too: it never removes or modifies a row.

    Parameters
    ----------
    left, right, on, joins
        As :func:`natural_join`.
    match_bits
        ``R``, fixed: at most ``2**match_bits`` matches per left row, more fail the table.
        By default ``R`` follows the data: it starts at what the largest match count needs
        (plus one bit) and grows when a left row outgrows it.

    Raises
    ------
    SchemaError
        As :func:`natural_join`, or ``match_bits`` out of range.
    InvalidKeyError
        If a left row has too many matches or a left row key is too large for the scheme.

    Examples
    --------
    >>> orders.join(fills, "OrderId", joins=["FillQty=Qty"]).size
    3
    """
    return _many(left, right, on, joins, outer=False, match_bits=match_bits)


def left_outer_join(left: Table, right: Table, on: str | Sequence[str],
                    joins: Sequence[str] | None = None, *, match_bits: int | None = None) -> Table:
    """Like :func:`join`, but a left row without matches keeps one row of null right columns.

    Raises
    ------
    SchemaError, InvalidKeyError
        As :func:`join`.
    """
    return _many(left, right, on, joins, outer=True, match_bits=match_bits)
