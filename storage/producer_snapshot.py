"""Producer state on disk: snapshot files, and rebuilding from the log.

Theory of operation
-------------------
`ProducerStateManager` is a partition's `ProducerState` (see
`storage.producer_state`) tied to its log directory. The `Log` owns one
when opened with `producer_state=True` and drives it:

- **Roll**: before a new segment starts, the state (which then covers
  every batch below the log end offset) is written to
  `<log_end_offset:020d>.snapshot`, as Kafka writes one per segment.
  `close()` writes one at the log end offset too, so a clean restart reads
  no batch at all.
- **Open** (`load`): snapshots past the recovered log end offset are
  deleted (a crash took the batches they describe); the newest one left
  that parses is loaded and the batch headers from its offset to the log
  end offset are replayed (headers only: no record is decoded). With no
  usable snapshot, every batch header of the log is replayed.
- **Truncation** (`truncate_and_reload`): snapshots past the new log end
  offset are deleted durably (so a crash cannot bring one back over
  different batches), then the state is loaded again as on open. A full
  truncation (`reset`) deletes every snapshot.
- **Retention** (`delete_snapshots_below`): snapshots below the first
  segment go with the segments; the state itself is kept (KIP-360).

Replaying reads what the physical segments hold, including batches below
the log start offset that still sit in the first segment: more producer
history only means more retries recognised as duplicates.

Snapshot format, version 2 (Kafka's own is a Kafka-protocol struct with a
CRC; ours is a plain big-endian struct with a CRC32C, also versioned):

    version          int16   2
    crc              uint32  CRC32C of every byte after this field
    offset           int64   batches below it are included (= file name)
    producer_count   int32
    per producer:    producer_id int64, producer_epoch int16,
                     last_timestamp int64, coordinator_epoch int32,
                     current_txn_first_offset int64 (-1: no open
                     transaction), batch_count int8 (0..5),
                     then per batch: first_seq int32, last_seq int32,
                     first_offset int64, last_offset int64, timestamp int64

Version 1 (no coordinator epoch, no open transaction) is still read.

Transactions: the aborted-transaction index (`.txnindex`, see
`storage.txn_index`) is rebuilt with the state. Before replaying from a
snapshot at offset S, every segment's index loses its entries for markers
at or after S; the replay adds them back, in the segment the marker sits
in, from the control records it reads (the header alone does not say
COMMIT or ABORT). On `open`, the snapshot used is the newest one at or
below the recovery point: a crash may have lost index entries the
segments past it had, and the replay rewrites them from the log.

Unlike Kafka's (which keeps only each producer's last batch), a snapshot
keeps all five remembered batches, so a retry is still recognised as a
duplicate after a restart. A snapshot that fails its CRC or does not
parse is logged, deleted, and the next older one is tried.

Files go through `storage.fs` only; the clock is never read.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import TYPE_CHECKING

from crc32c import crc32c

from storage.batch import CONTROL_MASK, read_txn_marker
from storage.checkpoint import write_atomically
from storage.errors import CorruptRecordError, StorageError
from storage.fs import FileSystem
from storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    MAX_BATCHES_PER_PRODUCER,
    BatchMetadata,
    ProducerState,
    ProducerStateEntry,
)
from storage.txn_index import AbortedTxn

if TYPE_CHECKING:
    from storage.log import Log
    from storage.producer_state import CompletedTxn, ProducerState
    from storage.segment import LogSegment

logger = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2

_PREFIX = struct.Struct(">hI")
_BODY_HEAD = struct.Struct(">qi")
_PRODUCER_V1 = struct.Struct(">qhqb")
_PRODUCER = struct.Struct(">qhqiqb")
_BATCH = struct.Struct(">iiqqq")


class CorruptSnapshotError(StorageError):
    """A producer snapshot file that is not a whole version-1 snapshot; the
    manager deletes it and rebuilds the state from the log instead."""


def record_completed(segment: LogSegment, state: ProducerState, completed: CompletedTxn) -> None:
    """A marker in `segment` ended `completed`: an aborted one goes into
    the segment's `.txnindex`, with the last stable offset after it."""
    if completed.is_aborted:
        segment.txn_index.append(AbortedTxn(completed.producer_id, completed.first_offset,
                                            completed.last_offset, state.index_last_stable_offset(completed)))


