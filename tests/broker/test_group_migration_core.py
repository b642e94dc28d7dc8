"""Online migration between the classic and the consumer protocol in the
group coordinator core, with a fake clock: the policy setting, Kafka's
record for a classic member of a consumer group, and a group upgraded by a
ConsumerGroupHeartbeat, served to its classic members, and downgraded when
its last consumer-protocol member is fenced, rebuilt from its records at
each step."""

from __future__ import annotations

import random
import struct
import uuid
from datetime import timedelta

import pytest
from group_testing import (
    heartbeat_request,
    join_request,
    leave_request,
    subscription,
    sync_request,
)
from kio.schema.consumer_group_heartbeat.v1 import request as hb
from kio.schema.errors import ErrorCode

from broker.core.group import (
    GroupCoordinatorConfig,
    GroupCoordinatorShard,
    RequestContext,
)
from broker.core.group import consumer_records as cr
from broker.core.group.consumer_group import ConsumerMember
from broker.core.group.migration import encode_assignment, parse_assignment
from common.errors import ConfigError

T = uuid.UUID(int=7)
CONFIG = GroupCoordinatorConfig(group_consumer_session_timeout_ms=1000, group_consumer_heartbeat_interval_ms=100,
                                group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000)


def test_policy_key_values_and_alias():
    assert GroupCoordinatorConfig().group_consumer_migration_policy == "bidirectional"  # Kafka 4's default
    read = GroupCoordinatorConfig.from_properties
    assert read({"group.consumer.migration.policy": "UPGRADE"}).group_consumer_migration_policy == "upgrade"
    assert read({"group.protocol.upgrade.policy": "disabled"}).group_consumer_migration_policy == "disabled"
    both = read({"group.protocol.upgrade.policy": "disabled", "group.consumer.migration.policy": "downgrade"})
    assert both.allows_downgrade() and not both.allows_upgrade()
    with pytest.raises(ConfigError, match="must be one of disabled, upgrade, downgrade, bidirectional"):
        read({"group.consumer.migration.policy": "sideways"})


def test_classic_member_metadata_is_kafkas_tagged_field():
    member = ConsumerMember("m", client_id="c", client_host="/h", subscribed_topic_names=("t",),
                            rebalance_timeout_ms=5000,
                            classic=cr.ClassicMeta(45000, (("range", b"\x00\x01"), ("roundrobin", b""))))
    record = cr.member_metadata_record("g", member)
    # Kafka's ConsumerGroupMemberMetadataValue v0: ..., RebalanceTimeoutMs,
    # ServerAssignor, then tagged field 0 = ClassicMemberMetadata.
    classic = (struct.pack(">i", 45000) + b"\x03" + b"\x06range" + b"\x03\x00\x01" + b"\x00"
               + b"\x0broundrobin" + b"\x01" + b"\x00" + b"\x00")
    fixed = (b"\x00\x00" + b"\x00" + b"\x00" + b"\x02c" + b"\x03/h" + b"\x02\x02t" + b"\x00"
             + struct.pack(">i", 5000) + b"\x00")
    assert record.value == fixed + b"\x01\x00" + bytes([len(classic)]) + classic
    (_kind, _g, _m), value = cr.decode(record.key, record.value)
    assert value["classic"] == member.classic and value["rebalance_timeout_ms"] == 5000
    member.classic = None
    (_kind, _g, _m), value = cr.decode(*cr.member_metadata_record("g", member))
    assert value["classic"] is None and cr.member_metadata_record("g", member).value == fixed + b"\x00"


def new_shard() -> GroupCoordinatorShard:
    s = GroupCoordinatorShard(0, CONFIG, random.Random(1))
    s.on_loaded(0)
    s.topics = {"t": (T, 4)}
    s.written = []
    return s


def step(s, token, request, now_ms):
    result = s.handle(RequestContext(token), request, now_ms)
    s.written += result.records
    return result.response_for(token)


