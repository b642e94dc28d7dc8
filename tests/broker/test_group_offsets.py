"""Committed offsets: who may commit, what a fetch returns, OffsetDelete,
DeleteGroups and retention, as the clients and admin tools see them."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from broker.core.group import GroupCoordinatorConfig
from broker.core.group.classic_group import GroupState
from broker.core.group.records import GroupMetadataKey, OffsetCommitKey, decode_record
from group_testing import (
    Harness,
    commit_request,
    fetch_request,
    fetched_offsets,
    heartbeat_request,
    join_request,
    kio_module,
    subscription,
)
from broker.core.group.responses import build

MINUTE_MS = 60_000


def commit_errors(response) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def tombstones(h: Harness) -> list:
    out = []
    for rec in h.log:
        if rec.value is None:
            key, _ = decode_record(rec.key, None)
            out.append(key)
    return out


def test_members_commit_and_fetch_their_offsets() -> None:
    h = Harness()
    leader, follower = h.form_group(2)
    answer = h.call(commit_request("g", {("t", 0): 10, ("t", 1): 20}, member_id=follower.member_id, generation=1,
                                   metadata="m", leader_epoch=3))
    assert set(commit_errors(answer).values()) == {ErrorCode.none}
    # Each committed offset is one OffsetCommit record, in Kafka's format.
    keys = [decode_record(r.key, r.value) for r in h.last.records]
    assert [(k.topic, k.partition, v.offset, v.leader_epoch, v.metadata) for k, v in keys] == [
        ("t", 0, 10, 3, "m"), ("t", 1, 20, 3, "m")]
    fetched = h.call(fetch_request("g", {"t": [0, 1, 2]}, version=7))
    assert fetched_offsets(fetched) == {("t", 0): 10, ("t", 1): 20, ("t", 2): -1}
    assert fetched.error_code == ErrorCode.none
    epochs = {p.partition_index: p.committed_leader_epoch for t in fetched.topics for p in t.partitions}
    assert epochs == {0: 3, 1: 3, 2: -1}
    # All topics (null topic list, v2+) and the batched v8 form agree.
    assert fetched_offsets(h.call(fetch_request("g", None, version=3))) == {("t", 0): 10, ("t", 1): 20}
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0]}, version=8))) == {("t", 0): 10}


def test_commit_checks_member_and_generation() -> None:
    h = Harness()
    leader, follower = h.form_group(2)
    stale = h.call(commit_request("g", {("t", 0): 1}, member_id=follower.member_id, generation=0))
    assert set(commit_errors(stale).values()) == {ErrorCode.illegal_generation}
    ghost = h.call(commit_request("g", {("t", 0): 1}, member_id="ghost", generation=1))
    assert set(commit_errors(ghost).values()) == {ErrorCode.unknown_member_id}
    anonymous = h.call(commit_request("g", {("t", 0): 1}))
    assert set(commit_errors(anonymous).values()) == {ErrorCode.unknown_member_id}, \
        "a non-member may not commit to a group with members"
    # During the sync phase a current member is told to finish the rebalance first.
    h.send(join_request("g", leader.member_id))
    h.send(join_request("g", follower.member_id))
    assert h.group().state is GroupState.COMPLETING_REBALANCE
    during = h.call(commit_request("g", {("t", 0): 1}, member_id=follower.member_id, generation=2))
    assert set(commit_errors(during).values()) == {ErrorCode.rebalance_in_progress}
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0]}))) == {("t", 0): -1}


def test_commit_during_a_join_phase_is_accepted_and_keeps_the_session() -> None:
    h = Harness()
    leader, follower = h.form_group(2, session_ms=3_000, rebalance_ms=10_000)
    h.send(join_request("g", leader.member_id, session_ms=3_000, rebalance_ms=10_000))
    h.advance(2_000)
    ok = h.call(commit_request("g", {("t", 0): 7}, member_id=follower.member_id, generation=1))
    assert set(commit_errors(ok).values()) == {ErrorCode.none}
    h.advance(2_000)
    assert follower.member_id in h.group().members, "the commit moved the session deadline"


def test_simple_consumer_commits_create_a_group_without_protocol() -> None:
    h = Harness()
    answer = h.call(commit_request("solo", {("t", 0): 5}))
    assert set(commit_errors(answer).values()) == {ErrorCode.none}
    group = h.group("solo")
    assert group.state is GroupState.EMPTY and group.protocol_type is None
    assert fetched_offsets(h.call(fetch_request("solo", {"t": [0]}))) == {("t", 0): 5}
    # A group that does not exist cannot be committed to with a generation.
    old = h.call(commit_request("nope", {("t", 0): 1}, member_id="m", generation=3, version=8))
    assert set(commit_errors(old).values()) == {ErrorCode.illegal_generation}
    new = h.call(commit_request("nope", {("t", 0): 1}, member_id="m", generation=3, version=9))
    assert set(commit_errors(new).values()) == {ErrorCode.group_id_not_found}
    assert "nope" not in h.shard.groups


def test_fetch_of_an_unknown_group_returns_no_offsets_not_an_error() -> None:
    h = Harness()
    v1 = h.call(fetch_request("ghost", {"t": [0]}, version=1))
    assert fetched_offsets(v1) == {("t", 0): -1}
    assert v1.topics[0].partitions[0].error_code == ErrorCode.none
    v8 = h.call(fetch_request("ghost", None, version=8))
    assert v8.groups[0].error_code == ErrorCode.none and v8.groups[0].topics == ()


def test_offset_metadata_too_large_fails_only_that_partition() -> None:
    h = Harness(GroupCoordinatorConfig(offset_metadata_max_bytes=4))
    mod = kio_module("offset_commit", 8)
    request = build(mod.OffsetCommitRequest, group_id="g", generation_id_or_member_epoch=-1, member_id="",
                    group_instance_id=None, topics=(mod.OffsetCommitRequestTopic(name="t", partitions=(
                        build(mod.OffsetCommitRequestPartition, partition_index=0, committed_offset=1,
                              committed_leader_epoch=-1, committed_metadata="short"),
                        build(mod.OffsetCommitRequestPartition, partition_index=1, committed_offset=2,
                              committed_leader_epoch=-1, committed_metadata="ok"))),))
    answer = h.call(request)
    assert commit_errors(answer) == {("t", 0): ErrorCode.offset_metadata_too_large, ("t", 1): ErrorCode.none}
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0, 1]}))) == {("t", 0): -1, ("t", 1): 2}


def offset_delete_request(group: str, topics: dict[str, list[int]]):
    mod = kio_module("offset_delete", 0)
    return mod.OffsetDeleteRequest(group_id=group, topics=tuple(
        mod.OffsetDeleteRequestTopic(name=t, partitions=tuple(mod.OffsetDeleteRequestPartition(partition_index=p)
                                                              for p in ps)) for t, ps in topics.items()))


def test_offset_delete_refuses_topics_a_consumer_group_still_reads() -> None:
    h = Harness()
    subs = (("range", subscription("orders")),)
    leader, follower = h.form_group(2, protocols=subs)
    h.call(commit_request("g", {("orders", 0): 1, ("old", 0): 2}, member_id=leader.member_id, generation=1))
    answer = h.call(offset_delete_request("g", {"orders": [0], "old": [0, 1]}))
    assert answer.error_code == ErrorCode.none
    errors = {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}
    assert errors == {("orders", 0): ErrorCode.group_subscribed_to_topic, ("old", 0): ErrorCode.none,
                      ("old", 1): ErrorCode.none}
    assert fetched_offsets(h.call(fetch_request("g", None))) == {("orders", 0): 1}
    assert OffsetCommitKey("g", "old", 0) in tombstones(h)
    assert h.call(offset_delete_request("ghost", {"t": [0]})).error_code == ErrorCode.group_id_not_found


def test_offset_delete_of_a_non_consumer_group_with_members_is_refused() -> None:
    h = Harness()
    h.form_group(2, protocol_type="connect", protocols=(("default", b""),))
    assert h.call(offset_delete_request("g", {"t": [0]})).error_code == ErrorCode.non_empty_group


def delete_groups_request(*groups: str, version: int = 2):
    return kio_module("delete_groups", version).DeleteGroupsRequest(groups_names=groups)


def test_delete_groups_removes_empty_groups_with_their_offsets() -> None:
    h = Harness()
    h.call(commit_request("empty", {("t", 0): 1, ("t", 1): 2}))
    leader, _ = h.form_group(2, group="busy")
    answer = h.call(delete_groups_request("empty", "busy", "ghost", ""))
    assert [(r.group_id, r.error_code) for r in answer.results] == [
        ("empty", ErrorCode.none), ("busy", ErrorCode.non_empty_group),
        ("ghost", ErrorCode.group_id_not_found), ("", ErrorCode.invalid_group_id)]
    assert "empty" not in h.shard.groups
    assert fetched_offsets(h.call(fetch_request("empty", {"t": [0, 1]}))) == {("t", 0): -1, ("t", 1): -1}
    assert tombstones(h) == [OffsetCommitKey("empty", "t", 0), OffsetCommitKey("empty", "t", 1),
                             GroupMetadataKey("empty")]


RETENTION = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=100, group_min_session_timeout_ms=1000,
                                   offsets_retention_ms=60 * MINUTE_MS,
                                   offsets_retention_check_interval_ms=MINUTE_MS)


def test_offsets_of_an_empty_group_expire_after_retention_from_when_it_emptied() -> None:
    h = Harness(RETENTION)
    leader, = h.form_group(1, session_ms=5_000)
    h.call(commit_request("g", {("t", 0): 9}, member_id=leader.member_id, generation=1))
    h.advance(30 * MINUTE_MS)  # the member died: its session expires, the group is empty
    assert h.group().state is GroupState.EMPTY
    h.advance(31 * MINUTE_MS)  # 61 minutes after the commit, 31 after the group emptied
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0]}))) == {("t", 0): 9}, \
        "retention counts from when the group emptied, not from the commit"
    h.advance(30 * MINUTE_MS)
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0]}))) == {("t", 0): -1}
    assert OffsetCommitKey("g", "t", 0) in tombstones(h)
    assert GroupMetadataKey("g") in tombstones(h), "an empty group with no offsets left is deleted"
    assert "g" not in h.shard.groups


def test_offsets_of_a_live_group_do_not_expire_while_it_reads_the_topic() -> None:
    h = Harness(RETENTION)
    leader, = h.form_group(1, session_ms=10_000, protocols=(("range", subscription("t")),))
    h.call(commit_request("g", {("t", 0): 1, ("gone", 0): 2}, member_id=leader.member_id, generation=1))
    for _ in range(700):  # 70 minutes, heartbeating every 6 s
        h.advance(6_000)
        h.call(heartbeat_request("g", leader.member_id, 1))
    # Stable consumer group: only topics it no longer subscribes to expire.
    assert fetched_offsets(h.call(fetch_request("g", None))) == {("t", 0): 1}


def test_simple_group_offsets_expire_by_commit_time_and_explicit_retention_wins() -> None:
    h = Harness(RETENTION)
    h.call(commit_request("solo", {("t", 0): 1}))
    h.call(commit_request("short", {("t", 0): 1}, version=2, retention_ms=5 * MINUTE_MS))
    h.advance(6 * MINUTE_MS)
    assert "short" not in h.shard.groups, "its own 5-minute retention passed"
    assert fetched_offsets(h.call(fetch_request("solo", {"t": [0]}))) == {("t", 0): 1}
    h.advance(55 * MINUTE_MS)
    assert "solo" not in h.shard.groups
