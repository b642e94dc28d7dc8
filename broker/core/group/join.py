"""JoinGroup: who may join a classic group, and when the answer comes (pure).

Theory of operation
-------------------
A JoinGroup either gets an answer at once (an error, MEMBER_ID_REQUIRED,
or the current generation for a member whose join changes nothing) or is
parked until the join phase ends (`rebalance.complete_join`).

- KIP-394 (JoinGroup v4+): a dynamic member joining without a member id is
  not added yet; it gets MEMBER_ID_REQUIRED with a fresh id and must join
  again with it within its session timeout. Before v4 it is added at once.
- KIP-345 (v5+): a static member (`group.instance.id`) joining without a
  member id takes over its instance's place under a new member id; the old
  id is fenced (its parked requests and every later request get
  FENCED_INSTANCE_ID). In a Stable group whose selected protocol does not
  change, this needs no rebalance: the new id is stored and the member
  gets the current generation. Before v9 it is told the *old* leader id, so
  a restarted leader acts as a follower and keeps the current assignment;
  from v9 the leader gets the members with `skip_assignment` (KIP-814).
- A follower rejoining a Stable or CompletingRebalance group with the same
  protocols gets the current generation at once; the leader rejoining, or
  any member with new protocols, starts a rebalance.

Member ids are `<client.id or group.instance.id>-<uuid4>` as in Kafka, the
uuid drawn from the shard's injected `random.Random`.

A group created by a JoinGroup is written at once as an empty group
record, so that it survives a coordinator failover even before its first
generation ends (Kafka does the same).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from broker.core.group import rebalance
from broker.core.group.classic_group import ClassicGroup, GroupState, Member, Parked
from broker.core.group.effects import Effects, RequestContext
from broker.core.group.records import GroupMetadataValue, group_metadata_record
from broker.core.group.responses import join_response, request_version, response_module
from common.wire.codec import duration_ms

if TYPE_CHECKING:
    from broker.core.group.shard import GroupCoordinatorShard

#: KIP-394: from this JoinGroup version a dynamic member needs an id first.
REQUIRES_KNOWN_MEMBER_ID_VERSION = 4
#: KIP-814: from this version the coordinator may tell the leader to skip
#: the assignment.
SKIP_ASSIGNMENT_VERSION = 9


def timedelta_ms(value: Any, default: int) -> int:
    if value is None:
        return default
    return duration_ms(value)


class _Join:
    """One JoinGroup being decided."""

    def __init__(self, shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
        self.shard = shard
        self.cfg = shard.config
        self.ctx = ctx
        self.fx = fx
        self.mod = response_module(request)
        self.version = request_version(request)
        self.parked = Parked(ctx.token, self.mod)
        self.group_id = request.group_id
        self.member_id = request.member_id
        self.instance_id = getattr(request, "group_instance_id", None)
        self.session_timeout_ms = timedelta_ms(request.session_timeout, 0)
        # JoinGroup v0 has no rebalance timeout: the session timeout serves.
        self.rebalance_timeout_ms = timedelta_ms(getattr(request, "rebalance_timeout", None), self.session_timeout_ms)
        self.protocol_type = request.protocol_type
        self.protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)

    def fail(self, error: ErrorCode, member_id: str | None = None) -> None:
        self.fx.reply(self.parked, join_response(self.mod, error,
                                                 member_id=self.member_id if member_id is None else member_id))

    def run(self) -> None:
        cfg = self.cfg
        if not self.group_id:
            return self.fail(ErrorCode.invalid_group_id)
        if not cfg.group_min_session_timeout_ms <= self.session_timeout_ms <= cfg.group_max_session_timeout_ms:
            return self.fail(ErrorCode.invalid_session_timeout)
        group = self.shard.groups.get(self.group_id)
        created = group is None
        if group is None:
            if self.member_id:
                return self.fail(ErrorCode.unknown_member_id)
            group = ClassicGroup(self.group_id, current_state_timestamp_ms=self.fx.now_ms)
            self.shard.groups[self.group_id] = group
        records_before = len(self.fx.records)
        if not self.accepts(group):
            member = group.members.get(self.member_id)
            if member is not None:
                rebalance.evict(group, member, self.fx)
            self.fail(ErrorCode.group_max_size_reached, member_id="")
        elif not self.member_id:
            self.join_new_member(group)
        else:
            self.join_existing_member(group)
        if created:
            if not group.members and not group.pending_join_members:
                del self.shard.groups[self.group_id]  # a refused first join creates nothing
            elif len(self.fx.records) == records_before:
                self.fx.records.append(group_metadata_record(self.group_id, GroupMetadataValue(
                    protocol_type=group.protocol_type or "", generation=group.generation_id, protocol=None,
                    leader=None, current_state_timestamp_ms=group.current_state_timestamp_ms, members=())))

    def accepts(self, group: ClassicGroup) -> bool:
        """`group.max.size`: during a join phase count the members already
        rejoined (so the last to rejoin of an oversized group are refused);
        otherwise the members."""
        limit = self.cfg.group_max_size
        if group.state is GroupState.EMPTY:
            return True
        member = group.members.get(self.member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            return (member is not None and member.awaiting_join is not None) or group.num_awaiting_join() < limit
        return member is not None or len(group.members) < limit

    # --- a member without an id ---------------------------------------------

    def join_new_member(self, group: ClassicGroup) -> None:
        if not group.supports_protocols(self.protocol_type, {n for n, _ in self.protocols}):
            return self.fail(ErrorCode.inconsistent_group_protocol, member_id="")
        new_member_id = self.shard.new_member_id(self.instance_id if self.instance_id is not None
                                                 else self.ctx.client_id)
        if self.instance_id is not None:
            old_member_id = group.static_members.get(self.instance_id)
            if old_member_id is not None:
                return self.replace_static_member(group, old_member_id, new_member_id)
            return self.add_member(group, new_member_id)
        if self.version >= REQUIRES_KNOWN_MEMBER_ID_VERSION:
            group.pending_join_members[new_member_id] = rebalance.deadline(self.fx.now_ms, self.session_timeout_ms)
            return self.fail(ErrorCode.member_id_required, member_id=new_member_id)
        return self.add_member(group, new_member_id)

    def add_member(self, group: ClassicGroup, member_id: str) -> None:
        member = Member(
            member_id=member_id, group_instance_id=self.instance_id, client_id=self.ctx.client_id,
            client_host=self.ctx.client_host, rebalance_timeout_ms=self.rebalance_timeout_ms,
            session_timeout_ms=self.session_timeout_ms, protocol_type=self.protocol_type,
            protocols=self.protocols, is_new=True, awaiting_join=self.parked,
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.previous_state is GroupState.EMPTY:
            group.new_member_added = True  # extends the initial rebalance (KIP-134)
        group.add(member)
        rebalance.reschedule_heartbeat(member, self.fx.now_ms, self.cfg.group_new_member_join_timeout_ms)
        rebalance.maybe_prepare_rebalance_or_complete_join(group, self.fx, self.cfg)

    def replace_static_member(self, group: ClassicGroup, old_member_id: str, new_member_id: str) -> None:
        fx = self.fx
        old = group.members[old_member_id]
        old_leader = group.leader_id
        rebalance.answer_parked(old, fx, ErrorCode.fenced_instance_id, member_id=old_member_id)
        member = group.replace_static_member(self.instance_id, old_member_id, new_member_id)
        rebalance.reschedule_heartbeat(member, fx.now_ms)
        group.update_member(member, self.protocols, self.rebalance_timeout_ms, self.session_timeout_ms)
        if group.state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # Its subscription may have changed with the same protocol.
                group.subscribed_topics = group.compute_subscribed_topics()
                rebalance.store_group(group, fx)
                if self.version >= SKIP_ASSIGNMENT_VERSION:
                    is_leader = group.is_leader(new_member_id)
                    answer = rebalance.joined_answer(group, member, with_members=is_leader)
                    fx.reply(self.parked, join_response(self.mod, ErrorCode.none, skip_assignment=is_leader, **answer))
                else:
                    answer = rebalance.joined_answer(group, member, with_members=False)
                    answer["leader"] = old_leader or ""
                    fx.reply(self.parked, join_response(self.mod, ErrorCode.none, **answer))
                return
            rebalance.park_join(member, self.parked, fx)
            rebalance.maybe_prepare_rebalance_or_complete_join(group, fx, self.cfg)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old id: start over.
            rebalance.park_join(member, self.parked, fx)
            rebalance.prepare_rebalance(group, fx, self.cfg)
        else:
            assert group.state is GroupState.PREPARING_REBALANCE, f"static member in a {group.state} group"
            rebalance.park_join(member, self.parked, fx)
            rebalance.maybe_complete_join_phase(group, fx, self.cfg)

    # --- a member with an id ---------------------------------------------------

    def join_existing_member(self, group: ClassicGroup) -> None:
        fx = self.fx
        if not group.supports_protocols(self.protocol_type, {n for n, _ in self.protocols}):
            return self.fail(ErrorCode.inconsistent_group_protocol)
        if self.member_id in group.pending_join_members:
            if self.instance_id is not None:
                # Pending ids are only handed to dynamic members.
                return self.fail(ErrorCode.unknown_member_id)
            return self.add_member(group, self.member_id)
        error = group.validate_member(self.member_id, self.instance_id)
        if error is not None:
            return self.fail(error)
        member = group.members[self.member_id]
        same_protocols = member.protocols == self.protocols
        if group.state is GroupState.PREPARING_REBALANCE:
            return self.update_member(group, member)
        if group.state is GroupState.COMPLETING_REBALANCE:
            if same_protocols:
                # Probably a retry of a lost answer: the current generation.
                answer = rebalance.joined_answer(group, member, with_members=group.is_leader(member.member_id))
                return fx.reply(self.parked, join_response(self.mod, ErrorCode.none, **answer))
            return self.update_member(group, member)
        if group.state is GroupState.STABLE:
            if group.is_leader(member.member_id) or not same_protocols:
                # A rejoining leader asks for a new assignment (new topics).
                return self.update_member(group, member)
            answer = rebalance.joined_answer(group, member, with_members=False)
            return fx.reply(self.parked, join_response(self.mod, ErrorCode.none, **answer))
        return self.fail(ErrorCode.unknown_member_id)

    def update_member(self, group: ClassicGroup, member: Member) -> None:
        group.update_member(member, self.protocols, self.rebalance_timeout_ms, self.session_timeout_ms)
        rebalance.park_join(member, self.parked, self.fx)
        rebalance.maybe_prepare_rebalance_or_complete_join(group, self.fx, self.cfg)


def handle_join_group(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    _Join(shard, ctx, request, fx).run()