def rebuilt(s) -> GroupCoordinatorShard:
    r = GroupCoordinatorShard(0, CONFIG, random.Random(2))
    for record in s.written:
        r.replay(record.key, record.value)
    return r


def beat(s, member, epoch, now_ms, owned=None):
    return step(s, member, hb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id=member, member_epoch=epoch, rebalance_timeout=timedelta(seconds=5),
        subscribed_topic_names=("t",) if epoch == 0 else None, subscribed_topic_regex=None, server_assignor=None,
        topic_partitions=None if owned is None else (hb.TopicPartitions(topic_id=T, partitions=tuple(sorted(owned))),)),
        now_ms)


def partitions(assignment: bytes) -> set[int]:
    return {p for _t, ps in parse_assignment(assignment) for p in ps}


def test_upgrade_serve_classic_members_and_downgrade():
    s = new_shard()
    # A classic group of two members, each with two partitions.
    ids = []
    for name in "ab":
        r = step(s, name, join_request(version=5, session_ms=3000), 0)
        assert r.error_code == ErrorCode.member_id_required
        ids.append(r.member_id)
    for i, name in enumerate("ab"):
        step(s, name, join_request(member_id=ids[i], version=5, session_ms=3000), 1)
    for now in (5, 10, 20):  # the initial rebalance delay ends (extended once for the second member)
        s.written += s.tick(now).records
    assert s.groups["g"].state.value == "CompletingRebalance"
    generation = s.groups["g"].generation_id
    leader_assignment = {ids[0]: encode_assignment({T: frozenset({0, 1})}, {T: "t"}),
                         ids[1]: encode_assignment({T: frozenset({2, 3})}, {T: "t"})}
    step(s, "a", sync_request("g", ids[0], generation, leader_assignment), 21)
    assert partitions(step(s, "b", sync_request("g", ids[1], generation), 22).assignment) == {2, 3}

    # A consumer-protocol member joins: the group converts and keeps the classic assignment.
    r = beat(s, "c", 0, 30)
    assert r.error_code == ErrorCode.none and "g" not in s.groups
    group = s.consumer.groups["g"]
    assert group.group_epoch == generation + 1
    assert {m: group.members[m].assigned.get(T) for m in ids} == {ids[0]: {0, 1}, ids[1]: {2, 3}}
    assert not r.assignment.topic_partitions  # what it gets is still the classic members'
    mixed = rebuilt(s).consumer.groups["g"]
    assert {m.member_id: m.classic.session_timeout_ms if m.classic else None for m in mixed.members.values()} \
        == {ids[0]: 3000, ids[1]: 3000, r.member_id: None}

    # The classic members are told to rejoin; rejoining (eager: owning nothing)
    # they get their part of the broker's target as a follower.
    c_id = r.member_id
    assert step(s, "a", heartbeat_request("g", ids[0], generation), 40).error_code == ErrorCode.rebalance_in_progress
    kept = {}
    for i, name in enumerate("ab"):
        joined = step(s, name, join_request(member_id=ids[i], version=5, session_ms=3000), 50)
        assert joined.error_code == ErrorCode.none and joined.leader == "" and not joined.members
        synced = step(s, name, sync_request("g", ids[i], joined.generation_id), 51)
        assert synced.error_code == ErrorCode.none
        kept[name] = (joined.generation_id, partitions(synced.assignment))
    r = beat(s, c_id, r.member_epoch, 60, owned=set())
    got_c = {p for tp in r.assignment.topic_partitions for p in tp.partitions}
    assert set().union(*(ps for _g, ps in kept.values()), got_c) == {0, 1, 2, 3}
    for i, name in enumerate("ab"):
        assert step(s, name, heartbeat_request("g", ids[i], kept[name][0]), 70).error_code == ErrorCode.none
    # A classic member's commit carries its generation, which is its member epoch.
    assert s.consumer.validate_offset_commit(s.consumer.groups["g"], ids[0], kept["a"][0]) is None
    assert s.consumer.validate_offset_commit(s.consumer.groups["g"], ids[0], 999) == ErrorCode.illegal_generation

    # The consumer-protocol member stops heartbeating: at its session timeout the
    # group is a classic group again, at the group epoch, and rebalances.
    epoch = s.consumer.groups["g"].group_epoch
    s.written += s.tick(60 + CONFIG.group_consumer_session_timeout_ms + 1).records
    assert "g" not in s.consumer.groups and s.groups["g"].generation_id == epoch
    assert s.groups["g"].state.value == "PreparingRebalance"
    back = rebuilt(s)
    assert "g" not in back.consumer.groups and set(back.groups["g"].members) == set(ids)
    r = step(s, "a", heartbeat_request("g", ids[0], epoch), 1200)
    assert r.error_code == ErrorCode.rebalance_in_progress


