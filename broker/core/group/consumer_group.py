"""KIP-848 consumer groups: ConsumerGroupHeartbeat and ConsumerGroupDescribe (pure).

Theory of operation
-------------------
A consumer-protocol group has no join or sync phase. Every member sends
ConsumerGroupHeartbeat; the coordinator keeps:

- the group epoch, bumped whenever what the assignment depends on changes
  (a member joins or leaves, a subscription changes, a subscribed topic's
  partition count changes);
- the target assignment, computed by the broker's assignor (`uniform` or
  `range`, `group.consumer.assignors`) for the group epoch; its epoch is
  the assignment epoch;
- per member its current assignment, its member epoch and its state.

Reconciling a member towards its target (KIP-848 "incremental revocation"):

    STABLE     => UNREVOKED: the target drops partitions the member owns;
                  it keeps the rest and is asked to revoke those, at its
                  old epoch
    UNREVOKED  => STABLE/UNRELEASED: its heartbeat no longer reports the
                  revoked partitions as owned; it takes the epoch of the
                  target assignment
    UNRELEASED => STABLE: every partition of its target that another
                  member still owned (or was revoking) got free and is
                  now assigned to it

So a partition is given to its new owner only after the old owner has
revoked it, and a member keeps consuming the partitions it keeps.

A member without heartbeat for `group.consumer.session.timeout.ms` is
removed (group epoch bumped, its partitions go to the others). The
group's state is written to `__consumer_offsets` in Kafka's record
formats (`consumer_records`) and rebuilt from them by replay.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from broker.core.group import consumer_records as cr
from broker.core.group.effects import Effects, RequestContext

#: Member states (Kafka's MemberState ids, stored in CurrentMemberAssignment).
STABLE, UNREVOKED, UNRELEASED = 1, 2, 3
_STATE_NAMES = {STABLE: "stable", UNREVOKED: "unrevoked_partitions", UNRELEASED: "unreleased_partitions"}

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

#: name -> (topic id, number of partitions): the topics the broker knows.
TopicMetadata = Mapping[str, tuple[uuid.UUID, int]]
Assignment = dict[uuid.UUID, frozenset[int]]


@dataclass
class ConsumerMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: int = STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_deadline_ms: int | None = None
    #: When a member asked to revoke must have done so (rebalance timeout).
    revocation_deadline_ms: int | None = None
    #: The assignment was changed since the last heartbeat response.
    assignment_changed: bool = True
    #: Set for a member that speaks the classic protocol (JoinGroup,
    #: SyncGroup, Heartbeat) in this group during an online upgrade or
    #: downgrade (`migration`); None for a ConsumerGroupHeartbeat member.
    classic: cr.ClassicMeta | None = None

    def session_timeout_ms(self, config: Any) -> int:
        """A classic member keeps the session timeout it joined with."""
        if self.classic is not None:
            return self.classic.session_timeout_ms
        return config.group_consumer_session_timeout_ms


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    #: The subscribed topics' metadata the target was computed from.
    subscription_metadata: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    group_type = "consumer"
    protocol_type = "consumer"

    def state_name(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"


# --- assignors -----------------------------------------------------------------


def subscribed_topics(member: ConsumerMember, topics: TopicMetadata) -> list[str]:
    """The topics a member subscribes to that exist. A regex is matched
    with Python's `re.fullmatch` (Kafka uses RE2/J: see docs/operations.md)."""
    names = {t for t in member.subscribed_topic_names if t in topics}
    if member.subscribed_topic_regex:
        try:
            pattern = re.compile(member.subscribed_topic_regex)
        except re.error:
            pattern = None
        if pattern is not None:
            names.update(t for t in topics if not t.startswith("__") and pattern.fullmatch(t))
    return sorted(names)


