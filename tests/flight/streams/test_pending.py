"""PendingUpdates (flight/streams/pending.py): a consumer's waiting updates, composed exactly,
bounded past ``bound`` by composing in the cycle."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.differential.zset import ZSet
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.update import TableUpdate
from flight.streams.pending import PendingUpdates, Run, compose_run
from flight.streams.registry import HistoryEntry, Publisher
from tests.oracle import RandomSource
from tests.shifting import ShiftingSource


def R(*keys: int) -> RowSet:
    return RowSet.from_keys(list(keys))


def entry(sequence: int, update: TableUpdate, prev: RowSet) -> HistoryEntry:
    return HistoryEntry(sequence, sequence * 10, update, prev)


def test_take_composes_what_waits_and_empties_the_queue():
    p = PendingUpdates(8)
    assert p.take() is None and not p
    p.append(entry(1, TableUpdate.of(added=R(1)), R(0)))
    p.append(entry(2, TableUpdate.of(removed=R(0), modified=R(1), modified_columns=["v"]), R(0, 1)))
    assert len(p) == 2 and p.count == 2
    run = p.take()
    assert run is not None and not p and p.take() is None
    assert (run.entry.sequence, run.entry.step, run.count, run.triples) == (2, 20, 2, None)
    assert run.entry.prev == R(0)
    # 1 was added then modified: added overall; 0 was there before and is gone
    assert run.entry.update == TableUpdate.of(added=R(1), removed=R(0))


def test_past_the_bound_the_newest_update_is_composed_into_the_one_before():
    p = PendingUpdates(2)
    prev = RowSet()
    for i in range(5):
        p.append(entry(i + 1, TableUpdate.of(added=R(i)), prev))
        prev = prev | R(i)
        assert len(p) <= 2
    assert p.count == 5
    run = p.take()
    assert run is not None and run.count == 5 and run.entry.update.added == R(0, 1, 2, 3, 4)


def test_triples_wait_beside_their_updates_and_are_consolidated_past_the_bound():
    p = PendingUpdates(1)

    def z(rows: list[int], diffs: list[int], time: int) -> ZSet:
        return ZSet(pa.table({"x": rows}), np.array(diffs, np.int64)).with_time(time)

    p.append(entry(1, TableUpdate.of(added=R(0)), RowSet()), z([7], [1], 1))
    p.append(entry(2, TableUpdate.of(removed=R(0)), R(0)), z([7], [-1], 2))
    p.append(entry(3, TableUpdate(), RowSet()), z([8], [1], 3))
    run = p.take()
    assert run is not None and run.triples is not None and run.count == 3
    assert sorted(run.triples.to_triples()) == [((7,), (1,), 1), ((7,), (2,), -1), ((8,), (3,), 1)]


def test_a_run_then_the_next_is_one_run():
    a = Run(entry(1, TableUpdate.of(added=R(0)), RowSet()), 1)
    b = Run(entry(3, TableUpdate.of(added=R(1)), R(0)), 2)
    both = a.then(b)
    assert (both.count, both.entry.sequence, both.entry.prev) == (3, 3, RowSet())
    assert both.entry.update.added == R(0, 1)
    assert compose_run([a.entry]) is a.entry


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), source=st.sampled_from(["shifting", "keyed", "ring"]),
       bound=st.integers(1, 5), take_every=st.integers(1, 9))
def test_a_taken_run_leads_exactly_from_the_state_before_it_to_the_table_now(
        seed, source, bound, take_every):
    """However updates pile up and coalesce, what is taken is one valid update from the row
    set the consumer last had to the table's current row set."""
    rng = np.random.default_rng(seed)
    g = UpdateGraph(validate=True)
    src = (ShiftingSource(g, rng, max_rows=50) if source == "shifting"
           else RandomSource(g, source, rng, max_rows=50))
    pub = Publisher(src.table)
    pending = PendingUpdates(bound)

    class Sink:
        def on_table_update(self, e: HistoryEntry) -> None:
            pending.append(e)

        def on_table_failure(self, exc: BaseException) -> None:
            raise AssertionError(exc)

    pub.subscribe(Sink())
    have, sequence = src.table.rowset, pub.sequence
    for cycle in range(60):
        src.step()
        g.run_cycle()
        assert len(pending) <= bound
        if cycle % take_every:
            continue
        run = pending.take()
        if run is None:
            assert pub.sequence == sequence
            continue
        assert run.entry.prev == have and run.count == pub.sequence - sequence
        run.entry.update.validate(have, src.table.rowset, columns=src.table.column_names)
        assert run.entry.update.apply(have) == src.table.rowset
        have, sequence = src.table.rowset, run.entry.sequence
