"""The records inside a v2 batch, checked before they are appended (Kafka's LogValidator).

Theory of operation
-------------------
`storage.batch.validate_batch` checks a batch's header and its CRC. A CRC
only says the bytes arrived as the client wrote them; a client can write a
well-framed batch whose records are not: three records claimed over a
two-byte records section, a record whose length runs past the section,
garbage under a codec. Appended, such a batch poisons its partition for
every reader (consumers stop at it, timestamp lookups fail on it). Kafka's
`LogValidator` walks every record of every client batch before the append,
and so does raftka:

- `validate_client_batch` (the leader's produce path, before `Log.append`):
  the batch is one whole v2 client batch (`validate_batch`'s rules), a
  compressed records section decompresses within a bound (decompression
  bombs refused), and the section parses into exactly `records_count`
  records that fill it: each record's length within the section, its
  fields within its length (varints of at most 5 bytes, 10 for the
  timestamp delta, key/value lengths of -1 or within the record, a header
  count and header keys and values within the record, header keys UTF-8),
  offset deltas exactly 0..n-1, record attributes 0 (unused in v2; Kafka
  ignores them, but kafka-python and aiokafka read them as a varint and
  misparse a record whose attributes have the high bit set). Then the
  topic's rules on records (KIP-467 names the records at fault): a
  compacted topic needs a key on every record (INVALID_RECORD), and with
  `message.timestamp.type=CreateTime`
  every timestamp lies within `message.timestamp.before.max.ms` /
  `after.max.ms` of the broker's clock (INVALID_TIMESTAMP; -1, no
  timestamp, is exempt as in Kafka). It answers the max timestamp the
  header should carry when the header carries another: Kafka rewrites it
  rather than refusing the batch.
- `check_stored_batch` (a follower's append, recovery): the same walk for a
  batch already through a leader, which compaction may have thinned:
  offset deltas increasing within `last_offset_delta`; neither the
  attributes rule nor the topic's rules (they were the leader's to apply,
  under the configs of that day).

A batch that fails is refused whole; nothing is appended. The records
section is walked before the CRC is checked (on the hot path the CRC is
checked once, by `Log.append`); a refusal checks the CRC first, so bytes
damaged on the way are blamed as CORRUPT_MESSAGE (retriable), and only a
batch whose CRC holds is called INVALID_RECORD (the client wrote it so; a
retry sends the same bytes).

The walk is per record, so it is compiled: `storage._record_scan`
(`_record_scan.c`, built by the project's install) walks a record in
about 10 ns; `_scan_python`, its pure-Python twin, takes 0.6-1.5 us, up
to ten times the broker's whole produce path per record (0.13-0.2 us in
`raftka bench produce`), and runs only when the extension is not built.
The tests run both on the same inputs and hold them to the same answers.

Error codes at the broker's edge (`storage.errors`):

| raised                   | code                  | when                               |
| ------------------------ | --------------------- | ---------------------------------- |
| CorruptRecordError       | CORRUPT_MESSAGE (2)   | CRC, magic, framing                |
| InvalidRecordError       | INVALID_RECORD (87)   | records section, counts, keys      |
| InvalidTimestampError    | INVALID_TIMESTAMP (32)| a CreateTime timestamp out of range|

Pure: bytes in, values out; the clock is an argument.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from storage.batch import (
    CODEC_OR_CONTROL_MASK,
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    NO_COMPRESSION,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_MASK,
    ZSTD,
    BatchHeader,
    iter_batch_headers,
    validate_batch,
)
from storage.batch_records import decode_records
from storage.compression import decompress_bounded
from storage.errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError

LONG_MAX = (1 << 63) - 1
#: Kafka 4.0's default `message.timestamp.after.max.ms` (KIP-1030): an hour.
DEFAULT_TIMESTAMP_AFTER_MAX_MS = 3_600_000
DEFAULT_MAX_MESSAGE_BYTES = 1048588

# The scanner's answers: (code, record_index, detail, min_timestamp_delta,
# max_timestamp_delta, first_null_key_index). The codes are _record_scan.c's.
SCAN_OK = 0
SCAN_TRUNCATED = 1
SCAN_VARINT_TOO_LONG = 2
SCAN_BAD_LENGTH = 3
SCAN_BAD_OFFSET_DELTA = 4
SCAN_BAD_KEY_LENGTH = 5
SCAN_BAD_VALUE_LENGTH = 6
SCAN_BAD_HEADER_COUNT = 7
SCAN_BAD_HEADER_KEY_LENGTH = 8
SCAN_HEADER_KEY_NOT_UTF8 = 9
SCAN_BAD_HEADER_VALUE_LENGTH = 10
SCAN_LENGTH_MISMATCH = 11
SCAN_TRAILING_BYTES = 12
SCAN_BAD_ATTRIBUTES = 13

# Decompressed, a batch may grow to 32 times the topic's max.message.bytes,
# and never needs to be refused below 64 MiB: librdkafka's batches are at
# most batch.size (1 MB) before compression, Java's at most a few times
# batch.size. A stream that expands past it is a decompression bomb.
_DECOMPRESSION_FACTOR = 32
_MIN_DECOMPRESSION_LIMIT = 64 << 20
#: Batches already appended were held to whatever limit was in force then;
#: recovery and followers decode them within this.
STORED_DECOMPRESSION_LIMIT = 256 << 20


def decompression_limit(max_message_bytes: int) -> int:
    """The most bytes a batch of a topic with this `max.message.bytes` may
    decompress to."""
    return max(_MIN_DECOMPRESSION_LIMIT, _DECOMPRESSION_FACTOR * max_message_bytes)


class RecordPolicy(NamedTuple):
    """A topic's rules for the records of a client batch."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: `message.timestamp.type=LogAppendTime`: the broker stamps the batch,
    #: the records' own timestamps are not checked.
    log_append_time: bool = False
    #: `cleanup.policy` includes compact: every record needs a key.
    compacted: bool = False
    timestamp_before_max_ms: int = LONG_MAX
    timestamp_after_max_ms: int = DEFAULT_TIMESTAMP_AFTER_MAX_MS

    @property
    def max_decompressed_bytes(self) -> int:
        return decompression_limit(self.max_message_bytes)


