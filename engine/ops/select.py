"""Column operations: ``update``, ``select``, ``view``, ``drop_columns``, ``rename_columns``.

Every result has its parent's RowSet and key space: adds, removes and shifts pass through
unchanged. Columns the call does not compute are the parent's column sources, shared,
not copied. Computed columns are ``pyarrow.compute`` expressions:

* ``update`` / ``select`` *store* them. They are evaluated for the rows the parent added
  and, for the rows it modified, only when the parent's ``modified_columns`` meet the
  column's inputs. Values live in op-owned dense arrays indexed by *slot*, with a
  :class:`_RowSlots` map from row key to slot (dense array while the key space is dense,
  a vectorized hash map once it is not); a parent shift moves map entries, not values, so
  its cost is one int64 per moved row whatever the number of stored columns. Added and
  modified rows are evaluated together, and consecutive columns that do not read each
  other share one Acero plan (a plan has a fixed cost before any row is computed; see
  ``bench/bench_library.py``).
* ``view`` *computes on read*: its columns are :class:`ViewColumnSource` objects whose
  ``get``/``get_prev`` evaluate the expression on the parent's current/previous values at
  the requested keys. Nothing is stored and nothing runs per cycle.

Expressions are evaluated **in order**: each may read the parent's columns and the columns
defined before it in the same call, by their new definition (``update(A=f(x), B=g(A))``
reads the new ``A``; ``update(Price=2 * Price, X=Price)`` gives ``X`` the doubled price).
A computed column whose name exists already replaces it in place; new columns are appended.
An expression that is just ``pc.field(name)`` shares that column's source (no storage).

A computed column is in ``modified_columns`` exactly when one of its inputs
(transitively, through earlier computed columns) is; a row is reported modified only
when at least one of the result's columns may have changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import expr as _expr
from engine._kernels.ids import IdAllocator
from engine._kernels.rowkeymap import RowKeyMap
from engine.columns import (
    ColumnSource,
    RedirectingColumnSource,
    WritableColumnSource,
    compact_stale,
    make_column_source,
)
from engine.errors import SchemaError
from engine.rowset import KeyArray, RowSet
from engine.table import Derivation, derive
from engine.update import TableUpdate

if TYPE_CHECKING:
    from engine.graph import UpdateGraph
    from engine.table import Table

__all__ = [
    "SelectListener",
    "ViewColumnSource",
    "drop_columns",
    "rename_columns",
    "select",
    "update",
    "view",
]

log = logging.getLogger(__name__)

_EMPTY = np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------------------------------
# storage: row key -> slot


class _RowSlots:
    """Maps row keys to storage slots, whole arrays at a time.

    The map is a :class:`~engine._kernels.rowkeymap.RowKeyMap` (a dense array while the
    key space is dense; a hash map for sparse key spaces such as merge regions at
    ``i << 40``), the slots come from an :class:`~engine._kernels.ids.IdAllocator`.

    Previous key space: the entries a cycle removes or moves are kept (old keys, slots)
    so :meth:`prev_lookup` answers as of the start of the cycle; they are dropped by the
    next cycle's :meth:`begin`. Slots freed in a cycle are reused from the next cycle
    on, so a removed row's values stay readable as previous values during its cycle.
    """

    def __init__(self, graph: UpdateGraph) -> None:
        self._graph = graph
        self._map = RowKeyMap()
        self._ids = IdAllocator()
        self._step = -1
        self._prev_parts: list[tuple[KeyArray, KeyArray]] = []
        self._prev_keys: KeyArray = _EMPTY
        self._prev_slots: KeyArray = _EMPTY

    @property
    def hashed(self) -> bool:
        """True once the map switched to the hashed layout."""
        return self._map.hashed

    @property
    def live(self) -> int:
        """How many row keys hold a slot."""
        return self._map.count

    @property
    def next_slot(self) -> int:
        """One past the largest slot handed out (storage needs this many entries)."""
        return self._ids.end

    def begin(self) -> None:
        """Call before changing the map in a cycle: drops the last cycle's overlay."""
        step = self._graph.step
        if step != self._step:
            self._step = step
            self._prev_parts = []
            self._prev_keys = self._prev_slots = _EMPTY
            self._ids.release()

    def _overlay(self) -> tuple[KeyArray, KeyArray]:
        if self._step != self._graph.step or self._graph.phase != "updating":
            return _EMPTY, _EMPTY
        if self._prev_parts:
            parts = [(self._prev_keys, self._prev_slots), *self._prev_parts]
            keys = np.concatenate([k for k, _ in parts])
            slots = np.concatenate([s for _, s in parts])
            order = np.argsort(keys, kind="stable")
            self._prev_keys, self._prev_slots = keys[order], slots[order]
            self._prev_parts = []
        return self._prev_keys, self._prev_slots

    def lookup(self, keys: KeyArray) -> KeyArray:
        """Current slot of each key, ``-1`` where the key has none."""
        return self._map.lookup(keys)

    def prev_lookup(self, keys: KeyArray) -> KeyArray:
        """Slot of each key of the previous key space, as of the start of the cycle."""
        slots = self._map.lookup(keys)
        pk, ps = self._overlay()
        if pk.size and keys.size:
            pos = np.searchsorted(pk, keys)
            np.minimum(pos, pk.size - 1, out=pos)  # a position everywhere: unmasked gathers
            hit = pk.take(pos) == keys
            if hit.any():
                slots = np.where(hit, ps.take(pos), slots)
        return slots

    def remove(self, keys: KeyArray) -> None:
        """Forget removed keys (previous key space); their slots are freed next cycle."""
        if keys.size == 0:
            return
        slots = self._map.remove(keys)
        self._prev_parts.append((keys, slots))
        self._ids.free(slots)

    def move(self, prev_keys: KeyArray, cur_keys: KeyArray) -> None:
        """Apply a shift: ``prev_keys[i]`` now lives at ``cur_keys[i]`` (all at once)."""
        if prev_keys.size == 0:
            return
        slots = self._map.move(prev_keys, cur_keys)
        self._prev_parts.append((prev_keys, slots))

    def add(self, keys: KeyArray) -> KeyArray:
        """Give new keys (absent from the map) slots; returns the slots."""
        if keys.size == 0:
            return _EMPTY
        slots = self._ids.allocate(keys.size)
        was_hashed = self._map.hashed
        self._map.insert(keys, slots)
        if self._map.hashed and not was_hashed:
            log.debug("row-slot map switched to the hashed layout at %d rows", self._map.count)
        return slots


