"""Sparse offset and time indexes of a segment: pure math and encodings.

Theory of operation
-------------------
A segment's `.index` maps offsets to byte positions, sparsely: the log adds
one entry when at least `index.interval.bytes` were appended since the last
one (the first batch of a segment needs none: position 0). An entry is the
base offset of a batch and the position its header starts at, so a lookup
of any offset returns the floor entry, a batch boundary at or before the
batch that holds it, and the reader scans batch headers forward from there.

A `.timeindex` entry is `(max_timestamp_so_far, offset)`: the largest batch
max_timestamp seen up to an index point, and the base offset of the batch
that had it. Timestamps in a log need not be ordered (CreateTime is the
producer's clock); the running max is, so the time index is sorted. It is
added next to an offset entry, when the running max grew (Kafka's rule).

On disk both are arrays of big-endian entries, offsets stored relative to
the segment's base offset (Kafka's layout):

    .index      int32 relative_offset, int32 position       8 bytes
    .timeindex  int64 timestamp,       int32 relative_offset 12 bytes

In memory they are `array`s searched with `bisect` (C speed, 8 bytes per
value), of unsigned 64-bit items: every offset, position and indexed
timestamp is >= 0 (a time index entry needs a timestamp above the -1 of
"none"), and CPython converts an int to an unsigned array item without
the format parsing a signed one goes through, which the append path
pays per index entry. The log writes them lazily, at flush, roll and close: a lost or
torn index is rebuilt from the segment on recovery, so an index write is
never on the append path. `parse_*` checks what it reads (sizes, order,
bounds) and raises `CorruptIndexError`; the caller rebuilds.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from typing import NamedTuple

from storage.errors import CorruptIndexError

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
MAX_RELATIVE_OFFSET = (1 << 31) - 1
# Unsigned, 8 bytes (module doc): C `unsigned long` where it is 8 bytes,
# the fastest to append to, else `unsigned long long`.
UINT64 = "L" if array("L").itemsize == 8 else "Q"

# What an index's file is known to hold (`on_file`): no file, for a new
# segment still empty (an empty segment's missing index reads as empty, so
# the files of a partition never written are never made); nothing known
# (write it before trusting it); exactly its first `written` entries; or
# those and fsynced. An index read from its file starts durable: what a read returns
# is what the file holds (a crash of the machine before the kernel wrote
# pages another process left dirty loses them, and recovery rebuilds an
# index past the recovery point anyway). Closing a log skips the files of
# an index with nothing new: a clean shutdown of 30,000 untouched
# partitions spent 17 s opening index files to write nothing.
NO_FILE, NOT_ON_FILE, ON_FILE, ON_FILE_DURABLE = -1, 0, 1, 2


def floor_index(keys, target) -> int:
    """Index of the last key <= target in sorted `keys`, or -1."""
    return bisect_right(keys, target) - 1


def strict_floor_index(keys, target) -> int:
    """Index of the last key < target in sorted `keys`, or -1."""
    return bisect_left(keys, target) - 1


class IndexEntry(NamedTuple):
    offset: int
    position: int


class TimeIndexEntry(NamedTuple):
    timestamp: int
    offset: int


class OffsetIndex:
    """The `.index` of one segment, in memory. Entries are strictly
    increasing in both offset and position."""

    __slots__ = ("base_offset", "max_entries", "offsets", "on_file", "positions", "written")

    def __init__(self, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self.clear()

    def clear(self) -> None:
        self.offsets = array(UINT64)
        self.positions = array(UINT64)
        # How many leading entries the index file holds already.
        self.written = 0
        self.on_file = NOT_ON_FILE

    def __len__(self) -> int:
        return len(self.offsets)

    def is_full(self) -> bool:
        return len(self.offsets) >= self.max_entries

    def append(self, offset: int, position: int) -> None:
        assert not self.offsets or (offset > self.offsets[-1] and position > self.positions[-1]), (
            f"index entries must increase: ({offset}, {position}) after "
            f"({self.offsets[-1]}, {self.positions[-1]})"
        )
        self.offsets.append(offset)
        self.positions.append(position)

    def lookup(self, offset: int) -> IndexEntry:
        """The floor entry for `offset`; `(base_offset, 0)` below the first."""
        i = floor_index(self.offsets, offset)
        if i < 0:
            return IndexEntry(self.base_offset, 0)
        return IndexEntry(self.offsets[i], self.positions[i])

    def lookup_position(self, position: int) -> IndexEntry:
        """The last entry at or before byte `position`."""
        i = floor_index(self.positions, position)
        if i < 0:
            return IndexEntry(self.base_offset, 0)
        return IndexEntry(self.offsets[i], self.positions[i])

    def truncate_to_position(self, position: int) -> None:
        """Drop the entries at or past byte `position` (a cut segment)."""
        keep = bisect_left(self.positions, position)
        del self.offsets[keep:]
        del self.positions[keep:]
        if keep < self.written:
            self.written, self.on_file = keep, NOT_ON_FILE

    def encode(self, start: int = 0) -> bytes:
        """Entries `start..` in the file layout."""
        base = self.base_offset
        out = bytearray(OFFSET_ENTRY_SIZE * (len(self.offsets) - start))
        pack_into = _OFFSET_ENTRY.pack_into
        for k, i in enumerate(range(start, len(self.offsets))):
            pack_into(out, k * OFFSET_ENTRY_SIZE, self.offsets[i] - base, self.positions[i])
        return bytes(out)


class TimeIndex:
    """The `.timeindex` of one segment, in memory. Timestamps and offsets
    never decrease; timestamps strictly increase between entries."""

    __slots__ = ("base_offset", "max_entries", "timestamps", "offsets", "on_file", "written", "last_ts")

    def __init__(self, base_offset: int, max_entries: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max_entries
        self.clear()

    def clear(self) -> None:
        self.timestamps = array(UINT64)
        self.offsets = array(UINT64)
        self.written = 0
        self.on_file = NOT_ON_FILE
        # The last entry's timestamp (-1 when empty), kept for the append path.
        self.last_ts = -1

    def __len__(self) -> int:
        return len(self.timestamps)

    def is_full(self) -> bool:
        return len(self.timestamps) >= self.max_entries

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add `(timestamp, offset)` if `timestamp` is a new maximum."""
        if timestamp > self.last_ts:
            assert not self.offsets or offset >= self.offsets[-1]
            self.timestamps.append(timestamp)
            self.offsets.append(offset)
            self.last_ts = timestamp

    def lookup_before(self, timestamp: int) -> TimeIndexEntry:
        """The last entry whose timestamp is < `timestamp`, or
        `(-1, base_offset)`.

        Every batch up to that entry's index point has max_timestamp below
        the target, so a search for the first record at or after
        `timestamp` may start there. Kafka takes the last entry <= target,
        which can skip an earlier record with exactly the target time; the
        strict bound cannot.
        """
        i = strict_floor_index(self.timestamps, timestamp)
        if i < 0:
            return TimeIndexEntry(-1, self.base_offset)
        return TimeIndexEntry(self.timestamps[i], self.offsets[i])

    def truncate_to_offset(self, offset: int) -> None:
        """Drop the entries for offsets >= `offset`."""
        keep = bisect_left(self.offsets, offset)
        del self.timestamps[keep:]
        del self.offsets[keep:]
        if keep < self.written:
            self.written, self.on_file = keep, NOT_ON_FILE
        self.last_ts = self.timestamps[-1] if self.timestamps else -1

    def encode(self, start: int = 0) -> bytes:
        base = self.base_offset
        out = bytearray(TIME_ENTRY_SIZE * (len(self.timestamps) - start))
        pack_into = _TIME_ENTRY.pack_into
        for k, i in enumerate(range(start, len(self.timestamps))):
            pack_into(out, k * TIME_ENTRY_SIZE, self.timestamps[i], self.offsets[i] - base)
        return bytes(out)


