"""DeleteRecords, DescribeLogDirs and AlterReplicaLogDirs on real processes
(one controller, three brokers, RF=3), through confluent-kafka and kafka-python."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartitionReplica
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import LogDirNotFoundError, NoError

from kio.schema.errors import ErrorCode

from cluster import LocalCluster
from cluster_replication_testing import SETTINGS, create_topic, partition_state, wait_for, wait_for_isr

BROKERS = (2, 3, 4)  # node ids after the one controller


def _first_offset_confluent(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"first-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                return message.offset()
        raise AssertionError("confluent-kafka consumer read nothing")
    finally:
        consumer.close()


def _first_offset_kafka_python(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None, consumer_timeout_ms=30000)
    try:
        return next(iter(consumer)).offset
    finally:
        consumer.close()


def test_delete_records_holds_on_every_replica_after_leader_changes(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, "purged", 1)
        wait_for_isr(bootstrap, "purged", 1, BROKERS)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(50):
            producer.produce("purged", value=b"v%d" % i, partition=0)
        assert producer.flush(30) == 0

        admin = AdminClient({"bootstrap.servers": bootstrap})
        (future,) = admin.delete_records([TopicPartition("purged", 0, 10)]).values()
        assert future.result().low_watermark == 10
        # The answer waits for the in-sync followers' log start (the low
        # watermark, as Kafka): with one of them stopped it times out, and
        # answers once that follower is back and has followed.
        leader = partition_state(bootstrap, "purged")[0][0]
        stopped = next(b for b in BROKERS if b != leader)
        cluster.kill(stopped, signal.SIGSTOP)
        try:
            (held,) = admin.delete_records([TopicPartition("purged", 0, 20)], operation_timeout=1).values()
            with pytest.raises(KafkaException, match="REQUEST_TIMED_OUT"):
                held.result()
        finally:
            cluster.kill(stopped, signal.SIGCONT)
        (future,) = admin.delete_records([TopicPartition("purged", 0, 20)]).values()
        assert future.result().low_watermark == 20
        # Past the high watermark: refused, nothing moves.
        (beyond,) = admin.delete_records([TopicPartition("purged", 0, 1000)]).values()
        with pytest.raises(KafkaException, match="OFFSET_OUT_OF_RANGE"):
            beyond.result()
        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            assert kp.delete_records({KpTopicPartition("purged", 0): 10})[
                KpTopicPartition("purged", 0)]["low_watermark"] == 20  # never moves back
            sizes = {entry["broker"]: entry for entry in kp.describe_log_dirs()}
            assert set(sizes) == set(BROKERS)
            for entry in sizes.values():
                (log_dir,) = entry["log_dirs"]
                (topic,) = [t for t in log_dir["topics"] if t["name"] == "purged"]
                assert topic["partitions"][0]["partition_size"] > 0
            # One log dir per broker: to its own dir is a no-op; a dir not
            # in log.dirs is refused.
            (here,) = sizes[2]["log_dirs"]
            moved = kp.alter_replica_log_dirs({TopicPartitionReplica("purged", 0, 2): here["log_dir"]})
            assert list(moved.values()) == [NoError]
            moved = kp.alter_replica_log_dirs({TopicPartitionReplica("purged", 0, 2): "/elsewhere"})
            assert list(moved.values()) == [LogDirNotFoundError]
        finally:
            kp.close()
        assert _first_offset_confluent(bootstrap, "purged") == 20

        # No wait: the answer came once every in-sync replica had the deletion.
        first_leader = partition_state(bootstrap, "purged")[0][0]
        cluster.kill(first_leader)
        wait_for("a second leader", lambda: partition_state(bootstrap, "purged")[0][0] not in (first_leader, -1))
        assert _first_offset_kafka_python(bootstrap, "purged") == 20

        second_leader = partition_state(bootstrap, "purged")[0][0]
        cluster.kill(second_leader)
        wait_for("the third replica leading",
                 lambda: partition_state(bootstrap, "purged")[0][0] not in (first_leader, second_leader, -1))
        assert _first_offset_confluent(bootstrap, "purged") == 20

        # DescribeCluster v2 lists the fenced brokers when asked; UnregisterBroker
        # sent to a broker's listener removes one for good.
        wait_for("both killed brokers fenced",
                 lambda: _cluster_v2(bootstrap) == {first_leader: True, second_leader: True,
                                                    _third(first_leader, second_leader): False})
        assert _unregister(bootstrap, first_leader) == 0
        wait_for("the unregistered broker gone",
                 lambda: _cluster_v2(bootstrap) == {second_leader: True,
                                                    _third(first_leader, second_leader): False})
        assert _unregister(bootstrap, 99) == ErrorCode.broker_id_not_registered

        # DescribeQuorum sent to a broker is answered by the active controller, as Kafka's brokers
        # forward it (kafka-metadata-quorum --bootstrap-server, kafka-python's describe_metadata_quorum).
        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            quorum = kp.describe_metadata_quorum()
        finally:
            kp.close()
        (topic,) = quorum["topics"]
        (partition,) = topic["partitions"]
        assert partition["leader_id"] == 1
        assert [v["replica_id"] for v in partition["current_voters"]] == [1]
        assert partition["high_watermark"] > 0


def _third(*gone: int) -> int:
    (left,) = set(BROKERS) - set(gone)
    return left


def _call(bootstrap: str, request):
    import trio

    from common.wire import ConnectionFailedError, open_connection

    async def call():
        for address in bootstrap.split(","):
            host, _, port = address.rpartition(":")
            try:
                async with open_connection(host, int(port), client_id="test") as conn:
                    return await conn.request(request)
            except (OSError, ConnectionFailedError):
                continue  # a killed broker
        raise AssertionError(f"no broker of {bootstrap} answered")

    return trio.run(call)


def _cluster_v2(bootstrap: str) -> dict[int, bool]:
    from kio.schema.describe_cluster.v2 import request as dc

    answer = _call(bootstrap, dc.DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                        include_fenced_brokers=True))
    return {b.broker_id: b.is_fenced for b in answer.brokers}


def _unregister(bootstrap: str, broker_id: int) -> int:
    from kio.schema.unregister_broker.v0 import request as ub

    return _call(bootstrap, ub.UnregisterBrokerRequest(broker_id=broker_id)).error_code
