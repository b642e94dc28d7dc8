"""The leader epoch cache: which offset each leader epoch started at.

Theory of operation
-------------------
Each entry `(epoch, start_offset)` says that the first batch written in
`epoch` has base offset `start_offset`. Entries increase in both fields.
The log assigns an entry when it appends a batch whose partition leader
epoch is higher than the latest one (KIP-101), so a replica can answer
OffsetsForLeaderEpoch, and a follower can find where its log diverged
from the leader's instead of truncating to the high watermark (KIP-101,
refined by KIP-279 to return the epoch the answer belongs to). KRaft voters
answer the same question for the metadata log (KIP-595 DivergingEpoch).

`end_offset_for_epoch(requested, log_end_offset)`, as Kafka answers it:

| case                                  | answer                               |
|---------------------------------------|--------------------------------------|
| requested is UNDEFINED (-1)           | (-1, -1)                             |
| requested is the latest epoch         | (requested, log_end_offset)          |
| requested above the latest, or empty  | (-1, -1)                             |
| requested below the first entry       | (requested, first entry's start)     |
| otherwise                             | (largest epoch <= requested, start   |
|                                       |  of the first epoch > requested)     |

The row "below the first entry" is not UNDEFINED on purpose: the history
was removed with old segments, and the first known start offset is where
a follower can safely replicate from.

The cache shrinks from the end when the log is truncated (entries starting
at or past the new end go) and from the start when the log start offset
moves (entries wholly before it go; the last of them is kept, moved up to
start at the new log start offset). Truncations are written to the
`leader-epoch-checkpoint` and fsynced before they return: a stale entry
for an epoch above the log's would survive recovery and make a follower
truncate wrongly. A new epoch (`assign`) is only kept in memory until
`flush`, which `Log.flush` calls before the recovery point moves past it
and `Log.close` calls at a clean shutdown (Kafka since KAFKA-15046 writes
it without fsync; we defer the write too). A crash can lose it only with
the batches of that epoch past the recovery point, and recovery assigns it
again from those batches; an epoch with no batch yet needs no entry after
a restart, since the restarted replica no longer leads in it. A leader
change of thousands of partitions thus costs no file write each (the
write, open + write + rename, was 1-2 ms under load, paid once on the new
leader and once on each follower's first batch of the epoch).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from typing import Protocol

logger = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class _Checkpoint(Protocol):
    def write(self, entries: list[tuple[int, int]], durable: bool = True) -> None: ...


class LeaderEpochCache:
    """Epoch -> start offset entries of one log, persisted at each truncation and `flush`."""

    def __init__(self, entries=(), checkpoint: _Checkpoint | None = None) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._checkpoint = checkpoint
        #: Entries that differ from the file's: an entry `assign`ed, or a
        #: truncation not written, since the last write.
        self._unwritten = False
        # The latest epoch, or UNDEFINED_EPOCH (-1) when empty: a plain
        # attribute, since every append reads it.
        self.latest_epoch = UNDEFINED_EPOCH
        for epoch, start_offset in entries:
            self._assign(epoch, start_offset)
        # What the file holds: the entries given (read from it, or written
        # by the caller), then each write's.
        self._on_file = self.entries
        #: The file holds entries at or past the log end offset that a
        #: `truncate_from_end(write=False)` dropped: the log must write the
        #: file (`write_stale`) before it appends, or a crash after the
        #: append would bring them back below the log end offset.
        self.stale_on_file = False

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts))

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset`.

        Entries that the new one contradicts (an epoch >= `epoch`, or a
        start offset >= `start_offset`) are dropped first: they belonged to
        a log suffix that was replaced.
        """
        if self._assign(epoch, start_offset):
            self._unwritten = True

    def _assign(self, epoch: int, start_offset: int) -> bool:
        assert epoch >= 0 and start_offset >= 0, f"invalid epoch entry ({epoch}, {start_offset})"
        if self._epochs and self._epochs[-1] == epoch and self._starts[-1] <= start_offset:
            return False
        removed = []
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            removed.append((self._epochs.pop(), self._starts.pop()))
        if len(removed) > 1 or (removed and removed[0][1] != start_offset):
            logger.warning(
                "leader epoch entry (%d, %d) replaced conflicting entries %s", epoch, start_offset, removed
            )
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self.latest_epoch = epoch
        return True

    def end_offset_for_epoch(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """`(epoch, end_offset)` for OffsetsForLeaderEpoch; see the table
        in the module docstring."""
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the batch at `offset` was written in, or -1."""
        i = bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int, durable: bool = True, write: bool = True) -> None:
        """Drop the entries that start at or after `end_offset`; with
        `durable=False` the file is rewritten but not fsynced, with
        `write=False` it is left as it is: the entries dropped stay on file,
        and every load drops them again, until the log appends past them
        (`write_stale`, called by the log at its first append) or the file
        is next written."""
        if self._starts and self._starts[-1] >= end_offset:
            while self._starts and self._starts[-1] >= end_offset:
                self._epochs.pop()
                self._starts.pop()
            if write:
                self._persist(durable=durable)
            else:
                self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
                self.stale_on_file = True

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop the entries that start at or before `start_offset`, keeping
        the last of them, moved to start at `start_offset`."""
        cut = bisect_right(self._starts, start_offset)
        if cut == 0 or (cut == 1 and self._starts[0] == start_offset):
            return
        epoch = self._epochs[cut - 1]
        del self._epochs[:cut]
        del self._starts[:cut]
        self._epochs.insert(0, epoch)
        self._starts.insert(0, start_offset)
        self._persist()

    def clear(self) -> None:
        if self._epochs or self.stale_on_file:
            self._epochs.clear()
            self._starts.clear()
            self._persist()

    def flush(self, log_end_offset: int | None = None) -> None:
        """Write and fsync the entries `assign` added (before the recovery point passes them).

        With the `log_end_offset` (a log closing), not when the entries
        that differ from the file's all start at or past it: the next load
        drops those (`truncate_from_end`) whatever the file says. A new
        leader's entry for an empty partition is one: a clean shutdown
        after 30,000 partitions were created wrote a file for each."""
        if not self._unwritten:
            return
        if log_end_offset is not None:
            below = [e for e in self.entries if e[1] < log_end_offset]
            if below == [e for e in self._on_file if e[1] < log_end_offset]:
                return
        self._persist()

    def write_stale(self) -> None:
        """Write the entries over the stale ones on file, durably (see
        `stale_on_file`). Not fsynced, a crash could undo the write while
        keeping the batches appended after it, unflushed as they are (a disk
        writes pages back in any order): the stale entries would then start
        below the recovered log end offset, and credit those batches to an
        epoch they were not written in. A log pays this once after a
        restart, at its first append, and only if the load cut an entry."""
        self._persist()

    def _persist(self, durable: bool = True) -> None:
        self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
        if self._checkpoint is not None:
            self._checkpoint.write(self.entries, durable=durable)
            self._on_file = self.entries
        self.stale_on_file = False
        if durable:  # an entry `assign`ed is owed an fsync before the recovery point passes it
            self._unwritten = False
