"""Replication throttles' rules: which replicas a topic's throttled-replicas
lists name on a broker, which values are refused, and the SimpleRate a
throttle holds. The copies themselves: tests/cluster/test_replication_throttle.py."""

from broker.core.replication_quota import (ALL, FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS,
                                           replication_quota, throttled_partitions)
from quorum.metadata.broker_configs import broker_config_error
from quorum.metadata.topic_configs import topic_config_error


def test_a_list_names_the_partitions_of_one_broker():
    assert throttled_partitions("0:1, 1:2,2:1", 1) == frozenset({0, 2})
    assert throttled_partitions("0:1,1:2", 3) == frozenset()
    assert throttled_partitions("*", 7) is ALL


def test_bad_lists_and_rates_are_refused_saying_the_format():
    assert topic_config_error(LEADER_REPLICAS, "0:1,1:2") is None
    assert topic_config_error(FOLLOWER_REPLICAS, "*") is None
    assert "PARTITION:BROKER" in topic_config_error(LEADER_REPLICAS, "0-1")
    assert broker_config_error(LEADER_RATE, "500000") is None
    assert "at least 0" in broker_config_error(FOLLOWER_RATE, "-1")


def test_a_throttle_holds_from_its_first_second_and_only_with_a_rate_and_replicas():
    topics = {"t": {LEADER_REPLICAS: "0:1,1:2"}, "u": {FOLLOWER_REPLICAS: "*"}}
    assert replication_quota(LEADER_RATE, LEADER_REPLICAS, {}, topics, 1, None) is None
    assert replication_quota(LEADER_RATE, LEADER_REPLICAS, {LEADER_RATE: "1000"}, {}, 1, None) is None
    leader = replication_quota(LEADER_RATE, LEADER_REPLICAS, {LEADER_RATE: "1000"}, topics, 1, None)
    assert leader.throttled("t", 0) and not leader.throttled("t", 1) and not leader.throttled("u", 0)
    follower = replication_quota(FOLLOWER_RATE, FOLLOWER_REPLICAS, {FOLLOWER_RATE: "1000"}, topics, 1, None)
    assert follower.throttled("u", 5)
    leader.record(900, 100.0)
    assert not leader.exceeded(100.5)
    leader.record(600, 100.5)
    # 1500 bytes in the first second: over 1000 B/s until 1.5 s have passed.
    assert leader.exceeded(100.9) and 0.5 < leader.delay_s(100.9) < 0.7
    assert not leader.exceeded(101.6)
