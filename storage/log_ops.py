"""The `Log`'s less frequent operations: open, truncation, retention, time
lookup, and the guarded write calls. Split from `storage.log` by size;
read that module's docstring first (the Durability section applies here).
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from typing import TYPE_CHECKING

from common.errors import ConfigError
from storage.batch import iter_records
from storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_OFFSET_CHECKPOINT
from storage.epoch_cache import LeaderEpochCache
from storage.errors import CorruptCheckpointError, CorruptRecordError
from storage.fs import File
from storage.recovery import load_segments
from storage.segment import LogSegment

if TYPE_CHECKING:
    from storage.log import Log

logger = logging.getLogger("storage.log")


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


# --- open ---


def open_log(log: Log, now_ms: int, recovery_point, log_start_offset, checkpoint_files: bool) -> None:
    fs = log.fs
    dir_path = log.dir_path
    # A fresh log fsyncs nothing here: it holds no batch, so a crash that
    # loses its files loses nothing promised; its first flush makes the
    # segment files and the directory entries durable (`Log._fsync_dirs`).
    # Creating thousands of partitions costs no fsync each.
    fresh = not fs.exists(dir_path)
    if fresh:
        fs.makedirs(dir_path)
        log._parent_dir_dirty = True
    checkpointed_rp = recovery_point
    if checkpoint_files:
        name = os.path.basename(os.path.normpath(dir_path))
        tp = _parse_tp(name)
        if tp is None:
            raise ConfigError(
                f"log directory {dir_path} is not named <topic>-<partition>: rename it, or open "
                "the log with checkpoint_files=False and pass recovery_point and log_start_offset"
            )
        log.topic_partition = tp
        log._checkpoint_files = True
        if recovery_point is None:
            recovery_point = checkpointed_rp = _read_offset(log, RECOVERY_POINT_OFFSET_CHECKPOINT)
        if log_start_offset is None:
            log_start_offset = _read_offset(log, LOG_START_OFFSET_CHECKPOINT)
    recovery_point = recovery_point or 0

    epoch_file = log._epoch_checkpoint()
    rebuild_epochs = False
    try:
        entries = epoch_file.read()
        rebuild_epochs = not fs.exists(epoch_file.path)
    except CorruptCheckpointError as e:
        logger.warning("%s: %s; rebuilding the leader epoch cache from the batches", dir_path, e)
        entries, rebuild_epochs = [], True
    log.epoch_cache = LeaderEpochCache(entries, checkpoint=epoch_file)

    segments, recovered = load_segments(
        fs,
        dir_path,
        log.config,
        recovery_point,
        now_ms,
        None if rebuild_epochs else log.epoch_cache,
        log_start_offset or 0,
    )
    if not segments:
        segments = [LogSegment(fs, dir_path, log_start_offset or 0, log.config, now_ms)]
        recovered = list(segments)
    log._segments = segments
    log._base_offsets = [s.base_offset for s in segments]
    log._log_end_offset = segments[-1].next_offset
    log._log_start_offset = max(log_start_offset or 0, segments[0].base_offset)

    if rebuild_epochs and not fresh:
        _rebuild_epoch_cache(log)
        epoch_file.write(log.epoch_cache.entries)
    log.epoch_cache.truncate_from_end(log._log_end_offset)
    log.epoch_cache.truncate_from_start(log._log_start_offset)

    if fresh:
        log._dir_dirty = True
    else:
        log.epoch_cache.flush()
        for segment in recovered:
            segment.flush()
        if recovered:
            fs.fsync_dir(dir_path)
    log._recovery_point = log._log_end_offset
    log._checkpointed_recovery_point = checkpointed_rp or 0
    if log._log_start_offset > log._log_end_offset:
        logger.warning(
            "%s: log start offset %d is past the recovered log end offset %d; restarting the log there",
            dir_path,
            log._log_start_offset,
            log._log_end_offset,
        )
        truncate_fully_and_start_at(log, log._log_start_offset)
    elif log._log_end_offset < log._checkpointed_recovery_point:
        log.write_checkpoints()
    logger.info(
        "%s: opened, log start offset %d, log end offset %d, %d segments (%d recovered)",
        dir_path,
        log._log_start_offset,
        log._log_end_offset,
        len(segments),
        len(recovered),
    )


def _rebuild_epoch_cache(log: Log) -> None:
    """Assign epochs from every batch header at or past the log start."""
    cache = log.epoch_cache
    for segment in log._segments:
        try:
            for _position, header in segment.scan_headers(0):
                epoch = header.partition_leader_epoch
                if epoch > cache.latest_epoch and header.last_offset >= log._log_start_offset:
                    cache._assign(epoch, header.base_offset)
        except CorruptRecordError as e:
            # A damaged header inside a flushed segment: reads will report
            # it; the cache keeps what was found before it.
            logger.error("%s: %s; the leader epoch cache stops there", segment.path(".log"), e)
            return


def _parse_tp(name: str):
    from storage.log import parse_topic_partition

    return parse_topic_partition(name)


def _read_offset(log: Log, file_name: str) -> int | None:
    checkpoint = log._checkpoint_file(file_name)
    try:
        return checkpoint.read().get(log.topic_partition)
    except CorruptCheckpointError as e:
        logger.warning("%s; ignoring it (the log is recovered from its first segment)", e)
        return None


# --- truncation ---


def truncate_to(log: Log, offset: int) -> bool:
    if offset >= log._log_end_offset:
        return False
    assert offset >= 0, f"cannot truncate to negative offset {offset}"
    if offset < log._segments[0].base_offset:
        truncate_fully_and_start_at(log, offset)
        return True
    i = bisect_right(log._base_offsets, offset) - 1
    removed = log._segments[i + 1 :]
    for segment in removed:
        segment.delete()
    del log._segments[i + 1 :]
    del log._base_offsets[i + 1 :]
    segment = log._segments[i]
    cut = segment.truncate_to(offset)
    log._log_end_offset = segment.next_offset
    logger.info(
        "%s: truncated to offset %d (log end offset now %d; %d bytes and %d segments removed)",
        log.dir_path,
        offset,
        log._log_end_offset,
        cut,
        len(removed),
    )
    start_moved = log._log_start_offset > log._log_end_offset
    if start_moved:
        log._log_start_offset = log._log_end_offset
    log.epoch_cache.truncate_from_end(log._log_end_offset)
    log._recovery_point = min(log._recovery_point, log._log_end_offset)
    segment.flush()
    log._dir_dirty = log._dir_dirty or bool(removed)
    log._fsync_dirs()
    if start_moved or log._recovery_point < log._checkpointed_recovery_point:
        log.write_checkpoints()
    return True


def truncate_fully_and_start_at(log: Log, offset: int) -> None:
    assert offset >= 0
    now_ms = log._segments[-1].last_append_ms if log._segments else 0
    for segment in log._segments:
        segment.delete()
    segment = LogSegment(log.fs, log.dir_path, offset, log.config, now_ms)
    log._segments = [segment]
    log._base_offsets = [offset]
    log._log_start_offset = log._log_end_offset = log._recovery_point = offset
    log.epoch_cache.clear()
    segment.flush()
    log._dir_dirty = True
    log._fsync_dirs()
    log.write_checkpoints()
    logger.info("%s: deleted every segment; the log restarts empty at offset %d", log.dir_path, offset)


# --- retention ---


def delete_old_segments(log: Log, now_ms: int) -> int:
    config = log.config
    segments = log._segments
    total = sum(s.size for s in segments)
    count = 0
    while len(segments) - count > 1:
        segment, following = segments[count], segments[count + 1]
        reasons = []
        if following.base_offset <= log._log_start_offset:
            reasons.append(f"below the log start offset {log._log_start_offset}")
        if config.retention_ms >= 0 and now_ms - segment.largest_timestamp() > config.retention_ms:
            reasons.append(f"newest timestamp {segment.largest_timestamp()} older than retention.ms")
        if config.retention_bytes >= 0 and total - segment.size >= config.retention_bytes:
            reasons.append(f"log is {total} bytes, over retention.bytes")
        if not reasons:
            break
        logger.info("%s: deleting segment %d: %s", log.dir_path, segment.base_offset, "; ".join(reasons))
        total -= segment.size
        count += 1
    if not count:
        return 0
    for segment in segments[:count]:
        segment.delete()
    del segments[:count]
    del log._base_offsets[:count]
    log._log_start_offset = max(log._log_start_offset, segments[0].base_offset)
    log.epoch_cache.truncate_from_start(log._log_start_offset)
    log.fs.fsync_dir(log.dir_path)
    # Nothing below the first segment is left to recover.
    log._recovery_point = max(log._recovery_point, segments[0].base_offset)
    return count


# --- time lookup ---


def offset_for_timestamp(log: Log, timestamp: int) -> tuple[int, int] | None:
    log_start = log._log_start_offset
    for segment in log._segments:
        if segment.max_timestamp < timestamp or segment.next_offset <= log_start:
            continue
        start_offset = max(segment.time_index.lookup_before(timestamp).offset, log_start)
        position = segment.offset_index.lookup(start_offset).position
        for position, header in segment.scan_headers(position):
            if header.last_offset < log_start or header.max_timestamp < timestamp:
                continue
            batch = segment.log.pread(header.size_in_bytes, position)
            for record in iter_records(batch):
                if record.offset >= log_start and record.timestamp >= timestamp:
                    return record.offset, record.timestamp
    return None
