"""`raftka configs describe|alter`: topic and broker configs, like Kafka's `kafka-configs`.

    raftka configs describe -b H:P --entity-type topics|brokers (--entity-name N | --entity-default) [--all]
    raftka configs alter    -b H:P --entity-type topics|brokers (--entity-name N | --entity-default)
                            [--add-config K=V,K2=V2] [--delete-config K,K2]

describe prints one line per key: its value, where it comes from
(DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
STATIC_BROKER_CONFIG, DEFAULT_CONFIG) and whether it is read-only. Without
--all only the keys set somewhere other than Kafka's defaults are shown, as
kafka-configs does. A broker is described by that broker (its properties
file is there); --entity-default is the cluster-wide broker default.

alter changes dynamic configs with IncrementalAlterConfigs: --add-config
sets keys (a list value in square brackets: cleanup.policy=[compact,delete]),
--delete-config removes them so the next level's value applies. Broker
keys that need a restart are refused with the key named.

Exit status: 0 on success, 1 if the cluster refused, 2 for bad arguments
or an unreachable cluster.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftka import wire_cli
from raftka.wire_cli import Refused, Usage

_TYPES = {"topics": 2, "brokers": 4}
_SOURCES = {1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
            4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG"}


def register(sub: argparse._SubParsersAction) -> None:
    command = wire_cli.command_group(sub, "configs", "describe and alter topic and broker configs (like kafka-configs)",
                                     __doc__)
    describe = command("describe", "the configs of a topic or broker, with their sources", _describe)
    alter = command("alter", "set or delete dynamic configs of a topic, a broker or every broker", _alter)
    for p in (describe, alter):
        p.add_argument("--entity-type", required=True, choices=sorted(_TYPES))
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--entity-name", metavar="N", help="the topic name or broker id")
        which.add_argument("--entity-default", action="store_true", help="the default of every broker")
    describe.add_argument("--all", action="store_true", help="also the keys at Kafka's defaults")
    alter.add_argument("--add-config", default="", metavar="K=V,...", help="keys to set")
    alter.add_argument("--delete-config", default="", metavar="K,...", help="keys to remove")


def _resource(args: argparse.Namespace) -> tuple[int, str]:
    kind = _TYPES[args.entity_type]
    if args.entity_default and kind != 4:
        raise Usage("--entity-default is for --entity-type brokers only")
    return kind, "" if args.entity_default else args.entity_name


async def _target(args: argparse.Namespace, kind: int, name: str) -> tuple[str, int]:
    """Where to send a broker resource: that broker (Kafka's rule)."""
    if kind != 4 or name == "":
        return wire_cli.address(args.bootstrap_server)
    if not name.isdigit():
        raise Usage(f"--entity-name {name!r}: a broker is named by its node id")
    for broker in (await wire_cli.metadata(args, [])).brokers:
        if broker.node_id == int(name):
            return broker.host, broker.port
    raise Refused(f"broker {name} is not in the cluster's metadata")


async def _describe(args: argparse.Namespace) -> int:
    from kio.schema.describe_configs.v4 import request as dc

    kind, name = _resource(args)
    host, port = await _target(args, kind, name)
    answer = await wire_cli.request(host, port, dc.DescribeConfigsRequest(resources=(dc.DescribeConfigsResource(
        resource_type=kind, resource_name=name, configuration_keys=None),), include_synonyms=False,
        include_documentation=False))
    (result,) = answer.results
    if result.error_code != 0:
        raise Refused(f"{wire_cli.error_name(result.error_code)}: {result.error_message}")
    label = {2: "topic", 4: "broker"}[kind]
    print(f"Configs for {'default broker' if name == '' else f'{label} {name}'}:")
    for c in sorted(result.configs, key=lambda c: c.name):
        if not args.all and int(c.config_source) == 5:
            continue
        flags = " read-only" if c.read_only else ""
        value = "(sensitive)" if c.is_sensitive else ("null" if c.value is None else c.value)
        print(f"  {c.name}={value} {_SOURCES.get(int(c.config_source), 'UNKNOWN')}{flags}")
    return 0


def _pairs(text: str) -> list[tuple[str, str]]:
    """K=V,K2=[a,b]: Kafka's syntax, brackets around list values."""
    out, depth, cur = [], 0, ""
    for ch in text + ",":
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            if cur.strip():
                key, eq, value = cur.partition("=")
                if not eq or not key.strip():
                    raise Usage(f"--add-config {cur!r}: give KEY=VALUE")
                value = value.strip()
                if value.startswith("[") and value.endswith("]"):
                    value = value[1:-1]
                out.append((key.strip(), value))
            cur = ""
        else:
            cur += ch
    return out


async def _alter(args: argparse.Namespace) -> int:
    from kio.schema.incremental_alter_configs.v1 import request as iac

    kind, name = _resource(args)
    sets = _pairs(args.add_config)
    deletes = [k.strip() for k in args.delete_config.split(",") if k.strip()]
    if not sets and not deletes:
        raise Usage("nothing to change: give --add-config and/or --delete-config")
    ops: list[Any] = [iac.AlterableConfig(name=k, config_operation=0, value=v) for k, v in sets]
    ops += [iac.AlterableConfig(name=k, config_operation=1, value=None) for k in deletes]
    answer = await wire_cli.bootstrap_request(args, iac.IncrementalAlterConfigsRequest(resources=(
        iac.AlterConfigsResource(resource_type=kind, resource_name=name, configs=tuple(ops)),), validate_only=False))
    (result,) = answer.responses
    if result.error_code != 0:
        raise Refused(f"{wire_cli.error_name(result.error_code)}: {result.error_message}")
    what = "the default broker" if name == "" else f"{args.entity_type[:-1]} {name}"
    print(f"Completed updating config for {what}.")
    return 0
