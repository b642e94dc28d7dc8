"""Raft messages <-> Kafka protocol messages (kio entities).

The Raft core speaks flat dataclasses (`quorum.raft.messages`) about one
partition; on the wire they travel as Kafka's messages, wrapped in the
topic `__cluster_metadata`, partition 0:

    Vote v2 (52, KIP-996 pre_vote)      BeginQuorumEpoch v1 (53)
    EndQuorumEpoch v1 (54)              Fetch v17 (1; topic id, replica state)
    FetchSnapshot v1 (59)

Fetch names the topic by id: Kafka's fixed `__cluster_metadata` topic id
(Uuid 0/1, "AAAAAAAAAAAAAAAAAAAAAQ"). A request that does not name exactly
that one partition raises `RpcShapeError`; the handler answers it with
INVALID_REQUEST (`shape_error_response`).

Error codes are Kafka's numbers on both sides; a code the core has no name
for (e.g. BROKER_NOT_AVAILABLE from a newer peer) stays a plain int, which
the core treats like any other error.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kio.schema.begin_quorum_epoch.v1 import request as bqe_req
from kio.schema.begin_quorum_epoch.v1 import response as bqe_resp
from kio.schema.end_quorum_epoch.v1 import request as eqe_req
from kio.schema.end_quorum_epoch.v1 import response as eqe_resp
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.fetch.v17 import request as fetch_req
from kio.schema.fetch.v17 import response as fetch_resp
from kio.schema.fetch_snapshot.v1 import request as fs_req
from kio.schema.fetch_snapshot.v1 import response as fs_resp
from kio.schema.vote.v2 import request as vote_req
from kio.schema.vote.v2 import response as vote_resp
from kio.static.primitive import i32Timedelta

from quorum.node.metadata_log import METADATA_TOPIC
from quorum.raft.errors import ErrorCode
from quorum.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from common.errors import RaftkaError
from common.wire.codec import duration_ms

METADATA_TOPIC_ID = uuid.UUID(int=1)
VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH, FETCH, FETCH_SNAPSHOT = 52, 53, 54, 1, 59
#: api key -> the one version raftka's voters and observers speak.
RAFT_API_VERSIONS = {VOTE: 2, BEGIN_QUORUM_EPOCH: 1, END_QUORUM_EPOCH: 1, FETCH: 17, FETCH_SNAPSHOT: 1}
_NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


class RpcShapeError(RaftkaError):
    """A Raft request that does not address exactly `__cluster_metadata`
    partition 0; the peer is misconfigured or not a raftka node."""


def raft_error(code: int) -> ErrorCode | int:
    try:
        return ErrorCode(int(code))
    except ValueError:
        return int(code)


def kio_error(code: int) -> KioErrorCode:
    return KioErrorCode(int(code))


def _one(items: tuple, what: str) -> Any:
    if len(items) != 1:
        raise RpcShapeError(f"{what}: expected exactly one entry for {METADATA_TOPIC}-0, got {len(items)}")
    return items[0]


def _partition(topics: tuple, name_of: Any, what: str) -> Any:
    topic = _one(topics, what)
    name = name_of(topic)
    if name not in (METADATA_TOPIC, METADATA_TOPIC_ID):
        raise RpcShapeError(f"{what}: addressed to {name!r}, not {METADATA_TOPIC}")
    partition = _one(topic.partitions, what)
    index = getattr(partition, "partition_index", None)
    if index is None:
        index = getattr(partition, "partition", getattr(partition, "index", 0))
    if index != 0:
        raise RpcShapeError(f"{what}: addressed to partition {index}, not 0")
    return partition


# --- requests: raft -> kio ---------------------------------------------------------


def request_to_kio(message: Message) -> Any:
    if isinstance(message, FetchRequest):
        partition = fetch_req.FetchPartition(
            partition=0, current_leader_epoch=message.current_leader_epoch, fetch_offset=message.fetch_offset,
            last_fetched_epoch=message.last_fetched_epoch, log_start_offset=message.log_start_offset,
            partition_max_bytes=message.max_bytes, replica_directory_id=message.replica_directory_id)
        return fetch_req.FetchRequest(
            cluster_id=message.cluster_id,
            replica_state=fetch_req.ReplicaState(replica_id=message.replica_id, replica_epoch=-1),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=message.max_wait_ms)),
            min_bytes=0, max_bytes=message.max_bytes,
            topics=(fetch_req.FetchTopic(topic_id=METADATA_TOPIC_ID, partitions=(partition,)),),
            forgotten_topics_data=())
    if isinstance(message, VoteRequest):
        partition = vote_req.PartitionData(
            partition_index=0, replica_epoch=message.replica_epoch, replica_id=message.replica_id,
            replica_directory_id=message.replica_directory_id, voter_directory_id=message.voter_directory_id,
            last_offset_epoch=message.last_offset_epoch,
            last_offset=message.last_offset, pre_vote=message.pre_vote)
        return vote_req.VoteRequest(cluster_id=message.cluster_id, voter_id=message.voter_id, topics=(
            vote_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),))
    if isinstance(message, BeginQuorumEpochRequest):
        partition = bqe_req.PartitionData(partition_index=0, voter_directory_id=message.voter_directory_id,
                                          leader_id=message.leader_id, leader_epoch=message.leader_epoch)
        return bqe_req.BeginQuorumEpochRequest(
            cluster_id=message.cluster_id, voter_id=message.voter_id,
            topics=(bqe_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),), leader_endpoints=())
    if isinstance(message, EndQuorumEpochRequest):
        partition = eqe_req.PartitionData(
            partition_index=0, leader_id=message.leader_id, leader_epoch=message.leader_epoch,
            preferred_candidates=tuple(eqe_req.ReplicaInfo(candidate_id=c, candidate_directory_id=None)
                                       for c in message.preferred_successors))
        return eqe_req.EndQuorumEpochRequest(
            cluster_id=message.cluster_id,
            topics=(eqe_req.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),), leader_endpoints=())
    if isinstance(message, FetchSnapshotRequest):
        partition = fs_req.PartitionSnapshot(
            partition=0, current_leader_epoch=message.current_leader_epoch,
            snapshot_id=fs_req.SnapshotId(end_offset=message.snapshot_id.end_offset,
                                          epoch=message.snapshot_id.epoch),
            position=message.position, replica_directory_id=message.replica_directory_id)
        return fs_req.FetchSnapshotRequest(
            cluster_id=message.cluster_id, replica_id=message.replica_id, max_bytes=message.max_bytes,
            topics=(fs_req.TopicSnapshot(name=METADATA_TOPIC, partitions=(partition,)),))
    raise TypeError(f"not a Raft request: {message!r}")


# --- requests: kio -> raft -------------------------------------------------------------


def _known(directory_id: uuid.UUID | None) -> uuid.UUID | None:
    """A directory id off the wire; Kafka's zero uuid means none was given."""
    return None if directory_id is None or directory_id.int == 0 else directory_id


