"""Interop with kafka-python's own v2 batch encoder and decoder.

kafka-python 3 ships gzip support only; snappy, lz4 and zstd need the pip
packages `python-snappy`, `lz4` and `zstandard`. Codecs it cannot run are
skipped here (librdkafka covers them in test_batch_librdkafka.py), except
snappy: python-snappy >= 0.7 is itself a thin layer over cramjam, so when it
is absent kafka-python's xerial framing code runs on cramjam's raw snappy
blocks, the way python-snappy would supply them.
"""

import struct

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from storage.batch import (
    ControlRecordType,
    build_batch,
    build_control_batch,
    iter_records,
    set_base_offset,
    validate_batch,
)
from storage.record_validation import validate_client_batch

_PIP_PACKAGE = {2: "python-snappy", 3: "lz4", 4: "zstandard"}
_HAS_CODEC = {
    0: lambda: True,
    1: kafka_codec.has_gzip,
    2: kafka_codec.has_snappy,
    3: kafka_codec.has_lz4,
    4: kafka_codec.has_zstd,
}


class _CramjamSnappy:
    """The two calls kafka-python makes on the `snappy` module."""

    @staticmethod
    def compress(data):
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data):
        return bytes(cramjam.snappy.decompress_raw(data))


@pytest.fixture
def kafka_python_codec(request, monkeypatch):
    codec = request.param
    if codec == 2 and not kafka_codec.has_snappy():
        monkeypatch.setattr(kafka_codec, "snappy", _CramjamSnappy)
    if not _HAS_CODEC[codec]():
        pytest.skip(f"kafka-python needs the pip package {_PIP_PACKAGE[codec]} for this codec")
    return codec


def _records(n):
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"user-{i}".encode()
        value = None if i % 11 == 5 else (b"payload %d " % i) * (1 + i % 9)
        headers = [("trace", f"t{i}".encode()), ("empty", None)] if i % 2 else []
        out.append((key, value, headers, 1_700_000_000_000 + 3 * i - (i % 4)))
    return out


def _kafka_python_batch(records, codec, **producer_state):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=producer_state.get("is_transactional", False),
        producer_id=producer_state.get("producer_id", -1),
        producer_epoch=producer_state.get("producer_epoch", -1),
        base_sequence=producer_state.get("base_sequence", -1),
        batch_size=1 << 24,
    )
    for offset, (key, value, headers, ts) in enumerate(records):
        assert builder.append(offset, ts, key, value, headers) is not None
    return bytes(builder.build())


ALL_CODECS = pytest.mark.parametrize(
    "kafka_python_codec", [0, 1, 2, 3, 4], indirect=True, ids=lambda c: f"codec{c}"
)


@ALL_CODECS
def test_we_read_kafka_python_batches(kafka_python_codec):
    records = _records(200)
    raw = bytearray(_kafka_python_batch(records, kafka_python_codec))
    set_base_offset(raw, 5000)
    h = validate_batch(raw, from_client=True)
    assert h.compression == kafka_python_codec, "kafka-python sends compressible data compressed"
    assert (h.records_count, h.last_offset) == (200, 5199)
    assert h.max_timestamp == max(r[3] for r in records)
    assert validate_client_batch(raw, 1_700_000_001_000) is None
    got = list(iter_records(raw))
    assert [r.offset for r in got] == list(range(5000, 5200))
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in got] == records


@ALL_CODECS
def test_kafka_python_reads_our_batches(kafka_python_codec):
    records = _records(200)
    ours = build_batch(
        records,
        base_offset=77,
        compression=kafka_python_codec,
        producer_id=42,
        producer_epoch=3,
        base_sequence=10,
        is_transactional=True,
    )
    theirs = DefaultRecordBatch(ours)
    assert theirs.validate_crc()
    assert theirs.compression_type == kafka_python_codec
    assert (theirs.base_offset, theirs.last_offset, theirs.records_count) == (77, 276, 200)
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (42, 3, 10)
    assert theirs.is_transactional and not theirs.is_control_batch
    got = [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in theirs]
    assert got == [(77 + i, k, v, h, t) for i, (k, v, h, t) in enumerate(records)]


@pytest.mark.parametrize("marker", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_kafka_python_reads_our_transaction_markers(marker):
    end_txn_marker = struct.pack(">hi", 0, 17)  # version 0, coordinator epoch
    ours = build_control_batch(
        marker, end_txn_marker, base_offset=30, producer_id=4, producer_epoch=1
    )
    theirs = DefaultRecordBatch(ours)
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    (record,) = list(theirs)
    assert (record.offset, record.version, record.type) == (30, 0, marker)
    assert (record.commit, record.abort) == (marker == 1, marker == 0)


def test_kafka_python_producer_state_fields():
    raw = _kafka_python_batch(
        _records(3), 0, producer_id=9, producer_epoch=2, base_sequence=40, is_transactional=True
    )
    h = validate_batch(raw)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 2, 40)
    assert h.is_transactional


_blobs = st.none() | st.binary(max_size=200)
_record = st.tuples(
    _blobs,
    _blobs,
    st.lists(st.tuples(st.text(max_size=8), _blobs), max_size=3),
    st.integers(min_value=0, max_value=2**41),
)


@given(records=st.lists(_record, min_size=1, max_size=15), codec=st.sampled_from([0, 1]))
def test_random_records_both_ways(records, codec):
    theirs = _kafka_python_batch(records, codec)
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in iter_records(theirs)] == [
        (k, v, h, t) for k, v, h, t in records
    ]
    ours = DefaultRecordBatch(build_batch(records, compression=codec))
    assert ours.validate_crc()
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in ours] == records
