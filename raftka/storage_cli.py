"""`raftka storage format|random-uuid`: prepare log dirs, as Kafka's `kafka-storage` does.

    raftka storage random-uuid
    raftka storage format --config FILE --cluster-id ID [--ignore-formatted]
                          [--add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]' ...]
    raftka storage format -t ID -c FILE [-g]          (Kafka's short options)

`format` writes `meta.properties` (cluster id, node id) into every dir of
the config's `log.dirs`. A dir already formatted for the same cluster and
node is left alone with `--ignore-formatted` and refused without it; one
formatted for another cluster or node is always refused. `--add-scram`
gives SCRAM credentials the first active controller stores in the metadata
log (`quorum.node.bootstrap`), so a cluster with only SASL listeners can be
reached.
"""

from __future__ import annotations

import argparse
import sys

from common.config import NodeConfig, read_properties
from common.errors import RaftkaError
from common.meta_properties import format_log_dir, random_cluster_id, read_meta
from quorum.node.bootstrap import parse_add_scram, write_bootstrap


def register(sub: argparse._SubParsersAction) -> None:
    storage = sub.add_parser("storage", help="format log dirs / make a cluster id (like kafka-storage)",
                             description=__doc__.splitlines()[0])
    commands = storage.add_subparsers(dest="storage_command", metavar="COMMAND")
    commands.required = True
    uuid_parser = commands.add_parser("random-uuid", help="print a new cluster id")
    uuid_parser.set_defaults(func=random_uuid)
    fmt = commands.add_parser("format", help="write meta.properties into every log dir of a config")
    fmt.add_argument("--config", "-c", required=True, metavar="FILE", help="the node's properties file")
    fmt.add_argument("--cluster-id", "-t", required=True, metavar="ID",
                     help="the cluster id (make one with `raftka storage random-uuid`)")
    fmt.add_argument("--ignore-formatted", "-g", action="store_true",
                     help="succeed for dirs already formatted with this cluster id and node id")
    fmt.add_argument("--add-scram", action="append", default=[], metavar="'MECHANISM=[name=U,password=P]'",
                     help="a bootstrap SCRAM credential, as kafka-storage takes it (repeatable)")
    fmt.set_defaults(func=format_dirs)


def random_uuid(args: argparse.Namespace) -> int:
    print(random_cluster_id())
    return 0


def format_dirs(args: argparse.Namespace) -> int:
    try:
        config = NodeConfig.from_properties(read_properties(args.config))
        scram = [parse_add_scram(value) for value in args.add_scram]
        for log_dir in config.log_dirs:
            existing = read_meta(log_dir)
            if existing is not None and not args.ignore_formatted:
                raise RaftkaError(f"{log_dir}/meta.properties already exists (cluster.id="
                                  f"{existing.get('cluster.id')}, node.id={existing.get('node.id')}): "
                                  "use --ignore-formatted to accept dirs formatted for this node")
            format_log_dir(log_dir, args.cluster_id, config.node_id)
            if scram:
                write_bootstrap(log_dir, scram)
            print(f"Formatting {log_dir} with cluster.id {args.cluster_id} and node.id {config.node_id}")
    except RaftkaError as exc:
        print(f"raftka storage format: {exc}", file=sys.stderr)
        return 2
    return 0
