"""Replication on real processes: 3 controllers, 3 brokers, RF=3,
min.insync.replicas=2, an idempotent acks=all confluent-kafka producer.

Faults: SIGKILL of a partition leader (and its return), a follower down
while data is written (and its return), a SIGSTOPped follower, two
followers down. The checker reads every partition back: each acknowledged
record is there exactly once, at its acknowledged offset, in order.
"""

from __future__ import annotations

import re
import signal

from confluent_kafka import KafkaError, Producer

from cluster import LocalCluster
from cluster_replication_testing import (
    SETTINGS,
    BackgroundProducer,
    check_no_loss,
    create_topic,
    partition_state,
    read_all,
    wait_for,
    wait_for_identical_replicas,
    wait_for_isr,
)

PARTITIONS = 3
ALL = (4, 5, 6)  # broker ids: node ids after the three controllers


def _started(tmp_path) -> LocalCluster:
    cluster = LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS)
    cluster.start_all()
    cluster.wait_ready(120)
    return cluster


def test_leader_killed_and_restarted_loses_no_acknowledged_record(tmp_path) -> None:
    with _started(tmp_path) as cluster:
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "orders", PARTITIONS)
        wait_for_isr(bootstrap, "orders", PARTITIONS, ALL)
        producer = BackgroundProducer(bootstrap, "orders", PARTITIONS)
        wait_for("records acknowledged", lambda: producer.acked_count() > 200)
        victim = partition_state(bootstrap, "orders")[0][0]
        cluster.kill(victim)
        acked_at_kill = producer.acked_count()
        # A new leader takes over from the ISR and acks=all goes on with two replicas.
        wait_for("a new leader of partition 0",
                 lambda: partition_state(bootstrap, "orders")[0][0] not in (victim, -1))
        # The active controller says whom it fenced and why.
        fenced = f"fencing broker {victim} (epoch "
        wait_for("the fence in the active controller's log",
                 lambda: any(fenced in cluster.node(c).output_since_start() for c in (1, 2, 3)), 10)
        (line,) = [line for c in (1, 2, 3) for line in cluster.node(c).output_since_start().splitlines()
                   if fenced in line]
        assert "no heartbeat for over broker.session.timeout.ms=3000 ms" in line, line
        wait_for("records acknowledged by the new leaders", lambda: producer.acked_count() > acked_at_kill + 200)
        # Each survivor's failover timeline: the delta that moved leaders to
        # it is reported once its followers fetched and committed the new
        # epoch, and the one that moved its fetching once the new leader answered.
        survivors = [b for b in ALL if b != victim]
        timeline = re.compile(r"new leaderships: first follower fetch \+\d+\.\.\+\d+ ms \(median \+\d+\), "
                              r"HW past the epoch start \+\d+\.\.\+\d+ ms")
        wait_for("a survivor's timeline of its new leaderships",
                 lambda: any(timeline.search(cluster.node(b).output_since_start()) for b in survivors), 10)
        wait_for("a survivor's timeline of the leaders it follows",
                 lambda: any(re.search(r"follow a new leader: first answer \+\d+\.\.\+\d+ ms",
                                       cluster.node(b).output_since_start()) for b in survivors), 10)
        assert not any(" s)" in line and "not within" in line for b in survivors
                       for line in cluster.node(b).output_since_start().splitlines())
        cluster.start(victim)
        cluster.wait_ready(120)
        wait_for_isr(bootstrap, "orders", PARTITIONS, ALL)
        wait_for("records acknowledged with the ISR whole again",
                 lambda: producer.acked_count() > acked_at_kill + 400)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, "orders", PARTITIONS, len(producer.acked)))
        # The restarted leader re-validated its log by DivergingEpoch (what it
        # had past the new leader's epoch start is gone) and caught up.
        wait_for_identical_replicas(cluster, "orders", PARTITIONS, ALL)


def test_follower_returns_catches_up_and_rejoins_the_isr(tmp_path) -> None:
    with _started(tmp_path) as cluster:
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "events", PARTITIONS)
        wait_for_isr(bootstrap, "events", PARTITIONS, ALL)
        leaders = {leader for leader, _ in partition_state(bootstrap, "events").values()}
        follower = next(b for b in ALL if b not in leaders) if len(leaders) < 3 else ALL[-1]
        cluster.kill(follower)
        rest = tuple(b for b in ALL if b != follower)
        wait_for_isr(bootstrap, "events", PARTITIONS, rest)
        producer = BackgroundProducer(bootstrap, "events", PARTITIONS)
        wait_for("records acknowledged without the follower", lambda: producer.acked_count() > 500)
        cluster.start(follower)
        cluster.wait_ready(120)
        wait_for_isr(bootstrap, "events", PARTITIONS, ALL)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, "events", PARTITIONS, len(producer.acked)))
        wait_for_identical_replicas(cluster, "events", PARTITIONS, ALL)


def test_stopped_follower_leaves_the_isr_and_rejoins_after_sigcont(tmp_path) -> None:
    with _started(tmp_path) as cluster:
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "clicks", 1)
        wait_for_isr(bootstrap, "clicks", 1, ALL)
        leader = partition_state(bootstrap, "clicks")[0][0]
        follower = next(b for b in ALL if b != leader)
        producer = BackgroundProducer(bootstrap, "clicks", 1)
        wait_for("records acknowledged", lambda: producer.acked_count() > 100)
        cluster.kill(follower, signal.SIGSTOP)
        try:
            rest = tuple(b for b in ALL if b != follower)
            # The leader shrinks the ISR after replica.lag.time.max.ms (the
            # broker is not fenced for good: the controller fences it only
            # for missed heartbeats), and acks=all goes on with min ISR 2.
            wait_for_isr(bootstrap, "clicks", 1, rest, timeout_s=30)
            acked = producer.acked_count()
            wait_for("records acknowledged with the ISR shrunk", lambda: producer.acked_count() > acked + 200)
        finally:
            cluster.kill(follower, signal.SIGCONT)
        wait_for_isr(bootstrap, "clicks", 1, ALL)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, "clicks", 1, len(producer.acked)))
        wait_for_identical_replicas(cluster, "clicks", 1, ALL)


def test_two_followers_down_refuse_acks_all_with_not_enough_replicas(tmp_path) -> None:
    with _started(tmp_path) as cluster:
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "audit", 1)
        wait_for_isr(bootstrap, "audit", 1, ALL)
        leader = partition_state(bootstrap, "audit")[0][0]
        followers = [b for b in ALL if b != leader]
        for b in followers:
            cluster.kill(b)
        wait_for_isr(bootstrap, "audit", 1, (leader,))
        outcomes: list = []
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 5000,
                             "retries": 0})
        for i in range(5):
            producer.produce("audit", value=f"lonely-{i}".encode(), partition=0,
                             on_delivery=lambda err, msg: outcomes.append(err))
        producer.flush(30)
        assert len(outcomes) == 5
        assert all(err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS for err in outcomes), outcomes
        # Nothing refused was written: the log holds no record.
        assert read_all(bootstrap, "audit", 1, 0, timeout_s=10) == {0: []}
        for b in followers:
            cluster.start(b)
        cluster.wait_ready(120)
        wait_for_isr(bootstrap, "audit", 1, ALL)
