"""bench_nexmark — Nexmark q0-q5, q7, q9 on the engine, against Feldera's published figures.

Issue #39 item 9. Nexmark models an online auction: people register, open auctions and bid.
The generator follows Apache Beam's ``NexmarkGenerator`` (the one Feldera, Flink and Beam
run): events numbered 0, 1, 2, ... are, out of every 50, one person, three auctions and 46
bids; ids grow with the event number, bids go to a "hot" auction half of the time and to a
hot bidder three times out of four, prices are ``round(10**(6u) * 100)`` cents, event time
advances 0.1 ms an event (10,000 events/s), and an auction stays open for a uniform time up
to twice the span in which 100 new auctions arrive. It is vectorized (numpy) and seeded, so
its draws differ from Beam's Java ``Random`` while its shapes and ratios are the same. Times
are int64 milliseconds.

Queries (the Nexmark SQL, on the engine's table API; each runs on its own graph fed with the
same events, as Feldera's runs are one query each):

- q0 pass-through: bid's columns as they are.
- q1 currency conversion: ``price * 0.908``.
- q2 selection: bids with ``auction % 123 == 0``.
- q3 local item suggestion: auctions of category 10 joined with their sellers from OR, ID, CA.
- q4 average selling price by category: the highest bid within each auction's lifetime, then
  the mean of those per category.
- q5 hot items: per sliding window (10 s long, every 2 s) the auctions with the most bids
  (counted by 2 s panes, each window summing its five).
- q7 highest bid: per tumbling 10 s window, the bids of the highest price.
- q9 winning bids: each auction with its highest bid (earliest on ties) within its lifetime.

Every query's result is checked against pandas computing it from scratch over all events.
Every cycle size runs over the same events (generated in units that divide each size).
Timed per cycle: staging the cycle's events into the three source tables and the cycle
itself (generation is done before timing, as Feldera generates in other threads). Events/s
is events over the sum of those times; the process is single-threaded, so that is per core.
Feldera's figures (``feldera/feldera`` ``benchmark/README.md``, "16-core Nexmark Streaming
Performance", mean events/s) are divided by 16.

Run: python bench/bench_nexmark.py [--events 200000] [--cycle 1000 10000] [--queries q0 q4 ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_table, stats_ms, write_json  # noqa: E402
from engine.graph import UpdateGraph  # noqa: E402
from engine.ops.aggregate import agg  # noqa: E402
from engine.table import Table  # noqa: E402

# Beam's NexmarkConfiguration defaults and NexmarkGenerator constants
PERSON_PROPORTION, AUCTION_PROPORTION, TOTAL_PROPORTION = 1, 3, 50
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID = 1000, 1000, 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO = HOT_BIDDER_RATIO = HOT_SELLER_RATIO = 100  # hot ids are multiples of these
HOT_AUCTIONS, HOT_BIDDERS, HOT_SELLERS = 2, 4, 4  # 1 in n draws is not hot
NUM_ACTIVE_PEOPLE, PERSON_ID_LEAD = 1000, 10
NUM_IN_FLIGHT_AUCTIONS, AUCTION_ID_LEAD = 100, 10
INTER_EVENT_US = 100  # 10,000 events/s
BASE_TIME_MS = 1_700_000_000_000
US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter",
               "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
CHANNELS = 10_000

#: Feldera, 16-core streaming run, mean events/s (its benchmark/README.md).
FELDERA_16_CORES = {"q0": 6_973_987, "q1": 6_595_871, "q2": 6_748_549, "q3": 6_608_075,
                    "q4": 4_233_521, "q5": 6_589_786, "q7": 3_136_763, "q9": 910_680}

PERSON = pa.schema([("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
                    ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
                    ("date_time", pa.int64()), ("extra", pa.string())])
AUCTION = pa.schema([("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
                     ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", pa.int64()),
                     ("expires", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
                     ("extra", pa.string())])
BID = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                 ("channel", pa.string()), ("url", pa.string()), ("date_time", pa.int64()),
                 ("extra", pa.string())])


# --- the generator ------------------------------------------------------------------------


def _timestamp(e: np.ndarray) -> np.ndarray:
    return BASE_TIME_MS + (e * INTER_EVENT_US) // 1000


def _last_person(e: np.ndarray) -> np.ndarray:
    """Beam's lastBase0PersonId: the newest person id at event ``e``."""
    epoch, offset = np.divmod(e, TOTAL_PROPORTION)
    return epoch * PERSON_PROPORTION + np.minimum(offset, PERSON_PROPORTION - 1)


