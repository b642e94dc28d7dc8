"""A small, synchronous harness for unit tests of single Raft transitions.

`Node` wraps a `RaftCore` with its `MemoryLog` and its persisted election
state, and obeys each `Output` like a driver (persist, flush, then queue the
messages). `Harness` holds several nodes and a mailbox; tests deliver
messages one at a time (or all of them), drop some, and look at what came
out, without any timing noise.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable

from quorum.raft import ElectionState, Inbound, MemoryLog, Outbound, Output, QuorumConfig, RaftCore
from quorum.raft.messages import REQUEST_TYPES, Message

CONFIG = QuorumConfig(
    controller_quorum_election_timeout_ms=100,
    controller_quorum_fetch_timeout_ms=200,
    controller_quorum_election_backoff_max_ms=100,
    controller_quorum_request_timeout_ms=50,
    controller_quorum_retry_backoff_ms=5,
    fetch_max_wait_ms=20,
)


@dataclasses.dataclass(frozen=True)
class Token:
    source_id: int
    correlation: object


@dataclasses.dataclass
class Envelope:
    source_id: int
    destination_id: int
    message: Message
    correlation: object


class Node:
    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        *,
        log: MemoryLog | None = None,
        election: ElectionState | None = None,
        config: QuorumConfig = CONFIG,
        seed: int = 0,
        now_ms: int = 0,
        directory_id: object = None,
        voter_directory_ids: dict[int, object] | None = None,
    ) -> None:
        self.node_id = node_id
        self.directory_id = directory_id
        self.voter_directory_ids = voter_directory_ids
        self.voters = frozenset(voters)
        self.config = config
        self.log = log if log is not None else MemoryLog()
        self.disk_election = election
        self.seed = seed
        self.outputs: list[Output] = []
        self.outbox: list[Envelope] = []
        self.core = self._new_core(now_ms)

    def _new_core(self, now_ms: int) -> RaftCore:
        return RaftCore(
            node_id=self.node_id,
            voters=self.voters,
            log=self.log,
            rng=random.Random(self.seed * 1000 + self.node_id),
            now_ms=now_ms,
            config=self.config,
            election_state=self.disk_election,
            directory_id=self.directory_id,
            voter_directory_ids=self.voter_directory_ids,
        )

    def restart(self, now_ms: int, *, lose_unflushed: bool = True) -> None:
        if lose_unflushed:
            self.log.crash()
        self.outbox.clear()
        self.core = self._new_core(now_ms)

    def obey(self, out: Output) -> Output:
        self.outputs.append(out)
        if out.persist_election_state is not None:
            self.disk_election = out.persist_election_state
        if out.flush_log_to_offset is not None:
            self.log.flush(out.flush_log_to_offset)
        for m in out.messages:
            if m.is_request:
                self.outbox.append(Envelope(self.node_id, m.destination_id, m.message, m.correlation))
            else:
                token = m.correlation
                assert isinstance(token, Token), token
                self.outbox.append(Envelope(self.node_id, token.source_id, m.message, token.correlation))
        return out

    def tick(self, now_ms: int) -> Output:
        out = self.obey(self.core.tick(now_ms))
        if out.flush_log_to_offset is not None:
            self.obey(self.core.tick(now_ms))  # a completed flush may move the HW
        return out

    def handle(self, source_id: int, message: Message, correlation: object, now_ms: int) -> Output:
        if isinstance(message, REQUEST_TYPES):
            correlation = Token(source_id, correlation)
        out = self.obey(self.core.handle(Inbound(source_id, message, correlation), now_ms))
        if out.flush_log_to_offset is not None:
            self.obey(self.core.tick(now_ms))  # a completed flush may move the HW
        return out

    def propose(self, records: list[bytes], now_ms: int):  # noqa: ANN201
        result, out = self.core.propose(records, now_ms)
        self.obey(out)
        self.obey(self.core.tick(now_ms))
        return result

    def take(self, kind: type | None = None, to: int | None = None) -> list[Envelope]:
        """Remove and return queued messages of `kind` (to `to`)."""
        taken = [
            e
            for e in self.outbox
            if (kind is None or isinstance(e.message, kind)) and (to is None or e.destination_id == to)
        ]
        self.outbox = [e for e in self.outbox if e not in taken]
        return taken


class Harness:
    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.now_ms = 0

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def deliver(self, envelope: Envelope) -> Output | None:
        node = self.nodes.get(envelope.destination_id)
        if node is None:
            return None
        return node.handle(envelope.source_id, envelope.message, envelope.correlation, self.now_ms)

    def pending(self) -> list[Envelope]:
        return [e for n in self.nodes.values() for e in n.outbox]

    def flush_messages(self, drop: Callable[[Envelope], bool] = lambda e: False, limit: int = 10_000) -> int:
        """Deliver queued messages (and the ones they cause) until none are left."""
        delivered = 0
        while delivered < limit:
            batch = [e for n in self.nodes.values() for e in n.outbox]
            if not batch:
                return delivered
            for n in self.nodes.values():
                n.outbox.clear()
            for e in batch:
                if not drop(e):
                    self.deliver(e)
                delivered += 1
        raise AssertionError("messages keep flowing; is something ping-ponging?")

    def advance(self, ms: int, drop: Callable[[Envelope], bool] = lambda e: False) -> None:
        """Let `ms` pass in 1 ms steps, ticking every node and delivering everything."""
        for _ in range(ms):
            self.now_ms += 1
            for n in self.nodes.values():
                n.tick(self.now_ms)
            self.flush_messages(drop)

    def leaders(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.core.is_leader]

    def elect(self, max_ms: int = 2000) -> Node:
        for _ in range(max_ms):
            if self.leaders():
                break
            self.advance(1)
        (leader,) = self.leaders()
        self.advance(5)
        return leader


def outbound(out: Output, kind: type) -> list[Outbound]:
    return [m for m in out.messages if isinstance(m.message, kind)]
