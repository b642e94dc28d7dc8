"""The issue's no-loss soak (RAFTKA_SOAK=1): 20 SIGKILLs of partition
leaders while an idempotent acks=all producer writes to 6 partitions as fast
as it can, the active controller killed once midway, every killed process
restarted; then every acknowledged record is read back exactly once, in
order, and the replicas are identical.

Also, in the default run: a SIGTERM'd leader hands its partitions over by
controlled shutdown (no client error, nothing lost) with RF=3.
"""

from __future__ import annotations

import os

import pytest
import trio

from bench.cluster_probes import quorum_leader
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
ALL = (4, 5, 6)
KILLS = 20
#: The issue's soak: 6 partitions at full speed.
SOAK_PARTITIONS = 6


def test_sigterm_leader_moves_leadership_by_controlled_shutdown(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "ledger", PARTITIONS)
        wait_for_isr(bootstrap, "ledger", PARTITIONS, ALL)
        producer = BackgroundProducer(bootstrap, "ledger", PARTITIONS)
        wait_for("records acknowledged", lambda: producer.acked_count() > 200)
        leader = partition_state(bootstrap, "ledger")[0][0]
        assert cluster.stop(leader), "the broker did not stop cleanly on SIGTERM"
        state = partition_state(bootstrap, "ledger")
        assert all(lead != leader for lead, _ in state.values()), state
        acked = producer.acked_count()
        wait_for("records acknowledged after the shutdown", lambda: producer.acked_count() > acked + 200)
        cluster.start(leader)
        cluster.wait_ready(120)
        wait_for_isr(bootstrap, "ledger", PARTITIONS, ALL)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        check_no_loss(producer.acked, read_all(bootstrap, "ledger", PARTITIONS, len(producer.acked)))
        wait_for_identical_replicas(cluster, "ledger", PARTITIONS, ALL)


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="soak: set RAFTKA_SOAK=1")
def test_twenty_leader_kills_and_a_controller_kill_lose_nothing_acknowledged(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "soak", SOAK_PARTITIONS)
        wait_for_isr(bootstrap, "soak", SOAK_PARTITIONS, ALL)
        producer = BackgroundProducer(bootstrap, "soak", SOAK_PARTITIONS, rate_per_s=None)
        controllers = [(n.host, n.port) for n in cluster.controllers]
        for kill in range(KILLS):
            acked = producer.acked_count()
            wait_for("progress before the next kill", lambda: producer.acked_count() > acked + 100, 90)
            if kill == KILLS // 2:
                active = trio.run(quorum_leader, controllers)
                assert active is not None, "no active controller"
                cluster.kill(active[0])
                cluster.start(active[0])
            victim = partition_state(bootstrap, "soak")[kill % SOAK_PARTITIONS][0]
            cluster.kill(victim)
            wait_for("a new leader", lambda: all(
                lead not in (victim, -1) for lead, _ in partition_state(bootstrap, "soak").values()), 90)
            cluster.start(victim)
            cluster.wait_ready(120)
            wait_for_isr(bootstrap, "soak", SOAK_PARTITIONS, ALL, timeout_s=90)
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        print(f"soak: {len(producer.acked):,} records acknowledged over {KILLS} leader kills")
        check_no_loss(producer.acked,
                      read_all(bootstrap, "soak", SOAK_PARTITIONS, len(producer.acked), timeout_s=900))
        wait_for_identical_replicas(cluster, "soak", SOAK_PARTITIONS, ALL)
