"""AlterReplicaLogDirs moves a replica between a broker's log dirs while it
takes appends (Kafka's future replica): real processes (one controller, one
broker with two `log.dirs`), real clients (confluent-kafka to produce and
consume, kafka-python for the log-dir admin calls)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartitionReplica
from kafka.errors import NoError

from cluster import LocalCluster
from cluster_replication_testing import wait_for
from common.meta_properties import format_log_dir

TOPIC = "moving"
VALUE = b"x" * 1000


def _dirs_of(kp: KafkaAdminClient) -> dict[str, dict]:
    """log dir -> {(partition, is_future): (size, offset lag)} of the topic, from DescribeLogDirs."""
    (entry,) = kp.describe_log_dirs()
    return {d["log_dir"]: {(p["partition_index"], p["is_future_key"]): (p["partition_size"], p["offset_lag"])
                           for t in d["topics"] if t["name"] == TOPIC for p in t["partitions"]}
            for d in entry["log_dirs"]}


def test_a_replica_moves_to_another_log_dir_while_it_takes_appends_and_every_record_stays_readable(tmp_path):
    broker_dir = tmp_path / "cluster" / "broker-2"
    second = tmp_path / "second-dir"
    with LocalCluster(tmp_path / "cluster", controllers=1, brokers=1,
                      broker_overrides={"log.dirs": f"{broker_dir},{second}",
                                        "log.segment.bytes": str(256 * 1024),
                                        # About 2 s for the 2 MB: time to see the future replica.
                                        "replica.alter.log.dirs.io.max.bytes.per.second": str(1024 * 1024)},
                      ) as cluster:
        second.mkdir()
        format_log_dir(second, cluster.cluster_id, 2)
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)], operation_timeout=30)[TOPIC].result(60)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        sent = 0
        for _ in range(2000):  # 2 MB
            producer.produce(TOPIC, value=VALUE + b"%d" % sent, partition=0)
            sent += 1
        assert producer.flush(60) == 0

        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            dirs = _dirs_of(kp)
            (source,) = [d for d, parts in dirs.items() if (0, False) in parts]
            (target,) = [d for d in dirs if d != source]

            # Keep producing during the move.
            stop = threading.Event()
            during = [0]

            def keep_producing() -> None:
                p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
                while not stop.is_set():
                    p.produce(TOPIC, value=b"during-%d" % during[0], partition=0)
                    during[0] += 1
                    p.poll(0)
                    time.sleep(0.002)
                assert p.flush(60) == 0

            writer = threading.Thread(target=keep_producing)
            writer.start()
            try:
                time.sleep(0.5)
                # The move through the command (AlterReplicaLogDirs), the describes through kafka-python.
                said = subprocess.run([sys.executable, "-m", "raftka.cli", "log-dirs", "move", "-b", bootstrap,
                                       "--broker", "2", "--topic", TOPIC, "--partition", "0", "--log-dir", target],
                                      capture_output=True, text=True, timeout=60)
                assert said.returncode == 0, said.stderr
                assert f"moving {TOPIC}-0 on broker 2 to {target}" in said.stdout
                # The future replica shows under the target dir until it is swapped in.
                seen_future = False

                def done() -> bool:
                    nonlocal seen_future
                    now = _dirs_of(kp)
                    seen_future |= (0, True) in now.get(target, {})
                    return (0, False) in now.get(target, {}) and not now.get(source)

                wait_for("the replica in the target dir", done, 60)
                assert seen_future, "DescribeLogDirs never showed the future replica during the move"
                time.sleep(0.5)
            finally:
                stop.set()
                writer.join(60)
            assert during[0] > 0
            # Where it is now, a move there is a no-op (kafka-python's AlterReplicaLogDirs).
            moved = kp.alter_replica_log_dirs({TopicPartitionReplica(TOPIC, 0, 2): target})
            assert list(moved.values()) == [NoError], moved
        finally:
            kp.close()

        # The old dir holds nothing of the partition; the new one holds it all.
        assert not [n for n in os.listdir(source) if n.startswith(f"{TOPIC}-0")]
        assert os.path.isdir(os.path.join(target, f"{TOPIC}-0"))
        total = sent + during[0]
        # No group: one broker cannot host __consumer_offsets at its default replication factor.
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "after-move",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        offsets = []
        deadline = time.monotonic() + 60
        while len(offsets) < total and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                offsets.append(message.offset())
        consumer.close()
        assert offsets == list(range(total))
        # Appends go to the moved log.
        producer.produce(TOPIC, value=b"after", partition=0)
        assert producer.flush(30) == 0


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="soak: set RAFTKA_SOAK=1 (about a minute)")
def test_a_move_survives_a_pause_and_a_kill_of_its_broker(tmp_path):
    """A paused broker's move goes on when it resumes; a killed broker's
    move is dropped at its restart (the copy removed), the replica whole
    where it was, and a new move then completes."""
    broker_dir = tmp_path / "cluster" / "broker-2"
    second = tmp_path / "second-dir"
    with LocalCluster(tmp_path / "cluster", controllers=1, brokers=1,
                      broker_overrides={"log.dirs": f"{broker_dir},{second}",
                                        "log.segment.bytes": str(256 * 1024),
                                        # About 8 s for the 2 MB: time to pause and kill mid-move.
                                        "replica.alter.log.dirs.io.max.bytes.per.second": str(256 * 1024)},
                      ) as cluster:
        second.mkdir()
        format_log_dir(second, cluster.cluster_id, 2)
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)], operation_timeout=30)[TOPIC].result(60)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(2000):
            producer.produce(TOPIC, value=VALUE + b"%d" % i, partition=0)
        assert producer.flush(60) == 0
        total = 2000

        def move(to: str) -> None:
            kp = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                assert list(kp.alter_replica_log_dirs({TopicPartitionReplica(TOPIC, 0, 2): to}).values()) == [NoError]
            finally:
                kp.close()

        def where() -> dict[str, list[str]]:
            return {str(d): sorted(n for n in os.listdir(d) if n.startswith(f"{TOPIC}-0")) for d in (broker_dir, second)}

        def all_readable() -> None:
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False})
            consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
            offsets = []
            deadline = time.monotonic() + 60
            while len(offsets) < total and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    offsets.append(message.offset())
            consumer.close()
            assert offsets == list(range(total))

        # Killed mid-move: the replica stays whole in its dir, the copy goes at the restart.
        move(str(second))
        time.sleep(2)
        assert any(n.endswith("-future") for n in where()[str(second)]), where()
        cluster.kill(2)
        cluster.start(2)
        cluster.wait_ready(120)
        assert where() == {str(broker_dir): [f"{TOPIC}-0"], str(second): []}
        all_readable()

        # Paused mid-move: it goes on after, with appends meanwhile.
        move(str(second))
        time.sleep(2)
        cluster.kill(2, signal.SIGSTOP)
        time.sleep(2)
        cluster.kill(2, signal.SIGCONT)
        for i in range(100):
            producer.produce(TOPIC, value=b"after-pause-%d" % i, partition=0)
        assert producer.flush(60) == 0
        total += 100
        wait_for("the move to finish", lambda: where() == {str(broker_dir): [], str(second): [f"{TOPIC}-0"]}, 60)
        all_readable()
