"""The broker's partition logs on disk (I/O shell over `storage.Log`).

Theory of operation
-------------------
Each hosted partition has one `storage.Log` in `<log dir>/<topic>-<partition>/`,
laid out as Kafka lays it out. The `LogManager` opens a log when a metadata
delta says this broker hosts the partition, and deletes it when the topic
goes away (or the broker leaves the replica list).

- **Topic identity.** A partition directory carries `partition.metadata`
  with its topic id, as Kafka's does (KIP-516). A directory whose topic id
  differs from the image's belongs to an older topic of the same name (it
  was deleted and re-created while this broker was away): it is moved
  aside as `<topic>-<partition>.<id>-stray` and a fresh log is created.
  Logs of topics that the first image does not know, or that no longer list
  this broker, are moved aside the same way at `load` (KIP-858). Stray data
  is kept for an operator, never deleted.
- **Deletion** renames the directory to `<topic>-<partition>.<id>-delete`
  (durably) and then removes it; leftovers of a crash in between are
  removed at the next start.
- **Checkpoints.** `replication-offset-checkpoint` (high watermarks, given
  by the replica manager), and through each `Log` the
  `recovery-point-offset-checkpoint` and `log-start-offset-checkpoint`, all
  in Kafka's text format (`storage.checkpoint`), written on a timer and at
  clean shutdown.
- **Compaction and producer state.** Every partition log keeps its
  idempotent producers' state (`storage.producer_snapshot`: snapshots per
  segment, rebuilt from the log when missing). The `LogCleaner` (`cleaner`)
  compacts the logs of `cleanup.policy=compact` topics; its trio task is
  `broker.shell.cleaner_runtime`. A compacted topic without `delete` in its
  policy keeps every segment whatever `retention.ms`/`retention.bytes` say
  (Kafka's rule: only the cleaner removes its records).
- **Clean shutdown.** `shutdown` flushes every log, writes every
  checkpoint and then the `.kafka_cleanshutdown` marker in each log dir.
  `load` removes the marker: its absence at the next start means the
  broker died, and the logs are recovered from their recovery points
  (`storage.recovery`) as they are opened. With the marker, the recovery
  points equal the log end offsets and opening reads only the indexes.
- **Start.** `scan` reads the log dirs in threads before `load`
  (`broker.shell.log_scan`); `load` opens nothing, and a log found there
  opens as the first delta names its partition.
- **A failed log directory** (with several `log.dirs`: EIO, unmounted) is
  taken offline by `fail_dir`, the other directories serving on
  (`broker.shell.log_dir_failure`). Each directory has a stable id
  (`dir_id`) that the broker reports to the controller.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping

import trio

from broker.shell.log_dir_failure import failing_dir, log_dir_offline
from broker.shell.log_passes import PASS_SLICE_S, SLICE_CHECK_EVERY, Slices
from broker.shell.log_scan import (DELETE_SUFFIX, PARTITION_METADATA_FILE, ScannedDir, finish_leftovers,
                                   read_topic_id, scan_log_dirs)
from quorum.metadata import MetadataImage
from storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    write_atomically,
)
from storage.cleaner import LogCleaner
from storage.cleaner_config import CleanerConfig
from storage.config import LogConfig
from storage.errors import CorruptCheckpointError
from storage.fault_fs import log_file_system
from storage.fs import OpenFileCache, OsFileSystem, deferred_fsync
from storage.log import Log, parse_topic_partition
from storage.log_checkpoints import write_checkpoints_of

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
STRAY_SUFFIX = "-stray"

#: Topic config keys the log engine reads (see `storage.config.LogConfig`).
_LOG_CONFIG_KEYS = (
    "segment.bytes", "segment.ms", "segment.index.bytes", "index.interval.bytes",
    "retention.ms", "retention.bytes", "max.message.bytes", "flush.messages", "flush.ms",
)
_LONG_MAX = str(2**63 - 1)

TopicPartitionName = tuple[str, int]

_log = logging.getLogger("broker.log_manager")

def log_config_for(topic_configs: Mapping[str, str], broker_defaults: Mapping[str, str]) -> LogConfig:
    """The `LogConfig` of a topic: its explicit configs over the broker's defaults."""
    merged = {**broker_defaults, **topic_configs}
    props = {k: v for k, v in merged.items() if k in _LOG_CONFIG_KEYS}
    policies = {p.strip() for p in str(merged.get("cleanup.policy", "delete")).split(",")}
    if "delete" not in policies:
        # A compact-only topic loses records to the cleaner alone (Kafka's
        # LogManager skips retention for it).
        props["retention.ms"] = "-1"
        props["retention.bytes"] = "-1"
    for key in ("flush.messages", "flush.ms"):
        # Kafka spells "never" as Long.MAX_VALUE; the log engine as unset.
        if props.get(key) == _LONG_MAX:
            del props[key]
    return LogConfig.from_properties(props)


