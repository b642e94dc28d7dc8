"""Helpers shared by the wire tests: Vote messages that carry a number we
can follow through the server, and a raw-socket Kafka reader."""

import struct

import trio
from kio.schema.errors import ErrorCode
from kio.schema.vote.v0 import VoteRequest, VoteResponse
from kio.schema.vote.v0 import request as vote_req
from kio.schema.vote.v0 import response as vote_resp
from kio.static.primitive import i32, i64

from raftka.wire import FrameBuffer, SupportedApis

TOPIC = "__cluster_metadata"


def raft_apis() -> SupportedApis:
    return SupportedApis().declare(52, 0, 0)


def vote_request(epoch: int) -> VoteRequest:
    partition = vote_req.PartitionData(
        partition_index=i32(0), replica_epoch=i32(epoch), replica_id=i32(1),
        last_offset_epoch=i32(0), last_offset=i64(0),
    )
    return VoteRequest(
        cluster_id="c1", topics=(vote_req.TopicData(topic_name=TOPIC, partitions=(partition,)),)
    )


def epoch_of(request: VoteRequest) -> int:
    return request.topics[0].partitions[0].replica_epoch


def vote_response(epoch: int) -> VoteResponse:
    partition = vote_resp.PartitionData(
        partition_index=i32(0), error_code=ErrorCode.none, leader_id=i32(1),
        leader_epoch=i32(epoch), vote_granted=True,
    )
    return VoteResponse(
        error_code=ErrorCode.none,
        topics=(vote_resp.TopicData(topic_name=TOPIC, partitions=(partition,)),),
    )


def leader_epoch_of(response: VoteResponse) -> int:
    return response.topics[0].partitions[0].leader_epoch


async def read_frames(stream: trio.abc.ReceiveStream, count: int) -> list[bytes]:
    """Read exactly `count` frames (without size prefixes) from a raw stream."""
    buffer = FrameBuffer(request_max_bytes=2**31 - 1)
    frames: list[bytes] = []
    while len(frames) < count:
        data = await stream.receive_some(1 << 20)
        assert data, f"connection closed after {len(frames)} of {count} frames"
        frames.extend(bytes(f) for f in buffer.feed(data))
    assert len(frames) == count
    return frames


def correlation_id_of(frame: bytes) -> int:
    return struct.unpack_from(">i", frame)[0]


async def closed_by_peer(stream: trio.SocketStream) -> bool:
    """True once the peer closed (EOF or reset); reads and drops anything else."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass
    return True
