"""SyncGroup, Heartbeat and LeaveGroup of the classic protocol (pure).

Theory of operation
-------------------
Each request is first checked against the member's identity and
generation, in Kafka's order: group id present (INVALID_GROUP_ID), group
known (UNKNOWN_MEMBER_ID), member current (`validate_member`:
FENCED_INSTANCE_ID for a static member under an old id, else
UNKNOWN_MEMBER_ID), generation current (ILLEGAL_GENERATION). The clients
react to these exactly: UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION reset the
member and rejoin, REBALANCE_IN_PROGRESS rejoins keeping the member id,
FENCED_INSTANCE_ID is fatal for the fenced instance.

- SyncGroup during the sync phase parks; the leader's brings the
  assignment (`rebalance.complete_sync`), which answers every parked one.
  In a Stable group it answers at once with the member's assignment;
  during a join phase, REBALANCE_IN_PROGRESS.
- Heartbeat keeps the session (REBALANCE_IN_PROGRESS during a join phase
  tells the member to rejoin).
- LeaveGroup removes members (v3+ in a batch, each with its own result,
  and by `group.instance.id` alone for an admin removal of a static
  member); the group rebalances. A pending KIP-394 id that leaves is just
  forgotten: Kafka also starts a rebalance for it, which changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from broker.core.group import rebalance
from broker.core.group.classic_group import GroupState, Parked
from broker.core.group.effects import Effects, RequestContext
from broker.core.group.responses import heartbeat_response, leave_response, response_module, sync_response

if TYPE_CHECKING:
    from broker.core.group.shard import GroupCoordinatorShard


def handle_sync_group(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    mod = response_module(request)
    parked = Parked(ctx.token, mod)

    def fail(error: ErrorCode) -> None:
        fx.reply(parked, sync_response(mod, error))

    if not request.group_id:
        return fail(ErrorCode.invalid_group_id)
    group = shard.groups.get(request.group_id)
    if group is None or group.state is GroupState.EMPTY:
        return fail(ErrorCode.unknown_member_id)
    error = group.validate_member(request.member_id, getattr(request, "group_instance_id", None))
    if error is not None:
        return fail(error)
    if request.generation_id != group.generation_id:
        return fail(ErrorCode.illegal_generation)
    if (_inconsistent(getattr(request, "protocol_type", None), group.protocol_type)
            or _inconsistent(getattr(request, "protocol_name", None), group.protocol_name)):
        return fail(ErrorCode.inconsistent_group_protocol)
    if group.state is GroupState.PREPARING_REBALANCE:
        return fail(ErrorCode.rebalance_in_progress)
    member = group.members[request.member_id]
    rebalance.remove_pending_sync(group, member.member_id)
    if group.state is GroupState.COMPLETING_REBALANCE:
        rebalance.park_sync(member, parked, fx)
        if group.is_leader(member.member_id):
            assignment = {a.member_id: bytes(a.assignment) for a in request.assignments}
            rebalance.complete_sync(group, assignment, fx)
        return None
    fx.reply(parked, sync_response(mod, ErrorCode.none, protocol_type=group.protocol_type,
                                   protocol_name=group.protocol_name, assignment=member.assignment))
    return None


def _inconsistent(asked: str | None, actual: str | None) -> bool:
    # SyncGroup v5 repeats the protocol; an older or null field is not checked.
    return asked is not None and asked != actual


def handle_heartbeat(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    mod = response_module(request)

    def answer(error: ErrorCode) -> None:
        fx.respond(ctx.token, heartbeat_response(mod, error))

    if not request.group_id:
        return answer(ErrorCode.invalid_group_id)
    group = shard.groups.get(request.group_id)
    if group is None:
        return answer(ErrorCode.unknown_member_id)
    error = group.validate_member(request.member_id, getattr(request, "group_instance_id", None))
    if error is not None:
        return answer(error)
    if request.generation_id != group.generation_id:
        return answer(ErrorCode.illegal_generation)
    if group.state is GroupState.EMPTY:
        return answer(ErrorCode.unknown_member_id)
    rebalance.reschedule_heartbeat(group.members[request.member_id], fx.now_ms)
    if group.state is GroupState.PREPARING_REBALANCE:
        return answer(ErrorCode.rebalance_in_progress)
    return answer(ErrorCode.none)


def handle_leave_group(shard: GroupCoordinatorShard, ctx: RequestContext, request: Any, fx: Effects) -> None:
    mod = response_module(request)
    if hasattr(request, "members"):
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    if not request.group_id:
        return fx.respond(ctx.token, leave_response(mod, ErrorCode.invalid_group_id))
    group = shard.groups.get(request.group_id)
    if group is None:
        return fx.respond(ctx.token, leave_response(
            mod, ErrorCode.none, [(m, i, ErrorCode.unknown_member_id) for m, i in leaving]))
    results = []
    removed = False
    forgot_pending = False
    for member_id, instance_id in leaving:
        if not member_id:
            # An admin removing a static member by its instance id.
            holder = group.static_members.get(instance_id) if instance_id is not None else None
            if holder is None:
                results.append((member_id, instance_id, ErrorCode.unknown_member_id))
                continue
            rebalance.evict(group, group.members[holder], fx)
            removed = True
        elif member_id in group.pending_join_members:
            del group.pending_join_members[member_id]
            forgot_pending = True
        else:
            error = group.validate_member(member_id, instance_id)
            if error is not None:
                results.append((member_id, instance_id, error))
                continue
            rebalance.evict(group, group.members[member_id], fx)
            removed = True
        results.append((member_id, instance_id, ErrorCode.none))
    if removed and group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
        rebalance.maybe_prepare_rebalance_or_complete_join(group, fx, shard.config)
    elif (removed or forgot_pending) and group.state is GroupState.PREPARING_REBALANCE:
        rebalance.maybe_complete_join_phase(group, fx, shard.config)
    return fx.respond(ctx.token, leave_response(mod, ErrorCode.none, results))
