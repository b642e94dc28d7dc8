"""Real consumer groups (kafka-python, confluent-kafka/librdkafka, aiokafka)
against a real broker's group coordinator, in process.

The broker serves FindCoordinator and the group APIs itself
(`broker.shell.coordinator_runtime`): `__consumer_offsets` is created on first
use, each of its partitions led here gets a shard loaded from its log, and
every group write is a record in that log, answered once committed. What is
checked is what users see: three consumers of one group split a topic's
partitions disjointly and completely, commits are read back, a consumer
that leaves hands its partitions on, and the partition's records alone
rebuild the committed offsets (what a coordinator that takes over does)."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import trio

from broker.core.group import OFFSETS_TOPIC_NAME, GroupCoordinatorConfig, GroupCoordinatorShard
from broker_testing import in_thread, start_broker
from storage.batch import iter_batch_headers, iter_records

PARTITIONS = 6
OFFSETS_PARTITIONS = 3
GROUP_CONFIG = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=300,
                                      offsets_topic_num_partitions=OFFSETS_PARTITIONS,
                                      offsets_topic_replication_factor=1)


async def group_broker(nursery, tmp_path):
    running = await start_broker(nursery, tmp_path, group_coordinator=GROUP_CONFIG)
    await running.create_topic("t", partitions=PARTITIONS)
    return running


def shard_of(running, group_id: str) -> GroupCoordinatorShard:
    (shard,) = [r.shard for r in running.broker.coordinator.shards.values() if group_id in r.shard.groups]
    return shard


def replayed(running, partition: int) -> GroupCoordinatorShard:
    """A fresh shard loaded from the partition's log, as a new coordinator would."""
    log = running.partition(OFFSETS_TOPIC_NAME, partition).log
    rebuilt = GroupCoordinatorShard(partition, GROUP_CONFIG, random.Random(0))
    data = log.read_bytes(log.log_start_offset, 1 << 30)
    for position, header in iter_batch_headers(data):
        for record in iter_records(data, position):
            rebuilt.replay(record.key, record.value)
    return rebuilt


def wait_for_split(assignments: dict[str, frozenset], names: list[str], timeout_s: float = 60.0) -> dict:
    """Until the members' partitions are disjoint and cover the topic (and
    stay so for a moment)."""
    deadline = time.monotonic() + timeout_s
    stable_since = None
    while time.monotonic() < deadline:
        snapshot = {n: assignments.get(n, frozenset()) for n in names}
        parts = [p for s in snapshot.values() for p in s]
        good = all(snapshot.values()) and sorted(parts) == list(range(PARTITIONS))
        if good:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since > 1.5:
                return snapshot
        else:
            stable_since = None
        time.sleep(0.05)
    raise AssertionError(f"the group never split the partitions: {assignments}")


# --- kafka-python -------------------------------------------------------------------------


def kafka_python_member(bootstrap: str, name: str, stop: threading.Event, assignments: dict) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer("t", bootstrap_servers=bootstrap, group_id="kp", client_id=name,
                             enable_auto_commit=False, session_timeout_ms=10_000, heartbeat_interval_ms=300,
                             max_poll_interval_ms=20_000)
    try:
        while not stop.is_set():
            consumer.poll(timeout_ms=100)
            assignments[name] = frozenset(tp.partition for tp in consumer.assignment())
        consumer.commit({TopicPartition("t", p): OffsetAndMetadata(100 + p, "", -1) for p in assignments[name]})
    finally:
        consumer.close()


def kafka_python_committed(bootstrap: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="kp", enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition("t", p)) for p in range(PARTITIONS)}
    finally:
        consumer.close()


async def test_kafka_python_group_splits_partitions_and_commits(nursery, tmp_path) -> None:
    running = await group_broker(nursery, tmp_path)
    names = ["kp-0", "kp-1", "kp-2"]
    stop = threading.Event()
    assignments: dict[str, frozenset] = {}
    async with trio.open_nursery() as members:
        for name in names:
            members.start_soon(in_thread, kafka_python_member, running.bootstrap, name, stop, assignments)
        split = await in_thread(wait_for_split, assignments, names)
        stop.set()
    assert sorted(p for s in split.values() for p in s) == list(range(PARTITIONS))
    committed = await in_thread(kafka_python_committed, running.bootstrap)
    assert committed == {p: 100 + p for p in range(PARTITIONS)}
    # A coordinator that takes over replays the same offsets from the log.
    shard = shard_of(running, "kp")
    assert replayed(running, shard.partition).offsets.of_group("kp") == shard.offsets.of_group("kp")


