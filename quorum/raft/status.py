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
    #: The replica's directory id: a voter's as the voter set records it, an
    #: observer's as its fetches name it (None when unknown).
    directory_id: uuid.UUID | None = None  # noqa: F821


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
        directory_id = core.recorded_directory_id(voter)
        if voter == core.node_id and core.is_voter:
            voters.append(ReplicaStatus(voter, core.log.log_end_offset, now_ms, now_ms, directory_id))
        elif isinstance(state, LeaderState) and voter in state.voter_states:
            s = state.voter_states[voter]
            voters.append(ReplicaStatus(voter, s.end_offset, s.last_fetch_ms, s.last_caught_up_ms, directory_id))
        else:
            voters.append(ReplicaStatus(voter, -1, -1, -1, directory_id))
    if isinstance(state, LeaderState):
        # By node id and directory id (Kafka's ReplicaKey): a controller on a
        # wiped disk is listed here while its id still names a voter.
        for (observer_id, directory_id), s in sorted(state.observer_states.items(),
                                                     key=lambda item: (item[0][0], str(item[0][1]))):
            observers.append(ReplicaStatus(observer_id, s.end_offset, s.last_fetch_ms, s.last_caught_up_ms,
                                           directory_id))
    elif not core.is_voter:
        observers.append(ReplicaStatus(core.node_id, core.log.log_end_offset, now_ms, now_ms, core.directory_id))
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