def test_classic_leave_and_an_unknown_protocol_in_a_consumer_group():
    s = new_shard()
    r = beat(s, "c", 0, 0)
    joined = step(s, "x", join_request(version=3, protocol_type="connect"), 1)
    assert joined.error_code == ErrorCode.inconsistent_group_protocol
    joined = step(s, "x", join_request(version=3, session_ms=3000,
                                       protocols=(("range", subscription("t")),)), 2)
    assert joined.error_code == ErrorCode.none
    member = s.consumer.groups["g"].members[joined.member_id]
    assert member.classic is not None and member.subscribed_topic_names == ("t",)
    left = step(s, "x", leave_request("g", (joined.member_id, None)), 3)
    assert left.error_code == ErrorCode.none and joined.member_id not in s.consumer.groups["g"].members
    assert r.member_id in s.consumer.groups["g"].members


def classic_group_of_one(config: GroupCoordinatorConfig) -> tuple[GroupCoordinatorShard, str]:
    s = GroupCoordinatorShard(0, config, random.Random(1))
    s.on_loaded(0)
    s.topics = {"t": (T, 4)}
    s.written = []
    member_id = step(s, "a", join_request(version=5, session_ms=3000), 0).member_id
    step(s, "a", join_request(member_id=member_id, version=5, session_ms=3000), 1)
    for now in (5, 10, 20):
        s.written += s.tick(now).records
    assert s.groups["g"].members
    return s, member_id


def test_policy_refuses_upgrade_or_downgrade():
    import dataclasses

    s, _ = classic_group_of_one(dataclasses.replace(CONFIG, group_consumer_migration_policy="downgrade"))
    r = beat(s, "c", 0, 30)
    assert r.error_code == ErrorCode.group_id_not_found
    assert "group.consumer.migration.policy is downgrade" in r.error_message
    assert "g" in s.groups and "g" not in s.consumer.groups
    # A request refused anyway converts nothing either.
    s2, _ = classic_group_of_one(CONFIG)
    bad = step(s2, "c", hb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="c", member_epoch=0, rebalance_timeout=timedelta(seconds=5),
        subscribed_topic_names=None, subscribed_topic_regex=None, server_assignor=None, topic_partitions=None), 30)
    assert bad.error_code == ErrorCode.invalid_request and "g" in s2.groups and "g" not in s2.consumer.groups

    # upgrade only: the last consumer-protocol member's leave keeps a consumer group.
    s3, member_id = classic_group_of_one(dataclasses.replace(CONFIG, group_consumer_migration_policy="upgrade"))
    r = beat(s3, "c", 0, 30)
    assert r.error_code == ErrorCode.none and "g" in s3.consumer.groups
    beat(s3, r.member_id, -1, 40)
    assert "g" in s3.consumer.groups and set(s3.consumer.groups["g"].members) == {member_id}


