"""DescribeQuorum (API 55): the quorum's state, as `kafka-metadata-quorum describe --status` reads it.

Only the leader knows every replica's progress, so, as in Kafka, a node
that is not the leader answers NOT_LEADER_OR_FOLLOWER with the leader it
knows; in v2 the answer lists every voter's endpoint (`nodes`), so a tool
can ask the leader next. Timestamps on the wire are wall-clock ms; the
core keeps monotonic ones, converted here.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Any

from kio.schema.errors import ErrorCode

from common.wire import open_connection

from quorum.node.metadata_log import METADATA_TOPIC
from quorum.raft.status import QuorumStatus, ReplicaStatus

DESCRIBE_QUORUM = 55
VERSIONS = (0, 2)
CONTROLLER_LISTENER = "CONTROLLER"


def _module(version: int) -> Any:
    return importlib.import_module(f"kio.schema.describe_quorum.v{version}.response")


def describe_quorum_response(version: int, status: QuorumStatus, voters: dict[int, tuple[str, int]],
                             now_ms: int, engine_note: str | None = None) -> Any:
    """`engine_note` (v2, in the top-level error_message, which tools ignore
    when the error code is NONE): a non-default engine's own view, e.g.
    `engine=pysyncobj term=3 commit_idx=7 members=1:self,2:connected`."""
    m = _module(version)
    wall_ms = time.time_ns() // 1_000_000

    def wall(t: int) -> int:
        return -1 if t < 0 else wall_ms - (now_ms - t)

    def replica(r: ReplicaStatus) -> Any:
        fields: dict[str, Any] = {"replica_id": r.replica_id, "log_end_offset": r.log_end_offset}
        if version >= 1:
            fields["last_fetch_timestamp"] = wall(r.last_fetch_timestamp_ms)
            fields["last_caught_up_timestamp"] = wall(r.last_caught_up_timestamp_ms)
        if version >= 2:
            fields["replica_directory_id"] = None
        return m.ReplicaState(**fields)

    is_leader = status.role == "Leader"
    partition: dict[str, Any] = {
        "partition_index": 0,
        "error_code": ErrorCode.none if is_leader else ErrorCode.not_leader_or_follower,
        "leader_id": -1 if status.leader_id is None else status.leader_id,
        "leader_epoch": status.epoch,
        "high_watermark": status.high_watermark if is_leader and status.high_watermark is not None else -1,
        "current_voters": tuple(replica(r) for r in status.voters) if is_leader else (),
        "observers": tuple(replica(r) for r in status.observers) if is_leader else (),
    }
    top: dict[str, Any] = {"error_code": ErrorCode.none}
    if version >= 2:
        partition["error_message"] = None if is_leader else f"node {status.node_id} is not the leader"
        top["error_message"] = engine_note
        top["nodes"] = tuple(
            m.Node(node_id=n, listeners=(m.Listener(name=CONTROLLER_LISTENER, host=h, port=p),))
            for n, (h, p) in sorted(voters.items()))
    top["topics"] = (m.TopicData(topic_name=METADATA_TOPIC, partitions=(m.PartitionData(**partition),)),)
    return m.DescribeQuorumResponse(**top)


@dataclasses.dataclass(frozen=True)
class QuorumDescription:
    """A parsed DescribeQuorum answer (what `raftka quorum status` prints)."""

    error_code: int
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[tuple[int, int, int, int], ...]  # (id, log end offset, last fetch ms, last caught up ms)
    observers: tuple[tuple[int, int, int, int], ...]
    nodes: dict[int, tuple[str, int]]
    #: The engine's own view, parsed from `engine_note` ({"engine": "raftka"} without one).
    engine: dict[str, str] = dataclasses.field(default_factory=lambda: {"engine": "raftka"})


def parse_engine_note(note: str | None) -> dict[str, str]:
    if not note or not note.startswith("engine="):
        return {"engine": "raftka"}
    return dict(item.split("=", 1) for item in note.split() if "=" in item)


def parse_describe_quorum(response: Any) -> QuorumDescription:
    nodes = {}
    for n in getattr(response, "nodes", ()) or ():
        if n.listeners:
            nodes[int(n.node_id)] = (n.listeners[0].host, int(n.listeners[0].port))
    if response.error_code != ErrorCode.none or len(response.topics) != 1 or len(response.topics[0].partitions) != 1:
        return QuorumDescription(int(response.error_code), -1, -1, -1, (), (), nodes)
    p = response.topics[0].partitions[0]

    def rows(states: Any) -> tuple[tuple[int, int, int, int], ...]:
        return tuple((int(s.replica_id), int(s.log_end_offset), int(getattr(s, "last_fetch_timestamp", -1)),
                      int(getattr(s, "last_caught_up_timestamp", -1))) for s in states)

    return QuorumDescription(int(p.error_code), int(p.leader_id), int(p.leader_epoch), int(p.high_watermark),
                             rows(p.current_voters), rows(p.observers), nodes,
                             parse_engine_note(getattr(response, "error_message", None)))


def describe_quorum_request(version: int = 2) -> Any:
    m = importlib.import_module(f"kio.schema.describe_quorum.v{version}.request")
    return m.DescribeQuorumRequest(topics=(m.TopicData(topic_name=METADATA_TOPIC, partitions=(
        m.PartitionData(partition_index=0),)),))


async def describe_quorum(host: str, port: int, timeout_ms: int = 10000) -> Any:
    """The leader's DescribeQuorum answer (`QuorumDescription`), following one redirect."""
    for _ in range(2):
        async with open_connection(host, port, connect_timeout_ms=timeout_ms) as conn:
            response = await conn.request(describe_quorum_request(2), timeout_ms=timeout_ms)
        description = parse_describe_quorum(response)
        if description.error_code == ErrorCode.not_leader_or_follower and description.leader_id in description.nodes:
            host, port = description.nodes[description.leader_id]
            continue
        return description
    return description
