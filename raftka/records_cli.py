"""`raftka records delete`, `raftka log-dirs describe` and `raftka log-dirs
move`: like Kafka's `kafka-delete-records`, `kafka-log-dirs` and the
`log_dirs` of `kafka-reassign-partitions`.

    raftka records delete   -b H:P --offset-json-file FILE
    raftka records delete   -b H:P --topic T --partition N --offset O
    raftka log-dirs describe -b H:P [--broker-list 1,2] [--topic-list a,b]
    raftka log-dirs move     -b H:P --broker N --topic T --partition P --log-dir DIR

records delete moves each partition's log start offset up to the given
offset (-1: the high watermark): records below it can no longer be read,
on any replica, and their segments are removed at the next retention
pass. The JSON file is kafka-delete-records': {"partitions": [{"topic":
"t", "partition": 0, "offset": 5}]}. It prints each partition's new low
watermark.

log-dirs describe prints, per broker, a JSON document like kafka-log-dirs:
every log dir with its partitions' sizes and offset lags; a replica
being moved between log dirs shows twice, the copy (`"isFuture": true`)
under its target dir with how far it is behind.

log-dirs move asks broker N to move its replica of T-P to DIR (one of its
`log.dirs`; AlterReplicaLogDirs): the broker copies the log there while
it takes appends and swaps the copy in once it has caught up. It returns
once the move started; follow it with log-dirs describe.

Exit status: 0 on success, 1 if the cluster refused, 2 for bad arguments
or an unreachable cluster.
"""

from __future__ import annotations

import argparse
import datetime
import json

from raftka import wire_cli
from raftka.wire_cli import Refused, Usage


def register(sub: argparse._SubParsersAction) -> None:
    records = wire_cli.command_group(sub, "records", "delete records below an offset (like kafka-delete-records)",
                                     __doc__)
    delete = records("delete", "move partitions' log start offsets up (DeleteRecords)", _delete)
    delete.add_argument("--offset-json-file", metavar="FILE", help="kafka-delete-records' JSON file")
    delete.add_argument("--topic", metavar="T")
    delete.add_argument("--partition", type=int, metavar="N")
    delete.add_argument("--offset", type=int, metavar="O", help="-1: the high watermark")
    dirs = wire_cli.command_group(sub, "log-dirs", "log dirs, partition sizes and lags (like kafka-log-dirs)",
                                  __doc__)
    describe = dirs("describe", "every broker's log dirs with their partitions", _describe)
    describe.add_argument("--broker-list", default="", metavar="1,2", help="only these brokers (default: all)")
    describe.add_argument("--topic-list", default="", metavar="a,b", help="only these topics (default: all)")
    move = dirs("move", "move a replica to another of its broker's log dirs (AlterReplicaLogDirs)", _move)
    move.add_argument("--broker", type=int, required=True, metavar="N", help="the broker holding the replica")
    move.add_argument("--topic", required=True, metavar="T")
    move.add_argument("--partition", type=int, required=True, metavar="P")
    move.add_argument("--log-dir", required=True, metavar="DIR", help="one of the broker's log.dirs")


