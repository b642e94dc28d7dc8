"""The hand-built Produce and Fetch responses decode with kio, field by field,
in every version the broker serves (so clients parse what we send)."""

import os
import uuid

import pytest

from broker.api.codec import (
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    FetchPartitionResult,
    ProducePartitionResult,
    encode_fetch_response,
    encode_produce_response,
)
from broker.api.metadata_codec import METADATA_MAX_VERSION, METADATA_MIN_VERSION, MetadataEncoder
from common.wire import FileSlice, RequestHeader, api_codec, decode_response, part_length
from storage.batch import build_batch


TOPIC_ID = uuid.UUID("5f1c0d3e-9a7b-4c2d-8e6f-0123456789ab")


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
    # Topics by name, and from v13 by id (the zero id reads as kio's None).
    first, other = ("tópico", "other") if version < 13 else (TOPIC_ID, uuid.UUID(int=0))
    frame = encode_produce_response(header, [
        (first, [ProducePartitionResult(0, 0, 42, -1, 7),
                 ProducePartitionResult(3, 6, -1, -1, -1, "not leader", current_leader=(2, 9))]),
        (other, []),
    ], node_endpoints=[(2, "host-2", 9093, "r2"), (5, "host-5", 9095, None)], throttle_ms=250)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    body = decode_response(memoryview(frame)[4:], api_codec(0, version), 77)
    (t1, t2) = body.responses
    if version < 13:
        assert t1.name == "tópico" and t2.name == "other"
    else:
        assert t1.topic_id == TOPIC_ID and t2.topic_id is None
    assert t2.partition_responses == ()
    p0, p3 = t1.partition_responses
    assert (p0.index, p0.error_code, p0.base_offset) == (0, 0, 42)
    assert (p3.index, p3.error_code, p3.base_offset) == (3, 6, -1)
    assert body.throttle_time.total_seconds() == 0.25
    if version >= 5:
        assert p0.log_start_offset == 7
    if version >= 8:
        assert p3.error_message == "not leader" and p0.error_message is None
    if version >= 10:  # KIP-951: where the leader went, and how to reach it
        assert (p3.current_leader.leader_id, p3.current_leader.leader_epoch) == (2, 9)
        assert (p0.current_leader.leader_id, p0.current_leader.leader_epoch) == (-1, -1)
        assert [(n.node_id, n.host, n.port, n.rack) for n in body.node_endpoints] == [
            (2, "host-2", 9093, "r2"), (5, "host-5", 9095, None)]


@pytest.mark.parametrize("version", range(8, PRODUCE_MAX_VERSION + 1))
def test_produce_record_errors_decode_with_kio(version):
    """KIP-467: the records that made a batch fail, by index, with a reason each."""
    header = _header(0, version)
    frame = encode_produce_response(header, [("t" if version < 13 else TOPIC_ID, [
        ProducePartitionResult(1, 87, error_message="record 2 of 3: no key",
                               record_errors=((2, "record 2 of 3: no key"), (5, None))),
        ProducePartitionResult(2, 0, 10, -1, 0),
    ])])
    (topic,) = decode_response(memoryview(frame)[4:], api_codec(0, version), 77).responses
    failed, ok = topic.partition_responses
    assert failed.error_code == 87 and failed.error_message == "record 2 of 3: no key"
    assert [(e.batch_index, e.batch_index_error_message) for e in failed.record_errors] == [
        (2, "record 2 of 3: no key"), (5, None)]
    assert ok.record_errors == () and ok.error_message is None and ok.base_offset == 10



