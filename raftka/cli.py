"""The `raftka` command line.

Each sub-command lives in its own module and registers itself here; the
table below is the one place that lists them.
"""

import argparse
import sys

from raftka import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftka",
        description="A Kafka-compatible replicated commit log whose metadata lives in a Raft quorum.",
    )
    parser.add_argument("--version", action="version", version=f"raftka {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from bench import cli as bench_cli
    from bench import demo
    from raftka import (acls_cli, broker_cli, cluster_cli, controller_cli, dev_cli, partitions_cli, quorum_cli,
                        storage_cli, topics_cli, transactions_cli, users_cli)

    bench_cli.register(sub)
    demo.register(sub)
    broker_cli.register(sub)
    cluster_cli.register(sub)
    dev_cli.register(sub)
    topics_cli.register(sub)
    acls_cli.register(sub)
    users_cli.register(sub)
    controller_cli.register(sub)
    quorum_cli.register(sub)
    from raftka import features_cli

    features_cli.register(sub)
    storage_cli.register(sub)
    partitions_cli.register(sub)
    transactions_cli.register(sub)

    from raftka import configs_cli, dump_log_cli, groups_cli, metadata_shell_cli, quotas_cli, records_cli

    configs_cli.register(sub)
    quotas_cli.register(sub)
    dump_log_cli.register(sub)
    metadata_shell_cli.register(sub)
    groups_cli.register(sub)
    records_cli.register(sub)

    from raftka import chaos_cli, migrate_cli, mirror_cli, report_cli

    migrate_cli.register(sub)
    mirror_cli.register(sub)
    report_cli.register(sub)
    chaos_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
