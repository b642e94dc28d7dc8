"""The log the Raft core replicates, as the core sees it.

`ReplicatedLog` is the narrow interface the core uses (after Kafka's
`raft.ReplicatedLog`). Two implementations exist: `MemoryLog` (for the
simulation and unit tests; a crash drops what was never flushed) and
`StorageReplicatedLog` over `storage.Log` for production.

Records are opaque bytes to the core. The log builds record batches: one
batch per `append_as_leader` call, stamped with the leader's epoch as the
batch's partition leader epoch, which is how the log knows the epoch of
every offset (Kafka's leader epoch cache; KIP-101).

Epoch bookkeeping. `end_offset_for_epoch(e)` answers KIP-101's
OffsetsForLeaderEpoch question: "the largest epoch <= e this log knows, and
the offset where it ends" (the start of the next epoch, or the log end). The
latest snapshot acts as an entry of its own epoch just below the log start;
an empty log without a snapshot behaves as if epoch 0 ended at offset 0.
`validate_fetch_position` turns that into the leader's Fetch verdict.

The core calls everything here except `flush`: flushing is an fsync, which
the driver performs when an `Output` asks for it (persist, then send).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from quorum.raft.messages import UNKNOWN_EPOCH, DivergingEpoch, OffsetAndEpoch, SnapshotId


@dataclasses.dataclass(frozen=True, slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    size_in_bytes: int


class ReplicatedLog(Protocol):
    @property
    def log_start_offset(self) -> int:
        """First offset still in the log (the latest snapshot's end offset
        once the prefix before it was deleted)."""

    @property
    def log_end_offset(self) -> int:
        """Offset the next appended record gets."""

    @property
    def flushed_offset(self) -> int:
        """Every offset below this survives a crash."""

    @property
    def last_fetched_epoch(self) -> int:
        """Epoch of the last batch; the latest snapshot's epoch if the log is
        empty after it; 0 for an empty log."""

    @property
    def latest_snapshot_id(self) -> SnapshotId | None: ...

    @property
    def snapshot_ids(self) -> tuple[SnapshotId, ...]:
        """Every stored snapshot, oldest first."""

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """Largest known epoch <= `epoch` and its end offset; (-1, -1) when
        `epoch` is older than everything this log still knows."""

    def append_as_leader(self, records: Sequence[bytes], epoch: int) -> AppendInfo:
        """Append one batch of data records at the log end, stamped `epoch`."""

    def append_leader_change(
        self, epoch: int, leader_id: int, voters: Sequence[int], granting_voters: Sequence[int]
    ) -> AppendInfo:
        """Append a control batch with one LeaderChange record (control type 2)."""

    def append_voters(self, epoch: int, voters: frozenset[int]) -> AppendInfo:
        """Append a control batch with one record of the voter set (Kafka's
        VotersRecord, control type 6)."""

    def voter_sets(self) -> tuple[tuple[int, frozenset[int]], ...]:
        """(offset, voters) of every voter-set record the log holds, oldest
        first; the latest snapshot's voter set, if the log starts at one, at
        offset log_start_offset - 1. Empty: the static configured set applies."""

    def append_as_follower(self, batches: bytes) -> AppendInfo:
        """Append batches read from the leader; the first must start at the log end."""

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= `offset`; the log end may
        land below `offset` when it falls inside a batch."""

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from `offset` (a batch boundary), up to `max_bytes`
        but at least one batch (KIP-74), none reaching `max_offset` or beyond."""

    def flush(self, offset: int) -> None:
        """Make [0, offset) durable. Called by the driver, never by the core."""

    def create_snapshot(self, end_offset: int, data: bytes) -> SnapshotId:
        """Durably store `data` as the snapshot of [0, end_offset)."""

    def snapshot_size(self, snapshot_id: SnapshotId) -> int | None:
        """Size in bytes of a stored snapshot, None if it is not stored."""

    def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes: ...

    def install_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        """Store a snapshot fetched from the leader and empty the log, so
        log_start_offset == log_end_offset == snapshot_id.end_offset."""

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        """Drop the log prefix below a stored snapshot: the log start
        advances to its end offset."""

    def delete_snapshot(self, snapshot_id: SnapshotId) -> None:
        """Remove a stored snapshot (never the one the log starts at)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ValidPosition:
    """The fetch position is on the leader's log: answer records from it."""


VALID = ValidPosition()


def validate_fetch_position(
    log: ReplicatedLog, fetch_offset: int, last_fetched_epoch: int
) -> ValidPosition | DivergingEpoch | SnapshotId:
    """The leader's verdict on a Fetch position (KIP-595 "Fetch" handling).

    - below the log start: the fetcher must load the latest snapshot first;
    - the leader's log for `last_fetched_epoch` ends before `fetch_offset`, or
      the leader never had that epoch: the fetcher diverged and must truncate
      to the returned epoch's end offset (or load the snapshot, if that end
      is itself below the log start);
    - otherwise the fetcher's log is a prefix of ours (Log Matching, Raft
      §5.3: an entry of epoch e at offset o was written by e's only leader).
    """
    snapshot = log.latest_snapshot_id
    if fetch_offset < log.log_start_offset:
        assert snapshot is not None, "a log that does not start at 0 must have a snapshot"
        return snapshot
    end = log.end_offset_for_epoch(last_fetched_epoch)
    if end.epoch == last_fetched_epoch and fetch_offset <= end.offset:
        return VALID
    if end.epoch == UNKNOWN_EPOCH or end.offset < log.log_start_offset:
        assert snapshot is not None, "an epoch older than the log start is only known through a snapshot"
        return snapshot
    return DivergingEpoch(epoch=end.epoch, end_offset=end.offset)