@pytest.mark.parametrize("version", range(FETCH_MIN_VERSION, FETCH_MAX_VERSION + 1))
def test_fetch_response_decodes_with_kio(version, tmp_path):
    data = build_batch([(b"k%d" % i, b"v" * i, (), 1000 + i) for i in range(3)], base_offset=5)
    path = tmp_path / "seg"
    path.write_bytes(b"x" * 10 + data + b"y" * 3)
    with open(path, "rb") as f:
        header = _header(1, version)
        topic_key = TOPIC_ID if version >= 13 else "t"
        parts = encode_fetch_response(header, 0, 0, [
            (topic_key, [
                FetchPartitionResult(0, 0, 8, 8, 5, [FileSlice(f, 10, len(data))], ()),
                FetchPartitionResult(1, 6, -1, -1, -1, current_leader=(3, 9)),
                FetchPartitionResult(2, 0, 8, 8, 0, [data[: len(data)]], None, diverging_epoch=(4, 100)),
                # Only offsets (a follower's HW moved), and two batches of over 127 bytes in two parts.
                FetchPartitionResult(3, 0, 7, 7, 2),
                FetchPartitionResult(4, 0, 8, 8, 5, [FileSlice(f, 10, len(data)), b"", data], None),
            ]),
        ], node_endpoints=[(3, "h3", 9093, "r1"), (4, "h4", 9094, None)])
        frame = _join(parts)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4 == sum(part_length(p) for p in parts) - 4
    body = decode_response(memoryview(frame)[4:], api_codec(1, version), 77)
    (topic,) = body.responses
    if version >= 13:
        assert topic.topic_id == TOPIC_ID
    else:
        assert topic.topic == "t"
    if version >= 16:
        assert [(n.node_id, n.host, n.port, n.rack) for n in body.node_endpoints] == [
            (3, "h3", 9093, "r1"), (4, "h4", 9094, None)]
    p0, p1, p2, p3, p4 = topic.partitions
    assert bytes(p0.records) == data and bytes(p2.records) == data
    assert bytes(p4.records) == data + data and len(data + data) >= 127
    assert (p3.partition_index, p3.error_code, p3.high_watermark, p3.last_stable_offset) == (3, 0, 7, 7)
    assert not p3.records and p3.aborted_transactions is None
    assert (p0.partition_index, p0.error_code, p0.high_watermark, p0.last_stable_offset) == (0, 0, 8, 8)
    assert p1.error_code == 6 and not p1.records
    assert p0.aborted_transactions == () and p2.aborted_transactions is None
    if version >= 5:
        assert p0.log_start_offset == 5
    if version >= 12:
        assert (p1.current_leader.leader_id, p1.current_leader.leader_epoch) == (3, 9)
        assert (p2.diverging_epoch.epoch, p2.diverging_epoch.end_offset) == (4, 100)


# --- Metadata ---------------------------------------------------------------

def _metadata_image():
    from quorum.metadata.image import MetadataImage, PartitionRegistration, TopicImage
    from quorum.metadata.pmap import PMap

    topics = {
        "events": TopicImage("events", uuid.UUID(int=7), PMap({
            1: PartitionRegistration((3, 2), (3,), 3, 4, 9),
            0: PartitionRegistration((2, 3, 5), (2, 3), 2, 6, 11),
            2: PartitionRegistration((5, 3), (5,), 5, 1, 1),  # its leader is not live
        })),
        "__consumer_offsets": TopicImage("__consumer_offsets", uuid.UUID(int=8), PMap({
            0: PartitionRegistration((2,), (2,), 2, 0, 0)})),
    }
    return MetadataImage(offset=5, epoch=1, topics_by_id=PMap({t.topic_id: t for t in topics.values()}),
                         topic_ids_by_name=PMap({t.name: t.topic_id for t in topics.values()}))


@pytest.mark.parametrize("version", range(METADATA_MIN_VERSION, METADATA_MAX_VERSION + 1))
def test_metadata_response_decodes_with_kio_and_kept_topics_follow_the_image(version):
    import dataclasses

    from kio.schema.errors import ErrorCode

    from quorum.metadata.image import PartitionRegistration

    image = _metadata_image()
    encoder = MetadataEncoder()
    brokers = [(2, "127.0.0.1", 9092, None), (3, "127.0.0.2", 9093, "rack-b")]
    asked = [("events", None), ("missing", ErrorCode.unknown_topic_or_partition), ("__consumer_offsets", None)]

    def answer(image):
        frame = encoder.encode(77, version, image, brokers, "cluster-x", 3, asked, frozenset({"__consumer_offsets"}))
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        return decode_response(memoryview(frame)[4:], api_codec(3, version), 77)

    body = answer(image)
    assert [(b.node_id, b.host, b.port, b.rack) for b in body.brokers] == brokers
    assert body.controller_id == 3
    if version >= 2:
        assert body.cluster_id == "cluster-x"
    events, missing, offsets = body.topics
    assert (events.name, events.error_code, events.is_internal) == ("events", ErrorCode.none, False)
    assert (missing.name, missing.error_code, missing.partitions) == ("missing", ErrorCode.unknown_topic_or_partition, ())
    assert offsets.is_internal and [p.leader_id for p in offsets.partitions] == [2]
    if version >= 10:
        assert str(events.topic_id) == "00000000-0000-0000-0000-000000000007"
    rows = [(p.partition_index, p.error_code, p.leader_id, p.replica_nodes, p.isr_nodes) for p in events.partitions]
    assert rows == [(0, ErrorCode.none, 2, (2, 3, 5), (2, 3)), (1, ErrorCode.none, 3, (3, 2), (3,)),
                    (2, ErrorCode.leader_not_available, -1, (5, 3), (5,))]
    if version >= 5:
        assert [p.offline_replicas for p in events.partitions] == [(5,), (), (5,)]
    if version >= 7:
        assert [p.leader_epoch for p in events.partitions] == [6, 4, 1]

    # A new image that moves partition 2's leader: the answer follows it.
    topic = image.topic("events")
    moved = dataclasses.replace(topic, partitions=topic.partitions.set(2, PartitionRegistration((5, 3), (3,), 3, 2, 2)))
    image2 = dataclasses.replace(image, topics_by_id=image.topics_by_id.set(moved.topic_id, moved))
    again = answer(image2).topics[0].partitions[2]
    assert (again.error_code, again.leader_id) == (ErrorCode.none, 3)
    # A replica in a log dir its broker reports offline is an offline replica
    # (KIP-858); the kept bytes follow the brokers' offline dirs alone too.
    from quorum.metadata.image import BrokerRegistration
    from quorum.metadata.pmap import PMap
    from quorum.metadata.records import UNASSIGNED_DIR

    dead = uuid.UUID(int=99)
    placed = dataclasses.replace(moved, partitions=moved.partitions.set(0, PartitionRegistration(
        (2, 3, 5), (2, 3), 2, 6, 11, directories=(dead, uuid.UUID(int=98), UNASSIGNED_DIR))))
    image3 = dataclasses.replace(image2, topics_by_id=image2.topics_by_id.set(placed.topic_id, placed))
    reported = dataclasses.replace(image3, brokers=PMap({2: BrokerRegistration(
        2, 1, uuid.UUID(int=1), (), None, False, False, frozenset({dead}))}))
    if version >= 5:
        assert answer(image3).topics[0].partitions[0].offline_replicas == (5,)
        assert answer(reported).topics[0].partitions[0].offline_replicas == (2, 5)
        assert answer(image3).topics[0].partitions[0].offline_replicas == (5,)
    # So does a change of the live brokers alone (3 is no longer live).
    brokers.pop()
    assert [p.leader_id for p in answer(image2).topics[0].partitions] == [2, -1, -1]


