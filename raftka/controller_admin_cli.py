"""What the sub-commands that ask the controller quorum (`raftka quorum`,
`raftka features`) share, as Kafka's kafka-metadata-quorum and
kafka-features do: a command group whose every command takes
`--bootstrap-controller HOST:PORT` (any controller) and `--timeout-ms`, and
the request a command sends to the quorum's leader, which DescribeQuorum
names."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from common.errors import RaftkaError
from common.wire import open_connection
from quorum.node.describe_quorum import describe_quorum


def command_group(sub: argparse._SubParsersAction, name: str, help_text: str, doc: str,
                  ) -> Callable[..., argparse.ArgumentParser]:
    """Register `raftka NAME COMMAND ...` with `doc` (a module docstring) as its
    description; returns `command(name, help, func, timeout_ms=...)`, which
    adds one COMMAND with the shared options and returns its parser for the
    rest. A command that finds a controller without being told
    (`bootstrap_required=False`) says how in `bootstrap_help`."""
    group = sub.add_parser(name, help=help_text, description=doc.splitlines()[0])
    commands = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND")
    commands.required = True

    def command(command_name: str, command_help: str, func: Callable[[argparse.Namespace], int], *,
                timeout_ms: int, bootstrap_required: bool = True, bootstrap_help: str | None = None,
                ) -> argparse.ArgumentParser:
        p = commands.add_parser(command_name, help=command_help)
        p.add_argument("--bootstrap-controller", required=bootstrap_required, metavar="HOST:PORT",
                       help=bootstrap_help)
        p.add_argument("--timeout-ms", type=int, default=timeout_ms)
        p.set_defaults(func=func)
        return p

    return command


def parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise RaftkaError(f"--bootstrap-controller {value!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


async def ask_leader(host: str, port: int, request: Any, timeout_ms: int) -> Any:
    """Send `request` to the leader DescribeQuorum names."""
    d = await describe_quorum(host, port, timeout_ms)
    if d.leader_id < 0 or d.leader_id not in d.nodes:
        raise RaftkaError(f"the quorum at {host}:{port} names no leader with an endpoint yet; retry in a moment")
    leader_host, leader_port = d.nodes[d.leader_id]
    async with open_connection(leader_host, leader_port, connect_timeout_ms=timeout_ms) as conn:
        return await conn.request(request, timeout_ms=timeout_ms + 5000)
