"""Record-level validation of client batches (storage.record_validation), on its own.

Every case runs on both walks of the records section: the compiled one
(`storage._record_scan`, when built) and the pure-Python fallback.
"""

import random
import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiokafka.record.default_records import DefaultRecordBatch as AioKafkaBatch
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from storage import record_validation as rv
from storage.batch import (
    CRC_OFFSET,
    CRC_START_OFFSET,
    HEADER_SIZE,
    build_batch,
    iter_records,
    validate_batch,
)
from storage.batch_records import encode_record
from storage.compression import compress, decompress_bounded
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from storage.record_validation import RecordPolicy, check_stored_batch, validate_client_batch

NOW_MS = 1_700_000_100_000
TS = 1_700_000_000_000
CODECS = [0, 1, 2, 3, 4]

try:
    from storage._record_scan import scan_records as compiled_scan
except ImportError:  # not built here: the fallback alone is tested
    compiled_scan = None

SCANNERS = [pytest.param(rv._scan_python, id="python")]
if compiled_scan is not None:
    SCANNERS.append(pytest.param(compiled_scan, id="compiled"))


@pytest.fixture(params=SCANNERS)
def scanner(request, monkeypatch):
    """Run the test with this walk of the records section."""
    monkeypatch.setattr(rv, "scan_records", request.param)
    return request.param


def _records(n, *, ts=TS):
    return [(f"key-{i}".encode() if i % 4 else None, bytes([i % 251]) * (i % 300),
             [("h", str(i).encode()), ("n", None)] if i % 3 else [], ts + i % 17) for i in range(n)]


def _section(*bodies) -> bytes:
    """Records with arbitrary fields: (offset_delta, key, value, headers, timestamp_delta)."""
    out = bytearray()
    for offset_delta, key, value, headers, timestamp_delta in bodies:
        encode_record(out, timestamp_delta, offset_delta, key, value, headers)
    return bytes(out)


def _batch(section: bytes, count: int, *, codec=0, last_offset_delta=None, base_timestamp=TS,
           max_timestamp=None, attributes=None) -> bytearray:
    """A batch around `section` (compressed with `codec`) with a CRC that holds."""
    body = compress(codec, section) if codec else section
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    header = struct.pack(">qiibIhiqqqhii", 0, HEADER_SIZE - 12 + len(body), -1, 2, 0,
                         codec if attributes is None else attributes, lod, base_timestamp,
                         base_timestamp if max_timestamp is None else max_timestamp, -1, -1, -1, count)
    return _recrc(bytearray(header + body))


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c(memoryview(batch)[CRC_START_OFFSET:]))
    return batch


def _refused(batch, policy=RecordPolicy(), error=InvalidRecordError) -> Exception:
    with pytest.raises(error) as info:
        validate_client_batch(batch, NOW_MS, policy)
    return info.value


# --- valid batches are accepted ---


@pytest.mark.parametrize("codec", CODECS)
def test_built_batches_are_accepted(scanner, codec):
    batch = build_batch(_records(500), compression=codec)
    assert validate_client_batch(batch, NOW_MS) is None
    header = validate_batch(batch)
    check_stored_batch(batch, 0, header)


