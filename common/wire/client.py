"""A pipelining Kafka-protocol client connection on trio.

Theory of operation
-------------------
Raft voters send Vote/BeginQuorumEpoch/Fetch to each other and brokers
talk to the active controller through `KafkaConnection`s. Any number of
tasks may call `request()` on one connection at once: each request gets the
next correlation id and is written whole under a send lock, and a reader
task (living in the nursery given to `connect`) matches responses to
requests. Kafka servers answer a connection's requests in order, so the
reader only checks that each response's correlation id is the oldest one
outstanding; anything else is a RemoteProtocolError that breaks the
connection.

Failures surface as `ConnectionFailedError` (or its `RequestTimeoutError`),
which callers retry, on a new connection. A request whose caller is
cancelled after sending stays outstanding and its response is dropped when
it arrives; a request cancelled while being written, or one that times out,
closes the connection (as Kafka's NetworkClient does), because the byte
stream can no longer be trusted.

Produce with acks=0 gets no response: `request()` returns None once it is
sent.
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from common.security.client import ClientSecurity, ScramClient

from common.wire.codec import (
    API_VERSIONS_KEY,
    PRODUCE_KEY,
    ApiCodec,
    ResponseReader,
    api_codec,
    api_codec_read_by,
    api_name,
    decode_response,
    encode_request,
)
from common.wire.errors import (
    ConnectionFailedError,
    RemoteProtocolError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from common.wire.framing import DEFAULT_REQUEST_MAX_BYTES, FrameBuffer, ReceiveBuffer

DEFAULT_REQUEST_TIMEOUT_MS = 30000
DEFAULT_CONNECT_TIMEOUT_MS = 10000
#: The newest ApiVersions version this client asks with (kio knows v0..v4).
API_VERSIONS_MAX = 4
CLIENT_SOFTWARE_NAME = "raftka"

_log = logging.getLogger("raftka.wire.client")
_ERROR_CODE = struct.Struct(">h")


@dataclass(eq=False)
class _Pending:
    correlation_id: int
    codec: ApiCodec
    done: trio.Event = field(default_factory=trio.Event)
    response: Any = None
    error: BaseException | None = None


class KafkaConnection:
    """One connection to a Kafka-protocol server. Create with `connect` or
    `open_connection`."""

    def __init__(
        self,
        stream: trio.SocketStream | trio.SSLStream,
        host: str,
        port: int,
        *,
        client_id: str | None,
        response_max_bytes: int,
        log: logging.Logger,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        #: api_key -> (min_version, max_version), after `api_versions()`.
        self.api_versions_supported: dict[int, tuple[int, int]] | None = None
        self._stream = stream
        self._frames = ReceiveBuffer(response_max_bytes)
        self._send_lock = trio.Lock()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._next_correlation_id = 0
        self._closed_because: ConnectionFailedError | None = None
        self._reader_scope = trio.CancelScope()
        self._log = log
        #: When to stop sending on this connection (trio time; None: never): a
        #: little before the server's SASL session ends (KIP-368), so that a
        #: pool replaces it rather than have the server close it at a request.
        self.renew_at: float | None = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<KafkaConnection {self.host}:{self.port} {state}>"

    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (including abandoned ones)."""
        return len(self._pending)

    async def request(self, request: Any, *, timeout_ms: int | None = DEFAULT_REQUEST_TIMEOUT_MS,
                      read: ResponseReader | None = None) -> Any:
        """Send the kio request entity `request`; return the kio response
        (or what `read`, a hand reader of this API version's answer, makes
        of it: `codec.api_codec_read_by`).

        The entity's class fixes the API version (e.g.
        `kio.schema.vote.v0.VoteRequest`); `pick_version` chooses one from
        the server's ApiVersions. Raises ConnectionFailedError or
        RequestTimeoutError; the caller decides whether to retry.
        """
        if read is None:
            codec = api_codec(request.__api_key__, request.__version__)
        else:
            codec = api_codec_read_by(request.__api_key__, request.__version__, read)
        expects_response = not (codec.api_key == PRODUCE_KEY and request.acks == 0)
        pending = await self._send(request, codec, expects_response)
        if pending is None:
            return None
        with trio.move_on_after(timeout_ms / 1000 if timeout_ms is not None else float("inf")) as scope:
            await pending.done.wait()
        if scope.cancelled_caught:
            error = RequestTimeoutError(
                f"no response to {api_name(codec.api_key)} v{codec.api_version} from "
                f"{self.host}:{self.port} within {timeout_ms} ms; the connection is closed"
            )
            self._fail(error)
            raise error
        if pending.error is not None:
            raise pending.error
        return pending.response

    async def _send(self, request: Any, codec: ApiCodec, expects_response: bool) -> _Pending | None:
        async with self._send_lock:
            self._raise_if_closed()
            correlation_id = self._next_correlation_id
            self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
            frame = encode_request(correlation_id, self.client_id, request)
            pending = _Pending(correlation_id, codec) if expects_response else None
            if pending is not None:
                self._pending.append(pending)
            try:
                await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                error = ConnectionFailedError(f"sending to {self.host}:{self.port} failed: {exc}")
                self._fail(error)
                raise error from None
            except BaseException:
                # Cancelled mid-write: part of the frame may be on the wire.
                self._fail(ConnectionFailedError(
                    f"a request to {self.host}:{self.port} was cancelled while being "
                    "written; the connection is closed"
                ))
                raise
        return pending

    def _raise_if_closed(self) -> None:
        if self._closed_because is not None:
            raise ConnectionFailedError(
                f"connection to {self.host}:{self.port} is closed: {self._closed_because}"
            )

    async def api_versions(self, *, timeout_ms: int | None = DEFAULT_REQUEST_TIMEOUT_MS) -> dict[int, tuple[int, int]]:
        """Ask the server which API versions it serves (KIP-511 fallback
        included); the answer is also kept in `api_versions_supported`."""
        version = API_VERSIONS_MAX
        for _attempt in range(3):
            codec = api_codec(API_VERSIONS_KEY, version)
            if version >= 3:
                request = codec.request_type(
                    client_software_name=CLIENT_SOFTWARE_NAME,
                    client_software_version=_software_version(),
                )
            else:
                request = codec.request_type()
            response = await self.request(request, timeout_ms=timeout_ms)
            if response.error_code == ErrorCode.unsupported_version:
                listed = {k.api_key: k.max_version for k in response.api_keys}
                version = min(version - 1, listed.get(API_VERSIONS_KEY, 0))
                continue
            if response.error_code != ErrorCode.none:
                raise UnsupportedVersionError(
                    f"ApiVersions v{version} to {self.host}:{self.port} failed with "
                    f"{response.error_code.name}"
                )
            self.api_versions_supported = {
                k.api_key: (k.min_version, k.max_version) for k in response.api_keys
            }
            return self.api_versions_supported
        raise UnsupportedVersionError(f"{self.host}:{self.port} answers no ApiVersions version we speak")

    def pick_version(self, api_key: int, min_version: int, max_version: int) -> int:
        """The highest version in min_version..max_version the server serves."""
        if self.api_versions_supported is None:
            raise UnsupportedVersionError(
                f"call api_versions() before pick_version() on {self.host}:{self.port}"
            )
        theirs = self.api_versions_supported.get(api_key)
        if theirs is None or theirs[1] < min_version or theirs[0] > max_version:
            raise UnsupportedVersionError(
                f"{self.host}:{self.port} serves {api_name(api_key)} versions "
                f"{theirs or 'none'}; we speak {min_version}..{max_version}"
            )
        return min(max_version, theirs[1])

    async def aclose(self) -> None:
        self._fail(ConnectionFailedError("closed by this side"))
        await trio.lowlevel.checkpoint()

    def _fail(self, error: ConnectionFailedError) -> None:
        """Close the connection and fail every outstanding request with `error`."""
        if self._closed_because is None:
            self._closed_because = error
        self._reader_scope.cancel()
        while self._pending:
            pending = self._pending.popleft()
            pending.error = error
            pending.done.set()

    async def _read_loop(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        error: ConnectionFailedError
        with self._reader_scope:
            task_status.started()
            try:
                # Received straight into the buffer's chunk, and each frame
                # a view of it: a Fetch answer's records reach the log with
                # no copy in between (fetch_response.py).
                frames = self._frames
                stream = self._stream
                if isinstance(stream, trio.SSLStream):
                    async def recv_into(view: memoryview) -> int:
                        # Decrypted bytes come as a new object: one copy.
                        data = await stream.receive_some(len(view))
                        view[:len(data)] = data
                        return len(data)
                else:
                    recv_into = stream.socket.recv_into
                while True:
                    view = frames.receive_view()
                    nbytes = await recv_into(view)
                    view = None  # must not pin the chunk (ReceiveBuffer)
                    if not nbytes:
                        raise ConnectionFailedError(f"{self.host}:{self.port} closed the connection")
                    for frame in frames.received(nbytes):
                        self._deliver(frame)
                    frame = None
            except ConnectionFailedError as exc:
                error = exc
            except RemoteProtocolError as exc:
                self._log.warning("closing connection to %s:%d: %s", self.host, self.port, exc)
                error = ConnectionFailedError(f"{self.host}:{self.port} sent garbage: {exc}")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                error = ConnectionFailedError(f"connection to {self.host}:{self.port} broke: {exc}")
            except Exception as exc:
                # A bug here must not take down the nursery's owner (a Raft
                # driver, a broker): fail this connection only.
                self._log.exception("reader of connection to %s:%d failed", self.host, self.port)
                error = ConnectionFailedError(f"reader of {self.host}:{self.port} failed: {exc!r}")
            self._fail(error)
        self._fail(ConnectionFailedError("closed by this side"))
        await trio.aclose_forcefully(self._stream)

    def _deliver(self, frame: memoryview) -> None:
        if not self._pending:
            raise RemoteProtocolError(f"{frame.nbytes}-byte response to no outstanding request")
        pending = self._pending.popleft()
        codec = pending.codec
        if codec.api_key == API_VERSIONS_KEY and codec.api_version > 0 and frame.nbytes >= 6:
            # KIP-511: a server that does not know our ApiVersions version
            # answers in v0 with UNSUPPORTED_VERSION.
            (error_code,) = _ERROR_CODE.unpack_from(frame, 4)
            if error_code == ErrorCode.unsupported_version:
                codec = api_codec(API_VERSIONS_KEY, 0)
        pending.response = decode_response(frame, codec, pending.correlation_id)
        pending.done.set()


def _software_version() -> str:
    from common import __version__

    return __version__


async def _open_stream(host: str, port: int, connect_timeout_ms: int) -> trio.SocketStream:
    try:
        with trio.fail_after(connect_timeout_ms / 1000):
            return await trio.open_tcp_stream(host, port)
    except trio.TooSlowError:
        raise ConnectionFailedError(
            f"cannot connect to {host}:{port}: no answer within {connect_timeout_ms} ms; "
            "is the node up and the address right?"
        ) from None
    except OSError as exc:  # refused, unreachable: at once, not after the timeout
        raise ConnectionFailedError(
            f"cannot connect to {host}:{port}: {_why(exc)}; is the node up and the address right?"
        ) from None


def _why(exc: OSError) -> str:
    """The reasons each attempt failed (trio's "all attempts ... failed" keeps them as its cause)."""
    attempts = exc.__cause__.exceptions if isinstance(exc.__cause__, BaseExceptionGroup) else ()
    reasons = sorted({(getattr(e, "strerror", None) or str(e)) for e in attempts})
    return "; ".join(reasons) if reasons else str(exc)


async def connect(
    nursery: trio.Nursery,
    host: str,
    port: int,
    *,
    client_id: str | None = "raftka",
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
    response_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
    log: logging.Logger | None = None,
    security: ClientSecurity | None = None,
) -> KafkaConnection:
    """Open a connection whose reader task runs in `nursery`; with
    `security`, over TLS and/or logged in with SASL.

    Raises ConnectionFailedError if host:port cannot be reached in time, or
    the TLS handshake or SASL login fails. The reader task never raises, so
    it cannot take the nursery down.
    """
    stream: trio.SocketStream | trio.SSLStream = await _open_stream(host, port, connect_timeout_ms)
    if security is not None and security.tls is not None:
        stream = trio.SSLStream(stream, security.tls, server_hostname=host)
        try:
            with trio.fail_after(connect_timeout_ms / 1000):
                await stream.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
            await trio.aclose_forcefully(stream)
            cause = exc.__cause__ or exc
            raise ConnectionFailedError(f"TLS handshake with {host}:{port} failed: {cause}") from None
    conn = KafkaConnection(
        stream, host, port, client_id=client_id,
        response_max_bytes=response_max_bytes, log=log or _log,
    )
    await nursery.start(conn._read_loop)
    if security is not None and security.mechanism:
        try:
            lifetime_ms = await _sasl_login(conn, security, connect_timeout_ms)
            if lifetime_ms > 0:
                conn.renew_at = trio.current_time() + RENEW_AT_FRACTION * lifetime_ms / 1000
        except BaseException:
            await conn.aclose()
            raise
    return conn


async def _sasl_login(conn: KafkaConnection, security: ClientSecurity, timeout_ms: int) -> int:
    """SaslHandshake v1 and SaslAuthenticate (KIP-152) with PLAIN or SCRAM;
    the session's lifetime in ms (KIP-368; 0: it does not expire)."""
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    where = f"{conn.host}:{conn.port}"
    mechanism = security.mechanism
    assert mechanism is not None
    handshake = await conn.request(SaslHandshakeRequest(mechanism=mechanism), timeout_ms=timeout_ms)
    if handshake.error_code != ErrorCode.none:
        raise ConnectionFailedError(f"SASL handshake with {where}: {handshake.error_code.name}; it offers "
                                    f"{', '.join(handshake.mechanisms) or 'no mechanism'}, not {mechanism}")

    lifetime_ms = 0

    async def step(token: bytes) -> bytes:
        nonlocal lifetime_ms
        answer = await conn.request(SaslAuthenticateRequest(auth_bytes=token), timeout_ms=timeout_ms)
        if answer.error_code != ErrorCode.none:
            raise ConnectionFailedError(f"SASL {mechanism} login as {security.username} at {where} failed: "
                                        f"{answer.error_message or answer.error_code.name}")
        lifetime_ms = round(answer.session_lifetime.total_seconds() * 1000)
        return bytes(answer.auth_bytes)

    try:
        if mechanism == "PLAIN":
            await step(f"\0{security.username}\0{security.password}".encode())
            return lifetime_ms
        client = ScramClient(mechanism, security.username, security.password)
        server_first = await step(client.first())
        client.check(await step(client.final(server_first)))
        return lifetime_ms
    except ConnectionError as exc:
        raise ConnectionFailedError(f"SASL {mechanism} login at {where} failed: {exc}") from None


async def secure_stream(stream: trio.SocketStream, host: str, port: int, security: ClientSecurity,
                        timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS) -> trio.abc.Stream:
    """`stream` wrapped in TLS and logged in with SASL as `security` says,
    for links that speak their own frames rather than through a
    `KafkaConnection` (the ZooKeeper-mode controller's requests to brokers).
    Raises ConnectionFailedError saying why the handshake or login failed;
    the caller closes `stream` then."""
    secured: trio.abc.Stream = stream
    if security.tls is not None:
        secured = trio.SSLStream(stream, security.tls, server_hostname=host)
        try:
            with trio.fail_after(timeout_ms / 1000):
                await secured.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
            cause = exc.__cause__ or exc
            raise ConnectionFailedError(f"TLS handshake with {host}:{port} failed: {cause}") from None
    if security.mechanism:
        try:
            await _sasl_login(_BareLogin(secured, host, port), security, timeout_ms)  # type: ignore[arg-type]
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError) as exc:
            raise ConnectionFailedError(f"SASL login at {host}:{port} failed: {exc}") from None
    return secured


