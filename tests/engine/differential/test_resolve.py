"""resolve_triples: triples + a keyed table's rows (staged writes folded in) -> writes.

Examples first (exact upserts and deletes, every refusal naming table and key), then a
seeded model check: random valid and invalid untimed batches against a dict of what the
table will hold, resolved and staged with no cycle between batches.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from engine.differential.resolve import KeyedWrites, resolve_triples
from engine.differential.zset import ZSet
from engine.errors import InputError, SchemaError
from engine.graph import UpdateGraph

KV = pa.schema([("k", pa.int64()), ("s", pa.string())])


def z(*triples, timed=False):
    """``(k, s, diff)`` or, timed, ``(k, s, time, diff)`` rows."""
    if timed:
        return ZSet.from_triples([((k, s), t, d) for k, s, t, d in triples], KV)
    return ZSet.from_triples([((k, s), None, d) for k, s, d in triples], KV)


@pytest.fixture
def table():
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k", name="t")
    t.upsert({"k": [1, 2], "s": ["a", "b"]})
    g.run_cycle()
    return t


def test_update_delete_insert_and_noop_become_upserts_and_deletes(table):
    w = resolve_triples(table, z((1, "a", -1), (1, "A", 1), (2, "b", -1), (3, "c", 1),
                                 (2, "x", 1), (2, "x", -1)))
    assert isinstance(w, KeyedWrites) and w.num_rows == 3
    assert w.upserts.to_pylist() == [{"k": 1, "s": "A"}, {"k": 3, "s": "c"}]
    assert w.deletes.to_pylist() == [{"k": 2}]
    assert table.pending_rows == 0  # pure: nothing staged
    w.stage(table)
    table.graph.run_cycle()
    assert table.to_pandas().values.tolist() == [[1, "A"], [3, "c"]]


def test_times_are_walked_in_order_and_the_last_decides(table):
    w = resolve_triples(table, z((1, "a", 0, -1), (1, "A", 0, 1), (1, "A", 1, -1),
                                 (4, "d", 0, 1), (4, "d", 2, -1), (4, "D", 2, 1), timed=True))
    assert w.upserts.to_pylist() == [{"k": 4, "s": "D"}] and w.deletes.to_pylist() == [{"k": 1}]


def test_writes_staged_before_are_seen_without_a_cycle(table):
    table.upsert({"k": [1], "s": ["staged"]})
    table.delete({"k": [2]})
    with pytest.raises(InputError, match=r"retracts a row key \{'k': 1\} does not hold \(it "
                                         r"holds \{'k': 1, 's': 'staged'\}\)"):
        resolve_triples(table, z((1, "a", -1)))
    w = resolve_triples(table, z((1, "staged", -1), (2, "new", 1)))
    assert w.upserts.to_pylist() == [{"k": 2, "s": "new"}] and w.deletes.to_pylist() == [{"k": 1}]


@pytest.mark.parametrize("batch, match", [
    (z((9, "x", -1)), r"table 't': diff row \{'k': 9, 's': 'x'\} with weight -1 retracts a row "
                      r"key \{'k': 9\} does not hold \(it holds None\)"),
    (z((1, "zz", -1), (1, "n", 1)), r"retracts a row key \{'k': 1\} does not hold \(it holds "
                                    r"\{'k': 1, 's': 'a'\}\)"),
    (z((1, "n", 1)), r"table 't': diff row \{'k': 1, 's': 'n'\} with weight \+1 adds a second "
                     r"row for key \{'k': 1\}, which holds \{'k': 1, 's': 'a'\}; retract that "
                     r"row \(-1\) in the same batch"),
    (z((7, "p", 1), (7, "q", 1)), r"table 't': key \{'k': 7\} gets 2 \+1 rows"),
    (z((1, "a", -1), (1, "a", -1)), r"table 't' is keyed by \['k'\].*weights must sum to \+1 "
                                    r"or -1 per row, got -2 for \{'k': 1, 's': 'a'\}"),
    (z((3, "c", 0, 1), (3, "d", 0, 1), timed=True), r"key \{'k': 3\} gets 2 \+1 rows at time 0"),
    (ZSet.from_triples([((5, "e"), (0, 1), 1)], KV), r"table 't': .*one-coordinate times"),
])
def test_invalid_batches_name_table_and_key(table, batch, match):
    with pytest.raises(InputError, match=match) as info:
        resolve_triples(table, batch)
    assert "\n" not in str(info.value)


def test_columns_must_be_the_tables(table):
    other = ZSet.from_triples([((1,), None, 1)], pa.schema([("k", pa.int64())]))
    with pytest.raises(SchemaError, match=r"table 't': missing column\(s\) \['s'\]"):
        resolve_triples(table, other)
    with pytest.raises(InputError, match="KeyedTable"):
        resolve_triples(table.graph.append_only_table(KV), z((1, "a", 1)))


def test_string_and_composite_keys_are_compared_exactly():
    g = UpdateGraph(validate=True)
    schema = pa.schema([("a", pa.string()), ("b", pa.int32()), ("v", pa.float64())])
    t = g.keyed_table(schema, ["a", "b"], name="c")
    t.upsert({"a": ["x", "x"], "b": [1, 2], "v": [1.0, 2.0]})
    g.run_cycle()
    batch = ZSet.from_triples([(("x", 1, 1.0), None, -1), (("x", 1, 1.5), None, 1),
                               (("x", 3, 3.0), None, 1)], schema)
    w = resolve_triples(t, batch)
    assert w.upserts.to_pylist() == [{"a": "x", "b": 1, "v": 1.5}, {"a": "x", "b": 3, "v": 3.0}]
    bad = ZSet.from_triples([(("x", 2, 2.0), None, 1)], schema)
    with pytest.raises(InputError, match=r"second row for key \{'a': 'x', 'b': 2\}"):
        resolve_triples(t, bad)


def _valid(rng, model, keys):
    out = []
    for k in rng.sample(keys, rng.randint(1, 5)):
        cur, new = model.get(k), rng.choice(["a", "b", "c"])
        r = rng.random()
        if cur is not None and r < 0.4:
            out += [(k, cur, -1), (k, new, 1)]
        elif cur is not None and r < 0.7:
            out.append((k, cur, -1))
        elif cur is None:
            out.append((k, new, 1))
        if rng.random() < 0.2:
            noise = rng.choice(["n1", "n2"])
            out += [(k, noise, 1), (k, noise, -1)]
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_random_batches_between_cycles_match_a_dict_model(seed):
    rng = random.Random(seed)
    g = UpdateGraph(validate=True)
    t = g.keyed_table(KV, "k", name="t")
    keys = list(range(25))
    model: dict[int, str] = {}  # what the table will hold once its staged writes apply
    refused = 0
    for rnd in range(300):
        if rng.random() < 0.2:  # a plain upsert staged between batches is seen too
            k, s = rng.choice(keys), rng.choice(["u", "v"])
            t.upsert({"k": [k], "s": [s]})
            model[k] = s
        if rng.random() < 0.15:
            k = rng.choice(keys)
            rows = [(k, "ghost", -1)] if k not in model else [(k, "second", 1)]
            with pytest.raises(InputError):
                with t.write_lock():
                    resolve_triples(t, z(*rows)).stage(t)
            refused += 1
            continue
        rows = _valid(rng, model, keys)
        with t.write_lock():
            resolve_triples(t, z(*rows)).stage(t)
        net: dict[tuple[int, str], int] = {}
        for k, s, d in rows:
            net[(k, s)] = net.get((k, s), 0) + d
        for (k, _s), w in net.items():
            if w < 0:
                del model[k]
        for (k, s), w in net.items():
            if w > 0:
                model[k] = s
        if rng.random() < 0.5:
            g.run_cycle()
            got = dict(zip(*t.to_arrow().to_pydict().values(), strict=True))
            assert got == model, f"seed {seed}, round {rnd}"
    assert refused > 20
