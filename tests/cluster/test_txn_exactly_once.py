"""Exactly-once consume-transform-produce across crashes.

Real processes: one controller, three brokers, every topic RF=3 with
min.insync.replicas 2 (`__consumer_offsets` and `__transaction_state` as
well). An input topic holds N numbered records over several partitions
(record i on partition i % P). A pipeline process (`eos_worker.py`,
confluent-kafka: transactional producer, read_committed consumer,
send_offsets_to_transaction, commit_transaction) turns each value v into
b"out-" + v on the same partition of the output topic. The test SIGKILLs
that process K times at random points of its progress (mostly inside a
transaction: the kill comes a random moment after a commit) and starts it
again, and once SIGKILLs the broker leading a partition of the pipeline,
starting it again a few seconds later.

A user would notice a lost or repeated record: the output topic, read
with read_committed, must hold each input record's transform exactly once,
in the input's order, per partition.

Default: N=2,000, K=3. RAFTKA_SOAK=1: N=1,000,000 and 20 kills
(RAFTKA_EOS_RECORDS, RAFTKA_EOS_KILLS, RAFTKA_EOS_SEED override them).
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cluster_replication_testing import (
    SETTINGS,
    create_topic,
    partition_state,
    wait_for_isr,
)
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)

from cluster import LocalCluster

SOAK = os.environ.get("RAFTKA_SOAK") == "1"
RECORDS = int(os.environ.get("RAFTKA_EOS_RECORDS", "1000000" if SOAK else "2000"))
KILLS = int(os.environ.get("RAFTKA_EOS_KILLS", "20" if SOAK else "3"))
SEED = int(os.environ.get("RAFTKA_EOS_SEED", str(random.randrange(1 << 30))))
PARTITIONS = 3
BROKERS = (2, 3, 4)
IN, OUT = "eos-in", "eos-out"
WORKER = Path(__file__).with_name("eos_worker.py")
# Records per transaction: small in the default suite so that a kill lands
# among many transactions, larger in the soak for its million records.
MAX_RECORDS = 500 if SOAK else 50
#: A pipeline run silent this long is taken for hung (see run_pipeline).
STALL_S = 40
CLUSTER_SETTINGS = {
    **SETTINGS,
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}


def fill_input(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 20, "batch.num.messages": 10000})
    failed = []
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(IN, value=b"%d" % i, partition=i % PARTITIONS,
                                 on_delivery=lambda err, _m: err is not None and failed.append(err))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0
    assert not failed, failed[:3]


class Worker:
    """One run of the pipeline process; its stdout lines arrive on a queue."""

    def __init__(self, bootstrap: str, log: Path) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        # Closed when the process ends; line by line, so a hang leaves the log whole.
        self.log = open(log, "a", buffering=1)  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), bootstrap, IN, OUT, "eos-group", "eos-pipeline", str(MAX_RECORDS)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.write("> " + line)
            self.lines.put(line.strip())
        self.lines.put(None)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()


def run_pipeline(cluster: LocalCluster, rng: random.Random, log: Path) -> tuple[int, int, bool, int]:
    """Run the pipeline to its end, killing it K times and a leader once on
    the way; (starts, kills, whether the leader was killed, stalls).

    A run that reports nothing for STALL_S is killed and started again, as
    a supervisor would, and counted as a stall: librdkafka's
    send_offsets_to_transaction() was seen to hang past its own timeout
    after the broker leading both coordinators' partitions was killed (the
    coordinator then aborts the transaction at transaction.timeout.ms)."""
    bootstrap = cluster.bootstrap
    # Kill points by progress (committed positions), spread over the run;
    # the leader kill somewhere in its middle half.
    kill_at = sorted(rng.sample(range(1, RECORDS), KILLS))
    leader_kill_at = rng.randrange(RECORDS // 4, 3 * RECORDS // 4)
    downed: tuple[int, float] | None = None  # (broker, when to start it again)
    leader_killed = False
    starts = kills = stalls = 0
    deadline = time.monotonic() + 150 + RECORDS / 200
    worker: Worker | None = None
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of the pipeline; worker log:\n{log.read_text()[-4000:]}"
            if worker is None:
                worker = Worker(bootstrap, log)
                starts += 1
                kill_time: float | None = None
                last_line = time.monotonic()
            if downed is not None and time.monotonic() >= downed[1]:
                cluster.start(downed[0])
                downed = None
            try:
                line = worker.lines.get(timeout=0.05)
            except queue.Empty:
                line = ""
            if line:
                last_line = time.monotonic()
            if time.monotonic() - last_line > STALL_S:
                worker.kill()
                worker = None
                stalls += 1
            elif kill_time is not None and time.monotonic() >= kill_time:
                worker.kill()
                worker = None
                kills += 1
            elif line is None:
                # It ended by itself (an error it could not recover from):
                # started again, as a supervisor would.
                worker.process.wait()
                worker.log.close()
                worker = None
            elif line == "done":
                worker.process.wait(60)
                worker.log.close()
                worker = None
                return starts, kills, leader_killed, stalls
            elif line.startswith("committed "):
                progress = int(line.split()[1])
                if kill_at and progress >= kill_at[0] and kill_time is None:
                    # One kill point at a time: when a run went past several,
                    # the next run is killed soon after its first commit.
                    kill_at.pop(0)
                    # A random moment after a commit: usually inside the next transaction.
                    kill_time = time.monotonic() + rng.uniform(0, 0.4)
                if not leader_killed and progress >= leader_kill_at:
                    leader_killed = True
                    victim = partition_state(bootstrap, rng.choice((IN, OUT)))[rng.randrange(PARTITIONS)][0]
                    cluster.kill(victim, signal.SIGKILL)
                    downed = (victim, time.monotonic() + rng.uniform(2, 5))
    finally:
        if worker is not None and worker.process.poll() is None:
            worker.kill()
        if downed is not None:
            cluster.start(downed[0])


def read_output(bootstrap: str) -> dict[int, list[bytes]]:
    """Every committed output record, per partition, read until N have come and nothing more for 3 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-check", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(OUT, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        count, last = 0, time.monotonic()
        deadline = time.monotonic() + 150 + RECORDS / 2000
        while time.monotonic() < deadline and (count < RECORDS or time.monotonic() - last < 3):
            for m in consumer.consume(num_messages=10000, timeout=0.2):
                if m.error() is not None:
                    raise KafkaException(m.error())
                out[m.partition()].append(m.value())
                count += 1
                last = time.monotonic()
        return out
    finally:
        consumer.close()


