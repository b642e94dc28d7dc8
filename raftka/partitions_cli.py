"""`raftka partitions elect-leaders|reassign|list-reassignments`: leaders and replica placement,
like Kafka's `kafka-leader-election` and `kafka-reassign-partitions`.

    raftka partitions elect-leaders      --bootstrap-server H:P [--topic T [--partition N]]
                                         [--type preferred|unclean]
    raftka partitions reassign           --bootstrap-server H:P --topic T --partition N
                                         (--replicas 1,2,3 [--throttle B/S] | --cancel)
    raftka partitions remove-throttle    --bootstrap-server H:P --topic T [--topic T2 ...]
    raftka partitions list-reassignments --bootstrap-server H:P [--topic T]

elect-leaders without --topic elects every partition of the cluster (only
the partitions whose leader changed, or could not, are shown). A
preferred election moves leadership to the first replica when it is alive
and in the ISR; an unclean one elects a leader for a partition that has
none, from outside the ISR if need be (it can lose acknowledged records).

reassign starts moving a partition to the given replicas (the first is the
preferred leader) and returns: the new replicas copy the data and join the
ISR, then the old ones are removed and delete their copy. Follow it with
list-reassignments; --cancel goes back to the replicas before it.
--throttle B/S first throttles the copy as kafka-reassign-partitions'
--throttle does: the partition's current replicas are appended to the
topic's leader.replication.throttled.replicas, the added ones to its
follower.replication.throttled.replicas, and every broker's
leader/follower.replication.throttled.rate is set to B/S (the cluster
default). remove-throttle lifts it once the moves are done (Kafka's
--verify does): it deletes both rates and the topics' replica lists.

Talks to any broker (which forwards to the active controller) with
kafka-python's admin client. Exit status: 0 on success, 1 if the cluster
refused (any partition), 2 for bad arguments or an unreachable cluster.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from common.errors import RaftkaError
from raftka.admin_cli import command_group

ELECTION_TYPES = {"preferred": 0, "unclean": 1}


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "partitions", "elect leaders and reassign replicas (like kafka-leader-election "
                            "and kafka-reassign-partitions)", __doc__)

    elect = command("elect-leaders", "move leadership to preferred replicas, or elect leaders of offline partitions",
                    elect_main)
    elect.add_argument("--topic", help="only this topic (default: every partition of the cluster)")
    elect.add_argument("--partition", type=int, metavar="N", help="only this partition of --topic")
    elect.add_argument("--type", choices=sorted(ELECTION_TYPES), default="preferred",
                       help="preferred (default): the first replica leads if it is in sync; unclean: elect a leader "
                            "for a partition without one, even out of sync (may lose records)")
    reassign = command("reassign", "move a partition to other brokers (or cancel a move under way)", reassign_main)
    reassign.add_argument("--topic", required=True)
    reassign.add_argument("--partition", type=int, required=True, metavar="N")
    target = reassign.add_mutually_exclusive_group(required=True)
    target.add_argument("--replicas", metavar="B1,B2,...",
                        help="the new replica list; the first is the preferred leader")
    target.add_argument("--cancel", action="store_true", help="cancel the reassignment under way")
    reassign.add_argument("--throttle", type=int, metavar="B/S",
                          help="hold the copy to this many bytes per second (replication throttles)")
    unthrottle = command("remove-throttle", "lift the replication throttles a reassignment set", remove_throttle_main)
    unthrottle.add_argument("--topic", action="append", required=True, help="a topic whose throttled lists to delete")
    listing = command("list-reassignments", "reassignments under way", list_main)
    listing.add_argument("--topic", action="append", default=[], help="only these topics (default: all)")


class _Unreachable(RaftkaError):
    """No broker answered; the message names the address tried."""


def _fail(message: str, code: int) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"raftka partitions: {message}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    return code


def _admin(args: argparse.Namespace) -> Any:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    # kafka-python logs every failed connection attempt; our message says it once.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        return KafkaAdminClient(bootstrap_servers=args.bootstrap_server.split(","),
                                request_timeout_ms=int(args.timeout * 1000),
                                bootstrap_timeout_ms=int(args.timeout * 1000),
                                client_id="raftka-partitions")
    except KafkaError as exc:
        raise _Unreachable(f"no broker at {args.bootstrap_server} answered: {exc}") from None


def _wrap(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        from kafka.errors import BrokerResponseError, KafkaError

        try:
            return fn(args)
        except _Unreachable as exc:
            return _fail(str(exc), 2)
        except BrokerResponseError as exc:
            return _fail(f"the cluster refused: {exc}", 1)
        except KafkaError as exc:
            return _fail(f"no answer from {args.bootstrap_server}: {exc}", 2)
    return run


def _index(partition: dict) -> int:
    """A partition's index in kafka-python's describe_topics (the key follows the Metadata version)."""
    return partition["partition_index"] if "partition_index" in partition else partition["partition"]


def _error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR {code}"


@_wrap
def elect_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.partition is not None and args.topic is None:
        return _fail("--partition needs --topic", 2)
    admin = _admin(args)
    try:
        if args.topic is None:
            wanted = None
        else:
            partitions = admin.describe_topics([args.topic])[0]
            if partitions["error_code"] != 0:
                return _fail(f"no such topic: {args.topic}", 1)
            indexes = sorted(_index(p) for p in partitions["partitions"])
            if args.partition is not None:
                if args.partition not in indexes:
                    return _fail(f"{args.topic} has no partition {args.partition}", 1)
                indexes = [args.partition]
            wanted = {args.topic: indexes}
        response = admin.elect_leaders(ELECTION_TYPES[args.type], wanted, timeout_ms=int(args.timeout * 1000),
                                       raise_errors=False)
    finally:
        admin.close()
    top = getattr(response, "error_code", 0)
    if top:
        return _fail(f"the election was refused: {_error_name(top)}", 1)
    table = Table(title=f"{args.type} leader election")
    for column in ("Topic", "Partition", "Result"):
        table.add_column(column, justify="right" if column == "Partition" else "left")
    refused = 0
    rows = sorted((result.topic, p.partition_id, p.error_code, p.error_message)
                  for result in response.replica_election_results for p in result.partition_result)
    if wanted is None:
        # Electing everything: show only what changed or could not.
        rows = [r for r in rows if _error_name(r[2]) != "ELECTION_NOT_NEEDED"]
    for topic, partition, code, message in rows:
        if code == 0:
            outcome = "[green]elected[/green]"
        elif _error_name(code) == "ELECTION_NOT_NEEDED":
            outcome = "not needed (already led by the right replica)"
        else:
            refused += 1
            outcome = f"[red]{_error_name(code)}[/red]" + (f": {message}" if message else "")
        table.add_row(topic, str(partition), outcome)
    console = Console()
    if rows:
        console.print(table)
    else:
        console.print("Every partition is already led by its preferred replica." if args.type == "preferred"
                      else "Every partition has a leader.")
    return 1 if refused else 0


@_wrap
def reassign_main(args: argparse.Namespace) -> int:
    from kafka import TopicPartition

    replicas = None
    if not args.cancel:
        try:
            replicas = [int(b) for b in args.replicas.split(",") if b.strip()]
        except ValueError:
            return _fail(f"--replicas {args.replicas!r}: give broker ids separated by commas, e.g. 1,2,3", 2)
        if not replicas:
            return _fail("--replicas needs at least one broker id", 2)
    if args.throttle is not None:
        if args.cancel or args.throttle <= 0:
            return _fail("--throttle takes a number of bytes per second above 0, with --replicas", 2)
        refused = _run_configs(args, lambda: _throttle(args, replicas))
        if refused:
            return _fail(refused, 1)
    admin = _admin(args)
    try:
        tp = TopicPartition(args.topic, args.partition)
        results = admin.alter_partition_reassignments({tp: replicas}, timeout_ms=int(args.timeout * 1000))
    finally:
        admin.close()
    error = results.get(tp, None)
    if error is not None:
        return _fail(f"cannot {'cancel the reassignment of' if args.cancel else 'reassign'} "
                     f"{args.topic}-{args.partition}: {_error_name(getattr(error, 'errno', -1))}", 1)
    if args.cancel:
        print(f"Cancelled the reassignment of {args.topic}-{args.partition}.")
    else:
        print(f"Reassignment of {args.topic}-{args.partition} to replicas {','.join(map(str, replicas or ()))} "
              f"started; follow it with `raftka partitions list-reassignments`.")
    return 0


_RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
_LISTS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
_SET, _DELETE, _APPEND = 0, 1, 2
_TOPIC, _BROKER = 2, 4


def _run_configs(args: argparse.Namespace, changes) -> str | None:
    """Make one IncrementalAlterConfigs of `changes()` (an async function giving
    [(resource type, name, [(key, op, value)])]); the refusal's message, or None."""
    import trio

    async def main():
        from kio.schema.incremental_alter_configs.v1 import request as iac

        from raftka import wire_cli

        with trio.fail_after(args.timeout):
            resources = [r for r in await changes() if r[2]]
            if not resources:
                return None
            answer = await wire_cli.bootstrap_request(args, iac.IncrementalAlterConfigsRequest(resources=tuple(
                iac.AlterConfigsResource(resource_type=kind, resource_name=name, configs=tuple(
                    iac.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops))
                for kind, name, ops in resources), validate_only=False))
        for result in answer.responses:
            if result.error_code != 0:
                return (f"cannot set the throttle on {result.resource_name or 'every broker'}: "
                        f"{wire_cli.error_name(result.error_code)}: {result.error_message}")
        return None

    from common.wire import ConnectionFailedError

    try:
        return trio.run(main)
    except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
        return f"no answer from {args.bootstrap_server} setting the throttle: {exc or 'timed out'}"


