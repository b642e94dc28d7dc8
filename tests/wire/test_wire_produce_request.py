"""The hand decoder of Produce requests reads what kio reads, for every
version it handles, leaves the records in the frame, and turns garbage into
a RemoteProtocolError like any other request."""

import datetime
import io
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from wire_testing import garbled

from common.wire import RemoteProtocolError, SupportedApis, decode_request, encode_request
from common.wire.produce_request import (FIRST_VERSION, LAST_VERSION, TOPIC_ID_VERSION, ProduceRequest,
                                        produce_request_reader)

VERSIONS = range(FIRST_VERSION, LAST_VERSION + 1)
APIS = SupportedApis().declare(0, FIRST_VERSION, LAST_VERSION)


def schema(version: int):
    request_type = load_request_schema(0, version)
    return request_type, __import__(request_type.__module__, fromlist=["_"])


@st.composite
def produce_requests(draw, version: int):
    request_type, module = schema(version)
    text = st.text(max_size=12)
    # v13 names topics by id (KIP-516), the zero id included.
    by_id = version >= TOPIC_ID_VERSION
    topics = draw(st.lists(st.builds(
        lambda key, partitions: module.TopicProduceData(
            **({"topic_id": key} if by_id else {"name": key}), partition_data=tuple(partitions)),
        st.uuids() | st.just(uuid.UUID(int=0)) if by_id else text,
        st.lists(st.builds(
            lambda index, records: module.PartitionProduceData(index=index, records=records),
            st.integers(-(2**31), 2**31 - 1),
            st.none() | st.binary(max_size=300),
        ), max_size=3),
    ), max_size=3))
    return request_type(
        transactional_id=draw(st.none() | text),
        acks=draw(st.integers(-(2**15), 2**15 - 1)),
        timeout=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        topic_data=tuple(topics),
    )


def _topic_id(topic) -> uuid.UUID | None:
    """kio reads the zero id as None; the hand decoder keeps it (and gives None before v13)."""
    topic_id = getattr(topic, "topic_id", None)
    return None if topic_id is None or topic_id.int == 0 else topic_id


def as_plain(body) -> tuple:
    """What a handler reads from a decoded body (kio's or ours)."""
    return (
        body.transactional_id, body.acks, body.timeout,
        [(getattr(t, "name", None), _topic_id(t), [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
         for t in body.topic_data],
    )


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.data())
def test_hand_decoding_reads_what_kio_reads(version, data):
    request_type, _ = schema(version)
    request = data.draw(produce_requests(version))
    out = io.BytesIO()
    entity_writer(request_type)(out, request)
    # Some bytes before and after, as in a frame with a header and padding.
    frame = memoryview(b"head" + out.getvalue() + b"tail")
    expected, expected_size = entity_reader(request_type)(frame, 4)
    body, size = produce_request_reader(version)(frame, 4)
    assert isinstance(body, ProduceRequest)
    assert size == expected_size
    assert as_plain(body) == as_plain(expected)
    assert body.timeout_ms == request.timeout // datetime.timedelta(milliseconds=1)


def test_records_are_views_of_the_frame_not_copies():
    _, module = schema(9)
    batch = bytes(range(200))
    request = load_request_schema(0, 9)(
        transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30),
        topic_data=(module.TopicProduceData(name="t", partition_data=(
            module.PartitionProduceData(index=0, records=batch),)),),
    )
    raw = bytearray(encode_request(5, "client", request))
    decoded = decode_request(memoryview(raw).toreadonly()[4:], APIS.supports)
    records = decoded.body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records == batch
    raw[raw.index(batch)] ^= 0xFF  # the frame's memory changes, and so do the records
    assert records[0] == 0xFF


def test_versions_outside_the_hand_decoders_range_are_left_to_kio():
    assert produce_request_reader(FIRST_VERSION - 1) is None
    assert produce_request_reader(LAST_VERSION + 1) is None


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.data())
def test_truncated_or_garbled_produce_is_a_remote_protocol_error(version, data):
    request_type, _ = schema(version)
    raw = encode_request(1, "c", data.draw(produce_requests(version)))[4:]
    frame = garbled(data, raw, 10)
    try:
        decoded = decode_request(memoryview(frame), APIS.supports)
    except RemoteProtocolError as exc:
        assert "Produce(0)" in str(exc)
        return
    assert isinstance(decoded.body, ProduceRequest)
