"""The hand reader of Metadata v12 answers finds the leaders kio finds
(long arrays, null names and unknown tagged fields included), and turns
garbage into a RemoteProtocolError like any other answer, without making
room for a count it cannot hold; a client asks for it per request."""

import datetime
import functools
import io
import uuid

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as kio_req
from kio.schema.metadata.v12 import response as kio_md
from kio.serial import entity_reader, entity_writer
from wire_testing import garbled, same_answer_server

from common.wire import RemoteProtocolError
from common.wire.codec import api_codec, api_codec_read_by, decode_response
from common.wire.metadata_leaders import METADATA_KEY, VERSION, read_leaders

I32 = st.integers(-(2**31), 2**31 - 1)
IDS = st.lists(st.integers(-1, 2**31 - 1), max_size=4).map(tuple)
ERRORS = st.sampled_from([ErrorCode.none, ErrorCode.unknown_topic_or_partition, ErrorCode.leader_not_available])


@st.composite
def metadata_responses(draw) -> kio_md.MetadataResponse:
    # Now and then an id array of 127 or more entries: its count takes two bytes.
    ids = IDS | st.lists(st.integers(0, 10), min_size=127, max_size=130).map(tuple)
    partition = st.builds(kio_md.MetadataResponsePartition, error_code=ERRORS, partition_index=I32,
                          leader_id=I32, leader_epoch=I32, replica_nodes=ids, isr_nodes=IDS, offline_replicas=IDS)
    topic = st.builds(kio_md.MetadataResponseTopic, error_code=ERRORS, name=st.none() | st.text(max_size=12),
                      topic_id=st.uuids(), is_internal=st.booleans(),
                      partitions=st.lists(partition, max_size=4).map(tuple), topic_authorized_operations=I32)
    broker = st.builds(kio_md.MetadataResponseBroker, node_id=I32, host=st.text(max_size=10), port=I32,
                       rack=st.none() | st.text(max_size=5))
    return kio_md.MetadataResponse(
        throttle_time=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        brokers=draw(st.lists(broker, max_size=3).map(tuple)), cluster_id=draw(st.none() | st.text(max_size=8)),
        controller_id=draw(I32), topics=draw(st.lists(topic, max_size=3).map(tuple)))


def encoded(response: kio_md.MetadataResponse) -> bytes:
    out = io.BytesIO()
    entity_writer(kio_md.MetadataResponse)(out, response)
    return out.getvalue()


def kio_leaders(body: kio_md.MetadataResponse) -> dict:
    """What a client reads from kio's decoding: the leader of every partition
    of every topic without an error (the last of a repeated one)."""
    leaders = {}
    for t in body.topics:
        if t.error_code == ErrorCode.none:
            leaders.update({(t.name, p.partition_index): p.leader_id for p in t.partitions})
    return leaders


@given(response=metadata_responses())
def test_hand_reading_finds_the_leaders_kio_finds(response):
    frame = memoryview(b"head" + encoded(response) + b"tail")
    expected, expected_size = entity_reader(kio_md.MetadataResponse)(frame, 4)
    leaders, size = read_leaders(frame, 4)
    assert leaders == kio_leaders(expected)
    assert size == expected_size


def test_unknown_tagged_fields_are_skipped():
    # Two partitions with a tag (99, 3 bytes) in their own section, and one
    # in the topic's: a later version's field this reader does not know.
    # KIP-482 says to skip it (kio refuses it, so no comparison with kio).
    partitions = (b"\x03"
                  + b"\x00\x00" + b"\x00\x00\x00\x07" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x05"
                  + b"\x02\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x02" + b"\x01" + b"\x01\x63\x03abc"
                  + b"\x00\x00" + b"\x00\x00\x00\x08" + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x05"
                  + b"\x01" + b"\x01" + b"\x01" + b"\x01\x63\x03abc")
    topic = (b"\x02" + b"\x00\x00" + b"\x02t" + uuid.uuid4().bytes + b"\x00" + partitions
             + b"\x80\x00\x00\x00" + b"\x01\x63\x03abc")
    body = b"\x00\x00\x00\x00" + b"\x01" + b"\x01" + b"\x00\x00\x00\x01" + topic + b"\x00"
    leaders, size = read_leaders(memoryview(body), 0)
    assert leaders == {("t", 7): 2, ("t", 8): 3}
    assert size == len(body)


