"""kafka-python 3.0 against a live broker: admin create, produce with
acks=1 and acks=all (idempotent producer: InitProducerId), consume with
assign(), compression, ListOffsets."""

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.codec import has_lz4, has_snappy, has_zstd

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


def create_topics(bootstrap, names):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names])
        return sorted(t for t in admin.list_topics() if t in names)
    finally:
        admin.close()


def produce(bootstrap, topic, records, **config):
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **config)
    try:
        futures = [producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                 timestamp_ms=r.timestamp_ms) for r in records]
        producer.flush(30)
        return [f.get(10) for f in futures]
    finally:
        producer.close(5)


def consume(bootstrap, topic, count):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        out = []
        for _ in range(200):
            for tp, messages in consumer.poll(timeout_ms=200).items():
                out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                        for m in messages]
            if len(out) >= count:
                break
        begin = consumer.beginning_offsets(tps)
        end = consumer.end_offsets(tps)
        probe = BASE_TIMESTAMP_MS + count // 2
        by_time = consumer.offsets_for_times({tp: probe for tp in tps})
        beyond = consumer.offsets_for_times({tps[0]: BASE_TIMESTAMP_MS + 10 * count})
        return out, begin, end, by_time, beyond
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", [1, "all"])
async def test_round_trip_and_list_offsets(nursery, tmp_path, acks):
    rb = await start_broker(nursery, tmp_path)
    topic = f"kp-acks-{acks}"
    assert await in_thread(create_topics, rb.bootstrap, [topic]) == [topic]
    records = workload()
    metadata = await in_thread(produce, rb.bootstrap, topic, records, acks=acks)
    assert {m.partition for m in metadata} == set(range(PARTITIONS))
    consumed, begin, end, by_time, beyond = await in_thread(consume, rb.bootstrap, topic, len(records))
    by_partition = check_round_trip(records, consumed, PARTITIONS)
    for m in metadata:
        assert int(dict(by_partition[m.partition][m.offset].headers)["seq"]) >= 0
    tps = {p: TopicPartition(topic, p) for p in range(PARTITIONS)}
    assert {tp.partition: o for tp, o in begin.items()} == {p: 0 for p in range(PARTITIONS)}
    assert {tp.partition: o for tp, o in end.items()} == {p: len(r) for p, r in by_partition.items()}
    probe = BASE_TIMESTAMP_MS + len(records) // 2
    for p, records_p in by_partition.items():
        expected = expected_offset_for_time(records_p, probe)
        got = by_time[tps[p]]
        assert (got.offset if got else None) == expected
        if got:
            assert got.timestamp == records_p[expected].timestamp_ms
    assert beyond[tps[0]] is None
    if acks == "all":
        # kafka-python is idempotent by default with acks=all: its
        # InitProducerId took an id from a controller-allocated block.
        assert "AllocateProducerIdsRequest" in rb.controller.requests_seen


CODECS = {"gzip": lambda: True, "snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}
MISSING_PACKAGE = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


@pytest.mark.parametrize("codec", sorted(CODECS))
async def test_compressed_batches_round_trip(nursery, tmp_path, codec):
    if not CODECS[codec]():
        pytest.skip(f"kafka-python needs the {MISSING_PACKAGE[codec]} package for {codec}")
    rb = await start_broker(nursery, tmp_path)
    topic = f"kp-{codec}"
    await rb.create_topic(topic, PARTITIONS)
    records = workload(1500, value_bytes=200)
    await in_thread(produce, rb.bootstrap, topic, records, acks=1, compression_type=codec)
    consumed, *_ = await in_thread(consume, rb.bootstrap, topic, len(records))
    check_round_trip(records, consumed, PARTITIONS)
