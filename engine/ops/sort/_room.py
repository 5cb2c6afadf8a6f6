"""Room for new rows whose gap is full: pushed runs and re-spread windows (engine.ops.sort).

What :class:`~engine.ops.sort._index.SortIndex`'s placement asks when a gap has no room
(cases 2 and 3 of the policy in engine.ops.sort._index), as functions of its live bits.
New rows with the same insertion slot form a *group*; a group's gap lies between the live
rows ``p`` and ``t`` around its insertion slot ``gi`` (found by the index through Invariant
G). For the groups whose gap is too short:

* :func:`push_runs` (case 2): a gap one slot short takes the nearer free slot beside it by
  pushing the run of at most ``MAX_PUSH`` rows in between by one slot; claims of two
  groups never overlap;
* :func:`respread_windows`, :func:`outermost_windows`, :func:`window_membership` (case 3):
  the smallest aligned window of ``2**l`` slots (``l >= MIN_LEVEL``) around each other
  short gap whose density, new rows included, is at most ``tau(l)`` (:func:`_tau`:
  ``TAU_LEAF`` for the smallest window falling linearly to ``TAU_ROOT`` for the whole
  space); only the outermost windows are kept, and each group learns whether it falls
  inside one;
* :func:`respread`: the new layout of each window, survivors and new rows together.

Everything is computed whole arrays at once from the groups (``gi`` sorted and distinct,
``gr`` their sizes) and the index's :class:`~engine.ops.sort._slots.LiveBits`, which is
only read here: moving and storing rows and restoring Invariant G over the windows stay in
engine.ops.sort._index. Relies on the slot space being a power of two and windows aligned,
so two windows are nested or disjoint and ``LiveBits`` counts rows per window directly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine._kernels.arrays import member, sorted_unique
from engine.ops.sort._slots import LiveBits

__all__ = ["outermost_windows", "push_one", "push_runs", "respread", "respread_windows",
           "window_membership"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

MIN_LEVEL = 4          # smallest re-spread window: 16 slots
TAU_LEAF = 0.9         # density allowed in the smallest window ...
TAU_ROOT = 0.7         # ... falling linearly to this for the whole slot space
MAX_PUSH = 8           # longest run of rows pushed aside to widen a gap by one slot


def _tau(level: int, capacity: int) -> float:
    top = max(capacity.bit_length() - 1, MIN_LEVEL + 1)
    return TAU_LEAF - (TAU_LEAF - TAU_ROOT) * (level - MIN_LEVEL) / (top - MIN_LEVEL)


def push_runs(live: LiveBits, gi: I64, p: I64, t: I64, cand: Mask, front: Mask, back: Mask
            ) -> tuple[I64, I64, I64]:
    """For gaps one slot short: the run of rows to push into the nearest free slot.

    Per group (``gi`` sorted and distinct, its live neighbours ``p`` before and ``t``
    after; ``front``/``back``: the group goes before the first or after the last row),
    ``cand`` marks the gaps that may push. Returns per group the claimed slots
    ``[lo, hi]`` (gap, run and the free slot) and the direction ``+1``/``-1`` (``0``: no
    push). A push needs a run of at most ``MAX_PUSH`` rows and a claim that touches no
    other group's gap or claim; ``live`` is only read.
    """
    n = gi.size
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, -1, dtype=np.int64)
    by = np.zeros(n, dtype=np.int64)
    c = np.flatnonzero(cand)
    if c.size == 0:
        return lo, hi, by
    z = live.free_succ(t[c])   # right: rows t..z-1 move up by one
    y = live.free_pred(p[c])   # left: rows y+1..p move down by one
    right = np.where(z >= 0, z - t[c], MAX_PUSH + 1)
    left = np.where(y >= 0, p[c] - y, MAX_PUSH + 1)
    go_right = (right <= left) & (right <= MAX_PUSH)
    go_left = ~go_right & (left <= MAX_PUSH)
    by[c[go_right]] = 1
    by[c[go_left]] = -1
    lo[c] = np.where(go_right, gi[c], y)
    hi[c] = np.where(go_right, z, t[c] - 1)
    # every group occupies its gap [p + 1, t - 1] (or its claim); claims must not overlap
    end = np.where(back, np.iinfo(np.int64).max, t - 1)
    a = np.where(by != 0, lo, np.where(front, 0, gi))
    b = np.where(by != 0, hi, end)
    order = np.argsort(a, kind="stable")
    a_s, b_s = a[order], b[order]
    reach = np.maximum.accumulate(b_s)
    clash = np.zeros(n, dtype=bool)
    clash[1:] = a_s[1:] <= reach[:-1]
    clash[:-1] |= b_s[:-1] >= a_s[1:]
    by[order[clash]] = 0
    return lo, hi, by


def push_one(live: LiveBits, p: int, t: int) -> tuple[int, int, int]:
    """:func:`push_runs` for one gap between live rows ``p`` and ``t``, as plain integers,
    before the check against other groups: ``(direction, lo, hi)``, direction 0 when no
    run of at most ``MAX_PUSH`` rows reaches a free slot."""
    z = live.free_succ_one(t)
    y = live.free_pred_one(p)
    right = z - t if z >= 0 else MAX_PUSH + 1
    left = p - y if y >= 0 else MAX_PUSH + 1
    if right <= left and right <= MAX_PUSH:
        return 1, p + 1, z
    if left <= MAX_PUSH:
        return -1, y, t - 1
    return 0, 0, -1


def window_membership(windows: npt.NDArray[np.int64], gi: I64, t: I64
                ) -> tuple[I64, I64, I64, Mask, I64]:
    """Where the groups fall among ``windows`` (``(level, index)`` rows, outermost and
    sorted by start, as :func:`outermost_windows` gives them).

    Returns the windows' ``starts`` and ``stops`` (slots, half-open) and, per group, its
    window (or -1), whether it is inside one, and the end of its usable gap (its successor
    ``t``, or the start of the next window if that comes first).
    """
    starts = windows[:, 1] << windows[:, 0]
    stops = starts + (1 << windows[:, 0])
    nxt = np.searchsorted(starts, gi, side="right")
    win = nxt - 1
    if starts.size:
        inside = (win >= 0) & (gi < stops[np.maximum(win, 0)])
    else:
        inside = np.zeros(gi.size, dtype=bool)
    win[~inside] = -1
    cap = t.copy()
    has = nxt < starts.size
    cap[has] = np.minimum(t[has], starts[nxt[has]])
    return starts, stops, win, inside, cap


def respread_windows(live: LiveBits, capacity: int, gi: I64, cum: I64, pending: I64
             ) -> npt.NDArray[np.int64] | None:
    """Smallest aligned window around each pending group whose density is allowed.

    ``pending`` indexes the groups to find room for; ``cum`` is the running total of the
    groups' sizes (``cum[i]``: new rows before group ``i``), so a window's load is its live
    rows plus the new rows whose insertion slot falls inside it. Returns ``(level, index)``
    rows (window ``index`` of ``2**level`` slots), or None when even the whole space is too
    dense; windows may nest (see :func:`outermost_windows`).
    """
    top = capacity.bit_length() - 1
    out = []
    for level in range(MIN_LEVEL, top + 1):  # one step per window size, not per group
        w = sorted_unique(gi[pending] >> level)
        lo = np.searchsorted(gi, w << level)
        hi = np.searchsorted(gi, (w + 1) << level)
        load = live.count(level, w) + cum[hi] - cum[lo]
        ok = load <= _tau(level, capacity) * (1 << level)
        if ok.any():
            out.append(np.column_stack((np.full(int(ok.sum()), level), w[ok])))
        pending = pending[~member(w[ok], gi[pending] >> level)]
        if pending.size == 0:
            return np.concatenate(out).astype(np.int64)
    return None


def outermost_windows(windows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``windows`` without those inside others, sorted by start and without duplicates
    (aligned windows are nested or disjoint, so what is left is disjoint)."""
    lv, ix = windows[:, 0], windows[:, 1]
    keep = np.ones(lv.size, dtype=bool)
    for level in np.unique(lv):  # one step per window size
        at = sorted_unique(ix[lv == level])
        lower = np.flatnonzero(lv < level)
        keep[lower[member(at, ix[lower] >> (level - lv[lower]))]] = False
    w = windows[keep]
    starts = w[:, 1] << w[:, 0]
    order = np.argsort(starts, kind="stable")
    w, starts = w[order], starts[order]
    first = np.concatenate(([True], starts[1:] != starts[:-1]))
    return w[first]


