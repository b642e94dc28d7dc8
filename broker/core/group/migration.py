"""Classic and consumer-protocol members in one group: KIP-848's online
upgrade and downgrade (pure).

Theory of operation
-------------------
Kafka 4 lets a group move between the classic protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, client-side assignment) and the consumer
protocol (ConsumerGroupHeartbeat, broker-side assignment) one consumer at a
time, as a rolling restart changes `group.protocol`. The broker setting
`group.consumer.migration.policy` (disabled, upgrade, downgrade,
bidirectional; Kafka's default bidirectional) says which conversions of a
non-empty group are allowed; an empty group converts either way.

    classic group --(a member sends ConsumerGroupHeartbeat, upgrade allowed)--> consumer group
    consumer group --(its last consumer-protocol member leaves or is fenced,
                      or a classic JoinGroup with its group.instance.id takes
                      its place; the rest are classic, downgrade allowed)--> classic group

Upgrade (`upgrade`): the classic group's members become members of a
consumer group at the classic generation as their member epoch, each
keeping the partitions of its last SyncGroup as current and target
assignment, so nobody stops consuming. The joining member then bumps the
group epoch like any new member; the classic members learn of the new
target by rejoining.

A classic member of a consumer group (`join`, `sync`, `heartbeat`,
`leave`) keeps speaking its protocol:

- JoinGroup reads the subscription (topics, owned partitions, rack) out of
  the ConsumerProtocolSubscription of its first protocol, updates the
  member and reconciles it towards its target like a heartbeat would; the
  answer carries its member epoch as the generation, no leader and no
  members, so the client is a follower and runs no assignor.
- SyncGroup answers its current assignment (ConsumerProtocolAssignment
  bytes): the broker-side target minus what others still have to release.
- Heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin to
  make progress: the group epoch moved past its epoch, it has partitions
  to give up, or partitions it waits for got free. So its assignment only
  changes through a rejoin, which is what a classic client expects.
- Its session timeout is the one it joined with (`ClassicMeta`), stored in
  the tagged field of its ConsumerGroupMemberMetadata record, as Kafka.

Downgrade (`maybe_downgrade`): instead of fencing the last
consumer-protocol member, the group is rewritten as a classic group at
the group epoch as its generation, with the members' current partitions as
their assignment, and a rebalance starts: every member rejoins with
JoinGroup and the leader assigns again. When a static member rolled back
to the classic protocol replaces the last consumer-protocol member
(`downgrades_on_replacing`, Kafka's static member replacement), it takes
that member's partitions and the classic group starts Stable, without a
rebalance, unless its subscription differs.

The records written are Kafka's: tombstones for the old kind of group,
then the new kind's records, in one batch, so a coordinator that takes
over replays into the same group.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from broker.core.group import consumer_records as cr
from broker.core.group import rebalance
from broker.core.group.classic_group import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicGroup,
    GroupState,
    Member,
)
from broker.core.group.consumer_group import (
    STABLE,
    UNRELEASED,
    UNREVOKED,
    ConsumerGroup,
    ConsumerMember,
)
from broker.core.group.effects import Effects, RequestContext
from broker.core.group.join import REQUIRES_KNOWN_MEMBER_ID_VERSION, timedelta_ms
from broker.core.group.records import group_metadata_record
from broker.core.group.responses import (
    heartbeat_response,
    join_response,
    leave_response,
    request_version,
    response_module,
    sync_response,
)

if TYPE_CHECKING:
    from broker.core.group.shard import GroupCoordinatorShard

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


# --- the consumer protocol's embedded formats (classic JoinGroup/SyncGroup bytes) ---


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    #: (topic, partitions) the member still owns (v1+; empty before).
    owned: tuple[tuple[str, tuple[int, ...]], ...]
    rack_id: str | None


class _Buf:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def bytes_(self) -> None:
        n = self.i32()
        if n >= 0:
            self.take(n)

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def topic_partitions(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        out = []
        for _ in range(max(self.i32(), 0)):
            topic = self.string() or ""
            out.append((topic, tuple(self.i32() for _ in range(max(self.i32(), 0)))))
        return tuple(out)


def parse_subscription(metadata: bytes) -> Subscription | None:
    """A ConsumerProtocolSubscription (v0-v3); None if malformed. Fields of
    a version newer than the client may send are read while present."""
    try:
        b = _Buf(metadata)
        version = b.i16()
        topics = tuple(b.string() or "" for _ in range(max(b.i32(), 0)))
        b.bytes_()  # user data
        owned: tuple = ()
        rack = None
        if version >= 1 and not b.at_end():
            owned = b.topic_partitions()
        if version >= 2 and not b.at_end():
            b.i32()  # generation id
        if version >= 3 and not b.at_end():
            rack = b.string()
        return Subscription(topics, owned, rack)
    except (ValueError, struct.error, UnicodeDecodeError):
        return None


def parse_assignment(data: bytes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The partitions of a ConsumerProtocolAssignment; () if empty or malformed."""
    if not data:
        return ()
    try:
        b = _Buf(data)
        b.i16()
        return b.topic_partitions()
    except (ValueError, struct.error, UnicodeDecodeError):
        return ()


