"""Durable mirrors (DESIGN.md §8, §11): a durable server keeps its mirrors' rows, row keys
and upstream position in its checkpoints, remembers what each mirror follows, and after its
own restart resumes every mirror from its checkpoint with the updates it missed.

In one process first: an in-memory origin ``A`` (cycles run by the test, one update per
cycle) and a durable server ``B`` mirroring its keyed table ``t``; a "crash" of ``B`` closes
its journal without the shutdown checkpoint (as tests/flight/durability/test_crash.py does).
Then the chain of real ``ticktable serve`` processes ``A -> B -> C``, ``B`` killed with
SIGKILL while a writer keeps changing ``A``.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

import ticktable as tt
from bench.crash import ServerProcess
from bench.ports import HeldPort
from engine.errors import TableExists
from engine.graph import UpdateGraph
from engine.sources import KeyedTable, ReplicaTable
from flight.pb import flight_pb2 as pb
from flight.server import ServerConfig, TicktableServer
from flight.streams.decoder import ReferenceView, read_message
from flight.wire import RecordKind, TableKind

KV = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def _eventually(check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Wait for ``check()`` across threads (the links' and the cycles'), up to ``timeout``."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.01)


State = tuple[list[int], pa.Table]


def _state(server: TicktableServer, name: str) -> State:
    """A table's row keys and rows (in row-key order), at one step."""
    table = server.registry.get(name).table
    with server.graph.shared_lock():
        return table.rowset.keys().tolist(), table.to_arrow(lock=False)


def _same(a: State, b: State) -> bool:
    return a[0] == b[0] and a[1].equals(b[1])


class Origin:
    """An in-memory server holding keyed table ``t``; each :meth:`write` is one update."""

    def __init__(self) -> None:
        self.graph = UpdateGraph(validate=True)
        self.server = TicktableServer(self.graph, ServerConfig()).start()
        entry = self.server.registry.create_source("t", KV, TableKind.KEYED, keys=["k"])
        assert isinstance(entry.table, KeyedTable)
        self.table = entry.table
        self.rng = random.Random(7)
        self.live: set[int] = set()

    @property
    def location(self) -> str:
        return self.server.location

    def write(self, cycles: int) -> None:
        """Upserts of new and old keys and deletes, so freed row keys are reused."""
        for _ in range(cycles):
            ks = self.rng.sample(range(300), 12)
            self.table.upsert({"k": ks, "v": [self.rng.random() for _ in ks],
                               "s": [f"s{self.rng.randrange(50)}" for _ in ks]})
            self.live |= set(ks)
            gone = self.rng.sample(sorted(self.live), min(4, len(self.live)))
            self.graph.run_cycle()
            self.table.delete({"k": gone})
            self.live -= set(gone)
            self.graph.run_cycle()

    def state(self) -> State:
        return _state(self.server, "t")

    def close(self) -> None:
        self.server.shutdown()


class Mirror:
    """A durable server over ``data_dir``; its cycles run once :meth:`run` is called."""

    def __init__(self, data_dir: Path, **config: Any) -> None:
        self.graph = UpdateGraph(validate=True)
        self.server = TicktableServer(self.graph, ServerConfig(
            data_dir=data_dir, **{"checkpoint_seconds": 3600.0, **config})).start()

    def run(self) -> Mirror:
        self.graph.start(0.01)
        return self

    def stop(self, *, crash: bool = False) -> None:
        if crash:  # no shutdown checkpoint: what the last one holds, and the journal
            self.server.durability.close(checkpoint=False)
        self.server.shutdown()
        self.graph.stop()

    def synced(self, origin: Origin, name: str = "t") -> None:
        want = origin.state()
        _eventually(lambda: name in self.server.registry.names()
                    and _same(_state(self.server, name), want), what=f"mirror {name} = origin")


@pytest.fixture
def origin() -> Iterator[Origin]:
    a = Origin()
    yield a
    a.close()


@pytest.fixture
def mirrors() -> Iterator[list[Mirror]]:
    started: list[Mirror] = []
    yield started
    for m in started:
        if m.server._grpc is not None:
            m.stop()


