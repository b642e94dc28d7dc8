"""`raftka topics create|list|describe|delete`: manage topics, like Kafka's `kafka-topics`.

    raftka topics create   --bootstrap-server H:P --topic T [--partitions N] [--replication-factor R]
                           [--config KEY=VALUE ...] [--if-not-exists]
    raftka topics list     --bootstrap-server H:P
    raftka topics describe --bootstrap-server H:P [--topic T ...]
    raftka topics delete   --bootstrap-server H:P --topic T [--if-exists]

Talks to any broker with confluent-kafka's AdminClient (the broker forwards
the change to the active controller) and returns once the change is done.
Exit status: 0 on success, 1 if the cluster refused, 2 for bad arguments or
an unreachable cluster.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from raftka.admin_cli import command_group


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "topics", "create, list, describe and delete topics (like kafka-topics)", __doc__)

    create = command("create", "create a topic", create_main)
    create.add_argument("--topic", required=True)
    create.add_argument("--partitions", type=int, default=-1, metavar="N",
                        help="default: the cluster's num.partitions")
    create.add_argument("--replication-factor", type=int, default=-1, metavar="R",
                        help="default: the cluster's default.replication.factor")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config, e.g. --config retention.ms=60000")
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    command("list", "list topic names", list_main)
    describe = command("describe", "partitions, leaders, replicas and ISRs of topics", describe_main)
    describe.add_argument("--topic", action="append", default=[], help="only these topics (default: all)")
    delete = command("delete", "delete a topic and its data", delete_main)
    delete.add_argument("--topic", required=True)
    delete.add_argument("--if-exists", action="store_true", help="succeed if the topic does not exist")


def _admin(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AdminClient

    # librdkafka's own log lines (one per failed connect) would bury our message.
    quiet = logging.getLogger("raftka.topics.librdkafka")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    return AdminClient({"bootstrap.servers": args.bootstrap_server, "socket.timeout.ms": int(args.timeout * 1000),
                        "logger": quiet})


def _fail(message: str, code: int) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"raftka topics: {message}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    return code


def _metadata(admin: Any, args: argparse.Namespace, topic: str | None = None) -> Any:
    from confluent_kafka import KafkaException

    try:
        return admin.list_topics(topic=topic, timeout=args.timeout)
    except KafkaException as exc:
        raise _Unreachable(f"no broker at {args.bootstrap_server} answered: {exc.args[0].str()}") from None


class _Unreachable(Exception):
    pass


def _wrap(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _Unreachable as exc:
            return _fail(str(exc), 2)
        except ModuleNotFoundError as exc:
            if exc.name != "confluent_kafka":
                raise
            return _fail("needs confluent-kafka: pip install confluent-kafka (or raftka[test])", 2)
    return run


@_wrap
def create_main(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from common.config import parse_overrides
    from common.errors import RaftkaError

    try:
        configs = parse_overrides(args.config)
    except RaftkaError as exc:
        return _fail(str(exc).replace("--set", "--config"), 2)
    admin = _admin(args)
    _metadata(admin, args)
    new = NewTopic(args.topic, num_partitions=args.partitions, replication_factor=args.replication_factor,
                   config=configs)
    future = admin.create_topics([new], operation_timeout=args.timeout, request_timeout=args.timeout)[args.topic]
    try:
        future.result(args.timeout)
    except KafkaException as exc:
        error = exc.args[0]
        if error.code() == KafkaError.TOPIC_ALREADY_EXISTS and args.if_not_exists:
            print(f"Topic {args.topic} already exists.")
            return 0
        return _fail(f"cannot create {args.topic}: {error.name()}: {error.str()}", 1)
    print(f"Created topic {args.topic}.")
    return 0


@_wrap
def list_main(args: argparse.Namespace) -> int:
    for name in sorted(_metadata(_admin(args), args).topics):
        print(name)
    return 0


@_wrap
def describe_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    admin = _admin(args)
    metadata = _metadata(admin, args)
    names = args.topic or sorted(metadata.topics)
    missing = [n for n in names if n not in metadata.topics or metadata.topics[n].error is not None]
    if missing:
        return _fail(f"no such topic: {', '.join(missing)}", 1)
    configs = _topic_configs(admin, names, args.timeout)
    console = Console()
    for name in names:
        topic = metadata.topics[name]
        partitions = sorted(topic.partitions.values(), key=lambda p: p.id)
        rf = len(partitions[0].replicas) if partitions else 0
        title = f"Topic: {name}  PartitionCount: {len(partitions)}  ReplicationFactor: {rf}"
        console.print(f"[bold]{title}[/bold]", highlight=False)
        console.print(_configs_caption(configs.get(name)), highlight=False, markup=False)
        table = Table()
        for column in ("Partition", "Leader", "Replicas", "Isr", "Error"):
            table.add_column(column, justify="right" if column in ("Partition", "Leader") else "left")
        for p in partitions:
            error = "" if p.error is None else p.error.name()
            table.add_row(str(p.id), str(p.leader) if p.leader >= 0 else "none",
                          ",".join(map(str, p.replicas)), ",".join(map(str, p.isrs)), error)
        console.print(table)
    return 0


def _topic_configs(admin: Any, names: list[str], timeout: float) -> dict[str, dict[str, str]]:
    """The configs set on each topic (not the defaults); {} where the broker would not say."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ConfigSource

    out: dict[str, dict[str, str]] = {}
    if not names:
        return out
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names],
                                     request_timeout=timeout)
    for resource, future in futures.items():
        try:
            entries = future.result(timeout)
        except KafkaException:
            continue
        out[resource.name] = {k: e.value for k, e in entries.items()
                              if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}
    return out


def _configs_caption(configs: dict[str, str] | None) -> str:
    if not configs:
        return "Configs: (defaults)"
    return "Configs: " + ", ".join(f"{k}={v}" for k, v in sorted(configs.items()))


@_wrap
def delete_main(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError, KafkaException

    admin = _admin(args)
    _metadata(admin, args)
    future = admin.delete_topics([args.topic], operation_timeout=args.timeout,
                                 request_timeout=args.timeout)[args.topic]
    try:
        future.result(args.timeout)
    except KafkaException as exc:
        error = exc.args[0]
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and args.if_exists:
            print(f"Topic {args.topic} does not exist.")
            return 0
        return _fail(f"cannot delete {args.topic}: {error.name()}: {error.str()}", 1)
    print(f"Deleted topic {args.topic}.")
    return 0

