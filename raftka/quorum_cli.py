"""`raftka quorum status --bootstrap-controller HOST:PORT`: the metadata quorum's state.

Asks the given controller with DescribeQuorum (API 55); a controller that
is not the leader names the leader and every voter's endpoint, and the
question goes to the leader. Prints what `kafka-metadata-quorum describe
--status` prints (leader id, epoch, high watermark, voters, observers, the
largest follower lag) and one row per replica with its log end offset and
its lag behind the leader's log end offset, and the engine the quorum runs
on (`quorum.engine`, read with DescribeConfigs of the leader's own node).
`--json` prints one JSON object. `raftka quorum describe --status` is the
same; `describe --replication` prints only the rows, with each replica's
directory id.

A dynamic quorum (KIP-853; see docs/operations.md) grows and shrinks one
controller at a time:

    raftka quorum add-controller --config new-controller.properties
        [--bootstrap-controller HOST:PORT]
        the controller of that config (running, formatted with
        `raftka storage format --no-initial-controllers`, caught up as an
        observer) becomes a voter: AddRaftVoter with its node id, the
        directory.id of its metadata log dir and its CONTROLLER endpoint;
    raftka quorum remove-controller --bootstrap-controller HOST:PORT
        --controller-id ID [--controller-directory-id DIR-ID]
        RemoveRaftVoter: the voter leaves the set (a leader removing itself
        resigns once that is committed).

Both ask the leader (found with DescribeQuorum) and return once the new
voter set is committed.

With quorum.engine=pysyncobj the same fields come from pysyncobj's status:
the epoch is its term, the high watermark its commit point, a follower's
log end offset its match index (in metadata offsets), its last fetch the
last time the leader had it connected.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import trio

from common.errors import RaftkaError
from common.wire.errors import ConnectionFailedError
from common.config import NodeConfig, read_properties
from common.meta_properties import read_directory_id
from quorum.node.describe_quorum import describe_quorum, node_configs
from quorum.node.voter_config import format_directory_id, parse_directory_id
from raftka.controller_admin_cli import ask_leader, command_group, parse_host_port


def register(sub: argparse._SubParsersAction) -> None:
    command = command_group(sub, "quorum", "inspect the metadata quorum (like kafka-metadata-quorum)", __doc__)
    status = command("status", "leader, epoch, high watermark and each replica's lag", main, timeout_ms=10000)
    status.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    describe = command("describe", "as kafka-metadata-quorum describe: --status or --replication", main,
                       timeout_ms=10000)
    shown = describe.add_mutually_exclusive_group()
    shown.add_argument("--status", action="store_true", help="the summary and the rows (the default)")
    shown.add_argument("--replication", action="store_true", help="one row per replica, with its directory id")
    describe.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add = command("add-controller", "make a running observer controller a voter (AddRaftVoter)", add_controller,
                  timeout_ms=30000, bootstrap_required=False,
                  bootstrap_help="a controller to ask (default: the config's controller.quorum.bootstrap.servers)")
    add.add_argument("--config", "-c", required=True, metavar="FILE",
                     help="the new controller's properties (node.id, log.dirs, its CONTROLLER listener)")
    remove = command("remove-controller", "take a controller out of the voters (RemoveRaftVoter)",
                     remove_controller, timeout_ms=30000)
    remove.add_argument("--controller-id", type=int, required=True, metavar="ID")
    remove.add_argument("--controller-directory-id", metavar="DIR-ID",
                        help="the voter's directory id (as `describe --replication` shows it); checked if given")


def status_rows(d: Any) -> list[dict[str, Any]]:
    by_id = {r[0]: r for r in d.voters}
    leader_leo = by_id[d.leader_id][1] if d.leader_id in by_id else max((r[1] for r in d.voters), default=-1)
    rows = []
    observer_dirs = d.observer_directory_ids or (None,) * len(d.observers)
    for kind, replicas, dirs in (("voter", d.voters, [d.directory_ids.get(r[0]) for r in d.voters]),
                                 ("observer", d.observers, observer_dirs)):
        for (replica_id, leo, last_fetch, last_caught_up), directory in zip(replicas, dirs, strict=True):
            status = "Leader" if replica_id == d.leader_id else ("Follower" if kind == "voter" else "Observer")
            # An observer's own directory id: it may share a voter's node id (a disk formatted again).
            directory_id = format_directory_id(directory) or None
            rows.append({"node_id": replica_id, "directory_id": directory_id, "status": status,
                         "log_end_offset": leo,
                         "lag": leader_leo - leo if leo >= 0 else -1, "last_fetch_timestamp": last_fetch,
                         "last_caught_up_timestamp": last_caught_up})
    return rows


async def _status(host: str, port: int, timeout_ms: int) -> tuple[Any, dict[str, str]]:
    """The leader's DescribeQuorum answer and the leader's engine settings."""
    d = await describe_quorum(host, port, timeout_ms)
    configs: dict[str, str] = {}
    if d.error_code == 0:
        leader_host, leader_port = d.nodes.get(d.leader_id, (host, port))
        configs = await node_configs(leader_host, leader_port, d.leader_id, timeout_ms)
    return d, configs


def main(args: argparse.Namespace) -> int:
    try:
        host, port = parse_host_port(args.bootstrap_controller)
        d, configs = trio.run(_status, host, port, args.timeout_ms)
    except (RaftkaError, ConnectionFailedError, OSError) as exc:
        print(f"raftka quorum status: {exc}", file=sys.stderr)
        return 2
    if d.error_code != 0:
        print(f"raftka quorum status: the quorum answered error code {d.error_code} (no leader yet?); "
              "retry in a moment", file=sys.stderr)
        return 1
    rows = status_rows(d)
    followers = [r for r in rows if r["status"] == "Follower"]
    now_ms = time.time_ns() // 1_000_000
    summary = {
        "leader_id": d.leader_id, "leader_epoch": d.leader_epoch, "high_watermark": d.high_watermark,
        "max_follower_lag": max((r["lag"] for r in followers), default=0),
        "max_follower_lag_time_ms": max((now_ms - r["last_caught_up_timestamp"] for r in followers
                                         if r["last_caught_up_timestamp"] >= 0), default=0),
        "current_voters": [r[0] for r in d.voters], "current_observers": [r[0] for r in d.observers],
        "replicas": rows, "engine": configs.get("quorum.engine", "raftka"),
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    if getattr(args, "replication", False):
        print(f"{'NodeId':<8}{'DirectoryId':<24}{'LogEndOffset':>14}{'Lag':>8}  Status")
        for r in rows:
            print(f"{r['node_id']:<8}{r['directory_id'] or '-':<24}{r['log_end_offset']:>14}{r['lag']:>8}  "
                  f"{r['status']}")
        return 0
    print(f"Engine:                 {summary['engine']}")
    print(f"LeaderId:               {d.leader_id}")
    print(f"LeaderEpoch:            {d.leader_epoch}")
    print(f"HighWatermark:          {d.high_watermark}")
    print(f"MaxFollowerLag:         {summary['max_follower_lag']}")
    print(f"MaxFollowerLagTimeMs:   {summary['max_follower_lag_time_ms']}")
    print(f"CurrentVoters:          {summary['current_voters']}")
    print(f"CurrentObservers:       {summary['current_observers']}")
    print()
    header = ("NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp")
    print(f"{header[0]:<8}{header[1]:>14}{header[2]:>8}  {header[3]:>20}  {header[4]:>22}  Status")
    for r in rows:
        print(f"{r['node_id']:<8}{r['log_end_offset']:>14}{r['lag']:>8}  {r['last_fetch_timestamp']:>20}  "
              f"{r['last_caught_up_timestamp']:>22}  {r['status']}")
    return 0


def _answer(command: str, response: Any, done: str) -> int:
    if int(response.error_code) != 0:
        message = getattr(response, "error_message", None) or ""
        print(f"raftka quorum {command}: the leader refused with error code {int(response.error_code)}"
              f"{': ' + message if message else ''}", file=sys.stderr)
        return 1
    print(done)
    return 0


def add_controller(args: argparse.Namespace) -> int:
    import datetime

    from kio.schema.add_raft_voter.v1.request import AddRaftVoterRequest, Listener
    from kio.static.primitive import i32, i32Timedelta, u16

    try:
        config = NodeConfig.from_properties(read_properties(args.config))
        if not config.is_controller or config.controller_listener is None:
            raise RaftkaError(f"{args.config} is not a controller's config (process.roles has no controller)")
        directory = read_directory_id(config.log_dirs[0])
        if directory is None:
            raise RaftkaError(f"{config.log_dirs[0]}/meta.properties has no directory.id: format the new controller "
                              "with `raftka storage format --no-initial-controllers` first")
        bootstrap = args.bootstrap_controller or ",".join(
            f"{h}:{p}" for h, p in config.controller_quorum_bootstrap_servers[:1])
        if not bootstrap:
            raise RaftkaError("give --bootstrap-controller HOST:PORT, or controller.quorum.bootstrap.servers in the config")
        host, port = parse_host_port(bootstrap)
        name, lhost, lport = config.controller_listener
        request = AddRaftVoterRequest(
            cluster_id=None, timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=args.timeout_ms)),
            voter_id=i32(config.node_id), voter_directory_id=parse_directory_id(directory),
            listeners=(Listener(name=name, host=lhost or "127.0.0.1", port=u16(lport)),), ack_when_committed=True)
        response = trio.run(ask_leader, host, port, request, args.timeout_ms)
    except (RaftkaError, ConnectionFailedError, OSError) as exc:
        print(f"raftka quorum add-controller: {exc}", file=sys.stderr)
        return 2
    return _answer("add-controller", response, f"Added controller {config.node_id} with directory id {directory} "
                   f"and endpoint {name}://{lhost}:{lport}")


def remove_controller(args: argparse.Namespace) -> int:
    from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
    from kio.static.primitive import i32

    try:
        host, port = parse_host_port(args.bootstrap_controller)
        directory = parse_directory_id(args.controller_directory_id) if args.controller_directory_id else None
        request = RemoveRaftVoterRequest(cluster_id=None, voter_id=i32(args.controller_id),
                                         voter_directory_id=directory)
        response = trio.run(ask_leader, host, port, request, args.timeout_ms)
    except (RaftkaError, ConnectionFailedError, OSError) as exc:
        print(f"raftka quorum remove-controller: {exc}", file=sys.stderr)
        return 2
    return _answer("remove-controller", response, f"Removed controller {args.controller_id}")