def snapshot_offsets_in(names: list[str]) -> list[int]:
    """The offsets of the snapshot files among a directory's `names`, ascending."""
    out = []
    for name in names:
        stem, suffix = os.path.splitext(name)
        if suffix == SNAPSHOT_SUFFIX and len(stem) == 20 and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def encode_snapshot(offset: int, entries: list[ProducerStateEntry]) -> bytes:
    body = bytearray(_BODY_HEAD.pack(offset, len(entries)))
    for e in entries:
        assert len(e.batches) <= MAX_BATCHES_PER_PRODUCER
        body += _PRODUCER.pack(e.producer_id, e.producer_epoch, e.last_timestamp, e.coordinator_epoch,
                               e.current_txn_first_offset, len(e.batches))
        for b in e.batches:
            body += _BATCH.pack(*b)
    return _PREFIX.pack(SNAPSHOT_VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes, what: str = "snapshot") -> tuple[int, list[ProducerStateEntry]]:
    """`(offset, entries)`; raises `CorruptSnapshotError`."""
    if len(data) < _PREFIX.size + _BODY_HEAD.size:
        raise CorruptSnapshotError(f"{what} is {len(data)} bytes, shorter than a snapshot header")
    version, crc = _PREFIX.unpack_from(data, 0)
    if version not in (1, SNAPSHOT_VERSION):
        raise CorruptSnapshotError(f"{what} has version {version}; this broker reads versions 1 and 2")
    body = memoryview(data)[_PREFIX.size :]
    if crc32c(body) != crc:
        raise CorruptSnapshotError(f"{what} fails its CRC32C: the file is damaged")
    try:
        offset, count = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        entries = []
        for _ in range(count):
            if version == 1:
                pid, epoch, last_ts, n = _PRODUCER_V1.unpack_from(body, pos)
                coordinator_epoch, txn_first = -1, -1
                pos += _PRODUCER_V1.size
            else:
                pid, epoch, last_ts, coordinator_epoch, txn_first, n = _PRODUCER.unpack_from(body, pos)
                pos += _PRODUCER.size
            if not 0 <= n <= MAX_BATCHES_PER_PRODUCER:
                raise CorruptSnapshotError(f"{what}: producer {pid} has {n} batches")
            batches = []
            for _ in range(n):
                batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(ProducerStateEntry(pid, epoch, batches, last_ts, coordinator_epoch, txn_first))
    except struct.error:
        raise CorruptSnapshotError(f"{what} ends inside its producer list") from None
    if pos != len(body):
        raise CorruptSnapshotError(f"{what} has {len(body) - pos} bytes after its producer list")
    return offset, entries


