"""Compaction of single batches (storage.batch_filter): what survives, what
the rewritten batch says, and that a Kafka client still reads it."""

import pytest
from kafka.record.default_records import DefaultRecordBatch

from storage.batch import (
    ControlRecordType,
    build_batch,
    build_control_batch,
    iter_records,
    parse_header,
    validate_batch,
)
from storage.batch_filter import DELETE_HORIZON_MASK, delete_horizon_ms, empty_batch, filter_batch
from storage.offset_map import OffsetMap

TS = 1_700_000_000_000
NOW = TS + 5_000
RETENTION_MS = 1_000


def batch(records, base_offset=100, codec=0, **kwargs):
    raw = build_batch(
        [(k, v, (("h", b"x"),), TS + i * 10) for i, (k, v) in enumerate(records)],
        base_offset=base_offset,
        compression=codec,
        **kwargs,
    )
    return raw, parse_header(raw)


def offset_map(**newest):
    m = OffsetMap(1 << 20)
    for key, offset in newest.items():
        m.put(key.encode(), offset)
    return m


def clean(raw, header, m, now=NOW, keep_if_empty=False):
    return filter_batch(raw, header, m, now, RETENTION_MS, keep_if_empty)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_superseded_records_go_offsets_and_codec_stay(codec):
    raw, header = batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", b"4")], codec=codec)
    result = clean(raw, header, offset_map(a=102, b=500, c=103))
    out = parse_header(result.batch)
    validate_batch(result.batch)
    assert (out.base_offset, out.last_offset_delta, out.records_count) == (100, 3, 2)
    assert out.compression == codec
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in iter_records(result.batch)] == [
        (102, b"a", b"3", TS + 20, (("h", b"x"),)),
        (103, b"c", b"4", TS + 30, (("h", b"x"),)),
    ]
    assert (result.records_kept, result.records_removed) == (2, 2)


def test_untouched_batch_is_returned_as_is():
    raw, header = batch([(b"a", b"1"), (b"b", b"2")])
    result = clean(raw, header, offset_map(a=100, b=99))
    assert result.batch is raw and result.records_removed == 0


def test_keyless_records_go():
    raw, header = batch([(None, b"1"), (b"b", b"2")])
    result = clean(raw, header, offset_map())
    assert [r.key for r in iter_records(result.batch)] == [b"b"]


def test_tombstone_gets_a_delete_horizon_then_goes_after_it():
    raw, header = batch([(b"a", None), (b"b", b"2")])
    first = clean(raw, header, offset_map(a=100, b=101))
    stamped = parse_header(first.batch)
    assert stamped.attributes & DELETE_HORIZON_MASK
    assert delete_horizon_ms(stamped) == first.delete_horizon_ms == NOW + RETENTION_MS
    # Every record keeps its timestamp: deltas are rewritten against the horizon.
    assert [r.timestamp for r in iter_records(first.batch)] == [TS, TS + 10]
    assert delete_horizon_ms(header) is None

    again = clean(first.batch, stamped, offset_map(), now=NOW + RETENTION_MS - 1)
    assert again.batch is first.batch  # still kept, horizon already set
    gone = clean(first.batch, stamped, offset_map(), now=NOW + RETENTION_MS)
    out = parse_header(gone.batch)
    assert [r.key for r in iter_records(gone.batch)] == [b"b"]
    assert not out.attributes & DELETE_HORIZON_MASK and gone.delete_horizon_ms is None


def test_emptied_batch_disappears_unless_it_is_a_producers_last():
    raw, header = batch([(b"a", b"1"), (b"a", b"2")], producer_id=42, producer_epoch=3, base_sequence=17)
    m = offset_map(a=900)
    assert clean(raw, header, m).batch is None
    kept = clean(raw, header, m, keep_if_empty=True).batch
    out = validate_batch(kept)
    assert (out.records_count, out.last_offset_delta, out.base_offset) == (0, 1, 100)
    assert (out.producer_id, out.producer_epoch, out.base_sequence) == (42, 3, 17)
    assert out.max_timestamp == header.max_timestamp
    assert list(iter_records(kept)) == []
    assert kept == empty_batch(header)


def test_control_batches_are_left_alone():
    raw = build_control_batch(ControlRecordType.COMMIT, b"\x00\x00\x00\x00\x00\x01", base_offset=7)
    result = clean(raw, parse_header(raw), offset_map())
    assert result.batch is raw


@pytest.mark.parametrize("keep_if_empty", [False, True])
def test_kafka_python_reads_compacted_batches(keep_if_empty):
    """A client reads a rewritten batch (fewer records, delete horizon
    set) and an empty one: offsets and timestamps as written."""
    raw, header = batch(
        [(b"a", b"x"), (b"b", b"2"), (b"a", None), (b"b", b"3")], codec=1, producer_id=5, producer_epoch=0,
        base_sequence=0,
    )
    stamped = clean(raw, header, offset_map(a=102, b=103)).batch
    assert parse_header(stamped).attributes & DELETE_HORIZON_MASK
    parsed = DefaultRecordBatch(bytearray(stamped))
    assert parsed.validate_crc()
    assert [(r.offset, r.key, r.value, r.timestamp) for r in parsed] == [
        (102, b"a", None, TS + 20),
        (103, b"b", b"3", TS + 30),
    ]
    if keep_if_empty:
        empty = clean(raw, header, offset_map(a=900, b=900), keep_if_empty=True).batch
        parsed = DefaultRecordBatch(bytearray(empty))
        assert parsed.validate_crc() and list(parsed) == []
        assert parsed.base_offset == 100 and parsed.last_offset_delta == 3


def test_librdkafka_reads_a_compacted_batch():
    """librdkafka's consumer (mock cluster, no real broker) reads a batch
    with a record removed and a delete horizon set: offsets and
    timestamps as written. (The mock broker refuses empty batches on
    produce, so those are covered by kafka-python above.)"""
    ck = pytest.importorskip("confluent_kafka")
    from test_batch_librdkafka import _consume, _create_topic, _Wire

    owner = ck.Producer({"test.mock.num.brokers": 1, "log_level": 3})
    (broker,) = owner.list_topics(timeout=10).brokers.values()
    bootstrap = f"{broker.host}:{broker.port}"
    _create_topic(bootstrap, "compacted")
    raw, header = batch([(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"c", b"3")], base_offset=0, codec=1)
    out = clean(raw, header, offset_map(a=2, b=1, c=3)).batch
    wire = _Wire(broker.host, broker.port)
    try:
        assert wire.produce("compacted", out) == (0, 0)
    finally:
        wire.close()
    got = _consume(bootstrap, "compacted", 3)
    assert [(m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in got] == [
        (1, b"b", b"2", TS + 10),
        (2, b"a", None, TS + 20),
        (3, b"c", b"3", TS + 30),
    ]
