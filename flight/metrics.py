"""Prometheus metrics of a running server (``ticktable serve --metrics-port``).

Served by ``prometheus-client``'s own HTTP server on a port of its own, in text format at
``/metrics``. What is measured:

==========================================  ===========  =========================================
metric                                      type         what
==========================================  ===========  =========================================
``ticktable_cycle_seconds``                 histogram    duration of each update cycle
``ticktable_table_rows``                    gauge        rows per table (``table``, ``kind``)
``ticktable_table_changes_total``           counter      rows added, removed or modified per table
``ticktable_table_subscribers``             gauge        open subscriptions per table
``ticktable_table_max_lag_steps``           gauge        the furthest-behind subscriber, in steps
``ticktable_put_rows_total``                counter      rows accepted by DoPut, per table
``ticktable_put_bytes_total``               counter      Arrow bytes accepted by DoPut, per table
``ticktable_table_pending_bytes``           gauge        bytes of writes waiting for a source
                                                         table's next cycle
``ticktable_put_waits_total``               counter      DoPut batches that waited for room in
                                                         their table's backlog, per table
                                                         (:mod:`flight.ingest.backlog`)
``ticktable_put_wait_seconds``              histogram    how long each of those waited
``ticktable_errors_total``                  counter      error answers by gRPC code
``ticktable_journal_bytes``                 gauge        the journal's size on disk (durable only)
``ticktable_journal_flush_seconds``         histogram    one group commit: write and fsync
``ticktable_step``                          gauge        the update graph's step
``ticktable_sql_queries_total``             counter      Flight SQL queries by ``outcome``: ``ok``,
                                                         ``error``, ``timeout``, ``cancelled``
``ticktable_sql_query_seconds``             histogram    a query, from its start to its last batch
``ticktable_sql_held_bytes``                gauge        what the SQL runner holds between queries
                                                         (``what``: ``snapshots``, ``positions``)
``ticktable_sql_narrow_passes_total``       counter      selective scans' first passes
                                                         (:mod:`flight.sql.narrow`) by ``outcome``:
                                                         ``kept``, ``gave_up``, ``failed``
``ticktable_mirror_in_sync``                gauge        per mirror (``table``): 1 while its link
                                                         is in sync (:mod:`flight.links`), else 0
``ticktable_mirror_out_of_sync_seconds``    gauge        per mirror: how long it has not been in
                                                         sync (0 while it is)
``ticktable_mirror_reconnects_total``       counter      per mirror: streams opened after the first
``ticktable_mirror_resumes_total``          counter      per mirror and ``kind``: reconnects the
                                                         origin answered with the missed ``deltas``
                                                         or with a ``snapshot``
==========================================  ===========  =========================================

The per-table gauges and the mirrors' numbers are read from the server at scrape time (a
mirror whose origin never answered, so not yet a table, is counted too); counters and
histograms are fed as things happen. Every server counts (the ``stats`` action shows the
same numbers, :meth:`Metrics.totals`); only ``--metrics-port`` serves them over HTTP. Each
server has its own registry, so several servers in one process (tests) do not mix.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.errors import TableNotFound
from engine.sources import SourceTable
from flight.streams.registry import is_pending

if TYPE_CHECKING:
    from engine.graph import UpdateGraph
    from flight.durability.durable import Durability
    from flight.links import Links
    from flight.pb import flight_pb2 as pb
    from flight.streams.registry import TableRegistry

__all__ = ["Measured", "Metrics", "Totals"]


class Measured(Protocol):
    """What :class:`Metrics` reads from its server (a :class:`~flight.server.TicktableServer`)."""

    graph: UpdateGraph
    registry: TableRegistry
    durability: Durability
    links: Links

    def stats(self) -> pb.Stats: ...

_CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SQL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_FLUSH_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class _Tables(Collector):
    """Per-table gauges, read at scrape time from the server's stats."""

    def __init__(self, server: Measured) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        stats = self._server.stats()
        rows = GaugeMetricFamily("ticktable_table_rows", "Rows per table.", labels=["table", "kind"])
        subs = GaugeMetricFamily("ticktable_table_subscribers", "Open subscriptions per table.",
                                 labels=["table"])
        lag = GaugeMetricFamily("ticktable_table_max_lag_steps",
                                "Steps the furthest-behind subscriber of a table is behind.",
                                labels=["table"])
        for t in stats.tables:
            rows.add_metric([t.name, t.kind], t.size)
            subs.add_metric([t.name], t.subscribers)
            lag.add_metric([t.name], t.max_lag_steps)
        pending = GaugeMetricFamily("ticktable_table_pending_bytes",
                                    "Bytes of writes waiting for a source table's next cycle.",
                                    labels=["table"])
        shared = CounterMetricFamily(
            "ticktable_table_shared_deltas",
            "Delta messages a stream sent from another stream's build of the same update "
            "(streams outside a fan-out catching up from one state).", labels=["table"])
        for e in self._server.registry.entries():
            if isinstance(e.table, SourceTable):
                pending.add_metric([e.name], e.table.pending_bytes)
            if e.publisher is not None:
                shared.add_metric([e.name], e.publisher.deltas_shared)
        yield rows
        yield subs
        yield lag
        yield pending
        yield shared
        yield GaugeMetricFamily("ticktable_step", "The update graph's step.", value=stats.step)
        if stats.HasField("web"):
            yield GaugeMetricFamily("ticktable_web_up", "1 while the web UI's process runs.",
                                    value=int(stats.web.running))
            yield CounterMetricFamily("ticktable_web_restarts",
                                      "Times the web UI's process was started again.",
                                      value=stats.web.restarts)
            yield GaugeMetricFamily("ticktable_web_open_tables",
                                    "Tables a web page has open.", value=stats.web.open_tables)
        journal = self._server.durability.journal
        if journal is not None:
            yield GaugeMetricFamily("ticktable_journal_bytes", "The journal's size on disk.",
                                    value=journal.size_bytes())


