"""`raftka consumer-groups list|describe|delete|reset-offsets`: like Kafka's `kafka-consumer-groups`.

    raftka consumer-groups list          -b H:P [--state [Stable,Empty]] [--type [classic,consumer]]
    raftka consumer-groups describe      -b H:P --group G [--members | --state] [--verbose]
    raftka consumer-groups delete        -b H:P --group G [--group G2 ...]
    raftka consumer-groups reset-offsets -b H:P --group G (--topic T[:P,P] ... | --all-topics)
                                         (--to-earliest | --to-latest | --to-offset O | --shift-by N |
                                          --to-datetime YYYY-MM-DDTHH:mm:SS.sss | --by-duration PnDTnHnMnS)
                                         [--dry-run | --execute]

list shows classic groups (JoinGroup/SyncGroup) and consumer-protocol
groups (KIP-848, `group.protocol=consumer`); --type adds a TYPE column
and, given types, lists only those; --state adds a STATE column likewise.
describe prints each partition's committed offset, log end offset and lag,
with the member that owns it; --members lists the members and how many
partitions each owns (for a consumer-protocol group also the PROTOCOL
each member speaks: classic for a JoinGroup/SyncGroup member during an
online upgrade or downgrade, consumer otherwise), and --verbose adds, for a consumer-protocol group,
each member's epoch and partitions and the target epoch and assignment;
--state --verbose adds the group epoch and the target assignment epoch.
reset-offsets computes the new committed
offsets (clamped to each partition's earliest and latest offset, as Kafka
does), prints them, and commits them with --execute only (--dry-run is the
default); the group must have no active members. Uses confluent-kafka's
AdminClient.

Exit status: 0 on success, 1 if the cluster refused, 2 for bad arguments
or an unreachable cluster.
"""

from __future__ import annotations

import argparse
import datetime
import re
from typing import Any

from raftka import wire_cli

_PROG = "consumer-groups"


