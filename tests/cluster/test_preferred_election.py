"""Preferred leader election on real processes: 3 controllers, 3 brokers, RF=3.

- With `auto.leader.rebalance.enable` (the default) and the check lowered to
  1 s, a leader that is killed and restarted gets its partitions back by
  itself once it is in sync again, while an acks=all producer loses nothing.
- With it off, leadership stays where failover put it until an operator
  asks: `raftka partitions elect-leaders` for one partition, confluent-kafka's
  `AdminClient.elect_leaders` for the rest. Meanwhile the former leader,
  asked for the partition by a raw Produce v13 and Fetch v17 (by topic id),
  answers NOT_LEADER_OR_FOLLOWER naming the new leader and its endpoint
  (KIP-951).
"""

from __future__ import annotations

import datetime
import time

import trio
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from cluster_replication_testing import (
    SETTINGS,
    BackgroundProducer,
    check_no_loss,
    create_topic,
    read_all,
    wait_for,
    wait_for_isr,
)
from cluster_testing import run_cli
from cluster import LocalCluster
from common.wire import open_connection
from storage.batch import build_batch

PARTITIONS = 3
ALL = (4, 5, 6)


def leaders_and_preferred(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, preferred replica) as Metadata reports them."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20).topics[topic]
    return {p.id: (p.leader, p.replicas[0]) for p in meta.partitions.values()}


def ask_former_leader(host: str, port: int, topic: str, partition: int):
    """A raw Produce v13 and Fetch v17 for `partition`, by topic id, sent to
    the broker at host:port: (produce response, fetch response)."""
    from kio.schema.fetch.v17 import request as f17
    from kio.schema.metadata.v13 import request as md13
    from kio.schema.produce.v13 import request as p13

    ms = datetime.timedelta(milliseconds=1)

    async def ask():
        async with open_connection(host, port, connect_timeout_ms=5000) as conn:
            meta = await conn.request(md13.MetadataRequest(
                topics=(md13.MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            topic_id = meta.topics[0].topic_id
            batch = build_batch([(None, b"to the former leader", (), int(time.time() * 1000))])
            produced = await conn.request(p13.ProduceRequest(acks=-1, timeout=5000 * ms, topic_data=(
                p13.TopicProduceData(topic_id=topic_id, partition_data=(
                    p13.PartitionProduceData(index=partition, records=batch),)),)))
            fetched = await conn.request(f17.FetchRequest(max_wait=0 * ms, min_bytes=1, topics=(f17.FetchTopic(
                topic_id=topic_id, partitions=(f17.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20),)),),
                forgotten_topics_data=()))
            return produced, fetched
    return trio.run(ask)


def kill_and_restart_a_preferred_leader(cluster: LocalCluster, topic: str) -> int:
    bootstrap = cluster.bootstrap
    wait_for_isr(bootstrap, topic, PARTITIONS, ALL)
    state = leaders_and_preferred(bootstrap, topic)
    assert all(leader == preferred for leader, preferred in state.values()), state
    victim = state[0][0]
    cluster.kill(victim)
    wait_for(f"leadership moved off broker {victim}", lambda: all(
        leader not in (victim, -1) for leader, _ in leaders_and_preferred(bootstrap, topic).values()))
    cluster.start(victim)
    cluster.wait_ready(120)
    wait_for_isr(bootstrap, topic, PARTITIONS, ALL)
    return victim


def test_auto_rebalance_gives_a_restarted_broker_its_partitions_back(tmp_path) -> None:
    overrides = {**SETTINGS, "leader.imbalance.check.interval.seconds": "1"}
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=overrides) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "rebalanced", PARTITIONS)
        wait_for_isr(bootstrap, "rebalanced", PARTITIONS, ALL)
        producer = BackgroundProducer(bootstrap, "rebalanced", PARTITIONS)
        wait_for("records acknowledged", lambda: producer.acked_count() > 200)
        victim = kill_and_restart_a_preferred_leader(cluster, "rebalanced")
        wait_for(f"broker {victim} leads its preferred partitions again", lambda: all(
            leader == preferred for leader, preferred in leaders_and_preferred(bootstrap, "rebalanced").values()),
            timeout_s=30)
        acked = producer.acked_count()
        wait_for("records acknowledged after the rebalance", lambda: producer.acked_count() > acked + 200)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, "rebalanced", PARTITIONS, len(producer.acked)))


def test_without_auto_rebalance_leadership_returns_only_when_asked(tmp_path) -> None:
    overrides = {**SETTINGS, "auto.leader.rebalance.enable": "false", "leader.imbalance.check.interval.seconds": "1"}
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=overrides) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "manual", PARTITIONS)
        victim = kill_and_restart_a_preferred_leader(cluster, "manual")
        state = leaders_and_preferred(bootstrap, "manual")
        moved = sorted(p for p, (leader, preferred) in state.items() if leader != preferred)
        assert moved and all(state[p][1] == victim for p in moved), state

        # The former leader, now a follower, tells a client where the partition went.
        brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).brokers
        new_leader = state[moved[0]][0]
        where = (new_leader, brokers[new_leader].host, brokers[new_leader].port)
        produced, fetched = ask_former_leader(brokers[victim].host, brokers[victim].port, "manual", moved[0])
        for response, (topic,) in ((produced, produced.responses), (fetched, fetched.responses)):
            (p,) = getattr(topic, "partition_responses", None) or topic.partitions
            assert p.error_code == ErrorCode.not_leader_or_follower and p.current_leader.leader_id == new_leader
            assert [(n.node_id, n.host, n.port) for n in response.node_endpoints] == [where]

        first = run_cli("partitions", "elect-leaders", "--bootstrap-server", bootstrap, "--topic", "manual",
                        "--partition", str(moved[0]))
        assert first.returncode == 0, first.stderr
        assert "elected" in first.stdout
        assert leaders_and_preferred(bootstrap, "manual")[moved[0]][0] == victim
        again = run_cli("partitions", "elect-leaders", "--bootstrap-server", bootstrap, "--topic", "manual",
                        "--partition", str(moved[0]))
        assert again.returncode == 0 and "not needed" in again.stdout, again

        admin = AdminClient({"bootstrap.servers": bootstrap})
        results = admin.elect_leaders(ElectionType.PREFERRED,
                                      [TopicPartition("manual", p) for p in range(PARTITIONS)]).result(60)
        outcome = {tp.partition: (None if e is None else e.name()) for tp, e in results.items()}
        assert outcome == {p: (None if p in moved[1:] else "ELECTION_NOT_NEEDED") for p in range(PARTITIONS)}
        assert all(leader == preferred for leader, preferred in leaders_and_preferred(bootstrap, "manual").values())
