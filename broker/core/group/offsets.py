"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete, retention (pure).

Theory of operation
-------------------
Each group's committed offsets are one OffsetCommit record per partition
in `__consumer_offsets` (a tombstone deletes one). The shard applies a
commit to its state the moment it emits the record (so a later request
on the same shard, a fetch included, sees it), and the commit is answered
once the record is committed (the shell's rule for every response, see
`CoordinatorResult`): as Kafka's coordinator runtime, which applies writes
to its in-memory state at once and completes them at the high watermark.
A fetch answered after a commit of the same group on the same shard thus
always sees that commit, and no answer ever shows an offset that could
still be lost with a failover.

Who may commit (Kafka's `ClassicGroup.validateOffsetCommit`):

- generation < 0 to an empty or unknown group: a "simple" consumer or an
  admin (`assign()` users, `kafka-consumer-groups --reset-offsets`). An
  unknown group is created as an empty group without protocol type.
- otherwise the member must be current (UNKNOWN_MEMBER_ID /
  FENCED_INSTANCE_ID) and of the current generation (ILLEGAL_GENERATION);
  during the sync phase the answer is REBALANCE_IN_PROGRESS. A commit to a
  group that does not exist with generation >= 0 is ILLEGAL_GENERATION
  (GROUP_ID_NOT_FOUND from OffsetCommit v9).

Retention (`offsets.retention.minutes`, KIP-211), swept every
`offsets.retention.check.interval.ms`: the offsets of an empty group
expire once the group has been empty that long (measured from when it
became empty); the offsets of a simple group, and of topics a stable
consumer group no longer subscribes to, expire that long after their
commit. An offset committed with an explicit retention time (OffsetCommit
v2-v4) expires at its own timestamp. An empty group whose offsets are all
gone is deleted (a group tombstone).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from broker.core.group import rebalance
from broker.core.group.classic_group import ClassicGroup, GroupState
from broker.core.group.effects import Effects, RequestContext
from broker.core.group.records import OffsetCommitValue, group_metadata_record, offset_commit_record
from broker.core.group.responses import (
    FetchedGroup,
    FetchedPartition,
    offset_commit_response,
    txn_offset_commit_response,
    offset_delete_response,
    offset_fetch_groups,
    offset_fetch_response,
    request_version,
    response_module,
)
from common.wire.codec import duration_ms

if TYPE_CHECKING:
    from broker.core.group.shard import GroupCoordinatorShard

#: OffsetCommit v9 answers GROUP_ID_NOT_FOUND where older versions said
#: ILLEGAL_GENERATION.
GROUP_ID_NOT_FOUND_COMMIT_VERSION = 9


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    #: -1 unless the commit asked for its own retention (OffsetCommit v2-v4).
    expire_timestamp_ms: int = -1
    #: Where the commit's record is in `__consumer_offsets`: its offset when
    #: replayed, a position in the shard's write order when written (only
    #: the order matters). A transactional commit materialised by its COMMIT
    #: marker replaces only an older one (Kafka's `recordOffset` rule), so
    #: a plain OffsetCommit that landed after it is kept. Not in the record.
    record_offset: int = field(default=-1, compare=False)

    @classmethod
    def from_value(cls, value: OffsetCommitValue) -> OffsetAndMetadata:
        return cls(value.offset, value.leader_epoch, value.metadata, value.commit_timestamp_ms,
                   value.expire_timestamp_ms)

    def to_value(self) -> OffsetCommitValue:
        return OffsetCommitValue(self.offset, self.metadata, self.commit_timestamp_ms, self.leader_epoch,
                                 self.expire_timestamp_ms)


@dataclass
class OffsetStore:
    """group id -> (topic, partition) -> offset."""

    by_group: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = field(default_factory=dict)

    def get(self, group_id: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        return self.by_group.get(group_id, {}).get((topic, partition))

    def put(self, group_id: str, topic: str, partition: int, offset: OffsetAndMetadata) -> None:
        self.by_group.setdefault(group_id, {})[(topic, partition)] = offset

    def remove(self, group_id: str, topic: str, partition: int) -> None:
        offsets = self.by_group.get(group_id)
        if offsets is not None:
            offsets.pop((topic, partition), None)
            if not offsets:
                del self.by_group[group_id]

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        return self.by_group.get(group_id, {})

    def items(self, group_id: str) -> Iterator[tuple[tuple[str, int], OffsetAndMetadata]]:
        return iter(sorted(self.of_group(group_id).items()))


# --- OffsetCommit --------------------------------------------------------------------


def validate_offset_commit(group: ClassicGroup, member_id: str, instance_id: str | None,
                           generation_id: int) -> ErrorCode | None:
    if generation_id < 0 and group.state is GroupState.EMPTY:
        return None
    if generation_id >= 0 or member_id or instance_id is not None:
        error = group.validate_member(member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
    elif group.state is not GroupState.EMPTY:
        return ErrorCode.unknown_member_id
    if group.state is GroupState.COMPLETING_REBALANCE:
        # The member has its new generation but not yet its assignment.
        return ErrorCode.rebalance_in_progress
    return None


def handle_offset_commit(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    mod = response_module(request)
    topics = request.topics

    def fail(error: ErrorCode) -> None:
        fx.respond(ctx.token, offset_commit_response(mod, (
            (t.name, ((p.partition_index, error) for p in t.partitions)) for t in topics)))

    group_id = request.group_id
    if not group_id:
        return fail(ErrorCode.invalid_group_id)
    generation_id = request.generation_id_or_member_epoch
    member_id = request.member_id
    instance_id = getattr(request, "group_instance_id", None)
    consumer_group = shard.consumer.groups.get(group_id)
    group = shard.groups.get(group_id)
    created = False
    if consumer_group is not None and group is None:
        # KIP-848: a consumer-protocol member commits with its member epoch.
        error = shard.consumer.validate_offset_commit(consumer_group, member_id, generation_id)
        if error is not None:
            return fail(error)
    elif group is None:
        if generation_id >= 0:
            return fail(ErrorCode.group_id_not_found if request_version(request) >= GROUP_ID_NOT_FOUND_COMMIT_VERSION
                        else ErrorCode.illegal_generation)
        group = shard.groups[group_id] = ClassicGroup(group_id)
        created = True
    error = None if group is None else validate_offset_commit(group, member_id, instance_id, generation_id)
    if error is not None:
        return fail(error)
    if group is not None and group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
        # A commit is a sign of life: it keeps the member's session.
        rebalance.reschedule_heartbeat(group.members[member_id], fx.now_ms)
    retention_ms = _retention_ms(getattr(request, "retention_time", None))
    expire_ms = -1 if retention_ms < 0 else fx.now_ms + retention_ms
    answers = []
    for topic in topics:
        parts = []
        for p in topic.partitions:
            metadata = p.committed_metadata or ""
            if len(metadata.encode("utf-8")) > shard.config.offset_metadata_max_bytes:
                parts.append((p.partition_index, ErrorCode.offset_metadata_too_large))
                continue
            offset = OffsetAndMetadata(p.committed_offset, getattr(p, "committed_leader_epoch", -1), metadata,
                                       fx.now_ms, expire_ms, shard.next_record_position())
            shard.offsets.put(group_id, topic.name, p.partition_index, offset)
            fx.records.append(offset_commit_record(group_id, topic.name, p.partition_index, offset.to_value()))
            parts.append((p.partition_index, ErrorCode.none))
        answers.append((topic.name, parts))
    if created and not shard.offsets.of_group(group_id):
        del shard.groups[group_id]  # nothing was committed: no simple group either
    fx.respond(ctx.token, offset_commit_response(mod, answers))
    return None


def _retention_ms(value: Any) -> int:
    if value is None:
        return -1
    ms = duration_ms(value)
    return -1 if ms < 0 else ms


# --- OffsetFetch ---------------------------------------------------------------------


def fetch_group(shard: GroupCoordinatorShard, group_id: str,
                topics: tuple[tuple[str, tuple[int, ...]], ...] | None, require_stable: bool = False) -> FetchedGroup:
    """One group's committed offsets: the requested partitions (-1 where
    none is committed, also for an unknown group), or all of them. With
    `require_stable` (KIP-447), a partition with a transactional commit
    still pending answers UNSTABLE_OFFSET_COMMIT: the client retries
    until the transaction ends."""
    if not group_id:
        return FetchedGroup(group_id, error=ErrorCode.invalid_group_id)
    check = require_stable and bool(shard.pending_txn_offsets)

    def fetched(topic: str, partition: int, o: OffsetAndMetadata | None) -> FetchedPartition:
        if check and shard.has_pending_txn_offset(group_id, topic, partition):
            return FetchedPartition(partition, error=ErrorCode.unstable_offset_commit)
        return _fetched(partition, o)

    if topics is None:
        by_topic: dict[str, list[FetchedPartition]] = {}
        for (topic, partition), o in shard.offsets.items(group_id):
            by_topic.setdefault(topic, []).append(fetched(topic, partition, o))
        return FetchedGroup(group_id, tuple((t, tuple(parts)) for t, parts in by_topic.items()))
    answer = []
    for topic, partitions in topics:
        answer.append((topic, tuple(fetched(topic, p, shard.offsets.get(group_id, topic, p)) for p in partitions)))
    return FetchedGroup(group_id, tuple(answer))


def _fetched(partition: int, offset: OffsetAndMetadata | None) -> FetchedPartition:
    if offset is None:
        return FetchedPartition(partition)
    return FetchedPartition(partition, offset.offset, offset.leader_epoch, offset.metadata)


def handle_offset_fetch(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    require_stable = bool(getattr(request, "require_stable", False))
    groups = [fetch_group(shard, g, topics, require_stable) for g, topics in offset_fetch_groups(request)]
    fx.respond(ctx.token, offset_fetch_response(response_module(request), groups))


# --- TxnOffsetCommit (KIP-98, KIP-447) -----------------------------------------------


def validate_txn_offset_commit(group: ClassicGroup | None, member_id: str, instance_id: str | None,
                               generation_id: int) -> ErrorCode | None:
    """Kafka's checks of a TxnOffsetCommit: a member id or a generation,
    when the producer sends them (v3+, KIP-447), must be the group's
    current ones, so a zombie of an older generation cannot commit offsets
    for partitions now assigned elsewhere."""
    if group is not None and instance_id is not None:
        holder = group.static_members.get(instance_id)
        if holder is not None and holder != member_id:
            return ErrorCode.fenced_instance_id
    if member_id and (group is None or member_id not in group.members):
        return ErrorCode.unknown_member_id
    if generation_id >= 0 and generation_id != (group.generation_id if group is not None else 0):
        return ErrorCode.illegal_generation
    return None


def handle_txn_offset_commit(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    """Offsets committed inside a transaction: written at once as
    transactional records of the producer (`Effects.txn_records`), kept
    pending until the producer's marker lands on this partition
    (`GroupCoordinatorShard.complete_transaction`): COMMIT makes them the
    group's committed offsets, ABORT drops them."""
    mod = response_module(request)
    topics = request.topics

    def fail(error: ErrorCode) -> None:
        fx.respond(ctx.token, txn_offset_commit_response(mod, (
            (t.name, ((p.partition_index, error) for p in t.partitions)) for t in topics)))

    group_id = request.group_id
    if not group_id:
        return fail(ErrorCode.invalid_group_id)
    error = validate_txn_offset_commit(shard.groups.get(group_id), getattr(request, "member_id", ""),
                                       getattr(request, "group_instance_id", None),
                                       getattr(request, "generation_id", -1))
    if error is not None:
        return fail(error)
    producer_id, producer_epoch = request.producer_id, request.producer_epoch
    pending = shard.pending_txn_offsets.setdefault(producer_id, {}).setdefault(group_id, {})
    records = []
    answers = []
    for topic in topics:
        parts = []
        for p in topic.partitions:
            metadata = p.committed_metadata or ""
            if len(metadata.encode("utf-8")) > shard.config.offset_metadata_max_bytes:
                parts.append((p.partition_index, ErrorCode.offset_metadata_too_large))
                continue
            offset = OffsetAndMetadata(p.committed_offset, getattr(p, "committed_leader_epoch", -1), metadata,
                                       fx.now_ms, record_offset=shard.next_record_position())
            pending[(topic.name, p.partition_index)] = offset
            records.append(offset_commit_record(group_id, topic.name, p.partition_index, offset.to_value()))
            parts.append((p.partition_index, ErrorCode.none))
        answers.append((topic.name, parts))
    if records:
        fx.txn_records.append((producer_id, producer_epoch, tuple(records)))
    elif not pending:
        del shard.pending_txn_offsets[producer_id][group_id]
        if not shard.pending_txn_offsets[producer_id]:
            del shard.pending_txn_offsets[producer_id]
    fx.respond(ctx.token, txn_offset_commit_response(mod, answers))
    return None


# --- OffsetDelete -------------------------------------------------------------------


def handle_offset_delete(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    mod = response_module(request)
    group_id = request.group_id
    if not group_id:
        return fx.respond(ctx.token, offset_delete_response(mod, ErrorCode.invalid_group_id))
    group = shard.groups.get(group_id)
    if group is None:
        return fx.respond(ctx.token, offset_delete_response(mod, ErrorCode.group_id_not_found))
    if group.state is not GroupState.EMPTY and not group.uses_consumer_protocol():
        # Only a consumer group's subscriptions say which offsets are unused.
        return fx.respond(ctx.token, offset_delete_response(mod, ErrorCode.non_empty_group))
    answers = []
    for topic in request.topics:
        if group.is_subscribed_to_topic(topic.name):
            answers.append((topic.name, [(p.partition_index, ErrorCode.group_subscribed_to_topic)
                                         for p in topic.partitions]))
            continue
        for p in topic.partitions:
            if shard.offsets.get(group_id, topic.name, p.partition_index) is not None:
                shard.remove_offset(group_id, topic.name, p.partition_index)
                fx.records.append(offset_commit_record(group_id, topic.name, p.partition_index, None))
        answers.append((topic.name, [(p.partition_index, ErrorCode.none) for p in topic.partitions]))
    return fx.respond(ctx.token, offset_delete_response(mod, ErrorCode.none, answers))


# --- retention ------------------------------------------------------------------------


def sweep_expired(shard: GroupCoordinatorShard, fx: Effects) -> None:
    """Tombstone expired offsets, then delete the empty groups left with
    no offsets (Kafka's `cleanupGroupMetadata`)."""
    for group_id in sorted(shard.groups):
        group = shard.groups[group_id]
        if _expire_offsets(shard, group, fx) and group.state is GroupState.EMPTY and not group.pending_join_members:
            # (Kafka would also delete a group whose first member holds a
            # KIP-394 pending id; keeping it spares that member a retry.)
            fx.records.append(group_metadata_record(group_id, None))
            del shard.groups[group_id]
    for group_id in sorted(shard.consumer.groups):
        # An empty consumer-protocol group: its offsets expire by commit
        # time, as a simple group's do; with none left, the group goes.
        if shard.consumer.groups[group_id].members or group_id in shard.groups:
            continue
        if _expire_offsets(shard, ClassicGroup(group_id), fx):
            shard.consumer.delete_group(group_id, fx)


def _expire_offsets(shard: GroupCoordinatorShard, group: ClassicGroup, fx: Effects) -> bool:
    """Tombstone the group's expired offsets; whether none is left."""
    offsets = list(shard.offsets.items(group.group_id))
    if not offsets:
        return True
    if group.protocol_type:
        if group.state is GroupState.EMPTY:
            def base_ms(o: OffsetAndMetadata) -> int:
                stamp = group.current_state_timestamp_ms
                return stamp if stamp >= 0 else o.commit_timestamp_ms
        elif (group.uses_consumer_protocol() and group.subscribed_topics is not None
              and group.state is GroupState.STABLE):
            def base_ms(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp_ms
        else:
            return False
    else:
        def base_ms(o: OffsetAndMetadata) -> int:
            return o.commit_timestamp_ms
    retention_ms = shard.config.offsets_retention_ms
    all_expired = True
    for (topic, partition), o in offsets:
        if group.is_subscribed_to_topic(topic):
            all_expired = False
            continue
        if o.expire_timestamp_ms >= 0:
            expired = fx.now_ms >= o.expire_timestamp_ms
        else:
            expired = fx.now_ms - base_ms(o) >= retention_ms
        if expired:
            shard.remove_offset(group.group_id, topic, partition)
            fx.records.append(offset_commit_record(group.group_id, topic, partition, None))
        else:
            all_expired = False
    return all_expired