def respread(live: LiveBits, starts: I64, stops: I64, inside: Mask, win: I64, gi: I64,
              gr: I64, gstart: I64, grp: I64, slots: I64) -> tuple[I64, I64, I64, I64, I64]:
    """Lay out each window's survivors and new rows again.

    The windows and groups are as :func:`window_membership` described them; ``gr`` gives
    each group's size, ``gstart`` its first new row and ``grp`` each new row's group. Half
    of a window's free slots are spread evenly, half next to its insertion points by group
    size. Fills ``slots`` of the windows' new rows; returns the survivors' old and new slots
    and their window, and all the windows' rows' new slots (sorted) with their window.
    ``live`` is only read: moving the survivors is the caller's.
    """
    surv, owner = live.live_in(starts, stops)
    rows = np.flatnonzero(inside[grp])
    n_s = surv.size
    key = np.concatenate((2 * surv + 1, 2 * gi[grp[rows]]))  # new rows go before slot gi
    whose = np.concatenate((owner, win[grp[rows]]))
    order = np.argsort(key, kind="stable")
    whose = whose[order]
    total = order.size
    n_w = np.bincount(whose, minlength=starts.size)
    head = np.minimum(np.cumsum(n_w) - n_w, max(total - 1, 0))
    local = np.arange(total) - head[whose]
    mem = np.flatnonzero(inside)
    wg = win[mem]
    load = np.bincount(wg, weights=gr[mem], minlength=starts.size).astype(np.int64)
    # half of the free slots go evenly, half next to the insertion points
    free = (stops - starts) - n_w
    hot = free // 2
    uni = (free - hot)[whose]
    nw1 = (n_w + 1)[whose]
    gaps = (uni * (local + 1)) // nw1 - (uni * local) // nw1
    at = np.empty(total, dtype=np.int64)
    at[order] = np.arange(total)
    share = hot[wg] * gr[mem] // np.maximum(load[wg], 1)
    row_pos = np.empty(slots.size, dtype=np.int64)
    row_pos[rows] = at[n_s + np.arange(rows.size)]
    first_pos = row_pos[gstart[mem]]
    after_pos = row_pos[gstart[mem] + gr[mem] - 1] + 1
    np.add.at(gaps, first_pos, share // 2)
    ok = after_pos < total
    ok[ok] = whose[after_pos[ok]] == wg[ok]
    np.add.at(gaps, after_pos[ok], (share - share // 2)[ok])
    c = np.cumsum(gaps + 1)
    placed = starts[whose] + c - (c[head] - gaps[head])[whose]
    new_at = np.empty(total, dtype=np.int64)
    new_at[order] = placed
    slots[rows] = new_at[n_s:]
    return surv, new_at[:n_s], owner, placed, whose
