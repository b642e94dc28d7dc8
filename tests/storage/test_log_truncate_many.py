"""Many followers truncated at once (a leader change) write each
per-directory checkpoint file once, and a crash after that write recovers
what each appended next."""

from __future__ import annotations

import collections

import storage.checkpoint
from storage.batch import build_batch
from storage.checkpoint import RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from storage.config import LogConfig
from storage.log import Log
from storage.log_checkpoints import write_checkpoints_of
from storage.sim_fs import SimFileSystem


def batch(i: int) -> bytearray:
    return bytearray(build_batch([(b"k", b"value-%d" % i, (), 1_700_000_000_000 + i)]))


def test_truncating_many_logs_writes_the_checkpoints_once(monkeypatch):
    fs = SimFileSystem(seed=3)
    fs.makedirs("/data")
    logs = [Log.open(f"/data/t-{i}", LogConfig(), now_ms=0, fs=fs) for i in range(40)]
    for log in logs:
        for i in range(4):
            log.append(batch(i), now_ms=0)
    write_checkpoints_of(logs)
    for log in logs:
        log.flush()
    write_checkpoints_of(logs)

    writes: collections.Counter = collections.Counter()
    real = storage.checkpoint.write_atomically

    def counting(fs_, path, data, **kwargs):
        writes[path] += 1
        return real(fs_, path, data, **kwargs)

    monkeypatch.setattr(storage.checkpoint, "write_atomically", counting)
    for log in logs[:20]:
        assert log.truncate_to(2, write_checkpoints=False)
    for log in logs[20:]:
        log.truncate_fully_and_start_at(10, write_checkpoints=False)
    assert not writes  # nothing per log
    write_checkpoints_of(logs)
    assert set(writes.values()) == {1} and len(writes) == 2, writes

    # What each appends next (unflushed) is recovered after a crash: the
    # recovery points on file are at or below the new log ends.
    points = OffsetCheckpointFile(fs, "/data/" + RECOVERY_POINT_OFFSET_CHECKPOINT).read()
    assert all(points[("t", i)] == 2 for i in range(20)) and all(points[("t", i)] == 10 for i in range(20, 40))
    for log in logs:
        log.append(batch(9), now_ms=0)
    fs.crash()
    for i in range(40):
        log = Log.open(f"/data/t-{i}", LogConfig(), now_ms=0, fs=fs)
        assert log.log_end_offset <= (3 if i < 20 else 11)
        assert log.log_end_offset >= (2 if i < 20 else 10)
