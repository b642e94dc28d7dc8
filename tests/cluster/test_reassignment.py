"""Partition reassignment on real processes (KIP-455): 3 controllers, 3 brokers,
an idempotent acks=all producer writing throughout.

Partition 0 moves from brokers [4, 5] to [5, 6] through kafka-python's
AlterPartitionReassignments; partition 1 from [4, 5] to [6, 5] through
`raftka partitions reassign`. Both lose their leader (4) on the way. Every
acknowledged record must then be readable at its acknowledged offset from
the new replicas, the new replicas must hold identical logs, and broker 4
must have deleted its copies.
"""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition

from cluster_replication_testing import (
    SETTINGS,
    BackgroundProducer,
    check_no_loss,
    read_all,
    wait_for,
    wait_for_identical_replicas,
)
from cluster_testing import run_cli
from cluster import LocalCluster

TOPIC = "moves"


def replicas_and_isr(bootstrap: str) -> dict[int, tuple[tuple[int, ...], tuple[int, ...], int]]:
    """partition -> (replicas, sorted ISR, leader) as Metadata reports them."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=20).topics[TOPIC]
    return {p.id: (tuple(p.replicas), tuple(sorted(p.isrs)), p.leader) for p in meta.partitions.values()}


def test_reassigned_partitions_keep_every_record_and_the_old_replica_deletes_its_log(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=2, replica_assignment=[[4, 5], [4, 5]],
                                      config={"min.insync.replicas": "2"})])[TOPIC].result(60)
        wait_for("both replicas in sync", lambda: all(
            isr == (4, 5) and leader == 4 for _, isr, leader in replicas_and_isr(bootstrap).values()))
        assert (cluster.node(4).log_dir / f"{TOPIC}-0").is_dir()
        producer = BackgroundProducer(bootstrap, TOPIC, 2)
        wait_for("records acknowledged before the move", lambda: producer.acked_count() > 400)

        kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            assert kp.alter_partition_reassignments({TopicPartition(TOPIC, 0): [5, 6]}) == \
                {TopicPartition(TOPIC, 0): None}
            done = run_cli("partitions", "reassign", "--bootstrap-server", bootstrap, "--topic", TOPIC,
                           "--partition", "1", "--replicas", "6,5")
            assert done.returncode == 0, done.stderr
            assert "started" in done.stdout
            wait_for("both partitions on their new replicas", lambda: replicas_and_isr(bootstrap) == {
                0: ((5, 6), (5, 6), 5), 1: ((6, 5), (5, 6), 6)}, timeout_s=90)
            assert kp.list_partition_reassignments() == {}
        finally:
            kp.close()
        listed = run_cli("partitions", "list-reassignments", "--bootstrap-server", bootstrap)
        assert listed.returncode == 0 and "No reassignment under way" in listed.stdout, listed

        acked_at_switch = producer.acked_count()
        wait_for("records acknowledged by the new replicas", lambda: producer.acked_count() > acked_at_switch + 400)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, TOPIC, 2, len(producer.acked)))
        wait_for_identical_replicas(cluster, TOPIC, 2, (5, 6))
        wait_for("broker 4 deleted its copies", lambda: not any(
            (cluster.node(4).log_dir / f"{TOPIC}-{p}").exists() for p in range(2)))


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="soak: set RAFTKA_SOAK=1")
def test_soak_partitions_moved_round_and_round_while_producing(tmp_path) -> None:
    """Thirty moves of each of three partitions around the brokers, the next
    one started as soon as the last completed, with acks=all writes throughout."""
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=3, replica_assignment=[[4, 5], [5, 6], [6, 4]],
                                      config={"min.insync.replicas": "2"})])[TOPIC].result(60)
        producer = BackgroundProducer(bootstrap, TOPIC, 3)
        wait_for("records acknowledged", lambda: producer.acked_count() > 300)
        layouts = [[5, 6], [6, 4], [4, 5]]
        kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            for step in range(30):
                wanted = {p: tuple(layouts[(p + step) % 3]) for p in range(3)}
                assert set(kp.alter_partition_reassignments(
                    {TopicPartition(TOPIC, p): list(r) for p, r in wanted.items()}).values()) == {None}
                wait_for(f"move {step} complete", lambda: {
                    p: (replicas, isr) for p, (replicas, isr, _) in replicas_and_isr(bootstrap).items()} == {
                    p: (r, tuple(sorted(r))) for p, r in wanted.items()}, timeout_s=120)
        finally:
            kp.close()
        acked = producer.acked_count()
        wait_for("records acknowledged after the last move", lambda: producer.acked_count() > acked + 300)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, TOPIC, 3, len(producer.acked)))


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="soak: set RAFTKA_SOAK=1")
def test_soak_a_move_waits_for_a_dead_new_replica_across_controller_restarts(tmp_path) -> None:
    """The move's state lives in the metadata log: it survives every controller
    being killed and restarted, waits while the new replica is down, and
    completes once it is back and caught up."""
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[4, 5]],
                                      config={"min.insync.replicas": "2"})])[TOPIC].result(60)
        producer = BackgroundProducer(bootstrap, TOPIC, 1)
        wait_for("records acknowledged", lambda: producer.acked_count() > 300)
        cluster.kill(6)
        kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            assert kp.alter_partition_reassignments({TopicPartition(TOPIC, 0): [5, 6]}) == \
                {TopicPartition(TOPIC, 0): None}
            under_way = {TopicPartition(TOPIC, 0): {"replicas": [5, 6, 4], "adding_replicas": [6],
                                                    "removing_replicas": [4]}}
            for controller in (1, 2, 3):
                cluster.kill(controller)
                cluster.start(controller)
                # (wait_ready would insist on broker 6.) A controller answers, and the move is still there.
                wait_for(f"controller {controller} back, the move still under way",
                         lambda: kp.list_partition_reassignments() == under_way, timeout_s=90)
            cluster.start(6)
            cluster.wait_ready(120)
            wait_for("the move complete", lambda: replicas_and_isr(bootstrap)[0][:2] == ((5, 6), (5, 6)),
                     timeout_s=90)
        finally:
            kp.close()
        acked = producer.acked_count()
        wait_for("records acknowledged after the move", lambda: producer.acked_count() > acked + 300)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, TOPIC, 1, len(producer.acked)))
        wait_for_identical_replicas(cluster, TOPIC, 1, (5, 6))
        wait_for("broker 4 deleted its copy", lambda: not (cluster.node(4).log_dir / f"{TOPIC}-0").exists())
