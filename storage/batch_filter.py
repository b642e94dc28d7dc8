"""Compaction of one record batch: keep the newest record per key.

Theory of operation
-------------------
`filter_batch` decides each record of a v2 batch against the cleaner's
`OffsetMap` (key -> newest offset in the dirty part of the log), as
Kafka's LogCleaner does:

- a record whose key has a newer offset in the map goes;
- a record without a key goes (a compacted topic refuses them on produce;
  any left from before the topic was compacted cannot be kept per key);
- a tombstone (null value) that is its key's newest record stays until
  its batch's delete horizon has passed (KIP-534, below), then goes;
- control batches (transaction markers, Raft records) stay untouched:
  the cleaner decides on transaction markers itself (`storage.cleaner_job`)
  and gives one a delete horizon with `with_delete_horizon`.

Offsets never change. A batch that keeps some records keeps its base
offset, `last_offset_delta`, producer id, epoch and base sequence, and
its records keep their offset deltas; only `records_count` shrinks (the
format allows it; `validate_batch` accepts records_count <=
last_offset_delta + 1). So does the producer's last sequence, which is
computed from the offset delta. A compressed batch is decompressed,
filtered and compressed again with its own codec.

A batch left with no record disappears, with one exception taken from
Kafka: the newest batch of an idempotent producer stays as an empty
batch (records_count 0, no compression), so the producer state rebuilt
from the log still knows that producer's epoch and last sequence.

Delete horizon (KIP-534, Kafka >= 3.1): the first time a batch holding a
kept tombstone is cleaned, its attributes get bit 6 and its
base_timestamp becomes `now_ms + delete.retention.ms`; the records'
timestamp deltas are rewritten against it, so every record keeps its
timestamp. A later clean after that time removes the tombstones. This
bounds how long a consumer that reads from the start has to reach a
tombstone after the values it deletes were removed, which is what
`delete.retention.ms` promises. (Before KIP-534 Kafka measured the
horizon from segment modification times.)

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

from storage.batch import (
    CONTROL_MASK,
    CRC_OFFSET,
    CRC_START_OFFSET,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    NO_COMPRESSION,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    iter_records,
)
from storage.batch_records import encode_record
from storage.compression import compress
from storage.offset_map import OffsetMap

DELETE_HORIZON_MASK = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")


def delete_horizon_ms(header: BatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), or None if it has none."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_MASK else None


class FilterResult(NamedTuple):
    """What became of a batch. `batch` is the input object itself when
    nothing changed, new bytes when rewritten, None when it is gone.
    `delete_horizon_ms` is the horizon of the tombstones it still holds
    (None if it holds none): when the cleaner should come back."""

    batch: object
    records_kept: int
    records_removed: int
    delete_horizon_ms: int | None


def filter_batch(
    batch,
    header: BatchHeader,
    offset_map: OffsetMap,
    now_ms: int,
    delete_retention_ms: int,
    keep_if_empty: bool,
) -> FilterResult:
    """Compact one whole batch (`header` is its parsed header)."""
    if header.is_control:
        return FilterResult(batch, header.records_count, 0, None)
    horizon = delete_horizon_ms(header)
    tombstones_expired = horizon is not None and now_ms >= horizon
    kept = []
    tombstones = 0
    get = offset_map.get
    for record in iter_records(batch):
        key = record.key
        if key is None or record.offset < get(key):
            continue
        if record.value is None:
            if tombstones_expired:
                continue
            tombstones += 1
        kept.append(record)
    removed = header.records_count - len(kept)
    if tombstones and horizon is None:
        horizon = now_ms + delete_retention_ms
    elif not removed:
        return FilterResult(batch, len(kept), 0, horizon if tombstones else None)
    if not kept:
        if keep_if_empty:
            return FilterResult(empty_batch(header), 0, removed, None)
        return FilterResult(None, 0, removed, None)
    return FilterResult(_rebuild(header, kept, horizon if tombstones else None), len(kept), removed,
                        horizon if tombstones else None)


def with_delete_horizon(batch, header: BatchHeader, horizon_ms: int) -> bytes:
    """`batch` with its delete horizon set to `horizon_ms` (KIP-534's
    bit 6 and base timestamp; every record keeps its timestamp): how a
    transaction marker that can go is kept until `delete.retention.ms`
    has passed, as Kafka's cleaner does."""
    return _rebuild(header, list(iter_records(batch)), horizon_ms)


def _rebuild(header: BatchHeader, records: list, horizon: int | None) -> bytes:
    log_append_time = header.timestamp_type == LOG_APPEND_TIME
    if log_append_time:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in records)
    if horizon is not None:
        base_timestamp = horizon
    else:
        base_timestamp = max_timestamp if log_append_time else records[0].timestamp
    body = bytearray()
    base_offset = header.base_offset
    for r in records:
        encode_record(body, r.timestamp - base_timestamp, r.offset - base_offset, r.key, r.value, r.headers)
    codec = header.compression
    if codec != NO_COMPRESSION:
        body = compress(codec, body)
    attributes = header.attributes & ~DELETE_HORIZON_MASK
    if horizon is not None:
        attributes |= DELETE_HORIZON_MASK
    return _pack(header, attributes, base_timestamp, max_timestamp, len(records), body)


def empty_batch(header: BatchHeader) -> bytes:
    """The header-only batch that stands for `header`'s batch once all of
    its records are gone: same offsets, producer id, epoch and sequence."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    return _pack(header, attributes, header.max_timestamp, header.max_timestamp, 0, b"")


def _pack(header: BatchHeader, attributes: int, base_ts: int, max_ts: int, count: int, body) -> bytes:
    out = bytearray(HEADER_SIZE + len(body))
    _HEADER.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(body),
        header.partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        header.last_offset_delta,
        base_ts,
        max_ts,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    out[HEADER_SIZE:] = body
    _UINT32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START_OFFSET:]))
    return bytes(out)
