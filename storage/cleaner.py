"""Log compaction: which log to clean, and the cleaner's checkpoint.

Theory of operation
-------------------
`LogCleaner` is Kafka's LogCleaner and LogCleanerManager without the
threads. A compacted log (`cleanup.policy=compact`, and
`__consumer_offsets`) keeps at least the newest record per key; a pass
(`storage.cleaner_job`) rewrites its older segments without the records
a newer one of the same key supersedes, and without tombstones once their
delete horizon passed (`storage.batch_filter`). Offsets never change.

The broker shell calls `maybe_clean(logs, now_ms, max_bytes)` again and
again, sleeping between calls as `storage.throttler` says. Each call does
about `max_bytes` of I/O: it continues the pass under way, or picks the
log that needs cleaning most and starts one. Per log, with
`first_dirty` from the checkpoint (everything below it was cleaned) and
`first_uncleanable` the first offset a pass must not reach:

- `first_uncleanable` is the lowest of: the active segment's base offset
  (the active segment is never cleaned); the high watermark the caller
  passes, or the start of the batch holding it, (Kafka uses the last stable offset: a record above it may still
  be truncated, and the older records it superseded must not be gone by
  then); and the base of the first segment holding a record newer than
  `min.compaction.lag.ms`.
- dirty ratio = bytes in `[first_dirty, first_uncleanable)` over bytes
  in `[log start, first_uncleanable)`, counted by whole segments.
- A log is due when its ratio exceeds `min.cleanable.dirty.ratio`, or its
  oldest dirty segment began longer ago than `max.compaction.lag.ms`
  (KIP-354), or a tombstone's delete horizon has passed (KIP-534). The
  earliest horizon is learnt from each pass; a cleaner that has not seen
  a log yet first reads the batch headers of its clean section for it
  (`HorizonScan`). The due log with the highest ratio goes first; a log
  is started at most once per call.

A pass that completes moves the log's first dirty offset to its
`map_end`. The offsets are kept in `cleaner-offset-checkpoint` in the log
directory's parent (Kafka's text format, `storage.checkpoint`); logs
opened without checkpoint files keep theirs in memory. A truncation below
the checkpoint must pull it down before new batches land there, or new,
uncleaned batches would count as clean; `Log.truncate_to` does that
through `truncate_cleaner_checkpoint`, and the cleaner notices the log's
`truncations` counter move.

A pass is discarded when its log changes under it (truncated, segments
deleted, or no longer passed in), and a log whose batches fail to decode
is skipped until restart (Kafka marks it uncleanable), logged once.

No clock, no threads: time comes in as `now_ms`.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from typing import TYPE_CHECKING, Iterable, NamedTuple

from storage.checkpoint import OffsetCheckpointFile
from storage.cleaner_config import CleanerConfig, CompactionConfig
from storage.cleaner_job import DONE, CleaningAborted, CleaningJob, HorizonScan
from storage.errors import CorruptCheckpointError, CorruptRecordError, StorageError
from storage.segment_swap import RetiredSegment

if TYPE_CHECKING:
    from storage.log import Log

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"


class CompactedLog(NamedTuple):
    """A log the cleaner may compact. `high_watermark`: nothing at or
    above it is cleaned (pass the last stable offset where there is one;
    None for a log with no replication, where the LEO is final)."""

    log: Log
    config: CompactionConfig
    high_watermark: int | None = None


class LogToClean(NamedTuple):
    """What `maybe_clean` learns about a log before choosing (tests and
    metrics read it too)."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0


class CleanStep(NamedTuple):
    """What one `maybe_clean` call did. `bytes` read + written (feed it to
    the throttler); `busy`: a pass is under way (call again soon), else
    the shell may back off for `log.cleaner.backoff.ms`."""

    bytes: int
    busy: bool
    passes_completed: int


# --- checkpoint file ---


def _checkpoint_file(log: Log) -> OffsetCheckpointFile | None:
    if log.topic_partition is None:
        return None
    parent = os.path.dirname(os.path.normpath(log.dir_path)) or "."
    return OffsetCheckpointFile(log.fs, os.path.join(parent, CLEANER_OFFSET_CHECKPOINT))


def read_cleaner_checkpoint(log: Log) -> int | None:
    checkpoint = _checkpoint_file(log)
    if checkpoint is None:
        return None
    try:
        return checkpoint.read().get(log.topic_partition)
    except CorruptCheckpointError as e:
        logger.warning("%s; every compacted log of this directory is cleaned from its start again", e)
        return None