# What the walk needs from a client batch's header, in one unpack:
# batch_length, magic, attributes, last_offset_delta, base_timestamp,
# max_timestamp, records_count.
_CLIENT_FIELDS = struct.Struct(">8xi4xb4xhiqq14xi")
assert _CLIENT_FIELDS.size == HEADER_SIZE
_unpack_client_fields = _CLIENT_FIELDS.unpack_from


def validate_client_batch(batch, now_ms: int, policy: RecordPolicy = RecordPolicy()) -> int | None:
    """Check one client batch (a Produce request's records for one
    partition) and every record in it; see the module docstring.

    Returns None, or the max timestamp its header must carry before the
    append (a CreateTime batch whose header says another, or says
    LogAppendTime). Raises `CorruptRecordError`, `InvalidRecordError`,
    `InvalidTimestampError`, `RecordTooLargeError` or
    `UnsupportedCompressionError`; the message names the record and the
    reason, and `record_errors` the records at fault (KIP-467).
    """
    try:
        batch_length, magic, attributes, last_offset_delta, base_timestamp, max_timestamp, count = (
            _unpack_client_fields(batch))
    except struct.error:
        batch_length = magic = -1
    size = batch_length + LOG_OVERHEAD
    if (
        magic != MAGIC
        or size != len(batch)
        or batch_length < MIN_BATCH_LENGTH
        or size > policy.max_message_bytes
        or count != last_offset_delta + 1
        or count <= 0
        or attributes & CODEC_OR_CONTROL_MASK > ZSTD
    ):
        # A header rule is broken: `validate_batch` says which, with Kafka's
        # error for it. The one it does not check: bytes after the batch.
        validate_batch(batch, 0, policy.max_message_bytes, from_client=True)
        raise CorruptRecordError(
            f"a produce request carries one record batch per partition: {len(batch)} bytes "
            f"hold a batch of {size} and more",
            0,
        )
    codec = attributes & COMPRESSION_MASK
    if codec == NO_COMPRESSION:
        section, start, end = batch, HEADER_SIZE, size
    else:
        try:
            section = decompress_bounded(codec, memoryview(batch)[HEADER_SIZE:size],
                                         policy.max_decompressed_bytes)
        except CorruptRecordError as exc:
            _refuse(batch, f"record batch: {exc}")
        start, end = 0, len(section)
    code, index, detail, min_delta, max_delta, first_null_key = scan_records(
        section, start, end, count, last_offset_delta, True)
    if code:
        message = describe_scan_error(code, index, detail, count)
        _refuse(batch, message, ((index, message),) if index < count else ())
    if first_null_key >= 0 and policy.compacted:
        _refuse_null_keys(batch, memoryview(section)[start:end], count, base_timestamp)
    if policy.log_append_time:
        return None
    if base_timestamp + min_delta < now_ms - policy.timestamp_before_max_ms or (
        base_timestamp + max_delta > now_ms + policy.timestamp_after_max_ms
    ):
        _check_timestamps(batch, memoryview(section)[start:end], count, base_timestamp, now_ms, policy)
    records_max_timestamp = base_timestamp + max_delta
    if records_max_timestamp != max_timestamp or attributes & TIMESTAMP_TYPE_MASK:
        return records_max_timestamp
    return None


