"""Lag of a flow, read from the clusters (no running mirror needed).

Records behind: the source partition's high watermark minus the offset the
mirror committed for it (in the source's group, or exactly once with the
copy's transactions on the target). Seconds behind: how long ago the
source appended the first record the mirror has not committed yet (0 when
nothing is behind).
"""

from __future__ import annotations

import dataclasses
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from mirror.config import FlowConfig
from mirror.policy import mirrored_topics
from mirror.errors import MirrorError, _quiet
from mirror.topics import ADMIN_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class PartitionStatus:
    topic: str
    target_topic: str
    partition: int
    high_watermark: int
    committed: int  # -1: the mirror has not committed anything here yet
    records_behind: int
    seconds_behind: float


def flow_status(flow: FlowConfig) -> list[PartitionStatus]:
    admin = AdminClient({"bootstrap.servers": flow.source_bootstrap, "logger": _quiet("status-admin"),
                         **flow.source_client("admin")})
    try:
        metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise MirrorError(f"cluster {flow.source} at {flow.source_bootstrap} does not answer: "
                          f"{exc.args[0].str()}") from None
    mapping = mirrored_topics([t for t, m in metadata.topics.items() if m.error is None], flow.source, flow.target,
                              flow.policy, flow.topics)
    # Exactly once, the positions commit on the target with the copy's transactions
    # (the source group holds none); at least once, in the source group.
    offsets_admin = admin
    if flow.exactly_once:
        offsets_admin = AdminClient({"bootstrap.servers": flow.target_bootstrap, "logger": _quiet("status-admin"),
                                     **flow.target_client("admin")})
    try:
        result = offsets_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(flow.mirror_group)],
                                                   request_timeout=ADMIN_TIMEOUT_S)[flow.mirror_group].result(
                                                       ADMIN_TIMEOUT_S + 5)
        committed = {(p.topic, p.partition): p.offset for p in result.topic_partitions}
    except KafkaException:
        committed = {}
    consumer = Consumer({"bootstrap.servers": flow.source_bootstrap, "group.id": f"{flow.mirror_group}-status",
                         "enable.auto.commit": False, "logger": _quiet("status-consumer"),
                         **flow.source_client("consumer")})
    now_ms = time.time() * 1000
    rows = []
    try:
        for topic in sorted(mapping):
            for partition in sorted(metadata.topics[topic].partitions):
                tp = TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=ADMIN_TIMEOUT_S)
                done = committed.get((topic, partition), -1)
                start = done if done >= 0 else low
                behind = max(0, high - start)
                seconds = 0.0
                if behind:
                    consumer.assign([TopicPartition(topic, partition, start)])
                    msg = consumer.poll(5)
                    if msg is not None and msg.error() is None and msg.timestamp()[1] > 0:
                        seconds = max(0.0, (now_ms - msg.timestamp()[1]) / 1000)
                rows.append(PartitionStatus(topic, mapping[topic], partition, high, done, behind, seconds))
    finally:
        consumer.close()
    return rows


def by_topic(rows: list[PartitionStatus]) -> dict[str, tuple[str, int, float]]:
    """source topic -> (target topic, records behind, seconds behind of its worst partition)."""
    out: dict[str, tuple[str, int, float]] = {}
    for r in rows:
        target, records, seconds = out.get(r.topic, (r.target_topic, 0, 0.0))
        out[r.topic] = (target, records + r.records_behind, max(seconds, r.seconds_behind))
    return out
