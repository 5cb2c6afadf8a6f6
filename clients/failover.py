"""Several servers behind one client: where each call goes, and when it may go elsewhere.

``tt.connect`` takes several URIs (an origin and its mirrors, holding the same tables);
:class:`~clients.client.Client` states what a user can rely on. This module is how:

* :class:`Servers` holds one :class:`Server` per URI (its Flight connection, its
  TableService channel) and the one calls go to, the last that answered.
  :meth:`Servers.call` runs an operation there and, when it fails with UNAVAILABLE, again
  on each next server in turn while the operation's :class:`Attempt` allows it; when none
  answers, it raises one error naming every URI tried. With one server it only runs the
  operation: errors are raised as pyarrow raised them.
* An operation marks how far it got on its :class:`Attempt`, which decides what a failure
  allows. At first any UNAVAILABLE may be retried elsewhere (nothing sent so far changed
  anything: a read, or rows staged under a write id and not committed). Around the one
  call that changes something, :meth:`Attempt.effect`, only a failure gRPC reports as
  never sent (:data:`NEVER_SENT`) may; once it returned, or once a one-shot input started
  going out (:meth:`Attempt.settle`), none may.
* :class:`Rotation` is a subscription's ``connect``: one server at a time, which a
  :class:`~clients.live.LiveTable` advances when a stream fails before its first message.
  :meth:`Servers.rotation` hands them out round-robin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow.flight as fl

from clients.wire import Endpoint

__all__ = ["NEVER_SENT", "Attempt", "Rotation", "Server", "Servers", "split_uris", "unreachable_reason"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How gRPC words an UNAVAILABLE call that was never sent: no connection could be made to
#: any of the target's addresses (refused, reset before HTTP/2 was up), or its name did not
#: resolve. Any other UNAVAILABLE (a connection that broke, a server shutting down) may
#: have been received.
NEVER_SENT = ("failed to connect to all addresses", "errors resolving", "DNS resolution failed")


def split_uris(uri: str | Sequence[str]) -> list[str]:
    """Every URI of ``uri``: one, several separated by commas, or a list or tuple of these.

    A string without a comma is taken as it is (``""`` is the default host, as for
    :class:`~clients.wire.Endpoint`); pieces around commas are stripped.

    Raises
    ------
    ValueError
        If there is no URI, or an empty one between commas.
    TypeError
        If a URI is not a string.
    """
    given = [uri] if isinstance(uri, str) else list(uri)
    out: list[str] = []
    for part in given:
        if not isinstance(part, str):
            raise TypeError(f"a URI is a str like 'grpc://host:8815', not a "
                            f"{type(part).__name__}: {part!r}")
        if "," not in part:
            out.append(part)
            continue
        pieces = part.split(",")
        if any(not p.strip() for p in pieces):
            raise ValueError(f"empty URI in {part!r}: separate URIs by single commas, e.g. "
                             f"'grpc://a:8815,grpc://b:8815'")
        out.extend(p.strip() for p in pieces)
    if not out:
        raise ValueError("connect needs at least one URI, e.g. 'grpc://127.0.0.1:8815'")
    return out


def _unavailable(exc: BaseException) -> bool:
    """Whether a call failed with UNAVAILABLE: a ``FlightUnavailableError``, or the plain
    ``OSError`` of the same text that ``FlightClient.get_schema`` raises (pyarrow does not
    map its status to a Flight error)."""
    return isinstance(exc, fl.FlightUnavailableError) or (
        isinstance(exc, OSError) and str(exc).startswith("Flight returned unavailable error"))


def _never_sent(exc: BaseException) -> bool:
    """Whether gRPC failed the call before sending it (see :data:`NEVER_SENT`)."""
    return any(words in str(exc) for words in NEVER_SENT)


def unreachable_reason(exc: BaseException) -> str:
    """Why a server did not answer, in a few words: gRPC's message without its prefix,
    its debug context or the server's traceback."""
    text = str(exc).split(". gRPC client debug context:")[0].split(". Detail:")[0]
    text = text.split("with message: ", 1)[-1].strip()
    if text.startswith("failed to connect to all addresses"):
        return f"failed to connect: {text.rsplit(': ', 1)[-1]}"
    return text