def assign(assignor: str, group: ConsumerGroup, topics: TopicMetadata,
           racks: Mapping[tuple[uuid.UUID, int], frozenset[str]] | None = None) -> dict[str, Assignment]:
    """The target assignment of every member of `group`. `racks`: the racks
    of each partition's replicas; `uniform` gives a partition it places to
    a member in one of them while that member is below its share (KIP-881),
    so the member can fetch from a replica in its rack."""
    racks = racks or {}
    subs = {m: subscribed_topics(member, topics) for m, member in group.members.items()}
    result: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in group.members}
    if assignor == "range":
        by_topic: dict[str, list[str]] = {}
        for m, names in subs.items():
            for t in names:
                by_topic.setdefault(t, []).append(m)
        for t, members in by_topic.items():
            topic_id, n = topics[t]
            members.sort()
            per, extra = divmod(n, len(members))
            start = 0
            for i, m in enumerate(members):
                count = per + (1 if i < extra else 0)
                if count:
                    result[m].setdefault(topic_id, set()).update(range(start, start + count))
                start += count
    else:
        # uniform: balanced and sticky. Each member keeps up to its share of
        # what the previous target gave it; the rest goes to the least
        # loaded subscriber (ties: the previous owner, then member id).
        partitions = [(topics[t][0], p, t) for t in sorted({t for names in subs.values() for t in names})
                      for p in range(topics[t][1])]
        subscribers = {t: [m for m in sorted(subs) if t in subs[m]] for _, _, t in partitions}
        quota = len(partitions) // max(len(group.members), 1)
        count = {m: 0 for m in group.members}
        previous = {(tid, p): m for m, a in group.target.items() if m in group.members
                    for tid, ps in a.items() for p in ps}
        free = []
        for tid, p, t in partitions:
            owner = previous.get((tid, p))
            if owner is not None and t in subs[owner] and count[owner] < quota:
                result[owner].setdefault(tid, set()).add(p)
                count[owner] += 1
            else:
                free.append((tid, p, t))
        # Rack-aware (KIP-881): a free partition goes first to a member in
        # one of its replicas' racks that is below its share; the share
        # keeps the assignment balanced. The rest goes by load.
        rest = []
        for tid, p, t in free:
            near = racks.get((tid, p))
            local = [m for m in subscribers[t] if near and group.members[m].rack_id in near and count[m] < quota]
            if local:
                best = min(local, key=lambda m: (count[m], m))
                result[best].setdefault(tid, set()).add(p)
                count[best] += 1
            else:
                rest.append((tid, p, t))
        for tid, p, t in rest:
            candidates = subscribers[t]
            if not candidates:
                continue
            owner = previous.get((tid, p))
            best = min(candidates, key=lambda m: (count[m], m != owner, m))
            result[best].setdefault(tid, set()).add(p)
            count[best] += 1
    return {m: {tid: frozenset(ps) for tid, ps in a.items()} for m, a in result.items()}


# --- heartbeat -------------------------------------------------------------------


def _owned(request_partitions: Any) -> Assignment | None:
    if request_partitions is None:
        return None
    return {tp.topic_id: frozenset(tp.partitions) for tp in request_partitions if tp.partitions}


