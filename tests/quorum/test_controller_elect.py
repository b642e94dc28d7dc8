"""Preferred leader election: the automatic rebalance (`auto.leader.rebalance.enable`,
`leader.imbalance.check.interval.seconds`, `leader.imbalance.per.broker.percentage`)
and ElectLeaders answers beyond the basic ones in test_controller_replication."""

import pytest
from controller_testing import Cluster
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig
from quorum.controller.leader_balance import imbalance_ratio, imbalanced_preferred_elections
from quorum.controller.reassignment import start_reassignment
from common.config import NodeConfig
from common.errors import ConfigError

INTERVAL_MS = 1000


def config(**overrides) -> ControllerConfig:
    return ControllerConfig(**{"leader_imbalance_check_interval_ms": INTERVAL_MS, **overrides})


def fail_and_return(c: Cluster, broker: int, at_ms: int) -> None:
    """`broker` misses its heartbeats (fenced, leadership moves away), then
    registers again, is unfenced and rejoins every ISR as a follower."""
    c.now_ms = at_ms - 1000
    for b in c.image.brokers:
        if b != broker and c.image.brokers[b].usable:
            c.heartbeat(b)
    c.tick(at_ms)
    assert not c.image.is_usable(broker)
    c.register(broker)
    c.heartbeat(broker)
    for name, topic_id in c.image.topic_ids_by_name.items():
        for index, p in c.image.topics_by_id[topic_id].partitions.items():
            if broker in p.replicas and broker not in p.isr:
                c.alter_isr(name, index, [*p.isr, broker])


def leaders(c: Cluster, name: str) -> dict[int, int]:
    topic = c.image.topic(name)
    return {i: p.leader for i, p in sorted(topic.partitions.items())}


def test_auto_rebalance_returns_leadership_to_the_preferred_replica_at_the_next_check():
    c = Cluster(config())
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    assert leaders(c, "t")[0] != 1
    assert imbalance_ratio(c.image, 1) == 1.0
    # The check is overdue (first one: an interval after activation).
    records = c.tick(c.now_ms)
    assert len(records) == 1
    assert leaders(c, "t") == {0: 1, 1: 2, 2: 3}
    assert c.tick(c.now_ms + INTERVAL_MS) == []  # balanced: nothing to do
    # Broker 2 fails in turn: its partition comes back at the next check, not before.
    fail_and_return(c, 2, at_ms=c.now_ms + 20_000)
    assert leaders(c, "t")[1] != 2
    last_check_ms = c.now_ms - 20_000 + INTERVAL_MS
    assert c.controller.next_deadline_ms(c.image) <= c.now_ms
    c.tick(c.now_ms)
    assert leaders(c, "t") == {0: 1, 1: 2, 2: 3}
    assert last_check_ms < c.now_ms


def test_the_check_waits_a_full_interval_after_activation():
    c = Cluster(config(leader_imbalance_check_interval_ms=300_000))
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    assert c.controller.next_deadline_ms(c.image) <= 300_000
    keep_alive(c, 299_000)
    assert c.tick(299_000) == []
    keep_alive(c, 300_000)
    c.tick(300_000)
    assert leaders(c, "t") == {0: 1}


def keep_alive(c: Cluster, now_ms: int) -> None:
    c.now_ms = now_ms
    for b in c.image.brokers:
        c.heartbeat(b)


def test_no_rebalance_when_disabled():
    c = Cluster(config(auto_leader_rebalance_enable=False))
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    keep_alive(c, 30_000)
    assert c.tick(30_000) == []
    assert leaders(c, "t") == {0: 2}


def test_a_broker_under_the_imbalance_percentage_keeps_the_current_leaders():
    c = Cluster(config(leader_imbalance_per_broker_percentage=50))
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={i: [1, 2] for i in range(4)})
    fail_and_return(c, 1, at_ms=20_000)
    # Broker 1 took two of its four partitions back by hand: 25% imbalance.
    r = c.send(el_req.ElectLeadersRequest(election_type=0, topic_partitions=(
        el_req.TopicPartitions(topic="t", partitions=(0, 1)),)))
    assert {p.error_code for p in r.replica_election_results[0].partition_result} == {ErrorCode.none}
    assert imbalance_ratio(c.image, 1) == 0.5
    assert imbalanced_preferred_elections(c.image, c.config) == []
    c.send(el_req.ElectLeadersRequest(election_type=0, topic_partitions=(
        el_req.TopicPartitions(topic="t", partitions=(2,)),)))
    assert imbalance_ratio(c.image, 1) == 0.25
    assert imbalanced_preferred_elections(c.image, c.config) == []
    assert imbalanced_preferred_elections(c.image, config(leader_imbalance_per_broker_percentage=10)) != []


