"""`raftka bench SCENARIO`: the benchmark front door.

Scenarios register here; each takes `--results DIR` (a Parquet dataset the
rows are appended to) and `--json` (one JSON object per measurement on
stdout). A `RaftkaError` out of a scenario is printed as one line
(`raftka bench NAME: ...`, exit 2); the cluster scenarios share
`bench.runner`.
"""

import argparse
import sys
from collections.abc import Callable

DEFAULT_RESULTS_DIR = "bench/results"


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results",
        default=DEFAULT_RESULTS_DIR,
        metavar="DIR",
        help=f"Parquet dataset the result rows are appended to (default {DEFAULT_RESULTS_DIR})",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print one JSON object per measurement on stdout"
    )


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark scenario and write result rows")
    scenarios = bench.add_subparsers(dest="scenario", metavar="SCENARIO")
    scenarios.required = True
    from bench import (consume_bench, controller_failover_bench, failover_bench, latency_bench,
                       metadata_ops_bench, metadata_scale_bench, mirror_bench, omb_bench, produce_bench, quorum_bench, rebalance_bench,
                       storage_bench, suite)

    storage_bench.register(scenarios)
    quorum_bench.register(scenarios)
    produce_bench.register(scenarios)
    consume_bench.register(scenarios)
    latency_bench.register(scenarios)
    failover_bench.register(scenarios)
    controller_failover_bench.register(scenarios)
    metadata_scale_bench.register(scenarios)
    metadata_ops_bench.register(scenarios)
    mirror_bench.register(scenarios)
    rebalance_bench.register(scenarios)
    omb_bench.register(scenarios)
    suite.register(scenarios)
    for name, parser in scenarios.choices.items():
        parser.set_defaults(func=_reporting(name, parser.get_default("func")))


def build_parser() -> argparse.ArgumentParser:
    """A parser of `raftka bench ...` alone: the suite runs its scenarios in
    process with the same arguments a user would type."""
    parser = argparse.ArgumentParser(prog="raftka")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    return parser


def _reporting(name: str, func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`func`, with a RaftkaError (whose message says what to change) printed as one line, exit 2."""
    def run(args: argparse.Namespace) -> int:
        from common.dirs import ensure_dir
        from common.errors import RaftkaError

        try:
            # Made before the run: one that cannot take the rows (or the
            # cluster) fails now, not after minutes of measuring.
            for option in ("results", "dir"):
                path = getattr(args, option, None)
                if path:
                    ensure_dir(f"--{option}", path)
            return func(args)
        except RaftkaError as exc:
            print(f"raftka bench {name}: {exc}", file=sys.stderr)
            return 2

    return run
