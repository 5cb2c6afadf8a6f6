"""UpdateGraph: dependency order, one notification per table, failure, locks, periodic mode."""

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from engine.errors import InputError, TableFailed
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.table import DerivedTable
from engine.update import TableUpdate

SCHEMA = pa.schema([("x", pa.int64())])


class Mirror:
    """Child listener that mirrors the sum of its parents' adds as its own adds."""

    def __init__(self, name, log, fail_on=None):
        self.name, self.log, self.fail_on, self.table = name, log, fail_on, None

    def on_update(self, *ups):
        self.log.append((self.name, tuple(u is not None for u in ups)))
        if self.fail_on is not None and self.table.graph.step == self.fail_on:
            raise ValueError(f"{self.name} broke")
        n = sum(len(u.added) for u in ups if u is not None)
        start = self.table.rowset.last() + 1 if self.table.rowset else 0
        return TableUpdate.of(added=RowSet.from_range(start, start + n))


def derived(g, parents, name, log, fail_on=None):
    from engine.columns import NumpyColumnSource

    t = DerivedTable(g, SCHEMA, {"x": NumpyColumnSource(pa.int64())}, parents=parents, name=name)
    t.listener = Mirror(name, log, fail_on)
    t.listener.table = t
    return t


def test_diamond_notified_once_after_both_parents():
    g = UpdateGraph(validate=True)
    log = []
    a = g.append_only_table(SCHEMA, name="a")
    b = derived(g, [a], "b", log)
    c = derived(g, [a], "c", log)
    d = derived(g, [b, c], "d", log)
    a.append({"x": [1, 2]})
    g.run_cycle()
    assert log == [("b", (True,)), ("c", (True,)), ("d", (True, True))]
    assert d.size == 4 and d.last_step == g.step == 1


def test_silent_parents_mean_no_notification():
    g = UpdateGraph(validate=True)
    log = []
    a = g.append_only_table(SCHEMA, name="a")
    e = g.append_only_table(SCHEMA, name="e")
    j = derived(g, [a, e], "j", log)
    g.run_cycle()
    assert log == []
    e.append({"x": [1]})
    g.run_cycle()
    assert log == [("j", (False, True))]
    assert j.size == 1


def test_failing_listener_fails_table_and_descendants_only():
    g = UpdateGraph(validate=True)
    log, failures = [], []
    a = g.append_only_table(SCHEMA, name="a")
    bad = derived(g, [a], "bad", log, fail_on=2)
    below = derived(g, [bad], "below", log)
    fine = derived(g, [a], "fine", log)
    below.listen(lambda u, t: None, lambda exc, t: failures.append((t.name, str(exc))))
    for _ in range(3):
        a.append({"x": [1]})
        g.run_cycle()
    assert isinstance(bad.failure, ValueError)
    assert isinstance(below.failure, TableFailed)
    assert fine.failure is None and fine.size == 3
    assert failures == [("below", "parent table 'bad' failed")]
    with pytest.raises(TableFailed, match="bad"):
        bad.to_arrow()


def test_a_child_fails_with_its_failed_parent_whatever_its_other_parents_did():
    # the first parent updates in the very cycle the second fails: the child is failed, not
    # computed from the first parent's update
    g = UpdateGraph(validate=True)
    log = []
    a = g.append_only_table(SCHEMA, name="a")
    bad = derived(g, [a], "bad", log, fail_on=2)
    both = derived(g, [a, bad], "both", log)
    for _ in range(3):
        a.append({"x": [1]})
        g.run_cycle()
    assert isinstance(both.failure, TableFailed) and "'bad'" in str(both.failure)
    assert both.size == 2 and ("both", (True, True)) in log and len(log) == 3


@pytest.mark.parametrize("before", [False, True])
def test_a_write_staged_after_the_cycle_gate_closed_waits_for_the_next_cycle(before):
    # a cycle gate (durability's) sets aside what is staged when the cycle begins; a writer
    # let through as the gate closes stages into the next cycle, whether or not the table
    # had something staged before (an idle table sets aside nothing, without its lock)
    g = UpdateGraph(validate=True)
    a = g.append_only_table(SCHEMA, name="a")
    late: list = []

    class Gate:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            while late:
                late.pop()()

    g.cycle_gate = Gate()
    if before:
        a.append({"x": [1]})
    late.append(lambda: a.append({"x": [2]}))
    g.run_cycle()
    assert a.to_pandas().x.tolist() == ([1] if before else [])
    g.run_cycle()
    assert a.to_pandas().x.tolist() == ([1, 2] if before else [2])


def test_user_listener_that_raises_is_removed_not_the_table():
    g = UpdateGraph()
    a = g.append_only_table(SCHEMA)
    calls = []

    def boom(u, t):
        calls.append(1)
        raise RuntimeError("listener bug")

    a.listen(boom)
    for _ in range(2):
        a.append({"x": [1]})
        g.run_cycle()
    assert calls == [1] and a.failure is None and a.size == 2


