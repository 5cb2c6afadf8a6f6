"""LiveState fed generated messages (no server): the value log's incremental compaction.

A model table (:class:`_Model`) plays the server: it changes its rows (removes, shifts,
adds, modifies), moves a viewport, sometimes sends a snapshot, and writes the message a
subscriber would get. With compaction lowered to run on almost every message, the state
must equal the model after each one, and every :class:`~clients.livestate.Update` must
read the rows it was made with, however late it is read. Then the log's size and each
message's compaction work are held to their bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyroaring import BitMap64

from clients.livestate import LiveState, Update, _Store
from engine._kernels import rowkeymap
from flight.pb import flight_pb2 as pb
from tests.clients.conftest import KV, kv

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string()), ("v", pa.float64())])
Row = tuple[int, str | None, float]


def _bits(keys: Any) -> bytes:
    return BitMap64(sorted(keys)).serialize()


class _Model:
    """The server's table (row key -> row), and the messages of one subscription to it.

    A row's ``id`` never changes (shifts move its key), so the update frames can be told
    apart by it. Each message comes with the frames its update must read and its
    compaction ``work`` (rows the subscriber appends or removes).
    """

    def __init__(self, rng: np.random.Generator, viewports: bool) -> None:
        self.rng, self.viewports = rng, viewports
        self.rows: dict[int, Row] = {}
        self.viewport: list[tuple[int, int]] | None = None
        self.held: set[int] = set()  # the keys the subscriber holds
        self.seq = self.next_id = 0

    def new_row(self, ident: int | None = None) -> Row:
        """Random values, for row ``ident`` (``None``: a new row)."""
        r = self.rng
        if ident is None:
            ident, self.next_id = self.next_id, self.next_id + 1
        s = None if r.random() < 0.1 else f"x{int(r.integers(1000))}"
        return ident, s, float(r.integers(10**6))

    def _held(self) -> set[int]:
        keys = sorted(self.rows)
        if self.viewport is None:
            return set(keys)
        return {keys[p] for b, e in self.viewport for p in range(b, min(e, len(keys)))}

    def _data(self, keys: list[int]) -> pa.Table:
        rows = [self.rows[k] for k in keys]
        return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()),
                         "s": pa.array([r[1] for r in rows], pa.string()),
                         "v": pa.array([r[2] for r in rows], pa.float64())}, schema=SCHEMA)

    def _meta(self, **fields: Any) -> pb.UpdateMetadata:
        self.seq += 1
        vp = self.viewport
        meta = pb.UpdateMetadata(sequence=self.seq, step=self.seq, epoch="e",
                                 columns=SCHEMA.names, table_size=len(self.rows),
                                 has_viewport=vp is not None, **fields)
        meta.viewport.extend(pb.PositionRange(begin=b, end=e) for b, e in vp or [])
        return meta

    def view(self) -> list[Row]:
        """The held rows in key order: what the subscriber's table must be."""
        return [self.rows[k] for k in sorted(self.held)]

    def snapshot(self, previous: list[Row],
                 ) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table, dict[str, list[Row]], int]:
        """A snapshot of the table as it is; ``previous``: the view the subscriber held."""
        self.held = self._held()
        keys = sorted(self.held)
        meta = self._meta(is_snapshot=True, added_rows=_bits(self.rows),
                          added_data_rows=_bits(keys))
        want = {"added": self.view(), "removed": previous, "modified": [], "previous": []}
        return meta, self._data(keys), self._data([]), want, 0

    def step(self, n_remove: int, n_add: int, n_modify: int, p_shift: float,
             modify: list[int] | None = None,
             ) -> tuple[pb.UpdateMetadata, pa.Table, pa.Table, dict[str, list[Row]], int]:
        """Change the table (``modify``: these keys, not ``n_modify`` at random); returns
        the delta message, its expected frames and its work."""
        r = self.rng
        before, held_before = dict(self.rows), self.held
        keys = np.array(sorted(self.rows), dtype=np.int64)
        removed = set(r.choice(keys, min(n_remove, keys.size), replace=False).tolist())
        survivors = np.array(sorted(set(keys.tolist()) - removed), dtype=np.int64)
        begins, ends, deltas = [], [], []
        if survivors.size and r.random() < p_shift:  # move every key from b on by d
            b, d = int(r.choice(survivors)), int(r.integers(1, 6)) * int(r.choice([-1, 1]))
            if b + d >= 0 and not np.any((survivors >= b + d) & (survivors < b)):
                begins, ends, deltas = [b], [int(keys[-1])], [d]
        prev_of = {int(k) + (deltas[0] if begins and k >= begins[0] else 0): int(k)
                   for k in survivors}  # current key -> previous key
        self.rows = {k: before[p] for k, p in prev_of.items()}
        top = max(self.rows, default=0) + 40
        free = np.setdiff1d(np.arange(top), np.fromiter(self.rows, np.int64, len(self.rows)))
        added = set(r.choice(free, min(n_add, free.size), replace=False).tolist())
        for k in sorted(added):
            self.rows[k] = self.new_row()
        alive = np.array(sorted(prev_of), dtype=np.int64)
        modified = (set(modify) if modify is not None else
                    set(r.choice(alive, min(n_modify, alive.size), replace=False).tolist()))
        for k in modified:
            self.rows[k] = self.new_row(self.rows[k][0])
        if self.viewports and r.random() < 0.1:
            self.viewport = (None if r.random() < 0.5 else
                             [(b := int(r.integers(0, 60)), b + int(r.integers(0, 40)))])
        # what the subscriber gets (LiveState._delta's rules), current key space but `gone`
        self.held = self._held()
        kept = {k for k, p in prev_of.items() if p in held_before}  # held, shifted
        newly = sorted(self.held - kept)
        gone = sorted([p for p in held_before if p in removed]
                      + [prev_of[k] for k in kept - self.held])  # previous key space
        mod = sorted((modified & self.held) - set(newly))
        meta = self._meta(added_rows=_bits(added), removed_rows=_bits(removed),
                          added_data_rows=_bits(newly), modified_data_rows=_bits(mod),
                          shifts=pb.ShiftData(begins=begins, ends=ends, deltas=deltas))
        if mod:
            meta.modified.extend(pb.ColumnModified(column=c, rows=_bits(mod)) for c in SCHEMA.names)
        want = {"added": [self.rows[k] for k in newly], "removed": [before[p] for p in gone],
                "modified": [self.rows[k] for k in mod],
                "previous": [before[prev_of[k]] for k in mod]}
        return meta, self._data(newly), self._data(mod), want, len(newly) + len(mod) + len(gone)


