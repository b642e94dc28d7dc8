"""RAFTKA_SOAK=1: a migration with three KRaft controllers (three ZooKeeper servers) whose
active controller is SIGKILLed between two broker moves; the next one takes over the
dual write and the migration completes with nothing lost."""

import os
import signal
import time

import pytest
from kazoo.client import KazooClient

from cluster.migration import LocalMigration
from quorum.zookeeper import znodes as z
from quorum.zookeeper.ensemble import zookeeper_missing_reason
from cluster import LocalCluster

from test_migrate_cluster import RECORDS, TIMEOUT_S, committed, consume_and_commit, create_topic, expected_layout, \
    produce, read_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.soak,
    pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="soak: set RAFTKA_SOAK=1"),
    pytest.mark.skipif(zookeeper_missing_reason() is not None, reason=f"needs ZooKeeper: {zookeeper_missing_reason()}"),
]


def active_kraft_controller(connect: str) -> int:
    zk = KazooClient(connect)
    zk.start(30)
    try:
        held = z.decode_controller(zk.get(z.CONTROLLER_PATH)[0])
    finally:
        zk.stop()
        zk.close()
    assert held.kraft_controller_epoch >= 0, "a KRaft controller holds /controller"
    return held.broker_id


def test_active_controller_killed_mid_migration(tmp_path):
    with LocalCluster(tmp_path / "cluster", controllers=3, brokers=3, mode="zk", zookeeper_tick_time_ms=500,
                      broker_overrides={"zookeeper.session.timeout.ms": "6000"}) as cluster:
        cluster.start_all()
        cluster.wait_ready(TIMEOUT_S)
        create_topic(cluster.bootstrap, "orders", {"retention.ms": "86400000"})
        produce(cluster.bootstrap, "orders", range(RECORDS))
        before = consume_and_commit(cluster.bootstrap, "orders", RECORDS // 2)

        migration = LocalMigration(cluster)
        migration.start_controllers(TIMEOUT_S)
        migration.wait_copied(TIMEOUT_S)
        first, *rest = migration.broker_ids
        migration.move_broker(first, TIMEOUT_S)
        cluster.kill(active_kraft_controller(cluster.zookeeper.connect_string), signal.SIGKILL)
        for b in rest:
            migration.move_broker(b, TIMEOUT_S)
        create_topic(cluster.bootstrap, "after-failover")
        assert read_all(cluster.bootstrap, "orders", RECORDS) == expected_layout(RECORDS)
        assert committed(cluster.bootstrap, "orders") == before
        zk = KazooClient(cluster.zookeeper.connect_string)
        zk.start(30)
        try:
            deadline = time.monotonic() + 30
            while zk.exists(z.topic_path("after-failover")) is None:
                assert time.monotonic() < deadline, "the new active controller dual-writes"
                time.sleep(0.2)
            assert active_kraft_controller(cluster.zookeeper.connect_string) in {n.node_id for n in cluster.controllers
                                                                                 if n.is_running()}
        finally:
            zk.stop()
            zk.close()
