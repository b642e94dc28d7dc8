"""confluent-kafka (librdkafka) against a live broker: AdminClient create,
produce with acks=1 and acks=all, consume with assign(), every codec,
ListOffsets (watermarks, offsets_for_times)."""

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker_testing import (
    BASE_TIMESTAMP_MS,
    Consumed,
    check_round_trip,
    expected_offset_for_time,
    in_thread,
    start_broker,
)
from broker_testing import workload as make_workload

PARTITIONS = 3


def create_topic(bootstrap, name):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)],
                                  operation_timeout=10)
    futures[name].result(10)
    return sorted(admin.list_topics(timeout=10).topics)


def produce(bootstrap, topic, records, **config):
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    reports = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            reports.append((msg.partition(), msg.offset()))

    for r in records:
        while True:
            try:
                producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers),
                                 timestamp=r.timestamp_ms, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(30) == 0
    assert not errors, errors[:3]
    return reports


def consume(bootstrap, topic, count):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftka-test", "enable.auto.commit": False,
                         "enable.auto.offset.store": False})
    try:
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        consumer.assign(tps)
        out = []
        for _ in range(400):
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is not None:
                    raise KafkaException(m.error())
                out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                    m.timestamp()[1]))
            if len(out) >= count:
                break
        watermarks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5) for p in range(PARTITIONS)}
        probe = BASE_TIMESTAMP_MS + count // 2
        by_time = consumer.offsets_for_times([TopicPartition(topic, p, probe) for p in range(PARTITIONS)], timeout=5)
        return out, watermarks, {tp.partition: tp.offset for tp in by_time}
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", ["1", "all"])
async def test_round_trip_and_list_offsets(nursery, tmp_path, acks):
    rb = await start_broker(nursery, tmp_path)
    topic = f"ck-acks-{acks}"
    assert topic in await in_thread(create_topic, rb.bootstrap, topic)
    records = make_workload()
    reports = await in_thread(produce, rb.bootstrap, topic, records, acks=acks)
    assert len(reports) == len(records)
    consumed, watermarks, by_time = await in_thread(consume, rb.bootstrap, topic, len(records))
    by_partition = check_round_trip(records, consumed, PARTITIONS)
    assert watermarks == {p: (0, len(r)) for p, r in by_partition.items()}
    probe = BASE_TIMESTAMP_MS + len(records) // 2
    for p, records_p in by_partition.items():
        expected = expected_offset_for_time(records_p, probe)
        assert by_time[p] == (-1 if expected is None else expected)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_batches_round_trip(nursery, tmp_path, codec):
    rb = await start_broker(nursery, tmp_path)
    topic = f"ck-{codec}"
    await rb.create_topic(topic, PARTITIONS)
    records = make_workload(1500, value_bytes=200)
    await in_thread(produce, rb.bootstrap, topic, records, acks="1", **{"compression.type": codec})
    consumed, _, _ = await in_thread(consume, rb.bootstrap, topic, len(records))
    check_round_trip(records, consumed, PARTITIONS)
