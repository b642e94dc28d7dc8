"""A broker with two log dirs, one of which fails, on real processes.

Three brokers, RF 3, min.insync.replicas 2; broker 2 has two log dirs.
While an acks=all producer writes, the second dir of broker 2 fails every
write with EIO (the test-only disk fault switch, `eio <dir>`). Broker 2
takes that dir offline and keeps running; the controller moves the
leadership of the dir's partitions to the other in-sync replicas; the
producer's every record is acknowledged and every acknowledged record is
read back; DescribeLogDirs lists the dir with KAFKA_STORAGE_ERROR, the
metric counts it, and Metadata lists the dir's replicas as offline. Once both of its dirs fail, it stops cleanly and says
why; the cluster serves on without it.

With RAFTKA_SOAK=1 (a restart costs 10+ s on a loaded machine): restarted
with the disk healthy, the broker serves the dir again and its replicas
there rejoin their ISRs; restarted with the dir replaced by an empty one,
it formats the dir and copies the replicas back; then both dirs fail.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from cluster_replication_testing import (
    SETTINGS,
    BackgroundProducer,
    check_no_loss,
    create_topic,
    partition_state,
    read_all,
    wait_for,
)

from chaos.nemesis import DISK_FAULT_FILE
from cluster.launcher import LocalCluster
from common.meta_properties import format_log_dir
from storage.fault_fs import DISK_FAULT_FILE_KEY

TOPIC = "dirs"
PARTITIONS = 6
VICTIM = 2  # the first broker (node 1 is the controller)
KAFKA_STORAGE_ERROR = 56


def _two_dir_cluster(base: Path) -> tuple[LocalCluster, Path]:
    cluster = LocalCluster(base, controllers=1, brokers=3, metrics=True,
                           broker_overrides={**SETTINGS, DISK_FAULT_FILE_KEY: DISK_FAULT_FILE})
    node = cluster.node(VICTIM)
    second = base / f"broker-{VICTIM}-second-dir"
    second.mkdir(parents=True, exist_ok=True)
    format_log_dir(second, cluster.cluster_id, VICTIM)
    text = node.config_path.read_text().replace(f"log.dirs={node.log_dir}\n", f"log.dirs={node.log_dir},{second}\n")
    node.config_path.write_text(text)
    return cluster, second


def _in_dir(log_dir: Path) -> set[int]:
    return {int(p.name.rsplit("-", 1)[1]) for p in log_dir.glob(f"{TOPIC}-*") if p.is_dir()}


def _log_dirs_of(bootstrap: str, broker: int) -> dict[str, int]:
    """log dir -> its DescribeLogDirs error code, as `broker` answers."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (entry,) = [e for e in admin.describe_log_dirs(brokers=[broker]) if e["broker"] == broker]
        return {d["log_dir"]: d["error_code"] for d in entry["log_dirs"]}
    finally:
        admin.close()


def _list_offsets_errors(address: str, partitions: list[int]) -> list[int]:
    """ListOffsets (latest) for `partitions` sent to one broker, twice on one
    connection: the error code of each partition, from each answer."""
    import trio
    from kio.schema.list_offsets.v8 import request as lo

    from common.wire import open_connection

    request = lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(lo.ListOffsetsTopic(
        name=TOPIC, partitions=tuple(lo.ListOffsetsPartition(partition_index=p, timestamp=-1)
                                     for p in partitions)),))

    async def call() -> list[int]:
        host, _, port = address.rpartition(":")
        codes = []
        async with open_connection(host, int(port), client_id="test") as conn:
            for _ in range(2):  # the connection stays up after the errors
                answer = await conn.request(request)
                codes += [int(p.error_code) for t in answer.topics for p in t.partitions]
        return codes

    return trio.run(call)


