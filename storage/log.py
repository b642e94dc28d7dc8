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
  `LogSegment.record_batch`'s bookkeeping inline, to save a Python call
  per batch (a test holds the index rebuilt by recovery equal to the one
  built by appending). Every other batch, errors included, goes to
  `_append_checked`: the full `validate_batch` (so a bad batch gets its
  exact error), the idempotent producer checks (KIP-98), the roll rules.
- **Append as follower** (`append_as_follower`): keep the batches' offsets,
  which must not go below the LEO (replication, Raft followers). The same
  split: one plain batch is checked with one unpack and written at once;
  anything else goes to `_append_batches_as_follower`.
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
  cheap check (indexes, tail), not re-checksummed. Their records are
  validated when a reader first reaches them (`storage.segment_check`):
  `read` serves the good batches before a bad one, and a read that starts
  at the bad one raises `CorruptRecordError`.

`Log.open(..., recovery_point=None, log_start_offset=None)` reads those
from the checkpoint files in the parent directory; a caller that keeps
them itself passes both and `checkpoint_files=False`.

With `producer_state=True` the log keeps its idempotent producers' state
(KIP-98, `storage.producer_snapshot`): appends update it, rolls and
`close` snapshot it, truncation reloads it. Transactions ride on it
(`storage.log_txn`): `append_marker` writes a COMMIT/ABORT control batch
as leader (followers get it as any batch), an aborted transaction goes
into its segment's `.txnindex`, and `collect_aborted_txns` answers a
read_committed fetch from those indexes. `storage.cleaner` compacts
logs (`replace_segments` puts a cleaned segment in); `truncations` counts
truncations so a compaction pass can tell.