def request_from_kio(body: Any) -> tuple[int, Message]:
    """(the sender's replica id, the Raft request) from a decoded kio request."""
    if isinstance(body, fetch_req.FetchRequest):
        p = _partition(body.topics, lambda t: t.topic_id, "Fetch")
        replica_id = int(body.replica_state.replica_id)
        return replica_id, FetchRequest(
            cluster_id=body.cluster_id, replica_id=replica_id, current_leader_epoch=p.current_leader_epoch,
            fetch_offset=p.fetch_offset, last_fetched_epoch=p.last_fetched_epoch,
            log_start_offset=p.log_start_offset, max_bytes=min(int(body.max_bytes), int(p.partition_max_bytes)),
            max_wait_ms=max(0, duration_ms(body.max_wait)), replica_directory_id=_known(p.replica_directory_id))
    if isinstance(body, vote_req.VoteRequest):
        p = _partition(body.topics, lambda t: t.topic_name, "Vote")
        return p.replica_id, VoteRequest(
            cluster_id=body.cluster_id, voter_id=body.voter_id, replica_id=p.replica_id,
            replica_epoch=p.replica_epoch, last_offset_epoch=p.last_offset_epoch, last_offset=p.last_offset,
            pre_vote=p.pre_vote, voter_directory_id=_known(p.voter_directory_id),
            replica_directory_id=_known(p.replica_directory_id))
    if isinstance(body, bqe_req.BeginQuorumEpochRequest):
        p = _partition(body.topics, lambda t: t.topic_name, "BeginQuorumEpoch")
        return p.leader_id, BeginQuorumEpochRequest(
            cluster_id=body.cluster_id, voter_id=body.voter_id, leader_id=p.leader_id, leader_epoch=p.leader_epoch,
            voter_directory_id=_known(p.voter_directory_id))
    if isinstance(body, eqe_req.EndQuorumEpochRequest):
        p = _partition(body.topics, lambda t: t.topic_name, "EndQuorumEpoch")
        return p.leader_id, EndQuorumEpochRequest(
            cluster_id=body.cluster_id, leader_id=p.leader_id, leader_epoch=p.leader_epoch,
            preferred_successors=tuple(int(c.candidate_id) for c in p.preferred_candidates))
    if isinstance(body, fs_req.FetchSnapshotRequest):
        p = _partition(body.topics, lambda t: t.name, "FetchSnapshot")
        return body.replica_id, FetchSnapshotRequest(
            cluster_id=body.cluster_id, replica_id=body.replica_id, current_leader_epoch=p.current_leader_epoch,
            snapshot_id=SnapshotId(end_offset=p.snapshot_id.end_offset, epoch=p.snapshot_id.epoch),
            position=p.position, max_bytes=body.max_bytes, replica_directory_id=_known(p.replica_directory_id))
    raise TypeError(f"not a Raft request: {type(body).__name__}")


