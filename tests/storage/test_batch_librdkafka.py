"""Interop with librdkafka (through confluent-kafka), every codec, no real broker.

librdkafka has a built-in mock cluster (`test.mock.num.brokers`) that listens
on 127.0.0.1 and stores produced batches as the client sent them. A real
librdkafka producer writes batches there; a minimal Fetch v4 client below
reads the raw bytes back for our decoder. The other way, a minimal Produce
v3 client stores our batches there and a real librdkafka consumer (with
`check.crcs`) reads them.
"""

import socket
import struct
import time

import pytest

from storage.batch import (
    build_batch,
    iter_batch_headers,
    iter_records,
    validate_batch,
)
from storage.record_validation import validate_client_batch

ck = pytest.importorskip("confluent_kafka")

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class _Wire:
    """Just enough of the Kafka protocol to produce and fetch raw batches."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=60)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def _call(self, api_key: int, version: int, body: bytes) -> bytes:
        self.correlation_id += 1
        msg = struct.pack(">hhi", api_key, version, self.correlation_id)
        msg += _string("raftka-test") + body
        self.sock.sendall(struct.pack(">i", len(msg)) + msg)
        (size,) = struct.unpack(">i", self._read(4))
        response = self._read(size)
        assert struct.unpack_from(">i", response)[0] == self.correlation_id
        return response[4:]

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "mock broker closed the connection"
            out += chunk
        return bytes(out)

    def produce(self, topic: str, records: bytes) -> tuple[int, int]:
        """Produce v3 to partition 0, acks=-1; returns (error_code, base_offset)."""
        body = struct.pack(">hhi", -1, -1, 10_000) + struct.pack(">i", 1) + _string(topic)
        body += struct.pack(">iii", 1, 0, len(records)) + records
        r = self._call(0, 3, body)
        pos = 4 + 2 + struct.unpack_from(">h", r, 4)[0] + 4
        _partition, error_code, base_offset = struct.unpack_from(">ihq", r, pos)
        return error_code, base_offset

    def fetch(self, topic: str, offset: int) -> bytes:
        """Fetch v4 from partition 0; returns the raw records bytes."""
        body = struct.pack(">iiiib", -1, 100, 1, 1 << 24, 0) + struct.pack(">i", 1)
        body += _string(topic) + struct.pack(">iiqi", 1, 0, offset, 1 << 24)
        r = self._call(1, 4, body)
        pos = 8 + 2 + struct.unpack_from(">h", r, 8)[0] + 4
        _partition, error_code, _hw, _lso = struct.unpack_from(">ihqq", r, pos)
        assert error_code == 0, f"fetch error {error_code}"
        pos += 22
        (aborted,) = struct.unpack_from(">i", r, pos)
        pos += 4 + max(0, aborted) * 16
        (size,) = struct.unpack_from(">i", r, pos)
        return r[pos + 4 : pos + 4 + size]


@pytest.fixture(scope="module")
def mock_cluster():
    owner = ck.Producer({"test.mock.num.brokers": 1, "log_level": 3})
    (broker,) = owner.list_topics(timeout=60).brokers.values()
    yield f"{broker.host}:{broker.port}"
    owner.flush(1)


@pytest.fixture
def wire(mock_cluster):
    host, port = mock_cluster.rsplit(":", 1)
    w = _Wire(host, int(port))
    yield w
    w.close()


def _records(n):
    return [
        (
            f"k{i}".encode() if i % 5 else None,
            (b"value %d " % i) * (1 + i % 13) if i % 7 else None,
            [("h", str(i).encode()), ("null", None)] if i % 3 else [],
            1_700_000_000_000 + i * 2 - (i % 3),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_we_read_librdkafka_batches(mock_cluster, wire, codec):
    topic = f"from-librdkafka-{codec}"
    records = _records(300)
    producer = ck.Producer(
        {
            "bootstrap.servers": mock_cluster,
            "compression.type": codec,
            "linger.ms": 20,
            "log_level": 3,
        }
    )
    for key, value, headers, ts in records:
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=0)
    assert producer.flush(60) == 0
    got = []
    # A Fetch may answer with fewer batches than the log holds (the mock
    # broker once sent only the first under the full suite's load): fetch
    # on from the next offset, a bounded number of times.
    for _ in range(100):
        start = len(got)
        raw = wire.fetch(topic, start)
        for pos, header in iter_batch_headers(raw):
            assert validate_batch(raw, pos, from_client=True) == header
            # Every record passes the produce path's checks, and the header's
            # max timestamp is the records' (no rewrite on the hot path).
            one = raw[pos : pos + header.size_in_bytes]
            assert validate_client_batch(one, int(time.time() * 1000)) is None
            assert header.compression == CODECS.index(codec)
            # The batch holding `start` comes whole: skip what we have.
            got.extend(r for r in iter_records(raw, pos) if r.offset >= start)
        if len(got) >= 300:
            break
        time.sleep(0.05)
    assert [r.offset for r in got] == list(range(300))
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in got] == records


def _create_topic(bootstrap, topic):
    """The mock cluster creates a topic when a client asks for its metadata."""
    client = ck.Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    partitions = client.list_topics(topic, timeout=60).topics[topic].partitions
    assert 0 in partitions, partitions


def _consume(bootstrap, topic, count):
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "raftka-test",
            "enable.auto.commit": False,
            "check.crcs": True,
            "log_level": 3,
        }
    )
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_reads_our_batches(mock_cluster, wire, codec):
    topic = f"from-raftka-{codec}"
    records = _records(120)
    first, second = records[:100], records[100:]
    _create_topic(mock_cluster, topic)
    for part in (first, second):
        error_code, _ = wire.produce(topic, build_batch(part, compression=CODECS.index(codec)))
        assert error_code == 0
    got = _consume(mock_cluster, topic, len(records))
    assert [m.offset() for m in got] == list(range(120))
    assert [(m.key(), m.value(), m.headers() or [], m.timestamp()) for m in got] == [
        (k, v, h, (ck.TIMESTAMP_CREATE_TIME, t)) for k, v, h, t in records
    ]
