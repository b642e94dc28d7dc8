"""A broker with the transaction coordinator, for tests.

Until the partition side answers WriteTxnMarkers itself, the tests of the
coordinator install `MarkerRecorder` on the broker: a stand-in for the
receiving broker's WriteTxnMarkers handler only. It records every request
the coordinator sent (over the real wire), and keeps each
marker it would write (partition, producer id and epoch, COMMIT or ABORT,
coordinator epoch); it answers NONE for a partition this broker leads.
`fail_next` makes it refuse markers (NOT_LEADER_OR_FOLLOWER), to test the
coordinator's retries.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from kio.schema.write_txn_markers.v1 import response as wtm_res

from broker.core.group import GroupCoordinatorConfig
from broker.core.txn import (
    TRANSACTION_STATE_TOPIC_NAME,
    TransactionCoordinatorConfig,
    TransactionCoordinatorShard,
)
from storage.batch import iter_batch_headers, iter_records

TXN_PARTITIONS = 3
TXN_CONFIG = TransactionCoordinatorConfig(transaction_state_log_num_partitions=TXN_PARTITIONS,
                                          transaction_state_log_replication_factor=1,
                                          transaction_state_log_min_isr=1)
GROUP_CONFIG = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0, offsets_topic_num_partitions=3,
                                      offsets_topic_replication_factor=1)


class MarkerRecorder:
    """The receiving side of WriteTxnMarkers, for the coordinator's tests."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.requests: list = []
        #: (topic, partition, producer_id, producer_epoch, commit, coordinator_epoch) per marker written.
        self.written: list[tuple[str, int, int, int, bool, int]] = []
        self.fail_next = 0
        self.logged_before: list[list] = []

    def install(self) -> MarkerRecorder:
        self.broker.apis.declare(27, 1, 1)
        self.broker._handlers[27] = self.handle
        return self

    async def handle(self, broker, ctx, request):
        body = request.body
        self.requests.append(body)
        # What `__transaction_state` held when the marker request arrived:
        # the coordinator must have logged the Prepare record before.
        self.logged_before.append(transaction_log(_Running(broker)))
        results = []
        for marker in body.markers:
            topics = []
            for topic in marker.topics:
                partitions = []
                for p in topic.partition_indexes:
                    if self.fail_next > 0:
                        self.fail_next -= 1
                        error = ErrorCode.not_leader_or_follower
                    else:
                        error = self._append(topic.name, p, marker)
                    partitions.append(wtm_res.WritableTxnMarkerPartitionResult(partition_index=p, error_code=error))
                topics.append(wtm_res.WritableTxnMarkerTopicResult(name=topic.name, partitions=tuple(partitions)))
            results.append(wtm_res.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=tuple(topics)))
        return wtm_res.WriteTxnMarkersResponse(markers=tuple(results))

    def _append(self, topic: str, partition: int, marker) -> ErrorCode:
        image = self.broker.image.topic(topic)
        if image is None or partition not in image.partitions:
            return ErrorCode.unknown_topic_or_partition
        if image.partitions[partition].leader != self.broker.node_id:
            return ErrorCode.not_leader_or_follower
        self.written.append((topic, partition, marker.producer_id, marker.producer_epoch,
                             marker.transaction_result, marker.coordinator_epoch))
        return ErrorCode.none


class _Running:
    def __init__(self, broker) -> None:
        self.broker = broker


def transaction_log(running) -> list[tuple[str, object]]:
    """(transactional id, decoded value or None) of every record in `__transaction_state`, in order."""
    from broker.core.txn.records import decode_key, decode_value
    out = []
    for p in range(TXN_PARTITIONS):
        hp = running.broker.replicas.partitions.get((TRANSACTION_STATE_TOPIC_NAME, p))
        if hp is None:
            continue
        data = hp.log.read_bytes(hp.log.log_start_offset, 1 << 30)
        for position, header in iter_batch_headers(data):
            for record in iter_records(data, position):
                out.append((decode_key(record.key), decode_value(record.value)))
    return out


def replayed(running, partition: int) -> TransactionCoordinatorShard:
    """A fresh shard loaded from the partition's log, as a new coordinator would."""
    hp = running.broker.replicas.partitions[(TRANSACTION_STATE_TOPIC_NAME, partition)]
    shard = TransactionCoordinatorShard(partition, hp.state.leader_epoch, TXN_CONFIG)
    data = hp.log.read_bytes(hp.log.log_start_offset, 1 << 30)
    for position, header in iter_batch_headers(data):
        for record in iter_records(data, position):
            shard.replay(record.key, record.value)
    shard.on_loaded(0)
    return shard


