"""Each client library of the suite negotiates the newest versions it knows
against raftka and round-trips records with them. The broker records the
version of every request it serves, so the test sees what each client
really sent (librdkafka: Fetch v17 by topic id)."""

from __future__ import annotations

import asyncio

import trio
from broker_testing import in_thread, start_broker

TOPIC = "k4"
RECORDS = [(b"k%d" % i, b"value-%d" % i) for i in range(50)]


def record_versions(broker) -> dict[int, set[int]]:
    """api_key -> versions served from now on, by wrapping each handler."""
    seen: dict[int, set[int]] = {}

    def wrap(handler):
        def recording(b, ctx, request):
            seen.setdefault(request.header.api_key, set()).add(request.header.api_version)
            return handler(b, ctx, request)
        return recording
    broker._handlers = {key: wrap(handler) for key, handler in broker._handlers.items()}
    return seen


def confluent_round_trip(bootstrap: str) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in RECORDS:
        producer.produce(TOPIC, key=key, value=value, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "k4-rdkafka", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        out = []
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                out.append((message.key(), message.value()))
            if len(out) >= len(RECORDS):
                break
        return out
    finally:
        consumer.close()


def kafka_python_round_trip(bootstrap: str) -> list[tuple[bytes, bytes]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for key, value in RECORDS:
        producer.send(TOPIC, key=key, value=value, partition=0)
    producer.flush(20)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek_to_beginning()
        out = []
        for _ in range(100):
            for messages in consumer.poll(timeout_ms=200).values():
                out += [(m.key, m.value) for m in messages]
            if len(out) >= len(RECORDS):
                break
        return out
    finally:
        consumer.close()


def aiokafka_round_trip(bootstrap: str) -> list[tuple[bytes, bytes]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for key, value in RECORDS:
                await producer.send_and_wait(TOPIC, key=key, value=value, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(TOPIC, 0)])
            await consumer.seek_to_beginning()
            out = []
            for _ in range(100):
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    out += [(m.key, m.value) for m in messages]
                if len(out) >= len(RECORDS):
                    break
            return out
        finally:
            await consumer.stop()
    return asyncio.run(run())


async def round_trip(tmp_path, client) -> dict[int, int]:
    """The highest version of each API `client` used, after checking it read back what it wrote."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic(TOPIC)
        seen = record_versions(running.broker)
        consumed = await in_thread(client, running.bootstrap)
        assert consumed == RECORDS
        running.stop()
    return {key: max(versions) for key, versions in seen.items()}


async def test_librdkafka_fetches_by_topic_id(tmp_path):
    used = await round_trip(tmp_path, confluent_round_trip)
    # librdkafka 2.16: Fetch v16 (topic ids, leader endpoints), Metadata v13, Produce v10.
    assert used[1] >= 13 and used[3] >= 13 and used[0] >= 10, used


async def test_kafka_python_negotiates_its_newest(tmp_path):
    used = await round_trip(tmp_path, kafka_python_round_trip)
    # kafka-python 3.0: Metadata v13, ListOffsets v9 (it knows no Fetch past v12).
    assert used[3] >= 13 and used[2] >= 9 and used[1] >= 12, used


async def test_aiokafka_negotiates_its_newest(tmp_path):
    used = await round_trip(tmp_path, aiokafka_round_trip)
    # aiokafka 0.14 knows no newer versions than these: Produce v7, Fetch v11, Metadata v5.
    assert used[0] >= 7 and used[1] >= 11 and used[3] >= 5, used
