"""Indexed batches and traces: seed 003 examples (Consolidate of a trace, Index With),
lookups, sharing and compaction, then an oracle over >= 500 random versions with
partially ordered (two-coordinate) times and advancing frontiers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from engine.differential import indexed as indexed_module
from engine.differential import trace as trace_module
from engine.differential.indexed import index_with
from engine.differential.trace import SMALL_BATCHES, MergePolicy, Trace
from engine.differential.version import Antichain, Version
from engine.differential.zset import ZSet
from engine.errors import InputError, SchemaError
from tests.engine.differential._reference import SCHEMA, counter, key, random_batch

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])

# ---------------------------------------------------------------------------------------
# examples


def test_seed003_consolidate_a_trace():
    rows = [(0, 0, 0, 1), (0, 0, 0, -1), (0, 1, 0, 1), (0, 1, 0, 1), (1, 2, 0, 2),
            (1, 3, 0, 1), (1, 3, 0, -1), (1, 4, 0, -1), (2, 2, 0, 1), (2, 4, 0, 1)]
    tr = Trace(KV, ["k"])
    for k, v, t, w in rows:  # one batch per update: the spine merges them as it goes
        tr.insert(ZSet.from_triples([((k, v), t, w)], KV))
    got = tr.accumulate()
    assert sorted(got.to_triples()) == [((0, 1), None, 2), ((1, 2), None, 2), ((1, 4), None, -1),
                                        ((2, 2), None, 1), ((2, 4), None, 1)]
    assert len(tr.batches) <= 4                       # O(log n) batches


def test_seed003_index_with():
    edges = ZSet.from_triples([((0, 1, 1), 0, 1), ((1, 2, 1), 1, 1), ((1, 3, 2), 1, -1)], ["src", "dst", "cost"])
    ib = index_with(edges, ["src"])
    assert sorted(ib.batch.to_triples()) == sorted(edges.to_triples())
    probe = pa.table({"src": [1, 0, 7]})
    p, rows = ib.locate(indexed_module.hash_rows(probe, ["src"]))
    got = sorted((int(i), ib.batch.take([r]).to_triples()[0]) for i, r in zip(p, rows, strict=True))
    assert got == [(0, ((1, 2, 1), (1,), 1)), (0, ((1, 3, 2), (1,), -1)), (1, ((0, 1, 1), (0,), 1))]
    # the rows of one key are contiguous
    src = ib.batch.data.column("src").to_pylist()
    assert src == sorted(src, key=src.index)


def test_lookup_and_accumulate_across_batches():
    tr = Trace(KV, "k")
    tr.insert(ZSet.from_triples([((1, 10), 0, 1), ((2, 20), 0, 1)], KV))
    tr.insert(ZSet.from_triples([((1, 10), 1, -1), ((1, 11), 1, 1)], KV))
    tr.insert(ZSet.from_triples([((3, 30), 2, 1)], KV))
    found = tr.lookup(pa.table({"k": [1, 4]}))
    assert set(found.probe.tolist()) == {0}
    assert counter(found.entries) == Counter({((1, 10), (0,)): 1, ((1, 10), (1,)): -1, ((1, 11), (1,)): 1})
    assert sorted(tr.accumulate(at=0).to_triples()) == [((1, 10), None, 1), ((2, 20), None, 1)]
    assert sorted(tr.accumulate(at=2).to_triples()) == [((1, 11), None, 1), ((2, 20), None, 1), ((3, 30), None, 1)]
    assert tr.accumulate(at=1, keys=pa.table({"k": [1]})).to_triples() == [((1, 11), None, 1)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("keys", ["dense", "unique", "unique_all_found", "negative_int32", "sparse", "few_probes",
                                  "few_unique"])
def test_many_probes_against_big_and_small_batches(seed, keys, monkeypatch):
    # thousands of probes against a spine of one big batch and several small ones: the small
    # batches go through the shared occupancy filter, the big one through its direct-address
    # index (integer keys over a narrow range, probes outside it too) or its bucket directory
    # (sparse keys); a few probes binary-search the small batches and, past _DENSE_FEW rows,
    # use the direct-address index
    rng = np.random.default_rng(seed)
    dtype = pa.int32() if keys == "negative_int32" else pa.int64()
    schema = pa.schema([("k", dtype), ("v", pa.int64())])
    low, span = (-15_000, 30_000) if keys == "negative_int32" else (0, 30_000)
    if keys == "sparse":
        span = 1 << 40
    if keys.startswith("few"):
        monkeypatch.setattr(indexed_module, "_DENSE_FEW", 5_000)
    tr = Trace(schema, "k")
    reader = tr.reader()  # no compaction: every batch keeps its updates
    sizes = [20_000, 700, 40, 3, 1, 90]
    want: Counter = Counter()
    small_keys = []
    for t, n in enumerate(sizes):
        k = rng.integers(low, low + span, n)
        if "unique" in keys and t == 0:  # one row per key in the big batch
            k = low + rng.permutation(span)[:n]
        if n < 1_000:
            small_keys.append(k)
        v = rng.integers(0, 5, n)
        w = rng.choice([-2, -1, 1, 3], n)
        tr.insert(ZSet(pa.table({"k": pa.array(k, dtype), "v": v}), w.astype(np.int64),
                       np.full((n, 1), t, np.int64)))
        for kk, vv, ww in zip(k.tolist(), v.tolist(), w.tolist(), strict=True):
            want[(kk, vv, t)] += ww
    assert any(len(b) * 8 < 5_000 for b in tr.batches) and any(len(b) >= 5_000 for b in tr.batches)
    big = max(tr.batches, key=len)
    if keys.startswith("few"):  # some present keys of every batch, a few absent ones
        probes = np.concatenate([k[:8] for k in small_keys] + [big.batch.data.column("k").to_numpy()[:10],
                                                              np.array([low - 5, low + span + 5, low + 7])])
        assert probes.size <= indexed_module._FEW
    elif keys == "unique_all_found":  # every probe is in the big batch
        probes = rng.choice(big.batch.data.column("k").to_numpy(), 5_000)
    else:
        edge = big.batch.data.column("k").to_numpy()[[0, 1, -1]]  # the first and last rows too
        probes = rng.permutation(np.concatenate([rng.integers(low - 5_000, low + span + 5_000, 5_000), edge,
                                                 *small_keys]))
    found = tr.lookup(pa.table({"k": pa.array(probes, dtype)}))
    assert (big._dense_index() is not None) == (keys != "sparse")
    if "unique" in keys:
        assert big._dense_index()[2] is None  # the one-row-per-key form
    recs = found.records().to_pylist()
    got: Counter = Counter()
    for p, r, d, t in zip(found.probe.tolist(), recs, found.diffs.tolist(), found.times[:, 0].tolist(), strict=True):
        assert r["k"] == probes[p]
        got[(p, r["v"], t)] += d
    by_key: dict[int, list[tuple[int, int, int]]] = {}
    for (k2, v2, t2), w2 in want.items():
        by_key.setdefault(k2, []).append((v2, t2, w2))
    expect: Counter = Counter()
    for p, kk in enumerate(probes.tolist()):
        for v2, t2, w2 in by_key.get(kk, []):
            expect[(p, v2, t2)] += w2
    assert +got == +expect and -got == -expect
    reader.close()


def test_readers_hold_back_compaction():
    tr = Trace(KV, "k")
    fast, slow = tr.reader(), tr.reader()
    for t in range(6):
        tr.insert(ZSet.from_triples([((1, t), t, 1)] + ([((1, t - 1), t, -1)] if t else []), KV))
    fast.set_logical_compaction(Antichain([5]))
    slow.set_logical_compaction(Antichain([2]))
    assert tr.since == Antichain([2])
    tr.compact()
    assert tr.accumulate(at=3).to_triples() == [((1, 3), None, 1)]   # still exact beyond 2
    with pytest.raises(InputError, match="compacted"):
        tr.accumulate(at=1)
    slow.close()
    assert tr.since == Antichain([5])
    tr.compact()
    assert tr.to_zset().to_triples() == [((1, 5), (5,), 1)]   # everything collapsed onto 5
    with pytest.raises(InputError, match="go back"):
        fast.set_logical_compaction(Antichain([4]))


def test_rebuild_replaces_the_history_with_the_collection_at_the_frontier():
    tr = Trace(KV, "k")
    reader = tr.reader()
    for t in range(6):
        tr.insert(ZSet.from_triples([((1, t), t, 1)] + ([((1, t - 1), t, -1)] if t else []), KV))
    reader.set_logical_compaction(Antichain([5]))
    tr.rebuild(ZSet.from_triples([((1, 5), 5, 1)], KV))
    assert len(tr) == 1 and tr.to_zset().to_triples() == [((1, 5), (5,), 1)]  # what compact() leaves
    tr.insert(ZSet.from_triples([((1, 5), 6, -1), ((2, 0), 6, 1)], KV))
    assert tr.accumulate(at=5).to_triples() == [((1, 5), None, 1)]
    assert tr.accumulate(at=6).to_triples() == [((2, 0), None, 1)]
    reader.set_logical_compaction(Antichain([6]))
    tr.rebuild(ZSet.empty(KV, 1))              # an empty collection: an empty trace
    assert len(tr) == 0 and tr.accumulate(at=7).num_rows == 0


def test_rebuild_refuses_what_would_lose_history():
    tr = Trace(KV, "k")
    reader = tr.reader()
    tr.insert(ZSet.from_triples([((1, 0), 0, 1)], KV))
    tr.insert(ZSet.from_triples([((1, 0), 3, -1)], KV))    # the latest time comes in a later batch
    reader.set_logical_compaction(Antichain([2]))
    with pytest.raises(InputError, match=r"holds updates up to \(3,\)"):
        tr.rebuild(ZSet.from_triples([((1, 0), 2, 1)], KV))   # the retraction at 3 would be lost
    reader.set_logical_compaction(Antichain([3]))
    with pytest.raises(InputError, match="timed at the frontier"):
        tr.rebuild(ZSet.from_triples([((1, 0), 2, 1)], KV))
    with pytest.raises(SchemaError):
        tr.rebuild(ZSet.from_triples([((1, "x"), 3, 1)], pa.schema([("k", pa.int64()), ("v", pa.string())])))
    tr2 = Trace(KV, "k", dims=2)
    r2 = tr2.reader()
    r2.set_logical_compaction(Antichain([(0, 1), (1, 0)]))
    with pytest.raises(InputError, match="one version"):
        tr2.rebuild(ZSet.empty(KV, 2))
    assert tr.accumulate(at=3).num_rows == 0 and len(tr) == 2   # nothing was replaced


def test_bad_inserts():
    tr = Trace(KV, "k", dims=2)
    with pytest.raises(InputError, match="coordinate"):
        tr.insert(ZSet.from_triples([((1, 1), 0, 1)], KV))
    with pytest.raises(SchemaError, match="do not match"):
        tr.insert(ZSet.from_triples([((1, "x"), (0, 0), 1)], ["k", "v"]))
    with pytest.raises(SchemaError, match="not in"):
        Trace(KV, "nope")
    with pytest.raises(SchemaError, match="lack"):
        tr.lookup(pa.table({"v": [1]}))


def test_colliding_key_hashes_return_only_the_right_key(monkeypatch):
    # every key hashes alike (string keys, so the trace must verify by value)
    real = trace_module.hash_rows

    def collide(table, names=None):
        h = real(table, names)
        return np.zeros_like(h) if names == ("Sym",) or names == ["Sym"] else h

    monkeypatch.setattr(indexed_module, "hash_rows", collide)
    monkeypatch.setattr(trace_module, "hash_rows", collide)
    rng = np.random.default_rng(3)
    tr = Trace(SCHEMA, "Sym")
    raw = []
    for v in range(12):
        b = random_batch(rng, 20, times=(v,))
        raw.append(b)
        tr.insert(b)
    all_in = Counter()
    for b in raw:
        all_in.update(counter(b))
    for sym in ["a", "b", None]:
        want = Counter({k: w for k, w in all_in.items() if k[0][0] == sym})
        got = counter(tr.lookup(pa.table({"Sym": pa.array([sym], pa.string())})).entries)
        assert got == Counter({k: w for k, w in want.items() if w})


@pytest.mark.parametrize("high", ["zeros", "ones"])
@pytest.mark.parametrize("probes", [20, 2_000])
def test_key_hashes_sharing_the_high_bits_are_told_apart(monkeypatch, probes, high):
    # integer keys (hash exact, so no check by value) whose hashes agree on the 40 bits the
    # order key keeps: binary searches and directories return rows of other keys too, and
    # only the full-hash comparison drops them. All ones there is the largest key, whose
    # upper search bound would wrap around.
    real = trace_module.hash_rows
    top = np.uint64(0) if high == "zeros" else ~np.uint64(0xFFFFFF)

    def low_bits(table, names=None):
        h = real(table, names)
        return (h & np.uint64(0xFFFFFF)) | top if list(names or []) == ["k"] else h

    rng = np.random.default_rng(probes)
    pool = rng.choice(10**12, 300, replace=False)  # sparse: no direct-address index
    assert np.unique(low_bits(pa.table({"k": pool}), ["k"])).size == pool.size
    monkeypatch.setattr(indexed_module, "hash_rows", low_bits)
    monkeypatch.setattr(trace_module, "hash_rows", low_bits)
    tr = Trace(KV, "k")
    reader = tr.reader()
    want: Counter = Counter()
    for t, n in enumerate([900, 40, 7]):  # three batches: no merge yet
        k = rng.choice(pool, n)
        v = rng.integers(0, 4, n)
        tr.insert(ZSet(pa.table({"k": k, "v": v}), np.ones(n, np.int64), np.full((n, 1), t, np.int64)))
        for kk, vv in zip(k.tolist(), v.tolist(), strict=True):
            want[(kk, vv, t)] += 1
    assert len(tr.batches) > 1
    probe_keys = np.concatenate([rng.choice(pool, probes - 3), [-1, 10**12 + 7, 5]])
    found = tr.lookup(pa.table({"k": probe_keys}))
    got: Counter = Counter()
    for p, r, d, t in zip(found.probe.tolist(), found.records().to_pylist(), found.diffs.tolist(),
                          found.times[:, 0].tolist(), strict=True):
        assert r["k"] == probe_keys[p]
        got[(p, r["v"], t)] += d
    expect: Counter = Counter()
    for p, kk in enumerate(probe_keys.tolist()):
        for (k2, v2, t2), w2 in want.items():
            if k2 == kk:
                expect[(p, v2, t2)] += w2
    assert got == expect
    reader.close()


@pytest.mark.parametrize("at", ["bottom", "top"])
@pytest.mark.parametrize("probes", [5, 2_000])
def test_a_key_range_ends_where_the_next_key_begins(monkeypatch, probes, at):
    # keys alone (order key = key hash), hashed so that keys 2m and 2m+1 share the high bits
    # and sit at the two ends of them (low bits all zeros, all ones), the next pair starting
    # right after: a search must take both ends of its key's range and nothing of the next
    # key's, and drop the other key of the pair, even when that is a batch's one candidate.
    # At the top, the upper bound of the last range would wrap around.
    real = trace_module.hash_rows
    base = 0 if at == "bottom" else (1 << 40) - 8

    def pairs(table, names=None):
        if list(names or []) != ["k"]:
            return real(table, names)
        k = table.column("k").to_numpy().astype(np.uint64)
        return ((np.uint64(base) + (k >> np.uint64(1))) << np.uint64(24)) | \
            np.where(k & np.uint64(1), np.uint64(0xFFFFFF), np.uint64(0))

    monkeypatch.setattr(indexed_module, "hash_rows", pairs)
    monkeypatch.setattr(trace_module, "hash_rows", pairs)
    schema = pa.schema([("k", pa.int64())])
    tr = Trace(schema, "k")
    reader = tr.reader()
    want: Counter = Counter()
    for t, keys in enumerate([[1], [0, 3, 4, 5, 6, 9, 15], [2, 3, 7, 8, 14]]):  # three batches: no merge
        tr.insert(ZSet(pa.table({"k": pa.array(keys, pa.int64())}), np.ones(len(keys), np.int64),
                       np.full((len(keys), 1), t, np.int64)))
        for kk in keys:
            want[(kk, t)] += 1
    assert len(tr.batches) == 3
    rng = np.random.default_rng(probes)
    probe_keys = np.array([0, 6, 15, 16, 11]) if probes == 5 else rng.integers(0, 20, probes)
    found = tr.lookup(pa.table({"k": probe_keys}))
    got = Counter((int(probe_keys[p]), r["k"], t) for p, r, t in zip(
        found.probe.tolist(), found.records().to_pylist(), found.times[:, 0].tolist(), strict=True))
    expect = Counter((int(kk), k2, t2) for kk in probe_keys for (k2, t2), w in want.items() if k2 == kk for _ in range(w))
    assert got == expect
    reader.close()


def _entries(found):
    return Counter((int(p), tuple(r.values()), tuple(t), int(d)) for p, r, t, d in zip(
        found.probe.tolist(), found.records().to_pylist(), found.times.tolist(), found.diffs.tolist(),
        strict=True))


@pytest.mark.parametrize("big", [False, True])
def test_spine_run_follows_appends_merges_and_snapshots(monkeypatch, big):
    # lookups of a few keys go through the trace's spine run, which follows the spine as
    # batches are appended and the last ones merged; a snapshot taken before an insert (a
    # join's A_old) is looked up in between. Each answer must be the one the batches give
    # one by one (the run turned off). With ``big``, the first batch is past the run's
    # size floor and is probed by itself, the others through the run.
    if big:
        monkeypatch.setattr(trace_module, "_RUN_MIN_BIG", 300)
    rng = np.random.default_rng(5)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    tr = Trace(schema, "k", dims=2, policy=SMALL_BATCHES)
    reader = tr.reader()
    first = 400 if big else 30
    seen_runs = 0
    for t in range(60):
        n = first if t == 0 else int(rng.integers(1, 40))
        k = rng.integers(0, 200, n)
        z = ZSet(pa.table({"k": k, "v": rng.integers(0, 3, n)}), rng.choice([-1, 1, 2], n).astype(np.int64),
                 np.tile(np.array([[t // 7, t % 7]], np.int64), (n, 1)))
        snapshot = tr.batches
        tr.insert(z)
        reader.set_logical_compaction(Antichain([(max(t // 7 - 1, 0), 0)]))
        for spine in (snapshot, tr.batches, snapshot):
            probes = pa.table({"k": rng.integers(-5, 205, int(rng.integers(1, 12)))})
            got = _entries(tr.lookup(probes, batches=spine))
            seen_runs += bool(tr._run.batches)
            with monkeypatch.context() as m:
                m.setattr(trace_module, "_RUN_PROBES", 0)  # every batch by itself
                want = _entries(tr.lookup(probes, batches=spine))
            assert got == want, (t, [len(b) for b in spine])
    assert seen_runs and (tr._run.batches[0] is not tr.batches[0]) == big
    reader.close()


# ---------------------------------------------------------------------------------------
# oracle: >= 500 versions, two-coordinate times, frontiers that advance as antichains


def _beyond(rng: np.random.Generator, frontier: Antichain, spread: int = 3) -> tuple[int, int]:
    e = frontier.elements[int(rng.integers(0, len(frontier)))]
    return (e[0] + int(rng.integers(0, spread + 1)), e[1] + int(rng.integers(0, spread + 1)))


@pytest.mark.parametrize("policy", [MergePolicy(), SMALL_BATCHES], ids=["default", "small_batches"])
@pytest.mark.parametrize("key_col", ["K", "Sym"])
def test_trace_oracle_over_random_versions(key_col, policy):
    rng = np.random.default_rng(17 if key_col == "K" else 18)
    tr = Trace(SCHEMA, key_col, dims=2, policy=policy)
    reader = tr.reader()
    frontier = Antichain([(0, 0)])
    history: Counter = Counter()          # every update ever inserted, uncompacted
    for v in range(520):
        t = _beyond(rng, frontier)
        batch = random_batch(rng, int(rng.integers(0, 15)), times=t, time_spread=1, keys=5)
        tr.insert(batch)
        for (rec, tt), w in counter(batch).items():
            history[(rec, tt)] += w
        if rng.random() < 0.3:  # advance: every new element is beyond an old one
            picks = rng.choice(len(frontier), size=int(rng.integers(1, len(frontier) + 1)), replace=False)
            new = Antichain([
                Version(frontier.elements[int(i)][0] + int(rng.integers(0, 3)),
                        frontier.elements[int(i)][1] + int(rng.integers(0, 3)))
                for i in picks
            ] + ([Version(*_beyond(rng, frontier))] if rng.random() < 0.3 else []))
            frontier.check_advance(new)
            reader.set_logical_compaction(new)
            frontier = new
        if rng.random() < 0.05:
            tr.compact()
        # the collection at a version beyond the frontier is exact
        u = Version(*_beyond(rng, frontier, spread=4))
        want: Counter = Counter()
        for (rec, tt), w in history.items():
            if tt[0] <= u[0] and tt[1] <= u[1]:
                want[(rec, None)] += w
        want = Counter({k: w for k, w in want.items() if w})
        assert counter(tr.accumulate(at=u), times=False) == want, f"version {v} at {u}"
        if v % 10 == 0:  # and so is a lookup of some keys
            probe = batch.data.select([key_col]).slice(0, 3) if batch.num_rows else \
                pa.table({key_col: pa.array([], SCHEMA.field(key_col).type)})
            keys = {key((x,))[0] for x in probe.column(key_col).to_pylist()}
            got = counter(tr.accumulate(at=u, keys=probe), times=False)
            idx = SCHEMA.get_field_index(key_col)
            assert got == Counter({k: w for k, w in want.items() if k[0][idx] in keys})
    # compaction bounds the trace: one row per distinct (record, advanced time)
    tr.compact()
    distinct = {(rec, Version(tt).advance_by(frontier)) for (rec, tt), w in history.items()}
    assert len(tr) <= len(distinct)


def _kv_batch(rng: np.random.Generator, n: int, t: tuple[int, ...], spread: int) -> ZSet:
    # int64 key and value: the exact-record path (hashes prove equality)
    data = pa.table({"k": rng.integers(0, 6, n), "v": rng.integers(0, 3, n)}, schema=KV)
    w = rng.integers(1, 3, n) * rng.choice([-1, 1], n)
    tm = np.asarray(t, dtype=np.int64) + rng.integers(0, spread + 1, (n, len(t)))
    return ZSet(data, w.astype(np.int64), tm.astype(np.int64))


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("records", ["K", "Sym", "kv"])
def test_compaction_leaves_each_record_and_time_once(records, dims):
    """After every compaction the one batch holds each (record, time advanced by the
    frontier) once, with its summed weight and no zeros, in order-key order: merges
    consolidate runs of any length (updates that cancel, the same record at several times
    that advance to one), not only neighbouring pairs. Exact records (``kv``) are confirmed
    by hash, the others by value (floats with NaN and -0.0, null strings)."""
    rng = np.random.default_rng({"K": 41, "Sym": 42, "kv": 43}[records] + 10 * dims)
    schema, key_col = (KV, "k") if records == "kv" else (SCHEMA, records)
    tr = Trace(schema, key_col, dims=dims)
    reader = tr.reader()
    history: Counter = Counter()
    low = 0
    for step in range(300):
        t = (low + int(rng.integers(0, 3)),) * dims
        n = int(rng.integers(0, 40))
        batch = _kv_batch(rng, n, t, 2) if records == "kv" else \
            random_batch(rng, n, times=t, time_spread=2, keys=5)
        tr.insert(batch)
        history.update(counter(batch))
        if rng.random() < 0.3:
            low += int(rng.integers(0, 3))
            reader.set_logical_compaction(Antichain([(low,) * dims]))
        if rng.random() < 0.2 or step == 299:
            tr.compact()
            frontier = tr.since
            want: Counter = Counter()
            for (rec, tt), w in history.items():
                want[(rec, tuple(Version(tt).advance_by(frontier)))] += w
            want = Counter({x: w for x, w in want.items() if w})
            got = tr.batches[0] if tr.batches else None
            rows = [] if got is None else [(key(r), tuple(tt)) for r, tt, _ in got.batch.to_triples()]
            assert len(rows) == len(set(rows)) == len(want), f"step {step}: duplicates or leftovers"
            assert (got is None or (bool(np.all(got.batch.diffs != 0))
                                     and bool(np.all(got.order_key[1:] >= got.order_key[:-1])))), f"step {step}"
            assert (Counter() if got is None else counter(got.batch)) == want, f"step {step}"


@pytest.mark.parametrize("records", ["Sym", "kv"])
def test_merges_at_the_present_match_the_history(records, monkeypatch):
    """A writer that moves its reader to each batch's time before inserting it (as the
    upsert does) lets merges skip the times: every stored time advances to that one
    version. A second reader, now and then held a few versions back, makes the merges
    between advance and keep the times. The collection at every version a reader may ask
    about, the stored times, and the compacted batch stay exact either way."""
    rng = np.random.default_rng({"Sym": 51, "kv": 52}[records])
    schema, key_col = (KV, "k") if records == "kv" else (SCHEMA, records)
    tr = Trace(schema, key_col, policy=SMALL_BATCHES)
    writer = tr.reader()
    held = None
    merges = Counter()
    real = trace_module._merge

    def spy(parts, since, at=None):
        merges[at is not None] += 1
        return real(parts, since, at)

    monkeypatch.setattr(trace_module, "_merge", spy)
    history: Counter = Counter()
    for t in range(400):
        # held now and then at random, and every 50th version whatever the seed: the merges
        # that keep the times are then there under any TICKTABLE_SEED_MIX (tests/seeds.py)
        if held is None and (rng.random() < 0.05 or t % 50 == 25):
            held = tr.reader()
        elif held is not None and rng.random() < 0.15:
            held.close()
            held = None
        writer.set_logical_compaction(Antichain([t]))
        n = int(rng.integers(0, 40))
        batch = _kv_batch(rng, n, (t,), 0) if records == "kv" else \
            random_batch(rng, n, times=(t,), time_spread=0, keys=6)
        tr.insert(batch)
        history.update(counter(batch))
        stored = tr.to_zset()
        assert stored.times is not None and bool((stored.times <= t).all()), f"step {t}: a time in the future"
        lo = tr.since.elements[0][0]
        for at in {lo, t}:
            want: Counter = Counter()
            for (rec, tt), w in history.items():
                if tt[0] <= at:
                    want[(rec, None)] += w
            got = counter(tr.accumulate(at=at), times=False)
            assert got == Counter({x: w for x, w in want.items() if w}), f"step {t} at {at}"
    assert merges[True] > 20 and merges[False] > 5, merges
    if held is not None:
        held.close()
    tr.compact()
    rows = tr.to_zset()
    assert rows.times is not None and bool((rows.times == 399).all())
    live = counter(rows, times=False)
    assert rows.num_rows == len(live), "the compacted batch holds a record twice"


def test_merge_policy_size_classes():
    p = MergePolicy(fanout=8, base=64)
    assert [p.level(n) for n in (0, 1, 64, 511, 512, 4095, 4096)] == [0, 0, 0, 0, 1, 1, 2]
    assert MergePolicy().level(1023) == 0 and MergePolicy().level(4096) == 1
    for bad in ({"fanout": 1}, {"base": 0}):
        with pytest.raises(InputError):
            MergePolicy(**bad)


@pytest.mark.parametrize("policy", [MergePolicy(), SMALL_BATCHES, MergePolicy(fanout=2, base=1)],
                         ids=["default", "small_batches", "binary"])
def test_merge_policy_keeps_the_spine_tiered_and_the_collection_exact(policy):
    # batches of a few rows, as an iterate's rounds insert them: after every insert the last
    # `fanout` batches are never all of one size class (they would have merged), the spine
    # stays short, and the collection at every version is the sum of what was inserted
    rng = np.random.default_rng(23)
    tr = Trace(SCHEMA, "K", dims=2, policy=policy)
    history: Counter = Counter()
    for v in range(600):
        t = (v // 7, v % 7)  # (step, round)
        batch = random_batch(rng, int(rng.integers(1, 30)), times=t, keys=40)
        tr.insert(batch)
        after = [len(b) for b in tr.batches]
        for (rec, tt), w in counter(batch).items():
            history[(rec, tt)] += w
        f = policy.fanout
        if len(after) >= f:
            assert policy.level(after[-f]) > policy.level(after[-1]), (v, after)
        if v % 25 == 0:
            at = Version(*t)
            want: Counter = Counter()
            for (rec, tt), w in history.items():
                if tt[0] <= at[0] and tt[1] <= at[1]:
                    want[(rec, None)] += w
            assert counter(tr.accumulate(at=at), times=False) == Counter({k: w for k, w in want.items() if w})
    total = sum(len(b) for b in tr.batches)
    assert len(tr.batches) <= policy.fanout * (policy.level(total) + 2), [len(b) for b in tr.batches]


@pytest.mark.parametrize("shape", ["random", "top_ties", "low_ties", "few_values", "key_runs"])
def test_packed_argsort_is_a_stable_argsort(shape):
    # one sort of the values with the row index in their low bits orders the top bits;
    # runs tied there are fixed up by the whole value: the result must be exactly numpy's
    # stable argsort, ties included (and past 2**20 rows it is numpy's)
    rng = np.random.default_rng(len(shape))
    for n in (0, 1, 2, 100, 2_048, 5_000, 40_000, 300_000, (1 << 20) + 5):
        if shape == "random":
            a = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
        elif shape == "top_ties":  # few distinct top 48 bits, random low 16
            a = (rng.integers(0, 50, n, dtype=np.uint64) << np.uint64(16)) | rng.integers(0, 2**16, n, dtype=np.uint64)
        elif shape == "low_ties":  # values differing only in their low bits, repeats among them
            a = np.uint64(7 << 40) | rng.integers(0, max(n // 2, 1), n, dtype=np.uint64)
        elif shape == "few_values":
            a = rng.integers(0, 30, n, dtype=np.uint64)
        else:  # order keys: rows of one key share the high 40 bits
            hi = rng.integers(0, 2**40, n // 3 + 1, dtype=np.uint64)
            a = (np.repeat(hi, 3)[:n] << np.uint64(24)) | rng.integers(0, 2**24, n, dtype=np.uint64)
        assert np.array_equal(indexed_module.argsort_u64(a), np.argsort(a, kind="stable"))