The full checks and guarded writes of the append paths are pure helpers
in `storage.log_append`, and those of open, retention and the time lookup
in `storage.log_ops`; the checkpoint files of many logs at once are
written by `storage.log_checkpoints`; transaction markers and aborted
transactions are `storage.log_txn`'s, the first read of a trusted segment
`storage.segment_check`'s. None touches a `Log`'s private state.
"""

from __future__ import annotations

import logging
import os
import struct
from bisect import bisect_right
from typing import NamedTuple

from crc32c import crc32c

from storage.batch import (
    CODEC_OR_CONTROL_MASK,
    CONTROL_MASK,
    COMPRESSION_MASK,
    CRC_START_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    ZSTD,
    unpack_follower_fields,
    unpack_plain_client_fields,
)
from storage.cleaner import truncate_cleaner_checkpoint
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import OffsetOutOfRangeError
from storage.fs import File, FileSystem, OsFileSystem
from storage.log_checkpoints import write_checkpoints_of
from storage.log_append import (
    BASE_OFFSET,
    PREFIX,
    check_client_batch,
    check_follower_batches,
    rollback,
    write,
    write_stamped,
)
from storage.log_ops import (
    expired_segments,
    load_log,
    offset_for_timestamp,
    parse_topic_partition,  # noqa: F401 (broker.log_manager imports it from here)
)
from storage.log_txn import apply_marker, collect_aborted_txns, marker_batch
from storage.producer_snapshot import ProducerStateManager
from storage.producer_state import ProduceCheck, ProducerStateError
from storage.segment import RECENT_BATCHES, LogSegment
from storage.segment_check import served_end
from storage.txn_index import AbortedTxn

logger = logging.getLogger(__name__)

# The append fast paths' callables, as module globals: one lookup each.
_unpack = unpack_plain_client_fields
_pack_prefix = PREFIX.pack
_pack_prefix_into = PREFIX.pack_into
_pack_base_offset_into = BASE_OFFSET.pack_into
_pwrite = os.pwrite
_pwritev = os.pwritev


class FileSlice(NamedTuple):
    """`size` bytes of `file` from `position`: whole batches, ready for
    `os.sendfile(out_fd, file.fileno(), position, size)` on a real file.
    Valid until the log is truncated or the segment deleted."""

    file: File
    position: int
    size: int


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
        self.checkpoint_files = False
        self.epoch_cache = LeaderEpochCache()
        self._closed = False
        self.producer_state: ProducerStateManager | None = None
        self.truncations = 0
        self._opened_recovery_point = 0
        # The producer snapshot files `_load` found, for `open` (then None).
        self._snapshot_offsets_at_open: list[int] | None = None

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
        exists: bool | None = None,
        listing: list[str] | None = None,
    ) -> Log:
        """Open (or create) the log in `dir_path` and recover it.

        With `checkpoint_files` (the default) the directory must be named
        `<topic>-<partition>`: its recovery point and log start offset are
        read from, and written to, the checkpoint files of the parent
        directory. Values passed here win over the files. Corruption found
        on open is repaired and logged, never raised. `producer_state`
        turns on the idempotent producer checks (module doc). `exists=True`:
        the caller has just seen the directory (no look for it again);
        `listing`: its names, if the caller listed it (a broker lists
        100,000 log directories at start in parallel, not one by one here).
        """
        log = cls(dir_path, config or LogConfig(), fs or OsFileSystem(), now_ms)
        log._load(now_ms, recovery_point, log_start_offset, checkpoint_files, exists, listing)
        if producer_state:
            log.producer_state = ProducerStateManager.load(log, recovery_point=log._opened_recovery_point,
                                                           snapshot_offsets=log._snapshot_offsets_at_open)
        log._snapshot_offsets_at_open = None
        return log

    def _load(self, now_ms: int, recovery_point, log_start_offset, checkpoint_files: bool,
              exists: bool | None = None, listing: list[str] | None = None) -> None:
        loaded = load_log(
            self.fs, self.dir_path, self.config, now_ms, recovery_point, log_start_offset, checkpoint_files,
            exists, listing,
        )
        # A fresh log's files and names (or a segment made for a directory
        # left without one) become durable at its first flush.
        self._parent_dir_dirty = loaded.fresh
        self._dir_dirty = loaded.fresh or loaded.new_segment
        self.topic_partition = loaded.topic_partition
        self.checkpoint_files = checkpoint_files
        self.epoch_cache = loaded.epoch_cache
        segments = self._segments = loaded.segments
        self._base_offsets = [s.base_offset for s in segments]
        self._log_end_offset = self._recovery_point = segments[-1].next_offset
        self._log_start_offset = loaded.log_start_offset
        self._checkpointed_recovery_point = loaded.checkpointed_recovery_point
        #: The producer state is rebuilt from a snapshot at or below it.
        self._opened_recovery_point = loaded.checkpointed_recovery_point
        self._snapshot_offsets_at_open = loaded.snapshot_offsets
        if self._log_start_offset > self._log_end_offset:
            logger.warning(
                "%s: log start offset %d is past the recovered log end offset %d; restarting the log there",
                self.dir_path,
                self._log_start_offset,
                self._log_end_offset,
            )
            self._restart_at(self._log_start_offset)
        elif self._log_end_offset < self._checkpointed_recovery_point:
            self.write_checkpoints()
        # One line per log only where something was recovered: a broker
        # opening 100,000 logs at start spent a tenth of it on these lines
        # (the replica manager sums each metadata delta up in one).
        written = any(segment.size for segment in loaded.recovered)
        logger.log(
            logging.INFO if written else logging.DEBUG,
            "%s: opened, log start offset %d, log end offset %d, %d segments (%d recovered)",
            self.dir_path,
            self._log_start_offset,
            self._log_end_offset,
            len(segments),
            len(loaded.recovered),
        )

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

    def reconfigure(self, config: LogConfig) -> None:
        """Adopt changed topic configs (AlterConfigs on a live topic), as
        Kafka does: `max.message.bytes`, flushing and retention from the next
        append or pass; `segment.bytes`, `segment.ms` and
        `index.interval.bytes` for the active segment's next roll and index
        entry too; `segment.index.bytes` sizes the indexes of new segments."""
        self.config = config
        self._max_message_bytes = config.max_message_bytes
        self._flush_policy = config.flush_messages is not None or config.flush_ms is not None
        for segment in self._segments:
            segment.reconfigure(config)

    # --- appending ---

    def append(self, batch, now_ms: int, leader_epoch: int | None = None) -> int:
        """Append one client batch as leader; return its base offset.

        `leader_epoch`, if given, is stamped into the batch. Raises
        `CorruptRecordError`, `InvalidRecordError`, `RecordTooLargeError` or
        `ProducerStateError` (the log is unchanged then). A duplicate of one
        of an idempotent producer's last 5 batches is not written: the base
        offset it got the first time comes back.
        """
        # Entries a load cut but left on file go, durably, before any batch
        # lands past them (`LeaderEpochCache.stale_on_file`).
        if self.epoch_cache.stale_on_file:
            self.epoch_cache.write_stale()
        # The fast path (module doc): every check of `validate_batch(...,
        # from_client=True)` as an integer comparison on one unpack; when one
        # fails, or the producer is idempotent, or a roll is due,
        # `_append_checked` does it all again and says what is wrong.
        # records_count == last_offset_delta + 1 >= 1 covers validate's count
        # rules; size == len(batch) >= 61 its length rules.
        try:
            batch_length, epoch, magic, crc, attributes, delta, max_timestamp, pid_sign, count = _unpack(batch)
        except struct.error:
            return self._append_checked(batch, now_ms, leader_epoch)
        size = batch_length + LOG_OVERHEAD
        base = self._log_end_offset
        next_offset = base + count
        segment = self._segments[-1]
        f = segment.log
        position = f.size
        end = position + size
        view = memoryview(batch)
        if (
            magic != MAGIC
            or pid_sign >= 0  # producer_id >= 0: the producer state decides
            or size != len(batch)
            or size > self._max_message_bytes
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
            return self._append_checked(batch, now_ms, leader_epoch)
        # One write call at the end of the active segment; a simulated file
        # (fd -1), a file whose descriptor the open-files cache closed (-1:
        # `append` opens it again) or a short write (a full disk) goes
        # through the file's own append, which writes it all or raises ENOSPC.
        # `used` tells the cache the file is busy (`storage.fs.OpenFileCache`).
        fd = f.fd
        try:
            if type(batch) is bytearray or not view.readonly:
                if leader_epoch is None:
                    _pack_base_offset_into(view, 0, base)
                else:
                    epoch = leader_epoch
                    _pack_prefix_into(view, 0, base, batch_length, epoch)
                if fd >= 0 and _pwrite(fd, view, position) == size:
                    f.size = end
                    f.used = True
                else:
                    f.append(view)
            else:
                if leader_epoch is not None:
                    epoch = leader_epoch
                parts = (_pack_prefix(base, batch_length, epoch), view[16:])
                if fd >= 0 and _pwritev(fd, parts, position) == size:
                    f.size = end
                    f.used = True
                else:
                    f.appendv(parts)
        except OSError:
            rollback(f, position)
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
        self._log_end_offset = next_offset
        if epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(epoch, base)
        if self._flush_policy:
            self._unflushed_messages += count
            self.maybe_flush(now_ms)
        return base

    def append_from_coordinator(self, batch, now_ms: int, leader_epoch: int) -> int:
        """`append` of a batch a coordinator of this broker wrote (Kafka's
        AppendOrigin.COORDINATOR: transactional offset commits): the
        producer's epoch and transaction are checked, not its sequence,
        which the coordinator does not number."""
        return self._append_checked(batch, now_ms, leader_epoch, check_sequence=False)

    def _append_checked(self, batch, now_ms: int, leader_epoch: int | None, check_sequence: bool = True) -> int:
        """`append` for any batch (see its docstring)."""
        if self.epoch_cache.stale_on_file:  # as in `append`
            self.epoch_cache.write_stale()
        header = check_client_batch(batch, self._max_message_bytes)
        base = self._log_end_offset
        producer_state = self.producer_state
        if producer_state is not None and header[9] >= 0:
            checked = producer_state.check(header, base, check_sequence)
            if checked.error is ProduceCheck.DUPLICATE_SEQUENCE_NUMBER:
                return checked.first_offset
            if checked.error:
                raise ProducerStateError(checked)
        next_offset = base + header[6] + 1
        max_timestamp = header[8]
        size = header[1] + LOG_OVERHEAD
        segment = self._maybe_roll(self._segments[-1], size, max_timestamp, next_offset - 1, now_ms, base)
        epoch = header[2] if leader_epoch is None else leader_epoch
        position = write_stamped(segment.log, batch, base, header[1], epoch)
        segment.record_batch(position, base, next_offset, max_timestamp)
        segment.last_append_ms = now_ms
        self._log_end_offset = next_offset
        if producer_state is not None and header[9] >= 0:
            producer_state.update(header, base)
        if epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(epoch, base)
        self._unflushed_messages += header[12]
        if self._flush_policy:
            self.maybe_flush(now_ms)
        return base

    def append_as_follower(self, records, now_ms: int = 0) -> int:
        """Append one or more batches with their own offsets (the first at
        or past the LEO); return the first base offset. The whole buffer
        goes to one segment in one write."""
        if self.epoch_cache.stale_on_file:  # as in `append`
            self.epoch_cache.write_stale()
        # The fast path (module doc): `validate_batch`'s checks of a
        # follower's batch as integer comparisons on one unpack, for a
        # buffer holding exactly one batch; anything else, or a failed
        # check, goes the checked way, which also says what is wrong.
        # size == len(records) >= 61 covers the length rules. A fence sends
        # each follower one small batch per partition, so this path is most
        # of a follower's appends then.
        try:
            base, batch_length, epoch, magic, crc, attributes, delta, max_timestamp, pid_sign, count = (
                unpack_follower_fields(records))
        except struct.error:
            return self._append_batches_as_follower(records, now_ms)
        size = batch_length + LOG_OVERHEAD
        next_offset = base + delta + 1
        segment = self._segments[-1]
        f = segment.log
        position = f.size
        end = position + size
        if (
            magic != MAGIC
            or pid_sign >= 0  # producer_id >= 0: the producer state follows it
            or size != len(records)
            or size > self._max_message_bytes
            or base < self._log_end_offset
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
            return self._append_batches_as_follower(records, now_ms)
        fd = f.fd
        try:
            if fd >= 0 and _pwrite(fd, records, position) == size:
                f.size = end
                f.used = True
            else:
                f.append(records)
        except OSError:
            rollback(f, position)
            raise
        segment.record_batch(position, base, next_offset, max_timestamp)
        if epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(epoch, base)
        self._unflushed_messages += count
        segment.last_append_ms = now_ms
        self._log_end_offset = next_offset
        if self._flush_policy:
            self.maybe_flush(now_ms)
        return base

    def _append_batches_as_follower(self, records, now_ms: int) -> int:
        """`append_as_follower` for any buffer: every batch validated, in order."""
        if self.epoch_cache.stale_on_file:  # as in `append`
            self.epoch_cache.write_stale()
        batches = check_follower_batches(records, self._max_message_bytes, self._log_end_offset)
        if not batches:
            return self._log_end_offset
        first = batches[0][1]
        last = batches[-1][1]
        segment = self._maybe_roll(
            self._segments[-1], len(records), first.max_timestamp, last.last_offset, now_ms, first.base_offset
        )
        start = write(segment.log, records)
        producer_state = self.producer_state
        for position, header in batches:
            segment.record_batch(start + position, header.base_offset, header.next_offset, header.max_timestamp)
            if producer_state is not None and header[9] >= 0:
                if header[5] & CONTROL_MASK:
                    apply_marker(self.dir_path, producer_state, segment, header, records, position)
                else:
                    producer_state.update(header)
            epoch = header.partition_leader_epoch
            if epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(epoch, header.base_offset)
            self._unflushed_messages += header.records_count
        segment.last_append_ms = now_ms
        self._log_end_offset = last.next_offset
        if self._flush_policy:
            self.maybe_flush(now_ms)
        return first.base_offset

    def append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                      now_ms: int, leader_epoch: int) -> int:
        """Append a transaction marker (COMMIT or ABORT control batch) for
        `producer_id` as leader (WriteTxnMarkers); return its offset.
        Raises `ProducerStateError` (INVALID_PRODUCER_EPOCH,
        TRANSACTION_COORDINATOR_FENCED) with the log unchanged."""
        producer_state = self.producer_state
        assert producer_state is not None, "transaction markers need the producer state"
        checked = producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if checked.error:
            raise ProducerStateError(checked)
        batch = marker_batch(producer_id, producer_epoch, coordinator_epoch, commit, self._log_end_offset, now_ms,
                             leader_epoch)
        return self._append_batches_as_follower(batch, now_ms)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper_bound)
        (a read_committed fetch's list, `storage.txn_index`)."""
        return collect_aborted_txns(self._segments, self._base_offsets, fetch_offset, upper_bound)

    # --- rolling ---

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
            if segment.unchecked and end > start:
                # Loaded from disk, not checked yet: up to a bad batch
                # (`storage.segment_check`).
                good = served_end(segment, start, end, bool(slices))
                if good < end:
                    if good > start:
                        slices.append(FileSlice(segment.log, start, good - start))
                    break
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
        return offset_for_timestamp(self._segments, self._log_start_offset, timestamp)

    # --- truncating, retention ---

    def truncate_to(self, offset: int, write_checkpoints: bool = True) -> bool:
        """Remove the batches at and after `offset` (a batch holding it
        goes whole, so the LEO may end up below `offset`). Durable on
        return. False if there was nothing to remove.

        A caller truncating many logs passes `write_checkpoints=False` and
        then writes them all with one `write_checkpoints_of`, before
        appending to any (a recovery point checkpoint past the new log end
        would let a crash skip the recovery of what is appended next), as
        Kafka's `LogManager.truncateTo` checkpoints each directory once."""
        if offset >= self._log_end_offset:
            return False
        assert offset >= 0, f"cannot truncate to negative offset {offset}"
        if offset < self._segments[0].base_offset:
            self._restart_at(offset, write_checkpoints)
            self._truncated(fully=True)
            return True
        i = bisect_right(self._base_offsets, offset) - 1
        removed = self._segments[i + 1 :]
        for segment in removed:
            segment.delete()
        del self._segments[i + 1 :]
        del self._base_offsets[i + 1 :]
        segment = self._segments[i]
        cut = segment.truncate_to(offset)
        self._log_end_offset = segment.next_offset
        logger.info(
            "%s: truncated to offset %d (log end offset now %d; %d bytes and %d segments removed)",
            self.dir_path,
            offset,
            self._log_end_offset,
            cut,
            len(removed),
        )
        start_moved = self._log_start_offset > self._log_end_offset
        if start_moved:
            self._log_start_offset = self._log_end_offset
        self.epoch_cache.truncate_from_end(self._log_end_offset)
        self._recovery_point = min(self._recovery_point, self._log_end_offset)
        segment.flush()
        self._dir_dirty = self._dir_dirty or bool(removed)
        self._fsync_dirs()
        if write_checkpoints and (start_moved or self._recovery_point < self._checkpointed_recovery_point):
            self.write_checkpoints()
        self._truncated(fully=False)
        return True

    def truncate_fully_and_start_at(self, offset: int, write_checkpoints: bool = True) -> None:
        """Delete every segment and restart the log, empty, at `offset`
        (a follower too far behind the leader's log start). Durable on
        return (`write_checkpoints`: as for `truncate_to`)."""
        self._restart_at(offset, write_checkpoints)
        self._truncated(fully=True)

    def _restart_at(self, offset: int, write_checkpoints: bool = True) -> None:
        assert offset >= 0
        now_ms = self._segments[-1].last_append_ms if self._segments else 0
        for segment in self._segments:
            segment.delete()
        segment = LogSegment(self.fs, self.dir_path, offset, self.config, now_ms)
        self._segments = [segment]
        self._base_offsets = [offset]
        self._log_start_offset = self._log_end_offset = self._recovery_point = offset
        self.epoch_cache.clear()
        segment.flush()
        self._dir_dirty = True
        self._fsync_dirs()
        if write_checkpoints:
            self.write_checkpoints()
        logger.info("%s: deleted every segment; the log restarts empty at offset %d", self.dir_path, offset)

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
        segments = self._segments
        count = expired_segments(segments, self._log_start_offset, self.config, now_ms, self.dir_path)
        if not count:
            return 0
        for segment in segments[:count]:
            segment.delete()
        del segments[:count]
        del self._base_offsets[:count]
        self._log_start_offset = max(self._log_start_offset, segments[0].base_offset)
        self.epoch_cache.truncate_from_start(self._log_start_offset)
        self.fs.fsync_dir(self.dir_path)
        # Nothing below the first segment is left to recover.
        self._recovery_point = max(self._recovery_point, segments[0].base_offset)
        if self.producer_state is not None:
            self.producer_state.delete_snapshots_below(segments[0].base_offset)
        return count

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

    @property
    def has_flush_policy(self) -> bool:
        """Whether `flush.messages` or `flush.ms` is set (fixed at open)."""
        return self._flush_policy

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

    def checkpoints_written(self) -> None:
        """The checkpoint files now hold this log's recovery point
        (`storage.log_checkpoints`): a later truncation below it rewrites them."""
        self._checkpointed_recovery_point = self._recovery_point

    def close(self, checkpoint: bool = True) -> None:
        """Flush everything, write the checkpoints, release the files.

        A caller closing many logs passes `checkpoint=False` and then writes
        them all with one `write_checkpoints_of` (each per-directory file is
        rewritten whole: once per log closed made a shutdown quadratic)."""
        if self._closed:
            return
        active = self._segments[-1]
        active.finalize_time_index()
        self.epoch_cache.flush(self._log_end_offset)
        self.flush()
        active.flush()
        if checkpoint:
            self.write_checkpoints()
        if self.producer_state is not None:
            self.producer_state.maybe_take_snapshot(self._log_end_offset)
        for segment in self._segments:
            segment.close()
        self._closed = True

    def abandon(self) -> None:
        """Release the files without writing anything: the log's directory
        failed (EIO, unmounted), and a flush there could only fail again.
        What was not flushed is recovered from the files at the next start."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            try:
                segment.close()
            except OSError:
                pass  # the descriptor is released whatever close says

    def __repr__(self) -> str:
        return (
            f"Log({self.dir_path!r}, log_start_offset={self._log_start_offset}, "
            f"log_end_offset={self._log_end_offset}, segments={len(self._segments)})"
        )
