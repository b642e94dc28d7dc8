import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from broker_testing import in_thread, start_broker


async def test_kafka_python_round_trip(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t", 3)

    def produce():
        p = KafkaProducer(bootstrap_servers=rb.bootstrap, acks=1)
        futures = [p.send("t", key=b"k%d" % i, value=b"v%d" % i, partition=i % 3) for i in range(30)]
        p.flush()
        out = [f.get(5) for f in futures]
        p.close()
        return out

    metas = await in_thread(produce)
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(10))

    def consume():
        c = KafkaConsumer(bootstrap_servers=rb.bootstrap, consumer_timeout_ms=3000)
        c.assign([TopicPartition("t", i) for i in range(3)])
        c.seek_to_beginning()
        got = []
        for m in c:
            got.append(m)
            if len(got) == 30:
                break
        c.close()
        return got

    got = await in_thread(consume)
    assert len(got) == 30