#: what :meth:`SqlRunner.held` counts (:meth:`flight.sql.query.QueryRunner.held`)
SQL_HELD = ("snapshots", "positions")


class SqlRunner(Protocol):
    """What :class:`Metrics` reads of the SQL runner (:class:`flight.sql.query.QueryRunner`)."""

    narrow_passes: collections.Counter[str]

    def held(self) -> dict[str, int]: ...


class _Sql(Collector):
    """The SQL runner's held bytes and narrow passes, read at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        runner = self._metrics.sql_runner
        # before the first SQL call the server has no runner (its SQL service is built on
        # first use): nothing held, no pass, and the series are there from the start
        counts = runner.narrow_passes if runner is not None else collections.Counter[str]()
        held = GaugeMetricFamily("ticktable_sql_held_bytes",
                                 "Bytes the SQL runner holds between queries.", labels=["what"])
        for what, nbytes in (runner.held() if runner is not None
                             else dict.fromkeys(SQL_HELD, 0)).items():
            held.add_metric([what], nbytes)
        passes = CounterMetricFamily("ticktable_sql_narrow_passes",
                                     "Selective scans' first passes over their WHERE's columns.",
                                     labels=["outcome"])
        for outcome in ("kept", "gave_up", "failed"):
            passes.add_metric([outcome], counts[outcome])
        yield held
        yield passes


class _Mirrors(Collector):
    """Per mirror, its link's status (:meth:`flight.links.Link.status`), read at scrape time."""

    def __init__(self, server: Measured) -> None:
        self._server = server

    def collect(self) -> Iterator[Any]:
        in_sync = GaugeMetricFamily("ticktable_mirror_in_sync",
                                    "1 while the mirror's link is in sync, else 0.",
                                    labels=["table"])
        out = GaugeMetricFamily("ticktable_mirror_out_of_sync_seconds",
                                "Seconds the mirror has not been in sync (0 while it is).",
                                labels=["table"])
        reconnects = CounterMetricFamily("ticktable_mirror_reconnects",
                                         "Streams the mirror's link opened after the first.",
                                         labels=["table"])
        resumes = CounterMetricFamily("ticktable_mirror_resumes",
                                      "Reconnects the origin answered with the missed deltas "
                                      "or a snapshot.", labels=["table", "kind"])
        for link in self._server.links.links():
            name, st = link.spec.name, link.status()
            in_sync.add_metric([name], int(st.in_sync))
            out.add_metric([name], st.out_of_sync_seconds)
            reconnects.add_metric([name], st.reconnects)
            resumes.add_metric([name, "deltas"], st.resumed_with_deltas)
            resumes.add_metric([name, "snapshot"], st.resumed_with_snapshot)
        yield in_sync
        yield out
        yield reconnects
        yield resumes


@dataclass
class Totals:
    """The counters of a :class:`Metrics` since the server started (for ``stats``)."""

    changes: dict[str, int] = field(default_factory=dict)    # per table
    put_rows: dict[str, int] = field(default_factory=dict)   # per table
    put_bytes: dict[str, int] = field(default_factory=dict)  # per table
    errors: dict[str, int] = field(default_factory=dict)     # per gRPC code name
    flushes: int = 0
    flush_p50_ms: float = 0.0
    flush_p99_ms: float = 0.0


def _by_label(counter: Counter, label: str) -> dict[str, int]:
    return {s.labels[label]: int(s.value) for m in counter.collect() for s in m.samples
            if s.name.endswith("_total")}


