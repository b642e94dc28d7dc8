"""The KIP-848 consumer group core, driven by ConsumerGroupHeartbeat
requests and a fake clock (no I/O): assignors, incremental revocation,
session expiry, offsets by member epoch, and replay of the records."""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import timedelta

from kio.schema.consumer_group_heartbeat.v1 import request as hb
from kio.schema.errors import ErrorCode

from broker.core.group import (
    GroupCoordinatorConfig,
    GroupCoordinatorShard,
    RequestContext,
)
from broker.core.group.consumer_group import ConsumerGroup, ConsumerMember, assign

T = uuid.UUID(int=7)
CONFIG = GroupCoordinatorConfig(group_consumer_session_timeout_ms=1000, group_consumer_heartbeat_interval_ms=100)


def shard(partitions: int = 6) -> GroupCoordinatorShard:
    s = GroupCoordinatorShard(0, CONFIG, random.Random(1))
    s.on_loaded(0)
    s.topics = {"t": (T, partitions)}
    s.written = []  # every record the steps emitted, in order
    return s


def beat(s, member: str, epoch: int, now_ms: int, owned=None, topics=("t",), assignor=None, regex=None):
    request = hb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id=member, member_epoch=epoch, rebalance_timeout=timedelta(seconds=5),
        subscribed_topic_names=topics if epoch == 0 else None, subscribed_topic_regex=regex,
        server_assignor=assignor, topic_partitions=None if owned is None else (
            hb.TopicPartitions(topic_id=T, partitions=tuple(sorted(owned))),))
    result = s.handle(RequestContext(member), request, now_ms)
    s.written += result.records
    response = result.response_for(member)
    assert response.error_code == ErrorCode.none, response
    return response, result


def owned(response) -> set[int]:
    return {p for tp in response.assignment.topic_partitions for p in tp.partitions}


def test_uniform_and_range_balance_and_uniform_is_sticky():
    group = ConsumerGroup("g", members={m: ConsumerMember(m, subscribed_topic_names=("t",)) for m in "abc"})
    ranged = assign("range", group, {"t": (T, 7)})
    assert [sorted(ranged[m][T]) for m in "abc"] == [[0, 1, 2], [3, 4], [5, 6]]
    group.target = assign("uniform", group, {"t": (T, 7)})
    before = {m: group.target[m][T] for m in "abc"}
    group.members["d"] = ConsumerMember("d", subscribed_topic_names=("t",))
    after = assign("uniform", group, {"t": (T, 7)})
    assert sorted(len(a.get(T, ())) for a in after.values()) == [1, 2, 2, 2]
    moved = sum(len(before[m] - after[m][T]) for m in "abc")
    assert moved == 1  # only what the newcomer needs moves


def test_partition_goes_to_new_owner_only_after_old_owner_revoked_it():
    s = shard(4)
    r, _ = beat(s, "a", 0, 0)
    assert owned(r) == {0, 1, 2, 3} and r.member_epoch == 1
    r, _ = beat(s, "b", 0, 10)
    assert r.member_epoch == 2 and owned(r) == set()  # its partitions are still a's
    r, _ = beat(s, "a", 1, 20, owned={0, 1, 2, 3})
    assert r.member_epoch == 1 and len(owned(r)) == 2  # revoke first, epoch kept
    kept = owned(r)
    r, _ = beat(s, "b", 2, 30, owned=set())
    assert r.assignment is None or owned(r) == set()
    r, _ = beat(s, "a", 1, 40, owned=kept)  # revoked
    assert r.member_epoch == 2
    r, _ = beat(s, "b", 2, 50, owned=set())
    assert owned(r) == {0, 1, 2, 3} - kept


