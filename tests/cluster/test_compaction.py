"""Log compaction on a live node, against a model of the writes.

A `raftka dev` node runs its cleaner with a short back-off and a low dirty
ratio. A seeded random sequence of puts and deletes (tombstones) over a
few keys goes to a compacted topic with tiny segments; the model is the
list of what was acknowledged at which offset. A consumer then reads the
partition from the start, again and again, and every read must be a valid
history of the model:

- offsets are kept: each record read is the one acknowledged at its
  offset, and offsets only go up;
- the newest value of every key is kept, so replaying the read gives the
  model's final table (tombstones delete);
- once the cleaner has been over the closed segments, they hold only the
  newest record of each key among them (the active segment is never
  cleaned), the tombstones included;
- tombstones stay at least `delete.retention.ms` and are gone soon after.

`__consumer_offsets` is compacted too: many commits of one group leave a
few records, and the node restarted replays them into the last commits.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster_group_testing import DevNode

TOPIC = "accounts"
KEYS = 15
DELETED_KEYS = 4
WRITES = 1500
DELETE_RETENTION_MS = 8000
SEED = 20240607
NODE_SETTINGS = ("log.cleaner.backoff.ms=200", "log.cleaner.min.cleanable.ratio=0.01",
                 "offsets.topic.num.partitions=1", "offsets.topic.segment.bytes=2048")


def produce_model(bootstrap: str, rng: random.Random) -> list[tuple[int, bytes, bytes | None]]:
    """Random puts and tombstones; (offset, key, value) as acknowledged."""
    acked: list[tuple[int, bytes, bytes | None]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    ops = []
    for i in range(WRITES):
        ops.append((b"k%02d" % rng.randrange(KEYS), None if rng.random() < 0.15 else b"v%05d" % i))
    # Then delete a few keys for good, and write on to other keys until the
    # tombstones are in closed segments (the cleaner's to take).
    ops += [(b"k%02d" % k, None) for k in range(DELETED_KEYS)]
    ops += [(b"k%02d" % rng.randrange(DELETED_KEYS, KEYS), b"w%05d" % i) for i in range(200)]
    for i, (key, value) in enumerate(ops):
        producer.produce(TOPIC, key=key, value=value, partition=0,
                         on_delivery=lambda err, msg: acked.append((msg.offset(), msg.key(), msg.value())))
        if i % 100 == 0:
            producer.poll(0.01)
    assert producer.flush(60) == 0
    assert len(acked) == len(ops)
    return sorted(acked)


def read_all(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        out = []
        while True:
            m = consumer.poll(10)
            assert m is not None, "no end of partition within 10 s"
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return out
            out.append((m.offset(), m.key(), m.value()))
    finally:
        consumer.close()


def active_segment_base(data_dir: Path) -> int:
    return max(int(p.stem) for p in (data_dir / "data" / f"{TOPIC}-0").glob("*.log"))


def check_valid_history(read, model) -> None:
    by_offset = {o: (k, v) for o, k, v in model}
    offsets = [o for o, _k, _v in read]
    assert offsets == sorted(set(offsets)), "offsets went backwards or repeated"
    for o, k, v in read:
        assert by_offset.get(o) == (k, v), f"offset {o} holds {(k, v)}, acknowledged as {by_offset.get(o)}"
    assert table(read) == table(model), "replaying the partition does not give the newest value of every key"


def table(records) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for _o, k, v in records:
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def compacted_below(model, end: int, tombstones: bool) -> list[tuple[int, bytes, bytes | None]]:
    """What a cleaner that has passed over [start, end) leaves there."""
    newest = {}
    for o, k, v in model:
        if o < end:
            newest[k] = (o, k, v)
    return sorted(r for r in newest.values() if tombstones or r[2] is not None)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


def test_compaction_keeps_a_valid_history_of_the_newest_values(tmp_path) -> None:
    data_dir = tmp_path / "dev"
    node = DevNode(data_dir, *NODE_SETTINGS)
    try:
        bootstrap = node.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "2048",
            "delete.retention.ms": str(DELETE_RETENTION_MS)})], operation_timeout=30)[TOPIC].result(60)
        rng = random.Random(SEED)
        written_at = time.monotonic()
        model = produce_model(bootstrap, rng)
        end = active_segment_base(data_dir)
        assert end > model[len(model) // 2][0], "the writes should span many segments"

        def cleaned_keeping_tombstones():
            read = read_all(bootstrap)
            check_valid_history(read, model)
            below = [r for r in read if r[0] < end]
            return below == compacted_below(model, end, tombstones=True) and read

        read = wait_for(cleaned_keeping_tombstones, 30, "the closed segments were not compacted")
        assert [r for r in read if r[0] >= end] == [r for r in model if r[0] >= end], "the active segment changed"
        kept_tombstones = {k for _o, k, v in compacted_below(model, end, tombstones=True) if v is None}
        assert kept_tombstones >= {b"k%02d" % k for k in range(DELETED_KEYS)}
        assert time.monotonic() - written_at < DELETE_RETENTION_MS / 1000, "too slow to see tombstones expire"

        def tombstones_gone():
            read = read_all(bootstrap)
            check_valid_history(read, model)
            return [r for r in read if r[0] < end] == compacted_below(model, end, tombstones=False)

        wait_for(tombstones_gone, DELETE_RETENTION_MS / 1000 + 30, "tombstones past delete.retention.ms stayed")
        assert time.monotonic() - written_at >= DELETE_RETENTION_MS / 1000, "tombstones went before their time"
    finally:
        node.stop()


def test_consumer_offsets_is_compacted_and_replays_to_the_last_commits(tmp_path) -> None:
    data_dir = tmp_path / "dev"
    node = DevNode(data_dir, *NODE_SETTINGS)
    try:
        bootstrap = node.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1)], operation_timeout=30)[TOPIC].result(60)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "committer", "enable.auto.commit": False})
        for i in range(300):
            consumer.commit(offsets=[TopicPartition(TOPIC, 0, i), TopicPartition(TOPIC, 1, 2 * i)],
                            asynchronous=False)
        consumer.close()
        offsets_dir = data_dir / "data" / "__consumer_offsets-0"

        def records_left() -> int:
            reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-reader",
                               "enable.auto.commit": False, "enable.partition.eof": True})
            try:
                reader.assign([TopicPartition("__consumer_offsets", 0, OFFSET_BEGINNING)])
                count = 0
                while True:
                    m = reader.poll(10)
                    assert m is not None
                    if m.error() is not None:
                        return count
                    count += 1
            finally:
                reader.close()

        assert len(list(offsets_dir.glob("*.log"))) > 3
        wait_for(lambda: records_left() < 100, 30, "__consumer_offsets was not compacted")
    finally:
        assert node.stop() == 0
    node = DevNode(data_dir, *NODE_SETTINGS)
    try:
        reader = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "committer", "enable.auto.commit": False})
        found = reader.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=30)
        reader.close()
        assert [tp.offset for tp in found] == [299, 598]
    finally:
        node.stop()
