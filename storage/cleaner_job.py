"""One compaction pass over one log, in bounded steps.

Theory of operation
-------------------
A pass (Kafka's `Cleaner.doClean`) has two phases over a log whose
batches below `first_dirty` were cleaned before (the *clean* section) and
whose batches from there up to `end_offset` are the *dirty* section
(`end_offset` is at most the active segment's base offset: the active
segment is never touched):

1. **Map**: read the dirty section's records and note each key's newest
   offset in an `OffsetMap`. If the map fills up, stop at a batch
   boundary: the pass then covers the dirty section up to `map_end` only.
2. **Clean**: every segment with a base offset below `map_end` is
   rewritten through `storage.batch_filter` (newest record per key,
   tombstones until their delete horizon, offsets unchanged; batches at
   or past `map_end`, the tail of the last such segment, are copied as
   they are, as Kafka retains records past the map's latest offset), in groups
   of consecutive segments that together fit one segment (`segment.bytes`,
   32-bit relative offsets, index capacity); each group becomes one
   `.cleaned` segment swapped in by `storage.segment_swap`.

Before the first swap the log is flushed up to the end of the last
segment being cleaned and its recovery point checkpointed: the cleaned
segments then lie below the recovery point, where a gap between a
segment's last offset and the next segment's base (compaction leaves
those) is not taken for a lost tail by recovery.

`step(max_bytes, now_ms)` reads about `max_bytes` (and at least one batch)
and returns the bytes read plus written: the caller paces the pass with
them (`storage.throttler`). Between steps the log may take appends (to its
active segment: harmless), roll, lose old segments to retention, or be
truncated. Each step first checks that the log was not truncated since
the pass began and that the segments it works on are still the log's; if
not it raises `CleaningAborted` and the caller discards the pass. A pass
that completes moves the cleaner checkpoint to `map_end`.

Transactions: the pass ends at or below the partition's last stable
offset (the caller bounds it), so every transaction with data in it is
decided. Batches of an aborted transaction (found in the `.txnindex`es)
put no key in the map and are dropped. A transaction marker (COMMIT or
ABORT control batch) goes as Kafka's cleaner removes it, in three steps
over passes:

1. while a batch of its transaction is still met before it in a pass
   (committed data with live keys, or aborted data this pass removes),
   it stays as it is;
2. in a pass that meets none (every record of the transaction is gone),
   it gets a delete horizon, `now + delete.retention.ms` (KIP-534, as
   tombstones do), and its aborted transaction leaves the `.txnindex`
   (a read_committed consumer has no record of it left to drop);
3. in a pass after that horizon, it goes (an empty batch stays in its
   place if it is its producer's last batch, as for data).

So a consumer that read a transaction's records has `delete.retention.ms`
to reach its marker, and a producer state rebuilt from the log never
finds a transaction's records without their marker. The cleaned
segment's `.txnindex` holds the other entries of the segments it replaces.

Which batches must stay even when emptied: each idempotent producer's
newest batch (`retain_last_batches`, producer id -> last offset), from
the log's producer state when it has one, so that state can be rebuilt
from the log (see `storage.batch_filter`).

File access goes through the log's `storage.fs`; no clock is read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from storage.batch import HEADER_SIZE, iter_batch_headers, iter_records, parse_header
from storage.batch_filter import delete_horizon_ms, empty_batch, filter_batch, with_delete_horizon
from storage.cleaner_config import CompactionConfig
from storage.errors import StorageError
from storage.index import MAX_RELATIVE_OFFSET
from storage.offset_map import OffsetMap
from storage.segment import LogSegment
from storage.segment_swap import CleanedSegment, RetiredSegment, swap_in

if TYPE_CHECKING:
    from storage.log import Log

logger = logging.getLogger(__name__)

MAP, CLEAN, DONE = "map", "clean", "done"


class CleaningAborted(StorageError):
    """The log changed under a compaction pass (truncated, or segments
    deleted); the pass is discarded and a later one starts over."""


def read_batches(segment: LogSegment, position: int, max_bytes: int) -> list:
    """`(position, header, bytes)` of the whole batches in about
    `max_bytes` from `position` (at least one batch if there is one)."""
    f = segment.log
    size = f.size
    if position + HEADER_SIZE > size:
        return []
    first = parse_header(f.pread(HEADER_SIZE, position))
    want = min(max(max_bytes, first.size_in_bytes), size - position)
    chunk = f.pread(want, position)
    view = memoryview(chunk)
    return [
        (position + rel, header, view[rel : rel + header.size_in_bytes])
        for rel, header in iter_batch_headers(chunk)
    ]


class CleaningJob:
    """One pass over `log` (module doc). Build it, call `step` until
    `phase == DONE`; `map_end` is then the new cleaner checkpoint."""

    def __init__(
        self,
        log: Log,
        config: CompactionConfig,
        first_dirty: int,
        end_offset: int,
        offset_map_bytes: int,
        retain_last_batches: dict[int, int],
        file_delete_delay_ms: int,
    ) -> None:
        assert first_dirty <= end_offset <= log.active_segment.base_offset
        self.log = log
        self.config = config
        self.first_dirty = first_dirty
        self.end_offset = end_offset
        self.map_end = first_dirty
        self.offset_map = OffsetMap(offset_map_bytes)
        self.retain_last_batches = retain_last_batches
        self.file_delete_delay_ms = file_delete_delay_ms
        self.truncations = log.truncations
        self.phase = MAP
        self._segments = [s for s in log.segments[:-1] if s.base_offset < end_offset and s.next_offset > first_dirty]
        self._index = 0
        self._position: int | None = None
        self._groups: list[list[LogSegment]] = []
        self._cleaned: CleanedSegment | None = None
        self.retired: list[RetiredSegment] = []
        # The earliest delete horizon of the tombstones left in the cleaned
        # segments: when a pass will have tombstones to remove.
        self.delete_horizon_ms: int | None = None
        self.bytes_read = 0
        self.bytes_written = 0
        self.records_removed = 0
        # Aborted transactions with data below the pass's end (their
        # markers are below the LSO, which bounds `end_offset`): producer
        # id -> [(first offset, marker offset)], from the `.txnindex`es.
        self.aborted: dict[int, list[tuple[int, int]]] = {}
        for txn in log.collect_aborted_txns(log.log_start_offset, end_offset):
            self.aborted.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        # Producers with a transactional batch met since their last marker
        # in this pass (module doc: a marker goes only once none is).
        self._txn_data_met: set[int] = set()
        # Offsets of the markers met with no data of their transaction
        # left: their aborted transactions leave the `.txnindex`.
        self.dataless_markers: set[int] = set()
        self.markers_removed = 0

    def is_aborted(self, header) -> bool:
        """Whether `header`'s batch is data of an aborted transaction."""
        ranges = self.aborted.get(header.producer_id) if header.is_transactional else None
        if not ranges or header.is_control:
            return False
        base = header.base_offset
        return any(first <= base <= last for first, last in ranges)

    def __repr__(self) -> str:
        return (
            f"CleaningJob({self.log.dir_path!r}, {self.phase}, dirty [{self.first_dirty}, {self.end_offset}), "
            f"map_end={self.map_end})"
        )

    # --- driving ---

    def step(self, max_bytes: int, now_ms: int) -> int:
        """Do about `max_bytes` of work; return the bytes read + written."""
        self._check_log()
        before = self.bytes_read + self.bytes_written
        while self.phase != DONE and self.bytes_read + self.bytes_written - before < max_bytes:
            budget = max_bytes - (self.bytes_read + self.bytes_written - before)
            if self.phase == MAP:
                self._map_step(budget)
            else:
                self._clean_step(budget, now_ms)
        return self.bytes_read + self.bytes_written - before

    def abort(self) -> None:
        """Discard the pass: remove the `.cleaned` segment being written.
        Segments already swapped in stay: they are complete."""
        if self._cleaned is not None:
            self._cleaned.discard()
            self._cleaned = None
        self.phase = DONE

    def _check_log(self) -> None:
        log = self.log
        if log.truncations != self.truncations:
            raise CleaningAborted(f"{log.dir_path} was truncated during a compaction pass")
        current = {id(s) for s in log.segments[:-1]}
        pending = self._segments if self.phase == MAP else [s for g in self._groups for s in g]
        if any(id(s) not in current for s in pending):
            raise CleaningAborted(f"{log.dir_path} lost segments (retention) during a compaction pass")

    # --- phase 1: the offset map ---

    def _map_step(self, budget: int) -> None:
        if self._index >= len(self._segments):
            self._start_clean_phase()
            return
        segment = self._segments[self._index]
        if self._position is None:
            self._position = 0
            if segment.base_offset < self.first_dirty:
                found = segment.find_batch(self.first_dirty)
                self._position = segment.size if found is None else found[0]
        batches = read_batches(segment, self._position, budget)
        if not batches:
            self._index += 1
            self._position = None
            return
        offset_map, first_dirty = self.offset_map, self.first_dirty
        for position, header, data in batches:
            if header.last_offset >= self.end_offset or (offset_map.is_full and self.map_end > first_dirty):
                self._start_clean_phase()
                return
            # An aborted transaction's records shadow no key: they are
            # dropped below, and a committed value must outlive them.
            if not header.is_control and header.last_offset >= first_dirty and not self.is_aborted(header):
                for record in iter_records(data):
                    if record.key is not None and record.offset >= first_dirty:
                        offset_map.put(record.key, record.offset)
            self.map_end = max(self.map_end, header.next_offset)
            self.bytes_read += header.size_in_bytes
            self._position = position + header.size_in_bytes

    def _start_clean_phase(self) -> None:
        # With nothing dirty (a pass for tombstones whose delete horizon
        # passed) this is the clean section alone.
        segments = [s for s in self.log.segments[:-1] if s.base_offset < self.map_end]
        self._groups = group_segments(segments, self.log.config.segment_bytes, self.log.config.segment_index_bytes)
        self._index = 0
        self._position = 0
        self.phase = CLEAN if self._groups else DONE
        if self._groups:
            self._flush_below(self._groups[-1][-1])

    def _flush_below(self, last: LogSegment) -> None:
        """Make every batch up to the end of `last` durable and checkpoint
        the recovery point past it (see module doc)."""
        log = self.log
        segments = log.segments
        following = segments[next(i for i, s in enumerate(segments) if s is last) + 1]
        if log.recovery_point < following.base_offset:
            log.flush(following.base_offset)
            log.write_checkpoints()

    # --- phase 2: cleaning, group by group ---

    def _clean_step(self, budget: int, now_ms: int) -> None:
        group = self._groups[0]
        log = self.log
        if self._cleaned is None:
            self._cleaned = CleanedSegment(log.fs, log.dir_path, group[0].base_offset, log.config, now_ms)
            self._index = 0
            self._position = 0
        if self._index >= len(group):
            self._swap(group, now_ms)
            return
        batches = read_batches(group[self._index], self._position, budget)
        if not batches:
            self._index += 1
            self._position = 0
            return
        cleaned = self._cleaned
        offset_map = self.offset_map
        retain = self.retain_last_batches
        delete_retention_ms = self.config.delete_retention_ms
        map_end = self.map_end
        for position, header, data in batches:
            self.bytes_read += header.size_in_bytes
            if header.is_transactional and not header.is_control:
                self._txn_data_met.add(header.producer_id)
            if header.last_offset >= map_end:
                # Past what this pass mapped (a segment's tail beyond a full
                # map or the HW): kept as it is, as Kafka retains a record
                # past the map's latest offset. A tombstone there has not
                # met the older records of its key in a map yet; dropping
                # it when its horizon passed would bring them back.
                out, horizon = data, None
            elif header.is_control and header.is_transactional and header.producer_id >= 0:
                out, horizon = self._clean_marker(data, header, now_ms)
            elif self.is_aborted(header):
                # An aborted transaction's data goes (Kafka's cleaner does
                # the same); its marker and `.txnindex` entry stay.
                keep_if_empty = retain.get(header.producer_id) == header.last_offset
                self.records_removed += header.records_count
                out, horizon = (empty_batch(header) if keep_if_empty else None), None
            else:
                keep_if_empty = header.producer_id >= 0 and retain.get(header.producer_id) == header.last_offset
                result = filter_batch(data, header, offset_map, now_ms, delete_retention_ms, keep_if_empty)
                self.records_removed += result.records_removed
                out, horizon = result.batch, result.delete_horizon_ms
            if out is not None:
                max_timestamp = header.max_timestamp if out is data else parse_header(out).max_timestamp
                cleaned.append_batch(out, header.base_offset, header.next_offset, max_timestamp)
                self.bytes_written += len(out)
            if horizon is not None and (self.delete_horizon_ms is None or horizon < self.delete_horizon_ms):
                self.delete_horizon_ms = horizon
            self._position = position + header.size_in_bytes

    def _clean_marker(self, data, header, now_ms: int) -> tuple[object, int | None]:
        """A transaction marker's fate in this pass (module doc):
        `(batch or None, its delete horizon)`."""
        producer_id = header.producer_id
        if producer_id in self._txn_data_met:
            self._txn_data_met.discard(producer_id)
            return data, None
        self.dataless_markers.add(header.base_offset)
        horizon = delete_horizon_ms(header)
        if horizon is None:
            horizon = now_ms + self.config.delete_retention_ms
            return with_delete_horizon(data, header, horizon), horizon
        if now_ms < horizon:
            return data, horizon
        self.markers_removed += 1
        if self.retain_last_batches.get(producer_id) == header.last_offset:
            return empty_batch(header), None
        return None, None

    def _swap(self, group: list[LogSegment], now_ms: int) -> None:
        cleaned, self._cleaned = self._cleaned, None
        self._check_log()
        # The aborted transactions indexed in the group's segments belong
        # to the cleaned one, but those whose records are all gone.
        dataless = self.dataless_markers
        cleaned.txn_index.replace([e for s in group for e in s.txn_index.entries if e.last_offset not in dataless])
        before = sum(s.size for s in group)
        segment, retired = swap_in(self.log, group, cleaned, now_ms, self.file_delete_delay_ms)
        self.retired.extend(retired)
        logger.info(
            "%s: compacted %d segments from offset %d, %d bytes -> %d",
            self.log.dir_path,
            len(group),
            group[0].base_offset,
            before,
            segment.size,
        )
        del self._groups[0]
        if not self._groups:
            self.phase = DONE


