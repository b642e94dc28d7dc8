"""Preferred leader election on real processes: 3 controllers, 3 brokers, RF=3.

- With `auto.leader.rebalance.enable` (the default) and the check lowered to
  1 s, a leader that is killed and restarted gets its partitions back by
  itself once it is in sync again, while an acks=all producer loses nothing.
- With it off, leadership stays where failover put it until an operator
  asks: `raftka partitions elect-leaders` for one partition, confluent-kafka's
  `AdminClient.elect_leaders` for the rest.
"""

from __future__ import annotations

from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

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

PARTITIONS = 3
ALL = (4, 5, 6)


def leaders_and_preferred(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, preferred replica) as Metadata reports them."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20).topics[topic]
    return {p.id: (p.leader, p.replicas[0]) for p in meta.partitions.values()}


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
