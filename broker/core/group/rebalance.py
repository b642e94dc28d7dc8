"""The phases of a classic-group rebalance and the timers that end them (pure).

Theory of operation
-------------------
A rebalance has two phases. In the *join* phase (PreparingRebalance) each
member's JoinGroup is parked until every known member has rejoined or the
group's rebalance timeout (the largest of its members') passes; members
that did not rejoin are dropped (static members are kept, KIP-345), a new
generation starts, a leader is kept or elected and a protocol selected,
and every parked JoinGroup is answered (only the leader's answer lists the
members with their metadata). In the *sync* phase (CompletingRebalance)
the followers' SyncGroups are parked until the leader's SyncGroup brings
the assignment; the group becomes Stable, its metadata record (with every
member's assignment) is written, and each parked SyncGroup is answered
with its member's assignment. Members that do not send SyncGroup within
the rebalance timeout are dropped and a new rebalance starts.

The first rebalance of an empty group waits `group.initial.rebalance.delay.ms`
before ending the join phase, extended by the same delay while new members
keep arriving, but never past the rebalance timeout (KIP-134).

Sessions: every member has a heartbeat deadline, moved forward by
Heartbeat, OffsetCommit and the end of each phase. When it passes, a
member that is not waiting in a phase is removed, which starts a
rebalance; a member added in this rebalance (`is_new`) is removed even
while its JoinGroup is parked (its client may have gone away; Kafka gives
it `group.new.member.join.timeout` = 5 minutes).

Every parked request is answered exactly once: when its phase ends, when
its member is removed or fenced (UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID),
when the same member parks a newer request (REBALANCE_IN_PROGRESS; Kafka
silently drops the older one), or NOT_COORDINATOR when the shard unloads.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from broker.core.group.classic_group import ClassicGroup, GroupState, Member, Parked
from broker.core.group.config import GroupCoordinatorConfig
from broker.core.group.effects import Effects
from broker.core.group.records import GroupMetadataValue, MemberMetadata, group_metadata_record
from broker.core.group.responses import join_response, sync_response


def deadline(now_ms: int, timeout_ms: int) -> int:
    # At least 1 ms ahead, so that a zero timeout cannot spin `tick`.
    return now_ms + max(timeout_ms, 1)


def reschedule_heartbeat(member: Member, now_ms: int, timeout_ms: int | None = None) -> None:
    member.heartbeat_deadline_ms = deadline(now_ms, member.session_timeout_ms if timeout_ms is None else timeout_ms)


# --- the stored form of a group ------------------------------------------------


def group_metadata_value(group: ClassicGroup) -> GroupMetadataValue:
    return GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=group.protocol_name,
        leader=group.leader_id,
        current_state_timestamp_ms=group.current_state_timestamp_ms,
        members=tuple(
            MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                           m.session_timeout_ms, m.metadata(group.protocol_name), m.assignment)
            for m in group.members.values()
        ),
    )


def store_group(group: ClassicGroup, fx: Effects) -> None:
    fx.records.append(group_metadata_record(group.group_id, group_metadata_value(group)))


# --- parking and answering -------------------------------------------------------


def park_join(member: Member, parked: Parked, fx: Effects) -> None:
    if member.awaiting_join is not None and member.awaiting_join.token != parked.token:
        fx.reply(member.awaiting_join, join_response(member.awaiting_join.reply, ErrorCode.rebalance_in_progress,
                                                     member_id=member.member_id))
    member.awaiting_join = parked


def park_sync(member: Member, parked: Parked, fx: Effects) -> None:
    if member.awaiting_sync is not None and member.awaiting_sync.token != parked.token:
        fx.reply(member.awaiting_sync, sync_response(member.awaiting_sync.reply, ErrorCode.rebalance_in_progress))
    member.awaiting_sync = parked


def answer_parked(member: Member, fx: Effects, error: ErrorCode, *, member_id: str = "") -> None:
    """Answer whatever `member` has parked with `error`."""
    if member.awaiting_join is not None:
        fx.reply(member.awaiting_join, join_response(member.awaiting_join.reply, error, member_id=member_id))
        member.awaiting_join = None
    if member.awaiting_sync is not None:
        fx.reply(member.awaiting_sync, sync_response(member.awaiting_sync.reply, error))
        member.awaiting_sync = None


def evict(group: ClassicGroup, member: Member, fx: Effects, error: ErrorCode = ErrorCode.unknown_member_id) -> None:
    """Remove `member`, answering what it had parked with `error` (its
    client then rejoins from scratch)."""
    answer_parked(member, fx, error)
    group.remove(member.member_id)


def joined_answer(group: ClassicGroup, member: Member, *, with_members: bool) -> dict:
    """The JoinGroup answer fields for `member` in the current generation."""
    members = ()
    if with_members:
        members = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
                        for m in group.members.values())
    return dict(member_id=member.member_id, generation_id=group.generation_id, protocol_type=group.protocol_type,
                protocol_name=group.protocol_name, leader=group.leader_id or "", members=members)


def propagate_assignment(group: ClassicGroup, fx: Effects, error: ErrorCode) -> None:
    ok = error == ErrorCode.none
    for member in group.members.values():
        if member.awaiting_sync is None:
            continue
        fx.reply(member.awaiting_sync, sync_response(
            member.awaiting_sync.reply, error, protocol_type=group.protocol_type if ok else None,
            protocol_name=group.protocol_name if ok else None, assignment=member.assignment))
        member.awaiting_sync = None
        # Syncing kept the session alive; count it from now.
        reschedule_heartbeat(member, fx.now_ms)


def remove_pending_sync(group: ClassicGroup, member_id: str) -> None:
    group.pending_sync_members.discard(member_id)
    if not group.pending_sync_members:
        group.sync_deadline_ms = None


# --- phases ----------------------------------------------------------------------


def maybe_prepare_rebalance_or_complete_join(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    if group.can_rebalance():
        prepare_rebalance(group, fx, cfg)
    else:
        maybe_complete_join_phase(group, fx, cfg)


def prepare_rebalance(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    if group.state is GroupState.COMPLETING_REBALANCE:
        # The assignment being computed is for a membership that just changed.
        for member in group.members.values():
            member.assignment = b""
        propagate_assignment(group, fx, ErrorCode.rebalance_in_progress)
    group.pending_sync_members.clear()
    group.sync_deadline_ms = None
    initial = group.state is GroupState.EMPTY
    if initial:
        # KIP-134: give the other members of a starting group time to arrive.
        delay_ms = cfg.group_initial_rebalance_delay_ms
        group.new_member_added = False
        group.initial_rebalance = (delay_ms, max(group.rebalance_timeout_ms() - delay_ms, 0))
        group.join_deadline_ms = deadline(fx.now_ms, delay_ms)
    group.transition_to(GroupState.PREPARING_REBALANCE, fx.now_ms)
    if not initial:
        if group.has_all_members_joined():
            complete_join(group, fx, cfg)
        else:
            group.initial_rebalance = None
            group.join_deadline_ms = deadline(fx.now_ms, group.rebalance_timeout_ms())


def maybe_complete_join_phase(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    if (group.state is GroupState.PREPARING_REBALANCE
            and group.previous_state is not GroupState.EMPTY  # the initial rebalance waits for its timer
            and group.has_all_members_joined()):
        complete_join(group, fx, cfg)


def complete_join(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    assert group.state is GroupState.PREPARING_REBALANCE, f"group {group.group_id} is {group.state}"
    group.join_deadline_ms = None
    group.initial_rebalance = None
    for member in list(group.members.values()):
        if member.awaiting_join is None and member.group_instance_id is None:
            evict(group, member, fx)
    if not group.maybe_elect_new_joined_leader() and group.members:
        # Only static members are left and none rejoined: wait for them (or
        # for their sessions to expire) another rebalance timeout.
        group.join_deadline_ms = deadline(fx.now_ms, group.rebalance_timeout_ms())
        return
    group.init_next_generation(fx.now_ms)
    if group.state is GroupState.EMPTY:
        store_group(group, fx)
        return
    fx.rebalances += 1
    for member in group.members.values():
        if member.awaiting_join is not None:
            answer = joined_answer(group, member, with_members=group.is_leader(member.member_id))
            fx.reply(member.awaiting_join, join_response(member.awaiting_join.reply, ErrorCode.none, **answer))
            member.awaiting_join = None
        reschedule_heartbeat(member, fx.now_ms)
        member.is_new = False
        group.pending_sync_members.add(member.member_id)
    group.sync_deadline_ms = deadline(fx.now_ms, group.rebalance_timeout_ms())
    group.sync_deadline_generation = group.generation_id


def complete_sync(group: ClassicGroup, assignment: dict[str, bytes], fx: Effects) -> None:
    """The leader's SyncGroup: the group is Stable with this assignment."""
    assert group.state is GroupState.COMPLETING_REBALANCE
    for member in group.members.values():
        member.assignment = assignment.get(member.member_id, b"")
    group.transition_to(GroupState.STABLE, fx.now_ms)
    store_group(group, fx)
    propagate_assignment(group, fx, ErrorCode.none)


