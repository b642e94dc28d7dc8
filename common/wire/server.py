"""The Kafka-protocol trio server shared by controllers and brokers.

Theory of operation
-------------------
One task per connection reads: it receives straight into the connection's
`ReceiveBuffer` (`recv_into` on the socket, waiting with
`trio.lowlevel.wait_readable` only when nothing is there), then decodes
every complete frame (`decode_request`) and hands each request, in
arrival order, a slot in the connection's `Pipeline` (`connection`).
ApiVersions is answered here from the server's `SupportedApis`; every
other request is given to `handler(ctx, request)`, called right there:

- a handler that can answer at once returns the response, and the slot is
  complete before the next frame is looked at (the hot path: an acks=1
  Produce or a Fetch with data costs no task and no scheduling);
- a handler that must wait returns an awaitable (e.g. it is an `async
  def`), which runs in a task of its own, so requests of one connection
  are handled concurrently.

Responses leave from the head of the pipeline, in request order however
the handlers finish (`transmit`: one `sendmsg` for the buffers,
`os.sendfile` for file slices). After each read the reader sends the
completed head itself, without waiting; what the socket does not take at
once, and responses completed later by handler tasks, go out from a
writer task that waits for writability. At most `max_in_flight` requests
of a connection are being handled or waiting to be sent: when the
pipeline is full the reader stops reading and TCP pushes back on the
client. Each read costs one trip through trio's scheduler, the largest
fixed cost of a request: the woken task runs its Python with caches gone
cold in the sleep, which costs more than decoding the request.

Kafka processes a connection's requests one at a time; a handler that
needs that guarantee (e.g. Produce, so appends keep the order of the
idempotent producer's sequence numbers) wraps its ordered part in `async
with ctx.in_order(request)`, or, answering at once, does it only if
`ctx.in_turn(request)` and then calls `ctx.end_turn(request)`.

What a handler returns (or its awaitable gives):
- a kio response entity: encoded here (`encode_response`);
- `bytes`, or a list of parts (buffers and `FileSlice`s) forming one
  complete frame, size prefix included (see `framing.frame_parts`);
- None: no response (Produce with acks=0).

Failure is per connection, never per process: a malformed frame (oversized
size prefix, unknown API or version, undecodable body) closes that
connection with one log line naming the peer; a handler exception is
logged with its traceback and closes the connection; a connection with no
traffic and nothing in flight for `connections.max.idle.ms` is closed.

Socket buffers follow Kafka's `socket.send.buffer.bytes` and
`socket.receive.buffer.bytes` (-1: the kernel's autotuning). trio limits
unsent bytes to 16 KiB (TCP_NOTSENT_LOWAT) for interactive latency; a
broker streams large responses, so that limit is lifted and a sendfile to
a slow reader fills the whole send buffer per wakeup instead of 16 KiB.
"""

from __future__ import annotations

import itertools
import logging
import socket
from time import perf_counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import CoroutineType

import trio

from common.security import ListenerSecurity
from common.security.sasl import ScramLookup
from common.security.tls import TlsSocket
from common.wire.apis import SupportedApis
from common.wire.authenticate import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY
from common.wire.codec import API_VERSIONS_KEY, DecodedRequest, api_name, decode_request
from common.wire.connection import ConnectionContext, Pipeline, Response, Slot, response_parts
from common.wire.errors import LocalProtocolError, ProtocolError
from common.wire.framing import DEFAULT_REQUEST_MAX_BYTES, ReceiveBuffer
from common.wire.listeners import bind_tcp, listen_on, tune_connection
from common.wire.secure_connection import SaslSession, secure_connection
from common.wire.transmit import FileTransfer, SendReport, send_now, send_parts

DEFAULT_MAX_IN_FLIGHT = 16
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600000
#: Kafka's `socket.send.buffer.bytes` / `socket.receive.buffer.bytes` are
#: 102400; -1 leaves the kernel's autotuning on (up to tcp_wmem/tcp_rmem's
#: maximum, 4 MiB / 32 MiB here), which serves large fetches and produce
#: requests with fewer wakeups than a fixed 100 KB.
DEFAULT_SEND_BUFFER_BYTES = -1
DEFAULT_RECEIVE_BUFFER_BYTES = -1

Handler = Callable[["ConnectionContext", DecodedRequest], Awaitable[Response] | Response]

_log = logging.getLogger("raftka.wire.server")