class Server:
    """One URI of a client: its endpoint, its Flight connection, and (on first use) a gRPC
    channel to its TableService on the same port.

    Raises
    ------
    ProtocolError
        If the endpoint's scheme is not one Ticktable speaks.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.location = endpoint.location
        self.flight, _ = endpoint.connect()
        self._lock = threading.Lock()
        self._stub: Any = None
        self._channel: Any = None

    def table_service(self) -> Any:
        """The TableService stub, connected on first use."""
        with self._lock:
            if self._stub is None:
                import grpc

                from flight.pb import table_service_pb2_grpc as tgrpc

                target = self.location.split("://", 1)[1]  # Flight's own port serves it
                if self.location.startswith("grpc+tls"):
                    creds = grpc.ssl_channel_credentials(
                        root_certificates=self.endpoint._roots())
                    self._channel = grpc.secure_channel(target, creds)
                else:
                    self._channel = grpc.insecure_channel(target)
                self._stub = tgrpc.TableServiceStub(self._channel)
            return self._stub

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = self._stub = None
        self.flight.close()


class _Retry(enum.Enum):
    """Which failures of an operation may be retried on another server, by how far it got."""

    UNAVAILABLE = "any UNAVAILABLE"  # nothing sent so far changes anything
    NOT_SENT = "never sent"  # the call that changes something is under way
    NEVER = "none"  # something may have changed, or a one-shot input was read


class Attempt:
    """One try of an operation on one server; the operation marks how far it got
    (:meth:`effect`, :meth:`settle`), which decides what a failure allows (:meth:`retries`)."""

    __slots__ = ("server", "_retry")

    def __init__(self, server: Server) -> None:
        self.server = server
        self._retry = _Retry.UNAVAILABLE

    @property
    def flight(self) -> fl.FlightClient:
        return self.server.flight

    @property
    def endpoint(self) -> Endpoint:
        return self.server.endpoint

    @contextlib.contextmanager
    def effect(self) -> Iterator[None]:
        """Around the one call of the operation that changes something: its failure is
        retried elsewhere only if it was never sent; once it returned, no failure is."""
        self._retry = _Retry.NOT_SENT
        yield
        self._retry = _Retry.NEVER

    def settle(self) -> None:
        """From here on no failure is retried elsewhere (a one-shot input is being read)."""
        self._retry = _Retry.NEVER

    def retries(self, exc: BaseException) -> bool:
        """Whether the operation may run again on the next server after failing with ``exc``."""
        if not _unavailable(exc):
            return False  # the server answered (or the client refused before sending)
        if self._retry is _Retry.UNAVAILABLE:
            return True
        return self._retry is _Retry.NOT_SENT and _never_sent(exc)


class Rotation:
    """The servers one subscription may use, one at a time: a LiveTable's ``connect``.

    Calling it opens a subscription connection (:meth:`Endpoint.connect_subscription`) to
    the current endpoint; :meth:`advance` makes the next one current, in the order given,
    after the last the first. A :class:`~clients.live.LiveTable` given a Rotation advances
    it when a stream fails before delivering its first message (its server did not
    answer), and only then: after a stream that worked breaks it tries the same server
    first (and resumes by deltas if that server is back), and the next one when that
    server does not answer (which answers with a snapshot, its table's epoch being
    another). Used from the LiveTable's reader thread; :attr:`uri` may be read from any.

    Parameters
    ----------
    endpoints
        One or more endpoints, taken in turn.
    start
        Index of the endpoint to use first (taken modulo their number).

    Raises
    ------
    ValueError
        If ``endpoints`` is empty.
    """

    def __init__(self, endpoints: Sequence[Endpoint], start: int = 0) -> None:
        if not endpoints:
            raise ValueError("a Rotation needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self._index = start % len(self.endpoints)

    @property
    def uri(self) -> str:
        """The location of the current endpoint (where the next stream is opened)."""
        return self.endpoints[self._index].location

    @property
    def uris(self) -> tuple[str, ...]:
        """Every endpoint's location, in turn order."""
        return tuple(e.location for e in self.endpoints)

    def advance(self) -> str:
        """Make the next endpoint current; returns its location."""
        self._index = (self._index + 1) % len(self.endpoints)
        return self.uri

    def __call__(self) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
        return self.endpoints[self._index].connect_subscription()

    def __repr__(self) -> str:
        return f"<Rotation on {self.uri} of {', '.join(self.uris)}>"


