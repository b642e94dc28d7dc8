"""CreateTopics, DeleteTopics, CreatePartitions, and balanced rack-aware placement."""

from collections import Counter

import pytest
from controller_testing import Cluster
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.create_partitions.v3 import request as cp_req
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig
from quorum.controller.topic_control import ZERO_UUID


def test_create_topic_places_every_partition_with_a_leader_in_its_isr():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    r = c.create_topic("orders", partitions=6, rf=3, configs={"retention.ms": "1000"})
    assert r.error_code == ErrorCode.none and (r.num_partitions, r.replication_factor) == (6, 3)
    topic = c.image.topic("orders")
    assert topic.topic_id == r.topic_id
    for i in range(6):
        p = topic.partitions[i]
        assert sorted(p.replicas) == [1, 2, 3] and p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    assert dict(c.image.topic_config("orders").items()) == {"retention.ms": "1000"}
    described = {e.name: (e.value, e.config_source) for e in r.configs}
    assert described["retention.ms"] == ("1000", 1) and described["cleanup.policy"] == ("delete", 5)


def test_defaults_come_from_num_partitions_and_default_replication_factor():
    c = Cluster(ControllerConfig(num_partitions=4, default_replication_factor=2))
    c.start_brokers(1, 2)
    r = c.create_topic("t", partitions=-1, rf=-1)
    assert (r.num_partitions, r.replication_factor) == (4, 2)
    assert len(c.image.topic("t").partitions) == 4


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "has space", "slash/no", "ünïcode"])
def test_illegal_topic_names_are_refused(name):
    c = Cluster()
    c.start_brokers(1)
    r = c.create_topic(name)
    assert r.error_code == ErrorCode.invalid_topic_exception and r.error_message
    assert c.image.topic(name) is None


def test_legal_names_include_dots_dashes_underscores_and_249_characters():
    c = Cluster()
    c.start_brokers(1)
    for name in ["a.b-c_D9", "x" * 249]:
        assert c.create_topic(name).error_code == ErrorCode.none


def test_create_refusals():
    c = Cluster()
    c.start_brokers(1, 2)
    c.register(3)  # registered but fenced: does not count toward the replication factor
    assert c.create_topic("t").error_code == ErrorCode.none
    assert c.create_topic("t").error_code == ErrorCode.topic_already_exists
    assert c.create_topic("u", partitions=0).error_code == ErrorCode.invalid_partitions
    assert c.create_topic("u", rf=0).error_code == ErrorCode.invalid_replication_factor
    r = c.create_topic("u", rf=3)
    assert r.error_code == ErrorCode.invalid_replication_factor and "only 2 broker(s)" in r.error_message
    r = c.create_topic("u", configs={"retention.msec": "1"})
    assert r.error_code == ErrorCode.invalid_config and "retention.msec" in r.error_message
    r = c.create_topic("u", configs={"retention.ms": "soon"})
    assert r.error_code == ErrorCode.invalid_config and "retention.ms" in r.error_message
    assert c.create_topic("u", configs={"min.insync.replicas": "0"}).error_code == ErrorCode.invalid_config
    assert c.image.topic("u") is None


def test_duplicate_names_in_one_request_are_all_refused():
    from kio.schema.create_topics.v7 import request as ct_req
    c = Cluster()
    c.start_brokers(1)
    t = ct_req.CreatableTopic(name="d", num_partitions=1, replication_factor=1, assignments=(), configs=())
    r = c.send(ct_req.CreateTopicsRequest(topics=(t, t)))
    assert [x.error_code for x in r.topics] == [ErrorCode.invalid_request] * 2
    assert c.image.topic("d") is None


def test_validate_only_writes_nothing():
    c = Cluster()
    c.start_brokers(1, 2)
    log_length = len(c.log)
    r = c.create_topic("t", partitions=3, rf=2, validate_only=True)
    assert r.error_code == ErrorCode.none and r.topic_id == ZERO_UUID and r.num_partitions == 3
    assert len(c.log) == log_length and c.image.topic("t") is None


