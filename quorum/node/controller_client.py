"""ControllerClient: send controller requests to whichever voter is the active controller.

Brokers, tools and tests talk to "the controller" without knowing which
voter leads. The client keeps a guess (the last voter that answered
without NOT_CONTROLLER; a `leader_hint` callable, e.g. an observer's
`RaftNode.leader`, may supply a better one). `send` tries the guess first,
then the other voters in turn, with `retry_backoff_ms` between rounds,
until one answers without NOT_CONTROLLER or `timeout_ms` passes. A
connection failure counts like NOT_CONTROLLER.

Retrying is not idempotent in general: a write whose answer was lost may
have been committed, and its retry then reports e.g. TOPIC_ALREADY_EXISTS.
`send(..., retry=False)` sends once, to a caller that wants to know.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from quorum.node.controller_errors import response_errors
from common.errors import RaftkaError
from common.wire import ConnectionPool
from common.wire.errors import ConnectionFailedError

_log = logging.getLogger("quorum.node.controller_client")


class NoActiveControllerError(RaftkaError):
    """No voter answered as the active controller in time: the quorum has no
    leader (a majority of voters is down or partitioned) or is unreachable."""


class ControllerClient:
    def __init__(self, pool: ConnectionPool, voters: dict[int, tuple[str, int]], *,
                 leader_hint: Callable[[], int | None] | None = None, request_timeout_ms: int = 5000,
                 retry_backoff_ms: int = 20,
                 voter_addresses: Callable[[], dict[int, tuple[str, int]]] | None = None) -> None:
        self.pool = pool
        self.voters = sorted(voters)
        for node_id, (host, port) in voters.items():
            pool.set_address(node_id, host, port)
        #: A dynamic quorum's voters change: asked before each choice of controller.
        self._voter_addresses = voter_addresses
        self._known = dict(voters)
        self._leader_hint = leader_hint
        self._guess: int | None = None
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms

    def _candidates(self) -> list[int]:
        if self._voter_addresses is not None:
            current = self._voter_addresses()
            if current != self._known:
                self._known = dict(current)
                self.voters = sorted(current)
                for node_id, (host, port) in current.items():
                    self.pool.set_address(node_id, host, port)
        first = [self._leader_hint()] if self._leader_hint is not None else []
        first.append(self._guess)
        ordered = [v for v in first if v in self.voters]
        return list(dict.fromkeys(ordered + self.voters))

    async def send_to(self, node_id: int, request: Any) -> Any:
        """One attempt at one voter; raises ConnectionFailedError."""
        return await self.pool.request(node_id, request, timeout_ms=self.request_timeout_ms)

    async def send(self, request: Any, *, timeout_ms: int = 30000, retry: bool = True) -> tuple[int, Any]:
        """(the voter that answered, its response). Raises NoActiveControllerError."""
        last_error = "no attempt"
        with trio.move_on_after(timeout_ms / 1000):
            while True:
                for node_id in self._candidates():
                    try:
                        response = await self.send_to(node_id, request)
                    except ConnectionFailedError as exc:
                        last_error = f"node {node_id}: {exc}"
                        if not retry:
                            raise
                        continue
                    if ErrorCode.not_controller in response_errors(response):
                        last_error = f"node {node_id}: NOT_CONTROLLER"
                        if self._guess == node_id:
                            self._guess = None
                        if not retry:
                            return node_id, response
                        continue
                    self._guess = node_id
                    return node_id, response
                await trio.sleep(self.retry_backoff_ms / 1000)
        raise NoActiveControllerError(f"no active controller answered within {timeout_ms} ms; last: {last_error}")
