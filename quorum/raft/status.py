"""QuorumStatus: what `raftka quorum status` prints (DescribeQuorum's shape).

Only the leader knows the other replicas' progress; elsewhere their fields
are -1, as in Kafka's DescribeQuorum answer.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from quorum.raft.leader import LeaderState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaStatus:
    replica_id: int
    log_end_offset: int  # -1 when unknown
    last_fetch_timestamp_ms: int  # -1 when unknown
    last_caught_up_timestamp_ms: int  # -1 when unknown


@dataclasses.dataclass(frozen=True, slots=True)
class QuorumStatus:
    node_id: int
    role: str
    leader_id: int | None
    epoch: int
    high_watermark: int | None
    log_start_offset: int
    log_end_offset: int
    voters: tuple[ReplicaStatus, ...]
    observers: tuple[ReplicaStatus, ...]


def describe(core: RaftCore, now_ms: int) -> QuorumStatus:
    state = core.state
    voters: list[ReplicaStatus] = []
    observers: list[ReplicaStatus] = []
    for voter in sorted(core.voters):
        if voter == core.node_id and core.is_voter:
            voters.append(ReplicaStatus(voter, core.log.log_end_offset, now_ms, now_ms))
        elif isinstance(state, LeaderState):
            s = state.voter_states[voter]
            voters.append(ReplicaStatus(voter, s.end_offset, s.last_fetch_ms, s.last_caught_up_ms))
        else:
            voters.append(ReplicaStatus(voter, -1, -1, -1))
    if isinstance(state, LeaderState):
        for observer_id, s in sorted(state.observer_states.items()):
            observers.append(ReplicaStatus(observer_id, s.end_offset, s.last_fetch_ms, s.last_caught_up_ms))
    elif not core.is_voter:
        observers.append(ReplicaStatus(core.node_id, core.log.log_end_offset, now_ms, now_ms))
    leader = core.leader_and_epoch
    return QuorumStatus(
        node_id=core.node_id,
        role=state.name,
        leader_id=leader.leader_id,
        epoch=leader.epoch,
        high_watermark=core.high_watermark,
        log_start_offset=core.log.log_start_offset,
        log_end_offset=core.log.log_end_offset,
        voters=tuple(voters),
        observers=tuple(observers),
    )
