"""Fan-out (flight/streams/fanout.py): many subscribers of the same columns are written by one
thread from one message per update, join and leave mid-stream, and a stalled one is
detached without holding up the others; every subscriber converges to the server's state."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import flight.streams.fanout as fanout_module
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from tests.flight.conftest import Sub, viewport_rows, vp
from tests.oracle import SCHEMA, RandomSource

KV = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.float64())])


def _fanouts(server: TicktableServer, name: str) -> dict:
    publisher = server.registry.get(name).publisher
    assert publisher is not None
    with publisher._lock:
        return dict(publisher._fanouts)


def _started(server: TicktableServer, graph, subs: list[Sub], name: str = "src"):
    """Read each subscriber's first message, run a cycle; returns the table's publisher."""
    for s in subs:
        s.read()
    graph.run_cycle()
    publisher = server.registry.get(name).publisher
    assert publisher is not None
    return publisher


def test_many_subscribers_share_one_message_per_update(server, client, graph):
    """27 subscribers: 16 of all columns, 6 of a subset and 3 of one viewport share three
    fan-outs; one of another viewport has one of its own and one of triples is on its own.
    After every cycle each view is exact."""
    rng = np.random.default_rng(11)
    src = RandomSource(graph, "keyed", rng, max_rows=150)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    full = [Sub(client, "src") for _ in range(16)]
    part = [Sub(client, "src", columns=["Key", "Price"]) for _ in range(6)]
    boards = [Sub(client, "src", has_viewport=True, viewport=vp((0, 7))) for _ in range(3)]
    board = Sub(client, "src", has_viewport=True, viewport=vp((2, 5), (9, 12)))
    triples = Sub(client, "src", format=pb.DELTA_FORMAT_TRIPLES)
    subs = [*full, *part, *boards, board, triples]
    publisher = _started(server, graph, subs)
    for cycle in range(300):
        src.step()
        graph.run_cycle()
        for s in subs:
            s.until(publisher.sequence)
        want = src.table.to_arrow()
        for i, s in enumerate(full):
            assert s.view.to_arrow().equals(want), f"cycle {cycle}: full[{i}] differs"
        for i, s in enumerate(part):
            assert s.view.to_arrow().equals(want.select(["Key", "Price"])), f"cycle {cycle}: part[{i}]"
        for i, s in enumerate(boards):
            assert s.view.to_arrow().equals(viewport_rows(want, [(0, 7)])), f"cycle {cycle}: boards[{i}]"
        assert board.view.to_arrow().equals(viewport_rows(want, [(2, 5), (9, 12)])), f"cycle {cycle}"
        got = triples.view.to_arrow()
        assert got.equals(want.sort_by([(c, "ascending") for c in want.column_names])), f"cycle {cycle}"
    fans = _fanouts(server, "src")
    assert sorted(f.members for f in fans.values()) == [1, 3, 6, 16]
    for f in fans.values():  # one build per update (or per run of updates), not per subscriber
        assert 0 < f.messages <= publisher.sequence
    assert len(publisher.subscribers) == 1 + len(fans)  # triples, the fan-outs


def _until(s: Sub, sequence: int, seconds: float = 20.0) -> None:
    """``s.until(sequence)``, failing rather than hanging when an update never comes."""
    th = threading.Thread(target=s.until, args=(sequence,), daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"no message brought the view to sequence {sequence}"


def test_updates_go_out_on_the_event_loop_or_the_thread_and_stay_exact(server, client, graph):
    """A fan-out builds a message on the cycle's thread right after the cycle and writes it
    on the server's event loop when the lock is free and every stream has room, and leaves
    it to its thread otherwise: here another writer (as DAG changes and staged commits do)
    keeps taking the exclusive lock between cycles, and readers that fall behind fill their
    streams. In any mix every view is exact and every update is delivered once, in order."""
    rng = np.random.default_rng(17)
    src = RandomSource(graph, "keyed", rng, max_rows=150)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    subs = [Sub(client, "src") for _ in range(3)]
    publisher = _started(server, graph, subs)
    stop = threading.Event()

    def other_writer() -> None:
        while not stop.wait(0.0005):
            with graph.exclusive_lock():
                time.sleep(0.0005)

    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    try:
        for cycle in range(400):
            src.step()
            graph.run_cycle()
            if rng.random() < 0.5:  # else the updates pile up in the streams
                want = src.table.to_arrow()
                for i, s in enumerate(subs):
                    _until(s, publisher.sequence)
                    assert s.view.to_arrow().equals(want), f"cycle {cycle}: subscriber {i} differs"
    finally:
        stop.set()
        writer.join(5)
    for s in subs:
        _until(s, publisher.sequence)
        assert s.view.to_arrow().equals(src.table.to_arrow())
    (fan,) = _fanouts(server, "src").values()
    assert fan.members == 3
    assert 0 < fan.loop_messages < fan.messages <= publisher.sequence  # both ways were taken


def test_viewports_of_a_sorted_table_share_fan_outs_and_stay_exact(server, client, graph):
    """A sorted table shifts rows through the viewports every cycle: subscribers of the same
    viewport share a fan-out (one viewport delta per update), one scrolls away and back
    (leaving and rejoining), and every view equals the viewport of a fresh snapshot."""
    rng = np.random.default_rng(21)
    src = RandomSource(graph, "keyed", rng, max_rows=200)
    board = src.table.sort("Price")
    server.registry.add("board", board, "derived")
    publisher = server.registry.get("board").publisher
    assert publisher is not None
    top = [Sub(client, "board", has_viewport=True, viewport=vp((0, 10))) for _ in range(4)]
    mid = [Sub(client, "board", has_viewport=True, viewport=vp((40, 60))) for _ in range(2)]
    scroller = Sub(client, "board", has_viewport=True, viewport=vp((0, 10)))
    subs = [*top, *mid, scroller]
    for s in subs:
        s.read()
    where = [(0, 10)]
    for cycle in range(300):
        if cycle % 50 == 25:
            where = [(30, 45)] if where == [(0, 10)] else [(0, 10)]
            scroller.change(set_viewport=True, has_viewport=True, viewport=vp(*where))
            while scroller.view.viewport != where:
                scroller.read()
        src.step()
        graph.run_cycle()
        want = board.to_arrow()
        for s in subs:
            s.until(publisher.sequence)
        for i, s in enumerate(top):
            assert s.view.to_arrow().equals(viewport_rows(want, [(0, 10)])), f"cycle {cycle}: top[{i}]"
        for i, s in enumerate(mid):
            assert s.view.to_arrow().equals(viewport_rows(want, [(40, 60)])), f"cycle {cycle}: mid[{i}]"
        assert scroller.view.to_arrow().equals(viewport_rows(want, where)), f"cycle {cycle}: scroller"
    fans = {k[2]: f for k, f in _fanouts(server, "board").items()}
    assert fans[((0, 10),)].members == 4 + (where == [(0, 10)])
    assert fans[((40, 60),)].members == 2
    assert 0 < fans[((0, 10),)].messages <= publisher.sequence
    for s in subs:
        s.close()


def test_subscribers_join_leave_and_change_mid_stream(server, client, graph, monkeypatch):
    """Streams open, close, take a viewport and give it up again while cycles run. The
    event loop writes each message in runs of two members, giving way to cycles between
    runs (a stream that joins or leaves meanwhile is skipped, not written twice or late)."""
    monkeypatch.setattr(fanout_module, "LOOP_RUN", 2)
    gave_way = []
    give_way = graph.give_way
    monkeypatch.setattr(graph, "give_way", lambda: (gave_way.append(1), give_way()))
    rng = np.random.default_rng(12)
    src = RandomSource(graph, "keyed", rng, max_rows=120)
    server.registry.add("src", src.table, "keyed", keys=["Key"])
    publisher = server.registry.get("src").publisher
    assert publisher is not None
    live: list[Sub] = []
    with_viewport: dict[int, list[tuple[int, int]]] = {}
    for cycle in range(400):
        roll = rng.random()
        if roll < 0.08 or not live:
            s = Sub(client, "src")
            s.read()
            live.append(s)
        elif roll < 0.12 and len(live) > 1:
            live.pop(int(rng.integers(0, len(live)))).close()
        elif roll < 0.18:  # a viewport takes a stream out of its fan-out; clearing it, back in
            i = int(rng.integers(0, len(live)))
            if id(live[i]) in with_viewport:
                del with_viewport[id(live[i])]
                live[i].change(set_viewport=True, has_viewport=False)
                while live[i].view.viewport is not None:
                    live[i].read()
            else:
                b = int(rng.integers(0, 30))
                ranges = [(b, b + int(rng.integers(1, 10)))]
                with_viewport[id(live[i])] = ranges
                live[i].change(set_viewport=True, has_viewport=True, viewport=vp(*ranges))
                while live[i].view.viewport != ranges:
                    live[i].read()
        src.step()
        graph.run_cycle()
        want = src.table.to_arrow()
        for j, s in enumerate(live):
            s.until(publisher.sequence)
            ranges = with_viewport.get(id(s))
            expect = want if ranges is None else viewport_rows(want, ranges)
            assert s.view.to_arrow().equals(expect), f"cycle {cycle}: stream {j} differs"
    fans = _fanouts(server, "src")
    assert fans  # the plain streams were written by a fan-out
    assert sum(f.loop_messages for f in fans.values()) > 0 and len(gave_way) > 100  # in runs
    for s in live:
        s.close()


def test_stalled_subscriber_is_detached_and_the_others_keep_going(graph):
    """One client reads nothing while the stream's window fills: the fan-out detaches it
    after ``stall_seconds`` and keeps writing to the others, which see every update; the
    stalled one then catches up with coalesced deltas and ends exact."""
    srv = TicktableServer(graph, ServerConfig()).start()
    try:
        client = fl.connect(srv.location)
        t = srv.registry.create_source("t", KV, "keyed", keys=["k"]).table
        stalled = Sub(client, "t")
        stalled.read()
        cycles = 200
        done = threading.Event()
        errors: list[BaseException] = []
        steps: dict[int, list[int]] = {}
        views: dict[int, pa.Table] = {}

        def reader(i: int, ready: threading.Event) -> None:
            try:
                c = fl.connect(srv.location)
                s = Sub(c, "t")
                s.read()
                ready.set()
                seen = steps.setdefault(i, [])
                while not done.is_set() or s.view.sequence < srv.registry.get("t").publisher.sequence:
                    seen.append(s.read().step)
                views[i] = s.view.to_arrow()
                s.close()
                c.close()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = []
        for i in range(4):
            ready = threading.Event()
            th = threading.Thread(target=reader, args=(i, ready))
            th.start()
            assert ready.wait(30)
            threads.append(th)
        graph.run_cycle()
        rng = np.random.default_rng(13)
        for _ in range(cycles):  # ~70 KB per update: the stalled stream's window fills
            keys = rng.integers(0, 5000, 1000)
            t.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                               "s": pa.array(["x" * 60] * 1000, pa.string()),
                               "v": pa.array(rng.random(1000), pa.float64())}))
            graph.run_cycle()
        done.set()
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads), "readers held up by the stalled stream"
        assert not errors, errors
        want = t.to_arrow()
        assert len(views) == 4 and all(v.equals(want) for v in views.values())
        assert [s for s in srv.subscriptions if s._fanout_stalls] != []  # it was detached
        final = srv.registry.get("t").publisher.sequence
        n, most = 0, 0
        while stalled.view.sequence < final:
            meta = stalled.read()
            n, most = n + 1, max(most, meta.coalesced)
        assert stalled.view.to_arrow().equals(want)
        assert most > 1 or n < cycles  # it caught up with composed deltas
        stalled.close()
        client.close()
    finally:
        srv.shutdown()


def _wait_for(predicate, seconds: float = 20.0) -> bool:
    """Whether ``predicate()`` turned true within ``seconds`` (looked at every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


def test_members_handlers_wait_without_polling_and_leave_when_their_client_does(
        server, client, graph, monkeypatch):
    """A member's handler waits for the fan-out, its client or the server to notify it: it
    does not wake to look (1,000 members looking ten times a second held the cycles up,
    issue #39). The fan-out's watch thread looks for stalls; a client that cancels is seen
    through its call's end, at once."""
    from flight.rpc.flight_service import _Context

    looks: list[int] = []
    real = _Context.is_cancelled

    def counted(self: _Context) -> bool:
        looks.append(1)
        return real(self)

    monkeypatch.setattr(_Context, "is_cancelled", counted)
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(pa.table({"k": [1, 2], "s": ["a", "b"], "v": [1.0, 2.0]}, schema=KV))
    graph.run_cycle()
    subs = [Sub(client, "t") for _ in range(3)]
    for s in subs:
        s.read()
    assert _wait_for(lambda: sum(f.members for f in _fanouts(server, "t").values()) == 3)
    looks.clear()
    threading.Event().wait(0.5)  # idle: five stall-watch periods, no update
    assert looks == []  # no handler woke (each looked 5 times in 0.5 s before)
    n = len(server.subscriptions)
    subs[0].close()  # cancels the call: its handler is told, and leaves
    assert _wait_for(lambda: len(server.subscriptions) == n - 1)
    (fan,) = _fanouts(server, "t").values()
    assert fan.members == 2
    t.upsert(pa.table({"k": [3], "s": ["c"], "v": [3.0]}, schema=KV))
    graph.run_cycle()
    for s in subs[1:]:
        _until(s, server.registry.get("t").publisher.sequence)
        assert s.view.to_arrow().equals(t.to_arrow())
        s.close()


def _server_threads_in_streams() -> list[str]:
    """The threads (but the event loop's) now running a subscription's server code: a
    handler, a sender, a reader of the client's messages."""
    import sys

    names = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "ticktable-grpc-loop":
            continue
        f = frame
        while f is not None:
            if f.f_code.co_filename.endswith(("flight/streams/subscription.py",
                                               "flight/rpc/flight_service.py")):
                found.append(f"{names.get(ident)} in {f.f_code.co_name}")
                break
            f = f.f_back
    return found


def test_streams_in_a_fan_out_hold_no_thread_and_take_one_up_when_they_have_work(
        server, client, graph):
    """20 streams a fan-out writes: no handler, sender or reader thread waits for any of
    them (each held three before: a thousand subscribers were three thousand threads the
    collector walked, issue #39). A client's change, a failure and the client's leaving
    each take its stream up again on a thread, which catches up exactly and parks again or
    ends the stream."""
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    rng = np.random.default_rng(15)

    def step() -> None:
        keys = rng.integers(0, 200, 40)
        t.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                           "s": pa.array([f"s{k}" for k in keys], pa.string()),
                           "v": pa.array(rng.random(40), pa.float64())}))
        graph.run_cycle()

    step()
    subs = [Sub(client, "t") for _ in range(20)]
    for s in subs:
        s.read()
    assert _wait_for(lambda: sum(f.members for f in _fanouts(server, "t").values()) == 20)
    assert _wait_for(lambda: not _server_threads_in_streams()), _server_threads_in_streams()
    publisher = server.registry.get("t").publisher
    assert publisher is not None
    for _ in range(5):
        step()
        for s in subs:
            _until(s, publisher.sequence)
            assert s.view.to_arrow().equals(t.to_arrow())
    # a change takes one stream out: it answers on a thread of its own, then parks again
    subs[0].change(set_viewport=True, has_viewport=True, viewport=vp((0, 5)))
    while subs[0].view.viewport != [(0, 5)]:
        subs[0].read()
    step()
    _until(subs[0], publisher.sequence)
    assert subs[0].view.to_arrow().equals(viewport_rows(t.to_arrow(), [(0, 5)]))
    subs[0].change(set_viewport=True, has_viewport=False)
    while subs[0].view.viewport is not None:
        subs[0].read()
    assert _wait_for(lambda: sum(f.members for f in _fanouts(server, "t").values()) == 20)
    assert _wait_for(lambda: not _server_threads_in_streams()), _server_threads_in_streams()
    # a client leaving: its parked stream is taken up and ended, the others go on
    n = len(server.subscriptions)
    subs.pop().close()
    assert _wait_for(lambda: len(server.subscriptions) == n - 1)
    step()
    for s in subs:
        _until(s, publisher.sequence)
        assert s.view.to_arrow().equals(t.to_arrow())
    # a drop: every parked stream is told, NOT_FOUND
    assert server.registry.drop("t")
    graph.run_cycle()
    for s in subs:
        with pytest.raises(pa.ArrowKeyError, match="table 't' was dropped"):
            while True:
                s.read()
        s.close()
    assert _wait_for(lambda: len(server.subscriptions) == n - 20)
    assert _wait_for(lambda: not _server_threads_in_streams()), _server_threads_in_streams()