def _frames(u: Update) -> dict[str, list[Row]]:
    return {name: list(df.itertuples(index=False, name=None))
            for name, df in (("added", u.added), ("removed", u.removed),
                             ("modified", u.modified), ("previous", u.modified_previous))}


def _same(got: dict[str, list[Row]], want: dict[str, list[Row]], context: str) -> None:
    def norm(rows: list[Row]) -> list[tuple[int, Any, float]]:
        return [(int(i), None if s is None or s != s else s, float(v)) for i, s, v in rows]

    for name in want:
        g, w = norm(got[name]), norm(want[name])
        assert g == w, f"{context}: {name} differs\n got {g[:10]}\nwant {w[:10]}"


def _check(state: LiveState, model: _Model, context: str) -> None:
    """The state holds the model's view, and S4: each live slot knows its row key."""
    got = list(state.to_arrow().to_pandas().itertuples(index=False, name=None))
    _same({"view": got}, {"view": model.view()}, context)
    keys, slots = state.index.items()
    assert state.store.key_of(slots).tolist() == keys.tolist(), f"{context}: S4"
    assert not slots.size or int(slots.min()) >= state.store.base, f"{context}: a live slot dropped"


def _start(model: _Model, rows: int) -> tuple[LiveState, Update]:
    for k in range(rows):
        model.rows[2 * k] = model.new_row()  # gaps: adds land between rows
    meta, added, modified, _, _ = model.snapshot([])
    state = LiveState(SCHEMA)
    return state, state.apply(meta, added, modified)


