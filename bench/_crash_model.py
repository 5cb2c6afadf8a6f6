"""The crash test's tables, its model of what the writers were told, the report, the checks.

:class:`Model` holds every write a writer had acknowledged, and the one each writer had in
flight when the server was killed. After a restart :func:`verify` compares the restored
tables with it, counts what differs into the :class:`CrashReport`, and folds what each
in-flight write turned out to be (applied or not) into the model, so it is exact again
before the next round. Used by ``bench/crash.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import ticktable as tt

LOG = pa.schema([("w", pa.int64()), ("b", pa.int64()), ("i", pa.int64()), ("x", pa.float64())])
KV = pa.schema([("k", pa.int64()), ("w", pa.int64()), ("v", pa.int64()), ("s", pa.string())])
TXA = pa.schema([("t", pa.int64()), ("p", pa.int64()), ("i", pa.int64())])
TXB = pa.schema([("t", pa.int64()), ("i", pa.int64()), ("note", pa.string())])
ST = pa.schema([("b", pa.int64()), ("i", pa.int64()), ("a", pa.string())])
STREAM = "crash-stream"
KEYED_WRITERS = 2
KEYS_PER_WRITER = 48

# ------------------------------------------------------------------------------- the model
ACKED, INFLIGHT = "acked", "in flight"


@dataclass(slots=True)
class Tx:
    """A staged two-table transaction: its row counts and how far it got."""

    na: int
    nb: int
    status: str  # staging, open, committing, committed, aborting, aborted, dropped,
    #              late commit (dropped, then committed after the restart), flagged (reported)


@dataclass(slots=True)
class Model:
    """What the writers were told: acknowledged writes, and the ones in flight at the kill."""

    appends: dict[int, tuple[int, str]] = field(default_factory=dict)  # batch -> rows, state
    kv: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # k -> (w, v, s)
    kv_inflight: dict[int, tuple[dict[int, tuple[int, int, str]], set[int]] | None] = \
        field(default_factory=dict)  # writer -> (upserts, deletes) in flight
    tx: dict[int, Tx] = field(default_factory=dict)  # tag -> transaction
    stream: dict[int, int] = field(default_factory=dict)  # batch id -> rows
    stream_inflight: tuple[int, int] | None = None  # (batch id, rows)
    stream_next: int = 0
    kv_acked: int = 0
    counter: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_id(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter


def kv_apply(state: dict[int, tuple[int, int, str]], upserts: dict[int, tuple[int, int, str]],
             deletes: set[int]) -> dict[int, tuple[int, int, str]]:
    """``state`` after a write of ``upserts`` and ``deletes`` (disjoint keys)."""
    out = dict(state)
    for k in deletes:
        out.pop(k, None)
    out.update(upserts)
    return out


# ------------------------------------------------------------------------------ the report
@dataclass
class CrashReport:
    """What a crash run found; every count but the coverage ones must be 0.

    Attributes
    ----------
    checked
        Distinct acknowledged writes (append batches, keyed writes, committed transactions,
        stream batches), each checked after every restart that followed it.
    checks
        Those checks, summed over the restarts (a keyed writer's state counts one per check).
    lost, duplicated
        Acknowledged writes missing, or present more than once, after a restart.
    uncommitted_visible
        Rows of transactions never committed (staged, abandoned, aborted) that showed up.
    torn
        Writes or transactions partly visible (some rows or one table only).
    derived_mismatches, subscriber_mismatches
        Derived tables differing from their recomputation; subscribers that did not
        converge to the snapshot.
    writer_errors
        Calls refused while the server was up (the first messages are in ``failures``).
    mid_checkpoint_kills, mid_commit_kills
        Kills that left an unfinished checkpoint on disk; kills while a commit was sent and
        not yet answered.
    inflight_applied, inflight_dropped
        Unacknowledged writes found applied, or not, after the restart.
    stream_retries_refused
        Stream batches retried after a restart that the server had applied already.
    """

    kill_points: int
    seed: int
    checked: int = 0
    checks: int = 0
    lost: int = 0
    duplicated: int = 0
    uncommitted_visible: int = 0
    torn: int = 0
    derived_mismatches: int = 0
    subscriber_mismatches: int = 0
    writer_errors: int = 0
    mid_checkpoint_kills: int = 0
    mid_commit_kills: int = 0
    inflight_applied: int = 0
    inflight_dropped: int = 0
    stream_retries_refused: int = 0
    checkpoints_seen: int = 0
    restart_seconds: list[float] = field(default_factory=list)
    recovery_seconds: list[float] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> int:
        """The sum of every count that must be 0."""
        return (self.lost + self.duplicated + self.uncommitted_visible + self.torn
                + self.derived_mismatches + self.subscriber_mismatches + self.writer_errors)

    def fail(self, what: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(what)

    def figures(self) -> dict[str, Any]:
        """The one-row summary table."""
        rs = np.asarray(self.restart_seconds or [np.nan])
        rec = np.asarray([x for x in self.recovery_seconds if x == x] or [np.nan])
        return {"kill points": self.kill_points, "acked checked": self.checked,
                "lost": self.lost, "duplicated": self.duplicated,
                "uncommitted visible": self.uncommitted_visible, "torn": self.torn,
                "derived mismatches": self.derived_mismatches,
                "subscriber mismatches": self.subscriber_mismatches,
                "writer errors": self.writer_errors,
                "mid-checkpoint kills": self.mid_checkpoint_kills,
                "mid-commit kills": self.mid_commit_kills,
                "restart s median": float(np.median(rs)),
                "restart s p99": float(np.percentile(rs, 99)),
                "recovery s median": float(np.median(rec)),
                "recovery s p99": float(np.percentile(rec, 99))}


# ------------------------------------------------------------------------------ verifying
def _count_rows(t: pa.Table, by: str) -> dict[int, int]:
    if t.num_rows == 0:
        return {}
    vc = pc.value_counts(t.column(by))
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def _verify_appends(log: pa.Table, model: Model, rep: CrashReport) -> None:
    """Each batch id: its rows ``i = 0..n-1`` exactly once, or (unacknowledged) none."""
    got: dict[int, Counter[int]] = {}
    for b, i in zip(log.column("b").to_pylist(), log.column("i").to_pylist(), strict=True):
        got.setdefault(b, Counter())[i] += 1
    for b in set(got) - set(model.appends):
        rep.uncommitted_visible += 1
        rep.fail(f"log: batch {b} was never sent")
    for b, (n, state) in list(model.appends.items()):
        seen = got.get(b, Counter())
        whole = Counter(range(n))
        rep.checks += state == ACKED
        if seen == whole:
            if state != ACKED:
                rep.inflight_applied += 1
                model.appends[b] = (n, ACKED)
        elif not seen:
            if state == ACKED:
                rep.lost += 1
                rep.fail(f"log: acknowledged batch {b} ({n} rows) is missing")
                del model.appends[b]  # reported once
            else:
                rep.inflight_dropped += 1
                del model.appends[b]
        elif set(seen) == set(whole) and len(set(seen.values())) == 1:
            rep.duplicated += 1
            rep.fail(f"log: batch {b} is there {next(iter(seen.values()))} times")
            model.appends[b] = (n, ACKED)
        else:
            rep.torn += 1
            rep.fail(f"log: batch {b} is partly there ({sum(seen.values())} of {n} rows)")
            model.appends[b] = (n, ACKED)


def _verify_keyed(kv: pa.Table, model: Model, rep: CrashReport) -> None:
    """Per writer: the model, or the model plus its one write in flight."""
    rows = {k: (w, v, s) for k, w, v, s in zip(*(kv.column(c).to_pylist() for c in KV.names),
                                                strict=True)}
    if len(rows) != kv.num_rows:
        rep.duplicated += 1
        rep.fail(f"kv: {kv.num_rows} rows for {len(rows)} keys")
    new = {}
    for w in range(KEYED_WRITERS):
        mine = {k: x for k, x in rows.items() if k // 1000 == w}
        before = {k: x for k, x in model.kv.items() if k // 1000 == w}
        rep.checks += 1
        pending = model.kv_inflight.get(w)
        after = kv_apply(before, *pending) if pending is not None else None
        if mine == before:
            if pending is not None:
                rep.inflight_dropped += 1
        elif after is not None and mine == after:
            rep.inflight_applied += 1
        else:
            rep.lost += 1
            diff = sorted(set(mine.items()) ^ set(before.items()))[:6]
            rep.fail(f"kv: writer {w}'s keys differ from every acknowledged state: {diff}")
        new.update(mine)
        model.kv_inflight[w] = None
    stray = {k for k in rows if k // 1000 >= KEYED_WRITERS}
    if stray:
        rep.uncommitted_visible += 1
        rep.fail(f"kv: keys no writer wrote: {sorted(stray)[:6]}")
    model.kv = new


def _verify_transactions(txa: pa.Table, txb: pa.Table, model: Model, rep: CrashReport) -> None:
    """Committed: whole in both tables; commit in flight: all or nothing; the rest: absent."""
    ca, cb = _count_rows(txa, "t"), _count_rows(txb, "t")
    for t in (set(ca) | set(cb)) - set(model.tx):
        rep.uncommitted_visible += 1
        rep.fail(f"transaction {t} was never written")
    for tag, tx in model.tx.items():
        a, b = ca.get(tag, 0), cb.get(tag, 0)
        whole, none = (a, b) == (tx.na, tx.nb), (a, b) == (0, 0)
        if tx.status == "flagged":  # reported once already
            continue
        if tx.status not in ("committed", "committing"):  # never committed: never visible
            if not none:
                rep.uncommitted_visible += 1
                rep.fail(f"transaction {tag} ({tx.status}, never committed) is visible: "
                         f"{a} + {b} rows")
                tx.status = "flagged"
            elif tx.status in ("staging", "open"):
                tx.status = "dropped"  # staged when the server died: dropped at the restart
            elif tx.status == "aborting":
                tx.status = "aborted"
            continue
        rep.checks += tx.status == "committed"
        if whole or none:
            if tx.status == "committing":  # the commit was in flight at the kill
                rep.inflight_applied += whole
                rep.inflight_dropped += none
                tx.status = "committed" if whole else "dropped"
            elif none:
                rep.lost += 1
                rep.fail(f"committed transaction {tag} is missing")
        elif a >= tx.na and b >= tx.nb and a % tx.na == 0 and b % tx.nb == 0:
            rep.duplicated += 1
            rep.fail(f"transaction {tag} is there more than once: {a} + {b} rows")
            tx.status = "flagged"
        else:
            rep.torn += 1
            rep.fail(f"transaction {tag} is torn: {a} of {tx.na} and {b} of {tx.nb} rows")
            tx.status = "flagged"


def _verify_stream(st: pa.Table, model: Model, rep: CrashReport) -> None:
    """Every acknowledged batch id once, from one attempt; no other batch."""
    by_batch: dict[int, Counter[str]] = {}
    for b, a in zip(st.column("b").to_pylist(), st.column("a").to_pylist(), strict=True):
        by_batch.setdefault(b, Counter())[a] += 1
    for b in set(by_batch) - set(model.stream):
        rep.uncommitted_visible += 1
        rep.fail(f"stream batch {b} is visible but was never acknowledged")
    for b, n in model.stream.items():
        rep.checks += 1
        seen = by_batch.get(b)
        if not seen:
            rep.lost += 1
            rep.fail(f"stream batch {b} ({n} rows) is missing")
        elif len(seen) > 1 or sum(seen.values()) != n:
            rep.duplicated += 1
            rep.fail(f"stream batch {b}: {dict(seen)} rows by attempt, expected {n} once")


def _verify_derived(client: tt.Client, kv: pa.Table, rep: CrashReport) -> None:
    """``kv_a`` and ``kv_by_w`` equal their recomputation from the restored ``kv``."""
    df = kv.to_pandas()
    want_a = sorted(map(tuple, df[df.s == "a"][KV.names].itertuples(index=False)))
    got_a = sorted(map(tuple, client.snapshot("kv_a")[KV.names].itertuples(index=False)))
    if got_a != want_a:
        rep.derived_mismatches += 1
        rep.fail(f"kv_a: {len(got_a)} rows, recomputed {len(want_a)}; first differences "
                 f"{sorted(set(got_a) ^ set(want_a))[:4]}")
    groups = df.groupby("w").agg(vsum=("v", "sum"), n=("v", "size")).reset_index()
    want_w = sorted(map(tuple, groups[["w", "vsum", "n"]].itertuples(index=False)))
    got_w = sorted(map(tuple, client.snapshot("kv_by_w")[["w", "vsum", "n"]]
                       .itertuples(index=False)))
    if got_w != want_w:
        rep.derived_mismatches += 1
        rep.fail(f"kv_by_w: {got_w}, recomputed {want_w}")


class Watch:
    """A subscriber plus a condition notified on every update (waits are bounded)."""

    def __init__(self, client: tt.Client, table: str, **options: Any) -> None:
        self.changed = threading.Condition()
        self.live = client.subscribe(table, on_update=self._notify, **options)

    def _notify(self, update: Any) -> None:
        with self.changed:
            self.changed.notify_all()

    def converges(self, want: list[tuple[Any, ...]], columns: list[str],
                  timeout: float) -> bool:
        """Whether the live table equals ``want`` (sorted rows) within ``timeout`` seconds."""
        def same() -> bool:
            if self.live.error is not None:
                return True  # reported by the caller
            try:
                t = self.live.to_arrow()
            except Exception:  # no snapshot yet
                return False
            return sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True)) == want

        with self.changed:
            ok = self.changed.wait_for(same, timeout)
        return ok and self.live.error is None


def _arrow(client: tt.Client, name: str) -> pa.Table:
    snap = client.snapshot(name, as_="arrow")
    assert isinstance(snap, pa.Table)
    return snap


def _verify_subscribers(client: tt.Client, kv: pa.Table, long_lived: Watch,
                        rep: CrashReport, timeout: float = 20.0) -> None:
    want = sorted(zip(*(kv.column(c).to_pylist() for c in KV.names), strict=True))
    if not long_lived.converges(want, KV.names, timeout):
        rep.subscriber_mismatches += 1
        rep.fail(f"the subscriber to kv that lived through the restart did not converge "
                 f"(size {long_lived.live.size}, snapshot {kv.num_rows}, "
                 f"error {long_lived.live.error!r})")
    fresh = Watch(client, "kv_by_w")
    try:
        snap = _arrow(client, "kv_by_w")
        cols = ["w", "vsum", "n"]
        if not fresh.converges(sorted(zip(*(snap.column(c).to_pylist() for c in cols),
                                          strict=True)), cols, timeout):
            rep.subscriber_mismatches += 1
            rep.fail(f"a new subscriber to kv_by_w did not converge (size {fresh.live.size}, "
                     f"error {fresh.live.error!r})")
    finally:
        fresh.live.close()


def verify(client: tt.Client, model: Model, rep: CrashReport, long_lived: Watch) -> None:
    """Check the restored state against ``model``, then fold in what in-flight writes did."""
    snap = {name: _arrow(client, name) for name in ("log", "kv", "txa", "txb", "st")}
    _verify_appends(snap["log"], model, rep)
    _verify_keyed(snap["kv"], model, rep)
    _verify_transactions(snap["txa"], snap["txb"], model, rep)
    _verify_stream(snap["st"], model, rep)
    _verify_derived(client, snap["kv"], rep)
    _verify_subscribers(client, snap["kv"], long_lived, rep)


# --------------------------------------------------------------------------------- rounds
def create_tables(client: tt.Client) -> None:
    client.create_table("log", LOG, "append")
    client.create_table("kv", KV, "keyed", keys=["k"])
    client.create_table("txa", TXA, "append")
    client.create_table("txb", TXB, "append")
    client.create_table("st", ST, "append")
    client.table("kv").where(pc.field("s") == "a").create("kv_a")
    client.table("kv").agg_by([tt.agg.sum("v", "vsum"), tt.agg.count("n")], by="w").create(
        "kv_by_w")