def _start(started: list[Mirror], data_dir: Path, **config: Any) -> Mirror:
    started.append(Mirror(data_dir, **config))
    return started[-1]


def _records(m: Mirror, kind: RecordKind) -> list[Any]:
    journal = m.server.durability.journal
    assert journal is not None
    return [r for r in journal.records() if r.kind == kind]


@pytest.mark.parametrize("how", ["flag", "run time"])
def test_a_mirror_resumes_from_its_checkpoint_with_deltas(origin, mirrors, tmp_path, how):
    # "flag": given by --mirror at each start; "run time": server.mirror, then remembered
    data = tmp_path / "b"
    flag = [f"{origin.location}/t"] if how == "flag" else []
    origin.write(5)
    b = _start(mirrors, data, mirrors=flag).run()
    if how == "run time":
        b.server.mirror(f"{origin.location}/t")
    b.synced(origin)
    b.server.durability.checkpoint()
    saved = _state(b.server, "t")
    position = b.server.registry.get("t").table.position
    assert position == (origin.server.registry.get("t").publisher.epoch, 10)
    b.stop(crash=True)

    origin.write(6)  # missed while B is down; A's history still holds every update
    b = _start(mirrors, data, mirrors=flag)  # its cycles do not run yet: the restored state stays
    entry = b.server.registry.get("t")
    assert entry.kind == TableKind.MIRROR and entry.durable
    assert isinstance(entry.table, ReplicaTable) and list(entry.table.position) == list(position)
    assert _same(_state(b.server, "t"), saved)
    link = b.server.links.get("t")
    assert link is not None and link.table is entry.table  # resumes the restored replica
    b.run()
    b.synced(origin)
    assert (link.resumed_with_deltas, link.resumed_with_snapshot) == (1, 0)
    assert link.wait_in_sync(10)
    origin.write(2)  # and it follows on
    b.synced(origin)
    assert list(entry.table.position) == [origin.server.registry.get("t").publisher.epoch, 26]


def _where_v_above_half(state: State) -> State:
    """``state`` filtered from scratch by ``v > 0.5``, row keys included."""
    keys, rows = state
    mask = pc.fill_null(pc.greater(rows["v"], 0.5), False)
    return [k for k, m in zip(keys, mask.to_pylist(), strict=True) if m], rows.filter(mask)


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_filtered_mirror_comes_back_with_its_filter_and_resumes(origin, mirrors, tmp_path,
                                                                  checkpointed):
    """The filter is journaled and checkpointed with the spec; after a crash the mirror
    subscribes with the same bytes: from its checkpoint, the origin's filtered table (still
    lingering there) answers with the missed deltas; from the journal alone, with a
    snapshot, as any mirror."""
    from flight.links import MirrorSpec
    from flight.links.spec import encode_filter

    data = tmp_path / "b"
    predicate = encode_filter(pc.field("v") > 0.5, KV, "t")
    origin.write(4)
    b = _start(mirrors, data).run()
    b.server.mirror(MirrorSpec(origin.location, "t", "half", filter=predicate))

    def synced() -> None:
        want = _where_v_above_half(origin.state())
        _eventually(lambda: "half" in b.server.registry.names()
                    and _same(_state(b.server, "half"), want), what="half = origin filtered")

    synced()
    if checkpointed:
        b.server.durability.checkpoint()
    b.stop(crash=True)
    origin.write(3)  # missed while B is down
    b = _start(mirrors, data)
    assert b.server.durability.mirrors["half"]["filter"]  # remembered, as base64
    link = b.server.links.get("half")
    assert link is not None and link.spec.filter == predicate
    b.run()
    synced()
    want = (1, 0) if checkpointed else (0, 0)  # from the journal: a first subscription
    assert (link.resumed_with_deltas, link.resumed_with_snapshot) == want
    (entry,) = origin.server.filters.entries()  # one filtered table all along
    assert origin.server.filters.watchers(entry) == 1
    origin.write(2)
    synced()


