"""The Kafka-protocol trio server shared by controllers and brokers.

Theory of operation
-------------------
One task per connection reads in bulk (`receive_some` of 64 KiB, more while
a large frame is being assembled), splits out every complete frame
(`FrameBuffer`) and decodes it (`decode_request`). ApiVersions is answered
here from the server's `SupportedApis`; every other request gets a slot in
the connection's `_Pipeline`, in arrival order, and is handed to
`handler(ctx, request)` in its own task. A writer task takes the completed
slots at the head of the pipeline and sends all of them with one
`send_all` (hand-built responses may slice files, sent with `os.sendfile`).
So responses leave in request order however the handlers finish, and at
most `max_in_flight` requests of a connection are being handled or waiting
to be sent: when the pipeline is full the reader stops reading and TCP
pushes back on the client.

Handlers of one connection run concurrently. Kafka processes a
connection's requests one at a time; a handler that needs that guarantee
(e.g. Produce, so appends keep the order of the idempotent producer's
sequence numbers) wraps its ordered part in `async with ctx.in_order(request)`.

What a handler returns:
- a kio response entity: encoded here (`encode_response`);
- `bytes`, or a list of parts (buffers and `FileSlice`s) forming one
  complete frame, size prefix included (see `framing.frame_parts`);
- None: no response (Produce with acks=0).

Failure is per connection, never per process: a malformed frame (oversized
size prefix, unknown API or version, undecodable body) closes that
connection with one log line naming the peer; a handler exception is
logged with its traceback and closes the connection; a connection with no
traffic and nothing in flight for `connections.max.idle.ms` is closed.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from raftka.wire.apis import SupportedApis
from raftka.wire.codec import API_VERSIONS_KEY, DecodedRequest, api_name, decode_request, encode_response
from raftka.wire.errors import LocalProtocolError, ProtocolError
from raftka.wire.framing import (
    DEFAULT_REQUEST_MAX_BYTES,
    SIZE_PREFIX,
    FileSlice,
    FrameBuffer,
    ResponsePart,
    part_length,
)
from raftka.wire.transmit import FileTransfer, send_parts

DEFAULT_MAX_IN_FLIGHT = 16
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600000
RECEIVE_BYTES = 65536
#: Largest single read while assembling a big frame.
RECEIVE_MAX_BYTES = 4 * 1024 * 1024

Response = bytes | bytearray | memoryview | Sequence[ResponsePart] | Any | None
Handler = Callable[["ConnectionContext", DecodedRequest], Awaitable[Response]]

_log = logging.getLogger("raftka.wire.server")


class _Sequencer:
    """Grants turns in request order: turn n starts when 0..n-1 are released."""

    def __init__(self) -> None:
        self._next = 0
        self._released: set[int] = set()
        self._waiters: dict[int, trio.Event] = {}

    def is_released(self, seq: int) -> bool:
        return seq < self._next or seq in self._released

    async def wait_turn(self, seq: int) -> None:
        assert not self.is_released(seq), f"turn {seq} was already released"
        if seq != self._next:
            event = self._waiters[seq] = trio.Event()
            await event.wait()
        else:
            await trio.lowlevel.checkpoint()

    def release(self, seq: int) -> None:
        if self.is_released(seq):
            return
        self._released.add(seq)
        while self._next in self._released:
            self._released.remove(self._next)
            self._next += 1
        waiter = self._waiters.pop(self._next, None)
        if waiter is not None:
            waiter.set()


@dataclass(eq=False)
class ConnectionContext:
    """What a handler knows about the connection a request came on."""

    connection_id: int
    #: "host:port" of the client.
    peer: str
    #: From ApiVersions v3+ (KIP-511), once the client sent it.
    client_software_name: str | None = None
    client_software_version: str | None = None
    #: Free per-connection state for handlers (e.g. fetch sessions).
    attributes: dict[str, Any] = field(default_factory=dict)
    bytes_received: int = 0
    bytes_sent: int = 0
    _scope: trio.CancelScope | None = None
    _sequencer: _Sequencer = field(default_factory=_Sequencer)
    _sequence_of: dict[int, int] = field(default_factory=dict)
    _in_flight: int = 0
    _last_activity: float = 0.0

    def close(self) -> None:
        """Close this connection now; pending responses are dropped."""
        if self._scope is not None:
            self._scope.cancel()

    @asynccontextmanager
    async def in_order(self, request: DecodedRequest) -> AsyncIterator[None]:
        """Run the block only after every earlier request on this connection
        has finished its handler or left its own `in_order` block."""
        seq = self._sequence_of.get(id(request))
        if seq is None:
            raise LocalProtocolError("in_order() takes the request object the handler was given")
        if self._sequencer.is_released(seq):
            raise LocalProtocolError("in_order() can be entered once per request")
        await self._sequencer.wait_turn(seq)
        try:
            yield
        finally:
            self._sequencer.release(seq)


@dataclass(eq=False)
class ServerStats:
    connections_accepted: int = 0
    connections_closed_malformed: int = 0
    connections_closed_idle: int = 0
    handler_failures: int = 0
    requests: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    #: FileSlice bytes sent with os.sendfile / read with os.pread and sent.
    sendfile_bytes: int = 0
    pread_bytes: int = 0


@dataclass(eq=False)
class Server:
    """Given by `serve` to `task_status.started()`; cancel `serve`'s task to stop."""

    listeners: list[trio.SocketListener]
    host: str
    #: The bound port (useful with port=0).
    port: int
    connections: dict[int, ConnectionContext]
    stats: ServerStats


