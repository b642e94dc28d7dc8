"""A broker with many partitions: shutdown and start-up are linear in
partitions (each checkpoint file is written once, not once per log)."""

from __future__ import annotations

import collections
import os
import time

from broker_testing import batch, only_partition, produce_request, start_broker
from kio.schema.errors import ErrorCode

import storage.checkpoint
from broker.shell.log_manager import CLEAN_SHUTDOWN_FILE
from storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from storage.fs import OsFileSystem

#: Enough partitions that a per-log rewrite of the checkpoint files (n
#: files of n lines) takes minutes while one write each takes well under
#: a second; kept modest because the test machine is shared.
PARTITIONS = 4000
#: The shutdown's bound: it closes every log (a few syscalls each) and
#: writes three files. About 2 s here; the quadratic shutdown took > 60 s.
SHUTDOWN_BOUND_S = 30


def _count_checkpoint_writes(monkeypatch) -> collections.Counter:
    writes: collections.Counter = collections.Counter()
    real = storage.checkpoint.write_atomically

    def counting(fs, path, data, **kwargs):
        writes[path] += 1
        return real(fs, path, data, **kwargs)

    monkeypatch.setattr(storage.checkpoint, "write_atomically", counting)
    return writes


async def test_shutdown_writes_each_checkpoint_file_once(nursery, tmp_path, monkeypatch):
    rb = await start_broker(nursery, tmp_path)
    t0 = time.monotonic()
    await rb.create_topic("many", PARTITIONS)
    print(f"created {PARTITIONS} partitions in {time.monotonic() - t0:.1f} s")
    assert len(rb.broker.log_manager.logs) == PARTITIONS
    conn = await rb.connect(nursery)
    for p in range(0, PARTITIONS, PARTITIONS // 8):
        response = await conn.request(produce_request("many", p, batch(3)))
        assert only_partition(response).error_code == ErrorCode.none

    writes = _count_checkpoint_writes(monkeypatch)
    started = time.monotonic()
    rb.broker.shutdown()
    elapsed = time.monotonic() - started
    rb.stop()
    print(f"shut down {PARTITIONS} partitions in {elapsed:.1f} s")

    # Each file once: the three per-directory files, and each partition's
    # own leader-epoch-checkpoint (its new leader epoch, not written before).
    assert set(writes.values()) == {1}, writes.most_common(3)
    per_dir = {os.path.basename(path) for path in writes if os.path.dirname(path) == str(tmp_path)}
    assert per_dir == {RECOVERY_POINT_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT}
    assert elapsed < SHUTDOWN_BOUND_S, f"shutdown of {PARTITIONS} partitions took {elapsed:.1f} s"
    assert os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE)
    fs = OsFileSystem()
    recovery_points = OffsetCheckpointFile(fs, str(tmp_path / RECOVERY_POINT_OFFSET_CHECKPOINT)).read()
    assert len(recovery_points) == PARTITIONS
    assert recovery_points[("many", 0)] == 3 and recovery_points[("many", 1)] == 0


async def test_restart_reads_each_checkpoint_file_once(nursery, tmp_path, monkeypatch):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("many", PARTITIONS // 4)
    conn = await rb.connect(nursery)
    assert only_partition(await conn.request(produce_request("many", 1, batch(5)))).error_code == ErrorCode.none
    controller = rb.controller
    rb.broker.shutdown()
    rb.stop()

    reads: collections.Counter = collections.Counter()
    real_read = OffsetCheckpointFile.read

    def counting_read(self):
        reads[os.path.basename(self.path)] += 1
        return real_read(self)

    monkeypatch.setattr(OffsetCheckpointFile, "read", counting_read)
    from broker.shell.broker import Broker

    broker = Broker(rb.broker.config, controller)
    broker.on_metadata_update(controller.image)
    assert len(broker.log_manager.logs) == PARTITIONS // 4
    assert broker.log_manager.get("many", 1).log_end_offset == 5
    assert max(reads.values()) == 1, dict(reads)
    broker.shutdown()