def _wanted(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    if args.offset_json_file:
        try:
            with open(args.offset_json_file) as f:
                doc = json.load(f)
            return [(p["topic"], int(p["partition"]), int(p["offset"])) for p in doc["partitions"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Usage(f"--offset-json-file {args.offset_json_file}: {exc}; expected "
                        '{"partitions": [{"topic": "t", "partition": 0, "offset": 5}]}') from None
    if args.topic is None or args.partition is None or args.offset is None:
        raise Usage("give --offset-json-file, or --topic, --partition and --offset")
    return [(args.topic, args.partition, args.offset)]


async def _delete(args: argparse.Namespace) -> int:
    from kio.schema.delete_records.v2 import request as dr

    wanted = _wanted(args)
    meta = await wire_cli.metadata(args, sorted({t for t, _, _ in wanted}))
    brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
    leaders = {}
    for t in meta.topics:
        if t.error_code != 0:
            raise Refused(f"topic {t.name}: {wire_cli.error_name(t.error_code)}")
        for p in t.partitions:
            leaders[(t.name, p.partition_index)] = p.leader_id
    by_leader: dict[int, dict[str, list]] = {}
    for topic, partition, offset in wanted:
        leader = leaders.get((topic, partition), -1)
        if leader not in brokers:
            raise Refused(f"{topic}-{partition}: no leader (unknown partition, or none elected)")
        by_leader.setdefault(leader, {}).setdefault(topic, []).append(
            dr.DeleteRecordsPartition(partition_index=partition, offset=offset))
    failed = False
    print("Records delete operation completed:")
    for leader, topics in sorted(by_leader.items()):
        answer = await wire_cli.request(*brokers[leader], dr.DeleteRecordsRequest(topics=tuple(
            dr.DeleteRecordsTopic(name=name, partitions=tuple(parts)) for name, parts in topics.items()),
            timeout=datetime.timedelta(seconds=args.timeout)))
        for t in answer.topics:
            for p in t.partitions:
                if p.error_code == 0:
                    print(f"partition: {t.name}-{p.partition_index}\tlow_watermark: {p.low_watermark}")
                else:
                    failed = True
                    print(f"partition: {t.name}-{p.partition_index}\terror: {wire_cli.error_name(p.error_code)}")
    return 1 if failed else 0


async def _move(args: argparse.Namespace) -> int:
    from kio.schema.alter_replica_log_dirs.v2 import request as arld

    meta = await wire_cli.metadata(args, [])
    brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
    if args.broker not in brokers:
        raise Refused(f"broker {args.broker} is not in the cluster (brokers: {sorted(brokers)})")
    answer = await wire_cli.request(*brokers[args.broker], arld.AlterReplicaLogDirsRequest(dirs=(
        arld.AlterReplicaLogDir(path=args.log_dir, topics=(
            arld.AlterReplicaLogDirTopic(name=args.topic, partitions=(args.partition,)),)),)))
    errors = [p.error_code for t in answer.results for p in t.partitions]
    if errors != [0]:
        raise Refused(f"{args.topic}-{args.partition} on broker {args.broker} to {args.log_dir}: "
                      f"{', '.join(wire_cli.error_name(e) for e in errors) or 'no answer for the partition'}")
    print(f"moving {args.topic}-{args.partition} on broker {args.broker} to {args.log_dir}; "
          "follow it with `raftka log-dirs describe`")
    return 0


async def _describe(args: argparse.Namespace) -> int:
    from kio.schema.describe_log_dirs.v4 import request as dld

    meta = await wire_cli.metadata(args, [])
    only = {int(b) for b in args.broker_list.split(",") if b.strip()}
    topics = [t.strip() for t in args.topic_list.split(",") if t.strip()]
    request_topics = None
    if topics:
        described = await wire_cli.metadata(args, topics)
        request_topics = tuple(dld.DescribableLogDirTopic(topic=t.name, partitions=tuple(
            p.partition_index for p in t.partitions)) for t in described.topics if t.error_code == 0)
    out = {"version": 1, "brokers": []}
    for b in sorted(meta.brokers, key=lambda b: b.node_id):
        if only and b.node_id not in only:
            continue
        answer = await wire_cli.request(b.host, b.port, dld.DescribeLogDirsRequest(topics=request_topics))
        out["brokers"].append({"broker": b.node_id, "logDirs": [{
            "logDir": r.log_dir, "error": None if r.error_code == 0 else wire_cli.error_name(r.error_code),
            "totalBytes": r.total_bytes, "usableBytes": r.usable_bytes,
            "partitions": [{"partition": f"{t.name}-{p.partition_index}", "size": p.partition_size,
                            "offsetLag": p.offset_lag, "isFuture": p.is_future_key}
                           for t in r.topics for p in t.partitions]} for r in answer.results]})
    print(json.dumps(out, indent=2))
    return 0
