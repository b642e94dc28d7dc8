"""Kafka record batch v2 (magic 2): parse, validate, rewrite, build.

Theory of operation
-------------------
A v2 batch (KIP-98) is a 61-byte header followed by the records section,
which is compressed as a whole when `attributes & 0x07` is non-zero:

    offset  size  field
         0     8  base_offset
         8     4  batch_length          bytes after this field (size - 12)
        12     4  partition_leader_epoch
        16     1  magic                 always 2 here
        17     4  crc                   CRC32C of bytes 21 .. end
        21     2  attributes            compression:3 timestamp_type:1
                                        transactional:1 control:1
        23     4  last_offset_delta
        27     8  base_timestamp
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  records_count
        61     -  records

The CRC leaves out the first 21 bytes on purpose, so a broker can assign
offsets (`set_base_offset`) and stamp the leader epoch
(`set_partition_leader_epoch`) in place without touching the CRC.

`validate_batch` reads the header with one precompiled `struct` call and
checks the CRC over a `memoryview`, so its cost is the CRC itself. The
records inside are checked apart (`storage.record_validation`: a compiled
walk on the produce path, before the append); they are only decoded
(`iter_records`) where a feature needs them: compaction, timestamp lookup,
tests.

Each record inside the records section (after decompression) is

    length varint, attributes int8, timestamp_delta varlong,
    offset_delta varint, key_length varint, key, value_length varint,
    value, header_count varint, headers [key_length varint, key (UTF-8),
    value_length varint, value]

with zigzag varints and -1 as the length of a null key or value.

This module is a pure core: bytes in, values out; no I/O, no clock.
"""

import struct
from typing import Iterable, Iterator, NamedTuple

from crc32c import crc32c

from common.frozen import new_tuple
from storage.batch_records import Record, decode_records, encode_record
from storage.compression import compress, decompress
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    StorageError,
    UnsupportedCompressionError,
)

MAGIC = 2

BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORDS_OFFSET = 61
HEADER_SIZE = 61

# base_offset + batch_length: the framing every Kafka log entry starts with.
LOG_OVERHEAD = 12
# The CRC covers everything from the attributes on.
CRC_START_OFFSET = ATTRIBUTES_OFFSET
# The smallest legal batch_length: a header with no records.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

NO_COMPRESSION = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CREATE_TIME = 0
LOG_APPEND_TIME = 1

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_unpack_header = _HEADER.unpack_from


class BatchHeader(NamedTuple):
    """The 61-byte header of a v2 batch, as stored."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Read the header of the batch at `pos` without checking anything but
    that 61 bytes are there."""
    try:
        return new_tuple(BatchHeader, _unpack_header(buf, pos))
    except struct.error:
        raise CorruptRecordError(
            f"truncated record batch at position {pos}: need {HEADER_SIZE} header bytes, "
            f"have {max(0, len(buf) - pos)}",
            pos,
        ) from None