class LogManager:
    """Owns the `Log`s of the partitions this broker hosts."""

    def __init__(
        self,
        log_dirs: Iterable[str],
        clock_ms: Callable[[], int],
        *,
        cleaner_config: CleanerConfig | None = None,
        producer_id_expiration_ms: int | None = None,
        max_open_files: int = 0,
        disk_fault_file: str = "",
    ) -> None:
        self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        self._clock_ms = clock_ms
        #: Compacts the logs of compacted topics (driven by `broker.shell.cleaner_runtime`).
        self.cleaner = LogCleaner(cleaner_config)
        self._producer_id_expiration_ms = producer_id_expiration_ms
        #: The bounded cache of open segment files (`log.max.open.files`).
        self.open_files = OpenFileCache(max_open_files or None)
        # `disk_fault_file`: a test's switch that fails the logs' writes with EIO (storage.fs).
        self._fs = log_file_system(self.log_dirs[0] if self.log_dirs else ".", disk_fault_file, self.open_files)
        _log.info("log.max.open.files=%d (open-files limit %s)", self.open_files.capacity, _nofile_limit())
        self._logs: dict[TopicPartitionName, Log] = {}
        # The logs with `flush.ms` or `flush.messages` (fixed when a log is
        # opened): the flush pass runs every second, and walking 100,000
        # logs that have neither held the event loop each time.
        self._flushed_by_policy: dict[TopicPartitionName, Log] = {}
        self._dir_of: dict[TopicPartitionName, str] = {}
        #: How many partitions each log dir holds (`_pick_dir`, without a walk per new log).
        self._dir_counts: dict[str, int] = {d: 0 for d in self.log_dirs}
        #: (recovery point, log start offset) of the logs found at start, read
        #: from each dir's checkpoint files once and handed to the log's first
        #: open: read per log, a start with n logs parsed n files of n lines.
        self._start_offsets: dict[TopicPartitionName, tuple[int, int]] = {}
        #: What `scan` read of each log dir, till `load` takes it.
        self._scanned: dict[str, ScannedDir] | None = None
        #: The topic id in `partition.metadata` (None: no such file) and the
        #: directory's listing (None: it could not be listed) of each log
        #: found at start, read once by `scan`: the first open neither looks
        #: for the directory nor reads either again.
        self._found: dict[TopicPartitionName, tuple[uuid.UUID | None, list[str] | None]] = {}
        #: Partitions deleted since the last checkpoint pass, per log dir: their
        #: entries leave the recovery point and log start offset files then.
        self._removed: dict[str, set[TopicPartitionName]] = {}
        #: Log dirs where a log failed to close: no clean-shutdown marker there.
        self._unclean_dirs: set[str | None] = set()
        #: HWs found in the checkpoints at start (seed the HW of reopened partitions).
        self._checkpointed_hws: dict[TopicPartitionName, int] = {}
        #: What the recovery point and log start offset files of each log
        #: dir hold, as the periodic pass last wrote them (or `load` read them).
        self._written_logs: dict[str, tuple[dict[TopicPartitionName, int], dict[TopicPartitionName, int]]] = {}
        #: What `checkpoint_high_watermarks` last wrote, per log dir.
        self._written_hws: dict[str, dict[TopicPartitionName, int]] = {}
        #: Log dirs taken offline by a disk failure (`fail_dir`): dir -> why.
        self.offline_dirs: dict[str, str] = {}
        self._loaded = False
        #: True when the last run of the broker did not shut down cleanly.
        self.recovered_unclean = False

    # --- start ---------------------------------------------------------

    def scan(self) -> None:
        """Read the log dirs at start (`broker.shell.log_scan`): reads
        only, so a broker runs it in a worker thread before `load`."""
        self._scanned = scan_log_dirs(self.log_dirs)

    def load(self, image: MetadataImage, broker_id: int) -> None:
        """Prepare the log dirs at start, given the first metadata image
        (which must be caught up with the metadata log, as Kafka's broker
        waits for before publishing it). Opens nothing: logs open as the
        first delta names their partitions. Runs `scan` first unless the
        caller did."""
        assert not self._loaded, "LogManager.load runs once"
        self._loaded = True
        if self._scanned is None:
            self.scan()
        scanned, self._scanned = self._scanned or {}, None
        for log_dir in self.log_dirs:
            marker = os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)
            names, partition_dirs, found = scanned[log_dir]
            if os.path.exists(marker):
                os.remove(marker)
                self._fs.fsync_dir(log_dir)
                _log.info("%s: clean shutdown marker found; logs open without recovery", log_dir)
            elif partition_dirs:
                self.recovered_unclean = True
                _log.warning(
                    "%s: no clean shutdown marker: the broker stopped uncleanly; %d logs are recovered "
                    "from their recovery points as they open", log_dir, len(partition_dirs))
            finish_leftovers(log_dir, names)
            self._checkpointed_hws.update(self._hw_file(log_dir).read())
            recovery_points = _read_checkpoint(self._fs, log_dir, RECOVERY_POINT_OFFSET_CHECKPOINT)
            start_offsets = _read_checkpoint(self._fs, log_dir, LOG_START_OFFSET_CHECKPOINT)
            # The periodic pass compares with these instead of reading the files again.
            self._written_logs[log_dir] = (dict(recovery_points), dict(start_offsets))
            for name in partition_dirs:
                tp = parse_topic_partition(name)
                assert tp is not None
                topic = image.topic(tp[0])
                registration = None if topic is None else topic.partitions.get(tp[1])
                path = os.path.join(log_dir, name)
                listing, stored_id = found[name]
                if registration is None or broker_id not in registration.replicas:
                    self._move_aside(path, "its partition is not hosted here in the metadata")
                elif stored_id is not None and stored_id != topic.topic_id:
                    self._move_aside(path, f"the topic now has id {topic.topic_id}")
                else:
                    self._place(tp, log_dir)
                    # Absent from a file: 0, what `Log.open` reads as "not checkpointed".
                    self._start_offsets[tp] = (recovery_points.get(tp, 0), start_offsets.get(tp, 0))
                    self._found[tp] = (stored_id, listing)

    # --- logs ----------------------------------------------------------

    def get(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    @property
    def logs(self) -> Mapping[TopicPartitionName, Log]:
        return self._logs

    def dir_of(self, topic: str, partition: int) -> str | None:
        """The log dir that holds (or held, when it went offline) a partition."""
        return self._dir_of.get((topic, partition))

    def failed_dir(self, topic: str, partition: int, exc: OSError) -> str | None:
        """The log dir an I/O error on the partition takes offline, or None
        when the error is the operation's own (`broker.shell.log_dir_failure`)."""
        return failing_dir(self.log_dirs, self.offline_dirs, self._dir_of.get((topic, partition)), exc)

    def fail_dir(self, log_dir: str, reason: str) -> list[TopicPartitionName]:
        """Take `log_dir` offline (module doc); the partitions it held."""
        if log_dir in self.offline_dirs:
            return []
        self.offline_dirs[log_dir] = reason
        lost = [tp for tp, d in self._dir_of.items() if d == log_dir]
        for tp in lost:
            log = self._logs.pop(tp, None)
            self._flushed_by_policy.pop(tp, None)
            self._start_offsets.pop(tp, None)
            if log is not None:
                self.cleaner.abort(log)
                log.abandon()
        self._removed.pop(log_dir, None)
        self._written_hws.pop(log_dir, None)
        self._unclean_dirs.add(log_dir)
        log_dir_offline(log_dir, reason, len(lost), self.online_dirs)
        return lost

    @property
    def online_dirs(self) -> list[str]:
        return [d for d in self.log_dirs if d not in self.offline_dirs]

    def get_or_create(self, topic: str, partition: int, topic_id: uuid.UUID, config: LogConfig) -> Log:
        """The open log of a hosted partition, opening (and recovering) or creating it."""
        tp = (topic, partition)
        log = self._logs.get(tp)
        if log is not None:
            return log
        log_dir = self._dir_of.get(tp)
        if log_dir is not None and log_dir in self.offline_dirs:
            raise OSError(errno.EIO, f"its log dir {log_dir} is offline ({self.offline_dirs[log_dir]})",
                          os.path.join(log_dir, f"{topic}-{partition}"))
        log_dir = log_dir or self._pick_dir()
        path = os.path.join(log_dir, f"{topic}-{partition}")
        found = tp in self._found
        listing = None
        if found:
            # Found by `load` (and not moved aside since: that drops it).
            fresh = False
            stored_id, listing = self._found.pop(tp)
        else:
            fresh = not os.path.isdir(path)
            stored_id = None if fresh else read_topic_id(path)
        if stored_id is not None and stored_id != topic_id:
            self._move_aside(path, f"the topic now has id {topic_id}")
            found, listing = False, None
        # A log created in this run starts at 0; one found at start, where
        # the checkpoints read then say (never the files again: module doc).
        recovery_point, log_start_offset = self._start_offsets.pop(tp, (0, 0))
        log = Log.open(path, config, now_ms=self._clock_ms(), fs=self._fs, producer_state=True,
                       recovery_point=recovery_point, log_start_offset=log_start_offset,
                       exists=True if found else None, listing=listing)
        if self._producer_id_expiration_ms is not None and log.producer_state is not None:
            log.producer_state.producer_id_expiration_ms = self._producer_id_expiration_ms
        if stored_id != topic_id:
            # A fresh log's file is not fsynced (nor is the rest of the new,
            # empty log): lost or short after a crash, it is rewritten here.
            write_atomically(self._fs, os.path.join(path, PARTITION_METADATA_FILE),
                             f"version: 0\ntopic_id: {topic_id}\n".encode(), durable=not fresh)
        self._logs[tp] = log
        if log.has_flush_policy:
            self._flushed_by_policy[tp] = log
        self._place(tp, log_dir)
        return log

    def delete(self, topic: str, partition: int) -> None:
        """Close and remove a partition's log (durably renamed first)."""
        tp = (topic, partition)
        log = self._logs.pop(tp, None)
        self._flushed_by_policy.pop(tp, None)
        log_dir = self._dir_of.pop(tp, None)
        self._checkpointed_hws.pop(tp, None)
        self._start_offsets.pop(tp, None)
        self._found.pop(tp, None)
        if log is not None:
            self.cleaner.abort(log)
            # Its checkpoint entries go at the next checkpoint pass, with
            # every other deleted log's: one file write per pass, not per log.
            log.close(checkpoint=False)
        if log_dir is None:
            return
        self._dir_counts[log_dir] -= 1
        if log_dir in self.offline_dirs:
            # Nothing can be written there; the next start finds the log and,
            # the metadata no longer placing it here, moves it aside.
            return
        self._removed.setdefault(log_dir, set()).add(tp)
        path = os.path.join(log_dir, f"{topic}-{partition}")
        if not os.path.isdir(path):
            return
        doomed = f"{path}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        os.replace(path, doomed)
        self._fs.fsync_dir(log_dir)
        shutil.rmtree(doomed, ignore_errors=True)
        _log.info("deleted the log of %s-%d", topic, partition)

    def moved(self, tp: TopicPartitionName, log: Log, log_dir: str) -> None:
        """`log`, in `log_dir`, replaces the partition's log (a replica moved
        between log dirs, `broker.shell.log_dir_mover`): its old dir's
        checkpoint entries go at the next checkpoint pass."""
        old_dir = self._dir_of.get(tp)
        self._logs[tp] = log
        if tp in self._flushed_by_policy:
            self._flushed_by_policy[tp] = log
        if old_dir is not None and old_dir != log_dir:
            self._removed.setdefault(old_dir, set()).add(tp)
            self._written_hws.pop(old_dir, None)
        self._place(tp, log_dir)
        log.write_checkpoints()

    def checkpointed_high_watermark(self, topic: str, partition: int) -> int | None:
        """The HW in `replication-offset-checkpoint` when the broker started."""
        return self._checkpointed_hws.get((topic, partition))

    # --- background work -----------------------------------------------

    def checkpoint_high_watermarks(self, high_watermarks: Mapping[TopicPartitionName, int]) -> None:
        """Write `replication-offset-checkpoint` of each log dir whose entries changed."""
        for log_dir, entries in self._changed_hws(high_watermarks):
            self._hw_file(log_dir).write(entries)
            self._written_hws[log_dir] = entries

    async def checkpoint_high_watermarks_in_thread(self, high_watermarks: Mapping[TopicPartitionName, int]) -> None:
        """`checkpoint_high_watermarks`, with the files written and fsynced
        in a worker thread (as Kafka's scheduler thread writes them): an
        fsync while the logs take tens of MB/s waits for the filesystem's
        journal, 50-200 ms here, and on the event loop it held up every
        produce and fetch of the broker. Not abandoned when cancelled, so a
        clean shutdown's own checkpoint never overlaps it."""
        # Grouped by dir in slices of the event loop: 100,000 entries in one step held it.
        by_dir: dict[str, dict[TopicPartitionName, int]] = {d: {} for d in self.log_dirs}
        slices = Slices(PASS_SLICE_S)
        dir_of = self._dir_of
        for i, (tp, hw) in enumerate(list(high_watermarks.items())):
            if i % SLICE_CHECK_EVERY == 0:
                await slices.check()
            log_dir = dir_of.get(tp)
            if log_dir is not None:
                by_dir[log_dir][tp] = hw
        changed = [(log_dir, entries) for log_dir, entries in by_dir.items()
                   if self._written_hws.get(log_dir) != entries]
        if not changed:
            return
        await trio.to_thread.run_sync(self._write_hw_files, changed)
        for log_dir, entries in changed:
            self._written_hws[log_dir] = entries

    def _changed_hws(self, high_watermarks: Mapping[TopicPartitionName, int]) -> list[tuple[str, dict]]:
        """(log dir, its entries) for each log dir whose entries differ from the last written."""
        by_dir: dict[str, dict[TopicPartitionName, int]] = {d: {} for d in self.online_dirs}
        for tp, hw in high_watermarks.items():
            log_dir = self._dir_of.get(tp)
            if log_dir in by_dir:
                by_dir[log_dir][tp] = hw
        return [(log_dir, entries) for log_dir, entries in by_dir.items() if self._written_hws.get(log_dir) != entries]

    def _write_hw_files(self, changed: list[tuple[str, dict]]) -> None:
        for log_dir, entries in changed:
            self._hw_file(log_dir).write(entries)

    def checkpoint_logs(self) -> None:
        """Write every log's recovery point and log start offset checkpoints:
        each per-directory file once."""
        removed, self._removed = self._removed, {}
        write_checkpoints_of(self._logs.values(), removed=removed)
        # What the files hold now is unknown here (merged with what they
        # held): the next periodic pass reads them again.
        self._written_logs.clear()

    async def checkpoint_logs_in_slices(self, slice_s: float = PASS_SLICE_S) -> int:
        """The periodic `checkpoint_logs`: the logs' offsets collected in
        slices of `slice_s` of the event loop, and a dir's two files written
        only if an entry changed, from what this pass last wrote (not read
        back each time). At 100,000 logs, reading, comparing and rewriting
        both files in one step held the loop for seconds, past the metadata
        fetch's timeout. How many files were written."""
        removed, self._removed = self._removed, {}
        collected: list[tuple[TopicPartitionName, Log, int, int]] = []
        slices = Slices(slice_s)
        for i, (tp, log) in enumerate(list(self._logs.items())):
            if i % SLICE_CHECK_EVERY == 0:
                await slices.check()
            if log.checkpoint_files:
                collected.append((tp, log, log.recovery_point, log.log_start_offset))
        # From here to the write, no await: nothing changes the logs meanwhile.
        by_dir: dict[str, tuple[dict[TopicPartitionName, int], dict[TopicPartitionName, int]]] = {}
        marked: dict[str, list[Log]] = {}
        for log_dir in self.log_dirs:
            written = self._written_logs.get(log_dir)
            if written is None:
                written = (_read_checkpoint(self._fs, log_dir, RECOVERY_POINT_OFFSET_CHECKPOINT),
                           _read_checkpoint(self._fs, log_dir, LOG_START_OFFSET_CHECKPOINT))
                self._written_logs[log_dir] = written
            by_dir[log_dir] = (dict(written[0]), dict(written[1]))
            marked[log_dir] = []
            for tp in removed.get(log_dir, ()):
                by_dir[log_dir][0].pop(tp, None)
                by_dir[log_dir][1].pop(tp, None)
        for tp, log, recovery_point, log_start_offset in collected:
            log_dir = self._dir_of.get(tp)
            if self._logs.get(tp) is not log or log_dir not in by_dir:
                continue  # deleted or moved while the pass yielded
            # A truncation since it was collected lowered it (and wrote its
            # own entry): the lower value, never one above the log's end.
            recovery_point = min(recovery_point, log.recovery_point)
            by_dir[log_dir][0][tp] = recovery_point
            by_dir[log_dir][1][tp] = log.log_start_offset
            marked[log_dir].append(log)
        files = 0
        for log_dir, (recovery_points, start_offsets) in by_dir.items():
            written = self._written_logs[log_dir]
            if recovery_points != written[0]:
                OffsetCheckpointFile(self._fs, os.path.join(log_dir, RECOVERY_POINT_OFFSET_CHECKPOINT)).write(
                    recovery_points)
                files += 1
            if start_offsets != written[1]:
                OffsetCheckpointFile(self._fs, os.path.join(log_dir, LOG_START_OFFSET_CHECKPOINT)).write(
                    start_offsets)
                files += 1
            self._written_logs[log_dir] = (recovery_points, start_offsets)
            for log in marked[log_dir]:
                log.checkpoints_written()
        return files

    def flush_due(self, now_ms: int) -> None:
        """Apply `flush.ms` to logs that have it."""
        for log in self._flushed_by_policy.values():
            log.maybe_flush(now_ms)

    def shutdown(self, high_watermarks: Mapping[TopicPartitionName, int]) -> None:
        """Clean shutdown: flush and close every log, write every
        checkpoint, then the clean shutdown marker (fsynced)."""
        self.cleaner.close()
        self._close_logs()
        try:
            self.checkpoint_high_watermarks(high_watermarks)
        except OSError as e:
            # A full or failing disk: the shutdown goes on (the process must stop, not
            # die with a traceback), and no marker says these dirs closed cleanly, so
            # the next start recovers their logs as after a crash.
            _log.error("writing the high watermark checkpoints failed: %s; the logs are recovered at the next start",
                       e)
            self._unclean_dirs.update(self.log_dirs)
        clean = []
        for log_dir in self.log_dirs:
            if not os.path.isdir(log_dir) or log_dir in self._unclean_dirs:
                continue
            try:
                write_atomically(self._fs, os.path.join(log_dir, CLEAN_SHUTDOWN_FILE), b"")
                clean.append(log_dir)
            except OSError as e:
                _log.error("%s: writing %s failed: %s; its logs are recovered at the next start", log_dir,
                           CLEAN_SHUTDOWN_FILE, e)
        if clean == list(self.log_dirs):
            _log.info("logs closed cleanly; wrote %s", CLEAN_SHUTDOWN_FILE)

    def close_without_marker(self) -> None:
        """Release the files (tests that simulate a crash after this)."""
        self.cleaner.close()
        self._close_logs()

    def _close_logs(self) -> int:
        """Close every log, then write each checkpoint file once (closing
        log by log, each close rewrote its dir's whole files: quadratic)."""
        failed = 0
        # Every log's fsyncs as one syncfs per disk at the end: the
        # checkpoints that declare the logs flushed are written after it.
        with deferred_fsync():
            for tp, log in self._logs.items():
                try:
                    log.close(checkpoint=False)
                except OSError as e:
                    # One log's disk error must not keep the others from closing.
                    failed += 1
                    _log.error("%s-%d: closing its log failed: %s; it is recovered at the next start", *tp, e)
                    self._unclean_dirs.add(self._dir_of.get(tp))
        try:
            self.checkpoint_logs()
        except OSError as e:
            failed += 1
            _log.error("writing the logs' checkpoints failed: %s; the logs are recovered at the next start", e)
            self._unclean_dirs.update(self.log_dirs)
        self._logs.clear()
        self._flushed_by_policy.clear()
        return failed

    # --- helpers -------------------------------------------------------

    def _hw_file(self, log_dir: str) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(self._fs, os.path.join(log_dir, REPLICATION_OFFSET_CHECKPOINT))

    def _pick_dir(self) -> str:
        # Kafka places a new log in the dir with the fewest partitions (of those online).
        online = self.online_dirs
        if not online:
            raise OSError(errno.EIO, f"every log dir is offline ({', '.join(self.log_dirs)})")
        return min(online, key=self._dir_counts.__getitem__)

    def _place(self, tp: TopicPartitionName, log_dir: str) -> None:
        previous = self._dir_of.get(tp)
        if previous != log_dir:
            if previous is not None:
                self._dir_counts[previous] -= 1
            self._dir_counts[log_dir] += 1
            self._dir_of[tp] = log_dir

    def _move_aside(self, path: str, why: str) -> None:
        # Kafka names moved-aside logs <topic>-<partition>.<unique id>-stray.
        stray = f"{path}.{uuid.uuid4().hex}{STRAY_SUFFIX}"
        os.replace(path, stray)
        self._fs.fsync_dir(os.path.dirname(path))
        _log.warning("moved the log %s aside to %s: %s; remove it once you do not need it",
                     path, os.path.basename(stray), why)


def _read_checkpoint(fs: OsFileSystem, log_dir: str, name: str) -> dict[TopicPartitionName, int]:
    try:
        return OffsetCheckpointFile(fs, os.path.join(log_dir, name)).read()
    except CorruptCheckpointError as e:
        _log.warning("%s; ignoring it (the logs are recovered from their first segments)", e)
        return {}


def _nofile_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError):
        return "unknown"