class ProducerStateManager(ProducerState):
    """A partition's producer state with its snapshot files (module doc)."""

    def __init__(
        self, fs: FileSystem, dir_path: str, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    ) -> None:
        super().__init__(producer_id_expiration_ms)
        self.fs = fs
        self.dir_path = dir_path
        #: The offset of the newest snapshot file this manager loaded or
        #: wrote (None: none), for `maybe_take_snapshot`.
        self.snapshot_offset: int | None = None

    # --- files ---

    def _path(self, offset: int) -> str:
        return os.path.join(self.dir_path, snapshot_file_name(offset))

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files on disk, ascending."""
        return snapshot_offsets_in(self.fs.listdir(self.dir_path))

    def take_snapshot(self, offset: int) -> None:
        """Write the state, which must cover exactly the batches below
        `offset`, to `<offset>.snapshot` (atomically, durably)."""
        write_atomically(self.fs, self._path(offset), encode_snapshot(offset, self.snapshot_entries()))
        self.snapshot_offset = offset

    def maybe_take_snapshot(self, offset: int) -> None:
        """`take_snapshot`, unless no batch came since the newest snapshot
        (or, with no snapshot, none at all: `offset` 0): as Kafka's
        `takeSnapshot` skips one that is "not a new offset". A clean
        shutdown of 30,000 untouched partitions spent 8 s rewriting their
        snapshots."""
        if offset != (0 if self.snapshot_offset is None else self.snapshot_offset):
            self.take_snapshot(offset)

    def _delete(self, offsets: list[int]) -> None:
        for offset in offsets:
            self.fs.remove(self._path(offset))
            if offset == self.snapshot_offset:
                self.snapshot_offset = None
        if offsets:
            self.fs.fsync_dir(self.dir_path)

    def delete_snapshots_below(self, offset: int) -> None:
        self._delete([o for o in self.snapshot_offsets() if o < offset])

    # --- loading ---

    @classmethod
    def load(cls, log: Log, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
             recovery_point: int | None = None, snapshot_offsets: list[int] | None = None):
        """The state of `log` just opened; `recovery_point` is the one it
        was opened with (the snapshot used is at or below it, module doc).
        `snapshot_offsets`: those on disk, if the opener listed them."""
        manager = cls(log.fs, log.dir_path, producer_id_expiration_ms)
        manager.reload(log, recovery_point, snapshot_offsets)
        return manager

    def reload(self, log: Log, upto: int | None = None, snapshot_offsets: list[int] | None = None) -> None:
        """Drop snapshots past the log end offset; load the newest good one
        (at or below `upto` if given) and replay the batch headers after
        it, rebuilding the aborted-transaction index from there (module doc)."""
        end = log.log_end_offset
        offsets = self.snapshot_offsets() if snapshot_offsets is None else list(snapshot_offsets)
        self._delete([o for o in offsets if o > end])
        bound = end if upto is None else min(end, upto)
        offsets = [o for o in offsets if o <= bound]
        self.clear()
        self.snapshot_offset = None
        start = None
        while offsets:
            offset = offsets.pop()
            path = self._path(offset)
            try:
                found, entries = decode_snapshot(self.fs.read_file(path), path)
                if found != offset:
                    raise CorruptSnapshotError(f"{path} says it covers offset {found}, its name {offset}")
            except CorruptSnapshotError as e:
                logger.warning("%s; deleting it", e)
                self._delete([offset])
                continue
            self.producers = {e.producer_id: e for e in entries}
            self._rebuild_ongoing()
            start = self.snapshot_offset = offset
            break
        replayed = self._replay(log, start)
        logger.debug(
            "%s: producer state of %d producers from %s, %d batch headers replayed",
            self.dir_path,
            len(self.producers),
            "no snapshot" if start is None else snapshot_file_name(start),
            replayed,
        )

    def _replay(self, log: Log, start: int | None) -> int:
        """Apply the headers of the batches at or after `start` (every
        batch if None); return how many were read. The segments' aborted
        transaction entries from `start` on are rewritten on the way."""
        count = 0
        update = self.update
        for segment in log.segments:
            if start is not None and segment.next_offset <= start:
                continue
            segment.txn_index.truncate_to(start or 0)
            position = 0
            if start is not None and segment.base_offset < start:
                found = segment.find_batch(start)
                if found is None:
                    continue
                position = found[0]
            try:
                for batch_position, header in segment.scan_headers(position):
                    if start is None or header[0] + header[6] >= start:
                        count += 1
                        if header[9] < 0:
                            continue
                        if header[5] & CONTROL_MASK:
                            data = segment.log.pread(header.size_in_bytes, batch_position)
                            completed = update(header, marker=read_txn_marker(data))
                            if completed is not None:
                                record_completed(segment, self, completed)
                        else:
                            update(header)
            except CorruptRecordError as e:
                # A damaged header in a trusted segment: reads report it;
                # the state keeps what came before.
                logger.error("%s: %s; the producer state stops there", segment.path(".log"), e)
                break
        return count

    def truncate_and_reload(self, log: Log) -> None:
        """After `log` was truncated: see `reload`."""
        self.reload(log)

    def reset(self) -> None:
        """After the log was emptied: no state, no snapshot."""
        self.clear()
        self._delete(self.snapshot_offsets())
