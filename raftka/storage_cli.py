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

A dynamic controller quorum (KIP-853; nodes find it through
`controller.quorum.bootstrap.servers`) is started at format time, on the
controllers only:

    raftka storage format -c controller.properties -t ID --standalone
        one controller, a voter set of itself (grow it later with
        `raftka quorum add-controller`);
    raftka storage format -c controller.properties -t ID \
        --initial-controllers 1@host1:9093:DIR-ID1,2@host2:9093:DIR-ID2,...
        every initial controller formatted with the same list; this node's
        metadata log dir gets its own DIR-ID as its directory.id;
    raftka storage format -c controller.properties -t ID --no-initial-controllers
        a controller that joins an existing quorum: it starts as an
        observer, then `raftka quorum add-controller` makes it a voter.

Either writes the first voter set (a KRaftVersionRecord and a
VotersRecord) into the snapshot at offset 0 of the metadata log,
`__cluster_metadata-0/00000000000000000000-0000000000.checkpoint`.
Every dir's `meta.properties` gets a random `directory.id` (KIP-858).
"""

from __future__ import annotations

import argparse
import sys

import dataclasses

from common.config import NodeConfig, read_properties
from common.errors import RaftkaError
from common.meta_properties import format_log_dir, random_cluster_id, read_meta
from quorum.node.bootstrap import parse_add_scram, write_bootstrap
from quorum.node.metadata_log import write_bootstrap_voters
from quorum.node.voter_config import format_directory_id, parse_directory_id, parse_initial_controllers
from quorum.raft.voters import VoterInfo


def initial_voters(args: argparse.Namespace, config: NodeConfig) -> tuple[tuple[VoterInfo, ...], str | None]:
    """The first voter set the flags give (empty without one) and this
    node's directory id from `--initial-controllers` (None otherwise)."""
    dynamic = args.standalone or args.initial_controllers or args.no_initial_controllers
    if not dynamic:
        return (), None
    if not config.is_controller:
        raise RaftkaError("--standalone, --initial-controllers and --no-initial-controllers format controllers; "
                          f"this config has process.roles={','.join(sorted(config.process_roles))}")
    if config.controller_quorum_voters:
        raise RaftkaError("the config sets controller.quorum.voters (a static quorum); a dynamic quorum is found "
                          "through controller.quorum.bootstrap.servers: replace the one with the other")
    assert config.controller_listener is not None
    name, host, port = config.controller_listener
    if args.standalone:
        return (VoterInfo(config.node_id, None, ((name, host, port),)),), None
    if args.no_initial_controllers:
        return (), None
    voters = parse_initial_controllers(args.initial_controllers, listener=name)
    mine = [v for v in voters if v.node_id == config.node_id]
    if not mine:
        raise RaftkaError(f"--initial-controllers does not name this node (node.id={config.node_id}): list every "
                          "initial controller, this one included, or use --no-initial-controllers to join later")
    return voters, format_directory_id(mine[0].directory_id)


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
    quorum = fmt.add_mutually_exclusive_group()
    quorum.add_argument("--standalone", "-s", action="store_true",
                        help="a dynamic quorum of this controller alone (needs controller.quorum.bootstrap.servers)")
    quorum.add_argument("--initial-controllers", "-I", metavar="ID@HOST:PORT:DIR-ID,...",
                        help="a dynamic quorum of these controllers (this node's DIR-ID becomes its directory.id)")
    quorum.add_argument("--no-initial-controllers", "-N", action="store_true",
                        help="a controller that joins an existing dynamic quorum as an observer")
    fmt.set_defaults(func=format_dirs)


def random_uuid(args: argparse.Namespace) -> int:
    print(random_cluster_id())
    return 0


def format_dirs(args: argparse.Namespace) -> int:
    try:
        config = NodeConfig.from_properties(read_properties(args.config))
        scram = [parse_add_scram(value) for value in args.add_scram]
        voters, directory_id = initial_voters(args, config)
        for index, log_dir in enumerate(config.log_dirs):
            existing = read_meta(log_dir)
            if existing is not None and not args.ignore_formatted:
                raise RaftkaError(f"{log_dir}/meta.properties already exists (cluster.id="
                                  f"{existing.get('cluster.id')}, node.id={existing.get('node.id')}): "
                                  "use --ignore-formatted to accept dirs formatted for this node")
            given = directory_id if index == 0 else None  # the metadata log's dir carries the voter's id
            written = format_log_dir(log_dir, args.cluster_id, config.node_id, given)
            if given is not None and written != given:
                raise RaftkaError(f"{log_dir}/meta.properties has directory.id {written}, but --initial-controllers "
                                  f"gives node {config.node_id} the directory id {given}: use {written} there")
            if scram:
                write_bootstrap(log_dir, scram)
            if index == 0 and voters:
                if directory_id is None:  # --standalone: the voter's directory id is the one just written
                    voters = tuple(dataclasses.replace(v, directory_id=parse_directory_id(written)) for v in voters)
                write_bootstrap_voters(log_dir, voters)
                print(f"Bootstrapping a dynamic quorum with voters "
                      f"{', '.join(f'{v.node_id}@{v.address[0]}:{v.address[1]}' for v in voters if v.address)}")
            print(f"Formatting {log_dir} with cluster.id {args.cluster_id} and node.id {config.node_id}")
    except RaftkaError as exc:
        print(f"raftka storage format: {exc}", file=sys.stderr)
        return 2
    return 0