def validate_batch(
    buf, pos: int = 0, max_message_bytes: int | None = None, *, from_client: bool = False
) -> BatchHeader:
    """Check the batch at `pos` and return its header.

    Always: magic is 2, batch_length is at least a header and the buffer
    holds all of it, the size is within `max_message_bytes` (when given),
    the CRC32C of bytes 21.. matches, and 0 <= records_count <=
    last_offset_delta + 1 (compaction may drop records but keeps offsets).

    A codec id above 4 raises `UnsupportedCompressionError`.

    With `from_client=True` (the produce path) also Kafka's LogValidator
    checks on client batches, which raise `InvalidRecordError`:
    records_count == last_offset_delta + 1 and at least one record; not a
    control batch; an idempotent batch (producer_id >= 0) has a sequence.
    Per-record rules (keys on compacted topics, timestamp skew) need the
    records decoded and are left to the caller.
    """
    try:
        header = new_tuple(BatchHeader, _unpack_header(buf, pos))
    except struct.error:
        header = parse_header(buf, pos)  # raises CorruptRecordError saying why
    if header[3] != MAGIC:
        raise CorruptRecordError(
            f"record batch at position {pos} has magic {header[3]}, expected {MAGIC}: "
            "only v2 batches (Kafka 0.11+ clients) are supported",
            pos,
        )
    batch_length = header[1]
    if batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"record batch at position {pos} has batch_length {batch_length}, "
            f"less than the {MIN_BATCH_LENGTH} bytes of a header",
            pos,
        )
    end = pos + LOG_OVERHEAD + batch_length
    if len(buf) < end:
        raise CorruptRecordError(
            f"truncated record batch at position {pos}: batch_length says "
            f"{batch_length + LOG_OVERHEAD} bytes, only {len(buf) - pos} present",
            pos,
        )
    if max_message_bytes is not None and batch_length + LOG_OVERHEAD > max_message_bytes:
        raise RecordTooLargeError(
            f"record batch at position {pos} is {batch_length + LOG_OVERHEAD} bytes, over the "
            f"limit of {max_message_bytes}: raise the topic's max.message.bytes (broker "
            "default message.max.bytes) or send smaller batches (producer batch.size)",
            batch_length + LOG_OVERHEAD,
            max_message_bytes,
        )
    view = buf if type(buf) is memoryview else memoryview(buf)
    crc = crc32c(view[pos + CRC_START_OFFSET : end])
    if crc != header[4]:
        raise CorruptRecordError(
            f"record batch at position {pos} (base_offset {header[0]}) has CRC "
            f"0x{header[4]:08x} but its bytes give 0x{crc:08x}: the batch is corrupt",
            pos,
        )
    count = header[12]
    last_offset_delta = header[6]
    if count < 0 or last_offset_delta < 0 or count > last_offset_delta + 1:
        raise CorruptRecordError(
            f"record batch at position {pos} has records_count {count} and "
            f"last_offset_delta {last_offset_delta}, which no writer produces",
            pos,
        )
    if header[5] & COMPRESSION_MASK > ZSTD:
        raise UnsupportedCompressionError(
            f"record batch at position {pos} names compression codec "
            f"{header[5] & COMPRESSION_MASK}; Kafka defines 0 none, 1 gzip, 2 snappy, "
            "3 lz4, 4 zstd",
        )
    if from_client:
        _check_client_batch(header, pos)
    return header


# What a leader's append needs from a client batch, in one unpack and no
# NamedTuple (`storage.log.Log.append`'s fast path): batch_length,
# partition_leader_epoch, magic, crc, attributes, last_offset_delta,
# max_timestamp, producer_id's high byte (negative iff producer_id is) and
# records_count. It skips base_offset, base_timestamp, producer_epoch and
# base_sequence: a batch of a non-idempotent producer needs none of them.
# Like `validate_batch`, it needs all 61 header bytes.
PLAIN_CLIENT_FIELDS = struct.Struct(">8xiibIhi8xqb13xi")
assert PLAIN_CLIENT_FIELDS.size == HEADER_SIZE
unpack_plain_client_fields = PLAIN_CLIENT_FIELDS.unpack_from
# What a follower's append needs from a batch the leader sent, in one
# unpack (`storage.log.Log.append_as_follower`'s fast path): the same as
# PLAIN_CLIENT_FIELDS with the base_offset in front.
FOLLOWER_FIELDS = struct.Struct(">qiibIhi8xqb13xi")
assert FOLLOWER_FIELDS.size == HEADER_SIZE
unpack_follower_fields = FOLLOWER_FIELDS.unpack_from
# `attributes & CODEC_OR_CONTROL_MASK > ZSTD`: an unknown codec or a
# control batch, either one refused from a client.
CODEC_OR_CONTROL_MASK = COMPRESSION_MASK | CONTROL_MASK


def _check_client_batch(header: BatchHeader, pos: int) -> None:
    """Kafka's LogValidator rules for batches that come from a producer."""
    count, last_offset_delta = header[12], header[6]
    if count == 0 or count != last_offset_delta + 1:
        raise InvalidRecordError(
            f"record batch at position {pos} has records_count {count} but "
            f"last_offset_delta {last_offset_delta}: a client batch must hold exactly "
            "last_offset_delta + 1 records, at least one",
            pos,
        )
    if header[5] & CONTROL_MASK:
        raise InvalidRecordError(
            f"record batch at position {pos} is a control batch: clients may not write "
            "control records (only transaction coordinators and Raft leaders do)",
            pos,
        )
    if header[9] >= 0 and header[11] < 0:
        raise InvalidRecordError(
            f"record batch at position {pos} has producer_id {header[9]} but "
            f"base_sequence {header[11]}: an idempotent producer must number "
            "its batches (KIP-98)",
            pos,
        )


