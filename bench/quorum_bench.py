"""`raftka bench quorum`: the KRaft metadata quorum on three real controller processes.

What it measures (three `raftka controller` processes on loopback, default
timeouts, a fresh temp dir; the client is this process, speaking the Kafka
protocol to the active controller):

- **writes**: committed metadata records per second and commit latency
  (request sent -> answer after commit) p50/p99:
  * single-record writes: IncrementalAlterConfigs of one key of one topic
    (one ConfigRecord each), by 1 writer (latency) and by `--writers`
    concurrent writers (throughput);
  * 1,000-record batches: IncrementalAlterConfigs of one key on 1,000
    topics (1,000 ConfigRecords, decided and appended as one batch), by
    `--batch-writers` concurrent writers;
  * for each: the CPU time of the three controller processes per 1,000
    committed records, which, unlike the rate, does not depend on what
    else the machine is running.
  A broker stand-in registers and heartbeats first (topics need a usable
  broker), and 1,000 topics are created.
- **failover**: kill -9 the leader; the time until a write is committed by
  a new leader (the client retries every 5 ms at every voter); the killed
  voter is restarted and caught up before the next run. Median of
  `--failover-runs`.
- **catch-up**: 1,000-record batches until the log has seen `--catchup-records`
  records (snapshots are taken every `metadata.log.max.record.bytes.between.snapshots`
  bytes, default 20 MiB, and the log before them deleted); then a fresh
  observer (a `RaftNode` in this process, empty log dir) fetches the
  snapshot and the tail: seconds until it has applied the leader's high
  watermark as of its start.

With `--quorum-engine pysyncobj` the three controllers run pysyncobj's
Raft (quorum.engine) instead of raftka's own; rows carry the engine.

With `--mode zk` (writes only) the same writes go to a 3-server ZooKeeper
ensemble, as a ZooKeeper-mode broker makes them for IncrementalAlterConfigs
(`quorum.zookeeper.admin.set_topic_config`, Kafka's AdminZkClient: the
topic's config znode, then a change notification znode): single-record
writes by 1 and by `--writers` threads, and 1,000-topic requests (1,000
such changes one after the other) by `--batch-writers` threads, on one
kazoo session; rows carry engine=zookeeper and the CPU of the ZooKeeper
servers. The controller failover of ZooKeeper mode is `raftka bench
controller-failover --mode zk`.

Targets (ARCHITECTURE/issue #3): failover median <= 1.5 s; >= 20,000
records/s batched; catch-up <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.cli import add_common_options

SCENARIO = "quorum"
ZK_RECORD = "topic config znode + change notification (AdminZkClient)"
TOPICS = 1000
CONFIG_KEY = "retention.ms"
#: A controller process's start (imports included) can take over 20 s on a machine shared with other work.
START_TIMEOUT_S = 90.0


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser("quorum", help="KRaft quorum: metadata write rate and latency, failover, catch-up")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per write measurement (default 5)")
    p.add_argument("--writers", type=int, default=64, help="concurrent single-record writers (default 64)")
    p.add_argument("--batch-writers", type=int, default=24, help="concurrent 1,000-record writers (default 24)")
    p.add_argument("--failover-runs", type=int, default=5, help="kill -9 rounds (default 5; median reported)")
    p.add_argument("--catchup-records", type=int, default=1_000_000,
                   help="records in the log before the observer starts (default 1,000,000)")
    p.add_argument("--snapshot-bytes", type=int, default=None,
                   help="metadata.log.max.record.bytes.between.snapshots for the controllers (default Kafka's 20 MiB)")
    p.add_argument("--only", default=None,
                   help="comma-separated subset of writes,failover,catchup (default all three; writes with --mode zk)")
    p.add_argument("--mode", choices=("kraft", "zk"), default="kraft",
                   help="kraft: 3 controllers (default); zk: the writes on a 3-server ZooKeeper ensemble")
    p.add_argument("--quorum-engine", choices=("raftka", "pysyncobj"), default="raftka",
                   help="the controllers' Raft (quorum.engine): raftka's own (default) or pysyncobj's")
    p.add_argument("--dir", default=None,
                   help="where the controllers' data dirs go (made if missing; default: system temp)")
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import trio
    from rich.console import Console

    console = Console(stderr=True)
    only = args.only or ("writes" if args.mode == "zk" else "writes,failover,catchup")
    phases = {s.strip() for s in only.split(",") if s.strip()}
    unknown = phases - {"writes", "failover", "catchup"}
    if unknown:
        raise SystemExit(f"raftka bench quorum: unknown --only parts {sorted(unknown)}")
    if args.mode == "zk" and (phases != {"writes"} or args.quorum_engine != "raftka"):
        raise SystemExit("raftka bench quorum --mode zk measures the writes only (--only writes; ZooKeeper mode's "
                         "controller failover is `raftka bench controller-failover --mode zk`) and takes no "
                         "--quorum-engine (a KRaft controllers' setting)")
    if (args.duration <= 0 or args.writers < 1 or args.batch_writers < 1 or args.failover_runs < 1
            or args.catchup_records < 0 or (args.snapshot_bytes is not None and args.snapshot_bytes < 1)):
        raise SystemExit("raftka bench quorum: --duration, --writers, --batch-writers, --failover-runs and "
                         "--snapshot-bytes must be positive, --catchup-records at least 0")
    with tempfile.TemporaryDirectory(prefix="raftka-bench-quorum-", dir=args.dir) as tmp:
        if args.mode == "zk":
            rows, samples = _zk_writes(args, tmp, console)
        else:
            rows, samples = trio.run(_bench, args, phases, tmp, console)
    engine = "zookeeper" if args.mode == "zk" else args.quorum_engine
    for params in [r["params"] for r in rows] + [s[0] for s in samples]:
        params.setdefault("engine", engine)  # rows carry the engine, for the three-way report
    for row in rows:
        row["mode"] = args.mode
    _report(args, rows, samples, console)
    return 0


def _row(params: dict, metric: str, value: float, unit: str) -> dict:
    return {"scenario": SCENARIO, "mode": "kraft", "params": params, "metric": metric, "value": value, "unit": unit}


def _zk_writes(args: argparse.Namespace, tmp: str, console: Any) -> tuple[list, list]:
    """The writes of `_writes` on a 3-server ZooKeeper ensemble (see the module docstring)."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from kazoo.client import KazooClient

    from bench.histogram import percentiles
    from bench.proc_stats import cpu_seconds
    from quorum.zookeeper import admin
    from quorum.zookeeper.ensemble import ZooKeeperEnsemble

    rows: list[dict] = []
    samples: list[tuple[dict, str, list[float]]] = []
    ensemble = ZooKeeperEnsemble(Path(tmp) / "zookeeper", 3)
    zk = None
    try:
        ensemble.start(START_TIMEOUT_S)
        zk = KazooClient(hosts=ensemble.connect_string, timeout=10.0)
        zk.start(timeout=30)
        topics = [f"bench-{i:04d}" for i in range(TOPICS)]
        for name in topics:
            admin.create_topic(zk, name, {0: (1,)})
        console.print(f"3 ZooKeeper servers up, {TOPICS} topics created")

        def servers_cpu_s() -> float:
            return sum(cpu_seconds(s.process.pid) for s in ensemble.servers if s.running and s.process)

        def load(write: Any, per_request: int, writers: int) -> tuple[int, float, list[float]]:
            latencies: list[float] = []
            counter = iter(range(1 << 62))
            deadline = time.monotonic() + args.duration

            def writer() -> None:
                while time.monotonic() < deadline:
                    n = next(counter)
                    t0 = time.perf_counter()
                    write(n)
                    latencies.append((time.perf_counter() - t0) * 1000)

            start = time.monotonic()
            with ThreadPoolExecutor(writers) as pool:
                for future in [pool.submit(writer) for _ in range(writers)]:
                    future.result()
            return len(latencies) * per_request, time.monotonic() - start, latencies

        def single(n: int) -> None:
            admin.set_topic_config(zk, topics[n % TOPICS], {CONFIG_KEY: str(n)})

        def batch(n: int) -> None:
            for name in topics:  # a ZooKeeper-mode broker writes each changed topic's config in turn
                admin.set_topic_config(zk, name, {CONFIG_KEY: str(60_000 + n % 8)})

        for kind, per_request, writers, write in (("single", 1, 1, single), ("single", 1, args.writers, single),
                                                   ("batch", TOPICS, args.batch_writers, batch)):
            cpu_before = servers_cpu_s()
            committed, seconds, latencies = load(write, per_request, writers)
            cpu_s = servers_cpu_s() - cpu_before
            params = {"write": kind, "records_per_request": per_request, "writers": writers,
                      "duration_s": args.duration, "voters": 3, "record": ZK_RECORD}
            pct = percentiles(latencies, (50.0, 99.0)) if latencies else {"p50": float("nan"), "p99": float("nan")}
            rows.append(_row(params, "committed_records_per_s", committed / seconds, "records/s"))
            rows.append(_row(params, "commit_latency_p50", pct["p50"], "ms"))
            rows.append(_row(params, "commit_latency_p99", pct["p99"], "ms"))
            if committed:
                rows.append(_row(params, "zookeeper_cpu_per_1000_records", cpu_s * 1e6 / committed, "ms"))
            if latencies:
                samples.append((params, "commit_latency", latencies))
            console.print(f"writes {kind} x{writers}: {committed / seconds:,.0f} records/s, "
                          f"p50 {pct['p50']:.1f} ms, p99 {pct['p99']:.1f} ms ({len(latencies)} requests), "
                          f"{cpu_s * 1e6 / max(committed, 1):,.1f} ms CPU of the 3 ZooKeeper servers per 1,000 records")
    finally:
        if zk is not None:
            zk.stop()
            zk.close()
        ensemble.stop()
    return rows, samples