def test_terminal_listeners_run_each_cycle_after_tables():
    g = UpdateGraph()
    a = g.append_only_table(SCHEMA)
    seen = []
    remove = g.add_terminal_listener(lambda step: seen.append((step, a.size, g.phase)))
    a.append({"x": [1]})
    g.run_cycle()
    g.run_cycle()
    remove()
    g.run_cycle()
    assert seen == [(1, 1, "updating"), (2, 1, "updating")]


def test_previous_values_visible_in_cycle_and_released_after():
    g = UpdateGraph(validate=True)
    k = g.keyed_table(pa.schema([("k", pa.int64()), ("v", pa.int64())]), "k")
    k.upsert({"k": [1], "v": [10]})
    g.run_cycle()
    seen = []
    k.listen(lambda u, t: seen.append((t.rows(u.modified.keys(), ["v"], prev=True).column("v").to_pylist(),
                                       t.rows(u.modified.keys(), ["v"]).column("v").to_pylist())))
    k.upsert({"k": [1], "v": [11]})
    g.run_cycle()
    assert seen == [([10], [11])]
    assert k.rows([0], ["v"], prev=True).column("v").to_pylist() == [11]


def test_shared_lock_gives_consistent_snapshots_in_periodic_mode():
    """Two tables written in the same cycle are always read at equal sizes under the lock."""
    g = UpdateGraph()
    a = g.append_only_table(SCHEMA)
    b = g.append_only_table(SCHEMA)
    stop = threading.Event()
    torn = []

    def writer():
        while not stop.is_set():
            with g.exclusive_lock():  # stage both in between cycles
                a.append({"x": [1]})
                b.append({"x": [1]})

    def reader():
        for _ in range(300):
            with g.shared_lock():
                if a.size != b.size:
                    torn.append((a.size, b.size))

    g.start(interval=0.001)
    w = threading.Thread(target=writer)
    w.start()
    readers = [threading.Thread(target=reader) for _ in range(3)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    stop.set()
    w.join()
    g.stop()
    assert torn == []
    assert a.size == b.size > 0 and g.step > 0


def test_periodic_mode_stops_cleanly():
    g = UpdateGraph()
    a = g.append_only_table(SCHEMA)
    done = threading.Event()
    a.listen(lambda u, t: done.set())
    g.start(interval=0.01)
    a.append({"x": np.arange(3)})
    assert done.wait(5)
    g.stop()
    step = g.step
    assert a.size == 3
    with pytest.raises(RuntimeError):
        g.start(0.01)
        g.start(0.01)
    g.stop()
    assert g.step >= step


def test_early_cycles_never_push_the_periodic_schedule_out():
    """200 writes each asking for an early cycle, then a write that asks for nothing: the
    next periodic cycle still comes within two intervals (the grid did not move)."""
    # the old loop pushed the grid one interval per early cycle: 100 s here; an interval
    # of 0.5 s leaves room for a loaded machine's thread wake-ups (0.2 s once took past 0.4)
    interval = 0.5
    graph = UpdateGraph()
    t = graph.append_only_table(pa.schema([("x", pa.int64())]))
    graph.start(interval)
    try:
        for i in range(200):
            t.append(pa.table({"x": [i]}))
            graph.request_cycle()
        deadline = time.monotonic() + 10
        while t.size < 200 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert t.size == 200
        t.append(pa.table({"x": [-1]}))  # no request: the periodic cycle must take it
        t0 = time.monotonic()
        while t.size < 201 and time.monotonic() - t0 < 10:
            time.sleep(0.001)
        assert time.monotonic() - t0 <= 2 * interval, time.monotonic() - t0
    finally:
        graph.stop()


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), "0.1"])
def test_start_refuses_a_period_that_is_not_above_zero(interval):
    g = UpdateGraph()
    with pytest.raises(InputError, match=r"^interval is .*: cycles need a period above 0 seconds$"):
        g.start(interval)  # type: ignore[arg-type]
    assert not g.running  # no cycle thread was started (0 crashed it with ZeroDivisionError)


def test_shared_lock_if_free_never_waits():
    """It takes the lock when no cycle runs or waits, says so when one does, and inside a
    cycle (the cycle's own thread) counts as held."""
    g = UpdateGraph()
    with g.shared_lock_if_free() as free:
        assert free
        with g.shared_lock_if_free() as again:  # readers share
            assert again
    cycle_in = threading.Event()
    release = threading.Event()

    def long_cycle(step):
        cycle_in.set()
        release.wait(5)

    g.add_terminal_listener(long_cycle)
    th = threading.Thread(target=g.run_cycle)
    th.start()
    assert cycle_in.wait(5)
    t = time.perf_counter()
    with g.shared_lock_if_free() as free:
        assert not free
    assert time.perf_counter() - t < 0.5  # answered without waiting for the cycle
    release.set()
    th.join(5)
    seen = []
    g.add_terminal_listener(lambda step: seen.append(g.shared_lock_if_free().__enter__()))
    g.run_cycle()
    assert seen == [True]