def test_manual_assignment():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.register(4)  # fenced
    r = c.create_topic("m", assignments={0: [3, 1], 1: [4, 2]})
    assert r.error_code == ErrorCode.none
    assert c.partition("m", 0).replicas == (3, 1) and c.partition("m", 0).leader == 3
    p1 = c.partition("m", 1)
    assert (p1.replicas, p1.isr, p1.leader) == ((4, 2), (2,), 2)  # a fenced replica is not in sync
    for bad in ({0: [1, 1]}, {0: [9]}, {0: []}, {1: [1]}, {0: [4]}):
        assert c.create_topic("bad", assignments=bad).error_code == ErrorCode.invalid_replica_assignment, bad


def delete(c: Cluster, *states):
    return c.send(dt_req.DeleteTopicsRequest(topics=tuple(states), timeout=0))


def test_delete_by_name_and_by_id():
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("a", configs={"retention.ms": "5"})
    b_id = c.create_topic("b").topic_id
    r = delete(c, dt_req.DeleteTopicState(name="a", topic_id=ZERO_UUID),
               dt_req.DeleteTopicState(name=None, topic_id=b_id),
               dt_req.DeleteTopicState(name="nope", topic_id=ZERO_UUID),
               dt_req.DeleteTopicState(name=None, topic_id=ZERO_UUID.__class__(int=77)))
    assert [x.error_code for x in r.responses] == [ErrorCode.none, ErrorCode.none,
                                                   ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id]
    assert r.responses[1].name == "b"
    assert c.image.topic("a") is None and c.image.topic("b") is None
    assert len(c.image.topic_config("a")) == 0
    assert c.image.replica_count(1) == 0
    # The name is free again, with a new id.
    assert c.create_topic("b").topic_id != b_id


def grow(c: Cluster, name: str, count: int, assignments=None):
    topic = cp_req.CreatePartitionsTopic(
        name=name, count=count,
        assignments=None if assignments is None else tuple(cp_req.CreatePartitionsAssignment(broker_ids=tuple(a))
                                                           for a in assignments))
    return c.send(cp_req.CreatePartitionsRequest(topics=(topic,), timeout=0, validate_only=False)).results[0]


def test_create_partitions_only_grows_and_keeps_the_replication_factor():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", partitions=2, rf=2)
    assert grow(c, "t", 5).error_code == ErrorCode.none
    assert len(c.image.topic("t").partitions) == 5
    assert all(len(c.partition("t", i).replicas) == 2 for i in range(5))
    assert grow(c, "t", 5).error_code == ErrorCode.invalid_partitions
    assert grow(c, "t", 3).error_code == ErrorCode.invalid_partitions
    assert grow(c, "nope", 3).error_code == ErrorCode.unknown_topic_or_partition
    assert grow(c, "t", 7, assignments=[[3, 1]]).error_code == ErrorCode.invalid_replica_assignment
    assert grow(c, "t", 6, assignments=[[3, 1]]).error_code == ErrorCode.none
    assert c.partition("t", 5).replicas == (3, 1)


def per_broker(c: Cluster, brokers) -> tuple[Counter, Counter]:
    leaders, replicas = Counter({b: 0 for b in brokers}), Counter({b: 0 for b in brokers})
    for topic in c.image.topics_by_id.values():
        for p in topic.partitions.values():
            assert len(set(p.replicas)) == len(p.replicas), p  # never two replicas on one broker
            leaders[p.leader] += 1
            replicas.update(p.replicas)
    return leaders, replicas


@given(st.sampled_from([3, 5, 7]), st.integers(1, 3), st.lists(st.integers(1, 12), min_size=1, max_size=30))
def test_placement_balances_leaders_and_replicas_across_many_topics(n, rf, sizes):
    c = Cluster()
    brokers = list(range(1, n + 1))
    c.start_brokers(*brokers)
    for i, size in enumerate(sizes):
        assert c.create_topic(f"t{i}", partitions=size, rf=rf).error_code == ErrorCode.none
        leaders, replicas = per_broker(c, brokers)
        assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
        assert max(replicas.values()) - min(replicas.values()) <= 1, replicas


