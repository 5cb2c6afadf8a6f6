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
                                       value, nested ones included (:func:`check_values`)
max_columns                   4096     a table of more columns: ``create_table``, a
                                       derived table (:mod:`flight.streams.registry`)
max_tables                    10 000   a new table once the server holds this many,
                                       source and derived (:mod:`flight.streams.registry`)
max_subscriptions_per_client  1000     a subscription once this many are open from one
                                       client address: its host, whatever the port, so
                                       clients behind one address share it
                                       (:class:`SubscriptionsPerClient`)
max_staged_bytes_per_write    1 GiB    a batch that would make one ``write_id`` hold more
                                       bytes uncommitted (:mod:`flight.ingest.staging`)
============================  =======  ==================================================

A durable server journals the table and staging limits with each ``create_table``,
derived table and held batch, and replays each record under the limits it was journaled
with (:mod:`flight.durability.durable`): a restart with other limits neither loses a table or batch
that was accepted nor brings back one that was refused.

A message quotes at most the first 100 characters of a name the client sent
(:func:`quoted`): a name may be megabytes.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import LimitExceeded

__all__ = ["FLAGS", "MAX_COLUMNS", "MAX_PUT_BATCH_BYTES", "MAX_STAGED_BYTES_PER_WRITE",
           "MAX_SUBSCRIPTIONS_PER_CLIENT", "MAX_TABLES", "MAX_VALUE_BYTES",
           "SubscriptionsPerClient", "check_values", "client_of", "limit_text", "quoted"]

# the defaults of ServerConfig's fields of the same names (here so that the CLI can state
# them without importing the server)
MAX_PUT_BATCH_BYTES = 256 << 20
MAX_TABLES = 10_000
MAX_COLUMNS = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_SUBSCRIPTIONS_PER_CLIENT = 1000
MAX_STAGED_BYTES_PER_WRITE = 1 << 30

#: How much of a client's name a message quotes (a name may be megabytes).
_QUOTED = 100

#: ServerConfig field -> the ``ticktable serve`` flag that sets it.
FLAGS = {
    "max_put_batch_bytes": "--max-message-bytes",
    "max_value_bytes": "--max-value-bytes",
    "max_columns": "--max-columns",
    "max_tables": "--max-tables",
    "max_subscriptions_per_client": "--max-subscriptions-per-client",
    "max_staged_bytes_per_write": "--max-staged-bytes-per-write",
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


def quoted(text: str) -> str:
    """``repr(text)`` for a message, cut to its first 100 characters when longer.

    Examples
    --------
    >>> quoted("trades")
    "'trades'"
    >>> quoted("x" * 5_000_000)[-30:]
    "xxxxx'... (5000000 characters)"
    """
    if len(text) <= _QUOTED:
        return repr(text)
    return f"{text[:_QUOTED]!r}... ({len(text)} characters)"


# ------------------------------------------------------------------- value sizes
def _is_bytes(t: pa.DataType) -> bool:
    """Whether ``t`` is a string or binary type with offsets (``binary_length`` reads it)."""
    return (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t))


def _longest(arr: pa.Array) -> int:
    """Bytes of the longest string or binary value in ``arr``, nested ones included."""
    t = arr.type
    if _is_bytes(t):
        return int(pc.max(pc.binary_length(arr)).as_py() or 0)  # nulls skipped
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _longest(arr.cast(pa.large_binary()))  # binary_length has no view kernel
    if pa.types.is_dictionary(t):  # the values its indices use, not the whole dictionary
        if _is_bytes(t.value_type):  # lengths, not values, taken per row
            return int(pc.max(pc.take(pc.binary_length(arr.dictionary), arr.indices)).as_py()
                       or 0)
        return _longest(arr.dictionary.take(arr.indices))
    if pa.types.is_map(t):  # keys and items, of this slice only
        return max(_longest(pa.ListArray.from_arrays(arr.offsets, arr.keys).flatten()),
                   _longest(pa.ListArray.from_arrays(arr.offsets, arr.items).flatten()))
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return _longest(arr.flatten())
    if pa.types.is_struct(t):
        return max((_longest(f) for f in arr.flatten()), default=0)
    return 0


