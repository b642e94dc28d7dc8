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
out the fetch timeout. A follower that hears of the death a little later
than another refuses that one's pre-vote and sends it back to following
the dead leader (KIP-996); a dead leader stays dead for its epoch, so the
channel tells the core again at its next failed Fetch, 20 ms later. A
follower still replaying committed records into its image (one that just
restarted) leaves itself out of the list and waits a random backoff: as
leader it could not serve until its replay is done. This
changes only when elections start, never who may win (Raft's safety does
not depend on timing); a false alarm costs one pre-vote that the
followers of a live leader refuse.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from quorum.node.rpc import RpcShapeError, failure_response, request_to_kio, response_from_kio
from quorum.raft.messages import EndQuorumEpochRequest, FetchRequest, Inbound, Message, Outbound
from common.wire import ConnectionPool
from common.wire.errors import ConnectionFailedError, RequestTimeoutError

BROKER_NOT_AVAILABLE = 8
REQUEST_TIMED_OUT = 7
INVALID_REQUEST = 42
PROBE_TIMEOUT_S = 0.25
PROBE_INTERVAL_S = 0.1
#: After a failed Fetch to a dead leader, the core's next try comes this soon.
DEAD_LEADER_RETRY_S = 0.02
#: Committed records not yet applied above which a follower leaves itself
#: out of the successors (a new leader serves only once it has applied all).
REPLAY_BACKLOG_LIMIT = 2000

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
        replay_backlog: Callable[[], int | None],
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.voters = voters
        self.pool = pool
        self._nursery = nursery
        self._deliver = deliver
        self._request_timeout_ms = request_timeout_ms
        self._followed_leader = followed_leader
        self._replay_backlog = replay_backlog
        self._last_probe: dict[int, float] = {}
        self._dead: set[tuple[int, int]] = set()

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
            delay_s = min(self.pool.backoff_remaining_ms(destination), self._request_timeout_ms) / 1000
            if isinstance(message, FetchRequest) and self._followed_leader() == (destination,
                                                                               message.current_leader_epoch):
                if await self._leader_is_gone(destination, message.current_leader_epoch):
                    delay_s = DEAD_LEADER_RETRY_S
            _log.debug("request to node %d failed (%s); answering the core in %.3f s", destination, exc, delay_s)
            await trio.sleep(delay_s)
        except RpcShapeError as exc:
            _log.warning("node %d answered a %s with a malformed response: %s", destination,
                         type(message).__name__, exc)
            response = failure_response(message, INVALID_REQUEST)
        await self._deliver(Inbound(destination, response, outbound.correlation))

    async def _leader_is_gone(self, leader_id: int, epoch: int) -> bool:
        """Whether the leader this node follows in `epoch` died; if so, tell
        the core it resigned (see the module docstring). A leader whose
        process died never leads its epoch again (it restarts Resigned), so
        once found dead it stays dead: a follower that a pre-vote sent back
        to it (a peer had not noticed yet) is told again at its next Fetch."""
        if leader_id not in self.voters or self.node_id not in self.voters:
            return False
        if (leader_id, epoch) not in self._dead:
            now = trio.current_time()
            if now - self._last_probe.get(leader_id, -1e9) < PROBE_INTERVAL_S:
                return False
            self._last_probe[leader_id] = now
            host, port = self.pool.address(leader_id)
            try:
                with trio.fail_after(PROBE_TIMEOUT_S):
                    stream = await trio.open_tcp_stream(host, port)
            except OSError:
                pass  # refused (or unreachable at once): the process is gone
            except trio.TooSlowError:
                return False  # slow, not refused: maybe a partition; let the fetch timeout decide
            else:
                await trio.aclose_forcefully(stream)
                return False
            self._dead.add((leader_id, epoch))
            _log.info("leader %d of epoch %d refuses connections: treating it as resigned", leader_id, epoch)
        if self._followed_leader() != (leader_id, epoch):
            return True
        successors = tuple(sorted(self.voters - {leader_id}))
        backlog = self._replay_backlog()
        if backlog is None or backlog > REPLAY_BACKLOG_LIMIT:
            # Still replaying the log into its image (just restarted): as
            # leader it could not serve until done, so let a peer go first.
            successors = tuple(v for v in successors if v != self.node_id)
        request = EndQuorumEpochRequest(cluster_id=self.cluster_id, leader_id=leader_id, leader_epoch=epoch,
                                        preferred_successors=successors)
        await self._deliver(Inbound(leader_id, request, ("gone", leader_id, epoch, trio.current_time())))
        return True
