"""Delivering the controller's requests to brokers (Kafka's `ControllerChannelManager`).

Theory of operation
-------------------
The controller never waits for a broker: `send` appends the request to that
broker's queue and returns. One task per live broker (Kafka's
`RequestSendThread`) sends its queue in order, one request at a time,
waiting for each response, as ordinary Kafka frames
(`messages.encode_request`), to the broker's control-plane endpoint. With
`security` (the inter-broker listener's protocol: SSL, SASL_PLAINTEXT or
SASL_SSL) each connection is wrapped in TLS and logged in with SASL first,
as the brokers' replica fetchers are; a refused login is logged once, with
the broker's reason, and retried with backoff like any failed connection. A failed connection is
re-opened with backoff and the unanswered request resent, until it is
answered or the broker leaves the live set, which drops its queue: a
broker that comes back gets a full LeaderAndIsr and UpdateMetadata anyway.

The queues are unbounded, as Kafka's are: the controller produces a
bounded number of requests per event (one of each kind per broker), and
cannot stall its event loop behind one slow broker.

`LocalBrokerSender` delivers in process to objects with a `handle(request)`
(e.g. `broker_metadata.ZkMetadataCache`), for tests and single-process runs.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from quorum.zookeeper import messages as m
from quorum.zookeeper.znodes import BrokerInfo
from common.security.client import ClientSecurity
from common.wire.client import secure_stream
from common.wire.errors import ConnectionFailedError, RemoteProtocolError
from common.wire.framing import FrameBuffer

_log = logging.getLogger("quorum.zookeeper.channel")

OnResponse = Callable[[int, m.ControllerRequest, Any], None]


class _BrokerQueue:
    def __init__(self, info: BrokerInfo) -> None:
        self.info = info
        self.requests: collections.deque[m.ControllerRequest] = collections.deque()
        self.ready = trio.Event()
        self.cancel_scope = trio.CancelScope()


class ControllerChannelManager:
    """Sends controller requests to live brokers over the network."""

    def __init__(self, nursery: trio.Nursery, listener_name: str = "PLAINTEXT", *, client_id: str = "controller",
                 on_response: OnResponse | None = None, request_timeout_s: float = 30.0,
                 security: ClientSecurity | None = None) -> None:
        self._nursery = nursery
        self._security = security
        self._listener = listener_name
        self._client_id = client_id
        self._on_response = on_response
        self._timeout_s = request_timeout_s
        self._queues: dict[int, _BrokerQueue] = {}

    def update_brokers(self, live: Mapping[int, BrokerInfo]) -> None:
        for b in list(self._queues):
            if b not in live or live[b] != self._queues[b].info:
                self._queues.pop(b).cancel_scope.cancel()
        for b, info in live.items():
            if b not in self._queues:
                queue = self._queues[b] = _BrokerQueue(info)
                self._nursery.start_soon(self._send_loop, b, queue)

    def send(self, broker_id: int, request: m.ControllerRequest) -> None:
        queue = self._queues.get(broker_id)
        if queue is None:
            _log.debug("dropping %s for broker %d, which is not live", type(request).__name__, broker_id)
            return
        queue.requests.append(request)
        queue.ready.set()

    def queued(self, broker_id: int) -> int:
        queue = self._queues.get(broker_id)
        return 0 if queue is None else len(queue.requests)

    def close(self) -> None:
        for queue in self._queues.values():
            queue.cancel_scope.cancel()
        self._queues.clear()

    async def _send_loop(self, broker_id: int, queue: _BrokerQueue) -> None:
        endpoint = queue.info.endpoint(self._listener) or (queue.info.endpoints[0] if queue.info.endpoints else None)
        if endpoint is None:
            _log.warning("broker %d has no endpoint; the controller cannot reach it", broker_id)
            return
        with queue.cancel_scope:
            stream = None
            frames = FrameBuffer()
            correlation_id = 0
            backoff_s = 0.05
            refused = ""  # the last login refusal logged, so a broker that keeps refusing is logged once
            answer_error = ""  # the same for an error answer (e.g. CLUSTER_AUTHORIZATION_FAILED)
            while True:
                if not queue.requests:
                    queue.ready = trio.Event()
                    await queue.ready.wait()
                    continue
                request = queue.requests[0]
                try:
                    if stream is None:
                        stream = await self._open(endpoint.host, endpoint.port)
                        frames = FrameBuffer()
                    correlation_id = (correlation_id + 1) & 0x7FFFFFFF
                    with trio.fail_after(self._timeout_s):
                        await stream.send_all(m.encode_request(correlation_id, self._client_id, request))
                        response = await self._read_response(stream, frames, request.__api_key__, correlation_id)
                except ConnectionFailedError as e:
                    # TLS or SASL refused: a wrong password or certificate does not fix itself, so say
                    # so loudly, once per reason, and keep retrying (the operator may fix the broker).
                    if str(e) != refused:
                        refused = str(e)
                        _log.warning("controller requests to broker %d at %s:%d are refused: %s; check the "
                                     "inter-broker listener's credentials (listener.name.<listener>."
                                     "<mechanism>.sasl.jaas.config) and truststore on both brokers", broker_id,
                                     endpoint.host, endpoint.port, e)
                    await trio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, 1.0)
                    continue
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                        RemoteProtocolError) as e:
                    _log.info("controller request to broker %d at %s:%d failed (%s); retrying", broker_id,
                              endpoint.host, endpoint.port, e)
                    if stream is not None:
                        await trio.aclose_forcefully(stream)
                        stream = None
                    await trio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, 1.0)
                    continue
                backoff_s = 0.05
                refused = ""
                queue.requests.popleft()
                error = getattr(response, "error_code", ErrorCode.none)
                if error != ErrorCode.none and error.name != answer_error:
                    _log.warning("broker %d answered %s with %s%s", broker_id, type(request).__name__, error.name.upper(),
                                 ": the controller's principal needs ClusterAction on the cluster there (or to be "
                                 "in its super.users)" if error == ErrorCode.cluster_authorization_failed else "")
                answer_error = error.name if error != ErrorCode.none else ""
                if self._on_response is not None:
                    self._on_response(broker_id, request, response)

    async def _open(self, host: str, port: int) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(host, port)
        if self._security is None:
            return stream
        try:
            return await secure_stream(stream, host, port, self._security, round(self._timeout_s * 1000))
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    @staticmethod
    async def _read_response(stream: trio.abc.Stream, frames: FrameBuffer, api_key: int,
                             correlation_id: int) -> Any:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError("the broker closed the connection")
            done = frames.feed(data)
            if done:
                assert len(done) == 1, "one request in flight, one response"
                return m.decode_response(done[0], api_key, correlation_id)


class LocalBrokerSender:
    """Delivers requests in process, synchronously, to `brokers[broker_id].handle(request)`.

    `brokers` is used as given (not copied), so brokers added to it later are reached.
    """

    def __init__(self, brokers: Mapping[int, Any] | None = None, on_response: OnResponse | None = None) -> None:
        self.brokers: Mapping[int, Any] = brokers if brokers is not None else {}
        self.live: set[int] = set()
        self.on_response = on_response

    def update_brokers(self, live: Mapping[int, BrokerInfo]) -> None:
        self.live = set(live)

    def send(self, broker_id: int, request: m.ControllerRequest) -> None:
        target = self.brokers.get(broker_id)
        if target is None or broker_id not in self.live:
            return
        response = target.handle(request)
        if self.on_response is not None:
            self.on_response(broker_id, request, response)
