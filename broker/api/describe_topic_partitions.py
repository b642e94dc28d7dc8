"""DescribeTopicPartitions (KIP-966): topics and their partitions, a page at a time.

Theory of operation
-------------------
Metadata answers every partition of every topic asked in one response; a
cluster with hundreds of thousands of partitions makes that answer huge.
DescribeTopicPartitions answers at most `response_partition_limit`
partitions (and never more than `MAX_PARTITIONS_PER_RESPONSE`, Kafka's
`max.request.partition.size.limit` default) and a `next_cursor` (topic,
partition) to ask from next, as Kafka's `describeTopicResponse` does:

- the topics are the ones asked, or every topic when none is asked, in
  name order, from the cursor's topic on (its partitions from the cursor's
  index, the next topics' from 0);
- a page ends inside a topic: the cursor names that topic and its next
  partition; a page ends exactly at a topic's end with more topics left:
  the cursor names the next topic, partition 0;
- an asked topic that does not exist is answered UNKNOWN_TOPIC_OR_PARTITION
  (INVALID_TOPIC_EXCEPTION for an illegal name), with no partitions; in an
  all-topics answer there are none such;
- a cursor naming a topic not in the asked list is INVALID_REQUEST for
  every topic asked, as Kafka refuses it.

Partitions are as Metadata gives them: LEADER_NOT_AVAILABLE and leader -1
when the leader is not live, offline replicas those not on live brokers or
in a log dir their broker reports offline.
raftka has no eligible leader replicas (KIP-966's ELR), so those lists are
empty. `page` is the pure part: (name, start, count) per topic and the cursor.
"""

from __future__ import annotations

import datetime
import uuid

from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
from broker.api.metadata import INTERNAL_TOPICS, live_brokers, topic_name_error
from broker.api.metadata_codec import NO_OPERATIONS

#: Kafka's `max.request.partition.size.limit` default: the most partitions one answer holds.
MAX_PARTITIONS_PER_RESPONSE = 2000
_NO_THROTTLE = datetime.timedelta(0)
_ZERO_ID = uuid.UUID(int=0)


def page(names: list[str], partition_counts: dict[str, int], limit: int,
         cursor: tuple[str, int] | None) -> tuple[list[tuple[str, int, int]], tuple[str, int] | None]:
    """Which partitions one answer holds: ([(topic, first partition, how
    many)], next cursor or None). `names` in name order; a name missing from
    `partition_counts` is a topic that does not exist (listed with 0
    partitions, using none of the limit)."""
    out = []
    remaining = limit
    for name in names:
        if cursor is not None and name < cursor[0]:
            continue
        if remaining <= 0:
            return out, (name, 0)
        start = cursor[1] if cursor is not None and name == cursor[0] else 0
        count = partition_counts.get(name)
        if count is None:
            out.append((name, 0, 0))
            continue
        start = max(start, 0)
        taken = max(0, min(count - start, remaining))
        out.append((name, start, taken))
        if start + taken < count:
            return out, (name, start + taken)
        remaining -= taken
    return out, None


async def handle_describe_topic_partitions(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    image = broker.image
    cursor = (body.cursor.topic_name, body.cursor.partition_index) if body.cursor is not None else None
    asked = sorted({t.name for t in body.topics})
    if cursor is not None and asked and cursor[0] not in asked:
        # Kafka: the cursor's topic must be one of the topics asked.
        return build(mod.DescribeTopicPartitionsResponse, throttle_time=_NO_THROTTLE, topics=tuple(
            build(mod.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.invalid_request, name=name,
                  topic_id=_ZERO_ID, is_internal=name in INTERNAL_TOPICS, partitions=(),
                  topic_authorized_operations=NO_OPERATIONS)
            for name in asked), next_cursor=None)
    names = asked or sorted(image.topic_ids_by_name)
    counts = {}
    for name in names:
        topic = image.topic(name)
        if topic is not None:
            counts[name] = len(topic.partitions)
    limit = min(body.response_partition_limit, MAX_PARTITIONS_PER_RESPONSE)
    chosen, next_cursor = page(names, counts, limit, cursor)
    live = {b[0] for b in live_brokers(broker, image)}
    offline_dirs = image.offline_log_dirs()
    topics = []
    for name, start, count in chosen:
        topic = image.topic(name)
        if topic is None:
            error = ErrorCode.invalid_topic_exception if topic_name_error(name) else \
                ErrorCode.unknown_topic_or_partition
            topics.append(build(mod.DescribeTopicPartitionsResponseTopic, error_code=error, name=name,
                                topic_id=_ZERO_ID, is_internal=name in INTERNAL_TOPICS, partitions=(),
                                topic_authorized_operations=NO_OPERATIONS))
            continue
        partitions = []
        for index in range(start, start + count):
            p = topic.partitions.get(index)
            if p is None:
                continue
            leader_live = p.leader in live
            partitions.append(build(
                mod.DescribeTopicPartitionsResponsePartition,
                error_code=ErrorCode.none if leader_live else ErrorCode.leader_not_available,
                partition_index=index, leader_id=p.leader if leader_live else -1, leader_epoch=p.leader_epoch,
                replica_nodes=tuple(p.replicas), isr_nodes=tuple(p.isr), eligible_leader_replicas=(),
                last_known_elr=(), offline_replicas=tuple(p.offline_replicas(live, offline_dirs))))
        topics.append(build(mod.DescribeTopicPartitionsResponseTopic, error_code=ErrorCode.none, name=name,
                            topic_id=topic.topic_id, is_internal=name in INTERNAL_TOPICS,
                            partitions=tuple(partitions), topic_authorized_operations=NO_OPERATIONS))
    return build(mod.DescribeTopicPartitionsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics),
                 next_cursor=None if next_cursor is None else build(
                     mod.Cursor, topic_name=next_cursor[0], partition_index=next_cursor[1]))