@dataclass(eq=False)
class ServerStats:
    connections_accepted: int = 0
    connections_closed_malformed: int = 0
    connections_closed_idle: int = 0
    #: New connections closed at once by `Server.admit` (a connection-rate quota).
    connections_refused: int = 0
    #: Closed at a request after their SASL session expired (KIP-368).
    connections_closed_expired: int = 0
    sasl_reauthentications: int = 0
    tls_handshake_failures: int = 0
    handler_failures: int = 0
    requests: int = 0
    #: Requests whose handler answered at once (no task of their own).
    requests_answered_at_once: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    #: FileSlice bytes sent with os.sendfile / read with os.pread and sent.
    sendfile_bytes: int = 0
    pread_bytes: int = 0


@dataclass(eq=False)
class Server:
    """Given by `serve` to `task_status.started()`; cancel `serve`'s task to stop."""

    #: Empty until the server listens (see `open`).
    listeners: list[trio.SocketListener]
    host: str
    #: The bound port (useful with port=0).
    port: int
    connections: dict[int, ConnectionContext]
    stats: ServerStats
    _open: Callable[[], None] = field(default=lambda: None, repr=False)
    #: Asked with each new connection's peer address: None lets it in, a
    #: reason closes it at once (a connection-rate quota).
    admit: Callable[[str], str | None] | None = None

    def open(self) -> None:
        """Start listening, for a server started with `serve(..., listen=False)`
        (a no-op if it listens already). A connect succeeds from the moment
        this returns: the kernel queues connections until they are accepted."""
        self._open()


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
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER_BYTES,
    receive_buffer_bytes: int = DEFAULT_RECEIVE_BUFFER_BYTES,
    file_transfer: FileTransfer = "auto",
    log: logging.Logger | None = None,
    listen: bool = True,
    listener_name: str = "",
    security: ListenerSecurity | None = None,
    scram_lookup: ScramLookup | None = None,
) -> None:
    """Serve the Kafka protocol on host:port until cancelled.

    Use as `server = await nursery.start(functools.partial(serve, handler,
    host, port, apis=apis))`. `request_max_bytes` is Kafka's
    `socket.request.max.bytes`; `connections_max_idle_ms` is
    `connections.max.idle.ms`; `send_buffer_bytes` and
    `receive_buffer_bytes` are `socket.send.buffer.bytes` and
    `socket.receive.buffer.bytes` (-1: the kernel's default);
    `file_transfer` is "auto", "sendfile" or "pread" (how FileSlice parts
    are sent); `listener_name` is given to handlers as `ctx.listener_name`.
    `security` says what a connection goes through first (TLS handshake,
    SASL exchange; `scram_lookup` finds SCRAM credentials); handlers see
    the result as `ctx.principal`. With `listen=False` the port is only bound (its number
    known, a connect refused) until `Server.open()`: a broker listens only
    once it can serve, as Kafka opens its client listeners.
    """
    if max_in_flight < 1:
        raise LocalProtocolError(f"max_in_flight must be at least 1, not {max_in_flight}")
    sockets = await bind_tcp(port, host)
    try:
        server = Server([], host, sockets[0].getsockname()[1], {}, ServerStats())
        conn = _ConnectionServer(
            server, handler, apis, max_in_flight, request_max_bytes,
            connections_max_idle_ms / 1000, send_buffer_bytes, receive_buffer_bytes, file_transfer, log or _log,
            listener_name, security or ListenerSecurity(), scram_lookup,
        )
        async with trio.open_nursery() as nursery:
            def open_listeners() -> None:
                if not server.listeners:
                    server.listeners = listen_on(sockets)
                    nursery.start_soon(trio.serve_listeners, conn.serve_connection, server.listeners)

            server._open = open_listeners
            if listen:
                open_listeners()
            task_status.started(server)
            await trio.sleep_forever()
    finally:
        # serve_listeners closes the listeners it served; these are the
        # sockets of a server stopped before it listened.
        for sock in sockets:
            sock.close()


