"""What the commands that speak the Kafka protocol themselves share
(`raftka configs`, `consumer-groups`, `records`, `log-dirs`, `quotas`):
one trio run bounded by --timeout, requests over raftka's own client, and
Kafka's exit codes (0 done, 1 refused by the cluster, 2 bad arguments or
no answer)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from common.errors import RaftkaError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 30.0


class Refused(RaftkaError):
    """The cluster answered with an error (exit status 1)."""


class Usage(RaftkaError):
    """Bad arguments or an unreachable cluster (exit status 2)."""


def fail(prog: str, message: str, code: int) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"raftka {prog}: {message}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    return code


def command_group(sub: argparse._SubParsersAction, prog: str, help_text: str, doc: str,
                  ) -> Callable[[str, str, Callable[[argparse.Namespace], Awaitable[int]]], argparse.ArgumentParser]:
    """`raftka PROG COMMAND ...`; `command(name, help, async fn)` adds one COMMAND
    with --bootstrap-server (-b) and --timeout and returns its parser."""
    group = sub.add_parser(prog, help=help_text, description=doc.splitlines()[0], epilog=doc.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = group.add_subparsers(dest=f"{prog}_command", metavar="COMMAND")
    commands.required = True

    def command(name: str, command_help: str, fn: Callable[[argparse.Namespace], Awaitable[int]]
                ) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=command_help, description=command_help)
        p.add_argument("--bootstrap-server", "-b", default=DEFAULT_BOOTSTRAP, metavar="H:P",
                       help=f"any broker (default {DEFAULT_BOOTSTRAP})")
        p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                       help=f"give up after S seconds (default {TIMEOUT_S:.0f})")
        p.set_defaults(func=lambda args: run(prog, fn, args))
        return p

    return command


def run(prog: str, fn: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace) -> int:
    import trio

    from common.wire import ConnectionFailedError

    async def main() -> int:
        with trio.fail_after(args.timeout):
            return await fn(args)

    try:
        return trio.run(main)
    except Refused as exc:
        return fail(prog, str(exc), 1)
    except Usage as exc:
        return fail(prog, str(exc), 2)
    except (ConnectionFailedError, OSError) as exc:
        return fail(prog, f"no answer from {args.bootstrap_server}: {exc}", 2)
    except trio.TooSlowError:
        return fail(prog, f"no complete answer within {args.timeout:.0f} s", 2)


def address(text: str) -> tuple[str, int]:
    host, _, port = text.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        raise Usage(f"--bootstrap-server {text!r}: give host:port")
    return host, int(port)


async def request(host: str, port: int, req: Any) -> Any:
    from common.wire import open_connection

    async with open_connection(host, port, client_id="raftka-admin") as conn:
        return await conn.request(req)


async def bootstrap_request(args: argparse.Namespace, req: Any) -> Any:
    return await request(*address(args.bootstrap_server), req)


async def metadata(args: argparse.Namespace, topics: list[str] | None = None) -> Any:
    from kio.schema.metadata.v12 import request as md

    return await bootstrap_request(args, md.MetadataRequest(
        topics=None if topics is None else tuple(md.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))


def error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR {code}"


def table(columns: list[str], rows: list[list[Any]]) -> None:
    """Columns padded to their widest cell, never cut (read by people and scripts)."""
    cells = [columns] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