def register(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser(_PROG, help="list, describe, delete consumer groups and reset their offsets "
                           "(like kafka-consumer-groups)", description=__doc__.splitlines()[0],
                           epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = group.add_subparsers(dest="groups_command", metavar="COMMAND")
    commands.required = True

    def command(name: str, help_text: str, fn: Any) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--bootstrap-server", "-b", default=wire_cli.DEFAULT_BOOTSTRAP, metavar="H:P")
        p.add_argument("--timeout", type=float, default=wire_cli.TIMEOUT_S, metavar="S")
        p.set_defaults(func=lambda args: _run(fn, args))
        return p

    listing = command("list", "every consumer group", _list)
    listing.add_argument("--state", nargs="?", const="", default=None, metavar="S,S",
                         help="add a STATE column; given states, only groups in these states")
    listing.add_argument("--type", nargs="?", const="", default=None, metavar="T,T",
                         help="add a TYPE column (classic or consumer); given types, only groups of these types")
    describe = command("describe", "a group's offsets and lag, members or state", _describe)
    describe.add_argument("--group", required=True, metavar="G")
    which = describe.add_mutually_exclusive_group()
    which.add_argument("--members", action="store_true")
    which.add_argument("--state", action="store_true")
    describe.add_argument("--verbose", action="store_true",
                          help="with --members or --state: the epochs and target assignment of a "
                          "consumer-protocol group")
    delete = command("delete", "delete groups (with no active members) and their offsets", _delete)
    delete.add_argument("--group", action="append", required=True, metavar="G")
    reset = command("reset-offsets", "set a group's committed offsets", _reset)
    reset.add_argument("--group", required=True, metavar="G")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="T[:P,P]")
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    spec = reset.add_mutually_exclusive_group(required=True)
    spec.add_argument("--to-earliest", action="store_true")
    spec.add_argument("--to-latest", action="store_true")
    spec.add_argument("--to-current", action="store_true")
    spec.add_argument("--to-offset", type=int, metavar="O")
    spec.add_argument("--shift-by", type=int, metavar="N")
    spec.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    spec.add_argument("--by-duration", metavar="PnDTnHnMnS")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the new offsets only (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")


class _Failed(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _run(fn: Any, args: argparse.Namespace) -> int:
    try:
        return fn(args)
    except _Failed as exc:
        return wire_cli.fail(_PROG, str(exc), exc.code)


def _admin(args: argparse.Namespace) -> Any:
    import logging

    from confluent_kafka.admin import AdminClient

    quiet = logging.getLogger("raftka.groups.librdkafka")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    admin = AdminClient({"bootstrap.servers": args.bootstrap_server, "logger": quiet})
    try:
        admin.list_topics(timeout=args.timeout)
    except Exception as exc:  # KafkaException: no broker answered
        raise _Failed(f"no broker at {args.bootstrap_server} answered: {exc}", 2) from None
    return admin


def _result(future: Any, args: argparse.Namespace, what: str) -> Any:
    from confluent_kafka import KafkaException

    try:
        return future.result(args.timeout)
    except KafkaException as exc:
        error = exc.args[0]
        raise _Failed(f"{what}: {error.name()}: {error.str()}", 1) from None


def _list(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupType

    admin = _admin(args)
    states = set()
    for s in (x.strip() for x in (args.state or "").split(",") if x.strip()):
        try:
            # librdkafka spells the rebalancing states PREPARING_REBALANCING, COMPLETING_REBALANCING.
            name = re.sub(r"(?<!^)(?=[A-Z])", "_", s).upper()
            states.add(ConsumerGroupState[name + "ING" if name.endswith("_REBALANCE") else name])
        except KeyError:
            raise _Failed(f"--state {s}: use Stable, Empty, PreparingRebalance, CompletingRebalance or Dead",
                          2) from None
    types = set()
    for t in (x.strip() for x in (args.type or "").split(",") if x.strip()):
        if t.lower() not in ("classic", "consumer"):
            raise _Failed(f"--type {t}: use classic or consumer", 2)
        types.add(ConsumerGroupType[t.upper()])
    listed = _result(admin.list_consumer_groups(request_timeout=args.timeout, states=states, types=types),
                     args, "ListGroups")
    rows = sorted((g.group_id, _type(g), _state(g.state)) for g in listed.valid)
    columns = ["GROUP"] + (["TYPE"] if args.type is not None else []) + (["STATE"] if args.state is not None else [])
    if len(columns) == 1:
        for group_id, _, _ in rows:
            print(group_id)
        return 0
    wire_cli.table(columns, [[g] + ([t] if args.type is not None else []) + ([s] if args.state is not None else [])
                             for g, t, s in rows])
    return 0


def _type(group: Any) -> str:
    # librdkafka reports UNKNOWN for a broker that does not say (ListGroups < v5).
    kind = getattr(group, "type", None)
    return "Unknown" if kind is None else kind.name.capitalize()


def _state(state: Any) -> str:
    # PREPARING_REBALANCING -> PreparingRebalance, the name Kafka's tool prints.
    name = state.name[:-3] + "E" if state.name.endswith("_REBALANCING") else state.name
    return "".join(w.capitalize() for w in name.split("_"))


def _committed(admin: Any, group: str, args: argparse.Namespace) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=args.timeout)
    result = _result(futures[group], args, f"OffsetFetch {group}")
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


def _offsets(admin: Any, partitions: list[tuple[str, int]], spec: Any, args: argparse.Namespace) -> dict:
    from confluent_kafka import TopicPartition

    if not partitions:
        return {}
    futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions},
                                 request_timeout=args.timeout)
    return {(tp.topic, tp.partition): _result(f, args, f"ListOffsets {tp.topic}-{tp.partition}").offset
            for tp, f in futures.items()}


def _describe(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(args)
    (described,) = admin.describe_consumer_groups([args.group], request_timeout=args.timeout).values()
    group = _result(described, args, f"DescribeGroups {args.group}")
    verbose = args.verbose and _type(group) == "Consumer"
    # librdkafka does not hand out the epochs nor the members' protocols: ask the coordinator itself.
    wanted = verbose or (args.members and _type(group) == "Consumer")
    described = _epochs(group.coordinator, args) if wanted else None
    epochs = described if verbose else None
    if args.state:
        columns = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE"]
        row = [args.group, f"{group.coordinator.host}:{group.coordinator.port} ({group.coordinator.id})",
               group.partition_assignor, _state(group.state)]
        if epochs is not None:
            columns += ["GROUP-EPOCH", "TARGET-ASSIGNMENT-EPOCH"]
            row += [epochs.group_epoch, epochs.assignment_epoch]
        wire_cli.table(columns + ["#MEMBERS"], [row + [len(group.members)]])
        return 0
    if args.members:
        columns = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        rows = [[args.group, m.member_id, m.host, m.client_id, len(m.assignment.topic_partitions)]
                for m in sorted(group.members, key=lambda m: m.member_id)]
        if epochs is not None:
            # As Kafka 4's tool: the member's epoch and partitions, then the target's.
            member_epochs = {m.member_id: m.member_epoch for m in epochs.members}
            columns += ["CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"]
            for row, m in zip(rows, sorted(group.members, key=lambda m: m.member_id)):
                row += [member_epochs.get(m.member_id, "-"), _partitions(m.assignment),
                        epochs.assignment_epoch, _partitions(m.target_assignment)]
        if described is not None:
            # A group in an online upgrade or downgrade has members of both
            # protocols; the column comes after Kafka's own ones.
            kinds = {m.member_id: {0: "classic", 1: "consumer"}.get(getattr(m, "member_type", 1), "unknown")
                     for m in described.members}
            columns.append("PROTOCOL")
            for row in rows:
                row.append(kinds.get(row[1], "-"))
        wire_cli.table(columns, rows)
        return 0
    owners = {(tp.topic, tp.partition): m for m in group.members for tp in m.assignment.topic_partitions}
    committed = _committed(admin, args.group, args)
    keys = sorted(set(committed) | set(owners))
    ends = _offsets(admin, keys, OffsetSpec.latest(), args)
    rows = []
    for topic, partition in keys:
        current = committed.get((topic, partition), -1)
        end = ends.get((topic, partition), -1)
        member = owners.get((topic, partition))
        rows.append([args.group, topic, partition, "-" if current < 0 else current, end,
                     "-" if current < 0 else max(0, end - current),
                     member.member_id if member else "-", member.host if member else "-",
                     member.client_id if member else "-"])
    wire_cli.table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                    "HOST", "CLIENT-ID"], rows)
    return 0


