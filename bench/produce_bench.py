"""`raftka bench produce`: confluent-kafka producers against a local cluster.

What one run measures:

1. **client ceiling**: the same producer processes against librdkafka's
   in-process mock cluster (`test.mock.num.brokers=1`): how fast the load
   generator goes with a broker that costs it almost nothing;
2. **the cluster**: a fresh `LocalCluster` (default one controller and one
   broker), a topic of `--partitions` (RF `--replication-factor`), and
   `--producers` processes producing `--record-size`-byte records for
   `--duration` seconds (or `--count` records each) at librdkafka's batching
   (`--linger-ms`, `--batch-size`, `--acks`, `--compression`).

Reported: acknowledged records/s and payload MB/s; p50/p99 produce latency
(`produce()` to delivery report, sampled); broker CPU-seconds per GB
appended (utime+stime of the broker processes from /proc over the run,
divided by the growth of the topic's segment files); the CPU each side
used, and each side's ceiling with the CPU it could have (see
`bench.kafka_bench.verdict`), which names the bottleneck.
"""

from __future__ import annotations

import argparse
import os

from bench.kafka_bench import GB, MB, add_cluster_options, bench_cluster, emit, row, verdict
from bench.load_generator import aggregate, produce_worker, run_workers

SCENARIO = "produce"
TOPIC = "bench-produce"
#: Target of the issue: broker CPU-seconds per GB appended at librdkafka's default batching.
TARGET_CPU_S_PER_GB = 1.5


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser("produce", help="producer throughput, latency and broker CPU per GB appended",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds of producing (default 10)")
    p.add_argument("--count", type=int, default=None, metavar="N", help="records per producer instead of --duration")
    p.add_argument("--acks", default="1", choices=("0", "1", "all"), help="default 1")
    p.add_argument("--linger-ms", type=int, default=None, help="librdkafka linger.ms (default: librdkafka's, 5)")
    p.add_argument("--batch-size", type=int, default=None, metavar="BYTES",
                   help="librdkafka batch.size (default: librdkafka's, 1000000)")
    p.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"))
    p.add_argument("--sample-every", type=int, default=100, metavar="N",
                   help="time the delivery of every N-th record (default 100)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the mock-cluster client ceiling run")
    add_cluster_options(p)
    p.set_defaults(func=run)


def producer_config(args: argparse.Namespace) -> dict[str, object]:
    config: dict[str, object] = {"acks": args.acks, "compression.type": args.compression}
    if args.linger_ms is not None:
        config["linger.ms"] = args.linger_ms
    if args.batch_size is not None:
        config["batch.size"] = args.batch_size
    return config


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from bench.runner import require_mode

    console = Console(stderr=args.json)
    require_mode(args.mode)  # before the client-ceiling run, which needs no cluster
    if args.producers < 1 or args.record_size < 1 or (args.count is None and args.duration <= 0):
        console.print("raftka bench produce: --producers, --record-size and --duration/--count must be positive")
        return 2
    params = {
        "record_size": args.record_size, "producers": args.producers, "partitions": args.partitions,
        "replication_factor": args.replication_factor, "acks": args.acks, "linger_ms": args.linger_ms,
        "batch_size": args.batch_size, "compression": args.compression, "duration_s": args.duration,
        "count": args.count, "brokers": args.brokers, "controllers": args.controllers,
    }
    spec = {"topic": TOPIC, "record_size": args.record_size, "duration_s": None if args.count else args.duration,
            "count": args.count, "sample_every": args.sample_every, "config": producer_config(args)}
    rows = []
    ceiling = None
    if not args.no_ceiling:
        ceiling = _phase(console, "client ceiling (mock cluster)", [{**spec, "mock": True}] * args.producers, args)
        rows += [row(SCENARIO, params, "client_ceiling_records_per_s", ceiling["records_per_s"], "records/s"),
                 row(SCENARIO, params, "client_ceiling_mb_per_s", ceiling["mb_per_s"], "MB/s")]
    with bench_cluster(args, console, TOPIC) as bc:
        specs = [{**spec, "config": {**spec["config"], "bootstrap.servers": bc.bootstrap}}] * args.producers
        before: dict[str, float] = {}

        def on_start() -> None:
            before.update(cpu=bc.broker_cpu_seconds(), log=bc.broker_log_bytes())

        result = _phase(console, "producing to the cluster", specs, args, on_start)
        broker_cpu_s = bc.broker_cpu_seconds() - before["cpu"]
        appended = bc.broker_log_bytes() - before["log"]
    if result["failed"]:
        console.print(f"[red]{result['failed']} records failed: {result['errors']}[/red]")
    from bench.histogram import LatencyHistogram

    histogram = LatencyHistogram()
    histogram.record_many(result["latencies_ms"])
    elapsed = result["elapsed_s"]
    broker_cores = broker_cpu_s / elapsed
    client_cores = result["cpu_s"] / elapsed
    cpu_per_gb = broker_cpu_s / (appended / GB) if appended else float("nan")
    who, broker_ceiling, client_ceiling = verdict(result["records_per_s"], broker_cores, client_cores,
                                                  args.producers, os.cpu_count() or 1)
    rows += [
        row(SCENARIO, params, "produce_records_per_s", result["records_per_s"], "records/s"),
        row(SCENARIO, params, "produce_mb_per_s", result["mb_per_s"], "MB/s"),
        row(SCENARIO, params, "broker_cpu_s_per_gb", cpu_per_gb, "cpu_s"),
        row(SCENARIO, params, "broker_cpu_cores", broker_cores, "cores"),
        row(SCENARIO, params, "client_cpu_cores", client_cores, "cores"),
        row(SCENARIO, params, "broker_ceiling_records_per_s", broker_ceiling, "records/s"),
        row(SCENARIO, params, "client_cpu_ceiling_records_per_s", client_ceiling, "records/s"),
        row(SCENARIO, params, "appended_bytes", appended, "bytes"),
        row(SCENARIO, params, "failed_records", result["failed"], "records"),
    ]
    if histogram.count:
        rows += [row(SCENARIO, params, "produce_latency_p50", histogram.percentile(50), "ms"),
                 row(SCENARIO, params, "produce_latency_p99", histogram.percentile(99), "ms")]
    _print_table(console, args, result, ceiling, histogram, broker_cpu_s, appended, cpu_per_gb, broker_cores,
                 client_cores, who, broker_ceiling, client_ceiling)
    emit(args, console, rows, {"produce_latency": result["latencies_ms"]}, SCENARIO, params)
    return 0 if not result["failed"] else 1


def _phase(console, title, specs, args, on_start=None) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    total = args.count * len(specs) if args.count else None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} records"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(title, total=total)
        results = run_workers(produce_worker, specs, on_start=on_start,
                              on_progress=lambda n: progress.update(task, completed=n))
    result = aggregate(results)
    result["records_per_s"] = result["records"] / result["elapsed_s"]
    result["mb_per_s"] = result["records"] * args.record_size / MB / result["elapsed_s"]
    return result


