"""A batch whose CRC holds but whose records do not parse is refused whole,
and the partition stays good for everyone (a `raftka dev` process, raw
frames for the malformed batches, confluent-kafka for the rest).

What an independent protocol fuzzer once found accepted, each case on its
own partition: the broker answers INVALID_RECORD (CORRUPT_MESSAGE when the
CRC does not hold), appends nothing, keeps the connection, and a good batch
on the same connection lands at the next offset; a confluent-kafka consumer
from the beginning then gets every good record, and ListOffsets by
timestamp answers on that partition.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from aiokafka.record.default_records import DefaultRecordBatch as AioRecordBatch
from kafka.record.default_records import DefaultRecordBatch
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as lr
from kio.schema.produce.v3 import request as pr3
from kio.schema.produce.v9 import request as pr9

from common.wire import api_codec, decode_response, encode_request
from storage.batch import CRC_OFFSET, CRC_START_OFFSET, HEADER_SIZE, build_batch, iter_records
from storage.batch_records import encode_record
from storage.compression import compress

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC = "integrity"
COMPACTED = "integrity-compacted"
FUZZED = "integrity-fuzzed"
NOW_MS = int(time.time() * 1000)
SOAK = os.environ.get("RAFTKA_SOAK") == "1"


# --- malformed batches, each with a CRC that holds ---


def _section(*records) -> bytes:
    """Records as (offset_delta, key, value, timestamp_delta)."""
    out = bytearray()
    for offset_delta, key, value, timestamp_delta in records:
        encode_record(out, timestamp_delta, offset_delta, key, value, ())
    return bytes(out)


def _batch(section: bytes, count: int, *, attributes: int = 0, base_timestamp: int = NOW_MS) -> bytes:
    out = bytearray(struct.pack(">qiibIhiqqqhii", 0, HEADER_SIZE - 12 + len(section), -1, 2, 0, attributes,
                                count - 1, base_timestamp, base_timestamp, -1, -1, -1, count) + section)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START_OFFSET:]))
    return bytes(out)


TWO = _section((0, b"a", b"1", 0), (1, b"b", b"2", 0))
THREE = _section((0, b"a", b"1", 0), (1, b"b", b"2", 0), (2, b"c", b"3", 0))
MALFORMED = {
    "three-records-over-two-bytes": _batch(b"\x00\x00", 3),
    "record-length-past-the-section": _batch(b"\x7e" + TWO[1:], 2),
    "fewer-records-than-claimed": _batch(TWO, 3),
    "more-records-than-claimed": _batch(THREE, 2),
    "offset-deltas-repeat": _batch(_section((0, b"a", b"1", 0), (0, b"b", b"2", 0)), 2),
    "offset-deltas-start-at-one": _batch(_section((1, b"a", b"1", 0), (2, b"b", b"2", 0)), 2),
    **{f"garbage-under-{name}": _batch(b"these bytes are no %s stream" % name.encode(), 2, attributes=codec)
       for codec, name in ((1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd"))},
    **{f"garbage-records-under-{name}": _batch(compress(codec, b"\x02\x00garbage records"), 2, attributes=codec)
       for codec, name in ((1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd"))},
}
# One partition per (case, Produce version), and one more.
PARTITIONS = 2 * len(MALFORMED) + 1


# --- a broker process and a raw connection ---


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("integrity")
    with open(data_dir / "stderr.log", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "raftka.cli", "dev", "--data-dir", str(data_dir), "--port", "0"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY bootstrap="), (line, (data_dir / "stderr.log").read_text())
        address = line.strip().split("=", 1)[1]
        admin = AdminClient({"bootstrap.servers": address})
        futures = admin.create_topics([
            NewTopic(TOPIC, PARTITIONS, 1),
            NewTopic(COMPACTED, 1, 1, config={"cleanup.policy": "compact"}),
            NewTopic(FUZZED, 1, 1),
        ])
        for future in futures.values():
            future.result(30)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


class RawConnection:
    """One Kafka connection speaking kio entities: the only way to send a
    batch no client library would write."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0

    def request(self, request):
        self.correlation_id += 1
        self.sock.sendall(encode_request(self.correlation_id, "integrity-test", request))
        size = struct.unpack(">i", self._read(4))[0]
        codec = api_codec(request.__api_key__, request.__version__)
        return decode_response(memoryview(self._read(size)), codec, self.correlation_id)

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the broker closed the connection"
            out += chunk
        return bytes(out)

    def produce(self, topic: str, partition: int, records: bytes, version: int = 9):
        """The partition's answer to an acks=all Produce of `records`."""
        pr = pr9 if version == 9 else pr3
        response = self.request(pr.ProduceRequest(
            transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
            topic_data=(pr.TopicProduceData(name=topic, partition_data=(
                pr.PartitionProduceData(index=partition, records=records),)),)))
        (topic_response,) = response.responses
        (answer,) = topic_response.partition_responses
        return answer

    def list_offset(self, topic: str, partition: int, timestamp: int):
        response = self.request(lr.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(lr.ListOffsetsTopic(
            name=topic, partitions=(lr.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                                                            timestamp=timestamp),)),)))
        (topic_response,) = response.topics
        (answer,) = topic_response.partitions
        assert answer.error_code == ErrorCode.none, answer
        return answer

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(bootstrap):
    conn = RawConnection(bootstrap)
    yield conn
    conn.close()


