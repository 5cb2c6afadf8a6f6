"""What a mirror follows (:class:`MirrorSpec`), its ``--mirror`` text (:func:`parse_mirror`)
and the calls around a link: the origin's schema (:func:`origin_schema`), a filter's
Substrait bytes (:func:`encode_filter`) and a failed call's reason in one line
(:func:`one_line`). The link itself is :mod:`flight.links.link` (DESIGN.md §11).
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from engine.errors import ExpressionError, InputError, SchemaError, SqlError, quoted

__all__ = ["MIRROR_OPTIONS", "MirrorSpec", "encode_filter", "held_by", "one_line", "origin_schema",
           "parse_mirror"]

#: The subscription's receive window: fixed, as the Python client's (clients/wire.py), so a
#: mirror that falls behind holds few messages in flight and its origin composes the rest.
_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1 << 20)]


@dataclass(frozen=True, slots=True)
class MirrorSpec:
    """What to mirror and how.

    Attributes
    ----------
    uri
        The origin server: ``grpc://host:port`` (or ``grpc+tls://``).
    table
        The origin's table.
    local
        The mirror's name here (default: the origin's).
    token
        The origin's bearer token (its read-only token is enough).
    columns
        Mirror only these columns (default: all).
    filter
        Mirror only the rows for which this predicate is true: one boolean Substrait
        ExtendedExpression, the bytes ``SubscriptionRequest.filter`` carries
        (:func:`encode_filter` makes it from a ``pyarrow.compute`` expression and the
        origin's schema; ``None``: every row). The same bytes are sent in every subscribe,
        so a resume finds the origin's filtered table of the first.
    give_up_after
        Seconds out of sync after which the link stops and the mirror fails (``None``:
        retry for ever).
    tls_roots
        PEM root certificates for a ``grpc+tls`` origin (default: the system's).
    where
        The filter as SQL text, as ``--mirror URI/TABLE?filter=...`` gave it: what may
        follow ``WHERE``. :meth:`bind` compiles it against the origin's schema into
        :attr:`filter`; a link needs the bytes.
    """

    uri: str
    table: str
    local: str = ""
    token: str | None = None
    columns: tuple[str, ...] | None = None
    give_up_after: float | None = None
    tls_roots: bytes | None = field(default=None, repr=False)
    filter: bytes | None = field(default=None, repr=False)
    where: str | None = None

    @property
    def name(self) -> str:
        """The mirror's local name."""
        return self.local or self.table

    @property
    def origin(self) -> str:
        """``URI/TABLE``: the table mirrored."""
        return f"{self.uri}/{self.table}"

    def to_json(self) -> dict[str, Any]:
        """The spec as a JSON document, without its token (a durable server keeps this:
        :mod:`flight.durability.durable`); :meth:`from_json` reads it back. A filter is
        kept as its Substrait bytes in base64 (a spec without one has no ``filter``, as
        before filters: a remembered spec still equals its flag's), and its SQL text as
        ``where`` when it came as text."""
        doc: dict[str, Any] = {
            "uri": self.uri, "table": self.table, "local": self.local,
            "columns": None if self.columns is None else list(self.columns),
            "give_up_after": self.give_up_after,
            "tls_roots": None if self.tls_roots is None
            else base64.b64encode(self.tls_roots).decode()}
        if self.filter is not None:
            doc["filter"] = base64.b64encode(self.filter).decode()
        if self.where is not None:
            doc["where"] = self.where
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any], *, token: str | None = None) -> MirrorSpec:
        """The spec :meth:`to_json` gave, presenting ``token`` to the origin."""
        columns, roots, predicate = doc.get("columns"), doc.get("tls_roots"), doc.get("filter")
        where = doc.get("where")
        return cls(str(doc["uri"]), str(doc["table"]), str(doc.get("local") or ""), token=token,
                   columns=None if columns is None else tuple(str(c) for c in columns),
                   give_up_after=doc.get("give_up_after"),
                   tls_roots=None if roots is None else base64.b64decode(roots),
                   filter=None if predicate is None else base64.b64decode(predicate),
                   where=None if where is None else str(where))

    def bind(self, schema: pa.Schema) -> MirrorSpec:
        """This spec checked against its origin table's ``schema``: its :attr:`columns`
        must be there, and its :attr:`where` compiles (through the SQL compiler of views,
        :func:`flight.sql.views.compile_condition`) to :attr:`filter`'s Substrait bytes.

        Raises
        ------
        SchemaError
            If a column of :attr:`columns` is not in ``schema`` (the message lists those
            it has).
        SqlError
            If :attr:`where` does not parse, names a missing column, holds an expression
            that does not map, or is not boolean.
        """
        from flight.sql.views import compile_condition

        what = f"mirror {quoted(self.name)} of {self.origin}"
        have = schema.names
        missing = [c for c in self.columns or () if c not in have]
        if missing:
            raise SchemaError(f"{what}: columns: table {quoted(self.table)} has no column "
                              f"{quoted(missing[0])} (has: {', '.join(have)})")
        if self.where is None:
            return self
        predicate = compile_condition(self.where, schema, table=self.table, prefix=f"{what}: filter")
        return replace(self, filter=encode_filter(predicate, schema, self.table))

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The call headers the origin is shown (the bearer token, if any)."""
        return [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []

    def flight_client(self) -> fl.FlightClient:
        """A new Flight client of the origin (with the spec's roots, and the receive window
        of a subscription)."""
        kw: dict[str, Any] = {"generic_options": _WINDOW}
        if self.tls_roots is not None:
            kw["tls_root_certs"] = self.tls_roots
        return fl.FlightClient(self.uri, **kw)


#: what follows an ``&`` that starts the next option of a ``--mirror`` text
_OPTION_NAME = re.compile(r"[A-Za-z_][\w-]*=")

#: The options a ``--mirror`` text may carry after ``?``.
MIRROR_OPTIONS = ("columns", "filter")


def parse_mirror(text: str, *, token: str | None = None,
                 give_up_after: float | None = None) -> MirrorSpec:
    """A :class:`MirrorSpec` from ``URI/TABLE[=LOCAL][?columns=A,B&filter=CONDITION]``
    (``ticktable serve --mirror``).

    ``URI`` is ``grpc://host:port``, ``grpc+tls://host:port`` or ``host:port``; the table
    is what follows the first ``/`` after the port, up to the first ``?``, and the local
    name what follows its last ``=``. After ``?``, options as ``NAME=VALUE`` separated by
    ``&``, each at most once, in any order:

    * ``columns=A,B``: mirror only these columns (comma-separated, in this order);
    * ``filter=CONDITION``: mirror only the rows for which the SQL condition (what may
      follow ``WHERE``, DuckDB's dialect) is true, e.g. ``px > 100 AND sym <> 'X'``.

    Nothing is URL-encoded: the condition is taken as written, spaces and quotes included;
    an ``&`` starts another option only outside the condition's quoted strings and when a
    name and ``=`` follow it (``s = 'R&D=x'`` stays in the condition). The
    condition is checked here for its syntax only; its columns and types, and the columns,
    are checked against the origin's table by :meth:`MirrorSpec.bind`.

    Raises
    ------
    InputError
        Naming the part that is wrong: the URI, the table or local name, an option, or
        the condition's syntax (a :class:`~engine.errors.SqlError`, with its column).

    Examples
    --------
    >>> parse_mirror("grpc://10.0.0.5:8815/orders=orders_eu").name
    'orders_eu'
    >>> spec = parse_mirror("h:8815/trades=big?columns=sym,px&filter=px > 100")
    >>> spec.name, spec.columns, spec.where
    ('big', ('sym', 'px'), 'px > 100')
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "grpc", text
    if scheme not in ("grpc", "grpc+tcp", "grpc+tls"):
        raise InputError(f"mirror {text!r}: the origin's URI must be grpc:// or grpc+tls://")
    address, slash, path = rest.partition("/")
    if not slash or not path or not address:
        raise InputError(f"mirror {text!r}: expected URI/TABLE[=LOCAL], e.g. "
                         f"grpc://origin:8815/orders=orders_copy")
    path, question, query = path.partition("?")
    table, eq, local = path.rpartition("=")
    if not eq:
        table, local = path, ""
    if not table or (eq and not local):
        raise InputError(f"mirror {text!r}: empty table or local name")
    spec = MirrorSpec(f"{scheme}://{address}", table, local, token=token,
                      give_up_after=give_up_after)
    if question:
        spec = _mirror_options(spec, query, text)
    return spec


def _options(query: str) -> list[str]:
    """``query`` cut at each ``&`` outside SQL quotes (``'...'``, ``"..."``; a doubled
    quote inside one closes and reopens it) that a name and ``=`` follow."""
    parts, start, quote = [], 0, ""
    for i, ch in enumerate(query):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "&" and _OPTION_NAME.match(query, i + 1):
            parts.append(query[start:i])
            start = i + 1
    parts.append(query[start:])
    return parts


def _mirror_options(spec: MirrorSpec, query: str, text: str) -> MirrorSpec:
    """``spec`` with the options of ``query`` (what follows ``?`` in ``text``)."""
    from flight.sql.parse import parse_condition

    what = f"mirror {text!r}"
    if not query:
        raise InputError(f"{what}: nothing after '?': expected columns=A,B and/or "
                         f"filter=CONDITION")
    seen: dict[str, str] = {}
    for part in _options(query):
        name, eq, value = part.partition("=")
        if not eq:
            raise InputError(f"{what}: option {part!r} is not NAME=VALUE (columns=A,B or "
                             f"filter=CONDITION)")
        if name not in MIRROR_OPTIONS:
            raise InputError(f"{what}: unknown option {name!r} (options: "
                             f"{', '.join(MIRROR_OPTIONS)})")
        if name in seen:
            raise InputError(f"{what}: option {name!r} given twice")
        seen[name] = value
    columns, where = None, seen.get("filter")
    if "columns" in seen:
        columns = tuple(c.strip() for c in seen["columns"].split(","))
        if not all(columns):
            raise InputError(f"{what}: columns={seen['columns']!r}: expected column names "
                             f"separated by commas, e.g. columns=sym,px")
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise InputError(f"{what}: columns: {quoted(twice[0])} given twice")
    if where is not None:
        try:
            parse_condition(where)
        except SqlError as exc:
            raise SqlError(f"{what}: filter {where!r}: {exc}") from exc
    return replace(spec, columns=columns, where=where)


def held_by(name: str, origin: str) -> str:
    """What a table's creation is told when a mirror of ``origin`` holds ``name`` (a mirror
    holds its name from its start: :attr:`flight.streams.registry.TableRegistry.claims`)."""
    return (f"table {name!r} is taken by a mirror of {origin} that waits for its origin's "
            f"first answer; drop the mirror or pick another name")


def origin_schema(spec: MirrorSpec, timeout: float) -> pa.Schema:
    """The schema of ``spec``'s origin table, asking again while the origin cannot be
    reached or has no such table yet (as a link does), until ``timeout`` seconds passed.

    Raises
    ------
    TimeoutError
        If no answer came in time, with the last reason.
    """
    end = time.monotonic() + timeout
    while True:
        client = spec.flight_client()
        try:
            left = max(0.05, end - time.monotonic())
            return client.get_schema(fl.FlightDescriptor.for_path(spec.table),
                                     fl.FlightCallOptions(headers=spec.headers(),
                                                          timeout=left)).schema
        # nothing listening yet is a plain OSError ("Flight returned unavailable error")
        except (KeyError, OSError, fl.FlightUnavailableError, fl.FlightTimedOutError) as exc:
            if time.monotonic() >= end:
                raise TimeoutError(f"mirror {spec.name!r}: no answer from {spec.origin} within "
                                   f"{timeout:g} s (last: {one_line(exc)})") from None
        finally:
            client.close()
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def encode_filter(predicate: pc.Expression, schema: pa.Schema, table: str) -> bytes:
    """``predicate`` as :attr:`MirrorSpec.filter`: checked against the origin table's
    ``schema`` (``table`` names it in messages), serialized as Substrait.

    Raises
    ------
    ExpressionError
        If ``predicate`` names a column ``schema`` does not have, does not fit its types,
        or is not boolean.

    Examples
    --------
    >>> spec = MirrorSpec(uri, "quotes", filter=encode_filter(pc.field("px") > 50,
    ...                                                       schema, "quotes"))  # doctest: +SKIP
    """
    from engine import expr as _expr
    from flight import substrait

    bound = _expr.bind(predicate, schema, table_name=table, what="filter")
    if bound.type != pa.bool_():
        raise ExpressionError(f"filter on table {table!r} must be boolean, but {bound.text} is "
                              f"{bound.type} (compare it, e.g. pc.field('x') > 0)")
    return substrait.encode({"filter": predicate}, schema)


def one_line(exc: BaseException) -> str:
    """The reason of a failed call in one line: pyarrow's Flight errors without the gRPC
    debug context they append."""
    text = str(exc).strip()
    text = text.split(". gRPC client debug context:")[0].split(" gRPC client debug context:")[0]
    if "with message: " in text:
        text = text.split("with message: ", 1)[1]
    lines = text.splitlines()
    return lines[0][:300] if lines else type(exc).__name__