def test_min_interval_subscriber_stays_on_its_own(server, client, graph):
    """A stream asking for a minimum interval is not written per update by a fan-out."""
    t = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
    rng = np.random.default_rng(14)
    src = RandomSource.__new__(RandomSource)
    src.kind, src.rng, src.max_rows, src.table, src.next_key = "keyed", rng, 100, t, 0
    s = Sub(client, "t", min_update_interval_ms=1)
    s.read()
    plain = Sub(client, "t")
    plain.read()
    publisher = server.registry.get("t").publisher
    for _ in range(50):
        src.step()
        graph.run_cycle()
        s.until(publisher.sequence)
        plain.until(publisher.sequence)
        assert s.view.to_arrow().equals(t.to_arrow())
        assert plain.view.to_arrow().equals(t.to_arrow())
    assert [f.members for f in _fanouts(server, "t").values()] == [1]


def test_a_build_failing_after_the_cycle_ends_its_members_and_the_server_goes_on(
        server, client, graph):
    """A message that cannot be built after the cycle ends every member's stream with a one-line
    INTERNAL status (no traceback); a new subscriber gets a new fan-out and exact views."""
    t = server.registry.create_source("t", SCHEMA, "keyed", keys=["Key"]).table
    src = RandomSource.__new__(RandomSource)
    src.kind, src.rng, src.max_rows, src.table, src.next_key = "keyed", np.random.default_rng(18), 100, t, 0
    subs = [Sub(client, "t") for _ in range(2)]
    for s in subs:
        s.read()
    publisher = server.registry.get("t").publisher
    src.step()
    graph.run_cycle()
    for s in subs:
        _until(s, publisher.sequence)
    (fan,) = _fanouts(server, "t").values()
    assert fan.loop_messages == fan.messages == 1

    def broken(pending, count):
        raise ValueError("no message today")

    fan._build = broken
    src.step()
    graph.run_cycle()
    for s in subs:
        with pytest.raises(fl.FlightInternalError) as err:
            s.read()
        text = str(err.value).split(". Detail:")[0]
        assert "Traceback" not in text and "\n" not in text.strip() and ".py" not in text
    late = Sub(client, "t")
    late.read()
    for _ in range(20):
        src.step()
        graph.run_cycle()
        _until(late, publisher.sequence)
        assert late.view.to_arrow().equals(t.to_arrow())
    (fresh,) = _fanouts(server, "t").values()
    assert fresh is not fan and fresh.loop_messages > 0