def _last_auction(e: np.ndarray) -> np.ndarray:
    """Beam's lastBase0AuctionId: the newest auction id at event ``e``."""
    epoch, offset = np.divmod(e, TOTAL_PROPORTION)
    before = offset < PERSON_PROPORTION
    after = offset >= PERSON_PROPORTION + AUCTION_PROPORTION
    epoch = np.where(before, epoch - 1, epoch)
    offset = np.where(before | after, AUCTION_PROPORTION - 1, offset - PERSON_PROPORTION)
    return np.maximum(epoch * AUCTION_PROPORTION + offset, 0)


def _next_person(e: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Beam's nextBase0PersonId: one of the recent people, or a few not yet seen."""
    people = _last_person(e) + 1
    active = np.minimum(people, NUM_ACTIVE_PEOPLE)
    return people - active + (rng.random(e.size) * (active + PERSON_ID_LEAD)).astype(np.int64)


def _next_auction(e: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Beam's nextBase0AuctionId: one of the auctions in flight, or a few not yet opened."""
    last = _last_auction(e)
    low = np.maximum(last - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + (rng.random(e.size) * (last - low + 1 + AUCTION_ID_LEAD)).astype(np.int64)


def _price(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


def _pick(rng: np.random.Generator, pool: pa.Array, n: int) -> pa.Array:
    return pool.take(pa.array(rng.integers(0, len(pool), n)))


@dataclass
class Events:
    """One cycle's events, split by kind (each in event order)."""

    person: pa.Table
    auction: pa.Table
    bid: pa.Table

    @property
    def size(self) -> int:
        return self.person.num_rows + self.auction.num_rows + self.bid.num_rows


class Generator:
    """Nexmark events ``start .. start + n`` as three Arrow tables (see the module docstring)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        r = np.random.default_rng(seed + 1)
        self.names = pa.array([f"{f} {last}" for f in FIRST_NAMES for last in LAST_NAMES])
        self.emails = pa.array([f"{w}@{d}.com" for w in ("mail", "ab", "xyz", "qq", "pp")
                                for d in ("a", "b", "c", "d", "e", "f", "g")])
        self.cards = pa.array([" ".join(f"{x:04d}" for x in r.integers(0, 10_000, 4))
                               for _ in range(500)])
        self.cities, self.states = pa.array(US_CITIES), pa.array(US_STATES)
        self.words = pa.array([f"item{w:05d}" for w in r.integers(0, 100_000, 2_000)])
        self.channels = pa.array([f"channel-{i}" for i in range(CHANNELS)])
        self.urls = pa.array([f"https://www.nexmark.com/{a}/item.htm?query=1&channel_id={i}"
                              for i, a in enumerate(r.integers(0, 1 << 30, CHANNELS))])
        self.extras = pa.array(["x" * int(k) for k in r.integers(0, 60, 1_000)])

    def events(self, start: int, n: int) -> Events:
        rng = self.rng
        e = np.arange(start, start + n, dtype=np.int64)
        offset = e % TOTAL_PROPORTION
        pe = e[offset < PERSON_PROPORTION]
        ae = e[(offset >= PERSON_PROPORTION) & (offset < PERSON_PROPORTION + AUCTION_PROPORTION)]
        be = e[offset >= PERSON_PROPORTION + AUCTION_PROPORTION]

        person = pa.table({
            "id": FIRST_PERSON_ID + _last_person(pe), "name": _pick(rng, self.names, pe.size),
            "email_address": _pick(rng, self.emails, pe.size),
            "credit_card": _pick(rng, self.cards, pe.size),
            "city": _pick(rng, self.cities, pe.size), "state": _pick(rng, self.states, pe.size),
            "date_time": _timestamp(pe), "extra": _pick(rng, self.extras, pe.size)}, schema=PERSON)

        hot = rng.integers(0, HOT_SELLERS, ae.size) > 0
        seller = np.where(hot, (_last_person(ae) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                          _next_person(ae, rng))
        ts = _timestamp(ae)
        # Beam's nextAuctionLengthMs: up to twice the time in which 100 more auctions open
        horizon = _timestamp(ae + NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION) - ts
        initial = _price(rng, ae.size)
        auction = pa.table({
            "id": FIRST_AUCTION_ID + _last_auction(ae), "item_name": _pick(rng, self.words, ae.size),
            "description": _pick(rng, self.words, ae.size), "initial_bid": initial,
            "reserve": initial + _price(rng, ae.size), "date_time": ts,
            "expires": ts + 1 + (rng.random(ae.size) * np.maximum(2 * horizon, 1)).astype(np.int64),
            "seller": FIRST_PERSON_ID + seller,
            "category": FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, ae.size),
            "extra": _pick(rng, self.extras, ae.size)}, schema=AUCTION)

        hot_a = rng.integers(0, HOT_AUCTIONS, be.size) > 0
        auc = np.where(hot_a, (_last_auction(be) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                       _next_auction(be, rng))
        hot_b = rng.integers(0, HOT_BIDDERS, be.size) > 0
        bidder = np.where(hot_b, (_last_person(be) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                          _next_person(be, rng))
        ch = rng.integers(0, CHANNELS, be.size)
        bid = pa.table({
            "auction": FIRST_AUCTION_ID + auc, "bidder": FIRST_PERSON_ID + bidder,
            "price": _price(rng, be.size), "channel": self.channels.take(pa.array(ch)),
            "url": self.urls.take(pa.array(ch)), "date_time": _timestamp(be),
            "extra": _pick(rng, self.extras, be.size)}, schema=BID)
        return Events(person, auction, bid)


# --- the queries on the engine --------------------------------------------------------------

F = pc.field


def _in_lifetime(t: Table) -> Table:
    return t.where((F("date_time") >= F("a_date_time")) & (F("date_time") <= F("expires")))


def _bids_in_auctions(bid: Table, auction: Table, joins: list[str]) -> Table:
    return _in_lifetime(bid.join(auction, "auction=id", ["a_date_time=date_time", "expires", *joins]))


def q0(person: Table, auction: Table, bid: Table) -> Table:
    return bid.view("auction", "bidder", "price", "date_time", "extra")


def q1(person: Table, auction: Table, bid: Table) -> Table:
    return bid.view("auction", "bidder", "date_time", "extra",
                    price=pc.multiply(F("price").cast(pa.float64()), 0.908))


def q2(person: Table, auction: Table, bid: Table) -> Table:
    # auction % 123 == 0 (Arrow has no modulo kernel; integer division truncates)
    return bid.where(F("auction") == pc.multiply(pc.divide(F("auction"), 123), 123)) \
              .view("auction", "price")


def q3(person: Table, auction: Table, bid: Table) -> Table:
    sellers = person.where(pc.is_in(F("state"), pa.array(["OR", "ID", "CA"])))
    return auction.where(F("category") == 10) \
                  .join(sellers, "seller=id", ["name", "city", "state"]) \
                  .view("name", "city", "state", "id")


def q4(person: Table, auction: Table, bid: Table) -> Table:
    wins = _bids_in_auctions(bid, auction, ["category"]) \
        .agg_by([agg.max("price", "final")], by=["auction", "category"])
    return wins.agg_by([agg.mean("final", "avg_final")], by="category")


def q5(person: Table, auction: Table, bid: Table) -> Table:
    # Sliding windows by panes: bids are counted per auction and 2 s pane, and the 10 s
    # window starting every 2 s (window w starts at w * 2 s) sums its five panes, so each
    # bid is counted once, not once per window it falls in. The auctions whose count is
    # their window's highest join it on (w, count): ``num >= maxn`` is ``num == maxn``, and
    # an equality join touches only the rows at the top when the top moves (a join on w
    # alone would modify every row of the window each time).
    panes = bid.view("auction", p=pc.divide(F("date_time"), 2000)).count_by("n", by=["auction", "p"])
    hops = [panes.view("auction", "n", w=pc.subtract(F("p"), k)) for k in range(5)]
    counts = hops[0].merge(*hops[1:]).agg_by([agg.sum("n", "num")], by=["auction", "w"])
    top = counts.agg_by([agg.max("num", "maxn")], by="w")
    return counts.join(top, ["w", "num=maxn"], []).view("auction", "num", "w")


def q7(person: Table, auction: Table, bid: Table) -> Table:
    windowed = bid.update(w=pc.divide(F("date_time"), 10_000))
    top = windowed.agg_by([agg.max("price", "maxprice")], by="w")
    return windowed.join(top, ["w", "price=maxprice"], []) \
                   .view("auction", "price", "bidder", "date_time", "extra")


def q9(person: Table, auction: Table, bid: Table) -> Table:
    bids = _bids_in_auctions(bid.rename_columns({"date_time": "b_date_time"}).update(
        date_time=F("b_date_time")), auction, ["item_name", "initial_bid", "reserve", "seller",
                                                "category"])
    return bids.sort(["price", "b_date_time"], descending=[True, False]).first_by("auction") \
               .view("auction", "item_name", "initial_bid", "reserve", "a_date_time", "expires",
                     "seller", "category", "bidder", "price", "b_date_time")


QUERIES: dict[str, Callable[[Table, Table, Table], Table]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q7": q7, "q9": q9}


# --- the same queries in pandas, from scratch -----------------------------------------------


def _lifetime_pd(bid: pd.DataFrame, auction: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    a = auction[["id", "date_time", "expires", *cols]].rename(
        columns={"id": "auction", "date_time": "a_date_time"})
    j = bid.merge(a, on="auction")
    return j[(j["date_time"] >= j["a_date_time"]) & (j["date_time"] <= j["expires"])]


def expected(q: str, person: pd.DataFrame, auction: pd.DataFrame, bid: pd.DataFrame) -> pd.DataFrame:
    if q == "q0":
        return bid[["auction", "bidder", "price", "date_time", "extra"]]
    if q == "q1":
        return bid[["auction", "bidder", "date_time", "extra"]].assign(price=bid["price"] * 0.908)
    if q == "q2":
        return bid.loc[bid["auction"] % 123 == 0, ["auction", "price"]]
    if q == "q3":
        p = person[person["state"].isin(["OR", "ID", "CA"])][["id", "name", "city", "state"]]
        a = auction[auction["category"] == 10][["id", "seller"]]
        return a.merge(p.rename(columns={"id": "seller"}), on="seller")[["name", "city", "state", "id"]]
    if q == "q4":
        j = _lifetime_pd(bid, auction, ["category"])
        wins = j.groupby(["auction", "category"], as_index=False)["price"].max()
        return wins.groupby("category", as_index=False)["price"].mean().rename(
            columns={"price": "avg_final"})
    if q == "q5":
        hops = pd.concat([bid[["auction"]].assign(w=bid["date_time"] // 2000 - k) for k in range(5)])
        counts = hops.groupby(["auction", "w"], as_index=False).size().rename(columns={"size": "num"})
        top = counts.groupby("w", as_index=False)["num"].max().rename(columns={"num": "maxn"})
        j = counts.merge(top, on="w")
        return j[j["num"] >= j["maxn"]][["auction", "num", "w"]]
    if q == "q7":
        b = bid.assign(w=bid["date_time"] // 10_000)
        top = b.groupby("w", as_index=False)["price"].max()
        return b.merge(top, on=["w", "price"])[["auction", "price", "bidder", "date_time", "extra"]]
    if q == "q9":
        j = _lifetime_pd(bid.rename(columns={"date_time": "b_date_time"}).assign(
            date_time=bid["date_time"]), auction, ["item_name", "initial_bid", "reserve", "seller",
                                                   "category"])
        j = j.sort_values(["price", "b_date_time"], ascending=[False, True], kind="stable")
        return j.groupby("auction", as_index=False, sort=False).first()[
            ["auction", "item_name", "initial_bid", "reserve", "a_date_time", "expires", "seller",
             "category", "bidder", "price", "b_date_time"]]
    raise ValueError(f"unknown query {q!r}")


def _canonical(df: pd.DataFrame) -> pd.DataFrame:
    df = df.reset_index(drop=True)
    return df.sort_values(list(df.columns), kind="stable").reset_index(drop=True)


def check(q: str, got: pd.DataFrame, events: list[Events]) -> None:
    """Raises AssertionError unless the engine's result equals pandas' from scratch."""
    frames = [pa.concat_tables([getattr(ev, k) for ev in events]).to_pandas()
              for k in ("person", "auction", "bid")]
    want = expected(q, *frames)
    assert list(got.columns) == list(want.columns), (q, list(got.columns), list(want.columns))
    pd.testing.assert_frame_equal(_canonical(got), _canonical(want), check_dtype=False,
                                  check_exact=False, rtol=1e-9)


# --- running ---------------------------------------------------------------------------------


def run(q: str, cycles: list[Events], verify: bool) -> dict:
    g = UpdateGraph()
    person = g.append_only_table(PERSON, name="person")
    auction = g.append_only_table(AUCTION, name="auction")
    bid = g.append_only_table(BID, name="bid")
    out = QUERIES[q](person, auction, bid)
    samples: list[int] = []
    cpu0 = time.process_time()
    for ev in cycles:
        t = time.perf_counter_ns()
        person.append(ev.person)
        auction.append(ev.auction)
        bid.append(ev.bid)
        g.run_cycle()
        samples.append(time.perf_counter_ns() - t)
    cpu = time.process_time() - cpu0
    events = sum(ev.size for ev in cycles)
    wall = sum(samples) / 1e9
    if verify:
        check(q, out.to_pandas(), cycles)
    per_core = FELDERA_16_CORES[q] / 16
    return {"query": q, "events": events, "cycle": cycles[0].size, "rows_out": out.size,
            "events_per_s": events / wall, "events_per_cpu_s": events / cpu,
            "feldera_per_core": per_core, "ratio": events / wall / per_core,
            "cycle_ms": stats_ms(samples), "checked": verify}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="events per run")
    ap.add_argument("--cycle", type=int, nargs="+", default=[1_000, 10_000], help="events per cycle")
    ap.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES))
    ap.add_argument("--no-check", action="store_true", help="skip the pandas comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    results = []
    # the same events for every cycle size: generated in units that divide each size
    unit = math.gcd(*args.cycle)
    gen = Generator(args.seed)
    units = [gen.events(s, min(unit, args.events - s)) for s in range(0, args.events, unit)]
    for size in args.cycle:
        k = size // unit
        cycles = [Events(*(pa.concat_tables([getattr(u, part) for u in units[i:i + k]])
                           for part in ("person", "auction", "bid")))
                  for i in range(0, len(units), k)]
        for q in args.queries:
            r = run(q, cycles, not args.no_check)
            results.append(r)
            print(f"{q} cycle={size:,}: {r['events_per_s']:,.0f} events/s "
                  f"({r['ratio']:.2f}x Feldera per core), cycle p50 "
                  f"{r['cycle_ms']['median_ms']:.2f} ms", flush=True)
    rows = [{"query": r["query"], "cycle": r["cycle"], "events/s": r["events_per_s"],
             "per CPU s": r["events_per_cpu_s"], "Feldera/core": r["feldera_per_core"],
             "ratio": r["ratio"], "p50 ms": r["cycle_ms"]["median_ms"],
             "mean ms": r["cycle_ms"]["mean_ms"], "p99 ms": r["cycle_ms"]["p99_ms"],
             "rows out": r["rows_out"], "checked": "pandas" if r["checked"] else "no"}
            for r in results]
    print_table(f"Nexmark, {args.events:,} events a run (Feldera: 16-core mean / 16)", rows,
                ["query", "cycle", "events/s", "per CPU s", "Feldera/core", "ratio", "p50 ms",
                 "mean ms", "p99 ms", "rows out", "checked"])
    path = write_json("bench_nexmark", {"events": args.events, "results": results}, args.json)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
