"""Loading a log directory after a clean stop or a crash.

Theory of operation
-------------------
The recovery point is the offset below which the log was fsynced (with its
indexes). On open, each segment is loaded one of two ways:

- **Trusted**: the segment lies wholly below the recovery point (the next
  segment starts at or below it; the last segment ends at or below it),
  its `.index` and `.timeindex` parse and fit the segment, and the batch
  headers after the last index entry chain exactly to the end of the
  file. This reads a few KB, not the segment; CRCs are not checked (as in
  Kafka: that data was fsynced, and consumers check CRCs themselves).
- **Recovered**: any other segment (past the recovery point, or whose
  indexes are missing or damaged, or whose tail does not chain) is read
  from its first byte. Each batch is validated (magic, length, CRC32C,
  offsets increasing, and its records: a CRC-valid batch whose records do
  not parse, `storage.record_validation.check_stored_batch`, is corruption
  like any other) and the indexes are rebuilt as appending would have
  built them. The segment is cut at the first batch that fails, and every
  later segment is deleted, as Kafka does: the data after a hole is not a
  log any more. A torn tail (a crash mid-append) is the common case. So is
  the hole Kafka does not look for: a recovered segment that ends before
  the next one begins lost its unsynced tail in a crash that kept the
  newer segment's data; the later segments are deleted too. (A follower
  may leave a legitimate gap between segments; past the recovery point it
  is unflushed data, which replication gives back.)

Every cut, deletion and rebuild is logged with the file and byte position.
Corruption never raises out of loading; an I/O error does.

Batches are not held to `max.message.bytes` here: they were accepted under
whatever limit was in force when they were written.

Files that are not segments are left alone, except the leftovers of an
interrupted operation: `*.tmp` (a checkpoint being written), `*.deleted`,
`*.cleaned`, `*.swap`, and index files whose segment is gone. Before
that, a compaction swap that reached its commit point (a `.log.swap`
file) is finished (`storage.segment_swap.complete_swaps`). Below the
recovery point a gap between a segment's end and the next segment's base
is normal (compaction removes records, keeping offsets), not a hole.
"""

from __future__ import annotations

import logging
import os

from storage.batch import HEADER_SIZE, LOG_OVERHEAD, MAGIC, MIN_BATCH_LENGTH, parse_header, validate_batch
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import CorruptIndexError, CorruptRecordError, UnsupportedCompressionError
from storage.fs import FileSystem
from storage.index import MAX_RELATIVE_OFFSET, NO_FILE, parse_offset_index, parse_time_index
from storage.record_validation import check_stored_batch
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment
from storage.segment_swap import complete_swaps
from storage.txn_index import TXN_INDEX_SUFFIX

logger = logging.getLogger(__name__)

_STRAY_SUFFIXES = (".tmp", ".deleted", ".cleaned", ".swap")
_RECOVERY_CHUNK = 1 << 20


def segment_base_offsets(fs: FileSystem, dir_path: str, listing: list[str] | None = None) -> list[int]:
    """Base offsets of the `.log` files in `dir_path`, sorted; strays
    removed. `listing`: the directory's names, if the caller listed it."""
    names = fs.listdir(dir_path) if listing is None else listing
    bases = set()
    for name in names:
        stem, suffix = os.path.splitext(name)
        if suffix == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
            bases.add(int(stem))
    for name in names:
        stem, suffix = os.path.splitext(name)
        orphan_index = (
            suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX) and stem.isdigit() and int(stem) not in bases
        )
        if orphan_index or name.endswith(_STRAY_SUFFIXES):
            logger.info("removing leftover file %s", os.path.join(dir_path, name))
            fs.remove(os.path.join(dir_path, name))
    return sorted(bases)