@given(response=metadata_responses(), data=st.data())
def test_truncated_or_garbled_metadata_answer_is_a_remote_protocol_error(response, data):
    raw = b"\x00\x00\x00\x01\x00" + encoded(response)
    frame = garbled(data, raw, 5)
    try:
        leaders = decode_response(memoryview(frame), api_codec_read_by(METADATA_KEY, VERSION, read_leaders),
                                  1)
    except RemoteProtocolError as exc:
        assert "Metadata(3) v12 response" in str(exc)
        return
    assert isinstance(leaders, dict)


def test_a_count_of_two_billion_is_refused_without_making_room_for_it():
    # One topic claiming 2**31 - 2 partitions, then one partition's bytes.
    varint = bytearray()
    value = 2**31 - 1
    while value >= 0x80:
        varint.append(value & 0x7F | 0x80)
        value >>= 7
    varint.append(value)
    body = (b"\x00\x00\x00\x00" + b"\x01" + b"\x01" + b"\x00\x00\x00\x01" + b"\x02" + b"\x00\x00" + b"\x02t"
            + bytes(16) + b"\x00" + bytes(varint) + bytes(14) + b"\x01\x01\x01\x00")
    with pytest.raises(RemoteProtocolError, match="Metadata\\(3\\) v12 response: does not decode"):
        decode_response(memoryview(b"\x00\x00\x00\x01\x00" + body),
                        api_codec_read_by(METADATA_KEY, VERSION, read_leaders), 1)


def test_the_reader_is_asked_for_per_request_and_kio_stays_the_default():
    assert api_codec(METADATA_KEY, VERSION).kio_reads_response
    hand = api_codec_read_by(METADATA_KEY, VERSION, read_leaders)
    assert not hand.kio_reads_response and hand.read_response is read_leaders
    assert hand.request_type is api_codec(METADATA_KEY, VERSION).request_type


async def test_a_client_gets_the_leaders_of_a_large_answer_from_a_server():
    """Over a real connection: the same server answer, read by kio when
    no reader is given and by hand when `read_leaders` is."""
    from common.wire.client import open_connection

    partitions = tuple(kio_md.MetadataResponsePartition(
        error_code=ErrorCode.none, partition_index=i, leader_id=3 + i % 2, leader_epoch=4, replica_nodes=(2, 3, 4),
        isr_nodes=(3, 4), offline_replicas=()) for i in range(2000))
    response = kio_md.MetadataResponse(
        throttle_time=datetime.timedelta(0), brokers=(kio_md.MetadataResponseBroker(
            node_id=3, host="127.0.0.1", port=9093, rack=None),), cluster_id="c", controller_id=1,
        topics=(kio_md.MetadataResponseTopic(error_code=ErrorCode.none, name="big", topic_id=uuid.uuid4(),
                                             is_internal=False, partitions=partitions,
                                             topic_authorized_operations=-(2**31)),))
    body = encoded(response)

    serve = same_answer_server(body)

    request = kio_req.MetadataRequest(topics=(kio_req.MetadataRequestTopic(topic_id=None, name="big"),),
                                      allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with open_connection("127.0.0.1", port) as conn:
            by_kio = await conn.request(request)
            by_hand = await conn.request(request, read=read_leaders)
        nursery.cancel_scope.cancel()
    assert isinstance(by_kio, kio_md.MetadataResponse)
    assert by_hand == kio_leaders(by_kio)
    assert len(by_hand) == 2000 and by_hand[("big", 1)] == 4
