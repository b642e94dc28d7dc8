"""StorageReplicatedLog: the metadata log on disk, as the Raft core sees it.

The records live in a `storage.log.Log` (the `__cluster_metadata-0`
directory: segments, indexes, the leader-epoch-checkpoint); the core's
`ReplicatedLog` calls map onto it:

- `append_as_leader` builds one v2 record batch (`storage.batch.build_batch`)
  whose partition leader epoch is the Raft epoch, at the log end offset;
  `append_leader_change` builds a control batch holding a LeaderChange
  record (control type 2) whose value is Kafka's LeaderChangeMessage v0;
- the epoch questions are answered from the log's leader epoch cache, with
  the snapshot at the log start standing in for the epochs deleted before it;
- `flushed_offset` is the log's recovery point: `flush` fsyncs up to there.

Snapshots are files in the same directory, named as Kafka names them,
`<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`, holding the state
machine's bytes as given. Each is written to a `.tmp` file, fsynced, and
renamed into place with a directory fsync, so a snapshot is either whole or
absent after a crash (storage recovery removes stray `.tmp` files).

This module does I/O (through the storage engine's `FileSystem`); it is the
one place in this package that does, and the core never calls `flush`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

from kio.schema.leader_change_message.v0.data import LeaderChangeMessage, Voter
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from quorum.raft.errors import RaftUsageError
from quorum.raft.log import AppendInfo
from quorum.raft.messages import UNKNOWN_EPOCH, UNKNOWN_OFFSET, OffsetAndEpoch, SnapshotId
from storage.batch import ControlRecordType, build_batch, build_control_batch, iter_batch_headers
from storage.config import LogConfig
from storage.fs import FileSystem
from storage.log import Log
from quorum.raft.voters import VoterInfo, split_snapshot_file, voter_records_in, voters_control_batch

SNAPSHOT_SUFFIX = ".checkpoint"
_PARTIAL_SUFFIX = ".checkpoint.tmp"
_write_leader_change = entity_writer(LeaderChangeMessage)


def snapshot_file_name(snapshot_id: SnapshotId) -> str:
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> SnapshotId | None:
    if not name.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = name[: -len(SNAPSHOT_SUFFIX)]
    offset, _, epoch = stem.partition("-")
    if len(offset) != 20 or len(epoch) != 10 or not (offset.isdigit() and epoch.isdigit()):
        return None
    return SnapshotId(end_offset=int(offset), epoch=int(epoch))


def encode_leader_change(leader_id: int, voters: Sequence[int], granting_voters: Sequence[int]) -> bytes:
    """Kafka's LeaderChangeMessage v0, the value of a LEADER_CHANGE control record."""
    message = LeaderChangeMessage(
        version=i16(0),
        leader_id=i32(leader_id),
        voters=tuple(Voter(voter_id=i32(v)) for v in voters),
        granting_voters=tuple(Voter(voter_id=i32(v)) for v in granting_voters),
    )
    buffer = io.BytesIO()
    _write_leader_change(buffer, message)
    return buffer.getvalue()


