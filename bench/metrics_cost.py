"""`raftka bench produce --compare-metrics`: what serving metrics costs the brokers.

Two clusters of the same shape run side by side: one whose nodes serve
metrics (`metrics.port`; a scraper thread reads every node's /metrics
every `--scrape-interval`, more often than Prometheus' default 15 s), one
without. The same producing phase (`--duration`, `--producers`, ...) runs
on each in turn, `--rounds` times, alternating which goes first so that
drift on a shared machine falls on both. Reported: the brokers' CPU-s per
GB appended on each (summed over the rounds), and their ratio; the target
is at most 3% more with metrics.
"""

from __future__ import annotations

import argparse
import threading
import urllib.request
from typing import Any

from bench.kafka_bench import GB, BenchCluster, create_topic, emit, row

SCENARIO = "produce"
#: Metrics may cost the brokers this much more CPU per GB at most.
TARGET_RATIO = 1.03


class Scraper:
    """Reads every node's /metrics every `interval_s` in a thread, as Prometheus would."""

    def __init__(self, cluster: Any, interval_s: float) -> None:
        self.urls = [f"http://{n.host}:{n.metrics_port}/metrics" for n in cluster.nodes.values()]
        self.interval_s = interval_s
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        response.read()
                    self.scrapes += 1
                except OSError:
                    self.failures += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def run_metrics_comparison(args: argparse.Namespace, console: Any, params: dict[str, Any], spec: dict[str, Any],
                           measure) -> int:
    from rich.table import Table

    from bench.runner import Runner
    from common.config import parse_overrides

    if args.rounds < 1 or args.scrape_interval <= 0:
        console.print("raftka bench produce: --rounds and --scrape-interval must be positive")
        return 2
    params = {**params, "rounds": args.rounds, "scrape_interval_s": args.scrape_interval}
    totals = {"off": [0.0, 0, 0], "on": [0.0, 0, 0]}  # broker CPU-s, bytes appended, records
    failed = 0
    with Runner(spec["topic"], args, {}, console) as runner:
        clusters = {}
        for variant in ("off", "on"):
            cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers,
                                     overrides=parse_overrides(args.set), metrics=variant == "on")
            create_topic(cluster.bootstrap, spec["topic"], args.partitions, args.replication_factor)
            clusters[variant] = BenchCluster(cluster, spec["topic"])
        args.environment = runner.env
        with Scraper(clusters["on"].cluster, args.scrape_interval) as scraper:
            for round_no in range(args.rounds):
                order = ("off", "on") if round_no % 2 == 0 else ("on", "off")
                for variant in order:
                    result = measure(console, args, clusters[variant], spec,
                                     f"metrics {variant}, round {round_no + 1}/{args.rounds}")
                    failed += result["failed"]
                    total = totals[variant]
                    total[0] += result["broker_cpu_s"]
                    total[1] += result["appended"]
                    total[2] += result["records"]
    per_gb = {v: (t[0] / (t[1] / GB) if t[1] else float("nan")) for v, t in totals.items()}
    ratio = per_gb["on"] / per_gb["off"]
    table = Table(title="broker CPU with and without metrics (same load, alternating phases)")
    table.add_column("")
    table.add_column("metrics off", justify="right")
    table.add_column("metrics on", justify="right")
    table.add_row("broker CPU-s per GB appended", f"{per_gb['off']:.2f}", f"{per_gb['on']:.2f}")
    table.add_row("GB appended", f"{totals['off'][1] / GB:.2f}", f"{totals['on'][1] / GB:.2f}")
    table.add_row("records", f"{totals['off'][2]:,}", f"{totals['on'][2]:,}")
    console.print(table)
    verdict = "within" if ratio <= TARGET_RATIO else "above"
    console.print(f"metrics on / off: {ratio:.3f} ({verdict} the target {TARGET_RATIO}); "
                  f"{scraper.scrapes} scrapes every {args.scrape_interval:g} s, {scraper.failures} failed")
    rows = [row(SCENARIO, params, "metrics_off_broker_cpu_s_per_gb", per_gb["off"], "cpu_s"),
            row(SCENARIO, params, "metrics_on_broker_cpu_s_per_gb", per_gb["on"], "cpu_s"),
            row(SCENARIO, params, "metrics_cpu_ratio", ratio, "ratio"),
            row(SCENARIO, params, "metrics_scrapes", scraper.scrapes, "scrapes"),
            row(SCENARIO, params, "failed_records", failed, "records")]
    emit(args, console, rows, {}, SCENARIO, params)
    return 0 if not failed and not scraper.failures else 1
