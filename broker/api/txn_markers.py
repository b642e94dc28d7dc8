"""WriteTxnMarkers (API 27) and DescribeProducers (API 61): the partition side of transactions.

Theory of operation
-------------------
A transaction coordinator ends a transaction by asking the leader of each
partition in it to write a marker: a control batch of the producer id and
epoch holding one COMMIT or ABORT record (Kafka's EndTransactionMarker,
with the coordinator's epoch). For each partition named, as leader:

1. the producer state decides the marker (`ProducerState.check_marker`): a
   producer epoch older than the partition knows answers
   INVALID_PRODUCER_EPOCH, a coordinator epoch older than the last
   marker's TRANSACTION_COORDINATOR_FENCED; nothing is written then;
2. `Log.append_marker` writes it; the producer's open transaction ends
   there, an aborted one is indexed in the segment's `.txnindex`;
3. as Kafka appends markers with acks=all, the answer for the partition
   waits until the HW passes the marker (or the request times out:
   REQUEST_TIMED_OUT, and the coordinator retries).

A marker on a `__consumer_offsets` partition also tells the group
coordinator to make the producer's pending transactional offset commits
visible (COMMIT) or drop them (ABORT) (`broker.shell.coordinator_runtime`).

Markers reach followers as any batch does; the follower's log runs the
same producer-state update and index (`Log.append_as_follower`).

DescribeProducers lists, per partition led here, the producers the
producer state remembers: epoch, last sequence, last timestamp,
coordinator epoch and the first offset of the open transaction (-1: none).
"""

from __future__ import annotations

import datetime
import logging

import trio
from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
from broker.shell.hosted_partition import wait_for_acks

_log = logging.getLogger("broker.txn_markers")
_NO_THROTTLE = datetime.timedelta(0)
#: How long a marker waits for its replication (Kafka uses request.timeout.ms).
MARKER_TIMEOUT_S = 30.0
OFFSETS_TOPIC = "__consumer_offsets"


def _missing(broker, topic: str, partition: int) -> ErrorCode:
    topic_image = broker.image.topic(topic)
    if topic_image is not None and partition in topic_image.partitions:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.unknown_topic_or_partition


async def handle_write_txn_markers(broker, ctx, request):
    mod = response_module(request.header)
    now_ms = broker.clock_ms()
    # [marker index][topic index] -> {partition: error}, in request order.
    results: list[list[tuple[str, dict[int, ErrorCode]]]] = []
    waiting = []  # (marker index, topic index, partition, hp, required offset, leader epoch)
    for m, marker in enumerate(request.body.markers):
        topics = []
        for t, topic in enumerate(marker.topics):
            errors: dict[int, ErrorCode] = {}
            for partition in topic.partition_indexes:
                hp = broker.replicas.partitions.get((topic.name, partition))
                if hp is None:
                    errors[partition] = _missing(broker, topic.name, partition)
                    continue
                error, required = broker.replicas.append_marker(
                    hp, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                    marker.transaction_result, now_ms)
                errors[partition] = error
                if error is ErrorCode.none:
                    waiting.append((m, t, partition, hp, required, hp.state.leader_epoch))
                    if topic.name == OFFSETS_TOPIC:
                        broker.coordinator.on_txn_marker(partition, marker.producer_id, marker.transaction_result)
            topics.append((topic.name, errors))
        results.append(topics)
    deadline = trio.current_time() + MARKER_TIMEOUT_S
    while waiting:
        pending = []
        for entry in waiting:
            m, t, partition, hp, required, epoch = entry
            status = hp.state.acks_all_status(required, epoch)
            if status is None:
                pending.append(entry)
            elif status is not ErrorCode.none:
                results[m][t][1][partition] = status
        waiting = pending
        if not waiting or trio.current_time() >= deadline:
            break
        await wait_for_acks(((e[3], e[4], e[5]) for e in waiting), deadline)
    for m, t, partition, *_ in waiting:
        results[m][t][1][partition] = ErrorCode.request_timed_out
    markers = []
    for marker, topics in zip(request.body.markers, results):
        markers.append(mod.WritableTxnMarkerResult(
            producer_id=marker.producer_id,
            topics=tuple(mod.WritableTxnMarkerTopicResult(
                name=name,
                partitions=tuple(mod.WritableTxnMarkerPartitionResult(partition_index=p, error_code=e)
                                 for p, e in errors.items()))
                for name, errors in topics)))
    return mod.WriteTxnMarkersResponse(markers=tuple(markers))


async def handle_describe_producers(broker, ctx, request):
    mod = response_module(request.header)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for partition in topic.partition_indexes:
            hp = broker.replicas.partitions.get((topic.name, partition))
            if hp is None:
                error = _missing(broker, topic.name, partition)
            else:
                error = hp.state.fetch_error(-1)
            if error is not ErrorCode.none or hp.log.producer_state is None:
                partitions.append(build(mod.PartitionResponse, partition_index=partition, error_code=error,
                                        error_message=None, active_producers=()))
                continue
            producers = tuple(
                build(mod.ProducerState, producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                      last_sequence=e.last_seq, last_timestamp=e.last_timestamp,
                      coordinator_epoch=e.coordinator_epoch, current_txn_start_offset=e.current_txn_first_offset)
                for e in hp.log.producer_state.snapshot_entries())
            partitions.append(build(mod.PartitionResponse, partition_index=partition, error_code=ErrorCode.none,
                                    error_message=None, active_producers=producers))
        topics.append(mod.TopicResponse(name=topic.name, partitions=tuple(partitions)))
    return build(mod.DescribeProducersResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))