class _Slot:
    __slots__ = ("request", "done", "parts")

    def __init__(self, request: DecodedRequest) -> None:
        self.request = request
        self.done = False
        self.parts: list[ResponsePart] = []


class _Pipeline:
    """The requests of one connection in arrival order, until answered.

    The reader `add`s a slot per request (waiting while `max_in_flight`
    are there), handlers `complete` them in any order, and the writer takes
    `ready_batch`es: the run of completed slots at the head. Batches let one
    `send_all` carry many responses.
    """

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.slots: collections.deque[_Slot] = collections.deque()
        self.reading_done = False
        self._writer = trio.lowlevel.ParkingLot()
        self._reader = trio.lowlevel.ParkingLot()

    async def add(self, slot: _Slot) -> None:
        while len(self.slots) >= self.max_in_flight:
            await self._reader.park()
        self.slots.append(slot)
        if slot.done and self.slots[0] is slot:
            self._writer.unpark_all()

    def complete(self, slot: _Slot, parts: list[ResponsePart]) -> None:
        slot.parts = parts
        slot.done = True
        if self.slots and self.slots[0] is slot:
            self._writer.unpark_all()

    def finish_reading(self) -> None:
        self.reading_done = True
        self._writer.unpark_all()

    async def ready_batch(self) -> list[_Slot] | None:
        """The completed slots at the head (at least one); None once the
        reader is done and every slot was taken."""
        while not (self.slots and self.slots[0].done):
            if self.reading_done and not self.slots:
                return None
            await self._writer.park()
        batch = []
        while self.slots and self.slots[0].done:
            batch.append(self.slots.popleft())
        self._reader.unpark_all()
        return batch


async def serve(
    handler: Handler,
    host: str,
    port: int,
    *,
    apis: SupportedApis,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
    connections_max_idle_ms: int = DEFAULT_CONNECTIONS_MAX_IDLE_MS,
    file_transfer: FileTransfer = "auto",
    log: logging.Logger | None = None,
) -> None:
    """Serve the Kafka protocol on host:port until cancelled.

    Use as `server = await nursery.start(functools.partial(serve, handler,
    host, port, apis=apis))`. `request_max_bytes` is Kafka's
    `socket.request.max.bytes`; `connections_max_idle_ms` is
    `connections.max.idle.ms`; `file_transfer` is "auto", "sendfile" or
    "pread" (how FileSlice parts are sent).
    """
    if max_in_flight < 1:
        raise LocalProtocolError(f"max_in_flight must be at least 1, not {max_in_flight}")
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    server = Server(listeners, host, bound_port, {}, ServerStats())
    conn = _ConnectionServer(
        server, handler, apis, max_in_flight, request_max_bytes,
        connections_max_idle_ms / 1000, file_transfer, log or _log,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, conn.serve_connection, listeners)
        task_status.started(server)


