"""`raftka bench consume`: confluent-kafka consumers reading a filled topic from a local cluster.

What one run measures: a fresh `LocalCluster` (default one controller and
one broker) and a topic of `--partitions`, filled with `--count` records of
`--record-size` bytes by `--producers` processes (acks=1, librdkafka's
batching; not measured), then read from the beginning by `--consumers`
processes, each `assign()`ing its share of the partitions (no group
protocol), until every record is in.

Reported: records/s and payload MB/s consumed; broker CPU-seconds per GB
served (utime+stime of the broker processes over the consume phase,
divided by the bytes of the topic's segment files, which the consumers
read exactly once); the CPU each side used and each side's ceiling with
the CPU it could have (`bench.kafka_bench.verdict`), which names the
bottleneck. The client ceiling is derived from the consumers' own CPU
time: librdkafka's mock cluster serves fetches too slowly (thousands of
records/s here) to show a consumer's ceiling.

Also reported: the broker's CPU while idle (ms per second, measured for
2 s between the fill and the read) and what that rate costs per GB over
the measured phase. It is part of the headline figure, which stays all
of the broker's CPU; it shows how much of it is fixed per second rather
than per byte (with `--count 2000000` on a 2-core VM the idle share was
0.03-0.1 CPU-s/GB, more when the consumers are starved of CPU and the
phase lasts longer; the consumers' start-up cost the broker 1-2 ms).

And beside it, the floor (`bench.floors.sendfile_floor`, skipped with
`--no-floor`): right after the consume phase, the same segment files sent
once over loopback by a process that does nothing but `os.sendfile`, its
CPU per GB, and the broker's figure over it. The floor is measured in the
same run because it moves with the machine: on one 2-core VM it alone was
0.53-0.80 CPU-s/GB, above the 0.5 target, and 0.13-0.21 on another VM of
the same kind.
"""

from __future__ import annotations

import argparse
import os
import uuid

from bench.kafka_bench import GB, MB, add_cluster_options, bench_cluster, emit, resolve_brokers, row, verdict
from bench.load_generator import aggregate, consume_worker, produce_worker, run_workers