async def _bench(args: argparse.Namespace, phases: set[str], tmp: str, console: Any) -> tuple[list, list]:
    import trio

    from quorum.node.controller_client import ControllerClient
    from cluster.local_quorum import LocalQuorum
    from quorum.node.workload import BrokerStandIn, create_topics_request
    from common.wire import open_connection_pool

    rows: list[dict] = []
    samples: list[tuple[dict, str, list[float]]] = []
    overrides = {}
    if args.quorum_engine != "raftka":
        overrides["quorum.engine"] = args.quorum_engine
    if args.snapshot_bytes is not None:
        overrides["metadata.log.max.record.bytes.between.snapshots"] = str(args.snapshot_bytes)
    with LocalQuorum(tmp, 3, overrides) as quorum:
        quorum.start_all()
        for node_id in quorum.voters:
            await trio.to_thread.run_sync(quorum.wait_listening, node_id, START_TIMEOUT_S)
        async with open_connection_pool(connect_timeout_ms=1000) as pool, trio.open_nursery() as nursery:
            client = ControllerClient(pool, quorum.voters, request_timeout_ms=5000, retry_backoff_ms=5)
            broker = BrokerStandIn(client, quorum.cluster_id)
            with trio.fail_after(60):
                await nursery.start(broker.run)
            topics = [f"bench-{i:04d}" for i in range(TOPICS)]
            for i in range(0, TOPICS, 500):
                await client.send(create_topics_request(topics[i:i + 500]))
            console.print(f"3 controllers up, broker stand-in registered, {TOPICS} topics created")
            if "writes" in phases:
                await _writes(args, quorum, topics, rows, samples, console)
            if "failover" in phases:
                await _failover(args, quorum, client, topics, rows, samples, console)
            if "catchup" in phases:
                await _catchup(args, quorum, topics, rows, console)
            nursery.cancel_scope.cancel()
    return rows, samples