def test_a_mirror_started_at_run_time_comes_back_from_the_journal(origin, mirrors, tmp_path):
    # no checkpoint since it started: its record brings it back, and a snapshot its rows
    data = tmp_path / "b"
    origin.write(3)
    b = _start(mirrors, data).run()
    b.server.mirror(f"{origin.location}/t")
    b.synced(origin)
    b.stop(crash=True)
    origin.write(2)
    b = _start(mirrors, data)
    assert "t" not in b.server.registry.names()  # nothing checkpointed: made at connection
    assert list(b.server.durability.mirrors) == ["t"]
    b.run()
    b.synced(origin)
    assert b.server.registry.get("t").durable
    b.server.durability.checkpoint()  # now in the checkpoint too, and the journal is cut
    assert _records(b, RecordKind.MIRROR) == []
    b.stop(crash=True)
    b = _start(mirrors, data)
    assert b.server.links.get("t") is not None and list(b.server.durability.mirrors) == ["t"]


def test_a_mirror_given_again_by_flag_starts_once(origin, mirrors, tmp_path):
    data = tmp_path / "b"
    flag = [f"{origin.location}/t=copy"]
    origin.write(3)
    b = _start(mirrors, data, mirrors=flag).run()
    assert len(_records(b, RecordKind.MIRROR)) == 1
    b.synced(origin, "copy")
    b.stop()  # the shutdown checkpoint
    origin.write(2)
    b = _start(mirrors, data, mirrors=flag).run()
    assert [link.spec.name for link in b.server.links.links()] == ["copy"]
    assert _records(b, RecordKind.MIRROR) == []  # remembered as it is: nothing journaled
    b.synced(origin, "copy")
    link = b.server.links.get("copy")
    assert link is not None and (link.resumed_with_deltas, link.resumed_with_snapshot) == (1, 0)
    b.stop()
    b = _start(mirrors, data).run()  # without the flag: still remembered, still resumed
    b.synced(origin, "copy")
    assert [link.spec.name for link in b.server.links.links()] == ["copy"]


def test_a_mirror_keeps_no_token_and_resumes_with_the_servers(origin, mirrors, tmp_path):
    data = tmp_path / "b"
    origin.write(1)
    b = _start(mirrors, data, mirror_token="sekrit-1").run()
    link = b.server.mirror(f"{origin.location}/t")
    assert link.spec.token == "sekrit-1"
    b.synced(origin)
    assert all(b"sekrit" not in r.meta for r in _records(b, RecordKind.MIRROR))
    b.stop()
    manifest = next((data / "checkpoints").glob("ckpt-*/manifest.json")).read_bytes()
    assert b"sekrit" not in manifest and b'"mirror"' in manifest
    b = _start(mirrors, data, mirror_token="sekrit-2")
    link = b.server.links.get("t")
    assert link is not None and link.spec.token == "sekrit-2"


def test_a_dropped_mirror_stays_dropped(origin, mirrors, tmp_path):
    data = tmp_path / "b"
    origin.write(2)
    b = _start(mirrors, data).run()
    b.server.mirror(f"{origin.location}/t")
    b.synced(origin)
    b.server.durability.checkpoint()  # the mirror is in the checkpoint ...
    b.server.action("drop_table", pb.DropTableRequest(name="t").SerializeToString())
    assert b.server.links.get("t") is None
    b.stop(crash=True)  # ... and its drop only in the journal
    b = _start(mirrors, data).run()
    assert "t" not in b.server.registry.names() and b.server.links.links() == []
    assert b.server.durability.mirrors == {}
    b.server.mirror(f"{origin.location}/t")  # the name is free again
    b.synced(origin)


