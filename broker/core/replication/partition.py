"""One partition replica on this broker: its role, epochs and high watermark (the front door of the core).

Theory of operation
-------------------
A `Partition` is what the broker shell holds per hosted replica. The shell
feeds it metadata (`apply_registration`, `update_eligibility`), appends
(`on_leader_append`), follower fetches it serves (`handle_replica_fetch`),
results of its own fetches as a follower (`on_follower_log_changed`),
controller answers (`on_alter_partition_result`) and time (`tick`); it
reads decisions back. It never touches the log, a socket or a clock.

Transitions (driven by the partition's registration in the metadata image):

    (new)    => Leader:   the image names this broker leader at leader_epoch
    (new)    => Follower: the image names another broker (or none) leader
    Follower => Leader:   a newer leader epoch names this broker; a new
                          `LeaderState` starts the epoch at the log end
                          offset (`RoleChange.epoch_start`, KIP-101)
    Leader   => Follower: a newer leader epoch names another broker (or none)
    Follower => Follower: a newer leader epoch: fetch from the new leader
                          (`RoleChange.follow`) within this one update
    Leader   => Leader:   same leader epoch, newer partition epoch: adopt the
                          ISR (an AlterPartition result, or a shrink the
                          controller made when it fenced a broker)
    any      => Stopped:  `stop()`; the shell drops the replica

A registration with an older leader epoch than ours is stale and ignored.

High watermark: on the leader, `LeaderState` owns it (see
`broker.core.replication.leader`). On a follower it is the leader's HW from the
last fetch, bounded by the follower's own LEO, and it is cut with the log on
truncation. A new leader starts from the HW it had as a follower (or from the
`replication-offset-checkpoint` after a restart), bounded by its LEO.

Unclean leader election (the topic's `unclean.leader.election.enable`) needs
nothing special here: the controller names a replica outside the ISR, it
starts its epoch at its own LEO, and every other replica truncates what it
has past that point through DivergingEpoch. Records acknowledged by the old
ISR and missing on the new leader are lost: that is the price of the option.

Consumers read only below `high_watermark`, read_committed ones below the
last stable offset (`fetch_upper_bound`; the open transactions come from
the log's producer state, which the shell sets as `transactions`); followers
serve no client reads (`fetch_error` answers NOT_LEADER_OR_FOLLOWER), as no
KIP-392 follower fetching is offered.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from kio.schema.errors import ErrorCode

from broker.core.replication.config import ReplicationConfig
from broker.core.replication.divergence import offset_for_leader_epoch
from broker.core.replication.leader import LeaderState
from broker.core.replication.messages import (
    NO_EPOCH,
    NO_UPDATE,
    AlterPartitionProposal,
    AlterPartitionResult,
    EpochEndOffset,
    LeaderUpdate,
    LogView,
    ReplicaFetch,
    ReplicaFetchDecision,
)
from quorum.metadata import NO_LEADER, MetadataImage, PartitionRegistration


class TransactionsView(Protocol):
    """What the LSO needs of the producer state (`storage.producer_state`)."""

    #: Whether any transaction is open or its marker above the HW.
    unstable: bool

    def last_stable_offset(self, high_watermark: int) -> int: ...


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    STOPPED = "stopped"


class RoleChange(NamedTuple):
    """What a metadata update asks of the shell, in this order:

    1. `epoch_start` set: `log.epoch_cache.assign(*epoch_start)` before any
       append in the new epoch;
    2. `follow` set: move the partition's fetching -- `(leader_id,
       leader_epoch)` to fetch from, or leader_id -1 to stop fetching
       (this broker leads, or the partition has no leader);
    3. act on `update` (wake parked requests, send an AlterPartition).

    A NamedTuple, as the replication messages built per partition are
    (`broker.core.replication.messages`): one is built per partition a metadata
    delta moves, 0.65 us against a frozen dataclass's 1.0 us."""

    role: Role
    epoch_start: tuple[int, int] | None = None
    follow: tuple[int, int] | None = None
    update: LeaderUpdate = NO_UPDATE


def eligible_brokers(image: MetadataImage) -> dict[int, int]:
    """Broker id -> broker epoch of every broker that may join an ISR:
    registered, unfenced and not in controlled shutdown (KIP-841)."""
    return {b.broker_id: b.epoch for b in image.brokers.values() if b.usable}


@dataclasses.dataclass(frozen=True, slots=True)
class PendingProduce:
    """An acks=all produce parked on one partition (Kafka's DelayedProduce)."""

    #: The batch's last offset + 1: the HW must reach it.
    required_offset: int
    #: The leader epoch the batch was appended in.
    leader_epoch: int
    deadline_ms: int


class Partition:
    """One hosted partition replica; see the module docstring."""

    def __init__(self, topic: str, partition: int, topic_id: uuid.UUID, broker_id: int,
                 config: ReplicationConfig | None = None, min_insync_replicas: int = 1) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.config = config or ReplicationConfig()
        self.min_insync_replicas = min_insync_replicas
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.leader_epoch = NO_EPOCH
        self.partition_epoch = NO_EPOCH
        self.replicas: tuple[int, ...] = ()
        #: The ISR as the metadata image has it (the leader's own view,
        #: with pending changes, is `leader.isr_state`).
        self.isr: tuple[int, ...] = ()
        self.leader: LeaderState | None = None
        self._high_watermark = 0
        self._seeded = False
        #: The partition's open transactions (the log's producer state), if any.
        self.transactions: TransactionsView | None = None

    # --- views -------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def high_watermark(self) -> int:
        return self.leader.high_watermark if self.leader is not None else self._high_watermark

    @property
    def last_stable_offset(self) -> int:
        """The LSO: the HW, or the first offset of the earliest transaction
        still open or whose marker the HW has not passed, if lower
        (`storage.producer_state` keeps them; the shell hands it over as
        `transactions`)."""
        txns = self.transactions
        if txns is None or not txns.unstable:
            return self.high_watermark
        return txns.last_stable_offset(self.high_watermark)

    # --- metadata ----------------------------------------------------------

    def apply_registration(self, registration: PartitionRegistration, log: LogView, now_ms: int, *,
                           eligible: Mapping[int, int], checkpointed_high_watermark: int | None = None) -> RoleChange:
        """Adopt the partition's registration from a new metadata image.
        `eligible` is `eligible_brokers(image)`; `checkpointed_high_watermark`
        seeds the HW of a replica just opened after a restart."""
        assert self.role is not Role.STOPPED, "a stopped partition takes no metadata"
        if not self._seeded:
            self._seeded = True
            if checkpointed_high_watermark is not None:
                self._high_watermark = checkpointed_high_watermark
        self._high_watermark = min(self._high_watermark, log.log_end_offset)
        if registration.leader_epoch < self.leader_epoch:
            return RoleChange(self.role)  # stale metadata
        same_epoch = registration.leader_epoch == self.leader_epoch
        self.replicas = registration.replicas
        self.isr = registration.isr
        self.partition_epoch = registration.partition_epoch
        self.leader_id = registration.leader
        self.leader_epoch = registration.leader_epoch
        if registration.leader == self.broker_id:
            if same_epoch and self.leader is not None:
                self.leader.update_eligibility(eligible)
                update = self.leader.apply_registration(registration.replicas, registration.isr,
                                                        registration.partition_epoch, now_ms)
                return RoleChange(Role.LEADER, update=update)
            return self._become_leader(registration, log, now_ms, eligible)
        was_leader = self.leader is not None
        if was_leader:
            self._high_watermark = self.leader.high_watermark
            self.leader = None
        self.role = Role.FOLLOWER
        if same_epoch and not was_leader:
            return RoleChange(Role.FOLLOWER)
        # A new leader epoch (or leadership lost): fetch from the new leader
        # at once; with no leader, stop fetching until there is one.
        return RoleChange(Role.FOLLOWER, follow=(registration.leader, registration.leader_epoch),
                          update=LeaderUpdate(isr_changed=was_leader))

    def _become_leader(self, registration: PartitionRegistration, log: LogView, now_ms: int,
                       eligible: Mapping[int, int]) -> RoleChange:
        if self.leader is not None:
            # Leader again at a newer epoch: keep the HW of the last term.
            self._high_watermark = self.leader.high_watermark
        log_end = log.log_end_offset
        self.leader = LeaderState(
            topic_id=self.topic_id, partition=self.partition, broker_id=self.broker_id,
            leader_epoch=registration.leader_epoch, partition_epoch=registration.partition_epoch,
            replicas=registration.replicas, isr=registration.isr, log_end_offset=log_end,
            high_watermark=self._high_watermark, min_insync_replicas=self.min_insync_replicas,
            eligible=eligible, config=self.config, now_ms=now_ms)
        self.role = Role.LEADER
        epoch_start = None
        if log.latest_epoch < registration.leader_epoch:
            # KIP-101: the new epoch starts at our log end, so a follower's
            # records of older epochs past it are found to diverge.
            epoch_start = (registration.leader_epoch, log_end)
        update = LeaderUpdate(isr_changed=True, high_watermark_moved=self.leader.on_append(log_end).high_watermark_moved)
        return RoleChange(Role.LEADER, epoch_start=epoch_start, follow=(NO_LEADER, registration.leader_epoch),
                          update=update)

    def update_eligibility(self, eligible: Mapping[int, int]) -> None:
        """Call with `eligible_brokers(image)` when brokers were fenced,
        unfenced, shut down or re-registered (KIP-841)."""
        if self.leader is not None:
            self.leader.update_eligibility(eligible)

    def set_min_insync_replicas(self, min_insync_replicas: int) -> LeaderUpdate:
        self.min_insync_replicas = min_insync_replicas
        if self.leader is None:
            return NO_UPDATE
        return self.leader.set_min_insync_replicas(min_insync_replicas)

    def stop(self) -> None:
        """The replica left this broker (or the topic was deleted)."""
        self.role = Role.STOPPED
        if self.leader is not None:
            self._high_watermark = self.leader.high_watermark
        self.leader = None

    # --- leader events -------------------------------------------------------

    def on_leader_append(self, log_end_offset: int, now_ms: int = -1) -> LeaderUpdate:
        assert self.leader is not None, f"{self.topic}-{self.partition}: append on a {self.role.value}"
        return self.leader.on_append(log_end_offset, now_ms)

    def handle_replica_fetch(self, fetch: ReplicaFetch, log: LogView, now_ms: int) -> ReplicaFetchDecision:
        """One partition of a follower's Fetch: epochs, leadership, then the
        leader's validation and accounting."""
        error = self.fetch_error(fetch.current_leader_epoch, fetch.replica_id)
        if error != ErrorCode.none or self.leader is None:
            return ReplicaFetchDecision(error, self.high_watermark, log.log_start_offset)
        return self.leader.handle_replica_fetch(fetch, log, now_ms)

    def on_alter_partition_result(self, proposal: AlterPartitionProposal, result: AlterPartitionResult,
                                  now_ms: int) -> LeaderUpdate:
        if self.leader is None or proposal.leader_epoch != self.leader.leader_epoch:
            return NO_UPDATE
        return self.leader.on_alter_partition_result(proposal, result, now_ms)

    def tick(self, now_ms: int) -> LeaderUpdate:
        return self.leader.tick(now_ms) if self.leader is not None else NO_UPDATE

    def next_deadline_ms(self) -> int | None:
        return self.leader.next_deadline_ms() if self.leader is not None else None

    # --- follower events -----------------------------------------------------

    def on_follower_log_changed(self, log_end_offset: int, leader_high_watermark: int | None) -> bool:
        """After the fetcher appended or truncated: the follower HW is the
        leader's, bounded by our LEO. True if it moved."""
        assert self.role is Role.FOLLOWER, f"{self.topic}-{self.partition}: follower event on a {self.role.value}"
        before = self._high_watermark
        if leader_high_watermark is not None:
            self._high_watermark = leader_high_watermark
        self._high_watermark = min(self._high_watermark, log_end_offset)
        return self._high_watermark != before

    # --- client requests -------------------------------------------------------

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """KIP-320's check of a request's `current_leader_epoch` (-1: none)."""
        if current_leader_epoch == NO_EPOCH or current_leader_epoch == self.leader_epoch:
            return ErrorCode.none
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        return ErrorCode.unknown_leader_epoch

    def fetch_error(self, current_leader_epoch: int, replica_id: int = -1) -> ErrorCode:
        """Whether a Fetch (or ListOffsets, OffsetsForLeaderEpoch) may read
        this replica: the leader epoch first, then leadership, then (for a
        follower's fetch) that the sender is an assigned replica."""
        error = self.check_leader_epoch(current_leader_epoch)
        if error != ErrorCode.none:
            return error
        if self.leader is None:
            return ErrorCode.not_leader_or_follower
        if replica_id >= 0 and replica_id not in self.leader.followers:
            return ErrorCode.not_leader_or_follower
        return ErrorCode.none

    def fetch_upper_bound(self, read_committed: bool) -> int:
        """Consumer reads stop before this offset: the HW, or the LSO for
        read_committed. A follower (or a replica reading its
        own log) reads up to the log end offset instead, which the
        handlers take from the log itself."""
        return self.last_stable_offset if read_committed else self.high_watermark

    def produce_error(self, acks: int) -> ErrorCode:
        """Whether this replica may append a produce with `acks` now."""
        if self.leader is None:
            return ErrorCode.not_leader_or_follower
        return self.leader.append_error(acks)

    def acks_all_status(self, required_offset: int, append_leader_epoch: int) -> ErrorCode | None:
        """The answer to an acks=all produce appended in `append_leader_epoch`
        whose batch ends before `required_offset`; None while it waits. A
        leadership change since the append fails it: the batch may have been
        truncated by a leader of another epoch."""
        if self.leader is None or self.leader.leader_epoch != append_leader_epoch:
            return ErrorCode.not_leader_or_follower
        return self.leader.acks_all_status(required_offset)

    def produce_outcome(self, pending: PendingProduce, now_ms: int) -> ErrorCode | None:
        """`acks_all_status`, or REQUEST_TIMED_OUT once `pending.deadline_ms` passed."""
        status = self.acks_all_status(pending.required_offset, pending.leader_epoch)
        if status is None and now_ms >= pending.deadline_ms:
            return ErrorCode.request_timed_out
        return status

    def offset_for_leader_epoch(self, current_leader_epoch: int, leader_epoch: int,
                                log: LogView, replica_id: int = -1) -> tuple[ErrorCode, EpochEndOffset]:
        """OffsetsForLeaderEpoch on this replica (KIP-101/279/320)."""
        error = self.fetch_error(current_leader_epoch, replica_id)
        if error != ErrorCode.none:
            return error, EpochEndOffset(NO_EPOCH, -1)
        return ErrorCode.none, offset_for_leader_epoch(log, leader_epoch)
