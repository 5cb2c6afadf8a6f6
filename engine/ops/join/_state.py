"""The incremental state behind every join in :mod:`engine.ops.join`.

One :class:`JoinState` keeps, for a ``(left, right)`` pair and its ``on`` columns:

* **slots** — a dense internal id per left row and per right row, stable for the row's
  life. Shifts move row keys, not slots, so the indexes below never see a shift: a
  shift only rewrites the row-key <-> slot maps of the rows it moves. Slots come from an
  :class:`~engine._kernels.ids.IdAllocator` (freed slots reused from the next cycle on),
  row key -> slot is a :class:`~engine._kernels.rowkeymap.RowKeyMap`.
* **groups** — one *group id* (gid) per distinct key of a right row (kept while left rows
  still point at it), in a :class:`~engine._kernels.keymap.StoredKeyMap` (key -> gid: a
  hash finds the candidate group, equality with the group's stored key values decides).
  A left row only *looks up* its key: one without a group (no right row has its key)
  waits in the **pending index** under its key's hash, and a right row that brings a new
  key attaches the left rows waiting under that hash (re-looked up, so a hash collision
  attaches nothing). So left keys that never meet a right row cost a hash and a lookup,
  not a stored key and a gid. Invariant: a live left row with a non-null key has a gid
  exactly when the map holds its key. A right group is a region of the append-only ``pool``
  holding its right slots in right row-key order (the right table's order; shifts never
  reorder, so the order survives them). A changed group is rewritten copy-on-write at
  the end of the pool, so the region of the previous cycle stays readable for
  ``get_prev``; the pool is compacted at the start of a later cycle.
* **the left group index** — gid -> left slots, for "which left rows does this right
  change touch": sorted ``gid << 32 | slot`` codes in a large base plus a small sorted
  delta, deletions lazy (an entry is live when its slot is live and still in that gid);
  merged and rebuilt with amortized cost. The pending index is the same structure keyed
  by the top 31 bits of the key hash instead of a gid.

Per left row the match list is therefore ``left key -> left slot -> gid -> pool region ->
right slot -> right row key``: a per-left-row redirection whose right end survives right
shifts without touching left rows. The arrays read by ``get_prev`` (left slot -> gid,
gid -> region, right slot -> right key) are :class:`NumpyColumnSource` instances tracked
by the graph, so values at the start of the cycle stay readable until it ends.

Keys are compared exactly (:func:`~engine.ops.join._keys.key_table` brings both sides to one type per column,
:mod:`engine._kernels.hashing` hashes them): one integer column is its own exact hash; any
other key is verified against the stored key values of the candidate group, so two
different keys never share a group, whatever their hashes. A row with a null in any key
column belongs to no group: null keys never match. Float keys are matched by value,
``-0.0 == 0.0`` and NaN equal to NaN (as pandas does).

Every per-cycle step is whole-array numpy work whose size follows the change (plus the
sizes of the right groups that changed); there is no Python loop per row, key or group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine._kernels.arrays import expand, expand_with_owner, member, sorted_unique
from engine._kernels.hashing import hash_columns
from engine._kernels.ids import IdAllocator
from engine._kernels.keymap import StoredKeyMap
from engine._kernels.rowkeymap import RowKeyMap
from engine.columns import NumpyColumnSource, read_columns
from engine.errors import SchemaError
from engine.ops.join._groupindex import GroupIndex
from engine.ops.join._keys import key_kind, key_table, key_type
from engine.rowset import KeyArray

if TYPE_CHECKING:
    from engine.table import Table
    from engine.update import TableUpdate

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]

_EMPTY = np.empty(0, dtype=np.int64)

# amortization thresholds (module attributes so tests can shrink them)
INDEX_MIN_STALE = 16384  # a GroupIndex is rebuilt once dead entries pass max(this, live rows)
POOL_MIN_GARBAGE = 65536  # pool: compact once dead entries pass max(this, live entries)


# structures -------------------------------------------------------------------------------
def _tracked(capacity: int = 1024) -> NumpyColumnSource:
    src = NumpyColumnSource(pa.int64(), capacity)
    return src


@dataclass
class Delta:
    """What :meth:`JoinState.apply` changed, for the listeners to describe."""

    changed: KeyArray = field(default_factory=lambda: _EMPTY)  # gids whose right list changed
    new_gids: KeyArray = field(default_factory=lambda: _EMPTY)  # of those, created this cycle
    rvm_slots: KeyArray = field(default_factory=lambda: _EMPTY)  # right slots modified in place
    rvm_cols: frozenset[str] = frozenset()  # right source columns they changed
    removed_keys: KeyArray = field(default_factory=lambda: _EMPTY)  # left, previous space
    removed_gid: KeyArray = field(default_factory=lambda: _EMPTY)  # their previous gid
    added_keys: KeyArray = field(default_factory=lambda: _EMPTY)  # left, current space
    added_slots: KeyArray = field(default_factory=lambda: _EMPTY)
    regroup_slots: KeyArray = field(default_factory=lambda: _EMPTY)  # left rows whose gid changed
    regroup_keys: KeyArray = field(default_factory=lambda: _EMPTY)  # their current keys
    regroup_old: KeyArray = field(default_factory=lambda: _EMPTY)  # previous gid
    regroup_new: KeyArray = field(default_factory=lambda: _EMPTY)  # current gid
    modified_keys: KeyArray = field(default_factory=lambda: _EMPTY)  # left modifies, current space
    modified_slots: KeyArray = field(default_factory=lambda: _EMPTY)  # their slots


class JoinState:
    """Slots, groups and indexes of one join (see the module docstring)."""

    def __init__(self, left: Table, right: Table, left_on: list[str], right_on: list[str],
                 joins_src: list[str]) -> None:
        for lc, rc in zip(left_on, right_on, strict=True):
            lk, rk = key_kind(left.schema.field(lc).type), key_kind(right.schema.field(rc).type)
            if lk != rk:
                raise SchemaError(
                    f"join key {lc!r} of {left.name!r} is {left.schema.field(lc).type} but "
                    f"{rc!r} of {right.name!r} is {right.schema.field(rc).type}; cast one side "
                    f"first (e.g. with update())"
                )
        self.graph = left.graph
        self.left, self.right = left, right
        self.left_on, self.right_on = left_on, right_on
        self.joins_src = frozenset(joins_src)
        # groups
        self.key_names = [f"k{i}" for i in range(len(left_on))]
        self.gids = StoredKeyMap(pa.schema([(nm, key_type(right.schema.field(c).type))
                                            for nm, c in zip(self.key_names, right_on, strict=True)]))
        self.gid_alloc = IdAllocator()
        self.g_left = np.zeros(1024, dtype=np.int64)  # live left rows per gid
        self.g_start = _tracked()
        self.g_count = _tracked()
        self.pool = np.zeros(1024, dtype=np.int64)
        self.pool_end = 0
        self.pool_live = 0
        # right rows
        self.rmap = RowKeyMap()
        self.r_alloc = IdAllocator()
        self.r_rkey = _tracked()
        self.r_gid = np.full(1024, -1, dtype=np.int64)
        # left rows
        self.lmap = RowKeyMap()
        self.l_alloc = IdAllocator()
        self.l_key = np.zeros(1024, dtype=np.int64)
        self.l_gid = _tracked()
        self.l_live = np.zeros(1024, dtype=bool)
        self.l_step = np.full(1024, -1, dtype=np.int64)  # step the slot was born or regrouped
        self.l_mod = np.full(1024, -1, dtype=np.int64)  # step the slot was last modified
        self.l_index = GroupIndex()
        self.l_pend = np.full(1024, -1, dtype=np.int64)  # pending: hash >> 33, else -1
        self.p_index = GroupIndex()  # pending left slots by ``l_pend``
        self.l_hash = np.zeros(1024, dtype=np.uint64)  # key hash of a pending slot
        self._new_hashes: list[U64] = []  # hashes of keys right rows brought this cycle,
        self._new_gids_now: list[KeyArray] = []  # their gids (in step)
        self._over_step = -1
        self._fresh_step = -1  # last step in which some slot became fresh
        self._lmod_step = -1  # last step with left modifies (``l_mod`` marks them)
        self._over_keys = _EMPTY
        self._over_slots = _EMPTY

    # capacity -------------------------------------------------------------------------------
    @staticmethod
    def _grow(arr: npt.NDArray[Any], n: int, fill: Any) -> npt.NDArray[Any]:
        if n <= arr.size:
            return arr
        out = np.full(max(n, 2 * arr.size), fill, dtype=arr.dtype)
        out[: arr.size] = arr
        return out

    def _fit_gids(self) -> None:
        n = self.gid_alloc.end
        self.g_left = self._grow(self.g_left, n, 0)
        self.g_start.ensure_capacity(n)
        self.g_count.ensure_capacity(n)

    def _fit_right(self) -> None:
        n = self.r_alloc.end
        self.r_gid = self._grow(self.r_gid, n, -1)
        self.r_rkey.ensure_capacity(n)

    def _fit_left(self) -> None:
        n = self.l_alloc.end
        self.l_key = self._grow(self.l_key, n, 0)
        self.l_live = self._grow(self.l_live, n, False)
        self.l_step = self._grow(self.l_step, n, -1)
        self.l_mod = self._grow(self.l_mod, n, -1)
        self.l_pend = self._grow(self.l_pend, n, -1)
        self.l_hash = self._grow(self.l_hash, n, 0)
        self.l_gid.ensure_capacity(n)

    # reading -----------------------------------------------------------------------------------
    @property
    def l_gid_now(self) -> KeyArray:
        return self.l_gid._values

    def left_slots(self, keys: KeyArray, prev: bool = False) -> KeyArray:
        """Left slot per left row key (previous key space when ``prev``)."""
        if prev and self._over_step == self.graph.step and self.graph.phase == "updating":
            out = self.lmap.lookup(keys)
            hit = member(self._over_keys, keys)
            if hit.any():
                out[hit] = self._over_slots[np.searchsorted(self._over_keys, keys[hit])]
            return out
        return self.lmap.lookup(keys)

    def counts(self, gids: KeyArray, prev: bool = False) -> KeyArray:
        """Right rows per gid (0 for ``-1``)."""
        ok = gids >= 0
        src = self.g_count.get_prev_numpy if prev else self.g_count.get_numpy
        return np.where(ok, src(np.where(ok, gids, 0))[0], 0)

    def first_match(self, gids: KeyArray, prev: bool = False) -> KeyArray:
        """The first right slot of each group (``-1`` for none), for natural joins."""
        cnt = self.counts(gids, prev)
        src = self.g_start.get_prev_numpy if prev else self.g_start.get_numpy
        start = src(np.where(gids >= 0, gids, 0))[0]
        return np.where(cnt > 0, self.pool[np.where(cnt > 0, start, 0)], -1)

    def right_keys(self, keys: KeyArray, bits: int, prev: bool) -> tuple[KeyArray, Mask]:
        """Right row key under each output key ``left_key << bits | match``, and where one is."""
        lk = keys >> bits if bits else keys
        j = keys & ((1 << bits) - 1) if bits else np.zeros(keys.size, dtype=np.int64)
        s = self.left_slots(lk, prev)
        ok = s >= 0
        s = np.where(ok, s, 0)
        g = (self.l_gid.get_prev_numpy(s) if prev else self.l_gid.get_numpy(s))[0]
        ok &= g >= 0
        g = np.where(ok, g, 0)
        cnt = (self.g_count.get_prev_numpy(g) if prev else self.g_count.get_numpy(g))[0]
        start = (self.g_start.get_prev_numpy(g) if prev else self.g_start.get_numpy(g))[0]
        ok &= j < cnt
        rs = self.pool[np.where(ok, start + j, 0)]
        rk = (self.r_rkey.get_prev_numpy(rs) if prev else self.r_rkey.get_numpy(rs))[0]
        return rk, ok

    def left_members(self, gids: KeyArray) -> KeyArray:
        """Live left slots whose current gid is in the sorted distinct ``gids``."""
        return self.l_index.query(gids, self.l_gid_now, self.l_live)

    def stable_members(self, gids: KeyArray, new_gids: KeyArray) -> KeyArray:
        """Live left slots in the sorted distinct ``gids`` that are not fresh this cycle.

        A group created this cycle (in the sorted ``new_gids``) has only fresh members
        (each looked its key up, or was attached, this cycle), so it is not queried.
        """
        if new_gids.size:
            gids = gids[~member(new_gids, gids)]
        slots = self.left_members(gids)
        return slots[~self.fresh(slots)]

    def group_index(self, groups: KeyArray, gids: KeyArray) -> KeyArray:
        """Position of each of ``gids`` in the sorted ``groups`` (all present)."""
        n = self.gid_alloc.end
        if gids.size * 4 > n:  # many lookups: a dense table beats binary search
            table = np.zeros(n, dtype=np.int64)
            table[groups] = np.arange(groups.size, dtype=np.int64)
            return table[gids]
        return np.searchsorted(groups, gids)

    def left_modified(self, slots: KeyArray) -> Mask:
        """Left slots the left update of the running cycle modified."""
        if self._lmod_step != self.graph.step:
            return np.zeros(slots.size, dtype=bool)
        out: Mask = self.l_mod[slots] == self.graph.step
        return out

    def fresh(self, slots: KeyArray) -> Mask:
        """Left slots born or regrouped in the running cycle."""
        if self._fresh_step != self.graph.step:
            return np.zeros(slots.size, dtype=bool)
        out: Mask = self.l_step[slots] == self.graph.step
        return out

    def group_entries(self, gids: KeyArray, prev: bool = False) -> tuple[KeyArray, KeyArray, KeyArray]:
        """``(right slot, group index, position)`` of every member of ``gids``, in order."""
        get_s = self.g_start.get_prev_numpy if prev else self.g_start.get_numpy
        cnt = self.counts(gids, prev)
        start = get_s(np.where(gids >= 0, gids, 0))[0]
        pos, q = expand_with_owner(start, cnt)
        return self.pool[pos], q, pos - start[q]

    # gids ---------------------------------------------------------------------------------------
    def _gids_for(self, keys: pa.Table, valid: Mask) -> KeyArray:
        """Gid per right key row (``-1`` where a key is null), allocating gids for new keys
        (their hashes noted for :meth:`_attach`)."""
        g = np.full(keys.num_rows, -1, dtype=np.int64)
        if not valid.any():
            return g
        if not valid.all():
            keys = keys.filter(pa.array(valid))
        h = hash_columns(keys.columns)
        g[valid], added = self.gids.intern(keys, h, self._new_gids)
        if added.size:
            new = member(np.sort(added), g[valid])  # rows with a new key (repeats included)
            self._new_hashes.append(h[new])
            self._new_gids_now.append(g[valid][new])
        return g

    def _lookup_left(self, keys: pa.Table, valid: Mask) -> tuple[KeyArray, KeyArray, U64]:
        """``(gid, pending code, hash)`` per left key row: the gid of its key or ``-1``; for
        a non-null key without a group its :func:`_pending_code` (else ``-1``); the key hash
        (0 for a null key)."""
        if valid.all():  # no null key (the common case): no scatter into full-size arrays
            h = hash_columns(keys.columns)
            if not len(self.gids):
                return np.full(h.size, -1, dtype=np.int64), _pending_code(h), h
            g = self.gids.lookup(keys, h)
            return g, np.where(g < 0, _pending_code(h), -1), h
        g = np.full(keys.num_rows, -1, dtype=np.int64)
        code = np.full(keys.num_rows, -1, dtype=np.int64)
        h = np.zeros(keys.num_rows, dtype=np.uint64)
        if not valid.any():
            return g, code, h
        keys = keys.filter(pa.array(valid))
        hv = hash_columns(keys.columns)
        gv = self.gids.lookup(keys, hv) if len(self.gids) else np.full(hv.size, -1, dtype=np.int64)
        g[valid], h[valid] = gv, hv
        code[valid] = np.where(gv < 0, _pending_code(hv), -1)
        return g, code, h

    def _new_gids(self, n: int) -> KeyArray:
        new_g = self.gid_alloc.allocate(n)
        self._fit_gids()
        self.g_left[new_g] = 0
        self.g_start.set_numpy(new_g, np.zeros(new_g.size, dtype=np.int64))
        self.g_count.set_numpy(new_g, np.zeros(new_g.size, dtype=np.int64))
        return new_g

    def _key_rows(self, table: Table, cols: list[str], keys: KeyArray) -> tuple[pa.Table, Mask]:
        # one translation of ``keys`` for every key column reading through the same map
        return key_table(read_columns([table.column(c) for c in cols], keys), self.key_names)

    # the cycle ------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start of a cycle's work: release deferred ids, compact, then track prev arrays."""
        self.gid_alloc.release()
        self.r_alloc.release()
        self.l_alloc.release()
        if self.pool_end - self.pool_live > max(self.pool_live, POOL_MIN_GARBAGE):
            self._compact_pool()  # before tracking: prev and current stay identical
        live = int(self.lmap.count)
        if self.l_index.stale > max(live, INDEX_MIN_STALE):
            slots = np.flatnonzero(self.l_live[: self.l_alloc.end]).astype(np.int64)
            g = self.l_gid_now[slots]
            self.l_index.reset(g[g >= 0], slots[g >= 0])
        if self.p_index.stale > max(len(self.p_index) - self.p_index.stale, INDEX_MIN_STALE):
            slots = np.flatnonzero(self.l_live[: self.l_alloc.end]
                                   & (self.l_pend[: self.l_alloc.end] >= 0)).astype(np.int64)
            self.p_index.reset(self.l_pend[slots], slots)
        self._new_hashes, self._new_gids_now = [], []
        for src in (self.g_start, self.g_count, self.r_rkey, self.l_gid):
            self.graph.track(src)

    def _compact_pool(self) -> None:
        n = self.gid_alloc.end
        gids = np.arange(n, dtype=np.int64)
        cnt = self.g_count.get_numpy(gids)[0]
        start = self.g_start.get_numpy(gids)[0]
        pos = expand(start, cnt)
        self.pool = np.concatenate((self.pool[pos], np.zeros(max(1024, pos.size), dtype=np.int64)))
        self.pool_end = int(pos.size)
        self.g_start.set_numpy(gids, np.cumsum(cnt) - cnt)

    def _pool_append(self, slots: KeyArray) -> int:
        at = self.pool_end
        self.pool = self._grow(self.pool, at + slots.size, 0)
        self.pool[at : at + slots.size] = slots
        self.pool_end += slots.size
        return at

    def apply(self, lu: TableUpdate | None, ru: TableUpdate | None) -> Delta:
        """Bring the state to the current cycle; what changed is returned for the listener."""
        self.begin()
        d = Delta()
        touched: list[KeyArray] = []
        if ru is not None:
            self._apply_right(ru, d)
            touched.append(d.changed)
        if lu is not None:
            self._apply_left(lu, d)
        if self._new_gids_now:
            new_g = _cat(self._new_gids_now)
            d.new_gids = sorted_unique(new_g)
            if len(self.p_index):
                self._attach(np.concatenate(self._new_hashes), new_g, d)
        touched += [d.removed_gid, d.regroup_old]
        self._free_gids(touched)
        return d

    def _apply_right(self, ru: TableUpdate, d: Delta) -> None:
        right = self.right
        changed: list[KeyArray] = []
        new_s: list[KeyArray] = []
        new_g: list[KeyArray] = []
        # removed rows (previous key space)
        if ru.removed:
            rk = ru.removed.keys()
            rs = self.rmap.remove(rk)
            g = self.r_gid[rs]
            changed.append(g[g >= 0])
            self.r_gid[rs] = -1
            self.r_alloc.free(rs)
        # shifts: row keys move, slots (and so groups) stay
        if ru.shifted:
            pk, ck = ru.shifted.moved_keys(right.prev_rowset - ru.removed)
            if pk.size:
                self.r_rkey.set_numpy(self.rmap.move(pk, ck), ck)
        # modified rows (current key space): key changes move between groups
        if ru.modified and ru.modified_columns & (self.joins_src | set(self.right_on)):
            mk = ru.modified.keys()
            ms = self.rmap.lookup(mk)
            stay = np.ones(mk.size, dtype=bool)
            if ru.modified_columns & set(self.right_on):
                g_new = self._gids_for(*self._key_rows(right, self.right_on, mk))
                g_old = self.r_gid[ms]
                moved = g_new != g_old
                if moved.any():
                    changed += [g_old[moved & (g_old >= 0)], g_new[moved & (g_new >= 0)]]
                    self.r_gid[ms[moved]] = g_new[moved]
                    into = moved & (g_new >= 0)
                    new_s.append(ms[into])
                    new_g.append(g_new[into])
                    stay = ~moved
            vm = ru.modified_columns & self.joins_src
            if vm:
                vs = ms[stay]
                d.rvm_slots = np.sort(vs[self.r_gid[vs] >= 0])
                d.rvm_cols = frozenset(vm)
        # added rows (current key space)
        if ru.added:
            ak = ru.added.keys()
            slots = self.r_alloc.allocate(ak.size)
            self._fit_right()
            self.rmap.insert(ak, slots)
            self.r_rkey.set_numpy(slots, ak)
            g = self._gids_for(*self._key_rows(right, self.right_on, ak))
            self.r_gid[slots] = g
            changed.append(g[g >= 0])
            new_s.append(slots[g >= 0])
            new_g.append(g[g >= 0])
        if changed:
            d.changed = sorted_unique(np.concatenate(changed))
            if d.changed.size:
                self._rebuild_groups(d.changed, _cat(new_s), _cat(new_g))

    def _rebuild_groups(self, gids: KeyArray, new_s: KeyArray, new_g: KeyArray) -> None:
        """Rewrite the regions of ``gids`` (sorted): survivors plus arrivals, in row-key order."""
        old_s, q, _ = self.group_entries(gids)  # nothing rewritten yet: current == previous
        keep = self.r_gid[old_s] == gids[q]
        s_all = np.concatenate((old_s[keep], new_s))
        q_all = np.concatenate((q[keep], np.searchsorted(gids, new_g)))
        rk = self.r_rkey.get_numpy(s_all)[0]
        order = np.lexsort((rk, q_all))
        s_all, q_all = s_all[order], q_all[order]
        cnt = np.bincount(q_all, minlength=gids.size).astype(np.int64)
        at = self._pool_append(s_all)
        self.g_start.set_numpy(gids, at + np.cumsum(cnt) - cnt)
        self.g_count.set_numpy(gids, cnt)
        self.pool_live += int(cnt.sum()) - int(old_s.size)

    def _apply_left(self, lu: TableUpdate, d: Delta) -> None:
        step = self.graph.step
        over_k: list[KeyArray] = []
        over_s: list[KeyArray] = []
        if lu.removed:
            pk = lu.removed.keys()
            ls = self.lmap.remove(pk)
            g = self.l_gid_now[ls]
            d.removed_keys, d.removed_gid = pk, g
            over_k.append(pk)
            over_s.append(ls)
            self.l_live[ls] = False
            self._ref(g, -1)
            self.l_index.stale += int(np.count_nonzero(g >= 0))
            self._unpend(ls)
            self.l_alloc.free(ls)
        if lu.shifted:
            pk, ck = lu.shifted.moved_keys(self.left.prev_rowset - lu.removed)
            if pk.size:
                ls = self.lmap.move(pk, ck)
                self.l_key[ls] = ck
                over_k.append(pk)
                over_s.append(ls)
        if over_k:
            k, s = _cat(over_k), _cat(over_s)
            order = np.argsort(k)
            self._over_step, self._over_keys, self._over_slots = step, k[order], s[order]
        mk, ms = _EMPTY, _EMPTY
        if lu.modified:
            mk = lu.modified.keys()
            ms = self.lmap.lookup(mk)
            self.l_mod[ms] = step
            self._lmod_step = step
            d.modified_keys, d.modified_slots = mk, ms
            if not lu.modified_columns & set(self.left_on):
                mk, ms = _EMPTY, _EMPTY  # no key column changed: groups stay
        ak = lu.added.keys() if lu.added else _EMPTY
        if mk.size + ak.size == 0:
            return
        # one key read, hash and lookup for re-keyed and added rows (current key space)
        g_all, code_all, h_all = self._lookup_left(*self._key_rows(self.left, self.left_on, _cat([mk, ak])))
        if mk.size:
            g_new, code, h = g_all[: mk.size], code_all[: mk.size], h_all[: mk.size]
            g_old = self.l_gid_now[ms]
            moved = g_new != g_old
            if moved.any():
                self._regroup(ms[moved], mk[moved], g_old[moved], g_new[moved], d)
            self._pend(ms, code, h)
        if ak.size:
            g, code, h = g_all[mk.size :], code_all[mk.size :], h_all[mk.size :]
            slots = self.l_alloc.allocate(ak.size)
            self._fit_left()
            self.lmap.insert(ak, slots)
            self.l_key[slots] = ak
            self.l_live[slots] = True
            self.l_step[slots] = step
            self._fresh_step = step
            self.l_gid.set_numpy(slots, g)
            self._ref(g, +1)
            self.l_index.insert(g[g >= 0], slots[g >= 0])
            self._pend(slots, code, h)  # freed slots were unpended
            d.added_keys, d.added_slots = ak, slots

    def _regroup(self, ms: KeyArray, mk: KeyArray, g_old: KeyArray, g_new: KeyArray, d: Delta) -> None:
        """Move live left slots ``ms`` (current keys ``mk``) from ``g_old`` to ``g_new``."""
        step = self.graph.step
        self.l_gid.set_numpy(ms, g_new)
        self.l_step[ms] = step
        self._fresh_step = step
        self._ref(g_old, -1)
        self._ref(g_new, +1)
        self.l_index.stale += int(np.count_nonzero(g_old >= 0))
        self.l_index.insert(g_new[g_new >= 0], ms[g_new >= 0])
        d.regroup_slots = _cat([d.regroup_slots, ms])
        d.regroup_keys = _cat([d.regroup_keys, mk])
        d.regroup_old = _cat([d.regroup_old, g_old])
        d.regroup_new = _cat([d.regroup_new, g_new])

    def _pend(self, slots: KeyArray, code: KeyArray, h: U64) -> None:
        """Set the pending codes (``-1``: not pending) and key hashes of live left slots,
        indexing the new codes."""
        self.l_hash[slots] = h
        old = self.l_pend[slots]
        change = old != code
        if not change.any():
            return
        slots, old, code = slots[change], old[change], code[change]
        self.p_index.stale += int(np.count_nonzero(old >= 0))
        self.l_pend[slots] = code
        new = code >= 0
        self.p_index.insert(code[new], slots[new])

    def _unpend(self, slots: KeyArray) -> None:
        """Left slots that stop being live or pending leave the pending index (lazily)."""
        old = self.l_pend[slots]
        self.p_index.stale += int(np.count_nonzero(old >= 0))
        self.l_pend[slots] = -1

    def _attach(self, hashes: U64, gids: KeyArray, d: Delta) -> None:
        """Give the pending left rows whose key right rows brought this cycle its group.

        ``hashes[k]`` is the hash of the new key of gid ``gids[k]`` (repeats allowed). The
        rows waiting under their :func:`_pending_code` whose full hash is one of them are
        the candidates: an exact key (its hash a bijection) takes that hash's gid, any
        other is looked up again by its current values, so a collision attaches nothing
        wrong. A left row looked up this cycle finds nothing new (the right side was
        applied first), so only rows that waited attach.
        """
        order = np.argsort(hashes)
        hashes, gids = hashes[order], gids[order]
        slots = self.p_index.query(sorted_unique(_pending_code(hashes)), self.l_pend, self.l_live)
        if slots.size == 0:
            return
        h = self.l_hash[slots]
        pos = np.minimum(np.searchsorted(hashes, h), hashes.size - 1)
        hit = hashes[pos] == h
        slots = slots[hit]
        if slots.size == 0:
            return
        keys = self.l_key[slots]
        if self.gids.exact:
            g = gids[pos[hit]]
        else:
            g, _, _ = self._lookup_left(*self._key_rows(self.left, self.left_on, keys))
            found = g >= 0
            slots, keys, g = slots[found], keys[found], g[found]
            if slots.size == 0:
                return
        self._unpend(slots)
        self._regroup(slots, keys, np.full(slots.size, -1, dtype=np.int64), g, d)

    def _ref(self, g: KeyArray, delta: int) -> None:
        g = g[g >= 0]
        if g.size:
            np.add.at(self.g_left, g, delta)

    def _free_gids(self, touched: list[KeyArray]) -> None:
        """Forget groups no row on either side refers to (ids reused from the next cycle)."""
        if not touched:
            return
        g = sorted_unique(_cat(touched))
        g = g[g >= 0]
        if g.size == 0:
            return
        dead = g[(self.g_left[g] == 0) & (self.g_count.get_numpy(g)[0] == 0)]
        if dead.size:
            self.gids.delete(dead)
            self.gid_alloc.free(dead)

    # initial state ------------------------------------------------------------------------------
    def build(self) -> None:
        """Index the parents' current rows (outside a cycle, under the shared lock)."""
        from engine.update import TableUpdate

        d = Delta()
        if self.right.rowset:
            self._apply_right(TableUpdate.of(added=self.right.rowset), d)
        if self.left.rowset:
            self._apply_left(TableUpdate.of(added=self.left.rowset), d)
        self.l_step[: self.l_alloc.end] = -1  # nothing is "fresh" outside a cycle
        self._fresh_step = -1


def _pending_code(h: U64) -> KeyArray:
    """A pending left row's index code: the top 31 bits of its key hash (fits beside a
    32-bit slot in :class:`GroupIndex`)."""
    return (h >> np.uint64(33)).astype(np.int64)


def _cat(parts: list[KeyArray]) -> KeyArray:
    if not parts:
        return _EMPTY
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