def test_a_classic_member_that_does_not_rejoin_in_its_rebalance_timeout_is_fenced():
    s, member_id = classic_group_of_one(CONFIG)
    generation = s.groups["g"].generation_id
    r = beat(s, "c", 0, 30)
    # Told to rejoin, it keeps heartbeating (its session stays alive) but never rejoins.
    for now in range(40, 30_000, 500):
        answer = step(s, "a", heartbeat_request("g", member_id, generation), now)
        assert answer.error_code == ErrorCode.rebalance_in_progress
        r = beat(s, r.member_id, r.member_epoch, now + 1)
        s.written += s.tick(now + 2).records
    s.written += s.tick(40 + 30_000 + 1).records  # join_request's rebalance timeout is 30 s
    assert member_id not in s.consumer.groups["g"].members
    r = beat(s, r.member_id, r.member_epoch, 30_100, owned=set())
    assert {p for tp in r.assignment.topic_partitions for p in tp.partitions} == {0, 1, 2, 3}


def test_a_member_record_in_the_earlier_field_order_still_reads():
    # An earlier raftka wrote ServerAssignor before RebalanceTimeoutMs.
    for assignor, encoded in ((None, b"\x00"), ("uniform", b"\x08uniform")):
        old = (b"\x00\x00" + b"\x00" + b"\x00" + b"\x02c" + b"\x03/h" + b"\x02\x02t" + b"\x00" + encoded
               + struct.pack(">i", 300_000) + b"\x00")
        key = cr.member_metadata_record("g", ConsumerMember("m")).key
        (_kind, _g, _m), value = cr.decode(key, old)
        assert (value["server_assignor"], value["rebalance_timeout_ms"], value["classic"]) == (assignor, 300_000, None)


def static_beat(s, member, epoch, now_ms, instance_id, owned=None):
    return step(s, member, hb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id=member, member_epoch=epoch, instance_id=instance_id, rack_id=None,
        rebalance_timeout=timedelta(seconds=5), subscribed_topic_names=("t",) if epoch == 0 else None,
        subscribed_topic_regex=None, server_assignor=None,
        topic_partitions=None if owned is None else (hb.TopicPartitions(topic_id=T, partitions=tuple(sorted(owned))),)),
        now_ms)


def mixed_static_group(config: GroupCoordinatorConfig) -> tuple[GroupCoordinatorShard, str, set[int], set[int]]:
    """A consumer group of a consumer-protocol static member (instance "ic")
    and a classic static member (instance "ia"), both reconciled; then the
    consumer-protocol one leaves for a restart (epoch -2), keeping its
    partitions. Returns the shard, the classic member id and each one's partitions."""
    s = GroupCoordinatorShard(0, config, random.Random(1))
    s.on_loaded(0)
    s.topics = {"t": (T, 4)}
    s.written = []
    c = static_beat(s, "c", 0, 0, "ic")
    joined = step(s, "a", join_request(version=5, instance_id="ia", session_ms=3000), 10)
    a_id = joined.member_id
    # c owned everything: it gives up what the classic member gets, then a rejoins for it.
    r = static_beat(s, c.member_id, c.member_epoch, 20, "ic", owned={0, 1, 2, 3})
    static_beat(s, c.member_id, r.member_epoch, 30, "ic", owned={p for tp in r.assignment.topic_partitions
                                                                  for p in tp.partitions})
    joined = step(s, "a", join_request(member_id=a_id, version=5, instance_id="ia", session_ms=3000), 40)
    synced = step(s, "a", sync_request("g", a_id, joined.generation_id, instance_id="ia"), 41)
    group = s.consumer.groups["g"]
    c_member = group.members[c.member_id]
    assert group.state_name() == "Stable", group
    a_parts, c_parts = partitions(synced.assignment), set(c_member.assigned[T])
    assert a_parts | c_parts == {0, 1, 2, 3} and a_parts and c_parts
    static_beat(s, c.member_id, -2, 60, "ic")  # leaves for a restart: keeps its partitions
    assert group.members[c.member_id].member_epoch == -2
    return s, a_id, a_parts, c_parts


