"""Static membership (KIP-345): a member with `group.instance.id` keeps its
place across restarts without a rebalance, and its previous incarnation is
fenced with FENCED_INSTANCE_ID."""

from __future__ import annotations

import random

from kio.schema.errors import ErrorCode

from broker.core.group import GroupCoordinatorShard
from broker.core.group.classic_group import GroupState
from broker.core.group.records import GroupMetadataKey, decode_record
from group_testing import (
    Harness,
    commit_request,
    heartbeat_request,
    join_request,
    leave_request,
    sync_request,
)


def form_static_group(h: Harness, n: int, *, version: int = 5, session_ms: int = 10_000,
                      rebalance_ms: int = 30_000, protocols=(("range", b""),)) -> list:
    """n static members (instances i0..), synced; JoinGroup answers in order."""
    tokens = [h.send(join_request("g", "", version=version, instance_id=f"i{k}", session_ms=session_ms,
                                  rebalance_ms=rebalance_ms, protocols=protocols), client_id=f"c{k}")
              for k in range(n)]
    h.advance_until_answered(tokens)
    joins = [h.responses[t] for t in tokens]
    assert all(j.member_id.startswith(f"i{k}-") for k, j in enumerate(joins)), "static ids carry the instance id"
    h.sync_all("g", joins)
    return joins


def last_stored(h: Harness):
    for rec in reversed(h.log):
        key, value = decode_record(rec.key, rec.value)
        if isinstance(key, GroupMetadataKey):
            return value
    raise AssertionError("no group record")


def test_a_restarted_follower_takes_its_place_back_without_a_rebalance() -> None:
    h = Harness()
    leader, f1, f2 = form_static_group(h, 3)
    records_before = len(h.log)
    again = h.call(join_request("g", "", instance_id="i1"))
    assert again.error_code == ErrorCode.none
    assert again.member_id != f1.member_id and again.member_id.startswith("i1-")
    assert again.generation_id == 1 and again.leader == leader.member_id
    assert h.group().state is GroupState.STABLE
    # The new member id is stored at once (it must survive a failover).
    assert len(h.log) == records_before + 1
    assert again.member_id in {m.member_id for m in last_stored(h).members}
    # The old incarnation is fenced everywhere.
    assert h.call(heartbeat_request("g", f1.member_id, 1, instance_id="i1")).error_code == ErrorCode.fenced_instance_id
    assert h.call(sync_request("g", f1.member_id, 1, instance_id="i1")).error_code == ErrorCode.fenced_instance_id
    commit = h.call(commit_request("g", {("t", 0): 5}, member_id=f1.member_id, generation=1, instance_id="i1"))
    assert commit.topics[0].partitions[0].error_code == ErrorCode.fenced_instance_id
    assert h.call(join_request("g", f1.member_id, instance_id="i1")).error_code == ErrorCode.fenced_instance_id
    # The new one carries on with the old assignment.
    assert h.call(heartbeat_request("g", again.member_id, 1, instance_id="i1")).error_code == ErrorCode.none
    sync = h.call(sync_request("g", again.member_id, 1, instance_id="i1"))
    assert sync.error_code == ErrorCode.none and sync.assignment == f1.member_id.encode()


def test_a_restarted_leader_before_v9_is_told_the_old_leader_so_it_does_not_reassign() -> None:
    h = Harness()
    leader, f1 = form_static_group(h, 2)
    again = h.call(join_request("g", "", instance_id="i0"))
    assert again.error_code == ErrorCode.none and again.generation_id == 1
    assert again.leader == leader.member_id != again.member_id
    assert again.members == ()
    assert h.group().leader_id == again.member_id, "the group's leader is the new incarnation"
    assert h.group().state is GroupState.STABLE


def test_a_restarted_leader_from_v9_is_leader_and_told_to_skip_assignment() -> None:
    h = Harness()
    leader, f1 = form_static_group(h, 2, version=9)
    again = h.call(join_request("g", "", instance_id="i0", version=9))
    assert again.leader == again.member_id
    assert again.skip_assignment is True
    assert sorted(m.member_id for m in again.members) == sorted([again.member_id, f1.member_id])


def test_a_static_member_that_changes_the_selected_protocol_starts_a_rebalance() -> None:
    h = Harness()
    both = (("range", b""), ("roundrobin", b""))
    leader, f1 = form_static_group(h, 2, protocols=both)
    t = h.send(join_request("g", "", instance_id="i1", protocols=(("range", b"new"), ("roundrobin", b""))))
    assert t in h.responses and h.group().state is GroupState.STABLE, "new metadata, same protocol: no rebalance"
    t = h.send(join_request("g", "", instance_id="i1", protocols=(("roundrobin", b""),)))
    assert t not in h.responses
    assert h.group().state is GroupState.PREPARING_REBALANCE
    h.send(join_request("g", leader.member_id, instance_id="i0", protocols=both))
    assert h.responses[t].protocol_name == "roundrobin" and h.responses[t].generation_id == 2


