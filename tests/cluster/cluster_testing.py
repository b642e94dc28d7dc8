"""Helpers for tests against real raftka processes.

- `ClusterUp`: `raftka cluster up` as a subprocess; `start()` waits for its
  READY line; `stop()` sends SIGTERM; `kill_everything()` (fixture teardown)
  leaves no process behind whatever happened, using the pids the launcher
  writes to cluster.json.
- `run_cli(...)`: a `raftka` command to completion.
- Client round trips for confluent-kafka, kafka-python and aiokafka, over
  the `broker_testing` workload (keyed records with headers).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from broker_testing import Consumed

PYTHON = sys.executable
READY_TIMEOUT_S = 120


def raftka_command(*args: str) -> list[str]:
    return [PYTHON, "-m", "raftka.cli", *args]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(raftka_command(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ReadyLine:
    """Reads a child's stdout in a thread; `wait(prefix)` returns the first line with it."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._event = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._event:
                self.lines.append(line.rstrip("\n"))
                self._event.notify_all()

    def wait(self, prefix: str, timeout: float, process: subprocess.Popen[str]) -> str:
        deadline = time.monotonic() + timeout
        with self._event:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if process.poll() is not None and not self._thread.is_alive():
                    raise AssertionError(f"exited with {process.returncode} before printing {prefix!r}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {prefix!r} line within {timeout} s; stdout: {self.lines}")
                self._event.wait(0.2)


class ClusterUp:
    def __init__(self, data_dir: Path, controllers: int = 3, brokers: int = 3, *extra: str) -> None:
        self.data_dir = data_dir
        self.args = ["cluster", "up", "--controllers", str(controllers), "--brokers", str(brokers),
                     "--base-port", "0", "--data-dir", str(data_dir), *extra]
        self.process: subprocess.Popen[str] | None = None
        self.stderr_path = data_dir.parent / f"{data_dir.name}-launcher.err"
        self.bootstrap = ""

    def start(self) -> str:
        with open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(raftka_command(*self.args), stdout=subprocess.PIPE, stderr=err,
                                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = ReadyLine(self.process)
        try:
            line = self.reader.wait("READY bootstrap=", READY_TIMEOUT_S, self.process)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlauncher stderr:\n{self.stderr_path.read_text()[-3000:]}") from None
        self.bootstrap = line.split("=", 1)[1]
        return self.bootstrap

    def state(self) -> dict:
        return json.loads((self.data_dir / "cluster.json").read_text())

    def node_pids(self) -> dict[int, int]:
        return {n["node_id"]: n["pid"] for n in self.state()["nodes"] if n["pid"] is not None}

    def broker_log_dirs(self) -> list[Path]:
        return [Path(n["log_dir"]) for n in self.state()["nodes"] if n["role"] == "broker"]

    def stop(self, timeout: float = 60) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill_everything(self) -> None:
        pids = set()
        try:
            pids = set(self.node_pids().values())
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- clients ------------------------------------------------------------------

def confluent_create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(60)


def confluent_produce(bootstrap: str, topic: str, records, acks: str) -> list[tuple[int, int, bytes]]:
    """Produce `records`; the (partition, offset, value) of each acknowledged record."""
    from confluent_kafka import Producer

    reports, errors = [], []

    def on_delivery(err, msg):
        (errors if err is not None else reports).append(err or (msg.partition(), msg.offset(), msg.value()))

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": acks})
    for r in records:
        while True:
            try:
                producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers),
                                 timestamp=r.timestamp_ms, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    return reports


def confluent_consume(bootstrap: str, topic: str, partitions: int, count: int) -> list[Consumed]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftka-cluster-test",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out: list[Consumed] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is not None:
                    raise KafkaException(m.error())
                out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                    m.timestamp()[1]))
        return out
    finally:
        consumer.close()


def kafka_python_create(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def kafka_python_produce(bootstrap: str, topic: str, records, acks) -> list[tuple[int, int, bytes]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1 if acks == "1" else "all")
    try:
        futures = [producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                 timestamp_ms=r.timestamp_ms) for r in records]
        producer.flush(60)
        return [(m.partition, m.offset, r.value) for m, r in zip((f.get(30) for f in futures), records)]
    finally:
        producer.close(5)


def kafka_python_consume(bootstrap: str, topic: str, partitions: int, count: int) -> list[Consumed]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        out: list[Consumed] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=200).values():
                out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                        for m in messages]
        return out
    finally:
        consumer.close()


def aiokafka_create(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def aiokafka_produce(bootstrap: str, topic: str, records, acks) -> list[tuple[int, int, bytes]]:
    from aiokafka import AIOKafkaProducer

    async def produce():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1 if acks == "1" else "all")
        await producer.start()
        try:
            futures = [await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                           timestamp_ms=r.timestamp_ms) for r in records]
            return [(m.partition, m.offset, r.value) for m, r in zip([await f for f in futures], records)]
        finally:
            await producer.stop()

    return asyncio.run(produce())


def aiokafka_consume(bootstrap: str, topic: str, partitions: int, count: int) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def consume():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
            await consumer.seek_to_beginning()
            out: list[Consumed] = []
            deadline = time.monotonic() + 60
            while len(out) < count and time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    out += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                            for m in messages]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(consume())


CLIENTS = {
    "confluent-kafka": (confluent_create, confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_create, kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_create, aiokafka_produce, aiokafka_consume),
}