def _span(arr: pa.Array) -> float:
    """Bytes a string or binary array's values take together (from two offsets); infinite
    for any other type (their values are measured one by one)."""
    t = arr.type
    if not _is_bytes(t) or len(arr) == 0:
        return 0 if _is_bytes(t) else math.inf
    dtype = np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32
    try:
        offsets = np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr) + 1)
    except (TypeError, ValueError):  # no offsets buffer of that size: measure each value
        return math.inf
    return int(offsets[-1]) - int(offsets[arr.offset])


def _holds_values(t: pa.DataType) -> bool:
    """Whether values of type ``t`` can hold strings or binaries."""
    if pa.types.is_dictionary(t):
        return _holds_values(t.value_type)
    if _is_bytes(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return True
    return any(_holds_values(t.field(i).type) for i in range(t.num_fields))


def check_values(table: str, data: pa.Table, limit: int | None) -> None:
    """Refuse ``data`` if a string or binary value, nested ones included, passes ``limit``.

    Strings and binaries of every width, in dictionaries (the values used), lists, structs
    and maps; unions are not looked into. Vectorized: a ``binary_length`` and a ``max``
    per column chunk and nesting level. ``limit`` ``None``: no limit.

    Raises
    ------
    LimitExceeded
        Naming the table, the first column too long and its longest value's size.

    Examples
    --------
    >>> check_values("t", pa.table({"s": ["ab", "abcdef"]}), 4)
    Traceback (most recent call last):
    ...
    engine.errors.LimitExceeded: table 't': column 's' holds a value of 6 bytes, above the \
limit of 4 (max_value_bytes; ticktable serve --max-value-bytes N); send smaller values
    """
    if limit is None:
        return
    for name, col in zip(data.column_names, data.columns, strict=True):
        if not _holds_values(col.type):
            continue
        if all(_span(chunk) <= limit for chunk in col.chunks):
            continue  # no value can be longer than all of them together
        longest = max((_longest(chunk) for chunk in col.chunks), default=0)
        if longest > limit:
            raise LimitExceeded(
                f"table {quoted(table)}: column {quoted(name)} holds a value of {longest} "
                f"bytes, above {limit_text('max_value_bytes', limit)}; send smaller values")


# ------------------------------------------------------------ open subscriptions
def client_of(peer: str) -> str:
    """The client address of a gRPC peer: its host, without the port.

    Examples
    --------
    >>> client_of("ipv4:127.0.0.1:50312"), client_of("ipv6:[::1]:50312")
    ('127.0.0.1', '[::1]')
    >>> client_of("unix:/tmp/sock")
    'unix:/tmp/sock'
    """
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in address:
        return address.rsplit(":", 1)[0]
    return peer


class SubscriptionsPerClient:
    """Subscriptions open per client address (:func:`client_of`), at most ``limit`` each.

    Thread-safe; ``limit`` ``None``: no limit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str, what: str) -> None:
        """Count one more open for ``client``; ``what`` names it in a refusal.

        Raises
        ------
        LimitExceeded
            If ``client`` holds ``limit`` open already (nothing is counted).
        """
        with self._lock:
            n = self._open.get(client, 0)
            if self.limit is not None and n >= self.limit:
                raise LimitExceeded(
                    f"{what} refused: client {client} has {n} subscriptions open, "
                    f"{limit_text('max_subscriptions_per_client', self.limit)}; close one first")
            self._open[client] = n + 1

    def release(self, client: str) -> None:
        """Count one fewer open for ``client`` (one :meth:`acquire` ended)."""
        with self._lock:
            n = self._open.get(client, 0) - 1
            if n > 0:
                self._open[client] = n
            else:
                self._open.pop(client, None)

    def count(self, client: str) -> int:
        """How many ``client`` holds open."""
        with self._lock:
            return self._open.get(client, 0)
