"""aiokafka 0.14 against a live broker: admin create, produce with acks=1
and acks=all, consume with assign(), every codec, ListOffsets. aiokafka
runs on asyncio, in a worker thread of its own."""

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from broker_testing import (
    BASE_TIMESTAMP_MS,
    Consumed,
    check_round_trip,
    expected_offset_for_time,
    in_thread,
    start_broker,
    workload,
)

PARTITIONS = 3


def run(coro_fn, *args, **kwargs):
    return asyncio.run(coro_fn(*args, **kwargs))


async def create_topic(bootstrap, name):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1)])
        return await admin.list_topics()
    finally:
        await admin.close()


async def produce(bootstrap, topic, records, **config):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **config)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                       timestamp_ms=r.timestamp_ms) for r in records]
        return [await f for f in futures]
    finally:
        await producer.stop()


async def consume(bootstrap, topic, count):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        out = []
        for _ in range(200):
            batches = await consumer.getmany(timeout_ms=200)
            for messages in batches.values():
                out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                        for m in messages]
            if len(out) >= count:
                break
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        probe = BASE_TIMESTAMP_MS + count // 2
        by_time = await consumer.offsets_for_times({tp: probe for tp in tps})
        return out, begin, end, by_time
    finally:
        await consumer.stop()


@pytest.mark.parametrize("acks", [1, "all"])
async def test_round_trip_and_list_offsets(nursery, tmp_path, acks):
    rb = await start_broker(nursery, tmp_path)
    topic = f"aio-acks-{acks}"
    assert topic in await in_thread(run, create_topic, rb.bootstrap, topic)
    records = workload()
    metadata = await in_thread(run, produce, rb.bootstrap, topic, records, acks=acks)
    assert len(metadata) == len(records)
    consumed, begin, end, by_time = await in_thread(run, consume, rb.bootstrap, topic, len(records))
    by_partition = check_round_trip(records, consumed, PARTITIONS)
    assert {tp.partition: o for tp, o in begin.items()} == {p: 0 for p in range(PARTITIONS)}
    assert {tp.partition: o for tp, o in end.items()} == {p: len(r) for p, r in by_partition.items()}
    probe = BASE_TIMESTAMP_MS + len(records) // 2
    for tp, got in by_time.items():
        expected = expected_offset_for_time(by_partition[tp.partition], probe)
        assert (got.offset if got else None) == expected


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_batches_round_trip(nursery, tmp_path, codec):
    rb = await start_broker(nursery, tmp_path)
    topic = f"aio-{codec}"
    await rb.create_topic(topic, PARTITIONS)
    records = workload(1500, value_bytes=200)
    await in_thread(run, produce, rb.bootstrap, topic, records, acks=1, compression_type=codec)
    consumed, *_ = await in_thread(run, consume, rb.bootstrap, topic, len(records))
    check_round_trip(records, consumed, PARTITIONS)
