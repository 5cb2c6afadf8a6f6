"""Mutations of a fuzz case's bytes (see bench/_fuzz_cases.py): of one message (bit flips,
truncation, inserted and deleted bytes, interesting integers, protobuf fields swapped,
renumbered, duplicated or dropped, length prefixes made huge) and of a stream's list of
``FlightData`` frames (frames dropped, repeated or reordered, a frame's header and body
mutated inside it)."""

from __future__ import annotations

import random
from collections.abc import Callable

from flight.rpc.framing import frame, parse_flight_data

INTERESTING = (0, 1, -1, 2, 7, 8, 63, 64, 127, 128, 255, 256, 1 << 15, (1 << 31) - 1, 1 << 31,
                (1 << 32) - 1, 1 << 32, (1 << 62), (1 << 63) - 1, -(1 << 63))
_HUGE_VARINTS = (b"\xff\xff\xff\xff\x07", b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x10",
                 b"\xff" * 9 + b"\x01", b"\xff" * 10, b"\x80")


# ------------------------------------------------------------------------ byte mutations
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(b: bytes, at: int) -> tuple[int, int] | None:
    n = shift = 0
    while at < len(b) and shift < 70:
        c = b[at]
        at += 1
        n |= (c & 0x7F) << shift
        if not c & 0x80:
            return n, at
        shift += 7
    return None


def _fields(b: bytes) -> list[tuple[int, int, bytes]] | None:
    """``b`` as protobuf wire fields ``(number, wire type, payload)``, or None if it is not."""
    out = []
    at = 0
    while at < len(b):
        tag = _read_varint(b, at)
        if tag is None:
            return None
        (t, at), start = tag, tag[1]
        wire = t & 7
        if wire == 0:
            v = _read_varint(b, at)
            if v is None:
                return None
            at = v[1]
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            n = _read_varint(b, at)
            if n is None or n[1] + n[0] > len(b):
                return None
            start, at = n[1], n[1] + n[0]
        else:
            return None
        if at > len(b):
            return None
        out.append((t >> 3, wire, b[start:at]))
    return out


