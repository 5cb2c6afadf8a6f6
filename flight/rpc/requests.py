"""Decoding what a Flight call names: its table (descriptor) and its protobuf request.

Shared by the server's handlers (:mod:`flight.server`) and the DoPut transport
(:mod:`flight.ingest.put`); every failure is a :class:`~engine.errors.ProtocolError` naming the
call and the message type, but metadata past its limit (a
:class:`~engine.errors.LimitExceeded`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import pyarrow.flight as flight
from google.protobuf.message import DecodeError, Message

from engine.errors import LimitExceeded, ProtocolError
from flight.limits import limit_text

__all__ = ["check_metadata_size", "parse", "table_name"]

M = TypeVar("M", bound=Message)


def parse(message: M, data: bytes | None, what: str) -> M:
    """Parse ``data`` into ``message`` (a protobuf message, returned) for the call ``what``.

    Raises
    ------
    ProtocolError
        If ``data`` is missing or is not a serialized message of that type.
    """
    name = type(message).__name__
    if data is None:
        raise ProtocolError(f"{what}: missing metadata; send a {name}")
    try:
        message.ParseFromString(data)
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"{what}: malformed {name} ({exc})") from exc
    return message


def table_name(descriptor: flight.FlightDescriptor) -> str:
    """The table a descriptor names (``FlightDescriptor.for_path(name)``).

    Raises
    ------
    ProtocolError
        If the descriptor is not a path of one element.
    """
    if descriptor.descriptor_type != flight.DescriptorType.PATH or len(descriptor.path) != 1:
        raise ProtocolError("use FlightDescriptor.for_path(table_name)")
    raw = descriptor.path[0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def check_metadata_size(meta: Any, limit: int, what: str) -> None:
    """Refuse ``app_metadata`` (a pyarrow Buffer or ``None``) larger than ``limit`` bytes.

    Raises
    ------
    LimitExceeded
        Naming the call, the size and the limit (``ServerConfig.max_metadata_bytes``).
    """
    if meta is not None and meta.size > limit:
        raise LimitExceeded(f"{what}: metadata of {meta.size} bytes exceeds "
                            f"{limit_text('max_metadata_bytes', limit)}; send less metadata")