class Metrics:
    """The metrics of one :class:`~flight.server.TicktableServer` (see the module doc).

    Parameters
    ----------
    server
        The server to measure; its graph's cycles are observed from now on.
    """

    def __init__(self, server: Measured) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        r = self.registry
        self.cycle = Histogram("ticktable_cycle_seconds", "Duration of each update cycle.",
                               buckets=_CYCLE_BUCKETS, registry=r)
        self.changes = Counter("ticktable_table_changes", "Rows added, removed or modified.",
                               ["table"], registry=r)
        self.put_rows = Counter("ticktable_put_rows", "Rows accepted by DoPut.", ["table"],
                                registry=r)
        self.put_bytes = Counter("ticktable_put_bytes", "Arrow bytes accepted by DoPut.",
                                 ["table"], registry=r)
        self.errors = Counter("ticktable_errors", "Error answers by gRPC status code.", ["code"],
                              registry=r)
        self.put_waits = Counter("ticktable_put_waits",
                                 "DoPut batches that waited for their table's writes to be "
                                 "taken by a cycle (then admitted, or refused "
                                 "RESOURCE_EXHAUSTED).", ["table"], registry=r)
        self.put_wait_seconds = Histogram("ticktable_put_wait_seconds",
                                          "How long a DoPut batch that waited for room waited.",
                                          buckets=_WAIT_BUCKETS, registry=r)
        self.journal_flush = Histogram("ticktable_journal_flush_seconds",
                                       "One journal group commit: write and fsync.",
                                       buckets=_FLUSH_BUCKETS, registry=r)
        self.sql_queries = Counter("ticktable_sql_queries", "Flight SQL queries by outcome.",
                                   ["outcome"], registry=r)
        self.sql_seconds = Histogram("ticktable_sql_query_seconds",
                                     "A Flight SQL query, from its start to its last batch.",
                                     buckets=_SQL_BUCKETS, registry=r)
        r.register(_Tables(server))
        r.register(_Mirrors(server))
        #: the SQL runner whose held bytes and narrow passes are served (the server sets it)
        self.sql_runner: SqlRunner | None = None
        r.register(_Sql(self))
        self._flushes: collections.deque[float] = collections.deque(maxlen=1000)
        self._flush_count = 0
        self._http: Any = None
        self._lock = threading.Lock()
        self._remove = server.graph.add_terminal_listener(self._on_cycle)

    def _on_cycle(self, step: int) -> None:
        self.cycle.observe(self.server.graph.last_cycle_seconds)
        for e in self.server.registry.entries():  # under the graph's lock: reads take no lock
            table = e.table
            if table.last_step != step:
                continue
            u = table.cycle_update
            if u is not None:
                n = len(u.added) + len(u.removed) + len(u.modified)
                if n:
                    self.changes.labels(e.name).inc(n)

    def _label(self, table: str) -> str:
        """The ``table`` label of a write: a pending table's is the name it is filled for
        (:func:`~flight.streams.registry.pending_name`: a new one per statement would be a
        new series each time)."""
        if not is_pending(table):
            return table
        try:
            return self.server.registry.get(table).table.name
        except TableNotFound:  # dropped meanwhile
            return "(pending)"

    def on_put(self, table: str, rows: int, nbytes: int) -> None:
        """A DoPut batch was accepted."""
        label = self._label(table)
        self.put_rows.labels(label).inc(rows)
        self.put_bytes.labels(label).inc(nbytes)

    def on_put_wait(self, table: str, seconds: float) -> None:
        """A DoPut batch waited ``seconds`` for room in its table's backlog
        (:mod:`flight.ingest.backlog`), then was admitted or refused."""
        self.put_waits.labels(self._label(table)).inc()
        self.put_wait_seconds.observe(seconds)

    def on_error(self, code: str) -> None:
        """An error answer went out with gRPC status ``code`` (e.g. ``"NOT_FOUND"``)."""
        self.errors.labels(code).inc()

    def on_query(self, seconds: float, outcome: str) -> None:
        """A Flight SQL query ended (``ok``, ``error``, ``timeout`` or ``cancelled``)."""
        self.sql_queries.labels(outcome).inc()
        self.sql_seconds.observe(seconds)

    def on_flush(self, seconds: float) -> None:
        """A journal group commit took ``seconds``."""
        self.journal_flush.observe(seconds)
        self._flushes.append(seconds)
        self._flush_count += 1

    def totals(self) -> Totals:
        """Rows changed and DoPut rows/bytes per table, errors by code and the journal's
        flush count and p50/p99 (of the last 1,000), since the server started."""
        recent = sorted(self._flushes)
        out = Totals(changes=_by_label(self.changes, "table"),
                     put_rows=_by_label(self.put_rows, "table"),
                     put_bytes=_by_label(self.put_bytes, "table"),
                     errors=_by_label(self.errors, "code"), flushes=self._flush_count)
        if recent:
            out.flush_p50_ms = recent[len(recent) // 2] * 1e3
            out.flush_p99_ms = recent[min(len(recent) - 1, int(len(recent) * 0.99))] * 1e3
        return out

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` over HTTP on ``port`` (0: any free one); returns the port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        """Stop observing and stop the HTTP server."""
        self._remove()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