class _StoredColumnSource(RedirectingColumnSource):
    """A computed column stored by slot; reads translate row keys through the slot map."""

    def __init__(self, storage: WritableColumnSource, slots: _RowSlots) -> None:
        self.type = storage.type
        self.storage = self.inner = storage
        self._slots = slots

    @property
    def translation(self) -> object:
        return self._slots

    def translate(self, keys: KeyArray) -> KeyArray:
        return self._slots.lookup(np.asarray(keys, dtype=np.int64))

    def translate_prev(self, keys: KeyArray) -> KeyArray:
        return self._slots.prev_lookup(np.asarray(keys, dtype=np.int64))


class ViewColumnSource(ColumnSource):
    """A column computed on read from other columns' current or previous values.

    Parameters
    ----------
    bound
        The expression, bound to the columns it reads.
    sources
        The column source of every name in ``bound.inputs``.
    """

    def __init__(self, bound: _expr.BoundExpression, sources: Mapping[str, ColumnSource]) -> None:
        self.type = bound.type
        self.bound = bound
        self._sources = {n: sources[n] for n in bound.inputs}

    def get(self, keys: KeyArray) -> pa.Array:
        k = np.asarray(keys, dtype=np.int64)
        return _expr.evaluate(self.bound, _expr.gather(self._sources, self.bound.inputs, k), k.size)

    def get_prev(self, keys: KeyArray) -> pa.Array:
        k = np.asarray(keys, dtype=np.int64)
        values = _expr.gather(self._sources, self.bound.inputs, k, prev=True)
        return _expr.evaluate(self.bound, values, k.size)


# ---------------------------------------------------------------------------------------
# planning: which output column is what


@dataclass(slots=True)
class _Computed:
    """One stored computed column and how to evaluate it for a batch of rows."""

    name: str
    bound: _expr.BoundExpression
    deps: frozenset[str]                 # parent columns it reads, transitively
    sources: dict[str, ColumnSource]     # the source of each input, as defined before it
    earlier: dict[str, int]              # input name -> index of an earlier computed column
    storage: WritableColumnSource