class _ConnectionServer:
    def __init__(
        self,
        server: Server,
        handler: Handler,
        apis: SupportedApis,
        max_in_flight: int,
        request_max_bytes: int,
        idle_s: float,
        file_transfer: FileTransfer,
        log: logging.Logger,
    ) -> None:
        self.server = server
        self.handler = handler
        self.apis = apis
        self.max_in_flight = max_in_flight
        self.request_max_bytes = request_max_bytes
        self.idle_s = idle_s
        self.file_transfer = file_transfer
        self.log = log
        self._ids = itertools.count(1)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            peer_host, peer_port = stream.socket.getpeername()[:2]
            peer = f"{peer_host}:{peer_port}"
        except OSError:
            peer = "?"
        ctx = ConnectionContext(next(self._ids), peer)
        ctx._last_activity = trio.current_time()
        self.server.connections[ctx.connection_id] = ctx
        self.server.stats.connections_accepted += 1
        try:
            async with trio.open_nursery() as nursery:
                ctx._scope = nursery.cancel_scope
                pipeline = _Pipeline(self.max_in_flight)
                nursery.start_soon(self._write_loop, stream, ctx, pipeline)
                nursery.start_soon(self._idle_watchdog, ctx)
                await self._read_loop(stream, ctx, pipeline, nursery)
        except* Exception as group:
            # A bug in this module or a handler's response: still only this
            # connection goes down.
            self.log.error(
                "connection %d from %s failed; closing it", ctx.connection_id, ctx.peer,
                exc_info=group,
            )
        finally:
            del self.server.connections[ctx.connection_id]
            await trio.aclose_forcefully(stream)

    async def _read_loop(
        self,
        stream: trio.SocketStream,
        ctx: ConnectionContext,
        pipeline: _Pipeline,
        nursery: trio.Nursery,
    ) -> None:
        frames = FrameBuffer(self.request_max_bytes)
        sequence = itertools.count()
        try:
            while True:
                want = max(RECEIVE_BYTES, min(frames.bytes_wanted, RECEIVE_MAX_BYTES))
                try:
                    data = await stream.receive_some(want)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                ctx._last_activity = trio.current_time()
                ctx.bytes_received += len(data)
                self.server.stats.bytes_received += len(data)
                try:
                    for frame in frames.feed(data):
                        request = decode_request(frame, self.apis.supports)
                        await self._dispatch(ctx, request, next(sequence), pipeline, nursery)
                except ProtocolError as exc:
                    self.server.stats.connections_closed_malformed += 1
                    self.log.warning("closing connection %d from %s: %s", ctx.connection_id, ctx.peer, exc)
                    ctx.close()
                    return
        finally:
            pipeline.finish_reading()

    async def _dispatch(
        self,
        ctx: ConnectionContext,
        request: DecodedRequest,
        seq: int,
        pipeline: _Pipeline,
        nursery: trio.Nursery,
    ) -> None:
        self.server.stats.requests += 1
        slot = _Slot(request)
        if request.header.api_key == API_VERSIONS_KEY:
            if request.body is not None and request.header.api_version >= 3:
                ctx.client_software_name = request.body.client_software_name
                ctx.client_software_version = request.body.client_software_version
            slot.parts = [self.apis.api_versions_response(request)]
            slot.done = True
            ctx._sequencer.release(seq)
            await pipeline.add(slot)
            ctx._in_flight += 1
            return
        ctx._sequence_of[id(request)] = seq
        await pipeline.add(slot)
        ctx._in_flight += 1
        nursery.start_soon(self._run_handler, ctx, pipeline, slot, seq)

    async def _run_handler(self, ctx: ConnectionContext, pipeline: _Pipeline, slot: _Slot, seq: int) -> None:
        request = slot.request
        try:
            result = await self.handler(ctx, request)
            parts = _response_parts(request, result)
        except Exception:
            self.server.stats.handler_failures += 1
            self.log.exception(
                "handler failed on %s v%d (correlation id %d) from %s; closing the connection",
                api_name(request.header.api_key), request.header.api_version,
                request.header.correlation_id, ctx.peer,
            )
            ctx.close()
            return
        finally:
            ctx._sequence_of.pop(id(request), None)
            ctx._sequencer.release(seq)
        pipeline.complete(slot, parts)

    async def _write_loop(self, stream: trio.SocketStream, ctx: ConnectionContext, pipeline: _Pipeline) -> None:
        try:
            while (batch := await pipeline.ready_batch()) is not None:
                parts = [part for slot in batch for part in slot.parts]
                if parts:
                    report = await send_parts(stream, parts, self.file_transfer)
                    ctx.bytes_sent += report.total_bytes
                    stats = self.server.stats
                    stats.bytes_sent += report.total_bytes
                    stats.sendfile_bytes += report.sendfile_bytes
                    stats.pread_bytes += report.pread_bytes
                ctx._in_flight -= len(batch)
                ctx._last_activity = trio.current_time()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.log.info("connection %d to %s broke while sending: %s", ctx.connection_id, ctx.peer, exc)
        except (ProtocolError, OSError) as exc:
            self.log.warning("closing connection %d to %s: %s", ctx.connection_id, ctx.peer, exc)
        # The reader is done (EOF) and everything is sent, or sending failed:
        # either way the connection is over.
        ctx.close()

    async def _idle_watchdog(self, ctx: ConnectionContext) -> None:
        # connections.max.idle.ms: Kafka closes connections with no I/O for that
        # long. A request still being handled (a long poll) counts as activity.
        while True:
            now = trio.current_time()
            if ctx._in_flight > 0:
                ctx._last_activity = now
            deadline = ctx._last_activity + self.idle_s
            if now >= deadline:
                self.server.stats.connections_closed_idle += 1
                self.log.info(
                    "closing connection %d from %s: idle for connections.max.idle.ms=%d",
                    ctx.connection_id, ctx.peer, round(self.idle_s * 1000),
                )
                ctx.close()
                return
            await trio.sleep_until(deadline)


def _response_parts(request: DecodedRequest, result: Response) -> list[ResponsePart]:
    """The parts of one complete response frame, checked."""
    if result is None:
        return []
    if isinstance(result, (bytes, bytearray, memoryview)):
        parts: list[ResponsePart] = [result]
    elif isinstance(result, (list, tuple)):
        parts = list(result)
    elif hasattr(result, "__api_key__"):
        return [encode_response(request.header, result)]
    else:
        raise LocalProtocolError(
            f"a handler returned {type(result).__name__}; return a kio response, "
            "bytes, a list of parts, or None"
        )
    _check_frame(request, parts)
    return parts


def _check_frame(request: DecodedRequest, parts: list[ResponsePart]) -> None:
    first = parts[0] if parts else b""
    if isinstance(first, FileSlice) or part_length(first) < 4:
        raise LocalProtocolError(
            f"response to {api_name(request.header.api_key)} does not start with a size prefix"
        )
    (declared,) = SIZE_PREFIX.unpack_from(first, 0)
    actual = sum(part_length(p) for p in parts) - 4
    if declared != actual:
        raise LocalProtocolError(
            f"response to {api_name(request.header.api_key)} declares {declared} bytes "
            f"but its parts hold {actual}; build it with frame_parts()"
        )
