"""What goes in and out of the replication core: plain values, no I/O.

The wire shell converts Kafka requests (kio entities) into these and back;
`broker.core.replication.alter_partition` does it for AlterPartition. Offsets are
Kafka offsets; `-1` means "unknown" wherever an int may be unknown, as on
the wire.

The messages built once per partition per Fetch (`ReplicaFetch`,
`LeaderUpdate`, `ReplicaFetchDecision` on the leader; `PartitionFetch`,
`PartitionFetchResult`, `FollowerAction` on the follower) are NamedTuples:
as immutable as a frozen dataclass, and built in less than half the time
(a frozen dataclass's `__init__` sets each field through
`object.__setattr__`: 1.4-2.7 us against 0.6-1.2 us here, a few us per
partition per fetch round on each side, thousands of partitions a round
in a 10,000-partition failover). The rest stay dataclasses.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from kio.schema.errors import ErrorCode

NO_EPOCH = -1
UNKNOWN_OFFSET = -1
NO_BROKER_EPOCH = -1


class LogView(Protocol):
    """The read-only, in-memory part of a replica's log the core consults.

    `storage.Log` is one. The core never appends, truncates or reads
    records: the shell does, and then tells the core what changed."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the leader epoch cache (-1: none)."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch's answer `(epoch, end_offset)`, see `storage.epoch_cache`."""
        ...


class EpochEndOffset(NamedTuple):
    """A leader epoch and the offset it ends at (exclusive): the Fetch
    response's `diverging_epoch`, OffsetsForLeaderEpoch's answer."""

    epoch: int
    end_offset: int


class TopicIdPartition(NamedTuple):
    topic_id: uuid.UUID
    partition: int


# --- leader side ---------------------------------------------------------


class ReplicaFetch(NamedTuple):
    """One partition of a follower's Fetch, as the leader receives it."""

    replica_id: int
    fetch_offset: int
    #: Epoch of the last batch in the follower's log (-1: empty log, or an
    #: old Fetch version without the field).
    last_fetched_epoch: int
    #: The leader epoch the follower believes current (-1: skip the check).
    current_leader_epoch: int
    #: The follower's broker epoch (Fetch v15 `replica_state.replica_epoch`,
    #: KIP-903); -1 when the request version does not carry it.
    broker_epoch: int = NO_BROKER_EPOCH
    #: The follower's log start offset (Fetch v5+; -1: unknown). DeleteRecords
    #: waits for the in-sync followers' to pass the deletion (the low watermark).
    log_start_offset: int = UNKNOWN_OFFSET


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerState:
    """An ISR member with the broker epoch the controller must check (-1: none)."""

    broker_id: int
    broker_epoch: int = NO_BROKER_EPOCH


@dataclasses.dataclass(frozen=True, slots=True)
class AlterPartitionProposal:
    """One partition's entry of an AlterPartition request (KIP-497).

    The shell batches the proposals of all partitions into one request
    (`alter_partition.build_request`) and hands each partition's answer back
    to `Partition.on_alter_partition_result` together with this proposal."""

    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[BrokerState, ...]
    #: "expand" or "shrink", for logs and tests.
    kind: str

    @property
    def isr(self) -> tuple[int, ...]:
        return tuple(b.broker_id for b in self.new_isr)


@dataclasses.dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """The controller's answer for one partition. `error` none: the
    partition's state after the request (which may be newer than ours)."""

    error: ErrorCode
    leader_id: int = -1
    leader_epoch: int = NO_EPOCH
    isr: tuple[int, ...] = ()
    partition_epoch: int = NO_EPOCH


class LeaderUpdate(NamedTuple):
    """What an event changed on a leader that the shell must act on.

    - `high_watermark_moved`: wake parked acks=all produces and consumer
      long polls of this partition (and checkpoint the HW in time);
    - `isr_changed`: the ISR the leader counts changed (wake parked
      produces: they may now fail NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    - `alter_partition`: send this to the controller.
    """

    high_watermark_moved: bool = False
    isr_changed: bool = False
    alter_partition: AlterPartitionProposal | None = None

    @property
    def wake(self) -> bool:
        return self.high_watermark_moved or self.isr_changed

    def __or__(self, other: LeaderUpdate) -> LeaderUpdate:
        assert self.alter_partition is None or other.alter_partition is None, "one proposal per event"
        return LeaderUpdate(
            self.high_watermark_moved or other.high_watermark_moved,
            self.isr_changed or other.isr_changed,
            self.alter_partition or other.alter_partition,
        )


