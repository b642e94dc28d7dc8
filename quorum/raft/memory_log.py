"""MemoryLog: an in-memory `ReplicatedLog` with a disk that can crash.

The simulation and the unit tests run the Raft core against this. It keeps
two images: the live log, and the durable image the last `flush` wrote. A
`crash()` throws the live log away and reopens the durable image, optionally
keeping some unflushed batches (as a real page cache may have written some
back); snapshots are written durably at once, like Kafka's
write-then-atomic-rename.

Batches are framed simply (this is not the v2 record batch format, which
`StorageReplicatedLog` uses): base_offset i64, length i32 (bytes that
follow), partition_leader_epoch i32, record_count i32, control u8, then each
record as a length-prefixed byte string.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections.abc import Iterable, Sequence

from quorum.raft.log import AppendInfo
from quorum.raft.messages import UNKNOWN_EPOCH, UNKNOWN_OFFSET, OffsetAndEpoch, SnapshotId
from quorum.raft.voters import VoterInfo, decode_voters_record, encode_voters_record

_HEADER = struct.Struct(">qiiiB")
_LEN = struct.Struct(">i")
_LENGTH_COVERS_FROM = 12  # the length field counts the bytes after base_offset and itself


#: A control record holding a voter set (standing in for Kafka's VotersRecord).
VOTERS_PREFIX = b"Voters "
#: A stored snapshot starts with the voter set in force at its end offset
#: (Kafka writes the VotersRecord into the snapshot's header), then a newline.
_SNAPSHOT_VOTERS = b"SnapshotVoters "


def _voter_list(voters: Iterable[VoterInfo]) -> bytes:
    # Kafka's VotersRecord (ids and directory ids), hex-coded: a snapshot's header is one line
    return encode_voters_record(voters).hex().encode()


def _parse_voter_list(text: bytes) -> tuple[VoterInfo, ...]:
    return decode_voters_record(bytes.fromhex(text.decode()))


def encode_voters(voters: Iterable[int | VoterInfo]) -> bytes:
    """A voters record; each voter an id, or a `VoterInfo` whose directory
    id the record keeps (KIP-853: a voter is an id and a directory id)."""
    return VOTERS_PREFIX + _voter_list(v if isinstance(v, VoterInfo) else VoterInfo(v) for v in voters)


def decode_voter_infos(record: bytes) -> tuple[VoterInfo, ...] | None:
    """The voters (with directory ids) of a voters record, None for any other record."""
    if not record.startswith(VOTERS_PREFIX):
        return None
    return _parse_voter_list(record[len(VOTERS_PREFIX) :])


def decode_voters(record: bytes) -> frozenset[int] | None:
    """The voter set of a voters record, None for any other record."""
    infos = decode_voter_infos(record)
    return None if infos is None else frozenset(v.node_id for v in infos)


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryBatch:
    base_offset: int
    epoch: int
    records: tuple[bytes, ...]
    control: bool
    raw: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def end_offset(self) -> int:
        return self.base_offset + len(self.records)


def encode_batch(base_offset: int, epoch: int, records: Sequence[bytes], control: bool) -> MemoryBatch:
    assert records, "a batch holds at least one record"
    body = b"".join(_LEN.pack(len(r)) + r for r in records)
    length = _HEADER.size - _LENGTH_COVERS_FROM + len(body)
    raw = _HEADER.pack(base_offset, length, epoch, len(records), int(control)) + body
    return MemoryBatch(base_offset, epoch, tuple(records), control, raw)


def decode_batches(data: bytes) -> list[MemoryBatch]:
    batches = []
    pos = 0
    while pos < len(data):
        base_offset, length, epoch, count, control = _HEADER.unpack_from(data, pos)
        end = pos + _LENGTH_COVERS_FROM + length
        assert end <= len(data), "truncated batch"
        rpos = pos + _HEADER.size
        records = []
        for _ in range(count):
            (n,) = _LEN.unpack_from(data, rpos)
            records.append(bytes(data[rpos + 4 : rpos + 4 + n]))
            rpos += 4 + n
        assert rpos == end, "batch length disagrees with its records"
        batches.append(MemoryBatch(base_offset, epoch, tuple(records), bool(control), bytes(data[pos:end])))
        pos = end
    return batches


class MemoryLog:
    """`ReplicatedLog` in memory. Not thread-safe; not durable beyond `crash`."""

    def __init__(self) -> None:
        self._batches: list[MemoryBatch] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._flushed = 0
        self._durable: list[MemoryBatch] = []
        self._durable_start = 0
        self._snapshots: dict[SnapshotId, bytes] = {}
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), ascending
        self._start_snapshot: SnapshotId | None = None  # the snapshot the log starts after
        self._voter_sets: list[tuple[int, tuple[VoterInfo, ...]]] = []  # (offset, voters) of voters records
        #: Every voter this log has named or was told of (`remember_voter`),
        #: with its directory id: a change names voters by id, the record carries these.
        self._known_voters: dict[int, VoterInfo] = {}
        # The core asks for the voters on every step: answered from caches that changes reset.
        self._voter_records_cache: tuple[tuple[int, tuple[VoterInfo, ...]], ...] | None = None
        self._voter_sets_cache: tuple[tuple[int, frozenset[int]], ...] | None = None

    # --- positions ----------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._batches[-1].end_offset if self._batches else self._log_start

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def latest_snapshot_id(self) -> SnapshotId | None:
        return max(self._snapshots, default=None)

    @property
    def last_fetched_epoch(self) -> int:
        if self._batches:
            return self._batches[-1].epoch
        return self._base_epoch()

    def _base_epoch(self) -> int:
        if self._start_snapshot is not None:
            assert self._start_snapshot.end_offset == self._log_start
            return self._start_snapshot.epoch
        assert self._log_start == 0, "a log that does not start at 0 has a snapshot at its start"
        return 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        base = self._base_epoch()
        if epoch < base:
            return OffsetAndEpoch(UNKNOWN_EPOCH, UNKNOWN_OFFSET)
        found = base
        for e, start in self._epochs:
            if e > epoch:
                return OffsetAndEpoch(found, start)
            found = e
        return OffsetAndEpoch(found, self.log_end_offset)

    # --- appends and truncation --------------------------------------------

    def _append(self, batch: MemoryBatch) -> AppendInfo:
        assert batch.base_offset == self.log_end_offset, (batch.base_offset, self.log_end_offset)
        assert batch.epoch >= self.last_fetched_epoch, "epochs never go backwards in a log"
        if not self._epochs or self._epochs[-1][0] != batch.epoch:
            self._epochs.append((batch.epoch, batch.base_offset))
        self._note_voters(batch)
        self._batches.append(batch)
        self._bases.append(batch.base_offset)
        return AppendInfo(batch.base_offset, batch.last_offset, len(batch.raw))

    def append_as_leader(self, records: Sequence[bytes], epoch: int) -> AppendInfo:
        return self._append(encode_batch(self.log_end_offset, epoch, records, control=False))

    def append_leader_change(
        self, epoch: int, leader_id: int, voters: Sequence[int], granting_voters: Sequence[int]
    ) -> AppendInfo:
        value = f"LeaderChange leader={leader_id} voters={sorted(voters)} granting={sorted(granting_voters)}"
        return self._append(encode_batch(self.log_end_offset, epoch, [value.encode()], control=True))

    def append_voters(self, epoch: int, voters: frozenset[int]) -> AppendInfo:
        """A voters record; each voter with the directory id this log knows
        for it (`remember_voter`, or the records it holds)."""
        infos = [self._known_voters.get(v, VoterInfo(v)) for v in sorted(voters)]
        return self._append(encode_batch(self.log_end_offset, epoch, [encode_voters(infos)], control=True))

    def remember_voter(self, info: VoterInfo) -> None:
        """The directory id of a voter about to be added (as `StorageReplicatedLog`)."""
        self._known_voters[info.node_id] = info

    def known_voter(self, node_id: int) -> VoterInfo | None:
        return self._known_voters.get(node_id)

    def _forget_voters_cache(self) -> None:
        self._voter_records_cache = None
        self._voter_sets_cache = None

    def _note_voters(self, batch: MemoryBatch) -> None:
        if batch.control:
            self._forget_voters_cache()
            for i, record in enumerate(batch.records):
                infos = decode_voter_infos(record)
                if infos is not None:
                    self._voter_sets.append((batch.base_offset + i, infos))
                    self._known_voters.update((v.node_id, v) for v in infos)

    def voter_records(self) -> tuple[tuple[int, tuple[VoterInfo, ...]], ...]:
        """(offset, voters with their directory ids) of each voters record in
        the log, oldest first, led by the snapshot's voter set (at offset log
        start - 1) if the log starts at a snapshot that holds one."""
        if self._voter_records_cache is None:
            base: list[tuple[int, tuple[VoterInfo, ...]]] = []
            if self._start_snapshot is not None:
                voters = self._snapshot_voters(self._snapshots[self._start_snapshot])
                if voters is not None:
                    base.append((self._log_start - 1, voters))
            self._voter_records_cache = tuple(base + self._voter_sets)
        return self._voter_records_cache

    def voter_sets(self) -> tuple[tuple[int, frozenset[int]], ...]:
        """As `voter_records`, the voters by id."""
        if self._voter_sets_cache is None:
            self._voter_sets_cache = tuple(
                (o, frozenset(v.node_id for v in infos)) for o, infos in self.voter_records())
        return self._voter_sets_cache

    def latest_voters(self) -> tuple[VoterInfo, ...] | None:
        """The voter set in force (the latest record's, committed or not);
        None when the log holds none and the static configured set applies."""
        records = self.voter_records()
        return records[-1][1] if records else None

    @staticmethod
    def _snapshot_voters(stored: bytes) -> tuple[VoterInfo, ...] | None:
        header, _, _ = stored.partition(b"\n")
        if not header.startswith(_SNAPSHOT_VOTERS) or header == _SNAPSHOT_VOTERS:
            return None
        return _parse_voter_list(header[len(_SNAPSHOT_VOTERS) :])

    def append_as_follower(self, batches: bytes) -> AppendInfo:
        decoded = decode_batches(batches)
        assert decoded, "append_as_follower needs at least one batch"
        size = 0
        for batch in decoded:
            size += self._append(batch).size_in_bytes
        return AppendInfo(decoded[0].base_offset, decoded[-1].last_offset, size)

    def truncate_to(self, offset: int) -> None:
        assert self._log_start <= offset <= self.log_end_offset, (offset, self._log_start, self.log_end_offset)
        # Drop the batch holding `offset` too, as Kafka's LogSegment.truncateTo does.
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or self._batches[i].end_offset <= offset:
            i += 1
        del self._batches[i:]
        del self._bases[i:]
        self._flushed = min(self._flushed, self.log_end_offset)
        self._rebuild_epochs()

    def _rebuild_epochs(self) -> None:
        self._epochs = []
        self._voter_sets = []
        self._forget_voters_cache()
        for batch in self._batches:
            self._note_voters(batch)
            if not self._epochs or self._epochs[-1][0] != batch.epoch:
                self._epochs.append((batch.epoch, batch.base_offset))

    # --- reads ---------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        assert self._log_start <= offset <= self.log_end_offset, (offset, self._log_start, self.log_end_offset)
        if offset == self.log_end_offset:
            return b""
        i = bisect.bisect_right(self._bases, offset) - 1  # the batch holding `offset`
        out: list[bytes] = []
        size = 0
        for batch in self._batches[i:]:
            if max_offset is not None and batch.end_offset > max_offset:
                break
            if out and size + len(batch.raw) > max_bytes:
                break
            out.append(batch.raw)
            size += len(batch.raw)
        return b"".join(out)

    def batches(self, start_offset: int = 0, end_offset: int | None = None) -> list[MemoryBatch]:
        """The batches holding offsets in [start_offset, end_offset): for tests
        and the simulated state machine."""
        end = self.log_end_offset if end_offset is None else end_offset
        return [b for b in self._batches if b.end_offset > start_offset and b.base_offset < end]

    # --- durability -----------------------------------------------------------

    def flush(self, offset: int) -> None:
        offset = min(offset, self.log_end_offset)
        i = bisect.bisect_right(self._bases, offset) - 1
        while i >= 0 and self._batches[i].end_offset > offset:
            i -= 1
        self._durable = list(self._batches[: i + 1])
        self._durable_start = self._log_start
        self._flushed = max(self._flushed, self._durable[-1].end_offset if self._durable else self._log_start)

    def crash(self, keep_unflushed_batches: int = 0) -> None:
        """Lose what was not flushed: reopen the durable image. Up to
        `keep_unflushed_batches` later batches survive if the live log still
        extends the durable image (a page cache wrote them back early)."""
        n = len(self._durable)
        kept = list(self._durable)
        extends = (
            self._durable_start == self._log_start
            and len(self._batches) >= n
            and all(a is b for a, b in zip(self._batches, self._durable, strict=False))
        )
        if extends and keep_unflushed_batches > 0:
            kept += self._batches[n : n + keep_unflushed_batches]
        self._batches = kept
        self._bases = [b.base_offset for b in kept]
        self._log_start = self._durable_start
        self._durable = list(kept)
        self._flushed = self.log_end_offset
        self._rebuild_epochs()

    # --- snapshots ------------------------------------------------------------

    def _epoch_of(self, offset: int) -> int:
        i = bisect.bisect_right(self._bases, offset) - 1
        assert i >= 0 and self._batches[i].base_offset <= offset <= self._batches[i].last_offset, offset
        return self._batches[i].epoch

    def create_snapshot(self, end_offset: int, data: bytes) -> SnapshotId:
        assert self._log_start <= end_offset <= self.log_end_offset, (end_offset, self._log_start)
        epoch = self._epoch_of(end_offset - 1) if end_offset > self._log_start else self._base_epoch()
        snapshot_id = SnapshotId(end_offset=end_offset, epoch=epoch)
        in_force = [v for o, v in self.voter_records() if o < end_offset]
        header = _SNAPSHOT_VOTERS + (_voter_list(in_force[-1]) if in_force else b"")
        self._snapshots[snapshot_id] = header + b"\n" + bytes(data)
        return snapshot_id

    def snapshot_size(self, snapshot_id: SnapshotId) -> int | None:
        data = self._snapshots.get(snapshot_id)
        return None if data is None else len(data)

    def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        return self._snapshots[snapshot_id][position : position + max_bytes]

    def snapshot_data(self, snapshot_id: SnapshotId) -> bytes:
        """The state machine's image, without the voter-set header."""
        return self._snapshots[snapshot_id].partition(b"\n")[2]

    def install_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        self._snapshots[snapshot_id] = bytes(data)
        self._known_voters.update((v.node_id, v) for v in self._snapshot_voters(bytes(data)) or ())
        self._batches = []
        self._bases = []
        self._epochs = []
        self._voter_sets = []
        self._forget_voters_cache()
        self._log_start = snapshot_id.end_offset
        self._start_snapshot = snapshot_id
        self._durable = []
        self._durable_start = self._log_start
        self._flushed = self._log_start

    @property
    def snapshot_ids(self) -> tuple[SnapshotId, ...]:
        return tuple(sorted(self._snapshots))

    def delete_snapshot(self, snapshot_id: SnapshotId) -> None:
        assert snapshot_id != self._start_snapshot, "the log starts at this snapshot"
        del self._snapshots[snapshot_id]

    def delete_before(self, snapshot: SnapshotId) -> None:
        assert snapshot in self._snapshots
        if snapshot.end_offset <= self._log_start:
            return
        assert snapshot.end_offset <= self.log_end_offset
        i = bisect.bisect_left(self._bases, snapshot.end_offset)
        assert i == len(self._bases) or self._bases[i] == snapshot.end_offset, "snapshots end on batch boundaries"
        del self._batches[:i]
        del self._bases[:i]
        self._log_start = snapshot.end_offset
        self._start_snapshot = snapshot
        self._durable = [b for b in self._durable if b.base_offset >= self._log_start]
        self._durable_start = self._log_start
        self._flushed = max(self._flushed, self._log_start)
        self._rebuild_epochs()