def _print_table(console, args, result, ceiling, histogram, broker_cpu_s, appended, cpu_per_gb, broker_cores,
                 client_cores, who, broker_ceiling, client_ceiling) -> None:
    from rich.table import Table

    table = Table(title=f"produce: {args.producers} producers, {args.record_size} B records, acks={args.acks}, "
                        f"{args.partitions} partitions, {args.brokers} broker(s)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("note")
    table.add_row("records/s", f"{result['records_per_s']:,.0f}", f"{result['records']:,} acknowledged")
    table.add_row("MB/s (payload)", f"{result['mb_per_s']:,.1f}", "")
    if histogram.count:
        table.add_row("latency p50 / p99", f"{histogram.percentile(50):.1f} / {histogram.percentile(99):.1f} ms",
                      f"{histogram.count:,} samples")
    table.add_row("broker CPU-s per GB appended", f"{cpu_per_gb:.2f}",
                  f"target ≤ {TARGET_CPU_S_PER_GB}; {broker_cpu_s:.2f} CPU-s for {appended / MB:,.0f} MB")
    table.add_row("broker CPU", f"{broker_cores:.2f} cores", f"ceiling ≈ {broker_ceiling:,.0f} records/s")
    table.add_row("load generator CPU", f"{client_cores:.2f} cores", f"ceiling ≈ {client_ceiling:,.0f} records/s")
    if ceiling is not None:
        table.add_row("client ceiling (mock cluster)", f"{ceiling['records_per_s']:,.0f}",
                      f"records/s; {ceiling['mb_per_s']:,.1f} MB/s")
    table.add_row("bottleneck", who, "the side with the lower ceiling")
    console.print(table)