class _Logged:
    """A member that logs its writes into a log shared with the graph's ``give_way``."""

    def __init__(self, log: list[tuple[str, int]], i: int) -> None:
        self.log, self.i, self.sequence = log, i, 0
        self.written = threading.Event()

    def write_shared(self, msg) -> None:
        self.log.append(("write", self.i))
        self.sequence = msg.sequence
        self.written.set()

    def ready(self) -> bool:
        return True

    def on_detached(self, exc) -> None:
        pass

    def on_stalled(self) -> None:
        pass

    def on_table_failure(self, exc) -> None:
        pass


def test_the_fanout_thread_gives_way_before_each_members_write(monkeypatch):
    """Without an event loop, the fan-out's thread writes every member itself: it gives way
    to a cycle (``UpdateGraph.give_way``) before each member's write, as the loop does
    between runs of members, so a thousand writes do not take the GIL from a cycle."""
    from engine.graph import UpdateGraph
    from flight.streams.codec import DeltaCodec
    from flight.streams.fanout import FanOut
    from flight.streams.registry import Publisher

    g = UpdateGraph()
    kv = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    t = g.keyed_table(kv, "k")
    t.upsert(pa.table({"k": [1, 2], "v": [1.0, 2.0]}, schema=kv))
    g.run_cycle()
    publisher = Publisher(t)
    log: list[tuple[str, int]] = []
    monkeypatch.setattr(g, "give_way", lambda: log.append(("give_way", -1)))
    codec = DeltaCodec(t, epoch=publisher.epoch, format=pb.DELTA_FORMAT_UPDATES,
                       columns=t.column_names, viewport=None, batch_rows=100)
    fan = FanOut(g, publisher, "key", codec, held=None, max_pending=8, stall_seconds=5.0,
                 name="t")
    members = [_Logged(log, i) for i in range(5)]
    with g.shared_lock():
        assert all(fan.join(m) for m in members)
    t.upsert(pa.table({"k": [2, 3], "v": [5.0, 6.0]}, schema=kv))
    g.run_cycle()
    assert all(m.written.wait(10) for m in members)
    writes = [i for i, entry in enumerate(log) if entry[0] == "write"]
    assert [log[i][1] for i in writes] == list(range(5))
    assert all(i > 0 and log[i - 1][0] == "give_way" for i in writes)
    for m in members:
        fan.leave(m)


