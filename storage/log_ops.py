"""Helpers of the `Log`'s rarer operations: loading a log directory on
open, the epochs a lost epoch checkpoint is rebuilt from, which segments
retention deletes, and the time lookup. Split from `storage.log` by size;
read that module's docstring first (the Durability section applies here).
Each takes a directory, segments and plain values, none a `Log`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

from common.errors import ConfigError
from storage.batch import iter_records
from storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import CorruptCheckpointError, CorruptRecordError
from storage.fs import FileSystem
from storage.producer_snapshot import snapshot_offsets_in
from storage.recovery import load_segments
from storage.segment import LogSegment

logger = logging.getLogger("storage.log")


def parse_topic_partition(dir_name: str) -> tuple[str, int] | None:
    """`("my-topic", 3)` from `my-topic-3`, or None."""
    topic, sep, partition = dir_name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


# --- open ---


class LoadedLog(NamedTuple):
    """What `load_log` found in a log directory, recovered and durable."""

    fresh: bool  # the directory was just created
    topic_partition: tuple[str, int] | None  # with checkpoint files only
    segments: list[LogSegment]
    recovered: list[LogSegment]  # the segments re-read past the recovery point
    log_start_offset: int  # may be past the log end offset: the log restarts there
    epoch_cache: LeaderEpochCache
    checkpointed_recovery_point: int
    new_segment: bool  # the directory held no segment: one was created
    snapshot_offsets: list[int]  # of the producer snapshot files, as listed


def load_log(
    fs: FileSystem,
    dir_path: str,
    config: LogConfig,
    now_ms: int,
    recovery_point: int | None,
    log_start_offset: int | None,
    checkpoint_files: bool,
    exists: bool | None = None,
    listing: list[str] | None = None,
) -> LoadedLog:
    """Load the log in `dir_path` (made if missing) for `Log.open` (see its
    docstring): read the checkpoints, recover the segments past the
    recovery point, fsync what was recovered. `exists`: the caller saw the
    directory; `listing`: its names, if the caller listed it."""
    # A fresh log fsyncs nothing here: it holds no batch, so a crash that
    # loses its files loses nothing promised; its first flush makes the
    # segment files and the directory entries durable (`Log._fsync_dirs`).
    # Creating thousands of partitions costs no fsync each.
    fresh = not (exists or fs.exists(dir_path))
    if fresh:
        fs.makedirs(dir_path)
    checkpointed_rp = recovery_point
    tp = None
    if checkpoint_files:
        tp = parse_topic_partition(os.path.basename(os.path.normpath(dir_path)))
        if tp is None:
            raise ConfigError(
                f"log directory {dir_path} is not named <topic>-<partition>: rename it, or open "
                "the log with checkpoint_files=False and pass recovery_point and log_start_offset"
            )
        parent = os.path.dirname(os.path.normpath(dir_path)) or "."
        if recovery_point is None:
            recovery_point = checkpointed_rp = _read_offset(fs, parent, RECOVERY_POINT_OFFSET_CHECKPOINT, tp)
        if log_start_offset is None:
            log_start_offset = _read_offset(fs, parent, LOG_START_OFFSET_CHECKPOINT, tp)
    recovery_point = recovery_point or 0

    # One listing of the directory for the segments, the producer
    # snapshots and whether the epoch checkpoint and the indexes exist
    # (none for a directory just made): each listing, or look for one
    # file, in 100,000 directories at start-up cost seconds. Nothing below
    # makes or removes a snapshot file before the producer state reads them.
    listing = [] if fresh else fs.listdir(dir_path) if listing is None else listing
    epoch_file = LeaderEpochCheckpointFile(fs, os.path.join(dir_path, LEADER_EPOCH_CHECKPOINT))
    entries: list[tuple[int, int]] = []
    # No file: the entries are rebuilt from the batches (a missing file reads as empty).
    rebuild_epochs = LEADER_EPOCH_CHECKPOINT not in listing
    if not rebuild_epochs:
        try:
            entries = epoch_file.read(listed=True)
        except FileNotFoundError:
            rebuild_epochs = True  # removed since the listing
        except CorruptCheckpointError as e:
            logger.warning("%s: %s; rebuilding the leader epoch cache from the batches", dir_path, e)
            entries, rebuild_epochs = [], True
    epoch_cache = LeaderEpochCache(entries, checkpoint=epoch_file)
    segments, recovered = load_segments(
        fs,
        dir_path,
        config,
        recovery_point,
        now_ms,
        None if rebuild_epochs else epoch_cache,
        log_start_offset or 0,
        listing,
    )
    new_segment = not segments
    if new_segment:
        segments = [LogSegment(fs, dir_path, log_start_offset or 0, config, now_ms)]
        segments[0].without_index_files()
        recovered = list(segments)
    log_end_offset = segments[-1].next_offset
    log_start_offset = max(log_start_offset or 0, segments[0].base_offset)

    if rebuild_epochs and not fresh:
        epoch_cache = LeaderEpochCache(epochs_from_batches(segments, log_start_offset), checkpoint=epoch_file)
        # No file and no entry (a partition never written): a missing file reads as empty.
        if epoch_cache.entries or fs.exists(epoch_file.path):
            epoch_file.write(epoch_cache.entries)
    # Not written: entries past the log end offset stay on file until the
    # log first appends (`stale_on_file`), and every load drops them here
    # again till then (Kafka
    # since KAFKA-15046 flushes this truncation asynchronously). A broker
    # restarted drops the epoch of every empty partition it led (it starts
    # at the log end offset): rewriting the file of each made a restart with
    # 30,000 of them spend 25 s in renames.
    epoch_cache.truncate_from_end(log_end_offset, write=False)
    epoch_cache.truncate_from_start(log_start_offset)

    if not fresh:
        epoch_cache.flush()
        # An empty segment holds nothing to make durable: a broker restarted
        # after a crash with thousands of empty partitions spent four fsyncs
        # on each. If one was cut to empty and the cut is lost, the torn
        # bytes lie past the recovery point and are cut again.
        written = [segment for segment in recovered if segment.size]
        for segment in written:
            segment.flush()
        if written:
            fs.fsync_dir(dir_path)
    return LoadedLog(fresh, tp, segments, recovered, log_start_offset, epoch_cache, checkpointed_rp or 0,
                     new_segment, snapshot_offsets_in(listing))


def _read_offset(fs: FileSystem, parent: str, file_name: str, tp: tuple[str, int]) -> int | None:
    try:
        return OffsetCheckpointFile(fs, os.path.join(parent, file_name)).read().get(tp)
    except CorruptCheckpointError as e:
        logger.warning("%s; ignoring it (the log is recovered from its first segment)", e)
        return None


def epochs_from_batches(segments: Sequence[LogSegment], log_start_offset: int) -> list[tuple[int, int]]:
    """The leader epoch entries `(epoch, start offset)` read from every
    batch header at or past `log_start_offset` (the `leader-epoch-checkpoint`
    is missing or damaged)."""
    entries: list[tuple[int, int]] = []
    latest = -1
    for segment in segments:
        try:
            for _position, header in segment.scan_headers(0):
                epoch = header.partition_leader_epoch
                if epoch > latest and header.last_offset >= log_start_offset:
                    entries.append((epoch, header.base_offset))
                    latest = epoch
        except CorruptRecordError as e:
            # A damaged header inside a flushed segment: reads will report
            # it; the cache keeps what was found before it.
            logger.error("%s: %s; the leader epoch cache stops there", segment.path(".log"), e)
            break
    return entries


def expired_segments(
    segments: Sequence[LogSegment], log_start_offset: int, config: LogConfig, now_ms: int, dir_path: str
) -> int:
    """How many of the oldest `segments` retention deletes: those wholly
    below `log_start_offset`, older than `retention.ms`, or over
    `retention.bytes`; never the last (active) one. Logs each reason."""
    total = sum(s.size for s in segments)
    count = 0
    while len(segments) - count > 1:
        segment, following = segments[count], segments[count + 1]
        reasons = []
        if following.base_offset <= log_start_offset:
            reasons.append(f"below the log start offset {log_start_offset}")
        if config.retention_ms >= 0 and now_ms - segment.largest_timestamp() > config.retention_ms:
            reasons.append(f"newest timestamp {segment.largest_timestamp()} older than retention.ms")
        if config.retention_bytes >= 0 and total - segment.size >= config.retention_bytes:
            reasons.append(f"log is {total} bytes, over retention.bytes")
        if not reasons:
            break
        logger.info("%s: deleting segment %d: %s", dir_path, segment.base_offset, "; ".join(reasons))
        total -= segment.size
        count += 1
    return count


def offset_for_timestamp(
    segments: Sequence[LogSegment], log_start_offset: int, timestamp: int
) -> tuple[int, int] | None:
    """`Log.offset_for_timestamp` over `segments` (see its docstring)."""
    for segment in segments:
        if segment.max_timestamp < timestamp or segment.next_offset <= log_start_offset:
            continue
        start_offset = max(segment.time_index.lookup_before(timestamp).offset, log_start_offset)
        position = segment.offset_index.lookup(start_offset).position
        for position, header in segment.scan_headers(position):
            if header.last_offset < log_start_offset or header.max_timestamp < timestamp:
                continue
            if segment.unchecked:
                segment.check_range(position, position + header.size_in_bytes)
            batch = segment.log.pread(header.size_in_bytes, position)
            for record in iter_records(batch):
                if record.offset >= log_start_offset and record.timestamp >= timestamp:
                    return record.offset, record.timestamp
    return None
