"""Groups found by a coded key column's codes, for ``engine.ops.aggregate``.

A keyed source stores a string or binary column *coded* (:class:`ArrowColumnSource`'s
docstring): each distinct value once, a row's slot its value's code, so equal codes are
equal values, exactly, for as long as the column's ``code_epoch`` lasts. An aggregation by
that one column keeps a map from code to group slot (:class:`CodedGroups`): a row whose
code is mapped has its group without a gather, a hash or a comparison of strings; the rows
of codes not mapped yet (a new key, a group that died) go the way of values (hash, then
verify), and their answers are learnt. Invariants, each kept by the listener:

* ``slot_of[c] == g`` only while group ``g`` holds the key whose code is ``c`` (the code's
  value is the group's key: learnt from an exact lookup);
* a group's slot, once freed (:meth:`CodedGroups.forget`), is mapped from no code;
* the map belongs to one column and one epoch: read through another, or past the epoch it
  was learnt in, it starts empty.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.columns import ArrowColumnSource, ColumnSource, RedirectingColumnSource

__all__ = ["CodedGroups"]

I64 = npt.NDArray[np.int64]


class CodedGroups:
    """Code of a coded key column -> the group slot holding that key (module docstring)."""

    def __init__(self) -> None:
        self._source: ArrowColumnSource | None = None
        self._epoch = -1
        self._slot_of = np.full(0, -1, dtype=np.int64)  # by code: group slot, -1 unknown
        self._code_of = np.full(0, -1, dtype=np.int64)  # by slot: its code, -1 none

    def lookup(self, column: ColumnSource, keys: I64) -> tuple[I64, I64] | None:
        """``(slots, codes)`` of rows ``keys`` (current key space) of ``column``: each
        row's code and its group's slot, ``-1`` where the code is not mapped; None when
        ``column`` is not read from a coded column (then group by values)."""
        src, at = column, keys
        while isinstance(src, RedirectingColumnSource):
            at = src.translate(at)
            src = src.inner
        if not isinstance(src, ArrowColumnSource) or not src.coded:
            return None
        if src is not self._source or src.code_epoch != self._epoch:  # another numbering
            self._source, self._epoch = src, src.code_epoch
            self._slot_of = np.full(0, -1, dtype=np.int64)
            self._code_of[:] = -1
        codes = src.codes(at)
        if codes.size == 0:
            return np.empty(0, dtype=np.int64), codes
        top = int(codes.max())
        if top >= self._slot_of.size:
            grown = np.full(max(top + 1, 2 * self._slot_of.size), -1, dtype=np.int64)
            grown[: self._slot_of.size] = self._slot_of
            self._slot_of = grown
        return self._slot_of[codes], codes

    def learn(self, codes: I64, slots: I64) -> None:
        """Rows of ``codes`` belong to the groups ``slots`` (found by their values)."""
        if slots.size == 0:
            return
        top = int(slots.max())
        if top >= self._code_of.size:
            grown = np.full(max(top + 1, 2 * self._code_of.size), -1, dtype=np.int64)
            grown[: self._code_of.size] = self._code_of
            self._code_of = grown
        self._slot_of[codes] = slots
        self._code_of[slots] = codes

    def forget(self, slots: I64) -> None:
        """The groups ``slots`` died (their slots go back to be reused)."""
        slots = slots[slots < self._code_of.size]
        codes = self._code_of[slots]
        self._slot_of[codes[codes >= 0]] = -1
        self._code_of[slots] = -1
