"""The v2 batch codec on its own: round trips, in-place rewrites, corruption."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.batch import (
    CRC_START_OFFSET,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    ControlRecordType,
    Record,
    build_batch,
    build_control_batch,
    iter_batch_headers,
    iter_records,
    parse_control_key,
    parse_header,
    set_base_offset,
    set_max_timestamp,
    set_partition_leader_epoch,
    validate_batch,
)
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    StorageError,
)

CODECS = [0, 1, 2, 3, 4]


def _records(n, *, size=20, ts=1_700_000_000_000):
    return [
        (f"key-{i}".encode(), bytes([i % 251]) * size, [("h", str(i).encode())], ts + i)
        for i in range(n)
    ]


def test_header_fields_of_a_built_batch():
    batch = build_batch(
        _records(3),
        base_offset=42,
        partition_leader_epoch=7,
        producer_id=1234,
        producer_epoch=5,
        base_sequence=99,
        is_transactional=True,
        compression=1,
    )
    h = validate_batch(batch)
    assert parse_header(batch) == h
    assert (h.base_offset, h.last_offset, h.next_offset) == (42, 44, 45)
    assert h.size_in_bytes == len(batch)
    assert h.records_count == 3 and h.last_offset_delta == 2
    assert h.partition_leader_epoch == 7
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (1234, 5, 99)
    assert h.is_transactional and not h.is_control
    assert h.compression == 1 and h.timestamp_type == 0
    assert h.base_timestamp == 1_700_000_000_000
    assert h.max_timestamp == 1_700_000_000_002


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(codec):
    records = _records(50, size=300)
    batch = build_batch(records, base_offset=1000, compression=codec)
    h = validate_batch(batch)
    assert h.compression == codec
    if codec:
        assert len(batch) < 50 * 300, "compressible values should shrink"
    got = list(iter_records(batch))
    assert [r.offset for r in got] == list(range(1000, 1050))
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in got] == [
        (k, v, h, t) for k, v, h, t in records
    ]


def test_record_like_input_and_null_fields():
    records = [
        Record(offset=0, timestamp=5, key=None, value=None, headers=()),
        Record(offset=1, timestamp=3, key=b"", value=b"", headers=(("", None), ("é", b""))),
    ]
    got = list(iter_records(build_batch(records, base_offset=10)))
    assert got == [r._replace(offset=10 + i) for i, r in enumerate(records)]
    assert validate_batch(build_batch(records)).max_timestamp == 5


def test_missing_timestamp_uses_base_timestamp_or_none():
    got = list(iter_records(build_batch([(b"k", b"v", (), None)], base_timestamp=77)))
    assert got[0].timestamp == 77
    got = list(iter_records(build_batch([(b"k", b"v", (), None)])))
    assert got[0].timestamp == -1


def test_empty_batch_is_refused():
    with pytest.raises(StorageError, match="at least one record"):
        build_batch([])


def test_set_base_offset_and_epoch_keep_crc_valid():
    buf = bytearray(build_batch(_records(4), compression=3))
    set_base_offset(buf, 2**40)
    set_partition_leader_epoch(buf, 12)
    h = validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch, h.last_offset) == (2**40, 12, 2**40 + 3)
    assert [r.offset for r in iter_records(bytes(buf))] == [2**40 + i for i in range(4)]


def test_set_base_offset_in_a_memoryview_at_a_position():
    a, b = build_batch(_records(2)), build_batch(_records(3))
    buf = bytearray(a + b)
    view = memoryview(buf)
    set_base_offset(view, 500, pos=len(a))
    assert validate_batch(view, len(a)).base_offset == 500
    assert validate_batch(buf, 0).base_offset == 0


def test_log_append_time_rewrites_every_record_timestamp():
    buf = bytearray(build_batch(_records(3), compression=4))
    set_max_timestamp(buf, LOG_APPEND_TIME, 123_456)
    h = validate_batch(buf)
    assert h.timestamp_type == LOG_APPEND_TIME and h.max_timestamp == 123_456
    assert h.compression == 4
    assert [r.timestamp for r in iter_records(buf)] == [123_456] * 3


def test_control_batch_leader_change():
    value = b"\x00\x00\x00\x00\x00\x01"
    batch = build_control_batch(
        ControlRecordType.LEADER_CHANGE, value, base_offset=9, partition_leader_epoch=3
    )
    h = validate_batch(batch)
    assert h.is_control and not h.is_transactional and h.partition_leader_epoch == 3
    (record,) = iter_records(batch)
    assert parse_control_key(record.key) == (0, ControlRecordType.LEADER_CHANGE)
    assert record.value == value and record.offset == 9


def test_commit_marker_is_transactional():
    batch = build_control_batch(
        ControlRecordType.COMMIT, struct.pack(">hi", 0, 4), producer_id=8, producer_epoch=1
    )
    h = validate_batch(batch)
    assert h.is_control and h.is_transactional and h.producer_id == 8


def test_iter_batch_headers_stops_at_incomplete_tail():
    batches = [build_batch(_records(i + 1), base_offset=10 * i) for i in range(3)]
    log = b"".join(batches)
    got = list(iter_batch_headers(log))
    assert [pos for pos, _ in got] == [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [h.base_offset for _, h in got] == [0, 10, 20]
    for cut in (1, HEADER_SIZE - 1, HEADER_SIZE, len(batches[2]) - 1):
        assert len(list(iter_batch_headers(log[: len(log) - cut]))) == 2
    assert list(iter_batch_headers(log, pos=len(batches[0]) + len(batches[1]))) == got[2:]


def test_iter_batch_headers_raises_on_unframeable_header():
    batch = bytearray(build_batch(_records(1)))
    struct.pack_into(">i", batch, 8, 10)
    with pytest.raises(CorruptRecordError, match="batch_length 10") as e:
        list(iter_batch_headers(bytes(build_batch(_records(1))) + batch))
    assert e.value.position == len(build_batch(_records(1)))


# --- corruption -----------------------------------------------------------------------

_SMALL = build_batch(_records(2, size=5), base_offset=3, compression=0)
_GZIP = build_batch(_records(5, size=50), compression=1)


@pytest.mark.parametrize("batch", [_SMALL, _GZIP], ids=["none", "gzip"])
def test_flipping_any_crc_covered_byte_is_detected(batch):
    for i in range(CRC_START_OFFSET, len(batch)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(batch)
            bad[i] ^= mask
            with pytest.raises(CorruptRecordError, match="CRC"):
                validate_batch(bad)


@pytest.mark.parametrize("i", range(17, 21))
def test_flipping_a_crc_byte_is_detected(i):
    bad = bytearray(_SMALL)
    bad[i] ^= 0x10
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_batch(bad)


def test_iter_records_refuses_a_corrupt_batch():
    bad = bytearray(_GZIP)
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        list(iter_records(bad))


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_wrong_magic(magic):
    bad = bytearray(_SMALL)
    bad[16] = magic
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_batch(bad)


def test_truncated_batch():
    for cut in range(1, len(_SMALL)):
        with pytest.raises(CorruptRecordError, match="truncated") as e:
            validate_batch(_SMALL[: len(_SMALL) - cut])
        assert e.value.position == 0


def test_truncated_batch_at_a_position():
    with pytest.raises(CorruptRecordError, match="position 7"):
        validate_batch(b"\x00" * 7 + _SMALL[:-1], 7)


@pytest.mark.parametrize("delta", [-1, +1, -49, 2**20, -(2**31)])
def test_length_field_that_lies(delta):
    bad = bytearray(_SMALL + b"\x00" * 8)
    (length,) = struct.unpack_from(">i", bad, 8)
    struct.pack_into(">i", bad, 8, max(-(2**31), length + delta))
    with pytest.raises(CorruptRecordError):
        validate_batch(bad)


def test_too_large():
    assert validate_batch(_GZIP, max_message_bytes=len(_GZIP)).size_in_bytes == len(_GZIP)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes") as e:
        validate_batch(_GZIP, max_message_bytes=len(_GZIP) - 1)
    assert (e.value.size_in_bytes, e.value.max_message_bytes) == (len(_GZIP), len(_GZIP) - 1)


def _with_counts(batch, *, records_count=None, last_offset_delta=None):
    """Rewrite count fields and fix the CRC, as a buggy but honest writer would."""
    buf = bytearray(batch)
    if records_count is not None:
        struct.pack_into(">i", buf, 57, records_count)
    if last_offset_delta is not None:
        struct.pack_into(">i", buf, 23, last_offset_delta)
    from crc32c import crc32c

    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[CRC_START_OFFSET:])))
    return bytes(buf)


def test_compacted_batch_with_fewer_records_than_offsets_is_valid_but_not_from_a_client():
    gap = _with_counts(_SMALL, last_offset_delta=5)
    assert validate_batch(gap).last_offset == 3 + 5
    with pytest.raises(InvalidRecordError, match="records_count 2"):
        validate_batch(gap, from_client=True)
    assert validate_batch(_SMALL, from_client=True).records_count == 2


@pytest.mark.parametrize(
    "counts",
    [dict(records_count=3), dict(records_count=-1), dict(last_offset_delta=-1)],
)
def test_impossible_counts_are_corrupt(counts):
    with pytest.raises(CorruptRecordError, match="records_count"):
        validate_batch(_with_counts(_SMALL, **counts))


def test_record_count_lying_about_records_section():
    # One record fewer than the section holds: the decoder notices leftover bytes.
    fewer = _with_counts(_SMALL, records_count=1, last_offset_delta=1)
    assert validate_batch(fewer).records_count == 1
    with pytest.raises(CorruptRecordError, match="left after"):
        list(iter_records(fewer))


# --- hypothesis round trip ------------------------------------------------------------

_blobs = st.none() | st.binary(max_size=300)
_headers = st.lists(st.tuples(st.text(max_size=10), _blobs), max_size=4)
_timestamps = st.integers(min_value=-1, max_value=2**41)  # -1: no timestamp
_record = st.tuples(_blobs, _blobs, _headers, _timestamps)


@given(
    records=st.lists(_record, min_size=1, max_size=20),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(min_value=0, max_value=2**62),
)
def test_random_records_round_trip(records, codec, base_offset):
    batch = build_batch(records, base_offset=base_offset, compression=codec)
    h = validate_batch(batch, from_client=True)
    assert h.records_count == len(records)
    assert h.max_timestamp == max(r[3] for r in records)
    got = list(iter_records(batch))
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in got] == records
    assert [r.offset for r in got] == [base_offset + i for i in range(len(records))]


@given(records=st.lists(_record, min_size=1, max_size=5), data=st.data())
def test_random_byte_flip_in_crc_range_is_corrupt(records, data):
    batch = bytearray(build_batch(records, compression=data.draw(st.sampled_from(CODECS))))
    i = data.draw(st.integers(min_value=CRC_START_OFFSET, max_value=len(batch) - 1))
    batch[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(CorruptRecordError):
        validate_batch(batch)


def test_codec_modules_are_pure():
    """The batch codec is a pure core (STYLE.md section 1): no clock, no I/O."""
    import ast
    import pathlib

    import storage

    forbidden = {"time", "os", "socket", "trio", "random", "io", "pathlib", "threading"}
    root = pathlib.Path(storage.__file__).parent
    for name in ("batch.py", "batch_records.py", "compression.py", "errors.py"):
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] not in forbidden, f"{name} imports {module}"