# --- responses: raft -> kio --------------------------------------------------------------


def response_to_kio(message: Message) -> Any:
    if isinstance(message, FetchResponse):
        diverging = message.diverging_epoch
        snapshot = message.snapshot_id
        partition = fetch_resp.PartitionData(
            partition_index=0, error_code=kio_error(message.error_code), high_watermark=message.high_watermark,
            log_start_offset=message.log_start_offset,
            diverging_epoch=fetch_resp.EpochEndOffset(epoch=diverging.epoch, end_offset=diverging.end_offset)
            if diverging is not None else fetch_resp.EpochEndOffset(),
            current_leader=fetch_resp.LeaderIdAndEpoch(leader_id=message.leader_id,
                                                       leader_epoch=message.leader_epoch),
            snapshot_id=fetch_resp.SnapshotId(end_offset=snapshot.end_offset, epoch=snapshot.epoch)
            if snapshot is not None else fetch_resp.SnapshotId(),
            aborted_transactions=None, records=message.records)
        return fetch_resp.FetchResponse(
            throttle_time=_NO_THROTTLE, error_code=KioErrorCode.none,
            responses=(fetch_resp.FetchableTopicResponse(topic_id=METADATA_TOPIC_ID, partitions=(partition,)),))
    if isinstance(message, VoteResponse):
        partition = vote_resp.PartitionData(
            partition_index=0, error_code=kio_error(message.error_code), leader_id=message.leader_id,
            leader_epoch=message.leader_epoch, vote_granted=message.vote_granted)
        return vote_resp.VoteResponse(error_code=KioErrorCode.none, topics=(
            vote_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),))
    if isinstance(message, BeginQuorumEpochResponse):
        partition = bqe_resp.PartitionData(partition_index=0, error_code=kio_error(message.error_code),
                                           leader_id=message.leader_id, leader_epoch=message.leader_epoch)
        return bqe_resp.BeginQuorumEpochResponse(error_code=KioErrorCode.none, topics=(
            bqe_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),))
    if isinstance(message, EndQuorumEpochResponse):
        partition = eqe_resp.PartitionData(partition_index=0, error_code=kio_error(message.error_code),
                                           leader_id=message.leader_id, leader_epoch=message.leader_epoch)
        return eqe_resp.EndQuorumEpochResponse(error_code=KioErrorCode.none, topics=(
            eqe_resp.TopicData(topic_name=METADATA_TOPIC, partitions=(partition,)),))
    if isinstance(message, FetchSnapshotResponse):
        partition = fs_resp.PartitionSnapshot(
            index=0, error_code=kio_error(message.error_code),
            snapshot_id=fs_resp.SnapshotId(end_offset=message.snapshot_id.end_offset,
                                           epoch=message.snapshot_id.epoch),
            current_leader=fs_resp.LeaderIdAndEpoch(leader_id=message.leader_id, leader_epoch=message.leader_epoch),
            size=message.size, position=message.position, unaligned_records=message.unaligned_records)
        return fs_resp.FetchSnapshotResponse(throttle_time=_NO_THROTTLE, error_code=KioErrorCode.none, topics=(
            fs_resp.TopicSnapshot(name=METADATA_TOPIC, partitions=(partition,)),))
    raise TypeError(f"not a Raft response: {message!r}")


# --- responses: kio -> raft ---------------------------------------------------------------