class StorageReplicatedLog:
    """A `ReplicatedLog` over an open `storage.log.Log`.

    The log must keep everything (`retention.ms` and `retention.bytes` -1):
    only a snapshot may remove metadata records. `clock_ms` (optional)
    stamps record timestamps and drives time-based segment rolls; without it
    records carry no timestamp (-1).
    """

    def __init__(self, log: Log, *, clock_ms: Callable[[], int] | None = None) -> None:
        if log.config.retention_ms >= 0 or log.config.retention_bytes >= 0:
            raise RaftUsageError(
                f"the metadata log {log.dir_path} has retention.ms={log.config.retention_ms} and "
                f"retention.bytes={log.config.retention_bytes}: open it with both -1, since only a "
                "snapshot may delete committed metadata records"
            )
        self._log = log
        self._fs = log.fs
        self._dir = log.dir_path
        self._clock_ms = clock_ms
        self._snapshots: dict[SnapshotId, int] = {}  # id -> size in bytes
        #: (offset, voters) of every VotersRecord in the log, oldest first.
        self._voter_records: list[tuple[int, tuple[VoterInfo, ...]]] = []
        #: Every voter this log has named, with its directory id and endpoints: a
        #: change names voters by id, and the record written for it carries these.
        self._known_voters: dict[int, VoterInfo] = {}
        #: The voter set of the snapshot the log starts at, read when the start moves.
        self._base_voters: tuple[VoterInfo, ...] | None = None
        self._voter_sets_cache: tuple[tuple[int, frozenset[int]], ...] | None = None
        for name in self._fs.listdir(self._dir):
            if name.endswith(_PARTIAL_SUFFIX):
                self._fs.remove(self._path(name))
                continue
            snapshot_id = parse_snapshot_file_name(name)
            if snapshot_id is not None:
                self._snapshots[snapshot_id] = len(self._fs.read_file(self._path(name)))
        latest = self.latest_snapshot_id
        if latest is not None and latest.end_offset > log.log_end_offset:
            # A crash between storing a fetched snapshot and emptying the log:
            # the snapshot is durable and newer than every record here.
            log.truncate_fully_and_start_at(latest.end_offset)
        self._scan_voter_records()

    @classmethod
    def open(
        cls,
        dir_path: str,
        *,
        now_ms: int,
        fs: FileSystem | None = None,
        config: LogConfig | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> StorageReplicatedLog:
        """Open (and recover) the metadata log in `dir_path`, normally
        `<metadata.log.dir>/__cluster_metadata-0`. `config` defaults to
        Kafka's topic defaults with retention off."""
        config = config or LogConfig(retention_ms=-1, retention_bytes=-1, max_message_bytes=8 * 1024 * 1024)
        return cls(Log.open(dir_path, config, now_ms=now_ms, fs=fs), clock_ms=clock_ms)

    @property
    def storage_log(self) -> Log:
        return self._log

    def _path(self, name: str) -> str:
        return f"{self._dir}/{name}"

    def _now_ms(self) -> int:
        return self._clock_ms() if self._clock_ms is not None else 0

    # --- positions ----------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.log_end_offset

    @property
    def flushed_offset(self) -> int:
        return self._log.recovery_point

    @property
    def latest_snapshot_id(self) -> SnapshotId | None:
        return max(self._snapshots, default=None)

    def _base_epoch(self) -> int:
        """The epoch in force just below the log start."""
        start = self._log.log_start_offset
        for snapshot_id in self._snapshots:
            if snapshot_id.end_offset == start:
                return snapshot_id.epoch
        entries = self._log.epoch_cache.entries
        if start > 0 and entries and entries[0][1] <= start:
            return entries[0][0]
        return 0

    @property
    def last_fetched_epoch(self) -> int:
        log = self._log
        if log.log_end_offset > log.log_start_offset:
            epoch = log.epoch_cache.epoch_for_offset(log.log_end_offset - 1)
            if epoch != UNKNOWN_EPOCH:
                return epoch
        return self._base_epoch()

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        base = self._base_epoch()
        if epoch < base:
            return OffsetAndEpoch(UNKNOWN_EPOCH, UNKNOWN_OFFSET)
        found = base
        for entry_epoch, start in self._log.epoch_cache.entries:
            if entry_epoch > epoch:
                return OffsetAndEpoch(found, max(start, self._log.log_start_offset))
            found = entry_epoch
        return OffsetAndEpoch(found, self._log.log_end_offset)

    # --- appends and truncation --------------------------------------------

    def append_as_leader(self, records: Sequence[bytes], epoch: int) -> AppendInfo:
        now_ms = self._now_ms()
        timestamp = now_ms if self._clock_ms is not None else None
        batch = build_batch(
            [(None, record, (), timestamp) for record in records],
            base_offset=self._log.log_end_offset,
            partition_leader_epoch=epoch,
        )
        base = self._log.append_as_follower(batch, now_ms)
        return AppendInfo(base, base + len(records) - 1, len(batch))

    def append_leader_change(
        self, epoch: int, leader_id: int, voters: Sequence[int], granting_voters: Sequence[int]
    ) -> AppendInfo:
        now_ms = self._now_ms()
        batch = build_control_batch(
            ControlRecordType.LEADER_CHANGE,
            encode_leader_change(leader_id, voters, granting_voters),
            base_offset=self._log.log_end_offset,
            timestamp_ms=now_ms if self._clock_ms is not None else -1,
            partition_leader_epoch=epoch,
        )
        base = self._log.append_as_follower(batch, now_ms)
        return AppendInfo(base, base, len(batch))

    def append_voters(self, epoch: int, voters: frozenset[int]) -> AppendInfo:
        """A control batch with one VotersRecord (control type 6); each voter
        carries the directory id and endpoints this log knows for it
        (`remember_voter`)."""
        now_ms = self._now_ms()
        infos = [self._known_voters.get(v, VoterInfo(v)) for v in sorted(voters)]
        batch = voters_control_batch(infos, base_offset=self._log.log_end_offset, epoch=epoch,
                                     timestamp_ms=now_ms if self._clock_ms is not None else -1,
                                     with_kraft_version=False)
        base = self._log.append_as_follower(batch, now_ms)
        self._note_voter_records(batch)
        return AppendInfo(base, base, len(batch))

    def remember_voter(self, info: VoterInfo) -> None:
        """The directory id and endpoints of a voter about to be added."""
        self._known_voters[info.node_id] = info

    def known_voter(self, node_id: int) -> VoterInfo | None:
        return self._known_voters.get(node_id)

    def voter_sets(self) -> tuple[tuple[int, frozenset[int]], ...]:
        """(offset, voter ids) of every VotersRecord in the log, led by the
        voter set of the snapshot the log starts at (at log start - 1)."""
        # The core asks on every step: answer from a cache the changes reset.
        if self._voter_sets_cache is None:
            self._voter_sets_cache = tuple(
                (offset, frozenset(v.node_id for v in infos)) for offset, infos in self.voter_records())
        return self._voter_sets_cache

    def voter_records(self) -> tuple[tuple[int, tuple[VoterInfo, ...]], ...]:
        """As `voter_sets`, with each voter's directory id and endpoints."""
        base = self._base_voters
        lead = ((self._log.log_start_offset - 1, base),) if base is not None else ()
        return lead + tuple(self._voter_records)

    def latest_voters(self) -> tuple[VoterInfo, ...] | None:
        """The voter set in force (the latest record's, committed or not);
        None when the log holds none and the static configured set applies."""
        # The core asks on every step (whose voter is this directory id?): no copy.
        return self._voter_records[-1][1] if self._voter_records else self._base_voters

    def _start_snapshot_voters(self) -> tuple[VoterInfo, ...] | None:
        start = self._log.log_start_offset
        for snapshot_id in self._snapshots:
            if snapshot_id.end_offset == start:
                voters, _ = split_snapshot_file(self._fs.read_file(self._path(snapshot_file_name(snapshot_id))))
                return voters
        return None

    def _note_voter_records(self, batches: bytes) -> None:
        for offset, infos in voter_records_in(batches):
            self._voter_sets_cache = None
            self._voter_records.append((offset, infos))
            for info in infos:
                self._known_voters[info.node_id] = info

    def _scan_voter_records(self) -> None:
        """Find the VotersRecords of the log as opened (control batches only)."""
        self._voter_records = []
        self._voter_sets_cache = None
        base = self._base_voters = self._start_snapshot_voters()
        for info in base or ():
            self._known_voters[info.node_id] = info
        offset, end = self._log.log_start_offset, self._log.log_end_offset
        while offset < end:
            data = self._log.read_bytes(offset, 1 << 20)
            last = None
            for pos, header in iter_batch_headers(data):
                last = header
                if header.is_control:
                    self._note_voter_records(data[pos : pos + header.size_in_bytes])
            if last is None:
                break
            offset = last.last_offset + 1

    def append_as_follower(self, batches: bytes) -> AppendInfo:
        last = None
        control = False
        for _, header in iter_batch_headers(batches):
            last = header
            control = control or header.is_control
        assert last is not None, "append_as_follower needs at least one batch"
        base = self._log.append_as_follower(batches, self._now_ms())
        if control:
            self._note_voter_records(batches)
        return AppendInfo(base, last.last_offset, len(batches))

    def truncate_to(self, offset: int) -> None:
        self._log.truncate_to(offset)
        end = self._log.log_end_offset
        self._voter_records = [(o, v) for o, v in self._voter_records if o < end]
        self._voter_sets_cache = None

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        return self._log.read_bytes(offset, max_bytes, max_offset)

    def flush(self, offset: int) -> None:
        self._log.flush(offset)

    # --- snapshots ------------------------------------------------------------

    def _write_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        name = snapshot_file_name(snapshot_id)
        partial = self._path(name[: -len(SNAPSHOT_SUFFIX)] + _PARTIAL_SUFFIX)
        f = self._fs.open(partial)
        try:
            f.truncate(0)
            f.append(data)
            f.fsync()
        finally:
            f.close()
        self._fs.rename(partial, self._path(name))
        self._fs.fsync_dir(self._dir)
        self._snapshots[snapshot_id] = len(data)

    def create_snapshot(self, end_offset: int, data: bytes) -> SnapshotId:
        log = self._log
        assert log.log_start_offset <= end_offset <= log.log_end_offset, (end_offset, log)
        if end_offset > log.log_start_offset:
            epoch = log.epoch_cache.epoch_for_offset(end_offset - 1)
        else:
            epoch = self._base_epoch()
        snapshot_id = SnapshotId(end_offset=end_offset, epoch=epoch)
        in_force = [v for o, v in self.voter_records() if o < end_offset]
        if in_force:
            # The snapshot starts with the voter set in force at its end, as
            # Kafka's starts with its VotersRecord: a log that starts here
            # still knows its voters.
            data = voters_control_batch(in_force[-1], base_offset=max(0, end_offset - 1), epoch=epoch) + bytes(data)
        self._write_snapshot(snapshot_id, data)
        return snapshot_id

    def snapshot_size(self, snapshot_id: SnapshotId) -> int | None:
        return self._snapshots.get(snapshot_id)

    def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        f = self._fs.open(self._path(snapshot_file_name(snapshot_id)))
        try:
            return f.pread(max(0, min(max_bytes, f.size - position)), position)
        finally:
            f.close()

    def snapshot_data(self, snapshot_id: SnapshotId) -> bytes:
        """The state machine's bytes of a snapshot (after its voter set, if it carries one)."""
        return split_snapshot_file(self._fs.read_file(self._path(snapshot_file_name(snapshot_id))))[1]

    def install_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        self._write_snapshot(snapshot_id, data)
        self._log.truncate_fully_and_start_at(snapshot_id.end_offset)
        self._scan_voter_records()

    @property
    def snapshot_ids(self) -> tuple[SnapshotId, ...]:
        return tuple(sorted(self._snapshots))

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        assert snapshot_id in self._snapshots
        if snapshot_id.end_offset <= self._log.log_start_offset:
            return
        self._log.maybe_increment_log_start_offset(snapshot_id.end_offset)
        self._log.delete_old_segments(self._now_ms())
        start = self._log.log_start_offset
        self._voter_records = [(o, v) for o, v in self._voter_records if o >= start]
        self._base_voters = self._start_snapshot_voters()
        self._voter_sets_cache = None

    def delete_snapshot(self, snapshot_id: SnapshotId) -> None:
        assert snapshot_id.end_offset != self._log.log_start_offset, "the log starts at this snapshot"
        self._fs.remove(self._path(snapshot_file_name(snapshot_id)))
        del self._snapshots[snapshot_id]
        self._fs.fsync_dir(self._dir)
