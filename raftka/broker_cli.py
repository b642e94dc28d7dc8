"""`raftka broker --config FILE`: run one broker, or one combined broker+controller node.

The config is a properties file with Kafka's keys. A broker needs
`node.id`, `process.roles=broker` (or `broker,controller` for a combined
node), `controller.quorum.voters`, `listeners` (e.g.
`PLAINTEXT://0.0.0.0:9092`) and `log.dirs`, formatted first with `raftka
storage format`. Clients are sent to `advertised.listeners` (default: the
listener, with this machine's name for a wildcard host). `broker.rack`,
`broker.heartbeat.interval.ms`, `log.segment.bytes`, `num.partitions`, ...
are read as Kafka reads them. The client listener accepts connections
once the controller has unfenced the broker, when it prints
`READY node=<id> broker=<host>:<port>`; SIGTERM or Ctrl-C stop it cleanly
(controlled shutdown first).

ZooKeeper mode (Kafka before KIP-500): set `zookeeper.connect`
(host:port,...[/chroot]) and `broker.id` instead of `process.roles`,
`node.id` and `controller.quorum.voters`; `zookeeper.session.timeout.ms`
(default 18000) and `zookeeper.connection.timeout.ms` are read as Kafka
reads them. No formatting needed: the broker writes its `meta.properties`
(version=0) with the cluster id it finds in ZooKeeper.
"""

from __future__ import annotations

import argparse

import trio

from raftka.cli_errors import run_reporting
from common.config import NodeConfig, read_properties
from common.gc_policy import tune_for_server
from common.logs import setup_logging


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("broker", help="run one broker (or a combined broker+controller node)",
                            description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE", help="properties file with Kafka's key names")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from broker.shell.process import run_broker

    def start() -> None:
        config = NodeConfig.from_properties(read_properties(args.config))
        setup_logging(config.node_id, props=config.raw)
        tune_for_server()
        trio.run(lambda: run_broker(config, on_ready=lambda ready: print(ready.line, flush=True)))

    return run_reporting(f"raftka broker: {args.config}", start)