def load_trusted(segment: LogSegment, config: LogConfig, listed: set[str] | frozenset[str] | None = None) -> None:
    """Load a segment's indexes and check them against its tail; raise
    `CorruptIndexError` or `CorruptRecordError` when they do not fit.
    `listed`: the names in the segment's directory, if the caller listed it
    (no look for each index file then)."""
    fs = segment.fs
    size = segment.size
    paths = segment.path(INDEX_SUFFIX), segment.path(TIME_INDEX_SUFFIX)
    if listed is None:
        missing = [p for p in paths if not fs.exists(p)]
    else:
        missing = [p for p in paths if os.path.basename(p) not in listed]
    if missing and size == 0 and len(missing) == len(paths):
        # An empty segment's index files are made with its first batch
        # (storage.index, NO_FILE): nothing to load.
        segment.reset_state()
        segment.offset_index.on_file = segment.time_index.on_file = NO_FILE
        return
    for p in missing:
        raise CorruptIndexError(f"{p} is missing")
    max_entries = config.segment_index_bytes
    offset_index = parse_offset_index(fs.read_file(paths[0]), segment.base_offset, max_entries, size)
    time_index = parse_time_index(fs.read_file(paths[1]), segment.base_offset, max_entries)
    segment.reset_state()
    offset_index.max_entries = segment.offset_index.max_entries
    time_index.max_entries = segment.time_index.max_entries
    segment.offset_index, segment.time_index = offset_index, time_index
    start = offset_index.positions[-1] if len(offset_index) else 0
    segment.last_index_position = start
    segment.next_offset = offset_index.offsets[-1] if len(offset_index) else segment.base_offset
    if len(time_index):
        segment.max_timestamp = time_index.timestamps[-1]
        segment.offset_of_max_timestamp = time_index.offsets[-1]
    end = start
    for position, header in segment.scan_headers(start):
        if position == start and len(offset_index):
            if header.base_offset != segment.next_offset:
                raise CorruptIndexError(
                    f"last index entry says offset {segment.next_offset} is at position {start}, "
                    f"the batch there has base offset {header.base_offset}"
                )
        elif header.base_offset < segment.next_offset:
            raise CorruptRecordError(f"offsets go backwards at position {position}", position)
        if header.max_timestamp > segment.max_timestamp:
            segment.max_timestamp = header.max_timestamp
            segment.offset_of_max_timestamp = header.base_offset
        segment.next_offset = header.next_offset
        end = position + header.size_in_bytes
    segment.index_full = offset_index.is_full() or time_index.is_full()
    if end != size:
        raise CorruptRecordError(f"batches end at position {end}, the file at {size}", end)
    if len(time_index) and time_index.offsets[-1] >= max(segment.next_offset, segment.base_offset + 1):
        raise CorruptIndexError(f"time index points at offset {time_index.offsets[-1]}, past the segment")
    if size:
        segment.set_first_batch_timestamp(parse_header(segment.log.pread(HEADER_SIZE, 0)).max_timestamp)
        # Only the headers after the last index entry were read: the
        # records are checked when a reader first reaches them.
        segment.unchecked = [[0, size]]


def recover_segment(
    segment: LogSegment, epoch_cache: LeaderEpochCache | None, log_start_offset: int = 0
) -> int:
    """Read the whole segment, validate every batch, rebuild the indexes
    and cut the file at the first bad batch; return the bytes cut.

    Batches at or past `log_start_offset` with an epoch newer than the
    cache's latest are assigned in `epoch_cache` (a crash can land between
    an append and its checkpoint write); those below it are history the
    cache has let go of."""
    segment.reset_state()
    segment.unchecked = []  # every batch kept is validated below
    f = segment.log
    size = f.size
    position = 0
    buf, buf_start = b"", 0
    problem = None
    while position < size:
        rel = position - buf_start
        if rel + HEADER_SIZE > len(buf):
            buf, buf_start, rel = f.pread(max(_RECOVERY_CHUNK, HEADER_SIZE), position), position, 0
            if len(buf) < HEADER_SIZE:
                problem = f"torn tail: {size - position} bytes, less than a batch header"
                break
        magic, batch_length = buf[rel + 16], int.from_bytes(buf[rel + 8 : rel + 12], "big", signed=True)
        if magic != MAGIC or batch_length < MIN_BATCH_LENGTH:
            problem = f"no batch header (magic {magic}, batch_length {batch_length})"
            break
        batch_size = batch_length + LOG_OVERHEAD
        if position + batch_size > size:
            problem = f"torn tail: a {batch_size}-byte batch with only {size - position} bytes present"
            break
        if rel + batch_size > len(buf):
            buf, buf_start, rel = f.pread(max(_RECOVERY_CHUNK, batch_size), position), position, 0
        try:
            header = validate_batch(buf, rel)
            check_stored_batch(buf, rel, header)
        except (CorruptRecordError, UnsupportedCompressionError) as e:
            # An unknown codec id in a batch whose CRC holds: corrupt too.
            problem = str(e).replace(f"at position {rel}", "").strip()
            break
        if header.base_offset < segment.next_offset:
            problem = f"base offset {header.base_offset} below the expected {segment.next_offset}"
            break
        if header.last_offset - segment.base_offset > MAX_RELATIVE_OFFSET:
            problem = f"offset {header.last_offset} too far from the segment's base offset"
            break
        segment.record_batch(position, header.base_offset, header.next_offset, header.max_timestamp)
        epoch = header.partition_leader_epoch
        if epoch_cache is not None and epoch > epoch_cache.latest_epoch and header.last_offset >= log_start_offset:
            epoch_cache.assign(epoch, header.base_offset)
        position += batch_size
    if problem is None:
        return 0
    logger.warning(
        "%s: %s at position %d; truncating the segment to %d bytes (dropping %d)",
        f.path,
        problem,
        position,
        position,
        size - position,
    )
    f.truncate(position)
    return size - position