def _offline_replicas(address: str) -> list[dict[int, list[int]]]:
    """partition -> its offline replicas, as Metadata v5 (the first with
    the field), Metadata v12 (flexible) and DescribeTopicPartitions answer
    on one broker (no client library exposes the field)."""
    import trio
    from kio.schema.describe_topic_partitions.v0 import request as dtp
    from kio.schema.metadata.v5 import request as md5
    from kio.schema.metadata.v12 import request as md12

    from common.wire import open_connection

    requests = (
        md5.MetadataRequest(topics=(md5.MetadataRequestTopic(name=TOPIC),), allow_auto_topic_creation=False),
        md12.MetadataRequest(topics=(md12.MetadataRequestTopic(topic_id=None, name=TOPIC),),
                             allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        dtp.DescribeTopicPartitionsRequest(topics=(dtp.TopicRequest(name=TOPIC),), response_partition_limit=100,
                                           cursor=None),
    )

    async def call() -> list[dict[int, list[int]]]:
        host, _, port = address.rpartition(":")
        async with open_connection(host, int(port), client_id="test") as conn:
            return [{int(p.partition_index): sorted(int(r) for r in p.offline_replicas)
                     for t in (await conn.request(request)).topics for p in t.partitions}
                    for request in requests]

    return trio.run(call)


def _metric(cluster: LocalCluster, broker: int, name: str) -> float:
    node = cluster.node(broker)
    with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not among broker {broker}'s metrics")


def test_a_failed_log_dir_goes_offline_its_leaders_move_and_the_broker_serves_on(tmp_path: Path) -> None:
    _fail_one_dir_then_both(tmp_path, restart_healthy=False)


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="soak: set RAFTKA_SOAK=1")
def test_a_broker_restarted_with_its_failed_dir_healthy_serves_it_again(tmp_path: Path) -> None:
    _fail_one_dir_then_both(tmp_path, restart_healthy=True)