def _plan(
    table: Table,
    exprs: Mapping[str, object],
    *,
    stored: bool,
    slots: _RowSlots | None,
) -> tuple[dict[str, pa.Field], dict[str, ColumnSource], dict[str, frozenset[str]], list[_Computed]]:
    """Define ``exprs`` in order on top of ``table``'s columns (the environment)."""
    fields = {f.name: f for f in table.schema}
    sources = table.columns
    deps = {n: frozenset((n,)) for n in fields}
    computed_at: dict[str, int] = {}
    computed: list[_Computed] = []
    for name, expr in exprs.items():  # one step per expression
        bound = _expr.bind(expr, pa.schema(list(fields.values())), table_name=table.name,
                           what=f"column {name!r}")
        alias = bound.inputs[0] if len(bound.inputs) == 1 else None
        # a positional expression (decoded Substrait) reads its only input as position 0
        if alias is not None and bound.expr.equals(pc.field(0) if bound.positional else pc.field(alias)):
            # a plain reference shares the column it names
            src, dep, typ = sources[alias], deps[alias], fields[alias].type
            if alias in computed_at:
                computed_at[name] = computed_at[alias]
            else:
                computed_at.pop(name, None)
        else:
            dep = frozenset().union(*(deps[c] for c in bound.inputs))
            inputs = {c: sources[c] for c in bound.inputs}
            typ = bound.type
            if stored:
                assert slots is not None
                storage = make_column_source(typ)
                src = _StoredColumnSource(storage, slots)
                earlier = {c: computed_at[c] for c in bound.inputs if c in computed_at}
                computed.append(_Computed(name, bound, dep, inputs, earlier, storage))
                computed_at[name] = len(computed) - 1
            else:
                src = ViewColumnSource(bound, inputs)
                computed_at.pop(name, None)
        fields[name] = pa.field(name, typ)
        sources[name] = src
        deps[name] = dep
    return fields, sources, deps, computed


def _check_names(table: Table, names: Sequence[object], what: str, also: Sequence[str] = ()) -> None:
    """Raise SchemaError unless ``names`` are distinct strings naming columns (or ``also``)."""
    strs = [n for n in names if isinstance(n, str)]
    if len(strs) != len(names):
        bad = [n for n in names if not isinstance(n, str)]
        raise SchemaError(f"{what}: column names must be strings, got {bad}")
    dup = sorted({n for n in strs if strs.count(n) > 1})
    if dup:
        raise SchemaError(f"{what} on table {table.name!r}: column(s) {dup} given more than once")
    missing = [n for n in strs if n not in table.schema.names and n not in also]
    if missing:
        raise SchemaError(
            f"table {table.name!r} has no column(s) {missing} (has: {', '.join(table.schema.names)})"
        )


def _build(
    table: Table,
    out_names: Sequence[str] | None,
    exprs: Mapping[str, object],
    *,
    stored: bool,
    rename: Mapping[str, str] | None = None,
) -> Table:
    """Make the child: ``out_names`` (None: the parent's, replaced in place, new appended)."""
    def plan() -> Derivation:
        slots = _RowSlots(table.graph) if stored and exprs else None
        fields, sources, deps, computed = _plan(table, exprs, stored=stored, slots=slots)
        if out_names is None:
            names = list(table.schema.names) + [n for n in exprs if n not in table.schema.names]
        else:
            names = list(out_names) + [n for n in exprs if n not in out_names]
        renamed = rename or {}
        out = [renamed.get(n, n) for n in names]
        schema = pa.schema([fields[n].with_name(o) for n, o in zip(names, out, strict=True)])
        listener = SelectListener(
            table,
            {o: deps[n] for n, o in zip(names, out, strict=True)},
            computed,
            slots if computed else None,
        )
        listener.initialize()
        columns = {o: sources[n] for n, o in zip(names, out, strict=True)}
        # the parent's rows and updates pass through; modifies only follow the parent's
        return Derivation(schema, columns, table.rowset, listener, add_only=table.add_only)

    return derive([table], plan)


def _groups(computed: list[_Computed]) -> list[list[int]]:
    """Consecutive computed columns evaluated in one plan: none reads another member, and a
    name means one source for all members (``update(A=f(Price), Price=Qty, B=g(Price))``
    reads two different ``Price`` columns, so ``B`` starts a new group)."""
    groups: list[list[int]] = []
    names: dict[str, ColumnSource] = {}
    for i, c in enumerate(computed):
        fits = bool(groups) and not set(c.earlier.values()) & set(groups[-1]) and all(
            names.get(n, src) is src for n, src in c.sources.items())
        if fits:
            groups[-1].append(i)
        else:
            groups.append([i])
            names = {}
        names.update(c.sources)
    return groups