class _ConnectionServer:
    def __init__(
        self,
        server: Server,
        handler: Handler,
        apis: SupportedApis,
        max_in_flight: int,
        request_max_bytes: int,
        idle_s: float,
        send_buffer_bytes: int,
        receive_buffer_bytes: int,
        file_transfer: FileTransfer,
        log: logging.Logger,
        listener_name: str,
        security: ListenerSecurity,
        scram_lookup: ScramLookup | None,
    ) -> None:
        self.server = server
        self.listener_name = listener_name
        self.security = security
        self.scram_lookup = scram_lookup
        self.handler = handler
        self.apis = apis
        self.max_in_flight = max_in_flight
        self.request_max_bytes = request_max_bytes
        self.idle_s = idle_s
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self.file_transfer = file_transfer
        self.log = log
        self._ids = itertools.count(1)
        #: `handler.observe_send(api_key, seconds)`, when the handler has one
        #: (a broker serving metrics): called with each response's send time,
        #: from complete to written (Kafka's ResponseSendTimeMs).
        self.observe_send = getattr(handler, "observe_send", None)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            peer_host, peer_port = stream.socket.getpeername()[:2]
            peer = f"{peer_host}:{peer_port}"
        except OSError:
            peer_host, peer = "?", "?"
        admit = self.server.admit
        if admit is not None:
            refused = admit(peer_host)
            if refused is not None:
                self.server.stats.connections_refused += 1
                self.log.info("closing new connection from %s: %s", peer, refused)
                await stream.aclose()
                return
        ctx = ConnectionContext(next(self._ids), peer, self.listener_name)
        ctx._last_activity = trio.current_time()
        self.server.connections[ctx.connection_id] = ctx
        self.server.stats.connections_accepted += 1
        # The connection's socket as a plain non-blocking socket object on
        # trio's file descriptor: reads and writes call the kernel directly
        # and wait through trio only when they would block. trio keeps
        # owning the descriptor (it closes it); ours is detached.
        sock = socket.socket(fileno=stream.socket.fileno())
        try:
            sock.setblocking(False)
            tune_connection(sock, self.send_buffer_bytes, self.receive_buffer_bytes)
            # TLS handshake and SASL gate, as the listener's security asks (none: PLAINTEXT).
            secured = await secure_connection(sock, ctx, self.security, self.scram_lookup, self.file_transfer,
                                              self.idle_s, self.server.stats, self.log)
            if secured is None:
                return
            conn_sock, file_transfer, sasl = secured
            async with trio.open_nursery() as nursery:
                ctx._scope = nursery.cancel_scope
                connection = _Connection(self, ctx, conn_sock, nursery, file_transfer, sasl)
                nursery.start_soon(connection.write_loop)
                nursery.start_soon(self._idle_watchdog, ctx)
                await connection.read_loop()
        except* Exception as group:
            # A bug in this module or a handler's response: still only this
            # connection goes down.
            self.log.error(
                "connection %d from %s failed; closing it", ctx.connection_id, ctx.peer,
                exc_info=group,
            )
        finally:
            sock.detach()
            del self.server.connections[ctx.connection_id]
            await trio.aclose_forcefully(stream)

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


