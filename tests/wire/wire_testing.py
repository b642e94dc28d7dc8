"""Helpers shared by the wire tests: Vote messages that carry a number we
can follow through the server, a raw-socket Kafka reader, frames
truncated and garbled for the hand decoders' tests, and a server that
answers every request with the same flexible-version body."""

import struct

import trio
from kio.schema.errors import ErrorCode
from kio.schema.vote.v0 import VoteRequest, VoteResponse
from kio.schema.vote.v0 import request as vote_req
from kio.schema.vote.v0 import response as vote_resp
from kio.static.primitive import i32, i64

from common.wire import FrameBuffer, SupportedApis

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


def garbled(data, raw: bytes, keep: int) -> bytes:
    """`raw` cut at a drawn length (at least `keep` bytes, the header the
    test leaves alone) with up to three bytes after `keep` overwritten;
    `data` is hypothesis's `st.data()`."""
    from hypothesis import strategies as st

    out = bytearray(raw[: data.draw(st.integers(keep, len(raw)))])
    for _ in range(data.draw(st.integers(0, 3))):
        if len(out) > keep:
            out[data.draw(st.integers(keep, len(out) - 1))] = data.draw(st.integers(0, 255))
    return bytes(out)


def same_answer_server(body: bytes, piece_bytes: int | None = None):
    """A `trio.serve_tcp` handler answering every request frame with `body`
    under a flexible response header (no tags): the answers to the frames of
    one receive go out in one write, in pieces of `piece_bytes` if given."""

    async def serve(stream: trio.SocketStream) -> None:
        buf = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            answers = b""
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                size = int.from_bytes(buf[:4], "big")
                frame, buf = buf[4 : 4 + size], buf[4 + size :]
                answer = frame[4:8] + b"\x00" + body  # the request's correlation id
                answers += len(answer).to_bytes(4, "big") + answer
            step = piece_bytes or max(len(answers), 1)
            for i in range(0, len(answers), step):
                await stream.send_all(answers[i : i + step])

    return serve