async def _throttle(args: argparse.Namespace, replicas: list[int]):
    from raftka import wire_cli

    meta = await wire_cli.metadata(args, [args.topic])
    (topic,) = meta.topics
    current = next((p.replica_nodes for p in topic.partitions if p.partition_index == args.partition), None)
    if topic.error_code != 0 or current is None:
        return [(_TOPIC, args.topic, [])]  # the reassignment itself says the partition is unknown
    p = args.partition
    leaders = ",".join(f"{p}:{b}" for b in current)
    followers = ",".join(f"{p}:{b}" for b in replicas if b not in current)
    ops = [(_LISTS[0], _APPEND, leaders)] + ([(_LISTS[1], _APPEND, followers)] if followers else [])
    rate = str(args.throttle)
    return [(_TOPIC, args.topic, ops), (_BROKER, "", [(k, _SET, rate) for k in _RATES])]


@_wrap
def remove_throttle_main(args: argparse.Namespace) -> int:
    async def changes():
        return [(_BROKER, "", [(k, _DELETE, None) for k in _RATES])] + [
            (_TOPIC, t, [(k, _DELETE, None) for k in _LISTS]) for t in args.topic]
    refused = _run_configs(args, changes)
    if refused:
        return _fail(refused, 1)
    print(f"Throttles removed: the replication rates of every broker, the throttled replicas of "
          f"{', '.join(args.topic)}.")
    return 0


@_wrap
def list_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    admin = _admin(args)
    try:
        wanted = None
        if args.topic:
            described = admin.describe_topics(args.topic)
            wanted = {t["name"]: sorted(_index(p) for p in t["partitions"]) for t in described
                      if t["error_code"] == 0}
            if not wanted:
                print("No reassignment under way.")
                return 0
        ongoing = admin.list_partition_reassignments(wanted, timeout_ms=int(args.timeout * 1000))
    finally:
        admin.close()
    if not ongoing:
        print("No reassignment under way.")
        return 0
    table = Table(title="Reassignments under way")
    for column in ("Topic", "Partition", "Replicas", "Adding", "Removing"):
        table.add_column(column, justify="right" if column == "Partition" else "left")
    for tp, state in sorted(ongoing.items(), key=lambda item: (item[0].topic, item[0].partition)):
        table.add_row(tp.topic, str(tp.partition), ",".join(map(str, state["replicas"])),
                      ",".join(map(str, state["adding_replicas"])), ",".join(map(str, state["removing_replicas"])))
    Console().print(table)
    return 0