def consume_from_beginning(bootstrap: str, topic: str, partition: int, count: int) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "integrity", "enable.auto.commit": False,
                         "check.crcs": True, "log_level": 3})
    consumer.assign([TopicPartition(topic, partition, 0)])
    got = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
        times = consumer.offsets_for_times([TopicPartition(topic, partition, NOW_MS + 1)], timeout=10)
    finally:
        consumer.close()
    return got, times[0]


# --- the tests ---


@pytest.mark.parametrize("version", [3, 9])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_batch_whose_records_do_not_parse_is_refused_and_the_partition_stays_good(bootstrap, raw, case, version):
    partition = 2 * sorted(MALFORMED).index(case) + (version == 9)
    before = raw.list_offset(TOPIC, partition, -1).offset
    answer = raw.produce(TOPIC, partition, MALFORMED[case], version)
    assert answer.error_code == ErrorCode.invalid_record, answer
    if version == 9:
        assert "record" in answer.error_message
    assert raw.list_offset(TOPIC, partition, -1).offset == before, "nothing may be appended"
    # The same connection goes on: the next good batch lands at the next offset.
    good = build_batch([(b"good-%d" % i, b"after %s" % case.encode(), (), NOW_MS + i) for i in range(2)])
    answer = raw.produce(TOPIC, partition, good, version)
    assert (answer.error_code, answer.base_offset) == (ErrorCode.none, before)
    found = raw.list_offset(TOPIC, partition, NOW_MS + 1)
    assert (found.offset, found.timestamp) == (before + 1, NOW_MS + 1)
    got, by_time = consume_from_beginning(bootstrap, TOPIC, partition, before + 2)
    assert [m.offset() for m in got] == list(range(before + 2))
    assert [m.value() for m in got[-2:]] == [b"after %s" % case.encode()] * 2
    assert by_time.offset == before + 1


def test_a_batch_whose_crc_does_not_hold_is_corrupt_message(raw):
    partition = PARTITIONS - 1
    damaged = bytearray(build_batch([(b"k", b"v", (), NOW_MS)]))
    damaged[-1] ^= 0xFF
    answer = raw.produce(TOPIC, partition, bytes(damaged))
    assert answer.error_code == ErrorCode.corrupt_message and "CRC" in answer.error_message
    assert raw.produce(TOPIC, partition, build_batch([(b"k", b"v", (), NOW_MS)])).error_code == ErrorCode.none