SCENARIO = "consume"
TOPIC = "bench-consume"
#: Target of the issue: broker CPU-seconds per GB served to consumers.
TARGET_CPU_S_PER_GB = 0.5
CONSUME_TIMEOUT_S = 600.0
#: Records read by default: 880 MB of 100-byte records, about as much as
#: `raftka bench produce` appends, so the phase lasts several seconds. At
#: 2,000,000 (1.5-3 s) the broker's fixed costs -- its timers, the
#: consumers' connections and first fetches -- were a tenth of the figure:
#: `raftka bench consume --count 2000000` gave 0.54-0.56 CPU-s/GB against
#: 0.41-0.47 with `--count 8000000`, in the same hour on a 2-core VM.
DEFAULT_COUNT = 8_000_000
#: Seconds the idle broker's CPU is measured for, between the fill and the read.
IDLE_MEASURE_S = 2.0


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser("consume", help="consumer throughput and broker CPU per GB served",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, metavar="N",
                   help=f"records to fill the topic with and read back (default {DEFAULT_COUNT:,})")
    p.add_argument("--consumers", type=int, default=2, help="consumer processes (default 2)")
    p.add_argument("--producers", type=int, default=2, help="processes that fill the topic (default 2)")
    p.add_argument("--fetch-max-bytes", type=int, default=None, metavar="BYTES",
                   help="librdkafka fetch.max.bytes (default: librdkafka's)")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="after the consume phase, measure what sending the same segment files with nothing "
                        "but sendfile costs, and report the broker's figure over it (default on)")
    p.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_SSL"), default="PLAINTEXT",
                   help="SSL or SASL_SSL: measure what TLS costs: the brokers get a TLS listener beside "
                        "PLAINTEXT and the filled topic is read once over each (PLAINTEXT first); reported: "
                        "throughput and broker CPU per GB served of each (see bench/security_cost.py)")
    add_cluster_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=args.json)
    resolve_brokers(args)
    if min(args.count, args.consumers, args.producers, args.record_size, args.partitions) < 1:
        console.print("raftka bench consume: --count, --consumers, --producers, --record-size and "
                      "--partitions must be positive")
        return 2
    consumers = min(args.consumers, args.partitions)
    params = {"record_size": args.record_size, "count": args.count, "consumers": consumers,
              "partitions": args.partitions, "replication_factor": args.replication_factor,
              "fetch_max_bytes": args.fetch_max_bytes, "brokers": args.brokers, "controllers": args.controllers}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} records"),
               TimeElapsedColumn())
    with bench_cluster(args, console, TOPIC, None if args.security_protocol == "PLAINTEXT"
                       else args.security_protocol) as bc:
        per_producer = [args.count // args.producers + (i < args.count % args.producers)
                        for i in range(args.producers)]
        fill = [{"topic": TOPIC, "record_size": args.record_size, "count": n, "duration_s": None,
                 "sample_every": 1 << 30, "config": {"bootstrap.servers": bc.bootstrap, "acks": "1"}}
                for n in per_producer]
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("filling the topic", total=args.count)
            filled = aggregate(run_workers(produce_worker, fill,
                                           on_progress=lambda n: progress.update(task, completed=n)))
        if filled["failed"]:
            console.print(f"[red]{filled['failed']} records were not written: {filled['errors']}[/red]")
            return 1
        served = bc.broker_log_bytes()
        counts = _partition_counts(bc.bootstrap, args.partitions)
        idle_ms_per_s = bc.broker_idle_cpu_ms_per_s(IDLE_MEASURE_S)
        # librdkafka stops fetching a partition whose local queue holds
        # queued.min.messages (100000) for fetch.queue.backoff.ms (default
        # 1000 ms): the broker then idles for whole seconds while the
        # consumers drain their queues. 10 ms keeps them fetching as soon as
        # they have room, so the broker's serving is what is measured.
        config: dict = {"fetch.queue.backoff.ms": 10}
        if args.fetch_max_bytes is not None:
            config["fetch.max.bytes"] = args.fetch_max_bytes
        secure = args.security_protocol != "PLAINTEXT"
        if secure:
            from bench.security_cost import SecureBenchCluster, client_config, report_consume_comparison

            phases = {}
            for variant, view in (("PLAINTEXT", bc), (args.security_protocol, SecureBenchCluster(bc.cluster, TOPIC))):
                security = client_config(view)
                bootstrap = security.pop("bootstrap.servers")
                phase, cpu = _consume_phase(console, columns, view, bootstrap, {**config, **security}, consumers,
                                            counts, args, f"consuming over {variant}")
                phases[variant] = {"cpu": cpu, "bytes": served,
                                   "mb_per_s": phase["records"] * args.record_size / MB / phase["elapsed_s"]}
                if phase["records"] < args.count:
                    console.print(f"[red]{variant}: {args.count - phase['records']} records not read; "
                                  f"errors: {phase['errors']}[/red]")
                    return 1
            report_consume_comparison(args, console, params, phases)
            return 0
        result, broker_cpu_s = _consume_phase(console, columns, bc, bc.bootstrap, config, consumers, counts, args,
                                              "consuming")
        floor = None
        if args.floor:
            from bench.floors import sendfile_floor

            floor = sendfile_floor(bc.broker_segment_files())
    elapsed = result["elapsed_s"]
    records_per_s = result["records"] / elapsed
    mb_per_s = result["records"] * args.record_size / MB / elapsed
    broker_cores, client_cores = broker_cpu_s / elapsed, result["cpu_s"] / elapsed
    cpu_per_gb = broker_cpu_s / (served / GB) if served else float("nan")
    who, broker_ceiling, client_ceiling = verdict(records_per_s, broker_cores, client_cores, consumers,
                                                  os.cpu_count() or 1)
    missing = args.count - result["records"]
    # What the broker's own timers cost over the measured phase, per GB: a
    # fixed cost per second that a slower or shorter run pays more of.
    idle_per_gb = idle_ms_per_s / 1000 * elapsed / (served / GB) if served else float("nan")
    rows = [
        row(SCENARIO, params, "consume_records_per_s", records_per_s, "records/s"),
        row(SCENARIO, params, "consume_mb_per_s", mb_per_s, "MB/s"),
        row(SCENARIO, params, "broker_cpu_s_per_gb", cpu_per_gb, "cpu_s"),
        row(SCENARIO, params, "broker_cpu_cores", broker_cores, "cores"),
        row(SCENARIO, params, "client_cpu_cores", client_cores, "cores"),
        row(SCENARIO, params, "broker_ceiling_records_per_s", broker_ceiling, "records/s"),
        row(SCENARIO, params, "client_cpu_ceiling_records_per_s", client_ceiling, "records/s"),
        row(SCENARIO, params, "served_bytes", served, "bytes"),
        row(SCENARIO, params, "broker_idle_cpu_ms_per_s", idle_ms_per_s, "ms/s"),
        row(SCENARIO, params, "broker_idle_cpu_s_per_gb", idle_per_gb, "cpu_s"),
        row(SCENARIO, params, "missing_records", missing, "records"),
    ]
    if floor is not None:
        rows += [row(SCENARIO, params, "sendfile_floor_cpu_s_per_gb", floor["cpu_s_per_gb"], "cpu_s"),
                 row(SCENARIO, params, "broker_over_sendfile_floor", cpu_per_gb / floor["cpu_s_per_gb"], "ratio")]
    from rich.table import Table

    table = Table(title=f"consume: {consumers} consumers, {args.count:,} records of {args.record_size} B, "
                        f"{args.partitions} partitions, {args.brokers} broker(s)")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("note")
    table.add_row("records/s", f"{records_per_s:,.0f}", f"{result['records']:,} read")
    table.add_row("MB/s (payload)", f"{mb_per_s:,.1f}", "")
    table.add_row("broker CPU-s per GB served", f"{cpu_per_gb:.2f}",
                  f"target ≤ {TARGET_CPU_S_PER_GB}; {broker_cpu_s:.2f} CPU-s for {served / MB:,.0f} MB")
    table.add_row("  of which the idle broker", f"{idle_per_gb:.2f}",
                  f"its timers: {idle_ms_per_s:.1f} ms/s before the consumers started, over {elapsed:.1f} s")
    if floor is not None:
        table.add_row("sendfile floor, CPU-s per GB", f"{floor['cpu_s_per_gb']:.2f}",
                      f"the same {floor['bytes'] / MB:,.0f} MB by a process that only calls sendfile; "
                      f"the broker spent {cpu_per_gb / floor['cpu_s_per_gb']:.2f}× that")
    table.add_row("broker CPU", f"{broker_cores:.2f} cores", f"ceiling ≈ {broker_ceiling:,.0f} records/s")
    table.add_row("load generator CPU", f"{client_cores:.2f} cores", f"ceiling ≈ {client_ceiling:,.0f} records/s")
    table.add_row("bottleneck", who, "the side with the lower ceiling")
    console.print(table)
    if missing or result["errors"]:
        console.print(f"[red]{missing} records not read; errors: {result['errors']}[/red]")
    emit(args, console, rows, {}, SCENARIO, params)
    return 0 if not missing else 1


def _consume_phase(console, columns, bc, bootstrap: str, config: dict, consumers: int, counts: dict[int, int],
                   args: argparse.Namespace, title: str) -> tuple[dict, float]:
    """Read the whole topic once from `bootstrap` with `consumers` processes:
    their aggregate result, and the brokers' CPU-s over the phase."""
    from rich.progress import Progress

    group = f"bench-{uuid.uuid4().hex[:8]}"
    specs = []
    for i in range(consumers):
        mine = list(range(i, args.partitions, consumers))
        specs.append({"bootstrap": bootstrap, "topic": TOPIC, "partitions": mine, "group_id": group,
                      "count": sum(counts[p] for p in mine), "timeout_s": CONSUME_TIMEOUT_S, "config": config})
    before: dict[str, float] = {}
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(title, total=args.count)
        result = aggregate(run_workers(consume_worker, specs,
                                       on_start=lambda: before.update(cpu=bc.broker_cpu_seconds()),
                                       on_progress=lambda n: progress.update(task, completed=n)))
    return result, bc.broker_cpu_seconds() - before["cpu"]


def _partition_counts(bootstrap: str, partitions: int) -> dict[int, int]:
    """Records per partition: its high watermark (the topic was empty before the fill)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()
