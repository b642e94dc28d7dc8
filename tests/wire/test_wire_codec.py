"""Request/response codec: round trips through kio, Kafka's header rules,
and every kind of garbage surfacing as RemoteProtocolError with the API
named, never as some other exception."""

import ast
import datetime
import pathlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.api_versions.v0 import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v3 import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.broker_heartbeat.v0 import BrokerHeartbeatRequest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v0 import HeartbeatRequest
from kio.schema.vote.v0 import VoteRequest, VoteResponse
from kio.schema.vote.v0 import request as vote_req
from kio.schema.vote.v0 import response as vote_resp
from kio.static.primitive import i32, i64

import common.wire
from common.wire import (
    LocalProtocolError,
    RemoteProtocolError,
    RequestHeader,
    SupportedApis,
    api_codec,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_header,
    split_frames,
    duration_ms,
)

APIS = SupportedApis().declare(52, 0, 0).declare(63, 0, 0).declare(12, 0, 0)


def vote_request(epoch: int) -> VoteRequest:
    partition = vote_req.PartitionData(
        partition_index=i32(0), replica_epoch=i32(epoch), replica_id=i32(1),
        last_offset_epoch=i32(epoch - 1), last_offset=i64(42),
    )
    return VoteRequest(
        cluster_id="c1",
        topics=(vote_req.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),),
    )


def vote_response(epoch: int) -> VoteResponse:
    partition = vote_resp.PartitionData(
        partition_index=i32(0), error_code=ErrorCode.none, leader_id=i32(1),
        leader_epoch=i32(epoch), vote_granted=True,
    )
    return VoteResponse(
        error_code=ErrorCode.none,
        topics=(vote_resp.TopicData(topic_name="__cluster_metadata", partitions=(partition,)),),
    )


def only_frame(data: bytes) -> memoryview:
    frames, consumed = split_frames(data)
    assert consumed == len(data) and len(frames) == 1
    return frames[0]


def test_request_round_trip_through_kio():
    request = vote_request(7)
    decoded = decode_request(only_frame(encode_request(123, "voter-2", request)), APIS.supports)
    assert decoded.body == request
    # The Raft APIs are flexible from v0 (KIP-595): request header v2.
    assert decoded.header == RequestHeader(52, 0, 123, "voter-2", 2)


def test_non_flexible_request_uses_header_v1():
    request = HeartbeatRequest(group_id="g", generation_id=i32(3), member_id="m")
    raw = encode_request(8, "consumer", request)
    decoded = decode_request(only_frame(raw), APIS.supports)
    assert decoded.header == RequestHeader(12, 0, 8, "consumer", 1)
    assert decoded.body == request
    assert len(raw) == 4 + 8 + 2 + len("consumer") + 2 + 1 + 4 + 2 + 1


def test_flexible_request_uses_header_v2_and_keeps_the_legacy_client_id():
    request = BrokerHeartbeatRequest(
        broker_id=i32(3), broker_epoch=i64(10), current_metadata_offset=i64(99),
        want_fence=False, want_shut_down=False,
    )
    raw = encode_request(5, "broker-3", request)
    # client_id keeps its int16 length even in header v2, then an empty tag buffer.
    assert raw[4 + 8 : 4 + 10] == struct.pack(">h", len("broker-3"))
    assert raw[4 + 10 + 8] == 0
    decoded = decode_request(only_frame(raw), APIS.supports)
    assert decoded.header.header_version == 2
    assert decoded.body == request


def test_header_v2_tagged_fields_are_skipped():
    request = BrokerHeartbeatRequest(
        broker_id=i32(3), broker_epoch=i64(10), current_metadata_offset=i64(99),
        want_fence=False, want_shut_down=False,
    )
    raw = encode_request(5, None, request)
    head, tail = raw[4:14], raw[15:]
    # One tagged field: tag 7, 3 bytes.
    body = head + b"\x01\x07\x03abc" + tail
    decoded = decode_request(only_frame(struct.pack(">i", len(body)) + body), APIS.supports)
    assert decoded.body == request and decoded.header.client_id is None


def test_response_header_follows_flexibility_except_for_api_versions():
    heartbeat_v0 = RequestHeader(12, 0, 9, None, 1)
    assert encode_response_header(heartbeat_v0) == struct.pack(">i", 9)
    broker_heartbeat = RequestHeader(63, 0, 9, None, 2)
    assert encode_response_header(broker_heartbeat) == struct.pack(">i", 9) + b"\x00"
    # ApiVersions v3 is flexible, but its responses keep header v0 (KIP-511).
    assert encode_response_header(RequestHeader(18, 3, 9, None, 2)) == struct.pack(">i", 9)


def test_response_round_trip_and_correlation_check():
    header = RequestHeader(52, 0, 77, "x", 2)
    raw = encode_response(header, vote_response(4))
    frame = only_frame(raw)
    assert decode_response(frame, api_codec(52, 0), 77) == vote_response(4)
    with pytest.raises(RemoteProtocolError, match="correlation id 77, expected 78"):
        decode_response(frame, api_codec(52, 0), 78)


def test_answering_with_the_wrong_response_class_is_our_mistake():
    with pytest.raises(LocalProtocolError, match="cannot answer"):
        encode_response(RequestHeader(63, 0, 1, None, 2), vote_response(1))