def test_a_static_member_that_misses_the_join_phase_is_kept_but_must_sync() -> None:
    h = Harness()
    leader, f1 = form_static_group(h, 2, session_ms=8_000, rebalance_ms=3_000)
    dynamic = h.join_new("g", client_id="dyn", session_ms=8_000, rebalance_ms=3_000)
    t_leader = h.send(join_request("g", leader.member_id, instance_id="i0", session_ms=8_000, rebalance_ms=3_000))
    h.advance(3_000)
    new_leader, dyn = h.responses[t_leader], h.responses[dynamic]
    assert new_leader.generation_id == dyn.generation_id == 2
    # Unlike a dynamic member, the static one is part of the new generation.
    assert f1.member_id in {m.member_id for m in new_leader.members}
    plan = {m.member_id: b"x" for m in new_leader.members}
    h.call(sync_request("g", leader.member_id, 2, plan, instance_id="i0"))
    h.call(sync_request("g", dyn.member_id, 2))
    assert h.group().state is GroupState.STABLE
    h.advance(3_000)  # it never syncs: dropped with the sync phase's timeout
    assert f1.member_id not in h.group().members
    assert h.group().state is GroupState.PREPARING_REBALANCE


def test_a_newer_incarnation_fences_the_older_ones_parked_join() -> None:
    h = Harness()
    leader, f1, f2 = form_static_group(h, 3)
    h.send(join_request("g", leader.member_id, instance_id="i0"))  # the leader asks for a rebalance
    parked = h.send(join_request("g", f1.member_id, instance_id="i1"))
    assert parked not in h.responses, "i2 has not rejoined yet"
    newer = h.send(join_request("g", "", instance_id="i1"))
    assert h.responses[parked].error_code == ErrorCode.fenced_instance_id
    assert newer not in h.responses
    h.send(join_request("g", f2.member_id, instance_id="i2"))
    assert h.responses[newer].error_code == ErrorCode.none and h.responses[newer].generation_id == 2


def test_admin_removes_a_static_member_by_instance_id() -> None:
    h = Harness()
    leader, f1, f2 = form_static_group(h, 3)
    answer = h.call(leave_request("g", ("", "i2"), ("", "i9"), version=4))
    assert [(m.group_instance_id, m.error_code) for m in answer.members] == [
        ("i2", ErrorCode.none), ("i9", ErrorCode.unknown_member_id)]
    assert f2.member_id not in h.group().members
    assert h.group().state is GroupState.PREPARING_REBALANCE


def test_member_id_of_another_instance_is_fenced() -> None:
    h = Harness()
    leader, f1 = form_static_group(h, 2)
    wrong = h.call(heartbeat_request("g", leader.member_id, 1, instance_id="i1"))
    assert wrong.error_code == ErrorCode.fenced_instance_id
    unknown_instance = h.call(heartbeat_request("g", leader.member_id, 1, instance_id="i7"))
    assert unknown_instance.error_code == ErrorCode.unknown_member_id


def failover(h: Harness) -> None:
    """A new coordinator: the shard rebuilt from the records written so far."""
    shard = GroupCoordinatorShard(h.partition, h.config, random.Random(1))
    for record in h.log:
        shard.replay(record.key, record.value)
    shard.on_loaded(h.now_ms)
    h.shard = shard


def test_after_a_failover_the_member_id_the_log_never_got_is_not_fenced() -> None:
    """The member id a static member got in a rebalance is stored only when
    its generation's SyncGroup ends; a new coordinator that loads the group
    before then knows the instance under its older id. The one process of
    that instance asks with the newer id: it is no duplicate (nothing was
    heard from the older id since the load), so it is told to rejoin
    (UNKNOWN_MEMBER_ID), takes its place back and gets its assignment."""
    h = Harness()
    [first] = form_static_group(h, 1)
    # The leader rejoins (a new generation), then its process restarts
    # (JoinGroup without an id): a new member id, not stored yet.
    assert h.call(join_request("g", first.member_id, instance_id="i0")).generation_id == 2
    again = h.call(join_request("g", "", instance_id="i0"))
    assert again.error_code == ErrorCode.none and again.generation_id == 3
    failover(h)
    assert h.group().static_members == {"i0": first.member_id}
    assert h.call(sync_request("g", again.member_id, 3, {again.member_id: b"x"}, instance_id="i0")).error_code \
        == ErrorCode.unknown_member_id
    assert h.call(heartbeat_request("g", again.member_id, 3, instance_id="i0")).error_code \
        == ErrorCode.unknown_member_id
    rejoined = h.call(join_request("g", "", instance_id="i0"))
    assert rejoined.error_code == ErrorCode.none and rejoined.generation_id == 1
    synced = h.call(sync_request("g", rejoined.member_id, 1, instance_id="i0"))
    assert synced.error_code == ErrorCode.none and synced.assignment == first.member_id.encode()
    # The id the log had is now an older incarnation: fenced.
    assert h.call(heartbeat_request("g", first.member_id, 1, instance_id="i0")).error_code \
        == ErrorCode.fenced_instance_id


def test_after_a_failover_a_second_process_of_a_live_instance_is_fenced() -> None:
    h = Harness()
    [first] = form_static_group(h, 1)
    failover(h)
    # The loaded member id is heard from: it is live here.
    assert h.call(heartbeat_request("g", first.member_id, 1, instance_id="i0")).error_code == ErrorCode.none
    other = "i0-00000000-0000-4000-8000-000000000000"
    assert h.call(heartbeat_request("g", other, 1, instance_id="i0")).error_code == ErrorCode.fenced_instance_id
    assert h.call(join_request("g", other, instance_id="i0")).error_code == ErrorCode.fenced_instance_id
