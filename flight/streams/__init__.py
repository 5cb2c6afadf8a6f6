"""Published tables and what flows out of them: subscriptions, fan-out, the delta codec.

Reading order, in the order an update travels after its cycle:

- :mod:`flight.streams.registry`: the server's named tables, and per table the publisher
  that numbers its updates, keeps a bounded history of them and feeds its
  :class:`~flight.streams.registry.UpdateSink` s inside the cycle.
- :mod:`flight.streams.pending`: what a sink received and has not sent yet, composed into
  one update when it sends (and past a bound, in the cycle).
- :mod:`flight.streams.codec`: the delta codec: an update (or a snapshot) of a table in,
  one subscription message's ``FlightData`` frames out. Pure: no threads, queues or locks.
- :mod:`flight.streams.subscription`: one subscriber's stream: snapshot, then deltas.
- :mod:`flight.streams.group`: one stream of several tables, every table's messages of a
  step together and an end-of-step marker (multi-table subscriptions).
- :mod:`flight.streams.filtered`: what a subscription with a filter streams: one shared,
  unlisted ``where`` per table and filter, kept a while after its last subscriber.
- :mod:`flight.streams.fanout`: one build of each update's message, written to many
  subscribers that share columns and batch size.
- :mod:`flight.streams.decoder`: the reference decoder, the codec's inverse and the
  protocol's executable definition.
"""
