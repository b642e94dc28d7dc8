"""`raftka acls add|remove|list`: manage ACLs, like Kafka's `kafka-acls`.

    raftka acls add    --bootstrap-server H:P [--command-config FILE]
                       (--allow-principal P | --deny-principal P) [--host H] --operation OP [--operation OP ...]
                       (--topic T | --group G | --cluster | --transactional-id T) [--resource-pattern-type prefixed]
    raftka acls remove --bootstrap-server H:P [--command-config FILE] [the same filters; missing ones match all]
    raftka acls list   --bootstrap-server H:P [--command-config FILE] [--topic T | --group G | ...] [--principal P]

`--command-config` is a properties file with the client's security settings
in librdkafka's keys (security.protocol, sasl.mechanism, sasl.username,
sasl.password, ssl.ca.location, ...). Operations: Read, Write, Create,
Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs,
IdempotentWrite, All. Exit status: 0 on success, 1 if the cluster refused,
2 for bad arguments or an unreachable cluster.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from raftka.admin_cli import command_group

_OPERATIONS = ("Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
               "AlterConfigs", "IdempotentWrite", "All")


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "acls", "add, remove and list ACLs (like kafka-acls)", __doc__)
    for name, help_text, func in (("add", "add ACLs", add_main), ("remove", "remove the ACLs that match", remove_main),
                                  ("list", "list the ACLs that match", list_main)):
        p = command(name, help_text, func)
        p.add_argument("--command-config", metavar="FILE", help="client security settings (librdkafka keys)")
        resource = p.add_mutually_exclusive_group(required=name == "add")
        resource.add_argument("--topic")
        resource.add_argument("--group")
        resource.add_argument("--transactional-id")
        resource.add_argument("--cluster", action="store_true")
        p.add_argument("--resource-pattern-type", choices=("literal", "prefixed", "any", "match"),
                       default="literal" if name == "add" else "any")
        p.add_argument("--operation", action="append", default=[], choices=_OPERATIONS, metavar="OP")
        p.add_argument("--host", default="*" if name == "add" else None)
        if name == "list":
            p.add_argument("--principal")
        else:
            who = p.add_mutually_exclusive_group(required=name == "add")
            who.add_argument("--allow-principal", metavar="User:NAME")
            who.add_argument("--deny-principal", metavar="User:NAME")


def _admin(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AdminClient

    from common.config import read_properties

    quiet = logging.getLogger("raftka.acls.librdkafka")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    conf = read_properties(args.command_config) if args.command_config else {}
    return AdminClient({**conf, "bootstrap.servers": args.bootstrap_server,
                        "socket.timeout.ms": int(args.timeout * 1000), "logger": quiet})


def _fail(message: str, code: int) -> int:
    print(f"raftka acls: {message}", file=sys.stderr)
    return code


def _resource(args: argparse.Namespace) -> tuple[Any, str | None]:
    from confluent_kafka.admin import ResourceType

    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.BROKER, "kafka-cluster"
    return ResourceType.ANY, None


def _operation(name: str) -> Any:
    from confluent_kafka.admin import AclOperation

    return AclOperation[{"ClusterAction": "CLUSTER_ACTION", "DescribeConfigs": "DESCRIBE_CONFIGS",
                         "AlterConfigs": "ALTER_CONFIGS", "IdempotentWrite": "IDEMPOTENT_WRITE"}.get(
                             name, name.upper())]


def _principal(args: argparse.Namespace) -> tuple[str | None, Any]:
    from confluent_kafka.admin import AclPermissionType

    if getattr(args, "allow_principal", None):
        return args.allow_principal, AclPermissionType.ALLOW
    if getattr(args, "deny_principal", None):
        return args.deny_principal, AclPermissionType.DENY
    return getattr(args, "principal", None), AclPermissionType.ANY


def _pattern(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import ResourcePatternType

    return ResourcePatternType[args.resource_pattern_type.upper()]


def _run(args: argparse.Namespace, futures: Any) -> list[Any] | int:
    from confluent_kafka import KafkaException

    out = []
    try:
        for future in (futures.values() if isinstance(futures, dict) else [futures]):
            out.append(future.result(args.timeout))
    except KafkaException as exc:
        error = exc.args[0]
        return _fail(f"{error.name()}: {error.str()}", 1)
    return out


def add_main(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AclBinding

    if not args.operation:
        return _fail("give at least one --operation", 2)
    resource_type, name = _resource(args)
    principal, permission = _principal(args)
    bindings = [AclBinding(resource_type, name, _pattern(args), principal, args.host, _operation(op), permission)
                for op in args.operation]
    admin = _admin(args)  # kept: the futures fail once the client is collected
    result = _run(args, admin.create_acls(bindings, request_timeout=args.timeout))
    if isinstance(result, int):
        return result
    for binding in bindings:
        print(f"Added ACL: {_describe(binding)}")
    return 0


def _filter(args: argparse.Namespace) -> list[Any]:
    from confluent_kafka.admin import AclBindingFilter, AclOperation

    resource_type, name = _resource(args)
    principal, permission = _principal(args)
    operations = [_operation(op) for op in args.operation] or [AclOperation.ANY]
    return [AclBindingFilter(resource_type, name, _pattern(args), principal, args.host, op, permission)
            for op in operations]


def remove_main(args: argparse.Namespace) -> int:
    admin = _admin(args)
    result = _run(args, admin.delete_acls(_filter(args), request_timeout=args.timeout))
    if isinstance(result, int):
        return result
    removed = [b for bindings in result for b in bindings]
    for binding in removed:
        print(f"Removed ACL: {_describe(binding)}")
    if not removed:
        print("No ACL matched.")
    return 0


def list_main(args: argparse.Namespace) -> int:
    admin = _admin(args)
    bindings = []
    for acl_filter in _filter(args):
        result = _run(args, admin.describe_acls(acl_filter, request_timeout=args.timeout))
        if isinstance(result, int):
            return result
        bindings += result[0]
    for binding in bindings:
        print(_describe(binding))
    return 0


def _describe(b: Any) -> str:
    return (f"{b.permission_type.name} {b.principal} from {b.host} {b.operation.name} on "
            f"{b.restype.name} {b.resource_pattern_type.name.lower()} {b.name}")
