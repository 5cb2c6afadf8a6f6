"""TableUpdate: what one table changed in one cycle, and how two updates compose.

DESIGN.md §2 is the source of these semantics. Key spaces: ``removed`` is in the previous
key space; ``added`` and ``modified`` in the current one; ``shifted`` maps previous to
current. Apply order: remove, then shift, then add.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from engine.errors import UpdateInvariantError
from engine.rowset import KeyArray, RowSet, RowSetShiftData, unique_keys

__all__ = ["TableUpdate", "compose"]


def _require(invariant: str, bad: RowSet, what: str) -> None:
    if bad:
        keys = bad.keys()[:10].tolist()
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise UpdateInvariantError(invariant, f"{what}: {keys}{more}")


@dataclass(frozen=True, slots=True)
class TableUpdate:
    """What one table changed in one cycle (DESIGN.md §2).

    Key spaces: ``removed`` previous; ``added``, ``modified`` current; ``shifted`` maps
    previous to current. Apply: remove, shift, add. Checked by :meth:`validate`:
      I1  removed <= prev, added <= cur and modified <= cur
      I2  shifted ranges are valid (S1..S4) and keep surviving rows in order
      I3  shifted(prev - removed) and added are disjoint, and their union is cur
      I4  added & modified is empty, so every modified key existed before
      I5  modified_columns is empty exactly when modified is, and names real columns
    """

    added: RowSet = field(default_factory=RowSet)
    removed: RowSet = field(default_factory=RowSet)
    modified: RowSet = field(default_factory=RowSet)
    shifted: RowSetShiftData = field(default_factory=RowSetShiftData.empty)
    modified_columns: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        added: RowSet | None = None,
        removed: RowSet | None = None,
        modified: RowSet | None = None,
        shifted: RowSetShiftData | None = None,
        modified_columns: Iterable[str] = (),
    ) -> TableUpdate:
        """Convenience constructor; ``modified_columns`` is dropped when nothing is modified."""
        mod = modified if modified is not None else RowSet()
        return cls(
            added if added is not None else RowSet(),
            removed if removed is not None else RowSet(),
            mod,
            shifted if shifted is not None else RowSetShiftData.empty(),
            frozenset(modified_columns) if mod else frozenset(),
        )

    def empty(self) -> bool:
        """True when the update changes nothing."""
        return not (self.added or self.removed or self.modified or self.shifted)

    def __repr__(self) -> str:
        return (
            f"TableUpdate(added={self.added!r}, removed={self.removed!r}, "
            f"modified={self.modified!r}, shifted={self.shifted!r}, "
            f"modified_columns={sorted(self.modified_columns)})"
        )

    def apply(self, prev: RowSet) -> RowSet:
        """The current RowSet: ``shifted(prev - removed) | added``."""
        if self.shifted:
            return self.shifted.apply(prev - self.removed) | self.added
        if not (self.removed or self.added):
            return prev  # RowSets never change: the same one serves
        if not self.removed:
            return prev | self.added
        bm = prev.bitmap - self.removed.bitmap  # a new bitmap: added in place, one copy in all
        bm |= self.added.bitmap
        return RowSet(bm)

    def validate(
        self, prev: RowSet, cur: RowSet, columns: Iterable[str] | None = None
    ) -> None:
        """Check I1..I5 against the table's previous and current RowSets.

        Raises
        ------
        UpdateInvariantError
            Naming the first broken invariant and at most ten offending keys.
        """
        _require("I1", self.removed - prev, "removed keys that were not in prev")
        _require("I1", self.added - cur, "added keys that are not in cur")
        _require("I1", self.modified - cur, "modified keys that are not in cur")
        self.shifted.validate()
        kept = prev - self.removed
        if self.shifted:
            pk, ck = self.shifted.moved_keys(kept)
            if pk.size:
                k = kept.keys()
                moved_to = k.copy()
                moved_to[np.searchsorted(k, pk)] = ck
                bad = np.flatnonzero(np.diff(moved_to) <= 0)
                if bad.size:
                    raise UpdateInvariantError(
                        "I2",
                        f"shift reorders or collides surviving keys at {k[bad[:10]].tolist()}",
                    )
                kept = RowSet.from_keys(moved_to, assume_sorted=True)
        _require("I3", kept & self.added, "added keys that already exist after the shift")
        _require("I3", cur - (kept | self.added), "keys in cur not explained by the update")
        _require("I3", (kept | self.added) - cur, "keys the update keeps that are not in cur")
        _require("I4", self.added & self.modified, "keys both added and modified")
        if bool(self.modified) != bool(self.modified_columns):
            raise UpdateInvariantError(
                "I5",
                f"modified has {len(self.modified)} keys but modified_columns is "
                f"{sorted(self.modified_columns)}",
            )
        if columns is not None:
            unknown = self.modified_columns - set(columns)
            if unknown:
                raise UpdateInvariantError("I5", f"modified_columns names unknown {sorted(unknown)}")


def _compose_shift(
    s1: RowSetShiftData, s2: RowSetShiftData, survivors: RowSet
) -> RowSetShiftData:
    """The shift equal to ``s1`` then ``s2`` on ``survivors`` (previous key space of ``s1``).

    Ranges are rebuilt over the keys that really move, so each composed range spans only
    survivors (ranges composed blindly can overlap over key space where no row exists).
    """
    if not s1 and not s2:
        return s1
    p1, _ = s1.moved_keys(survivors)
    p2mid, _ = s2.moved_keys(s1.apply(survivors))
    movers = unique_keys(np.concatenate((p1, s1.unapply_keys(p2mid))))
    if movers.size == 0:
        return RowSetShiftData.empty()
    i1 = _range_index(s1, movers)
    mid = s1.apply_keys(movers)
    i2 = _range_index(s2, mid)
    d = s2.apply_keys(mid) - movers
    # within one (s1 range, s2 range) pair every survivor moves alike, so no survivor
    # outside ``movers`` lies between two movers of one pair; keys whose moves cancel
    # (total delta 0) stay in the runs as breakers and their runs are dropped
    brk = np.flatnonzero((np.diff(d) != 0) | (np.diff(i1) != 0) | (np.diff(i2) != 0))
    first = np.concatenate(([0], brk + 1))
    last = np.concatenate((brk, [movers.size - 1]))
    nz = d[first] != 0
    return RowSetShiftData.from_arrays(movers[first[nz]], movers[last[nz]], d[first[nz]])


def _range_index(s: RowSetShiftData, keys: KeyArray) -> KeyArray:
    """Index of the range of ``s`` holding each key, ``-1`` outside every range."""
    if not s:
        return np.full(keys.size, -1, dtype=np.int64)
    idx = np.searchsorted(s.begins, keys, side="right") - 1
    safe = np.maximum(idx, 0)
    return np.where((idx >= 0) & (keys <= s.ends[safe]), idx, -1)


def compose(u1: TableUpdate, u2: TableUpdate, prev: RowSet) -> TableUpdate:
    """One update equal to applying ``u1`` then ``u2``; ``prev`` is the RowSet before ``u1``.

    Exact: ``compose(u1, u2, prev).apply(prev) == u2.apply(u1.apply(prev))``, and every
    row is reported as what it is overall: a row added by ``u1`` and modified by ``u2``
    is added; a row added by ``u1`` and removed by ``u2`` does not appear at all.
    ``prev`` is needed because shift ranges compose exactly only over the keys that exist
    (the same reason Deephaven's coalescer takes the RowSet).
    """
    if u1.empty():
        return u2
    if u2.empty():
        return u1
    # removed, previous key space of u1: what u1 removed, plus what u2 removed of rows
    # that existed before u1 (mapped back through u1's shift)
    removed = u1.removed | u1.shifted.unapply(u2.removed - u1.added)
    survivors = prev - removed
    shifted = _compose_shift(u1.shifted, u2.shifted, survivors)
    # added/modified, current key space of u2
    added = u2.added | u2.shifted.apply(u1.added - u2.removed)
    modified = (u2.modified | u2.shifted.apply(u1.modified - u2.removed)) - added
    cols = (u1.modified_columns | u2.modified_columns) if modified else frozenset()
    return TableUpdate(added, removed, modified, shifted, cols)
