"""`raftka bench produce|consume --security-protocol SSL|SASL_SSL`: what TLS
(and a SASL login) costs the brokers, beside PLAINTEXT in the same run.

One cluster whose brokers have a PLAINTEXT listener and a TLS one (SSL, or
SASL_SSL with the admin's SCRAM-SHA-512 login; a throwaway CA, as `raftka
cluster up --secure`). The same load runs over each listener in turn:

- produce: `--rounds` producing phases on each, alternating which goes
  first so that drift on a shared machine falls on both;
- consume: the filled topic read once over each listener, PLAINTEXT first.

Reported: throughput and the brokers' CPU-s per GB (appended or served) on
each, and their ratio. Over TLS a broker cannot hand file slices to the
kernel with sendfile: it reads them (`pread`) and encrypts them in memory,
which is where most of the consume side's extra CPU goes.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.kafka_bench import GB, MB, BenchCluster, create_topic, emit, row

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


class SecureBenchCluster(BenchCluster):
    """The bench cluster seen through its TLS listeners."""

    @property
    def bootstrap(self) -> str:
        return self.cluster.secure_bootstrap


def client_config(bc: BenchCluster) -> dict[str, str]:
    """librdkafka keys to reach `bc` (security included, bootstrap.servers too)."""
    if isinstance(bc, SecureBenchCluster):
        return bc.cluster.secure_client_config()
    return {"bootstrap.servers": bc.bootstrap}


def _table(console: Any, title: str, protocol: str, figures: dict[str, dict[str, float]], unit: str) -> float:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("")
    table.add_column("PLAINTEXT", justify="right")
    table.add_column(protocol, justify="right")
    plain, secure = figures["PLAINTEXT"], figures[protocol]
    table.add_row(f"broker CPU-s per GB {unit}", f"{plain['cpu_per_gb']:.2f}", f"{secure['cpu_per_gb']:.2f}")
    table.add_row("MB/s (payload)", f"{plain['mb_per_s']:,.1f}", f"{secure['mb_per_s']:,.1f}")
    table.add_row(f"GB {unit}", f"{plain['bytes'] / GB:.2f}", f"{secure['bytes'] / GB:.2f}")
    console.print(table)
    ratio = secure["cpu_per_gb"] / plain["cpu_per_gb"]
    console.print(f"{protocol} / PLAINTEXT: broker CPU per GB x{ratio:.2f}, throughput "
                  f"x{secure['mb_per_s'] / plain['mb_per_s']:.2f}")
    return ratio


def run_produce_comparison(args: argparse.Namespace, console: Any, params: dict[str, Any], spec: dict[str, Any],
                           measure) -> int:
    from bench.runner import Runner
    from common.config import parse_overrides

    protocol = args.security_protocol
    if args.rounds < 1:
        console.print("raftka bench produce: --rounds must be positive")
        return 2
    params = {**params, "rounds": args.rounds, "security_protocol": protocol}
    totals = {p: {"cpu": 0.0, "bytes": 0, "payload": 0, "elapsed": 0.0} for p in ("PLAINTEXT", protocol)}
    failed = 0
    with Runner(spec["topic"], args, {}, console) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers,
                                 overrides=parse_overrides(args.set), secure_protocol=protocol)
        create_topic(cluster.bootstrap, spec["topic"], args.partitions, args.replication_factor)
        args.environment = runner.env
        views = {"PLAINTEXT": BenchCluster(cluster, spec["topic"]), protocol: SecureBenchCluster(cluster, spec["topic"])}
        for round_no in range(args.rounds):
            order = ("PLAINTEXT", protocol) if round_no % 2 == 0 else (protocol, "PLAINTEXT")
            for variant in order:
                bc = views[variant]
                variant_spec = {**spec, "config": {**spec["config"], **client_config(bc)}}
                result = measure(console, args, bc, variant_spec, f"{variant}, round {round_no + 1}/{args.rounds}")
                failed += result["failed"]
                total = totals[variant]
                total["cpu"] += result["broker_cpu_s"]
                total["bytes"] += result["appended"]
                total["payload"] += result["mb_per_s"] * MB * result["elapsed_s"]
                total["elapsed"] += result["elapsed_s"]
    figures = {v: {"cpu_per_gb": t["cpu"] / (t["bytes"] / GB) if t["bytes"] else float("nan"),
                   "mb_per_s": t["payload"] / MB / t["elapsed"] if t["elapsed"] else float("nan"),
                   "bytes": t["bytes"]} for v, t in totals.items()}
    ratio = _table(console, f"produce over PLAINTEXT and {protocol} (same cluster, alternating phases)",
                   protocol, figures, "appended")
    rows = [row("produce", params, "plaintext_broker_cpu_s_per_gb", figures["PLAINTEXT"]["cpu_per_gb"], "cpu_s"),
            row("produce", params, "secure_broker_cpu_s_per_gb", figures[protocol]["cpu_per_gb"], "cpu_s"),
            row("produce", params, "plaintext_mb_per_s", figures["PLAINTEXT"]["mb_per_s"], "MB/s"),
            row("produce", params, "secure_mb_per_s", figures[protocol]["mb_per_s"], "MB/s"),
            row("produce", params, "secure_cpu_ratio", ratio, "ratio"),
            row("produce", params, "failed_records", failed, "records")]
    emit(args, console, rows, {}, "produce", params)
    return 0 if not failed else 1


def report_consume_comparison(args: argparse.Namespace, console: Any, params: dict[str, Any],
                              phases: dict[str, dict[str, float]]) -> None:
    """`phases`: per listener, the consume phase's broker CPU-s, bytes served, payload MB/s."""
    protocol = args.security_protocol
    params = {**params, "security_protocol": protocol}
    figures = {v: {"cpu_per_gb": p["cpu"] / (p["bytes"] / GB) if p["bytes"] else float("nan"),
                   "mb_per_s": p["mb_per_s"], "bytes": p["bytes"]} for v, p in phases.items()}
    ratio = _table(console, f"consume over PLAINTEXT and {protocol} (same topic, read once over each)",
                   protocol, figures, "served")
    rows = [row("consume", params, "plaintext_broker_cpu_s_per_gb", figures["PLAINTEXT"]["cpu_per_gb"], "cpu_s"),
            row("consume", params, "secure_broker_cpu_s_per_gb", figures[protocol]["cpu_per_gb"], "cpu_s"),
            row("consume", params, "plaintext_mb_per_s", figures["PLAINTEXT"]["mb_per_s"], "MB/s"),
            row("consume", params, "secure_mb_per_s", figures[protocol]["mb_per_s"], "MB/s"),
            row("consume", params, "secure_cpu_ratio", ratio, "ratio")]
    emit(args, console, rows, {}, "consume", params)