@given(st.lists(st.tuples(st.integers(1, 10), st.integers(1, 3)), min_size=1, max_size=20))
def test_mixed_replication_factors_keep_leaders_within_one(topics):
    c = Cluster()
    c.start_brokers(1, 2, 3, 4, 5)
    for i, (size, rf) in enumerate(topics):
        c.create_topic(f"t{i}", partitions=size, rf=rf)
    leaders, replicas = per_broker(c, range(1, 6))
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
    assert max(replicas.values()) - min(replicas.values()) <= 4, replicas


@given(st.sampled_from([(6, 2), (6, 3), (9, 3)]), st.integers(2, 3), st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_placement_spreads_each_partition_over_racks(layout, rf, sizes):
    n, n_racks = layout
    c = Cluster()
    racks = {b: f"rack-{b % n_racks}" for b in range(n)}
    c.start_brokers(*range(n), racks=racks)
    for i, size in enumerate(sizes):
        c.create_topic(f"t{i}", partitions=size, rf=rf)
    for topic in c.image.topics_by_id.values():
        for p in topic.partitions.values():
            assert len({racks[b] for b in p.replicas}) == min(rf, n_racks), p
    leaders, replicas = per_broker(c, range(n))
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert max(replicas.values()) - min(replicas.values()) <= 1


def test_followers_of_one_broker_spread_over_the_others():
    c = Cluster()
    c.start_brokers(1, 2, 3, 4, 5)
    c.create_topic("t", partitions=20, rf=2)
    followers_of_1 = {c.partition("t", i).replicas[1] for i in range(20) if c.partition("t", i).replicas[0] == 1}
    assert followers_of_1 == {2, 3, 4, 5}  # losing broker 1 spreads its leadership over every peer


def test_new_brokers_receive_new_partitions_first():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("old", partitions=4, rf=1)
    c.start_brokers(3, 4)
    c.create_topic("new", partitions=4, rf=1)
    assert sorted(c.partition("new", i).leader for i in range(4)) == [3, 3, 4, 4]


def test_max_partitions_per_broker_refuses_what_a_broker_cannot_hold():
    c = Cluster(ControllerConfig(max_partitions_per_broker=10))
    c.start_brokers(1, 2)
    assert c.create_topic("a", partitions=8, rf=2).error_code == ErrorCode.none  # 8 replicas on each broker
    refused = c.create_topic("b", partitions=3, rf=2)
    assert refused.error_code == ErrorCode.policy_violation
    assert "max.partitions.per.broker=10" in refused.error_message
    assert c.image.topic("b") is None
    # A refused topic takes no room from the next one.
    assert c.create_topic("c", partitions=2, rf=2).error_code == ErrorCode.none
    grown = grow(c, "c", 3)
    assert grown.error_code == ErrorCode.policy_violation and "max.partitions.per.broker=10" in grown.error_message
    assert len(c.image.topic("c").partitions) == 2
    assert c.create_topic("d", assignments={0: [1]}).error_code == ErrorCode.policy_violation
    # Off by default.
    unlimited = Cluster()
    unlimited.start_brokers(1)
    assert unlimited.create_topic("big", partitions=500).error_code == ErrorCode.none


def test_max_partitions_per_broker_is_read_from_the_node_config():
    from common.config import NodeConfig

    props = {"node.id": "1", "process.roles": "controller", "controller.quorum.voters": "1@127.0.0.1:9093",
             "log.dirs": "/tmp/unused", "max.partitions.per.broker": "2000"}
    node = NodeConfig.from_properties(props)
    assert ControllerConfig.from_node_config(node).max_partitions_per_broker == 2000
