"""Segment files opened lazily through a bounded cache (`log.max.open.files`):
a log whose file was closed for room reads and appends as before, a reader
of a closed-and-reopened file gets the same bytes, and a path that now names
another file is refused, never read."""

from __future__ import annotations

import os

import pytest

from storage.batch import build_batch
from storage.config import LogConfig
from storage.fs import OpenFileCache, OsFileSystem
from storage.log import Log


def batch(i: int) -> bytearray:
    return bytearray(build_batch([(b"k", b"value-%d" % i, (), 1_700_000_000_000 + i)]))


def open_logs(tmp_path, n: int, capacity: int) -> tuple[OpenFileCache, list[Log]]:
    cache = OpenFileCache(capacity)
    fs = OsFileSystem(segment_cache=cache)
    logs = [Log.open(str(tmp_path / f"t-{i}"), LogConfig(), now_ms=0, fs=fs) for i in range(n)]
    return cache, logs


def test_more_logs_than_open_files_append_and_read(tmp_path):
    cache, logs = open_logs(tmp_path, 50, capacity=8)
    for round_ in range(3):
        for i, log in enumerate(logs):
            log.append(batch(100 * round_ + i), now_ms=0)
        assert len(cache) <= 8
    assert cache.evictions > 0
    for i, log in enumerate(logs):
        data = log.read_bytes(0, 1 << 20)
        assert data.count(b"value-") == 3 and b"value-%d" % (200 + i) in data
    for log in logs:
        log.close()
    assert len(cache) == 0


def test_a_busy_file_keeps_its_descriptor(tmp_path):
    _cache, logs = open_logs(tmp_path, 20, capacity=4)
    busy = logs[0]
    for i in range(1, 20):
        busy.append(batch(i), now_ms=0)  # used between every other open
        logs[i].append(batch(i), now_ms=0)
    assert busy.active_segment.log.fd >= 0


def test_a_slice_of_an_evicted_file_reads_the_same_bytes(tmp_path):
    _cache, logs = open_logs(tmp_path, 10, capacity=2)
    logs[0].append(batch(7), now_ms=0)
    (piece,) = logs[0].read(0, 1 << 20)
    for log in logs[1:]:
        log.append(batch(1), now_ms=0)
    assert piece.file.fd < 0, "the first log's file was closed for room"
    assert os.pread(piece.file.fileno(), piece.size, piece.position) == bytes(logs[0].read_bytes(0, 1 << 20))


def test_a_path_that_names_another_file_is_refused(tmp_path):
    _cache, logs = open_logs(tmp_path, 3, capacity=2)
    logs[0].append(batch(1), now_ms=0)
    segment_file = logs[0].active_segment.log
    for log in logs[1:]:
        log.append(batch(2), now_ms=0)
    assert segment_file.fd < 0
    os.replace(segment_file.path, segment_file.path + ".old")
    with open(segment_file.path, "wb") as f:
        f.write(b"another file")
    with pytest.raises(FileNotFoundError):
        segment_file.pread(10, 0)


def test_a_closed_log_never_reopens_its_file(tmp_path):
    _cache, logs = open_logs(tmp_path, 1, capacity=4)
    logs[0].append(batch(1), now_ms=0)
    (piece,) = logs[0].read(0, 1 << 20)
    logs[0].close()
    with pytest.raises(ValueError):
        piece.file.fileno()


class CountingFileSystem(OsFileSystem):
    """Counts the files opened outside the segments' cache and the renames."""

    def __init__(self) -> None:
        super().__init__(segment_cache=OpenFileCache(64))
        self.writes = 0

    def open(self, path: str):
        self.writes += 1
        return super().open(path)

    def rename(self, src: str, dst: str) -> None:
        self.writes += 1
        super().rename(src, dst)


def test_an_untouched_partition_writes_no_file_at_close_or_reopen(tmp_path):
    # A broker with 100,000 idle partitions shuts down and starts in time
    # linear in them only if each costs no file written: no index file of
    # an empty segment, no producer snapshot at an offset already covered,
    # no epoch entry a load drops again. (The per-directory checkpoint
    # files are written once for every log closed: log_checkpoints.)
    fs = CountingFileSystem()
    path = str(tmp_path / "t-0")
    log = Log.open(path, LogConfig(), now_ms=0, fs=fs, producer_state=True)
    log.epoch_cache.assign(3, 0)  # a new leader's epoch, no batch yet
    log.close(checkpoint=False)
    assert fs.writes == 0
    assert not [n for n in os.listdir(path) if n.endswith((".index", ".timeindex", ".snapshot"))]
    for _ in range(2):
        log = Log.open(path, LogConfig(), now_ms=0, fs=fs, producer_state=True)
        assert log.log_end_offset == 0 and log.epoch_cache.latest_epoch == -1
        log.close(checkpoint=False)
    assert fs.writes == 0
    log = Log.open(path, LogConfig(), now_ms=0, fs=fs, producer_state=True)
    log.epoch_cache.assign(4, 0)
    log.append(batch(1), now_ms=0)
    log.close()  # with the directory's recovery point checkpoint, so the next open recovers nothing
    log = Log.open(path, LogConfig(), now_ms=0, fs=fs, producer_state=True)
    assert log.log_end_offset == 1 and log.epoch_cache.latest_epoch == 4
    assert bytes(log.read_bytes(0, 1 << 20)).count(b"value-1") == 1
    writes = fs.writes
    log.close(checkpoint=False)
    assert fs.writes == writes  # nothing new since the last close
