"""A ZooKeeper-mode cluster of real processes, with data and a consumer group, migrated
to KRaft (and, before finalize, rolled back), checked with confluent-kafka."""

import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kazoo.client import KazooClient

from cluster.migration import LocalMigration
from quorum.migration.znode import MIGRATION_PATH
from quorum.zookeeper import znodes as z
from quorum.zookeeper.ensemble import zookeeper_missing_reason
from cluster import LocalCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(zookeeper_missing_reason() is not None, reason=f"needs ZooKeeper: {zookeeper_missing_reason()}"),
]

RECORDS = 300
TIMEOUT_S = 120.0


def zk_cluster(tmp_path) -> LocalCluster:
    return LocalCluster(tmp_path / "cluster", controllers=1, brokers=3, mode="zk", zookeeper_tick_time_ms=500,
                        broker_overrides={"zookeeper.session.timeout.ms": "6000"})


def create_topic(bootstrap: str, name: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, 3, 3, config=config or {})]).values():
        f.result(30)


def produce(bootstrap: str, topic: str, values: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in values:
        p.produce(topic, value=str(i).encode(), partition=i % 3)
    assert p.flush(60) == 0, "every record acknowledged"


def read_all(bootstrap: str, topic: str, count: int) -> dict[tuple[int, int], int]:
    """(partition, offset) -> value of the first `count` records, read from offset 0.

    A read that ends short prints what the consumer saw (its errors, the
    partitions' leaders and watermarks), which pytest shows with the failure."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(3)])
    out: dict[tuple[int, int], int] = {}
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while len(out) < count and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            out[(m.partition(), m.offset())] = int(m.value())
        elif m is not None:
            errors[str(m.error())] += 1
    if len(out) < count:
        print(f"read {len(out)} of {count} records of {topic!r}; consumer errors: {dict(errors)}")
        try:
            for p, pm in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions.items()):
                print(f"  partition {p}: leader {pm.leader}, replicas {pm.replicas}, isr {pm.isrs}, "
                      f"watermarks {c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)}, "
                      f"position {c.position([TopicPartition(topic, p)])[0].offset}")
        except KafkaException as exc:
            print(f"  and the cluster's view of it could not be read: {exc}")
    c.close()
    return out


def consume_and_commit(bootstrap: str, topic: str, count: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < count and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    c.close()
    return committed(bootstrap, topic)


def committed(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    out = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)}
    c.close()
    return out


def topic_config(bootstrap: str, topic: str, key: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [f] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return f.result(30)[key].value


def expected_layout(count: int) -> dict[tuple[int, int], int]:
    return {(i % 3, i // 3): i for i in range(count)}


def test_migrated_cluster_keeps_every_record_offset_group_offset_and_config(tmp_path):
    with zk_cluster(tmp_path) as cluster:
        cluster.start_all()
        cluster.wait_ready(TIMEOUT_S)
        create_topic(cluster.bootstrap, "orders", {"retention.ms": "86400000"})
        produce(cluster.bootstrap, "orders", range(RECORDS))
        before = consume_and_commit(cluster.bootstrap, "orders", RECORDS // 2)
        assert sum(o for o in before.values() if o >= 0) >= RECORDS // 2

        migration = LocalMigration(cluster)
        migration.start_controllers(TIMEOUT_S)
        migration.wait_copied(TIMEOUT_S)
        migration.move_brokers(TIMEOUT_S)
        cluster.wait_ready(TIMEOUT_S)

        assert read_all(cluster.bootstrap, "orders", RECORDS) == expected_layout(RECORDS), \
            "every record readable at its old offset"
        assert committed(cluster.bootstrap, "orders") == before, "committed group offsets intact"
        assert topic_config(cluster.bootstrap, "orders", "retention.ms") == "86400000"
        produce(cluster.bootstrap, "orders", range(RECORDS, RECORDS + 30))  # and it takes writes in KRaft mode

        # Before finalize, ZooKeeper is kept current: a topic created now is there too.
        create_topic(cluster.bootstrap, "during")
        zk = KazooClient(cluster.zookeeper.connect_string)
        zk.start(30)
        try:
            deadline = time.monotonic() + 30
            while zk.exists(z.topic_path("during")) is None:
                assert time.monotonic() < deadline, "a topic created during the migration reached ZooKeeper"
                time.sleep(0.2)
            assert zk.exists(MIGRATION_PATH) is not None

            migration.finalize(TIMEOUT_S)
            cluster.wait_ready(TIMEOUT_S)
            time.sleep(2)
            create_topic(cluster.bootstrap, "after")
            time.sleep(2)
            assert zk.exists(z.topic_path("after")) is None, "finalized: ZooKeeper is no longer written"
        finally:
            zk.stop()
            zk.close()
        assert read_all(cluster.bootstrap, "orders", RECORDS + 30) == expected_layout(RECORDS + 30)


def test_rollback_before_finalize_returns_to_a_working_zookeeper_mode(tmp_path):
    with zk_cluster(tmp_path) as cluster:
        cluster.start_all()
        cluster.wait_ready(TIMEOUT_S)
        create_topic(cluster.bootstrap, "orders")
        produce(cluster.bootstrap, "orders", range(RECORDS))

        migration = LocalMigration(cluster)
        migration.start_controllers(TIMEOUT_S)
        migration.wait_copied(TIMEOUT_S)
        first = migration.broker_ids[0]
        migration.move_broker(first, TIMEOUT_S)  # one broker in KRaft mode, two still in ZooKeeper mode
        create_topic(cluster.bootstrap, "during")  # decided by the quorum, dual-written to ZooKeeper

        migration.rollback(TIMEOUT_S)
        assert not migration.migrated_znode_exists()
        assert not cluster.controllers
        assert not (tmp_path / "cluster" / "controller-1").exists(), "a later migration starts from a fresh quorum"
        produce(cluster.bootstrap, "orders", range(RECORDS, RECORDS + 30))
        assert read_all(cluster.bootstrap, "orders", RECORDS + 30) == expected_layout(RECORDS + 30), \
            "ZooKeeper mode serves every record, old and new, at its offset"
        produce(cluster.bootstrap, "during", range(30))
        assert len(read_all(cluster.bootstrap, "during", 30)) == 30, "the topic created during the migration works"
