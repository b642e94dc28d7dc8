"""The operations features under the chaos harness's nemeses: one controller
and three brokers (two `log.dirs` each, metrics on) have their brokers (and
once the controller) paused (SIGSTOP/SIGCONT), cut off from every other node
(the nftables partition nemesis, when it can run here) and killed (SIGKILL,
restarted on their data) for about 90 s, one fault at a time, while:

- a confluent-kafka producer whose client id has a 1 MB/s
  `producer_byte_rate` quota tries to send 3 MB/s (acks=all) to one
  partition: every acknowledged record is read back, and over the whole
  quota windows (11 s) outside the faults its delivered rate
  is on average within 10% of the quota, and over the whole run at most the
  quota (+10%);
- DeleteRecords is sent every 12 s on a partition that takes appends: after
  the heal every replica's log start (ListOffsets EARLIEST with Kafka's
  debug replica id, answered by followers too) is at least the highest
  acknowledged deletion, and no consumer reads below it;
- a broker moves its replica of a partition to its other log dir
  (`raftka log-dirs move`, AlterReplicaLogDirs) while that broker is paused,
  cut off and killed: after the heal the replica is in the target dir
  (a killed broker drops an unfinished move at its restart, as documented,
  and the move is then asked again) and every acknowledged record is read back;
- every node's metrics endpoint is scraped every second: each running,
  unpaused node answers (a killed one once it first answered after its
  restart, within 60 s), the brokers' UnderReplicatedPartitions rise during
  every broker kill and partition and are back to 0 after the heal.

It prints one `OPERATIONS CHAOS {...}` line with the faults and the figures.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from prometheus_client.parser import text_string_to_metric_families
from wait_testing import wait_for

from chaos.history import HistoryWriter
from chaos.nemesis import LinkCutter, Nemesis, link_cutting_unavailable
from chaos.schedule import Fault
from cluster import LocalCluster

pytestmark = pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"),
                                reason="soak: set RAFTKA_SOAK=1 (about 3 minutes)")

SETTINGS = {
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "400",
    "replica.lag.time.max.ms": "3000",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "3",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}
QUOTA = 1_000_000  # producer_byte_rate, bytes/s
VALUE_SIZE = 10_000
FAULT_S = 5.0
GAP_S = 4.0
MOVING_PREFILL = 2000  # 1 kB records: 2 MB to copy at 128 kB/s, ~16 s of move (appends add 4 kB/s)
#: Kafka's quota window: 11 samples of 1 s.
QUOTA_WINDOW_S = 11.0
#: The quiet time after the last fault's heal.
TAIL_S = 26.0
#: A restarted node's endpoint answers once the process is up: within this (Python's start on a busy machine).
STARTUP_S = 60.0
URP = "kafka_server_replicamanager_underreplicatedpartitions"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "raftka.cli", *args], check=False, capture_output=True, text=True,
                          timeout=90, env=env)


def _scrape(node) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels}


def _log_starts(cluster, topic: str) -> dict[int, int]:
    """broker -> the log start offset of its replica of topic-0 (ListOffsets EARLIEST, replica id -2:
    Kafka's debug consumer, which any replica answers)."""
    import trio
    from kio.schema.list_offsets.v4 import request as lo

    from common.wire import open_connection

    request = lo.ListOffsetsRequest(replica_id=-2, isolation_level=0, topics=(lo.ListOffsetsTopic(
        name=topic, partitions=(lo.ListOffsetsPartition(partition_index=0, timestamp=-2),)),))

    async def ask(node):
        async with open_connection(node.host, node.port, client_id="log-start") as conn:
            answer = await conn.request(request)
        (p,) = answer.topics[0].partitions
        assert p.error_code == 0, f"broker {node.node_id}: ListOffsets error {p.error_code}"
        return p.offset

    return {node.node_id: trio.run(ask, node) for node in cluster.brokers}


def _read(bootstrap: str, topic: str, timeout_s: float = 120) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of topic-0, from its log start to its high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    out: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = False
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                if m.error() is not None:
                    done = m.error().code() == -191  # _PARTITION_EOF
                    continue
                out.append((m.offset(), m.value()))
            if done:
                break
        return out
    finally:
        consumer.close()


def _schedule(brokers: list[int], controller: int) -> list[Fault]:
    """Each broker paused, cut off and killed; the mover (brokers[0]) first, while its move runs."""
    x, b, c = brokers
    plan = [("pause", b), ("pause", x), ("partition", x), ("kill", x), ("kill", b), ("partition", c),
            ("kill", c), ("partition", b), ("pause", c), ("pause", controller)]
    faults = []
    for i, (kind, node) in enumerate(plan):
        role = "controller" if node == controller else "broker"
        faults.append(Fault(i, 4.0 + i * (FAULT_S + GAP_S), FAULT_S, kind, target=f"{role}:{node}",
                            shape="isolate-leader" if kind == "partition" else ""))
    return faults


def test_quotas_delete_records_log_dir_moves_and_metrics_under_pause_partition_and_kill(tmp_path) -> None:
    history = HistoryWriter(tmp_path / "history.jsonl")
    partition_ok = link_cutting_unavailable() is None
    cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=3, overrides=SETTINGS, metrics=True,
                           log_dirs_per_broker=2,
                           broker_overrides={"replica.alter.log.dirs.io.max.bytes.per.second": str(128 * 1024)})
    cutter = None
    if partition_ok:
        cutter = LinkCutter({n.node_id: n.port for n in cluster.nodes.values()}, tag=f"{os.getpid()}ops")
        cluster.preexec = cutter.preexec
        cutter.set_up()
    nemesis = Nemesis(cluster, history, random.Random(40), lambda p: None, lambda: None, cutter)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for topic in ("capped", "purged", "moving"):
            admin.create_topics([NewTopic(topic, 1, 3)], operation_timeout=30)[topic].result(60)
        said = _cli("quotas", "alter", "-b", bootstrap, "--client", "capped",
                    "--add-config", f"producer_byte_rate={QUOTA}")
        assert said.returncode == 0, said.stderr
        brokers = [b.node_id for b in cluster.brokers]
        mover = brokers[0]
        dirs = cluster.broker_log_dirs(cluster.node(mover), 2)

        # -- the quota'd producer: tries 3 MB/s, records every acknowledgement's time
        capped_acked: list[tuple[float, int, bytes]] = []
        capped_errors: list[str] = []

        def capped() -> None:
            p = Producer({"bootstrap.servers": bootstrap, "client.id": "capped", "acks": "all",
                          "enable.idempotence": True, "linger.ms": 5, "batch.size": 100_000,
                          "queue.buffering.max.kbytes": 512, "message.timeout.ms": 300_000})

            def report(err, msg) -> None:
                if err is None:
                    capped_acked.append((time.monotonic(), msg.offset(), msg.value()[:12]))
                else:
                    capped_errors.append(err.str())

            i, next_send = 0, time.monotonic()
            while not stop.is_set():
                if time.monotonic() >= next_send:
                    try:
                        p.produce("capped", value=b"c%011d" % i + b"x" * (VALUE_SIZE - 12), partition=0,
                                  on_delivery=report)
                        i += 1
                        next_send += VALUE_SIZE / (3 * QUOTA)
                    except BufferError:
                        pass  # the client's queue is full: the broker is holding it back
                p.poll(0.001)
            p.flush(300)

        # -- plain producers of the purged and the moving partitions
        acked: dict[str, list[tuple[int, bytes]]] = {"purged": [], "moving": []}
        errors: dict[str, list[str]] = {"purged": [], "moving": []}

        def writer(topic: str, per_s: float, size: int, start: int = 0) -> None:
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                          "linger.ms": 5, "message.timeout.ms": 300_000})

            def report(err, msg) -> None:
                if err is None:
                    acked[topic].append((msg.offset(), msg.value()[:12]))
                else:
                    errors[topic].append(err.str())

            i = start
            while not stop.is_set():
                p.produce(topic, value=b"%s%010d" % (topic[:1].encode() * 2, i) + b"y" * (size - 12),
                          partition=0, on_delivery=report)
                i += 1
                p.poll(1 / per_s)
            p.flush(300)

        prefill = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
        for i in range(MOVING_PREFILL):
            prefill.produce("moving", value=b"pre%09d" % i + b"z" * 988, partition=0,
                            on_delivery=lambda err, msg: err is None and acked["moving"].append(
                                (msg.offset(), msg.value()[:12])))
            prefill.poll(0)
        assert prefill.flush(60) == 0

        # -- DeleteRecords every 12 s, a little below the acknowledged end
        deletions: list[tuple[float, int]] = []  # (acknowledged at, low watermark)
        deletion_errors: list[str] = []

        def deleter() -> None:
            while not stop.wait(12):
                if len(acked["purged"]) < 100:
                    continue
                target = max(o for o, _ in acked["purged"][-100:]) - 50
                try:
                    (future,) = admin.delete_records([TopicPartition("purged", 0, target)],
                                                     request_timeout=15, operation_timeout=15).values()
                    deletions.append((time.monotonic(), future.result(timeout=30).low_watermark))
                except Exception as exc:  # noqa: BLE001 - timed out under a fault: not acknowledged, checked anyway
                    deletion_errors.append(f"{target}: {exc}")

        # -- a consumer that polls the purged partition throughout
        live_reads: list[tuple[float, int]] = []

        def live_consumer() -> None:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "live", "enable.auto.commit": False,
                          "auto.offset.reset": "earliest", "queued.max.messages.kbytes": 64})
            c.assign([TopicPartition("purged", 0, OFFSET_BEGINNING)])
            while not stop.is_set():
                for m in c.consume(num_messages=100, timeout=0.5):
                    if m.error() is None:
                        live_reads.append((time.monotonic(), m.offset()))
            c.close()

        # -- every node scraped every second
        scrape_failures: list[str] = []
        urp_seen: list[tuple[float, float]] = []  # (time, URP summed over the answering brokers)
        restarted_at: dict[int, float] = {}
        scrapes = [0]
        capped_leaders: list[tuple[float, int]] = []

        def scraper() -> None:
            while not stop.wait(1.0):
                total = 0.0
                for node in cluster.nodes.values():
                    n = node.node_id
                    starting = n in restarted_at and time.monotonic() - restarted_at[n] < STARTUP_S
                    if n in nemesis.paused or not node.is_running() or \
                            (n in restarted_at and time.monotonic() < restarted_at[n]):
                        continue
                    try:
                        samples = _scrape(node)
                        scrapes[0] += 1
                        restarted_at.pop(n, None)  # up: from now on it answers every scrape
                        if node.role == "broker":
                            total += samples.get(URP, 0.0)
                    except Exception as exc:  # noqa: BLE001 - judged below
                        # paused or killed while it was being scraped: not the endpoint's fault
                        if n not in nemesis.paused and n not in nemesis.killed and node.is_running() \
                                and not starting:
                            scrape_failures.append(f"{time.monotonic() - t0:.1f}s node {n}: {exc!r}")
                urp_seen.append((time.monotonic(), total))
                try:  # the capped partition's leader: its quota sensor is that broker's
                    (part,) = admin.list_topics("capped", timeout=5).topics["capped"].partitions.values()
                    capped_leaders.append((time.monotonic(), part.leader))
                except Exception:  # noqa: BLE001, S110 - no answer this second; the next sweep asks again
                    pass

        t0 = time.monotonic()
        for target, args in ((capped, ()), (writer, ("purged", 100, 200)), (writer, ("moving", 20, 200, 10**6)),
                             (deleter, ()), (live_consumer, ()), (scraper, ())):
            threads.append(threading.Thread(target=target, args=args, daemon=True))
            threads[-1].start()

        faults = _schedule(brokers, cluster.controllers[0].node_id)
        if not partition_ok:
            faults = [f for f in faults if f.kind != "partition"]
        windows: list[tuple[str, int, float, float]] = []
        applied: list[str] = []
        move_said = None
        source = target_dir = None
        for fault in faults:
            if move_said is None and fault.start >= 13.0:
                # Before the mover's pause: the move runs through its pause, cut-off and kill.
                time.sleep(max(0.0, t0 + 10.0 - time.monotonic()))
                (source,) = [d for d in dirs if (d / "moving-0").is_dir()]
                (target_dir,) = [d for d in dirs if d != source]
                move_said = _cli("log-dirs", "move", "-b", bootstrap, "--broker", str(mover), "--topic", "moving",
                                 "--partition", "0", "--log-dir", str(target_dir))
                assert move_said.returncode == 0, move_said.stderr
            time.sleep(max(0.0, t0 + fault.start - time.monotonic()))
            began = time.monotonic()
            if fault.kind == "kill":  # its endpoint is judged again once it answered after its restart
                restarted_at[int(fault.target.split(":")[1])] = began + fault.duration
            nemesis.start(fault)
            time.sleep(fault.duration)
            nemesis.stop(fault)
            ended = time.monotonic()
            windows.append((fault.kind, int(fault.target.split(":")[1]), began, ended))
            applied.append(f"{fault.start:.0f}s {fault.kind} {fault.target}")
        # A quiet end long enough for whole quota windows (11 s) with no fault in them.
        time.sleep(max(0.0, t0 + faults[-1].start + FAULT_S + TAIL_S - time.monotonic()))
        nemesis.heal_all()
        healed = time.monotonic()
        stop.set()
        for thread in threads:
            thread.join(320)

        # -- metrics: URP back to 0 on every broker
        def urp_zero():
            return all(_scrape(b).get(URP) == 0 for b in cluster.brokers)

        wait_for("UnderReplicatedPartitions back to 0 on every broker", urp_zero, 90)

        # -- the move: the replica in the target dir (asked again if a kill dropped it)
        reissued = 0

        def moved() -> bool:
            return (target_dir / "moving-0").is_dir() and not (source / "moving-0").is_dir() and \
                not list(target_dir.glob("moving-0*-future")) and not list(source.glob("moving-0*-future"))

        try:
            wait_for("the moved replica in its target dir", moved, 30)
        except AssertionError:
            reissued += 1
            again = _cli("log-dirs", "move", "-b", bootstrap, "--broker", str(mover), "--topic", "moving",
                         "--partition", "0", "--log-dir", str(target_dir))
            assert again.returncode == 0, again.stderr
            wait_for("the moved replica in its target dir after the move was asked again", moved, 120)

        # -- DeleteRecords: every replica's log start at the last acknowledged deletion
        low = max((lw for _, lw in deletions), default=0)
        starts = wait_for(f"every replica's log start at {low} or beyond",
                          lambda: (s := _log_starts(cluster, "purged")) and min(s.values()) >= low and s, 60)
        last_ack = max((t for t, _ in deletions), default=0.0)
        below = [(round(t - t0, 1), o) for t, o in live_reads
                 if o < max((lw for ta, lw in deletions if ta + 5 < t), default=0)]
        purged_read = _read(bootstrap, "purged")
        kp = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                           group_id=None, consumer_timeout_ms=30000)
        kp.assign([KpTopicPartition("purged", 0)])
        kp.seek_to_beginning()
        kp_first = next(iter(kp)).offset
        kp.close()

        # -- every acknowledged record readable
        lost = {}
        reads = {"purged": purged_read, "moving": _read(bootstrap, "moving"), "capped": _read(bootstrap, "capped")}
        wanted = {"purged": [(o, v) for o, v in acked["purged"] if o >= low], "moving": acked["moving"],
                  "capped": [(o, v) for _, o, v in capped_acked]}
        for topic, records in wanted.items():
            at = {o: v[:12] for o, v in reads[topic]}
            lost[topic] = [(o, v) for o, v in records if at.get(o) != v]

        # -- the quota between faults: from 1 s after a heal to the next fault
        def delivered(a: float, b: float) -> float:
            return sum(VALUE_SIZE for t, _, _ in capped_acked if a <= t < b)

        quiet = [(w[3] + 1.0, nxt[2]) for w, nxt in itertools.pairwise(windows)]
        quiet.append((windows[-1][3] + 1.0, healed))
        quiet_rates = [round(delivered(a, b) / (b - a)) for a, b in quiet]
        quiet_rate = sum(delivered(a, b) for a, b in quiet) / sum(b - a for a, b in quiet)
        whole_rate = delivered(t0, healed) / (healed - t0)
        # Quotas are per broker, as Kafka's, and held over the broker's window (11 s): a
        # leader's window that a fault left short of bytes lets a catch-up burst through, and
        # a new leader's young sensor a first one (Kafka's padded 10 s span). So the rate is
        # measured over whole windows of 11 s outside every fault (from 1 s after its heal)
        # with one leader throughout, and judged over the quiet end.
        outside = [(a, b) for a, b in quiet if b - a >= QUOTA_WINDOW_S]

        def one_leader(a: float, b: float) -> bool:
            return len({n for t, n in capped_leaders if a - 1 <= t <= b}) == 1

        window_starts = [(a, s) for a, b in outside for s in (a + k for k in range(int(b - a - QUOTA_WINDOW_S) + 1))
                  if one_leader(s, s + QUOTA_WINDOW_S)]
        window_rates = [delivered(s, s + QUOTA_WINDOW_S) / QUOTA_WINDOW_S for _, s in window_starts]
        steady_rates = [delivered(s, s + QUOTA_WINDOW_S) / QUOTA_WINDOW_S for a, s in window_starts
                        if s >= a + QUOTA_WINDOW_S and one_leader(a, s + QUOTA_WINDOW_S)]
        # A client far over its quota is let through in bursts of about a window's quota as
        # the leader's samples expire (Kafka's sampled rate), and acknowledgements of records
        # taken during a fault (waiting for the ISR) arrive after its heal: single windows
        # measured at the client vary (0.7 to 1.3 of the quota seen); their mean is judged.
        tail = outside[-1] if outside and outside[-1][1] == healed else None
        tail_rate = delivered(*tail) / (tail[1] - tail[0]) if tail and one_leader(*tail) else None
        (tmp_path / "capped-acks.json").write_text(json.dumps(
            {"t0": t0, "windows": windows, "leaders": capped_leaders, "acks": [t for t, _, _ in capped_acked]}))

        # -- URP rose during each broker kill and partition, or soon after its heal: a cut-off
        # leader cannot shrink its ISR without the controller, and the others count a partition
        # under-replicated once they lead it (the cut-off broker fenced) or while it catches up.
        urp_missed = [f"{k} {n}" for k, n, a, b in windows if k in ("kill", "partition") and n in brokers
                      and not any(v > 0 for t, v in urp_seen if a <= t <= b + 8)]

        summary = {
            "faults": applied, "partition_nemesis": partition_ok,
            "capped": {"acknowledged": len(capped_acked), "errors": capped_errors[:5], "lost": len(lost["capped"]),
                       "quiet_rate": round(quiet_rate), "quiet_window_rates": quiet_rates,
                       "whole_run_rate": round(whole_rate),
                       "whole_windows_outside_faults": len(window_rates),
                       "max_window_rate": round(max(window_rates, default=0)),
                       "min_window_rate": round(min(window_rates, default=0)),
                       "mean_window_rate": window_rates and round(sum(window_rates) / len(window_rates)),
                       "steady_window_rates": [round(r) for r in steady_rates],
                       "tail_s": tail and round(tail[1] - tail[0], 1), "tail_rate": tail_rate and round(tail_rate)},
            "delete_records": {"acknowledged": [lw for _, lw in deletions], "not_acknowledged": deletion_errors,
                               "log_starts": starts, "first_read": purged_read[0][0] if purged_read else None,
                               "kafka_python_first": kp_first, "live_reads_below": below[:5],
                               "purged_acknowledged": len(acked["purged"]), "lost": len(lost["purged"])},
            "move": {"from": str(source), "to": str(target_dir), "asked_again": reissued,
                     "acknowledged": len(acked["moving"]), "lost": len(lost["moving"])},
            "metrics": {"scrapes": scrapes[0], "failures": scrape_failures[:5], "failure_count": len(scrape_failures),
                        "max_urp": max((v for _, v in urp_seen), default=0), "urp_not_seen_in": urp_missed},
            "crashes": sorted(nemesis.crashed), "producer_errors": {k: v[:3] for k, v in errors.items()},
        }
        print("OPERATIONS CHAOS", json.dumps(summary))
        (tmp_path / "summary.json").write_text(json.dumps(summary, indent=1))
        assert not any(lost.values()), summary
        assert not capped_errors and not errors["purged"] and not errors["moving"], summary
        assert deletions, summary
        assert min(starts.values()) >= low and purged_read[0][0] >= low and kp_first >= low, summary
        assert not below, summary
        assert whole_rate <= 1.1 * QUOTA, summary
        assert window_rates and abs(sum(window_rates) / len(window_rates) - QUOTA) <= 0.1 * QUOTA, summary
        assert not scrape_failures, summary
        assert not urp_missed, summary
        assert not nemesis.crashed, summary
        assert last_ack > 0
    finally:
        stop.set()
        nemesis.heal_all()
        for thread in threads:
            thread.join(5)
        cluster.stop_all(20)
        if cutter is not None:
            cutter.tear_down()