def test_session_expiry_moves_partitions_and_records_rebuild_the_group():
    s = shard(4)
    beat(s, "a", 0, 0)
    beat(s, "b", 0, 10)
    r, _ = beat(s, "a", 1, 20, owned={0, 1, 2, 3})
    beat(s, "a", 1, 30, owned=owned(r))
    # b stops heartbeating: at its session timeout it leaves and a gets all.
    for now in range(100, 1200, 100):
        beat(s, "a", s.consumer.groups["g"].members["a"].member_epoch, now, owned=owned(r))
    s.written += s.tick(1200).records
    assert set(s.consumer.groups["g"].members) == {"a"}
    r, _ = beat(s, "a", s.consumer.groups["g"].members["a"].member_epoch, 1210, owned=owned(r))
    assert owned(r) == {0, 1, 2, 3}
    # The records alone rebuild the group, as a coordinator taking over does.
    rebuilt = GroupCoordinatorShard(0, CONFIG, random.Random(2))
    for rec in s.written:
        rebuilt.replay(rec.key, rec.value)
    live, g = s.consumer.groups["g"], rebuilt.consumer.groups["g"]
    assert (g.group_epoch, g.assignment_epoch, set(g.members), g.target) == \
        (live.group_epoch, live.assignment_epoch, {"a"}, live.target)
    assert g.members["a"].assigned == {T: frozenset({0, 1, 2, 3})}
    assert g.members["a"].member_epoch == live.members["a"].member_epoch


def test_regex_subscription_and_unknown_assignor():
    s = shard(2)
    s.topics = {"t": (T, 2), "orders-1": (uuid.UUID(int=8), 1), "x": (uuid.UUID(int=9), 1)}
    r, _ = beat(s, "a", 0, 0, topics=None, regex="orders-.*")
    assert {tp.topic_id for tp in r.assignment.topic_partitions} == {uuid.UUID(int=8)}
    request = hb.ConsumerGroupHeartbeatRequest(group_id="g", member_id="z", member_epoch=0,
                                               subscribed_topic_names=("t",), server_assignor="sticky",
                                               topic_partitions=None)
    answer = s.handle(RequestContext("z"), request, 5).response_for("z")
    assert answer.error_code == ErrorCode.unsupported_assignor and "group.consumer.assignors" in answer.error_message


def test_list_groups_shows_consumer_groups_with_their_type():
    from broker.core.group.shard import list_groups

    s = shard(2)
    beat(s, "a", 0, 0)
    assert [(g.group_id, g.state, g.group_type) for g in list_groups(s)] == [("g", "Stable", "consumer")]
    assert list_groups(s, types_filter=("classic",)) == []
    assert [g.group_id for g in list_groups(s, states_filter=("stable",), types_filter=("Consumer",))] == ["g"]


def test_a_group_with_only_offsets_becomes_a_consumer_group_and_keeps_them():
    from kio.schema.offset_commit.v9 import request as oc

    s = shard(2)
    commit = oc.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                    group_instance_id=None, topics=(oc.OffsetCommitRequestTopic(
                                        name="t", partitions=(oc.OffsetCommitRequestPartition(
                                            partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                                            committed_metadata=None),)),))
    s.handle(RequestContext("c"), commit, 0)
    assert "g" in s.groups
    r, _ = beat(s, "a", 0, 10)
    assert owned(r) == {0, 1} and "g" not in s.groups
    assert s.offsets.get("g", "t", 0).offset == 42
    # A commit at the member's epoch is accepted, at another epoch refused.
    ok = s.handle(RequestContext("c2"), dataclasses.replace(commit, generation_id_or_member_epoch=r.member_epoch,
                                                            member_id="a"), 20).response_for("c2")
    assert ok.topics[0].partitions[0].error_code == ErrorCode.none
    stale = s.handle(RequestContext("c3"), dataclasses.replace(commit, generation_id_or_member_epoch=r.member_epoch + 5,
                                                               member_id="a"), 30).response_for("c3")
    assert stale.topics[0].partitions[0].error_code == ErrorCode.stale_member_epoch


