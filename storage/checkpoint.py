"""Checkpoint files in Kafka's text format, written atomically.

Theory of operation
-------------------
Every checkpoint Kafka keeps is the same small text file:

    0                 version
    2                 number of entries
    my-topic 0 1234   one entry per line
    my-topic 1 99

Per log directory there are three with `topic partition offset` entries:
`replication-offset-checkpoint` (high watermarks),
`recovery-point-offset-checkpoint` and `log-start-offset-checkpoint`. Per
partition directory there is `leader-epoch-checkpoint` with `epoch
start_offset` entries.

A checkpoint is replaced, never edited: write `<name>.tmp`, fsync it,
rename it over `<name>`, fsync the directory. A crash at any point leaves
either the old file or the new one whole; a stray `.tmp` is harmless and
the log removes it on open.

Parsing is strict: a wrong version, a count that disagrees with the lines,
or a malformed line raises `CorruptCheckpointError`. The caller decides
what a lost checkpoint costs (the log falls back to a full recovery).
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from storage.errors import CorruptCheckpointError
from storage.fs import FileSystem

VERSION = 0
TMP_SUFFIX = ".tmp"

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

TopicPartition = tuple[str, int]


def format_checkpoint(entries: Iterable[tuple]) -> bytes:
    """The file text for `entries`, each a tuple of space-free fields."""
    lines = [" ".join(map(str, entry)) for entry in entries]
    text = "\n".join([str(VERSION), str(len(lines)), *lines]) + "\n"
    assert text.count("\n") == len(lines) + 2, "a checkpoint field holds a newline"
    return text.encode()


def parse_checkpoint(data: bytes, fields: int, what: str) -> list[list[str]]:
    """The entries of a checkpoint file, each split into `fields` strings."""
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"{what} is not UTF-8 text") from None
    if data and not data.endswith(b"\n"):
        # Every line ends in a newline: a file cut short by a crash (a write
        # that was not fsynced) must not parse as a shorter, wrong number.
        raise CorruptCheckpointError(f"{what} ends mid-line: a write was cut short")
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise CorruptCheckpointError(
            f"{what} does not start with the version line {VERSION!r}: "
            f"got {lines[0][:40] if lines else ''!r}"
        )
    try:
        count = int(lines[1])
    except ValueError:
        raise CorruptCheckpointError(f"{what}: the count line {lines[1][:40]!r} is not a number") from None
    body = [line for line in lines[2:] if line.strip()]
    if count != len(body):
        raise CorruptCheckpointError(f"{what} says {count} entries but has {len(body)}")
    entries = []
    for line in body:
        parts = line.split()
        if len(parts) != fields:
            raise CorruptCheckpointError(f"{what}: malformed line {line[:80]!r}, expected {fields} fields")
        entries.append(parts)
    return entries


def write_atomically(fs: FileSystem, path: str, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync dir.

    With durable=False nothing is fsynced: a reader sees the old or the new
    file, but a crash may leave neither or a short one (for files that are
    rewritten when found missing or malformed)."""
    tmp = path + TMP_SUFFIX
    if fs.exists(tmp):
        fs.remove(tmp)
    f = fs.open(tmp)
    try:
        if f.size:
            # Only a leftover needs it: a broker creating 100,000
            # partitions writes one of these per partition, and a system
            # call less each is seconds less.
            f.truncate(0)
        f.pwrite(data, 0)
        if durable:
            f.fsync()
    finally:
        f.close()
    fs.rename(tmp, path)
    if durable:
        fs.fsync_dir(os.path.dirname(path) or ".")


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CorruptCheckpointError(f"{what}: {text!r} is not an integer") from None


class OffsetCheckpointFile:
    """A per-log-directory `topic partition offset` checkpoint."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.fs = fs
        self.path = path

    def read(self) -> dict[TopicPartition, int]:
        """The entries; empty if the file does not exist."""
        if not self.fs.exists(self.path):
            return {}
        out: dict[TopicPartition, int] = {}
        for topic, partition, offset in parse_checkpoint(self.fs.read_file(self.path), 3, self.path):
            out[(topic, _parse_int(partition, self.path))] = _parse_int(offset, self.path)
        return out

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the whole file with `offsets`."""
        for topic in {topic for topic, _partition in offsets}:  # a few topics, thousands of partitions
            assert topic and not any(c.isspace() for c in topic), f"bad topic name {topic!r}"
        entries = sorted((t, p, o) for (t, p), o in offsets.items())
        write_atomically(self.fs, self.path, format_checkpoint(entries))

    def update(self, changes: Mapping[TopicPartition, int], removed: Iterable[TopicPartition] = ()) -> None:
        """Merge `changes` into the file and drop the entries of `removed`
        (a corrupt file is replaced). Nothing is written if nothing changes."""
        try:
            current = self.read()
        except CorruptCheckpointError:
            current = {}
        gone = [tp for tp in removed if tp in current and tp not in changes]
        if not gone and all(current.get(tp) == off for tp, off in changes.items()):
            return
        for tp in gone:
            del current[tp]
        current.update(changes)
        self.write(current)


class LeaderEpochCheckpointFile:
    """A partition's `leader-epoch-checkpoint`: `epoch start_offset` lines."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.fs = fs
        self.path = path

    def read(self, listed: bool = False) -> list[tuple[int, int]]:
        """The entries; empty if the file does not exist. `listed`: the
        caller saw the file in its directory's listing (no look again)."""
        if not listed and not self.fs.exists(self.path):
            return []
        return [
            (_parse_int(e, self.path), _parse_int(o, self.path))
            for e, o in parse_checkpoint(self.fs.read_file(self.path), 2, self.path)
        ]

    def write(self, entries: Iterable[tuple[int, int]], durable: bool = True) -> None:
        write_atomically(self.fs, self.path, format_checkpoint(entries), durable=durable)