def _fail_one_dir_then_both(tmp_path: Path, *, restart_healthy: bool) -> None:
    cluster, second = _two_dir_cluster(tmp_path / "cluster")
    victim = cluster.node(VICTIM)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, TOPIC, PARTITIONS)
        wait_for("every partition has all three replicas in sync",
                 lambda: all(len(isr) == 3 for _, isr in partition_state(bootstrap, TOPIC).values()))
        lost = wait_for("partitions in both dirs of broker 2", lambda: _in_dir(second))
        kept = set(range(PARTITIONS)) - lost
        assert kept and lost

        producer = BackgroundProducer(bootstrap, TOPIC, PARTITIONS, rate_per_s=300)
        wait_for("records acknowledged before the fault", lambda: producer.acked_count() > 100)
        (victim.log_dir / DISK_FAULT_FILE).write_text(f"eio {second}\n")

        def moved():
            state = partition_state(bootstrap, TOPIC)
            return all(state[p][0] != VICTIM and VICTIM not in state[p][1] for p in lost) and state
        state = wait_for("leadership and ISR membership of the failed dir's partitions moved", moved, 30)
        assert all(VICTIM in state[p][1] for p in kept), f"the healthy dir's replicas left their ISRs: {state}"
        assert victim.is_running(), "the broker must keep running when one of its log dirs fails"
        dirs = _log_dirs_of(bootstrap, VICTIM)
        assert dirs == {str(victim.log_dir): 0, str(second): KAFKA_STORAGE_ERROR}, dirs
        assert _metric(cluster, VICTIM, "kafka_log_logmanager_offlinelogdirectorycount") == 1
        assert "is offline" in victim.output_since_start()
        # A client with stale metadata asking the broker about them: KAFKA_STORAGE_ERROR, on a live connection.
        assert _list_offsets_errors(victim.address, sorted(lost)) == [KAFKA_STORAGE_ERROR] * (2 * len(lost))
        # Metadata lists the failed dir's replicas as offline (KIP-858), on every broker, and no other.
        offline = {p: [VICTIM] if p in lost else [] for p in range(PARTITIONS)}
        for node in (victim, cluster.node(VICTIM + 1)):
            wait_for(f"broker {node.node_id}'s Metadata lists the failed dir's replicas offline",
                     lambda node=node: _offline_replicas(node.address) == [offline] * 3, 15)

        acked_at_fault = producer.acked_count()
        wait_for("records acknowledged after the fault", lambda: producer.acked_count() > acked_at_fault + 150)
        producer.stop(flush_s=30)
        assert producer.errors == [], producer.errors[:5]
        check_no_loss(producer.acked, read_all(bootstrap, TOPIC, PARTITIONS, len(producer.acked)))

        if restart_healthy:
            (victim.log_dir / DISK_FAULT_FILE).write_text("")
            cluster.stop(VICTIM)
            cluster.start(VICTIM)
            wait_for("broker 2 back in every ISR",
                     lambda: all(len(isr) == 3 for _, isr in partition_state(bootstrap, TOPIC).values()), 60)
            assert _log_dirs_of(bootstrap, VICTIM) == {str(victim.log_dir): 0, str(second): 0}
            assert _metric(cluster, VICTIM, "kafka_log_logmanager_offlinelogdirectorycount") == 0
            assert _offline_replicas(victim.address) == [{p: [] for p in range(PARTITIONS)}] * 3
            # The disk replaced by an empty one: formatted at start, its replicas copied from their leaders.
            import shutil

            cluster.stop(VICTIM)
            shutil.rmtree(second)
            second.mkdir()
            cluster.start(VICTIM)
            wait_for("broker 2 back in every ISR on a new, empty disk",
                     lambda: all(len(isr) == 3 for _, isr in partition_state(bootstrap, TOPIC).values()), 60)
            assert _in_dir(second), "the replaced dir holds replicas again"
            assert _log_dirs_of(bootstrap, VICTIM) == {str(victim.log_dir): 0, str(second): 0}
            check_no_loss(producer.acked, read_all(bootstrap, TOPIC, PARTITIONS, len(producer.acked)))

        # Both dirs fail: nothing is left to serve from, the broker stops.
        (victim.log_dir / DISK_FAULT_FILE).write_text("eio\n")
        producer = BackgroundProducer(bootstrap, TOPIC, PARTITIONS, rate_per_s=300)
        wait_for("broker 2 stopped", lambda: not victim.is_running(), 30)
        assert "every log dir is offline" in victim.output_since_start()
        assert "Traceback" not in victim.output_since_start()
        wait_for("records acknowledged without broker 2", lambda: producer.acked_count() > 150)
        producer.stop(flush_s=30)
        assert producer.errors == [], producer.errors[:5]
    finally:
        cluster.stop_all()


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="soak: set RAFTKA_SOAK=1")
def test_a_log_dir_removed_under_a_running_broker_goes_offline(tmp_path: Path) -> None:
    """No fault switch: the second dir is deleted (as an unmount makes it
    vanish). The next checkpoint there fails with ENOENT, the dir goes
    offline, and the partitions of the first dir serve on."""
    import shutil

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=1, log_dirs_per_broker=2,
                           broker_overrides={"replica.high.watermark.checkpoint.interval.ms": "500"})
    broker = cluster.brokers[0]
    first, second = cluster.broker_log_dirs(broker, 2)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 4, 1)])[TOPIC].result(30)
        lost = wait_for("partitions in the second dir", lambda: _in_dir(second))
        kept = set(range(4)) - lost
        assert kept and lost

        def produce_to(partitions, count=20) -> dict:
            outcome: dict = {}
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                 "message.timeout.ms": 5000})
            for i in range(count):
                p = sorted(partitions)[i % len(partitions)]
                producer.produce(TOPIC, b"v%d" % i, partition=p,
                                 on_delivery=lambda err, msg, i=i: outcome.__setitem__(i, err))
            producer.flush(15)
            return outcome

        assert all(e is None for e in produce_to(range(4)).values())
        shutil.rmtree(second)
        produce_to(range(4))  # new high watermarks: the next checkpoint pass writes to the vanished dir
        wait_for("the removed dir taken offline", lambda: "is offline" in broker.output_since_start(), 30)
        assert _log_dirs_of(cluster.bootstrap, broker.node_id) == {str(first): 0, str(second): KAFKA_STORAGE_ERROR}
        assert broker.is_running()
        assert all(e is None for e in produce_to(kept).values()), "the first dir's partitions must serve on"
    finally:
        cluster.stop_all()
