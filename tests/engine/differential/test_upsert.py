"""Upserts to triples: seed 000's frank/oz sequence, no-ops, sharing the trace (given, or
published later), errors, hash collisions, then an oracle over >= 500 random steps against
a dictionary model for each kind of key map, validating the state after every step."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine._kernels import rowkeymap as rowkeymap_module
from engine._kernels.rowstore import FlatRowStore
from engine.differential import indexed as indexed_module
from engine.differential import trace as trace_module
from engine.differential import upsert as upsert_module
from engine.differential.linear import LinearOperator
from engine.differential.trace import Trace
from engine.differential.upsert import DELETE, Upsert
from engine.differential.version import Antichain
from engine.differential.zset import TIME, ZSet
from engine.errors import InputError, InvalidKeyError, SchemaError, UpdateInvariantError
from tests.engine.differential._reference import counter

NAMES = pa.schema([("first", pa.string()), ("last", pa.string())])
SEQ = ["mcsherry", "zappa", None, "oz", "oz", None]
EXPECTED = [(("frank", "mcsherry"), (0,), 1), (("frank", "mcsherry"), (1,), -1), (("frank", "zappa"), (1,), 1),
            (("frank", "zappa"), (2,), -1), (("frank", "oz"), (3,), 1), (("frank", "oz"), (5,), -1)]


def _events(first, last, *, times=None) -> pa.Table:
    cols = {"first": pa.array(first, pa.string()), "last": pa.array(last, pa.string()),
            DELETE: pa.array([v is None for v in last])}
    if times is not None:
        cols[TIME] = pa.array(times, pa.int64())
    return pa.table(cols)


# ---------------------------------------------------------------------------------------
# examples


def test_seed000_one_event_per_time():
    up = Upsert(NAMES, "first")
    out = []
    for t, last in enumerate(SEQ):
        out += up.step(_events(["frank"], [last]), t).to_triples()
    assert out == EXPECTED
    assert up.trace.accumulate().to_triples() == []


def test_seed000_all_times_in_one_batch():
    up = Upsert(NAMES, "first")
    got = up.step(_events(["frank"] * 6, SEQ, times=list(range(6))))
    assert got.to_triples() == EXPECTED


def test_seed000_downstream_filter_and_projection():
    # seed 000: filtering the differential updates keeps (frank, zappa) at 1 and 2 only
    up = Upsert(NAMES, "first")
    out = up.step(_events(["frank"] * 6, SEQ, times=list(range(6))))
    zs = LinearOperator().filter(pc.starts_with(pc.field("last"), "z"))(out)
    assert zs.to_triples() == [(("frank", "zappa"), (1,), 1), (("frank", "zappa"), (2,), -1)]
    last = LinearOperator().map({"last": "last"})(out)
    assert [(r[0], t[0], d) for r, t, d in last.to_triples()] == [
        ("mcsherry", 0, 1), ("mcsherry", 1, -1), ("zappa", 1, 1), ("zappa", 2, -1), ("oz", 3, 1), ("oz", 5, -1)]


def test_repeats_and_absent_deletes_say_nothing():
    up = Upsert(NAMES, "first")
    up.step(_events(["a", "b"], ["x", "y"]), 0)
    assert up.step(_events(["a", "b"], ["x", "y"]), 1).num_rows == 0        # identical upserts
    assert up.step(_events(["zz", "qq"], [None, None]), 2).num_rows == 0    # absent keys
    # within one batch and time the last event per key wins; a change and its undo cancel
    got = up.step(_events(["a", "a", "b", "b", "c"], ["q", "x", "w", None, None]), 3)
    assert got.to_triples() == [(("b", "y"), (3,), -1)]


def test_several_key_columns_and_nulls_in_values():
    schema = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("v", pa.float64())])
    up = Upsert(schema, ["k1", "k2"])
    ev = pa.table({"k1": [1, 1, 2], "k2": ["a", "b", "a"], "v": [None, 1.0, float("nan")]})
    assert len(up.step(ev, 0)) == 3
    assert up.step(ev, 1).num_rows == 0           # null == null, NaN == NaN: no change
    ev2 = pa.table({"k1": [1], "k2": ["a"], "v": [2.0]})
    assert up.step(ev2, 2).to_triples() == [((1, "a", None), (2,), -1), ((1, "a", 2.0), (2,), 1)]


def test_the_trace_is_the_shared_arrangement():
    trace = Trace(NAMES, "first")
    other = trace.reader()                   # another operator reading the same arrangement
    up = Upsert(NAMES, "first", trace=trace)
    up.step(_events(["frank", "moon"], ["zappa", "unit"]), 0)
    up.step(_events(["frank"], ["oz"]), 1)
    assert sorted(trace.accumulate(at=0).to_triples()) == [(("frank", "zappa"), None, 1), (("moon", "unit"), None, 1)]
    assert sorted(trace.accumulate(at=1).to_triples()) == [(("frank", "oz"), None, 1), (("moon", "unit"), None, 1)]
    other.set_logical_compaction(Antichain([1]))
    trace.compact()
    assert len(trace) == 2                   # compacted to the live rows
    with pytest.raises(SchemaError, match="does not fit"):
        Upsert(NAMES, "last", trace=trace)


def test_errors():
    up = Upsert(NAMES, "first")
    up.step(_events(["a"], ["x"]), 5)
    with pytest.raises(InputError, match="go back"):
        up.step(_events(["a"], ["y"]), 4)
    with pytest.raises(InputError, match="need a time"):
        up.step(_events(["a"], ["y"]))
    with pytest.raises(InvalidKeyError, match="null"):
        up.step(_events([None], ["y"]), 6)
    with pytest.raises(SchemaError, match="missing"):
        up.step(pa.table({"first": ["a"]}), 6)
    with pytest.raises(SchemaError, match="boolean"):
        up.step(pa.table({"first": ["a"], "last": ["b"], DELETE: [1]}), 6)
    bad = Trace(NAMES, "first")
    bad.insert(ZSet.from_triples([(("a", "x"), 0, 2)], NAMES))
    with pytest.raises(InputError, match="weight 2"):
        Upsert(NAMES, "first", trace=bad).step(_events(["a"], ["y"]), 1)


def test_colliding_key_hashes(monkeypatch):
    # every key hashes alike: events of different keys must still stay apart
    def zero(table, names=None):
        return np.zeros(table.num_rows, np.uint64)

    monkeypatch.setattr(upsert_module, "hash_rows", zero)
    monkeypatch.setattr(indexed_module, "hash_rows", zero)
    monkeypatch.setattr(trace_module, "hash_rows", zero)
    up = Upsert(NAMES, "first")
    assert len(up.step(_events(["a", "b", "c"], ["1", "2", "3"]), 0)) == 3
    got = up.step(_events(["b", "d", "a"], ["2", "4", None]), 1)
    assert sorted(got.to_triples()) == [(("a", "1"), (1,), -1), (("d", "4"), (1,), 1)]


# ---------------------------------------------------------------------------------------
# oracle: >= 500 random steps against a dictionary


SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64()), ("s", pa.string())])
KEYS = [f"k{i}" for i in range(25)]
# integer keys: dense non-negative (the by-value map), sparse (its hashed layout), and
# some negative (the switch to the general map part-way through)
INT_KEYS = {"int": list(range(25)), "sparse": [i << 40 for i in range(25)],
            "negative": list(range(20)) + [-5, -1, -(1 << 50), 7 << 45, 3],
            # with no slack for sparse keys (see the test): the first batches' keys are
            # sparse in 0..199, the map turns hashed, then is rebuilt dense as keys fill in
            "densifying": list(range(200)),
            # sparse and too big to pack with an event's index into an int64: sorted apart
            "huge": [(1 << 62) + (i << 40) for i in range(25)]}


def _expected(state: dict, events: list) -> Counter:
    """Seed 000 semantics, one key at a time: last event per (key, time), in time order."""
    last: dict = {}
    for k, val, t in events:
        last[(k, t)] = val
    out: Counter = Counter()
    for (k, t) in sorted(last, key=lambda kt: (kt[0], kt[1])):
        new, old = last[(k, t)], state.get(k)
        if new != old:
            if old is not None:
                out[((k,) + old, (t,))] -= 1
            if new is not None:
                out[((k,) + new, (t,))] += 1
        if new is None:
            state.pop(k, None)
        else:
            state[k] = new
    return Counter({x: w for x, w in out.items() if w})


def _random_events(rng, state: dict, keys: list, time: int) -> list:
    n = int(rng.integers(0, 30))
    multi = rng.random() < 0.3
    events = []
    for _ in range(n):
        k = keys[int(rng.integers(0, len(keys)))]
        roll = rng.random()
        if roll < 0.2:
            val = None                                     # delete (maybe absent)
        elif roll < 0.35 and k in state:
            val = state[k]                                 # repeat the current value
        else:
            s = [None, "x", "y"][int(rng.integers(0, 3))]
            val = (int(rng.integers(0, 3)), s)
        t = time + (int(rng.integers(0, 3)) if multi else 0)
        events.append((k, val, t))
    return events


# the flat state (every column fixed-width: kept and compared in numpy): ``s`` is a float
# column, with nulls
FLAT_S = {None: None, "x": 0.0, "y": -2.0}  # a null is held as 0.0 in numpy


@pytest.mark.parametrize("keys", ["string", "int", "sparse", "negative", "densifying", "flat", "flat-negative",
                                  "flat-sparse", "flat-huge"])
@pytest.mark.parametrize("publish", ["given", "later", "rebuilt"])
def test_upsert_oracle_over_random_steps(keys, publish, monkeypatch):
    """>= 520 random steps (upserts of present keys, repeats, deletes of absent keys, one key
    several times in a batch and at several times) against a dictionary; the state is
    validated after every step, against the trace once it is published (given to the
    constructor, or asked for at step 260 and then read by a second reader). ``rebuilt``:
    the trace is given, its second reader keeps up with the present (it moves to each
    batch's last time before the step) and the upsert rebuilds the trace from its state
    whenever it may (no slack), so the trace is checked against the dictionary after every
    step while it is rebuilt, merged, rebuilt again. ``densifying``: the key map turns
    hashed on the first sparse keys and is rebuilt dense as they fill in. ``flat*``: int
    keys (dense, some negative, or sparse) and a float ``s``, so the state is a
    :class:`FlatRowStore` of numpy columns. A one-time batch of dense keys finds each
    key's last event by key value (``int``, ``flat``), of sparse ones by slot
    (``sparse``, ``flat-sparse``), new keys by one sort of each key over its event's index
    or, for keys too big for that (``flat-huge``), by an argsort of the keys."""
    if publish == "rebuilt":
        monkeypatch.setattr(upsert_module, "_REBUILD_SLACK", -(1 << 40))
    if keys == "densifying":
        monkeypatch.setattr(rowkeymap_module, "SPARSE_SLACK", 0)
    layouts = []
    rng = np.random.default_rng(23)
    key_type = pa.string() if keys == "string" else pa.int64()
    flat = keys.startswith("flat")
    s_type = pa.float64() if flat else pa.string()
    schema = pa.schema([("key", key_type), ("n", pa.int64()), ("s", s_type)])
    universe = KEYS if keys == "string" else INT_KEYS[keys.removeprefix("flat-") if keys != "flat" else "int"]
    up = Upsert(schema, "key", trace=Trace(schema, "key") if publish != "later" else None)
    assert isinstance(up._records, FlatRowStore) == flat
    follower = up.trace.reader() if publish != "later" else None
    rebuilds = 0
    state: dict = {}
    acc: Counter = Counter()
    time = 0
    for step in range(520):
        if follower is None and step == 260:
            follower = up.trace.reader()
        events = _random_events(rng, state, universe, time)
        if flat:
            events = [(k, v if v is None else (v[0], FLAT_S.get(v[1], v[1])), t) for k, v, t in events]
        table = pa.table({
            "key": pa.array([e[0] for e in events], key_type),
            "n": pa.array([e[1][0] if e[1] else 0 for e in events], pa.int64()),
            "s": pa.array([e[1][1] if e[1] else None for e in events], s_type),
            DELETE: pa.array([e[1] is None for e in events], pa.bool_()),
            TIME: pa.array([e[2] for e in events], pa.int64()),
        })
        if publish == "rebuilt" and events:
            follower.set_logical_compaction(Antichain([max(time, max(e[2] for e in events))]))
        out = up.step(table)
        up.validate()
        if keys == "densifying" and (not layouts or layouts[-1] != up._index._by_value.layout):
            layouts.append(up._index._by_value.layout)
        rebuilds += publish == "rebuilt" and len(up.trace) == len(state) and len(up.trace.batches) == 1
        want = _expected(state, events)
        got = counter(out)
        assert got == want, f"seed 23, step {step}: only got {got - want}, only wanted {want - got}"
        assert len(out) == len(want) and set(out.diffs.tolist()) <= {-1, 1}
        assert len(up) == len(state)
        for x, w in got.items():
            acc[(x[0], None)] += w
        time = max([time] + [e[2] for e in events]) + 1
        live = Counter({((k,) + v, None): 1 for k, v in state.items()})
        assert Counter({x: w for x, w in acc.items() if w}) == live, f"step {step}"
        if follower is not None:
            follower.set_logical_compaction(Antichain([time - 1]))
            if step % 20 == 0 or publish == "rebuilt":
                assert counter(up.trace.accumulate(at=time - 1), times=False) == live, f"step {step}"
    assert publish != "rebuilt" or rebuilds > 100
    # sparse first (sorted or hashed: RowKeyMap's sparse layouts), then rebuilt dense
    assert keys != "densifying" or (layouts[-1] == "dense" and {"sorted", "hashed"} & set(layouts))
    up.trace.compact()
    assert len(up.trace) == len(state)        # compaction leaves the live rows only


def test_the_trace_is_rebuilt_only_when_no_reader_needs_its_history(monkeypatch):
    """A reader held back at time 0 keeps every version from 0 on exact: the upsert does not
    rebuild the trace from its state (which only knows the present) until it lets go."""
    monkeypatch.setattr(upsert_module, "_REBUILD_SLACK", -(1 << 40))
    up = Upsert(NAMES, "first", trace=Trace(NAMES, "first"))
    held = up.trace.reader()                   # at time 0
    values = ["x", "y", "z", "x", "w", "y", "z", "w"]
    for t, v in enumerate(values):
        up.step(_events(["a", "b"], [v, v]), t)
        up.validate()
    assert len(up.trace) > len(up)             # the history is kept
    for t, v in enumerate(values):
        assert sorted(up.trace.accumulate(at=t).to_triples()) == [(("a", v), None, 1), (("b", v), None, 1)]
    held.set_logical_compaction(Antichain([len(values)]))
    up.step(_events(["a"], ["q"]), len(values))   # every reader at the present: rebuilt
    up.validate()
    assert len(up.trace) == len(up) == 2 and len(up.trace.batches) == 1
    assert sorted(up.trace.accumulate(at=len(values)).to_triples()) == [(("a", "q"), None, 1), (("b", "w"), None, 1)]


def test_a_given_trace_seeds_the_state():
    trace = Trace(NAMES, "first")
    Upsert(NAMES, "first", trace=trace).step(_events(["a", "b"], ["x", "y"]), 3)
    up = Upsert(NAMES, "first", trace=trace)   # a new operator over the same arrangement
    assert len(up) == 2 and up.time == 3
    assert up.step(_events(["a", "c"], ["x", None]), 4).num_rows == 0
    assert up.step(_events(["b"], [None]), 5).to_triples() == [(("b", "y"), (5,), -1)]
    up.validate()


def test_validate_catches_another_writer():
    up = Upsert(NAMES, "first")
    up.step(_events(["a"], ["x"]), 0)
    up.trace.insert(ZSet.from_triples([(("b", "z"), 1, 1)], NAMES))   # not through the upsert
    with pytest.raises(UpdateInvariantError, match=r"U2: .*only in the trace: \[\('b', 'z'\)\]"):
        up.validate()


def test_the_trace_made_later_is_the_state_at_the_present():
    up = Upsert(NAMES, "first")
    up.step(_events(["a", "b"], ["x", "y"]), 0)
    up.step(_events(["a"], ["q"]), 2)
    trace = up.trace
    assert sorted(trace.accumulate(at=2).to_triples()) == [(("a", "q"), None, 1), (("b", "y"), None, 1)]
    with pytest.raises(InputError, match="compacted"):
        trace.accumulate(at=1)                 # history before the present was never kept
    up.step(_events(["b"], [None]), 3)
    assert trace.accumulate(at=3).to_triples() == [(("a", "q"), None, 1)]


def test_a_null_delete_flag_upserts():
    up = Upsert(NAMES, "first")
    ev = pa.table({"first": ["a", "b"], "last": ["x", "y"], DELETE: pa.array([None, False], pa.bool_())})
    assert sorted(up.step(ev, 0).to_triples()) == [(("a", "x"), (0,), 1), (("b", "y"), (0,), 1)]
    ev = pa.table({"first": ["a", "b"], "last": ["x", "y"], DELETE: pa.array([True, None], pa.bool_())})
    assert up.step(ev, 1).to_triples() == [(("a", "x"), (1,), -1)]


@pytest.mark.parametrize("layout", ["sliced", "chunked", "nulls"])
def test_delete_flags_read_at_any_offset(layout):
    """The delete flags are bits unpacked by numpy: a batch sliced at an offset that is not
    a whole byte, split into chunks, or with null flags (not deletes) says what the same
    events as plain lists say, step after step (flat records: ints)."""
    rng = np.random.default_rng({"sliced": 3, "chunked": 4, "nulls": 5}[layout])
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    plain, odd = Upsert(schema, "k"), Upsert(schema, "k")
    for step in range(40):
        n = int(rng.integers(1, 40))
        k, v = rng.integers(0, 30, n), rng.integers(0, 3, n)
        d = rng.random(n) < 0.3
        null = rng.random(n) < 0.3 if layout == "nulls" else np.zeros(n, dtype=bool)
        want = plain.step(pa.table({"k": k, "v": v, DELETE: (d & ~null).tolist()}), step)
        if layout == "sliced":
            off = int(rng.integers(1, 12))
            pad = np.zeros(off, dtype=np.int64)
            t = pa.table({"k": np.concatenate((pad, k)), "v": np.concatenate((pad, v)),
                          DELETE: np.concatenate((np.ones(off, dtype=bool), d))}).slice(off)
        elif layout == "chunked":
            cut = int(rng.integers(0, n + 1))
            t = pa.concat_tables([pa.table({"k": k[:cut], "v": v[:cut], DELETE: d[:cut]}),
                                  pa.table({"k": k[cut:], "v": v[cut:], DELETE: d[cut:]})])
        else:
            t = pa.table({"k": k, "v": v, DELETE: pa.array(d, mask=null)})
        got = odd.step(t, step)
        assert counter(got) == counter(want), f"step {step}"
        odd.validate()