def test_a_classic_static_member_replacing_the_last_consumer_protocol_member_downgrades():
    s, a_id, a_parts, c_parts = mixed_static_group(CONFIG)
    epoch = s.consumer.groups["g"].group_epoch
    # The consumer comes back rolled back to the classic protocol, same
    # group.instance.id and subscription: the group is a classic group again,
    # at the group epoch, with no rebalance; it takes the partitions back.
    joined = step(s, "c2", join_request(version=5, instance_id="ic", session_ms=3000), 70)
    assert joined.error_code == ErrorCode.none and joined.leader == "" and not joined.members
    assert "g" not in s.consumer.groups and s.groups["g"].state.value == "Stable"
    assert s.groups["g"].generation_id == epoch == joined.generation_id
    assert {m.group_instance_id for m in s.groups["g"].members.values()} == {"ia", "ic"}
    synced = step(s, "c2", sync_request("g", joined.member_id, joined.generation_id, instance_id="ic"), 71)
    assert synced.error_code == ErrorCode.none and partitions(synced.assignment) == c_parts
    # The classic member that stayed sees no rebalance.
    assert step(s, "a", heartbeat_request("g", a_id, epoch, instance_id="ia"), 72).error_code == ErrorCode.none
    back = rebuilt(s)
    assert "g" not in back.consumer.groups
    assert {m.member_id: partitions(m.assignment) for m in back.groups["g"].members.values()} == {
        a_id: a_parts, joined.member_id: c_parts}

    # With another subscription the classic group rebalances at once.
    s, a_id, _a, _c = mixed_static_group(CONFIG)
    joined = step(s, "c2", join_request(version=5, instance_id="ic", session_ms=3000,
                                        protocols=(("range", subscription("t", "u")),)), 70)
    assert joined.error_code == ErrorCode.none and "g" not in s.consumer.groups
    assert s.groups["g"].state.value == "PreparingRebalance"
    assert step(s, "a", heartbeat_request("g", a_id, s.groups["g"].generation_id, instance_id="ia"),
                72).error_code == ErrorCode.rebalance_in_progress

    # Without the downgrade in the policy it stays a consumer group of classic members.
    import dataclasses

    s, a_id, _a, c_parts = mixed_static_group(dataclasses.replace(CONFIG, group_consumer_migration_policy="upgrade"))
    joined = step(s, "c2", join_request(version=5, instance_id="ic", session_ms=3000), 70)
    assert joined.error_code == ErrorCode.none and "g" not in s.groups
    assert s.consumer.groups["g"].members[joined.member_id].classic is not None


def test_a_consumer_protocol_member_with_a_classic_members_instance_id_converts_nothing():
    # A classic static member that closed without leaving still holds its
    # instance id: Kafka answers UNRELEASED_INSTANCE_ID and the group stays classic.
    s = GroupCoordinatorShard(0, CONFIG, random.Random(1))
    s.on_loaded(0)
    s.topics = {"t": (T, 4)}
    s.written = []
    step(s, "a", join_request(version=5, instance_id="m", session_ms=3000), 0)
    for now in (5, 10, 20):
        s.written += s.tick(now).records
    (a_id,) = s.groups["g"].members
    written = len(s.written)
    r = static_beat(s, "c", 0, 30, "m")
    assert r.error_code == ErrorCode.unreleased_instance_id and "session times out" in r.error_message
    assert "g" in s.groups and "g" not in s.consumer.groups and len(s.written) == written
    # Once its session expired the instance id is free and the group upgrades.
    s.written += s.tick(30 + 3000 + 1).records
    assert a_id not in s.groups["g"].members
    assert static_beat(s, "c", 0, 3100, "m").error_code == ErrorCode.none and "g" in s.consumer.groups