# --- confluent-kafka (librdkafka) ------------------------------------------------------------


def confluent_member(bootstrap: str, name: str, stop: threading.Event, assignments: dict,
                     static: bool = False) -> None:
    from confluent_kafka import Consumer, TopicPartition

    config = {"bootstrap.servers": bootstrap, "group.id": "ck", "client.id": name, "enable.auto.commit": False,
              "session.timeout.ms": 10_000, "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"}
    if static:
        config["group.instance.id"] = name
    consumer = Consumer(config)
    consumer.subscribe(["t"])
    try:
        while not stop.is_set():
            consumer.poll(0.1)
            assignments[name] = frozenset(tp.partition for tp in consumer.assignment())
        consumer.commit(offsets=[TopicPartition("t", p, 200 + p) for p in assignments[name]], asynchronous=False)
    finally:
        consumer.close()


def confluent_committed(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ck", "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition("t", p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
async def test_librdkafka_group_splits_partitions_commits_and_rebalances_on_leave(nursery, tmp_path, static) -> None:
    running = await group_broker(nursery, tmp_path)
    names = ["ck-0", "ck-1", "ck-2"]
    stop = {n: threading.Event() for n in names}
    assignments: dict[str, frozenset] = {}
    async with trio.open_nursery() as members:
        for name in names:
            members.start_soon(in_thread, confluent_member, running.bootstrap, name, stop[name], assignments, static)
        await in_thread(wait_for_split, assignments, names)
        if not static:
            # A dynamic member that closes sends LeaveGroup: the others take over.
            stop["ck-2"].set()
            await trio.sleep(0.5)
            await in_thread(wait_for_split, assignments, names[:2])
        for event in stop.values():
            event.set()
    committed = await in_thread(confluent_committed, running.bootstrap)
    assert committed == {p: 200 + p for p in range(PARTITIONS)}
    group = shard_of(running, "ck").groups["ck"]
    if static:
        # KIP-345: static members do not leave on close; they keep their
        # places (until their sessions expire).
        assert sorted(m.group_instance_id for m in group.members.values()) == names
    else:
        assert not group.members and group.state.value == "Empty"


# --- aiokafka ------------------------------------------------------------------------------------


def aiokafka_members(bootstrap: str, names: list[str], assignments: dict, stop: threading.Event) -> None:
    from aiokafka import AIOKafkaConsumer

    async def member(name: str) -> None:
        consumer = AIOKafkaConsumer("t", bootstrap_servers=bootstrap, group_id="ak", client_id=name,
                                    enable_auto_commit=False, session_timeout_ms=10_000,
                                    heartbeat_interval_ms=300)
        await consumer.start()
        try:
            while not stop.is_set():
                await consumer.getmany(timeout_ms=100)
                assignments[name] = frozenset(tp.partition for tp in consumer.assignment())
            from aiokafka.structs import TopicPartition
            await consumer.commit({TopicPartition("t", p): 300 + p for p in assignments[name]})
        finally:
            await consumer.stop()

    async def main() -> None:
        await asyncio.gather(*(member(n) for n in names))

    asyncio.run(main())


async def test_aiokafka_group_splits_partitions_and_commits(nursery, tmp_path) -> None:
    running = await group_broker(nursery, tmp_path)
    names = ["ak-0", "ak-1", "ak-2"]
    stop = threading.Event()
    assignments: dict[str, frozenset] = {}
    async with trio.open_nursery() as members:
        members.start_soon(in_thread, aiokafka_members, running.bootstrap, names, assignments, stop)
        await in_thread(wait_for_split, assignments, names)
        stop.set()
    shard = shard_of(running, "ak")
    offsets = {p: o.offset for (topic, p), o in shard.offsets.of_group("ak").items()}
    assert offsets == {p: 300 + p for p in range(PARTITIONS)}
    assert replayed(running, shard.partition).offsets.of_group("ak") == shard.offsets.of_group("ak")
