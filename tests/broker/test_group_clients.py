"""Real consumer groups (kafka-python, confluent-kafka/librdkafka, aiokafka)
against the pure coordinator, served by a real broker.

The broker's own wiring of the coordinator (over `__consumer_offsets`
partitions) belongs to the integrator; here a small test shell stands in:
it declares the group APIs and FindCoordinator on a live `Broker`, keeps
one shard per `__consumer_offsets` partition, treats every append as
committed at once, parks requests until a later step answers them and
ticks the shards. What is checked is what users see: three consumers of
one group split a topic's partitions disjointly and completely, commits
are read back, a consumer that leaves hands its partitions on."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from datetime import timedelta

import pytest
import trio
from kio.schema.errors import ErrorCode

from broker.group import (
    GROUP_API_VERSIONS,
    GroupCoordinatorConfig,
    GroupCoordinatorShard,
    RequestContext,
    is_multi_group,
    merge_responses,
    split_by_partition,
)
from broker.group.responses import build, response_module
from broker_testing import in_thread, start_broker

PARTITIONS = 6
OFFSETS_PARTITIONS = 3
FIND_COORDINATOR = 10


class GroupShell:
    """A stand-in for the broker's coordinator wiring (see broker.group)."""

    def __init__(self, running) -> None:
        self.running = running
        self.config = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=300,
                                             offsets_topic_num_partitions=OFFSETS_PARTITIONS)
        now = self.now_ms()
        self.shards = {}
        for p in range(OFFSETS_PARTITIONS):
            shard = GroupCoordinatorShard(p, self.config, random.Random(p))
            shard.on_loaded(now)
            self.shards[p] = shard
        self.log: dict[int, list] = {p: [] for p in self.shards}
        self.waiting: dict[int, trio.Event] = {}
        self.answers: dict[int, object] = {}
        self.tokens = itertools.count(1)

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    def install(self) -> None:
        broker = self.running.broker
        for api_key, (lo, hi) in GROUP_API_VERSIONS.items():
            broker.apis.declare(api_key, lo, hi)
            broker._handlers[api_key] = self.handle
        broker.apis.declare(FIND_COORDINATOR, 0, 4)
        broker._handlers[FIND_COORDINATOR] = self.find_coordinator

    async def find_coordinator(self, broker, ctx, request):
        body = request.body
        mod = response_module(body)
        me = dict(node_id=broker.node_id, host="127.0.0.1", port=self.running.port)
        if hasattr(body, "coordinator_keys"):
            return mod.FindCoordinatorResponse(throttle_time=timedelta(0), coordinators=tuple(
                build(mod.Coordinator, key=k, error_code=ErrorCode.none, error_message=None, **me)
                for k in body.coordinator_keys))
        return build(mod.FindCoordinatorResponse, throttle_time=timedelta(0), error_code=ErrorCode.none,
                     error_message=None, **me)

    async def handle(self, broker, ctx, request):
        body = request.body
        client_id = request.header.client_id or ""
        if type(body).__name__ == "ListGroupsRequest":
            parts = {p: body for p in self.shards}
        else:
            parts = split_by_partition(body, OFFSETS_PARTITIONS)
        answers = [await self.one(p, part, client_id) for p, part in parts.items()]
        return merge_responses(body, answers) if is_multi_group(body) else answers[0]

    async def one(self, partition: int, request, client_id: str):
        token = next(self.tokens)
        done = self.waiting[token] = trio.Event()
        self.absorb(partition, self.shards[partition].handle(
            RequestContext(token, client_id, "/127.0.0.1"), request, self.now_ms()))
        await done.wait()
        return self.answers.pop(token)

    def absorb(self, partition: int, result) -> None:
        self.log[partition].extend(result.records)  # "committed" at once
        for token, response in result.responses:
            self.answers[token] = response
            self.waiting.pop(token).set()

    async def tick_forever(self) -> None:
        while True:
            await trio.sleep(0.05)
            for p, shard in self.shards.items():
                self.absorb(p, shard.tick(self.now_ms()))


async def group_broker(nursery, tmp_path):
    running = await start_broker(nursery, tmp_path)
    shell = GroupShell(running)
    shell.install()
    nursery.start_soon(shell.tick_forever)
    await running.create_topic("t", partitions=PARTITIONS)
    return running, shell


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
    running, shell = await group_broker(nursery, tmp_path)
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
    p = next(p for p, s in shell.shards.items() if "kp" in s.groups)
    rebuilt = GroupCoordinatorShard(p, shell.config, random.Random(0))
    for record in shell.log[p]:
        rebuilt.replay(record.key, record.value)
    assert rebuilt.offsets.of_group("kp") == shell.shards[p].offsets.of_group("kp")


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
    running, shell = await group_broker(nursery, tmp_path)
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
    group = next(s.groups["ck"] for s in shell.shards.values() if "ck" in s.groups)
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
    running, shell = await group_broker(nursery, tmp_path)
    names = ["ak-0", "ak-1", "ak-2"]
    stop = threading.Event()
    assignments: dict[str, frozenset] = {}
    async with trio.open_nursery() as members:
        members.start_soon(in_thread, aiokafka_members, running.bootstrap, names, assignments, stop)
        await in_thread(wait_for_split, assignments, names)
        stop.set()
    offsets = {}
    for shard in shell.shards.values():
        for (topic, p), o in shard.offsets.of_group("ak").items():
            offsets[p] = o.offset
    assert offsets == {p: 300 + p for p in range(PARTITIONS)}
