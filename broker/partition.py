"""One partition replica's state on this broker (pure core: no I/O, no clock).

Theory of operation
-------------------
A `PartitionState` is what the broker knows about one partition it hosts:
its role, the leader and leader epoch from the metadata image, the ISR,
this replica's log end offset (LEO, mirrored from the local `storage.Log`
by the shell after every append or truncation) and the high watermark
(HW). The shell feeds it events and reads decisions back; it never touches
the log or a socket.

Transitions (driven by metadata deltas, `quorum.metadata.MetadataDelta`):

    (new)    => Leader:   the image names this broker leader at leader_epoch
    (new)    => Follower: the image names another broker (or none) leader
    Follower => Leader:   a new leader epoch names this broker
    Leader   => Follower: a new leader epoch names another broker
    Leader   => Leader:   same leader epoch, new ISR or partition epoch
                          (an AlterPartition result): adopt the ISR only
    any      => stopped:  the replica left the partition or the topic was
                          deleted; the shell drops the state (and the log)

High watermark (Kafka's `Partition.maybeIncrementLeaderHW`; ARCHITECTURE
"Replicate"): on the leader, HW = min LEO over the ISR, where a follower's
LEO is the fetch offset of its last Fetch. The HW never moves backwards,
and never advances while the ISR is smaller than `min.insync.replicas`. A
new leader starts from its checkpointed HW (bounded by its LEO) and moves
it once the ISR's LEOs are known; with an ISR of one (this broker) that is
at once. A follower's HW is the leader's, bounded by its own LEO (it comes
in Fetch responses, once replication lands).

Leader epoch checks (KIP-320): a request carrying `current_leader_epoch`
older than ours gets FENCED_LEADER_EPOCH (the client's metadata is stale),
newer gets UNKNOWN_LEADER_EPOCH (ours is stale; the client retries); -1
skips the check.

Follower bookkeeping (`followers`) is kept from the start so that
replication (follower fetchers, ISR expand/shrink through AlterPartition)
adds behaviour without reshaping this state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum

from kio.schema.errors import ErrorCode

from quorum.metadata import NO_LEADER, PartitionRegistration

NO_EPOCH = -1


class Role(Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    STOPPED = "stopped"


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower replica (Kafka's `Replica`)."""

    #: The follower's LEO: the fetch offset of its last Fetch (-1: unknown).
    log_end_offset: int = -1
    last_fetch_ms: int = -1
    #: Last time the follower had fetched up to the leader's LEO (for ISR shrink).
    last_caught_up_ms: int = -1