@pytest.mark.parametrize("codec", [1, 3, 4])
def test_large_and_highly_compressible_batches_are_accepted(scanner, codec):
    """Past the size a codec cannot blow up from, the decoder's buffer is
    sized by the stream's own hint (zstd and lz4 block headers, gzip's
    ISIZE): a 16 MB batch that compresses 30x passes."""
    rng = random.Random(codec)
    values = [rng.randbytes(64) * 40 for _ in range(6400)]
    batch = build_batch([(None, value, (), TS + i) for i, value in enumerate(values)], compression=codec)
    assert len(batch) * 16 < 6400 * 2560
    assert validate_client_batch(batch, NOW_MS) is None


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_decompress_bounded_gives_what_decompress_gives(codec):
    rng = random.Random(codec)
    for size in (0, 1, 3000, 300_000, 2_000_000):
        data = rng.randbytes(size // 2) + bytes(size - size // 2)
        stream = compress(codec, data)
        assert bytes(decompress_bounded(codec, stream, 64 << 20)) == data


def test_a_stream_whose_size_hint_is_short_grows_the_buffer():
    """Two gzip members: the hint (the last four bytes) is the second's size."""
    first = random.Random(1).randbytes(1 << 20)
    stream = compress(1, first) + compress(1, b"tail")
    assert bytes(decompress_bounded(1, stream, 64 << 20)) == first + b"tail"
    with pytest.raises(CorruptRecordError, match="decompression bomb"):
        decompress_bounded(1, stream, 1 << 20)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(
        st.tuples(
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=300),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
            st.integers(-5000, 5000),
        ),
        min_size=1,
        max_size=40,
    ),
    codec=st.sampled_from(CODECS),
)
def test_any_built_batch_is_accepted(scanner, records, codec):
    batch = build_batch([(k, v, h, TS + d) for k, v, h, d in records], compression=codec)
    assert validate_client_batch(batch, NOW_MS) is None


# --- the cases a protocol fuzzer found accepted (and what poisoned the partition) ---


def test_three_records_claimed_over_a_two_byte_section(scanner):
    error = _refused(_batch(b"\x00\x00", 3))
    assert "record 0 of 3" in str(error)
    assert error.record_errors and error.record_errors[0][0] == 0


def test_record_length_past_the_section(scanner):
    section = _section((0, b"k", b"v", (), 0))
    # The length varint says 60 bytes; the section holds 8.
    error = _refused(_batch(b"\x78" + section[1:], 1))
    assert "length 60" in str(error)


def test_fewer_records_than_claimed(scanner):
    section = _section((0, b"a", b"1", (), 0), (1, b"b", b"2", (), 0))
    error = _refused(_batch(section, 3))
    assert "ends inside record 2 of 3" in str(error)


def test_more_records_than_claimed(scanner):
    section = _section((0, b"a", b"1", (), 0), (1, b"b", b"2", (), 0), (2, b"c", b"3", (), 0))
    error = _refused(_batch(section, 2))
    assert "left after its 2 records" in str(error)


@pytest.mark.parametrize("deltas", [(0, 0, 1), (0, 2, 1), (1, 2, 3), (0, 1, -1)])
def test_offset_deltas_must_be_zero_to_n_minus_one(scanner, deltas):
    section = _section(*((d, b"k", b"v", (), 0) for d in deltas))
    error = _refused(_batch(section, 3))
    assert "offset delta" in str(error)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_garbage_under_a_codec(scanner, codec):
    batch = _batch(b"", 1, attributes=codec)
    batch += b"this is not a compressed stream at all" * 3
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    error = _refused(_recrc(batch))
    assert "does not decompress" in str(error) or "record" in str(error)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_valid_stream_of_garbage_records(scanner, codec):
    _refused(_batch(b"\x02garbage records", 2, codec=codec))


def test_a_key_length_below_minus_one(scanner):
    section = bytearray(_section((0, b"k", b"v", (), 0)))
    assert section[4] == 0x02  # length, attributes, timestamp delta, offset delta, key length 1
    section[4] = 0x03  # zigzag -2
    assert "key length -2" in str(_refused(_batch(bytes(section), 1)))


def test_a_null_header_key(scanner):
    section = bytearray(_section((0, b"k", b"v", (("h", b"x"),), 0)))
    assert section[9:11] == b"\x02h"  # after key, value and the header count: key length 1, "h"
    section[9] = 0x01  # zigzag -1: a null key
    assert "header key of length -1" in str(_refused(_batch(bytes(section), 1)))


def test_a_varint_longer_than_kafka_reads(scanner):
    # A timestamp delta of eleven bytes (Kafka's varlongs stop at ten).
    section = b"\x16\x00" + b"\xff" * 10 + b"\x7f" + b"\x00\x01\x01\x00"
    assert "varint" in str(_refused(_batch(section, 1)))


