"""Rebalances of the classic protocol, driven through the pure shard: what a
consumer sees (generations, leader, protocol, assignments, error codes)
through joins, syncs, leaves, session expiry and timeouts."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from broker.core.group import GroupCoordinatorConfig
from broker.core.group.classic_group import GroupState
from broker.core.group.records import GroupMetadataKey, decode_record
from group_testing import (
    FAST,
    Harness,
    heartbeat_request,
    join_request,
    leave_request,
    subscription,
    sync_request,
)


def stored_groups(h: Harness) -> list:
    """The GroupMetadata values in the log, in order."""
    out = []
    for rec in h.log:
        key, value = decode_record(rec.key, rec.value)
        if isinstance(key, GroupMetadataKey):
            out.append(value)
    return out


def test_three_members_rebalance_to_one_generation_with_one_leader() -> None:
    h = Harness()
    tokens = [h.join_new("g", client_id=f"c{i}") for i in range(3)]
    assert not any(t in h.responses for t in tokens), "JoinGroup parks until the join phase ends"
    h.advance(100)  # the initial delay, extended once: the others joined meanwhile (KIP-134)
    assert not any(t in h.responses for t in tokens)
    h.advance(100)
    joins = [h.responses[t] for t in tokens]
    assert {j.error_code for j in joins} == {ErrorCode.none}
    assert {j.generation_id for j in joins} == {1}
    assert {j.leader for j in joins} == {joins[0].member_id}, "the first member to join leads"
    assert {j.protocol_name for j in joins} == {"range"}
    leader, *followers = joins
    assert sorted(m.member_id for m in leader.members) == sorted(j.member_id for j in joins)
    assert all(m.metadata == subscription("t") for m in leader.members)
    assert all(f.members == () for f in followers), "only the leader gets the member list"

    # Followers' SyncGroups park until the leader's brings the assignment.
    sync_tokens = [h.send(sync_request("g", f.member_id, 1)) for f in followers]
    assert not any(t in h.responses for t in sync_tokens)
    plan = {j.member_id: f"part-{i}".encode() for i, j in enumerate(joins)}
    leader_sync = h.call(sync_request("g", leader.member_id, 1, plan))
    assert leader_sync.assignment == plan[leader.member_id]
    for f, t in zip(followers, sync_tokens):
        assert h.responses[t].error_code == ErrorCode.none
        assert h.responses[t].assignment == plan[f.member_id]
    assert h.group().state is GroupState.STABLE
    stored = stored_groups(h)[-1]
    assert stored.generation == 1 and stored.leader == leader.member_id
    assert {m.member_id: m.assignment for m in stored.members} == plan
    for j in joins:
        assert h.call(heartbeat_request("g", j.member_id, 1)).error_code == ErrorCode.none


def test_protocol_is_the_one_most_members_prefer_among_those_all_support() -> None:
    h = Harness()
    prefs = [
        (("roundrobin", b"1"), ("range", b"1")),
        (("range", b"2"), ("roundrobin", b"2"), ("sticky", b"2")),
        (("roundrobin", b"3"), ("range", b"3")),
    ]
    tokens = [h.join_new("g", client_id=f"c{i}", protocols=p) for i, p in enumerate(prefs)]
    h.advance_until_answered(tokens)
    joins = [h.responses[t] for t in tokens]
    assert {j.protocol_name for j in joins} == {"roundrobin"}
    leader = next(j for j in joins if j.member_id == j.leader)
    # The leader sees each member's metadata for the chosen protocol.
    assert sorted(m.metadata for m in leader.members) == [b"1", b"2", b"3"]
    # A member supporting none of the group's protocols is refused.
    refused = h.call(join_request("g", "", protocols=(("cooperative-sticky", b""),)))
    assert refused.error_code == ErrorCode.inconsistent_group_protocol
    other_type = h.call(join_request("g", "", protocol_type="connect", protocols=(("roundrobin", b""),)))
    assert other_type.error_code == ErrorCode.inconsistent_group_protocol


def test_a_new_member_makes_everyone_rejoin_and_the_phase_ends_when_all_have() -> None:
    h = Harness()
    leader, f1, f2 = h.form_group(3)
    new = h.join_new("g", client_id="c3")
    assert new not in h.responses
    for m in (leader, f1, f2):
        assert h.call(heartbeat_request("g", m.member_id, 1)).error_code == ErrorCode.rebalance_in_progress
    rejoin = [h.send(join_request("g", m.member_id)) for m in (leader, f1)]
    assert not any(t in h.responses for t in rejoin + [new])
    last = h.send(join_request("g", f2.member_id))
    # No timer needed: every known member rejoined.
    joins = [h.responses[t] for t in rejoin + [last, new]]
    assert {j.generation_id for j in joins} == {2}
    assert {j.leader for j in joins} == {leader.member_id}, "a leader that rejoins stays leader"
    # Old-generation requests are refused.
    assert h.call(heartbeat_request("g", f1.member_id, 1)).error_code == ErrorCode.illegal_generation
    assert h.call(sync_request("g", f1.member_id, 1)).error_code == ErrorCode.illegal_generation


def test_members_that_do_not_rejoin_are_dropped_at_the_rebalance_timeout() -> None:
    h = Harness()
    leader, f1, f2 = h.form_group(3, rebalance_ms=5_000)
    t_leader = h.send(join_request("g", leader.member_id, rebalance_ms=5_000))  # the leader asks for a rebalance
    t_f1 = h.send(join_request("g", f1.member_id, rebalance_ms=5_000))
    h.advance(4_900)
    assert t_leader not in h.responses
    h.advance(100)
    a, b = h.responses[t_leader], h.responses[t_f1]
    assert a.generation_id == b.generation_id == 2
    assert sorted(m.member_id for m in a.members) == sorted([leader.member_id, f1.member_id])
    assert h.call(heartbeat_request("g", f2.member_id, 1)).error_code == ErrorCode.unknown_member_id


def test_leader_that_does_not_rejoin_is_replaced_by_a_member_that_did() -> None:
    h = Harness()
    leader, f1, f2 = h.form_group(3, rebalance_ms=5_000)
    tokens = [h.send(join_request("g", m.member_id, rebalance_ms=5_000, protocols=(("range", b"new"),)))
              for m in (f1, f2)]
    h.advance(5_000)
    joins = [h.responses[t] for t in tokens]
    assert {j.leader for j in joins} == {f1.member_id}
    assert {j.generation_id for j in joins} == {2}


def test_leave_group_batched_and_single() -> None:
    h = Harness()
    leader, f1, f2 = h.form_group(3)
    # v3+: a batch, each member with its own result (an unknown one fails alone).
    answer = h.call(leave_request("g", (f1.member_id, None), ("nobody", None), version=3))
    assert answer.error_code == ErrorCode.none
    assert [(m.member_id, m.error_code) for m in answer.members] == [
        (f1.member_id, ErrorCode.none), ("nobody", ErrorCode.unknown_member_id)]
    assert h.group().state is GroupState.PREPARING_REBALANCE
    tokens = [h.send(join_request("g", m.member_id)) for m in (leader, f2)]
    assert {h.responses[t].generation_id for t in tokens} == {2}
    # v0-v2: one member, its result is the top-level error.
    assert h.call(leave_request("g", ("nobody", None), version=1)).error_code == ErrorCode.unknown_member_id
    assert h.call(leave_request("g", (f2.member_id, None), version=0)).error_code == ErrorCode.none


def test_leaving_leader_hands_leadership_on_and_last_leave_empties_the_group() -> None:
    h = Harness()
    leader, f1 = h.form_group(2)
    h.call(leave_request("g", (leader.member_id, None)))
    rejoin = h.send(join_request("g", f1.member_id))
    j = h.responses[rejoin]
    assert j.leader == f1.member_id and j.generation_id == 2 and len(j.members) == 1
    h.call(leave_request("g", (f1.member_id, None)))
    group = h.group()
    assert group.state is GroupState.EMPTY
    assert group.generation_id == 3, "the group that empties ends its generation"
    stored = stored_groups(h)[-1]
    assert stored.generation == 3 and stored.members == () and stored.protocol is None
    assert h.call(heartbeat_request("g", f1.member_id, 3)).error_code == ErrorCode.unknown_member_id


def test_session_expiry_removes_a_silent_member_and_rebalances_the_rest() -> None:
    h = Harness()
    leader, f1, f2 = h.form_group(3, session_ms=3_000)
    for _ in range(2):
        h.advance(1_000)
        for m in (leader, f1):
            assert h.call(heartbeat_request("g", m.member_id, 1)).error_code == ErrorCode.none
    assert f2.member_id in h.group().members
    h.advance(1_000)
    assert f2.member_id not in h.group().members, "f2 sent no heartbeat for its 3 s session"
    assert h.call(heartbeat_request("g", leader.member_id, 1)).error_code == ErrorCode.rebalance_in_progress
    tokens = [h.send(join_request("g", m.member_id, session_ms=3_000)) for m in (leader, f1)]
    assert {h.responses[t].generation_id for t in tokens} == {2}
    assert h.call(heartbeat_request("g", f2.member_id, 1)).error_code == ErrorCode.unknown_member_id


def test_a_follower_that_never_syncs_is_dropped_after_the_rebalance_timeout() -> None:
    h = Harness()
    tokens = [h.join_new("g", client_id=f"c{i}", rebalance_ms=4_000) for i in range(2)]
    h.advance_until_answered(tokens)
    leader, follower = sorted((h.responses[t] for t in tokens), key=lambda j: j.member_id != j.leader)
    h.call(sync_request("g", leader.member_id, 1, {leader.member_id: b"a", follower.member_id: b"b"}))
    h.call(heartbeat_request("g", leader.member_id, 1))
    h.advance(4_000)
    assert follower.member_id not in h.group().members
    assert h.group().state is GroupState.PREPARING_REBALANCE


def test_kip_394_pending_member_id_expires_if_unused() -> None:
    h = Harness()
    first = h.call(join_request("g", "", session_ms=2_000))
    assert first.error_code == ErrorCode.member_id_required
    assert first.member_id in h.group().pending_join_members
    h.advance(2_000)
    assert not h.group().pending_join_members
    late = h.call(join_request("g", first.member_id, session_ms=2_000))
    assert late.error_code == ErrorCode.unknown_member_id


def test_join_group_v0_to_v3_adds_the_member_without_member_id_required() -> None:
    h = Harness()
    t = h.send(join_request("g", "", version=3))
    assert t not in h.responses
    h.advance_until_answered([t])
    j = h.responses[t]
    assert j.error_code == ErrorCode.none and j.member_id and j.leader == j.member_id


def test_request_validation_errors() -> None:
    cfg = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=100, group_min_session_timeout_ms=6_000,
                                 group_max_session_timeout_ms=60_000, group_max_size=2)
    h = Harness(cfg)
    assert h.call(join_request("", "")).error_code == ErrorCode.invalid_group_id
    assert h.call(join_request("g", "", session_ms=5_999)).error_code == ErrorCode.invalid_session_timeout
    assert h.call(join_request("g", "", session_ms=60_001)).error_code == ErrorCode.invalid_session_timeout
    assert h.call(join_request("g", "ghost")).error_code == ErrorCode.unknown_member_id
    assert "g" not in h.shard.groups, "refused joins create no group"
    assert h.call(sync_request("g", "ghost", 0)).error_code == ErrorCode.unknown_member_id
    assert h.call(heartbeat_request("g", "ghost", 0)).error_code == ErrorCode.unknown_member_id
    assert h.call(heartbeat_request("", "ghost", 0)).error_code == ErrorCode.invalid_group_id
    leader, follower = h.form_group(2)
    assert h.call(join_request("g", "")).error_code == ErrorCode.group_max_size_reached
    # SyncGroup v5 names the protocol; a mismatch is refused.
    bad = h.call(sync_request("g", follower.member_id, 1, version=5, protocol_type="consumer",
                              protocol_name="roundrobin"))
    assert bad.error_code == ErrorCode.inconsistent_group_protocol
    good = h.call(sync_request("g", follower.member_id, 1, version=5, protocol_type="consumer",
                               protocol_name="range"))
    assert good.error_code == ErrorCode.none and good.protocol_name == "range"


def test_sync_during_a_join_phase_is_told_to_rejoin() -> None:
    h = Harness()
    leader, follower = h.form_group(2)
    h.send(join_request("g", leader.member_id))
    answer = h.call(sync_request("g", follower.member_id, 1))
    assert answer.error_code == ErrorCode.rebalance_in_progress


def test_parked_syncs_are_released_with_rebalance_in_progress_when_the_membership_changes() -> None:
    h = Harness()
    tokens = [h.join_new("g", client_id=f"c{i}") for i in range(2)]
    h.advance_until_answered(tokens)
    leader, follower = sorted((h.responses[t] for t in tokens), key=lambda j: j.member_id != j.leader)
    parked = h.send(sync_request("g", follower.member_id, 1))
    assert parked not in h.responses
    h.join_new("g", client_id="late")  # a new member arrives before the leader syncs
    assert h.responses[parked].error_code == ErrorCode.rebalance_in_progress


def test_a_repeated_join_from_the_same_member_releases_the_older_one() -> None:
    h = Harness()
    leader, follower = h.form_group(2)
    first = h.send(join_request("g", follower.member_id, protocols=(("range", b"x"),)))
    second = h.send(join_request("g", follower.member_id, protocols=(("range", b"x"),)))
    assert h.responses[first].error_code == ErrorCode.rebalance_in_progress
    assert second not in h.responses
    h.send(join_request("g", leader.member_id))
    assert h.responses[second].generation_id == 2


def test_stable_follower_rejoining_unchanged_gets_the_current_generation_at_once() -> None:
    h = Harness()
    leader, follower = h.form_group(2)
    again = h.call(join_request("g", follower.member_id))
    assert again.error_code == ErrorCode.none and again.generation_id == 1 and again.leader == leader.member_id
    assert h.group().state is GroupState.STABLE


def test_loading_shard_and_unload() -> None:
    from broker.core.group import GroupCoordinatorShard, RequestContext
    import random

    shard = GroupCoordinatorShard(0, FAST, random.Random(1))
    r = shard.handle(RequestContext(1), join_request("g", ""), 0)
    assert r.response_for(1).error_code == ErrorCode.coordinator_load_in_progress
    r = shard.handle(RequestContext(2), heartbeat_request("g", "m", 1), 0)
    assert r.response_for(2).error_code == ErrorCode.none, "as Kafka: members keep calm while loading"

    h = Harness()
    tokens = [h.join_new("g", client_id=f"c{i}") for i in range(2)]
    result = h.shard.unload()
    assert {token for token, _ in result.responses} == set(tokens)
    assert {resp.error_code for _, resp in result.responses} == {ErrorCode.not_coordinator}


def test_every_parked_request_is_answered_once_across_a_busy_rebalance() -> None:
    h = Harness(GroupCoordinatorConfig(group_initial_rebalance_delay_ms=50, group_min_session_timeout_ms=1000))
    leader, f1, f2 = h.form_group(3, session_ms=2_000, rebalance_ms=3_000)
    parked = [h.send(join_request("g", m.member_id, session_ms=2_000, rebalance_ms=3_000)) for m in (leader, f1)]
    h.call(leave_request("g", (f1.member_id, None)))
    assert h.responses[parked[1]].error_code == ErrorCode.unknown_member_id
    h.advance(3_000)
    assert all(t in h.responses for t in parked)
    assert stored_groups(h)[-1].generation >= 1
