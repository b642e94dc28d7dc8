"""What the produce and consume benches share: a cluster to measure, its topic, result rows.

`bench_cluster(args)` starts a `LocalCluster` (default one controller and
one broker, as the targets are stated for one broker) through
`bench.runner.Runner` (which stops it on Ctrl-C or SIGTERM too) and
creates the bench topic with confluent-kafka's AdminClient. The broker's
CPU time (user + system, all its threads) is read from its POSIX CPU-time
clock, to the nanosecond (`process_cpu_seconds`; /proc's 10 ms ticks as a
fallback), its appended bytes from the sizes of the topic's segment files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from bench.cli import add_common_options
from bench.proc_stats import log_bytes, process_cpu_seconds, segment_files

GB = 1e9
MB = 1e6


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--brokers", type=int, default=None,
                   help="brokers in the measured cluster (default: the replication factor, at least 1)")
    p.add_argument("--controllers", type=int, default=1, help="controllers (default 1)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the bench topic (default 6)")
    p.add_argument("--replication-factor", "--rf", type=int, default=1, dest="replication_factor",
                   help="replication factor of the bench topic (default 1)")
    p.add_argument("--record-size", type=int, default=100, metavar="BYTES", help="value bytes (default 100)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a broker config key for every node, e.g. --set log.segment.bytes=1073741824")
    p.add_argument("--dir", default=None,
                   help="where the cluster's temp dir goes (made if missing; default: system temp)")
    p.add_argument("--mode", choices=("kraft", "zk"), default="kraft",
                   help="metadata mode of the cluster (default kraft; zk is not available yet)")
    add_common_options(p)


def resolve_brokers(args: argparse.Namespace) -> int:
    """--brokers, or as many brokers as the replication factor needs (at
    least one); the cluster options checked before anything runs."""
    from common.config import parse_overrides
    from common.errors import RaftkaError

    if args.partitions < 1 or args.replication_factor < 1 or args.controllers < 1:
        raise RaftkaError(f"--partitions ({args.partitions}), --replication-factor ({args.replication_factor}) "
                          f"and --controllers ({args.controllers}) must be at least 1")
    if args.brokers is None:
        args.brokers = max(1, args.replication_factor)
    if args.brokers < args.replication_factor:
        raise RaftkaError(f"--replication-factor {args.replication_factor} needs at least that many --brokers "
                          f"(got {args.brokers})")
    parse_overrides(args.set)  # a malformed --set fails now, not after the client-ceiling run
    return args.brokers


class BenchCluster:
    def __init__(self, cluster: Any, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def broker_cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(b.pid) for b in self.cluster.brokers)

    def broker_idle_cpu_ms_per_s(self, seconds: float) -> float:
        """The brokers' CPU while no client uses them (their own timers: the
        Raft observer's fetches of the metadata log, heartbeats,
        checkpoints), in ms per second, over `seconds`. From their CPU
        clocks (`process_cpu_seconds`): ticks could not resolve a few ms."""
        cpu0, t0 = self.broker_cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        return (self.broker_cpu_seconds() - cpu0) * 1000 / (time.monotonic() - t0)

    def broker_log_bytes(self, topic: str | None = None) -> int:
        """Bytes of the segment files of `topic` (default: the bench topic), over every broker."""
        return sum(log_bytes(str(b.log_dir), topic or self.topic) for b in self.cluster.brokers)

    def broker_segment_files(self, topic: str | None = None) -> list[str]:
        """The segment files of `topic` (default: the bench topic), over every broker."""
        return [path for b in self.cluster.brokers for path in segment_files(str(b.log_dir), topic or self.topic)]


@contextlib.contextmanager
def bench_cluster(args: argparse.Namespace, console: Any, topic: str,
                  secure_protocol: str | None = None) -> Iterator[BenchCluster]:
    """The cluster, on `bench.runner.Runner` (temp dir, --mode, stopped on Ctrl-C/SIGTERM too);
    with `secure_protocol` (SSL, SASL_SSL) its brokers have such a listener beside PLAINTEXT."""
    from bench.runner import Runner
    from common.config import parse_overrides

    resolve_brokers(args)
    with Runner(topic, args, {}, console) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers,
                                 overrides=parse_overrides(args.set), secure_protocol=secure_protocol)
        create_topic(cluster.bootstrap, topic, args.partitions, args.replication_factor)
        args.environment = runner.env  # emit() writes it beside the rows
        yield BenchCluster(cluster, topic)


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor)], operation_timeout=30)
    futures[topic].result(60)
    # Wait until every broker's metadata shows a leader for every partition.
    for _ in range(100):
        metadata = admin.list_topics(topic, timeout=10).topics[topic]
        if len(metadata.partitions) == partitions and all(p.leader >= 0 for p in metadata.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic}: partitions have no leader after 10 s")


def row(scenario: str, params: dict[str, Any], metric: str, value: float, unit: str) -> dict[str, Any]:
    return {"scenario": scenario, "mode": "kraft", "params": params, "metric": metric, "value": value, "unit": unit}


def emit(args: argparse.Namespace, console: Any, rows: list[dict[str, Any]], samples: dict[str, list[float]],
         scenario: str, params: dict[str, Any]) -> str:
    """Write the rows (and latency samples) to --results; print them as JSON with --json; the run id."""
    from bench.results import new_run_id, write_events, write_histogram, write_rows, write_samples, write_series
    from bench.runner import environment, write_environment

    run_id = new_run_id()
    mode = getattr(args, "mode", "kraft")
    rows = [{**r, "mode": mode} for r in rows]
    path = write_rows(args.results, rows, run_id=run_id)
    for metric, values in samples.items():
        if values:
            write_samples(args.results, run_id, scenario=scenario, mode=mode, params=params, metric=metric,
                          unit="ms", values=values)
            write_histogram(args.results, run_id, scenario=scenario, mode=mode, params=params, metric=metric,
                            unit="ms", values=values)
    # Per-interval values inside the run, and its events, when the bench kept them.
    for metric, unit, points in getattr(args, "series", None) or ():
        write_series(args.results, run_id, scenario=scenario, mode=mode, params=params, metric=metric, unit=unit,
                     points=points)
    write_events(args.results, run_id, scenario=scenario, mode=mode, params=params,
                 events=getattr(args, "events", None) or ())
    env = getattr(args, "environment", None) or environment()
    if getattr(args, "suite_id", None):
        env["suite_id"] = args.suite_id
    write_environment(args.results, run_id, {**env, "run_id": run_id, "scenario": scenario, "mode": mode,
                                             "params": params, "ended_ms": int(time.time() * 1000)})
    console.print(f"rows appended to {path}")
    if args.json:
        for r in rows:
            print(json.dumps({**{k: v for k, v in r.items() if k != "params"}, **r["params"]}))
        sys.stdout.flush()
    return run_id


def verdict(records_per_s: float, broker_cores: float, client_cores: float, client_processes: int,
            cores: int) -> tuple[str, float, float]:
    """Which side limits the rate: (who, broker ceiling, client ceiling), in records/s.

    Each ceiling is the rate that side would reach with all the CPU it can
    use: the broker is one Python thread (one core); the load generator
    one core per process; both share `cores`. The side with the lower
    ceiling is the bottleneck."""
    broker_ceiling = records_per_s / max(broker_cores, 1e-9) * 1.0
    client_ceiling = records_per_s / max(client_cores, 1e-9) * min(client_processes, cores)
    who = "load generator" if client_ceiling <= broker_ceiling else "broker"
    return who, broker_ceiling, client_ceiling
