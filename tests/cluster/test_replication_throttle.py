"""Replication throttles on real processes (KIP-73): a reassignment adds a
replica to a partition holding 5 MB; under a 500 kB/s throttle
(`leader.replication.throttled.rate`/`follower.replication.throttled.rate`
on the brokers, the partition named in the topic's
`leader.replication.throttled.replicas`/`follower.replication.throttled.replicas`)
the copy takes about 10 s, an unthrottled partition's copy much less, and
lifting the throttle at runtime lets a throttled copy finish at once."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType
from kafka import KafkaAdminClient, TopicPartition

from cluster import LocalCluster
from cluster_replication_testing import SETTINGS, wait_for
from cluster_testing import run_cli

TOPIC = "copied"
DATA = 5_000_000
RATE = 500_000


def _fill(bootstrap: str, partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 200_000})
    value = b"z" * 10_000
    for _ in range(DATA // len(value)):
        while True:
            try:
                producer.produce(TOPIC, value, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _isr(bootstrap: str, partition: int) -> tuple[int, ...]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=20)
    return tuple(sorted(meta.topics[TOPIC].partitions[partition].isrs))


def _configs(admin: AdminClient, kind: ResourceType, name: str, op: AlterConfigOpType, **values) -> None:
    resource = ConfigResource(kind, name, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=op) for k, v in values.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _every_broker(bootstrap: str, rate: int | None) -> None:
    """Set (None: delete) both throttle rates on every broker (the default
    broker resource "", which confluent-kafka does not name)."""
    import trio
    from kio.schema.incremental_alter_configs.v1 import request as iac

    from common.wire import open_connection

    async def main():
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        async with open_connection(host, int(port)) as conn:
            answer = await conn.request(iac.IncrementalAlterConfigsRequest(resources=(iac.AlterConfigsResource(
                resource_type=4, resource_name="", configs=tuple(
                    iac.AlterableConfig(name=k, config_operation=0 if rate else 1, value=str(rate) if rate else None)
                    for k in ("leader.replication.throttled.rate", "follower.replication.throttled.rate"))),),
                validate_only=False))
        assert all(r.error_code == 0 for r in answer.responses), answer
    trio.run(main)


def _wait_copied(bootstrap: str, partition: int, replicas) -> None:
    wait_for(f"partition {partition} copied", lambda: _isr(bootstrap, partition) == tuple(sorted(replicas)),
             timeout_s=90)


def _move(bootstrap: str, kp: KafkaAdminClient, partition: int, replicas: tuple[int, int]) -> float:
    """Seconds from the reassignment's start until both replicas are in the ISR."""
    started = time.monotonic()
    assert kp.alter_partition_reassignments({TopicPartition(TOPIC, partition): list(replicas)}) == \
        {TopicPartition(TOPIC, partition): None}
    _wait_copied(bootstrap, partition, replicas)
    return time.monotonic() - started


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="about 90 s on real processes: set RAFTKA_SOAK=1")
def test_a_throttled_reassignment_copies_at_the_throttled_rate(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=1, brokers=2, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        a, b = sorted(admin.list_topics(timeout=20).brokers)
        admin.create_topics([NewTopic(TOPIC, num_partitions=3, replica_assignment=[[a], [a], [b]])])[TOPIC].result(60)
        for p in range(3):
            _fill(bootstrap, p)
        kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            free = _move(bootstrap, kp, 1, (a, b))
            # Partition 0 throttled while copied from a to b.
            _configs(admin, ResourceType.TOPIC, TOPIC, AlterConfigOpType.SET,
                     leader_replication_throttled_replicas=f"0:{a}", follower_replication_throttled_replicas=f"0:{b}")
            _every_broker(bootstrap, RATE)
            held = _move(bootstrap, kp, 0, (a, b))
        finally:
            kp.close()
        # Partition 2 from b to a, throttled by `raftka partitions reassign
        # --throttle` (b's leader sensor is fresh), lifted after 2 s.
        done = run_cli("partitions", "reassign", "--bootstrap-server", bootstrap, "--topic", TOPIC,
                       "--partition", "2", "--replicas", f"{b},{a}", "--throttle", str(RATE))
        assert done.returncode == 0, done.stderr
        started = time.monotonic()
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, TOPIC)])
        configs = next(iter(described.values())).result(30)
        assert configs["leader.replication.throttled.replicas"].value == f"0:{a},2:{b}"
        assert configs["follower.replication.throttled.replicas"].value == f"0:{b},2:{a}"
        time.sleep(2.0)
        assert _isr(bootstrap, 2) != tuple(sorted((a, b))), "copied before the throttle was lifted"
        _every_broker(bootstrap, None)
        lifted_at = time.monotonic()
        _wait_copied(bootstrap, 2, (a, b))
        after_lift = time.monotonic() - lifted_at
        print(f"5 MB copied: unthrottled {free:.1f} s, at {RATE} B/s {held:.1f} s; "
              f"throttled then lifted after {lifted_at - started:.1f} s: done {after_lift:.1f} s later")
        assert held >= 8.0, held
        assert free < held / 2, (free, held)
        assert after_lift < 3.0, after_lift
        removed = run_cli("partitions", "remove-throttle", "--bootstrap-server", bootstrap, "--topic", TOPIC)
        assert removed.returncode == 0, removed.stderr
        configs = next(iter(admin.describe_configs([ConfigResource(ResourceType.TOPIC, TOPIC)]).values())).result(30)
        assert configs["leader.replication.throttled.replicas"].value in ("", None)


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="about 90 s on real processes: set RAFTKA_SOAK=1")
def test_a_throttled_copy_survives_its_follower_killed_and_paused_and_its_leader_paused(tmp_path) -> None:
    """Faults during a throttled copy: the new replica is paused (SIGSTOP 2 s),
    then killed and started again, then the leader is paused 1.5 s. The copy
    still finishes at about the throttled rate, and every replica holds the
    same bytes."""
    import signal

    from cluster_replication_testing import wait_for_identical_replicas

    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        a, b, c = sorted(admin.list_topics(timeout=20).brokers)
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[a, b]])])[TOPIC].result(60)
        _fill(bootstrap, 0)
        started = time.monotonic()
        done = run_cli("partitions", "reassign", "--bootstrap-server", bootstrap, "--topic", TOPIC,
                       "--partition", "0", "--replicas", f"{a},{b},{c}", "--throttle", str(RATE))
        assert done.returncode == 0, done.stderr
        time.sleep(1.0)
        cluster.kill(c, signal.SIGSTOP)
        time.sleep(2.0)
        cluster.kill(c, signal.SIGCONT)
        time.sleep(1.0)
        cluster.kill(c)
        cluster.start(c)
        time.sleep(1.0)
        leader = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=20).topics[TOPIC] \
            .partitions[0].leader
        cluster.kill(leader, signal.SIGSTOP)
        time.sleep(1.5)
        cluster.kill(leader, signal.SIGCONT)
        _wait_copied(bootstrap, 0, (a, b, c))
        took = time.monotonic() - started
        print(f"5 MB copied at {RATE} B/s through a pause and a kill of the new replica and a leader pause: "
              f"{took:.1f} s")
        assert took >= 8.0, took
        wait_for_identical_replicas(cluster, TOPIC, 1, (a, b, c))
        removed = run_cli("partitions", "remove-throttle", "--bootstrap-server", bootstrap, "--topic", TOPIC)
        assert removed.returncode == 0, removed.stderr