def test_a_reader_takes_the_lock_again_while_a_cycle_waits_for_it():
    """A read inside a read (``with graph.shared_lock(): table.to_arrow()``) while a cycle
    waits for the lock: the inner read must not queue behind the cycle, which waits for the
    outer one (before, both hung: a durable restart test hung so, 1 run in 12 under load).
    Then the cycle runs, once the outer read let go."""
    g = UpdateGraph()
    t = g.append_only_table(pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1, 2, 3]}))
    g.run_cycle()
    t.append(pa.table({"x": [4]}))
    holding, read, cycled = threading.Event(), threading.Event(), threading.Event()
    got: list[int] = []

    def reader() -> None:
        with g.shared_lock():
            holding.set()
            end = time.monotonic() + 10  # until the cycle waits for this reader
            while not g._lock._writers_waiting and time.monotonic() < end:
                time.sleep(0.001)
            got.append(len(t.to_arrow()))  # takes the shared lock again
            with g.shared_lock_if_free() as free:  # and this one says it holds it
                assert free
            read.set()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    assert holding.wait(10)
    cy = threading.Thread(target=lambda: (g.run_cycle(), cycled.set()), daemon=True)
    cy.start()
    assert read.wait(20), "the inner read queued behind the cycle waiting for the outer one"
    assert got == [3] and cycled.wait(20) and t.size == 4
    th.join(5)
    cy.join(5)
    with g.shared_lock():  # the lock is whole again: readers and cycles as before
        assert len(t.to_arrow()) == 4
    g.run_cycle()


def test_a_cycle_or_a_dag_change_inside_a_read_is_an_error_not_a_hang():
    """Taking the exclusive side while this thread reads would wait for itself: it raises,
    and the lock is whole afterwards."""
    g = UpdateGraph()
    t = g.append_only_table(pa.schema([("x", pa.int64())]))
    t.append(pa.table({"x": [1]}))
    with g.shared_lock():
        with pytest.raises(RuntimeError, match="holds the graph's shared lock"):
            g.run_cycle()
        with pytest.raises(RuntimeError, match="holds the graph's shared lock"):
            with g.exclusive_lock():  # as a server's table creation or drop takes it
                pass
    g.run_cycle()
    assert t.size == 1
    with g.exclusive_lock():
        assert t.size == 1


def test_call_after_cycle_runs_once_after_the_lock_is_let_go(caplog):
    """A callback asked for in a cycle runs after it, once, finding the lock free; one that
    raises is logged and the others still run; under an outer exclusive lock it runs still
    inside it."""
    g = UpdateGraph()
    got = []

    def after():
        with g.shared_lock_if_free() as free:
            got.append((g.phase, free))

    def boom():
        raise ValueError("boom")

    g.add_terminal_listener(lambda step: (g.call_after_cycle(boom), g.call_after_cycle(after))
                            if step == 1 else None)
    g.run_cycle()
    assert got == [("idle", True)]
    assert "after-cycle callback" in caplog.text and "boom" in caplog.text
    g.run_cycle()  # not asked for again: not run again
    assert got == [("idle", True)]
    g.add_terminal_listener(lambda step: g.call_after_cycle(after))
    probe = []
    with g.exclusive_lock():
        g.run_cycle()
        probe.append(len(got))
    assert probe == [2]  # ran before the outer lock was let go (its holder: "free")


def test_give_way_waits_for_a_running_cycle_and_its_after_callbacks(monkeypatch):
    """``give_way`` returns at once between cycles; while a cycle (or a callback it asked
    for) runs it waits for its end, but never past the cycle's first GIVE_WAY_SECONDS."""
    import engine.graph as graph_module

    monkeypatch.setattr(graph_module, "GIVE_WAY_SECONDS", 30.0)
    g = UpdateGraph()
    g.give_way()  # no cycle: no wait (a wait here would hang, the flag never cleared)
    reached = {n: threading.Event() for n in ("cycle", "after", "long")}
    release = {n: threading.Event() for n in ("cycle", "after", "long")}

    def hold(name):
        reached[name].set()
        assert release[name].wait(10)

    def listener(step):
        if step == 1:
            g.call_after_cycle(lambda: hold("after"))
            hold("cycle")
        elif step == 2:
            hold("long")

    g.add_terminal_listener(listener)
    cycle = threading.Thread(target=g.run_cycle)
    cycle.start()
    assert reached["cycle"].wait(5)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (g.give_way(), done.set()))
    waiter.start()
    assert not done.wait(0.2)  # it waits while the cycle holds ...
    release["cycle"].set()
    assert reached["after"].wait(5)
    assert not done.wait(0.2)  # ... and while the callback it asked for runs
    release["after"].set()
    assert done.wait(5)
    cycle.join(5)
    g.give_way()  # after the cycle: no wait

    monkeypatch.setattr(graph_module, "GIVE_WAY_SECONDS", 0.05)
    long_cycle = threading.Thread(target=g.run_cycle)
    long_cycle.start()
    assert reached["long"].wait(5)
    g.give_way()  # the cycle still holds: give_way stopped waiting on its own
    assert long_cycle.is_alive()
    release["long"].set()
    long_cycle.join(5)