def test_an_empty_consumer_groups_offsets_expire_and_the_group_goes():
    from kio.schema.offset_commit.v9 import request as oc

    s = shard(2)
    r, _ = beat(s, "a", 0, 0)
    commit = oc.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=r.member_epoch, member_id="a",
                                    group_instance_id=None, topics=(oc.OffsetCommitRequestTopic(
                                        name="t", partitions=(oc.OffsetCommitRequestPartition(
                                            partition_index=0, committed_offset=5, committed_leader_epoch=-1,
                                            committed_metadata=None),)),))
    s.written += s.handle(RequestContext("c"), commit, 10).records
    beat(s, "a", -1, 20)  # leaves: the group is empty
    later = 20 + CONFIG.offsets_retention_ms + CONFIG.offsets_retention_check_interval_ms
    s.written += s.tick(later).records
    assert "g" not in s.consumer.groups and s.offsets.get("g", "t", 0) is None
    rebuilt = GroupCoordinatorShard(0, CONFIG, random.Random(2))
    for rec in s.written:
        rebuilt.replay(rec.key, rec.value)
    assert "g" not in rebuilt.consumer.groups and "g" not in rebuilt.groups


def test_delete_groups_refuses_a_consumer_group_with_members_and_deletes_an_empty_one():
    from broker.core.group.effects import Effects
    from broker.core.group.shard import delete_group

    s = shard(2)
    beat(s, "a", 0, 0)
    assert delete_group(s, "g", Effects(5)) == ErrorCode.non_empty_group
    beat(s, "a", -1, 10)
    fx = Effects(20)
    assert delete_group(s, "g", fx) == ErrorCode.none
    assert "g" not in s.consumer.groups and fx.records


def test_static_member_fenced_replaced_and_expired():
    s = shard(4)

    def static(member: str, epoch: int, now_ms: int, instance: str = "i", owned_now=None):
        request = hb.ConsumerGroupHeartbeatRequest(
            group_id="g", member_id=member, member_epoch=epoch, instance_id=instance,
            rebalance_timeout=timedelta(seconds=5), subscribed_topic_names=("t",) if epoch == 0 else None,
            topic_partitions=() if owned_now is None else (hb.TopicPartitions(topic_id=T, partitions=tuple(owned_now)),))
        result = s.handle(RequestContext(member), request, now_ms)
        s.written += result.records
        return result.response_for(member)

    first = owned(static("a", 0, 0))
    beat(s, "b", 0, 10)
    assert static("x", 1, 20).error_code == ErrorCode.fenced_instance_id  # not the holder of "i"
    assert static("a", -2, 30).member_epoch == -2
    group = s.consumer.groups["g"]
    epoch = group.group_epoch
    # Back under a new member id: the same partitions, no new group epoch.
    r = static("a2", 0, 40)
    assert r.error_code == ErrorCode.none and owned(r) | first == first and set(group.members) == {"a2", "b"}
    assert group.group_epoch == epoch
    rebuilt = GroupCoordinatorShard(0, CONFIG, random.Random(2))
    for rec in s.written:
        rebuilt.replay(rec.key, rec.value)
    assert set(rebuilt.consumer.groups["g"].members) == {"a2", "b"}
    # Away past its session timeout: it is removed and b gets everything.
    static("a2", -2, 50)
    b = group.members["b"]
    beat(s, "b", b.member_epoch, 1000, owned={p for ps in b.assigned.values() for p in ps})
    s.written += s.tick(1100).records
    assert set(group.members) == {"b"} and group.group_epoch == epoch + 1


def test_uniform_prefers_a_member_in_a_replica_rack():
    group = ConsumerGroup("g", members={m: ConsumerMember(m, subscribed_topic_names=("t",), rack_id=r)
                                        for m, r in (("a", "r1"), ("b", "r2"))})
    racks = {(T, 0): frozenset({"r2"}), (T, 1): frozenset({"r2"}), (T, 2): frozenset({"r1"}), (T, 3): frozenset({"r1"})}
    near = assign("uniform", group, {"t": (T, 4)}, racks)
    assert (near["a"][T], near["b"][T]) == ({2, 3}, {0, 1})
    # Balance comes first: with every replica in r2, each still gets two.
    far = assign("uniform", group, {"t": (T, 4)}, {(T, p): frozenset({"r2"}) for p in range(4)})
    assert sorted(len(a[T]) for a in far.values()) == [2, 2]