def set_base_offset(buf, base_offset: int, pos: int = 0) -> None:
    """Assign offsets to the batch at `pos` in place; the CRC stays valid."""
    _INT64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(buf, epoch: int, pos: int = 0) -> None:
    """Stamp the leader epoch into the batch at `pos`; the CRC stays valid."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_max_timestamp(buf, timestamp_type: int, max_timestamp: int, pos: int = 0) -> None:
    """Set the timestamp type and max_timestamp of the batch at `pos` and
    rewrite its CRC (these fields are covered by it). The broker uses this
    for topics with `message.timestamp.type=LogAppendTime`, where the
    batch's max_timestamp becomes the append time of every record (KIP-32).
    """
    view = buf if type(buf) is memoryview else memoryview(buf)
    header = parse_header(view, pos)
    attributes = header.attributes & ~TIMESTAMP_TYPE_MASK
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    _INT16.pack_into(view, pos + ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(view, pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
    end = pos + LOG_OVERHEAD + header.batch_length
    _UINT32.pack_into(view, pos + CRC_OFFSET, crc32c(view[pos + CRC_START_OFFSET : end]))


def iter_batch_headers(buf, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield `(position, header)` for each complete batch from `pos` on.

    Stops without error at an incomplete tail (fewer bytes than a header or
    than the batch's size), which is what a crash mid-append leaves. Does
    not check CRCs (use `validate_batch` for that); raises
    `CorruptRecordError` only for a header that cannot be framed: wrong
    magic or a batch_length shorter than a header.
    """
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        header = new_tuple(BatchHeader, _unpack_header(buf, pos))
        if header[3] != MAGIC:
            raise CorruptRecordError(
                f"record batch at position {pos} has magic {header[3]}, expected {MAGIC}", pos
            )
        if header[1] < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"record batch at position {pos} has batch_length {header[1]}, "
                f"less than the {MIN_BATCH_LENGTH} bytes of a header",
                pos,
            )
        size = header[1] + LOG_OVERHEAD
        if end - pos < size:
            return
        yield pos, header
        pos += size


def _record_fields(record) -> tuple:
    """(key, value, headers, timestamp_ms) from a 4-tuple or a Record-like."""
    if hasattr(record, "key"):
        return record.key, record.value, record.headers, record.timestamp
    key, value, headers, timestamp_ms = record
    return key, value, headers, timestamp_ms


def build_batch(
    records: Iterable,
    *,
    base_offset: int = 0,
    compression: int = NO_COMPRESSION,
    timestamp_type: int = CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    base_timestamp: int | None = None,
) -> bytes:
    """Encode `records` as one v2 batch with offsets base_offset + index.

    Each record is a `(key, value, headers, timestamp_ms)` tuple or has
    those attributes (`timestamp` for the time), like `Record`. A
    timestamp of None becomes `base_timestamp`, or -1 (no timestamp) when
    that is None too: this core never reads a clock. `base_timestamp`
    defaults to the first record's timestamp, as Kafka's producer does.
    """
    fields = [_record_fields(r) for r in records]
    if not fields:
        raise StorageError("build_batch needs at least one record: Kafka has no empty client batch")
    timestamps = [
        (ts if ts is not None else (base_timestamp if base_timestamp is not None else NO_TIMESTAMP))
        for _, _, _, ts in fields
    ]
    if base_timestamp is None:
        base_timestamp = timestamps[0]
    body = bytearray()
    for offset_delta, ((key, value, headers, _), ts) in enumerate(zip(fields, timestamps)):
        encode_record(body, ts - base_timestamp, offset_delta, key, value, headers)
    attributes = compression & COMPRESSION_MASK
    if compression != NO_COMPRESSION:
        assert attributes == compression, f"compression id {compression} is not 0..4"
        body = compress(compression, body)
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    out = bytearray(HEADER_SIZE + len(body))
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(body),
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        len(fields) - 1,
        base_timestamp,
        max(timestamps),
        producer_id,
        producer_epoch,
        base_sequence,
        len(fields),
    )
    out[HEADER_SIZE:] = body
    _UINT32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START_OFFSET:]))
    return bytes(out)