# ------------------------------------------------------------------ examples
def test_value_log_drop_head_keeps_frozen_views(monkeypatch):
    """Dropping whole chunks and part of one renumbers nothing: the new view reads slots
    from its base on, the view taken before still reads every slot it had."""
    monkeypatch.setattr(_Store, "_SMALL", 1)  # keep every chunk apart
    store = _Store(KV)
    for size in (50, 3, 1, 17, 200, 2, 64):
        keys = list(range(store.end, store.end + size))
        store.append(kv(keys, [float(k) for k in keys]), np.array(keys))
    n = store.end
    old = store.frozen()
    whole = old.take(np.arange(n)).combine_chunks()
    rng = np.random.default_rng(1)
    for drop in (10, 40, 4, 0, 30):  # inside a chunk, across chunks, to a boundary
        store.drop_head(drop)
        view = store.frozen()
        base = store.base
        assert len(store) == n - base and view.rows == n - base
        for slots in (np.arange(base, n), rng.permutation(np.arange(base, n)),
                      rng.choice(np.arange(base, n), 5), np.arange(base, base + 3)):
            assert view.take(slots).equals(whole.take(pa.array(slots))), (drop, slots[:5])
            assert store.key_of(slots).tolist() == slots.tolist()
        assert old.take(np.arange(n)).equals(whole)
    with pytest.raises(ValueError, match="cannot drop"):
        store.drop_head(len(store) + 1)