def _minus(a: Assignment, b: Assignment) -> Assignment:
    out = {t: ps - b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _intersect(a: Assignment, b: Assignment) -> Assignment:
    out = {t: ps & b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _union(a: Assignment, b: Assignment) -> Assignment:
    out = dict(a)
    for t, ps in b.items():
        out[t] = out.get(t, frozenset()) | ps
    return {t: ps for t, ps in out.items() if ps}


class ConsumerGroups:
    """The consumer-protocol groups of one shard."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.groups: dict[str, ConsumerGroup] = {}
        #: (topic id, partition) -> the racks of its replicas (set by the shell from the metadata image).
        self.partition_racks: Mapping[tuple[uuid.UUID, int], frozenset[str]] = {}
        #: Called as fence_hook(group, member_id, fx) before a member whose
        #: session or revocation timed out is removed; True when it took care
        #: of it (the shard downgrades the group to a classic one).
        self.fence_hook: Any = None

    # --- records ------------------------------------------------------------

    def _write_member(self, group: ConsumerGroup, member: ConsumerMember, fx: Effects) -> None:
        fx.records.append(cr.member_metadata_record(group.group_id, member))

    def _write_current(self, group: ConsumerGroup, member: ConsumerMember, fx: Effects) -> None:
        fx.records.append(cr.current_assignment_record(group.group_id, member))

    def _remove_member(self, group: ConsumerGroup, member_id: str, fx: Effects) -> None:
        group.members.pop(member_id, None)
        group.target.pop(member_id, None)
        gid = group.group_id
        # Kafka's order: current assignment, target, then the member.
        fx.records.append(cr.tombstone(cr.CURRENT_ASSIGNMENT_KEY, gid, member_id))
        fx.records.append(cr.tombstone(cr.TARGET_MEMBER_KEY, gid, member_id))
        fx.records.append(cr.tombstone(cr.MEMBER_METADATA_KEY, gid, member_id))
        self._bump(group, fx)

    def _replace_static(self, group: ConsumerGroup, old: ConsumerMember, member_id: str, fx: Effects) -> None:
        """The consumer back with a static member's instance id takes its
        place: same subscription, target and partitions, a new member id, and
        no group epoch bump, so the other members see no rebalance."""
        new = dataclasses.replace(old, member_id=member_id, member_epoch=0, previous_member_epoch=0,
                                  assignment_changed=True)
        gid = group.group_id
        del group.members[old.member_id]
        target = group.target.pop(old.member_id, {})
        fx.records.append(cr.tombstone(cr.CURRENT_ASSIGNMENT_KEY, gid, old.member_id))
        fx.records.append(cr.tombstone(cr.TARGET_MEMBER_KEY, gid, old.member_id))
        fx.records.append(cr.tombstone(cr.MEMBER_METADATA_KEY, gid, old.member_id))
        group.members[member_id] = new
        group.target[member_id] = target
        self._write_member(group, new, fx)
        fx.records.append(cr.target_member_record(gid, member_id, target))
        self._write_current(group, new, fx)

    def _bump(self, group: ConsumerGroup, fx: Effects) -> None:
        group.group_epoch += 1
        fx.records.append(cr.group_metadata_record(group.group_id, group.group_epoch))

    def delete_group(self, group_id: str, fx: Effects) -> None:
        """Forget an empty group: tombstones for its group-level records."""
        group = self.groups.pop(group_id)
        assert not group.members, "only an empty consumer group is deleted"
        for kind in (cr.TARGET_METADATA_KEY, cr.PARTITION_METADATA_KEY, cr.GROUP_METADATA_KEY):
            fx.records.append(cr.tombstone(kind, group_id))

    # --- requests -----------------------------------------------------------

    def heartbeat(self, ctx: RequestContext, request: Any, topics: TopicMetadata, fx: Effects,
                  response_cls: Any, member_id_for_join: str) -> Any:
        cfg = self.config
        now_ms = fx.now_ms

        def error(code: ErrorCode, message: str) -> Any:
            return response_cls(throttle_time=timedelta(0), error_code=code, error_message=message,
                                member_id=None, member_epoch=-1, heartbeat_interval=timedelta(0), assignment=None)

        epoch = request.member_epoch
        member_id = request.member_id or (member_id_for_join if epoch == 0 else "")
        refused = self.request_error(request, member_id)
        if refused is not None:
            return error(*refused)
        group = self.groups.get(request.group_id)
        instance_id = request.instance_id
        static = _static_member(group, instance_id) if group is not None and instance_id is not None else None
        if instance_id is not None and epoch != 0 and group is not None:
            # Kafka's static member checks: the instance id must be known and
            # held by this very member (a newer one with it fences this one).
            if static is None:
                return error(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
            if static.member_id != member_id:
                return error(ErrorCode.fenced_instance_id,
                             f"Static member {member_id} with instance id {instance_id} was fenced by member "
                             f"{static.member_id}: another consumer uses group.instance.id {instance_id}.")
        if epoch == STATIC_LEAVE_EPOCH and static is not None:
            # A static member leaving for a while (a restart) keeps its
            # partitions until its session times out: nobody else is given
            # them, and the consumer that comes back with this instance id
            # takes them over without a rebalance.
            static.member_epoch = STATIC_LEAVE_EPOCH
            static.pending_revocation = {}
            static.revocation_deadline_ms = None
            static.state = STABLE
            self._write_current(group, static, fx)
            self.reconcile_waiting(group, static, fx)
            return response_cls(throttle_time=timedelta(0), error_code=ErrorCode.none, member_id=member_id,
                                member_epoch=epoch, heartbeat_interval=timedelta(0), assignment=None)
        if epoch == 0 and static is not None and static.member_id != member_id:
            if static.member_epoch != STATIC_LEAVE_EPOCH:
                return error(ErrorCode.unreleased_instance_id,
                             f"Static member {member_id} with instance id {instance_id} cannot join group "
                             f"{group.group_id}: member {static.member_id} still holds the instance id. "
                             f"Give each consumer its own group.instance.id, or close the other one first.")
            self._replace_static(group, static, member_id, fx)
        if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            if group is not None and member_id in group.members:
                self._remove_member(group, member_id, fx)
                self._maybe_assign(group, topics, fx)
            return response_cls(throttle_time=timedelta(0), error_code=ErrorCode.none, member_id=member_id,
                                member_epoch=epoch, heartbeat_interval=timedelta(0), assignment=None)
        if group is None:
            if epoch != 0:
                return error(ErrorCode.unknown_member_id if epoch > 0 else ErrorCode.group_id_not_found,
                             f"Group {request.group_id} not found.")
            group = self.groups[request.group_id] = ConsumerGroup(request.group_id)
        member = group.members.get(member_id)
        if member is None or epoch == 0:
            if epoch != 0:
                return error(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {group.group_id}.")
            if member is None:
                member = ConsumerMember(member_id)
                group.members[member_id] = member
                changed = True
            else:
                changed = False
        else:
            changed = False
            owned = _owned(request.topic_partitions)
            if epoch != member.member_epoch and not (
                    epoch == member.previous_member_epoch and owned is not None
                    and not _minus(owned, member.assigned)):
                return error(ErrorCode.fenced_member_epoch,
                             f"The member epoch {epoch} is not {member.member_epoch}: rejoin with epoch 0.")
        # Subscription and member metadata (null fields: unchanged).
        updates = {"client_id": ctx.client_id, "client_host": ctx.client_host}
        if request.instance_id is not None:
            updates["instance_id"] = request.instance_id
        if request.rack_id is not None:
            updates["rack_id"] = request.rack_id
        if request.subscribed_topic_names is not None:
            updates["subscribed_topic_names"] = tuple(sorted(request.subscribed_topic_names))
        regex = getattr(request, "subscribed_topic_regex", None)
        if regex is not None:
            updates["subscribed_topic_regex"] = regex or None
        if request.server_assignor is not None:
            updates["server_assignor"] = request.server_assignor
        rebalance_timeout_ms = int(request.rebalance_timeout.total_seconds() * 1000)
        if rebalance_timeout_ms > 0:
            updates["rebalance_timeout_ms"] = rebalance_timeout_ms
        metadata_changed = changed
        subscription_changed = changed
        for name, value in updates.items():
            if getattr(member, name) != value:
                metadata_changed = True
                if name in ("subscribed_topic_names", "subscribed_topic_regex", "server_assignor"):
                    subscription_changed = True
                setattr(member, name, value)
        if metadata_changed:
            self._write_member(group, member, fx)
        if subscription_changed:
            self._bump(group, fx)
        member.session_deadline_ms = now_ms + member.session_timeout_ms(cfg)
        self._maybe_assign(group, topics, fx)
        self._reconcile(group, member, _owned(request.topic_partitions), fx)
        self.reconcile_waiting(group, member, fx)
        assignment = None
        if member.assignment_changed or epoch == 0:
            assignment = _assignment(response_cls, member.assigned)
            member.assignment_changed = False
        return response_cls(throttle_time=timedelta(0), error_code=ErrorCode.none, member_id=member_id,
                            member_epoch=member.member_epoch,
                            heartbeat_interval=timedelta(milliseconds=cfg.group_consumer_heartbeat_interval_ms), assignment=assignment)

    def reconcile_waiting(self, group: ConsumerGroup, member: ConsumerMember, fx: Effects) -> None:
        """Others may be waiting for what `member` just released. A classic
        member is left out: it learns its partitions only by rejoining (its
        Heartbeat tells it to), so the coordinator must not move them
        behind its back."""
        for other in group.members.values():
            if other is not member and other.state == UNRELEASED and other.classic is None:
                self._reconcile(group, other, None, fx)

    def request_error(self, request: Any, member_id: str) -> tuple[ErrorCode, str] | None:
        """What is wrong with a ConsumerGroupHeartbeat whatever the group's state."""
        cfg = self.config
        epoch = request.member_epoch
        if not request.group_id:
            return ErrorCode.invalid_request, "GroupId can't be empty."
        if not member_id:
            return ErrorCode.invalid_request, "MemberId can't be empty."
        if epoch == 0 and request.server_assignor and request.server_assignor not in cfg.group_consumer_assignors:
            return ErrorCode.unsupported_assignor, (
                f"ServerAssignor {request.server_assignor} is not supported; "
                f"this broker has {', '.join(cfg.group_consumer_assignors)} (group.consumer.assignors).")
        if epoch == 0 and request.subscribed_topic_names is None and not getattr(request, "subscribed_topic_regex", None):
            return ErrorCode.invalid_request, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        return None

    def _maybe_assign(self, group: ConsumerGroup, topics: TopicMetadata, fx: Effects) -> None:
        """Bump the epoch if subscribed topics changed; recompute the target if behind."""
        names = {t for m in group.members.values() for t in subscribed_topics(m, topics)}
        metadata = {t: topics[t] for t in sorted(names)}
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            fx.records.append(cr.partition_metadata_record(group.group_id, metadata))
            # One bump per change: an epoch already ahead of the target
            # gets a target computed from these topics anyway.
            if group.members and group.group_epoch <= group.assignment_epoch:
                self._bump(group, fx)
        if group.group_epoch <= group.assignment_epoch:
            return
        assignors = [m.server_assignor for m in group.members.values() if m.server_assignor]
        # The most wanted assignor of the members, else the broker's default.
        assignor = max(sorted(set(assignors)), key=assignors.count) if assignors \
            else self.config.group_consumer_assignors[0]
        target = assign(assignor, group, topics, self.partition_racks)
        for m, a in target.items():
            if group.target.get(m) != a:
                fx.records.append(cr.target_member_record(group.group_id, m, a))
        group.target = target
        group.assignment_epoch = group.group_epoch
        fx.consumer_rebalances += 1
        fx.records.append(cr.target_metadata_record(group.group_id, group.assignment_epoch))

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None,
                   fx: Effects) -> None:
        if member.member_epoch == STATIC_LEAVE_EPOCH:
            return  # away until it comes back or its session times out; it keeps what it has
        before = (member.member_epoch, member.previous_member_epoch, member.state, member.assigned,
                  member.pending_revocation)
        if member.state == UNREVOKED:
            if owned is None or _intersect(owned, member.pending_revocation):
                return  # still revoking
            member.pending_revocation = {}
            member.revocation_deadline_ms = None
        target = group.target.get(member.member_id, {})
        if member.member_epoch == group.assignment_epoch and member.state == STABLE and member.assigned == target:
            return
        keep = _intersect(member.assigned, target)
        revoke = _minus(member.assigned, target)
        if revoke:
            member.assigned = keep
            member.pending_revocation = revoke
            member.state = UNREVOKED
            member.revocation_deadline_ms = fx.now_ms + member.rebalance_timeout_ms
        else:
            held = {}
            for other in group.members.values():
                if other is not member:
                    held = _union(held, _union(other.assigned, other.pending_revocation))
            wanted = _minus(target, keep)
            free = _minus(wanted, held)
            member.assigned = _union(keep, free)
            member.state = UNRELEASED if _intersect(wanted, held) else STABLE
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = group.assignment_epoch
        after = (member.member_epoch, member.previous_member_epoch, member.state, member.assigned,
                 member.pending_revocation)
        if after != before:
            if member.assigned != before[3]:
                member.assignment_changed = True
            self._write_current(group, member, fx)

    def validate_offset_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int) -> ErrorCode | None:
        """An OffsetCommit to a consumer group: by a member at its epoch (or
        its previous epoch while it reconciles), or by an admin (epoch -1,
        no member) while the group is empty."""
        if member_epoch < 0 and not member_id:
            return None if not group.members else ErrorCode.unknown_member_id
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member.classic is not None:
            # A classic member commits with its generation, which is its member epoch.
            return None if member_epoch == member.member_epoch else ErrorCode.illegal_generation
        if member_epoch not in (member.member_epoch, member.previous_member_epoch) \
                or member_epoch > member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    # --- timers ------------------------------------------------------------------

    def timers(self):
        for gid, group in self.groups.items():
            for mid, member in group.members.items():
                if member.session_deadline_ms is not None:
                    yield member.session_deadline_ms, 4, gid, "consumer-session", mid
                if member.revocation_deadline_ms is not None:
                    yield member.revocation_deadline_ms, 5, gid, "consumer-revocation", mid

    def fire(self, group_id: str, kind: str, member_id: str, topics: TopicMetadata, fx: Effects) -> None:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if member is None:
            return
        when = member.session_deadline_ms if kind == "consumer-session" else member.revocation_deadline_ms
        if when is None or when > fx.now_ms:
            return
        # Session expired, or the member did not revoke in its rebalance
        # timeout: it is fenced and its partitions go to the others.
        if self.fence_hook is not None and self.fence_hook(group, member_id, fx):
            return
        self._remove_member(group, member_id, fx)
        self._maybe_assign(group, topics, fx)
        for other in group.members.values():
            if other.classic is None:
                self._reconcile(group, other, None, fx)

    def on_loaded(self, now_ms: int) -> None:
        for group in self.groups.values():
            for member in group.members.values():
                member.session_deadline_ms = now_ms + member.session_timeout_ms(self.config)
                member.assignment_changed = True

    # --- replay --------------------------------------------------------------------

    def replay(self, key: Any, value: Any) -> None:
        kind, gid, mid = key
        group = self.groups.get(gid)
        if value is None:
            if group is None:
                return
            if kind == cr.GROUP_METADATA_KEY:
                del self.groups[gid]
            elif kind == cr.MEMBER_METADATA_KEY:
                group.members.pop(mid, None)
            elif kind == cr.TARGET_MEMBER_KEY:
                group.target.pop(mid, None)
            elif kind == cr.CURRENT_ASSIGNMENT_KEY and mid in group.members:
                m = group.members[mid]
                m.assigned, m.pending_revocation, m.member_epoch = {}, {}, 0
            return
        if group is None:
            group = self.groups[gid] = ConsumerGroup(gid)
        if kind == cr.GROUP_METADATA_KEY:
            group.group_epoch = value
        elif kind == cr.PARTITION_METADATA_KEY:
            group.subscription_metadata = value
        elif kind == cr.TARGET_METADATA_KEY:
            group.assignment_epoch = value
        elif kind == cr.TARGET_MEMBER_KEY:
            group.target[mid] = value
        elif kind == cr.MEMBER_METADATA_KEY or kind == cr.CURRENT_ASSIGNMENT_KEY:
            member = group.members.setdefault(mid, ConsumerMember(mid))
            for name, v in value.items():
                setattr(member, name, v)


