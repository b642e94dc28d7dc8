"""LeaderAndIsr / StopReplica / UpdateMetadata frames: Kafka's field order, round trips, garbage refused."""

import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from quorum.zookeeper import messages as m
from common.wire.errors import LocalProtocolError, RemoteProtocolError


def _compact_str(s: str) -> bytes:
    return bytes([len(s) + 1]) + s.encode()


def test_stop_replica_v4_bytes_follow_kafkas_schema():
    # Hand-built from StopReplicaRequest.json v4: ControllerId, isKRaftController,
    # ControllerEpoch, BrokerEpoch, TopicStates[TopicName, PartitionStates[
    # PartitionIndex, LeaderEpoch, DeletePartition]], each struct ending in an
    # empty tagged-field section.
    request = m.StopReplicaRequest(controller_id=3, controller_epoch=9, broker_epoch=1234, topic_states=(
        m.StopReplicaTopicState(topic_name="orders", partition_states=(
            m.StopReplicaPartitionState(partition_index=2, leader_epoch=5, delete_partition=True),)),))
    body = (struct.pack(">i?iq", 3, False, 9, 1234) + bytes([2]) + _compact_str("orders") + bytes([2])
            + struct.pack(">ii?", 2, 5, True) + b"\0" + b"\0" + b"\0")
    header = struct.pack(">hhih", 5, 4, 77, 3) + b"ctl" + b"\0"
    frame = m.encode_request(77, "ctl", request)
    assert frame == struct.pack(">i", len(header) + len(body)) + header + body
    h, decoded = m.decode_request(frame[4:])
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (5, 4, 77, "ctl")
    assert decoded == request


def test_update_metadata_response_bytes():
    frame = m.encode_response(1, m.UpdateMetadataResponse(error_code=ErrorCode.stale_controller_epoch))
    assert frame == struct.pack(">ii", 8, 1) + b"\0" + struct.pack(">h", 11) + b"\0"


def _leader_and_isr() -> m.LeaderAndIsrRequest:
    return m.LeaderAndIsrRequest(
        controller_id=1, controller_epoch=2, broker_epoch=40, type=m.LEADER_AND_ISR_FULL,
        topic_states=(m.LeaderAndIsrTopicState(topic_name="t", topic_id=uuid.UUID(int=7), partition_states=(
            m.LeaderAndIsrPartitionState(partition_index=0, controller_epoch=2, leader=1, leader_epoch=3, isr=(1, 2),
                                         partition_epoch=4, replicas=(1, 2, 3), is_new=True),)),),
        live_leaders=(m.LeaderAndIsrLiveLeader(broker_id=1, host_name="127.0.0.1", port=9092),))


def _update_metadata() -> m.UpdateMetadataRequest:
    return m.UpdateMetadataRequest(
        controller_id=1, controller_epoch=2, type=2,
        topic_states=(m.UpdateMetadataTopicState(topic_name="t", topic_id=uuid.UUID(int=7), partition_states=(
            m.UpdateMetadataPartitionState(partition_index=0, controller_epoch=2, leader=-1, leader_epoch=3, isr=(2,),
                                           zk_version=4, replicas=(1, 2), offline_replicas=(1,)),)),),
        live_brokers=(m.UpdateMetadataBroker(id=2, endpoints=(m.UpdateMetadataEndpoint(
            port=9093, host="h", listener="PLAINTEXT", security_protocol=0),), rack="r"),
            m.UpdateMetadataBroker(id=3, endpoints=(), rack=None)))


@pytest.mark.parametrize("request_", [_leader_and_isr(), _update_metadata()])
def test_requests_round_trip(request_):
    frame = m.encode_request(5, None, request_)
    header, body = m.decode_request(frame[4:])
    assert header.client_id is None and body == request_


def test_responses_round_trip():
    resp = m.LeaderAndIsrResponse(error_code=ErrorCode.none, topics=(m.LeaderAndIsrTopicError(
        topic_id=uuid.UUID(int=1), partition_errors=(m.LeaderAndIsrPartitionError(
            partition_index=0, error_code=ErrorCode.fenced_leader_epoch),)),))
    assert m.decode_response(m.encode_response(3, resp)[4:], m.LEADER_AND_ISR_KEY, 3) == resp
    with pytest.raises(RemoteProtocolError):
        m.decode_response(m.encode_response(3, resp)[4:], m.LEADER_AND_ISR_KEY, 4)


def test_garbage_and_foreign_requests_are_refused():
    frame = m.encode_request(5, None, _leader_and_isr())
    with pytest.raises(RemoteProtocolError):
        m.decode_request(frame[4:-3])
    with pytest.raises(RemoteProtocolError):
        m.decode_request(struct.pack(">hhih", 3, 12, 1, -1))  # Metadata is not a controller request
    with pytest.raises(LocalProtocolError):
        m.encode_request(1, None, object())