class SelectListener:
    """Keeps a column-operation result current: same rows, recomputed stored columns.

    Parameters
    ----------
    parent
        The parent table.
    deps
        Per output column, the parent columns whose modification may change it.
    computed
        The stored computed columns, in definition order.
    slots
        Their row key -> slot map (None when nothing is stored).
    """

    result: Table

    def __init__(
        self,
        parent: Table,
        deps: dict[str, frozenset[str]],
        computed: list[_Computed],
        slots: _RowSlots | None,
    ) -> None:
        self.parent = parent
        self._deps = deps
        self._computed = computed
        self._slots = slots
        self._groups = _groups(computed)

    def _evaluate(self, add: KeyArray, mod: KeyArray, redo: frozenset[int]) -> dict[int, pa.Array]:
        """Every computed column at ``add`` and the ``redo`` ones also at ``mod``.

        A column's values cover ``add`` then ``mod`` when its group has a redone column
        (columns of the group that are not redone ride along for ``mod`` rows, cheaper
        than a second plan; they are not stored there), else ``add`` only. Columns are
        evaluated group by group (one plan per group, see :func:`_groups`);
        an input that is an earlier computed column comes from this batch, or from
        storage for ``mod`` rows where it was not redone (its value did not change).
        """
        both = np.concatenate((add, mod)) if redo else add
        out: dict[int, pa.Array] = {}
        for group in self._groups:  # one plan per group of independent columns
            keys = both if redo.intersection(group) else add
            if not add.size:
                group = [i for i in group if i in redo]
            if keys.size == 0 or not group:
                continue
            values: dict[str, pa.Array] = {}
            for i in group:
                c = self._computed[i]
                for name in c.bound.inputs:
                    if name in values:
                        continue
                    j = c.earlier.get(name)
                    if j is None or j not in out:
                        values[name] = c.sources[name].get(keys)
                    elif len(out[j]) > keys.size:
                        values[name] = out[j].slice(0, keys.size)
                    elif len(out[j]) < keys.size:  # not redone: unchanged at ``mod``
                        values[name] = pa.concat_arrays([out[j], c.sources[name].get(mod)])
                    else:
                        values[name] = out[j]
            bounds = [self._computed[i].bound for i in group]
            out.update(zip(group, _expr.evaluate_many(bounds, values, keys.size), strict=True))
        return out

    def _store(self, add_slots: KeyArray, mod_slots: KeyArray, values: dict[int, pa.Array],
               redo: frozenset[int]) -> None:
        graph = self.parent.graph
        n = add_slots.size
        for i, arr in values.items():
            storage = self._computed[i].storage
            if n:  # fresh or earlier-freed slots: no previous value to keep
                storage.set(add_slots, arr.slice(0, n))
            if i in redo and mod_slots.size:
                graph.track(storage)  # before overwriting values rows had at cycle start
                storage.set(mod_slots, arr.slice(n))

    def initialize(self) -> None:
        """Compute the stored columns for the parent's current rows (at construction)."""
        if self._slots is None:
            return
        keys = self.parent.rowset.keys()
        slots = self._slots.add(keys)
        self._store(slots, _EMPTY, self._evaluate(keys, _EMPTY, frozenset()), frozenset())

    def _compact(self) -> None:
        """Drop unreachable string values (only before this cycle wrote anything)."""
        assert self._slots is not None
        slots = self._slots
        compact_stale([c.storage for c in self._computed], slots.live,
                      lambda: slots.lookup(self.result.rowset.keys()))

    def on_update(self, up: TableUpdate | None) -> TableUpdate | None:
        if up is None:
            return None
        changed = up.modified_columns if up.modified else frozenset()
        if self._slots is not None:
            self._apply(up, changed)
        cols = frozenset(n for n, d in self._deps.items() if d & changed)
        modified = up.modified if cols else RowSet()
        if not (up.added or up.removed or modified or up.shifted):
            return None
        return TableUpdate(up.added, up.removed, modified, up.shifted, cols)

    def _apply(self, up: TableUpdate, changed: frozenset[str]) -> None:
        slots = self._slots
        assert slots is not None
        slots.begin()
        self._compact()
        before = self.result.rowset                   # previous key space (= parent's)
        if up.removed:
            slots.remove(up.removed.keys())
        if up.shifted:
            # rows in shifted ranges, minus the removed ones (not ``before - removed``:
            # that would copy the whole RowSet)
            prev_keys, cur_keys = up.shifted.moved_keys(before)
            if up.removed and prev_keys.size:
                alive = ~up.removed.contains_all(prev_keys)
                prev_keys, cur_keys = prev_keys[alive], cur_keys[alive]
            slots.move(prev_keys, cur_keys)           # map entries move, values stay
        # current key space from here on
        add = up.added.keys() if up.added else _EMPTY
        redo = frozenset(i for i, c in enumerate(self._computed) if c.deps & changed)
        mod = up.modified.keys() if redo else _EMPTY
        if add.size or mod.size:
            add_slots = slots.add(add)
            self._store(add_slots, slots.lookup(mod), self._evaluate(add, mod, redo), redo)


