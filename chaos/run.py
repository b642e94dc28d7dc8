"""One chaos run, end to end: cluster, workload and nemeses, heal, read back, check, report.

    run(RunOptions(...)) -> RunOutcome   (exit status 0 only when nothing was found)

Steps, each logged to the console:

1. The link cutter (partition nemesis) tags every node's connections from
   its first one: it is set up before the cluster starts.
2. A LocalCluster starts in `out/cluster` (KRaft or ZooKeeper mode) with short
   failure-detection timeouts, and the workload's topic is created.
3. The workload runs for `duration` seconds while the nemesis applies the
   seeded schedule (chaos.schedule), one fault at a time.
4. Everything is healed (links restored, processes resumed and restarted),
   the cluster must become ready again, the producers stop and drain, the
   consumers catch up; then a fresh consumer reads every partition.
5. The cluster stops; the controllers' logs and metadata logs are checked
   (chaos.safety); the history is checked (chaos.checker).
6. out/: history.jsonl, report.json, report.md, report.png, clients.log,
   and the cluster's data and logs under cluster/.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from chaos import checker
from chaos.history import HistoryWriter
from chaos.nemesis import (
    CLOCK_FILE,
    DISK_FAULT_FILE,
    FILL_FILE,
    Clocks,
    DiskFaults,
    Disks,
    LinkCutter,
    Nemesis,
    sleep_until,
)
from chaos.schedule import Fault, Shape, make_schedule
from chaos.txn_workload import TRANSACTION_TIMEOUT_MS, TxnOptions, TxnWorkload
from chaos.workload import (
    MESSAGE_TIMEOUT_MS,
    PartitionLeaders,
    QueueOptions,
    QueueWorkload,
    create_topic,
    final_read,
    final_read_kafka_python,
)
from cluster.launcher import ClusterError, LocalCluster

#: Failure detection in seconds, not Kafka's tens of seconds: a short run sees recoveries.
CLUSTER_SETTINGS = {
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "400",
    "replica.lag.time.max.ms": "3000",
    "replica.fetch.backoff.ms": "200",
    "offsets.topic.replication.factor": "3",
    "zookeeper.session.timeout.ms": "6000",
    # The txn workload: a few coordinator partitions (not 50) to recover after each
    # fault, and a transaction whose producer vanished aborted soon after its timeout.
    "transaction.state.log.num.partitions": "3",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    # Consumer-protocol (KIP-848) members fenced after 10 s without a
    # heartbeat, not 45 s: a paused or cut-off member's partitions move within a fault.
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.heartbeat.interval.ms": "1000",
}
WORKLOADS = ("queue", "txn", "group")
#: Members of the `group` workload's consumer group, and how often its last
#: member leaves the group and joins again (seconds).
GROUP_MEMBERS = 3
GROUP_MEMBER_REJOIN_S = 20.0


#: With --secure: the SASL_SSL listeners' connections.max.reauth.ms.
SECURE_SESSION_MS = 10000


@dataclasses.dataclass
class RunOptions:
    out: Path
    mode: str = "kraft"
    quorum_engine: str = "raftka"
    #: KIP-853: controllers found through controller.quorum.bootstrap.servers, voters in the log.
    dynamic_quorum: bool = False
    controllers: int = 3
    brokers: int = 3
    duration: float = 120.0
    nemeses: tuple[str, ...] = ("kill", "pause", "partition")
    workload: str = "queue"
    #: The workload's group consumers: classic, consumer (KIP-848), or (queue workload)
    #: mixed or mixed-static (online migrations).
    group_protocol: str = "classic"
    seed: int = 0
    partitions: int = 3
    rate: float = 40.0
    message_timeout_ms: int = MESSAGE_TIMEOUT_MS
    #: Clients on each broker's SASL_SSL listener (SCRAM-SHA-512 admin, a throwaway CA), as `cluster up --secure`.
    secure: bool = False
    quiet_s: tuple[float, float] = (3.0, 6.0)
    fault_s: tuple[float, float] = (4.0, 10.0)
    recovery_timeout_s: float = 90.0
    #: Log dirs per broker: with 2 or more, `eio` fails one broker's last
    #: dir only (it goes offline, the broker serves on from the others).
    log_dirs: int = 1


@dataclasses.dataclass
class RunOutcome:
    valid: bool
    report: dict[str, Any]
    out: Path

    @property
    def exit_code(self) -> int:
        return 0 if self.valid else 1


def command_line(o: RunOptions) -> str:
    return (f"raftka chaos run --mode {o.mode} --controllers {o.controllers} --brokers {o.brokers} "
            + ("" if o.quorum_engine == "raftka" else f"--quorum-engine {o.quorum_engine} ")
            + ("--dynamic-quorum " if o.dynamic_quorum else "") +
            f"--duration {o.duration:g} --nemesis {','.join(o.nemeses) or 'none'} --workload {o.workload} "
            + ("" if o.group_protocol == "classic" else f"--group-protocol {o.group_protocol} ") +
            f"--seed {o.seed}" + ("" if o.message_timeout_ms == MESSAGE_TIMEOUT_MS
                                  else f" --message-timeout-ms {o.message_timeout_ms}")
            + ("" if o.log_dirs == 1 else f" --log-dirs {o.log_dirs}")
            + (" --secure" if o.secure else ""))


def run(o: RunOptions, say: Any = print, tick: Any = None) -> RunOutcome:
    """`say(text)` is told each step and fault; `tick(elapsed_s, duration_s, counts)`, every
    half second of the workload, the history's counts by (f, type)."""
    if o.workload not in WORKLOADS:
        raise ClusterError(f"workload {o.workload!r}: choose from {', '.join(WORKLOADS)}")
    o.out.mkdir(parents=True, exist_ok=True)
    if (o.out / "cluster" / "cluster.json").exists():
        _unmount_under(o.out / "cluster")  # a disk nemesis' tmpfs an interrupted run left
        shutil.rmtree(o.out / "cluster")  # an earlier run's cluster: every run starts a fresh one
    history_path = o.out / "history.jsonl"
    if history_path.exists():
        history_path.unlink()
    history = HistoryWriter(history_path)
    rng = random.Random(o.seed)
    controller_ids = tuple(range(1, o.controllers + 1)) if o.mode == "kraft" else ()
    broker_ids = tuple(range(o.controllers + 1, o.controllers + o.brokers + 1))
    shape = Shape(o.mode, controller_ids, broker_ids, o.partitions)
    schedule = make_schedule(rng, list(o.nemeses), o.duration, shape, quiet_s=o.quiet_s, fault_s=o.fault_s)
    say(f"seed {o.seed}: {len(schedule)} faults scheduled: "
        + "; ".join(f"{f.start:.0f}s {f.describe()} {f.duration:.0f}s" for f in schedule))

    disks = None
    if "disk" in o.nemeses:
        # The brokers' log dirs become small tmpfs mounts before the cluster formats them.
        disks = Disks({b: o.out / "cluster" / f"broker-{b}" for b in broker_ids})
        disks.set_up()
    settings = dict(CLUSTER_SETTINGS)
    clocks = None
    if "clock" in o.nemeses:
        # Each broker's wall clock offset, read from this file in its log dir (tests only).
        settings["raftka.test.clock.offset.file"] = CLOCK_FILE
    if o.secure:
        # Client sessions of 10 s (KIP-368): librdkafka re-authenticates several times under the faults.
        settings["listener.name.sasl_ssl.connections.max.reauth.ms"] = str(SECURE_SESSION_MS)
    if "eio" in o.nemeses:
        # Each broker's disk fault (EIO on its partition logs' writes), read from this file (tests only).
        settings["raftka.test.disk.fault.file"] = DISK_FAULT_FILE
    try:
        cluster = LocalCluster(o.out / "cluster", controllers=o.controllers, brokers=o.brokers, mode=o.mode,
                               broker_overrides=settings, log_dirs_per_broker=o.log_dirs, secure=o.secure,
                               dynamic_quorum=o.dynamic_quorum,
                               overrides={} if o.quorum_engine == "raftka" else {"quorum.engine": o.quorum_engine})
    except BaseException:
        if disks is not None:
            disks.tear_down()
        raise
    if "clock" in o.nemeses:
        clocks = Clocks({b.node_id: b.log_dir for b in cluster.brokers})
    disk_faults = DiskFaults({b.node_id: b.log_dir for b in cluster.brokers},
                             {b.node_id: cluster.broker_log_dirs(b, o.log_dirs)[-1] for b in cluster.brokers}
                             if o.log_dirs > 1 else None) if "eio" in o.nemeses else None
    cutter = None
    if "partition" in o.nemeses:
        # A broker's secure listener (--secure) carries its replication links: cut it too.
        cutter = LinkCutter({n.node_id: tuple(dict.fromkeys((n.port, cluster.secure_ports.get(n.node_id, n.port))))
                             for n in cluster.nodes.values()})
        cluster.preexec = cutter.preexec
    timeline: dict[str, float] = {}
    safety: dict[str, Any] = {}
    harness_errors: list[str] = []
    rf = min(3, o.brokers)
    security = {}
    if o.secure:
        security = cluster.secure_client_config()
        security.pop("bootstrap.servers")
    common = {"bootstrap": cluster.secure_bootstrap if o.secure else cluster.bootstrap, "security": security,
              "partitions": o.partitions, "replication_factor": rf,
              "min_insync_replicas": min(2, rf), "message_timeout_ms": o.message_timeout_ms,
              "group_id": f"chaos-{o.seed}", "group_protocol": o.group_protocol}
    workload: QueueWorkload
    if o.workload == "txn":
        # --rate is the sends per second of each producer; a transaction holds about three.
        queue = TxnOptions(**common, seed=o.seed, transactions_per_second=max(0.5, o.rate / 8))
        workload = TxnWorkload(queue, history, str(o.out / "clients.log"))  # type: ignore[arg-type]
    else:
        members = GROUP_MEMBERS if o.workload == "group" else 1
        queue = QueueOptions(**common, rate_per_producer=o.rate, group_members=members,
                             member_rejoin_s=GROUP_MEMBER_REJOIN_S if o.workload == "group" else 0.0)
        workload = QueueWorkload(queue, history, str(o.out / "clients.log"))
    nemesis: Nemesis | None = None
    try:
        if cutter is not None:
            cutter.set_up()
        say(f"starting a {o.mode} cluster: {o.controllers} controllers, {o.brokers} brokers in {cluster.base_dir}")
        cluster.start_all()
        cluster.wait_ready(timeout_s=120)
        create_topic(queue, str(o.out / "clients.log"))
        leaders = PartitionLeaders(queue, str(o.out / "clients.log"))
        nemesis = Nemesis(cluster, history, random.Random(rng.getrandbits(64)), leaders.leader_of,
                          lambda: active_controller(cluster), cutter, disks, clocks, disk_faults)
        say(f"workload {o.workload} on {queue.partitions} partitions (rf {rf}) for {o.duration:g} s")
        t0 = time.monotonic()
        timeline["start"] = t0
        workload.start()
        stop = threading.Event()
        failures: list[str] = []
        runner = threading.Thread(target=_apply_schedule, args=(nemesis, schedule, t0, stop, failures, say),
                                  name="nemesis", daemon=True)
        runner.start()
        while time.monotonic() < t0 + o.duration:
            time.sleep(max(0.0, min(0.5, t0 + o.duration - time.monotonic())))
            if tick is not None:
                tick(time.monotonic() - t0, o.duration, dict(history.counts))
        stop.set()
        runner.join(timeout=60)
        harness_errors += failures
        say("healing everything; waiting for the cluster to recover")
        nemesis.heal_all()
        timeline["healed"] = time.monotonic()
        try:
            cluster.wait_ready(timeout_s=o.recovery_timeout_s)
            timeline["recovered"] = time.monotonic()
        except ClusterError as exc:
            harness_errors.append(f"the cluster did not recover within {o.recovery_timeout_s:g} s: "
                                  + str(exc).splitlines()[0])
        time.sleep(2.0)  # the healthy cluster serves the workload a moment before it stops
        say("stopping the workload (outstanding sends drain, consumers catch up)")
        # A group fences a member lost in a fault only after its session
        # timeout, then moves its partitions: give the members time for that.
        workload.stop(drain_s=40.0 if o.workload == "group" else 15.0)
        harness_errors += workload.errors
        say("reading every partition back")
        missing = final_read(queue, history, str(o.out / "clients.log"))
        if missing:
            harness_errors.append(f"the final read (confluent-kafka) did not cover partitions {missing}")
        missing = final_read_kafka_python(queue, history)
        if missing:
            harness_errors.append(f"the final read (kafka-python) did not cover partitions {missing}")
        if o.workload == "txn":
            timeout_s = TRANSACTION_TIMEOUT_MS / 1000 + 60  # an open transaction is aborted after its timeout
            missing = final_read(queue, history, str(o.out / "clients.log"), timeout_s=timeout_s,
                                 isolation="read_committed")
            if missing:
                harness_errors.append(f"the final read_committed read did not cover partitions {missing} "
                                      "(a transaction stayed open?)")
        timeline["end"] = time.monotonic()
    finally:
        if nemesis is not None:
            nemesis.heal_all()
        workload.stop_producers.set()
        workload.stop_consumers.set()
        cluster.stop_all(timeout_s=20)
        if cutter is not None:
            cutter.tear_down()
    try:
        record_replicas(history, cluster, queue)
    finally:
        history.close()
        if disks is not None:
            _keep_and_unmount(disks)
    if o.mode == "kraft":
        from chaos.safety import check_metadata

        safety = check_metadata({n.node_id: (n.log_dir, n.output_path) for n in cluster.controllers})
    else:
        from chaos.safety import check_zk_controllers

        safety = check_zk_controllers({n.node_id: n.output_path for n in cluster.brokers})
    result = checker.check(history.snapshot())
    from chaos.report import write_report

    report = write_report(o, schedule, history.snapshot(), result, safety, timeline, harness_errors,
                          command_line(o))
    valid = result.valid and bool(safety.get("valid")) and not harness_errors
    return RunOutcome(valid, report, o.out)