def test_a_name_a_mirror_holds_stays_refused_after_a_restart(mirrors, tmp_path):
    # a mirror that never reached its origin holds no table, but its name: a creation of
    # that name is refused, and the refusal (journaled: the journal keeps what was asked)
    # is a refusal again in the replay, before the mirror's link starts
    data = tmp_path / "b"
    b = _start(mirrors, data).run()
    with HeldPort() as nobody:  # refused: the origin never answers
        b.server.mirror(f"grpc://127.0.0.1:{nobody.port}/t")
        with pytest.raises(TableExists, match="'t' is taken by a mirror of grpc://127.0.0.1"):
            b.server.durability.create_table("t", KV, "keyed", keys=["k"], capacity=0,
                                             if_not_exists=False)
        b.stop(crash=True)
        b = _start(mirrors, data)
        assert "t" not in b.server.registry.names()
        assert [link.spec.name for link in b.server.links.links()] == ["t"]
        assert b.server.links.forget("t")  # the name is free with the mirror gone
        b.server.durability.create_table("t", KV, "keyed", keys=["k"], capacity=0,
                                         if_not_exists=False)
        b.stop(crash=True)
        b = _start(mirrors, data)
    assert b.server.registry.get("t").kind == TableKind.KEYED and b.server.links.links() == []


def test_a_remembered_mirror_whose_name_was_taken_does_not_stop_the_start(mirrors, tmp_path,
                                                                           caplog):
    # a journal written before mirrors held their names from their start: a mirror that
    # never reached its origin, then a table created under its name (a record without
    # "claims", as such a server wrote it): the table is restored, the mirror is not
    data = tmp_path / "b"
    b = _start(mirrors, data).run()
    with HeldPort() as nobody:  # refused: the origin never answers
        b.server.mirror(f"grpc://127.0.0.1:{nobody.port}/t")
        durability = b.server.durability
        meta = {"schema": base64.b64encode(KV.serialize().to_pybytes()).decode(), "kind": "keyed",
                "keys": ["k"], "capacity": 0, "if_not_exists": False, "limits": durability._limits()}
        b.server.registry.claims.clear()  # as before: nothing held the name
        durability._record(RecordKind.CREATE, "t", meta, b"", lambda seq: durability._create("t", meta))
        b.stop(crash=True)
        b = _start(mirrors, data)
        assert b.server.registry.get("t").kind == TableKind.KEYED and b.server.links.links() == []
        assert any("mirror 't'" in r.getMessage() and "not resumed" in r.getMessage()
                   for r in caplog.records if r.levelname == "ERROR")
        # no mirror holds the name since: the table dropped and made again comes back so
        b.server.durability.drop_table("t")
        b.server.durability.create_table("t", KV, "append", keys=[], capacity=0, if_not_exists=False)
        b.stop(crash=True)
        b = _start(mirrors, data)
    assert b.server.registry.get("t").kind == TableKind.APPEND and b.server.links.links() == []


def test_mirror_changes_count_toward_the_next_checkpoint(origin, mirrors, tmp_path):
    # not journaled, so the checkpoint thresholds are what keeps the position recent
    b = _start(mirrors, tmp_path / "b", checkpoint_bytes=1).run()
    b.server.mirror(f"{origin.location}/t")
    b.synced(origin)
    durability = b.server.durability
    _eventually(lambda: durability.checkpoints >= 1, what="a checkpoint after the mirror began")
    n = durability.checkpoints
    origin.write(1)  # only the mirror changes on B
    _eventually(lambda: durability.checkpoints > n, what="a checkpoint after the mirror changed")
    b.synced(origin)
    _eventually(lambda: b.server.registry.get("t").table.position
                == (origin.server.registry.get("t").publisher.epoch, 2), what="position")


# ---------------------------------------------------------------- real processes, SIGKILL
def _subscribed(location: str, name: str) -> State:
    """A table's row keys and rows as a subscriber gets them: its first message, a snapshot
    (a DoGet's rows carry no row keys)."""
    client = fl.connect(location)
    try:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(name))
        writer.begin(pa.schema([]))
        writer.write_metadata(pa.py_buffer(pb.ClientMessage(
            subscribe=pb.SubscriptionRequest(table=name)).SerializeToString()))
        view = ReferenceView(reader.schema)
        view.apply(read_message(reader, reader.schema))
        writer.done_writing()
        reader.cancel()
        return view.keys.tolist(), view.to_arrow()
    finally:
        client.close()


def _stats(location: str, name: str) -> pb.TableStats:
    """Table ``name`` as the server's ``stats`` action shows it (a mirror: with its link)."""
    client = fl.connect(location)
    try:
        stats = pb.Stats()
        result = next(iter(client.do_action(fl.Action("stats", b""))))
        stats.ParseFromString(result.body.to_pybytes())
    finally:
        client.close()
    return next(t for t in stats.tables if t.name == name)