# --- timers ------------------------------------------------------------------------


def on_join_deadline(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    group.join_deadline_ms = None
    if group.state is not GroupState.PREPARING_REBALANCE:
        return
    if group.initial_rebalance is not None:
        delay_ms, remaining_ms = group.initial_rebalance
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            next_delay_ms = min(cfg.group_initial_rebalance_delay_ms, remaining_ms)
            group.initial_rebalance = (next_delay_ms, max(remaining_ms - delay_ms, 0))
            group.join_deadline_ms = deadline(fx.now_ms, next_delay_ms)
            return
    complete_join(group, fx, cfg)


def on_sync_deadline(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    group.sync_deadline_ms = None
    if group.sync_deadline_generation != group.generation_id:
        return
    if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) or not group.pending_sync_members:
        return
    for member_id in sorted(group.pending_sync_members):
        member = group.members.get(member_id)
        if member is not None:
            evict(group, member, fx)
    prepare_rebalance(group, fx, cfg)


def on_heartbeat_deadline(group: ClassicGroup, member: Member, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    member.heartbeat_deadline_ms = None
    if member.has_satisfied_heartbeat():
        return
    evict(group, member, fx)
    after_member_removed(group, fx, cfg)


def on_pending_member_deadline(group: ClassicGroup, member_id: str, fx: Effects,
                               cfg: GroupCoordinatorConfig) -> None:
    # KIP-394: the id handed out with MEMBER_ID_REQUIRED was never used.
    group.pending_join_members.pop(member_id, None)
    if group.state is GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
        complete_join(group, fx, cfg)


def after_member_removed(group: ClassicGroup, fx: Effects, cfg: GroupCoordinatorConfig) -> None:
    if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
        maybe_prepare_rebalance_or_complete_join(group, fx, cfg)
    elif group.state is GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
        complete_join(group, fx, cfg)
