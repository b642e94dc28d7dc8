"""One segment of a log: a `.log` file of batches and its two indexes.

Theory of operation
-------------------
A segment holds the batches from `base_offset` on, back to back, exactly as
they were appended; the file name is the base offset, 20 digits. The
segment keeps in memory what the log asks of it often: the next offset,
the largest batch max_timestamp (retention and ListOffsets use it), and
the sparse indexes (see `storage.index`), which reach the disk only in
`write_indexes` (flush, roll, close).

`record_batch` is the one rule that updates that state for a batch at a
position; recovering, truncating and the checked appends call it, and the
leader's fast path (`storage.log.Log.append`) runs the same
steps inline, so an index rebuilt on recovery equals the one built while
appending (a test holds them to it).

Finding the batch that holds an offset costs one index bisect and a scan
of batch headers from the floor entry: at most `index.interval.bytes` of
batches, read in small chunks that hold several headers. Readers mostly ask
for the start of one of the last few batches appended (a caught-up
follower's fetch offset, a consumer's HW bound), so the segment also keeps
the positions of its last `RECENT_BATCHES` batches by base offset
(`recent_batches`), and those lookups skip the scan.

Every batch appended by this process was validated, records included
(`storage.record_validation`), and so was every batch recovery read. A
segment loaded as trusted (wholly below the recovery point,
`storage.recovery.load_trusted`) was not: its bytes may come from an
older version or a disk fault that kept the CRC. Its byte ranges not yet
checked are in `unchecked` (one range, the whole file, after loading;
empty for every other segment, so the append path does no work for it).
A reader calls `check_range` for the bytes it is about to serve: the
first read of a range validates it once, from the page cache, with the
same walk as recovery, and the range leaves `unchecked`; later reads pay
one truthiness test. A batch that fails raises `CorruptRecordError`
naming the file, position, base offset and reason; the good batches
before it are checked and stay served.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from typing import Iterator

from storage.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    parse_header,
    validate_batch,
)
from storage.config import LogConfig
from storage.errors import CorruptRecordError, StorageError, UnsupportedCompressionError
from storage.fs import File, FileSystem
from storage.record_validation import check_stored_batch
from storage.txn_index import TXN_INDEX_SUFFIX, TxnIndex
from storage.index import (
    MAX_RELATIVE_OFFSET,
    NO_FILE,
    OFFSET_ENTRY_SIZE,
    ON_FILE,
    ON_FILE_DURABLE,
    TIME_ENTRY_SIZE,
    OffsetIndex,
    TimeIndex,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# Bytes read at once while walking batch headers: several small batches'
# headers per read, one big batch's header per read.
_SCAN_CHUNK = 4096
_NEVER = 1 << 63
# Bytes read at once while checking an unchecked range (`check_range`).
_CHECK_CHUNK = 1 << 20
_BATCH_LENGTH = struct.Struct(">i")
#: Batch starts kept by base offset (`LogSegment.recent_batches`): a
#: follower that keeps up asks for one of the last few.
RECENT_BATCHES = 8


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    """A `.log` file with its in-memory indexes (see module docstring)."""

    def __init__(
        self, fs: FileSystem, dir_path: str, base_offset: int, config: LogConfig, now_ms: int,
        *, listed: bool = False,
    ) -> None:
        self.fs = fs
        self.dir_path = dir_path
        self.base_offset = base_offset
        # Through the bounded cache of open files when the file system has
        # one (`storage.fs.OpenFileCache`): the descriptor comes and goes.
        # `listed`: the caller saw the file in a listing (opened at first use).
        open_segment = getattr(fs, "open_listed_segment" if listed else "open_segment", fs.open)
        self.log: File = open_segment(self.path(LOG_SUFFIX))
        self.index_interval_bytes = config.index_interval_bytes
        self.offset_index = OffsetIndex(base_offset, config.segment_index_bytes // OFFSET_ENTRY_SIZE)
        self.time_index = TimeIndex(base_offset, config.segment_index_bytes // TIME_ENTRY_SIZE)
        self.segment_ms = config.segment_ms
        self.segment_bytes = config.segment_bytes
        # Roll by time falls back to these when batches carry no timestamp.
        self.created_ms = now_ms
        self.last_append_ms = now_ms
        #: Aborted transactions whose ABORT marker is in this segment
        #: (`storage.txn_index`); its file is read on first use.
        self.txn_index = TxnIndex(fs, self.path(TXN_INDEX_SUFFIX))
        #: Byte ranges `[start, end)` whose batches' records were never
        #: validated, in order, each starting and ending on a batch boundary
        #: (see the module docstring); `load_trusted` sets it.
        self.unchecked: list[list[int]] = []
        self.reset_state()

    def without_index_files(self) -> None:
        """For a new segment of a new log: its index files are made with
        its first batch, not now (storage.index, NO_FILE)."""
        assert self.log.size == 0 and not len(self.offset_index) and not len(self.time_index)
        self.offset_index.on_file = self.time_index.on_file = NO_FILE

    def reset_state(self) -> None:
        """Forget everything learned from the batches (before a rebuild)."""
        self.offset_index.clear()
        self.time_index.clear()
        #: {base offset: position} of the last `RECENT_BATCHES` batches, oldest first.
        self.recent_batches: dict[int, int] = {}
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.last_index_position = 0
        self.index_full = False
        # The append path checks these precomputed bounds and calls
        # `should_roll` only when one is crossed.
        self.max_next_offset = self.base_offset + MAX_RELATIVE_OFFSET + 1
        self.set_first_batch_timestamp(None)

    @property
    def index_full(self) -> bool:
        """No room for another index entry: the next append rolls."""
        return self._index_full

    @index_full.setter
    def index_full(self, full: bool) -> None:
        self._index_full = full
        # The append path rolls past this size: segment.bytes, or at once
        # when the index is full.
        self.roll_bytes = -1 if full else self.segment_bytes

    def reconfigure(self, config: LogConfig) -> None:
        """Roll and index by changed configs (`Log.reconfigure`)."""
        self.index_interval_bytes = config.index_interval_bytes
        self.segment_ms = config.segment_ms
        self.segment_bytes = config.segment_bytes
        # The setters recompute the bounds the append path checks.
        self.last_index_position = self.last_index_position
        self.index_full = self.index_full
        self.set_first_batch_timestamp(self.first_batch_timestamp)

    def set_first_batch_timestamp(self, timestamp: int | None) -> None:
        self.first_batch_timestamp = timestamp
        self.roll_at_timestamp = _NEVER
        self.roll_at_ms = _NEVER
        if timestamp is not None:
            if timestamp >= 0:
                self.roll_at_timestamp = timestamp + self.segment_ms
            else:
                self.roll_at_ms = self.created_ms + self.segment_ms

    def path(self, suffix: str) -> str:
        return os.path.join(self.dir_path, segment_file_name(self.base_offset, suffix))

    @property
    def size(self) -> int:
        return self.log.size

    def __repr__(self) -> str:
        return f"LogSegment({self.path(LOG_SUFFIX)}, next_offset={self.next_offset}, size={self.size})"

    # --- state per batch ---

    @property
    def last_index_position(self) -> int:
        """The position of the last offset index entry (0: none yet)."""
        return self._last_index_position

    @last_index_position.setter
    def last_index_position(self, position: int) -> None:
        self._last_index_position = position
        # The first batch at or past this gets an index entry; position 0
        # never does (a lookup below the first entry starts there anyway).
        self.next_index_position = max(position + self.index_interval_bytes, 1)

    def record_batch(self, position: int, base_offset: int, next_offset: int, max_timestamp: int) -> None:
        """Account for the batch just written (or found) at `position`.
        On the append path: keep it lean."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset
        if position >= self.next_index_position:
            offset_index = self.offset_index
            offsets = offset_index.offsets
            offsets.append(base_offset)
            offset_index.positions.append(position)
            self._last_index_position = position
            self.next_index_position = position + self.index_interval_bytes
            if len(offsets) >= offset_index.max_entries:
                self.index_full = True
            time_index = self.time_index
            if self.max_timestamp > time_index.last_ts:
                timestamps = time_index.timestamps
                timestamps.append(self.max_timestamp)
                time_index.offsets.append(self.offset_of_max_timestamp)
                time_index.last_ts = self.max_timestamp
                if len(timestamps) >= time_index.max_entries:
                    self.index_full = True
        elif not position:
            self.set_first_batch_timestamp(max_timestamp)
        recent = self.recent_batches
        recent[base_offset] = position
        if len(recent) > RECENT_BATCHES:
            del recent[next(iter(recent))]
        self.next_offset = next_offset

    def should_roll(
        self, batch_bytes: int, max_timestamp: int, last_offset: int, now_ms: int, config: LogConfig
    ) -> str | None:
        """Why a batch of `batch_bytes` must go to a new segment, or None."""
        if last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
            return "offsets would overflow the index's 32-bit relative offsets"
        if self.log.size == 0:
            return None
        if self.log.size > config.segment_bytes - batch_bytes:
            return "segment.bytes reached"
        if self.offset_index.is_full() or self.time_index.is_full():
            return "segment.index.bytes reached"
        # Kafka compares record time with record time when the batches
        # carry timestamps, so replaying old data rolls by its own spans.
        first = self.first_batch_timestamp
        if first is not None and first >= 0:
            waited_ms = max_timestamp - first
        else:
            waited_ms = now_ms - self.created_ms
        if waited_ms > config.segment_ms:
            return "segment.ms reached"
        return None

    def largest_timestamp(self) -> int:
        """For retention by time: the newest batch max_timestamp, or the
        last append time when the batches carry none."""
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_append_ms

    # --- reading ---

    def scan_headers(self, position: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """`(position, header)` of each whole batch from `position` up to
        byte `end` (default: the end of the file)."""
        f = self.log
        if end is None:
            end = f.size
        while position + HEADER_SIZE <= end:
            chunk = f.pread(min(_SCAN_CHUNK, end - position), position)
            n = len(chunk)
            rel = 0
            while rel + HEADER_SIZE <= n:
                header = parse_header(chunk, rel)
                if header[3] != MAGIC or header[1] < MIN_BATCH_LENGTH:
                    raise CorruptRecordError(
                        f"{f.path}: no batch header at position {position + rel}", position + rel
                    )
                size = header[1] + LOG_OVERHEAD
                if position + rel + size > end:
                    return
                yield position + rel, header
                rel += size
            if rel == 0:
                return
            position += rel

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= `offset`, or None."""
        if offset >= self.next_offset:
            return None
        index = self.offset_index
        i = bisect_right(index.offsets, offset) - 1
        start = index.positions[i] if i >= 0 else 0
        if i >= 0 and index.offsets[i] == offset:
            # A sequential reader asks for a batch boundary, most often one
            # with an index entry: the batch there starts at `offset`.
            return start, parse_header(self.log.pread(HEADER_SIZE, start))
        recent = self.recent_batches.get(offset)
        if recent is not None:
            return recent, parse_header(self.log.pread(HEADER_SIZE, recent))
        for position, header in self.scan_headers(start):
            if header[0] + header[6] >= offset:
                return position, header
        return None

    def batch_end_at_or_before(self, start: int, limit: int) -> int:
        """The end of the last whole batch that starts at or after `start`
        and ends at or before byte `limit` (`start` if none fits)."""
        f = self.log
        limit = min(limit, f.size)
        positions = self.offset_index.positions
        i = bisect_right(positions, limit) - 1
        end = positions[i] if i >= 0 and positions[i] > start else start
        # First read only the framing of the batch there (often the last
        # one that fits); then chunks holding several small batches' headers.
        want = LOG_OVERHEAD
        while end + HEADER_SIZE <= limit:
            chunk = f.pread(min(want, limit - end), end)
            rel = 0
            while rel + LOG_OVERHEAD <= len(chunk):
                size = _BATCH_LENGTH.unpack_from(chunk, rel + 8)[0] + LOG_OVERHEAD
                if size < HEADER_SIZE:
                    raise CorruptRecordError(f"{f.path}: no batch header at position {end + rel}", end + rel)
                if end + rel + size > limit:
                    return end + rel
                rel += size
            if rel == 0:
                break
            end += rel
            want = _SCAN_CHUNK
        return end

    def check_range(self, start: int, end: int) -> int:
        """Validate the records of the unchecked batches in `[start, end)`
        (both batch boundaries) once; see the module docstring. Returns
        `end`, or the position of the first bad batch when the bytes from
        `start` to it are good; raises `CorruptRecordError` (or
        `UnsupportedCompressionError`) when the batch at `start` is bad."""
        for r in self.unchecked:
            low, high = max(start, r[0]), min(end, r[1])
            if low >= high:
                continue
            good, error = self._check_batches(low, high)
            # [low, good) is checked now: cut it out of the range.
            ranges = self.unchecked
            i = ranges.index(r)
            ranges[i : i + 1] = [x for x in ([r[0], low], [good, r[1]]) if x[0] < x[1]]
            if error is not None:
                if good > start:
                    return good
                raise error
            return self.check_range(high, end) if high < end else end
        return end

    def _check_batches(self, position: int, end: int) -> tuple[int, StorageError | None]:
        """Validate the batches from `position` to `end`: `(end, None)`, or
        `(position of the first bad batch, its error)`."""
        f = self.log
        buf, buf_start = b"", position
        while position < end:
            rel = position - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf, buf_start, rel = f.pread(min(_CHECK_CHUNK, end - position), position), position, 0
            size = _BATCH_LENGTH.unpack_from(buf, rel + 8)[0] + LOG_OVERHEAD if rel + 12 <= len(buf) else 0
            if rel + size > len(buf):
                buf, buf_start, rel = f.pread(min(size, end - position), position), position, 0
            try:
                header = validate_batch(buf, rel)
                check_stored_batch(buf, rel, header)
            except (CorruptRecordError, UnsupportedCompressionError) as exc:
                reason = str(exc).replace(f"position {rel}", f"position {position}", 1)
                if isinstance(exc, CorruptRecordError):
                    return position, CorruptRecordError(f"{f.path}: {reason}", position)
                return position, UnsupportedCompressionError(f"{f.path}: {reason}")
            position += header.size_in_bytes
        return end, None

    # --- changing ---

    def truncate_to(self, offset: int) -> int:
        """Remove the batches whose last offset is >= `offset` (the batch
        that holds `offset` goes too); return the bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        cut = found[0]
        removed = self.log.size - cut
        self.log.truncate(cut)
        if self.unchecked:
            self.unchecked = [[start, min(end, cut)] for start, end in self.unchecked if start < cut]
        self.txn_index.truncate_to(found[1].base_offset)
        self.recent_batches = {o: p for o, p in self.recent_batches.items() if p < cut}
        self.offset_index.truncate_to_position(cut)
        self.time_index.truncate_to_offset(found[1].base_offset)
        # Rebuild what was learned after the last surviving index point.
        index = self.offset_index
        self.last_index_position = index.positions[-1] if len(index) else 0
        self.max_timestamp = self.time_index.last_ts
        self.offset_of_max_timestamp = (
            self.time_index.offsets[-1] if len(self.time_index) else self.base_offset
        )
        self.next_offset = index.offsets[-1] if len(index) else self.base_offset
        self.index_full = index.is_full() or self.time_index.is_full()
        if cut == 0:
            self.set_first_batch_timestamp(None)
        for position, header in self.scan_headers(self.last_index_position, cut):
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.base_offset
            self.next_offset = header.next_offset
        return removed

    def finalize_time_index(self) -> None:
        """Make the last time index entry carry the segment's max timestamp
        (on roll and close), so retention after a restart reads it there."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    def write_indexes(self, fsync: bool = False) -> None:
        """Write the index entries not on file yet (fsync them if asked).

        The index files are open only while written: a broker with tens of
        thousands of partitions holds one descriptor per segment (`.log`),
        not three, against the process's open-files limit."""
        wanted = ON_FILE_DURABLE if fsync else ON_FILE
        for suffix, index, entry_size in ((INDEX_SUFFIX, self.offset_index, OFFSET_ENTRY_SIZE),
                                          (TIME_INDEX_SUFFIX, self.time_index, TIME_ENTRY_SIZE)):
            if len(index) == index.written and (index.on_file >= wanted
                                                or (index.on_file == NO_FILE and self.log.size == 0)):
                continue  # the file holds this index already (storage.index, NO_FILE)
            f = self.fs.open(self.path(suffix))
            try:
                _write_tail(f, index, entry_size)
                if fsync:
                    f.fsync()
                index.on_file = wanted
            finally:
                f.close()

    def flush(self) -> None:
        """Write the indexes and fsync the segment and both indexes."""
        self.log.fsync()
        self.write_indexes(fsync=True)
        self.txn_index.flush()

    def close(self) -> None:
        self.log.close()

    def delete(self) -> None:
        """Close and remove the files (the `.log` first: an index without
        its segment is removed on the next open)."""
        self.close()
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            if self.fs.exists(self.path(suffix)):
                self.fs.remove(self.path(suffix))
        self.txn_index.delete()


def _write_tail(f: File, index, entry_size: int) -> None:
    written_bytes = index.written * entry_size
    if f.size != written_bytes:
        f.truncate(written_bytes)
    if len(index) > index.written:
        f.pwrite(index.encode(index.written), written_bytes)
        index.written = len(index)