def _unmount_under(path: Path) -> None:
    root = str(path.resolve())
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    for mount in sorted(mounts, reverse=True):
        if mount == root or mount.startswith(root + "/"):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def _keep_and_unmount(disks: Disks) -> None:
    """Copy each tmpfs log dir to disk (the data stays for a look afterwards), then unmount."""
    for path in disks.dirs.values():
        try:
            (path / FILL_FILE).unlink(missing_ok=True)
            shutil.copytree(path, path.with_name(path.name + ".tmp"), symlinks=True)
        except OSError:
            pass
    disks.tear_down()
    for path in disks.dirs.values():
        copy = path.with_name(path.name + ".tmp")
        if copy.exists():
            shutil.rmtree(path, ignore_errors=True)
            copy.rename(path)


def record_replicas(history: HistoryWriter, cluster: LocalCluster, queue: QueueOptions) -> None:
    """From the stopped brokers' files: where replicas disagree below the final high
    watermark, where a replica's leader epochs go back, and how the values read at two
    offsets are stored (producer epochs)."""
    from chaos.on_disk import divergences, epoch_regressions, read_partition

    events = history.snapshot()
    highs = {e.partition: int(e.extra["high"]) for e in events if e.f == "final-range"}
    offsets_of: dict[tuple[int, str], set[int]] = {}
    for e in events:
        if e.f in ("poll", "final-read") and e.type == "ok":
            offsets_of.setdefault((e.partition, e.value), set()).add(e.offset)  # type: ignore[arg-type]
    brokers = {b.node_id: b.log_dir for b in cluster.brokers}
    for partition in range(queue.partitions):
        replicas = read_partition(brokers, queue.topic, partition)
        for found in divergences(replicas, highs.get(partition, 0)):
            history.record("harness", "info", "replica-divergence", partition=partition,
                           value=f"partition {partition} {found}")
        for found in epoch_regressions(replicas):
            history.record("harness", "info", "leader-epoch-regression", partition=partition,
                           value=f"partition {partition}: {found}")
        if not replicas:
            continue
        reference = max(replicas.items(), key=lambda kv: (len(kv[1]), -kv[0]))
        for (p, value), offsets in sorted(offsets_of.items()):
            if p != partition or len(offsets) < 2:
                continue
            for offset in sorted(offsets):
                r = reference[1].get(offset)
                if r is not None:
                    history.record("harness", "info", "stored", partition=partition, offset=offset, value=r.value,
                                   extra={"producer_id": r.producer_id, "producer_epoch": r.producer_epoch,
                                          "sequence": r.sequence, "broker": reference[0]})