def check_stored_batch(buf, pos: int, header: BatchHeader,
                       max_decompressed_bytes: int = STORED_DECOMPRESSION_LIMIT) -> None:
    """Raise `CorruptRecordError` unless the records of the batch at `pos`
    (whose header `validate_batch` returned) parse: `header.records_count`
    records filling the section, offset deltas increasing within
    `last_offset_delta` (compaction removes records, keeping offsets)."""
    size = header[1] + LOG_OVERHEAD
    count = header[12]
    codec = header[5] & COMPRESSION_MASK
    if codec == NO_COMPRESSION:
        section, start, end = buf, pos + HEADER_SIZE, pos + size
    else:
        view = buf if type(buf) is memoryview else memoryview(buf)
        try:
            section = decompress_bounded(codec, view[pos + HEADER_SIZE : pos + size], max_decompressed_bytes)
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"record batch at position {pos} (base_offset {header[0]}): {exc}", pos) from None
        start, end = 0, len(section)
    code, index, detail, _, _, _ = scan_records(section, start, end, count, header[6], False)
    if code:
        raise CorruptRecordError(
            f"record batch at position {pos} (base_offset {header[0]}): "
            f"{describe_scan_error(code, index, detail, count, client=False)}",
            pos,
        )


def check_stored_batches(buf, max_decompressed_bytes: int = STORED_DECOMPRESSION_LIMIT) -> None:
    """`check_stored_batch` for each whole batch of `buf` (a follower's
    fetched records). Only the framing of each header is checked first: the
    append that follows checks the CRCs (once), and refuses a tail that is
    not a whole batch."""
    for pos, header in iter_batch_headers(buf):
        check_stored_batch(buf, pos, header, max_decompressed_bytes)


