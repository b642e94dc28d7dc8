"""`raftka users add|delete|list`: SCRAM users in the metadata log (KIP-554),
like Kafka's `kafka-configs --entity-type users --alter --add-config SCRAM-...`.

    raftka users add    --bootstrap-server H:P [--command-config FILE] --user U --password P
                        [--mechanism SCRAM-SHA-256|SCRAM-SHA-512 ...] [--iterations N]
    raftka users delete --bootstrap-server H:P [--command-config FILE] --user U [--mechanism M ...]
    raftka users list   --bootstrap-server H:P [--command-config FILE]

`--command-config` is a properties file with the admin client's security
settings in librdkafka's keys. The password goes to the broker salted
(SaltedPassword, never the password itself). Exit status: 0 on success, 1 if
the cluster refused, 2 for bad arguments or an unreachable cluster.
"""

from __future__ import annotations

import argparse
import sys

from raftka.acls_cli import _admin
from raftka.admin_cli import command_group

_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "users", "add, delete and list SCRAM users (like kafka-configs --entity-type users)",
                            __doc__)
    for name, help_text, func in (("add", "add a user or change its password", add_main),
                                  ("delete", "delete a user's credentials", delete_main),
                                  ("list", "list users and their mechanisms", list_main)):
        p = command(name, help_text, func)
        p.add_argument("--command-config", metavar="FILE", help="client security settings (librdkafka keys)")
        if name != "list":
            p.add_argument("--user", required=True)
            p.add_argument("--mechanism", action="append", default=[], choices=_MECHANISMS,
                           help="default: both")
        if name == "add":
            p.add_argument("--password", required=True)
            p.add_argument("--iterations", type=int, default=4096, help="4096-16384 (default 4096)")


def _fail(message: str, code: int) -> int:
    print(f"raftka users: {message}", file=sys.stderr)
    return code


def _mechanisms(args: argparse.Namespace) -> list:
    from confluent_kafka.admin import ScramMechanism

    return [ScramMechanism[m.replace("-", "_")] for m in (args.mechanism or _MECHANISMS)]


def _alter(args: argparse.Namespace, changes: list, done: str) -> int:
    from confluent_kafka import KafkaException

    admin = _admin(args)  # kept: the futures fail once the client is collected
    try:
        for future in admin.alter_user_scram_credentials(changes, request_timeout=args.timeout).values():
            future.result(args.timeout)
    except KafkaException as exc:
        error = exc.args[0]
        return _fail(f"{error.name()}: {error.str()}", 1)
    print(done)
    return 0


def add_main(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import ScramCredentialInfo, UserScramCredentialUpsertion

    changes = [UserScramCredentialUpsertion(args.user, ScramCredentialInfo(m, args.iterations), args.password.encode())
               for m in _mechanisms(args)]
    return _alter(args, changes, f"Set {', '.join(args.mechanism or _MECHANISMS)} credentials of {args.user}.")


def delete_main(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import UserScramCredentialDeletion

    changes = [UserScramCredentialDeletion(args.user, m) for m in _mechanisms(args)]
    return _alter(args, changes, f"Deleted {', '.join(args.mechanism or _MECHANISMS)} credentials of {args.user}.")


def list_main(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    admin = _admin(args)
    try:
        described = admin.describe_user_scram_credentials(request_timeout=args.timeout).result(args.timeout)
    except KafkaException as exc:
        error = exc.args[0]
        return _fail(f"{error.name()}: {error.str()}", 1)
    for user, description in sorted(described.items()):
        infos = ", ".join(f"{i.mechanism.name.replace('_', '-')} (iterations {i.iterations})"
                          for i in description.scram_credential_infos)
        print(f"{user}: {infos}")
    return 0
