"""The first read of a segment trusted at start-up: how much of a range a
reader may be served. Split from `storage.log` by responsibility.

A segment loaded wholly below the recovery point keeps the byte ranges
whose records were not yet validated in `LogSegment.unchecked`
(`storage.segment`, `storage.recovery.load_trusted`). `Log.read` asks
`served_end` only for such a segment, once per segment it reads (never
per batch, and never for a segment this process wrote or recovered, whose
`unchecked` is empty): the good batches before a bad one are served, and
the read that starts at the bad one raises `CorruptRecordError` naming the
file, position, base offset and reason, so Fetch answers CORRUPT_MESSAGE
at it and not before.
"""

from __future__ import annotations

from storage.errors import StorageError
from storage.segment import LogSegment


def served_end(segment: LogSegment, start: int, end: int, served_before: bool) -> int:
    """The end of the bytes of `[start, end)` (batch boundaries) a reader
    gets: `end` if all are good, else the position of the first bad batch.
    Raises when the batch at `start` is bad, unless this read already
    served bytes of an earlier segment (`served_before`): those go out
    first, and `start` comes back (nothing more), so the next read, which
    starts there, raises."""
    try:
        return segment.check_range(start, end)
    except StorageError:
        if served_before:
            return start
        raise
