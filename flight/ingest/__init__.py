"""Writes into source tables: DoPut streams, their checks, staging and transactions.

Reading order, in the order a batch travels:

- :mod:`flight.ingest.put`: one DoPut stream: decode, check, stage or hold, acknowledge.
- :mod:`flight.ingest.value_sizes`: no value in a batch longer than the limit.
- :mod:`flight.ingest.staging`: stage slots, commit and abort, write ids remembered.
- :mod:`flight.ingest.parts`: a checked :class:`~flight.ingest.parts.Part`, and the
  :class:`~flight.ingest.parts.PartWriter` a staging area holds, which writes parts into
  their tables under the graph's and tables' locks.
"""