def test_a_failure_while_a_member_steps_out_of_its_fan_out_still_ends_its_stream(
        server, client, graph, monkeypatch):
    """A member leaves its fan-out (a change from its client, a stall) and subscribes to the
    publisher again: a cycle failing the table between those two is told to neither. The
    stream must still end with the failure, not wait in a new fan-out for updates that never
    come (a links test hung so in CI: the mirror gave up while its subscriber stepped out to
    send the link's new status)."""
    t = server.registry.create_source("t", KV, "keyed", keys=["k"]).table
    t.upsert(pa.table({"k": [1, 2], "s": ["a", "b"], "v": [1.0, 2.0]}, schema=KV))
    graph.run_cycle()
    s = Sub(client, "t")
    s.read()
    assert _wait_for(lambda: sum(f.members for f in _fanouts(server, "t").values()) == 1)
    real_leave, failed = fanout_module.FanOut.leave, threading.Event()

    def broken() -> None:
        raise ValueError("the origin is gone")

    def leave_then_fail(self, member) -> None:
        real_leave(self, member)  # out of the fan-out, not yet back with the publisher
        if not failed.is_set():
            failed.set()
            monkeypatch.setattr(t, "_compute_update", broken)
            graph.run_cycle()  # the table fails now: told to no sink of this stream
            assert t.failure is not None

    monkeypatch.setattr(fanout_module.FanOut, "leave", leave_then_fail)
    s.change()  # an empty change: the member steps out to answer it
    ended: list[BaseException] = []

    def read_to_the_end() -> None:
        try:
            for _ in range(100):
                s.read()
        except Exception as exc:
            ended.append(exc)

    th = threading.Thread(target=read_to_the_end, daemon=True)
    th.start()
    th.join(20)
    assert failed.is_set()
    assert not th.is_alive(), "the stream never heard of its table's failure"
    assert len(ended) == 1 and isinstance(ended[0], pa.ArrowInvalid), ended  # as DoGet answers
    text = str(ended[0])
    assert "FAILED_PRECONDITION" in text and "table 't' failed: the origin is gone" in text
