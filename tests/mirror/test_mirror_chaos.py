"""An exactly-once `raftka mirror` under the chaos harness's nemeses: the
source's and the target's brokers killed (SIGKILL, restarted on the same
data), paused (SIGSTOP/SIGCONT) and cut off from their peers (the nftables
partition nemesis, when it can run here) while a producer writes to the
source. Afterwards the target holds every record of the source, acknowledged
ones among them, exactly once and in order per partition.

Two clusters of one controller and two brokers, topics with two replicas and
min.insync.replicas=2 (an acknowledged record is on both). The default run
(24 s of faults, a minute or so in all) cycles kill, pause, partition on each
side; RAFTKA_SOAK=1 runs a longer random schedule (RAFTKA_MIRROR_CHAOS_S
seconds, 300 by default). RAFTKA_MIRROR_CHAOS_SEED picks the schedule (7 by
default). RAFTKA_MIRROR_CHAOS_SOURCE=zk makes the source a ZooKeeper-mode
raftka cluster (one ZooKeeper, two brokers; the faults hit its brokers).
It prints one `MIRROR CHAOS {...}` line with the faults, the counts, the
worst lag the mirror showed, its producer replacements and its messages.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time

from confluent_kafka import KafkaException, Producer
from mirror_testing import MirrorProcess, read_all, read_committed, wait_until

from chaos.history import HistoryWriter
from chaos.nemesis import LinkCutter, Nemesis, link_cutting_unavailable
from chaos.schedule import Fault
from cluster import LocalCluster

SOAK = os.environ.get("RAFTKA_SOAK") == "1"
TWO = {"offsets.topic.replication.factor": "2", "default.replication.factor": "2", "min.insync.replicas": "2",
       "transaction.state.log.replication.factor": "2", "transaction.state.log.min.isr": "2"}
PARTITIONS = 2
STATUS = re.compile(r"\] mirroring: \d+ records mirrored, (\d+) behind \(([\d.]+) s\).*, (\d+) producer "
                    r"replacements \((\d+) stuck")


def _lag_figures(lines: list[str]) -> dict[str, float]:
    """The worst lag the mirror's status lines showed (one every 5 s), and its producer replacements."""
    rows = [tuple(map(float, m.groups())) for line in lines if (m := STATUS.search(line))]
    return {"max_records_behind": max((r[0] for r in rows), default=0),
            "max_seconds_behind": max((r[1] for r in rows), default=0.0),
            "producer_replacements": rows[-1][2] if rows else 0,
            "max_stuck_producers_left_behind": max((r[3] for r in rows), default=0)}


def _schedule(rng: random.Random, duration_s: float, partition: bool, brokers: list[int]) -> list[Fault]:
    kinds = ["kill", "pause"] + (["partition"] if partition else [])
    faults, t, i = [], 2.0, 0
    while t < duration_s - 4:
        kind = kinds[i % len(kinds)] if not SOAK else rng.choice(kinds)
        length = rng.uniform(2.0, 4.0)
        broker = rng.choice(brokers)
        faults.append(Fault(i, t, length, kind, target=f"broker:{broker}",
                            shape="isolate-leader" if kind == "partition" else ""))
        t += length + rng.uniform(1.0, 3.0)
        i += 1
    return faults


