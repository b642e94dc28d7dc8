"""The `eio` nemesis on a real broker: a disk that fails its writes.

A broker started with `raftka.test.disk.fault.file` whose switch file says
`eio` answers produce with KAFKA_STORAGE_ERROR, says why in its log, keeps
running and serves reads; once the file is emptied it takes writes again,
and after a restart every acknowledged record is there and no refused one.
"""

from __future__ import annotations

import time
from pathlib import Path

from chaos.nemesis import DISK_FAULT_FILE, DiskFaults
from cluster.launcher import LocalCluster
from storage.fault_fs import DISK_FAULT_FILE_KEY

TOPIC = "t"


def settle() -> None:
    time.sleep(0.3)  # the switch file is read again at most every 100 ms


def produce(bootstrap: str, values: list[bytes], **config) -> dict[bytes, object]:
    """Send `values` round-robin to both partitions: value -> None (acknowledged) or the KafkaError."""
    from confluent_kafka import Producer

    outcome: dict[bytes, object] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, **config})
    for i, value in enumerate(values):
        producer.produce(TOPIC, value, partition=i % 2,
                         on_delivery=lambda err, msg, value=value: outcome.__setitem__(value, err))
    producer.flush(30)
    assert len(outcome) == len(values), "some sends had no outcome within 30 s"
    return outcome


def read_all(bootstrap: str, expect: int) -> list[bytes]:
    """Every record of both partitions from the start (at least `expect`, or what came in 20 s)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(2)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_a_broker_whose_disk_fails_writes_refuses_them_serves_reads_and_recovers(tmp_path: Path) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=1,
                           broker_overrides={DISK_FAULT_FILE_KEY: DISK_FAULT_FILE})
    broker = cluster.brokers[0]
    faults = DiskFaults({broker.node_id: broker.log_dir})
    try:
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
        before = [b"before-%d" % i for i in range(20)]
        assert all(err is None for err in produce(cluster.bootstrap, before).values())

        faults.set(broker.node_id, "eio")
        settle()
        refused = [b"refused-%d" % i for i in range(6)]
        # No retries: the error the broker answers reaches the delivery report as it is.
        outcome = produce(cluster.bootstrap, refused, retries=0, **{"enable.idempotence": False})
        assert {err.code() for err in outcome.values()} == {KafkaError.KAFKA_STORAGE_ERROR}
        assert broker.is_running(), "the broker must keep running on a disk that fails writes"
        assert sorted(read_all(cluster.bootstrap, len(before))) == sorted(before), "reads are served during the fault"
        log = broker.output_since_start()
        assert f"[node {broker.node_id}] ERROR broker.replica_manager: {TOPIC}-" in log and "append failed" in log
        assert "Input/output error" in log and "Fix:" in log and broker.log_dir.name in log

        faults.heal()
        settle()
        after = [b"after-%d" % i for i in range(20)]
        assert all(err is None for err in produce(cluster.bootstrap, after).values())

        cluster.stop(broker.node_id)
        cluster.start(broker.node_id)
        cluster.wait_ready(timeout_s=60)
        assert sorted(read_all(cluster.bootstrap, len(before) + len(after))) == sorted(before + after)
    finally:
        cluster.stop_all(timeout_s=20)