def describe_scan_error(code: int, index: int, detail: int, count: int, client: bool = True) -> str:
    """What a scanner's answer means, for an error message."""
    where = f"record {index} of {count}"
    if code == SCAN_TRUNCATED:
        return f"the records section ends inside {where}"
    if code == SCAN_VARINT_TOO_LONG:
        return f"{where} has a varint longer than Kafka's (5 bytes; 10 for the timestamp delta) or out of range"
    if code == SCAN_BAD_LENGTH:
        return f"{where} has length {detail}, which does not fit the records section"
    if code == SCAN_BAD_OFFSET_DELTA:
        want = f"{index}" if client else "one above the previous record's and within last_offset_delta"
        return f"{where} has offset delta {detail}, expected {want}"
    if code == SCAN_BAD_KEY_LENGTH:
        return f"{where} has key length {detail}, which does not fit the record"
    if code == SCAN_BAD_VALUE_LENGTH:
        return f"{where} has value length {detail}, which does not fit the record"
    if code == SCAN_BAD_HEADER_COUNT:
        return f"{where} has header count {detail}, which does not fit the record"
    if code == SCAN_BAD_HEADER_KEY_LENGTH:
        return f"{where} has a header key of length {detail}: header keys are non-null and within the record"
    if code == SCAN_HEADER_KEY_NOT_UTF8:
        return f"{where}: header {detail}'s key is not UTF-8"
    if code == SCAN_BAD_HEADER_VALUE_LENGTH:
        return f"{where} has a header value of length {detail}, which does not fit the record"
    if code == SCAN_LENGTH_MISMATCH:
        return f"{where}: its fields do not end where its length ({detail}) says"
    if code == SCAN_TRAILING_BYTES:
        return f"the records section has {detail} bytes left after its {count} records"
    if code == SCAN_BAD_ATTRIBUTES:
        return f"{where} has attributes {detail}: record attributes are unused in v2 and must be 0"
    return f"{where}: scan error {code}"


def _refuse(batch, message: str, record_errors=()) -> None:
    """Raise for a batch that fails a record rule: CorruptRecordError if
    its CRC does not hold (the bytes were damaged), else InvalidRecordError."""
    validate_batch(batch, 0)
    raise InvalidRecordError(f"record batch refused: {message}", 0, record_errors)


def _refuse_null_keys(batch, section, count: int, base_timestamp: int) -> None:
    records = decode_records(section, count, 0, base_timestamp, None)
    message = "a compacted topic (cleanup.policy=compact) needs a key on every record"
    errors = tuple((r.offset, f"record {r.offset} has no key: {message}") for r in records if r.key is None)
    validate_batch(batch, 0)
    raise InvalidRecordError(f"record batch refused: {errors[0][1]}", 0, errors)


def _check_timestamps(batch, section, count: int, base_timestamp: int, now_ms: int,
                      policy: RecordPolicy) -> None:
    """The slow path of the timestamp rule: every record at fault, or none
    (the fast check is on the min and max, and NO_TIMESTAMP is exempt)."""
    low = now_ms - policy.timestamp_before_max_ms
    high = now_ms + policy.timestamp_after_max_ms
    errors = tuple(
        (r.offset, f"timestamp {r.timestamp} of record {r.offset} is out of range: it should be within "
                   f"[{low}, {high}] (message.timestamp.before.max.ms / after.max.ms of the broker's clock)")
        for r in decode_records(section, count, 0, base_timestamp, None)
        if r.timestamp != NO_TIMESTAMP and not low <= r.timestamp <= high
    )
    if errors:
        validate_batch(batch, 0)
        raise InvalidTimestampError(f"record batch refused: {errors[0][1]}", 0, errors)


class _VarintTooLong(Exception):
    pass