def test_exactly_once_mirror_under_kills_pauses_and_partitions(tmp_path) -> None:
    duration = float(os.environ.get("RAFTKA_MIRROR_CHAOS_S", "300")) if SOAK else 24.0
    rng = random.Random(int(os.environ.get("RAFTKA_MIRROR_CHAOS_SEED", "7")))
    history = HistoryWriter(tmp_path / "history.jsonl")
    clusters, nemeses, cutters = {}, {}, []
    partition = link_cutting_unavailable() is None
    source_mode = os.environ.get("RAFTKA_MIRROR_CHAOS_SOURCE", "kraft")
    for side in ("src", "tgt"):
        mode = source_mode if side == "src" else "kraft"
        # A short ZooKeeper tick: a killed broker's session (and leadership) expires in seconds.
        cluster = LocalCluster(tmp_path / side, controllers=1, brokers=2, overrides=TWO, mode=mode,
                               zookeeper_tick_time_ms=500)
        cutter = None
        if partition:
            cutter = LinkCutter({n.node_id: n.port for n in cluster.nodes.values()}, tag=f"{os.getpid()}{side}")
            cluster.preexec = cutter.preexec
            cutter.set_up()
            cutters.append(cutter)
        clusters[side] = cluster
        nemeses[side] = Nemesis(cluster, history, rng, lambda p: None, lambda: None, cutter)
    mirror = None
    stop = threading.Event()
    acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    failed: list[str] = []
    try:
        for cluster in clusters.values():
            cluster.start_all()
        for cluster in clusters.values():
            cluster.wait_ready(120)
        src, tgt = clusters["src"].bootstrap, clusters["tgt"].bootstrap
        create_rf2(src, "chaos")

        def write() -> None:
            p = Producer({"bootstrap.servers": src, "linger.ms": 5, "acks": "all", "enable.idempotence": True,
                          "message.timeout.ms": 120000})

            def report(err, msg) -> None:
                if err is None:
                    acked[msg.partition()].append(msg.value())
                else:
                    failed.append(err.str())

            i = 0
            while not stop.is_set():
                p.produce("chaos", value=str(i).encode(), key=str(i % 7).encode(), partition=i % PARTITIONS,
                          on_delivery=report)
                i += 1
                p.poll(0.01)
            p.flush(180)

        mirror = MirrorProcess(tmp_path / "mirror.err", "--source", src, "--target", tgt, "--topics", "chaos",
                               "--instance", "m", "--set", "exactly.once.support=enabled", "--set",
                               "refresh.topics.interval.seconds=2", "--set", "replication.factor=2").start(120)
        writer = threading.Thread(target=write)
        writer.start()
        t0 = time.monotonic()
        brokers = {side: [b.node_id for b in c.brokers] for side, c in clusters.items()}
        plan = [(side, f) for side in ("src", "tgt") for f in _schedule(rng, duration, partition, brokers[side])]
        plan.sort(key=lambda sf: (sf[1].start, sf[0]))
        applied = []
        try:
            # one fault at a time across both clusters: the sides alternate
            for n, (side, fault) in enumerate(plan):
                at = t0 + fault.start + (0.5 if side == "tgt" else 0) + n * 0.01
                time.sleep(max(0.0, at - time.monotonic()))
                record = nemeses[side].start(fault)
                applied.append(f"{side}: {fault.describe()} -> {record['nodes']}")
                time.sleep(fault.duration)
                nemeses[side].stop(fault)
            time.sleep(max(0.0, t0 + duration - time.monotonic()))
        finally:
            for nemesis in nemeses.values():
                nemesis.heal_all()
            stop.set()
            writer.join(240)
        total = sum(map(len, acked.values()))
        # After the last fault the source may still be electing leaders: read it once it answers.
        source = wait_until(lambda: _answering(read_all, src, "chaos"), 120, "the source cluster answering")
        expected = sum(map(len, source.values()))
        try:
            wait_until(lambda: sum(map(len, read_committed(tgt, "source.chaos", PARTITIONS, 1.0).values()))
                       >= expected, 60, "every source record committed on the target")
        except AssertionError:
            pass  # counted below
        target = read_committed(tgt, "source.chaos", PARTITIONS, 3.0)
        lost_on_source = lost = duplicated = 0
        in_order = True
        for p in range(PARTITIONS):
            values = [r[2] for r in source[p]]
            lost_on_source += len(set(acked[p]) - set(values))
            lost += len(set(values) - set(target[p]))
            duplicated += len(target[p]) - len(set(target[p]))
            in_order &= [v for v in target[p] if v in set(values)] == values[:len(target[p])]
        summary = {"duration_s": duration, "source_mode": source_mode, "faults": applied, "acknowledged": total,
                   "source_records": expected,
                   "target_records": sum(map(len, target.values())), "failed_sends": len(failed),
                   "acked_lost_on_source": lost_on_source, "not_on_target": lost, "duplicated_on_target": duplicated,
                   "in_order": in_order, "positions_on_target": _positions(tgt),
                   **_lag_figures(mirror.reader.lines),
                   "mirror_errors": [line for line in mirror.reader.lines if line.startswith("[")
                                     and " mirroring: " not in line][-8:]}
        print("MIRROR CHAOS", json.dumps(summary))
        assert not lost_on_source, summary
        assert not lost and not duplicated and in_order, f"{summary}: {mirror.output()[-1500:]}"
        assert mirror.process.poll() is None, mirror.output()
        assert mirror.stop() == 0
    finally:
        stop.set()
        if mirror is not None:
            mirror.ensure_dead()
            (tmp_path / "mirror.out").write_text("\n".join(mirror.reader.lines) + "\n")
        for cluster in clusters.values():
            cluster.stop_all(20)
        for cutter in cutters:
            cutter.tear_down()


def _answering(read, *args):
    """read(*args), or None while the cluster does not answer."""
    try:
        return read(*args)
    except KafkaException:
        return None


def create_rf2(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 2)])[topic].result(60)


def _positions(bootstrap: str) -> dict[int, int]:
    """The source positions the mirror committed on the target with its transactions."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    group = "mirror-source-target"
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {p.partition: p.offset for p in result.topic_partitions}
