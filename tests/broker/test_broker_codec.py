"""The hand-built Produce and Fetch responses decode with kio, field by field,
in every version the broker serves (so clients parse what we send)."""

import os

import pytest

from broker.codec import (
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    FetchPartitionResult,
    ProducePartitionResult,
    encode_fetch_response,
    encode_produce_response,
)
from raftka.wire import FileSlice, RequestHeader, api_codec, decode_response, part_length
from storage.batch import build_batch


def _header(api_key, version):
    codec = api_codec(api_key, version)
    return RequestHeader(api_key, version, 77, "c", codec.request_header_version)


def _join(parts):
    out = bytearray()
    for p in parts:
        if isinstance(p, FileSlice):
            out += os.pread(p.file.fileno(), p.count, p.offset)
        else:
            out += p
    return bytes(out)


@pytest.mark.parametrize("version", range(PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION + 1))
def test_produce_response_decodes_with_kio(version):
    header = _header(0, version)
    frame = encode_produce_response(header, [
        ("tópico", [ProducePartitionResult(0, 0, 42, -1, 7), ProducePartitionResult(3, 6, -1, -1, -1, "not leader")]),
        ("other", []),
    ])
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    body = decode_response(memoryview(frame)[4:], api_codec(0, version), 77)
    (t1, t2) = body.responses
    assert t1.name == "tópico" and t2.name == "other" and t2.partition_responses == ()
    p0, p3 = t1.partition_responses
    assert (p0.index, p0.error_code, p0.base_offset) == (0, 0, 42)
    assert (p3.index, p3.error_code, p3.base_offset) == (3, 6, -1)
    if version >= 5:
        assert p0.log_start_offset == 7
    if version >= 8:
        assert p3.error_message == "not leader" and p0.error_message is None


@pytest.mark.parametrize("version", range(FETCH_MIN_VERSION, FETCH_MAX_VERSION + 1))
def test_fetch_response_decodes_with_kio(version, tmp_path):
    data = build_batch([(b"k%d" % i, b"v" * i, (), 1000 + i) for i in range(3)], base_offset=5)
    path = tmp_path / "seg"
    path.write_bytes(b"x" * 10 + data + b"y" * 3)
    with open(path, "rb") as f:
        header = _header(1, version)
        parts = encode_fetch_response(header, 0, 0, [
            ("t", [
                FetchPartitionResult(0, 0, 8, 8, 5, [FileSlice(f, 10, len(data))], ()),
                FetchPartitionResult(1, 6, -1, -1, -1, current_leader=(3, 9)),
                FetchPartitionResult(2, 0, 8, 8, 0, [data[: len(data)]], None, diverging_epoch=(4, 100)),
            ]),
        ])
        frame = _join(parts)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4 == sum(part_length(p) for p in parts) - 4
    body = decode_response(memoryview(frame)[4:], api_codec(1, version), 77)
    (topic,) = body.responses
    assert topic.topic == "t"
    p0, p1, p2 = topic.partitions
    assert bytes(p0.records) == data and bytes(p2.records) == data
    assert (p0.partition_index, p0.error_code, p0.high_watermark, p0.last_stable_offset) == (0, 0, 8, 8)
    assert p1.error_code == 6 and not p1.records
    assert p0.aborted_transactions == () and p2.aborted_transactions is None
    if version >= 5:
        assert p0.log_start_offset == 5
    if version >= 12:
        assert (p1.current_leader.leader_id, p1.current_leader.leader_epoch) == (3, 9)
        assert (p2.diverging_epoch.epoch, p2.diverging_epoch.end_offset) == (4, 100)