def _unfields(fields: list[tuple[int, int, bytes]]) -> bytes:
    parts = []
    for number, wire, payload in fields:
        parts.append(_varint(number << 3 | wire))
        if wire == 2:
            parts.append(_varint(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def mutate_bytes(rnd: random.Random, b: bytes, rounds: int | None = None) -> bytes:
    """``b`` with 1-3 byte-level or protobuf-field-level mutations."""
    for _ in range(rounds or rnd.randint(1, 3)):
        b = rnd.choice(_MUTATORS)(rnd, b)
    return b


def _flip(rnd: random.Random, b: bytes) -> bytes:
    if not b:
        return bytes([rnd.randrange(256)])
    i = rnd.randrange(len(b))
    return b[:i] + bytes([b[i] ^ (1 << rnd.randrange(8))]) + b[i + 1:]


def _set_byte(rnd: random.Random, b: bytes) -> bytes:
    if not b:
        return b"\xff"
    i = rnd.randrange(len(b))
    return b[:i] + bytes([rnd.choice((0, 1, 0x7F, 0x80, 0xFF, rnd.randrange(256)))]) + b[i + 1:]


def _truncate(rnd: random.Random, b: bytes) -> bytes:
    return b[:rnd.randrange(len(b) + 1)]


def _insert(rnd: random.Random, b: bytes) -> bytes:
    i = rnd.randrange(len(b) + 1)
    junk = rnd.choice((rnd.randbytes(rnd.randint(1, 8)), rnd.choice(_HUGE_VARINTS),
                       b[i:i + rnd.randint(1, 16)]))
    return b[:i] + junk + b[i:]


def _delete(rnd: random.Random, b: bytes) -> bytes:
    if not b:
        return b
    i = rnd.randrange(len(b))
    return b[:i] + b[i + rnd.randint(1, 16):]


def _integer(rnd: random.Random, b: bytes) -> bytes:
    """Overwrite 4 or 8 bytes with an interesting little-endian integer (sizes, offsets)."""
    width = rnd.choice((4, 8))
    if len(b) < width:
        return b + rnd.choice(INTERESTING).to_bytes(16, "little", signed=True)[:width]
    i = rnd.randrange(len(b) - width + 1)
    v = rnd.choice(INTERESTING).to_bytes(16, "little", signed=True)[:width]
    return b[:i] + v + b[i + width:]


def _field_op(rnd: random.Random, b: bytes) -> bytes:
    """Mutate ``b`` as protobuf: swap, renumber, retype, duplicate or drop a field, make a
    length prefix huge, or mutate inside a length-delimited field (a submessage)."""
    fields = _fields(b)
    if not fields:
        return _flip(rnd, b)
    i = rnd.randrange(len(fields))
    number, wire, payload = fields[i]
    op = rnd.randrange(7)
    if op == 0 and len(fields) > 1:  # swap two fields' numbers: one's value as the other's
        j = rnd.randrange(len(fields))
        fields[i], fields[j] = ((fields[j][0], wire, payload), (number, fields[j][1], fields[j][2]))
    elif op == 1:
        fields[i] = (rnd.choice((0, 1, 2, 3, 4, 5, 15, 16, 1000, 1 << 28)), wire, payload)
    elif op == 2:
        fields.insert(i, fields[i])
    elif op == 3:
        del fields[i]
    elif op == 4 and wire == 2:  # inside: a submessage, a string, an IPC header
        fields[i] = (number, wire, mutate_bytes(rnd, payload, 1))
    elif op == 5 and wire == 2:  # a length prefix past the end, or huge
        tag = _varint(number << 3 | 2)
        rest = _unfields(fields[i + 1:])
        head = _unfields(fields[:i])
        bad = rnd.choice((len(payload) + 1, len(payload) + 1000, (1 << 31) - 1, 1 << 32,
                          (1 << 63) - 1, (1 << 64) - 1))
        return head + tag + _varint(bad) + payload + rest
    else:
        fields[i] = (number, rnd.choice((0, 1, 2, 3, 5, 6, 7)), payload)
        if fields[i][1] not in (0, 1, 2, 5):  # no encoding for wire types 3, 4, 6, 7
            return _unfields(fields[:i]) + _varint(number << 3 | fields[i][1]) + payload \
                + _unfields(fields[i + 1:])
        if fields[i][1] == 0:
            return _unfields(fields[:i]) + _varint(number << 3) + payload[:10] \
                + _unfields(fields[i + 1:])
        if fields[i][1] in (1, 5):
            width = 8 if fields[i][1] == 1 else 4
            return _unfields(fields[:i]) + _varint(number << 3 | fields[i][1]) \
                + payload.ljust(width, b"\0")[:width] + _unfields(fields[i + 1:])
    return _unfields(fields)


_MUTATORS: tuple[Callable[[random.Random, bytes], bytes], ...] = (
    _flip, _flip, _set_byte, _truncate, _insert, _delete, _integer, _field_op, _field_op,
    _field_op)


def maybe_mutate(rnd: random.Random, b: bytes, p: float = 0.5) -> bytes:
    return mutate_bytes(rnd, b) if rnd.random() < p else b


# ---------------------------------------------------------------------------- frame lists
def split_fields(raw: bytes) -> dict[str, bytes | None] | None:
    try:
        p = parse_flight_data(raw)
    except Exception:
        return None
    return {k: None if v is None else bytes(v) for k, v in
            (("descriptor", p.descriptor), ("header", p.header),
             ("app_metadata", p.app_metadata), ("body", p.body))}


def mutate_frames(rnd: random.Random, frames: list[bytes], foreign: list[bytes]) -> list[bytes]:
    """1-3 stream-level mutations: a frame's bytes, one of its fields (IPC header, body,
    metadata), fields moved between kinds, frames dropped, repeated, swapped or foreign."""
    frames = list(frames)
    for _ in range(rnd.randint(1, 3)):
        if not frames:
            frames.append(rnd.choice(foreign) if foreign else b"")
            continue
        i = rnd.randrange(len(frames))
        op = rnd.randrange(9)
        if op == 0:
            frames[i] = mutate_bytes(rnd, frames[i])
        elif op in (1, 2, 3):  # inside one field: the IPC flatbuffer header above all
            f = split_fields(frames[i])
            if f is None:
                continue
            present = [k for k, v in f.items() if v is not None]
            if not present:
                continue
            key = "header" if "header" in present and op < 3 else rnd.choice(present)
            f[key] = mutate_bytes(rnd, f[key] or b"")
            frames[i] = frame(descriptor=f["descriptor"], header=f["header"],
                              app_metadata=f["app_metadata"], body=f["body"])
        elif op == 4:  # a field's bytes under another field's number
            f = split_fields(frames[i])
            if f is None:
                continue
            keys = list(f)
            a, b = rnd.sample(keys, 2)
            f[a], f[b] = f[b], f[a]
            frames[i] = frame(descriptor=f["descriptor"], header=f["header"],
                              app_metadata=f["app_metadata"], body=f["body"])
        elif op == 5:
            del frames[i]
        elif op == 6:
            frames.insert(i, frames[rnd.randrange(len(frames))])
        elif op == 7:
            j = rnd.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        elif foreign:
            frames.insert(i, rnd.choice(foreign))
    return frames
