"""Connections to other nodes by node id, opened lazily, with backoff.

Theory of operation
-------------------
A Raft voter keeps one connection per other voter; a broker keeps one to
the active controller. `ConnectionPool` maps node id -> address ->
`KafkaConnection`. `connection(node_id)` returns the open connection or
opens one (one attempt at a time per node; concurrent callers share it),
and negotiates ApiVersions on it. A failed attempt, or a connection that
breaks, puts the node in reconnect backoff: Kafka's `reconnect.backoff.ms`
doubling per consecutive failure up to `reconnect.backoff.max.ms`, with
+-20% jitter. During backoff `connection()` raises ConnectionFailedError at
once, so the caller's own timer (an election timeout, a heartbeat interval)
decides when to try again; nothing in the pool sleeps or retries by itself.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from common.security.client import ClientSecurity

from common.wire.client import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_REQUEST_TIMEOUT_MS,
    KafkaConnection,
    connect,
    sole_exception,
)
from common.wire.codec import ResponseReader
from common.wire.errors import ConnectionFailedError
from common.wire.framing import DEFAULT_REQUEST_MAX_BYTES

_log = logging.getLogger("raftka.wire.pool")


@dataclass(eq=False)
class _Node:
    host: str
    port: int
    connection: KafkaConnection | None = None
    connecting: trio.Event | None = None
    failures: int = 0
    backoff_until: float = 0.0
    last_error: str = ""


class ConnectionPool:
    """Lazily connected `KafkaConnection`s by node id. Create with
    `open_connection_pool`, or directly with a nursery that outlives it."""

    def __init__(
        self,
        nursery: trio.Nursery,
        addresses: dict[int, tuple[str, int]] | None = None,
        *,
        client_id: str | None = "raftka",
        connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
        reconnect_backoff_ms: int = 50,
        reconnect_backoff_max_ms: int = 1000,
        response_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
        negotiate_api_versions: bool = True,
        rng: random.Random | None = None,
        log: logging.Logger | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self._nursery = nursery
        #: TLS and SASL for every connection (a node's links to controllers).
        self.security = security
        self._nodes: dict[int, _Node] = {}
        self.client_id = client_id
        self.connect_timeout_ms = connect_timeout_ms
        self.reconnect_backoff_ms = reconnect_backoff_ms
        self.reconnect_backoff_max_ms = reconnect_backoff_max_ms
        self.response_max_bytes = response_max_bytes
        self.negotiate_api_versions = negotiate_api_versions
        self._rng = rng or random.Random()
        self._log = log or _log
        for node_id, (host, port) in (addresses or {}).items():
            self.set_address(node_id, host, port)

    def set_address(self, node_id: int, host: str, port: int) -> None:
        """Add a node, or move it (its old connection is closed)."""
        node = self._nodes.get(node_id)
        if node is not None and (node.host, node.port) == (host, port):
            return
        if node is not None and node.connection is not None:
            self._nursery.start_soon(node.connection.aclose)
        self._nodes[node_id] = _Node(host, port)

    def remove(self, node_id: int) -> None:
        node = self._nodes.pop(node_id, None)
        if node is not None and node.connection is not None:
            self._nursery.start_soon(node.connection.aclose)

    def address(self, node_id: int) -> tuple[str, int]:
        return (self._node(node_id).host, self._node(node_id).port)

    def backoff_remaining_ms(self, node_id: int) -> int:
        """How long `connection(node_id)` will keep refusing to try (0 = will try)."""
        node = self._node(node_id)
        return max(0, round((node.backoff_until - trio.current_time()) * 1000))

    def _node(self, node_id: int) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise ConnectionFailedError(
                f"no address known for node {node_id}; set_address() it first"
            )
        return node

    async def connection(self, node_id: int) -> KafkaConnection:
        """The open connection to `node_id`, connecting if needed."""
        while True:
            node = self._node(node_id)
            conn = node.connection
            if conn is not None and not conn.closed:
                if conn.renew_at is None or trio.current_time() < conn.renew_at:
                    return conn
                # Its SASL session is about to expire (KIP-368): new requests go on a
                # new connection; this one closes once its own requests are answered.
                node.connection = None
                self._nursery.start_soon(_retire, conn)
            if node.connection is not None:
                # It broke since we last looked: that is a failure too.
                self._record_failure(node_id, node, "connection closed")
                node.connection = None
            if node.connecting is not None:
                await node.connecting.wait()
                continue
            now = trio.current_time()
            if now < node.backoff_until:
                raise ConnectionFailedError(
                    f"node {node_id} at {node.host}:{node.port} is in reconnect backoff for "
                    f"{round((node.backoff_until - now) * 1000)} ms more after: {node.last_error}"
                )
            return await self._connect(node_id, node)

    async def _connect(self, node_id: int, node: _Node) -> KafkaConnection:
        node.connecting = trio.Event()
        try:
            conn = await connect(
                self._nursery, node.host, node.port, client_id=self.client_id,
                connect_timeout_ms=self.connect_timeout_ms,
                response_max_bytes=self.response_max_bytes, log=self._log, security=self.security,
            )
            if self.negotiate_api_versions:
                try:
                    await conn.api_versions(timeout_ms=self.connect_timeout_ms)
                except BaseException:
                    await conn.aclose()
                    raise
        except ConnectionFailedError as exc:
            if self._nodes.get(node_id) is node:
                self._record_failure(node_id, node, str(exc))
            raise
        finally:
            node.connecting.set()
            node.connecting = None
        if self._nodes.get(node_id) is not node:
            # The node moved or was removed while we connected.
            await conn.aclose()
            raise ConnectionFailedError(f"node {node_id} changed address while connecting")
        node.connection = conn
        node.failures = 0
        node.backoff_until = 0.0
        return conn

    def _record_failure(self, node_id: int, node: _Node, why: str) -> None:
        node.failures += 1
        backoff_ms = min(
            self.reconnect_backoff_max_ms,
            self.reconnect_backoff_ms * 2 ** min(node.failures - 1, 30),
        ) * self._rng.uniform(0.8, 1.2)
        node.backoff_until = trio.current_time() + backoff_ms / 1000
        node.last_error = why
        self._log.info(
            "node %d at %s:%d unreachable (%s); backing off %d ms",
            node_id, node.host, node.port, why, backoff_ms,
        )

    async def request(
        self, node_id: int, request: Any, *, timeout_ms: int | None = DEFAULT_REQUEST_TIMEOUT_MS,
        read: ResponseReader | None = None,
    ) -> Any:
        """`connection(node_id).request(request)`: raises ConnectionFailedError to retry."""
        conn = await self.connection(node_id)
        return await conn.request(request, timeout_ms=timeout_ms, read=read)

    async def aclose(self) -> None:
        """Close every connection."""
        for node in self._nodes.values():
            if node.connection is not None:
                await node.connection.aclose()
                node.connection = None


async def _retire(conn: KafkaConnection, grace_s: float = 60.0) -> None:
    """Close `conn` once nothing is in flight on it (at most `grace_s` from now)."""
    with trio.move_on_after(grace_s):
        while conn.in_flight and not conn.closed:
            await trio.sleep(0.05)
    await conn.aclose()


@asynccontextmanager
async def open_connection_pool(
    addresses: dict[int, tuple[str, int]] | None = None, **kwargs: Any
) -> AsyncIterator[ConnectionPool]:
    """`async with open_connection_pool({1: ("host", 9093)}) as pool:`."""
    try:
        async with trio.open_nursery() as nursery:
            pool = ConnectionPool(nursery, addresses, **kwargs)
            try:
                yield pool
            finally:
                await pool.aclose()
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None
