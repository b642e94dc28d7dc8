"""Malformed and mutated requests against a live broker: every request gets
a well-formed response or a closed connection, no handler crashes, the log
stays intact, and a good client (kafka-python) is served afterwards."""

import datetime
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.delete_topics.v6 import request as dt6
from kio.schema.describe_cluster.v1 import request as dcl1
from kio.schema.describe_configs.v4 import request as dc4
from kio.schema.init_producer_id.v4 import request as ip4
from kio.schema.metadata.v8 import request as md8
from kio.schema.offset_for_leader_epoch.v4 import request as ofle4

from broker_testing import BrokerThread, batch, fetch_request, list_offsets_request, produce_request
from common.wire import RemoteProtocolError, api_codec, decode_request, decode_response, encode_request
from storage.batch import iter_batch_headers, validate_batch

CORRELATION_ID = 0x5EED
SEEDS = [
    produce_request("data", 0, batch(3)),
    produce_request("data", 1, batch(2), acks=-1, timeout_ms=1000),
    fetch_request([("data", 0, 0, 1 << 20, -1), ("data", 1, 1, 100, 0)], max_wait_ms=100),
    list_offsets_request("data", 0, -3),
    md8.MetadataRequest(topics=(md8.MetadataRequestTopic(name="data"),), allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False, include_topic_authorized_operations=False),
    ofle4.OffsetForLeaderEpochRequest(replica_id=-1, topics=(ofle4.OffsetForLeaderTopic(topic="data", partitions=(
        ofle4.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0),)),)),
    ip4.InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=1)),
    dc4.DescribeConfigsRequest(resources=(dc4.DescribeConfigsResource(resource_type=2, resource_name="data",
                                                                      configuration_keys=None),),
                               include_synonyms=True, include_documentation=True),
    dcl1.DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=1),
    dt6.DeleteTopicsRequest(topics=(dt6.DeleteTopicState(name="other", topic_id=None),),
                            timeout=datetime.timedelta(seconds=1)),
]
SEED_FRAMES = [encode_request(CORRELATION_ID, "fuzz", r)[4:] for r in SEEDS]


@st.composite
def frames(draw):
    frame = bytearray(draw(st.sampled_from(SEED_FRAMES)))
    kind = draw(st.sampled_from(["flip", "flip", "truncate", "extend", "body"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            # Keep the correlation id (bytes 4..8) so answers can be matched.
            position = draw(st.sampled_from([p for p in range(len(frame)) if not 4 <= p < 8]))
            frame[position] = draw(st.integers(0, 255))
    elif kind == "truncate":
        frame = frame[: draw(st.integers(10, len(frame) - 1))]
    elif kind == "extend":
        frame += draw(st.binary(min_size=1, max_size=20))
    else:
        header_end = 10 + struct.unpack_from(">h", frame, 8)[0] + (1 if frame[-1:] else 0)
        frame = frame[: min(header_end, len(frame))] + bytearray(draw(st.binary(max_size=80)))
    return bytes(frame)


def exchange(port: int, frame: bytes, timeout_s: float) -> tuple[str, bytes]:
    """Send one framed request; ("response", body) | ("closed", b"") | ("silent", b"")."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return "closed", b""
                data += chunk
                if len(data) >= 4 and len(data) >= 4 + struct.unpack_from(">i", data)[0]:
                    return "response", data[4:]
        except socket.timeout:
            return "silent", b""
        except ConnectionResetError:
            return "closed", b""


@pytest.fixture(scope="module")
def live_broker(tmp_path_factory):
    with BrokerThread(tmp_path_factory.mktemp("fuzz"), topics={"data": 2}) as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1)
        for i in range(50):
            producer.send("data", key=b"k%d" % i, value=b"before-fuzz-%d" % i, partition=i % 2)
        producer.flush()
        producer.close()
        yield broker


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
@given(frame=frames())
def test_mutated_requests_get_an_answer_or_a_closed_connection(live_broker, frame):
    apis = live_broker.running.broker.apis
    try:
        request = decode_request(memoryview(frame), apis.supports)
    except RemoteProtocolError:
        request = None
    outcome, body = exchange(live_broker.port, frame, timeout_s=3)
    stats = live_broker.running.broker.server.stats
    assert stats.handler_failures == 0
    if request is None:
        assert outcome == "closed"
        return
    header = request.header
    may_be_silent = (header.api_key == 0 and request.body.acks == 0) or (
        header.api_key == 1 and request.body.max_wait.total_seconds() > 2)
    if outcome == "silent":
        assert may_be_silent
        return
    if header.api_key == 0 and request.body.acks == 0:
        assert outcome == "closed"  # only an acks=0 produce that failed closes
        return
    assert outcome == "response", (header, request.body)
    decode_response(memoryview(body), api_codec(header.api_key, header.api_version), CORRELATION_ID)


def test_oversized_and_garbage_frames_close_only_their_connection(live_broker):
    with socket.create_connection(("127.0.0.1", live_broker.port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", 200 << 20))  # over socket.request.max.bytes, refused unread
        assert sock.recv(10) == b""
    assert exchange(live_broker.port, b"\x00\x03\x00\x08junk", 3)[0] == "closed"


def test_good_client_is_served_after_the_fuzz(live_broker):
    consumer = KafkaConsumer(bootstrap_servers=live_broker.bootstrap, enable_auto_commit=False)
    consumer.assign([TopicPartition("data", 0), TopicPartition("data", 1)])
    consumer.seek_to_beginning()
    values = []
    for _ in range(50):
        for messages in consumer.poll(timeout_ms=200).values():
            values += [m.value for m in messages]
        if len([v for v in values if v.startswith(b"before-fuzz-")]) == 50:
            break
    consumer.close()
    assert {v for v in values if v.startswith(b"before-fuzz-")} == {b"before-fuzz-%d" % i for i in range(50)}
    # Every batch the fuzz got into the log is a whole, valid batch.
    for partition in (0, 1):
        log = live_broker.running.partition("data", partition).log
        data = live_broker.call(log.read_bytes, 0, 1 << 30)
        for position, _header in iter_batch_headers(data):
            validate_batch(data, position)
