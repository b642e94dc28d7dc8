"""Helpers of the replication tests: a cluster with small timeouts, ISR
from Metadata, a background idempotent producer, a full read-back check."""

from __future__ import annotations

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from wait_testing import wait_for  # also imported from here by the replication tests

SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "2000",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "3",
}


def create_topic(bootstrap: str, topic: str, partitions: int, min_isr: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, partitions, 3, config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([new], operation_timeout=30)[topic].result(60)


def partition_state(bootstrap: str, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """partition -> (leader, ISR) as Metadata reports them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=20).topics[topic]
    return {p.id: (p.leader, tuple(sorted(p.isrs))) for p in meta.partitions.values()}


def wait_for_isr(bootstrap: str, topic: str, partitions: int, isr: tuple[int, ...], timeout_s: float = 60):
    seen = {}

    def whole():
        seen["state"] = state = partition_state(bootstrap, topic)
        return len(state) == partitions and all(i == isr for _, i in state.values()) and state

    try:
        return wait_for(f"ISR {isr} on every partition of {topic}", whole, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; (leader, ISR) by partition: {seen.get('state')}") from None


class BackgroundProducer:
    """An idempotent (acks=all) producer writing numbered values round-robin
    over the partitions, `rate_per_s` records a second or, with None, as
    fast as it can; remembers what was acknowledged and what failed."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, rate_per_s: float | None = 200,
                 extra: dict | None = None) -> None:
        self.topic, self.partitions = topic, partitions
        self.acked: list[tuple[int, int, bytes]] = []
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 5, "message.timeout.ms": 60000, **(extra or {})})
        # Full speed: serve delivery reports between records without
        # waiting, and wait only while librdkafka's queue is full.
        self._interval = 1 / rate_per_s if rate_per_s else 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def _run(self) -> None:
        while not self._stop.is_set():
            value = f"v{self.sent:010d}".encode()  # zero-padded: byte order is produce order
            try:
                self._producer.produce(self.topic, value=value, partition=self.sent % self.partitions,
                                       on_delivery=self._on_delivery)
                self.sent += 1
            except BufferError:
                self._producer.poll(0.05)
            self._producer.poll(self._interval)

    def acked_count(self) -> int:
        return len(self.acked)

    def stop(self, flush_s: float = 90) -> None:
        self._stop.set()
        self._thread.join(10)
        remaining = self._producer.flush(flush_s)
        assert remaining == 0, f"{remaining} records never answered"


def read_all(bootstrap: str, topic: str, partitions: int, at_least: int, timeout_s: float = 60):
    """Every record of `topic`: partition -> [(offset, value)] in read order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "replication-checker",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        eof: set[int] = set()
        while time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        eof.add(m.partition())
                        continue
                    raise KafkaException(m.error())
                out[m.partition()].append((m.offset(), m.value()))
            if len(eof) == partitions and sum(len(v) for v in out.values()) >= at_least:
                break
        return out
    finally:
        consumer.close()


def check_no_loss(acked: list[tuple[int, int, bytes]], read: dict[int, list[tuple[int, bytes]]]) -> None:
    """Every acknowledged record is present exactly once, at the offset it was
    acknowledged at; per partition the values keep their produce order and
    offsets only grow."""
    for p, records in read.items():
        offsets = [o for o, _ in records]
        assert offsets == sorted(set(offsets)), f"partition {p}: offsets repeat or go back"
        values = [v for _, v in records]
        assert len(values) == len(set(values)), f"partition {p}: a value appears twice"
        assert values == sorted(values), f"partition {p}: values out of produce order"
    at = {(p, o): v for p, records in read.items() for o, v in records}
    missing = [(p, o, v) for p, o, v in acked if at.get((p, o)) != v]
    assert not missing, f"{len(missing)} acknowledged records lost or moved, e.g. {missing[:5]}"


def wait_for_identical_replicas(cluster, topic: str, partitions: int, brokers, timeout_s: float = 30) -> None:
    """Every replica of each partition holds byte-for-byte the same batches
    (segments concatenated): followers truncated what diverged and caught up."""

    def log_bytes(broker: int, partition: int) -> bytes:
        directory = cluster.node(broker).log_dir / f"{topic}-{partition}"
        return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))

    def identical():
        sizes = {}
        for p in range(partitions):
            copies = {b: log_bytes(b, p) for b in brokers}
            sizes[p] = {b: len(c) for b, c in copies.items()}
            if len(set(copies.values())) != 1 or not copies[brokers[0]]:
                return False
        return sizes

    wait_for(f"identical replicas of {topic}", identical, timeout_s)
