"""Pure helpers of the `Log`'s append paths: the full checks of a batch
and the guarded writes. Split from `storage.log` by size; read that
module's docstring first.

None of them touches a `Log`: each takes a buffer, a file and plain
values, and `Log.append` / `Log.append_as_follower` keep the log's state.
Their fast paths (the common batch: one unpack, integer comparisons, the
CRC, one write) stay inline in those methods; the helpers here serve every
other batch, so that a bad one gets its exact error.
"""

from __future__ import annotations

import logging
import struct

from storage.batch import LOG_OVERHEAD, BatchHeader, validate_batch
from storage.errors import CorruptRecordError, UnexpectedAppendOffsetError
from storage.fs import File

logger = logging.getLogger("storage.log")

# base_offset, batch_length, partition_leader_epoch: the bytes a leader
# rewrites, all before the CRC-covered part.
PREFIX = struct.Struct(">qii")
# Only the base offset, when the batch keeps its partition_leader_epoch.
BASE_OFFSET = struct.Struct(">q")


def check_client_batch(batch, max_message_bytes: int) -> BatchHeader:
    """`validate_batch(..., from_client=True)` of a buffer that must hold
    exactly one batch (a leader's append)."""
    header = validate_batch(batch, 0, max_message_bytes, from_client=True)
    size = header[1] + LOG_OVERHEAD
    if size != len(batch):
        raise CorruptRecordError(
            f"append takes one batch: the buffer holds {len(batch)} bytes, its batch {size}", size
        )
    return header


def check_follower_batches(records, max_message_bytes: int, log_end_offset: int) -> list[tuple[int, BatchHeader]]:
    """`[(position, header)]` of every batch in a follower's buffer, each
    validated, in order; the first at or past `log_end_offset`, each at or
    past the end of the one before."""
    batches = []
    position = 0
    expected = log_end_offset
    while position < len(records):
        header = validate_batch(records, position, max_message_bytes)
        if header.base_offset < expected:
            raise UnexpectedAppendOffsetError(
                f"follower batch at base offset {header.base_offset} is below "
                f"{'the log end offset' if not batches else 'the previous batch end'} {expected}: "
                "truncate the log (by leader epoch) before appending",
                header.base_offset,
                log_end_offset,
            )
        batches.append((position, header))
        expected = header.next_offset
        position += header.size_in_bytes
    return batches


def write_stamped(f: File, batch, base: int, batch_length: int, epoch: int) -> int:
    """Append `batch` to `f` with base offset `base` and leader epoch
    `epoch`; return its position. A writable buffer is rewritten in place,
    a read-only one goes out behind a new 16-byte prefix: no copy either
    way. On an I/O error the partial write is cut off again (`rollback`)."""
    size_before = f.size
    try:
        if type(batch) is bytearray or (type(batch) is memoryview and not batch.readonly):
            PREFIX.pack_into(batch, 0, base, batch_length, epoch)
            return f.append(batch)
        view = batch if type(batch) is memoryview else memoryview(batch)
        return f.appendv((PREFIX.pack(base, batch_length, epoch), view[16:]))
    except OSError:
        rollback(f, size_before)
        raise


def write(f: File, data) -> int:
    """`f.append(data)`; on an I/O error, cut the partial write off again
    so the log stays a sequence of whole batches, then re-raise."""
    size = f.size
    try:
        return f.append(data)
    except OSError:
        rollback(f, size)
        raise


def rollback(f: File, size: int) -> None:
    try:
        f.truncate(size)
    except OSError:
        logger.exception("%s: could not cut a failed append back to %d bytes", f.path, size)
