"""bench/bench_nexmark.py: the generator's shape, and every query equal to pandas from scratch.

The benchmark reports events/s only for results it checked; these tests keep the generator
and the queries honest at a small size (no timing is asserted).
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from bench import bench_nexmark as nx
from engine.graph import UpdateGraph


def test_generator_proportions_ids_and_times():
    gen = nx.Generator(3)
    ev = [gen.events(s, 1_000) for s in range(0, 10_000, 1_000)]
    people = sum(e.person.num_rows for e in ev)
    auctions = sum(e.auction.num_rows for e in ev)
    bids = sum(e.bid.num_rows for e in ev)
    assert (people, auctions, bids) == (200, 600, 9_200)  # 1 : 3 : 46 of every 50 events
    pid = np.concatenate([e.person.column("id").to_numpy() for e in ev])
    aid = np.concatenate([e.auction.column("id").to_numpy() for e in ev])
    assert np.array_equal(pid, np.arange(1000, 1200)) and np.array_equal(aid, np.arange(1000, 1600))
    bid = [e.bid for e in ev]
    auction_of = np.concatenate([b.column("auction").to_numpy() for b in bid])
    t = np.concatenate([b.column("date_time").to_numpy() for b in bid])
    assert np.all(np.diff(t) >= 0) and t[-1] - t[0] < 1_000  # 0.1 ms an event
    assert auction_of.min() >= 1000 and auction_of.max() < 1600 + nx.AUCTION_ID_LEAD
    # half the bids go to a hot auction: a multiple of 100 past the first id
    assert 0.45 < np.mean((auction_of - 1000) % 100 == 0) < 0.6
    prices = np.concatenate([b.column("price").to_numpy() for b in bid])
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    a = pc.subtract(ev[0].auction.column("expires"), ev[0].auction.column("date_time")).to_numpy()
    assert a.min() >= 1 and a.max() <= 2 * 167 + 1  # up to twice the span of 100 auctions


@pytest.mark.parametrize("query", list(nx.QUERIES))
def test_query_equals_pandas_and_every_update_is_valid(query):
    gen = nx.Generator(1)
    cycles = [gen.events(s, 700) for s in range(0, 21_000, 700)]
    g = UpdateGraph(validate=True)  # every table's every update: TableUpdate.validate
    person = g.append_only_table(nx.PERSON, name="person")
    auction = g.append_only_table(nx.AUCTION, name="auction")
    bid = g.append_only_table(nx.BID, name="bid")
    out = nx.QUERIES[query](person, auction, bid)
    changed = 0
    for i, ev in enumerate(cycles):
        person.append(ev.person)
        auction.append(ev.auction)
        bid.append(ev.bid)
        step = out.last_step
        g.run_cycle()
        changed += out.last_step != step
        if i % 10 == 9:  # equal to pandas' from scratch along the way, not only at the end
            nx.check(query, out.to_pandas(), cycles[: i + 1])
    assert changed >= 3, f"{query}'s result changed in {changed} cycles only"
