"""Arrow Flight served by grpcio, beside the TableService on the same port (DESIGN.md §5).

:class:`FlightService` implements ``arrow.flight.protocol.FlightService`` as a generic
gRPC handler. The unary and small messages go through the classes generated from
``proto/arrow/flight/protocol/arrow_flight.proto``; ``FlightData`` and ``PutResult`` are
framed by hand (:mod:`flight.rpc.framing`), so record batch bodies are neither re-encoded per
subscriber nor copied on the way in.

=================  ==================================================================
Flight call        what it does
=================  ==================================================================
Handshake          answers each request with an empty response (tokens are headers)
ListFlights        every table: schema, size, kind
GetFlightInfo      one table (descriptor path ``[name]``); its ticket is a SnapshotRequest
PollFlightInfo     UNIMPLEMENTED
GetSchema          one table's schema
DoGet              a consistent snapshot; the ticket is a ``SnapshotRequest`` (columns,
                   Substrait filter) or a plain table name
DoExchange         a subscription (:mod:`flight.streams.subscription`): the first client message's
                   ``app_metadata`` is a ``ClientMessage`` with ``subscribe``
DoPut              ingestion (:mod:`flight.ingest.put`); the ``PutRequest`` is the first batch's
                   ``app_metadata`` or the schema message's (not both)
DoAction           the actions of :data:`flight.wire.ACTIONS` (``create_table``, ``stats``, ...),
                   run by :meth:`flight.server.TicktableServer.action`
ListActions        the actions of :data:`flight.wire.ACTIONS`, in order
=================  ==================================================================

Errors. Every handler answers an exception with its row of :mod:`flight.errors`: the
row's gRPC code and a one-line message; a bug answers INTERNAL with a reference id and
the traceback goes to the log only. A DoExchange past ``max_subscriptions_per_client``
open from its client's address is refused RESOURCE_EXHAUSTED (:mod:`flight.ingest.limits`).

Streams. The server is ``grpc.aio`` and every handler here runs on a thread
(:mod:`flight.rpc.aio`). A streaming answer is a generator whose messages the event loop
writes; gRPC's HTTP/2 flow control holds the loop's write while the client's window is
full, and the generator's thread while the bridge's short pipe is. A subscription's
messages are written by its sender (or its table's fan-out thread) into a
:class:`FrameQueue` that the event loop drains itself, so a delta reaches the wire without
waking a handler thread, and a writer blocks when the client stops reading: the
transport's own flow control is what detects a slow reader. No thread waits for a stream a
fan-out writes: its handler is suspended while the loop drains the queue, its sender parks
(:meth:`Subscription.run <flight.streams.subscription.Subscription.run>`) and its reader of
the client's messages runs only while some wait (:class:`_ChangeReader`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from engine.errors import ProtocolError, SchemaError
from flight.errors import abort, grpc_status
from flight.limits import quoted
from flight.pb import arrow_flight_pb2 as fpb
from flight.pb import flight_pb2 as pb
from flight.pb import flight_sql_pb2 as sql
from flight.rpc.aio import (
    END,
    HAND_OFF,
    CallContext,
    HandOff,
    LoopFeed,
    LoopQueue,
    QueueClosed,
    Requests,
    spawn,
)
from flight.rpc.framing import (
    IpcDecoder,
    batch_frames,
    descriptor_of,
    parse_flight_data,
    put_result,
    schema_frame,
)
from flight.rpc.quiet import quiet
from flight.rpc.requests import check_metadata_size, parse, table_name
from flight.sql.commands import SQL_ACTION_TYPES, unpack
from flight.streams.group import GroupSubscription, check_group_request
from flight.streams.per_client import client_of
from flight.streams.subscription import Subscription
from flight.wire import ACTIONS

if TYPE_CHECKING:
    from engine.graph import UpdateGraph
    from flight.ingest.put import PutHandler
    from flight.sql.service import FlightSqlService
    from flight.streams.filtered import FilteredTables
    from flight.streams.per_client import SubscriptionsPerClient
    from flight.streams.registry import TableEntry, TableRegistry
    from flight.streams.subscription import Subscriber, SubscriptionOptions

__all__ = ["SERVICE_NAME", "FlightHost", "FlightService"]

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_NAME = "arrow.flight.protocol.FlightService"


class _Limits(Protocol):
    max_batch_rows: int
    max_metadata_bytes: int


class FlightHost(Protocol):
    """What :class:`FlightService` serves from (a :class:`~flight.server.TicktableServer`)."""

    graph: UpdateGraph
    registry: TableRegistry
    puts: PutHandler
    sub_options: SubscriptionOptions
    subscriptions_per_client: SubscriptionsPerClient
    filters: FilteredTables

    @property
    def config(self) -> _Limits: ...

    @property
    def sql(self) -> FlightSqlService: ...

    def track_subscription(self, sub: Subscriber, delta: int) -> None:
        """Count ``sub`` as open (``delta`` +1) or closed (-1)."""

    def read_only(self, context: grpc.ServicerContext) -> bool:
        """Whether the call came with the read-only token (:mod:`flight.rpc.auth`)."""

    def action(self, kind: str, body: bytes) -> bytes | None:
        """Run one DoAction (a row of :data:`flight.wire.ACTIONS`); returns the serialized
        result message (or ``None``)."""


# ------------------------------------------------------------------------------ errors
def _unary(fn: Callable[[Any, grpc.ServicerContext], T]) -> Callable[[Any, grpc.ServicerContext], T]:
    def handler(request: Any, context: grpc.ServicerContext) -> T:
        try:
            return fn(request, context)
        except Exception as exc:
            abort(context, exc)

    return handler


def _streaming(fn: Callable[[Any, grpc.ServicerContext], Iterator[T]]
               ) -> Callable[[Any, grpc.ServicerContext], Iterator[T]]:
    """A streaming handler whose exception ends the call with its status (see module doc)."""

    def handler(request: Any, context: grpc.ServicerContext) -> Iterator[T]:
        try:
            yield from fn(request, context)
        except grpc.RpcError:
            # from the client's messages: the call is over, its status already sent (the
            # client cancelled, or gRPC refused a message past its receive limit); CallLog
            # logs the call's end
            log.debug("%s from %s ended while its messages were read", fn.__name__,
                      context.peer())
        except Exception as exc:
            code, message = grpc_status(exc)
            context.set_code(code)
            context.set_details(message)

    return handler


def _put_where(descriptor: flight.FlightDescriptor | None) -> str:
    """How a DoPut's refusals name the call: ``DoPut into 'table'`` when the path says."""
    if (descriptor is None or descriptor.descriptor_type != flight.DescriptorType.PATH
            or len(descriptor.path) != 1):
        return "DoPut"  # refused by PutHandler.serve_acks, naming the descriptor's problem
    raw = descriptor.path[0]
    name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return f"DoPut into {quoted(name)}"


