"""`raftka quotas describe|alter`: client quotas (KIP-546), like Kafka's
`kafka-configs --entity-type users/clients --describe|--alter`.

    raftka quotas describe -b H:P [--user U | --user-defaults] [--client C | --client-defaults]
                                  [--ip A | --ip-defaults]
    raftka quotas alter    -b H:P (--user U | --user-defaults) ... --add-config K=V[,K=V] --delete-config K[,K]

Keys: producer_byte_rate and consumer_byte_rate (bytes per second, per
broker) and request_percentage (percent of one request thread, per broker)
on a user, a client id, or a user with a client id; connection_creation_rate
(new connections per second, per broker, KIP-612) on an IP address alone.
The defaults stand for every user (client id, address) that has no quota
of its own. describe without an entity lists every quota;
with one, only that entity's. Exit status: 0 on success, 1 if the cluster
refused, 2 for bad arguments or an unreachable cluster.
"""

from __future__ import annotations

import argparse

from raftka import wire_cli
from raftka.wire_cli import Refused, Usage


def register(sub: argparse._SubParsersAction) -> None:
    command = wire_cli.command_group(sub, "quotas", "describe and alter client quotas (like kafka-configs "
                                     "--entity-type users/clients)", __doc__)
    describe = command("describe", "the quotas of an entity, or every quota", _describe)
    alter = command("alter", "set or delete an entity's quotas", _alter)
    for p in (describe, alter):
        p.add_argument("--user", metavar="U", help="a user (principal name without 'User:')")
        p.add_argument("--user-defaults", action="store_true", help="the default user")
        p.add_argument("--client", metavar="C", help="a client id")
        p.add_argument("--client-defaults", action="store_true", help="the default client id")
        p.add_argument("--ip", metavar="A", help="an IP address (connection_creation_rate only)")
        p.add_argument("--ip-defaults", action="store_true", help="the default IP address")
    alter.add_argument("--add-config", default="", metavar="K=V,...", help="quotas to set")
    alter.add_argument("--delete-config", default="", metavar="K,...", help="quotas to remove")


def _entity(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    if args.user is not None and args.user_defaults:
        raise Usage("give --user or --user-defaults, not both")
    if args.client is not None and args.client_defaults:
        raise Usage("give --client or --client-defaults, not both")
    entity: list[tuple[str, str | None]] = []
    if args.user is not None or args.user_defaults:
        entity.append(("user", args.user))
    if args.client is not None or args.client_defaults:
        entity.append(("client-id", args.client))
    if args.ip is not None and args.ip_defaults:
        raise Usage("give --ip or --ip-defaults, not both")
    if args.ip is not None or args.ip_defaults:
        if entity:
            raise Usage("an IP address takes no user or client id: give --ip (or --ip-defaults) alone")
        entity.append(("ip", args.ip))
    return entity


def _describe_entity(entity) -> str:
    names = {"user": "user-principal", "client-id": "client-id"}
    return ", ".join(f"{names.get(t, t)} {'<default>' if n is None else repr(n)}" for t, n in entity)


async def _describe(args: argparse.Namespace) -> int:
    from kio.schema.describe_client_quotas.v1 import request as dcq
    from kio.static.primitive import i8

    entity = _entity(args)
    answer = await wire_cli.bootstrap_request(args, dcq.DescribeClientQuotasRequest(components=tuple(
        dcq.ComponentData(entity_type=t, match_type=i8(1 if n is None else 0), match=n) for t, n in entity),
        strict=bool(entity)))
    if answer.error_code != 0:
        raise Refused(f"{wire_cli.error_name(answer.error_code)}: {answer.error_message}")
    for entry in answer.entries or ():
        values = ",".join(f"{v.key}={v.value}" for v in entry.values)
        parts = sorted(((e.entity_type, e.entity_name) for e in entry.entity), key=lambda p: p[0] != "user")
        print(f"Quota configs for {_describe_entity(parts)} are {values}")
    return 0


async def _alter(args: argparse.Namespace) -> int:
    from kio.schema.alter_client_quotas.v1 import request as acq

    entity = _entity(args)
    if not entity:
        raise Usage("give the entity: --user U, --user-defaults, --client C, --client-defaults, --ip A "
                    "or --ip-defaults")
    ops = []
    for item in (x.strip() for x in args.add_config.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise Usage(f"--add-config {item!r}: expected KEY=NUMBER, e.g. producer_byte_rate=1048576")
        ops.append(acq.OpData(key=key.strip(), value=number, remove=False))
    ops += [acq.OpData(key=k.strip(), value=0.0, remove=True) for k in args.delete_config.split(",") if k.strip()]
    if not ops:
        raise Usage("nothing to change: give --add-config and/or --delete-config")
    answer = await wire_cli.bootstrap_request(args, acq.AlterClientQuotasRequest(entries=(acq.EntryData(
        entity=tuple(acq.EntityData(entity_type=t, entity_name=n) for t, n in entity), ops=tuple(ops)),),
        validate_only=False))
    (result,) = answer.entries
    if result.error_code != 0:
        raise Refused(f"{wire_cli.error_name(result.error_code)}: {result.error_message}")
    print(f"Completed updating quotas for {_describe_entity(entity)}.")
    return 0
