"""The Ticktable server: one grpcio server on one port, a package per family.

Reading order:

- :mod:`flight.server`: :class:`~flight.server.TicktableServer`, the entry point, which
  builds the families below and ties them together.
- :mod:`flight.wire`: the wire vocabulary clients may import (put modes, table kinds,
  reserved columns, the table of DoActions).
- :mod:`flight.errors`: the one mapping from exceptions to what a client sees.
- :mod:`flight.rpc`: the grpcio server, Flight framing, the event-loop bridge, auth and
  the services (Arrow Flight, the TableService).
- :mod:`flight.ingest`: DoPut: batch checks, staging and transactions, limits.
- :mod:`flight.streams`: published tables, subscriptions, fan-out, the decoder.
- :mod:`flight.durability`: the one door for durable state, the journal, checkpoints.
- :mod:`flight.sql`: Flight SQL: metadata, queries in DuckDB over one-step snapshots,
  writes through DoPut's path, SQL compiled to live views.
- :mod:`flight.web`: the web UI's gateway and feeds.
- :mod:`flight.metrics`, :mod:`flight.substrait`: Prometheus metrics; expressions on the wire.
"""