def test_record_attributes_are_zero(scanner):
    section = bytearray(_section((0, b"k", b"v", (), 0)))
    section[1] = 0x80
    assert "attributes 128" in str(_refused(_batch(bytes(section), 1)))
    # A stored batch is not held to it: only its structure is walked.
    batch = _batch(bytes(section), 1)
    check_stored_batch(batch, 0, validate_batch(batch))


def test_header_keys_are_utf8(scanner):
    section = _section((0, b"k", b"v", ((b"\xff\xfe", b"x"),), 0))
    assert "not UTF-8" in str(_refused(_batch(section, 1)))


def test_a_bad_crc_is_blamed_before_the_records(scanner):
    batch = _batch(b"\x00\x00", 3)
    batch[-1] ^= 1  # the CRC no longer holds
    error = _refused(batch, error=CorruptRecordError)
    assert not isinstance(error, InvalidRecordError) and "CRC" in str(error)


def test_header_rules_come_first(scanner):
    batch = build_batch(_records(3))
    assert isinstance(_refused(batch, RecordPolicy(max_message_bytes=100), RecordTooLargeError), RecordTooLargeError)
    wrong_count = bytearray(batch)
    struct.pack_into(">i", wrong_count, 57, 2)
    assert "records_count 2" in str(_refused(_recrc(wrong_count)))
    assert "carries one record batch" in str(_refused(batch + batch, error=CorruptRecordError))


def test_a_decompression_bomb_is_refused(scanner):
    bomb = compress(4, b"\x00" * (rv.decompression_limit(1048588) + 1))
    assert len(bomb) < 100_000
    batch = _batch(b"", 1, attributes=4)
    batch += bomb
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    assert "decompression bomb" in str(_refused(_recrc(batch)))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_decompress_bounded_stops_at_the_limit(codec):
    data = compress(codec, bytes(200_000))
    assert bytes(decompress_bounded(codec, data, 200_000)) == bytes(200_000)
    with pytest.raises(CorruptRecordError, match="more than"):
        decompress_bounded(codec, data, 199_999 if codec == 2 else 1000)


# --- the topic's rules ---


def test_compacted_topics_need_keys(scanner):
    records = [(b"a", b"1", (), TS), (None, b"2", (), TS), (b"c", b"3", (), TS), (None, None, (), TS)]
    batch = build_batch(records)
    assert validate_client_batch(batch, NOW_MS) is None
    error = _refused(batch, RecordPolicy(compacted=True))
    assert [index for index, _ in error.record_errors] == [1, 3]
    assert "record 1 has no key" in str(error)


def test_timestamps_within_the_topic_bounds(scanner):
    policy = RecordPolicy(timestamp_before_max_ms=1000, timestamp_after_max_ms=500)
    records = [(b"k", b"v", (), t) for t in (NOW_MS - 1000, NOW_MS + 500, NOW_MS - 1001, NOW_MS, NOW_MS + 501)]
    error = _refused(build_batch(records), policy, InvalidTimestampError)
    assert [index for index, _ in error.record_errors] == [2, 4]
    ok = build_batch([(b"k", b"v", (), t) for t in (NOW_MS - 1000, NOW_MS + 500)])
    assert validate_client_batch(ok, NOW_MS, policy) is None
    # Kafka's default: at most an hour ahead, any age.
    _refused(build_batch([(b"k", b"v", (), NOW_MS + 3_600_001)]), error=InvalidTimestampError)
    assert validate_client_batch(build_batch([(b"k", b"v", (), 0)]), NOW_MS) is None


def test_records_without_timestamps_are_exempt(scanner):
    batch = build_batch([(b"k", b"v", (), None)])  # timestamp -1
    assert validate_client_batch(batch, NOW_MS, RecordPolicy(timestamp_before_max_ms=10)) is None


def test_log_append_time_topics_ignore_record_timestamps(scanner):
    batch = build_batch([(b"k", b"v", (), NOW_MS * 10)])
    assert validate_client_batch(batch, NOW_MS, RecordPolicy(log_append_time=True)) is None


