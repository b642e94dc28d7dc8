"""`raftka controller --config FILE`: run one quorum controller (a Raft voter).

The config is a properties file with Kafka's keys; the ones a controller
needs are `node.id`, `process.roles=controller`, `controller.quorum.voters`
(this node's own entry is the address it serves on) and `log.dirs`
(formatted first with `raftka storage format`). Prints
`READY node=<id> controller=<host>:<port>` once it serves.
"""

from __future__ import annotations

import argparse
import sys

import trio

from common.config import NodeConfig, read_properties
from common.errors import RaftkaError
from common.gc_policy import tune_for_server
from common.logs import setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("controller", help="run one KRaft controller (quorum voter)",
                            description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, metavar="FILE", help="properties file with Kafka's key names")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from quorum.process import run_controller

    try:
        config = NodeConfig.from_properties(read_properties(args.config))
        setup_logging(config.node_id, props=config.raw)
        tune_for_server()
        trio.run(run_controller, config)
    except RaftkaError as exc:
        print(f"raftka controller: {exc}", file=sys.stderr)
        return 2
    return 0