def _deliver(bootstrap: str, topic: str, **produce) -> KafkaError | None:
    outcome = []
    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0, "log_level": 3})
    producer.produce(topic, value=b"v", on_delivery=lambda err, msg: outcome.append(err), **produce)
    assert producer.flush(30) == 0
    return outcome[0]


def test_a_compacted_topic_refuses_a_record_without_a_key(bootstrap):
    error = _deliver(bootstrap, COMPACTED)
    assert error is not None and error.code() == KafkaError.INVALID_RECORD, error
    assert _deliver(bootstrap, COMPACTED, key=b"k") is None


def test_a_timestamp_too_far_ahead_is_refused(bootstrap):
    """Kafka 4.0's default message.timestamp.after.max.ms: an hour."""
    error = _deliver(bootstrap, TOPIC, partition=PARTITIONS - 1, timestamp=int(time.time() * 1000) + 2 * 3_600_000)
    assert error is not None and error.code() == KafkaError.INVALID_TIMESTAMP, error
    assert _deliver(bootstrap, TOPIC, partition=PARTITIONS - 1, timestamp=int(time.time() * 1000)) is None


def test_valid_batches_are_accepted_and_mutated_ones_refused_or_readable(bootstrap, raw):
    """Mutations of a valid batch's records section (the CRC made to hold
    again): the broker refuses each with INVALID_RECORD / INVALID_TIMESTAMP
    and appends nothing, or stores records that our reader, kafka-python's
    and aiokafka's all decode; without mutations it always accepts. After
    each, a good batch lands at the next offset, and librdkafka reads the
    whole partition at the end. Longer under RAFTKA_SOAK=1."""

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], **({"max_examples": 2000} if SOAK else {}))
    @given(
        n=st.integers(1, 6),
        codec=st.sampled_from([0, 1, 2, 3, 4]),
        edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    )
    def one_batch(n, codec, edits):
        records = [(b"key-%d" % i if i % 3 else None, b"value %d" % i * (i + 1), (), i) for i in range(n)]
        section = bytearray(_section(*((i, k, v, t) for i, (k, v, _, t) in enumerate(records))))
        for at, value in edits:
            section[at % len(section)] = value
        body = compress(codec, bytes(section)) if codec else bytes(section)
        before = raw.list_offset(FUZZED, 0, -1).offset
        answer = raw.produce(FUZZED, 0, _batch(body, n, attributes=codec, base_timestamp=NOW_MS))
        if answer.error_code != ErrorCode.none:
            assert edits, answer
            assert answer.error_code in (ErrorCode.invalid_record, ErrorCode.invalid_timestamp), answer
            assert raw.list_offset(FUZZED, 0, -1).offset == before
            after = before
        else:
            assert answer.base_offset == before
            (topic,) = raw.request(_fetch(FUZZED, before)).responses
            (partition,) = topic.partitions
            data = bytes(partition.records)
            assert [r.offset for r in iter_records(data)] == list(range(before, before + n))
            assert [r.offset for r in DefaultRecordBatch(data)] == list(range(before, before + n))
            assert [r.offset for r in AioRecordBatch(data)] == list(range(before, before + n))
            after = before + n
        good = raw.produce(FUZZED, 0, build_batch([(b"good", b"after", (), NOW_MS)]))
        assert (good.error_code, good.base_offset) == (ErrorCode.none, after)

    one_batch()
    end = raw.list_offset(FUZZED, 0, -1).offset
    got, _ = consume_from_beginning(bootstrap, FUZZED, 0, end)
    assert [m.offset() for m in got] == list(range(end))


def _fetch(topic: str, offset: int):
    from kio.schema.fetch.v12 import request as fr
    return fr.FetchRequest(replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
                           topics=(fr.FetchTopic(topic=topic, partitions=(fr.FetchPartition(
                               partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                               log_start_offset=-1, partition_max_bytes=1 << 20),)),))