def test_a_wrong_max_timestamp_is_answered_with_the_right_one(scanner):
    section = _section((0, b"a", b"1", (), 5), (1, b"b", b"2", (), 9), (2, b"c", b"3", (), 2))
    assert validate_client_batch(_batch(section, 3, max_timestamp=TS + 5), NOW_MS) == TS + 9
    assert validate_client_batch(_batch(section, 3, max_timestamp=TS + 9), NOW_MS) is None
    # A client batch that says LogAppendTime on a CreateTime topic is stamped CreateTime.
    assert validate_client_batch(_batch(section, 3, max_timestamp=TS + 9, attributes=0x08), NOW_MS) == TS + 9


# --- stored batches: compaction thins them ---


def test_stored_batches_may_skip_offsets(scanner):
    section = _section((0, b"a", b"1", (), 0), (3, b"b", b"2", (), 0), (7, b"c", b"3", (), 0))
    batch = _batch(section, 3, last_offset_delta=9)
    check_stored_batch(batch, 0, validate_batch(batch))
    for bad in ((0, 3, 3), (0, 3, 10)):
        section = _section(*((d, b"k", b"v", (), 0) for d in bad))
        batch = _batch(section, 3, last_offset_delta=9)
        with pytest.raises(CorruptRecordError, match="offset delta"):
            check_stored_batch(batch, 0, validate_batch(batch))
    empty = _batch(b"", 0, last_offset_delta=4)
    check_stored_batch(empty, 0, validate_batch(empty))


# --- mutations: refused, or they decode ---


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 8),
    codec=st.sampled_from(CODECS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(-3, 3),
)
def test_a_mutated_records_section_is_refused_or_decodes(scanner, n, codec, edits, cut):
    """Any change to the records section (with the CRC made to hold again)
    is either refused with INVALID_RECORD or leaves records every reader
    can decode: no accepted batch poisons a partition."""
    records = _records(n)
    section = bytearray(_section(*((i, k, v, h, t - TS) for i, (k, v, h, t) in enumerate(records))))
    for at, value in edits:
        section[at % len(section)] = value
    section = section[: len(section) + cut] if cut < 0 else section + bytes(cut)
    batch = _batch(bytes(section), n, codec=codec, max_timestamp=max(t for *_, t in records))
    try:
        stamp = validate_client_batch(batch, NOW_MS)
    except InvalidRecordError as exc:
        assert exc.record_errors == () or 0 <= exc.record_errors[0][0] < n
        return
    got = list(iter_records(batch))
    assert [r.offset for r in got] == list(range(n))
    assert stamp is None or stamp == max(r.timestamp for r in got)
    # The clients' own decoders read it too.
    assert [r.offset for r in KafkaPythonBatch(bytes(batch))] == list(range(n))
    assert [r.offset for r in AioKafkaBatch(bytes(batch))] == list(range(n))


@given(section=st.binary(max_size=200), count=st.integers(0, 12), last_offset_delta=st.integers(-1, 12),
       client=st.booleans())
def test_both_walks_agree(section, count, last_offset_delta, client):
    """The compiled walk and the pure-Python one answer the same, on any bytes."""
    if compiled_scan is None:
        pytest.skip("storage._record_scan is not built")
    python = rv._scan_python(section, 0, len(section), count, last_offset_delta, client)
    compiled = compiled_scan(section, 0, len(section), count, last_offset_delta, client)
    assert python == compiled
    if python[0] == 0 and count:
        records = iter_records(_batch(section, count, last_offset_delta=max(last_offset_delta, count - 1)))
        assert len(list(records)) == count


@given(n=st.integers(1, 6), edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_both_walks_agree_on_near_valid_sections(n, edits):
    if compiled_scan is None:
        pytest.skip("storage._record_scan is not built")
    section = bytearray(_section(*((i, k, v, h, t - TS) for i, (k, v, h, t) in enumerate(_records(n)))))
    for at, value in edits:
        section[at % len(section)] = value
    python = rv._scan_python(bytes(section), 0, len(section), n, n - 1, True)
    compiled = compiled_scan(bytes(section), 0, len(section), n, n - 1, True)
    assert python == compiled
