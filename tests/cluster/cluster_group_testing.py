"""Helpers for consumer group tests against real processes.

- `DevNode`: `raftka dev` as a subprocess (with `--set` overrides).
- `Member`: a consumer group member process (`group_member.py`) whose JSON
  reports are collected by a thread, each stamped with the time it arrived.
- `BackgroundProducer`: confluent-kafka producing numbered values round
  robin over a topic's partitions in a thread, keeping what was acked.
- `check_history`: the properties every group scenario must hold (nothing
  acked is lost; a record is read twice only inside its first reader's
  uncommitted window).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

from cluster_testing import PYTHON, ReadyLine, raftka_command

MEMBER_SCRIPT = str(Path(__file__).resolve().parent / "group_member.py")


class DevNode:
    def __init__(self, data_dir: Path, *settings: str, port: int = 0, controller_port: int | None = None) -> None:
        args = ["dev", "--data-dir", str(data_dir), "--port", str(port)]
        if controller_port is not None:
            # Without it a fixed --port puts the controller on port + 1,
            # which nothing reserves.
            args += ["--controller-port", str(controller_port)]
        for s in settings:
            args += ["--set", s]
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(raftka_command(*args), stdout=subprocess.PIPE, stderr=log, text=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            line = ReadyLine(self.process).wait("READY bootstrap=", 60, self.process)
        except BaseException:
            self.kill()
            raise
        self.bootstrap = line.split("=", 1)[1]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class Member:
    """A group member process and everything it reported."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str, name: str,
                 session_ms: int = 6000, heartbeat_ms: int = 500, report_dir: Path | None = None,
                 instance_id: str | None = None) -> None:
        self.name = name
        #: Where its reports are kept, with arrival times (to read after a failure).
        self.report_path = None if report_dir is None else report_dir / f"{name}.jsonl"
        self.process = subprocess.Popen(
            [PYTHON, MEMBER_SCRIPT, client, bootstrap, group, topic, name, str(session_ms), str(heartbeat_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **({"GROUP_MEMBER_INSTANCE_ID": instance_id} if instance_id else {})})
        self.lock = threading.Lock()
        #: (arrival time, event) in order.
        self.events: list[tuple[float, dict]] = []
        self.assigned: frozenset[int] = frozenset()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            arrived = time.monotonic()
            if self.report_path is not None:
                with open(self.report_path, "a") as f:
                    f.write(json.dumps([arrived, event]) + "\n")
            with self.lock:
                self.events.append((arrived, event))
                if event["ev"] == "assigned":
                    self.assigned = frozenset(event["partitions"])

    def errors(self) -> list[tuple[float, str, bool]]:
        """(arrival, message, fatal) of every consumer error it reported."""
        with self.lock:
            return [(t, e["error"], e["fatal"]) for t, e in self.events if e["ev"] == "error"]

    def consumed(self) -> list[tuple[float, int, int, str]]:
        """(arrival, partition, offset, value) of every record it read."""
        with self.lock:
            return [(t, p, o, v) for t, e in self.events if e["ev"] == "records" for p, o, v in e["records"]]

    def commits(self) -> list[tuple[float, int, int]]:
        """(arrival, partition, committed offset) of every acknowledged commit."""
        with self.lock:
            return [(t, int(p), o) for t, e in self.events if e["ev"] == "committed" for p, o in e["offsets"].items()]

    def terminate(self, timeout: float = 30) -> None:
        """SIGTERM: the member closes its consumer (a dynamic member leaves)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout)
        self._thread.join(5)

    def kill(self) -> None:
        """SIGKILL: no goodbye, the coordinator finds out by the session timeout."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._thread.join(5)


def wait_for_split(members: list[Member], partitions: int, timeout_s: float = 60.0, steady_s: float = 1.0) -> dict:
    """Until the members' assignments are disjoint, non-empty and cover every
    partition, steadily for `steady_s`; the split."""
    deadline = time.monotonic() + timeout_s
    since = None
    while time.monotonic() < deadline:
        split = {m.name: m.assigned for m in members}
        owned = [p for s in split.values() for p in s]
        if all(split.values()) and sorted(owned) == list(range(partitions)):
            since = since or time.monotonic()
            if time.monotonic() - since >= steady_s:
                return split
        else:
            since = None
        time.sleep(0.05)
    raise AssertionError(f"no disjoint, complete split within {timeout_s} s: "
                         f"{ {m.name: sorted(m.assigned) for m in members} }")


class BackgroundProducer:
    """Numbered values, round robin over partitions, acks=all, in a thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate_per_s: float = 200.0) -> None:
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate_per_s
        self.acked: list[tuple[int, int, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                             "message.timeout.ms": 120_000})

        def on_delivery(err, msg) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked.append((msg.partition(), msg.offset(), msg.value().decode()))

        seq = 0
        while not self._stop.is_set():
            producer.produce(self.topic, value=f"v-{seq}".encode(), partition=seq % self.partitions,
                             on_delivery=on_delivery)
            seq += 1
            producer.poll(1 / self.rate)
        assert producer.flush(120) == 0

    def stop(self) -> list[tuple[int, int, str]]:
        self._stop.set()
        self._thread.join(150)
        assert not self._thread.is_alive(), "the producer did not flush"
        assert not self.errors, self.errors[:3]
        return self.acked

    def end_offsets(self) -> dict[int, int]:
        ends: dict[int, int] = defaultdict(int)
        for p, o, _v in list(self.acked):
            ends[p] = max(ends[p], o + 1)
        return dict(ends)


def wait_until_consumed(member: Member, end_offsets: dict[int, int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reached: dict[int, int] = defaultdict(lambda: -1)
        for _t, p, o, _v in member.consumed():
            reached[p] = max(reached[p], o)
        if all(reached[p] >= end - 1 for p, end in end_offsets.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"{member.name} did not read up to {end_offsets} within {timeout_s} s")


def last_commits(members: list[Member]) -> dict[int, int]:
    """The newest acknowledged commit of each partition over all members."""
    out: dict[int, int] = {}
    for m in members:
        for _t, p, o in m.commits():
            out[p] = max(out.get(p, 0), o)
    return out


def check_history(members: list[Member], acked: list[tuple[int, int, str]]) -> int:
    """Nothing acked is lost; a record read twice was, the first time, past
    its reader's last acknowledged commit of that partition at the moment
    of the second read (its uncommitted window). Returns how many records
    were read more than once."""
    reads: dict[tuple[int, int], list[tuple[float, Member, str]]] = defaultdict(list)
    for m in members:
        for t, p, o, v in m.consumed():
            reads[(p, o)].append((t, m, v))
    for p, o, v in acked:
        assert (p, o) in reads, f"record {v!r} acked at partition {p} offset {o} was never consumed"
        assert all(value == v for _t, _m, value in reads[(p, o)]), f"{p}/{o} read as something else"
    duplicates = 0
    for (p, o), seen in reads.items():
        if len(seen) < 2:
            continue
        duplicates += 1
        seen.sort(key=lambda s: s[0])
        first_t, first, _v = seen[0]
        for t, _m, _v2 in seen[1:]:
            committed_before = [c for ct, cp, c in first.commits() if cp == p and first_t <= ct < t]
            assert not committed_before or max(committed_before) <= o, (
                f"partition {p} offset {o} was read again at {t:.2f} although its first reader {first.name} "
                f"had committed {max(committed_before)} before")
    return duplicates
