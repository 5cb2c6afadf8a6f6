"""The delta codec (flight/streams/codec.py) and its inverse, the reference decoder.

Example messages first (a three-row table, exact metadata), then the round trip: random
updates of a random table (shifts included) encoded by the codec, framed, decoded by
:class:`~flight.streams.decoder.ReferenceView` / ``TriplesView``, and compared with the
table after every message: row keys, order and values, for ``UPDATES`` with and without
a viewport (changing mid-stream) and a column subset, and for ``TRIPLES``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.differential.zset import ZSet
from engine.graph import UpdateGraph
from engine.rowset import RowSet
from engine.sources import KeyedTable
from engine.table import Table
from engine.update import TableUpdate
from flight.pb import flight_pb2 as pb
from flight.rpc.framing import IpcDecoder, schema_frame
from flight.streams.codec import DeltaCodec, Encoded, end_of_stream, record_batches, triples_schema
from flight.streams.decoder import Message, ReferenceView, TriplesView, decode_rows, read_message
from flight.streams.pending import PendingUpdates, compose_run
from flight.streams.registry import MAX_SHARED_DELTA_BYTES, HistoryEntry, Publisher
from tests.oracle import SCHEMA, RandomSource
from tests.shifting import ShiftingSource

KV = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def decode(schema: pa.Schema, enc: Encoded) -> Message:
    """One message's frames through the server's framing and the reference reader; every
    frame belongs to the message."""
    dec = IpcDecoder(iter([schema_frame(schema), *enc.frames]), "test")
    dec.read_schema()
    msg = read_message(dec, schema)
    try:
        dec.read_chunk()
    except StopIteration:
        return msg
    raise AssertionError("frames left after the message")


def keyed(graph: UpdateGraph) -> tuple[KeyedTable, Publisher]:
    t = graph.keyed_table(KV, "k")
    t.upsert(pa.table({"k": [1, 2, 3], "v": [1.0, 2.0, 3.0]}, schema=KV))
    graph.run_cycle()
    return t, Publisher(t)


def codec(table: Table, publisher: Publisher, **kw: Any) -> DeltaCodec:
    opts = {"format": pb.DELTA_FORMAT_UPDATES, "columns": table.column_names,
            "viewport": None, "batch_rows": 100, **kw}
    return DeltaCodec(table, epoch=publisher.epoch, **opts)


# ------------------------------------------------------------------------- examples
def test_a_snapshot_lists_every_row_and_carries_their_values():
    g = UpdateGraph(validate=True)
    t, pub = keyed(g)
    c = codec(t, pub)
    enc = c.snapshot(sequence=pub.sequence, step=g.step)
    assert (enc.sequence, enc.step, enc.held) == (0, g.step, None)
    assert len(enc.frames) == 1  # one batch, carrying the metadata
    m = decode(c.schema, enc)
    assert m.meta.is_snapshot and m.meta.table_size == 3 and list(m.meta.columns) == ["k", "v"]
    assert decode_rows(m.meta.added_rows).tolist() == [0, 1, 2]
    assert m.added.to_pydict() == {"k": [1, 2, 3], "v": [1.0, 2.0, 3.0]}


def test_a_delta_carries_row_sets_and_only_the_changed_rows():
    g = UpdateGraph(validate=True)
    t, pub = keyed(g)
    c = codec(t, pub, columns=["v"])
    seen: list[HistoryEntry] = []
    pub.subscribe(Sink(seen))
    t.upsert(pa.table({"k": [2, 4], "v": [20.0, 4.0]}, schema=KV))
    t.delete(pa.table({"k": [1]}))
    g.run_cycle()
    (e,) = seen
    enc = c.delta(e.update, held=None, sequence=e.sequence, step=g.step, count=1)
    m = decode(c.schema, enc)
    assert decode_rows(m.meta.removed_rows).tolist() == [0]
    assert decode_rows(m.meta.added_rows).tolist() == decode_rows(m.meta.added_data_rows).tolist()
    assert [(x.column, decode_rows(x.rows).tolist()) for x in m.meta.modified] == [("v", [1])]
    assert m.meta.num_added_batches == m.meta.num_modified_batches == 1
    assert m.added.to_pydict() == {"k": [None], "v": [4.0]}  # k is not carried
    assert m.modified.to_pydict() == {"k": [None], "v": [20.0]}


def test_a_viewport_delta_sends_rows_that_enter_it_and_says_which_it_holds():
    g = UpdateGraph(validate=True)
    t, pub = keyed(g)
    c = codec(t, pub, viewport=[(0, 2)])
    first = c.snapshot(sequence=0, step=g.step)
    assert first.held == RowSet.from_keys([0, 1])
    seen: list[HistoryEntry] = []
    pub.subscribe(Sink(seen))
    t.delete(pa.table({"k": [1]}))
    g.run_cycle()
    (e,) = seen
    enc = c.delta(e.update, held=first.held, sequence=e.sequence, step=g.step, count=1)
    assert enc.held == RowSet.from_keys([1, 2])
    m = decode(c.schema, enc)
    assert decode_rows(m.meta.added_data_rows).tolist() == [2]  # moved into the viewport
    assert m.added.to_pydict() == {"k": [3], "v": [3.0]}


def test_a_change_only_message_is_metadata_alone_and_batches_respect_the_row_limit():
    g = UpdateGraph(validate=True)
    t, pub = keyed(g)
    c = codec(t, pub, batch_rows=2)
    assert len(c.snapshot(sequence=0, step=g.step).frames) == 2  # 3 rows: 2 + 1
    enc = c.delta(TableUpdate(), held=None, sequence=0, step=g.step, count=0)
    assert len(enc.frames) == 1 and decode(c.schema, enc).meta.num_added_batches == 0
    (end,) = end_of_stream("bye", sequence=4, step=5, format=pb.DELTA_FORMAT_UPDATES)
    dec = IpcDecoder(iter([schema_frame(KV), end]), "test")
    dec.read_schema()
    chunk = dec.read_chunk()
    assert chunk.app_metadata is not None and chunk.data is None
    meta = pb.UpdateMetadata.FromString(chunk.app_metadata.to_pybytes())
    assert meta.end_of_stream and meta.error == "bye" and (meta.sequence, meta.step) == (4, 5)


def test_triples_carry_old_values_at_minus_one_in_the_stream_schema():
    g = UpdateGraph(validate=True)
    t, pub = keyed(g)
    c = codec(t, pub, format=pb.DELTA_FORMAT_TRIPLES, columns=["v"])
    assert c.schema == triples_schema(KV) and c.schema.names == ["k", "v", "__time", "__diff"]
    batches: list[ZSet] = []

    class TriplesSink(Sink):
        def on_table_update(self, entry: HistoryEntry) -> None:
            batches.append(c.update_triples(entry.update, entry.step))  # in the cycle

    pub.subscribe(TriplesSink([]))
    t.upsert(pa.table({"k": [1, 2], "v": [10.0, 2.0]}, schema=KV))  # 2 unchanged in v
    g.run_cycle()
    (z,) = batches
    m = decode(c.schema, c.triples(z, sequence=1, step=g.step, count=1))
    got = m.added.sort_by([("__diff", "ascending")]).to_pydict()
    assert got == {"k": [None, None], "v": [1.0, 10.0], "__time": [g.step] * 2, "__diff": [-1, 1]}


def test_record_batches_slice_a_delta_without_combining_aligned_chunks():
    one = pa.table({"k": pa.array(np.arange(10))})
    assert [b.num_rows for b in record_batches(one, 3)] == [3, 3, 3, 1]
    ragged = pa.table({"k": pa.chunked_array([np.arange(3), np.arange(7)]),
                       "v": pa.chunked_array([np.arange(6), np.arange(4)])})
    assert [b.num_rows for b in record_batches(ragged, 5)] == [5, 5]


def test_streams_opening_at_one_state_share_one_snapshot_until_the_table_changes():
    g = UpdateGraph()
    t, pub = keyed(g)
    builds: list[Encoded] = []

    def snap(c: DeltaCodec) -> Encoded:
        def build() -> Encoded:
            builds.append(c.snapshot(sequence=pub.sequence, step=g.step))
            return builds[-1]
        return pub.snapshot((c.snapshot_key(), g.step), build)

    sink = Sink([])
    pub.subscribe(sink)
    first = snap(codec(t, pub))
    assert snap(codec(t, pub)) is first and len(builds) == 1  # an equal codec: the same frames
    other = snap(codec(t, pub, batch_rows=2))  # another codec: its own (and replaces it)
    assert other is not first and len(other.frames) == 2 and len(builds) == 2
    t.upsert(pa.table({"k": [4], "v": [4.0]}, schema=KV))
    g.run_cycle()  # the next update drops the one held: a new state, a new snapshot
    assert pub._snapshot is None
    again = snap(codec(t, pub, batch_rows=2))
    assert again is not other and len(builds) == 3
    pub.unsubscribe(sink)  # nobody left to open at this state: nothing held
    assert pub._snapshot is None
    assert codec(t, pub, status=lambda: None).snapshot_key() is None  # a mirror's: never shared


def test_streams_catching_up_from_one_state_share_one_delta_until_the_table_changes():
    g = UpdateGraph()
    t, pub = keyed(g)
    sink = Sink([])
    pub.subscribe(sink)
    builds: list[tuple[int, int]] = []

    def delta(c: DeltaCodec, start: int) -> Encoded:
        run = compose_run([e for e in sink.seen if e.sequence > start])

        def build() -> Encoded:
            builds.append((start, run.sequence))
            return c.delta(run.update, held=None, sequence=run.sequence, step=g.step,
                           count=run.sequence - start)
        return pub.delta((c.snapshot_key(), g.step), start, build, Encoded.nbytes)

    for k in (4, 5):
        t.upsert(pa.table({"k": [k], "v": [float(k)]}, schema=KV))
        g.run_cycle()
    first = delta(codec(t, pub), 0)
    assert delta(codec(t, pub), 0) is first and builds == [(0, 2)]  # one build, shared
    later = delta(codec(t, pub), 1)  # another start: its own message
    assert later is not first and builds == [(0, 2), (1, 2)]
    assert delta(codec(t, pub, batch_rows=2), 0) is not first  # another codec: its own
    assert decode(KV, first).meta.coalesced == 2 and decode(KV, later).meta.coalesced == 1
    t.upsert(pa.table({"k": [6], "v": [6.0]}, schema=KV))
    g.run_cycle()  # a new state: nothing held from the old one
    assert pub._deltas == {} and pub.deltas_shared == 1
    assert delta(codec(t, pub), 0) is not first and builds[-1] == (0, 3)
    pub.unsubscribe(sink)
    assert pub._deltas == {}


def test_a_shared_delta_is_built_once_for_streams_asking_together_and_never_held_on_failure():
    g = UpdateGraph()
    t, pub = keyed(g)
    pub.subscribe(Sink([]))
    started, release = threading.Event(), threading.Event()
    builds = []

    def slow() -> Encoded:
        builds.append(1)
        started.set()
        assert release.wait(5)
        return Encoded((b"x",), 1, 1)

    got: list[Encoded] = []
    first = threading.Thread(target=lambda: got.append(pub.delta("k", 0, slow, Encoded.nbytes)))
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=lambda: got.append(pub.delta("k", 0, slow, Encoded.nbytes)))
    second.start()
    time.sleep(0.05)  # the second caller waits for the first one's build
    assert len(builds) == 1
    release.set()
    first.join(5), second.join(5)
    assert len(builds) == 1 and got[0] is got[1]

    def broken() -> Encoded:
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        pub.delta("k", 1, broken, Encoded.nbytes)
    assert ("k", 1) not in pub._deltas  # a later caller builds its own
    assert pub.delta("k", 1, lambda: Encoded((b"y",), 1, 1), Encoded.nbytes).frames == (b"y",)
    huge = Encoded((bytes(MAX_SHARED_DELTA_BYTES + 1),), 1, 1)  # past the bound: not held
    assert pub.delta("k", 2, lambda: huge, Encoded.nbytes) is huge and ("k", 2) not in pub._deltas


@dataclass
class Sink:
    """An :class:`~flight.streams.registry.UpdateSink` that records the entries."""

    seen: list[HistoryEntry]

    def on_table_update(self, entry: HistoryEntry) -> None:
        self.seen.append(entry)

    def on_table_failure(self, exc: BaseException) -> None:
        raise AssertionError(f"table failed: {exc}")


# ------------------------------------------------------------------------ round trip
class Stream:
    """One subscriber in one process: the codec's messages, framed, decoded and applied.

    It is fed as a subscription is (an update sink queuing in a :class:`PendingUpdates`,
    triples built in the cycle) and :meth:`send` builds what is pending as one message.
    """

    def __init__(self, table: Table, publisher: Publisher, *, triples: bool,
                 columns: list[str], viewport: list[tuple[int, int]] | None, batch_rows: int,
                 bound: int) -> None:
        self.table, self.publisher = table, publisher
        self.format = pb.DELTA_FORMAT_TRIPLES if triples else pb.DELTA_FORMAT_UPDATES
        self.columns, self.batch_rows = columns, batch_rows
        self.codec = self._codec(viewport)
        self.pending = PendingUpdates(bound)
        self.held: RowSet | None = None
        self.view: ReferenceView | TriplesView = (
            TriplesView(self.codec.schema) if triples else ReferenceView(self.codec.schema))
        self.coalesced = 0
        publisher.subscribe(self)
        self._apply(self.codec.snapshot(sequence=publisher.sequence, step=table.graph.step))

    def _codec(self, viewport: list[tuple[int, int]] | None) -> DeltaCodec:
        return DeltaCodec(self.table, epoch=self.publisher.epoch, format=self.format,
                          columns=self.columns, viewport=viewport, batch_rows=self.batch_rows)

    def on_table_update(self, entry: HistoryEntry) -> None:
        triples = None
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            triples = self.codec.update_triples(entry.update, entry.step)
        self.pending.append(entry, triples)

    def on_table_failure(self, exc: BaseException) -> None:
        raise AssertionError(f"table failed: {exc}")

    def send(self, *, move: bool = False, viewport: list[tuple[int, int]] | None = None) -> None:
        """What is pending as one message (with ``move``: and the new ``viewport``)."""
        run = self.pending.take()
        step = self.table.graph.step
        if move:
            self.codec = self._codec(viewport)
        elif run is None:
            return
        if self.format == pb.DELTA_FORMAT_TRIPLES:
            assert run is not None and run.triples is not None
            enc = self.codec.triples(run.triples, sequence=run.entry.sequence, step=step,
                                     count=run.count)
        elif run is None:
            enc = self.codec.delta(TableUpdate(), held=self.held, sequence=self.view.sequence,
                                   step=step, count=0)
        else:
            self.coalesced += run.count - 1
            enc = self.codec.delta(run.entry.update, held=self.held, sequence=run.entry.sequence,
                                   step=step, count=run.count)
        self._apply(enc)

    def _apply(self, enc: Encoded) -> None:
        for f in enc.frames:
            assert len(f) < 64 * 1024 * 1024
        msg = decode(self.codec.schema, enc)
        assert msg.added.num_rows + msg.modified.num_rows <= (
            self.batch_rows * (msg.meta.num_added_batches + msg.meta.num_modified_batches))
        self.view.apply(msg)
        self.held = enc.held

    def check(self, context: str) -> None:
        """The decoded view equals the table: keys, order, held rows and their values."""
        assert self.view.sequence == self.publisher.sequence, context
        if isinstance(self.view, TriplesView):
            want = self.table.to_arrow(self.columns)
            order = [(c, "ascending") for c in self.columns]
            got = self.view.to_arrow()
            assert got.to_pydict() == (want.sort_by(order) if want.num_rows else want).to_pydict(), \
                context
            return
        keys = self.table.rowset.keys()
        assert np.array_equal(self.view.keys, keys), f"{context}: row keys differ"
        held = self.codec.viewport_keys(self.table.rowset)
        assert np.array_equal(self.view.held_keys(), held.keys()), f"{context}: held keys differ"
        assert np.array_equal(self.view.data_keys, held.keys()), f"{context}: data keys differ"
        want = self.table.rows(held.keys(), self.columns)
        got = self.view.to_arrow()
        if not got.equals(want):
            print(f"MISMATCH {context}\n--- decoded ---\n{got}\n--- table ---\n{want}")
            raise AssertionError(f"{context}: values differ")


viewports = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), max_size=3).map(
    lambda rs: [(b, b + n) for b, n in rs])


@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1),
       source=st.sampled_from(["shifting", "keyed", "ring", "append"]),
       triples=st.booleans(),
       columns=st.sets(st.sampled_from(SCHEMA.names)),
       viewport=st.none() | viewports,
       batch_rows=st.integers(1, 7),
       bound=st.integers(1, 4),
       send_every=st.sampled_from([1, 1, 2, 3]))
def test_decoding_what_the_codec_encodes_gives_the_table_after_every_message(
        seed, source, triples, columns, viewport, batch_rows, bound, send_every):
    rng = np.random.default_rng(seed)
    g = UpdateGraph(validate=True)
    src = (ShiftingSource(g, rng, max_rows=40) if source == "shifting"
           else RandomSource(g, source, rng, max_rows=40))
    for _ in range(3):  # a table with some rows before the snapshot
        src.step()
        g.run_cycle()
    table = src.table
    carried = [c for c in SCHEMA.names if c in columns] or list(SCHEMA.names)
    pub = Publisher(table, history_updates=8)
    stream = Stream(table, pub, triples=triples, columns=carried,
                    viewport=None if triples else viewport, batch_rows=batch_rows, bound=bound)
    stream.check(f"seed={seed} snapshot")
    for cycle in range(30):
        src.step()
        g.run_cycle()
        assert len(stream.pending) <= bound
        if cycle % send_every:
            continue
        if not triples and rng.random() < 0.15:  # the client moves (or drops) its viewport
            stream.send(move=True, viewport=None if rng.random() < 0.3 else [
                (int(b), int(b) + int(n)) for b, n in rng.integers(0, 25, (2, 2))])
        else:
            stream.send()
        stream.check(f"seed={seed} {source} cycle={cycle}")
    stream.send()
    stream.check(f"seed={seed} {source} end")
