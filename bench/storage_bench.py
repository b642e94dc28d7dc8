"""`raftka bench storage`: storage.Log append/read against plain file I/O."""

import argparse

from bench.cli import add_common_options


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(
        "storage",
        help="append and read back N MiB of 16 KiB batches; compare with plain file writes",
    )
    p.add_argument("--size-mb", type=int, default=256, help="MiB to append (default 256)")
    add_common_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("raftka bench storage: not built yet")