# ---------------------------------------------------------------------------------------
# the operations


def update(table: Table, **exprs: pc.Expression) -> Table:
    """All columns of ``table`` plus computed ``exprs``, stored.

    An expression whose name exists replaces that column in place; new columns come last.
    Expressions are evaluated in order and may read columns defined before them.

    Parameters
    ----------
    table
        The parent table.
    **exprs
        ``name=expression`` pairs (``pyarrow.compute`` expressions over columns, by name).

    Raises
    ------
    ExpressionError
        If an expression names a missing column or its function rejects the types.

    Examples
    --------
    >>> t.update(Notional=pc.field("Price") * pc.field("Qty")).column_names
    ['Sym', 'Price', 'Qty', 'Notional']
    """
    return _build(table, None, exprs, stored=True)


def select(table: Table, *columns: str, **exprs: pc.Expression) -> Table:
    """``columns`` of ``table`` followed by computed ``exprs``, stored.

    With neither ``columns`` nor ``exprs``, all columns (shared, not copied). An expression
    named like one of ``columns`` takes its place; expressions may read any column of
    ``table`` (selected or not) and those defined before them.

    Parameters
    ----------
    table
        The parent table.
    *columns
        Names of columns to keep, in output order.
    **exprs
        ``name=expression`` pairs.

    Raises
    ------
    SchemaError
        If a name in ``columns`` is missing or repeated.
    ExpressionError
        If an expression is invalid.

    Examples
    --------
    >>> t.select("Sym", Px2=pc.field("Price") * 2).column_names
    ['Sym', 'Px2']
    """
    return _select(table, columns, exprs, stored=True, what="select")


def view(table: Table, *columns: str, **exprs: pc.Expression) -> Table:
    """Like :func:`select`, but computed columns are evaluated on read, never stored.

    Cheap to keep (nothing runs per cycle), each read pays the evaluation: prefer it for
    columns read rarely or for few rows, :func:`select` for columns read by every cycle
    of a downstream operation.

    Examples
    --------
    >>> t.view("Sym", Px2=pc.field("Price") * 2).column_names
    ['Sym', 'Px2']
    """
    return _select(table, columns, exprs, stored=False, what="view")


def _select(
    table: Table, columns: Sequence[str], exprs: Mapping[str, object], *, stored: bool, what: str
) -> Table:
    if not columns and not exprs:
        return _build(table, None, {}, stored=stored)
    _check_names(table, columns, what, also=list(exprs))
    return _build(table, list(columns), exprs, stored=stored)


def drop_columns(table: Table, *names: str) -> Table:
    """All columns of ``table`` except ``names`` (sources shared).

    Raises
    ------
    SchemaError
        If a name is not a column of ``table``.
    """
    _check_names(table, names, "drop_columns")
    return _build(table, [n for n in table.schema.names if n not in names], {}, stored=False)


def rename_columns(table: Table, mapping: Mapping[str, str]) -> Table:
    """``table`` with columns renamed ``{old: new}``, in the same order (sources shared).

    Raises
    ------
    SchemaError
        If an old name is missing, or the new names collide.
    """
    _check_names(table, list(mapping), "rename_columns")
    new_names: list[object] = list(mapping.values())
    for new in new_names:
        if not isinstance(new, str) or not new:
            raise SchemaError(f"rename_columns: new column names must be non-empty strings, got {new!r}")
    out = [mapping.get(n, n) for n in table.schema.names]
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise SchemaError(
            f"rename_columns on table {table.name!r} would give several columns the name(s) "
            f"{dup}; rename or drop the existing column first"
        )
    return _build(table, list(table.schema.names), {}, stored=False, rename=dict(mapping))