@dataclass(slots=True)
class PartitionState:
    topic: str
    partition: int
    topic_id: uuid.UUID
    #: This broker.
    broker_id: int
    role: Role = Role.FOLLOWER
    leader_id: int = NO_LEADER
    leader_epoch: int = NO_EPOCH
    partition_epoch: int = NO_EPOCH
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    log_end_offset: int = 0
    log_start_offset: int = 0
    high_watermark: int = 0
    min_insync_replicas: int = 1
    followers: dict[int, FollowerState] = field(default_factory=dict)

    # --- transitions ---------------------------------------------------

    def apply_registration(
        self, registration: PartitionRegistration, log_end_offset: int, checkpointed_high_watermark: int | None
    ) -> bool:
        """Adopt a new registration from the metadata image; return True if
        the HW moved. `checkpointed_high_watermark` seeds the HW of a replica
        that had none yet (broker restart)."""
        self.log_end_offset = log_end_offset
        same_epoch = registration.leader_epoch == self.leader_epoch
        self.replicas = registration.replicas
        self.isr = registration.isr
        self.partition_epoch = registration.partition_epoch
        self.leader_id = registration.leader
        becomes_leader = registration.leader == self.broker_id
        if becomes_leader and not (same_epoch and self.role is Role.LEADER):
            # A new leader term: forget what the previous term knew of the
            # followers (Kafka resets remote replica states on becomeLeader).
            self.followers = {r: FollowerState() for r in registration.replicas if r != self.broker_id}
        elif becomes_leader:
            for r in registration.replicas:
                if r != self.broker_id:
                    self.followers.setdefault(r, FollowerState())
            for r in list(self.followers):
                if r not in registration.replicas:
                    del self.followers[r]
        else:
            self.followers = {}
        self.role = Role.LEADER if becomes_leader else Role.FOLLOWER
        self.leader_epoch = registration.leader_epoch
        before = self.high_watermark
        if checkpointed_high_watermark is not None and checkpointed_high_watermark > self.high_watermark:
            self.high_watermark = checkpointed_high_watermark
        self.high_watermark = min(self.high_watermark, log_end_offset)
        if self.role is Role.LEADER:
            self.maybe_advance_high_watermark()
        return self.high_watermark != before

    def stop(self) -> None:
        """The replica left this broker; requests parked on it answer
        NOT_LEADER_OR_FOLLOWER when they look again."""
        self.role = Role.STOPPED
        self.followers = {}

    # --- events --------------------------------------------------------

    def on_leader_append(self, log_end_offset: int) -> bool:
        """The leader's log grew to `log_end_offset`; True if the HW moved."""
        assert self.role is Role.LEADER, f"{self.topic}-{self.partition}: append on a {self.role.value}"
        assert log_end_offset >= self.log_end_offset
        self.log_end_offset = log_end_offset
        return self.maybe_advance_high_watermark()

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> bool:
        """A follower fetched from `fetch_offset` (so it holds everything
        below); True if the HW moved."""
        follower = self.followers.get(replica_id)
        if follower is None:
            return False
        follower.log_end_offset = fetch_offset
        follower.last_fetch_ms = now_ms
        if fetch_offset >= self.log_end_offset:
            follower.last_caught_up_ms = now_ms
        return self.maybe_advance_high_watermark()

    def on_log_truncated(self, log_end_offset: int) -> None:
        """The local log was cut back (a follower truncating by leader epoch)."""
        assert self.role is Role.FOLLOWER
        self.log_end_offset = log_end_offset
        self.high_watermark = min(self.high_watermark, log_end_offset)

    def on_log_start_offset(self, log_start_offset: int) -> None:
        self.log_start_offset = log_start_offset

    def maybe_advance_high_watermark(self) -> bool:
        """HW = min LEO over the ISR, monotonic, held while the ISR is under
        `min.insync.replicas`. True if it moved."""
        if self.role is not Role.LEADER or len(self.isr) < self.min_insync_replicas:
            return False
        candidate = self.log_end_offset
        for replica in self.isr:
            if replica == self.broker_id:
                continue
            follower = self.followers.get(replica)
            if follower is None or follower.log_end_offset < 0:
                return False
            candidate = min(candidate, follower.log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # --- decisions -----------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def last_stable_offset(self) -> int:
        """The LSO: no transactions yet, so every record below the HW is stable."""
        return self.high_watermark

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """KIP-320's check of a client's `current_leader_epoch` (-1: none)."""
        if current_leader_epoch == NO_EPOCH or current_leader_epoch == self.leader_epoch:
            return ErrorCode.none
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        return ErrorCode.unknown_leader_epoch

    def produce_error(self, acks: int) -> ErrorCode:
        """Whether this replica may take a produce with `acks` now."""
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        if acks == -1 and len(self.isr) < self.min_insync_replicas:
            # Checked before the append, as Kafka does (NOT_ENOUGH_REPLICAS).
            return ErrorCode.not_enough_replicas
        return ErrorCode.none

    def acks_all_error(self, required_offset: int) -> ErrorCode | None:
        """The answer to an acks=all produce whose last offset is
        `required_offset - 1`: None while it must wait for the HW."""
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        if self.high_watermark >= required_offset:
            if len(self.isr) < self.min_insync_replicas:
                return ErrorCode.not_enough_replicas_after_append
            return ErrorCode.none
        return None

    def fetch_error(self, current_leader_epoch: int, replica_id: int = -1) -> ErrorCode:
        """Whether a Fetch or ListOffsets may read this replica now, checked
        in Kafka's order: the leader epoch first, then leadership. Consumers
        (`replica_id` -1) read the leader only (no KIP-392 follower fetching
        yet); a follower fetch must come from an assigned replica."""
        epoch_error = self.check_leader_epoch(current_leader_epoch)
        if epoch_error is not ErrorCode.none:
            return epoch_error
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        if replica_id >= 0 and replica_id not in self.followers:
            return ErrorCode.not_leader_or_follower
        return ErrorCode.none

    def fetch_upper_bound(self, read_committed: bool, from_follower: bool) -> int:
        """The offset reads stop before: the LEO for followers, the HW
        (read_uncommitted) or LSO (read_committed) for consumers."""
        if from_follower:
            return self.log_end_offset
        return self.last_stable_offset if read_committed else self.high_watermark