def _varint(data: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    """A zigzag varint of at most `max_bytes` bytes whose unsigned value
    fits 32 (5 bytes) or 64 bits (10); `(value, next position)`. IndexError
    past the end."""
    last = pos + max_bytes - 1
    limit = 0x0F if max_bytes == 5 else 0x01
    u = 0
    shift = 0
    while True:
        b = data[pos]
        if pos == last and (b & 0x80 or b > limit):
            raise _VarintTooLong
        u |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return (u >> 1) ^ -(u & 1), pos
        shift += 7


def _scan_python(buf, start: int, end: int, count: int, last_offset_delta: int, client: bool):
    """`storage._record_scan.scan_records` in Python (see `_record_scan.c`)."""
    data = buf if type(buf) is bytes and start == 0 and end == len(buf) else bytes(memoryview(buf)[start:end])
    end = len(data)
    pos = 0
    index = 0
    min_delta = max_delta = 0
    first_null_key = -1
    previous_offset_delta = -1
    varint = _varint
    # One-byte varints (values -64..63, most lengths and deltas) are read
    # inline: a call per field would double the cost.
    try:
        for index in range(count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = varint(data, pos, 5)
            if length < 0 or length > end - pos:
                return SCAN_BAD_LENGTH, index, length, 0, 0, -1
            record_end = pos + length
            if pos >= end:
                return SCAN_TRUNCATED, index, 0, 0, 0, -1
            if client and data[pos]:  # attributes: unused, 0 (see _record_scan.c)
                return SCAN_BAD_ATTRIBUTES, index, data[pos], 0, 0, -1
            p = pos + 1
            b = data[p]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                timestamp_delta, p = varint(data, p, 10)
            if index == 0:
                min_delta = max_delta = timestamp_delta
            elif timestamp_delta > max_delta:
                max_delta = timestamp_delta
            elif timestamp_delta < min_delta:
                min_delta = timestamp_delta
            b = data[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                offset_delta, p = varint(data, p, 5)
            if offset_delta != index if client else (
                    offset_delta <= previous_offset_delta or offset_delta > last_offset_delta):
                return SCAN_BAD_OFFSET_DELTA, index, offset_delta, 0, 0, -1
            previous_offset_delta = offset_delta
            b = data[p]
            if b == 1:  # the null key: length -1
                if first_null_key < 0:
                    first_null_key = index
                p += 1
            else:
                if b < 0x80:
                    key_length = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    key_length, p = varint(data, p, 5)
                if key_length < 0 or key_length > record_end - p:
                    return SCAN_BAD_KEY_LENGTH, index, key_length, 0, 0, -1
                p += key_length
            b = data[p]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                value_length, p = varint(data, p, 5)
            if value_length != -1:
                if value_length < 0 or value_length > record_end - p:
                    return SCAN_BAD_VALUE_LENGTH, index, value_length, 0, 0, -1
                p += value_length
            b = data[p]
            if b == 0:  # no headers
                p += 1
            else:
                if b < 0x80:
                    header_count = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    header_count, p = varint(data, p, 5)
                # Each header takes at least two bytes.
                if header_count < 0 or (header_count and header_count > (record_end - p) // 2):
                    return SCAN_BAD_HEADER_COUNT, index, header_count, 0, 0, -1
                for h in range(header_count):
                    header_key_length, p = varint(data, p, 5)
                    if header_key_length < 0 or header_key_length > record_end - p:
                        return SCAN_BAD_HEADER_KEY_LENGTH, index, header_key_length, 0, 0, -1
                    try:
                        data[p : p + header_key_length].decode()
                    except UnicodeDecodeError:
                        return SCAN_HEADER_KEY_NOT_UTF8, index, h, 0, 0, -1
                    p += header_key_length
                    header_value_length, p = varint(data, p, 5)
                    if header_value_length != -1:
                        if header_value_length < 0 or header_value_length > record_end - p:
                            return SCAN_BAD_HEADER_VALUE_LENGTH, index, header_value_length, 0, 0, -1
                        p += header_value_length
            if p != record_end:
                return SCAN_LENGTH_MISMATCH, index, length, 0, 0, -1
            pos = p
    except IndexError:
        return SCAN_TRUNCATED, index, 0, 0, 0, -1
    except _VarintTooLong:
        return SCAN_VARINT_TOO_LONG, index, 0, 0, 0, -1
    if pos != end:
        return SCAN_TRAILING_BYTES, count, end - pos, 0, 0, -1
    return SCAN_OK, -1, 0, min_delta, max_delta, first_null_key


try:
    from storage._record_scan import scan_records
except ImportError:  # not built: `pip install -e .` (or `make setup`) builds it
    scan_records = _scan_python
    IMPLEMENTATION = "python"
else:
    IMPLEMENTATION = "compiled"
