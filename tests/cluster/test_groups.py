"""Consumer groups as users run them: real member processes of each client
(confluent-kafka, kafka-python, aiokafka) against a `raftka dev` node.

One scenario per client, on a 6-partition topic a producer keeps writing
to (acks=all) the whole time:

1. three members join one group: their assignments are disjoint and cover
   every partition;
2. one member closes (SIGTERM, so it sends LeaveGroup): the other two
   rebalance and cover every partition between them;
3. one member is killed with SIGKILL: its partitions move to the last
   member, and not before `session.timeout.ms` (minus one heartbeat
   interval) has passed, since nobody told the coordinator;
4. the last member closes; the committed offsets read back through the
   client's API are the newest commits the members saw acknowledged;
5. a new member of the group starts from exactly those offsets and reads
   to the end: no acknowledged record was never consumed, and a record
   was read twice only if its first reader had not committed past it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster_group_testing import (
    BackgroundProducer,
    DevNode,
    Member,
    check_history,
    last_commits,
    wait_for_split,
    wait_until_consumed,
)

PARTITIONS = 6
SESSION_MS = 6000
HEARTBEAT_MS = 500
CLIENT_NAMES = ["confluent-kafka", "kafka-python", "aiokafka"]


@pytest.fixture(scope="module")
def dev_node(tmp_path_factory):
    node = DevNode(tmp_path_factory.mktemp("groups") / "dev", "offsets.topic.num.partitions=5",
                   "group.initial.rebalance.delay.ms=1000")
    try:
        yield node
    finally:
        node.stop()


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)[topic].result(60)


def committed_offsets(client: str, bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, read with `client`'s own API."""
    if client == "confluent-kafka":
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
            return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        finally:
            consumer.close()
    if client == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        try:
            found = {p: consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
            return {p: o for p, o in found.items() if o is not None}
        finally:
            consumer.close()
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def read() -> dict[int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            found = {p: await consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
            return {p: o for p, o in found.items() if o is not None}
        finally:
            await consumer.stop()

    return asyncio.run(read())


def first_reads(member: Member) -> dict[int, int]:
    out: dict[int, int] = {}
    for _t, p, o, _v in member.consumed():
        out.setdefault(p, o)
    return out


@pytest.mark.parametrize("client", CLIENT_NAMES)
def test_group_splits_rebalances_survives_kill_and_resumes_from_commits(dev_node, client) -> None:
    bootstrap = dev_node.bootstrap
    topic, group = f"orders-{client}", f"billing-{client}"
    create_topic(bootstrap, topic)
    producer = BackgroundProducer(bootstrap, topic, PARTITIONS)
    members = [Member(client, bootstrap, group, topic, f"{client}-{i}", SESSION_MS, HEARTBEAT_MS) for i in range(3)]
    everyone = list(members)
    try:
        a, b, c = members
        wait_for_split([a, b, c], PARTITIONS)

        c.terminate()  # LeaveGroup
        wait_for_split([a, b], PARTITIONS)

        before_kill = b.assigned
        killed_at = time.monotonic()
        b.kill()
        wait_for_split([a], PARTITIONS, timeout_s=SESSION_MS / 1000 + 45, steady_s=0.5)
        moved_after_s = time.monotonic() - killed_at
        assert moved_after_s >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.5, (
            f"{sorted(before_kill)} moved {moved_after_s:.1f} s after SIGKILL, before the session could expire")

        a.terminate()
        committed = committed_offsets(client, bootstrap, group, topic)
        assert committed == last_commits(everyone)

        resumer = Member(client, bootstrap, group, topic, f"{client}-resumer", SESSION_MS, HEARTBEAT_MS)
        everyone.append(resumer)
        wait_for_split([resumer], PARTITIONS)
        time.sleep(0.5)
        acked = producer.stop()
        wait_until_consumed(resumer, producer.end_offsets())
        resumer.terminate()
        starts = first_reads(resumer)
        assert {p: starts[p] for p in committed} == committed, "the new member did not resume at the commits"
        check_history(everyone, acked)
    finally:
        for m in everyone:
            m.kill()
        producer._stop.set()
