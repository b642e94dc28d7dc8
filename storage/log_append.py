"""The `Log`'s appends: the leader's (`append_as_leader`, which is
`Log.append`), its checked path, and the follower's. Split from
`storage.log` by size; read that module's docstring first.

`append_as_leader` writes the common batch itself (valid, not
idempotent, no roll due) with one `struct` unpack, a handful of integer
comparisons, the CRC and one `os.pwrite`, then does the bookkeeping of
`LogSegment.record_batch` inline, to save a Python call per batch. A
test (the index rebuilt by recovery equals the one built by appending)
holds the two to the same result. Any other batch comes to `append_checked`, which runs the full
`validate_batch` (so a bad batch gets its exact error), the idempotent
producer checks (KIP-98), the roll rules, and the write.

`append_as_follower` has the same split: the common buffer a leader sends
(one batch, not idempotent, no roll due) is checked with one unpack and
written at once; anything else goes to `append_batches_as_follower`."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING

from crc32c import crc32c

from storage import log_ops
from storage.batch import (
    CODEC_OR_CONTROL_MASK,
    COMPRESSION_MASK,
    CRC_START_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    ZSTD,
    unpack_follower_fields,
    unpack_plain_client_fields,
    validate_batch,
)
from storage.errors import CorruptRecordError, UnexpectedAppendOffsetError
from storage.producer_state import ProduceCheck, ProducerStateError
from storage.segment import RECENT_BATCHES

if TYPE_CHECKING:
    from storage.log import Log

# base_offset, batch_length, partition_leader_epoch: the bytes a leader
# rewrites, all before the CRC-covered part.
PREFIX = struct.Struct(">qii")
# Only the base offset, when the batch keeps its partition_leader_epoch.
BASE_OFFSET = struct.Struct(">q")

_unpack = unpack_plain_client_fields
_pack_prefix = PREFIX.pack
_pack_prefix_into = PREFIX.pack_into
_pack_base_offset_into = BASE_OFFSET.pack_into
_pwrite = os.pwrite
_pwritev = os.pwritev


def append_as_leader(log: Log, batch, now_ms: int, leader_epoch: int | None = None) -> int:
    """Append one client batch as leader; return its base offset.

    `leader_epoch`, if given, is stamped into the batch. Raises
    `CorruptRecordError`, `InvalidRecordError`, `RecordTooLargeError` or
    `ProducerStateError` (the log is unchanged then). A duplicate of one of
    an idempotent producer's last 5 batches is not written: the base
    offset it got the first time comes back.
    """
    # The fast path (module doc): every check of `validate_batch(...,
    # from_client=True)` as an integer comparison on one unpack; when one
    # fails, or the producer is idempotent, or a roll is due,
    # `append_checked` does it all again and says what is wrong.
    # records_count == last_offset_delta + 1 >= 1 covers validate's count
    # rules; size == len(batch) >= 61 its length rules.
    try:
        batch_length, epoch, magic, crc, attributes, delta, max_timestamp, pid_sign, count = _unpack(batch)
    except struct.error:
        return append_checked(log, batch, now_ms, leader_epoch)
    size = batch_length + LOG_OVERHEAD
    base = log._log_end_offset
    next_offset = base + count
    segment = log._segments[-1]
    f = segment.log
    position = f.size
    end = position + size
    view = memoryview(batch)
    if (
        magic != MAGIC
        or pid_sign >= 0  # producer_id >= 0: the producer state decides
        or size != len(batch)
        or size > log._max_message_bytes
        or count != delta + 1
        or count <= 0
        or attributes & CODEC_OR_CONTROL_MASK > ZSTD
        # `LogSegment.should_roll`'s triggers, as precomputed bounds.
        or end > segment.roll_bytes
        or next_offset > segment.max_next_offset
        or max_timestamp > segment.roll_at_timestamp
        or now_ms > segment.roll_at_ms
        or crc32c(view[CRC_START_OFFSET:]) != crc
    ):
        return append_checked(log, batch, now_ms, leader_epoch)
    # One write call at the end of the active segment; a simulated file (fd
    # -1) or a short write (a full disk) goes through the file's own
    # append, which writes it all or raises ENOSPC.
    fd = segment.fd
    try:
        if type(batch) is bytearray or not view.readonly:
            if leader_epoch is None:
                _pack_base_offset_into(view, 0, base)
            else:
                epoch = leader_epoch
                _pack_prefix_into(view, 0, base, batch_length, epoch)
            if fd >= 0 and _pwrite(fd, view, position) == size:
                f.size = end
            else:
                f.append(view)
        else:
            if leader_epoch is not None:
                epoch = leader_epoch
            parts = (_pack_prefix(base, batch_length, epoch), view[16:])
            if fd >= 0 and _pwritev(fd, parts, position) == size:
                f.size = end
            else:
                f.appendv(parts)
    except OSError:
        log_ops.rollback(f, position)
        raise
    # `segment.record_batch(position, base, next_offset, max_timestamp)`,
    # inline (module doc).
    if max_timestamp > segment.max_timestamp:
        segment.max_timestamp = max_timestamp
        segment.offset_of_max_timestamp = base
    if position >= segment.next_index_position:
        offset_index = segment.offset_index
        offsets = offset_index.offsets
        offsets.append(base)
        offset_index.positions.append(position)
        segment._last_index_position = position
        segment.next_index_position = position + segment.index_interval_bytes
        if len(offsets) >= offset_index.max_entries:
            segment.index_full = True
        time_index = segment.time_index
        if segment.max_timestamp > time_index.last_ts:
            timestamps = time_index.timestamps
            timestamps.append(segment.max_timestamp)
            time_index.offsets.append(segment.offset_of_max_timestamp)
            time_index.last_ts = segment.max_timestamp
            if len(timestamps) >= time_index.max_entries:
                segment.index_full = True
    elif not position:
        segment.set_first_batch_timestamp(max_timestamp)
    recent = segment.recent_batches
    recent[base] = position
    if len(recent) > RECENT_BATCHES:
        del recent[next(iter(recent))]
    segment.next_offset = next_offset
    segment.last_append_ms = now_ms
    log._log_end_offset = next_offset
    if epoch > log.epoch_cache.latest_epoch:
        log.epoch_cache.assign(epoch, base)
    if log._flush_policy:
        log._unflushed_messages += count
        log.maybe_flush(now_ms)
    return base


def append_checked(log: Log, batch, now_ms: int, leader_epoch: int | None) -> int:
    """`Log.append` for any batch (see its docstring)."""
    header = validate_batch(batch, 0, log._max_message_bytes, from_client=True)
    size = header[1] + LOG_OVERHEAD
    if size != len(batch):
        raise CorruptRecordError(
            f"append takes one batch: the buffer holds {len(batch)} bytes, its batch {size}", size
        )
    base = log._log_end_offset
    producer_state = log.producer_state
    if producer_state is not None and header[9] >= 0:
        checked = producer_state.check(header, base)
        if checked.error is ProduceCheck.DUPLICATE_SEQUENCE_NUMBER:
            return checked.first_offset
        if checked.error:
            raise ProducerStateError(checked)
    next_offset = base + header[6] + 1
    max_timestamp = header[8]
    segment = log._maybe_roll(log._segments[-1], size, max_timestamp, next_offset - 1, now_ms, base)
    f = segment.log
    epoch = header[2] if leader_epoch is None else leader_epoch
    size_before = f.size
    try:
        if type(batch) is bytearray or (type(batch) is memoryview and not batch.readonly):
            PREFIX.pack_into(batch, 0, base, header[1], epoch)
            position = f.append(batch)
        else:
            view = batch if type(batch) is memoryview else memoryview(batch)
            position = f.appendv((PREFIX.pack(base, header[1], epoch), view[16:]))
    except OSError:
        log_ops.rollback(f, size_before)
        raise
    segment.record_batch(position, base, next_offset, max_timestamp)
    segment.last_append_ms = now_ms
    log._log_end_offset = next_offset
    if producer_state is not None and header[9] >= 0:
        producer_state.update(header, base)
    if epoch > log.epoch_cache.latest_epoch:
        log.epoch_cache.assign(epoch, base)
    log._unflushed_messages += header[12]
    if log._flush_policy:
        log.maybe_flush(now_ms)
    return base


def append_as_follower(log: Log, records, now_ms: int) -> int:
    """`Log.append_as_follower` (see its docstring)."""
    # The fast path (module doc): `validate_batch`'s checks of a follower's
    # batch as integer comparisons on one unpack, for a buffer holding
    # exactly one batch; anything else, or a failed check, goes the checked
    # way, which also says what is wrong. size == len(records) >= 61 covers
    # the length rules. A fence sends each follower one small batch per
    # partition, thousands at once (as in `raftka bench failover
    # --led-partitions 10000 --acks all`): the case this path is for.
    try:
        base, batch_length, epoch, magic, crc, attributes, delta, max_timestamp, pid_sign, count = (
            unpack_follower_fields(records))
    except struct.error:
        return append_batches_as_follower(log, records, now_ms)
    size = batch_length + LOG_OVERHEAD
    next_offset = base + delta + 1
    segment = log._segments[-1]
    f = segment.log
    position = f.size
    end = position + size
    if (
        magic != MAGIC
        or pid_sign >= 0  # producer_id >= 0: the producer state follows it
        or size != len(records)
        or size > log._max_message_bytes
        or base < log._log_end_offset
        or delta < 0
        or count < 0
        or count > delta + 1
        or attributes & COMPRESSION_MASK > ZSTD
        # `LogSegment.should_roll`'s triggers, as precomputed bounds.
        or end > segment.roll_bytes
        or next_offset > segment.max_next_offset
        or max_timestamp > segment.roll_at_timestamp
        or now_ms > segment.roll_at_ms
        or crc32c(memoryview(records)[CRC_START_OFFSET:]) != crc
    ):
        return append_batches_as_follower(log, records, now_ms)
    fd = segment.fd
    try:
        if fd >= 0 and _pwrite(fd, records, position) == size:
            f.size = end
        else:
            f.append(records)
    except OSError:
        log_ops.rollback(f, position)
        raise
    segment.record_batch(position, base, next_offset, max_timestamp)
    if epoch > log.epoch_cache.latest_epoch:
        log.epoch_cache.assign(epoch, base)
    log._unflushed_messages += count
    segment.last_append_ms = now_ms
    log._log_end_offset = next_offset
    if log._flush_policy:
        log.maybe_flush(now_ms)
    return base


def append_batches_as_follower(log: Log, records, now_ms: int) -> int:
    """`append_as_follower` for any buffer: every batch validated, in order."""
    batches = []
    position = 0
    expected = log._log_end_offset
    while position < len(records):
        header = validate_batch(records, position, log._max_message_bytes)
        if header.base_offset < expected:
            raise UnexpectedAppendOffsetError(
                f"follower batch at base offset {header.base_offset} is below "
                f"{'the log end offset' if not batches else 'the previous batch end'} {expected}: "
                "truncate the log (by leader epoch) before appending",
                header.base_offset,
                log._log_end_offset,
            )
        batches.append((position, header))
        expected = header.next_offset
        position += header.size_in_bytes
    if not batches:
        return log._log_end_offset
    first = batches[0][1]
    last_offset = batches[-1][1].last_offset
    segment = log._maybe_roll(
        log._segments[-1], len(records), first.max_timestamp, last_offset, now_ms, first.base_offset
    )
    start = log_ops.write(segment.log, records)
    producer_state = log.producer_state
    for position, header in batches:
        segment.record_batch(start + position, header.base_offset, header.next_offset, header.max_timestamp)
        if producer_state is not None and header[9] >= 0:
            producer_state.update(header)
        epoch = header.partition_leader_epoch
        if epoch > log.epoch_cache.latest_epoch:
            log.epoch_cache.assign(epoch, header.base_offset)
        log._unflushed_messages += header.records_count
    segment.last_append_ms = now_ms
    log._log_end_offset = expected
    if log._flush_policy:
        log.maybe_flush(now_ms)
    return first.base_offset
