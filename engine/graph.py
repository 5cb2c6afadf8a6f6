"""UpdateGraph: the logical clock, the cycle, and the listener DAG (DESIGN.md §2).

A cycle takes the exclusive side of the graph's lock, advances ``step``, lets every source
apply its pending changes, then visits the tables in dependency order: a derived table is
notified once, after all its parents are satisfied (updated this cycle, or provably silent
because the visit order puts every parent first). A table whose listener raises is
*failed*, and so are its descendants; the rest of the graph keeps running. Terminal
listeners run at the end of the cycle, then previous values are released.

Readers outside the cycle take the shared side (:meth:`UpdateGraph.shared_lock`) for a
consistent snapshot across tables. Tables are visited in creation order, which is a
topological order because a table can only be created after its parents.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING

from engine.errors import InputError, TableFailed
from engine.priority import check_priority, set_thread_priority

if TYPE_CHECKING:
    from engine.columns import WritableColumnSource
    from engine.sources import AppendOnlyTable, KeyedTable, RingTable
    from engine.table import Table

__all__ = ["UpdateGraph"]

log = logging.getLogger(__name__)

#: How much of a cycle :meth:`UpdateGraph.give_way` waits for, at most (seconds): the
#: interpreter's switch interval. With 20 ms the soak's writers (200 subscribers, cycles of
#: about 35 ms) saw acknowledgement p99 7.6-8.3 s against 2.2-2.8 s: the loop, which also
#: reads their batches, stood still for a fifth of every cycle interval (bench/README.md).
GIVE_WAY_SECONDS = 0.005


class _SharedLock:
    """Many readers or one writer (the cycle), fair both ways.

    New readers wait while a writer waits, so snapshots cannot starve the cycle; when a
    writer leaves, the readers already waiting go first, so cycles cannot starve readers.
    A thread that holds the shared side takes it again without waiting (a read inside a
    read: ``with graph.shared_lock(): table.to_arrow()``); waiting there for a writer that
    waits for this very reader would hang both.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._readers_waiting = 0
        self._reader_turn = False
        self._writer: int | None = None
        self._writers_waiting = 0
        self._depth = threading.local()  # this thread's holds of the shared side

    def _again(self) -> bool:
        """Take the shared side once more if this thread holds it already."""
        depth = getattr(self._depth, "n", 0)
        if depth:
            self._depth.n = depth + 1
        return bool(depth)

    def acquire_shared(self) -> None:
        if self._again():
            return
        with self._cond:
            self._readers_waiting += 1
            while self._writer is not None or (self._writers_waiting and not self._reader_turn):
                self._cond.wait()
            self._readers_waiting -= 1
            self._readers += 1
            self._depth.n = 1
            if self._readers_waiting == 0:
                self._reader_turn = False
                self._cond.notify_all()

    def try_acquire_shared(self) -> bool:
        """Take the shared side if that needs no wait: no cycle runs or waits to run."""
        if self._again():
            return True
        with self._cond:
            if self._writer is not None or self._writers_waiting or self._reader_turn:
                return False
            self._readers += 1
            self._depth.n = 1
            return True

    def release_shared(self) -> None:
        self._depth.n -= 1
        if self._depth.n:
            return
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        if getattr(self._depth, "n", 0):  # it would wait for this very thread's read
            raise RuntimeError("this thread holds the graph's shared lock (a read): a cycle or "
                               "a change of tables inside it would wait for itself; do it "
                               "after the read")
        with self._cond:
            self._writers_waiting += 1
            while self._writer is not None or self._readers or self._reader_turn:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = threading.get_ident()

    def release_exclusive(self) -> None:
        with self._cond:
            self._writer = None
            if self._readers_waiting:
                self._reader_turn = True
            self._cond.notify_all()

    def held_exclusive_by_me(self) -> bool:
        return self._writer == threading.get_ident()