class Servers:
    """A client's servers, in the order given, and the one calls go to.

    Thread-safe: operations may run from several threads; the one calls go to moves to
    the server that answered, as the last to do so sets it.

    Parameters
    ----------
    endpoints
        One or more; each is connected (lazily: gRPC dials on the first call).

    Raises
    ------
    ValueError
        If ``endpoints`` is empty.
    ProtocolError
        If an endpoint's scheme is not one Ticktable speaks.
    """

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        if not endpoints:
            raise ValueError("a client needs at least one endpoint")
        servers: list[Server] = []
        try:
            for e in endpoints:
                servers.append(Server(e))
        except BaseException:
            for server in servers:
                server.close()
            raise
        self.all = tuple(servers)
        self._active = 0  # the last to answer
        self._spread = itertools.count()  # the next subscription's first server

    @property
    def active(self) -> Server:
        """The server calls go to: the last that answered (at first, the first)."""
        return self.all[self._active]

    @property
    def uris(self) -> tuple[str, ...]:
        return tuple(s.location for s in self.all)

    def __len__(self) -> int:
        return len(self.all)

    def call(self, what: str, op: Callable[[Attempt], T]) -> T:
        """Run ``op`` on the :attr:`active` server; when it fails with UNAVAILABLE, on each
        next one in turn while its :class:`Attempt` allows.

        Parameters
        ----------
        what
            The call, for messages (``"tables()"``, ``"push into 't'"``).
        op
            Runs the whole operation on its attempt's server.

        Raises
        ------
        pyarrow.flight.FlightUnavailableError
            Naming ``what`` and every URI tried, with why each failed, when every server
            failed and each failure allowed the next; chained to the last failure.
        Exception
            Whatever ``op`` raised otherwise, as it raised it.
        """
        servers = self.all
        if len(servers) == 1:
            return op(Attempt(servers[0]))
        start = self._active
        tried: list[str] = []
        failure: BaseException | None = None
        for i in range(len(servers)):
            index = (start + i) % len(servers)
            attempt = Attempt(servers[index])
            try:
                result = op(attempt)
            except (fl.FlightUnavailableError, OSError) as exc:
                if not attempt.retries(exc):
                    raise
                failure = exc
                tried.append(f"{attempt.server.location} ({unreachable_reason(exc)})")
                if i + 1 < len(servers):  # (after the last, the error says it all)
                    log.warning("%s: %s is unavailable (%s); trying the next server", what,
                                attempt.server.location, unreachable_reason(exc))
                continue
            if index != self._active:
                self._active = index
                log.info("%s answered %s; calls go there from now on", attempt.server.location,
                         what)
            return result
        raise fl.FlightUnavailableError(
            f"no server answered {what}; tried {', '.join(tried)}") from failure

    def on(self, uri: str, op: Callable[[Attempt], T]) -> T:
        """Run ``op`` on the server of ``uri`` (see :meth:`find`), without failover."""
        return op(Attempt(self.find(uri)))

    def find(self, uri: str) -> Server:
        """The server ``uri`` names, as given or normalized.

        Raises
        ------
        ValueError
            If it is none of them.
        """
        for server in self.all:
            if dataclasses.replace(server.endpoint, uri=uri).location == server.location:
                return server
        raise ValueError(f"{uri!r} is not a URI of this client (it has: "
                         f"{', '.join(self.uris)})")

    def rotation(self, uri: str | None = None) -> Rotation:
        """Where the next subscription connects: every server, starting round-robin (the
        i-th rotation on server i mod n); or only the server of ``uri``."""
        if uri is not None:
            return Rotation([self.find(uri).endpoint])
        return Rotation([s.endpoint for s in self.all], start=next(self._spread))

    def close(self) -> None:
        for server in self.all:
            server.close()
