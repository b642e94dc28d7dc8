"""The group coordinator of one `__consumer_offsets` partition (pure core).

Theory of operation
-------------------
A `GroupCoordinatorShard` holds every group whose id hashes to its
partition (`partition_for_group`) and those groups' committed offsets,
like Kafka's `GroupCoordinatorShard`. It does no I/O and reads no clock:
the shell gives it requests (kio entities of any supported version) and
the time, and gets back a `CoordinatorResult` each time.

Life of a shard (the shell drives it; see `broker.core.group` for the wiring):

    (new)   => loading: this broker became leader of the partition; the
                        shell calls `replay(key, value)` for every record
                        of the partition's log, in offset order
    loading => active:  `on_loaded(now_ms)` starts every loaded member's
                        session and the retention sweep
    active  => (gone):  leadership moved or an append failed; `unload()`
                        answers every parked request NOT_COORDINATOR and
                        the shell drops the shard (a new leader replays)

While loading, requests are answered COORDINATOR_LOAD_IN_PROGRESS (a
Heartbeat gets NONE, as Kafka does, so that members do not rejoin just
because their coordinator moved).

Writes and their answers: a step that changes durable state emits the
records at once and applies them to the in-memory state at once; the
responses of the step (and of every later step) go out only once the
records are committed. So the shell appends each result's records
straight away, in order, and holds the responses behind the partition's
high watermark. Replay rebuilds exactly the durable part of that state:
groups as of their last GroupMetadata record (Stable or Empty, with
sessions restarted) and every committed offset.
"""

from __future__ import annotations

from datetime import timedelta

import dataclasses

import random
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from broker.core.group import consumer_group, consumer_records, join, membership, migration, offsets, rebalance
from broker.core.group.classic_group import ClassicGroup, GroupState, Member
from broker.core.group.config import GroupCoordinatorConfig
from broker.core.group.effects import CoordinatorResult, Effects, RequestContext
from broker.core.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    decode_record,
    group_metadata_record,
    offset_commit_record,
)
from broker.core.group.responses import (
    DescribedGroup,
    DescribedMember,
    ListedGroup,
    delete_groups_response,
    describe_groups_response,
    error_response,
    heartbeat_response,
    list_groups_response,
    request_version,
    response_module,
)
from common.errors import RaftkaError

#: DescribeGroups v6 (KIP-1043) reports an unknown group as GROUP_ID_NOT_FOUND.
DESCRIBE_GROUP_NOT_FOUND_VERSION = 6
#: ListGroups type filter value of classic groups (case-insensitive, KIP-848).
CLASSIC_GROUP_TYPE = "classic"
CONSUMER_GROUP_TYPE = "consumer"


class NotAGroupRequestError(RaftkaError):
    """A request that is not a group coordinator API reached a shard: route
    only the API keys of `GROUP_API_VERSIONS` to `GroupCoordinatorShard.handle`."""