def encode_assignment(assigned: dict[uuid.UUID, frozenset[int]], names: dict[uuid.UUID, str]) -> bytes:
    """A ConsumerProtocolAssignment v0 (every version since reads it the same)."""
    topics = sorted((names[t], sorted(ps)) for t, ps in assigned.items() if t in names and ps)
    out = bytearray(_I16.pack(0) + _I32.pack(len(topics)))
    for name, partitions in topics:
        raw = name.encode()
        out += _I16.pack(len(raw)) + raw + _I32.pack(len(partitions))
        for p in partitions:
            out += _I32.pack(p)
    out += _I32.pack(-1)  # no user data
    return bytes(out)


def _by_id(pairs: Any, topics: dict) -> dict[uuid.UUID, frozenset[int]]:
    """(topic name, partitions) -> {topic id: partitions}; unknown topics are dropped."""
    out: dict[uuid.UUID, frozenset[int]] = {}
    for name, partitions in pairs:
        if name in topics and partitions:
            topic_id = topics[name][0]
            out[topic_id] = out.get(topic_id, frozenset()) | frozenset(partitions)
    return out


def _names(topics: dict) -> dict[uuid.UUID, str]:
    return {tid: name for name, (tid, _n) in topics.items()}


def consumer_group_of(shard: GroupCoordinatorShard, group_id: str) -> ConsumerGroup | None:
    """The consumer group a classic request for `group_id` goes to: a
    non-empty one (an empty one is replaced by a classic group on join)."""
    group = shard.consumer.groups.get(group_id)
    return group if group is not None and group.members else None


# --- upgrade ---------------------------------------------------------------------


