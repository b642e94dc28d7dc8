"""What the Kafka-admin-style sub-commands (`raftka topics`, `raftka partitions`)
share: a command group whose every command takes `--bootstrap-server` and
`--timeout`, as Kafka's `kafka-*.sh` tools do."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 30.0


def command_group(sub: argparse._SubParsersAction, name: str, help_text: str, doc: str,
                  ) -> Callable[[str, str, Any], argparse.ArgumentParser]:
    """Register `raftka NAME COMMAND ...` with `doc` (a module docstring) as its
    description; returns `command(name, help, func)`, which adds one COMMAND
    with the shared options and returns its parser for the rest."""
    group = sub.add_parser(name, help=help_text, description=doc.splitlines()[0], epilog=doc.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND")
    commands.required = True

    def command(command_name: str, command_help: str, func: Any) -> argparse.ArgumentParser:
        p = commands.add_parser(command_name, help=command_help, description=command_help)
        p.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="H:P",
                       help=f"any broker, or a comma-separated list (default {DEFAULT_BOOTSTRAP})")
        p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                       help=f"give up after S seconds (default {TIMEOUT_S:.0f})")
        p.set_defaults(func=func)
        return p

    return command