def group_segments(segments: list[LogSegment], max_bytes: int, index_bytes: int) -> list[list[LogSegment]]:
    """Consecutive runs of `segments` that fit one segment: at most
    `max_bytes` (`segment.bytes`), offsets within 32 bits of the first base
    offset, and index entries within `segment.index.bytes` (Kafka's
    `groupSegmentsBySize`)."""
    max_entries = index_bytes // 12
    groups: list[list[LogSegment]] = []
    current: list[LogSegment] = []
    size = entries = 0
    for segment in segments:
        if current:
            last_offset = max(segment.next_offset - 1, segment.base_offset)
            if (
                size + segment.size > max_bytes
                or last_offset - current[0].base_offset > MAX_RELATIVE_OFFSET
                or entries + len(segment.offset_index) + 1 > max_entries
            ):
                groups.append(current)
                current, size, entries = [], 0, 0
        current.append(segment)
        size += segment.size
        entries += len(segment.offset_index) + 1
    if current:
        groups.append(current)
    return groups


class HorizonScan:
    """Reads the batch headers of a log's clean section for the earliest
    delete horizon of its tombstones (KIP-534): what a cleaner that just
    started must learn once per log, or tombstones whose horizon passed
    would wait for the next pass the dirty ratio triggers. Headers only:
    one 61-byte read per batch, no record decoded."""

    def __init__(self, log: Log, first_dirty: int) -> None:
        self.log = log
        self.truncations = log.truncations
        self._segments = [s for s in log.segments[:-1] if s.base_offset < first_dirty]
        self._index = 0
        self._position = 0
        self.phase = MAP
        self.delete_horizon_ms: int | None = None
        self.retired: list[RetiredSegment] = []

    def step(self, max_bytes: int, now_ms: int) -> int:
        if self.log.truncations != self.truncations:
            raise CleaningAborted(f"{self.log.dir_path} was truncated during a scan for tombstones")
        done = 0
        while done < max_bytes and self._index < len(self._segments):
            segment = self._segments[self._index]
            if self._position + HEADER_SIZE > segment.size:
                self._index += 1
                self._position = 0
                continue
            header = parse_header(segment.log.pread(HEADER_SIZE, self._position))
            horizon = delete_horizon_ms(header)
            if horizon is not None and (self.delete_horizon_ms is None or horizon < self.delete_horizon_ms):
                self.delete_horizon_ms = horizon
            self._position += header.size_in_bytes
            done += HEADER_SIZE
        if self._index >= len(self._segments):
            self.phase = DONE
        return done

    def abort(self) -> None:
        self.phase = DONE
