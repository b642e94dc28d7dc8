"""What a broker's log holds, offset by offset, for the invariant checks.

The shell updates a broker's `Mirror` after every append, truncation and
recovery of its real `storage.Log` (decoding the batches it actually wrote
or recovered), and the invariants compare mirrors instead of reading logs.
Each offset keeps (value, leader epoch) and a running hash of the prefix up
to it, so "do these two logs agree below offset n" costs O(1).
"""

from __future__ import annotations

from storage.batch import iter_batch_headers, iter_records
from storage.log import Log


def decode(buf) -> list[tuple[int, bytes, int]]:
    """(offset, value, leader epoch) of every record in the batches of `buf`."""
    out = []
    for position, header in iter_batch_headers(buf):
        for record in iter_records(buf, position):
            out.append((record.offset, record.value, header.partition_leader_epoch))
    return out


class Mirror:
    __slots__ = ("start", "values", "epochs", "hashes")

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.values: list[bytes] = []
        self.epochs: list[int] = []
        self.hashes: list[int] = []

    @classmethod
    def of_log(cls, log: Log) -> Mirror:
        mirror = cls(log.log_start_offset)
        if log.log_end_offset > log.log_start_offset:
            mirror.append(decode(log.read_bytes(log.log_start_offset, 1 << 30)))
        assert mirror.end == log.log_end_offset, (mirror.end, log)
        return mirror

    @property
    def end(self) -> int:
        return self.start + len(self.values)

    def append(self, records: list[tuple[int, bytes, int]]) -> None:
        h = self.hashes[-1] if self.hashes else self.start
        for offset, value, epoch in records:
            assert offset == self.end, f"record at {offset} appended at {self.end}"
            h = hash((h, value, epoch))
            self.values.append(value)
            self.epochs.append(epoch)
            self.hashes.append(h)

    def truncate(self, end: int) -> None:
        keep = max(end - self.start, 0)
        del self.values[keep:], self.epochs[keep:], self.hashes[keep:]

    def reset(self, start: int) -> None:
        self.start = start
        self.values, self.epochs, self.hashes = [], [], []

    def value_at(self, offset: int) -> bytes | None:
        i = offset - self.start
        return self.values[i] if 0 <= i < len(self.values) else None

    def prefix_hash(self, end: int) -> int:
        """Hash of everything below `end` (needs start == 0 to compare logs)."""
        assert self.start <= end <= self.end, (self.start, end, self.end)
        return self.hashes[end - self.start - 1] if end > self.start else self.start

    def first_difference(self, other: Mirror, end: int) -> int:
        """The first offset below `end` where the two differ (binary search on
        the prefix hashes), or `end`."""
        lo, hi = 0, end  # the prefixes of length lo agree; of length hi may not
        if self.prefix_hash(end) == other.prefix_hash(end):
            return end
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.prefix_hash(mid) == other.prefix_hash(mid):
                lo = mid
            else:
                hi = mid
        return lo
