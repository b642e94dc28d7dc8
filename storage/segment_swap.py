"""Replacing segments with a cleaned one, crash-safely (Kafka's swap).

Theory of operation
-------------------
The cleaner writes the compacted copy of a group of consecutive segments
to `<base>.log.cleaned` (with `.index.cleaned` and `.timeindex.cleaned`),
`<base>` being the group's first base offset. `swap_in` then:

1. fsyncs the `.cleaned` files (the `.txnindex` too, when the group
   indexes aborted transactions) and renames them to `.swap`, then
   fsyncs the directory. **This is the commit point**: a `.log.swap` is
   whole, and from here recovery finishes the swap instead of undoing it.
2. renames every file of the old segments to `<name>.deleted` and fsyncs
   the directory (so no old index can meet the new `.log` after a crash);
3. renames the `.swap` files to their final names, indexes first, and
   fsyncs the directory;
4. opens the new segment and puts it in the log's segment list in place
   of the old ones.

The `.deleted` files stay open for `file.delete.delay.ms`: a read handed
out before the swap (a file slice waiting for `sendfile`) still reads the
old bytes. `RetiredSegment.delete` closes and removes them later.

After a crash, `complete_swaps` (called by `storage.recovery` before it
loads segments) finishes every `<base>.log.swap` it finds: it deletes the
segments whose base offset lies in `[base, end)` of the swap (`end` is the
swap's next offset), gives the `.swap` files their final names, and
fsyncs the directory. Then recovery removes the leftovers as usual:
`.cleaned` (a clean that never reached its commit point: rolled back),
`.deleted`, and `.swap` indexes without a `.log.swap`.

An old segment of the group whose base offset lies past the swap's last
offset (its records were all compacted away) survives a crash between
steps 1 and 3: it still holds valid, merely uncompacted, batches at
offsets past the swap's, so the log stays consistent; the next clean
removes them. Kafka has the same rule.

Files go through `storage.fs` only.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from storage.config import LogConfig
from storage.errors import CorruptIndexError, CorruptRecordError
from storage.fs import FileSystem
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, segment_file_name
from storage.txn_index import TXN_INDEX_SUFFIX

if TYPE_CHECKING:
    from storage.log import Log

logger = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
# Indexes before the log: a `.log` under its final name is the last step.
# A `.txnindex` exists only where a segment holds ABORT markers.
_SUFFIXES_LOG_LAST = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)
_SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


class CleanedSegment(LogSegment):
    """A segment written under `<base>.<kind>.cleaned` names."""

    def __init__(self, fs: FileSystem, dir_path: str, base_offset: int, config: LogConfig, now_ms: int) -> None:
        for suffix in _SUFFIXES_LOG_LAST:
            stale = os.path.join(dir_path, segment_file_name(base_offset, suffix + CLEANED_SUFFIX))
            if fs.exists(stale):
                fs.remove(stale)
        super().__init__(fs, dir_path, base_offset, config, now_ms)

    def path(self, suffix: str) -> str:
        return super().path(suffix) + CLEANED_SUFFIX

    def append_batch(self, data, base_offset: int, next_offset: int, max_timestamp: int) -> None:
        assert base_offset >= self.next_offset, f"cleaned batches go backwards at offset {base_offset}"
        position = self.log.append(data)
        self.record_batch(position, base_offset, next_offset, max_timestamp)

    def discard(self) -> None:
        """Abandon the clean: close and remove the `.cleaned` files."""
        self.delete()


class RetiredSegment:
    """An old segment renamed `.deleted`, still open for pending reads."""

    def __init__(self, segment: LogSegment, paths: list[str], due_ms: int) -> None:
        self.segment = segment
        self.paths = paths
        self.due_ms = due_ms

    def delete(self) -> None:
        self.segment.close()
        fs = self.segment.fs
        for path in self.paths:
            if fs.exists(path):
                fs.remove(path)


def _name(dir_path: str, base: int, suffix: str) -> str:
    return os.path.join(dir_path, segment_file_name(base, suffix))


def swap_in(log: Log, old: list[LogSegment], cleaned: CleanedSegment, now_ms: int, delete_delay_ms: int):
    """Replace the consecutive segments `old` of `log` with `cleaned` (see
    the module doc); return `(new_segment, [RetiredSegment])`."""
    fs, dir_path, base = log.fs, log.dir_path, cleaned.base_offset
    assert old and old[0].base_offset == base
    cleaned.finalize_time_index()
    cleaned.flush()
    cleaned.close()
    for suffix in _SUFFIXES_LOG_LAST:
        if suffix == TXN_INDEX_SUFFIX and not fs.exists(_name(dir_path, base, suffix + CLEANED_SUFFIX)):
            continue
        fs.rename(_name(dir_path, base, suffix + CLEANED_SUFFIX), _name(dir_path, base, suffix + SWAP_SUFFIX))
    fs.fsync_dir(dir_path)
    retired = []
    for segment in old:
        paths = []
        for suffix in _SEGMENT_SUFFIXES:
            path = segment.path(suffix)
            if fs.exists(path):
                fs.rename(path, path + DELETED_SUFFIX)
                paths.append(path + DELETED_SUFFIX)
                if suffix == LOG_SUFFIX and hasattr(segment.log, "moved_to"):
                    # A lazily opened file reopens by path: from now on the
                    # old name is the cleaned segment's.
                    segment.log.moved_to(path + DELETED_SUFFIX)
        retired.append(RetiredSegment(segment, paths, now_ms + delete_delay_ms))
    fs.fsync_dir(dir_path)
    for suffix in _SUFFIXES_LOG_LAST:
        if suffix == TXN_INDEX_SUFFIX and not fs.exists(_name(dir_path, base, suffix + SWAP_SUFFIX)):
            continue
        fs.rename(_name(dir_path, base, suffix + SWAP_SUFFIX), _name(dir_path, base, suffix))
    fs.fsync_dir(dir_path)
    segment = open_segment(fs, dir_path, base, log.config, now_ms)
    log.replace_segments(old, segment)
    return segment, retired


def open_segment(fs: FileSystem, dir_path: str, base: int, config: LogConfig, now_ms: int) -> LogSegment:
    """Open a segment whose files are whole and fsynced; rebuild its
    indexes if they do not fit (they should)."""
    # Imported here: storage.recovery calls complete_swaps from this module.
    from storage.recovery import load_trusted, recover_segment

    segment = LogSegment(fs, dir_path, base, config, now_ms)
    try:
        load_trusted(segment, config)
    except (CorruptIndexError, CorruptRecordError) as e:
        logger.warning("%s: rebuilding the indexes of a swapped-in segment: %s", segment.path(LOG_SUFFIX), e)
        recover_segment(segment, None)
        segment.flush()
    return segment


# --- recovery ---


class _SwapSegment(LogSegment):
    def path(self, suffix: str) -> str:
        return super().path(suffix) + SWAP_SUFFIX


def complete_swaps(fs: FileSystem, dir_path: str, config: LogConfig, listing: list[str] | None = None) -> int:
    """Finish the swaps a crash interrupted (module doc); return how many.
    `listing`: the directory's names, if the caller listed it already."""
    names = set(fs.listdir(dir_path) if listing is None else listing)
    swaps = sorted(int(n[:20]) for n in names if n[:20].isdigit() and n[20:] == LOG_SUFFIX + SWAP_SUFFIX)
    if not swaps:
        return 0
    bases = sorted(int(n[:20]) for n in names if n[:20].isdigit() and n[20:] == LOG_SUFFIX)
    for base in swaps:
        end = _swap_end(fs, dir_path, base, config)
        replaced = [b for b in bases if base <= b < max(end, base + 1)]
        logger.warning(
            "%s: finishing an interrupted swap of a cleaned segment (offsets %d..%d) over %d segments",
            _name(dir_path, base, LOG_SUFFIX + SWAP_SUFFIX),
            base,
            end,
            len(replaced),
        )
        for b in set(replaced) | {base}:
            for suffix in _SEGMENT_SUFFIXES:
                if fs.exists(_name(dir_path, b, suffix)):
                    fs.remove(_name(dir_path, b, suffix))
        for suffix in _SUFFIXES_LOG_LAST:
            swap = _name(dir_path, base, suffix + SWAP_SUFFIX)
            if fs.exists(swap):
                fs.rename(swap, _name(dir_path, base, suffix))
        bases = sorted((set(bases) - set(replaced)) | {base})
    fs.fsync_dir(dir_path)
    return len(swaps)


def _swap_end(fs: FileSystem, dir_path: str, base: int, config: LogConfig) -> int:
    """The next offset after the last batch of `<base>.log.swap`."""
    segment = _SwapSegment(fs, dir_path, base, config, 0)
    end = base
    try:
        for _position, header in segment.scan_headers(0):
            end = header.next_offset
    except CorruptRecordError as e:
        # The swap was fsynced before its rename: this is a damaged disk.
        # Recovery validates what it keeps of it.
        logger.error("%s: %s", segment.path(LOG_SUFFIX), e)
    finally:
        segment.close()
    return end