_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


def parse_offset_index(
    data: bytes, base_offset: int, max_entries: int, segment_size: int
) -> OffsetIndex:
    """Read an `.index` file's bytes; raise `CorruptIndexError` if they
    cannot be an index of a segment of `segment_size` bytes."""
    if len(data) % OFFSET_ENTRY_SIZE:
        raise CorruptIndexError(
            f"index is {len(data)} bytes, not a multiple of {OFFSET_ENTRY_SIZE}"
        )
    index = OffsetIndex(base_offset, max(max_entries, len(data) // OFFSET_ENTRY_SIZE))
    last_rel, last_pos = -1, -1
    for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
        if rel <= last_rel or pos <= last_pos or rel < 0 or pos >= segment_size:
            raise CorruptIndexError(
                f"index entry ({rel}, {pos}) after ({last_rel}, {last_pos}) in a segment of "
                f"{segment_size} bytes: entries must increase and point inside the segment"
            )
        index.offsets.append(base_offset + rel)
        index.positions.append(pos)
        last_rel, last_pos = rel, pos
    index.written = len(index.offsets)
    index.on_file = ON_FILE_DURABLE
    return index


def parse_time_index(data: bytes, base_offset: int, max_entries: int) -> TimeIndex:
    """Read a `.timeindex` file's bytes; raise `CorruptIndexError` if the
    entries are not in order."""
    if len(data) % TIME_ENTRY_SIZE:
        raise CorruptIndexError(
            f"time index is {len(data)} bytes, not a multiple of {TIME_ENTRY_SIZE}"
        )
    index = TimeIndex(base_offset, max(max_entries, len(data) // TIME_ENTRY_SIZE))
    last_ts, last_rel = None, 0
    for ts, rel in _TIME_ENTRY.iter_unpack(data):
        if rel < last_rel or ts < 0 or (last_ts is not None and ts <= last_ts):
            raise CorruptIndexError(
                f"time index entry ({ts}, {rel}) after ({last_ts}, {last_rel}): "
                "timestamps must be >= 0 and increase, offsets must not decrease"
            )
        index.timestamps.append(ts)
        index.offsets.append(base_offset + rel)
        last_ts, last_rel = ts, rel
    index.written = len(index.timestamps)
    index.on_file = ON_FILE_DURABLE
    index.last_ts = index.timestamps[-1] if index.timestamps else -1
    return index
