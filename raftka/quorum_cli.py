"""`raftka quorum status --bootstrap-controller HOST:PORT`: the metadata quorum's state.

Asks the given controller with DescribeQuorum (API 55); a controller that
is not the leader names the leader and every voter's endpoint, and the
question goes to the leader. Prints what `kafka-metadata-quorum describe
--status` prints (leader id, epoch, high watermark, voters, observers, the
largest follower lag) and one row per replica with its log end offset and
its lag behind the leader's log end offset, and the engine the quorum runs
on (`quorum.engine`, read with DescribeConfigs of the leader's own node).
`--json` prints one JSON object.

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
from quorum.node.describe_quorum import describe_quorum, node_configs



def register(sub: argparse._SubParsersAction) -> None:
    quorum = sub.add_parser("quorum", help="inspect the metadata quorum (like kafka-metadata-quorum)",
                            description=__doc__.splitlines()[0])
    commands = quorum.add_subparsers(dest="quorum_command", metavar="COMMAND")
    commands.required = True
    status = commands.add_parser("status", help="leader, epoch, high watermark and each replica's lag")
    status.add_argument("--bootstrap-controller", required=True, metavar="HOST:PORT")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    status.add_argument("--timeout-ms", type=int, default=10000)
    status.set_defaults(func=main)


def parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise RaftkaError(f"--bootstrap-controller {value!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


def status_rows(d: Any) -> list[dict[str, Any]]:
    by_id = {r[0]: r for r in d.voters}
    leader_leo = by_id[d.leader_id][1] if d.leader_id in by_id else max((r[1] for r in d.voters), default=-1)
    rows = []
    for kind, replicas in (("voter", d.voters), ("observer", d.observers)):
        for replica_id, leo, last_fetch, last_caught_up in replicas:
            status = "Leader" if replica_id == d.leader_id else ("Follower" if kind == "voter" else "Observer")
            rows.append({"node_id": replica_id, "status": status, "log_end_offset": leo,
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