def test_a_killed_pipeline_transforms_each_record_exactly_once(tmp_path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}: {RECORDS} records, {KILLS} kills")
    with LocalCluster(tmp_path / "cluster", controllers=1, brokers=3, overrides=CLUSTER_SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, IN, PARTITIONS)
        create_topic(bootstrap, OUT, PARTITIONS)
        wait_for_isr(bootstrap, IN, PARTITIONS, BROKERS)
        wait_for_isr(bootstrap, OUT, PARTITIONS, BROKERS)
        fill_input(bootstrap)

        log = tmp_path / "worker.log"
        starts, kills, leader_killed, stalls = run_pipeline(cluster, rng, log)
        print(f"{starts} starts, {kills} kills, leader killed: {leader_killed}, stalled runs killed: {stalls}")
        # (the last kill may come too late: the pipeline was done)
        assert leader_killed and kills >= KILLS - 1, (kills, leader_killed)

        out = read_output(bootstrap)
        for p in range(PARTITIONS):
            expected = [b"out-%d" % i for i in range(p, RECORDS, PARTITIONS)]
            got = out[p]
            if got != expected:
                seen = set()
                repeated = sorted({v for v in got if v in seen or seen.add(v)})[:5]
                missing = sorted(set(expected) - set(got))[:5]
                raise AssertionError(f"partition {p} (seed {SEED}): {len(got)} records for {len(expected)}; "
                                     f"repeated {repeated}, missing {missing}; worker log: {log}")