def _sql_command(raw: bytes) -> object:
    """The Flight SQL command in a descriptor's bytes, or ``None`` (its errors are the SQL
    service's to answer)."""
    try:
        return unpack(raw)
    except ProtocolError:
        return None


def _batches(decoder: IpcDecoder) -> Iterator[pa.RecordBatch]:
    """A DoPut stream's record batches (messages without one are skipped)."""
    while True:
        try:
            chunk = decoder.read_chunk()
        except StopIteration:
            return
        if chunk.data is not None:
            yield chunk.data


class _Context:
    """What a subscription asks of its call (pyarrow's ServerCallContext's shape)."""

    def __init__(self, context: CallContext) -> None:
        self._context = context

    def is_cancelled(self) -> bool:
        return not self._context.is_active()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return self._context.add_callback(callback)

    def peer(self) -> str:
        return str(self._context.peer())


class _Stream(Protocol):
    """A subscription's server side: one table's (:class:`Subscription`) or a group's
    (:class:`~flight.streams.group.GroupSubscription`)."""

    def run(self, writer: FrameQueue, context: _Context,
            resume: Callable[[], None] | None = None) -> bool: ...

    def send_end(self, writer: FrameQueue, error: str) -> None: ...

    def change(self, change: pb.SubscriptionChange) -> None: ...

    def on_table_failure(self, exc: BaseException) -> None: ...

    def close(self) -> None: ...


