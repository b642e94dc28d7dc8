"""A broker with many partitions: shutdown and start-up are linear in
partitions (each checkpoint file is written once, not once per log)."""

from __future__ import annotations

import collections
import errno
import logging
import os
import random
import resource
import signal
import subprocess
import sys
import time

import trio
from broker_testing import (
    batch,
    fetch_request,
    only_partition,
    produce_request,
    start_broker,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

import storage.checkpoint
from broker.shell import log_passes
from broker.shell.log_manager import CLEAN_SHUTDOWN_FILE
from storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from storage.fs import OsFileSystem

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


async def test_the_flush_pass_walks_only_logs_with_a_flush_policy(nursery, tmp_path):
    # The pass runs every second: over 100,000 idle logs it held the event
    # loop each time. A topic with flush.ms still gets its flushes.
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("idle", 50)
    await rb.create_topic("timed", 1, configs={"flush.ms": "100"})
    manager = rb.broker.log_manager
    assert list(manager._flushed_by_policy) == [("timed", 0)]
    conn = await rb.connect(nursery)
    assert only_partition(await conn.request(produce_request("timed", 0, batch(3)))).error_code == ErrorCode.none
    log = manager.get("timed", 0)
    deadline = time.monotonic() + 10
    while log.recovery_point < 3:
        assert time.monotonic() < deadline, "flush.ms=100 never flushed the log"
        await trio.sleep(0.1)


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


async def test_periodic_passes_let_the_event_loop_run_and_write_only_what_changed(nursery, tmp_path, monkeypatch):
    # At 100,000 partitions each pass over every log, done in one step, held
    # the event loop past the metadata fetch's timeout; the recovery-point
    # pass also read both files back and rewrote them every time.
    partitions = 600
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("many", partitions)
    conn = await rb.connect(nursery)
    assert only_partition(await conn.request(produce_request("many", 1, batch(5)))).error_code == ErrorCode.none
    manager = rb.broker.log_manager
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    writes = _count_checkpoint_writes(monkeypatch)
    with trio.CancelScope() as scope:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()
        before = turns
        # slice_s=0: the pass lets the loop run at every clock check (each 256 logs).
        assert await manager.checkpoint_logs_in_slices(slice_s=0) >= 1
        during = turns - before
        await log_passes.enforce_retention_in_slices(manager, rb.broker.clock_ms(), slice_s=0)
        await log_passes.remove_expired_producers_in_slices(manager, rb.broker.clock_ms(), slice_s=0)
        scope.cancel()
    assert during >= partitions // 256, f"the other task ran {during} times during the pass"
    fs = OsFileSystem()
    recovery_points = OffsetCheckpointFile(fs, str(tmp_path / RECOVERY_POINT_OFFSET_CHECKPOINT)).read()
    assert len(recovery_points) == partitions

    # Nothing changed: no file written. One log flushed: its dir's recovery point file only.
    writes.clear()
    assert await manager.checkpoint_logs_in_slices() == 0 and not writes
    manager.get("many", 1).flush()
    writes.clear()
    assert await manager.checkpoint_logs_in_slices() == 1
    assert [os.path.basename(p) for p in writes] == [RECOVERY_POINT_OFFSET_CHECKPOINT]
    assert OffsetCheckpointFile(fs, str(tmp_path / RECOVERY_POINT_OFFSET_CHECKPOINT)).read()[("many", 1)] == 5


def _hoard_descriptors() -> list[int]:
    """Open /dev/null until the process has no descriptor left (EMFILE)."""
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as e:
        assert e.errno == errno.EMFILE, e
    return held


async def test_out_of_descriptors_creating_partitions_is_an_error_for_them_only(nursery, tmp_path, caplog):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("live", 2)
    conn = await rb.connect(nursery)
    for p in range(2):
        assert only_partition(await conn.request(produce_request("live", p, batch(2)))).error_code == ErrorCode.none
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A low limit, so that the hoard below stays small.
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    held = _hoard_descriptors()
    try:
        with caplog.at_level(logging.WARNING):
            await rb.create_topic("big", 20)
        # Some partitions could not open their logs; the broker lives on.
        offline = sorted(p for t, p in rb.broker.replicas.offline if t == "big")
        assert offline, "no partition ran out of descriptors"
        assert only_partition(await conn.request(produce_request("big", offline[0], batch(1)))).error_code \
            == ErrorCode.kafka_storage_error
        assert "Too many open files" in caplog.text
        assert "raise the open-files limit" in caplog.text
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # The existing partitions served throughout, and serve on.
    for p in range(2):
        assert only_partition(await conn.request(produce_request("live", p, batch(1)))).error_code == ErrorCode.none
    response = await conn.request(fetch_request([("live", 0, 0, 1 << 20, -1)]))
    assert only_partition(response).high_watermark == 3
    # With descriptors back, the retry opens the offline logs.
    assert rb.broker.replicas.retry_offline(rb.broker.image) == len(offline)
    for p in offline:
        assert only_partition(await conn.request(produce_request("big", p, batch(1)))).error_code == ErrorCode.none


# --- a broker process under a low open-files limit ---------------------------

#: The broker process's open-files limit. Before segment files were opened
#: lazily it held one per partition: about 200 partitions fitted.
NOFILE = 256
#: Ten times what the limit allowed.
SCALE_PARTITIONS = 2500


class LimitedBroker:
    """`local_node.py` (one broker, in-process controller) as a child process
    whose RLIMIT_NOFILE is `nofile`."""

    def __init__(self, data_dir, nofile: int, *args: str) -> None:
        # The limit is set in the child before it runs Python (a preexec_fn is
        # unsafe here: the client libraries run threads).
        command = [sys.executable, os.path.join(REPO, "tests", "broker", "local_node.py"), "--data-dir",
                   str(data_dir), "--port", "0", *args]
        # Its log goes to a file: thousands of partitions' lines fill a pipe
        # nobody reads during the test, and the broker would block on it.
        self.log_path = os.path.join(str(data_dir), f"broker-{time.monotonic_ns()}.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                ["sh", "-c", f'ulimit -n {nofile} && exec "$@"', "sh", *command],
                cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("READY port="), (line, self.log())
        self.bootstrap = f"127.0.0.1:{int(line.split('=')[1])}"

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def kill(self) -> str:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return self.log()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        return self.log()


def _produce_random(bootstrap: str, topic: str, partitions: int, count: int, rng: random.Random) -> dict:
    """`count` records to random partitions, acks=all: {(partition, offset): value} of those acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: dict[tuple[int, int], bytes] = {}
    failed = []

    def on_delivery(err, msg):
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            failed.append(err)

    for i in range(count):
        producer.produce(topic, value=b"record-%d" % i, partition=rng.randrange(partitions), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    return acked


def _read_partitions(bootstrap: str, topic: str, partitions: list[int], expected: int) -> dict:
    """Every record of `partitions` from the start: {(partition, offset): value}."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "scale-test", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 50})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=0.5):
            assert msg.error() is None, msg.error()
            got[(msg.partition(), msg.offset())] = msg.value()
    consumer.close()
    return got


def test_a_low_open_files_limit_hosts_ten_times_the_partitions(tmp_path):
    rng = random.Random(7)
    broker = LimitedBroker(tmp_path, NOFILE, "--topic", f"wide:{SCALE_PARTITIONS}")
    try:
        acked = _produce_random(broker.bootstrap, "wide", SCALE_PARTITIONS, 3000, rng)
        # Fetch at random: a few hundred partitions, most of whose files are closed by now.
        sample = rng.sample(range(SCALE_PARTITIONS), 300)
        want = {k: v for k, v in acked.items() if k[0] in set(sample)}
        assert _read_partitions(broker.bootstrap, "wide", sample, len(want)) == want
    finally:
        stderr = broker.kill()
    assert "Traceback" not in stderr, stderr[-3000:]

    broker = LimitedBroker(tmp_path, NOFILE)
    try:
        got = _read_partitions(broker.bootstrap, "wide", list(range(SCALE_PARTITIONS)), len(acked))
        assert got == acked, f"{len(acked) - len(got.keys() & acked.keys())} acknowledged records lost"
    finally:
        stderr = broker.stop()
    assert "Traceback" not in stderr, stderr[-3000:]