class _Connection:
    """One connection's reader, writer and request dispatch."""

    def __init__(
        self, owner: _ConnectionServer, ctx: ConnectionContext, sock: socket.socket | TlsSocket,
        nursery: trio.Nursery, file_transfer: FileTransfer, sasl: SaslSession | None,
    ) -> None:
        self.owner = owner
        self.ctx = ctx
        self.sock = sock
        self.file_transfer = file_transfer
        #: A SASL listener's authentication of the connection; None: no SASL.
        self.sasl = sasl
        self.nursery = nursery
        self.stats = owner.server.stats
        self.log = owner.log
        self.pipeline = Pipeline(owner.max_in_flight)
        self._next_seq = 0
        self.observe_send = owner.observe_send
        #: On a SASL listener SaslHandshake may start a re-authentication
        #: and SaslAuthenticate is the gate's: neither goes to the handler.
        self.slow_keys = frozenset((API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY)
                                   if sasl is not None else (API_VERSIONS_KEY,))

    async def read_loop(self) -> None:
        ctx, stats, sock = self.ctx, self.stats, self.sock
        scope = self.nursery.cancel_scope
        frames = ReceiveBuffer(self.owner.request_max_bytes)
        supports = self.owner.apis.supports
        recv_into = sock.recv_into
        wait_readable = trio.lowlevel.wait_readable
        # The run's clock, asked directly: trio.current_time() is three calls.
        current_time = trio.lowlevel.current_clock().current_time
        pipeline = self.pipeline
        dispatch_now = self._dispatch_now
        slow_keys = self.slow_keys
        sasl = self.sasl
        # Whether this task let others run since it last handled frames: a
        # peer that keeps the socket full must not starve the writer.
        yielded = True
        try:
            while True:
                view = frames.receive_view()
                try:
                    nbytes = recv_into(view)
                except BlockingIOError:
                    view = None
                    await wait_readable(sock)
                    yielded = True
                    continue
                except OSError:  # reset by the peer, closed under us
                    return
                if not nbytes:
                    return
                # A short read emptied the kernel's queue: next time wait for
                # bytes rather than ask for them and be told to wait.
                drained = nbytes < len(view)
                # No view of the chunk may outlive its request here, or the
                # receive buffer could not start the chunk over.
                view = None
                if not yielded:
                    await trio.lowlevel.checkpoint()
                now = ctx._last_activity = ctx._read_at = current_time()
                # An expired SASL session sends its requests the slow way, which closes the connection.
                expired = sasl is not None and sasl.expired(now)
                ctx.bytes_received += nbytes
                stats.bytes_received += nbytes
                try:
                    for frame in frames.received(nbytes):
                        if scope.cancel_called:
                            # A handler closed the connection: the requests
                            # after it are not handled (nor their appends done).
                            return
                        if ctx.muted_until:
                            # Throttled by a quota: the requests after it wait out the mute.
                            await ctx.wait_unmuted()
                        gate = sasl.gate if sasl is not None else None
                        if gate is not None and gate.raw:
                            # After SaslHandshake v0: a raw SASL token, not a request.
                            if not await self._raw_token(bytes(frame)):
                                return
                            continue
                        if ctx.metered:
                            started = perf_counter()
                            request = decode_request(frame, supports)
                            ctx.network_s += perf_counter() - started
                        else:
                            request = decode_request(frame, supports)
                        if (len(pipeline.slots) < pipeline.max_in_flight
                                and request.header.api_key not in slow_keys and gate is None and not expired):
                            # The common case, without a coroutine per request.
                            dispatch_now(request)
                        else:
                            await self._dispatch(request)
                        request = None
                except ProtocolError as exc:
                    stats.connections_closed_malformed += 1
                    self.log.warning("closing connection %d from %s: %s", ctx.connection_id, ctx.peer, exc)
                    ctx.close()
                    return
                frame = None
                if pipeline.can_send_now():
                    self._send_at_once()
                if drained:
                    await wait_readable(sock)
                    yielded = True
                else:
                    yielded = False
        finally:
            self.pipeline.finish_reading()

    async def _dispatch(self, request: DecodedRequest) -> None:
        ctx, pipeline = self.ctx, self.pipeline
        key = request.header.api_key
        if key == API_VERSIONS_KEY and request.body is not None and request.header.api_version >= 3:
            ctx.client_software_name = request.body.client_software_name
            ctx.client_software_version = request.body.client_software_version
        if not pipeline.has_room():
            await pipeline.wait_for_room()
        if key == API_VERSIONS_KEY:
            self._answer_at_once(request, self.owner.apis.api_versions_response(request))
            return
        sasl = self.sasl
        if sasl is not None:
            if sasl.closes(request):
                ctx.close()
                return
            answer = sasl.answer(request)
            if answer is not None:
                self._answer_at_once(request, answer)
                return
        self._dispatch_now(request)

    def _answer_at_once(self, request: DecodedRequest | None, response: bytes) -> None:
        """Queue an answer made here (not by the handler); the caller made
        sure the pipeline has room."""
        self.stats.requests += 1
        seq = self._next_seq
        self._next_seq = seq + 1
        slot = Slot(request)
        slot.parts = [response]
        slot.done = True
        self.ctx._sequencer.release(seq)
        self.pipeline.add(slot)
        self.ctx._in_flight += 1

    async def _raw_token(self, token: bytes) -> bool:
        """Answer a raw SASL token (after SaslHandshake v0); False: the
        exchange failed and the connection closes."""
        assert self.sasl is not None
        if not self.pipeline.has_room():
            await self.pipeline.wait_for_room()
        reply = self.sasl.raw_token(token)
        if reply is None:
            self.ctx.close()
            return False
        self._answer_at_once(None, reply)
        return True

    def _dispatch_now(self, request: DecodedRequest) -> None:
        """Hand a request other than ApiVersions, with room in the pipeline,
        to the handler: complete its slot now if the handler answered at
        once, else start a task that awaits the answer. The reader calls it
        directly when there is room (no coroutine per request)."""
        ctx, pipeline = self.ctx, self.pipeline
        self.stats.requests += 1
        seq = self._next_seq
        self._next_seq = seq + 1
        slot = Slot(request)
        pipeline.add(slot)
        ctx._in_flight += 1
        ctx._sequence_of[id(request)] = seq
        try:
            result = self.owner.handler(ctx, request)
            if type(result) is CoroutineType or (
                result is not None and not isinstance(result, (bytes, list)) and hasattr(result, "__await__")
            ):
                self.nursery.start_soon(self._await_handler, slot, seq, result)
                return
            parts = response_parts(request, result)
        except Exception:
            ctx._sequence_of.pop(id(request), None)
            ctx._sequencer.release(seq)
            self._handler_failed(request)
            return
        ctx._sequence_of.pop(id(request), None)
        ctx._sequencer.release(seq)
        self.stats.requests_answered_at_once += 1
        if self.observe_send is not None:
            slot.api_key, slot.ready = request.header.api_key, perf_counter()
        pipeline.complete(slot, parts, wake_writer=False)

    async def _await_handler(self, slot: Slot, seq: int, awaitable: Awaitable[Response]) -> None:
        ctx = self.ctx
        request = slot.request
        try:
            parts = response_parts(request, await awaitable)
        except Exception:
            self._handler_failed(request)
            return
        finally:
            ctx._sequence_of.pop(id(request), None)
            ctx._sequencer.release(seq)
        if self.observe_send is not None:
            slot.api_key, slot.ready = request.header.api_key, perf_counter()
        self.pipeline.complete(slot, parts)

    def _handler_failed(self, request: DecodedRequest) -> None:
        self.stats.handler_failures += 1
        self.log.exception(
            "handler failed on %s v%d (correlation id %d) from %s; closing the connection",
            api_name(request.header.api_key), request.header.api_version,
            request.header.correlation_id, self.ctx.peer,
        )
        self.ctx.close()

    def _send_at_once(self) -> None:
        """Send the completed responses at the head from the reader: no
        writer wakeup and no extra trip through the scheduler when the
        socket takes them all, the usual case."""
        pipeline = self.pipeline
        batch = pipeline.take_ready()
        parts = [part for slot in batch for part in slot.parts]
        started = perf_counter() if self.ctx.metered else 0.0
        try:
            report, rest = send_now(self.sock, parts, self.file_transfer)
        except (ProtocolError, OSError) as exc:
            self._send_failed(exc)
            return
        if started:
            self.ctx.network_s += perf_counter() - started
        # No activity stamp: the reader made one at the read just before.
        self._count_sent(report, stamp=False)
        if rest:
            pipeline.hand_over(rest, batch)
        else:
            self.ctx._in_flight -= len(batch)
            if self.observe_send is not None:
                self._observe_sent(batch)

    def _observe_sent(self, slots: list[Slot]) -> None:
        now = perf_counter()
        observe = self.observe_send
        for slot in slots:
            if slot.ready:
                observe(slot.api_key, now - slot.ready)

    def _count_sent(self, report: SendReport, *, stamp: bool = True) -> None:
        ctx, stats = self.ctx, self.stats
        ctx.bytes_sent += report.total_bytes
        stats.bytes_sent += report.total_bytes
        stats.sendfile_bytes += report.sendfile_bytes
        stats.pread_bytes += report.pread_bytes
        if stamp:
            ctx._last_activity = trio.current_time()

    def _send_failed(self, exc: BaseException) -> None:
        ctx = self.ctx
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)):
            self.log.info("connection %d to %s broke while sending: %s", ctx.connection_id, ctx.peer, exc)
        else:
            self.log.warning("closing connection %d to %s: %s", ctx.connection_id, ctx.peer, exc)
        ctx.close()

    async def write_loop(self) -> None:
        pipeline = self.pipeline
        try:
            while (batch := await pipeline.next_batch()) is not None:
                parts, slots = batch
                pipeline.writer_sending = True
                try:
                    report = await send_parts(self.sock, parts, self.file_transfer)
                finally:
                    pipeline.writer_sending = False
                self._count_sent(report)
                self.ctx._in_flight -= len(slots)
                if self.observe_send is not None:
                    self._observe_sent(slots)
        except (ProtocolError, OSError) as exc:
            self._send_failed(exc)
        # The reader is done (EOF) and everything is sent, or sending failed:
        # either way the connection is over.
        self.ctx.close()