class _Gone(Exception):
    """The call ended (client cancelled or disconnected): nothing more can be written."""


class FrameQueue(LoopFeed):
    """Frames written by any thread, written to the call by the server's event loop.

    ``write_frames`` blocks while ``depth`` messages wait (the loop waits in gRPC while
    the client's flow-control window is full), and raises once the call is over. The
    handler yields the queue (the bridge drains it on the loop, :mod:`flight.rpc.aio`,
    while the handler is suspended on no thread) and then, resumed, takes the end's error
    in :meth:`wait`.
    """

    def __init__(self, context: CallContext, depth: int = 4) -> None:
        self._queue = LoopQueue(context.loop, depth)
        self._finished = threading.Event()
        context.add_callback(self._call_ended)  # cancelled, disconnected or finished

    def _call_ended(self) -> None:
        self._queue.close()
        self._finished.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that writes the frames."""
        return self._queue.loop

    def has_room(self) -> bool:
        """Whether :meth:`write_frames` now would return at once (it may still raise)."""
        return self._queue.has_room()

    def write_frames(self, frames: tuple[bytes, ...]) -> None:
        try:
            self._queue.put(frames)
        except QueueClosed:
            raise _Gone("the client's call ended") from None

    def close(self, error: BaseException | None = None) -> None:
        """No more frames; the call ends with ``error``'s status (OK without one)."""
        self._queue.finish(error)

    async def drain(self) -> AsyncIterator[bytes]:
        """The frames, until :meth:`close` (on the event loop)."""
        try:
            while (frames := await self._queue.get()) is not END:
                for frame in frames:
                    yield frame
        finally:
            self._queue.close()
            self._finished.set()

    def wait(self) -> None:
        """Block until the frames are written or the call ended; raises the error the
        queue was closed with."""
        self._finished.wait()
        # raised without a reference left here or in the queue: its traceback holds this
        # frame and the handler's, and a cycle through them would keep what they hold
        error, self._queue.error = self._queue.error, None
        if error is not None:
            try:
                raise error
            finally:
                del error


class _Sender:
    """Runs a subscription's sender on a thread: :meth:`Subscription.run
    <flight.streams.subscription.Subscription.run>`, again after each time it parked
    (:meth:`resume`), and the stream's end once it is over."""

    def __init__(self, sub: _Stream, out: FrameQueue, context: _Context,
                 release: Callable[[], None], name: str) -> None:
        self._sub = sub
        self._out = out
        self._context = context
        self._release = release
        self._name = name

    def resume(self) -> None:
        """Run the sender on a new thread (the first time, and each time a parked stream
        has work again)."""
        spawn(self._send, f"ticktable-sub-{self._name}")  # may be on the event loop

    def _send(self) -> None:
        sub, out = self._sub, self._out
        parked = False
        try:
            parked = sub.run(out, self._context, self.resume)
            if not parked:
                out.close()
        except _Gone:
            out.close()
        except Exception as exc:
            # the stream ends from our side: tell the client to finish writing
            if not self._context.is_cancelled():
                try:
                    sub.send_end(out, grpc_status(exc)[1])
                except Exception:
                    log.debug("could not send end of stream", exc_info=True)
            out.close(exc)
        finally:
            if not parked:
                sub.close()
                self._release()


