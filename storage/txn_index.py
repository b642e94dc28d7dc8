"""A segment's aborted-transaction index (`.txnindex`, Kafka's TransactionIndex).

Theory of operation
-------------------
When an ABORT marker is written, the transaction it ends is recorded in
the index of the segment the marker lands in: producer id, the
transaction's first offset, its last offset (the marker's), and the last
stable offset just after it (the first offset of the earliest other open
transaction, or the marker's offset + 1). A read_committed fetch asks
every segment from the one holding its fetch offset onwards for the
aborted transactions overlapping [fetch offset, upper bound) (`collect`);
the consumer drops those producers' records from each transaction's first
offset until its marker. A transaction's marker is never below its data,
so the segments before the fetch offset's hold no entry that matters. The
search stops at the first entry whose last stable offset reaches the
upper bound: every transaction that began below the bound was over by
then, so later segments can only hold transactions that begin above it.

File format (Kafka's): 34-byte entries, big-endian, back to back:

    version            int16   0
    producer_id        int64
    first_offset       int64
    last_offset        int64
    last_stable_offset int64

The entries live in memory once read; the file is read on first use (a
segment without aborted transactions has no file) and each new entry is
written through at once (aborts are rare). `flush` fsyncs it with its
segment. A torn last entry (a crash mid-write) is dropped on reading;
the producer state's rebuild (`storage.producer_snapshot`) rewrites what
the log says past the snapshot it starts from.

Files go through `storage.fs`; no clock.
"""

from __future__ import annotations

import logging
import struct
from typing import NamedTuple

from storage.fs import FileSystem

logger = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 34
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entries(entries: list[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *e) for e in entries)


def decode_entries(data: bytes, what: str = ".txnindex") -> list[AbortedTxn]:
    """The whole entries of `data`; a torn tail or an unknown version ends
    the list (logged)."""
    out = []
    whole = len(data) - len(data) % ENTRY_SIZE
    if whole != len(data):
        logger.warning("%s: %d bytes of a torn last entry dropped", what, len(data) - whole)
    for pos in range(0, whole, ENTRY_SIZE):
        version, *fields = ENTRY.unpack_from(data, pos)
        if version != VERSION:
            logger.warning("%s: entry at byte %d has version %d; the index stops there", what, pos, version)
            break
        out.append(AbortedTxn(*fields))
    return out


class TxnIndex:
    """One segment's `.txnindex` (module doc)."""

    __slots__ = ("fs", "path", "_entries", "_dirty")

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self._entries: list[AbortedTxn] | None = None
        self._dirty = False

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            if self.fs.exists(self.path):
                self._entries = decode_entries(self.fs.read_file(self.path), self.path)
            else:
                self._entries = []
        return self._entries

    def append(self, entry: AbortedTxn) -> None:
        entries = self.entries
        if entries and entry.last_offset <= entries[-1].last_offset:
            # Replaying a marker already indexed (cannot happen after
            # `truncate_to`, which every replay starts with): keep one.
            return
        entries.append(entry)
        f = self.fs.open(self.path)
        try:
            position = (len(entries) - 1) * ENTRY_SIZE
            if f.size != position:
                f.truncate(position)
            f.pwrite(ENTRY.pack(VERSION, *entry), position)
        finally:
            f.close()
        self._dirty = True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of markers at or after `offset`."""
        entries = self.entries
        keep = [e for e in entries if e.last_offset < offset]
        if len(keep) == len(entries):
            return
        self._entries = keep
        f = self.fs.open(self.path)
        try:
            f.truncate(len(keep) * ENTRY_SIZE)
        finally:
            f.close()
        self._dirty = True

    def replace(self, entries: list[AbortedTxn]) -> None:
        """Make the index hold exactly `entries` (a cleaned segment)."""
        self._entries = list(entries)
        if not entries and not self.fs.exists(self.path):
            return
        f = self.fs.open(self.path)
        try:
            f.truncate(0)
            if entries:
                f.pwrite(encode_entries(entries), 0)
        finally:
            f.close()
        self._dirty = True

    def collect(self, fetch_offset: int, upper_bound: int, out: list[AbortedTxn]) -> bool:
        """Add to `out` the entries overlapping [fetch_offset, upper_bound);
        True once an entry shows no later segment can hold one (module doc)."""
        for e in self.entries:
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
                out.append(e)
            if e.last_stable_offset >= upper_bound:
                return True
        return False

    def flush(self) -> None:
        if self._dirty and self.fs.exists(self.path):
            f = self.fs.open(self.path)
            try:
                f.fsync()
            finally:
                f.close()
        self._dirty = False

    def delete(self) -> None:
        if self.fs.exists(self.path):
            self.fs.remove(self.path)
        self._entries = []
        self._dirty = False