def response_from_kio(body: Any) -> Message:
    """The Raft response in a kio response; a top-level error (or a wrong
    shape) becomes that error with no leader information."""
    if isinstance(body, fetch_resp.FetchResponse):
        if body.error_code != KioErrorCode.none:
            return FetchResponse(error_code=raft_error(body.error_code), leader_id=-1, leader_epoch=-1,
                                 high_watermark=-1, log_start_offset=-1)
        p = _partition(body.responses, lambda t: t.topic_id, "Fetch response")
        diverging = p.diverging_epoch
        snapshot = p.snapshot_id
        return FetchResponse(
            error_code=raft_error(p.error_code), leader_id=p.current_leader.leader_id,
            leader_epoch=p.current_leader.leader_epoch, high_watermark=p.high_watermark,
            log_start_offset=p.log_start_offset,
            diverging_epoch=DivergingEpoch(diverging.epoch, diverging.end_offset)
            if diverging.epoch >= 0 and diverging.end_offset >= 0 else None,
            snapshot_id=SnapshotId(snapshot.end_offset, snapshot.epoch)
            if snapshot.end_offset >= 0 and snapshot.epoch >= 0 else None,
            records=bytes(p.records) if p.records else b"")
    if isinstance(body, vote_resp.VoteResponse):
        if body.error_code != KioErrorCode.none:
            return VoteResponse(error_code=raft_error(body.error_code), leader_id=-1, leader_epoch=-1,
                                vote_granted=False)
        p = _partition(body.topics, lambda t: t.topic_name, "Vote response")
        return VoteResponse(error_code=raft_error(p.error_code), leader_id=p.leader_id,
                            leader_epoch=p.leader_epoch, vote_granted=p.vote_granted)
    if isinstance(body, bqe_resp.BeginQuorumEpochResponse):
        if body.error_code != KioErrorCode.none:
            return BeginQuorumEpochResponse(error_code=raft_error(body.error_code), leader_id=-1, leader_epoch=-1)
        p = _partition(body.topics, lambda t: t.topic_name, "BeginQuorumEpoch response")
        return BeginQuorumEpochResponse(error_code=raft_error(p.error_code), leader_id=p.leader_id,
                                        leader_epoch=p.leader_epoch)
    if isinstance(body, eqe_resp.EndQuorumEpochResponse):
        if body.error_code != KioErrorCode.none:
            return EndQuorumEpochResponse(error_code=raft_error(body.error_code), leader_id=-1, leader_epoch=-1)
        p = _partition(body.topics, lambda t: t.topic_name, "EndQuorumEpoch response")
        return EndQuorumEpochResponse(error_code=raft_error(p.error_code), leader_id=p.leader_id,
                                      leader_epoch=p.leader_epoch)
    if isinstance(body, fs_resp.FetchSnapshotResponse):
        if body.error_code != KioErrorCode.none:
            return FetchSnapshotResponse(error_code=raft_error(body.error_code), leader_id=-1, leader_epoch=-1,
                                         snapshot_id=SnapshotId(-1, -1), size=-1, position=-1, unaligned_records=b"")
        p = _partition(body.topics, lambda t: t.name, "FetchSnapshot response")
        return FetchSnapshotResponse(
            error_code=raft_error(p.error_code), leader_id=p.current_leader.leader_id,
            leader_epoch=p.current_leader.leader_epoch,
            snapshot_id=SnapshotId(p.snapshot_id.end_offset, p.snapshot_id.epoch), size=p.size,
            position=p.position, unaligned_records=bytes(p.unaligned_records))
    raise TypeError(f"not a Raft response: {type(body).__name__}")


def failure_response(request: Message, error: int) -> Message:
    """What the core is handed when `request` got no answer (the connection
    failed): an error response naming no leader, as Kafka's network channel
    turns a disconnect into an error response."""
    if isinstance(request, FetchRequest):
        return FetchResponse(error_code=raft_error(error), leader_id=-1, leader_epoch=-1, high_watermark=-1,
                             log_start_offset=-1)
    if isinstance(request, VoteRequest):
        return VoteResponse(error_code=raft_error(error), leader_id=-1, leader_epoch=-1, vote_granted=False)
    if isinstance(request, BeginQuorumEpochRequest):
        return BeginQuorumEpochResponse(error_code=raft_error(error), leader_id=-1, leader_epoch=-1)
    if isinstance(request, EndQuorumEpochRequest):
        return EndQuorumEpochResponse(error_code=raft_error(error), leader_id=-1, leader_epoch=-1)
    assert isinstance(request, FetchSnapshotRequest)
    return FetchSnapshotResponse(error_code=raft_error(error), leader_id=-1, leader_epoch=-1,
                                 snapshot_id=request.snapshot_id, size=-1, position=request.position,
                                 unaligned_records=b"")


def shape_error_response(body: Any, error: KioErrorCode = KioErrorCode.invalid_request) -> Any:
    """INVALID_REQUEST (or `error`) at the top level, for a request
    `request_from_kio` refused (or the authorizer did)."""
    if isinstance(body, fetch_req.FetchRequest):
        return fetch_resp.FetchResponse(throttle_time=_NO_THROTTLE, error_code=error,
                                        responses=())
    if isinstance(body, vote_req.VoteRequest):
        return vote_resp.VoteResponse(error_code=error, topics=())
    if isinstance(body, bqe_req.BeginQuorumEpochRequest):
        return bqe_resp.BeginQuorumEpochResponse(error_code=error, topics=())
    if isinstance(body, eqe_req.EndQuorumEpochRequest):
        return eqe_resp.EndQuorumEpochResponse(error_code=error, topics=())
    assert isinstance(body, fs_req.FetchSnapshotRequest)
    return fs_resp.FetchSnapshotResponse(throttle_time=_NO_THROTTLE, error_code=error,
                                         topics=())