def _partitions(assignment: Any) -> str:
    """t:0,1;u:2 -- a member's partitions on one line, as kafka-consumer-groups --verbose prints them."""
    if assignment is None or not assignment.topic_partitions:
        return "-"
    by_topic: dict[str, list[int]] = {}
    for tp in assignment.topic_partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ";".join(f"{t}:" + ",".join(str(p) for p in sorted(ps)) for t, ps in sorted(by_topic.items()))


def _epochs(coordinator: Any, args: argparse.Namespace) -> Any:
    """The coordinator's ConsumerGroupDescribe answer for the group."""
    import trio
    from kio.schema.consumer_group_describe.v1 import request as cgd

    from common.wire import ConnectionFailedError

    async def ask() -> Any:
        with trio.fail_after(args.timeout):
            return await wire_cli.request(coordinator.host, coordinator.port, cgd.ConsumerGroupDescribeRequest(
                group_ids=(args.group,), include_authorized_operations=False))

    try:
        answer = trio.run(ask)
    except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
        raise _Failed(f"ConsumerGroupDescribe at {coordinator.host}:{coordinator.port}: {exc}", 2) from None
    (described,) = answer.groups
    if described.error_code:
        raise _Failed(f"ConsumerGroupDescribe {args.group}: {wire_cli.error_name(described.error_code)} "
                      f"{described.error_message or ''}", 1)
    return described


def _delete(args: argparse.Namespace) -> int:
    admin = _admin(args)
    futures = admin.delete_consumer_groups(args.group, request_timeout=args.timeout)
    failed = []
    for group, future in futures.items():
        try:
            _result(future, args, f"delete {group}")
        except _Failed as exc:
            failed.append(str(exc))
    if failed:
        raise _Failed("; ".join(failed), 1)
    print("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in args.group)
          + ") was successful.")
    return 0


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def _timestamp_ms(args: argparse.Namespace, now: datetime.datetime) -> int:
    if args.by_duration is not None:
        m = _DURATION.match(args.by_duration)
        if not m or args.by_duration in ("P", "PT"):
            raise _Failed(f"--by-duration {args.by_duration!r}: use ISO-8601, e.g. PT1H or P1DT30M", 2)
        d, h, mi, s = (float(x) if x else 0.0 for x in m.groups())
        delta = datetime.timedelta(days=d, hours=h, minutes=mi, seconds=s)
        return int((now - delta).timestamp() * 1000)
    text = args.to_datetime
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _Failed(f"--to-datetime {text!r}: use YYYY-MM-DDTHH:mm:SS.sss (optionally with a zone)", 2) from None
    if when.tzinfo is None:
        when = when.astimezone()  # Kafka: the local zone when none is given
    return int(when.timestamp() * 1000)


def _scope(args: argparse.Namespace, admin: Any, committed: dict) -> list[tuple[str, int]]:
    if args.all_topics:
        return sorted(committed)
    out = []
    for item in args.topic:
        topic, _, parts = item.partition(":")
        if parts:
            out += [(topic, int(p)) for p in parts.split(",") if p.strip()]
        else:
            meta = admin.list_topics(topic, timeout=args.timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                raise _Failed(f"topic {topic} does not exist", 1)
            out += [(topic, p) for p in sorted(meta.partitions)]
    return out


def _reset(args: argparse.Namespace) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(args)
    committed = _committed(admin, args.group, args)
    partitions = _scope(args, admin, committed)
    earliest = _offsets(admin, partitions, OffsetSpec.earliest(), args)
    latest = _offsets(admin, partitions, OffsetSpec.latest(), args)
    if args.to_datetime is not None or args.by_duration is not None:
        at = _offsets(admin, partitions, OffsetSpec.for_timestamp(
            _timestamp_ms(args, datetime.datetime.now(datetime.timezone.utc))), args)
    new = {}
    for key in partitions:
        lo, hi = earliest[key], latest[key]
        current = committed.get(key, -1)
        if args.to_earliest:
            target = lo
        elif args.to_latest:
            target = hi
        elif args.to_current:
            target = current if current >= 0 else hi
        elif args.to_offset is not None:
            target = args.to_offset
        elif args.shift_by is not None:
            target = (current if current >= 0 else hi) + args.shift_by
        else:
            target = at[key] if at[key] >= 0 else hi  # no record that late: the end
        new[key] = min(max(target, lo), hi)
    wire_cli.table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                   [[args.group, t, p, o] for (t, p), o in sorted(new.items())])
    if not args.execute:
        return 0
    request = ConsumerGroupTopicPartitions(args.group, [TopicPartition(t, p, o) for (t, p), o in new.items()])
    (future,) = admin.alter_consumer_group_offsets([request], request_timeout=args.timeout).values()
    _result(future, args, f"commit offsets of {args.group} (the group must have no active members)")
    return 0
