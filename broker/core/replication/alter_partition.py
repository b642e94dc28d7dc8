"""AlterPartition on the wire: batch the leaders' proposals into one request, split the response.

Kafka's AlterPartitionManager sends every pending ISR change of the broker
in one AlterPartition request (v3: topic ids, broker epochs per ISR member,
KIP-497/841/903) and hands each partition its answer. The shell does the
sending; these two functions do the conversion, so the shell, the tests and
the simulation all speak the same kio entities the controller decides on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.alter_partition.v3 import response as ap_resp
from kio.schema.errors import ErrorCode

from broker.core.replication.messages import AlterPartitionProposal, AlterPartitionResult, TopicIdPartition


def build_request(broker_id: int, broker_epoch: int,
                  proposals: Iterable[AlterPartitionProposal]) -> ap_req.AlterPartitionRequest:
    """One AlterPartition request for `proposals` (at most one per partition)."""
    by_topic: dict = {}
    for p in proposals:
        by_topic.setdefault(p.topic_id, []).append(ap_req.PartitionData(
            partition_index=p.partition,
            leader_epoch=p.leader_epoch,
            new_isr_with_epochs=tuple(ap_req.BrokerState(broker_id=b.broker_id, broker_epoch=b.broker_epoch)
                                      for b in p.new_isr),
            partition_epoch=p.partition_epoch,
        ))
    return ap_req.AlterPartitionRequest(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        topics=tuple(ap_req.TopicData(topic_id=topic_id, partitions=tuple(parts))
                     for topic_id, parts in by_topic.items()),
    )


def split_response(response: ap_resp.AlterPartitionResponse,
                   proposals: Iterable[AlterPartitionProposal]) -> dict[TopicIdPartition, AlterPartitionResult]:
    """Each proposal's result. A top-level error (STALE_BROKER_EPOCH,
    NOT_CONTROLLER) answers every proposal; a partition the response left
    out gets UNKNOWN_SERVER_ERROR (retried)."""
    wanted = [TopicIdPartition(p.topic_id, p.partition) for p in proposals]
    if response.error_code != ErrorCode.none:
        return {key: AlterPartitionResult(response.error_code) for key in wanted}
    found: dict[TopicIdPartition, AlterPartitionResult] = {}
    for topic in response.topics:
        for p in topic.partitions:
            found[TopicIdPartition(topic.topic_id, p.partition_index)] = AlterPartitionResult(
                error=p.error_code, leader_id=p.leader_id, leader_epoch=p.leader_epoch,
                isr=tuple(p.isr), partition_epoch=p.partition_epoch)
    return {key: found.get(key, AlterPartitionResult(ErrorCode.unknown_server_error)) for key in wanted}


def failed(proposals: Iterable[AlterPartitionProposal],
           error: ErrorCode = ErrorCode.network_exception) -> Mapping[TopicIdPartition, AlterPartitionResult]:
    """Results for a request that got no answer (connection lost, timeout)."""
    return {TopicIdPartition(p.topic_id, p.partition): AlterPartitionResult(error) for p in proposals}