def test_unserved_api_or_version_is_refused_naming_it():
    raw = encode_request(1, "c", vote_request(1))
    with pytest.raises(RemoteProtocolError, match=r"Vote\(52\) v0 .*does not serve"):
        decode_request(only_frame(raw), SupportedApis().supports)
    unknown = struct.pack(">hhih", 999, 0, 1, -1)
    with pytest.raises(RemoteProtocolError, match=r"Unknown\(999\)"):
        decode_request(only_frame(struct.pack(">i", len(unknown)) + unknown), APIS.supports)


def test_api_versions_of_an_unknown_version_decodes_for_the_fallback():
    raw = bytearray(encode_request(3, "c", ApiVersionsRequestV3(
        client_software_name="x", client_software_version="1")))
    struct.pack_into(">h", raw, 6, 9)  # a future ApiVersions v9
    decoded = decode_request(only_frame(bytes(raw)), APIS.supports)
    assert decoded.body is None and decoded.header.api_version == 9
    assert decoded.header.client_id == "c"


def test_truncated_body_is_refused_naming_the_api():
    raw = encode_request(11, "c", vote_request(1))
    body = raw[4:]
    with pytest.raises(RemoteProtocolError, match=r"Vote\(52\) v0 request \(correlation id 11\): body"):
        decode_request(only_frame(struct.pack(">i", len(body) - 3) + body[:-3]), APIS.supports)


def test_trailing_bytes_after_a_whole_body_are_ignored_as_kafka_does():
    raw = encode_request(11, "c", vote_request(1))
    body = raw[4:]
    padded = decode_request(only_frame(struct.pack(">i", len(body) + 2) + body + b"zz"), APIS.supports)
    plain = decode_request(only_frame(raw), APIS.supports)
    assert padded.body == plain.body and padded.header.correlation_id == 11


def test_declaring_a_version_kio_does_not_know_is_our_mistake():
    with pytest.raises(LocalProtocolError, match="kio has no schema"):
        SupportedApis().declare(52, 0, 99)


def test_api_versions_v3_with_a_bad_software_name_gets_invalid_request():
    apis = SupportedApis()
    raw = encode_request(1, "c", ApiVersionsRequestV3(
        client_software_name="-bad name", client_software_version="1"))
    response = apis.api_versions_response(decode_request(only_frame(raw), apis.supports))
    decoded = decode_response(only_frame(response), api_codec(18, 3), 1)
    assert decoded.error_code == ErrorCode.invalid_request


def test_api_versions_lists_what_was_declared():
    apis = SupportedApis().declare(52, 0, 0).declare(1, 4, 13)
    raw = encode_request(1, None, ApiVersionsRequestV0())
    response = apis.api_versions_response(decode_request(only_frame(raw), apis.supports))
    decoded = decode_response(only_frame(response), api_codec(18, 0), 1)
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == [
        (1, 4, 13), (18, 0, 4), (52, 0, 0)
    ]


frames_with_a_known_header = st.builds(
    lambda key, version, rest: struct.pack(">hhih", key, version, 1, -1) + rest,
    st.sampled_from([52, 63, 18, 12]),
    st.integers(min_value=-1, max_value=5),
    st.binary(max_size=60),
)


@given(st.one_of(st.binary(max_size=80), frames_with_a_known_header))
def test_garbage_is_either_decoded_or_a_remote_protocol_error(body):
    try:
        decoded = decode_request(memoryview(body), APIS.supports)
    except RemoteProtocolError:
        return
    assert decoded.size_bytes == len(body)


def test_pure_modules_do_no_io():
    forbidden = {"trio", "socket", "time", "os", "random", "asyncio"}
    package = pathlib.Path(common.wire.__file__).parent
    for name in ("framing.py", "codec.py", "apis.py", "errors.py"):
        tree = ast.parse((package / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not imported & forbidden, f"{name} imports {imported & forbidden}"


def test_a_null_array_where_the_schema_allows_none_is_refused_naming_the_field():
    raw = encode_request(11, "c", VoteRequest(cluster_id="c1", topics=()))
    assert raw.endswith(b"\x01\x00")  # compact array of 0 topics, no tagged fields
    null_topics = raw[:-2] + b"\x00\x00"  # compact count 0: a null array
    with pytest.raises(RemoteProtocolError, match=r"Vote\(52\) v0 request \(correlation id 11\): topics is a null"):
        decode_request(only_frame(null_topics), APIS.supports)


def test_an_array_count_past_the_end_of_the_frame_is_refused_before_kio_allocates_it():
    """kio makes room for an array as soon as it reads the count; this Vote
    claims about 7 billion topics, and the allocation failure used to abort
    the whole process (the wire fuzz test found it)."""
    frame = bytes.fromhex("003400000000000100016300036361bf8ff1e1197507")
    with pytest.raises(RemoteProtocolError, match=r"Vote\(52\) v0 request .*a length of \d+ where \d+ bytes are left"):
        decode_request(memoryview(frame), APIS.supports)


def test_a_kio_duration_is_read_as_its_exact_milliseconds():
    # int(td.total_seconds() * 1000) reads 1001 ms as 1000 (and ~0.7% of all values one short).
    for ms in (*range(-3, 3000), 2**31 - 1):
        assert duration_ms(datetime.timedelta(milliseconds=ms)) == ms