class _BareLogin:
    """What `_sasl_login` needs of a connection, over a bare stream: one
    request at a time, its answer read before the next is sent."""

    def __init__(self, stream: trio.abc.Stream, host: str, port: int) -> None:
        self.stream = stream
        self.host = host
        self.port = port
        self._frames = FrameBuffer()
        self._correlation_id = 0

    async def request(self, body: Any, *, timeout_ms: int) -> Any:
        self._correlation_id += 1
        codec = api_codec(body.__api_key__, body.__version__)
        try:
            with trio.fail_after(timeout_ms / 1000):
                await self.stream.send_all(encode_request(self._correlation_id, CLIENT_SOFTWARE_NAME, body))
                while True:
                    data = await self.stream.receive_some(65536)
                    if not data:
                        raise ConnectionFailedError(f"{self.host}:{self.port} closed the connection during "
                                                    f"{api_name(codec.api_key)}")
                    done = self._frames.feed(data)
                    if done:
                        return decode_response(done[0], codec, self._correlation_id)
        except trio.TooSlowError:
            raise ConnectionFailedError(f"{self.host}:{self.port} did not answer {api_name(codec.api_key)} "
                                        f"within {timeout_ms} ms") from None


#: Renew a SASL connection at this fraction of its session's lifetime (librdkafka: 90%).
RENEW_AT_FRACTION = 0.85


def sole_exception(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside `group` (nested or not), else `group` itself.

    Our context managers run background tasks that never raise, so a group
    coming out of their nursery holds just the caller's own exception; it is
    re-raised bare so that `except ConnectionFailedError` works around
    `async with`.
    """
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


@asynccontextmanager
async def open_connection(host: str, port: int, **kwargs: Any) -> AsyncIterator[KafkaConnection]:
    """`async with open_connection(host, port) as conn:`; arguments as `connect`."""
    try:
        async with trio.open_nursery() as nursery:
            conn = await connect(nursery, host, port, **kwargs)
            try:
                yield conn
            finally:
                await conn.aclose()
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None
