"""Each client library of the suite negotiates the newest versions it knows
against raftka and round-trips records with them. The broker records the
version of every request it serves, so the test sees what each client
really sent: for Produce and Fetch, exactly the newer of what the client
knows and what raftka offers (librdkafka: Fetch v16 by topic id, with
leader endpoints)."""

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


PRODUCE, FETCH = 0, 1
#: The newest Produce and Fetch versions each library sends, from its
#: source: librdkafka 2.16 (rdkafka_request.c), kafka-python 3.0
#: (`max_version` in producer/sender.py and consumer/fetcher.py), aiokafka
#: 0.14 (the newest request classes it ships).
CLIENT_NEWEST = {
    "confluent": {PRODUCE: 10, FETCH: 16},
    "kafka-python": {PRODUCE: 9, FETCH: 12},
    "aiokafka": {PRODUCE: 7, FETCH: 11},
}


def assert_newest_shared(client: str, used: dict[int, int], offered: dict[int, int]) -> None:
    """The client sent Produce and Fetch at the newest version both it and raftka know."""
    for api_key in (PRODUCE, FETCH):
        assert used[api_key] == min(CLIENT_NEWEST[client][api_key], offered[api_key]), (client, used, offered)


async def round_trip(tmp_path, client) -> tuple[dict[int, int], dict[int, int]]:
    """The highest version of each API `client` used, after checking it
    read back what it wrote; and the highest version raftka offers of each."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic(TOPIC)
        seen = record_versions(running.broker)
        offered = {key: hi for key, _lo, hi in running.broker.apis.items()}
        consumed = await in_thread(client, running.bootstrap)
        assert consumed == RECORDS
        running.stop()
    return {key: max(versions) for key, versions in seen.items()}, offered


async def test_librdkafka_fetches_by_topic_id(tmp_path):
    used, offered = await round_trip(tmp_path, confluent_round_trip)
    # librdkafka 2.16: Fetch v16 (topic ids, leader endpoints), Metadata v13, Produce v10.
    assert_newest_shared("confluent", used, offered)
    assert used[3] >= 13, used


async def test_kafka_python_negotiates_its_newest(tmp_path):
    used, offered = await round_trip(tmp_path, kafka_python_round_trip)
    # kafka-python 3.0: Metadata v13, ListOffsets v9 (it sends no Fetch past v12, no Produce past v9).
    assert_newest_shared("kafka-python", used, offered)
    assert used[3] >= 13 and used[2] >= 9, used


async def test_aiokafka_negotiates_its_newest(tmp_path):
    used, offered = await round_trip(tmp_path, aiokafka_round_trip)
    # aiokafka 0.14 knows no newer versions than these: Produce v7, Fetch v11, Metadata v5.
    assert_newest_shared("aiokafka", used, offered)
    assert used[3] >= 5, used
