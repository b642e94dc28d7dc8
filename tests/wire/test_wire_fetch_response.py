"""The hand decoder of Fetch v12 responses reads what kio reads (tagged
fields, aborted transactions and null records included), leaves the records
in the frame, and turns garbage into a RemoteProtocolError like any other
response; a follower's client receives answers zero-copy end to end."""

import datetime
import functools
import io

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import response as kio_fetch
from kio.serial import entity_reader, entity_writer
from wire_testing import garbled, same_answer_server

from common.wire import RemoteProtocolError
from common.wire.codec import api_codec, decode_response
from common.wire.fetch_response import FETCH_KEY, VERSION, FetchResponse, fetch_response_reader

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
ERRORS = st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower, ErrorCode.offset_out_of_range,
                          ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch])


@st.composite
def fetch_responses(draw) -> kio_fetch.FetchResponse:
    partition = st.builds(
        kio_fetch.PartitionData,
        partition_index=I32, error_code=ERRORS, high_watermark=I64, last_stable_offset=I64,
        log_start_offset=I64,
        diverging_epoch=st.builds(kio_fetch.EpochEndOffset, epoch=I32, end_offset=I64)
        | st.just(kio_fetch.EpochEndOffset()),
        current_leader=st.builds(kio_fetch.LeaderIdAndEpoch, leader_id=I32, leader_epoch=I32)
        | st.just(kio_fetch.LeaderIdAndEpoch()),
        snapshot_id=st.builds(kio_fetch.SnapshotId, end_offset=I64, epoch=I32) | st.just(kio_fetch.SnapshotId()),
        aborted_transactions=st.none() | st.lists(st.builds(
            kio_fetch.AbortedTransaction, producer_id=I64, first_offset=I64), max_size=2).map(tuple),
        preferred_read_replica=I32,
        records=st.none() | st.binary(max_size=300),
    )
    topics = st.lists(st.builds(
        kio_fetch.FetchableTopicResponse, topic=st.text(max_size=12),
        partitions=st.lists(partition, max_size=3).map(tuple)), max_size=3).map(tuple)
    return kio_fetch.FetchResponse(
        throttle_time=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        error_code=draw(ERRORS), session_id=draw(I32), responses=draw(topics))


def as_plain(body) -> tuple:
    """What a follower reads from a decoded body (kio's or ours)."""
    return (
        body.throttle_time, body.error_code, body.session_id,
        [(t.topic, [(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                     (p.diverging_epoch.epoch, p.diverging_epoch.end_offset),
                     (p.current_leader.leader_id, p.current_leader.leader_epoch),
                     (p.snapshot_id.end_offset, p.snapshot_id.epoch),
                     None if p.aborted_transactions is None
                     else [(a.producer_id, a.first_offset) for a in p.aborted_transactions],
                     p.preferred_read_replica, None if p.records is None else bytes(p.records))
                    for p in t.partitions])
         for t in body.responses],
    )


def encoded(response: kio_fetch.FetchResponse) -> bytes:
    out = io.BytesIO()
    entity_writer(kio_fetch.FetchResponse)(out, response)
    return out.getvalue()


@given(response=fetch_responses())
def test_hand_decoding_reads_what_kio_reads(response):
    # Some bytes before and after, as in a frame with a header and padding.
    frame = memoryview(b"head" + encoded(response) + b"tail")
    expected, expected_size = entity_reader(kio_fetch.FetchResponse)(frame, 4)
    body, size = fetch_response_reader(VERSION)(frame, 4)
    assert isinstance(body, FetchResponse)
    assert size == expected_size
    assert as_plain(body) == as_plain(expected)


def test_records_are_views_of_the_frame_not_copies():
    batch = bytes(range(200))
    response = kio_fetch.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=7,
        responses=(kio_fetch.FetchableTopicResponse(topic="t", partitions=(kio_fetch.PartitionData(
            partition_index=0, error_code=ErrorCode.none, high_watermark=5, last_stable_offset=5,
            log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=batch),)),))
    raw = bytearray(b"\x00\x00\x00\x09\x00" + encoded(response))  # correlation id 9, no header tags
    body = decode_response(memoryview(raw).toreadonly(), api_codec(FETCH_KEY, VERSION), 9)
    records = body.responses[0].partitions[0].records
    assert isinstance(records, memoryview) and records == batch
    raw[raw.index(batch)] ^= 0xFF  # the frame's memory changes, and so do the records
    assert records[0] == 0xFF


def test_other_versions_are_left_to_kio():
    assert fetch_response_reader(VERSION - 1) is None
    assert fetch_response_reader(VERSION + 1) is None
    assert api_codec(FETCH_KEY, VERSION - 1).kio_reads_response
    assert not api_codec(FETCH_KEY, VERSION).kio_reads_response


@given(response=fetch_responses(), data=st.data())
def test_truncated_or_garbled_fetch_response_is_a_remote_protocol_error(response, data):
    raw = b"\x00\x00\x00\x01\x00" + encoded(response)
    frame = garbled(data, raw, 5)
    try:
        body = decode_response(memoryview(frame), api_codec(FETCH_KEY, VERSION), 1)
    except RemoteProtocolError as exc:
        assert "Fetch(1) v12 response" in str(exc)
        return
    assert isinstance(body, FetchResponse)


def test_a_tag_shorter_than_its_struct_is_refused():
    # One topic "t" with one partition whose tag 0 (diverging_epoch) claims 4 bytes.
    body = (b"\x00\x00\x00\x00" b"\x00\x00" b"\x00\x00\x00\x00" b"\x02" b"\x02t" b"\x02"
            + b"\x00" * 4 + b"\x00\x00" + b"\x00" * 24 + b"\x00" + b"\xff\xff\xff\xff" + b"\x00"
            + b"\x01" + b"\x00" + b"\x04" + b"\x00" * 4 + b"\x00" + b"\x00")
    with pytest.raises(RemoteProtocolError, match="tagged field 0 has 4 bytes"):
        decode_response(memoryview(b"\x00\x00\x00\x01\x00" + body), api_codec(FETCH_KEY, VERSION), 1)


async def test_client_receives_large_answers_split_across_reads_zero_copy():
    """A client connection reassembles frames larger than one receive
    (and several per receive), each decoded from the receive buffer."""
    from common.wire.client import open_connection

    batch = bytes(range(256)) * 4096  # 1 MiB: larger than a receive chunk
    response = kio_fetch.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=3,
        responses=(kio_fetch.FetchableTopicResponse(topic="t", partitions=(kio_fetch.PartitionData(
            partition_index=0, error_code=ErrorCode.none, high_watermark=1, last_stable_offset=1,
            log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=batch),)),))
    body = encoded(response)

    # Several answers in one write, dribbled in uneven pieces.
    serve = same_answer_server(body, piece_bytes=300_001)

    from kio.schema.fetch.v12 import request as fetch_req

    request = fetch_req.FetchRequest(
        replica_id=1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 24, isolation_level=0,
        session_id=0, session_epoch=-1, topics=(), forgotten_topics_data=(), rack_id="")
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with open_connection("127.0.0.1", port) as conn:
            answers = []
            async with trio.open_nursery() as inner:
                async def ask() -> None:
                    answers.append(await conn.request(request))
                for _ in range(3):
                    inner.start_soon(ask)
            assert len(answers) == 3
            for answer in answers:
                records = answer.responses[0].partitions[0].records
                assert isinstance(records, memoryview) and records == batch
        nursery.cancel_scope.cancel()
