"""The server's calls: one ``grpc.aio`` server on one port, and the services it hosts.

Reading order:

- :mod:`flight.rpc.aio`: the ``grpc.aio`` server and the bridge that lets thread-based
  handlers read and write streams written by the event loop (:class:`~flight.rpc.aio.LoopQueue`).
- :mod:`flight.rpc.framing`: Arrow Flight's hot messages (``FlightData``, ``PutResult``)
  framed by hand, zero-copy both ways, and the IPC decoder with its checks.
- :mod:`flight.rpc.requests`: what a call names, its table (descriptor) and protobuf request.
- :mod:`flight.rpc.auth`: bearer tokens, full and read-only, for every service.
- :mod:`flight.rpc.call_log`: one log line per call, errors counted by code.
- :mod:`flight.rpc.flight_service`: ``arrow.flight.protocol.FlightService``: DoGet, DoPut
  (handed to :mod:`flight.ingest`), DoExchange (handed to :mod:`flight.streams`), actions.
- :mod:`flight.rpc.table_service`: the gRPC TableService, derived tables built server-side.
"""
