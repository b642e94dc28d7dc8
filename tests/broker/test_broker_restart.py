"""Restarts: a broker subprocess killed with SIGKILL loses nothing it
acknowledged; a clean stop writes checkpoints and the clean-shutdown
marker; logs of other topics are moved aside, not reused."""

import os
import signal
import subprocess
import sys
import time
import uuid

import trio
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from broker import Broker
from broker.shell.log_manager import CLEAN_SHUTDOWN_FILE, PARTITION_METADATA_FILE
from broker_testing import Consumed, batch, check_round_trip, produce_request, start_broker, workload
from common.wire import connect
from storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from storage.fs import OsFileSystem

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BrokerProcess:
    def __init__(self, data_dir, *topics):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(REPO, "tests", "broker", "local_node.py"), "--data-dir", str(data_dir), "--port", "0",
             *[a for t in topics for a in ("--topic", t)]],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("READY port="), (line, self.proc.stderr.read() if self.proc.poll() else "")
        self.bootstrap = f"127.0.0.1:{int(line.split('=')[1])}"

    def kill(self) -> str:
        self.proc.send_signal(signal.SIGKILL)
        return self._wait()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        return self._wait()

    def _wait(self) -> str:
        _, stderr = self.proc.communicate(timeout=20)
        return stderr


def produce_all(bootstrap, topic, records):
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    futures = [producer.send(topic, key=r.key, value=r.value, headers=list(r.headers), timestamp_ms=r.timestamp_ms)
               for r in records]
    producer.flush(30)
    metadata = [f.get(10) for f in futures]
    producer.close(5)
    return metadata


def consume_all(bootstrap, topic, partitions, count):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    out = []
    deadline = time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        for messages in consumer.poll(timeout_ms=200).values():
            out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in messages]
    end = consumer.end_offsets(tps)
    consumer.close()
    return out, {tp.partition: o for tp, o in end.items()}


def test_sigkill_loses_nothing_acknowledged(tmp_path):
    records = workload(3000)
    first = BrokerProcess(tmp_path, "t:3")
    acked = produce_all(first.bootstrap, "t", records)
    stderr = first.kill()
    assert not os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE)
    # A crash mid-append leaves a torn batch at the end of a segment.
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    with open(segment, "ab") as f:
        f.write(batch(5)[:40])

    second = BrokerProcess(tmp_path)
    consumed, end = consume_all(second.bootstrap, "t", 3, len(records))
    stderr = second.stop()
    by_partition = check_round_trip(records, consumed, 3)
    assert end == {p: len(r) for p, r in by_partition.items()}
    assert sorted((m.partition, m.offset) for m in acked) == sorted((c.partition, c.offset) for c in consumed)
    assert "no clean shutdown marker" in stderr and "[node 1]" in stderr
    assert os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE)
    hws = OffsetCheckpointFile(OsFileSystem(), str(tmp_path / REPLICATION_OFFSET_CHECKPOINT)).read()
    assert hws == {("t", p): len(r) for p, r in by_partition.items()}


async def test_clean_restart_in_process(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t", 2)
    conn = await rb.connect(nursery)
    for _ in range(3):
        await conn.request(produce_request("t", 1, batch(4)))
    await rb.controller.controlled_shutdown(1)
    rb.stop()
    with trio.fail_after(5):
        while not os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE):
            await trio.sleep(0.01)
    assert OffsetCheckpointFile(OsFileSystem(), str(tmp_path / "recovery-point-offset-checkpoint")).read()[
        ("t", 1)] == 12

    # A log of an older topic with the same name, and one of a topic that no longer exists.
    os.makedirs(tmp_path / "gone-0")
    stale_id = uuid.uuid4()
    with open(tmp_path / "t-0" / PARTITION_METADATA_FILE, "w") as f:
        f.write(f"version: 0\ntopic_id: {stale_id}\n")

    again = Broker(rb.broker.config, rb.controller)
    rb.controller.subscribe(again.on_metadata_update)
    server = await nursery.start(again.run)
    again.on_metadata_update(rb.controller.image)
    assert not os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE) and not again.log_manager.recovered_unclean
    assert again.replicas.partitions[("t", 1)].log.log_end_offset == 12
    assert again.replicas.partitions[("t", 0)].log.log_end_offset == 0
    strays = sorted(n for n in os.listdir(tmp_path) if n.endswith("-stray"))
    assert [n.split(".")[0] for n in strays] == ["gone-0", "t-0"]
    await rb.controller.register_broker(1, "127.0.0.1", server.port)
    conn = await connect(nursery, "127.0.0.1", server.port)
    response = await conn.request(produce_request("t", 1, batch(1)))
    hp = again.replicas.partitions[("t", 1)]
    assert response.responses[0].partition_responses[0].base_offset == 12, (
        hp.state, again.image.topic("t").partitions[1], again.image.brokers[1], rb.controller.requests_seen)