NO_UPDATE = LeaderUpdate()


class ReplicaFetchDecision(NamedTuple):
    """The leader's answer to one partition of a follower's Fetch.

    With `error` none and no `diverging_epoch`, the shell reads
    `log.read(fetch_offset, max_bytes, max_offset=read_max_offset)` and
    sends it. Either way it sends `high_watermark` and `log_start_offset`,
    and acts on `update` (wake parked requests, send the AlterPartition)."""

    error: ErrorCode
    high_watermark: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset | None = None
    #: Offset to read from (-1: send no records).
    read_offset: int = UNKNOWN_OFFSET
    #: Upper bound of the read: the leader's log end offset (followers
    #: replicate uncommitted data; only consumers stop at the HW).
    read_max_offset: int = UNKNOWN_OFFSET
    update: LeaderUpdate = NO_UPDATE


# --- follower side -------------------------------------------------------


class PartitionFetch(NamedTuple):
    """One partition of the Fetch a follower sends to its leader."""

    key: TopicIdPartition
    topic: str
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int
    log_start_offset: int
    partition_max_bytes: int


#: Fetch session ids and epochs are positive int32s (KIP-227).
MAX_SESSION_EPOCH = (1 << 31) - 1


def next_session_epoch(epoch: int) -> int:
    """The session epoch after `epoch`, both sides' count: it wraps to 1
    after the largest (Kafka's FetchMetadata.nextEpoch)."""
    return 1 if epoch >= MAX_SESSION_EPOCH else epoch + 1


@dataclasses.dataclass(frozen=True, slots=True)
class FetchPlan:
    """A whole follower Fetch to one source broker (Kafka's ReplicaFetch)."""

    source_broker_id: int
    replica_id: int
    broker_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    #: The partitions the request names: every one of a full fetch, the
    #: changed ones of an incremental fetch (KIP-227).
    partitions: tuple[PartitionFetch, ...]
    #: 0 (and epoch 0: a full fetch asking for a session), or the session's id.
    session_id: int = 0
    session_epoch: int = 0
    #: Partitions an incremental fetch drops from its session.
    forgotten: tuple[PartitionFetch, ...] = ()
    #: Every partition of the fetch as the leader will know it after this
    #: request (for a full fetch, `partitions` by key): what a response
    #: partition is checked against.
    view: Mapping[TopicIdPartition, PartitionFetch] = dataclasses.field(default_factory=dict)


class PartitionFetchResult(NamedTuple):
    """One partition of the leader's Fetch response, as the follower got it."""

    error: ErrorCode
    high_watermark: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    #: None when the wire's `diverging_epoch.epoch` is -1 (its default: no divergence).
    diverging_epoch: EpochEndOffset | None = None
    #: Record batches (bytes-like; empty when none).
    records: bytes | memoryview | bytearray = b""


class FollowerAction(NamedTuple):
    """What the fetcher shell does with one partition's fetch result, in order:

    1. `truncate_to` set: `log.truncate_to(truncate_to)` (DivergingEpoch),
       and drop the leader epoch cache entries at or past it even when no
       record goes (Kafka's truncateTo does: an entry a leader assigned at
       its log end and never wrote to would otherwise stay, and the next
       Fetch would carry that epoch again, forever);
    2. `start_at` set: `log.truncate_fully_and_start_at(start_at)` (the
       leader's log start passed our log end);
    3. `records` non-empty: `log.append_as_follower(records)`;
    4. `leader_log_start_offset` above the log's: move the log start up to it;
    5. then, if `leader_high_watermark` is set, or the log was cut:
       `Partition.on_follower_log_changed(log.log_end_offset,
       leader_high_watermark)`.

    An action with nothing set means the result was stale or failed (the
    fetcher backs off by itself)."""

    key: TopicIdPartition
    truncate_to: int | None = None
    start_at: int | None = None
    records: bytes | memoryview | bytearray = b""
    leader_high_watermark: int | None = None
    error: ErrorCode = ErrorCode.none
    #: The leader's log start offset: a follower moves its own up to it
    #: (at most to its log end), so records deleted with DeleteRecords stay
    #: deleted on every replica, also after a leader change.
    leader_log_start_offset: int = UNKNOWN_OFFSET