def test_rebalance_skips_a_preferred_replica_out_of_the_isr_or_fenced():
    c = Cluster(config())
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2], 1: [3, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    c.alter_isr("t", 0, [2])  # 1 fell behind again
    # Broker 3 goes away: fenced, so it cannot take partition 1 back either.
    c.now_ms = 40_000
    for b in (1, 2):
        c.heartbeat(b)
    c.tick(40_000 + c.config.broker_session_timeout_ms - 500)
    c.tick(c.now_ms + 600)
    assert not c.image.is_usable(3)
    assert imbalanced_preferred_elections(c.image, c.config) == []


def test_rebalance_leaves_partitions_under_reassignment_alone():
    c = Cluster(config())
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    topic = c.image.topic("t")
    records, refusal = start_reassignment(topic.topic_id, 0, c.partition("t"), (1, 2, 3), c.image.is_usable)
    assert refusal is None
    c.append(records)
    assert c.partition("t").adding_replicas == (3,)
    assert imbalanced_preferred_elections(c.image, c.config) == []


def test_rebalance_is_bounded_per_check():
    c = Cluster(config())
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={i: [1, 2] for i in range(5)})
    fail_and_return(c, 1, at_ms=20_000)
    first = imbalanced_preferred_elections(c.image, c.config, limit=3)
    assert [r.partition for r in first] == [0, 1, 2]
    c.append(first)
    assert [r.partition for r in imbalanced_preferred_elections(c.image, c.config, limit=3)] == [3, 4]


def test_fencing_comes_before_the_rebalance_in_one_tick():
    c = Cluster(config())
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    fail_and_return(c, 1, at_ms=20_000)
    # At the next check broker 1 has also missed its heartbeats: only fencing.
    c.now_ms = 21_000  # broker 1's last heartbeat was at 20 000
    c.heartbeat(2)
    records = c.tick(20_000 + c.config.broker_session_timeout_ms + 1)
    assert records and not c.image.is_usable(1)
    assert leaders(c, "t") == {0: 2}


def test_preferred_election_of_an_offline_partition_whose_preferred_replica_is_back():
    c = Cluster(config(auto_leader_rebalance_enable=False))
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.alter_isr("t", 0, [1])
    c.now_ms = 19_000
    c.heartbeat(2)
    c.tick(20_000)  # broker 1 fenced: 2 is out of sync, the partition is offline
    assert c.partition("t").leader == -1
    c.register(1)
    c.heartbeat(1)  # unfencing brings it back as leader by itself
    r = c.send(el_req.ElectLeadersRequest(election_type=0, topic_partitions=(
        el_req.TopicPartitions(topic="t", partitions=(0,)),)))
    assert r.replica_election_results[0].partition_result[0].error_code == ErrorCode.election_not_needed
    assert c.partition("t").leader == 1


def test_the_rebalance_keys_are_read_from_the_node_config():
    def load(**keys):
        props = {"node.id": "1", "process.roles": "controller", "log.dirs": "/tmp/unused",
                 "controller.quorum.voters": "1@127.0.0.1:9093", **keys}
        return ControllerConfig.from_node_config(NodeConfig.from_properties(props))

    default = load()
    assert (default.auto_leader_rebalance_enable, default.leader_imbalance_check_interval_ms,
            default.leader_imbalance_per_broker_percentage) == (True, 300_000, 10)
    tuned = load(**{"auto.leader.rebalance.enable": "false", "leader.imbalance.check.interval.seconds": "1",
                    "leader.imbalance.per.broker.percentage": "0"})
    assert (tuned.auto_leader_rebalance_enable, tuned.leader_imbalance_check_interval_ms,
            tuned.leader_imbalance_per_broker_percentage) == (False, 1000, 0)
    with pytest.raises(ConfigError, match="leader.imbalance.check.interval.seconds"):
        load(**{"leader.imbalance.check.interval.seconds": "0"})
    with pytest.raises(ConfigError, match="leader.imbalance.per.broker.percentage"):
        load(**{"leader.imbalance.per.broker.percentage": "ten"})