class _ChangeReader:
    """A subscription's reader of its client's messages (subscription changes), on a thread
    only while some wait: :meth:`arrived` (each message's arrival, on the event loop)
    starts one unless one runs, and it ends once none waits. A thousand quiet subscribers
    hold no thousand threads waiting for messages that rarely come."""

    def __init__(self, decoder: IpcDecoder, requests: Requests, sub: _Stream, limit: int,
                 name: str) -> None:
        self._decoder = decoder
        self._requests: Requests | None = requests
        self._sub = sub
        self._limit = limit
        self._name = name
        self._lock = threading.Lock()
        self._running = False
        self._again = False  # a message arrived while the thread was reading
        self._done = False
        requests.watch(self.arrived)  # from now on

    def arrived(self) -> None:
        """A message arrived (``Requests.watch``, on the event loop): read it on a thread."""
        with self._lock:
            if self._done:
                return
            if self._running:
                self._again = True
                return
            self._running = True
        spawn(self._drain, f"ticktable-sub-in-{self._name}")  # on the event loop

    def _drain(self) -> None:
        requests = self._requests
        assert requests is not None  # let go only once done, and then no drain starts
        while True:
            while requests.ready():
                if not self._read_one():
                    with self._lock:
                        self._done, self._running = True, False
                        self._requests = None  # they hold arrived: a cycle through self
                    return
            with self._lock:
                if not self._again:
                    self._running = False
                    return
                self._again = False

    def _read_one(self) -> bool:
        """Read and apply one message; False once no more are read (the client finished
        writing or left, or sent a bad message: the stream is told)."""
        sub = self._sub
        try:
            chunk = self._decoder.read_chunk()
        except StopIteration:
            return False  # the client is done writing; keep sending
        except ProtocolError as exc:
            sub.on_table_failure(exc)
            return False
        except Exception:
            sub.close()  # the client went away
            return False
        try:
            meta = chunk.app_metadata
            if meta is None or meta.size > self._limit:
                raise ProtocolError("subscription changes need metadata within the limit")
            msg = parse(pb.ClientMessage(), meta.to_pybytes(), "subscription change")
            if msg.WhichOneof("body") != "change":
                raise ProtocolError("expected a subscription change")
            sub.change(msg.change)
        except ProtocolError as exc:
            sub.on_table_failure(exc)
            return False
        return True


