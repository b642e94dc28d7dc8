"""The Raft core of raftka's metadata quorum (KRaft: KIP-595, KIP-996 pre-vote).

A pure state machine: `RaftCore.handle(inbound, now_ms)` and
`RaftCore.tick(now_ms)` return an `Output` (messages to send, election state
to fsync, log offset to flush, the high watermark). A driver elsewhere owns
the clock, the sockets and the files, and obeys each Output in the order
persist, then send, then apply (see `core.py`).

Replication is pull-based, as in Kafka: followers and observers Fetch from
the leader with their log end offset and last fetched epoch; the leader
answers records, a DivergingEpoch to truncate to, or a SnapshotId to load.

Modules: `core` (RaftCore), one module per role (`unattached`, `candidate`,
`leader`, `follower`, `resigned`; `state` has the transition table),
`requests` (what every role answers alike), `fetcher` (the follower's side
of Fetch), `messages` (the RPCs), `log` (the `ReplicatedLog` interface),
`memory_log` (an in-memory log for tests), `storage_log` (the production log
over `storage.Log`; imported on its own, it is the only module here that
touches files), `election` (the persisted quorum-state), `output`,
`status`, `config`, `errors`.
"""

from quorum.raft.config import QuorumConfig
from quorum.raft.core import RaftCore
from quorum.raft.election import ElectionState
from quorum.raft.errors import ErrorCode, NotLeaderError, RaftError, RaftUsageError
from quorum.raft.log import AppendInfo, ReplicatedLog
from quorum.raft.memory_log import MemoryLog
from quorum.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Inbound,
    OffsetAndEpoch,
    Outbound,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from quorum.raft.output import AppendResult, LeaderAndEpoch, Output
from quorum.raft.status import QuorumStatus, ReplicaStatus

__all__ = [
    "NO_LEADER",
    "AppendInfo",
    "AppendResult",
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "DivergingEpoch",
    "ElectionState",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "ErrorCode",
    "FetchRequest",
    "FetchResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "Inbound",
    "LeaderAndEpoch",
    "MemoryLog",
    "NotLeaderError",
    "OffsetAndEpoch",
    "Outbound",
    "Output",
    "QuorumConfig",
    "QuorumStatus",
    "RaftCore",
    "RaftError",
    "RaftUsageError",
    "ReplicaStatus",
    "ReplicatedLog",
    "SnapshotId",
    "VoteRequest",
    "VoteResponse",
]
