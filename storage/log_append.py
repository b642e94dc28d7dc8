"""The `Log`'s checked appends: everything `Log.append`'s fast path hands
over, and the follower's append. Split from `storage.log` by size; read
that module's docstring first.

`Log.append` writes the common batch itself (valid, not idempotent, no
roll due) with a handful of integer comparisons and the CRC; any other
batch comes to `append_checked`, which runs the full `validate_batch`
(so a bad batch gets its exact error), the idempotent producer checks
(KIP-98), the roll rules, and the write.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from storage import log_ops
from storage.batch import LOG_OVERHEAD, validate_batch
from storage.errors import CorruptRecordError, UnexpectedAppendOffsetError
from storage.producer_state import ProduceCheck, ProducerStateError

if TYPE_CHECKING:
    from storage.log import Log

# base_offset, batch_length, partition_leader_epoch: the bytes a leader
# rewrites, all before the CRC-covered part.
PREFIX = struct.Struct(">qii")


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
