"""Flight SQL on Ticktable's one port: queries, metadata, writes and live views (DESIGN.md §10).

Reading order, in the order a call travels:

- :mod:`flight.sql.service`: :class:`~flight.sql.service.FlightSqlService`, the Flight SQL
  commands of GetFlightInfo, GetSchema, DoGet, DoPut and DoAction (the transport,
  :mod:`flight.rpc.flight_service`, hands it the calls that carry one); writes go through
  DoPut's staged path, views through the durable door. The server builds it on the first
  call that needs it (:attr:`flight.server.TicktableServer.sql`).
- :mod:`flight.sql.commands`: the commands on the wire (``pack``, ``unpack``) and Flight
  SQL's action types, for the transport and the token check (no SQL engine imported).
- :mod:`flight.sql.parse`: text to one sqlglot statement (syntax errors with line and
  column), the tables it reads, its kind.
- :mod:`flight.sql.query`: a query run by DuckDB, locked down, over one-step snapshots;
  timeout and cancel.
- :mod:`flight.sql.snapshots`: the named tables read at one step; unchanged tables'
  snapshots kept.
- :mod:`flight.sql.metadata`: the metadata commands' answers (SqlInfo, tables, keys, types).
- :mod:`flight.sql.views`: a ``SELECT`` compiled to the engine's incremental operations: a
  live view, or a refusal naming the clause.
- :mod:`flight.sql.expressions`: the view's scalar expressions as pyarrow expressions (the
  view compiler's base), times, decimals and functions among them.
- :mod:`flight.sql.ddl`: what CREATE TABLE, UPDATE and INSERT's clauses ask for (the
  service writes it).
"""
