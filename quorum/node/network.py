"""The Raft driver's outbound side: requests to other quorum members.

Theory of operation
-------------------
Each request the core emits goes out on the `ConnectionPool` connection
to its destination, in a task of its own, as its Kafka message (`rpc`).
Whatever happens, exactly one response goes back to the core, carrying
the request's correlation:

- the peer's answer;
- or, when the connection failed, an error response naming no leader
  (BROKER_NOT_AVAILABLE, or REQUEST_TIMED_OUT), as Kafka's network
  channel does. It is handed back no sooner than the pool's reconnect
  backoff for that peer, so a dead peer is retried at the pool's
  exponential pace, not at the core's 20 ms retry backoff.

Dead-leader detection. A follower normally notices a dead leader only
when `controller.quorum.fetch.timeout.ms` (2 s) passes without a Fetch
answer. But a leader process that died (kill -9, crash) leaves a port that
refuses connections, and the kernel resets the follower's connection at
once. So when a Fetch to the leader this node follows breaks (not a
timeout: a partition looks like a timeout), the channel probes the
leader's port; if it refuses, the leader is gone, and the channel hands
the core the EndQuorumEpoch that leader would have sent on a graceful
shutdown (KIP-595), listing the remaining voters by id as preferred
successors. Every follower computes the same list, so the first starts
its election at once and the next 40 ms later, instead of both waiting
out the fetch timeout. This changes only when elections start, never who
may win (Raft's safety does not depend on timing); a false alarm costs one
pre-vote that the followers of a live leader refuse (KIP-996).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from quorum.node.rpc import RpcShapeError, failure_response, request_to_kio, response_from_kio
from quorum.raft.messages import EndQuorumEpochRequest, FetchRequest, Inbound, Message, Outbound
from raftka.wire import ConnectionPool
from raftka.wire.errors import ConnectionFailedError, RequestTimeoutError

BROKER_NOT_AVAILABLE = 8
REQUEST_TIMED_OUT = 7
INVALID_REQUEST = 42
PROBE_TIMEOUT_S = 0.25
PROBE_INTERVAL_S = 0.1

_log = logging.getLogger("quorum.node.network")


class RaftChannel:
    def __init__(
        self,
        *,
        node_id: int,
        cluster_id: str | None,
        voters: frozenset[int],
        pool: ConnectionPool,
        nursery: trio.Nursery,
        deliver: Callable[[Inbound], Awaitable[None]],
        request_timeout_ms: int,
        followed_leader: Callable[[], tuple[int | None, int]],
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.voters = voters
        self.pool = pool
        self._nursery = nursery
        self._deliver = deliver
        self._request_timeout_ms = request_timeout_ms
        self._followed_leader = followed_leader
        self._last_probe: dict[int, float] = {}

    def send(self, outbound: Outbound) -> None:
        self._nursery.start_soon(self._call, outbound)

    async def _call(self, outbound: Outbound) -> None:
        message = outbound.message
        destination = outbound.destination_id
        response: Message
        try:
            answer: Any = await self.pool.request(destination, request_to_kio(message),
                                                  timeout_ms=self._request_timeout_ms)
            response = response_from_kio(answer)
        except RequestTimeoutError:
            response = failure_response(message, REQUEST_TIMED_OUT)
        except ConnectionFailedError as exc:
            response = failure_response(message, BROKER_NOT_AVAILABLE)
            if isinstance(message, FetchRequest):
                self._nursery.start_soon(self._probe_leader, destination, message.current_leader_epoch)
            backoff_s = min(self.pool.backoff_remaining_ms(destination), self._request_timeout_ms) / 1000
            _log.debug("request to node %d failed (%s); answering the core in %.3f s", destination, exc, backoff_s)
            await trio.sleep(backoff_s)
        except RpcShapeError as exc:
            _log.warning("node %d answered a %s with a malformed response: %s", destination,
                         type(message).__name__, exc)
            response = failure_response(message, INVALID_REQUEST)
        await self._deliver(Inbound(destination, response, outbound.correlation))

    async def _probe_leader(self, leader_id: int, epoch: int) -> None:
        """If `leader_id` still leads the epoch we follow and its port refuses
        connections, tell the core it resigned (see the module docstring)."""
        if leader_id not in self.voters or self.node_id not in self.voters:
            return
        if self._followed_leader() != (leader_id, epoch):
            return
        now = trio.current_time()
        if now - self._last_probe.get(leader_id, -1e9) < PROBE_INTERVAL_S:
            return
        self._last_probe[leader_id] = now
        host, port = self.pool.address(leader_id)
        try:
            with trio.fail_after(PROBE_TIMEOUT_S):
                stream = await trio.open_tcp_stream(host, port)
        except OSError:
            pass  # refused (or unreachable at once): the process is gone
        except trio.TooSlowError:
            return  # slow, not refused: maybe a partition; let the fetch timeout decide
        else:
            await trio.aclose_forcefully(stream)
            return
        if self._followed_leader() != (leader_id, epoch):
            return
        successors = tuple(sorted(self.voters - {leader_id}))
        _log.info("leader %d of epoch %d refuses connections: treating it as resigned, successors %s",
                  leader_id, epoch, successors)
        request = EndQuorumEpochRequest(cluster_id=self.cluster_id, leader_id=leader_id, leader_epoch=epoch,
                                        preferred_successors=successors)
        await self._deliver(Inbound(leader_id, request, ("probe", leader_id, epoch, now)))
