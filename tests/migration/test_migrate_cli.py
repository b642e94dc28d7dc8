"""`raftka migrate` on a dir made by `raftka cluster up --mode zk` (real processes).

About 90 s, and the same migration steps as test_migrate_cluster.py, so it
runs with RAFTKA_SOAK=1 only."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from quorum.zookeeper.ensemble import zookeeper_missing_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.soak,
    pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="soak: set RAFTKA_SOAK=1"),
    pytest.mark.skipif(zookeeper_missing_reason() is not None, reason=f"needs ZooKeeper: {zookeeper_missing_reason()}"),
]

REPO = Path(__file__).resolve().parents[2]


class Command:
    """A `raftka` process whose stdout and stderr lines are collected as they come."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "raftka.cli", *args], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._collect, args=(stream,), daemon=True).start()

    def _collect(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if prefix in line:
                    return line
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line with {prefix!r} within {timeout_s}s; output:\n" + "\n".join(self.lines[-40:]))

    def stop(self, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def test_migrate_command_moves_a_stopped_zookeeper_cluster_and_finalizes(tmp_path):
    data_dir = str(tmp_path / "cluster")
    up = Command("cluster", "up", "--mode", "zk", "--controllers", "1", "--brokers", "2", "--base-port", "0",
                 "--data-dir", data_dir)
    try:
        bootstrap = up.wait_for("READY bootstrap=", 120).split("=", 1)[1]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic("orders", 2, 2)]).values():
            f.result(30)
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(100):
            p.produce("orders", value=str(i).encode(), partition=i % 2)
        assert p.flush(60) == 0
    finally:
        assert up.stop() == 0

    migrate = Command("migrate", "--data-dir", data_dir, "--timeout", "120")
    try:
        bootstrap = migrate.wait_for("READY bootstrap=", 300).split("=", 1)[1]
        assert any("metadata copied" in line for line in migrate.lines)
        assert read(bootstrap, 100) == {(i % 2, i // 2): i for i in range(100)}, "every record at its old offset"

        finalize = subprocess.run([sys.executable, "-m", "raftka.cli", "migrate", "finalize", "--data-dir", data_dir],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)
        assert finalize.returncode == 0, finalize.stderr
        migrate.wait_for("finalized", 120)
    finally:
        assert migrate.stop() == 0

    # The finalized cluster is an ordinary KRaft cluster dir now.
    up = Command("cluster", "up", "--controllers", "1", "--brokers", "2", "--base-port", "0", "--data-dir", data_dir)
    try:
        bootstrap = up.wait_for("READY bootstrap=", 120).split("=", 1)[1]
        assert read(bootstrap, 100) == {(i % 2, i // 2): i for i in range(100)}
    finally:
        assert up.stop() == 0


def read(bootstrap: str, count: int) -> dict[tuple[int, int], int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    c.assign([TopicPartition("orders", p, 0) for p in range(2)])
    seen: dict[tuple[int, int], int] = {}
    deadline = time.monotonic() + 60
    while len(seen) < count and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            seen[(m.partition(), m.offset())] = int(m.value())
    c.close()
    return seen
