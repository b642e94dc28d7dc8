"""The periodic `replication-offset-checkpoint` (every
`replica.high.watermark.checkpoint.interval.ms`) is written, and its fsync,
slow while the logs take tens of MB/s, holds up no request: it runs in a
worker thread, as Kafka's scheduler thread writes it."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import trio
from kio.schema.errors import ErrorCode

from broker_testing import batch, only_partition, produce_request, start_broker
from common.wire import encode_request
from storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from storage.fs import OsFileSystem

SLOW_FSYNC_S = 1.0


async def test_the_hw_checkpoint_is_written_periodically_without_holding_up_produce(nursery, tmp_path, monkeypatch):
    rb = await start_broker(nursery, tmp_path, replica_high_watermark_checkpoint_interval_ms=200)
    await rb.create_topic("t", 2)
    conn = await rb.connect(nursery)
    checkpoint = OffsetCheckpointFile(OsFileSystem(), str(tmp_path / REPLICATION_OFFSET_CHECKPOINT))

    async def checkpointed(expected: dict) -> None:
        with trio.fail_after(5):
            while not (os.path.exists(checkpoint.path) and checkpoint.read() == expected):
                await trio.sleep(0.02)

    for _ in range(3):
        assert only_partition(await conn.request(produce_request("t", 1, batch(4)))).error_code == ErrorCode.none
    await checkpointed({("t", 0): 0, ("t", 1): 12})

    # From now on the checkpoint's directory fsync takes a second (a disk
    # busy with the logs' writeback).
    in_fsync = threading.Event()
    real_fsync_dir = OsFileSystem.fsync_dir

    def slow_fsync_dir(self, dir_path: str) -> None:
        if os.path.samefile(dir_path, tmp_path):
            in_fsync.set()
            time.sleep(SLOW_FSYNC_S)
        real_fsync_dir(self, dir_path)

    monkeypatch.setattr(OsFileSystem, "fsync_dir", slow_fsync_dir)
    assert only_partition(await conn.request(produce_request("t", 0, batch(5)))).error_code == ErrorCode.none

    def produce_during_the_fsync() -> float:
        """From another thread (the broker's event loop may be the one
        stuck): once a checkpoint fsync has begun, one Produce; its latency."""
        assert in_fsync.wait(5), "no HW checkpoint was written"
        frame = encode_request(1, "during-fsync", produce_request("t", 0, batch(1)))
        with socket.create_connection(("127.0.0.1", rb.port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(frame)
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            answer = sock.recv(size, socket.MSG_WAITALL)
            took = time.monotonic() - start
        assert len(answer) == size
        return took

    took = await trio.to_thread.run_sync(produce_during_the_fsync)
    assert took < SLOW_FSYNC_S / 2, f"a Produce took {took:.3f} s while the HW checkpoint was fsynced"
    await checkpointed({("t", 0): 6, ("t", 1): 12})
    monkeypatch.undo()