def truncate_cleaner_checkpoint(log: Log) -> None:
    """After `log` was truncated: pull its cleaner checkpoint down to the
    log end offset if it was above (a file read; truncations are rare)."""
    checkpoint = _checkpoint_file(log)
    if checkpoint is None or not log.fs.exists(checkpoint.path):
        return
    offset = read_cleaner_checkpoint(log)
    if offset is not None and offset > log.log_end_offset:
        checkpoint.update({log.topic_partition: log.log_end_offset})


def _batch_start(log: Log, offset: int) -> int:
    """`offset`, or the base offset of the batch holding it: a pass maps
    whole batches only."""
    segments = log.segments
    i = max(bisect_right([s.base_offset for s in segments], offset) - 1, 0)
    found = segments[i].find_batch(offset)
    if found is not None and found[1].base_offset < offset:
        return found[1].base_offset
    return offset


# --- the cleaner ---


class LogCleaner:
    """Chooses logs and runs compaction passes in steps (module doc)."""

    def __init__(self, config: CleanerConfig | None = None) -> None:
        self.config = config or CleanerConfig()
        self.job: CleaningJob | HorizonScan | None = None
        self._job_config: CompactionConfig | None = None
        # log -> (its truncations counter when read, first dirty offset)
        self._first_dirty: dict[Log, tuple[int, int | None]] = {}
        # log -> the earliest delete horizon of its tombstones (None: none);
        # a log not in here was not scanned yet.
        self._delete_horizons: dict[Log, int | None] = {}
        self._uncleanable: set[Log] = set()
        self._retired: list[RetiredSegment] = []

    # --- choosing ---

    def first_dirty_offset(self, log: Log) -> int:
        cached = self._first_dirty.get(log)
        if cached is None or cached[0] != log.truncations:
            cached = (log.truncations, read_cleaner_checkpoint(log))
            self._first_dirty[log] = cached
        offset = cached[1]
        if offset is None or offset < log.log_start_offset or offset > log.log_end_offset:
            return log.log_start_offset
        return offset

    def log_to_clean(self, c: CompactedLog, now_ms: int) -> LogToClean:
        log, config = c.log, c.config
        segments = log.segments
        first_dirty = self.first_dirty_offset(log)
        end = log.active_segment.base_offset
        bound = c.high_watermark
        if log.producer_state is not None:
            # Not past an open transaction: its outcome decides its records.
            bound = log.producer_state.last_stable_offset(log.log_end_offset if bound is None else bound)
        if bound is not None and bound < end:
            end = _batch_start(log, bound)
        if config.min_compaction_lag_ms > 0:
            for s in segments[:-1]:
                if s.next_offset > first_dirty and s.largest_timestamp() > now_ms - config.min_compaction_lag_ms:
                    end = min(end, s.base_offset)
                    break
        end = max(end, first_dirty)
        clean = sum(s.size for s in segments if s.base_offset < first_dirty)
        cleanable = sum(s.size for s in segments if s.base_offset < end and s.next_offset > first_dirty)
        now = False
        if end > first_dirty and config.max_compaction_lag_ms < (1 << 63) - 1:
            first = next((s for s in segments[:-1] if s.next_offset > first_dirty), None)
            ts = first.first_batch_timestamp if first is not None else None
            now = ts is not None and ts >= 0 and now_ms - ts > config.max_compaction_lag_ms
        return LogToClean(first_dirty, end, clean, cleanable, now)

    def _grab_filthiest(self, logs: list[CompactedLog], now_ms: int, started: set) -> CompactedLog | None:
        best, best_key = None, None
        for c in logs:
            log = c.log
            if not c.config.compact or log in self._uncleanable or log in started:
                continue
            if log not in self._delete_horizons:
                first_dirty = self.first_dirty_offset(log)
                if first_dirty > log.log_start_offset:
                    self.job = HorizonScan(log, first_dirty)
                    return c
                self._delete_horizons[log] = None
            ltc = self.log_to_clean(c, now_ms)
            horizon = self._delete_horizons.get(log)
            tombstones_due = horizon is not None and horizon <= now_ms and ltc.first_dirty > log.log_start_offset
            has_dirty = ltc.first_uncleanable > ltc.first_dirty and ltc.cleanable_bytes > 0
            due = tombstones_due or (
                has_dirty and (ltc.needs_compaction_now or ltc.cleanable_ratio > c.config.min_cleanable_dirty_ratio)
            )
            if not due:
                continue
            key = (ltc.needs_compaction_now, ltc.cleanable_ratio)
            if best_key is None or key > best_key:
                best, best_key = (c, ltc), key
        if best is None:
            return None
        c, ltc = best
        started.add(c.log)
        retain = c.log.producer_state.last_batch_offsets() if c.log.producer_state is not None else {}
        self.job = CleaningJob(
            c.log,
            c.config,
            ltc.first_dirty,
            ltc.first_uncleanable,
            self.config.dedupe_buffer_size,
            retain,
            self.config.file_delete_delay_ms,
        )
        self._job_config = c.config
        logger.info(
            "%s: compacting (dirty ratio %.2f, dirty offsets %d..%d)",
            c.log.dir_path,
            ltc.cleanable_ratio,
            ltc.first_dirty,
            ltc.first_uncleanable,
        )
        return c

    # --- running ---

    def maybe_clean(self, logs: Iterable[CompactedLog], now_ms: int, max_bytes: int | None = None) -> CleanStep:
        """Do about `max_bytes` (default `log.cleaner.io.buffer.size`) of
        compaction work across `logs`, the compacted logs the broker
        hosts now (module doc)."""
        budget = self.config.io_buffer_size if max_bytes is None else max_bytes
        self._delete_retired(now_ms)
        logs = [c for c in logs if c.config.compact]
        hosted = {c.log for c in logs}
        for table in (self._first_dirty, self._delete_horizons):
            for log in [k for k in table if k not in hosted]:
                del table[log]
        self._uncleanable &= hosted
        if self.job is not None and self.job.log not in hosted:
            self._abort("the log is no longer hosted or no longer compacted")
        used = 0
        completed = 0
        started: set = set()
        while used < budget:
            if self.job is None and self._grab_filthiest(logs, now_ms, started) is None:
                break
            job = self.job
            try:
                used += job.step(budget - used, now_ms)
            except CleaningAborted as e:
                logger.info("%s; the pass starts over later", e)
                self._abort(None)
                continue
            except CorruptRecordError as e:
                logger.error("%s: cannot compact, skipping this log until restart: %s", job.log.dir_path, e)
                self._uncleanable.add(job.log)
                self._abort(None)
                continue
            if job.phase == DONE and isinstance(job, HorizonScan):
                self._delete_horizons[job.log] = job.delete_horizon_ms
                self.job = None
            elif job.phase == DONE:
                self._finish(job)
                completed += 1
        return CleanStep(used, self.job is not None, completed)

    def _finish(self, job: CleaningJob) -> None:
        log = job.log
        self._retired.extend(job.retired)
        self._first_dirty[log] = (log.truncations, job.map_end)
        checkpoint = _checkpoint_file(log)
        if checkpoint is not None:
            checkpoint.update({log.topic_partition: job.map_end})
        self._delete_horizons[log] = job.delete_horizon_ms
        logger.info(
            "%s: compaction pass done up to offset %d: %d records removed, %d bytes read, %d written",
            log.dir_path,
            job.map_end,
            job.records_removed,
            job.bytes_read,
            job.bytes_written,
        )
        self.job = None

    def _abort(self, reason: str | None) -> None:
        job = self.job
        if job is None:
            return
        if reason:
            logger.info("%s: compaction pass abandoned: %s", job.log.dir_path, reason)
        job.abort()
        self._retired.extend(job.retired)
        self.job = None

    def abort(self, log: Log) -> None:
        """Stop the pass on `log`, if any (call before truncating by hand
        outside `Log`, deleting or closing it)."""
        if self.job is not None and self.job.log is log:
            self._abort("asked to")

    def _delete_retired(self, now_ms: int) -> None:
        due = [r for r in self._retired if r.due_ms <= now_ms]
        if due:
            self._retired = [r for r in self._retired if r.due_ms > now_ms]
            for r in due:
                try:
                    r.delete()
                except (OSError, StorageError) as e:
                    logger.warning("could not delete a compacted-away segment %s: %s", r.paths, e)

    def close(self) -> None:
        """Abandon the pass under way and delete every retired segment now
        (their leftovers are removed on the next open anyway)."""
        self._abort("the cleaner is closing")
        self._delete_retired(1 << 63)
