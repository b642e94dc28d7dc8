"""A partition's log: segments of record batches, appended, read, truncated.

Theory of operation
-------------------
A `Log` is a directory `<topic>-<partition>/` of segments (see
`storage.segment`), each named by its base offset. Only the last segment,
the *active* one, is appended to. Offsets run from `log_start_offset` (the
first offset a reader may ask for) to `log_end_offset` (LEO, the offset the
next batch gets). The same engine holds data partitions and the Raft
metadata log `__cluster_metadata-0`.

- **Append as leader** (`append`): validate the batch (magic, size against
  `max.message.bytes`, CRC32C; no per-record work), give it offsets from
  the LEO by rewriting its base offset (bytes 0..8, outside the CRC), and
  write it as received: one write call. A refused batch changes nothing.
  The common batch (valid, non-idempotent, no roll due) takes a fast path:
  one `struct` unpack, integer comparisons, the CRC, one `os.pwrite`, and
  `LogSegment.record_batch`'s bookkeeping, inline. Every other batch,
  errors included, goes through `validate_batch` and the producer state
  (both in `storage.log_append`).
- **Append as follower** (`append_as_follower`): keep the batches' offsets,
  which must not go below the LEO (replication, Raft followers).
- **Read** (`read`): file slices of whole batches for `os.sendfile`, from
  the batch holding the offset; the first batch even if it is larger than
  `max_bytes` (Kafka's rule, so a consumer never stalls on a big batch).
- **Roll** on `segment.bytes`, `segment.ms`, a full index, or offsets too
  far from the base offset for the index's 32-bit relative offsets.
- **Retention** (`delete_old_segments`) removes old segments by time and
  size, never the active one, and moves `log_start_offset` up.
- **Leader epochs**: each batch carries the epoch of the leader that wrote
  it; the log records in `storage.epoch_cache` where each epoch starts.

Every method that depends on time takes `now_ms`; the log reads no clock.
A writable batch buffer (bytearray, writable memoryview) is rewritten in
place; a read-only one goes out through one vectored write with a new
16-byte prefix, so neither is copied.

Durability
----------
- Nothing is fsynced per append by default (Kafka's default; durability
  comes from replication). `flush.messages` / `flush.ms` turn on
  fsync-every-N-messages / every-N-ms, checked after each append and by
  `maybe_flush(now_ms)`. The Raft driver calls `flush()` itself before a
  voter acknowledges.
- `flush(offset)` writes the pending index entries, fsyncs every segment
  holding data between the recovery point and `offset`, with its `.index`
  and `.timeindex`, then the directory if segments were created; only then
  does the recovery point move to `offset`. Everything below the recovery
  point survives a crash.
- The recovery point and log start offset go to the log directory's
  `recovery-point-offset-checkpoint` and `log-start-offset-checkpoint` on
  `close()` and `write_checkpoints()` (a log manager calls it on a timer);
  a stale recovery point only means more to re-read on open. Each is
  written atomically: temp file, fsync, rename, directory fsync.
- `truncate_to`, `truncate_fully_and_start_at`, retention and
  `maybe_increment_log_start_offset` make their change durable before
  returning (fsync of the cut segment, directory fsync, checkpoints when
  the recovery point moves down or the log start moves up), so truncated
  batches never come back after a crash and the log start never goes
  back. Kafka leaves both windows open until its next checkpoint.
- The `leader-epoch-checkpoint` is rewritten atomically on every change.
- A roll fsyncs nothing (Kafka flushes the old segment in the
  background): a shell that wants the recovery point to follow rolls
  calls `flush(active_segment.base_offset)` off the hot path.
- `open` re-reads everything past the recovery point (see
  `storage.recovery`), fsyncs what it recovered, and moves the recovery
  point to the LEO. Segments below the recovery point are trusted after a
  cheap check (indexes, tail), not re-checksummed; a damaged batch header
  in one surfaces as `CorruptRecordError` from `read`.

`Log.open(..., recovery_point=None, log_start_offset=None)` reads those
from the checkpoint files in the parent directory; a caller that keeps
them itself passes both and `checkpoint_files=False`.

With `producer_state=True` the log keeps its idempotent producers' state
(KIP-98, `storage.producer_snapshot`): appends update it, rolls and
`close` snapshot it, truncation reloads it. `storage.cleaner` compacts
logs; `truncations` counts truncations so a compaction pass can tell.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Iterable
from typing import NamedTuple

from storage import log_ops
from storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
)
from storage.cleaner import truncate_cleaner_checkpoint
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import OffsetOutOfRangeError
from storage.fs import File, FileSystem, OsFileSystem
from storage.log_append import append_as_follower, append_as_leader
from storage.producer_snapshot import ProducerStateManager
from storage.segment import LogSegment

logger = logging.getLogger(__name__)


class FileSlice(NamedTuple):
    """`size` bytes of `file` from `position`: whole batches, ready for
    `os.sendfile(out_fd, file.fileno(), position, size)` on a real file.
    Valid until the log is truncated or the segment deleted."""

    file: File
    position: int
    size: int


def parse_topic_partition(dir_name: str) -> tuple[str, int] | None:
    """`("my-topic", 3)` from `my-topic-3`, or None."""
    topic, sep, partition = dir_name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


class Log:
    """One partition's log on disk. Build it with `Log.open`."""

    def __init__(self, dir_path: str, config: LogConfig, fs: FileSystem, now_ms: int) -> None:
        self.dir_path = dir_path
        self.config = config
        self.fs = fs
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._recovery_point = 0
        self._checkpointed_recovery_point = 0
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms
        self._dir_dirty = False
        #: A log created by `open` has its own name in the parent dir made
        #: durable by the first flush, not at creation (nothing in it is
        #: promised before then; a crash just loses the empty dir).
        self._parent_dir_dirty = False
        self._max_message_bytes = config.max_message_bytes
        self._flush_policy = config.flush_messages is not None or config.flush_ms is not None
        self.topic_partition: tuple[str, int] | None = None
        self._checkpoint_files = False
        self.epoch_cache = LeaderEpochCache()
        self._closed = False
        self.producer_state: ProducerStateManager | None = None
        self.truncations = 0

    # --- opening ---

    @classmethod
    def open(
        cls,
        dir_path: str,
        config: LogConfig | None = None,
        *,
        now_ms: int,
        fs: FileSystem | None = None,
        recovery_point: int | None = None,
        log_start_offset: int | None = None,
        checkpoint_files: bool = True,
        producer_state: bool = False,
    ) -> Log:
        """Open (or create) the log in `dir_path` and recover it.

        With `checkpoint_files` (the default) the directory must be named
        `<topic>-<partition>`: its recovery point and log start offset are
        read from, and written to, the checkpoint files of the parent
        directory. Values passed here win over the files. Corruption found
        on open is repaired and logged, never raised. `producer_state`
        turns on the idempotent producer checks (module doc).
        """
        log = cls(dir_path, config or LogConfig(), fs or OsFileSystem(), now_ms)
        log_ops.open_log(log, now_ms, recovery_point, log_start_offset, checkpoint_files)
        if producer_state:
            log.producer_state = ProducerStateManager.load(log)
        return log

    def _checkpoint_file(self, name: str) -> OffsetCheckpointFile:
        parent = os.path.dirname(os.path.normpath(self.dir_path)) or "."
        return OffsetCheckpointFile(self.fs, os.path.join(parent, name))

    def _epoch_checkpoint(self) -> LeaderEpochCheckpointFile:
        return LeaderEpochCheckpointFile(self.fs, os.path.join(self.dir_path, LEADER_EPOCH_CHECKPOINT))

    # --- state ---

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch's answer (see `storage.epoch_cache`)."""
        return self.epoch_cache.end_offset_for_epoch(epoch, self._log_end_offset)

    # --- appending ---

    # `append(batch, now_ms, leader_epoch=None) -> base_offset`: a plain
    # function, so the broker's call per batch makes one frame (see
    # `storage.log_append.append_as_leader`).
    append = append_as_leader

    def append_as_follower(self, records, now_ms: int = 0) -> int:
        """Append one or more batches with their own offsets (the first at
        or past the LEO); return the first base offset. The whole buffer
        goes to one segment in one write."""
        return append_as_follower(self, records, now_ms)

    def _maybe_roll(self, segment, batch_bytes, max_timestamp, last_offset, now_ms, base) -> LogSegment:
        reason = segment.should_roll(batch_bytes, max_timestamp, last_offset, now_ms, self.config)
        if reason is None:
            return segment
        logger.debug("%s: rolling at offset %d: %s", self.dir_path, base, reason)
        return self.roll(now_ms, base)

    def roll(self, now_ms: int, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment at `base_offset` (default: the LEO)."""
        base = self._log_end_offset if base_offset is None else base_offset
        assert base >= self._log_end_offset
        old = self._segments[-1]
        if old.size == 0:
            if old.base_offset == base:
                return old
            old.delete()
            self._segments.pop()
            self._base_offsets.pop()
        else:
            old.finalize_time_index()
            old.write_indexes()
            old.recent_batches = {}  # readers that keep up read the new segment: no memory per old one
        if self.producer_state is not None:
            self.producer_state.take_snapshot(self._log_end_offset)
        segment = LogSegment(self.fs, self.dir_path, base, self.config, now_ms)
        self._segments.append(segment)
        self._base_offsets.append(base)
        self._dir_dirty = True
        return segment

    # --- reading ---

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> list[FileSlice]:
        """Whole batches from the one holding `offset`, about `max_bytes`
        of them (at least one), all with offsets below `max_offset` (the
        high watermark) if given. Empty at the LEO."""
        if offset < self._log_start_offset or offset > self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log's range [{self._log_start_offset}, "
                f"{self._log_end_offset}]: reset to the log start or end offset",
                self._log_start_offset,
                self._log_end_offset,
            )
        if offset == self._log_end_offset or (max_offset is not None and offset >= max_offset):
            return []
        segments = self._segments
        active = segments[-1]
        position = active.recent_batches.get(offset)
        if position is not None and (max_offset is None or max_offset >= self._log_end_offset):
            # A reader that keeps up: from one of the last batches appended
            # to the end of the log (the active segment holds only whole
            # batches), no header read.
            size = active.log.size - position
            if size <= max_bytes:
                return [FileSlice(active.log, position, size)]
        # Below the first segment only after a follower's gap: start there.
        i = max(bisect_right(self._base_offsets, offset) - 1, 0)
        slices: list[FileSlice] = []
        budget = max_bytes
        while i < len(segments):
            segment = segments[i]
            found = segment.find_batch(offset)
            i += 1
            if found is None:
                continue
            start, header = found
            limit = segment.size
            if max_offset is not None:
                stop = segment.find_batch(max_offset)
                if stop is not None:
                    limit = stop[0]
            if slices:
                limit = min(limit, start + budget)
            else:
                limit = min(limit, start + max(budget, header.size_in_bytes))
            end = segment.batch_end_at_or_before(start, limit)
            if end > start:
                slices.append(FileSlice(segment.log, start, end - start))
                budget -= end - start
            if end < segment.size or budget <= 0:
                break
            offset = segment.next_offset
        return slices

    def read_bytes(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """`read`, as bytes."""
        return b"".join(s.file.pread(s.size, s.position) for s in self.read(offset, max_bytes, max_offset))

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """`(offset, timestamp)` of the first record at or after
        `timestamp` (ListOffsets, KIP-79), or None if there is none."""
        return log_ops.offset_for_timestamp(self, timestamp)

    # --- truncating, retention ---

    def truncate_to(self, offset: int) -> bool:
        """Remove the batches at and after `offset` (a batch holding it
        goes whole, so the LEO may end up below `offset`). Durable on
        return. False if there was nothing to remove."""
        fully = offset < self._segments[0].base_offset
        if not log_ops.truncate_to(self, offset):
            return False
        self._truncated(fully)
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at `offset`
        (a follower too far behind the leader's log start). Durable on
        return."""
        log_ops.truncate_fully_and_start_at(self, offset)
        self._truncated(fully=True)

    def _truncated(self, fully: bool) -> None:
        self.truncations += 1
        if self.producer_state is not None:
            if fully:
                self.producer_state.reset()
            else:
                self.producer_state.truncate_and_reload(self)
        truncate_cleaner_checkpoint(self)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to `offset` (DeleteRecords, Raft
        snapshots); durable on return (the checkpoints are written). The
        segments below go at the next retention pass."""
        if offset > self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the log start offset to {offset}, past the log end offset "
                f"{self._log_end_offset}",
                self._log_start_offset,
                self._log_end_offset,
            )
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self.epoch_cache.truncate_from_start(offset)
        # The epoch cache just forgot the entries below `offset` for good;
        # the log start offset must not come back lower after a crash.
        self.write_checkpoints()
        return True

    def delete_old_segments(self, now_ms: int) -> int:
        """Delete the oldest segments while `retention.ms`, `retention.bytes`
        or the log start offset says so; never the active segment. Return
        how many were deleted."""
        deleted = log_ops.delete_old_segments(self, now_ms)
        if deleted and self.producer_state is not None:
            self.producer_state.delete_snapshots_below(self._segments[0].base_offset)
        return deleted

    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> None:
        """Put `new` in place of the consecutive segments `old`, none the
        active one (`storage.segment_swap.swap_in`, once the cleaned
        segment's files are in place)."""
        segments = self._segments
        i = next(i for i, s in enumerate(segments) if s is old[0])
        assert segments[i : i + len(old)] == old, "the segments to replace are no longer consecutive in the log"
        assert i + len(old) < len(segments), "the active segment is never replaced"
        segments[i : i + len(old)] = [new]
        self._base_offsets[i : i + len(old)] = [new.base_offset]

    # --- durability ---

    def flush(self, offset: int | None = None) -> None:
        """Make every batch below `offset` (default: the LEO) durable and
        move the recovery point there."""
        offset = self._log_end_offset if offset is None else min(offset, self._log_end_offset)
        if offset > self._recovery_point:
            self.epoch_cache.flush()
            for segment in self._segments:
                if segment.next_offset > self._recovery_point and segment.base_offset < offset:
                    segment.flush()
            self._recovery_point = offset
        self._fsync_dirs()
        if offset == self._log_end_offset:
            self._unflushed_messages = 0

    def _fsync_dirs(self) -> None:
        """Make created, renamed and removed names durable: the log's dir,
        then (once, for a fresh log) its own entry in the parent dir."""
        if self._dir_dirty:
            self.fs.fsync_dir(self.dir_path)
            self._dir_dirty = False
        if self._parent_dir_dirty:
            self.fs.fsync_dir(os.path.dirname(os.path.normpath(self.dir_path)) or ".")
            self._parent_dir_dirty = False

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush if `flush.messages` or `flush.ms` says it is time."""
        config = self.config
        due = (config.flush_messages is not None and self._unflushed_messages >= config.flush_messages) or (
            config.flush_ms is not None
            and self._unflushed_messages
            and now_ms - self._last_flush_ms >= config.flush_ms
        )
        if due:
            self.flush()
            self._last_flush_ms = now_ms
        return bool(due)

    def write_checkpoints(self) -> None:
        """Write the recovery point and log start offset checkpoints."""
        write_checkpoints_of([self])

    def close(self) -> None:
        """Flush everything, write the checkpoints, release the files."""
        if self._closed:
            return
        active = self._segments[-1]
        active.finalize_time_index()
        self.epoch_cache.flush()
        self.flush()
        active.flush()
        self.write_checkpoints()
        if self.producer_state is not None:
            self.producer_state.take_snapshot(self._log_end_offset)
        for segment in self._segments:
            segment.close()
        self._closed = True

    def __repr__(self) -> str:
        return (
            f"Log({self.dir_path!r}, log_start_offset={self._log_start_offset}, "
            f"log_end_offset={self._log_end_offset}, segments={len(self._segments)})"
        )


def write_checkpoints_of(logs: Iterable[Log]) -> None:
    """Write the recovery point and log start offset checkpoints of `logs`,
    each per-directory file once: one read, one write and one fsync per
    file, not per log (a broker's periodic pass over thousands of logs)."""
    by_parent: dict[str, list[Log]] = {}
    for log in logs:
        if log._checkpoint_files:
            parent = os.path.dirname(os.path.normpath(log.dir_path)) or "."
            by_parent.setdefault(parent, []).append(log)
    for parent, group in by_parent.items():
        fs = group[0].fs
        OffsetCheckpointFile(fs, os.path.join(parent, RECOVERY_POINT_OFFSET_CHECKPOINT)).update(
            {log.topic_partition: log._recovery_point for log in group})
        OffsetCheckpointFile(fs, os.path.join(parent, LOG_START_OFFSET_CHECKPOINT)).update(
            {log.topic_partition: log._log_start_offset for log in group})
        for log in group:
            log._checkpointed_recovery_point = log._recovery_point