def _static_member(group: ConsumerGroup, instance_id: str) -> ConsumerMember | None:
    return next((m for m in group.members.values() if m.instance_id == instance_id), None)


def _assignment(response_cls: Any, assigned: Assignment) -> Any:
    mod = importlib.import_module(response_cls.__module__)
    return mod.Assignment(topic_partitions=tuple(
        mod.TopicPartitions(topic_id=t, partitions=tuple(sorted(ps))) for t, ps in sorted(assigned.items(), key=lambda x: str(x[0]))))


def describe(group: ConsumerGroup | None, group_id: str, topics_by_id: Mapping[uuid.UUID, str], mod: Any,
             include_authorized_operations: bool) -> Any:
    if group is None:
        return mod.DescribedGroup(error_code=ErrorCode.group_id_not_found, error_message=f"Group {group_id} not found.",
                                  group_id=group_id, group_state="Dead", group_epoch=-1, assignment_epoch=-1,
                                  assignor_name="", members=(), authorized_operations=-2147483648)

    def tps(a: Assignment) -> Any:
        return mod.Assignment(topic_partitions=tuple(
            mod.TopicPartitions(topic_id=t, topic_name=topics_by_id.get(t, ""), partitions=tuple(sorted(ps)))
            for t, ps in sorted(a.items(), key=lambda x: str(x[0]))))

    assignors = [m.server_assignor for m in group.members.values() if m.server_assignor]
    members = tuple(mod.Member(
        member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
        client_id=m.client_id, client_host=m.client_host,
        subscribed_topic_names=m.subscribed_topic_names, subscribed_topic_regex=m.subscribed_topic_regex,
        assignment=tps(m.assigned), target_assignment=tps(group.target.get(m.member_id, {})),
        **({"member_type": 0 if m.classic is not None else 1} if "member_type" in mod.Member.__dataclass_fields__ else {}))
        for m in sorted(group.members.values(), key=lambda m: m.member_id))
    return mod.DescribedGroup(error_code=ErrorCode.none, error_message=None, group_id=group_id,
                              group_state=group.state_name(), group_epoch=group.group_epoch,
                              assignment_epoch=group.assignment_epoch,
                              assignor_name=assignors[0] if assignors else "uniform",
                              members=members, authorized_operations=-2147483648)