def upgrade(shard: GroupCoordinatorShard, classic: ClassicGroup, fx: Effects) -> str | None:
    """Turn the non-empty classic group into a consumer group; the reason
    it cannot be (for a GROUP_ID_NOT_FOUND answer), else None."""
    cfg = shard.config
    gid = classic.group_id
    if not cfg.allows_upgrade():
        return (f"Group {gid} is a classic group and group.consumer.migration.policy is "
                f"{cfg.group_consumer_migration_policy}: its members must leave before consumer-protocol "
                "members can join (or set the policy to upgrade or bidirectional).")
    if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return (f"Group {gid} is a classic group of protocol type {classic.protocol_type!r}, not 'consumer': "
                "it cannot be upgraded to a consumer-protocol group.")
    topics = shard.topics
    generation = classic.generation_id
    group = ConsumerGroup(gid, group_epoch=generation, assignment_epoch=generation)
    for m in classic.members.values():
        protocol = classic.protocol_name or (m.protocols[0][0] if m.protocols else None)
        sub = parse_subscription(m.metadata(protocol))
        if sub is None:
            return (f"Group {gid} cannot be upgraded to a consumer-protocol group: member {m.member_id} "
                    "sent a malformed consumer protocol subscription.")
        assigned = _by_id(parse_assignment(m.assignment), topics)
        group.members[m.member_id] = ConsumerMember(
            m.member_id, member_epoch=generation, previous_member_epoch=generation, state=STABLE,
            instance_id=m.group_instance_id, rack_id=sub.rack_id, client_id=m.client_id,
            client_host=m.client_host, subscribed_topic_names=tuple(sorted(set(sub.topics))),
            rebalance_timeout_ms=m.rebalance_timeout_ms, assigned=assigned,
            session_deadline_ms=fx.now_ms + m.session_timeout_ms, assignment_changed=False,
            classic=cr.ClassicMeta(m.session_timeout_ms, m.protocols))
        group.target[m.member_id] = assigned
    names = {t for m in group.members.values() for t in m.subscribed_topic_names if t in topics}
    group.subscription_metadata = {t: topics[t] for t in sorted(names)}
    # A rebalance in progress ends here: its parked requests are told to
    # rejoin, which they do against the consumer group.
    for m in classic.members.values():
        rebalance.answer_parked(m, fx, ErrorCode.rebalance_in_progress, member_id=m.member_id)
    fx.records.append(group_metadata_record(gid, None))
    # Kafka's order: members, group epoch, subscription metadata, target, current assignments.
    for m in group.members.values():
        fx.records.append(cr.member_metadata_record(gid, m))
    fx.records.append(cr.group_metadata_record(gid, group.group_epoch))
    fx.records.append(cr.partition_metadata_record(gid, group.subscription_metadata))
    for mid, assignment in group.target.items():
        fx.records.append(cr.target_member_record(gid, mid, assignment))
    fx.records.append(cr.target_metadata_record(gid, group.assignment_epoch))
    for m in group.members.values():
        fx.records.append(cr.current_assignment_record(gid, m))
    del shard.groups[gid]
    shard.consumer.groups[gid] = group
    return None


# --- downgrade -------------------------------------------------------------------


def maybe_downgrade(shard: GroupCoordinatorShard, group: ConsumerGroup, leaving: set[str], fx: Effects) -> bool:
    """The members `leaving` go: if every other member speaks the classic
    protocol and the policy allows it, the group becomes a classic group
    (and the leaving members are gone with the old records); True if so."""
    cfg = shard.config
    rest = [m for mid, m in group.members.items() if mid not in leaving]
    if not rest or any(m.classic is None for m in rest) or not any(
            group.members[mid].classic is None for mid in leaving if mid in group.members):
        return False
    if not cfg.allows_downgrade() or len(rest) > cfg.group_max_size:
        return False
    # The members rejoin (their Heartbeat says REBALANCE_IN_PROGRESS) and the
    # leader assigns the partitions the left member had.
    return _to_classic(shard, group, rest, fx, start_rebalance=True)


def downgrades_on_replacing(shard: GroupCoordinatorShard, group: ConsumerGroup, replaced: ConsumerMember) -> bool:
    """Kafka's `validateOnlineDowngradeWithReplacedMember`: a classic static
    member taking the place of `replaced` (same group.instance.id) ends the
    consumer protocol in the group when `replaced` was its last
    consumer-protocol member and the policy allows a downgrade."""
    cfg = shard.config
    return (replaced.classic is None
            and all(m.classic is not None for mid, m in group.members.items() if mid != replaced.member_id)
            and cfg.allows_downgrade() and len(group.members) <= cfg.group_max_size)


