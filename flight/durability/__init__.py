"""Durable tables (DESIGN.md §8): acknowledged means durable.

Reading order:

- :mod:`flight.durability.durable`: :class:`~flight.durability.durable.Durability`, the one
  door through which the server changes durable state, and recovery at start.
- :mod:`flight.durability.journal`: the journal (SQLite, WAL, group commit) every change
  goes through before its acknowledgement.
- :mod:`flight.durability.records`: the values that go into the journal and come back out.
- :mod:`flight.durability.journal_files`: what is on disk, and the checks at open.
- :mod:`flight.durability.payloads`: large payloads in files of their own beside it.
- :mod:`flight.durability.checkpoint`: every source table's and mirror's rows with their row
  keys.
"""
