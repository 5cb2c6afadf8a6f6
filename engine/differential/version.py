"""Versions (times) under the product partial order, and frontiers as antichains.

A :class:`Version` is a tuple of non-negative ints: ``(step,)`` for a table's cycle, and
``(step, iteration, ...)`` inside ``iterate``. Versions are ordered by the *product*
partial order: ``a <= b`` when every coordinate of ``a`` is ``<=`` the matching one of
``b``. Two versions may be incomparable (``(0, 1)`` and ``(1, 0)``); the order is a
lattice, with ``join`` (coordinate-wise max, the least upper bound) and ``meet``
(coordinate-wise min, the greatest lower bound).

An :class:`Antichain` is a set of mutually incomparable versions. Used as a *frontier* it
stands for its upper set, the versions that may still receive data: ``f <= v`` when some
element of ``f`` is ``<= v``. Frontiers are ordered by inclusion of upper sets
(``f <= g`` when every element of ``g`` is above some element of ``f``), their meet is
the minimal elements of the union, their join the minimal elements of the pairwise joins.
The empty antichain is the final frontier: no version can receive data any more.

Rules (seed 002, v5), enforced with :class:`InputError`:

* a frontier only advances: the next frontier ``g`` of ``f`` satisfies ``f <= g``
  (:meth:`Antichain.check_advance`);
* data may only be sent at a version ``v`` with ``frontier <= v``
  (:meth:`Antichain.check_version`).

Compaction: once a trace's frontier is ``F``, a time ``t`` may be replaced by
``advance_by(t, F)`` = meet over ``f`` in ``F`` of ``t.join(f)``. For every ``u`` with
``F <= u``, ``t <= u`` exactly when ``advance_by(t, F) <= u``, so accumulations at the
versions that still matter are unchanged (:func:`advance_times` does it for a whole
array of times).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from engine.errors import InputError

__all__ = [
    "Antichain",
    "Frontier",
    "Version",
    "VersionLike",
    "advance_times",
    "as_version",
    "times_less_equal",
    "times_up_to",
]

TimeArray = npt.NDArray[np.int64]


class Version:
    """A point in time: a tuple of non-negative ints under the product partial order.

    ``<=``, ``<``, ``>=``, ``>`` are the *partial* order (both ``a <= b`` and ``b <= a`` can
    be false), so sort with ``key=Version.sort_key`` (lexicographic, a linear extension
    of the partial order: ``a <= b`` implies ``a.sort_key() <= b.sort_key()``).

    Examples
    --------
    >>> Version(1, 2) <= Version(3, 2), Version(0, 1) <= Version(1, 0)
    (True, False)
    >>> Version(0, 1).join(Version(1, 0)), Version(0, 1).meet(Version(1, 0))
    (Version(1, 1), Version(0, 0))
    """

    __slots__ = ("coords",)
    coords: tuple[int, ...]

    def __init__(self, *coords: int | Iterable[int]) -> None:
        if len(coords) == 1 and not isinstance(coords[0], (int, np.integer)):
            flat = tuple(int(c) for c in coords[0])
        else:
            flat = tuple(int(c) for c in coords)  # type: ignore[arg-type]
        if not flat:
            raise InputError("a Version needs at least one coordinate")
        if min(flat) < 0:
            raise InputError(f"version coordinates must be non-negative, got {flat}")
        object.__setattr__(self, "coords", flat)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Version is immutable")

    def __len__(self) -> int:
        return len(self.coords)

    def __iter__(self) -> Iterator[int]:
        return iter(self.coords)

    def __getitem__(self, i: int) -> int:
        return self.coords[i]

    def __repr__(self) -> str:
        return f"Version({', '.join(map(str, self.coords))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.coords == other.coords

    def __hash__(self) -> int:
        return hash(self.coords)

    def _dims(self, other: Version) -> None:
        if len(other.coords) != len(self.coords):
            raise InputError(
                f"cannot compare {self!r} with {other!r}: versions have {len(self.coords)} and "
                f"{len(other.coords)} coordinates (enter or leave a scope first)"
            )

    def less_equal(self, other: Version) -> bool:
        """Product order: every coordinate ``<=``."""
        self._dims(other)
        return all(a <= b for a, b in zip(self.coords, other.coords, strict=True))

    def less_than(self, other: Version) -> bool:
        """``self <= other`` and ``self != other``."""
        return self.less_equal(other) and self.coords != other.coords

    __le__ = less_equal
    __lt__ = less_than

    def __ge__(self, other: Version) -> bool:
        return other.less_equal(self)

    def __gt__(self, other: Version) -> bool:
        return other.less_than(self)

    def join(self, other: Version) -> Version:
        """Least upper bound: coordinate-wise max."""
        self._dims(other)
        return Version(tuple(max(a, b) for a, b in zip(self.coords, other.coords, strict=True)))

    def meet(self, other: Version) -> Version:
        """Greatest lower bound: coordinate-wise min."""
        self._dims(other)
        return Version(tuple(min(a, b) for a, b in zip(self.coords, other.coords, strict=True)))

    def advance_by(self, frontier: Antichain) -> Version:
        """The least version equivalent to this one for every version beyond ``frontier``.

        The meet over ``f`` in ``frontier`` of ``self.join(f)``; ``self`` if ``frontier`` is
        empty (nothing is beyond it, so nothing needs preserving).
        """
        out: Version | None = None
        for f in frontier:
            j = self.join(f)
            out = j if out is None else out.meet(j)
        return self if out is None else out

    def extend(self, coord: int = 0) -> Version:
        """Enter a nested scope: append a coordinate (an iteration counter)."""
        return Version(self.coords + (coord,))

    def truncate(self) -> Version:
        """Leave a nested scope: drop the last coordinate."""
        if len(self.coords) < 2:
            raise InputError(f"{self!r} has no nested scope to leave")
        return Version(self.coords[:-1])

    def sort_key(self) -> tuple[int, ...]:
        """Lexicographic key, a total order compatible with the partial order."""
        return self.coords


VersionLike: TypeAlias = "Version | int | tuple[int, ...]"


def as_version(v: VersionLike) -> Version:
    """``Version`` from a Version, an int (one coordinate) or a tuple of ints."""
    if isinstance(v, Version):
        return v
    if isinstance(v, (int, np.integer)):
        return Version(int(v))
    return Version(tuple(v))


def _minimal(versions: Iterable[Version]) -> tuple[Version, ...]:
    """The minimal elements of ``versions`` (distinct, lexicographic order)."""
    vs = sorted(set(versions), key=Version.sort_key)
    out: list[Version] = []
    for v in vs:  # antichains are small: a loop per element, never per record
        if not any(u.less_equal(v) for u in out):  # earlier in lex order cannot be above v
            out.append(v)
    return tuple(out)


class Antichain:
    """A set of mutually incomparable versions; as a frontier, its upper set.

    ``Antichain([Version(2, 5), Version(4, 1)])`` stands for every version ``>=`` one of its
    elements. Construction keeps only the minimal elements, so any iterable of versions
    may be given.

    Examples
    --------
    >>> f = Antichain([(2, 5), (4, 1)])
    >>> f.less_equal_version(Version(3, 6)), f.less_equal_version(Version(3, 3))
    (True, False)
    >>> Antichain([(0, 1)]).meet(Antichain([(1, 0)]))
    Antichain([(0, 1), (1, 0)])
    """

    __slots__ = ("elements",)
    elements: tuple[Version, ...]

    def __init__(self, versions: Iterable[VersionLike] = ()) -> None:
        vs = [as_version(v) for v in versions]
        if vs and len({len(v) for v in vs}) != 1:
            raise InputError(f"an antichain's versions must have one dimension, got {vs}")
        object.__setattr__(self, "elements", _minimal(vs))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Antichain is immutable")

    def __iter__(self) -> Iterator[Version]:
        return iter(self.elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __bool__(self) -> bool:
        return bool(self.elements)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Antichain) and self.elements == other.elements

    def __hash__(self) -> int:
        return hash(self.elements)

    def __repr__(self) -> str:
        return f"Antichain([{', '.join(str(v.coords) for v in self.elements)}])"

    @property
    def dims(self) -> int | None:
        """Coordinates per version, ``None`` for the empty antichain."""
        return len(self.elements[0]) if self.elements else None

    def less_equal_version(self, v: Version) -> bool:
        """``self <= v``: ``v`` is in the upper set (may still receive data)."""
        return any(e.less_equal(v) for e in self.elements)

    def less_than_version(self, v: Version) -> bool:
        """Some element is strictly below ``v``."""
        return any(e.less_than(v) for e in self.elements)

    def less_equal(self, other: Antichain) -> bool:
        """``self <= other``: the upper set of ``other`` lies inside the upper set of ``self``."""
        return all(self.less_equal_version(v) for v in other.elements)

    def meet(self, other: Antichain) -> Antichain:
        """Greatest lower bound: upper set = union of the upper sets."""
        return Antichain(self.elements + other.elements)

    def join(self, other: Antichain) -> Antichain:
        """Least upper bound: upper set = intersection of the upper sets."""
        return Antichain(a.join(b) for a in self.elements for b in other.elements)

    def check_version(self, v: Version, what: str = "data") -> None:
        """Raise unless ``v`` may still receive data (``self <= v``).

        Raises
        ------
        InputError
            Naming the version and the frontier.
        """
        if not self.less_equal_version(v):
            raise InputError(
                f"{what} at {v!r} is behind the frontier {self!r}: versions not beyond the "
                f"frontier are closed; send it at a version >= one of the frontier's elements"
            )

    def check_advance(self, new: Antichain) -> None:
        """Raise unless ``new`` is an advance of this frontier (``self <= new``).

        Raises
        ------
        InputError
            If ``new`` would reopen versions this frontier already closed.
        """
        if not self.less_equal(new):
            raise InputError(f"frontier cannot go back from {self!r} to {new!r}")


Frontier = Antichain


def _as_times(times: TimeArray, dims: int) -> TimeArray:
    if times.ndim != 2 or times.shape[1] != dims:
        raise InputError(f"times have shape {times.shape}, expected (n, {dims})")
    return times


def times_less_equal(frontier: Antichain, times: TimeArray) -> npt.NDArray[np.bool_]:
    """Per row of ``times`` (shape ``(n, d)``): ``frontier <= t``."""
    out = np.zeros(times.shape[0], dtype=bool)
    for e in frontier:  # a loop per frontier element
        _as_times(times, len(e))
        out |= (times >= np.asarray(e.coords, dtype=np.int64)).all(axis=1)
    return out


def times_up_to(times: TimeArray, at: Version) -> npt.NDArray[np.bool_]:
    """Per row of ``times``: ``t <= at`` (the rows an accumulation at ``at`` includes)."""
    _as_times(times, len(at))
    return np.asarray((times <= np.asarray(at.coords, dtype=np.int64)).all(axis=1), dtype=bool)


def advance_times(times: TimeArray, frontier: Antichain) -> TimeArray:
    """:meth:`Version.advance_by` for every row of ``times`` at once (a new array)."""
    out: TimeArray | None = None
    for e in frontier:  # a loop per frontier element
        _as_times(times, len(e))
        j = np.maximum(times, np.asarray(e.coords, dtype=np.int64))
        out = j if out is None else np.minimum(out, j)
    return times.copy() if out is None else out
