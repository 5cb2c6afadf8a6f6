"""The server's limits on what clients may send or hold, and how a refusal reads (#18).

Each limit is a field of :class:`flight.server.ServerConfig` and a ``ticktable serve``
flag (:data:`FLAGS`). A request past one is refused with
:class:`~engine.errors.LimitExceeded`, which every service answers RESOURCE_EXHAUSTED
(:mod:`flight.errors`), in one line naming the table or column, the limit's value and the
flag that changes it; nothing of the request is applied and the server serves on.

============================  =======  ==================================================
ServerConfig field            default  refuses
============================  =======  ==================================================
max_put_batch_bytes           256 MiB  a DoPut record batch larger than this
                                       (:mod:`flight.ingest.put`); gRPC itself refuses any
                                       message more than ``max_metadata_bytes`` + 1 MiB
                                       past it, before a handler sees it
max_metadata_bytes            1 MiB    ``app_metadata`` of a DoPut or DoExchange message
max_value_bytes               64 MiB   a DoPut batch holding a longer string or binary
                                       value, nested ones included (:func:`~flight.ingest.value_sizes.check_values`)
max_columns                   4096     a table of more columns: ``create_table``, a
                                       derived table (:mod:`flight.streams.registry`)
max_tables                    10 000   a new table once the server holds this many,
                                       source and derived (:mod:`flight.streams.registry`);
                                       a filtered subscription's new table, counted with
                                       them (:mod:`flight.streams.filtered`)
max_subscriptions_per_client  1000     a subscription once this many are open from one
                                       client address: its host, whatever the port, so
                                       clients behind one address share it
                                       (:class:`~flight.streams.per_client.SubscriptionsPerClient`)
max_staged_bytes_per_write    1 GiB    a batch that would make one ``write_id`` hold more
                                       bytes uncommitted (:mod:`flight.ingest.staging`)
max_pending_bytes             256 MiB  a DoPut batch into a table whose writes waiting for
                                       its next cycle stay past this for ``put_wait``
                                       seconds (``BacklogFull``, :mod:`flight.ingest.backlog`):
                                       until then the writer waits, held by gRPC's flow
                                       control
============================  =======  ==================================================

Two settings go with ``max_pending_bytes``: ``put_wait`` (``--put-wait``, default 2 s), how
long a batch waits for room before it is refused, and ``put_window_bytes``
(``--put-window-bytes``, default 64 KiB), the HTTP/2 window the server announces per
stream, fixed: how far a writer may send ahead of what the server has read.

A durable server journals the table and staging limits with each ``create_table``,
derived table and held batch, and replays each record under the limits it was journaled
with (:mod:`flight.durability.durable`): a restart with other limits neither loses a table or batch
that was accepted nor brings back one that was refused.

A message quotes at most the first 100 characters of a name the client sent
(:func:`~engine.errors.quoted`): a name may be megabytes.
"""

from __future__ import annotations

from engine.errors import quoted as quoted  # how a message quotes a name: one helper for all

__all__ = ["FLAGS", "MAX_COLUMNS", "MAX_PENDING_BYTES", "MAX_PUT_BATCH_BYTES",
           "MAX_STAGED_BYTES_PER_WRITE", "MAX_SUBSCRIPTIONS_PER_CLIENT", "MAX_TABLES",
           "MAX_VALUE_BYTES", "PUT_WAIT", "PUT_WINDOW_BYTES", "limit_text", "quoted"]

# the defaults of ServerConfig's fields of the same names (here so that the CLI can state
# them without importing the server)
MAX_PUT_BATCH_BYTES = 256 << 20
MAX_TABLES = 10_000
MAX_COLUMNS = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_SUBSCRIPTIONS_PER_CLIENT = 1000
MAX_STAGED_BYTES_PER_WRITE = 1 << 30
MAX_PENDING_BYTES = 256 << 20
PUT_WAIT = 2.0
PUT_WINDOW_BYTES = 64 << 10

#: ServerConfig field -> the ``ticktable serve`` flag that sets it.
FLAGS = {
    "max_put_batch_bytes": "--max-message-bytes",
    "max_value_bytes": "--max-value-bytes",
    "max_columns": "--max-columns",
    "max_tables": "--max-tables",
    "max_subscriptions_per_client": "--max-subscriptions-per-client",
    "max_staged_bytes_per_write": "--max-staged-bytes-per-write",
    "max_pending_bytes": "--max-pending-bytes",
}


def limit_text(setting: str, value: int) -> str:
    """How a refusal names a limit: its value, its setting and how to change it.

    Examples
    --------
    >>> limit_text("max_columns", 4096)
    'the limit of 4096 (max_columns; ticktable serve --max-columns N)'
    >>> limit_text("max_metadata_bytes", 1024)
    'the limit of 1024 (ServerConfig.max_metadata_bytes)'
    """
    flag = FLAGS.get(setting)
    if flag is None:
        return f"the limit of {value} (ServerConfig.{setting})"
    return f"the limit of {value} ({setting}; ticktable serve {flag} N)"
