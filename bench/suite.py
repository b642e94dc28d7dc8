"""`raftka bench suite [--quick]`: a set of scenarios, each run several times, into one results dir.

The suite runs every entry of its list `--repeats` times (default 3; 2
with --quick), round-robin: entry 1, entry 2, ..., then again. Each run is
a run of its own (own run id, own fresh cluster), so `raftka report` gets
several runs per measurement and shows their spread (IQR) as the noise
figure, and slow drift on a shared machine spreads over every scenario
instead of biasing the one that ran last.

`--quick` is a smoke-sized suite (about 4 minutes on 2 busy cores): small
counts, short phases, short session timeouts; the full suite sweeps the
issue's parameters (record size, acks, RF 1/3, partitions, producers,
fault kinds, both metadata modes) at realistic sizes and takes about 90
minutes. `--only latency,failover` keeps some scenarios. A failing run is reported and the
suite goes on; Ctrl-C stops it (the running scenario stops its cluster).
Every run's environment sidecar names the suite run (`suite_id`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.cli import add_common_options

SCENARIO = "suite"
FAST_SESSION = ["--set", "broker.session.timeout.ms=2000", "--set", "broker.heartbeat.interval.ms=500"]

QUICK: list[tuple[str, list[str]]] = [
    ("produce", ["--count", "20000", "--producers", "1", "--partitions", "2", "--no-ceiling", "--record-size", "100"]),
    ("produce", ["--count", "5000", "--producers", "1", "--partitions", "2", "--no-ceiling", "--record-size", "1000"]),
    ("consume", ["--count", "20000", "--producers", "1", "--consumers", "1", "--partitions", "2"]),
    ("latency", ["--rate", "500", "--duration", "3", "--warmup", "1"]),
    ("failover", ["--partitions", "3", *FAST_SESSION]),
    ("controller-failover", []),
    ("metadata-scale", ["--partitions", "100", "--topics", "2", "--brokers", "2"]),
    ("storage", ["--size-mb", "64"]),
    ("quorum", ["--only", "writes,failover", "--duration", "1", "--failover-runs", "1", "--writers", "8",
                "--batch-writers", "2"]),
]

FULL: list[tuple[str, list[str]]] = [
    *[("produce", ["--duration", "10", "--record-size", size, "--acks", acks])
      for size in ("100", "1000", "10000") for acks in ("0", "1", "all")],
    *[("produce", ["--duration", "10", "--linger-ms", linger, "--batch-size", batch])
      for linger, batch in (("0", "16384"), ("20", "1000000"))],
    *[("produce", ["--duration", "10", "--partitions", parts, "--producers", producers])
      for parts, producers in (("1", "1"), ("12", "4"))],
    ("produce", ["--duration", "10", "--brokers", "3", "--replication-factor", "3", "--acks", "1"]),
    ("consume", ["--count", "8000000"]),
    ("consume", ["--count", "800000", "--record-size", "1000"]),
    ("latency", ["--rate", "1000", "--duration", "30"]),
    ("latency", ["--rate", "5000", "--duration", "30", "--partitions", "6"]),
    ("latency", ["--rate", "1000", "--duration", "30", "--acks", "all"]),
    *[("failover", ["--partitions", parts, "--fault", fault])
      for parts in ("6", "60") for fault in ("kill", "stop", "term")],
    *[("controller-failover", ["--fault", fault]) for fault in ("kill", "stop", "term")],
    ("metadata-scale", ["--partitions", "1000"]),
    ("metadata-scale", ["--partitions", "10000", "--topics", "100"]),
    ("produce", ["--duration", "10", "--rf", "3", "--acks", "all"]),
    # Issue #5's failover figures, and issue #8's modes side by side (same parameters in each mode).
    *[("failover", ["--mode", mode, "--led-partitions", led, "--acks", "all", "--fault", fault, "--dir", "/dev/shm"])
      for mode in ("kraft", "zk") for led, fault in (("10", "kill"), ("1000", "kill"), ("1000", "term"))],
    *[("controller-failover", ["--mode", mode, "--brokers", "3"]) for mode in ("kraft", "zk")],
    *[("topic-create", ["--mode", mode, "--topics", "100", "--dir", "/dev/shm"]) for mode in ("kraft", "zk")],
    *[("metadata-scale", ["--mode", mode, "--partitions", "1000", "--controllers", "1", "--dir", "/dev/shm"])
      for mode in ("kraft", "zk")],
    *[("cold-start", ["--mode", mode, "--partitions", "1000", "--dir", "/dev/shm"]) for mode in ("kraft", "zk")],
    ("storage", []),
    ("quorum", ["--failover-runs", "3"]),
]


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="run a set of scenarios with repeats (noise figures for the report)",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the smoke-sized suite (about 4 minutes)")
    p.add_argument("--repeats", type=int, default=None, help="runs of each entry (default 3; 2 with --quick)")
    p.add_argument("--only", default=None, metavar="NAMES", help="comma-separated scenarios to keep")
    p.add_argument("--list", action="store_true", help="print the runs the suite would do, and exit")
    p.add_argument("--dir", default=None, help="where the clusters' temp dirs go (default: system temp)")
    add_common_options(p)
    p.set_defaults(func=run)


def plan(quick: bool, repeats: int, only: set[str] | None) -> list[tuple[str, list[str]]]:
    """The runs, in order: every kept entry once per repeat, round-robin."""
    entries = [(name, argv) for name, argv in (QUICK if quick else FULL) if only is None or name in only]
    return [entry for _ in range(repeats) for entry in entries]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from bench.results import new_run_id

    console = Console(stderr=args.json)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    only = None if args.only is None else {s.strip() for s in args.only.split(",") if s.strip()}
    known = {name for name, _ in QUICK + FULL}
    if only is not None and not only <= known:
        raise SystemExit(f"raftka bench suite: --only {sorted(only - known)}: not in the suite; "
                         f"choose from {', '.join(sorted(known))}")
    if repeats < 1:
        raise SystemExit("raftka bench suite: --repeats must be >= 1")
    runs = plan(args.quick, repeats, only)
    if args.list:
        for name, argv in runs:
            console.print(" ".join(["raftka bench", name, *argv]), markup=False, highlight=False)
        return 0
    suite_id = new_run_id()
    console.rule(f"bench suite {suite_id}: {len(runs)} runs ({'quick' if args.quick else 'full'}, "
                 f"{repeats} repeats) into {args.results}")
    outcomes: list[tuple[str, list[str], str, float]] = []
    try:
        for i, (name, argv) in enumerate(runs, 1):
            console.rule(f"[{i}/{len(runs)}] raftka bench {name} {' '.join(argv)}")
            t0 = time.monotonic()
            outcomes.append((name, argv, _run_one(name, argv, args, suite_id, console), time.monotonic() - t0))
    except KeyboardInterrupt:
        console.print("[yellow]suite interrupted[/yellow]")
        _summary(console, outcomes, len(runs))
        raise
    _summary(console, outcomes, len(runs))
    console.print(f"next: raftka report --results {args.results}")
    return 0 if all(status == "ok" for _, _, status, _ in outcomes) else 1


def _run_one(name: str, argv: list[str], args: argparse.Namespace, suite_id: str, console: Any) -> str:
    from bench.cli import build_parser
    from common.errors import RaftkaError

    full = ["bench", name, *argv, "--results", args.results] + (["--json"] if args.json else [])
    if args.dir:
        full += ["--dir", args.dir]
    ns = build_parser().parse_args(full)
    ns.suite_id = suite_id
    try:
        code = int(ns.func(ns) or 0)
    except (RaftkaError, RuntimeError, OSError) as exc:
        console.print(f"[red]{name} failed: {exc}[/red]")
        return "error"
    except SystemExit as exc:
        console.print(f"[red]{name} refused its arguments: {exc}[/red]")
        return "error"
    return "ok" if code == 0 else f"exit {code}"


def _summary(console: Any, outcomes: list[tuple[str, list[str], str, float]], planned: int) -> None:
    from rich.table import Table

    table = Table(title=f"suite: {len(outcomes)} of {planned} runs done")
    for column in ("scenario", "arguments", "status", "seconds"):
        table.add_column(column)
    for name, argv, status, seconds in outcomes:
        table.add_row(name, " ".join(argv), status if status == "ok" else f"[red]{status}[/red]", f"{seconds:.0f}")
    console.print(table)