def _to_classic(shard: GroupCoordinatorShard, group: ConsumerGroup, rest: list[ConsumerMember], fx: Effects,
                start_rebalance: bool) -> bool:
    """Rewrite `group` as a classic group of the classic members `rest`, at
    the group epoch as its generation, each with its current partitions as
    its assignment; with `start_rebalance` a rebalance starts. False (nothing
    changed) if no protocol is supported by every member."""
    common = set.intersection(*({n for n, _ in m.classic.protocols} for m in rest))
    protocol = next((n for n, _ in rest[0].classic.protocols if n in common), None)
    if protocol is None:
        return False  # no protocol every member supports: stays a consumer group
    gid = group.group_id
    for mid in group.members:
        fx.records.append(cr.tombstone(cr.CURRENT_ASSIGNMENT_KEY, gid, mid))
        fx.records.append(cr.tombstone(cr.TARGET_MEMBER_KEY, gid, mid))
        fx.records.append(cr.tombstone(cr.MEMBER_METADATA_KEY, gid, mid))
    for kind in (cr.TARGET_METADATA_KEY, cr.PARTITION_METADATA_KEY, cr.GROUP_METADATA_KEY):
        fx.records.append(cr.tombstone(kind, gid))
    del shard.consumer.groups[gid]
    names = _names(shard.topics)
    classic = ClassicGroup(gid, state=GroupState.STABLE, current_state_timestamp_ms=fx.now_ms,
                           generation_id=group.group_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
                           protocol_name=protocol)
    for m in rest:
        member = Member(member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                        client_host=m.client_host, rebalance_timeout_ms=m.rebalance_timeout_ms,
                        session_timeout_ms=m.classic.session_timeout_ms, protocol_type=CONSUMER_PROTOCOL_TYPE,
                        protocols=m.classic.protocols, assignment=encode_assignment(m.assigned, names))
        classic.add(member)
        rebalance.reschedule_heartbeat(member, fx.now_ms)
    classic.subscribed_topics = classic.compute_subscribed_topics()
    shard.groups[gid] = classic
    rebalance.store_group(classic, fx)
    if start_rebalance:
        rebalance.prepare_rebalance(classic, fx, shard.config)
    return True


# --- classic requests to a consumer group ------------------------------------------


def _find(group: ConsumerGroup, member_id: str, instance_id: str | None) -> tuple[ConsumerMember | None, ErrorCode]:
    if instance_id is not None:
        member = next((m for m in group.members.values() if m.instance_id == instance_id), None)
        if member is None:
            return None, ErrorCode.unknown_member_id
        if member.member_id != member_id:
            return None, ErrorCode.fenced_instance_id
        return member, ErrorCode.none
    member = group.members.get(member_id)
    if member is None or member.classic is None:
        return None, ErrorCode.unknown_member_id
    return member, ErrorCode.none