async def _write_load(quorum: Any, make_request: Any, records_per_request: int, writers: int,
                      duration_s: float) -> tuple[int, float, list[float]]:
    """`writers` tasks send requests back to back for `duration_s`; (records committed, seconds, latencies ms)."""
    import trio
    from kio.schema.errors import ErrorCode

    from quorum.node.controller_client import ControllerClient, NoActiveControllerError
    from quorum.node.controller_errors import response_errors

    latencies: list[float] = []
    committed = 0
    counter = 0
    # A connection serves 16 requests at a time; give every 8 writers their own.
    async with trio.open_nursery() as nursery:
        pools = []
        for _ in range((writers + 7) // 8):
            pools.append(await nursery.start(_pool_task))
        deadline = time.monotonic() + duration_s
        start = time.monotonic()

        async def writer(index: int) -> None:
            nonlocal committed, counter
            client = ControllerClient(pools[index // 8], quorum.voters, request_timeout_ms=10000, retry_backoff_ms=5)
            while time.monotonic() < deadline:
                counter += 1
                request = make_request(counter)
                t0 = time.perf_counter()
                try:
                    _, response = await client.send(request)
                except NoActiveControllerError:
                    continue  # a leaderless stretch (a busy machine): counted by the lower rate
                elapsed_ms = (time.perf_counter() - t0) * 1000
                if response_errors(response) <= {int(ErrorCode.none)}:
                    committed += records_per_request
                    latencies.append(elapsed_ms)

        async with trio.open_nursery() as writers_nursery:
            for i in range(writers):
                writers_nursery.start_soon(writer, i)
        seconds = time.monotonic() - start
        nursery.cancel_scope.cancel()
    return committed, seconds, latencies


async def _pool_task(*, task_status: Any) -> None:
    import trio

    from common.wire import open_connection_pool

    async with open_connection_pool(connect_timeout_ms=1000) as pool:
        task_status.started(pool)
        await trio.sleep_forever()


def _batch_requests(topics: list[str]) -> Any:
    """1,000-record requests, built once: the load generator spends its CPU on
    the wire, not on building 1,000 kio entities per request (the controller
    writes a ConfigRecord for every SET, whether or not the value changes)."""
    from quorum.node.workload import alter_config_request

    prebuilt = [alter_config_request(topics, CONFIG_KEY, str(60_000 + i)) for i in range(8)]
    return lambda n: prebuilt[n % len(prebuilt)]


async def _writes(args: argparse.Namespace, quorum: Any, topics: list[str], rows: list, samples: list,
                  console: Any) -> int:
    from bench.histogram import percentiles
    from quorum.node.workload import alter_config_request

    total = 0
    cases = [
        ("single", 1, 1, lambda n: alter_config_request([topics[n % TOPICS]], CONFIG_KEY, str(n))),
        ("single", 1, args.writers, lambda n: alter_config_request([topics[n % TOPICS]], CONFIG_KEY, str(n))),
        ("batch", TOPICS, args.batch_writers, _batch_requests(topics)),
    ]
    for kind, per_request, writers, make in cases:
        cpu_before = _controllers_cpu_s(quorum)
        committed, seconds, latencies = await _write_load(quorum, make, per_request, writers, args.duration)
        cpu_s = _controllers_cpu_s(quorum) - cpu_before
        total += committed
        params = {"write": kind, "records_per_request": per_request, "writers": writers,
                  "duration_s": args.duration, "voters": 3, "record": "ConfigRecord (IncrementalAlterConfigs)"}
        pct = percentiles(latencies, (50.0, 99.0)) if latencies else {"p50": float("nan"), "p99": float("nan")}
        rows.append(_row(params, "committed_records_per_s", committed / seconds, "records/s"))
        rows.append(_row(params, "commit_latency_p50", pct["p50"], "ms"))
        rows.append(_row(params, "commit_latency_p99", pct["p99"], "ms"))
        if committed:
            rows.append(_row(params, "controllers_cpu_per_1000_records", cpu_s * 1e6 / committed, "ms"))
        if latencies:
            samples.append((params, "commit_latency", latencies))
        console.print(f"writes {kind} x{writers}: {committed / seconds:,.0f} records/s, "
                      f"p50 {pct['p50']:.1f} ms, p99 {pct['p99']:.1f} ms ({len(latencies)} requests), "
                      f"{cpu_s * 1e6 / max(committed, 1):,.1f} ms CPU of the 3 controllers per 1,000 records")
    return total


def _controllers_cpu_s(quorum: Any) -> float:
    """CPU seconds used so far by the running controller processes (a
    figure that, unlike records/s, does not depend on how busy the machine is)."""
    from bench.proc_stats import cpu_seconds

    total = 0.0
    for node_id, process in quorum.processes.items():
        if quorum.is_running(node_id):
            try:
                total += cpu_seconds(process.pid)
            except OSError:
                pass  # exited meanwhile
    return total


async def _leader(quorum: Any) -> int:
    import trio

    from quorum.node.describe_quorum import describe_quorum
    from common.wire.errors import ConnectionFailedError

    while True:
        for node_id, (host, port) in quorum.voters.items():
            if not quorum.is_running(node_id):
                continue
            try:
                d = await describe_quorum(host, port, timeout_ms=1000)
            except (ConnectionFailedError, OSError):
                continue
            if d.error_code == 0 and quorum.is_running(d.leader_id):
                return d.leader_id
        await trio.sleep(0.02)


async def _status(quorum: Any) -> Any:
    from quorum.node.describe_quorum import describe_quorum

    host, port = quorum.voters[await _leader(quorum)]
    return await describe_quorum(host, port, timeout_ms=2000)


async def _caught_up(quorum: Any) -> None:
    import trio

    while True:
        d = await _status(quorum)
        ends = {r[1] for r in d.voters}
        if len(ends) == 1 and d.high_watermark in ends:
            return
        await trio.sleep(0.05)


async def _failover(args: argparse.Namespace, quorum: Any, client: Any, topics: list[str], rows: list,
                    samples: list, console: Any) -> None:
    import trio
    from kio.schema.errors import ErrorCode

    from quorum.node.controller_client import NoActiveControllerError
    from quorum.node.controller_errors import response_errors
    from quorum.node.workload import alter_config_request

    times = []
    for run_index in range(args.failover_runs):
        leader = await _leader(quorum)
        request = alter_config_request([topics[0]], CONFIG_KEY, str(run_index))
        killed_at = time.perf_counter()
        quorum.kill(leader)
        with trio.fail_after(120):
            while True:
                try:
                    _, response = await client.send(request)
                except NoActiveControllerError:
                    continue
                if response_errors(response) <= {int(ErrorCode.none)}:
                    break
        times.append(time.perf_counter() - killed_at)
        console.print(f"failover {run_index + 1}: leader {leader} killed, write committed after {times[-1]:.3f} s")
        quorum.start(leader)
        await trio.to_thread.run_sync(quorum.wait_listening, leader, START_TIMEOUT_S)
        with trio.fail_after(60):
            await _caught_up(quorum)
    params = {"runs": args.failover_runs, "voters": 3, "timeouts": "defaults",
              "measured": "kill -9 of the leader to the first write committed by a new leader"}
    rows.append(_row(params, "failover_median", statistics.median(times), "s"))
    rows.append(_row(params, "failover_max", max(times), "s"))
    samples.append((params, "failover", times))


async def _catchup(args: argparse.Namespace, quorum: Any, topics: list[str], rows: list, console: Any) -> None:
    import trio

    from quorum.node.driver import RaftNode
    from quorum.raft import QuorumConfig

    status = await _status(quorum)
    requests = _batch_requests(topics)
    while status.high_watermark < args.catchup_records:
        need = args.catchup_records - status.high_watermark
        committed, seconds, _ = await _write_load(
            quorum, requests, TOPICS, args.batch_writers, max(1.0, min(30.0, need / 15000)))
        status = await _status(quorum)
        console.print(f"catch-up fill: log at {status.high_watermark:,} records ({committed / seconds:,.0f}/s)")
    target = status.high_watermark
    with tempfile.TemporaryDirectory(prefix="raftka-bench-observer-", dir=args.dir) as observer_dir:
        observer = RaftNode(node_id=1000, voters=quorum.voters, log_dir=observer_dir, cluster_id=quorum.cluster_id,
                            config=QuorumConfig())
        async with trio.open_nursery() as nursery:
            start = time.perf_counter()
            await nursery.start(observer.run)
            with trio.fail_after(300):
                await observer.wait_until_applied(target)
            seconds = time.perf_counter() - start
            log = observer.log
            assert log is not None
            snapshot = log.latest_snapshot_id
            nursery.cancel_scope.cancel()
    if snapshot is None:
        console.print("[red]the observer caught up without a snapshot: the leader had not taken one[/red]")
    snapshot_offset = snapshot.end_offset if snapshot else 0
    params = {"records_in_log": target, "voters": 3, "observer": "fresh RaftNode, empty log dir",
              "snapshot_bytes": args.snapshot_bytes or 20 * 1024 * 1024,
              "snapshot_end_offset": snapshot_offset, "records_replayed_after_snapshot": target - snapshot_offset,
              "image_topics": len(observer.image.topics_by_id)}
    rows.append(_row(params, "observer_catch_up", seconds, "s"))
    console.print(f"catch-up: observer applied {target:,} records in {seconds:.2f} s "
                  f"(snapshot at {snapshot_offset:,}, then {target - snapshot_offset:,} records)")


def _report(args: argparse.Namespace, rows: list, samples: list, console: Any) -> None:
    from rich.table import Table

    from bench.results import new_run_id, write_histogram, write_rows, write_samples

    targets = {"failover_median": "≤ 1.5 s", "observer_catch_up": "≤ 10 s"}
    table = Table(title=f"quorum bench: 3 {'ZooKeeper servers' if args.mode == 'zk' else 'voters'} on loopback, "
                        f"engine {rows[0]['params']['engine'] if rows else '-'}")
    for col in ("measurement", "value", "unit", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        p = row["params"]
        what = row["metric"]
        if "write" in p:
            what = f"{p['write']} x{p['writers']}: {what}"
        target = targets.get(row["metric"], "")
        if row["metric"] == "committed_records_per_s" and p.get("write") == "batch":
            target = "≥ 20,000"
        table.add_row(what, f"{row['value']:,.3f}" if row["unit"] in ("s", "ms") else f"{row['value']:,.0f}",
                      row["unit"], target)
    console.print(table)
    run_id = new_run_id()
    path = write_rows(args.results, rows, run_id=run_id)
    for params, metric, values in samples:
        write_samples(args.results, run_id, scenario=SCENARIO, mode=args.mode, params=params, metric=metric,
                      unit="s" if metric == "failover" else "ms", values=values)
        write_histogram(args.results, run_id, scenario=SCENARIO, mode=args.mode, params=params, metric=metric,
                        unit="s" if metric == "failover" else "ms", values=values)
    console.print(f"rows appended to {path}")
    if args.json:
        for row in rows:
            print(json.dumps({**{k: v for k, v in row.items() if k != "params"}, **row["params"]}))
        sys.stdout.flush()