@pytest.mark.parametrize("seed", range(4))
def test_frozen_take_equals_a_gather_over_the_whole_log(monkeypatch, seed):
    """Every way a view reads its slots (runs as slices, one gather over all chunks, a
    gather from the few small chunks the slots live in joined, a take per large chunk) gives
    the rows a gather over the whole log gives, in the order asked, nulls included."""
    monkeypatch.setattr(_Store, "_SMALL", 1)  # keep every chunk apart
    rng = np.random.default_rng(seed)
    store = _Store(KV)
    for size in rng.choice([1, 2, 5, 40, 300, 9_000], size=30):
        keys = list(range(store.end, store.end + int(size)))
        strs = [None if k % 7 == 0 else f"s{k}" for k in keys]
        store.append(kv(keys, [float(k) for k in keys], strs), np.array(keys))
    view = store.frozen()
    n = store.end
    whole = view.take(np.arange(n)).combine_chunks()
    small = np.flatnonzero(np.repeat(view.sizes < 100, view.sizes))  # slots in small chunks
    cases = {
        "runs": np.arange(n // 3, n // 3 + 500),
        "many scattered": rng.choice(n, n // 4, replace=False),
        "few scattered": rng.choice(n, 20, replace=False),
        "few in small chunks": rng.choice(small, min(30, small.size), replace=False),
        "one": rng.choice(n, 1),
        "repeated": np.repeat(rng.choice(small, 3), 4),
    }
    for name, slots in cases.items():
        got = view.take(slots)
        assert got.schema == KV, name
        assert got.equals(whole.take(pa.array(slots))), name


def test_compaction_starts_past_the_trigger_and_moves_only_live_rows(monkeypatch):
    """100 rows (key ``2i`` at slot ``i``). Nine messages modify the rows at slots 10..99:
    90 dead slots, not more than the 100 live, so nothing is cleaned. The tenth modifies
    the 20 rows at slots 100..119: 110 dead, so it cleans 4 x 20 slots from the head, of
    which slots 0..9 are live and copied to the tail."""
    monkeypatch.setattr(LiveState, "COMPACT_SLACK", 0)
    monkeypatch.setattr(LiveState, "COMPACT_MIN", 1)
    model = _Model(np.random.default_rng(0), viewports=False)
    state, _ = _start(model, 100)
    for j in range(9):
        meta, added, modified, _, _ = model.step(0, 0, 0, 0.0, modify=[
            2 * s for s in range(10 + 10 * j, 20 + 10 * j)])
        state.apply(meta, added, modified)
    assert (state.compacted_slots, state.store.base, len(state.store)) == (0, 0, 190)
    meta, added, modified, want, _ = model.step(0, 0, 0, 0.0, modify=list(range(20, 60, 2)))
    u = state.apply(meta, added, modified)
    assert (state.compacted_slots, state.compacted_rows) == (80, 10)
    assert (state.store.base, state.store.end) == (80, 220)
    assert state.index.lookup(np.arange(0, 20, 2)).tolist() == list(range(210, 220))
    _same(_frames(u), want, "the tenth message")  # its previous values were in the head
    _check(state, model, "after one clean")


# ------------------------------------------------------------------ the property
@pytest.mark.parametrize(("seed", "slack", "factor"), [(1, 65536, 4), (2, 0, 2), (3, 0, 2)])
def test_random_cycles_with_constant_compaction(monkeypatch, seed, slack, factor):
    """Seeded random cycles (adds, removes, modifies, shifts, a moving viewport, some
    snapshots) with the compaction's trigger and budget lowered to a few rows, so it runs
    whenever dead slots outnumber live ones and cleans a little at a time: after each
    message the state equals the model, and every update, read at once, later or at the
    end, reads the rows it was made with."""
    monkeypatch.setattr(LiveState, "COMPACT_SLACK", 2)
    monkeypatch.setattr(LiveState, "COMPACT_MIN", 1)
    monkeypatch.setattr(LiveState, "COMPACT_FACTOR", factor)
    monkeypatch.setattr(_Store, "_SMALL", 4)
    monkeypatch.setattr(rowkeymap, "SPARSE_SLACK", slack)  # 0: the key index is hashed
    rng = np.random.default_rng(seed)
    model = _Model(rng, viewports=True)
    state, first = _start(model, 120)
    unread: list[tuple[Update, dict[str, list[Row]], str]] = []
    cleaned_by = 0  # messages that compacted
    for cycle in range(500):
        context = f"seed {seed} cycle {cycle}"
        previous = model.view()
        meta, added, modified, want, _ = model.step(
            int(rng.integers(0, 8)), int(rng.integers(0, 8)), int(rng.integers(0, 25)), 0.3)
        if rng.random() < 0.03:
            meta, added, modified, want, _ = model.snapshot(previous)
        cleaned = state.compacted_slots
        u = state.apply(meta, added, modified)
        cleaned_by += state.compacted_slots > cleaned
        _check(state, model, context)
        if rng.random() < 0.3:
            _same(_frames(u), want, context)  # read at once
        else:
            unread.append((u, want, context))
        if rng.random() < 0.05 and unread:  # read some of the older ones now
            for u, want, ctx in unread[: len(unread) // 2]:
                _same(_frames(u), want, f"{ctx} (read at {context})")
            del unread[: len(unread) // 2]
    for u, want, ctx in unread:
        _same(_frames(u), want, f"{ctx} (read at the end)")
    assert len(first.added) == 120
    assert cleaned_by > 40 and state.compacted_rows > 400  # many passes over the log


@pytest.mark.parametrize("pattern", ["random", "newest"])
def test_log_stays_bounded_and_each_message_cleans_within_its_budget(monkeypatch, pattern):
    """A fixed-size table whose every message modifies 5% of it, at random or always the
    rows written last (the worst case: the head the cleaner reaches is all live). The log
    holds at most ``2 L + S`` plus a budget (``2.25 L + S`` plus one at worst, see
    ``LiveState._compact``), and no message cleans more than its budget."""
    slack, rows, m = 64, 2000, 100
    monkeypatch.setattr(LiveState, "COMPACT_SLACK", slack)
    monkeypatch.setattr(LiveState, "COMPACT_MIN", 16)
    model = _Model(np.random.default_rng(4), viewports=False)
    state, _ = _start(model, rows)
    budget = max(LiveState.COMPACT_MIN, LiveState.COMPACT_FACTOR * m)
    bound = 2 * rows + slack + budget + (rows // LiveState.COMPACT_FACTOR if pattern == "newest"
                                         else 0)
    sizes, cleans = [], []
    for i in range(600):
        newest = None
        if pattern == "newest":  # the rows whose slots are the newest
            keys, slots = state.index.items()
            newest = keys[np.argsort(slots)[-m:]].tolist()
        meta, added, modified, _, work = model.step(0, 0, m, 0.0, modify=newest)
        slots0, rows0 = state.compacted_slots, state.compacted_rows
        state.apply(meta, added, modified)
        cleaned, moved = state.compacted_slots - slots0, state.compacted_rows - rows0
        assert moved <= cleaned <= max(LiveState.COMPACT_MIN, LiveState.COMPACT_FACTOR * work)
        sizes.append(len(state.store))
        cleans.append(cleaned)
        assert len(state.store) <= bound, f"message {i}: {len(state.store)} slots > {bound}"
    _check(state, model, pattern)
    assert state.compacted_slots > 10 * rows  # it ran, over many passes
    # and the trigger (dead slots past the live ones plus the slack) was reached in the
    # steady state: the sizes after each message may all lie below it (a clean right
    # after the trigger, of dead head slots), the cleans may not
    assert sum(1 for c in cleans[300:] if c) >= 10, (max(sizes[300:]), cleans[300:])