class UpdateGraph:
    """Logical clock and cycle driver for a DAG of tables.

    Parameters
    ----------
    validate
        Check every update with :meth:`TableUpdate.validate` (tests switch this on).

    Examples
    --------
    >>> g = UpdateGraph()
    >>> t = g.append_only_table(pa.schema([("x", pa.int64())]))
    >>> t.append(pa.table({"x": [1, 2]})); g.run_cycle(); t.size
    2
    """

    def __init__(self, *, validate: bool = False) -> None:
        self.step = 0
        self.phase = "idle"
        self.validate = validate
        self.last_cycle_seconds = 0.0
        #: The periodic thread's scheduling priority ("realtime" or "normal"), once started.
        self.priority = "normal"
        self._lock = _SharedLock()
        self._nodes: list[Table] = []
        self._nodes_mutex = threading.Lock()
        self._tracked: dict[int, WritableColumnSource] = {}
        self._terminal: list[Callable[[int], None]] = []
        self._after: list[Callable[[], None]] = []  # this cycle's call_after_cycle
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        # Held while a cycle starts, taken before the graph's own lock. The server's
        # durability layer holds it while it stages a journaled write: with a gate, every
        # source table takes its staged writes first (``_take_for_cycle``), then the gate
        # is let go, so a cycle takes whole records and writes go on staging meanwhile.
        self.cycle_gate: AbstractContextManager[object] | None = None
        # Clear while a cycle runs (its after-cycle callbacks included): give_way's flag.
        self._quiet = threading.Event()
        self._quiet.set()
        self._quiet_until = 0.0  # monotonic: give_way waits for the running cycle until then

    # registration -----------------------------------------------------------------
    def _add_node(self, table: Table) -> None:
        with self._nodes_mutex:
            self._nodes.append(table)

    def _remove_node(self, table: Table) -> None:
        with self._nodes_mutex:
            if table in self._nodes:
                self._nodes.remove(table)

    @property
    def tables(self) -> list[Table]:
        """All live tables in dependency order."""
        with self._nodes_mutex:
            return list(self._nodes)

    def track(self, source: WritableColumnSource) -> None:
        """Keep ``source``'s overwritten values as previous values until the cycle ends."""
        if id(source) not in self._tracked:
            source.begin_cycle()
            self._tracked[id(source)] = source

    def add_terminal_listener(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(step)`` at the end of every cycle; returns a function that removes it."""
        self._terminal.append(callback)

        def remove() -> None:
            if callback in self._terminal:
                self._terminal.remove(callback)

        return remove

    # locking ----------------------------------------------------------------------
    @contextmanager
    def shared_lock(self) -> Iterator[None]:
        """Hold off cycles while reading several tables consistently (re-entrant in a cycle)."""
        if self._lock.held_exclusive_by_me():
            yield
            return
        self._lock.acquire_shared()
        try:
            yield
        finally:
            self._lock.release_shared()

    @contextmanager
    def shared_lock_if_free(self) -> Iterator[bool]:
        """Like :meth:`shared_lock`, but never waits: yields whether the lock is held.

        For work that must not wait for the lock (a fan-out building right after a cycle,
        flight/streams/fanout.py): ``False`` when a cycle runs or waits to run, and the caller
        leaves the work to a thread that may wait."""
        if self._lock.held_exclusive_by_me():
            yield True
            return
        if not self._lock.try_acquire_shared():
            yield False
            return
        try:
            yield True
        finally:
            self._lock.release_shared()

    def call_after_cycle(self, callback: Callable[[], None]) -> None:
        """From inside a cycle: call ``callback()`` once the cycle has let go of the lock.

        It runs on the cycle's thread right after the lock is released (still inside the
        lock when the cycle ran under an outer :meth:`exclusive_lock`), once per call; an
        exception it raises is logged. A reader it wakes finds the cycle's state and no
        cycle in its way: it can take :meth:`shared_lock_if_free` without a wait.
        """
        self._after.append(callback)

    @contextmanager
    def exclusive_lock(self) -> Iterator[None]:
        """Run outside any cycle with nothing reading (DAG changes, staged commits)."""
        if self._lock.held_exclusive_by_me():
            yield
            return
        self._lock.acquire_exclusive()
        try:
            yield
        finally:
            self._lock.release_exclusive()

    def give_way(self) -> None:
        """Wait while a cycle runs, for at most :data:`GIVE_WAY_SECONDS` of it.

        For a busy thread that shares the GIL with the cycles and can wait a little: the
        server's event loop calls it between stream writes (flight/rpc/aio.py). Every time a
        cycle lets go of the GIL (a numpy call, a lock) such a thread takes it, and the
        cycle waits up to the interpreter's switch interval (5 ms) to get it back: with a
        thousand subscribers' writes on the loop, a cycle of 1 ms took 17 ms. Waiting
        here releases the GIL until the cycle and its after-cycle callbacks end, or its
        first :data:`GIVE_WAY_SECONDS` have passed (a long cycle shares the GIL again, so
        the loop keeps answering). Returns at once when no cycle runs.
        """
        if self._quiet.is_set():
            return
        left = self._quiet_until - time.monotonic()
        if left > 0:
            self._quiet.wait(left)

    # the cycle --------------------------------------------------------------------
    def run_cycle(self) -> int:
        """Run one update cycle now; returns the new step."""
        gate = self.cycle_gate
        after: list[Callable[[], None]] = []
        try:
            with ExitStack() as gated:
                if gate is not None:
                    gated.enter_context(gate)
                with self.exclusive_lock():
                    self._quiet_until = time.monotonic() + GIVE_WAY_SECONDS
                    self._quiet.clear()  # give_way from here until the callbacks ran
                    if gate is not None:
                        for node in self.tables:  # this cycle applies what is staged now
                            node._take_for_cycle()
                        gated.close()  # writes staged from here on wait for the next cycle
                    try:
                        return self._run_locked()
                    finally:  # taken under the lock: the next cycle's are its own
                        after, self._after = self._after, []
        finally:
            try:
                for callback in after:
                    try:
                        callback()
                    except Exception:
                        log.exception("after-cycle callback %r raised", callback)
            finally:
                self._quiet.set()

    def _run_locked(self) -> int:
        t0 = time.perf_counter()
        self.step += 1
        self.phase = "updating"
        touched: list[Table] = []
        try:
            for node in self.tables:
                self._visit(node, touched)
            for callback in list(self._terminal):
                try:
                    callback(self.step)
                except Exception:
                    log.exception("terminal listener %r raised; removed", callback)
                    self._terminal.remove(callback)
        finally:
            for source in self._tracked.values():
                source.end_cycle()
            self._tracked.clear()
            for node in touched:
                node._end_cycle()
            self.phase = "idle"
            self.last_cycle_seconds = time.perf_counter() - t0
        log.debug("cycle %d: %d tables updated in %.3f ms", self.step, len(touched),
                  self.last_cycle_seconds * 1e3)
        return self.step

    def _visit(self, node: Table, touched: list[Table]) -> None:
        if node.failure is not None:
            return
        if node.parents:
            silent = True
            for p in node.parents:  # one pass, no generators: every table pays it every cycle
                if p.failure is not None:
                    node._fail(TableFailed(f"parent table {p.name!r} failed"), cause=p.failure)
                    return
                if p._update is not None:
                    silent = False
            if silent:
                return  # every parent is silent this cycle, so is this table
        try:
            update = node._compute_update()
        except Exception as exc:
            log.error("table %r failed in cycle %d", node.name, self.step, exc_info=True)
            node._fail(exc)
            return
        if update is None or update.empty():
            node._refresh()
            return
        try:
            node._commit(update, validate=self.validate)
        except Exception as exc:
            log.error("table %r produced a bad update in cycle %d", node.name, self.step,
                      exc_info=True)
            node._fail(exc)
            return
        touched.append(node)
        node._notify(update)

    # periodic mode ----------------------------------------------------------------
    def start(self, interval: float = 0.1, *, priority: str = "normal") -> None:
        """Run cycles every ``interval`` seconds on a background thread until :meth:`stop`.

        Cycles run on a fixed grid of ``interval``; :meth:`request_cycle` runs one early
        without moving the grid, and a late cycle skips the ticks it missed.

        ``priority="realtime"`` runs the thread under ``SCHED_FIFO`` when the process may
        (:mod:`engine.priority`; ``ticktable serve`` asks for it), so other busy processes
        on the machine cannot delay a cycle; :attr:`priority` says what the thread got.

        Raises
        ------
        InputError
            If ``interval`` is not a number of seconds above 0, or ``priority`` is not
            ``"realtime"`` or ``"normal"``.
        """
        period: object = interval
        if not isinstance(period, int | float) or not period > 0:
            raise InputError(f"interval is {period!r}: cycles need a period above 0 seconds")
        check_priority(priority)
        if self._thread is not None:
            raise RuntimeError("the update graph is already running")
        self._stop.clear()
        started = threading.Event()

        def loop() -> None:
            self.priority = set_thread_priority(priority)
            started.set()
            # periodic cycles keep to a fixed grid; a cycle woken early (request_cycle) runs
            # in between and never moves the grid, so no burst of writes delays the next one
            next_at = time.monotonic()
            while not self._stop.is_set():
                try:
                    self.run_cycle()
                except Exception:
                    log.exception("update cycle %d raised", self.step)
                now = time.monotonic()
                if next_at <= now:  # this cycle was the periodic one (or late): the next tick
                    next_at += interval * (1 + (now - next_at) // interval)
                self._wake.wait(next_at - now)
                self._wake.clear()

        self._thread = threading.Thread(target=loop, name="ticktable-cycle", daemon=True)
        self._thread.start()
        started.wait()

    @property
    def running(self) -> bool:
        """Whether cycles run periodically on the background thread (:meth:`start`)."""
        return self._thread is not None

    def request_cycle(self) -> None:
        """Wake the periodic thread to run the next cycle now."""
        self._wake.set()

    def stop(self) -> None:
        """Stop periodic mode and wait for the running cycle to finish."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.priority = "normal"

    def __enter__(self) -> UpdateGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # table factories (the sources live in engine.sources) ---------------------------
    def append_only_table(self, schema: object, name: str | None = None) -> AppendOnlyTable:
        from engine.sources import AppendOnlyTable

        return AppendOnlyTable(self, schema, name=name)

    def keyed_table(self, schema: object, keys: list[str] | str, name: str | None = None) -> KeyedTable:
        from engine.sources import KeyedTable

        return KeyedTable(self, schema, keys, name=name)

    def ring_table(self, schema: object, capacity: int, name: str | None = None) -> RingTable:
        from engine.sources import RingTable

        return RingTable(self, schema, capacity, name=name)