def _supports(group: ConsumerGroup, member_id: str, protocol_type: str, names: list[str]) -> bool:
    """Kafka's rule: the consumer protocol type, and a protocol every other
    classic member supports too."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
        return False
    others = [m for mid, m in group.members.items() if mid != member_id and m.classic is not None]
    return any(all(n in {p for p, _ in m.classic.protocols} for m in others) for n in names)


def join(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, group: ConsumerGroup, fx: Effects) -> None:
    mod = response_module(request)
    cfg = shard.config
    consumer = shard.consumer

    def fail(error: ErrorCode, member_id: str = "") -> None:
        fx.respond(ctx.token, join_response(mod, error, member_id=member_id))

    session_timeout_ms = timedelta_ms(request.session_timeout, 0)
    if not cfg.group_min_session_timeout_ms <= session_timeout_ms <= cfg.group_max_session_timeout_ms:
        return fail(ErrorCode.invalid_session_timeout, request.member_id)
    rebalance_timeout_ms = timedelta_ms(getattr(request, "rebalance_timeout", None), session_timeout_ms)
    instance_id = getattr(request, "group_instance_id", None)
    protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
    member_id = request.member_id
    if not _supports(group, member_id, request.protocol_type, [n for n, _ in protocols]):
        return fail(ErrorCode.inconsistent_group_protocol, member_id)
    if not member_id:
        member_id = shard.new_member_id(instance_id if instance_id is not None else ctx.client_id)
        if instance_id is None and request_version(request) >= REQUIRES_KNOWN_MEMBER_ID_VERSION:
            return fail(ErrorCode.member_id_required, member_id)
    subscription = parse_subscription(protocols[0][1])
    if subscription is None:
        return fail(ErrorCode.inconsistent_group_protocol, member_id)
    downgrade = False
    if instance_id is not None:
        static = next((m for m in group.members.values() if m.instance_id == instance_id), None)
        if static is not None and static.member_id != member_id:
            if request.member_id:
                return fail(ErrorCode.fenced_instance_id, member_id)
            # A consumer rolled back to the classic protocol in place of the
            # group's last consumer-protocol member: the group goes back to
            # being a classic group (decided before the replacement, as Kafka).
            downgrade = downgrades_on_replacing(shard, group, static)
            # The static member is back under a new id: it takes the old
            # one's place and partitions without a rebalance.
            consumer._replace_static(group, static, member_id, fx)
    member = group.members.get(member_id)
    created = member is None
    if created:
        member = group.members[member_id] = ConsumerMember(member_id)
    updates = {"client_id": ctx.client_id, "client_host": ctx.client_host, "instance_id": instance_id,
               "rack_id": subscription.rack_id, "subscribed_topic_names": tuple(sorted(set(subscription.topics))),
               "subscribed_topic_regex": None, "server_assignor": None, "rebalance_timeout_ms": rebalance_timeout_ms,
               "classic": cr.ClassicMeta(session_timeout_ms, protocols)}
    changed = created
    subscription_changed = created
    for name, value in updates.items():
        if getattr(member, name) != value:
            changed = True
            subscription_changed |= name in ("subscribed_topic_names", "subscribed_topic_regex", "server_assignor")
            setattr(member, name, value)
    if changed:
        consumer._write_member(group, member, fx)
    if subscription_changed:
        consumer._bump(group, fx)
    member.session_deadline_ms = fx.now_ms + session_timeout_ms
    # It rejoined: the rejoin deadline (below) is met; reconciling sets a new
    # one if it has partitions to give up.
    member.revocation_deadline_ms = None
    owned = _by_id(subscription.owned, shard.topics)
    if downgrade and _downgrade_replaced(shard, group, member, owned, subscription_changed, fx):
        # Kafka answers the join as a consumer group's: the member, at its
        # epoch (the classic group's generation unless a rebalance started),
        # is a follower and gets its partitions from SyncGroup.
        return fx.respond(ctx.token, join_response(
            mod, ErrorCode.none, member_id=member_id, generation_id=member.member_epoch,
            protocol_type=CONSUMER_PROTOCOL_TYPE, protocol_name=protocols[0][0], leader="", members=()))
    consumer._maybe_assign(group, shard.topics, fx)
    consumer._reconcile(group, member, owned, fx)
    if member.state == UNREVOKED:
        # An eager client gave everything up before rejoining: what it must
        # revoke is gone already, so it moves on at once.
        consumer._reconcile(group, member, owned, fx)
    consumer.reconcile_waiting(group, member, fx)
    fx.respond(ctx.token, join_response(
        mod, ErrorCode.none, member_id=member_id, generation_id=member.member_epoch,
        protocol_type=CONSUMER_PROTOCOL_TYPE, protocol_name=protocols[0][0], leader="", members=()))
    return None


def _downgrade_replaced(shard: GroupCoordinatorShard, group: ConsumerGroup, member: ConsumerMember,
                        owned: dict[uuid.UUID, frozenset[int]], subscription_changed: bool, fx: Effects) -> bool:
    """The classic static member that replaced the last consumer-protocol
    member turns the group into a classic group. With the same subscription
    it keeps the replaced member's partitions and nobody rebalances; with a
    new one the classic group rebalances (Kafka's `convertToClassicGroup`)."""
    if not subscription_changed:
        # Kafka reconciles it with the target as it stands (no new target).
        shard.consumer._reconcile(group, member, owned, fx)
        if member.state == UNREVOKED:
            shard.consumer._reconcile(group, member, owned, fx)
    return _to_classic(shard, group, list(group.members.values()), fx, start_rebalance=subscription_changed)


def sync(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, group: ConsumerGroup, fx: Effects) -> None:
    mod = response_module(request)
    member, error = _find(group, request.member_id, getattr(request, "group_instance_id", None))
    if member is None or member.classic is None:
        return fx.respond(ctx.token, sync_response(mod, error if member is None else ErrorCode.unknown_member_id))
    if request.generation_id != member.member_epoch:
        return fx.respond(ctx.token, sync_response(mod, ErrorCode.illegal_generation))
    protocol_name = member.classic.protocols[0][0]
    asked_type = getattr(request, "protocol_type", None)
    asked_name = getattr(request, "protocol_name", None)
    if (asked_type is not None and asked_type != CONSUMER_PROTOCOL_TYPE) or \
            (asked_name is not None and asked_name != protocol_name):
        return fx.respond(ctx.token, sync_response(mod, ErrorCode.inconsistent_group_protocol))
    if group.group_epoch > member.member_epoch and member.state != UNREVOKED:
        # A newer target exists: rejoin to get it (a member revoking
        # partitions first syncs what it keeps).
        return fx.respond(ctx.token, sync_response(mod, ErrorCode.rebalance_in_progress))
    member.session_deadline_ms = fx.now_ms + member.classic.session_timeout_ms
    return fx.respond(ctx.token, sync_response(
        mod, ErrorCode.none, protocol_type=CONSUMER_PROTOCOL_TYPE, protocol_name=protocol_name,
        assignment=encode_assignment(member.assigned, _names(shard.topics))))


def _waits_for_held(group: ConsumerGroup, member: ConsumerMember) -> bool:
    wanted = {(t, p) for t, ps in group.target.get(member.member_id, {}).items() for p in ps
              if p not in member.assigned.get(t, frozenset())}
    for other in group.members.values():
        if other is member:
            continue
        for a in (other.assigned, other.pending_revocation):
            if any((t, p) in wanted for t, ps in a.items() for p in ps):
                return True
    return False


def heartbeat(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, group: ConsumerGroup,
              fx: Effects) -> None:
    mod = response_module(request)
    member, error = _find(group, request.member_id, getattr(request, "group_instance_id", None))
    if member is None or member.classic is None:
        return fx.respond(ctx.token, heartbeat_response(mod, error if member is None else ErrorCode.unknown_member_id))
    if request.generation_id != member.member_epoch:
        return fx.respond(ctx.token, heartbeat_response(mod, ErrorCode.illegal_generation))
    member.session_deadline_ms = fx.now_ms + member.classic.session_timeout_ms
    # Rejoin when that makes progress: a newer group epoch, partitions to
    # give up, or partitions it waits for that are free now.
    rejoin = (member.member_epoch < group.group_epoch or member.state == UNREVOKED
              or (member.state == UNRELEASED and not _waits_for_held(group, member)))
    if rejoin and member.revocation_deadline_ms is None:
        # As Kafka's join timeout: a member told to rejoin that does not within
        # its rebalance timeout is fenced, so partitions others wait for move on.
        member.revocation_deadline_ms = fx.now_ms + member.rebalance_timeout_ms
    return fx.respond(ctx.token, heartbeat_response(mod, ErrorCode.rebalance_in_progress if rejoin else ErrorCode.none))


def leave(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, group: ConsumerGroup, fx: Effects) -> None:
    mod = response_module(request)
    if hasattr(request, "members"):
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    results = []
    gone: list[str] = []
    for member_id, instance_id in leaving:
        if not member_id and instance_id is not None:
            # An admin removing a static member by its instance id.
            member = next((m for m in group.members.values() if m.instance_id == instance_id), None)
            error = ErrorCode.none if member is not None else ErrorCode.unknown_member_id
        else:
            member, error = _find(group, member_id, instance_id)
        if member is not None and member.member_id not in gone:
            gone.append(member.member_id)
        results.append((member_id, instance_id, error))
    if gone and not maybe_downgrade(shard, group, set(gone), fx):
        for member_id in gone:
            shard.consumer._remove_member(group, member_id, fx)
        shard.consumer._maybe_assign(group, shard.topics, fx)
    return fx.respond(ctx.token, leave_response(mod, ErrorCode.none, results))