@pytest.mark.parametrize("version", [8, 9, 12])
def test_metadata_partition_with_a_replica_list_too_long_for_a_one_byte_compact_length(version):
    """Replica arrays of 127 or more take a two-byte compact length (v9+):
    such a partition is encoded the long way and still decodes."""
    from quorum.metadata import MetadataImage
    from quorum.metadata.image import PartitionRegistration, TopicImage
    from quorum.metadata.pmap import PMap

    replicas = tuple(range(1, 131))
    topic = TopicImage("wide", uuid.UUID(int=9), PMap({
        0: PartitionRegistration(replicas, replicas[:127], 1, 3, 3),
        1: PartitionRegistration((1, 2), (1,), 1, 0, 0)}))
    image = MetadataImage(offset=1, epoch=1, topics_by_id=PMap({topic.topic_id: topic}),
                          topic_ids_by_name=PMap({"wide": topic.topic_id}))
    live = [(b, "127.0.0.1", 9000 + b, None) for b in replicas[:-1]]  # 130 is not live
    frame = MetadataEncoder().encode(5, version, image, live, "c", 1, [("wide", None)], frozenset())
    wide, narrow = decode_response(memoryview(frame)[4:], api_codec(3, version), 5).topics[0].partitions
    assert (wide.replica_nodes, wide.isr_nodes, wide.offline_replicas) == (replicas, replicas[:127], (130,))
    assert (wide.leader_id, narrow.leader_id, narrow.replica_nodes) == (1, 1, (1, 2))


@pytest.mark.parametrize("version", [9, 10, PRODUCE_MAX_VERSION])
def test_a_request_quota_throttle_lands_in_a_produce_answer_ending_with_leader_endpoints(version):
    """From v10 a Produce answer may end with tagged fields after
    throttle_time_ms (KIP-951): the request quota still sets it there."""
    from types import SimpleNamespace

    from broker.shell.request_quota import with_throttle

    header = _header(0, version)
    key = TOPIC_ID if version >= 13 else "t"
    frame = encode_produce_response(header, [(key, [ProducePartitionResult(0, 6, current_leader=(2, 4))])],
                                    node_endpoints=[(2, "host-2", 9093, None)])
    patched = with_throttle(SimpleNamespace(header=header), frame, 1500)
    body = decode_response(memoryview(patched)[4:], api_codec(0, version), 77)
    assert body.throttle_time.total_seconds() == 1.5
    assert only_error(body) == 6
    if version >= 10:
        assert [(n.node_id, n.host) for n in body.node_endpoints] == [(2, "host-2")]
        assert body.responses[0].partition_responses[0].current_leader.leader_id == 2


def only_error(body) -> int:
    (topic,) = body.responses
    (p,) = topic.partition_responses
    return p.error_code