def _apply_schedule(nemesis: Nemesis, schedule: list[Fault], t0: float, stop: threading.Event,
                    failures: list[str], say: Any) -> None:
    for fault in schedule:
        if not sleep_until(t0 + fault.start, stop.is_set):
            return
        applied = None
        try:
            applied = nemesis.start(fault)
            say(f"{time.monotonic() - t0:6.1f}s  {fault.describe()} on {applied.get('nodes')}")
        except Exception as exc:
            failures.append(f"fault {fault.index} ({fault.describe()}) could not be applied: {exc}")
        in_time = sleep_until(t0 + fault.end, stop.is_set)
        if applied is not None:
            try:
                nemesis.stop(fault)
                say(f"{time.monotonic() - t0:6.1f}s  healed {fault.describe()}")
            except Exception as exc:
                failures.append(f"fault {fault.index} ({fault.describe()}) could not be healed: {exc}")
        if not in_time:
            return


def active_controller(cluster: LocalCluster) -> int | None:
    """The KRaft quorum's leader (DescribeQuorum), or the broker ZooKeeper elected."""
    if cluster.mode == "zk":
        try:
            return cluster.zookeeper_controller(timeout_s=3)[0]
        except Exception:
            return None
    import trio

    from common.wire import open_connection
    from quorum.node.describe_quorum import (
        describe_quorum_request,
        parse_describe_quorum,
    )

    # With --secure the controllers' listener is SASL_SSL: log in as the nodes do.
    security = cluster.node_link_security()

    async def ask() -> int | None:
        for node in cluster.controllers:
            if not node.is_running():
                continue
            try:
                with trio.fail_after(2):
                    async with open_connection(node.host, node.port, connect_timeout_ms=1000,
                                               security=security) as conn:
                        response = await conn.request(describe_quorum_request(2), timeout_ms=1500)
                d = parse_describe_quorum(response)
                if d.error_code == 0 and d.leader_id >= 0:
                    return d.leader_id
            except Exception:
                continue
        return None

    return trio.run(ask)


def load_report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())