def load_segments(
    fs: FileSystem,
    dir_path: str,
    config: LogConfig,
    recovery_point: int,
    now_ms: int,
    epoch_cache: LeaderEpochCache | None,
    log_start_offset: int = 0,
    listing: list[str] | None = None,
) -> tuple[list[LogSegment], list[LogSegment]]:
    """Open every segment of `dir_path` (see module docstring); return
    `(segments, recovered)`: the log's segments in order, and those that
    were read in full and should be fsynced before the recovery point
    moves past them. `listing`: the directory's names, if the caller
    listed it."""
    # One listing for both, unless a swap was finished: a broker opening
    # 100,000 logs spent half its start-up listing each directory.
    if listing is None:
        listing = fs.listdir(dir_path)
    if complete_swaps(fs, dir_path, config, listing):
        listing = fs.listdir(dir_path)
    bases = segment_base_offsets(fs, dir_path, listing)
    # Valid for every segment loaded below: only later ones are ever deleted here.
    listed = frozenset(listing)
    segments: list[LogSegment] = []
    recovered: list[LogSegment] = []
    for i, base in enumerate(bases):
        segment = LogSegment(fs, dir_path, base, config, now_ms, listed=True)
        if segments and segments[-1].next_offset > base:
            logger.warning(
                "%s: the previous segment runs to offset %d, past this segment's base offset; "
                "deleting it and %d later segments",
                segment.path(LOG_SUFFIX),
                segments[-1].next_offset,
                len(bases) - i - 1,
            )
            _delete_from(fs, dir_path, bases[i:], config, now_ms, segment)
            break
        segments.append(segment)
        try:
            load_trusted(segment, config, listed)
            # A segment that lost its unsynced tail looks whole; only the
            # recovery point tells: the next segment must start at or
            # below it (the last one must end at or below it).
            last = i + 1 == len(bases)
            trusted = (segment.next_offset if last else bases[i + 1]) <= recovery_point
            reason = "it ends past the recovery point"
        except (CorruptIndexError, CorruptRecordError) as e:
            trusted = False
            reason = f"its index or tail is damaged ({e})"
        if trusted:
            continue
        if segment.size == 0:
            # An empty segment whose indexes were never written (a partition
            # created and never flushed): nothing to recover, not worth a line.
            logger.debug("%s: recovering, %s", segment.path(LOG_SUFFIX), reason)
        elif segment.base_offset < recovery_point:
            logger.warning("%s: rebuilding, %s", segment.path(LOG_SUFFIX), reason)
        else:
            logger.info("%s: recovering, %s", segment.path(LOG_SUFFIX), reason)
        cut = recover_segment(segment, epoch_cache, log_start_offset)
        recovered.append(segment)
        # Past the recovery point, a segment that ends before the next one
        # begins lost its unsynced tail while a newer segment kept its
        # data: what follows the hole is not part of the log any more.
        hole = i + 1 < len(bases) and segment.next_offset < bases[i + 1] and bases[i + 1] > recovery_point
        if (cut or hole) and i + 1 < len(bases):
            later = bases[i + 1 :]
            logger.warning(
                "%s %s; deleting the %d later segments from base offset %d on",
                segment.path(LOG_SUFFIX),
                "was cut" if cut else f"ends at offset {segment.next_offset}, before the next segment",
                len(later),
                later[0],
            )
            _delete_from(fs, dir_path, later, config, now_ms)
            break
    return segments, recovered


def _delete_from(fs, dir_path, bases, config, now_ms, first: LogSegment | None = None) -> None:
    for base in bases:
        segment = first if first is not None and first.base_offset == base else None
        if segment is None:
            segment = LogSegment(fs, dir_path, base, config, now_ms)
        segment.delete()
