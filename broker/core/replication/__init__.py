"""Replication of data partitions: the pure core (no I/O, no clock, no randomness).

Leader side: `Partition` (role transitions from metadata, client checks,
acks=all) over `LeaderState` (follower tracking, HW, ISR shrink/expand
through AlterPartition with KIP-497 pending-ISR semantics). Follower side:
`FetcherManager` and `ReplicaFetcher` (one Fetch per source broker,
DivergingEpoch truncation). `divergence` holds the leader-epoch rules both
sides share; `alter_partition` converts to and from the kio entities.

The broker shell (trio server, fetcher tasks, purgatory timers) owns the
logs and the sockets, calls into these objects and acts on what they return.
"""

from broker.core.replication.alter_partition import build_request, failed, split_response
from broker.core.replication.config import ReplicationConfig
from broker.core.replication.divergence import offset_for_leader_epoch, truncation_offset, validate_fetch_position
from broker.core.replication.follower import FetcherManager, ReplicaFetcher
from broker.core.replication.isr import IsrState
from broker.core.replication.leader import LeaderState, ReplicaState
from broker.core.replication.messages import (
    NO_EPOCH,
    AlterPartitionProposal,
    AlterPartitionResult,
    BrokerState,
    EpochEndOffset,
    FetchPlan,
    FollowerAction,
    LeaderUpdate,
    LogView,
    PartitionFetch,
    PartitionFetchResult,
    ReplicaFetch,
    ReplicaFetchDecision,
    TopicIdPartition,
)
from broker.core.replication.partition import Partition, PendingProduce, Role, RoleChange, eligible_brokers

__all__ = [
    "NO_EPOCH",
    "AlterPartitionProposal",
    "AlterPartitionResult",
    "BrokerState",
    "EpochEndOffset",
    "FetchPlan",
    "FetcherManager",
    "FollowerAction",
    "IsrState",
    "LeaderState",
    "LeaderUpdate",
    "LogView",
    "Partition",
    "PartitionFetch",
    "PartitionFetchResult",
    "PendingProduce",
    "ReplicaFetch",
    "ReplicaFetchDecision",
    "ReplicaFetcher",
    "ReplicaState",
    "ReplicationConfig",
    "Role",
    "RoleChange",
    "TopicIdPartition",
    "build_request",
    "eligible_brokers",
    "failed",
    "offset_for_leader_epoch",
    "split_response",
    "truncation_offset",
    "validate_fetch_position",
]