class GroupCoordinatorShard:
    """The groups and offsets of one `__consumer_offsets` partition."""

    def __init__(self, partition: int, config: GroupCoordinatorConfig, rng: random.Random) -> None:
        self.partition = partition
        self.config = config
        #: Draws member ids; seeded by the caller, so runs replay exactly.
        self.rng = rng
        self.groups: dict[str, ClassicGroup] = {}
        self.offsets = offsets.OffsetStore()
        #: KIP-848 consumer-protocol groups (ConsumerGroupHeartbeat).
        self.consumer = self._consumer_groups()
        #: name -> (topic id, partitions) of the cluster's topics; the shell
        #: sets it from its metadata image before each step.
        self.topics: dict = {}
        self.loaded = False
        #: Rebalances completed here, classic and consumer groups (metrics; kept across unloads).
        self.rebalances = 0
        self.consumer_rebalances = 0
        self._next_sweep_ms: int | None = None
        self._handlers: dict[int, Callable[[Any, RequestContext, Any, Effects], None]] = {
            8: offsets.handle_offset_commit,
            9: offsets.handle_offset_fetch,
            11: _classic(join.handle_join_group, migration.join),
            12: _classic(membership.handle_heartbeat, migration.heartbeat),
            13: _classic(membership.handle_leave_group, migration.leave),
            14: _classic(membership.handle_sync_group, migration.sync),
            15: _handle_describe_groups,
            16: _handle_list_groups,
            42: _handle_delete_groups,
            47: offsets.handle_offset_delete,
            28: offsets.handle_txn_offset_commit,
            68: _handle_consumer_group_heartbeat,
            69: _handle_consumer_group_describe,
        }
        #: Transactional offset commits not yet ended by a marker:
        #: producer id -> group -> (topic, partition) -> offset.
        self.pending_txn_offsets: dict[int, dict[str, dict[tuple[str, int], offsets.OffsetAndMetadata]]] = {}
        #: The `record_offset` of the next offset record (`next_record_position`).
        self._next_position = 0

    # --- loading -------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, producer_id: int = -1, record_offset: int | None = None) -> None:
        """Apply one stored record (in log order) while loading.
        `producer_id` >= 0: the record is in a transactional batch of that
        producer (a TxnOffsetCommit), pending until its marker.
        `record_offset`: the record's offset in the partition."""
        assert not self.loaded, "replay is for loading; a loaded shard changes only through its own steps"
        if record_offset is not None:
            self._next_position = max(self._next_position, record_offset + 1)
        consumer_record = consumer_records.decode(key, value)
        if consumer_record is not None:
            self.consumer.replay(*consumer_record)
            return
        decoded = decode_record(key, value)
        if decoded is None:
            return
        record_key, record_value = decoded
        if isinstance(record_key, OffsetCommitKey):
            group_id = record_key.group
            position = self.next_record_position() if record_offset is None else record_offset
            if producer_id >= 0:
                if record_value is not None:
                    self.pending_txn_offsets.setdefault(producer_id, {}).setdefault(group_id, {})[
                        (record_key.topic, record_key.partition)] = dataclasses.replace(
                            offsets.OffsetAndMetadata.from_value(record_value), record_offset=position)
                return
            if record_value is None:
                self.remove_offset(group_id, record_key.topic, record_key.partition)
                return
            if group_id not in self.groups and group_id not in self.consumer.groups:
                # Offsets without group metadata: a simple consumer's group.
                self.groups[group_id] = ClassicGroup(group_id)
            self.offsets.put(group_id, record_key.topic, record_key.partition, dataclasses.replace(
                offsets.OffsetAndMetadata.from_value(record_value), record_offset=position))
            return
        assert isinstance(record_key, GroupMetadataKey)
        if record_value is None:
            self.groups.pop(record_key.group, None)
        else:
            self.groups[record_key.group] = _group_from_record(record_key.group, record_value)

    def complete_transaction(self, producer_id: int, commit: bool) -> None:
        """A COMMIT or ABORT marker of `producer_id` landed on this
        partition (while loading: replayed, in log order): its pending
        transactional offsets become the groups' committed offsets, or
        are dropped. Writes nothing: the offset records are in the log
        already and the marker decides what they mean."""
        pending = self.pending_txn_offsets.pop(producer_id, None)
        if not pending or not commit:
            return
        for group_id, by_partition in pending.items():
            if group_id not in self.groups and group_id not in self.consumer.groups:
                self.groups[group_id] = ClassicGroup(group_id)
            for (topic, partition), offset in by_partition.items():
                current = self.offsets.get(group_id, topic, partition)
                # Kafka keeps the newer commit when plain and transactional
                # ones mix: a plain OffsetCommit written after this
                # transaction's offsets (while it was open) stays.
                if current is None or offset.record_offset > current.record_offset:
                    self.offsets.put(group_id, topic, partition, offset)

    def next_record_position(self) -> int:
        """The order of an offset record written now, after every record
        replayed or written before (`OffsetAndMetadata.record_offset`)."""
        position = self._next_position
        self._next_position += 1
        return position

    def remove_offset(self, group_id: str, topic: str, partition: int) -> None:
        """An offset tombstone (OffsetDelete, expiry): the committed offset
        goes, and so do the open transactions' pending offsets of that
        partition (as Kafka's coordinator does): a commit of those
        transactions does not bring a deleted offset back."""
        self.offsets.remove(group_id, topic, partition)
        for producer_id in list(self.pending_txn_offsets):
            by_group = self.pending_txn_offsets[producer_id]
            by_partition = by_group.get(group_id)
            if by_partition is not None:
                by_partition.pop((topic, partition), None)
                if not by_partition:
                    del by_group[group_id]
            if not by_group:
                del self.pending_txn_offsets[producer_id]

    def has_pending_txn_offset(self, group_id: str, topic: str, partition: int) -> bool:
        return any((topic, partition) in by_group.get(group_id, ())
                   for by_group in self.pending_txn_offsets.values())

    def on_loaded(self, now_ms: int) -> None:
        """Loading is over: sessions of loaded members start now."""
        assert not self.loaded, "on_loaded is called once"
        self.loaded = True
        for group in self.groups.values():
            for member in group.members.values():
                rebalance.reschedule_heartbeat(member, now_ms)
        self.consumer.on_loaded(now_ms)
        self._next_sweep_ms = now_ms + self.config.offsets_retention_check_interval_ms

    # --- steps ---------------------------------------------------------------

    def handle(self, ctx: RequestContext, request: Any, now_ms: int) -> CoordinatorResult:
        """One group API request (any supported version)."""
        handler = self._handlers.get(getattr(type(request), "__api_key__", None))
        if handler is None or type(request).__name__.endswith("Response"):
            raise NotAGroupRequestError(f"{type(request).__name__} is not a group coordinator request")
        fx = Effects(now_ms)
        if not self.loaded:
            if type(request).__name__ == "HeartbeatRequest":
                fx.respond(ctx.token, heartbeat_response(response_module(request), ErrorCode.none))
            else:
                fx.respond(ctx.token, error_response(request, ErrorCode.coordinator_load_in_progress))
            return fx.result()
        handler(self, ctx, request, fx)
        self.rebalances += fx.rebalances
        self.consumer_rebalances += fx.consumer_rebalances
        return fx.result()

    def tick(self, now_ms: int) -> CoordinatorResult:
        """Fire every timer due at `now_ms`: session expiries, the end of
        join and sync phases, the retention sweep."""
        fx = Effects(now_ms)
        if not self.loaded:
            return fx.result()
        while True:
            due = self._due_timers(now_ms)
            if not due:
                break
            for _when, _order, group_id, kind, member_id in due:
                self._fire(group_id, kind, member_id, fx)
        if self._next_sweep_ms is not None and now_ms >= self._next_sweep_ms:
            offsets.sweep_expired(self, fx)
            self._next_sweep_ms = now_ms + self.config.offsets_retention_check_interval_ms
        self.rebalances += fx.rebalances
        self.consumer_rebalances += fx.consumer_rebalances
        return fx.result()

    def next_deadline_ms(self) -> int | None:
        """When `tick` next has something to do (None: nothing scheduled)."""
        if not self.loaded:
            return None
        times = [when for when, *_ in self._timers()]
        if self._next_sweep_ms is not None:
            times.append(self._next_sweep_ms)
        return min(times, default=None)

    def unload(self) -> CoordinatorResult:
        """This broker no longer leads the partition: answer every parked
        request NOT_COORDINATOR (clients look up the new coordinator) and
        forget the state."""
        fx = Effects(0)
        for group in self.groups.values():
            for member in group.members.values():
                rebalance.answer_parked(member, fx, ErrorCode.not_coordinator, member_id=member.member_id)
        self.groups = {}
        self.consumer = self._consumer_groups()
        self.offsets = offsets.OffsetStore()
        self.pending_txn_offsets = {}
        self._next_position = 0
        self.loaded = False
        self._next_sweep_ms = None
        return fx.result()

    def _consumer_groups(self) -> consumer_group.ConsumerGroups:
        groups = consumer_group.ConsumerGroups(self.config)
        # A fenced last consumer-protocol member may turn its group back into a classic one.
        groups.fence_hook = lambda group, member_id, fx: migration.maybe_downgrade(self, group, {member_id}, fx)
        return groups

    def new_member_id(self, prefix: str) -> str:
        bits = self.rng.getrandbits(128)
        bits = (bits & ~(0xF << 76)) | (0x4 << 76)  # version 4
        bits = (bits & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
        h = f"{bits:032x}"
        return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    # --- timers --------------------------------------------------------------

    def _timers(self):
        """(deadline, order, group, kind, member) of every scheduled timer;
        the order makes equal deadlines fire the same way every run."""
        for group_id, group in self.groups.items():
            if group.join_deadline_ms is not None:
                yield group.join_deadline_ms, 0, group_id, "join", ""
            if group.sync_deadline_ms is not None:
                yield group.sync_deadline_ms, 1, group_id, "sync", ""
            for member_id, when in group.pending_join_members.items():
                yield when, 2, group_id, "pending", member_id
            for member_id, member in group.members.items():
                if member.heartbeat_deadline_ms is not None:
                    yield member.heartbeat_deadline_ms, 3, group_id, "heartbeat", member_id
        yield from self.consumer.timers()

    def _due_timers(self, now_ms: int) -> list:
        return sorted(t for t in self._timers() if t[0] <= now_ms)

    def _fire(self, group_id: str, kind: str, member_id: str, fx: Effects) -> None:
        # An earlier timer of this round may have changed or removed what
        # this one was for: fire only if it is still due.
        if kind.startswith("consumer-"):
            self.consumer.fire(group_id, kind, member_id, self.topics, fx)
            return
        group = self.groups.get(group_id)
        if group is None:
            return
        now_ms = fx.now_ms
        if kind == "join":
            if group.join_deadline_ms is not None and group.join_deadline_ms <= now_ms:
                rebalance.on_join_deadline(group, fx, self.config)
        elif kind == "sync":
            if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
                rebalance.on_sync_deadline(group, fx, self.config)
        elif kind == "pending":
            when = group.pending_join_members.get(member_id)
            if when is not None and when <= now_ms:
                rebalance.on_pending_member_deadline(group, member_id, fx, self.config)
        else:
            member = group.members.get(member_id)
            if member is not None and member.heartbeat_deadline_ms is not None \
                    and member.heartbeat_deadline_ms <= now_ms:
                rebalance.on_heartbeat_deadline(group, member, fx, self.config)


def _classic(classic_handler: Callable, mixed_handler: Callable) -> Callable:
    """A classic-protocol request: to a non-empty consumer group it goes to
    that group's classic members (online migration), else to the classic
    group of the id."""
    def handle(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
        group = migration.consumer_group_of(shard, request.group_id) if request.group_id else None
        if group is not None and request.group_id not in shard.groups:
            return mixed_handler(shard, ctx, request, group, fx)
        return classic_handler(shard, ctx, request, fx)
    return handle


def _group_from_record(group_id: str, value: GroupMetadataValue) -> ClassicGroup:
    group = ClassicGroup(
        group_id,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        current_state_timestamp_ms=value.current_state_timestamp_ms,
        generation_id=value.generation,
        protocol_type=value.protocol_type or None,
        protocol_name=value.protocol,
        leader_id=value.leader,
    )
    for m in value.members:
        group.add(Member(
            member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout_ms=m.session_timeout_ms if m.rebalance_timeout_ms < 0 else m.rebalance_timeout_ms,
            session_timeout_ms=m.session_timeout_ms, protocol_type=value.protocol_type,
            protocols=((value.protocol or "", m.subscription),), assignment=m.assignment, unconfirmed=True,
        ))
    # `add` makes the first member leader; the record's leader is the truth.
    group.leader_id = value.leader if value.leader in group.members else next(iter(group.members), None)
    group.subscribed_topics = group.compute_subscribed_topics()
    return group


# --- group administration ---------------------------------------------------------


def _handle_describe_groups(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    described = [describe_group(shard, g, request_version(request)) for g in request.groups]
    fx.respond(ctx.token, describe_groups_response(response_module(request), described))


def describe_group(shard: GroupCoordinatorShard, group_id: str, version: int) -> DescribedGroup:
    if not group_id:
        return DescribedGroup(group_id, ErrorCode.invalid_group_id)
    group = shard.groups.get(group_id)
    if group is None:
        # A consumer-protocol group is not described here but with
        # ConsumerGroupDescribe: Kafka 4 answers DescribeGroups for one as
        # for an unknown group, saying which kind it is.
        kind = "is not a classic group" if group_id in shard.consumer.groups else "not found"
        if version >= DESCRIBE_GROUP_NOT_FOUND_VERSION:
            return DescribedGroup(group_id, ErrorCode.group_id_not_found, f"Group {group_id} {kind}.", "Dead")
        return DescribedGroup(group_id, state="Dead")
    stable = group.state is GroupState.STABLE
    members = tuple(
        DescribedMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                        m.metadata(group.protocol_name) if stable else b"", m.assignment)
        for m in group.members.values())
    return DescribedGroup(group_id, state=group.state.value, protocol_type=group.protocol_type or "",
                          protocol_data=(group.protocol_name or "") if stable else "", members=members)


def _handle_list_groups(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    fx.respond(ctx.token, list_groups_response(response_module(request), ErrorCode.none, list_groups(
        shard, getattr(request, "states_filter", ()), getattr(request, "types_filter", ()))))


def list_groups(shard: GroupCoordinatorShard, states_filter: Any = (), types_filter: Any = ()) -> list[ListedGroup]:
    states = {s.strip().lower() for s in states_filter or ()}
    types = {t.strip().lower() for t in types_filter or ()}
    listed = []
    if not types or CLASSIC_GROUP_TYPE in types:
        listed += [ListedGroup(g.group_id, g.protocol_type or "", g.state.value, CLASSIC_GROUP_TYPE)
                   for g in shard.groups.values() if not states or g.state.value.lower() in states]
    if not types or CONSUMER_GROUP_TYPE in types:
        # KIP-848 groups: listed with their own states (Empty, Assigning, Reconciling, Stable).
        listed += [ListedGroup(g.group_id, "consumer", g.state_name(), CONSUMER_GROUP_TYPE)
                   for g in shard.consumer.groups.values()
                   if g.group_id not in shard.groups and (not states or g.state_name().lower() in states)]
    return sorted(listed, key=lambda g: g.group_id)


def _handle_delete_groups(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    results = []
    for group_id in request.groups_names:
        results.append((group_id, delete_group(shard, group_id, fx)))
    fx.respond(ctx.token, delete_groups_response(response_module(request), results))


def delete_group(shard: GroupCoordinatorShard, group_id: str, fx: Effects) -> ErrorCode:
    """Tombstone an empty group and all its offsets (DeleteGroups)."""
    if not group_id:
        return ErrorCode.invalid_group_id
    group = shard.groups.get(group_id)
    consumer_group = shard.consumer.groups.get(group_id)
    if group is None and consumer_group is None:
        return ErrorCode.group_id_not_found
    if (group is not None and group.state is not GroupState.EMPTY) or \
            (consumer_group is not None and consumer_group.members):
        return ErrorCode.non_empty_group
    for (topic, partition), _ in shard.offsets.items(group_id):
        fx.records.append(offset_commit_record(group_id, topic, partition, None))
    if consumer_group is not None:
        shard.consumer.delete_group(group_id, fx)
    if group is None:
        shard.offsets.by_group.pop(group_id, None)
        return ErrorCode.none
    fx.records.append(group_metadata_record(group_id, None))
    shard.offsets.by_group.pop(group_id, None)
    # The open transactions' offsets of the group go too (as Kafka's
    # coordinator deletes them with the group's).
    for producer_id in list(shard.pending_txn_offsets):
        shard.pending_txn_offsets[producer_id].pop(group_id, None)
        if not shard.pending_txn_offsets[producer_id]:
            del shard.pending_txn_offsets[producer_id]
    del shard.groups[group_id]
    return ErrorCode.none



def _handle_consumer_group_heartbeat(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any,
                                     fx: Effects) -> None:
    classic = shard.groups.get(request.group_id)
    mod = response_module(request)
    if classic is not None and not classic.members and request.member_epoch == 0:
        # An empty classic group (offsets only) becomes a consumer group,
        # as Kafka converts it whatever the migration policy; its committed
        # offsets stay.
        del shard.groups[request.group_id]
        fx.records.append(group_metadata_record(request.group_id, None))
    elif classic is not None and request.member_epoch == 0 \
            and shard.consumer.request_error(request, request.member_id or "joining") is None:
        holder = classic.static_members.get(request.instance_id) if request.instance_id is not None else None
        if holder is not None and holder != request.member_id:
            # A classic static member still holds the instance id (a classic
            # consumer closed without leaving): as in Kafka the request fails
            # and converts nothing; the id is free once its session expires.
            fx.respond(ctx.token, mod.ConsumerGroupHeartbeatResponse(
                throttle_time=timedelta(0), error_code=ErrorCode.unreleased_instance_id, member_epoch=-1,
                heartbeat_interval=timedelta(0), assignment=None, error_message=(
                    f"Static member {request.member_id or '(new)'} with instance id {request.instance_id} cannot "
                    f"join group {request.group_id}: classic member {holder} still holds the instance id until "
                    "its session times out (or it is removed with LeaveGroup).")))
            return
        # Online upgrade: the classic members go on in a consumer group
        # (a request refused anyway converts nothing).
        refused = migration.upgrade(shard, classic, fx)
        if refused is not None:
            fx.respond(ctx.token, mod.ConsumerGroupHeartbeatResponse(
                throttle_time=timedelta(0), error_code=ErrorCode.group_id_not_found, member_epoch=-1,
                heartbeat_interval=timedelta(0), error_message=refused, assignment=None))
            return
    elif classic is not None and request.member_epoch > 0:
        fx.respond(ctx.token, mod.ConsumerGroupHeartbeatResponse(
            throttle_time=timedelta(0), error_code=ErrorCode.group_id_not_found, member_epoch=-1, heartbeat_interval=timedelta(0),
            error_message=f"Group {request.group_id} is a classic group: rejoin with member epoch 0.", assignment=None))
        return
    group = shard.consumer.groups.get(request.group_id)
    if request.member_epoch == consumer_group.LEAVE_EPOCH and group is not None \
            and group.members.get(request.member_id) is not None \
            and migration.maybe_downgrade(shard, group, {request.member_id}, fx):
        # The last consumer-protocol member left: the group is a classic one again.
        fx.respond(ctx.token, mod.ConsumerGroupHeartbeatResponse(
            throttle_time=timedelta(0), error_code=ErrorCode.none, member_id=request.member_id,
            member_epoch=consumer_group.LEAVE_EPOCH, heartbeat_interval=timedelta(0), assignment=None))
        return
    fx.respond(ctx.token, shard.consumer.heartbeat(
        ctx, request, shard.topics, fx, mod.ConsumerGroupHeartbeatResponse, shard.new_member_id("member")))


def _handle_consumer_group_describe(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any,
                                    fx: Effects) -> None:
    mod = response_module(request)
    names = {tid: name for name, (tid, _n) in shard.topics.items()}
    fx.respond(ctx.token, mod.ConsumerGroupDescribeResponse(throttle_time=timedelta(0), groups=tuple(
        consumer_group.describe(shard.consumer.groups.get(g), g, names, mod, request.include_authorized_operations)
        for g in request.group_ids)))
