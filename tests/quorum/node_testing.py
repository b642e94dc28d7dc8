"""A quorum of RaftNodes inside one trio run: real sockets on loopback, real
files under tmp_path, short timeouts. Each node serves its controller
listener like a `raftka controller` process does; `stop` cancels a node
abruptly (no resignation, no goodbye; its files stay), `start` brings it
back on the same files and port.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

import trio

from quorum.controller import ControllerConfig
from quorum.node.controller_service import ControllerService
from quorum.node.driver import RaftNode
from quorum.node.handler import QuorumRequestHandler
from quorum.raft import QuorumConfig
from common.wire import serve
from common.wire.ports import free_ports

CLUSTER_ID = "node-test-cluster"

# Short election timers, so tests start fast; a fetch timeout that an fsync
# stalled by a busy shared disk (seen: 0.8 s) does not mistake for a dead leader.
FAST = QuorumConfig(
    controller_quorum_election_timeout_ms=150,
    controller_quorum_fetch_timeout_ms=2000,
    controller_quorum_election_backoff_max_ms=150,
    controller_quorum_request_timeout_ms=1000,
    controller_quorum_retry_backoff_ms=10,
    fetch_max_wait_ms=200,
)


@dataclass
class Member:
    node: RaftNode
    controller: ControllerService | None
    scope: trio.CancelScope
    finished: trio.Event


class InProcessQuorum:
    def __init__(self, tmp_path: Path, nursery: trio.Nursery, voters: int = 3, *,
                 config: QuorumConfig = FAST, controller_config: ControllerConfig | None = None,
                 segment_bytes: int = 1024 * 1024) -> None:
        self.tmp_path = tmp_path
        self.nursery = nursery
        ports = free_ports(voters)
        self.voters = {i + 1: ("127.0.0.1", ports[i]) for i in range(voters)}
        self.config = config
        self.controller_config = controller_config or ControllerConfig(cluster_id=CLUSTER_ID)
        self.segment_bytes = segment_bytes
        self.members: dict[int, Member] = {}

    def log_dir(self, node_id: int) -> str:
        return str(self.tmp_path / f"node-{node_id}")

    async def start(self, node_id: int, *, config: QuorumConfig | None = None) -> RaftNode:
        """Start a voter (serving its listener) or, for an id not in the voters, an observer."""
        member = await self.nursery.start(self._run, node_id, config or self.config)
        self.members[node_id] = member
        return member.node

    async def start_all(self) -> None:
        for node_id in self.voters:
            await self.start(node_id)

    async def _run(self, node_id: int, config: QuorumConfig, *, task_status: trio.TaskStatus[Member]) -> None:
        finished = trio.Event()
        try:
            await self._serve(node_id, config, finished, task_status)
        finally:
            finished.set()

    async def _serve(self, node_id: int, config: QuorumConfig, finished: trio.Event,
                     task_status: trio.TaskStatus[Member]) -> None:
        with trio.CancelScope() as scope:
            node = RaftNode(node_id=node_id, voters=self.voters, log_dir=self.log_dir(node_id), cluster_id=CLUSTER_ID,
                            config=config, rng=random.Random(node_id), segment_bytes=self.segment_bytes)
            async with trio.open_nursery() as nursery:
                await nursery.start(node.run)
                controller = None
                if node_id in self.voters:
                    controller = ControllerService(node, self.controller_config, random.Random(node_id))
                    await nursery.start(controller.run)
                    handler = QuorumRequestHandler(node, controller)
                    host, port = self.voters[node_id]
                    await nursery.start(functools.partial(serve, handler, host, port, apis=handler.apis))
                task_status.started(Member(node, controller, scope, finished))

    async def stop(self, node_id: int) -> None:
        """Cancel the node abruptly and wait until it is gone (its files stay)."""
        member = self.members.pop(node_id)
        member.scope.cancel()
        await member.finished.wait()

    def node(self, node_id: int) -> RaftNode:
        return self.members[node_id].node

    async def active_leader(self, timeout_s: float = 10.0) -> int:
        with trio.fail_after(timeout_s):
            while True:
                for node_id, member in self.members.items():
                    if member.node.is_active:
                        return node_id
                await trio.sleep(0.01)

    async def wait_applied_everywhere(self, offset: int, timeout_s: float = 10.0) -> None:
        with trio.fail_after(timeout_s):
            for member in self.members.values():
                await member.node.wait_until_applied(offset)