# ----------------------------------------------------------------------------- service
class FlightService:
    """``arrow.flight.protocol.FlightService`` over one server (:class:`FlightHost`)."""

    def __init__(self, server: FlightHost) -> None:
        self.server = server

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.Server``."""
        raw = None  # hand-framed messages: gRPC passes the bytes through
        unary, stream = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Handshake": grpc.stream_stream_rpc_method_handler(
                _streaming(self.handshake), fpb.HandshakeRequest.FromString,
                fpb.HandshakeResponse.SerializeToString),
            "ListFlights": stream(_streaming(self.list_flights), fpb.Criteria.FromString,
                                  fpb.FlightInfo.SerializeToString),
            "GetFlightInfo": unary(_unary(self.get_flight_info), fpb.FlightDescriptor.FromString,
                                   fpb.FlightInfo.SerializeToString),
            "PollFlightInfo": unary(self.poll_flight_info, fpb.FlightDescriptor.FromString,
                                    fpb.PollInfo.SerializeToString),
            "GetSchema": unary(_unary(self.get_schema), fpb.FlightDescriptor.FromString,
                               fpb.SchemaResult.SerializeToString),
            "DoGet": stream(_streaming(self.do_get), fpb.Ticket.FromString, raw),
            "DoPut": grpc.stream_stream_rpc_method_handler(_streaming(self.do_put), raw, raw),
            "DoExchange": grpc.stream_stream_rpc_method_handler(_streaming(self.do_exchange),
                                                                raw, raw),
            "DoAction": stream(_streaming(self.do_action), fpb.Action.FromString,
                               fpb.Result.SerializeToString),
            "ListActions": stream(_streaming(self.list_actions), fpb.Empty.FromString,
                                  fpb.ActionType.SerializeToString),
        })

    # ------------------------------------------------------------------ metadata
    def handshake(self, requests: Iterator[fpb.HandshakeRequest],
                  context: grpc.ServicerContext) -> Iterator[fpb.HandshakeResponse]:
        for r in requests:
            yield fpb.HandshakeResponse(protocol_version=r.protocol_version)

    def _info(self, entry: TableEntry) -> fpb.FlightInfo:
        ticket = pb.SnapshotRequest(table=entry.name).SerializeToString()
        return fpb.FlightInfo(
            schema=entry.table.schema.serialize().to_pybytes(),
            flight_descriptor=fpb.FlightDescriptor(type=fpb.FlightDescriptor.PATH,
                                                   path=[entry.name]),
            endpoint=[fpb.FlightEndpoint(ticket=fpb.Ticket(ticket=ticket))],
            total_records=len(entry.table.rowset), total_bytes=-1,
            app_metadata=entry.kind.encode())

    def list_flights(self, criteria: fpb.Criteria,
                     context: grpc.ServicerContext) -> Iterator[fpb.FlightInfo]:
        infos = [self._info(e) for e in self.server.registry.entries()]
        yield from infos

    def _entry(self, descriptor: fpb.FlightDescriptor) -> TableEntry:
        if descriptor.type != fpb.FlightDescriptor.PATH or len(descriptor.path) != 1:
            raise ProtocolError("use FlightDescriptor.for_path(table_name)")
        return self.server.registry.get(descriptor.path[0])

    def get_flight_info(self, descriptor: fpb.FlightDescriptor,
                        context: grpc.ServicerContext) -> fpb.FlightInfo:
        if descriptor.type == fpb.FlightDescriptor.CMD:  # Flight SQL (flight.sql)
            return self.server.sql.flight_info(descriptor,
                                               read_only=self.server.read_only(context))
        return self._info(self._entry(descriptor))

    def poll_flight_info(self, descriptor: fpb.FlightDescriptor,
                         context: grpc.ServicerContext) -> fpb.PollInfo:
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "PollFlightInfo: Ticktable answers every query at once; use GetFlightInfo")
        raise AssertionError("abort returned")

    def get_schema(self, descriptor: fpb.FlightDescriptor,
                   context: grpc.ServicerContext) -> fpb.SchemaResult:
        if descriptor.type == fpb.FlightDescriptor.CMD:  # Flight SQL (flight.sql)
            schema = self.server.sql.schema(descriptor, read_only=self.server.read_only(context))
            return fpb.SchemaResult(schema=schema.serialize().to_pybytes())
        return fpb.SchemaResult(schema=self._entry(descriptor).table.schema.serialize().to_pybytes())

    # ------------------------------------------------------------------ snapshots
    def do_get(self, ticket: fpb.Ticket,
               context: grpc.ServicerContext) -> Iterator[bytes | HandOff]:
        # starts on the event loop (flight.rpc.aio's loop_first): HAND_OFF before any work
        # that may block; Flight SQL's frames say themselves when theirs begins
        if unpack(ticket.ticket) is not None:  # a Flight SQL ticket (flight.sql)
            # (told apart here: a plain ticket does not build the server's SQL service)
            frames = self.server.sql.do_get(ticket.ticket, read_only=self.server.read_only(context))
            assert frames is not None
            yield from frames
            return
        yield HAND_OFF  # a table's snapshot: the graph's lock
        req = self._snapshot_request(ticket.ticket)
        entry = self.server.registry.get(req.table)
        table = entry.table
        columns = list(req.columns) or None
        if columns:
            unknown = [c for c in columns if c not in table.schema.names]
            if unknown:
                raise SchemaError(f"table {req.table!r} has no column(s) {unknown} "
                                  f"(columns: {', '.join(table.schema.names)})")
        graph, publisher = self.server.graph, entry.publisher
        for _ in range(8):  # a snapshot with the step it was taken at (no cycle in between)
            step = graph.step
            sequence = publisher.sequence if publisher is not None else 0
            snap = table.to_arrow(None if req.filter else columns)
            size = len(table.rowset)
            if graph.step == step:
                break
        if req.filter:
            from flight.substrait import filter_table

            snap = filter_table(snap, req.filter, table_name=req.table)
            if columns:
                snap = snap.select(columns)
        meta = pb.UpdateMetadata(step=step, is_snapshot=True, sequence=sequence,
                                 epoch=publisher.epoch if publisher is not None else "",
                                 table_size=size, columns=snap.schema.names)
        # record batches of at most max_batch_rows (zero-copy slices), each framed as it is
        # sent: no client has to take one message of the whole table; the first carries
        # the snapshot's step (an empty snapshot: one batch of no rows)
        batches = snap.to_batches(max_chunksize=self.server.config.max_batch_rows) or [
            pa.RecordBatch.from_pylist([], snap.schema)]
        yield schema_frame(snap.schema)
        yield from batch_frames(snap.schema, batches, first_metadata=meta.SerializeToString())

    def _snapshot_request(self, raw: bytes) -> pb.SnapshotRequest:
        """The ticket's request: a table name (plain text) or a serialized SnapshotRequest.

        Text without control characters that is not a SnapshotRequest naming a table is
        taken for a table name (NOT_FOUND when there is none: a serialized SnapshotRequest
        naming a table always holds a control character, its first field's tag).
        """
        try:
            name: str | None = raw.decode()
        except UnicodeDecodeError:
            name = None
        if name is not None and not name.isprintable():
            name = None
        registry = self.server.registry
        if name is not None and name in registry.names():
            return pb.SnapshotRequest(table=name)
        try:
            req = parse(pb.SnapshotRequest(), raw, "DoGet ticket")
        except ProtocolError:
            if name is None:
                raise
            req = pb.SnapshotRequest()
        if req.table:
            return req
        if name:
            registry.get(name)  # raises TableNotFound naming it
        raise ProtocolError("DoGet ticket names no table; use a SnapshotRequest or a "
                            "table name")

    # ------------------------------------------------------------------ ingestion
    def do_put(self, messages: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        first = next(messages, None)
        if first is None:
            return  # the client closed without sending anything: nothing to do
        # the table, from the first message's descriptor, so that every refusal names it
        head = descriptor_of(parse_flight_data(first).descriptor)
        where = _put_where(head)
        decoder = IpcDecoder(itertools.chain((first,), messages), where)
        schema = decoder.read_schema()
        if schema is None:
            if head is not None and head.descriptor_type == flight.DescriptorType.CMD:
                # a Flight SQL statement sent as a descriptor and no data (arrow-go's
                # ExecuteUpdate, under ADBC's driver): it still gets its DoPutUpdateResult
                for meta in self.server.sql.do_put(head.command, iter(()),
                                                   read_only=self.server.read_only(context)):
                    yield put_result(meta)
            return
        for column, n in collections.Counter(schema.names).items():
            if n > 1:  # pyarrow could not tell the columns apart when conforming them
                raise SchemaError(f"{where}: column {quoted(column)} appears {n} times; column "
                                  f"names must be unique")
        descriptor = decoder.descriptor
        if descriptor is not None and descriptor.descriptor_type == flight.DescriptorType.CMD:
            if isinstance(_sql_command(descriptor.command), sql.CommandPreparedStatementQuery):
                quiet(context)  # a query's parameters: logged as the query's other calls
            results = self.server.sql.do_put(descriptor.command, _batches(decoder),
                                             read_only=self.server.read_only(context))
            for meta in results:  # Flight SQL (flight.sql)
                yield put_result(meta)
            return
        for ack in self.server.puts.serve_acks(decoder.descriptor, decoder,
                                               decoder.schema_metadata):
            yield put_result(ack.SerializeToString())

    # -------------------------------------------------------------- subscriptions
    def do_exchange(self, messages: Iterator[bytes],
                    context: grpc.ServicerContext) -> Iterator[bytes | LoopFeed]:
        server = self.server
        head = next(messages, None)
        if head is None:
            raise ProtocolError("DoExchange: the client finished writing before sending a "
                                "ClientMessage with subscribe")
        # as Flight's own servers: else a message without one (an empty one, a schema) would
        # leave the stream open and silent, waiting for a subscribe that may never come
        if parse_flight_data(head).descriptor is None:
            raise ProtocolError("DoExchange: the first message must carry a FlightDescriptor "
                                "(PATH [table])")
        decoder = IpcDecoder(itertools.chain((head,), messages), "DoExchange")
        try:
            first = decoder.read_chunk()
        except StopIteration:
            raise ProtocolError("DoExchange: the client finished writing before sending a "
                                "ClientMessage with subscribe") from None
        meta = first.app_metadata
        check_metadata_size(meta, server.config.max_metadata_bytes, "DoExchange")
        msg = parse(pb.ClientMessage(), None if meta is None else meta.to_pybytes(), "DoExchange")
        body = msg.WhichOneof("body")
        if body == "subscribe_group":
            yield from self._group(msg.subscribe_group, decoder, context)
            return
        if body != "subscribe":
            raise ProtocolError("the first DoExchange message must be a subscribe (or "
                                "subscribe_group)")
        req = msg.subscribe
        descriptor = decoder.descriptor
        if (not req.table and descriptor is not None
                and descriptor.descriptor_type == flight.DescriptorType.PATH):
            req.table = table_name(descriptor)
        entry = server.registry.get(req.table)
        filters = server.filters if req.filter else None
        if filters is not None:  # the shared where of (table, filter): flight.streams.filtered
            entry = filters.acquire(entry, req.filter)
        try:
            sub = Subscription(entry, req, server.sub_options)  # checks the request; holds nothing
            client = client_of(context.peer())
            server.subscriptions_per_client.acquire(client, f"subscription to {quoted(entry.name)}")
        except BaseException:
            if filters is not None:
                filters.release(entry, linger=False)
            raise
        server.track_subscription(sub, +1)

        def release() -> None:
            server.track_subscription(sub, -1)
            server.subscriptions_per_client.release(client)
            if filters is not None:
                filters.release(sub.entry)

        yield from self._serve(sub, decoder, context, release, entry.name)

    def _group(self, req: pb.GroupSubscriptionRequest, decoder: IpcDecoder,
               context: grpc.ServicerContext) -> Iterator[bytes | LoopFeed]:
        """A multi-table subscription (:mod:`flight.streams.group`): each table counts as
        one subscription (per-client limit, stats), and one with a filter holds its filtered
        table, as for one table."""
        server = self.server
        check_group_request(req)
        entries = [server.registry.get(r.table) for r in req.tables]  # NOT_FOUND naming it
        held: list[TableEntry] = []  # filtered tables acquired
        client = client_of(context.peer())
        counted = 0
        try:
            for i, r in enumerate(req.tables):
                if r.filter:
                    entries[i] = server.filters.acquire(entries[i], r.filter)
                    held.append(entries[i])
            group = GroupSubscription(entries, req, server.sub_options)  # checks the columns
            for e in entries:
                server.subscriptions_per_client.acquire(
                    client, f"multi-table subscription to {quoted(e.name)}")
                counted += 1
        except BaseException:
            for _ in range(counted):
                server.subscriptions_per_client.release(client)
            for e in held:
                server.filters.release(e, linger=False)
            raise
        for m in group.members:
            server.track_subscription(m, +1)

        def release() -> None:
            for m in group.members:
                server.track_subscription(m, -1)
                server.subscriptions_per_client.release(client)
            for e in held:
                server.filters.release(e)

        yield from self._serve(group, decoder, context, release, "+".join(group.names)[:60])

    def _serve(self, sub: _Stream, decoder: IpcDecoder, context: grpc.ServicerContext,
               release: Callable[[], None], name: str) -> Iterator[bytes | LoopFeed]:
        """Run a subscription's sender and its reader of client messages on threads of their
        own; the event loop writes what the sender queues. A sender whose stream a fan-out
        writes parks (:meth:`Subscription.run`): its thread ends, and a new one takes the
        stream up again when it has work of its own."""
        out = FrameQueue(cast(CallContext, context))  # flight.rpc.aio runs every handler
        requests = cast(CallContext, context).requests
        assert requests is not None  # a request-streaming call: the bridge reads its messages
        _ChangeReader(decoder, requests, sub, self.server.config.max_metadata_bytes, name)
        _Sender(sub, out, _Context(cast(CallContext, context)), release, name).resume()
        try:
            yield out  # the event loop writes its frames (flight.rpc.aio.LoopFeed)
            out.wait()
        finally:
            sub.close()


    # -------------------------------------------------------------------- actions
    def list_actions(self, request: fpb.Empty,
                     context: grpc.ServicerContext) -> Iterator[fpb.ActionType]:
        for a in ACTIONS:
            yield fpb.ActionType(type=a.name, description=a.description)
        for name in SQL_ACTION_TYPES:
            yield fpb.ActionType(type=name, description="Flight SQL")

    def do_action(self, action: fpb.Action, context: grpc.ServicerContext) -> Iterator[fpb.Result]:
        if action.type in SQL_ACTION_TYPES:  # Flight SQL (flight.sql)
            for body in self.server.sql.action(action.type, action.body):
                yield fpb.Result(body=body)
            return
        out = self.server.action(action.type, action.body)
        if out is not None:
            yield fpb.Result(body=out)