def _write(location: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """Upserts and deletes into ``t``, each push visible before the next, until ``stop``."""
    rng = random.Random(11)
    live: set[int] = set()
    try:
        with tt.connect(location, timeout=30) as c:
            while not stop.is_set():
                ks = rng.sample(range(400), 20)
                c.push("t", pd.DataFrame({"k": ks, "v": [rng.random() for _ in ks],
                                          "s": [f"s{rng.randrange(50)}" for _ in ks]}),
                       mode="upsert")
                live |= set(ks)
                if rng.random() < 0.5:
                    gone = rng.sample(sorted(live), 8)
                    c.push("t", pd.DataFrame({"k": gone}), mode="delete")
                    live -= set(gone)
                stop.wait(0.03)
    except BaseException as exc:
        errors.append(exc)


def test_a_chain_of_servers_survives_a_sigkill_of_its_middle(processes, tmp_path):
    """A -> B -> C, B durable and killed with SIGKILL while A changes; B restarted with the
    same flags resumes from its checkpoint with deltas, and all three end equal."""
    def serve(name: str, port: int, *flags: str, **kw: Any) -> ServerProcess:
        p = ServerProcess(tmp_path / name, tmp_path / f"{name}.log", port=port,
                          args=("--http-port", "-1", *flags), **kw)
        processes.append(p)
        return p

    a = serve("a", 0, interval=0.05)
    with tt.connect(a.location, timeout=30) as c:
        c.create_table("t", KV, "keyed", keys=["k"])
        c.push("t", pd.DataFrame({"k": range(200), "v": [0.5] * 200, "s": ["x"] * 200}))
    b_port = HeldPort()  # B's, kept from other processes while B is down
    b_flags = ("--mirror", f"{a.location}/t")
    b = serve("b", b_port.port, *b_flags, checkpoint_seconds=0.5)
    c_proc = serve("c", 0, "--mirror", f"{b.location}/t", checkpoint_seconds=0.5)
    stop = threading.Event()
    errors: list[BaseException] = []
    writer = threading.Thread(target=_write, args=(a.location, stop, errors), daemon=True)
    writer.start()
    try:
        checkpoints = tmp_path / "b" / "checkpoints"

        def mirror_checkpointed() -> bool:
            try:  # CURRENT may move on, and the checkpoint it named go, while read
                current = (checkpoints / "CURRENT").read_text()
                return b'"mirror"' in (checkpoints / current / "manifest.json").read_bytes()
            except OSError:
                return False

        _eventually(mirror_checkpointed, what="a checkpoint of B holding the mirror")
        held = (checkpoints / "CURRENT").read_text()
        _eventually(lambda: (checkpoints / "CURRENT").read_text() != held,
                    what="a later checkpoint of B, taken while A changes")
        b.kill()

        def a_moved_on(updates: int) -> None:
            start = _stats(a.location, "t").sequence
            _eventually(lambda: _stats(a.location, "t").sequence >= start + updates,
                        what=f"{updates} updates of A")

        a_moved_on(5)  # while B is down
        b = serve("b", b_port.port, *b_flags, checkpoint_seconds=0.5)
        a_moved_on(10)  # while B catches up
    finally:
        stop.set()
        writer.join(30)
        b_port.close()
    assert not errors, errors
    want = _subscribed(a.location, "t")
    assert len(want[0]) > 0

    def chain_equal() -> bool:
        return all(_same(_subscribed(p.location, "t"), want) for p in (b, c_proc))

    _eventually(chain_equal, timeout=30, what="B and C equal to A")
    link = _stats(b.location, "t").link
    assert link.in_sync
    assert (link.resumed_with_deltas, link.resumed_with_snapshot) == (1, 0), link
    link = _stats(c_proc.location, "t").link  # B restarted: a new epoch, C took a snapshot
    assert link.in_sync and link.resumed_with_snapshot >= 1, link
    for p in (c_proc, b, a):
        assert p.stop() == 0, p.stderr_tail()
