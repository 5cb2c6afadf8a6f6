"""Published tables and what flows out of them: subscriptions, fan-out, the delta codec.

Reading order, in the order an update travels after its cycle:

- :mod:`flight.streams.registry`: the server's named tables, and per table the publisher
  that numbers its updates and keeps a bounded history of them.
- :mod:`flight.streams.pending`: what a consumer received and has not sent yet, composed
  into one update when it sends (and past a bound, in the cycle).
- :mod:`flight.streams.subscription`: one subscriber's stream: snapshot, then deltas.
- :mod:`flight.streams.fanout`: one build of each update's message, written to many
  subscribers that share columns and batch size.
- :mod:`flight.streams.decoder`: the reference decoder, the protocol's executable definition.
"""