class ControlRecordType:
    """Control record types (the key's int16 type; Kafka's ControlRecordType)."""

    ABORT = 0  # KIP-98 transaction marker
    COMMIT = 1  # KIP-98 transaction marker
    LEADER_CHANGE = 2  # KIP-595: written by a new Raft leader
    SNAPSHOT_HEADER = 3  # KIP-630
    SNAPSHOT_FOOTER = 4  # KIP-630
    KRAFT_VERSION = 5  # KIP-853
    KRAFT_VOTERS = 6  # KIP-853


_CONTROL_KEY = struct.Struct(">hh")
CONTROL_KEY_VERSION = 0


def control_key(control_type: int) -> bytes:
    """The key of a control record: int16 version 0, int16 type."""
    return _CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)


def parse_control_key(key: bytes) -> tuple[int, int]:
    """`(version, type)` from a control record's key."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record key {key!r} is shorter than 4 bytes")
    return _CONTROL_KEY.unpack_from(key)


def build_control_batch(
    control_type: int,
    value: bytes,
    *,
    base_offset: int = 0,
    timestamp_ms: int = NO_TIMESTAMP,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    is_transactional: bool | None = None,
) -> bytes:
    """One control batch holding one control record of `control_type`.

    Transaction markers (ABORT, COMMIT) are transactional batches of the
    producer they end; Raft's records (LEADER_CHANGE and later) are not.
    `is_transactional=None` picks accordingly.
    """
    if is_transactional is None:
        is_transactional = control_type in (ControlRecordType.ABORT, ControlRecordType.COMMIT)
    return build_batch(
        [(control_key(control_type), value, (), timestamp_ms)],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=is_transactional,
        is_control=True,
    )


def iter_records(batch, pos: int = 0) -> Iterator[Record]:
    """Validate the batch at `pos` and yield its records, decompressing if
    needed. For a LogAppendTime batch every record's timestamp is the
    batch's max_timestamp (KIP-32)."""
    header = validate_batch(batch, pos)
    view = batch if type(batch) is memoryview else memoryview(batch)
    section = view[pos + HEADER_SIZE : pos + header.size_in_bytes]
    log_append_time = header.max_timestamp if header.timestamp_type == LOG_APPEND_TIME else None
    try:
        if header.compression != NO_COMPRESSION:
            section = decompress(header.compression, section)
        records = decode_records(
            section, header.records_count, header.base_offset, header.base_timestamp, log_append_time
        )
    except CorruptRecordError as exc:
        # Say which batch: a reader logs this, and the records' own
        # positions are relative to their section.
        raise CorruptRecordError(
            f"record batch at position {pos} (base_offset {header.base_offset}): {exc}", pos
        ) from None
    yield from records


_MARKER_VALUE = struct.Struct(">hi")
#: EndTransactionMarker value version (Kafka's): int16 version, int32 coordinator_epoch.
END_TXN_MARKER_VERSION = 0


def end_txn_marker_value(coordinator_epoch: int) -> bytes:
    """The value of a COMMIT/ABORT control record (Kafka's EndTransactionMarker)."""
    return _MARKER_VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def read_txn_marker(batch, pos: int = 0) -> tuple[int, int] | None:
    """`(control type, coordinator epoch)` of the transaction marker (a
    control batch) at `pos`; None if its record is not ABORT or COMMIT."""
    for record in iter_records(batch, pos):
        _version, control_type = parse_control_key(record.key)
        if control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
            return None
        value = record.value
        if value is None or len(value) < _MARKER_VALUE.size:
            raise CorruptRecordError(f"transaction marker value {value!r} is shorter than 6 bytes")
        return control_type, _MARKER_VALUE.unpack_from(value)[1]
    return None
