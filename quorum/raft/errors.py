"""Raft errors: Kafka error codes on the wire, one exception family in process.

On the wire every failure is an `ErrorCode` value inside a response; the
core never raises because a peer sent something odd. In process the core
raises only when its caller misuses it (`RaftUsageError`) or asks a
non-leader to append (`NotLeaderError`, which names the leader to retry at).
"""

import enum

from common.errors import RaftkaError


class ErrorCode(enum.IntEnum):
    """The Kafka error codes the Raft RPCs use (values from Kafka's `Errors`)."""

    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    NOT_LEADER_OR_FOLLOWER = 6
    INVALID_REQUEST = 42
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    INCONSISTENT_VOTER_SET = 94
    SNAPSHOT_NOT_FOUND = 98
    POSITION_OUT_OF_RANGE = 99
    INCONSISTENT_CLUSTER_ID = 104
    INVALID_VOTER_KEY = 125


class RaftError(RaftkaError):
    """Root of the errors the Raft core raises."""


class NotLeaderError(RaftError):
    """`propose` was called on a node that is not the leader of the current
    epoch. Retry at `leader_id` (None when no leader is known yet: wait for
    an election and retry)."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        where = f"node {leader_id}" if leader_id is not None else "no known leader yet"
        super().__init__(f"not the quorum leader in epoch {epoch}; the leader is {where}")
        self.leader_id = leader_id
        self.epoch = epoch


class RaftUsageError(RaftError):
    """The caller used the core wrongly (e.g. a snapshot above the high
    watermark); the message says which rule was broken."""
